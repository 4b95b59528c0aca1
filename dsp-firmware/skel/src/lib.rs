//! keel's Hexagon firmware as a FastRPC skel (`libkeel_skel.so`): the firmware crate's
//! message loop ([`keel_dsp_firmware::msgloop::Device`], which runs `keel_core::exec`)
//! behind the entry points a FastRPC shell calls, fed by a dspqueue.
//!
//! - `keel_skel_handle_invoke(handle, scalars, args)`: the URI's `keel_skel_handle_invoke`;
//!   method 0 opens (`keel_skel_open`), 1 closes (`keel_skel_close`), 2 (`start`) takes
//!   the host's exported queue id: the skel imports the queue, takes VTCM, checks its HVX
//!   path on known input and from then on answers every packet in the queue's callback.
//! - Each packet is one wire message; a batch's buffers are the packet's buffer
//!   references (the host `fastrpc_mmap`ed them; dspqueue hands their DSP addresses),
//!   found by id = fd. The answer goes back with the references released (DEREF).
//! - VTCM is probed, not assumed: `HAP_query_avail_VTCM` says the largest page free now
//!   (other clients may hold some), the skel takes it (up to 8 MiB) as its scratch and
//!   reports that size in its capabilities; below 256 KiB it refuses to start
//!   (`AEE_ENOMEMORY`).
//! - The products run on every HVX context the chip has (`qurt_hvx_get_units`, 128-byte
//!   contexts, up to `threads::MAX_THREADS`): the caller plus QuRT worker threads started
//!   at `start` (`qurt_thread_create` on static stacks, parked on `qurt_futex_wait`), each
//!   holding an HVX context only while it runs its share of a product; `close` ends and
//!   joins them before anything else (the skel's code may be unloaded after it). The
//!   capabilities report the threads running as HVX contexts.
//! - Functions of the DSP image it calls are declared here, not implemented: dspqueue
//!   (`dspqueue_import/read_noblock/write/close`), HAP (`HAP_query_avail_VTCM`,
//!   `HAP_request_VTCM`, `HAP_release_VTCM`) and QuRT (HVX, threads, futexes).
//!   `scripts/skel.sh` checks the linked object exports the three entry points and
//!   imports exactly these.
//!
//! Built by `../ci.sh` (a PIC static library linked with `ld.lld -shared`); not yet run on
//! hardware: the tests run it under `qemu-hexagon` in `keel-dsp-shell`, whose stand-ins
//! follow the documented dspqueue/HAP/QuRT interfaces (`qurt_thread_attr_t` as the
//! v68-era SDK headers lay it out: name[16], tcb_partition, stid, priority at 18,
//! bus_priority at 21, timetest_id at 22, stack_size at 24, stack_addr at 28,
//! detach_state at 32).

#![no_std]

use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::sync::atomic::AtomicU32;

use keel_core::exec::{Buffers, Scratch};
use keel_core::parallel::Parallel;
use keel_dsp_firmware::args::Fault;
use keel_dsp_firmware::msgloop::{caps, Device, Mapper, Measured};
use keel_dsp_firmware::threads::{Os, Threads, MAX_THREADS};
use keel_npu_hal::wire::{BatchMsg, MAX_BUFFERS, MAX_MESSAGE};
use keel_npu_hal::{selftest, BufferId, ErrorKind, UnitState};

/// `struct dspqueue_buffer` of the public dspqueue API.
#[repr(C)]
#[derive(Copy, Clone)]
pub struct DspqueueBuffer {
    fd: u32,
    size: u32,
    offset: u32,
    flags: u32,
    ptr: u64,
}

type Callback = unsafe extern "C" fn(queue: *mut c_void, error: i32, context: *mut c_void);

extern "C" {
    fn dspqueue_import(id: u64, packet: Callback, error: Callback, ctx: *mut c_void, queue: *mut *mut c_void) -> i32;
    fn dspqueue_read_noblock(
        queue: *mut c_void,
        flags: *mut u32,
        max_buffers: u32,
        num_buffers: *mut u32,
        buffers: *mut DspqueueBuffer,
        max_len: u32,
        len: *mut u32,
        msg: *mut u8,
    ) -> i32;
    fn dspqueue_write(queue: *mut c_void, flags: u32, num_buffers: u32, buffers: *const DspqueueBuffer, len: u32, msg: *const u8, timeout_us: u32) -> i32;
    fn dspqueue_close(queue: *mut c_void) -> i32;
    fn HAP_query_avail_VTCM(avail_block_size: *mut u32, max_page_size: *mut u32, num_pages: *mut u32) -> i32;
    fn HAP_request_VTCM(size: u32, single_page: u32) -> *mut c_void;
    fn HAP_release_VTCM(addr: *mut c_void) -> i32;
    fn qurt_hvx_lock(mode: i32) -> i32;
    fn qurt_hvx_unlock() -> i32;
    fn qurt_hvx_get_units() -> i32;
    fn qurt_thread_create(id: *mut u32, attr: *mut ThreadAttr, entry: extern "C" fn(usize) -> !, arg: usize) -> i32;
    fn qurt_thread_join(id: u32, status: *mut i32) -> i32;
    fn qurt_thread_exit(status: i32) -> !;
    fn qurt_thread_get_id() -> u32;
    fn qurt_thread_get_priority(id: u32) -> i32;
    fn qurt_futex_wait(lock: *mut c_void, val: i32) -> i32;
    fn qurt_futex_wake(lock: *mut c_void, n_to_wake: i32) -> i32;
}

/// `qurt_thread_attr_t` (36 bytes), set as `qurt_thread_attr_init` documents its defaults
/// (empty name, TCB in RAM, stid 0, bus priority 255, timetest id -2, legacy detach state),
/// then the stack and the caller's priority.
#[repr(C)]
pub struct ThreadAttr {
    name: [u8; 16],
    tcb_partition: u8,
    stid: u8,
    priority: u16,
    /// autostack:1, group_id:6, reserved:1.
    bits: u8,
    bus_priority: u8,
    timetest_id: u16,
    stack_size: u32,
    stack_addr: *mut u8,
    detach_state: u16,
}

/// A worker's stack (a Q8_0 product keeps 16 KiB of lane accumulators on it).
#[repr(C, align(8))]
struct Stack(UnsafeCell<[u8; STACK_BYTES]>);
const STACK_BYTES: usize = 128 << 10;
// SAFETY: stack `i` is handed to worker `i + 1` alone, once per start.
unsafe impl Sync for Stack {}
static STACKS: [Stack; MAX_THREADS - 1] = [const { Stack(UnsafeCell::new([0; STACK_BYTES])) }; MAX_THREADS - 1];
/// QuRT's id of each worker (index = worker number).
static TIDS: [AtomicU32; MAX_THREADS] = [const { AtomicU32::new(0) }; MAX_THREADS];

/// QuRT threads: the skel's [`Os`].
pub struct Qurt;

impl Os for Qurt {
    fn spawn(me: usize, entry: extern "C" fn(usize) -> !) -> bool {
        let stack = STACKS[me - 1].0.get().cast::<u8>();
        // SAFETY: declared QuRT functions with their documented arguments; the attribute
        // is complete and lives across the call; the stack is this worker's alone.
        unsafe {
            let priority = qurt_thread_get_priority(qurt_thread_get_id());
            let mut attr = ThreadAttr {
                name: *b"keel-hvx\0\0\0\0\0\0\0\0",
                tcb_partition: 0,
                stid: 0,
                priority: if (1..=254).contains(&priority) { priority as u16 } else { 254 },
                bits: 0,
                bus_priority: 255,
                timetest_id: 0xfffe,
                stack_size: STACK_BYTES as u32,
                stack_addr: stack,
                detach_state: 0,
            };
            let mut id = 0u32;
            if qurt_thread_create(&mut id, &mut attr, entry, me) != QURT_EOK {
                return false;
            }
            TIDS[me].store(id, core::sync::atomic::Ordering::Release);
        }
        true
    }
    fn wait(word: &AtomicU32, expected: u32) {
        // SAFETY: a live word; QuRT returns at once if it no longer holds `expected`.
        unsafe { qurt_futex_wait(word.as_ptr().cast(), expected as i32) };
    }
    fn wake(word: &AtomicU32, n: i32) {
        // SAFETY: a live word.
        unsafe { qurt_futex_wake(word.as_ptr().cast(), n) };
    }
    fn exit() -> ! {
        // SAFETY: ends the calling worker thread.
        unsafe { qurt_thread_exit(0) }
    }
    fn join(me: usize) {
        let mut status = 0;
        // SAFETY: a thread this skel created.
        unsafe { qurt_thread_join(TIDS[me].load(core::sync::atomic::Ordering::Acquire), &mut status) };
    }
    fn begin_share() {
        // SAFETY: declared QuRT function; held while this worker's share runs.
        unsafe { qurt_hvx_lock(QURT_HVX_MODE_128B) };
    }
    fn end_share() {
        // SAFETY: the lock begin_share took.
        unsafe { qurt_hvx_unlock() };
    }
}

/// The workers (started at `start`, stopped at `close`); read by the device as `&'static`.
struct Pool(UnsafeCell<Option<Threads<Qurt>>>);
// SAFETY: written only by `start` and `close`, when no device exists (FastRPC calls them
// one at a time).
unsafe impl Sync for Pool {}
static POOL: Pool = Pool(UnsafeCell::new(None));

const AEE_SUCCESS: i32 = 0;
const AEE_EBADPARM: i32 = 0x0e;
const AEE_EUNSUPPORTED: i32 = 0x14;
const AEE_ENOMEMORY: i32 = 0x02;
const AEE_EBADSTATE: i32 = 0x0d;
const QURT_HVX_MODE_128B: i32 = 1;
const QURT_EOK: i32 = 0;
const FLAG_DEREF: u32 = 0x8;
const FLAG_FLUSH_SENDER: u32 = 0x10;
const FLAG_INVALIDATE_RECIPIENT: u32 = 0x80;
/// Most VTCM taken (v69-v75's whole VTCM; v68 has 4 MiB).
const VTCM_MAX: u32 = 8 << 20;
/// Least VTCM the skel starts with: the self-test's buffers and a small batch's scratch.
const VTCM_MIN: u32 = 256 << 10;
/// The per-session DSP address budget reported (v73: ~3 GiB): the host measures the real one
/// at open (`fastrpc_mmap` until the DSP refuses) and uses this only as the probe's cap.
const VA_BUDGET: u64 = 3 << 30;
const PAGE: u32 = 4096;

/// The current packet's buffer references: id = fd.
pub struct PacketBufs {
    refs: [DspqueueBuffer; MAX_BUFFERS],
    n: usize,
}

// SAFETY: `get` answers only the references of the packet being answered: dspqueue mapped
// each for the DSP and keeps it until the answer releases it (DEREF), and the host does not
// touch a batch's buffers until it is answered (the wire protocol's rule).
unsafe impl Buffers for PacketBufs {
    fn get(&self, id: BufferId) -> Option<(*mut u8, usize)> {
        self.refs[..self.n].iter().find(|r| r.fd == id.0).map(|r| (r.ptr as usize as *mut u8, r.size as usize))
    }
}

impl Mapper for PacketBufs {
    // The host maps with fastrpc_mmap and names buffers in each packet: no map messages.
    fn map(&mut self, _: BufferId, _: i32, _: u64, _: u64) -> Result<u64, ErrorKind> {
        Err(ErrorKind::Unsupported)
    }
    fn free(&mut self, _: BufferId) -> Result<(), ErrorKind> {
        Err(ErrorKind::Unsupported)
    }
}

struct Session {
    queue: *mut c_void,
    vtcm: *mut c_void,
    device: Option<Device<'static, PacketBufs>>,
    inbuf: [u8; MAX_MESSAGE],
    outbuf: [u8; MAX_MESSAGE],
}

struct Global(UnsafeCell<Session>);
// SAFETY: FastRPC calls a handle's methods and a queue's callback one at a time.
unsafe impl Sync for Global {}

static SESSION: Global = Global(UnsafeCell::new(Session {
    queue: core::ptr::null_mut(),
    vtcm: core::ptr::null_mut(),
    device: None,
    inbuf: [0; MAX_MESSAGE],
    outbuf: [0; MAX_MESSAGE],
}));

/// The slot the device decodes batches into (`Device`'s `batch`): ~60 KiB, static
/// rather than on a FastRPC or dspqueue thread's stack.
struct Slot(UnsafeCell<BatchMsg>);
// SAFETY: borrowed only by the one device `keel_skel_start` makes (see `Global`).
unsafe impl Sync for Slot {}
static BATCH: Slot = Slot(UnsafeCell::new(BatchMsg::empty()));

fn session() -> &'static mut Session {
    // SAFETY: see `Global`: one caller at a time.
    unsafe { &mut *SESSION.0.get() }
}

/// Opens the skel: one session per process (the PD).
#[no_mangle]
pub unsafe extern "C" fn keel_skel_open(_uri: *const u8, handle: *mut u64) -> i32 {
    if handle.is_null() {
        return AEE_EBADPARM;
    }
    // SAFETY: checked non-null.
    unsafe { *handle = 1 };
    AEE_SUCCESS
}

/// Closes the skel: the device, its worker threads (ended and joined), the queue, then VTCM.
#[no_mangle]
pub unsafe extern "C" fn keel_skel_close(_handle: u64) -> i32 {
    let s = session();
    s.device = None;
    // SAFETY: see `Pool`: no device exists now.
    if let Some(t) = unsafe { (*POOL.0.get()).take() } {
        t.stop();
    }
    // SAFETY: the queue this skel imported and the VTCM it was granted, released once.
    unsafe {
        if !s.queue.is_null() {
            dspqueue_close(s.queue);
        }
        if !s.vtcm.is_null() {
            HAP_release_VTCM(s.vtcm);
        }
    }
    s.queue = core::ptr::null_mut();
    s.vtcm = core::ptr::null_mut();
    AEE_SUCCESS
}

/// One buffer `{ptr, len}` of a `remote_arg`.
#[repr(C)]
#[derive(Copy, Clone)]
pub struct RemoteBuf {
    pv: *mut c_void,
    len: usize,
}

/// The handle's method table (FastRPC's `_skel_handle_invoke`).
#[no_mangle]
pub unsafe extern "C" fn keel_skel_handle_invoke(handle: u64, scalars: u32, args: *mut RemoteBuf) -> i32 {
    let method = scalars >> 24 & 0x1f;
    let (ins, outs) = (scalars >> 16 & 0xff, scalars >> 8 & 0xff);
    // SAFETY: the shell passes `ins + outs` arguments, in order.
    unsafe {
        match (method, ins, outs) {
            (0, 1, 1) => keel_skel_open((*args).pv.cast(), (*args.add(1)).pv.cast()),
            (1, 0, 0) => keel_skel_close(handle),
            (2, 1, 0) if (*args).len == 8 => start(*((*args).pv as *const u64)),
            _ => AEE_EUNSUPPORTED,
        }
    }
}

/// Imports the host's queue, takes VTCM (as much as is free, probed), proves HVX computes
/// and starts a worker per further HVX context before answering anything.
unsafe fn start(queue_id: u64) -> i32 {
    let s = session();
    if !s.queue.is_null() {
        return AEE_EBADSTATE;
    }
    // SAFETY: declared DSP-image functions with their documented arguments.
    unsafe {
        let (mut block, mut page, mut pages) = (0u32, 0u32, 0u32);
        if HAP_query_avail_VTCM(&mut block, &mut page, &mut pages) != 0 || pages == 0 || page < VTCM_MIN {
            return AEE_ENOMEMORY;
        }
        // One page (single_page: the scratch is one contiguous range).
        let vtcm_bytes = page.min(VTCM_MAX);
        s.vtcm = HAP_request_VTCM(vtcm_bytes, 1);
        if s.vtcm.is_null() {
            return AEE_ENOMEMORY;
        }
        let scratch = core::slice::from_raw_parts_mut(s.vtcm.cast::<u8>(), vtcm_bytes as usize);
        qurt_hvx_lock(QURT_HVX_MODE_128B);
        let seed = 0x6b65_656c;
        let hvx = match keel_dsp_firmware::selftest::run(seed, &mut Scratch::new(scratch)) {
            Ok(d) if selftest::check(seed, d).is_ok() => UnitState::Verified,
            _ => UnitState::Failed,
        };
        qurt_hvx_unlock();
        // Bits 15..8: the chip's 128-byte HVX contexts (0: none; then one thread).
        let contexts = (qurt_hvx_get_units() >> 8 & 0xff) as usize;
        // See `Pool`: no device exists now; the device made below holds the only reference.
        let threads: &'static Threads<Qurt> = &*((*POOL.0.get()).insert(Threads::start(contexts.max(1))) as *const Threads<Qurt>);
        let m = Measured { scratch_bytes: Scratch::new(scratch).remaining(), shared_bytes: VA_BUDGET, page: PAGE, hvx, threads: threads.n_threads() as u8 };
        let bufs = PacketBufs { refs: [DspqueueBuffer { fd: 0, size: 0, offset: 0, flags: 0, ptr: 0 }; MAX_BUFFERS], n: 0 };
        // The batch slot's one borrow: a session has one device (`s.queue` checked above).
        s.device = Some(Device::new(Fault::None, bufs, scratch, caps(&m), threads, &mut *BATCH.0.get()));
        let r = dspqueue_import(queue_id, on_packet, on_error, core::ptr::null_mut(), &mut s.queue);
        if r != AEE_SUCCESS {
            s.device = None;
            if let Some(t) = (*POOL.0.get()).take() {
                t.stop();
            }
            HAP_release_VTCM(s.vtcm);
            s.vtcm = core::ptr::null_mut();
            s.queue = core::ptr::null_mut();
        }
        r
    }
}

/// Answers every packet waiting in the queue.
unsafe extern "C" fn on_packet(queue: *mut c_void, _error: i32, _ctx: *mut c_void) {
    let s = session();
    let Some(dev) = s.device.as_mut() else { return };
    loop {
        let (mut flags, mut n, mut len) = (0u32, 0u32, 0u32);
        // SAFETY: every out-pointer is valid and sized as passed.
        let r = unsafe {
            dspqueue_read_noblock(queue, &mut flags, MAX_BUFFERS as u32, &mut n, dev.region.refs.as_mut_ptr(), MAX_MESSAGE as u32, &mut len, s.inbuf.as_mut_ptr())
        };
        if r != AEE_SUCCESS {
            return; // AEE_EWOULDBLOCK: nothing more now.
        }
        dev.region.n = (n as usize).min(MAX_BUFFERS);
        // SAFETY: declared QuRT functions; HVX is held while the batch runs.
        unsafe { qurt_hvx_lock(QURT_HVX_MODE_128B) };
        let answer = dev.answer(&s.inbuf[..(len as usize).min(MAX_MESSAGE)], &mut s.outbuf);
        unsafe { qurt_hvx_unlock() };
        let Ok(out) = answer else { return };
        let refs = &mut dev.region.refs[..dev.region.n];
        for r in refs.iter_mut() {
            r.flags = FLAG_DEREF | FLAG_FLUSH_SENDER | FLAG_INVALIDATE_RECIPIENT;
        }
        // SAFETY: the queue, the references just read and the answer's bytes.
        unsafe { dspqueue_write(queue, 0, refs.len() as u32, refs.as_ptr(), out as u32, s.outbuf.as_ptr(), u32::MAX) };
        dev.region.n = 0;
    }
}

unsafe extern "C" fn on_error(_queue: *mut c_void, _error: i32, _ctx: *mut c_void) {
    session().device = None;
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    // A DSP thread that panics stops answering: the host's timeout reports it.
    loop {}
}

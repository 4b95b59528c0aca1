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
//! - Functions of the DSP image it calls are declared here, not implemented: dspqueue
//!   (`dspqueue_import/read_noblock/write/close`), HAP (`HAP_request_VTCM`,
//!   `HAP_release_VTCM`) and QuRT (`qurt_hvx_lock/unlock`). `scripts/skel-symbols.sh`
//!   checks the linked object exports the three entry points and imports exactly these.
//!
//! Built by `../ci.sh` (a PIC static library linked with `ld.lld -shared`); it has not
//! run on a DSP yet: the tests drive the same message loop as the `keel-dsp-device` ELF.

#![no_std]

use core::cell::UnsafeCell;
use core::ffi::c_void;

use keel_core::exec::{Buffers, Scratch};
use keel_core::parallel::Sequential;
use keel_dsp_firmware::args::Fault;
use keel_dsp_firmware::msgloop::{caps, Device, Mapper, Measured};
use keel_npu_hal::wire::{MAX_BUFFERS, MAX_MESSAGE};
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
    fn HAP_request_VTCM(size: u32, single_page: u32) -> *mut c_void;
    fn HAP_release_VTCM(addr: *mut c_void) -> i32;
    fn qurt_hvx_lock(mode: i32) -> i32;
    fn qurt_hvx_unlock() -> i32;
}

const AEE_SUCCESS: i32 = 0;
const AEE_EBADPARM: i32 = 0x0e;
const AEE_EUNSUPPORTED: i32 = 0x14;
const AEE_ENOMEMORY: i32 = 0x02;
const AEE_EBADSTATE: i32 = 0x0d;
const QURT_HVX_MODE_128B: i32 = 1;
const FLAG_DEREF: u32 = 0x8;
const FLAG_FLUSH_SENDER: u32 = 0x10;
const FLAG_INVALIDATE_RECIPIENT: u32 = 0x80;
/// VTCM asked for: 4 MiB (v68's whole VTCM; later chips have 8).
const VTCM_BYTES: u32 = 4 << 20;
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

/// Closes the skel: the queue, then VTCM.
#[no_mangle]
pub unsafe extern "C" fn keel_skel_close(_handle: u64) -> i32 {
    let s = session();
    s.device = None;
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

/// Imports the host's queue, takes VTCM and proves HVX computes before answering anything.
unsafe fn start(queue_id: u64) -> i32 {
    let s = session();
    if !s.queue.is_null() {
        return AEE_EBADSTATE;
    }
    // SAFETY: declared DSP-image functions with their documented arguments.
    unsafe {
        s.vtcm = HAP_request_VTCM(VTCM_BYTES, 1);
        if s.vtcm.is_null() {
            return AEE_ENOMEMORY;
        }
        let scratch = core::slice::from_raw_parts_mut(s.vtcm.cast::<u8>(), VTCM_BYTES as usize);
        qurt_hvx_lock(QURT_HVX_MODE_128B);
        let seed = 0x6b65_656c;
        let hvx = match keel_dsp_firmware::selftest::run(seed, &mut Scratch::new(scratch)) {
            Ok(d) if selftest::check(seed, d).is_ok() => UnitState::Verified,
            _ => UnitState::Failed,
        };
        qurt_hvx_unlock();
        // One thread: the skel does not start QuRT worker threads (each would need its own
        // HVX lock); the products run on the caller's.
        let m = Measured { scratch_bytes: Scratch::new(scratch).remaining(), shared_bytes: VA_BUDGET, page: PAGE, hvx, threads: 1 };
        let bufs = PacketBufs { refs: [DspqueueBuffer { fd: 0, size: 0, offset: 0, flags: 0, ptr: 0 }; MAX_BUFFERS], n: 0 };
        s.device = Some(Device::new(Fault::None, bufs, scratch, caps(&m), &Sequential));
        let r = dspqueue_import(queue_id, on_packet, on_error, core::ptr::null_mut(), &mut s.queue);
        if r != AEE_SUCCESS {
            s.device = None;
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

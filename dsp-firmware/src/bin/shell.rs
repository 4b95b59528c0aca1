//! `keel-dsp-shell --shm PATH --skel PATH [--vtcm BYTES] [--hvx-units N]`: a stand-in for the FastRPC
//! shell, for the libcdsprpc test double only. Runs under qemu-hexagon: loads keel's skel
//! shared object (`libkeel_skel.so`) the way the DSP's loader does (maps its PT_LOAD
//! segments, applies its relocations, resolves its imports against the stand-ins below),
//! then relays between the double (frames on stdin/stdout) and the skel's entry points.
//!
//! Stand-ins: `dspqueue_import/read_noblock/write/close` over the frames; buffer
//! references arrive as (fd, size, offset in the shared `--shm` pool, flags) and reach the
//! skel as pool addresses, as dspqueue hands DSP addresses of `fastrpc_mmap`ed buffers;
//! `HAP_query_avail_VTCM` reports `--vtcm` bytes (default 4 MiB, a v68's; at most 8 MiB)
//! as one free page until `HAP_request_VTCM` takes it (a larger request is refused),
//! `HAP_release_VTCM` gives it back; `qurt_hvx_get_units` reports `--hvx-units` 128-byte
//! contexts (default 4); `qurt_hvx_lock/unlock` count the contexts held, per thread, and
//! stop the shell if more are held at once than the chip has (QEMU's HVX is always
//! there: the count is the check); `qurt_thread_create` reads the documented
//! `qurt_thread_attr_t` fields (priority at 18, stack_size at 24, stack_addr at 28; an
//! unaligned or missing stack or a priority outside 1..=254 is refused) and starts a
//! Linux thread on that stack; `qurt_thread_join/exit`, `qurt_futex_wait/wake` map to
//! their Linux counterparts. After the skel's close no thread of it may be left running.
//!
//! Frames both ways: `u32` length, then a kind byte, a buffer count, two zero bytes, and
//! - kind 0 (invoke), double to shell: `u32` method, `u64` argument; shell to double: `i32` result;
//! - kind 1 (packet): `count` × (fd, size, offset, flags as `u32`), then the message.

#![no_std]
#![no_main]
#![feature(asm_experimental_arch)]

use core::cell::UnsafeCell;
use core::ffi::c_void;

use core::sync::atomic::{AtomicU32, Ordering};

use keel_dsp_firmware::sys;
use keel_dsp_firmware::threads::{self as linux, MAX_THREADS};
use keel_npu_hal::wire::{MAX_BUFFERS, MAX_MESSAGE};

#[repr(C, align(128))]
struct Region<const N: usize>(UnsafeCell<[u8; N]>);
// SAFETY: only the main (FastRPC) thread touches the regions; the skel's worker threads
// reach only the HVX, thread and futex stand-ins, which use atomics.
unsafe impl<const N: usize> Sync for Region<N> {}

static VTCM: Region<{ 8 << 20 }> = Region(UnsafeCell::new([0; 8 << 20]));
static FILE: Region<{ 2 << 20 }> = Region(UnsafeCell::new([0; 2 << 20]));
const HEAD: usize = 4;
const REF: usize = 16;
const FRAME: usize = HEAD + MAX_BUFFERS * REF + MAX_MESSAGE;
static INBUF: Region<FRAME> = Region(UnsafeCell::new([0; FRAME]));
static OUTBUF: Region<{ FRAME + 4 }> = Region(UnsafeCell::new([0; FRAME + 4]));

core::arch::global_asm!(".globl _start", ".type _start, @function", "_start:", "  r0 = r29", "  jump keel_shell_main");

fn die(msg: &str) -> ! {
    sys::write_all(2, b"keel-dsp-shell: ");
    sys::write_all(2, msg.as_bytes());
    sys::write_all(2, b"\n");
    sys::exit(3)
}

/// `struct dspqueue_buffer`.
#[repr(C)]
#[derive(Copy, Clone)]
struct DspqueueBuffer {
    fd: u32,
    size: u32,
    offset: u32,
    flags: u32,
    ptr: u64,
}

type Callback = unsafe extern "C" fn(*mut c_void, i32, *mut c_void);
type Invoke = unsafe extern "C" fn(u64, u32, *mut RemoteBuf) -> i32;

#[repr(C)]
struct RemoteBuf {
    pv: *mut c_void,
    len: usize,
}

struct Shell {
    pool: usize,
    pool_len: u64,
    vtcm: usize,
    /// VTCM the chip has free (`--vtcm`).
    vtcm_bytes: u32,
    callback: Option<(Callback, *mut c_void)>,
    /// The packet being handed to the skel: `INBUF[start..end]` (after the frame head).
    packet: Option<(usize, usize)>,
}

struct Global(UnsafeCell<Shell>);
// SAFETY: as `Region`: only the main thread touches `SHELL`.
unsafe impl Sync for Global {}
static SHELL: Global = Global(UnsafeCell::new(Shell { pool: 0, pool_len: 0, vtcm: 0, vtcm_bytes: 4 << 20, callback: None, packet: None }));

/// 128-byte HVX contexts of the chip (`--hvx-units`).
static HVX_UNITS: AtomicU32 = AtomicU32::new(4);
/// Contexts held now, and by which threads (Linux thread ids; 0: free).
static HVX_HELD: AtomicU32 = AtomicU32::new(0);
static HVX_HOLDERS: [AtomicU32; 16] = [const { AtomicU32::new(0) }; 16];
/// Per QuRT thread the skel made (id = index + 1): non-zero while it runs.
static THREADS: [AtomicU32; MAX_THREADS] = [const { AtomicU32::new(0) }; MAX_THREADS];
/// For the report at close: threads the skel started, HVX contexts taken by threads
/// other than the FastRPC one, the most held at once; that thread's id.
static STARTED: AtomicU32 = AtomicU32::new(0);
static WORKER_LOCKS: AtomicU32 = AtomicU32::new(0);
static MOST_HELD: AtomicU32 = AtomicU32::new(0);
static MAIN_TID: AtomicU32 = AtomicU32::new(0);


fn shell() -> &'static mut Shell {
    // SAFETY: only the main thread (the FastRPC thread) reaches `SHELL` (the skel's worker
    // threads call only the HVX, thread and futex stand-ins, which do not); no two borrows
    // live across a call into the skel that re-enters.
    unsafe { &mut *SHELL.0.get() }
}

const QUEUE: usize = 0x5eed;
const AEE_EBADPARM: i32 = 0x0e;
const AEE_EWOULDBLOCK: i32 = 516;

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

// ---- stand-ins for the DSP image's functions ----

unsafe extern "C" fn dspqueue_import(_id: u64, packet: Callback, _error: Callback, ctx: *mut c_void, queue: *mut *mut c_void) -> i32 {
    shell().callback = Some((packet, ctx));
    // SAFETY: the skel passes a place for the queue.
    unsafe { *queue = QUEUE as *mut c_void };
    0
}

unsafe extern "C" fn dspqueue_read_noblock(
    _q: *mut c_void,
    flags: *mut u32,
    max_buffers: u32,
    num_buffers: *mut u32,
    buffers: *mut DspqueueBuffer,
    max_len: u32,
    len: *mut u32,
    msg: *mut u8,
) -> i32 {
    let s = shell();
    let Some((start, end)) = s.packet.take() else { return AEE_EWOULDBLOCK };
    // SAFETY: the frame just read; the skel's out-pointers, sized as it passed.
    unsafe {
        let inbuf = &*INBUF.0.get();
        let n = usize::from(inbuf[start - HEAD + 1]);
        let body = start + n * REF;
        if n > max_buffers as usize || end - body > max_len as usize {
            return AEE_EBADPARM;
        }
        for i in 0..n {
            let r = &inbuf[start + i * REF..];
            let (fd, size, offset, fl) = (u32_at(r, 0), u32_at(r, 4), u32_at(r, 8), u32_at(r, 12));
            if u64::from(offset) + u64::from(size) > s.pool_len {
                return AEE_EBADPARM;
            }
            // Volatile: this build's loop optimiser dropped some of these stores (seen with
            // 6 and 7 references under qemu-hexagon -cpu v68).
            core::ptr::write_volatile(buffers.add(i), DspqueueBuffer { fd, size, offset: 0, flags: fl, ptr: (s.pool + offset as usize) as u64 });
        }
        core::ptr::copy_nonoverlapping(inbuf[body..end].as_ptr(), msg, end - body);
        *num_buffers = n as u32;
        *len = (end - body) as u32;
        *flags = 0;
    }
    0
}

unsafe extern "C" fn dspqueue_write(_q: *mut c_void, _flags: u32, n: u32, buffers: *const DspqueueBuffer, len: u32, msg: *const u8, _t: u32) -> i32 {
    let s = shell();
    let n = n as usize;
    if n > MAX_BUFFERS || len as usize > MAX_MESSAGE {
        return AEE_EBADPARM;
    }
    // SAFETY: the skel's `n` references and `len` bytes.
    unsafe {
        let out = &mut *OUTBUF.0.get();
        let total = HEAD + n * REF + len as usize;
        out[..4].copy_from_slice(&(total as u32).to_le_bytes());
        out[4..8].copy_from_slice(&[1, n as u8, 0, 0]);
        for i in 0..n {
            let b = core::ptr::read_volatile(buffers.add(i));
            let offset = (b.ptr as usize).wrapping_sub(s.pool) as u32;
            let at = out.as_mut_ptr().add(8 + i * REF) as *mut u32;
            for (j, v) in [b.fd, b.size, offset, b.flags].into_iter().enumerate() {
                core::ptr::write_volatile(at.add(j), v.to_le());
            }
        }
        core::ptr::copy_nonoverlapping(msg, out[8 + n * REF..].as_mut_ptr(), len as usize);
        if !sys::write_all(1, &out[..4 + total]) {
            sys::exit(7);
        }
    }
    0
}

unsafe extern "C" fn dspqueue_close(_q: *mut c_void) -> i32 {
    shell().callback = None;
    0
}

unsafe extern "C" fn hap_query_avail_vtcm(block: *mut u32, page: *mut u32, pages: *mut u32) -> i32 {
    let s = shell();
    let free = if s.vtcm != 0 { 0 } else { s.vtcm_bytes };
    // SAFETY: the skel's out-pointers (each may be null, as documented).
    unsafe {
        for (p, v) in [(block, free), (page, free), (pages, u32::from(free > 0))] {
            if !p.is_null() {
                *p = v;
            }
        }
    }
    0
}

unsafe extern "C" fn hap_request_vtcm(size: u32, _single_page: u32) -> *mut c_void {
    let s = shell();
    if s.vtcm != 0 || size == 0 || size > s.vtcm_bytes {
        return core::ptr::null_mut();
    }
    s.vtcm = VTCM.0.get() as usize;
    s.vtcm as *mut c_void
}

unsafe extern "C" fn hap_release_vtcm(_addr: *mut c_void) -> i32 {
    shell().vtcm = 0;
    0
}

unsafe extern "C" fn qurt_hvx_lock(mode: i32) -> i32 {
    if mode != 1 {
        die("qurt_hvx_lock: only QURT_HVX_MODE_128B (1) exists on a v66+ cDSP");
    }
    let me = sys::gettid();
    if HVX_HOLDERS.iter().any(|h| h.load(Ordering::Acquire) == me) {
        return 0; // already held by this thread
    }
    let held = HVX_HELD.fetch_add(1, Ordering::AcqRel) + 1;
    if held > HVX_UNITS.load(Ordering::Relaxed) {
        die("qurt_hvx_lock: more HVX contexts held at once than the chip has (--hvx-units)");
    }
    MOST_HELD.fetch_max(held, Ordering::Relaxed);
    if me != MAIN_TID.load(Ordering::Relaxed) {
        WORKER_LOCKS.fetch_add(1, Ordering::Relaxed);
    }
    if !HVX_HOLDERS.iter().any(|h| h.compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed).is_ok()) {
        die("qurt_hvx_lock: too many holders");
    }
    0
}

unsafe extern "C" fn qurt_hvx_unlock() -> i32 {
    let me = sys::gettid();
    let Some(h) = HVX_HOLDERS.iter().find(|h| h.load(Ordering::Acquire) == me) else { die("qurt_hvx_unlock by a thread that holds no HVX context") };
    h.store(0, Ordering::Release);
    HVX_HELD.fetch_sub(1, Ordering::AcqRel);
    0
}

unsafe extern "C" fn qurt_hvx_get_units() -> i32 {
    (HVX_UNITS.load(Ordering::Relaxed) << 8) as i32
}

unsafe extern "C" fn qurt_thread_create(id: *mut u32, attr: *const u8, entry: extern "C" fn(usize) -> !, arg: usize) -> i32 {
    const QURT_EFAILED: i32 = 12;
    if id.is_null() || attr.is_null() {
        return QURT_EFAILED;
    }
    // SAFETY: the skel's qurt_thread_attr_t (36 bytes), read at its documented offsets.
    let (priority, size, addr) = unsafe {
        (core::ptr::read_unaligned(attr.add(18).cast::<u16>()), core::ptr::read_unaligned(attr.add(24).cast::<u32>()), core::ptr::read_unaligned(attr.add(28).cast::<u32>()))
    };
    if addr == 0 || addr % 8 != 0 || size < 4096 || !(1..=254).contains(&priority) {
        die("qurt_thread_create: the attribute has no 8-aligned stack of at least 4 KiB, or a priority outside 1..=254");
    }
    let Some(slot) = THREADS.iter().position(|t| t.load(Ordering::Acquire) == 0) else { return QURT_EFAILED };
    let top = (addr as usize + size as usize) & !7;
    // SAFETY: the stack the skel gave this thread alone; `entry` never returns (it ends
    // with qurt_thread_exit); the word is static.
    if unsafe { linux::spawn(entry, arg, top, &THREADS[slot]) } <= 0 {
        return QURT_EFAILED;
    }
    STARTED.fetch_add(1, Ordering::Relaxed);
    // SAFETY: checked non-null.
    unsafe { *id = slot as u32 + 1 };
    0
}

unsafe extern "C" fn qurt_thread_join(id: u32, status: *mut i32) -> i32 {
    const QURT_ENOTHREAD: i32 = 25;
    let Some(word) = (id as usize).checked_sub(1).and_then(|i| THREADS.get(i)) else { return QURT_ENOTHREAD };
    linux::join_word(word);
    if !status.is_null() {
        // SAFETY: checked non-null.
        unsafe { *status = 0 };
    }
    0
}

unsafe extern "C" fn qurt_thread_exit(_status: i32) -> ! {
    if HVX_HOLDERS.iter().any(|h| h.load(Ordering::Acquire) == sys::gettid()) {
        die("qurt_thread_exit with an HVX context still held");
    }
    sys::exit_thread()
}

unsafe extern "C" fn qurt_thread_get_id() -> u32 {
    sys::gettid()
}

unsafe extern "C" fn qurt_thread_get_priority(_id: u32) -> i32 {
    // The FastRPC thread's priority in this stand-in (QuRT: 1 highest .. 254).
    128
}

unsafe extern "C" fn qurt_futex_wait(lock: *mut c_void, val: i32) -> i32 {
    // SAFETY: the skel passes a live, aligned 32-bit word.
    linux::futex_wait(unsafe { &*lock.cast::<AtomicU32>() }, val as u32);
    0
}

unsafe extern "C" fn qurt_futex_wake(lock: *mut c_void, n: i32) -> i32 {
    // SAFETY: as qurt_futex_wait.
    linux::futex_wake(unsafe { &*lock.cast::<AtomicU32>() }, n);
    0
}

fn stand_in(name: &[u8]) -> Option<usize> {
    Some(match name {
        b"dspqueue_import" => dspqueue_import as *const () as usize,
        b"dspqueue_read_noblock" => dspqueue_read_noblock as *const () as usize,
        b"dspqueue_write" => dspqueue_write as *const () as usize,
        b"dspqueue_close" => dspqueue_close as *const () as usize,
        b"HAP_query_avail_VTCM" => hap_query_avail_vtcm as *const () as usize,
        b"HAP_request_VTCM" => hap_request_vtcm as *const () as usize,
        b"HAP_release_VTCM" => hap_release_vtcm as *const () as usize,
        b"qurt_hvx_lock" => qurt_hvx_lock as *const () as usize,
        b"qurt_hvx_unlock" => qurt_hvx_unlock as *const () as usize,
        b"qurt_hvx_get_units" => qurt_hvx_get_units as *const () as usize,
        b"qurt_thread_create" => qurt_thread_create as *const () as usize,
        b"qurt_thread_join" => qurt_thread_join as *const () as usize,
        b"qurt_thread_exit" => qurt_thread_exit as *const () as usize,
        b"qurt_thread_get_id" => qurt_thread_get_id as *const () as usize,
        b"qurt_thread_get_priority" => qurt_thread_get_priority as *const () as usize,
        b"qurt_futex_wait" => qurt_futex_wait as *const () as usize,
        b"qurt_futex_wake" => qurt_futex_wake as *const () as usize,
        _ => return None,
    })
}

// ---- the loader ----

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: u32 = 0;
const DT_PLTRELSZ: u32 = 2;
const DT_HASH: u32 = 4;
const DT_STRTAB: u32 = 5;
const DT_SYMTAB: u32 = 6;
const DT_RELA: u32 = 7;
const DT_RELASZ: u32 = 8;
const DT_JMPREL: u32 = 23;
const R_HEX_32: u32 = 6;
const R_HEX_GLOB_DAT: u32 = 33;
const R_HEX_JMP_SLOT: u32 = 34;
const R_HEX_RELATIVE: u32 = 35;

/// The loaded image: where it is and its dynamic symbol and string tables.
struct Image {
    base: usize,
    symtab: usize,
    strtab: usize,
    nsyms: usize,
}

fn rd(addr: usize) -> u32 {
    // SAFETY: addresses inside the loaded image, checked by the caller's bounds.
    unsafe { core::ptr::read_unaligned(addr as *const u32) }
}

fn cstr(addr: usize) -> &'static [u8] {
    let mut n = 0;
    // SAFETY: a NUL-terminated name in the image's string table.
    unsafe {
        while *((addr + n) as *const u8) != 0 {
            n += 1;
        }
        core::slice::from_raw_parts(addr as *const u8, n)
    }
}

impl Image {
    /// Symbol `i`'s address: the image's own, or a stand-in for an import.
    fn resolve(&self, i: usize) -> usize {
        let sym = self.symtab + 16 * i;
        let (name, value, shndx) = (rd(sym), rd(sym + 4), rd(sym + 12) >> 16);
        if shndx != 0 {
            return self.base + value as usize;
        }
        let n = cstr(self.strtab + name as usize);
        stand_in(n).unwrap_or_else(|| {
            sys::write_all(2, b"keel-dsp-shell: unresolved import ");
            sys::write_all(2, n);
            die("")
        })
    }

    fn find(&self, name: &[u8]) -> Option<usize> {
        (1..self.nsyms).find(|&i| rd(self.symtab + 16 * i + 12) >> 16 != 0 && cstr(self.strtab + rd(self.symtab + 16 * i) as usize) == name).map(|i| self.resolve(i))
    }

    fn relocate(&self, table: usize, size: usize) {
        for r in (table..table + size).step_by(12) {
            let (offset, info, addend) = (rd(r) as usize, rd(r + 4), rd(r + 8));
            let at = (self.base + offset) as *mut u32;
            let value = match info & 0xff {
                R_HEX_RELATIVE => (self.base as u32).wrapping_add(addend),
                R_HEX_32 | R_HEX_GLOB_DAT => (self.resolve((info >> 8) as usize) as u32).wrapping_add(addend),
                R_HEX_JMP_SLOT => self.resolve((info >> 8) as usize) as u32,
                _ => die("unsupported relocation type in the skel"),
            };
            // SAFETY: `offset` lies in the image (a relocation the linker emitted for it).
            unsafe { core::ptr::write_unaligned(at, value) };
        }
    }
}

fn load(path: &[u8]) -> Image {
    let fd = sys::open_rw(path);
    if fd < 0 {
        die("cannot open the --skel file");
    }
    // SAFETY: the only borrow of FILE.
    let file = unsafe { &mut *FILE.0.get() };
    let n = sys::read_all(fd, file).unwrap_or_else(|| die("cannot read the --skel file (or it exceeds 2 MiB)"));
    let f = &file[..n];
    if n < 52 || &f[..4] != b"\x7fELF" || f[4] != 1 || u16::from_le_bytes([f[18], f[19]]) != 0xa4 || u16::from_le_bytes([f[16], f[17]]) != 3 {
        die("--skel is not a 32-bit Hexagon shared object");
    }
    let (phoff, phnum) = (u32_at(f, 28) as usize, usize::from(u16::from_le_bytes([f[44], f[45]])));
    let ph = |i: usize| {
        let p = &f[phoff + 32 * i..];
        (u32_at(p, 0), u32_at(p, 4) as usize, u32_at(p, 8) as usize, u32_at(p, 16) as usize, u32_at(p, 20) as usize)
    };
    let span = (0..phnum).map(ph).filter(|p| p.0 == PT_LOAD).map(|p| p.2 + p.4).max().unwrap_or_else(|| die("no PT_LOAD"));
    let base = sys::mmap_anon_rwx(span.next_multiple_of(4096) as u32).unwrap_or_else(|| die("cannot map the skel"));
    let mut dynamic = 0;
    for i in 0..phnum {
        let (ty, offset, vaddr, filesz, _) = ph(i);
        if ty == PT_LOAD {
            if offset + filesz > n {
                die("a segment lies outside the file");
            }
            // SAFETY: `vaddr + filesz` is inside the `span`-byte mapping.
            unsafe { core::ptr::copy_nonoverlapping(f[offset..].as_ptr(), (base + vaddr) as *mut u8, filesz) };
        } else if ty == PT_DYNAMIC {
            dynamic = base + vaddr;
        }
    }
    if dynamic == 0 {
        die("no PT_DYNAMIC");
    }
    let (mut rela, mut relasz, mut jmprel, mut pltrelsz, mut symtab, mut strtab, mut hash) = (0, 0, 0, 0, 0, 0, 0);
    let mut d = dynamic;
    loop {
        let (tag, val) = (rd(d), rd(d + 4) as usize);
        match tag {
            DT_NULL => break,
            DT_RELA => rela = base + val,
            DT_RELASZ => relasz = val,
            DT_JMPREL => jmprel = base + val,
            DT_PLTRELSZ => pltrelsz = val,
            DT_SYMTAB => symtab = base + val,
            DT_STRTAB => strtab = base + val,
            DT_HASH => hash = base + val,
            _ => {}
        }
        d += 8;
    }
    // The symbol count: DT_HASH's nchain, else the symbols before the string table.
    let nsyms = if hash != 0 { rd(hash + 4) as usize } else { strtab.saturating_sub(symtab) / 16 };
    let img = Image { base, symtab, strtab, nsyms };
    if rela != 0 {
        img.relocate(rela, relasz);
    }
    if jmprel != 0 {
        img.relocate(jmprel, pltrelsz);
    }
    img
}

/// `n` in decimal.
fn decimal(n: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut i = buf.len();
    let mut n = n;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// On stderr at the skel's close (after its threads were found ended): what its threads did.
fn report_close() {
    let mut b = [0u8; 10];
    sys::write_all(2, b"keel-dsp-shell: close: ");
    sys::write_all(2, decimal(STARTED.load(Ordering::Relaxed), &mut b));
    sys::write_all(2, b" worker thread(s) started and joined; workers took an HVX context ");
    sys::write_all(2, decimal(WORKER_LOCKS.load(Ordering::Relaxed), &mut b));
    sys::write_all(2, b" time(s); at most ");
    sys::write_all(2, decimal(MOST_HELD.load(Ordering::Relaxed), &mut b));
    sys::write_all(2, b" of ");
    sys::write_all(2, decimal(HVX_UNITS.load(Ordering::Relaxed), &mut b));
    sys::write_all(2, b" held at once\n");
}

/// A decimal argument (as `arg` returns it, NUL-terminated).
fn number(v: &[u8]) -> Option<u32> {
    let digits = v.strip_suffix(b"\0").unwrap_or(v);
    if digits.is_empty() || digits.len() > 9 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0, |n, d| n * 10 + u32::from(d - b'0')))
}

fn arg<'a>(sp: *const u32, name: &[u8]) -> Option<&'a [u8]> {
    // SAFETY: the initial stack: argc, then argc NUL-terminated strings.
    unsafe {
        let argc = *sp as usize;
        let argv = sp.add(1) as *const *const u8;
        for i in 1..argc.saturating_sub(1) {
            let a = *argv.add(i);
            let mut n = 0;
            while *a.add(n) != 0 {
                n += 1;
            }
            if core::slice::from_raw_parts(a, n) == name {
                let v = *argv.add(i + 1);
                let mut m = 0;
                while *v.add(m) != 0 {
                    m += 1;
                }
                return Some(core::slice::from_raw_parts(v, m + 1));
            }
        }
    }
    None
}

#[no_mangle]
extern "C" fn keel_shell_main(sp: *const u32) -> ! {
    let shm = arg(sp, b"--shm").unwrap_or_else(|| die("usage: keel-dsp-shell --shm PATH --skel PATH"));
    let skel = arg(sp, b"--skel").unwrap_or_else(|| die("usage: keel-dsp-shell --shm PATH --skel PATH"));
    let fd = sys::open_rw(shm);
    let size = if fd < 0 { None } else { sys::file_size(fd) };
    let Some(size) = size.filter(|&s| s > 0 && s <= u64::from(u32::MAX)) else { die("cannot open and size the --shm pool") };
    let pool = sys::mmap_shared(fd, 0, size as u32).unwrap_or_else(|| die("cannot map the --shm pool"));
    let s = shell();
    s.pool = pool;
    s.pool_len = size;
    if let Some(v) = arg(sp, b"--vtcm") {
        s.vtcm_bytes = number(v).filter(|&n| n <= 8 << 20).unwrap_or_else(|| die("--vtcm takes a byte count of at most 8 MiB (8388608)"));
    }
    if let Some(v) = arg(sp, b"--hvx-units") {
        HVX_UNITS.store(number(v).filter(|n| (1..=16).contains(n)).unwrap_or_else(|| die("--hvx-units takes 1 to 16")), Ordering::Relaxed);
    }
    MAIN_TID.store(sys::gettid(), Ordering::Relaxed);
    let img = load(skel);
    let invoke = img.find(b"keel_skel_handle_invoke").unwrap_or_else(|| die("the skel exports no keel_skel_handle_invoke"));
    // SAFETY: the skel's entry point, resolved and relocated above.
    let invoke: Invoke = unsafe { core::mem::transmute::<usize, Invoke>(invoke) };
    let mut handle = 0u64;
    let mut uri = *b"file:///libkeel_skel.so\0";
    let mut open = [RemoteBuf { pv: uri.as_mut_ptr().cast(), len: uri.len() }, RemoteBuf { pv: (&mut handle as *mut u64).cast(), len: 8 }];
    // SAFETY: method 0 (open) with one in and one out buffer.
    if unsafe { invoke(0, 1 << 16 | 1 << 8, open.as_mut_ptr()) } != 0 {
        die("the skel refused to open");
    }
    loop {
        // SAFETY: the only borrow of INBUF outside the skel's read, which happens inside the callback below.
        let inbuf = unsafe { &mut *INBUF.0.get() };
        let mut len = [0u8; 4];
        match sys::read_exact(0, &mut len) {
            Some(true) => {}
            Some(false) => sys::exit(0),
            None => sys::exit(4),
        }
        let n = u32::from_le_bytes(len) as usize;
        if !(HEAD..=FRAME).contains(&n) || sys::read_exact(0, &mut inbuf[..n]) != Some(true) {
            die("bad frame from the double");
        }
        match inbuf[0] {
            0 if n >= HEAD + 12 => {
                let method = u32_at(inbuf, 4);
                let mut a = u64::from(u32_at(inbuf, 8)) | u64::from(u32_at(inbuf, 12)) << 32;
                let mut args = [RemoteBuf { pv: (&mut a as *mut u64).cast(), len: 8 }];
                let sc = method << 24 | if method == 2 { 1 << 16 } else { 0 };
                // SAFETY: the skel's entry point and its argument as the scalars say.
                let r = unsafe { invoke(handle, sc, args.as_mut_ptr()) };
                if method == 1 {
                    if THREADS.iter().any(|t| t.load(Ordering::Acquire) != 0) {
                        die("the skel's close left a worker thread running (its code may be unloaded after close)");
                    }
                    report_close();
                }
                let mut out = [0u8; 12];
                out[..4].copy_from_slice(&8u32.to_le_bytes());
                out[8..].copy_from_slice(&r.to_le_bytes());
                if !sys::write_all(1, &out) {
                    sys::exit(7);
                }
            }
            1 => {
                let refs = usize::from(inbuf[1]);
                if refs > MAX_BUFFERS || HEAD + refs * REF > n {
                    die("bad packet from the double");
                }
                s.packet = Some((HEAD, n));
                if let Some((cb, ctx)) = s.callback {
                    // SAFETY: the skel's packet callback, as dspqueue calls it.
                    unsafe { cb(QUEUE as *mut c_void, 0, ctx) };
                }
                s.packet = None;
            }
            _ => die("unknown frame kind"),
        }
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    die("panic")
}

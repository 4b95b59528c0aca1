//! The few Linux system calls the firmware needs under `qemu-hexagon`
//! (`trap0(#1)`, number in r6, arguments in r0–r5, result in r0; Hexagon Linux
//! uses the generic 32-bit table). On a real DSP the FastRPC skel and QuRT replace
//! this module; nothing else calls the OS.

use core::arch::asm;

const SYS_OPENAT: i32 = 56;
const SYS_LLSEEK: i32 = 62;
const SYS_READ: i32 = 63;
const SYS_WRITE: i32 = 64;
const SYS_EXIT: i32 = 93;
const SYS_EXIT_GROUP: i32 = 94;
const SYS_NANOSLEEP: i32 = 101;
const SYS_MUNMAP: i32 = 215;
const SYS_MMAP2: i32 = 222;

const AT_FDCWD: i32 = -100;
const O_RDWR: i32 = 2;
const PROT_READ_WRITE: i32 = 1 | 2;
const MAP_SHARED: i32 = 1;
const SEEK_END: i32 = 2;
/// `mmap2` counts offsets in units of this (whatever the page size; the mapping
/// itself must still start on a page: 64 KiB under QEMU's Hexagon target).
pub const PAGE: u64 = 4096;

fn syscall6(nr: i32, a: [i32; 6]) -> i32 {
    let ret: i32;
    // SAFETY: trap0(#1) is the Linux system-call trap; the kernel (QEMU) reads
    // r0-r5 and r6 and writes only r0. Callers pass valid pointers for the call.
    unsafe {
        asm!("trap0(#1)", inlateout("r0") a[0] => ret, in("r1") a[1], in("r2") a[2], in("r3") a[3],
             in("r4") a[4], in("r5") a[5], in("r6") nr, options(nostack));
    }
    ret
}

/// System call `nr` with six arguments, for the modules that make their own (futex).
pub(crate) fn syscall(nr: i32, a: [i32; 6]) -> i32 {
    syscall6(nr, a)
}

fn syscall3(nr: i32, a: i32, b: i32, c: i32) -> i32 {
    syscall6(nr, [a, b, c, 0, 0, 0])
}

/// Reads all of `fd` into `buf`; returns the bytes read, or `None` on error or if it does not fit.
pub fn read_all(fd: i32, buf: &mut [u8]) -> Option<usize> {
    let mut n = 0;
    loop {
        let rest = &mut buf[n..];
        if rest.is_empty() {
            // Full: it fits only if the input ends here.
            let mut probe = [0u8; 1];
            return (syscall3(SYS_READ, fd, probe.as_mut_ptr() as i32, 1) == 0).then_some(n);
        }
        let r = syscall3(SYS_READ, fd, rest.as_mut_ptr() as i32, rest.len() as i32);
        match r {
            0 => return Some(n),
            r if r < 0 => return None,
            r => n += r as usize,
        }
    }
}

/// Fills `buf` from `fd`: `Some(true)` when full, `Some(false)` on end of input
/// before the first byte, `None` on an error or end of input part-way.
pub fn read_exact(fd: i32, buf: &mut [u8]) -> Option<bool> {
    let mut n = 0;
    while n < buf.len() {
        let rest = &mut buf[n..];
        match syscall3(SYS_READ, fd, rest.as_mut_ptr() as i32, rest.len() as i32) {
            0 if n == 0 => return Some(false),
            r if r <= 0 => return None,
            r => n += r as usize,
        }
    }
    Some(true)
}

/// Writes all of `buf` to `fd`; false on error.
pub fn write_all(fd: i32, mut buf: &[u8]) -> bool {
    while !buf.is_empty() {
        let r = syscall3(SYS_WRITE, fd, buf.as_ptr() as i32, buf.len() as i32);
        if r <= 0 {
            return false;
        }
        buf = &buf[r as usize..];
    }
    true
}

/// Opens the NUL-terminated `path` read-write; the descriptor or `-errno`.
pub fn open_rw(path: &[u8]) -> i32 {
    if path.last() != Some(&0) {
        return -22; // EINVAL: not NUL-terminated
    }
    syscall6(SYS_OPENAT, [AT_FDCWD, path.as_ptr() as i32, O_RDWR, 0, 0, 0])
}

/// Size of the file behind `fd` (seeks to its end), or `None`.
pub fn file_size(fd: i32) -> Option<u64> {
    let mut pos = 0u64;
    let r = syscall6(SYS_LLSEEK, [fd, 0, 0, &mut pos as *mut u64 as i32, SEEK_END, 0]);
    (r == 0).then_some(pos)
}

/// Maps `len` bytes of `fd` at byte `offset` (a multiple of [`PAGE`]) shared and
/// read-write; the address, or `None`.
pub fn mmap_shared(fd: i32, offset: u64, len: u32) -> Option<usize> {
    if !offset.is_multiple_of(PAGE) || offset / PAGE > i32::MAX as u64 || len == 0 {
        return None;
    }
    let r = syscall6(SYS_MMAP2, [0, len as i32, PROT_READ_WRITE, MAP_SHARED, fd, (offset / PAGE) as i32]);
    // Addresses in the top 4 KiB are error codes (-4095..-1).
    ((r as u32) < (-4095i32) as u32).then_some(r as u32 as usize)
}

/// Maps `len` bytes of zeroed private memory, readable, writable and executable (where
/// the FastRPC shell stand-in loads a skel); the address, or `None`.
pub fn mmap_anon_rwx(len: u32) -> Option<usize> {
    mmap_anon_prot(len, PROT_READ_WRITE | 4)
}

/// Maps `len` bytes of zeroed private memory, readable and writable (a thread's
/// stack); the address, or `None`.
pub fn mmap_anon(len: u32) -> Option<usize> {
    mmap_anon_prot(len, PROT_READ_WRITE)
}

fn mmap_anon_prot(len: u32, prot: i32) -> Option<usize> {
    const MAP_PRIVATE_ANON: i32 = 0x02 | 0x20;
    let r = syscall6(SYS_MMAP2, [0, len as i32, prot, MAP_PRIVATE_ANON, -1, 0]);
    // Addresses in the top 4 KiB are error codes (-4095..-1).
    ((r as u32) < (-4095i32) as u32).then_some(r as u32 as usize)
}

/// Unmaps what [`mmap_shared`] mapped.
pub fn munmap(addr: usize, len: u32) -> bool {
    syscall3(SYS_MUNMAP, addr as i32, len as i32, 0) == 0
}

/// Sleeps about `ms` milliseconds.
pub fn sleep_ms(ms: u32) {
    let ts = [(ms / 1000) as i32, ((ms % 1000) * 1_000_000) as i32];
    syscall3(SYS_NANOSLEEP, ts.as_ptr() as i32, 0, 0);
}

/// Ends the process (every thread: `exit_group`).
pub fn exit(code: i32) -> ! {
    syscall3(SYS_EXIT_GROUP, code, 0, 0);
    // exit does not return; if it somehow did, trap forever rather than run on.
    loop {
        core::hint::spin_loop();
    }
}

/// Ends the calling thread only (`exit`).
pub fn exit_thread() -> ! {
    syscall3(SYS_EXIT, 0, 0, 0);
    loop {
        core::hint::spin_loop();
    }
}

/// The calling thread's id (`gettid`).
pub fn gettid() -> u32 {
    const SYS_GETTID: i32 = 178;
    syscall6(SYS_GETTID, [0; 6]) as u32
}

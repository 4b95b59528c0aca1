//! The few Linux system calls the QEMU harness needs (`trap0(#1)`, number in r6,
//! arguments in r0–r2, result in r0; Hexagon Linux uses the generic table).
//! On a real DSP the FastRPC skel replaces this module; nothing else calls the OS.

use core::arch::asm;

const SYS_READ: i32 = 63;
const SYS_WRITE: i32 = 64;
const SYS_EXIT: i32 = 93;

fn syscall3(nr: i32, a: i32, b: i32, c: i32) -> i32 {
    let ret: i32;
    // SAFETY: trap0(#1) is the Linux system-call trap; the kernel (QEMU) reads
    // r0-r2 and r6 and writes only r0. Callers pass valid buffer pointers.
    unsafe {
        asm!("trap0(#1)", inlateout("r0") a => ret, in("r1") b, in("r2") c, in("r6") nr, options(nostack));
    }
    ret
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

/// Ends the process.
pub fn exit(code: i32) -> ! {
    syscall3(SYS_EXIT, code, 0, 0);
    // exit does not return; if it somehow did, trap forever rather than run on.
    loop {
        core::hint::spin_loop();
    }
}

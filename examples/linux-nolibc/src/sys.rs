//! The process's whole interface to Linux: its entry point and two system calls
//! (`write`, `exit_group`), x86_64 and aarch64.

use core::arch::{asm, global_asm};

/// A file descriptor to write to; `core::fmt::Write` for `write!`.
pub struct Fd(pub i32);

impl Fd {
    /// Writes all of `s` (a failed write is dropped: nothing to report it to).
    pub fn put(&mut self, s: &str) {
        let mut b = s.as_bytes();
        while !b.is_empty() {
            let n = write(self.0, b);
            if n <= 0 {
                return;
            }
            b = &b[n as usize..];
        }
    }
}

impl core::fmt::Write for Fd {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.put(s);
        Ok(())
    }
}

/// `write(2)`: bytes written, or `-errno`.
fn write(fd: i32, b: &[u8]) -> isize {
    // SAFETY: write reads b.len() bytes at b.as_ptr(), which `b` borrows; the asm touches
    // only the registers it names (the syscall instruction clobbers rcx and r11).
    #[cfg(target_arch = "x86_64")]
    unsafe {
        let ret: isize;
        asm!("syscall", inlateout("rax") 1isize => ret, in("rdi") fd as isize, in("rsi") b.as_ptr(), in("rdx") b.len(), lateout("rcx") _, lateout("r11") _, options(nostack, readonly));
        ret
    }
    // SAFETY: as above; `svc 0` takes the number in x8 and returns in x0.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        let ret: isize;
        asm!("svc 0", inlateout("x0") fd as isize => ret, in("x1") b.as_ptr(), in("x2") b.len(), in("x8") 64isize, options(nostack, readonly));
        ret
    }
}

/// `exit_group(2)`: ends the process with `code`.
pub fn exit(code: i32) -> ! {
    // SAFETY: exit_group takes one integer and never returns.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        asm!("syscall", in("rax") 231isize, in("rdi") code as isize, options(noreturn, nostack));
    }
    // SAFETY: as above (exit_group is 94 on aarch64).
    #[cfg(target_arch = "aarch64")]
    unsafe {
        asm!("svc 0", in("x0") code as isize, in("x8") 94isize, options(noreturn, nostack));
    }
}

// The entry point: the kernel starts us with the stack pointer at argc, then argv, a
// null, envp, a null, and the auxiliary vector. `_start` passes that pointer on, with the
// stack 16-byte aligned as the C ABI wants for the call.
#[cfg(target_arch = "x86_64")]
global_asm!(".globl _start", "_start:", "xor ebp, ebp", "mov rdi, rsp", "and rsp, -16", "call {entry}", "ud2", entry = sym entry);
#[cfg(target_arch = "aarch64")]
global_asm!(".globl _start", "_start:", "mov x29, xzr", "mov x30, xzr", "mov x0, sp", "bl {entry}", "brk #0", entry = sym entry);

/// `AT_HWCAP`: the CPU feature bits in the auxiliary vector.
const AT_HWCAP: usize = 16;

/// Finds `AT_HWCAP`, runs `main` and exits with its status.
extern "C" fn entry(sp: *const usize) -> ! {
    // SAFETY: `sp` is the initial stack the kernel laid out (see above): argc, argc + 1
    // argv slots, envp up to a null, then (type, value) pairs up to AT_NULL (0).
    let hwcap = unsafe {
        let mut p = sp.add(1 + *sp + 1);
        while *p != 0 {
            p = p.add(1);
        }
        p = p.add(1);
        let mut hwcap = 0;
        while *p != 0 {
            if *p == AT_HWCAP {
                hwcap = *p.add(1);
            }
            p = p.add(2);
        }
        hwcap
    };
    exit(crate::main(hwcap))
}

/// Unwinding's personality routine: never called (panics abort, see the panic handler),
/// but the prebuilt `core` refers to it when LTO does not remove the unwinding paths
/// (debug builds).
#[no_mangle]
extern "C" fn rust_eh_personality() {}

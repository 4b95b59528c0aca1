//! Process-level faults turned into the right ending: a closed stdout and a model file
//! that changes under its mapping.
//!
//! **Broken pipe.** Rust ignores SIGPIPE (the device shims need that: a dead simulator's
//! pipe must be an error, not a silent death), so a write to a closed stdout fails with
//! `EPIPE`, and `println!` panics on it. keel instead ends the way `cat` or llama.cpp do
//! under `| head`: quietly, killed by SIGPIPE (a shell reports status 141). [`stdout_ok`]
//! does it for explicit writes; [`install`] adds a panic hook that does it for `println!`.
//!
//! **SIGBUS.** Reading a page of a mapped model file past its end (the file was truncated
//! or rewritten in place while keel ran) raises SIGBUS. [`install`]'s handler checks that
//! the fault address lies in a registered model map ([`watch_map`]) and then writes
//! `error: the model file PATH changed while keel was reading it ...` to stderr and exits
//! with 1; any other SIGBUS keeps its default action.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// Ends the process as a C program's default SIGPIPE would (status 128+13 in a shell).
pub fn die_of_sigpipe() -> ! {
    // SAFETY: resetting a disposition and raising a signal on ourselves.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(128 + libc::SIGPIPE)
}

/// Passes `r` through, except that a broken pipe ends the process quietly
/// ([`die_of_sigpipe`]): nobody is reading the output any more.
pub fn stdout_ok<T>(r: io::Result<T>) -> io::Result<T> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => die_of_sigpipe(),
        r => r,
    }
}

/// Installs the broken-pipe panic hook and the SIGBUS handler (once, from `main`).
pub fn install() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // `print!`/`println!` panic with "failed printing to stdout: Broken pipe ...".
        let msg = info.payload_as_str().unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            die_of_sigpipe();
        }
        default(info);
    }));
    // SAFETY: a zeroed sigaction is valid; the handler only reads atomics and calls
    // async-signal-safe functions.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as libc::sighandler_t;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}

/// One watched map: start, length, and the message to print (a leaked C string, never
/// freed, so the handler cannot read freed memory).
struct Watched {
    start: AtomicUsize,
    len: AtomicUsize,
    msg: AtomicPtr<libc::c_char>,
}

const SLOTS: usize = 8;
static MAPS: [Watched; SLOTS] = [const { Watched { start: AtomicUsize::new(0), len: AtomicUsize::new(0), msg: AtomicPtr::new(std::ptr::null_mut()) } }; SLOTS];

/// The message a SIGBUS in the map of `path` prints.
fn sigbus_message(path: &Path) -> Vec<u8> {
    let mut m = b"error: the model file ".to_vec();
    m.extend_from_slice(path.as_os_str().as_bytes());
    m.extend_from_slice(b" changed while keel was reading it (truncated or rewritten in place); keel cannot go on. Replace model files by writing a new file and renaming it over the old one\n");
    m.retain(|&b| b != 0);
    m
}

/// Watches `len` bytes at `start`, the map of the model file `path`; returns the slot
/// for [`unwatch_map`] (`None` if all slots are taken: that map's SIGBUS stays fatal).
pub fn watch_map(start: *const u8, len: usize, path: &Path) -> Option<usize> {
    let msg = CString::new(sigbus_message(path)).ok()?.into_raw();
    for (i, w) in MAPS.iter().enumerate() {
        if w.msg.compare_exchange(std::ptr::null_mut(), msg, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            w.start.store(start as usize, Ordering::SeqCst);
            w.len.store(len, Ordering::SeqCst);
            return Some(i);
        }
    }
    // SAFETY: from `into_raw` above, never published.
    drop(unsafe { CString::from_raw(msg) });
    None
}

/// Stops watching a map (before it is unmapped).
pub fn unwatch_map(slot: Option<usize>) {
    if let Some(i) = slot {
        MAPS[i].len.store(0, Ordering::SeqCst);
        MAPS[i].start.store(0, Ordering::SeqCst);
        MAPS[i].msg.store(std::ptr::null_mut(), Ordering::SeqCst);
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for w in &MAPS {
        let (start, len, msg) = (w.start.load(Ordering::SeqCst), w.len.load(Ordering::SeqCst), w.msg.load(Ordering::SeqCst));
        if !msg.is_null() && len > 0 && addr >= start && addr - start < len {
            // SAFETY: published messages are never freed; strlen, write and _exit are
            // async-signal-safe.
            unsafe {
                let n = libc::strlen(msg);
                let _ = libc::write(2, msg.cast(), n);
                libc::_exit(1);
            }
        }
    }
    // Not a model file: the default action (the signal stays pending until return).
    // SAFETY: async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sigbus_message_names_the_file_and_the_fix() {
        let m = String::from_utf8(sigbus_message(Path::new("/m/x.gguf"))).unwrap();
        assert!(m.starts_with("error: the model file /m/x.gguf changed while keel was reading it"), "{m}");
        assert!(m.contains("renaming it over"), "{m}");
    }
}

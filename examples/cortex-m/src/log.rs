//! defmt's global logger: frames (rzCOBS-encoded, as defmt emits them) appended to a RAM
//! buffer, for a debugger to read out and `defmt-print` to decode with this ELF. A real board
//! would send the same bytes over RTT or a UART; nothing here decodes them.
//! Logging never happens from interrupts in this program; a nested log panics.

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const LOG_BYTES: usize = 2048;

/// The frames; once full, later bytes are dropped (counted in DROPPED).
static mut LOG: [u8; LOG_BYTES] = [0; LOG_BYTES];
static LEN: AtomicUsize = AtomicUsize::new(0);
static DROPPED: AtomicUsize = AtomicUsize::new(0);
static TAKEN: AtomicBool = AtomicBool::new(false);
static mut ENCODER: defmt::Encoder = defmt::Encoder::new();

/// Bytes of log frames kept.
pub fn bytes() -> usize {
    LEN.load(Ordering::Relaxed)
}

fn append(bytes: &[u8]) {
    let len = LEN.load(Ordering::Relaxed);
    let n = bytes.len().min(LOG_BYTES - len);
    // SAFETY: only the logger (held: TAKEN) writes LOG, and only past LEN; no reference
    // to LOG lives anywhere else.
    unsafe { (&mut *core::ptr::addr_of_mut!(LOG))[len..len + n].copy_from_slice(&bytes[..n]) };
    LEN.store(len + n, Ordering::Relaxed);
    DROPPED.fetch_add(bytes.len() - n, Ordering::Relaxed);
}

#[defmt::global_logger]
struct RamLogger;

// SAFETY: acquire/release bracket every frame and TAKEN refuses a second holder, so the
// encoder and buffer are used by one frame at a time (defmt's contract for a logger).
unsafe impl defmt::Logger for RamLogger {
    fn acquire() {
        assert!(!TAKEN.swap(true, Ordering::Acquire), "defmt: nested log");
        // SAFETY: TAKEN is ours until release, so this is ENCODER's only borrow.
        unsafe { (*core::ptr::addr_of_mut!(ENCODER)).start_frame(append) }
    }

    unsafe fn flush() {}

    unsafe fn release() {
        // SAFETY: the caller holds the logger (acquire ran), so this is ENCODER's only borrow.
        unsafe { (*core::ptr::addr_of_mut!(ENCODER)).end_frame(append) };
        TAKEN.store(false, Ordering::Release);
    }

    unsafe fn write(bytes: &[u8]) {
        // SAFETY: as in release.
        unsafe { (*core::ptr::addr_of_mut!(ENCODER)).write(bytes, append) }
    }
}

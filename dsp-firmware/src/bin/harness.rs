//! The qemu-hexagon test harness: reads one request from stdin, serves it
//! (`keel_dsp_firmware::harness`), writes the response to stdout, exits 0.
//! Runs as a static `no_std` Linux user-mode ELF (its own `_start`).
#![no_std]
#![no_main]

use core::cell::UnsafeCell;

use keel_dsp_firmware::harness::{serve, Regions};
use keel_dsp_firmware::sys;

/// A 128-byte aligned static region.
#[repr(C, align(128))]
struct Region<const N: usize>(UnsafeCell<[u8; N]>);

// SAFETY: the harness is single-threaded; each region is borrowed once, in `_start`.
unsafe impl<const N: usize> Sync for Region<N> {}

static INPUT: Region<{ 24 << 20 }> = Region(UnsafeCell::new([0; 24 << 20]));
static WORK: Region<{ 24 << 20 }> = Region(UnsafeCell::new([0; 24 << 20]));
/// Stands in for VTCM (8 MiB on v69–v75); requests say how much of it to use.
static VTCM: Region<{ 8 << 20 }> = Region(UnsafeCell::new([0; 8 << 20]));
static OUTPUT: Region<{ 16 << 20 }> = Region(UnsafeCell::new([0; 16 << 20]));

#[no_mangle]
pub extern "C" fn _start() -> ! {
    // SAFETY: `_start` runs once, single-threaded; these are the only borrows of the regions.
    let (input, work, vtcm, out) =
        unsafe { (&mut *INPUT.0.get(), &mut *WORK.0.get(), &mut *VTCM.0.get(), &mut *OUTPUT.0.get()) };
    let Some(n) = sys::read_all(0, input) else { sys::exit(2) };
    let len = serve(&input[..n], Regions { work, scratch: vtcm, out });
    if !sys::write_all(1, &out[..len]) {
        sys::exit(3);
    }
    sys::exit(0)
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    sys::write_all(2, b"keel-dsp-harness: panic\n");
    sys::exit(101)
}

//! The keel DSP device as a Linux user-mode ELF for `qemu-hexagon`: measures
//! itself (shared region size, scratch granted, HVX self-test), then runs the
//! wire-protocol message loop on stdin/stdout (`keel_dsp_firmware::msgloop`).
//! Command line: `keel_dsp_firmware::args`. Exit codes: 0 host closed the pipe,
//! 2 bad command line, 3 shared region not usable, 4–7 transport failures.
#![no_std]
#![no_main]
#![feature(asm_experimental_arch)]

use core::cell::UnsafeCell;

use keel_core::exec::Scratch;
use keel_dsp_firmware::args;
use keel_dsp_firmware::msgloop::{caps, Device, Measured};
use keel_dsp_firmware::shm::SharedRegion;
use keel_dsp_firmware::sys;
use keel_dsp_firmware::threads::{Linux, Threads};
use keel_core::parallel::Parallel;
use keel_npu_hal::wire::{BatchMsg, MAX_MESSAGE};
use keel_npu_hal::{selftest, UnitState};

/// A 128-byte aligned static region.
#[repr(C, align(128))]
struct Region<const N: usize>(UnsafeCell<[u8; N]>);

// SAFETY: the device is single-threaded; each region is borrowed once, in `main`.
unsafe impl<const N: usize> Sync for Region<N> {}

/// Stands in for VTCM (8 MiB on v69–v75); `--vtcm` says how much of it is granted.
static VTCM: Region<{ 8 << 20 }> = Region(UnsafeCell::new([0; 8 << 20]));
static INBUF: Region<MAX_MESSAGE> = Region(UnsafeCell::new([0; MAX_MESSAGE]));
static OUTBUF: Region<{ MAX_MESSAGE + 4 }> = Region(UnsafeCell::new([0; MAX_MESSAGE + 4]));

/// The slot batches are decoded into (`Device`'s `batch`).
struct Slot(UnsafeCell<BatchMsg>);
// SAFETY: borrowed once, in `main`, as the regions are.
unsafe impl Sync for Slot {}
static BATCH: Slot = Slot(UnsafeCell::new(BatchMsg::empty()));

// The kernel enters `_start` with the stack pointer at `argc`; hand it to Rust.
core::arch::global_asm!(".globl _start", ".type _start, @function", "_start:", "  r0 = r29", "  jump keel_device_main");

fn die(code: i32, msg: &str) -> ! {
    sys::write_all(2, b"keel-dsp-device: ");
    sys::write_all(2, msg.as_bytes());
    sys::write_all(2, b"\n");
    sys::exit(code)
}

#[no_mangle]
extern "C" fn keel_device_main(sp: *const u32) -> ! {
    // SAFETY: `sp` is the initial stack pointer `_start` received from the kernel.
    let cfg = unsafe { args::from_stack(sp) }.unwrap_or_else(|e| die(2, e));
    // SAFETY: runs once, single-threaded; these are the only borrows of the regions.
    let (vtcm, inbuf, outbuf, batch) = unsafe { (&mut *VTCM.0.get(), &mut *INBUF.0.get(), &mut *OUTBUF.0.get(), &mut *BATCH.0.get()) };
    let granted = if cfg.vtcm == 0 { vtcm.len() } else { cfg.vtcm.min(vtcm.len()) };
    let scratch = &mut vtcm[..granted];
    let region = SharedRegion::open(cfg.shm, cfg.page_size).unwrap_or_else(|_| die(3, "cannot open and size the --shm region"));

    // Prove the vector unit computes before claiming it: known input, scalar-checked answer.
    let seed = 0x6b65_656c ^ region.size() as u32;
    let hvx = match keel_dsp_firmware::selftest::run(seed, &mut Scratch::new(scratch)) {
        Ok(d) if selftest::check(seed, d).is_ok() => UnitState::Verified,
        _ => UnitState::Failed,
    };
    // The workers start after the self-test (which runs on this thread alone).
    let threads = Threads::<Linux>::start(cfg.threads);
    let m = Measured { scratch_bytes: Scratch::new(scratch).remaining(), shared_bytes: region.size(), page: region.page(), hvx, threads: threads.n_threads() as u8 };
    let caps = caps(&m);
    Device::new(cfg.fault, region, scratch, caps, &threads, batch).serve(inbuf, outbuf)
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    die(101, "panic")
}

//! Time from SysTick: a 1 ms interrupt counts milliseconds, the counter gives the rest.
//! `Clock` implements embedded-hal's `DelayNs`. Also the stack's high-water mark: the free
//! RAM below the stack is painted at start and scanned at the end.

use core::sync::atomic::{AtomicU32, Ordering};
use cortex_m::peripheral::syst::SystClkSource;
use cortex_m::peripheral::SYST;
use cortex_m_rt::exception;

/// The core clock of QEMU's MPS2 boards (and the FPGA images they model): 25 MHz.
const CORE_HZ: u32 = 25_000_000;
const TICKS_PER_MS: u32 = CORE_HZ / 1000;

static MILLIS: AtomicU32 = AtomicU32::new(0);

#[exception]
fn SysTick() {
    MILLIS.fetch_add(1, Ordering::Relaxed);
}

/// SysTick, running, interrupting every millisecond.
pub struct Clock {
    _syst: SYST,
}

impl Clock {
    pub fn start(mut syst: SYST) -> Clock {
        syst.set_clock_source(SystClkSource::Core);
        syst.set_reload(TICKS_PER_MS - 1);
        syst.clear_current();
        syst.enable_interrupt();
        syst.enable_counter();
        Clock { _syst: syst }
    }

    /// Microseconds since `start`.
    pub fn now_us(&self) -> u64 {
        loop {
            let ms = MILLIS.load(Ordering::Relaxed);
            let ticks = TICKS_PER_MS - 1 - SYST::get_current();
            if MILLIS.load(Ordering::Relaxed) == ms {
                return ms as u64 * 1000 + (ticks / (TICKS_PER_MS / 1000)) as u64;
            }
        }
    }
}

impl embedded_hal::delay::DelayNs for Clock {
    fn delay_ns(&mut self, ns: u32) {
        let end = self.now_us() + (ns as u64).div_ceil(1000);
        while self.now_us() < end {}
    }
}

const PAINT: u32 = 0x5EE1_5EE1;

extern "C" {
    /// cortex-m-rt: the first byte after .bss/.uninit (the free RAM below the stack).
    static mut __sheap: u32;
    /// cortex-m-rt: the initial stack pointer (the top of RAM).
    static _stack_start: u32;
}

/// Paints the free RAM from the end of .bss up to just below the current stack pointer.
/// Returns where the paint starts.
#[inline(never)]
pub fn paint_stack() -> *mut u32 {
    let start = core::ptr::addr_of_mut!(__sheap);
    let sp = cortex_m::register::msp::read() as usize;
    let mut p = start;
    // 256 bytes below the stack pointer stay unpainted: this function's own frame.
    while (p as usize) < sp - 256 {
        // SAFETY: [__sheap, sp - 256) is RAM that nothing owns (no heap in this program)
        // and lies below every live stack frame; p stays word-aligned inside it.
        unsafe {
            p.write_volatile(PAINT);
            p = p.add(1);
        }
    }
    start
}

/// Bytes of stack used at most since `paint_stack` painted from `start`.
pub fn stack_used(start: *mut u32) -> usize {
    let top = core::ptr::addr_of!(_stack_start) as usize;
    let mut p = start;
    // SAFETY: reads words of the painted region, which ends below the stack's top.
    while (p as usize) < top && unsafe { p.read_volatile() } == PAINT {
        // SAFETY: stays inside [start, top), word by word.
        p = unsafe { p.add(1) };
    }
    top - p as usize
}

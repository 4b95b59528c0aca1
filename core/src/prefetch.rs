//! Cache hints for data a kernel will read soon: the weight stream of a matrix-vector
//! product, the key and value rows of attention. A hint changes no result and cannot
//! fault, so the address may lie outside every allocation (past the last weight row, a
//! cache slot not yet written); on targets without a prefetch instruction it does nothing.

/// The cache level a line is asked into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    /// The first-level data cache (x86 `prefetcht0`, aarch64 `pldl1keep`): data read
    /// within the next few hundred cycles.
    L1,
    /// The second level (x86 `prefetcht1`, aarch64 `pldl2keep`): more data than L1 holds
    /// beside the working set, read a little later.
    L2,
}

/// Asks for the 64-byte lines of the `bytes` bytes from `p` into cache level `level`.
#[inline(always)]
pub(crate) fn lines(p: *const u8, bytes: usize, level: Level) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..bytes).step_by(64) {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        let q = p.wrapping_add(off).cast();
        // SAFETY: prefetch never faults and reads nothing the program sees.
        unsafe {
            match level {
                Level::L1 => _mm_prefetch::<_MM_HINT_T0>(q),
                Level::L2 => _mm_prefetch::<_MM_HINT_T1>(q),
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    for off in (0..bytes).step_by(64) {
        let q = p.wrapping_add(off);
        // SAFETY: `prfm` never faults and changes no architectural state.
        unsafe {
            match level {
                Level::L1 => core::arch::asm!("prfm pldl1keep, [{0}]", in(reg) q, options(nostack, preserves_flags, readonly)),
                Level::L2 => core::arch::asm!("prfm pldl2keep, [{0}]", in(reg) q, options(nostack, preserves_flags, readonly)),
            }
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (p, bytes, level);
}

//! `fmaf`: `a·b + c` rounded once, the operation keel's arithmetic names wherever it
//! fuses a multiply and an add. On Hexagon it is the hardware's `sffma` (one
//! instruction; `libm::fmaf` there is a software routine through f64, dozens of
//! packets per call); elsewhere `libm::fmaf`, which the ISA kernel sets match with
//! their own FMA instructions. Both round the exact `a·b + c` to nearest even, so
//! every finite result is the same on every target (the DSP's products, attention
//! and activations are tested bit for bit against the CPU's).

/// `a·b + c` with one rounding.
#[inline(always)]
pub fn fmaf(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(target_arch = "hexagon")]
    {
        core::intrinsics::fmaf32(a, b, c)
    }
    #[cfg(not(target_arch = "hexagon"))]
    {
        libm::fmaf(a, b, c)
    }
}

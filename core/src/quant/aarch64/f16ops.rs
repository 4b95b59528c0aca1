//! NEON versions of the attention f16 vector operations (`quant/f16ops.rs` is the
//! reference and documents the order); each gives the reference's bits:
//!
//! - `dot`: the 64 f32 lanes are 16 `float32x4_t` accumulators (`vfmaq_f32` = `fmaf`),
//!   combined and reduced exactly as the reference, tail in f64 as the reference;
//! - `mad`: the native-f16-FMA part as an f64 fma (exact operands, one rounding) then
//!   `fcvtxn` (f64 → f32, round to odd) and `fcvtn` (f32 → f16, to nearest even), which
//!   is the reference's `f16_from_f64`; the tail as `f16(fmaf(x, v, y))`;
//! - `scale`, `to_f16`, `to_f32`: `fcvtl` / `fmul` / `fcvtn`, element for element.
//!
//! The f16 vector types are not stable Rust yet, so the conversions are inline asm on
//! `uint16x4_t` (base ARMv8 instructions).

use super::super::f16ops::{reduce16, DOT_STEP, F16_STEP};
use core::arch::aarch64::*;
use half::f16;

/// 4 f16 (as bits) → 4 f32, exact.
#[inline(always)]
fn cvt_f32(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: register-only base ARMv8 instruction.
    unsafe {
        core::arch::asm!("fcvtl {o:v}.4s, {h:v}.4h", o = lateout(vreg) out, h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags));
    }
    out
}

/// 4 f32 → 4 f16 (as bits), round to nearest even.
#[inline(always)]
fn cvt_f16(v: float32x4_t) -> uint16x4_t {
    let out: uint16x4_t;
    // SAFETY: register-only base ARMv8 instruction.
    unsafe {
        core::arch::asm!("fcvtn {o:v}.4h, {v:v}.4s", o = lateout(vreg) out, v = in(vreg) v,
            options(pure, nomem, nostack, preserves_flags));
    }
    out
}

#[inline(always)]
unsafe fn ld4(p: *const f16) -> uint16x4_t {
    // SAFETY: the caller guarantees 4 readable f16 at p.
    unsafe { vld1_u16(p.cast()) }
}

#[inline(always)]
unsafe fn st4(p: *mut f16, v: uint16x4_t) {
    // SAFETY: the caller guarantees 4 writable f16 at p.
    unsafe { vst1_u16(p.cast(), v) }
}

/// K·Q dot of two f16 rows, the reference's bits.
pub(crate) fn dot(x: &[f16], y: &[f16]) -> f32 {
    let n = x.len().min(y.len());
    let np = n - n % DOT_STEP;
    // SAFETY: every load reads 4 f16 below np <= n of both rows; value-only otherwise.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 16];
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        let mut i = 0;
        while i < np {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = vfmaq_f32(*a, cvt_f32(ld4(xp.add(i + 4 * k))), cvt_f32(ld4(yp.add(i + 4 * k))));
            }
            i += DOT_STEP;
        }
        // s[l] = (acc[l] + acc[32+l]) + (acc[16+l] + acc[48+l]); vector k holds lanes 4k..4k+4.
        let mut s = [0.0f32; 16];
        for k in 0..4 {
            let v = vaddq_f32(vaddq_f32(acc[k], acc[k + 8]), vaddq_f32(acc[k + 4], acc[k + 12]));
            vst1q_f32(s.as_mut_ptr().add(4 * k), v);
        }
        let mut sum = reduce16(&s) as f64;
        for i in np..n {
            sum += (x[i].to_f32() * y[i].to_f32()) as f64;
        }
        sum as f32
    }
}

/// `y += x·v` on an f16 accumulator, the reference's bits.
pub(crate) fn mad(y: &mut [f16], x: &[f16], v: f32) {
    let n = y.len().min(x.len());
    let np = n - n % F16_STEP;
    // SAFETY: every access is 4 f16 below np <= n of both slices; value-only otherwise.
    unsafe {
        let vh = vdupq_n_f64(f16::from_f32(v).to_f64());
        let (yp, xp) = (y.as_mut_ptr(), x.as_ptr());
        let mut i = 0;
        while i < np {
            let (xf, yf) = (cvt_f32(ld4(xp.add(i))), cvt_f32(ld4(yp.add(i))));
            let lo = vfmaq_f64(vcvt_f64_f32(vget_low_f32(yf)), vcvt_f64_f32(vget_low_f32(xf)), vh);
            let hi = vfmaq_f64(vcvt_high_f64_f32(yf), vcvt_high_f64_f32(xf), vh);
            // f64 → f32 round to odd (fcvtxn), then → f16 to nearest even.
            let r = vcombine_f32(vcvtx_f32_f64(lo), vcvtx_f32_f64(hi));
            st4(yp.add(i), cvt_f16(r));
            i += 4;
        }
    }
    for i in np..n {
        y[i] = f16::from_f32(libm::fmaf(x[i].to_f32(), v, y[i].to_f32()));
    }
}

/// `y *= v` on an f16 accumulator, the reference's bits.
pub(crate) fn scale(y: &mut [f16], v: f32) {
    let n = y.len();
    let np = n - n % F16_STEP;
    let vh = f16::from_f32(v).to_f32();
    // SAFETY: every access is 4 f16 below np <= n.
    unsafe {
        let yp = y.as_mut_ptr();
        let mut i = 0;
        while i < np {
            st4(yp.add(i), cvt_f16(vmulq_n_f32(cvt_f32(ld4(yp.add(i))), vh)));
            i += 4;
        }
    }
    for e in &mut y[np..] {
        *e = f16::from_f32(e.to_f32() * v);
    }
}

/// `dst[i] = f16(src[i])`, round to nearest even.
pub(crate) fn to_f16(src: &[f32], dst: &mut [f16]) {
    let n = src.len().min(dst.len());
    let n4 = n - n % 4;
    // SAFETY: 4 elements below n4 <= n of both slices per access.
    unsafe {
        let mut i = 0;
        while i < n4 {
            st4(dst.as_mut_ptr().add(i), cvt_f16(vld1q_f32(src.as_ptr().add(i))));
            i += 4;
        }
    }
    for i in n4..n {
        dst[i] = f16::from_f32(src[i]);
    }
}

/// `dst[i] = f32(src[i])` (exact).
pub(crate) fn to_f32(src: &[f16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let n4 = n - n % 4;
    // SAFETY: 4 elements below n4 <= n of both slices per access.
    unsafe {
        let mut i = 0;
        while i < n4 {
            vst1q_f32(dst.as_mut_ptr().add(i), cvt_f32(ld4(src.as_ptr().add(i))));
            i += 4;
        }
    }
    for i in n4..n {
        dst[i] = src[i].to_f32();
    }
}

#[cfg(test)]
mod tests {
    //! Wider than `quant/tests.rs`'s check: many lengths and magnitudes (products near
    //! f16 midpoints, subnormal f16 results, large values) against the reference's bits.
    extern crate std;
    use super::super::super::f16ops as reference;
    use half::f16;
    use std::vec::Vec;

    fn rng(state: &mut u64) -> u64 {
        *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *state >> 33
    }

    /// A finite f16 with a random sign, exponent in -24..12 and mantissa.
    fn any_f16(s: &mut u64) -> f16 {
        let bits = (rng(s) & 0x8000) as u16 | ((rng(s) % 27) as u16) << 10 | (rng(s) & 0x3FF) as u16;
        f16::from_bits(bits)
    }

    #[test]
    fn neon_f16_ops_equal_reference_bits() {
        let mut s = 1u64;
        for n in (0..40).map(|i| [1, 3, 4, 63, 64, 65, 127, 128, 129, 256, 300, 1000][i % 12] + 128 * (i / 12)) {
            let x: Vec<f16> = (0..n).map(|_| any_f16(&mut s)).collect();
            let y: Vec<f16> = (0..n).map(|_| any_f16(&mut s)).collect();
            assert_eq!(super::dot(&x, &y).to_bits(), reference::dot(&x, &y).to_bits(), "dot n={n}");
            for _ in 0..4 {
                let v = f32::from_bits((rng(&mut s) as u32 & 0x807F_FFFF) | (((rng(&mut s) % 40) as u32 + 100) << 23));
                let (mut a, mut b) = (y.clone(), y.clone());
                super::mad(&mut a, &x, v);
                reference::mad(&mut b, &x, v);
                assert_eq!(a, b, "mad n={n} v={v}");
                super::scale(&mut a, v);
                reference::scale(&mut b, v);
                assert_eq!(a, b, "scale n={n} v={v}");
            }
            let src: Vec<f32> = (0..n).map(|_| f32::from_bits((rng(&mut s) as u32) & 0xC7FF_FFFF)).collect();
            let (mut h1, mut h2) = (std::vec![f16::ZERO; n], std::vec![f16::ZERO; n]);
            super::to_f16(&src, &mut h1);
            reference::to_f16(&src, &mut h2);
            assert_eq!(h1, h2, "to_f16 n={n}");
            let (mut f1, mut f2) = (std::vec![0.0f32; n], std::vec![0.0f32; n]);
            super::to_f32(&x, &mut f1);
            reference::to_f32(&x, &mut f2);
            assert!(f1.iter().zip(&f2).all(|(a, b)| a.to_bits() == b.to_bits()), "to_f32 n={n}");
        }
    }
}

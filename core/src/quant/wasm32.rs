//! wasm32 simd128 pieces of the scalar reference: the same numbers, more per instruction.
//!
//! Owns only what is bit-exact by construction, so the reference keeps its bits on every
//! target (the deterministic runs in `host-wasi` compare them with native builds):
//! - [`lane_sums_i8`]: the 8 integer lane sums of a quant block (`i16x8` widening and
//!   `i32x4.dot_i16x8_s`: exact integer arithmetic);
//! - [`fma_lanes`]: 8 single-rounding `fma`s, which wasm lacks (relaxed SIMD's
//!   `relaxed_madd` may or may not fuse, so it is not used), computed in `f64x2` lanes by
//!   the method of [`super::scalar::fma_via_f64`]: exact product, TwoSum, round to odd,
//!   then one demotion to f32.
//!
//! Only deterministic instructions: integer ops, IEEE `f64x2` add/sub/mul (their NaN
//! bits are canonicalized by the runtime), conversions and bit operations.

use core::arch::wasm32::*;

/// Lane `l` = Σ over k in 4l..4l+4 of `x[k]·y[k]` (see `scalar::lane_sums`).
#[inline]
pub(crate) fn lane_sums_i8(x: &[i8; 32], y: &[i8; 32]) -> [i32; 8] {
    let ld = |s: &[i8; 32], o: usize| i8x16(s[o], s[o + 1], s[o + 2], s[o + 3], s[o + 4], s[o + 5], s[o + 6], s[o + 7], s[o + 8], s[o + 9], s[o + 10], s[o + 11], s[o + 12], s[o + 13], s[o + 14], s[o + 15]);
    let (x0, x1, y0, y1) = (ld(x, 0), ld(x, 16), ld(y, 0), ld(y, 16));
    // Pair sums: p[i] = x[2i]·y[2i] + x[2i+1]·y[2i+1] over 8 elements each.
    let p0 = i32x4_dot_i16x8(i16x8_extend_low_i8x16(x0), i16x8_extend_low_i8x16(y0));
    let p1 = i32x4_dot_i16x8(i16x8_extend_high_i8x16(x0), i16x8_extend_high_i8x16(y0));
    let p2 = i32x4_dot_i16x8(i16x8_extend_low_i8x16(x1), i16x8_extend_low_i8x16(y1));
    let p3 = i32x4_dot_i16x8(i16x8_extend_high_i8x16(x1), i16x8_extend_high_i8x16(y1));
    // Lane l = pair 2l + pair 2l+1.
    let lo = i32x4_add(i32x4_shuffle::<0, 2, 4, 6>(p0, p1), i32x4_shuffle::<1, 3, 5, 7>(p0, p1));
    let hi = i32x4_add(i32x4_shuffle::<0, 2, 4, 6>(p2, p3), i32x4_shuffle::<1, 3, 5, 7>(p2, p3));
    [
        i32x4_extract_lane::<0>(lo),
        i32x4_extract_lane::<1>(lo),
        i32x4_extract_lane::<2>(lo),
        i32x4_extract_lane::<3>(lo),
        i32x4_extract_lane::<0>(hi),
        i32x4_extract_lane::<1>(hi),
        i32x4_extract_lane::<2>(hi),
        i32x4_extract_lane::<3>(hi),
    ]
}

/// `acc[l] = fma(d, s[l], acc[l])`, one rounding each, two lanes per `f64x2`.
#[inline]
pub(crate) fn fma_lanes(d: f32, s: [f32; 8], acc: &mut [f32; 8]) {
    let dv = f64x2_splat(d as f64);
    let one = i64x2_splat(1);
    let inf = f64x2_splat(f64::INFINITY);
    for h in 0..4 {
        let (i, j) = (2 * h, 2 * h + 1);
        // Exact: both factors have 24-bit significands.
        let p = f64x2_mul(dv, f64x2(s[i] as f64, s[j] as f64));
        let a = f64x2(acc[i] as f64, acc[j] as f64);
        // TwoSum: r + e == p + a exactly.
        let r = f64x2_add(p, a);
        let bb = f64x2_sub(r, p);
        let e = f64x2_add(f64x2_sub(p, f64x2_sub(r, bb)), f64x2_sub(a, bb));
        // Round to odd where inexact (and r finite): toward zero by one ulp when e and r
        // differ in sign, then set the last bit.
        let inexact = v128_and(f64x2_ne(e, f64x2_splat(0.0)), f64x2_lt(f64x2_abs(r), inf));
        let opposite = i64x2_lt(v128_xor(e, r), i64x2_splat(0));
        let r = i64x2_sub(r, v128_and(v128_and(inexact, opposite), one));
        let r = v128_or(r, v128_and(inexact, one));
        let out = f32x4_demote_f64x2_zero(r);
        acc[i] = f32x4_extract_lane::<0>(out);
        acc[j] = f32x4_extract_lane::<1>(out);
    }
}

//! NEON dots of the 32-element block types (Q4_0 .. Q8_0, IQ4_NL, MXFP4) with Q8_0 /
//! Q8_1 activations. Per block: the weights unpacked to 32 i8 (two `int8x16_t`, elements
//! 0..16 and 16..32), the 8 exact lane sums by [`Lanes`], then the reference's float
//! operations (`scalar.rs`) in its order. Bodies are `#[inline(always)]` generics; the
//! wrappers in `mod.rs` instantiate them per [`Lanes`].

use super::{fma_lanes, fmaf, hsum8, ld_s8, ld_u8, rd_f16, Lanes};
use crate::quant::blocks::{e8m0_to_f32_half, KVALUES_IQ4NL, KVALUES_MXFP4};
use core::arch::aarch64::*;

/// The two lane vectors (lanes 0..4, 4..8) of 32 weights `x0`, `x1` times the 32
/// activations at `a`.
#[inline(always)]
unsafe fn lanes<L: Lanes>(x0: int8x16_t, x1: int8x16_t, a: *const u8) -> (int32x4_t, int32x4_t) {
    // SAFETY: 32 readable bytes at a (caller).
    unsafe {
        let z = vdupq_n_s32(0);
        (L::dot(z, x0, ld_s8(a)), L::dot(z, x1, ld_s8(a.add(16))))
    }
}

/// The exact block sum Σ x·a.
#[inline(always)]
unsafe fn sumi<L: Lanes>(x0: int8x16_t, x1: int8x16_t, a: *const u8) -> i32 {
    // SAFETY: as `lanes`.
    unsafe {
        let (l0, l1) = lanes::<L>(x0, x1, a);
        vaddvq_s32(vaddq_s32(l0, l1))
    }
}

/// The 32 nibbles of 16 bytes at p as u8: (low nibbles = elements 0..16, high = 16..32).
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: 16 readable bytes at p (caller).
    unsafe {
        let v = ld_u8(p);
        (vandq_u8(v, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(v))
    }
}

/// The Q5 fifth bits of the 4 `qh` bytes at p, as 0x10 / 0 per element (0..16, 16..32).
#[inline(always)]
unsafe fn q5_high(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    const BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: 4 readable bytes at p (caller); value-only intrinsics otherwise.
    unsafe {
        let qh = core::ptr::read_unaligned(p.cast::<[u8; 4]>());
        let bits = vld1q_u8(BITS.as_ptr());
        let h = |a: u8, b: u8| vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(a), vdup_n_u8(b)), bits), vdupq_n_u8(0x10));
        (h(qh[0], qh[1]), h(qh[2], qh[3]))
    }
}

#[inline(always)]
fn s8(v: uint8x16_t) -> int8x16_t {
    // SAFETY: value-only reinterpretation.
    unsafe { vreinterpretq_s8_u8(v) }
}

/// Q4_0 · Q8_0, repacked order: `acc = fma(f32(sumi), dw·da, acc)`.
#[inline(always)]
pub(super) unsafe fn q4_0_q8_0<L: Lanes>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: nb blocks of 18 / 34 bytes readable at w / a (caller).
    unsafe {
        let mut acc = 0.0f32;
        let eight = vdupq_n_s8(8);
        for b in 0..nb {
            let (x, y) = (w.add(18 * b), a.add(34 * b));
            let (lo, hi) = nibbles(x.add(2));
            let s = sumi::<L>(vsubq_s8(s8(lo), eight), vsubq_s8(s8(hi), eight), y.add(2));
            acc = fmaf(s as f32, rd_f16(x) * rd_f16(y), acc);
        }
        acc
    }
}

/// Q4_1 · Q8_1: 8 lane accumulators, `summs = fma(mw, sa, summs)`; `hsum8 + summs`.
#[inline(always)]
pub(super) unsafe fn q4_1_q8_1<L: Lanes>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: nb blocks of 20 / 36 bytes readable at w / a (caller).
    unsafe {
        let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let mut summs = 0.0f32;
        for b in 0..nb {
            let (x, y) = (w.add(20 * b), a.add(36 * b));
            summs = fmaf(rd_f16(x.add(2)), rd_f16(y.add(2)), summs);
            let d = rd_f16(x) * rd_f16(y);
            let (lo, hi) = nibbles(x.add(4));
            let (l0, l1) = lanes::<L>(s8(lo), s8(hi), y.add(4));
            acc0 = fma_lanes(acc0, l0, d);
            acc1 = fma_lanes(acc1, l1, d);
        }
        hsum8(acc0, acc1) + summs
    }
}

/// Q5_0 · Q8_0: 8 lane accumulators (as Q8_0), `hsum8`.
#[inline(always)]
pub(super) unsafe fn q5_0_q8_0<L: Lanes>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: nb blocks of 22 / 34 bytes readable at w / a (caller).
    unsafe {
        let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let sixteen = vdupq_n_s8(16);
        for b in 0..nb {
            let (x, y) = (w.add(22 * b), a.add(34 * b));
            let (h0, h1) = q5_high(x.add(2));
            let (lo, hi) = nibbles(x.add(6));
            let x0 = vsubq_s8(s8(vorrq_u8(lo, h0)), sixteen);
            let x1 = vsubq_s8(s8(vorrq_u8(hi, h1)), sixteen);
            let d = rd_f16(x) * rd_f16(y);
            let (l0, l1) = lanes::<L>(x0, x1, y.add(2));
            acc0 = fma_lanes(acc0, l0, d);
            acc1 = fma_lanes(acc1, l1, d);
        }
        hsum8(acc0, acc1)
    }
}

/// Q5_1 · Q8_1: as Q4_1 (8 lane accumulators, `summs` by fma).
#[inline(always)]
pub(super) unsafe fn q5_1_q8_1<L: Lanes>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: nb blocks of 24 / 36 bytes readable at w / a (caller).
    unsafe {
        let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let mut summs = 0.0f32;
        for b in 0..nb {
            let (x, y) = (w.add(24 * b), a.add(36 * b));
            summs = fmaf(rd_f16(x.add(2)), rd_f16(y.add(2)), summs);
            let d = rd_f16(x) * rd_f16(y);
            let (h0, h1) = q5_high(x.add(4));
            let (lo, hi) = nibbles(x.add(8));
            let (l0, l1) = lanes::<L>(s8(vorrq_u8(lo, h0)), s8(vorrq_u8(hi, h1)), y.add(4));
            acc0 = fma_lanes(acc0, l0, d);
            acc1 = fma_lanes(acc1, l1, d);
        }
        hsum8(acc0, acc1) + summs
    }
}

/// Q8_0 · Q8_0: 8 lane accumulators, `hsum8`.
#[inline(always)]
pub(super) unsafe fn q8_0_q8_0<L: Lanes>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: nb blocks of 34 bytes readable at w and a (caller).
    unsafe {
        let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        for b in 0..nb {
            let (x, y) = (w.add(34 * b), a.add(34 * b));
            let d = rd_f16(x) * rd_f16(y);
            let (l0, l1) = lanes::<L>(ld_s8(x.add(2)), ld_s8(x.add(18)), y.add(2));
            acc0 = fma_lanes(acc0, l0, d);
            acc1 = fma_lanes(acc1, l1, d);
        }
        hsum8(acc0, acc1)
    }
}

/// A 4-bit table type · Q8_0: `acc = fma(f32(sumi), scale(x)·da, acc)`.
#[inline(always)]
unsafe fn table_q8_0<L: Lanes>(nb: usize, w: *const u8, a: *const u8, wsize: usize, table: &[i8; 16], scale: impl Fn(*const u8) -> f32) -> f32 {
    // SAFETY: nb blocks of wsize / 34 bytes readable at w / a (caller).
    unsafe {
        let t = vld1q_s8(table.as_ptr());
        let mut acc = 0.0f32;
        for b in 0..nb {
            let (x, y) = (w.add(wsize * b), a.add(34 * b));
            let (lo, hi) = nibbles(x.add(wsize - 16));
            let s = sumi::<L>(vqtbl1q_s8(t, lo), vqtbl1q_s8(t, hi), y.add(2));
            acc = fmaf(s as f32, scale(x) * rd_f16(y), acc);
        }
        acc
    }
}

/// IQ4_NL · Q8_0 (repacked order, one accumulator).
#[inline(always)]
pub(super) unsafe fn iq4_nl_q8_0<L: Lanes>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: forwarded (caller).
    unsafe { table_q8_0::<L>(nb, w, a, 18, &KVALUES_IQ4NL, |x| rd_f16(x)) }
}

/// MXFP4 · Q8_0 (repacked order, one accumulator).
#[inline(always)]
pub(super) unsafe fn mxfp4_q8_0<L: Lanes>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: forwarded (caller); the scale is the block's first byte.
    unsafe { table_q8_0::<L>(nb, w, a, 17, &KVALUES_MXFP4, |x| e8m0_to_f32_half(*x)) }
}

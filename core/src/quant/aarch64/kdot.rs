//! NEON dots of the K-quants (Q2_K .. Q6_K) with Q8_K activations, in the reference's
//! orders (`scalar_k.rs`): per super-block the levels unpacked to i8 vectors, the exact
//! integer sums by [`Lanes`] (per sub-block sums for the repacked Q2_K / Q4_K order,
//! llama.cpp's 8 x86 lanes for Q3_K, Q5_K, Q6_K), then the reference's float operations.
//!
//! Q8_K block: `d: f32` at 0, `qs: [i8; 256]` at 4, `bsums: [i16; 16]` at 260.

use super::{fma_lanes, fmaf, hsum8, ld_s8, ld_u8, rd_f16, rd_f32, Lanes};
use crate::quant::blocks::{q3_k_scales, scale_min_k4};
use core::arch::aarch64::*;

#[inline(always)]
unsafe fn bsums(y: *const u8) -> [i16; 16] {
    // SAFETY: 292-byte Q8_K block at y (caller).
    unsafe { core::ptr::read_unaligned(y.add(260).cast::<[i16; 16]>()) }
}

#[inline(always)]
fn s8(v: uint8x16_t) -> int8x16_t {
    // SAFETY: value-only reinterpretation.
    unsafe { vreinterpretq_s8_u8(v) }
}

/// The 16 unsigned 2-bit fields `(v >> shift) & 3`.
#[inline(always)]
unsafe fn bits2(v: uint8x16_t, shift: i8) -> uint8x16_t {
    // SAFETY: value-only intrinsics.
    unsafe { vandq_u8(vshlq_u8(v, vdupq_n_s8(-shift)), vdupq_n_u8(3)) }
}

/// Q2_K · Q8_K, repacked `gemv` order: per super-block `acc = fma(f32(sumi), dw·da, acc)`,
/// `accm = fma(f32(summ), dminw·da, accm)`; result `acc - accm`.
#[inline(always)]
pub(super) unsafe fn q2_k_q8_k<L: Lanes>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: nb blocks of 84 / 292 bytes readable at w / a (caller).
    unsafe {
        let (mut acc, mut accm) = (0.0f32, 0.0f32);
        for b in 0..nb {
            let (x, y) = (w.add(84 * b), a.add(292 * b));
            let sc = core::ptr::read_unaligned(x.cast::<[u8; 16]>());
            let bs = bsums(y);
            let mut isum = vdupq_n_s32(0);
            // Element e: h = e/128, s = (e%128)/32, l = e%32 → (qs[32h+l] >> 2s) & 3;
            // 16-element sub-block j = e/16 scaled by sc[j] & 15.
            for h in 0..2 {
                let q = [ld_u8(x.add(16 + 32 * h)), ld_u8(x.add(32 + 32 * h))];
                for s in 0..4 {
                    for half in 0..2 {
                        let j = 8 * h + 2 * s + half;
                        let e = 16 * j;
                        let p = L::dot(vdupq_n_s32(0), s8(bits2(q[half], 2 * s as i8)), ld_s8(y.add(4 + e)));
                        isum = vmlaq_n_s32(isum, p, (sc[j] & 0xF) as i32);
                    }
                }
            }
            let sumi = vaddvq_s32(isum);
            let summ: i32 = (0..16).map(|j| (sc[j] >> 4) as i32 * bs[j] as i32).sum();
            let da = rd_f32(y);
            acc = fmaf(sumi as f32, rd_f16(x.add(80)) * da, acc);
            accm = fmaf(summ as f32, rd_f16(x.add(82)) * da, accm);
        }
        acc - accm
    }
}

/// Q3_K · Q8_K, llama.cpp's x86 lanes: lane l += sc[2g + l/4]·(4-sums of group g).
#[inline(always)]
pub(super) unsafe fn q3_k_q8_k<L: Lanes>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: nb blocks of 110 / 292 bytes readable at w / a (caller).
    unsafe {
        let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let four = vdupq_n_u8(4);
        for b in 0..nb {
            let (x, y) = (w.add(110 * b), a.add(292 * b));
            let sc = q3_k_scales(&core::ptr::read_unaligned(x.add(96).cast::<[u8; 12]>()));
            let hm = [ld_u8(x), ld_u8(x.add(16))];
            let (mut l0, mut l1) = (vdupq_n_s32(0), vdupq_n_s32(0));
            // Group g = 4h + s: low bits (qs[32h+l] >> 2s) & 3, minus 4 where bit g of
            // hmask[l] is clear.
            for h in 0..2 {
                let q = [ld_u8(x.add(32 + 32 * h)), ld_u8(x.add(48 + 32 * h))];
                for s in 0..4 {
                    let g = 4 * h + s;
                    let bit = vdupq_n_u8(1 << g);
                    let mut v = [vdupq_n_s8(0); 2];
                    for half in 0..2 {
                        let low = bits2(q[half], 2 * s as i8);
                        let sub = vbicq_u8(four, vtstq_u8(hm[half], bit)); // 4 where the bit is clear
                        v[half] = vsubq_s8(s8(low), s8(sub));
                    }
                    let e = 32 * g;
                    l0 = vmlaq_n_s32(l0, L::dot(vdupq_n_s32(0), v[0], ld_s8(y.add(4 + e))), sc[2 * g] as i32);
                    l1 = vmlaq_n_s32(l1, L::dot(vdupq_n_s32(0), v[1], ld_s8(y.add(20 + e))), sc[2 * g + 1] as i32);
                }
            }
            let d = rd_f32(y) * rd_f16(x.add(108));
            acc0 = fma_lanes(acc0, l0, d);
            acc1 = fma_lanes(acc1, l1, d);
        }
        hsum8(acc0, acc1)
    }
}

/// The 8 scales and 8 mins of a Q4_K / Q5_K block (packed at p, 12 bytes).
#[inline(always)]
unsafe fn scales_mins(p: *const u8) -> ([i32; 8], [i32; 8]) {
    // SAFETY: 12 readable bytes at p (caller).
    let packed = unsafe { core::ptr::read_unaligned(p.cast::<[u8; 12]>()) };
    let (mut sc, mut m) = ([0i32; 8], [0i32; 8]);
    for j in 0..8 {
        let (s, mm) = scale_min_k4(j, &packed);
        sc[j] = s as i32;
        m[j] = mm as i32;
    }
    (sc, m)
}

/// Σ_j m[j]·(bsums[2j] + bsums[2j+1]), exact.
#[inline(always)]
fn min_sum(m: &[i32; 8], bs: &[i16; 16]) -> i32 {
    (0..8).map(|j| m[j] * (bs[2 * j] as i32 + bs[2 * j + 1] as i32)).sum()
}

/// Q4_K · Q8_K, repacked `gemv` order (as Q2_K, per 32-element sub-block).
#[inline(always)]
pub(super) unsafe fn q4_k_q8_k<L: Lanes>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: nb blocks of 144 / 292 bytes readable at w / a (caller).
    unsafe {
        let (mut acc, mut accm) = (0.0f32, 0.0f32);
        let mask = vdupq_n_u8(0x0F);
        for b in 0..nb {
            let (x, y) = (w.add(144 * b), a.add(292 * b));
            let (sc, m) = scales_mins(x.add(4));
            let mut isum = vdupq_n_s32(0);
            // Sub-blocks 2j (low nibbles of qs[32j..32j+32]) and 2j+1 (high nibbles).
            for j in 0..4 {
                let q = [ld_u8(x.add(16 + 32 * j)), ld_u8(x.add(32 + 32 * j))];
                let ya = y.add(4 + 64 * j);
                let lo = L::dot(L::dot(vdupq_n_s32(0), s8(vandq_u8(q[0], mask)), ld_s8(ya)), s8(vandq_u8(q[1], mask)), ld_s8(ya.add(16)));
                let hi = L::dot(L::dot(vdupq_n_s32(0), s8(vshrq_n_u8::<4>(q[0])), ld_s8(ya.add(32))), s8(vshrq_n_u8::<4>(q[1])), ld_s8(ya.add(48)));
                isum = vmlaq_n_s32(isum, lo, sc[2 * j]);
                isum = vmlaq_n_s32(isum, hi, sc[2 * j + 1]);
            }
            let sumi = vaddvq_s32(isum);
            let summ = min_sum(&m, &bsums(y));
            let da = rd_f32(y);
            acc = fmaf(sumi as f32, rd_f16(x) * da, acc);
            accm = fmaf(summ as f32, rd_f16(x.add(2)) * da, accm);
        }
        acc - accm
    }
}

/// Q5_K · Q8_K, llama.cpp's x86 order: lanes scaled by sc[g], `summs = fma(-da·dminw,
/// f32(summ), summs)`; result `hsum8(acc) + summs`.
#[inline(always)]
pub(super) unsafe fn q5_k_q8_k<L: Lanes>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: nb blocks of 176 / 292 bytes readable at w / a (caller).
    unsafe {
        let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let mut summs = 0.0f32;
        let (mask, ten) = (vdupq_n_u8(0x0F), vdupq_n_u8(0x10));
        for b in 0..nb {
            let (x, y) = (w.add(176 * b), a.add(292 * b));
            let (sc, m) = scales_mins(x.add(4));
            let da = rd_f32(y);
            summs = fmaf(-da * rd_f16(x.add(2)), min_sum(&m, &bsums(y)) as f32, summs);
            let qh = [ld_u8(x.add(16)), ld_u8(x.add(32))];
            let (mut l0, mut l1) = (vdupq_n_s32(0), vdupq_n_s32(0));
            // Group g = 2j + t: nibble t of qs[32j + l], fifth bit = bit g of qh[l].
            for j in 0..4 {
                let q = [ld_u8(x.add(48 + 32 * j)), ld_u8(x.add(64 + 32 * j))];
                for t in 0..2 {
                    let g = 2 * j + t;
                    let bit = vdupq_n_u8(1 << g);
                    let mut v = [vdupq_n_s8(0); 2];
                    for half in 0..2 {
                        let nib = if t == 0 { vandq_u8(q[half], mask) } else { vshrq_n_u8::<4>(q[half]) };
                        v[half] = s8(vorrq_u8(nib, vandq_u8(vtstq_u8(qh[half], bit), ten)));
                    }
                    let ya = y.add(4 + 32 * g);
                    l0 = vmlaq_n_s32(l0, L::dot(vdupq_n_s32(0), v[0], ld_s8(ya)), sc[g]);
                    l1 = vmlaq_n_s32(l1, L::dot(vdupq_n_s32(0), v[1], ld_s8(ya.add(16))), sc[g]);
                }
            }
            let d = da * rd_f16(x);
            acc0 = fma_lanes(acc0, l0, d);
            acc1 = fma_lanes(acc1, l1, d);
        }
        hsum8(acc0, acc1) + summs
    }
}

/// Q6_K · Q8_K, llama.cpp's x86 lanes: q unsigned (0..63), lane l scaled by
/// sc[2g + l/4], minus 32·(bsums[2l]·sc[2l] + bsums[2l+1]·sc[2l+1]).
#[inline(always)]
pub(super) unsafe fn q6_k_q8_k<L: Lanes>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: nb blocks of 210 / 292 bytes readable at w / a (caller).
    unsafe {
        let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let mask = vdupq_n_u8(0x0F);
        for b in 0..nb {
            let (x, y) = (w.add(210 * b), a.add(292 * b));
            let sc = core::ptr::read_unaligned(x.add(192).cast::<[i8; 16]>());
            let (mut l0, mut l1) = (vdupq_n_s32(0), vdupq_n_s32(0));
            // Group g = 4h + t: low = (ql[64h + 32(t&1) + l] >> 4(t>>1)) & 15,
            // high = (qh[32h + l] >> 2t) & 3.
            for h in 0..2 {
                let qh = [ld_u8(x.add(128 + 32 * h)), ld_u8(x.add(144 + 32 * h))];
                for t in 0..4 {
                    let g = 4 * h + t;
                    let mut v = [vdupq_n_s8(0); 2];
                    for half in 0..2 {
                        let ql = ld_u8(x.add(64 * h + 32 * (t & 1) + 16 * half));
                        let low = if t >> 1 == 0 { vandq_u8(ql, mask) } else { vshrq_n_u8::<4>(ql) };
                        let high = vshlq_n_u8::<4>(bits2(qh[half], 2 * t as i8));
                        v[half] = s8(vorrq_u8(low, high));
                    }
                    let ya = y.add(4 + 32 * g);
                    l0 = vmlaq_n_s32(l0, L::dot(vdupq_n_s32(0), v[0], ld_s8(ya)), sc[2 * g] as i32);
                    l1 = vmlaq_n_s32(l1, L::dot(vdupq_n_s32(0), v[1], ld_s8(ya.add(16))), sc[2 * g + 1] as i32);
                }
            }
            // 32·(bsums[2l]·sc[2l] + bsums[2l+1]·sc[2l+1]) per lane l.
            let bs = vld1q_s16_x2(y.add(260).cast());
            let scv = vld1q_s8(sc.as_ptr());
            let (s0, s1) = (vmovl_s8(vget_low_s8(scv)), vmovl_s8(vget_high_s8(scv)));
            let p0 = vpaddq_s32(vmull_s16(vget_low_s16(bs.0), vget_low_s16(s0)), vmull_high_s16(bs.0, s0));
            let p1 = vpaddq_s32(vmull_s16(vget_low_s16(bs.1), vget_low_s16(s1)), vmull_high_s16(bs.1, s1));
            l0 = vsubq_s32(l0, vshlq_n_s32::<5>(p0));
            l1 = vsubq_s32(l1, vshlq_n_s32::<5>(p1));
            let d = rd_f32(y) * rd_f16(x.add(208));
            acc0 = fma_lanes(acc0, l0, d);
            acc1 = fma_lanes(acc1, l1, d);
        }
        hsum8(acc0, acc1)
    }
}

//! llama.cpp's reference quantizers for the 256-element K-quants (Q2_K .. Q6_K) and Q8_K.
//!
//! Owns `quantize_row_q{2,3,4,5,6}_K_ref` and `quantize_row_q8_K_ref` (build 11434,
//! `ggml-quants.c`), re-expressed operation for operation: the same float expressions
//! in the same order, unfused (llama.cpp builds `ggml-quants.c` into `ggml-base`
//! without `-march`, so its compiler cannot contract them into FMAs), the same
//! `nearest_int` (round half to even through the 1.5·2^23 trick), the same integer
//! truncations on store and the same first-wins tie breaks. That is what makes
//! `keel quantize` reproduce `llama-quantize`'s bytes: without an importance matrix,
//! `quantize_q{2..6}_K` call exactly these `_ref` functions.
//!
//! Per type, in one line each (details at the functions):
//! - Q2_K: per 16 elements a weighted min+scale fit (`make_qkx2_quants`, weights |x|,
//!   15 trial scales), scales and mins to 4 bits against their maxima, then requantize.
//! - Q3_K: per 16 a signed scale by `make_q3_quants` (x²-weighted, 5 refinement passes),
//!   scales to 6 bits, requantize to -4..=3.
//! - Q4_K / Q5_K: per 32 a min+scale fit (`make_qkx2_quants`, weights `rms + |x|`,
//!   21 / 16 trial scales), scales and mins to 6 bits, requantize to 0..=15 / 0..=31.
//! - Q6_K: per 16 a signed scale by `make_qx_quants` (x²-weighted, 18 trial scales),
//!   scales to i8 against -128, requantize to -32..=31.
//! - Q8_K: `d = max / -127` with the signed element of largest magnitude, `q =
//!   min(127, nearest_int(x · (-127/max)))`, `bsums` per 16. Used for weights and, as
//!   in llama.cpp on x86 (`quantize_row_q8_K` is the reference there), for activations.
//!
//! Shapes are prechecked by `mod.rs`: `x` holds whole super-blocks, `out` their bytes.

// Index loops over several arrays at once keep ggml's index arithmetic recognizable.
#![allow(clippy::needless_range_loop)]

use super::blocks::{f16_to_f32, scale_min_k4, write_block, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K};
use half::f16;

/// ggml's `GROUP_MAX_EPS`: groups with a smaller maximum count as all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even for |f| < 2^22 (adds 1.5·2^23 and reads
/// the mantissa), and the same garbage as ggml outside that range.
#[inline]
pub(crate) fn nearest_int(f: f32) -> i32 {
    ((f + 12_582_912.0).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

#[inline]
fn fp16_round(v: f32) -> (f16, f32) {
    let h = f16::from_f32(v);
    (h, f16_to_f32(h.to_bits()))
}

/// Runs `f` on each 256-element super-block of `x`, writing its block into `out`.
pub(crate) fn each_super_block<B: super::blocks::Block>(x: &[f32], out: &mut [u8], f: impl Fn(&[f32; QK_K]) -> B) {
    let size = core::mem::size_of::<B>();
    for (xb, o) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(size)) {
        let Ok(xb) = <&[f32; QK_K]>::try_from(xb) else { break };
        write_block(&f(xb), o);
    }
}

/// The element of largest magnitude with its sign (first wins), and that magnitude.
#[inline]
fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = libm::fabsf(v);
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    (max, amax)
}

/// `make_qx_quants(n, nmax, x, L, rmse_type = 1, qw = NULL)`: a signed scale for `x`
/// with x²-weighted least squares over 18 trial inverse scales around `-nmax/max`;
/// `l[i]` gets the level plus `nmax` (0..2·nmax). Returns the scale.
fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l.iter_mut().for_each(|v| *v = 0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -nmax as f32 / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = level(iscale, v);
        *li = (q + nmax) as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (mut slx, mut sl2) = (0.0f32, 0.0f32);
        for &v in x {
            let q = level(iscale, v);
            let w = v * v;
            slx += w * v * q as f32;
            sl2 += w * q as f32 * q as f32;
        }
        if sl2 > 0.0 && slx * slx > best * sl2 {
            for (li, &v) in l.iter_mut().zip(x) {
                *li = (nmax + level(iscale, v)) as i8;
            }
            scale = slx / sl2;
            best = scale * slx;
        }
    }
    scale
}

/// `make_q3_quants(n, nmax, x, L, do_rmse = true)`: a signed scale for `x`, starting
/// from `-nmax/max` and improved by up to 5 passes of single-level changes (x²-weighted);
/// `l[i]` gets the level plus `nmax`. Returns the scale.
fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l.iter_mut().for_each(|v| *v = 0);
        return 0.0;
    }
    let iscale = -nmax as f32 / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *li = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (li, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let cur = *li as f32;
            let mut slx = sumlx - w * v * cur;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * cur * cur;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *li as i32 {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for li in l.iter_mut() {
        *li += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// `make_qkx2_quants`: an unsigned-level fit `x ≈ scale·l + min` (min <= 0) with
/// weights `w`, trying `nstep + 1` inverse scales `(rmin + rdelta·is + nmax)/(max - min)`
/// and keeping the smallest weighted error (|diff| with `use_mad`, else diff²). Writes
/// the levels (0..=nmax) to `l`; returns `(scale, -min)`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(nmax: i32, x: &[f32], w: &[f32], l: &mut [u8], rmin: f32, rdelta: f32, nstep: i32, use_mad: bool) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.iter_mut().for_each(|v| *v = 0);
        return (0.0, -min);
    }
    let err = |diff: f32| if use_mad { libm::fabsf(diff) } else { diff * diff };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax) as u8;
        l[i] = q;
        let diff = scale * q as f32 + min - x[i];
        best_error += w[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let q = q as f32;
            sum_l += w[i] * q;
            sum_l2 += w[i] * q * q;
            sum_xl += w[i] * q * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += w[i] * err(diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Packs 256 two-bit levels as Q2_K/Q3_K store them: byte `32h + l` holds elements
/// `128h + 32s + l` in bits 2s..2s+2.
fn pack_2bit(l: &[u8; QK_K]) -> [u8; 64] {
    let mut qs = [0u8; 64];
    for h in 0..2 {
        for i in 0..32 {
            let e = 128 * h + i;
            qs[32 * h + i] = l[e] | (l[e + 32] << 2) | (l[e + 64] << 4) | (l[e + 96] << 6);
        }
    }
    qs
}

/// `quantize_row_q2_K_ref` for one super-block.
pub(crate) fn q2_k_block(x: &[f32; QK_K]) -> BlockQ2K {
    const Q4SCALE: f32 = 15.0;
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0.0f32; 16], [0.0f32; 16]);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        let mut w = [0.0f32; 16];
        for (wi, &v) in w.iter_mut().zip(xs) {
            *wi = libm::fabsf(v);
        }
        (scales[j], mins[j]) = make_qkx2_quants(3, xs, &w, &mut l[16 * j..16 * j + 16], -0.5, 0.1, 15, true);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let mut b = BlockQ2K { scales: [0; 16], qs: [0; 64], d: f16::ZERO, dmin: f16::ZERO };
    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for j in 0..16 {
            b.scales[j] = nearest_int(iscale * scales[j]) as u8;
        }
        b.d = f16::from_f32(max_scale / Q4SCALE);
    }
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for j in 0..16 {
            b.scales[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        b.dmin = f16::from_f32(max_min / Q4SCALE);
    }
    let (dd, dm) = (b.d.to_f32(), b.dmin.to_f32());
    for j in 0..16 {
        let d = dd * (b.scales[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let m = dm * (b.scales[j] >> 4) as f32;
        for i in 16 * j..16 * j + 16 {
            l[i] = nearest_int((x[i] + m) / d).clamp(0, 3) as u8;
        }
    }
    b.qs = pack_2bit(&l);
    b
}

/// `quantize_row_q3_K_ref` for one super-block.
pub(crate) fn q3_k_block(x: &[f32; QK_K]) -> BlockQ3K {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        let s = libm::fabsf(scales[j]);
        if s > amax {
            amax = s;
            max_scale = scales[j];
        }
    }
    let mut b = BlockQ3K { hmask: [0; 32], qs: [0; 64], scales: [0; 12], d: f16::ZERO };
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for j in 0..16 {
            // ggml stores nearest_int into an int8_t before clamping.
            let q = (nearest_int(iscale * scales[j]) as i8 as i32).clamp(-32, 31) + 32;
            if j < 8 {
                b.scales[j] = (q & 0xF) as u8;
            } else {
                b.scales[j - 8] |= ((q & 0xF) << 4) as u8;
            }
            b.scales[j % 4 + 8] |= ((q >> 4) << (2 * (j / 4))) as u8;
        }
        b.d = f16::from_f32(1.0 / iscale);
    }
    let dd = b.d.to_f32();
    let sc = super::blocks::q3_k_scales(&b.scales);
    for j in 0..16 {
        let d = dd * sc[j] as f32;
        if d == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            l[i] = (nearest_int(x[i] / d).clamp(-4, 3) + 4) as i8;
        }
    }
    let mut lu = [0u8; QK_K];
    for (j, (u, &v)) in lu.iter_mut().zip(&l).enumerate() {
        let mut v = v as u8;
        if v > 3 {
            b.hmask[j % 32] |= 1 << (j / 32);
            v -= 4;
        }
        *u = v;
    }
    b.qs = pack_2bit(&lu);
    b
}

/// The shared body of Q4_K and Q5_K: per 32 elements a `make_qkx2_quants` fit with
/// weights `sqrt(Σx²/32) + |x|`, then 6-bit scales and mins, then the final levels
/// (0..=nmax). Returns `(d, dmin, packed scales, levels)`.
fn qk_scales_mins(x: &[f32; QK_K], nmax: i32, rmin: f32, nstep: i32) -> (f16, f16, [u8; 12], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0.0f32; 8], [0.0f32; 8]);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = libm::sqrtf(sum_x2 / 32.0);
        let mut w = [0.0f32; 32];
        for (wi, &v) in w.iter_mut().zip(xs) {
            *wi = av_x + libm::fabsf(v);
        }
        (scales[j], mins[j]) = make_qkx2_quants(nmax, xs, &w, &mut l[32 * j..32 * j + 32], rmin, 0.1, nstep, false);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        // ggml stores nearest_int into a uint8_t before taking min(63, ·).
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let (d, dd) = fp16_round(max_scale / 63.0);
    let (dmin, dm) = fp16_round(max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &packed);
        let d = dd * sc as f32;
        if d == 0.0 {
            continue;
        }
        let m = dm * m as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + m) / d).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed, l)
}

/// `quantize_row_q4_K_ref` for one super-block.
pub(crate) fn q4_k_block(x: &[f32; QK_K]) -> BlockQ4K {
    let (d, dmin, scales, l) = qk_scales_mins(x, 15, -1.0, 20);
    let mut qs = [0u8; 128];
    for j in 0..4 {
        for i in 0..32 {
            qs[32 * j + i] = l[64 * j + i] | (l[64 * j + 32 + i] << 4);
        }
    }
    BlockQ4K { d, dmin, scales, qs }
}

/// `quantize_row_q5_K_ref` for one super-block.
pub(crate) fn q5_k_block(x: &[f32; QK_K]) -> BlockQ5K {
    let (d, dmin, scales, l) = qk_scales_mins(x, 31, -0.5, 15);
    let (mut qs, mut qh) = ([0u8; 128], [0u8; 32]);
    for j in 0..4 {
        for i in 0..32 {
            let (mut l1, mut l2) = (l[64 * j + i], l[64 * j + 32 + i]);
            if l1 > 15 {
                l1 -= 16;
                qh[i] |= 1 << (2 * j);
            }
            if l2 > 15 {
                l2 -= 16;
                qh[i] |= 2 << (2 * j);
            }
            qs[32 * j + i] = l1 | (l2 << 4);
        }
    }
    BlockQ5K { d, dmin, scales, qh, qs }
}

/// `quantize_row_q6_K_ref` for one super-block.
pub(crate) fn q6_k_block(x: &[f32; QK_K]) -> BlockQ6K {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut max_abs) = (0.0f32, 0.0f32);
    for ib in 0..16 {
        scales[ib] = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        let a = libm::fabsf(scales[ib]);
        if a > max_abs {
            max_abs = a;
            max_scale = scales[ib];
        }
    }
    let mut b = BlockQ6K { ql: [0; 128], qh: [0; 64], scales: [0; 16], d: f16::ZERO };
    if max_abs < GROUP_MAX_EPS {
        return b;
    }
    let iscale = -128.0 / max_scale;
    b.d = f16::from_f32(1.0 / iscale);
    for ib in 0..16 {
        b.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
    }
    let dd = b.d.to_f32();
    for j in 0..16 {
        let d = dd * b.scales[j] as f32;
        if d == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            l[i] = (nearest_int(x[i] / d).clamp(-32, 31) + 32) as i8;
        }
    }
    for h in 0..2 {
        for i in 0..32 {
            let q = |t: usize| l[128 * h + 32 * t + i] as u8;
            b.ql[64 * h + i] = (q(0) & 0xF) | ((q(2) & 0xF) << 4);
            b.ql[64 * h + 32 + i] = (q(1) & 0xF) | ((q(3) & 0xF) << 4);
            b.qh[32 * h + i] = (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
        }
    }
    b
}

/// `quantize_row_q8_K_ref` for one super-block (weights and activations alike).
pub(crate) fn q8_k_block(x: &[f32; QK_K]) -> BlockQ8K {
    let mut b = BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; 16] };
    let (max, amax) = signed_max(x);
    if amax == 0.0 {
        // ggml leaves bsums unwritten here; zeros are their value for zero quants.
        return b;
    }
    let iscale = -127.0 / max;
    for (q, &v) in b.qs.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as i8;
    }
    for (s, qs) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
        *s = qs.iter().map(|&q| q as i32).sum::<i32>() as i16;
    }
    b.d = 1.0 / iscale;
    b
}

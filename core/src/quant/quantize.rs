//! Scalar quantizers: llama.cpp's reference weight quantizers and keel's activation
//! quantizers (the K-quant ones are in `quantize_k.rs`).
//!
//! Owns two different roundings, on purpose:
//!
//! - **Weights** (`quantize_row_ref`): what `llama-quantize` writes without an imatrix,
//!   operation for operation, so that re-quantizing a model reproduces its bytes. For
//!   most types that is `quantize_row_*_ref`; for IQ4_NL it is `quantize_iq4_nl` with
//!   no weights (x²-weighted scale search over 15 trial scales, `ntry = 7`), which is
//!   *not* `quantize_row_iq4_nl_ref` (`ntry = -1`). Q4_0/Q5_0 take the element of largest magnitude *with its sign*,
//!   `d = max / -8` (`-16`), `id = 1/d` (0 if d == 0), `q = min(15, trunc(x*id + 8.5))`
//!   (`min(31, trunc(x*id + 16.5))`); Q4_1/Q5_1 use `d = (max - min) / 15` (`31`),
//!   `q = trunc((x - min)*id + 0.5)` (clamped to 15 for Q4_1 only); Q8_0/Q8_1 use
//!   `d = amax / 127`, `id = 1/d`, `q = roundf(x*id)` (ties away from zero), and Q8_1
//!   stores `s = f16(sum(q) * d)`. MXFP4 (`quantize_row_mxfp4_ref`) takes the exponent
//!   `floor(log2(amax)) - 2` and the nearest table value per element (see [`mxfp4_block`]).
//! - **Activations** (`quantize_act_*`): llama.cpp's x86 `quantize_row_q8_0/q8_1`
//!   (the AVX path that produced the golden outputs): `d = amax / 127`,
//!   `id = 127 / amax` (0 if amax == 0), `q = round_half_even(x*id)`. keel's AVX2 path
//!   (`x86.rs`) computes exactly this, so fast and reference activations are
//!   byte-identical (tested). Non-finite inputs give unspecified (but memory-safe) bytes.
//!
//! Row shapes: `x` has n = 32·k floats, `out` has k blocks; the caller (`mod.rs`) checks.

use super::blocks::{
    e8m0_to_f32_half, f32_to_bf16, f32_to_f16, write_block, BlockIq4Nl, BlockMxfp4, BlockQ4_0, BlockQ4_1,
    BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, KVALUES_IQ4NL, KVALUES_MXFP4, QK,
};
use super::quantize_k::{each_super_block, q2_k_block, q3_k_block, q4_k_block, q5_k_block, q6_k_block, q8_k_block};
use crate::ggml_type::GgmlType;
use half::f16;

/// Quantizes `x` into `out` with llama.cpp's reference rounding. Shapes prechecked;
/// `false` if `ty` has no reference quantizer here.
pub(crate) fn quantize_row_ref(ty: GgmlType, x: &[f32], out: &mut [u8]) -> bool {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => convert_row(ty, x, out),
        GgmlType::Q4_0 => each_block(x, out, 18, q4_0_block),
        GgmlType::Q4_1 => each_block(x, out, 20, q4_1_block),
        GgmlType::Q5_0 => each_block(x, out, 22, q5_0_block),
        GgmlType::Q5_1 => each_block(x, out, 24, q5_1_block),
        GgmlType::Q8_0 => each_block(x, out, 34, q8_0_ref_block),
        GgmlType::Q8_1 => each_block(x, out, 36, q8_1_ref_block),
        GgmlType::IQ4_NL => each_block(x, out, 18, iq4_nl_block),
        GgmlType::MXFP4 => each_block(x, out, 17, mxfp4_block),
        GgmlType::Q2_K => each_super_block(x, out, q2_k_block),
        GgmlType::Q3_K => each_super_block(x, out, q3_k_block),
        GgmlType::Q4_K => each_super_block(x, out, q4_k_block),
        GgmlType::Q5_K => each_super_block(x, out, q5_k_block),
        GgmlType::Q6_K => each_super_block(x, out, q6_k_block),
        GgmlType::Q8_K => each_super_block(x, out, q8_k_block),
        _ => return false,
    }
    true
}

/// F32 copy, F16 (round to nearest even) or BF16 (ggml's rounding) conversion of a row.
/// Shapes prechecked. Any other `ty` writes nothing.
pub(crate) fn convert_row(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    match ty {
        GgmlType::F32 => {
            for (v, o) in x.iter().zip(out.chunks_exact_mut(4)) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&f32_to_f16(*v).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
            }
        }
        _ => {}
    }
}

#[inline]
fn each_block<B: super::blocks::Block>(x: &[f32], out: &mut [u8], size: usize, f: impl Fn(&[f32]) -> B) {
    for (xb, o) in x.chunks_exact(QK).zip(out.chunks_exact_mut(size)) {
        write_block(&f(xb), o);
    }
}

/// The element of largest magnitude, with its sign (first one wins on ties).
#[inline]
fn signed_absmax(xb: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in xb {
        if amax < libm::fabsf(v) {
            amax = libm::fabsf(v);
            max = v;
        }
    }
    max
}

#[inline]
fn min_max(xb: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in xb {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

#[inline]
fn inv(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

fn q4_0_block(xb: &[f32]) -> BlockQ4_0 {
    let d = signed_absmax(xb) / -8.0;
    let id = inv(d);
    let mut qs = [0u8; 16];
    for j in 0..16 {
        let q0 = ((xb[j] * id + 8.5) as i8).min(15) as u8;
        let q1 = ((xb[j + 16] * id + 8.5) as i8).min(15) as u8;
        qs[j] = q0 | (q1 << 4);
    }
    BlockQ4_0 { d: f16::from_f32(d), qs }
}

fn q4_1_block(xb: &[f32]) -> BlockQ4_1 {
    let (min, max) = min_max(xb);
    let d = (max - min) / 15.0;
    let id = inv(d);
    let mut qs = [0u8; 16];
    for j in 0..16 {
        let q0 = (((xb[j] - min) * id + 0.5) as i8).min(15) as u8;
        let q1 = (((xb[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
        qs[j] = q0 | (q1 << 4);
    }
    BlockQ4_1 { d: f16::from_f32(d), m: f16::from_f32(min), qs }
}

/// Packs 32 five-bit values: low nibbles as Q4, 5th bits into the little-endian u32 qh.
#[inline]
fn pack_q5(q: &[u8; 32]) -> ([u8; 4], [u8; 16]) {
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
        qh |= ((q[j] as u32 & 0x10) >> 4) << j;
        qh |= ((q[j + 16] as u32 & 0x10) >> 4) << (j + 16);
    }
    (qh.to_le_bytes(), qs)
}

fn q5_0_block(xb: &[f32]) -> BlockQ5_0 {
    let d = signed_absmax(xb) / -16.0;
    let id = inv(d);
    let mut q = [0u8; 32];
    for (qj, &v) in q.iter_mut().zip(xb) {
        *qj = ((v * id + 16.5) as i8).min(31) as u8;
    }
    let (qh, qs) = pack_q5(&q);
    BlockQ5_0 { d: f16::from_f32(d), qh, qs }
}

fn q5_1_block(xb: &[f32]) -> BlockQ5_1 {
    let (min, max) = min_max(xb);
    let d = (max - min) / 31.0;
    let id = inv(d);
    let mut q = [0u8; 32];
    for (qj, &v) in q.iter_mut().zip(xb) {
        *qj = ((v - min) * id + 0.5) as u8;
    }
    let (qh, qs) = pack_q5(&q);
    BlockQ5_1 { d: f16::from_f32(d), m: f16::from_f32(min), qh, qs }
}

/// The largest `|v|`, NaNs skipped (`f32::max`). Four running maxima, combined at the
/// end: the maximum does not depend on the order it is taken in, and four independent
/// chains let an in-order DSP overlap them.
#[inline]
fn absmax(xb: &[f32]) -> f32 {
    let mut m = [0.0f32; 4];
    let chunks = xb.chunks_exact(4);
    let rest = chunks.remainder();
    for c in chunks {
        for (m, &v) in m.iter_mut().zip(c) {
            *m = m.max(libm::fabsf(v));
        }
    }
    for (m, &v) in m.iter_mut().zip(rest) {
        *m = m.max(libm::fabsf(v));
    }
    (m[0].max(m[1])).max(m[2].max(m[3]))
}

/// llama.cpp's reference Q8 rounding: `id = 1/d`, `roundf` (ties away from zero).
fn q8_ref(xb: &[f32]) -> (f32, [i8; 32], i32) {
    let d = absmax(xb) / 127.0;
    let id = inv(d);
    let mut qs = [0i8; 32];
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(xb) {
        *q = libm::roundf(v * id) as i8;
        sum += *q as i32;
    }
    (d, qs, sum)
}

fn q8_0_ref_block(xb: &[f32]) -> BlockQ8_0 {
    let (d, qs, _) = q8_ref(xb);
    BlockQ8_0 { d: f16::from_f32(d), qs }
}

fn q8_1_ref_block(xb: &[f32]) -> BlockQ8_1 {
    let (d, qs, sum) = q8_ref(xb);
    BlockQ8_1 { d: f16::from_f32(d), s: f16::from_f32(sum as f32 * d), qs }
}

/// `libm::rintf(t) as i8` (round to nearest even, then the saturating cast). Below
/// 2^22 in magnitude (every finite `x·(127/amax)`), by the 1.5·2^23 shift: the sum's
/// ulp is 1, so the add rounds `t` to an integer, to even on a tie, and its low bits
/// are that integer (saturated to i8 as the cast does). Anything else is already an
/// integer, ±inf or NaN, which the cast makes 127 (positive), −128 (negative) or 0
/// (NaN). Both results are computed and one selected by masks from `t`'s bits, with no
/// branch and no float compare: the DSP has no rounding instruction, libm's `rintf`
/// there is a software routine, and a branch or a NaN-aware compare per value keeps the
/// compiler from overlapping the values of a block.
#[inline(always)]
pub(super) fn rint_i8(t: f32) -> i8 {
    let (bits, abs) = (t.to_bits() as i32, (t.to_bits() & 0x7fff_ffff) as i32);
    let near = ((t + 12_582_912.0).to_bits() as i32).wrapping_sub(0x4B40_0000).clamp(-128, 127);
    // 127 or −128 by the sign; 0 for a NaN (|bits| above infinity's).
    let far = (127 ^ (bits >> 31)) & !(0x7f80_0000i32.wrapping_sub(abs) >> 31);
    // All ones below 2^22 (0x4A80_0000): the magnitudes of floats order as their bits.
    let small = abs.wrapping_sub(0x4A80_0000) >> 31;
    ((near & small) | (far & !small)) as i8
}

/// Activation rounding (see the module doc): `id = 127/amax`, round half to even.
/// Every |q| <= 127, which the AVX2 dots rely on.
#[inline]
fn q8_act(xb: &[f32]) -> (f32, [i8; 32], i32) {
    let mut qs = [0u8; 32];
    let (d, sum) = q8_act_into(xb, &mut qs);
    (d, qs.map(|q| q as i8), sum)
}

/// [`q8_act`] with the quants written straight into `qs` (as bytes): the scale and the
/// quants' sum returned.
#[inline]
fn q8_act_into(xb: &[f32], qs: &mut [u8]) -> (f32, i32) {
    let amax = absmax(xb);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(xb) {
        let r = rint_i8(v * id);
        *q = r as u8;
        sum += i32::from(r);
    }
    (d, sum)
}

/// Activations → Q8_0 (reference for `x86::quantize_q8_0`). Shapes prechecked. Each
/// block's bytes are written in place (f16 `d`, then the 32 quants), not built and
/// copied: a copy of 34 unaligned bytes is a `memcpy` call, slow on the DSP.
pub(crate) fn quantize_act_q8_0(x: &[f32], out: &mut [u8]) {
    for (xb, o) in x.chunks_exact(QK).zip(out.chunks_exact_mut(34)) {
        let (d, _) = q8_act_into(xb, &mut o[2..]);
        let d = f16::from_f32(d).to_bits();
        (o[0], o[1]) = (d as u8, (d >> 8) as u8);
    }
}

/// Activations → Q8_K: llama.cpp's `quantize_row_q8_K_ref`, which its x86 build also
/// uses for activations (every kernel set runs this one). Shapes prechecked.
pub(crate) fn quantize_act_q8_k(x: &[f32], out: &mut [u8]) {
    each_super_block(x, out, q8_k_block);
}

/// Activations → Q8_1 (reference for `x86::quantize_q8_1`). Shapes prechecked.
pub(crate) fn quantize_act_q8_1(x: &[f32], out: &mut [u8]) {
    each_block(x, out, 36, |xb| {
        let (d, qs, sum) = q8_act(xb);
        BlockQ8_1 { d: f16::from_f32(d), s: f16::from_f32(d * sum as f32), qs }
    });
}

/// ggml's `best_index_int8` on a sorted table: the index of the value nearest to `x`,
/// the lower one unless the upper is strictly nearer. ggml binary-searches for the pair
/// `val[mu-1] <= x < val[mu]`; `mu` is also the number of values <= x, which is computed
/// here without branches (same result for every x, NaN included: ggml returns 15).
#[inline]
fn best_index_int8(val: &[f32; 16], x: f32) -> usize {
    if x <= val[0] {
        return 0;
    }
    if x >= val[15] || x.is_nan() {
        return 15;
    }
    let mu = val.iter().map(|&v| (v <= x) as usize).sum::<usize>();
    if x - val[mu - 1] < val[mu] - x {
        mu - 1
    } else {
        mu
    }
}

/// IQ4_NL as `quantize_iq4_nl` writes it with no importance weights (what
/// `llama-quantize` does without an imatrix): weights x², a first scale
/// `d = max / 127` (max = the signed element of largest magnitude), its least-squares
/// refit, then 15 trial inverse scales `(t - 127) / max`, t = -7..=7, keeping the best
/// `Σwqx² / Σwq²`; the indices are then recomputed with the final (unrounded) scale.
fn iq4_nl_block(xb: &[f32]) -> BlockIq4Nl {
    const NTRY: i32 = 7;
    let v = &KVALUES_IQ4NL.map(|k| k as f32);
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &x in xb {
        let ax = libm::fabsf(x);
        if ax > amax {
            amax = ax;
            max = x;
        }
    }
    let mut scale = 0.0f32;
    if amax >= 1e-15 {
        let fit = |id: f32| {
            let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
            for &x in xb {
                let q = v[best_index_int8(v, id * x)];
                let w = x * x;
                sumqx += w * q * x;
                sumq2 += w * q * q;
            }
            (sumqx, sumq2)
        };
        let d0 = -max / v[0];
        let (sumqx, sumq2) = fit(1.0 / d0);
        let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -NTRY..=NTRY {
            let (sumqx, sumq2) = fit((itry + KVALUES_IQ4NL[0] as i32) as f32 / max);
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scale = d;
    }
    let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    let mut qs = [0u8; 16];
    for j in 0..16 {
        let lo = best_index_int8(v, id * xb[j]) as u8;
        let hi = best_index_int8(v, id * xb[j + 16]) as u8;
        qs[j] = lo | (hi << 4);
    }
    BlockIq4Nl { d: half::f16::from_f32(scale), qs }
}

/// `floorf(log2f(x))` as glibc computes it, for positive finite `x`: the f64 logarithm
/// rounded to f32 (glibc's `log2f` is correctly rounded near powers of two, where the
/// floor is decided; checked against it for every f32 in `tests.rs`).
#[inline]
fn floor_log2f(x: f32) -> f32 {
    libm::floorf(libm::log2(x as f64) as f32)
}

/// The index of the table value `KVALUES_MXFP4[i]·e` nearest to `x` (first wins; ggml's
/// `best_index_mxfp4`).
#[inline]
fn best_index_mxfp4(x: f32, e: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = libm::fabsf(KVALUES_MXFP4[0] as f32 * e - x);
    for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = libm::fabsf(k as f32 * e - x);
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// `quantize_row_mxfp4_ref` for one block: `e = floor(log2(amax)) - 2 + 127` (0 if
/// amax = 0; truncated to u8 as ggml's cast does on x86), scale `d = 2^(e-128)`, and per
/// element the nearest of the 16 doubled E2M1 values times d.
fn mxfp4_block(xb: &[f32]) -> BlockMxfp4 {
    let mut amax = 0.0f32;
    for &v in xb {
        if amax < libm::fabsf(v) {
            amax = libm::fabsf(v);
        }
    }
    let e = if amax > 0.0 {
        let v = floor_log2f(amax) - 2.0 + 127.0;
        // x86's cvttss2si: out of range (or NaN) gives 0x8000_0000, whose low byte is 0.
        if (-2_147_483_648.0..2_147_483_648.0).contains(&v) { v as i32 as u8 } else { 0 }
    } else {
        0
    };
    let d = e8m0_to_f32_half(e);
    let mut qs = [0u8; 16];
    for j in 0..16 {
        qs[j] = best_index_mxfp4(xb[j], d) | (best_index_mxfp4(xb[j + 16], d) << 4);
    }
    BlockMxfp4 { e, qs }
}

#[cfg(test)]
pub(crate) fn floor_log2f_for_tests(x: f32) -> f32 {
    floor_log2f(x)
}

//! Scalar quantizers: llama.cpp's reference weight quantizers and keel's activation
//! quantizers.
//!
//! Owns two different roundings, on purpose:
//!
//! - **Weights** (`quantize_row_ref`): llama.cpp's `quantize_row_*_ref`, operation for
//!   operation, so that re-quantizing a model reproduces `llama-quantize`'s bytes (no
//!   imatrix). Q4_0/Q5_0 take the element of largest magnitude *with its sign*,
//!   `d = max / -8` (`-16`), `id = 1/d` (0 if d == 0), `q = min(15, trunc(x*id + 8.5))`
//!   (`min(31, trunc(x*id + 16.5))`); Q4_1/Q5_1 use `d = (max - min) / 15` (`31`),
//!   `q = trunc((x - min)*id + 0.5)` (clamped to 15 for Q4_1 only); Q8_0/Q8_1 use
//!   `d = amax / 127`, `id = 1/d`, `q = roundf(x*id)` (ties away from zero), and Q8_1
//!   stores `s = f16(sum(q) * d)`.
//! - **Activations** (`quantize_act_*`): llama.cpp's x86 `quantize_row_q8_0/q8_1`
//!   (the AVX path that produced the golden outputs): `d = amax / 127`,
//!   `id = 127 / amax` (0 if amax == 0), `q = round_half_even(x*id)`. keel's AVX2 path
//!   (`x86.rs`) computes exactly this, so fast and reference activations are
//!   byte-identical (tested). Non-finite inputs give unspecified (but memory-safe) bytes.
//!
//! Row shapes: `x` has n = 32·k floats, `out` has k blocks; the caller (`mod.rs`) checks.

use super::blocks::{
    f32_to_bf16, f32_to_f16, write_block, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0,
    BlockQ8_1, QK,
};
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

#[inline]
fn absmax(xb: &[f32]) -> f32 {
    xb.iter().fold(0.0f32, |m, &v| m.max(libm::fabsf(v)))
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

/// Activation rounding (see the module doc): `id = 127/amax`, round half to even.
/// Every |q| <= 127, which the AVX2 dots rely on.
#[inline]
fn q8_act(xb: &[f32]) -> (f32, [i8; 32], i32) {
    let amax = absmax(xb);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut qs = [0i8; 32];
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(xb) {
        *q = libm::rintf(v * id) as i8;
        sum += *q as i32;
    }
    (d, qs, sum)
}

/// Activations → Q8_0 (reference for `x86::quantize_q8_0`). Shapes prechecked.
pub(crate) fn quantize_act_q8_0(x: &[f32], out: &mut [u8]) {
    each_block(x, out, 34, |xb| {
        let (d, qs, _) = q8_act(xb);
        BlockQ8_0 { d: f16::from_f32(d), qs }
    });
}

/// Activations → Q8_1 (reference for `x86::quantize_q8_1`). Shapes prechecked.
pub(crate) fn quantize_act_q8_1(x: &[f32], out: &mut [u8]) {
    each_block(x, out, 36, |xb| {
        let (d, qs, sum) = q8_act(xb);
        BlockQ8_1 { d: f16::from_f32(d), s: f16::from_f32(d * sum as f32), qs }
    });
}

//! The scalar reference: dequantization and `vec_dot` for every supported type.
//!
//! Owns the arithmetic every faster path is checked against. Plain f32 operations in a
//! fixed order (no implicit FMA contraction: Rust never fuses; where llama.cpp's compiled
//! x86 code fuses, we call `libm::fmaf`, which is exact everywhere), so the result is bit-identical on
//! x86_64, aarch64 and wasm32. The per-block formulas and their float evaluation order
//! follow llama.cpp's `dequantize_row_*` and `ggml_vec_dot_*_generic`:
//!
//! ```text
//! q4_1·q8_1, q5_1·q8_1  llama.cpp's x86 order: 8 lane accumulators with fma, `summs`
//!            by fma (`vec_dot_q4_1_q8_1` below), so the AVX2 kernel gives the same bits
//! q5_0·q8_0, q8_0·q8_0  llama.cpp's x86 order, as q4_1 without `summs`
//! iq4_nl·q8_0, mxfp4·q8_0, q4_0·q8_0  llama.cpp's repacked order (CPU_REPACK
//!            iq4_nl_8x8 / mxfp4_8x8 / q4_0_8x8, which it uses for every weight with a
//!            multiple of 8 rows on AVX2): per block acc = fma(f32(sumi), dw·da, acc),
//!            one accumulator (`vec_dot_q4_0_q8_0_lanes`: the q8_0 order, for the
//!            Q4_0 weights llama.cpp does not repack)
//! f32/f16/bf16  sumf += w[i] * a[i], i ascending, one f32 accumulator
//! ```
//!
//! The K-quants (256-element super-blocks) are in `scalar_k.rs`.
//!
//! (llama.cpp's scalar f16 dot accumulates in f64; ours stays in f32 so every target
//! gets the same bits cheaply.) Blocks are decoded from bytes with [`read_block`], so
//! no alignment is assumed.
//!
//! Dot contract (hot path, not re-checked in release): `n` is a multiple of the weight
//! type's block size and both slices hold at least `n` elements' worth of blocks. If it
//! is broken, debug builds panic and release builds compute over the whole blocks that
//! fit in all three (never out of bounds, never a panic).

use super::blocks::{
    bf16_to_f32, e8m0_to_f32_half, f16_to_f32, qh_u32, read_block, BlockIq4Nl, BlockMxfp4, BlockQ4_0,
    BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, KVALUES_IQ4NL, KVALUES_MXFP4, QK,
};
use crate::ggml_type::GgmlType;

/// Dequantizes whole blocks of `src` into `dst` (n = `dst.len()` elements). The caller
/// has checked that `src` holds exactly `n` elements of `ty`. Returns `false` if `ty`
/// has no dequantizer here.
pub(crate) fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> bool {
    match ty {
        GgmlType::F32 => {
            for (c, y) in src.chunks_exact(4).zip(dst.iter_mut()) {
                *y = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (c, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
                *y = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        GgmlType::BF16 => {
            for (c, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
                *y = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        GgmlType::Q4_0 => {
            for (c, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(QK)) {
                let Some(b) = read_block::<BlockQ4_0>(c) else { break };
                let d = b.d.to_f32();
                for j in 0..16 {
                    y[j] = ((b.qs[j] & 0x0F) as i32 - 8) as f32 * d;
                    y[j + 16] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (c, y) in src.chunks_exact(20).zip(dst.chunks_exact_mut(QK)) {
                let Some(b) = read_block::<BlockQ4_1>(c) else { break };
                let (d, m) = (b.d.to_f32(), b.m.to_f32());
                for j in 0..16 {
                    y[j] = (b.qs[j] & 0x0F) as f32 * d + m;
                    y[j + 16] = (b.qs[j] >> 4) as f32 * d + m;
                }
            }
        }
        GgmlType::Q5_0 => {
            for (c, y) in src.chunks_exact(22).zip(dst.chunks_exact_mut(QK)) {
                let Some(b) = read_block::<BlockQ5_0>(c) else { break };
                let d = b.d.to_f32();
                let qh = qh_u32(b.qh);
                for j in 0..16 {
                    let (lo, hi) = q5_pair(b.qs[j], qh, j);
                    y[j] = (lo - 16) as f32 * d;
                    y[j + 16] = (hi - 16) as f32 * d;
                }
            }
        }
        GgmlType::Q5_1 => {
            for (c, y) in src.chunks_exact(24).zip(dst.chunks_exact_mut(QK)) {
                let Some(b) = read_block::<BlockQ5_1>(c) else { break };
                let (d, m) = (b.d.to_f32(), b.m.to_f32());
                let qh = qh_u32(b.qh);
                for j in 0..16 {
                    let (lo, hi) = q5_pair(b.qs[j], qh, j);
                    y[j] = lo as f32 * d + m;
                    y[j + 16] = hi as f32 * d + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (c, y) in src.chunks_exact(34).zip(dst.chunks_exact_mut(QK)) {
                let Some(b) = read_block::<BlockQ8_0>(c) else { break };
                let d = b.d.to_f32();
                for (yj, q) in y.iter_mut().zip(b.qs) {
                    *yj = q as f32 * d;
                }
            }
        }
        GgmlType::Q8_1 => {
            for (c, y) in src.chunks_exact(36).zip(dst.chunks_exact_mut(QK)) {
                let Some(b) = read_block::<BlockQ8_1>(c) else { break };
                let d = b.d.to_f32();
                for (yj, q) in y.iter_mut().zip(b.qs) {
                    *yj = q as f32 * d;
                }
            }
        }
        GgmlType::IQ4_NL => {
            for (c, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(QK)) {
                let Some(b) = read_block::<BlockIq4Nl>(c) else { break };
                let d = b.d.to_f32();
                for j in 0..16 {
                    y[j] = d * KVALUES_IQ4NL[(b.qs[j] & 0xF) as usize] as f32;
                    y[j + 16] = d * KVALUES_IQ4NL[(b.qs[j] >> 4) as usize] as f32;
                }
            }
        }
        GgmlType::MXFP4 => {
            for (c, y) in src.chunks_exact(17).zip(dst.chunks_exact_mut(QK)) {
                let Some(b) = read_block::<BlockMxfp4>(c) else { break };
                let d = e8m0_to_f32_half(b.e);
                for j in 0..16 {
                    y[j] = KVALUES_MXFP4[(b.qs[j] & 0xF) as usize] as f32 * d;
                    y[j + 16] = KVALUES_MXFP4[(b.qs[j] >> 4) as usize] as f32 * d;
                }
            }
        }
        _ => return super::scalar_k::dequantize_row(ty, src, dst),
    }
    true
}

/// The unsigned 5-bit values (0..=31) of elements j and j+16 of a Q5 block.
#[inline(always)]
fn q5_pair(q: u8, qh: u32, j: usize) -> (i32, i32) {
    let h0 = ((qh >> j) << 4) & 0x10;
    let h1 = (qh >> (j + 12)) & 0x10;
    ((q & 0x0F) as i32 | h0 as i32, (q >> 4) as i32 | h1 as i32)
}

#[inline]
pub(crate) fn contract(n: usize, bs: usize, w: &[u8], wsize: usize, a: &[u8], asize: usize) {
    debug_assert!(n % bs == 0, "vec_dot: n = {n} is not a multiple of the block size {bs}");
    debug_assert!(w.len() >= n / bs * wsize, "vec_dot: weight row too short");
    debug_assert!(a.len() >= n / bs * asize, "vec_dot: activation row too short");
}

/// Sum over j < 16 of `lo(q[j]) * a[j] + hi(q[j]) * a[j+16]`, split in two as llama.cpp.
#[inline(always)]
fn nibble_sumi(qs: &[u8; 16], a: &[i8; 32], f: impl Fn(u8, usize) -> (i32, i32)) -> i32 {
    let (mut s0, mut s1) = (0i32, 0i32);
    for j in 0..16 {
        let (v0, v1) = f(qs[j], j);
        s0 += v0 * a[j] as i32;
        s1 += v1 * a[j + 16] as i32;
    }
    s0 + s1
}

/// Reference Q4_0 · Q8_0 in llama.cpp's repacked order (CPU_REPACK q4_0_8x8, which it
/// uses on AVX2 for every Q4_0 weight with a multiple of 8 rows, in its `gemv` and its
/// `gemm` alike): per block `acc = fma(f32(sumi), dw·da, acc)`, one accumulator.
pub(crate) fn vec_dot_q4_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    contract(n, QK, w, 18, a, 34);
    let mut acc = 0.0f32;
    for (cw, ca) in w.chunks_exact(18).zip(a.chunks_exact(34)).take(n / QK) {
        let (Some(x), Some(y)) = (read_block::<BlockQ4_0>(cw), read_block::<BlockQ8_0>(ca)) else { break };
        let sumi = nibble_sumi(&x.qs, &y.qs, |q, _| ((q & 0x0F) as i32 - 8, (q >> 4) as i32 - 8));
        acc = crate::fused::fmaf(sumi as f32, x.d.to_f32() * y.d.to_f32(), acc);
    }
    acc
}

/// Reference Q4_0 · Q8_0 in the order of llama.cpp's x86 `ggml_vec_dot_q4_0_q8_0`, which
/// it runs for Q4_0 weights it does not repack (rows % 8 != 0; for batches its llamafile
/// `tinyBLAS_Q0_AVX` has the same per-output order): per block
/// `acc[l] = fma(dw·da, lane l, acc[l])`, then `hsum8(acc)` (see [`lane_sums`]).
pub(crate) fn vec_dot_q4_0_q8_0_lanes(n: usize, w: &[u8], a: &[u8]) -> f32 {
    contract(n, QK, w, 18, a, 34);
    let mut acc = [0.0f32; 8];
    for (cw, ca) in w.chunks_exact(18).zip(a.chunks_exact(34)).take(n / QK) {
        let (Some(x), Some(y)) = (read_block::<BlockQ4_0>(cw), read_block::<BlockQ8_0>(ca)) else { break };
        let d = x.d.to_f32() * y.d.to_f32();
        let lanes = lane_sums_i8(&decode(&x.qs, |q, _| ((q & 0x0F) as i8 - 8, (q >> 4) as i8 - 8)), &y.qs);
        fma_lanes(d, lanes_f32(lanes), &mut acc);
    }
    hsum8(acc)
}

/// Reference Q4_1 · Q8_1, in llama.cpp's x86 order (see [`lane_sums`]): per block
/// `acc[l] = fma(dw·da, lane l, acc[l])` and `summs = fma(mw, sa, summs)`; then
/// `hsum8(acc) + summs`.
pub(crate) fn vec_dot_q4_1_q8_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    contract(n, QK, w, 20, a, 36);
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (cw, ca) in w.chunks_exact(20).zip(a.chunks_exact(36)).take(n / QK) {
        let (Some(x), Some(y)) = (read_block::<BlockQ4_1>(cw), read_block::<BlockQ8_1>(ca)) else { break };
        summs = crate::fused::fmaf(x.m.to_f32(), y.s.to_f32(), summs);
        let d = x.d.to_f32() * y.d.to_f32();
        let lanes = lane_sums_i8(&decode(&x.qs, |q, _| ((q & 0x0F) as i8, (q >> 4) as i8)), &y.qs);
        fma_lanes(d, lanes_f32(lanes), &mut acc);
    }
    hsum8(acc) + summs
}

/// The 8 lane sums llama.cpp's x86 kernels form for one block (`maddubs`+`madd` or
/// `dpbusd`): lane `l` = Σ over k in 4l..4l+4 of `x(k)·y[k]`, exact in i32.
#[cfg_attr(all(target_arch = "wasm32", target_feature = "simd128", not(test)), allow(dead_code))]
#[inline(always)]
pub(crate) fn lane_sums(x: impl Fn(usize) -> i32, y: &[i8; 32]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (l, s) in lanes.iter_mut().enumerate() {
        for k in 4 * l..4 * l + 4 {
            *s += x(k) * y[k] as i32;
        }
    }
    lanes
}

/// [`lane_sums`] of a block whose 32 weights are decoded to `i8` (every type's values
/// fit): wasm32 with simd128 forms them with `i32x4.dot_i16x8_s`, other targets by the
/// scalar loop; integer sums, so the same on every target.
#[inline(always)]
pub(crate) fn lane_sums_i8(x: &[i8; 32], y: &[i8; 32]) -> [i32; 8] {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    return super::wasm32::lane_sums_i8(x, y);
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    lane_sums(|k| x[k] as i32, y)
}

/// The 32 weights of a block from its 16 bytes: `f(qs[j], j)` gives elements `j` and
/// `j + 16` (the low and high nibble's values). A plain loop without a branch per element,
/// always inlined, so the compiler can vectorize it (as `core::array::from_fn` over a
/// closure it stayed one out-of-line call per weight on aarch64).
#[inline(always)]
pub(crate) fn decode(qs: &[u8; 16], f: impl Fn(u8, usize) -> (i8, i8)) -> [i8; 32] {
    let mut out = [0i8; 32];
    for j in 0..16 {
        let (lo, hi) = f(qs[j], j);
        out[j] = lo;
        out[j + 16] = hi;
    }
    out
}

/// Lane sums as f32 (`as f32`: exact below 2^24, rounded to nearest even above, as
/// the x86 kernels' `cvtepi32_ps`).
#[inline(always)]
pub(crate) fn lanes_f32(l: [i32; 8]) -> [f32; 8] {
    l.map(|s| s as f32)
}

/// `acc[l] = fma(d, s[l], acc[l])` for the 8 lanes, one rounding each. wasm32 (simd128)
/// has no fused multiply-add, so there it is computed exactly in f64 lanes
/// ([`fma_via_f64`]'s method, two lanes per `f64x2`); elsewhere [`crate::fused::fmaf`] (the
/// hardware instruction where the target has one).
#[inline(always)]
pub(crate) fn fma_lanes(d: f32, s: [f32; 8], acc: &mut [f32; 8]) {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    super::wasm32::fma_lanes(d, s, acc);
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    for (a, s) in acc.iter_mut().zip(s) {
        *a = crate::fused::fmaf(d, s, *a);
    }
}

/// `fma(x, y, z)` for f32, correctly rounded, from f64 operations only: `x·y` is exact in
/// f64 (24 + 24 bits); `r = x·y + z` in f64 with its exact error `e` (TwoSum); when `e`
/// is not zero, `r` is replaced by the exact sum rounded to odd (truncate toward zero,
/// set the last bit), which then rounds to f32 (29 bits narrower) exactly as one
/// rounding would. The scalar model of the wasm simd128 lanes (tested against
/// `libm::fmaf` natively); NaN and infinite results pass through unchanged.
#[cfg_attr(not(test), allow(dead_code))]
#[inline]
pub(crate) fn fma_via_f64(x: f32, y: f32, z: f32) -> f32 {
    let (p, a) = (x as f64 * y as f64, z as f64);
    let r = p + a;
    let bb = r - p;
    let e = (p - (r - bb)) + (a - bb);
    if e != 0.0 && r.is_finite() {
        let bits = r.to_bits();
        let toward_zero = if (e < 0.0) != (r < 0.0) { bits - 1 } else { bits };
        return f64::from_bits(toward_zero | 1) as f32;
    }
    r as f32
}

/// Horizontal sum of 8 lanes in the order of an AVX `hsum` (high half + low half, then
/// pairs): `((a4+a0) + (a6+a2)) + ((a5+a1) + (a7+a3))`.
#[inline]
pub(crate) fn hsum8(a: [f32; 8]) -> f32 {
    let r = [a[4] + a[0], a[5] + a[1], a[6] + a[2], a[7] + a[3]];
    // A deliberately wrong order, compiled in only by host-wasi's perturbed-kernel test
    // (which passes `--cfg keel_perturb_for_test` to its own guest build; no feature or
    // normal build can turn it on): the reference digest check must catch it.
    #[cfg(keel_perturb_for_test)]
    let r = [r[0], r[2], r[1], r[3]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// Reference Q5_0 · Q8_0 in llama.cpp's x86 order (`ggml_vec_dot_q5_0_q8_0`; llamafile's
/// `tinyBLAS_Q0_AVX`, which runs its batches, has the same per-output order): per block
/// `acc[l] = fma(dw·da, lane l, acc[l])`, then `hsum8(acc)` (see [`lane_sums`]).
pub(crate) fn vec_dot_q5_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    contract(n, QK, w, 22, a, 34);
    let mut acc = [0.0f32; 8];
    for (cw, ca) in w.chunks_exact(22).zip(a.chunks_exact(34)).take(n / QK) {
        let (Some(x), Some(y)) = (read_block::<BlockQ5_0>(cw), read_block::<BlockQ8_0>(ca)) else { break };
        let d = x.d.to_f32() * y.d.to_f32();
        let qh = qh_u32(x.qh);
        let lanes = lane_sums_i8(&decode(&x.qs, |q, j| {
            let (lo, hi) = q5_pair(q, qh, j);
            ((lo - 16) as i8, (hi - 16) as i8)
        }), &y.qs);
        fma_lanes(d, lanes_f32(lanes), &mut acc);
    }
    hsum8(acc)
}

/// Reference Q5_1 · Q8_1 in llama.cpp's x86 order (`ggml_vec_dot_q5_1_q8_1`, as Q4_1): per
/// block `acc[l] = fma(lane l, dw·da, acc[l])` and `summs = fma(mw, sa, summs)`; then
/// `hsum8(acc) + summs`.
pub(crate) fn vec_dot_q5_1_q8_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    contract(n, QK, w, 24, a, 36);
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (cw, ca) in w.chunks_exact(24).zip(a.chunks_exact(36)).take(n / QK) {
        let (Some(x), Some(y)) = (read_block::<BlockQ5_1>(cw), read_block::<BlockQ8_1>(ca)) else { break };
        summs = crate::fused::fmaf(x.m.to_f32(), y.s.to_f32(), summs);
        let d = x.d.to_f32() * y.d.to_f32();
        let qh = qh_u32(x.qh);
        let lanes = lane_sums_i8(&decode(&x.qs, |q, j| {
            let (lo, hi) = q5_pair(q, qh, j);
            (lo as i8, hi as i8)
        }), &y.qs);
        // (llama.cpp writes fma(lane, d, acc): the same single rounding.)
        fma_lanes(d, lanes_f32(lanes), &mut acc);
    }
    hsum8(acc) + summs
}

/// Reference Q8_0 · Q8_0, in llama.cpp's x86 order: per block
/// `acc[l] = fma(dw·da, lane l, acc[l])`, then `hsum8(acc)` (see [`lane_sums`]).
pub(crate) fn vec_dot_q8_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    contract(n, QK, w, 34, a, 34);
    let mut acc = [0.0f32; 8];
    for (cw, ca) in w.chunks_exact(34).zip(a.chunks_exact(34)).take(n / QK) {
        let (Some(x), Some(y)) = (read_block::<BlockQ8_0>(cw), read_block::<BlockQ8_0>(ca)) else { break };
        let d = x.d.to_f32() * y.d.to_f32();
        let lanes = lane_sums_i8(&x.qs, &y.qs);
        fma_lanes(d, lanes_f32(lanes), &mut acc);
    }
    hsum8(acc)
}

/// Σ over the block of `table[nibble] · a` for a 4-bit table type (exact).
#[inline(always)]
fn table_sumi(qs: &[u8; 16], a: &[i8; 32], table: &[i8; 16]) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        s += table[(qs[j] & 0xF) as usize] as i32 * a[j] as i32 + table[(qs[j] >> 4) as usize] as i32 * a[j + 16] as i32;
    }
    s
}

/// Reference IQ4_NL · Q8_0 in llama.cpp's repacked order: per block
/// `acc = fma(f32(sumi), dw·da, acc)`.
pub(crate) fn vec_dot_iq4_nl_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    contract(n, QK, w, 18, a, 34);
    let mut acc = 0.0f32;
    for (cw, ca) in w.chunks_exact(18).zip(a.chunks_exact(34)).take(n / QK) {
        let (Some(x), Some(y)) = (read_block::<BlockIq4Nl>(cw), read_block::<BlockQ8_0>(ca)) else { break };
        let sumi = table_sumi(&x.qs, &y.qs, &KVALUES_IQ4NL);
        acc = crate::fused::fmaf(sumi as f32, x.d.to_f32() * y.d.to_f32(), acc);
    }
    acc
}

/// Reference MXFP4 · Q8_0 in llama.cpp's repacked order: per block
/// `acc = fma(f32(sumi), e8m0_half(e)·da, acc)`.
pub(crate) fn vec_dot_mxfp4_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    contract(n, QK, w, 17, a, 34);
    let mut acc = 0.0f32;
    for (cw, ca) in w.chunks_exact(17).zip(a.chunks_exact(34)).take(n / QK) {
        let (Some(x), Some(y)) = (read_block::<BlockMxfp4>(cw), read_block::<BlockQ8_0>(ca)) else { break };
        let sumi = table_sumi(&x.qs, &y.qs, &KVALUES_MXFP4);
        acc = crate::fused::fmaf(sumi as f32, e8m0_to_f32_half(x.e) * y.d.to_f32(), acc);
    }
    acc
}

/// Reference F32 · F32.
pub(crate) fn vec_dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    contract(n, 1, w, 4, a, 4);
    let mut sumf = 0.0f32;
    for (x, y) in w.chunks_exact(4).zip(a.chunks_exact(4)).take(n) {
        sumf += f32::from_le_bytes([x[0], x[1], x[2], x[3]]) * f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
    }
    sumf
}

/// Reference F16 · F16 (each product of the exact f32 conversions, f32 accumulator).
pub(crate) fn vec_dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    contract(n, 1, w, 2, a, 2);
    let mut sumf = 0.0f32;
    for (x, y) in w.chunks_exact(2).zip(a.chunks_exact(2)).take(n) {
        sumf += f16_to_f32(u16::from_le_bytes([x[0], x[1]])) * f16_to_f32(u16::from_le_bytes([y[0], y[1]]));
    }
    sumf
}

/// Reference BF16 · BF16.
pub(crate) fn vec_dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    contract(n, 1, w, 2, a, 2);
    let mut sumf = 0.0f32;
    for (x, y) in w.chunks_exact(2).zip(a.chunks_exact(2)).take(n) {
        sumf += bf16_to_f32(u16::from_le_bytes([x[0], x[1]])) * bf16_to_f32(u16::from_le_bytes([y[0], y[1]]));
    }
    sumf
}

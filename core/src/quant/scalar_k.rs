//! The scalar reference for the K-quants: dequantization and `vec_dot` of Q2_K .. Q6_K
//! weights with Q8_K activations.
//!
//! Owns the arithmetic the AVX2 K-quant kernels (`x86/kdot.rs`) are checked against,
//! bit for bit. Dequantization uses llama.cpp's per-element formulas, unfused
//! (`(d·sc)·q - dmin·m`). Each dot reproduces, operation for operation, the kernel
//! llama.cpp 11434 runs for that type on an AVX2 CPU (found by reading
//! `ggml-cpu/arch/x86/{quants.c,repack.cpp}` and checked against the built library):
//!
//! ```text
//! Q4_K, Q2_K  "repack" order (llama.cpp repacks these weights into 8-row tiles, CPU_REPACK,
//!             and multiplies single tokens with ggml_gemv_q{4,2}_K_8x8_q8_K): per super-block the
//!             exact integers sumi = Σ_sub sc·Σ q·a and summ = Σ_sub m·bsum, then
//!             acc = fma(f32(sumi), dw·da, acc), accm = fma(f32(summ), dminw·da, accm);
//!             result acc - accm
//! Q3_K, Q6_K  ggml_vec_dot_q{3,6}_K_q8_K (no x86 repack): 8 lane accumulators,
//!             acc[l] = fma(dw·da, f32(lane l), acc[l]) per super-block, then hsum8;
//!             Q6_K's lanes take q unsigned (0..63) minus 32·(bsum·sc) per lane pair
//! Q5_K        ggml_vec_dot_q5_K_q8_K: as Q6_K's lanes for the scaled sums, plus a scalar
//!             summs = fma(-da·dminw, f32(Σ m·bsum), summs); result hsum8(acc) + summs
//! ```
//!
//! llama.cpp's repacked `gemm` (which it runs on the rows of a batch four at a time; the
//! remainder and single tokens go through `gemv`) has a finer float order for Q4_K (an
//! fma pair per 64 elements) and Q2_K (per 128); keel's one per-row dot cannot be both,
//! so [`vec_dot_q4_k_q8_k`] follows `gemv` and the `*_gemm` variants (offered through
//! `Kernels::dot_fn_in_batch`) follow `gemm`. IQ4_NL and MXFP4 have one order for both.
//! For batches of 8+ tokens over K-quant weights it does not repack, llama.cpp runs its
//! tiled matmul, reproduced by the `*_tiled` variants ([`vec_dot_k_tiled`]).
//!
//! A lane `l` (0..8) of llama.cpp's x86 K-quant dots holds, for each of the 8 groups g of
//! 32 elements, `scale(g, l) · Σ_{e<4} q[32g + 4l + e] · a[32g + 4l + e]` summed over g
//! ([`k_lanes`]); the integer parts are exact, so only the float operations above fix
//! the result. Notes on the choice: Q4_K's repack is used by llama.cpp whenever the
//! weight has a multiple of 8 rows (every real model); Q2_K's only when the CPU has
//! AVX-512 (as the machine that made keel's goldens does) — on AVX2-only CPUs llama.cpp
//! would use `ggml_vec_dot_q2_K_q8_K`'s lane order instead.
//!
//! Dot contract as in `scalar.rs` (n a multiple of 256, rows long enough; release
//! builds compute over the whole blocks that fit).

use super::blocks::{q3_k_scales, read_block, scale_min_k4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K};
use super::scalar::{contract, hsum8};
use crate::ggml_type::GgmlType;

/// Q2_K levels (0..=3) in element order.
#[inline]
pub(crate) fn q2_k_levels(b: &BlockQ2K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
        *v = ((b.qs[32 * h + l] >> (2 * s)) & 3) as i8;
    }
    q
}

/// Q3_K levels (-4..=3) in element order.
#[inline]
pub(crate) fn q3_k_levels(b: &BlockQ3K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = ((b.qs[32 * h + l] >> (2 * s)) & 3) as i8;
        let high = (b.hmask[l] >> (4 * h + s)) & 1;
        *v = low - if high == 1 { 0 } else { 4 };
    }
    q
}

/// Q4_K / Q5_K levels (0..=15 / 0..=31) in element order; `qh` adds the 5th bits.
#[inline]
pub(crate) fn q45_k_levels(qs: &[u8; 128], qh: Option<&[u8; 32]>) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        let (j, t, l) = (e / 64, (e % 64) / 32, e % 32);
        let nib = (qs[32 * j + l] >> (4 * t)) & 0xF;
        let hi = qh.map_or(0, |qh| ((qh[l] >> (e / 32)) & 1) << 4);
        *v = (nib | hi) as i8;
    }
    q
}

/// Q6_K levels as stored (0..=63, i.e. before the -32) in element order.
#[inline]
pub(crate) fn q6_k_levels(b: &BlockQ6K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        let (h, t, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = (b.ql[64 * h + 32 * (t & 1) + l] >> (4 * (t >> 1))) & 0xF;
        let high = (b.qh[32 * h + l] >> (2 * t)) & 3;
        *v = (low | (high << 4)) as i8;
    }
    q
}

/// The 8 scales of a Q4_K/Q5_K block and its 8 mins.
#[inline]
fn scales_mins_k4(packed: &[u8; 12]) -> ([i32; 8], [i32; 8]) {
    let (mut sc, mut m) = ([0i32; 8], [0i32; 8]);
    for j in 0..8 {
        let (s, mm) = scale_min_k4(j, packed);
        sc[j] = s as i32;
        m[j] = mm as i32;
    }
    (sc, m)
}

/// Dequantizes whole super-blocks of `src` into `dst`; `false` if `ty` is not a K-quant.
pub(crate) fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> bool {
    let size = ty.type_size();
    let blocks = src.chunks_exact(size).zip(dst.chunks_exact_mut(QK_K));
    match ty {
        GgmlType::Q2_K => {
            for (c, y) in blocks {
                let Some(b) = read_block::<BlockQ2K>(c) else { break };
                let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
                let q = q2_k_levels(&b);
                for (j, (ys, qs)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
                    let (dl, ml) = (d * (b.scales[j] & 0xF) as f32, dmin * (b.scales[j] >> 4) as f32);
                    for (yv, &qv) in ys.iter_mut().zip(qs) {
                        *yv = dl * qv as f32 - ml;
                    }
                }
            }
        }
        GgmlType::Q3_K => {
            for (c, y) in blocks {
                let Some(b) = read_block::<BlockQ3K>(c) else { break };
                let d = b.d.to_f32();
                let (q, sc) = (q3_k_levels(&b), q3_k_scales(&b.scales));
                for (j, (ys, qs)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
                    let dl = d * sc[j] as f32;
                    for (yv, &qv) in ys.iter_mut().zip(qs) {
                        *yv = dl * qv as f32;
                    }
                }
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            for (c, y) in blocks {
                let (d, dmin, packed, q) = if ty == GgmlType::Q4_K {
                    let Some(b) = read_block::<BlockQ4K>(c) else { break };
                    (b.d, b.dmin, b.scales, q45_k_levels(&b.qs, None))
                } else {
                    let Some(b) = read_block::<BlockQ5K>(c) else { break };
                    (b.d, b.dmin, b.scales, q45_k_levels(&b.qs, Some(&b.qh)))
                };
                let (d, dmin) = (d.to_f32(), dmin.to_f32());
                for (j, (ys, qs)) in y.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
                    let (sc, m) = scale_min_k4(j, &packed);
                    let (d1, m1) = (d * sc as f32, dmin * m as f32);
                    for (yv, &qv) in ys.iter_mut().zip(qs) {
                        *yv = d1 * qv as f32 - m1;
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            for (c, y) in blocks {
                let Some(b) = read_block::<BlockQ6K>(c) else { break };
                let d = b.d.to_f32();
                let q = q6_k_levels(&b);
                for (j, (ys, qs)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
                    for (yv, &qv) in ys.iter_mut().zip(qs) {
                        *yv = d * b.scales[j] as f32 * (qv as i32 - 32) as f32;
                    }
                }
            }
        }
        GgmlType::Q8_K => {
            for (c, y) in blocks {
                let Some(b) = read_block::<BlockQ8K>(c) else { break };
                for (yv, &q) in y.iter_mut().zip(&b.qs) {
                    *yv = b.d * q as f32;
                }
            }
        }
        _ => return false,
    }
    true
}

/// llama.cpp's x86 K-quant lane sums (see the module doc): lane l = Σ over groups g of
/// `scale(g, l) · Σ_{e<4} q[32g+4l+e] · a[32g+4l+e]`, exact in i32.
#[inline]
pub(crate) fn k_lanes(q: &[i8; QK_K], a: &[i8; QK_K], scale: impl Fn(usize, usize) -> i32) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for g in 0..8 {
        for (l, lane) in lanes.iter_mut().enumerate() {
            let base = 32 * g + 4 * l;
            let s: i32 = (base..base + 4).map(|e| q[e] as i32 * a[e] as i32).sum();
            *lane += scale(g, l) * s;
        }
    }
    lanes
}

/// The super-block pairs of a dot: weight block type `W` (of `wsize` bytes) with Q8_K.
#[inline]
fn blocks<'a, W: super::blocks::Block>(n: usize, w: &'a [u8], wsize: usize, a: &'a [u8]) -> impl Iterator<Item = (W, BlockQ8K)> + 'a {
    contract(n, QK_K, w, wsize, a, 292);
    w.chunks_exact(wsize).zip(a.chunks_exact(292)).take(n / QK_K).map_while(|(cw, ca)| Some((read_block::<W>(cw)?, read_block::<BlockQ8K>(ca)?)))
}

/// Reference Q2_K · Q8_K in llama.cpp's repacked `gemv` order (see the module doc).
pub(crate) fn vec_dot_q2_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    q2_k_dot::<1>(n, w, a)
}

/// Reference Q2_K · Q8_K in llama.cpp's repacked `gemm` order (an fma pair per 128).
pub(crate) fn vec_dot_q2_k_q8_k_gemm(n: usize, w: &[u8], a: &[u8]) -> f32 {
    q2_k_dot::<2>(n, w, a)
}

/// Q2_K in the repacked order with `STEPS` fma pairs per super-block (1: `gemv`, 2:
/// `gemm`), each over 16 / STEPS consecutive sub-blocks.
fn q2_k_dot<const STEPS: usize>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (mut acc, mut accm) = (0.0f32, 0.0f32);
    for (x, y) in blocks::<BlockQ2K>(n, w, 84, a) {
        let q = q2_k_levels(&x);
        let (dd, dm) = (x.d.to_f32() * y.d, x.dmin.to_f32() * y.d);
        let per = 16 / STEPS;
        for g in 0..STEPS {
            let (mut sumi, mut summ) = (0i32, 0i32);
            for j in per * g..per * (g + 1) {
                let s: i32 = (16 * j..16 * j + 16).map(|e| q[e] as i32 * y.qs[e] as i32).sum();
                sumi += (x.scales[j] & 0xF) as i32 * s;
                summ += (x.scales[j] >> 4) as i32 * y.bsums[j] as i32;
            }
            acc = crate::fused::fmaf(sumi as f32, dd, acc);
            accm = crate::fused::fmaf(summ as f32, dm, accm);
        }
    }
    acc - accm
}

/// Reference Q3_K · Q8_K in llama.cpp's x86 `vec_dot` lane order.
pub(crate) fn vec_dot_q3_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (x, y) in blocks::<BlockQ3K>(n, w, 110, a) {
        let sc = q3_k_scales(&x.scales);
        let lanes = k_lanes(&q3_k_levels(&x), &y.qs, |g, l| sc[2 * g + l / 4] as i32);
        let d = y.d * x.d.to_f32();
        super::scalar::fma_lanes(d, super::scalar::lanes_f32(lanes), &mut acc);
    }
    hsum8(acc)
}

/// Reference Q4_K · Q8_K in llama.cpp's repacked `gemv` order (see the module doc).
pub(crate) fn vec_dot_q4_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    q4_k_dot::<1>(n, w, a)
}

/// Reference Q4_K · Q8_K in llama.cpp's repacked `gemm` order (an fma pair per 64).
pub(crate) fn vec_dot_q4_k_q8_k_gemm(n: usize, w: &[u8], a: &[u8]) -> f32 {
    q4_k_dot::<4>(n, w, a)
}

/// Q4_K in the repacked order with `STEPS` fma pairs per super-block (1: `gemv`, 4:
/// `gemm`), each over 8 / STEPS consecutive sub-blocks of 32.
fn q4_k_dot<const STEPS: usize>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (mut acc, mut accm) = (0.0f32, 0.0f32);
    for (x, y) in blocks::<BlockQ4K>(n, w, 144, a) {
        let (sc, m) = scales_mins_k4(&x.scales);
        let q = q45_k_levels(&x.qs, None);
        let (dd, dm) = (x.d.to_f32() * y.d, x.dmin.to_f32() * y.d);
        let per = 8 / STEPS;
        for g in 0..STEPS {
            let (mut sumi, mut summ) = (0i32, 0i32);
            for j in per * g..per * (g + 1) {
                let s: i32 = (32 * j..32 * j + 32).map(|e| q[e] as i32 * y.qs[e] as i32).sum();
                sumi += sc[j] * s;
                summ += m[j] * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
            }
            acc = crate::fused::fmaf(sumi as f32, dd, acc);
            accm = crate::fused::fmaf(summ as f32, dm, accm);
        }
    }
    acc - accm
}

/// Reference Q5_K · Q8_K in llama.cpp's x86 `vec_dot` order (lanes plus a scalar
/// `summs` chain).
pub(crate) fn vec_dot_q5_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (x, y) in blocks::<BlockQ5K>(n, w, 176, a) {
        let (sc, m) = scales_mins_k4(&x.scales);
        let summ: i32 = (0..8).map(|j| m[j] * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32)).sum();
        summs = crate::fused::fmaf(-y.d * x.dmin.to_f32(), summ as f32, summs);
        let lanes = k_lanes(&q45_k_levels(&x.qs, Some(&x.qh)), &y.qs, |g, _| sc[g]);
        let d = y.d * x.d.to_f32();
        super::scalar::fma_lanes(d, super::scalar::lanes_f32(lanes), &mut acc);
    }
    hsum8(acc) + summs
}

/// Reference Q6_K · Q8_K in llama.cpp's x86 `vec_dot` lane order.
pub(crate) fn vec_dot_q6_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (x, y) in blocks::<BlockQ6K>(n, w, 210, a) {
        let sc = x.scales;
        let mut lanes = k_lanes(&q6_k_levels(&x), &y.qs, |g, l| sc[2 * g + l / 4] as i32);
        for (l, lane) in lanes.iter_mut().enumerate() {
            let bs = y.bsums[2 * l] as i32 * sc[2 * l] as i32 + y.bsums[2 * l + 1] as i32 * sc[2 * l + 1] as i32;
            *lane -= bs << 5;
        }
        let d = y.d * x.d.to_f32();
        super::scalar::fma_lanes(d, super::scalar::lanes_f32(lanes), &mut acc);
    }
    hsum8(acc)
}

/// One super-block of llama.cpp's tiled K-quant matmul (`ggml-cpu/tiled/`, the VNNI
/// microkernel its AVX-512 build runs for batches of 8 or more tokens): the exact
/// integers `s1 = Σ_sub sc·Σ q·a` (q signed) and `s2 = Σ_sub m·bsum` (0 without mins),
/// and the block's `dw`, `dminw`.
fn tiled_parts(ty: GgmlType, cw: &[u8], y: &BlockQ8K) -> Option<(i32, i32, f32, f32)> {
    let dot = |q: &[i8; QK_K], size: usize, sc: &dyn Fn(usize) -> i32| -> i32 {
        let mut s1 = 0i32;
        for (j, (qs, as_)) in q.chunks_exact(size).zip(y.qs.chunks_exact(size)).enumerate() {
            s1 += sc(j) * qs.iter().zip(as_).map(|(&x, &v)| x as i32 * v as i32).sum::<i32>();
        }
        s1
    };
    let bsum32 = |j: usize| y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32;
    Some(match ty {
        GgmlType::Q2_K => {
            let x = read_block::<BlockQ2K>(cw)?;
            let s1 = dot(&q2_k_levels(&x), 16, &|j| (x.scales[j] & 0xF) as i32);
            let s2 = (0..16).map(|j| (x.scales[j] >> 4) as i32 * y.bsums[j] as i32).sum();
            (s1, s2, x.d.to_f32(), x.dmin.to_f32())
        }
        GgmlType::Q3_K => {
            let x = read_block::<BlockQ3K>(cw)?;
            let sc = q3_k_scales(&x.scales);
            (dot(&q3_k_levels(&x), 16, &|j| sc[j] as i32), 0, x.d.to_f32(), 0.0)
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (d, dmin, packed, q) = if ty == GgmlType::Q4_K {
                let x = read_block::<BlockQ4K>(cw)?;
                (x.d, x.dmin, x.scales, q45_k_levels(&x.qs, None))
            } else {
                let x = read_block::<BlockQ5K>(cw)?;
                (x.d, x.dmin, x.scales, q45_k_levels(&x.qs, Some(&x.qh)))
            };
            let (sc, m) = scales_mins_k4(&packed);
            let s2 = (0..8).map(|j| m[j] * bsum32(j)).sum();
            (dot(&q, 32, &|j| sc[j]), s2, d.to_f32(), dmin.to_f32())
        }
        GgmlType::Q6_K => {
            let x = read_block::<BlockQ6K>(cw)?;
            let mut q = q6_k_levels(&x);
            q.iter_mut().for_each(|v| *v -= 32);
            (dot(&q, 16, &|j| x.scales[j] as i32), 0, x.d.to_f32(), 0.0)
        }
        _ => return None,
    })
}

/// Reference K-quant · Q8_K in the order of llama.cpp's tiled matmul (VNNI microkernel,
/// the AVX-512 build's kernel for batches of >= 8 tokens over weights it does not
/// repack): per super-block `r = f32(s1)·dw`, `r = fma(-dminw, f32(s2), r)` (types with
/// mins), then `acc = fma(r, da, acc)`.
pub(crate) fn vec_dot_k_tiled(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    let size = ty.type_size();
    contract(n, QK_K, w, size, a, 292);
    let has_min = matches!(ty, GgmlType::Q2_K | GgmlType::Q4_K | GgmlType::Q5_K);
    let mut acc = 0.0f32;
    for (cw, ca) in w.chunks_exact(size).zip(a.chunks_exact(292)).take(n / QK_K) {
        let Some(y) = read_block::<BlockQ8K>(ca) else { break };
        let Some((s1, s2, dw, dmin)) = tiled_parts(ty, cw, &y) else { break };
        let mut r = s1 as f32 * dw;
        if has_min {
            r = crate::fused::fmaf(-dmin, s2 as f32, r);
        }
        // `buf + r·da` in the source; GCC contracts it into one fma (checked in the binary).
        acc = crate::fused::fmaf(r, y.d, acc);
    }
    acc
}

macro_rules! tiled_fns {
    ($($name:ident: $ty:ident),*) => {$(
        /// Reference tiled-order dot (see [`vec_dot_k_tiled`]).
        pub(crate) fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            vec_dot_k_tiled(GgmlType::$ty, n, w, a)
        }
    )*};
}
tiled_fns!(vec_dot_q2_k_q8_k_tiled: Q2_K, vec_dot_q3_k_q8_k_tiled: Q3_K, vec_dot_q4_k_q8_k_tiled: Q4_K, vec_dot_q5_k_q8_k_tiled: Q5_K, vec_dot_q6_k_q8_k_tiled: Q6_K);

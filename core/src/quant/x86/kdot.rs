//! AVX2 `vec_dot`s of the K-quants (Q2_K .. Q6_K weights, Q8_K activations).
//!
//! Each follows the float order of its scalar reference in `scalar_k.rs` exactly (which
//! in turn is llama.cpp's), so fast and reference dots give the same bits:
//!
//! - Q3_K, Q5_K, Q6_K: llama.cpp's `ggml_vec_dot_q*_K_q8_K` AVX2 lane layout —
//!   `maddubs` of 32 weights by 32 activations (exact: |pair| <= 2·63·127), `madd` with
//!   the sub-block scales (16-element sub-blocks: low 128 bits take scale 2g, high 128
//!   bits scale 2g+1), summed over the super-block into 8 i32 lanes, then one
//!   `fma(dw·da, f32(lanes), acc)` per super-block and a final horizontal sum.
//! - Q2_K, Q4_K: llama.cpp's repacked order — the same integer lanes summed to one exact
//!   i32 per super-block (and one for the mins), then two scalar fmas per super-block
//!   (`gemv`), or per 128 / 64 elements in the `GEMM` instances (`gemm`).
//! - every K-quant in the `TILED` instances: the lanes summed to exact `s1` (and `s2` for
//!   the mins), then llama.cpp's tiled-matmul steps `r = f32(s1)·dw`,
//!   `r = fma(-dminw, f32(s2), r)`, `acc = fma(r, da, acc)`.
//!
//! The `MODE` parameter picks the order: [`NATIVE`] (`dot_fn`), [`GEMM`], [`TILED`].
//!
//! Block layouts are in `blocks.rs`; Q8_K is `d:f32 @0 | qs[256] @4 | bsums[16] @260`.
//! Every function requires AVX2, FMA and F16C, and pointers to `nb` whole in-bounds
//! blocks (the wrappers in `mod.rs` guarantee both).

use core::arch::x86_64::*;

use super::{hsum_epi32, hsum_ps, rd32};

/// `MODE` of the kernels: llama.cpp's `vec_dot` lanes (Q3_K, Q5_K, Q6_K) or repacked
/// `gemv` (Q2_K, Q4_K).
pub(super) const NATIVE: u8 = 0;
/// `MODE`: llama.cpp's repacked `gemm` (Q2_K, Q4_K; 4-token groups of a batch).
pub(super) const GEMM: u8 = 1;
/// `MODE`: llama.cpp's tiled K-quant matmul (batches of 8+ tokens, weights not repacked).
pub(super) const TILED: u8 = 2;

/// One super-block of the tiled order: `r = f32(s1)·dw`, `r = fma(-dminw, f32(s2), r)`
/// if `s2` is given, `acc = fma(r, da, acc)` (lane 0 of `acc`; `w` = [dw, dminw, ..]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiled_step(acc: __m128, s1: i32, s2: Option<i32>, w: __m128, da: f32) -> __m128 {
    // SAFETY: value-only intrinsics; AVX2, FMA available (this fn's target features).
    unsafe {
        let mut r = _mm_mul_ss(_mm_cvtsi32_ss(w, s1), w);
        if let Some(s2) = s2 {
            r = _mm_fnmadd_ss(_mm_movehdup_ps(w), _mm_cvtsi32_ss(w, s2), r);
        }
        _mm_fmadd_ss(r, _mm_set_ss(da), acc)
    }
}

/// The f16 pair at `w` (d, dmin) as `[dw, dminw, 0, 0]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_pair(w: *const u8) -> __m128 {
    // SAFETY: 4 readable bytes at w (caller).
    unsafe { _mm_cvtph_ps(_mm_cvtsi32_si128(rd32(w))) }
}

/// Q8_K: quants at +4, bsums at +260.
const A_QS: usize = 4;
const A_BSUMS: usize = 260;

#[inline]
unsafe fn rdf32(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees 4 readable bytes at p.
    unsafe { core::ptr::read_unaligned(p.cast::<f32>()) }
}

/// 32 bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ld(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes at p.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// `[dw·da, dminw·da, ..]` from the f16 pair at `w` (d, dmin) and the f32 `da`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn d_dmin(w: *const u8, da: f32) -> __m128 {
    // SAFETY: 4 readable bytes at w (caller); value-only intrinsics otherwise.
    unsafe { _mm_mul_ps(f16_pair(w), _mm_set1_ps(da)) }
}

/// The scale vector of a 32-element group covering two 16-element sub-blocks: i16
/// lanes 0..8 (elements 0..16) take scale `k` of `sc8`, lanes 8..16 take `k + 1` (`sc8`:
/// 8 i16 scales in each 128-bit half; k even, 0..8).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pair_scales(sc8: __m256i, k: i32) -> __m256i {
    // SAFETY: value-only intrinsics; AVX2 available (this fn's target features).
    unsafe {
        let lo = _mm_set1_epi16((((2 * k + 1) << 8) | (2 * k)) as i16);
        let hi = _mm_set1_epi16((((2 * k + 3) << 8) | (2 * k + 2)) as i16);
        _mm256_shuffle_epi8(sc8, _mm256_set_m128i(hi, lo))
    }
}

/// `scales` (16 i16: sub-blocks 0..8 in the low half, 8..16 in the high half) with both
/// halves holding sub-blocks 8h..8h+8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half_scales(scales: __m256i, h: usize) -> __m256i {
    // SAFETY: value-only intrinsics; AVX2 available (this fn's target features).
    unsafe {
        if h == 0 {
            _mm256_permute2x128_si256::<0x00>(scales, scales)
        } else {
            _mm256_permute2x128_si256::<0x11>(scales, scales)
        }
    }
}

/// The 8 i32 lanes of one super-block of a type with 16-element sub-blocks: `level(h,
/// t)` gives the 32 unsigned levels of group 4h+t, `scales` the 16 sub-block scales as
/// i16, and `neg(h, t)`, if given, 32 bytes subtracted (as `maddubs(neg, a)`).
macro_rules! lanes16 {
    ($a:expr, $scales:expr, |$h:ident, $t:ident| $level:expr, neg = |$h2:ident, $t2:ident| $neg:expr) => {{
        let mut sumi = _mm256_setzero_si256();
        for $h in 0..2usize {
            let sc8 = half_scales($scales, $h);
            for $t in 0..4usize {
                let y = ld($a.add(A_QS + 128 * $h + 32 * $t));
                let mut p = _mm256_maddubs_epi16($level, y);
                if let Some(n) = { let ($h2, $t2) = ($h, $t); $neg } {
                    p = _mm256_sub_epi16(p, _mm256_maddubs_epi16(n, y));
                }
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pair_scales(sc8, 2 * $t as i32), p));
            }
        }
        sumi
    }};
}

// Each body: `nb` super-blocks at `w` (weights) and `a` (Q8_K activations), all in
// bounds (the wrapper's SAFETY argument); AVX2, FMA and F16C available.

/// Q2_K · Q8_K: repacked `gemv` order (`NATIVE`), `gemm` order (`GEMM`: an fma pair
/// per 128 elements) or tiled order (`TILED`); see the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q2_k_q8_k<const MODE: u8>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layout scales@0 qs@16 d@80 dmin@82.
    unsafe {
        let m3 = _mm256_set1_epi8(3);
        let (mut acc, mut accm) = (_mm_setzero_ps(), _mm_setzero_ps());
        for i in 0..nb {
            let (wb, ab) = (w.add(84 * i), a.add(292 * i));
            let dd = d_dmin(wb.add(80), rdf32(ab));
            let dm = _mm_movehdup_ps(dd);
            let raw = _mm_loadu_si128(wb.cast());
            let sc = _mm256_cvtepu8_epi16(_mm_and_si128(raw, _mm_set1_epi8(0xF)));
            let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(raw), _mm_set1_epi8(0xF)));
            // Lanes 0..4 hold the min sums of sub-blocks 0..8, lanes 4..8 of 8..16.
            let pm = _mm256_madd_epi16(mins, ld(ab.add(A_BSUMS)));
            let level = |h: usize, t: usize| {
                let q = ld(wb.add(16 + 32 * h));
                let q = match t { 0 => q, 1 => _mm256_srli_epi16::<2>(q), 2 => _mm256_srli_epi16::<4>(q), _ => _mm256_srli_epi16::<6>(q) };
                _mm256_and_si256(q, m3)
            };
            if MODE != GEMM {
                let sumi = lanes16!(ab, sc, |h, t| level(h, t), neg = |_h, _t| None::<__m256i>);
                if MODE == TILED {
                    acc = tiled_step(acc, hsum_epi32(sumi), Some(hsum_epi32(pm)), f16_pair(wb.add(80)), rdf32(ab));
                    continue;
                }
                acc = _mm_fmadd_ss(_mm_cvtsi32_ss(acc, hsum_epi32(sumi)), dd, acc);
                accm = _mm_fmadd_ss(_mm_cvtsi32_ss(accm, hsum_epi32(pm)), dm, accm);
            } else {
                for h in 0..2 {
                    let sumi = half_lanes16(ab, sc, h, |t| level(h, t));
                    let pmh = if h == 0 { _mm256_castsi256_si128(pm) } else { _mm256_extracti128_si256::<1>(pm) };
                    acc = _mm_fmadd_ss(_mm_cvtsi32_ss(acc, hsum_epi32(sumi)), dd, acc);
                    accm = _mm_fmadd_ss(_mm_cvtsi32_ss(accm, hsum_epi32_128(pmh)), dm, accm);
                }
            }
        }
        _mm_cvtss_f32(_mm_sub_ss(acc, accm))
    }
}

/// The lanes of half `h` (elements 128h..128h+128) of a 16-element-sub-block type.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half_lanes16(a: *const u8, scales: __m256i, h: usize, level: impl Fn(usize) -> __m256i) -> __m256i {
    // SAFETY: a Q8_K block at a (caller); value-only intrinsics otherwise.
    unsafe {
        let sc8 = half_scales(scales, h);
        let mut sumi = _mm256_setzero_si256();
        for t in 0..4usize {
            let p = _mm256_maddubs_epi16(level(t), ld(a.add(A_QS + 128 * h + 32 * t)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pair_scales(sc8, 2 * t as i32), p));
        }
        sumi
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_epi32_128(p: __m128i) -> i32 {
    // SAFETY: value-only intrinsics; AVX2 available (this fn's target features).
    unsafe {
        let p = _mm_add_epi32(p, _mm_unpackhi_epi64(p, p));
        _mm_cvtsi128_si32(_mm_add_epi32(p, _mm_shuffle_epi32::<0b01>(p)))
    }
}

/// Q3_K · Q8_K, llama.cpp's x86 lane order (`NATIVE`) or tiled order (`TILED`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q3_k_q8_k<const MODE: u8>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layout hmask@0 qs@32 scales@96 d@108.
    unsafe {
        let m3 = _mm256_set1_epi8(3);
        let four = _mm256_set1_epi8(4);
        let mut acc = _mm256_setzero_ps();
        let mut tacc = _mm_setzero_ps();
        for i in 0..nb {
            let (wb, ab) = (w.add(110 * i), a.add(292 * i));
            let d = rdf32(ab) * _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(rd16u(wb.add(108)) as i32)));
            let scales = _mm256_cvtepi8_epi16(q3_k_scales(wb.add(96)));
            let hbits = ld(wb);
            let sumi = lanes16!(ab, scales,
                |h, t| {
                    let q = ld(wb.add(32 + 32 * h));
                    let q = match t { 0 => q, 1 => _mm256_srli_epi16::<2>(q), 2 => _mm256_srli_epi16::<4>(q), _ => _mm256_srli_epi16::<6>(q) };
                    _mm256_and_si256(q, m3)
                },
                neg = |h, t| {
                    let bit = _mm256_set1_epi8(1 << (4 * h + t));
                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), bit);
                    Some(_mm256_andnot_si256(set, four))
                });
            if MODE == TILED {
                tacc = tiled_step(tacc, hsum_epi32(sumi), None, _mm_cvtph_ps(_mm_cvtsi32_si128(rd16u(wb.add(108)) as i32)), rdf32(ab));
                continue;
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        if MODE == TILED {
            return _mm_cvtss_f32(tacc);
        }
        hsum_ps(acc)
    }
}

/// The 16 signed scales of a Q3_K block (12 packed bytes at `p`, see `blocks.rs`) as
/// bytes: low nibbles from bytes 0..8, top 2 bits from bytes 8..12, minus 32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k_scales(p: *const u8) -> __m128i {
    // SAFETY: 12 readable bytes at p (caller); value-only intrinsics otherwise.
    unsafe {
        let (a0, a1, a2) = (rd32(p) as u32, rd32(p.add(4)) as u32, rd32(p.add(8)) as u32);
        const LOW4: u32 = 0x0f0f_0f0f;
        const LOW2: u32 = 0x0303_0303;
        let s0 = (a0 & LOW4) | ((a2 & LOW2) << 4);
        let s1 = (a1 & LOW4) | (((a2 >> 2) & LOW2) << 4);
        let s2 = ((a0 >> 4) & LOW4) | (((a2 >> 4) & LOW2) << 4);
        let s3 = ((a1 >> 4) & LOW4) | (((a2 >> 6) & LOW2) << 4);
        _mm_sub_epi8(_mm_setr_epi32(s0 as i32, s1 as i32, s2 as i32, s3 as i32), _mm_set1_epi8(32))
    }
}

#[inline]
unsafe fn rd16u(p: *const u8) -> u16 {
    // SAFETY: the caller guarantees 2 readable bytes at p.
    unsafe { core::ptr::read_unaligned(p.cast::<u16>()) }
}

/// The 8 scales and 8 mins of a Q4_K/Q5_K block (12 packed bytes at `p`), as 16 i16:
/// scales in lanes 0..8, mins in 8..16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales_mins(p: *const u8) -> __m256i {
    // SAFETY: 12 readable bytes at p (caller); value-only intrinsics otherwise.
    unsafe {
        let (u0, u1, u2) = (rd32(p) as u32, rd32(p.add(4)) as u32, rd32(p.add(8)) as u32);
        const LOW6: u32 = 0x3f3f_3f3f;
        const LOW4: u32 = 0x0f0f_0f0f;
        const LOW2: u32 = 0x0303_0303;
        let sc_lo = u0 & LOW6;
        let sc_hi = (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4);
        let m_lo = u1 & LOW6;
        let m_hi = ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4);
        _mm256_cvtepu8_epi16(_mm_setr_epi32(sc_lo as i32, sc_hi as i32, m_lo as i32, m_hi as i32))
    }
}

/// The 8 i32 lanes of one Q4_K/Q5_K super-block: group j (64 elements, sub-blocks 2j
/// and 2j+1) from `levels(j)` = (low sub-block, high sub-block) as unsigned bytes.
macro_rules! lanes32 {
    ($a:expr, $scales:expr, |$j:ident| $levels:expr) => {{
        let mut sumi = _mm256_setzero_si256();
        for $j in 0..4usize {
            sumi = _mm256_add_epi32(sumi, lanes32_group($a, $scales, $j, $levels));
        }
        sumi
    }};
}

/// Lane j (0..4) = m_{2j}·(bsums[4j] + bsums[4j+1]) + m_{2j+1}·(bsums[4j+2] + bsums[4j+3]):
/// the min sums of each 64 elements of a Q4_K/Q5_K block (`sm` from [`scales_mins`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mins_lanes(sm: __m256i, a: *const u8) -> __m128i {
    // SAFETY: a Q8_K block at a (caller); value-only intrinsics otherwise.
    unsafe {
        let b = ld(a.add(A_BSUMS));
        let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256::<1>(b));
        _mm_madd_epi16(_mm256_extracti128_si256::<1>(sm), q8s)
    }
}

/// Q4_K · Q8_K: repacked `gemv` order (`NATIVE`), `gemm` order (`GEMM`: an fma pair
/// per 64 elements) or tiled order (`TILED`); see the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k_q8_k<const MODE: u8>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layout d@0 dmin@2 scales@4 qs@16.
    unsafe {
        let m4 = _mm256_set1_epi8(0xF);
        let (mut acc, mut accm) = (_mm_setzero_ps(), _mm_setzero_ps());
        for i in 0..nb {
            let (wb, ab) = (w.add(144 * i), a.add(292 * i));
            let dd = d_dmin(wb, rdf32(ab));
            let dm = _mm_movehdup_ps(dd);
            let sm = scales_mins(wb.add(4));
            let pm = mins_lanes(sm, ab);
            let levels = |j: usize| {
                let q = ld(wb.add(16 + 32 * j));
                (_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4))
            };
            if MODE != GEMM {
                let sumi = lanes32!(ab, sm, |j| levels(j));
                if MODE == TILED {
                    acc = tiled_step(acc, hsum_epi32(sumi), Some(hsum_epi32_128(pm)), f16_pair(wb), rdf32(ab));
                    continue;
                }
                acc = _mm_fmadd_ss(_mm_cvtsi32_ss(acc, hsum_epi32(sumi)), dd, acc);
                accm = _mm_fmadd_ss(_mm_cvtsi32_ss(accm, hsum_epi32_128(pm)), dm, accm);
            } else {
                let mut ms = [0i32; 4];
                _mm_storeu_si128(ms.as_mut_ptr().cast(), pm);
                for (j, &m) in ms.iter().enumerate() {
                    let sumj = lanes32_group(ab, sm, j, levels(j));
                    acc = _mm_fmadd_ss(_mm_cvtsi32_ss(acc, hsum_epi32(sumj)), dd, acc);
                    accm = _mm_fmadd_ss(_mm_cvtsi32_ss(accm, m), dm, accm);
                }
            }
        }
        _mm_cvtss_f32(_mm_sub_ss(acc, accm))
    }
}

/// The lanes of 64-element group `j` of a Q4_K/Q5_K block (one step of [`lanes32`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes32_group(a: *const u8, scales: __m256i, j: usize, (lo, hi): (__m256i, __m256i)) -> __m256i {
    // SAFETY: a Q8_K block at a (caller); value-only intrinsics otherwise.
    unsafe {
        let sc = _mm256_permute2x128_si256::<0x00>(scales, scales);
        let k = 2 * j as i32;
        let slo = _mm256_shuffle_epi8(sc, _mm256_set1_epi16((((2 * k + 1) << 8) | (2 * k)) as i16));
        let shi = _mm256_shuffle_epi8(sc, _mm256_set1_epi16((((2 * k + 3) << 8) | (2 * k + 2)) as i16));
        let plo = _mm256_madd_epi16(slo, _mm256_maddubs_epi16(lo, ld(a.add(A_QS + 64 * j))));
        let phi = _mm256_madd_epi16(shi, _mm256_maddubs_epi16(hi, ld(a.add(A_QS + 64 * j + 32))));
        _mm256_add_epi32(plo, phi)
    }
}

/// Q5_K · Q8_K, llama.cpp's x86 lane order plus its scalar `summs` chain (`NATIVE`), or
/// the tiled order (`TILED`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_k_q8_k<const MODE: u8>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layout d@0 dmin@2 scales@4 qh@16 qs@48.
    unsafe {
        let m4 = _mm256_set1_epi8(0xF);
        let b16 = _mm256_set1_epi8(0x10);
        let mut acc = _mm256_setzero_ps();
        let mut summs = _mm_setzero_ps();
        for i in 0..nb {
            let (wb, ab) = (w.add(176 * i), a.add(292 * i));
            let da = rdf32(ab);
            let f = _mm_cvtph_ps(_mm_cvtsi32_si128(rd32(wb))); // [dw, dminw, 0, 0]
            let d = da * _mm_cvtss_f32(f);
            let dmin = -da * _mm_cvtss_f32(_mm_movehdup_ps(f));
            let sm = scales_mins(wb.add(4));
            let summ = hsum_epi32_128(mins_lanes(sm, ab));
            if MODE != TILED {
                summs = _mm_fmadd_ss(_mm_set_ss(dmin), _mm_cvtsi32_ss(summs, summ), summs);
            }
            let qh = ld(wb.add(16));
            let fifth = |bit: i32| {
                let m = _mm256_set1_epi8(1 << bit);
                _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m), m), b16)
            };
            let sumi = lanes32!(ab, sm, |j| {
                let q = ld(wb.add(48 + 32 * j));
                let lo = _mm256_or_si256(_mm256_and_si256(q, m4), fifth(2 * j as i32));
                let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q), m4), fifth(2 * j as i32 + 1));
                (lo, hi)
            });
            if MODE == TILED {
                summs = tiled_step(summs, hsum_epi32(sumi), Some(summ), f, da);
                continue;
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        if MODE == TILED {
            return _mm_cvtss_f32(summs);
        }
        hsum_ps(acc) + _mm_cvtss_f32(summs)
    }
}

/// The 32 unsigned 6-bit levels of group 4h + t of the Q6_K block at `wb` (`ql` nibbles
/// and two `qh` bits each).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_levels(wb: *const u8, h: usize, t: usize) -> __m256i {
    // SAFETY: a whole Q6_K block at wb (caller); value-only intrinsics otherwise.
    unsafe {
        let (m4, m3) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(3));
        let ql = ld(wb.add(64 * h + 32 * (t & 1)));
        let qh = ld(wb.add(128 + 32 * h));
        let (low, high) = match t {
            0 => (ql, qh),
            1 => (ql, _mm256_srli_epi16::<2>(qh)),
            2 => (_mm256_srli_epi16::<4>(ql), _mm256_srli_epi16::<4>(qh)),
            _ => (_mm256_srli_epi16::<4>(ql), _mm256_srli_epi16::<6>(qh)),
        };
        _mm256_or_si256(_mm256_and_si256(low, m4), _mm256_slli_epi16::<4>(_mm256_and_si256(high, m3)))
    }
}

/// Q6_K · Q8_K, llama.cpp's x86 lane order (levels unsigned, the -32 through bsums;
/// `NATIVE`) or the tiled order (`TILED`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k_q8_k<const MODE: u8>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layout ql@0 qh@128 scales@192 d@208.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let mut tacc = _mm_setzero_ps();
        for i in 0..nb {
            let (wb, ab) = (w.add(210 * i), a.add(292 * i));
            let d = rdf32(ab) * _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(rd16u(wb.add(208)) as i32)));
            let scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(192).cast()));
            let sub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(ld(ab.add(A_BSUMS)), scales));
            let sumi = lanes16!(ab, scales, |h, t| q6_k_levels(wb, h, t), neg = |_h, _t| None::<__m256i>);
            if MODE == TILED {
                let dw = _mm_cvtph_ps(_mm_cvtsi32_si128(rd16u(wb.add(208)) as i32));
                tacc = tiled_step(tacc, hsum_epi32(_mm256_sub_epi32(sumi, sub)), None, dw, rdf32(ab));
                continue;
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi, sub)), acc);
        }
        if MODE == TILED {
            return _mm_cvtss_f32(tacc);
        }
        hsum_ps(acc)
    }
}

/// Tokens of the one-row K-quant tiles ([`q4_k_q8_k_tile`], [`q6_k_q8_k_tile`]).
pub(crate) const KTILE_TOKENS: usize = 4;

/// [`q4_k_q8_k`]`::<MODE>` for one weight row and [`KTILE_TOKENS`] activation rows
/// (`arow` bytes apart): per super-block the row's decode (levels, scales, mins) is done
/// once and shared by the tokens, and each token's integer sums (exact, summed in any
/// order), products and fmas are the single dot's in its order (`NATIVE`: one fma pair
/// per super-block; `GEMM`: one per 64-element group; `TILED`: [`tiled_step`]), so each
/// output has its bits. The super-block goes group by group: each 64-element group's two
/// level and two scale vectors are formed in registers and taken by the four tokens at
/// once (formed for all four groups first, the sixteen vectors did not fit the registers
/// beside the tokens' sums, and spilled: 113-115 -> 150-154 GFLOP/s on the AMD EPYC Zen 5,
/// `quant::bench::bench_matmul`). The tokens' horizontal sums are taken together
/// ([`hsum4_epi32`]: three `phaddd` for the four tokens where each took five operations of
/// its own) and their float steps in the lanes of one vector (lane `t`: token `t`; the
/// same operations on the same values as the single dot's scalar ones). The output of
/// token t goes to `out[t·ostride]`; `wrow` is unused (one row). (The AVX2 set's tile
/// for `NATIVE` is [`q4_k_q8_k_lanes8`]; this one serves llama.cpp's batch orders.)
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k_q8_k_tile<const MODE: u8>(nb: usize, w: *const u8, wrow: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    const _: () = assert!(KTILE_TOKENS == 4, "q4_k_q8_k_tile: the tokens' sums are reduced four at a time");
    // SAFETY: nb super-blocks of the row at w and of each token's row at a + t·arow,
    // and out[t·ostride] for t < KTILE_TOKENS, are in bounds (the wrapper checks);
    // layout d@0 dmin@2 scales@4 qs@16.
    unsafe {
        let _ = wrow;
        let m4 = _mm256_set1_epi8(0xF);
        // Lane t: token t's accumulators.
        let (mut acc, mut accm) = (_mm_setzero_ps(), _mm_setzero_ps());
        for i in 0..nb {
            let wb = w.add(144 * i);
            let pair = f16_pair(wb);
            let (dw, dminw) = (_mm_broadcastss_ps(pair), _mm_broadcastss_ps(_mm_movehdup_ps(pair)));
            let sm = scales_mins(wb.add(4));
            let sc = _mm256_permute2x128_si256::<0x00>(sm, sm);
            let ab: [*const u8; 4] = core::array::from_fn(|t| a.add(t * arow + 292 * i));
            let da = _mm_setr_ps(rdf32(ab[0]), rdf32(ab[1]), rdf32(ab[2]), rdf32(ab[3]));
            // dw·da and dminw·da per token (as `d_dmin`'s products).
            let (dd, dm) = (_mm_mul_ps(dw, da), _mm_mul_ps(dminw, da));
            let pm: [__m128i; 4] = core::array::from_fn(|t| mins_lanes(sm, ab[t]));
            // Lane t of mins[j]: token t's min sum of group j (`GEMM`).
            let mins = transpose4_epi32(pm);
            // Group by group (its levels and scales formed once, in registers, for the
            // four tokens): each token's lanes of the group (`lanes32_group`'s).
            let mut sumi = [_mm256_setzero_si256(); 4];
            for (j, m) in mins.iter().enumerate() {
                let q = ld(wb.add(16 + 32 * j));
                let (lo, hi) = (_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4));
                let k = 2 * j as i32;
                let slo = _mm256_shuffle_epi8(sc, _mm256_set1_epi16((((2 * k + 1) << 8) | (2 * k)) as i16));
                let shi = _mm256_shuffle_epi8(sc, _mm256_set1_epi16((((2 * k + 3) << 8) | (2 * k + 2)) as i16));
                let g: [__m256i; 4] = core::array::from_fn(|t| {
                    let plo = _mm256_madd_epi16(slo, _mm256_maddubs_epi16(lo, ld(ab[t].add(A_QS + 64 * j))));
                    let phi = _mm256_madd_epi16(shi, _mm256_maddubs_epi16(hi, ld(ab[t].add(A_QS + 64 * j + 32))));
                    _mm256_add_epi32(plo, phi)
                });
                if MODE == GEMM {
                    acc = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum4_epi32(g)), dd, acc);
                    accm = _mm_fmadd_ps(_mm_cvtepi32_ps(*m), dm, accm);
                } else {
                    for (s, g) in sumi.iter_mut().zip(g) {
                        *s = _mm256_add_epi32(*s, g);
                    }
                }
            }
            if MODE == GEMM {
                continue;
            }
            let sums = _mm_cvtepi32_ps(hsum4_epi32(sumi));
            let mins = _mm_cvtepi32_ps(hsum4_epi32_128(pm));
            if MODE == TILED {
                // `tiled_step` lane by lane: r = f32(s1)·dw, r = fma(-dminw, f32(s2), r),
                // acc = fma(r, da, acc).
                let r = _mm_fnmadd_ps(dminw, mins, _mm_mul_ps(sums, dw));
                acc = _mm_fmadd_ps(r, da, acc);
                continue;
            }
            acc = _mm_fmadd_ps(sums, dd, acc);
            accm = _mm_fmadd_ps(mins, dm, accm);
        }
        // (TILED leaves accm at zero: its mins are inside each step.)
        let res = if MODE == TILED { acc } else { _mm_sub_ps(acc, accm) };
        let mut v = [0f32; 4];
        _mm_storeu_ps(v.as_mut_ptr(), res);
        for (t, v) in v.iter().enumerate() {
            *out.add(t * ostride) = *v;
        }
    }
}

/// Weight rows of the AVX2 K-quant rows-in-lanes tiles ([`k_lanes8_tile`]): one per lane
/// of a vector.
pub(crate) const KLANES8_ROWS: usize = 8;
/// Tokens of the AVX2 K-quant rows-in-lanes tiles (each super-block's weights transposed
/// once for all of them), and of their narrower tiles for a chunk's tokens after its
/// whole tiles.
pub(crate) const KLANES8_TOKENS: usize = 32;
pub(crate) const KLANES8_REST_TOKENS: usize = 8;
/// Tokens the AVX2 K-quant rows-in-lanes tiles take together (each staged level vector
/// loaded once for all of them; `quant::bench::bench_matmul`, one thread, on the faster
/// Xeon VM with the AVX2 set: Q4_K 185 GFLOP/s one at a time, 212 two, 217 four, where the
/// 1-row tile it replaces took 102; Q6_K 134 two, 137 four or eight, where the 1-row tile
/// took 91).
const KLANES8_TOGETHER: usize = 4;
const _: () = assert!(KLANES8_TOKENS % KLANES8_TOGETHER == 0 && KLANES8_REST_TOKENS % KLANES8_TOGETHER == 0);
/// Super-blocks per range of the AVX2 K-quant rows-in-lanes tiles' staged weights (Q4_K
/// 2.4 KiB each, Q6_K 2.8 KiB; the accumulators go through a stash between ranges).
const KLANES8_STAGE: usize = 4;

/// The order of work of the AVX2 K-quant rows-in-lanes tiles: [`KLANES8_ROWS`] weight
/// rows in the lanes of a vector × `$tokens` tokens. Per group of rows the super-blocks go
/// in ranges of [`KLANES8_STAGE`]: each super-block `$i` of the group at `$wg` is staged as
/// `$block` (its rows transposed once for every token), then the tokens go
/// [`KLANES8_TOGETHER`] at a time, `$step` adding super-block `$blk` of the tokens at `$ab`
/// into their accumulators `$acc` (of type `$acc_ty`, from `$zero`), kept in a stash
/// between ranges; after the last range `$out_of` gives each token's 8 outputs.
/// Safety: `nb` super-blocks (Q8_K: 292 bytes each in the activations) of each of `$rows` (a
/// multiple of 8) rows and `$tokens` activation rows readable, `out[t·ostride + r]`
/// writable for r < rows, t < tokens; every staged entry is written before it is read.
macro_rules! k_lanes8_tile {
    ($nb:expr, $w:expr, $wrow:expr, $rows:expr, $a:expr, $arow:expr, $out:expr, $ostride:expr, $tokens:expr, $blk_ty:ty, $acc_ty:ty, $zero:expr,
     |$wg:ident, $g:ident, $i:ident| $block:expr, |$blk:ident, $ab:ident, $acc:ident| $step:block, |$fin:ident| $out_of:expr) => {{
        const SB: usize = KLANES8_STAGE;
        const U: usize = KLANES8_TOGETHER;
        let (nb, w, wrow, rows, a, arow, out, ostride): (usize, *const u8, usize, usize, *const u8, usize, *mut f32, usize) = ($nb, $w, $wrow, $rows, $a, $arow, $out, $ostride);
        let mut wst = core::mem::MaybeUninit::<[$blk_ty; SB]>::uninit();
        let mut stash = core::mem::MaybeUninit::<[$acc_ty; $tokens]>::uninit();
        let (wp, sp) = (wst.as_mut_ptr().cast::<$blk_ty>(), stash.as_mut_ptr().cast::<$acc_ty>());
        for g in (0..rows).step_by(KLANES8_ROWS) {
            let ($wg, $g) = (w.add(g * wrow), g);
            let mut b0 = 0;
            while b0 < nb {
                let kb = (nb - b0).min(SB);
                let last = b0 + kb == nb;
                // (Entries 0..kb of wst are written here before any read below.)
                for ib in 0..kb {
                    let $i = b0 + ib;
                    wp.add(ib).write($block);
                }
                for t0 in (0..$tokens).step_by(U) {
                    // (The stash entries of these tokens were written by the previous range.)
                    let mut $acc: [$acc_ty; U] = core::array::from_fn(|u| if b0 == 0 { $zero } else { *sp.add(t0 + u) });
                    for ib in 0..kb {
                        let $blk = &*wp.add(ib);
                        let $ab: [*const u8; U] = core::array::from_fn(|u| a.add((t0 + u) * arow + 292 * (b0 + ib)));
                        $step
                    }
                    for (u, $fin) in $acc.iter().enumerate() {
                        if last {
                            _mm256_storeu_ps(out.add((t0 + u) * ostride + g), $out_of);
                        } else {
                            sp.add(t0 + u).write(*$fin);
                        }
                    }
                }
                b0 += kb;
            }
        }
    }};
}

/// The two i16 of each dword of `x` (a row's scales `2k` and `2k + 1` in lane r), each
/// twice in a dword of its own: (lane r: `(x_lo, x_lo)`, lane r: `(x_hi, x_hi)`), the
/// `madd` operands that scale both i16 sums of a lane alike.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn twin_scales(x: __m256i) -> (__m256i, __m256i) {
    // SAFETY: value-only intrinsics; AVX2 available (this fn's target features).
    unsafe {
        let (lo, hi) = (_mm256_and_si256(x, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32::<16>(x));
        (_mm256_or_si256(lo, _mm256_slli_epi32::<16>(lo)), _mm256_or_si256(hi, _mm256_slli_epi32::<16>(hi)))
    }
}

/// One Q4_K super-block of [`KLANES8_ROWS`] rows as [`q4_k_q8_k_lanes8`] takes it:
/// `lv[s][j]` holds, in lane r, the levels (unsigned bytes) of row r's elements
/// `32s + 4j..32s + 4j + 4`; `sc[s]` row r's sub-block scale `s` twice (two i16), `mn[k]`
/// its mins `2k` and `2k + 1` (two i16), `dw` and `dmin` the rows' super-block scales.
#[derive(Clone, Copy)]
struct Q4kLanes8 {
    lv: [[__m256i; 8]; 8],
    sc: [__m256i; 8],
    mn: [__m256i; 4],
    dw: __m256,
    dmin: __m256,
}

/// Super-block `i` of the 8 rows at `w` (`wrow` bytes apart) as [`Q4kLanes8`]: each
/// 64-element group's 32 bytes of the 8 rows transposed by dwords (lane r: row r's bytes
/// `4j..4j + 4`, whose low nibbles are elements `64g + 4j..`, high nibbles
/// `64g + 32 + 4j..`), and the rows' [`scales_mins`] transposed likewise (dword k < 4: scales
/// `2k, 2k + 1`; k ≥ 4: mins `2(k - 4), 2(k - 4) + 1`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_lanes8_block(w: *const u8, wrow: usize, i: usize) -> Q4kLanes8 {
    // SAFETY: the caller guarantees super-block i (144 bytes) of each of 8 rows readable.
    unsafe {
        use super::qtile::{f16x8, transpose_8x8};
        let p = w.add(144 * i);
        let m4 = _mm256_set1_epi8(0xF);
        let mut lv = [[_mm256_setzero_si256(); 8]; 8];
        for g in 0..4 {
            let x = transpose_8x8(core::array::from_fn(|r| ld(p.add(r * wrow + 16 + 32 * g))));
            for j in 0..8 {
                lv[2 * g][j] = _mm256_and_si256(x[j], m4);
                lv[2 * g + 1][j] = _mm256_and_si256(_mm256_srli_epi16::<4>(x[j]), m4);
            }
        }
        let sm = transpose_8x8(core::array::from_fn(|r| scales_mins(p.add(r * wrow + 4))));
        let mut sc = [_mm256_setzero_si256(); 8];
        for k in 0..4 {
            (sc[2 * k], sc[2 * k + 1]) = twin_scales(sm[k]);
        }
        Q4kLanes8 { lv, sc, mn: [sm[4], sm[5], sm[6], sm[7]], dw: f16x8(p, wrow), dmin: f16x8(p.add(2), wrow) }
    }
}

/// Half `h` (rows `8h..8h + 8`) of the Q4_K (group, super-block) at `p` in the rows16
/// layout (`quant::rows16`: its chunks already hold the rows' dwords in lanes) as
/// [`Q4kLanes8`], the same vectors as [`q4_k_lanes8_block`] by loads and byte shuffles:
/// chunk `3 + 8g + j` is the rows' `qs` dword `8g + j` (group `g`'s bytes `4j..4j + 4`),
/// chunks 0..3 their packed scales and mins (unpacked lane by lane as `scales_mins`), each
/// scale or pair of mins put in its lane's i16 halves by one `vpshufb`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_lanes8_block_rows16(p: *const u8, h: usize) -> Q4kLanes8 {
    // SAFETY: the caller guarantees the (group, super-block) (2304 bytes) readable; h < 2.
    unsafe {
        let ld = |c: usize| _mm256_loadu_si256(p.add(64 + 64 * c + 32 * h).cast());
        let m4 = _mm256_set1_epi8(0xF);
        let lv: [[__m256i; 8]; 8] = core::array::from_fn(|s| {
            core::array::from_fn(|j| {
                let q = ld(3 + 8 * (s / 2) + j);
                if s % 2 == 0 { _mm256_and_si256(q, m4) } else { _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4) }
            })
        });
        let (sc, mn) = super::rows16::q4_k_scales_mins_lanes(ld(0), ld(1), ld(2));
        let pick = |a: usize, b: usize| super::rows16::byte_pair_pattern(a as i8, b as i8);
        let sc: [__m256i; 8] = core::array::from_fn(|s| _mm256_shuffle_epi8(sc[s / 4], pick(s % 4, s % 4)));
        let mn: [__m256i; 4] = core::array::from_fn(|k| _mm256_shuffle_epi8(mn[k / 2], pick(2 * (k % 2), 2 * (k % 2) + 1)));
        let f = |o: usize| _mm256_cvtph_ps(_mm_loadu_si128(p.add(o + 16 * h).cast()));
        Q4kLanes8 { lv, sc, mn, dw: f(0), dmin: f(32) }
    }
}

/// Q4_K · Q8_K in the repacked `gemv` order ([`q4_k_q8_k`]`::<NATIVE>`), AVX2,
/// [`KLANES8_ROWS`] rows in the lanes of a vector × `T` tokens. Per super-block the
/// 8 rows' levels, scales and mins are transposed once ([`q4_k_lanes8_block`]) and kept for
/// every token; per token and 32-element sub-block `s`, the eight `maddubs` of the levels
/// by the token's broadcast dwords are added as i16 (each pair at most 2·15·127 in
/// magnitude, eight pairs at most 30480: exact), `madd` by the sub-block's scale gives
/// each row's exact i32, and the super-block's `s1` is their sum, the single dot's
/// `hsum(sumi)` (integer addition is exact in any order); `s2` the rows' mins by the
/// token's pair sums of `bsums` (`mins_lanes`'s integers). Then per lane the single dot's
/// float steps on the same values: `acc = fma(f32(s1), dw·da, acc)`,
/// `accm = fma(f32(s2), dmin·da, accm)`, and `acc - accm` at the end. So every output has
/// the single dot's bits. The order of work is [`k_lanes8_tile`]'s.
///
/// # Safety
/// AVX2, FMA and F16C available; `nb` super-blocks of each of `rows` (a multiple of 8)
/// rows at `w + r·wrow` and of each of `T` activation rows at `a + t·arow` readable;
/// `out[t·ostride + r]` writable for r < rows, t < T.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k_q8_k_lanes8<const T: usize, const R16: bool>(nb: usize, w: *const u8, wrow: usize, rows: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: see above; layouts d@0 dmin@2 scales@4 qs@16 and d@0 qs@4 bsums@260.
    unsafe {
        let bcast = |p: *const u8| _mm256_set1_epi32(core::ptr::read_unaligned(p.cast::<i32>()));
        k_lanes8_tile!(nb, w, wrow, rows, a, arow, out, ostride, T, Q4kLanes8, (__m256, __m256), (_mm256_setzero_ps(), _mm256_setzero_ps()),
            |wg, g, i| if R16 { q4_k_lanes8_block_rows16(w.add(g / 16 * 16 * wrow + 2304 * i), g / 8 % 2) } else { q4_k_lanes8_block(wg, wrow, i) },
            |blk, ab, accs| {
                let mut s1 = [_mm256_setzero_si256(); KLANES8_TOGETHER];
                for s in 0..8 {
                    let mut p: [__m256i; KLANES8_TOGETHER] = core::array::from_fn(|u| _mm256_maddubs_epi16(blk.lv[s][0], bcast(ab[u].add(A_QS + 32 * s))));
                    for j in 1..8 {
                        let l = blk.lv[s][j];
                        for (p, ab) in p.iter_mut().zip(ab) {
                            *p = _mm256_add_epi16(*p, _mm256_maddubs_epi16(l, bcast(ab.add(A_QS + 32 * s + 4 * j))));
                        }
                    }
                    for (s1, p) in s1.iter_mut().zip(p) {
                        *s1 = _mm256_add_epi32(*s1, _mm256_madd_epi16(p, blk.sc[s]));
                    }
                }
                for ((acc, accm), (s1, ab)) in accs.iter_mut().zip(s1.into_iter().zip(ab)) {
                    // The token's bsums in pairs (sub-block k's sum in i16 lane k).
                    let b = ld(ab.add(A_BSUMS));
                    let bs = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256::<1>(b));
                    let m = |k: usize, v: __m128i| _mm256_madd_epi16(blk.mn[k], _mm256_broadcastd_epi32(v));
                    let s2 = _mm256_add_epi32(
                        _mm256_add_epi32(m(0, bs), m(1, _mm_shuffle_epi32::<0x55>(bs))),
                        _mm256_add_epi32(m(2, _mm_shuffle_epi32::<0xAA>(bs)), m(3, _mm_shuffle_epi32::<0xFF>(bs))),
                    );
                    let da = _mm256_set1_ps(rdf32(ab));
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_mul_ps(blk.dw, da), *acc);
                    *accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s2), _mm256_mul_ps(blk.dmin, da), *accm);
                }
            },
            |acc| _mm256_sub_ps(acc.0, acc.1))
    }
}

/// The sums of the eight i32 lanes of each of four vectors, in lanes 0..4 (the single
/// dot's sums: i32 addition is associative, so the order does not matter).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum4_epi32(s: [__m256i; 4]) -> __m128i {
    // SAFETY: value-only intrinsics; AVX2 available (this fn's target features).
    unsafe {
        // Per 128-bit half: [s0 pairs, s1 pairs], [s2 pairs, s3 pairs], then each vector's
        // half sum in lane t; the two halves added.
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
        _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
    }
}

/// [`hsum4_epi32`] for four 128-bit vectors of four lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum4_epi32_128(p: [__m128i; 4]) -> __m128i {
    // SAFETY: value-only intrinsics; AVX2 available (this fn's target features).
    unsafe { _mm_hadd_epi32(_mm_hadd_epi32(p[0], p[1]), _mm_hadd_epi32(p[2], p[3])) }
}

/// Four vectors of four i32 lanes transposed: lane t of vector j is lane j of `p[t]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transpose4_epi32(p: [__m128i; 4]) -> [__m128i; 4] {
    // SAFETY: value-only intrinsics; AVX2 available (this fn's target features).
    unsafe {
        let (t0, t1) = (_mm_unpacklo_epi32(p[0], p[1]), _mm_unpackhi_epi32(p[0], p[1]));
        let (t2, t3) = (_mm_unpacklo_epi32(p[2], p[3]), _mm_unpackhi_epi32(p[2], p[3]));
        [_mm_unpacklo_epi64(t0, t2), _mm_unpackhi_epi64(t0, t2), _mm_unpacklo_epi64(t1, t3), _mm_unpackhi_epi64(t1, t3)]
    }
}

/// [`q6_k_q8_k`]`::<MODE>` (`NATIVE` or `TILED`) for one weight row and [`KTILE_TOKENS`]
/// activation rows, as [`q4_k_q8_k_tile`]: the row's levels and scale vectors are formed
/// once per super-block, each token's integers, float steps and final sum are the single
/// dot's.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k_q8_k_tile<const MODE: u8>(nb: usize, w: *const u8, wrow: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: as q4_k_q8_k_tile; layout ql@0 qh@128 scales@192 d@208.
    unsafe {
        let _ = wrow;
        let mut acc = [_mm256_setzero_ps(); KTILE_TOKENS];
        let mut tacc = [_mm_setzero_ps(); KTILE_TOKENS];
        for i in 0..nb {
            let wb = w.add(210 * i);
            let dwv = _mm_cvtph_ps(_mm_cvtsi32_si128(rd16u(wb.add(208)) as i32));
            let dw = _mm_cvtss_f32(dwv);
            let scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(192).cast()));
            // Group 4h + t: its levels and its scale pair (as `lanes16`).
            let lv: [__m256i; 8] = core::array::from_fn(|g| q6_k_levels(wb, g / 4, g % 4));
            let sc: [__m256i; 8] = core::array::from_fn(|g| pair_scales(half_scales(scales, g / 4), 2 * (g % 4) as i32));
            for (t, acc) in acc.iter_mut().enumerate() {
                let ab = a.add(t * arow + 292 * i);
                let d = rdf32(ab) * dw;
                let sub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(ld(ab.add(A_BSUMS)), scales));
                let mut sumi = _mm256_setzero_si256();
                for g in 0..8 {
                    let p = _mm256_maddubs_epi16(lv[g], ld(ab.add(A_QS + 32 * g)));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(sc[g], p));
                }
                if MODE == TILED {
                    tacc[t] = tiled_step(tacc[t], hsum_epi32(_mm256_sub_epi32(sumi, sub)), None, dwv, rdf32(ab));
                    continue;
                }
                *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi, sub)), *acc);
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            *out.add(t * ostride) = if MODE == TILED { _mm_cvtss_f32(tacc[t]) } else { hsum_ps(*acc) };
        }
    }
}

/// One Q6_K super-block of [`KLANES8_ROWS`] rows as [`q6_k_q8_k_lanes8`] takes it:
/// `lv[g][k]` holds, in lane r, the unsigned levels ([`q6_k_levels`]) of row r's elements
/// `32g + 4k..32g + 4k + 4`; `sc[s]` row r's sub-block scale `s` twice (two i16), `sp[k]`
/// its scales `2k` and `2k + 1` (two i16), `dw` the rows' super-block scales.
#[derive(Clone, Copy)]
struct Q6kLanes8 {
    lv: [[__m256i; 8]; 8],
    sc: [__m256i; 16],
    sp: [__m256i; 8],
    dw: __m256,
}

/// Super-block `i` of the 8 rows at `w` (`wrow` bytes apart) as [`Q6kLanes8`]: each
/// 32-element group's levels of the 8 rows transposed by dwords, and the rows' 16 scales
/// (as i16) likewise.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_lanes8_block(w: *const u8, wrow: usize, i: usize) -> Q6kLanes8 {
    // SAFETY: the caller guarantees super-block i (210 bytes) of each of 8 rows readable.
    unsafe {
        use super::qtile::{f16x8, transpose_8x8};
        let p = w.add(210 * i);
        let lv: [[__m256i; 8]; 8] = core::array::from_fn(|g| transpose_8x8(core::array::from_fn(|r| q6_k_levels(p.add(r * wrow), g / 4, g % 4))));
        let sp = transpose_8x8(core::array::from_fn(|r| _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(r * wrow + 192).cast()))));
        let mut sc = [_mm256_setzero_si256(); 16];
        for k in 0..8 {
            (sc[2 * k], sc[2 * k + 1]) = twin_scales(sp[k]);
        }
        Q6kLanes8 { lv, sc, sp, dw: f16x8(p.add(208), wrow) }
    }
}

/// Q6_K · Q8_K in llama.cpp's x86 lane order ([`q6_k_q8_k`]`::<NATIVE>`), AVX2,
/// [`KLANES8_ROWS`] rows in the lanes of a vector × `T` tokens. The single dot keeps
/// 8 f32 lanes per (row, token), lane k taking per super-block
/// `fma(da·dw, f32(sumi_k - sub_k), acc_k)` with `sumi_k` the exact integer over the
/// super-block's elements `32g + 4k..32g + 4k + 4` (g < 8), each group's four products
/// times its sub-block's scale, and `sub_k = 32·(bsums[2k]·sc[2k] + bsums[2k+1]·sc[2k+1])`;
/// then `hsum_ps` of the 8. Here register k of a token holds lane k of 8 rows: per
/// super-block the rows' levels and scales are transposed once ([`q6_k_lanes8_block`]) and
/// kept for every token; per token, k and g one `maddubs` of the levels by the token's
/// broadcast dword (a pair at most 2·63·127: exact) and one `madd` by the sub-block's
/// scale give every row's exact integer, summed in i32 (any order gives the same integer);
/// `sub_k` from the rows' scale pair and the token's bsum pair; then the same product and
/// fma, and at the end the 8 registers added as `hsum_ps` adds lanes
/// (`((0+4)+(2+6)) + ((1+5)+(3+7))`, `rows16::lane_tree`). So every output has the single
/// dot's bits. The order of work is [`k_lanes8_tile`]'s.
///
/// # Safety
/// AVX2, FMA and F16C available; `nb` super-blocks of each of `rows` (a multiple of 8)
/// rows at `w + r·wrow` and of each of `T` activation rows at `a + t·arow` readable;
/// `out[t·ostride + r]` writable for r < rows, t < T.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k_q8_k_lanes8<const T: usize>(nb: usize, w: *const u8, wrow: usize, rows: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: see above; layouts ql@0 qh@128 scales@192 d@208 and d@0 qs@4 bsums@260.
    unsafe {
        let bcast = |p: *const u8| _mm256_set1_epi32(core::ptr::read_unaligned(p.cast::<i32>()));
        k_lanes8_tile!(nb, w, wrow, rows, a, arow, out, ostride, T, Q6kLanes8, [__m256; 8], [_mm256_setzero_ps(); 8],
            |wg, _g, i| q6_k_lanes8_block(wg, wrow, i),
            |blk, ab, accs| {
                let d: [__m256; KLANES8_TOGETHER] = core::array::from_fn(|u| _mm256_mul_ps(_mm256_set1_ps(rdf32(ab[u])), blk.dw));
                for k in 0..8 {
                    let mut s = [_mm256_setzero_si256(); KLANES8_TOGETHER];
                    for g in 0..8 {
                        let (l, sc) = (blk.lv[g][k], blk.sc[2 * g + k / 4]);
                        for (s, ab) in s.iter_mut().zip(ab) {
                            *s = _mm256_add_epi32(*s, _mm256_madd_epi16(_mm256_maddubs_epi16(l, bcast(ab.add(A_QS + 32 * g + 4 * k))), sc));
                        }
                    }
                    for (u, acc) in accs.iter_mut().enumerate() {
                        let sub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(blk.sp[k], bcast(ab[u].add(A_BSUMS + 4 * k))));
                        acc[k] = _mm256_fmadd_ps(d[u], _mm256_cvtepi32_ps(_mm256_sub_epi32(s[u], sub)), acc[k]);
                    }
                }
            },
            |acc| super::rows16::lane_tree(acc))
    }
}

/// Tokens of the AVX-512 VNNI Q6_K tile in the native order ([`q6_k_q8_k_tile_vnni`]).
pub(crate) const Q6_K_NATIVE_TOKENS: usize = 16;

/// [`q6_k_q8_k`]`::<NATIVE>` for one weight row and [`Q6_K_NATIVE_TOKENS`] activation
/// rows, AVX-512 BW/VNNI on 512-bit vectors: two 32-element groups per vector. Per
/// super-block the row's unsigned levels ([`q6_k_levels`]) and scale pairs
/// ([`pair_scales`]) are formed once for the tokens; per token and group the same
/// `maddubs` products as the single dot (u6·i8 pairs, no i16 saturation: |2·63·128| <
/// 2^15), and `vpdpwssd` adds `scale·(p_2l + p_2l+1)` into lane l as `madd` and the add
/// do; the two groups' halves are added at the end (exact integers: any order gives the
/// single dot's 8 lanes of `sumi`). Then the dot's `- 32·Σ bsum·scale` lanes (the same
/// integers, with 32·scale formed first), `d = da·dw` and the fma per lane in
/// super-block order, and its `hsum_ps`: each output has its bits.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q6_k_q8_k_tile_vnni(nb: usize, w: *const u8, wrow: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: nb super-blocks of the row at w and of each token's row at a + t·arow,
    // and out[t·ostride] for t < Q6_K_NATIVE_TOKENS, are in bounds (the wrapper checks);
    // layout ql@0 qh@128 scales@192 d@208; AVX-512 F/BW/VL/VNNI available (only handed
    // out after cpu_has_avx512_vnni()).
    unsafe {
        let _ = wrow;
        const T: usize = Q6_K_NATIVE_TOKENS;
        let join = |lo: __m256i, hi: __m256i| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        let mut acc = [_mm256_setzero_ps(); T];
        for i in 0..nb {
            let wb = w.add(210 * i);
            let dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(rd16u(wb.add(208)) as i32)));
            let scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(192).cast()));
            // 32·scale as i16 (|32·scale| <= 4096), so that `madd` with the bsums gives
            // the dot's `32·Σ bsum·scale` lanes directly (|2·2048·4096| < 2^31).
            let scales32 = _mm256_slli_epi16::<5>(scales);
            // Vector k: groups 2k and 2k + 1 (group g = 4h + t, as `lanes16`).
            let lv: [__m512i; 4] = core::array::from_fn(|k| join(q6_k_levels(wb, k / 2, 2 * (k % 2)), q6_k_levels(wb, k / 2, 2 * (k % 2) + 1)));
            let sc: [__m512i; 4] = core::array::from_fn(|k| {
                let sc8 = half_scales(scales, k / 2);
                join(pair_scales(sc8, 4 * (k % 2) as i32), pair_scales(sc8, 4 * (k % 2) as i32 + 2))
            });
            for (t, acc) in acc.iter_mut().enumerate() {
                let ab = a.add(t * arow + 292 * i);
                let d = rdf32(ab) * dw;
                let sub = _mm256_madd_epi16(ld(ab.add(A_BSUMS)), scales32);
                let mut s = _mm512_setzero_si512();
                for k in 0..4 {
                    let y = _mm512_loadu_si512(ab.add(A_QS + 64 * k).cast());
                    s = _mm512_dpwssd_epi32(s, sc[k], _mm512_maddubs_epi16(lv[k], y));
                }
                let sumi = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s));
                *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi, sub)), *acc);
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            *out.add(t * ostride) = hsum_ps(*acc);
        }
    }
}

/// Weight rows of the AVX-512 VNNI Q4_K tile: one per lane of a vector.
pub(crate) const Q4_K_TILE_ROWS: usize = 8;
/// Tokens of the AVX-512 VNNI Q4_K tile.
pub(crate) const Q4_K_TILE_TOKENS: usize = 8;

/// [`q4_k_q8_k`]`::<NATIVE>` for [`Q4_K_TILE_ROWS`] rows in the lanes of a vector ×
/// [`Q4_K_TILE_TOKENS`] tokens, AVX-512 VNNI on 256-bit vectors. Per super-block and
/// 64-element group j, the 8 rows' 32 `qs` bytes are transposed so that vector m holds,
/// in lane r, dword m of row r (low nibbles: elements 4m.. of sub-block 2j, high
/// nibbles: of sub-block 2j + 1); per token, `vpdpbusd` with the activation's matching
/// 4 bytes broadcast gives every row's exact sub-block sums, multiplied by the rows'
/// scales (`vpmulld`) into `sumi`; the mins part is `Σ m·bsum` by `madd` of the rows'
/// (m_2j, m_2j+1) pairs with the token's pair sums of `bsums`. Integers are exact (any
/// order gives the single dot's `sumi` and mins sum); the float steps per lane are the
/// single dot's: `dd = [dw, dminw]·da` (one product each), `acc = fma(f32(sumi), dw·da,
/// acc)`, `accm = fma(f32(summ), dminw·da, accm)`, result `acc - accm`. With `MODE` =
/// `GEMM` (llama.cpp's repacked `gemm` order) the same two fmas are taken per 64-element
/// group j, with that group's sums, in group order.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q4_k_q8_k_tile_vnni<const MODE: u8>(nb: usize, w: *const u8, wrow: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: nb super-blocks of each of the 8 rows at w + r·wrow and of each token's row
    // at a + t·arow, and out[t·ostride + r] (ostride >= 8), are in bounds (the wrapper
    // checks); layout d@0 dmin@2 scales@4 qs@16; AVX-512 F/BW/VL/VNNI available (only
    // handed out after cpu_has_avx512_vnni()).
    unsafe {
        const R: usize = Q4_K_TILE_ROWS;
        const T: usize = Q4_K_TILE_TOKENS;
        let (m4, lo8, zero) = (_mm256_set1_epi8(0xF), _mm256_set1_epi32(0xFF), _mm256_setzero_si256());
        let mut acc = [_mm256_setzero_ps(); T];
        let mut accm = [_mm256_setzero_ps(); T];
        for i in 0..nb {
            let wb = |r: usize| w.add(r * wrow + 144 * i);
            // Scales and mins of the 8 rows as in `scales_mins`: words [sc0..3, sc4..7,
            // m0..3, m4..7] per row, gathered per word into vectors (lane r = row r).
            let mut words = [[0u32; R]; 4];
            for r in 0..R {
                let p = wb(r).add(4);
                let (u0, u1, u2) = (rd32(p) as u32, rd32(p.add(4)) as u32, rd32(p.add(8)) as u32);
                const LOW6: u32 = 0x3f3f_3f3f;
                const LOW4: u32 = 0x0f0f_0f0f;
                const LOW2: u32 = 0x0303_0303;
                words[0][r] = u0 & LOW6;
                words[1][r] = (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4);
                words[2][r] = u1 & LOW6;
                words[3][r] = ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4);
            }
            let wv: [__m256i; 4] = core::array::from_fn(|k| _mm256_loadu_si256(words[k].as_ptr().cast()));
            let byte = |v: __m256i, b: usize| match b {
                0 => _mm256_and_si256(v, lo8),
                1 => _mm256_and_si256(_mm256_srli_epi32::<8>(v), lo8),
                2 => _mm256_and_si256(_mm256_srli_epi32::<16>(v), lo8),
                _ => _mm256_srli_epi32::<24>(v),
            };
            // sc[s]: lane r = scale of sub-block s; mp[j]: lane r = m_2j | m_2j+1 << 16.
            let sc: [__m256i; 8] = core::array::from_fn(|s| byte(wv[s / 4], s % 4));
            let mp: [__m256i; 4] = core::array::from_fn(|j| {
                let v = wv[2 + j / 2];
                let (b0, b1) = (2 * (j % 2), 2 * (j % 2) + 1);
                _mm256_or_si256(byte(v, b0), _mm256_slli_epi32::<16>(byte(v, b1)))
            });
            let dw = f16_rows(w, wrow, 144 * i);
            let dmw = f16_rows(w, wrow, 144 * i + 2);
            // The token's sub-block sums of bsums as i16 pairs (as `mins_lanes`).
            let q8s = |t: usize| {
                let bs = ld(a.add(t * arow + 292 * i + A_BSUMS));
                let mut q8s = [0i32; 4];
                _mm_storeu_si128(q8s.as_mut_ptr().cast(), _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256::<1>(bs)));
                q8s
            };
            let da = |t: usize| _mm256_set1_ps(rdf32(a.add(t * arow + 292 * i)));
            // `gemm` order: each token's bsum pairs and products `[dw·da, dminw·da]`, once
            // per super-block for its four groups.
            let gemm_q8s: [[i32; 4]; T] = if MODE == GEMM { core::array::from_fn(q8s) } else { [[0; 4]; T] };
            let gemm_d: [(__m256, __m256); T] = if MODE == GEMM {
                core::array::from_fn(|t| (_mm256_mul_ps(dw, da(t)), _mm256_mul_ps(dmw, da(t))))
            } else {
                [(_mm256_setzero_ps(), _mm256_setzero_ps()); T]
            };
            let mut sumi = [zero; T];
            for j in 0..4 {
                // Rows' qs bytes 32j.. transposed by dwords (8×8).
                let v = transpose_dwords(core::array::from_fn(|r| ld(wb(r).add(16 + 32 * j))));
                let xl: [__m256i; 8] = core::array::from_fn(|m| _mm256_and_si256(v[m], m4));
                let xh: [__m256i; 8] = core::array::from_fn(|m| _mm256_and_si256(_mm256_srli_epi16::<4>(v[m]), m4));
                for (t, s) in sumi.iter_mut().enumerate() {
                    let y = a.add(t * arow + 292 * i + A_QS + 64 * j);
                    let b = |k: usize| _mm256_set1_epi32(rd32(y.add(4 * k)));
                    // Four chains of four (`vpdpbusd`'s latency), added at the end.
                    let (mut sl, mut sh, mut sl2, mut sh2) = (zero, zero, zero, zero);
                    for m in 0..4 {
                        sl = _mm256_dpbusd_epi32(sl, xl[m], b(m));
                        sh = _mm256_dpbusd_epi32(sh, xh[m], b(8 + m));
                        sl2 = _mm256_dpbusd_epi32(sl2, xl[4 + m], b(4 + m));
                        sh2 = _mm256_dpbusd_epi32(sh2, xh[4 + m], b(12 + m));
                    }
                    let (sl, sh) = (_mm256_add_epi32(sl, sl2), _mm256_add_epi32(sh, sh2));
                    let sj = _mm256_add_epi32(_mm256_mullo_epi32(sc[2 * j], sl), _mm256_mullo_epi32(sc[2 * j + 1], sh));
                    if MODE == GEMM {
                        let ((dd, dm), summ) = (gemm_d[t], _mm256_madd_epi16(mp[j], _mm256_set1_epi32(gemm_q8s[t][j])));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sj), dd, acc[t]);
                        accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(summ), dm, accm[t]);
                    } else {
                        *s = _mm256_add_epi32(*s, sj);
                    }
                }
            }
            if MODE == GEMM {
                continue;
            }
            for t in 0..T {
                let q8s = q8s(t);
                let mut summ = zero;
                for (j, mpj) in mp.iter().enumerate() {
                    summ = _mm256_add_epi32(summ, _mm256_madd_epi16(*mpj, _mm256_set1_epi32(q8s[j])));
                }
                let da = da(t);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), _mm256_mul_ps(dw, da), acc[t]);
                accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(dmw, da), accm[t]);
            }
        }
        for t in 0..T {
            _mm256_storeu_ps(out.add(t * ostride), _mm256_sub_ps(acc[t], accm[t]));
        }
    }
}

/// The 8×8 dword transpose of 8 rows of 32 bytes: vector m holds, in lane r, dword m
/// of row r.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transpose_dwords(rows: [__m256i; 8]) -> [__m256i; 8] {
    // SAFETY: value-only intrinsics (this fn's target features).
    unsafe {
        let t0: [__m256i; 4] = core::array::from_fn(|k| _mm256_unpacklo_epi32(rows[2 * k], rows[2 * k + 1]));
        let t1: [__m256i; 4] = core::array::from_fn(|k| _mm256_unpackhi_epi32(rows[2 * k], rows[2 * k + 1]));
        // u[q]: dwords (q / 2 * 2 .. ) of rows; then 64-bit unpacks and lane swaps.
        let u = [
            _mm256_unpacklo_epi64(t0[0], t0[1]), _mm256_unpackhi_epi64(t0[0], t0[1]),
            _mm256_unpacklo_epi64(t1[0], t1[1]), _mm256_unpackhi_epi64(t1[0], t1[1]),
            _mm256_unpacklo_epi64(t0[2], t0[3]), _mm256_unpackhi_epi64(t0[2], t0[3]),
            _mm256_unpacklo_epi64(t1[2], t1[3]), _mm256_unpackhi_epi64(t1[2], t1[3]),
        ];
        // Lane r = dword m of row r (m < 4 from the low 128 bits of each row).
        core::array::from_fn(|m| {
            let (x, y) = (u[m % 4], u[4 + m % 4]);
            if m < 4 { _mm256_permute2x128_si256::<0x20>(x, y) } else { _mm256_permute2x128_si256::<0x31>(x, y) }
        })
    }
}

/// Weight rows of the AVX-512 VNNI Q6_K tile (tiled order): one per lane of a vector.
pub(crate) const Q6_K_TILE_ROWS: usize = 8;
/// Tokens of the AVX-512 VNNI Q6_K tile.
pub(crate) const Q6_K_TILE_TOKENS: usize = 8;

/// [`q6_k_q8_k`]`::<TILED>` for [`Q6_K_TILE_ROWS`] rows in the lanes of a vector ×
/// [`Q6_K_TILE_TOKENS`] tokens, AVX-512 VNNI on 256-bit vectors. Per super-block and
/// 32-element group g (sub-blocks 2g, 2g + 1), the 8 rows' unsigned levels
/// ([`q6_k_levels`]) are transposed by dwords; per token, `vpdpbusd` with the activation's
/// matching 4 bytes broadcast, started from `-32·bsum` of the sub-block, gives every
/// row's exact `Σ (q - 32)·a` of each sub-block, multiplied by the rows' scales
/// (`vpmulld`) into `s1`. The integer `s1` is the single dot's (exact, any order); the
/// float steps per lane are its [`tiled_step`]: `r = f32(s1)·dw`, `acc = fma(r, da, acc)`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q6_k_q8_k_tile_tiled_vnni(nb: usize, w: *const u8, wrow: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: nb super-blocks of each of the 8 rows at w + r·wrow and of each token's row
    // at a + t·arow, and out[t·ostride + r] (ostride >= 8), are in bounds (the wrapper
    // checks); layout ql@0 qh@128 scales@192 d@208; AVX-512 F/BW/VL/VNNI available (only
    // handed out after cpu_has_avx512_vnni()).
    unsafe {
        const R: usize = Q6_K_TILE_ROWS;
        const T: usize = Q6_K_TILE_TOKENS;
        let zero = _mm256_setzero_si256();
        let mut acc = [_mm256_setzero_ps(); T];
        for i in 0..nb {
            let wb = |r: usize| w.add(r * wrow + 210 * i);
            let ab = |t: usize| a.add(t * arow + 292 * i);
            // The 16 i8 scales of each row, 4 per dword: wv[k] lane r = dword k of row r's.
            let wv: [__m256i; 4] = core::array::from_fn(|k| {
                let words: [i32; R] = core::array::from_fn(|r| rd32(wb(r).add(192 + 4 * k)));
                _mm256_loadu_si256(words.as_ptr().cast())
            });
            // Lane r = scale s of row r (sign-extended).
            let scale = |s: usize| {
                let v = wv[s / 4];
                match s % 4 {
                    0 => _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(v)),
                    1 => _mm256_srai_epi32::<24>(_mm256_slli_epi32::<16>(v)),
                    2 => _mm256_srai_epi32::<24>(_mm256_slli_epi32::<8>(v)),
                    _ => _mm256_srai_epi32::<24>(v),
                }
            };
            // -32·bsums of each token, as i32.
            let bias: [[i32; 16]; T] = core::array::from_fn(|t| core::array::from_fn(|s| -32 * i32::from(core::ptr::read_unaligned(ab(t).add(A_BSUMS + 2 * s).cast::<i16>()))));
            let mut s1 = [zero; T];
            for g in 0..8 {
                let v = transpose_dwords(core::array::from_fn(|r| q6_k_levels(wb(r), g / 4, g % 4)));
                let (sa, sb) = (scale(2 * g), scale(2 * g + 1));
                for (t, s1) in s1.iter_mut().enumerate() {
                    let y = ab(t).add(A_QS + 32 * g);
                    let b = |k: usize| _mm256_set1_epi32(rd32(y.add(4 * k)));
                    let (mut sl, mut sh) = (_mm256_set1_epi32(bias[t][2 * g]), _mm256_set1_epi32(bias[t][2 * g + 1]));
                    for m in 0..4 {
                        sl = _mm256_dpbusd_epi32(sl, v[m], b(m));
                        sh = _mm256_dpbusd_epi32(sh, v[4 + m], b(4 + m));
                    }
                    *s1 = _mm256_add_epi32(*s1, _mm256_add_epi32(_mm256_mullo_epi32(sa, sl), _mm256_mullo_epi32(sb, sh)));
                }
            }
            let dw = f16_rows(w, wrow, 210 * i + 208);
            for (t, (acc, s1)) in acc.iter_mut().zip(s1).enumerate() {
                let r = _mm256_mul_ps(_mm256_cvtepi32_ps(s1), dw);
                *acc = _mm256_fmadd_ps(r, _mm256_set1_ps(rdf32(ab(t))), *acc);
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(out.add(t * ostride), *acc);
        }
    }
}

/// The f16 at byte `off` of 8 rows `wrow` bytes apart, as f32 (F16C's conversion is exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_rows(w: *const u8, wrow: usize, off: usize) -> __m256 {
    // SAFETY: the caller guarantees 2 readable bytes at off in each of the 8 rows.
    unsafe {
        let h = |r: usize| rd16u(w.add(r * wrow + off)) as u64;
        let lo = h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48;
        let hi = h(4) | h(5) << 16 | h(6) << 32 | h(7) << 48;
        _mm256_cvtph_ps(_mm_set_epi64x(hi as i64, lo as i64))
    }
}

/// [`q4_k_q8_k`]`::<NATIVE>` for [`super::qdot::ROWS`] rows of one token (decode), two
/// rows per 512-bit vector (row 2p in the low 256 bits, row 2p + 1 in the high), AVX-512
/// VNNI. Each half computes its row's sub-block sums as the single dot does (`maddubs` of
/// the 32 levels by the 32 activations, times the sub-block's scale) but adds them by
/// `vpdpwssd` (the `madd` and the add in one); the eight rows' lanes are then summed to
/// one lane per row by shuffles. The integers are exact, so each row's super-block sum
/// and mins sum are the single dot's, and the float steps, lane r for row r, are its own:
/// `dw·da` and `dminw·da` (one product each), `acc = fma(f32(sumi), dw·da, acc)`, `accm =
/// fma(f32(summ), dminw·da, accm)`, result `acc - accm`. So output r has the dot's bits
/// for row r.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q4_k_q8_k_rows_vnni<const FAR_L1: bool>(nb: usize, w: *const u8, wrow: usize, a: *const u8, out: *mut f32) {
    // SAFETY: nb super-blocks of each of the ROWS rows at w + r·wrow, nb Q8_K blocks at a
    // and ROWS outputs are in bounds (the wrapper checks); layout d@0 dmin@2 scales@4
    // qs@16; AVX-512 F/BW/VL/VNNI available (only handed out after cpu_has_avx512_vnni()).
    unsafe {
        use super::qdot::{f16_scales, prefetch_next_rows, ROWS};
        let m4 = _mm512_set1_epi8(0xF);
        // `lanes32_group`'s scale selections: i16 scale 2j (low sub-block) and 2j + 1.
        let pick: [(__m512i, __m512i); 4] = core::array::from_fn(|j| {
            let k = 2 * j as i32;
            (_mm512_set1_epi16((((2 * k + 1) << 8) | (2 * k)) as i16), _mm512_set1_epi16((((2 * k + 3) << 8) | (2 * k + 2)) as i16))
        });
        // Lanes 0-1 and 2-3 of each 128-bit quarter of two vectors (as `q4_0_q8_0_rows_vnni`).
        let lo2 = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29);
        let hi2 = _mm512_setr_epi32(2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
        // Rows 0, 2, 4, 6 | 1, 3, 5, 7 -> rows 0..8.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let (mut acc, mut accm) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in 0..nb {
            prefetch_next_rows::<false, FAR_L1>(w, wrow, i, nb);
            let ab = a.add(292 * i);
            // The token's sub-block pair sums of bsums (as `mins_lanes`), in both halves.
            let b = ld(ab.add(A_BSUMS));
            let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256::<1>(b));
            let q8s = _mm256_set_m128i(q8s, q8s);
            let ys: [(__m512i, __m512i); 4] = core::array::from_fn(|j| {
                let y = ab.add(A_QS + 64 * j);
                (_mm512_broadcast_i64x4(ld(y)), _mm512_broadcast_i64x4(ld(y.add(32))))
            });
            // Pair p: sums of rows 2p (lanes 0-7) and 2p + 1 (8-15); mins of 2p (lanes 0-3)
            // and 2p + 1 (4-7).
            let mut sums = [_mm512_setzero_si512(); ROWS / 2];
            let mut mins = [_mm256_setzero_si256(); ROWS / 2];
            for (p, (sumi, pm)) in sums.iter_mut().zip(mins.iter_mut()).enumerate() {
                let (wa, wb) = (w.add(2 * p * wrow + 144 * i), w.add((2 * p + 1) * wrow + 144 * i));
                let (sa, sb) = (scales_mins(wa.add(4)), scales_mins(wb.add(4)));
                // [scales a, scales a | scales b, scales b] (8 i16 each) and [mins a | mins b].
                let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(sa), sb);
                let sc = _mm512_shuffle_i64x2::<0b1010_0000>(both, both);
                *pm = _mm256_madd_epi16(_mm256_permute2x128_si256::<0x31>(sa, sb), q8s);
                for (j, &(ylo, yhi)) in ys.iter().enumerate() {
                    let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ld(wa.add(16 + 32 * j))), ld(wb.add(16 + 32 * j)));
                    let (lo, hi) = (_mm512_and_si512(q, m4), _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4));
                    *sumi = _mm512_dpwssd_epi32(*sumi, _mm512_shuffle_epi8(sc, pick[j].0), _mm512_maddubs_epi16(lo, ylo));
                    *sumi = _mm512_dpwssd_epi32(*sumi, _mm512_shuffle_epi8(sc, pick[j].1), _mm512_maddubs_epi16(hi, yhi));
                }
            }
            // Rows 0-7's sums in lanes 0-7 (exact integer adds).
            let quads = |za: __m512i, zb: __m512i| _mm512_add_epi32(_mm512_shuffle_i64x2::<0x88>(za, zb), _mm512_shuffle_i64x2::<0xDD>(za, zb));
            let (q03, q47) = (quads(sums[0], sums[1]), quads(sums[2], sums[3]));
            let t = _mm512_add_epi32(_mm512_permutex2var_epi32(q03, lo2, q47), _mm512_permutex2var_epi32(q03, hi2, q47));
            let s = _mm512_cvtepi64_epi32(_mm512_add_epi32(t, _mm512_srli_epi64::<32>(t)));
            let m = _mm256_hadd_epi32(_mm256_hadd_epi32(mins[0], mins[1]), _mm256_hadd_epi32(mins[2], mins[3]));
            let m = _mm256_permutevar8x32_epi32(m, order);
            let da = _mm256_set1_ps(rdf32(ab));
            let (d, dm) = (_mm256_mul_ps(f16_scales(w, wrow, 144 * i), da), _mm256_mul_ps(f16_scales(w, wrow, 144 * i + 2), da));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc);
            accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), dm, accm);
        }
        _mm256_storeu_ps(out, _mm256_sub_ps(acc, accm));
    }
}

//! The `vec_dot` bodies of the 32-element types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL,
//! MXFP4 weights) and their helpers.
//!
//! Block layouts are in `blocks.rs`. Q4_1 and Q8_0 (the types of the golden-tested
//! models) follow llama.cpp's x86 kernels operation for operation, one block per vector
//! and one accumulator, so they give the scalar reference's bits exactly. Q4_0, Q5_0 and
//! Q5_1 are processed two blocks per 256-bit vector (`lo` = elements 0..16 of both
//! blocks, `hi` = 16..32), so one `madd`, convert and FMA serve two blocks, with scales
//! four blocks at a time from one f16→f32 conversion per side (they differ from the
//! reference in summation order only).
//! Every function requires AVX2, FMA and F16C, and pointers to whole in-bounds blocks.

use core::arch::x86_64::*;

use super::{hsum_epi32, hsum_ps, rd16, rd32};
use crate::quant::blocks::{e8m0_to_f32_half, f16_to_f32, KVALUES_IQ4NL, KVALUES_MXFP4};

/// 16 bytes at `p` → 32 values 0..=15: low nibbles (elements 0..16), then high nibbles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 16 readable bytes at p; AVX2 available (target features).
    unsafe {
        let q = _mm_loadu_si128(p.cast());
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(q), q), _mm256_set1_epi8(0x0F))
    }
}

/// 0x10 in byte i where bit (i mod 8) of byte i of `spread` is set, else 0 (`spread`
/// holds, in byte i, the `qh` byte that carries element i's 5th bit).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bit_bytes(spread: __m256i) -> __m256i {
    // SAFETY: value-only intrinsics; the caller has AVX2, FMA and F16C (this fn's target features).
    unsafe {
        let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

/// The u32 at `p` (a Q5 `qh`) → byte i = 0x10 if bit i is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fifth_bits(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 4 readable bytes at p; AVX2 available (target features).
    unsafe {
        let qh = core::ptr::read_unaligned(p.cast::<i32>());
        // Byte i of `spread` is byte i/8 of qh; `sel` picks bit i%8 of it.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(qh),
            _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
        );
        bit_bytes(spread)
    }
}

/// Σ pairs of u8 `x` × i8 `y` → 8 i32 lanes (each the sum of 4 products).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_u8_i8(x: __m256i, y: __m256i) -> __m256i {
    // SAFETY: value-only intrinsics; the caller has AVX2, FMA and F16C (this fn's target features).
    unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1)) }
}

/// As [`dot_u8_i8`] with `x - off` (off = 8 or 16) as the weight.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_u8_off_i8(x: __m256i, off: __m256i, y: __m256i) -> __m256i {
    // SAFETY: value-only intrinsics; the caller has AVX2, FMA and F16C (this fn's target features).
    unsafe {
        let p = _mm256_sub_epi16(_mm256_maddubs_epi16(x, y), _mm256_maddubs_epi16(off, y));
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }
}

/// i8 `x` (any) × i8 `y` (-127..=127) → 8 i32 lanes, by the sign trick.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i8_i8(x: __m256i, y: __m256i) -> __m256i {
    // SAFETY: value-only intrinsics; the caller has AVX2, FMA and F16C (this fn's target features).
    unsafe { dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)) }
}

/// The first 4 bytes of each of four blocks, as f32 pairs: lanes (2k, 2k+1) are the
/// two f16 at the start of block k (`d, m` or `d, s`; for Q8_0-style blocks the odd lane
/// is the first two quants read as an f16 and is ignored).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn head4(p0: *const u8, p1: *const u8, p2: *const u8, p3: *const u8) -> __m256 {
    // SAFETY: the caller guarantees 4 readable bytes at each pointer (a block start); F16C available.
    unsafe { _mm256_cvtph_ps(_mm_setr_epi32(rd32(p0), rd32(p1), rd32(p2), rd32(p3))) }
}

/// Σ of lanes 1, 3, 5, 7 (the Σ mw·sa that [`dot_loop_pairs`] gathers).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn odd_lanes_sum(v: __m256) -> f32 {
    // SAFETY: value-only intrinsics; the caller has AVX2, FMA and F16C (this fn's target features).
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_movehdup_ps(s))
    }
}

/// Two Q4-style blocks' nibbles at `q0`, `q1` (16 bytes each), paired:
/// `lo = [block 0 elements 0..16 | block 1 elements 0..16]`, `hi` = elements 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles2(q0: *const u8, q1: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller guarantees 16 readable bytes at q0 and at q1; AVX2 available.
    unsafe {
        let v = _mm256_loadu2_m128i(q1.cast(), q0.cast());
        let m = _mm256_set1_epi8(0x0F);
        (_mm256_and_si256(v, m), _mm256_and_si256(_mm256_srli_epi16::<4>(v), m))
    }
}

/// Two activation blocks' quants at `y0`, `y1` (32 bytes each), paired as [`nibbles2`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn act2(y0: *const u8, y1: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller guarantees 32 readable bytes at y0 and at y1; AVX2 available.
    unsafe { (_mm256_loadu2_m128i(y1.cast(), y0.cast()), _mm256_loadu2_m128i(y1.add(16).cast(), y0.add(16).cast())) }
}

/// Two Q5 `qh` words at `h0`, `h1`, as 0x10-per-set-bit bytes paired as [`nibbles2`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fifth_bits2(h0: *const u8, h1: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller guarantees 4 readable bytes at h0 and at h1; AVX2 available.
    unsafe {
        // Both 128-bit lanes hold bytes [qh0 (4) | qh1 (4)] twice; lane 0 spreads qh0's
        // bytes, lane 1 qh1's: byte i of a half-block takes byte i/8 of its 16-bit half.
        let q = (rd32(h0) as u32 as u64) | ((rd32(h1) as u32 as u64) << 32);
        let v = _mm256_set1_epi64x(q as i64);
        let lo = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0404040404040404, 0x0505050505050505);
        let hi = _mm256_setr_epi64x(0x0202020202020202, 0x0303030303030303, 0x0606060606060606, 0x0707070707070707);
        (bit_bytes(_mm256_shuffle_epi8(v, lo)), bit_bytes(_mm256_shuffle_epi8(v, hi)))
    }
}

/// Paired u8 × i8 halves → 8 i32: lanes 0..4 sum block 0, lanes 4..8 block 1.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pair_sum(lo: __m256i, hi: __m256i, ylo: __m256i, yhi: __m256i) -> __m256i {
    // SAFETY: value-only intrinsics; the caller has AVX2, FMA and F16C (this fn's target features).
    unsafe {
        let s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_maddubs_epi16(hi, yhi));
        _mm256_madd_epi16(s, _mm256_set1_epi16(1))
    }
}

/// As [`pair_sum`] with weights `x - off` (off = 8 or 16: |i16 partial| <= 8128).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pair_sum_off(lo: __m256i, hi: __m256i, off: __m256i, ylo: __m256i, yhi: __m256i) -> __m256i {
    // SAFETY: value-only intrinsics; the caller has AVX2, FMA and F16C (this fn's target features).
    unsafe {
        let l = _mm256_sub_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_maddubs_epi16(off, ylo));
        let h = _mm256_sub_epi16(_mm256_maddubs_epi16(hi, yhi), _mm256_maddubs_epi16(off, yhi));
        _mm256_madd_epi16(_mm256_add_epi16(l, h), _mm256_set1_epi16(1))
    }
}

/// The loop of the 4- and 5-bit dots: blocks are taken two at a time, `pair(w0, a0, w1,
/// a1)` giving block 0's partial sums in lanes 0..4 and block 1's in lanes 4..8, so one
/// convert and one FMA (with scales `[dd0 x4, dd1 x4]`) serve two blocks. Four blocks
/// per iteration, then a pair, then `single(w, a)` (8 lanes of one block) for the last.
/// Scales: f16 `d` at offset 0 of both blocks; with `ms`, also `m` (weight) and `s`
/// (activation) at offset 2, whose products are summed separately.
macro_rules! dot_loop_pairs {
    ($nb:expr, $w:expr, $a:expr, $ws:expr, $as:expr, ms = $ms:expr,
     pair = |$w0:ident, $a0:ident, $w1:ident, $a1:ident| $pair:expr,
     single = |$bw:ident, $ba:ident| $single:expr) => {{
        let (nb, w, a) = ($nb, $w, $a);
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut ms = _mm256_setzero_ps();
        let idx01 = _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2);
        let idx23 = _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6);
        let mut i = 0;
        while i + 4 <= nb {
            let wp = [w.add(i * $ws), w.add((i + 1) * $ws), w.add((i + 2) * $ws), w.add((i + 3) * $ws)];
            let ap = [a.add(i * $as), a.add((i + 1) * $as), a.add((i + 2) * $as), a.add((i + 3) * $as)];
            let p = _mm256_mul_ps(head4(wp[0], wp[1], wp[2], wp[3]), head4(ap[0], ap[1], ap[2], ap[3]));
            if $ms {
                ms = _mm256_add_ps(ms, p);
            }
            let s01 = { let ($w0, $a0, $w1, $a1) = (wp[0], ap[0], wp[1], ap[1]); $pair };
            let s23 = { let ($w0, $a0, $w1, $a1) = (wp[2], ap[2], wp[3], ap[3]); $pair };
            acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s01), _mm256_permutevar8x32_ps(p, idx01), acc[0]);
            acc[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s23), _mm256_permutevar8x32_ps(p, idx23), acc[1]);
            i += 4;
        }
        if i + 2 <= nb {
            let (wa, aa) = (w.add(i * $ws), a.add(i * $as));
            let (wb, ab) = (wa.add($ws), aa.add($as));
            let hw = _mm_cvtph_ps(_mm_setr_epi32(rd32(wa), rd32(wb), 0, 0));
            let ha = _mm_cvtph_ps(_mm_setr_epi32(rd32(aa), rd32(ab), 0, 0));
            let p = _mm256_zextps128_ps256(_mm_mul_ps(hw, ha)); // [dd0, ms0, dd1, ms1, 0..]
            if $ms {
                ms = _mm256_add_ps(ms, p);
            }
            let s01 = { let ($w0, $a0, $w1, $a1) = (wa, aa, wb, ab); $pair };
            acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s01), _mm256_permutevar8x32_ps(p, idx01), acc[0]);
            i += 2;
        }
        if i < nb {
            let (w0, a0) = (w.add(i * $ws), a.add(i * $as));
            let f = _mm_cvtph_ps(_mm_setr_epi32(rd32(w0), rd32(a0), 0, 0));
            let p = _mm_mul_ps(f, _mm_movehl_ps(f, f));
            if $ms {
                ms = _mm256_add_ps(ms, _mm256_zextps128_ps256(_mm_and_ps(p, _mm_castsi128_ps(_mm_setr_epi32(0, -1, 0, 0)))));
            }
            let s = { let ($bw, $ba) = (w0, a0); $single };
            acc[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcastss_ps(p), acc[1]);
        }
        let total = hsum_ps(_mm256_add_ps(acc[0], acc[1]));
        if $ms { total + odd_lanes_sum(ms) } else { total }
    }};
}

// Each body: `nb` block pairs at `w` (weight blocks) and `a` (activation blocks), all in
// bounds (the wrapper's SAFETY argument); AVX2, FMA and F16C available.

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_0_q8_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layouts d@0 qs@2 and d@0 qs@2; every pointer formed is inside
    // block i < nb of its row.
    unsafe {
        let off = _mm256_set1_epi8(8);
        dot_loop_pairs!(nb, w, a, 18, 34, ms = false,
            pair = |w0, a0, w1, a1| {
                let (lo, hi) = nibbles2(w0.add(2), w1.add(2));
                let (ylo, yhi) = act2(a0.add(2), a1.add(2));
                pair_sum_off(lo, hi, off, ylo, yhi)
            },
            single = |bw, ba| dot_u8_off_i8(nibbles(bw.add(2)), off, _mm256_loadu_si256(ba.add(2).cast())))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_0_q8_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layout d@0 qh@2 qs@6.
    unsafe {
        let off = _mm256_set1_epi8(16);
        dot_loop_pairs!(nb, w, a, 22, 34, ms = false,
            pair = |w0, a0, w1, a1| {
                let (lo, hi) = nibbles2(w0.add(6), w1.add(6));
                let (blo, bhi) = fifth_bits2(w0.add(2), w1.add(2));
                let (ylo, yhi) = act2(a0.add(2), a1.add(2));
                pair_sum_off(_mm256_or_si256(lo, blo), _mm256_or_si256(hi, bhi), off, ylo, yhi)
            },
            single = |bw, ba| {
                let x = _mm256_or_si256(nibbles(bw.add(6)), fifth_bits(bw.add(2)));
                dot_u8_off_i8(x, off, _mm256_loadu_si256(ba.add(2).cast()))
            })
    }
}

/// Q4_1 · Q8_1 in llama.cpp's x86 order, bit-identical to the scalar reference: one
/// accumulator, blocks in order, `acc = fma(dw·da, f32(lanes), acc)`,
/// `summs = fma(mw, sa, summs)`, result `hsum(acc) + summs`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_1_q8_1(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layouts d@0 m@2 qs@4 and d@0 s@2 qs@4.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let mut summs = _mm_setzero_ps();
        for i in 0..nb {
            let (wb, ab) = (w.add(i * 20), a.add(i * 36));
            let f = _mm_cvtph_ps(_mm_setr_epi32(rd32(wb), rd32(ab), 0, 0)); // [dw, mw, da, sa]
            summs = _mm_fmadd_ss(_mm_movehdup_ps(f), _mm_shuffle_ps::<0xFF>(f, f), summs); // mw·sa
            let d = _mm256_set1_ps(_mm_cvtss_f32(_mm_mul_ss(f, _mm_movehl_ps(f, f))));
            let s = dot_u8_i8(nibbles(wb.add(4)), _mm256_loadu_si256(ab.add(4).cast()));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
        }
        hsum_ps(acc) + _mm_cvtss_f32(summs)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_1_q8_1(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layout d@0 m@2 qh@4 qs@8.
    unsafe {
        dot_loop_pairs!(nb, w, a, 24, 36, ms = true,
            pair = |w0, a0, w1, a1| {
                let (lo, hi) = nibbles2(w0.add(8), w1.add(8));
                let (blo, bhi) = fifth_bits2(w0.add(4), w1.add(4));
                let (ylo, yhi) = act2(a0.add(4), a1.add(4));
                pair_sum(_mm256_or_si256(lo, blo), _mm256_or_si256(hi, bhi), ylo, yhi)
            },
            single = |bw, ba| {
                let x = _mm256_or_si256(nibbles(bw.add(8)), fifth_bits(bw.add(4)));
                dot_u8_i8(x, _mm256_loadu_si256(ba.add(4).cast()))
            })
    }
}

/// Q8_0 · Q8_0 in llama.cpp's x86 order, bit-identical to the scalar reference: one
/// accumulator, blocks in order, `acc = fma(dw·da, f32(lanes), acc)`, then `hsum(acc)`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_q8_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layout d@0 qs@2.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let (wb, ab) = (w.add(i * 34), a.add(i * 34));
            let f = _mm_cvtph_ps(_mm_setr_epi32(rd32(wb), rd32(ab), 0, 0)); // [dw, _, da, _]
            let d = _mm256_set1_ps(_mm_cvtss_f32(_mm_mul_ss(f, _mm_movehl_ps(f, f))));
            let s = dot_i8_i8(_mm256_loadu_si256(wb.add(2).cast()), _mm256_loadu_si256(ab.add(2).cast()));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
        }
        hsum_ps(acc)
    }
}

/// The 4-bit table dots (IQ4_NL, MXFP4) in llama.cpp's repacked order, bit-identical to
/// the scalar reference: per block the exact integer `sumi = Σ table[q]·a` (table lookup
/// by `pshufb`, then the sign trick), then `acc = fma(f32(sumi), dw·da, acc)` in block
/// order with one accumulator. Four blocks' sums are formed at once (`hadd`) and fed to
/// the fma chain one by one. `scale(k)` is the weight scale of block k, `q_off` the
/// offset of the nibbles in a weight block of `ws` bytes.
macro_rules! table_dot {
    ($nb:expr, $w:expr, $a:expr, $ws:expr, $q_off:expr, $table:expr, |$p:ident| $scale:expr) => {{
        let (nb, w, a) = ($nb, $w, $a);
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128($table.as_ptr().cast()));
        let m4 = _mm_set1_epi8(0x0F);
        let block = |k: usize| {
            let q = _mm_loadu_si128(w.add(k * $ws + $q_off).cast());
            let idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(q), m4), _mm_and_si128(q, m4));
            dot_i8_i8(_mm256_shuffle_epi8(table, idx), _mm256_loadu_si256(a.add(k * 34 + 2).cast()))
        };
        let wscale = |k: usize| { let $p = w.add(k * $ws); $scale };
        let mut acc = _mm_setzero_ps();
        let mut i = 0;
        while i + 4 <= nb {
            let h01 = _mm256_hadd_epi32(block(i), block(i + 1));
            let h23 = _mm256_hadd_epi32(block(i + 2), block(i + 3));
            let h = _mm256_hadd_epi32(h01, h23);
            let s = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h)));
            let da = _mm_cvtph_ps(_mm_setr_epi16(
                rd16(a.add(i * 34)), rd16(a.add((i + 1) * 34)), rd16(a.add((i + 2) * 34)), rd16(a.add((i + 3) * 34)), 0, 0, 0, 0,
            ));
            let d = _mm_mul_ps(_mm_setr_ps(wscale(i), wscale(i + 1), wscale(i + 2), wscale(i + 3)), da);
            acc = _mm_fmadd_ss(s, d, acc);
            acc = _mm_fmadd_ss(_mm_shuffle_ps::<0b01>(s, s), _mm_shuffle_ps::<0b01>(d, d), acc);
            acc = _mm_fmadd_ss(_mm_shuffle_ps::<0b10>(s, s), _mm_shuffle_ps::<0b10>(d, d), acc);
            acc = _mm_fmadd_ss(_mm_shuffle_ps::<0b11>(s, s), _mm_shuffle_ps::<0b11>(d, d), acc);
            i += 4;
        }
        while i < nb {
            let s = hsum_epi32(block(i));
            let da = f16_to_f32(rd16(a.add(i * 34)) as u16);
            acc = _mm_fmadd_ss(_mm_cvtsi32_ss(acc, s), _mm_set_ss(wscale(i) * da), acc);
            i += 1;
        }
        _mm_cvtss_f32(acc)
    }};
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn iq4_nl_q8_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layouts d@0 qs@2 and d@0 qs@2.
    unsafe { table_dot!(nb, w, a, 18, 2, KVALUES_IQ4NL, |p| f16_to_f32(rd16(p) as u16)) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mxfp4_q8_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layouts e@0 qs@1 and d@0 qs@2.
    unsafe { table_dot!(nb, w, a, 17, 1, KVALUES_MXFP4, |p| e8m0_to_f32_half(*p)) }
}

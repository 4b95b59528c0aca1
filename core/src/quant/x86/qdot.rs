//! The `vec_dot` bodies of the 32-element types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL,
//! MXFP4 weights) and their helpers.
//!
//! Block layouts are in `blocks.rs`. Every dot here follows the order of the llama.cpp
//! 11434 x86 kernel keel reproduces for its type, so each gives the scalar reference's
//! bits exactly: Q4_1, Q5_1, Q8_0, Q5_0 and the unrepacked Q4_0 (`lane_dot`) one block
//! per vector and one accumulator as `ggml_vec_dot_*`; IQ4_NL, MXFP4 and Q4_0
//! (`table_dot`) an exact integer sum per block as the repacked `gemv`/`gemm`.
//! Every function requires AVX2, FMA and F16C (the `_vnni` 8-row kernels also AVX-512
//! F/BW/VL/VNNI), and pointers to whole in-bounds blocks.

use core::arch::x86_64::*;

use super::{hsum_epi32, hsum_ps, rd16, rd32};
use crate::prefetch::{self, Level};
use crate::quant::blocks::{e8m0_to_f32_half, f16_to_f32, KVALUES_IQ4NL, KVALUES_MXFP4};

/// 16 bytes at `p` → 32 values 0..=15: low nibbles (elements 0..16), then high nibbles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 16 readable bytes at p; AVX2 available (target features).
    // (The 16 bytes go to both halves by a broadcast load and the high half is shifted
    // by a variable shift: no shuffle-port uop, which the decode loops are short of.)
    unsafe {
        let q = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
        _mm256_and_si256(_mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0F))
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
pub(super) unsafe fn fifth_bits(p: *const u8) -> __m256i {
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

/// The f16 pairs (`d`, then `m` or `s`) at the start of four blocks `stride` bytes apart
/// from `p`, as f32: `[d0, m0, d1, m1, d2, m2, d3, m3]` (F16C's conversion is exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scale_pairs(p: *const u8, stride: usize) -> __m256 {
    // SAFETY: the caller guarantees 4 readable bytes at p + k·stride, k < 4.
    unsafe {
        let h = |k: usize| rd32(p.add(k * stride));
        _mm256_cvtph_ps(_mm_setr_epi32(h(0), h(1), h(2), h(3)))
    }
}

/// Σ pairs of u8 `x` × i8 `y` → 8 i32 lanes (each the sum of 4 products).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_u8_i8(x: __m256i, y: __m256i) -> __m256i {
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
pub(super) unsafe fn dot_i8_i8(x: __m256i, y: __m256i) -> __m256i {
    // SAFETY: value-only intrinsics; the caller has AVX2, FMA and F16C (this fn's target features).
    unsafe { dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)) }
}

/// llama.cpp's x86 one-accumulator order for the types without a min: per block, in
/// order, `acc = fma(dw·da, f32(lanes), acc)` with `lanes = $lanes(wb, ab)` (8 i32 lane
/// sums of the block at `wb` / `ab`, sizes `$ws` / `$as`, f16 scales at offset 0), then
/// `hsum(acc)`.
macro_rules! lane_dot {
    ($nb:expr, $w:expr, $a:expr, $ws:expr, $as:expr, |$wb:ident, $ab:ident| $lanes:expr) => {{
        let (nb, w, a) = ($nb, $w, $a);
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let ($wb, $ab) = (w.add(i * $ws), a.add(i * $as));
            let f = _mm_cvtph_ps(_mm_setr_epi32(rd32($wb), rd32($ab), 0, 0)); // [dw, _, da, _]
            let d = _mm256_set1_ps(_mm_cvtss_f32(_mm_mul_ss(f, _mm_movehl_ps(f, f))));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps($lanes), acc);
        }
        hsum_ps(acc)
    }};
}

/// The Q4_0 levels by nibble, for [`table_dot`].
const Q4_0_LEVELS: [i8; 16] = [-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7];

/// The 4-bit table dots (IQ4_NL, MXFP4, Q4_0) in llama.cpp's repacked order, bit-identical to
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

// Each body: `nb` block pairs at `w` (weight blocks) and `a` (activation blocks), all in
// bounds (the wrapper's SAFETY argument); AVX2, FMA and F16C available.

/// Q4_0 · Q8_0 in llama.cpp's repacked (q4_0_8x8) order, bit-identical to the scalar
/// reference: the table dot of IQ4_NL with the levels `q - 8`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_0_q8_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layouts d@0 qs@2 and d@0 qs@2.
    unsafe { table_dot!(nb, w, a, 18, 2, Q4_0_LEVELS, |p| f16_to_f32(rd16(p) as u16)) }
}

/// Q4_0 · Q8_0 in llama.cpp's x86 `vec_dot` order (the weights it does not repack),
/// bit-identical to the scalar reference: as [`q8_0_q8_0`] with weights `q - 8`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_0_q8_0_lanes(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layouts d@0 qs@2 and d@0 qs@2.
    unsafe {
        let off = _mm256_set1_epi8(8);
        lane_dot!(nb, w, a, 18, 34, |wb, ab| dot_u8_off_i8(nibbles(wb.add(2)), off, _mm256_loadu_si256(ab.add(2).cast())))
    }
}

/// Q5_0 · Q8_0 in llama.cpp's x86 order, bit-identical to the scalar reference: as
/// [`q8_0_q8_0`] with weights `q - 16`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_0_q8_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layout d@0 qh@2 qs@6.
    unsafe {
        let off = _mm256_set1_epi8(16);
        lane_dot!(nb, w, a, 22, 34, |wb, ab| {
            let x = _mm256_or_si256(nibbles(wb.add(6)), fifth_bits(wb.add(2)));
            dot_u8_off_i8(x, off, _mm256_loadu_si256(ab.add(2).cast()))
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

/// Q5_1 · Q8_1 in llama.cpp's x86 order, bit-identical to the scalar reference: as
/// [`q4_1_q8_1`] with the 5th bits.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_1_q8_1(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layouts d@0 m@2 qh@4 qs@8 and d@0 s@2 qs@4.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let mut summs = _mm_setzero_ps();
        for i in 0..nb {
            let (wb, ab) = (w.add(i * 24), a.add(i * 36));
            let f = _mm_cvtph_ps(_mm_setr_epi32(rd32(wb), rd32(ab), 0, 0)); // [dw, mw, da, sa]
            summs = _mm_fmadd_ss(_mm_movehdup_ps(f), _mm_shuffle_ps::<0xFF>(f, f), summs); // mw·sa
            let d = _mm256_set1_ps(_mm_cvtss_f32(_mm_mul_ss(f, _mm_movehl_ps(f, f))));
            let x = _mm256_or_si256(nibbles(wb.add(8)), fifth_bits(wb.add(4)));
            let s = dot_u8_i8(x, _mm256_loadu_si256(ab.add(4).cast()));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc);
        }
        hsum_ps(acc) + _mm_cvtss_f32(summs)
    }
}

/// Q8_0 · Q8_0 in llama.cpp's x86 order, bit-identical to the scalar reference: one
/// accumulator, blocks in order, `acc = fma(dw·da, f32(lanes), acc)`, then `hsum(acc)`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_q8_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layout d@0 qs@2.
    unsafe { lane_dot!(nb, w, a, 34, 34, |wb, ab| dot_i8_i8(_mm256_loadu_si256(wb.add(2).cast()), _mm256_loadu_si256(ab.add(2).cast()))) }
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

/// Rows of a [`table_dot_rows`] kernel.
pub(crate) const ROWS: usize = 8;

/// [`table_dot`] for [`ROWS`] weight rows (at `w`, `wrow` bytes apart) against one
/// activation row, the rows' accumulators side by side in one vector (as llama.cpp's
/// repacked 8-row `gemv` keeps them): per block, each row's exact integer sum, `dw·da`
/// per row, `acc = fma(f32(sum), dw·da, acc)`; lane `r` is [`table_dot`] of row `r`, bit
/// for bit (the same integer sums, products and fma, blocks in the same order), but the
/// eight fma chains run in parallel instead of one after another. Stores the 8 results
/// at `out`. Per block, `$prep_a` (with `$ab` the activation block) gives `[$y, $c]`
/// once for the eight rows, and `$lanes` a row's 8 lanes (summing to its exact integer
/// sum) from its nibbles `$idx`.
macro_rules! table_dot_rows {
    ($nb:expr, $w:expr, $wrow:expr, $a:expr, $out:expr, $ws:expr, $q_off:expr, |$k:ident| $scales:expr,
     |$ab:ident| $prep_a:expr, |$idx:ident, $y:ident, $c:ident| $lanes:expr) => {{
        let (nb, w, wrow, a, out) = ($nb, $w, $wrow, $a, $out);
        let mut acc = _mm256_setzero_ps();
        for k in 0..nb {
            let [$y, $c]: [__m256i; 2] = { let $ab = a.add(k * 34); $prep_a };
            let block = |r: usize| {
                // The nibbles as indices (as `nibbles`: no shuffle-port uop).
                let $idx = nibbles(w.add(r * wrow + k * $ws + $q_off));
                $lanes
            };
            prefetch_next_rows::<{ $ws <= FAR_BLOCK }, FAR_L1>(w, wrow, k, nb);
            // Row r's sum of its 8 lanes in lane r (integer: any order is exact).
            let h01 = _mm256_hadd_epi32(block(0), block(1));
            let h23 = _mm256_hadd_epi32(block(2), block(3));
            let h45 = _mm256_hadd_epi32(block(4), block(5));
            let h67 = _mm256_hadd_epi32(block(6), block(7));
            let (h0123, h4567) = (_mm256_hadd_epi32(h01, h23), _mm256_hadd_epi32(h45, h67));
            let s = _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(h0123, h4567), _mm256_permute2x128_si256::<0x31>(h0123, h4567));
            let da = _mm256_cvtph_ps(_mm_set1_epi16(rd16(a.add(k * 34)))); // (F16C: exact)
            let dw = { let $k = k; $scales };
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, da), acc);
        }
        _mm256_storeu_ps(out, acc);
    }};
}

/// The pass structure shared by [`lane_dot_rows`] and [`lane_dot_rows_zmm`]: [`ROWS`]
/// weight rows (at `w`, `wrow` bytes apart) against one activation row, four rows per
/// pass. Per block, in order: the next rows' prefetch, the four rows' scales converted
/// together (`$d`: lane 2r holds `dw_r·da`; `summs = fma(mw, sa, summs)` in lane 2r + 1
/// for the types with a min, `$min`: the block's f16 `m` follows `d` (Q4_1, Q5_1; the
/// activation's `s` follows its `d`)), the activation prepared once (`$prep_a`, with
/// `$ab` the activation block, gives `[$y, $c]`), then `$block` updates the pass's
/// accumulators `$acc` (from `$init`) for block `$k` of the pass's rows at `$wp`. After
/// the pass, `$row` gives row `$r`'s 8-lane accumulator, and its output is `hsum` of it
/// (`+ summs_r`).
macro_rules! rows_passes {
    ($nb:expr, $w:expr, $wrow:expr, $a:expr, $out:expr, $ws:expr, $as:expr, $min:expr, |$ab:ident| $prep_a:expr,
     init: $init:expr, block: |$acc:ident, $wp:ident, $k:ident, $d:ident, $y:ident, $c:ident| $block:block,
     row: |$racc:ident, $r:ident| $row:expr) => {{
        let (nb, w0, wrow, a, out) = ($nb, $w, $wrow, $a, $out);
        for h in 0..ROWS / 4 {
            let $wp = w0.add(4 * h * wrow);
            let mut $acc = $init;
            let mut summs = _mm256_setzero_ps();
            for $k in 0..nb {
                prefetch_next_rows::<{ $ws <= FAR_BLOCK }, FAR_L1>(w0, wrow, h * nb + $k, ROWS / 4 * nb);
                let $ab = a.add($k * $as);
                let fa = _mm256_cvtph_ps(_mm_set1_epi32(rd32($ab))); // [da, sa, da, sa, ..]
                let f = scale_pairs($wp.add($k * $ws), wrow); // [dw0, mw0, dw1, mw1, ..]
                // Lane 2r: dw_r·da; lane 2r + 1: fma(mw_r, sa, summs_r) (the other lanes unused).
                let $d = _mm256_mul_ps(f, fa);
                if $min {
                    summs = _mm256_fmadd_ps(f, fa, summs);
                }
                let [$y, $c]: [__m256i; 2] = $prep_a;
                $block
            }
            let mut m = [0.0f32; 8];
            _mm256_storeu_ps(m.as_mut_ptr(), summs);
            let $racc = &$acc;
            for $r in 0..4 {
                let v: __m256 = $row;
                // (No `+ 0.0` for the types without a min: it would turn -0.0 into +0.0.)
                *out.add(4 * h + $r) = if $min { hsum_ps(v) + m[2 * $r + 1] } else { hsum_ps(v) };
            }
        }
    }};
}

/// [`lane_dot`] (and `q4_1_q8_1`'s `summs`) for [`ROWS`] weight rows, four rows per pass
/// ([`rows_passes`]), each row with its own accumulator: per block, in order, `acc_r =
/// fma(dw_r·da, f32(lanes_r), acc_r)` with `$lanes` the row's 8 lanes from its block at
/// `$wb`, then `hsum(acc_r)` (`+ summs_r`). The same integer lanes, products, fmas and sum
/// as the single dot, so output r has its bits for row r; the four fma chains overlap
/// instead of waiting on each other.
macro_rules! lane_dot_rows {
    ($nb:expr, $w:expr, $wrow:expr, $a:expr, $out:expr, $ws:expr, $as:expr, $min:expr,
     |$ab:ident| $prep_a:expr, |$wb:ident, $y:ident, $c:ident| $lanes:expr) => {
        rows_passes!($nb, $w, $wrow, $a, $out, $ws, $as, $min, |$ab| $prep_a,
            init: [_mm256_setzero_ps(); 4],
            block: |acc, w, k, d, $y, $c| {
                let mut ds = [0.0f32; 8];
                _mm256_storeu_ps(ds.as_mut_ptr(), d);
                for r in 0..4 {
                    let $wb = w.add(r * $wrow + k * $ws);
                    // (A broadcast from memory: no shuffle uop.)
                    acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&ds[2 * r]), _mm256_cvtepi32_ps($lanes), acc[r]);
                }
            },
            row: |acc, r| acc[r])
    };
}

/// [`lane_dot_rows`] with two rows per 512-bit vector: row `2p` in the low 256 bits,
/// row `2p + 1` in the high (`$lanes` gives both rows' 8 lanes from the two weight blocks
/// `$wa`, `$wb` and the activation `$y`, `$c` repeated in both halves), so one
/// `vpdpbusd`, conversion and fma serve two rows. Each half is the 256-bit kernel's
/// vector for its row, lane for lane: the same bits. (On a CPU with full-width 512-bit
/// units, such as AMD's Zen 5, about half the vector operations per row.) Unlike
/// [`rows_passes`], one pass over all eight rows: the activation block, its scale and
/// correction and the prefetch hint serve eight rows per block instead of four (Zen 5,
/// from L2: Q5_0 30.8 -> 33.7 GB/s; SmolLM2 Q4_1 tg128 one thread +3%).
macro_rules! lane_dot_rows_zmm {
    ($nb:expr, $w:expr, $wrow:expr, $a:expr, $out:expr, $ws:expr, $as:expr, $min:expr,
     |$ab:ident| $prep_a:expr, |$wa:ident, $wb:ident, $y:ident, $c:ident| $lanes:expr) => {{
        let (nb, w0, wrow, a, out) = ($nb, $w, $wrow, $a, $out);
        // Pair p (rows 2p, 2p + 1): lanes 0-7 from lane 4(p % 2) of its half's scale
        // vector (row 2p's `dw·da`), lanes 8-15 from lane 4(p % 2) + 2 (row 2p + 1's).
        let pick = [_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2), _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6)];
        // One pass over the eight rows (four pairs, four accumulators): the activation's
        // block, its scales and the prefetch once per block for all eight rows.
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut summs = [_mm256_setzero_ps(); 2];
        for k in 0..nb {
            prefetch_next_rows::<{ $ws <= FAR_BLOCK }, FAR_L1>(w0, wrow, k, nb);
            let $ab = a.add(k * $as);
            let fa = _mm256_cvtph_ps(_mm_set1_epi32(rd32($ab))); // [da, sa, da, sa, ..]
            // Rows 0-3 and 4-7: [dw0, mw0, dw1, mw1, ..]; lane 2r: dw_r·da; lane 2r + 1:
            // fma(mw_r, sa, summs_r) (the other lanes unused).
            let f = [scale_pairs(w0.add(k * $ws), wrow), scale_pairs(w0.add(4 * wrow + k * $ws), wrow)];
            let d = [_mm512_castps256_ps512(_mm256_mul_ps(f[0], fa)), _mm512_castps256_ps512(_mm256_mul_ps(f[1], fa))];
            if $min {
                summs = [_mm256_fmadd_ps(f[0], fa, summs[0]), _mm256_fmadd_ps(f[1], fa, summs[1])];
            }
            let [y, c]: [__m256i; 2] = $prep_a;
            let ($y, $c) = (_mm512_broadcast_i64x4(y), _mm512_broadcast_i64x4(c));
            for (p, acc) in acc.iter_mut().enumerate() {
                let ($wa, $wb) = (w0.add(2 * p * wrow + k * $ws), w0.add((2 * p + 1) * wrow + k * $ws));
                *acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(pick[p % 2], d[p / 2]), _mm512_cvtepi32_ps($lanes), *acc);
            }
        }
        let mut m = [0.0f32; 16];
        _mm256_storeu_ps(m.as_mut_ptr(), summs[0]);
        _mm256_storeu_ps(m.as_mut_ptr().add(8), summs[1]);
        for r in 0..ROWS {
            let v = acc[r / 2];
            let v = if r % 2 == 0 { _mm512_castps512_ps256(v) } else { _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))) };
            // (No `+ 0.0` for the types without a min: it would turn -0.0 into +0.0.)
            *out.add(r) = if $min { hsum_ps(v) + m[2 * r + 1] } else { hsum_ps(v) };
        }
    }};
}

/// Two blocks' 16 bytes at `pa` and `pb` → their 32 values 0..=15 each, as [`nibbles`]
/// gives them: block `pa` in the low 256 bits, `pb` in the high.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn nibbles_pair(pa: *const u8, pb: *const u8) -> __m512i {
    // SAFETY: the caller guarantees 16 readable bytes at pa and at pb; AVX-512 F
    // available (target features).
    unsafe {
        let q = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(_mm_loadu_si128(pa.cast())), 0xFF00, _mm_loadu_si128(pb.cast()));
        let shift = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
        _mm512_and_si512(_mm512_srlv_epi32(q, shift), _mm512_set1_epi8(0x0F))
    }
}

/// The Q5 weights `q` (0..=31) of two blocks: `x` (their nibbles, as [`nibbles_pair`])
/// + 16 in byte i of a block's half where bit i of its `qh` (the u32 at `pa`, `pb`) is
/// set (as `x | fifth_bits(p)` per half, by one masked add).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn add_fifth_bits_pair(x: __m512i, pa: *const u8, pb: *const u8) -> __m512i {
    // SAFETY: the caller guarantees 4 readable bytes at pa and pb; AVX-512 BW available.
    unsafe {
        let bits = core::ptr::read_unaligned(pa.cast::<u32>()) as u64 | (core::ptr::read_unaligned(pb.cast::<u32>()) as u64) << 32;
        // The masked add written out: from `_mm512_mask_add_epi8` the compiler makes an
        // unmasked `or` (bit 4 of x is known clear) and a masked move, one vector operation
        // more per row pair, in loops bound by their vector operations (Zen 5, weights in
        // L1, `quant::bench::bench_short_kernels`: Q5_0 0.597 -> 0.543 ns per row and
        // block, Q5_1 0.579 -> 0.529).
        let mut x = x;
        core::arch::asm!("vpaddb {x}{{{k}}}, {x}, {c}", x = inout(zmm_reg) x, k = in(kreg) bits, c = in(zmm_reg) _mm512_set1_epi8(16), options(pure, nomem, nostack));
        x
    }
}

/// [`q8_0_q8_0`] for [`ROWS`] rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_q8_0_rows<const FAR_L1: bool>(nb: usize, w: *const u8, wrow: usize, a: *const u8, out: *mut f32) {
    // SAFETY: as q4_0_q8_0_rows; layouts d@0 qs@2 (each block has 4 bytes at d).
    unsafe {
        lane_dot_rows!(nb, w, wrow, a, out, 34, 34, false, |ab| [_mm256_loadu_si256(ab.add(2).cast()), _mm256_setzero_si256()],
            |wb, y, _c| dot_i8_i8(_mm256_loadu_si256(wb.add(2).cast()), y))
    }
}

/// [`q5_0_q8_0`] for [`ROWS`] rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_0_q8_0_rows<const FAR_L1: bool>(nb: usize, w: *const u8, wrow: usize, a: *const u8, out: *mut f32) {
    // SAFETY: as q4_0_q8_0_rows; layouts d@0 qh@2 qs@6 and d@0 qs@2.
    unsafe {
        let off = _mm256_set1_epi8(16);
        lane_dot_rows!(nb, w, wrow, a, out, 22, 34, false, |ab| [_mm256_loadu_si256(ab.add(2).cast()), _mm256_setzero_si256()],
            |wb, y, _c| dot_u8_off_i8(_mm256_or_si256(nibbles(wb.add(6)), fifth_bits(wb.add(2))), off, y))
    }
}

/// [`q4_1_q8_1`] for [`ROWS`] rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_1_q8_1_rows<const FAR_L1: bool>(nb: usize, w: *const u8, wrow: usize, a: *const u8, out: *mut f32) {
    // SAFETY: as q4_0_q8_0_rows; layouts d@0 m@2 qs@4 and d@0 s@2 qs@4.
    unsafe {
        lane_dot_rows!(nb, w, wrow, a, out, 20, 36, true, |ab| [_mm256_loadu_si256(ab.add(4).cast()), _mm256_setzero_si256()],
            |wb, y, _c| dot_u8_i8(nibbles(wb.add(4)), y))
    }
}

/// [`q5_1_q8_1`] for [`ROWS`] rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_1_q8_1_rows<const FAR_L1: bool>(nb: usize, w: *const u8, wrow: usize, a: *const u8, out: *mut f32) {
    // SAFETY: as q4_0_q8_0_rows; layouts d@0 m@2 qh@4 qs@8 and d@0 s@2 qs@4.
    unsafe {
        lane_dot_rows!(nb, w, wrow, a, out, 24, 36, true, |ab| [_mm256_loadu_si256(ab.add(4).cast()), _mm256_setzero_si256()],
            |wb, y, _c| dot_u8_i8(_mm256_or_si256(nibbles(wb.add(8)), fifth_bits(wb.add(4))), y))
    }
}

// The 8-row kernels again with AVX-512 VNNI (`vpdpbusd` on 256-bit vectors, AVX512-VL):
// each lane is still the exact integer `Σ` of its four products, formed as `c + Σ u·s`
// with `u` unsigned and `c` a per-lane correction computed once per activation block
// (shared by every row), so every output keeps the bits of the single dot.

/// `-k·Σ y` per lane of four bytes (`k·Σ y` by `vpdpbusd` with k in every byte).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn neg_k_sums(k: i8, y: __m256i) -> __m256i {
    // SAFETY: value-only intrinsics; AVX-512 VNNI/VL available (target features).
    unsafe {
        let zero = _mm256_setzero_si256();
        _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(k), y))
    }
}

/// [`q8_0_q8_0`] for [`ROWS`] rows, AVX-512 VNNI: lanes `Σ w·y` as `Σ (w + 128)·y - 128·Σ y`
/// (the weight with its sign bits flipped is unsigned).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q8_0_q8_0_rows_vnni<const FAR_L1: bool>(nb: usize, w: *const u8, wrow: usize, a: *const u8, out: *mut f32) {
    // SAFETY: as q4_0_q8_0_rows; layouts d@0 qs@2 (each block has 4 bytes at d).
    unsafe {
        let flip = _mm256_set1_epi8(-128);
        lane_dot_rows!(nb, w, wrow, a, out, 34, 34, false,
            |ab| { let y = _mm256_loadu_si256(ab.add(2).cast()); [y, neg_k_sums(-128, y)] },
            |wb, y, c| _mm256_dpbusd_epi32(c, _mm256_xor_si256(_mm256_loadu_si256(wb.add(2).cast()), flip), y))
    }
}

/// [`q5_0_q8_0`] for [`ROWS`] rows, AVX-512 VNNI: lanes `Σ (q - 16)·y` as `Σ q·y - 16·Σ y`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q5_0_q8_0_rows_vnni<const FAR_L1: bool>(nb: usize, w: *const u8, wrow: usize, a: *const u8, out: *mut f32) {
    // SAFETY: as q4_0_q8_0_rows; layouts d@0 qh@2 qs@6 and d@0 qs@2.
    unsafe {
        lane_dot_rows_zmm!(nb, w, wrow, a, out, 22, 34, false,
            |ab| { let y = _mm256_loadu_si256(ab.add(2).cast()); [y, neg_k_sums(16, y)] },
            |wa, wb, y, c| _mm512_dpbusd_epi32(c, add_fifth_bits_pair(nibbles_pair(wa.add(6), wb.add(6)), wa.add(2), wb.add(2)), y))
    }
}

/// [`q4_1_q8_1`] for [`ROWS`] rows, AVX-512 VNNI: lanes `Σ q·y` directly.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q4_1_q8_1_rows_vnni<const FAR_L1: bool>(nb: usize, w: *const u8, wrow: usize, a: *const u8, out: *mut f32) {
    // SAFETY: as q4_0_q8_0_rows; layouts d@0 m@2 qs@4 and d@0 s@2 qs@4.
    unsafe {
        lane_dot_rows_zmm!(nb, w, wrow, a, out, 20, 36, true, |ab| [_mm256_loadu_si256(ab.add(4).cast()), _mm256_setzero_si256()],
            |wa, wb, y, c| _mm512_dpbusd_epi32(c, nibbles_pair(wa.add(4), wb.add(4)), y))
    }
}

/// [`q5_1_q8_1`] for [`ROWS`] rows, AVX-512 VNNI: lanes `Σ q·y` directly.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q5_1_q8_1_rows_vnni<const FAR_L1: bool>(nb: usize, w: *const u8, wrow: usize, a: *const u8, out: *mut f32) {
    // SAFETY: as q4_0_q8_0_rows; layouts d@0 m@2 qh@4 qs@8 and d@0 s@2 qs@4.
    unsafe {
        lane_dot_rows_zmm!(nb, w, wrow, a, out, 24, 36, true, |ab| [_mm256_loadu_si256(ab.add(4).cast()), _mm256_setzero_si256()],
            |wa, wb, y, c| _mm512_dpbusd_epi32(c, add_fifth_bits_pair(nibbles_pair(wa.add(8), wb.add(8)), wa.add(4), wb.add(4)), y))
    }
}

/// [`q4_0_q8_0`] for [`ROWS`] rows, AVX-512 VNNI: each row's sum `Σ (q - 8)·y` as
/// `Σ q·y - 8·Σ y` (the nibbles are unsigned), four blocks at a time: one word permute
/// gathers a row's four blocks of 16 packed bytes (from two loads: the blocks are 18 bytes
/// apart) into the four 128-bit quarters, and the low nibbles go through one `vpdpbusd`
/// with the four activation blocks' first 16 bytes (gathered the same way, once for the
/// eight rows), the high ones through a second with their last 16. Each (row, block) sum
/// is then four lanes, summed by two rounds of in-lane unpacks and adds, then one
/// two-source permute (integer sums: exact in any order) into one vector of rows per
/// block (the unpacks rather than three rounds of two-source permutes: on the AMD EPYC
/// Zen 4, where a 512-bit permute issues once a cycle and an unpack twice, 0.643 -> 0.592
/// ns per row and block from L1); the rows' scales come out
/// of the same loads by four more permutes and blends. So each row's fma chain has
/// [`table_dot_rows`]'s operands and order: the same bits. The blocks after the last four
/// go one at a time, four rows per vector (one row's 16 bytes per quarter by 128-bit
/// inserts). Measured on the AMD EPYC (Zen 5) with the weights in L1
/// (`quant::bench::bench_short_kernels`): 47 GB/s of weights one block at a time, 60
/// four at a time; the inserts and the scales' 8 general-register loads per block cost
/// the most.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q4_0_q8_0_rows_vnni<const FAR_L1: bool>(nb: usize, w: *const u8, wrow: usize, a: *const u8, out: *mut f32) {
    // SAFETY: as q4_0_q8_0_rows; AVX-512 F/BW/VL/VNNI available (target features). The
    // four-block loads stay inside the four blocks: a row's at bytes [18k, 18k + 64) and
    // [18k + 8, 18k + 72), the activation's at [34k + 2, 34k + 130) and [34k + 18, 34k + 136).
    unsafe {
        // Lanes 0, 2, .. (and 1, 3, ..) of two vectors: pairs of lanes summed.
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        let (m4, eights) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(8));
        // The (row, block) sums of blocks j = 0, 1 (`rows01`) or 2, 3 (`rows23`) to lanes
        // 8j + r, from rows 0-3 in lanes 4j + r of one vector and rows 4-7 of the other.
        let rows_of = |j0: i32| {
            let l = |i: i32| if i % 8 < 4 { 4 * (j0 + i / 8) + i % 8 } else { 16 + 4 * (j0 + i / 8) + i % 8 - 4 };
            _mm512_setr_epi32(l(0), l(1), l(2), l(3), l(4), l(5), l(6), l(7), l(8), l(9), l(10), l(11), l(12), l(13), l(14), l(15))
        };
        let (rows01, rows23) = (rows_of(0), rows_of(2));
        // Words of a row's four blocks (the first 64 bytes, then 64 from byte 8): block j's
        // 8 words of nibbles start at word 9j + 1.
        let qidx = {
            let mut v = [0i16; 32];
            for (i, x) in v.iter_mut().enumerate() {
                let wd = 9 * (i / 8) + 1 + i % 8;
                *x = if wd < 32 { wd as i16 } else { (32 + wd - 4) as i16 };
            }
            _mm512_loadu_si512(v.as_ptr().cast())
        };
        // Words of four activation blocks' halves (34 bytes apart) from two loads 64 bytes
        // apart (first halves) or 54 apart (last halves, ending with the fourth block).
        let (ylo_idx, yhi_idx) = {
            let (mut lo, mut hi) = ([0i16; 32], [0i16; 32]);
            for i in 0..32 {
                let wd = 17 * (i / 8) + i % 8;
                lo[i] = wd as i16;
                hi[i] = if wd < 32 { wd as i16 } else { (32 + wd - 27) as i16 };
            }
            (_mm512_loadu_si512(lo.as_ptr().cast()), _mm512_loadu_si512(hi.as_ptr().cast()))
        };
        // Scales of rows 2i (first source) and 2i + 1 (second) to words 8j + 2i and
        // 8j + 2i + 1 (the other words: don't care, blended away).
        let didx = [0usize, 2, 4, 6].map(|r0| {
            let mut v = [0i16; 32];
            for (i, x) in v.iter_mut().enumerate() {
                let (j, r) = (i / 8, i % 8);
                *x = if r == r0 + 1 { 32 + 9 * j as i16 } else { 9 * j as i16 };
            }
            _mm512_loadu_si512(v.as_ptr().cast())
        });
        let mut acc = _mm256_setzero_ps();
        let mut k = 0;
        while k + 4 <= nb {
            let ab = a.add(k * 34);
            let ylo = _mm512_permutex2var_epi16(_mm512_loadu_si512(ab.add(2).cast()), ylo_idx, _mm512_loadu_si512(ab.add(66).cast()));
            let yhi = _mm512_permutex2var_epi16(_mm512_loadu_si512(ab.add(18).cast()), yhi_idx, _mm512_loadu_si512(ab.add(72).cast()));
            let c = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), eights, ylo), eights, yhi));
            // Row r's first 64 bytes (its four scales: words 0, 9, 18, 27) and sums.
            let head = |r: usize| _mm512_loadu_si512(w.add(r * wrow + k * 18).cast());
            let h = [head(0), head(1), head(2), head(3), head(4), head(5), head(6), head(7)];
            let row = |r: usize| {
                let q = _mm512_permutex2var_epi16(h[r], qidx, _mm512_loadu_si512(w.add(r * wrow + k * 18 + 8).cast()));
                let (lo, hi) = (_mm512_and_si512(q, m4), _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4));
                _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(c, lo, ylo), hi, yhi)
            };
            // Rows x, y's lanes summed in pairs, per quarter [x, y, x, y] (in-lane unpacks).
            let pair = |x: __m512i, y: __m512i| _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y));
            // Two such pairs' halves summed: per quarter j [w, x, y, z]'s block-j sums.
            let quad = |wx: __m512i, yz: __m512i| _mm512_add_epi32(_mm512_unpacklo_epi64(wx, yz), _mm512_unpackhi_epi64(wx, yz));
            for j in 0..4 {
                prefetch_next_rows::<true, FAR_L1>(w, wrow, k + j, nb);
            }
            // The 32 weight scales, word 8j + r: rows 2i, 2i + 1 by one permute each
            // (into their own words), then blends.
            let d01 = _mm512_mask_blend_epi16(0xCCCC_CCCC, _mm512_permutex2var_epi16(h[0], didx[0], h[1]), _mm512_permutex2var_epi16(h[2], didx[1], h[3]));
            let d45 = _mm512_mask_blend_epi16(0xCCCC_CCCC, _mm512_permutex2var_epi16(h[4], didx[2], h[5]), _mm512_permutex2var_epi16(h[6], didx[3], h[7]));
            let dw = _mm512_mask_blend_epi16(0xF0F0_F0F0, d01, d45);
            let (dw01, dw23) = (_mm512_cvtph_ps(_mm512_castsi512_si256(dw)), _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(dw)));
            // The four activation scales, each in 8 lanes (blocks 0, 1 and 2, 3).
            let da = {
                let half = |j: usize| rd16(ab.add(j * 34)) as u16 as u64;
                let four = half(0) | half(1) << 16 | half(2) << 32 | half(3) << 48;
                _mm512_castps256_ps512(_mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi64_si128(four as i64)))) // (F16C: exact)
            };
            let p01 = _mm512_mul_ps(dw01, _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), da));
            let p23 = _mm512_mul_ps(dw23, _mm512_permutexvar_ps(_mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3), da));
            // Rows 0-3 (then 4-7), lanes 4j + r: each (row, block)'s four lanes summed.
            let r03 = quad(pair(row(0), row(1)), pair(row(2), row(3)));
            let r47 = quad(pair(row(4), row(5)), pair(row(6), row(7)));
            let s01 = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(r03, rows01, r47));
            let s23 = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(r03, rows23, r47));
            let hi = |v: __m512| _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            acc = _mm256_fmadd_ps(_mm512_castps512_ps256(s01), _mm512_castps512_ps256(p01), acc);
            acc = _mm256_fmadd_ps(hi(s01), hi(p01), acc);
            acc = _mm256_fmadd_ps(_mm512_castps512_ps256(s23), _mm512_castps512_ps256(p23), acc);
            acc = _mm256_fmadd_ps(hi(s23), hi(p23), acc);
            k += 4;
        }
        // Rows r..r + 4 of block k: row r + i's 16 bytes in quarter i.
        let quad = |r: usize, k: usize| {
            let p = |i: usize| _mm_loadu_si128(w.add((r + i) * wrow + k * 18 + 2).cast());
            let lo = _mm512_inserti32x4::<1>(_mm512_castsi128_si512(p(0)), p(1));
            _mm512_inserti32x4::<3>(_mm512_inserti32x4::<2>(lo, p(2)), p(3))
        };
        while k < nb {
            let ab = a.add(k * 34);
            prefetch_next_rows::<true, FAR_L1>(w, wrow, k, nb);
            // The activation's first and last 16 bytes in every quarter; `c`: per lane
            // `-8·Σ y` over the lane's bytes of both.
            let (ylo, yhi) = (_mm512_broadcast_i32x4(_mm_loadu_si128(ab.add(2).cast())), _mm512_broadcast_i32x4(_mm_loadu_si128(ab.add(18).cast())));
            let c = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), eights, ylo), eights, yhi));
            let lanes = |q: __m512i| {
                let (lo, hi) = (_mm512_and_si512(q, m4), _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4));
                _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(c, lo, ylo), hi, yhi)
            };
            let (za, zb) = (lanes(quad(0, k)), lanes(quad(4, k)));
            // Rows 0-7: 2 partial sums each (row r in lanes 2r, 2r + 1), then one.
            let t = _mm512_add_epi32(_mm512_permutex2var_epi32(za, even, zb), _mm512_permutex2var_epi32(za, odd, zb));
            let s = _mm512_cvtepi64_epi32(_mm512_add_epi32(t, _mm512_srli_epi64::<32>(t)));
            let da = _mm256_cvtph_ps(_mm_set1_epi16(rd16(ab))); // (F16C: exact)
            let dw = f16_scales(w, wrow, k * 18);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, da), acc);
            k += 1;
        }
        _mm256_storeu_ps(out, acc);
    }
}

/// Groups of [`ROWS`] rows between the group being multiplied and the one
/// [`prefetch_next_rows`] asks for. Chosen by measurement on the Xeon (AVX512-FP16, kernel
/// set `avx2+vnni+fp16`), SmolLM2 Q8_0 and Gemma 3 270M tg at 1 and 2 threads: into L2,
/// 1 to 6 groups ahead decode at about the same speed (2 a little ahead at 2 threads);
/// into L1 (`prefetcht0`, the previous choice: 1 group) 15-30% slower at 1 to 3 groups;
/// `prefetchnta` half as fast (BENCHMARKS.md, "Decode: prefetch into L2"). The same
/// choice serves the AVX2 8-row kernels (not measured apart: this machine runs the VNNI
/// ones). Re-checked 2026-11-26 with the hints spread over both 4-row passes, three per
/// call: 1 to 4 groups ahead stream a 1 GiB Q8_0 product at 13.0-13.5 GB/s on one
/// thread alike (the AVX-512 read loop: 14.3-14.7).
const PREFETCH_GROUPS: usize = 2;

/// The least distance in bytes, and the cache level, of [`prefetch_next_rows`] for the
/// kernels of the types with weight blocks of at most [`FAR_BLOCK`] bytes (Q4_0, Q4_1,
/// IQ4_NL, MXFP4, Q5_0), whose [`PREFETCH_GROUPS`] groups are only 5-7 KiB at 576 or 640
/// columns. Measured on the AMD EPYC (Zen 5, `avx2+vnni`), one thread, alternating
/// binaries five or six times (BENCHMARKS.md, "Speed II on the AMD EPYC, second
/// session"): SmolLM2 Q4_1 tg128 320 -> 357 t/s (two threads 486 -> 513), Gemma 3 (its
/// Q5_0 matrices) 127 -> 130, SmolLM2 Q4_0 unchanged; the same for Q8_0's blocks moved
/// SmolLM2 Q8_0 by +2% and Gemma 3 by -2%, so Q8_0 (and Q5_1, not measured) stay at
/// [`PREFETCH_GROUPS`] into L2. Re-measured there in the fourth session (tg128,
/// alternating binaries five times, medians): 16 KiB rather than 10 KiB, SmolLM2 Q4_0 one
/// thread +1.6 to +2.4% in three sets, two threads +8%, Q4_1 +1.1% / +2%, Gemma 3 level;
/// 6 KiB -11%, 20 KiB +0.8%, 24 KiB -4%, 32 KiB -6%.
///
/// Into L1 only where the L1 data cache holds 48 KiB or more (Zen 5, the Xeons with
/// AVX512-FP16): on the AMD EPYC Zen 4 (32 KiB, `avx2+vnni`) 16 KiB ahead into L1 is half
/// the cache, and the same distance into L2 decodes SmolLM2 Q4_0 at 225-235 t/s rather
/// than 163-175 on one thread, 304-375 rather than ~200 on two, Q4_1 +22% on one thread
/// (BENCHMARKS.md, "Speed II on the AMD EPYC Zen 4"). The kernels take the level as their
/// `FAR_L1` parameter; [`super::table`] picks it by [`super::cpu_l1d_bytes`]. Where the
/// far hints go into L2, a second set brings the same lines into L1 [`NEAR_L1_BYTES`]
/// ahead.
const FAR_BYTES: usize = 16384;

/// Where the far hints go into L2 (an L1 data cache under 48 KiB), the distance of a
/// second set of hints into L1 (the lines the far ones brought into L2). On the AMD EPYC
/// Zen 4, tg128 medians of four alternations: SmolLM2 Q4_0 two threads 283 -> 323 t/s
/// (4 of 4 faster), Q4_1 271 -> 299 (4 of 4), one thread +1-2%, Gemma 3 level; 1 and
/// 2 KiB gave less.
const NEAR_L1_BYTES: usize = 4096;

/// The widest weight block (bytes per 32 weights) whose kernels prefetch [`FAR_BYTES`] ahead.
const FAR_BLOCK: usize = 22;

/// Prefetches part `k` of `parts` of the [`ROWS`] rows [`PREFETCH_GROUPS`] groups after
/// the group at `w` (rows `wrow` bytes apart) into L2 (with `FAR`: at least
/// [`FAR_BYTES`] after it, into L1 with `FAR_L1`, else into L2 and again into L1
/// [`NEAR_L1_BYTES`] after it): called once per block of each pass over the group
/// (`parts` calls in all), it keeps the weights streaming in while this group computes,
/// a line or two per call and each line about once. (A hint only: it cannot fault, so
/// the rows may lie past the weights.)
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn prefetch_next_rows<const FAR: bool, const FAR_L1: bool>(w: *const u8, wrow: usize, k: usize, parts: usize) {
    let level = if FAR && FAR_L1 { Level::L1 } else { Level::L2 };
    let groups = PREFETCH_GROUPS * ROWS * wrow;
    let next = w.wrapping_add(if FAR { groups.max(FAR_BYTES) } else { groups });
    let step = (ROWS * wrow).div_ceil(parts.max(1));
    // Part k's lines from `at` into `level`. (The kernels' case, 80 to 144 bytes a call:
    // three hints, no loop: the parts [k·step, (k + 1)·step) are contiguous, so the line
    // of each part's start and the two after it cover every line; a loop's branches and
    // counters here cost the decode kernels 10-15% of their streaming rate on the Xeon VM.)
    let hint = |at: *const u8, level: Level| {
        if step <= 192 {
            for off in [0, 64, 128] {
                prefetch::lines(at.wrapping_add(off), 1, level);
            }
        } else {
            prefetch::lines(at, step, level);
        }
    };
    hint(next.wrapping_add(k * step), level);
    if FAR && !FAR_L1 {
        hint(w.wrapping_add(NEAR_L1_BYTES + k * step), Level::L1);
    }
}

/// The f16 scales at byte `off` of [`ROWS`] rows `wrow` bytes apart, as f32 (F16C's
/// conversion is exact, as `f16_to_f32`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_scales(w: *const u8, wrow: usize, off: usize) -> __m256 {
    // SAFETY: as f16_scales_in.
    unsafe { f16_scales_in(w, wrow, off, [0, 1, 2, 3, 4, 5, 6, 7]) }
}

/// [`f16_scales`] with lane l taken from row `rows[l]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_scales_in(w: *const u8, wrow: usize, off: usize, rows: [usize; ROWS]) -> __m256 {
    // SAFETY: the caller guarantees 2 readable bytes at off in each of the ROWS rows.
    // (Packed four to a u64 in general registers, then one insert: inserting the eight
    // halves one by one would cost seven shuffle-port uops per block.)
    unsafe {
        let h = |l: usize| rd16(w.add(rows[l] * wrow + off)) as u16 as u64;
        let lo = h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48;
        let hi = h(4) | h(5) << 16 | h(6) << 32 | h(7) << 48;
        _mm256_cvtph_ps(_mm_set_epi64x(hi as i64, lo as i64))
    }
}

/// [`q4_0_q8_0`] for [`ROWS`] rows, AVX2: [`table_dot_rows`]'s per-block operations on
/// the same exact integer sums `Σ (q - 8)·y`, formed with fewer multiplies and no
/// horizontal adds. Two rows share a vector (row 2p in the low 128 bits, 2p + 1 in the
/// high): their low nibbles (elements 0-15) go through one `maddubs` with the activation's
/// first 16 bytes in both halves, the high nibbles (16-31) through a second with its last
/// 16, and the two are added: each word is a row's `Σ q·y` over four elements (at most
/// 4·15·128). The same for the activation with 8 in every weight byte gives `8·Σ y` per
/// word, subtracted once per block for every pair: words of `Σ (q - 8)·y` over four
/// elements (at most 4·8·128). `madd` with ones widens them to i32 sums of eight, and
/// two rounds of unpacks and adds leave row r's whole sum in lane [`Q4_0_LANE_ROWS`]`[r]`
/// (integer sums: exact in any order). The rows' scales are gathered in that lane order
/// and the accumulator is put back in row order once, after the last block. (On the AMD
/// EPYC Zen 3, AVX2 only, from L1, `bench_rows16`: 1.39-1.43 -> 0.93-0.94 ns per row and
/// block; SmolLM2 Q4_0 tg128 one thread 90-99 -> 105-116 t/s.)
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_0_q8_0_rows<const FAR_L1: bool>(nb: usize, w: *const u8, wrow: usize, a: *const u8, out: *mut f32) {
    // SAFETY: the wrapper checked that ROWS rows of nb blocks, nb activation blocks and
    // ROWS outputs are in bounds; layouts d@0 qs@2.
    unsafe {
        let (m4, eights, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(8), _mm256_set1_epi16(1));
        let mut acc = _mm256_setzero_ps();
        for k in 0..nb {
            let ab = a.add(k * 34);
            let (ylo, yhi) = (_mm256_broadcastsi128_si256(_mm_loadu_si128(ab.add(2).cast())), _mm256_broadcastsi128_si256(_mm_loadu_si128(ab.add(18).cast())));
            let c = _mm256_add_epi16(_mm256_maddubs_epi16(eights, ylo), _mm256_maddubs_epi16(eights, yhi));
            prefetch_next_rows::<{ 18 <= FAR_BLOCK }, FAR_L1>(w, wrow, k, nb);
            // Rows 2p, 2p + 1: 8 i32 lanes, four of each row (low half row 2p).
            let pair = |p: usize| {
                let q0 = w.add(2 * p * wrow + k * 18 + 2);
                let q = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(_mm_loadu_si128(q0.cast())), _mm_loadu_si128(q0.add(wrow).cast()));
                let lo = _mm256_maddubs_epi16(_mm256_and_si256(q, m4), ylo);
                let hi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16::<4>(q), m4), yhi);
                _mm256_madd_epi16(_mm256_sub_epi16(_mm256_add_epi16(lo, hi), c), ones)
            };
            let (p0, p1, p2, p3) = (pair(0), pair(1), pair(2), pair(3));
            // [r0, r2, r0, r2 | r1, r3, r1, r3] and [r4, r6, .. | r5, r7, ..], then
            // [r0, r2, r4, r6 | r1, r3, r5, r7].
            let t = _mm256_add_epi32(_mm256_unpacklo_epi32(p0, p1), _mm256_unpackhi_epi32(p0, p1));
            let u = _mm256_add_epi32(_mm256_unpacklo_epi32(p2, p3), _mm256_unpackhi_epi32(p2, p3));
            let s = _mm256_add_epi32(_mm256_unpacklo_epi64(t, u), _mm256_unpackhi_epi64(t, u));
            let da = _mm256_cvtph_ps(_mm_set1_epi16(rd16(ab))); // (F16C: exact)
            let dw = f16_scales_in(w, wrow, k * 18, Q4_0_LANE_ROWS);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, da), acc);
        }
        // Lane l holds row Q4_0_LANE_ROWS[l]: back to row order.
        _mm256_storeu_ps(out, _mm256_permutevar8x32_ps(acc, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
}

/// The row in each lane of [`q4_0_q8_0_rows`]'s sums and accumulator.
const Q4_0_LANE_ROWS: [usize; ROWS] = [0, 2, 4, 6, 1, 3, 5, 7];

/// [`iq4_nl_q8_0`] for [`ROWS`] rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn iq4_nl_q8_0_rows<const FAR_L1: bool>(nb: usize, w: *const u8, wrow: usize, a: *const u8, out: *mut f32) {
    // SAFETY: as q4_0_q8_0_rows.
    unsafe {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
        table_dot_rows!(nb, w, wrow, a, out, 18, 2, |k| f16_scales(w, wrow, k * 18),
            |ab| [_mm256_loadu_si256(ab.add(2).cast()), _mm256_setzero_si256()],
            |idx, y, _c| dot_i8_i8(_mm256_shuffle_epi8(table, idx), y))
    }
}

/// [`mxfp4_q8_0`] for [`ROWS`] rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mxfp4_q8_0_rows<const FAR_L1: bool>(nb: usize, w: *const u8, wrow: usize, a: *const u8, out: *mut f32) {
    // SAFETY: as q4_0_q8_0_rows; layout e@0 qs@1.
    unsafe {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_MXFP4.as_ptr().cast()));
        table_dot_rows!(nb, w, wrow, a, out, 17, 1, |k| {
            let e = |r: usize| e8m0_to_f32_half(*w.add(r * wrow + k * 17));
            _mm256_setr_ps(e(0), e(1), e(2), e(3), e(4), e(5), e(6), e(7))
        },
            |ab| [_mm256_loadu_si256(ab.add(2).cast()), _mm256_setzero_si256()],
            |idx, y, _c| dot_i8_i8(_mm256_shuffle_epi8(table, idx), y))
    }
}


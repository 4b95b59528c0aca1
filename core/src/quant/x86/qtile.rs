//! Tiles of dots for batches: [`TILE_ROWS`] weight rows × [`TILE_TOKENS`] activation
//! rows at once, so each weight block is loaded and decoded once for several tokens and
//! each activation block once for several rows. Every (row, token) output keeps its own
//! accumulator and goes through exactly the operations of the single dot in `qdot.rs`
//! (same integer lane sums — integer arithmetic is exact, so sharing the weight decode or
//! the `maddubs(offset, y)` correction between pairs changes nothing —, the same
//! `dw·da` product, the same fma per block in block order, the same horizontal sum), so
//! a tile gives each dot's bits (tested against the dots).
//!
//! Types: Q8_0 · Q8_0, Q5_0 · Q8_0, Q4_1 · Q8_1 (llama.cpp's one-accumulator `vec_dot`
//! order, which its batches also follow for these types).

// Pairs are indexed (row, token) on purpose; the per-pair hook is `()` for most types.
#![allow(clippy::needless_range_loop, clippy::no_effect, clippy::unused_unit)]

use core::arch::x86_64::*;

use super::hsum_ps;
use super::qdot::{dot_u8_i8, fifth_bits, nibbles, scale_pairs};

/// Weight rows per tile.
pub(crate) const TILE_ROWS: usize = 4;
/// Activation rows (tokens) per tile.
pub(crate) const TILE_TOKENS: usize = 4;

/// The shared tile loop of the one-accumulator types. Per block `i`: the four tokens'
/// scale pairs are converted together (`fa = [da_t, sa_t]..`), and so are the four rows'
/// (`[dw_r, mw_r]..`); for each token `$prep_a` (with `$ab` the activation block) gives
/// two vectors `[y, c]`; for each row `$prep_w` (with `$wb` the weight block) the decoded
/// weight `$x`, then the row's products `dw_r·da_t` in one multiply (lanes 2t) and, for
/// `$min` types, `summs[r] = fma(mw_r, sa_t, summs[r])` in one fma (lanes 2t + 1); per
/// pair `$lanes` (8 exact i32 sums of `$x` and `$y`, `$c`) and
/// `acc = fma(dw·da, f32(lanes), acc)`. Every product and fma is the single dot's, per
/// pair, in block order. Scalars reach the vectors by broadcast loads from small stack
/// arrays (no shuffle uops: the shuffle port is what these loops run short of). Leaves
/// the accumulators in `$acc` and `$summs`.
macro_rules! lane_tile {
    ($nb:expr, $w:expr, $ws:expr, $wrow:expr, $a:expr, $as:expr, $arow:expr, $acc:ident, $summs:ident, $min:expr,
     |$ab:ident| $prep_a:expr, |$wb:ident| $prep_w:expr, |$x:ident, $y:ident, $c:ident| $lanes:expr) => {{
        let (nb, w, a) = ($nb, $w, $a);
        for i in 0..nb {
            let fa = scale_pairs(a.add(i * $as), $arow);
            let mut fw = [0.0f32; 8];
            _mm256_storeu_ps(fw.as_mut_ptr(), scale_pairs(w.add(i * $ws), $wrow));
            let mut ya = [[_mm256_setzero_si256(); 2]; TILE_TOKENS];
            for t in 0..TILE_TOKENS {
                let $ab = a.add(t * $arow + i * $as);
                ya[t] = $prep_a;
            }
            for r in 0..TILE_ROWS {
                let $wb = w.add(r * $wrow + i * $ws);
                let $x = $prep_w;
                let mut d = [0.0f32; 8];
                _mm256_storeu_ps(d.as_mut_ptr(), _mm256_mul_ps(_mm256_broadcast_ss(&fw[2 * r]), fa)); // lane 2t: dw_r·da_t
                if $min {
                    $summs[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&fw[2 * r + 1]), fa, $summs[r]);
                }
                for t in 0..TILE_TOKENS {
                    let [$y, $c] = ya[t];
                    $acc[r][t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&d[2 * t]), _mm256_cvtepi32_ps($lanes), $acc[r][t]);
                }
            }
        }
    }};
}

// Each body: `nb` blocks in each of TILE_ROWS weight rows from `w` (stride `wrow`
// bytes) and TILE_TOKENS activation rows from `a` (stride `arow`), all in bounds, and
// `out[t * ostride + r]` writable for every r < TILE_ROWS, t < TILE_TOKENS (the
// wrapper's SAFETY argument); AVX2, FMA and F16C available.

/// Q8_0 · Q8_0 tile: each pair as `qdot::q8_0_q8_0` (sign trick).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_q8_0(nb: usize, w: *const u8, wrow: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: see above; layout d@0 qs@2 for both.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); TILE_TOKENS]; TILE_ROWS];
        let mut summs = [_mm256_setzero_ps(); TILE_ROWS];
        lane_tile!(nb, w, 34, wrow, a, 34, arow, acc, summs, false,
            |ab| [_mm256_loadu_si256(ab.add(2).cast()), _mm256_setzero_si256()],
            |wb| _mm256_loadu_si256(wb.add(2).cast()),
            |x, y, _c| dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)));
        let _ = summs;
        for r in 0..TILE_ROWS {
            for t in 0..TILE_TOKENS {
                *out.add(t * ostride + r) = hsum_ps(acc[r][t]);
            }
        }
    }
}

/// Q5_0 · Q8_0 tile: each pair as `qdot::q5_0_q8_0`; its lanes
/// `madd(maddubs(x, y) - maddubs(16, y), 1)` as `madd(maddubs(x, y), 1) - c` with
/// `c = madd(maddubs(16, y), 1)` per token (the same exact integers).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_0_q8_0(nb: usize, w: *const u8, wrow: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: see above; layouts d@0 qh@2 qs@6 and d@0 qs@2.
    unsafe {
        let off = _mm256_set1_epi8(16);
        let mut acc = [[_mm256_setzero_ps(); TILE_TOKENS]; TILE_ROWS];
        let mut summs = [_mm256_setzero_ps(); TILE_ROWS];
        lane_tile!(nb, w, 22, wrow, a, 34, arow, acc, summs, false,
            |ab| {
                let y = _mm256_loadu_si256(ab.add(2).cast());
                [y, dot_u8_i8(off, y)]
            },
            |wb| _mm256_or_si256(nibbles(wb.add(6)), fifth_bits(wb.add(2))),
            |x, y, c| _mm256_sub_epi32(dot_u8_i8(x, y), c));
        let _ = summs;
        for r in 0..TILE_ROWS {
            for t in 0..TILE_TOKENS {
                *out.add(t * ostride + r) = hsum_ps(acc[r][t]);
            }
        }
    }
}

/// Q4_1 · Q8_1 tile: each pair as `qdot::q4_1_q8_1` (`summs = fma(mw, sa, summs)` per
/// block, result `hsum(acc) + summs`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_1_q8_1(nb: usize, w: *const u8, wrow: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: see above; layouts d@0 m@2 qs@4 and d@0 s@2 qs@4.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); TILE_TOKENS]; TILE_ROWS];
        let mut summs = [_mm256_setzero_ps(); TILE_ROWS];
        lane_tile!(nb, w, 20, wrow, a, 36, arow, acc, summs, true,
            |ab| [_mm256_loadu_si256(ab.add(4).cast()), _mm256_setzero_si256()],
            |wb| nibbles(wb.add(4)),
            |x, y, _c| dot_u8_i8(x, y));
        for r in 0..TILE_ROWS {
            let mut m = [0.0f32; 8];
            _mm256_storeu_ps(m.as_mut_ptr(), summs[r]);
            for t in 0..TILE_TOKENS {
                *out.add(t * ostride + r) = hsum_ps(acc[r][t]) + m[2 * t + 1];
            }
        }
    }
}

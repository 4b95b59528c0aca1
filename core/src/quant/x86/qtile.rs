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
//! order, which its batches also follow for these types): on AVX2
//! [`LANES8_TILE_ROWS`] rows in the lanes of a vector × [`LANES8_TILE_TOKENS`] tokens
//! (`lanes8_tile`; [`LANES8_REST_TOKENS`] for a chunk's last tokens); with AVX-512 VNNI,
//! Q4_1 [`TILE_ROWS`] × [`ZMM_TILE_TOKENS`]
//! (two tokens per 512-bit vector), Q8_0 and Q5_0 [`LANES_TILE_ROWS`] rows in the lanes
//! of a vector × [`LANES_TILE_TOKENS`] tokens (`lanes_tile`). Q4_0 · Q8_0 (llama.cpp's
//! repacked order: one exact sum per block): 8 rows in the lanes of a vector × 32
//! tokens in passes of 4 (AVX2; 4 for a chunk's last tokens), or × 16 tokens two to a
//! 512-bit vector (AVX-512 VNNI).

// Pairs are indexed (row, token) on purpose; the per-pair hook is `()` for most types.
#![allow(clippy::needless_range_loop, clippy::no_effect, clippy::unused_unit)]

use core::arch::x86_64::*;

use super::hsum_ps;
use super::qdot::{neg_k_sums, nibbles, scale_pairs};

/// Weight rows per tile.
pub(crate) const TILE_ROWS: usize = 4;
/// Activation rows (tokens) per tile.
pub(crate) const TILE_TOKENS: usize = 4;

/// `*p` in all 8 lanes by a broadcast load (a load-port uop only). `_mm256_broadcast_ss`
/// of a value the compiler has just stored becomes a shuffle from the register instead,
/// and on the AMD Zen 3 that shuffle shares a vector pipe with the tile's fmas and
/// multiplies.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn broadcast_load(p: &f32) -> __m256 {
    let v: __m256;
    // SAFETY: reads the 4 bytes of `*p` only; AVX present (target features).
    unsafe {
        core::arch::asm!("vbroadcastss {v}, dword ptr [{p}]", v = out(ymm_reg) v, p = in(reg) p as *const f32, options(pure, readonly, nostack, preserves_flags));
    }
    v
}

/// The (unaligned) dword at `p` in all 8 lanes by a broadcast load, for the reason of
/// [`broadcast_load`]: the compiler turns consecutive `_mm256_set1_epi32` of nearby
/// dwords into one load and a shuffle and a broadcast per dword.
///
/// # Safety
/// 4 bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn broadcast_dword(p: *const u8) -> __m256i {
    let v: __m256i;
    // SAFETY: reads the 4 bytes at `p` only (the caller's contract); AVX2 present.
    unsafe {
        core::arch::asm!("vpbroadcastd {v}, dword ptr [{p}]", v = out(ymm_reg) v, p = in(reg) p, options(pure, readonly, nostack, preserves_flags));
    }
    v
}

/// Weight rows of a Q4_0 tile: one per lane of a vector.
pub(crate) const Q4_0_TILE_ROWS: usize = 8;
/// Tokens of the narrower AVX2 Q4_0 tile, and of each pass of the wide one (its 16
/// vector registers hold the 8 decoded weight vectors and 4 accumulators).
pub(crate) const Q4_0_TILE_TOKENS: usize = 4;
/// Tokens of the wide AVX2 Q4_0 tile: [`Q4_0_TILE_TOKENS`] per pass, each block's
/// transposed weights, correction and scales from the first pass kept for the others.
/// (AMD EPYC Zen 3, one thread, `quant::bench::bench_matmul`: 88-92 GFLOP/s with the
/// 4-token tile alone, 100-138 with 16 tokens, 136-148 with 32.)
pub(crate) const Q4_0_WIDE_TILE_TOKENS: usize = 32;
/// Tokens of the narrower AVX-512 VNNI Q4_0 tile (two per 512-bit vector: 8 weight
/// vectors, 8 accumulators), for a chunk's tokens after its whole 32-token tiles.
pub(crate) const Q4_0_TILE_TOKENS_VNNI: usize = 16;
/// Tokens of the AVX-512 VNNI Q4_0 tile (8 weight vectors, 16 accumulators): each block's
/// weights decoded once for 32 tokens.
pub(crate) const Q4_0_TILE_TOKENS_VNNI32: usize = 32;

/// The `qs` at `p` of [`Q4_0_TILE_ROWS`] Q4_0 blocks `wrow` bytes apart, transposed:
/// `x[j]` holds, in lane r, row r's elements `4j..4j + 4` (j < 4) or `16 + 4(j - 4)..`
/// (j ≥ 4) as signed bytes `q - 8`; and the byte sum of the eight (each byte within
/// -64..=56).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_transposed(p: *const u8, wrow: usize) -> ([__m256i; 8], __m256i) {
    // SAFETY: the caller guarantees 16 readable bytes at p + k·wrow, k < 8.
    unsafe {
        q4_0_signed(nibbles_transposed(p, wrow))
    }
}

/// Q4_0's nibbles `n` (as [`q4_0_transposed`] lays them out) as signed bytes `q - 8`, and
/// the byte sum of the eight vectors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_signed(n: [__m256i; 8]) -> ([__m256i; 8], __m256i) {
    // SAFETY: value-only intrinsics; AVX2 available (target features).
    unsafe {
        let eight = _mm256_set1_epi8(8);
        let x = n.map(|n| _mm256_sub_epi8(n, eight));
        let s8 = _mm256_add_epi8(
            _mm256_add_epi8(_mm256_add_epi8(x[0], x[1]), _mm256_add_epi8(x[2], x[3])),
            _mm256_add_epi8(_mm256_add_epi8(x[4], x[5]), _mm256_add_epi8(x[6], x[7])),
        );
        (x, s8)
    }
}

/// The nibbles of half `h` (rows 8h..8h + 8) of a rows16 group block's four chunks of
/// packed bytes at `q` (chunk c: row r's packed dword c at bytes 4r..4r + 4), laid out
/// as [`nibbles_transposed`]'s: the layout holds them transposed already.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles_rows16(q: *const u8, h: usize) -> [__m256i; 8] {
    // SAFETY: the caller guarantees the four chunks (256 bytes) at q readable; h < 2.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let v: [__m256i; 4] = core::array::from_fn(|c| _mm256_loadu_si256(q.add(64 * c + 32 * h).cast()));
        core::array::from_fn(|j| if j < 4 { _mm256_and_si256(v[j], m4) } else { _mm256_and_si256(_mm256_srli_epi16::<4>(v[j - 4]), m4) })
    }
}

/// The Q4_0 tile loop: [`Q4_0_TILE_ROWS`] rows in the lanes of a vector, `$tokens`
/// tokens. Per block, in block order: the 8 rows' nibbles are transposed so that
/// vector `x[j]` holds, in lane r, row r's elements `4j..4j + 4` as signed bytes
/// `q - 8`; each token's activation block is stored with its sign bits flipped
/// (`y + 128`, unsigned) so that four of its bytes at a time can be broadcast by a
/// load; then per token `$sumi` forms every row's exact integer `Σ (q - 8)·y` as
/// `Σ x·(y + 128) - 128·Σ x` (the correction `$corr` = `128·Σ x` per row, computed once
/// per block from the byte sum `$s8` of the `x[j]`), and per lane
/// `acc_t = fma(f32(sumi), dw·da_t, acc_t)`. These are the single dot's operations
/// (`qdot::q4_0_q8_0`, llama.cpp's repacked order: one exact sum per block, one fma
/// per block in block order) on the same values, so each output has its bits. Integer
/// bounds: |q - 8| ≤ 8 and y + 128 ≤ 255 (activations are within ±127), so a
/// `maddubs` pair is at most 4080 in magnitude and eight of them 32640 (no i16
/// saturation); each byte of `$s8` is within -64..=56.
macro_rules! q4_0_tile {
    ($nb:expr, $rows:expr, $a:expr, $arow:expr, $out:expr, $ostride:expr, $tokens:ident, $pass:ident, $group:expr, |$fg:ident, $fi:ident| $fetch:expr,
     |$s8:ident| $corr:expr, |$nc:ident, $xs:ident, $yg:ident| $sums:expr) => {{
        let (nb, rows, a, arow, out, ostride) = ($nb, $rows, $a, $arow, $out, $ostride);
        const { assert!($tokens.is_multiple_of($pass) && $pass.is_multiple_of($group)) };
        // Each block's transposed weights, correction and scales from a group's first
        // pass, for its others.
        let mut kept = core::mem::MaybeUninit::<[([__m256i; 8], __m256i, __m256); Q4_0_STAGE_BLOCKS]>::uninit();
        let keptp = kept.as_mut_ptr().cast::<([__m256i; 8], __m256i, __m256)>();
        let flip = _mm256_set1_epi8(-128);
        // The tokens' blocks prepared once per range of Q4_0_STAGE_BLOCKS blocks for
        // every group of rows (flipped activations, scales as f32); each group's
        // accumulators go through `out` between ranges (f32 stores and loads are exact,
        // so every output still sees its fmas in block order).
        let mut yu = core::mem::MaybeUninit::<[[[i32; 8]; $tokens]; Q4_0_STAGE_BLOCKS]>::uninit();
        let mut da = core::mem::MaybeUninit::<[[f32; $tokens]; Q4_0_STAGE_BLOCKS]>::uninit();
        let (yup, dap) = (yu.as_mut_ptr().cast::<[[i32; 8]; $tokens]>(), da.as_mut_ptr().cast::<[f32; $tokens]>());
        let mut b0 = 0;
        while b0 < nb {
            let kb = (nb - b0).min(Q4_0_STAGE_BLOCKS);
            // (Entries 0..kb are written here before any read below.)
            for ib in 0..kb {
                let i = b0 + ib;
                let (yb, db) = (&mut *yup.add(ib), &mut *dap.add(ib));
                for t in 0..$tokens {
                    let y = _mm256_loadu_si256(a.add(t * arow + i * 34 + 2).cast());
                    _mm256_storeu_si256(yb[t].as_mut_ptr().cast(), _mm256_xor_si256(y, flip));
                }
                let mut q = 0;
                while q + 8 <= $tokens {
                    _mm256_storeu_ps(db.as_mut_ptr().add(q), f16x8(a.add(q * arow + i * 34), arow));
                    q += 8;
                }
                while q + 4 <= $tokens {
                    _mm_storeu_ps(db.as_mut_ptr().add(q), f16x4(a.add(q * arow + i * 34), arow));
                    q += 4;
                }
            }
            for g in (0..rows).step_by(Q4_0_TILE_ROWS) {
                let out = out.add(g);
                // Passes of `$pass` tokens (accumulators in registers); the first
                // transposes each block and keeps the result for the others.
                for p0 in (0..$tokens).step_by($pass) {
                    let out = out.add(p0 * ostride);
                    let mut acc: [__m256; $pass] = if b0 == 0 { [_mm256_setzero_ps(); $pass] } else { core::array::from_fn(|t| _mm256_loadu_ps(out.add(t * ostride))) };
                    for ib in 0..kb {
                        let i = b0 + ib;
                        let (yu, da) = (&*yup.add(ib), &*dap.add(ib));
                        if p0 == 0 {
                            let (x, s8, dw): ([__m256i; 8], __m256i, __m256) = { let ($fg, $fi) = (g, i); $fetch };
                            // -128·Σ x per row.
                            let nc = { let $s8 = s8; _mm256_sub_epi32(_mm256_setzero_si256(), $corr) };
                            if $tokens > $pass {
                                keptp.add(ib).write((x, nc, dw));
                            }
                            q4_0_tile!(@tokens $group, $pass, p0, acc, &x, nc, dw, yu, da, |$nc, $xs, $yg| $sums);
                        } else {
                            // (Entry ib was written by this group's first pass.)
                            let (x, nc, dw) = &*keptp.add(ib);
                            q4_0_tile!(@tokens $group, $pass, p0, acc, x, *nc, *dw, yu, da, |$nc, $xs, $yg| $sums);
                        }
                    }
                    for t in 0..$pass {
                        _mm256_storeu_ps(out.add(t * ostride), acc[t]);
                    }
                }
            }
            b0 += kb;
        }
    }};
    // A pass's tokens of one block: `$group` tokens at a time, their sums interleaved
    // (independent chains).
    (@tokens $group:expr, $p:expr, $p0:expr, $acc:ident, $x:expr, $ncv:expr, $dw:expr, $yu:expr, $da:expr, |$nc:ident, $xs:ident, $yg:ident| $sums:expr) => {{
        let (x, ncv, dw): (&[__m256i; 8], __m256i, __m256) = ($x, $ncv, $dw);
        for gt in (0..$p).step_by($group) {
            let sums: [__m256i; $group] = { let ($nc, $xs, $yg) = (ncv, x, &$yu[$p0 + gt..$p0 + gt + $group]); $sums };
            for (u, &sumi) in sums.iter().enumerate() {
                let d = _mm256_mul_ps(dw, _mm256_broadcast_ss(&$da[$p0 + gt + u]));
                $acc[gt + u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, $acc[gt + u]);
            }
        }
    }};
}

/// Weight rows of the AVX2 rows-in-lanes tiles of the one-accumulator types: one per
/// lane of a vector.
pub(crate) const LANES8_TILE_ROWS: usize = 8;
/// Tokens of the AVX2 rows-in-lanes tiles: each block's weights transposed once for
/// all of them. (AMD EPYC Zen 3, one thread, `quant::bench::bench_matmul`: Q5_0 77
/// GFLOP/s, Q8_0 75-77 with 16 or 32 tokens, 68 and 70 with 8; the 4 × 16 tiles they
/// replace 64 and 65.)
pub(crate) const LANES8_TILE_TOKENS: usize = 32;
/// Tokens of the narrower AVX2 rows-in-lanes tiles, for a chunk's tokens after its
/// whole tiles.
pub(crate) const LANES8_REST_TOKENS: usize = 8;
/// Blocks per range of the AVX2 rows-in-lanes tiles' staged weights (the accumulators go
/// through a stash between ranges).
const LANES8_STAGE_BLOCKS: usize = 8;

/// 8 rows of 8 dwords (`r[k]` = row k), transposed: `x[j]` holds row r's dword j in
/// lane r (two rounds of unpacks in each 128-bit half, then the halves exchanged).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn transpose_8x8(r: [__m256i; 8]) -> [__m256i; 8] {
    // SAFETY: value-only intrinsics; AVX2 available (target features).
    unsafe {
        let t: [__m256i; 8] = core::array::from_fn(|k| {
            let (a, b) = (r[k & !1], r[k | 1]);
            if k % 2 == 0 { _mm256_unpacklo_epi32(a, b) } else { _mm256_unpackhi_epi32(a, b) }
        });
        // u[h][j]: dwords j (low half) and j + 4 (high half) of rows 4h..4h + 4.
        let u: [[__m256i; 4]; 2] = core::array::from_fn(|h| {
            let (t0, t1, t2, t3) = (t[4 * h], t[4 * h + 1], t[4 * h + 2], t[4 * h + 3]);
            [_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)]
        });
        core::array::from_fn(|j| if j < 4 { _mm256_permute2x128_si256::<0x20>(u[0][j], u[1][j]) } else { _mm256_permute2x128_si256::<0x31>(u[0][j - 4], u[1][j - 4]) })
    }
}

/// A block of [`LANES8_TILE_ROWS`] rows as the AVX2 rows-in-lanes tiles use it: `x[j]`
/// and `v[j]` hold, in lane r, the operands of row r's elements `4j..4j + 4` (per type),
/// `dw` and `mw` the rows' scales and (Q4_1) mins.
#[derive(Clone, Copy)]
struct Lanes8Block {
    x: [__m256i; 8],
    v: [__m256i; 8],
    dw: __m256,
    mw: __m256,
}

/// The AVX2 rows-in-lanes tile of the one-accumulator types: [`LANES8_TILE_ROWS`] rows in
/// the lanes of a vector × `$tokens` tokens. llama.cpp's dot for these types keeps 8 f32
/// lanes per (row, token), lane j taking `acc_j = fma(dw·da, f32(s_j), acc_j)` block by
/// block with `s_j` the exact integer sum over elements `4j..4j + 4`, then `hsum_ps` of
/// the 8 (for Q4_1 plus `summs`, `fma(mw, sa, summs)` per block). Here register j of a
/// token holds lane j of 8 rows: per block the rows' weights are transposed once
/// (`$block` of the pair `$at` gives for rows `$gg..$gg + 8` and block `$ii`: the
/// block's address and the rows' stride, or for the rows16 layout its half of the
/// group; kept for every token of the range); the tokens' scales (and sums) are
/// staged as f32 and, where `$has_prep`, their quants as `$prep` of the 32 bytes; per
/// token and j four bytes of the quants are broadcast (`$y`) and `$lanes` (from `$x`,
/// `$v`) gives every row's exact `s_j` as the single dot's integers; then the same
/// `dw·da` product and fma; at the end the 8 registers are added as `hsum_ps` adds lanes
/// (`((0+4)+(2+6)) + ((1+5)+(3+7))`), then `summs`. So every output has the single dot's
/// bits. Activation blocks are `$as` bytes (scale at 0, sum at 2 where `$min`, quants at
/// `$as - 32`). Per group of rows the blocks go in ranges of [`LANES8_STAGE_BLOCKS`],
/// each token's accumulators kept in a stash between ranges.
macro_rules! lanes8_tile {
    ($nb:expr, $rows:expr, $a:expr, $as:expr, $arow:expr, $out:expr, $ostride:expr, $tokens:expr, $min:expr, $block:ident, |$gg:ident, $ii:ident| $at:expr, $has_prep:expr,
     |$ab:ident| $prep:expr, |$x:ident, $v:ident, $y:ident| $lanes:expr) => {{
        const SB: usize = LANES8_STAGE_BLOCKS;
        let (nb, rows, a, arow, out, ostride): (usize, usize, *const u8, usize, *mut f32, usize) = ($nb, $rows, $a, $arow, $out, $ostride);
        let mut wst = core::mem::MaybeUninit::<[Lanes8Block; SB]>::uninit();
        let mut da = core::mem::MaybeUninit::<[[f32; $tokens]; SB]>::uninit();
        let mut sa = core::mem::MaybeUninit::<[[f32; $tokens]; SB]>::uninit();
        let mut stash = core::mem::MaybeUninit::<[([__m256; 8], __m256); $tokens]>::uninit();
        let mut yt = core::mem::MaybeUninit::<[[[i32; 8]; $tokens]; SB]>::uninit();
        let (wp, dp, sap, sp, yp) = (
            wst.as_mut_ptr().cast::<Lanes8Block>(),
            da.as_mut_ptr().cast::<[f32; $tokens]>(),
            sa.as_mut_ptr().cast::<[f32; $tokens]>(),
            stash.as_mut_ptr().cast::<([__m256; 8], __m256)>(),
            yt.as_mut_ptr().cast::<[[i32; 8]; $tokens]>(),
        );
        for g in (0..rows).step_by(LANES8_TILE_ROWS) {
            let mut b0 = 0;
            while b0 < nb {
                let kb = (nb - b0).min(SB);
                let last = b0 + kb == nb;
                // (Entries 0..kb of wst, da and, where `$min`, sa and, where `$has_prep`,
                // yt are written here before any read below.)
                for ib in 0..kb {
                    let i = b0 + ib;
                    let (p, q) = { let ($gg, $ii) = (g, i); $at };
                    wp.add(ib).write($block(p, q));
                    for t8 in (0..$tokens).step_by(8) {
                        _mm256_storeu_ps((*dp.add(ib)).as_mut_ptr().add(t8), f16x8(a.add(t8 * arow + i * $as), arow));
                        if $min {
                            _mm256_storeu_ps((*sap.add(ib)).as_mut_ptr().add(t8), f16x8(a.add(t8 * arow + i * $as + 2), arow));
                        }
                    }
                    if $has_prep {
                        for t in 0..$tokens {
                            let $ab = _mm256_loadu_si256(a.add(t * arow + i * $as + $as - 32).cast());
                            _mm256_storeu_si256((*yp.add(ib))[t].as_mut_ptr().cast(), $prep);
                        }
                    }
                }
                for t in 0..$tokens {
                    // (The stash entry of token t was written by the previous range.)
                    let (mut acc, mut summs): ([__m256; 8], __m256) = if b0 == 0 { ([_mm256_setzero_ps(); 8], _mm256_setzero_ps()) } else { *sp.add(t) };
                    let at = a.add(t * arow + b0 * $as + $as - 32);
                    for ib in 0..kb {
                        let blk = &*wp.add(ib);
                        let d = _mm256_mul_ps(blk.dw, broadcast_load(&(*dp.add(ib))[t]));
                        if $min {
                            summs = _mm256_fmadd_ps(blk.mw, broadcast_load(&(*sap.add(ib))[t]), summs);
                        }
                        let yb = if $has_prep { (*yp.add(ib))[t].as_ptr() } else { at.add(ib * $as).cast::<i32>() };
                        for j in 0..8 {
                            let ($x, $v, $y) = (blk.x[j], blk.v[j], _mm256_set1_epi32(core::ptr::read_unaligned(yb.add(j))));
                            acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps($lanes), acc[j]);
                        }
                    }
                    if last {
                        let sum = super::rows16::lane_tree(&acc);
                        // (No `+ summs` for the types without a min: it would turn -0.0
                        // into +0.0.)
                        _mm256_storeu_ps(out.add(t * ostride + g), if $min { _mm256_add_ps(sum, summs) } else { sum });
                    } else {
                        sp.add(t).write((acc, summs));
                    }
                }
                b0 += kb;
            }
        }
    }};
}

/// Q8_0 rows at `p` (`wrow` bytes apart, at one block), for [`lanes8_tile`]: `x[j]` the
/// weights' dwords transposed, `v[j]` their magnitudes (`sign(x, x)`, the sign trick's
/// unsigned operand), `dw` the scales.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes8_block_q8_0(p: *const u8, wrow: usize) -> Lanes8Block {
    // SAFETY: the caller guarantees the block (34 bytes) of each of 8 rows readable.
    unsafe {
        let x = transpose_8x8(core::array::from_fn(|k| _mm256_loadu_si256(p.add(k * wrow + 2).cast())));
        Lanes8Block { x, v: x.map(|x| _mm256_sign_epi8(x, x)), dw: f16x8(p, wrow), mw: _mm256_setzero_ps() }
    }
}

/// The 16 `qs` bytes at `q` of 8 rows (`wrow` bytes apart), as nibbles transposed:
/// `x[j]` holds, in lane r, row r's elements `4j..4j + 4` (the low nibbles of `qs`
/// dword j for j < 4, the high nibbles of dword j - 4 after). Rows k and k + 4 in the
/// halves of a vector, then a 4×4 transpose of dwords per half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles_transposed(q: *const u8, wrow: usize) -> [__m256i; 8] {
    // SAFETY: the caller guarantees 16 readable bytes at q + k·wrow, k < 8.
    unsafe {
        let ld = |k: usize| {
            let lo = _mm_loadu_si128(q.add(k * wrow).cast());
            let hi = _mm_loadu_si128(q.add((k + 4) * wrow).cast());
            _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi)
        };
        let (r0, r1, r2, r3) = (ld(0), ld(1), ld(2), ld(3));
        let (t0, t1) = (_mm256_unpacklo_epi32(r0, r1), _mm256_unpackhi_epi32(r0, r1));
        let (t2, t3) = (_mm256_unpacklo_epi32(r2, r3), _mm256_unpackhi_epi32(r2, r3));
        let v = [_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)];
        let m4 = _mm256_set1_epi8(0x0F);
        core::array::from_fn(|j| if j < 4 { _mm256_and_si256(v[j], m4) } else { _mm256_and_si256(_mm256_srli_epi16::<4>(v[j - 4]), m4) })
    }
}

/// The Q5_0 quants `q` (0..=31, unsigned bytes) of elements `4j..4j + 4` of 8 rows, row
/// r's in lane r, from `nib` (their nibbles so arranged: [`nibbles_transposed`]) and the
/// plain `qh` (row r's in lane r; the rows16 layout's transposed one takes
/// [`q5_0_lane_quants_rows16`]): each byte's fifth bit (bit
/// 4j + b of `qh`: its byte j/2 spread to the lane's four bytes, then tested against a
/// mask) as 0x10.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_0_lane_quants(nib: __m256i, qh: __m256i, j: usize) -> __m256i {
    // SAFETY: value-only intrinsics; AVX2 available (target features).
    unsafe {
        // Byte b of each lane: byte j/2 of the lane's qh, tested at bit 4(j mod 2) + b.
        let byte = |k: i32| (4 * k + (j / 2) as i32) * 0x0101_0101;
        let spread = _mm256_shuffle_epi8(qh, _mm256_setr_epi32(byte(0), byte(1), byte(2), byte(3), byte(0), byte(1), byte(2), byte(3)));
        let b5 = _mm256_set1_epi8(0x10);
        let fifth = if j % 2 == 1 {
            // Bits 4..8 of the byte: the selected bit is 0x10 or more, so the minimum
            // with 0x10 is 0x10 where it is set.
            _mm256_min_epu8(_mm256_and_si256(spread, _mm256_set1_epi32(0x8040_2010u32 as i32)), b5)
        } else {
            let sel = _mm256_set1_epi32(0x0804_0201);
            _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel), b5)
        };
        _mm256_or_si256(nib, fifth)
    }
}

/// [`q5_0_lane_quants`] for `qh` as the rows16 layout holds it (`quant::rows16`, row r's
/// in lane r: element `4j + b`'s fifth bit at bit `8b + j`): lane `j`'s four bits moved to
/// bit 4 of each byte by one constant shift (none for `j` = 4), kept by one mask and or-ed
/// into the nibbles (three operations where the plain `qh` takes five or six).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_0_lane_quants_rows16(nib: __m256i, qh: __m256i, j: usize) -> __m256i {
    // SAFETY: value-only intrinsics; AVX2 available (target features).
    unsafe {
        let at4 = match j {
            0 => _mm256_slli_epi32::<4>(qh),
            1 => _mm256_slli_epi32::<3>(qh),
            2 => _mm256_slli_epi32::<2>(qh),
            3 => _mm256_slli_epi32::<1>(qh),
            4 => qh,
            5 => _mm256_srli_epi32::<1>(qh),
            6 => _mm256_srli_epi32::<2>(qh),
            _ => _mm256_srli_epi32::<3>(qh),
        };
        _mm256_or_si256(nib, _mm256_and_si256(at4, _mm256_set1_epi8(0x10)))
    }
}

/// [`lanes8_tile`]'s block of Q5_0 rows from their quants in lanes
/// ([`q5_0_lane_quants`]) and scales: `x[j]` the weights `q - 16` (signed bytes,
/// -16..=15), `v[j]` the rows' corrections `128·Σ (q - 16)` over elements `4j..4j + 4`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes8_block_q5_0_from(q: [__m256i; 8], dw: __m256) -> Lanes8Block {
    // SAFETY: value-only intrinsics; AVX2 available (target features).
    unsafe {
        let b5 = _mm256_set1_epi8(0x10);
        let x = q.map(|q| _mm256_sub_epi8(q, b5));
        let (ones, c128) = (_mm256_set1_epi16(1), _mm256_set1_epi8(-128));
        Lanes8Block { x, v: x.map(|x| _mm256_madd_epi16(_mm256_maddubs_epi16(c128, x), ones)), dw, mw: _mm256_setzero_ps() }
    }
}

/// Q5_0 rows at `p` (`wrow` bytes apart, at one block), for [`lanes8_tile`]: the nibbles
/// transposed ([`nibbles_transposed`]) and the rows' `qh` in lanes, as
/// [`lanes8_block_q5_0_from`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes8_block_q5_0(p: *const u8, wrow: usize) -> Lanes8Block {
    // SAFETY: the caller guarantees the block (22 bytes) of each of 8 rows readable.
    unsafe {
        let h = |k: usize| super::rd32(p.add(k * wrow + 2));
        let qh = _mm256_setr_epi32(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7));
        let nib = nibbles_transposed(p.add(6), wrow);
        lanes8_block_q5_0_from(core::array::from_fn(|j| q5_0_lane_quants(nib[j], qh, j)), f16x8(p, wrow))
    }
}

/// Q5_0 rows in the rows16 layout (`quant::rows16`): half `h` (rows 8h..8h + 8) of the
/// group block at `p` (352 bytes: 16 `d`, the 16 rows' `qh`, four chunks of 64 bytes each
/// holding packed dword c of the 16 rows), for [`lanes8_tile`]: the same vectors as
/// [`lanes8_block_q5_0`], by loads (the layout holds them transposed).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes8_block_q5_0_rows16(p: *const u8, h: usize) -> Lanes8Block {
    // SAFETY: the caller guarantees the group block (352 bytes) readable; h < 2.
    unsafe {
        let (nib, qh) = (nibbles_rows16(p.add(96), h), _mm256_loadu_si256(p.add(32 + 32 * h).cast()));
        // Lane by lane with constant `j` (so each shift is one: `from_fn` may keep a loop
        // and a branch on `j`).
        let q = |j: usize| q5_0_lane_quants_rows16(nib[j], qh, j);
        lanes8_block_q5_0_from([q(0), q(1), q(2), q(3), q(4), q(5), q(6), q(7)], _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * h).cast())))
    }
}

/// Q4_1 rows at `p` (`wrow` bytes apart, at one block), for [`lanes8_tile`]: `x[j]` the
/// nibbles ([`nibbles_transposed`]), `v` unused, `dw` and `mw` the scales and mins.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes8_block_q4_1(p: *const u8, wrow: usize) -> Lanes8Block {
    // SAFETY: the caller guarantees the block (20 bytes) of each of 8 rows readable.
    unsafe { Lanes8Block { x: nibbles_transposed(p.add(4), wrow), v: [_mm256_setzero_si256(); 8], dw: f16x8(p, wrow), mw: f16x8(p.add(2), wrow) } }
}

/// Q4_1 rows in the rows16 layout (`quant::rows16`): half `h` (rows 8h..8h + 8) of the
/// group block at `p` (320 bytes: 16 `d`, 16 `m`, four chunks of 64 bytes each holding
/// packed dword c of the 16 rows), for [`lanes8_tile`]: the same vectors as
/// [`lanes8_block_q4_1`], by loads (the layout holds them transposed).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes8_block_q4_1_rows16(p: *const u8, h: usize) -> Lanes8Block {
    // SAFETY: the caller guarantees the group block (320 bytes) readable; h < 2.
    unsafe {
        let f = |o: usize| _mm256_cvtph_ps(_mm_loadu_si128(p.add(o + 16 * h).cast()));
        Lanes8Block { x: nibbles_rows16(p.add(64), h), v: [_mm256_setzero_si256(); 8], dw: f(0), mw: f(32) }
    }
}

/// Q8_0 rows in the rows16 layout (`quant::rows16`): half `h` (rows 8h..8h + 8) of the
/// group block at `p` (544 bytes: 16 `d`, eight chunks of 64 bytes each holding dword j
/// of the 16 rows), for [`lanes8_tile`]: the same vectors as [`lanes8_block_q8_0`], by
/// loads (the layout holds them transposed).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes8_block_q8_0_rows16(p: *const u8, h: usize) -> Lanes8Block {
    // SAFETY: the caller guarantees the group block (544 bytes) readable; h < 2.
    unsafe {
        let x: [__m256i; 8] = core::array::from_fn(|j| _mm256_loadu_si256(p.add(32 + 64 * j + 32 * h).cast()));
        Lanes8Block { x, v: x.map(|x| _mm256_sign_epi8(x, x)), dw: _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * h).cast())), mw: _mm256_setzero_ps() }
    }
}

// The rows-in-lanes bodies: nb blocks of each of `rows` weight rows (a multiple of 8)
// and of T activation rows readable, out[t·ostride + r] writable for r < rows, t < T
// (the wrapper's checks); every staged entry is written before it is read (see
// lanes8_tile); AVX2, FMA and F16C available (module contract).

/// Q8_0 · Q8_0, AVX2, [`LANES8_TILE_ROWS`] rows in lanes × `T` tokens
/// ([`lanes8_tile`]): each row's lane sum as `qdot::q8_0_q8_0`'s sign trick,
/// `madd(maddubs(sign(x, x), sign(y, x)), 1)` on the same bytes.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_q8_0_lanes8<const T: usize>(nb: usize, w: *const u8, wrow: usize, rows: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: see above; layout d@0 qs@2 for both.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        lanes8_tile!(nb, rows, a, 34, arow, out, ostride, T, false, lanes8_block_q8_0, |g, i| (w.add(g * wrow + 34 * i), wrow), false,
            |ab| ab,
            |x, v, y| _mm256_madd_epi16(_mm256_maddubs_epi16(v, _mm256_sign_epi8(y, x)), ones))
    }
}

/// [`q8_0_q8_0_lanes8`] over a matrix in the rows16 layout (its groups of 16 rows at
/// `w + 16·g·wrow`, as the plain rows they hold); `rows` a multiple of 16.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_q8_0_lanes8_rows16<const T: usize>(nb: usize, w: *const u8, wrow: usize, rows: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: as q8_0_q8_0_lanes8 (the same bytes per group of 16 rows).
    unsafe {
        let ones = _mm256_set1_epi16(1);
        lanes8_tile!(nb, rows, a, 34, arow, out, ostride, T, false, lanes8_block_q8_0_rows16, |g, i| (w.add(g / 16 * 16 * wrow + 544 * i), g / 8 % 2), false,
            |ab| ab,
            |x, v, y| _mm256_madd_epi16(_mm256_maddubs_epi16(v, _mm256_sign_epi8(y, x)), ones))
    }
}

/// Q5_0 · Q8_0, AVX2, [`LANES8_TILE_ROWS`] rows in lanes × `T` tokens
/// ([`lanes8_tile`]): each row's lane sum, `qdot::q5_0_q8_0`'s exact
/// `Σ q·y - 16·Σ y` = `Σ (q - 16)·y`, as `Σ (y + 128)·(q - 16) - 128·Σ (q - 16)`: the
/// token's activations staged with their sign bits flipped (`y + 128`, unsigned, so four
/// bytes are one broadcast operand of `maddubs` against the signed weights), the
/// correction per row from the block. Integer bounds: a `maddubs` pair is at most
/// 2·255·16 in magnitude (no i16 saturation), so every sum is exact and the same integer.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_0_q8_0_lanes8<const T: usize>(nb: usize, w: *const u8, wrow: usize, rows: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: see above; layouts d@0 qh@2 qs@6 and d@0 qs@2.
    unsafe {
        let (ones, flip) = (_mm256_set1_epi16(1), _mm256_set1_epi8(-128));
        lanes8_tile!(nb, rows, a, 34, arow, out, ostride, T, false, lanes8_block_q5_0, |g, i| (w.add(g * wrow + 22 * i), wrow), true,
            |ab| _mm256_xor_si256(ab, flip),
            |x, v, y| _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(y, x), ones), v))
    }
}

/// [`q5_0_q8_0_lanes8`] over a matrix in the rows16 layout (its groups of 16 rows at
/// `w + 16·g·wrow`, as the plain rows they hold); `rows` a multiple of 16.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_0_q8_0_lanes8_rows16<const T: usize>(nb: usize, w: *const u8, wrow: usize, rows: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: as q5_0_q8_0_lanes8 (the same bytes per group of 16 rows).
    unsafe {
        let (ones, flip) = (_mm256_set1_epi16(1), _mm256_set1_epi8(-128));
        lanes8_tile!(nb, rows, a, 34, arow, out, ostride, T, false, lanes8_block_q5_0_rows16, |g, i| (w.add(g / 16 * 16 * wrow + 352 * i), g / 8 % 2), true,
            |ab| _mm256_xor_si256(ab, flip),
            |x, v, y| _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(y, x), ones), v))
    }
}

/// Q4_1 · Q8_1, AVX2, [`LANES8_TILE_ROWS`] rows in lanes × `T` tokens
/// ([`lanes8_tile`]): each row's lane sum as `qdot::q4_1_q8_1`'s,
/// `madd(maddubs(x, y), 1)` on the same bytes; `summs = fma(mw, sa, summs)` per block,
/// added after the lanes' sum.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_1_q8_1_lanes8<const T: usize>(nb: usize, w: *const u8, wrow: usize, rows: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: see above; layouts d@0 m@2 qs@4 and d@0 s@2 qs@4.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        lanes8_tile!(nb, rows, a, 36, arow, out, ostride, T, true, lanes8_block_q4_1, |g, i| (w.add(g * wrow + 20 * i), wrow), false,
            |ab| ab,
            |x, _v, y| _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), ones))
    }
}

/// [`q4_1_q8_1_lanes8`] over a matrix in the rows16 layout (its groups of 16 rows at
/// `w + 16·g·wrow`, as the plain rows they hold); `rows` a multiple of 16.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_1_q8_1_lanes8_rows16<const T: usize>(nb: usize, w: *const u8, wrow: usize, rows: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: as q4_1_q8_1_lanes8 (the same bytes per group of 16 rows).
    unsafe {
        let ones = _mm256_set1_epi16(1);
        lanes8_tile!(nb, rows, a, 36, arow, out, ostride, T, true, lanes8_block_q4_1_rows16, |g, i| (w.add(g / 16 * 16 * wrow + 320 * i), g / 8 % 2), false,
            |ab| ab,
            |x, _v, y| _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), ones))
    }
}

/// Blocks per range of the Q4_0 tiles' prepared activations (16 KB on the stack for 16
/// tokens, 32 KB for 32; the AVX2 tile keeps 10 KB of decoded weights beside them: 16
/// blocks measured no faster on the Zen 3).
const Q4_0_STAGE_BLOCKS: usize = 32;

/// The f16 at `p + k·stride`, k < 8, as f32 (inserted into one vector, then F16C's
/// exact conversion).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16x8(p: *const u8, stride: usize) -> __m256 {
    // SAFETY: the caller guarantees 2 readable bytes at p + k·stride, k < 8.
    unsafe {
        let h = |k: usize| core::ptr::read_unaligned(p.add(k * stride).cast::<u16>()) as i32;
        let mut v = _mm_cvtsi32_si128(h(0));
        v = _mm_insert_epi16::<1>(v, h(1));
        v = _mm_insert_epi16::<2>(v, h(2));
        v = _mm_insert_epi16::<3>(v, h(3));
        v = _mm_insert_epi16::<4>(v, h(4));
        v = _mm_insert_epi16::<5>(v, h(5));
        v = _mm_insert_epi16::<6>(v, h(6));
        v = _mm_insert_epi16::<7>(v, h(7));
        _mm256_cvtph_ps(v)
    }
}

/// The f16 at `p + k·stride`, k < 4, as f32 (F16C's conversion is exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16x4(p: *const u8, stride: usize) -> __m128 {
    // SAFETY: the caller guarantees 2 readable bytes at p + k·stride, k < 4. (Packed in
    // a general register, then one insert.)
    unsafe {
        let h = |k: usize| core::ptr::read_unaligned(p.add(k * stride).cast::<u16>()) as u64;
        _mm_cvtph_ps(_mm_cvtsi64_si128((h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48) as i64))
    }
}

/// The AVX2 body of [`q4_0_tile`] (passes of [`Q4_0_TILE_TOKENS`], two tokens' sums
/// interleaved): the row sums by `maddubs`, eight added as i16, then `madd` with ones;
/// `|$g, $i| $fetch` gives rows `$g..$g + 8`'s block `$i` (transposed weights, their byte
/// sum and the scales).
macro_rules! q4_0_tile_avx2 {
    ($nb:expr, $rows:expr, $a:expr, $arow:expr, $out:expr, $ostride:expr, $tokens:ident, |$g:ident, $i:ident| $fetch:expr) => {{
        let (ones, c128) = (_mm256_set1_epi16(1), _mm256_set1_epi8(-128));
        q4_0_tile!($nb, $rows, $a, $arow, $out, $ostride, $tokens, Q4_0_TILE_TOKENS, 2, |$g, $i| $fetch,
            |s8| _mm256_madd_epi16(_mm256_maddubs_epi16(c128, s8), ones),
            |nc, x, yg| {
                let b = |u: usize, j: usize| _mm256_set1_epi32(yg[u][j]);
                let mut p = [_mm256_maddubs_epi16(b(0, 0), x[0]), _mm256_maddubs_epi16(b(1, 0), x[0])];
                for j in 1..8 {
                    for (u, p) in p.iter_mut().enumerate() {
                        *p = _mm256_add_epi16(*p, _mm256_maddubs_epi16(b(u, j), x[j]));
                    }
                }
                p.map(|p| _mm256_add_epi32(nc, _mm256_madd_epi16(p, ones)))
            })
    }};
}

// The Q4_0 bodies: `nb` blocks in each of `rows` weight rows (a multiple of
// Q4_0_TILE_ROWS) and in each of their tokens' activation rows, in bounds, and
// `out[t * ostride + r]` writable for every r < rows (ostride >= rows) and token t (the
// wrapper's SAFETY argument); layouts d@0 qs@2 for both.

/// Q4_0 · Q8_0 tile, AVX2 (`T` tokens: [`Q4_0_TILE_TOKENS`] or
/// [`Q4_0_WIDE_TILE_TOKENS`]): each output as
/// `qdot::q4_0_q8_0`; the row sums by `maddubs`, eight added as i16, then `madd` with
/// ones.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_0_q8_0<const T: usize>(nb: usize, w: *const u8, wrow: usize, rows: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: see above; AVX2, FMA and F16C available (module contract).
    unsafe {
        q4_0_tile_avx2!(nb, rows, a, arow, out, ostride, T, |g, i| {
            let p = w.add(g * wrow + i * 18);
            let (x, s8) = q4_0_transposed(p.add(2), wrow);
            (x, s8, f16x8(p, wrow))
        })
    }
}

/// [`q4_0_q8_0`] over a matrix in the rows16 layout (its groups of 16 rows at
/// `w + 16·g·wrow`, as the plain rows they hold; `rows` a multiple of 16): each block's
/// half group read in place of the transposition (the layout holds row r's packed
/// dword c in lane r of chunk c), the same vectors.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_0_q8_0_rows16<const T: usize>(nb: usize, w: *const u8, wrow: usize, rows: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: as q4_0_q8_0 (the same bytes per group of 16 rows); the 288-byte group
    // block holds the 16 scales, then four chunks of 64 bytes.
    unsafe {
        q4_0_tile_avx2!(nb, rows, a, arow, out, ostride, T, |g, i| {
            let (p, h) = (w.add(g / 16 * 16 * wrow + 288 * i), g / 8 % 2);
            let (x, s8) = q4_0_signed(nibbles_rows16(p.add(32), h));
            (x, s8, _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * h).cast())))
        })
    }
}

/// Q4_0 · Q8_0 tile, AVX-512 VNNI on 512-bit vectors (`2·P` tokens: 16 or 32):
/// [`q4_0_tile`]'s operations, two tokens per vector. Lane `2r + h` of pair `p`'s vector
/// is (row r, token 2p + h): the weights `x[j]` have each row's dword twice, the flipped
/// activations of the pair are staged with their dwords interleaved (`A0 B0 A1 B1 ..`) so
/// that dword j of both is one 8-byte broadcast, `dw` has each row's scale twice and the
/// pair's `da` are one 8-byte broadcast. Per lane: the same exact `sumi` (the correction
/// `-128·Σ x` of its row, then `vpdpbusd` over the 8 dwords), the same `dw·da` product
/// and the same fma, block by block, as the 256-bit tile, so each output has the single
/// dot's bits; `P` accumulators (8 or 16) stay in registers beside the 8 weight vectors.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q4_0_q8_0_zmm<const P: usize>(nb: usize, w: *const u8, wrow: usize, rows: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: see above; AVX-512 F/BW/VL/VNNI available (the wrapper is only handed out
    // after cpu_has_avx512_vnni()).
    const { assert!(P == 8 || P == 16, "q4_0_q8_0_zmm: 16 or 32 tokens") };
    unsafe {
        let flip = _mm256_set1_epi8(-128);
        // Lane 2r + h ← lane r (each row twice); pair (even lanes | odd lanes) and back.
        let dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        let split = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        let join = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
        // As in q4_0_tile: the tokens' blocks staged once per range for every group of
        // rows, the accumulators carried through `out` between ranges.
        let mut yu = core::mem::MaybeUninit::<[[[i32; 16]; P]; Q4_0_STAGE_BLOCKS]>::uninit();
        // (Each block's `da`: the first 2·P of 32.)
        let mut da = core::mem::MaybeUninit::<[[f32; Q4_0_TILE_TOKENS_VNNI32]; Q4_0_STAGE_BLOCKS]>::uninit();
        let (yup, dap) = (yu.as_mut_ptr().cast::<[[i32; 16]; P]>(), da.as_mut_ptr().cast::<[f32; Q4_0_TILE_TOKENS_VNNI32]>());
        let mut b0 = 0;
        while b0 < nb {
            let kb = (nb - b0).min(Q4_0_STAGE_BLOCKS);
            // (Entries 0..kb are written here before any read below.)
            for ib in 0..kb {
                let i = b0 + ib;
                let (yb, db) = (&mut *yup.add(ib), &mut *dap.add(ib));
                for p in 0..P {
                    let ya = _mm256_xor_si256(_mm256_loadu_si256(a.add(2 * p * arow + i * 34 + 2).cast()), flip);
                    let yb2 = _mm256_xor_si256(_mm256_loadu_si256(a.add((2 * p + 1) * arow + i * 34 + 2).cast()), flip);
                    // [A0 B0 A1 B1 | A4 B4 A5 B5], [A2 B2 A3 B3 | A6 B6 A7 B7]
                    let (lo, hi) = (_mm256_unpacklo_epi32(ya, yb2), _mm256_unpackhi_epi32(ya, yb2));
                    _mm256_storeu_si256(yb[p].as_mut_ptr().cast(), _mm256_permute2x128_si256::<0x20>(lo, hi));
                    _mm256_storeu_si256(yb[p].as_mut_ptr().add(8).cast(), _mm256_permute2x128_si256::<0x31>(lo, hi));
                }
                for h in 0..P / 4 {
                    _mm256_storeu_ps(db.as_mut_ptr().add(8 * h), f16x8(a.add(8 * h * arow + i * 34), arow));
                }
            }
            for g in (0..rows).step_by(Q4_0_TILE_ROWS) {
                let (w, out) = (w.add(g * wrow), out.add(g));
                let mut acc: [__m512; P] = if b0 == 0 {
                    [_mm512_setzero_ps(); P]
                } else {
                    core::array::from_fn(|p| {
                        let lo = _mm512_castps256_ps512(_mm256_loadu_ps(out.add(2 * p * ostride)));
                        let both = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(lo), _mm256_castps_pd(_mm256_loadu_ps(out.add((2 * p + 1) * ostride)))));
                        _mm512_permutexvar_ps(join, both)
                    })
                };
                for ib in 0..kb {
                    let i = b0 + ib;
                    let (yu, da) = (&*yup.add(ib), &*dap.add(ib));
                    let dw = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(f16x8(w.add(i * 18), wrow)));
                    let (x, s8) = q4_0_transposed(w.add(i * 18 + 2), wrow);
                    // -128·Σ x per row.
                    let zero = _mm256_setzero_si256();
                    let nc = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, flip, s8));
                    let nc = _mm512_permutexvar_epi32(dup, _mm512_castsi256_si512(nc));
                    let xz: [__m512i; 8] = core::array::from_fn(|j| _mm512_permutexvar_epi32(dup, _mm512_castsi256_si512(x[j])));
                    for p in 0..P {
                        let yp = yu[p].as_ptr().cast::<i64>();
                        // Two chains (even and odd dwords) added at the end: integer sums,
                        // exact in any order, and half the dependent `vpdpbusd`s in a row.
                        let (mut s, mut t) = (nc, _mm512_setzero_si512());
                        for j in (0..8).step_by(2) {
                            s = _mm512_dpbusd_epi32(s, _mm512_set1_epi64(core::ptr::read_unaligned(yp.add(j))), xz[j]);
                            t = _mm512_dpbusd_epi32(t, _mm512_set1_epi64(core::ptr::read_unaligned(yp.add(j + 1))), xz[j + 1]);
                        }
                        let s = _mm512_add_epi32(s, t);
                        let dap = _mm512_castpd_ps(_mm512_set1_pd(core::ptr::read_unaligned(da.as_ptr().add(2 * p).cast::<f64>())));
                        acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, dap), acc[p]);
                    }
                }
                for (p, v) in acc.iter().enumerate() {
                    let v = _mm512_permutexvar_ps(split, *v);
                    _mm256_storeu_ps(out.add(2 * p * ostride), _mm512_castps512_ps256(v));
                    _mm256_storeu_ps(out.add((2 * p + 1) * ostride), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))));
                }
            }
            b0 += kb;
        }
    }
}

/// Weight rows of the rows-in-lanes Q8_0/Q5_0 tiles (one per lane of a 512-bit vector).
pub(crate) const LANES_TILE_ROWS: usize = 16;
/// Tokens of the rows-in-lanes Q8_0/Q5_0 tiles; [`LANES_REST_TOKENS`] for the tokens of
/// a chunk after its last whole tile. 32 rather than 16 halves the weights' staging
/// (the transposes) per token: on the AMD EPYC Zen 4, from L1
/// (`quant::bench::bench_short_kernels`) Q5_0 0.408-0.410 -> 0.374-0.390 ns per (row,
/// token, block), Q8_0 0.390-0.392 -> 0.363-0.384.
pub(crate) const LANES_TILE_TOKENS: usize = 32;
/// Tokens of the narrower rows-in-lanes tiles (see [`LANES_TILE_TOKENS`]).
pub(crate) const LANES_REST_TOKENS: usize = 16;
/// Blocks per range of the rows-in-lanes tiles' staged weights and activations.
const LANES_STAGE_BLOCKS: usize = 32;
/// Groups of [`LANES_TILE_ROWS`] rows per pass over the staged activations (rows beyond
/// take another pass). With 32 staged blocks and 32 tokens a call holds 118 KB on the
/// stack (tokens' corrections 32 KB, scales 4 KB, weights 18 KB, the accumulators
/// between ranges 64 KB; with 16 tokens 68 KB); 8 groups were no faster measurably
/// (SmolLM2 Q8_0 pp512, one thread, 16 tokens). On the Zen 4 (32 KiB of L1 data) 16
/// staged blocks with 32 tokens were slower for Q8_0 (0.427 ns) and 8 no faster.
const LANES_GROUPS: usize = 4;

/// 1.5·2^23: an integer s with |s| < 2^22 added to its bits (as an i32) gives the bits
/// of `MAGIC + s`, so `f32::from_bits(MAGIC_BITS + s) - MAGIC` is `s as f32`, exactly:
/// an integer add (folded into a sum's starting value) and a float subtraction instead of
/// a conversion, which shares its port with `vpdpbusd`.
const MAGIC: f32 = 12_582_912.0;
/// The bits of [`MAGIC`].
const MAGIC_BITS: i32 = 0x4B40_0000;
const _: () = assert!(MAGIC.to_bits() == MAGIC_BITS as u32);

/// Sixteen rows of eight dwords, `z[k]` = [row 2k | row 2k + 1], transposed: `z[j]`
/// holds row r's dword j in lane r. Three butterfly stages, each pairing the registers
/// that differ in one index bit and taking the even and the odd lanes of the pair.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn transpose_16x8(z: &mut [__m512i; 8]) {
    // SAFETY: value-only intrinsics; AVX-512 F available (target features).
    unsafe {
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        for m in [1, 2, 4] {
            for a in (0..8).filter(|a| a & m == 0) {
                let (x, y) = (z[a], z[a | m]);
                z[a] = _mm512_permutex2var_epi32(x, even, y);
                z[a | m] = _mm512_permutex2var_epi32(x, odd, y);
            }
        }
    }
}

/// The 16 f16 at `p + r·stride` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn f16x16(p: *const u8, stride: usize) -> __m512 {
    // SAFETY: the caller guarantees 2 readable bytes at p + r·stride, r < 16.
    unsafe {
        let lo = _mm512_castps256_ps512(f16x8(p, stride));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(lo), _mm256_castps_pd(f16x8(p.add(8 * stride), stride))))
    }
}

/// A block of [`LANES_TILE_ROWS`] weight rows as the rows-in-lanes tiles use it: `x[j]`
/// holds, in lane r, row r's elements `4j..4j + 4` as unsigned bytes `q + o` (o = 128
/// for Q8_0, 16 for Q5_0: its 5-bit levels as stored), and `dw` the rows' scales.
type LanesBlock = ([__m512i; 8], __m512);

/// Q8_0 rows at `w` (`wrow` bytes apart), block `i`, for [`lanes_tile`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn lanes_block_q8_0(w: *const u8, wrow: usize, i: usize) -> LanesBlock {
    // SAFETY: the caller guarantees block i (34 bytes) of each of 16 rows readable.
    unsafe {
        let p = w.add(i * 34);
        let mut z: [__m512i; 8] = core::array::from_fn(|k| pair512(p.add(2 * k * wrow + 2), p.add((2 * k + 1) * wrow + 2)));
        transpose_16x8(&mut z);
        let flip = _mm512_set1_epi8(-128);
        (z.map(|x| _mm512_xor_si512(x, flip)), f16x16(p, wrow))
    }
}

/// Q8_0 rows in the rows16 layout (`quant::rows16`: the group of 16 rows at `w`), block
/// `i`, for [`lanes_tile`]: the layout holds the block already transposed, so eight loads
/// (and the flip to unsigned) instead of [`lanes_block_q8_0`]'s loads and transpose.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn lanes_block_q8_0_rows16(w: *const u8, _wrow: usize, i: usize) -> LanesBlock {
    // SAFETY: the caller guarantees the group's block i (544 bytes) readable.
    unsafe {
        let p = w.add(i * 16 * 34);
        let flip = _mm512_set1_epi8(-128);
        let x: [__m512i; 8] = core::array::from_fn(|j| _mm512_xor_si512(_mm512_loadu_si512(p.add(32 + 64 * j).cast()), flip));
        (x, _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())))
    }
}

/// Q5_0 rows in the rows16 layout (`quant::rows16`: the group of 16 rows at `w`), block
/// `i`, for [`lanes_tile`]: as [`lanes_block_q5_0`] from the already transposed `qh` and
/// `qs` (five loads, no transpose).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn lanes_block_q5_0_rows16(w: *const u8, _wrow: usize, i: usize) -> LanesBlock {
    // SAFETY: the caller guarantees the group's block i (352 bytes) readable.
    unsafe {
        let p = w.add(i * 16 * 22);
        (super::rows16::q5_0_weights(p), _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())))
    }
}

/// Q5_0 rows at `w` (`wrow` bytes apart), block `i`, for [`lanes_tile`]: `qh` and the 16
/// `qs` bytes (5 dwords per row) transposed, then element e's low nibble (byte e of
/// `qs` for e < 16, its high nibble for e ≥ 16) and its fifth bit (bit e of `qh`, put in
/// place by a 16-entry table: a nibble of `qh` to four bytes of 0 or 0x10).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn lanes_block_q5_0(w: *const u8, wrow: usize, i: usize) -> LanesBlock {
    // SAFETY: the caller guarantees block i (22 bytes) of each of 16 rows readable; the
    // masked loads read only its bytes 2..22.
    unsafe {
        let p = w.add(i * 22);
        let row = |r: usize| _mm256_maskz_loadu_epi32(0x1F, p.add(r * wrow + 2).cast());
        let mut z: [__m512i; 8] = core::array::from_fn(|k| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(row(2 * k)), row(2 * k + 1)));
        transpose_16x8(&mut z);
        let (h, low) = (z[0], _mm512_set1_epi8(0x0F));
        let table = _mm512_setr_epi32(
            0, 0x10, 0x1000, 0x1010, 0x10_0000, 0x10_0010, 0x10_1000, 0x10_1010,
            0x1000_0000, 0x1000_0010, 0x1000_1000, 0x1000_1010, 0x1010_0000, 0x1010_0010, 0x1010_1000, 0x1010_1010,
        );
        let x: [__m512i; 8] = core::array::from_fn(|j| {
            let q = z[1 + j % 4];
            let nib = if j < 4 { _mm512_and_si512(q, low) } else { _mm512_and_si512(_mm512_srli_epi32::<4>(q), low) };
            let fifth = _mm512_permutexvar_epi32(_mm512_srl_epi32(h, _mm_cvtsi32_si128(4 * j as i32)), table);
            _mm512_or_si512(nib, fifth)
        });
        (x, f16x16(p, wrow))
    }
}

/// Q8_0 / Q5_0 · Q8_0 with AVX-512 VNNI, [`LANES_TILE_ROWS`] rows in the lanes of a
/// vector × `T` tokens (the calling function's const parameter: [`LANES_TILE_TOKENS`],
/// or [`LANES_REST_TOKENS`] for a chunk's rest): llama.cpp's dot for these types keeps 8 f32
/// lanes per (row, token), lane j taking `acc_j = fma(dw·da, f32(Σ x·y over elements
/// 4j..4j + 4), acc_j)` block by block, then `hsum_ps` of the 8. Here register j of a
/// token holds lane j of 16 rows: per block the rows' weights transposed once
/// (`$block`: unsigned bytes `x + o`), per token the exact `Σ x·y` of every row and lane
/// as `vpdpbusd` of those bytes with the token's four bytes, from `-o·Σ y` (computed
/// once per token and block; with [`MAGIC_BITS`] added, so that the float of the sum is
/// one subtraction: |Σ x·y| ≤ 4·128·128), then the same `dw·da` product and fma; at the
/// end the 8 registers added as `hsum_ps` adds lanes (`((0+4)+(2+6)) + ((1+5)+(3+7))`).
/// So every output has the single dot's bits. Weights and the tokens' corrections and
/// scales are staged per range of [`LANES_STAGE_BLOCKS`] blocks, the accumulators kept
/// between ranges.
macro_rules! lanes_tile {
    ($nb:expr, $w:expr, $wrow:expr, $rows:expr, $a:expr, $arow:expr, $out:expr, $ostride:expr, $o:expr, $block:ident) => {{
        const G: usize = LANES_GROUPS;
        const SB: usize = LANES_STAGE_BLOCKS;
        let (nb, w, wrow, rows, a, arow, out, ostride) = ($nb, $w, $wrow, $rows, $a, $arow, $out, $ostride);
        let magic = _mm512_set1_ps(MAGIC);
        let mut corr = core::mem::MaybeUninit::<[[[i32; 8]; T]; SB]>::uninit();
        let mut da = core::mem::MaybeUninit::<[[f32; T]; SB]>::uninit();
        let mut wst = core::mem::MaybeUninit::<[LanesBlock; SB]>::uninit();
        let mut stash = core::mem::MaybeUninit::<[[[__m512; 8]; T]; G]>::uninit();
        let (cp, dp, wp, sp) = (corr.as_mut_ptr().cast::<[[i32; 8]; T]>(), da.as_mut_ptr().cast::<[f32; T]>(), wst.as_mut_ptr().cast::<LanesBlock>(), stash.as_mut_ptr().cast::<[[__m512; 8]; T]>());
        for g0 in (0..rows).step_by(G * LANES_TILE_ROWS) {
            let groups = ((rows - g0) / LANES_TILE_ROWS).min(G);
            let mut b0 = 0;
            while b0 < nb {
                let kb = (nb - b0).min(SB);
                let last = b0 + kb == nb;
                // (Entries 0..kb of corr, da and wst are written before any read.)
                for ib in 0..kb {
                    let i = b0 + ib;
                    for t in 0..T {
                        let y = _mm256_loadu_si256(a.add(t * arow + i * 34 + 2).cast());
                        _mm256_storeu_si256((*cp.add(ib))[t].as_mut_ptr().cast(), _mm256_add_epi32(neg_k_sums($o, y), _mm256_set1_epi32(MAGIC_BITS)));
                    }
                    for t8 in (0..T).step_by(8) {
                        _mm256_storeu_ps((*dp.add(ib)).as_mut_ptr().add(t8), f16x8(a.add(t8 * arow + i * 34), arow));
                    }
                }
                for g in 0..groups {
                    let r0 = g0 + g * LANES_TILE_ROWS;
                    for ib in 0..kb {
                        wp.add(ib).write($block(w.add(r0 * wrow), wrow, b0 + ib));
                    }
                    let st = &mut *sp.add(g);
                    for t0 in (0..T).step_by(2) {
                        let mut acc: [[__m512; 8]; 2] = if b0 == 0 { [[_mm512_setzero_ps(); 8]; 2] } else { [st[t0], st[t0 + 1]] };
                        for ib in 0..kb {
                            let (x, dw) = &*wp.add(ib);
                            for (tt, acc) in acc.iter_mut().enumerate() {
                                let t = t0 + tt;
                                let d = _mm512_mul_ps(*dw, _mm512_set1_ps((*dp.add(ib))[t]));
                                let (c, y) = (&(*cp.add(ib))[t], a.add(t * arow + (b0 + ib) * 34 + 2).cast::<i32>());
                                for j in 0..8 {
                                    let s = _mm512_dpbusd_epi32(_mm512_set1_epi32(c[j]), x[j], _mm512_set1_epi32(core::ptr::read_unaligned(y.add(j))));
                                    acc[j] = _mm512_fmadd_ps(d, _mm512_sub_ps(_mm512_castsi512_ps(s), magic), acc[j]);
                                }
                            }
                        }
                        for (tt, acc) in acc.iter().enumerate() {
                            if last {
                                _mm512_storeu_ps(out.add((t0 + tt) * ostride + r0), super::rows16::lane_tree512(acc));
                            } else {
                                st[t0 + tt] = *acc;
                            }
                        }
                    }
                }
                b0 += kb;
            }
        }
    }};
}

/// Q8_0 · Q8_0, rows in lanes ([`lanes_tile`]); `rows` a multiple of [`LANES_TILE_ROWS`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q8_0_q8_0_lanes<const T: usize>(nb: usize, w: *const u8, wrow: usize, rows: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: nb blocks of each of `rows` weight rows and of T activation rows readable,
    // out[t·ostride + r] writable (the wrapper's checks, for its T); every staged entry
    // is written before it is read (see lanes_tile).
    unsafe { lanes_tile!(nb, w, wrow, rows, a, arow, out, ostride, -128, lanes_block_q8_0) }
}

/// [`q8_0_q8_0_lanes`] over a matrix in the rows16 layout (its groups of 16 rows at
/// `w + 16·g·wrow`, as the plain rows they hold).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q8_0_q8_0_lanes_rows16<const T: usize>(nb: usize, w: *const u8, wrow: usize, rows: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: as q8_0_q8_0_lanes (the same bytes per group of rows).
    unsafe { lanes_tile!(nb, w, wrow, rows, a, arow, out, ostride, -128, lanes_block_q8_0_rows16) }
}

/// [`q5_0_q8_0_lanes`] over a matrix in the rows16 layout (its groups of 16 rows at
/// `w + 16·g·wrow`, as the plain rows they hold).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q5_0_q8_0_lanes_rows16<const T: usize>(nb: usize, w: *const u8, wrow: usize, rows: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: as q5_0_q8_0_lanes (the same bytes per group of rows).
    unsafe { lanes_tile!(nb, w, wrow, rows, a, arow, out, ostride, 16, lanes_block_q5_0_rows16) }
}

/// Q5_0 · Q8_0, rows in lanes ([`lanes_tile`]); `rows` a multiple of [`LANES_TILE_ROWS`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q5_0_q8_0_lanes<const T: usize>(nb: usize, w: *const u8, wrow: usize, rows: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: as q8_0_q8_0_lanes.
    unsafe { lanes_tile!(nb, w, wrow, rows, a, arow, out, ostride, 16, lanes_block_q5_0) }
}

// With AVX-512 VNNI: the one-accumulator tiles on 512-bit vectors, each pair's 8 lane
// sums by `vpdpbusd` (four u8·i8 products added into each i32 lane, exactly): the same
// exact integers as the AVX2 `maddubs`/`madd` pairs (no i16 saturation in either: see
// the single dots), then the same float operations. Bodies as above, with
// ZMM_TILE_TOKENS tokens; AVX-512 F/BW/VL/VNNI available (the wrappers are only handed
// out after `cpu_has_avx512_vnni()`).

/// Tokens of the 512-bit tiles (`lane_tile_zmm`).
pub(crate) const ZMM_TILE_TOKENS: usize = 8;

/// The tile loop of the one-accumulator types on 512-bit vectors ([`TILE_ROWS`] rows ×
/// [`ZMM_TILE_TOKENS`] tokens, each pair's own accumulator as in its single dot): two
/// tokens' pairs of a row share a vector (tokens
/// `2p` and `2p + 1` in the low and high halves), so each block takes one `vpdpbusd`,
/// one product, one conversion and one fma per two pairs. `$prep_a(ab0, ab1)` gives the
/// token pair's `[y, c]`, `$prep_w(wb)` the row's decoded weights (any value), `$lanes`
/// the 16 lanes of both pairs. Per half, every lane sum, product and fma is the single
/// dot's (`d` = `dw_r·da_t`, the same f32 product), in block order; the halves are then
/// summed by `hsum_ps` as in the dot. Q4_1's `summs`: `fma(mw_r, sa_t, summs)` per block
/// (lane 2t' + 1 of `$summs[r][q]`, t = 4q + t'), added after the horizontal sum.
macro_rules! lane_tile_zmm {
    ($nb:expr, $w:expr, $ws:expr, $wrow:expr, $a:expr, $as:expr, $arow:expr, $acc:ident, $summs:ident, $min:expr,
     |$ab0:ident, $ab1:ident| $prep_a:expr, |$wb:ident| $prep_w:expr, |$x:ident, $y:ident, $c:ident| $lanes:expr) => {{
        let (nb, w, a) = ($nb, $w, $a);
        for i in 0..nb {
            // Token scale pairs four tokens to a vector: fa[q] lane 2u = da, 2u + 1 = sa
            // of token 4q + u.
            let fa: [__m256; ZMM_TILE_TOKENS / 4] = core::array::from_fn(|q| scale_pairs(a.add(4 * q * $arow + i * $as), $arow));
            let (mut fw, mut fas) = ([0.0f32; 8], [0.0f32; 2 * ZMM_TILE_TOKENS]);
            _mm256_storeu_ps(fw.as_mut_ptr(), scale_pairs(w.add(i * $ws), $wrow));
            for (q, f) in fa.iter().enumerate() {
                _mm256_storeu_ps(fas.as_mut_ptr().add(8 * q), *f);
            }
            let mut ya = [[_mm512_setzero_si512(); 2]; ZMM_TILE_TOKENS / 2];
            let mut da = [_mm512_setzero_ps(); ZMM_TILE_TOKENS / 2];
            for p in 0..ZMM_TILE_TOKENS / 2 {
                let ($ab0, $ab1) = (a.add(2 * p * $arow + i * $as), a.add((2 * p + 1) * $arow + i * $as));
                ya[p] = $prep_a;
                // [da_2p ×8 | da_2p+1 ×8]
                let lo = _mm512_castps256_ps512(_mm256_broadcast_ss(&fas[4 * p]));
                da[p] = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(lo), _mm256_castps_pd(_mm256_broadcast_ss(&fas[4 * p + 2]))));
            }
            for r in 0..TILE_ROWS {
                let $wb = w.add(r * $wrow + i * $ws);
                let $x = $prep_w;
                if $min {
                    for (q, f) in fa.iter().enumerate() {
                        $summs[r][q] = _mm256_fmadd_ps(_mm256_broadcast_ss(&fw[2 * r + 1]), *f, $summs[r][q]);
                    }
                }
                let dw = _mm512_set1_ps(fw[2 * r]);
                for p in 0..ZMM_TILE_TOKENS / 2 {
                    let [$y, $c] = ya[p];
                    $acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da[p]), _mm512_cvtepi32_ps($lanes), $acc[r][p]);
                }
            }
        }
    }};
}

/// The outputs of a [`lane_tile_zmm`]: pair (r, t) is half `t % 2` of `acc[r][t / 2]`,
/// summed as the dot does, plus lane 2t' + 1 of `summs[r][q]` (t = 4q + t') for types
/// with a min.
macro_rules! lane_tile_zmm_out {
    ($acc:ident, $summs:ident, $min:expr, $out:expr, $ostride:expr) => {{
        for r in 0..TILE_ROWS {
            let mut m = [0.0f32; 2 * ZMM_TILE_TOKENS];
            for (q, v) in $summs[r].iter().enumerate() {
                _mm256_storeu_ps(m.as_mut_ptr().add(8 * q), *v);
            }
            for p in 0..ZMM_TILE_TOKENS / 2 {
                let v = $acc[r][p];
                let halves = [_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))];
                for (h, half) in halves.into_iter().enumerate() {
                    let t = 2 * p + h;
                    *$out.add(t * $ostride + r) = if $min { hsum_ps(half) + m[2 * t + 1] } else { hsum_ps(half) };
                }
            }
        }
    }};
}

/// Two 32-byte blocks as the halves of a 512-bit vector.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pair512(p0: *const u8, p1: *const u8) -> __m512i {
    // SAFETY: the caller guarantees 32 readable bytes at p0 and at p1.
    unsafe { _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_loadu_si256(p0.cast())), _mm256_loadu_si256(p1.cast())) }
}

/// Q4_1 · Q8_1 tile, AVX-512 VNNI: lanes `Σ x·y` (x unsigned nibbles) directly.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q4_1_q8_1_zmm(nb: usize, w: *const u8, wrow: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: see above; layouts d@0 m@2 qs@4 and d@0 s@2 qs@4.
    unsafe {
        let zero = _mm512_setzero_si512();
        let mut acc = [[_mm512_setzero_ps(); ZMM_TILE_TOKENS / 2]; TILE_ROWS];
        let mut summs = [[_mm256_setzero_ps(); ZMM_TILE_TOKENS / 4]; TILE_ROWS];
        lane_tile_zmm!(nb, w, 20, wrow, a, 36, arow, acc, summs, true,
            |ab0, ab1| [pair512(ab0.add(4), ab1.add(4)), zero],
            |wb| _mm512_broadcast_i64x4(nibbles(wb.add(4))),
            |x, y, _c| _mm512_dpbusd_epi32(zero, x, y));
        lane_tile_zmm_out!(acc, summs, true, out, ostride);
    }
}

/// Most token pairs of [`q8_0_q8_0_pairs_zmm`].
pub(crate) const PAIRS_MAX: usize = 4;

/// Q8_0 · Q8_0 for short batches (speculative verification), AVX-512 VNNI: `R` weight
/// rows × `P` token pairs (tokens `2p`, `2p + 1` in the halves of a 512-bit vector, as
/// [`lane_tile_zmm`] holds them), the weights read once for all tokens. Per block: each
/// token pair's activations with their sign bits flipped (`y + 128`, unsigned) and its
/// scales `[da_2p ×8 | da_2p+1 ×8]`; per row the weight broadcast to both halves, the
/// correction `-128·Σ x` per lane, `dw`; per (row, pair) the lanes `Σ x·(y + 128) - 128·Σ x`
/// (the exact integer lanes of the single dot), `d = dw·da` and
/// `acc = fma(d, f32(lanes), acc)`: the dot's operations per pair in block order, so each
/// output has `qdot::q8_0_q8_0`'s bits (the halves summed by `hsum_ps` as in the dot).
/// Output (row r, token t) at `out[t * ostride + r]`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q8_0_q8_0_pairs_zmm<const R: usize, const P: usize>(nb: usize, w: *const u8, wrow: usize, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    // SAFETY: R rows of nb blocks from w (stride wrow), 2P activation rows of nb blocks
    // from a (stride arow), outputs (t < 2P, r < R) writable (the wrapper's checks);
    // layout d@0 qs@2 for both.
    unsafe {
        let (flip, zero) = (_mm512_set1_epi8(-128), _mm512_setzero_si512());
        // The f16 at p as f32 (F16C: exact).
        let h = |p: *const u8| _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(core::ptr::read_unaligned(p.cast::<u16>()) as i32)));
        let mut acc = [[_mm512_setzero_ps(); P]; R];
        for i in 0..nb {
            let mut y = [zero; P];
            let mut da = [_mm512_setzero_ps(); P];
            for p in 0..P {
                let (a0, a1) = (a.add(2 * p * arow + i * 34), a.add((2 * p + 1) * arow + i * 34));
                y[p] = _mm512_xor_si512(pair512(a0.add(2), a1.add(2)), flip);
                let lo = _mm512_castps256_ps512(_mm256_set1_ps(h(a0)));
                da[p] = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(lo), _mm256_castps_pd(_mm256_set1_ps(h(a1)))));
            }
            for r in 0..R {
                let wb = w.add(r * wrow + i * 34);
                let x = _mm512_broadcast_i64x4(_mm256_loadu_si256(wb.add(2).cast()));
                let c = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, flip, x));
                let dw = _mm512_set1_ps(h(wb));
                for p in 0..P {
                    acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da[p]), _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c, y[p], x)), acc[r][p]);
                }
            }
        }
        for r in 0..R {
            for p in 0..P {
                let v = acc[r][p];
                let halves = [_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))];
                for (hf, half) in halves.into_iter().enumerate() {
                    *out.add((2 * p + hf) * ostride + r) = hsum_ps(half);
                }
            }
        }
    }
}

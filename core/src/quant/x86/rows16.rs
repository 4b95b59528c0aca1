//! The kernels over the rows16 layout (`quant::rows16`): one group of 16 rows against one
//! activation row, row `r` in lane `r` of every vector (AVX-512 VNNI), or of the vector
//! of its half (AVX2 alone: Q4_1, Q4_0, Q8_0, Q5_0 and Q4_K, `*_group_avx2`).
//!
//! Each keeps llama.cpp's x86 `vec_dot` arithmetic per row (its 8 f32 lanes, lane `j`
//! the exact integer sum over elements `4j..4j + 4`, `acc_j = fma(dw·da, f32(s_j),
//! acc_j)` in block order, Q4_1's `summs = fma(mw, sa, summs)`, then `hsum`'s tree over
//! the 8 lanes (`+ summs`)), with lane `j` of the sixteen rows in one vector: per (16
//! rows, block) one `vpdpbusd`, conversion and fma per `j` and no shuffle at all (the
//! plain 8-row kernels spend most of their operations gathering rows' scales and moving
//! rows to lanes). From L1 on the AMD EPYC Zen 4 (`quant::bench::bench_rows16`, 576 and
//! 2048 columns): Q4_1 0.40-0.41 ns per (row, block) against 0.79-0.84 for the plain 8-row
//! kernel, Q8_0 0.47-0.48 against 0.77-0.80.

use core::arch::x86_64::*;

use super::rd32;

/// How far ahead of the block it computes a kernel asks for its weights (into L1): its
/// `PF`, in bytes (0: no hints). A group is one contiguous run of bytes and a product's
/// groups follow one another, so the hint runs down the same stream the kernel reads.
/// The kernel table picks it by CPU (`x86::build`):
/// - Intel ([`PREFETCH_INTEL`]): on the Xeon VM (whose hardware prefetchers do not carry
///   a stream alone) one-thread decode gained 20-30% (2, 4 and 8 KiB into L1 and 8-16 KiB
///   into L2 all gained; 4 KiB into L1 the most); on a later Xeon VM (2026-12-06, ~19.5
///   GB/s a core) a second hint for each line [`PREFETCH_FAR_L2`] ahead into L2, beside
///   the 4 KiB one into L1, took decode up 3-17% at one and two threads on every model
///   (Gemma 3 the most; 12-24 KiB alike; BENCHMARKS.md);
/// - AMD Zen 4 (family 19h with AVX-512): none; any hint here made decode slower;
/// - other AMD, Zen 5 (family 1Ah) among them ([`PREFETCH_AMD`]): on the Zen 5 VM
///   (2026-12-05) one-thread decode gained 8-14% with 4 KiB and, with 8 KiB, 17-30% on
///   SmolLM2 and 7% on Gemma 3 (2 KiB less, 12 and 16 KiB no more, 4 KiB into L2 alike;
///   BENCHMARKS.md);
/// - the AVX2 kernels (no AVX-512: Zen 3, Zen 1; Intel cores without it) [`PREFETCH_AVX2`],
///   and on Intel [`PREFETCH_INTEL`]: on the faster Xeon VM (2026-12-06, the AVX2 set
///   forced) its far L2 hint took one-thread decode up 8-26% and two-thread 3-22% on every
///   model (Gemma 3 +18% and +22%; BENCHMARKS.md). On the AMD EPYC Zen 3 (2026-12-07) it
///   made Gemma 3's one-thread decode slower (0.94x), as the AVX-512 kernels' far hint did
///   on the Zen 5, and no other form streamed faster than 4 KiB into L1 (2-12 KiB into L1,
///   non-temporal at 4 and 8 KiB, into L2 at 8-32 KiB with or without a near hint into
///   L1; none: 0.77x; BENCHMARKS.md).
/// Encoded as the L1 distance plus 2 (`PF % 4 == 2`): [`prefetch_ahead`]'s form with the
/// second, far hint into L2.
pub(super) const PREFETCH_INTEL: usize = 4096 + 2;
/// How far ahead [`PREFETCH_INTEL`]'s second hint asks for each line (into L2).
pub(super) const PREFETCH_FAR_L2: usize = 16384;
/// See [`PREFETCH_INTEL`].
pub(super) const PREFETCH_AMD: usize = 8192;
/// See [`PREFETCH_INTEL`].
pub(super) const PREFETCH_AVX2: usize = 4096;
/// [`PREFETCH_AVX2`]'s hints (encoded as its distance plus 4, `PF % 8 == 4`), and one
/// token's groups read as three streams side by side (`x86::streams_of`), for the AMD
/// CPUs of family 19h without AVX-512 (Zen 3): there one-thread decode took 9-16% more
/// tokens a second so (measured while the Q8_0 kernels still called `array::map`, see
/// `lane_parts`); on the Zen 5 with the AVX2 set forced the same form made it 1.2-1.6x
/// slower, so every other CPU keeps one stream (BENCHMARKS.md, "Speed II on the AMD EPYC
/// Zen 5, twentieth session").
pub(super) const PREFETCH_AVX2_STREAMS: usize = PREFETCH_AVX2 + 4;
/// [`PREFETCH_AMD`]'s distance with the non-temporal hint (`prefetchnta`; an odd `PF`
/// means the hint at `PF - 1`), for a model whose weights a token far exceed the L3
/// (`Kernels::for_weights`): lines that cannot survive until the next token are not kept.
/// On the Zen 5 VM (2026-12-05) Gemma 3's one-thread decode (246 MB a token, 32 MiB L3)
/// gained 8-13%; SmolLM2 Q4_1 and Q4_0 (91-98 MB) lost 5-6%, the part of their weights
/// the L3 still holds at the next token no longer there (BENCHMARKS.md).
pub(super) const PREFETCH_AMD_STREAM: usize = PREFETCH_AMD + 1;

/// With `PF` > 0, a hint for each line of the `GB` bytes `PF` bytes after `g` into L1
/// (blocks follow one another, so the calls for consecutive blocks cover every line),
/// non-temporal for an odd `PF` (at `PF - 1`), for `PF % 4 == 2` at `PF - 2` with a
/// second one [`PREFETCH_FAR_L2`] after `g` into L2, for `PF % 8 == 4` at `PF - 4` (the
/// three-stream tables' one-stream calls, [`PREFETCH_AVX2_STREAMS`]); nothing with 0.
/// (A hint only: it cannot fault, so it may point past the weights.)
#[inline(always)]
fn prefetch_ahead<const PF: usize, const GB: usize>(g: *const u8) {
    // The whole block as one part: every line, in order.
    prefetch_ahead_part::<PF, GB>(g, 0, 1);
}

/// [`prefetch_ahead`]'s hints for the line at `off` bytes past `g` (`PF` > 0).
#[inline(always)]
fn hint_line<const PF: usize>(g: *const u8, off: usize) {
    // SAFETY: prefetch never faults and reads nothing the program sees.
    unsafe {
        if PF % 2 == 1 {
            _mm_prefetch::<_MM_HINT_NTA>(g.wrapping_add(PF - 1 + off).cast());
        } else if PF % 4 == 2 {
            _mm_prefetch::<_MM_HINT_T0>(g.wrapping_add(PF - 2 + off).cast());
            _mm_prefetch::<_MM_HINT_T1>(g.wrapping_add(PREFETCH_FAR_L2 + off).cast());
        } else if PF % 8 == 4 {
            _mm_prefetch::<_MM_HINT_T0>(g.wrapping_add(PF - 4 + off).cast());
        } else {
            _mm_prefetch::<_MM_HINT_T0>(g.wrapping_add(PF + off).cast());
        }
    }
}

/// [`prefetch_ahead`]'s hints for part `i` of `n` of the `GB` bytes after `g` (its lines
/// [`part_lines`]): a kernel that spreads them over its loop, part `i` in iteration `i`,
/// asks for the same lines. The K-quants' groups are 36 (Q4_K) and 53 (Q6_K) lines a
/// super-block; their kernels asking for all of them at once streamed slower than with
/// the hints spread over the loop over the chunks (`quant::bench::bench_rows16_stream`,
/// the Xeon VM, one thread, 2026-12-07: Q4_K 1.16x with the hints spread over its four
/// 64-element groups and another 1.04-1.06x over its 32 chunks; Q6_K 1.10-1.12x over its
/// eight lanes, level over sixteen). The AVX2 Q8_0 and Q5_0 kernels, whose second half of
/// each pass reads from L1 what the first brought, split each block's hints between the
/// halves: Q8_0 1.06-1.09x, Q5_0 1.02-1.03x (the AVX2 set forced on the same VM). Even the
/// AVX-512 Q8_0 and Q5_0 kernels, whose blocks are 8.5 and 5.5 lines, stream faster with
/// their hints spread over their eight lanes (1.07x and 1.12-1.15x), and the Q4_1 and Q4_0
/// ones (5 and 4.5 lines) over their four chunks (1.05-1.07x and 1.01x). Batches of several
/// tokens a call take them at once ([`prefetch_ahead`]): there the spread cost the K-quants'
/// prompt kernels 13-20%.
#[inline(always)]
fn prefetch_ahead_part<const PF: usize, const GB: usize>(g: *const u8, i: usize, n: usize) {
    let (l0, l1) = part_lines(GB.div_ceil(64), i, n);
    if PF > 0 {
        for l in l0..l1 {
            hint_line::<PF>(g, 64 * l);
        }
    }
}

/// Lines `⌈i·lines/n⌉..⌈(i+1)·lines/n⌉` of a block of `lines` lines: part `i` of `n`, the
/// parts `0..n` each line once.
const fn part_lines(lines: usize, i: usize, n: usize) -> (usize, usize) {
    ((i * lines).div_ceil(n), ((i + 1) * lines).div_ceil(n))
}

/// Bytes of one Q4_1 (group, block): 16 blocks of 20 bytes.
const GROUP_BLOCK_BYTES: usize = 16 * 20;
/// Bytes of one Q8_0 (group, block): 16 blocks of 34 bytes.
const GROUP_BLOCK_BYTES_Q8_0: usize = 16 * 34;
/// Bytes of one Q4_0 (group, block): 16 blocks of 18 bytes.
const GROUP_BLOCK_BYTES_Q4_0: usize = 16 * 18;
/// Bytes of one Q5_0 (group, block): 16 blocks of 22 bytes.
const GROUP_BLOCK_BYTES_Q5_0: usize = 16 * 22;

/// Q4_1 · Q8_1 for one rows16 group (`nb` blocks at `w`) against one activation row
/// (`nb` Q8_1 blocks at `a`): `out[r]` gets row `r`'s dot, the bits of `qdot::q4_1_q8_1`.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI available; `nb * GROUP_BLOCK_BYTES` bytes
/// readable at `w`, `nb * 36` at `a`, 16 floats writable at `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn q4_1_q8_1_group<const PF: usize>(nb: usize, w: *const u8, a: *const u8, out: *mut f32) {
    // SAFETY: the caller's contract; layouts above and d@0 s@2 qs@4 for the activation.
    unsafe {
        let m4 = _mm512_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); 8];
        let mut summs = _mm512_setzero_ps();
        for k in 0..nb {
            let g = w.add(k * GROUP_BLOCK_BYTES);
            let ab = a.add(k * 36);
            let f = _mm_cvtph_ps(_mm_cvtsi32_si128(rd32(ab))); // [da, sa, 0, 0] (F16C: exact)
            let (da, sa) = (_mm512_broadcastss_ps(f), _mm512_broadcastss_ps(_mm_movehdup_ps(f)));
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(g.cast()));
            let mw = _mm512_cvtph_ps(_mm256_loadu_si256(g.add(32).cast()));
            let d = _mm512_mul_ps(dw, da);
            summs = _mm512_fmadd_ps(mw, sa, summs);
            for c in 0..4 {
                prefetch_ahead_part::<PF, GROUP_BLOCK_BYTES>(g, c, 4);
                let q = _mm512_loadu_si512(g.add(64 + 64 * c).cast());
                let (lo, hi) = (_mm512_and_si512(q, m4), _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4));
                let ylo = _mm512_set1_epi32(rd32(ab.add(4 + 4 * c)));
                let yhi = _mm512_set1_epi32(rd32(ab.add(20 + 4 * c)));
                let slo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, ylo);
                let shi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, yhi);
                acc[c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(slo), acc[c]);
                acc[c + 4] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(shi), acc[c + 4]);
            }
        }
        _mm512_storeu_ps(out, _mm512_add_ps(lane_tree512(&acc), summs));
    }
}

/// `hsum_ps`'s tree lane by lane over the 8 lane accumulators of 8 rows:
/// `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn lane_tree(acc: &[__m256; 8]) -> __m256 {
    // SAFETY: value-only intrinsics; AVX available (target features).
    unsafe {
        let t = [0, 1, 2, 3].map(|j| _mm256_add_ps(acc[j], acc[j + 4]));
        _mm256_add_ps(_mm256_add_ps(t[0], t[2]), _mm256_add_ps(t[1], t[3]))
    }
}

/// [`lane_tree`] over the 8 lane accumulators of 16 rows (512-bit vectors).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(super) unsafe fn lane_tree512(acc: &[__m512; 8]) -> __m512 {
    // SAFETY: value-only intrinsics; AVX-512 F available (target features).
    unsafe {
        let t = [0, 1, 2, 3].map(|j| _mm512_add_ps(acc[j], acc[j + 4]));
        _mm512_add_ps(_mm512_add_ps(t[0], t[2]), _mm512_add_ps(t[1], t[3]))
    }
}

/// The AVX2 group kernels' passes over `$groups` groups at once (1, or 3 for the
/// three-stream kernels): each group's state, `[[[__m256; $n]; 2]; $groups]` (per half of 8
/// rows, its accumulators: the eight lanes' and, for Q4_1, `summs`), zero at the start and
/// kept in memory between passes; over each `$pass` blocks `$k0..$k1`, `$pre` once, then
/// `$body` for each group `$s` in turn with its halves' state `$halves` (a
/// [`halves_in_turn`] or [`lane_parts`]: every accumulator takes its blocks in order, so
/// one group or three, any pass, the same bits). The value: the state. (Each type's one-
/// and three-group kernels stay two functions: one generic over the group count measured
/// the one-group Q8_0 kernel 11% slower from L1 on the AMD EPYC Zen 3, an accumulator
/// spilled to the stack inside its loop.)
macro_rules! in_passes {
    ($groups:expr, $n:expr, $nb:expr, $pass:expr, |$k0:ident, $k1:ident| $pre:block, |$s:ident, $halves:ident| $body:block) => {{
        let nb: usize = $nb;
        let mut state = [[[_mm256_setzero_ps(); $n]; 2]; $groups];
        let mut $k0 = 0;
        while $k0 < nb {
            let $k1 = ($k0 + $pass).min(nb);
            $pre
            for ($s, $halves) in state.iter_mut().enumerate() $body
            $k0 = $k1;
        }
        state
    }};
}

/// One group's work in an [`in_passes`] pass `$k0..$k1`: its two halves of 8 rows in turn
/// (the second reads the pass's blocks again, from L1), `$acc` the half's state (from
/// `$halves`, written back after), `$body` run for half `$h` and block `$k`.
macro_rules! halves_in_turn {
    ($halves:ident, $k0:ident, $k1:ident, |$h:ident, $k:ident, $acc:ident| $body:block) => {
        for ($h, saved) in $halves.iter_mut().enumerate() {
            let mut $acc = *saved;
            for $k in $k0..$k1 $body
            *saved = $acc;
        }
    };
}

/// [`halves_in_turn`] split by lanes instead of rows: lanes 0-3 of both halves (`$part`
/// 0), then lanes 4-7 (`$part` 1), `$acc` the part's accumulators (`$acc[h][i]` lane
/// `4·$part + i` of half `h`), `$body` run for part `$part` and block `$k`. Each
/// accumulator still takes its blocks in order, so the same sums as halves in turn; but
/// both parts read new lines (in the layout lanes 0-3 and 4-7 are each their own stretch of
/// a block), where with halves in turn the first half asks for every line of the pass and
/// the second for none. On the AMD EPYC Zen 3 the Q8_0 kernel then streams a 239 MiB
/// matrix 9-20% faster, at about a bare read loop's rate (BENCHMARKS.md, "Speed II on the
/// AMD EPYC Zen 3, sixth session"). Each part written out, its lanes constants (a loop over
/// the two parts indexed the accumulators at run time: on the Zen 3, 1.42 ns per (row,
/// block) from L1 against 0.91).
macro_rules! lane_parts {
    ($halves:ident, $k0:ident, $k1:ident, |$part:ident, $k:ident, $acc:ident| $body:block) => {
        lane_parts!(@part 0, $halves, $k0, $k1, |$part, $k, $acc| $body);
        lane_parts!(@part 1, $halves, $k0, $k1, |$part, $k, $acc| $body);
    };
    (@part $p:expr, $halves:ident, $k0:ident, $k1:ident, |$part:ident, $k:ident, $acc:ident| $body:block) => {{
        const PART: usize = $p;
        let $part = PART;
        // (Indexed out, not by `map`: in the keel binary (thin LTO) `array::map` stayed a
        // call compiled without the kernel's AVX2, calling the closure per element through
        // memory; the Zen 5 with the AVX2 set decoded 1.2-1.7x slower so, BENCHMARKS.md,
        // "Speed II on the AMD EPYC Zen 5, twentieth session".)
        let mut $acc: [[__m256; 4]; 2] = [
            [$halves[0][4 * PART], $halves[0][4 * PART + 1], $halves[0][4 * PART + 2], $halves[0][4 * PART + 3]],
            [$halves[1][4 * PART], $halves[1][4 * PART + 1], $halves[1][4 * PART + 2], $halves[1][4 * PART + 3]],
        ];
        for $k in $k0..$k1 $body
        for h in 0..2 {
            $halves[h][4 * PART..4 * PART + 4].copy_from_slice(&$acc[h]);
        }
    }};
}

/// [`lane_tree`] of each half of each group's 8-lane state (`state[s][h]`, from
/// [`in_passes`]) into rows `8h..8h + 8` of `out[s]`.
///
/// # Safety
/// AVX2 available; 16 floats writable at each `out[s]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store_lane_trees<const S: usize>(state: &[[[__m256; 8]; 2]; S], out: [*mut f32; S]) {
    // SAFETY: the caller's contract.
    unsafe {
        for (halves, out) in state.iter().zip(out) {
            for (h, acc) in halves.iter().enumerate() {
                _mm256_storeu_ps(out.add(8 * h), lane_tree(acc));
            }
        }
    }
}

/// [`q4_1_q8_1_group`] with AVX2 only: the group's two halves of 8 rows one after the
/// other (a half's eight lane accumulators and `summs` in 256-bit registers; the second
/// half reads the group's lines again, from L1), each lane `j` of 8 rows as
/// `madd(maddubs(x, y), 1)` (the plain AVX2 dot's exact integers), the same `dw·da`
/// product, fmas and tree.
///
/// # Safety
/// AVX2, FMA and F16C available; `nb * GROUP_BLOCK_BYTES` bytes readable at `w`, `nb * 36`
/// at `a`, 16 floats writable at `out`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_1_q8_1_group_avx2<const PF: usize>(nb: usize, w: *const u8, a: *const u8, out: *mut f32) {
    // SAFETY: the caller's contract; layouts above and d@0 s@2 qs@4 for the activation.
    unsafe {
        for h in 0..2 {
            let mut st = [_mm256_setzero_ps(); 9];
            for k in 0..nb {
                let g = w.add(k * GROUP_BLOCK_BYTES);
                if h == 0 {
                    prefetch_ahead::<PF, GROUP_BLOCK_BYTES>(g);
                }
                q4_1_half_block_avx2(g, a.add(k * 36), h, &mut st);
            }
            q4_1_store_half(&st, out.add(8 * h));
        }
    }
}

/// [`q4_1_q8_1_group_avx2`]'s work on half `h` of the group block at `g` against the
/// activation block at `ab`: its state `st` (the eight lane accumulators, then `summs`)
/// updated.
///
/// # Safety
/// AVX2, FMA and F16C available; the group block's bytes at `g`, the block's 36 at `ab`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_half_block_avx2(g: *const u8, ab: *const u8, h: usize, st: &mut [__m256; 9]) {
    // SAFETY: the caller's contract; layouts above and d@0 s@2 qs@4 for the activation.
    unsafe {
        let (m4, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1));
        let f = _mm_cvtph_ps(_mm_cvtsi32_si128(rd32(ab))); // [da, sa, 0, 0] (F16C: exact)
        let (da, sa) = (_mm256_broadcastss_ps(f), _mm256_broadcastss_ps(_mm_movehdup_ps(f)));
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(g.add(16 * h).cast()));
        let mw = _mm256_cvtph_ps(_mm_loadu_si128(g.add(32 + 16 * h).cast()));
        let d = _mm256_mul_ps(dw, da);
        st[8] = _mm256_fmadd_ps(mw, sa, st[8]);
        for c in 0..4 {
            let q = _mm256_loadu_si256(g.add(64 + 64 * c + 32 * h).cast());
            let (lo, hi) = (_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4));
            let ylo = _mm256_set1_epi32(rd32(ab.add(4 + 4 * c)));
            let yhi = _mm256_set1_epi32(rd32(ab.add(20 + 4 * c)));
            let slo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo), ones);
            let shi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi), ones);
            st[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(slo), st[c]);
            st[c + 4] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(shi), st[c + 4]);
        }
    }
}

/// A Q4_1 half's result from its state `st` ([`q4_1_half_block_avx2`]) into the 8 floats
/// at `out`: the lanes' tree, then `summs`.
///
/// # Safety
/// AVX2 available; 8 floats writable at `out`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_store_half(st: &[__m256; 9], out: *mut f32) {
    // SAFETY: the caller's contract.
    unsafe {
        let acc: [__m256; 8] = core::array::from_fn(|j| st[j]);
        _mm256_storeu_ps(out, _mm256_add_ps(lane_tree(&acc), st[8]));
    }
}

/// Blocks per pass of [`q4_1_q8_1_group3_avx2`] (1280 bytes of each group a pass).
const Q4_1_STREAMS_PASS_BLOCKS: usize = 4;

/// [`q4_1_q8_1_group_avx2`] for three groups at once (`w[s]`, `out[s]`): each pass of
/// [`Q4_1_STREAMS_PASS_BLOCKS`] blocks of the three groups in turn, each group a half at a
/// time, a half's accumulators and `summs` in memory between its passes, every
/// accumulator taking its blocks in order (the same bits), the three groups read as three
/// streams side by side (as [`q4_0_q8_0_group3_avx2`]).
///
/// # Safety
/// As [`q4_1_q8_1_group_avx2`] for each of the three groups.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_1_q8_1_group3_avx2(nb: usize, w: [*const u8; 3], a: *const u8, out: [*mut f32; 3]) {
    // SAFETY: the caller's contract; layouts as the one-group kernel's.
    unsafe {
        let state = in_passes!(3, 9, nb, Q4_1_STREAMS_PASS_BLOCKS, |k0, k1| {}, |s, halves| {
            halves_in_turn!(halves, k0, k1, |h, k, st| {
                let g = w[s].add(k * GROUP_BLOCK_BYTES);
                if h == 0 {
                    prefetch_ahead::<STREAMS_AHEAD, GROUP_BLOCK_BYTES>(g);
                }
                q4_1_half_block_avx2(g, a.add(k * 36), h, &mut st);
            });
        });
        for (halves, out) in state.iter().zip(out) {
            for (h, st) in halves.iter().enumerate() {
                q4_1_store_half(st, out.add(8 * h));
            }
        }
    }
}

/// [`q4_0_q8_0_group`] for one token with AVX2 only: the group's two halves of 8 rows
/// side by side (one accumulator each), per block and half each row's exact `Σ q·y` as
/// eight `maddubs` of the unsigned nibbles (lane r: row r's four) against the token's
/// broadcast bytes, added as i16 (at most 8·2·15·128 in magnitude: no saturation), then
/// `madd` with ones and `-8·Σ y` of the block added, the same `dw·da` product and fma as
/// the dot, in block order.
///
/// # Safety
/// AVX2, FMA and F16C available; `nb * GROUP_BLOCK_BYTES_Q4_0` bytes readable at `w`,
/// `nb * 34` at `a`, 16 floats writable at `out`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_0_q8_0_group_avx2<const PF: usize>(nb: usize, w: *const u8, a: *const u8, out: *mut f32) {
    // SAFETY: the caller's contract; activation layout d@0 qs@2.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 2];
        for k in 0..nb {
            let g = w.add(k * GROUP_BLOCK_BYTES_Q4_0);
            prefetch_ahead::<PF, GROUP_BLOCK_BYTES_Q4_0>(g);
            let ab = a.add(k * 34);
            let t = q4_0_token_block_avx2(ab);
            q4_0_block_avx2(g, &t, &mut acc);
        }
        _mm256_storeu_ps(out, acc[0]);
        _mm256_storeu_ps(out.add(8), acc[1]);
    }
}

/// What [`q4_0_q8_0_group_avx2`] needs of the token's activation block at `ab` (d@0
/// qs@2): its scale in every lane (exact), `-8·Σ y` over it in every lane (exact: at most
/// 8·32·128), its eight lanes of four bytes each broadcast.
struct Q4_0TokenBlock {
    da: __m256,
    neg: __m256i,
    y: [__m256i; 8],
}

/// [`Q4_0TokenBlock`] of the activation block at `ab`.
///
/// # Safety
/// AVX2, FMA and F16C available; 34 bytes at `ab`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_token_block_avx2(ab: *const u8) -> Q4_0TokenBlock {
    // SAFETY: the caller's contract.
    unsafe {
        let (ones, eights) = (_mm256_set1_epi16(1), _mm256_set1_epi8(8));
        let da = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(rd32(ab)))); // (F16C: exact)
        let e = _mm256_madd_epi16(_mm256_maddubs_epi16(eights, _mm256_loadu_si256(ab.add(2).cast())), ones);
        let e = _mm256_add_epi32(e, _mm256_permute2x128_si256::<0x01>(e, e));
        let e = _mm256_add_epi32(e, _mm256_shuffle_epi32::<0b01_00_11_10>(e));
        let e = _mm256_add_epi32(e, _mm256_shuffle_epi32::<0b10_11_00_01>(e));
        let neg = _mm256_sub_epi32(_mm256_setzero_si256(), e);
        Q4_0TokenBlock { da, neg, y: core::array::from_fn(|j| _mm256_set1_epi32(rd32(ab.add(2 + 4 * j)))) }
    }
}

/// [`q4_0_q8_0_group_avx2`]'s work on the group block at `g` against the token's block
/// `t`: both halves' accumulators updated.
///
/// # Safety
/// AVX2, FMA and F16C available; the group block's bytes at `g`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_block_avx2(g: *const u8, t: &Q4_0TokenBlock, acc: &mut [__m256; 2]) {
    // SAFETY: the caller's contract.
    unsafe {
        let (m4, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1));
        for (h, acc) in acc.iter_mut().enumerate() {
            let mut s16 = _mm256_setzero_si256();
            for c in 0..4 {
                let q = _mm256_loadu_si256(g.add(32 + 64 * c + 32 * h).cast());
                let (lo, hi) = (_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4));
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo, t.y[c]));
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi, t.y[4 + c]));
            }
            let sum = _mm256_add_epi32(t.neg, _mm256_madd_epi16(s16, ones));
            let d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(g.add(16 * h).cast())), t.da);
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), d, *acc);
        }
    }
}

/// [`q4_0_q8_0_group_avx2`] for three groups at once (`w[s]`, `out[s]`), block by block:
/// each block's activation work done once for the three, each group's blocks in order and
/// each output the same operations as the one-group kernel (the same bits). The three are
/// read as three streams side by side, each line asked for [`STREAMS_AHEAD`] bytes ahead
/// in its own stream: on the AMD EPYC Zen 3 one core streams a matrix ~40% faster so than
/// one group at a time (BENCHMARKS.md, "Speed II on the AMD EPYC Zen 3, seventh session").
///
/// # Safety
/// As [`q4_0_q8_0_group_avx2`] for each of the three groups.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_0_q8_0_group3_avx2(nb: usize, w: [*const u8; 3], a: *const u8, out: [*mut f32; 3]) {
    // SAFETY: the caller's contract; activation layout d@0 qs@2.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; 3];
        for k in 0..nb {
            let t = q4_0_token_block_avx2(a.add(k * 34));
            for (s, acc) in acc.iter_mut().enumerate() {
                let g = w[s].add(k * GROUP_BLOCK_BYTES_Q4_0);
                prefetch_ahead::<STREAMS_AHEAD, GROUP_BLOCK_BYTES_Q4_0>(g);
                q4_0_block_avx2(g, &t, acc);
            }
        }
        for (s, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(out[s], acc[0]);
            _mm256_storeu_ps(out[s].add(8), acc[1]);
        }
    }
}

/// How far ahead in its own stream a three-stream kernel asks for each line (into L1).
pub(crate) const STREAMS_AHEAD: usize = 1024;

/// The body of the rows16 kernels of llama.cpp's 8-lane types (Q8_0, Q5_0): per block
/// `k` of the group at `$w` (`$gb` bytes a block), `d = dw·da` for the 16 rows, each lane
/// `j`'s exact `Σ x·y - o·Σ y` (`$x` the block's unsigned weights `x = q + o` from `|$g|`,
/// `o` given as `$k` = `-o` as an i8: -128 for Q8_0, 16 for Q5_0) from `-o·Σ y` by one
/// `vpdpbusd`, then `acc_j = fma(d, f32(sum), acc_j)`; at the end `hsum_ps`'s tree over
/// the 8 lanes, row `r`'s result in lane `r` of `$out`. `$pf`: [`prefetch_ahead`]'s `PF`,
/// the block's hints asked for an eighth at a time, one per lane ([`prefetch_ahead_part`]).
macro_rules! lanes8_group {
    ($pf:ident, $nb:expr, $w:expr, $a:expr, $out:expr, $gb:expr, $k:expr, |$g:ident| $x:expr) => {{
        let mut acc = [_mm512_setzero_ps(); 8];
        for k in 0..$nb {
            let $g = $w.add(k * $gb);
            let ab = $a.add(k * 34);
            let da = _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(rd32(ab)))); // (F16C: exact)
            let d = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256($g.cast())), da);
            // -o·Σ y per lane j of the activation block.
            let mut c = [0i32; 8];
            _mm256_storeu_si256(c.as_mut_ptr().cast(), super::qdot::neg_k_sums($k, _mm256_loadu_si256(ab.add(2).cast())));
            let x: [__m512i; 8] = $x;
            for j in 0..8 {
                // The block's hints an eighth at a time, beside the lanes' work.
                prefetch_ahead_part::<$pf, { $gb }>($g, j, 8);
                let s = _mm512_dpbusd_epi32(_mm512_set1_epi32(c[j]), x[j], _mm512_set1_epi32(rd32(ab.add(2 + 4 * j))));
                acc[j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc[j]);
            }
        }
        _mm512_storeu_ps($out, lane_tree512(&acc));
    }};
}

/// Q8_0 · Q8_0 for one rows16 group: `out[r]` gets row `r`'s dot, the bits of
/// `qdot::q8_0_q8_0` (lane `j` `Σ w·y` over elements `4j..4j + 4` as
/// `Σ (w + 128)·y - 128·Σ y`: exact integers).
///
/// # Safety
/// As [`q4_1_q8_1_group`], with `nb * GROUP_BLOCK_BYTES_Q8_0` bytes at `w` and `nb * 34`
/// at `a`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn q8_0_q8_0_group<const PF: usize>(nb: usize, w: *const u8, a: *const u8, out: *mut f32) {
    // SAFETY: the caller's contract; activation layout d@0 qs@2.
    unsafe {
        let flip = _mm512_set1_epi8(-128);
        lanes8_group!(PF, nb, w, a, out, GROUP_BLOCK_BYTES_Q8_0, -128, |g| core::array::from_fn(|j| _mm512_xor_si512(_mm512_loadu_si512(g.add(32 + 64 * j).cast()), flip)))
    }
}

/// Blocks per pass of [`q8_0_q8_0_group_avx2`]'s lane parts (1088 bytes of the group). On
/// the AMD EPYC Zen 3, streaming a 239 MiB matrix in the same minutes: 2 blocks 15.0 and
/// 17.6 GB/s, 4 blocks 12.8 and 14.8, 8 blocks 12.9 and 15.0 (halves in turn 13.7 and
/// 14.9); from L1 8 blocks is a little faster than 2. With halves in turn, on the AMD EPYC
/// Zen 1, 1 and 2 measured alike, 4 a few percent slower.
const Q8_0_AVX2_PASS_BLOCKS: usize = 2;

/// [`q8_0_q8_0_group`] with AVX2 only: over each [`Q8_0_AVX2_PASS_BLOCKS`] blocks lanes
/// 0-3 of both halves of 8 rows, then lanes 4-7 ([`lane_parts`]; a part's eight
/// accumulators in 256-bit registers for its pass), lane `j` of 8 rows (the layout's chunk
/// `j`, no shuffle) as the plain AVX2 dot's sign trick (`qdot::dot_i8_i8`) against the
/// token's broadcast dword `j` (the same exact integers; one broadcast for both halves),
/// the same `dw·da` product, fmas in block order and tree.
///
/// # Safety
/// AVX2, FMA and F16C available; `nb * GROUP_BLOCK_BYTES_Q8_0` bytes readable at `w`,
/// `nb * 34` at `a`, 16 floats writable at `out`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_0_q8_0_group_avx2<const PF: usize>(nb: usize, w: *const u8, a: *const u8, out: *mut f32) {
    // SAFETY: the caller's contract; activation layout d@0 qs@2.
    unsafe {
        let state = in_passes!(1, 8, nb, Q8_0_AVX2_PASS_BLOCKS, |k0, k1| {}, |_s, halves| {
            lane_parts!(halves, k0, k1, |part, k, acc| {
                let g = w.add(k * GROUP_BLOCK_BYTES_Q8_0);
                // Each part asks for its share of the lines ahead.
                prefetch_ahead_part::<PF, GROUP_BLOCK_BYTES_Q8_0>(g, part, 2);
                q8_0_lane_part_avx2(g, a.add(k * 34), part, &mut acc);
            });
        });
        store_lane_trees(&state, [out]);
    }
}

/// [`q8_0_q8_0_group_avx2`]'s work on lane part `part` (lanes `4·part..4·part + 4`) of
/// both halves of the group block at `g` against the activation block at `ab` (d@0 qs@2):
/// `acc[h][i]` lane `4·part + i` of half `h`.
///
/// # Safety
/// AVX2, FMA and F16C available; the group block's bytes at `g`, the block's 34 at `ab`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_lane_part_avx2(g: *const u8, ab: *const u8, part: usize, acc: &mut [[__m256; 4]; 2]) {
    // SAFETY: the caller's contract.
    unsafe {
        let da = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(rd32(ab)))); // (F16C: exact)
        // (Not by `map`: see `lane_parts`.)
        let d = [_mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(g.cast())), da), _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(g.add(16).cast())), da)];
        for i in 0..4 {
            let j = 4 * part + i;
            let y = _mm256_set1_epi32(rd32(ab.add(2 + 4 * j)));
            for (h, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_loadu_si256(g.add(32 + 64 * j + 32 * h).cast());
                acc[i] = _mm256_fmadd_ps(d[h], _mm256_cvtepi32_ps(super::qdot::dot_i8_i8(x, y)), acc[i]);
            }
        }
    }
}

/// [`q8_0_q8_0_group_avx2`] for three groups at once (`w[s]`, `out[s]`): each pass of
/// [`Q8_0_AVX2_PASS_BLOCKS`] blocks of the three groups in turn, each group's accumulators
/// in memory between its passes, every accumulator taking its blocks in order (the same
/// bits), the three groups read as three streams side by side (as
/// [`q4_0_q8_0_group3_avx2`]).
///
/// # Safety
/// As [`q8_0_q8_0_group_avx2`] for each of the three groups.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_0_q8_0_group3_avx2(nb: usize, w: [*const u8; 3], a: *const u8, out: [*mut f32; 3]) {
    // SAFETY: the caller's contract; activation layout d@0 qs@2.
    unsafe {
        let state = in_passes!(3, 8, nb, Q8_0_AVX2_PASS_BLOCKS, |k0, k1| {}, |s, halves| {
            let w = w[s];
            lane_parts!(halves, k0, k1, |part, k, acc| {
                let g = w.add(k * GROUP_BLOCK_BYTES_Q8_0);
                prefetch_ahead_part::<STREAMS_AHEAD, GROUP_BLOCK_BYTES_Q8_0>(g, part, 2);
                q8_0_lane_part_avx2(g, a.add(k * 34), part, &mut acc);
            });
        });
        store_lane_trees(&state, out);
    }
}

/// Blocks per pass of [`q5_0_q8_0_group_avx2`]'s halves (2816 bytes of the group, from L1
/// for the second half). On the AMD EPYC Zen 1, Gemma 3 decode (`keel bench -p 0 -n 128`,
/// one and two threads, binaries alternated three rounds): 8 and 4 blocks 1.5-2% faster
/// than 2, and 1 block 2% slower; the kernel does more arithmetic per byte than Q8_0's.
const Q5_0_AVX2_PASS_BLOCKS: usize = 8;

/// [`q5_0_q8_0_group`] with AVX2 only: as [`q8_0_q8_0_group_avx2`] (halves in turn over
/// each [`Q5_0_AVX2_PASS_BLOCKS`] blocks, lane `j` of 8 rows a vector, no shuffle of rows),
/// the quants `q` (0..=31) of a half's lane `j` from its nibbles and the layout's
/// transposed `qh` (`qtile::q5_0_lane_quants_rows16`) as it comes, each lane `j` as `qdot::q5_0_q8_0`'s exact
/// integer `Σ (q - 16)·y` formed as `Σ q·y - 16·Σ y`: `f32(madd(maddubs(q, y), 1))` (a
/// `maddubs` pair at most 2·31·128 in magnitude: no saturation) less the token's `16·Σ y`
/// over the lane's four elements (as f32, once per block for both halves; integers far
/// below 2^24, so the difference is exact), then the same `dw·da` product, fmas in block
/// order and tree. The 8-row kernel it replaces forms each row's lanes with two `maddubs`
/// and a `madd`, and the AVX2 multiplies share one pipe on the AMD Zen 1.
///
/// # Safety
/// AVX2, FMA and F16C available; `nb * GROUP_BLOCK_BYTES_Q5_0` bytes readable at `w`,
/// `nb * 34` at `a`, 16 floats writable at `out`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q5_0_q8_0_group_avx2<const PF: usize>(nb: usize, w: *const u8, a: *const u8, out: *mut f32) {
    // SAFETY: the caller's contract; activation layout d@0 qs@2.
    unsafe {
        // The pass's blocks' `16·Σ y` per lane.
        let mut corr = [[0i32; 8]; Q5_0_AVX2_PASS_BLOCKS];
        let state = in_passes!(1, 8, nb, Q5_0_AVX2_PASS_BLOCKS, |k0, k1| {
            for k in k0..k1 {
                corr[k - k0] = q5_0_sixteen_sums_avx2(a.add(k * 34));
            }
        }, |_s, halves| {
            halves_in_turn!(halves, k0, k1, |h, k, acc| {
                let g = w.add(k * GROUP_BLOCK_BYTES_Q5_0);
                // Each half its share of the hints (as `q8_0_q8_0_group_avx2`).
                prefetch_ahead_part::<PF, GROUP_BLOCK_BYTES_Q5_0>(g, h, 2);
                q5_0_half_block_avx2(g, a.add(k * 34), &corr[k - k0], h, &mut acc);
            });
        });
        store_lane_trees(&state, [out]);
    }
}

/// `16·Σ y` over each lane (four bytes) of the activation block at `ab` (d@0 qs@2),
/// exact: [`q5_0_q8_0_group_avx2`]'s correction of the unsigned quants.
///
/// # Safety
/// AVX2 available; 34 bytes at `ab`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_sixteen_sums_avx2(ab: *const u8) -> [i32; 8] {
    // SAFETY: the caller's contract.
    unsafe {
        let s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(16), _mm256_loadu_si256(ab.add(2).cast())), _mm256_set1_epi16(1));
        let mut c = [0i32; 8];
        _mm256_storeu_si256(c.as_mut_ptr().cast(), s);
        c
    }
}

/// [`q5_0_q8_0_group_avx2`]'s work on half `h` of the group block at `g` against the
/// activation block at `ab` (d@0 qs@2) and its [`q5_0_sixteen_sums_avx2`] `c`: the half's
/// eight lane accumulators updated.
///
/// # Safety
/// AVX2, FMA and F16C available; the group block's bytes at `g`, the block's 34 at `ab`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_half_block_avx2(g: *const u8, ab: *const u8, c: &[i32; 8], h: usize, acc: &mut [__m256; 8]) {
    // SAFETY: the caller's contract.
    unsafe {
        let (ones, m4) = (_mm256_set1_epi16(1), _mm256_set1_epi8(0x0F));
        let da = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(rd32(ab)))); // (F16C: exact)
        let d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(g.add(16 * h).cast())), da);
        let qh = _mm256_loadu_si256(g.add(32 + 32 * h).cast());
        for (j, acc) in acc.iter_mut().enumerate() {
            let packed = _mm256_loadu_si256(g.add(96 + 64 * (j % 4) + 32 * h).cast());
            let nib = _mm256_and_si256(if j < 4 { packed } else { _mm256_srli_epi16::<4>(packed) }, m4);
            let q = super::qtile::q5_0_lane_quants_rows16(nib, qh, j);
            let y = super::qtile::broadcast_dword(ab.add(2 + 4 * j));
            let s = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(q, y), ones), super::qtile::broadcast_dword(c.as_ptr().add(j).cast()));
            *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), *acc);
        }
    }
}

/// Blocks per pass of [`q5_0_q8_0_group3_avx2`] (1408 bytes of each group a pass).
const Q5_0_STREAMS_PASS_BLOCKS: usize = 4;

/// [`q5_0_q8_0_group_avx2`] for three groups at once (`w[s]`, `out[s]`): each pass of
/// [`Q5_0_STREAMS_PASS_BLOCKS`] blocks of the three groups in turn, each group a half at a
/// time, the pass's `16·Σ y` once for the three, a half's accumulators in memory between
/// its passes, every accumulator taking its blocks in order (the same bits), the three
/// groups read as three streams side by side (as [`q4_0_q8_0_group3_avx2`]).
///
/// # Safety
/// As [`q5_0_q8_0_group_avx2`] for each of the three groups.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q5_0_q8_0_group3_avx2(nb: usize, w: [*const u8; 3], a: *const u8, out: [*mut f32; 3]) {
    // SAFETY: the caller's contract; activation layout d@0 qs@2.
    unsafe {
        let mut corr = [[0i32; 8]; Q5_0_STREAMS_PASS_BLOCKS];
        let state = in_passes!(3, 8, nb, Q5_0_STREAMS_PASS_BLOCKS, |k0, k1| {
            for k in k0..k1 {
                corr[k - k0] = q5_0_sixteen_sums_avx2(a.add(k * 34));
            }
        }, |s, halves| {
            halves_in_turn!(halves, k0, k1, |h, k, acc| {
                let g = w[s].add(k * GROUP_BLOCK_BYTES_Q5_0);
                prefetch_ahead_part::<STREAMS_AHEAD, GROUP_BLOCK_BYTES_Q5_0>(g, h, 2);
                q5_0_half_block_avx2(g, a.add(k * 34), &corr[k - k0], h, &mut acc);
            });
        });
        store_lane_trees(&state, out);
    }
}

/// Most blocks a row may have for [`q4_0_activation_table`] (8192 columns): its table of
/// 8 tokens then takes 16 KiB of stack.
pub(super) const Q4_0_TABLE_BLOCKS: usize = 256;

/// What [`q4_0_q8_0_group`] needs of activation block `k` of token `t`, once for every
/// group of a product: `da[t·nb + k]` the block's scale as f32 (exact) and `c[t·nb + k]`
/// its `-8·Σ y` (exact), for `tokens` (at most 8) rows `arow` bytes apart at `a`.
///
/// # Safety
/// As [`q4_1_q8_1_group`], with `nb * 34` bytes at `a + t·arow` for each `t < tokens` and
/// `tokens * nb` elements writable at `da` and `c`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q4_0_activation_table(nb: usize, a: *const u8, arow: usize, tokens: usize, da: *mut f32, c: *mut i32) {
    // SAFETY: the caller's contract; activation layout d@0 qs@2.
    unsafe {
        for t in 0..tokens {
            for k in 0..nb {
                let ab = a.add(t * arow + k * 34);
                *da.add(t * nb + k) = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(rd32(ab)))); // (F16C: exact)
                *c.add(t * nb + k) = -q4_0_eight_sum(ab);
            }
        }
    }
}

/// `8·Σ y` over the 32 weights of the Q8_0 activation block at `ab` (exact: at most 8 ·
/// 32 · 128), by a `vpdpbusd` of the block against eights and the sum of its lanes.
///
/// # Safety
/// As [`q4_1_q8_1_group`], with 34 bytes at `ab`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q4_0_eight_sum(ab: *const u8) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        let cy = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), _mm256_loadu_si256(ab.add(2).cast()));
        let c = _mm_add_epi32(_mm256_castsi256_si128(cy), _mm256_extracti128_si256::<1>(cy));
        let c = _mm_add_epi32(c, _mm_shuffle_epi32::<0b01_00_11_10>(c));
        let c = _mm_add_epi32(c, _mm_shuffle_epi32::<0b10_11_00_01>(c));
        _mm_cvtsi128_si32(c)
    }
}

/// Q4_0 · Q8_0 for one rows16 group against `T` activation rows (`arow` bytes apart), in
/// llama.cpp's repacked order (`qdot::q4_0_q8_0`): per block each row's exact
/// `Σ (q - 8)·y` (as `Σ q·y - 8·Σ y`, the nibbles unsigned), then `acc = fma(f32(sum),
/// dw·da, acc)`, one accumulator per (row, token), so `out[t·ostride + r]` has the bits of
/// row `r`'s dot with token `t`. The nibbles are unpacked once per block for the `T` tokens.
/// With `TAB` each token's `da` and `-8·Σ y` come from [`q4_0_activation_table`]'s tables
/// (`da`, `c`: token `t`'s blocks from `t·nb`), computed once for all the groups of a
/// product rather than per group: the same values.
///
/// # Safety
/// As [`q4_1_q8_1_group`], with `nb * 288` bytes at `w`, `nb * 34` at `a + t·arow` (without
/// `TAB`) or `T * nb` elements at `da` and `c` (with it), and 16 floats at `out + t·ostride`
/// for each `t < T`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn q4_0_q8_0_group<const T: usize, const TAB: bool, const PF: usize>(nb: usize, w: *const u8, a: *const u8, arow: usize, da: *const f32, c: *const i32, out: *mut f32, ostride: usize) {
    // SAFETY: the caller's contract; activation layout d@0 qs@2.
    unsafe {
        let m4 = _mm512_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); T];
        for k in 0..nb {
            let g = w.add(k * GROUP_BLOCK_BYTES_Q4_0);
            // One token: the hints a quarter at a time, beside each chunk's work; more: at once.
            if T > 1 {
                prefetch_ahead::<PF, GROUP_BLOCK_BYTES_Q4_0>(g);
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(g.cast()));
            let q: [__m512i; 4] = core::array::from_fn(|c| _mm512_loadu_si512(g.add(32 + 64 * c).cast()));
            let lo = q.map(|q| _mm512_and_si512(q, m4));
            let hi = q.map(|q| _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4));
            for (t, acc) in acc.iter_mut().enumerate() {
                let ab = a.add(t * arow + k * 34);
                // The block's scale and -8·Σ y over the block, in every lane (the sums'
                // starting value).
                let (dat, neg) = if TAB {
                    (_mm512_set1_ps(*da.add(t * nb + k)), _mm512_set1_epi32(*c.add(t * nb + k)))
                } else {
                    (_mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(rd32(ab)))), _mm512_set1_epi32(-q4_0_eight_sum(ab)))
                };
                let mut s = [neg, _mm512_setzero_si512()];
                for c in 0..4 {
                    if T == 1 {
                        prefetch_ahead_part::<PF, GROUP_BLOCK_BYTES_Q4_0>(g, c, 4);
                    }
                    s[0] = _mm512_dpbusd_epi32(s[0], lo[c], _mm512_set1_epi32(rd32(ab.add(2 + 4 * c))));
                    s[1] = _mm512_dpbusd_epi32(s[1], hi[c], _mm512_set1_epi32(rd32(ab.add(18 + 4 * c))));
                }
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s[0], s[1])), _mm512_mul_ps(dw, dat), *acc);
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.add(t * ostride), *acc);
        }
    }
}

/// The Q5_0 weights `q` (0..=31, unsigned) of one rows16 group block at `p` (the layout's
/// `d`, transposed `qh` and four `qs` chunks): vector `j` holds, in lane `r`, row `r`'s
/// elements `4j..4j + 4` (their nibble from chunk `j mod 4`, low or high, and their fifth
/// bits, at bit `j` of each byte of the row's `qh` as the layout holds it, shifted to bit
/// 4 and merged under a mask by one `vpternlogd`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q5_0_weights(p: *const u8) -> [__m512i; 8] {
    // SAFETY: the caller guarantees 352 readable bytes at p; AVX-512 F/BW available.
    unsafe {
        let (m4, b4) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x10));
        let h = _mm512_loadu_si512(p.add(32).cast());
        let q: [__m512i; 4] = core::array::from_fn(|c| _mm512_loadu_si512(p.add(96 + 64 * c).cast()));
        let (lo, hi) = (|c: usize| _mm512_and_si512(q[c], m4), |c: usize| _mm512_and_si512(_mm512_srli_epi16::<4>(q[c]), m4));
        // nib | (at4 & b4): table 0xF8 (a | b·c for the operands a, b, c). Written out
        // lane by lane: each shift a constant, and no loop (`from_fn` with a `match` on
        // `j` was compiled as a loop with branches and spills).
        let merge = |nib: __m512i, at4: __m512i| _mm512_ternarylogic_epi32::<0xF8>(nib, at4, b4);
        [
            merge(lo(0), _mm512_slli_epi32::<4>(h)),
            merge(lo(1), _mm512_slli_epi32::<3>(h)),
            merge(lo(2), _mm512_slli_epi32::<2>(h)),
            merge(lo(3), _mm512_slli_epi32::<1>(h)),
            merge(hi(0), h),
            merge(hi(1), _mm512_srli_epi32::<1>(h)),
            merge(hi(2), _mm512_srli_epi32::<2>(h)),
            merge(hi(3), _mm512_srli_epi32::<3>(h)),
        ]
    }
}

/// Q5_0 · Q8_0 for one rows16 group: `out[r]` gets row `r`'s dot, the bits of
/// `qdot::q5_0_q8_0` (lane `j` `Σ (q - 16)·y` over elements `4j..4j + 4` as
/// `Σ q·y - 16·Σ y`: exact integers).
///
/// # Safety
/// As [`q4_1_q8_1_group`], with `nb * 352` bytes at `w` and `nb * 34` at `a`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn q5_0_q8_0_group<const PF: usize>(nb: usize, w: *const u8, a: *const u8, out: *mut f32) {
    // SAFETY: the caller's contract; activation layout d@0 qs@2.
    unsafe { lanes8_group!(PF, nb, w, a, out, GROUP_BLOCK_BYTES_Q5_0, 16, |g| q5_0_weights(g)) }
}

/// Bytes of one Q4_K (group, super-block): 16 blocks of 144 bytes.
pub(super) const GROUP_BLOCK_BYTES_Q4_K: usize = 16 * 144;

/// `[hi_0..hi_3, hi_4..hi_7, lo_0..lo_3, lo_4..lo_7]` (bytes) for the Q8_K activation block
/// at `ab`: its eight 32-element sums `s_j = bsums[2j] + bsums[2j + 1]` split as
/// `s_j = 64·hi_j + lo_j` (`hi_j` in -64..=63, `lo_j` in 0..64: both bytes), so that a
/// `vpdpbusd` of the rows' unsigned 6-bit mins against them gives `Σ m_j·s_j` exactly.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_min_sums(ab: *const u8) -> [i32; 4] {
    // SAFETY: the caller guarantees a whole Q8_K block (292 bytes) at ab.
    unsafe {
        let b = _mm256_loadu_si256(ab.add(260).cast());
        let s = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256::<1>(b));
        let packed = _mm_packs_epi16(_mm_srai_epi16::<6>(s), _mm_and_si128(s, _mm_set1_epi16(63)));
        let mut out = [0i32; 4];
        _mm_storeu_si128(out.as_mut_ptr().cast(), packed);
        out
    }
}

/// [`q4_k_min_sums`]' bytes for group `j`'s two mins (`GEMM`'s `m_j`: bytes `2j`, `2j + 1`
/// of the lower dword of each pair for `j < 2`, of the upper for the others, the rest
/// zero) or, with `None`, all of them (the super-block's `summ`).
#[inline]
fn q4_k_min_sums_of([hl, hh, ll, lh]: [i32; 4], j: Option<usize>) -> [i32; 4] {
    let keep = |v: i32, half: usize| match j {
        None => v,
        Some(j) if j / 2 == half => v & (0xffff << (16 * (j % 2))),
        Some(_) => 0,
    };
    [keep(hl, 0), keep(hh, 1), keep(ll, 0), keep(lh, 1)]
}

/// The packed 6-bit scales and mins of 8 rows of a Q4_K (group, super-block) in the rows16
/// layout (chunks 0..3 of a half: `u0`, `u1`, `u2`, row `r`'s dwords in lane `r`) as bytes,
/// lane by lane as `kdot::scales_mins` unpacks one row: scales 0..4 and 4..8, mins 0..4 and
/// 4..8, each a byte, four to a lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k_scales_mins_lanes(u0: __m256i, u1: __m256i, u2: __m256i) -> ([__m256i; 2], [__m256i; 2]) {
    // SAFETY: value-only intrinsics; AVX2 available (this fn's target features).
    unsafe {
        let (low6, low4, bits45) = (_mm256_set1_epi32(0x3f3f_3f3f), _mm256_set1_epi32(0x0f0f_0f0f), _mm256_set1_epi32(0x3030_3030));
        let sc = [_mm256_and_si256(u0, low6), _mm256_or_si256(_mm256_and_si256(u2, low4), _mm256_and_si256(_mm256_srli_epi32::<2>(u0), bits45))];
        let mn = [_mm256_and_si256(u1, low6), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32::<4>(u2), low4), _mm256_and_si256(_mm256_srli_epi32::<2>(u1), bits45))];
        (sc, mn)
    }
}

/// The `vpshufb` pattern that puts bytes `a` and `b` of each dword into its two i16,
/// zero-extended (a sub-block's scale into both: `a == b`; a pair of mins).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn byte_pair_pattern(a: i8, b: i8) -> __m256i {
    // SAFETY: value-only intrinsics; AVX2 available (this fn's target features).
    unsafe { _mm256_setr_epi8(a, -1, b, -1, 4 + a, -1, 4 + b, -1, 8 + a, -1, 8 + b, -1, 12 + a, -1, 12 + b, -1, a, -1, b, -1, 4 + a, -1, 4 + b, -1, 8 + a, -1, 8 + b, -1, 12 + a, -1, 12 + b, -1) }
}

/// Q4_K · Q8_K for one rows16 group against `T` activation rows (`arow` bytes apart):
/// `out[t·ostride + r]` gets row `r`'s dot with token `t`, the bits of
/// `kdot::q4_k_q8_k::<MODE>` (`NATIVE` or `GEMM`: a matrix of whole groups of 16 rows is
/// one llama.cpp repacks, so its batches never take the tiled order). Per super-block each
/// row's exact integers — per 64-element group `j` `sumj = sc_2j·Σ q·y + sc_2j+1·Σ q·y`
/// over its two sub-blocks and `m_j = m_2j·s_2j + m_2j+1·s_2j+1` (`s_i = bsums[2i] +
/// bsums[2i + 1]`), and their sums `sumi`, `summ` — then the dot's float steps, row `r` in lane `r`: `NATIVE` (llama.cpp's repacked `gemv`)
/// `acc = fma(f32(sumi), dw·da, acc)`, `accm = fma(f32(summ), dminw·da, accm)`; `GEMM` the
/// same pair per group `j` with `sumj` and `m_j`; the result `acc - accm`. The integers
/// are exact, so their order is free. The nibbles are unpacked once per super-block for
/// the `T` tokens; for one token the prefetch hints come a chunk's share at a time
/// ([`prefetch_ahead_part`]), for more all at the super-block's start.
///
/// Layout of a (group, super-block) (`quant::rows16`): the sixteen f16 `d` (0..32), the
/// sixteen `dmin` (32..64), then 35 chunks of 64 bytes whose dword `r` is row `r`'s dword
/// `c` of the block's 140 bytes after `d` and `dmin`: chunks 0..3 the packed 6-bit scales
/// and mins, chunk `3 + 8j + i` the nibbles of elements `64j + 4i..+4` (low) and `64j + 32
/// + 4i..+4` (high).
///
/// # Safety
/// As [`q4_1_q8_1_group`], with `nb * GROUP_BLOCK_BYTES_Q4_K` bytes at `w`, `nb * 292` at
/// `a + t·arow` and 16 floats at `out + t·ostride` for each `t < T`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn q4_k_q8_k_group<const T: usize, const MODE: u8, const PF: usize>(nb: usize, w: *const u8, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    use super::kdot::GEMM;
    // SAFETY: the caller's contract; activation layout d@0 (f32) qs@4 bsums@260.
    unsafe {
        let m4 = _mm512_set1_epi8(0x0F);
        let (low6, low4, bits45) = (_mm512_set1_epi32(0x3f3f_3f3f), _mm512_set1_epi32(0x0f0f_0f0f), _mm512_set1_epi32(0x3030_3030));
        let mut acc = [_mm512_setzero_ps(); T];
        let mut accm = [_mm512_setzero_ps(); T];
        for k in 0..nb {
            let g = w.add(k * GROUP_BLOCK_BYTES_Q4_K);
            if T > 1 {
                prefetch_ahead::<PF, GROUP_BLOCK_BYTES_Q4_K>(g);
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(g.cast()));
            let dmw = _mm512_cvtph_ps(_mm256_loadu_si256(g.add(32).cast()));
            // Each row's 8 scales and 8 mins (6 bits, one byte each, four to a dword):
            // as `kdot::scales_mins`, lane by lane.
            let (u0, u1, u2) = (_mm512_loadu_si512(g.add(64).cast()), _mm512_loadu_si512(g.add(128).cast()), _mm512_loadu_si512(g.add(192).cast()));
            let sc = [
                _mm512_and_si512(u0, low6),
                _mm512_or_si512(_mm512_and_si512(u2, low4), _mm512_and_si512(_mm512_srli_epi32::<2>(u0), bits45)),
            ];
            let mn = [
                _mm512_and_si512(u1, low6),
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32::<4>(u2), low4), _mm512_and_si512(_mm512_srli_epi32::<2>(u1), bits45)),
            ];
            let byte = |v: __m512i, b: usize| match b {
                0 => _mm512_and_si512(v, _mm512_set1_epi32(0xff)),
                1 => _mm512_and_si512(_mm512_srli_epi32::<8>(v), _mm512_set1_epi32(0xff)),
                2 => _mm512_and_si512(_mm512_srli_epi32::<16>(v), _mm512_set1_epi32(0xff)),
                _ => _mm512_srli_epi32::<24>(v),
            };
            // Per token: its block scale and the mins' activation sums split in bytes.
            let das: [__m512; T] = core::array::from_fn(|t| _mm512_set1_ps(core::ptr::read_unaligned(a.add(t * arow + k * 292).cast::<f32>())));
            let mins: [[i32; 4]; T] = core::array::from_fn(|t| q4_k_min_sums(a.add(t * arow + k * 292)));
            // `m_j` of group j (both of its mins; GEMM) or all four pairs at once.
            let min_sum = |t: usize, j: Option<usize>| {
                let [hl, hh, ll, lh] = q4_k_min_sums_of(mins[t], j);
                let hi = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), mn[0], _mm512_set1_epi32(hl)), mn[1], _mm512_set1_epi32(hh));
                let lo = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), mn[0], _mm512_set1_epi32(ll)), mn[1], _mm512_set1_epi32(lh));
                _mm512_add_epi32(_mm512_slli_epi32::<6>(hi), lo)
            };
            // Per token the sub-block sums Σ q·y (exact), two at a time (sub-blocks 2j and
            // 2j + 1 share each chunk's bytes), each group's folded by the scales.
            let mut sumi = [_mm512_setzero_si512(); T];
            for j in 0..4 {
                let mut s = [[_mm512_setzero_si512(); 2]; T];
                for i in 0..8 {
                    if T == 1 {
                        prefetch_ahead_part::<PF, GROUP_BLOCK_BYTES_Q4_K>(g, 8 * j + i, 32);
                    }
                    let q = _mm512_loadu_si512(g.add(256 + 64 * (8 * j + i)).cast());
                    let (lo, hi) = (_mm512_and_si512(q, m4), _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4));
                    for (t, st) in s.iter_mut().enumerate() {
                        let y = a.add(t * arow + k * 292 + 4 + 64 * j + 4 * i);
                        st[0] = _mm512_dpbusd_epi32(st[0], lo, _mm512_set1_epi32(rd32(y)));
                        st[1] = _mm512_dpbusd_epi32(st[1], hi, _mm512_set1_epi32(rd32(y.add(32))));
                    }
                }
                let (s0, s1) = (byte(sc[j / 2], 2 * (j % 2)), byte(sc[j / 2], 2 * (j % 2) + 1));
                for (t, st) in s.iter().enumerate() {
                    let sumj = _mm512_add_epi32(_mm512_mullo_epi32(st[0], s0), _mm512_mullo_epi32(st[1], s1));
                    if MODE == GEMM {
                        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumj), _mm512_mul_ps(dw, das[t]), acc[t]);
                        accm[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(min_sum(t, Some(j))), _mm512_mul_ps(dmw, das[t]), accm[t]);
                    } else {
                        sumi[t] = _mm512_add_epi32(sumi[t], sumj);
                    }
                }
            }
            if MODE == GEMM {
                continue;
            }
            for t in 0..T {
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]), _mm512_mul_ps(dw, das[t]), acc[t]);
                accm[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(min_sum(t, None)), _mm512_mul_ps(dmw, das[t]), accm[t]);
            }
        }
        for t in 0..T {
            _mm512_storeu_ps(out.add(t * ostride), _mm512_sub_ps(acc[t], accm[t]));
        }
    }
}

/// [`q4_k_q8_k_group`] with AVX2 only, for `T` tokens (1 to 4: each token's two i16
/// accumulators stay in registers): the group's halves of 8 rows (row `8h + r` in lane
/// `r`) one after the other per super-block, the second reading the block's lines from L1.
/// The same integers by other operations: per chunk each row's nibbles times the token's
/// bytes by `maddubs` (a pair at most 2·15·128 in magnitude), added in i16 over the eight
/// chunks of a 64-element group (at most 30720: exact), then `madd` by the sub-block's
/// scale in both halves of the lane (`vpshufb` of the scales' byte) gives its `sc·Σ q·y`;
/// the mins' sum as the AVX-512 kernel's, `maddubs` against its bytes and `madd` by one.
/// Then the same float steps in `MODE`, so each output has the dot's bits.
///
/// # Safety
/// As [`q4_k_q8_k_group`], with AVX2, FMA and F16C available instead of AVX-512 VNNI.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_k_q8_k_group_avx2<const T: usize, const MODE: u8, const PF: usize>(nb: usize, w: *const u8, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    use super::kdot::GEMM;
    // SAFETY: the caller's contract; activation layout d@0 (f32) qs@4 bsums@260.
    unsafe {
        let (m4, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1));
        // Byte `b` of each dword into both of its i16 halves.
        let spreads: [__m256i; 4] = core::array::from_fn(|b| byte_pair_pattern(b as i8, b as i8));
        let mut acc = [[_mm256_setzero_ps(); T]; 2];
        let mut accm = [[_mm256_setzero_ps(); T]; 2];
        for k in 0..nb {
            let g = w.add(k * GROUP_BLOCK_BYTES_Q4_K);
            if T > 1 {
                prefetch_ahead::<PF, GROUP_BLOCK_BYTES_Q4_K>(g);
            }
            let das: [__m256; T] = core::array::from_fn(|t| _mm256_set1_ps(core::ptr::read_unaligned(a.add(t * arow + k * 292).cast::<f32>())));
            let mins: [[i32; 4]; T] = core::array::from_fn(|t| q4_k_min_sums(a.add(t * arow + k * 292)));
            for h in 0..2 {
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(g.add(16 * h).cast()));
                let dmw = _mm256_cvtph_ps(_mm_loadu_si128(g.add(32 + 16 * h).cast()));
                let ld = |c: usize| _mm256_loadu_si256(g.add(64 + 64 * c + 32 * h).cast());
                let (sc, mn) = q4_k_scales_mins_lanes(ld(0), ld(1), ld(2));
                // m_j of group j (GEMM) or all four pairs (as the AVX-512 kernel's).
                let min_sum = |t: usize, j: Option<usize>| {
                    let [hl, hh, ll, lh] = q4_k_min_sums_of(mins[t], j);
                    let pair = |l: i32, h: i32| _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(mn[0], _mm256_set1_epi32(l)), _mm256_maddubs_epi16(mn[1], _mm256_set1_epi32(h))), ones);
                    _mm256_add_epi32(_mm256_slli_epi32::<6>(pair(hl, hh)), pair(ll, lh))
                };
                let mut sumi = [_mm256_setzero_si256(); T];
                for j in 0..4 {
                    let mut s = [[_mm256_setzero_si256(); 2]; T];
                    if T == 1 && h == 0 {
                        prefetch_ahead_part::<PF, GROUP_BLOCK_BYTES_Q4_K>(g, j, 4);
                    }
                    for i in 0..8 {
                        let q = _mm256_loadu_si256(g.add(256 + 64 * (8 * j + i) + 32 * h).cast());
                        let (lo, hi) = (_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4));
                        for (t, st) in s.iter_mut().enumerate() {
                            let y = a.add(t * arow + k * 292 + 4 + 64 * j + 4 * i);
                            st[0] = _mm256_add_epi16(st[0], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(rd32(y))));
                            st[1] = _mm256_add_epi16(st[1], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(rd32(y.add(32)))));
                        }
                    }
                    let (s0, s1) = (_mm256_shuffle_epi8(sc[j / 2], spreads[2 * (j % 2)]), _mm256_shuffle_epi8(sc[j / 2], spreads[2 * (j % 2) + 1]));
                    for (t, st) in s.iter().enumerate() {
                        let sumj = _mm256_add_epi32(_mm256_madd_epi16(st[0], s0), _mm256_madd_epi16(st[1], s1));
                        if MODE == GEMM {
                            acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumj), _mm256_mul_ps(dw, das[t]), acc[h][t]);
                            accm[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(min_sum(t, Some(j))), _mm256_mul_ps(dmw, das[t]), accm[h][t]);
                        } else {
                            sumi[t] = _mm256_add_epi32(sumi[t], sumj);
                        }
                    }
                }
                if MODE == GEMM {
                    continue;
                }
                for t in 0..T {
                    acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), _mm256_mul_ps(dw, das[t]), acc[h][t]);
                    accm[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(min_sum(t, None)), _mm256_mul_ps(dmw, das[t]), accm[h][t]);
                }
            }
        }
        for h in 0..2 {
            for t in 0..T {
                _mm256_storeu_ps(out.add(t * ostride + 8 * h), _mm256_sub_ps(acc[h][t], accm[h][t]));
            }
        }
    }
}

/// Bytes of one Q6_K (group, super-block): 16 blocks of 210 bytes.
pub(super) const GROUP_BLOCK_BYTES_Q6_K: usize = 16 * 210;

/// `vpshufb` patterns for the Q6_K scales: in each dword, byte `lo` of it into the high
/// byte of its low 16-bit half and byte `hi` into that of its high half, the low bytes
/// zero (an arithmetic shift right by 8 then sign-extends each to 16 bits).
const fn q6_k_scale_pattern(lo: u8, hi: u8) -> [u8; 64] {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 16 {
        let q = 4 * (i % 4) as u8;
        t[4 * i] = 0x80;
        t[4 * i + 1] = q + lo;
        t[4 * i + 2] = 0x80;
        t[4 * i + 3] = q + hi;
        i += 1;
    }
    t
}

/// [`q6_k_scale_pattern`]s: byte `b` into both halves (`b` = 0..4), then bytes 0 and 1,
/// then bytes 2 and 3.
static Q6_K_SCALE_PATTERNS: [[u8; 64]; 6] = [
    q6_k_scale_pattern(0, 0),
    q6_k_scale_pattern(1, 1),
    q6_k_scale_pattern(2, 2),
    q6_k_scale_pattern(3, 3),
    q6_k_scale_pattern(0, 1),
    q6_k_scale_pattern(2, 3),
];

/// Q6_K · Q8_K for one rows16 group against `T` activation rows (`arow` bytes apart):
/// `out[t·ostride + r]` gets row `r`'s dot with token `t`, the bits of
/// `kdot::q6_k_q8_k::<MODE>` (`NATIVE`: llama.cpp's x86 `vec_dot` lanes; `TILED`: its
/// tiled matmul's steps). Per super-block each row's exact integers, lane `m` (elements
/// `4m..4m + 4` of each 32) as the plain kernel's: `Σ_(h,t) sc_s · Σ q·y` over the eight
/// 32-element runs `(h, t)` of the block (`s = 8h + 2t + m/4` the 16-element sub-block,
/// `q` the unsigned 6-bit level: `vpmaddubsw` then `vpdpwssd` with the scale, as the plain
/// kernel's `maddubs` and `madd`), less `32·(bsums_2m·sc_2m + bsums_2m+1·sc_2m+1)`; then
/// `NATIVE` `acc_m = fma(f32(lane_m), dw·da, acc_m)` and [`lane_tree512`] over the eight,
/// `TILED` the lanes' sum `s1`, `r = f32(s1)·dw`, `acc = fma(r, da, acc)`. The integers are
/// exact, so their order is free. The levels are unpacked once per super-block for the `T`
/// tokens; for one token the prefetch hints come a sixteenth at a time
/// ([`prefetch_ahead_part`]), for more all at the super-block's start.
///
/// Layout of a (group, super-block) (`quant::rows16`): the sixteen f16 `d` (0..32), then
/// 52 chunks of 64 bytes whose dword `r` is a dword of row `r`'s 208 bytes before `d`, in
/// the order the kernel reads them: chunks 0..4 its scales `4c..4c + 4`, then chunks
/// `4 + 6m + 3h` and the next its `ql` dwords `16h + m` and `16h + 8 + m`, chunk
/// `6 + 6m + 3h` its `qh` dword `8h + m`.
///
/// # Safety
/// As [`q4_1_q8_1_group`], with `nb * GROUP_BLOCK_BYTES_Q6_K` bytes at `w`, `nb * 292` at
/// `a + t·arow` and 16 floats at `out + t·ostride` for each `t < T`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn q6_k_q8_k_group<const T: usize, const MODE: u8, const PF: usize>(nb: usize, w: *const u8, a: *const u8, arow: usize, out: *mut f32, ostride: usize) {
    use super::kdot::TILED;
    // SAFETY: the caller's contract; activation layout d@0 (f32) qs@4 bsums@260.
    unsafe {
        let (m4, m30) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
        let pat: [__m512i; 6] = core::array::from_fn(|i| _mm512_loadu_si512(Q6_K_SCALE_PATTERNS[i].as_ptr().cast()));
        let chunk = |g: *const u8, c: usize| _mm512_loadu_si512(g.add(32 + 64 * c).cast());
        let mut acc = [[_mm512_setzero_ps(); 8]; T];
        for k in 0..nb {
            let g = w.add(k * GROUP_BLOCK_BYTES_Q6_K);
            if T > 1 {
                prefetch_ahead::<PF, GROUP_BLOCK_BYTES_Q6_K>(g);
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(g.cast()));
            let scc: [__m512i; 4] = core::array::from_fn(|c| chunk(g, c));
            // Sub-block s's scale in both 16-bit halves of each row's lane, and the pairs
            // (2m, 2m + 1) the block sums take.
            let sc: [__m512i; 16] = core::array::from_fn(|s| _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(scc[s / 4], pat[s % 4])));
            let scp: [__m512i; 8] = core::array::from_fn(|m| _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(scc[m / 2], pat[4 + m % 2])));
            let das: [__m512; T] = core::array::from_fn(|t| _mm512_set1_ps(core::ptr::read_unaligned(a.add(t * arow + k * 292).cast::<f32>())));
            let d: [__m512; T] = core::array::from_fn(|t| _mm512_mul_ps(das[t], dw));
            let mut s1 = [_mm512_setzero_si512(); T];
            for m in 0..8 {
                let mut s = [_mm512_setzero_si512(); T];
                for h in 0..2 {
                    if T == 1 {
                        prefetch_ahead_part::<PF, GROUP_BLOCK_BYTES_Q6_K>(g, 2 * m + h, 16);
                    }
                    let p = 4 + 6 * m + 3 * h;
                    let (ql0, ql1, qh) = (chunk(g, p), chunk(g, p + 1), chunk(g, p + 2));
                    let level = |lo: __m512i, hi: __m512i| _mm512_or_si512(_mm512_and_si512(lo, m4), _mm512_and_si512(hi, m30));
                    let lv = [
                        level(ql0, _mm512_slli_epi16::<4>(qh)),
                        level(ql1, _mm512_slli_epi16::<2>(qh)),
                        level(_mm512_srli_epi16::<4>(ql0), qh),
                        level(_mm512_srli_epi16::<4>(ql1), _mm512_srli_epi16::<2>(qh)),
                    ];
                    for (tt, &l) in lv.iter().enumerate() {
                        let scale = sc[8 * h + 2 * tt + m / 4];
                        for (t, st) in s.iter_mut().enumerate() {
                            let y = _mm512_set1_epi32(rd32(a.add(t * arow + k * 292 + 4 + 128 * h + 32 * tt + 4 * m)));
                            *st = _mm512_dpwssd_epi32(*st, _mm512_maddubs_epi16(l, y), scale);
                        }
                    }
                }
                for t in 0..T {
                    let bs = _mm512_set1_epi32(rd32(a.add(t * arow + k * 292 + 260 + 4 * m)));
                    let lane = _mm512_sub_epi32(s[t], _mm512_slli_epi32::<5>(_mm512_dpwssd_epi32(_mm512_setzero_si512(), scp[m], bs)));
                    if MODE == TILED {
                        s1[t] = _mm512_add_epi32(s1[t], lane);
                    } else {
                        acc[t][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lane), d[t], acc[t][m]);
                    }
                }
            }
            if MODE == TILED {
                for t in 0..T {
                    acc[t][0] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s1[t]), dw), das[t], acc[t][0]);
                }
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.add(t * ostride), if MODE == TILED { acc[0] } else { lane_tree512(acc) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spread over a loop's iterations, the hints' parts ask for every line of a block
    /// once and in order, as [`prefetch_ahead`] does at once (the K-quants' blocks and
    /// their loops' counts, and blocks shorter than the loop).
    #[test]
    fn spread_hints_cover_each_line_once() {
        for (bytes, n) in [(GROUP_BLOCK_BYTES_Q4_K, 32), (GROUP_BLOCK_BYTES_Q6_K, 16), (GROUP_BLOCK_BYTES_Q6_K, 8), (GROUP_BLOCK_BYTES_Q8_0, 16), (64, 3), (65, 7)] {
            let lines = bytes.div_ceil(64);
            let mut next = 0;
            for i in 0..n {
                let (l0, l1) = part_lines(lines, i, n);
                assert_eq!(l0, next, "{bytes} bytes in {n} parts: part {i} starts at line {l0}");
                assert!(l1 >= l0 && l1 <= lines, "{bytes} bytes in {n} parts: part {i} ends at line {l1}");
                next = l1;
            }
            assert_eq!(next, lines, "{bytes} bytes in {n} parts: every line");
        }
    }
}

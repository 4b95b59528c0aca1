//! AVX2 + FMA (+ F16C) kernels for x86_64: the decode hot path.
//!
//! Owns the SIMD `vec_dot`s and the SIMD activation quantizers. Every public-in-crate
//! function here is a safe wrapper with the [`super::DotFn`] shape around an
//! `unsafe #[target_feature]` body; the wrappers may only be handed out after
//! [`cpu_has_avx2_fma`] returned true (`Kernels::new` does that; tests check it too).
//!
//! Arithmetic, per weight/activation block pair (32 elements):
//! - integer part exact: `maddubs` (u8 × i8 → i16 pairs, never saturating for these
//!   ranges) then `madd` with ones → 8 i32 lane sums; signed weights are handled either
//!   by an offset (`q - 8`, `q - 16`: subtract `maddubs(offset, y)`) or by the sign trick
//!   (`|x|`, `y·sign(x)`; needs activations in -127..=127, which every keel activation
//!   quantizer guarantees);
//! - float part: `acc = fma(f32(lanes), dw·da, acc)`, two blocks per iteration into two
//!   accumulators, one final horizontal sum; Q4_1/Q5_1 add `Σ mw·sa` at the end.
//!
//! The order is fixed by `n` alone, so a row gives the same bits however many rows are
//! computed and on whichever thread. It differs from the scalar reference only in float
//! summation order (tests bound the difference).
//!
//! Activation quantizers compute exactly what `quantize.rs` does (`id = 127/amax`,
//! round half to even), so their bytes equal the reference's (tested).
//!
//! MSRV note: on Rust 1.85 the value-only intrinsics are `unsafe fn`s, on newer compilers
//! they are safe inside `#[target_feature]` functions; the `unsafe` blocks below are for
//! the former, hence `allow(unused_unsafe)`.
#![allow(unused_unsafe)]

use core::arch::x86_64::*;

use super::blocks::{bf16_to_f32, f16_to_f32};

/// True if this CPU (and OS) can run the kernels here: AVX, AVX2, FMA, F16C, and the OS
/// saves YMM state (XCR0 bits 1 and 2).
pub(crate) fn cpu_has_avx2_fma() -> bool {
    // SAFETY: CPUID exists on every x86_64 CPU.
    let max_leaf = unsafe { __cpuid(0) }.eax;
    if max_leaf < 7 {
        return false;
    }
    // SAFETY: leaf 1 exists (max_leaf >= 7).
    let ecx = unsafe { __cpuid(1) }.ecx;
    let (fma, osxsave, avx, f16c) = (ecx >> 12 & 1, ecx >> 27 & 1, ecx >> 28 & 1, ecx >> 29 & 1);
    if fma & osxsave & avx & f16c == 0 {
        return false;
    }
    // SAFETY: OSXSAVE is set, so XGETBV is available and XCR0 is readable.
    let xcr0 = unsafe { xcr0() };
    if xcr0 & 0b110 != 0b110 {
        return false;
    }
    // SAFETY: leaf 7 exists (checked above).
    let ebx = unsafe { __cpuid_count(7, 0) }.ebx;
    ebx >> 5 & 1 == 1
}

#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    // SAFETY: the caller checked OSXSAVE.
    unsafe { _xgetbv(0) }
}

/// Whole blocks to process: the caller contract says `n / bs`; clamp to what the
/// slices hold so a broken contract cannot read out of bounds in release builds.
#[inline]
fn fit(n: usize, bs: usize, w: &[u8], wsize: usize, a: &[u8], asize: usize) -> usize {
    debug_assert!(n % bs == 0, "vec_dot: n = {n} is not a multiple of the block size {bs}");
    debug_assert!(w.len() >= n / bs * wsize && a.len() >= n / bs * asize, "vec_dot: row too short");
    (n / bs).min(w.len() / wsize).min(a.len() / asize)
}

macro_rules! dot_wrapper {
    ($(#[$doc:meta])* $name:ident, $body:ident, $bs:expr, $wsize:expr, $asize:expr) => {
        $(#[$doc])*
        pub(crate) fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = fit(n, $bs, w, $wsize, a, $asize);
            // SAFETY: only handed out after cpu_has_avx2_fma() (module contract); `nb`
            // units of $wsize / $asize bytes lie inside `w` / `a` (fit clamps to them).
            unsafe { $body(nb, w.as_ptr(), a.as_ptr()) }
        }
    };
}

dot_wrapper!(/// AVX2 Q4_0 · Q8_0.
    vec_dot_q4_0_q8_0, q4_0_q8_0, 32, 18, 34);
dot_wrapper!(/// AVX2 Q4_1 · Q8_1.
    vec_dot_q4_1_q8_1, q4_1_q8_1, 32, 20, 36);
dot_wrapper!(/// AVX2 Q5_0 · Q8_0.
    vec_dot_q5_0_q8_0, q5_0_q8_0, 32, 22, 34);
dot_wrapper!(/// AVX2 Q5_1 · Q8_1.
    vec_dot_q5_1_q8_1, q5_1_q8_1, 32, 24, 36);
dot_wrapper!(/// AVX2 Q8_0 · Q8_0.
    vec_dot_q8_0_q8_0, q8_0_q8_0, 32, 34, 34);
dot_wrapper!(/// AVX2 F32 · F32.
    vec_dot_f32, f32_f32, 1, 4, 4);
dot_wrapper!(/// AVX2 F16 · F16.
    vec_dot_f16, f16_f16, 1, 2, 2);
dot_wrapper!(/// AVX2 BF16 · BF16.
    vec_dot_bf16, bf16_bf16, 1, 2, 2);

// ---------------------------------------------------------------- helpers

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_ps(v: __m256) -> f32 {
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s)))
    }
}

/// 16 bytes at `p` → 32 values 0..=15: low nibbles (elements 0..16), then high nibbles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    unsafe {
        let q = _mm_loadu_si128(p.cast());
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(q), q), _mm256_set1_epi8(0x0F))
    }
}

/// The u32 at `p` (a Q5 `qh`) → byte i = 0x10 if bit i is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fifth_bits(p: *const u8) -> __m256i {
    unsafe {
        let qh = core::ptr::read_unaligned(p.cast::<i32>());
        // Byte i of `spread` is byte i/8 of qh; `sel` picks bit i%8 of it.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(qh),
            _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
        );
        let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

/// Σ pairs of u8 `x` × i8 `y` → 8 i32 lanes (each the sum of 4 products).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_u8_i8(x: __m256i, y: __m256i) -> __m256i {
    unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1)) }
}

/// As [`dot_u8_i8`] with `x - off` (off = 8 or 16) as the weight.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_u8_off_i8(x: __m256i, off: __m256i, y: __m256i) -> __m256i {
    unsafe {
        let p = _mm256_sub_epi16(_mm256_maddubs_epi16(x, y), _mm256_maddubs_epi16(off, y));
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }
}

/// i8 `x` (any) × i8 `y` (-127..=127) → 8 i32 lanes, by the sign trick.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i8_i8(x: __m256i, y: __m256i) -> __m256i {
    unsafe { dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)) }
}

#[inline]
unsafe fn rd16(p: *const u8) -> i16 {
    // SAFETY: the caller guarantees 2 readable bytes at p.
    unsafe { core::ptr::read_unaligned(p.cast::<i16>()) }
}

#[inline]
unsafe fn rd32(p: *const u8) -> i32 {
    // SAFETY: the caller guarantees 4 readable bytes at p.
    unsafe { core::ptr::read_unaligned(p.cast::<i32>()) }
}

/// The first 4 bytes of each of four blocks, as f32 pairs: lanes (2k, 2k+1) are the
/// two f16 at the start of block k (`d, m` or `d, s`; for Q8_0-style blocks the odd lane
/// is the first two quants read as an f16 and is ignored).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn head4(p0: *const u8, p1: *const u8, p2: *const u8, p3: *const u8) -> __m256 {
    unsafe { _mm256_cvtph_ps(_mm_setr_epi32(rd32(p0), rd32(p1), rd32(p2), rd32(p3))) }
}

/// Lane `K` of `v` in all 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lane<const K: i32>(v: __m256) -> __m256 {
    unsafe { _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(K)) }
}

/// Σ of lanes 1, 3, 5, 7 (the Σ mw·sa that [`dot_loop`] gathers).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn odd_lanes_sum(v: __m256) -> f32 {
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_movehdup_ps(s))
    }
}

// ---------------------------------------------------------------- quant dots

/// Shared loop of the quant dots. `block(w, a)` gives the 8 i32 lane sums of one block
/// pair. Scales: f16 `d` at offset 0 of both blocks; with `ms`, also `m` (weight) and
/// `s` (activation) at offset 2, whose products are summed separately.
///
/// Four blocks per iteration: one f16→f32 conversion per side gives all eight scale
/// pairs, one multiply all `dw·da` (even lanes) and `mw·sa` (odd lanes); each block's
/// `f32(lanes)·dw·da` goes to its own accumulator (FMA latency hidden). Then 0-3
/// leftover blocks, one at a time, into accumulator 0.
macro_rules! dot_loop {
    ($nb:expr, $w:expr, $a:expr, $ws:expr, $as:expr, ms = $ms:expr, |$bw:ident, $ba:ident| $block:expr) => {{
        let (nb, w, a) = ($nb, $w, $a);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut ms = _mm256_setzero_ps();
        let mut i = 0;
        while i + 4 <= nb {
            let wp = [w.add(i * $ws), w.add((i + 1) * $ws), w.add((i + 2) * $ws), w.add((i + 3) * $ws)];
            let ap = [a.add(i * $as), a.add((i + 1) * $as), a.add((i + 2) * $as), a.add((i + 3) * $as)];
            let p = _mm256_mul_ps(head4(wp[0], wp[1], wp[2], wp[3]), head4(ap[0], ap[1], ap[2], ap[3]));
            if $ms {
                ms = _mm256_add_ps(ms, p);
            }
            let d = [lane::<0>(p), lane::<2>(p), lane::<4>(p), lane::<6>(p)];
            for k in 0..4 {
                let s = { let ($bw, $ba) = (wp[k], ap[k]); $block };
                acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d[k], acc[k]);
            }
            i += 4;
        }
        while i < nb {
            let (w0, a0) = (w.add(i * $ws), a.add(i * $as));
            // [dw, mw, da, sa] → lane 0 = dw·da, lane 1 = mw·sa
            let f = _mm_cvtph_ps(_mm_setr_epi32(rd32(w0), rd32(a0), 0, 0));
            let p = _mm_mul_ps(f, _mm_movehl_ps(f, f));
            if $ms {
                ms = _mm256_add_ps(ms, _mm256_castps128_ps256(_mm_and_ps(p, _mm_castsi128_ps(_mm_setr_epi32(0, -1, 0, 0)))));
            }
            let s = { let ($bw, $ba) = (w0, a0); $block };
            acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcastss_ps(p), acc[0]);
            i += 1;
        }
        let total = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
        if $ms { total + odd_lanes_sum(ms) } else { total }
    }};
}

// Each body: `nb` block pairs at `w` (weight blocks) and `a` (activation blocks), all in
// bounds (the wrapper's SAFETY argument); AVX2, FMA and F16C available.

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_q8_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; every pointer formed is inside block i < nb of its row.
    unsafe {
        let off = _mm256_set1_epi8(8);
        dot_loop!(nb, w, a, 18, 34, ms = false, |bw, ba| {
            dot_u8_off_i8(nibbles(bw.add(2)), off, _mm256_loadu_si256(ba.add(2).cast()))
        })
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_q8_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; block layout d@0 qh@2 qs@6.
    unsafe {
        let off = _mm256_set1_epi8(16);
        dot_loop!(nb, w, a, 22, 34, ms = false, |bw, ba| {
            let x = _mm256_or_si256(nibbles(bw.add(6)), fifth_bits(bw.add(2)));
            dot_u8_off_i8(x, off, _mm256_loadu_si256(ba.add(2).cast()))
        })
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_q8_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; block layout d@0 qs@2.
    unsafe {
        dot_loop!(nb, w, a, 34, 34, ms = false, |bw, ba| {
            dot_i8_i8(_mm256_loadu_si256(bw.add(2).cast()), _mm256_loadu_si256(ba.add(2).cast()))
        })
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_q8_1(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layouts d@0 m@2 qs@4 and d@0 s@2 qs@4.
    unsafe {
        dot_loop!(nb, w, a, 20, 36, ms = true, |bw, ba| {
            dot_u8_i8(nibbles(bw.add(4)), _mm256_loadu_si256(ba.add(4).cast()))
        })
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1_q8_1(nb: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: see above; layout d@0 m@2 qh@4 qs@8.
    unsafe {
        dot_loop!(nb, w, a, 24, 36, ms = true, |bw, ba| {
            let x = _mm256_or_si256(nibbles(bw.add(8)), fifth_bits(bw.add(4)));
            dot_u8_i8(x, _mm256_loadu_si256(ba.add(4).cast()))
        })
    }
}

// ---------------------------------------------------------------- float dots

/// Shared loop of the float dots: `load(p, i)` gives 8 f32 from element i of row p;
/// 32 elements per iteration in 4 accumulators, then 8 at a time, then a scalar tail.
macro_rules! float_dot {
    ($n:expr, $w:expr, $a:expr, |$p:ident, $i:ident| $load:expr, |$q:ident, $j:ident| $scalar:expr) => {{
        let (n, w, a) = ($n, $w, $a);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, acc) in acc.iter_mut().enumerate() {
                let x = { let ($p, $i) = (w, i + 8 * k); $load };
                let y = { let ($p, $i) = (a, i + 8 * k); $load };
                *acc = _mm256_fmadd_ps(x, y, *acc);
            }
            i += 32;
        }
        while i + 8 <= n {
            let x = { let ($p, $i) = (w, i); $load };
            let y = { let ($p, $i) = (a, i); $load };
            acc[0] = _mm256_fmadd_ps(x, y, acc[0]);
            i += 8;
        }
        let mut sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
        while i < n {
            let x = { let ($q, $j) = (w, i); $scalar };
            let y = { let ($q, $j) = (a, i); $scalar };
            sum += x * y;
            i += 1;
        }
        sum
    }};
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_f32(n: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: n f32 (4n bytes) readable at w and a; unaligned loads only.
    unsafe {
        float_dot!(n, w, a, |p, i| _mm256_loadu_ps(p.add(4 * i).cast()),
            |p, i| core::ptr::read_unaligned(p.add(4 * i).cast::<f32>()))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_f16(n: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: n f16 (2n bytes) readable at w and a; unaligned loads only.
    unsafe {
        float_dot!(n, w, a, |p, i| _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i).cast())),
            |p, i| f16_to_f32(rd16(p.add(2 * i)) as u16))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bf16_bf16(n: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: n bf16 (2n bytes) readable at w and a; unaligned loads only.
    unsafe {
        float_dot!(n, w, a,
            |p, i| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(2 * i).cast())))),
            |p, i| bf16_to_f32(rd16(p.add(2 * i)) as u16))
    }
}

// ---------------------------------------------------------------- activations

/// f32 activations → Q8_0 (`with_sum = false`, 34-byte blocks) or Q8_1 (36-byte
/// blocks); whole blocks only. Same bytes as `quantize::quantize_act_q8_*`.
pub(crate) fn quantize_q8(x: &[f32], out: &mut [u8], with_sum: bool) {
    let size = if with_sum { 36 } else { 34 };
    let nb = (x.len() / 32).min(out.len() / size);
    // SAFETY: only called after cpu_has_avx2_fma() (module contract); nb blocks of
    // input (32 f32) and output (`size` bytes) are inside `x` and `out`.
    unsafe { quantize_q8_avx2(nb, x.as_ptr(), out.as_mut_ptr(), with_sum) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_avx2(nb: usize, x: *const f32, out: *mut u8, with_sum: bool) {
    // SAFETY: nb blocks in bounds (caller); unaligned loads and stores only.
    unsafe {
        let size = if with_sum { 36 } else { 34 };
        let sign = _mm256_set1_ps(-0.0);
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for b in 0..nb {
            let (xp, op) = (x.add(32 * b), out.add(size * b));
            let v = [_mm256_loadu_ps(xp), _mm256_loadu_ps(xp.add(8)), _mm256_loadu_ps(xp.add(16)), _mm256_loadu_ps(xp.add(24))];
            let m = _mm256_max_ps(
                _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
            );
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let (i0, i1, i2, i3) = (round_i32(v[0], id), round_i32(v[1], id), round_i32(v[2], id), round_i32(v[3], id));
            let p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            let p = _mm256_permutevar8x32_epi32(p, order);
            let dh = _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d))) as u16;
            core::ptr::write_unaligned(op.cast::<[u8; 2]>(), dh.to_le_bytes());
            if with_sum {
                let sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
                let s = _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d * sum as f32))) as u16;
                core::ptr::write_unaligned(op.add(2).cast::<[u8; 2]>(), s.to_le_bytes());
            }
            _mm256_storeu_si256(op.add(size - 32).cast(), p);
        }
    }
}

/// `round_half_even(v * id)` as i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn round_i32(v: __m256, id: __m256) -> __m256i {
    unsafe { _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v, id))) }
}

/// f32 → f16 activations (round to nearest even), same bytes as the scalar conversion.
pub(crate) fn convert_f16(x: &[f32], out: &mut [u8]) {
    let n = x.len().min(out.len() / 2);
    // SAFETY: only called after cpu_has_avx2_fma() (module contract); n inputs and 2n
    // output bytes are in bounds.
    unsafe { convert_f16_avx2(n, x.as_ptr(), out.as_mut_ptr()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn convert_f16_avx2(n: usize, x: *const f32, out: *mut u8) {
    // SAFETY: n elements in bounds (caller); unaligned loads and stores only.
    unsafe {
        let mut i = 0;
        while i + 8 <= n {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x.add(i)));
            _mm_storeu_si128(out.add(2 * i).cast(), h);
            i += 8;
        }
        while i < n {
            let h = _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(*x.add(i)))) as u16;
            core::ptr::write_unaligned(out.add(2 * i).cast::<[u8; 2]>(), h.to_le_bytes());
            i += 1;
        }
    }
}

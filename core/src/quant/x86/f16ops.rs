//! AVX2 + FMA + F16C versions of the attention f16 operations in `../f16ops.rs`, with
//! the same bits: the 16-lane vectors of the reference are pairs of 256-bit vectors, and
//! every fma, add and rounding happens on the same values in the same order. Only handed
//! out after `cpu_has_avx2_fma()` (module contract of `x86`). The AVX-512 versions (the
//! grouped K·Q dots and value updates, the score pass) run only where the caller's
//! `avx512` flag, set after `cpu_has_avx512()`, says so.
//!
//! The native f16 part of `mad` (the first `n & !127` elements: one rounding of the exact
//! `x·v16 + y` to f16) has two exact versions:
//! - with AVX512-FP16 (`fp16`, only after `cpu_has_avx512_fp16()`): the instruction the
//!   reference emulates, `vfmadd231ph` on 16 f16 lanes (inline asm: the f16 intrinsics are
//!   not stable Rust);
//! - otherwise in f32, 8 lanes: `p = x·v16` is exact (two 11-bit significands, and
//!   |p| >= 2^-48 is a normal f32), `s = p + y` with its exact error `e` (TwoSum), then `s`
//!   rounded to odd using `e` (toward zero by one ulp if `e` points inward, then the last
//!   bit set if `e != 0`) and that rounded to f16 to nearest even: 13 spare bits, so one
//!   rounding of `p + y`, as the reference's f64 fma and round-to-odd give.
//!   The grouped AVX-512 update (`mad_exact_avx512`) rounds to odd from the sum rounded
//!   down and rounded up by two fmas instead.

use core::arch::x86_64::*;

use super::super::f16ops::{self as reference, DOT_STEP, F16_STEP};
use super::{cvtph_ps_m512, f16_round_to, hsum_ps, RoundSlots};
use half::f16;

/// Whether a row of `n` elements at every offset in `offs` lies inside `len` elements
/// (what the kernels' unchecked loads rely on): no offset past `len - n`, checked
/// without an early exit so that it compiles to AVX2 compares of four offsets at a time
/// (it runs once per chunk of every query: a loop of two scalar compares per offset
/// took ~1.5% of a prompt's time at depth 4096).
fn rows_fit(offs: &[usize], n: usize, len: usize) -> bool {
    #[target_feature(enable = "avx2")]
    unsafe fn none_past(offs: &[usize], last: usize) -> bool {
        !offs.iter().fold(false, |past, &o| past | (o > last))
    }
    match len.checked_sub(n) {
        // SAFETY: AVX2 present (module contract).
        Some(last) => unsafe { none_past(offs, last) },
        None => offs.is_empty(),
    }
}

/// K·Q dot (see `f16ops::dot`).
pub(crate) fn dot(x: &[f16], y: &[f16]) -> f32 {
    let n = x.len().min(y.len());
    // SAFETY: AVX2/FMA/F16C present (module contract); n elements readable in both.
    unsafe { dot_avx2(n, x.as_ptr().cast(), y.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(n: usize, x: *const u16, y: *const u16) -> f32 {
    // SAFETY: n elements at x and y (caller); unaligned loads only.
    unsafe {
        let ld = |p: *const u16, i: usize| _mm256_cvtph_ps(_mm_loadu_si128(p.add(i).cast()));
        let np = n - n % DOT_STEP;
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut i = 0;
        while i < np {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(ld(x, i + 8 * k), ld(y, i + 8 * k), *a);
            }
            i += DOT_STEP;
        }
        // 16-lane sums j = (acc[2j], acc[2j+1]); (0+2) + (1+3), then high + low half.
        let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
        let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
        let mut sum = hsum_ps(_mm256_add_ps(hi, lo)) as f64;
        for j in np..n {
            let (a, b) = (f16::from_bits(*x.add(j)).to_f32(), f16::from_bits(*y.add(j)).to_f32());
            sum += (a * b) as f64;
        }
        sum as f32
    }
}

/// `y += x·v` on an f16 accumulator (see `f16ops::mad`); `fp16`: the CPU has
/// AVX512-FP16 (confirmed by `cpu_has_avx512_fp16()`).
pub(crate) fn mad(y: &mut [f16], x: &[f16], v: f32, fp16: bool) {
    let n = y.len().min(x.len());
    let np = n - n % F16_STEP;
    let vh = f16::from_f32(v);
    // SAFETY: AVX2/FMA/F16C present (module contract), AVX512-FP16/VL if `fp16` (caller);
    // np elements from 0, n - np from np, lie in both slices.
    unsafe {
        if fp16 {
            mad_fp16(np, y.as_mut_ptr().cast(), x.as_ptr().cast(), vh.to_bits());
        } else {
            mad_exact_avx2(np, y.as_mut_ptr().cast(), x.as_ptr().cast(), vh.to_f32());
        }
        mad_avx2(n - np, y[np..].as_mut_ptr().cast(), x[np..].as_ptr().cast(), v);
    }
}

/// `y = f16(x·vh + y)` with one rounding, by AVX512-FP16's `vfmadd231ph`, 16 lanes.
///
/// # Safety
/// AVX2 and AVX512-FP16 + AVX512-VL present; `n` elements at `x` and `y`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mad_fp16(n: usize, y: *mut u16, x: *const u16, vh: u16) {
    // SAFETY: n elements at x and y (caller); unaligned loads and stores only; the asm
    // reads and writes registers only, and the CPU has the instruction (caller).
    unsafe {
        let vv = _mm256_set1_epi16(vh as i16);
        let mut i = 0;
        while i + 16 <= n {
            let mut acc = _mm256_loadu_si256(y.add(i).cast());
            let xv = _mm256_loadu_si256(x.add(i).cast());
            // acc = xv·vv + acc in f16, rounded once (MXCSR: nearest even; FP16
            // instructions ignore DAZ/FTZ).
            core::arch::asm!(
                "vfmadd231ph {acc}, {x}, {v}",
                acc = inout(ymm_reg) acc,
                x = in(ymm_reg) xv,
                v = in(ymm_reg) vv,
                options(pure, nomem, nostack, preserves_flags),
            );
            _mm256_storeu_si256(y.add(i).cast(), acc);
            i += 16;
        }
        if i < n {
            mad_exact_avx2(n - i, y.add(i), x.add(i), f16::from_bits(vh).to_f32());
        }
    }
}

/// `y = f16(x·vh + y)` with one rounding (`vh` an f16 value), in f32 with TwoSum and
/// round-to-odd (see the module doc), 8 lanes.
///
/// # Safety
/// AVX2/FMA/F16C present; `n` elements at `x` and `y`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mad_exact_avx2(n: usize, y: *mut u16, x: *const u16, vh: f32) {
    // SAFETY: n elements at x and y (caller); unaligned loads and stores only.
    unsafe {
        let vv = _mm256_set1_ps(vh);
        let zero = _mm256_setzero_ps();
        let one = _mm256_set1_epi32(1);
        let mut i = 0;
        while i + 8 <= n {
            let xf = _mm256_cvtph_ps(_mm_loadu_si128(x.add(i).cast()));
            let yf = _mm256_cvtph_ps(_mm_loadu_si128(y.add(i).cast()));
            let r = round_odd_sum(_mm256_mul_ps(xf, vv), yf, zero, one);
            _mm_storeu_si128(y.add(i).cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r));
            i += 8;
        }
        while i < n {
            let (xi, yi) = (f16::from_bits(*x.add(i)), f16::from_bits(*y.add(i)));
            *y.add(i) = reference::f16_from_f64(libm::fma(xi.to_f64(), vh as f64, yi.to_f64())).to_bits();
            i += 1;
        }
    }
}

/// `p + y` rounded to f32 by round-to-odd (exact sums and non-finite `s` unchanged).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn round_odd_sum(p: __m256, y: __m256, zero: __m256, one: __m256i) -> __m256 {
    // SAFETY: value-only intrinsics (AVX2 present: caller).
    unsafe {
        // TwoSum: s + e == p + y exactly (no overflow: |p| < 2^33).
        let s = _mm256_add_ps(p, y);
        let bb = _mm256_sub_ps(s, p);
        let e = _mm256_add_ps(_mm256_sub_ps(p, _mm256_sub_ps(s, bb)), _mm256_sub_ps(y, bb));
        // Inexact lanes: e != 0 (false for NaN e, i.e. for infinite s).
        let inexact = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_NEQ_OQ>(e, zero));
        let sb = _mm256_castps_si256(s);
        // e of the other sign than s: s is past the exact sum, step one ulp toward zero.
        let inward = _mm256_and_si256(_mm256_srai_epi32::<31>(_mm256_xor_si256(sb, _mm256_castps_si256(e))), inexact);
        let t = _mm256_add_epi32(sb, inward);
        _mm256_castsi256_ps(_mm256_or_si256(t, _mm256_and_si256(inexact, one)))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mad_avx2(n: usize, y: *mut u16, x: *const u16, v: f32) {
    // SAFETY: n elements at x and y (caller); unaligned loads and stores only.
    unsafe {
        let vv = _mm256_set1_ps(v);
        let mut i = 0;
        while i + 8 <= n {
            let r = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(x.add(i).cast())), vv, _mm256_cvtph_ps(_mm_loadu_si128(y.add(i).cast())));
            _mm_storeu_si128(y.add(i).cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r));
            i += 8;
        }
        while i < n {
            let r = libm::fmaf(f16::from_bits(*x.add(i)).to_f32(), v, f16::from_bits(*y.add(i)).to_f32());
            *y.add(i) = f16::from_f32(r).to_bits();
            i += 1;
        }
    }
}

/// `y *= v` on an f16 accumulator (see `f16ops::scale`).
pub(crate) fn scale(y: &mut [f16], v: f32) {
    let n = y.len();
    let np = n - n % F16_STEP;
    let vh = f16::from_f32(v).to_f32();
    // SAFETY: AVX2/FMA/F16C present (module contract); the ranges lie inside y.
    unsafe {
        scale_avx2(np, y.as_mut_ptr().cast(), vh);
        scale_avx2(n - np, y[np..].as_mut_ptr().cast(), v);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_avx2(n: usize, y: *mut u16, v: f32) {
    // SAFETY: n elements at y (caller); unaligned loads and stores only.
    unsafe {
        let vv = _mm256_set1_ps(v);
        let mut i = 0;
        while i + 8 <= n {
            let r = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(y.add(i).cast())), vv);
            _mm_storeu_si128(y.add(i).cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r));
            i += 8;
        }
        while i < n {
            *y.add(i) = f16::from_f32(f16::from_bits(*y.add(i)).to_f32() * v).to_bits();
            i += 1;
        }
    }
}

/// `dst[i] = f16(src[i])` (round to nearest even), 8 at a time.
pub(crate) fn to_f16(src: &[f32], dst: &mut [f16]) {
    let n = src.len().min(dst.len());
    // SAFETY: AVX2/FMA/F16C present (module contract); n elements in both.
    unsafe { to_f16_avx2(n, src.as_ptr(), dst.as_mut_ptr().cast()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn to_f16_avx2(n: usize, src: *const f32, dst: *mut u16) {
    // SAFETY: n elements at src and dst (caller); unaligned loads and stores only.
    unsafe {
        let mut i = 0;
        while i + 8 <= n {
            _mm_storeu_si128(dst.add(i).cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.add(i))));
            i += 8;
        }
        while i < n {
            *dst.add(i) = f16::from_f32(*src.add(i)).to_bits();
            i += 1;
        }
    }
}

/// `dst[i] = f32(src[i])`, 8 at a time.
pub(crate) fn to_f32(src: &[f16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    // SAFETY: AVX2/FMA/F16C present (module contract); n elements in both.
    unsafe { to_f32_avx2(n, src.as_ptr().cast(), dst.as_mut_ptr()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn to_f32_avx2(n: usize, src: *const u16, dst: *mut f32) {
    // SAFETY: n elements at src and dst (caller); unaligned loads and stores only.
    unsafe {
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(dst.add(i), _mm256_cvtph_ps(_mm_loadu_si128(src.add(i).cast())));
            i += 8;
        }
        while i < n {
            *dst.add(i) = f16::from_bits(*src.add(i)).to_f32();
            i += 1;
        }
    }
}

/// `Kernels::f16_rows_to_f32` for rows of a multiple of 16, AVX-512 only (the caller's
/// table is built after cpu_has_avx512()): each 16 elements one `vcvtph2ps` from memory.
pub(crate) fn rows_to_f32_avx512(src: &[f16], offs: &[usize], n: usize, dst: &mut [f32]) {
    assert!(n.is_multiple_of(16) && dst.len() >= offs.len() * n && rows_fit(offs, n, src.len()), "f16_rows_to_f32: rows out of bounds");
    // SAFETY: AVX-512 F present (above); every row's n elements lie in src and the
    // offs.len() rows of n in dst (checked above).
    unsafe { rows_to_f32_zmm(src.as_ptr().cast(), offs, n, dst.as_mut_ptr()) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn rows_to_f32_zmm(src: *const u16, offs: &[usize], n: usize, dst: *mut f32) {
    // SAFETY: as rows_to_f32_avx512; unaligned stores only.
    unsafe {
        for (c, &off) in offs.iter().enumerate() {
            for i in (0..n).step_by(16) {
                _mm512_storeu_ps(dst.add(c * n + i), cvtph_ps_m512(src.add(off + i)));
            }
        }
    }
}

/// `out[c] = dot(k[offs[c]..][..q.len()], q)` for every c (see `f16ops::dot`): one call
/// for a chunk of keys.
pub(crate) fn dot_keys(k: &[f16], offs: &[usize], q: &[f16], out: &mut [f32], avx512: bool) {
    let n = q.len();
    if dot_keys_heads_fits(n, avx512) {
        // q converted once: the one-head case of the grouped dots.
        return dot_keys_heads(k, offs, q, n, 1, out, avx512);
    }
    assert!(out.len() >= offs.len() && rows_fit(offs, n, k.len()), "dot_keys: key out of bounds");
    // SAFETY: AVX2/FMA/F16C present (module contract); every key's n elements lie in k
    // (checked above), q holds n, out one per key.
    unsafe { dot_keys_avx2(n, k.as_ptr().cast(), offs, q.as_ptr().cast(), out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_keys_avx2(n: usize, k: *const u16, offs: &[usize], q: *const u16, out: &mut [f32]) {
    // SAFETY: n elements at k + offs[c] and at q (caller).
    unsafe {
        for (o, &off) in out.iter_mut().zip(offs) {
            *o = dot_avx2(n, k.add(off), q);
        }
    }
}

/// The value accumulator's updates for a run of keys, in key order (see
/// `Kernels::f16_mad_keys`): key c scales `y` by `e[c]` and adds `x_c·1` if `new_max[c]`,
/// else adds `x_c·e[c]`, with `x_c = x[offs[c]..][..y.len()]`; the bits of `scale` and
/// `mad` key by key. Rows of at most 64 elements in whole vectors stay in registers
/// between keys (as f32 holding f16 values exactly: each step rounds to f16 and back).
pub(crate) fn mad_keys(y: &mut [f16], x: &[f16], offs: &[usize], new_max: &[bool], e: &[f32], fp16: bool) {
    let n = y.len();
    assert!(new_max.len() >= offs.len() && e.len() >= offs.len(), "mad_keys: short arrays");
    assert!(rows_fit(offs, n, x.len()), "mad_keys: value row out of bounds");
    let (yp, xp) = (y.as_mut_ptr().cast::<u16>(), x.as_ptr().cast::<u16>());
    // SAFETY (each arm): AVX2/FMA/F16C present (module contract), AVX512-FP16 with
    // AVX-512 F/VL where `fp16` (the caller's `Kernels` flag, set only after
    // cpu_has_avx512_fp16()); y holds n elements, and every value row's n elements lie
    // in x (checked above).
    match n {
        // Whole 128-element steps: the native f16 path of `scale` and `mad` for every
        // element, by AVX512-FP16 on 512-bit vectors kept in registers between keys.
        128 if fp16 => unsafe { mad_keys_fp16::<4>(yp, xp, offs, new_max, e) },
        256 if fp16 => unsafe { mad_keys_fp16::<8>(yp, xp, offs, new_max, e) },
        8 => unsafe { mad_keys_regs::<1>(yp, xp, offs, new_max, e) },
        16 => unsafe { mad_keys_regs::<2>(yp, xp, offs, new_max, e) },
        32 => unsafe { mad_keys_regs::<4>(yp, xp, offs, new_max, e) },
        64 => unsafe { mad_keys_regs::<8>(yp, xp, offs, new_max, e) },
        _ => {
            for (c, &off) in offs.iter().enumerate() {
                if new_max[c] {
                    scale(y, e[c]);
                    mad(y, &x[off..off + n], 1.0, fp16);
                } else {
                    mad(y, &x[off..off + n], e[c], fp16);
                }
            }
        }
    }
}

/// [`mad_keys`] for a row of `32·V` elements (whole F16_STEP steps) with AVX512-FP16:
/// `scale` as `vmulph` by `f16(e)` (the f32 product of two f16 is exact, so rounding it
/// to f16 is the one rounding `vmulph` does), `mad` as in [`mad_fp16`] (`vfmadd231ph` by
/// `f16(v)`); the row stays in `V` registers between keys.
///
/// # Safety
/// AVX2, AVX512-FP16 and AVX-512 F/VL present (`cpu_has_avx512_fp16()`); `32·V` elements at `y` and at
/// `x + offs[c]` for every c; `new_max` and `e` as long as `offs`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn mad_keys_fp16<const V: usize>(y: *mut u16, x: *const u16, offs: &[usize], new_max: &[bool], e: &[f32]) {
    // SAFETY: as above; unaligned loads and stores only; the asm reads and writes
    // registers only, and the CPU has the instructions (caller).
    unsafe {
        let mut acc: [__m512i; V] = core::array::from_fn(|k| _mm512_loadu_si512(y.add(32 * k).cast()));
        let one = f16::ONE.to_bits();
        for (c, &off) in offs.iter().enumerate() {
            let eh = f16::from_f32(e[c]).to_bits();
            let vh = if new_max[c] {
                let s = _mm512_set1_epi16(eh as i16);
                for a in acc.iter_mut() {
                    // a = f16(a·s), rounded once (nearest even; FP16 ignores DAZ/FTZ).
                    core::arch::asm!("vmulph {a}, {a}, {s}", a = inout(zmm_reg) *a, s = in(zmm_reg) s, options(pure, nomem, nostack, preserves_flags));
                }
                one
            } else {
                eh
            };
            let vv = _mm512_set1_epi16(vh as i16);
            let row = x.add(off);
            for (k, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_loadu_si512(row.add(32 * k).cast());
                // a = f16(xv·vv + a), rounded once.
                core::arch::asm!(
                    "vfmadd231ph {a}, {x}, {v}",
                    a = inout(zmm_reg) *a,
                    x = in(zmm_reg) xv,
                    v = in(zmm_reg) vv,
                    options(pure, nomem, nostack, preserves_flags),
                );
            }
        }
        for (k, a) in acc.iter().enumerate() {
            _mm512_storeu_si512(y.add(32 * k).cast(), *a);
        }
    }
}

// (Rows shorter than F16_STEP: `scale` and `mad` take their f32 paths, `scale_avx2` and
// `mad_avx2`, for every element.)
const _: () = assert!(64 < F16_STEP);

/// [`mad_keys`] for a row of `8·V` elements kept in `V` registers.
///
/// # Safety
/// AVX2/FMA/F16C present; `8·V` elements at `y` and at `x + offs[c]` for every c;
/// `new_max` and `e` as long as `offs`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mad_keys_regs<const V: usize>(y: *mut u16, x: *const u16, offs: &[usize], new_max: &[bool], e: &[f32]) {
    // SAFETY: as above; unaligned loads and stores only.
    unsafe {
        let f16_round = |v: __m256| _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
        let mut acc: [__m256; V] = core::array::from_fn(|k| _mm256_cvtph_ps(_mm_loadu_si128(y.add(8 * k).cast())));
        for (c, &off) in offs.iter().enumerate() {
            let vs = if new_max[c] {
                // scale_avx2: f16(y·v).
                let s = _mm256_set1_ps(e[c]);
                for a in acc.iter_mut() {
                    *a = f16_round(_mm256_mul_ps(*a, s));
                }
                _mm256_set1_ps(1.0)
            } else {
                _mm256_set1_ps(e[c])
            };
            // mad_avx2: f16(fma(x, v, y)).
            let row = x.add(off);
            for (k, a) in acc.iter_mut().enumerate() {
                *a = f16_round(_mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(row.add(8 * k).cast())), vs, *a));
            }
        }
        for (k, a) in acc.iter().enumerate() {
            _mm_storeu_si128(y.add(8 * k).cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(*a));
        }
    }
}

/// See `Kernels::softmax_scores`; only after `cpu_has_avx512()` (with BW and VL).
pub(crate) fn softmax_scores(e: &mut [f32], new_max: &mut [bool], scale: f32, max: &mut [f32]) {
    softmax_scores_rows(e, new_max, scale, max, true)
}

/// [`softmax_scores`] for AVX2 alone: [`softmax_scores_avx512`]'s steps on 8 scores
/// (the prefix maximum's shifts by lane permutes with -inf blended in, the flags written
/// from the comparison's mask).
pub(crate) fn softmax_scores_avx2(e: &mut [f32], new_max: &mut [bool], scale: f32, max: &mut [f32]) {
    softmax_scores_rows(e, new_max, scale, max, false)
}

/// [`softmax_scores`] (`avx512`: the caller's flag, set only after `cpu_has_avx512()`)
/// and [`softmax_scores_avx2`]: up to four rows side by side (their chains are
/// independent); more, four at a time.
fn softmax_scores_rows(e: &mut [f32], new_max: &mut [bool], scale: f32, max: &mut [f32], avx512: bool) {
    let heads = max.len();
    assert!(heads > 0 && e.len().is_multiple_of(heads) && new_max.len() >= e.len(), "softmax_scores: {heads} rows of {} scores", e.len());
    let len = e.len() / heads;
    let (ep, np) = (e.as_mut_ptr(), new_max.as_mut_ptr());
    for (g, m) in max.chunks_mut(4).enumerate() {
        let (ep, np) = (ep.wrapping_add(4 * g * len), np.wrapping_add(4 * g * len));
        // SAFETY: AVX2/FMA/F16C present (module contract), AVX-512 F/BW/VL where `avx512`
        // (the caller's flag); rows 4g.. of len elements at ep and np (checked above).
        unsafe {
            match (avx512, m.len()) {
                (true, 1) => softmax_scores_avx512::<1>(ep, np, len, scale, m),
                (true, 2) => softmax_scores_avx512::<2>(ep, np, len, scale, m),
                (true, 3) => softmax_scores_avx512::<3>(ep, np, len, scale, m),
                (true, _) => softmax_scores_avx512::<4>(ep, np, len, scale, m),
                (false, 1) => softmax_scores_ymm::<1>(ep, np, len, scale, m),
                (false, 2) => softmax_scores_ymm::<2>(ep, np, len, scale, m),
                (false, 3) => softmax_scores_ymm::<3>(ep, np, len, scale, m),
                (false, _) => softmax_scores_ymm::<4>(ep, np, len, scale, m),
            }
        }
    }
}

/// 16 scores per step: `s = e·scale` (the same product); the maximum before each key,
/// `m[c] = max(max, s[0..c])`, by a prefix maximum (a NaN score never becomes the
/// maximum, as `s > max` is false for it, and is dropped by the first maximum; every other
/// order of taking maxima gives the same value, and which zero a tie keeps does not
/// matter: it only feeds `s - m` and `m - s`, whose zero results go to `expf`, and later
/// comparisons); `new = s > m[c]`, `e = new ? m[c] - s : s - m[c]`: each key's scalar
/// operations on the same values. `H` rows of `len` (row h at `e + h·len`, flags at
/// `new_max + h·len`, running maximum `max[h]`) step by step side by side: each row's
/// chain (one maximum and one permute per step) waits on its own previous step only.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL present; `H·len` elements at `e` and `new_max`,
/// `max.len() >= H`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn softmax_scores_avx512<const H: usize>(e: *mut f32, new_max: *mut bool, len: usize, scale: f32, max: &mut [f32]) {
    // SAFETY: masked loads and stores touch only the first len elements of each row.
    unsafe {
        let (sc, ninf) = (_mm512_set1_ps(scale), _mm512_set1_ps(f32::NEG_INFINITY));
        let ones = _mm_set1_epi8(1);
        // Each row's running maximum in every lane: the only value carried from one step
        // to the next.
        let mut mv: [__m512; H] = core::array::from_fn(|h| _mm512_set1_ps(max[h]));
        for c0 in (0..len).step_by(16) {
            let n = (len - c0).min(16);
            let k = ((1u32 << n) - 1) as u16;
            for (h, mv) in mv.iter_mut().enumerate() {
                let p = e.add(h * len + c0);
                let s = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p), sc);
                // No score above the running maximum (the usual step once a row has seen
                // a few keys): every prefix maximum below is `m` itself, bit for bit (a
                // tie keeps vmaxps' second operand, `m`; a NaN drops out), so each key's
                // `m` is the running maximum and no flag is set.
                if _mm512_cmp_ps_mask::<_CMP_GT_OQ>(s, *mv) & k == 0 {
                    _mm512_mask_storeu_ps(p, k, _mm512_sub_ps(s, *mv));
                    _mm_mask_storeu_epi8(new_max.add(h * len + c0).cast(), k, _mm_setzero_si128());
                    continue;
                }
                // Inclusive prefix maximum (lanes shifted up by 1, 2, 4, 8 with -inf fill).
                let shift = |v: __m512, by: usize| match by {
                    1 => _mm512_castsi512_ps(_mm512_alignr_epi32::<15>(_mm512_castps_si512(v), _mm512_castps_si512(ninf))),
                    2 => _mm512_castsi512_ps(_mm512_alignr_epi32::<14>(_mm512_castps_si512(v), _mm512_castps_si512(ninf))),
                    4 => _mm512_castsi512_ps(_mm512_alignr_epi32::<12>(_mm512_castps_si512(v), _mm512_castps_si512(ninf))),
                    _ => _mm512_castsi512_ps(_mm512_alignr_epi32::<8>(_mm512_castps_si512(v), _mm512_castps_si512(ninf))),
                };
                // The step's own prefix maximum first (`max(s, -inf)` is -inf for a NaN
                // `s`: vmaxps returns its second operand then; lanes past the end hold 0
                // and are never read back), then the running maximum taken into every lane.
                let mut pm = _mm512_max_ps(s, ninf);
                for by in [1, 2, 4, 8] {
                    pm = _mm512_max_ps(pm, shift(pm, by));
                }
                let pm = _mm512_max_ps(pm, *mv);
                // The maximum before each key: the prefix shifted by one, `m` in lane 0.
                let before = _mm512_castsi512_ps(_mm512_alignr_epi32::<15>(_mm512_castps_si512(pm), _mm512_castps_si512(*mv)));
                let new = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(s, before) & k;
                let r = _mm512_mask_blend_ps(new, _mm512_sub_ps(s, before), _mm512_sub_ps(before, s));
                _mm512_mask_storeu_ps(p, k, r);
                _mm_mask_storeu_epi8(new_max.add(h * len + c0).cast(), k, _mm_maskz_mov_epi8(new, ones));
                *mv = _mm512_permutexvar_ps(_mm512_set1_epi32(n as i32 - 1), pm);
            }
        }
        for (m, v) in max.iter_mut().zip(&mv) {
            *m = _mm512_cvtss_f32(*v);
        }
    }
}

/// [`softmax_scores_avx2`]'s steps: 8 scores of each of `H` rows at a time, the rows side
/// by side (each row's chain waits on its own previous step only). The same operations
/// per key as [`softmax_scores_avx512`] (whose doc says why the prefix maximum gives
/// each key's running maximum): `s = e·scale`, `new = s > m`, `e = new ? m - s : s - m`.
///
/// # Safety
/// AVX2/FMA/F16C present; `H·len` elements at `e` and `new_max`, `max.len() >= H`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn softmax_scores_ymm<const H: usize>(e: *mut f32, new_max: *mut bool, len: usize, scale: f32, max: &mut [f32]) {
    // SAFETY: masked loads and stores touch only the first len elements of each row; the
    // flags are written one by one for the step's n <= 8 keys.
    unsafe {
        let (sc, ninf) = (_mm256_set1_ps(scale), _mm256_set1_ps(f32::NEG_INFINITY));
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        // Lane l from lane l - k (lane 0 for l < k); the low k lanes are then blended.
        let (by1, by2, by4) = (_mm256_setr_epi32(0, 0, 1, 2, 3, 4, 5, 6), _mm256_setr_epi32(0, 0, 0, 1, 2, 3, 4, 5), _mm256_setr_epi32(0, 0, 0, 0, 0, 1, 2, 3));
        let mut mv: [__m256; H] = core::array::from_fn(|h| _mm256_set1_ps(max[h]));
        for c0 in (0..len).step_by(8) {
            let n = (len - c0).min(8);
            let valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lanes);
            let bits = (1u32 << n) - 1;
            for (h, mv) in mv.iter_mut().enumerate() {
                let p = e.add(h * len + c0);
                let f = new_max.add(h * len + c0);
                let s = _mm256_mul_ps(_mm256_maskload_ps(p, valid), sc);
                // No score above the running maximum: each key's `m` is the running
                // maximum, no flag is set.
                if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(s, *mv)) as u32 & bits == 0 {
                    _mm256_maskstore_ps(p, valid, _mm256_sub_ps(s, *mv));
                    core::ptr::write_bytes(f, 0, n);
                    continue;
                }
                // Inclusive prefix maximum (a NaN score is -inf from the first maximum on).
                let mut pm = _mm256_max_ps(s, ninf);
                pm = _mm256_max_ps(pm, _mm256_blend_ps::<0x01>(_mm256_permutevar8x32_ps(pm, by1), ninf));
                pm = _mm256_max_ps(pm, _mm256_blend_ps::<0x03>(_mm256_permutevar8x32_ps(pm, by2), ninf));
                pm = _mm256_max_ps(pm, _mm256_blend_ps::<0x0F>(_mm256_permutevar8x32_ps(pm, by4), ninf));
                let pm = _mm256_max_ps(pm, *mv);
                // The maximum before each key: the prefix shifted by one, `m` in lane 0.
                let before = _mm256_blend_ps::<0x01>(_mm256_permutevar8x32_ps(pm, by1), *mv);
                let new = _mm256_cmp_ps::<_CMP_GT_OQ>(s, before);
                let r = _mm256_blendv_ps(_mm256_sub_ps(s, before), _mm256_sub_ps(before, s), new);
                _mm256_maskstore_ps(p, valid, r);
                let nb = _mm256_movemask_ps(new) as u32;
                for l in 0..n {
                    *f.add(l) = nb >> l & 1 == 1;
                }
                *mv = _mm256_permutevar8x32_ps(pm, _mm256_set1_epi32(n as i32 - 1));
            }
        }
        for (m, v) in max.iter_mut().zip(&mv) {
            *m = _mm256_cvtss_f32(*v);
        }
    }
}

/// See `Kernels::softmax_sum`.
pub(crate) fn softmax_sum(sum: f32, new_max: &[bool], e: &[f32]) -> f32 {
    let n = new_max.len().min(e.len());
    let mut s = [sum];
    // SAFETY: AVX2/FMA/F16C present (module contract).
    unsafe { softmax_sums_fma::<1>(&mut s, &new_max[..n], &e[..n]) };
    s[0]
}

/// [`softmax_sum`] for the rows of several heads (`sums[h]` over row h of `new_max` and
/// `e`, rows of `e.len() / sums.len()`): up to 4 heads' fma chains interleaved key by key
/// (one chain waits 4 cycles per key on its previous fma), each chain's operations and
/// their order those of `softmax_sum`.
pub(crate) fn softmax_sums(sums: &mut [f32], new_max: &[bool], e: &[f32]) {
    let heads = sums.len();
    if heads == 0 {
        return;
    }
    assert!(e.len().is_multiple_of(heads) && new_max.len() == e.len(), "softmax_sums: {heads} heads of {} keys", e.len());
    let len = e.len() / heads;
    for (g, sums) in sums.chunks_mut(4).enumerate() {
        let r = 4 * g * len..(4 * g + sums.len()) * len;
        let (new_max, e) = (&new_max[r.clone()], &e[r]);
        // SAFETY: AVX2/FMA/F16C present (module contract); value-only intrinsics and
        // slice indexing inside.
        unsafe {
            match sums.len() {
                1 => softmax_sums_fma::<1>(sums, new_max, e),
                2 => softmax_sums_fma::<2>(sums, new_max, e),
                3 => softmax_sums_fma::<3>(sums, new_max, e),
                _ => softmax_sums_fma::<4>(sums, new_max, e),
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn softmax_sums_fma<const H: usize>(sums: &mut [f32], new_max: &[bool], e: &[f32]) {
    // SAFETY: value-only intrinsics.
    unsafe {
        let len = e.len() / H;
        let rows: [(&[bool], &[f32]); H] = core::array::from_fn(|h| (&new_max[h * len..(h + 1) * len], &e[h * len..(h + 1) * len]));
        let mut s: [__m128; H] = core::array::from_fn(|h| _mm_set_ss(sums[h]));
        for c in 0..len {
            for (s, (nm, e)) in s.iter_mut().zip(&rows) {
                let (ms, vs) = if nm[c] { (e[c], 1.0) } else { (1.0, e[c]) };
                *s = _mm_fmadd_ss(*s, _mm_set_ss(ms), _mm_set_ss(vs));
            }
        }
        for (sum, s) in sums.iter_mut().zip(s) {
            *sum = _mm_cvtss_f32(s);
        }
    }
}

/// Whether [`dot_keys_heads`] takes rows of `n` (the same rows with or without AVX-512).
pub(crate) fn dot_keys_heads_fits(n: usize, _avx512: bool) -> bool {
    n == DOT_STEP || n == 2 * DOT_STEP || n == 4 * DOT_STEP
}

/// [`dot_keys`] for the heads of a GQA group at once (`qs`: `heads` rows of `n`, `out`:
/// `heads` rows of `offs.len()`), rows of 64, 128 and 256 (AVX-512 where `avx512`, the
/// caller's `Kernels` flag, set only after `cpu_has_avx512()`, else AVX2; see
/// [`dot_keys_heads_fits`]): each key row is loaded and converted once for all heads;
/// every dot is `dot_avx2`'s 64-element steps (`fma(k, q, acc)` per vector, the same sum
/// tree), so each output has the one-key dot's bits.
pub(crate) fn dot_keys_heads(k: &[f16], offs: &[usize], qs: &[f16], n: usize, heads: usize, out: &mut [f32], avx512: bool) {
    let len = offs.len();
    assert!(dot_keys_heads_fits(n, avx512) && (1..=4).contains(&heads), "dot_keys_heads: {heads} heads of {n}");
    assert!(qs.len() >= heads * n && out.len() >= heads * len, "dot_keys_heads: short arrays");
    assert!(rows_fit(offs, n, k.len()), "dot_keys_heads: key out of bounds");
    let mut qf = [0.0f32; 4 * 4 * DOT_STEP];
    to_f32(&qs[..heads * n], &mut qf[..heads * n]);
    let (kp, qp) = (k.as_ptr().cast(), qf.as_ptr());
    // SAFETY: AVX2/FMA/F16C present (module contract), AVX-512 F where `avx512` (the
    // caller's flag); every key's n elements lie in k, qf holds heads rows of n and out
    // heads rows of len (checked above).
    unsafe {
        match (avx512, n / DOT_STEP, heads) {
            (false, 1, _) => dot_keys_heads64_avx2(kp, offs, &qf, heads, out),
            (false, 2, 1) => dot_keys_heads_avx2::<1, 2>(kp, offs, qp, out),
            (false, 2, 2) => dot_keys_heads_avx2::<2, 2>(kp, offs, qp, out),
            (false, 2, 3) => dot_keys_heads_avx2::<3, 2>(kp, offs, qp, out),
            (false, 2, _) => dot_keys_heads_avx2::<4, 2>(kp, offs, qp, out),
            (false, _, 1) => dot_keys_heads_avx2::<1, 4>(kp, offs, qp, out),
            (false, _, 2) => dot_keys_heads_avx2::<2, 4>(kp, offs, qp, out),
            (false, _, 3) => dot_keys_heads_avx2::<3, 4>(kp, offs, qp, out),
            (false, _, _) => dot_keys_heads_avx2::<4, 4>(kp, offs, qp, out),
            (true, 1, 1) => dot_keys_heads_avx512::<1, 1>(kp, offs, qp, out),
            (true, 1, 2) => dot_keys_heads_avx512::<2, 1>(kp, offs, qp, out),
            (true, 1, 3) => dot_keys_heads_avx512::<3, 1>(kp, offs, qp, out),
            (true, 1, _) => dot_keys_heads_avx512::<4, 1>(kp, offs, qp, out),
            (true, 2, 1) => dot_keys_heads_avx512::<1, 2>(kp, offs, qp, out),
            (true, 2, 2) => dot_keys_heads_avx512::<2, 2>(kp, offs, qp, out),
            (true, 2, 3) => dot_keys_heads_avx512::<3, 2>(kp, offs, qp, out),
            (true, 2, _) => dot_keys_heads_avx512::<4, 2>(kp, offs, qp, out),
            (true, _, 1) => dot_keys_heads_avx512::<1, 4>(kp, offs, qp, out),
            (true, _, 2) => dot_keys_heads_avx512::<2, 4>(kp, offs, qp, out),
            (true, _, 3) => dot_keys_heads_avx512::<3, 4>(kp, offs, qp, out),
            (true, _, _) => dot_keys_heads_avx512::<4, 4>(kp, offs, qp, out),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_keys_heads64_avx2(k: *const u16, offs: &[usize], qf: &[f32], heads: usize, out: &mut [f32]) {
    // SAFETY: as dot_keys_heads (rows of 64).
    unsafe {
        let len = offs.len();
        for (c, &off) in offs.iter().enumerate() {
            let kp = k.add(off);
            let kv: [__m256; 8] = core::array::from_fn(|j| _mm256_cvtph_ps(_mm_loadu_si128(kp.add(8 * j).cast())));
            for h in 0..heads {
                let q = qf.as_ptr().add(h * DOT_STEP);
                let qv = |j: usize| _mm256_loadu_ps(q.add(8 * j));
                // `p_a + p_b` of the products `p = fma(k, q, +0)` as `fma(k_a, q_a, p_b)`:
                // one rounding of an exact product plus p_b either way (see
                // `dot_keys_queries_avx512`).
                let p = |j: usize| _mm256_fmadd_ps(kv[j], qv(j), _mm256_setzero_ps());
                let pair = |a: usize, b: usize| _mm256_fmadd_ps(kv[a], qv(a), p(b));
                let lo = _mm256_add_ps(pair(0, 4), pair(2, 6));
                let hi = _mm256_add_ps(pair(1, 5), pair(3, 7));
                out[h * len + c] = hsum_ps(_mm256_add_ps(hi, lo));
            }
        }
    }
}

/// [`dot_keys_heads`] on AVX2 for `H` heads and rows of `64·S` (S = 2, 4: Gemma 3's 256
/// among them): per key, the `S` key vectors of each of `dot_avx2`'s eight accumulators
/// converted once, then each head's accumulator `fma(k, q, acc)` through the steps from
/// +0 (queries converted to f32 once per chunk, exactly); then `dot_avx2`'s sum tree per
/// head. The same operations on the same values as `dot_avx2` per head and key: its bits,
/// with a key row converted once instead of once per head and the queries never again.
///
/// # Safety
/// AVX2/FMA/F16C present; `64·S` elements at `k + offs[c]` for every c, `H` rows of
/// `64·S` at `qf`, `out` holds `H` rows of `offs.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_keys_heads_avx2<const H: usize, const S: usize>(k: *const u16, offs: &[usize], qf: *const f32, out: &mut [f32]) {
    // SAFETY: as dot_keys_heads (the caller's checks); unaligned loads only.
    unsafe {
        let (len, n) = (offs.len(), S * DOT_STEP);
        let zero = _mm256_setzero_ps();
        for (c, &off) in offs.iter().enumerate() {
            let kp = k.add(off);
            // Accumulator j of head h: elements 64·s + 8j.. of every step s.
            let acc = |j: usize| -> [__m256; H] {
                let kv: [__m256; S] = core::array::from_fn(|s| _mm256_cvtph_ps(_mm_loadu_si128(kp.add(DOT_STEP * s + 8 * j).cast())));
                core::array::from_fn(|h| {
                    let qp = qf.add(h * n + 8 * j);
                    kv.iter().enumerate().fold(zero, |a, (s, kv)| _mm256_fmadd_ps(*kv, _mm256_loadu_ps(qp.add(DOT_STEP * s)), a))
                })
            };
            // `dot_avx2`'s tree: (0 + 4) + (2 + 6) and (1 + 5) + (3 + 7), then hi + lo.
            let pair = |a: usize, b: usize| -> [__m256; H] {
                let (x, y) = (acc(a), acc(b));
                core::array::from_fn(|h| _mm256_add_ps(x[h], y[h]))
            };
            let (p04, p26) = (pair(0, 4), pair(2, 6));
            let lo: [__m256; H] = core::array::from_fn(|h| _mm256_add_ps(p04[h], p26[h]));
            let (p15, p37) = (pair(1, 5), pair(3, 7));
            for h in 0..H {
                let hi = _mm256_add_ps(p15[h], p37[h]);
                out[h * len + c] = hsum_ps(_mm256_add_ps(hi, lo[h]));
            }
        }
    }
}

/// [`dot_keys_heads64_avx2`] on 512-bit vectors for `H` heads and rows of `64·S`, 16
/// keys at a time: per key its row is converted once, then per head the four 16-lane
/// accumulators `p_j = fma(k, q, p_j)` through the `S` steps and
/// `t = (p0 + p2) + (p1 + p3)` as in `dot_avx2` (kept on the stack); then per head the
/// 16 keys' sum trees run side by side, one level per step, each lane add being one
/// key's add of `hsum_ps` order (8 + 8, 4 + 4, 2 + 2, 1 + 1), so lane `i` of the last
/// vector is key `i`'s dot with the one-key bits. (Lanes past the chunk's end repeat its
/// last key and are not stored.)
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F present; `64·S` elements at `k + offs[c]` for every c,
/// `H` rows of `64·S` at `qf`, `out` holds `H` rows of `offs.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn dot_keys_heads_avx512<const H: usize, const S: usize>(k: *const u16, offs: &[usize], qf: *const f32, out: &mut [f32]) {
    // SAFETY: as dot_keys_heads; `ts` is written at h·16 + c for c < m before any
    // read of it (reads clamp c to m - 1), and the masked store writes the m <= 16
    // outputs out[h·len + g0..][..m], inside out.
    unsafe {
        let (len, n) = (offs.len(), S * DOT_STEP);
        let zero = _mm512_setzero_ps();
        let mut ts = core::mem::MaybeUninit::<[[__m512; 16]; H]>::uninit();
        let tp = ts.as_mut_ptr().cast::<__m512>();
        for g0 in (0..len).step_by(16) {
            let m = (len - g0).min(16);
            for (c, &off) in offs[g0..g0 + m].iter().enumerate() {
                let kv: [[__m512; 4]; S] = core::array::from_fn(|s| core::array::from_fn(|j| _mm512_cvtph_ps(_mm256_loadu_si256(k.add(off + DOT_STEP * s + 16 * j).cast()))));
                for h in 0..H {
                    let qp = qf.add(h * n);
                    if S == 1 {
                        // One step: `p_a + p_b` of the products `p = fma(k, q, +0)` as
                        // `fma(k_a, q_a, p_b)` (see `dot_keys_queries_avx512`).
                        let qv = |j: usize| _mm512_loadu_ps(qp.add(16 * j));
                        let pair = |a: usize, b: usize| _mm512_fmadd_ps(kv[0][a], qv(a), _mm512_fmadd_ps(kv[0][b], qv(b), zero));
                        tp.add(h * 16 + c).write(_mm512_add_ps(pair(0, 2), pair(1, 3)));
                        continue;
                    }
                    // The four 16-lane accumulators through the S steps, as `dot_avx2`.
                    let mut p = [zero; 4];
                    for (st, kv) in kv.iter().enumerate() {
                        for (j, p) in p.iter_mut().enumerate() {
                            *p = _mm512_fmadd_ps(kv[j], _mm512_loadu_ps(qp.add(DOT_STEP * st + 16 * j)), *p);
                        }
                    }
                    tp.add(h * 16 + c).write(_mm512_add_ps(_mm512_add_ps(p[0], p[2]), _mm512_add_ps(p[1], p[3])));
                }
            }
            for h in 0..H {
                let t = |c: usize| tp.add(h * 16 + c.min(m - 1)).read();
                // Keys a and b: [lo 8 + hi 8 of a | of b].
                let l1 = |a: usize, b: usize| {
                    let (ta, tb) = (t(a), t(b));
                    _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(ta, tb), _mm512_shuffle_f32x4::<0xEE>(ta, tb))
                };
                // Keys a, a+4, a+8, a+12: one 128-bit lane each, 4 + 4 added.
                let l2 = |a: usize| {
                    let (m0, m1) = (l1(a, a + 4), l1(a + 8, a + 12));
                    _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(m0, m1), _mm512_shuffle_f32x4::<0xDD>(m0, m1))
                };
                // Lane pairs: 2 + 2 added; 128-bit lane j holds keys 4j + a, 4j + a + 1.
                let l3 = |a: usize| {
                    let (r0, r1) = (_mm512_castps_pd(l2(a)), _mm512_castps_pd(l2(a + 1)));
                    _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(r0, r1)), _mm512_castpd_ps(_mm512_unpackhi_pd(r0, r1)))
                };
                let (a, b) = (l3(0), l3(2));
                let s = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(a, b), _mm512_shuffle_ps::<0xDD>(a, b));
                _mm512_mask_storeu_ps(out.as_mut_ptr().add(h * len + g0), ((1u32 << m) - 1) as u16, s);
            }
        }
    }
}

/// The most keys, queries, heads and row length [`dot_keys_queries`] takes.
const QK_KEYS: usize = 64;
const QK_QUERIES: usize = 32;
const QK_HEADS: usize = 4;
const QK_ROW: usize = 2 * DOT_STEP;

/// [`dot_keys_heads`] for `queries` queries at once (`qs`: `queries·heads` rows of `n`,
/// query-major; `out`: `queries·heads` rows of `offs.len()`), keys in the lanes: the
/// chunk's key rows are converted once and transposed (16 keys × 16 elements at a time)
/// so that one vector holds element `d` of 16 keys; then per (query, head) row each of
/// the dot's 64 lane sums is `fma(k_d, q_d, ·)` over the steps for 16 keys at once,
/// starting from `fma(k, q, 0)` as the one-key dot does, and the sum tree `dot_avx2`
/// uses (`(l + l+32) + (l+16 + l+48)`, then `8+i + i`, `4+i + i`, `(0 + 2) + (1 + 3)`)
/// is 63 vector adds for the 16 keys (rows of 64: the first level's 32 adds fused into
/// the products, see the kernel); each key vector is loaded once for a set of 8 rows
/// (measured: 34% less time than `dot_keys_heads` query by query for 16 queries × 3 heads
/// of 64 over 64 keys, 24% for 2 heads of 128). Every output is the one-key dot's operations on the
/// same values: its bits. `false` (nothing written) unless `n` is 64 or 128, with 1 to 4
/// heads, 1 to 32 queries and 1 to 64 keys (rows of 256, Gemma 3's, measured slower this
/// way than by `dot_keys_heads`: their 16 key vectors per lane index leave too few
/// registers). Only after `cpu_has_avx512()`.
pub(crate) fn dot_keys_queries(k: &[f16], offs: &[usize], qs: &[f16], n: usize, heads: usize, queries: usize, out: &mut [f32]) -> bool {
    let len = offs.len();
    if !matches!(n / DOT_STEP, 1 | 2) || !n.is_multiple_of(DOT_STEP) || !(1..=QK_HEADS).contains(&heads) || !(1..=QK_QUERIES).contains(&queries) || !(1..=QK_KEYS).contains(&len) {
        return false;
    }
    assert!(qs.len() >= queries * heads * n && out.len() >= queries * heads * len, "dot_keys_queries: short arrays");
    assert!(rows_fit(offs, n, k.len()), "dot_keys_queries: key out of bounds");
    let (kp, qp, op) = (k.as_ptr().cast::<u16>(), qs.as_ptr().cast::<u16>(), out.as_mut_ptr());
    // SAFETY: AVX2/FMA/F16C present (module contract) and AVX-512 F (the table hands this
    // out only after cpu_has_avx512()); every key's n elements lie in k, qs holds
    // queries·heads rows of n and out queries·heads rows of len (checked above).
    unsafe {
        match n / DOT_STEP {
            1 => dot_keys_queries_avx512::<1>(kp, offs, qp, heads, queries, op),
            _ => dot_keys_queries_avx512::<2>(kp, offs, qp, heads, queries, op),
        }
    }
    true
}

/// 16 rows of 16 f32 transposed: lane `i` of output `d` is lane `d` of row `i`
/// (`vunpck{l,h}ps`, `vunpck{l,h}pd`, then two rounds of `vshuff32x4`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn transpose_16x16(r: &[__m512; 16]) -> [__m512; 16] {
    // SAFETY: value-only intrinsics (AVX-512 F present: caller).
    unsafe {
        // Rows 2p, 2p+1 interleaved: per 128-bit lane L, elements 4L, 4L+1 (lo), 4L+2, 4L+3 (hi).
        let lo: [__m512; 8] = core::array::from_fn(|p| _mm512_unpacklo_ps(r[2 * p], r[2 * p + 1]));
        let hi: [__m512; 8] = core::array::from_fn(|p| _mm512_unpackhi_ps(r[2 * p], r[2 * p + 1]));
        let pd = _mm512_castps_pd;
        // u[q][c]: per 128-bit lane L, element 4L + c of rows 4q..4q+3.
        let u: [[__m512; 4]; 4] = core::array::from_fn(|q| {
            let (a, b, c, d) = (pd(lo[2 * q]), pd(lo[2 * q + 1]), pd(hi[2 * q]), pd(hi[2 * q + 1]));
            let ps = _mm512_castpd_ps;
            [ps(_mm512_unpacklo_pd(a, b)), ps(_mm512_unpackhi_pd(a, b)), ps(_mm512_unpacklo_pd(c, d)), ps(_mm512_unpackhi_pd(c, d))]
        });
        let mut t = [_mm512_setzero_ps(); 16];
        for c in 0..4 {
            // [rows 0-3 of c, of c+8, rows 4-7 of c, of c+8] and the same with c+4, c+12.
            let (v0, v1) = (_mm512_shuffle_f32x4::<0x88>(u[0][c], u[1][c]), _mm512_shuffle_f32x4::<0xDD>(u[0][c], u[1][c]));
            let (v2, v3) = (_mm512_shuffle_f32x4::<0x88>(u[2][c], u[3][c]), _mm512_shuffle_f32x4::<0xDD>(u[2][c], u[3][c]));
            t[c] = _mm512_shuffle_f32x4::<0x88>(v0, v2);
            t[c + 8] = _mm512_shuffle_f32x4::<0xDD>(v0, v2);
            t[c + 4] = _mm512_shuffle_f32x4::<0x88>(v1, v3);
            t[c + 12] = _mm512_shuffle_f32x4::<0xDD>(v1, v3);
        }
        t
    }
}

/// The keys at `offs` (1 to 64 rows of `n`, a multiple of 16) converted and transposed:
/// element d of key c at `kt[d·QK_KEYS + c]`, for c up to the next multiple of 16 (keys
/// past the last repeat it).
///
/// # Safety
/// AVX-512 F present; `n` elements at `k + offs[c]` for every c, `n·QK_KEYS` f32 writable
/// at `kt`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn transpose_keys(k: *const u16, offs: &[usize], n: usize, kt: *mut f32) {
    // SAFETY: the caller's contract; unaligned loads and stores only.
    unsafe {
        let len = offs.len();
        for g in 0..len.div_ceil(16) {
            for d0 in (0..n).step_by(16) {
                let rows: [__m512; 16] = core::array::from_fn(|i| _mm512_cvtph_ps(_mm256_loadu_si256(k.add(offs[(16 * g + i).min(len - 1)] + d0).cast())));
                for (d, v) in transpose_16x16(&rows).iter().enumerate() {
                    _mm512_storeu_ps(kt.add((d0 + d) * QK_KEYS + 16 * g), *v);
                }
            }
        }
    }
}

/// Rows of 64 at `offs` (1 to 64 keys) for [`dot_transposed64`] and
/// [`mad_keys_heads64_f32_dot`]: converted to f32 and transposed into `kt` (at least
/// `64·64`: element d of key c at `kt[64·d + c]`). `false` (nothing written) for other
/// shapes. Only after `cpu_has_avx512()`.
pub(crate) fn keys_transposed64(k: &[f16], offs: &[usize], n: usize, kt: &mut [f32]) -> bool {
    if n != DOT_STEP || !(1..=QK_KEYS).contains(&offs.len()) {
        return false;
    }
    assert!(kt.len() >= DOT_STEP * QK_KEYS && rows_fit(offs, n, k.len()), "keys_transposed64: short arrays");
    // SAFETY: AVX-512 F (the table hands this out only after cpu_has_avx512()); every
    // key's 64 elements lie in k, kt holds 64·64 (checked above).
    unsafe { transpose_keys(k.as_ptr().cast(), offs, n, kt.as_mut_ptr()) };
    true
}

/// The scores of one query's `heads` rows of 64 (`qs`, f16) against `keys` transposed
/// keys (`kt` from [`keys_transposed64`]) into `out` (`heads` rows of `keys`): each the
/// bits of `dot_keys_heads` (the operations of [`dot_keys_queries`]' rows of 64, in
/// [`dot64_unit`]s). `false` (nothing written) unless 1 to 4 heads and 1 to 64 keys.
pub(crate) fn dot_transposed64(kt: &[f32], keys: usize, qs: &[f16], heads: usize, out: &mut [f32]) -> bool {
    if !(1..=QK_HEADS).contains(&heads) || !(1..=QK_KEYS).contains(&keys) {
        return false;
    }
    assert!(kt.len() >= DOT_STEP * QK_KEYS && qs.len() >= heads * DOT_STEP && out.len() >= heads * keys, "dot_transposed64: short arrays");
    let (kp, qp, op) = (kt.as_ptr(), qs.as_ptr().cast::<u16>(), out.as_mut_ptr());
    // SAFETY: AVX-512 F (table built after cpu_has_avx512()); lengths checked above.
    unsafe {
        match heads {
            1 => dot_transposed64_avx512::<1>(kp, keys, qp, op),
            2 => dot_transposed64_avx512::<2>(kp, keys, qp, op),
            3 => dot_transposed64_avx512::<3>(kp, keys, qp, op),
            _ => dot_transposed64_avx512::<4>(kp, keys, qp, op),
        }
    }
    true
}

/// [`dot_transposed64`] for `H` heads.
///
/// # Safety
/// AVX-512 F present; as [`DotNext::new`].
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn dot_transposed64_avx512<const H: usize>(kt: *const f32, keys: usize, qs: *const u16, out: *mut f32) {
    // SAFETY: the caller's contract.
    unsafe {
        let mut d = DotNext::<H>::new(kt, keys, qs, out);
        while d.step() {}
    }
}

/// The 64-wide dot's first level for one lane index of 16 keys: `kv` the keys' elements
/// `i, 32+i, 16+i, 48+i` (the order the level adds them), `q` the query's f32 row:
/// `fma(k_i, q_i, fma(k_{32+i}, q_{32+i}, 0)) + fma(k_{16+i}, q_{16+i}, fma(k_{48+i},
/// q_{48+i}, 0))` (why the fused form gives the dot's bits: `dot_keys_queries_avx512`).
/// Always inlined, into callers with AVX-512 F (no closures).
///
/// # Safety
/// AVX-512 F present; 64 f32 at `q`.
#[inline(always)]
unsafe fn dot64_level1(kv: &[__m512; 4], q: *const f32, i: usize) -> __m512 {
    // SAFETY: the caller's contract (i < 16: every index below 64).
    unsafe {
        let zero = _mm512_setzero_ps();
        let s01 = _mm512_fmadd_ps(kv[0], _mm512_set1_ps(*q.add(i)), _mm512_fmadd_ps(kv[1], _mm512_set1_ps(*q.add(32 + i)), zero));
        let s23 = _mm512_fmadd_ps(kv[2], _mm512_set1_ps(*q.add(16 + i)), _mm512_fmadd_ps(kv[3], _mm512_set1_ps(*q.add(48 + i)), zero));
        _mm512_add_ps(s01, s23)
    }
}

/// The rest of the dot's sum tree over the 16 first-level sums `s` of 16 keys (`8+i + i`,
/// `4+i + i`, `(0 + 2) + (1 + 3)`): the 16 keys' dots. Always inlined (as
/// [`dot64_level1`]).
///
/// # Safety
/// AVX-512 F present.
#[inline(always)]
unsafe fn dot_tree16(s: &[__m512; 16]) -> __m512 {
    // SAFETY: value-only intrinsics (the caller's AVX-512 F).
    unsafe {
        let mut r8 = [_mm512_setzero_ps(); 8];
        for (i, r) in r8.iter_mut().enumerate() {
            *r = _mm512_add_ps(s[8 + i], s[i]);
        }
        let mut r4 = [_mm512_setzero_ps(); 4];
        for (i, r) in r4.iter_mut().enumerate() {
            *r = _mm512_add_ps(r8[4 + i], r8[i]);
        }
        _mm512_add_ps(_mm512_add_ps(r4[0], r4[2]), _mm512_add_ps(r4[1], r4[3]))
    }
}

/// `a + b` on the FMA pipes: `fma(b, 1, a)`, the same bits (the product by one is exact,
/// the sum rounded once, and `+` commutes), in inline assembly so that the compiler does
/// not fold it back into an add: on AMD Zen 4 the adders' pipes are the f16 conversions'
/// (`quant::bench::bench_f16_round_trip_ports`), the FMA pipes idle beside the value
/// update. `one` holds 1.0 in every lane.
///
/// # Safety
/// AVX-512 F present.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn add_on_fma(a: __m512, b: __m512, one: __m512) -> __m512 {
    let mut r = a;
    // SAFETY: register-only arithmetic (the caller's AVX-512 F).
    unsafe { core::arch::asm!("vfmadd231ps {r}, {b}, {one}", r = inout(zmm_reg) r, b = in(zmm_reg) b, one = in(zmm_reg) one, options(pure, nomem, nostack, preserves_flags)) };
    r
}

/// [`dot64_level1`] with the query's values by embedded broadcast (no broadcast
/// operations) and the level's add on the FMA pipes ([`add_on_fma`]): the same operations
/// on the same values, so the same bits.
///
/// # Safety
/// AVX-512 F present; 64 f32 at `q` (i < 16).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn dot64_level1_fma(kv: &[__m512; 4], q: *const f32, i: usize, one: __m512) -> __m512 {
    let s: __m512;
    // SAFETY: reads of q[i], q[16 + i], q[32 + i], q[48 + i] (the caller's contract), the
    // rest register arithmetic.
    unsafe {
        core::arch::asm!(
            "vpxord {a}, {a}, {a}",
            "vfmadd231ps {a}, {k1}, dword ptr [{p} + 128]{{1to16}}",
            "vfmadd231ps {a}, {k0}, dword ptr [{p}]{{1to16}}",
            "vpxord {b}, {b}, {b}",
            "vfmadd231ps {b}, {k3}, dword ptr [{p} + 192]{{1to16}}",
            "vfmadd231ps {b}, {k2}, dword ptr [{p} + 64]{{1to16}}",
            "vfmadd231ps {a}, {b}, {one}",
            a = out(zmm_reg) s, b = out(zmm_reg) _,
            k0 = in(zmm_reg) kv[0], k1 = in(zmm_reg) kv[1], k2 = in(zmm_reg) kv[2], k3 = in(zmm_reg) kv[3],
            p = in(reg) q.add(i), one = in(zmm_reg) one,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    s
}

/// [`dot_tree16`] with every add on the FMA pipes ([`add_on_fma`]): the same bits.
///
/// # Safety
/// AVX-512 F present.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn dot_tree16_fma(s: &[__m512; 16], one: __m512) -> __m512 {
    // SAFETY: register arithmetic (the caller's AVX-512 F).
    unsafe {
        let r8: [__m512; 8] = core::array::from_fn(|i| add_on_fma(s[8 + i], s[i], one));
        let r4: [__m512; 4] = core::array::from_fn(|i| add_on_fma(r8[4 + i], r8[i], one));
        add_on_fma(add_on_fma(r4[0], r4[2], one), add_on_fma(r4[1], r4[3], one), one)
    }
}

/// One query's scores against a chunk's transposed keys, computed a unit at a time
/// (so that [`mad_keys_heads64_avx512`] can interleave them with its value updates):
/// unit `u` is lane index `i = u % 16` of key group `g = u / 16` — for each head row the
/// tree's first level `fma(k_i, q_i, fma(k_{32+i}, q_{32+i}, 0)) + fma(k_{16+i},
/// q_{16+i}, fma(k_{48+i}, q_{48+i}, 0))` over 16 keys ([`dot_keys_queries_avx512`]'s
/// fused steps), and after lane index 15 the rest of the tree (`8+i + i`, `4+i + i`,
/// `(0 + 2) + (1 + 3)`) and the group's 16 scores stored. The same operations as
/// [`dot_keys_queries`] on the same values: its bits. Its multiplies take the query's
/// values by embedded broadcast and its adds run as fmas by one ([`dot64_level1_fma`],
/// [`dot_tree16_fma`]): beside the update, whose f16 conversions share the adders' pipes
/// on AMD Zen 4, that made the fused kernel ~8% faster (`quant::bench::bench_fused_update`)
/// and SmolLM2 Q4_0's pp512 at depth 4096 ~5% (BENCHMARKS.md).
struct DotNext<const H: usize> {
    kt: *const f32,
    keys: usize,
    units: usize,
    u: usize,
    out: *mut f32,
    /// The query's rows as f32.
    q: [[f32; DOT_STEP]; H],
    /// The current group's first-level sums per head (lane index i written by unit i
    /// before the group's last unit reads them all: not initialized, as `new` runs once
    /// per query and chunk).
    s16: core::mem::MaybeUninit<[[__m512; 16]; H]>,
}

impl<const H: usize> DotNext<H> {
    /// # Safety
    /// AVX-512 F present; `kt`: 64 rows of [`QK_KEYS`] f32 written for every key up to
    /// the next multiple of 16 past `keys` (1 to 64); `H` rows of 64 f16 at `qs`; `H`
    /// rows of `keys` f32 writable at `out`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn new(kt: *const f32, keys: usize, qs: *const u16, out: *mut f32) -> Self {
        // SAFETY: the caller's contract; unaligned loads only.
        unsafe {
            let mut q = [[0.0f32; DOT_STEP]; H];
            for (h, row) in q.iter_mut().enumerate() {
                for i in (0..DOT_STEP).step_by(16) {
                    _mm512_storeu_ps(row.as_mut_ptr().add(i), _mm512_cvtph_ps(_mm256_loadu_si256(qs.add(h * DOT_STEP + i).cast())));
                }
            }
            Self { kt, keys, units: 16 * keys.div_ceil(16), u: 0, out, q, s16: core::mem::MaybeUninit::uninit() }
        }
    }

    /// Computes the next unit; `false` once every unit is done (nothing computed).
    /// Always inlined, into callers with AVX-512 F (a call would spill the caller's
    /// accumulators: every vector register is caller-saved), and without closures
    /// (which would not inherit the caller's features).
    ///
    /// # Safety
    /// AVX-512 F present; `new`'s contract.
    #[inline(always)]
    unsafe fn step(&mut self) -> bool {
        if self.u == self.units {
            return false;
        }
        // SAFETY: `new`'s contract: g < keys.div_ceil(16), so every key vector read is
        // written; the masked store writes out[h·keys + 16g..][..m], m <= keys - 16g.
        unsafe {
            let (g, i) = (self.u / 16, self.u % 16);
            let kg = self.kt.add(16 * g);
            let s16 = self.s16.as_mut_ptr().cast::<[__m512; 16]>();
            let kv = [_mm512_loadu_ps(kg.add(i * QK_KEYS)), _mm512_loadu_ps(kg.add((32 + i) * QK_KEYS)), _mm512_loadu_ps(kg.add((16 + i) * QK_KEYS)), _mm512_loadu_ps(kg.add((48 + i) * QK_KEYS))];
            let one = _mm512_set1_ps(1.0);
            for h in 0..H {
                (*s16.add(h))[i] = dot64_level1_fma(&kv, self.q[h].as_ptr(), i, one);
            }
            if i == 15 {
                let m = (self.keys - 16 * g).min(16);
                for h in 0..H {
                    _mm512_mask_storeu_ps(self.out.add(h * self.keys + 16 * g), ((1u32 << m) - 1) as u16, dot_tree16_fma(&*s16.add(h), one));
                }
            }
            self.u += 1;
            true
        }
    }
}

/// [`dot_keys_queries`] for rows of `64·S`.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F present; `64·S` elements at `k + offs[c]` for every c,
/// `1..=64` keys; `queries·heads` rows of `64·S` at `qs` and of `offs.len()` at `out`,
/// `heads <= 4`, `queries <= 32`.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn dot_keys_queries_avx512<const S: usize>(k: *const u16, offs: &[usize], qs: *const u16, heads: usize, queries: usize, out: *mut f32) {
    // SAFETY: as above. `kt` is written for rows d < n and columns < 16·groups (keys past
    // the end repeat the last key) before any read of them, `qf` for a set's cs·n
    // elements and `s16` for its cs rows before they are read; the masked stores write
    // out[row·len + 16g..][..m], m <= len - 16g.
    unsafe {
        let (len, n) = (offs.len(), S * DOT_STEP);
        let groups = len.div_ceil(16);
        // The keys transposed: kt[d·QK_KEYS + c] is element d of key c.
        let mut kt_mem = core::mem::MaybeUninit::<[f32; QK_ROW * QK_KEYS]>::uninit();
        let kt = kt_mem.as_mut_ptr().cast::<f32>();
        transpose_keys(k, offs, n, kt);
        // Per set of up to COMBOS (query, head) rows: their q as f32, then per group of
        // 16 keys and per lane index i the four lane sums i, 32+i, 16+i, 48+i (each key
        // vector loaded once for the whole set) added as the tree's first level into
        // `s16[c][i]`; then each row's remaining 15 adds.
        const COMBOS: usize = 8;
        let zero = _mm512_setzero_ps();
        let rows = queries * heads;
        let mut qf_mem = core::mem::MaybeUninit::<[f32; COMBOS * QK_ROW]>::uninit();
        let qf = qf_mem.as_mut_ptr().cast::<f32>();
        let mut s16_mem = core::mem::MaybeUninit::<[[__m512; 16]; COMBOS]>::uninit();
        let s16 = s16_mem.as_mut_ptr().cast::<[__m512; 16]>();
        for c0 in (0..rows).step_by(COMBOS) {
            let cs = (rows - c0).min(COMBOS);
            for i in (0..cs * n).step_by(16) {
                _mm512_storeu_ps(qf.add(i), _mm512_cvtph_ps(_mm256_loadu_si256(qs.add(c0 * n + i).cast())));
            }
            for g in 0..groups {
                let kg = kt.add(16 * g);
                for i in 0..16 {
                    // The dot's lanes i, 32+i, 16+i, 48+i (the order the first level adds them).
                    let lanes = [i, 32 + i, 16 + i, 48 + i];
                    let kv: [[__m512; 4]; S] = core::array::from_fn(|st| core::array::from_fn(|t| _mm512_loadu_ps(kg.add((DOT_STEP * st + lanes[t]) * QK_KEYS))));
                    for c in 0..cs {
                        let q = qf.add(c * n);
                        if S == 1 {
                            // One step: each lane sum `fma(k, q, +0)` is the product
                            // k·q of two f16 values, exact in f32 (22 significant bits,
                            // magnitudes 2^-48 to 2^32) but for a -0 product made +0, so
                            // `a0 + a1` rounds `k0·q0 + a1` once, as `fma(k0, q0, a1)`
                            // does (a -0 product k0·q0 added to a1 gives a1 or +0, as
                            // a0 = +0 does): the same bits, 5 operations per lane index
                            // instead of 7 ([`dot64_level1`]).
                            (*s16.add(c))[i] = dot64_level1(&kv[0], q, i);
                            continue;
                        }
                        let a: [__m512; 4] = core::array::from_fn(|t| {
                            let mut a = zero;
                            for (st, kv) in kv.iter().enumerate() {
                                a = _mm512_fmadd_ps(kv[t], _mm512_set1_ps(*q.add(DOT_STEP * st + lanes[t])), a);
                            }
                            a
                        });
                        (*s16.add(c))[i] = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
                    }
                }
                let m = (len - 16 * g).min(16);
                for c in 0..cs {
                    _mm512_mask_storeu_ps(out.add((c0 + c) * len + 16 * g), ((1u32 << m) - 1) as u16, dot_tree16(&*s16.add(c)));
                }
            }
        }
    }
}

/// [`mad_keys`] for the heads of a GQA group at once, rows of 64 (`ys`: `heads` rows,
/// `new_max` and `e`: `heads` rows of `offs.len()`): each value row is converted once
/// for all heads, and the heads' accumulators are independent chains in the inner loop;
/// per head and element the operations of [`mad_keys_regs`] in key order (the same bits).
#[allow(clippy::too_many_arguments)]
pub(crate) fn mad_keys_heads64(ys: &mut [f16], heads: usize, x: &[f16], offs: &[usize], new_max: &[bool], e: &[f32], sums: &mut [f32], avx512: bool, via: bool) {
    let len = offs.len();
    assert!(heads <= 4 && ys.len() >= heads * 64 && new_max.len() >= heads * len && e.len() >= heads * len && sums.len() >= heads, "mad_keys_heads64: short arrays");
    assert!(rows_fit(offs, 64, x.len()), "mad_keys_heads64: value row out of bounds");
    let (yp, xp) = (ys.as_mut_ptr().cast::<u16>(), x.as_ptr().cast::<u16>());
    // SAFETY: AVX2/FMA/F16C present (module contract), AVX-512 F where `avx512` (the
    // caller's `Kernels` flag, set only after cpu_has_avx512()); ys holds heads rows of
    // 64, every value row's 64 elements lie in x (checked above).
    unsafe {
        match (avx512, heads) {
            (true, 1) if via => mad_keys_heads64_avx512::<1, false, true, false>(yp, xp, offs, core::ptr::null(), offs.len(), new_max, e, sums, core::ptr::null_mut()),
            (true, 1) => mad_keys_heads64_avx512::<1, false, false, false>(yp, xp, offs, core::ptr::null(), offs.len(), new_max, e, sums, core::ptr::null_mut()),
            (true, 2) if via => mad_keys_heads64_avx512::<2, false, true, false>(yp, xp, offs, core::ptr::null(), offs.len(), new_max, e, sums, core::ptr::null_mut()),
            (true, 2) => mad_keys_heads64_avx512::<2, false, false, false>(yp, xp, offs, core::ptr::null(), offs.len(), new_max, e, sums, core::ptr::null_mut()),
            (true, 3) if via => mad_keys_heads64_avx512::<3, false, true, false>(yp, xp, offs, core::ptr::null(), offs.len(), new_max, e, sums, core::ptr::null_mut()),
            (true, 3) => mad_keys_heads64_avx512::<3, false, false, false>(yp, xp, offs, core::ptr::null(), offs.len(), new_max, e, sums, core::ptr::null_mut()),
            (true, 4) if via => mad_keys_heads64_avx512::<4, false, true, false>(yp, xp, offs, core::ptr::null(), offs.len(), new_max, e, sums, core::ptr::null_mut()),
            (true, 4) => mad_keys_heads64_avx512::<4, false, false, false>(yp, xp, offs, core::ptr::null(), offs.len(), new_max, e, sums, core::ptr::null_mut()),
            (_, 1) => mad_keys_heads64_avx2::<1>(yp, xp, offs, new_max, e, sums),
            (_, 2) => mad_keys_heads64_avx2::<2>(yp, xp, offs, new_max, e, sums),
            (_, 3) => mad_keys_heads64_avx2::<3>(yp, xp, offs, new_max, e, sums),
            _ => mad_keys_heads64_avx2::<4>(yp, xp, offs, new_max, e, sums),
        }
    }
}

/// [`mad_keys_heads64`] over value rows already in f32 (`xf`: row c's 64 elements at
/// `64·c`, each an f16 value converted exactly; `xf.len() / 64` keys), AVX-512 only: the
/// same operations on the same values, so the same bits. A block of queries converts a
/// chunk's value rows once for all of them (`attention::attend_block`).
pub(crate) fn mad_keys_heads64_f32(ys: &mut [f16], heads: usize, xf: &[f32], new_max: &[bool], e: &[f32], sums: &mut [f32], via: bool) {
    let len = xf.len() / 64;
    assert!((1..=4).contains(&heads) && ys.len() >= heads * 64 && new_max.len() >= heads * len && e.len() >= heads * len && sums.len() >= heads, "mad_keys_heads64_f32: short arrays");
    let (yp, xp) = (ys.as_mut_ptr().cast::<u16>(), xf.as_ptr());
    let nul = core::ptr::null();
    // SAFETY: AVX-512 F present (this entry is only in tables built after
    // cpu_has_avx512()); ys holds heads rows of 64, xf holds len rows of 64.
    unsafe {
        match (heads, via) {
            (1, true) => mad_keys_heads64_avx512::<1, true, true, false>(yp, nul, &[], xp, len, new_max, e, sums, core::ptr::null_mut()),
            (2, true) => mad_keys_heads64_avx512::<2, true, true, false>(yp, nul, &[], xp, len, new_max, e, sums, core::ptr::null_mut()),
            (3, true) => mad_keys_heads64_avx512::<3, true, true, false>(yp, nul, &[], xp, len, new_max, e, sums, core::ptr::null_mut()),
            (_, true) => mad_keys_heads64_avx512::<4, true, true, false>(yp, nul, &[], xp, len, new_max, e, sums, core::ptr::null_mut()),
            (1, false) => mad_keys_heads64_avx512::<1, true, false, false>(yp, nul, &[], xp, len, new_max, e, sums, core::ptr::null_mut()),
            (2, false) => mad_keys_heads64_avx512::<2, true, false, false>(yp, nul, &[], xp, len, new_max, e, sums, core::ptr::null_mut()),
            (3, false) => mad_keys_heads64_avx512::<3, true, false, false>(yp, nul, &[], xp, len, new_max, e, sums, core::ptr::null_mut()),
            (_, false) => mad_keys_heads64_avx512::<4, true, false, false>(yp, nul, &[], xp, len, new_max, e, sums, core::ptr::null_mut()),
        }
    }
}

/// [`mad_keys_heads64_f32`] that also computes the next query's scores: `heads` rows of
/// 64 (`qs`, f16) against `keys` transposed keys (`kt`, [`keys_transposed64`]) into `out`
/// (`heads` rows of `keys`), a unit per key of the update ([`DotNext`]; the rest after
/// it). The update is bound by its f16 conversions and leaves the FMA units mostly idle;
/// the dot's multiplies (and its adds, as fmas by one) fill them (a block of queries' prompt at depth, where the
/// update and the dot take most of the time). The same bits as the two apart. `false`
/// (nothing written) unless 1 to 4 heads and 1 to 64 keys. The f16 rounding by the
/// register round trip (the tables offer this only off Intel, see `x86::build`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn mad_keys_heads64_f32_dot(ys: &mut [f16], heads: usize, xf: &[f32], new_max: &[bool], e: &[f32], sums: &mut [f32], kt: &[f32], keys: usize, qs: &[f16], out: &mut [f32]) -> bool {
    let len = xf.len() / 64;
    if !(1..=QK_HEADS).contains(&heads) || !(1..=QK_KEYS).contains(&keys) {
        return false;
    }
    assert!(ys.len() >= heads * 64 && new_max.len() >= heads * len && e.len() >= heads * len && sums.len() >= heads, "mad_keys_heads64_f32_dot: short arrays");
    assert!(kt.len() >= DOT_STEP * QK_KEYS && qs.len() >= heads * DOT_STEP && out.len() >= heads * keys, "mad_keys_heads64_f32_dot: short dot arrays");
    let (yp, xp, nul) = (ys.as_mut_ptr().cast::<u16>(), xf.as_ptr(), core::ptr::null());
    let (kp, qp, op) = (kt.as_ptr(), qs.as_ptr().cast::<u16>(), out.as_mut_ptr());
    // SAFETY: AVX-512 F present (table built after cpu_has_avx512()); ys holds heads rows
    // of 64, xf len rows of 64; the dot's arrays as DotNext::new asks (checked above).
    unsafe {
        macro_rules! go {
            ($h:literal) => {{
                let mut d = DotNext::<$h>::new(kp, keys, qp, op);
                mad_keys_heads64_avx512::<$h, true, false, true>(yp, nul, &[], xp, len, new_max, e, sums, &mut d);
            }};
        }
        match heads {
            1 => go!(1),
            2 => go!(2),
            3 => go!(3),
            _ => go!(4),
        }
    }
    true
}

/// [`mad_keys_heads64_avx2`] on 512-bit vectors for `H` heads: each head's row in four
/// registers through the whole chunk (as f32 holding f16 values exactly), the same
/// per-element steps `f16(f32(y)·e)` and `f16(fma(x, v, y))` in key order (the
/// update's f16 rounding by [`f16_round_to`]: with `VIA` through a stack slot, whose
/// latency hides with 4·H chains side by side and whose widening leaves Intel's shuffle
/// port free; else by the register round trip, faster on AMD Zen 5); each head's
/// running sum `sum = fma(sum, ms, vs)` (`softmax_sum`) beside them, a plain f32 kept in
/// a register (`sum + e` where `ms` = 1: that fma's one rounding of the exact sum).
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F present; `H` rows of 64 at `y`, 64 elements at
/// `x + offs[c]` for every c < `len` = `offs.len()` (with `F32V`: 64 f32 at `xf + 64·c`);
/// `new_max` and `e` hold `H` rows of `len`, `sums` at least `H` elements.
///
/// With `F32V` the value rows are f32 instead (the f16 rows converted before, exactly):
/// row c's 64 elements at `xf + 64·c`, for `c < len` (`x` and `offs` unused); each row is
/// then a plain load rather than a conversion (one operation fewer on the vector ports
/// per 16 elements and key).
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn mad_keys_heads64_avx512<const H: usize, const F32V: bool, const VIA: bool, const DOT: bool>(y: *mut u16, x: *const u16, offs: &[usize], xf: *const f32, len: usize, new_max: &[bool], e: &[f32], sums: &mut [f32], dot: *mut DotNext<H>) {
    // SAFETY: as above (the contract: `new_max` and `e` hold `H` rows of `len`, so their
    // unchecked reads below are in bounds); unaligned loads and stores only.
    unsafe {
        let f16_round = |v: __m512| _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
        let one = _mm512_set1_ps(1.0);
        let mut acc: [[__m512; 4]; H] = core::array::from_fn(|h| core::array::from_fn(|j| _mm512_cvtph_ps(_mm256_loadu_si256(y.add(64 * h + 16 * j).cast()))));
        let mut sum: [f32; H] = core::array::from_fn(|h| sums[h]);
        // One f16 slot per (head, vector) chain for `f16_round_to` (unused without VIA).
        let mut slots = RoundSlots::new();
        for c in 0..len {
            let xv: [__m512; 4] = if F32V {
                core::array::from_fn(|j| _mm512_loadu_ps(xf.add(64 * c + 16 * j)))
            } else {
                let off = *offs.get_unchecked(c);
                core::array::from_fn(|j| cvtph_ps_m512(x.add(off + 16 * j)))
            };
            for (h, a) in acc.iter_mut().enumerate() {
                let (eh, nm) = (*e.get_unchecked(h * len + c), *new_max.get_unchecked(h * len + c));
                let ec = _mm512_set1_ps(eh);
                let vs = if nm {
                    for v in a.iter_mut() {
                        *v = f16_round(_mm512_mul_ps(*v, ec));
                    }
                    sum[h] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(sum[h]), _mm_set_ss(eh), _mm_set_ss(1.0)));
                    one
                } else {
                    // fma(sum, 1, e): the exact sum rounded once, as `+`.
                    sum[h] += eh;
                    ec
                };
                for (j, v) in a.iter_mut().enumerate() {
                    *v = f16_round_to::<VIA>(_mm512_fmadd_ps(xv[j], vs, *v), &mut slots, 4 * h + j);
                }
            }
            if DOT {
                (*dot).step();
            }
        }
        while DOT && (*dot).step() {}
        for (h, a) in acc.iter().enumerate() {
            for (j, v) in a.iter().enumerate() {
                _mm256_storeu_si256(y.add(64 * h + 16 * j).cast(), _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(*v));
            }
            sums[h] = sum[h];
        }
    }
}

/// [`mad_keys_heads64`] on 256-bit vectors for `H` heads (1 to 4, a constant, so every
/// accumulator stays in a register): the row in halves of 32 elements with 2 or 3 heads
/// (8 or 12 chains per key), in quarters of 16 with 4 (8 chains), a whole row with one (8
/// chains), each half or quarter through all keys; per element the steps of
/// [`mad_keys_regs`] in key order; each head's running sum `softmax_sum` beside the first
/// half or quarter (as [`mad_keys_heads64_avx512`] keeps it: a scalar chain under the
/// vector work, instead of a pass of its own).
///
/// # Safety
/// AVX2/FMA/F16C present; `H` rows of 64 at `y`, 64 elements at `x + offs[c]` for every
/// c; `new_max` and `e` hold `H` rows of `offs.len()`, `sums` at least `H` elements.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mad_keys_heads64_avx2<const H: usize>(y: *mut u16, x: *const u16, offs: &[usize], new_max: &[bool], e: &[f32], sums: &mut [f32]) {
    // SAFETY: the caller's contract, passed on whole; 64, 32 and 16 columns all divide 64.
    unsafe {
        match H {
            1 => mad_keys_heads64_avx2_part::<H, 8>(y, x, offs, new_max, e, sums),
            2 | 3 => mad_keys_heads64_avx2_part::<H, 4>(y, x, offs, new_max, e, sums),
            _ => mad_keys_heads64_avx2_part::<H, 2>(y, x, offs, new_max, e, sums),
        }
    }
}

/// [`mad_keys_heads64_avx2`] in parts of `8·V` columns.
///
/// # Safety
/// As [`mad_keys_heads64_avx2`]; `8·V` divides 64.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mad_keys_heads64_avx2_part<const H: usize, const V: usize>(y: *mut u16, x: *const u16, offs: &[usize], new_max: &[bool], e: &[f32], sums: &mut [f32]) {
    // SAFETY: as above; unaligned loads and stores only.
    unsafe {
        let len = offs.len();
        let f16_round = |v: __m256| _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
        let one = _mm256_set1_ps(1.0);
        let mut sum: [f32; H] = core::array::from_fn(|h| sums[h]);
        for col in (0..64).step_by(8 * V) {
            let mut acc: [[__m256; V]; H] = core::array::from_fn(|h| core::array::from_fn(|j| _mm256_cvtph_ps(_mm_loadu_si128(y.add(64 * h + col + 8 * j).cast()))));
            for (c, &off) in offs.iter().enumerate() {
                let xv: [__m256; V] = core::array::from_fn(|j| _mm256_cvtph_ps(_mm_loadu_si128(x.add(off + col + 8 * j).cast())));
                for (h, a) in acc.iter_mut().enumerate() {
                    let eh = e[h * len + c];
                    let ec = _mm256_set1_ps(eh);
                    let vs = if new_max[h * len + c] {
                        for v in a.iter_mut() {
                            *v = f16_round(_mm256_mul_ps(*v, ec));
                        }
                        if col == 0 {
                            sum[h] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(sum[h]), _mm_set_ss(eh), _mm_set_ss(1.0)));
                        }
                        one
                    } else {
                        // fma(sum, 1, e): the exact sum rounded once, as `+`.
                        if col == 0 {
                            sum[h] += eh;
                        }
                        ec
                    };
                    for (j, v) in a.iter_mut().enumerate() {
                        *v = f16_round(_mm256_fmadd_ps(xv[j], vs, *v));
                    }
                }
            }
            for (h, a) in acc.iter().enumerate() {
                for (j, v) in a.iter().enumerate() {
                    _mm_storeu_si128(y.add(64 * h + col + 8 * j).cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(*v));
                }
            }
        }
        sums[..H].copy_from_slice(&sum);
    }
}

/// Whether [`mad_keys_heads_exact`] takes rows of `n`: whole `F16_STEP` steps, so every
/// element takes the native f16 path of `scale` and `mad`.
pub(crate) fn mad_keys_heads_exact_fits(n: usize) -> bool {
    n > 0 && n.is_multiple_of(F16_STEP)
}

/// Keys per pass of [`mad_keys_heads_exact`] (the f16-rounded exponents on the stack).
const EXACT_KEYS: usize = 64;

/// [`mad_keys`] for the heads of a GQA group at once (up to 4; `ys`: `heads` rows of `n`,
/// `new_max` and `e`: `heads` rows of `offs.len()`), rows of whole 128-element steps
/// ([`mad_keys_heads_exact_fits`]: Gemma 3's 256), on CPUs without AVX512-FP16: the
/// single-rounding f16 arithmetic of `vfmadd231ph`/`vmulph` in f32 lanes. Per element and
/// key, as the reference: on a new maximum `y = f16(y·f16(e))` (an exact f32 product
/// rounded once) and `y = f16(x + y)` with one rounding, else `y = f16(x·f16(e) + y)` with
/// one rounding — the f32 sum rounded to odd, then to f16 to nearest even (see the
/// module doc). The row is taken in column slices (with AVX-512: `avx512`, the caller's
/// flag, set only after `cpu_has_avx512()`, 64 to 128 columns; else 16 to 32), each slice of every head
/// kept in registers through the keys, each value slice loaded once for all heads; each
/// head's running sum `softmax_sum` beside them. Every element sees the same sequence of
/// operations as one key and one head at a time: the same bits.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mad_keys_heads_exact(ys: &mut [f16], n: usize, heads: usize, x: &[f16], offs: &[usize], new_max: &[bool], e: &[f32], sums: &mut [f32], avx512: bool, via: bool) {
    let len = offs.len();
    assert!(mad_keys_heads_exact_fits(n) && (1..=4).contains(&heads), "mad_keys_heads_exact: {heads} heads of {n}");
    assert!(ys.len() >= heads * n && new_max.len() >= heads * len && e.len() >= heads * len && sums.len() >= heads, "mad_keys_heads_exact: short arrays");
    assert!(rows_fit(offs, n, x.len()), "mad_keys_heads_exact: value row out of bounds");
    softmax_sums(&mut sums[..heads], &new_max[..heads * len], &e[..heads * len]);
    let (yp, xp) = (ys.as_mut_ptr().cast::<u16>(), x.as_ptr().cast::<u16>());
    let mut c0 = 0;
    while c0 < len {
        let m = (len - c0).min(EXACT_KEYS);
        // Per head and key: the multiplier `f16(e)` as f32 (1 after a new maximum's
        // scaling) and the scale `f16(e)` (0 where there is none: never read).
        let (mut mul, mut scl) = ([0.0f32; 4 * EXACT_KEYS], [0.0f32; 4 * EXACT_KEYS]);
        for h in 0..heads {
            let r = h * len + c0..h * len + c0 + m;
            let (mh, sh) = (&mut mul[h * EXACT_KEYS..][..m], &mut scl[h * EXACT_KEYS..][..m]);
            // SAFETY: AVX2/FMA/F16C present (module contract); the four slices hold m
            // elements each.
            unsafe { exact_multipliers(&new_max[r.clone()], &e[r], mh, sh) };
        }
        let (nm, o) = (&new_max[..], &offs[c0..c0 + m]);
        let flags = |h: usize| &nm[h * len + c0..h * len + c0 + m];
        // SAFETY: AVX2/FMA/F16C present (module contract), AVX-512 F where `avx512` (the
        // caller's flag); ys holds heads rows of n, every value row's n elements lie in x
        // (checked above); mul/scl hold heads rows of EXACT_KEYS >= m.
        unsafe {
            let fl = [flags(0), flags(heads.min(2) - 1), flags(heads.min(3) - 1), flags(heads - 1)];
            // Slices as wide as the registers allow (16 vectors of accumulators with
            // AVX-512, up to 8 with AVX2; n is a multiple of 128, so of every width here).
            match (avx512, heads) {
                (true, 1) if via => mad_exact_avx512::<1, 8, true>(yp, n, xp, o, fl, &mul, &scl),
                (true, 2) if via => mad_exact_avx512::<2, 8, true>(yp, n, xp, o, fl, &mul, &scl),
                (true, 3) if via => mad_exact_avx512::<3, 4, true>(yp, n, xp, o, fl, &mul, &scl),
                (true, _) if via => mad_exact_avx512::<4, 4, true>(yp, n, xp, o, fl, &mul, &scl),
                (true, 1) => mad_exact_avx512::<1, 8, false>(yp, n, xp, o, fl, &mul, &scl),
                (true, 2) => mad_exact_avx512::<2, 8, false>(yp, n, xp, o, fl, &mul, &scl),
                (true, 3) => mad_exact_avx512::<3, 4, false>(yp, n, xp, o, fl, &mul, &scl),
                (true, _) => mad_exact_avx512::<4, 4, false>(yp, n, xp, o, fl, &mul, &scl),
                (false, 1) => mad_exact_heads_avx2::<1, 4>(yp, n, xp, o, fl, &mul, &scl),
                (false, 2) => mad_exact_heads_avx2::<2, 4>(yp, n, xp, o, fl, &mul, &scl),
                (false, 3) => mad_exact_heads_avx2::<3, 2>(yp, n, xp, o, fl, &mul, &scl),
                (false, _) => mad_exact_heads_avx2::<4, 2>(yp, n, xp, o, fl, &mul, &scl),
            }
        }
        c0 += m;
    }
}

/// Per key of one head, [`mad_keys_heads_exact`]'s multiplier and scale from `f16(e)` (to
/// nearest even, as `f16::from_f32`, back to f32 exactly): `(1, f16(e))` after a new
/// maximum, else `(f16(e), 0)`; 8 keys at a time by F16C, the rest one by one.
///
/// # Safety
/// AVX2/FMA/F16C present (`new_max`, `e`, `mul` and `scl` of one length: checked).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exact_multipliers(new_max: &[bool], e: &[f32], mul: &mut [f32], scl: &mut [f32]) {
    let m = e.len();
    assert!(new_max.len() == m && mul.len() == m && scl.len() == m, "exact_multipliers: slices of different lengths");
    let full = m - m % 8;
    // SAFETY: unaligned loads and stores of 8 elements at c < full <= m in each slice
    // (`bool` is one byte, 0 or 1).
    unsafe {
        let (zero, one) = (_mm256_setzero_ps(), _mm256_set1_ps(1.0));
        for c in (0..full).step_by(8) {
            let eh = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(e.as_ptr().add(c))));
            let flags = _mm_loadl_epi64(new_max.as_ptr().add(c).cast());
            let nm = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(flags), _mm256_setzero_si256()));
            _mm256_storeu_ps(mul.as_mut_ptr().add(c), _mm256_blendv_ps(eh, one, nm));
            _mm256_storeu_ps(scl.as_mut_ptr().add(c), _mm256_blendv_ps(zero, eh, nm));
        }
    }
    for c in full..m {
        let eh = f16::from_f32(e[c]).to_f32();
        (mul[c], scl[c]) = if new_max[c] { (1.0, eh) } else { (eh, 0.0) };
    }
}

/// [`mad_keys_heads_exact`]'s slices of `16·V` columns on 512-bit vectors for `H` heads:
/// `f16(x·v + y)` with one rounding as the f32 sum rounded to odd, then rounded to f16 to
/// nearest even. Round to odd from two fmas (AVX-512's per-instruction rounding): the
/// sum rounded down and rounded up are equal when it is exact, else adjacent f32 values
/// (bit patterns one apart, ±0 and the smallest subnormal next to zero), of which
/// exactly one has an odd significand: the one whose lowest bit is set, else the other.
/// The f16 rounding by [`f16_round_to`] (`VIA`: through memory, as on Intel).
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F present; `H` rows of `n` (a multiple of `16·V`) at `y`, `n`
/// elements at `x + offs[c]` for every c; `new_max[h]` as long as `offs`, `mul`/`scl`
/// hold `H` rows of [`EXACT_KEYS`] >= `offs.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn mad_exact_avx512<const H: usize, const V: usize, const VIA: bool>(y: *mut u16, n: usize, x: *const u16, offs: &[usize], new_max: [&[bool]; 4], mul: &[f32], scl: &[f32]) {
    // SAFETY: as above; unaligned loads and stores only.
    unsafe {
        const RD: i32 = _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC;
        const RU: i32 = _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC;
        let f16_round = |v: __m512| _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
        let one = _mm512_set1_epi32(1);
        // One f16 slot per (head, vector) chain for `f16_round_to` (unused without VIA).
        let mut slots = RoundSlots::new();
        for col in (0..n).step_by(16 * V) {
            let mut acc: [[__m512; V]; H] = core::array::from_fn(|h| core::array::from_fn(|j| _mm512_cvtph_ps(_mm256_loadu_si256(y.add(h * n + col + 16 * j).cast()))));
            for (c, &off) in offs.iter().enumerate() {
                let xv: [__m512; V] = core::array::from_fn(|j| cvtph_ps_m512(x.add(off + col + 16 * j)));
                for (h, a) in acc.iter_mut().enumerate() {
                    if new_max[h][c] {
                        let s = _mm512_set1_ps(scl[h * EXACT_KEYS + c]);
                        for v in a.iter_mut() {
                            *v = f16_round(_mm512_mul_ps(*v, s));
                        }
                    }
                    let vv = _mm512_set1_ps(mul[h * EXACT_KEYS + c]);
                    for (j, v) in a.iter_mut().enumerate() {
                        let rd = _mm512_castps_si512(_mm512_fmadd_round_ps::<RD>(xv[j], vv, *v));
                        let ru = _mm512_castps_si512(_mm512_fmadd_round_ps::<RU>(xv[j], vv, *v));
                        let odd = _mm512_mask_blend_epi32(_mm512_test_epi32_mask(rd, one), ru, rd);
                        *v = f16_round_to::<VIA>(_mm512_castsi512_ps(odd), &mut slots, V * h + j);
                    }
                }
            }
            for (h, a) in acc.iter().enumerate() {
                for (j, v) in a.iter().enumerate() {
                    _mm256_storeu_si256(y.add(h * n + col + 16 * j).cast(), _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(*v));
                }
            }
        }
    }
}

/// [`mad_keys_heads_exact`]'s slices of `8·V` columns on 256-bit vectors for `H` heads
/// (AVX2: `fma` where its f32 result cannot round twice, else TwoSum and
/// [`round_odd_sum`] as [`mad_exact_avx2`]).
///
/// Each key's step first takes `fma` and one f16 rounding for every lane of every head,
/// and only gathers, by two running minima, whether any sum landed where that may not be
/// the one rounding of the exact sum: on an f16 midpoint at normal magnitudes (the f32
/// sum's low 13 bits 0x1000), or at most f16's smallest normal 2^-14 (told from the f16
/// result: every sum below 2^-14 rounds to at most 2^-14). A head whose multiplier is a
/// power of two (or 0) is left out: its product `x·2^k` has f16's 11 bits, so its sum
/// with the f16 accumulator is exact in f32 when their exponents differ by at most 12,
/// and otherwise the smaller is under a quarter of the larger's f16 ulp, so that the f32
/// sum is no f16 midpoint; rounding that f32 sum to f16 is then the one rounding. Those
/// are the keys at the maximum and after a new maximum (multiplier 1), whose midpoints
/// are common: on Gemma 3's attention they were most of the keys taken again.
/// A key with anything gathered is taken again from the accumulators kept before it (in
/// f16, as the step's own rounding left them: two sets, this key's and the next's),
/// every vector by round to odd (exact sums and non-finite lanes unchanged, so every
/// lane gets the bits of one rounding), without a branch per vector.
///
/// # Safety
/// As [`mad_exact_avx512`], with AVX2/FMA/F16C only.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mad_exact_heads_avx2<const H: usize, const V: usize>(y: *mut u16, n: usize, x: *const u16, offs: &[usize], new_max: [&[bool]; 4], mul: &[f32], scl: &[f32]) {
    // SAFETY: as above; unaligned loads and stores only; the asm reads and writes one
    // register only.
    unsafe {
        let f16_round = |v: __m256| _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
        let (zero, one) = (_mm256_setzero_ps(), _mm256_set1_epi32(1));
        // On a new maximum, a head's accumulators scaled first (an exact f32 product
        // rounded once).
        let rescale = |a: &mut [__m256; V], h: usize, c: usize| {
            if new_max[h][c] {
                let s = _mm256_set1_ps(scl[h * EXACT_KEYS + c]);
                for v in a.iter_mut() {
                    *v = f16_round(_mm256_mul_ps(*v, s));
                }
            }
        };
        for col in (0..n).step_by(8 * V) {
            // The accumulators in f32 registers and in f16 before key c (`kept[c % 2]`,
            // stored, not kept in registers: read back only for a key taken again).
            let mut kept = [[[_mm_setzero_si128(); V]; H]; 2];
            let mut acc = [[_mm256_setzero_ps(); V]; H];
            for (h, a) in acc.iter_mut().enumerate() {
                for (j, a) in a.iter_mut().enumerate() {
                    let b = _mm_loadu_si128(y.add(h * n + col + 8 * j).cast());
                    core::ptr::write_volatile(&mut kept[0][h][j], b);
                    *a = _mm256_cvtph_ps(b);
                }
            }
            for (c, &off) in offs.iter().enumerate() {
                let (cur, next) = (c % 2, (c + 1) % 2);
                let xv: [__m256; V] = core::array::from_fn(|j| _mm256_cvtph_ps(_mm_loadu_si128(x.add(off + col + 8 * j).cast())));
                // The minimum of `sum bits << 19` (signed: i32::MIN exactly where the 13
                // low bits are the midpoint pattern) and of `f16 bits << 1` (unsigned: at
                // most 0x0800 exactly where the f16 result is at most 2^-14).
                let (mut mid, mut small) = (_mm256_set1_epi32(i32::MAX), _mm_set1_epi16(-1));
                for (h, a) in acc.iter_mut().enumerate() {
                    rescale(a, h, c);
                    let m = mul[h * EXACT_KEYS + c];
                    let vv = _mm256_set1_ps(m);
                    let exact = m.to_bits() & 0x7f_ffff == 0;
                    for (j, v) in a.iter_mut().enumerate() {
                        let s = _mm256_fmadd_ps(xv[j], vv, *v);
                        let mut hb = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(s);
                        // One conversion for both uses (else the compiler folds one into
                        // the store and converts again).
                        core::arch::asm!("/* {0} */", inout(xmm_reg) hb, options(pure, nomem, nostack, preserves_flags));
                        if !exact {
                            mid = _mm256_min_epi32(mid, _mm256_slli_epi32::<19>(_mm256_castps_si256(s)));
                            small = _mm_min_epu16(small, _mm_slli_epi16::<1>(hb));
                        }
                        core::ptr::write_volatile(&mut kept[next][h][j], hb);
                        *v = _mm256_cvtph_ps(hb);
                    }
                }
                let at_mid = _mm256_cmpeq_epi32(mid, _mm256_set1_epi32(i32::MIN));
                let below = _mm_cmpeq_epi16(_mm_min_epu16(small, _mm_set1_epi16(0x0800)), small);
                if _mm256_testz_si256(at_mid, at_mid) == 1 && _mm_testz_si128(below, below) == 1 {
                    continue;
                }
                for (h, a) in acc.iter_mut().enumerate() {
                    for (j, a) in a.iter_mut().enumerate() {
                        *a = _mm256_cvtph_ps(core::ptr::read_volatile(&kept[cur][h][j]));
                    }
                    rescale(a, h, c);
                    let vv = _mm256_set1_ps(mul[h * EXACT_KEYS + c]);
                    for (j, v) in a.iter_mut().enumerate() {
                        let hb = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(round_odd_sum(_mm256_mul_ps(xv[j], vv), *v, zero, one));
                        core::ptr::write_volatile(&mut kept[next][h][j], hb);
                        *v = _mm256_cvtph_ps(hb);
                    }
                }
            }
            for (h, k) in kept[offs.len() % 2].iter().enumerate() {
                for (j, k) in k.iter().enumerate() {
                    _mm_storeu_si128(y.add(h * n + col + 8 * j).cast(), core::ptr::read_volatile(k));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rows_fit;

    /// `rows_fit` is "every offset leaves room for a row", whatever the lengths.
    #[test]
    fn rows_fit_is_every_row_inside() {
        if !super::super::cpu_has_avx2_fma() {
            return;
        }
        let offs = [0usize, 7, 3, 64, 1, 2, 5, 9, 11];
        for len in 0..140 {
            for n in [0usize, 1, 64, 75, 76, 139] {
                for k in 0..=offs.len() {
                    let want = offs[..k].iter().all(|&o| o <= len && n <= len - o);
                    assert_eq!(rows_fit(&offs[..k], n, len), want, "offs {:?} n {n} len {len}", &offs[..k]);
                }
            }
        }
        assert!(!rows_fit(&[0, usize::MAX], 1, usize::MAX));
        assert!(rows_fit(&[0, usize::MAX - 1], 1, usize::MAX));
    }
}

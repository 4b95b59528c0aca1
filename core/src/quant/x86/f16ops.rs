//! AVX2 + FMA + F16C versions of the attention f16 operations in `../f16ops.rs`, with
//! the same bits: the 16-lane vectors of the reference are pairs of 256-bit vectors, and
//! every fma, add and rounding happens on the same values in the same order. The native
//! f16 part of `mad` (rows of 128 or more, not used by 64-wide heads) calls the
//! reference. Only handed out after `cpu_has_avx2_fma()` (module contract of `x86`).

use core::arch::x86_64::*;

use super::super::f16ops::{self as reference, DOT_STEP, F16_STEP};
use super::hsum_ps;
use half::f16;

/// K·Q dot (see `f16ops::dot`).
pub(crate) fn dot(x: &[f16], y: &[f16]) -> f32 {
    let n = x.len().min(y.len());
    // SAFETY: AVX2/FMA/F16C present (module contract); n elements readable in both.
    unsafe { dot_avx2(n, x.as_ptr().cast(), y.as_ptr().cast()) }
}

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

/// `y += x·v` on an f16 accumulator (see `f16ops::mad`).
pub(crate) fn mad(y: &mut [f16], x: &[f16], v: f32) {
    let n = y.len().min(x.len());
    let np = n - n % F16_STEP;
    reference::mad(&mut y[..np], &x[..np], v);
    let m = n - np;
    // SAFETY: AVX2/FMA/F16C present (module contract); m elements from np in both.
    unsafe { mad_avx2(m, y[np..].as_mut_ptr().cast(), x[np..].as_ptr().cast(), v) }
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

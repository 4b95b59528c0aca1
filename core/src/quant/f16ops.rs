//! Scalar reference of the f16 vector operations of attention: the K·Q dot, the f16
//! accumulator update `y += x·v` and rescale `y *= v`, and f32 → f16 rows.
//!
//! Owns the arithmetic of llama.cpp's CPU flash attention on x86 as built with
//! `-march=native` on an AVX-512 FP16 machine (the build the golden files come from),
//! operation for operation, so keel's attention rounds where llama.cpp's does:
//!
//! - `dot(x, y)`: f32 lanes, 64 elements per step in 4 × 16 lanes, each lane
//!   `acc = fma(x, y, acc)`; the four 16-lane sums are added (0+2, 1+3, then the two),
//!   then reduced 16 → 8 → 4 → 2 → 1 (high half + low half each time); the leftover
//!   `n % 64` products are added in f64, and the result rounds to f32.
//! - `mad(y, x, v)` (f16 `y`): the first `n & !127` elements as native f16 FMA with `v`
//!   rounded to f16 (one rounding of the exact `x·v16 + y`); the rest as
//!   `y = f16(fma(x, v, y))` in f32.
//! - `scale(y, v)`: the first `n & !127` as `f16(y · f16(v))`, the rest `f16(y · v)`.
//!
//! Uses `libm` only; the x86 versions (`x86/f16ops.rs`) give the same bits. The f16 ↔
//! f32 conversions are [`h2f`] and [`f2h`] (`half`'s results, without its branches: the
//! DSP runs this code, and `half`'s software conversions cost more than the arithmetic).

use half::f16;

/// Elements per step of the f32-lane dot (4 vectors of 16 lanes).
pub(crate) const DOT_STEP: usize = 64;
/// Elements per step of the native f16 `mad`/`scale` (4 vectors of 32 f16 lanes).
pub(crate) const F16_STEP: usize = 128;

/// The 16 → 1 reduction of `_mm512_reduce_add_ps` as GCC implements it.
#[inline]
pub(crate) fn reduce16(s: &[f32; 16]) -> f32 {
    let mut t = [0.0f32; 8];
    for i in 0..8 {
        t[i] = s[8 + i] + s[i];
    }
    super::scalar::hsum8(t)
}

/// The dot's 64 lane sums reduced: the four 16-lane sums added (0+2, 1+3, then the
/// two), then [`reduce16`].
#[inline]
pub(crate) fn reduce_lanes(acc: &[f32; DOT_STEP]) -> f32 {
    let s: [f32; 16] = core::array::from_fn(|l| (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]));
    reduce16(&s)
}

/// K·Q dot of two f16 rows (see the module doc).
pub(crate) fn dot(x: &[f16], y: &[f16]) -> f32 {
    let n = x.len().min(y.len());
    let np = n - n % DOT_STEP;
    let mut acc = [0.0f32; DOT_STEP];
    for i in (0..np).step_by(DOT_STEP) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a = crate::fused::fmaf(h2f(x[i + l]), h2f(y[i + l]), *a);
        }
    }
    let mut sum = reduce_lanes(&acc) as f64;
    for i in np..n {
        sum += (h2f(x[i]) * h2f(y[i])) as f64;
    }
    sum as f32
}

/// `y += x·v` on an f16 accumulator (see the module doc).
pub(crate) fn mad(y: &mut [f16], x: &[f16], v: f32) {
    let n = y.len().min(x.len());
    let np = n - n % F16_STEP;
    let vh = f64::from(h2f(f2h(v)));
    for i in 0..np {
        y[i] = f16_from_f64(libm::fma(f64::from(h2f(x[i])), vh, f64::from(h2f(y[i]))));
    }
    for i in np..n {
        y[i] = f2h(crate::fused::fmaf(h2f(x[i]), v, h2f(y[i])));
    }
}

/// `v` rounded to f16 once, to nearest even. (`half`'s `f16::from_f64` rounds twice —
/// through f32, or after dropping the low 32 mantissa bits — and can turn a value just
/// off an f16 midpoint into a tie.) Rounding to f32 by round-to-odd first keeps the
/// sticky information, so the f32 → f16 step then rounds as one rounding would. `v` here
/// is the exact `x·v + y` of two f16 and an f16 (an f64 `fma` holds it exactly whenever
/// the terms are within 2^30 of each other in magnitude, and otherwise keeps its sign of
/// error), so this is the single rounding of AVX512-FP16's `vfmadd`.
pub(crate) fn f16_from_f64(v: f64) -> f16 {
    let r = v as f32;
    let back = r as f64;
    let r = if back == v || !r.is_finite() {
        r
    } else {
        // Truncate toward zero, then mark the dropped bits in the last place.
        let bits = if back.abs() > v.abs() { r.to_bits() - 1 } else { r.to_bits() };
        f32::from_bits(bits | 1)
    };
    f2h(r)
}

/// `y *= v` on an f16 accumulator (see the module doc).
pub(crate) fn scale(y: &mut [f16], v: f32) {
    let n = y.len();
    let np = n - n % F16_STEP;
    let vh = h2f(f2h(v));
    for e in &mut y[..np] {
        *e = f2h(h2f(*e) * vh);
    }
    for e in &mut y[np..] {
        *e = f2h(h2f(*e) * v);
    }
}

/// `dst[i] = f16(src[i])`, round to nearest even.
pub(crate) fn to_f16(src: &[f32], dst: &mut [f16]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f2h(s);
    }
}

/// `dst[i] = f32(src[i])` (exact).
pub(crate) fn to_f32(src: &[f16], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = h2f(s);
    }
}

/// `f32(h)`, exact: `half`'s `to_f32` for every input (a NaN keeps its payload and is
/// made quiet), in integer operations and one exact multiply.
#[inline(always)]
pub(crate) fn h2f(h: f16) -> f32 {
    let h = u32::from(h.to_bits());
    let (sign, mag) = ((h & 0x8000) << 16, h & 0x7fff);
    let bits = if mag < 0x0400 {
        // Zero and subnormals: mag·2^-24 (both factors exact, the product normal).
        (mag as f32 * f32::from_bits(0x3380_0000)).to_bits()
    } else if mag < 0x7c00 {
        // Normals: the exponent rebiased from 15 to 127.
        (mag << 13) + (112 << 23)
    } else if mag == 0x7c00 {
        0x7f80_0000
    } else {
        0x7fc0_0000 | (mag << 13)
    };
    f32::from_bits(sign | bits)
}

/// `f16(v)` rounded to nearest even: `half`'s `from_f32` for every input (overflow to
/// infinity, a NaN's top payload bits kept and the NaN made quiet).
#[inline(always)]
pub(crate) fn f2h(v: f32) -> f16 {
    let x = v.to_bits();
    let (sign, a) = ((x >> 16) & 0x8000, x & 0x7fff_ffff);
    let h = if a >= 0x7f80_0000 {
        0x7c00 | if a > 0x7f80_0000 { 0x0200 | ((a >> 13) & 0x03ff) } else { 0 }
    } else if a >= 0x4780_0000 {
        // 65536 and above (65520 and above round there below).
        0x7c00
    } else if a >= 0x3880_0000 {
        // f16 normals: rebias the exponent, then round the 13 dropped bits to nearest
        // even (a carry runs into the exponent, up to infinity, as it should).
        let r = a - (112 << 23);
        (r + 0x0fff + ((r >> 13) & 1)) >> 13
    } else {
        // Below 2^-14: the subnormal count |v|·2^24 rounded to nearest even by one f32
        // add whose sum has an ulp of 2^-24 (0.5 + |v|, |v| < 2^-14); 1024 is the
        // smallest normal's encoding.
        (f32::from_bits(a) + 0.5).to_bits() - 0x3f00_0000
    };
    f16::from_bits((sign | h) as u16)
}

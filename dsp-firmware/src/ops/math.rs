//! Scalar float functions for the layer ops, with the algorithms of keel's CPU
//! reference (`keel_core::ops`, which follows llama.cpp's x86 build), written
//! with `libm` and plain IEEE binary32/64 operations only, so that Hexagon's
//! scalar float unit (and QEMU's emulation of it) computes the same bits:
//!
//! - [`expf`]: the binary64 exponential rounded to binary32 (glibc's `expf`
//!   is correctly rounded for all but about 1 input in 1600);
//! - [`ggml_expf`]: llama.cpp's vectorized `ggml_v_expf` (used by SiLU);
//! - [`sincosf`]: glibc's `sincosf` algorithm (RoPE angles);
//! - [`gelu_tanh`]: ggml's GELU with the tanh approximation.

use libm::fmaf;

/// `e^x`, the binary64 exponential rounded once to binary32.
pub fn expf(x: f32) -> f32 {
    libm::exp(x as f64) as f32
}

/// `e^x` by llama.cpp's `ggml_v_expf`: `n = round(x·log2 e)` by the 1.5·2^23
/// shift, `b = x − n·ln2` in two fma steps, a degree-5 polynomial by fma,
/// scaled by `2^n` (0 or ∞ when |n| > 192).
pub fn ggml_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4B40_0000); // 0x1.8p23
    let z = fmaf(x, f32::from_bits(0x3FB8_AA3B), r); // 0x1.715476p+0
    let n = z - r;
    let b = fmaf(-n, f32::from_bits(0x35BF_BE8E), fmaf(-n, f32::from_bits(0x3F31_7200), x));
    let u = b * b;
    let p1 = fmaf(
        fmaf(f32::from_bits(0x3C07_2010), b, f32::from_bits(0x3D2B_9F17)),
        u,
        fmaf(f32::from_bits(0x3E2A_AF33), b, f32::from_bits(0x3EFF_FEDB)),
    );
    let j = fmaf(p1, u, fmaf(f32::from_bits(0x3F7F_FFF6), b, 1.0));
    if libm::fabsf(n) > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // j · 2^n rounded once: two exact power-of-two factors, the second multiply rounds.
    let n = n as i32;
    let (n1, n2) = (n / 2, n - n / 2);
    let p = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    (j * p(n1)) * p(n2)
}

/// SiLU as llama.cpp's `ggml_v_silu`: `x / (1 + ggml_expf(0 − x))`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + ggml_expf(0.0 - x))
}

/// GELU, tanh approximation (ggml's `ggml_gelu_f32`).
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + libm::tanhf(SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)))
}

/// 4/π in 32-bit windows, byte by byte (for the large-argument reduction).
const INV_PIO4: [u32; 24] = [
    0xa2, 0xa2f9, 0xa2f983, 0xa2f9836e, 0xf9836e4e, 0x836e4e44, 0x6e4e4415, 0x4e441529, 0x441529fc, 0x1529fc27,
    0x29fc2757, 0xfc2757d1, 0x2757d1f5, 0x57d1f534, 0xd1f534dd, 0xf534ddc0, 0x34ddc0db, 0xddc0db62, 0xc0db6295,
    0xdb629599, 0x6295993c, 0x95993c43, 0x993c4390, 0x3c439041,
];

/// `(sin y, cos y)` with glibc's `sincosf` algorithm (ARM optimized-routines):
/// binary64 range reduction by π/2 (or by a 4/π bit table above 120), then two
/// short binary64 polynomials with fma. NaN and ∞ give NaN.
pub fn sincosf(y: f32) -> (f32, f32) {
    let top = |v: f32| (v.to_bits() >> 20) & 0x7ff;
    let x = y as f64;
    let (xr, n, swap) = if top(y) < top(core::f32::consts::FRAC_PI_4) {
        if top(y) < top(f32::from_bits(0x3980_0000)) {
            return (y, 1.0); // |y| < 2^-12
        }
        (x, 0, 0)
    } else if top(y) < top(120.0) {
        let r = x * f64::from_bits(0x4164_5f30_6dc9_c883);
        let n = ((r as i32).wrapping_add(0x80_0000)) >> 24;
        (libm::fma(-(n as f64), f64::from_bits(0x3ff9_21fb_5444_2d18), x), n, n)
    } else if top(y) < top(f32::INFINITY) {
        let xi = y.to_bits();
        let arr = &INV_PIO4[((xi >> 26) & 15) as usize..];
        let m = ((xi & 0xff_ffff) | 0x80_0000) << ((xi >> 23) & 7);
        let res0 = m.wrapping_mul(arr[0]) as u64;
        let res1 = m as u64 * arr[4] as u64;
        let res2 = m as u64 * arr[8] as u64;
        let mut r = ((res2 >> 32) | (res0 << 32)).wrapping_add(res1);
        let n = r.wrapping_add(1 << 61) >> 62;
        r = r.wrapping_sub(n << 62);
        ((r as i64) as f64 * f64::from_bits(0x3c19_21fb_5444_2d18), n as i32 + (xi >> 31) as i32, n as i32)
    } else {
        return (f32::NAN, f32::NAN);
    };
    let sign = if (n + 1) & 2 != 0 { -1.0 } else { 1.0 };
    let neg = if n & 2 != 0 { -1.0 } else { 1.0 };
    let b = f64::from_bits;
    let (c0, c1, c2, c3, c4) =
        (neg, neg * b(0xbfdf_ffff_fd0c_621c), neg * b(0x3fa5_5553_e106_8f19), neg * b(0xbf56_c087_e89a_359d), neg * b(0x3ef9_9343_027b_f8c3));
    let (s1, s2, s3) = (b(0xbfc5_5554_5995_a603), b(0x3f81_1076_0523_0bc4), b(0xbf29_94eb_3774_cf24));
    let x = if n == 0 { xr } else { xr * sign };
    let x2 = xr * xr;
    let (x3, x4) = (x2 * x, x2 * x2);
    let (cc2, ss1) = (libm::fma(x2, c4, c3), libm::fma(x2, s3, s2));
    let cc1 = libm::fma(x2, c1, c0);
    let (x5, x6) = (x3 * x2, x4 * x2);
    let s = libm::fma(x3, s1, x);
    let c = libm::fma(x4, c2, cc1);
    let (sv, cv) = (libm::fma(x5, ss1, s) as f32, libm::fma(x6, cc2, c) as f32);
    if swap & 1 == 1 {
        (cv, sv)
    } else {
        (sv, cv)
    }
}

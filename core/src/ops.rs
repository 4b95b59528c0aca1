//! Scalar float operators of a transformer block: RMSNorm, RoPE, activations, softmax.
//!
//! Reference arithmetic with a fixed order and `libm` for every transcendental function,
//! so the same inputs give the same bits on every target. Owns no memory: callers pass
//! the buffers (arena regions).

/// Reads little-endian `f32`s from raw tensor bytes.
pub fn f32_at(bytes: &[u8], i: usize) -> f32 {
    let b = &bytes[i * 4..i * 4 + 4];
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// `1 / sqrt(mean(x^2) + eps)`: the mean of [`mean_square`], the root and reciprocal in
/// f32.
pub fn rms_scale(x: &[f32], eps: f32) -> f32 {
    1.0 / libm::sqrtf(mean_square(x) + eps)
}

/// `mean(x^2)` as ggml computes it: the squares (rounded to f32) summed in f64 in index
/// order, the quotient by the length rounded to f32. That order is one chain of
/// dependent f64 adds (~4 cycles each: ~1% of a one-thread decode went to it), so the
/// sum is first taken in 16 independent lanes (`mean_square_lanes`), which gives the
/// same f32 whenever its error bound proves it; else the chain.
pub fn mean_square(x: &[f32]) -> f32 {
    mean_square_lanes(x).unwrap_or_else(|| mean_square_in_order(x))
}

/// [`mean_square`] the way ggml takes it: one f64 add after another in index order.
fn mean_square_in_order(x: &[f32]) -> f32 {
    let mut sum = 0.0f64;
    for &v in x {
        sum += (v * v) as f64;
    }
    (sum / x.len() as f64) as f32
}

/// Lanes of [`mean_square_lanes`]' partial sums.
const SQUARE_LANES: usize = 16;

/// [`mean_square_in_order`]'s f32 from the same squares summed in [`SQUARE_LANES`] lanes
/// (element `i` into lane `i % 16`, then the lanes pairwise), or `None` where that sum
/// cannot prove it (a row within the error bound of an f32 rounding boundary, a NaN, an
/// empty or very long row). The squares are not negative, so both sums lie within
/// `γ_{n-1}·S` of the exact sum `S` (`γ_k = k·u/(1 - k·u)`, `u = 2^-53`: each summand
/// passes through fewer than `n` rounded adds either way), and each quotient by `n` adds
/// one rounding: the in-order mean lies within a relative `(2n + 32)·u` of this one's.
/// Where every value in that interval rounds to one f32 (rounding is monotone: its two
/// ends round alike), that f32 is the in-order result.
fn mean_square_lanes(x: &[f32]) -> Option<f32> {
    let n = x.len();
    if n == 0 || n > 1 << 24 {
        return None;
    }
    let mut acc = [0.0f64; SQUARE_LANES];
    let mut rows = x.chunks_exact(SQUARE_LANES);
    for r in &mut rows {
        for (a, &v) in acc.iter_mut().zip(r) {
            *a += (v * v) as f64;
        }
    }
    for (a, &v) in acc.iter_mut().zip(rows.remainder()) {
        *a += (v * v) as f64;
    }
    let mut w = SQUARE_LANES;
    while w > 1 {
        w /= 2;
        for j in 0..w {
            acc[j] += acc[j + w];
        }
    }
    let mean = acc[0] / n as f64;
    let d = (2 * n + 32) as f64 * (f64::EPSILON / 2.0);
    let (lo, hi) = ((mean * (1.0 - d)) as f32, (mean * (1.0 + d)) as f32);
    (lo == hi).then_some(lo)
}

/// `out = x / sqrt(mean(x^2) + eps) * w` (w as raw little-endian f32 bytes): `(x·scale)·w`
/// with the scale of [`rms_scale`].
pub fn rms_norm(x: &[f32], w: &[u8], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
        *o = (v * scale) * f32_at(w, i);
    }
}

/// [`rms_norm`] in place.
pub fn rms_norm_in_place(x: &mut [f32], w: &[u8], eps: f32) {
    let scale = rms_scale(x, eps);
    for (i, v) in x.iter_mut().enumerate() {
        *v = (*v * scale) * f32_at(w, i);
    }
}

/// [`rms_norm_in_place`] with the weight as f32 values.
pub fn rms_norm_weighted(x: &mut [f32], w: &[f32], eps: f32) {
    let scale = rms_scale(x, eps);
    for (v, &w) in x.iter_mut().zip(w) {
        *v = (*v * scale) * w;
    }
}

/// [`rms_norm`] without a weight, in place: `x · scale` (ggml's `rms_norm` op alone).
pub fn rms_norm_unweighted(x: &mut [f32], eps: f32) {
    let scale = rms_scale(x, eps);
    for v in x.iter_mut() {
        *v *= scale;
    }
}

/// `x = softmax(x · scale)` of one row, in place: `m = max(x·scale)`, `e = expf(x·scale - m)`,
/// the sum in f64 in index order, then `e · (1/sum)` (the reciprocal rounded to f32).
pub fn softmax(x: &mut [f32], scale: f32) {
    softmax_with(x, scale, |x| x.iter_mut().for_each(|v| *v = expf(*v)));
}

/// [`softmax`] with `exp` taking the exponentials of the whole row in place (`x·scale −
/// m` in, [`expf`]'s bits out: e.g. `Kernels::expf_batch`); the same operations in the
/// same order.
pub fn softmax_with(x: &mut [f32], scale: f32, exp: impl FnOnce(&mut [f32])) {
    let mut m = f32::NEG_INFINITY;
    for v in x.iter_mut() {
        *v *= scale;
        m = m.max(*v);
    }
    x.iter_mut().for_each(|v| *v -= m);
    exp(x);
    let sum = x.iter().fold(0.0f64, |s, &v| s + v as f64);
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Fills `cs` with interleaved `(cos, sin)` of the RoPE angles for position `pos`:
/// theta_i = pos * base^(-2i/n_rot), computed by repeated multiplication as ggml does,
/// with [`sincosf`] (glibc's rounding, which llama.cpp gets from `sincosf`).
pub fn rope_angles(pos: usize, base: f32, n_rot: usize, cs: &mut [f32]) {
    rope_angles_scaled(pos, base, n_rot, &RopeScale::NONE, None, cs);
}

/// RoPE frequency scaling of one layer, as ggml's `rope_ext` takes it: linear
/// (`freq_scale` < 1, `ext_factor` 0) or YaRN (`ext_factor` 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeScale {
    /// Angles are multiplied by this (`1/factor`; 1: no scaling).
    pub freq_scale: f32,
    /// YaRN's mix of extrapolated angles (0: none).
    pub ext_factor: f32,
    /// Magnitude of cos and sin: the attention factor, times YaRN's
    /// `1 + 0.1·ln(1/freq_scale)` when `ext_factor` is not 0.
    pub mscale: f32,
    /// YaRN's correction dims `[low, high]` (pair indices of the ramp).
    pub corr_dims: [f32; 2],
}

impl RopeScale {
    /// No scaling: the plain RoPE angles.
    pub const NONE: RopeScale = RopeScale { freq_scale: 1.0, ext_factor: 0.0, mscale: 1.0, corr_dims: [0.0, 0.0] };

    /// The scaling ggml's RoPE applies for these parameters: YaRN's correction dims
    /// `[max(0, floor(d(beta_fast))), min(n_rot - 1, ceil(d(beta_slow)))]` with
    /// `d(b) = n_rot·ln(n_ctx_orig / (2π·b)) / (2·ln(base))`, and the magnitude
    /// `attn_factor · (1 + 0.1·ln(1/freq_scale))` when `ext_factor` is not 0 (the sum
    /// fused into one fma, as GCC compiles ggml's CPU op for x86 with FMA).
    #[allow(clippy::too_many_arguments)]
    pub fn new(freq_scale: f32, ext_factor: f32, attn_factor: f32, n_ctx_orig: usize, base: f32, n_rot: usize, beta_fast: f32, beta_slow: f32) -> RopeScale {
        let dim = |beta: f32| n_rot as f32 * logf(n_ctx_orig as f32 / (beta * 2.0 * core::f32::consts::PI)) / (2.0 * logf(base));
        let low = libm::floorf(dim(beta_fast)).max(0.0);
        let high = libm::ceilf(dim(beta_slow)).min(n_rot as f32 - 1.0);
        let mut mscale = attn_factor;
        if ext_factor != 0.0 {
            mscale *= crate::fused::fmaf(0.1, logf(1.0 / freq_scale), 1.0);
        }
        RopeScale { freq_scale, ext_factor, mscale, corr_dims: [low, high] }
    }
}

/// `ln x` of an f32 as glibc's `logf` rounds it: the f64 logarithm rounded to f32.
pub fn logf(x: f32) -> f32 {
    libm::log(x as f64) as f32
}

/// [`rope_angles`] with frequency scaling and, optionally, per-pair frequency divisors
/// (`freq_factors`: `n_rot/2` little-endian f32, Llama 3's `rope_freqs.weight`), in
/// ggml's order: `theta_e = theta_i / ff_i`, `theta = freq_scale·theta_e`, with YaRN
/// `theta = theta·(1 - r) + theta_e·r` (one fma) where `r = ext_factor·(1 -
/// clamp((i - low) / max(0.001, high - low), 0, 1))`; then `cos(theta)·mscale`,
/// `sin(theta)·mscale`. The two fmas (this blend and the magnitude's `1 + 0.1·ln`) are
/// where GCC fuses them in llama.cpp 11434's x86 build (`vfmadd132ss` in its compiled
/// rope op); the goldens of tests/golden/rope do not tell the blend's rounding apart
/// (q and k are rounded to f16 after RoPE), the disassembly does.
pub fn rope_angles_scaled(pos: usize, base: f32, n_rot: usize, sc: &RopeScale, freq_factors: Option<&[u8]>, cs: &mut [f32]) {
    let theta_scale = libm::powf(base, -2.0 / n_rot as f32);
    let [low, high] = sc.corr_dims;
    let mut theta = pos as f32;
    for i in 0..n_rot / 2 {
        let ff = freq_factors.map_or(1.0, |f| f32::from_le_bytes([f[4 * i], f[4 * i + 1], f[4 * i + 2], f[4 * i + 3]]));
        let extrap = theta / ff;
        let interp = sc.freq_scale * extrap;
        let mut t = interp;
        if sc.ext_factor != 0.0 {
            let y = (i as f32 - low) / (high - low).max(0.001);
            let mix = (1.0 - y.clamp(0.0, 1.0)) * sc.ext_factor;
            t = crate::fused::fmaf(interp, 1.0 - mix, extrap * mix);
        }
        let (s, c) = sincosf(t);
        cs[2 * i] = c * sc.mscale;
        cs[2 * i + 1] = s * sc.mscale;
        theta *= theta_scale;
    }
}

/// 4/π in 32-bit windows, byte by byte (for the large-argument reduction).
const INV_PIO4: [u32; 24] = [
    0xa2, 0xa2f9, 0xa2f983, 0xa2f9836e, 0xf9836e4e, 0x836e4e44, 0x6e4e4415, 0x4e441529,
    0x441529fc, 0x1529fc27, 0x29fc2757, 0xfc2757d1, 0x2757d1f5, 0x57d1f534, 0xd1f534dd, 0xf534ddc0,
    0x34ddc0db, 0xddc0db62, 0xc0db6295, 0xdb629599, 0x6295993c, 0x95993c43, 0x993c4390, 0x3c439041,
];

/// `(sin x, cos x)` of an f32 with glibc's algorithm (the ARM optimized-routines
/// `sincosf`: f64 range reduction by π/2, or by a 4/π bit table above 120, then two
/// short f64 polynomials with fma), so the values are the ones llama.cpp's RoPE cache
/// gets on x86 Linux bit for bit (checked against glibc 2.36 for 65536 RoPE angles).
/// `libm` only; NaN/∞ give NaN.
pub fn sincosf(y: f32) -> (f32, f32) {
    let top = |v: f32| (v.to_bits() >> 20) & 0x7ff;
    let x = y as f64;
    // (reduced x, quadrant for the signs and table, quadrant for the sin/cos swap)
    let (xr, n, swap) = if top(y) < top(core::f32::consts::FRAC_PI_4) {
        if top(y) < top(f32::from_bits(0x3980_0000)) {
            return (y, 1.0); // |y| < 2^-12
        }
        (x, 0, 0)
    } else if top(y) < top(120.0) {
        // n = round(x·2/π) via a 2^24-scaled truncation; x - n·π/2.
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
        // The sign of y folds into the quadrant of the signs, not of the swap.
        ((r as i64) as f64 * f64::from_bits(0x3c19_21fb_5444_2d18), n as i32 + (xi >> 31) as i32, n as i32)
    } else {
        return (f32::NAN, f32::NAN);
    };
    let sign = if (n + 1) & 2 != 0 { -1.0 } else { 1.0 }; // [1, -1, -1, 1][n & 3]
    let neg = if n & 2 != 0 { -1.0 } else { 1.0 };
    let b = f64::from_bits;
    let (c0, c1, c2, c3, c4) = (neg, neg * b(0xbfdf_ffff_fd0c_621c), neg * b(0x3fa5_5553_e106_8f19), neg * b(0xbf56_c087_e89a_359d), neg * b(0x3ef9_9343_027b_f8c3));
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

/// One RoPE rotation as llama.cpp's compiled x86 code rounds it (GCC contracts
/// `x0*c - x1*s` and `x0*s + x1*c` into one fma each): `(fma(x0, c, -(x1·s)),
/// fma(x0, s, x1·c))` (which product is fused was found by comparing sums of the
/// rotated tensors with `llama-eval-callback`).
#[inline]
fn rotate(x0: f32, x1: f32, c: f32, s: f32) -> (f32, f32) {
    (crate::fused::fmaf(x0, c, -(x1 * s)), crate::fused::fmaf(x0, s, x1 * c))
}

/// Rotates the first `n_rot` dims of each `hd`-wide head of `heads` ([`rope_normal`], or
/// [`rope_neox`] with `neox`); the reference of `Kernels::rope`.
pub fn rope_heads(heads: &mut [f32], hd: usize, cs: &[f32], n_rot: usize, neox: bool) {
    for h in heads.chunks_exact_mut(hd) {
        if neox {
            rope_neox(h, cs, n_rot);
        } else {
            rope_normal(h, cs, n_rot);
        }
    }
}

/// Rotates adjacent pairs `(2i, 2i+1)` of the first `n_rot` dims of one head.
pub fn rope_normal(head: &mut [f32], cs: &[f32], n_rot: usize) {
    for i in 0..n_rot / 2 {
        let (x0, x1) = rotate(head[2 * i], head[2 * i + 1], cs[2 * i], cs[2 * i + 1]);
        head[2 * i] = x0;
        head[2 * i + 1] = x1;
    }
}

/// Rotates pairs `(i, i + n_rot/2)` of the first `n_rot` dims of one head (NeoX style).
pub fn rope_neox(head: &mut [f32], cs: &[f32], n_rot: usize) {
    let half = n_rot / 2;
    for i in 0..half {
        let (x0, x1) = rotate(head[i], head[i + half], cs[2 * i], cs[2 * i + 1]);
        head[i] = x0;
        head[i + half] = x1;
    }
}

/// `e^x` as glibc's `expf` (which llama.cpp's attention calls) rounds it: the f64
/// exponential rounded to f32, i.e. correctly rounded, which glibc's `expf` is for all
/// but about 1 input in 1600.
pub fn expf(x: f32) -> f32 {
    libm::exp(x as f64) as f32
}

/// `e^x` by llama.cpp's vectorized `ggml_v_expf` (AVX-512 build), the exponential its
/// SiLU uses: `n = round(x·log2 e)` by the 1.5·2^23 shift, `b = x - n·ln2` in two fma
/// steps, a degree-5 polynomial in `b` by fma, scaled by `2^n` (0 or ∞ when |n| > 192).
/// Every fma is [`crate::fused::fmaf`], so this is exact on every target; the AVX2 version in
/// `quant/x86/act.rs` gives the same bits.
pub fn ggml_expf(x: f32) -> f32 {
    let (z, n, j) = ggml_expf_parts(x);
    // `n` as an integer from `z`'s bits (`z = r + n` exactly while |n| < 2^22; beyond,
    // and for a NaN, the result below is not this one, or `n as i32` = 0 is used), and
    // both results selected rather than branched to (the same bits for every input:
    // checked against the branching form for all 2^32 of them).
    let ni = if n.is_nan() { 0 } else { (z.to_bits() as i32).wrapping_sub(0x4B40_0000) };
    let over = if n <= 0.0 { 0.0 } else { f32::INFINITY };
    let scaled = scale_by_pow2(j, if libm::fabsf(n) > 192.0 { 0 } else { ni });
    if libm::fabsf(n) > 192.0 {
        over
    } else {
        scaled
    }
}

/// [`ggml_expf`] before its scaling: `z = x·log2 e + 1.5·2^23` (whose low bits hold `n`
/// while |n| < 2^22), `n = z − 1.5·2^23`, and `j ≈ e^(x − n·ln 2)`, the polynomial; the
/// result is `j·2^n`. (The DSP's SwiGLU scales `j` itself where `j·2^n` is normal.)
#[inline(always)]
pub(crate) fn ggml_expf_parts(x: f32) -> (f32, f32, f32) {
    use crate::fused::fmaf;
    let r = f32::from_bits(0x4B40_0000); // 0x1.8p23
    let z = fmaf(x, f32::from_bits(0x3FB8_AA3B), r); // 0x1.715476p+0
    let n = z - r;
    let b = fmaf(-n, f32::from_bits(0x35BF_BE8E), fmaf(-n, f32::from_bits(0x3F31_7200), x)); // 0x1.7f7d1cp-20, 0x1.62e4p-1
    let u = b * b;
    let p1 = fmaf(fmaf(f32::from_bits(0x3C07_2010), b, f32::from_bits(0x3D2B_9F17)), u, fmaf(f32::from_bits(0x3E2A_AF33), b, f32::from_bits(0x3EFF_FEDB)));
    let j = fmaf(p1, u, fmaf(f32::from_bits(0x3F7F_FFF6), b, 1.0));
    (z, n, j)
}

/// `j · 2^n` rounded once (as `vscalefps`), for |n| <= 192 and j near 1: two exact
/// power-of-two factors, the second multiply rounds.
#[inline]
pub(crate) fn scale_by_pow2(j: f32, n: i32) -> f32 {
    let n1 = n / 2;
    let n2 = n - n1;
    let p = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    (j * p(n1)) * p(n2)
}

/// SiLU as llama.cpp's vectorized `ggml_v_silu`: `x / (1 + ggml_expf(0 - x))`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + ggml_expf(0.0 - x))
}

/// `gate[i] = silu(gate[i]) * up[i]` (SwiGLU), llama.cpp's `ggml_vec_swiglu_f32`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// `1 / (1 + e^-x)`, as ggml's sigmoid.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + expf(-x))
}

/// `x[i] *= sigmoid(g[i])`: an output gated by [`sigmoid`] of its gate (one rounding:
/// the product).
pub fn mul_sigmoid(x: &mut [f32], g: &[f32]) {
    for (v, &g) in x.iter_mut().zip(g) {
        *v *= sigmoid(g);
    }
}

/// `ln(1 + e^x)` (x itself above 20), as ggml's softplus.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        libm::logf(1.0 + expf(x))
    }
}

/// GELU with the tanh approximation, as ggml's `ggml_gelu_f32` compiled by GCC (which
/// fuses `1 + a·x·x` into `fma(a·x, x, 1)`). Through f16 (ggml's table, see [`geglu`])
/// this gives llama.cpp 11434's `ggml_table_gelu_f16` exactly on all 65536 inputs; the
/// unfused form differs on one (x = -1.999).
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + libm::tanhf(SQRT_2_OVER_PI * x * crate::fused::fmaf(COEF_A * x, x, 1.0)))
}

/// `gate[i] = gelu(gate[i]) * up[i]` (GeGLU) as ggml's CPU `geglu`: 0 below -10, the
/// identity above 10, else GELU of the input rounded to f16, itself rounded to f16 (the
/// values of ggml's 64K-entry f16 table).
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    use half::f16;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            let xr = f16::from_f32(x).to_f32();
            f16::from_f32(gelu_tanh(xr)).to_f32() * u
        };
    }
}

/// `x += y`.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `x *= s` (ggml's `scale`).
pub fn scale(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

/// `x *= y`.
pub fn mul_assign(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a *= b;
    }
}

/// Log-sum-exp of a row, in f64 (for perplexity and `eval`).
pub fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut sum = 0.0f64;
    for &v in row {
        sum += libm::exp(v as f64 - max);
    }
    max + libm::log(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of every length to 2000 with magnitudes over 2^±40 (zeros, subnormals, huge
    /// values, infinities and NaNs among them): `mean_square` gives the in-order bits,
    /// and the lanes prove it for nearly every finite row (else they bring no speed).
    #[test]
    fn mean_square_is_the_in_order_mean() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut x = [0.0f32; 2000];
        let (mut rows, mut proved) = (0, 0);
        for round in 0..6000 {
            let n = 1 + (next() % 2000) as usize;
            let span = [0, 4, 20, 40][round % 4];
            for v in x[..n].iter_mut() {
                let r = next();
                let m = (r >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                let e = if span == 0 { 0 } else { (r % (2 * span + 1)) as i32 - span as i32 };
                *v = m * libm::exp2f(e as f32);
                match r % 997 {
                    0 => *v = 0.0,
                    1 => *v = f32::from_bits(1 + (r as u32 & 0xff)),
                    2 if round % 500 == 1 => *v = f32::MAX,
                    3 if round % 500 == 2 => *v = f32::NAN,
                    _ => {}
                }
            }
            let row = &x[..n];
            let want = mean_square_in_order(row);
            let got = mean_square(row);
            assert_eq!(got.to_bits(), want.to_bits(), "round {round}, {n} elements");
            if let Some(l) = mean_square_lanes(row) {
                assert_eq!(l.to_bits(), want.to_bits(), "round {round}: lanes proved a wrong mean");
            }
            if want.is_finite() {
                rows += 1;
                proved += usize::from(mean_square_lanes(row).is_some());
            }
        }
        assert!(proved * 1000 >= rows * 999, "the lanes proved {proved} of {rows} finite rows");
    }

    /// A mean exactly on an f32 rounding boundary (`(1 + 2^-24) / 2`, halfway between
    /// two f32 values) is not the lanes' to decide; the chain's ties-to-even decides.
    #[test]
    fn mean_square_on_a_boundary_takes_the_chain() {
        let x = [1.0f32, libm::exp2f(-12.0)];
        assert_eq!(mean_square_lanes(&x), None);
        assert_eq!(mean_square(&x).to_bits(), mean_square_in_order(&x).to_bits());
        assert_eq!(mean_square(&x), 0.5);
        assert_eq!(mean_square_lanes(&[]), None);
    }

    #[test]
    fn rms_norm_unit_weight() {
        let x = [3.0f32, 4.0];
        let mut w = [0u8; 8];
        w[..4].copy_from_slice(&1.0f32.to_le_bytes());
        w[4..].copy_from_slice(&2.0f32.to_le_bytes());
        let mut out = [0.0; 2];
        rms_norm(&x, &w, 0.0, &mut out);
        let r = libm::sqrtf(12.5);
        assert!((out[0] - 3.0 / r).abs() < 1e-6);
        assert!((out[1] - 8.0 / r).abs() < 1e-6);
    }

    /// Linear scaling by 1/4 at position 8 is plain RoPE at position 2, bit for bit
    /// (scaling by a power of two is exact); frequency factors of 2 likewise halve it.
    #[test]
    fn linear_scaling_and_freq_factors_scale_positions() {
        let (mut plain, mut scaled) = ([0.0f32; 32], [0.0f32; 32]);
        rope_angles(2, 10000.0, 32, &mut plain);
        let linear = RopeScale { freq_scale: 0.25, ..RopeScale::NONE };
        rope_angles_scaled(8, 10000.0, 32, &linear, None, &mut scaled);
        assert_eq!(plain.map(f32::to_bits), scaled.map(f32::to_bits));
        let twos = [2.0f32; 16].map(f32::to_le_bytes).concat();
        rope_angles(3, 10000.0, 32, &mut plain);
        rope_angles_scaled(6, 10000.0, 32, &RopeScale::NONE, Some(&twos), &mut scaled);
        assert_eq!(plain.map(f32::to_bits), scaled.map(f32::to_bits));
    }

    /// YaRN: the correction dims of ggml's formula; pairs below the low dim keep the
    /// extrapolated (unscaled) angle, pairs from the high dim on the interpolated one,
    /// all times the magnitude `1 + 0.1·ln 4`.
    #[test]
    fn yarn_ramps_between_extrapolation_and_interpolation() {
        assert_eq!(RopeScale::new(0.25, 1.0, 1.0, 32, 10000.0, 32, 32.0, 1.0).corr_dims, [0.0, 3.0]);
        assert_eq!(RopeScale::new(0.125, 1.0, 1.0, 32768, 1e6, 32, 32.0, 1.0).corr_dims, [5.0, 10.0]);
        let sc = RopeScale::new(0.25, 1.0, 1.0, 32768, 10000.0, 32, 32.0, 1.0);
        assert_eq!(sc.corr_dims, [8.0, 15.0]);
        let [low, high] = sc.corr_dims;
        assert!((sc.mscale - (1.0 + 0.1 * libm::logf(4.0))).abs() < 1e-6);
        let (mut scaled, mut extrap, mut interp) = ([0.0f32; 32], [0.0f32; 32], [0.0f32; 32]);
        rope_angles_scaled(40, 10000.0, 32, &sc, None, &mut scaled);
        rope_angles(40, 10000.0, 32, &mut extrap);
        rope_angles(10, 10000.0, 32, &mut interp);
        for i in 0..16 {
            let want = if (i as f32) <= low {
                extrap
            } else if (i as f32) >= high {
                interp
            } else {
                continue;
            };
            for j in [2 * i, 2 * i + 1] {
                assert_eq!(scaled[j].to_bits(), (want[j] * sc.mscale).to_bits(), "pair {i}");
            }
        }
    }

    #[test]
    fn rope_at_zero_is_identity_and_preserves_norm() {
        let mut cs = [0.0; 8];
        rope_angles(0, 10000.0, 8, &mut cs);
        let mut h = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let orig = h;
        rope_normal(&mut h, &cs, 8);
        assert_eq!(h, orig);
        rope_angles(17, 10000.0, 8, &mut cs);
        rope_neox(&mut h, &cs, 8);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = h.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-3);
        // First pair rotated by exactly pos radians.
        let (c, s) = (libm::cosf(17.0), libm::sinf(17.0));
        assert!((h[0] - (1.0 * c - 5.0 * s)).abs() < 1e-5);
    }

    #[test]
    fn lse_matches_direct() {
        let row = [0.5f32, -1.0, 2.0];
        let direct = libm::log(row.iter().map(|&v| libm::exp(v as f64)).sum::<f64>());
        assert!((log_sum_exp(&row) - direct).abs() < 1e-12);
    }
}

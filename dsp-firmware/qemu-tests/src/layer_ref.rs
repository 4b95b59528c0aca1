//! Scalar references for the layer ops, written from the op definitions with
//! Rust's `std` float functions (glibc underneath, not the firmware's `libm`):
//! where the firmware's rule is a fixed sequence of IEEE operations (RMSNorm,
//! RoPE from a table, add, mul, dequantization) the reference repeats it and
//! the test wants the same bits; where it uses exp/tanh/sin/cos, the reference
//! computes in f64 and the test states a tolerance ([`check_close`]).

use half::f16;

/// RMSNorm of one row (squares rounded to f32, summed in f64; `(x·scale)·w`).
pub fn rms_norm(x: &[f32], w: Option<&[f32]>, eps: f32) -> Vec<f32> {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    x.iter().enumerate().map(|(i, &v)| w.map_or(v * scale, |w| (v * scale) * w[i])).collect()
}

/// softmax(x · scale) in f64 (after the f32 product).
pub fn softmax(x: &[f32], scale: f32) -> Vec<f32> {
    let v: Vec<f32> = x.iter().map(|&a| a * scale).collect();
    let m = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = v.iter().map(|&a| ((a - m) as f64).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|&a| (a / s) as f32).collect()
}

/// `x / (1 + e^−x)` in f64.
pub fn silu(x: f32) -> f32 {
    let x = x as f64;
    (x / (1.0 + (-x).exp())) as f32
}

/// GELU, tanh approximation, in f64 (ggml's constants).
pub fn gelu(x: f32) -> f32 {
    let x = x as f64;
    let (c, a) = (0.797_884_6_f32 as f64, 0.044715_f32 as f64);
    (0.5 * x * (1.0 + (c * x * (1.0 + a * x * x)).tanh())) as f32
}

/// ggml's CPU GeGLU element: 0 at or below −10, `x·u` at or above 10, else
/// f16(gelu(f16(x))) · u.
pub fn geglu(x: f32, u: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x * u
    } else {
        let xr = f16::from_f32(x).to_f32();
        f16::from_f32(gelu(xr)).to_f32() * u
    }
}

/// The rotation keel's CPU reference uses: `(fma(x0, c, −x1·s), fma(x0, s, x1·c))`.
pub fn rotate(x0: f32, x1: f32, c: f32, s: f32) -> (f32, f32) {
    (x0.mul_add(c, -(x1 * s)), x0.mul_add(s, x1 * c))
}

/// RoPE of one head with a `(cos, sin)` table of `n_rot` values.
pub fn rope_head(head: &mut [f32], cs: &[f32], neox: bool) {
    let half = cs.len() / 2;
    for i in 0..half {
        let (a, b) = if neox { (i, i + half) } else { (2 * i, 2 * i + 1) };
        let (x0, x1) = rotate(head[a], head[b], cs[2 * i], cs[2 * i + 1]);
        head[a] = x0;
        head[b] = x1;
    }
}

/// `(cos, sin)` of `θ_i = pos · base^(−2i/n_rot)` (θ by repeated f32
/// multiplication as ggml does; sin and cos in f64, rounded).
pub fn rope_angles(pos: i32, base: f32, n_rot: usize) -> Vec<f32> {
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    let mut cs = Vec::with_capacity(n_rot);
    for _ in 0..n_rot / 2 {
        cs.push((theta as f64).cos() as f32);
        cs.push((theta as f64).sin() as f32);
        theta *= theta_scale;
    }
    cs
}

/// Attention of one query head over positions `0..n` (`k(j, i)`, `v(j, i)`),
/// softmax in f64 with two passes.
pub fn attend(q: &[f32], k: impl Fn(usize, usize) -> f32, v: impl Fn(usize, usize) -> f32, n: usize, scale: f32) -> Vec<f32> {
    let s: Vec<f64> = (0..n).map(|j| q.iter().enumerate().map(|(i, &qi)| qi as f64 * k(j, i) as f64).sum::<f64>() * scale as f64).collect();
    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|&x| (x - m).exp()).collect();
    let sum: f64 = e.iter().sum();
    (0..q.len()).map(|i| ((0..n).map(|j| e[j] * v(j, i) as f64).sum::<f64>() / sum) as f32).collect()
}

/// `x` rounded to binary16 and back.
fn f16r(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// `v` rounded once to binary16 (through binary32 by round to odd).
fn f16_once(v: f64) -> f32 {
    let r = v as f32;
    let r = if r as f64 == v || !r.is_finite() {
        r
    } else {
        f32::from_bits((if (r as f64).abs() > v.abs() { r.to_bits() - 1 } else { r.to_bits() }) | 1)
    };
    f16r(r)
}

/// Attention of one head over an F16 cache with keel's CPU arithmetic
/// (`keel_core::session::attention`, llama.cpp's x86 CPU flash attention; see
/// `keel_core::quant::f16ops`): q rounded to f16; K·Q in 64 fma lanes reduced as
/// AVX-512 does, the leftover `n % 64` products summed in f64; the value
/// accumulator in f16 (elements below `n − n % 128` by one f16 rounding of
/// `x·f16(vs) + acc`, the rest as `f16(fmaf(x, vs, acc))`); `S = fmaf(S, ms, vs)`.
/// `k`, `v` give f16 values (as f32).
pub fn attend_f16_cpu(q: &[f32], k: impl Fn(usize, usize) -> f32, v: impl Fn(usize, usize) -> f32, n: usize, scale: f32) -> Vec<f32> {
    let hd = q.len();
    let qh: Vec<f32> = q.iter().map(|&x| f16r(x)).collect();
    let (np_dot, np_acc) = (hd - hd % 64, hd - hd % 128);
    let mut acc = vec![0f32; hd];
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    for j in 0..n {
        let mut lanes = [0f32; 64];
        for i in (0..np_dot).step_by(64) {
            for (l, a) in lanes.iter_mut().enumerate() {
                *a = k(j, i + l).mul_add(qh[i + l], *a);
            }
        }
        let s16: Vec<f32> = (0..16).map(|l| (lanes[l] + lanes[32 + l]) + (lanes[16 + l] + lanes[48 + l])).collect();
        let t: Vec<f32> = (0..8).map(|i| s16[8 + i] + s16[i]).collect();
        let r4 = [t[4] + t[0], t[5] + t[1], t[6] + t[2], t[7] + t[3]];
        let mut dot = ((r4[0] + r4[2]) + (r4[1] + r4[3])) as f64;
        for i in np_dot..hd {
            dot += (k(j, i) * qh[i]) as f64;
        }
        let s = dot as f32 * scale;
        let (ms, vs) = if s > m {
            let ms = ((m - s) as f64).exp() as f32;
            m = s;
            for (i, a) in acc.iter_mut().enumerate() {
                *a = if i < np_acc { f16r(*a * f16r(ms)) } else { f16r(*a * ms) };
            }
            (ms, 1.0)
        } else {
            (1.0, ((s - m) as f64).exp() as f32)
        };
        for (i, a) in acc.iter_mut().enumerate() {
            let x = v(j, i);
            *a = if i < np_acc { f16_once((x as f64).mul_add(f16r(vs) as f64, *a as f64)) } else { f16r(x.mul_add(vs, *a)) };
        }
        sum = sum.mul_add(ms, vs);
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    acc.iter().map(|a| a * inv).collect()
}

/// Asserts `|got − want| ≤ rel·|want| + abs` element by element; returns the
/// largest error seen relative to that bound (≤ 1 when it passes).
pub fn check_close(got: &[f32], want: &[f32], rel: f32, abs: f32, what: &str) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = 0f32;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let bound = rel * w.abs() + abs;
        let err = (g - w).abs();
        assert!(err <= bound || (g.is_nan() && w.is_nan()) || g == w, "{what}: [{i}] {g} vs {w} (error {err:e}, bound {bound:e})");
        if bound > 0.0 {
            worst = worst.max(err / bound);
        }
    }
    worst
}

/// Asserts bit equality element by element.
pub fn check_exact(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: [{i}] {g} vs {w}");
    }
}

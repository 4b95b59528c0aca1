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

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

/// `out = x / sqrt(mean(x^2) + eps) * w` (w as raw little-endian f32 bytes).
///
/// The sum of squares is accumulated in f64 in index order, as ggml does.
pub fn rms_norm(x: &[f32], w: &[u8], eps: f32, out: &mut [f32]) {
    let mut sum = 0.0f64;
    for &v in x {
        sum += (v * v) as f64;
    }
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / libm::sqrtf(mean + eps);
    for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
        *o = (v * scale) * f32_at(w, i);
    }
}

/// Fills `cs` with interleaved `(cos, sin)` of the RoPE angles for position `pos`:
/// theta_i = pos * base^(-2i/n_rot), computed by repeated multiplication as ggml does.
pub fn rope_angles(pos: usize, base: f32, n_rot: usize, cs: &mut [f32]) {
    let theta_scale = libm::powf(base, -2.0 / n_rot as f32);
    let mut theta = pos as f32;
    for i in 0..n_rot / 2 {
        cs[2 * i] = libm::cosf(theta);
        cs[2 * i + 1] = libm::sinf(theta);
        theta *= theta_scale;
    }
}

/// Rotates adjacent pairs `(2i, 2i+1)` of the first `n_rot` dims of one head.
pub fn rope_normal(head: &mut [f32], cs: &[f32], n_rot: usize) {
    for i in 0..n_rot / 2 {
        let (c, s) = (cs[2 * i], cs[2 * i + 1]);
        let (x0, x1) = (head[2 * i], head[2 * i + 1]);
        head[2 * i] = x0 * c - x1 * s;
        head[2 * i + 1] = x0 * s + x1 * c;
    }
}

/// Rotates pairs `(i, i + n_rot/2)` of the first `n_rot` dims of one head (NeoX style).
pub fn rope_neox(head: &mut [f32], cs: &[f32], n_rot: usize) {
    let half = n_rot / 2;
    for i in 0..half {
        let (c, s) = (cs[2 * i], cs[2 * i + 1]);
        let (x0, x1) = (head[i], head[i + half]);
        head[i] = x0 * c - x1 * s;
        head[i + half] = x0 * s + x1 * c;
    }
}

/// SiLU: `x * sigmoid(x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + libm::expf(-x))
}

/// `gate[i] = silu(gate[i]) * up[i]` (SwiGLU).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// `x += y`.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
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

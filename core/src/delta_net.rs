//! The gated delta rule (Qwen 3.5's linear-attention layers), token by token and chunked.
//!
//! Per value head, with a `d x d` state `S` (keys index rows, values index columns),
//! decay `a_t = exp(g_t)` (`g_t <= 0`), write strength `beta_t`, and L2-normalized `q_t`,
//! `k_t`:
//!
//! ```text
//! S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T
//! o_t = scale * S_t^T q_t
//! ```
//!
//! [`step`] is the recurrence as llama.cpp's fused CPU op computes it (state stored
//! transposed, `m[j*d + i] = S[i][j]`; decay, then `delta = (v - S^T k) * beta`, then the
//! rank-1 update, then the output; every sum sequential with fma). Decoding and keel's
//! default prompt path use it, so a position's output does not depend on batching.
//!
//! [`chunk`] computes the same outputs and final state for a run of tokens with matrix
//! products (the WY form): with cumulative log-decays `G_t`,
//! `u_t = beta_t (v_t - e^{G_t} S_0^T k_t - sum_{s<t} e^{G_t - G_s} (k_s.k_t) u_s)`,
//! `o_t = scale (e^{G_t} S_0^T q_t + sum_{s<=t} e^{G_t - G_s} (k_s.q_t) u_s)` and
//! `S_C = e^{G_C} S_0 + sum_s e^{G_C - G_s} k_s u_s^T`. Every decay ratio is <= 1, so
//! nothing grows. It agrees with [`step`] to float rounding (tested to 1e-5 relative).

use crate::fused::fmaf;

use crate::ops;

/// `sum x[i]*y[i]` in index order with fma (ggml's scalar tail, as GCC contracts it).
#[inline]
pub fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for (a, b) in x.iter().zip(y) {
        s = fmaf(*a, *b, s);
    }
    s
}

/// `x / sqrt(sum(x^2) + eps)` in place, computed as ggml's `rms_norm(x, eps/n) / sqrt(n)`.
pub fn l2_norm(x: &mut [f32], eps: f32) {
    let n = x.len();
    let mut sum = 0.0f64;
    for &v in x.iter() {
        sum += (v * v) as f64;
    }
    let mean = (sum / n as f64) as f32;
    let scale = 1.0 / libm::sqrtf(mean + eps / n as f32);
    let post = 1.0 / libm::sqrtf(n as f32);
    for v in x.iter_mut() {
        *v = (*v * scale) * post;
    }
}

/// The gates of `beta.len() / n_heads` tokens, `n_heads` value heads each, in place:
/// `beta = sigmoid(beta)` and `alpha = softplus(alpha + dt_bias[h]) · a[h]` (the log-decay
/// `g` of [`step`]); `dt_bias` and `a` are raw little-endian f32 rows of `n_heads`.
pub fn gates(beta: &mut [f32], alpha: &mut [f32], dt_bias: &[u8], a: &[u8], n_heads: usize) {
    for (b, al) in beta.chunks_exact_mut(n_heads).zip(alpha.chunks_exact_mut(n_heads)) {
        for h in 0..n_heads {
            b[h] = ops::sigmoid(b[h]);
            let ab = al[h] + ops::f32_at(dt_bias, h);
            al[h] = ops::softplus(ab) * ops::f32_at(a, h);
        }
    }
}

/// One channel of the causal depthwise conv1d + SiLU over `[state | x]`, for `n` new
/// inputs: with `k = state.len() + 1` taps `w` (raw little-endian f32), output `i` is
/// `silu(Σ_t input(i + t)·w[t])` (fma in tap order) where `input(j)` is `state[j]` for
/// `j < k - 1`, else new input `j - (k - 1)`; then `state` becomes the last `k - 1` of
/// `[state | x]`. Input `i` is `x[i·x_stride]`, output `i` goes to `out[i·out_stride]`.
pub fn conv_channel(state: &mut [f32], x: &[f32], x_stride: usize, w: &[u8], out: &mut [f32], out_stride: usize, n: usize) {
    let k1 = state.len();
    let input = |state: &[f32], j: usize| if j < k1 { state[j] } else { x[(j - k1) * x_stride] };
    for i in 0..n {
        let mut sum = 0.0f32;
        for t in 0..=k1 {
            sum = fmaf(input(state, i + t), ops::f32_at(w, t), sum);
        }
        out[i * out_stride] = ops::silu(sum);
    }
    // The new state: the last k-1 of [state | inputs].
    if n >= k1 {
        for (j, s) in state.iter_mut().enumerate() {
            *s = x[(n - k1 + j) * x_stride];
        }
    } else {
        state.copy_within(n.., 0);
        for j in 0..n {
            state[k1 - n + j] = x[j * x_stride];
        }
    }
}

/// The gated output norm of one head, in place: `rms_norm(o)·w·silu(z)` (`w` raw
/// little-endian f32).
pub fn gated_norm(o: &mut [f32], z: &[f32], w: &[u8], eps: f32) {
    ops::rms_norm_in_place(o, w, eps);
    for (v, &z) in o.iter_mut().zip(z) {
        *v *= ops::silu(z);
    }
}

/// One token of one head. `m` is the transposed state (`d*d`), `delta` scratch (`d`).
#[allow(clippy::too_many_arguments)]
pub fn step(m: &mut [f32], q: &[f32], k: &[f32], v: &[f32], g: f32, beta: f32, scale: f32, delta: &mut [f32], out: &mut [f32]) {
    let d = k.len();
    let decay = crate::ops::expf(g);
    for x in m.iter_mut() {
        *x *= decay;
    }
    for j in 0..d {
        let s = dot(&m[j * d..(j + 1) * d], k);
        delta[j] = (v[j] - s) * beta;
    }
    for j in 0..d {
        let dj = delta[j];
        for (mi, &ki) in m[j * d..(j + 1) * d].iter_mut().zip(k) {
            *mi = fmaf(ki, dj, *mi);
        }
    }
    for j in 0..d {
        out[j] = dot(&m[j * d..(j + 1) * d], q) * scale;
    }
}

/// Scratch floats [`chunk`] needs for `c` tokens of head width `d`.
pub fn chunk_scratch_len(c: usize, d: usize) -> usize {
    c * c + c * d + c
}

/// The tokens of one chunk for one head: `c` rows each of `q`, `k` (width `d`, given with
/// row stride `qk_stride`), `v` and `out` (width `d`, row strides `v_stride`, `out_stride`), gates `g`
/// and `beta` (stride `gb_stride`); `out` rows have stride `out_stride`. Updates the transposed state `m` as `c` calls of
/// [`step`] would.
#[allow(clippy::too_many_arguments)]
pub fn chunk(
    m: &mut [f32],
    q: &[f32],
    k: &[f32],
    qk_stride: usize,
    v: &[f32],
    v_stride: usize,
    out: &mut [f32],
    out_stride: usize,
    g: &[f32],
    beta: &[f32],
    gb_stride: usize,
    c: usize,
    d: usize,
    scale: f32,
    scratch: &mut [f32],
) {
    let (kk, rest) = scratch.split_at_mut(c * c);
    let (u, rest) = rest.split_at_mut(c * d);
    let cum = &mut rest[..c];
    let kr = |t: usize| &k[t * qk_stride..t * qk_stride + d];
    let qr = |t: usize| &q[t * qk_stride..t * qk_stride + d];
    // Cumulative log-decay G_t (inclusive).
    let mut acc = 0.0f32;
    for t in 0..c {
        acc += g[t * gb_stride];
        cum[t] = acc;
    }
    // kk[t*c + s] = e^{G_t - G_s} (k_s . k_t) for s < t.
    for t in 0..c {
        for s in 0..t {
            kk[t * c + s] = crate::ops::expf(cum[t] - cum[s]) * dot(kr(s), kr(t));
        }
    }
    // u_t = beta_t (v_t - e^{G_t} S0^T k_t - sum_{s<t} kk[t][s] u_s), forward substitution.
    for t in 0..c {
        let et = crate::ops::expf(cum[t]);
        let b = beta[t * gb_stride];
        for j in 0..d {
            let mut x = v[t * v_stride + j] - et * dot(&m[j * d..(j + 1) * d], kr(t));
            for s in 0..t {
                x -= kk[t * c + s] * u[s * d + j];
            }
            u[t * d + j] = b * x;
        }
    }
    // o_t = scale (e^{G_t} S0^T q_t + sum_{s<=t} e^{G_t - G_s} (k_s . q_t) u_s).
    for t in 0..c {
        let et = crate::ops::expf(cum[t]);
        let o = &mut out[t * out_stride..t * out_stride + d];
        for j in 0..d {
            o[j] = et * dot(&m[j * d..(j + 1) * d], qr(t));
        }
        for s in 0..=t {
            let w = crate::ops::expf(cum[t] - cum[s]) * dot(kr(s), qr(t));
            for j in 0..d {
                o[j] = fmaf(w, u[s * d + j], o[j]);
            }
        }
        for x in o.iter_mut() {
            *x *= scale;
        }
    }
    // S_C = e^{G_C} S0 + sum_s e^{G_C - G_s} k_s u_s^T (transposed: m[j][i] += w k_s[i] u_s[j]).
    let last = cum[c - 1];
    let ec = crate::ops::expf(last);
    for x in m.iter_mut() {
        *x *= ec;
    }
    for s in 0..c {
        let w = crate::ops::expf(last - cum[s]);
        let ks = kr(s);
        for j in 0..d {
            let f = w * u[s * d + j];
            for (mi, &ki) in m[j * d..(j + 1) * d].iter_mut().zip(ks) {
                *mi = fmaf(ki, f, *mi);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    /// Chunked and token-by-token forms give the same outputs and state (1e-5 relative).
    #[test]
    fn chunked_equals_token_by_token() {
        const D: usize = 32;
        const T: usize = 100;
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        let mut q = [0.0f32; T * D];
        let mut k = [0.0f32; T * D];
        let mut v = [0.0f32; T * D];
        let mut g = [0.0f32; T];
        let mut beta = [0.0f32; T];
        for t in 0..T {
            for i in 0..D {
                q[t * D + i] = r.next();
                k[t * D + i] = r.next();
                v[t * D + i] = r.next();
            }
            l2_norm(&mut q[t * D..(t + 1) * D], 1e-6);
            l2_norm(&mut k[t * D..(t + 1) * D], 1e-6);
            g[t] = -(r.next() + 1.0) * 0.3; // decay in (e^-0.6, 1]
            beta[t] = 1.0 / (1.0 + libm::expf(-2.0 * r.next()));
        }
        let mut s0 = [0.0f32; D * D];
        for x in s0.iter_mut() {
            *x = r.next() * 0.1;
        }
        let scale = 1.0 / libm::sqrtf(D as f32);

        let mut m1 = s0;
        let mut o1 = [0.0f32; T * D];
        let mut delta = [0.0f32; D];
        for t in 0..T {
            let (a, b) = (t * D, (t + 1) * D);
            step(&mut m1, &q[a..b], &k[a..b], &v[a..b], g[t], beta[t], scale, &mut delta, &mut o1[a..b]);
        }

        for c in [1usize, 7, 16, 64] {
            let mut m2 = s0;
            let mut o2 = [0.0f32; T * D];
            let mut scratch = [0.0f32; 64 * 64 + 64 * D + 64];
            let mut t0 = 0;
            while t0 < T {
                let n = c.min(T - t0);
                let (a, b) = (t0 * D, T * D);
                chunk(&mut m2, &q[a..b], &k[a..b], D, &v[a..b], D, &mut o2[a..b], D, &g[t0..], &beta[t0..], 1, n, D, scale, &mut scratch);
                t0 += n;
            }
            let rel = |x: &[f32], y: &[f32]| {
                let num: f32 = x.iter().zip(y).map(|(a, b)| (a - b) * (a - b)).sum();
                let den: f32 = x.iter().map(|a| a * a).sum();
                libm::sqrtf(num / den)
            };
            let (ro, rs) = (rel(&o1, &o2), rel(&m1, &m2));
            assert!(ro < 1e-5 && rs < 1e-5, "chunk {c}: output rel err {ro}, state rel err {rs}");
            // And element-wise, for every output.
            for (i, (a, b)) in o1.iter().zip(&o2).enumerate() {
                assert!((a - b).abs() <= 1e-5 * a.abs().max(1e-2), "chunk {c}: out[{i}] {a} vs {b}");
            }
        }
    }

    #[test]
    fn l2_norm_gives_unit_vectors() {
        let mut x = [3.0f32, 4.0];
        l2_norm(&mut x, 0.0);
        assert!((x[0] - 0.6).abs() < 1e-6 && (x[1] - 0.8).abs() < 1e-6);
    }
}

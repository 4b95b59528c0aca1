//! Rotary position embedding of one head in place, from a `(cos, sin)` table
//! (the host's, or [`angles`]'): pair `i` uses `cs[2i]`, `cs[2i + 1]`.

use libm::fmaf;

/// Fills `cs` (`n_rot` values) with interleaved `(cos θ_i, sin θ_i)` for position
/// `pos`: `θ_i = pos · base^(−2i/n_rot)` by repeated f32 multiplication from
/// `pos` (ggml's order), sin and cos by [`super::math::sincosf`].
pub fn angles(pos: i32, base: f32, cs: &mut [f32]) {
    let n_rot = cs.len();
    let theta_scale = libm::powf(base, -2.0 / n_rot as f32);
    let mut theta = pos as f32;
    for pair in cs.chunks_exact_mut(2) {
        let (s, c) = super::math::sincosf(theta);
        pair[0] = c;
        pair[1] = s;
        theta *= theta_scale;
    }
}

/// One rotation as keel's CPU reference rounds it (llama.cpp's compiled x86 code
/// contracts each expression into one fma): `(fma(x0, c, −(x1·s)), fma(x0, s, x1·c))`.
#[inline]
fn rotate(x0: f32, x1: f32, c: f32, s: f32) -> (f32, f32) {
    (fmaf(x0, c, -(x1 * s)), fmaf(x0, s, x1 * c))
}

/// Rotates adjacent pairs `(2i, 2i+1)` of the first `cs.len()` dims (ggml mode 0).
pub fn normal(head: &mut [f32], cs: &[f32]) {
    for (i, p) in cs.chunks_exact(2).enumerate() {
        let (x0, x1) = rotate(head[2 * i], head[2 * i + 1], p[0], p[1]);
        head[2 * i] = x0;
        head[2 * i + 1] = x1;
    }
}

/// Rotates pairs `(i, i + n_rot/2)` of the first `n_rot = cs.len()` dims (NeoX, mode 2).
pub fn neox(head: &mut [f32], cs: &[f32]) {
    let half = cs.len() / 2;
    for (i, p) in cs.chunks_exact(2).enumerate() {
        let (x0, x1) = rotate(head[i], head[i + half], p[0], p[1]);
        head[i] = x0;
        head[i + half] = x1;
    }
}

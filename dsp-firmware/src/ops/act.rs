//! Element-wise activations and products, in place on the first operand.

use keel_npu_hal::f16::{f16_to_f32, f32_to_f16};

use super::math::{gelu_tanh, silu};

/// `x = silu(x)`.
pub fn silu_in_place(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = silu(*v));
}

/// `x = gelu(x)` (tanh approximation).
pub fn gelu_in_place(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = gelu_tanh(*v));
}

/// `g = silu(g) · u` (SwiGLU, llama.cpp's `ggml_vec_swiglu_f32`).
pub fn swiglu(g: &mut [f32], u: &[f32]) {
    g.iter_mut().zip(u).for_each(|(g, &u)| *g = silu(*g) * u);
}

/// `g = gelu(g) · u` (GeGLU) as ggml's CPU `geglu` and keel's CPU reference:
/// 0 at or below −10, `g · u` at or above 10, else GELU of the input rounded to
/// f16, itself rounded to f16 (the values of ggml's f16 table), times `u`.
pub fn geglu(g: &mut [f32], u: &[f32]) {
    for (g, &u) in g.iter_mut().zip(u) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            f16_to_f32(f32_to_f16(gelu_tanh(f16_to_f32(f32_to_f16(x))))) * u
        };
    }
}

/// `x += y`, `y` repeated over `x` (its length divides `x`'s).
pub fn add(x: &mut [f32], y: &[f32]) {
    x.chunks_mut(y.len()).for_each(|row| row.iter_mut().zip(y).for_each(|(a, &b)| *a += b));
}

/// `x *= y`, `y` repeated over `x` (its length divides `x`'s).
pub fn mul(x: &mut [f32], y: &[f32]) {
    x.chunks_mut(y.len()).for_each(|row| row.iter_mut().zip(y).for_each(|(a, &b)| *a *= b));
}

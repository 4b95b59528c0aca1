//! Row normalisations.

/// `x = x / sqrt(mean(x²) + eps)`, then `· w[i]` if `w` is given, in place:
/// the squares (rounded to f32) summed in f64 in index order, the mean rounded
/// to f32, `scale = 1 / sqrtf(mean + eps)`, `x · scale` then `· w` (ggml's and
/// keel's CPU order).
pub fn rms_norm(x: &mut [f32], w: Option<&[f32]>, eps: f32) {
    let mut sum = 0.0f64;
    for &v in x.iter() {
        sum += (v * v) as f64;
    }
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / libm::sqrtf(mean + eps);
    match w {
        Some(w) => x.iter_mut().zip(w).for_each(|(v, &w)| *v = (*v * scale) * w),
        None => x.iter_mut().for_each(|v| *v *= scale),
    }
}

/// `x = softmax(x · scale)`, in place: `m = max(x·scale)`, `e = expf(x·scale − m)`,
/// the sum in f64 in index order, then `e · (1/sum)` (the reciprocal rounded to f32).
pub fn softmax(x: &mut [f32], scale: f32) {
    let mut m = f32::NEG_INFINITY;
    for v in x.iter_mut() {
        *v *= scale;
        m = m.max(*v);
    }
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = super::math::expf(*v - m);
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

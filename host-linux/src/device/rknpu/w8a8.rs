//! keel's W8A8 scheme for the RK3588 NPU and an exact CPU emulation of its integer
//! arithmetic, so accuracy is measured without a board.
//!
//! Scheme: a product `y = W·x` (W: rows × cols) runs as int8 × int8 with int32
//! accumulation (the NPU's convolution MACs; the DPU's scaling stages bypassed, int32
//! outputs) and the scales applied on the CPU:
//! - optional randomized Hadamard rotation of the inner dimension, folded into the weights
//!   at load: `W·x = (W·Rᵀ)·(R·x)` with `R = blockdiag(H_b)·D/√b` (D random signs, `b` the
//!   largest power of two dividing `cols`, H_b Sylvester's Hadamard matrix); activations are
//!   rotated the same way on the CPU before quantizing. Rotation spreads outliers so that
//!   8-bit grids lose less;
//! - weights: symmetric int8, one scale per output channel (or one per tensor);
//! - activations: symmetric int8, one scale per token (row) (or one per batch);
//! - residual int8 weights (a second matrix for the first one's rounding error) and
//!   residual int8 activations (a second row per token for its rounding error): four int8
//!   products per matrix product, the default, since the plain product alone is about as
//!   far from keel's CPU path again as the CPU path is from the exact product
//!   ([`Scheme::with_products`]: 1, 2 or 4);
//! - `y[r] = f32(Σ_k qx[k]·qw[r][k]) · sx · sw[r]` (then `+=` the residual products' terms
//!   in the order of [`matmul`]): each sum is exact in int32 (|sum| ≤
//!   cols·127² < 2³¹ for cols < 133 000), so the emulation equals what the NPU computes,
//!   whatever the tiling (integer sums do not depend on order).
//!
//! [`Emu`] is the scheme as a placement target ([`DeviceInfo`] + [`Offload`]): every
//! matrix product keel-core places on it runs through the emulation.

use keel_core::ggml_type::GgmlType;
use keel_core::model::{Model, Tensor};
use keel_core::placement::{for_each_weight, DeviceFailed, DeviceInfo, Offload, Placement, WeightId};
use keel_core::quant::Kernels;
use std::collections::HashMap;

/// The scheme's choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheme {
    /// Randomized Hadamard rotation of the inner dimension.
    pub rotate: bool,
    /// Per-output-channel weight scales and per-token activation scales (else one scale per
    /// weight tensor and one per batch).
    pub fine: bool,
    /// A second int8 weight matrix for the first one's rounding error (twice the MACs).
    pub residual: bool,
    /// A second int8 activation row per token for the first one's rounding error (twice
    /// the rows).
    pub x_residual: bool,
    /// Seed of the rotation's random signs.
    pub seed: u64,
}

/// Int8 products per matrix product the device's default scheme runs: the residual
/// weights and the residual activations (see [`Scheme::with_products`]).
pub const DEFAULT_PRODUCTS: u32 = 4;

impl Default for Scheme {
    /// The device's scheme: rotation, per-channel weights, per-token activations, and
    /// [`DEFAULT_PRODUCTS`] int8 products (the plain W8A8 product alone misses the
    /// accuracy bar: BENCHMARKS.md, "RK3588 NPU: accuracy").
    fn default() -> Scheme {
        Scheme { rotate: true, fine: true, residual: true, x_residual: true, seed: 0x6b65656c }
    }
}

impl Scheme {
    /// The default scheme with `n` int8 products per matrix product: 1 (plain W8A8), 2
    /// (plus residual weights: N more output channels) or 4 (plus residual activations:
    /// M more rows, against both weight matrices). `None` for any other `n`.
    pub fn with_products(n: u32) -> Option<Scheme> {
        let (residual, x_residual) = match n {
            1 => (false, false),
            2 => (true, false),
            4 => (true, true),
            _ => return None,
        };
        Some(Scheme { residual, x_residual, ..Scheme::default() })
    }

    /// Int8 products per matrix product (1, 2 or 4).
    pub fn products(&self) -> u32 {
        (1 + u32::from(self.residual)) * (1 + u32::from(self.x_residual))
    }
}

/// The largest power of two dividing `n` (the rotation's block).
pub fn block(n: usize) -> usize {
    if n == 0 {
        1
    } else {
        1 << n.trailing_zeros()
    }
}

/// ±1 signs for a rotation of width `n` (splitmix64 of `seed`).
pub fn signs(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            if (z ^ (z >> 31)) & 1 == 0 {
                1.0
            } else {
                -1.0
            }
        })
        .collect()
}

/// `x ← (C_m ⊗ H_b)·D·x / √b` in place, an orthogonal map: random signs, Sylvester
/// Hadamard transforms of each block of `b` (the largest power of two dividing the width),
/// then, when there are `m > 1` blocks, an orthonormal DCT-II across the blocks (so that an
/// outlier spreads over the whole width, not only its block).
pub fn rotate(x: &mut [f32], signs: &[f32]) {
    let b = block(x.len());
    let m = x.len() / b.max(1);
    let norm = 1.0 / (b as f32).sqrt();
    for (v, s) in x.iter_mut().zip(signs) {
        *v *= s;
    }
    for chunk in x.chunks_exact_mut(b) {
        let mut h = 1;
        while h < b {
            for i in (0..b).step_by(2 * h) {
                for j in i..i + h {
                    let (a, c) = (chunk[j], chunk[j + h]);
                    chunk[j] = a + c;
                    chunk[j + h] = a - c;
                }
            }
            h *= 2;
        }
        for v in chunk.iter_mut() {
            *v *= norm;
        }
    }
    if m > 1 {
        let dct = dct_matrix(m);
        let mut col = vec![0f32; m];
        for j in 0..b {
            for (i, c) in col.iter_mut().enumerate() {
                *c = x[i * b + j];
            }
            for i in 0..m {
                x[i * b + j] = (0..m).map(|k| dct[i * m + k] * col[k]).sum();
            }
        }
    }
}

/// The orthonormal DCT-II matrix of size `m` (row `i`: frequency `i`).
fn dct_matrix(m: usize) -> Vec<f32> {
    let mut d = vec![0f32; m * m];
    for i in 0..m {
        let a = if i == 0 { (1.0 / m as f64).sqrt() } else { (2.0 / m as f64).sqrt() };
        for k in 0..m {
            d[i * m + k] = (a * (std::f64::consts::PI * (2 * k + 1) as f64 * i as f64 / (2 * m) as f64).cos()) as f32;
        }
    }
    d
}

/// Symmetric int8 of `x` with scale `s` (round half away from zero, clamp ±127).
fn q8(x: f32, inv: f32) -> i8 {
    (x * inv).round().clamp(-127.0, 127.0) as i8
}

/// Scale for values whose largest magnitude is `amax`.
fn scale(amax: f32) -> f32 {
    if amax > 0.0 {
        amax / 127.0
    } else {
        1.0
    }
}

/// A weight as the NPU holds it: int8 rows and their scales.
pub struct QMatrix {
    /// Output channels, inner dimension.
    pub rows: usize,
    /// Inner dimension.
    pub cols: usize,
    /// `rows × cols` int8.
    pub q: Vec<i8>,
    /// One scale per row.
    pub scale: Vec<f32>,
    /// The residual's int8 values and scales (empty without the residual).
    pub q2: Vec<i8>,
    /// Scales of the residual.
    pub scale2: Vec<f32>,
}

impl QMatrix {
    /// Quantizes `w` (rows × cols f32, already rotated if the scheme rotates): one scale
    /// per row (`fine`) or per tensor, from the largest magnitude. With `residual`, a second
    /// int8 matrix holds what the first misses (`w ≈ s·q + s₂·q₂`): the NPU runs it as N
    /// more output channels of the same product, the CPU adds the two int32 results scaled.
    pub fn new(w: &[f32], rows: usize, cols: usize, fine: bool, residual: bool) -> QMatrix {
        let (q, scale) = quantize(w, rows, cols, fine);
        let (q2, scale2) = if residual {
            let mut r = w.to_vec();
            for (i, v) in r.iter_mut().enumerate() {
                *v -= f32::from(q[i]) * scale[i / cols];
            }
            quantize(&r, rows, cols, fine)
        } else {
            (Vec::new(), Vec::new())
        };
        QMatrix { rows, cols, q, scale, q2, scale2 }
    }
}

/// Symmetric int8 of one row with its own scale (the per-token rule): `q` gets the
/// values, the scale is returned. [`quantize`] with `fine` is this, row by row.
pub fn quantize_row(x: &[f32], q: &mut [i8]) -> f32 {
    let s = scale(x.iter().fold(0f32, |m, v| m.max(v.abs())));
    let inv = 1.0 / s;
    for (d, &v) in q.iter_mut().zip(x) {
        *d = q8(v, inv);
    }
    s
}

/// Symmetric int8 of a `rows × cols` matrix: values and per-row scales.
fn quantize(w: &[f32], rows: usize, cols: usize, fine: bool) -> (Vec<i8>, Vec<f32>) {
    let amax_row = |r: usize| w[r * cols..(r + 1) * cols].iter().fold(0f32, |m, v| m.max(v.abs()));
    let scales: Vec<f32> = if fine {
        (0..rows).map(|r| scale(amax_row(r))).collect()
    } else {
        vec![scale((0..rows).map(amax_row).fold(0f32, f32::max)); rows]
    };
    let mut q = vec![0i8; rows * cols];
    for r in 0..rows {
        let inv = 1.0 / scales[r];
        for (d, &v) in q[r * cols..(r + 1) * cols].iter_mut().zip(&w[r * cols..(r + 1) * cols]) {
            *d = q8(v, inv);
        }
    }
    (q, scales)
}

/// The NPU's integer dot product: exact int32.
pub fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    a.iter().zip(b).map(|(&x, &y)| i32::from(x) * i32::from(y)).sum()
}

/// `out[i·rows + r] = Σ_k W[r,k]·x[i·cols + k]` through the scheme: `x` is rotated (when
/// `signs` is given) and quantized per row (or per batch), multiplied in int8 with int32
/// sums, then scaled. `threads` splits the output rows.
pub fn matmul(w: &QMatrix, signs: Option<&[f32]>, fine: bool, x_residual: bool, x: &[f32], n: usize, out: &mut [f32], threads: usize) {
    let (rows, cols) = (w.rows, w.cols);
    let mut xr = x[..n * cols].to_vec();
    if let Some(s) = signs {
        for row in xr.chunks_exact_mut(cols) {
            rotate(row, s);
        }
    }
    let (qx, sx) = quantize(&xr, n, cols, fine);
    // With an activation residual, the rows' rounding errors go as M more rows.
    let (qx2, sx2) = if x_residual {
        let mut r = xr.clone();
        for (j, v) in r.iter_mut().enumerate() {
            *v -= f32::from(qx[j]) * sx[j / cols];
        }
        quantize(&r, n, cols, true)
    } else {
        (Vec::new(), Vec::new())
    };
    // Output rows split across threads; each thread writes its own rows of every token.
    let t = threads.clamp(1, rows.max(1));
    let per = rows.div_ceil(t);
    let mut parts: Vec<Vec<f32>> = vec![Vec::new(); t];
    std::thread::scope(|sc| {
        for (ti, part) in parts.iter_mut().enumerate() {
            let (qx, sx, qx2, sx2) = (&qx, &sx, &qx2, &sx2);
            sc.spawn(move || {
                let (r0, r1) = (ti * per, ((ti + 1) * per).min(rows));
                part.resize(n * r1.saturating_sub(r0), 0.0);
                for i in 0..n {
                    let xi = &qx[i * cols..(i + 1) * cols];
                    for r in r0..r1 {
                        let acc = dot_i8(xi, &w.q[r * cols..(r + 1) * cols]);
                        let mut y = acc as f32 * (sx[i] * w.scale[r]);
                        if !w.q2.is_empty() {
                            y += dot_i8(xi, &w.q2[r * cols..(r + 1) * cols]) as f32 * (sx[i] * w.scale2[r]);
                        }
                        if !qx2.is_empty() {
                            let x2 = &qx2[i * cols..(i + 1) * cols];
                            y += dot_i8(x2, &w.q[r * cols..(r + 1) * cols]) as f32 * (sx2[i] * w.scale[r]);
                            if !w.q2.is_empty() {
                                y += dot_i8(x2, &w.q2[r * cols..(r + 1) * cols]) as f32 * (sx2[i] * w.scale2[r]);
                            }
                        }
                        part[i * (r1 - r0) + (r - r0)] = y;
                    }
                }
            });
        }
    });
    for (ti, part) in parts.iter().enumerate() {
        let (r0, r1) = (ti * per, ((ti + 1) * per).min(rows));
        for i in 0..n {
            out[i * rows + r0..i * rows + r1].copy_from_slice(&part[i * (r1 - r0)..(i + 1) * (r1 - r0)]);
        }
    }
}

/// [`Emu::exact`]'s product: rotated f32 weights `w` (rows × cols) times the rotated f32
/// activations, each output summed in f64.
fn exact_matmul(w: &[f32], rows: usize, cols: usize, signs: Option<&[f32]>, x: &[f32], n: usize, out: &mut [f32]) {
    let mut xr = vec![0f32; cols];
    for i in 0..n {
        xr.copy_from_slice(&x[i * cols..(i + 1) * cols]);
        if let Some(s) = signs {
            rotate(&mut xr, s);
        }
        for (r, o) in out[i * rows..(i + 1) * rows].iter_mut().enumerate() {
            *o = w[r * cols..(r + 1) * cols].iter().zip(&xr).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() as f32;
        }
    }
}

/// The scheme as a placement target: every product placed on it runs through [`matmul`].
pub struct Emu {
    /// The scheme.
    pub scheme: Scheme,
    /// Threads for a product.
    pub threads: usize,
    weights: Vec<(WeightId, QMatrix)>,
    /// With [`Emu::exact`]: each weight's rotated f32 rows, beside `weights`.
    exact: Option<Vec<Vec<f32>>>,
    signs: HashMap<usize, Vec<f32>>,
}

impl Emu {
    /// An empty emulated NPU.
    pub fn new(scheme: Scheme, threads: usize) -> Emu {
        Emu { scheme, threads, weights: Vec::new(), exact: None, signs: HashMap::new() }
    }

    /// A diagnostic, not a scheme: the products without any int8 rounding (the rotated f32
    /// weights times the rotated f32 activations, summed in f64), so the KL it gives is
    /// how far keel's CPU path itself (its 8-bit activation blocks) is from the exact
    /// product over the same weights: the floor under every scheme's figure.
    pub fn exact(scheme: Scheme, threads: usize) -> Emu {
        Emu { exact: Some(Vec::new()), ..Emu::new(scheme, threads) }
    }

    /// Converts every weight `placement` puts on device 0: dequantized (through the
    /// decision's device type when the placement converts it), rotated, quantized.
    pub fn load(&mut self, model: &Model<'_>, placement: &Placement<'_>, kernels: &Kernels) -> Result<(), String> {
        let mut err = None;
        for_each_weight(model, |id, t: &Tensor<'_>| {
            let Some(d) = placement.decision(id).filter(|d| d.place == keel_core::placement::Where::Device(0)) else { return };
            if err.is_some() {
                return;
            }
            // A weight the placement converts (as the `rknpu` device's engine does for types
            // other than Q8_0) goes through that type first: what the device holds.
            let mut conv = vec![0u8; if d.converted() { d.device_ty.row_bytes(t.cols as u64).unwrap_or(0) as usize } else { 0 }];
            let mut w = vec![0f32; t.rows * t.cols];
            for r in 0..t.rows {
                let row = &mut w[r * t.cols..(r + 1) * t.cols];
                let mut r = kernels.dequantize_row(t.ty, t.row(r), row);
                if d.converted() && r.is_ok() {
                    r = keel_core::quant::quantize_row_ref(d.device_ty, row, &mut conv).and_then(|_| kernels.dequantize_row(d.device_ty, &conv, row));
                }
                if let Err(e) = r {
                    err = Some(format!("{id:?}: {e:?}"));
                    return;
                }
            }
            if self.scheme.rotate {
                let s = self.signs.entry(t.cols).or_insert_with(|| signs(t.cols, self.scheme.seed ^ t.cols as u64));
                for row in w.chunks_exact_mut(t.cols) {
                    rotate(row, s);
                }
            }
            self.weights.push((id, QMatrix::new(&w, t.rows, t.cols, self.scheme.fine, self.scheme.residual)));
            if let Some(e) = &mut self.exact {
                e.push(w);
            }
        });
        err.map_or(Ok(()), Err)
    }

    /// Weights held.
    pub fn n_weights(&self) -> usize {
        self.weights.len()
    }
}

impl DeviceInfo for Emu {
    /// Like the `rknpu` device, Q8_0 weights only: the placement converts other types
    /// to Q8_0 first (its default `convert_to`), so the emulation sees what the device holds.
    fn matmul_weight_bytes(&self, ty: GgmlType, rows: usize, cols: usize) -> Option<u64> {
        (ty == GgmlType::Q8_0).then_some((rows * cols + 4 * rows) as u64 * (1 + u64::from(self.scheme.residual)))
    }
    fn memory_budget(&self) -> u64 {
        u64::MAX / 4
    }
}

impl Offload for Emu {
    fn matmul(&mut self, device: u8, id: WeightId, x: &[f32], n: usize, out: &mut [f32]) -> Result<(), DeviceFailed> {
        let at = self.weights.iter().position(|(i, _)| *i == id).ok_or(DeviceFailed { device })?;
        let w = &self.weights[at].1;
        let s = if self.scheme.rotate { self.signs.get(&w.cols).map(Vec::as_slice) } else { None };
        if self.scheme.rotate && s.is_none() {
            return Err(DeviceFailed { device });
        }
        if let Some(e) = &self.exact {
            exact_matmul(&e[at], w.rows, w.cols, s, x, n, out);
            return Ok(());
        }
        matmul(w, s, self.scheme.fine, self.scheme.x_residual, x, n, out, self.threads);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_is_orthogonal_and_folds_into_weights() {
        let n = 576;
        let s = signs(n, 7);
        let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let w: Vec<f32> = (0..n).map(|i| ((i * 11 % 29) as f32 - 14.0) / 3.0).collect();
        let (mut xr, mut wr) = (x.clone(), w.clone());
        rotate(&mut xr, &s);
        rotate(&mut wr, &s);
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| f64::from(*p) * f64::from(*q)).sum::<f64>();
        assert!((dot(&x, &w) - dot(&xr, &wr)).abs() < 1e-2 * dot(&x, &x).sqrt());
        assert!((dot(&x, &x) - dot(&xr, &xr)).abs() < 1e-3 * dot(&x, &x));
        assert_eq!(block(576), 64);
        assert_eq!(block(1536), 512);
    }

    #[test]
    fn integer_products_are_exact_and_close_to_f32() {
        let (rows, cols, n) = (5, 96, 3);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 13 % 17) as f32 - 8.0) / 8.0).collect();
        let x: Vec<f32> = (0..n * cols).map(|i| ((i * 7 % 23) as f32 - 11.0) / 4.0).collect();
        let q = QMatrix::new(&w, rows, cols, true, false);
        let mut out = vec![0f32; n * rows];
        matmul(&q, None, true, false, &x, n, &mut out, 2);
        for i in 0..n {
            for r in 0..rows {
                let exact: f32 = (0..cols).map(|k| w[r * cols + k] * x[i * cols + k]).sum();
                assert!((out[i * rows + r] - exact).abs() < 0.05 * (1.0 + exact.abs()), "{i},{r}: {} vs {exact}", out[i * rows + r]);
            }
        }
        assert_eq!(dot_i8(&[127; 4], &[-127; 4]), -4 * 127 * 127);
    }
}

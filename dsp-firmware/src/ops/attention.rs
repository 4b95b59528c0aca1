//! Attention of one query head over a K/V cache (F32 or F16 rows), with the
//! online softmax of llama.cpp's CPU flash attention: one pass over the
//! positions, keeping the running maximum `M`, the running sum `S` and the
//! weighted sum of values `o` (f32), rescaled when the maximum grows:
//!
//! ```text
//! s = (q · k_j) · scale            (dot in f32, index order)
//! s > M:  ms = expf(M − s); M = s; o = o · ms + v_j;   S = S · ms + 1
//! else:   vs = expf(s − M);        o = o + v_j · vs;   S = S + vs
//! out = o · (1 / S)
//! ```
//!
//! Over an F16 cache (keel's KV cache type) [`attend_f16`] follows keel's CPU
//! attention (`keel_core::session`, llama.cpp's x86 CPU flash attention) operation
//! for operation instead, so a layer run on the DSP computes what the CPU does:
//! q rounded to f16, the K·Q dot in 64 f32 fma lanes reduced in AVX-512's order, the
//! value accumulator kept in **f16** (rounded at every step), `S = fma(S, ms, vs)`.

use keel_npu_hal::f16::{f16_to_f32, f32_to_f16};

use super::math::expf;

/// A cache tensor `[head_dim, n_kv, n_head_kv]` as bytes with its strides.
pub struct Cache<'a> {
    /// From element (0, 0, 0) to the end of the last row.
    pub bytes: &'a [u8],
    /// Elements are binary16 (else f32).
    pub f16: bool,
    /// Bytes between positions (ggml `nb[1]`).
    pub pos_stride: usize,
    /// Bytes between heads (ggml `nb[2]`).
    pub head_stride: usize,
}

impl Cache<'_> {
    #[inline]
    fn at(&self, head: usize, pos: usize, i: usize) -> f32 {
        let base = head * self.head_stride + pos * self.pos_stride;
        if self.f16 {
            let o = base + 2 * i;
            f16_to_f32(u16::from_le_bytes([self.bytes[o], self.bytes[o + 1]]))
        } else {
            let o = base + 4 * i;
            f32::from_le_bytes([self.bytes[o], self.bytes[o + 1], self.bytes[o + 2], self.bytes[o + 3]])
        }
    }
}

/// `out = Σ_j softmax_j((q · k_j) · scale) · v_j` over positions `0..n_pos` of
/// cache head `head`; `out.len() == q.len()` is the head dimension.
pub fn attend(q: &[f32], k: &Cache<'_>, v: &Cache<'_>, head: usize, n_pos: usize, scale: f32, out: &mut [f32]) {
    let mut m = f32::NEG_INFINITY;
    let mut s_sum = 0.0f32;
    out.fill(0.0);
    for j in 0..n_pos {
        let mut dot = 0.0f32;
        for (i, &qi) in q.iter().enumerate() {
            dot += qi * k.at(head, j, i);
        }
        let s = dot * scale;
        if s > m {
            let ms = expf(m - s);
            m = s;
            for (i, o) in out.iter_mut().enumerate() {
                *o = *o * ms + v.at(head, j, i);
            }
            s_sum = s_sum * ms + 1.0;
        } else {
            let vs = expf(s - m);
            for (i, o) in out.iter_mut().enumerate() {
                *o += v.at(head, j, i) * vs;
            }
            s_sum += vs;
        }
    }
    let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
    out.iter_mut().for_each(|o| *o *= inv);
}

/// `x` rounded to binary16 and back.
#[inline]
fn f16r(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// `v` rounded once to binary16 (round to odd into binary32 first, so the second
/// rounding cannot double-round), as AVX512-FP16's fused multiply-add.
fn f16_from_f64(v: f64) -> f32 {
    let r = v as f32;
    let back = r as f64;
    let r = if back == v || !r.is_finite() {
        r
    } else {
        let bits = if back.abs() > v.abs() { r.to_bits() - 1 } else { r.to_bits() };
        f32::from_bits(bits | 1)
    };
    f16r(r)
}

/// Elements per step of the f32-lane dot (4 vectors of 16 lanes).
const DOT_STEP: usize = 64;
/// Elements per step of the f16 accumulator updates (4 vectors of 32 f16 lanes).
const F16_STEP: usize = 128;

/// K row `pos` of cache head `head` · `qh` (f16 values): 64 fma lanes, lane sums
/// `(l + 32) + (l + 16 + l + 48)`, 16 → 8 (high + low), then 8 → 4 → 2 → 1 as
/// `hsum8`; the `n % 64` leftover products added in f64.
fn dot_f16(k: &Cache<'_>, head: usize, pos: usize, qh: &[f32]) -> f32 {
    let n = qh.len();
    let np = n - n % DOT_STEP;
    let mut acc = [0.0f32; DOT_STEP];
    for i in (0..np).step_by(DOT_STEP) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a = libm::fmaf(k.at(head, pos, i + l), qh[i + l], *a);
        }
    }
    let mut s = [0.0f32; 16];
    for (l, v) in s.iter_mut().enumerate() {
        *v = (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]);
    }
    let t: [f32; 8] = core::array::from_fn(|i| s[8 + i] + s[i]);
    let r = [t[4] + t[0], t[5] + t[1], t[6] + t[2], t[7] + t[3]];
    let mut sum = ((r[0] + r[2]) + (r[1] + r[3])) as f64;
    for (i, &q) in qh.iter().enumerate().skip(np) {
        sum += (k.at(head, pos, i) * q) as f64;
    }
    sum as f32
}

/// Attention of one query head over an F16 cache with keel's CPU arithmetic (see the
/// module doc); `qh` and `acc` are scratch of the head dimension.
#[allow(clippy::too_many_arguments)]
pub fn attend_f16(q: &[f32], k: &Cache<'_>, v: &Cache<'_>, head: usize, n_pos: usize, scale: f32, qh: &mut [f32], acc: &mut [f32], out: &mut [f32]) {
    let n = q.len();
    let np = n - n % F16_STEP;
    for (h, &x) in qh.iter_mut().zip(q) {
        *h = f16r(x);
    }
    acc.fill(0.0);
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0.0f32);
    for j in 0..n_pos {
        let s = dot_f16(k, head, j, qh) * scale;
        let (ms, vs) = if s > m {
            let ms = expf(m - s);
            m = s;
            let msh = f16r(ms);
            for (i, a) in acc.iter_mut().enumerate() {
                *a = if i < np { f16r(*a * msh) } else { f16r(*a * ms) };
            }
            (ms, 1.0)
        } else {
            (1.0, expf(s - m))
        };
        let vsh = f16r(vs) as f64;
        for (i, a) in acc.iter_mut().enumerate() {
            let x = v.at(head, j, i);
            *a = if i < np { f16_from_f64(libm::fma(x as f64, vsh, *a as f64)) } else { f16r(libm::fmaf(x, vs, *a)) };
        }
        sum = libm::fmaf(sum, ms, vs);
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for (o, &a) in out.iter_mut().zip(acc.iter()) {
        *o = a * inv;
    }
}

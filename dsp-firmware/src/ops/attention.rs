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

use keel_npu_hal::f16::f16_to_f32;

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

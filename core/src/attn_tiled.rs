//! llama.cpp's tiled flash-attention arithmetic, which its CPU backend uses for batches
//! of 64 or more query rows (keel's default attention follows its one-query path; see
//! `session::attention`).
//!
//! For one query row: keys are taken in tiles of 64 positions aligned at 0; per tile
//! `kq[t] = fma-chain_d(q[d]·k_t[d]) · scale` with q in **f32** (not rounded to f16),
//! masked keys `-inf`; `M' = max(M, max kq)`, on a new maximum the f32 accumulator and
//! the sum are scaled by `expf(M - M')`; `kq[t] = ggml_expf(kq[t] - M')`, summed in
//! groups of 16 (AVX-512 `reduce_add` order) into an f64 that is added to the f32 sum;
//! then `acc[c] = fma-chain_t(kq[t]·v_t[c])`; finally `out = acc · (1/sum)`. Each row's
//! arithmetic depends only on that row, so this mode is itself batch-invariant, but it
//! differs from the one-query path in rounding.

use crate::ops;
use crate::quant::Kernels;
use half::f16;

/// Keys per tile.
pub const TILE: usize = 64;

/// f32 scratch one task needs for head sizes `hd` (keys) and `hdv` (values).
pub fn scratch_len(hd: usize, hdv: usize) -> usize {
    TILE * hd + TILE + hdv
}

/// Sum of 16 values in the order of GCC's `_mm512_reduce_add_ps`.
fn reduce16(v: &[f32]) -> f32 {
    let mut t3 = [0.0f32; 8];
    for i in 0..8 {
        t3[i] = v[i + 8] + v[i];
    }
    let mut t6 = [0.0f32; 4];
    for j in 0..4 {
        t6[j] = t3[j + 4] + t3[j];
    }
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// One query row over keys `first..=last` (positions; row of position `j` is `j % rows`
/// in `kv_k`/`kv_v`, with head offsets `k_off`/`v_off` and row strides `kd`/`vd`).
#[allow(clippy::too_many_arguments)]
pub fn row(
    kern: &Kernels,
    q: &[f32],
    kv_k: &[f16],
    kv_v: &[f16],
    (rows, kd, vd, k_off, v_off): (usize, usize, usize, usize, usize),
    first: usize,
    last: usize,
    scale: f32,
    scratch: &mut [f32],
    out: &mut [f32],
) {
    let (hd, hdv) = (q.len(), out.len());
    let (kt, rest) = scratch.split_at_mut(TILE * hd);
    let (kq, rest) = rest.split_at_mut(TILE);
    let acc = &mut rest[..hdv];
    acc.fill(0.0);
    let (mut m, mut s) = (f32::NEG_INFINITY, 0.0f32);
    let mut t0 = first / TILE * TILE;
    while t0 <= last {
        // Visible keys of this tile: lo..hi (tile-relative).
        let lo = first.saturating_sub(t0);
        let hi = (last + 1 - t0).min(TILE);
        for t in lo..hi {
            let r = (t0 + t) % rows;
            let k = &kv_k[r * kd + k_off..r * kd + k_off + hd];
            for (d, &x) in k.iter().enumerate() {
                kt[d * TILE + t] = x.to_f32();
            }
        }
        kq_tile(kern, q, kt, kq, lo, hi);
        let mut tile_max = f32::NEG_INFINITY;
        for (t, v) in kq.iter_mut().enumerate() {
            *v = if t >= lo && t < hi { *v * scale } else { f32::NEG_INFINITY };
            tile_max = if tile_max > *v { tile_max } else { *v };
        }
        if tile_max != f32::NEG_INFINITY {
            let m_new = if m > tile_max { m } else { tile_max };
            if m_new > m {
                let ms = ops::expf(m - m_new);
                for a in acc.iter_mut() {
                    *a *= ms;
                }
                s *= ms;
            }
            m = m_new;
            let mut sum = 0.0f64;
            for g in 0..TILE / 16 {
                for v in kq[g * 16..(g + 1) * 16].iter_mut() {
                    *v = ops::ggml_expf(*v - m_new);
                }
                sum += reduce16(&kq[g * 16..(g + 1) * 16]) as f64;
            }
            s = (s as f64 + sum) as f32;
            for t in lo..hi {
                let r = (t0 + t) % rows;
                let v = &kv_v[r * vd + v_off..r * vd + v_off + hdv];
                vkq_mad(kern, acc, v, kq[t]);
            }
        }
        t0 += TILE;
    }
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    for (o, &a) in out.iter_mut().zip(acc.iter()) {
        *o = a * inv;
    }
}

/// `kq[t] = fma-chain over d of q[d]·kt[d][t]` for `t` in `lo..hi`.
fn kq_tile(kern: &Kernels, q: &[f32], kt: &[f32], kq: &mut [f32], lo: usize, hi: usize) {
    #[cfg(target_arch = "x86_64")]
    if !kern.is_reference() {
        // SAFETY: non-reference kernels exist only when CPUID confirmed AVX2 + FMA + F16C.
        unsafe { x86::kq_tile(q, kt, kq) };
        return;
    }
    let _ = kern;
    for t in lo..hi {
        let mut a = 0.0f32;
        for (d, &x) in q.iter().enumerate() {
            a = libm::fmaf(x, kt[d * TILE + t], a);
        }
        kq[t] = a;
    }
}

/// `acc[c] = fma(p, v[c], acc[c])`.
fn vkq_mad(kern: &Kernels, acc: &mut [f32], v: &[f16], p: f32) {
    #[cfg(target_arch = "x86_64")]
    if !kern.is_reference() {
        // SAFETY: as in `kq_tile`.
        unsafe { x86::mad(acc, v, p) };
        return;
    }
    let _ = kern;
    for (a, &x) in acc.iter_mut().zip(v) {
        *a = libm::fmaf(p, x.to_f32(), *a);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::TILE;
    use core::arch::x86_64::*;
    use half::f16;

    /// All 64 columns (columns outside the visible range are ignored by the caller).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn kq_tile(q: &[f32], kt: &[f32], kq: &mut [f32]) {
        let mut acc = [_mm256_setzero_ps(); TILE / 8];
        for (d, &x) in q.iter().enumerate() {
            let p = _mm256_set1_ps(x);
            let row = &kt[d * TILE..(d + 1) * TILE];
            for (g, a) in acc.iter_mut().enumerate() {
                // SAFETY: row has TILE = 64 floats; g*8+8 <= 64.
                let b = unsafe { _mm256_loadu_ps(row.as_ptr().add(g * 8)) };
                *a = _mm256_fmadd_ps(b, p, *a);
            }
        }
        for (g, a) in acc.iter().enumerate() {
            // SAFETY: kq has TILE floats.
            unsafe { _mm256_storeu_ps(kq.as_mut_ptr().add(g * 8), *a) };
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn mad(acc: &mut [f32], v: &[f16], p: f32) {
        let n = acc.len().min(v.len());
        let pv = _mm256_set1_ps(p);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n for both slices.
            unsafe {
                let x = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i) as *const __m128i));
                let a = _mm256_loadu_ps(acc.as_ptr().add(i));
                _mm256_storeu_ps(acc.as_mut_ptr().add(i), _mm256_fmadd_ps(x, pv, a));
            }
            i += 8;
        }
        for j in i..n {
            acc[j] = libm::fmaf(p, v[j].to_f32(), acc[j]);
        }
    }
}

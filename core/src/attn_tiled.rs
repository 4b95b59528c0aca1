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
//!
//! [`block`] runs that for a block of query rows that share a KV head (up to [`QB`]
//! consecutive tokens × up to [`MAX_HEADS`] query heads): each key tile is converted
//! from f16 once for the whole block (keys transposed, values as rows) and every row
//! whose span meets the tile takes its step there, with its own running maximum, sum
//! and accumulator. Per row the operations and their order are the ones above, so
//! blocking changes no bit.

use crate::ops;
use crate::quant::Kernels;
use half::f16;

/// Keys per tile.
pub const TILE: usize = 64;

/// Consecutive query tokens of one [`block`].
pub const QB: usize = 32;

/// Query heads (sharing one KV head) of one [`block`].
pub const MAX_HEADS: usize = crate::attention::MAX_HEADS;

/// f32 scratch one task needs for head sizes `hd` (keys) and `hdv` (values): a tile of
/// keys (transposed) and of values, the tile's scores for each head of a token, and
/// each of the block's rows' accumulator, maximum and sum.
pub fn scratch_len(hd: usize, hdv: usize) -> usize {
    TILE * hd + TILE * hdv + TILE * MAX_HEADS + QB * MAX_HEADS * (hdv + 2)
}

/// Where a block's keys and values are: ring rows (`rows`; position `j` is row
/// `j % rows`), row strides `kd`/`vd`, the KV head's offsets `k_off`/`v_off`.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Rows of the cache (a ring when a window is shorter than the context).
    pub rows: usize,
    /// f16 elements per key row.
    pub kd: usize,
    /// f16 elements per value row.
    pub vd: usize,
    /// The KV head's first element in a key row.
    pub k_off: usize,
    /// The KV head's first element in a value row.
    pub v_off: usize,
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

/// One query row's running state over the tiles: its f32 accumulator, maximum and sum.
pub(crate) struct TiledRow<'a> {
    pub(crate) acc: &'a mut [f32],
    pub(crate) m: &'a mut f32,
    pub(crate) s: &'a mut f32,
}

/// `nq` query tokens (at most [`QB`]) × `nh` heads (at most [`MAX_HEADS`]) sharing the
/// KV head of `lay`: `query(j)` gives token `j`'s `nh·hd` f32 and its visible keys
/// `first..=last` (positions); `out(j)` (called once per token, after its last tile)
/// receives its `nh·hdv` outputs. `scratch` holds at least [`scratch_len`] floats.
///
/// Panics if the shapes do not fit (a caller's bug: callers check their tensors first).
#[allow(clippy::too_many_arguments)]
pub fn block<'q, 'o>(
    kern: &Kernels,
    kv_k: &[f16],
    kv_v: &[f16],
    lay: Layout,
    (hd, hdv, nh): (usize, usize, usize),
    scale: f32,
    nq: usize,
    query: impl Fn(usize) -> (&'q [f32], usize, usize),
    scratch: &mut [f32],
    mut out: impl FnMut(usize) -> &'o mut [f32],
) {
    assert!((1..=QB).contains(&nq) && (1..=MAX_HEADS).contains(&nh), "attn_tiled::block: {nq} tokens of {nh} heads");
    let (kt, rest) = scratch.split_at_mut(TILE * hd);
    let (vt, rest) = rest.split_at_mut(TILE * hdv);
    let (kq, rest) = rest.split_at_mut(TILE * MAX_HEADS);
    let (accs, rest) = rest.split_at_mut(QB * MAX_HEADS * hdv);
    let (ms, ss) = rest.split_at_mut(QB * MAX_HEADS);
    let n_rows = nq * nh;
    accs[..n_rows * hdv].fill(0.0);
    ms[..n_rows].fill(f32::NEG_INFINITY);
    ss[..n_rows].fill(0.0);
    let (mut lo_all, mut hi_all) = (usize::MAX, 0);
    for j in 0..nq {
        let (q, first, last) = query(j);
        assert!(q.len() == nh * hd && first <= last, "attn_tiled::block: token {j}");
        (lo_all, hi_all) = (lo_all.min(first), hi_all.max(last + 1));
    }
    let mut t0 = lo_all / TILE * TILE;
    while t0 < hi_all {
        // The tile's keys any row sees: lo..hi (tile-relative), converted once.
        let lo = lo_all.saturating_sub(t0);
        let hi = (hi_all - t0).min(TILE);
        for t in (lo..hi).step_by(KEYS) {
            let n = KEYS.min(hi - t);
            let key = |j: usize| &kv_k[(t0 + t + j) % lay.rows * lay.kd + lay.k_off..][..hd];
            convert_keys(kern, key, n, kt, t);
        }
        for t in lo..hi {
            let r = (t0 + t) % lay.rows;
            kern.f16_to_f32(&kv_v[r * lay.vd + lay.v_off..][..hdv], &mut vt[t * hdv..(t + 1) * hdv]);
        }
        for j in 0..nq {
            let (q, first, last) = query(j);
            if last < t0 || first >= t0 + TILE {
                continue;
            }
            let (lo, hi) = (first.saturating_sub(t0), (last + 1 - t0).min(TILE));
            // The token's heads together (they see the same keys).
            let rows = j * nh..(j + 1) * nh;
            let accs = &mut accs[rows.start * hdv..rows.end * hdv];
            kern.tiled_step_heads(q, kt, vt, kq, lo, hi, scale, accs, &mut ms[rows.clone()], &mut ss[rows]);
        }
        t0 += TILE;
    }
    for j in 0..nq {
        let o = out(j);
        assert!(o.len() == nh * hdv, "attn_tiled::block: token {j}'s output");
        for h in 0..nh {
            let i = j * nh + h;
            let s = ss[i];
            let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
            for (o, &a) in o[h * hdv..(h + 1) * hdv].iter_mut().zip(&accs[i * hdv..(i + 1) * hdv]) {
                *o = a * inv;
            }
        }
    }
}

/// Keys converted together by [`convert_keys`].
const KEYS: usize = 8;

/// Keys `key(0..n)` (f16, `n <= KEYS`) into columns `t..t + n` of the transposed tile `kt`
/// (`kt[d·TILE + t]`), 64 elements of the `n` keys at a time: each written run of `n`
/// columns is contiguous (one key at a time would store to a new cache line per element).
fn convert_keys<'k>(kern: &Kernels, key: impl Fn(usize) -> &'k [f16], n: usize, kt: &mut [f32], t: usize) {
    let hd = key(0).len();
    let mut buf = [[0f32; 64]; KEYS];
    for c in (0..hd).step_by(64) {
        let w = 64.min(hd - c);
        for (j, b) in buf[..n].iter_mut().enumerate() {
            kern.f16_to_f32(&key(j)[c..c + w], &mut b[..w]);
        }
        for d in 0..w {
            let dst = &mut kt[(c + d) * TILE + t..][..n];
            for (j, o) in dst.iter_mut().enumerate() {
                *o = buf[j][d];
            }
        }
    }
}

/// One row's step over one tile (visible keys `lo..hi` of the tile; `kt` its keys
/// transposed, `kt[d·TILE + t]`, `vt` its values as rows of `hdv = acc.len()`): the
/// scores into `kq`, the online softmax, the accumulator. The reference of
/// [`Kernels::tiled_step`]; every kernel set gives its bits.
#[allow(clippy::too_many_arguments)]
pub(crate) fn step_ref(q: &[f32], kt: &[f32], vt: &[f32], kq: &mut [f32], lo: usize, hi: usize, scale: f32, row: TiledRow<'_>) {
    let hdv = row.acc.len();
    for t in 0..TILE {
        kq[t] = if t >= lo && t < hi {
            let mut a = 0.0f32;
            for (d, &x) in q.iter().enumerate() {
                a = crate::fused::fmaf(x, kt[d * TILE + t], a);
            }
            a * scale
        } else {
            f32::NEG_INFINITY
        };
    }
    let mut tile_max = f32::NEG_INFINITY;
    for &v in kq.iter().take(TILE) {
        tile_max = if tile_max > v { tile_max } else { v };
    }
    let Some(m_new) = new_max(tile_max, row.m, row.acc, row.s) else { return };
    let mut sum = 0.0f64;
    for g in 0..TILE / 16 {
        for v in kq[g * 16..(g + 1) * 16].iter_mut() {
            *v = ops::ggml_expf(*v - m_new);
        }
        sum += reduce16(&kq[g * 16..(g + 1) * 16]) as f64;
    }
    *row.s = (*row.s as f64 + sum) as f32;
    for t in lo..hi {
        for (a, &x) in row.acc.iter_mut().zip(&vt[t * hdv..(t + 1) * hdv]) {
            *a = crate::fused::fmaf(kq[t], x, *a);
        }
    }
}

/// The online softmax's maximum after a tile whose maximum score is `tile_max`: `None`
/// if the tile has no visible key; on a new maximum the accumulator and the sum are
/// scaled by `expf(M - M')`.
pub(crate) fn new_max(tile_max: f32, m: &mut f32, acc: &mut [f32], s: &mut f32) -> Option<f32> {
    if tile_max == f32::NEG_INFINITY {
        return None;
    }
    let m_new = if *m > tile_max { *m } else { tile_max };
    if m_new > *m {
        let ms = ops::expf(*m - m_new);
        for a in acc.iter_mut() {
            *a *= ms;
        }
        *s *= ms;
    }
    *m = m_new;
    Some(m_new)
}

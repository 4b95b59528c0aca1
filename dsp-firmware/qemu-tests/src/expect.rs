//! Expected values, on the host, by keel-core itself: every function here is one
//! keel-core call — or one call per row, head or column, split exactly as the
//! firmware's executor (`keel_core::exec`, `core/src/exec/`) splits its calls — with the scalar
//! reference kernels (`Kernels::reference()`). Nothing here computes a value: it only
//! copies inputs, slices them and hands them to keel-core.

use half::f16;
use keel_core::attention::{attend_heads, KeySpan};
use keel_core::delta_net;
use keel_core::ggml_type::GgmlType;
use keel_core::ops;
use keel_core::quant::tiles32::{self, ActBlock, TiledWeights};
use keel_core::quant::Kernels;
use keel_npu_hal::op::DType;
use keel_npu_hal::tile;

/// keel-core's scalar reference kernel set (the same bits as every other set).
pub fn kern() -> Kernels {
    Kernels::reference()
}

/// keel-core's name for a wire type.
pub fn ggml_type(d: DType) -> GgmlType {
    GgmlType::from_id(d.ggml_type_id()).unwrap()
}

/// `x` (a multiple of 32 values) as ggml Q8_0 blocks:
/// `Kernels::quantize_activations(Q8_0)` (the firmware's `Quantize` op, and the
/// rule `tiles32::quantize_act` applies block by block).
pub fn quantize_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; x.len() / 32 * 34];
    kern().quantize_activations(GgmlType::Q8_0, x, &mut out).unwrap();
    out
}

/// Weights in the Tiles32 layout on the host (`keel_npu_hal::tile::repack` of ggml
/// rows into a 128-byte aligned buffer, as `tiles32::TiledWeights` requires).
pub struct Tiled {
    buf: Vec<u8>,
    at: usize,
    size: usize,
    /// Q8_0, Q4_0 or IQ4_NL.
    pub dtype: DType,
    /// Output rows.
    pub rows: usize,
    /// Inputs per row.
    pub k: usize,
}

impl Tiled {
    /// Repacks `ggml` (`rows` rows of `k` values of `dtype`).
    pub fn new(dtype: DType, rows: usize, k: usize, ggml: &[u8]) -> Tiled {
        let size = tile::packed_size(dtype, rows as u32, k as u32).unwrap();
        let mut buf = vec![0u8; size + tiles32::ALIGN];
        let at = buf.as_ptr().align_offset(tiles32::ALIGN);
        tile::repack(dtype, rows as u32, k as u32, ggml, &mut buf[at..at + size]).unwrap();
        Tiled { buf, at, size, dtype, rows, k }
    }

    /// The packed bytes as keel-core's `TiledWeights`.
    pub fn weights(&self) -> TiledWeights<'_> {
        TiledWeights { dtype: self.dtype, rows: self.rows, k: self.k, packed: &self.buf[self.at..self.at + self.size] }
    }
}

/// Q8_0 ggml blocks as the kernels' activation blocks (`ActBlock::from_q8_0`).
pub fn act_blocks(q8: &[u8]) -> Vec<ActBlock> {
    q8.chunks_exact(34).map(|b| ActBlock::from_q8_0(b.try_into().unwrap())).collect()
}

/// One column's product `tiles32::matvec(&Kernels::reference(), w, act, ..)` with its
/// int32 block sums: `(sums [block][row], outputs [row])`. `act_q8`: the column's
/// Q8_0 ggml blocks.
pub fn tiled_matvec(w: &Tiled, act_q8: &[u8]) -> (Vec<i32>, Vec<f32>) {
    let acts = act_blocks(act_q8);
    let mut scratch = vec![0u8; 1 << 20];
    let (mut sums, mut out) = (vec![0i32; w.k / 32 * w.rows], vec![0f32; w.rows]);
    tiles32::matvec(&kern(), &w.weights(), &acts, &mut scratch, &mut out, Some(&mut sums)).unwrap();
    (sums, out)
}

/// `MatMul` of Tiles32 weights by Q8_0 columns (`act_q8`: the columns' blocks, one
/// after another): one `tiles32::matvec` per column, outputs `[col][row]`.
pub fn matmul(w: &Tiled, act_q8: &[u8]) -> Vec<f32> {
    act_q8.chunks_exact(w.k / 32 * 34).flat_map(|col| tiled_matvec(w, col).1).collect()
}

/// keel's CPU row dot (`Kernels::reference().dot_fn(ty)`) of every ggml weight row
/// with one Q8_0 activation column.
pub fn row_dots(dtype: DType, ggml: &[u8], rows: usize, k: usize, act_q8: &[u8]) -> Vec<f32> {
    let dot = kern().dot_fn(ggml_type(dtype)).unwrap();
    let rb = ggml.len() / rows;
    (0..rows).map(|r| dot(k, &ggml[r * rb..][..rb], act_q8)).collect()
}

/// `GetRows`: rows `ids` of a table of `n`-value rows of `dtype`, each by
/// `Kernels::dequantize_row`.
pub fn get_rows(dtype: DType, table: &[u8], n: usize, ids: &[i32]) -> Vec<f32> {
    let rb = dtype.row_bytes(n as u32).unwrap() as usize;
    let mut out = vec![0f32; n * ids.len()];
    for (&i, o) in ids.iter().zip(out.chunks_exact_mut(n)) {
        kern().dequantize_row(ggml_type(dtype), &table[i as usize * rb..][..rb], o).unwrap();
    }
    out
}

/// `Kernels::f32_to_f16` (the `Copy` op into F16).
pub fn to_f16(x: &[f32]) -> Vec<f16> {
    let mut out = vec![f16::ZERO; x.len()];
    kern().f32_to_f16(x, &mut out);
    out
}

/// `RmsNorm` of each `n`-value row: `ops::rms_norm_weighted` with a weight,
/// `ops::rms_norm_unweighted` without.
pub fn norm_rows(x: &[f32], n: usize, w: Option<&[f32]>, eps: f32) -> Vec<f32> {
    let mut y = x.to_vec();
    for row in y.chunks_exact_mut(n) {
        match w {
            Some(w) => ops::rms_norm_weighted(row, &w[..n], eps),
            None => ops::rms_norm_unweighted(row, eps),
        }
    }
    y
}

/// `Softmax`: `ops::softmax(row, scale)` of each `n`-value row.
pub fn softmax(x: &[f32], n: usize, scale: f32) -> Vec<f32> {
    let mut y = x.to_vec();
    y.chunks_exact_mut(n).for_each(|row| ops::softmax(row, scale));
    y
}

/// `Silu`: `ops::silu` of each value.
pub fn each_silu(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| ops::silu(v)).collect()
}

/// `Gelu`: `ops::gelu_tanh` of each value.
pub fn each_gelu(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| ops::gelu_tanh(v)).collect()
}

/// `SwiGlu`: `Kernels::swiglu(gate, up)`.
pub fn swiglu(gate: &[f32], up: &[f32]) -> Vec<f32> {
    let mut y = gate.to_vec();
    kern().swiglu(&mut y, up);
    y
}

/// `GeGlu`: `Kernels::geglu(gate, up)`.
pub fn geglu(gate: &[f32], up: &[f32]) -> Vec<f32> {
    let mut y = gate.to_vec();
    kern().geglu(&mut y, up);
    y
}

/// `Add`: `ops::add_assign(row, y)` on each `y.len()`-value row of `x` (`y` the same
/// size, or one broadcast row).
pub fn add(x: &[f32], y: &[f32]) -> Vec<f32> {
    let mut z = x.to_vec();
    z.chunks_mut(y.len()).for_each(|row| ops::add_assign(row, y));
    z
}

/// `Mul`: `ops::mul_assign(row, y)` as [`add`].
pub fn mul(x: &[f32], y: &[f32]) -> Vec<f32> {
    let mut z = x.to_vec();
    z.chunks_mut(y.len()).for_each(|row| ops::mul_assign(row, y));
    z
}

/// The `(cos, sin)` table of `n_dims` values per position: `ops::rope_angles`.
pub fn rope_table(pos: &[i32], base: f32, n_dims: usize) -> Vec<f32> {
    let mut cs = vec![0f32; n_dims * pos.len()];
    for (&p, t) in pos.iter().zip(cs.chunks_exact_mut(n_dims)) {
        ops::rope_angles(p as usize, base, n_dims, t);
    }
    cs
}

/// `Rope` of `x` (`[head_dim, n_head, n_tokens]`) at positions `pos`: per token the
/// host's table rows, or `ops::rope_angles(pos, base, n_dims, ..)`; then
/// `ops::rope_neox` (mode 2) or `ops::rope_normal` on every head.
#[allow(clippy::too_many_arguments)]
pub fn rope(x: &[f32], head_dim: usize, n_head: usize, pos: &[i32], n_dims: usize, mode: u8, base: f32, table: Option<&[f32]>) -> Vec<f32> {
    let mut y = x.to_vec();
    let mut own = vec![0f32; n_dims];
    for (t, tok) in y.chunks_exact_mut(head_dim * n_head).enumerate() {
        let cs: &[f32] = match table {
            Some(tab) => &tab[t * n_dims..][..n_dims],
            None => {
                ops::rope_angles(pos[t] as usize, base, n_dims, &mut own);
                &own
            }
        };
        for head in tok.chunks_exact_mut(head_dim) {
            if mode == 2 {
                ops::rope_neox(head, cs, n_dims);
            } else {
                ops::rope_normal(head, cs, n_dims);
            }
        }
    }
    y
}

/// An F16 K or V cache: its elements and, in elements, the distance between the rows
/// of consecutive positions and of consecutive KV heads.
#[derive(Clone, Copy)]
pub struct Cache<'a> {
    /// The cache's f16 elements (from the attention's view offset on).
    pub data: &'a [f16],
    /// Elements between positions.
    pub pos_stride: usize,
    /// Elements between KV heads.
    pub head_stride: usize,
}

/// The shape of an `Attention` op.
#[derive(Clone, Copy, Debug)]
pub struct Attn {
    /// Elements per head.
    pub head_dim: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads (query head `h` reads KV head `h / (n_head / n_head_kv)`).
    pub n_head_kv: usize,
    /// Query tokens (the last `n_tokens` of the `n_kv` positions).
    pub n_tokens: usize,
    /// Positions in the cache views.
    pub n_kv: usize,
    /// Score scale.
    pub scale: f32,
    /// Sliding window (0: none).
    pub window: usize,
}

/// `Attention` of Q (`[head_dim, n_head, n_tokens]`, contiguous) over F16 caches: one
/// `attention::attend_heads` call per query token and head with a `KeySpan` built
/// from the cache strides (token `t` at position `p = n_kv − n_tokens + t` sees
/// positions `0 ..= p`, or `p + 1 − window ..= p`).
pub fn attention(q: &[f32], a: Attn, k: Cache<'_>, v: Cache<'_>) -> Vec<f32> {
    // A ring as long as the cache: key `c` of a span starting at `first` is in slot `first + c`.
    attention_ring(q, a, k, v, a.n_kv)
}

/// A position-major F16 cache (`pos_stride` elements per position) as keel's CPU
/// session keeps a sliding-window layer's cache: a ring of `rows` slots, position `p`
/// in slot `p % rows`, holding the last `rows` of the first `n_kv` positions (moved,
/// not computed).
pub fn ring_cache(full: &[f16], pos_stride: usize, n_kv: usize, rows: usize) -> Vec<f16> {
    let mut ring = vec![f16::ZERO; rows * pos_stride];
    for p in n_kv.saturating_sub(rows)..n_kv {
        let slot = p % rows;
        ring[slot * pos_stride..][..pos_stride].copy_from_slice(&full[p * pos_stride..][..pos_stride]);
    }
    ring
}

/// The CPU session's sliding-window attention (`core/src/block_cpu.rs` `attention`) over
/// ring caches of `rows` slots ([`ring_cache`]): per query token at position `p` and
/// head, `attend_heads` with `KeySpan { len: p + 1 − first, first_slot: first, ring:
/// rows, .. }`, `first = max(0, p + 1 − window)`.
pub fn attention_ring(q: &[f32], a: Attn, k: Cache<'_>, v: Cache<'_>, rows: usize) -> Vec<f32> {
    let hd = a.head_dim;
    let group = a.n_head / a.n_head_kv;
    let (mut qh, mut acc) = (vec![f16::ZERO; hd], vec![f16::ZERO; hd]);
    let mut out = vec![0f32; q.len()];
    for t in 0..a.n_tokens {
        let pos = a.n_kv - a.n_tokens + t;
        let first = if a.window > 0 { (pos + 1).saturating_sub(a.window) } else { 0 };
        for h in 0..a.n_head {
            let o = (t * a.n_head + h) * hd;
            let kvh = h / group;
            let span = KeySpan {
                len: pos + 1 - first,
                first_slot: first,
                ring: rows,
                k_base: kvh * k.head_stride,
                k_stride: k.pos_stride,
                v_base: kvh * v.head_stride,
                v_stride: v.pos_stride,
            };
            attend_heads(&kern(), &q[o..o + hd], hd, hd, k.data, v.data, span, a.scale, &mut qh, &mut acc, &mut out[o..o + hd]);
        }
    }
    out
}

/// `Scale`: `ops::scale(x, s)`.
pub fn scale(x: &[f32], s: f32) -> Vec<f32> {
    let mut y = x.to_vec();
    ops::scale(&mut y, s);
    y
}

/// `Sigmoid`: `ops::sigmoid` of each value.
pub fn each_sigmoid(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| ops::sigmoid(v)).collect()
}

/// `Softplus`: `ops::softplus` of each value.
pub fn each_softplus(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| ops::softplus(v)).collect()
}

/// `L2Norm`: `delta_net::l2_norm(row, eps)` of each `n`-value row.
pub fn l2_norm_rows(x: &[f32], n: usize, eps: f32) -> Vec<f32> {
    let mut y = x.to_vec();
    y.chunks_exact_mut(n).for_each(|row| delta_net::l2_norm(row, eps));
    y
}

/// The CPU's per-head q/k norm (`block_cpu.rs` `head_norm`): `ops::rms_norm_in_place`
/// of each `hd`-value head with the weight as raw f32 bytes.
pub fn head_norm(x: &[f32], hd: usize, w: &[f32], eps: f32) -> Vec<f32> {
    let wb = crate::f32_bytes(w);
    let mut y = x.to_vec();
    y.chunks_exact_mut(hd).for_each(|head| ops::rms_norm_in_place(head, &wb, eps));
    y
}

/// The CPU's gated-attention output gate: `ops::mul_sigmoid(o, gate)`.
pub fn mul_sigmoid(o: &[f32], gate: &[f32]) -> Vec<f32> {
    let mut y = o.to_vec();
    ops::mul_sigmoid(&mut y, gate);
    y
}

/// The CPU's delta-net gates: `delta_net::gates` over `n_heads`-value rows of `beta`
/// and `alpha` with the rows `dt_bias` and `a`; returns `(beta, g)`.
pub fn gates(beta: &[f32], alpha: &[f32], dt_bias: &[f32], a: &[f32], n_heads: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut b, mut g) = (beta.to_vec(), alpha.to_vec());
    delta_net::gates(&mut b, &mut g, &crate::f32_bytes(dt_bias), &crate::f32_bytes(a), n_heads);
    (b, g)
}

/// The CPU's gated output norm: `delta_net::gated_norm(head, z_head, w, eps)` per
/// `d`-value head.
pub fn gated_norm(o: &[f32], z: &[f32], d: usize, w: &[f32], eps: f32) -> Vec<f32> {
    let wb = crate::f32_bytes(w);
    let mut y = o.to_vec();
    for (head, zh) in y.chunks_exact_mut(d).zip(z.chunks_exact(d)) {
        delta_net::gated_norm(head, zh, &wb, eps);
    }
    y
}

/// The CPU's conv (`block_cpu.rs` `ssm_conv`): `delta_net::conv_channel` per
/// channel of `x` (`[ch, n]`) with taps `w` (`[d_conv, ch]`) over `state`
/// (`[d_conv − 1, ch]`, updated); returns the output `[ch, n]`.
pub fn ssm_conv(x: &[f32], ch: usize, w: &[f32], state: &mut [f32]) -> Vec<f32> {
    let (n, k1) = (x.len() / ch, state.len() / ch);
    let wb = crate::f32_bytes(w);
    let mut out = vec![0f32; x.len()];
    for c in 0..ch {
        delta_net::conv_channel(&mut state[c * k1..(c + 1) * k1], &x[c..], ch, &wb[c * (k1 + 1) * 4..(c + 1) * (k1 + 1) * 4], &mut out[c..], ch, n);
    }
    out
}

/// The shape of a delta rule as the CPU's `block_cpu.rs` `delta_rule` runs it.
#[derive(Clone, Copy, Debug)]
pub struct Delta {
    /// Head width (`d_state`).
    pub d: usize,
    /// q/k heads.
    pub n_k_heads: usize,
    /// Value heads (head `h` reads q/k head `h % n_k_heads`).
    pub n_v_heads: usize,
    /// Floats per token of the conv output (`(2·n_k_heads + n_v_heads)·d`, or more).
    pub row: usize,
    /// 0: token by token; else the chunk length.
    pub chunk: usize,
    /// Output scale.
    pub scale: f32,
}

/// The CPU's delta rule (`block_cpu.rs` `delta_rule`) over `n` tokens of the conv
/// output `conv` (`row` floats per token: q heads, k heads, v heads), gates `beta` and
/// `g` (`[n][n_v_heads]`) and the transposed states `m` (`[n_v_heads][d·d]`, updated):
/// per value head, `delta_net::step` per token, or `delta_net::chunk` per `chunk`
/// tokens into a scratch copied to the output, as the session does. Returns
/// `[n][n_v_heads][d]`.
pub fn delta_rule(s: Delta, conv: &[f32], beta: &[f32], g: &[f32], m: &mut [f32]) -> Vec<f32> {
    let (d, nk, nv, ch) = (s.d, s.n_k_heads, s.n_v_heads, s.row);
    let n = conv.len() / ch;
    let kdim = nk * d;
    let mut out = vec![0f32; n * nv * d];
    for h in 0..nv {
        let mh = &mut m[h * d * d..(h + 1) * d * d];
        let kh = h % nk;
        if s.chunk > 0 {
            let (mut cw, mut tmp) = (vec![0f32; delta_net::chunk_scratch_len(s.chunk, d)], vec![0f32; s.chunk * d]);
            let mut i0 = 0;
            while i0 < n {
                let c = s.chunk.min(n - i0);
                let base = &conv[i0 * ch..];
                delta_net::chunk(mh, &base[kh * d..], &base[kdim + kh * d..], ch, &base[2 * kdim + h * d..], ch, &mut tmp, d, &g[i0 * nv + h..], &beta[i0 * nv + h..], nv, c, d, s.scale, &mut cw);
                for j in 0..c {
                    out[(i0 + j) * nv * d + h * d..][..d].copy_from_slice(&tmp[j * d..(j + 1) * d]);
                }
                i0 += c;
            }
            continue;
        }
        let mut delta = vec![0f32; d];
        for i in 0..n {
            let row = &conv[i * ch..(i + 1) * ch];
            let (q, k, v) = (&row[kh * d..(kh + 1) * d], &row[kdim + kh * d..kdim + (kh + 1) * d], &row[2 * kdim + h * d..2 * kdim + (h + 1) * d]);
            delta_net::step(mh, q, k, v, g[i * nv + h], beta[i * nv + h], s.scale, &mut delta, &mut out[i * nv * d + h * d..][..d]);
        }
    }
    out
}

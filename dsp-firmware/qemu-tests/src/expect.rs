//! Expected values, on the host, by keel-core itself: every function here is one
//! keel-core call — or one call per row, head or column, split exactly as the
//! firmware's executor (`dsp-firmware/src/exec/`) splits its calls — with the scalar
//! reference kernels (`Kernels::reference()`). Nothing here computes a value: it only
//! copies inputs, slices them and hands them to keel-core.

use half::f16;
use keel_core::attention::{attend_heads, KeySpan};
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
}

/// `Attention` of Q (`[head_dim, n_head, n_tokens]`, contiguous) over F16 caches: one
/// `attention::attend_heads` call per query token and head with a `KeySpan` built
/// from the cache strides (token `t` sees positions `0 ..= n_kv − n_tokens + t`).
pub fn attention(q: &[f32], a: Attn, k: Cache<'_>, v: Cache<'_>) -> Vec<f32> {
    let hd = a.head_dim;
    let group = a.n_head / a.n_head_kv;
    let (mut qh, mut acc) = (vec![f16::ZERO; hd], vec![f16::ZERO; hd]);
    let mut out = vec![0f32; q.len()];
    for t in 0..a.n_tokens {
        let n_pos = a.n_kv - a.n_tokens + t + 1;
        for h in 0..a.n_head {
            let o = (t * a.n_head + h) * hd;
            let kvh = h / group;
            let span = KeySpan {
                len: n_pos,
                first_slot: 0,
                ring: a.n_kv,
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

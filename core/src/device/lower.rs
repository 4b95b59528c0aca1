//! Whole layers as device batches: the descriptors of one layer's ops over the
//! repacked weights, the layer's vectors, the device-resident KV cache (or recurrent
//! state) and one work buffer.
//!
//! Owns the lowering of a block's ops ([`crate::block::layer_ops`], the one description
//! of each block, which the CPU session executes too) to HAL ops and the layout of the
//! work buffer; not the buffers themselves (allocated and counted by [`super::engine`]).
//! No allocation: a [`Builder`]'s tables are bounded by the wire protocol's limits.
//! Per layer, for `m` tokens at positions `pos .. pos + m` (shapes ggml-style, innermost
//! first), a llama block lowers to:
//!
//! ```text
//! norm          xn   = RmsNorm(x, w_attn)                    [n_embd, m]
//! matmul ×3     q, k, v = MatMul(W_q|W_k|W_v, xn)            [q_dim, m], [kv_dim, m], [kv_dim, m]
//! rope          q, k = Rope(q, k; pos, host cos/sin table)   viewed [head_dim, heads, m]
//! kv_store      K[l][pos..], V[l][pos..] = Copy(k), Copy(v)  F32 -> F16 rows of the cache
//! attention     q    = Attention(q; K[l][..pos+m], V[l][..pos+m])  in place (Attn is Q)
//! matmul        ffn_a = MatMul(W_o, q)
//! residual      x    = Add(x, ffn_a)
//! norm          xn   = RmsNorm(x, w_ffn)
//! matmul ×2     ffn_a, ffn_b = MatMul(W_g|W_u, xn)
//! swiglu        ffn_a = SwiGlu(ffn_a, ffn_b)
//! matmul        ffn_b = MatMul(W_d, ffn_a)
//! residual      x    = Add(x, ffn_b)
//! ```
//!
//! Every op of [`crate::block::Op`] has a lowering for every architecture keel reads;
//! an op whose buffers a layer lacks makes [`Builder::add_layer`] fail with the op's name.
//!
//! 17 ops and 13 tensors per llama layer, plus 13 tensors shared by the layers of a batch.
//! When the whole forward pass runs on the device, the first batch of a chunk of tokens
//! starts with the embedding lookup and the last one ends with the logits of the `k`
//! rows that need them (the last `k` of the chunk):
//!
//! ```text
//! x    = GetRows(token_embd, ids)              [n_embd, m]  (file type, dequantized)
//! …layers…
//! xn   = RmsNorm(x[m-k..], w_out_norm)         [n_embd, k]
//! logits = MatMul(W_output, xn)                [n_vocab, k]  (in the output buffer)
//! ```
//! The cache of one layer is `[n_ctx][n_head_kv][head_dim]` F16 for K, then the same
//! for V (the CPU cache's layout and type), so attention reads a strided
//! `[head_dim, n_kv, n_head_kv]` view.

use heapless::Vec;
use keel_npu_hal::op::{BufferRef, DType, Layout, OpDesc, OpKind, TensorDesc};
use keel_npu_hal::wire::{MAX_BUFFERS, MAX_OPS, MAX_TENSORS};
use keel_npu_hal::BufferId;

use crate::block::{BlockOps, Buf, Op, Param};
use crate::model::FfnAct;
use crate::placement::{LayerShape, WeightKind};

/// Why a layer (or the embedding lookup, or the logits) could not be added to a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LowerError {
    /// The batch's tables are full: undo, send the batch, start another.
    Full,
    /// A size or offset does not fit a descriptor's fields.
    Overflow,
    /// The op (named) has no lowering over this layer's buffers.
    NoLowering(&'static str),
    /// The layer's weight of this kind is not on the device.
    MissingWeight(WeightKind),
}

impl core::fmt::Display for LowerError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LowerError::Full => f.write_str("the batch's descriptor tables are full"),
            LowerError::Overflow => f.write_str("a size or offset overflows its descriptor field"),
            LowerError::NoLowering(op) => write!(f, "{op} has no device lowering for this layer"),
            LowerError::MissingWeight(k) => write!(f, "weight {} is not on this device", k.name()),
        }
    }
}

/// Ops one llama layer adds to a batch (Qwen 2's biases add 3, Qwen 3's head norms 2).
pub const OPS_PER_LAYER: usize = 17;

/// Most llama layers one batch carries under a limit of `max_ops` ops and the wire's
/// tensor table (each layer adds 13 tensors to the 13 shared ones).
pub fn layers_per_batch(max_ops: usize) -> usize {
    (max_ops / OPS_PER_LAYER).min((MAX_TENSORS - 13) / 13)
}

/// A tensor a device holds: `bytes` at `offset` in buffer `buf` (whose size is `size`).
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    /// The buffer.
    pub buf: BufferId,
    /// The buffer's size.
    pub size: u64,
    /// Where the tensor starts.
    pub offset: u32,
}

/// A repacked weight on the device.
#[derive(Clone, Copy, Debug)]
pub struct Weight {
    /// Where.
    pub at: Placed,
    /// Its device type.
    pub dtype: DType,
    /// Output rows.
    pub rows: usize,
    /// Input columns.
    pub cols: usize,
}

/// What one whole layer has on the device besides its products' weights.
#[derive(Clone, Copy, Debug)]
pub struct Resident {
    /// F32 attention norm weight (`n_embd`).
    pub attn_norm: Placed,
    /// F32 feed-forward norm weight (`n_embd`).
    pub ffn_norm: Placed,
    /// F32 q, k, v biases (`q_dim`, `kv_dim`, `kv_dim`), when the layer has them.
    pub biases: Option<[Placed; 3]>,
    /// F32 per-head q and k norm weights (`head_dim` each), when the layer has them.
    pub head_norms: Option<[Placed; 2]>,
    /// F32 post-attention and post-feed-forward norm weights (`n_embd`), when the layer has them.
    pub post_norms: Option<[Placed; 2]>,
    /// F16 K cache (`n_ctx × kv_dim`); V follows at `v_offset` in the same buffer (an
    /// attention layer's; a delta-net layer has [`Resident::delta`] instead).
    pub kv: Placed,
    /// Offset of the V cache in `kv.buf`.
    pub v_offset: u32,
    /// A delta-net layer's tensors and recurrent state.
    pub delta: Option<DeltaResident>,
}

/// What a delta-net layer has on the device besides its products' weights.
#[derive(Clone, Copy, Debug)]
pub struct DeltaResident {
    /// F32 conv taps `[d_conv, channels]`.
    pub taps: Placed,
    /// F32 alpha bias (`n_v_heads`).
    pub dt_bias: Placed,
    /// F32 decay rates (`n_v_heads`).
    pub a: Placed,
    /// F32 gated output norm weight (`d_state`).
    pub norm: Placed,
    /// F32 conv state `[d_conv - 1, channels]`, updated by every pass.
    pub conv_state: Placed,
    /// F32 recurrent state `[d_state, d_state, n_v_heads]`, updated by every pass.
    pub ssm_state: Placed,
}

/// Bytes of a delta-net layer's conv state and recurrent state, each rounded to a vector.
pub fn state_bytes(s: &crate::model::Ssm) -> (u64, u64) {
    let conv = (4 * ((s.d_conv - 1) * s.conv_channels()) as u64).next_multiple_of(128);
    let ssm = (4 * (s.n_v_heads * s.d_state * s.d_state) as u64).next_multiple_of(128);
    (conv, ssm)
}

/// Bytes of one layer's K (or V) cache, rounded to a vector.
pub fn cache_bytes(sh: &LayerShape, n_ctx: usize) -> u64 {
    (n_ctx as u64 * sh.kv_dim() as u64 * 2).next_multiple_of(128)
}

/// Offsets (bytes) of the activations of `m` tokens in the work buffer.
#[derive(Clone, Copy, Debug)]
pub struct Work {
    x: u32,
    xn: u32,
    q: u32,
    k: u32,
    v: u32,
    /// `Buf::FfnA`: the mixer's projected output, then the feed-forward's first half.
    ffa: u32,
    /// `Buf::FfnB`: the feed-forward's second half, then its projected output.
    ffb: u32,
    pos: u32,
    cs: u32,
    tok: u32,
    /// Gated attention: the `[q | gate]` rows and the gates.
    qg: u32,
    gate: u32,
    /// Delta-net layers: `Buf::Qkv`, `Buf::Z`, `Buf::Beta` then `Buf::Alpha` (adjacent:
    /// the gates' two planes), `Buf::Conv`, and the mixer output (`Buf::Attn` there).
    qkv: u32,
    z: u32,
    ab: u32,
    conv: u32,
    dout: u32,
    /// One past the last byte used.
    pub end: u64,
}

impl Work {
    /// The layout for `m` tokens, each region 128-byte aligned.
    pub fn new(sh: &LayerShape, m: usize) -> Option<Work> {
        let mut at = 0u64;
        let mut take = |floats: usize| -> Option<u32> {
            let o = at;
            at = (at + 4 * (floats as u64) * m as u64).next_multiple_of(128);
            u32::try_from(o).ok()
        };
        let q_dim = sh.n_head * sh.head_dim;
        let ff = sh.n_ff.max(sh.n_embd);
        let (x, xn, q, k, v) = (take(sh.n_embd)?, take(sh.n_embd)?, take(q_dim)?, take(sh.kv_dim())?, take(sh.kv_dim())?);
        let (ffa, ffb, pos, cs, tok) = (take(ff)?, take(ff)?, take(1)?, take(sh.n_rot)?, take(1)?);
        let (qg, gate) = if sh.gated { (take(2 * q_dim)?, take(q_dim)?) } else { (0, 0) };
        let (mut qkv, mut z, mut ab, mut conv, mut dout) = (0, 0, 0, 0, 0);
        if let Some(d) = sh.ssm {
            (qkv, z, ab, conv, dout) = (take(d.conv_channels())?, take(d.d_inner)?, take(2 * d.n_v_heads)?, take(d.conv_channels())?, take(d.d_inner)?);
        }
        u32::try_from(at).ok()?;
        Some(Work { x, xn, q, k, v, ffa, ffb, pos, cs, tok, qg, gate, qkv, z, ab, conv, dout, end: at })
    }

    /// Offset of the residual rows.
    pub fn x(&self) -> u32 {
        self.x
    }
    /// Offset of the I32 positions.
    pub fn pos(&self) -> u32 {
        self.pos
    }
    /// Offset of the F32 RoPE `(cos, sin)` table, `[n_rot, m]`.
    pub fn cs(&self) -> u32 {
        self.cs
    }
    /// Offset of the I32 token ids (for the embedding lookup).
    pub fn tok(&self) -> u32 {
        self.tok
    }
}

/// The token embedding's copy on the device: `rows` rows of `cols`, type `dtype`, in
/// the file's (ggml row) layout.
#[derive(Clone, Copy, Debug)]
pub struct Table {
    /// Where.
    pub at: Placed,
    /// Its type.
    pub dtype: DType,
    /// Rows (vocabulary size).
    pub rows: usize,
    /// Columns (`n_embd`).
    pub cols: usize,
}

/// The descriptor of the token embedding table.
pub fn table_desc(t: &Table, buffer: u16) -> Option<TensorDesc> {
    TensorDesc::contiguous(t.dtype, [u32::try_from(t.cols).ok()?, u32::try_from(t.rows).ok()?, 1, 1], buffer, t.at.offset)
}

/// One batch's three descriptor tables, filled layer by layer.
pub struct Builder {
    /// Buffer table.
    pub buffers: Vec<BufferRef, MAX_BUFFERS>,
    /// Tensor table.
    pub tensors: Vec<TensorDesc, MAX_TENSORS>,
    /// Op table.
    pub ops: Vec<OpDesc, MAX_OPS>,
    shared: Shared,
    /// Layers in this batch.
    pub layers: usize,
}

/// Indices of the tensors every layer of a batch shares.
#[derive(Clone, Copy)]
struct Shared {
    x: u16,
    xn: u16,
    q2: u16,
    q3: u16,
    k2: u16,
    k3: u16,
    v2: u16,
    /// `Buf::FfnA` as `[n_embd, m]` and as `[n_ff, m]`.
    ffa_e: u16,
    ffa_f: u16,
    /// `Buf::FfnB` likewise.
    ffb_e: u16,
    ffb_f: u16,
    /// Q and K as rows of one head: `[head_dim, heads·m]` (per-head norms).
    qh: u16,
    kh: u16,
    pos: u16,
    cs: u16,
    gated: Option<GatedShared>,
    delta: Option<DeltaShared>,
}

impl Shared {
    const EMPTY: Shared = Shared { x: 0, xn: 0, q2: 0, q3: 0, k2: 0, k3: 0, v2: 0, ffa_e: 0, ffa_f: 0, ffb_e: 0, ffb_f: 0, qh: 0, kh: 0, pos: 0, cs: 0, gated: None, delta: None };
}

/// Tensors of a gated attention layer.
#[derive(Clone, Copy)]
struct GatedShared {
    /// `[2·q_dim, m]`: the query projection's rows `[q | gate]` per head.
    qg2: u16,
    /// The q and gate halves as `[head_dim, n_head, m]` views of `qg2`.
    qg_q: u16,
    qg_g: u16,
    /// The gates, `[head_dim, n_head, m]` and `[q_dim, m]`.
    gate3: u16,
    gate2: u16,
}

/// Tensors of a delta-net layer.
#[derive(Clone, Copy)]
struct DeltaShared {
    qkv2: u16,
    z2: u16,
    beta2: u16,
    alpha2: u16,
    /// Beta and alpha as the gates' planes `[n_v_heads, m, 2]`.
    ab3: u16,
    conv2: u16,
    /// The q and k heads of `conv2` as rows `[d_state, 2·n_k_heads, m]` (strided).
    conv_qk: u16,
    /// Every head of `conv2`: `[d_state, 2·n_k_heads + n_v_heads, m]`.
    conv_all: u16,
    /// The mixer's output `[d_inner, m]`, `[d_state, n_v_heads, m]` and as rows of one
    /// head `[d_state, n_v_heads·m]`.
    dout2: u16,
    dout3: u16,
    douth: u16,
}

fn f32s(ne: [u32; 4], buffer: u16, offset: u32) -> Option<TensorDesc> {
    TensorDesc::contiguous(DType::F32, ne, buffer, offset)
}

impl Default for Builder {
    fn default() -> Self {
        Builder::new()
    }
}

impl Builder {
    /// Empty tables (fill them with [`Builder::start`]). The builder is large (the wire's
    /// bounded tables); a host keeps one per device and reuses it for every batch.
    pub const fn new() -> Builder {
        Builder { buffers: Vec::new(), tensors: Vec::new(), ops: Vec::new(), shared: Shared::EMPTY, layers: 0 }
    }

    /// Clears the tables and starts a batch for `m` tokens with the work buffer
    /// `work_buf` laid out as `w`.
    pub fn start(&mut self, sh: &LayerShape, w: &Work, work_buf: BufferRef, m: usize) -> Result<(), LowerError> {
        self.buffers.clear();
        self.tensors.clear();
        self.ops.clear();
        self.layers = 0;
        self.buffers.push(work_buf).map_err(|_| LowerError::Full)?;
        let ov = LowerError::Overflow;
        let f32s = |ne, offset| f32s(ne, 0, offset).ok_or(ov);
        let (e, f, hd, m) = (sh.n_embd as u32, sh.n_ff as u32, sh.head_dim as u32, m as u32);
        let (nh, nkv) = (sh.n_head as u32, sh.n_head_kv as u32);
        let b = self;
        b.shared = Shared {
            x: b.push(f32s([e, m, 1, 1], w.x)?)?,
            xn: b.push(f32s([e, m, 1, 1], w.xn)?)?,
            q2: b.push(f32s([nh * hd, m, 1, 1], w.q)?)?,
            q3: b.push(f32s([hd, nh, m, 1], w.q)?)?,
            k2: b.push(f32s([nkv * hd, m, 1, 1], w.k)?)?,
            k3: b.push(f32s([hd, nkv, m, 1], w.k)?)?,
            v2: b.push(f32s([nkv * hd, m, 1, 1], w.v)?)?,
            ffa_e: b.push(f32s([e, m, 1, 1], w.ffa)?)?,
            ffa_f: b.push(f32s([f, m, 1, 1], w.ffa)?)?,
            ffb_e: b.push(f32s([e, m, 1, 1], w.ffb)?)?,
            ffb_f: b.push(f32s([f, m, 1, 1], w.ffb)?)?,
            qh: b.push(f32s([hd, nh * m, 1, 1], w.q)?)?,
            kh: b.push(f32s([hd, nkv * m, 1, 1], w.k)?)?,
            pos: b.push(TensorDesc::contiguous(DType::I32, [m, 1, 1, 1], 0, w.pos).ok_or(ov)?)?,
            cs: b.push(f32s([sh.n_rot as u32, m, 1, 1], w.cs)?)?,
            gated: None,
            delta: None,
        };
        if sh.gated {
            let qd = nh * hd;
            // Each head's q then gate: rows of hd, 2·hd apart, tokens 2·q_dim apart.
            let half = |offset: u32| TensorDesc { dtype: DType::F32, layout: Layout::RowMajor, ne: [hd, nh, m, 1], nb: [4, 8 * hd, 8 * qd, 8 * qd * m], buffer: 0, offset };
            b.shared.gated = Some(GatedShared {
                qg2: b.push(f32s([2 * qd, m, 1, 1], w.qg)?)?,
                qg_q: b.push(half(w.qg))?,
                qg_g: b.push(half(w.qg + 4 * hd))?,
                gate3: b.push(f32s([hd, nh, m, 1], w.gate)?)?,
                gate2: b.push(f32s([qd, m, 1, 1], w.gate)?)?,
            });
        }
        if let Some(d) = sh.ssm {
            let (ch, di, nv, nk, ds) = (d.conv_channels() as u32, d.d_inner as u32, d.n_v_heads as u32, d.n_k_heads as u32, d.d_state as u32);
            let heads = |n: u32| TensorDesc { dtype: DType::F32, layout: Layout::RowMajor, ne: [ds, n, m, 1], nb: [4, 4 * ds, 4 * ch, 4 * ch * m], buffer: 0, offset: w.conv };
            b.shared.delta = Some(DeltaShared {
                qkv2: b.push(f32s([ch, m, 1, 1], w.qkv)?)?,
                z2: b.push(f32s([di, m, 1, 1], w.z)?)?,
                beta2: b.push(f32s([nv, m, 1, 1], w.ab)?)?,
                alpha2: b.push(f32s([nv, m, 1, 1], w.ab + 4 * nv * m)?)?,
                ab3: b.push(f32s([nv, m, 2, 1], w.ab)?)?,
                conv2: b.push(f32s([ch, m, 1, 1], w.conv)?)?,
                conv_qk: b.push(heads(2 * nk))?,
                conv_all: b.push(heads(2 * nk + nv))?,
                dout2: b.push(f32s([di, m, 1, 1], w.dout)?)?,
                dout3: b.push(f32s([ds, nv, m, 1], w.dout)?)?,
                douth: b.push(f32s([ds, nv * m, 1, 1], w.dout)?)?,
            });
        }
        Ok(())
    }

    /// The batch as the HAL takes it.
    pub fn batch(&self) -> keel_npu_hal::Batch<'_> {
        keel_npu_hal::Batch { buffers: &self.buffers, tensors: &self.tensors, ops: &self.ops }
    }

    /// Table lengths `(ops, tensors, buffers)`, to undo to with [`Builder::undo`].
    pub fn mark(&self) -> (usize, usize, usize) {
        (self.ops.len(), self.tensors.len(), self.buffers.len())
    }

    fn push(&mut self, t: TensorDesc) -> Result<u16, LowerError> {
        self.tensors.push(t).map_err(|_| LowerError::Full)?;
        u16::try_from(self.tensors.len() - 1).map_err(|_| LowerError::Overflow)
    }

    fn buffer(&mut self, id: BufferId, size: u64) -> Result<u16, LowerError> {
        match self.buffers.iter().position(|b| b.id == id) {
            Some(i) => Ok(i as u16),
            None => {
                self.buffers.push(BufferRef { id, size }).map_err(|_| LowerError::Full)?;
                Ok((self.buffers.len() - 1) as u16)
            }
        }
    }

    fn op(&mut self, kind: OpKind, src: [Option<u16>; 3], dst: u16) -> Result<(), LowerError> {
        self.ops.push(OpDesc { kind, src, dst }).map_err(|_| LowerError::Full)
    }

    /// Appends the embedding lookup of the `m` token ids in the work buffer into the
    /// residual rows (and Gemma's scale of them, when `scale` is not 1).
    pub fn add_embedding(&mut self, t: &Table, w: &Work, m: usize, scale: f32) -> Result<(), LowerError> {
        let ov = LowerError::Overflow;
        let buf = self.buffer(t.at.buf, t.at.size)?;
        let table = self.push(table_desc(t, buf).ok_or(ov)?)?;
        let ids = self.push(TensorDesc::contiguous(DType::I32, [u32::try_from(m).map_err(|_| ov)?, 1, 1, 1], 0, w.tok).ok_or(ov)?)?;
        self.op(OpKind::GetRows, [Some(table), Some(ids), None], self.shared.x)?;
        if scale != 1.0 {
            // Gemma's scaled embeddings: `x *= scale`, as the CPU's `ops::scale`.
            self.op(OpKind::Scale { s: scale }, [Some(self.shared.x), None, None], self.shared.x)?;
        }
        Ok(())
    }

    /// Appends the final RMSNorm (weight `norm`) of the last `k` of the `m` residual
    /// rows and the output projection `out` of them into the first `k` rows of `logits`
    /// (F32 `[out.rows, k]`).
    #[allow(clippy::too_many_arguments)]
    pub fn add_output(&mut self, sh: &LayerShape, w: &Work, norm: Placed, out: &Weight, logits: BufferRef, m: usize, k: usize) -> Result<(), LowerError> {
        let ov = LowerError::Overflow;
        let (e, k32) = (u32::try_from(sh.n_embd).map_err(|_| ov)?, u32::try_from(k).map_err(|_| ov)?);
        let skip = u32::try_from(m.checked_sub(k).ok_or(ov)?).ok().and_then(|s| s.checked_mul(4 * e)).ok_or(ov)?;
        let x = self.push(f32s([e, k32, 1, 1], 0, w.x.checked_add(skip).ok_or(ov)?).ok_or(ov)?)?;
        let xn = self.push(f32s([e, k32, 1, 1], 0, w.xn).ok_or(ov)?)?;
        let nb = self.buffer(norm.buf, norm.size)?;
        let nw = self.push(f32s([e, 1, 1, 1], nb, norm.offset).ok_or(ov)?)?;
        let wt = self.weight(out)?;
        let lb = self.buffer(logits.id, logits.size)?;
        let dst = self.push(f32s([u32::try_from(out.rows).map_err(|_| ov)?, k32, 1, 1], lb, 0).ok_or(ov)?)?;
        self.op(OpKind::RmsNorm { eps: sh.rms_eps }, [Some(x), Some(nw), None], xn)?;
        self.op(OpKind::MatMul, [Some(wt), Some(xn), None], dst)
    }

    /// The Tiles32 descriptor of a weight, its buffer in the table.
    fn weight(&mut self, wt: &Weight) -> Result<u16, LowerError> {
        let buf = self.buffer(wt.at.buf, wt.at.size)?;
        let ov = LowerError::Overflow;
        let (cols, rows) = (u32::try_from(wt.cols).map_err(|_| ov)?, u32::try_from(wt.rows).map_err(|_| ov)?);
        self.push(TensorDesc { dtype: wt.dtype, layout: Layout::Tiles32, ne: [cols, rows, 1, 1], nb: [0; 4], buffer: buf, offset: wt.at.offset })
    }

    /// Drops everything after a [`Builder::mark`] (undoes an add that did not fit).
    pub fn undo(&mut self, (ops, tensors, buffers): (usize, usize, usize)) {
        self.ops.truncate(ops);
        self.tensors.truncate(tensors);
        self.buffers.truncate(buffers);
    }

    /// Whether the ops fit the device's `max_ops` (the wire's tables are never exceeded).
    pub fn fits(&self, max_ops: usize) -> bool {
        self.ops.len() <= max_ops
    }

    /// Appends the lowering of a layer's block ops `ops` for `m` tokens at positions
    /// `pos..pos + m` (the builder's `m`). `weight(kind)`: the layer's weights on the
    /// device. `Err`: a descriptor overflowed, or an op (named) has no lowering yet.
    /// `sh` is this layer's shape; `table_base` the RoPE base of the batch's (cos, sin) table.
    #[allow(clippy::too_many_arguments)]
    pub fn add_layer(&mut self, sh: &LayerShape, table_base: f32, ops: &BlockOps, weight: &dyn Fn(WeightKind) -> Option<Weight>, r: &Resident, m: usize, pos: usize) -> Result<(), LowerError> {
        let overflow = || LowerError::Overflow;
        let s = self.shared;
        let (e, f, hd, kvd) = (sh.n_embd as u32, sh.n_ff as u32, sh.head_dim as u32, sh.kv_dim() as u32);
        let (m, pos) = (m as u32, u32::try_from(pos).map_err(|_| overflow())?);
        // A row buffer of a given width (`Attn` is `Q`: attention runs in place).
        let qd = sh.n_head as u32 * hd;
        let rows = |b: Buf, width: u32| -> Option<u16> {
            Some(match b {
                Buf::X => s.x,
                Buf::Xn => s.xn,
                Buf::Q if sh.gated && width == 2 * qd => s.gated?.qg2,
                Buf::Attn if sh.delta => s.delta?.dout2,
                Buf::Q | Buf::Attn => s.q2,
                Buf::Qkv => s.delta?.qkv2,
                Buf::Z => s.delta?.z2,
                Buf::Beta => s.delta?.beta2,
                Buf::Alpha => s.delta?.alpha2,
                Buf::Conv => s.delta?.conv2,
                Buf::K => s.k2,
                Buf::V => s.v2,
                Buf::FfnA if width == e => s.ffa_e,
                Buf::FfnA if width == f => s.ffa_f,
                Buf::FfnB if width == e => s.ffb_e,
                Buf::FfnB if width == f => s.ffb_f,
                _ => return None,
            })
        };
        // A layer vector on the device as one row of its width.
        let param = |b: &mut Builder, p: Param| -> Result<Option<u16>, LowerError> {
            let Some((at, width)) = (|| Some(match p {
                Param::AttnNorm => (r.attn_norm, e),
                Param::FfnNorm => (r.ffn_norm, e),
                Param::QBias => (r.biases?[0], sh.n_head as u32 * hd),
                Param::KBias => (r.biases?[1], kvd),
                Param::VBias => (r.biases?[2], kvd),
                Param::QNorm => (r.head_norms?[0], hd),
                Param::KNorm => (r.head_norms?[1], hd),
                Param::AttnPostNorm => (r.post_norms?[0], e),
                Param::FfnPostNorm => (r.post_norms?[1], e),
                Param::DtBias => (r.delta?.dt_bias, sh.ssm?.n_v_heads as u32),
                Param::A => (r.delta?.a, sh.ssm?.n_v_heads as u32),
                Param::SsmNorm => (r.delta?.norm, sh.ssm?.d_state as u32),
                _ => return None,
            }))() else {
                return Ok(None);
            };
            let nb = b.buffer(at.buf, at.size)?;
            b.push(f32s([width, 1, 1, 1], nb, at.offset).ok_or(LowerError::Overflow)?).map(Some)
        };
        // A delta-net layer has no KV cache (its `kv` is not a buffer of the batch).
        let kb = if sh.delta { 0 } else { self.buffer(r.kv.buf, r.kv.size)? };
        let row = 2 * kvd;
        let n_kv = pos.checked_add(m).ok_or_else(overflow)?;
        let view = |offset| TensorDesc { dtype: DType::F16, layout: Layout::RowMajor, ne: [hd, n_kv, sh.n_head_kv as u32, 1], nb: [2, row, 2 * hd, row * n_kv], buffer: kb, offset };
        let no_lowering = |op: &Op| LowerError::NoLowering(op.name());
        for op in ops.iter() {
            match *op {
                Op::Norm { w, src, dst } => {
                    let wn = param(self, w)?.ok_or_else(|| no_lowering(op))?;
                    let (x, y) = (rows(src, e).ok_or_else(|| no_lowering(op))?, rows(dst, e).ok_or_else(|| no_lowering(op))?);
                    self.op(OpKind::RmsNorm { eps: sh.rms_eps }, [Some(x), Some(wn), None], y)?;
                }
                Op::MatMul { w, src, dst } => {
                    let wt = weight(w).ok_or(LowerError::MissingWeight(w))?;
                    let wi = self.weight(&wt)?;
                    let x = rows(src, wt.cols as u32).ok_or_else(|| no_lowering(op))?;
                    let y = rows(dst, wt.rows as u32).ok_or_else(|| no_lowering(op))?;
                    self.op(OpKind::MatMul, [Some(wi), Some(x), None], y)?;
                }
                Op::Rope => {
                    let rope = OpKind::Rope { n_dims: u16::try_from(sh.n_rot).map_err(|_| overflow())?, mode: if sh.rope_neox { 2 } else { 0 }, freq_base: sh.rope_base };
                    // The host's (cos, sin) table is for `table_base`; a layer with another
                    // base (Gemma 3's local layers) has the device compute its angles with
                    // keel-core's `rope_angles`, the CPU's function.
                    let cs = (sh.rope_base == table_base).then_some(s.cs);
                    self.op(rope, [Some(s.q3), Some(s.pos), cs], s.q3)?;
                    self.op(rope, [Some(s.k3), Some(s.pos), cs], s.k3)?;
                }
                Op::QueryScale => self.op(OpKind::Scale { s: sh.attn_scale }, [Some(s.q2), None, None], s.q2)?,
                Op::KvStore => {
                    let k_at = r.kv.offset.checked_add(pos.checked_mul(row).ok_or_else(overflow)?).ok_or_else(overflow)?;
                    let v_at = r.v_offset.checked_add(pos.checked_mul(row).ok_or_else(overflow)?).ok_or_else(overflow)?;
                    let k_dst = self.push(TensorDesc::contiguous(DType::F16, [kvd, m, 1, 1], kb, k_at).ok_or_else(overflow)?)?;
                    let v_dst = self.push(TensorDesc::contiguous(DType::F16, [kvd, m, 1, 1], kb, v_at).ok_or_else(overflow)?)?;
                    self.op(OpKind::Copy, [Some(s.k2), None, None], k_dst)?;
                    self.op(OpKind::Copy, [Some(s.v2), None, None], v_dst)?;
                }
                Op::Attention { window } => {
                    // Queries scaled beforehand (QueryScale) attend with scale 1, as on the CPU.
                    let scale = if sh.q_prescale { 1.0 } else { sh.attn_scale };
                    let window = u32::try_from(window).map_err(|_| overflow())?;
                    let attn = OpKind::Attention { n_head: u16::try_from(sh.n_head).map_err(|_| overflow())?, n_head_kv: u16::try_from(sh.n_head_kv).map_err(|_| overflow())?, scale, window };
                    let k_all = self.push(view(r.kv.offset))?;
                    let v_all = self.push(view(r.v_offset))?;
                    self.op(attn, [Some(s.q3), Some(k_all), Some(v_all)], s.q3)?;
                }
                Op::Bias { w, dst } => {
                    let bias = param(self, w)?.ok_or_else(|| no_lowering(op))?;
                    let width = if dst == Buf::Q { sh.n_head as u32 * hd } else { kvd };
                    let y = rows(dst, width).ok_or_else(|| no_lowering(op))?;
                    self.op(OpKind::Add, [Some(y), Some(bias), None], y)?;
                }
                Op::HeadNorm { w, dst } => {
                    let wn = param(self, w)?.ok_or_else(|| no_lowering(op))?;
                    let heads = if dst == Buf::Q { s.qh } else { s.kh };
                    self.op(OpKind::RmsNorm { eps: sh.rms_eps }, [Some(heads), Some(wn), None], heads)?;
                }
                Op::Residual { src, post_norm: None } => {
                    let y = rows(src, e).ok_or_else(|| no_lowering(op))?;
                    self.op(OpKind::Add, [Some(s.x), Some(y), None], s.x)?;
                }
                Op::Residual { src, post_norm: Some(p) } => {
                    // x += rms_norm(src)·w, the normed rows in xn (as the CPU does).
                    let (y, wn) = (rows(src, e).ok_or_else(|| no_lowering(op))?, param(self, p)?.ok_or_else(|| no_lowering(op))?);
                    self.op(OpKind::RmsNorm { eps: sh.rms_eps }, [Some(y), Some(wn), None], s.xn)?;
                    self.op(OpKind::Add, [Some(s.x), Some(s.xn), None], s.x)?;
                }
                Op::FfnAct(FfnAct::Silu) => self.op(OpKind::SwiGlu, [Some(s.ffa_f), Some(s.ffb_f), None], s.ffa_f)?,
                Op::FfnAct(FfnAct::GeluTanh) => self.op(OpKind::GeGlu, [Some(s.ffa_f), Some(s.ffb_f), None], s.ffa_f)?,
                Op::SplitQueryGate => {
                    let g = s.gated.ok_or_else(|| no_lowering(op))?;
                    self.op(OpKind::Copy, [Some(g.qg_q), None, None], s.q3)?;
                    self.op(OpKind::Copy, [Some(g.qg_g), None, None], g.gate3)?;
                }
                Op::AttnGate => {
                    // Attn (in place in Q) *= sigmoid(gate): the CPU's `ops::mul_sigmoid`.
                    let g = s.gated.ok_or_else(|| no_lowering(op))?;
                    self.op(OpKind::Sigmoid, [Some(g.gate2), None, None], g.gate2)?;
                    self.op(OpKind::Mul, [Some(s.q2), Some(g.gate2), None], s.q2)?;
                }
                Op::DeltaGates => {
                    // beta = sigmoid(beta); g = softplus(alpha + dt_bias)·a (`delta_net::gates`).
                    let d = s.delta.ok_or_else(|| no_lowering(op))?;
                    let (dt, a) = (param(self, Param::DtBias)?.ok_or_else(|| no_lowering(op))?, param(self, Param::A)?.ok_or_else(|| no_lowering(op))?);
                    self.op(OpKind::Sigmoid, [Some(d.beta2), None, None], d.beta2)?;
                    self.op(OpKind::Add, [Some(d.alpha2), Some(dt), None], d.alpha2)?;
                    self.op(OpKind::Softplus, [Some(d.alpha2), None, None], d.alpha2)?;
                    self.op(OpKind::Mul, [Some(d.alpha2), Some(a), None], d.alpha2)?;
                }
                Op::SsmConv => {
                    let (d, ssm, dr) = (s.delta.ok_or_else(|| no_lowering(op))?, sh.ssm.ok_or_else(|| no_lowering(op))?, r.delta.ok_or_else(|| no_lowering(op))?);
                    let (ch, kc) = (ssm.conv_channels() as u32, ssm.d_conv as u32);
                    let tb = self.buffer(dr.taps.buf, dr.taps.size)?;
                    let taps = self.push(f32s([kc, ch, 1, 1], tb, dr.taps.offset).ok_or_else(overflow)?)?;
                    let sb = self.buffer(dr.conv_state.buf, dr.conv_state.size)?;
                    let state = self.push(f32s([kc - 1, ch, 1, 1], sb, dr.conv_state.offset).ok_or_else(overflow)?)?;
                    self.op(OpKind::SsmConv, [Some(d.qkv2), Some(taps), Some(state)], d.conv2)?;
                }
                Op::QkL2Norm => {
                    let d = s.delta.ok_or_else(|| no_lowering(op))?;
                    self.op(OpKind::L2Norm { eps: sh.rms_eps }, [Some(d.conv_qk), None, None], d.conv_qk)?;
                }
                Op::DeltaRule => {
                    let (d, ssm, dr) = (s.delta.ok_or_else(|| no_lowering(op))?, sh.ssm.ok_or_else(|| no_lowering(op))?, r.delta.ok_or_else(|| no_lowering(op))?);
                    let ds = ssm.d_state as u32;
                    let sb = self.buffer(dr.ssm_state.buf, dr.ssm_state.size)?;
                    let state = self.push(f32s([ds, ds, ssm.n_v_heads as u32, 1], sb, dr.ssm_state.offset).ok_or_else(overflow)?)?;
                    // Token by token: the CPU's default (llama.cpp's fused op); the scale's square root is
                    // correctly rounded, the CPU's function.
                    let kind = OpKind::GatedDeltaRule { n_k_heads: u16::try_from(ssm.n_k_heads).map_err(|_| overflow())?, chunk: 0, scale: 1.0 / libm::sqrtf(ds as f32) };
                    self.op(kind, [Some(d.conv_all), Some(d.ab3), Some(state)], d.dout3)?;
                }
                Op::GatedNorm => {
                    // rms_norm(o)·w per head, then silu(z)·o (`delta_net::gated_norm`'s bits),
                    // computed in z and copied back to the mixer output.
                    let d = s.delta.ok_or_else(|| no_lowering(op))?;
                    let wn = param(self, Param::SsmNorm)?.ok_or_else(|| no_lowering(op))?;
                    self.op(OpKind::RmsNorm { eps: sh.rms_eps }, [Some(d.douth), Some(wn), None], d.douth)?;
                    self.op(OpKind::SwiGlu, [Some(d.z2), Some(d.dout2), None], d.z2)?;
                    self.op(OpKind::Copy, [Some(d.z2), None, None], d.dout2)?;
                }
            }
        }
        self.layers += 1;
        Ok(())
    }

    /// Undoes the last [`Builder::add_layer`] (it did not fit), back to its [`Builder::mark`].
    pub fn truncate(&mut self, mark: (usize, usize, usize)) {
        self.undo(mark);
        self.layers -= 1;
    }
}

/// Asks `ok` about the descriptors of one op of each kind a layer of shape `sh` uses
/// besides its products, at one token: whether a device runs the layer whole. `false`
/// as soon as one answer is no, or when a size does not fit a descriptor.
pub fn probe_ops(sh: &LayerShape, ok: &mut dyn FnMut(&OpDesc, &[TensorDesc]) -> bool) -> bool {
    probe_layer(sh, ok).unwrap_or(false)
}

fn probe_layer(sh: &LayerShape, ok: &mut dyn FnMut(&OpDesc, &[TensorDesc]) -> bool) -> Option<bool> {
    let (e, f, hd) = (sh.n_embd as u32, sh.n_ff as u32, sh.head_dim as u32);
    let (nh, nkv) = (sh.n_head as u32, sh.n_head_kv as u32);
    let mut probe = |kind, src: [Option<u16>; 3], dst, t: &[TensorDesc]| ok(&OpDesc { kind, src, dst }, t);
    let row = |n| f32s([n, 1, 1, 1], 0, 0);
    let q3 = f32s([hd, nh, 1, 1], 0, 0)?;
    let kv = TensorDesc::contiguous(DType::F16, [hd, 1, nkv, 1], 0, 0)?;
    let (s01, s012, s0) = ([Some(0), Some(1), None], [Some(0), Some(1), Some(2)], [Some(0), None, None]);
    let attention = |window| Some(OpKind::Attention { n_head: u16::try_from(nh).ok()?, n_head_kv: u16::try_from(nkv).ok()?, scale: sh.attn_scale, window });
    let rope = OpKind::Rope { n_dims: u16::try_from(sh.n_rot).ok()?, mode: if sh.rope_neox { 2 } else { 0 }, freq_base: sh.rope_base };
    let mut all = probe(OpKind::RmsNorm { eps: sh.rms_eps }, s01, 2, &[row(e)?, row(e)?, row(e)?])
        && probe(rope, s012, 0, &[q3, TensorDesc::contiguous(DType::I32, [1, 1, 1, 1], 0, 0)?, row(sh.n_rot as u32)?])
        && probe(OpKind::Copy, s0, 1, &[row(nkv * hd)?, TensorDesc::contiguous(DType::F16, [nkv * hd, 1, 1, 1], 0, 0)?])
        && probe(attention(0)?, s012, 0, &[q3, kv, kv])
        && probe(OpKind::SwiGlu, s01, 0, &[row(f)?, row(f)?])
        && probe(OpKind::Add, s01, 0, &[row(e)?, row(e)?]);
    if sh.biases {
        // A bias row added to the rows of q (and likewise k, v).
        all = all && probe(OpKind::Add, s01, 0, &[f32s([nh * hd, 2, 1, 1], 0, 0)?, row(nh * hd)?]);
    }
    if sh.q_prescale {
        all = all && probe(OpKind::Scale { s: sh.attn_scale }, s0, 0, &[row(nh * hd)?]);
    }
    if sh.geglu {
        all = all && probe(OpKind::GeGlu, s01, 0, &[row(f)?, row(f)?]);
    }
    if sh.window > 0 {
        all = all && probe(attention(u32::try_from(sh.window).ok()?)?, s012, 0, &[q3, kv, kv]);
    }
    if sh.gated {
        // The gates: sigmoid, then a product with the attention output.
        all = all && probe(OpKind::Sigmoid, s0, 0, &[row(nh * hd)?]) && probe(OpKind::Mul, s01, 0, &[row(nh * hd)?, row(nh * hd)?]);
    }
    if let (true, Some(d)) = (sh.delta, sh.ssm) {
        let (ch, nv, nk, ds, kc) = (d.conv_channels() as u32, d.n_v_heads as u32, d.n_k_heads as u32, d.d_state as u32, d.d_conv as u32);
        let heads = |n: u32| TensorDesc { dtype: DType::F32, layout: Layout::RowMajor, ne: [ds, n, 1, 1], nb: [4, 4 * ds, 4 * ch, 4 * ch], buffer: 0, offset: 0 };
        let rule = OpKind::GatedDeltaRule { n_k_heads: u16::try_from(nk).ok()?, chunk: 0, scale: 1.0 };
        all = all
            && probe(OpKind::Softplus, s0, 0, &[row(nv)?])
            && probe(OpKind::SsmConv, s012, 3, &[row(ch)?, f32s([kc, ch, 1, 1], 0, 0)?, f32s([kc.checked_sub(1)?, ch, 1, 1], 0, 0)?, row(ch)?])
            && probe(OpKind::L2Norm { eps: sh.rms_eps }, s0, 0, &[heads(2 * nk)])
            && probe(rule, s012, 3, &[heads(2 * nk + nv), f32s([nv, 1, 2, 1], 0, 0)?, f32s([ds, ds, nv, 1], 0, 0)?, f32s([ds, nv, 1, 1], 0, 0)?]);
    }
    if sh.head_norms {
        // RMSNorm of each head of q (rows of head_dim) times a head_dim weight.
        all = all && probe(OpKind::RmsNorm { eps: sh.rms_eps }, s01, 0, &[f32s([hd, nh, 1, 1], 0, 0)?, row(hd)?]);
    }
    Some(all)
}

/// Asks `ok` about the descriptors of the embedding lookup: one `GetRows` of one token
/// from a `rows × cols` table of `dtype` and, when `scaled`, the `Scale` of the row
/// (Gemma's scaled embeddings). `false` as soon as one answer is no.
pub fn probe_embedding(dtype: DType, rows: usize, cols: usize, scaled: bool, ok: &mut dyn FnMut(&OpDesc, &[TensorDesc]) -> bool) -> bool {
    let mut probe = || -> Option<bool> {
        let c = u32::try_from(cols).ok()?;
        let table = TensorDesc::contiguous(dtype, [c, u32::try_from(rows).ok()?, 1, 1], 0, 0)?;
        let ids = TensorDesc::contiguous(DType::I32, [1, 1, 1, 1], 0, 0)?;
        let out = f32s([c, 1, 1, 1], 0, 0)?;
        let get = ok(&OpDesc { kind: OpKind::GetRows, src: [Some(0), Some(1), None], dst: 2 }, &[table, ids, out]);
        Some(get && (!scaled || ok(&OpDesc { kind: OpKind::Scale { s: 1.0 }, src: [Some(0), None, None], dst: 0 }, &[out])))
    };
    probe().unwrap_or(false)
}

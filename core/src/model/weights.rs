//! Typed views of the model's tensors, checked against the hyper-parameters at load.
//!
//! Owns: finding each tensor by its llama.cpp name, checking its shape and type, and the
//! per-layer table. Weights stay where they are (the mapped file); nothing is copied.

use super::hparams::{Arch, HParams};
use crate::ggml_type::GgmlType;
use crate::gguf::{Gguf, GgufError, GgufErrorKind};
use crate::quant::rows16::ROWS16;

/// A 1-D or 2-D weight: `rows` rows of `cols` elements of `ty`, row-major, in the file.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'m> {
    /// Element type.
    pub ty: GgmlType,
    /// Row length (`ne[0]`).
    pub cols: usize,
    /// Number of rows (`ne[1]`; 1 for vectors).
    pub rows: usize,
    /// The raw data: every row, or for a matrix split in two parts its first rows.
    pub data: &'m [u8],
    /// The rest of a [`Layout::Rows16`] matrix the host placed in two parts, whole groups
    /// of 16 rows (`Gguf::with_splits`), else empty: rows `data.len() / row_bytes()..`.
    /// Read a matrix's groups through [`Tensor::groups`], which knows the parts.
    pub hi: &'m [u8],
    /// How the rows are laid out in `data`.
    pub layout: Layout,
}

/// How a matrix's rows are laid out in its bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// As in the file: row after row, each row's blocks in order.
    #[default]
    Plain,
    /// Rearranged in groups of 16 rows for the CPU's rows16 kernels
    /// ([`crate::quant::rows16`]): the same bytes within each group of 16 rows; only
    /// `matmul` reads such a matrix (through [`crate::quant::Kernels::dot_rows16_fn`]).
    Rows16,
}

impl<'m> Tensor<'m> {
    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.type_size()
    }

    /// Bytes of all its rows (both parts of a split matrix).
    pub fn size_bytes(&self) -> usize {
        self.data.len() + self.hi.len()
    }

    /// The first group of 16 rows in [`Tensor::hi`] (the groups in `data`; for a matrix
    /// in one part, all of its groups and more).
    pub fn hi_group(&self) -> usize {
        if self.hi.is_empty() {
            usize::MAX
        } else {
            self.data.len() / (ROWS16 * self.row_bytes()).max(1)
        }
    }

    /// The bytes of groups `g0..g1` of 16 rows of a [`Layout::Rows16`] matrix, from the
    /// part that holds them (a range across the two parts: split it with
    /// [`Tensor::group_parts`] first; panics otherwise, as an index out of range does).
    pub fn groups(&self, g0: usize, g1: usize) -> &'m [u8] {
        let gb = ROWS16 * self.row_bytes();
        let h = self.hi_group();
        if g0 >= h {
            &self.hi[(g0 - h) * gb..(g1 - h) * gb]
        } else {
            assert!(g1 <= h, "groups {g0}..{g1} span both parts of a split matrix");
            &self.data[g0 * gb..g1 * gb]
        }
    }

    /// Groups `range` in (at most) two ranges, each within one part ([`Tensor::groups`]).
    pub fn group_parts(&self, range: core::ops::Range<usize>) -> [core::ops::Range<usize>; 2] {
        let h = self.hi_group().clamp(range.start, range.end);
        [range.start..h, h..range.end]
    }

    /// Where byte `off` of the matrix's rows (counted as if in one part) lies.
    pub fn byte_ptr(&self, off: usize) -> *const u8 {
        if off >= self.data.len() && !self.hi.is_empty() {
            self.hi.as_ptr().wrapping_add(off - self.data.len())
        } else {
            self.data.as_ptr().wrapping_add(off)
        }
    }

    /// Row `r` dequantized into `out` (`cols` floats), in either layout.
    pub fn dequantize_row(&self, k: &crate::quant::Kernels, r: usize, out: &mut [f32]) -> Result<(), crate::quant::Unsupported> {
        match self.layout {
            Layout::Plain => k.dequantize_row(self.ty, self.row(r), out),
            Layout::Rows16 => {
                let h = self.hi_group().saturating_mul(ROWS16);
                let (data, r) = if r >= h { (self.hi, r - h) } else { (self.data, r) };
                crate::quant::rows16::dequantize_row(k, self.ty, self.cols, data, r, out)
            }
        }
    }

    /// The bytes of row `r` (of a [`Layout::Plain`] matrix).
    pub fn row(&self, r: usize) -> &'m [u8] {
        debug_assert!(self.layout == Layout::Plain, "row() of a rows16 matrix");
        debug_assert!(self.hi.is_empty(), "row() of a split matrix");
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// The attention mixer of a block (shapes in comments: `(cols, rows)`).
#[derive(Clone, Copy, Debug)]
pub struct Attention<'m> {
    /// `(n_embd, n_head*head_dim)`, or `(n_embd, 2*n_head*head_dim)` with a per-head
    /// `[q | gate]` layout when the attention is gated.
    pub wq: Tensor<'m>,
    /// `(n_embd, n_head_kv*head_dim)`.
    pub wk: Tensor<'m>,
    /// `(n_embd, n_head_kv*head_dim_v)`.
    pub wv: Tensor<'m>,
    /// `(n_head*head_dim_v, n_embd)`.
    pub wo: Tensor<'m>,
    /// Optional biases of q, k, v (Qwen 2).
    pub bq: Option<Tensor<'m>>,
    /// See `bq`.
    pub bk: Option<Tensor<'m>>,
    /// See `bq`.
    pub bv: Option<Tensor<'m>>,
    /// Optional per-head RMSNorm weights `(head_dim)` of q and k, applied before RoPE.
    pub q_norm: Option<Tensor<'m>>,
    /// See `q_norm`.
    pub k_norm: Option<Tensor<'m>>,
    /// Optional `(n_rot/2)` f32 RoPE frequency divisors (Llama 3's `rope_freqs.weight`,
    /// one tensor shared by every layer).
    pub rope_freqs: Option<Tensor<'m>>,
}

/// The gated delta-net mixer of a hybrid block.
#[derive(Clone, Copy, Debug)]
pub struct DeltaNet<'m> {
    /// `(n_embd, conv_channels)`: the mixed `[q | k | v]` projection.
    pub wqkv: Tensor<'m>,
    /// `(n_embd, d_inner)`: the output gate `z`.
    pub wgate: Tensor<'m>,
    /// `(d_conv, conv_channels)` f32: depthwise causal conv kernel.
    pub conv1d: Tensor<'m>,
    /// `(n_v_heads)` f32: bias added to alpha before softplus.
    pub dt_bias: Tensor<'m>,
    /// `(n_v_heads)` f32: `-exp(A_log)`, the decay rate.
    pub a: Tensor<'m>,
    /// `(n_embd, n_v_heads)`: beta projection.
    pub wbeta: Tensor<'m>,
    /// `(n_embd, n_v_heads)`: alpha (decay) projection.
    pub walpha: Tensor<'m>,
    /// `(d_state)` f32: RMSNorm weight of the gated output norm.
    pub norm: Tensor<'m>,
    /// `(d_inner, n_embd)`: output projection.
    pub wout: Tensor<'m>,
}

/// What mixes information across positions in a block.
#[derive(Clone, Copy, Debug)]
pub enum Mixer<'m> {
    /// Softmax attention over the KV cache.
    Attention(Attention<'m>),
    /// Gated delta-net linear attention with a recurrent state.
    DeltaNet(DeltaNet<'m>),
}

/// The tensors of one transformer block (shapes in comments: `(cols, rows)`).
#[derive(Clone, Copy, Debug)]
pub struct Layer<'m> {
    /// `(n_embd)` RMSNorm weight before the mixer.
    pub attn_norm: Tensor<'m>,
    /// The mixer.
    pub mixer: Mixer<'m>,
    /// Optional `(n_embd)` RMSNorm of the mixer output before the residual add (Gemma).
    pub attn_post_norm: Option<Tensor<'m>>,
    /// `(n_embd)` RMSNorm weight before the feed-forward (`post_attention_norm` in Qwen 3.5 files).
    pub ffn_norm: Tensor<'m>,
    /// The file's name suffix of `ffn_norm`.
    pub ffn_norm_name: &'static str,
    /// `(n_embd, n_ff)`.
    pub ffn_gate: Tensor<'m>,
    /// `(n_embd, n_ff)`.
    pub ffn_up: Tensor<'m>,
    /// `(n_ff, n_embd)`.
    pub ffn_down: Tensor<'m>,
    /// Optional `(n_embd)` RMSNorm of the feed-forward output before the residual add (Gemma).
    pub ffn_post_norm: Option<Tensor<'m>>,
}

/// Most tensors one block has.
pub const MAX_LAYER_TENSORS: usize = 17;

/// How a weight is used, for type checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// Multiplied with quantized activations (any type with a dot kernel).
    Matrix,
    /// Read as f32 (norm weights, biases, conv kernels, per-head constants).
    F32,
}

impl<'m> Layer<'m> {
    /// Each tensor of the block with its name suffix and use.
    pub fn named(&self) -> heapless::Vec<(&'static str, Tensor<'m>, Use), MAX_LAYER_TENSORS> {
        let mut v = heapless::Vec::new();
        let mut push = |n: &'static str, t: Option<Tensor<'m>>, u: Use| {
            if let Some(t) = t {
                let _ = v.push((n, t, u));
            }
        };
        let (m, f) = (Use::Matrix, Use::F32);
        push("attn_norm.weight", Some(self.attn_norm), f);
        match &self.mixer {
            Mixer::Attention(a) => {
                push("attn_q.weight", Some(a.wq), m);
                push("attn_k.weight", Some(a.wk), m);
                push("attn_v.weight", Some(a.wv), m);
                push("attn_output.weight", Some(a.wo), m);
                push("attn_q.bias", a.bq, f);
                push("attn_k.bias", a.bk, f);
                push("attn_v.bias", a.bv, f);
                push("attn_q_norm.weight", a.q_norm, f);
                push("attn_k_norm.weight", a.k_norm, f);
            }
            Mixer::DeltaNet(d) => {
                push("attn_qkv.weight", Some(d.wqkv), m);
                push("attn_gate.weight", Some(d.wgate), m);
                push("ssm_conv1d.weight", Some(d.conv1d), f);
                push("ssm_dt.bias", Some(d.dt_bias), f);
                push("ssm_a", Some(d.a), f);
                push("ssm_beta.weight", Some(d.wbeta), m);
                push("ssm_alpha.weight", Some(d.walpha), m);
                push("ssm_norm.weight", Some(d.norm), f);
                push("ssm_out.weight", Some(d.wout), m);
            }
        }
        push("post_attention_norm.weight", self.attn_post_norm, f);
        push(self.ffn_norm_name, Some(self.ffn_norm), f);
        push("ffn_gate.weight", Some(self.ffn_gate), m);
        push("ffn_up.weight", Some(self.ffn_up), m);
        push("ffn_down.weight", Some(self.ffn_down), m);
        push("post_ffw_norm.weight", self.ffn_post_norm, f);
        v
    }
}

/// Looks tensors up by name, checking shape; builds names without allocating.
pub struct Finder<'g, 'm> {
    g: &'g Gguf<'m>,
    name: heapless::String<96>,
}

impl<'g, 'm> Finder<'g, 'm> {
    /// A finder over `g`.
    pub fn new(g: &'g Gguf<'m>) -> Self {
        Finder { g, name: heapless::String::new() }
    }

    fn set_name(&mut self, layer: Option<usize>, suffix: &str) {
        use core::fmt::Write;
        self.name.clear();
        let _ = match layer {
            Some(l) => write!(self.name, "blk.{l}.{suffix}"),
            None => write!(self.name, "{suffix}"),
        };
    }

    /// The tensor `[blk.L.]suffix` with `cols` columns and `rows` rows, if present.
    pub fn opt(&mut self, layer: Option<usize>, suffix: &str, cols: usize, rows: usize) -> Result<Option<Tensor<'m>>, GgufError> {
        self.set_name(layer, suffix);
        let Some(t) = self.g.tensor(&self.name) else { return Ok(None) };
        let ok = t.ne[0] == cols as u64 && t.n_rows() == rows as u64;
        if !ok {
            return Err(GgufError::at(GgufErrorKind::BadShape, t.offset).named_str(&self.name));
        }
        let t2 = Tensor { ty: t.ty, cols, rows, data: t.data, hi: t.hi, layout: if t.rows16 { Layout::Rows16 } else { Layout::Plain } };
        // A matrix in two parts: whole groups of 16 rows of a rows16 matrix in each.
        if !t.hi.is_empty() && !(t.rows16 && t2.data.len().is_multiple_of(ROWS16 * t2.row_bytes()) && rows.is_multiple_of(ROWS16)) {
            return Err(GgufError::at(GgufErrorKind::BadShape, t.offset).named_str(&self.name));
        }
        Ok(Some(t2))
    }

    /// Like [`Finder::opt`], but the tensor must exist.
    pub fn req(&mut self, layer: Option<usize>, suffix: &str, cols: usize, rows: usize) -> Result<Tensor<'m>, GgufError> {
        match self.opt(layer, suffix, cols, rows)? {
            Some(t) => Ok(t),
            None => Err(GgufError::at(GgufErrorKind::MissingTensor, 0).named_str(&self.name)),
        }
    }
}

/// The RoPE frequency-factor tensor: `rope_freqs.weight` (F32, `n_rot/2`) in a llama
/// file; llama.cpp reads it for no other architecture keel runs, and longrope's
/// `rope_factors_long`/`rope_factors_short` not at all without longrope scaling (which
/// keel refuses), so any of these elsewhere is refused, naming the tensor.
fn rope_freqs<'m>(f: &mut Finder<'_, 'm>, hp: &HParams) -> Result<Option<Tensor<'m>>, GgufError> {
    let refuse = |name: &str, offset, what| Err(GgufError::at(GgufErrorKind::Unsupported(what), offset).named_str(name));
    for name in ["rope_factors_long.weight", "rope_factors_short.weight"] {
        if let Some(t) = f.g.tensor(name) {
            return refuse(name, t.offset, "longrope frequency factors");
        }
    }
    const NAME: &str = "rope_freqs.weight";
    if hp.arch != Arch::Llama {
        return match f.g.tensor(NAME) {
            Some(t) => refuse(NAME, t.offset, "RoPE frequency factors on this architecture (llama.cpp reads them for llama only)"),
            None => Ok(None),
        };
    }
    let t = f.opt(None, NAME, hp.n_rot / 2, 1)?;
    if let (Some(t), Some(info)) = (t, f.g.tensor(NAME)) {
        if t.ty != GgmlType::F32 {
            return refuse(NAME, info.offset, "RoPE frequency factors that are not F32");
        }
        // Angles are divided by the factors: each must be a finite positive number.
        let bad = |b: &[u8]| {
            let f = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            !(f > 0.0 && f.is_finite())
        };
        if t.data.chunks_exact(4).any(bad) {
            return Err(GgufError::at(GgufErrorKind::BadValue("RoPE frequency factors must be finite and > 0"), info.offset).named_str(NAME));
        }
    }
    Ok(t)
}

/// Reads the tensors of block `l`.
pub fn load_layer<'m>(f: &mut Finder<'_, 'm>, hp: &HParams, l: usize) -> Result<Layer<'m>, GgufError> {
    let e = hp.n_embd;
    let li = Some(l);
    let attn_norm = f.req(li, "attn_norm.weight", e, 1)?;
    let mixer = if let (true, Some(s)) = (hp.is_recurrent(l), hp.ssm) {
        let ch = s.conv_channels();
        Mixer::DeltaNet(DeltaNet {
            wqkv: f.req(li, "attn_qkv.weight", e, ch)?,
            wgate: f.req(li, "attn_gate.weight", e, s.d_inner)?,
            conv1d: f.req(li, "ssm_conv1d.weight", s.d_conv, ch)?,
            dt_bias: f.req(li, "ssm_dt.bias", s.n_v_heads, 1)?,
            a: f.req(li, "ssm_a", s.n_v_heads, 1)?,
            wbeta: f.req(li, "ssm_beta.weight", e, s.n_v_heads)?,
            walpha: f.req(li, "ssm_alpha.weight", e, s.n_v_heads)?,
            norm: f.req(li, "ssm_norm.weight", s.d_state, 1)?,
            wout: f.req(li, "ssm_out.weight", s.d_inner, e)?,
        })
    } else {
        let q_rows = if hp.attn_gated { 2 * hp.q_dim() } else { hp.q_dim() };
        let needs_qk_norm = matches!(hp.arch, Arch::Qwen3 | Arch::Qwen35 | Arch::Gemma3);
        let qk_norm = |f: &mut Finder<'_, 'm>, name| if needs_qk_norm { f.req(li, name, hp.head_dim, 1).map(Some) } else { Ok(None) };
        let bias = |f: &mut Finder<'_, 'm>, name, n| if hp.arch == Arch::Qwen2 { f.req(li, name, n, 1).map(Some) } else { f.opt(li, name, n, 1) };
        Mixer::Attention(Attention {
            wq: f.req(li, "attn_q.weight", e, q_rows)?,
            wk: f.req(li, "attn_k.weight", e, hp.k_dim())?,
            wv: f.req(li, "attn_v.weight", e, hp.v_dim())?,
            wo: f.req(li, "attn_output.weight", hp.n_head * hp.head_dim_v, e)?,
            bq: bias(f, "attn_q.bias", hp.q_dim())?,
            bk: bias(f, "attn_k.bias", hp.k_dim())?,
            bv: bias(f, "attn_v.bias", hp.v_dim())?,
            q_norm: qk_norm(f, "attn_q_norm.weight")?,
            k_norm: qk_norm(f, "attn_k_norm.weight")?,
            rope_freqs: rope_freqs(f, hp)?,
        })
    };
    let gemma = hp.arch == Arch::Gemma3;
    let post = |f: &mut Finder<'_, 'm>, name| if gemma { f.req(li, name, e, 1).map(Some) } else { Ok(None) };
    let attn_post_norm = post(f, "post_attention_norm.weight")?;
    let ffn_norm_name = if hp.arch == Arch::Qwen35 { "post_attention_norm.weight" } else { "ffn_norm.weight" };
    let ffn_norm = f.req(li, ffn_norm_name, e, 1)?;
    Ok(Layer {
        attn_norm,
        mixer,
        attn_post_norm,
        ffn_norm,
        ffn_norm_name,
        ffn_gate: f.req(li, "ffn_gate.weight", e, hp.n_ff)?,
        ffn_up: f.req(li, "ffn_up.weight", e, hp.n_ff)?,
        ffn_down: f.req(li, "ffn_down.weight", hp.n_ff, e)?,
        ffn_post_norm: post(f, "post_ffw_norm.weight")?,
    })
}

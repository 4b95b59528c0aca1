//! Typed views of the model's tensors, checked against the hyper-parameters at load.
//!
//! Owns: finding each tensor by its llama.cpp name, checking its shape and type, and the
//! per-layer table. Weights stay where they are (the mapped file); nothing is copied.

use super::hparams::HParams;
use crate::ggml_type::GgmlType;
use crate::gguf::{Gguf, GgufError, GgufErrorKind};

/// A 1-D or 2-D weight: `rows` rows of `cols` elements of `ty`, row-major, in the file.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'m> {
    /// Element type.
    pub ty: GgmlType,
    /// Row length (`ne[0]`).
    pub cols: usize,
    /// Number of rows (`ne[1]`; 1 for vectors).
    pub rows: usize,
    /// The raw data.
    pub data: &'m [u8],
}

impl<'m> Tensor<'m> {
    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.type_size()
    }

    /// The bytes of row `r`.
    pub fn row(&self, r: usize) -> &'m [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// The tensors of one transformer block (shapes in comments: `(cols, rows)`).
#[derive(Clone, Copy, Debug)]
pub struct Layer<'m> {
    /// `(n_embd)` RMSNorm weight before attention.
    pub attn_norm: Tensor<'m>,
    /// `(n_embd, n_head*head_dim)`.
    pub wq: Tensor<'m>,
    /// `(n_embd, n_head_kv*head_dim)`.
    pub wk: Tensor<'m>,
    /// `(n_embd, n_head_kv*head_dim_v)`.
    pub wv: Tensor<'m>,
    /// `(n_head*head_dim_v, n_embd)`.
    pub wo: Tensor<'m>,
    /// `(n_embd)` RMSNorm weight before the feed-forward.
    pub ffn_norm: Tensor<'m>,
    /// `(n_embd, n_ff)`.
    pub ffn_gate: Tensor<'m>,
    /// `(n_embd, n_ff)`.
    pub ffn_up: Tensor<'m>,
    /// `(n_ff, n_embd)`.
    pub ffn_down: Tensor<'m>,
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
        Ok(Some(Tensor { ty: t.ty, cols, rows, data: t.data }))
    }

    /// Like [`Finder::opt`], but the tensor must exist.
    pub fn req(&mut self, layer: Option<usize>, suffix: &str, cols: usize, rows: usize) -> Result<Tensor<'m>, GgufError> {
        match self.opt(layer, suffix, cols, rows)? {
            Some(t) => Ok(t),
            None => Err(GgufError::at(GgufErrorKind::MissingTensor, 0).named_str(&self.name)),
        }
    }
}

/// Reads the tensors of block `l`.
pub fn load_layer<'m>(f: &mut Finder<'_, 'm>, hp: &HParams, l: usize) -> Result<Layer<'m>, GgufError> {
    let (e, l) = (hp.n_embd, Some(l));
    Ok(Layer {
        attn_norm: f.req(l, "attn_norm.weight", e, 1)?,
        wq: f.req(l, "attn_q.weight", e, hp.q_dim())?,
        wk: f.req(l, "attn_k.weight", e, hp.k_dim())?,
        wv: f.req(l, "attn_v.weight", e, hp.v_dim())?,
        wo: f.req(l, "attn_output.weight", hp.n_head * hp.head_dim_v, e)?,
        ffn_norm: f.req(l, "ffn_norm.weight", e, 1)?,
        ffn_gate: f.req(l, "ffn_gate.weight", e, hp.n_ff)?,
        ffn_up: f.req(l, "ffn_up.weight", e, hp.n_ff)?,
        ffn_down: f.req(l, "ffn_down.weight", hp.n_ff, e)?,
    })
}

//! A model: hyper-parameters plus typed views of its weights.
//!
//! Owns: turning a parsed GGUF file into [`Model`] (checking every tensor's shape and
//! type). Does not run anything; see `session`.

pub mod hparams;
pub mod weights;

pub use hparams::{Arch, FfnAct, HParams, RopeMode, Ssm};
pub use weights::{Attention, DeltaNet, Layer, Layout, Mixer, Tensor, Use};

use crate::error::Error;
use crate::ggml_type::GgmlType;
use crate::gguf::{name_from, Gguf};
use crate::quant::Kernels;
use core::mem::MaybeUninit;
use weights::Finder;

/// Whether the GGUF tensor called `name` is one the CPU engine reads only through its
/// matrix products (`matmul`, `matvec_group`) and [`Tensor::dequantize_row`], so that its
/// rows may be stored in the rows16 layout ([`Layout::Rows16`], `quant::rows16`): a
/// layer's attention (q, k, v, output) or feed-forward (gate, up, down) projection, the
/// output projection, or the token embedding (a tied model's output). The names are the
/// ones [`Model::load`] and [`Layer::named`] look up; a host that rearranges a file's
/// matrices asks this rather than keeping its own list.
pub fn rows16_tensor(name: &[u8]) -> bool {
    const LAYER: [&[u8]; 7] = [b".attn_q.weight", b".attn_k.weight", b".attn_v.weight", b".attn_output.weight", b".ffn_gate.weight", b".ffn_up.weight", b".ffn_down.weight"];
    name == b"output.weight" || name == b"token_embd.weight" || (name.starts_with(b"blk.") && LAYER.iter().any(|s| name.ends_with(s)))
}

/// A loaded model: views into the file plus a per-layer table in the arena.
#[derive(Clone, Copy, Debug)]
pub struct Model<'a> {
    /// Hyper-parameters.
    pub hp: HParams,
    /// `(n_embd, n_vocab)` token embedding.
    pub tok_embd: Tensor<'a>,
    /// `(n_embd)` final RMSNorm weight.
    pub output_norm: Tensor<'a>,
    /// `(n_embd, n_vocab)` output projection (the embedding itself when tied).
    pub output: Tensor<'a>,
    /// Whether `output` is the token embedding.
    pub tied_output: bool,
    /// One entry per block.
    pub layers: &'a [Layer<'a>],
}

impl<'a> Model<'a> {
    /// Bytes of the per-layer table for `hp` (an arena region).
    pub fn table_bytes(hp: &HParams) -> usize {
        hp.n_layer * core::mem::size_of::<Layer<'static>>()
    }

    /// Loads the model's tensors, writing the layer table into `table`.
    pub fn load(g: &Gguf<'a>, hp: HParams, table: &'a mut [MaybeUninit<Layer<'a>>]) -> Result<Model<'a>, Error> {
        let mut f = Finder::new(g);
        let tok_embd = f.req(None, "token_embd.weight", hp.n_embd, hp.n_vocab)?;
        let output_norm = f.req(None, "output_norm.weight", hp.n_embd, 1)?;
        let (output, tied_output) = match f.opt(None, "output.weight", hp.n_embd, hp.n_vocab)? {
            Some(t) => (t, false),
            None => (tok_embd, true),
        };
        if table.len() < hp.n_layer {
            return Err(Error::BadConfig("layer table region smaller than the layer count"));
        }
        for (l, slot) in table.iter_mut().take(hp.n_layer).enumerate() {
            slot.write(weights::load_layer(&mut f, &hp, l)?);
        }
        let table = &mut table[..hp.n_layer];
        // SAFETY: every one of the first n_layer slots was written just above; the
        // exclusive borrow of the region is converted into a shared one for 'a.
        let layers: &'a [Layer<'a>] = unsafe { &*(table as *mut [MaybeUninit<Layer<'a>>] as *const [Layer<'a>]) };
        let m = Model { hp, tok_embd, output_norm, output, tied_output, layers };
        m.check_types()?;
        Ok(m)
    }

    /// Every weight must be a type the kernels compute with; norms must be f32.
    fn check_types(&self) -> Result<(), Error> {
        let unsupported = |name: &str, ty: GgmlType| Error::UnsupportedType { ty, tensor: name_from(name.as_bytes()) };
        if Kernels::vec_dot_type(self.tok_embd.ty).is_none() {
            return Err(unsupported("token_embd.weight", self.tok_embd.ty));
        }
        if Kernels::vec_dot_type(self.output.ty).is_none() {
            return Err(unsupported("output.weight", self.output.ty));
        }
        if self.output_norm.ty != GgmlType::F32 {
            return Err(unsupported("output_norm.weight", self.output_norm.ty));
        }
        let mut name = heapless::String::<96>::new();
        for (l, layer) in self.layers.iter().enumerate() {
            for (suffix, t, u) in layer.named() {
                use core::fmt::Write;
                name.clear();
                let _ = write!(name, "blk.{l}.{suffix}");
                let ok = match u {
                    Use::F32 => t.ty == GgmlType::F32,
                    Use::Matrix => Kernels::vec_dot_type(t.ty).is_some(),
                };
                if !ok {
                    return Err(unsupported(&name, t.ty));
                }
            }
        }
        Ok(())
    }

    /// Bytes of all weights the model uses.
    pub fn weight_bytes(&self) -> usize {
        let mut n = self.tok_embd.size_bytes() + self.output_norm.size_bytes();
        if !self.tied_output {
            n += self.output.size_bytes();
        }
        for layer in self.layers {
            for (_, t, _) in layer.named().iter() {
                n += t.size_bytes();
            }
        }
        n
    }
}

/// Name of the arena region holding the layer table.
pub const LAYER_TABLE: &str = "layers";

/// Adds the layer table region to a plan.
pub fn plan_table(plan: &mut crate::arena::Plan, hp: &HParams) -> Result<(), Error> {
    plan.add(LAYER_TABLE, hp.n_layer, core::mem::size_of::<Layer<'static>>())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::rows16_tensor;

    #[test]
    fn rows16_tensors_are_the_projections_and_the_embedding() {
        for n in ["output.weight", "token_embd.weight", "blk.0.attn_q.weight", "blk.11.attn_k.weight", "blk.3.attn_v.weight", "blk.29.attn_output.weight", "blk.7.ffn_gate.weight", "blk.7.ffn_up.weight", "blk.7.ffn_down.weight"] {
            assert!(rows16_tensor(n.as_bytes()), "{n}");
        }
        // Norms, biases, the DeltaNet mixer's matrices (read by its own code), names
        // outside a block and near misses are not.
        for n in ["output_norm.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.bias", "blk.0.attn_q_norm.weight", "blk.0.attn_qkv.weight", "blk.0.ssm_out.weight", "blk.0.attn_gate.weight", "attn_q.weight", "x.blk.0.attn_q.weight", "blk.0.attn_q.weight.1", "token_embd.weight.1", ""] {
            assert!(!rows16_tensor(n.as_bytes()), "{n}");
        }
    }
}

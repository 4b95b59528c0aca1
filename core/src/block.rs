//! One description of each block: a layer of every architecture (llama, qwen2, qwen3,
//! qwen35's attention and gated delta-net layers, gemma3) as a fixed-size list of ops
//! over named activation buffers, made from the hyper-parameters and the layer's
//! tensors. The CPU session executes the list op by op (`session.rs`); placement asks,
//! op by op, where each runs (`keel plan --placement` prints the answer); a device
//! engine lowers the same list to HAL op batches. What a block computes is therefore
//! written once, here, and the arithmetic of each op once, in the functions the ops
//! name (`ops`, `attention`, `delta_net`, `matmul`).
//!
//! Owns: the op order of each architecture's block and the buffers each op reads and
//! writes. Not the arithmetic, not the buffers themselves (the session's arena
//! regions), not the decisions (placement).

use crate::model::{FfnAct, HParams, Layer, Mixer, Model, Tensor};
use crate::placement::WeightKind;

/// An activation buffer of the forward pass (one row per token; widths: [`Buf::width`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    /// The residual stream (`n_embd`).
    X,
    /// A normalized copy of the residual stream (`n_embd`).
    Xn,
    /// Queries (`n_head·head_dim`; rows `[q | gate]` per head, twice as wide, straight
    /// out of a gated query projection).
    Q,
    /// Keys (`n_head_kv·head_dim`).
    K,
    /// Values (`n_head_kv·head_dim_v`).
    V,
    /// The attention output gate of a gated layer (`n_head·head_dim`).
    Gate,
    /// The attention output (`n_head·head_dim_v`); a delta-net layer's output heads.
    Attn,
    /// The mixer's projected output and the feed-forward's first half (`max(n_embd, n_ff)`).
    FfnA,
    /// The feed-forward's second half and its projected output (`max(n_embd, n_ff)`).
    FfnB,
    /// A delta-net layer's mixed `[q | k | v]` projection (`conv_channels`).
    Qkv,
    /// A delta-net layer's output gate `z` (`d_inner`).
    Z,
    /// A delta-net layer's betas (`n_v_heads`).
    Beta,
    /// A delta-net layer's alphas, then decays (`n_v_heads`).
    Alpha,
    /// A delta-net layer's convolved, activated `[q | k | v]` (`conv_channels`).
    Conv,
}

/// A non-matrix tensor of a layer that an op reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// RMSNorm weight before the mixer.
    AttnNorm,
    /// RMSNorm weight before the feed-forward.
    FfnNorm,
    /// RMSNorm weight of the mixer's output (Gemma).
    AttnPostNorm,
    /// RMSNorm weight of the feed-forward's output (Gemma).
    FfnPostNorm,
    /// Query bias (Qwen 2).
    QBias,
    /// Key bias.
    KBias,
    /// Value bias.
    VBias,
    /// Per-head query RMSNorm weight (Qwen 3).
    QNorm,
    /// Per-head key RMSNorm weight.
    KNorm,
    /// Delta-net depthwise conv kernel.
    Conv1d,
    /// Delta-net bias of alpha.
    DtBias,
    /// Delta-net decay rates.
    A,
    /// Delta-net gated output norm weight.
    SsmNorm,
}

impl Param {
    /// The tensor in `layer`, if it has one.
    pub fn of<'m>(self, layer: &Layer<'m>) -> Option<Tensor<'m>> {
        let att = match &layer.mixer {
            Mixer::Attention(a) => Some(a),
            Mixer::DeltaNet(_) => None,
        };
        let dn = match &layer.mixer {
            Mixer::DeltaNet(d) => Some(d),
            Mixer::Attention(_) => None,
        };
        match self {
            Param::AttnNorm => Some(layer.attn_norm),
            Param::FfnNorm => Some(layer.ffn_norm),
            Param::AttnPostNorm => layer.attn_post_norm,
            Param::FfnPostNorm => layer.ffn_post_norm,
            Param::QBias => att.and_then(|a| a.bq),
            Param::KBias => att.and_then(|a| a.bk),
            Param::VBias => att.and_then(|a| a.bv),
            Param::QNorm => att.and_then(|a| a.q_norm),
            Param::KNorm => att.and_then(|a| a.k_norm),
            Param::Conv1d => dn.map(|d| d.conv1d),
            Param::DtBias => dn.map(|d| d.dt_bias),
            Param::A => dn.map(|d| d.a),
            Param::SsmNorm => dn.map(|d| d.norm),
        }
    }

    /// The tensor's name suffix in a GGUF file (`attn_norm`, `attn_q.bias`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Param::AttnNorm => "attn_norm",
            Param::FfnNorm => "ffn_norm",
            Param::AttnPostNorm => "post_attention_norm",
            Param::FfnPostNorm => "post_ffw_norm",
            Param::QBias => "attn_q.bias",
            Param::KBias => "attn_k.bias",
            Param::VBias => "attn_v.bias",
            Param::QNorm => "attn_q_norm",
            Param::KNorm => "attn_k_norm",
            Param::Conv1d => "ssm_conv1d",
            Param::DtBias => "ssm_dt.bias",
            Param::A => "ssm_a",
            Param::SsmNorm => "ssm_norm",
        }
    }
}

/// One op of a block. Rows are tokens; every op works on all `n` tokens of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `dst = rms_norm(src)·w`, rows of `n_embd`.
    Norm {
        /// The weight.
        w: Param,
        /// Input rows.
        src: Buf,
        /// Output rows.
        dst: Buf,
    },
    /// `dst = src·Wᵀ`: a matrix product with one of the layer's weights.
    MatMul {
        /// Which weight.
        w: WeightKind,
        /// Input rows.
        src: Buf,
        /// Output rows.
        dst: Buf,
    },
    /// A gated query projection's rows `[q | gate]` per head split into `Q` and `Gate`.
    SplitQueryGate,
    /// `dst += bias` on every row.
    Bias {
        /// The bias.
        w: Param,
        /// Rows.
        dst: Buf,
    },
    /// RMSNorm of every `head_dim`-wide head of `dst`, times `w` (`head_dim`).
    HeadNorm {
        /// The weight.
        w: Param,
        /// Rows of heads.
        dst: Buf,
    },
    /// RoPE of the query and key heads at positions `n_past..`, with the layer's base.
    Rope,
    /// The keys and values written to the layer's cache at positions `n_past..` (f16).
    KvStore,
    /// `Q *= attn_scale` (models that scale queries before attention; attention then
    /// scales by 1).
    QueryScale,
    /// Causal attention of `Q` over the layer's cache into `Attn`.
    Attention {
        /// Sliding-window width: a query at `pos` sees keys `pos - window + 1 ..= pos`
        /// (0: every earlier position).
        window: usize,
    },
    /// `Attn *= sigmoid(Gate)`.
    AttnGate,
    /// Delta-net gates: `Beta = sigmoid(Beta)`, `Alpha = softplus(Alpha + dt_bias)·a`.
    DeltaGates,
    /// Causal depthwise conv1d of `Qkv` over `[conv state | the new rows]` + SiLU into
    /// `Conv`; the conv state keeps the last `d_conv - 1` inputs.
    SsmConv,
    /// L2 normalization of every query and key head of `Conv`.
    QkL2Norm,
    /// The gated delta rule per value head over the recurrent state: `Conv`, `Beta`,
    /// `Alpha` into `Attn`.
    DeltaRule,
    /// `Attn = rms_norm(Attn)·w·silu(Z)` per value head.
    GatedNorm,
    /// `X += src`, or `X += rms_norm(src)·post_norm`.
    Residual {
        /// The rows added.
        src: Buf,
        /// The norm applied to them first, if the layer has one.
        post_norm: Option<Param>,
    },
    /// `FfnA = act(FfnA)·FfnB` (SwiGLU or GeGLU).
    FfnAct(FfnAct),
}

impl Op {
    /// A short name for listings (`norm`, `matmul`, `rope`, …).
    pub const fn name(&self) -> &'static str {
        match self {
            Op::Norm { .. } => "norm",
            Op::MatMul { .. } => "matmul",
            Op::SplitQueryGate => "split_q_gate",
            Op::Bias { .. } => "bias",
            Op::HeadNorm { .. } => "head_norm",
            Op::Rope => "rope",
            Op::KvStore => "kv_store",
            Op::QueryScale => "q_scale",
            Op::Attention { .. } => "attention",
            Op::AttnGate => "attn_gate",
            Op::DeltaGates => "delta_gates",
            Op::SsmConv => "ssm_conv",
            Op::QkL2Norm => "qk_l2_norm",
            Op::DeltaRule => "delta_rule",
            Op::GatedNorm => "gated_norm",
            Op::Residual { .. } => "residual",
            Op::FfnAct(FfnAct::Silu) => "swiglu",
            Op::FfnAct(FfnAct::GeluTanh) => "geglu",
        }
    }
}

impl Op {
    /// What a message names this op by: the tensor it applies (`ffn_down`, `attn_norm`,
    /// `attn_q.bias`, …), else its [`Op::name`] (`rope`, `attention`, …).
    pub const fn label(&self) -> &'static str {
        match self {
            Op::MatMul { w, .. } => w.name(),
            Op::Norm { w, .. } | Op::Bias { w, .. } | Op::HeadNorm { w, .. } | Op::Residual { post_norm: Some(w), .. } => w.name(),
            _ => self.name(),
        }
    }
}

/// Most ops one block has. The longest possible: an attention layer with every option
/// (norm, 3 projections, split, 3 biases, 2 head norms, rope, store, scale, attention,
/// gate, output projection, residual, norm, gate, up, activation, down, residual) has
/// 23; a delta-net layer has 18.
pub const MAX_BLOCK_OPS: usize = 23;

/// The ops of one block, in order (fixed capacity, no allocation).
pub type BlockOps = heapless::Vec<Op, MAX_BLOCK_OPS>;

/// The ops of layer `l` (`layer`) of a model with hyper-parameters `hp`, in order.
pub fn layer_ops(hp: &HParams, l: usize, layer: &Layer<'_>) -> BlockOps {
    let mut ops = BlockOps::new();
    let mut push = |op: Op| {
        // Cannot fail: MAX_BLOCK_OPS is the longest block's length.
        let pushed = ops.push(op);
        debug_assert!(pushed.is_ok(), "MAX_BLOCK_OPS is too small");
    };
    push(Op::Norm { w: Param::AttnNorm, src: Buf::X, dst: Buf::Xn });
    match &layer.mixer {
        Mixer::Attention(a) => {
            push(Op::MatMul { w: WeightKind::Q, src: Buf::Xn, dst: Buf::Q });
            push(Op::MatMul { w: WeightKind::K, src: Buf::Xn, dst: Buf::K });
            push(Op::MatMul { w: WeightKind::V, src: Buf::Xn, dst: Buf::V });
            if hp.attn_gated {
                push(Op::SplitQueryGate);
            }
            for (b, dst) in [(a.bq, Param::QBias, Buf::Q), (a.bk, Param::KBias, Buf::K), (a.bv, Param::VBias, Buf::V)].map(|(t, p, d)| (t.map(|_| p), d)) {
                if let Some(w) = b {
                    push(Op::Bias { w, dst });
                }
            }
            if a.q_norm.is_some() {
                push(Op::HeadNorm { w: Param::QNorm, dst: Buf::Q });
            }
            if a.k_norm.is_some() {
                push(Op::HeadNorm { w: Param::KNorm, dst: Buf::K });
            }
            push(Op::Rope);
            push(Op::KvStore);
            if hp.q_prescale {
                push(Op::QueryScale);
            }
            push(Op::Attention { window: if hp.is_swa(l) { hp.n_swa } else { 0 } });
            if hp.attn_gated {
                push(Op::AttnGate);
            }
            push(Op::MatMul { w: WeightKind::O, src: Buf::Attn, dst: Buf::FfnA });
        }
        Mixer::DeltaNet(_) => {
            push(Op::MatMul { w: WeightKind::Qkv, src: Buf::Xn, dst: Buf::Qkv });
            push(Op::MatMul { w: WeightKind::Z, src: Buf::Xn, dst: Buf::Z });
            push(Op::MatMul { w: WeightKind::Beta, src: Buf::Xn, dst: Buf::Beta });
            push(Op::MatMul { w: WeightKind::Alpha, src: Buf::Xn, dst: Buf::Alpha });
            push(Op::DeltaGates);
            push(Op::SsmConv);
            push(Op::QkL2Norm);
            push(Op::DeltaRule);
            push(Op::GatedNorm);
            push(Op::MatMul { w: WeightKind::Out, src: Buf::Attn, dst: Buf::FfnA });
        }
    }
    push(Op::Residual { src: Buf::FfnA, post_norm: layer.attn_post_norm.map(|_| Param::AttnPostNorm) });
    push(Op::Norm { w: Param::FfnNorm, src: Buf::X, dst: Buf::Xn });
    push(Op::MatMul { w: WeightKind::Gate, src: Buf::Xn, dst: Buf::FfnA });
    push(Op::MatMul { w: WeightKind::Up, src: Buf::Xn, dst: Buf::FfnB });
    push(Op::FfnAct(hp.ffn_act));
    push(Op::MatMul { w: WeightKind::Down, src: Buf::FfnA, dst: Buf::FfnB });
    push(Op::Residual { src: Buf::FfnB, post_norm: layer.ffn_post_norm.map(|_| Param::FfnPostNorm) });
    ops
}

/// The matrix weight `kind` of `layer`, if the layer has it.
pub fn weight<'m>(layer: &Layer<'m>, kind: WeightKind) -> Option<Tensor<'m>> {
    match (&layer.mixer, kind) {
        (_, WeightKind::Gate) => Some(layer.ffn_gate),
        (_, WeightKind::Up) => Some(layer.ffn_up),
        (_, WeightKind::Down) => Some(layer.ffn_down),
        (Mixer::Attention(a), WeightKind::Q) => Some(a.wq),
        (Mixer::Attention(a), WeightKind::K) => Some(a.wk),
        (Mixer::Attention(a), WeightKind::V) => Some(a.wv),
        (Mixer::Attention(a), WeightKind::O) => Some(a.wo),
        (Mixer::DeltaNet(d), WeightKind::Qkv) => Some(d.wqkv),
        (Mixer::DeltaNet(d), WeightKind::Z) => Some(d.wgate),
        (Mixer::DeltaNet(d), WeightKind::Beta) => Some(d.wbeta),
        (Mixer::DeltaNet(d), WeightKind::Alpha) => Some(d.walpha),
        (Mixer::DeltaNet(d), WeightKind::Out) => Some(d.wout),
        _ => None,
    }
}

/// The weights a forward pass of `model` reads, in the order it reads them: the token
/// embedding, each block's weights in its ops' order ([`layer_ops`]), the output norm and
/// the output projection (`f` once per use: a tied output comes twice). Weights an op reads
/// without naming them (a delta-net layer's conv, gates and norm) are not given.
pub fn for_each_weight_in_order<'m>(model: &Model<'m>, mut f: impl FnMut(Tensor<'m>)) {
    f(model.tok_embd);
    for (l, layer) in model.layers.iter().enumerate() {
        for op in layer_ops(&model.hp, l, layer).iter() {
            let t = match *op {
                Op::Norm { w, .. } | Op::Bias { w, .. } | Op::HeadNorm { w, .. } => w.of(layer),
                Op::Residual { post_norm, .. } => post_norm.and_then(|w| w.of(layer)),
                Op::MatMul { w, .. } => weight(layer, w),
                _ => None,
            };
            if let Some(t) = t {
                f(t);
            }
        }
    }
    f(model.output_norm);
    f(model.output);
}

/// The ops of every layer of `model`, layer by layer (`f(layer index, its ops)`).
pub fn for_each_block(model: &Model<'_>, mut f: impl FnMut(usize, &BlockOps)) {
    for (l, layer) in model.layers.iter().enumerate() {
        f(l, &layer_ops(&model.hp, l, layer));
    }
}

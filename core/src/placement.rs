//! Op placement: which device runs each matrix product of a model.
//!
//! Owns: the placement policy (device order, op kinds and weight types allowed, minimum
//! batch size for offload, memory budget per device, where the output projection goes,
//! the type weights a device lacks are converted to), the per-weight decisions made once
//! at load from the devices' own `supports` answers ([`DeviceInfo`]), and the switches an
//! application may flip between tokens ([`Placement::set_device_enabled`],
//! [`Placement::set_min_batch`]). It does not own devices, buffers or repacking: the
//! host does that through [`Offload`], and the session calls it per product.
//!
//! Decisions are made in model order (layer 0's q, k, v, o, gate, up, down, layer 1's …,
//! the output projection last); for each weight the first device in policy order (with a
//! [`Policy::split`], only the device whose run of layers holds it) that
//! supports it (natively, or after conversion to [`Policy::convert_to`]) and still has
//! budget for its device-layout bytes gets it; otherwise it stays on the CPU, and the
//! decision records why. A weight that goes to a device in a converted type is
//! computed there in that type (the CPU keeps the file's original bytes, used when the
//! device is switched off).
//!
//! Whole layers ([`OffloadMode::Layers`], the default): after the weights, each layer
//! whose matrix weights all went to one device, whose block a device can take
//! ([`layer_shape`]: llama, Qwen 2, Qwen 3, Gemma 3, and Qwen 3.5's delta-net and gated
//! attention layers), and whose device answers that it runs every other op of it
//! ([`DeviceInfo::layer_kv_bytes`]) with room left for its KV cache, runs **whole** on
//! that device: the session hands the residual stream to [`Offload::layers`] and does
//! none of that layer's CPU work; the layer's K/V cache lives on the device (the
//! session's CPU cache rows for it are not used). Because the cache cannot move, a
//! device holding whole layers that is switched off (or on) mid-sequence makes the
//! session refuse to continue that sequence ([`crate::Error::DeviceLayersSwitched`]);
//! the switch takes effect when a sequence starts over.
//!
//! The whole forward pass: when every layer runs whole on one device, the output
//! projection went to that device too, and the
//! device answers that it looks up rows of the token embedding in the file's type
//! ([`DeviceInfo::embedding_bytes`]) with budget left for a copy of it, the session hands
//! the tokens to [`Offload::forward`] and gets the logits back
//! ([`Placement::forward_device`]): embedding lookup, layers, final norm and output
//! projection as one pass on the device, none of it on the CPU.

use crate::ggml_type::GgmlType;
use crate::model::{Mixer, Model};

/// Most devices one placement spreads weights over.
pub const MAX_DEVICES: usize = 4;

/// `layer` of the output projection in a [`WeightId`].
pub const OUTPUT_LAYER: u16 = u16::MAX;

/// Which matrix of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightKind {
    /// Attention query projection.
    Q,
    /// Attention key projection.
    K,
    /// Attention value projection.
    V,
    /// Attention output projection.
    O,
    /// Feed-forward gate.
    Gate,
    /// Feed-forward up.
    Up,
    /// Feed-forward down.
    Down,
    /// Delta-net mixed qkv projection.
    Qkv,
    /// Delta-net output gate `z`.
    Z,
    /// Delta-net beta projection.
    Beta,
    /// Delta-net alpha projection.
    Alpha,
    /// Delta-net output projection.
    Out,
    /// The model's output projection (lm head).
    Output,
}

impl WeightKind {
    /// This kind's bit in a kind mask.
    pub const fn bit(self) -> u16 {
        1 << self as u16
    }
    /// Short name (`attn_q`, `ffn_down`, `output`, …), as in the GGUF tensor names.
    pub const fn name(self) -> &'static str {
        match self {
            WeightKind::Q => "attn_q",
            WeightKind::K => "attn_k",
            WeightKind::V => "attn_v",
            WeightKind::O => "attn_output",
            WeightKind::Gate => "ffn_gate",
            WeightKind::Up => "ffn_up",
            WeightKind::Down => "ffn_down",
            WeightKind::Qkv => "attn_qkv",
            WeightKind::Z => "attn_gate",
            WeightKind::Beta => "ssm_beta",
            WeightKind::Alpha => "ssm_alpha",
            WeightKind::Out => "ssm_out",
            WeightKind::Output => "output",
        }
    }
}

/// Mask of every layer matrix kind (not the output projection).
pub const LAYER_KINDS: u16 = !WeightKind::Output.bit() & ((1 << 13) - 1);

/// One matrix product's weight: its layer and kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightId {
    /// Layer index, or [`OUTPUT_LAYER`].
    pub layer: u16,
    /// Which matrix.
    pub kind: WeightKind,
}

/// What a device answers about holding and running one matrix product. The host
/// implements it over the device's `supports(op)` and its memory rules.
pub trait DeviceInfo {
    /// Bytes a `rows × cols` weight of type `ty` takes on the device in its own layout
    /// (after repacking), if the device supports a matrix product with that weight and
    /// F32 activations; `None` if it does not.
    fn matmul_weight_bytes(&self, ty: GgmlType, rows: usize, cols: usize) -> Option<u64>;
    /// Bytes of device memory weights may use (what the device reported, less what the
    /// host keeps for activations).
    fn memory_budget(&self) -> u64;
    /// Bytes of the device-resident K and V cache of one layer of `shape` with `n_ctx`
    /// positions (a delta-net layer: its conv and recurrent state), if the device runs
    /// every op of such a layer besides its products (the lowering of its block's ops);
    /// `None` if it does not. Optional: by default a device runs products only.
    fn layer_kv_bytes(&self, shape: &LayerShape, n_ctx: usize) -> Option<u64> {
        let _ = (shape, n_ctx);
        None
    }
    /// Bytes a copy of the token embedding (`n_vocab` rows of `n_embd`, type `ty`, the
    /// file's layout) takes on the device, if the device looks up its rows (dequantized
    /// to F32), scales them when `scaled` (Gemma), and runs the final RMSNorm; `None` if
    /// not. Optional: by default `None`.
    fn embedding_bytes(&self, ty: GgmlType, n_vocab: usize, n_embd: usize, scaled: bool) -> Option<u64> {
        let _ = (ty, n_vocab, n_embd, scaled);
        None
    }
}

/// One block as a device runs it whole (an attention layer; a delta-net layer has
/// `delta` set and runs its mixer instead): `x += W_o·attn(rope(W_q·n + b_q),
/// rope(W_k·n + b_k), W_v·n + b_v)` with `n = rms_norm(x)·w_attn` (the biases of Qwen 2
/// and the per-head q/k norms of Qwen 3 when the layer has them), then
/// `x += W_d·(silu(W_g·m) ⊙ W_u·m)` with `m = rms_norm(x)·w_ffn`. No gate, no post-norms,
/// no sliding window (the block's ops: `crate::block::layer_ops`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerShape {
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Feed-forward width.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Width of one head (keys, queries and values).
    pub head_dim: usize,
    /// Leading dimensions of each head that RoPE rotates.
    pub n_rot: usize,
    /// RoPE pairs halves (NeoX) rather than neighbours.
    pub rope_neox: bool,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Attention score scale.
    pub attn_scale: f32,
    /// Q, K and V biases (Qwen 2).
    pub biases: bool,
    /// Per-head q and k RMSNorm (Qwen 3, Gemma 3).
    pub head_norms: bool,
    /// Queries scaled by `attn_scale` before attention, which then scales by 1 (Gemma 3).
    pub q_prescale: bool,
    /// RMSNorms of the mixer's and the feed-forward's outputs before the residual adds (Gemma 3).
    pub post_norms: bool,
    /// GELU (GeGLU) feed-forward instead of SiLU (SwiGLU).
    pub geglu: bool,
    /// Sliding-window width of this layer's attention (0: none).
    pub window: usize,
    /// The attention output is gated: query rows `[q | gate]` per head (Qwen 3.5).
    pub gated: bool,
    /// The model's delta-net dimensions, if it has recurrent layers (Qwen 3.5).
    pub ssm: Option<crate::model::Ssm>,
    /// This layer is a gated delta-net layer (its mixer), not attention.
    pub delta: bool,
}

impl LayerShape {
    /// Whether layers `self` and `o` can share one device's buffers and batches: the
    /// same widths and ops; the RoPE base and the window may differ (Gemma 3's local and
    /// global layers), and the mixer (Qwen 3.5's delta-net and attention layers).
    pub fn same_layout(&self, o: &LayerShape) -> bool {
        LayerShape { rope_base: o.rope_base, window: o.window, delta: o.delta, ..*self } == *o
    }
}

impl LayerShape {
    /// `n_head_kv · head_dim`: one position's K (or V) row.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// The shape of layer `l` if its block is one a device may run whole, or why not.
pub fn layer_shape(model: &Model<'_>, l: usize) -> Result<LayerShape, &'static str> {
    let hp = &model.hp;
    let layer = model.layers.get(l).ok_or("no such layer")?;
    if let Mixer::DeltaNet(d) = &layer.mixer {
        if [d.conv1d, d.dt_bias, d.a, d.norm].iter().any(|t| t.ty != GgmlType::F32) {
            return Err("the delta-net layer's conv, gate or norm tensors are not F32");
        }
        let s = hp.ssm.ok_or("a delta-net layer without ssm parameters")?;
        if s.d_conv < 2 || s.n_k_heads == 0 || s.n_v_heads % s.n_k_heads != 0 || s.d_inner != s.n_v_heads * s.d_state {
            return Err("delta-net dimensions the device layout does not take");
        }
        // The attention fields describe the model's attention layers (one layout for the
        // device's layers); a model of delta-net layers only has none.
        let la = model.layers.iter().position(|ly| matches!(ly.mixer, Mixer::Attention(_))).unwrap_or(l);
        let mut sh = attention_shape(hp, la, &model.layers[la])?;
        sh.delta = true;
        return Ok(sh);
    }
    attention_shape(hp, l, layer)
}

/// The shape of an attention layer `l` of a model whose blocks a device runs whole (the
/// fields every layer shares, and this layer's), or why not. Given a delta-net layer (a
/// model without attention layers), the attention options are all off.
fn attention_shape(hp: &crate::model::HParams, l: usize, layer: &crate::model::Layer<'_>) -> Result<LayerShape, &'static str> {
    use crate::model::{Arch, FfnAct};
    if !matches!(hp.arch, Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen35) {
        return Err("this architecture's layers do not run whole on a device (one batch per product)");
    }
    // The device's RoPE takes the host's plain (cos, sin) table or computes plain angles.
    if hp.rope_scaled() || matches!(&layer.mixer, Mixer::Attention(a) if a.rope_freqs.is_some()) {
        return Err("RoPE scaling (linear, YaRN or rope_freqs factors) runs on the CPU only");
    }
    let (bq, bk, bv, q_norm, k_norm) = match &layer.mixer {
        Mixer::Attention(a) => (a.bq, a.bk, a.bv, a.q_norm, a.k_norm),
        Mixer::DeltaNet(_) => (None, None, None, None, None),
    };
    let biases = bq.is_some() && bk.is_some() && bv.is_some();
    if !biases && (bq.is_some() || bk.is_some() || bv.is_some()) {
        return Err("the layer has some of the Q/K/V biases but not all");
    }
    let head_norms = q_norm.is_some() && k_norm.is_some();
    if !head_norms && (q_norm.is_some() || k_norm.is_some()) {
        return Err("the layer has a per-head norm of q or of k, not both");
    }
    let f32_params = [bq, bk, bv, q_norm, k_norm];
    if f32_params.iter().flatten().any(|t| t.ty != GgmlType::F32) {
        return Err("biases or per-head norm weights are not F32");
    }
    let post_norms = layer.attn_post_norm.is_some() && layer.ffn_post_norm.is_some();
    if !post_norms && (layer.attn_post_norm.is_some() || layer.ffn_post_norm.is_some()) {
        return Err("the layer has one post-norm but not the other");
    }
    if [layer.attn_post_norm, layer.ffn_post_norm].iter().flatten().any(|t| t.ty != GgmlType::F32) {
        return Err("post-norm weights are not F32");
    }
    if hp.head_dim != hp.head_dim_v || hp.n_head_kv == 0 || hp.n_head % hp.n_head_kv != 0 {
        return Err("unequal key/value head widths");
    }
    if layer.attn_norm.ty != GgmlType::F32 || layer.ffn_norm.ty != GgmlType::F32 {
        return Err("norm weights are not F32");
    }
    Ok(LayerShape {
        n_embd: hp.n_embd,
        n_ff: hp.n_ff,
        n_head: hp.n_head,
        n_head_kv: hp.n_head_kv,
        head_dim: hp.head_dim,
        n_rot: hp.n_rot,
        rope_neox: hp.rope_mode == crate::model::RopeMode::Neox,
        rope_base: hp.rope_base_of(l),
        rms_eps: hp.rms_eps,
        attn_scale: hp.attn_scale,
        biases,
        head_norms,
        q_prescale: hp.q_prescale,
        post_norms,
        geglu: hp.ffn_act == FfnAct::GeluTanh,
        window: if hp.is_swa(l) { hp.n_swa } else { 0 },
        gated: hp.attn_gated,
        ssm: hp.ssm,
        delta: false,
    })
}

/// What the policy says about one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePolicy {
    /// Cap on weight bytes placed here, under the device's own budget (`None`: the device's).
    pub budget: Option<u64>,
    /// Weight kinds allowed here ([`WeightKind::bit`] mask).
    pub kinds: u16,
    /// Weight types (of the file) allowed here: bit `ty as u32`; `u64::MAX`: all.
    pub types: u64,
}

impl Default for DevicePolicy {
    fn default() -> Self {
        DevicePolicy { budget: None, kinds: LAYER_KINDS | WeightKind::Output.bit(), types: u64::MAX }
    }
}

/// How placed layers run on their device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffloadMode {
    /// A layer whose products all sit on one device runs there whole, its KV cache on
    /// the device (when the model's layers allow it; see [`layer_shape`]); other
    /// products one by one.
    Layers,
    /// One device batch per matrix product; every other op and the KV cache on the CPU.
    MatMul,
}

/// The placement policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Per device, in order of preference (the first `n_devices` are used).
    pub devices: [DevicePolicy; MAX_DEVICES],
    /// Devices in use.
    pub n_devices: usize,
    /// Offload a product only for batches of at least this many tokens (1: always).
    pub min_batch: usize,
    /// Most layers placed on devices, from layer 0 (llama.cpp's `-ngl`); `usize::MAX`: all.
    pub max_layers: usize,
    /// Whether the output projection may go to a device.
    pub output: bool,
    /// Type a weight the device lacks is converted to at load (`None`: such weights stay on the CPU).
    pub convert_to: Option<GgmlType>,
    /// Whole layers or single products.
    pub mode: OffloadMode,
    /// Positions of a whole layer's device-resident KV cache (the session's `n_ctx`);
    /// 0: no whole layers.
    pub kv_ctx: usize,
    /// Shares of the layers per device (llama.cpp's `--tensor-split`): when any is
    /// non-zero, the layers placed (`0..max_layers`) are cut in consecutive runs in these
    /// proportions, device `i` may hold only the weights of its run, and the output
    /// projection goes to the last device with a share ([`Policy::split_device`]).
    /// All 0 (the default): each weight goes to the first device with budget for it.
    pub split: [u32; MAX_DEVICES],
}

impl Policy {
    /// Everything the devices support, on `n_devices` devices; weights of types the
    /// device lacks converted to Q8_0 (8 bits: the smallest accuracy cost).
    pub fn all(n_devices: usize) -> Policy {
        Policy {
            devices: [DevicePolicy::default(); MAX_DEVICES],
            n_devices: n_devices.min(MAX_DEVICES),
            min_batch: 1,
            max_layers: usize::MAX,
            output: true,
            convert_to: Some(GgmlType::Q8_0),
            mode: OffloadMode::Layers,
            kv_ctx: 0,
            split: [0; MAX_DEVICES],
        }
    }

    /// The device [`Policy::split`] gives layer `l` of a model of `n_layer` layers
    /// (`l == n_layer` or [`OUTPUT_LAYER`]: the output projection), or `None` when no
    /// split is set.
    pub fn split_device(&self, n_layer: usize, l: usize) -> Option<usize> {
        let shares = &self.split[..self.n_devices.min(MAX_DEVICES)];
        let total: u64 = shares.iter().map(|&s| u64::from(s)).sum();
        if total == 0 {
            return None;
        }
        let n = n_layer.min(self.max_layers) as u64;
        let mut cum = 0u64;
        for (i, &s) in shares.iter().enumerate() {
            cum += u64::from(s);
            if (l as u64) < n * cum / total {
                return Some(i);
            }
        }
        shares.iter().rposition(|&s| s > 0)
    }
}

/// Why a weight stays on the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuReason {
    /// No device was given.
    NoDevice,
    /// The policy excludes this kind, type or layer.
    Policy,
    /// No device supports it (nor its converted type).
    Unsupported,
    /// Every device that supports it is out of budget.
    Budget,
}

impl CpuReason {
    /// A sentence for listings.
    pub const fn describe(self) -> &'static str {
        match self {
            CpuReason::NoDevice => "no device was given",
            CpuReason::Policy => "the placement policy keeps it on the CPU",
            CpuReason::Unsupported => "no device supports it",
            CpuReason::Budget => "every device that supports it is out of memory budget",
        }
    }
}

/// Where one op of a block runs ([`Placement::op_place`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpPlace {
    /// On device `n`.
    Device(u8),
    /// On the CPU, and why.
    Cpu(&'static str),
}

/// Where one weight's products run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Where {
    /// On the CPU, and why.
    Cpu(CpuReason),
    /// On device `n` (index into the devices given to [`Placement::plan`]).
    Device(u8),
}

/// The decision for one weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Which weight.
    pub id: WeightId,
    /// Where its products run.
    pub place: Where,
    /// The file's type.
    pub file_ty: GgmlType,
    /// The type it has on the device (differs from `file_ty` when converted).
    pub device_ty: GgmlType,
    /// `(rows, cols)`.
    pub shape: (usize, usize),
    /// Bytes on the device (0 on the CPU).
    pub device_bytes: u64,
    /// The weight's layer runs whole on its device ([`OffloadMode::Layers`]).
    pub whole_layer: bool,
    /// Bytes of the layer's device-resident KV cache (on the layer's first weight only).
    pub kv_bytes: u64,
}

impl Decision {
    /// A placeholder to fill decision slots with before [`Placement::plan`].
    pub const EMPTY: Decision = Decision {
        id: WeightId { layer: 0, kind: WeightKind::Q },
        place: Where::Cpu(CpuReason::NoDevice),
        file_ty: GgmlType::F32,
        device_ty: GgmlType::F32,
        shape: (0, 0),
        device_bytes: 0,
        whole_layer: false,
        kv_bytes: 0,
    };

    /// Whether the weight is converted at load.
    pub fn converted(&self) -> bool {
        matches!(self.place, Where::Device(_)) && self.file_ty != self.device_ty
    }
}

/// Every matrix weight of `model` in placement order, with its id.
pub fn for_each_weight<'m>(model: &Model<'m>, mut f: impl FnMut(WeightId, &crate::model::Tensor<'m>)) {
    for (l, layer) in model.layers.iter().enumerate() {
        let id = |kind| WeightId { layer: l as u16, kind };
        match &layer.mixer {
            Mixer::Attention(a) => {
                f(id(WeightKind::Q), &a.wq);
                f(id(WeightKind::K), &a.wk);
                f(id(WeightKind::V), &a.wv);
                f(id(WeightKind::O), &a.wo);
            }
            Mixer::DeltaNet(d) => {
                f(id(WeightKind::Qkv), &d.wqkv);
                f(id(WeightKind::Z), &d.wgate);
                f(id(WeightKind::Beta), &d.wbeta);
                f(id(WeightKind::Alpha), &d.walpha);
                f(id(WeightKind::Out), &d.wout);
            }
        }
        f(id(WeightKind::Gate), &layer.ffn_gate);
        f(id(WeightKind::Up), &layer.ffn_up);
        f(id(WeightKind::Down), &layer.ffn_down);
    }
    f(WeightId { layer: OUTPUT_LAYER, kind: WeightKind::Output }, &model.output);
}

/// Decision slots [`Placement::plan`] needs for `model`.
pub fn weight_count(model: &Model<'_>) -> usize {
    let mut n = 0;
    for_each_weight(model, |_, _| n += 1);
    n
}

/// Per device: bytes placed, weights placed, weights converted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceTotals {
    /// Device-layout bytes of the weights placed there.
    pub bytes: u64,
    /// Weights placed there.
    pub weights: usize,
    /// Of which converted to another type at load.
    pub converted: usize,
    /// Layers that run whole there.
    pub layers: usize,
    /// Bytes of their KV caches.
    pub kv_bytes: u64,
    /// Bytes of the token embedding's copy, if the whole forward pass runs there.
    pub embd_bytes: u64,
}

/// The decisions for one model, and the switches that may change between tokens.
pub struct Placement<'a> {
    decisions: &'a mut [Decision],
    n: usize,
    n_devices: usize,
    enabled: [bool; MAX_DEVICES],
    min_batch: usize,
    kv_ctx: usize,
    layer_generation: u32,
    layer_note: Option<&'static str>,
    /// The device the whole forward pass runs on, and its embedding copy's bytes.
    forward: Option<(u8, u64)>,
    forward_note: Option<&'static str>,
}

impl<'a> Placement<'a> {
    /// Places every matrix weight of `model` under `policy` on `devices` (in policy
    /// order), writing decisions into `slots` (at least [`weight_count`] long).
    pub fn plan(model: &Model<'_>, policy: &Policy, devices: &[&dyn DeviceInfo], slots: &'a mut [Decision]) -> Result<Placement<'a>, crate::Error> {
        if slots.len() < weight_count(model) {
            return Err(crate::Error::BadConfig("placement slots fewer than the model's matrix weights"));
        }
        let n_dev = policy.n_devices.min(devices.len()).min(MAX_DEVICES);
        let mut used = [0u64; MAX_DEVICES];
        let mut n = 0;
        for_each_weight(model, |id, t| {
            let shape = (t.rows, t.cols);
            let mut d = Decision { id, place: Where::Cpu(CpuReason::NoDevice), file_ty: t.ty, device_ty: t.ty, shape, device_bytes: 0, whole_layer: false, kv_bytes: 0 };
            let in_layers = id.layer == OUTPUT_LAYER || usize::from(id.layer) < policy.max_layers;
            let wanted = if id.kind == WeightKind::Output { policy.output } else { in_layers };
            if n_dev > 0 {
                d.place = Where::Cpu(if wanted { CpuReason::Unsupported } else { CpuReason::Policy });
            }
            for (i, dev) in devices.iter().enumerate().take(n_dev) {
                if !wanted {
                    break;
                }
                let p = &policy.devices[i];
                let split_out = policy.split_device(model.layers.len(), usize::from(id.layer)).is_some_and(|owner| owner != i);
                if split_out || p.kinds & id.kind.bit() == 0 || p.types & (1u64 << (t.ty as u32 & 63)) == 0 {
                    if d.place == Where::Cpu(CpuReason::Unsupported) {
                        d.place = Where::Cpu(CpuReason::Policy);
                    }
                    continue;
                }
                let native = dev.matmul_weight_bytes(t.ty, t.rows, t.cols).map(|b| (t.ty, b));
                let conv = || policy.convert_to.and_then(|c| dev.matmul_weight_bytes(c, t.rows, t.cols).map(|b| (c, b)));
                let Some((ty, bytes)) = native.or_else(conv) else { continue };
                let budget = p.budget.map_or(dev.memory_budget(), |b| b.min(dev.memory_budget()));
                if used[i].saturating_add(bytes) > budget {
                    d.place = Where::Cpu(CpuReason::Budget);
                    continue;
                }
                used[i] += bytes;
                d.place = Where::Device(i as u8);
                d.device_ty = ty;
                d.device_bytes = bytes;
                break;
            }
            slots[n] = d;
            n += 1;
        });
        let layer_note = if n_dev == 0 { None } else { place_layers(model, policy, devices, &mut used, &mut slots[..n]) };
        let (forward, forward_note) = match place_forward(model, policy, devices, &mut used, &slots[..n]) {
            Ok(f) => (Some(f), None),
            Err(why) => (None, slots[..n].iter().any(|w| w.whole_layer).then_some(why)),
        };
        Ok(Placement {
            decisions: slots,
            n,
            n_devices: n_dev,
            enabled: [true; MAX_DEVICES],
            min_batch: policy.min_batch.max(1),
            kv_ctx: policy.kv_ctx,
            layer_generation: 0,
            layer_note,
            forward,
            forward_note,
        })
    }

    /// The decisions, in model order.
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions[..self.n]
    }

    /// Devices this placement was made for.
    pub fn n_devices(&self) -> usize {
        self.n_devices
    }

    /// What was placed on device `dev`.
    pub fn totals(&self, dev: u8) -> DeviceTotals {
        let mut t = DeviceTotals::default();
        for d in self.decisions() {
            if d.place == Where::Device(dev) {
                t.bytes += d.device_bytes;
                t.weights += 1;
                t.converted += usize::from(d.converted());
                t.kv_bytes += d.kv_bytes;
                t.layers += usize::from(d.kv_bytes > 0);
            }
        }
        if let Some((d, bytes)) = self.forward {
            if d == dev {
                t.embd_bytes = bytes;
            }
        }
        t
    }

    /// Weights placed on any device.
    pub fn n_on_devices(&self) -> usize {
        self.decisions().iter().filter(|d| matches!(d.place, Where::Device(_))).count()
    }

    /// The decision for `id`.
    pub fn decision(&self, id: WeightId) -> Option<&Decision> {
        self.decisions().iter().find(|d| d.id == id)
    }

    /// The device that runs `id`'s product for a batch of `n_tokens`, or `None` for the CPU
    /// (placed there, its device switched off, or the batch below the minimum).
    pub fn device_for(&self, id: WeightId, n_tokens: usize) -> Option<u8> {
        if n_tokens < self.min_batch {
            return None;
        }
        match self.decision(id)?.place {
            Where::Device(d) if self.enabled[usize::from(d)] => Some(d),
            _ => None,
        }
    }

    /// The device that runs layer `l` whole, or `None` (its products are placed one by
    /// one, or its device is switched off). Batch size does not matter here: the
    /// layer's KV cache is on the device, so every batch of that layer runs there.
    pub fn layer_device(&self, l: usize) -> Option<u8> {
        let d = self.decisions().iter().find(|d| usize::from(d.id.layer) == l && d.id.layer != OUTPUT_LAYER)?;
        match d.place {
            Where::Device(dev) if d.whole_layer && self.enabled[usize::from(dev)] => Some(dev),
            _ => None,
        }
    }

    /// The device that runs the whole forward pass of a batch that needs `out_rows`
    /// logits rows (embedding lookup, every layer, final norm, output projection; see
    /// the module docs), or `None` (the session runs it piece by piece). `None` too if
    /// the device is switched off, or the output projection would not run there for
    /// `out_rows` rows (below the minimum batch).
    pub fn forward_device(&self, out_rows: usize) -> Option<u8> {
        let (dev, _) = self.forward?;
        if !self.enabled[usize::from(dev)] {
            return None;
        }
        let output = WeightId { layer: OUTPUT_LAYER, kind: WeightKind::Output };
        if out_rows > 0 && self.device_for(output, out_rows) != Some(dev) {
            return None;
        }
        Some(dev)
    }

    /// Where op `op` of layer `l` runs, and why on the CPU: the one lookup for "where does
    /// op X of layer L run" (`keel plan --placement` prints it for every op of
    /// [`crate::block::layer_ops`]). A layer that runs whole on a device runs every op
    /// there; otherwise its products go where their weights' decisions say and every
    /// other op runs on the CPU.
    pub fn op_place(&self, model: &Model<'_>, l: usize, op: &crate::block::Op) -> OpPlace {
        if let Some(dev) = self.layer_device(l) {
            return OpPlace::Device(dev);
        }
        if let crate::block::Op::MatMul { w, .. } = op {
            return match self.decision(WeightId { layer: l as u16, kind: *w }).map(|d| d.place) {
                Some(Where::Device(d)) if self.device_enabled(d) => OpPlace::Device(d),
                Some(Where::Device(_)) => OpPlace::Cpu("its device is switched off"),
                Some(Where::Cpu(r)) => OpPlace::Cpu(r.describe()),
                None => OpPlace::Cpu("no decision for this weight"),
            };
        }
        OpPlace::Cpu(match layer_shape(model, l) {
            _ if self.n_devices == 0 => CpuReason::NoDevice.describe(),
            Err(why) => why,
            Ok(_) => self.layer_note.unwrap_or("the layer's products are not all on one device, so it does not run whole there"),
        })
    }

    /// The device holding a copy of the token embedding for whole forward passes, and
    /// its bytes there (whether or not the device is switched on now).
    pub fn forward_placed(&self) -> Option<(u8, u64)> {
        self.forward
    }

    /// Why the forward pass does not run whole on a device, if devices hold whole layers.
    pub fn forward_note(&self) -> Option<&'static str> {
        self.forward_note
    }

    /// Whether any layer now runs whole on a device.
    pub fn has_device_layers(&self) -> bool {
        self.decisions().iter().any(|d| d.whole_layer && matches!(d.place, Where::Device(dev) if self.enabled[usize::from(dev)]))
    }

    /// Counts switches of devices that hold whole layers (a session compares it to refuse
    /// a sequence whose KV cache would have to move).
    pub fn layer_generation(&self) -> u32 {
        self.layer_generation
    }

    /// Positions of each whole layer's device-resident KV cache.
    pub fn kv_ctx(&self) -> usize {
        self.kv_ctx
    }

    /// Why some (or all) layers placed on devices do not run whole there, if any.
    pub fn layer_note(&self) -> Option<&'static str> {
        self.layer_note
    }

    /// The hook for between tokens: switches device `dev` off (its products run on the
    /// CPU from the file's weights, which stay mapped) or on again. The device keeps its
    /// repacked weights either way. If `dev` runs whole layers, their KV cache is on
    /// the device: a session refuses to continue a sequence across the switch
    /// ([`crate::Error::DeviceLayersSwitched`]); start the sequence over.
    pub fn set_device_enabled(&mut self, dev: u8, on: bool) {
        let holds_layers = self.decisions().iter().any(|d| d.whole_layer && d.place == Where::Device(dev));
        if let Some(e) = self.enabled.get_mut(usize::from(dev)) {
            if *e != on && holds_layers {
                self.layer_generation = self.layer_generation.wrapping_add(1);
            }
            *e = on;
        }
    }

    /// Whether device `dev` is in use.
    pub fn device_enabled(&self, dev: u8) -> bool {
        self.enabled.get(usize::from(dev)).copied().unwrap_or(false)
    }

    /// The hook for between tokens: offload only batches of at least `n` tokens.
    pub fn set_min_batch(&mut self, n: usize) {
        self.min_batch = n.max(1);
    }
}

/// Marks the layers that run whole on their device (see the module docs); returns why
/// some layer with products on a device does not, if one does not.
fn place_layers(model: &Model<'_>, policy: &Policy, devices: &[&dyn DeviceInfo], used: &mut [u64; MAX_DEVICES], d: &mut [Decision]) -> Option<&'static str> {
    let mut note = None;
    let mut first = 0;
    for l in 0..model.layers.len() {
        let mut end = first;
        while end < d.len() && usize::from(d[end].id.layer) == l && d[end].id.layer != OUTPUT_LAYER {
            end += 1;
        }
        let ws = &mut d[first..end];
        first = end;
        let Some(place) = ws.first().map(|w| w.place) else { continue };
        let Where::Device(dev) = place else { continue };
        let why = if policy.mode != OffloadMode::Layers {
            Err("--offload-mode matmul: one batch per product")
        } else if policy.kv_ctx == 0 {
            Err("no context size for a device KV cache")
        } else if !ws.iter().all(|w| w.place == place) {
            Err("the layer's products are not all on one device")
        } else {
            layer_shape(model, l).and_then(|shape| {
                let di = usize::from(dev);
                let kv = devices.get(di).and_then(|x| x.layer_kv_bytes(&shape, policy.kv_ctx)).ok_or("the device does not run every op of the layer")?;
                let budget = policy.devices[di].budget.map_or(devices[di].memory_budget(), |b| b.min(devices[di].memory_budget()));
                if used[di].saturating_add(kv) > budget {
                    return Err("the layer's KV cache does not fit the device budget");
                }
                used[di] += kv;
                Ok(kv)
            })
        };
        match why {
            Ok(kv) => {
                for w in ws.iter_mut() {
                    w.whole_layer = true;
                }
                ws[0].kv_bytes = kv;
            }
            Err(e) => note = note.or(Some(e)),
        }
    }
    note
}

/// Places the whole forward pass: the device every layer runs whole on, if the output
/// projection is there too and the device takes a copy of the token embedding within
/// its budget; returns that device and the copy's bytes, or why not.
fn place_forward(model: &Model<'_>, policy: &Policy, devices: &[&dyn DeviceInfo], used: &mut [u64; MAX_DEVICES], d: &[Decision]) -> Result<(u8, u64), &'static str> {
    let mut dev = None;
    for w in d.iter().filter(|w| w.id.layer != OUTPUT_LAYER) {
        match (w.whole_layer, w.place, dev) {
            (true, Where::Device(x), None) => dev = Some(x),
            (true, Where::Device(x), Some(y)) if x == y => {}
            _ => return Err("not every layer runs whole on one device"),
        }
    }
    let dev = dev.ok_or("not every layer runs whole on one device")?;
    let out = d.iter().find(|w| w.id.layer == OUTPUT_LAYER).map(|w| w.place);
    if out != Some(Where::Device(dev)) {
        return Err("the output projection is not on the layers' device");
    }

    if model.output_norm.ty != GgmlType::F32 {
        return Err("the output norm weight is not F32");
    }
    let di = usize::from(dev);
    let info = devices.get(di).ok_or("no such device")?;
    let t = &model.tok_embd;
    let bytes = info.embedding_bytes(t.ty, t.rows, t.cols, model.hp.embd_scale != 1.0).ok_or("the device does not look up rows of the token embedding's type")?;
    let budget = policy.devices[di].budget.map_or(info.memory_budget(), |b| b.min(info.memory_budget()));
    if used[di].saturating_add(bytes) > budget {
        return Err("the token embedding does not fit the device budget");
    }
    used[di] += bytes;
    Ok((dev, bytes))
}

/// A device failed mid-request; the host keeps the detailed error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceFailed {
    /// The device index.
    pub device: u8,
}

/// The host's side of an offloaded product.
pub trait Offload {
    /// `out[i * rows + r] = Σ_k W[r, k] · x[i * cols + k]` for the `n` rows of `x`, with
    /// the weight `id` that device `device` holds (`x`: `n × cols`, `out`: `n × rows`).
    fn matmul(&mut self, device: u8, id: WeightId, x: &[f32], n: usize, out: &mut [f32]) -> Result<(), DeviceFailed>;

    /// Runs layers `layers` (all whole on `device`, see [`Placement::layer_device`]) for
    /// `n` tokens at positions `pos .. pos + n`: `x` (`n × n_embd`) is the residual stream
    /// before the first layer on entry and after the last on return; the layers' K/V
    /// rows for those positions are written into the device's cache. Optional: a host
    /// whose devices answer `None` to [`DeviceInfo::layer_kv_bytes`] never gets this call.
    fn layers(&mut self, device: u8, layers: core::ops::Range<u16>, x: &mut [f32], n: usize, pos: usize) -> Result<(), DeviceFailed> {
        let _ = (layers, x, n, pos);
        Err(DeviceFailed { device })
    }

    /// Starts [`Offload::layers`] for the same arguments without waiting for it: reads
    /// `x` (`n × n_embd`), submits the pass and returns `Ok(true)`; the rows after the
    /// last layer come back from [`Offload::layers_end`], the next call for `device`
    /// (until then `device` gets no other call, and `x` is the caller's again). `Ok(false)`:
    /// the pass cannot be left in flight (one batch at a time, or more tokens than the
    /// device runs as one chunk); nothing was submitted, and the caller runs it with
    /// [`Offload::layers`]. Optional: by default nothing runs asynchronously.
    fn layers_begin(&mut self, device: u8, layers: core::ops::Range<u16>, x: &[f32], n: usize, pos: usize) -> Result<bool, DeviceFailed> {
        let _ = (device, layers, x, n, pos);
        Ok(false)
    }

    /// Waits for the pass [`Offload::layers_begin`] left in flight on `device` and writes
    /// its rows after the last layer into `x` (`n × n_embd`, `n` as begun). After a
    /// failure nothing is left in flight either.
    fn layers_end(&mut self, device: u8, x: &mut [f32]) -> Result<(), DeviceFailed> {
        let _ = x;
        Err(DeviceFailed { device })
    }

    /// Runs the whole forward pass on `device` (see [`Placement::forward_device`]) for
    /// `tokens` at positions `pos ..`: the embedding rows, every layer (their K/V rows
    /// written into the device's cache), the final RMSNorm of the last `out_rows` rows
    /// and the output projection of those rows into `logits` (`out_rows × n_vocab`).
    /// Optional: a host whose devices answer `None` to
    /// [`DeviceInfo::embedding_bytes`] never gets this call.
    fn forward(&mut self, device: u8, tokens: &[u32], pos: usize, out_rows: usize, logits: &mut [f32]) -> Result<(), DeviceFailed> {
        let _ = (tokens, pos, out_rows, logits);
        Err(DeviceFailed { device })
    }
}

/// What a session needs to run products off the CPU: the placement and the host's devices.
pub struct Exec<'p, 'd> {
    /// Where each product runs.
    pub placement: &'p Placement<'d>,
    /// The devices.
    pub offload: &'p mut dyn Offload,
}

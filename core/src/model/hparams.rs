//! Hyper-parameters read from GGUF metadata (`<arch>.*` keys).

use crate::gguf::{Gguf, GgufError, GgufErrorKind};
use crate::ops::RopeScale;

/// A model architecture keel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `llama`: Llama 2/3, SmolLM, TinyLlama...
    Llama,
    /// `qwen2`: Qwen 2 / 2.5 (Q/K/V biases, NeoX RoPE).
    Qwen2,
    /// `qwen3`: Qwen 3 dense (per-head Q/K RMSNorm, NeoX RoPE).
    Qwen3,
    /// `qwen35`: Qwen 3.5 dense hybrid (gated full attention + gated delta-net layers).
    Qwen35,
    /// `gemma3`: Gemma 3 text (scaled embedding, pre/post norms, GELU, sliding window).
    Gemma3,
}

impl Arch {
    /// The `general.architecture` string.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen35 => "qwen35",
            Arch::Gemma3 => "gemma3",
        }
    }

    /// Every architecture keel runs, for error messages.
    pub const KNOWN: &'static str = "llama, qwen2, qwen3, qwen35, gemma3";

    fn from_name(s: &[u8]) -> Option<Arch> {
        match s {
            b"llama" => Some(Arch::Llama),
            b"qwen2" => Some(Arch::Qwen2),
            b"qwen3" => Some(Arch::Qwen3),
            b"qwen35" => Some(Arch::Qwen35),
            b"gemma3" => Some(Arch::Gemma3),
            _ => None,
        }
    }
}

/// How RoPE pairs dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs `(2i, 2i+1)` (llama).
    Normal,
    /// Halves `(i, i + n_rot/2)` (NeoX, Qwen, Gemma; also Qwen 3.5's interleaved M-RoPE
    /// for text, where every section sees the same position).
    Neox,
}

/// The gated feed-forward activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnAct {
    /// `silu(gate) * up` (SwiGLU).
    Silu,
    /// `gelu_tanh(gate) * up` (GeGLU), GELU rounded through f16 as ggml's table does.
    GeluTanh,
}

/// Gated delta-net (linear attention) sizes of a hybrid model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ssm {
    /// Causal conv1d kernel width.
    pub d_conv: usize,
    /// Value width of all heads (`n_v_heads * head_dim`).
    pub d_inner: usize,
    /// Head width of keys and values (the state is `d_state x d_state` per head).
    pub d_state: usize,
    /// Key/query heads.
    pub n_k_heads: usize,
    /// Value heads (each has its own state, decay and beta).
    pub n_v_heads: usize,
}

impl Ssm {
    /// Channels of the mixed QKV projection (`2 * k heads * d_state + d_inner`).
    pub fn conv_channels(&self) -> usize {
        2 * self.n_k_heads * self.d_state + self.d_inner
    }

    /// Floats of one layer's conv state (`(d_conv - 1) * channels`).
    pub fn conv_state_len(&self) -> usize {
        (self.d_conv - 1) * self.conv_channels()
    }

    /// Floats of one layer's recurrent state (`n_v_heads * d_state^2`).
    pub fn state_len(&self) -> usize {
        self.n_v_heads * self.d_state * self.d_state
    }
}

/// Most layers a hybrid (recurrent + attention) model may have.
pub const MAX_HYBRID_LAYERS: usize = 256;

/// RoPE scaling as llama.cpp derives it from a file's `rope.scaling.*` keys.
struct RopeScaling {
    freq_scale: f32,
    ext_factor: f32,
    attn_factor: f32,
    n_ctx_orig: usize,
}

impl RopeScaling {
    /// llama.cpp's rules: `rope.scaling.type` none, linear (the default) or yarn;
    /// `freq_scale = 1/rope.scaling.factor` (or `rope.scale_linear`; 0 or absent: 1; type
    /// none: 1); YaRN sets `ext_factor` 1 and the attention factor `m(F)/(1 + 0.1·ln F)`
    /// with `F = 1/freq_scale`, `m(F) = 1 + 0.1·ln F` for `F > 1` (else 1), times
    /// `rope.scaling.attn_factor`; `original_context_length` defaults to the training
    /// context. Longrope, unknown types, and YaRN keys llama.cpp does not apply to these
    /// architectures (log multiplier, ext/attn factor, betas, alpha) holding anything but
    /// the value applied anyway are refused, naming the key.
    fn from_gguf(g: &Gguf<'_>, keys: &mut ArchKeys, n_ctx_train: usize) -> Result<RopeScaling, GgufError> {
        let err = |kind, key: &str| GgufError::at(kind, g.key_offset(key)).named_str(key);
        let key = keys.key("rope.scaling.type");
        let (yarn, none) = match g.str_opt(key)?.unwrap_or(b"linear") {
            b"linear" => (false, false),
            b"none" => (false, true),
            b"yarn" => (true, false),
            b"longrope" => return Err(err(GgufErrorKind::Unsupported("longrope RoPE scaling (keel implements none, linear and yarn)"), key)),
            _ => return Err(err(GgufErrorKind::BadValue("unknown RoPE scaling type (keel implements none, linear and yarn)"), key)),
        };
        let mut factor = None;
        for k in ["rope.scaling.factor", "rope.scale_linear"] {
            let key = keys.key(k);
            if let (None, Some(f)) = (factor, g.f32_opt(key)?) {
                if !(f.is_finite() && f >= 0.0) {
                    return Err(err(GgufErrorKind::BadValue("RoPE scaling factor must be finite and >= 0"), key));
                }
                factor = Some(f);
            }
        }
        let freq_scale = match factor {
            Some(f) if f != 0.0 && !none => 1.0 / f,
            _ => 1.0,
        };
        let ext_factor = if yarn { 1.0 } else { 0.0 };
        let key = keys.key("rope.scaling.original_context_length");
        let n_ctx_orig = match g.u32_opt(key)? {
            Some(n) if n > 0 => n as usize,
            _ => n_ctx_train,
        };
        let mut attn_factor = 1.0f32;
        if yarn {
            let f = 1.0 / freq_scale;
            attn_factor = if f <= 1.0 { 1.0 } else { 0.1 * crate::ops::logf(f) + 1.0 };
            attn_factor *= 1.0 / (1.0 + 0.1 * crate::ops::logf(f));
        }
        let key = keys.key("rope.scaling.attn_factor");
        if let Some(a) = g.f32_opt(key)? {
            if !(a.is_finite() && a > 0.0) {
                return Err(err(GgufErrorKind::BadValue("RoPE attention factor must be finite and > 0"), key));
            }
            attn_factor *= a;
        }
        for (k, applied) in [
            ("rope.scaling.yarn_log_multiplier", 0.0),
            ("rope.scaling.yarn_ext_factor", ext_factor),
            ("rope.scaling.yarn_attn_factor", 1.0),
            ("rope.scaling.yarn_beta_fast", 32.0),
            ("rope.scaling.yarn_beta_slow", 1.0),
            ("rope.scaling.alpha", 0.0),
        ] {
            let key = keys.key(k);
            if g.f32_opt(key)?.is_some_and(|v| v != applied) {
                return Err(err(GgufErrorKind::Unsupported("this RoPE scaling key (llama.cpp ignores it for this architecture; keel runs only its default)"), key));
            }
        }
        Ok(RopeScaling { freq_scale, ext_factor, attn_factor, n_ctx_orig })
    }
}

/// The numbers that size a model and its arena.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HParams {
    /// Architecture.
    pub arch: Arch,
    /// Vocabulary size (rows of the embedding).
    pub n_vocab: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Number of blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Width of one key (and query) head.
    pub head_dim: usize,
    /// Width of one value head.
    pub head_dim_v: usize,
    /// Feed-forward hidden width.
    pub n_ff: usize,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base frequency (global-attention layers).
    pub rope_base: f32,
    /// RoPE base frequency of sliding-window layers.
    pub rope_base_swa: f32,
    /// Number of dimensions RoPE rotates in each head.
    pub n_rot: usize,
    /// RoPE pairing.
    pub rope_mode: RopeMode,
    /// RoPE frequency scale of the global-attention layers (`1/rope.scaling.factor` for
    /// linear and YaRN scaling; 1: none). Sliding-window layers are not scaled.
    pub rope_freq_scale: f32,
    /// YaRN's extrapolation mix (1 for YaRN scaling, else 0).
    pub rope_ext_factor: f32,
    /// Magnitude factor of the RoPE cos/sin (llama.cpp's `yarn_attn_factor`; 1 unless
    /// YaRN or `rope.scaling.attn_factor`).
    pub rope_attn_factor: f32,
    /// The context length YaRN's correction dims are computed for.
    pub rope_n_ctx_orig: usize,
    /// Sliding-window width (0: every layer attends to the whole context).
    pub n_swa: usize,
    /// Layer `l` is a sliding-window layer when `l % pattern < pattern - 1` (gemma3's rule).
    pub swa_pattern: usize,
    /// Factor applied to the token embedding (`sqrt(n_embd)` for Gemma, else 1).
    pub embd_scale: f32,
    /// Attention scale (`1/sqrt(head_dim)` unless the architecture says otherwise).
    pub attn_scale: f32,
    /// The scale multiplies q before attention (Gemma) instead of each score.
    pub q_prescale: bool,
    /// Feed-forward activation.
    pub ffn_act: FfnAct,
    /// The q projection carries a per-head output gate (`[q | gate]` per head; Qwen 3.5).
    pub attn_gated: bool,
    /// Gated delta-net sizes (hybrid models).
    pub ssm: Option<Ssm>,
    /// Bit `l` set: layer `l` is a gated delta-net layer (hybrid models).
    pub recurrent: [u64; MAX_HYBRID_LAYERS / 64],
}

impl HParams {
    /// Reads the hyper-parameters of a model file, checking them for sanity.
    pub fn from_gguf(g: &Gguf<'_>) -> Result<HParams, GgufError> {
        refuse_split(g)?;
        let arch_s = g.str_opt("general.architecture")?.ok_or_else(|| GgufError::at(GgufErrorKind::MissingKey, 0).named_str("general.architecture"))?;
        let arch = Arch::from_name(arch_s).ok_or_else(|| GgufError::at(GgufErrorKind::BadValue("architecture not supported (keel runs: llama, qwen2, qwen3, qwen35, gemma3)"), g.key_offset("general.architecture")).named(arch_s))?;
        let mut keys = ArchKeys::new(arch);
        refuse_experts(g, &mut keys)?;
        let n_embd = g.u32(keys.key("embedding_length"))? as usize;
        let n_layer = g.u32(keys.key("block_count"))? as usize;
        let n_head = g.u32(keys.key("attention.head_count"))? as usize;
        let n_head_kv = g.u32_opt(keys.key("attention.head_count_kv"))?.map(|v| v as usize).unwrap_or(n_head);
        let n_ff = g.u32(keys.key("feed_forward_length"))? as usize;
        let n_ctx_train = g.u32_opt(keys.key("context_length"))?.unwrap_or(2048) as usize;
        let default_eps = if arch == Arch::Llama { 1e-5 } else { 1e-6 };
        let rms_eps = g.f32_opt(keys.key("attention.layer_norm_rms_epsilon"))?.unwrap_or(default_eps);
        let rope_base = g.f32_opt(keys.key("rope.freq_base"))?.unwrap_or(10000.0);
        if n_head == 0 || n_embd == 0 || n_layer == 0 {
            return Err(GgufError::at(GgufErrorKind::BadValue("embedding_length, block_count and head_count must be > 0"), 0).named(arch_s));
        }
        let head_dim = g.u32_opt(keys.key("attention.key_length"))?.map(|v| v as usize).unwrap_or(n_embd / n_head);
        let head_dim_v = g.u32_opt(keys.key("attention.value_length"))?.map(|v| v as usize).unwrap_or(head_dim);
        let n_rot = g.u32_opt(keys.key("rope.dimension_count"))?.map(|v| v as usize).unwrap_or(head_dim);
        let n_vocab = match g.array_opt("tokenizer.ggml.tokens")? {
            Some(a) => a.len(),
            None => g.u32(keys.key("vocab_size"))? as usize,
        };
        let rope_mode = if arch == Arch::Llama { RopeMode::Normal } else { RopeMode::Neox };
        let rs = RopeScaling::from_gguf(g, &mut keys, n_ctx_train)?;
        let mut hp = HParams {
            arch,
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            head_dim_v,
            n_ff,
            n_ctx_train,
            rms_eps,
            rope_base,
            rope_base_swa: rope_base,
            n_rot,
            rope_mode,
            rope_freq_scale: rs.freq_scale,
            rope_ext_factor: rs.ext_factor,
            rope_attn_factor: rs.attn_factor,
            rope_n_ctx_orig: rs.n_ctx_orig,
            n_swa: 0,
            swa_pattern: 0,
            embd_scale: 1.0,
            attn_scale: 1.0 / libm::sqrtf(head_dim as f32),
            q_prescale: false,
            ffn_act: FfnAct::Silu,
            attn_gated: false,
            ssm: None,
            recurrent: [0; MAX_HYBRID_LAYERS / 64],
        };
        match arch {
            Arch::Gemma3 => {
                hp.embd_scale = libm::sqrtf(n_embd as f32);
                hp.q_prescale = true;
                hp.ffn_act = FfnAct::GeluTanh;
                // Gemma 3 27B (62 layers) scales by the model width per head, the others by the head size.
                if n_layer == 62 {
                    hp.attn_scale = 1.0 / libm::sqrtf((n_embd / n_head) as f32);
                }
                let n_swa = g.u32_opt(keys.key("attention.sliding_window"))?.unwrap_or(0) as usize;
                if n_swa > 0 {
                    hp.n_swa = n_swa;
                    hp.swa_pattern = g.u32_opt(keys.key("attention.sliding_window_pattern"))?.unwrap_or(6) as usize;
                    hp.rope_base_swa = g.f32_opt(keys.key("rope.freq_base_swa"))?.unwrap_or(10000.0);
                }
            }
            Arch::Qwen35 => {
                hp.attn_gated = true;
                let need = |keys: &mut ArchKeys, k: &str| -> Result<usize, GgufError> { Ok(g.u32(keys.key(k))? as usize) };
                let ssm = Ssm {
                    d_conv: need(&mut keys, "ssm.conv_kernel")?,
                    d_inner: need(&mut keys, "ssm.inner_size")?,
                    d_state: need(&mut keys, "ssm.state_size")?,
                    n_k_heads: need(&mut keys, "ssm.group_count")?,
                    n_v_heads: need(&mut keys, "ssm.time_step_rank")?,
                };
                hp.ssm = Some(ssm);
                if n_layer > MAX_HYBRID_LAYERS {
                    return Err(GgufError::at(GgufErrorKind::BadValue("hybrid models may have at most 256 layers"), g.key_offset(keys.key("block_count"))).named(arch_s));
                }
                let key = keys.key("attention.recurrent_layers");
                match g.array_opt(key)? {
                    Some(a) => {
                        if a.len() < n_layer {
                            return Err(GgufError::at(GgufErrorKind::BadValue("recurrent_layers has fewer entries than block_count"), g.key_offset(key)).named_str(key));
                        }
                        for l in 0..n_layer {
                            let on = match a.get(l) {
                                Some(crate::gguf::Value::Bool(b)) => b,
                                _ => a.int(l).map(|v| v != 0).ok_or_else(|| GgufError::at(GgufErrorKind::BadValue("recurrent_layers must hold bools"), g.key_offset(key)).named_str(key))?,
                            };
                            if on {
                                hp.recurrent[l / 64] |= 1 << (l % 64);
                            }
                        }
                    }
                    None => {
                        let interval = g.u32_opt(keys.key("full_attention_interval"))?.unwrap_or(4) as usize;
                        for l in 0..n_layer {
                            if interval == 0 || (l + 1) % interval != 0 {
                                hp.recurrent[l / 64] |= 1 << (l % 64);
                            }
                        }
                    }
                }
            }
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => {}
        }
        hp.check().map_err(|e| e.named(arch_s))?;
        Ok(hp)
    }

    fn check(&self) -> Result<(), GgufError> {
        let bad = |why| Err(GgufError::at(GgufErrorKind::BadValue(why), 0));
        const LIMIT: usize = 1 << 20;
        if self.n_embd > LIMIT || self.n_ff > 4 * LIMIT || self.n_layer > 4096 || self.n_head > 4096 || self.n_vocab > 16 * LIMIT || self.head_dim > 4096 || self.head_dim_v > 4096 {
            return bad("hyper-parameter out of range (width > 2^20, layers or heads > 4096, head size > 4096)");
        }
        if self.n_head_kv == 0 || self.n_head % self.n_head_kv != 0 {
            return bad("head_count must be a multiple of head_count_kv");
        }
        if self.n_rot > self.head_dim || self.n_rot % 2 != 0 {
            return bad("rope.dimension_count must be even and at most the head size");
        }
        if self.head_dim == 0 || self.n_vocab == 0 || self.n_ff == 0 {
            return bad("head size, vocabulary and feed_forward_length must be > 0");
        }
        if !(self.rms_eps > 0.0 && self.rms_eps < 1.0) || !(self.rope_base > 1.0 && self.rope_base.is_finite()) || !(self.rope_base_swa > 1.0 && self.rope_base_swa.is_finite()) {
            return bad("rms epsilon must be in (0, 1) and rope.freq_base (and freq_base_swa) > 1");
        }
        if self.n_swa > 0 && self.swa_pattern == 0 {
            return bad("attention.sliding_window_pattern must be > 0");
        }
        if let Some(s) = self.ssm {
            if s.d_conv < 1 || s.d_conv > 64 || s.d_state == 0 || s.d_state > 1024 || s.n_k_heads == 0 || s.n_v_heads == 0 || s.n_v_heads % s.n_k_heads != 0 {
                return bad("ssm: conv_kernel must be 1..=64, state_size 1..=1024, time_step_rank a multiple of group_count");
            }
            if s.d_inner != s.n_v_heads * s.d_state {
                return bad("ssm.inner_size must equal time_step_rank * state_size");
            }
            if self.head_dim != self.head_dim_v {
                return bad("key_length and value_length must be equal in a qwen35 model");
            }
        }
        Ok(())
    }

    /// Query width (`n_head * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Key width (`n_head_kv * head_dim`).
    pub fn k_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Value width (`n_head_kv * head_dim_v`).
    pub fn v_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_v
    }

    /// Whether layer `l` is a gated delta-net (recurrent) layer.
    pub fn is_recurrent(&self, l: usize) -> bool {
        self.ssm.is_some() && l < MAX_HYBRID_LAYERS && self.recurrent[l / 64] & (1 << (l % 64)) != 0
    }

    /// Whether layer `l` attends through a sliding window.
    pub fn is_swa(&self, l: usize) -> bool {
        self.n_swa > 0 && l % self.swa_pattern < self.swa_pattern - 1
    }

    /// RoPE base of layer `l`.
    pub fn rope_base_of(&self, l: usize) -> f32 {
        if self.is_swa(l) {
            self.rope_base_swa
        } else {
            self.rope_base
        }
    }

    /// RoPE frequency scaling of layer `l` (sliding-window layers keep freq_scale 1, as
    /// in llama.cpp; YaRN's beta_fast/beta_slow are llama.cpp's defaults 32 and 1).
    pub fn rope_scale_of(&self, l: usize) -> RopeScale {
        let freq_scale = if self.is_swa(l) { 1.0 } else { self.rope_freq_scale };
        RopeScale::new(freq_scale, self.rope_ext_factor, self.rope_attn_factor, self.rope_n_ctx_orig, self.rope_base_of(l), self.n_rot, 32.0, 1.0)
    }

    /// Whether RoPE is scaled at all (any layer's angles or magnitudes differ from
    /// plain RoPE's).
    pub fn rope_scaled(&self) -> bool {
        self.rope_freq_scale != 1.0 || self.rope_ext_factor != 0.0 || self.rope_attn_factor != 1.0
    }

    /// Number of recurrent layers.
    pub fn n_recurrent(&self) -> usize {
        (0..self.n_layer).filter(|&l| self.is_recurrent(l)).count()
    }

    /// KV-cache rows layer `l` keeps for a context of `n_ctx` evaluated `n_batch` tokens
    /// at a time: 0 for recurrent layers; for sliding-window layers a ring of
    /// `n_swa + n_batch - 1` rows (every key a batch can see); else `n_ctx`.
    pub fn kv_rows(&self, l: usize, n_ctx: usize, n_batch: usize) -> usize {
        if self.is_recurrent(l) {
            0
        } else if self.is_swa(l) {
            n_ctx.min(self.n_swa + n_batch - 1)
        } else {
            n_ctx
        }
    }
}

/// Refuses a file whose integer `key` is above `max`: it declares something keel does not
/// implement (`why` names it and the fix), and running it anyway would be a wrong answer.
fn refuse_above(g: &Gguf<'_>, key: &str, max: u32, why: &'static str) -> Result<(), GgufError> {
    match g.u32_opt(key)? {
        Some(n) if n > max => Err(GgufError::at(GgufErrorKind::Unsupported(why), g.key_offset(key)).named_str(key)),
        _ => Ok(()),
    }
}

/// One part of a split file (`split.count` > 1, written by `llama-gguf-split`) holds only
/// some of the tensors: refused, naming the key and the fix, rather than run as if whole.
fn refuse_split(g: &Gguf<'_>) -> Result<(), GgufError> {
    refuse_above(
        g,
        "split.count",
        1,
        "this file is one part of a split GGUF; split GGUF files are not supported: merge the parts with `llama-gguf-split --merge FIRST-PART.gguf MERGED.gguf` and load the merged file",
    )
}

/// A mixture-of-experts model (`<arch>.expert_count` > 0) routes each token through some
/// of its experts; keel computes dense feed-forwards only, so it refuses the file.
fn refuse_experts(g: &Gguf<'_>, keys: &mut ArchKeys) -> Result<(), GgufError> {
    refuse_above(g, keys.key("expert_count"), 0, "mixture-of-experts models (expert_count > 0) are not supported: keel runs dense models only; use a dense model")
}

/// Builds `<arch>.<suffix>` metadata key names without allocating.
pub struct ArchKeys {
    arch: Arch,
    buf: heapless::String<128>,
}

impl ArchKeys {
    /// Key builder for `arch`.
    pub fn new(arch: Arch) -> Self {
        ArchKeys { arch, buf: heapless::String::new() }
    }

    /// The key `<arch>.<suffix>` (valid until the next call).
    pub fn key(&mut self, suffix: &str) -> &str {
        self.buf.clear();
        let _ = self.buf.push_str(self.arch.name());
        let _ = self.buf.push('.');
        let _ = self.buf.push_str(suffix);
        &self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::tests::Builder;

    /// A minimal llama file's hyper-parameters with extra keys written by `extra`
    /// (`n_extra` of them).
    fn hp_with(n_extra: u64, extra: impl Fn(&mut Builder)) -> Result<HParams, GgufError> {
        let mut b = Builder::new(3, 0, 6 + n_extra);
        b.kv_str("general.architecture", "llama");
        b.kv_u32("llama.embedding_length", 64).kv_u32("llama.block_count", 1).kv_u32("llama.attention.head_count", 4);
        b.kv_u32("llama.feed_forward_length", 64).kv_u32("llama.vocab_size", 16);
        extra(&mut b);
        let bytes = b.bytes().to_vec();
        HParams::from_gguf(&Gguf::parse(&bytes).unwrap())
    }

    #[test]
    fn rope_scaling_keys_follow_llama_cpp() {
        let hp = hp_with(0, |_| {}).unwrap();
        assert!(!hp.rope_scaled());
        // The type defaults to linear; the old key name is read too.
        let hp = hp_with(1, |b| {
            b.kv_f32("llama.rope.scale_linear", 2.0);
        })
        .unwrap();
        assert_eq!((hp.rope_freq_scale, hp.rope_ext_factor, hp.rope_attn_factor), (0.5, 0.0, 1.0));
        // Type none ignores the factor.
        let hp = hp_with(2, |b| {
            b.kv_str("llama.rope.scaling.type", "none").kv_f32("llama.rope.scaling.factor", 4.0);
        })
        .unwrap();
        assert!(!hp.rope_scaled());
        // YaRN: ext_factor 1, the attention factor m(4)/(1 + 0.1 ln 4) times the file's,
        // original context from its key (else the training context).
        let hp = hp_with(4, |b| {
            b.kv_str("llama.rope.scaling.type", "yarn").kv_f32("llama.rope.scaling.factor", 4.0);
            b.kv_u32("llama.rope.scaling.original_context_length", 512).kv_f32("llama.rope.scaling.attn_factor", 0.5);
        })
        .unwrap();
        assert_eq!((hp.rope_freq_scale, hp.rope_ext_factor, hp.rope_n_ctx_orig), (0.25, 1.0, 512));
        assert!((hp.rope_attn_factor - 0.5).abs() < 1e-6, "{}", hp.rope_attn_factor);
        let e = hp_with(2, |b| {
            b.kv_str("llama.rope.scaling.type", "yarn").kv_f32("llama.rope.scaling.yarn_beta_slow", 2.0);
        })
        .unwrap_err();
        assert!(matches!(e.kind, GgufErrorKind::Unsupported(_)));
        assert_eq!(e.name.unwrap().as_str(), "llama.rope.scaling.yarn_beta_slow");
    }
}

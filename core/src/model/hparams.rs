//! Hyper-parameters read from GGUF metadata (`<arch>.*` keys).

use crate::gguf::{Gguf, GgufError, GgufErrorKind};

/// A model architecture keel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `llama`: Llama 2/3, SmolLM, TinyLlama...
    Llama,
}

impl Arch {
    /// The `general.architecture` string.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
        }
    }

    /// Every architecture keel runs, for error messages.
    pub const KNOWN: &'static str = "llama";

    fn from_name(s: &[u8]) -> Option<Arch> {
        match s {
            b"llama" => Some(Arch::Llama),
            _ => None,
        }
    }
}

/// How RoPE pairs dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs `(2i, 2i+1)` (llama).
    Normal,
    /// Halves `(i, i + n_rot/2)` (NeoX, Qwen, Gemma).
    Neox,
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
    /// RoPE base frequency.
    pub rope_base: f32,
    /// Number of dimensions RoPE rotates in each head.
    pub n_rot: usize,
    /// RoPE pairing.
    pub rope_mode: RopeMode,
}

impl HParams {
    /// Reads the hyper-parameters of a model file, checking them for sanity.
    pub fn from_gguf(g: &Gguf<'_>) -> Result<HParams, GgufError> {
        let arch_s = g.str_opt("general.architecture")?.ok_or_else(|| GgufError::at(GgufErrorKind::MissingKey, 0).named_str("general.architecture"))?;
        let arch = Arch::from_name(arch_s).ok_or_else(|| GgufError::at(GgufErrorKind::BadValue("architecture not supported (keel runs: llama)"), g.key_offset("general.architecture")).named(arch_s))?;
        let mut keys = ArchKeys::new(arch);
        let n_embd = g.u32(keys.key("embedding_length"))? as usize;
        let n_layer = g.u32(keys.key("block_count"))? as usize;
        let n_head = g.u32(keys.key("attention.head_count"))? as usize;
        let n_head_kv = g.u32_opt(keys.key("attention.head_count_kv"))?.map(|v| v as usize).unwrap_or(n_head);
        let n_ff = g.u32(keys.key("feed_forward_length"))? as usize;
        let n_ctx_train = g.u32_opt(keys.key("context_length"))?.unwrap_or(2048) as usize;
        let rms_eps = g.f32_opt(keys.key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5);
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
        let hp = HParams { arch, n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, head_dim_v, n_ff, n_ctx_train, rms_eps, rope_base, n_rot, rope_mode: RopeMode::Normal };
        hp.check()?;
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
        if !(self.rms_eps > 0.0 && self.rms_eps < 1.0) || !(self.rope_base > 1.0 && self.rope_base.is_finite()) {
            return bad("rms epsilon must be in (0, 1) and rope.freq_base > 1");
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

//! Which type each tensor gets when a model is quantized to one of llama.cpp's mixes.
//!
//! Owns the rules of llama.cpp's `llama_model_quantize` (build 11434, `llama-quant.cpp`,
//! without an importance matrix and without per-tensor overrides), reimplemented for
//! the mixes keel offers: which tensors may be quantized at all, the per-category
//! choices of each mix (token embedding and output, attention V, FFN down, ...), and
//! the fallback when a row length is not a multiple of the chosen type's block.
//! Knows nothing of bytes: `cli/quantize.rs` does the converting and writing.
//!
//! llama.cpp walks the tensors sorted by layer number, then by name (its loader's
//! `weights_map`), and the layer-dependent rules count tensors in that order; so does
//! [`choose_types`], whatever order the file stores them in.

use anyhow::{bail, Result};
use keel_core::ggml_type::GgmlType;
use keel_core::gguf::{Gguf, Value};

/// A target of `keel quantize`: a llama.cpp file type ("mix").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types, missing_docs)]
pub enum Mix {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    IQ4_NL,
    Q4_K_M,
    Q6_K,
}

/// Every mix keel knows the rules of, in the order usage text lists them.
pub const ALL_MIXES: [Mix; 8] = [Mix::Q8_0, Mix::Q4_0, Mix::Q4_1, Mix::Q5_0, Mix::Q5_1, Mix::IQ4_NL, Mix::Q4_K_M, Mix::Q6_K];

impl Mix {
    /// Parses a TYPE argument as `llama-quantize` spells it (case-insensitive; `Q4_K` is
    /// its alias for `Q4_K_M`).
    pub fn parse(s: &str) -> Option<Mix> {
        let up = s.to_ascii_uppercase();
        if up == "Q4_K" {
            return Some(Mix::Q4_K_M);
        }
        ALL_MIXES.into_iter().find(|m| m.name() == up)
    }

    /// The name llama.cpp uses.
    pub fn name(self) -> &'static str {
        match self {
            Mix::Q4_0 => "Q4_0",
            Mix::Q4_1 => "Q4_1",
            Mix::Q5_0 => "Q5_0",
            Mix::Q5_1 => "Q5_1",
            Mix::Q8_0 => "Q8_0",
            Mix::IQ4_NL => "IQ4_NL",
            Mix::Q4_K_M => "Q4_K_M",
            Mix::Q6_K => "Q6_K",
        }
    }

    /// The `llama_ftype` number written to `general.file_type`.
    pub fn ftype(self) -> u32 {
        match self {
            Mix::Q4_0 => 2,
            Mix::Q4_1 => 3,
            Mix::Q8_0 => 7,
            Mix::Q5_0 => 8,
            Mix::Q5_1 => 9,
            Mix::Q4_K_M => 15,
            Mix::Q6_K => 18,
            Mix::IQ4_NL => 25,
        }
    }

    /// The type most tensors get (llama.cpp's `llama_ftype_get_default_type`).
    pub fn default_type(self) -> GgmlType {
        match self {
            Mix::Q4_0 => GgmlType::Q4_0,
            Mix::Q4_1 => GgmlType::Q4_1,
            Mix::Q5_0 => GgmlType::Q5_0,
            Mix::Q5_1 => GgmlType::Q5_1,
            Mix::Q8_0 => GgmlType::Q8_0,
            Mix::IQ4_NL => GgmlType::IQ4_NL,
            Mix::Q4_K_M => GgmlType::Q4_K,
            Mix::Q6_K => GgmlType::Q6_K,
        }
    }
}

/// The model facts the rules depend on, from the GGUF metadata.
#[derive(Clone, Debug, Default)]
pub struct ModelFacts {
    /// `general.architecture`.
    pub arch: String,
    /// `{arch}.block_count`.
    pub n_layer: u32,
    /// Attention heads and KV heads of layer 0 (for the GQA ratio).
    pub n_head: u32,
    /// KV heads of layer 0.
    pub n_head_kv: u32,
    /// `{arch}.expert_count` (0 if absent).
    pub n_expert: u32,
    /// llama.cpp would classify the model as "70B" (some rules bump its attention V).
    pub is_70b: bool,
}

fn first_int(g: &Gguf<'_>, key: &str) -> Option<u32> {
    match g.get(key)? {
        Value::Array(a) => a.int(0).and_then(|v| u32::try_from(v).ok()),
        v => v.as_int().and_then(|v| u32::try_from(v).ok()),
    }
}

impl ModelFacts {
    /// Reads the facts; a missing architecture or block count is an error.
    pub fn from_gguf(g: &Gguf<'_>) -> Result<ModelFacts> {
        let arch = match g.str_opt("general.architecture")? {
            Some(a) => String::from_utf8_lossy(a).into_owned(),
            None => bail!("general.architecture is missing; cannot choose tensor types without it"),
        };
        let Some(n_layer) = first_int(g, &format!("{arch}.block_count")) else {
            bail!("{arch}.block_count is missing; cannot choose tensor types without it")
        };
        let n_head = first_int(g, &format!("{arch}.attention.head_count")).unwrap_or(0);
        // llama.cpp defaults the KV head count to the head count.
        let n_head_kv = first_int(g, &format!("{arch}.attention.head_count_kv")).unwrap_or(n_head);
        let n_expert = first_int(g, &format!("{arch}.expert_count")).unwrap_or(0);
        // The model-type tables of llama.cpp that yield "70B".
        let is_70b = match arch.as_str() {
            "llama" => n_layer == 80 && n_head != n_head_kv,
            "qwen2" | "deci" | "olmo" => n_layer == 80,
            "jais2" => n_layer == 68,
            _ => false,
        };
        Ok(ModelFacts { arch, n_layer, n_head, n_head_kv, n_expert, is_70b })
    }

    fn n_gqa(&self) -> u32 {
        if self.n_head_kv == 0 {
            0
        } else {
            self.n_head / self.n_head_kv
        }
    }
}

/// A tensor as the rules see it.
#[derive(Clone, Debug)]
pub struct TensorShape {
    /// Name.
    pub name: String,
    /// Dimensions (ggml order).
    pub ne: [u64; 4],
    /// Current type.
    pub ty: GgmlType,
}

/// The decision for one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The type it will have in the output.
    pub target: GgmlType,
    /// True if the mix's choice did not fit the row length and a fallback was taken.
    pub fallback: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    AttnQkv,
    AttnKvB,
    AttnV,
    AttnK,
    AttnQ,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

fn category(name: &str) -> Category {
    use Category::*;
    if name == "output.weight" {
        return Output;
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        return TokenEmbd;
    }
    let table = [
        ("attn_qkv.weight", AttnQkv),
        ("attn_kv_b.weight", AttnKvB),
        ("attn_v.weight", AttnV),
        ("attn_k.weight", AttnK),
        ("attn_q.weight", AttnQ),
        ("attn_output.weight", AttnOutput),
        ("ffn_up", FfnUp),
        ("ffn_gate", FfnGate),
        ("ffn_down", FfnDown),
    ];
    table.into_iter().find(|(pat, _)| name.contains(pat)).map(|(_, c)| c).unwrap_or(Other)
}

/// Dimensions that count: like `ggml_n_dims`, trailing 1s do not.
fn n_dims(ne: &[u64; 4]) -> usize {
    (1..4).rev().find(|&i| ne[i] > 1).map(|i| i + 1).unwrap_or(1)
}

/// Substrings that keep a tensor in its type whatever the mix (llama.cpp's list; the
/// architecture-specific `glm5-next` entries are in [`allows_quantization`]).
const NEVER: &[&str] = &[
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
    "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
    "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
    "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
    "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd",
    "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook",
    "mm.a.code_embd",
];

const NEVER_GLM5_NEXT: &[&str] = &[
    "hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
    "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight",
    "ssm_g_b.weight", "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight",
    "attn_v_b.weight",
];

/// May this tensor be quantized at all? 2-D and higher weights only, and not norms,
/// position embeddings, routers and the other small or sensitive tensors.
pub fn allows_quantization(arch: &str, t: &TensorShape) -> bool {
    let name = t.name.as_str();
    n_dims(&t.ne) >= 2
        && name.ends_with("weight")
        && !NEVER.iter().any(|p| name.contains(p))
        && !(arch == "glm5-next" && NEVER_GLM5_NEXT.iter().any(|p| name.contains(p)))
        && name != "position_embd.weight"
        && name != "token_types.weight"
}

fn layer_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// llama.cpp's tensor order: by layer number (`blk.N.`; others first), then by name.
fn llama_order(tensors: &[TensorShape]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..tensors.len()).collect();
    idx.sort_by(|&a, &b| {
        let (na, nb) = (&tensors[a].name, &tensors[b].name);
        layer_of(na).unwrap_or(-1).cmp(&layer_of(nb).unwrap_or(-1)).then_with(|| na.as_bytes().cmp(nb.as_bytes()))
    });
    idx
}

fn use_more_bits(i_layer: i64, n_layer: i64) -> bool {
    i_layer < n_layer / 8 || i_layer >= 7 * n_layer / 8 || (i_layer - n_layer / 8) % 3 == 2
}

/// Counters llama.cpp keeps while it walks the tensors.
struct State<'a> {
    mix: Mix,
    facts: &'a ModelFacts,
    tied_embeddings: bool,
    n_attention_wv: i64,
    i_attention_wv: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
}

impl State<'_> {
    /// (layer, layer count) for the layer-dependent rules: a running count, or the
    /// layer number in the name for mixture-of-experts models.
    fn layer_info(&self, counter: i64, name: &str) -> Result<(i64, i64)> {
        let n_layer = self.facts.n_layer as i64;
        if self.facts.n_expert.max(1) > 1 {
            let Some(l) = layer_of(name) else { bail!("cannot tell the layer of tensor {name}") };
            if l >= n_layer {
                bail!("tensor {name} is in layer {l}, but the model has {n_layer}");
            }
            return Ok((l, n_layer));
        }
        Ok((counter, n_layer))
    }

    /// llama.cpp's per-category choice (`llama_tensor_get_type_impl`) for these mixes.
    fn mix_type(&mut self, t: &TensorShape, cat: Category) -> Result<GgmlType> {
        use GgmlType as G;
        let (mix, f) = (self.mix, self.facts);
        let mut ty = mix.default_type();
        let falcon = f.arch == "falcon";
        if f.arch == "glm5-next" && ["attn_q_a", "attn_q_b", "nextn.eh_proj"].iter().any(|p| t.name.contains(p)) {
            return Ok(G::Q8_0);
        }
        match cat {
            Category::Output | Category::TokenEmbd if cat == Category::Output || self.tied_embeddings => {
                if falcon || t.ne[0] % ty.block_size() as u64 != 0 {
                    ty = G::Q8_0;
                } else if ty != G::Q8_0 {
                    ty = G::Q6_K;
                }
            }
            Category::TokenEmbd => {}
            Category::AttnV | Category::AttnQkv | Category::AttnKvB => {
                if mix == Mix::IQ4_NL && f.n_gqa() >= 4 {
                    ty = G::Q5_K;
                } else if mix == Mix::Q4_K_M && use_more_bits(self.i_attention_wv, self.n_attention_wv) {
                    ty = G::Q6_K;
                }
                if f.is_70b && matches!(ty, G::Q3_K | G::Q4_K) {
                    ty = G::Q5_K;
                }
                if f.n_expert == 8 {
                    ty = G::Q8_0;
                }
                self.i_attention_wv += 1;
            }
            Category::AttnK if f.n_expert == 8 => ty = G::Q8_0,
            Category::FfnDown => {
                let (i, n) = self.layer_info(self.i_ffn_down, &t.name)?;
                if mix == Mix::Q4_K_M {
                    if falcon {
                        ty = if i < n / 16 {
                            G::Q6_K
                        } else if use_more_bits(i, n) {
                            G::Q5_K
                        } else {
                            G::Q4_K
                        };
                    } else if use_more_bits(i, n) {
                        ty = G::Q6_K;
                    }
                } else if mix == Mix::IQ4_NL && i < n / 8 {
                    ty = G::Q5_K;
                }
                self.i_ffn_down += 1;
            }
            Category::AttnOutput if !falcon && f.n_expert == 8 && matches!(mix, Mix::IQ4_NL | Mix::Q4_K_M) => ty = G::Q5_K,
            Category::FfnGate => {
                self.layer_info(self.i_ffn_gate, &t.name)?;
                self.i_ffn_gate += 1;
            }
            Category::FfnUp => {
                self.layer_info(self.i_ffn_up, &t.name)?;
                self.i_ffn_up += 1;
            }
            _ => {}
        }
        Ok(ty)
    }
}

/// The type to use when `ty`'s blocks do not fit a row of `ncols` (llama.cpp's
/// `tensor_type_fallback`): 256-blocks step down to a 32-block type, and a row that
/// is not a multiple of 32 gets F16.
pub fn fallback(ty: GgmlType, ncols: u64) -> Result<(GgmlType, bool)> {
    use GgmlType as G;
    if ncols % ty.block_size() as u64 == 0 {
        return Ok((ty, false));
    }
    let to = match ty {
        G::IQ1_S | G::IQ1_M | G::IQ2_XXS | G::IQ2_XS | G::IQ2_S | G::IQ3_XXS | G::IQ3_S | G::IQ4_XS => G::IQ4_NL,
        G::Q2_K | G::Q3_K | G::TQ1_0 | G::TQ2_0 => G::Q4_0,
        G::Q4_K => G::Q5_0,
        G::Q5_K => G::Q5_1,
        G::Q6_K => G::Q8_0,
        t if t.block_size() <= 32 => t,
        t => bail!("no fallback type is defined for {t}"),
    };
    Ok((if ncols % to.block_size() as u64 != 0 { G::F16 } else { to }, true))
}

/// The output type of every tensor (same order as `tensors`) for `mix`.
pub fn choose_types(mix: Mix, facts: &ModelFacts, tensors: &[TensorShape]) -> Result<Vec<Choice>> {
    let cats: Vec<Category> = tensors.iter().map(|t| category(&t.name)).collect();
    let mut st = State {
        mix,
        facts,
        tied_embeddings: !cats.contains(&Category::Output),
        n_attention_wv: cats.iter().filter(|c| matches!(c, Category::AttnV | Category::AttnQkv | Category::AttnKvB)).count() as i64,
        i_attention_wv: 0,
        i_ffn_down: 0,
        i_ffn_gate: 0,
        i_ffn_up: 0,
    };
    let mut out = vec![Choice { target: GgmlType::F32, fallback: false }; tensors.len()];
    for i in llama_order(tensors) {
        let t = &tensors[i];
        out[i] = if allows_quantization(&facts.arch, t) {
            let ty = st.mix_type(t, cats[i])?;
            let (target, fallback) = fallback(ty, t.ne[0])?;
            Choice { target, fallback }
        } else {
            Choice { target: t.ty, fallback: false }
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, ne: [u64; 4]) -> TensorShape {
        TensorShape { name: name.into(), ne, ty: GgmlType::F32 }
    }

    fn facts(n_layer: u32) -> ModelFacts {
        ModelFacts { arch: "llama".into(), n_layer, n_head: 9, n_head_kv: 3, ..Default::default() }
    }

    #[test]
    fn parses_names_and_alias() {
        assert_eq!(Mix::parse("q8_0"), Some(Mix::Q8_0));
        assert_eq!(Mix::parse("Q4_K"), Some(Mix::Q4_K_M));
        assert_eq!(Mix::parse("Q3_K_S"), None);
    }

    #[test]
    fn one_dimensional_and_norms_stay() {
        let f = facts(1);
        let ts = [t("blk.0.attn_norm.weight", [64, 1, 1, 1]), t("blk.0.attn_q.weight", [64, 64, 1, 1]), t("blk.0.x_norm.weight", [64, 64, 1, 1]), t("blk.0.attn_q.bias", [64, 64, 1, 1])];
        let c = choose_types(Mix::Q4_0, &f, &ts).unwrap();
        let got: Vec<GgmlType> = c.iter().map(|c| c.target).collect();
        assert_eq!(got, [GgmlType::F32, GgmlType::Q4_0, GgmlType::F32, GgmlType::F32]);
    }

    #[test]
    fn output_and_tied_embeddings() {
        let f = facts(1);
        // Tied: the embedding takes the output's rule; Q6_K does not fit 576 → Q8_0.
        let c = choose_types(Mix::Q4_0, &f, &[t("token_embd.weight", [576, 10, 1, 1])]).unwrap();
        assert_eq!(c[0], Choice { target: GgmlType::Q8_0, fallback: true });
        // Untied: the embedding gets the default type, the output Q6_K (fits 512).
        let c = choose_types(Mix::Q4_0, &f, &[t("token_embd.weight", [512, 10, 1, 1]), t("output.weight", [512, 10, 1, 1])]).unwrap();
        assert_eq!(c[0].target, GgmlType::Q4_0);
        assert_eq!(c[1], Choice { target: GgmlType::Q6_K, fallback: false });
    }

    #[test]
    fn fallbacks() {
        assert_eq!(fallback(GgmlType::Q4_K, 576).unwrap(), (GgmlType::Q5_0, true));
        assert_eq!(fallback(GgmlType::Q6_K, 576).unwrap(), (GgmlType::Q8_0, true));
        assert_eq!(fallback(GgmlType::Q4_0, 40).unwrap(), (GgmlType::F16, true));
        assert_eq!(fallback(GgmlType::Q4_K, 512).unwrap(), (GgmlType::Q4_K, false));
    }

    #[test]
    fn q4_k_m_ffn_down_by_layer() {
        let f = facts(8);
        let ts: Vec<TensorShape> = (0..8).rev().map(|i| t(&format!("blk.{i}.ffn_down.weight"), [1536, 8, 1, 1])).collect();
        let c = choose_types(Mix::Q4_K_M, &f, &ts).unwrap();
        // Stored in reverse; chosen in layer order: layers 0, 3 (=(3-1)%3==2), 7 get Q6_K.
        let six: Vec<usize> = (0..8).filter(|&i| c[7 - i].target == GgmlType::Q6_K).collect();
        assert_eq!(six, [0, 3, 6, 7]);
    }
}

//! Token attributes and the special tokens: ids from the GGUF keys, and the
//! end-of-generation set and attribute fix-ups llama.cpp derives from token texts.
//!
//! Owns: `TokenType` (the GGUF `token_type` values), `TokenAttr` (llama.cpp's
//! attribute bits, which the fix-ups below can change), and `Specials`. The rules
//! follow llama.cpp's `llama_vocab::impl::load`: ids out of range are ignored,
//! unset EOT/EOM/FIM ids are found by their text (and made CONTROL), control tokens
//! whose text says "unused" become UNUSED, a fixed list of texts (`<|im_end|>`,
//! `<end_of_turn>`, `<|endoftext|>`, ...) plus EOS/EOT/EOM and FIM pad/rep/sep are
//! end-of-generation. Does not tokenize.

use super::error::TokenizerError;
use super::vocab::Index;
use crate::gguf::{Array, Gguf};

/// The GGUF `tokenizer.ggml.token_type` value of a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum TokenType {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
}

impl TokenType {
    /// The type with GGUF value `v` (anything else is `Undefined`, as in llama.cpp).
    pub fn from_value(v: i128) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// llama.cpp's token attribute bits (`llama_token_attr`), after its fix-ups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TokenAttr(pub u8);

#[allow(missing_docs)]
impl TokenAttr {
    pub const UNKNOWN: u8 = 1;
    pub const UNUSED: u8 = 2;
    pub const NORMAL: u8 = 4;
    pub const CONTROL: u8 = 8;
    pub const USER_DEFINED: u8 = 16;
    pub const BYTE: u8 = 32;

    /// The attribute a GGUF token type starts with.
    pub fn from_type(t: TokenType) -> TokenAttr {
        TokenAttr(match t {
            TokenType::Undefined => 0,
            TokenType::Normal => Self::NORMAL,
            TokenType::Unknown => Self::UNKNOWN,
            TokenType::Control => Self::CONTROL,
            TokenType::UserDefined => Self::USER_DEFINED,
            TokenType::Unused => Self::UNUSED,
            TokenType::Byte => Self::BYTE,
        })
    }

    pub fn has(self, bits: u8) -> bool {
        self.0 & bits != 0
    }
    pub fn is_control(self) -> bool {
        self.has(Self::CONTROL)
    }
    pub fn is_user_defined(self) -> bool {
        self.has(Self::USER_DEFINED)
    }
    pub fn is_byte(self) -> bool {
        self.has(Self::BYTE)
    }
    pub fn is_unused(self) -> bool {
        self.has(Self::UNUSED)
    }

    /// Split out of raw text before tokenizing (llama.cpp's special-token cache).
    pub fn is_special(self) -> bool {
        self.has(Self::CONTROL | Self::USER_DEFINED | Self::UNKNOWN)
    }
}

/// Most end-of-generation tokens a vocabulary can have: every text in `EOG_TEXTS`
/// matches at most one token, plus EOS, EOT, EOM and the three FIM ids.
pub const MAX_EOG: usize = 32;

/// The special token ids and the end-of-generation set.
#[derive(Clone, Debug, Default)]
pub(crate) struct Specials {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub eog: heapless::Vec<u32, MAX_EOG>,
}

const EOT_TEXTS: &[&str] = &["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"];
const FIM_SUF_TEXTS: &[&str] = &["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"];
const FIM_MID_TEXTS: &[&str] = &["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Texts llama.cpp treats as end of generation wherever they appear in a vocabulary.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
];
/// gpt-oss tokens llama.cpp always renders (made USER_DEFINED).
const ALWAYS_RENDER_TEXTS: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// Fills `attrs` (one byte per token) from the GGUF token types.
pub(crate) fn init_attrs(types: Option<&Array<'_>>, attrs: &mut [u8]) {
    for (i, a) in attrs.iter_mut().enumerate() {
        let t = types.and_then(|t| t.int(i)).map(TokenType::from_value).unwrap_or(TokenType::Normal);
        *a = TokenAttr::from_type(t).0;
    }
}

/// The BOS or EOS id: a value outside the vocabulary is refused, naming the key (llama.cpp
/// warns and falls back to a default id, which silently changes what every prompt
/// starts with or where generation stops).
fn bos_eos_key(g: &Gguf<'_>, key: &'static str, n_vocab: usize, default: Option<u32>) -> Result<Option<u32>, TokenizerError> {
    match g.u32_opt(key)? {
        Some(id) if id as usize >= n_vocab => Err(TokenizerError::SpecialOutOfRange { key, id, n_vocab }),
        Some(id) => Ok(Some(id)),
        None => Ok(default.filter(|&d| (d as usize) < n_vocab)),
    }
}

/// An id key's value if present and inside the vocabulary (llama.cpp ignores others).
fn id_key(g: &Gguf<'_>, key: &str, n_vocab: usize, default: Option<u32>) -> Result<Option<u32>, TokenizerError> {
    let default = default.filter(|&d| (d as usize) < n_vocab);
    Ok(match g.u32_opt(key)? {
        Some(v) if (v as usize) < n_vocab => Some(v),
        _ => default,
    })
}

fn add_unique(set: &mut heapless::Vec<u32, MAX_EOG>, id: u32) {
    if !set.contains(&id) {
        // Cannot overflow: see MAX_EOG.
        let _ = set.push(id);
    }
}

/// Reads the special ids, applies llama.cpp's text-based fix-ups to `attrs`, and
/// builds the end-of-generation set. `spm` selects the SentencePiece defaults.
pub(crate) fn specials(g: &Gguf<'_>, idx: &Index<'_>, attrs: &mut [u8], spm: bool) -> Result<Specials, TokenizerError> {
    let n = attrs.len();
    let (def_bos, def_eos, def_unk) = if spm { (Some(1), Some(2), Some(0)) } else { (Some(11), Some(11), None) };
    let mut s = Specials {
        bos: bos_eos_key(g, "tokenizer.ggml.bos_token_id", n, def_bos)?,
        eos: bos_eos_key(g, "tokenizer.ggml.eos_token_id", n, def_eos)?,
        eot: id_key(g, "tokenizer.ggml.eot_token_id", n, None)?,
        eom: id_key(g, "tokenizer.ggml.eom_token_id", n, None)?,
        unk: id_key(g, "tokenizer.ggml.unknown_token_id", n, def_unk)?,
        pad: id_key(g, "tokenizer.ggml.padding_token_id", n, None)?,
        eog: heapless::Vec::new(),
    };
    let fim_pre = id_key(g, "tokenizer.ggml.fim_pre_token_id", n, id_key(g, "tokenizer.ggml.prefix_token_id", n, None)?)?;
    let fim_suf = id_key(g, "tokenizer.ggml.fim_suf_token_id", n, id_key(g, "tokenizer.ggml.suffix_token_id", n, None)?)?;
    let fim_mid = id_key(g, "tokenizer.ggml.fim_mid_token_id", n, id_key(g, "tokenizer.ggml.middle_token_id", n, None)?)?;
    let mut fim_pad = id_key(g, "tokenizer.ggml.fim_pad_token_id", n, None)?;
    let mut fim_rep = id_key(g, "tokenizer.ggml.fim_rep_token_id", n, None)?;
    let mut fim_sep = id_key(g, "tokenizer.ggml.fim_sep_token_id", n, None)?;

    // Unset ids found by text; the chosen token becomes CONTROL.
    let find = |slot: &mut Option<u32>, texts: &[&str], attrs: &mut [u8]| {
        if slot.is_none() {
            if let Some(id) = texts.iter().find_map(|t| idx.id(t.as_bytes())) {
                *slot = Some(id);
                attrs[id as usize] |= TokenAttr::CONTROL;
            }
        }
    };
    find(&mut s.eot, EOT_TEXTS, attrs);
    find(&mut s.eom, EOM_TEXTS, attrs);
    for (slot, texts) in [(fim_pre, FIM_PRE_TEXTS), (fim_suf, FIM_SUF_TEXTS), (fim_mid, FIM_MID_TEXTS)] {
        let mut slot = slot;
        find(&mut slot, texts, attrs);
    }
    find(&mut fim_pad, FIM_PAD_TEXTS, attrs);
    find(&mut fim_rep, FIM_REP_TEXTS, attrs);
    find(&mut fim_sep, FIM_SEP_TEXTS, attrs);

    // Control tokens named "unused..." are unused.
    for (id, a) in attrs.iter_mut().enumerate() {
        if *a & TokenAttr::CONTROL != 0 && idx.text(id as u32).windows(6).any(|w| w == b"unused") {
            *a |= TokenAttr::UNUSED;
        }
    }

    for id in [fim_pad, fim_rep, fim_sep].into_iter().flatten() {
        add_unique(&mut s.eog, id);
    }
    for t in EOG_TEXTS {
        if let Some(id) = idx.id(t.as_bytes()) {
            add_unique(&mut s.eog, id);
            attrs[id as usize] |= TokenAttr::CONTROL;
        }
    }
    for t in ALWAYS_RENDER_TEXTS {
        if let Some(id) = idx.id(t.as_bytes()) {
            attrs[id as usize] = TokenAttr::USER_DEFINED;
        }
    }
    for id in [s.eos, s.eot, s.eom].into_iter().flatten() {
        add_unique(&mut s.eog, id);
    }

    // o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
    let in_eog = |s: &Specials, t: &str| idx.id(t.as_bytes()).filter(|id| s.eog.contains(id));
    let end = in_eog(&s, "<|end|>");
    let ret = in_eog(&s, "<|return|>").is_some();
    let call = in_eog(&s, "<|call|>").is_some() || in_eog(&s, "<|calls|>").is_some();
    let flush = in_eog(&s, "<|flush|>").is_some();
    if let Some(end) = end {
        if call && (ret || flush) {
            s.eog.retain(|&x| x != end);
            attrs[end as usize] = TokenAttr::USER_DEFINED;
        }
    }
    // gemma4 / paddleocr: "</s>" is not end of generation next to "<|tool_response>".
    if let (Some(_), Some(eos_s)) = (in_eog(&s, "<|tool_response>"), in_eog(&s, "</s>")) {
        s.eog.retain(|&x| x != eos_s);
        attrs[eos_s as usize] = TokenAttr::NORMAL;
    }
    Ok(s)
}

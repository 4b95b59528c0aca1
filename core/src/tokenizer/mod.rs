//! Tokenizers: text → token ids → text, matching llama.cpp token for token.
//!
//! Owns: reading a GGUF vocabulary (`tokenizer.ggml.*`), byte-level BPE
//! (`tokenizer.ggml.model = gpt2`, with the pre-tokenizer `tokenizer.ggml.pre`
//! names) and SentencePiece-style merging (`llama`, e.g. Gemma), special-token
//! handling, and decoding ids back to bytes. No allocation: the index (text → id,
//! merge ranks) is built once into memory the caller gives to [`Tokenizer::new`]
//! ([`Tokenizer::memory_bytes`] says how much), and `tokenize` works in a scratch
//! buffer of [`Tokenizer::work_bytes`]. Token texts are read from the GGUF bytes in
//! place. Does not know about models, sampling or chat templates.
//!
//! ```text
//! let mut mem = vec![0u8; Tokenizer::memory_bytes(&g)?];
//! let tok = Tokenizer::new(&g, &mut mem)?;
//! let mut work = vec![0u8; Tokenizer::work_bytes(text.len())];
//! let n = tok.tokenize(text, true, true, &mut ids, &mut work)?;
//! ```

// `TokenizerError` carries names from the file (like `GgufError`, which it wraps) and
// so is large; the tokenizing loops use the small `error::LoopError` instead.
#![allow(clippy::result_large_err)]

mod attrs;
mod bpe;
mod detok;
mod error;
mod partition;
mod pretokenize;
mod scratch;
mod spm;
mod unicode;
mod unicode_tables;
mod vocab;

#[cfg(test)]
mod tests;

pub use attrs::{TokenAttr, TokenType, MAX_EOG};
pub use detok::Utf8Stream;
pub use error::TokenizerError;
pub use pretokenize::PreTokenizer;
pub use unicode_tables::UNICODE_VERSION;

use crate::gguf::{name_from, Array, Gguf, ValueType};
use attrs::Specials;
use pretokenize::PreConfig;
use scratch::Sink;
use vocab::{Index, Layout};

/// The tokenization algorithm a vocabulary uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Model {
    /// Byte-level BPE (`tokenizer.ggml.model = gpt2`) with its pre-tokenizer.
    Bpe(PreTokenizer),
    /// SentencePiece-style merging by score (`tokenizer.ggml.model = llama`).
    Spm,
}

/// Most tokens (and merges) a vocabulary may have, so every index size fits in a
/// 32-bit `usize` (the largest real vocabularies are near 2^18).
const MAX_ENTRIES: usize = 1 << 26;

/// What the metadata says, read without building anything.
struct Config<'a> {
    model: Model,
    ignore_merges: bool,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    tokens: Array<'a>,
    merges: Option<Array<'a>>,
    types: Option<Array<'a>>,
    scores: Option<Array<'a>>,
    max_len: usize,
}

fn config<'a>(g: &Gguf<'a>) -> Result<Config<'a>, TokenizerError> {
    let model = g.str_opt("tokenizer.ggml.model")?.ok_or(TokenizerError::MissingKey("tokenizer.ggml.model"))?;
    let tokens = g.array_opt("tokenizer.ggml.tokens")?.ok_or(TokenizerError::MissingKey("tokenizer.ggml.tokens"))?;
    tokens.expect_type("tokenizer.ggml.tokens", ValueType::Str)?;
    if tokens.is_empty() || tokens.len() > MAX_ENTRIES {
        return Err(TokenizerError::BadVocab("tokenizer.ggml.tokens is empty or has more than 2^26 entries"));
    }
    let n = tokens.len();
    let types = g.array_opt("tokenizer.ggml.token_type")?;
    if let Some(t) = &types {
        t.expect_type("tokenizer.ggml.token_type", ValueType::I32)?;
        if t.len() < n {
            return Err(TokenizerError::BadVocab("tokenizer.ggml.token_type has fewer entries than tokens"));
        }
    }
    let scores = g.array_opt("tokenizer.ggml.scores")?;
    if let Some(s) = &scores {
        if !matches!(s.elem, ValueType::F32 | ValueType::I32) || s.len() < n {
            return Err(TokenizerError::BadVocab("tokenizer.ggml.scores is not an f32/i32 array as long as the tokens"));
        }
    }
    let (model, pre, merges) = match model {
        b"gpt2" => {
            let merges = g.array_opt("tokenizer.ggml.merges")?.ok_or(TokenizerError::MissingKey("tokenizer.ggml.merges"))?;
            merges.expect_type("tokenizer.ggml.merges", ValueType::Str)?;
            if merges.len() > MAX_ENTRIES {
                return Err(TokenizerError::BadVocab("tokenizer.ggml.merges has more than 2^26 entries"));
            }
            // llama.cpp falls back to "default" (with a warning) when the key is absent.
            let name = g.str_opt("tokenizer.ggml.pre")?.unwrap_or(b"default");
            let pre = PreConfig::from_name(name).ok_or_else(|| TokenizerError::UnknownPreTokenizer(name_from(name)))?;
            (Model::Bpe(pre.pre), Some(pre), Some(merges))
        }
        b"llama" => (Model::Spm, None, None),
        other => return Err(TokenizerError::UnknownModel(name_from(other))),
    };
    let spm = model == Model::Spm;
    let max_len = tokens.strings().map(<[u8]>::len).max().unwrap_or(0);
    Ok(Config {
        model,
        ignore_merges: pre.is_some_and(|p| p.ignore_merges),
        add_bos: g.bool_opt("tokenizer.ggml.add_bos_token")?.unwrap_or(spm || pre.is_some_and(|p| p.add_bos)),
        add_eos: g.bool_opt("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
        add_space_prefix: g.bool_opt("tokenizer.ggml.add_space_prefix")?.unwrap_or(spm),
        tokens,
        merges,
        types,
        scores,
        max_len,
    })
}

fn layout(c: &Config<'_>) -> Layout {
    Layout::new(c.tokens.len(), c.merges.map_or(0, |m| m.len()), c.max_len)
}

/// A vocabulary ready to tokenize, borrowing the GGUF bytes and its index memory.
#[derive(Clone, Debug)]
pub struct Tokenizer<'a> {
    model: Model,
    idx: Index<'a>,
    /// Attribute byte per token (`TokenAttr` bits).
    attrs: &'a [u8],
    /// Bit `L` set: some special token is `L` bytes long.
    special_lens: &'a [u8],
    /// First bytes of special tokens: all of them, and those split out even when
    /// `parse_special` is false (user-defined ones).
    first_any: [u32; 8],
    first_user: [u32; 8],
    /// The same for the first two bytes of special tokens of two bytes or more
    /// (bit `b0 << 8 | b1`).
    pair_any: &'a [u8],
    pair_user: &'a [u8],
    types: Option<Array<'a>>,
    scores: Option<Array<'a>>,
    sp: Specials,
    ignore_merges: bool,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    max_len: usize,
    max_piece: usize,
}

fn set_bit(bits: &mut [u32; 8], b: u8) {
    bits[(b >> 5) as usize] |= 1 << (b & 31);
}

impl<'a> Tokenizer<'a> {
    /// Bytes of index memory [`Tokenizer::new`] needs for this file's vocabulary.
    pub fn memory_bytes(g: &Gguf<'_>) -> Result<usize, TokenizerError> {
        Ok(layout(&config(g)?).total())
    }

    /// Scratch bytes `tokenize` needs for a text of `text_len` bytes.
    pub const fn work_bytes(text_len: usize) -> usize {
        let per = if bpe::work_per_byte() > spm::work_per_byte() { bpe::work_per_byte() } else { spm::work_per_byte() };
        // 4 bytes a text byte mark special tokens; the merge loops take `per`.
        (4 + per).saturating_mul(text_len.saturating_add(1))
    }

    /// Builds the tokenizer for `g`'s vocabulary, indexing it into `mem` (at least
    /// [`Tokenizer::memory_bytes`] bytes).
    pub fn new(g: &Gguf<'a>, mem: &'a mut [u8]) -> Result<Tokenizer<'a>, TokenizerError> {
        let c = config(g)?;
        let lay = layout(&c);
        if mem.len() < lay.total() {
            return Err(TokenizerError::MemoryTooSmall { needed: lay.total(), got: mem.len() });
        }
        let r = lay.split(mem);
        let idx = Index::build(g.bytes(), &c.tokens, c.merges.as_ref(), r.tok_off, r.hash, r.merge_off, r.merge_hash)?;
        attrs::init_attrs(c.types.as_ref(), r.attrs);
        let sp = attrs::specials(g, &idx, r.attrs, c.model == Model::Spm)?;
        if c.add_bos && sp.bos.is_none() {
            return Err(TokenizerError::MissingSpecial { flag: "tokenizer.ggml.add_bos_token", key: "tokenizer.ggml.bos_token_id" });
        }
        if c.add_eos && sp.eos.is_none() {
            return Err(TokenizerError::MissingSpecial { flag: "tokenizer.ggml.add_eos_token", key: "tokenizer.ggml.eos_token_id" });
        }

        let (mut first_any, mut first_user) = ([0u32; 8], [0u32; 8]);
        r.filters.fill(0);
        let (lens, pairs) = r.filters.split_at_mut(lay.len_bitmap);
        let (pair_any, pair_user) = pairs.split_at_mut(vocab::PAIR_FILTER_BYTES);
        for (id, &a) in r.attrs.iter().enumerate() {
            let a = TokenAttr(a);
            let text = idx.text(id as u32);
            if a.is_special() && !text.is_empty() {
                let user = !a.has(TokenAttr::CONTROL | TokenAttr::UNKNOWN);
                lens[text.len() / 8] |= 1 << (text.len() % 8);
                set_bit(&mut first_any, text[0]);
                if user {
                    set_bit(&mut first_user, text[0]);
                }
                if let [b0, b1, ..] = *text {
                    let k = (b0 as usize) << 8 | b1 as usize;
                    pair_any[k / 8] |= 1 << (k % 8);
                    if user {
                        pair_user[k / 8] |= 1 << (k % 8);
                    }
                }
            }
        }
        let mut t = Tokenizer {
            model: c.model,
            idx,
            attrs: r.attrs,
            special_lens: lens,
            first_any,
            first_user,
            pair_any,
            pair_user,
            types: c.types,
            scores: c.scores,
            sp,
            ignore_merges: c.ignore_merges,
            add_bos: c.add_bos,
            add_eos: c.add_eos,
            add_space_prefix: c.add_space_prefix,
            max_len: c.max_len,
            max_piece: 0,
        };
        t.max_piece = (0..t.n_vocab()).map(|id| t.piece_len(id, true)).max().unwrap_or(0);
        Ok(t)
    }

    /// Tokenizes `text` into `out`, returning the number of ids.
    ///
    /// `add_special` adds BOS/EOS as the vocabulary's flags say; `parse_special`
    /// turns control-token texts such as `<|im_start|>` into their ids (user-defined
    /// tokens are always split out, as in llama.cpp). `work` must hold
    /// [`Tokenizer::work_bytes`]`(text.len())` bytes. If `out` is too short the
    /// error says how many ids the text needs.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool, out: &mut [u32], work: &mut [u8]) -> Result<usize, TokenizerError> {
        let need = Self::work_bytes(text.len());
        if work.len() < need {
            return Err(TokenizerError::WorkTooSmall { needed: need, got: work.len() });
        }
        let text = text.as_bytes();
        let capacity = out.len();
        let mut sink = Sink { out, n: 0 };
        let (marks, scratch) = work.split_at_mut(4 * text.len());
        let partitioned = self.partition(text, parse_special, marks);
        if add_special && self.add_bos {
            sink.push(self.sp.bos.unwrap_or(0));
        }
        let mut prev_special = true;
        let mut frag = |f: partition::Fragment<'_>, sink: &mut Sink<'_>| -> Result<(), error::LoopError> {
            match f {
                partition::Fragment::Token(id) => {
                    sink.push(id);
                    prev_special = true;
                }
                partition::Fragment::Text(raw) => {
                    match self.model {
                        Model::Spm => spm::fragment(&self.idx, self.scores.as_ref(), self.max_len, raw, self.add_space_prefix && prev_special, scratch, sink)?,
                        Model::Bpe(pre) => pre.split(raw, &mut |w| bpe::word(&self.idx, w, self.ignore_merges, scratch, sink))?,
                    }
                    prev_special = false;
                }
            }
            Ok(())
        };
        partition::fragments(text, partitioned.then_some(&*marks), &mut |f| frag(f, &mut sink))?;
        if add_special && self.add_eos {
            sink.push(self.sp.eos.unwrap_or(0));
        }
        if sink.n > capacity {
            return Err(TokenizerError::OutOfSpace { needed: sink.n, capacity });
        }
        Ok(sink.n)
    }

    /// The tokenization algorithm.
    pub fn model(&self) -> Model {
        self.model
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> u32 {
        self.attrs.len() as u32
    }

    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.sp.bos
    }

    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.sp.eos
    }

    /// End-of-turn token (from the metadata, or found by its text).
    pub fn eot(&self) -> Option<u32> {
        self.sp.eot
    }

    /// Unknown token.
    pub fn unk(&self) -> Option<u32> {
        self.sp.unk
    }

    /// Padding token.
    pub fn pad(&self) -> Option<u32> {
        self.sp.pad
    }

    /// True if `tokenize(.., add_special = true, ..)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// True if `tokenize(.., add_special = true, ..)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// True if generating `id` ends the generation (EOS, EOT, EOM, and the tokens
    /// llama.cpp recognises by text, such as `<|im_end|>` or `<end_of_turn>`).
    pub fn is_eog(&self, id: u32) -> bool {
        self.sp.eog.contains(&id)
    }

    /// All end-of-generation tokens.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.sp.eog
    }

    /// The stored text of token `id` (GPT-2 alphabet or `▁` as in the vocabulary).
    pub fn token_text(&self, id: u32) -> Option<&'a [u8]> {
        (id < self.n_vocab()).then(|| self.idx.text(id))
    }

    /// The token whose stored text is exactly `text`.
    pub fn token_id(&self, text: &[u8]) -> Option<u32> {
        self.idx.id(text)
    }

    /// The GGUF type of token `id` (`Normal` when the file has no type array).
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        (id < self.n_vocab()).then(|| self.types.as_ref().and_then(|t| t.int(id as usize)).map_or(TokenType::Normal, TokenType::from_value))
    }

    /// The attributes llama.cpp gives token `id` (its type after the text-based fix-ups).
    pub fn token_attr(&self, id: u32) -> Option<TokenAttr> {
        self.attrs.get(id as usize).map(|&a| TokenAttr(a))
    }

    /// The score of token `id` (SentencePiece vocabularies; 0 when absent).
    pub fn score(&self, id: u32) -> f32 {
        spm::score(self.scores.as_ref(), id)
    }

    /// Longest token text in bytes.
    pub fn max_token_len(&self) -> usize {
        self.max_len
    }
}

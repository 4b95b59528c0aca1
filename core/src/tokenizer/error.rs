//! What can go wrong building a tokenizer or tokenizing, with messages that name it.

use core::fmt;

use crate::gguf::{GgufError, Name};

/// Which tokenizer problem an error reports.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A metadata key could not be read (wrong type, bad value).
    Gguf(GgufError),
    /// A key the tokenizer needs is absent.
    MissingKey(&'static str),
    /// `tokenizer.ggml.model` names a tokenizer keel does not implement.
    UnknownModel(Name),
    /// `tokenizer.ggml.pre` names a pre-tokenizer keel does not implement.
    UnknownPreTokenizer(Name),
    /// A vocabulary array is malformed (`what` says how).
    BadVocab(&'static str),
    /// Two tokens have the same text (llama.cpp refuses such vocabularies too).
    DuplicateToken {
        /// The earlier id.
        first: u32,
        /// The later id with the same text.
        second: u32,
    },
    /// A flag asks to add a special token whose id is not set.
    MissingSpecial {
        /// The flag (for example `tokenizer.ggml.add_bos_token`).
        flag: &'static str,
        /// The id key that is missing.
        key: &'static str,
    },
    /// The index memory given to [`super::Tokenizer::new`] is smaller than
    /// [`super::Tokenizer::memory_bytes`] said.
    MemoryTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// The scratch given to `tokenize` is smaller than `work_bytes(text.len())`.
    WorkTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// The output holds fewer tokens than the text produces; `needed` is the full count.
    OutOfSpace {
        /// Tokens the text produces.
        needed: usize,
        /// Tokens the output can hold.
        capacity: usize,
    },
    /// A token id at or past the vocabulary size.
    BadTokenId {
        /// The id.
        id: u32,
        /// The vocabulary size.
        n_vocab: u32,
    },
    /// A piece does not fit the output buffer (`max_piece_len` bytes always do).
    BufferTooSmall {
        /// Bytes the piece takes.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// A special-token id key (BOS, EOS) holds an id outside the vocabulary.
    SpecialOutOfRange {
        /// The key (for example `tokenizer.ggml.bos_token_id`).
        key: &'static str,
        /// Its value.
        id: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },
    /// SentencePiece byte fallback needs a byte token the vocabulary lacks.
    NoByteToken(u8),
    /// The vocabulary lies beyond the 4 GiB the index can address.
    TooLarge,
}

/// The errors the tokenizing loops can meet, kept small for the hot path
/// (converted to [`TokenizerError`] when `tokenize` returns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LoopError {
    WorkTooSmall { needed: usize, got: usize },
    NoByteToken(u8),
}

impl From<LoopError> for TokenizerError {
    fn from(e: LoopError) -> Self {
        match e {
            LoopError::WorkTooSmall { needed, got } => TokenizerError::WorkTooSmall { needed, got },
            LoopError::NoByteToken(b) => TokenizerError::NoByteToken(b),
        }
    }
}

impl From<GgufError> for TokenizerError {
    fn from(e: GgufError) -> Self {
        TokenizerError::Gguf(e)
    }
}

impl fmt::Display for TokenizerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use TokenizerError::*;
        match self {
            Gguf(e) => write!(f, "tokenizer metadata: {e}"),
            MissingKey(k) => write!(f, "tokenizer metadata key {k} is missing"),
            UnknownModel(m) => write!(f, "unknown tokenizer model '{m}' (tokenizer.ggml.model); keel knows: gpt2 (byte-level BPE), llama (SentencePiece)"),
            UnknownPreTokenizer(p) => write!(f, "unknown pre-tokenizer '{p}' (tokenizer.ggml.pre); keel knows: {}", super::pretokenize::KNOWN_NAMES),
            BadVocab(what) => write!(f, "bad vocabulary: {what}"),
            DuplicateToken { first, second } => write!(f, "duplicate token text: ids {first} and {second}"),
            MissingSpecial { flag, key } => write!(f, "{flag} is true but {key} is not set"),
            MemoryTooSmall { needed, got } => write!(f, "tokenizer index needs {needed} bytes, got {got}"),
            WorkTooSmall { needed, got } => write!(f, "tokenizer scratch needs {needed} bytes, got {got}"),
            OutOfSpace { needed, capacity } => write!(f, "text is {needed} tokens, room for {capacity}"),
            BadTokenId { id, n_vocab } => write!(f, "token id {id} is outside the vocabulary of {n_vocab}"),
            BufferTooSmall { needed, got } => write!(f, "token piece is {needed} bytes, buffer holds {got}"),
            SpecialOutOfRange { key, id, n_vocab } => write!(
                f,
                "{key} = {id} is outside the vocabulary (ids 0..{n_vocab}); the file is inconsistent: set {key} to the right id (e.g. with gguf-py's gguf_set_metadata.py) or use another conversion of the model"
            ),
            NoByteToken(b) => write!(f, "vocabulary has no token for byte 0x{b:02X} (<0x{b:02X}>)"),
            TooLarge => write!(f, "vocabulary lies past 4 GiB into the file"),
        }
    }
}

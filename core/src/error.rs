//! The core's error type: every way loading or running a model can fail.

use crate::arena::{ArenaTooSmall, PlanOverflow};
use crate::ggml_type::GgmlType;
use crate::gguf::{GgufError, Name};
use core::fmt;

/// Why the core refused or stopped.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// The model file is malformed or lacks something the model needs.
    Gguf(GgufError),
    /// The tokenizer could not be built or could not encode a text.
    Tokenizer(crate::tokenizer::TokenizerError),
    /// A tensor has a type keel cannot compute with.
    UnsupportedType {
        /// The type.
        ty: GgmlType,
        /// The tensor.
        tensor: Name,
    },
    /// Evaluating `n_tokens` more tokens after `n_past` would exceed the context.
    ContextFull {
        /// Tokens already in the context.
        n_past: usize,
        /// Tokens asked to be added.
        n_tokens: usize,
        /// The context length.
        n_ctx: usize,
    },
    /// More logits rows asked for than the plan reserved.
    TooManyOutputs {
        /// Rows asked for.
        asked: usize,
        /// Rows planned.
        planned: usize,
    },
    /// A token id outside the vocabulary.
    BadToken {
        /// The id.
        id: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
    /// The arena plan overflows the address space.
    Plan(PlanOverflow),
    /// The host gave a smaller arena than planned.
    Arena(ArenaTooSmall),
    /// A run parameter is invalid.
    BadConfig(&'static str),
    /// Device `device` failed mid-request (the host holds the detailed error); nothing
    /// was computed on the CPU in its place.
    Device {
        /// Index of the device in the placement.
        device: u8,
    },
    /// A device holding whole layers (and so their KV cache) was switched off or on
    /// since this sequence started: its cache cannot move mid-sequence. Start over.
    DeviceLayersSwitched,
}

impl From<GgufError> for Error {
    fn from(e: GgufError) -> Self {
        Error::Gguf(e)
    }
}

impl From<PlanOverflow> for Error {
    fn from(e: PlanOverflow) -> Self {
        Error::Plan(e)
    }
}

impl From<ArenaTooSmall> for Error {
    fn from(e: ArenaTooSmall) -> Self {
        Error::Arena(e)
    }
}

impl From<crate::tokenizer::TokenizerError> for Error {
    fn from(e: crate::tokenizer::TokenizerError) -> Self {
        Error::Tokenizer(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Gguf(e) => write!(f, "{e}"),
            Error::Tokenizer(e) => write!(f, "{e}"),
            Error::UnsupportedType { ty, tensor } => write!(f, "tensor '{tensor}' has type {ty}, which keel cannot compute with yet; convert the model with `keel quantize` to q8_0 or q4_0"),
            Error::ContextFull { n_past, n_tokens, n_ctx } => {
                if *n_past == 0 {
                    write!(f, "the prompt has {n_tokens} tokens but the context holds {n_ctx}; raise -c or shorten the prompt")
                } else {
                    write!(f, "context full: {n_past} tokens in context + {n_tokens} new > {n_ctx}; raise -c")
                }
            }
            Error::TooManyOutputs { asked, planned } => write!(f, "{asked} logits rows asked for, the arena plan reserved {planned}"),
            Error::BadToken { id, n_vocab } => write!(f, "token id {id} is outside the vocabulary (0..{n_vocab})"),
            Error::DeviceLayersSwitched => write!(
                f,
                "a device that holds whole layers (and their KV cache) was switched off or on mid-sequence; the cache cannot move, so this sequence must start over"
            ),
            Error::Plan(e) => write!(f, "{e}"),
            Error::Arena(e) => write!(f, "{e}"),
            Error::BadConfig(why) => write!(f, "invalid configuration: {why}"),
            Error::Device { device } => write!(f, "device {device} failed mid-request; the request was stopped (no silent switch to the CPU)"),
        }
    }
}

impl core::error::Error for Error {}
impl core::error::Error for GgufError {}
impl core::error::Error for crate::tokenizer::TokenizerError {}

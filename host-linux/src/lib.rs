#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![forbid(unsafe_op_in_unsafe_fn)]

pub mod cli;
pub mod device;
pub mod fault;
pub mod fsutil;
pub mod gguf_write;
pub mod isa;
pub mod mem;
pub mod mmap;
pub mod pool;
pub mod progress;
pub mod quant_mix;
pub mod pull;
pub mod serve;

/// This crate's version (the workspace version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

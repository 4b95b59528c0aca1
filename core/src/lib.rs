#![doc = "keel-core: the `no_std` inference core of keel (no `alloc`)."]
#![no_std]
#![warn(missing_docs)]
#![forbid(unsafe_op_in_unsafe_fn)]
// The Hexagon kernel set (HVX inline asm and intrinsics, the hardware fma) needs nightly;
// every other target builds on stable.
#![cfg_attr(target_arch = "hexagon", feature(stdarch_hexagon, asm_experimental_arch, core_intrinsics), allow(internal_features))]

#[cfg(not(target_endian = "little"))]
compile_error!("keel-core reads GGUF and quant blocks as little-endian; big-endian targets are not supported");

pub mod ggml_type;
pub mod gguf;
pub mod parallel;
pub mod quant;
pub mod arena;
pub mod attention;
pub mod attn_tiled;
pub mod block;
mod block_cpu;
pub mod chat;
pub mod delta_net;
pub mod device;
pub mod engine;
pub mod error;
pub mod exec;
pub mod fused;
pub mod matmul;
pub mod model;
pub mod ops;
pub mod placement;
mod prefetch;
pub mod sampler;
pub mod session;
pub mod speculative;

pub use error::Error;
pub mod tokenizer;

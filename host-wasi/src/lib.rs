//! keel-host-wasi: keel's deterministic reference. The keel-core guest (`guest/`, built
//! for wasm32-unknown-unknown by `build.rs`) runs in a wasmtime engine with every source
//! of nondeterminism switched off ([`runtime`]); its tokens and logits digests are
//! committed and checked against wasmtime, native `keel run --reference` and the
//! aarch64 build under QEMU ([`digests`]).
#![warn(missing_docs)]

pub mod digests;
pub mod guest_build;
pub mod runtime;

pub use runtime::{Guest, Limits, Loaded, RunOutput, Stop};

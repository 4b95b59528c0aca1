//! keel: run GGUF language models on small devices.
//!
//! This root crate re-exports the keel crates so examples and integration tests can
//! name them from one place. The engine itself lives in `keel-core` (`core/`).
pub use keel_core as core;

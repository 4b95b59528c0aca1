//! keel's integration tests against llama.cpp's outputs, one test binary: each file below
//! is a module (`cargo test -p keel --test suite MODULE::`). One binary instead of one per
//! file: every test binary links the whole program again under the release profile's LTO.
//! `no_alloc` stays a binary of its own (Cargo.toml): it counts the process's allocations.

mod common;

mod gemma3_golden;
mod placement;
mod smollm2_golden;
mod synth_golden;
mod test_targets;
mod tokenizer_golden;

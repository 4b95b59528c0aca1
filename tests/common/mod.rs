//! Shared helpers for the integration tests: building an engine in a heap arena with
//! this CPU's kernels; the rest (models, golden files, greedy loops) is keel-test-support's.
#![allow(dead_code)]

use keel::core::engine::{plan, Engine};
use keel::core::gguf::Gguf;
use keel::core::quant::Kernels;
use keel::core::sampler::SamplerConfig;
use keel::core::session::SessionConfig;

#[allow(unused_imports)]
pub use keel_test_support::*;

/// The fastest kernels this CPU has (what `keel` picks).
pub fn fast_kernels() -> Kernels {
    Kernels::new(keel_host_linux::isa::detect())
}

/// An arena for `bytes` with `cfg` (the caller keeps it alive for the engine).
pub fn arena_for(bytes: &[u8], cfg: &SessionConfig) -> Vec<u8> {
    let g = Gguf::parse(bytes).expect("model parses");
    vec![0u8; plan(&g, cfg).expect("plan").total_bytes()]
}

/// Builds an engine.
pub fn engine<'a>(g: &Gguf<'a>, arena: &'a mut [u8], cfg: SessionConfig, kernels: Kernels) -> Engine<'a> {
    Engine::new(g, arena, cfg, kernels, SamplerConfig { temp: 0.0, ..Default::default() }).expect("engine")
}

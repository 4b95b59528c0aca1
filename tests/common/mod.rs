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

/// Every kernel set this CPU can run, largest first: its own, then (x86_64) the smaller
/// machines' sets it can be limited to as `KEEL_ISA` does — AVX-512 without AVX512-FP16
/// (Zen 4's), AVX2 alone — each with its `KEEL_ISA` spelling, so the golden tests check
/// every set's bits on one machine.
pub fn every_kernel_set() -> Vec<(String, Kernels)> {
    use keel_host_linux::isa;
    let cpu = isa::detect();
    let mut isas = vec![cpu];
    for list in ["avx2_fma avx512 avx512_vnni", "avx2_fma"] {
        match isa::limit(cpu, list) {
            Ok(smaller) if !isas.contains(&smaller) => isas.push(smaller),
            _ => {}
        }
    }
    isas.iter().map(|i| (isa::describe(i), Kernels::new(*i))).collect()
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

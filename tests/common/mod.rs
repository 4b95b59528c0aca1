//! Shared helpers for the integration tests: finding models, building an engine in a
//! heap arena, reading golden files.
#![allow(dead_code)]

use keel::core::engine::{plan, Engine};
use keel::core::gguf::Gguf;
use keel::core::quant::Kernels;
use keel::core::sampler::SamplerConfig;
use keel::core::session::SessionConfig;
use std::path::PathBuf;

/// The directory models are cached in.
pub fn models_dir() -> PathBuf {
    match std::env::var_os("KEEL_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/keel/models"),
    }
}

/// The bytes of a cached model, or `None` (after a loud SKIPPED line) when it is absent.
/// With `KEEL_REQUIRE_MODELS=1` (as in CI) a missing model fails the test instead.
pub fn model_bytes(file: &str, pull_name: &str) -> Option<Vec<u8>> {
    let p = models_dir().join(file);
    match std::fs::read(&p) {
        Ok(b) => Some(b),
        Err(_) if std::env::var("KEEL_REQUIRE_MODELS").as_deref() == Ok("1") => {
            panic!("model {} not found and KEEL_REQUIRE_MODELS=1; run `keel pull {pull_name}`", p.display())
        }
        Err(_) => {
            eprintln!("SKIPPED: model {} not found; run `keel pull {pull_name}`", p.display());
            None
        }
    }
}

/// SmolLM2-135M Q4_1 (the default model).
pub fn smollm2() -> Option<Vec<u8>> {
    model_bytes("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m")
}

/// Gemma 3 270M Q4_K_M.
pub fn gemma3() -> Option<Vec<u8>> {
    model_bytes("gemma-3-270m-q4_k_m.gguf", "gemma3-270m")
}

/// The file under `tests/golden/`.
pub fn golden(path: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// Golden JSON lines.
pub fn golden_lines(path: &str) -> Vec<serde_json::Value> {
    golden(path).lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).expect("golden line is JSON")).collect()
}

/// Little-endian f32 file under `tests/golden/`.
pub fn golden_f32(path: &str) -> Vec<f32> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(path);
    std::fs::read(&p).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Token ids from a JSON array value.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

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

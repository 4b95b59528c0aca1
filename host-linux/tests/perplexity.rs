//! `keel perplexity` on the GPL-3 text with -c 512 against llama.cpp 11434 (it evaluates
//! each chunk in the llama.cpp-batches mode: llama.cpp's per-token matmul kernels and its
//! tiled attention arithmetic):
//! - SmolLM2 135M Q4_1: 18.3914 and all 14 running values to the golden file's 4
//!   decimals (tests/golden/smollm2-135m-q4_1/perplexity.json);
//! - Gemma 3 270M Q4_K_M: 13.9062 and all 14 running values likewise
//!   (tests/golden/gemma3-270m-q4_k_m/perplexity.json).
//!
//! The bar was 1% of llama.cpp's figure.

use std::path::Path;
use std::process::Command;

/// Runs `keel perplexity -m <name> -c 512` on GPL-3 and checks it against `golden`
/// (skipped, unless KEEL_REQUIRE_MODELS=1, when `file` is not in the model cache).
fn perplexity_matches_llama_cpp(name: &str, file: &str, golden: &str) {
    let models = std::env::var_os("KEEL_MODELS").map(std::path::PathBuf::from).unwrap_or_else(|| Path::new(&std::env::var_os("HOME").unwrap_or_default()).join(".cache/keel/models"));
    if !models.join(file).exists() {
        assert!(std::env::var("KEEL_REQUIRE_MODELS").as_deref() != Ok("1"), "{file} missing and KEEL_REQUIRE_MODELS=1; run `keel pull {name}`");
        eprintln!("SKIPPED: {file} not found; run `keel pull {name}`");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let golden: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root.join(golden)).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["perplexity", "-m", name, "-c", "512", "-t", "2", "--json", "-f"])
        .arg(root.join("tests/golden/GPL-3.txt"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (ppl, want) = (got["ppl"].as_f64().unwrap(), golden["ppl"].as_f64().unwrap());
    eprintln!("{name}: keel ppl {ppl:.4}, llama.cpp {want:.4} ({:+.2}%), {} s", 100.0 * (ppl / want - 1.0), got["seconds"]);
    assert_eq!(got["n_chunks"], golden["n_chunks"], "chunk count differs");
    assert!((ppl / want - 1.0).abs() <= 0.01, "perplexity {ppl:.4} is not within 1% of llama.cpp's {want:.4}");
    let (run_k, run_g) = (got["per_chunk_running"].as_array().unwrap(), golden["per_chunk_running"].as_array().unwrap());
    for (i, (k, g)) in run_k.iter().zip(run_g).enumerate() {
        let (k, g) = (k.as_f64().unwrap(), g.as_f64().unwrap());
        assert!((k - g).abs() <= 5e-5, "running perplexity after chunk {}: {k:.5} vs llama.cpp's {g:.4}", i + 1);
    }
}

#[test]
fn smollm2_perplexity_matches_llama_cpp() {
    perplexity_matches_llama_cpp("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf", "tests/golden/smollm2-135m-q4_1/perplexity.json");
}

#[test]
fn gemma3_perplexity_matches_llama_cpp() {
    perplexity_matches_llama_cpp("gemma3-270m", "gemma-3-270m-q4_k_m.gguf", "tests/golden/gemma3-270m-q4_k_m/perplexity.json");
}

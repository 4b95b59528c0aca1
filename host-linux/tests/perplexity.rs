//! `keel perplexity` on the GPL-3 text with -c 512 reproduces llama.cpp's 18.3914 and all
//! 14 running values to the golden file's 4 decimals (it evaluates each chunk with
//! llama.cpp's tiled attention arithmetic); the bar was 1%
//! (tests/golden/smollm2-135m-q4_1/perplexity.json).

use std::path::Path;
use std::process::Command;

#[test]
fn smollm2_perplexity_matches_llama_cpp() {
    let models = std::env::var_os("KEEL_MODELS").map(std::path::PathBuf::from).unwrap_or_else(|| Path::new(&std::env::var_os("HOME").unwrap_or_default()).join(".cache/keel/models"));
    if !models.join("SmolLM2-135M-Instruct.Q4_1.gguf").exists() {
        assert!(std::env::var("KEEL_REQUIRE_MODELS").as_deref() != Ok("1"), "SmolLM2 missing and KEEL_REQUIRE_MODELS=1; run `keel pull smollm2-135m`");
        eprintln!("SKIPPED: SmolLM2 not found; run `keel pull smollm2-135m`");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let golden: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root.join("tests/golden/smollm2-135m-q4_1/perplexity.json")).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["perplexity", "-m", "smollm2-135m", "-c", "512", "-t", "2", "--json", "-f"])
        .arg(root.join("tests/golden/GPL-3.txt"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (ppl, want) = (got["ppl"].as_f64().unwrap(), golden["ppl"].as_f64().unwrap());
    eprintln!("keel ppl {ppl:.4}, llama.cpp {want:.4} ({:+.2}%), {} s", 100.0 * (ppl / want - 1.0), got["seconds"]);
    assert_eq!(got["n_chunks"], golden["n_chunks"], "chunk count differs");
    assert!((ppl / want - 1.0).abs() <= 0.01, "perplexity {ppl:.4} is not within 1% of llama.cpp's {want:.4}");
    let (run_k, run_g) = (got["per_chunk_running"].as_array().unwrap(), golden["per_chunk_running"].as_array().unwrap());
    for (i, (k, g)) in run_k.iter().zip(run_g).enumerate() {
        let (k, g) = (k.as_f64().unwrap(), g.as_f64().unwrap());
        assert!((k - g).abs() <= 5e-5, "running perplexity after chunk {}: {k:.5} vs llama.cpp's {g:.4}", i + 1);
    }
}

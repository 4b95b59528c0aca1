//! `--batches llama-cpp` from the command line (issue 20, acceptance 4): `keel eval` gives
//! llama.cpp's golden logits and `keel run --temp 0` its greedy tokens for Gemma 3 270M
//! (tests/golden/gemma3-270m-q4_k_m/), as `tests/gemma3_golden.rs` does through the
//! library; and the default `--batches invariant` does not (so the flag is what selects it).

use keel_test_support::{gemma3_path, golden_f32, golden_lines, ids, keel_command, leading_agreement};
use std::path::{Path, PathBuf};

const DIR: &str = "gemma3-270m-q4_k_m";

fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("batches-cli").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn keel_json(args: &[&str]) -> serde_json::Value {
    let out = keel_command(env!("CARGO_BIN_EXE_keel")).args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "keel {args:?}: {err}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("keel {args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// For each golden logits prompt: (top-1 agreement, mean over positions of the mean |Δ| at
/// llama.cpp's top-10 ids, max |Δ| of the last row against its full golden), from
/// `keel eval --batches MODE`.
fn eval_stats(model: &Path, mode: &str) -> Vec<(f64, f64, f32)> {
    let dir = scratch(mode);
    let mut res = Vec::new();
    for (i, line) in golden_lines(&format!("{DIR}/logits.jsonl")).iter().enumerate() {
        let toks = ids(&line["tokens"]);
        let tf = dir.join(format!("tokens{i}.json"));
        std::fs::write(&tf, serde_json::to_string(&toks).unwrap()).unwrap();
        let last = dir.join(format!("last{i}.f32"));
        let args = ["eval", "-m", model.to_str().unwrap(), "--tokens-file", tf.to_str().unwrap(), "--top-k", "40", "-c", "128", "-t", "2", "--batches", mode, "--dump-last", last.to_str().unwrap()];
        let v = keel_json(&args);
        assert_eq!(ids(&v["tokens"]), toks);
        let (got, want) = (v["positions"].as_array().unwrap(), line["positions"].as_array().unwrap());
        assert_eq!(got.len(), want.len());
        let (mut top1, mut d10) = (0usize, 0.0f64);
        for (g, w) in got.iter().zip(want) {
            let (g, w) = (g["top"].as_array().unwrap(), w["top"].as_array().unwrap());
            top1 += usize::from(g[0][0] == w[0][0]);
            // keel's logit at each of llama.cpp's top-10 ids (all within keel's top 40).
            let at = |id: &serde_json::Value| g.iter().find(|p| p[0] == *id).map(|p| p[1].as_f64().unwrap());
            d10 += w.iter().map(|t| at(&t[0]).map_or(f64::INFINITY, |x| (x - t[1].as_f64().unwrap()).abs())).sum::<f64>() / w.len() as f64;
        }
        let bytes = std::fs::read(&last).unwrap();
        let row: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        let gold = golden_f32(&format!("{DIR}/logits.last.{i}.f32"));
        assert_eq!(row.len(), gold.len());
        let max_d = row.iter().zip(&gold).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        eprintln!("eval --batches {mode}, prompt {i}: top-1 {:.3}, mean |d| top-10 {:.2e}, last row max |d| {max_d:.2e}", top1 as f64 / want.len() as f64, d10 / want.len() as f64);
        res.push((top1 as f64 / want.len() as f64, d10 / want.len() as f64, max_d));
    }
    std::fs::remove_dir_all(&dir).unwrap();
    res
}

#[test]
fn eval_batches_llama_cpp_gives_the_golden_logits() {
    let Some(model) = gemma3_path() else { return };
    // As the library test's guard: the printed digits of llama.cpp's top-10 logits at every
    // position, and its full last row.
    for (t1, m10, last) in eval_stats(&model, "llama-cpp") {
        assert!(t1 == 1.0 && m10 <= 1e-5 && last <= 1e-5, "top-1 {t1}, mean |d| top-10 {m10:.2e}, last row max |d| {last:.2e}");
    }
    // keel's own arithmetic (the default) differs from llama.cpp's on these batches.
    let inv = eval_stats(&model, "invariant");
    assert!(inv.iter().any(|&(_, m10, _)| m10 > 1e-3), "--batches invariant should differ from llama.cpp's numbers: {inv:?}");
}

/// (leading tokens equal to llama.cpp's greedy continuation, its length) per golden prompt,
/// from `keel run --temp 0 --batches MODE`.
fn run_agreement(model: &Path, mode: &str) -> Vec<(usize, usize)> {
    let mut res = Vec::new();
    for line in golden_lines(&format!("{DIR}/greedy.jsonl")) {
        let (prompt, mut want) = (line["prompt"].as_str().unwrap(), ids(&line["generated"]));
        let n = want.len().to_string();
        let v = keel_json(&["run", "-m", model.to_str().unwrap(), "-p", prompt, "-n", &n, "-c", "256", "-t", "2", "--temp", "0", "--batches", mode, "--json"]);
        assert_eq!(ids(&v["prompt_tokens"]), ids(&line["prompt_tokens"]), "{prompt:?}: the prompt tokenizes as llama.cpp's");
        // `run` does not print the end-of-generation token the golden ends with, if any.
        if v["stop"] == "end of generation" {
            want.pop();
        }
        let got = ids(&v["generated"]);
        let agree = leading_agreement(&got, &want);
        eprintln!("run --batches {mode} {prompt:?}: {agree}/{} leading tokens agree", want.len());
        res.push((agree, want.len()));
    }
    res
}

#[test]
fn run_batches_llama_cpp_gives_the_golden_greedy_tokens() {
    let Some(model) = gemma3_path() else { return };
    let res = run_agreement(&model, "llama-cpp");
    assert!(res.iter().all(|&(a, n)| a == n), "every token of every prompt: {res:?}");
}

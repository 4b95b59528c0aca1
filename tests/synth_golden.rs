//! The tiny synthetic models (tests/golden/synth/: llama Q4_0/Q8_0, qwen2, qwen3, qwen35,
//! gemma3 with a sliding window of 8) against llama.cpp's outputs:
//! tokenization, teacher-forced argmax at every generated step, free-running greedy up to
//! the first near-tie, per-position logits and last-position KL. Also: batched prompt
//! evaluation equals token-by-token decoding for every architecture, and the chunked
//! delta-net prompt path agrees with the token-by-token one.

use crate::common::*;
use keel::core::gguf::Gguf;
use keel::core::sampler::argmax;
use keel::core::session::{Outputs, SessionConfig};
use keel_host_linux::pool::ThreadPool;

const MODELS: [&str; 6] = ["synth-llama-q8_0", "synth-llama-q4_0", "synth-qwen2-q8_0", "synth-qwen3-q8_0", "synth-qwen35-q8_0", "synth-gemma3-q8_0"];

/// A best-vs-second gap below this is a near-tie: a correct engine may choose either.
const NEAR_TIE: f64 = 0.01;

fn model(name: &str) -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/synth/{name}.gguf"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn cfg(n_ctx: usize, n_batch: usize, n_outputs: usize) -> SessionConfig {
    SessionConfig { n_ctx, n_batch, n_outputs, n_threads: 2 }
}

/// Golden lines, read as bytes-tolerant JSON (the `text` fields can hold invalid UTF-8).

#[test]
fn tokenization_matches() {
    for name in MODELS {
        let bytes = model(name);
        let g = Gguf::parse(&bytes).unwrap();
        let c = cfg(64, 64, 1);
        let mut arena = arena_for(&bytes, &c);
        let e = engine(&g, &mut arena, c, fast_kernels());
        for line in golden_lines(&format!("synth/{name}.tokenize.jsonl")) {
            let text = line["text"].as_str().unwrap();
            let (add, parse) = (line["add_special"].as_bool().unwrap(), line["parse_special"].as_bool().unwrap());
            let want = ids(&line["tokens"]);
            let mut work = vec![0u8; keel::core::tokenizer::Tokenizer::work_bytes(text.len())];
            let mut out = vec![0u32; text.len() + 4];
            let n = e.tokenizer.tokenize(text, add, parse, &mut out, &mut work).unwrap();
            assert_eq!(&out[..n], &want[..], "{name}: {text:?}");
        }
    }
}

/// Teacher-forced over prompt + golden continuation: keel's argmax equals llama.cpp's at
/// every generated step except near-ties; free-running greedy equals the golden tokens up
/// to the first near-tie.
#[test]
fn greedy_matches_up_to_near_ties() {
    let pool = ThreadPool::new(2).unwrap();
    for name in MODELS {
        let bytes = model(name);
        let g = Gguf::parse(&bytes).unwrap();
        let c = cfg(256, 256, 256);
        let mut arena = arena_for(&bytes, &c);
        let mut e = engine(&g, &mut arena, c, fast_kernels());
        let v = e.n_vocab();
        let greedy = golden_lines(&format!("synth/{name}.greedy.jsonl"));
        let steps = golden_lines(&format!("synth/{name}.greedy_steps.jsonl"));
        let (mut checked, mut ties) = (0, 0);
        for (line, st) in greedy.iter().zip(&steps) {
            let prompt = ids(&line["prompt_tokens"]);
            let want = ids(&line["generated"]);
            let gaps: Vec<f64> = st["steps"].as_array().unwrap().iter().map(|s| s["gap"].as_f64().unwrap()).collect();
            assert_eq!(gaps.len(), want.len());
            // Teacher forcing: logits for every position of prompt + continuation.
            let mut all = prompt.clone();
            all.extend_from_slice(&want[..want.len() - 1]);
            e.reset();
            let logits = e.eval(&all, Outputs::All, &pool).unwrap().to_vec();
            for (s, &tok) in want.iter().enumerate() {
                let p = prompt.len() - 1 + s;
                let got = argmax(&logits[p * v..(p + 1) * v]);
                if gaps[s] < NEAR_TIE {
                    ties += 1;
                    continue;
                }
                checked += 1;
                assert_eq!(got, tok, "{name} prompt {:?}: teacher-forced step {s} (gap {})", line["prompt"], gaps[s]);
            }
            // Free running, up to the first near-tie.
            let first_tie = gaps.iter().position(|&g| g < NEAR_TIE).unwrap_or(want.len());
            e.reset();
            e.eval(&prompt, Outputs::Last, &pool).unwrap();
            for (s, &tok) in want.iter().enumerate().take(first_tie) {
                let t = e.sample();
                assert_eq!(t, tok, "{name} prompt {:?}: free-running step {s}", line["prompt"]);
                e.eval(&[t], Outputs::Last, &pool).unwrap();
            }
        }
        eprintln!("{name}: {checked} steps checked, {ties} near-ties skipped");
    }
}

#[test]
fn logits_meet_thresholds() {
    let pool = ThreadPool::new(2).unwrap();
    for name in MODELS {
        let bytes = model(name);
        let g = Gguf::parse(&bytes).unwrap();
        let c = cfg(128, 128, 128);
        let mut arena = arena_for(&bytes, &c);
        let mut e = engine(&g, &mut arena, c, fast_kernels());
        // The 82-token prompt is one batch of >= 64 rows, which llama.cpp evaluates with
        // its tiled attention arithmetic; follow it.
        e.session.set_llama_cpp_batches(true);
        let v = e.n_vocab();
        for (i, line) in golden_lines(&format!("synth/{name}.logits.jsonl")).iter().enumerate() {
            let toks = ids(&line["tokens"]);
            e.reset();
            let logits = e.eval(&toks, Outputs::All, &pool).unwrap().to_vec();
            let st = golden_logit_stats(&logits, v, line, &golden_f32(&format!("synth/{name}.logits.last.{i}.f32")));
            let (t1, m10, kl) = (st.top1, st.mean_top10, st.kl_last);
            eprintln!("{name} prompt {i}: top-1 {t1:.3}, mean |d| top-10 {m10:.2e}, last KL {kl:.2e}");
            assert!(t1 >= 0.98 && m10 <= 0.05 && kl <= 1e-3, "{name} prompt {i}: top-1 {t1:.3}, mean |d| top-10 {m10:.4}, KL {kl:.2e}");
        }
    }
}

/// For every architecture (attention, sliding window, delta-net state), evaluating a
/// prompt in one batch, in uneven batches, and token by token gives the same logits bits,
/// and so does a prompt whose last row alone is wanted (and the token after it).
#[test]
fn batching_does_not_change_logits() {
    let pool = ThreadPool::new(2).unwrap();
    for name in MODELS {
        let bytes = model(name);
        let g = Gguf::parse(&bytes).unwrap();
        let toks = ids(&golden_lines(&format!("synth/{name}.logits.jsonl"))[1]["tokens"]);
        let c = cfg(128, 128, 128);
        let mut arena = arena_for(&bytes, &c);
        let mut e = engine(&g, &mut arena, c, fast_kernels());
        let v = e.n_vocab();
        let batched = e.eval(&toks, Outputs::All, &pool).unwrap().to_vec();
        let last_row = &batched[(toks.len() - 1) * v..];
        // Only the last position's logits wanted: the last layer carries only that row on
        // once the keys and values are stored. The same row, and a cache that decodes the
        // next token as token-by-token evaluation leaves it.
        e.reset();
        let last = e.eval(&toks, Outputs::Last, &pool).unwrap().to_vec();
        assert!(last == last_row, "{name}: the last row evaluated alone differs from the batch's");
        let next_after_last = e.eval(&[toks[0]], Outputs::Last, &pool).unwrap().to_vec();
        e.reset();
        for (i, &t) in toks.iter().enumerate() {
            let row = e.eval(&[t], Outputs::Last, &pool).unwrap();
            assert!(row == &batched[i * v..(i + 1) * v], "{name} position {i}: token-by-token logits differ from batched");
        }
        let next = e.eval(&[toks[0]], Outputs::Last, &pool).unwrap().to_vec();
        assert!(next_after_last == next, "{name}: the token after a last-row-only prompt differs");
        // Small batches (n_batch 5) split the prompt into uneven chunks; for gemma3 this
        // also wraps the sliding-window ring (8 + 5 - 1 rows) many times. With only the
        // last row wanted, every chunk but the last gives no row at all.
        let c5 = cfg(128, 5, 128);
        let mut arena5 = arena_for(&bytes, &c5);
        let mut e5 = engine(&g, &mut arena5, c5, fast_kernels());
        let chunked = e5.eval(&toks, Outputs::All, &pool).unwrap().to_vec();
        assert!(chunked == batched, "{name}: n_batch 5 logits differ from one batch");
        e5.reset();
        let last5 = e5.eval(&toks, Outputs::Last, &pool).unwrap().to_vec();
        assert!(last5 == last_row, "{name}: n_batch 5, the last row evaluated alone differs from the batch's");
        let next5 = e5.eval(&[toks[0]], Outputs::Last, &pool).unwrap().to_vec();
        assert!(next5 == next, "{name}: n_batch 5, the token after a last-row-only prompt differs");
    }
}

/// The qwen35 delta-net layers evaluated in the chunked (matrix) form over a prompt agree
/// with token-by-token evaluation within 1e-5 relative error (per logits row), and the
/// state they leave behind decodes the next token the same way.
#[test]
fn delta_net_chunked_equals_token_by_token() {
    let pool = ThreadPool::new(2).unwrap();
    let name = "synth-qwen35-q8_0";
    let bytes = model(name);
    let g = Gguf::parse(&bytes).unwrap();
    let toks = ids(&golden_lines(&format!("synth/{name}.logits.jsonl"))[1]["tokens"]);
    let c = cfg(128, 128, 128);
    let mut arena = arena_for(&bytes, &c);
    let mut e = engine(&g, &mut arena, c, fast_kernels());
    let v = e.n_vocab();
    let mut step = Vec::new();
    for &t in &toks {
        step.extend_from_slice(e.eval(&[t], Outputs::Last, &pool).unwrap());
    }
    let next_step = e.eval(&[toks[0]], Outputs::Last, &pool).unwrap().to_vec();
    e.reset();
    e.session.set_delta_net_chunked(true);
    let chunked = e.eval(&toks, Outputs::All, &pool).unwrap().to_vec();
    let next_chunked = e.eval(&[toks[0]], Outputs::Last, &pool).unwrap().to_vec();
    let rel = |a: &[f32], b: &[f32]| {
        let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
        (num / den).sqrt()
    };
    let mut worst = 0.0f64;
    for i in 0..toks.len() {
        worst = worst.max(rel(&step[i * v..(i + 1) * v], &chunked[i * v..(i + 1) * v]));
    }
    let after = rel(&next_step, &next_chunked);
    eprintln!("worst per-row relative error {worst:.2e}; next token after the prompt {after:.2e}");
    assert!(worst <= 1e-5 && after <= 1e-5, "chunked vs token-by-token: {worst:.2e}, {after:.2e}");
    // (Measured: 0.0 here. The forms differ by ~2e-7 relative inside the layer (see the
    // core unit test), which the Q8_0 quantization of the layer's output activations
    // absorbs; a wrong stride or gate in the chunked path shows up as errors near 1.)
}

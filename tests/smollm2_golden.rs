//! SmolLM2-135M Q4_1 against llama.cpp's outputs (tests/golden/smollm2-135m-q4_1/):
//! greedy continuations, per-position logits, last-position KL, and invariance of the
//! logits to thread count and batching.

use crate::common::*;
use keel::core::gguf::Gguf;
use keel::core::session::{Outputs, SessionConfig};
use keel_host_linux::pool::ThreadPool;

const DIR: &str = "smollm2-135m-q4_1";

fn cfg(n_ctx: usize, n_outputs: usize) -> SessionConfig {
    SessionConfig { n_ctx, n_batch: 512, n_outputs, n_threads: 2 }
}

/// Greedy agreement with llama.cpp: (leading tokens that agree, per prompt).
fn greedy_agreement() -> Option<Vec<(usize, usize)>> {
    let bytes = smollm2()?;
    let g = Gguf::parse(&bytes).unwrap();
    let c = cfg(256, 1);
    let mut arena = arena_for(&bytes, &c);
    let mut e = engine(&g, &mut arena, c, fast_kernels());
    let pool = ThreadPool::new(2).unwrap();
    Some(keel_test_support::greedy_agreement(&mut e, &pool, &format!("{DIR}/greedy.jsonl"), ""))
}

/// Regression guard: keel's x86 arithmetic follows llama.cpp's operation for operation,
/// so every prompt agrees on all 64 tokens (stricter than the issue's bar below).
#[test]
fn greedy_close_to_llama_cpp() {
    let Some(res) = greedy_agreement() else { return };
    assert!(res.iter().all(|(a, n)| a == n), "{res:?}");
}

/// The issue's bar: the first 16 tokens agree on every prompt and all 64 on 4 of 6.
#[test]
fn greedy_meets_issue_thresholds() {
    let Some(res) = greedy_agreement() else { return };
    assert!(res.iter().all(|&(a, n)| a >= 16.min(n)), "{res:?}");
    assert!(res.iter().filter(|(a, n)| a == n).count() >= 4, "{res:?}");
}


fn logit_stats(kernels: keel::core::quant::Kernels) -> Option<Vec<LogitStats>> {
    let bytes = smollm2()?;
    let g = Gguf::parse(&bytes).unwrap();
    let c = cfg(256, 128);
    let mut arena = arena_for(&bytes, &c);
    let mut e = engine(&g, &mut arena, c, kernels);
    let pool = ThreadPool::new(2).unwrap();
    let v = e.n_vocab();
    let mut out = Vec::new();
    for (i, line) in golden_lines(&format!("{DIR}/logits.jsonl")).iter().enumerate() {
        let toks = ids(&line["tokens"]);
        e.reset();
        let logits = e.eval(&toks, Outputs::All, &pool).unwrap().to_vec();
        let st = golden_logit_stats(&logits, v, line, &golden_f32(&format!("{DIR}/logits.last.{i}.f32")));
        eprintln!("prompt {i}: top-1 {:.3}, mean |d| top-10 {:.4}, mean |d| lse {:.4}, last KL {:.2e}", st.top1, st.mean_top10, st.mean_lse, st.kl_last);
        out.push(st);
    }
    Some(out)
}

/// Logits against llama.cpp, with a bound that guards against regressions: keel's x86
/// arithmetic reproduces llama.cpp's bits on these prompts (measured: |d| = 0, KL = 0),
/// so the guard is far tighter than the issue's thresholds checked below.
#[test]
fn logits_close_to_llama_cpp() {
    let Some(stats) = logit_stats(fast_kernels()) else { return };
    for s in &stats {
        assert!(s.top1 >= 1.0, "top-1 agreement {:.3} regressed below 1", s.top1);
        assert!(s.mean_top10 <= 1e-4, "mean |d| top-10 {:.2e} regressed past 1e-4", s.mean_top10);
        assert!(s.mean_lse <= 1e-4, "mean |d| lse {:.2e} regressed past 1e-4", s.mean_lse);
        assert!(s.kl_last <= 1e-7, "last-position KL {:.2e} regressed past 1e-7", s.kl_last);
    }
}

#[test]
fn logits_meet_issue_thresholds() {
    let Some(stats) = logit_stats(fast_kernels()) else { return };
    for s in &stats {
        assert!(s.top1 >= 0.98 && s.mean_top10 <= 0.05 && s.mean_lse <= 0.05 && s.kl_last <= 1e-3, "top1 {:.3} top10 {:.4} lse {:.4} kl {:.2e}", s.top1, s.mean_top10, s.mean_lse, s.kl_last);
    }
}

/// Logits are bit-identical with 1 and 2 threads, and batched vs token-by-token.
#[test]
fn logits_do_not_depend_on_threads_or_batching() {
    let Some(bytes) = smollm2() else { return };
    let g = Gguf::parse(&bytes).unwrap();
    let line = &golden_lines(&format!("{DIR}/logits.jsonl"))[0];
    let toks = ids(&line["tokens"]);
    let c = cfg(64, 64);
    let mut arena = arena_for(&bytes, &c);
    let mut e = engine(&g, &mut arena, c, fast_kernels());
    let pool2 = ThreadPool::new(2).unwrap();
    keel_test_support::assert_logits_independent_of_threads_and_batching(&mut e, &pool2, &toks);
}

/// [`logits_close_to_llama_cpp`]'s guard with every kernel set this CPU can run, the
/// smaller machines' sets forced as `KEEL_ISA` does (AVX-512 without AVX512-FP16, as
/// Zen 4; AVX2 alone): the same bits, so the same goldens.
#[test]
fn every_kernel_set_gives_the_golden_logits() {
    for (isa, kernels) in every_kernel_set() {
        eprintln!("kernel set {} (KEEL_ISA={isa:?})", kernels.name());
        let Some(stats) = logit_stats(kernels) else { return };
        for s in &stats {
            assert!(s.top1 >= 1.0 && s.mean_top10 <= 1e-4 && s.mean_lse <= 1e-4 && s.kl_last <= 1e-7, "{isa}: top-1 {:.3}, top-10 {:.2e}, lse {:.2e}, KL {:.2e}", s.top1, s.mean_top10, s.mean_lse, s.kl_last);
        }
    }
}

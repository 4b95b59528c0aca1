//! The reference guest in wasmtime against the committed digests
//! (`tests/golden/reference-digests.json`): it reproduces them, the fuel limit does not
//! change them, its tokens are llama.cpp's, it imports nothing, and a guest whose
//! kernel adds in another order fails the check at the first differing position.
//!
//! SmolLM2-135M comes from the model cache (`keel pull smollm2-135m`); without it those
//! parts are skipped with a loud line, or fail with `KEEL_REQUIRE_MODELS=1` (as in CI).

use keel_host_wasi::digests::{self, DigestFile, Runner};
use keel_host_wasi::guest_build::{self, Variant};
use keel_host_wasi::runtime::{hex, Guest, Limits};
use std::path::PathBuf;

fn committed() -> DigestFile {
    DigestFile::read(&digests::default_digest_file()).unwrap()
}

#[test]
fn guest_imports_nothing() {
    let g = Guest::embedded().unwrap();
    assert!(g.imports().is_empty(), "{:?}", g.imports());
    // (module (type (func)) (import "env" "clock" (func (type 0))))
    let importing = [0, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 1, 4, 1, 0x60, 0, 0, 2, 13, 1, 3, b'e', b'n', b'v', 5, b'c', b'l', b'o', b'c', b'k', 0, 0];
    let err = Guest::from_wasm(&importing).err().expect("a guest with imports is refused").to_string();
    assert!(err.contains("imports env::clock"), "{err}");
}

#[test]
fn committed_digests_match_in_wasmtime() {
    let f = committed();
    let mut runner = Runner::Wasm(Guest::embedded().unwrap(), Limits::default());
    let t0 = std::time::Instant::now();
    match digests::check(&f, &mut runner, usize::MAX, None) {
        Ok(t) => eprintln!("wasm: {} runs, {} + {} tokens in {:.1} s (total {:.1} s)", t.runs, t.prompt_tokens, t.generated, t.run_secs, t0.elapsed().as_secs_f64()),
        Err(e) => panic!("{e:#}"),
    }
}

/// The committed SmolLM2 runs are llama.cpp's greedy tokens (the committed file is
/// reproduced by the guest, checked above).
#[test]
fn reference_tokens_equal_llama_cpp_golden() {
    let f = committed();
    let m = f.models.iter().find(|m| m.name == "smollm2-135m").expect("smollm2 entries");
    let golden = std::fs::read_to_string(digests::repo_root().join("tests/golden/smollm2-135m-q4_1/greedy.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = golden.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 6);
    assert_eq!(m.runs.len(), lines.len());
    let ids = |v: &serde_json::Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<_>>();
    for ((prompt, o), line) in m.runs.iter().zip(&lines) {
        assert_eq!(prompt, line["prompt"].as_str().unwrap());
        assert_eq!(o.tokens, ids(&line["prompt_tokens"]), "{prompt:?}");
        assert_eq!(o.generated.len(), f.n_predict as usize, "{prompt:?}");
        assert_eq!(o.generated[..], ids(&line["generated"])[..f.n_predict as usize], "{prompt:?}");
    }
}

/// Two runs with different fuel limits, both large enough, give the same digest and use
/// the same fuel; a limit below that stops with an error, not a partial result.
#[test]
fn fuel_limit_does_not_change_the_digest() {
    let f = committed();
    let guest = Guest::embedded().unwrap();
    for m in &f.models {
        if !m.path().is_file() {
            if m.location == "repo" || std::env::var("KEEL_REQUIRE_MODELS").as_deref() == Ok("1") {
                panic!("model {} not found", m.path().display());
            }
            eprintln!("SKIPPED: model {} not found; run `keel pull {}`", m.path().display(), m.name);
            continue;
        }
        let (prompt, want) = &m.runs[0];
        let a = guest.load(&m.path(), f.n_ctx, Limits::default()).unwrap().run(prompt, f.n_predict).unwrap();
        // A fresh instance with just enough fuel.
        let tight = Limits { fuel: a.fuel_used + 1, ..Limits::default() };
        let b = guest.load(&m.path(), f.n_ctx, tight).unwrap().run(prompt, f.n_predict).unwrap();
        assert_eq!(hex(&a.logits_sha256), want.logits_sha256, "{}", m.name);
        assert_eq!(a.logits_sha256, b.logits_sha256, "{}", m.name);
        assert_eq!(a.generated, b.generated);
        assert_eq!(a.fuel_used, b.fuel_used, "fuel use is deterministic");
        let half = Limits { fuel: a.fuel_used / 2, ..Limits::default() };
        let err = guest.load(&m.path(), f.n_ctx, half).unwrap().run(prompt, f.n_predict).expect_err("half the fuel is not enough").to_string();
        assert!(err.contains("ran out of fuel"), "{err}");
        eprintln!("{}: fuel {} for prompt 0", m.name, a.fuel_used);
    }
}

/// A guest whose reference kernel adds one horizontal sum in another order (keel-core
/// built with `--cfg keel_perturb_for_test`) fails the check, and the message names the
/// prompt and the first differing position.
#[test]
fn perturbed_kernel_fails_the_check_at_the_first_differing_position() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let cargo = PathBuf::from(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("keel-guest-perturbed");
    let wasm = guest_build::build(&cargo, &manifest.join("guest"), &target, Variant::Perturbed).unwrap();
    let bytes = std::fs::read(&wasm).unwrap();
    assert_ne!(bytes, keel_host_wasi::runtime::GUEST_WASM, "the perturbed guest is a different module");
    let f = committed();
    // SmolLM2 (Q4_1 and Q8_0 dots, f16 attention: every one sums through the perturbed
    // `hsum8`). The tiny synthetic model's logits happen not to change, so it is not used.
    let m = f.models.iter().find(|m| m.name == "smollm2-135m").unwrap();
    if !m.path().is_file() {
        assert_ne!(std::env::var("KEEL_REQUIRE_MODELS").as_deref(), Ok("1"), "model {} not found", m.path().display());
        eprintln!("SKIPPED: model {} not found; run `keel pull {}`", m.path().display(), m.name);
        return;
    }
    let mut runner = Runner::Wasm(Guest::from_wasm(&bytes).unwrap(), Limits::default());
    let err = digests::check(&f, &mut runner, 1, Some("smollm2-135m")).expect_err("the perturbed kernel must fail the check");
    let msg = format!("{err:#}");
    eprintln!("{msg}");
    let first = &m.runs[0].0;
    assert!(msg.contains(&format!("smollm2-135m prompt 0 {first:?}: first difference at step 0 (the logits of token position 4)")), "{msg}");
}

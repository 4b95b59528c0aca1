//! `keel quantize` on SmolLM2-135M Q4_1, against what llama.cpp's `llama-quantize
//! --allow-requantize` wrote from the same file (tests/golden/smollm2-135m-requant/):
//! every tensor's name, type and data sha256; metadata kept; the files parse and run;
//! failures leave no output; greedy tokens on the new files against llama.cpp's.
//!
//! The model is read from the cache (`$KEEL_MODELS`, default ~/.cache/keel/models). When
//! it is missing the tests print SKIPPED and pass, unless `KEEL_REQUIRE_MODELS=1`.

use keel_core::engine::{plan, Engine};
use keel_core::gguf::{Gguf, Value};
use keel_core::sampler::SamplerConfig;
use keel_core::session::SessionConfig;
use keel_host_linux::pool::ThreadPool;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn keel() -> Command {
    Command::new(env!("CARGO_BIN_EXE_keel"))
}

fn golden(file: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/smollm2-135m-requant").join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// The source model, or `None` (after a loud SKIPPED line) when it is not cached.
fn model() -> Option<PathBuf> {
    let dir = match std::env::var_os("KEEL_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/keel/models"),
    };
    let p = dir.join(MODEL);
    if p.is_file() {
        return Some(p);
    }
    if std::env::var("KEEL_REQUIRE_MODELS").as_deref() == Ok("1") {
        panic!("model {} not found and KEEL_REQUIRE_MODELS=1; run `keel pull smollm2-135m`", p.display());
    }
    eprintln!("SKIPPED: model {} not found; run `keel pull smollm2-135m`", p.display());
    None
}

/// A fresh, empty directory for one test.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("keel-quantize-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ok(out: &Output) {
    assert!(out.status.success(), "keel failed: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
}

/// The mixes llama.cpp's golden files were made with (tests/golden/smollm2-135m-requant/).
const MIXES: [&str; 4] = ["Q8_0", "Q4_0", "IQ4_NL", "Q4_K_M"];

/// The SmolLM2 file re-quantized to `ty` (one of [`MIXES`]) by `keel quantize` (made once
/// per test run).
fn requantized(ty: &'static str) -> Option<PathBuf> {
    static CELLS: [OnceLock<Option<PathBuf>>; 4] = [OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let cell = &CELLS[MIXES.iter().position(|m| *m == ty).expect("a golden mix")];
    cell.get_or_init(|| {
        let src = model()?;
        // Under the target directory, replaced on every run.
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-quantize-out");
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join(format!("smollm2.{ty}.gguf"));
        ok(&keel().arg("quantize").arg(&src).arg(&out).arg(ty).args(["--allow-requantize", "-t", "2"]).output().unwrap());
        Some(out)
    })
    .clone()
}

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

/// (matching tensors, tensors in the golden file) for `ty`.
fn digest_matches(ty: &'static str) -> Option<(usize, usize)> {
    let path = requantized(ty)?;
    let bytes = std::fs::read(&path).unwrap();
    let g = Gguf::parse(&bytes).expect("keel's parser reads the written file");
    let all: serde_json::Value = serde_json::from_str(&golden("tensor-digests.json")).unwrap();
    let want = all[ty].as_object().expect("golden has the type");
    assert_eq!(g.n_tensors(), want.len(), "tensor count");
    let mut matching = 0;
    for t in g.tensors() {
        let name = t.name_str().to_string();
        let w = want.get(&name).unwrap_or_else(|| panic!("{name} is not in llama.cpp's {ty} file"));
        let (ty_ok, sha_ok) = (t.ty.name().eq_ignore_ascii_case(w["type"].as_str().unwrap()), sha256_hex(t.data) == w["sha256"].as_str().unwrap());
        if ty_ok && sha_ok {
            matching += 1;
        } else {
            eprintln!("{ty}: {name}: type {} (llama.cpp {}), data {}", t.ty, w["type"], if sha_ok { "equal" } else { "differs" });
        }
    }
    eprintln!("{ty}: {matching}/{} tensors byte-identical to llama.cpp's", want.len());
    Some((matching, want.len()))
}

#[test]
fn q8_0_tensors_equal_llama_cpp_digests() {
    let Some((m, n)) = digest_matches("Q8_0") else { return };
    assert_eq!(m, n);
}

#[test]
fn q4_0_tensors_equal_llama_cpp_digests() {
    let Some((m, n)) = digest_matches("Q4_0") else { return };
    assert_eq!(m, n);
}

/// IQ4_NL (`quantize_iq4_nl` without an imatrix) plus its Q5_K ffn_down layers and the
/// Q8_0 embedding.
#[test]
fn iq4_nl_tensors_equal_llama_cpp_digests() {
    let Some((m, n)) = digest_matches("IQ4_NL") else { return };
    assert_eq!(m, n);
}

/// Q4_K_M: Q4_K and Q6_K where the 1536-wide ffn_down rows allow 256-blocks, and the
/// fallbacks Q5_0 (for Q4_K) and Q8_0 (for Q6_K) on the 576-wide rows.
#[test]
fn q4_k_m_tensors_equal_llama_cpp_digests() {
    let Some((m, n)) = digest_matches("Q4_K_M") else { return };
    assert_eq!(m, n);
}

#[test]
fn metadata_is_kept_except_the_file_type() {
    let Some(src) = model() else { return };
    for (ty, ftype) in [("Q8_0", 7u32), ("Q4_0", 2), ("IQ4_NL", 25), ("Q4_K_M", 15)] {
        let out = requantized(ty).unwrap();
        let (a, b) = (std::fs::read(&src).unwrap(), std::fs::read(&out).unwrap());
        let (ga, gb) = (Gguf::parse(&a).unwrap(), Gguf::parse(&b).unwrap());
        assert_eq!(ga.n_keys(), gb.n_keys(), "{ty}: key count");
        for i in 0..ga.n_keys() {
            let ((ka, va), (kb, vb)) = (ga.key_at(i).unwrap(), gb.key_at(i).unwrap());
            assert_eq!(ka, kb, "{ty}: key {i} (order is kept)");
            if ka == b"general.file_type" {
                assert_eq!(vb, Value::U32(ftype), "{ty}: general.file_type");
            } else {
                assert_eq!(va, vb, "{ty}: {}", String::from_utf8_lossy(ka));
            }
        }
        assert_eq!(gb.get("general.quantization_version"), Some(Value::U32(2)));
        assert_eq!(ga.alignment(), gb.alignment());
    }
}

#[test]
fn keel_runs_the_requantized_files() {
    for ty in MIXES {
        let Some(out) = requantized(ty) else { return };
        let r = keel().args(["run", "-p", "The capital of France is", "-n", "8", "-t", "2", "-c", "64", "--temp", "0", "--json", "-m"]).arg(&out).output().unwrap();
        ok(&r);
        let j: serde_json::Value = serde_json::from_slice(&r.stdout).expect("one JSON object on stdout");
        let n = j["generated"].as_array().map_or(0, |a| a.len());
        assert!(n == 8 || (n > 0 && j["stop"] == "end of generation"), "{ty}: {j}");
        let info = keel().arg("info").arg(&out).output().unwrap();
        ok(&info);
    }
}

#[test]
fn output_does_not_depend_on_thread_count() {
    let Some(src) = model() else { return };
    let Some(q4) = requantized("Q4_0") else { return };
    let dir = scratch("threads");
    let one = dir.join("one.gguf");
    ok(&keel().arg("quantize").arg(&src).arg(&one).args(["q4_0", "--allow-requantize", "-t", "1"]).output().unwrap());
    assert!(std::fs::read(&one).unwrap() == std::fs::read(&q4).unwrap(), "-t 1 and -t 2 files differ");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `keel quantize` expecting failure: exit code 1, an `error:` line containing
/// `needle`, and nothing left in `dir` but `keep`.
fn fails_cleanly(args: &[&std::ffi::OsStr], dir: &Path, keep: &[&str], needle: &str, limit_file_size: Option<u64>) {
    let mut cmd = keel();
    cmd.arg("quantize").args(args);
    if let Some(limit) = limit_file_size {
        use std::os::unix::process::CommandExt;
        // SAFETY: between fork and exec only async-signal-safe calls (setrlimit, signal).
        unsafe {
            cmd.pre_exec(move || {
                let rl = libc::rlimit { rlim_cur: limit, rlim_max: limit };
                libc::setrlimit(libc::RLIMIT_FSIZE, &rl);
                // Writes past the limit then fail with EFBIG instead of killing the process.
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                Ok(())
            });
        }
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("error:") && err.contains(needle), "stderr lacks {needle:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let mut left: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    left.sort();
    assert_eq!(left, keep, "{err}");
}

#[test]
fn failures_leave_no_output_file() {
    let Some(src) = model() else { return };
    let dir = scratch("fail");
    let out = dir.join("out.gguf");
    let (s, o) = (src.as_os_str(), out.as_os_str());
    // Re-quantizing without permission, and an unknown type: refused before writing.
    fails_cleanly(&[s, o, "Q8_0".as_ref()], &dir, &[], "--allow-requantize", None);
    fails_cleanly(&[s, o, "Q3_K".as_ref(), "--allow-requantize".as_ref()], &dir, &[], "supported: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1", None);
    // A truncated input.
    let cut = dir.join("cut.gguf");
    let bytes = std::fs::read(&src).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    fails_cleanly(&[cut.as_os_str(), o, "Q8_0".as_ref(), "--allow-requantize".as_ref()], &dir, &["cut.gguf"], "cut.gguf", None);
    std::fs::remove_file(&cut).unwrap();
    // An output directory that cannot be written (it is a file).
    let not_dir = dir.join("not-a-dir");
    std::fs::write(&not_dir, b"x").unwrap();
    let inside = not_dir.join("out.gguf");
    fails_cleanly(&[s, inside.as_os_str(), "Q8_0".as_ref(), "--allow-requantize".as_ref()], &dir, &["not-a-dir"], "cannot create the output file", None);
    std::fs::remove_file(&not_dir).unwrap();
    // The disk "fills up" mid-write (a 20 MB file size limit): the partial file is removed.
    fails_cleanly(&[s, o, "Q8_0".as_ref(), "--allow-requantize".as_ref()], &dir, &[], "writing", Some(20 << 20));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Greedy continuations on a requantized file: (leading tokens equal to llama.cpp's,
/// golden length) per prompt.
fn greedy_agreement(ty: &'static str) -> Option<Vec<(usize, usize)>> {
    let path = requantized(ty)?;
    let bytes = std::fs::read(&path).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    let cfg = SessionConfig { n_ctx: 128, n_batch: 128, n_outputs: 1, n_threads: 2 };
    let mut arena = vec![0u8; plan(&g, &cfg).expect("plan").total_bytes()];
    let kernels = keel_host_linux::cli::load::kernels(false);
    let mut e = Engine::new(&g, &mut arena, cfg, kernels, SamplerConfig { temp: 0.0, ..Default::default() }).expect("engine");
    // llama.cpp evaluates prompts with batch-dependent kernels (repacked GEMM groups of 4,
    // the tiled K-quant matmul for 8+ tokens); follow it.
    e.session.set_llama_cpp_batches(true);
    let pool = ThreadPool::new(2).unwrap();
    Some(keel_test_support::greedy_agreement(&mut e, &pool, &format!("smollm2-135m-requant/{ty}.greedy.jsonl"), &format!("{ty} ")))
}

/// The bar for the requantized files: the first 16 greedy tokens equal
/// llama.cpp's on every prompt (evaluated in the llama.cpp-batches mode). Met for Q8_0
/// (all tokens agree on every prompt).
#[test]
fn greedy_on_q8_0_file_matches_llama_cpp() {
    let Some(res) = greedy_agreement("Q8_0") else { return };
    assert!(res.iter().all(|&(a, n)| a >= 16.min(n)), "Q8_0: {res:?}");
}

/// The same bar for Q4_0 (tensor bytes equal llama.cpp's; its Q4_0 dots follow the
/// repacked q4_0_8x8 order): all 32 tokens agree on all 6 prompts (measured).
#[test]
fn greedy_on_q4_0_file_matches_llama_cpp() {
    let Some(res) = greedy_agreement("Q4_0") else { return };
    assert!(res.iter().all(|&(a, n)| a >= 16.min(n)), "Q4_0: {res:?}");
}

/// The same bar for the IQ4_NL file (its three Q5_K ffn_down layers go through
/// llama.cpp's tiled matmul for prompts of 8+ tokens, which the llama.cpp-batches mode
/// follows): all 32 tokens agree on all 6 prompts (measured).
#[test]
fn greedy_on_iq4_nl_file_matches_llama_cpp() {
    let Some(res) = greedy_agreement("IQ4_NL") else { return };
    assert!(res.iter().all(|&(a, n)| a >= 16.min(n)), "IQ4_NL: {res:?}");
}

/// The same bar for the Q4_K_M file (166 of its 210 matrices are Q5_0): every generated
/// token agrees on all 6 prompts (12/12, then 32/32 ×5, measured).
#[test]
fn greedy_on_q4_k_m_file_matches_llama_cpp() {
    let Some(res) = greedy_agreement("Q4_K_M") else { return };
    assert!(res.iter().all(|&(a, n)| a >= 16.min(n)), "Q4_K_M: {res:?}");
}

/// The type rules alone, for all four files llama.cpp wrote: every tensor gets
/// llama.cpp's type (independently of the quantizers, so a rule bug and a rounding bug
/// show up as different failures).
#[test]
fn mix_rules_choose_llama_cpps_types() {
    use keel_host_linux::quant_mix::{choose_types, Mix, ModelFacts, TensorShape};
    let Some(src) = model() else { return };
    let bytes = std::fs::read(&src).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    let facts = ModelFacts::from_gguf(&g).unwrap();
    let shapes: Vec<TensorShape> = g.tensors().map(|t| TensorShape { name: t.name_str().to_string(), ne: t.ne, ty: t.ty }).collect();
    let all: serde_json::Value = serde_json::from_str(&golden("tensor-digests.json")).unwrap();
    for ty in ["Q8_0", "Q4_0", "IQ4_NL", "Q4_K_M"] {
        let choices = choose_types(Mix::parse(ty).unwrap(), &facts, &shapes).unwrap();
        for (s, c) in shapes.iter().zip(&choices) {
            let want = all[ty][&s.name]["type"].as_str().unwrap_or_else(|| panic!("{ty}: {} missing from golden", s.name));
            assert!(c.target.name().eq_ignore_ascii_case(want), "{ty}: {}: keel chose {}, llama.cpp {want}", s.name, c.target);
        }
    }
}

//! What keel's tests share, written once: finding cached models ([`models_dir`],
//! [`model_bytes`]) and golden files ([`golden`], [`golden_lines`], [`golden_f32`],
//! [`greedy_prompts`]), greedy loops ([`greedy`], with speculation [`speculative`]), comparisons of logits
//! ([`top_two`], [`golden_logit_stats`]) and seeded random inputs ([`Rng`], [`activations`]).
//! Paths are the repository's: `tests/golden/` at its root, whichever crate's test asks.

use std::path::PathBuf;

use keel_core::engine::Engine;
use keel_core::ops::log_sum_exp;
use keel_core::parallel::Parallel;
use keel_core::session::Outputs;
use keel_core::speculative::{Drafter, Lm, Speculator};

/// The repository's root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The directory models are cached in (`KEEL_MODELS`, else `~/.cache/keel/models`).
pub fn models_dir() -> PathBuf {
    match std::env::var_os("KEEL_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/keel/models"),
    }
}

/// The path of a cached model, or `None` (after a loud SKIPPED line) when it is absent.
/// With `KEEL_REQUIRE_MODELS=1` (as in CI) a missing model fails the test instead.
pub fn model_path(file: &str, pull_name: &str) -> Option<PathBuf> {
    let p = models_dir().join(file);
    match p.is_file() {
        true => Some(p),
        false if std::env::var("KEEL_REQUIRE_MODELS").as_deref() == Ok("1") => {
            panic!("model {} not found and KEEL_REQUIRE_MODELS=1; run `keel pull {pull_name}`", p.display())
        }
        false => {
            eprintln!("SKIPPED: model {} not found; run `keel pull {pull_name}`", p.display());
            None
        }
    }
}

/// The bytes of a cached model ([`model_path`]'s rules when it is absent).
pub fn model_bytes(file: &str, pull_name: &str) -> Option<Vec<u8>> {
    let p = model_path(file, pull_name)?;
    Some(std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display())))
}

/// SmolLM2-135M Q4_1 (the default model).
pub fn smollm2() -> Option<Vec<u8>> {
    model_bytes(SMOLLM2_FILE, "smollm2-135m")
}

/// The path of SmolLM2-135M Q4_1 (see [`model_path`]).
pub fn smollm2_path() -> Option<PathBuf> {
    model_path(SMOLLM2_FILE, "smollm2-135m")
}

const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Gemma 3 270M Q4_K_M.
pub fn gemma3() -> Option<Vec<u8>> {
    model_bytes(GEMMA3_FILE, "gemma3-270m")
}

/// The file name of Gemma 3 270M Q4_K_M in the models directory.
pub const GEMMA3_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// The path of Gemma 3 270M Q4_K_M (for tests that run the `keel` binary on it).
pub fn gemma3_path() -> Option<PathBuf> {
    model_path(GEMMA3_FILE, "gemma3-270m")
}

/// The path of `path` under `tests/golden/`.
pub fn golden_path(path: &str) -> PathBuf {
    repo_root().join("tests/golden").join(path)
}

/// The file under `tests/golden/`, read lossily (a golden's generated `text` may hold
/// bytes that are not UTF-8; token ids and numbers are ASCII).
pub fn golden(path: &str) -> String {
    let p = golden_path(path);
    let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Golden JSON lines.
pub fn golden_lines(path: &str) -> Vec<serde_json::Value> {
    golden(path).lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).expect("golden line is JSON")).collect()
}

/// Little-endian f32 file under `tests/golden/`.
pub fn golden_f32(path: &str) -> Vec<f32> {
    let p = golden_path(path);
    std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display())).chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Token ids from a JSON array value.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// The prompts of a greedy golden file (`…greedy.jsonl` under `tests/golden/`) with the
/// tokens llama.cpp generated for each.
pub fn greedy_prompts(path: &str) -> Vec<(Vec<u32>, Vec<u32>)> {
    golden_lines(path).iter().map(|l| (ids(&l["prompt_tokens"]), ids(&l["generated"]))).collect()
}

/// Greedy (the engine's sampler) continuation of `prompt`, up to `n` tokens, the first
/// end-of-generation token (included) or the end of the context (the token chosen from
/// its last position included), from a fresh sequence.
pub fn greedy(e: &mut Engine<'_>, par: &dyn Parallel, prompt: &[u32], n: usize) -> Vec<u32> {
    e.reset();
    e.eval(prompt, Outputs::Last, par).expect("prompt evaluates");
    let mut got = Vec::new();
    for _ in 0..n {
        let t = e.sample();
        got.push(t);
        if e.tokenizer.is_eog(t) || e.session.n_past() >= e.session.n_ctx() {
            break;
        }
        e.eval(&[t], Outputs::Last, par).expect("token evaluates");
    }
    got
}

/// [`greedy`]'s loop with speculative decoding: up to `n` tokens, the first token for
/// which `is_eog` holds (included) or the end of the target's context.
pub fn speculative(sp: &mut Speculator<'_>, target: &mut dyn Lm, drafter: &mut dyn Drafter, prompt: &[u32], n: usize, is_eog: impl Fn(u32) -> bool) -> Vec<u32> {
    sp.start(target, drafter, prompt).expect("speculation starts");
    let mut got = Vec::new();
    while got.len() < n && sp.can_step(target) {
        for &t in sp.step(target, drafter).expect("speculative step") {
            if got.len() == n {
                break;
            }
            got.push(t);
            if is_eog(t) {
                return got;
            }
        }
    }
    got
}

/// Asserts that `toks`' logits are bit-identical evaluated batched on `two` (a pool of
/// two threads) and on one thread, with only the last row wanted, and token by token on
/// `two` (the engine is reset before each evaluation).
pub fn assert_logits_independent_of_threads_and_batching(e: &mut Engine<'_>, two: &dyn Parallel, toks: &[u32]) {
    let v = e.n_vocab();
    e.reset();
    let batched = e.eval(toks, Outputs::All, two).unwrap().to_vec();
    e.reset();
    let one = e.eval(toks, Outputs::All, &keel_core::parallel::Sequential).unwrap().to_vec();
    assert!(one == batched, "logits differ between 1 and 2 threads");
    e.reset();
    let last = e.eval(toks, Outputs::Last, two).unwrap().to_vec();
    assert!(last == batched[(toks.len() - 1) * v..], "the last row evaluated alone differs from the batch's");
    e.reset();
    for (i, &t) in toks.iter().enumerate() {
        let row = e.eval(&[t], Outputs::Last, two).unwrap();
        assert!(row == &batched[i * v..(i + 1) * v], "position {i}: token-by-token logits differ from the batched ones");
    }
}

/// Greedy agreement with a greedy golden file (`path` under `tests/golden/`): for each
/// prompt, (leading generated tokens equal to the golden's, the golden's length), each
/// printed with the prompt (and `tag`).
pub fn greedy_agreement(e: &mut Engine<'_>, par: &dyn Parallel, path: &str, tag: &str) -> Vec<(usize, usize)> {
    let mut res = Vec::new();
    for line in golden_lines(path) {
        let (prompt, want) = (ids(&line["prompt_tokens"]), ids(&line["generated"]));
        let got = greedy(e, par, &prompt, want.len());
        let agree = leading_agreement(&got, &want);
        eprintln!("{tag}{:?}: {agree}/{} leading tokens agree", line["prompt"].as_str().unwrap_or(""), want.len());
        res.push((agree, want.len()));
    }
    res
}

/// How many leading tokens of `got` equal `want`'s.
pub fn leading_agreement(got: &[u32], want: &[u32]) -> usize {
    got.iter().zip(want).take_while(|(a, b)| a == b).count()
}

/// The largest value's index and its gap to the second largest.
pub fn top_two(row: &[f32]) -> (usize, f32) {
    let (mut b, mut bv, mut sv) = (0usize, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &v) in row.iter().enumerate() {
        if v > bv {
            sv = bv;
            bv = v;
            b = i;
        } else if v > sv {
            sv = v;
        }
    }
    (b, bv - sv)
}

/// One prompt's logits against a golden logits line (`positions[p].top`: llama.cpp's
/// top-10 `[id, logit]` per position) and its last row's full golden (`last`).
#[derive(Clone, Copy, Debug)]
pub struct LogitStats {
    /// Positions where keel's argmax is llama.cpp's.
    pub top1: f64,
    /// Mean over positions of the mean |Δ| over llama.cpp's top-10 ids.
    pub mean_top10: f64,
    /// Mean over positions of |Δ log-sum-exp| (when the golden gives `lse`, else 0).
    pub mean_lse: f64,
    /// KL(golden ‖ keel) over the full last row.
    pub kl_last: f64,
    /// Positions compared.
    pub positions: usize,
}

/// Compares `logits` (`positions × n_vocab` rows, row `p` for golden position `p`) with a
/// golden logits line and the golden last row.
pub fn golden_logit_stats(logits: &[f32], n_vocab: usize, line: &serde_json::Value, last_golden: &[f32]) -> LogitStats {
    let pos = line["positions"].as_array().expect("positions");
    let (mut top1, mut d10, mut dlse) = (0usize, 0.0f64, 0.0f64);
    for (p, gp) in pos.iter().enumerate() {
        let row = &logits[p * n_vocab..(p + 1) * n_vocab];
        let top = gp["top"].as_array().expect("top");
        if keel_core::sampler::argmax(row) == top[0][0].as_u64().expect("id") as u32 {
            top1 += 1;
        }
        d10 += top.iter().map(|t| (row[t[0].as_u64().expect("id") as usize] as f64 - t[1].as_f64().expect("logit")).abs()).sum::<f64>() / top.len() as f64;
        if let Some(lse) = gp["lse"].as_f64() {
            dlse += (log_sum_exp(row) - lse).abs();
        }
    }
    let n = pos.len();
    let last = &logits[(n - 1) * n_vocab..n * n_vocab];
    let (lg, lk) = (log_sum_exp(last_golden), log_sum_exp(last));
    let kl: f64 = last_golden
        .iter()
        .zip(last)
        .map(|(&a, &b)| {
            let lp = a as f64 - lg;
            lp.exp() * (lp - (b as f64 - lk))
        })
        .sum();
    LogitStats { top1: top1 as f64 / n as f64, mean_top10: d10 / n as f64, mean_lse: dlse / n as f64, kl_last: kl, positions: n }
}

/// `keel quantize --allow-requantize src OUT ty` with the `keel` binary `keel`, into
/// `out_dir`, once per process (later calls reuse the file): e.g. a Q8_0 copy of a model
/// whose F32 matrices a device holds converted, so that the CPU computes with the same
/// weights.
pub fn requantized(keel: &std::path::Path, src: &std::path::Path, ty: &str, out_dir: &std::path::Path) -> PathBuf {
    static QUANTIZING: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let mut done = QUANTIZING.lock().unwrap_or_else(|e| e.into_inner());
    std::fs::create_dir_all(out_dir).unwrap_or_else(|e| panic!("creating {}: {e}", out_dir.display()));
    let out = out_dir.join(format!("{}.{ty}.gguf", src.file_stem().expect("a file name").to_string_lossy()));
    if !done.contains(&out) {
        let st = std::process::Command::new(keel).arg("quantize").arg(src).arg(&out).args([ty, "--allow-requantize", "-t", "1"]).output().expect("keel runs");
        assert!(st.status.success(), "keel quantize {}: {}", src.display(), String::from_utf8_lossy(&st.stderr));
        done.push(out.clone());
    }
    out
}

/// The `keel` binary under test: `built` (a test's `env!("CARGO_BIN_EXE_keel")`), or
/// `KEEL_TEST_BIN=/path/to/keel` to run another build (e.g. the code before a fix, to see
/// a test fail there).
pub fn keel_command(built: &str) -> std::process::Command {
    match std::env::var_os("KEEL_TEST_BIN") {
        Some(b) => std::process::Command::new(b),
        None => std::process::Command::new(built),
    }
}

/// The prompt of [`check_in_flight_bits`] and [`check_pipelined_bits`] (24 tokens of the
/// synthetic llama).
pub const IN_FLIGHT_PROMPT: &str = "The quick brown fox jumps over the lazy dog and then runs far away into the forest where nobody finds it";

/// `keel run --json` of `model` with [`IN_FLIGHT_PROMPT`], 8 greedy tokens, and `extra`
/// flags; `env` is set. Fails the test when keel fails.
pub fn keel_run_json(keel: &str, model: &std::path::Path, extra: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> serde_json::Value {
    let mut cmd = keel_command(keel);
    cmd.arg("run").arg("-m").arg(model);
    cmd.args(["-p", IN_FLIGHT_PROMPT, "-n", "8", "--temp", "0", "--json"]);
    cmd.args(extra);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("keel runs");
    assert!(out.status.success(), "keel run {extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// `keel run --json` of the synthetic llama `model` (a 24-token prompt, 8 greedy tokens)
/// with `--device device`, at 1 MiB of batch work (prompt chunks of a few tokens, several
/// batches per pass) and 1 then 2 batches in flight, and on the CPU; `env` is set for each.
/// Checks that the runs with 2 in flight give the tokens, logits digests and batches of
/// the one-at-a-time run, and those the CPU's bits; returns (1 in flight, 2 in flight).
pub fn check_in_flight_bits(keel: &str, model: &std::path::Path, device: &str, env: &[(&str, &std::ffi::OsStr)]) -> (serde_json::Value, serde_json::Value) {
    let run = |extra: &[&str]| keel_run_json(keel, model, extra, env);
    let one = run(&["--device", device, "--device-batch-work", "1", "--device-in-flight", "1"]);
    let two = run(&["--device", device, "--device-batch-work", "1", "--device-in-flight", "2"]);
    let cpu = run(&[]);
    assert_eq!((one["device_in_flight"].as_u64(), two["device_in_flight"].as_u64()), (Some(1), Some(2)), "the depth asked for is reported");
    assert!(one["device_batches_per_token"].as_f64().unwrap() >= 2.0, "several batches per token: {}", one["device_batches_per_token"]);
    assert!(one["device_batches"].as_u64().unwrap() > 8 * 2 + 4, "the prompt in several chunks: {} batches", one["device_batches"]);
    assert_eq!(one["device_batches"], two["device_batches"], "the same batches");
    for key in ["generated", "logits_sha256", "row_sha256"] {
        assert_eq!(one[key], two[key], "{key}: 2 batches in flight differ from 1");
        assert_eq!(one[key], cpu[key], "{key}: the device differs from the CPU");
    }
    (one, two)
}

/// Prompt chunks as a pipeline: `keel run --json` of the synthetic llama `model` placed
/// by `placement` (flags whose first stage is whole layers on a device, with later stages
/// elsewhere) with `-b 4` (the 24-token prompt in 6 chunks) and `extra`, at 1 then 2
/// batches in flight; and on the CPU with `-b 4` and `extra` when `vs_cpu`. Checks that
/// one in flight pipelines nothing, two pipeline chunks 2..=6 (`device_pipelined`), and
/// that the tokens, logits digests and batches agree bit for bit; returns (1, 2 in flight).
pub fn check_pipelined_bits(keel: &str, model: &std::path::Path, placement: &[&str], extra: &[&str], vs_cpu: bool, env: &[(&str, &std::ffi::OsStr)]) -> (serde_json::Value, serde_json::Value) {
    let run = |depth: Option<&str>| {
        let mut args: Vec<&str> = vec!["-b", "4"];
        if let Some(d) = depth {
            args.extend(placement);
            args.extend(["--device-in-flight", d]);
        }
        args.extend(extra);
        keel_run_json(keel, model, &args, env)
    };
    let (one, two) = (run(Some("1")), run(Some("2")));
    assert_eq!((one["device_pipelined"].as_u64(), two["device_pipelined"].as_u64()), (Some(0), Some(5)), "{placement:?}: passes pipelined with 1 and 2 in flight");
    assert_eq!(one["device_batches"], two["device_batches"], "{placement:?}: the same batches");
    let cpu = vs_cpu.then(|| run(None));
    for key in ["generated", "logits_sha256", "row_sha256"] {
        assert_eq!(one[key], two[key], "{placement:?} {extra:?}: {key}: pipelined differs from one in flight");
        if let Some(cpu) = &cpu {
            assert_eq!(one[key], cpu[key], "{placement:?} {extra:?}: {key}: the devices differ from the CPU");
        }
    }
    (one, two)
}

/// Writes `dst`: the model `src` with the metadata `set` (replacing keys of the same name,
/// appending the others) and, if given, one more F32 vector tensor appended, by keel's own
/// GGUF writer: the generator of the hostile and variant models tests need (never
/// committed binaries).
#[cfg(feature = "gguf")]
pub fn model_variant(src: &std::path::Path, dst: &std::path::Path, set: &[(&str, keel_core::gguf::Value<'_>)], tensor: Option<(&str, &[f32])>) {
    use keel_host_linux::gguf_write::{encode_kv, GgufWriter, TensorDecl};
    let bytes = std::fs::read(src).unwrap_or_else(|e| panic!("reading {}: {e}", src.display()));
    let g = keel_core::gguf::Gguf::parse(&bytes).expect("the source model parses");
    let (mut kv, mut n_kv) = (Vec::new(), 0u64);
    for i in 0..g.n_keys() {
        let (k, v) = g.key_at(i).expect("a key");
        match set.iter().find(|(name, _)| name.as_bytes() == k) {
            Some((_, new)) => encode_kv(&mut kv, k, new),
            None => encode_kv(&mut kv, k, &v),
        }
        n_kv += 1;
    }
    for (name, v) in set {
        if g.get(name).is_none() {
            encode_kv(&mut kv, name.as_bytes(), v);
            n_kv += 1;
        }
    }
    let infos: Vec<_> = g.tensors().collect();
    let mut decls: Vec<TensorDecl> = infos.iter().map(|t| TensorDecl { name: t.name.to_vec(), ne: t.ne, n_dims: t.n_dims, ty: t.ty }).collect();
    if let Some((name, v)) = tensor {
        decls.push(TensorDecl { name: name.as_bytes().to_vec(), ne: [v.len() as u64, 1, 1, 1], n_dims: 1, ty: keel_core::ggml_type::GgmlType::F32 });
    }
    let mut w = GgufWriter::create(dst, &kv, n_kv, &decls, g.alignment()).expect("the variant is created");
    for t in &infos {
        w.write_data(t.data).expect("tensor data written");
        w.end_tensor().expect("tensor ended");
    }
    if let Some((_, v)) = tensor {
        let data: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        w.write_data(&data).expect("tensor data written");
        w.end_tensor().expect("tensor ended");
    }
    w.finish().expect("the variant is finished");
}

/// xorshift64*: small, seeded, reproducible.
pub struct Rng(pub u64);

impl Rng {
    /// Next 32 random bits.
    pub fn u32(&mut self) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.u32() >> 8) as f32 / (1u32 << 23) as f32 - 1.0
    }
    /// `n` values uniform in [-scale, scale).
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
}

/// `n` activations that exercise a product's rounding: random, with a zero block (the
/// second), integer ramps (rounding ties) and spikes.
pub fn activations(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|i| match (i / 32) % 5 {
            1 if i / 32 == 1 => 0.0,
            2 => ((i % 32) as f32 - 16.0) * 0.25,
            3 if i % 7 == 0 => rng.f32() * 300.0,
            _ => rng.f32() * 3.0,
        })
        .collect()
}

//! The committed reference digests (`tests/golden/reference-digests.json`): what a run
//! must reproduce, how to recompute it (in wasmtime, or with a `keel` binary, optionally
//! under an emulator), and how a difference is reported: the prompt and the first step
//! (and token position) whose logits row differs.
//!
//! Digest definition (the same in the guest and in `keel run --reference --json`): one
//! logits row per greedy choice, in order (the last prompt position's row, then the row
//! after each generated token, including the row that chose end-of-generation if
//! generation stopped there). A row is its `n_vocab` f32 logits as IEEE-754 binary32
//! little-endian bytes in token-id order. `row_sha256[i]` is the SHA-256 of row `i`;
//! `logits_sha256` is the SHA-256 of all rows concatenated in order.

use crate::runtime::{hex, Guest, Limits, RunOutput};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// The repository root (this crate lives in `<root>/host-wasi`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host-wasi has a parent").to_path_buf()
}

/// The committed digest file.
pub fn default_digest_file() -> PathBuf {
    repo_root().join("tests/golden/reference-digests.json")
}

/// The directory downloaded models are cached in (`$KEEL_MODELS`, default
/// `~/.cache/keel/models`), as for `keel pull`.
pub fn models_dir() -> PathBuf {
    match std::env::var_os("KEEL_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/keel/models"),
    }
}

/// Generation settings shared by every entry.
pub const N_PREDICT: u32 = 32;
/// Context length of every run (`keel run`'s default).
pub const N_CTX: u32 = 2048;

/// The outcome of one run, as compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// Prompt token ids.
    pub tokens: Vec<u32>,
    /// Generated token ids.
    pub generated: Vec<u32>,
    /// Hex SHA-256 of all rows.
    pub logits_sha256: String,
    /// Hex SHA-256 per row.
    pub row_sha256: Vec<String>,
}

impl From<&RunOutput> for Observed {
    fn from(r: &RunOutput) -> Self {
        Observed { tokens: r.tokens.clone(), generated: r.generated.clone(), logits_sha256: hex(&r.logits_sha256), row_sha256: r.row_sha256.iter().map(|d| hex(d)).collect() }
    }
}

impl Observed {
    /// Reads the fields from a `keel-wasi run --json` or `keel run --reference --json`
    /// object (or a digest-file entry).
    pub fn from_json(v: &Value) -> Result<Observed> {
        let ids = |k: &str| -> Result<Vec<u32>> {
            v[k].as_array().ok_or_else(|| anyhow!("no `{k}` array"))?.iter().map(|x| x.as_u64().map(|x| x as u32).ok_or_else(|| anyhow!("`{k}` holds a non-integer"))).collect()
        };
        let rows = v["row_sha256"].as_array().ok_or_else(|| anyhow!("no `row_sha256` array"))?;
        Ok(Observed {
            tokens: ids("tokens")?,
            generated: ids("generated")?,
            logits_sha256: v["logits_sha256"].as_str().ok_or_else(|| anyhow!("no `logits_sha256`"))?.to_string(),
            row_sha256: rows.iter().map(|r| r.as_str().map(str::to_string).ok_or_else(|| anyhow!("`row_sha256` holds a non-string"))).collect::<Result<_>>()?,
        })
    }

    /// The fields as JSON.
    pub fn to_json(&self) -> Value {
        json!({ "tokens": self.tokens, "generated": self.generated, "logits_sha256": self.logits_sha256, "row_sha256": self.row_sha256 })
    }
}

/// Where the first difference between `want` and `got` is, in words; `None` if they
/// are the same.
pub fn first_difference(want: &Observed, got: &Observed) -> Option<String> {
    if want.tokens != got.tokens {
        let i = want.tokens.iter().zip(&got.tokens).take_while(|(a, b)| a == b).count();
        return Some(format!(
            "the prompt tokenizes differently: first difference at prompt token {i} (expected {}, got {})",
            at(&want.tokens, i),
            at(&got.tokens, i)
        ));
    }
    let n_prompt = want.tokens.len();
    let steps = want.row_sha256.len().max(got.row_sha256.len());
    for s in 0..steps {
        let (w, g) = (want.row_sha256.get(s), got.row_sha256.get(s));
        let (wt, gt) = (want.generated.get(s), got.generated.get(s));
        if w == g && wt == gt {
            continue;
        }
        let pos = n_prompt - 1 + s;
        let tok = match (wt, gt) {
            (Some(a), Some(b)) if a == b => format!("same token {a} chosen"),
            (a, b) => format!("expected token {}, got {}", opt(a), opt(b)),
        };
        let row = match (w, g) {
            (Some(a), Some(b)) if a == b => "same logits row".to_string(),
            (Some(a), Some(b)) => format!("logits row sha256 {} != {}", &a[..16], &b[..16]),
            (a, b) => format!("expected {} rows, got {} (one is missing here: {}, {})", want.row_sha256.len(), got.row_sha256.len(), a.map_or("none", |_| "present"), b.map_or("none", |_| "present")),
        };
        return Some(format!("first difference at step {s} (the logits of token position {pos}): {row}; {tok}"));
    }
    if want.generated != got.generated {
        return Some(format!("same rows but generated tokens differ: expected {:?}, got {:?}", want.generated, got.generated));
    }
    if want.logits_sha256 != got.logits_sha256 {
        return Some(format!("same rows but logits_sha256 differs: {} != {}", want.logits_sha256, got.logits_sha256));
    }
    None
}

fn at(v: &[u32], i: usize) -> String {
    v.get(i).map_or("end of prompt".into(), |t| t.to_string())
}

fn opt(t: Option<&u32>) -> String {
    t.map_or("none (generation stopped)".into(), |t| t.to_string())
}

/// One model's entries.
#[derive(Clone, Debug)]
pub struct ModelDigests {
    /// Short name (`smollm2-135m`, `synth-llama-q8_0`).
    pub name: String,
    /// The file name.
    pub file: String,
    /// `"models"`: in [`models_dir`] (fetched with `keel pull NAME`); `"repo"`: a path
    /// relative to the repository root.
    pub location: String,
    /// (prompt, expected outcome), in order.
    pub runs: Vec<(String, Observed)>,
}

impl ModelDigests {
    /// The model file's path on this machine.
    pub fn path(&self) -> PathBuf {
        match self.location.as_str() {
            "repo" => repo_root().join(&self.file),
            _ => models_dir().join(&self.file),
        }
    }
}

/// The digest file.
#[derive(Clone, Debug)]
pub struct DigestFile {
    /// Tokens generated per prompt.
    pub n_predict: u32,
    /// Context length.
    pub n_ctx: u32,
    /// Per model.
    pub models: Vec<ModelDigests>,
}

const DEFINITION: &str = "One logits row per greedy choice, in order: the last prompt position's row, then the row after each generated token (and the row that chose end-of-generation, if any). A row is n_vocab f32 logits as IEEE-754 binary32 little-endian bytes in token-id order. row_sha256[i] = SHA-256(row i); logits_sha256 = SHA-256(all rows concatenated). Produced by `keel-wasi digests --write` (the wasm32 guest with Kernels::reference() in wasmtime); prompts are tokenized with BOS/EOS as the model says and special tokens parsed; greedy (lowest id wins ties).";

impl DigestFile {
    /// Reads a digest file.
    pub fn read(path: &Path) -> Result<DigestFile> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let v: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let num = |k: &str| v[k].as_u64().map(|x| x as u32).ok_or_else(|| anyhow!("{}: no `{k}`", path.display()));
        let mut models = Vec::new();
        for m in v["models"].as_array().ok_or_else(|| anyhow!("{}: no `models`", path.display()))? {
            let s = |k: &str| m[k].as_str().map(str::to_string).ok_or_else(|| anyhow!("{}: a model has no `{k}`", path.display()));
            let mut runs = Vec::new();
            for r in m["runs"].as_array().ok_or_else(|| anyhow!("{}: no `runs`", path.display()))? {
                let prompt = r["prompt"].as_str().ok_or_else(|| anyhow!("{}: a run has no `prompt`", path.display()))?.to_string();
                runs.push((prompt, Observed::from_json(r).with_context(|| format!("{}", path.display()))?));
            }
            models.push(ModelDigests { name: s("name")?, file: s("file")?, location: s("location")?, runs });
        }
        Ok(DigestFile { n_predict: num("n_predict")?, n_ctx: num("n_ctx")?, models })
    }

    /// The file's JSON text: one line per scalar field or id list, one per row digest.
    pub fn to_json_text(&self) -> String {
        let j = |v: Value| v.to_string();
        let mut o = String::from("{\n");
        o += &format!("  \"definition\": {},\n", j(json!(DEFINITION)));
        o += &format!("  \"n_predict\": {},\n  \"n_ctx\": {},\n  \"models\": [\n", self.n_predict, self.n_ctx);
        for (mi, m) in self.models.iter().enumerate() {
            o += &format!("    {{\n      \"name\": {},\n      \"file\": {},\n      \"location\": {},\n      \"runs\": [\n", j(json!(m.name)), j(json!(m.file)), j(json!(m.location)));
            for (ri, (prompt, r)) in m.runs.iter().enumerate() {
                o += &format!("        {{\n          \"prompt\": {},\n", j(json!(prompt)));
                o += &format!("          \"tokens\": {},\n          \"generated\": {},\n", j(json!(r.tokens)), j(json!(r.generated)));
                o += &format!("          \"logits_sha256\": {},\n          \"row_sha256\": [\n", j(json!(r.logits_sha256)));
                let rows: Vec<String> = r.row_sha256.iter().map(|d| format!("            {}", j(json!(d)))).collect();
                o += &rows.join(",\n");
                o += &format!("\n          ]\n        }}{}\n", if ri + 1 < m.runs.len() { "," } else { "" });
            }
            o += &format!("      ]\n    }}{}\n", if mi + 1 < self.models.len() { "," } else { "" });
        }
        o + "  ]\n}\n"
    }
}

/// The prompts and models the committed file covers: the 6 SmolLM2 golden prompts
/// (`tests/golden/smollm2-135m-q4_1/greedy.jsonl`) on SmolLM2-135M Q4_1 and on the
/// synthetic llama Q8_0 model; the outcomes are left empty.
pub fn standard_set() -> Result<Vec<ModelDigests>> {
    let golden = repo_root().join("tests/golden/smollm2-135m-q4_1/greedy.jsonl");
    let text = std::fs::read_to_string(&golden).with_context(|| format!("reading {}", golden.display()))?;
    let blank = Observed { tokens: vec![], generated: vec![], logits_sha256: String::new(), row_sha256: vec![] };
    let mut runs = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).with_context(|| format!("parsing {}", golden.display()))?;
        let prompt = v["prompt"].as_str().ok_or_else(|| anyhow!("{}: a line has no prompt", golden.display()))?;
        runs.push((prompt.to_string(), blank.clone()));
    }
    let model = |name: &str, file: &str, location: &str| ModelDigests { name: name.into(), file: file.into(), location: location.into(), runs: runs.clone() };
    Ok(vec![model("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf", "models"), model("synth-llama-q8_0", "tests/golden/synth/synth-llama-q8_0.gguf", "repo")])
}

/// How a check recomputes the runs.
pub enum Runner {
    /// The guest in wasmtime.
    Wasm(Guest, Limits),
    /// `keel run --reference --json` of a `keel` binary, run through `wrap` (say
    /// `qemu-aarch64 -cpu max`) if not empty.
    Keel {
        /// The binary.
        keel: PathBuf,
        /// Emulator command and arguments put before it.
        wrap: Vec<String>,
        /// Extra arguments for `keel run` (say `-t 1`).
        args: Vec<String>,
    },
}

/// Time spent and tokens evaluated by a check, for the speed report.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timing {
    /// Runs done.
    pub runs: usize,
    /// Prompt tokens evaluated.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub generated: usize,
    /// Seconds inside the runs (wasm: the guest calls; keel: the process, start to end).
    pub run_secs: f64,
    /// Seconds of evaluation as the runner reports it (keel: prompt + generation time
    /// from its JSON; wasm: the same as `run_secs`).
    pub eval_secs: f64,
}

/// Models whose file is missing, after a loud line; with `KEEL_REQUIRE_MODELS=1` an
/// error instead.
fn present(m: &ModelDigests) -> Result<bool> {
    if m.path().is_file() {
        return Ok(true);
    }
    if std::env::var("KEEL_REQUIRE_MODELS").as_deref() == Ok("1") {
        bail!("model {} not found and KEEL_REQUIRE_MODELS=1; run `keel pull {}`", m.path().display(), m.name);
    }
    eprintln!("SKIPPED: model {} not found; run `keel pull {}`", m.path().display(), m.name);
    Ok(false)
}

/// Recomputes the runs of `file` (the first `max_prompts` of each model, those of
/// `only_model` if given) with `runner`, calling `each` with every result. Returns
/// the timing.
pub fn recompute(file: &DigestFile, runner: &mut Runner, max_prompts: usize, only_model: Option<&str>, mut each: impl FnMut(&ModelDigests, usize, &Observed) -> Result<()>) -> Result<Timing> {
    let mut t = Timing::default();
    for m in &file.models {
        if only_model.is_some_and(|n| n != m.name) || !present(m)? {
            continue;
        }
        match runner {
            Runner::Wasm(guest, limits) => {
                let n = m.runs.len().min(max_prompts);
                for (i, r) in run_in_guests(guest, *limits, m, file, n)?.into_iter().enumerate() {
                    let (r, secs) = r?;
                    t.runs += 1;
                    t.prompt_tokens += r.tokens.len();
                    t.generated += r.generated.len();
                    t.run_secs += secs;
                    t.eval_secs += secs;
                    each(m, i, &Observed::from(&r))?;
                }
            }
            Runner::Keel { keel, wrap, args } => {
                for (i, (prompt, _)) in m.runs.iter().enumerate().take(max_prompts) {
                    let mut cmd = match wrap.split_first() {
                        Some((w, rest)) => {
                            let mut c = Command::new(w);
                            c.args(rest).arg(keel.as_os_str());
                            c
                        }
                        None => Command::new(&*keel),
                    };
                    cmd.arg("run").args(args.iter()).args(["--reference", "--json", "--temp", "0", "-n"]).arg(file.n_predict.to_string()).arg("-c").arg(file.n_ctx.to_string()).arg("-m").arg(m.path()).arg("-p").arg(prompt);
                    let t0 = Instant::now();
                    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
                    let secs = t0.elapsed().as_secs_f64();
                    if !out.status.success() {
                        bail!("{} prompt {i} {prompt:?}: {cmd:?} failed: {}", m.name, String::from_utf8_lossy(&out.stderr));
                    }
                    let v: Value = serde_json::from_slice(&out.stdout).with_context(|| format!("{} prompt {i}: parsing the output of {cmd:?}", m.name))?;
                    let o = Observed::from_json(&v).with_context(|| format!("{} prompt {i}: the output of {cmd:?}", m.name))?;
                    let tps = |k: &str| v[k].as_f64().filter(|x| *x > 0.0);
                    let eval = match (tps("prompt_tps"), tps("gen_tps")) {
                        (Some(p), Some(g)) => o.tokens.len() as f64 / p + o.generated.len() as f64 / g,
                        _ => secs,
                    };
                    t.runs += 1;
                    t.prompt_tokens += o.tokens.len();
                    t.generated += o.generated.len();
                    t.run_secs += secs;
                    t.eval_secs += eval;
                    each(m, i, &o)?;
                }
            }
        }
    }
    Ok(t)
}

/// The first `n` runs of `m`, each with its seconds, in order: one guest instance per
/// CPU (each run starts from a reset guest, so which instance runs which prompt changes
/// nothing; the wasm guest is single-threaded, and one instance alone left the other
/// cores idle), the prompts taken in turn from a shared counter.
fn run_in_guests(guest: &Guest, limits: Limits, m: &ModelDigests, file: &DigestFile, n: usize) -> Result<Vec<Result<(RunOutput, f64)>>> {
    let workers = std::thread::available_parallelism().map_or(1, |c| c.get()).min(n).max(1);
    let next = AtomicUsize::new(0);
    let mut out: Vec<Option<Result<(RunOutput, f64)>>> = (0..n).map(|_| None).collect();
    let done: Vec<Vec<(usize, Result<(RunOutput, f64)>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| -> Result<Vec<(usize, Result<(RunOutput, f64)>)>> {
                    let mut g = guest.load(&m.path(), file.n_ctx, limits)?;
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((prompt, _)) = m.runs.get(i).filter(|_| i < n) else { break };
                        let t0 = Instant::now();
                        let r = g.run(prompt, file.n_predict).with_context(|| format!("{} prompt {i} {prompt:?}", m.name));
                        let failed = r.is_err();
                        mine.push((i, r.map(|r| (r, t0.elapsed().as_secs_f64()))));
                        if failed {
                            // An instance is not trusted after a failed run; the first
                            // failure in order is the one reported.
                            break;
                        }
                    }
                    Ok(mine)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a guest thread panicked")))).collect::<Result<Vec<_>>>()
    })?;
    for (i, r) in done.into_iter().flatten() {
        out[i] = Some(r);
    }
    Ok(out.into_iter().enumerate().map(|(i, r)| r.unwrap_or_else(|| Err(anyhow!("{} prompt {i}: not run", m.name)))).collect())
}

/// Checks every run against `file`; the error lists each differing run with its first
/// difference.
pub fn check(file: &DigestFile, runner: &mut Runner, max_prompts: usize, only_model: Option<&str>) -> Result<Timing> {
    let mut failures = Vec::new();
    let t = recompute(file, runner, max_prompts, only_model, |m, i, got| {
        let (prompt, want) = &m.runs[i];
        if let Some(d) = first_difference(want, got) {
            failures.push(format!("{} prompt {i} {prompt:?}: {d}", m.name));
        }
        Ok(())
    })?;
    if t.runs == 0 {
        bail!("no run was checked (no model present?)");
    }
    if !failures.is_empty() {
        bail!("{} of {} runs differ from the reference digests:\n  {}", failures.len(), t.runs, failures.join("\n  "));
    }
    Ok(t)
}

/// Computes a digest file for the [`standard_set`] with the guest.
pub fn generate(guest: Guest, limits: Limits) -> Result<DigestFile> {
    let skeleton = DigestFile { n_predict: N_PREDICT, n_ctx: N_CTX, models: standard_set()? };
    for m in &skeleton.models {
        if !m.path().is_file() {
            bail!("model {} not found; run `keel pull {}`", m.path().display(), m.name);
        }
    }
    let mut out = skeleton.clone();
    recompute(&skeleton, &mut Runner::Wasm(guest, limits), usize::MAX, None, |m, i, got| {
        let dst = out.models.iter_mut().find(|x| x.name == m.name).expect("same models");
        dst.runs[i].1 = got.clone();
        Ok(())
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(gen: &[u32], rows: &[&str]) -> Observed {
        Observed { tokens: vec![1, 2, 3], generated: gen.to_vec(), logits_sha256: rows.concat(), row_sha256: rows.iter().map(|r| r.repeat(16)).collect() }
    }

    #[test]
    fn committed_file_reads_back_to_the_same_text() {
        let p = default_digest_file();
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(DigestFile::read(&p).unwrap().to_json_text(), text, "{} is not in the layout `keel-wasi digests` writes", p.display());
    }

    #[test]
    fn same_runs_have_no_difference() {
        let a = obs(&[5, 6], &["a", "b"]);
        assert_eq!(first_difference(&a, &a.clone()), None);
    }

    #[test]
    fn first_differing_row_is_named_with_its_position() {
        let want = obs(&[5, 6, 7], &["a", "b", "c"]);
        let got = obs(&[5, 6, 8], &["a", "d", "e"]);
        let d = first_difference(&want, &got).unwrap();
        assert!(d.starts_with("first difference at step 1 (the logits of token position 3)"), "{d}");
        assert!(d.contains("same token 6 chosen"), "{d}");
    }

    #[test]
    fn early_stop_is_a_difference() {
        let want = obs(&[5, 6], &["a", "b"]);
        let got = obs(&[5], &["a", "b"]);
        let d = first_difference(&want, &got).unwrap();
        assert!(d.contains("step 1") && d.contains("expected token 6, got none"), "{d}");
    }

    #[test]
    fn prompt_tokenization_difference_is_named() {
        let want = obs(&[5], &["a"]);
        let mut got = want.clone();
        got.tokens[2] = 9;
        assert!(first_difference(&want, &got).unwrap().contains("prompt token 2 (expected 3, got 9)"));
    }
}

//! Speculative decoding for `keel run` and `keel serve`: the flags (`--draft-model`, `--draft-max`,
//! `--draft-fixed`, `--device-draft`, `--lookup`), the generation loop over keel-core's
//! [`Speculator`], and the statistics it reports.

use super::common::{prompt_text, tokenize};
use super::load::{engine, open_for_cpu, prepare_with, Loaded, RunOptions};
use keel_core::gguf::Gguf;
use std::path::Path;
use super::offload::OffloadOptions;
use serde::Serialize;
use anyhow::{bail, Result};
use keel_core::engine::Engine;
use keel_core::sampler::SamplerConfig;
use keel_core::session::Outputs;
use keel_core::speculative::{Drafter, Lm, Lookup, ModelDrafter, Runner, SpecConfig, Speculator, Stats};
use std::time::Instant;

/// Most tokens drafted per step that `--draft-max` / `--lookup` take.
pub const MAX_DRAFT: usize = 64;

/// The speculation flags of `keel run` and `keel serve`.
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "Speculative decoding (greedy output unchanged; when sampling, the target's distribution; drafted and accepted tokens are reported)")]
pub struct SpecFlags {
    /// Draft with MODEL, a smaller model of the same vocabulary; the target verifies its drafts in one batch (llama.cpp's -md is read as --draft-model)
    #[arg(long = "draft-model", visible_alias = "model-draft", value_name = "MODEL")]
    pub draft_model: Option<String>,
    /// Most tokens the draft model drafts per step (1..=64; default 8); needs --draft-model
    #[arg(long = "draft-max", visible_alias = "draft", value_name = "N")]
    pub draft_max: Option<usize>,
    /// Prompt lookup: draft up to N tokens (1..=64) by matching the context's last tokens earlier in the context (no draft model)
    #[arg(long = "lookup", value_name = "N")]
    pub lookup: Option<usize>,
    /// Always draft the most tokens (turns the adaptive draft length off)
    #[arg(long = "draft-fixed")]
    pub draft_fixed: bool,
    /// Devices for the draft model, e.g. hexagon-sim (as --device; default cpu; `keel run` only: keel serve runs on the CPU); llama.cpp's -devd is read as --device-draft
    #[arg(long = "device-draft", value_name = "LIST")]
    pub device_draft: Option<String>,
}

/// The checked speculation flags.
pub struct SpecOptions {
    /// `--draft-model`: the draft model (`None`: prompt lookup).
    pub draft_model: Option<String>,
    /// Most tokens drafted per step.
    pub n_max: usize,
    /// `--draft-fixed`: always draft `n_max` tokens (no adaptive length).
    pub fixed: bool,
    /// `--device-draft`: where the draft model runs.
    pub draft_devices: OffloadOptions,
}

impl SpecOptions {
    /// Checks the flags; `None` when neither `--draft-model` nor `--lookup` is given.
    pub fn from_flags(f: &SpecFlags) -> Result<Option<SpecOptions>> {
        let (draft_model, draft_max, lookup, fixed, list) = (f.draft_model.clone(), f.draft_max, f.lookup, f.draft_fixed, f.device_draft.as_deref());
        let n_max = match (&draft_model, lookup) {
            (Some(_), Some(_)) => bail!("--draft-model and --lookup are two ways of drafting; give one"),
            (Some(_), None) => draft_max.unwrap_or(8),
            (None, Some(n)) => {
                if draft_max.is_some() {
                    bail!("--draft-max is for --draft-model; with --lookup the value of --lookup is the most tokens drafted");
                }
                n
            }
            (None, None) => {
                for (given, flag) in [(draft_max.is_some(), "--draft-max"), (fixed, "--draft-fixed"), (list.is_some(), "--device-draft")] {
                    if given {
                        bail!("{flag} needs --draft-model M (or --lookup N)");
                    }
                }
                return Ok(None);
            }
        };
        if n_max == 0 || n_max > MAX_DRAFT {
            bail!("{} {n_max}: draft 1..={MAX_DRAFT} tokens per step", if draft_model.is_some() { "--draft-max" } else { "--lookup" });
        }
        if list.is_some() && draft_model.is_none() {
            bail!("--device-draft places the draft model; give --draft-model M");
        }
        // The device list as --device parses it; the draft model is placed whole (no --offload-* policy).
        let devices = crate::device::offload::parse_device_list(list.unwrap_or("cpu")).map_err(|e| anyhow::anyhow!("--device-draft: {e}"))?;
        let policy = keel_core::placement::Policy::all(devices.len());
        Ok(Some(SpecOptions { draft_model, n_max, fixed, draft_devices: OffloadOptions { devices, policy, rknpu: Default::default(), in_flight: None, batch_work: None } }))
    }

    /// The core's settings, and (for the adaptive length with a draft model) the
    /// [`Calibration`] for [`generate`]. Only the adaptive length uses costs, so `measure`
    /// (the [`measure_costs`] timings, a fraction of a second) runs only for it.
    pub fn config(&self, measure: impl FnOnce() -> Result<Costs>) -> Result<(SpecConfig, Option<Calibration>)> {
        let (cfg, costs) = configure(self.n_max, self.fixed, measure)?;
        Ok((cfg, costs.filter(|_| self.draft_model.is_some()).map(|c| Calibration::new(&c))))
    }

    /// `draft <file>` or `lookup`.
    pub fn name(&self) -> String {
        match &self.draft_model {
            Some(m) => format!("draft model {m}"),
            None => "prompt lookup".into(),
        }
    }
}

/// The core's settings for `n_max` drafts per step: fixed (`fixed`), or adaptive with
/// the costs `measure` takes (returned too: a draft model's [`Calibration`] starts from
/// them).
pub fn configure(n_max: usize, fixed: bool, measure: impl FnOnce() -> Result<Costs>) -> Result<(SpecConfig, Option<Costs>)> {
    if fixed {
        return Ok((SpecConfig { n_max, adaptive: false, ..SpecConfig::default() }, None));
    }
    let costs = measure()?;
    Ok((costs.config(n_max, true), Some(costs)))
}

/// The adaptive length's draft cost learnt from the steps themselves. A draft model's
/// cost measured at start (one pass each, from an empty context) can be far from what a
/// step costs once the two models alternate (their weights evicting each other from the
/// cache, the draft's catch-up batches): on the Xeon of BENCHMARKS.md a measured 0.49
/// became ~1.5 passes, and drafting ran at 0.72x. So every step is timed: plain steps
/// (no drafts) give the time of one target pass, drafting steps their cost in passes, and
/// what a drafted token cost beyond the verify batch's share replaces the draft cost
/// (averaged over steps).
pub struct Calibration {
    /// Seconds of a plain step (a moving average; at first the measured one-token pass).
    plain: f64,
    /// The verify batch's costs (measured at start).
    verify_base: f64,
    verify: f64,
    /// The learnt draft cost (`None` until a drafting step was timed).
    draft: Option<f64>,
}

impl Calibration {
    /// Starts from the costs measured at start.
    pub fn new(c: &Costs) -> Self {
        Calibration { plain: c.one_secs, verify_base: c.verify_base as f64, verify: c.verify as f64, draft: None }
    }

    /// A step of `secs` that verified `k` drafts: the draft cost to plan with next, if
    /// it changed.
    fn observe(&mut self, secs: f64, k: u64) -> Option<f32> {
        if !(secs.is_finite() && secs > 0.0) {
            return None;
        }
        if k == 0 {
            self.plain = 0.8 * self.plain + 0.2 * secs;
            return None;
        }
        let passes = secs / self.plain.max(1e-9);
        let per_draft = ((passes - 1.0 - self.verify_base) / k as f64 - self.verify).max(0.0);
        let d = match self.draft {
            Some(d) => 0.5 * d + 0.5 * per_draft,
            None => per_draft,
        };
        self.draft = Some(d);
        Some(d as f32)
    }
}

/// Generates up to `n_predict` tokens after [`Speculator::start`]; `emit` gets each one
/// and returns false to stop (end of generation). With a [`Calibration`], each step is
/// timed and the draft cost follows what steps really cost. Returns why generation
/// stopped.
pub fn generate(sp: &mut Speculator<'_>, target: &mut dyn Lm, drafter: &mut dyn Drafter, n_predict: usize, mut calib: Option<Calibration>, mut emit: impl FnMut(u32) -> bool) -> Result<&'static str, keel_core::Error> {
    let mut n = 0;
    while n < n_predict {
        if !sp.can_step(target) {
            return Ok("context full");
        }
        let (t, drafted) = (Instant::now(), sp.stats().drafted);
        let made = sp.step(target, drafter)?.len();
        if let Some(cost) = calib.as_mut().and_then(|c| c.observe(t.elapsed().as_secs_f64(), sp.stats().drafted - drafted)) {
            sp.set_draft_cost(cost);
        }
        let hist = sp.history();
        for &t in &hist[hist.len() - made..] {
            if n == n_predict {
                break;
            }
            if !emit(t) {
                return Ok("end of generation");
            }
            n += 1;
        }
    }
    Ok("length")
}

/// The `"speculative"` object of `keel run --json`.
#[derive(Serialize, Debug)]
pub struct SpecJson {
    drafter: String,
    steps: u64,
    drafted: u64,
    accepted: u64,
    acceptance_rate: f64,
    mean_accepted_length: f64,
    tokens_per_second: f64,
    /// Batches the draft model's device ran (0: the draft ran on the CPU, or lookup).
    draft_device_batches: u64,
}

/// The statistics: one line on stderr, or (`json`) the `--json` object; `draft_batches`
/// are the draft model's device batches (`--device-draft`).
pub fn report(stats: &Stats, what: &str, tps: f64, draft_batches: u64, json: bool) -> Option<SpecJson> {
    if json {
        return Some(SpecJson {
            drafter: what.to_string(),
            steps: stats.steps,
            drafted: stats.drafted,
            accepted: stats.accepted,
            acceptance_rate: stats.acceptance(),
            mean_accepted_length: stats.mean_accepted(),
            tokens_per_second: tps,
            draft_device_batches: draft_batches,
        });
    }
    let on_device = if draft_batches > 0 { format!(", the draft in {draft_batches} device batches") } else { String::new() };
    eprintln!(
        "keel: speculative ({what}): drafted {}, accepted {} ({:.1}%), mean accepted length {:.2} in {} verify steps, {:.1} t/s{on_device}",
        stats.drafted,
        stats.accepted,
        100.0 * stats.acceptance(),
        stats.mean_accepted(),
        stats.draft_steps,
        tps
    );
    None
}

/// The draft model's arena: one logits row, room to rewind.
pub fn prepare_draft(g: &Gguf<'_>, path: &Path, opts: &RunOptions) -> Result<Loaded> {
    prepare_with(g, path, &RunOptions { n_outputs: 1, ..*opts }, true)
}

/// The draft model's engine; refused unless its vocabulary is the target's.
pub fn draft_engine<'a>(g: &Gguf<'a>, path: &Path, loaded: &'a mut Loaded, reference: bool, sampling: SamplerConfig, target: &Engine<'_>, target_path: &Path) -> Result<Engine<'a>> {
    let (de, _) = engine(g, path, loaded, reference, sampling)?;
    check_draft_vocab(&de, path, target, target_path)?;
    Ok(de)
}

/// Refuses a draft model (`draft`, from `path`) whose vocabulary is not the target's.
pub fn check_draft_vocab(draft: &Engine<'_>, path: &Path, target: &Engine<'_>, target_path: &Path) -> Result<()> {
    if draft.n_vocab() != target.n_vocab() || draft.tokenizer.eos() != target.tokenizer.eos() {
        bail!("{}: the draft model's vocabulary ({} tokens) is not the target's ({} tokens, {}); draft with a model of the same family", path.display(), draft.n_vocab(), target.n_vocab(), target_path.display());
    }
    Ok(())
}

/// What a draft token and a verify batch cost on this machine, relative to one
/// one-token forward pass of the target (the adaptive draft length's cost model).
#[derive(Clone, Copy, Debug)]
pub struct Costs {
    /// A draft model's one-token pass (0 for prompt lookup).
    pub draft: f32,
    /// A verify batch of two or more tokens, beyond one pass and `verify` per draft.
    pub verify_base: f32,
    /// One more draft in the verify batch.
    pub verify: f32,
    /// Seconds of the target's one-token pass (the fastest timing).
    pub one_secs: f64,
}

impl Costs {
    /// The core's settings for `n_max` drafts per step, fixed or adaptive.
    pub fn config(&self, n_max: usize, adaptive: bool) -> SpecConfig {
        SpecConfig { n_max, adaptive, draft_cost: self.draft, verify_base: self.verify_base, verify_cost: self.verify }
    }
}

/// Measures [`Costs`] for drafting up to `n_max` tokens: the fastest of 3 interleaved
/// timings each of the target's one-token pass, its verify batches of 2 and `n_max + 1`
/// (at most 9) tokens (logits for every row) and the draft model's one-token pass; the
/// batch costs as a line through the two batches (both sessions are started over
/// afterwards).
pub fn measure_costs(e: &mut Engine<'_>, mut de: Option<&mut Engine<'_>>, pool: &crate::pool::ThreadPool, n_max: usize) -> Result<Costs> {
    let toks = [0u32; 9];
    let time = |e: &mut Engine<'_>, n: usize| -> Result<f64> {
        e.reset();
        let t = Instant::now();
        e.eval(&toks[..n], if n > 1 { Outputs::All } else { Outputs::Last }, pool)?;
        Ok(t.elapsed().as_secs_f64())
    };
    let big = (n_max + 1).clamp(2, 9);
    let (mut one, mut two, mut many, mut draft) = (f64::MAX, f64::MAX, f64::MAX, f64::MAX);
    for _ in 0..3 {
        one = one.min(time(e, 1)?);
        two = two.min(time(e, 2)?);
        many = many.min(time(e, big)?);
        if let Some(de) = de.as_deref_mut() {
            draft = draft.min(time(de, 1)?);
        }
    }
    e.reset();
    if let Some(de) = de {
        de.reset();
    }
    let one = one.max(1e-9);
    let verify = if big > 2 { ((many - two) / (big - 2) as f64 / one).max(0.0) } else { 0.0 };
    let verify_base = if big > 2 { (two / one - 1.0 - verify).max(0.0) } else { (two / one - 1.0).max(0.0) };
    let draft = if draft == f64::MAX { 0.0 } else { draft / one };
    Ok(Costs { draft: draft as f32, verify_base: verify_base as f32, verify: verify.min(2.0) as f32, one_secs: one })
}

/// Plain greedy generation of up to `n` tokens after `prompt` (stopping at the end of
/// generation): the tokens and the seconds taken after all but the prompt's last token
/// were evaluated (what a speculative run is timed over too).
fn plain(e: &mut Engine<'_>, pool: &crate::pool::ThreadPool, prompt: &[u32], n: usize) -> Result<(Vec<u32>, f64)> {
    e.reset();
    if prompt.len() > 1 {
        e.eval(&prompt[..prompt.len() - 1], Outputs::Last, pool)?;
    }
    let t = Instant::now();
    e.eval(&prompt[prompt.len() - 1..], Outputs::Last, pool)?;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let tok = e.sample();
        if e.tokenizer.is_eog(tok) {
            break;
        }
        out.push(tok);
        if e.session.n_past() >= e.session.n_ctx() {
            break;
        }
        e.eval(&[tok], Outputs::Last, pool)?;
    }
    Ok((out, t.elapsed().as_secs_f64()))
}

/// The median of `v` (not empty).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// `keel bench --draft-sweep 1..N`: greedy tokens/s of plain decoding and of speculation
/// with each fixed `n_max` in the range, and with the adaptive length (up to N), on one
/// prompt. Every speculative run follows a plain run and its speed-up is against that one;
/// the table shows medians over `-r` repetitions. Every run must generate exactly the
/// plain run's tokens, else no speed is reported.
pub fn sweep(a: &super::bench::BenchArgs, range: &str) -> Result<()> {
    let (lo, hi) = match range.split_once("..") {
        Some((lo, hi)) => (lo.trim().parse::<usize>().ok(), hi.trim().trim_start_matches('=').parse::<usize>().ok()),
        None => (Some(1), range.trim().parse::<usize>().ok()),
    };
    let (Some(lo), Some(hi)) = (lo, hi) else { bail!("--draft-sweep {range:?}: expected a range like 1..8") };
    if lo == 0 || lo > hi || hi > MAX_DRAFT {
        bail!("--draft-sweep {range}: expected 1 <= first <= last <= {MAX_DRAFT}");
    }
    if a.roofline {
        bail!("--roofline measures pp and tg; it does not go with --draft-sweep");
    }
    let model = a.model.model.clone();
    let (n_gen, reps, as_json) = (a.n_gen, a.repetitions, a.json);
    let draft_model = a.sweep.draft_model.clone();
    let lookup = a.sweep.lookup;
    let opts = a.eval.options(hi + 1)?;
    if a.sweep.prompt.is_none() && a.sweep.file.is_none() {
        bail!("--draft-sweep needs a prompt: --prompt TEXT or -f FILE (bench's -p is a token count)");
    }
    let text = prompt_text(a.sweep.prompt.as_deref(), a.sweep.file.as_deref(), "--prompt", opts.n_ctx)?;
    if draft_model.is_some() == lookup {
        bail!("--draft-sweep measures one drafter: give --draft-model M or --lookup");
    }
    if reps == 0 || n_gen == 0 {
        bail!("nothing to measure: -r and -n must be >= 1");
    }
    let greedy = SamplerConfig { temp: 0.0, ..Default::default() };
    let opened = open_for_cpu(&model, opts.reference, opts.threads)?;
    let g = opened.gguf()?;
    let mut loaded = prepare_with(&g, &opened.path, &opts, true)?;
    let (mut e, pool) = engine(&g, &opened.path, &mut loaded, opts.reference, greedy)?;
    let toks = tokenize(&e.tokenizer, &text, true, true, opts.n_ctx)?;
    if toks.is_empty() {
        bail!("the prompt is empty after tokenization");
    }
    let d_opened = draft_model.as_deref().map(|m| open_for_cpu(m, opts.reference, opts.threads)).transpose()?;
    let d_g = d_opened.as_ref().map(|o| o.gguf()).transpose()?;
    let mut d_loaded = match (&d_g, &d_opened) {
        (Some(dg), Some(o)) => Some(prepare_draft(dg, &o.path, &opts)?),
        _ => None,
    };
    let mut de = match (&d_g, &d_opened, d_loaded.as_mut()) {
        (Some(dg), Some(o), Some(l)) => Some(draft_engine(dg, &o.path, l, opts.reference, greedy, &e, &opened.path)?),
        _ => None,
    };
    let costs = measure_costs(&mut e, de.as_mut(), pool, hi)?;
    let mut plan = keel_core::arena::Plan::empty();
    keel_core::speculative::plan(&mut plan, e.n_vocab(), opts.n_ctx, hi)?;
    let mut mem = vec![0u8; plan.total_bytes()];

    // Rows: plain, each fixed n_max, adaptive (up to hi).
    let configs: Vec<Option<SpecConfig>> = std::iter::once(None)
        .chain((lo..=hi).map(|n| Some(costs.config(n, false))))
        .chain(std::iter::once(Some(costs.config(hi, true))))
        .collect();
    // Each speculative run is paired with a plain run just before it, and its speed-up is
    // taken against that one (the load of a shared machine drifts); each repetition
    // starts at another configuration.
    let mut tps = vec![Vec::new(); configs.len()];
    let mut ratio = vec![Vec::new(); configs.len()];
    let mut stats = vec![Stats::default(); configs.len()];
    let (reference, _) = plain(&mut e, pool, &toks, n_gen)?; // also the warm-up
    let check = |out: &[u32]| -> Result<()> {
        if out != reference.as_slice() {
            let at = out.iter().zip(&reference).position(|(a, b)| a != b).unwrap_or(out.len().min(reference.len()));
            bail!("a run generated different tokens from plain greedy decoding (first difference at token {at}) — refusing to report a speed");
        }
        Ok(())
    };
    for r in 0..reps {
        for j in 0..configs.len() - 1 {
            let i = 1 + (j + r) % (configs.len() - 1);
            let Some(c) = configs[i] else { continue };
            let (out, secs) = plain(&mut e, pool, &toks, n_gen)?;
            check(&out)?;
            let plain_tps = out.len() as f64 / secs.max(1e-9);
            tps[0].push(plain_tps);
            let mut carver = keel_core::arena::carve(&mut mem, &plan).map_err(keel_core::Error::from)?;
            let mut sp = Speculator::new(&mut carver, &plan, c, greedy, e.n_vocab())?;
            let mut target = Runner { model: &e.model, session: &mut e.session, par: pool, exec: None };
            let mut model_drafter = de.as_mut().map(|de| ModelDrafter::new(Runner { model: &de.model, session: &mut de.session, par: pool, exec: None }));
            let mut look = Lookup::default();
            let drafter: &mut dyn Drafter = match model_drafter.as_mut() {
                Some(d) => d,
                None => &mut look,
            };
            let mut out = Vec::with_capacity(n_gen);
            sp.start(&mut target, drafter, &toks)?;
            let t = Instant::now();
            let tokenizer = &e.tokenizer;
            let calib = (c.adaptive && draft_model.is_some()).then(|| Calibration::new(&costs));
            generate(&mut sp, &mut target, drafter, n_gen, calib, |tok| {
                if tokenizer.is_eog(tok) {
                    return false;
                }
                out.push(tok);
                true
            })?;
            let secs = t.elapsed().as_secs_f64();
            stats[i] = sp.stats();
            check(&out)?;
            let spec_tps = out.len() as f64 / secs.max(1e-9);
            tps[i].push(spec_tps);
            ratio[i].push(spec_tps / plain_tps);
        }
    }
    ratio[0] = vec![1.0];
    let what = if lookup { "lookup".to_string() } else { format!("draft {}", d_opened.as_ref().map(|o| o.path.file_name().unwrap_or_default().to_string_lossy().into_owned()).unwrap_or_default()) };
    let label = |c: &Option<SpecConfig>| match c {
        None => "plain".to_string(),
        Some(c) if c.adaptive => format!("adaptive <= {}", c.n_max),
        Some(c) => c.n_max.to_string(),
    };
    if as_json {
        let rows: Vec<SweepJson> = configs
            .iter()
            .enumerate()
            .map(|(i, c)| SweepJson {
                drafter: what.clone(),
                n_max: label(c),
                tps: median(&mut tps[i].clone()),
                speedup: median(&mut ratio[i].clone()),
                tokens: reference.len() as u64,
                drafted: stats[i].drafted,
                accepted: stats[i].accepted,
                acceptance_rate: stats[i].acceptance(),
                mean_accepted_length: stats[i].mean_accepted(),
            })
            .collect();
        crate::cli::print_json(&rows);
    } else {
        println!("| drafter | n_max | t/s (median) | vs plain (median of paired runs) | acceptance | mean accepted |");
        println!("|---|---|---|---|---|---|");
        for (i, c) in configs.iter().enumerate() {
            let m = median(&mut tps[i].clone());
            let (acc, mean) = if c.is_some() { (format!("{:.0}%", 100.0 * stats[i].acceptance()), format!("{:.2}", stats[i].mean_accepted())) } else { ("-".into(), "-".into()) };
            println!("| {what} | {} | {m:.2} | {:.2}x | {acc} | {mean} |", label(c), median(&mut ratio[i].clone()));
        }
        eprintln!("keel: {} tokens per run, {} threads, {} kernels; every run generated the plain greedy tokens", reference.len(), opts.threads, e.session.kernels().name());
        eprintln!("keel: the adaptive length's measured costs, in one-token passes: a verify batch of k + 1 tokens {:.2} + {:.2} k, a draft token {:.2}", 1.0 + costs.verify_base, costs.verify, costs.draft);
    }
    Ok(())
}

/// One row of `keel bench --draft-sweep --json`.
#[derive(Serialize)]
struct SweepJson {
    drafter: String,
    n_max: String,
    tps: f64,
    speedup: f64,
    tokens: u64,
    drafted: u64,
    accepted: u64,
    acceptance_rate: f64,
    mean_accepted_length: f64,
}

/// `keel bench`'s flags for `--draft-sweep`.
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "Speculative decoding sweep")]
pub struct SweepFlags {
    /// Instead of pp/tg: greedy t/s of plain decoding and of speculation for each draft length in FIRST..LAST and adaptive (medians of interleaved runs, as a table); needs --draft-model or --lookup and --prompt or -f
    #[arg(long = "draft-sweep", value_name = "FIRST..LAST")]
    pub draft_sweep: Option<String>,
    /// The sweep's draft model (same vocabulary as -m); llama.cpp's -md is read as --draft-model
    #[arg(long = "draft-model", visible_alias = "model-draft", value_name = "MODEL")]
    pub draft_model: Option<String>,
    /// The sweep drafts by prompt lookup
    #[arg(long = "lookup")]
    pub lookup: bool,
    /// The sweep's prompt text (-p is pp's token count)
    #[arg(long = "prompt", value_name = "TEXT", allow_hyphen_values = true)]
    pub prompt: Option<String>,
    /// Read the sweep's prompt from FILE (- reads standard input)
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<String>,
}

impl SweepFlags {
    /// The first sweep-only flag given (they need --draft-sweep).
    pub fn stray(&self) -> Option<&'static str> {
        [(self.draft_model.is_some(), "--draft-model"), (self.lookup, "--lookup"), (self.prompt.is_some(), "--prompt"), (self.file.is_some(), "-f")].into_iter().find(|(g, _)| *g).map(|(_, f)| f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_learns_what_a_drafted_token_costs() {
        // Measured at start: a 10 ms pass, verify batch 1.1 + 0.2 k, a draft token 0.3.
        let costs = Costs { draft: 0.3, verify_base: 0.1, verify: 0.2, one_secs: 0.010 };
        let mut c = Calibration::new(&costs);
        // Plain steps under load take 20 ms: they become the unit.
        for _ in 0..40 {
            assert_eq!(c.observe(0.020, 0), None);
        }
        assert!((c.plain - 0.020).abs() < 1e-4, "{}", c.plain);
        // A step drafting 2 that took 3.3 passes: (3.3 - 1.1) / 2 - 0.2 = 0.9 per draft.
        let d = c.observe(0.066, 2).unwrap();
        assert!((d - 0.9).abs() < 0.01, "{d}");
        // Averaged with the next: one cheaper step (0.1 per draft) gives 0.5.
        let d = c.observe(0.020 * 1.4, 1).unwrap();
        assert!((d - 0.5).abs() < 0.01, "{d}");
        // Never negative; nonsense timings are ignored.
        assert!(c.observe(0.001, 4).unwrap() >= 0.0);
        assert_eq!(c.observe(f64::NAN, 1), None);
    }
}

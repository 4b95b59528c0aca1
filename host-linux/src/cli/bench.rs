//! `keel bench`: prompt processing (pp) and token generation (tg) speed in the spirit of
//! llama-bench, with a warm-up, `-r` repetitions, mean ± standard deviation, and a check of
//! its own output: every tg repetition must generate exactly the tokens of the first one,
//! and every logits row must be finite and not constant. A run that fails the check gets
//! no speed printed: the command fails instead (a benchmark that never looks at its
//! output can report any speed for zeros).

use super::common::{ModelFlag, EvalFlags, MAX_TOKENS};
use super::load::{arena_beyond_memory, engine, open_for_cpu, prepare, training_context};
use serde::Serialize;
use anyhow::{bail, Result};
use keel_core::engine::Engine;
use keel_core::parallel::Parallel;
use crate::pool::{JobTimes, ThreadPool};
use keel_core::sampler::{Rng, SamplerConfig};
use keel_core::session::Outputs;
use std::time::{Duration, Instant};

/// One measured test.
struct Measured {
    test: String,
    tps: Vec<f64>,
}

impl Measured {
    fn mean(&self) -> f64 {
        self.tps.iter().sum::<f64>() / self.tps.len() as f64
    }

    fn sd(&self) -> f64 {
        if self.tps.len() < 2 {
            return 0.0;
        }
        let m = self.mean();
        (self.tps.iter().map(|t| (t - m) * (t - m)).sum::<f64>() / (self.tps.len() - 1) as f64).sqrt()
    }
}

/// Checks a logits row: finite everywhere and not constant.
fn check_logits(row: &[f32], what: &str) -> Result<()> {
    if let Some(i) = row.iter().position(|v| !v.is_finite()) {
        bail!("{what}: logit {i} is {} — refusing to report a speed for broken output", row[i]);
    }
    let (lo, hi) = row.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    if lo == hi {
        bail!("{what}: all {} logits equal {lo} — refusing to report a speed for constant output", row.len());
    }
    Ok(())
}

/// Deterministic prompt tokens (a fixed pseudo-random draw over the vocabulary).
fn prompt_tokens(n: usize, n_vocab: usize) -> Vec<u32> {
    let mut rng = Rng::new(0x6b65656c);
    (0..n).map(|_| (rng.next_u64() % n_vocab as u64) as u32).collect()
}

/// Starts a new sequence with `depth` positions already in the KV cache (`-d`: the
/// deterministic prompt tokens, evaluated in batches of at most `batch`, not timed).
fn fill_depth(e: &mut Engine<'_>, par: &dyn Parallel, depth: &[u32], batch: usize) -> Result<()> {
    e.reset();
    for part in depth.chunks(batch.max(1)) {
        e.eval(part, Outputs::Last, par)?;
    }
    Ok(())
}

fn run_pp(e: &mut Engine<'_>, par: &dyn Parallel, toks: &[u32], depth: &[u32], batch: usize) -> Result<f64> {
    fill_depth(e, par, depth, batch)?;
    let t = Instant::now();
    let v = e.n_vocab();
    let logits = e.eval(toks, Outputs::Last, par)?;
    let secs = t.elapsed().as_secs_f64();
    check_logits(&logits[..v], "pp")?;
    Ok(toks.len() as f64 / secs)
}

/// What one tg repetition measured.
struct Generated {
    tps: f64,
    tokens: Vec<u32>,
    /// Where the calling thread's time went in the timed evaluations (not the depth's
    /// fill), their hand-offs counted (with `split` only).
    times: JobTimes,
    /// Seconds spent sampling.
    sampling: f64,
}

/// Batches and jobs per batch of the hand-off `--roofline` measures after each tg
/// repetition (`ThreadPool::hand_off`): ~1000 empty jobs, under a millisecond.
const HAND_OFF_BATCHES: u32 = 20;
const HAND_OFF_JOBS: u32 = 50;

/// Generation speed: each step's evaluation and sampling are timed; the check of its
/// logits (a scan of the whole row, not part of generating) is not. With `split`, each
/// evaluation's time is also split by pool job ([`ThreadPool::time`]: two clock reads a
/// job, so only with `--roofline`).
fn run_tg(e: &mut Engine<'_>, pool: &ThreadPool, first: u32, n: usize, depth: &[u32], batch: usize, split: bool) -> Result<Generated> {
    fill_depth(e, pool, depth, batch)?;
    let mut out = Vec::with_capacity(n);
    let mut tok = first;
    let (mut secs, mut times, mut sampling) = (0.0, JobTimes::default(), 0.0);
    for i in 0..n {
        let t = Instant::now();
        if split {
            pool.time(&mut times, || e.eval(&[tok], Outputs::Last, pool))?;
        } else {
            e.eval(&[tok], Outputs::Last, pool)?;
        }
        let after_eval = t.elapsed().as_secs_f64();
        check_logits(e.session.last_logits(e.n_vocab()), &format!("tg step {i}"))?;
        let t = Instant::now();
        tok = e.sample();
        let s = t.elapsed().as_secs_f64();
        secs += after_eval + s;
        sampling += s;
        out.push(tok);
    }
    Ok(Generated { tps: n as f64 / secs, tokens: out, times, sampling })
}

/// `keel bench`.
#[derive(clap::Args, Debug)]
#[command(after_help = "JSON: [{\"test\":\"pp512\",\"tps\":x,\"sd\":y,...},...] (tg gains bound_tps, fraction_of_bound, fraction_of_pass_after, read_passes, bytes_per_token, read_bytes_per_s, read_loop, pool_jobs_per_token, calling_thread_per_token {tasks, wait, between, sampling} in seconds, hand_off_after [seconds per repetition, two or more threads] with --roofline). A run whose logits are NaN or constant, or whose tg repetitions generate different tokens, reports no speed: it fails.")]
pub struct BenchArgs {
    /// The model (`-m`).
    #[command(flatten)]
    pub model: ModelFlag,
    /// Prompt tokens of the pp test (0 = no pp test)
    #[arg(short = 'p', long = "n-prompt", value_name = "N", default_value_t = 512)]
    pub n_prompt: usize,
    /// Generated tokens of the tg test (0 = no tg test)
    #[arg(short = 'n', long = "n-gen", value_name = "N", default_value_t = 128)]
    pub n_gen: usize,
    /// Positions already in the KV cache before each pp and tg measurement (llama-bench's
    /// `-d`; filled with fixed prompt tokens, not timed)
    #[arg(short = 'd', long = "n-depth", value_name = "N", default_value_t = 0)]
    pub n_depth: usize,
    /// Repetitions of each test (mean ± standard deviation)
    #[arg(short = 'r', long = "repetitions", value_name = "N", default_value_t = 3)]
    pub repetitions: usize,
    /// Also measure the machine's read bandwidth (passes before, between and after the tg repetitions) and print the bandwidth bound of tg, each repetition against the pass right after it, the thread pool's hand-offs per generated token and (two or more threads) what one hand-off costs after each repetition (an empty job: it shows whether the threads share a core in those minutes) and where a token's time went on the calling thread: its tasks of those jobs, waiting for the other threads, between the jobs, sampling
    #[arg(long = "roofline")]
    pub roofline: bool,
    /// JSON output
    #[arg(long = "json")]
    pub json: bool,
    /// `-c`, the run limits, `--batches`.
    #[command(flatten)]
    pub eval: EvalFlags,
    /// `--draft-sweep` and its flags.
    #[command(flatten)]
    pub sweep: super::speculate::SweepFlags,
}

/// One test in `bench --json`.
#[derive(Serialize)]
struct BenchJson<'a> {
    test: &'a str,
    n_depth: usize,
    kernels: &'static str,
    tps: f64,
    sd: f64,
    threads: usize,
    repetitions: usize,
    batches: &'static str,
    #[serde(flatten)]
    bound: Option<BoundJson>,
}

/// tg's bandwidth bound (`--roofline`).
#[derive(Serialize)]
struct BoundJson {
    read_bytes_per_s: f64,
    /// The read loop that reached `read_bytes_per_s` (`portable`, `avx2`, `avx2 3 streams`, `avx512`, `avx512+prefetch`).
    read_loop: &'static str,
    bytes_per_token: u64,
    weight_bytes_per_token: u64,
    kv_bytes_per_token: u64,
    bound_tps: f64,
    fraction_of_bound: f64,
    /// Each tg repetition's t/s over the bound of the read pass taken right after it.
    fraction_of_pass_after: Vec<f64>,
    /// Read passes the bound is the fastest of (before, between and after the repetitions).
    read_passes: usize,
    /// With two or more threads, the pool's hand-off right after each tg repetition
    /// ([`crate::pool::ThreadPool::hand_off`]), seconds (empty with one thread).
    hand_off_after: Vec<f64>,
    /// Hand-offs to the thread pool per generated token (parallel jobs: matrix
    /// products, attention, ...; 0 with one thread).
    pool_jobs_per_token: f64,
    /// Where a generated token's time went on the calling thread (means over every timed
    /// token, seconds).
    calling_thread_per_token: CallerJson,
}

/// A generated token's time on the calling thread ([`crate::pool::JobTimes`]), seconds.
#[derive(Clone, Copy, Serialize)]
struct CallerJson {
    /// In its own tasks of the pool's jobs.
    tasks: f64,
    /// Waiting, its tasks done, for the other threads' tasks.
    wait: f64,
    /// Outside the jobs (its serial work: norms, activations, ops run on it alone).
    between: f64,
    /// Sampling the next token.
    sampling: f64,
}

/// Runs the subcommand.
pub fn main(a: BenchArgs) -> Result<()> {
    if let Some(range) = &a.sweep.draft_sweep {
        return super::speculate::sweep(&a, range);
    }
    if let Some(flag) = a.sweep.stray() {
        bail!("{flag} is for --draft-sweep FIRST..LAST; give --draft-sweep or drop {flag}");
    }
    let model = a.model.model.clone();
    let (n_prompt, n_gen, reps, as_json, roofline) = (a.n_prompt, a.n_gen, a.repetitions, a.json, a.roofline);
    let depth = a.n_depth;
    for (flag, n) in [("-p", n_prompt), ("-n", n_gen), ("-d", depth)] {
        if n >= MAX_TOKENS {
            bail!("{flag} {n}: the context would need more than {MAX_TOKENS} tokens; use a smaller {flag}");
        }
    }
    if depth + n_prompt.max(n_gen) >= MAX_TOKENS {
        bail!("-d {depth} with -p {n_prompt} -n {n_gen}: the context would need more than {MAX_TOKENS} tokens; use a smaller -d");
    }
    let mut opts = a.eval.options(1)?;
    if reps == 0 || (n_prompt == 0 && n_gen == 0) {
        bail!("nothing to measure: -r must be >= 1 and -p or -n > 0");
    }
    // The most positions a test holds: the depth, then the prompt or the generated tokens.
    let span = depth + n_prompt.max(n_gen + 1);
    opts.n_ctx = opts.n_ctx.max(span);
    opts.n_batch = opts.n_batch.max(n_prompt).min(opts.n_ctx);
    let opened = open_for_cpu(&model, opts.reference, opts.threads)?;
    let g = opened.gguf()?;
    // The sizes as the user gave them (-d only when given).
    let sizes = if depth > 0 { format!("-p {n_prompt} -n {n_gen} -d {depth}") } else { format!("-p {n_prompt} -n {n_gen}") };
    let smaller = if depth > 0 { "-p, -n or -d" } else { "-p or -n" };
    // A speed measured past the training context is of positions the model never saw;
    // sizes beyond it are refused before any work (--force-ctx measures them anyway).
    if let Some((key, train)) = training_context(&g).filter(|&(_, t)| !opts.force_ctx && span > t) {
        bail!(
            "{}: bench {sizes} needs a {span}-token context but the model's training context is {train} ({key}); use a smaller {smaller} (or --force-ctx)",
            opened.path.display(),
        );
    }
    if let (total, Some(mem)) = arena_beyond_memory(&g, &opened.path, &opts)? {
        bail!(
            "{}: bench {sizes} plans a {} arena (a {}-token context, {}-token batches) but this machine has {} of physical memory; use a smaller {smaller}",
            opened.path.display(),
            super::common::mib(total as u64),
            opts.n_ctx,
            opts.n_batch,
            super::common::mib(mem)
        );
    }
    let mut loaded = prepare(&g, &opened.path, &opts)?;
    let (mut e, pool) = engine(&g, &opened.path, &mut loaded, opts.reference, SamplerConfig { temp: 0.0, ..Default::default() })?;
    e.session.set_llama_cpp_batches(a.eval.llama_cpp());
    let toks = prompt_tokens(n_prompt.max(1), e.n_vocab());
    // The depth's tokens: the same fixed draw, continued past the prompt's.
    let depth_toks = prompt_tokens(n_prompt.max(1) + depth, e.n_vocab()).split_off(n_prompt.max(1));
    let (dt, nb) = (&depth_toks[..], opts.n_batch);
    // llama-bench's names: `pp512`, or `pp512 @ d4096` at a depth.
    let name = |t: &str| if depth > 0 { format!("{t} @ d{depth}") } else { t.to_string() };

    // Warm-up, not measured: the whole pp prompt, as llama-bench's warm-up runs it (so the
    // first timed pass does not meet the batch's arena pages and cache rows for the first
    // time: a 32-token warm-up left pp512 at depth 0 4-10% slower in its first repetition,
    // BENCHMARKS.md), then a few generated tokens.
    run_pp(&mut e, pool, &toks, &[], nb)?;
    run_tg(&mut e, pool, toks[0], n_gen.min(4), &[], nb, false)?;

    let mut results = Vec::new();
    // The pool's hand-offs over every timed tg step and where the calling thread's time
    // went (reported per token with --roofline).
    let (mut tg_times, mut tg_sampling) = (JobTimes::default(), 0.0);
    if n_prompt > 0 {
        let mut m = Measured { test: name(&format!("pp{n_prompt}")), tps: Vec::new() };
        for _ in 0..reps {
            m.tps.push(run_pp(&mut e, pool, &toks, dt, nb)?);
        }
        results.push(m);
    }
    // With --roofline, the read passes that bound tg, taken in the same minutes as its
    // repetitions (never during one): two before the first, one right after each (the
    // pass that repetition is paired with), more after the last up to PASSES in all.
    let probe = (roofline && n_gen > 0).then(|| super::roofline::ReadProbe::new(opts.threads));
    let (mut passes, mut after, mut hand_offs) = (Vec::new(), Vec::new(), Vec::new());
    if n_gen > 0 {
        let mut m = Measured { test: name(&format!("tg{n_gen}")), tps: Vec::new() };
        let mut reference: Option<Vec<u32>> = None;
        if let Some(p) = &probe {
            passes.extend([p.pass(), p.pass()]);
        }
        for r in 0..reps {
            let Generated { tps, tokens: out, times, sampling } = run_tg(&mut e, pool, toks[0], n_gen, dt, nb, roofline)?;
            tg_times += times;
            tg_sampling += sampling;
            match &reference {
                None => reference = Some(out),
                Some(want) if *want != out => {
                    let at = want.iter().zip(&out).position(|(a, b)| a != b).unwrap_or(0);
                    bail!("tg repetition {r} generated different tokens from the first (first difference at step {at}: {} vs {}) — refusing to report a speed", out[at], want[at]);
                }
                Some(_) => {}
            }
            m.tps.push(tps);
            if let Some(p) = &probe {
                // The hand-off first, while the pool's threads are where the repetition
                // left them: after a read pass (its own threads on every vCPU, the
                // workers asleep) the scheduler could wake a worker on the calling
                // thread's vCPU, and a hand-off then took ~15 µs until it moved.
                hand_offs.extend(pool.hand_off(HAND_OFF_BATCHES, HAND_OFF_JOBS));
                let b = p.pass();
                passes.push(b);
                after.push(b);
            }
        }
        results.push(m);
    }
    if let Some(p) = &probe {
        while passes.len() < super::roofline::PASSES {
            passes.push(p.pass());
        }
    }

    // The bandwidth bound of tg: the fastest pass (so never below what the memory
    // delivered in those minutes), and each repetition against the pass right after it.
    let bytes = probe.as_ref().map(|_| super::roofline::bytes_per_token(&e.model, depth, n_gen));
    let tg_tps = results.iter().find(|m| m.test.starts_with("tg")).map_or(&[][..], |m| &m.tps[..]);
    let paired: Vec<f64> = bytes.map_or_else(Vec::new, |b| tg_tps.iter().zip(&after).map(|(&tps, bw)| tps * b.total() as f64 / bw.bytes_per_s).collect());
    let tokens = (reps * n_gen).max(1) as f64;
    let bound = super::roofline::fastest(&passes).zip(bytes).map(|(bw, bytes)| (bw, bytes, bw.bytes_per_s / bytes.total() as f64, tg_times.jobs as f64 / tokens));
    let caller = CallerJson { tasks: tg_times.tasks.as_secs_f64() / tokens, wait: tg_times.wait.as_secs_f64() / tokens, between: tg_times.between.as_secs_f64() / tokens, sampling: tg_sampling / tokens };

    if as_json {
        let rows: Vec<BenchJson<'_>> = results
            .iter()
            .map(|m| BenchJson {
                test: &m.test,
                n_depth: depth,
                kernels: e.session.kernels().name(),
                tps: m.mean(),
                sd: m.sd(),
                threads: opts.threads,
                repetitions: reps,
                batches: if a.eval.llama_cpp() { "llama-cpp" } else { "invariant" },
                bound: bound.filter(|_| m.test.starts_with("tg")).map(|(bw, bytes, tps_max, jobs)| BoundJson {
                    read_bytes_per_s: bw.bytes_per_s,
                    read_loop: bw.read_loop,
                    bytes_per_token: bytes.total(),
                    weight_bytes_per_token: bytes.weights,
                    kv_bytes_per_token: bytes.kv,
                    bound_tps: tps_max,
                    fraction_of_bound: m.mean() / tps_max,
                    fraction_of_pass_after: paired.clone(),
                    read_passes: passes.len(),
                    hand_off_after: hand_offs.iter().map(Duration::as_secs_f64).collect(),
                    pool_jobs_per_token: jobs,
                    calling_thread_per_token: caller,
                }),
            })
            .collect();
        crate::cli::print_json(&rows);
    } else {
        let size = opened.file.bytes().len() as f64 / (1024.0 * 1024.0);
        println!("| model | size | threads | kernels | test | t/s |");
        println!("|---|---|---|---|---|---|");
        let name = opened.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        for m in &results {
            println!("| {name} | {size:.1} MiB | {} | {} | {} | {:.2} ± {:.2} |", opts.threads, e.session.kernels().name(), m.test, m.mean(), m.sd());
        }
        if let Some((bw, bytes, tps_max, jobs)) = bound {
            let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
            let tg = results.iter().find(|m| m.test.starts_with("tg")).map_or(0.0, Measured::mean);
            println!();
            println!("read bandwidth ({} threads, {} MiB buffer, best of {} passes of each read loop, taken before, between and after the tg repetitions; fastest: {}): {:.2} GB/s", opts.threads, 512, passes.len(), bw.read_loop, bw.bytes_per_s / 1e9);
            println!("bytes read per generated token: {:.2} MiB (weights {:.2}, KV at the mean position of tg{n_gen} {:.2}, embedding row and norms {:.3})", mib(bytes.total()), mib(bytes.weights), mib(bytes.kv), mib(bytes.small));
            println!("bandwidth bound: {tps_max:.1} t/s; tg{n_gen} reaches {:.0}% of it", 100.0 * tg / tps_max);
            let each: Vec<String> = paired.iter().zip(&after).map(|(f, bw)| format!("{:.0}% ({:.2} GB/s)", 100.0 * f, bw.bytes_per_s / 1e9)).collect();
            println!("each tg{n_gen} repetition against the read pass right after it: {}", each.join(", "));
            println!("thread-pool hand-offs per generated token: {jobs:.1}");
            if !hand_offs.is_empty() {
                let each: Vec<String> = hand_offs.iter().map(|d| format!("{} ns", d.as_nanos())).collect();
                println!("one hand-off to the other threads and back (an empty job, the fastest of {HAND_OFF_BATCHES} batches of {HAND_OFF_JOBS}), after each tg{n_gen} repetition: {}", each.join(", "));
            }
            if jobs > 0.0 {
                let all = caller.tasks + caller.wait + caller.between + caller.sampling;
                let part = |s: f64| format!("{:.1} µs ({:.0}%)", s * 1e6, 100.0 * s / all.max(f64::MIN_POSITIVE));
                println!(
                    "a generated token's time on the calling thread: {} in its tasks of those jobs, {} waiting for the other threads' tasks, {} between the jobs, {} sampling",
                    part(caller.tasks),
                    part(caller.wait),
                    part(caller.between),
                    part(caller.sampling)
                );
            }
        }
    }
    Ok(())
}

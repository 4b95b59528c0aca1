//! The slots: one thread per slot, each owning an engine built in its own arena (planned
//! and allocated at start), taking requests from one bounded queue and sending the
//! generated text to the HTTP task through a bounded channel. A send that fails means the
//! client went away: the slot stops at that token and takes the next request.

use super::api::Usage;
use super::metrics::Metrics;
use crate::cli::common::check_finite;
use crate::cli::speculate::{check_draft_vocab, configure, generate, measure_costs, Calibration, Costs};
use crate::mmap::Arena;
use crate::pool::ThreadPool;
use keel_core::engine::Engine;
use keel_core::gguf::Gguf;
use keel_core::sampler::SamplerConfig;
use keel_core::session::{Outputs, SessionConfig};
use keel_core::speculative::{Drafter, Lookup, ModelDrafter, Runner, Speculator};
use keel_core::tokenizer::{Tokenizer, Utf8Stream};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::Sender;

/// Tokens a slot may run ahead of a slow client (the channel between a slot and its
/// HTTP task holds at most this many pieces of text).
pub const CHANNEL_DEPTH: usize = 16;

/// A request's generation settings, already checked.
#[derive(Debug, Clone)]
pub struct Params {
    /// Temperature (0 = greedy).
    pub temp: f32,
    /// Top-p (1 = off).
    pub top_p: f32,
    /// Seed.
    pub seed: u64,
    /// Most tokens to generate (at least 1; the prompt plus these fit the context).
    pub max_tokens: usize,
    /// Stop strings (none empty).
    pub stop: Vec<String>,
}

/// What a slot sends back for a request.
#[derive(Debug)]
pub enum Event {
    /// More text.
    Text(String),
    /// The end: why (`stop` or `length`) and the token counts.
    Done {
        /// `stop` or `length`.
        finish: &'static str,
        /// Token counts.
        usage: Usage,
    },
    /// The model failed (500).
    Error(String),
}

/// A place among the admitted requests (in a slot or waiting); dropped when the request
/// is finished, whoever drops it.
pub struct Permit(Arc<Metrics>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

/// Admits a request when fewer than `limit` (slots + queue) are admitted, else `None`.
pub fn admit(metrics: &Arc<Metrics>, limit: usize) -> Option<Permit> {
    metrics.in_flight.fetch_update(Relaxed, Relaxed, |n| (n < limit).then_some(n + 1)).ok()?;
    Some(Permit(metrics.clone()))
}

/// A request for a slot.
pub struct Job {
    /// The prompt's tokens (fits the context with `params.max_tokens`).
    pub tokens: Vec<u32>,
    /// Settings.
    pub params: Params,
    /// Where the text goes; closed when the client went away.
    pub tx: Sender<Event>,
    /// Its place in the queue.
    pub permit: Permit,
}

/// The queue's sending end.
pub type Queue = SyncSender<Job>;

/// What a slot thread needs to build its engine.
pub struct SlotSetup {
    /// Slot number (for messages and the thread name).
    pub index: usize,
    /// The model.
    pub gguf: Gguf<'static>,
    /// The arena, planned for `cfg`.
    pub arena: Arena,
    /// Session limits.
    pub cfg: SessionConfig,
    /// Scalar reference kernels.
    pub reference: bool,
    /// llama.cpp's batch-dependent arithmetic.
    pub llama_cpp_batches: bool,
    /// Speculative decoding (`--lookup`, `--draft-model`); the arena above then has room
    /// to rewind (`keel_core::engine::plan_with`'s checkpoint) and logits for a verify
    /// batch.
    pub spec: Option<SpecSetup>,
}

/// A slot's speculative decoding, planned at start.
pub struct SpecSetup {
    /// Most tokens drafted per step.
    pub n_max: usize,
    /// `--draft-fixed`: always `n_max` (else the adaptive length, from costs measured
    /// when the slot starts).
    pub fixed: bool,
    /// The speculator's arena (`keel_core::speculative::plan` for the slot's context).
    pub arena: Arena,
    /// The draft model (`None`: prompt lookup).
    pub draft: Option<DraftSetup>,
}

/// A slot's draft model: the mapped file, its own arena, its session limits.
pub struct DraftSetup {
    /// The draft model.
    pub gguf: Gguf<'static>,
    /// Its arena, planned for `cfg` with room to rewind.
    pub arena: Arena,
    /// Its session limits (the slot's context; one logits row).
    pub cfg: SessionConfig,
    /// Its file and the target's (for the vocabulary check's message).
    pub path: PathBuf,
    /// The target's file.
    pub target_path: PathBuf,
}

/// A running slot's speculation: the speculator (its sequence and draft buffers live in
/// the slot's speculation arena), the costs the adaptive length plans with, the draft
/// model's engine.
struct SlotSpec<'a> {
    sp: Speculator<'a>,
    costs: Option<Costs>,
    draft: Option<Engine<'a>>,
}

/// Builds a slot's speculation: the draft engine (checked against the target's
/// vocabulary), the speculator, and, for the adaptive length, the costs measured on this
/// slot's engines.
fn start_spec<'a>(s: &'a mut SpecSetup, e: &mut Engine<'_>, pool: &ThreadPool, reference: bool, llama_cpp_batches: bool) -> anyhow::Result<SlotSpec<'a>> {
    let mut draft = match s.draft.as_mut() {
        Some(d) => {
            let mut de = Engine::new_with(&d.gguf, d.arena.as_mut_slice(), d.cfg, crate::cli::load::kernels(reference), SamplerConfig::default(), true).map_err(|err| anyhow::anyhow!("{}: {err}", d.path.display()))?;
            de.session.set_llama_cpp_batches(llama_cpp_batches);
            check_draft_vocab(&de, &d.path, e, &d.target_path)?;
            Some(de)
        }
        None => None,
    };
    let mut plan = keel_core::arena::Plan::empty();
    keel_core::speculative::plan(&mut plan, e.n_vocab(), e.session.n_ctx(), s.n_max)?;
    let mut carver = keel_core::arena::carve(s.arena.as_mut_slice(), &plan).map_err(keel_core::Error::from)?;
    let (cfg, costs) = configure(s.n_max, s.fixed, || measure_costs(e, draft.as_mut(), pool, s.n_max))?;
    let sp = Speculator::new(&mut carver, &plan, cfg, SamplerConfig::default(), e.n_vocab())?;
    Ok(SlotSpec { sp, costs, draft })
}

/// Starts a slot's thread: it builds its engine and pool, reports on `ready`, then serves
/// jobs from `jobs` until the queue closes.
pub fn spawn(setup: SlotSetup, jobs: Arc<Mutex<Receiver<Job>>>, metrics: Arc<Metrics>, ready: std::sync::mpsc::Sender<anyhow::Result<()>>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name(format!("keel-slot-{}", setup.index)).spawn(move || {
        let SlotSetup { index, gguf, mut arena, cfg, reference, llama_cpp_batches, mut spec } = setup;
        let pool = match ThreadPool::new(cfg.n_threads) {
            Ok(p) => p,
            Err(e) => {
                let _ = ready.send(Err(anyhow::anyhow!("slot {index}: starting its thread pool: {e}")));
                return;
            }
        };
        let mut e = match Engine::new_with(&gguf, arena.as_mut_slice(), cfg, crate::cli::load::kernels(reference), SamplerConfig::default(), spec.is_some()) {
            Ok(e) => e,
            Err(err) => {
                let _ = ready.send(Err(anyhow::anyhow!("slot {index}: {err}")));
                return;
            }
        };
        e.session.set_llama_cpp_batches(llama_cpp_batches);
        let mut spec = match spec.as_mut().map(|s| start_spec(s, &mut e, &pool, reference, llama_cpp_batches)).transpose() {
            Ok(s) => s,
            Err(err) => {
                let _ = ready.send(Err(anyhow::anyhow!("slot {index}: {err:#}")));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        let mut piece = vec![0u8; e.tokenizer.max_piece_len()];
        loop {
            let job = match jobs.lock() {
                Ok(rx) => match rx.recv() {
                    Ok(j) => j,
                    Err(_) => return,
                },
                Err(_) => return,
            };
            metrics.slots_busy.fetch_add(1, Relaxed);
            serve_one(&mut e, &pool, &job, &mut piece, &metrics, spec.as_mut());
            metrics.slots_busy.fetch_sub(1, Relaxed);
            drop(job);
        }
    })
}

/// One request's reply as it is generated: the text (held back where a stop string may
/// begin), the count of tokens, why it ended.
struct Reply<'j> {
    job: &'j Job,
    m: &'j Metrics,
    stream: Utf8Stream,
    stop: StopMatcher<'j>,
    n: usize,
    finish: &'static str,
    /// A stop string ended it.
    hit: bool,
    /// The client went away.
    gone: bool,
}

impl<'j> Reply<'j> {
    fn new(job: &'j Job, m: &'j Metrics) -> Self {
        Reply { job, m, stream: Utf8Stream::new(), stop: StopMatcher::new(&job.params.stop), n: 0, finish: "length", hit: false, gone: false }
    }

    /// Takes a generated token and sends its text; false when the reply ends here (an
    /// end-of-generation token, a stop string, the client gone).
    fn token(&mut self, tokenizer: &Tokenizer<'_>, tok: u32, piece: &mut [u8]) -> bool {
        if tokenizer.is_eog(tok) {
            self.finish = "stop";
            return false;
        }
        self.n += 1;
        self.m.generated_tokens.fetch_add(1, Relaxed);
        let len = tokenizer.piece(tok, false, piece).unwrap_or(0);
        let mut text = String::new();
        self.stream.push(&piece[..len], |s: &str| text.push_str(s));
        let (out, matched) = self.stop.push(&text);
        if !out.is_empty() && self.job.tx.blocking_send(Event::Text(out)).is_err() {
            self.gone = true;
            return false;
        }
        if matched {
            self.finish = "stop";
            self.hit = true;
            return false;
        }
        true
    }

    fn fail(&self, msg: String) {
        self.m.requests_failed.fetch_add(1, Relaxed);
        let _ = self.job.tx.blocking_send(Event::Error(msg));
    }
}

/// Generates one request's reply, sending it piece by piece (with `spec`, by speculative
/// decoding: the same greedy text, the target's distribution when sampling).
fn serve_one(e: &mut Engine<'_>, pool: &ThreadPool, job: &Job, piece: &mut [u8], m: &Metrics, spec: Option<&mut SlotSpec<'_>>) {
    let p = &job.params;
    let cancelled = || {
        m.requests_cancelled.fetch_add(1, Relaxed);
    };
    if job.tx.is_closed() {
        return cancelled();
    }
    e.reset();
    let sampling = SamplerConfig { temp: p.temp, top_k: 0, top_p: p.top_p, min_p: 0.0, repeat_penalty: 1.0, repeat_last_n: 0, seed: p.seed };
    e.sampler.set_config(sampling);
    let mut r = Reply::new(job, m);
    let t0 = Instant::now();
    let done = match spec {
        None => plain(e, pool, job, piece, &mut r, t0),
        Some(s) => speculative(e, pool, job, piece, &mut r, s, sampling, t0),
    };
    if r.gone {
        return cancelled();
    }
    if !done {
        return;
    }
    if !r.hit {
        let mut text = String::new();
        r.stream.finish(|s: &str| text.push_str(s));
        let (mut out, matched) = r.stop.push(&text);
        if matched {
            r.finish = "stop";
        } else {
            out.push_str(&r.stop.held);
        }
        if !out.is_empty() && job.tx.blocking_send(Event::Text(out)).is_err() {
            return cancelled();
        }
    }
    m.requests_completed.fetch_add(1, Relaxed);
    let usage = Usage { prompt_tokens: job.tokens.len(), completion_tokens: r.n, total_tokens: job.tokens.len() + r.n };
    let _ = job.tx.blocking_send(Event::Done { finish: r.finish, usage });
}

/// The prompt, then one token per forward pass; false when the model failed (reported).
fn plain(e: &mut Engine<'_>, pool: &ThreadPool, job: &Job, piece: &mut [u8], r: &mut Reply<'_>, t0: Instant) -> bool {
    let (p, m) = (&job.params, r.m);
    if let Err(err) = e.eval(&job.tokens, Outputs::Last, pool) {
        r.fail(format!("evaluating the prompt: {err}"));
        return false;
    }
    m.prompt_tokens.fetch_add(job.tokens.len() as u64, Relaxed);
    m.prompt_us.fetch_add(t0.elapsed().as_micros() as u64, Relaxed);
    let t1 = Instant::now();
    let n_ctx = e.session.n_ctx();
    let ok = loop {
        if let Err(err) = check_finite(e.session.last_logits(e.n_vocab()), e.session.first_non_finite(), || format!("generated token {}", r.n + 1)) {
            r.fail(format!("{err:#}"));
            break false;
        }
        let tok = e.sample();
        if !r.token(&e.tokenizer, tok, piece) || r.n >= p.max_tokens || e.session.n_past() >= n_ctx {
            break true;
        }
        if let Err(err) = e.eval(&[tok], Outputs::Last, pool) {
            r.fail(format!("generating token {}: {err}", r.n + 1));
            break false;
        }
    };
    m.generation_us.fetch_add(t1.elapsed().as_micros() as u64, Relaxed);
    ok
}

/// The prompt, then speculative steps (drafts verified in one batch); false when the
/// model failed (reported).
#[allow(clippy::too_many_arguments)]
fn speculative(e: &mut Engine<'_>, pool: &ThreadPool, job: &Job, piece: &mut [u8], r: &mut Reply<'_>, s: &mut SlotSpec<'_>, sampling: SamplerConfig, t0: Instant) -> bool {
    let m = r.m;
    if let Err(err) = s.sp.set_sampling(sampling) {
        r.fail(format!("{err}"));
        return false;
    }
    let has_draft = s.draft.is_some();
    let mut target = Runner { model: &e.model, session: &mut e.session, par: pool, exec: None };
    let tokenizer = &e.tokenizer;
    let mut lookup = Lookup::default();
    let mut model_drafter = s.draft.as_mut().map(|de| ModelDrafter::new(Runner { model: &de.model, session: &mut de.session, par: pool, exec: None }));
    let drafter: &mut dyn Drafter = match model_drafter.as_mut() {
        Some(d) => d,
        None => &mut lookup,
    };
    // Each request starts from the costs measured at start; a draft model's are then
    // learnt from its timed steps.
    let calib = match &s.costs {
        Some(c) => {
            s.sp.set_draft_cost(c.draft);
            has_draft.then(|| Calibration::new(c))
        }
        None => None,
    };
    if let Err(err) = s.sp.start(&mut target, drafter, &job.tokens) {
        r.fail(format!("evaluating the prompt: {err}"));
        return false;
    }
    m.prompt_tokens.fetch_add(job.tokens.len() as u64, Relaxed);
    m.prompt_us.fetch_add(t0.elapsed().as_micros() as u64, Relaxed);
    let t1 = Instant::now();
    let res = generate(&mut s.sp, &mut target, drafter, job.params.max_tokens, calib, |tok| r.token(tokenizer, tok, piece));
    m.generation_us.fetch_add(t1.elapsed().as_micros() as u64, Relaxed);
    let st = s.sp.stats();
    m.drafted_tokens.fetch_add(st.drafted, Relaxed);
    m.accepted_tokens.fetch_add(st.accepted, Relaxed);
    match res {
        Ok(_) => true,
        Err(err) => {
            if !r.gone {
                r.fail(format!("generating token {}: {err}", r.n + 1));
            }
            false
        }
    }
}

/// Holds back text that could be the start of a stop string, and cuts the text at the
/// first stop string.
pub struct StopMatcher<'a> {
    stops: &'a [String],
    held: String,
}

impl<'a> StopMatcher<'a> {
    /// A matcher for `stops` (none empty).
    pub fn new(stops: &'a [String]) -> Self {
        StopMatcher { stops, held: String::new() }
    }

    /// Adds `text`; returns the text that can be sent now and whether a stop string was
    /// found (then the text before it is returned and nothing more may follow).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if let Some(i) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let out = self.held[..i].to_string();
            self.held.clear();
            return (out, true);
        }
        let keep = self.stops.iter().map(|s| suffix_prefix(&self.held, s)).max().unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }
}

/// The longest suffix of `text` that is a proper prefix of `stop`, in bytes.
fn suffix_prefix(text: &str, stop: &str) -> usize {
    (1..stop.len().min(text.len() + 1)).rev().find(|&k| stop.is_char_boundary(k) && text.ends_with(&stop[..k])).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let (o, hit) = m.push(p);
            out.push_str(&o);
            if hit {
                return (out, true);
            }
        }
        out.push_str(&m.held);
        (out, false)
    }

    #[test]
    fn stop_strings_cut_across_pieces() {
        assert_eq!(run(&["\n\n"], &["Hello", "\n", "\nWorld"]), ("Hello".into(), true));
        assert_eq!(run(&["END"], &["abc E", "N", "x"]), ("abc ENx".into(), false));
        assert_eq!(run(&["END", "b"], &["aEN", "D b"]), ("a".into(), true));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&["é!"], &["caf", "é", "!"]), ("caf".into(), true));
    }
}

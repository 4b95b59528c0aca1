//! The slots: one thread per slot, each owning an engine built in its own arena (planned
//! and allocated at start), taking requests from one bounded queue and sending the
//! generated text to the HTTP task through a bounded channel. A send that fails means the
//! client went away: the slot stops at that token and takes the next request.

use super::api::Usage;
use super::metrics::Metrics;
use crate::cli::common::check_finite;
use crate::mmap::Arena;
use crate::pool::ThreadPool;
use keel_core::engine::Engine;
use keel_core::gguf::Gguf;
use keel_core::sampler::SamplerConfig;
use keel_core::session::{Outputs, SessionConfig};
use keel_core::tokenizer::Utf8Stream;
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
}

/// Starts a slot's thread: it builds its engine and pool, reports on `ready`, then serves
/// jobs from `jobs` until the queue closes.
pub fn spawn(setup: SlotSetup, jobs: Arc<Mutex<Receiver<Job>>>, metrics: Arc<Metrics>, ready: std::sync::mpsc::Sender<anyhow::Result<()>>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name(format!("keel-slot-{}", setup.index)).spawn(move || {
        let SlotSetup { index, gguf, mut arena, cfg, reference, llama_cpp_batches } = setup;
        let pool = match ThreadPool::new(cfg.n_threads) {
            Ok(p) => p,
            Err(e) => {
                let _ = ready.send(Err(anyhow::anyhow!("slot {index}: starting its thread pool: {e}")));
                return;
            }
        };
        let mut e = match Engine::new(&gguf, arena.as_mut_slice(), cfg, crate::cli::load::kernels(reference), SamplerConfig::default()) {
            Ok(e) => e,
            Err(err) => {
                let _ = ready.send(Err(anyhow::anyhow!("slot {index}: {err}")));
                return;
            }
        };
        e.session.set_llama_cpp_batches(llama_cpp_batches);
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
            serve_one(&mut e, &pool, &job, &mut piece, &metrics);
            metrics.slots_busy.fetch_sub(1, Relaxed);
            drop(job);
        }
    })
}

/// Generates one request's reply, sending it piece by piece.
fn serve_one(e: &mut Engine<'_>, pool: &ThreadPool, job: &Job, piece: &mut [u8], m: &Metrics) {
    let p = &job.params;
    let cancelled = || {
        m.requests_cancelled.fetch_add(1, Relaxed);
    };
    if job.tx.is_closed() {
        return cancelled();
    }
    let fail = |msg: String| {
        m.requests_failed.fetch_add(1, Relaxed);
        let _ = job.tx.blocking_send(Event::Error(msg));
    };
    e.reset();
    e.sampler.set_config(SamplerConfig { temp: p.temp, top_k: 0, top_p: p.top_p, min_p: 0.0, repeat_penalty: 1.0, repeat_last_n: 0, seed: p.seed });
    let t0 = Instant::now();
    if let Err(err) = e.eval(&job.tokens, Outputs::Last, pool) {
        return fail(format!("evaluating the prompt: {err}"));
    }
    m.prompt_tokens.fetch_add(job.tokens.len() as u64, Relaxed);
    m.prompt_us.fetch_add(t0.elapsed().as_micros() as u64, Relaxed);
    let t1 = Instant::now();
    let n_ctx = e.session.n_ctx();
    let mut stream = Utf8Stream::new();
    let mut stop = StopMatcher::new(&p.stop);
    let mut finish = "length";
    let mut n = 0usize;
    let mut hit = false;
    let result: Result<(), ()> = (|| {
        while n < p.max_tokens {
            if let Err(err) = check_finite(e.session.last_logits(e.n_vocab()), e.session.first_non_finite(), || format!("generated token {}", n + 1)) {
                fail(format!("{err:#}"));
                return Err(());
            }
            let tok = e.sample();
            if e.tokenizer.is_eog(tok) {
                finish = "stop";
                break;
            }
            n += 1;
            m.generated_tokens.fetch_add(1, Relaxed);
            let len = e.tokenizer.piece(tok, false, piece).unwrap_or(0);
            let mut text = String::new();
            stream.push(&piece[..len], |s: &str| text.push_str(s));
            let (out, matched) = stop.push(&text);
            if !out.is_empty() && job.tx.blocking_send(Event::Text(out)).is_err() {
                cancelled();
                return Err(());
            }
            if matched {
                finish = "stop";
                hit = true;
                break;
            }
            if n >= p.max_tokens || e.session.n_past() >= n_ctx {
                break;
            }
            if let Err(err) = e.eval(&[tok], Outputs::Last, pool) {
                fail(format!("generating token {}: {err}", n + 1));
                return Err(());
            }
        }
        Ok(())
    })();
    m.generation_us.fetch_add(t1.elapsed().as_micros() as u64, Relaxed);
    if result.is_err() {
        return;
    }
    if !hit {
        let mut text = String::new();
        stream.finish(|s: &str| text.push_str(s));
        let (mut out, matched) = stop.push(&text);
        if matched {
            finish = "stop";
        } else {
            out.push_str(&stop.held);
        }
        if !out.is_empty() && job.tx.blocking_send(Event::Text(out)).is_err() {
            return cancelled();
        }
    }
    m.requests_completed.fetch_add(1, Relaxed);
    let usage = Usage { prompt_tokens: job.tokens.len(), completion_tokens: n, total_tokens: job.tokens.len() + n };
    let _ = job.tx.blocking_send(Event::Done { finish, usage });
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

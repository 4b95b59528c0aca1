//! Counters for `GET /metrics` (Prometheus text format) and `GET /health`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// The server's counters; every field is updated without locks.
#[derive(Default, Debug)]
pub struct Metrics {
    /// Generation requests admitted to a slot or the queue.
    pub requests_admitted: AtomicU64,
    /// Requests refused with 503 (slots busy, queue full).
    pub requests_rejected: AtomicU64,
    /// Requests refused with another 4xx (bad JSON, prompt too long, unknown model, …).
    pub requests_invalid: AtomicU64,
    /// Requests whose generation ran to its end.
    pub requests_completed: AtomicU64,
    /// Requests whose client went away before the end (the slot was freed).
    pub requests_cancelled: AtomicU64,
    /// Requests that failed in the model (500).
    pub requests_failed: AtomicU64,
    /// Prompt tokens evaluated.
    pub prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub generated_tokens: AtomicU64,
    /// Microseconds spent generating (after the prompt), summed over slots.
    pub generation_us: AtomicU64,
    /// Microseconds spent on prompts, summed over slots.
    pub prompt_us: AtomicU64,
    /// Admitted requests not yet finished (waiting or in a slot).
    pub in_flight: AtomicUsize,
    /// Tokens drafted by speculative decoding (`--lookup`, `--draft-model`).
    pub drafted_tokens: AtomicU64,
    /// Drafted tokens the target accepted.
    pub accepted_tokens: AtomicU64,
    /// Slots generating now.
    pub slots_busy: AtomicUsize,
}

impl Metrics {
    /// Requests waiting for a slot.
    pub fn queue_depth(&self) -> usize {
        self.in_flight.load(Relaxed).saturating_sub(self.slots_busy.load(Relaxed))
    }

    /// The Prometheus text exposition.
    pub fn render(&self, slots: usize, queue: usize) -> String {
        let mut s = String::with_capacity(2048);
        let mut put = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(s, "# HELP keel_{name} {help}\n# TYPE keel_{name} {kind}\nkeel_{name} {value}");
        };
        let c = |a: &AtomicU64| a.load(Relaxed).to_string();
        put("requests_admitted_total", "counter", "Generation requests admitted to a slot or the queue.", c(&self.requests_admitted));
        put("requests_rejected_total", "counter", "Requests refused with 503 because every slot was busy and the queue full.", c(&self.requests_rejected));
        put("requests_invalid_total", "counter", "Requests refused with a 4xx error.", c(&self.requests_invalid));
        put("requests_completed_total", "counter", "Requests whose generation ran to its end.", c(&self.requests_completed));
        put("requests_cancelled_total", "counter", "Requests whose client disconnected before the end.", c(&self.requests_cancelled));
        put("requests_failed_total", "counter", "Requests that failed in the model (500).", c(&self.requests_failed));
        put("prompt_tokens_total", "counter", "Prompt tokens evaluated.", c(&self.prompt_tokens));
        put("generated_tokens_total", "counter", "Tokens generated.", c(&self.generated_tokens));
        let gen_s = self.generation_us.load(Relaxed) as f64 / 1e6;
        let prompt_s = self.prompt_us.load(Relaxed) as f64 / 1e6;
        put("generation_seconds_total", "counter", "Seconds slots spent generating, summed over slots.", format!("{gen_s:.6}"));
        put("prompt_seconds_total", "counter", "Seconds slots spent evaluating prompts, summed over slots.", format!("{prompt_s:.6}"));
        let tps = if gen_s > 0.0 { self.generated_tokens.load(Relaxed) as f64 / gen_s } else { 0.0 };
        put("generation_tokens_per_second", "gauge", "Generated tokens per second of slot time (generated_tokens_total / generation_seconds_total).", format!("{tps:.3}"));
        put("speculative_drafted_tokens_total", "counter", "Tokens drafted by speculative decoding (--lookup, --draft-model; 0 without).", c(&self.drafted_tokens));
        put("speculative_accepted_tokens_total", "counter", "Drafted tokens the model accepted.", c(&self.accepted_tokens));
        put("queue_depth", "gauge", "Requests waiting for a slot.", self.queue_depth().to_string());
        put("queue_capacity", "gauge", "Most requests that may wait for a slot (--queue).", queue.to_string());
        put("slots_busy", "gauge", "Slots generating now.", self.slots_busy.load(Relaxed).to_string());
        put("slots_total", "gauge", "Slots (--slots).", slots.to_string());
        s
    }
}

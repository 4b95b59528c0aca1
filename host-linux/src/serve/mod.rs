//! `keel serve`: an OpenAI-compatible HTTP server with a fixed number of slots.
//!
//! Memory is static as everywhere else in keel: the model file is mapped once and shared;
//! each of the `--slots` slots gets its own arena, planned and allocated at start (its
//! engine's KV cache, activations and sampler); the HTTP side has one more tokenizer
//! index. The total is printed before the server listens. Inference runs on the slots'
//! own threads (not the HTTP runtime's); each request's text travels to its HTTP task
//! through a bounded channel. Requests beyond the slots wait in a bounded queue
//! (`--queue`); beyond that the server answers 503 with `Retry-After`. A client that goes
//! away frees its slot at the next token.
//!
//! Routes (see [`http`]): `POST /v1/chat/completions`, `POST /v1/completions` (both
//! streaming by server-sent events or not), `GET /v1/models`, `GET /health`,
//! `GET /metrics` (Prometheus text).

pub mod api;
pub mod http;
pub mod metrics;
pub mod slot;

use crate::cli::common::{mib, MAX_THREADS, MAX_TOKENS};
use crate::cli::load::{self, RunOptions};
use crate::mmap::Arena;
use anyhow::{bail, Context, Result};
use keel_core::chat::ChatFormat;
use keel_core::gguf::Gguf;
use keel_core::tokenizer::Tokenizer;
use std::sync::{Arc, Mutex};

/// Most slots `--slots` takes.
pub const MAX_SLOTS: usize = 256;

/// `keel serve`'s flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Model: a .gguf path or a known name (fetched on first use); its id in the API is
    /// the name or the file's stem.
    #[arg(short = 'm', long, default_value = "smollm2-135m")]
    pub model: String,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Requests generated at once, each slot with its own arena planned at start.
    #[arg(long, default_value_t = 1)]
    pub slots: usize,
    /// Context length of each slot, in tokens (prompt plus reply).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 2048)]
    pub ctx_size: usize,
    /// Tokens per forward pass when evaluating a prompt.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: usize,
    /// Threads per slot (default: this machine's CPUs divided among the slots).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Requests that may wait for a slot; beyond them the server answers 503 with
    /// Retry-After.
    #[arg(long, default_value_t = 8)]
    pub queue: usize,
    /// `--batches invariant|llama-cpp` (default invariant).
    #[command(flatten)]
    pub batches: crate::cli::common::BatchesFlag,
    /// Largest request body (bytes; K, M, KiB, MiB suffixes); larger ones get 413.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    pub body_limit: usize,
    /// Devices to run on: only `cpu` for the server so far; llama.cpp's -dev is read as --device
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Scalar reference kernels instead of the fastest for this CPU.
    #[arg(long)]
    pub reference: bool,
    /// No warning for a context beyond the model's training length.
    #[arg(long)]
    pub force_ctx: bool,
    /// Speculative decoding in every slot (`--lookup N`, `--draft-model M`).
    #[command(flatten)]
    pub spec: crate::cli::speculate::SpecFlags,
}

/// A byte count: a number with an optional K/M/G (×1000) or KiB/MiB/GiB (×1024) suffix.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        u => return Err(format!("unknown unit '{u}' in '{s}': use bytes or K, M, G, KiB, MiB, GiB")),
    };
    let n: usize = num.parse().map_err(|_| format!("'{s}' is not a size: e.g. 1048576, 1MiB, 512K"))?;
    n.checked_mul(mult).filter(|&b| b > 0).ok_or_else(|| format!("'{s}': the size must be above 0 and fit in memory"))
}

/// The model's id in the API: the name given, or the file's stem for a path.
fn model_id(arg: &str) -> String {
    let p = std::path::Path::new(arg);
    match p.extension() {
        Some(e) if e == "gguf" => p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| arg.to_string()),
        _ => p.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| arg.to_string()),
    }
}

/// Runs the server until interrupted.
pub fn main(args: ServeArgs) -> Result<()> {
    if args.slots == 0 || args.slots > MAX_SLOTS {
        bail!("--slots {}: use 1..={MAX_SLOTS}", args.slots);
    }
    if args.ctx_size < 2 || args.ctx_size > MAX_TOKENS {
        bail!("-c {}: must be between 2 and {MAX_TOKENS} tokens", args.ctx_size);
    }
    if args.batch_size == 0 || args.batch_size > MAX_TOKENS {
        bail!("-b {}: must be between 1 and {MAX_TOKENS} tokens", args.batch_size);
    }
    if args.queue > 1 << 16 {
        bail!("--queue {}: use 0..=65536", args.queue);
    }
    if args.device != "cpu" {
        bail!("--device {}: keel serve runs on the CPU so far (--device cpu); device offload is `keel run --device`", args.device);
    }
    let cpus = crate::pool::ThreadPool::default_threads();
    let threads = args.threads.unwrap_or((cpus / args.slots).max(1));
    if threads == 0 || threads > MAX_THREADS {
        bail!("-t {threads}: use -t 1..={MAX_THREADS} threads per slot");
    }
    let spec = crate::cli::speculate::SpecOptions::from_flags(&args.spec)?;
    if let Some(list) = args.spec.device_draft.as_deref().filter(|l| !crate::device::offload::parse_device_list(l).is_ok_and(|d| d.is_empty())) {
        bail!("--device-draft {list}: keel serve runs on the CPU so far (drop --device-draft); a draft model on a device is `keel run --device-draft`");
    }
    // A verify batch needs logits for the pending token and every draft.
    let n_outputs = spec.as_ref().map_or(1, |s| (s.n_max + 1).min(args.ctx_size));
    let opts = RunOptions { n_ctx: args.ctx_size, n_batch: args.batch_size, n_outputs, threads, reference: args.reference, force_ctx: args.force_ctx };

    // The server lives until the process ends: the mapped model and the arenas are kept
    // for its whole life ('static), shared by the slot threads and the HTTP tasks.
    let opened: &'static load::Opened = Box::leak(Box::new(load::open_for_cpu(&args.model, args.reference, threads)?));
    let g: Gguf<'static> = opened.gguf()?;
    let path = &opened.path;
    let cfg = load::session_config(&opts);
    // With speculation the arena has room to rewind (a recurrent model's checkpoint).
    let plan_bytes = keel_core::engine::plan_with(&g, &cfg, spec.is_some()).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?.total_bytes();
    let tok_bytes = Tokenizer::memory_bytes(&g).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let model_bytes = opened.file.bytes().len();
    // Speculation's own memory per slot: the speculator's arena and a draft model's.
    let draft: Option<(&'static load::Opened, keel_core::session::SessionConfig, usize)> = match spec.as_ref().and_then(|s| s.draft_model.as_deref()) {
        Some(m) => {
            let o: &'static load::Opened = Box::leak(Box::new(load::open_for_cpu(m, args.reference, threads)?));
            let dcfg = load::session_config(&RunOptions { n_outputs: 1, ..opts });
            let bytes = keel_core::engine::plan_with(&o.gguf()?, &dcfg, true).map_err(|e| anyhow::anyhow!("{}: {e}", o.path.display()))?.total_bytes();
            Some((o, dcfg, bytes))
        }
        None => None,
    };
    let spec_bytes = match &spec {
        Some(s) => {
            let n_vocab = keel_core::model::HParams::from_gguf(&g).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?.n_vocab;
            let mut p = keel_core::arena::Plan::empty();
            keel_core::speculative::plan(&mut p, n_vocab, opts.n_ctx, s.n_max)?;
            p.total_bytes()
        }
        None => 0,
    };
    let slot_bytes = plan_bytes + spec_bytes + draft.as_ref().map_or(0, |d| d.2);
    let draft_file_bytes = draft.as_ref().map_or(0, |d| d.0.file.bytes().len());
    let arenas = slot_bytes.checked_mul(args.slots).context("the arenas' total overflows")?;
    let total = (model_bytes + draft_file_bytes) as u64 + arenas as u64 + tok_bytes as u64;
    if let Some(mem) = crate::mem::physical_memory().filter(|&m| (arenas + tok_bytes) as u64 > m) {
        bail!("{}: {} slots × {} arena for -c {} need {} but this machine has {} of physical memory; lower --slots or -c", path.display(), args.slots, mib(slot_bytes as u64), args.ctx_size, mib(arenas as u64), mib(mem));
    }
    load::warn_past_training_context(&g, &opts);

    // The HTTP side's tokenizer (requests are checked and tokenized before they queue).
    let tok_arena: &'static mut Arena = Box::leak(Box::new(Arena::new(tok_bytes.max(1)).context("allocating the tokenizer's arena")?));
    let tokenizer: &'static Tokenizer<'static> = Box::leak(Box::new(Tokenizer::new(&g, &mut tok_arena.as_mut_slice()[..tok_bytes]).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?));
    let format = ChatFormat::for_model(&g).map_err(|e| e.to_string());

    // The slots: every arena allocated here, before listening.
    let metrics = Arc::new(metrics::Metrics::default());
    let (jobs_tx, jobs_rx) = std::sync::mpsc::sync_channel(args.slots + args.queue);
    let jobs_rx = Arc::new(Mutex::new(jobs_rx));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    for index in 0..args.slots {
        let arena = Arena::new(plan_bytes).with_context(|| format!("allocating slot {index}'s {plan_bytes} byte arena"))?;
        let gguf = opened.gguf()?;
        let spec = match &spec {
            Some(s) => Some(slot::SpecSetup {
                n_max: s.n_max,
                fixed: s.fixed,
                arena: Arena::new(spec_bytes.max(1)).with_context(|| format!("allocating slot {index}'s {spec_bytes} byte speculation arena"))?,
                draft: match &draft {
                    Some((o, dcfg, bytes)) => Some(slot::DraftSetup {
                        gguf: o.gguf()?,
                        arena: Arena::new(*bytes).with_context(|| format!("allocating slot {index}'s {bytes} byte draft-model arena"))?,
                        cfg: *dcfg,
                        path: o.path.clone(),
                        target_path: path.clone(),
                    }),
                    None => None,
                },
            }),
            None => None,
        };
        let setup = slot::SlotSetup { index, gguf, arena, cfg, reference: args.reference, llama_cpp_batches: args.batches.batches.llama_cpp(), spec };
        slot::spawn(setup, jobs_rx.clone(), metrics.clone(), ready_tx.clone()).context("starting a slot thread")?;
    }
    drop(ready_tx);
    for _ in 0..args.slots {
        ready_rx.recv().context("a slot thread ended while starting")??;
    }
    let id = model_id(&args.model);
    eprintln!(
        "keel serve: {} as '{id}' ({}), {} slot{} × -c {} ({} threads each, {} kernels)",
        path.display(),
        format.as_ref().map(|f| f.name()).unwrap_or("no chat format"),
        args.slots,
        if args.slots == 1 { "" } else { "s" },
        args.ctx_size,
        threads,
        load::kernels(args.reference).name()
    );
    let spec_note = match (&spec, &draft) {
        (Some(s), Some((o, _, bytes))) => format!(" (engine {} + speculation {} + draft model {} for {}, mapped {})", mib(plan_bytes as u64), mib(spec_bytes as u64), mib(*bytes as u64), o.path.display(), mib(draft_file_bytes as u64)) + &format!("; speculative decoding: draft model, up to {} tokens per step{}", s.n_max, if s.fixed { ", fixed" } else { ", adaptive" }),
        (Some(s), None) => format!(" (engine {} + speculation {})", mib(plan_bytes as u64), mib(spec_bytes as u64)) + &format!("; speculative decoding: prompt lookup, up to {} tokens per step{}", s.n_max, if s.fixed { ", fixed" } else { ", adaptive" }),
        _ => String::new(),
    };
    eprintln!(
        "keel serve: memory plan: model {} (mapped) + {} × arena {} + tokenizer {} = {} ({total} bytes); queue {}, body limit {} bytes{spec_note}",
        mib(model_bytes as u64 + draft_file_bytes as u64),
        args.slots,
        mib(slot_bytes as u64),
        mib(tok_bytes as u64),
        mib(total),
        args.queue,
        args.body_limit
    );
    let created = std::fs::metadata(path).and_then(|m| m.modified()).ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs());
    let state = Arc::new(http::AppState { model_id: id, created, tokenizer, format, n_ctx: args.ctx_size, slots: args.slots, queue: args.queue, jobs: jobs_tx, metrics, body_limit: args.body_limit });

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("keel-http").enable_all().build().context("starting the HTTP runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port)).await.with_context(|| format!("listening on {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        eprintln!("keel serve: listening on http://{addr}");
        axum::serve(listener, http::router(state))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .context("serving")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_ids() {
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("512K"), Ok(512_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("0").is_err());
        assert!(parse_size("1 parsec").is_err());
        assert_eq!(model_id("smollm2-135m"), "smollm2-135m");
        assert_eq!(model_id("/m/SmolLM2-135M-Instruct.Q4_1.gguf"), "SmolLM2-135M-Instruct.Q4_1");
    }
}

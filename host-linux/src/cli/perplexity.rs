//! `keel perplexity`: llama.cpp's method exactly. The text is tokenized once (with BOS when
//! the model adds one), cut into consecutive chunks of `n_ctx` tokens (a tail that does not
//! fill a chunk is dropped); a chunk's first token becomes BOS when the model adds BOS;
//! only the second half of each chunk is scored: for j in n_ctx/2 .. n_ctx-1, the
//! negative log-likelihood of token j+1 under the logits at j. Each chunk is one batch
//! evaluated with llama.cpp's tiled attention arithmetic (as llama.cpp does for batches of
//! 64+ tokens), so the figure is llama.cpp's (`--batches llama-cpp`, the default here);
//! `--batches invariant` (or its older spelling `--batch-invariant`) uses keel's one-query
//! arithmetic instead.

use super::common::{check_finite, read_text_limited, token_count, tokenize_all, Batches, ModelFlag, RunFlags, MAX_TEXT_FILE};
use super::load::{engine, open_for_cpu, prepare};
use serde::Serialize;
use anyhow::{bail, Result};
use keel_core::sampler::SamplerConfig;
use keel_core::session::Outputs;

/// `keel perplexity`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Each chunk is one batch. The default --batches llama-cpp makes the figure llama.cpp's (its tiled attention arithmetic for batches of 64+ tokens and its per-batch matmul kernels), so it stays comparable with llama-perplexity; --batches invariant (or the older spelling --batch-invariant) uses keel's one-query arithmetic.")]
pub struct PerplexityArgs {
    /// The model (`-m`).
    #[command(flatten)]
    pub model: ModelFlag,
    /// The text to score (- reads standard input; at most 256 MiB)
    #[arg(short = 'f', long = "file", value_name = "FILE", required = true)]
    pub file: String,
    /// Chunk length in tokens (at least 4)
    #[arg(short = 'c', long = "ctx-size", value_name = "N", default_value_t = 512)]
    pub ctx_size: usize,
    /// Arithmetic of each chunk's batch: llama-cpp (the default here, so the figure is llama.cpp's) or invariant
    #[arg(long = "batches", value_enum, value_name = "MODE", default_value_t = Batches::LlamaCpp)]
    pub batches: Batches,
    /// Same as --batches invariant (the flag's older spelling)
    #[arg(long = "batch-invariant", conflicts_with = "batches")]
    pub batch_invariant: bool,
    /// Print one JSON object: {"ppl","n_chunks","n_ctx","per_chunk_running","seconds"}
    #[arg(long = "json")]
    pub json: bool,
    /// The run limits (`-b`, `-t`, `--reference`, `--force-ctx`).
    #[command(flatten)]
    pub run: RunFlags,
}

/// `keel perplexity --json`.
#[derive(Serialize)]
struct PerplexityJson<'a> {
    ppl: f64,
    n_chunks: usize,
    n_ctx: usize,
    per_chunk_running: &'a [f64],
    seconds: f64,
    batches: &'static str,
}

/// Runs the subcommand.
pub fn main(a: PerplexityArgs) -> Result<()> {
    let model = a.model.model.clone();
    let file = a.file.clone();
    let as_json = a.json;
    let c = token_count("-c", a.ctx_size)?;
    let invariant = a.batch_invariant || a.batches == Batches::Invariant;
    let mut opts = a.run.options(c, 1)?;
    if c < 4 {
        bail!("-c must be at least 4 for perplexity");
    }
    opts.n_ctx = c;
    opts.n_outputs = c;
    let text = read_text_limited(&file, "text file", MAX_TEXT_FILE, "the most keel reads for perplexity; cut the text")?;
    let opened = open_for_cpu(&model, opts.reference, opts.threads)?;
    let g = opened.gguf()?;
    let mut loaded = prepare(&g, &opened.path, &opts)?;
    let (mut e, pool) = engine(&g, &opened.path, &mut loaded, opts.reference, SamplerConfig::default())?;
    e.session.set_llama_cpp_batches(!invariant);
    let tokens = tokenize_all(&e.tokenizer, &text, true, false)?;
    let n_chunks = tokens.len() / c;
    if n_chunks == 0 {
        bail!("{file} has {} tokens, fewer than one chunk of {c}", tokens.len());
    }
    let bos = if e.tokenizer.add_bos() { e.tokenizer.bos() } else { None };
    let v = e.n_vocab();
    let (mut nll, mut count) = (0.0f64, 0usize);
    let mut running = Vec::with_capacity(n_chunks);
    let t0 = std::time::Instant::now();
    for ch in 0..n_chunks {
        let mut chunk = tokens[ch * c..(ch + 1) * c].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        e.reset();
        e.eval(&chunk, Outputs::All, pool)?;
        let origin = e.session.first_non_finite();
        let logits = e.session.logits(v);
        for j in c / 2..c - 1 {
            let row = &logits[j * v..(j + 1) * v];
            check_finite(row, origin, || format!("chunk {} position {j}", ch + 1))?;
            let target = tokens[ch * c + j + 1] as usize;
            nll += keel_core::ops::log_sum_exp(row) - row[target] as f64;
            count += 1;
        }
        let ppl = (nll / count as f64).exp();
        running.push(ppl);
        if !as_json {
            eprint!("[{}]{:.4} ", ch + 1, ppl);
        }
    }
    let ppl = (nll / count as f64).exp();
    if as_json {
        crate::cli::print_json(&PerplexityJson { ppl, n_chunks, n_ctx: c, per_chunk_running: &running, seconds: t0.elapsed().as_secs_f64(), batches: if invariant { "invariant" } else { "llama-cpp" } });
    } else {
        eprintln!();
        println!("perplexity: {ppl:.4} over {n_chunks} chunks of {c} tokens ({:.1} s)", t0.elapsed().as_secs_f64());
    }
    Ok(())
}

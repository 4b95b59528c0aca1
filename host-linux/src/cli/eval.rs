//! `keel eval`: evaluate a prompt in one batch and print, per position, the log-sum-exp
//! and the top logits; optionally dump the last row.

use super::common::{check_finite, prompt_file_limit, read_text_limited, tokenize, ModelFlag, PromptFlags, EvalFlags};
use super::load::{engine, open_for_cpu, prepare};
use serde::Serialize;
use anyhow::{bail, Context, Result};
use keel_core::sampler::SamplerConfig;
use keel_core::session::Outputs;

/// `keel eval`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Output (always JSON): {\"tokens\":[..],\"positions\":[{\"lse\":x,\"top\":[[id,logit],..]},..]}. --batches llama-cpp gives llama.cpp's logits for the same batch.")]
pub struct EvalArgs {
    /// The model (`-m`).
    #[command(flatten)]
    pub model: ModelFlag,
    /// The prompt (`-p`, `-f`, `-e`).
    #[command(flatten)]
    pub prompt: PromptFlags,
    /// Evaluate these token ids (a JSON array in FILE; - reads standard input) instead of a prompt
    #[arg(long = "tokens-file", value_name = "FILE")]
    pub tokens_file: Option<String>,
    /// Top logits printed per position
    #[arg(long = "top-k", value_name = "K", default_value_t = 10)]
    pub top_k: usize,
    /// Write the last position's logits to FILE as little-endian f32
    #[arg(long = "dump-last", value_name = "FILE")]
    pub dump_last: Option<String>,
    /// JSON output (the only output eval has; accepted for scripts that pass it)
    #[arg(long = "json")]
    pub json: bool,
    /// `-c`, the run limits, `--batches`.
    #[command(flatten)]
    pub eval: EvalFlags,
}

/// `keel eval`'s output.
#[derive(Serialize)]
struct EvalJson<'a> {
    tokens: &'a [u32],
    positions: Vec<Position>,
}

/// One position: the log-sum-exp of its row and its top logits as `[id, logit]`.
#[derive(Serialize)]
struct Position {
    lse: f64,
    top: Vec<(u32, f32)>,
}

/// Runs the subcommand.
pub fn main(a: EvalArgs) -> Result<()> {
    let model = a.model.model.clone();
    let tokens_file = a.tokens_file.clone();
    let top_k = a.top_k;
    let dump = a.dump_last.clone();
    let mut opts = a.eval.options(1)?;
    let text = if tokens_file.is_none() { Some(a.prompt.text(opts.n_ctx)?) } else { None };
    let opened = open_for_cpu(&model, opts.reference, opts.threads)?;
    if let Some(d) = &dump {
        crate::fsutil::refuse_own_input(&opened.path, std::path::Path::new(d), "--dump-last")?;
    }
    let g = opened.gguf()?;
    let ids_from_file = match &tokens_file {
        Some(f) => {
            let raw = read_text_limited(f, "tokens file", prompt_file_limit(opts.n_ctx), &format!("the most a list of -c {} token ids can take; shorten the file or raise -c", opts.n_ctx))?;
            let v: Vec<u32> = serde_json::from_str(&raw).with_context(|| format!("{f}: expected a JSON array of token ids"))?;
            Some(v)
        }
        None => None,
    };
    // Every position produces logits: size the outputs to the prompt.
    let upper = ids_from_file.as_ref().map(|v| v.len()).unwrap_or_else(|| text.as_ref().map_or(1, |t| t.len() + 8));
    opts.n_outputs = upper.clamp(1, opts.n_ctx);
    let mut loaded = prepare(&g, &opened.path, &opts)?;
    let (mut e, pool) = engine(&g, &opened.path, &mut loaded, opts.reference, SamplerConfig::default())?;
    e.session.set_llama_cpp_batches(a.eval.llama_cpp());
    let ids = match (ids_from_file, &text) {
        (Some(v), _) => v,
        (None, Some(t)) => tokenize(&e.tokenizer, t, true, true, opts.n_ctx)?,
        (None, None) => bail!("no prompt"),
    };
    if ids.is_empty() {
        bail!("nothing to evaluate: the prompt has no tokens");
    }
    if ids.len() > opts.n_ctx {
        bail!("the prompt has {} tokens but the context holds {}; raise -c", ids.len(), opts.n_ctx);
    }
    let v = e.n_vocab();
    let logits = e.eval(&ids, Outputs::All, pool)?.to_vec();
    let origin = e.session.first_non_finite();
    for (i, row) in logits.chunks_exact(v).take(ids.len()).enumerate() {
        check_finite(row, origin, || format!("prompt position {i}"))?;
    }
    if let Some(path) = dump {
        let last = &logits[(ids.len() - 1) * v..ids.len() * v];
        let bytes: Vec<u8> = last.iter().flat_map(|x| x.to_le_bytes()).collect();
        crate::fsutil::write_atomic(std::path::Path::new(&path), &bytes)?;
    }
    let positions = (0..ids.len())
        .map(|i| {
            let row = &logits[i * v..(i + 1) * v];
            let lse = keel_core::ops::log_sum_exp(row);
            let mut idx: Vec<u32> = (0..v as u32).collect();
            let k = top_k.min(v);
            idx.select_nth_unstable_by(k.saturating_sub(1), |&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
            idx.truncate(k);
            idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
            Position { lse, top: idx.iter().map(|&id| (id, row[id as usize])).collect() }
        })
        .collect();
    crate::cli::print_json(&EvalJson { tokens: &ids, positions });
    Ok(())
}

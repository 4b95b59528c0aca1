//! `keel perplexity`: llama.cpp's method exactly. The text is tokenized once (with BOS when
//! the model adds one), cut into consecutive chunks of `n_ctx` tokens (a tail that does not
//! fill a chunk is dropped); a chunk's first token becomes BOS when the model adds BOS;
//! only the second half of each chunk is scored: for j in n_ctx/2 .. n_ctx-1, the
//! negative log-likelihood of token j+1 under the logits at j. Each chunk is one batch
//! evaluated with llama.cpp's tiled attention arithmetic (as llama.cpp does for batches of
//! 64+ tokens), so the figure is llama.cpp's; `--batch-invariant` uses keel's one-query
//! arithmetic instead.

use super::args::Args;
use super::common::{check_finite, read_text_limited, run_options, token_count, tokenize_all, MAX_TEXT_FILE};
use super::load::{engine, open, prepare};
use crate::json;
use anyhow::{bail, Result};
use keel_core::sampler::SamplerConfig;
use keel_core::session::Outputs;

/// Runs the subcommand.
pub fn main(mut a: Args) -> Result<()> {
    let model = a.value::<String>(&["-m", "--model"], "a model file or name")?.unwrap_or_else(|| "smollm2-135m".into());
    let file: String = a.value(&["-f", "--file"], "a text file")?.ok_or_else(|| anyhow::anyhow!("perplexity needs -f FILE"))?;
    let as_json = a.flag(&["--json"]);
    let c = token_count(&mut a, &["-c", "--ctx-size"], "a chunk length in tokens", 512)?;
    // llama.cpp evaluates each chunk as one batch with its tiled attention arithmetic;
    // keel does the same unless asked for its batch-invariant one-query arithmetic.
    let invariant = a.flag(&["--batch-invariant"]);
    let mut opts = run_options(&mut a, 1)?;
    a.finish()?;
    if c < 4 {
        bail!("-c must be at least 4 for perplexity");
    }
    opts.n_ctx = c;
    opts.n_outputs = c;
    let text = read_text_limited(&file, "text file", MAX_TEXT_FILE, "the most keel reads for perplexity; cut the text")?;
    let opened = open(&model)?;
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
        let mut o = json::Object::new();
        o.f64("ppl", ppl).u64("n_chunks", n_chunks as u64).u64("n_ctx", c as u64);
        o.arr("per_chunk_running", |arr| {
            for &p in &running {
                arr.f64(p);
            }
        });
        o.f64("seconds", t0.elapsed().as_secs_f64());
        o.print();
    } else {
        eprintln!();
        println!("perplexity: {ppl:.4} over {n_chunks} chunks of {c} tokens ({:.1} s)", t0.elapsed().as_secs_f64());
    }
    Ok(())
}

//! Pieces several subcommands share: prompt input, tokenizing with a clear length error,
//! the run options flags, and the memory report.

use super::args::Args;
use super::load::RunOptions;
use anyhow::{bail, Context, Result};
use keel_core::tokenizer::{Tokenizer, TokenizerError};

/// Reads the prompt from `-p TEXT` or `-f FILE` (one of them required).
pub fn prompt(a: &mut Args) -> Result<String> {
    let p: Option<String> = a.value(&["-p", "--prompt"], "the prompt text")?;
    let f: Option<String> = a.value(&["-f", "--file"], "a prompt file")?;
    match (p, f) {
        (Some(p), None) => Ok(p),
        (None, Some(f)) => std::fs::read_to_string(&f).with_context(|| format!("reading prompt file {f}")),
        (Some(_), Some(_)) => bail!("give the prompt with -p or -f, not both"),
        (None, None) => bail!("no prompt: give -p TEXT or -f FILE"),
    }
}

/// The run-limit flags: `-c`, `-b`, `-t`, `--reference`.
pub fn run_options(a: &mut Args, n_outputs: usize) -> Result<RunOptions> {
    let n_ctx = a.value_or(&["-c", "--ctx-size"], "a context length in tokens", 2048usize)?;
    let n_batch = a.value_or(&["-b", "--batch-size"], "a batch size in tokens", 512usize)?;
    let threads = a.value_or(&["-t", "--threads"], "a thread count", crate::pool::ThreadPool::default_threads())?;
    let reference = a.flag(&["--reference"]);
    if n_ctx == 0 || n_batch == 0 || threads == 0 {
        bail!("-c, -b and -t must be at least 1");
    }
    Ok(RunOptions { n_ctx, n_batch, n_outputs: n_outputs.max(1), threads, reference })
}

/// Tokenizes `text`; if it does not fit in `max` tokens, says both lengths.
pub fn tokenize(tok: &Tokenizer<'_>, text: &str, add_special: bool, parse_special: bool, max: usize) -> Result<Vec<u32>> {
    let mut work = vec![0u8; Tokenizer::work_bytes(text.len())];
    let mut out = vec![0u32; max];
    match tok.tokenize(text, add_special, parse_special, &mut out, &mut work) {
        Ok(n) => {
            out.truncate(n);
            Ok(out)
        }
        Err(TokenizerError::OutOfSpace { needed, capacity }) => bail!("the prompt has {needed} tokens but the context holds {capacity}; raise -c or shorten the prompt"),
        Err(e) => bail!("tokenizing: {e}"),
    }
}

/// Tokenizes without a length limit (for `tokenize` and `perplexity`).
pub fn tokenize_all(tok: &Tokenizer<'_>, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
    // Every token covers at least one byte; specials add at most a few.
    tokenize(tok, text, add_special, parse_special, text.len() + 8)
}

/// Formats a byte count as MiB with one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

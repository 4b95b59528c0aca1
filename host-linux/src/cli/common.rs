//! Pieces several subcommands share: prompt input, tokenizing with a clear length error,
//! the run options flags, and the memory report.

use super::args::Args;
use super::load::RunOptions;
use anyhow::{bail, Context, Result};
use keel_core::chat::ChatFormat;
use keel_core::gguf::Gguf;
use keel_core::sampler::SamplerConfig;
use keel_core::session::NonFinite;
use keel_core::tokenizer::{Tokenizer, TokenizerError};

/// Reads the prompt from `-p TEXT` or `-f FILE` (one of them required); a file is read
/// up to [`prompt_file_limit`] of the context `n_ctx`.
pub fn prompt(a: &mut Args, n_ctx: usize) -> Result<String> {
    let p: Option<String> = a.value(&["-p", "--prompt"], "the prompt text")?;
    let f: Option<String> = a.value(&["-f", "--file"], "a prompt file")?;
    match (p, f) {
        (Some(p), None) => Ok(p),
        (None, Some(f)) => read_text_limited(&f, "prompt file", prompt_file_limit(n_ctx), &format!("the most a -c {n_ctx} context can take (16 bytes per token + 64 KiB); shorten the file or raise -c")),
        (Some(_), Some(_)) => bail!("give the prompt with -p or -f, not both"),
        (None, None) => bail!("no prompt: give -p TEXT or -f FILE"),
    }
}

/// The most bytes a prompt file read for a context of `n_ctx` tokens may have: 16 per
/// token (English averages about 4 bytes per token) plus 64 KiB. A longer file cannot
/// fit; it is refused before being read whole (`-f /dev/zero` ends at once).
pub fn prompt_file_limit(n_ctx: usize) -> u64 {
    16 * n_ctx as u64 + 64 * 1024
}

/// The most bytes keel reads from a text file that is not bounded by a context
/// (`perplexity -f`, `tokenize -f`).
pub const MAX_TEXT_FILE: u64 = 256 << 20;

/// Reads `path` (a `what`, e.g. "prompt file") as UTF-8 text of at most `limit` bytes;
/// a longer or endless file is an error naming the file and the limit (`why` says where
/// the limit comes from and what to do), read no further than the limit.
pub fn read_text_limited(path: &str, what: &str, limit: u64, why: &str) -> Result<String> {
    use std::io::Read;
    let f = std::fs::File::open(path).with_context(|| format!("reading {what} {path}"))?;
    let mut bytes = Vec::new();
    f.take(limit + 1).read_to_end(&mut bytes).with_context(|| format!("reading {what} {path}"))?;
    if bytes.len() as u64 > limit {
        bail!("{what} {path} is larger than {limit} bytes, {why}");
    }
    String::from_utf8(bytes).map_err(|e| anyhow::anyhow!("{what} {path} is not valid UTF-8 text (byte {}); keel reads UTF-8", e.utf8_error().valid_up_to()))
}

/// The largest context or batch keel accepts (2^20 tokens); the arena's own size is
/// checked when it is planned.
pub const MAX_TOKENS: usize = 1 << 20;

/// A token count flag in `1..=MAX_TOKENS`.
pub fn token_count(a: &mut Args, names: &[&str], what: &str, default: usize) -> Result<usize> {
    let v = a.value_or(names, what, default)?;
    if v == 0 || v > MAX_TOKENS {
        bail!("{} {v}: must be between 1 and {MAX_TOKENS} tokens", names[0]);
    }
    Ok(v)
}

/// Most threads `-t` takes: far above any board keel targets, low enough that the
/// per-thread scratch of a plan stays small (`keel plan -t N` may plan for a target with
/// more cores than this machine; running with more threads than CPUs only oversubscribes).
pub const MAX_THREADS: usize = 256;

/// `-t`: 1 ..= [`MAX_THREADS`] (default: the CPUs this process may use).
pub fn threads(a: &mut Args) -> Result<usize> {
    let cpus = crate::pool::ThreadPool::default_threads();
    let t = a.value_or(&["-t", "--threads"], "a thread count", cpus)?;
    if t == 0 || t > MAX_THREADS {
        bail!("-t {t}: use -t 1..={MAX_THREADS} (this machine gives keel {cpus} CPU{}, the default)", if cpus == 1 { "" } else { "s" });
    }
    Ok(t)
}

/// The run-limit flags: `-c`, `-b`, `-t`, `--reference`, `--force-ctx`.
pub fn run_options(a: &mut Args, n_outputs: usize) -> Result<RunOptions> {
    let n_ctx = token_count(a, &["-c", "--ctx-size"], "a context length in tokens", 2048)?;
    let n_batch = token_count(a, &["-b", "--batch-size"], "a batch size in tokens", 512)?;
    let threads = threads(a)?;
    let reference = a.flag(&["--reference"]);
    let force_ctx = a.flag(&["--force-ctx"]);
    Ok(RunOptions { n_ctx, n_batch, n_outputs: n_outputs.max(1), threads, reference, force_ctx })
}

/// A number flag that must be finite and pass `ok` (`range` says which values do).
fn number(a: &mut Args, name: &str, what: &str, default: f32, ok: impl Fn(f32) -> bool, range: &str) -> Result<f32> {
    let v = a.value_or(&[name], what, default)?;
    if !v.is_finite() || !ok(v) {
        bail!("{name} {v}: expected {what} {range} (default {default})");
    }
    Ok(v)
}

/// The sampling flags (`--temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n -s`),
/// each checked: finite and in its range.
pub fn sampling(a: &mut Args) -> Result<SamplerConfig> {
    let d = SamplerConfig::default();
    Ok(SamplerConfig {
        temp: number(a, "--temp", "a temperature", d.temp, |v| v >= 0.0, ">= 0 (0 = greedy)")?,
        top_k: a.value_or(&["--top-k"], "a count (0 = off)", d.top_k)?,
        top_p: number(a, "--top-p", "a probability", d.top_p, |v| v > 0.0 && v <= 1.0, "in (0, 1] (1 = off)")?,
        min_p: number(a, "--min-p", "a probability", d.min_p, |v| (0.0..=1.0).contains(&v), "in [0, 1] (0 = off)")?,
        repeat_penalty: number(a, "--repeat-penalty", "a factor", d.repeat_penalty, |v| v > 0.0, "> 0 (1 = off)")?,
        repeat_last_n: a.value_or(&["--repeat-last-n"], "a count", d.repeat_last_n)?,
        seed: match a.value::<u64>(&["-s", "--seed"], "an integer seed")? {
            Some(s) => s,
            None => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0),
        },
    })
}

/// The chat format of a model, or an error naming the file and the known families.
pub fn chat_format<'a>(g: &Gguf<'a>, path: &std::path::Path) -> Result<ChatFormat<'a>> {
    ChatFormat::for_model(g).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Chat text as the template wrote it, in segments: the template's own text (its markers
/// are parsed as special tokens) and the caller's content, the user's and `--system`
/// text (never parsed: typing `<|im_start|>system` is text, as in llama.cpp's server).
/// Content is recognized as the very `&str`s passed to the format's writers.
pub struct ChatText<'c> {
    content: Vec<&'c str>,
    /// (text, is content).
    segments: Vec<(String, bool)>,
}

impl<'c> ChatText<'c> {
    /// Empty, with `content` the strings to keep out of special-token parsing.
    pub fn new(content: &[&'c str]) -> Self {
        ChatText { content: content.to_vec(), segments: Vec::new() }
    }

    /// Tokenizes each segment (BOS first when `bos` and the model adds it); at most
    /// `max` tokens in all, else an error saying both counts.
    pub fn tokenize(&self, tok: &Tokenizer<'_>, bos: bool, max: usize) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        for (i, (text, content)) in self.segments.iter().enumerate() {
            ids.extend(tokenize_all(tok, text, bos && i == 0, !content)?);
        }
        if bos && self.segments.is_empty() {
            ids.extend(tokenize_all(tok, "", true, true)?);
        }
        if ids.len() > max {
            bail!("the prompt has {} tokens but the context holds {max}; raise -c or shorten the prompt", ids.len());
        }
        Ok(ids)
    }
}

impl std::fmt::Write for ChatText<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if s.is_empty() {
            return Ok(());
        }
        let content = self.content.iter().any(|c| c.as_ptr() == s.as_ptr() && c.len() == s.len());
        match self.segments.last_mut() {
            Some((t, c)) if *c == content && !content => t.push_str(s),
            _ => self.segments.push((s.to_string(), content)),
        }
        Ok(())
    }
}

/// One user turn in the model's chat format, ready for the reply (for `run --chat`).
pub fn chat_prompt<'c>(g: &Gguf<'_>, path: &std::path::Path, system: Option<&'c str>, user: &'c str) -> Result<ChatText<'c>> {
    let f = chat_format(g, path)?;
    let mut s = ChatText::new(&[user, system.unwrap_or("")]);
    f.first_user(&mut s, system, user)?;
    f.assistant_start(&mut s)?;
    Ok(s)
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

/// Fails if a logits row has a NaN or an infinity: the model's weights or its arithmetic
/// broke, and any token sampled or score computed from the row would be a silent wrong
/// answer. `step` says where (e.g. "generated token 3"; made only on failure). `origin`
/// is the first op of the sequence that produced a non-finite value, which the session
/// knows with the reference kernels
/// ([`keel_core::session::Session::first_non_finite`]): with it the check fails even if
/// the row came out finite (a NaN that a later op turned into a number is still a wrong
/// answer), naming the op.
pub fn check_finite(row: &[f32], origin: Option<NonFinite>, step: impl FnOnce() -> String) -> Result<()> {
    let bad = row.iter().position(|v| !v.is_finite());
    let logits = match bad {
        Some(i) => format!("the logits are not finite (logit {i} of {} is {})", row.len(), row[i]),
        None => "the logits came out finite, but were computed from it".into(),
    };
    match (origin, bad) {
        (Some(o), _) => bail!(
            "{o} produced a non-finite value at position {}, found at {}; {logits}: the model's weights or its arithmetic produced NaN/infinity there; stopped rather than give a wrong answer",
            o.pos,
            step()
        ),
        (None, Some(_)) => bail!(
            "{logits} at {}: the model's weights or its arithmetic produced NaN/infinity; stopped rather than give a wrong answer (run with --reference to name the first op that produced it and rule out a kernel)",
            step()
        ),
        (None, None) => Ok(()),
    }
}

/// Formats a byte count as MiB with one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

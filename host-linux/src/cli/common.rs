//! Pieces several subcommands share: the flag groups (`-m`, `-c`, the run limits, the
//! sampling flags, the prompt flags, `--batches`) as `clap` argument structs, prompt
//! input, tokenizing with a clear length error, and the memory report.

use super::load::RunOptions;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use keel_core::chat::ChatFormat;
use keel_core::gguf::Gguf;
use keel_core::sampler::SamplerConfig;
use keel_core::session::NonFinite;
use keel_core::tokenizer::{Tokenizer, TokenizerError};

/// `-m MODEL`.
#[derive(Args, Debug, Clone)]
pub struct ModelFlag {
    /// The model: a .gguf file, or a known name (smollm2-135m, gemma3-270m) fetched on first use into $KEEL_MODELS (default ~/.cache/keel/models)
    #[arg(short = 'm', long = "model", value_name = "MODEL", default_value = "smollm2-135m")]
    pub model: String,
}

/// `-c N_CTX` with the default of the commands that generate.
#[derive(Args, Debug, Clone)]
pub struct CtxFlag {
    /// Context length in tokens (1..=1048576); beyond the model's training context (<arch>.context_length) it is warned about unless --force-ctx
    #[arg(short = 'c', long = "ctx-size", value_name = "N", default_value_t = 2048)]
    pub ctx_size: usize,
}

/// The run limits and kernel choice: `-b`, `-t`, `--reference`, `--force-ctx`.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Limits and arithmetic")]
pub struct RunFlags {
    /// Tokens per forward pass (1..=1048576; at most -c)
    #[arg(short = 'b', long = "batch-size", value_name = "N", default_value_t = 512)]
    pub batch_size: usize,
    /// Threads (1..=256); the default is the CPUs this process may use
    #[arg(short = 't', long = "threads", value_name = "N", default_value_t = crate::pool::ThreadPool::default_threads())]
    pub threads: usize,
    /// Scalar reference kernels instead of the fastest for this CPU (and name the first op that produced a NaN)
    #[arg(long = "reference")]
    pub reference: bool,
    /// No warning for a -c beyond the model's training context (bench: measure past it)
    #[arg(long = "force-ctx")]
    pub force_ctx: bool,
}

/// `--batches`: which arithmetic a batch of several tokens gets.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batches {
    /// keel's one-query arithmetic: a token's logits never depend on the batch it was evaluated in
    Invariant,
    /// llama.cpp's batch-dependent choices (tiled attention for 64+ tokens, its per-batch matmul kernels): llama.cpp's numbers exactly
    LlamaCpp,
}

impl Batches {
    /// True for llama.cpp's arithmetic ([`keel_core::session::Session::set_llama_cpp_batches`]).
    pub fn llama_cpp(self) -> bool {
        self == Batches::LlamaCpp
    }
}

/// `--batches` with the default `invariant` (every command but perplexity).
#[derive(Args, Debug, Clone)]
pub struct BatchesFlag {
    /// Arithmetic of multi-token batches: invariant (keel's; a token's logits never depend on batching) or llama-cpp (llama.cpp's batch-dependent kernels, to reproduce its logits)
    #[arg(long = "batches", value_enum, value_name = "MODE", default_value_t = Batches::Invariant)]
    pub batches: Batches,
}

/// What every command that evaluates takes: `-c`, the run limits, `--batches`.
#[derive(Args, Debug, Clone)]
pub struct EvalFlags {
    /// `-c`.
    #[command(flatten)]
    pub ctx: CtxFlag,
    /// `-b`, `-t`, `--reference`, `--force-ctx`.
    #[command(flatten)]
    pub run: RunFlags,
    /// `--batches`.
    #[command(flatten)]
    pub batches: BatchesFlag,
}

impl EvalFlags {
    /// The run limits (checked) for `n_outputs` logits rows per evaluation.
    pub fn options(&self, n_outputs: usize) -> Result<RunOptions> {
        self.run.options(self.ctx.ctx_size, n_outputs)
    }

    /// True for `--batches llama-cpp`.
    pub fn llama_cpp(&self) -> bool {
        self.batches.batches.llama_cpp()
    }
}

/// `-p TEXT | -f FILE`, `-e`.
#[derive(Args, Debug, Clone)]
pub struct PromptFlags {
    /// The prompt text
    #[arg(short = 'p', long = "prompt", value_name = "TEXT", allow_hyphen_values = true)]
    pub prompt: Option<String>,
    /// Read the prompt from FILE (- reads standard input); at most 16 bytes per -c token + 64 KiB
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<String>,
    /// Process escapes (\\n \\r \\t \\\\ \\" \\' \\xHH) in the text given (prompt; for run also the system message and stop strings), as llama.cpp's -e
    #[arg(short = 'e', long = "escape")]
    pub escape: bool,
}

impl PromptFlags {
    /// The prompt from `-p TEXT` or `-f FILE` (one of them required); a file is read up to
    /// [`prompt_file_limit`] of the context `n_ctx`; `-e` applied.
    pub fn text(&self, n_ctx: usize) -> Result<String> {
        Ok(self.escaped(prompt_text(self.prompt.as_deref(), self.file.as_deref(), "-p", n_ctx)?))
    }

    /// `s` with `-e`'s escapes processed when `-e` was given.
    pub fn escaped(&self, s: String) -> String {
        if self.escape {
            process_escapes(&s)
        } else {
            s
        }
    }
}

/// The prompt from `TEXT_FLAG TEXT` (`text`) or `-f FILE` (`file`; one of them required),
/// a file read up to [`prompt_file_limit`] of the context `n_ctx`.
pub fn prompt_text(text: Option<&str>, file: Option<&str>, text_flag: &str, n_ctx: usize) -> Result<String> {
    Ok(match (text, file) {
        (Some(p), None) => p.to_string(),
        (None, Some(f)) => read_text_limited(f, "prompt file", prompt_file_limit(n_ctx), &format!("the most a -c {n_ctx} context can take (16 bytes per token + 64 KiB); shorten the file or raise -c"))?,
        (Some(_), Some(_)) => bail!("give the prompt with {text_flag} or -f, not both"),
        (None, None) => bail!("no prompt: give {text_flag} TEXT or -f FILE (-f - reads standard input)"),
    })
}

/// llama.cpp's `-e`: `\n`, `\r`, `\t`, `\\`, `\"`, `\'`, `\0`, `\xHH` (a byte; bytes that do
/// not form UTF-8 become U+FFFD); any other backslash stays as typed.
pub fn process_escapes(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            let c = b[i + 1];
            let simple = match c {
                b'n' => Some(b'\n'),
                b'r' => Some(b'\r'),
                b't' => Some(b'\t'),
                b'\\' => Some(b'\\'),
                b'"' => Some(b'"'),
                b'\'' => Some(b'\''),
                b'0' => Some(0),
                _ => None,
            };
            if let Some(v) = simple {
                out.push(v);
                i += 2;
                continue;
            }
            if c == b'x' {
                if let Some(v) = s.get(i + 2..i + 4).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
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

/// Reads `path` (a `what`, e.g. "prompt file"; `-` is standard input) as UTF-8 text of at
/// most `limit` bytes; a longer or endless file is an error naming the file and the limit
/// (`why` says where the limit comes from and what to do), read no further than the limit.
pub fn read_text_limited(path: &str, what: &str, limit: u64, why: &str) -> Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    let shown = if path == "-" { "(standard input)" } else { path };
    let f: Box<dyn Read> = if path == "-" { Box::new(std::io::stdin().lock()) } else { Box::new(std::fs::File::open(path).with_context(|| format!("reading {what} {path}"))?) };
    f.take(limit + 1).read_to_end(&mut bytes).with_context(|| format!("reading {what} {shown}"))?;
    if bytes.len() as u64 > limit {
        bail!("{what} {shown} is larger than {limit} bytes, {why}");
    }
    String::from_utf8(bytes).map_err(|e| anyhow::anyhow!("{what} {shown} is not valid UTF-8 text (byte {}); keel reads UTF-8", e.utf8_error().valid_up_to()))
}

/// The largest context or batch keel accepts (2^20 tokens); the arena's own size is
/// checked when it is planned.
pub const MAX_TOKENS: usize = 1 << 20;

/// A token count flag `flag` in `1..=MAX_TOKENS`.
pub fn token_count(flag: &str, v: usize) -> Result<usize> {
    if v == 0 || v > MAX_TOKENS {
        bail!("{flag} {v}: must be between 1 and {MAX_TOKENS} tokens");
    }
    Ok(v)
}

/// Most threads `-t` takes: far above any board keel targets, low enough that the
/// per-thread scratch of a plan stays small (`keel plan -t N` may plan for a target with
/// more cores than this machine; running with more threads than CPUs only oversubscribes).
pub const MAX_THREADS: usize = 256;

/// `-t`: 1 ..= [`MAX_THREADS`].
pub fn threads(t: usize) -> Result<usize> {
    let cpus = crate::pool::ThreadPool::default_threads();
    if t == 0 || t > MAX_THREADS {
        bail!("-t {t}: use -t 1..={MAX_THREADS} (this machine gives keel {cpus} CPU{}, the default)", if cpus == 1 { "" } else { "s" });
    }
    Ok(t)
}

impl RunFlags {
    /// The run limits for a context of `n_ctx` (`-c`, checked here) and `n_outputs` rows.
    pub fn options(&self, n_ctx: usize, n_outputs: usize) -> Result<RunOptions> {
        let n_ctx = token_count("-c", n_ctx)?;
        let n_batch = token_count("-b", self.batch_size)?;
        let threads = threads(self.threads)?;
        Ok(RunOptions { n_ctx, n_batch, n_outputs: n_outputs.max(1), threads, reference: self.reference, force_ctx: self.force_ctx })
    }
}

/// The sampling flags, each checked when used (finite and in its range).
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Sampling and stopping")]
pub struct SamplingFlags {
    /// Temperature, >= 0 (0 = greedy)
    #[arg(long = "temp", value_name = "T", allow_negative_numbers = true, default_value_t = SamplerConfig::default().temp)]
    pub temp: f32,
    /// Keep the K most likely tokens (0 = off)
    #[arg(long = "top-k", value_name = "K", default_value_t = SamplerConfig::default().top_k)]
    pub top_k: usize,
    /// Nucleus sampling probability, in (0, 1] (1 = off)
    #[arg(long = "top-p", value_name = "P", allow_negative_numbers = true, default_value_t = SamplerConfig::default().top_p)]
    pub top_p: f32,
    /// Minimum probability relative to the most likely token, in [0, 1] (0 = off)
    #[arg(long = "min-p", value_name = "P", allow_negative_numbers = true, default_value_t = SamplerConfig::default().min_p)]
    pub min_p: f32,
    /// Penalty for repeated tokens, > 0 (1 = off)
    #[arg(long = "repeat-penalty", value_name = "F", allow_negative_numbers = true, default_value_t = SamplerConfig::default().repeat_penalty)]
    pub repeat_penalty: f32,
    /// How many recent tokens the repeat penalty looks at
    #[arg(long = "repeat-last-n", value_name = "N", default_value_t = SamplerConfig::default().repeat_last_n)]
    pub repeat_last_n: usize,
    /// Random seed; the default is a random one, printed so the run can be repeated
    #[arg(short = 's', long = "seed", value_name = "S")]
    pub seed: Option<u64>,
}

/// A number flag that must be finite and pass `ok` (`range` says which values do).
fn number(name: &str, v: f32, what: &str, default: f32, ok: impl Fn(f32) -> bool, range: &str) -> Result<f32> {
    if !v.is_finite() || !ok(v) {
        bail!("{name} {v}: expected {what} {range} (default {default})");
    }
    Ok(v)
}

impl SamplingFlags {
    /// The sampler's configuration, and whether the seed was drawn at random.
    pub fn config(&self) -> Result<(SamplerConfig, bool)> {
        let d = SamplerConfig::default();
        let cfg = SamplerConfig {
            temp: number("--temp", self.temp, "a temperature", d.temp, |v| v >= 0.0, ">= 0 (0 = greedy)")?,
            top_k: self.top_k,
            top_p: number("--top-p", self.top_p, "a probability", d.top_p, |v| v > 0.0 && v <= 1.0, "in (0, 1] (1 = off)")?,
            min_p: number("--min-p", self.min_p, "a probability", d.min_p, |v| (0.0..=1.0).contains(&v), "in [0, 1] (0 = off)")?,
            repeat_penalty: number("--repeat-penalty", self.repeat_penalty, "a factor", d.repeat_penalty, |v| v > 0.0, "> 0 (1 = off)")?,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed.unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)),
        };
        Ok((cfg, self.seed.is_none()))
    }
}

/// Says (stderr) which seed a run drew when none was given and sampling uses it.
pub fn report_random_seed(cfg: &SamplerConfig, random: bool) {
    if random && cfg.temp > 0.0 {
        eprintln!("keel: seed {} (drawn at random; -s {} repeats this run)", cfg.seed, cfg.seed);
    }
}

/// The chat format of a model, or an error naming the file and the known families.
/// A model without a `tokenizer.chat_template` gets its architecture's default format,
/// with a warning (stderr): such a file is usually a base model, not instruction-tuned,
/// and its replies in a chat format are often nonsense.
pub fn chat_format<'a>(g: &Gguf<'a>, path: &std::path::Path) -> Result<ChatFormat<'a>> {
    let f = ChatFormat::for_model(g).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if g.str_opt("tokenizer.chat_template").ok().flatten().is_none() {
        eprintln!(
            "keel: warning: {} has no chat template (tokenizer.chat_template); using the {} format of its architecture. A model without one is usually a base model, not instruction-tuned: its replies may be nonsense (for chat, use an instruction-tuned model such as smollm2-135m)",
            path.display(),
            f.name()
        );
    }
    Ok(f)
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

#[cfg(test)]
mod tests {
    use super::process_escapes;

    #[test]
    fn escapes_as_llama_cpp_reads_them() {
        assert_eq!(process_escapes(r"a\nb\tc\\d\'e\x41\q"), "a\nb\tc\\d'eA\\q");
        assert_eq!(process_escapes(r"end\"), "end\\");
        assert_eq!(process_escapes(r"\x4"), "\\x4");
    }
}

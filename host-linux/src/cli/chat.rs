//! `keel chat`: an interactive conversation in the model's chat format.
//!
//! Each user line is appended to the context as one turn (the conversation is never
//! re-evaluated), the reply streams as it is generated, and the reply's end-of-turn text
//! closes the turn. The context is fixed (`-c`): when the next turn or reply does not fit,
//! keel says so and the conversation must start over (`/reset`). Commands: `/help`,
//! `/reset`, `/quit` (or end of input).
//!
//! On a terminal, lines are read with `rustyline` (line editing, history for the session,
//! kept in memory only) and Ctrl-C interrupts the reply being generated, not the program
//! (at the prompt it clears the line). From a pipe, lines are read as they come.

use super::common::{chat_format, check_finite, report_random_seed, ModelFlag, EvalFlags, ChatText};
use super::load::{engine, open_for_cpu, prepare};
use super::run::{sample, stop_found, GenFlags};
use crate::fault::stdout_ok;
use anyhow::Result;
use keel_core::session::Outputs;
use keel_core::tokenizer::Utf8Stream;
use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// `keel chat`.
#[derive(clap::Args, Debug)]
#[command(after_help = "In the conversation: /help lists the commands, /reset starts a new conversation, /quit (or Ctrl-D) ends; Ctrl-C interrupts a reply. Each reply is followed by its speed and the context used.")]
pub struct ChatArgs {
    /// The model (`-m`).
    #[command(flatten)]
    pub model: ModelFlag,
    /// System message (replaces the template's default)
    #[arg(long = "system", value_name = "TEXT", allow_hyphen_values = true)]
    pub system: Option<String>,
    /// Most tokens per reply
    #[arg(short = 'n', long = "n-predict", value_name = "N", default_value_t = 256)]
    pub n_predict: usize,
    /// Process escapes (\n \t \\ \xHH ...) in --system and -r, as llama.cpp's -e
    #[arg(short = 'e', long = "escape")]
    pub escape: bool,
    /// `-c`, the run limits, `--batches`.
    #[command(flatten)]
    pub eval: EvalFlags,
    /// The sampling flags, `--ignore-eos`, `-r`.
    #[command(flatten)]
    pub gen: GenFlags,
}

const HELP: &str = "commands: /help this list, /reset start a new conversation (the context is emptied), /quit or /exit (or Ctrl-D) end; Ctrl-C interrupts a reply";

/// Set by SIGINT while a reply is generated.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// While alive, SIGINT sets [`INTERRUPTED`] instead of ending the process; the previous
/// action is restored on drop (so Ctrl-C at a piped prompt still ends keel).
struct SigintToReply(libc::sigaction);

impl SigintToReply {
    fn install() -> SigintToReply {
        INTERRUPTED.store(false, Ordering::Relaxed);
        // SAFETY: a zeroed sigaction is valid; the handler only stores to an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGINT, &sa, &mut old);
            SigintToReply(old)
        }
    }
}

impl Drop for SigintToReply {
    fn drop(&mut self) {
        // SAFETY: restores the action saved by `install`.
        unsafe { libc::sigaction(libc::SIGINT, &self.0, std::ptr::null_mut()) };
    }
}

/// Where user lines come from.
enum Input {
    Editor(Box<rustyline::DefaultEditor>),
    Pipe(std::io::Stdin, Vec<u8>),
}

/// One read.
enum Line {
    Text(String),
    /// Not UTF-8: the byte (1-based) where it stops being UTF-8.
    BadUtf8(usize),
    /// Ctrl-C at the prompt.
    Cancelled,
    End,
}

impl Input {
    fn new() -> Input {
        if std::io::stdin().is_terminal() {
            let cfg = rustyline::Config::builder().behavior(rustyline::config::Behavior::PreferTerm).max_history_size(1000).map(|b| b.build());
            // No editor (e.g. no usable terminal): lines are read plainly.
            if let Ok(ed) = cfg.and_then(rustyline::DefaultEditor::with_config) {
                return Input::Editor(Box::new(ed));
            }
        }
        Input::Pipe(std::io::stdin(), Vec::new())
    }

    fn read(&mut self) -> Result<Line> {
        match self {
            Input::Editor(ed) => match ed.readline("> ") {
                Ok(l) => {
                    if !l.trim().is_empty() {
                        let _ = ed.add_history_entry(l.as_str());
                    }
                    Ok(Line::Text(l))
                }
                Err(rustyline::error::ReadlineError::Interrupted) => Ok(Line::Cancelled),
                Err(rustyline::error::ReadlineError::Eof) => Ok(Line::End),
                Err(e) => Err(anyhow::anyhow!("reading the terminal: {e}")),
            },
            Input::Pipe(stdin, raw) => {
                eprint!("> ");
                raw.clear();
                if stdin.lock().read_until(b'\n', raw)? == 0 {
                    return Ok(Line::End);
                }
                match std::str::from_utf8(raw) {
                    Ok(l) => Ok(Line::Text(l.trim_end_matches(['\n', '\r']).to_string())),
                    Err(err) => Ok(Line::BadUtf8(err.valid_up_to() + 1)),
                }
            }
        }
    }
}

/// Runs the subcommand.
pub fn main(a: ChatArgs) -> Result<()> {
    let esc = |s: &String| if a.escape { super::common::process_escapes(s) } else { s.clone() };
    let system: Option<String> = a.system.as_ref().map(esc);
    let stops: Vec<String> = a.gen.reverse_prompt.iter().map(esc).collect();
    let n_predict = a.n_predict;
    let opts = a.eval.options(1)?;
    let (sampling, random_seed) = a.gen.sampling.config()?;

    let opened = open_for_cpu(&a.model.model, opts.reference, opts.threads)?;
    let g = opened.gguf()?;
    let format = chat_format(&g, &opened.path)?;
    let mut loaded = prepare(&g, &opened.path, &opts)?;
    let (mut e, pool) = engine(&g, &opened.path, &mut loaded, opts.reference, sampling)?;
    e.session.set_llama_cpp_batches(a.eval.llama_cpp());
    let n_ctx = e.session.n_ctx();
    eprintln!("keel chat: {} ({} format), context {n_ctx} tokens. /help lists the commands, /reset starts over, /quit ends.", opened.path.display(), format.name());
    report_random_seed(&sampling, random_seed);

    let mut input = Input::new();
    let stdout = std::io::stdout();
    let mut piece = vec![0u8; e.tokenizer.max_piece_len()];
    let mut row = Vec::new();
    let mut first = true;
    loop {
        let line = match input.read()? {
            Line::End => break,
            Line::Cancelled => {
                eprintln!("(Ctrl-C: /quit or Ctrl-D ends the chat)");
                continue;
            }
            Line::BadUtf8(at) => {
                eprintln!("(that line is not valid UTF-8 (byte {at} is not); nothing was sent: type it again)");
                continue;
            }
            Line::Text(l) => l,
        };
        let msg = line.as_str();
        match msg.trim() {
            "/quit" | "/exit" => break,
            "/reset" => {
                e.reset();
                first = true;
                eprintln!("(new conversation)");
                continue;
            }
            "/help" | "/?" => {
                eprintln!("{HELP}");
                continue;
            }
            c if c.starts_with('/') && !c.contains(' ') => {
                eprintln!("(unknown command {c}; {HELP})");
                continue;
            }
            "" => continue,
            _ => {}
        }
        // The user's text (and --system) is never parsed for special tokens.
        let mut text = ChatText::new(&[msg, system.as_deref().unwrap_or("")]);
        if first {
            format.first_user(&mut text, system.as_deref(), msg)?;
        } else {
            format.user(&mut text, msg)?;
        }
        format.assistant_start(&mut text)?;
        // BOS only at the start of a conversation.
        let toks = text.tokenize(&e.tokenizer, first, usize::MAX)?;
        let left = n_ctx - e.session.n_past();
        if toks.len() + 1 > left {
            if toks.len() + 1 > n_ctx {
                eprintln!("(the context is full for this turn: it needs {} tokens with its reply's first, more than the whole context of {n_ctx}; shorten it, or raise -c)", toks.len() + 1);
            } else {
                eprintln!("(the context is full: this turn needs {} tokens and {left} of {n_ctx} are left; /reset to start over, or raise -c)", toks.len() + 1);
            }
            continue;
        }
        // From here to the end of the reply, Ctrl-C interrupts the reply, not keel.
        let sigint = SigintToReply::install();
        e.eval(&toks, Outputs::Last, pool)?;
        first = false;
        let t0 = Instant::now();
        let mut out = stdout.lock();
        let mut stream = Utf8Stream::new();
        let mut reply = String::new();
        let mut ended = false;
        let mut n_reply = 0usize;
        let mut interrupted = false;
        for i in 0..n_predict {
            check_finite(e.session.last_logits(e.n_vocab()), e.session.first_non_finite(), || format!("reply token {}", i + 1))?;
            if INTERRUPTED.load(Ordering::Relaxed) {
                interrupted = true;
                break;
            }
            let tok = sample(&mut e, a.gen.ignore_eos, &mut row);
            if e.tokenizer.is_eog(tok) {
                ended = true;
                break;
            }
            n_reply += 1;
            let checked = reply.len();
            let n = e.tokenizer.piece(tok, false, &mut piece).unwrap_or(0);
            stream.push(&piece[..n], |s: &str| {
                reply.push_str(s);
                let _ = stdout_ok(out.write_all(s.as_bytes()).and_then(|_| out.flush()));
            });
            if e.session.n_past() + 1 >= n_ctx {
                break;
            }
            e.eval(&[tok], Outputs::Last, pool)?;
            if stop_found(&reply, checked, &stops) {
                ended = true;
                break;
            }
        }
        drop(sigint);
        stream.finish(|s: &str| {
            let _ = stdout_ok(out.write_all(s.as_bytes()));
        });
        let _ = stdout_ok(writeln!(out).and_then(|_| out.flush()));
        drop(out);
        let secs = t0.elapsed().as_secs_f64();
        if interrupted {
            eprintln!("(reply interrupted)");
        } else if !ended {
            eprintln!("(reply cut at {} tokens)", if e.session.n_past() + 1 >= n_ctx { "the context's end".to_string() } else { format!("-n {n_predict}") });
        }
        eprintln!("({n_reply} tokens, {:.1} t/s; context {} of {n_ctx} used)", n_reply as f64 / secs.max(1e-9), e.session.n_past());
        // Close the model's turn in the context so the next turn follows the format.
        let mut close = ChatText::new(&[]);
        format.assistant_end(&mut close)?;
        let close = close.tokenize(&e.tokenizer, false, usize::MAX)?;
        if e.session.n_past() + close.len() > n_ctx {
            eprintln!("(the context is full ({n_ctx} tokens); /reset to start a new conversation, or raise -c)");
            continue;
        }
        e.eval(&close, Outputs::Last, pool)?;
    }
    Ok(())
}

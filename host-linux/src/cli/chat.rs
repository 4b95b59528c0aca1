//! `keel chat`: an interactive conversation in the model's chat format.
//!
//! Each user line is appended to the context as one turn (the conversation is never
//! re-evaluated), the reply streams as it is generated, and the reply's end-of-turn text
//! closes the turn. The context is fixed (`-c`): when the next turn or reply does not fit,
//! keel says so and the conversation must start over (`/reset`). Commands: `/reset`,
//! `/quit` (or end of input).

use super::args::Args;
use super::common::{chat_format, check_finite, run_options, sampling, ChatText};
use super::load::{engine, open, prepare};
use crate::fault::stdout_ok;
use anyhow::Result;
use keel_core::session::Outputs;
use keel_core::tokenizer::Utf8Stream;
use std::io::{BufRead, Write};

/// Runs the subcommand.
pub fn main(mut a: Args) -> Result<()> {
    let model = a.value::<String>(&["-m", "--model"], "a model file or name")?.unwrap_or_else(|| "smollm2-135m".into());
    let n_predict = a.value_or(&["-n", "--n-predict"], "a token count per reply", 256usize)?;
    let system: Option<String> = a.value(&["--system"], "a system message")?;
    let opts = run_options(&mut a, 1)?;
    let sampling = sampling(&mut a)?;
    a.finish()?;

    let opened = open(&model)?;
    let g = opened.gguf()?;
    let format = chat_format(&g, &opened.path)?;
    let mut loaded = prepare(&g, &opened.path, &opts)?;
    let (mut e, pool) = engine(&g, &opened.path, &mut loaded, opts.reference, sampling)?;
    let n_ctx = e.session.n_ctx();
    eprintln!("keel chat: {} ({} format), context {n_ctx} tokens. /reset starts over, /quit ends.", opened.path.display(), format.name());

    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let mut piece = vec![0u8; e.tokenizer.max_piece_len()];
    let mut first = true;
    let mut raw = Vec::new();
    loop {
        eprint!("> ");
        raw.clear();
        if stdin.lock().read_until(b'\n', &mut raw)? == 0 {
            break;
        }
        let line = match std::str::from_utf8(&raw) {
            Ok(l) => l,
            Err(err) => {
                eprintln!("(that line is not valid UTF-8 (byte {} is not); nothing was sent: type it again)", err.valid_up_to() + 1);
                continue;
            }
        };
        let msg = line.trim_end_matches(['\n', '\r']);
        match msg.trim() {
            "/quit" | "/exit" => break,
            "/reset" => {
                e.reset();
                first = true;
                eprintln!("(new conversation)");
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
            eprintln!("(the context is full: this turn needs {} tokens and {left} of {n_ctx} are left; /reset to start over, or raise -c)", toks.len() + 1);
            continue;
        }
        e.eval(&toks, Outputs::Last, pool)?;
        first = false;
        let mut out = stdout.lock();
        let mut stream = Utf8Stream::new();
        let mut ended = false;
        for i in 0..n_predict {
            check_finite(e.session.last_logits(e.n_vocab()), e.session.first_non_finite(), || format!("reply token {}", i + 1))?;
            let tok = e.sample();
            if e.tokenizer.is_eog(tok) {
                ended = true;
                break;
            }
            let n = e.tokenizer.piece(tok, false, &mut piece).unwrap_or(0);
            stream.push(&piece[..n], |s: &str| {
                let _ = stdout_ok(out.write_all(s.as_bytes()).and_then(|_| out.flush()));
            });
            if e.session.n_past() + 1 >= n_ctx {
                break;
            }
            e.eval(&[tok], Outputs::Last, pool)?;
        }
        stream.finish(|s: &str| {
            let _ = stdout_ok(out.write_all(s.as_bytes()));
        });
        let _ = stdout_ok(writeln!(out).and_then(|_| out.flush()));
        drop(out);
        if !ended {
            eprintln!("(reply cut at {} tokens)", if e.session.n_past() + 1 >= n_ctx { "the context's end".to_string() } else { format!("-n {n_predict}") });
        }
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

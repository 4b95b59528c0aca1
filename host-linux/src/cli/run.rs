//! `keel run`: generate text from a prompt, streaming it, then report speed and memory.

use super::args::Args;
use super::common::{chat_prompt, mib, prompt, run_options, sampling, tokenize};
use super::load::{engine, open, prepare};
use crate::json;
use anyhow::Result;
use keel_core::session::Outputs;
use keel_core::tokenizer::Utf8Stream;
use std::io::Write;
use std::time::Instant;

/// What a generation produced.
pub struct Generation {
    /// Prompt token ids.
    pub prompt_tokens: Vec<u32>,
    /// Generated token ids (the end-of-generation token is not included).
    pub generated: Vec<u32>,
    /// Generated text.
    pub text: String,
    /// Prompt tokens per second.
    pub prompt_tps: f64,
    /// Generated tokens per second.
    pub gen_tps: f64,
    /// Why generation stopped.
    pub stop: &'static str,
}

/// Runs the subcommand.
pub fn main(mut a: Args) -> Result<()> {
    let model = a.value::<String>(&["-m", "--model"], "a model file or name")?.unwrap_or_else(|| "smollm2-135m".into());
    let text = prompt(&mut a)?;
    let n_predict = a.value_or(&["-n", "--n-predict"], "a token count", 128usize)?;
    let opts = run_options(&mut a, 1)?;
    let sampling = sampling(&mut a)?;
    let chat = a.flag(&["--chat"]);
    let system: Option<String> = a.value(&["--system"], "a system message")?;
    let as_json = a.flag(&["--json"]);
    a.finish()?;

    let opened = open(&model)?;
    let g = opened.gguf()?;
    let mut loaded = prepare(&g, &opened.path, &opts)?;
    let arena_bytes = loaded.arena.len();
    let (mut e, pool) = engine(&g, &opened.path, &mut loaded, opts.reference, sampling)?;
    if system.is_some() && !chat {
        anyhow::bail!("--system needs --chat");
    }
    let text = if chat { chat_prompt(&g, &opened.path, system.as_deref(), &text)? } else { text };
    let prompt_tokens = tokenize(&e.tokenizer, &text, true, true, opts.n_ctx)?;
    if prompt_tokens.is_empty() {
        anyhow::bail!("the prompt is empty after tokenization");
    }

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut stream = Utf8Stream::new();
    let mut piece = vec![0u8; e.tokenizer.max_piece_len()];
    let mut generated = Vec::with_capacity(n_predict);
    let mut text_out = String::with_capacity(n_predict * 8);
    // With --json: digests of every row a token is chosen from (see logits_digest.rs).
    let mut digest = as_json.then(super::logits_digest::LogitsDigest::default);

    let t0 = Instant::now();
    e.eval(&prompt_tokens, Outputs::Last, pool)?;
    let prompt_secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut stop = "length";
    for _ in 0..n_predict {
        if let Some(d) = digest.as_mut() {
            d.row(e.session.last_logits(e.n_vocab()));
        }
        let tok = e.sample();
        if e.tokenizer.is_eog(tok) {
            stop = "end of generation";
            break;
        }
        generated.push(tok);
        let n = e.tokenizer.piece(tok, true, &mut piece).unwrap_or(0);
        stream.push(&piece[..n], |s: &str| {
            text_out.push_str(s);
            if !as_json {
                let _ = out.write_all(s.as_bytes());
                let _ = out.flush();
            }
        });
        if e.session.n_past() >= e.session.n_ctx() {
            stop = "context full";
            break;
        }
        e.eval(&[tok], Outputs::Last, pool)?;
    }
    stream.finish(|s: &str| {
        text_out.push_str(s);
        if !as_json {
            let _ = out.write_all(s.as_bytes());
        }
    });
    let gen_secs = t1.elapsed().as_secs_f64();
    let g = Generation {
        prompt_tps: prompt_tokens.len() as f64 / prompt_secs.max(1e-9),
        gen_tps: generated.len() as f64 / gen_secs.max(1e-9),
        prompt_tokens,
        generated,
        text: text_out,
        stop,
    };
    let peak = crate::mem::peak_rss_bytes().unwrap_or(0);
    if as_json {
        let mut o = json::Object::new();
        o.arr("prompt_tokens", |arr| {
            for &t in &g.prompt_tokens {
                arr.u64(t as u64);
            }
        });
        o.arr("generated", |arr| {
            for &t in &g.generated {
                arr.u64(t as u64);
            }
        });
        o.str("text", &g.text).f64("prompt_tps", g.prompt_tps).f64("gen_tps", g.gen_tps).str("stop", g.stop);
        o.u64("arena_bytes", arena_bytes as u64).u64("peak_rss_bytes", peak);
        // host-wasi's fields: `tokens` (the prompt's ids) and the logits digests.
        let (all, rows) = digest.unwrap_or_default().finish();
        o.arr("tokens", |arr| {
            for &t in &g.prompt_tokens {
                arr.u64(t as u64);
            }
        });
        o.str("logits_sha256", &all).arr("row_sha256", |arr| {
            for r in &rows {
                arr.str(r);
            }
        });
        o.print();
    } else {
        let _ = writeln!(out);
        drop(out);
        eprintln!(
            "\nkeel: prompt {} tokens, {:.1} t/s | generated {} tokens, {:.1} t/s ({}) | arena {} | peak RSS {} | {} threads, {} kernels",
            g.prompt_tokens.len(),
            g.prompt_tps,
            g.generated.len(),
            g.gen_tps,
            g.stop,
            mib(arena_bytes as u64),
            mib(peak),
            opts.threads,
            e.session.kernels().name()
        );
    }
    Ok(())
}

//! `keel run`: generate text from a prompt, streaming it, then report speed and memory.

use super::args::Args;
use super::common::{chat_prompt, check_finite, mib, prompt, run_options, sampling, tokenize};
use super::load::{engine, open, prepare};
use crate::fault::stdout_ok;
use crate::json;
use anyhow::Result;
use crate::device::offload::Devices;
use keel_core::engine::Engine;
use keel_core::placement::{weight_count, Decision, Exec, Placement};
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
    let n_predict = a.value_or(&["-n", "--n-predict"], "a token count", 128usize)?;
    let opts = run_options(&mut a, 1)?;
    let text = prompt(&mut a, opts.n_ctx)?;
    // Generation stops at the context's end anyway: a larger -n means "until then".
    let n_predict = n_predict.min(opts.n_ctx);
    let sampling = sampling(&mut a)?;
    let chat = a.flag(&["--chat"]);
    let system: Option<String> = a.value(&["--system"], "a system message")?;
    let as_json = a.flag(&["--json"]);
    let offload = super::offload::OffloadOptions::parse(&mut a)?;
    a.finish()?;
    let mut devices = offload.open()?;

    let opened = open(&model)?;
    let g = opened.gguf()?;
    let mut loaded = prepare(&g, &opened.path, &opts)?;
    let arena_bytes = loaded.arena.len();
    let (mut e, pool) = engine(&g, &opened.path, &mut loaded, opts.reference, sampling)?;
    if system.is_some() && !chat {
        anyhow::bail!("--system needs --chat");
    }
    let prompt_tokens = if chat {
        chat_prompt(&g, &opened.path, system.as_deref(), &text)?.tokenize(&e.tokenizer, true, opts.n_ctx)?
    } else {
        tokenize(&e.tokenizer, &text, true, true, opts.n_ctx)?
    };
    let mut slots = vec![Decision::EMPTY; weight_count(&e.model)];
    let placement = devices.plan(&e.model, &offload.policy, e.session.n_ctx(), &mut slots).map_err(|err| anyhow::anyhow!("{}: {err}", opened.path.display()))?;
    let use_devices = !devices.slots.is_empty();
    if use_devices {
        devices.load(&e.model, &placement, &e.session.kernels()).map_err(|err| anyhow::anyhow!("loading weights onto the device: {err}"))?;
        super::offload::print_placement(&placement, &devices);
        super::offload::print_breakdown("after load", &devices.breakdown(), super::offload::host_breakdown(&e, Some(&placement)));
    }

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
    step(&mut e, &prompt_tokens, pool, use_devices, &placement, &mut devices)?;
    let batches_before = devices.batches();
    let mut n_evals = 0u64;
    let prompt_secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut stop = "length";
    for i in 0..n_predict {
        check_finite(e.session.last_logits(e.n_vocab()), e.session.first_non_finite(), || if i == 0 { "generation step 1 (the prompt's last position)".into() } else { format!("generation step {}", i + 1) })?;
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
                // Nobody reads a closed pipe: stop quietly (fault::stdout_ok).
                let _ = stdout_ok(out.write_all(s.as_bytes()).and_then(|_| out.flush()));
            }
        });
        if e.session.n_past() >= e.session.n_ctx() {
            stop = "context full";
            break;
        }
        step(&mut e, &[tok], pool, use_devices, &placement, &mut devices)?;
        n_evals += 1;
    }
    stream.finish(|s: &str| {
        text_out.push_str(s);
        if !as_json {
            let _ = stdout_ok(out.write_all(s.as_bytes()));
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
    let gen_batches = devices.batches() - batches_before;
    let per_token = if n_evals > 0 { gen_batches as f64 / n_evals as f64 } else { 0.0 };
    let host = super::offload::host_breakdown(&e, Some(&placement));
    let breakdown = devices.breakdown();
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
        o.str("kernels", e.session.kernels().name());
        o.u64("arena_bytes", arena_bytes as u64).u64("peak_rss_bytes", peak);
        o.u64("offloaded_weights", placement.n_on_devices() as u64).u64("matrix_weights", placement.decisions().len() as u64);
        o.u64("device_batches", devices.batches()).f64("device_batches_per_token", per_token);
        o.str("offload_mode", super::offload::mode_name(offload.policy.mode)).u64("device_layers", super::offload::whole_layers(&placement, e.model.layers.len()) as u64);
        o.bool("device_forward", placement.forward_device(1).is_some());
        if use_devices && placement.n_on_devices() == 0 {
            o.str("placement_warning", "devices were given but nothing was placed on them: every op ran on the CPU");
        }
        super::offload::breakdown_json(&mut o, "memory_breakdown", &breakdown, host);
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
        let _ = stdout_ok(writeln!(out).and_then(|_| out.flush()));
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
    if use_devices {
        eprintln!("keel: device batches: {} in all, {per_token:.1} per generated token", devices.batches());
        super::offload::print_breakdown("at exit", &breakdown, host);
    }
    Ok(())
}

/// Evaluates `tokens`, on the devices when there are any; a device failure ends the
/// request with the device's own error (which device, what happened).
pub fn step(e: &mut Engine<'_>, tokens: &[u32], pool: &crate::pool::ThreadPool, use_devices: bool, placement: &Placement<'_>, devices: &mut Devices) -> Result<()> {
    let r = if use_devices {
        let mut exec = Exec { placement, offload: devices };
        e.eval_on(tokens, Outputs::Last, pool, Some(&mut exec)).map(|_| ())
    } else {
        e.eval(tokens, Outputs::Last, pool).map(|_| ())
    };
    match r {
        Err(keel_core::Error::Device { .. }) => match devices.error.take() {
            Some(err) => Err(anyhow::anyhow!("{err} (the request was stopped; nothing ran on the CPU in its place)")),
            None => Err(anyhow::anyhow!("a device failed mid-request")),
        },
        other => other.map_err(Into::into),
    }
}

//! `keel run`: generate text from a prompt, streaming it, then report speed and memory.

use super::common::{chat_prompt, check_finite, mib, report_random_seed, tokenize, ModelFlag, PromptFlags, EvalFlags};
use super::load::{engine, open_for_cpu, open_to_run, prepare_with};
use crate::fault::stdout_ok;
use serde::Serialize;
use anyhow::Result;
use crate::device::offload::Devices;
use keel_core::engine::Engine;
use keel_core::placement::{weight_count, Decision, Exec, Placement};
use keel_core::session::Outputs;
use keel_core::speculative::{Lookup, ModelDrafter, Runner};
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

/// `keel run`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Generation stops at the context's end whatever -n says. After load and at exit, a run with --device prints each device's memory (model, context, compute, free, as the device measured it); a run that places nothing on a device says so loudly.")]
pub struct RunArgs {
    /// The model (`-m`).
    #[command(flatten)]
    pub model: ModelFlag,
    /// The prompt (`-p`, `-f`, `-e`).
    #[command(flatten)]
    pub prompt: PromptFlags,
    /// Tokens to generate (at most the context's end)
    #[arg(short = 'n', long = "n-predict", value_name = "N", default_value_t = 128)]
    pub n_predict: usize,
    /// Wrap the prompt as one user turn in the model's chat format
    #[arg(long = "chat")]
    pub chat: bool,
    /// System message for --chat (replaces the template's default)
    #[arg(long = "system", value_name = "TEXT", allow_hyphen_values = true)]
    pub system: Option<String>,
    /// Print one JSON object instead of streaming text
    #[arg(long = "json")]
    pub json: bool,
    /// `-c`, the run limits, `--batches`.
    #[command(flatten)]
    pub eval: EvalFlags,
    /// The sampling flags, `--ignore-eos`, `-r`.
    #[command(flatten)]
    pub gen: GenFlags,
    /// `--device` and the `--offload-*` flags.
    #[command(flatten)]
    pub offload: super::offload::OffloadFlags,
    /// `--draft-model`, `--draft-max`, `--lookup`, `--draft-fixed`, `--device-draft`.
    #[command(flatten)]
    pub spec: super::speculate::SpecFlags,
}

/// Generation controls shared by `run` and `chat`: the sampling flags, `--ignore-eos`, `-r`.
#[derive(clap::Args, Debug, Clone)]
pub struct GenFlags {
    /// The sampling flags.
    #[command(flatten)]
    pub sampling: super::common::SamplingFlags,
    /// Do not stop at an end-of-generation token: such tokens are never sampled
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// Stop when the generated text ends with TEXT (a stop string; may be given several times)
    #[arg(short = 'r', long = "reverse-prompt", visible_alias = "stop", value_name = "TEXT", allow_hyphen_values = true, action = clap::ArgAction::Append)]
    pub reverse_prompt: Vec<String>,
}

/// Samples the next token; with `--ignore-eos` from the last row with every
/// end-of-generation token's logit at -inf (`row` is the caller's buffer for that copy).
pub fn sample(e: &mut Engine<'_>, ignore_eos: bool, row: &mut Vec<f32>) -> u32 {
    if !ignore_eos {
        return e.sample();
    }
    row.clear();
    row.extend_from_slice(e.session.last_logits(e.n_vocab()));
    for &t in e.tokenizer.eog_tokens() {
        if let Some(v) = row.get_mut(t as usize) {
            *v = f32::NEG_INFINITY;
        }
    }
    e.sampler.sample(row)
}

/// True if one of `stops` occurs in `text` ending after byte `from` (the text before
/// `from` was checked already): a stop string found inside the last token's text counts,
/// as in llama.cpp's reverse prompts.
pub fn stop_found(text: &str, from: usize, stops: &[String]) -> bool {
    let t = text.as_bytes();
    stops.iter().filter(|s| !s.is_empty()).any(|s| {
        let start = (from + 1).saturating_sub(s.len());
        t.get(start..).is_some_and(|tail| tail.windows(s.len()).any(|w| w == s.as_bytes()))
    })
}

/// `keel run --json`.
#[derive(Serialize)]
struct RunJson<'a> {
    prompt_tokens: &'a [u32],
    generated: &'a [u32],
    text: &'a str,
    prompt_tps: f64,
    gen_tps: f64,
    stop: &'a str,
    seed: u64,
    batches: &'static str,
    kernels: &'static str,
    /// Matrices packed in the rows16 layout for the CPU's kernels (`Opened::pack_for_cpu`).
    rows16_matrices: u64,
    arena_bytes: u64,
    peak_rss_bytes: u64,
    offloaded_weights: u64,
    matrix_weights: u64,
    device_batches: u64,
    device_batches_per_token: f64,
    device_in_flight: u64,
    device_pipelined: u64,
    offload_mode: &'static str,
    device_layers: u64,
    device_forward: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    placement_warning: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    speculative: Option<super::speculate::SpecJson>,
    memory_breakdown: Vec<super::offload::BreakdownJson>,
    /// host-wasi's fields: `tokens` (the prompt's ids) and the logits digests (absent with
    /// speculation: its verify batches' rows are not digested).
    tokens: &'a [u32],
    #[serde(skip_serializing_if = "Option::is_none")]
    logits_sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    row_sha256: Option<Vec<String>>,
}

/// Runs the subcommand.
pub fn main(a: RunArgs) -> Result<()> {
    let spec = super::speculate::SpecOptions::from_flags(&a.spec)?;
    if spec.is_some() && a.gen.ignore_eos {
        anyhow::bail!("--ignore-eos does not go with speculative decoding (--draft-model / --lookup); drop one of them");
    }
    // A verify batch needs logits for the pending token and every draft.
    let opts = a.eval.options(spec.as_ref().map_or(1, |s| s.n_max + 1))?;
    let text = a.prompt.text(opts.n_ctx)?;
    // Generation stops at the context's end anyway: a larger -n means "until then".
    let n_predict = a.n_predict.min(opts.n_ctx);
    let (sampling, random_seed) = a.gen.sampling.config()?;
    let chat = a.chat;
    if a.system.is_some() && !chat {
        anyhow::bail!("--system needs --chat");
    }
    let system = a.system.clone().map(|s| a.prompt.escaped(s));
    let stops: Vec<String> = a.gen.reverse_prompt.iter().map(|s| a.prompt.escaped(s.clone())).collect();
    let as_json = a.json;
    let offload = super::offload::OffloadOptions::from_flags(&a.offload)?;
    let mut devices = offload.open()?;
    let mut draft_devices = match &spec {
        Some(s) => s.draft_devices.open()?,
        None => crate::device::offload::Devices::none(),
    };

    // On the CPU alone: placed by thread and packed for its kernels (`open_for_cpu`).
    let opened = if devices.slots.is_empty() { open_for_cpu(&a.model.model, opts.reference, opts.threads)? } else { open_to_run(&a.model.model)? };
    let g = opened.gguf()?;
    let mut loaded = prepare_with(&g, &opened.path, &opts, spec.is_some())?;
    let arena_bytes = loaded.arena.len();
    let (mut e, pool) = engine(&g, &opened.path, &mut loaded, opts.reference, sampling)?;
    e.session.set_llama_cpp_batches(a.eval.llama_cpp());
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
    report_random_seed(&sampling, random_seed);

    // The draft model, with its own arena and placement (`--device-draft`).
    let draft_on_cpu = draft_devices.slots.is_empty();
    let draft_opened = spec.as_ref().and_then(|s| s.draft_model.as_deref()).map(|m| if draft_on_cpu { open_for_cpu(m, opts.reference, opts.threads) } else { open_to_run(m) }).transpose()?;
    let draft_g = draft_opened.as_ref().map(|o| o.gguf()).transpose()?;
    let mut draft_loaded = match (&draft_g, &draft_opened) {
        (Some(dg), Some(o)) => Some(super::speculate::prepare_draft(dg, &o.path, &opts)?),
        _ => None,
    };
    let mut draft_engine = match (&draft_g, &draft_opened, draft_loaded.as_mut()) {
        (Some(dg), Some(o), Some(l)) => Some(super::speculate::draft_engine(dg, &o.path, l, opts.reference, sampling, &e, &opened.path)?),
        _ => None,
    };
    let mut draft_slots = vec![Decision::EMPTY; draft_engine.as_ref().map_or(0, |de| weight_count(&de.model))];
    let draft_placement = match (&draft_engine, &spec) {
        (Some(de), Some(s)) => {
            let p = draft_devices.plan(&de.model, &s.draft_devices.policy, de.session.n_ctx(), &mut draft_slots).map_err(|err| anyhow::anyhow!("draft model: {err}"))?;
            if !draft_devices.slots.is_empty() {
                draft_devices.load(&de.model, &p, &de.session.kernels()).map_err(|err| anyhow::anyhow!("loading the draft model's weights onto the device: {err}"))?;
                eprint!("keel: draft model: ");
                super::offload::print_placement(&p, &draft_devices);
            }
            Some(p)
        }
        _ => None,
    };
    let mut spec_arena = match &spec {
        Some(s) => {
            let mut p = keel_core::arena::Plan::empty();
            keel_core::speculative::plan(&mut p, e.n_vocab(), opts.n_ctx, s.n_max)?;
            vec![0u8; p.total_bytes()]
        }
        None => Vec::new(),
    };
    let mut spec_stats = None;

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut stream = Utf8Stream::new();
    let mut piece = vec![0u8; e.tokenizer.max_piece_len()];
    let mut generated = Vec::with_capacity(n_predict);
    let mut text_out = String::with_capacity(n_predict * 8);
    // With --json: digests of every row a token is chosen from (see logits_digest.rs).
    let mut digest = as_json.then(super::logits_digest::LogitsDigest::default);
    let mut row = Vec::new();

    // Speculation's parts, made before anything is timed.
    let mut spec_plan = keel_core::arena::Plan::empty();
    let mut calib = None;
    let mut sp = match &spec {
        Some(sopts) => {
            keel_core::speculative::plan(&mut spec_plan, e.n_vocab(), opts.n_ctx, sopts.n_max)?;
            let mut carver = keel_core::arena::carve(&mut spec_arena, &spec_plan).map_err(keel_core::Error::from)?;
            let (cfg, c) = sopts.config(|| super::speculate::measure_costs(&mut e, draft_engine.as_mut(), pool, sopts.n_max))?;
            calib = c;
            Some(keel_core::speculative::Speculator::new(&mut carver, &spec_plan, cfg, sampling, e.n_vocab())?)
        }
        None => None,
    };

    let t0 = Instant::now();
    if sp.is_none() {
        step(&mut e, &prompt_tokens, pool, use_devices, &placement, &mut devices)?;
    }
    let batches_before = devices.batches();
    let mut n_evals = 0u64;
    let mut prompt_secs = t0.elapsed().as_secs_f64();
    let mut t1 = Instant::now();
    let mut stop = "length";
    if let Some(sp) = sp.as_mut() {
        let use_draft_devices = !draft_devices.slots.is_empty();
        let mut target = Runner { model: &e.model, session: &mut e.session, par: pool, exec: use_devices.then_some(Exec { placement: &placement, offload: &mut devices }) };
        let tokenizer = &e.tokenizer;
        let hit_stop = &mut false;
        let emit = |tok: u32| {
            if tokenizer.is_eog(tok) {
                return false;
            }
            generated.push(tok);
            let checked = text_out.len();
            let n = tokenizer.piece(tok, true, &mut piece).unwrap_or(0);
            stream.push(&piece[..n], |s: &str| {
                text_out.push_str(s);
                if !as_json {
                    let _ = stdout_ok(out.write_all(s.as_bytes()).and_then(|_| out.flush()));
                }
            });
            if stop_found(&text_out, checked, &stops) {
                *hit_stop = true;
                return false;
            }
            true
        };
        let mut model_drafter = match (draft_engine.as_mut(), draft_placement.as_ref()) {
            (Some(de), Some(dp)) => Some(ModelDrafter::new(Runner { model: &de.model, session: &mut de.session, par: pool, exec: use_draft_devices.then_some(Exec { placement: dp, offload: &mut draft_devices }) })),
            _ => None,
        };
        let mut lookup = Lookup::default();
        let drafter: &mut dyn keel_core::speculative::Drafter = match model_drafter.as_mut() {
            Some(d) => d,
            None => &mut lookup,
        };
        // The prompt (all but its last token, which the first step verifies with the drafts).
        let r = sp.start(&mut target, drafter, &prompt_tokens).and_then(|_| {
            prompt_secs = t0.elapsed().as_secs_f64();
            t1 = Instant::now();
            super::speculate::generate(sp, &mut target, drafter, n_predict, calib.take(), emit)
        });
        drop(target);
        drop(model_drafter);
        stop = match r {
            Ok(_) if *hit_stop => "stop string",
            Ok(s) => s,
            Err(keel_core::Error::Device { .. }) => match devices.error.take().or_else(|| draft_devices.error.take()) {
                Some(err) => anyhow::bail!("{err} (the request was stopped; nothing ran on the CPU in its place)"),
                None => anyhow::bail!("a device failed mid-request"),
            },
            Err(err) => return Err(err.into()),
        };
        spec_stats = Some(sp.stats());
    }
    for i in 0..if spec_stats.is_some() { 0 } else { n_predict } {
        check_finite(e.session.last_logits(e.n_vocab()), e.session.first_non_finite(), || if i == 0 { "generation step 1 (the prompt's last position)".into() } else { format!("generation step {}", i + 1) })?;
        if let Some(d) = digest.as_mut() {
            d.row(e.session.last_logits(e.n_vocab()));
        }
        let tok = sample(&mut e, a.gen.ignore_eos, &mut row);
        if e.tokenizer.is_eog(tok) {
            stop = "end of generation";
            break;
        }
        generated.push(tok);
        let checked = text_out.len();
        let n = e.tokenizer.piece(tok, true, &mut piece).unwrap_or(0);
        stream.push(&piece[..n], |s: &str| {
            text_out.push_str(s);
            if !as_json {
                // Nobody reads a closed pipe: stop quietly (fault::stdout_ok).
                let _ = stdout_ok(out.write_all(s.as_bytes()).and_then(|_| out.flush()));
            }
        });
        if stop_found(&text_out, checked, &stops) {
            stop = "stop string";
            break;
        }
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
        let (all, rows) = digest.unwrap_or_default().finish();
        let (all, rows) = if spec_stats.is_some() { (None, None) } else { (Some(all), Some(rows)) };
        let j = RunJson {
            prompt_tokens: &g.prompt_tokens,
            generated: &g.generated,
            text: &g.text,
            prompt_tps: g.prompt_tps,
            gen_tps: g.gen_tps,
            stop: g.stop,
            seed: sampling.seed,
            batches: if a.eval.llama_cpp() { "llama-cpp" } else { "invariant" },
            kernels: e.session.kernels().name(),
            rows16_matrices: opened.rows16_matrices() as u64,
            arena_bytes: arena_bytes as u64,
            peak_rss_bytes: peak,
            offloaded_weights: placement.n_on_devices() as u64,
            matrix_weights: placement.decisions().len() as u64,
            device_batches: devices.batches(),
            device_batches_per_token: per_token,
            device_in_flight: devices.in_flight() as u64,
            device_pipelined: devices.passes_begun(),
            offload_mode: super::offload::mode_name(offload.policy.mode),
            device_layers: super::offload::whole_layers(&placement, e.model.layers.len()) as u64,
            device_forward: placement.forward_device(1).is_some(),
            placement_warning: (use_devices && placement.n_on_devices() == 0).then_some("devices were given but nothing was placed on them: every op ran on the CPU"),
            speculative: match (&spec_stats, &spec) {
                (Some(st), Some(sopts)) => super::speculate::report(st, &sopts.name(), g.gen_tps, draft_devices.batches(), true),
                _ => None,
            },
            memory_breakdown: super::offload::breakdown_json(&breakdown, host),
            tokens: &g.prompt_tokens,
            logits_sha256: all,
            row_sha256: rows,
        };
        crate::cli::print_json(&j);
    } else {
        let _ = stdout_ok(writeln!(out).and_then(|_| out.flush()));
        drop(out);
        eprintln!(
            "\nkeel: prompt {} tokens, {:.1} t/s | generated {} tokens, {:.1} t/s ({}) | arena {} | peak RSS {} | {} threads, {} kernels{}",
            g.prompt_tokens.len(),
            g.prompt_tps,
            g.generated.len(),
            g.gen_tps,
            g.stop,
            mib(arena_bytes as u64),
            mib(peak),
            opts.threads,
            e.session.kernels().name(),
            match opened.rows16_matrices() {
                0 => String::new(),
                n => format!(" ({n} matrices in rows16)"),
            }
        );
    }
    if let (Some(st), Some(sopts), false) = (&spec_stats, &spec, as_json) {
        super::speculate::report(st, &sopts.name(), g.gen_tps, draft_devices.batches(), false);
    }
    if use_devices {
        eprintln!("keel: device batches: {} in all, {per_token:.1} per generated token, up to {} in flight", devices.batches(), devices.in_flight());
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

//! `keel eval`: evaluate a prompt in one batch and print, per position, the log-sum-exp
//! and the top logits; optionally dump the last row.

use super::args::Args;
use super::common::{check_finite, prompt, prompt_file_limit, read_text_limited, run_options, tokenize};
use super::load::{engine, open, prepare};
use crate::json;
use anyhow::{bail, Context, Result};
use keel_core::sampler::SamplerConfig;
use keel_core::session::Outputs;

/// Runs the subcommand.
pub fn main(mut a: Args) -> Result<()> {
    let model = a.value::<String>(&["-m", "--model"], "a model file or name")?.unwrap_or_else(|| "smollm2-135m".into());
    let tokens_file: Option<String> = a.value(&["--tokens-file"], "a JSON array of token ids")?;
    let top_k = a.value_or(&["--top-k"], "a count", 10usize)?;
    let dump: Option<String> = a.value(&["--dump-last"], "an output file")?;
    let _ = a.flag(&["--json"]);
    let mut opts = run_options(&mut a, 1)?;
    let text = if tokens_file.is_none() { Some(prompt(&mut a, opts.n_ctx)?) } else { None };
    a.finish()?;

    let opened = open(&model)?;
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
    let mut o = json::Object::new();
    o.arr("tokens", |arr| {
        for &t in &ids {
            arr.u64(t as u64);
        }
    });
    o.arr("positions", |arr| {
        for i in 0..ids.len() {
            let row = &logits[i * v..(i + 1) * v];
            let lse = keel_core::ops::log_sum_exp(row);
            let mut idx: Vec<u32> = (0..v as u32).collect();
            let k = top_k.min(v);
            idx.select_nth_unstable_by(k.saturating_sub(1), |&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
            idx.truncate(k);
            idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
            arr.obj(|p| {
                p.f64("lse", lse);
                p.arr("top", |t| {
                    for &id in &idx {
                        t.arr(|pair| {
                            pair.u64(id as u64).f32(row[id as usize]);
                        });
                    }
                });
            });
        }
    });
    o.print();
    Ok(())
}

//! `keel info` and `keel plan`: what a model file holds, and the arena it needs.

use super::args::Args;
use super::common::{mib, run_options};
use super::load::open;
use crate::json;
use anyhow::Result;
use keel_core::gguf::Value;
use keel_core::model::HParams;
use keel_core::session::SessionConfig;
use std::collections::BTreeMap;

fn model_arg(a: &mut Args) -> Result<String> {
    let m: Option<String> = a.value(&["-m", "--model"], "a model file or name")?;
    Ok(match m {
        Some(m) => m,
        None => a.positionals().into_iter().next().ok_or_else(|| anyhow::anyhow!("give the model: keel info MODEL"))?,
    })
}

fn show(v: &Value<'_>) -> String {
    match v {
        Value::Str(s) => format!("{:?}", String::from_utf8_lossy(s)),
        Value::Array(a) => format!("[{} x {}]", a.len(), a.elem.name()),
        Value::F32(f) => format!("{f}"),
        Value::F64(f) => format!("{f}"),
        Value::Bool(b) => format!("{b}"),
        other => other.as_int().map(|i| i.to_string()).unwrap_or_default(),
    }
}

/// `keel info MODEL`.
pub fn info(mut a: Args) -> Result<()> {
    let as_json = a.flag(&["--json"]);
    let model = model_arg(&mut a)?;
    a.finish()?;
    let opened = open(&model)?;
    let g = opened.gguf()?;
    let mut by_type: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for t in g.tensors() {
        let e = by_type.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.data.len() as u64;
    }
    // The same checks a run does: hyper-parameters, then every tensor's presence, shape and type.
    let hp = HParams::from_gguf(&g).map_err(keel_core::Error::from).and_then(|hp| {
        let mut table: Vec<std::mem::MaybeUninit<keel_core::model::Layer<'_>>> = (0..hp.n_layer).map(|_| std::mem::MaybeUninit::uninit()).collect();
        keel_core::model::Model::load(&g, hp, &mut table).map(|_| hp)
    });
    let hp = hp.map_err(|e| anyhow::anyhow!("{}: {e}", opened.path.display()));
    if as_json {
        let mut o = json::Object::new();
        o.str("path", &opened.path.display().to_string()).u64("version", g.version() as u64).u64("n_tensors", g.n_tensors() as u64);
        o.obj("tensor_types", |t| {
            for (k, (n, _)) in &by_type {
                t.u64(k, *n as u64);
            }
        });
        o.obj("metadata", |m| {
            for i in 0..g.n_keys() {
                if let Some((k, v)) = g.key_at(i) {
                    m.str(&String::from_utf8_lossy(k), &show(&v));
                }
            }
        });
        match &hp {
            Ok(hp) => {
                o.str("hparams", &format!("{hp:?}"));
            }
            Err(e) => {
                o.str("error", &e.to_string());
            }
        }
        o.print();
    } else {
        println!("{}: GGUF v{}, {} tensors, {} metadata keys", opened.path.display(), g.version(), g.n_tensors(), g.n_keys());
        for i in 0..g.n_keys() {
            if let Some((k, v)) = g.key_at(i) {
                println!("  {:<44} {}", String::from_utf8_lossy(k), show(&v));
            }
        }
        println!("tensors by type:");
        for (k, (n, b)) in &by_type {
            println!("  {k:<8} {n:>5} tensors {:>12}", mib(*b));
        }
        if let Ok(hp) = &hp {
            println!("hyper-parameters: {hp:?}");
        }
    }
    hp.map(|_| ())
}

/// `keel plan -m MODEL [-c N] [-b N]`.
pub fn plan(mut a: Args) -> Result<()> {
    let as_json = a.flag(&["--json"]);
    let model = model_arg(&mut a)?;
    let opts = run_options(&mut a, 1)?;
    a.finish()?;
    let opened = open(&model)?;
    let g = opened.gguf()?;
    let cfg = SessionConfig { n_ctx: opts.n_ctx, n_batch: opts.n_batch.min(opts.n_ctx), n_outputs: opts.n_outputs, n_threads: opts.threads };
    let p = keel_core::engine::plan(&g, &cfg).map_err(|e| anyhow::anyhow!("{}: {e}", opened.path.display()))?;
    if as_json {
        let mut o = json::Object::new();
        o.u64("total_bytes", p.total_bytes() as u64);
        o.obj("config", |c| {
            c.u64("n_ctx", cfg.n_ctx as u64).u64("n_batch", cfg.n_batch as u64).u64("n_outputs", cfg.n_outputs as u64).u64("n_threads", cfg.n_threads as u64);
        });
        o.arr("regions", |arr| {
            for r in p.regions() {
                arr.obj(|x| {
                    x.str("name", r.name).u64("offset", r.offset as u64).u64("bytes", r.bytes as u64);
                });
            }
        });
        o.print();
    } else {
        println!("arena plan for {} (n_ctx {}, n_batch {}, {} threads):", opened.path.display(), cfg.n_ctx, cfg.n_batch, cfg.n_threads);
        for r in p.regions() {
            println!("  {:<14} {:>12} bytes  ({})", r.name, r.bytes, mib(r.bytes as u64));
        }
        println!("  {:<14} {:>12} bytes  ({})", "total", p.total_bytes(), mib(p.total_bytes() as u64));
    }
    Ok(())
}

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

/// `keel plan -m MODEL [-c N] [-b N] [--placement [--device LIST] [--offload-* …]]`.
pub fn plan(mut a: Args) -> Result<()> {
    let as_json = a.flag(&["--json"]);
    let placement = a.flag(&["--placement"]);
    let model = model_arg(&mut a)?;
    let opts = run_options(&mut a, 1)?;
    let offload = if placement { Some(super::offload::OffloadOptions::parse(&mut a)?) } else { None };
    a.finish()?;
    let opened = open(&model)?;
    let g = opened.gguf()?;
    let cfg = SessionConfig { n_ctx: opts.n_ctx, n_batch: opts.n_batch.min(opts.n_ctx), n_outputs: opts.n_outputs, n_threads: opts.threads };
    if let Some(off) = offload {
        return print_op_placement(&g, &opened.path, &off, cfg.n_ctx, as_json);
    }
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

/// `keel plan --placement`: for every layer, each op of its block (`keel_core::block`) and
/// where it runs (`Placement::op_place`), and why when it is the CPU.
fn print_op_placement(g: &keel_core::gguf::Gguf<'_>, path: &std::path::Path, off: &super::offload::OffloadOptions, n_ctx: usize, as_json: bool) -> Result<()> {
    use keel_core::block::{self, Op};
    use keel_core::placement::{weight_count, Decision, OpPlace, WeightId, WeightKind, Where, OUTPUT_LAYER};
    let ctx = |e: keel_core::Error| anyhow::anyhow!("{}: {e}", path.display());
    let hp = HParams::from_gguf(g).map_err(|e| ctx(e.into()))?;
    let mut table: Vec<std::mem::MaybeUninit<keel_core::model::Layer<'_>>> = (0..hp.n_layer).map(|_| std::mem::MaybeUninit::uninit()).collect();
    let model = keel_core::model::Model::load(g, hp, &mut table).map_err(ctx)?;
    let devices = off.open()?;
    let mut slots = vec![Decision::EMPTY; weight_count(&model)];
    let placement = devices.plan(&model, &off.policy, n_ctx, &mut slots).map_err(ctx)?;
    let label = |d: u8| devices.slots.get(usize::from(d)).map_or_else(|| format!("device{d}"), |s| s.label.clone());
    let place = |p: OpPlace| match p {
        OpPlace::Device(d) => (label(d), None),
        OpPlace::Cpu(why) => ("cpu".to_string(), Some(why)),
    };
    let tensor = |op: &Op| -> Option<&'static str> {
        match op {
            Op::MatMul { w, .. } => Some(w.name()),
            Op::Norm { w, .. } | Op::Bias { w, .. } | Op::HeadNorm { w, .. } => Some(w.name()),
            Op::Residual { post_norm, .. } => post_norm.map(|p| p.name()),
            _ => None,
        }
    };
    let window = |op: &Op| match op {
        Op::Attention { window } if *window > 0 => Some(*window),
        _ => None,
    };
    let output = WeightId { layer: OUTPUT_LAYER, kind: WeightKind::Output };
    let out_place = match placement.decision(output).map(|d| d.place) {
        Some(Where::Device(d)) => (label(d), None),
        Some(Where::Cpu(r)) => ("cpu".to_string(), Some(r.describe())),
        None => ("cpu".to_string(), Some("no decision")),
    };
    let mixer = |l: usize| match model.layers[l].mixer {
        keel_core::model::Mixer::Attention(_) => "attention",
        keel_core::model::Mixer::DeltaNet(_) => "delta-net",
    };
    if as_json {
        let mut o = json::Object::new();
        o.str("model", &path.display().to_string());
        o.arr("devices", |arr| {
            for s in &devices.slots {
                arr.str(&s.label);
            }
        });
        o.arr("layers", |arr| {
            block::for_each_block(&model, |l, ops| {
                arr.obj(|x| {
                    x.u64("layer", l as u64).str("mixer", mixer(l));
                    match placement.layer_device(l) {
                        Some(d) => x.str("whole_on", &label(d)),
                        None => x.null("whole_on"),
                    };
                    x.arr("ops", |oa| {
                        for op in ops.iter() {
                            let (at, why) = place(placement.op_place(&model, l, op));
                            oa.obj(|y| {
                                y.str("op", op.name());
                                match tensor(op) {
                                    Some(t) => y.str("tensor", t),
                                    None => y.null("tensor"),
                                };
                                if let Some(w) = window(op) {
                                    y.u64("window", w as u64);
                                }
                                y.str("where", &at);
                                match why {
                                    Some(w) => y.str("why", w),
                                    None => y.null("why"),
                                };
                            });
                        }
                    });
                });
            });
        });
        o.obj("output", |x| {
            x.str("where", &out_place.0);
            match out_place.1 {
                Some(w) => x.str("why", w),
                None => x.null("why"),
            };
            match placement.forward_placed() {
                Some((d, _)) => x.str("whole_forward_on", &label(d)),
                None => x.null("whole_forward_on"),
            };
        });
        o.print();
        return Ok(());
    }
    let names: Vec<String> = devices.slots.iter().map(|s| s.label.clone()).collect();
    println!("op placement for {} (devices: {}; n_ctx {n_ctx}):", path.display(), if names.is_empty() { "none, cpu only".to_string() } else { names.join(", ") });
    block::for_each_block(&model, |l, ops| {
        match placement.layer_device(l) {
            Some(d) => println!("layer {l} ({}): whole on {}", mixer(l), label(d)),
            None => println!("layer {l} ({}):", mixer(l)),
        }
        for op in ops.iter() {
            let (at, why) = place(placement.op_place(&model, l, op));
            let name = match (tensor(op), window(op)) {
                (Some(t), _) => format!("{} {t}", op.name()),
                (None, Some(w)) => format!("{} (window {w})", op.name()),
                (None, None) => op.name().to_string(),
            };
            match why {
                Some(w) => println!("  {name:<28} {at:<14} ({w})"),
                None => println!("  {name:<28} {at}"),
            }
        }
    });
    match out_place.1 {
        Some(w) => println!("output projection: {} ({w})", out_place.0),
        None => println!("output projection: {}", out_place.0),
    }
    if let Some((d, _)) = placement.forward_placed() {
        println!("whole forward pass (embedding lookup to logits): {}", label(d));
    }
    Ok(())
}

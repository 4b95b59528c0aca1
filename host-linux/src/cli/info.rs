//! `keel info` and `keel plan`: what a model file holds, and the arena it needs.

use super::common::{mib, CtxFlag, RunFlags};
use super::load::open;
use serde::Serialize;
use anyhow::Result;
use keel_core::gguf::Value;
use keel_core::model::HParams;
use keel_core::session::SessionConfig;
use std::collections::BTreeMap;

/// `keel info`.
#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    /// The model: a .gguf file or a known name
    #[arg(value_name = "MODEL", required_unless_present = "model")]
    pub path: Option<String>,
    /// The model, as the other commands take it (instead of MODEL)
    #[arg(short = 'm', long = "model", value_name = "MODEL", conflicts_with = "path")]
    pub model: Option<String>,
    /// Print one JSON object: path, version, tensor counts by type, metadata (typed values; arrays as their type and length) and the hyper-parameters keel derived, as fields
    #[arg(long = "json")]
    pub json: bool,
}

/// `keel plan`.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The model (or -m MODEL)
    #[arg(value_name = "MODEL", conflicts_with = "model")]
    pub path: Option<String>,
    /// The model: a .gguf file or a known name
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Option<String>,
    /// For every layer, each op of its block and where it runs (why, when on the CPU), with the --device/--offload-* flags as run takes them
    #[arg(long = "placement")]
    pub placement: bool,
    /// JSON output
    #[arg(long = "json")]
    pub json: bool,
    /// The context length (`-c`).
    #[command(flatten)]
    pub ctx: CtxFlag,
    /// The run limits (`-b`, `-t`, `--reference`, `--force-ctx`).
    #[command(flatten)]
    pub run: RunFlags,
    /// `--device` and the `--offload-*` flags.
    #[command(flatten)]
    pub offload: super::offload::OffloadFlags,
}

/// `-m MODEL` or the positional MODEL.
fn model_arg(path: &Option<String>, model: &Option<String>, cmd: &str) -> Result<String> {
    model.clone().or_else(|| path.clone()).ok_or_else(|| anyhow::anyhow!("give the model: keel {cmd} MODEL"))
}

/// A metadata value as JSON: strings, numbers and booleans as themselves, an array as its
/// element type and length (a vocabulary would be megabytes).
fn value_json(v: &Value<'_>) -> serde_json::Value {
    use serde_json::json;
    match v {
        Value::Str(s) => json!(String::from_utf8_lossy(s)),
        Value::Array(a) => json!({ "array": a.elem.name(), "len": a.len() }),
        // The shortest decimal that reads back as this f32 (1e-5, not 9.999999747378752e-6).
        Value::F32(f) => f.to_string().parse::<f64>().ok().and_then(serde_json::Number::from_f64).map_or(serde_json::Value::Null, serde_json::Value::Number),
        Value::F64(f) => json!(f),
        Value::Bool(b) => json!(b),
        other => other.as_int().map_or(serde_json::Value::Null, |i| json!(i)),
    }
}

/// The hyper-parameters keel derived from the file, as `info --json` prints them.
#[derive(Serialize)]
struct HParamsJson {
    arch: &'static str,
    n_vocab: usize,
    n_embd: usize,
    n_layer: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    head_dim_v: usize,
    n_ff: usize,
    n_ctx_train: usize,
    rms_eps: f32,
    rope_base: f32,
    rope_base_swa: f32,
    n_rot: usize,
    rope_mode: &'static str,
    rope_freq_scale: f32,
    rope_ext_factor: f32,
    rope_attn_factor: f32,
    rope_n_ctx_orig: usize,
    n_swa: usize,
    swa_pattern: usize,
    embd_scale: f32,
    attn_scale: f32,
    q_prescale: bool,
    ffn_act: &'static str,
    attn_gated: bool,
    ssm: Option<SsmJson>,
    /// Layers that are gated delta-net layers (hybrid models).
    recurrent_layers: Vec<usize>,
}

/// Gated delta-net sizes.
#[derive(Serialize)]
struct SsmJson {
    d_conv: usize,
    d_inner: usize,
    d_state: usize,
    n_k_heads: usize,
    n_v_heads: usize,
}

impl HParamsJson {
    fn new(hp: &HParams) -> HParamsJson {
        use keel_core::model::hparams::{FfnAct, RopeMode};
        HParamsJson {
            arch: hp.arch.name(),
            n_vocab: hp.n_vocab,
            n_embd: hp.n_embd,
            n_layer: hp.n_layer,
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim: hp.head_dim,
            head_dim_v: hp.head_dim_v,
            n_ff: hp.n_ff,
            n_ctx_train: hp.n_ctx_train,
            rms_eps: hp.rms_eps,
            rope_base: hp.rope_base,
            rope_base_swa: hp.rope_base_swa,
            n_rot: hp.n_rot,
            rope_mode: match hp.rope_mode {
                RopeMode::Normal => "normal",
                RopeMode::Neox => "neox",
            },
            rope_freq_scale: hp.rope_freq_scale,
            rope_ext_factor: hp.rope_ext_factor,
            rope_attn_factor: hp.rope_attn_factor,
            rope_n_ctx_orig: hp.rope_n_ctx_orig,
            n_swa: hp.n_swa,
            swa_pattern: hp.swa_pattern,
            embd_scale: hp.embd_scale,
            attn_scale: hp.attn_scale,
            q_prescale: hp.q_prescale,
            ffn_act: match hp.ffn_act {
                FfnAct::Silu => "silu",
                FfnAct::GeluTanh => "gelu_tanh",
            },
            attn_gated: hp.attn_gated,
            ssm: hp.ssm.map(|s| SsmJson { d_conv: s.d_conv, d_inner: s.d_inner, d_state: s.d_state, n_k_heads: s.n_k_heads, n_v_heads: s.n_v_heads }),
            recurrent_layers: (0..hp.n_layer).filter(|&l| hp.is_recurrent(l)).collect(),
        }
    }
}

/// `keel info --json`.
#[derive(Serialize)]
struct InfoJson {
    path: String,
    version: u32,
    n_tensors: usize,
    tensor_types: BTreeMap<&'static str, usize>,
    metadata: serde_json::Map<String, serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hparams: Option<HParamsJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
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
pub fn info(a: InfoArgs) -> Result<()> {
    let as_json = a.json;
    let model = model_arg(&a.path, &a.model, "info")?;
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
        let mut metadata = serde_json::Map::new();
        for i in 0..g.n_keys() {
            if let Some((k, v)) = g.key_at(i) {
                metadata.insert(String::from_utf8_lossy(k).into_owned(), value_json(&v));
            }
        }
        crate::cli::print_json(&InfoJson {
            path: opened.path.display().to_string(),
            version: g.version(),
            n_tensors: g.n_tensors() as usize,
            tensor_types: by_type.iter().map(|(k, (n, _))| (*k, *n)).collect(),
            metadata,
            hparams: hp.as_ref().ok().map(HParamsJson::new),
            error: hp.as_ref().err().map(|e| e.to_string()),
        });
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
pub fn plan(a: PlanArgs) -> Result<()> {
    let as_json = a.json;
    let model = model_arg(&a.path, &a.model, "plan")?;
    let opts = a.run.options(a.ctx.ctx_size, 1)?;
    let offload = if a.placement { Some(super::offload::OffloadOptions::from_flags(&a.offload)?) } else { None };
    let opened = open(&model)?;
    let g = opened.gguf()?;
    let cfg = SessionConfig { n_ctx: opts.n_ctx, n_batch: opts.n_batch.min(opts.n_ctx), n_outputs: opts.n_outputs, n_threads: opts.threads };
    if let Some(off) = offload {
        return print_op_placement(&g, &opened.path, &off, cfg.n_ctx, as_json);
    }
    let p = keel_core::engine::plan(&g, &cfg).map_err(|e| anyhow::anyhow!("{}: {e}", opened.path.display()))?;
    if as_json {
        crate::cli::print_json(&PlanJson {
            total_bytes: p.total_bytes(),
            config: ConfigJson { n_ctx: cfg.n_ctx, n_batch: cfg.n_batch, n_outputs: cfg.n_outputs, n_threads: cfg.n_threads },
            regions: p.regions().iter().map(|r| RegionJson { name: r.name, offset: r.offset, bytes: r.bytes }).collect(),
        });
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
        let mut layers = Vec::new();
        block::for_each_block(&model, |l, ops| {
            let ops = ops
                .iter()
                .map(|op| {
                    let (at, why) = place(placement.op_place(&model, l, op));
                    OpJson { op: op.name(), tensor: tensor(op), window: window(op), at, why: why.map(|w| w.to_string()) }
                })
                .collect();
            layers.push(LayerJson { layer: l, mixer: mixer(l), whole_on: placement.layer_device(l).map(label), ops });
        });
        crate::cli::print_json(&PlacementJson {
            model: path.display().to_string(),
            devices: devices.slots.iter().map(|s| s.label.clone()).collect(),
            layers,
            output: OutputJson { at: out_place.0.clone(), why: out_place.1.map(|w| w.to_string()), whole_forward_on: placement.forward_placed().map(|(d, _)| label(d)) },
        });
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

/// `keel plan --json`.
#[derive(Serialize)]
struct PlanJson {
    total_bytes: usize,
    config: ConfigJson,
    regions: Vec<RegionJson>,
}

/// The session limits a plan is for.
#[derive(Serialize)]
struct ConfigJson {
    n_ctx: usize,
    n_batch: usize,
    n_outputs: usize,
    n_threads: usize,
}

/// One arena region.
#[derive(Serialize)]
struct RegionJson {
    name: &'static str,
    offset: usize,
    bytes: usize,
}

/// `keel plan --placement --json`.
#[derive(Serialize)]
struct PlacementJson {
    model: String,
    devices: Vec<String>,
    layers: Vec<LayerJson>,
    output: OutputJson,
}

/// One layer's ops and where they run.
#[derive(Serialize)]
struct LayerJson {
    layer: usize,
    mixer: &'static str,
    whole_on: Option<String>,
    ops: Vec<OpJson>,
}

/// One op of a block.
#[derive(Serialize)]
struct OpJson {
    op: &'static str,
    tensor: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    window: Option<usize>,
    #[serde(rename = "where")]
    at: String,
    why: Option<String>,
}

/// The output projection.
#[derive(Serialize)]
struct OutputJson {
    #[serde(rename = "where")]
    at: String,
    why: Option<String>,
    whole_forward_on: Option<String>,
}

//! `--device` and the `--offload-*` policy flags, the placement summary, and the
//! memory breakdown per device (printed like llama.cpp's `llama_memory_breakdown_print`).

use super::common::mib;
use crate::device::offload::{Breakdown, Devices};
use crate::device::rknpu::w8a8::Scheme;
use crate::device::SimConfig;
use anyhow::{bail, Result};
use keel_core::engine::Engine;
use keel_core::ggml_type::GgmlType;
use keel_core::placement::{CpuReason, Decision, OffloadMode, Placement, Policy, WeightKind, Where, LAYER_KINDS};

/// `--offload-min-batch` when `--device` names `rknpu` and the flag is not given: the NPU
/// takes prompt batches; single-token steps, DRAM-bound on RK3588 either way, stay on the CPU.
pub const RKNPU_MIN_BATCH: usize = 2;

/// The parsed flags.
pub struct OffloadOptions {
    /// Devices to open, in order (`cpu` dropped: the CPU always runs what is left).
    pub devices: Vec<String>,
    /// The placement policy.
    pub policy: Policy,
    /// `rknpu`'s W8A8 scheme (`--rknpu-products`).
    pub rknpu: Scheme,
    /// `--device-in-flight`.
    pub in_flight: Option<u8>,
    /// `--device-batch-work`, bytes.
    pub batch_work: Option<u64>,
}

fn parse_type(s: &str) -> Result<GgmlType> {
    keel_core::ggml_type::ALL_TYPES
        .iter()
        .copied()
        .find(|t| t.to_string().eq_ignore_ascii_case(s))
        .ok_or_else(|| anyhow::anyhow!("unknown type '{s}' (e.g. q8_0, q4_0, iq4_nl, q4_k, q6_k)"))
}

fn parse_kinds(list: &str) -> Result<u16> {
    let all = [WeightKind::Q, WeightKind::K, WeightKind::V, WeightKind::O, WeightKind::Gate, WeightKind::Up, WeightKind::Down, WeightKind::Qkv, WeightKind::Z, WeightKind::Beta, WeightKind::Alpha, WeightKind::Out, WeightKind::Output];
    let mut m = 0u16;
    for k in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        m |= match k {
            "attn" => WeightKind::Q.bit() | WeightKind::K.bit() | WeightKind::V.bit() | WeightKind::O.bit() | WeightKind::Qkv.bit() | WeightKind::Z.bit() | WeightKind::Beta.bit() | WeightKind::Alpha.bit() | WeightKind::Out.bit(),
            "ffn" => WeightKind::Gate.bit() | WeightKind::Up.bit() | WeightKind::Down.bit(),
            "all" => LAYER_KINDS | WeightKind::Output.bit(),
            name => match all.iter().find(|w| w.name() == name) {
                Some(w) => w.bit(),
                None => bail!("--offload-kinds: unknown kind '{name}' (attn, ffn, output, all, or a tensor kind like ffn_down)"),
            },
        };
    }
    Ok(m)
}

/// `--device` and the `--offload-*` policy flags (run, plan --placement).
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "Devices (matrix products and whole layers placed on devices; the rest on the CPU)")]
pub struct OffloadFlags {
    /// Devices for matrix products and whole layers, e.g. hexagon-sim,cpu (cpu is always last; hexagon-sim twice = two device sessions, weights split when one budget is full); llama.cpp's -dev is read as --device
    #[arg(long = "device", value_name = "LIST", default_value = "cpu")]
    pub device: String,
    /// Only layers 0..N on devices (default: all); llama.cpp's -ngl is read as --n-gpu-layers
    #[arg(long = "offload-layers", visible_alias = "n-gpu-layers", value_name = "N")]
    pub offload_layers: Option<usize>,
    /// Offload only forward passes of at least N tokens (default 1; with rknpu 2: prompt batches on the NPU, single-token steps on the CPU)
    #[arg(long = "offload-min-batch", value_name = "N")]
    pub offload_min_batch: Option<usize>,
    /// The output projection (lm head) on a device: on or off
    #[arg(long = "offload-output", value_name = "on|off", default_value = "on")]
    pub offload_output: String,
    /// Weights allowed on devices: attn, ffn, output, all, or tensor kinds (attn_q, ffn_down, ...); default all
    #[arg(long = "offload-kinds", value_name = "LIST")]
    pub offload_kinds: Option<String>,
    /// File types allowed on devices, e.g. q8_0,q4_0,q4_k (default: all)
    #[arg(long = "offload-types", value_name = "LIST")]
    pub offload_types: Option<String>,
    /// Type for weights the device lacks: q8_0 (default), q4_0, or none
    #[arg(long = "offload-convert", value_name = "TYPE")]
    pub offload_convert: Option<String>,
    /// layers (whole layers on the device when their block allows) or matmul (one batch per product)
    #[arg(long = "offload-mode", value_name = "MODE", default_value = "layers")]
    pub offload_mode: String,
    /// Weight budget per device session, in MiB
    #[arg(long = "device-mem", value_name = "MIB[,MIB..]")]
    pub device_mem: Option<String>,
    /// Shares of the layers per device session, e.g. 1,1: consecutive runs of layers in these proportions, the output projection on the last (default: each weight to the first device with budget); llama.cpp's -ts is read as --tensor-split
    #[arg(long = "tensor-split", value_name = "N0,N1,..")]
    pub tensor_split: Option<String>,
    /// rknpu: int8 products per matrix product: 4 (default: residual weights and activations, the accurate scheme), 2 (residual weights), 1 (plain W8A8, fastest); see BENCHMARKS.md for the accuracy of each
    #[arg(long = "rknpu-products", value_name = "1|2|4", default_value_t = crate::device::rknpu::w8a8::DEFAULT_PRODUCTS, value_parser = super::rknpu::parse_products)]
    pub rknpu_products: u32,
    /// Batches each device keeps in flight (1: submit one and wait for it before the next; default 2, at most what the device takes; 2+: prompt chunks pipeline over a split placement, e.g. --tensor-split 1,1)
    #[arg(long = "device-in-flight", value_name = "N")]
    pub device_in_flight: Option<u8>,
    /// Most weight MiB x tokens one batch of whole layers streams (default 32); smaller: more, shorter batches per pass
    #[arg(long = "device-batch-work", value_name = "MIB")]
    pub device_batch_work: Option<u64>,
}

impl OffloadOptions {
    /// Checks the flags and builds the policy.
    pub fn from_flags(f: &OffloadFlags) -> Result<OffloadOptions> {
        let devices = crate::device::offload::parse_device_list(&f.device).map_err(anyhow::Error::msg)?;
        let mut policy = Policy::all(devices.len());
        if let Some(n) = f.offload_layers {
            policy.max_layers = n;
        }
        let default_min = if devices.iter().any(|d| d == "rknpu") { RKNPU_MIN_BATCH } else { 1 };
        policy.min_batch = f.offload_min_batch.unwrap_or(default_min).max(1);
        match f.offload_output.as_str() {
            "on" => {}
            "off" => policy.output = false,
            o => bail!("--offload-output {o:?}: expected on or off"),
        }
        if let Some(k) = &f.offload_kinds {
            let m = parse_kinds(k)?;
            policy.output = policy.output && m & WeightKind::Output.bit() != 0;
            policy.devices.iter_mut().for_each(|d| d.kinds = m);
        }
        if let Some(t) = &f.offload_types {
            let mut m = 0u64;
            for s in t.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                m |= 1u64 << (parse_type(s)? as u32 & 63);
            }
            policy.devices.iter_mut().for_each(|d| d.types = m);
        }
        if let Some(c) = &f.offload_convert {
            policy.convert_to = if c.eq_ignore_ascii_case("none") { None } else { Some(parse_type(c)?) };
        }
        match f.offload_mode.as_str() {
            "layers" => {}
            "matmul" => policy.mode = OffloadMode::MatMul,
            o => bail!("--offload-mode {o:?}: expected layers (whole layers on the device when their block allows) or matmul (one batch per product)"),
        }
        if let Some(m) = &f.device_mem {
            for (i, v) in m.split(',').enumerate().take(policy.devices.len()) {
                let mb: u64 = v.trim().parse().map_err(|_| anyhow::anyhow!("--device-mem {v:?}: expected MiB"))?;
                policy.devices[i].budget = Some(mb << 20);
            }
        }
        if let Some(t) = &f.tensor_split {
            let shares: Vec<&str> = t.split(',').map(str::trim).collect();
            if shares.len() > policy.n_devices {
                bail!("--tensor-split {t:?}: {} shares for {} device sessions; give one per --device entry (cpu excluded)", shares.len(), policy.n_devices);
            }
            for (i, v) in shares.iter().enumerate() {
                policy.split[i] = v.parse().map_err(|_| anyhow::anyhow!("--tensor-split {v:?}: expected a whole number share per device, e.g. 1,1"))?;
            }
            if policy.split.iter().all(|&s| s == 0) {
                bail!("--tensor-split {t:?}: every share is 0; give at least one device a share");
            }
        }
        if f.device_in_flight == Some(0) {
            bail!("--device-in-flight 0: at least 1 batch must be in flight (1 = one at a time)");
        }
        if f.device_batch_work == Some(0) {
            bail!("--device-batch-work 0: give at least 1 MiB (a batch always carries one layer for one token)");
        }
        let batch_work = f.device_batch_work.map(|m| m.checked_mul(1 << 20).ok_or_else(|| anyhow::anyhow!("--device-batch-work {m}: too large"))).transpose()?;
        let rknpu = Scheme::with_products(f.rknpu_products).unwrap_or_default();
        Ok(OffloadOptions { devices, policy, rknpu, in_flight: f.device_in_flight, batch_work })
    }

    /// Opens the devices (none for `cpu` only).
    pub fn open(&self) -> Result<Devices> {
        if self.devices.is_empty() {
            return Ok(Devices::none());
        }
        let mut d = Devices::open_with(&self.devices, &SimConfig::from_env(), self.rknpu).map_err(|e| anyhow::anyhow!("{e}"))?;
        if let Some(n) = self.in_flight {
            d.set_in_flight(n);
        }
        if let Some(b) = self.batch_work {
            d.batch_work = b;
        }
        Ok(d)
    }
}

/// `layers` or `matmul`.
pub fn mode_name(m: OffloadMode) -> &'static str {
    match m {
        OffloadMode::Layers => "layers",
        OffloadMode::MatMul => "matmul",
    }
}

/// Layers that run whole on some device.
pub fn whole_layers(p: &Placement<'_>, n_layer: usize) -> usize {
    (0..n_layer).filter(|&l| p.layer_device(l).is_some()).count()
}

fn reason(r: CpuReason) -> &'static str {
    match r {
        CpuReason::NoDevice => "no device",
        CpuReason::Policy => "excluded by the --offload policy",
        CpuReason::Unsupported => "the device does not support it (nor its converted type)",
        CpuReason::Budget => "the device budget is full",
    }
}

/// Placement summary lines (stderr); loud when devices were asked for and got nothing.
pub fn print_placement(p: &Placement<'_>, devs: &Devices) {
    if devs.slots.is_empty() {
        return;
    }
    let n = p.decisions().len();
    for (i, s) in devs.slots.iter().enumerate() {
        let t = p.totals(i as u8);
        let mut types: Vec<String> = Vec::new();
        for d in p.decisions().iter().filter(|d| d.place == Where::Device(i as u8)) {
            let k = if d.converted() { format!("{}->{}", d.file_ty, d.device_ty) } else { d.device_ty.to_string() };
            if !types.contains(&k) {
                types.push(k);
            }
        }
        eprintln!(
            "keel: placement: {} ({}) runs {} of {} matrix products ({} converted at load; types {}), {} repacked",
            s.label,
            s.dev().name(),
            t.weights,
            n,
            t.converted,
            if types.is_empty() { "-".into() } else { types.join(", ") },
            mib(t.bytes)
        );
        if t.layers > 0 {
            eprintln!(
                "keel: placement: {} runs {} whole layers (mode layers: norms, RoPE, attention over its own F16 KV cache of {} positions, {}, SwiGLU, residual adds; up to {} layers per batch, fewer when a batch would stream more than {} of weights × tokens){}",
                s.label,
                t.layers,
                p.kv_ctx(),
                mib(t.kv_bytes),
                keel_core::device::lower::layers_per_batch(usize::from(keel_npu_hal::device::Device::caps(s.dev()).max_batch_ops)),
                mib(devs.batch_work),
                if p.forward_placed().is_some_and(|(d, _)| usize::from(d) == i) { "" } else { ", the other products one batch each" }
            );
        }
    }
    if let Some((d, bytes)) = p.forward_placed() {
        if let Some(s) = devs.slots.get(usize::from(d)) {
            eprintln!(
                "keel: placement: {} runs the whole forward pass: the embedding lookup (a {} copy of token_embd in its file type, counted as model memory) in the first layer batch, the final norm and output projection in the last",
                s.label,
                mib(bytes)
            );
        }
    }
    if let Some(why) = p.forward_note().filter(|_| p.n_on_devices() > 0) {
        eprintln!("keel: placement: the embedding lookup, final norm and output projection outside the layer batches (on the CPU, the output projection where placed): {why}");
    }
    if let Some(why) = p.layer_note().filter(|_| p.n_on_devices() > 0) {
        eprintln!("keel: placement: layers with products on a device that do not run whole there (one batch per product instead): {why}");
    }
    let cpu: Vec<&Decision> = p.decisions().iter().filter(|d| matches!(d.place, Where::Cpu(_))).collect();
    if !cpu.is_empty() {
        let mut why: Vec<String> = Vec::new();
        for d in &cpu {
            if let Where::Cpu(r) = d.place {
                let s = reason(r).to_string();
                if !why.contains(&s) {
                    why.push(s);
                }
            }
        }
        eprintln!("keel: placement: cpu runs {} of {} matrix products ({})", cpu.len(), n, why.join("; "));
    }
    if p.n_on_devices() == 0 {
        eprintln!(
            "\nkeel: WARNING: --device {} was given but NOTHING was placed on it: every matrix product runs on the CPU \
             ({}). The device holds 0 bytes of weights.\n",
            devs.slots.iter().map(|s| s.label.as_str()).collect::<Vec<_>>().join(","),
            cpu.iter()
                .filter_map(|d| if let Where::Cpu(r) = d.place { Some(reason(r)) } else { None })
                .next()
                .unwrap_or("no reason")
        );
    }
}

/// Host memory: weights the CPU computes with, context (KV/state), compute (the rest of the arena).
pub fn host_breakdown(e: &Engine<'_>, p: Option<&Placement<'_>>) -> (u64, u64, u64) {
    let mut model = e.model.weight_bytes() as u64;
    if let Some(p) = p {
        for d in p.decisions().iter().filter(|d| matches!(d.place, Where::Device(_))) {
            let rb = d.file_ty.row_bytes(d.shape.1 as u64).unwrap_or(0);
            // A tied output projection still serves the CPU's embedding lookups.
            if !(d.id.kind == WeightKind::Output && e.model.tied_output) {
                model = model.saturating_sub(rb * d.shape.0 as u64);
            }
        }
    }
    let region = |n: &str| e.plan.region(n).map_or(0, |r| r.bytes as u64);
    let context = region("kv_k") + region("kv_v") + region("conv_state") + region("ssm_state");
    let compute = (e.plan.total_bytes() as u64).saturating_sub(context);
    (model, context, compute)
}

/// Prints the breakdown (stderr) the way llama.cpp's `llama_memory_breakdown_print` does.
pub fn print_breakdown(when: &str, devs: &[Breakdown], host: (u64, u64, u64)) {
    let m = |b: u64| format!("{:.1}", b as f64 / (1024.0 * 1024.0));
    eprintln!("keel: memory breakdown [MiB] {:<16} |   total =    free + (   self =   model + context + compute)", format!("({when})"));
    for d in devs {
        eprintln!(
            "keel:   - {:<39} | {:>7} = {:>7} + ({:>7} = {:>7} + {:>7} + {:>7})",
            format!("{} ({})", d.name, d.what),
            m(d.total),
            m(d.free),
            m(d.used()),
            m(d.model),
            m(d.context),
            m(d.compute)
        );
    }
    let (model, context, compute) = host;
    eprintln!(
        "keel:   - {:<39} |                     {:>7} = {:>7} + {:>7} + {:>7}",
        "host (cpu)",
        m(model + context + compute),
        m(model),
        m(context),
        m(compute)
    );
}

/// One entry of `memory_breakdown` in `run --json`: a device session, or the host.
#[derive(serde::Serialize, Debug)]
pub struct BreakdownJson {
    device: String,
    what: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    free: Option<u64>,
    #[serde(rename = "self")]
    used: u64,
    model: u64,
    context: u64,
    compute: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    weights: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    converted: Option<u64>,
}

/// The breakdown as JSON entries, the host last.
pub fn breakdown_json(devs: &[Breakdown], host: (u64, u64, u64)) -> Vec<BreakdownJson> {
    let mut v: Vec<BreakdownJson> = devs
        .iter()
        .map(|d| BreakdownJson {
            device: d.name.clone(),
            what: d.what.to_string(),
            total: Some(d.total),
            free: Some(d.free),
            used: d.used(),
            model: d.model,
            context: d.context,
            compute: d.compute,
            weights: Some(d.weights.0 as u64),
            converted: Some(d.weights.1 as u64),
        })
        .collect();
    let (model, context, compute) = host;
    v.push(BreakdownJson { device: "host".into(), what: "cpu".into(), total: None, free: None, used: model + context + compute, model, context, compute, weights: None, converted: None });
    v
}

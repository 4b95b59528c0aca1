//! `keel rknpu gen FIXTURE_DIR OUT_DIR` and the rknpu parts of `keel probe`
//! (`--device rknpu [--dump-regcmd FILE]`), and `keel rknpu kl` (the W8A8 scheme's
//! accuracy on the CPU emulation).

use crate::device::rknpu::{conv, fixture, regcmd, w8a8};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use keel_core::sampler::argmax;

/// A device that is not there: `keel` exits with status 2 and this message.
#[derive(Debug)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

/// The accel node (`KEEL_RKNPU_NODE` overrides it, for tests).
pub fn node() -> PathBuf {
    std::env::var_os("KEEL_RKNPU_NODE").map_or_else(|| PathBuf::from("/dev/accel/accel0"), PathBuf::from)
}

/// `keel rknpu SUBCOMMAND`.
#[derive(clap::Args, Debug)]
pub struct RknpuArgs {
    /// What to do
    #[command(subcommand)]
    pub command: RknpuCommand,
}

/// The `keel rknpu` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum RknpuCommand {
    /// keel's RK3588 command stream and packed buffers for a rocket-capture fixture folder (manifest.json, weights.bin, bias.bin, input.bin): OUT_DIR/regcmd/t<i>.bin and OUT_DIR/{weights,bias,input}.bin
    Gen(GenArgs),
    /// Accuracy of the W8A8 scheme: mean KL divergence of the emulated NPU's next-token distributions to keel's CPU path
    Kl(KlArgs),
}

/// `keel rknpu gen FIXTURE_DIR OUT_DIR`.
#[derive(clap::Args, Debug)]
pub struct GenArgs {
    /// A fixture folder in the capture tool's format
    #[arg(value_name = "FIXTURE_DIR")]
    pub fixture: PathBuf,
    /// Where keel's stream and buffers go (created if absent)
    #[arg(value_name = "OUT_DIR")]
    pub out: PathBuf,
}

/// `keel rknpu kl`.
#[derive(clap::Args, Debug)]
pub struct KlArgs {
    #[command(flatten)]
    model: super::common::ModelFlag,
    /// The text (as keel perplexity takes it; - reads standard input)
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: String,
    /// Chunk length in tokens (the second half of each chunk is scored)
    #[arg(short = 'c', long = "ctx-size", value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u64).range(4..=1 << 20))]
    ctx: u64,
    /// At most this many chunks (default: the whole text)
    #[arg(long = "chunks", value_name = "N")]
    chunks: Option<usize>,
    /// Threads
    #[arg(short = 't', long = "threads", value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=super::common::MAX_THREADS as u64))]
    threads: u64,
    /// No randomized Hadamard rotation of the hidden dimension
    #[arg(long = "no-rotate")]
    no_rotate: bool,
    /// Per-tensor weight and activation scales instead of per-channel and per-token
    #[arg(long = "per-tensor")]
    per_tensor: bool,
    /// Keep the output projection (lm head) on the CPU
    #[arg(long = "output-on-cpu")]
    output_on_cpu: bool,
    /// Int8 products per matrix product: 4 (the device's default: residual weights and activations), 2 (residual weights), 1 (plain W8A8)
    #[arg(long = "products", value_name = "1|2|4", default_value_t = w8a8::DEFAULT_PRODUCTS, value_parser = parse_products)]
    products: u32,
    /// Diagnostic: no int8 rounding at all (f32 products summed in f64), i.e. how far keel's CPU path itself is from the exact product: the floor under every scheme
    #[arg(long = "exact")]
    exact: bool,
    /// JSON output
    #[arg(long = "json")]
    json: bool,
}

/// `keel rknpu SUBCOMMAND`.
pub fn main(a: RknpuArgs) -> Result<()> {
    match a.command {
        RknpuCommand::Gen(g) => {
            let written = fixture::gen(&g.fixture, &g.out)?;
            for p in written {
                println!("{}", p.display());
            }
            Ok(())
        }
        RknpuCommand::Kl(k) => kl(k),
    }
}

/// `keel probe --device rknpu [--dump-regcmd FILE]`.
pub fn probe(dump: Option<String>) -> Result<()> {
    if let Some(f) = dump {
        let bytes = std::fs::read(&f).with_context(|| format!("cannot read regcmd file {f}"))?;
        let s = regcmd::from_bytes(&bytes).map_err(|e| anyhow::anyhow!("{f}: {e}"))?;
        print!("{}", regcmd::listing(&s));
        match conv::decode(&s) {
            Ok(t) => println!("decoded: 1x1 convolution task {t:?}"),
            Err(e) => println!("not a keel/Mesa 1x1 convolution task: {e}"),
        }
        return Ok(());
    }
    let n = node();
    if !n.exists() {
        return Err(Unavailable(format!(
            "rknpu: {} not found. The RK3588 NPU needs Linux 6.18 or newer with CONFIG_DRM_ACCEL_ROCKET (module 'rocket'), \
             the device tree's NPU nodes enabled (compatible \"rockchip,rk3588-rknn-core\", three cores, with their IOMMUs and \
             power domain; many boards ship them disabled: enable them in the board's .dts or an overlay), and read/write \
             access to the node (group 'render' or a udev rule). Check `ls -l /dev/accel/` and `dmesg | grep -i rocket`.",
            n.display()
        ))
        .into());
    }
    probe_board(&n)
}

/// On a board: a 64×64 int8 product (Mesa's per-tensor configuration) on the NPU,
/// compared element by element with the CPU's integer reference (±1 for rounding).
fn probe_board(n: &Path) -> Result<()> {
    use crate::device::rknpu::ioctl::{run_gemm, Node};
    let mut node = Node::open(n).with_context(|| format!("rknpu: cannot open {} read/write (permissions: group 'render' or a udev rule)", n.display()))?;
    let (m, k, nn) = (64u32, 64u32, 64u32);
    let q = conv::Quant { in_zp: -128, w_zp: 0, out_zp: 0, in_scale: 0.05, w_scale: 0.004, out_scale: 0.434 };
    let w: Vec<u8> = (0..k * nn).map(|i| ((i * 37 + 11) % 255) as u8).collect();
    let x: Vec<u8> = (0..m * k).map(|i| ((i * 53 + 7) % 256) as u8).collect();
    let bias: Vec<i32> = (0..nn as i32).map(|i| (i - 32) * 97).collect();
    let got = run_gemm(&mut node, m, k, nn, q, &w, &bias, &x, std::time::Duration::from_millis(500))?;
    let mult = f64::from(q.in_scale * q.w_scale / q.out_scale);
    let mut bad = 0;
    for r in 0..m as usize {
        for c in 0..nn as usize {
            let acc: i64 = (0..k as usize).map(|j| (i64::from(x[r * k as usize + j] as i8) - i64::from(q.in_zp)) * i64::from(w[c * k as usize + j] as i8)).sum::<i64>() + i64::from(bias[c]);
            let want = ((acc as f64 * mult).round() as i64 + i64::from(q.out_zp)).clamp(-128, 127);
            if (i64::from(got[r * nn as usize + c] as i8) - want).abs() > 1 {
                bad += 1;
            }
        }
    }
    if bad > 0 {
        bail!("rknpu: the NPU's 64x64 int8 product differs from the CPU's in {bad} of {} elements (beyond ±1): the device computes wrongly or keel's stream is wrong for this hardware", m * nn);
    }
    println!("rknpu: {}: 64x64 int8 product on the NPU equals the CPU's (within ±1)", n.display());
    Ok(())
}

/// The accuracy of the W8A8 scheme: mean KL divergence of the emulated NPU's next-token
/// distributions to keel's CPU path, and top-1 agreement, over the positions `keel
/// perplexity` scores (the second half of each `-c` chunk).
pub struct KlReport {
    /// Mean KL(CPU ‖ emulated NPU), nats.
    pub kl: f64,
    /// Largest per-position KL.
    pub kl_max: f64,
    /// Positions whose argmax agrees.
    pub top1: f64,
    /// Positions scored.
    pub positions: usize,
    /// Chunks run.
    pub chunks: usize,
    /// Weights whose products ran on the emulated NPU.
    pub products: usize,
}

/// Runs `model` over `text` in chunks of `c` tokens on the CPU and with every matrix
/// product on the W8A8 emulation of `scheme`; at most `max_chunks` chunks.
pub fn kl_divergence(model: &str, text: &str, c: usize, max_chunks: usize, scheme: w8a8::Scheme, exact: bool, output: bool, threads: usize) -> Result<KlReport> {
    use crate::cli::load::{engine, open, prepare, RunOptions};
    use keel_core::placement::{weight_count, Decision, Exec, OffloadMode, Placement, Policy};
    use keel_core::session::Outputs;
    let opened = open(model)?;
    let g = opened.gguf()?;
    let opts = RunOptions { n_ctx: c, n_batch: c, n_outputs: c, threads, reference: false, force_ctx: false };
    let (mut l_cpu, mut l_dev) = (prepare(&g, &opened.path, &opts)?, prepare(&g, &opened.path, &opts)?);
    let sampling = keel_core::sampler::SamplerConfig::default();
    let (mut cpu, pool) = engine(&g, &opened.path, &mut l_cpu, false, sampling)?;
    let (mut dev, _) = engine(&g, &opened.path, &mut l_dev, false, sampling)?;
    let mut emu = if exact { w8a8::Emu::exact(scheme, threads) } else { w8a8::Emu::new(scheme, threads) };
    let mut decisions = vec![Decision::EMPTY; weight_count(&dev.model)];
    let mut p = Policy::all(1);
    p.mode = OffloadMode::MatMul;
    p.output = output;
    let placement = {
        let infos: [&dyn keel_core::placement::DeviceInfo; 1] = [&emu];
        Placement::plan(&dev.model, &p, &infos, &mut decisions).map_err(|e| anyhow::anyhow!("placement: {e}"))?
    };
    emu.load(&dev.model, &placement, &dev.session.kernels()).map_err(anyhow::Error::msg)?;
    let products = emu.n_weights();
    let tokens = super::common::tokenize_all(&cpu.tokenizer, text, true, false)?;
    let n_chunks = (tokens.len() / c).min(max_chunks);
    if n_chunks == 0 {
        bail!("the text has {} tokens, fewer than one chunk of {c}", tokens.len());
    }
    let bos = if cpu.tokenizer.add_bos() { cpu.tokenizer.bos() } else { None };
    let v = cpu.n_vocab();
    let (mut sum, mut max, mut agree, mut count) = (0f64, 0f64, 0usize, 0usize);
    for ch in 0..n_chunks {
        let mut chunk = tokens[ch * c..(ch + 1) * c].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        cpu.reset();
        dev.reset();
        let lc = cpu.eval(&chunk, Outputs::All, pool)?.to_vec();
        let mut exec = Exec { placement: &placement, offload: &mut emu };
        let ld = dev.eval_on(&chunk, Outputs::All, pool, Some(&mut exec))?;
        for j in c / 2..c - 1 {
            let (p, q) = (&lc[j * v..(j + 1) * v], &ld[j * v..(j + 1) * v]);
            let k = kl_row(p, q);
            sum += k;
            max = max.max(k);
            agree += usize::from(argmax(p) == argmax(q));
            count += 1;
        }
    }
    Ok(KlReport { kl: sum / count as f64, kl_max: max, top1: agree as f64 / count as f64, positions: count, chunks: n_chunks, products })
}

/// KL(softmax(p) ‖ softmax(q)) in f64.
pub fn kl_row(p: &[f32], q: &[f32]) -> f64 {
    let lse = |x: &[f32]| {
        let m = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
        m + x.iter().map(|&v| (f64::from(v) - m).exp()).sum::<f64>().ln()
    };
    let (lp, lq) = (lse(p), lse(q));
    p.iter().zip(q).map(|(&a, &b)| {
        let la = f64::from(a) - lp;
        la.exp() * (la - (f64::from(b) - lq))
    }).sum::<f64>().max(0.0)
}

/// `--products`: 1, 2 or 4.
pub fn parse_products(s: &str) -> std::result::Result<u32, String> {
    s.parse().ok().filter(|n| w8a8::Scheme::with_products(*n).is_some()).ok_or_else(|| format!("'{s}' is not 1, 2 or 4 (int8 products per matrix product: 1 plain W8A8, 2 with residual weights, 4 with residual weights and activations)"))
}

/// `keel rknpu kl`.
fn kl(a: KlArgs) -> Result<()> {
    let (model, file, c, chunks, threads) = (a.model.model, a.file, a.ctx as usize, a.chunks.unwrap_or(usize::MAX), a.threads as usize);
    let (rotate, fine, output, as_json) = (!a.no_rotate, !a.per_tensor, !a.output_on_cpu, a.json);
    let text = super::common::read_text_limited(&file, "text file", super::common::MAX_TEXT_FILE, "the most keel reads for a KL measurement; cut the text")?;
    // `--products` was checked by `parse_products`.
    let scheme = w8a8::Scheme { rotate, fine, ..w8a8::Scheme::with_products(a.products).unwrap_or_default() };
    let (residual, x_residual) = (scheme.residual, scheme.x_residual);
    let r = kl_divergence(&model, &text, c, chunks, scheme, a.exact, output, threads.max(1))?;
    let name = if a.exact { format!("exact f32 products, no int8 rounding{}", if rotate { ", Hadamard rotation" } else { "" }) + if output { "" } else { ", output projection on the CPU" } } else { format!("{}{}", if fine { "per-channel weights, per-token activations" } else { "per-tensor weights and activations" }, if rotate { ", Hadamard rotation" } else { ", no rotation" }) + if output { "" } else { ", output projection on the CPU" } + if residual { ", int8 residual weights" } else { "" } + if x_residual { ", int8 residual activations" } else { "" } };
    let int8_products = if a.exact { 0 } else { scheme.products() };
    if as_json {
        #[derive(serde::Serialize)]
        struct KlJson<'a> {
            scheme: &'a str,
            kl: f64,
            kl_max: f64,
            top1: f64,
            positions: usize,
            chunks: usize,
            products: usize,
            int8_products: u32,
            ctx: usize,
        }
        super::print_json(&KlJson { scheme: &name, kl: r.kl, kl_max: r.kl_max, top1: r.top1, positions: r.positions, chunks: r.chunks, products: r.products, int8_products, ctx: c });
    } else {
        println!("W8A8 ({name}; {int8_products} int8 products each) vs keel's CPU path, {} chunks of {c}, {} positions, {} matrix products emulated:", r.chunks, r.positions, r.products);
        println!("  mean KL {:.6}  max KL {:.4}  top-1 agreement {:.4}", r.kl, r.kl_max, r.top1);
    }
    Ok(())
}

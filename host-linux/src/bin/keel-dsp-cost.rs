//! keel-dsp-cost: the Hexagon DSP's cost model from executed packets under QEMU.
//!
//! Runs `keel run --device hexagon-sim` on a model with `qemu-hexagon`'s translation
//! log (`QEMU_LOG=in_asm,exec,nochain`, read through a FIFO, never written to disk):
//! every translation block is logged once with its packets (`in_asm`) and every
//! execution of it with its start symbol (`exec`, `nochain` so chained blocks are
//! logged too), so executed packets = Σ executions × packets of the block. The
//! firmware calls empty marker functions (`dsp-firmware/src/cost.rs`) before every
//! batch (one token column: decode; several: a prompt chunk) and every op, which
//! attributes each packet to a batch kind and an op kind. From the counts:
//! packets per prompt token and per generated token by op kind, the weight bytes
//! streamed per token, and tokens/s estimated for a v68 (QCS6490) and a v73 cDSP
//! under the assumptions printed with the table (`ASSUMPTIONS`).
//!
//! usage: keel-dsp-cost -m MODEL [-p PROMPT_TOKENS] [-n GEN_TOKENS] [--cpu v68|v73]
//!        [--keel PATH] [--json] [-- KEEL_RUN_ARGS...]
//! (`KEEL_DSP_THREADS`: the firmware's hardware threads; the "as run" estimate follows
//! their critical path.)
//! (`bench/dsp-cost.sh` runs it for the tables in BENCHMARKS.md.)

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use keel_host_linux::cli::roofline::{bytes_per_token, TokenBytes};

/// Op groups the firmware marks (`keel_cost_op_<name>`), in table order.
const OPS: [&str; 9] = ["matmul", "attention", "rms_norm", "rope", "elementwise", "quantize", "copy", "get_rows", "recurrent"];

/// One device as the estimate models it.
struct Target {
    name: &'static str,
    /// Clock of the compute DSP, Hz.
    clock_hz: f64,
    /// HVX contexts (hardware threads with a vector unit).
    hvx_contexts: u32,
    /// DDR read bandwidth the DSP can draw, bytes/s.
    ddr_bytes_s: f64,
}

/// The two cDSPs of the issue. Sources and caveats are in `ASSUMPTIONS`.
const TARGETS: [Target; 2] = [
    Target { name: "v68 (QCS6490)", clock_hz: 1.5e9, hvx_contexts: 4, ddr_bytes_s: 12.0e9 },
    Target { name: "v73 (8 Gen 2 class)", clock_hz: 1.8e9, hvx_contexts: 4, ddr_bytes_s: 40.0e9 },
];

const ASSUMPTIONS: &str = "\
assumptions: one packet per cycle on each hardware thread (an upper bound: stalls, cache misses and the issue \
rules of several threads sharing a core are not modelled); \"1 thread\" = clock / all packets per token (every \
thread's work done by one); \"as run\" = clock / the critical path per token (for every stretch between two op \
markers, the busiest thread's packets: the firmware's threads share each product's row groups and the caller waits \
for all of them), with the threads the firmware ran (`--threads`, KEEL_DSP_THREADS, no more than the target's HVX \
contexts); bandwidth bound = DDR read bandwidth / bytes read per token; each estimate is capped by it. \
v68 (QCS6490): cDSP clock 1.5 GHz (assumed, no public figure found), 4 HVX contexts (v68 parts have 4 or more), \
DDR 12 GB/s usable by the DSP (assumed; llama.cpp's CPU decode on a QCS6490 board implies at least 8.9 GB/s for the CPU); \
v73: 1.8 GHz, 4 HVX contexts, 40 GB/s (assumed).";

#[derive(Default, Clone)]
struct Tally {
    packets: [u64; OPS.len() + 1],
    /// The critical path: for every stretch between two markers, the packets of the
    /// busiest hardware thread (the firmware's threads share a product's row groups and
    /// the caller waits for all of them before the next op).
    critical: [u64; OPS.len() + 1],
    hvx: u64,
    batches: u64,
    /// Forward passes run whole on the device (their embedding lookups).
    forwards: u64,
}

/// What the log says.
#[derive(Default)]
struct Counts {
    setup: u64,
    decode: Tally,
    prompt: Tally,
    /// Executed packets by the symbol their block starts in: start-up, prompt, decode (the
    /// top ones are printed with --symbols, per token for the prompt and decode).
    by_symbol: HashMap<String, [u64; 3]>,
    /// Hardware threads seen executing (QEMU's CPU indices).
    threads: usize,
}

/// The packets of each hardware thread since the last marker.
#[derive(Default)]
struct Stretch {
    by_thread: HashMap<u32, u64>,
}

impl Stretch {
    /// Ends the stretch: the busiest thread's packets go to `op` of `phase`'s critical path.
    fn close(&mut self, c: &mut Counts, phase: Option<bool>, op: usize) {
        let max = self.by_thread.drain().map(|(_, n)| n).max().unwrap_or(0);
        match phase {
            None => {}
            Some(true) => c.prompt.critical[op] += max,
            Some(false) => c.decode.critical[op] += max,
        }
    }
}

/// Whether a symbol is one of the HVX block-sum kernels (`core/src/quant/hexagon/`).
fn is_hvx_kernel(sym: &str) -> bool {
    sym.contains("block_sums") || sym.contains("lane_sums")
}

/// Reads the `in_asm,exec,nochain` log: `IN:` blocks (`0xPC: word {…` lines, one `{`
/// per packet) then `Trace` lines `Trace CPU: HOSTPTR [cs_base/PC/flags/cflags] SYMBOL`.
/// Blocks are known by their guest PC: with several threads QEMU flushes its code cache
/// (host pointers are reused) and one thread's `IN:` block may be followed by another
/// thread's `Trace` lines, but a block is always logged whole, before its first run.
fn count(log: impl BufRead) -> Result<Counts> {
    let mut c = Counts::default();
    let mut tb_packets: HashMap<u64, u64> = HashMap::new();
    // The block being read: its PC (from its first line) and packets so far.
    let mut block: Option<(Option<u64>, u64)> = None;
    let mut phase: Option<bool> = None; // Some(true) = prompt
    // Once a forward pass is marked, its batches keep its phase (the prompt's output
    // projection alone has one column).
    let mut by_forward = false;
    // A batch is counted in the phase its first op runs in (a forward pass's first batch
    // is marked by its embedding lookup, op 0, after the batch marker).
    let mut pending_batch = false;
    let mut op = OPS.len(); // "other" until the first op marker
    let mut sym_cache: HashMap<u64, (String, bool)> = HashMap::new();
    let mut stretch = Stretch::default();
    let mut threads = std::collections::HashSet::new();
    let hex = |s: &str| u64::from_str_radix(s.trim().trim_start_matches("0x"), 16);
    for line in log.split(b'\n') {
        let line = line.context("reading the qemu log")?;
        if line.starts_with(b"IN:") {
            block = Some((None, 0));
            continue;
        }
        if let Some((pc, n)) = block.as_mut() {
            if line.is_empty() {
                if let Some(pc) = *pc {
                    tb_packets.insert(pc, (*n).max(1));
                    sym_cache.remove(&pc);
                }
                block = None;
            } else {
                if pc.is_none() {
                    let head = std::str::from_utf8(&line).ok().and_then(|l| l.split_once(':')).map(|(a, _)| a);
                    *pc = Some(head.and_then(|a| hex(a).ok()).context("qemu log: an IN: block whose first line has no address")?);
                }
                if line.contains(&b'{') {
                    *n += 1;
                }
            }
            continue;
        }
        let Some(rest) = line.strip_prefix(b"Trace ") else { continue };
        let rest = std::str::from_utf8(rest).context("qemu log: a Trace line is not UTF-8")?;
        let (cpu, rest) = rest.split_once(": ").context("qemu log: a Trace line without ': '")?;
        let cpu: u32 = cpu.parse().context("qemu log: a Trace line whose CPU index is not a number")?;
        threads.insert(cpu);
        let (_, rest) = rest.split_once('[').context("qemu log: a Trace line without its [cs_base/PC/…]")?;
        let (fields, rest) = rest.split_once(']').context("qemu log: a Trace line without its [cs_base/PC/…]")?;
        let pc = fields.split('/').nth(1).map(hex).context("qemu log: a Trace line without its PC")?.context("qemu log: a PC that is not hex")?;
        let n = *tb_packets.get(&pc).with_context(|| format!("qemu log: block {pc:#x} ran before it was logged (QEMU_LOG must include in_asm)"))?;
        let (sym, hvx) = sym_cache.entry(pc).or_insert_with(|| {
            let s = rest.trim().to_string();
            let h = is_hvx_kernel(&s);
            (s, h)
        });
        if let Some(m) = sym.strip_prefix("keel_cost_") {
            stretch.close(&mut c, phase, op);
            match m {
                "batch_one" | "batch_many" => {
                    if !by_forward {
                        phase = Some(m == "batch_many");
                    }
                    pending_batch = true;
                    op = OPS.len();
                }
                "forward_one" | "forward_many" => {
                    by_forward = true;
                    phase = Some(m == "forward_many");
                    if m == "forward_many" { &mut c.prompt } else { &mut c.decode }.forwards += 1;
                }
                m => {
                    if let Some(i) = m.strip_prefix("op_").and_then(|o| OPS.iter().position(|x| *x == o)) {
                        op = i;
                        if std::mem::take(&mut pending_batch) {
                            if phase == Some(true) { &mut c.prompt } else { &mut c.decode }.batches += 1;
                        }
                    }
                }
            }
        }
        c.by_symbol.entry(sym.clone()).or_insert([0; 3])[match phase { None => 0, Some(true) => 1, Some(false) => 2 }] += n;
        *stretch.by_thread.entry(cpu).or_insert(0) += n;
        match phase {
            None => c.setup += n,
            Some(p) => {
                let t = if p { &mut c.prompt } else { &mut c.decode };
                t.packets[op] += n;
                if *hvx {
                    t.hvx += n;
                }
            }
        }
    }
    stretch.close(&mut c, phase, op);
    c.threads = threads.len();
    Ok(c)
}

struct Args {
    model: PathBuf,
    n_prompt: usize,
    n_gen: usize,
    cpu: String,
    keel: PathBuf,
    json: bool,
    symbols: usize,
    extra: Vec<String>,
}

const USAGE: &str = "usage: keel-dsp-cost -m MODEL [-p PROMPT_TOKENS (default 8)] [-n GEN_TOKENS (default 3)] [--cpu v68|v73] [--keel PATH] [--json] [--symbols N] [-- KEEL_RUN_ARGS...]
env: KEEL_DSP_THREADS (the firmware's hardware threads, 1 to 4 here; default 4), KEEL_DSP_ELF, KEEL_QEMU";

fn args() -> Result<Args> {
    let mut it = std::env::args().skip(1);
    let exe_dir = std::env::current_exe().ok().and_then(|p| p.parent().map(Path::to_path_buf)).unwrap_or_default();
    let mut a = Args { model: PathBuf::new(), n_prompt: 8, n_gen: 3, cpu: "v68".into(), keel: exe_dir.join("keel"), json: false, symbols: 0, extra: Vec::new() };
    let num = |v: Option<String>, f: &str| -> Result<usize> { v.with_context(|| format!("{f} needs a number\n{USAGE}"))?.parse().with_context(|| format!("{f}: not a number\n{USAGE}")) };
    while let Some(x) = it.next() {
        match x.as_str() {
            "-m" | "--model" => a.model = it.next().context(USAGE)?.into(),
            "-p" | "--n-prompt" => a.n_prompt = num(it.next(), "-p")?,
            "-n" | "--n-gen" => a.n_gen = num(it.next(), "-n")?,
            "--symbols" => a.symbols = num(it.next(), "--symbols")?,
            "--cpu" => a.cpu = it.next().context(USAGE)?,
            "--keel" => a.keel = it.next().context(USAGE)?.into(),
            "--json" => a.json = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--" => a.extra.extend(it.by_ref()),
            other => bail!("unknown argument {other}\n{USAGE}"),
        }
    }
    if a.model.as_os_str().is_empty() {
        bail!("no model: give -m MODEL.gguf\n{USAGE}");
    }
    if a.n_prompt < 2 || a.n_gen < 2 {
        bail!("-p and -n must be at least 2 (a prompt chunk and a decode step to tell apart)\n{USAGE}");
    }
    Ok(a)
}

/// A prompt of about `n` tokens (one common word each, for most BPE vocabularies).
fn prompt_text(n: usize) -> String {
    let words = ["the", "cat", "sat", "on", "a", "mat", "and", "it", "was", "warm"];
    (0..n).map(|i| words[i % words.len()]).collect::<Vec<_>>().join(" ")
}

fn main() -> Result<()> {
    let a = args()?;
    if !a.keel.is_file() {
        bail!("{} not found: build keel (cargo build --release) or give --keel PATH", a.keel.display());
    }
    let dir = TempDir::new()?;
    let fifo = dir.0.join("qemu.log");
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).context("FIFO path")?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) } != 0 {
        bail!("mkfifo {}: {}", fifo.display(), std::io::Error::last_os_error());
    }
    let mut cmd = Command::new(&a.keel);
    cmd.args(["run", "--json", "--device", "hexagon-sim", "-m"])
        .arg(&a.model)
        .args(["-p", &prompt_text(a.n_prompt), "-n", &a.n_gen.to_string(), "-b", "512", "--temp", "0"])
        .args(&a.extra)
        .env("QEMU_LOG", "in_asm,exec,nochain")
        .env("QEMU_LOG_FILENAME", &fifo)
        .env("KEEL_QEMU_CPU", &a.cpu)
        .env("KEEL_DSP_TIMEOUT_MS", "3600000")
        .stdout(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("starting {}", a.keel.display()))?;
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || -> Result<Counts> {
            let f = std::fs::File::open(&fifo).with_context(|| format!("opening {}", fifo.display()))?;
            count(BufReader::with_capacity(1 << 20, f))
        })
    };
    let out = {
        let mut s = String::new();
        std::io::Read::read_to_string(child.stdout.as_mut().context("keel's stdout")?, &mut s)?;
        s
    };
    let status = child.wait()?;
    // If QEMU never opened the FIFO, the reader still waits in open(): release it.
    if !reader.is_finished() {
        let _ = std::fs::OpenOptions::new().write(true).custom_flags_nonblock().open(&fifo);
    }
    let counts = reader.join().map_err(|_| anyhow::anyhow!("the log reader panicked"))??;
    if !status.success() {
        bail!("keel run failed ({status}); its messages are above");
    }
    let run: serde_json::Value = serde_json::from_str(out.trim()).with_context(|| format!("keel run --json printed something else: {out}"))?;
    report(&a, &run, &counts)
}

/// A private directory for the FIFO, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        let p = std::env::temp_dir().join(format!("keel-dsp-cost-{}", std::process::id()));
        std::fs::create_dir(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Bytes per generated token (at positions `n_prompt ..`) and per prompt token (`0 ..`).
fn model_bytes(path: &Path, n_prompt: usize, n_gen: usize) -> Result<(TokenBytes, TokenBytes)> {
    let opened = keel_host_linux::cli::load::open(&path.to_string_lossy())?;
    let g = opened.gguf()?;
    let ctx = |e: keel_core::Error| anyhow::anyhow!("{}: {e}", path.display());
    let hp = keel_core::model::HParams::from_gguf(&g).map_err(|e| ctx(e.into()))?;
    let mut table: Vec<std::mem::MaybeUninit<keel_core::model::Layer<'_>>> = (0..hp.n_layer).map(|_| std::mem::MaybeUninit::uninit()).collect();
    let model = keel_core::model::Model::load(&g, hp, &mut table).map_err(ctx)?;
    Ok((bytes_per_token(&model, n_prompt, n_gen), bytes_per_token(&model, 0, n_prompt)))
}

trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonBlock for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NONBLOCK)
    }
}

fn report(a: &Args, run: &serde_json::Value, c: &Counts) -> Result<()> {
    let n_prompt = run["prompt_tokens"].as_array().map_or(0, Vec::len);
    let n_gen = run["generated"].as_array().map_or(0, Vec::len);
    let device_bytes = run["memory_breakdown"]
        .as_array()
        .and_then(|v| v.iter().find(|d| d["device"].as_str().is_some_and(|s| s.starts_with("hexagon-sim"))))
        .and_then(|d| d["model"].as_u64())
        .context("keel run --json reported no hexagon-sim device: nothing was placed on the DSP")?;
    if c.prompt.batches == 0 || c.decode.batches == 0 {
        bail!("the log shows {} prompt and {} decode batches: the firmware's cost markers are missing (rebuild dsp-firmware) or nothing ran on the DSP", c.prompt.batches, c.decode.batches);
    }
    // Decode steps: the forward passes of one token when the whole pass runs on the
    // device (its embedding lookups), else the prompt's batches as one pass's worth.
    let decode_steps = if c.decode.forwards > 0 { c.decode.forwards as f64 } else { c.decode.batches as f64 / c.prompt.batches as f64 };
    let per_tok = |t: &[u64], n: f64| -> Vec<f64> { t.iter().map(|&p| p as f64 / n).collect() };
    let pp = per_tok(&c.prompt.packets, n_prompt as f64);
    let tg = per_tok(&c.decode.packets, decode_steps);
    let (pp_tot, tg_tot) = (pp.iter().sum::<f64>(), tg.iter().sum::<f64>());
    let pp_crit = per_tok(&c.prompt.critical, n_prompt as f64).iter().sum::<f64>();
    let tg_crit = per_tok(&c.decode.critical, decode_steps).iter().sum::<f64>();
    let (pp_hvx, tg_hvx) = (c.prompt.hvx as f64 / n_prompt as f64, c.decode.hvx as f64 / decode_steps);
    // Bytes read from memory per token (`keel bench --roofline`'s count: matrix weights,
    // norms, one embedding row, the KV rows attention reads at these positions). A forward
    // pass reads each matrix once (a product's chunk of tiles serves every column of the
    // batch from the cache, `tiles32::matmul`), so a prompt read in k passes (chunks)
    // reads the weights k times for its n tokens.
    let (tg_b, pp_b) = model_bytes(&a.model, n_prompt, n_gen)?;
    let tg_bytes = tg_b.total() as f64;
    let passes = c.prompt.forwards.max(1) as f64;
    let pp_bytes = (pp_b.weights as f64 * passes) / n_prompt as f64 + (pp_b.small + pp_b.kv) as f64;
    if c.threads > TARGETS.iter().map(|t| t.hvx_contexts as usize).min().unwrap_or(1) {
        bail!("the firmware ran {} hardware threads, more than a target's HVX contexts: set KEEL_DSP_THREADS to at most 4", c.threads);
    }
    // (1 thread, as run, bandwidth bound) tokens/s.
    let est = |t: &Target, packets: f64, critical: f64, bytes: f64| {
        let bw = t.ddr_bytes_s / bytes;
        ((t.clock_hz / packets).min(bw), (t.clock_hz / critical).min(bw), bw)
    };
    let model = a.model.display().to_string();
    if a.json {
        let ops = |v: &[f64]| serde_json::Value::Object(OPS.iter().chain(["other"].iter()).zip(v).map(|(k, &x)| (k.to_string(), x.into())).collect());
        let targets: Vec<_> = TARGETS
            .iter()
            .map(|t| {
                let (pc, pa, pb) = est(t, pp_tot, pp_crit, pp_bytes);
                let (gc, ga, gb) = est(t, tg_tot, tg_crit, tg_bytes);
                serde_json::json!({"target": t.name, "clock_hz": t.clock_hz, "hvx_contexts": t.hvx_contexts, "ddr_bytes_s": t.ddr_bytes_s,
                    "prompt_tps": pc, "prompt_tps_as_run": pa, "prompt_tps_bandwidth_bound": pb,
                    "decode_tps": gc, "decode_tps_as_run": ga, "decode_tps_bandwidth_bound": gb})
            })
            .collect();
        let j = serde_json::json!({"model": model, "cpu": a.cpu, "prompt_tokens": n_prompt, "generated": n_gen,
            "prompt_batches": c.prompt.batches, "decode_batches": c.decode.batches, "decode_steps": decode_steps, "setup_packets": c.setup,
            "prompt_packets_per_token": pp_tot, "decode_packets_per_token": tg_tot, "threads": c.threads,
            "prompt_critical_packets_per_token": pp_crit, "decode_critical_packets_per_token": tg_crit,
            "prompt_hvx_kernel_packets_per_token": pp_hvx, "decode_hvx_kernel_packets_per_token": tg_hvx,
            "prompt_ops": ops(&pp), "decode_ops": ops(&tg), "device_model_bytes": device_bytes,
            "prompt_bytes_per_token": pp_bytes, "decode_bytes_per_token": tg_bytes, "prompt_passes": passes,
            "decode_over_prompt": tg_tot / pp_tot, "targets": targets, "assumptions": ASSUMPTIONS});
        println!("{j}");
        return Ok(());
    }
    println!(
        "executed packets under qemu-hexagon -cpu {} ({model}): prompt {n_prompt} tokens in {} batches, {n_gen} generated ({} decode batches, {decode_steps} decode steps)",
        a.cpu, c.prompt.batches, c.decode.batches
    );
    println!("| per token | {} | other | total | of which HVX kernels | bytes read |", OPS.join(" | "));
    println!("|---|{}---|---|---|---|", "---|".repeat(OPS.len()));
    let row = |name: &str, v: &[f64], tot: f64, hvx: f64, bytes: f64| {
        let cells: Vec<String> = v.iter().map(|x| format!("{x:.0}")).collect();
        println!("| {name} | {} | {tot:.0} | {hvx:.0} | {bytes:.0} |", cells.join(" | "));
    };
    row("prompt", &pp, pp_tot, pp_hvx, pp_bytes);
    row("decode", &tg, tg_tot, tg_hvx, tg_bytes);
    println!("decode / prompt packets per token: {:.2}×  (start-up, not counted above: {} packets)", tg_tot / pp_tot, c.setup);
    println!(
        "critical path per token on {} hardware thread(s): prompt {pp_crit:.0}, decode {tg_crit:.0} (decode / prompt {:.2}×)",
        c.threads,
        tg_crit / pp_crit
    );
    println!();
    let n = c.threads;
    println!("| estimate | prompt t/s (1 thread / as run, {n} threads / bandwidth bound) | decode t/s (1 thread / as run, {n} threads / bandwidth bound) |");
    println!("|---|---|---|");
    for t in &TARGETS {
        let (pc, pa, pb) = est(t, pp_tot, pp_crit, pp_bytes);
        let (gc, ga, gb) = est(t, tg_tot, tg_crit, tg_bytes);
        println!("| {} | {pc:.1} / {pa:.1} / {pb:.0} | {gc:.1} / {ga:.1} / {gb:.0} |", t.name);
    }
    println!("{ASSUMPTIONS}");
    if a.symbols > 0 {
        let mut v: Vec<_> = c.by_symbol.iter().collect();
        v.sort_by_key(|(_, n)| std::cmp::Reverse(n.iter().sum::<u64>()));
        println!("\nexecuted packets by the symbol a block starts in (the top {} of {}):", a.symbols.min(v.len()), v.len());
        println!("{:>14} {:>12} {:>12} {:>12}  symbol", "all phases", "start-up", "per prompt", "per decode");
        for (s, n) in v.into_iter().take(a.symbols) {
            let (p, d) = (n[1] as f64 / n_prompt as f64, n[2] as f64 / decode_steps);
            println!("{:>14} {:>12} {p:>12.0} {d:>12.0}  {s}", n.iter().sum::<u64>(), n[0]);
        }
    }
    Ok(())
}

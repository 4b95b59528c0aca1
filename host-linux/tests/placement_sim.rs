//! Placement on the hexagon-sim device, end to end: keel-core places every matrix
//! product of a model on the emulated DSP (weights repacked once into Tiles32, types
//! the DSP lacks converted to Q8_0 at load), and the DSP run's logits and greedy tokens
//! are compared with keel's CPU run of the same file.
//!
//! Bars (issue 6, acceptance 2): greedy tokens equal the CPU's at every step except
//! where the CPU's own best-vs-second gap is < 1e-3; top-1 agreement >= 99% of
//! positions; max |Δlogit| <= 1e-2; the device holds the repacked weight bytes.
//! Teacher-forced: both runs see the CPU's tokens, so every position is compared.
//! Skips loudly without qemu-hexagon or the firmware ELF (`KEEL_REQUIRE_DSP=1`: fails).

use crate::sim;

use keel_core::placement::{weight_count, Decision, Exec, OffloadMode, Policy, Where};
use keel_core::session::Outputs;
use keel_host_linux::cli::load::{engine, open, prepare, RunOptions};
use keel_host_linux::device::offload::Devices;
use keel_host_linux::device::SimConfig;
use std::path::PathBuf;
use std::time::Instant;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What one comparison measured.
#[derive(Debug, Default)]
pub struct Stats {
    pub positions: usize,
    pub top1_agree: usize,
    pub max_dlogit: f32,
    /// (prompt, step, cpu gap) of each step where the DSP's choice differs.
    pub divergences: Vec<(usize, usize, f32)>,
    pub model_bytes: u64,
    pub weights_on_dsp: usize,
    pub weights: usize,
    pub converted: usize,
    pub batches: u64,
    pub secs: f64,
    /// Layers that ran whole on the DSP.
    pub layers_on_dsp: usize,
    /// KV cache bytes on the DSP (the breakdown's context column).
    pub context_bytes: u64,
    /// Device batches per single-token evaluation (min, max).
    pub batches_per_token: (u64, u64),
    /// The whole forward pass ran on the DSP (embedding lookup to logits).
    pub forward: bool,
    /// Bytes of the token embedding's copy on the DSP.
    pub embd_bytes: u64,
}

fn policy(mode: OffloadMode) -> Policy {
    let mut p = Policy::all(1);
    p.mode = mode;
    p
}

/// Runs every prompt of `greedy` on the CPU and (teacher-forced) on the DSP, `n_gen`
/// tokens each (`None`: the golden file's length).
pub fn compare(cfg: &SimConfig, model: &std::path::Path, greedy: &std::path::Path, n_gen: Option<usize>, max_prompts: usize, mode: OffloadMode) -> Stats {
    let opened = open(model.to_str().unwrap()).unwrap();
    let g = opened.gguf().unwrap();
    let opts = RunOptions { n_ctx: 256, n_batch: 64, n_outputs: 1, threads: 2, reference: false, force_ctx: false };
    let mut l_cpu = prepare(&g, &opened.path, &opts).unwrap();
    let mut l_dev = prepare(&g, &opened.path, &opts).unwrap();
    let sampling = keel_core::sampler::SamplerConfig { temp: 0.0, ..Default::default() };
    let (mut cpu, pool) = engine(&g, &opened.path, &mut l_cpu, false, sampling).unwrap();
    let (mut dsp, _) = engine(&g, &opened.path, &mut l_dev, false, sampling).unwrap();
    let mut devices = Devices::open(&["hexagon-sim".to_string()], cfg).unwrap();
    let mut slots = vec![Decision::EMPTY; weight_count(&dsp.model)];
    let placement = devices.plan(&dsp.model, &policy(mode), opts.n_ctx, &mut slots).unwrap();
    devices.load(&dsp.model, &placement, &dsp.session.kernels()).unwrap();
    let mut st = Stats { weights: placement.decisions().len(), weights_on_dsp: placement.n_on_devices(), ..Default::default() };
    for d in placement.decisions() {
        assert_eq!(d.place, Where::Device(0), "{:?} stayed on the CPU", d.id);
    }
    st.layers_on_dsp = (0..dsp.model.layers.len()).filter(|&l| placement.layer_device(l) == Some(0)).count();
    st.forward = placement.forward_device(1) == Some(0);
    st.embd_bytes = placement.totals(0).embd_bytes;
    let b = &devices.breakdown()[0];
    st.model_bytes = b.model;
    st.converted = b.weights.1;
    st.context_bytes = b.context;
    st.batches_per_token = (u64::MAX, 0);
    let nv = cpu.n_vocab();
    let t0 = Instant::now();
    for (pi, (prompt, golden)) in keel_test_support::greedy_prompts(greedy.to_str().unwrap()).into_iter().take(max_prompts).enumerate() {
        let n = golden.len();
        let n = n_gen.unwrap_or(n);
        cpu.reset();
        dsp.reset();
        let mut input = prompt.clone();
        for step in 0..n {
            let c = cpu.eval(&input, Outputs::Last, pool).unwrap().to_vec();
            let b0 = devices.batches();
            let mut exec = Exec { placement: &placement, offload: &mut devices };
            let r = dsp.eval_on(&input, Outputs::Last, pool, Some(&mut exec));
            if let Err(e) = r {
                panic!("{e}: {:?}", devices.error);
            }
            if step > 0 {
                let b = devices.batches() - b0;
                st.batches_per_token = (st.batches_per_token.0.min(b), st.batches_per_token.1.max(b));
            }
            let d = dsp.session.last_logits(nv);
            let (cb, gap) = keel_test_support::top_two(&c[c.len() - nv..]);
            let (db, _) = keel_test_support::top_two(d);
            st.positions += 1;
            if cb == db {
                st.top1_agree += 1;
            } else {
                st.divergences.push((pi, step, gap));
            }
            for (x, y) in c[c.len() - nv..].iter().zip(d) {
                st.max_dlogit = st.max_dlogit.max((x - y).abs());
            }
            input = vec![cb as u32];
        }
    }
    st.secs = t0.elapsed().as_secs_f64();
    st.batches = devices.batches();
    st
}

fn check_bars(name: &str, st: &Stats) {
    let top1 = st.top1_agree as f64 / st.positions as f64;
    eprintln!(
        "{name}: {} of {} matrix weights on the DSP ({} converted), {:.2} MiB of model memory (of which {} bytes of token embedding); {} whole layers, {} bytes of KV cache on the DSP, \
         {:?} batches per generated token; {} positions, top-1 {top1:.4}, max |Δlogit| {:.3e}, divergences {:?}; {} device batches in {:.1} s",
        st.weights_on_dsp,
        st.weights,
        st.converted,
        st.model_bytes as f64 / 1048576.0,
        st.embd_bytes,
        st.layers_on_dsp,
        st.context_bytes,
        st.batches_per_token,
        st.positions,
        st.max_dlogit,
        st.divergences,
        st.batches,
        st.secs
    );
    assert_eq!(st.weights_on_dsp, st.weights, "every matrix product on the DSP");
    assert!(st.model_bytes > 0, "the breakdown shows the repacked weights on the DSP");
    for &(p, s, gap) in &st.divergences {
        assert!(gap < 1e-3, "{name}: prompt {p} step {s}: the DSP chose another token where the CPU's best-vs-second gap is {gap}");
    }
    assert!(top1 >= 0.99, "{name}: top-1 agreement {top1}");
    assert!(st.max_dlogit <= 1e-2, "{name}: max |Δlogit| {}", st.max_dlogit);
}

fn synth(name: &str, mode: OffloadMode) -> Option<Stats> {
    let cfg = sim::config(name)?;
    let dir = root().join("tests/golden/synth");
    let model = dir.join(format!("{name}.gguf"));
    // Qwen 3.5's file keeps its small beta/alpha projections in F32, which a device
    // converts to Q8_0: the CPU's comparison run uses a copy whose every matrix is
    // already Q8_0 (`keel quantize`), so both sides compute with the same weights.
    let model = if name.contains("qwen35") { requantized(&model, "Q8_0") } else { model };
    let st = compare(&cfg, &model, &dir.join(format!("{name}.greedy.jsonl")), None, usize::MAX, mode);
    check_bars(name, &st);
    Some(st)
}

/// `keel quantize --allow-requantize` of `src` to `ty`, once per test binary.
fn requantized(src: &std::path::Path, ty: &str) -> PathBuf {
    keel_test_support::requantized(std::path::Path::new(env!("CARGO_BIN_EXE_keel")), src, ty, &PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("keel-placement"))
}

/// Matmul mode: one batch per product, nothing else on the DSP.
fn synth_matmul(name: &str) {
    let Some(st) = synth(name, OffloadMode::MatMul) else { return };
    assert_eq!((st.layers_on_dsp, st.context_bytes), (0, 0));
    assert_eq!(st.batches_per_token, (29, 29), "4 layers × 7 products + the output projection");
}

/// Layer mode: the synthetic models' whole forward pass runs on the DSP: the embedding
/// lookup, the 4 layers with their F16 KV cache there (256 positions × 2 (K, V) ×
/// kv_dim × 2 bytes per layer), the final norm and the output projection, as one batch
/// per token (1 + 4 × 17 + 2 ops); the logits come back from the DSP.
fn synth_layers(name: &str) {
    let Some(st) = synth(name, OffloadMode::Layers) else { return };
    let n_layers = if name.contains("gemma3") { 6 } else { 4 };
    assert_eq!(st.layers_on_dsp, n_layers, "every layer whole on the DSP");
    assert!(st.forward, "the whole forward pass on the DSP");
    assert!(st.embd_bytes > 0 && st.model_bytes > st.embd_bytes, "the token embedding's copy counts as model memory: {} of {}", st.embd_bytes, st.model_bytes);
    assert!(st.context_bytes >= n_layers as u64 * 2 * 256 * 2 * 16, "the KV cache is on the DSP: {} bytes", st.context_bytes);
    assert_eq!(st.batches_per_token, (1, 1), "embedding, every layer, final norm and output projection as one batch");
    assert_eq!(st.max_dlogit, 0.0, "{name}: the DSP's logits equal the CPU's bit for bit");
}
/// The bar on the Q8_0 model. Measured: 128 positions, top-1 1.000, max
/// |Δlogit| 0, no divergence (the DSP's products follow the CPU's orders;
/// before that: top-1 0.992, max 6.3e-3, one divergence at a CPU gap of 1.3e-3).
#[test]
fn synth_llama_q8_0_runs_every_matrix_product_on_the_dsp() {
    synth_matmul("synth-llama-q8_0");
}

/// Whole layers on the DSP (every op of the layer, KV cache on the device). Measured
/// (qemu-hexagon v68): 128 positions, top-1 1.000, max |Δlogit| 0, no divergence, 2
/// batches per token, 256 KiB of KV cache on the DSP (with the firmware's earlier f32
/// attention accumulator: top-1 0.961, max 1.3e-2, divergences at CPU gaps up to 2.2e-3).
#[test]
fn synth_llama_q8_0_runs_whole_layers_on_the_dsp() {
    synth_layers("synth-llama-q8_0");
}

/// The bar on the Q4_0 model. Measured: 128 positions, top-1 1.000, max |Δlogit| 0, no
/// divergence (9.8e-3 before the DSP's Q4_0 scales followed the CPU's fma order).
#[test]
fn synth_llama_q4_0_runs_every_matrix_product_on_the_dsp() {
    synth_matmul("synth-llama-q4_0");
}

/// Whole layers on the DSP. Measured: 128 positions, top-1 1.000, max |Δlogit| 0, no
/// divergence, 2 batches per token (earlier f32 attention accumulator: max 1.3e-2).
#[test]
fn synth_llama_q4_0_runs_whole_layers_on_the_dsp() {
    synth_layers("synth-llama-q4_0");
}

/// Qwen 2 layers (Q/K/V biases: `Add` of a bias row) whole on the DSP, the whole forward
/// pass as one batch per token, logits equal to the CPU's.
#[test]
fn synth_qwen2_q8_0_runs_whole_layers_on_the_dsp() {
    synth_layers("synth-qwen2-q8_0");
}

/// Qwen 3 layers (per-head q/k RMSNorm: `RmsNorm` over rows of one head) whole on the DSP.
#[test]
fn synth_qwen3_q8_0_runs_whole_layers_on_the_dsp() {
    synth_layers("synth-qwen3-q8_0");
}

/// Gemma 3 layers whole on the DSP: scaled embeddings (`Scale` after `GetRows`), per-head
/// norms, pre-scaled queries, sliding-window attention on the local layers (their RoPE
/// base is not the table's: the DSP computes those angles with keel-core's function),
/// post-norms and GeGLU.
#[test]
fn synth_gemma3_q8_0_runs_whole_layers_on_the_dsp() {
    synth_layers("synth-gemma3-q8_0");
}

/// Qwen 3.5 whole on the DSP: gated delta-net layers (the gates by `Sigmoid`/`Add`/
/// `Softplus`/`Mul`, `SsmConv` and `GatedDeltaRule` over states resident on the DSP and
/// zeroed when a sequence starts, `L2Norm` of the q/k heads, the gated norm by `RmsNorm`
/// and `SwiGlu`) and gated attention layers (the `[q | gate]` split by strided `Copy`,
/// the output gate by `Sigmoid` and `Mul`).
#[test]
fn synth_qwen35_q8_0_runs_whole_layers_on_the_dsp() {
    synth_layers("synth-qwen35-q8_0");
}

// ---- SmolLM2-135M (from the cached Q4_1 download, re-quantized by `keel quantize`) ----

/// `keel quantize --allow-requantize` of the cached SmolLM2 Q4_1 file to `ty`, made once
/// per test binary under the target directory; `None` (loudly) when the model is not cached.
fn smollm2(ty: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os("KEEL_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/keel/models"),
    };
    let src = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if !src.is_file() {
        if std::env::var("KEEL_REQUIRE_MODELS").as_deref() == Ok("1") {
            panic!("{} not found and KEEL_REQUIRE_MODELS=1; run `keel pull smollm2-135m`", src.display());
        }
        eprintln!("\n*** SKIPPED: {} not found; run `keel pull smollm2-135m` ***\n", src.display());
        return None;
    }
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("keel-placement");
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join(format!("smollm2.{ty}.gguf"));
    // Tests run on threads of one process: one quantizes, the others wait for its file
    // (the temporary name below is per process, not per thread).
    static QUANTIZING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = QUANTIZING.lock().unwrap_or_else(|e| e.into_inner());
    if !out.is_file() {
        let tmp = out_dir.join(format!("smollm2.{ty}.{}.tmp.gguf", std::process::id()));
        let st = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
            .arg("quantize")
            .arg(&src)
            .arg(&tmp)
            .arg(ty)
            .args(["--allow-requantize", "-t", "2"])
            .output()
            .unwrap();
        assert!(st.status.success(), "keel quantize: {}", String::from_utf8_lossy(&st.stderr));
        std::fs::rename(&tmp, &out).unwrap();
    }
    Some(out)
}

/// Free-running greedy decoding with every product on the DSP; also the CPU's
/// tokens and best-vs-second gaps on the same (DSP) sequence, batches per token and tok/s.
struct Greedy {
    dsp: Vec<u32>,
    cpu_gap: Vec<f32>,
    cpu_choice: Vec<u32>,
    batches_per_token: f64,
    tps: f64,
}

fn greedy_on_dsp(cfg: &SimConfig, model: &std::path::Path, runs: &[(Vec<u32>, usize)], mode: OffloadMode) -> (Vec<Greedy>, Stats) {
    let opened = open(model.to_str().unwrap()).unwrap();
    let g = opened.gguf().unwrap();
    let opts = RunOptions { n_ctx: 128, n_batch: 64, n_outputs: 1, threads: 2, reference: false, force_ctx: false };
    let mut l_cpu = prepare(&g, &opened.path, &opts).unwrap();
    let mut l_dev = prepare(&g, &opened.path, &opts).unwrap();
    let sampling = keel_core::sampler::SamplerConfig { temp: 0.0, ..Default::default() };
    let (mut cpu, pool) = engine(&g, &opened.path, &mut l_cpu, false, sampling).unwrap();
    let (mut dsp, _) = engine(&g, &opened.path, &mut l_dev, false, sampling).unwrap();
    let mut devices = Devices::open(&["hexagon-sim".to_string()], cfg).unwrap();
    let mut slots = vec![Decision::EMPTY; weight_count(&dsp.model)];
    let placement = devices.plan(&dsp.model, &policy(mode), opts.n_ctx, &mut slots).unwrap();
    devices.load(&dsp.model, &placement, &dsp.session.kernels()).unwrap();
    let b = &devices.breakdown()[0];
    let mut st = Stats { weights: placement.decisions().len(), weights_on_dsp: placement.n_on_devices(), model_bytes: b.model, converted: b.weights.1, context_bytes: b.context, ..Default::default() };
    st.layers_on_dsp = (0..dsp.model.layers.len()).filter(|&l| placement.layer_device(l) == Some(0)).count();
    eprintln!("placement: {} of {} on the DSP, {} converted at load, {:.1} MiB of model memory (load {:.1} s)", st.weights_on_dsp, st.weights, st.converted, st.model_bytes as f64 / 1048576.0, devices.load_time.as_secs_f64());
    let nv = cpu.n_vocab();
    let mut out = Vec::new();
    for (prompt, n) in runs {
        cpu.reset();
        dsp.reset();
        let mut input = prompt.clone();
        let mut r = Greedy { dsp: Vec::new(), cpu_gap: Vec::new(), cpu_choice: Vec::new(), batches_per_token: 0.0, tps: 0.0 };
        let (mut t_gen, mut b_gen) = (0.0f64, 0u64);
        for step in 0..*n {
            let c = cpu.eval(&input, Outputs::Last, pool).unwrap().to_vec();
            let (b0, t0) = (devices.batches(), Instant::now());
            let mut exec = Exec { placement: &placement, offload: &mut devices };
            if let Err(e) = dsp.eval_on(&input, Outputs::Last, pool, Some(&mut exec)) {
                panic!("{e}: {:?}", devices.error);
            }
            if step > 0 {
                t_gen += t0.elapsed().as_secs_f64();
                b_gen += devices.batches() - b0;
            }
            let d = dsp.session.last_logits(nv);
            let crow = &c[c.len() - nv..];
            let (cb, gap) = keel_test_support::top_two(crow);
            let (db, _) = keel_test_support::top_two(d);
            st.positions += 1;
            st.top1_agree += usize::from(cb == db);
            for (x, y) in crow.iter().zip(d) {
                st.max_dlogit = st.max_dlogit.max((x - y).abs());
            }
            r.dsp.push(db as u32);
            r.cpu_choice.push(cb as u32);
            r.cpu_gap.push(gap);
            input = vec![db as u32];
        }
        let steps = n.saturating_sub(1).max(1) as f64;
        r.batches_per_token = b_gen as f64 / steps;
        r.tps = steps / t_gen.max(1e-9);
        out.push(r);
    }
    st.batches = devices.batches();
    (out, st)
}

/// Greedy on the DSP from the golden prompts numbered `which` (lines of the Q8_0 greedy
/// golden), 16 tokens each: per prompt, (its number, tokens equal to llama.cpp's, the CPU's
/// best-vs-second gap at the first difference).
fn smollm2_q8_0_vs_llama_cpp(which: &[usize], mode: OffloadMode) -> Vec<(usize, usize, f32)> {
    let Some(cfg) = sim::config("smollm2_q8_0_on_the_dsp") else { return Vec::new() };
    let Some(model) = smollm2("Q8_0") else { return Vec::new() };
    let golden = root().join("tests/golden/smollm2-135m-requant/Q8_0.greedy.jsonl");
    let text = std::fs::read_to_string(&golden).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let want: Vec<(Vec<u32>, Vec<u32>)> = which
        .iter()
        .map(|&i| lines.get(i).unwrap_or_else(|| panic!("{}: no prompt {i}", golden.display())))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let ids = |k: &str| v[k].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<u32>>();
            (ids("prompt_tokens"), ids("generated"))
        })
        .collect();
    let runs: Vec<(Vec<u32>, usize)> = want.iter().map(|(p, _)| (p.clone(), 16)).collect();
    let (got, st) = greedy_on_dsp(&cfg, &model, &runs, mode);
    eprintln!("mode {mode:?}: {} whole layers on the DSP, {} bytes of KV cache there", st.layers_on_dsp, st.context_bytes);
    assert_eq!(st.weights_on_dsp, st.weights, "every matrix product on the DSP");
    let mut firsts = Vec::new();
    for (&i, (r, (_, gen))) in which.iter().zip(got.iter().zip(&want)) {
        let first = (0..16).find(|&j| r.dsp[j] != gen[j]).unwrap_or(16);
        let gap = r.cpu_gap.get(first).copied().unwrap_or(f32::NAN);
        eprintln!(
            "prompt {i}: DSP {:?}\n          llama.cpp {:?}\n          equal for {first}/16 tokens (CPU gap at the first difference {gap:.3e}); \
             {:.3} tokens/s emulated, {:.1} batches per token",
            r.dsp,
            &gen[..16],
            r.tps,
            r.batches_per_token
        );
        firsts.push((i, first, gap));
    }
    eprintln!("top-1 DSP vs keel CPU on the DSP's sequence: {}/{}, max |Δlogit| {:.3e}", st.top1_agree, st.positions, st.max_dlogit);
    firsts
}

/// The bar: the first 16 greedy tokens of two prompts equal llama.cpp's, every
/// matrix product on the DSP. Measured by hand (qemu-hexagon v68, 2 cores shared with
/// other jobs): **met**, 16/16 and 16/16 tokens, DSP logits equal to keel's CPU logits bit
/// for bit (max |Δlogit| 0); 211 batches per token (one MatMul per product: 30 layers × 7
/// + the output projection); ~0.12 generated tokens/s emulated then, 0.54 since the
/// firmware became keel-core compiled for Hexagon. Both prompts took 264 s alone on the
/// Intel Xeon CI kind (0.15-0.17 tokens/s there; a quarter of the host-linux suite's test
/// time), so CI runs the second golden prompt (11 prompt tokens: a multi-token batch of
/// products; the whole-layers test below runs the first): 16/16 there guards the claim.
/// Both by hand: `smollm2_q8_0_vs_llama_cpp(&[0, 1], OffloadMode::MatMul)`.
#[test]
fn smollm2_q8_0_on_the_dsp_equals_llama_cpp_for_16_tokens() {
    for (i, first, _) in smollm2_q8_0_vs_llama_cpp(&[1], OffloadMode::MatMul) {
        assert_eq!(first, 16, "prompt {i}: the DSP's greedy tokens differ from llama.cpp's at token {first}");
    }
}

/// The same bar in layer mode: all 30 layers whole on the DSP (norms, RoPE, attention
/// over the DSP's F16 KV cache, SwiGLU, adds in the firmware's scalar float). Measured
/// by hand (qemu-hexagon v68, 2 shared cores): **met**, 16/16 and 16/16 tokens equal
/// llama.cpp's; DSP logits equal keel's CPU logits bit for bit (max |Δlogit| 0, 32/32);
/// 5 batches per token (4 batches of up to 8 layers under the 32 MiB·token batch work
/// bound + the output projection); 2.8 MiB of KV cache on the DSP (n_ctx 128);
/// ~0.09 generated tokens/s emulated; 503 s for the test. Again with the whole forward
/// pass on the DSP (embedding lookup in the first layer batch, a 28.7 MiB Q8_0 copy of
/// token_embd: 173.2 MiB of model memory): 16/16 and 16/16, max |Δlogit| 0, still 5
/// batches per token (the 28 MiB output weight does not fit the last layer batch's
/// work, so it keeps a batch of its own), 0.13-0.145 tokens/s, 309 s.
/// Since the firmware became keel-core compiled for Hexagon (every op keel-core's code),
/// CI runs this on the first golden prompt (~2 min under QEMU; both prompts took 208 s
/// by hand, 16/16 and 16/16): it guards the claim that a real model run whole on the
/// DSP gives llama.cpp's tokens.
#[test]
fn smollm2_q8_0_whole_layers_on_the_dsp_vs_llama_cpp_for_16_tokens() {
    for (i, first, gap) in smollm2_q8_0_vs_llama_cpp(&[0], OffloadMode::Layers) {
        assert_eq!(first, 16, "prompt {i}: the DSP's greedy tokens differ from llama.cpp's at token {first} (CPU gap {gap:e})");
    }
}

/// SmolLM2 Q4_K_M (16 Q4_K, 14 Q6_K, 166 Q5_0, 15 Q8_0 matrices): every matrix the DSP
/// lacks is converted to Q8_0 at load and placed on the DSP; the breakdown shows it. The
/// accuracy cost is measured two ways: per weight (relative RMS error of the Q8_0 copy
/// against the file's values) and end to end (DSP logits vs the CPU's on the original
/// types, teacher-forced on one prompt).
#[test]
fn smollm2_q4_k_m_converted_weights_are_placed_on_the_dsp() {
    let Some(cfg) = sim::config("smollm2_q4_k_m_converted_weights_are_placed_on_the_dsp") else { return };
    let Some(model) = smollm2("Q4_K_M") else { return };
    // Per-weight conversion error.
    let opened = open(model.to_str().unwrap()).unwrap();
    let g = opened.gguf().unwrap();
    let opts = RunOptions { n_ctx: 64, n_batch: 16, n_outputs: 1, threads: 1, reference: false, force_ctx: false };
    let mut l = prepare(&g, &opened.path, &opts).unwrap();
    let (e, _) = engine(&g, &opened.path, &mut l, false, Default::default()).unwrap();
    let kern = e.session.kernels();
    let mut per_type: std::collections::BTreeMap<String, (f64, f64, usize)> = Default::default();
    keel_core::placement::for_each_weight(&e.model, |_, t| {
        if keel_host_linux::device::offload::hal_dtype(t.ty).is_some() {
            return;
        }
        let q8 = convert(&kern, t, keel_core::ggml_type::GgmlType::Q8_0);
        let rb = q8.len() / t.rows;
        let (mut a, mut b) = (vec![0f32; t.cols], vec![0f32; t.cols]);
        let ent = per_type.entry(t.ty.to_string()).or_default();
        for r in 0..t.rows {
            kern.dequantize_row(t.ty, t.row(r), &mut a).unwrap();
            kern.dequantize_row(keel_core::ggml_type::GgmlType::Q8_0, &q8[r * rb..(r + 1) * rb], &mut b).unwrap();
            for (x, y) in a.iter().zip(&b) {
                ent.0 += f64::from(x - y).powi(2);
                ent.1 += f64::from(*x).powi(2);
            }
        }
        ent.2 += 1;
    });
    for (ty, (err, sig, n)) in &per_type {
        eprintln!("{ty} -> q8_0: {n} weights, relative RMS error {:.3e}", (err / sig).sqrt());
        assert!((err / sig).sqrt() < 1e-2, "{ty}: conversion error too large");
    }
    assert!(per_type.contains_key("q4_K") && per_type.contains_key("q6_K"), "the file has K-quant matrices: {per_type:?}");
    drop(e);
    // Placed and loaded (no generation here: see `smollm2_q4_k_m_conversion_cost_end_to_end`
    // for the logits).
    let dir = root().join("tests/golden/smollm2-135m-requant/Q8_0.greedy.jsonl");
    let st = compare(&cfg, &model, &dir, Some(0), 1, OffloadMode::Layers);
    eprintln!(
        "SmolLM2 Q4_K_M: {} of {} matrix weights on the DSP, {} converted to q8_0 at load, {:.1} MiB repacked",
        st.weights_on_dsp,
        st.weights,
        st.converted,
        st.model_bytes as f64 / 1048576.0
    );
    assert_eq!(st.weights_on_dsp, st.weights);
    assert!(st.converted >= 196, "Q4_K, Q6_K and Q5_0 matrices converted ({} converted)", st.converted);
    assert!(st.model_bytes > 100 << 20, "the repacked weights are on the DSP");
}

// ---- the CLI ----

fn keel_run(args: &[&str]) -> (serde_json::Value, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_keel")).arg("run").args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "keel run {args:?}: {err}");
    (serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout))), err)
}

/// `--device-in-flight 2` (prompt chunks alternating between two work buffers, each
/// chunk's batches back to back) gives the bits, tokens and batches of one at a time, and
/// the CPU's bits.
#[test]
fn two_batches_in_flight_on_hexagon_sim_give_the_bits_of_one() {
    let Some(_) = sim::config("two_batches_in_flight_on_hexagon_sim_give_the_bits_of_one") else { return };
    let m = root().join("tests/golden/synth/synth-llama-q8_0.gguf");
    keel_test_support::check_in_flight_bits(env!("CARGO_BIN_EXE_keel"), &m, "hexagon-sim", &[]);
}

/// Prompt chunks as a pipeline on hexagon-sim (issue 24, deliver 3): two device sessions
/// splitting the layers (`--tensor-split 1,1`: session 0 runs chunk c+1 while session 1
/// runs chunk c) and one session with the CPU's layers and output projection after it
/// (`-ngl 2 --offload-output off`); with `-b 4` the prompt is 6 chunks. Pipelined (two in
/// flight) gives the bits and batches of one in flight and the CPU's, also with
/// `--batches llama-cpp` (whose CPU arithmetic depends on the batch: chunks stay as they were).
#[test]
fn pipelined_prompt_chunks_on_hexagon_sim_give_the_bits_of_one_in_flight() {
    let Some(_) = sim::config("pipelined_prompt_chunks_on_hexagon_sim_give_the_bits_of_one_in_flight") else { return };
    let m = root().join("tests/golden/synth/synth-llama-q8_0.gguf");
    let keel = env!("CARGO_BIN_EXE_keel");
    let two = ["--device", "hexagon-sim,hexagon-sim", "--tensor-split", "1,1"];
    let (one, _) = keel_test_support::check_pipelined_bits(keel, &m, &two, &[], true, &[]);
    assert_eq!(one["device_layers"], 4, "every layer whole on a session");
    let (a, b) = (&one["memory_breakdown"][0], &one["memory_breakdown"][1]);
    assert!(a["context"].as_u64().unwrap() > 0 && b["context"].as_u64().unwrap() > 0, "each session holds layers: {a} {b}");
    let with_cpu = ["--device", "hexagon-sim", "-ngl", "2", "--offload-output", "off"];
    let (one, _) = keel_test_support::check_pipelined_bits(keel, &m, &with_cpu, &[], true, &[]);
    assert_eq!(one["device_layers"], 2, "layers 0 and 1 on the session, 2 and 3 on the CPU");
    keel_test_support::check_pipelined_bits(keel, &m, &two, &["--batches", "llama-cpp"], false, &[]);
}

/// Speculative decoding with the target and the draft placed independently (issue 21,
/// deliver 4): the draft on the DSP and the target on the CPU, the reverse, and both on
/// the DSP (two sessions); each run generates the CPU's plain greedy tokens, drafts, and
/// its `--json` counts the batches of the device each model used.
#[test]
fn speculation_places_target_and_draft_independently_on_hexagon_sim() {
    let Some(_) = sim::config("speculation_places_target_and_draft_independently_on_hexagon_sim") else { return };
    let dir = root().join("tests/golden/synth");
    let (target, draft) = (dir.join("synth-llama-q8_0.gguf"), dir.join("synth-llama-q4_0.gguf"));
    let (target, draft) = (target.to_str().unwrap(), draft.to_str().unwrap());
    let base = ["-m", target, "-p", "The capital of France is", "-n", "24", "--temp", "0", "-t", "2", "--json"];
    let (plain, _) = keel_run(&base);
    let spec = ["--draft-model", draft, "--draft-max", "4", "--draft-fixed"];
    for (placed, target_on_dsp, draft_on_dsp) in [(&["--device-draft", "hexagon-sim"][..], false, true), (&["--device", "hexagon-sim"][..], true, false), (&["--device", "hexagon-sim", "--device-draft", "hexagon-sim"][..], true, true)] {
        let args: Vec<&str> = base.iter().chain(&spec).chain(placed).copied().collect();
        let (j, err) = keel_run(&args);
        assert_eq!(j["generated"], plain["generated"], "{placed:?}: speculation changed the greedy tokens");
        let s = &j["speculative"];
        assert!(s["drafted"].as_u64().unwrap() > 0, "{placed:?}: nothing drafted: {s}");
        assert_eq!(j["device_batches"].as_u64().unwrap() > 0, target_on_dsp, "{placed:?}: the target's device batches: {}", j["device_batches"]);
        assert_eq!(s["draft_device_batches"].as_u64().unwrap() > 0, draft_on_dsp, "{placed:?}: the draft's device batches: {s}");
        // The draft's device batches: at least one per drafted token (one token per pass).
        if draft_on_dsp {
            assert!(s["draft_device_batches"].as_u64().unwrap() >= s["drafted"].as_u64().unwrap(), "{placed:?}: {s}");
            assert!(err.contains("draft model") && err.contains("hexagon-sim"), "{placed:?}: the draft's placement is printed: {err}");
        }
    }
}

#[test]
fn keel_run_device_prints_the_breakdown_and_says_loudly_when_nothing_is_placed() {
    let Some(_) = sim::config("keel_run_device_prints_the_breakdown_and_says_loudly_when_nothing_is_placed") else { return };
    let m = root().join("tests/golden/synth/synth-llama-q8_0.gguf");
    let m = m.to_str().unwrap();
    let base = ["-m", m, "-p", "Hello", "-n", "8", "--temp", "0", "--json"];
    let (cpu, _) = keel_run(&base);
    // `--device cpu` is the CPU path unchanged, bit for bit.
    let (cpu2, _) = keel_run(&[&base[..], &["--device", "cpu"]].concat());
    assert_eq!(cpu["logits_sha256"], cpu2["logits_sha256"]);
    assert_eq!(cpu2["offloaded_weights"], 0);
    let (dsp, err) = keel_run(&[&base[..], &["--device", "hexagon-sim,cpu"]].concat());
    eprintln!("{err}");
    assert_eq!(dsp["offloaded_weights"], dsp["matrix_weights"]);
    assert_eq!(dsp["generated"], cpu["generated"], "the first 8 tokens of this prompt have no near-tie");
    let b = &dsp["memory_breakdown"][0];
    assert_eq!(b["device"], "hexagon-sim0");
    assert!(b["model"].as_u64().unwrap() > 4 << 20, "repacked weights on the DSP: {b}");
    assert_eq!(b["total"].as_u64().unwrap(), b["free"].as_u64().unwrap() + b["self"].as_u64().unwrap());
    // The default mode: the whole forward pass (embedding, the 4 layers, final norm,
    // output projection) on the DSP as one batch per token.
    assert!(dsp["device_batches_per_token"].as_f64().unwrap() == 1.0, "{}", dsp["device_batches_per_token"]);
    assert!(err.contains("runs 29 of 29 matrix products") && err.contains("runs 4 whole layers") && err.contains("runs the whole forward pass"), "{err}");
    assert_eq!(dsp["device_forward"], true);
    assert_eq!((dsp["offload_mode"].as_str(), dsp["device_layers"].as_u64()), (Some("layers"), Some(4)));
    assert!(b["context"].as_u64().unwrap() > 0, "the KV cache is on the DSP: {b}");
    // Matmul mode: one batch per product, the KV cache on the CPU.
    let (mm, err) = keel_run(&[&base[..], &["--device", "hexagon-sim", "--offload-mode", "matmul"]].concat());
    assert!(mm["device_batches_per_token"].as_f64().unwrap() == 29.0, "{}", mm["device_batches_per_token"]);
    assert_eq!((mm["offload_mode"].as_str(), mm["device_layers"].as_u64()), (Some("matmul"), Some(0)));
    assert_eq!(mm["memory_breakdown"][0]["context"], 0);
    assert_eq!(mm["device_forward"], false);
    assert!(err.contains("--offload-mode matmul"), "{err}");
    assert_eq!(mm["generated"], cpu["generated"]);
    // A policy that excludes the file's types: nothing placed, said loudly.
    let (none, err) = keel_run(&[&base[..], &["--device", "hexagon-sim", "--offload-types", "q4_k"]].concat());
    assert_eq!(none["offloaded_weights"], 0);
    assert!(none["placement_warning"].as_str().unwrap().contains("nothing was placed"));
    assert!(err.contains("WARNING") && err.contains("NOTHING was placed"), "{err}");
    assert_eq!(none["generated"], cpu["generated"]);
    // Only the first layer and no output projection.
    let (part, err) = keel_run(&[&base[..], &["--device", "hexagon-sim", "-ngl", "1", "--offload-output", "off"]].concat());
    assert_eq!(part["offloaded_weights"], 7, "{err}");
    assert_eq!((part["device_layers"].as_u64(), &part["device_forward"]), (Some(1), &serde_json::json!(false)), "{err}");
    assert!(part["device_batches_per_token"].as_f64().unwrap() == 1.0, "layer 0 as one batch: {}", part["device_batches_per_token"]);
    assert_eq!(part["generated"], cpu["generated"]);
    // Every layer whole but the output projection on the CPU: the layers as one batch,
    // embedding, final norm and output projection on the CPU.
    let (no_out, err) = keel_run(&[&base[..], &["--device", "hexagon-sim", "--offload-output", "off"]].concat());
    assert_eq!((no_out["device_layers"].as_u64(), &no_out["device_forward"]), (Some(4), &serde_json::json!(false)), "{err}");
    assert!(err.contains("the output projection is not on the layers' device"), "{err}");
    assert!(no_out["device_batches_per_token"].as_f64().unwrap() == 1.0, "{}", no_out["device_batches_per_token"]);
    assert_eq!(no_out["generated"], cpu["generated"]);
    // A budget that fits half: two device sessions share the weights.
    let (two, err) = keel_run(&[&base[..], &["--device", "hexagon-sim,hexagon-sim", "--device-mem", "2,1000"]].concat());
    let (a, b) = (&two["memory_breakdown"][0], &two["memory_breakdown"][1]);
    assert!(a["weights"].as_u64().unwrap() > 0 && b["weights"].as_u64().unwrap() > 0, "{err}");
    assert_eq!(two["offloaded_weights"], two["matrix_weights"]);
    assert_eq!(two["generated"], dsp["generated"]);
}

/// The end-to-end accuracy cost of converting SmolLM2 Q4_K_M's K-quant and Q5_0 matrices
/// to Q8_0 on the DSP: DSP logits vs the CPU's on the file's original types, 8 positions
/// of one prompt, teacher-forced. Measured: top-1 8/8, max |Δlogit| 3.2 with the DSP's
/// earlier block-sequential Q8_0 order, 3.27 since (the conversion error dominates); ~50 s
/// under QEMU.
#[test]
fn smollm2_q4_k_m_conversion_cost_end_to_end() {
    let Some(cfg) = sim::config("smollm2_q4_k_m_conversion_cost_end_to_end") else { return };
    let Some(model) = smollm2("Q4_K_M") else { return };
    let dir = root().join("tests/golden/smollm2-135m-requant/Q8_0.greedy.jsonl");
    let st = compare(&cfg, &model, &dir, Some(8), 1, OffloadMode::MatMul);
    eprintln!("SmolLM2 Q4_K_M on the DSP (converted) vs CPU (original): top-1 {}/{}, max |Δlogit| {:.3e}", st.top1_agree, st.positions, st.max_dlogit);
    assert!(st.top1_agree * 4 >= st.positions * 3, "top-1 {}/{}", st.top1_agree, st.positions);
}

/// A device that hangs on a whole-layer batch ends the request with the device's error
/// (which device, what happened); nothing is recomputed on the CPU, and the sequence
/// cannot continue.
#[test]
fn a_hung_device_mid_layer_batch_stops_the_request() {
    let Some(cfg) = sim::faulty("a_hung_device_mid_layer_batch_stops_the_request", "hang-on-batch") else { return };
    let m = root().join("tests/golden/synth/synth-llama-q8_0.gguf");
    let opened = open(m.to_str().unwrap()).unwrap();
    let g = opened.gguf().unwrap();
    let opts = RunOptions { n_ctx: 64, n_batch: 16, n_outputs: 1, threads: 1, reference: false, force_ctx: false };
    let mut l = prepare(&g, &opened.path, &opts).unwrap();
    let (mut e, pool) = engine(&g, &opened.path, &mut l, false, Default::default()).unwrap();
    let mut devices = Devices::open(&["hexagon-sim".to_string()], &cfg).unwrap();
    let mut slots = vec![Decision::EMPTY; weight_count(&e.model)];
    let placement = devices.plan(&e.model, &policy(OffloadMode::Layers), opts.n_ctx, &mut slots).unwrap();
    devices.load(&e.model, &placement, &e.session.kernels()).unwrap();
    assert_eq!(placement.layer_device(0), Some(0));
    let mut exec = Exec { placement: &placement, offload: &mut devices };
    let r = e.eval_on(&[1, 2, 3], Outputs::Last, pool, Some(&mut exec)).map(|_| ());
    assert_eq!(r, Err(keel_core::Error::Device { device: 0 }));
    let err = devices.error.take().expect("the device's error is kept");
    let text = err.to_string();
    assert!(text.contains("hexagon-sim") && text.contains("batch"), "{text}");
    assert_eq!(devices.batches(), 1, "the first layer batch hung; nothing more was sent");
}

/// The DSP's embedding lookup (`GetRows` of the token embedding in its file type,
/// dequantized on the device) gives the CPU's rows bit for bit, for every token of the
/// synthetic models' vocabularies (their embeddings are Q4_0), and for the same table
/// converted to Q8_0, IQ4_NL, F16 and F32.
#[test]
fn the_dsp_embedding_rows_equal_the_cpus_bit_for_bit() {
    use keel_core::ggml_type::GgmlType;
    use keel_npu_hal::device::{BatchStatus, Queue, SharedBuffers};
    use keel_npu_hal::op::{Batch, BufferRef, DType, OpDesc, OpKind, TensorDesc};
    let Some(cfg) = sim::config("the_dsp_embedding_rows_equal_the_cpus_bit_for_bit") else { return };
    let mut dev = keel_host_linux::device::HexagonSim::open(&cfg).unwrap();
    for name in ["synth-llama-q8_0", "synth-llama-q4_0"] {
        let m = root().join(format!("tests/golden/synth/{name}.gguf"));
        let opened = open(m.to_str().unwrap()).unwrap();
        let g = opened.gguf().unwrap();
        let opts = RunOptions { n_ctx: 16, n_batch: 1, n_outputs: 1, threads: 1, reference: false, force_ctx: false };
        let mut l = prepare(&g, &opened.path, &opts).unwrap();
        let (e, _) = engine(&g, &opened.path, &mut l, false, Default::default()).unwrap();
        let kern = e.session.kernels();
        let t = e.model.tok_embd;
        let (rows, cols) = (t.rows, t.cols);
        for ty in [t.ty, GgmlType::Q8_0, GgmlType::IQ4_NL, GgmlType::F16, GgmlType::F32] {
            let data = if ty == t.ty { t.data.to_vec() } else { convert(&kern, &t, ty) };
            let row_bytes = data.len() / rows;
            let dtype = keel_host_linux::device::offload::hal_row_dtype(ty).unwrap();
            let table = dev.alloc(data.len() as u64).unwrap();
            dev.host_view(table).unwrap()[..data.len()].copy_from_slice(&data);
            let ids = dev.alloc(4 * rows as u64).unwrap();
            for (i, c) in dev.host_view(ids).unwrap().chunks_exact_mut(4).take(rows).enumerate() {
                c.copy_from_slice(&(i as i32).to_le_bytes());
            }
            let out = dev.alloc(4 * (rows * cols) as u64).unwrap();
            for b in [table, ids, out] {
                dev.map(b).unwrap();
            }
            let sizes: Vec<u64> = [table, ids, out].iter().map(|&b| dev.host_view(b).unwrap().len() as u64).collect();
            let buffers = [BufferRef { id: table, size: sizes[0] }, BufferRef { id: ids, size: sizes[1] }, BufferRef { id: out, size: sizes[2] }];
            let tensors = [
                TensorDesc::contiguous(dtype, [cols as u32, rows as u32, 1, 1], 0, 0).unwrap(),
                TensorDesc::contiguous(DType::I32, [rows as u32, 1, 1, 1], 1, 0).unwrap(),
                TensorDesc::contiguous(DType::F32, [cols as u32, rows as u32, 1, 1], 2, 0).unwrap(),
            ];
            let ops = [OpDesc { kind: OpKind::GetRows, src: [Some(0), Some(1), None], dst: 2 }];
            let seq = dev.submit(&Batch { buffers: &buffers, tensors: &tensors, ops: &ops }).unwrap();
            assert_eq!(dev.wait(seq).unwrap(), BatchStatus::Done);
            let got = dev.host_view(out).unwrap().to_vec();
            let mut want = vec![0f32; cols];
            for r in 0..rows {
                kern.dequantize_row(ty, &data[r * row_bytes..(r + 1) * row_bytes], &mut want).unwrap();
                for (j, (&w, c)) in want.iter().zip(got[4 * r * cols..].chunks_exact(4)).enumerate() {
                    let d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    assert_eq!(d.to_bits(), w.to_bits(), "{name} ({ty}): token {r} element {j}: DSP {d}, CPU {w}");
                }
            }
            for b in [table, ids, out] {
                dev.free(b).unwrap();
            }
            eprintln!("{name}: {rows} embedding rows of {cols} as {ty} equal bit for bit");
        }
    }
}

/// `keel plan --placement --device hexagon-sim`: "where does op X of layer L run" for
/// every op of every block. Every synthetic model's layers run whole on the DSP (every op
/// there); with `--offload-mode matmul` the products go to the DSP one by one and every
/// other op stays on the CPU, with the reason.
#[test]
fn plan_placement_lists_each_op_and_where_it_runs_on_hexagon_sim() {
    let Some(_) = sim::config("plan_placement_lists_each_op_and_where_it_runs_on_hexagon_sim") else { return };
    let plan = |model: &str, extra: &[&str]| -> serde_json::Value {
        let m = root().join(format!("tests/golden/synth/{model}.gguf"));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_keel")).args(["plan", "-m"]).arg(&m).args(["--placement", "--device", "hexagon-sim", "--json"]).args(extra).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    for model in ["synth-llama-q8_0", "synth-qwen2-q8_0", "synth-qwen3-q8_0", "synth-gemma3-q8_0"] {
        let j = plan(model, &[]);
        assert_eq!(j["devices"][0], "hexagon-sim0");
        for l in j["layers"].as_array().unwrap() {
            assert_eq!(l["whole_on"], "hexagon-sim0", "{model}: {l}");
            assert!(l["ops"].as_array().unwrap().iter().all(|o| o["where"] == "hexagon-sim0" && o["why"].is_null()), "{model}: {l}");
        }
        assert_eq!(j["output"]["whole_forward_on"], "hexagon-sim0", "{model}");
    }
    let j = plan("synth-qwen35-q8_0", &["--offload-mode", "matmul"]);
    for l in j["layers"].as_array().unwrap() {
        assert!(l["whole_on"].is_null());
        for o in l["ops"].as_array().unwrap() {
            if o["op"] == "matmul" {
                assert_eq!(o["where"], "hexagon-sim0", "{o}");
            } else {
                assert_eq!(o["where"], "cpu", "{o}");
                assert!(o["why"].as_str().is_some_and(|w| !w.is_empty()), "{o}");
            }
        }
    }
}

/// `t`'s rows converted to `to` as a device that lacks `t`'s type holds them (the engine's
/// own conversion).
fn convert(kern: &keel_core::quant::Kernels, t: &keel_core::model::Tensor<'_>, to: keel_core::ggml_type::GgmlType) -> Vec<u8> {
    let mut out = vec![0u8; to.row_bytes(t.cols as u64).unwrap() as usize * t.rows];
    let mut row = vec![0f32; t.cols];
    keel_host_linux::device::offload::convert_rows(kern, t.ty, t.data, to, &mut row, &mut out).unwrap();
    out
}

//! A second implementation of keel's NPU HAL, used only here: a CPU-backed fake device.
//! Its buffers are heap memory and its batches run, at submit, through keel-core's batch
//! executor (`keel_core::exec`, the one the Hexagon firmware runs); its completions are
//! queued for `poll`. Nothing outside this file knows it exists: keel-core's device
//! engine plans, loads and runs every synthetic model's whole forward pass on it exactly
//! as it does on hexagon-sim, and the logits must equal the CPU's bit for bit (4 prompts
//! × 32 teacher-forced steps each, one device batch per token).

use std::collections::VecDeque;

use keel_core::device::engine::{LayerSlot, LoadScratch};
use keel_core::device::{DeviceEngine, Engines};
use keel_core::exec::{self, Buffers, Scratch};
use keel_core::placement::{weight_count, Decision, DeviceInfo, Exec, OffloadMode, Placement, Policy, Where};
use keel_core::session::Outputs;
use keel_host_linux::cli::load::{engine, open, prepare, RunOptions};
use keel_npu_hal::caps::{Arch, Caps, DTypeSet, Identity, MemoryLimits, UnitState, Units};
use keel_npu_hal::device::{BatchStatus, Completion, Device, Queue, Seq, SharedBuffers};
use keel_npu_hal::error::{Error, ErrorKind, ErrorType};
use keel_npu_hal::op::{Batch, DType};
use keel_npu_hal::wait::WaitPolicy;
use keel_npu_hal::{BufferId, BufferRules};

/// A HAL error: just its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FakeError(ErrorKind);

impl Error for FakeError {
    fn kind(&self) -> ErrorKind {
        self.0
    }
}

/// One shared buffer: heap bytes, the usable part starting on the device's alignment.
struct Buf {
    mem: Vec<u8>,
    start: usize,
    len: usize,
    mapped: bool,
}

/// The fake device: the CPU, its memory, and a queue of completions.
struct Fake {
    identity: Identity,
    caps: Caps,
    bufs: Vec<Option<Buf>>,
    done: VecDeque<Completion>,
    next: Seq,
    scratch: Vec<u8>,
    /// The batch with this sequence number fails (op 0, `Other`) without running.
    fail: Option<Seq>,
}

const ALIGN: u32 = 4096;

impl Fake {
    fn new() -> Fake {
        let rules = BufferRules { align: ALIGN, granule: ALIGN, max_size: 256 << 20 };
        Fake {
            identity: Identity { arch: Arch::Software, firmware_version: 1, protocol_version: keel_npu_hal::wire::PROTOCOL_VERSION, emulated: true },
            caps: Caps {
                units: Units { hvx_contexts: 0, hvx: UnitState::Absent, hmx: UnitState::Absent, npu_cores: 1, npu: UnitState::Verified },
                memory: MemoryLimits { va_budget: 1 << 30, scratch_bytes: 1 << 20, buffers: rules },
                ops: exec::op_set(),
                matmul_weights: DTypeSet::default().with(DType::Q8_0).with(DType::Q4_0).with(DType::IQ4NL),
                max_in_flight: 4,
                max_batch_ops: keel_npu_hal::wire::MAX_OPS as u16,
            },
            bufs: Vec::new(),
            done: VecDeque::new(),
            next: 0,
            scratch: vec![0u8; (1 << 20) + exec::ALIGN],
            fail: None,
        }
    }

    fn buf(&mut self, id: BufferId) -> Result<&mut Buf, FakeError> {
        self.bufs.get_mut(id.0 as usize).and_then(Option::as_mut).ok_or(FakeError(ErrorKind::InvalidArgument))
    }
}

impl ErrorType for Fake {
    type Error = FakeError;
}

impl Device for Fake {
    fn identity(&self) -> &Identity {
        &self.identity
    }
    fn caps(&self) -> &Caps {
        &self.caps
    }
}

impl SharedBuffers for Fake {
    fn alloc(&mut self, size: u64) -> Result<BufferId, FakeError> {
        let len = self.buffer_rules().rounded_size(size).map_err(FakeError)? as usize;
        let mem = vec![0u8; len + ALIGN as usize];
        let start = mem.as_ptr().align_offset(ALIGN as usize);
        self.bufs.push(Some(Buf { mem, start, len, mapped: false }));
        Ok(BufferId(self.bufs.len() as u32 - 1))
    }
    fn map(&mut self, id: BufferId) -> Result<(), FakeError> {
        self.buf(id)?.mapped = true;
        Ok(())
    }
    fn host_view(&mut self, id: BufferId) -> Result<&mut [u8], FakeError> {
        let b = self.buf(id)?;
        Ok(&mut b.mem[b.start..b.start + b.len])
    }
    fn free(&mut self, id: BufferId) -> Result<(), FakeError> {
        self.buf(id)?;
        self.bufs[id.0 as usize] = None;
        Ok(())
    }
}

/// The mapped buffers' memory, for the executor.
struct Mapped(Vec<Option<(*mut u8, usize)>>);

// SAFETY: every pointer comes from a `&mut` borrow of a live buffer's bytes, held for
// as long as the batch runs (`submit` keeps `self.bufs` borrowed mutably throughout),
// and nothing else reads or writes those bytes meanwhile; the executor's scratch is a
// separate allocation.
unsafe impl Buffers for Mapped {
    fn get(&self, id: BufferId) -> Option<(*mut u8, usize)> {
        self.0.get(id.0 as usize).copied().flatten()
    }
}

impl Queue for Fake {
    fn submit(&mut self, batch: &Batch<'_>) -> Result<Seq, FakeError> {
        if self.done.len() >= usize::from(self.caps.max_in_flight) {
            return Err(FakeError(ErrorKind::Busy));
        }
        let seq = self.next;
        let mapped = Mapped(self.bufs.iter_mut().map(|b| b.as_mut().filter(|b| b.mapped).map(|b| (b.mem[b.start..].as_mut_ptr(), b.len))).collect());
        let status: BatchStatus = if self.fail == Some(seq) {
            BatchStatus::Failed { op: 0, kind: ErrorKind::Other }
        } else {
            exec::run_batch(batch, &mapped, &self.caps, &mut Scratch::new(&mut self.scratch))
        };
        self.next = self.next.wrapping_add(1);
        self.done.push_back(Completion { seq, status });
        Ok(seq)
    }
    fn poll(&mut self) -> Result<Option<Completion>, FakeError> {
        Ok(self.done.pop_front())
    }
}

/// No time passes on the CPU between polls: every batch completes at submit.
struct NoDelay;

impl embedded_hal::delay::DelayNs for NoDelay {
    fn delay_ns(&mut self, _ns: u32) {}
}

/// The model the CPU and the fake both run: the synthetic file, or for Qwen 3.5 (whose
/// F32 beta/alpha projections a device holds converted to Q8_0) its `keel quantize`d
/// Q8_0 copy, so that both sides compute with the same weights.
fn model_file(name: &str) -> std::path::PathBuf {
    let file = keel_test_support::golden_path(&format!("synth/{name}.gguf"));
    if !name.contains("qwen35") {
        return file;
    }
    keel_test_support::requantized(std::path::Path::new(env!("CARGO_BIN_EXE_keel")), &file, "Q8_0", &std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fake-device"))
}

/// Runs `f` on the synthetic llama Q8_0 loaded with `opts` (its engine and thread pool).
fn with_synth_llama<T>(opts: &RunOptions, f: impl FnOnce(&mut keel_core::engine::Engine<'_>, &keel_host_linux::pool::ThreadPool) -> T) -> T {
    let model = model_file("synth-llama-q8_0");
    let opened = open(model.to_str().unwrap()).unwrap();
    let g = opened.gguf().unwrap();
    let mut loaded = prepare(&g, &opened.path, opts).unwrap();
    let sampling = keel_core::sampler::SamplerConfig { temp: 0.0, ..Default::default() };
    let (mut e, pool) = engine(&g, &opened.path, &mut loaded, false, sampling).unwrap();
    f(&mut e, pool)
}

/// Fake engines `0..n`, each waiting without delay, with a layer table for `n_layer` layers.
fn fakes(n: usize, n_layer: usize) -> Vec<DeviceEngine<Fake, NoDelay, Vec<LayerSlot>>> {
    let policy = WaitPolicy { timeout_us: 1_000_000, poll_us: 1 };
    (0..n).map(|i| DeviceEngine::new(Fake::new(), i as u8, NoDelay, policy, vec![LayerSlot::EMPTY; n_layer])).collect()
}

/// Runs `name`'s whole forward pass on the fake device through keel-core's engine and
/// on the CPU, teacher-forced with the CPU's greedy tokens: 4 prompts × 32 steps, one
/// device batch per token, logits equal bit for bit.
fn whole_forward_on_the_fake(name: &str) {
    let model = model_file(name);
    let opened = open(model.to_str().unwrap()).unwrap();
    let g = opened.gguf().unwrap();
    let opts = RunOptions { n_ctx: 128, n_batch: 32, n_outputs: 1, threads: 1, reference: false, force_ctx: false };
    let (mut l_cpu, mut l_dev) = (prepare(&g, &opened.path, &opts).unwrap(), prepare(&g, &opened.path, &opts).unwrap());
    let sampling = keel_core::sampler::SamplerConfig { temp: 0.0, ..Default::default() };
    let (mut cpu, pool) = engine(&g, &opened.path, &mut l_cpu, false, sampling).unwrap();
    let (mut dev, _) = engine(&g, &opened.path, &mut l_dev, false, sampling).unwrap();

    let policy = WaitPolicy { timeout_us: 1_000_000, poll_us: 1 };
    let mut engines = [DeviceEngine::new(Fake::new(), 0, NoDelay, policy, vec![LayerSlot::EMPTY; dev.model.layers.len()])];
    let mut decisions = vec![Decision::EMPTY; weight_count(&dev.model)];
    let mut p = Policy::all(1);
    p.mode = OffloadMode::Layers;
    p.kv_ctx = opts.n_ctx;
    let infos: [&dyn DeviceInfo; 1] = [&engines[0]];
    let placement = Placement::plan(&dev.model, &p, &infos, &mut decisions).unwrap();
    assert!(placement.decisions().iter().all(|d| d.place == Where::Device(0)), "{name}: every product on the fake");
    assert!((0..dev.model.layers.len()).all(|l| placement.layer_device(l) == Some(0)), "{name}: every layer whole on the fake");
    assert_eq!(placement.forward_device(1), Some(0), "{name}: the whole forward pass on the fake");
    let (floats, bytes) = engines[0].load_scratch(&placement);
    let (mut row, mut group) = (vec![0f32; floats], vec![0u8; bytes]);
    engines[0].load(&dev.model, &placement, &dev.session.kernels(), &mut LoadScratch { row: &mut row, group: &mut group }).unwrap();
    assert!(engines[0].stats.context_bytes > 0 && engines[0].stats.model_bytes > 0, "{name}: {:?}", engines[0].stats);

    let nv = cpu.n_vocab();
    let mut positions = 0;
    for (prompt, _) in keel_test_support::greedy_prompts(&format!("synth/{name}.greedy.jsonl")).into_iter().take(4) {
        cpu.reset();
        dev.reset();
        let mut input = prompt;
        for step in 0..32 {
            let c = cpu.eval(&input, Outputs::Last, pool).unwrap().to_vec();
            let before = engines[0].stats.batches;
            let mut offload = Engines(&mut engines[..]);
            let mut exec = Exec { placement: &placement, offload: &mut offload };
            let r = dev.eval_on(&input, Outputs::Last, pool, Some(&mut exec));
            assert!(r.is_ok(), "{name} step {step}: {r:?}: {:?}", engines[0].error);
            if step > 0 {
                assert_eq!(engines[0].stats.batches - before, 1, "{name} step {step}: one device batch per generated token");
            }
            let d = dev.session.last_logits(nv);
            let c = &c[c.len() - nv..];
            let same = c.iter().zip(d).all(|(x, y)| x.to_bits() == y.to_bits());
            let worst = c.iter().zip(d).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(same, "{name} step {step}: the fake's logits differ from the CPU's (max |Δ| {worst})");
            let best = keel_test_support::top_two(c).0;
            input = vec![best as u32];
            positions += 1;
        }
    }
    assert_eq!(positions, 4 * 32, "{name}: 4 prompts × 32 steps");
    eprintln!("{name}: {positions} positions on the fake device, logits equal to the CPU's; {:?}", engines[0].stats);
}

#[test]
fn synth_llama_q8_0_runs_whole_on_the_fake_device() {
    whole_forward_on_the_fake("synth-llama-q8_0");
}

#[test]
fn synth_llama_q4_0_runs_whole_on_the_fake_device() {
    whole_forward_on_the_fake("synth-llama-q4_0");
}

#[test]
fn synth_qwen2_runs_whole_on_the_fake_device() {
    whole_forward_on_the_fake("synth-qwen2-q8_0");
}

#[test]
fn synth_qwen3_runs_whole_on_the_fake_device() {
    whole_forward_on_the_fake("synth-qwen3-q8_0");
}

#[test]
fn synth_gemma3_runs_whole_on_the_fake_device() {
    whole_forward_on_the_fake("synth-gemma3-q8_0");
}

#[test]
fn synth_qwen35_runs_whole_on_the_fake_device() {
    whole_forward_on_the_fake("synth-qwen35-q8_0");
}

/// What one pipelined run on the fake gave: the logits of every evaluation, the batches
/// submitted, and the first failure's text.
struct Pipelined {
    logits: Vec<Vec<u32>>,
    batches: u64,
    depth: usize,
    error: Option<String>,
}

/// The synthetic llama's whole forward pass on the fake with up to `in_flight` batches in
/// flight and 1 MiB of batch work (a 20-token prompt in chunks of 6 tokens, one layer per
/// prompt batch, each token's logits in a batch of their own), prompt then 8 greedy
/// steps; the batch with sequence number `fail` fails.
fn pipelined(in_flight: u8, fail: Option<Seq>) -> Pipelined {
    let opts = RunOptions { n_ctx: 64, n_batch: 32, n_outputs: 1, threads: 1, reference: false, force_ctx: false };
    with_synth_llama(&opts, |dev, pool| pipelined_on(dev, pool, opts, in_flight, fail))
}

fn pipelined_on(dev: &mut keel_core::engine::Engine<'_>, pool: &keel_host_linux::pool::ThreadPool, opts: RunOptions, in_flight: u8, fail: Option<Seq>) -> Pipelined {
    let mut engines = fakes(1, dev.model.layers.len());
    engines[0].in_flight = in_flight;
    engines[0].batch_work = 1 << 20;
    engines[0].dev.fail = fail;
    let mut decisions = vec![Decision::EMPTY; weight_count(&dev.model)];
    let mut p = Policy::all(1);
    p.kv_ctx = opts.n_ctx;
    let infos: [&dyn DeviceInfo; 1] = [&engines[0]];
    let placement = Placement::plan(&dev.model, &p, &infos, &mut decisions).unwrap();
    assert_eq!(placement.forward_device(1), Some(0), "the whole forward pass on the fake");
    let (floats, bytes) = engines[0].load_scratch(&placement);
    let (mut row, mut group) = (vec![0f32; floats], vec![0u8; bytes]);
    engines[0].load(&dev.model, &placement, &dev.session.kernels(), &mut LoadScratch { row: &mut row, group: &mut group }).unwrap();
    let nv = dev.n_vocab();
    let mut input: Vec<u32> = (0..20u32).map(|i| 3 + i * 97).collect();
    let mut out = Pipelined { logits: Vec::new(), batches: 0, depth: engines[0].depth(), error: None };
    for _ in 0..9 {
        let mut offload = Engines(&mut engines[..]);
        let mut exec = Exec { placement: &placement, offload: &mut offload };
        if dev.eval_on(&input, Outputs::Last, pool, Some(&mut exec)).is_err() {
            break;
        }
        let d = dev.session.last_logits(nv);
        out.logits.push(d.iter().map(|x| x.to_bits()).collect());
        input = vec![keel_test_support::top_two(d).0 as u32];
    }
    assert_eq!(engines[0].batches_in_flight(), 0, "nothing is left in flight after a call, failed or not");
    out.batches = engines[0].stats.batches;
    out.error = engines[0].error.as_ref().map(|e| e.to_string());
    if out.error.is_some() {
        // Later calls are refused at once (nothing waits for the failed session).
        let mut offload = Engines(&mut engines[..]);
        let mut exec = Exec { placement: &placement, offload: &mut offload };
        assert!(dev.eval_on(&[5], Outputs::Last, pool, Some(&mut exec)).is_err(), "a failed device takes no more work");
    }
    out
}

/// Several batches in flight (the prompt's chunks alternating between two work buffers,
/// each chunk's layer batches back to back) give the same logits bit for bit as one at a
/// time, with the same batches.
#[test]
fn batches_in_flight_give_the_bits_of_one_at_a_time() {
    let one = pipelined(1, None);
    let four = pipelined(4, None);
    assert_eq!((one.depth, four.depth), (1, 4));
    assert_eq!(one.logits.len(), 9, "{:?}", one.error);
    assert!(one.batches >= 9 * 2 + 4 * 3, "several batches per pass: {}", one.batches);
    assert_eq!(one.batches, four.batches, "the same batches");
    eprintln!("{} evaluations, {} batches, logits equal with 1 and 4 in flight", one.logits.len(), one.batches);
    for (i, (a, b)) in one.logits.iter().zip(&four.logits).enumerate() {
        assert!(a == b, "evaluation {i}: logits with 4 batches in flight differ from one at a time");
    }
}

/// A batch that fails while later ones are in flight ends the call with an error naming
/// it (whole layers, tokens, position); the later ones are collected, none is left in
/// flight, and the device takes no more work.
#[test]
fn a_failed_batch_among_several_in_flight_is_named_and_nothing_is_left_in_flight() {
    let r = pipelined(4, Some(1));
    let e = r.error.expect("the failure is kept");
    eprintln!("{e} ({} batches submitted)", r.batches);
    assert!(e.contains("whole layers 1..=1") && e.contains("for 6 tokens at position 0") && e.contains("Failed"), "{e}");
    assert!(r.logits.is_empty());
    assert!(r.batches >= 2, "the batches after it were in flight too: {}", r.batches);
}

/// What one run of a split placement gave: every prompt row's logits then each greedy
/// step's, the passes pipelined, and the first failure's text.
struct Split {
    logits: Vec<Vec<u32>>,
    begun: u64,
    error: Option<String>,
}

/// The synthetic llama split in two stages, its 20-token prompt in chunks of 4 tokens
/// (logits for every row) then 8 greedy steps: with `two_devices`, layers 0..2 whole on
/// fake 0 and layers 2..4 with the output projection on fake 1 (`--tensor-split 1,1`);
/// otherwise layers 0..2 whole on fake 0 and the other layers and the output on the CPU.
/// Each fake keeps up to `in_flight` batches in flight; fake 0's batch `fail` fails.
/// [`split_run`]'s and [`split_cpu`]'s run limits: the prompt in chunks of 4, every row's logits.
const SPLIT_OPTS: RunOptions = RunOptions { n_ctx: 64, n_batch: 4, n_outputs: 20, threads: 1, reference: false, force_ctx: false };

fn split_run(two_devices: bool, in_flight: u8, fail: Option<Seq>) -> Split {
    with_synth_llama(&SPLIT_OPTS, |dev, pool| split_run_on(dev, pool, two_devices, in_flight, fail))
}

fn split_run_on(dev: &mut keel_core::engine::Engine<'_>, pool: &keel_host_linux::pool::ThreadPool, two_devices: bool, in_flight: u8, fail: Option<Seq>) -> Split {
    let opts = SPLIT_OPTS;
    let n_dev = if two_devices { 2 } else { 1 };
    let mut engines = fakes(n_dev, dev.model.layers.len());
    for e in &mut engines {
        e.in_flight = in_flight;
    }
    engines[0].dev.fail = fail;
    let mut decisions = vec![Decision::EMPTY; weight_count(&dev.model)];
    let mut p = Policy::all(n_dev);
    p.kv_ctx = opts.n_ctx;
    if two_devices {
        p.split[..2].copy_from_slice(&[1, 1]);
    } else {
        p.max_layers = 2;
        p.output = false;
    }
    let infos: Vec<&dyn DeviceInfo> = engines.iter().map(|e| e as &dyn DeviceInfo).collect();
    let placement = Placement::plan(&dev.model, &p, &infos, &mut decisions).unwrap();
    let layer_devs: Vec<_> = (0..4).map(|l| placement.layer_device(l)).collect();
    let want = if two_devices { [Some(0), Some(0), Some(1), Some(1)] } else { [Some(0), Some(0), None, None] };
    assert_eq!(layer_devs, want, "the layers' stages");
    for e in &mut engines {
        let (floats, bytes) = e.load_scratch(&placement);
        let (mut row, mut group) = (vec![0f32; floats], vec![0u8; bytes]);
        e.load(&dev.model, &placement, &dev.session.kernels(), &mut LoadScratch { row: &mut row, group: &mut group }).unwrap();
    }
    let nv = dev.n_vocab();
    let mut input: Vec<u32> = (0..20u32).map(|i| 3 + i * 97).collect();
    let mut out = Split { logits: Vec::new(), begun: 0, error: None };
    for step in 0..9 {
        let mut offload = Engines(&mut engines[..]);
        let mut exec = Exec { placement: &placement, offload: &mut offload };
        let outputs = if step == 0 { Outputs::All } else { Outputs::Last };
        if dev.eval_on(&input, outputs, pool, Some(&mut exec)).is_err() {
            break;
        }
        out.logits.extend(dev.session.logits(nv).chunks(nv).map(|r| r.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()));
        input = vec![keel_test_support::top_two(dev.session.last_logits(nv)).0 as u32];
    }
    for (i, e) in engines.iter().enumerate() {
        assert_eq!(e.batches_in_flight(), 0, "fake {i}: nothing is left in flight after an evaluation, failed or not");
    }
    out.begun = engines.iter().map(|e| e.stats.begun).sum();
    out.error = engines.iter().find_map(|e| e.error.as_ref().map(|e| e.to_string()));
    out
}

/// The CPU's logits for [`split_run`]'s evaluations.
fn split_cpu() -> Vec<Vec<u32>> {
    with_synth_llama(&SPLIT_OPTS, |cpu, pool| {
        let nv = cpu.n_vocab();
        let mut input: Vec<u32> = (0..20u32).map(|i| 3 + i * 97).collect();
        let mut out = Vec::new();
        for step in 0..9 {
            let outputs = if step == 0 { Outputs::All } else { Outputs::Last };
            let l = cpu.eval(&input, outputs, pool).unwrap();
            out.extend(l.chunks(nv).map(|r| r.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()));
            input = vec![keel_test_support::top_two(&out[out.len() - 1].iter().map(|&b| f32::from_bits(b)).collect::<Vec<_>>()).0 as u32];
        }
        out
    })
}

/// Prompt chunks as a pipeline: a split placement's first stage (fake 0's layers) runs
/// the next chunk while the later stages (fake 1's layers and output projection, or the
/// CPU's layers and output projection) run this one. Every prompt row's logits and every
/// greedy step's equal the CPU's and those of one batch in flight (no pipeline) bit for
/// bit, and the pipeline ran (passes begun) only with two in flight.
#[test]
fn pipelined_prompt_chunks_over_a_split_give_the_bits_of_the_cpu() {
    let cpu = split_cpu();
    assert_eq!(cpu.len(), 20 + 8, "20 prompt rows and 8 steps");
    for two_devices in [true, false] {
        let what = if two_devices { "fake 0 + fake 1" } else { "fake 0 + the CPU" };
        let one = split_run(two_devices, 1, None);
        let two = split_run(two_devices, 2, None);
        assert_eq!((one.error.as_deref(), two.error.as_deref()), (None, None), "{what}");
        assert_eq!(one.begun, 0, "{what}: one in flight never pipelines");
        assert_eq!(two.begun, 4, "{what}: chunks 2..=5 of the prompt begun while the chunk before ran its later stages");
        assert_eq!(one.logits.len(), cpu.len(), "{what}");
        for (i, ((a, b), c)) in one.logits.iter().zip(&two.logits).zip(&cpu).enumerate() {
            assert!(a == c, "{what}: row {i} with one in flight differs from the CPU's");
            assert!(b == c, "{what}: row {i} pipelined differs from the CPU's");
        }
        eprintln!("{what}: {} logits rows equal to the CPU's, {} passes pipelined", two.logits.len(), two.begun);
    }
}

/// A batch of a pipelined chunk that fails is named (its layers, tokens and position)
/// when the session collects it; nothing is left in flight on either device.
#[test]
fn a_failed_pipelined_chunk_is_named_and_nothing_is_left_in_flight() {
    // Fake 0's batches: chunk 1 (sequence 0, run at once), chunk 2 (1, begun), ...
    let r = split_run(true, 2, Some(2));
    let e = r.error.expect("the failure is kept");
    eprintln!("{e}");
    assert!(e.contains("whole layers 0..=1") && e.contains("for 4 tokens at position 8") && e.contains("Failed"), "{e}");
    assert!(r.logits.is_empty(), "the prompt failed");
}

/// The engine's asynchronous pass: `layers_begin` leaves one chunk in flight and returns
/// (one batch at a time: refuses, nothing submitted), every other call is refused until
/// `layers_end` collects it, whose rows equal the synchronous `layers`' bit for bit, and a
/// second `layers_end` has nothing to collect.
#[test]
fn a_begun_pass_is_collected_once_and_blocks_other_calls_meanwhile() {
    let opts = RunOptions { n_ctx: 64, n_batch: 4, n_outputs: 1, threads: 1, reference: false, force_ctx: false };
    with_synth_llama(&opts, |dev, _| {
        let mut engines = fakes(1, dev.model.layers.len());
        let mut decisions = vec![Decision::EMPTY; weight_count(&dev.model)];
        let mut p = Policy::all(1);
        p.kv_ctx = opts.n_ctx;
        p.max_layers = 2;
        p.output = false;
        let infos: [&dyn DeviceInfo; 1] = [&engines[0]];
        let placement = Placement::plan(&dev.model, &p, &infos, &mut decisions).unwrap();
        let (floats, bytes) = engines[0].load_scratch(&placement);
        let (mut row, mut group) = (vec![0f32; floats], vec![0u8; bytes]);
        engines[0].load(&dev.model, &placement, &dev.session.kernels(), &mut LoadScratch { row: &mut row, group: &mut group }).unwrap();
        let e = dev.model.hp.n_embd;
        let x: Vec<f32> = (0..4 * e).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
        let mut want = x.clone();
        engines[0].layers(0..2, &mut want, 4, 0).unwrap();
        let eng = &mut engines[0];
        eng.in_flight = 1;
        assert_eq!(eng.layers_begin(0..2, &x, 4, 0), Ok(false), "one at a time: nothing begun");
        assert_eq!(eng.batches_in_flight(), 0);
        eng.in_flight = 2;
        assert_eq!(eng.layers_begin(0..2, &x, 4, 0), Ok(true));
        assert_eq!((eng.batches_in_flight(), eng.stats.begun), (1, 1), "the pass is in flight");
        let mut other = x.clone();
        assert!(eng.layers(0..2, &mut other, 4, 0).is_err() && eng.layers_begin(0..2, &x, 4, 0).is_err(), "refused while a pass is begun");
        let mut got = vec![0f32; 4 * e];
        eng.layers_end(&mut got).unwrap();
        assert_eq!(eng.batches_in_flight(), 0);
        assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "the begun pass's rows equal the synchronous pass's");
        assert!(eng.layers_end(&mut got).is_err(), "nothing left to collect");
    });
}

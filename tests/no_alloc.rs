//! Static memory: once the engine is built, generating 64 tokens performs zero heap
//! allocations in the whole process (a counting global allocator watches), on the CPU and
//! (what `keel run --device hexagon-sim` does) with the whole forward pass on the emulated
//! DSP through keel-core's device engine, and the same through the `hexagon` FastRPC device
//! and the libcdsprpc test double; and the arena `keel plan` reports is the arena
//! a run uses, and `run -c 2048 -n 64` stays under 160 MB resident.

mod common;
use common::*;
use keel::core::gguf::Gguf;
use keel::core::session::{Outputs, SessionConfig};
use keel_host_linux::mem::{allocations, CountingAllocator};
use keel_host_linux::pool::ThreadPool;

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

/// The allocation count is process-wide: tests in this binary take turns, so another
/// test's allocations (they run on parallel threads) are never counted as generation's.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn generation_allocates_nothing() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(bytes) = smollm2() else { return };
    let g = Gguf::parse(&bytes).unwrap();
    let cfg = SessionConfig { n_ctx: 256, n_batch: 64, n_outputs: 1, n_threads: 2 };
    let mut arena = arena_for(&bytes, &cfg);
    let mut e = engine(&g, &mut arena, cfg, fast_kernels());
    let pool = ThreadPool::new(2).unwrap();
    let prompt = [504u32, 3575, 282, 4649, 314];
    // Warm up once (the pool's threads are already running).
    e.eval(&prompt, Outputs::Last, &pool).unwrap();
    e.reset();

    let before = allocations();
    e.eval(&prompt, Outputs::Last, &pool).unwrap();
    let mut generated = [0u32; 64];
    for slot in generated.iter_mut() {
        let t = e.sample();
        *slot = t;
        e.eval(&[t], Outputs::Last, &pool).unwrap();
    }
    let after = allocations();
    assert_eq!(after - before, 0, "generation allocated {} times", after - before);
    assert!(generated.iter().any(|&t| t != generated[0]), "generation produced a constant stream: {generated:?}");
}

#[test]
fn generation_on_hexagon_sim_allocates_nothing() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    generation_on_device_allocates_nothing("hexagon-sim", "generation_on_hexagon_sim_allocates_nothing", false);
}

/// The same with two batches in flight and 1 MiB of batch work: a 14-token prompt in
/// chunks alternating between the two work buffers, two batches per generated token
/// (layers, then the logits) submitted back to back.
#[test]
fn generation_on_hexagon_sim_with_two_batches_in_flight_allocates_nothing() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    generation_on_device_allocates_nothing("hexagon-sim", "generation_on_hexagon_sim_with_two_batches_in_flight_allocates_nothing", true);
}

/// Two hexagon-sim sessions splitting the layers (`--tensor-split 1,1`) with two batches
/// in flight: the 14-token prompt in chunks of 4 runs as a pipeline (session 0 begins a
/// chunk while session 1 and the CPU run the one before), and nothing allocates.
#[test]
fn pipelined_prompt_on_two_hexagon_sim_sessions_allocates_nothing() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    generation_on_device_allocates_nothing("hexagon-sim,hexagon-sim", "pipelined_prompt_on_two_hexagon_sim_sessions_allocates_nothing", true);
}

/// The `hexagon` (FastRPC) device through the libcdsprpc test double (its DSP is the same
/// emulated firmware): keel's side of dspqueue_write/read, rpcmem and the engine allocate
/// nothing. The double's own internal mallocs stand for the system library's and are not
/// this process's Rust allocator, so they are not counted.
#[test]
fn generation_on_hexagon_fastrpc_allocates_nothing() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let exe = std::env::current_exe().unwrap();
    let double = exe.parent().and_then(std::path::Path::parent).unwrap().join("libcdsprpc.so");
    if !double.is_file() {
        let why = format!("{} not built (`cargo build --release -p keel-cdsprpc-double`; tests/run.sh does)", double.display());
        if std::env::var("KEEL_REQUIRE_DSP").is_ok_and(|v| v == "1") {
            panic!("KEEL_REQUIRE_DSP=1 but {why}");
        }
        return eprintln!("\n*** SKIPPED generation_on_hexagon_fastrpc_allocates_nothing: {why} ***\n");
    }
    std::env::set_var("KEEL_CDSPRPC", &double);
    generation_on_device_allocates_nothing("hexagon", "generation_on_hexagon_fastrpc_allocates_nothing", false);
}

/// The `rknpu` device over the rocket driver's recording double (calls not recorded, so
/// the double's log does not grow): every matrix product of the synthetic llama, prompt
/// and single-token steps, runs as W8A8 int32-mode jobs through create/mmap/FINI/SUBMIT/
/// PREP; after the warm-up (each weight's BOs and streams are made on its first product)
/// the device, the double and the engine allocate nothing.
#[test]
fn generation_on_rknpu_allocates_nothing() {
    use keel_host_linux::device::any::AnyDevice;
    use keel_host_linux::device::offload::{Devices, RKNPU_TIMEOUT};
    use keel_host_linux::device::rknpu::{device::Rknpu, double::RecordingNpu, w8a8::Scheme};
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (npu, log) = RecordingNpu::new();
    log.borrow_mut().record = false;
    let dev = Rknpu::new(Box::new(npu), "rknpu (recording double)", Scheme::default(), RKNPU_TIMEOUT).unwrap();
    run_on_devices(Devices::with(vec![(AnyDevice::Rknpu(dev), RKNPU_TIMEOUT, "rknpu")]), "rknpu", false, false);
    assert!(log.borrow().tasks_run > 0 && log.borrow().violation.is_none());
}

/// Generates 32 tokens with the whole forward pass on `device` and counts allocations
/// (`pipelined`: two batches in flight, several per pass).
fn generation_on_device_allocates_nothing(device: &str, test: &str, pipelined: bool) {
    use keel_host_linux::device::offload::Devices;
    use keel_host_linux::device::SimConfig;

    let cfg = SimConfig::from_env();
    if let Some(missing) = cfg.missing() {
        if std::env::var("KEEL_REQUIRE_DSP").is_ok_and(|v| v == "1") {
            panic!("KEEL_REQUIRE_DSP=1 but the emulated DSP cannot start: {missing}");
        }
        return eprintln!("\n*** SKIPPED {test}: {missing} (set KEEL_REQUIRE_DSP=1 to make this a failure) ***\n");
    }
    let list: Vec<String> = device.split(',').map(String::from).collect();
    run_on_devices(Devices::open(&list, &cfg).unwrap(), device, true, pipelined);
}

/// Generates 32 tokens of the synthetic llama with `devices` (the whole forward pass on
/// device 0 when `whole`, else every matrix product it takes, single tokens included) and
/// counts allocations after a warm-up. `pipelined`: two batches in flight and 1 MiB of
/// batch work (a 14-token prompt in chunks, two batches per generated token); with two
/// devices, the layers split between them and the prompt in chunks of 4 pipelined.
fn run_on_devices(mut devices: keel_host_linux::device::offload::Devices, device: &str, whole: bool, pipelined: bool) {
    use keel::core::placement::{weight_count, Decision, Exec, OffloadMode, Policy};
    use keel_host_linux::cli::load::{engine, open, prepare, RunOptions};
    use keel_host_linux::device::offload::Devices;
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/synth/synth-llama-q8_0.gguf");
    let opened = open(model.to_str().unwrap()).unwrap();
    let g = opened.gguf().unwrap();
    let two = devices.slots.len() == 2;
    let opts = RunOptions { n_ctx: 128, n_batch: if two { 4 } else { 16 }, n_outputs: 1, threads: 2, reference: false, force_ctx: false };
    let mut loaded = prepare(&g, &opened.path, &opts).unwrap();
    let sampling = keel::core::sampler::SamplerConfig { temp: 0.0, ..Default::default() };
    let (mut e, pool) = engine(&g, &opened.path, &mut loaded, false, sampling).unwrap();
    let mut decisions = vec![Decision::EMPTY; weight_count(&e.model)];
    let mut policy = Policy::all(devices.slots.len());
    policy.mode = if whole { OffloadMode::Layers } else { OffloadMode::MatMul };
    if two {
        policy.split[..2].copy_from_slice(&[1, 1]);
    }
    if pipelined {
        devices.set_in_flight(2);
        devices.batch_work = 1 << 20;
    }
    let placement = devices.plan(&e.model, &policy, opts.n_ctx, &mut decisions).unwrap();
    if two {
        let n = e.model.layers.len();
        assert_eq!((placement.layer_device(0), placement.layer_device(n - 1)), (Some(0), Some(1)), "the layers split between the sessions");
    } else if whole {
        assert_eq!(placement.forward_device(1), Some(0), "the whole forward pass is placed on the DSP");
    } else {
        assert!(placement.n_on_devices() > 0, "no product placed on {device}");
    }
    devices.load(&e.model, &placement, &e.session.kernels()).unwrap();
    let prompt: &[u32] = if pipelined { &[1, 17, 42, 99, 7, 300, 12, 5000, 8, 9, 77, 1234, 40000, 3] } else { &[1, 17, 42, 99, 7] };
    let generate = |e: &mut keel::core::engine::Engine<'_>, devices: &mut Devices, out: &mut [u32]| {
        e.reset();
        let mut exec = Exec { placement: &placement, offload: devices };
        e.eval_on(prompt, Outputs::Last, pool, Some(&mut exec)).unwrap();
        for slot in out.iter_mut() {
            *slot = e.sample();
            e.eval_on(&[*slot], Outputs::Last, pool, Some(&mut exec)).unwrap();
        }
    };
    // Warm up once: the first batches size what the device and the pool keep.
    generate(&mut e, &mut devices, &mut [0u32; 4]);

    let (before, batches, begun) = (allocations(), devices.batches(), devices.passes_begun());
    let mut generated = [0u32; 32];
    generate(&mut e, &mut devices, &mut generated);
    let after = allocations();
    assert_eq!(after - before, 0, "generating on {device} allocated {} times", after - before);
    assert!(devices.error.is_none(), "{:?}", devices.error);
    if two {
        assert_eq!(devices.passes_begun() - begun, 3, "chunks 2..=4 of the prompt begun on session 0 while the one before ran on");
    } else if pipelined {
        assert_eq!(devices.in_flight(), 2);
        assert!(devices.batches() - batches >= 3 + 2 * generated.len() as u64, "several device batches per evaluation");
    } else if whole {
        assert_eq!(devices.batches() - batches, 1 + generated.len() as u64, "one device batch per evaluation");
    } else {
        assert!(devices.batches() - batches >= 1 + generated.len() as u64, "device batches in every evaluation");
    }
    assert!(generated.iter().any(|&t| t != generated[0]), "generation produced a constant stream: {generated:?}");
}

#[test]
fn plan_reports_the_arena_run_uses() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if smollm2().is_none() {
        return;
    }
    let keel = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/keel");
    let keel = if keel.exists() { keel } else { return eprintln!("SKIPPED: build the release binary first (tests/run.sh does)") };
    let plan = std::process::Command::new(&keel).args(["plan", "-m", "smollm2-135m", "-c", "2048", "-t", "2", "--json"]).output().unwrap();
    assert!(plan.status.success(), "{}", String::from_utf8_lossy(&plan.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    let run = std::process::Command::new(&keel).args(["run", "-m", "smollm2-135m", "-c", "2048", "-t", "2", "-n", "64", "--temp", "0", "-p", "The capital of France is", "--json"]).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let run: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(plan["total_bytes"], run["arena_bytes"], "plan and run disagree on the arena size");
    let peak = run["peak_rss_bytes"].as_u64().unwrap();
    eprintln!("arena {} bytes, peak RSS {} bytes", run["arena_bytes"], peak);
    assert!(peak <= 160_000_000, "keel run -c 2048 -n 64 peaked at {peak} bytes resident (limit 160 MB)");
}

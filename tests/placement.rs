//! keel-core's op placement without a real device: a fake device that supports only
//! Q8_0 weights (so Q4_0 ones are converted) and computes each product with keel's own
//! CPU kernels, so a run through the placement must equal the CPU run bit for bit.
//! Covers the policy (device order, kinds, types, layers, output, budget, minimum
//! batch), the between-token hook, and a device fault ending the request.

use crate::common::*;
use keel::core::ggml_type::GgmlType;
use keel::core::gguf::Gguf;
use keel::core::matmul::{matmul, quantize_rows};
use keel::core::model::Model;
use keel::core::placement::*;
use keel::core::quant::Kernels;
use keel::core::session::{Outputs, SessionConfig};
use keel_host_linux::pool::ThreadPool;

fn model_bytes(name: &str) -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/synth/{name}.gguf"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Supports Q8_0 weights only; each weight takes its ggml size.
struct FakeInfo {
    budget: u64,
}

impl DeviceInfo for FakeInfo {
    fn matmul_weight_bytes(&self, ty: GgmlType, rows: usize, cols: usize) -> Option<u64> {
        (ty == GgmlType::Q8_0).then(|| ty.row_bytes(cols as u64).unwrap() * rows as u64)
    }
    fn memory_budget(&self) -> u64 {
        self.budget
    }
}

/// Computes each product with keel's CPU kernels on the file's weights (looked up by id).
struct FakeOffload<'m> {
    model: &'m Model<'m>,
    kern: Kernels,
    calls: usize,
    fail_after: Option<usize>,
}

impl Offload for FakeOffload<'_> {
    fn matmul(&mut self, device: u8, id: WeightId, x: &[f32], n: usize, out: &mut [f32]) -> Result<(), DeviceFailed> {
        if self.fail_after.is_some_and(|k| self.calls >= k) {
            return Err(DeviceFailed { device });
        }
        self.calls += 1;
        let mut w = None;
        for_each_weight(self.model, |i, t| {
            if i == id {
                w = Some(*t);
            }
        });
        let w = w.unwrap();
        let vdt = Kernels::vec_dot_type(w.ty).unwrap();
        let mut xq = vec![0u8; n * vdt.row_bytes(w.cols as u64).unwrap() as usize];
        let par = keel::core::parallel::Sequential;
        quantize_rows(&self.kern, &par, vdt, x, n, w.cols, &mut xq);
        matmul(&self.kern, &par, &w, &xq, n, out);
        Ok(())
    }
}

#[test]
fn policy_decides_per_weight_from_the_device_answers() {
    let bytes = model_bytes("synth-llama-q4_0");
    let g = Gguf::parse(&bytes).unwrap();
    let c = SessionConfig { n_ctx: 32, n_batch: 8, n_outputs: 1, n_threads: 1 };
    let mut arena = arena_for(&bytes, &c);
    let e = engine(&g, &mut arena, c, fast_kernels());
    let n = weight_count(&e.model);
    let big = FakeInfo { budget: u64::MAX };
    let mut slots = vec![Decision::EMPTY; n];

    // No devices: everything on the CPU, said why.
    let p = Placement::plan(&e.model, &Policy::all(0), &[], &mut slots).unwrap();
    assert!(p.decisions().iter().all(|d| d.place == Where::Cpu(CpuReason::NoDevice)));

    // Everything, Q4_0 converted to Q8_0 (the fake device has only Q8_0).
    let p = Placement::plan(&e.model, &Policy::all(1), &[&big], &mut slots).unwrap();
    assert_eq!(p.n_on_devices(), n);
    assert!(p.decisions().iter().all(|d| d.device_ty == GgmlType::Q8_0));
    assert!(p.decisions().iter().any(|d| d.converted() && d.file_ty == GgmlType::Q4_0));
    // Without conversion, the Q4_0 weights stay on the CPU as unsupported.
    let mut pol = Policy::all(1);
    pol.convert_to = None;
    let p = Placement::plan(&e.model, &pol, &[&big], &mut slots).unwrap();
    assert!(p.decisions().iter().all(|d| (d.file_ty == GgmlType::Q8_0) == matches!(d.place, Where::Device(0))));
    assert!(p.decisions().iter().any(|d| d.place == Where::Cpu(CpuReason::Unsupported)));

    // Layers, output and kinds.
    let mut pol = Policy::all(1);
    pol.max_layers = 1;
    pol.output = false;
    pol.devices[0].kinds = WeightKind::Down.bit() | WeightKind::Q.bit();
    let p = Placement::plan(&e.model, &pol, &[&big], &mut slots).unwrap();
    for d in p.decisions() {
        let on = d.id.layer == 0 && matches!(d.id.kind, WeightKind::Down | WeightKind::Q);
        assert_eq!(matches!(d.place, Where::Device(0)), on, "{:?}", d);
    }
    assert_eq!(p.decision(WeightId { layer: OUTPUT_LAYER, kind: WeightKind::Output }).unwrap().place, Where::Cpu(CpuReason::Policy));

    // Budget: the first device fills up, the second takes the rest (split across sessions).
    let total: u64 = Placement::plan(&e.model, &Policy::all(1), &[&big], &mut slots).unwrap().totals(0).bytes;
    let half = FakeInfo { budget: total / 2 };
    let p = Placement::plan(&e.model, &Policy::all(2), &[&half, &big], &mut slots).unwrap();
    let (t0, t1) = (p.totals(0), p.totals(1));
    assert!(t0.bytes <= total / 2 && t0.weights > 0 && t1.weights > 0);
    assert_eq!(t0.weights + t1.weights, n);
    let p = Placement::plan(&e.model, &Policy::all(1), &[&half], &mut slots).unwrap();
    assert!(p.decisions().iter().any(|d| d.place == Where::Cpu(CpuReason::Budget)));

    // A split (`--tensor-split 3,1`): layers 0..3 on device 0, layer 3 and the output on
    // device 1, whatever the budgets; a share of 0 gets nothing; -ngl cuts first.
    let mut pol = Policy::all(2);
    pol.split[..2].copy_from_slice(&[3, 1]);
    let p = Placement::plan(&e.model, &pol, &[&big, &big], &mut slots).unwrap();
    for d in p.decisions() {
        let want = if d.id.layer == OUTPUT_LAYER || d.id.layer >= 3 { 1 } else { 0 };
        assert_eq!(d.place, Where::Device(want), "{:?}", d.id);
    }
    pol.split[..2].copy_from_slice(&[0, 1]);
    assert!(Placement::plan(&e.model, &pol, &[&big, &big], &mut slots).unwrap().decisions().iter().all(|d| d.place == Where::Device(1)));
    pol.split[..2].copy_from_slice(&[1, 1]);
    pol.max_layers = 2;
    assert_eq!((0..5).map(|l| pol.split_device(4, l)).collect::<Vec<_>>(), [Some(0), Some(1), Some(1), Some(1), Some(1)]);
    let p = Placement::plan(&e.model, &pol, &[&big, &big], &mut slots).unwrap();
    assert!(p.decisions().iter().all(|d| match d.id.layer {
        0 => d.place == Where::Device(0),
        1 | OUTPUT_LAYER => d.place == Where::Device(1),
        _ => d.place == Where::Cpu(CpuReason::Policy),
    }));

    // Minimum batch and the between-token hook.
    let mut p = Placement::plan(&e.model, &Policy::all(1), &[&big], &mut slots).unwrap();
    let q0 = WeightId { layer: 0, kind: WeightKind::Q };
    assert_eq!(p.device_for(q0, 1), Some(0));
    p.set_min_batch(4);
    assert_eq!((p.device_for(q0, 3), p.device_for(q0, 4)), (None, Some(0)));
    p.set_min_batch(1);
    p.set_device_enabled(0, false);
    assert_eq!(p.device_for(q0, 8), None);
}

#[test]
fn a_placed_run_equals_the_cpu_run_and_the_hook_moves_work_between_tokens() {
    let bytes = model_bytes("synth-llama-q8_0");
    let g = Gguf::parse(&bytes).unwrap();
    let c = SessionConfig { n_ctx: 64, n_batch: 16, n_outputs: 1, n_threads: 2 };
    let (mut a1, mut a2) = (arena_for(&bytes, &c), arena_for(&bytes, &c));
    let mut cpu = engine(&g, &mut a1, c, fast_kernels());
    let mut dev = engine(&g, &mut a2, c, fast_kernels());
    let pool = ThreadPool::new(2).unwrap();
    let mut slots = vec![Decision::EMPTY; weight_count(&dev.model)];
    let info = FakeInfo { budget: u64::MAX };
    let mut placement = Placement::plan(&dev.model, &Policy::all(1), &[&info], &mut slots).unwrap();
    let model_copy: Model<'_> = dev.model;
    let mut off = FakeOffload { model: &model_copy, kern: dev.session.kernels(), calls: 0, fail_after: None };
    let prompt = [1u32, 17, 300, 42, 7];
    let mut tok = 0u32;
    for step in 0..6 {
        // The hook: the device is switched off for steps 2 and 3.
        placement.set_device_enabled(0, !(2..4).contains(&step));
        let input: Vec<u32> = if step == 0 { prompt.to_vec() } else { vec![tok] };
        let before = off.calls;
        let want = cpu.eval(&input, Outputs::Last, &pool).unwrap().to_vec();
        let mut exec = Exec { placement: &placement, offload: &mut off };
        let got = dev.eval_on(&input, Outputs::Last, &pool, Some(&mut exec)).unwrap().to_vec();
        assert_eq!(want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "step {step}");
        let calls = off.calls - before;
        assert_eq!(calls, if (2..4).contains(&step) { 0 } else { weight_count(&dev.model) }, "step {step}: products on the device");
        tok = keel::core::sampler::argmax(&want);
    }
    // A device fault stops the request with an error; nothing is computed in its place.
    off.fail_after = Some(off.calls + 3);
    let mut exec = Exec { placement: &placement, offload: &mut off };
    let r = dev.eval_on(&[tok], Outputs::Last, &pool, Some(&mut exec));
    assert_eq!(r.err(), Some(keel::core::Error::Device { device: 0 }));
}

/// [`FakeInfo`] that also answers for whole llama layers, with a KV cache of
/// `2 · n_ctx · kv_dim · 2` bytes (F16 K and V).
struct FakeLayerInfo {
    budget: u64,
}

impl DeviceInfo for FakeLayerInfo {
    fn matmul_weight_bytes(&self, ty: GgmlType, rows: usize, cols: usize) -> Option<u64> {
        FakeInfo { budget: self.budget }.matmul_weight_bytes(ty, rows, cols)
    }
    fn memory_budget(&self) -> u64 {
        self.budget
    }
    fn layer_kv_bytes(&self, shape: &LayerShape, n_ctx: usize) -> Option<u64> {
        Some(4 * (n_ctx * shape.kv_dim()) as u64)
    }
}

/// Records the whole-layer calls; products run as in [`FakeOffload`]. It leaves the
/// residual stream as it was (this test checks the session's calls, not arithmetic).
struct LayerRecorder<'m> {
    inner: FakeOffload<'m>,
    calls: Vec<(std::ops::Range<u16>, usize, usize)>,
}

impl Offload for LayerRecorder<'_> {
    fn matmul(&mut self, device: u8, id: WeightId, x: &[f32], n: usize, out: &mut [f32]) -> Result<(), DeviceFailed> {
        self.inner.matmul(device, id, x, n, out)
    }
    fn layers(&mut self, _device: u8, layers: std::ops::Range<u16>, x: &mut [f32], n: usize, pos: usize) -> Result<(), DeviceFailed> {
        assert!(x.len() >= n);
        self.calls.push((layers, n, pos));
        Ok(())
    }
}

#[test]
fn whole_layers_are_placed_per_layer_and_a_switch_mid_sequence_is_refused() {
    let bytes = model_bytes("synth-llama-q8_0");
    let g = Gguf::parse(&bytes).unwrap();
    let c = SessionConfig { n_ctx: 32, n_batch: 8, n_outputs: 1, n_threads: 1 };
    let (mut a1, mut a2) = (arena_for(&bytes, &c), arena_for(&bytes, &c));
    let mut cpu = engine(&g, &mut a1, c, fast_kernels());
    let mut dev = engine(&g, &mut a2, c, fast_kernels());
    let n_layer = dev.model.layers.len();
    let mut slots = vec![Decision::EMPTY; weight_count(&dev.model)];
    let big = FakeLayerInfo { budget: u64::MAX };
    let mut pol = Policy::all(1);
    pol.kv_ctx = c.n_ctx;

    // Default mode: every layer whole, its KV cache counted on the device.
    let p = Placement::plan(&dev.model, &pol, &[&big], &mut slots).unwrap();
    assert!((0..n_layer).all(|l| p.layer_device(l) == Some(0)));
    let kv_dim = dev.model.hp.n_head_kv * dev.model.hp.head_dim;
    assert_eq!(p.totals(0).layers, n_layer);
    assert_eq!(p.totals(0).kv_bytes, (n_layer * 4 * c.n_ctx * kv_dim) as u64);
    assert_eq!(p.layer_note(), None);
    let weights = p.totals(0).bytes;
    // Matmul mode, no context size, a device without the ops, a layer cut by -ngl: not whole.
    for (mode, kv_ctx, layers_ok, max_layers) in [(OffloadMode::MatMul, 32, true, usize::MAX), (OffloadMode::Layers, 0, true, usize::MAX), (OffloadMode::Layers, 32, false, usize::MAX), (OffloadMode::Layers, 32, true, 2)] {
        let mut q = pol;
        (q.mode, q.kv_ctx, q.max_layers) = (mode, kv_ctx, max_layers);
        let plain = FakeInfo { budget: u64::MAX };
        let info: &dyn DeviceInfo = if layers_ok { &big } else { &plain };
        let p = Placement::plan(&dev.model, &q, &[info], &mut slots).unwrap();
        let whole = (0..n_layer).filter(|&l| p.layer_device(l).is_some()).count();
        assert_eq!(whole, if max_layers == 2 { 2 } else { 0 }, "{mode:?} kv_ctx {kv_ctx} ops {layers_ok} -ngl {max_layers}");
        assert!(max_layers == 2 || p.layer_note().is_some());
    }
    // A budget with room for the weights and one layer's cache: only layer 0 is whole.
    let tight = FakeLayerInfo { budget: weights + (4 * c.n_ctx * kv_dim) as u64 };
    let p = Placement::plan(&dev.model, &pol, &[&tight], &mut slots).unwrap();
    assert_eq!((0..n_layer).map(|l| p.layer_device(l).is_some()).collect::<Vec<_>>(), (0..n_layer).map(|l| l == 0).collect::<Vec<_>>());
    assert_eq!(p.layer_note(), Some("the layer's KV cache does not fit the device budget"));
    // Qwen 3.5's delta-net and gated attention layers are whole on the device too (every
    // architecture's block has a lowering); their state is counted like a KV cache.
    let qb = model_bytes("synth-qwen35-q8_0");
    let qg = Gguf::parse(&qb).unwrap();
    let mut qa = arena_for(&qb, &c);
    let qe = engine(&qg, &mut qa, c, fast_kernels());
    let mut qslots = vec![Decision::EMPTY; weight_count(&qe.model)];
    let p = Placement::plan(&qe.model, &pol, &[&big], &mut qslots).unwrap();
    assert_eq!(p.n_on_devices(), weight_count(&qe.model));
    assert!((0..qe.model.layers.len()).all(|l| p.layer_device(l).is_some()), "{:?}", p.layer_note());

    // The session: one call for all (consecutive) layers per forward pass, at the right
    // positions; no per-product call besides the output projection.
    let mut p = Placement::plan(&dev.model, &pol, &[&big], &mut slots).unwrap();
    let model_copy: Model<'_> = dev.model;
    let mut off = LayerRecorder { inner: FakeOffload { model: &model_copy, kern: dev.session.kernels(), calls: 0, fail_after: None }, calls: Vec::new() };
    let pool = ThreadPool::new(1).unwrap();
    let prompt = [1u32, 17, 300, 42, 7];
    let mut exec = Exec { placement: &p, offload: &mut off };
    dev.eval_on(&prompt, Outputs::Last, &pool, Some(&mut exec)).unwrap();
    let mut exec = Exec { placement: &p, offload: &mut off };
    dev.eval_on(&[5], Outputs::Last, &pool, Some(&mut exec)).unwrap();
    assert_eq!(off.calls, vec![(0..n_layer as u16, 5, 0), (0..n_layer as u16, 1, 5)]);
    assert_eq!(off.inner.calls, 2, "only the output projection as a product");
    // The hook switches the device off mid-sequence: refused (the cache is on the device).
    p.set_device_enabled(0, false);
    let mut exec = Exec { placement: &p, offload: &mut off };
    assert_eq!(dev.eval_on(&[6], Outputs::Last, &pool, Some(&mut exec)).err(), Some(keel::core::Error::DeviceLayersSwitched));
    // Without the placement at all: refused too.
    assert_eq!(dev.eval_on(&[6], Outputs::Last, &pool, None).err(), Some(keel::core::Error::DeviceLayersSwitched));
    // At the next sequence the switch takes effect: all on the CPU, equal to the CPU run.
    dev.reset();
    let want = cpu.eval(&prompt, Outputs::Last, &pool).unwrap().to_vec();
    let mut exec = Exec { placement: &p, offload: &mut off };
    let got = dev.eval_on(&prompt, Outputs::Last, &pool, Some(&mut exec)).unwrap().to_vec();
    assert_eq!(want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), got.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    assert_eq!(off.calls.len(), 2);
    // Switched on mid-sequence: refused as well (the device's cache lacks the prompt).
    p.set_device_enabled(0, true);
    let mut exec = Exec { placement: &p, offload: &mut off };
    assert_eq!(dev.eval_on(&[6], Outputs::Last, &pool, Some(&mut exec)).err(), Some(keel::core::Error::DeviceLayersSwitched));
}

/// [`FakeLayerInfo`] that also looks up embedding rows (the table at its ggml size).
struct FakeForwardInfo {
    budget: u64,
}

impl DeviceInfo for FakeForwardInfo {
    fn matmul_weight_bytes(&self, ty: GgmlType, rows: usize, cols: usize) -> Option<u64> {
        FakeInfo { budget: self.budget }.matmul_weight_bytes(ty, rows, cols)
    }
    fn memory_budget(&self) -> u64 {
        self.budget
    }
    fn layer_kv_bytes(&self, shape: &LayerShape, n_ctx: usize) -> Option<u64> {
        FakeLayerInfo { budget: self.budget }.layer_kv_bytes(shape, n_ctx)
    }
    fn embedding_bytes(&self, ty: GgmlType, n_vocab: usize, n_embd: usize, _scaled: bool) -> Option<u64> {
        Some(ty.row_bytes(n_embd as u64)? * n_vocab as u64)
    }
}

/// Records whole forward passes and answers each logit with `token + row + pos` of the
/// pass (so the test sees which rows came back); layers and products run as in
/// [`LayerRecorder`].
struct ForwardRecorder<'m> {
    layers: LayerRecorder<'m>,
    calls: Vec<(Vec<u32>, usize, usize)>,
    fail: bool,
}

impl Offload for ForwardRecorder<'_> {
    fn matmul(&mut self, device: u8, id: WeightId, x: &[f32], n: usize, out: &mut [f32]) -> Result<(), DeviceFailed> {
        self.layers.matmul(device, id, x, n, out)
    }
    fn layers(&mut self, device: u8, layers: std::ops::Range<u16>, x: &mut [f32], n: usize, pos: usize) -> Result<(), DeviceFailed> {
        self.layers.layers(device, layers, x, n, pos)
    }
    fn forward(&mut self, device: u8, tokens: &[u32], pos: usize, out_rows: usize, logits: &mut [f32]) -> Result<(), DeviceFailed> {
        if self.fail {
            return Err(DeviceFailed { device });
        }
        self.calls.push((tokens.to_vec(), pos, out_rows));
        let v = logits.len() / out_rows.max(1);
        for r in 0..out_rows {
            let t = tokens[tokens.len() - out_rows + r];
            logits[r * v..(r + 1) * v].fill((t as usize + r + pos) as f32);
        }
        Ok(())
    }
}

#[test]
fn the_whole_forward_pass_goes_to_one_device_call_when_everything_is_there() {
    let bytes = model_bytes("synth-llama-q8_0");
    let g = Gguf::parse(&bytes).unwrap();
    let c = SessionConfig { n_ctx: 32, n_batch: 4, n_outputs: 8, n_threads: 1 };
    let mut a = arena_for(&bytes, &c);
    let mut dev = engine(&g, &mut a, c, fast_kernels());
    let n_layer = dev.model.layers.len();
    let nv = dev.model.hp.n_vocab;
    let t = dev.model.tok_embd;
    let embd = t.ty.row_bytes(t.cols as u64).unwrap() * t.rows as u64;
    let mut slots = vec![Decision::EMPTY; weight_count(&dev.model)];
    let mut pol = Policy::all(1);
    pol.kv_ctx = c.n_ctx;
    let big = FakeForwardInfo { budget: u64::MAX };

    // Everything on the device: the embedding copy is counted there.
    let p = Placement::plan(&dev.model, &pol, &[&big], &mut slots).unwrap();
    assert_eq!((p.forward_device(1), p.forward_device(0), p.forward_placed(), p.forward_note()), (Some(0), Some(0), Some((0, embd)), None));
    assert_eq!(p.totals(0).embd_bytes, embd);
    let needed = p.totals(0).bytes + p.totals(0).kv_bytes + embd;
    // Not on the device: a device without row lookups (layers only), the output
    // projection kept off, a layer cut by -ngl, matmul mode, a budget one byte short.
    let layers_only = FakeLayerInfo { budget: u64::MAX };
    let short = FakeForwardInfo { budget: needed - 1 };
    let cases: [(&dyn DeviceInfo, bool, usize, OffloadMode, &str); 5] = [
        (&layers_only, true, usize::MAX, OffloadMode::Layers, "the device does not look up rows of the token embedding's type"),
        (&big, false, usize::MAX, OffloadMode::Layers, "the output projection is not on the layers' device"),
        (&big, true, 2, OffloadMode::Layers, "not every layer runs whole on one device"),
        (&big, true, usize::MAX, OffloadMode::MatMul, ""),
        (&short, true, usize::MAX, OffloadMode::Layers, "the token embedding does not fit the device budget"),
    ];
    for (info, output, max_layers, mode, why) in cases {
        let mut q = pol;
        (q.output, q.max_layers, q.mode) = (output, max_layers, mode);
        let p = Placement::plan(&dev.model, &q, &[info], &mut slots).unwrap();
        assert_eq!(p.forward_device(1), None, "{why}");
        assert_eq!(p.forward_note(), (!why.is_empty()).then_some(why));
        assert_eq!(p.totals(0).embd_bytes, 0);
    }
    // With the budget exactly met it is placed.
    let exact = FakeForwardInfo { budget: needed };
    assert_eq!(Placement::plan(&dev.model, &pol, &[&exact], &mut slots).unwrap().forward_device(1), Some(0));

    // The session: one forward call per chunk of n_batch tokens, with the rows that
    // need logits; no layer or product call; the logits are the device's.
    let mut p = Placement::plan(&dev.model, &pol, &[&big], &mut slots).unwrap();
    let model_copy: Model<'_> = dev.model;
    let inner = FakeOffload { model: &model_copy, kern: dev.session.kernels(), calls: 0, fail_after: None };
    let mut off = ForwardRecorder { layers: LayerRecorder { inner, calls: Vec::new() }, calls: Vec::new(), fail: false };
    let pool = ThreadPool::new(1).unwrap();
    let prompt = [1u32, 17, 300, 42, 7, 9];
    let mut exec = Exec { placement: &p, offload: &mut off };
    let got = dev.eval_on(&prompt, Outputs::Last, &pool, Some(&mut exec)).unwrap().to_vec();
    assert_eq!(got, vec![(9 + 0 + 4) as f32; nv]);
    let mut exec = Exec { placement: &p, offload: &mut off };
    dev.eval_on(&[5, 6], Outputs::All, &pool, Some(&mut exec)).unwrap();
    assert_eq!(dev.session.logits(nv).iter().step_by(nv).copied().collect::<Vec<_>>(), vec![(5 + 6) as f32, (6 + 1 + 6) as f32]);
    assert_eq!(off.calls, vec![(vec![1, 17, 300, 42], 0, 0), (vec![7, 9], 4, 1), (vec![5, 6], 6, 2)]);
    assert!(off.layers.calls.is_empty() && off.layers.inner.calls == 0, "nothing else went to the device");
    // Below the minimum batch the output projection stays on the CPU: the layers go as
    // one call and the session does the rest.
    p.set_min_batch(2);
    let mut exec = Exec { placement: &p, offload: &mut off };
    dev.eval_on(&[8], Outputs::Last, &pool, Some(&mut exec)).unwrap();
    assert_eq!((off.calls.len(), off.layers.calls.clone(), off.layers.inner.calls), (3, vec![(0..n_layer as u16, 1, 8)], 0));
    p.set_min_batch(1);
    // A device failure stops the request.
    off.fail = true;
    let mut exec = Exec { placement: &p, offload: &mut off };
    assert_eq!(dev.eval_on(&[8], Outputs::Last, &pool, Some(&mut exec)).err(), Some(keel::core::Error::Device { device: 0 }));
    // Switched off mid-sequence: refused, as for whole layers.
    p.set_device_enabled(0, false);
    assert_eq!(p.forward_device(1), None);
    let mut exec = Exec { placement: &p, offload: &mut off };
    assert_eq!(dev.eval_on(&[8], Outputs::Last, &pool, Some(&mut exec)).err(), Some(keel::core::Error::DeviceLayersSwitched));
}

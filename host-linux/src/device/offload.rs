//! Running a model's matrix products on devices: the host side of keel-core's
//! placement ([`keel_core::placement`]).
//!
//! [`Devices::open`] opens each device of a `--device` list (`hexagon-sim`, several times
//! for several sessions; `cpu` is implicit); [`Devices::plan`] asks each one, through
//! the HAL's `supports(op)` on a real MatMul descriptor, which weights it can hold and
//! how many bytes they take in its tiled layout, and lets keel-core decide;
//! [`Devices::load`] converts (types the device lacks → the policy's type, Q8_0 by
//! default, with keel-core's reference quantizer) and repacks every placed weight once
//! into the device's Tiles32 layout in shared buffers, and reserves the activation and
//! output buffers. Then [`Devices`] implements [`Offload`]: one batch (one MatMul op)
//! per product and chunk of tokens, completed before the CPU continues; and, for layers
//! placed whole ([`keel_core::placement::OffloadMode::Layers`]), batches of whole layers
//! ([`super::whole_layer`]: as many consecutive layers per batch as the device's op limit
//! and the wire tables allow) over their norm weights and a device-resident F16 KV cache
//! allocated at load (`n_ctx` positions per layer), the residual stream copied in before
//! and out after. When the whole forward pass is placed on a device
//! ([`keel_core::placement::Placement::forward_device`]), a copy of the token embedding
//! (file type, ggml rows) and the output norm weight are loaded there too, and
//! [`Offload::forward`] runs the same layer batches with the embedding lookup first and
//! the final norm and output projection last: token ids in, logits out.
//!
//! Memory is counted by kind (model, context, compute) from the buffers this module
//! allocates, and the total from what the firmware measured (`Caps::memory.va_budget`,
//! the shared region it mapped); [`Devices::breakdown`] reports it per device.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use keel_core::block::BlockOps;
use keel_core::ggml_type::GgmlType;
use keel_core::model::Model;
use keel_core::placement::{for_each_weight, Decision, DeviceFailed, DeviceInfo, LayerShape, Offload, Placement, Policy, WeightId, WeightKind, Where, OUTPUT_LAYER};
use keel_core::quant::{quantize_row_ref, Kernels};
use keel_npu_hal::device::{BatchStatus, Device, SharedBuffers};
use keel_npu_hal::op::{Batch, BufferRef, DType, Layout, OpDesc, OpKind, Support, TensorDesc};
use keel_npu_hal::wait::{Tracker, WaitError, WaitPolicy};
use keel_npu_hal::{tile, BufferId, Error as _, ErrorKind};

use super::whole_layer::{self, Placed, Resident, Table, Weight, Work};
use super::{DeviceError, HexagonSim, SimConfig};

/// Bytes of shared memory kept for one product's activations and outputs.
pub const IO_BYTES: u64 = 8 << 20;

/// Default for [`Devices::batch_work`]: weight bytes × tokens one batch of whole layers
/// may stream. The emulated DSP takes about 0.06 s per MiB·token (SmolLM2 Q8_0: 144 MiB
/// per token at ~0.12 tokens/s), so 32 MiB keeps a batch near 2 s, the size of the
/// largest product batch (SmolLM2's output projection, 28 MiB) and far below the 10 s
/// hang timeout.
pub const BATCH_WORK: u64 = 32 << 20;

/// The HAL type of a ggml weight type, if the HAL has it.
pub fn hal_dtype(t: GgmlType) -> Option<DType> {
    match t {
        GgmlType::Q8_0 => Some(DType::Q8_0),
        GgmlType::Q4_0 => Some(DType::Q4_0),
        GgmlType::IQ4_NL => Some(DType::IQ4NL),
        _ => None,
    }
}

/// The HAL type of a ggml type whose rows the device may look up (`GetRows`), if any.
pub fn hal_row_dtype(t: GgmlType) -> Option<DType> {
    match t {
        GgmlType::F32 => Some(DType::F32),
        GgmlType::F16 => Some(DType::F16),
        other => hal_dtype(other),
    }
}

/// The MatMul descriptors for a `rows × cols` weight of `dtype` and `n` F32 columns.
fn matmul_desc(dtype: DType, rows: u32, cols: u32, n: u32, w_offset: u32) -> Option<([TensorDesc; 3], OpDesc)> {
    let w = TensorDesc { dtype, layout: Layout::Tiles32, ne: [cols, rows, 1, 1], nb: [0; 4], buffer: 0, offset: w_offset };
    let x = TensorDesc::contiguous(DType::F32, [cols, n, 1, 1], 1, 0)?;
    let y = TensorDesc::contiguous(DType::F32, [rows, n, 1, 1], 2, 0)?;
    Some(([w, x, y], OpDesc { kind: OpKind::MatMul, src: [Some(0), Some(1), None], dst: 2 }))
}

/// One opened device, as placement sees it.
struct Info<'d> {
    dev: &'d HexagonSim,
    reserve: u64,
}

impl DeviceInfo for Info<'_> {
    fn matmul_weight_bytes(&self, ty: GgmlType, rows: usize, cols: usize) -> Option<u64> {
        let dtype = hal_dtype(ty)?;
        let (t, op) = matmul_desc(dtype, u32::try_from(rows).ok()?, u32::try_from(cols).ok()?, 1, 0)?;
        if self.dev.supports(&op, &t) != Support::Yes {
            return None;
        }
        let packed = tile::packed_size(dtype, rows as u32, cols as u32)? as u64;
        (packed <= self.dev.buffer_rules().max_size).then_some(packed.next_multiple_of(WEIGHT_ALIGN))
    }
    fn memory_budget(&self) -> u64 {
        self.dev.caps().memory.va_budget.saturating_sub(self.reserve)
    }
    fn layer_kv_bytes(&self, shape: &LayerShape, n_ctx: usize) -> Option<u64> {
        for (op, t) in whole_layer::probe_ops(shape)? {
            if self.dev.supports(&op, &t) != Support::Yes {
                return None;
            }
        }
        // An attention layer's K and V cache, a delta-net layer's conv and recurrent state.
        let bytes = match (shape.delta, shape.ssm) {
            (true, Some(d)) => {
                let (c, s) = whole_layer::state_bytes(&d);
                c + s
            }
            (true, None) => return None,
            (false, _) => 2 * whole_layer::cache_bytes(shape, n_ctx),
        };
        // The work buffer must hold at least one token's activations.
        let w = Work::new(shape, 1)?;
        (w.end <= IO_BYTES && bytes <= self.dev.buffer_rules().max_size).then_some(bytes)
    }
    fn embedding_bytes(&self, ty: GgmlType, n_vocab: usize, n_embd: usize, scaled: bool) -> Option<u64> {
        let dtype = hal_row_dtype(ty)?;
        for (op, t) in whole_layer::probe_embedding(dtype, n_vocab, n_embd, scaled)? {
            if self.dev.supports(&op, &t) != Support::Yes {
                return None;
            }
        }
        let bytes = dtype.row_bytes(u32::try_from(n_embd).ok()?)?.checked_mul(n_vocab as u64)?;
        (bytes <= self.dev.buffer_rules().max_size.min(u64::from(u32::MAX))).then_some(bytes.next_multiple_of(WEIGHT_ALIGN))
    }
}

/// Alignment of a weight inside a device buffer (one HVX vector).
pub const WEIGHT_ALIGN: u64 = 128;

/// A weight held by a device: at `offset` in buffer `buf` of `size` bytes.
struct Held {
    buf: BufferId,
    size: u64,
    offset: u32,
    dtype: DType,
    rows: usize,
    cols: usize,
}

/// One device session and what it holds.
pub struct Slot {
    /// The device.
    pub dev: HexagonSim,
    /// Its name in the `--device` list with its index (`hexagon-sim0`).
    pub label: String,
    weights: HashMap<(u16, u8), Held>,
    io: Option<(BufferId, u64, BufferId, u64)>,
    /// Norm weights and KV cache of each layer that runs whole here.
    resident: HashMap<u16, Resident>,
    /// The block ops of each layer that runs whole here (`keel_core::block::layer_ops`).
    blocks: HashMap<u16, BlockOps>,
    /// The shape of each such layer (RoPE base and window may differ between layers).
    shapes: HashMap<u16, LayerShape>,
    /// The model's token embedding scale (1: none).
    embd_scale: f32,
    /// The shape of those layers.
    shape: Option<LayerShape>,
    /// The token embedding's copy and the output norm weight, when the whole forward
    /// pass runs here.
    forward: Option<(Table, Placed)>,
    /// Bytes of repacked weights (and norm weights of whole layers).
    pub model_bytes: u64,
    /// Bytes of the KV caches allocated here.
    pub context_bytes: u64,
    /// Bytes of activation/output buffers.
    pub compute_bytes: u64,
    /// Weights held, of which converted at load.
    pub weights_held: (usize, usize),
    /// Batches submitted.
    pub batches: u64,
    /// Time spent waiting for the device.
    pub busy: Duration,
    /// Batches in flight: submitted and waited for through the HAL's bounded wait.
    inflight: Tracker<IN_FLIGHT>,
    /// The wait's limit (the device's own timeout: its `poll` reports a hang first).
    policy: WaitPolicy,
}

/// Batches a slot keeps in flight at most (one today: each is waited for at once).
const IN_FLIGHT: usize = 4;
/// Microseconds between polls of a batch's completion.
const POLL_US: u32 = 50;

/// The host's `DelayNs` for the HAL's bounded wait: the thread sleeps.
struct Sleep;

impl embedded_hal::delay::DelayNs for Sleep {
    fn delay_ns(&mut self, ns: u32) {
        std::thread::sleep(Duration::from_nanos(u64::from(ns)));
    }
}

impl Slot {
    /// Submits `batch` and waits for it with the HAL's bounded wait
    /// (`keel_npu_hal::wait::Tracker`, polling between sleeps); the time is added to `busy`.
    fn run_batch(&mut self, batch: &Batch<'_>) -> Result<BatchStatus, DeviceError> {
        let start = Instant::now();
        let seq = self.inflight.submit(&mut self.dev, batch).map_err(|e| wait_error(&self.label, e))?;
        self.batches += 1;
        let status = self.inflight.wait(&mut self.dev, seq, &mut Sleep, self.policy).map_err(|e| wait_error(&self.label, e));
        self.busy += start.elapsed();
        status
    }
}

/// A failed tracked submit or wait as a device error.
fn wait_error(label: &str, e: WaitError<DeviceError>) -> DeviceError {
    match e {
        WaitError::Device(e) => e,
        other => DeviceError::new(label, other.kind(), format!("{other:?}")),
    }
}

/// The devices of a run.
pub struct Devices {
    /// Device sessions in `--device` order.
    pub slots: Vec<Slot>,
    /// The first failure, with its full description.
    pub error: Option<DeviceError>,
    /// Time spent converting and repacking weights at load.
    pub load_time: Duration,
    /// Most weight bytes × tokens one batch of whole layers streams (at least one layer
    /// for one token goes in every batch): bounds a batch's run time. [`BATCH_WORK`] by default.
    pub batch_work: u64,
}

/// Memory of one device, bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Breakdown {
    /// Device label.
    pub name: String,
    /// What the device is (architecture, emulated or not).
    pub what: String,
    /// Total the device reported (measured by the firmware).
    pub total: u64,
    /// Not allocated.
    pub free: u64,
    /// Repacked weights.
    pub model: u64,
    /// KV cache / recurrent state held on the device.
    pub context: u64,
    /// Activation and output buffers.
    pub compute: u64,
    /// Weights held and converted.
    pub weights: (usize, usize),
}

impl Breakdown {
    /// `model + context + compute`.
    pub fn used(&self) -> u64 {
        self.model + self.context + self.compute
    }
}

/// Device names `--device` accepts (besides `cpu`).
pub fn parse_device_list(list: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match name {
            "cpu" | "none" => {}
            n if super::KNOWN.contains(&n) => out.push(n.to_string()),
            other => return Err(format!("unknown device '{other}' in --device; known: cpu, {}", super::KNOWN.join(", "))),
        }
    }
    Ok(out)
}

impl Devices {
    /// Opens each named device (each `hexagon-sim` is its own QEMU session).
    pub fn open(names: &[String], cfg: &SimConfig) -> Result<Devices, DeviceError> {
        let mut slots = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let dev = HexagonSim::open(cfg)?;
            // The device's own limit decides (its poll kills a hung device with a clear
            // error); the wait's count of delays is a lower bound of the time, a backstop.
            let timeout_us = u32::try_from(cfg.timeout.as_micros()).unwrap_or(u32::MAX);
            slots.push(Slot {
                dev,
                label: format!("{name}{i}"),
                weights: HashMap::new(),
                io: None,
                resident: HashMap::new(),
                blocks: HashMap::new(),
                shapes: HashMap::new(),
                embd_scale: 1.0,
                shape: None,
                forward: None,
                model_bytes: 0,
                context_bytes: 0,
                compute_bytes: 0,
                weights_held: (0, 0),
                batches: 0,
                busy: Duration::ZERO,
                inflight: Tracker::new(),
                policy: WaitPolicy { timeout_us: timeout_us.saturating_add(timeout_us / 2), poll_us: POLL_US },
            });
        }
        Ok(Devices { slots, error: None, load_time: Duration::ZERO, batch_work: BATCH_WORK })
    }

    /// No devices: everything on the CPU.
    pub fn none() -> Devices {
        Devices { slots: Vec::new(), error: None, load_time: Duration::ZERO, batch_work: BATCH_WORK }
    }

    /// Decides placement for `model` under `policy` (decisions written into `slots`);
    /// whole layers get a KV cache of `n_ctx` positions on their device.
    pub fn plan<'s>(&self, model: &Model<'_>, policy: &Policy, n_ctx: usize, slots: &'s mut [Decision]) -> Result<Placement<'s>, keel_core::Error> {
        let infos: Vec<Info<'_>> = self.slots.iter().map(|s| Info { dev: &s.dev, reserve: IO_BYTES + IO_BYTES }).collect();
        let dyns: Vec<&dyn DeviceInfo> = infos.iter().map(|i| i as &dyn DeviceInfo).collect();
        let mut p = *policy;
        p.n_devices = p.n_devices.min(self.slots.len());
        p.kv_ctx = n_ctx;
        Placement::plan(model, &p, &dyns, slots)
    }

    /// Converts and repacks every weight `placement` puts on a device into that device's
    /// shared memory, and reserves each device's activation and output buffers.
    pub fn load(&mut self, model: &Model<'_>, placement: &Placement<'_>, kern: &Kernels) -> Result<(), DeviceError> {
        let t0 = Instant::now();
        let mut tensors = Vec::new();
        for_each_weight(model, |id, t| tensors.push((id, *t)));
        // Weights are packed into as few shared buffers as the device's largest mapping
        // allows (the firmware maps a bounded number of buffers), 128-byte aligned.
        // Layout first: per device, (buffer index, offset) of each placed weight.
        let mut layout: Vec<(usize, u32)> = Vec::new();
        let mut sizes: Vec<Vec<u64>> = vec![Vec::new(); self.slots.len()];
        for (id, t) in &tensors {
            let Some(d) = placement.decision(*id) else { continue };
            let Where::Device(di) = d.place else { continue };
            let di = usize::from(di);
            let label = &self.slots[di].label;
            let dtype = hal_dtype(d.device_ty).ok_or_else(|| DeviceError::new(label, ErrorKind::Unsupported, format!("no device type for {}", d.device_ty)))?;
            let packed = tile::packed_size(dtype, t.rows as u32, t.cols as u32).unwrap_or(0) as u64;
            let max = self.slots[di].dev.buffer_rules().max_size.min(u64::from(u32::MAX));
            let bufs = &mut sizes[di];
            let fits = bufs.last().is_some_and(|&cur| cur.next_multiple_of(WEIGHT_ALIGN) + packed <= max);
            if !fits {
                bufs.push(0);
            }
            let cur = bufs.last_mut().unwrap_or_else(|| unreachable!());
            let off = cur.next_multiple_of(WEIGHT_ALIGN);
            *cur = off + packed;
            layout.push((bufs.len() - 1, off as u32));
        }
        let mut ids: Vec<Vec<BufferId>> = Vec::new();
        for (slot, bufs) in self.slots.iter_mut().zip(&sizes) {
            let mut v = Vec::new();
            for &size in bufs {
                let id = slot.dev.alloc(size)?;
                slot.model_bytes += slot.dev.host_view(id)?.len() as u64;
                v.push(id);
            }
            ids.push(v);
        }
        let mut next = 0;
        for (id, t) in tensors {
            let Some(d) = placement.decision(id) else { continue };
            let Where::Device(di) = d.place else { continue };
            let (bi, off) = layout[next];
            next += 1;
            let slot = &mut self.slots[usize::from(di)];
            let dtype = hal_dtype(d.device_ty).unwrap_or(DType::Q8_0);
            let converted;
            let src: &[u8] = if d.converted() {
                converted = convert(kern, &t, d.device_ty).map_err(|w| DeviceError::new(&slot.label, ErrorKind::Unsupported, w))?;
                &converted
            } else {
                t.data
            };
            let packed = tile::packed_size(dtype, t.rows as u32, t.cols as u32).unwrap_or(0);
            let buf = ids[usize::from(di)][bi];
            let view = slot.dev.host_view(buf)?;
            let size = view.len() as u64;
            tile::repack(dtype, t.rows as u32, t.cols as u32, src, &mut view[off as usize..off as usize + packed])
                .map_err(|k| DeviceError::new(&slot.label, k, format!("repacking blk.{}.{}", id.layer, id.kind.name())))?;
            slot.weights_held.0 += 1;
            slot.weights_held.1 += usize::from(d.converted());
            slot.weights.insert((id.layer, id.kind as u8), Held { buf, size, offset: off, dtype, rows: t.rows, cols: t.cols });
        }
        for (slot, v) in self.slots.iter_mut().zip(&ids) {
            for &b in v {
                slot.dev.map(b)?;
            }
        }
        self.load_layers(model, placement)?;
        for slot in &mut self.slots {
            if slot.weights.is_empty() {
                continue;
            }
            let x = slot.dev.alloc(IO_BYTES)?;
            let y = slot.dev.alloc(IO_BYTES)?;
            slot.dev.map(x)?;
            slot.dev.map(y)?;
            let (xs, ys) = (slot.dev.host_view(x)?.len() as u64, slot.dev.host_view(y)?.len() as u64);
            slot.compute_bytes = xs + ys;
            slot.io = Some((x, xs, y, ys));
        }
        self.load_time = t0.elapsed();
        Ok(())
    }

    /// Memory per device, from the buffers allocated and the total the firmware measured.
    pub fn breakdown(&self) -> Vec<Breakdown> {
        self.slots
            .iter()
            .map(|s| {
                let total = s.dev.caps().memory.va_budget;
                let id = s.dev.identity();
                let arch = match id.arch {
                    keel_npu_hal::Arch::Hexagon { version } => format!("Hexagon v{version}"),
                    other => format!("{other:?}"),
                };
                let allocated = s.dev.allocated_bytes();
                Breakdown {
                    name: s.label.clone(),
                    what: format!("{arch}{}", if id.emulated { ", emulated" } else { "" }),
                    total,
                    free: total.saturating_sub(allocated),
                    model: s.model_bytes,
                    context: s.context_bytes,
                    compute: s.compute_bytes,
                    weights: s.weights_held,
                }
            })
            .collect()
    }

    /// Allocates, fills and maps the norm weights and the KV caches of the layers that
    /// run whole on each device: norms in one buffer per device, each layer's K and V
    /// cache (F16, `placement.kv_ctx()` positions) packed into buffers of at most the
    /// device's mapping size; and, on the device the whole forward pass runs on, the
    /// output norm weight (after the layers' norms) and a copy of the token embedding
    /// in the file's type and row layout (its own buffer).
    fn load_layers(&mut self, model: &Model<'_>, placement: &Placement<'_>) -> Result<(), DeviceError> {
        let n_ctx = placement.kv_ctx();
        for (di, slot) in self.slots.iter_mut().enumerate() {
            let layers: Vec<usize> = (0..model.layers.len()).filter(|&l| placement.layer_device(l) == Some(di as u8)).collect();
            let Some(&first) = layers.first() else { continue };
            let label = slot.label.clone();
            let shape = keel_core::placement::layer_shape(model, first).map_err(|w| DeviceError::new(&label, ErrorKind::Unsupported, format!("layer {first}: {w}")))?;
            if let Some(&l) = layers.iter().find(|&&l| !keel_core::placement::layer_shape(model, l).is_ok_and(|s| s.same_layout(&shape))) {
                return Err(DeviceError::new(&label, ErrorKind::Unsupported, format!("layer {l} differs in shape from layer {first}; whole layers on one device share one shape")));
            }
            let norm_bytes = (4 * shape.n_embd as u64).next_multiple_of(WEIGHT_ALIGN);
            let forward = placement.forward_placed().is_some_and(|(d, _)| usize::from(d) == di);
            let n_norms = 2 * layers.len() as u64 + u64::from(forward);
            // Biases and per-head norm weights of each layer follow the norms.
            let vec_bytes = |floats: usize| (4 * floats as u64).next_multiple_of(WEIGHT_ALIGN);
            let (qd, kvd, hd) = (shape.n_head * shape.head_dim, shape.kv_dim(), shape.head_dim);
            let is_delta = |l: usize| matches!(model.layers[l].mixer, keel_core::model::Mixer::DeltaNet(_));
            let post = if shape.post_norms { 2 * vec_bytes(shape.n_embd) } else { 0 };
            // An attention layer's biases, head norms and post-norms; a delta-net layer's conv
            // taps, gate vectors, output norm weight and post-norms.
            let extra_of = |l: usize| match (is_delta(l), shape.ssm) {
                (true, Some(d)) => vec_bytes(d.d_conv * d.conv_channels()) + 2 * vec_bytes(d.n_v_heads) + vec_bytes(d.d_state) + post,
                _ => (if shape.biases { vec_bytes(qd) + 2 * vec_bytes(kvd) } else { 0 }) + (if shape.head_norms { 2 * vec_bytes(hd) } else { 0 }) + post,
            };
            let extras: u64 = layers.iter().map(|&l| extra_of(l)).sum();
            let nbuf = slot.dev.alloc(norm_bytes * n_norms + extras)?;
            let nsize = slot.dev.host_view(nbuf)?.len() as u64;
            slot.model_bytes += nsize;
            let cache = whole_layer::cache_bytes(&shape, n_ctx);
            let max = slot.dev.buffer_rules().max_size.min(u64::from(u32::MAX));
            let per_buf = (max / (2 * cache)).max(1) as usize;
            let attn_layers: Vec<usize> = layers.iter().copied().filter(|&l| !is_delta(l)).collect();
            let mut kv_bufs = Vec::new();
            for chunk in attn_layers.chunks(per_buf) {
                let b = slot.dev.alloc(2 * cache * chunk.len() as u64)?;
                let size = slot.dev.host_view(b)?.len() as u64;
                slot.context_bytes += size;
                kv_bufs.push((b, size));
            }
            // The delta-net layers' conv and recurrent states, one buffer for all.
            let n_delta = layers.len() - attn_layers.len();
            let (conv_b, ssm_b) = shape.ssm.map_or((0, 0), |d| whole_layer::state_bytes(&d));
            let state_buf = if n_delta > 0 {
                let b = slot.dev.alloc((conv_b + ssm_b) * n_delta as u64)?;
                let size = slot.dev.host_view(b)?.len() as u64;
                slot.context_bytes += size;
                Some((b, size))
            } else {
                None
            };
            let mut extra_at = norm_bytes * n_norms;
            let (mut ai, mut si) = (0usize, 0u64);
            for (i, &l) in layers.iter().enumerate() {
                let ly = &model.layers[l];
                let view = slot.dev.host_view(nbuf)?;
                let (a, f) = ((2 * i) as u64 * norm_bytes, (2 * i + 1) as u64 * norm_bytes);
                for (at, t) in [(a, &ly.attn_norm), (f, &ly.ffn_norm)] {
                    let dst = &mut view[at as usize..at as usize + 4 * shape.n_embd];
                    dst.copy_from_slice(&t.data[..4 * shape.n_embd]);
                }
                let p = |offset: u64, buf, size| Placed { buf, size, offset: offset as u32 };
                // The layer's KV cache (attention) or states (delta-net).
                let (kv, v_offset) = if is_delta(l) {
                    (p(0, nbuf, nsize), 0)
                } else {
                    let (kb, ksize) = kv_bufs[ai / per_buf];
                    let k_off = ((ai % per_buf) as u64 * 2 * cache) as u32;
                    ai += 1;
                    (Placed { buf: kb, size: ksize, offset: k_off }, k_off + cache as u32)
                };
                // This layer's vectors, after every norm of the buffer.
                let mut at = extra_at;
                extra_at += extra_of(l);
                let mut put = |t: Option<keel_core::model::Tensor<'_>>, floats: usize| -> Result<Placed, DeviceError> {
                    let t = t.ok_or_else(|| DeviceError::new(&label, ErrorKind::InvalidArgument, format!("layer {l}: a bias or head norm is missing")))?;
                    let view = slot.dev.host_view(nbuf)?;
                    view[at as usize..at as usize + 4 * floats].copy_from_slice(&t.data[..4 * floats]);
                    let placed = p(at, nbuf, nsize);
                    at += vec_bytes(floats);
                    Ok(placed)
                };
                let att = match &ly.mixer {
                    keel_core::model::Mixer::Attention(a) => Some(*a),
                    keel_core::model::Mixer::DeltaNet(_) => None,
                };
                let dn = match &ly.mixer {
                    keel_core::model::Mixer::DeltaNet(d) => Some(*d),
                    keel_core::model::Mixer::Attention(_) => None,
                };
                let biases = if shape.biases && att.is_some() { Some([put(att.and_then(|a| a.bq), qd)?, put(att.and_then(|a| a.bk), kvd)?, put(att.and_then(|a| a.bv), kvd)?]) } else { None };
                let head_norms = if shape.head_norms && att.is_some() { Some([put(att.and_then(|a| a.q_norm), hd)?, put(att.and_then(|a| a.k_norm), hd)?]) } else { None };
                let delta = match (dn, shape.ssm, state_buf) {
                    (Some(d), Some(s), Some((sb, ssize))) => {
                        let taps = put(Some(d.conv1d), s.d_conv * s.conv_channels())?;
                        let (dt_bias, a) = (put(Some(d.dt_bias), s.n_v_heads)?, put(Some(d.a), s.n_v_heads)?);
                        let norm = put(Some(d.norm), s.d_state)?;
                        let base = si * (conv_b + ssm_b);
                        si += 1;
                        Some(whole_layer::DeltaResident { taps, dt_bias, a, norm, conv_state: p(base, sb, ssize), ssm_state: p(base + conv_b, sb, ssize) })
                    }
                    _ => None,
                };
                let post_norms = if shape.post_norms { Some([put(ly.attn_post_norm, shape.n_embd)?, put(ly.ffn_post_norm, shape.n_embd)?]) } else { None };
                let own = keel_core::placement::layer_shape(model, l).map_err(|w| DeviceError::new(&label, ErrorKind::Unsupported, format!("layer {l}: {w}")))?;
                slot.shapes.insert(l as u16, own);
                slot.blocks.insert(l as u16, keel_core::block::layer_ops(&model.hp, l, ly));
                slot.resident.insert(
                    l as u16,
                    Resident { attn_norm: p(a, nbuf, nsize), ffn_norm: p(f, nbuf, nsize), biases, head_norms, post_norms, kv, v_offset, delta },
                );
            }
            if forward {
                let at = 2 * layers.len() as u64 * norm_bytes;
                let view = slot.dev.host_view(nbuf)?;
                view[at as usize..at as usize + 4 * shape.n_embd].copy_from_slice(&model.output_norm.data[..4 * shape.n_embd]);
                let t = &model.tok_embd;
                let dtype = hal_row_dtype(t.ty).ok_or_else(|| DeviceError::new(&label, ErrorKind::Unsupported, format!("no device type for token_embd ({})", t.ty)))?;
                let ebuf = slot.dev.alloc(t.data.len() as u64)?;
                let view = slot.dev.host_view(ebuf)?;
                let esize = view.len() as u64;
                view[..t.data.len()].copy_from_slice(t.data);
                slot.dev.map(ebuf)?;
                slot.model_bytes += esize;
                let table = Table { at: Placed { buf: ebuf, size: esize, offset: 0 }, dtype, rows: t.rows, cols: t.cols };
                slot.forward = Some((table, Placed { buf: nbuf, size: nsize, offset: at as u32 }));
            }
            slot.dev.map(nbuf)?;
            for &(b, _) in kv_bufs.iter().chain(state_buf.iter()) {
                slot.dev.map(b)?;
            }
            slot.shape = Some(shape);
            slot.embd_scale = model.hp.embd_scale;
        }
        Ok(())
    }

    /// Runs layers `layers` (whole on `device`) for `n` tokens at positions `pos..`:
    /// with [`Pass::Layers`] over the residual rows given, with [`Pass::Forward`] from
    /// the tokens to the logits (the embedding lookup in the first batch of each chunk
    /// of tokens, the final norm and output projection in the last one when it still
    /// fits the batch work and tables, else in a batch of their own).
    fn run_pass(&mut self, device: u8, layers: std::ops::Range<u16>, n: usize, pos: usize, mut pass: Pass<'_>) -> Result<(), DeviceError> {
        let slot = self.slots.get_mut(usize::from(device)).ok_or_else(|| DeviceError::new("placement", ErrorKind::InvalidArgument, format!("no device {device}")))?;
        let label = slot.label.clone();
        let bad = |what: String| DeviceError::new(&label, ErrorKind::InvalidArgument, what);
        let sh = slot.shape.ok_or_else(|| bad("no whole layers were loaded on this device".into()))?;
        let (wb, ws, yb, ys) = slot.io.ok_or_else(|| bad("no work buffer".into()))?;
        let e = sh.n_embd;
        match &pass {
            Pass::Layers { x } if x.len() < n * e => return Err(bad(format!("{} residual values for {n} tokens of {e}", x.len()))),
            Pass::Forward { tokens, .. } if tokens.len() != n => return Err(bad(format!("{} tokens for a pass of {n}", tokens.len()))),
            _ => {}
        }
        // Weight bytes one layer streams per token: the most of any layer of the range
        // (its block's products).
        let mut layer_bytes = 1u64;
        for l in layers.clone() {
            let ops = slot.blocks.get(&l).ok_or_else(|| bad(format!("layer {l} has no block on this device")))?;
            let mut bytes = 0u64;
            for op in ops.iter() {
                if let keel_core::block::Op::MatMul { w: kind, .. } = op {
                    let h = slot.weights.get(&(l, *kind as u8)).ok_or_else(|| bad(format!("weight blk.{l}.{} is not on this device", kind.name())))?;
                    bytes += tile::packed_size(h.dtype, h.rows as u32, h.cols as u32).unwrap_or(0) as u64;
                }
            }
            layer_bytes = layer_bytes.max(bytes);
        }
        // A new sequence: the delta-net layers' states start from zero (as the CPU's).
        if pos == 0 {
            for l in layers.clone() {
                if let Some(d) = slot.resident.get(&l).and_then(|r| r.delta) {
                    let (conv_b, ssm_b) = sh.ssm.map_or((0, 0), |s| whole_layer::state_bytes(&s));
                    let view = slot.dev.host_view(d.conv_state.buf)?;
                    view[d.conv_state.offset as usize..][..conv_b as usize].fill(0);
                    view[d.ssm_state.offset as usize..][..ssm_b as usize].fill(0);
                }
            }
        }
        // The forward pass's embedding table, output norm and output weight.
        let mut tail = None;
        if let Pass::Forward { out_rows, logits, .. } = &pass {
            let (table, norm) = slot.forward.ok_or_else(|| bad("the token embedding is not on this device".into()))?;
            let h = slot.weights.get(&(OUTPUT_LAYER, WeightKind::Output as u8)).ok_or_else(|| bad("the output projection is not on this device".into()))?;
            let out = Weight { at: Placed { buf: h.buf, size: h.size, offset: h.offset }, dtype: h.dtype, rows: h.rows, cols: h.cols };
            if logits.len() < out_rows * out.rows || *out_rows > n {
                return Err(bad(format!("{} logits for {out_rows} rows of {} (of {n} tokens)", logits.len(), out.rows)));
            }
            let out_bytes = tile::packed_size(out.dtype, out.rows as u32, out.cols as u32).unwrap_or(0) as u64;
            tail = Some((table, norm, out, out_bytes));
        }
        // Tokens per chunk: as many as the work buffer holds and one layer's batch work
        // allows (and, for logits, as many rows as the output buffer holds).
        let mut per = n.min((self.batch_work / layer_bytes).max(1) as usize);
        if let Some((_, _, out, _)) = &tail {
            per = per.min(ys as usize / (4 * out.rows).max(1));
            if per == 0 {
                return Err(bad(format!("one row of {} logits does not fit the {ys}-byte output buffer", out.rows)));
            }
        }
        while per > 1 && Work::new(&sh, per).is_none_or(|w| w.end > ws) {
            per = per.div_ceil(2);
        }
        let max_ops = usize::from(slot.dev.caps().max_batch_ops);
        let work = BufferRef { id: wb, size: ws };
        let out_buf = BufferRef { id: yb, size: ys };
        let first_out = match &pass {
            Pass::Forward { out_rows, .. } => n - out_rows,
            Pass::Layers { .. } => n,
        };
        let mut t0 = 0;
        while t0 < n {
            let m = per.min(n - t0);
            // Rows of this chunk that produce logits: its last k.
            let k = (t0 + m).saturating_sub(first_out.max(t0));
            let w = Work::new(&sh, m).filter(|w| w.end <= ws).ok_or_else(|| bad(format!("one token's activations do not fit the {ws}-byte work buffer")))?;
            // Residual rows (or token ids), positions and the RoPE table (keel's own angles, as the CPU).
            let view = slot.dev.host_view(wb)?;
            match &pass {
                Pass::Layers { x } => put_f32(&mut view[w.x() as usize..], &x[t0 * e..(t0 + m) * e]),
                Pass::Forward { tokens, .. } => {
                    for (i, &t) in tokens[t0..t0 + m].iter().enumerate() {
                        let id = i32::try_from(t).map_err(|_| bad(format!("token {t}")))?;
                        view[w.tok() as usize + 4 * i..][..4].copy_from_slice(&id.to_le_bytes());
                    }
                }
            }
            let mut cs = vec![0f32; sh.n_rot * m];
            for i in 0..m {
                let p = pos + t0 + i;
                let pv = i32::try_from(p).map_err(|_| bad(format!("position {p}")))?;
                view[w.pos() as usize + 4 * i..][..4].copy_from_slice(&pv.to_le_bytes());
                keel_core::ops::rope_angles(p, sh.rope_base, sh.n_rot, &mut cs[i * sh.n_rot..(i + 1) * sh.n_rot]);
            }
            put_f32(&mut view[w.cs() as usize..], &cs);
            let mut l = layers.start;
            let mut tail_done = k == 0;
            let mut first = true;
            while l < layers.end || !tail_done {
                let mut b = whole_layer::Builder::new(&sh, &w, work, m).ok_or_else(|| bad("layer descriptors overflow".into()))?;
                if let (true, Some((table, ..))) = (first && l == layers.start, &tail) {
                    b.add_embedding(table, &w, m, slot.embd_scale).ok_or_else(|| bad("embedding descriptors overflow".into()))?;
                }
                first = false;
                while l < layers.end {
                    if b.layers > 0 && (b.layers as u64 + 1) * layer_bytes * m as u64 > self.batch_work {
                        break;
                    }
                    let r = *slot.resident.get(&l).ok_or_else(|| bad(format!("layer {l} is not resident on this device")))?;
                    let ops = slot.blocks.get(&l).ok_or_else(|| bad(format!("layer {l} has no block on this device")))?;
                    let weights = &slot.weights;
                    let weight = |kind: WeightKind| weights.get(&(l, kind as u8)).map(|h| Weight { at: Placed { buf: h.buf, size: h.size, offset: h.offset }, dtype: h.dtype, rows: h.rows, cols: h.cols });
                    let (no, nt, nb) = (b.ops.len(), b.tensors.len(), b.buffers.len());
                    let lsh = slot.shapes.get(&l).copied().unwrap_or(sh);
                    b.add_layer(&lsh, sh.rope_base, ops, &weight, &r, m, pos + t0).map_err(|why| bad(format!("layer {l} at position {}: {why}", pos + t0)))?;
                    if !b.fits(max_ops) {
                        if b.layers == 1 {
                            return Err(bad(format!("one layer needs {} ops, {} tensors, {} buffers (with the embedding lookup, if any): more than a batch carries", b.ops.len(), b.tensors.len(), b.buffers.len())));
                        }
                        b.truncate(no, nt, nb);
                        break;
                    }
                    l += 1;
                }
                if let (false, true, Some((_, norm, out, out_bytes))) = (tail_done, l == layers.end, &tail) {
                    // The logits join the last layer batch if it has the work and room for them.
                    if b.layers == 0 || (b.layers as u64 * layer_bytes + out_bytes) * m as u64 <= self.batch_work {
                        let (no, nt, nb) = (b.ops.len(), b.tensors.len(), b.buffers.len());
                        b.add_output(&sh, &w, *norm, out, out_buf, m, k).ok_or_else(|| bad("output descriptors overflow".into()))?;
                        if b.fits(max_ops) {
                            tail_done = true;
                        } else if b.layers == 0 {
                            return Err(bad("the final norm and output projection do not fit a batch".into()));
                        } else {
                            b.undo(no, nt, nb);
                        }
                    }
                }
                let batch = Batch { buffers: &b.buffers, tensors: &b.tensors, ops: &b.ops };
                let status = slot.run_batch(&batch)?;
                if status != BatchStatus::Done {
                    let last = l.saturating_sub(1);
                    return Err(DeviceError::new(
                        slot.dev.name(),
                        ErrorKind::BadResponse,
                        format!("whole layers ..={last} ({} in the batch{}) for {m} tokens at position {} failed: {status:?}", b.layers, if tail_done && l == layers.end && k > 0 { ", with the output projection" } else { "" }, pos + t0),
                    ));
                }
            }
            match &mut pass {
                Pass::Layers { x } => {
                    let view = slot.dev.host_view(wb)?;
                    for (o, c) in x[t0 * e..(t0 + m) * e].iter_mut().zip(view[w.x() as usize..].chunks_exact(4)) {
                        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    }
                }
                Pass::Forward { logits, .. } if k > 0 => {
                    let v = tail.as_ref().map_or(0, |t| t.2.rows);
                    let row0 = t0 + m - k - first_out;
                    let view = slot.dev.host_view(yb)?;
                    for (o, c) in logits[row0 * v..(row0 + k) * v].iter_mut().zip(view.chunks_exact(4)) {
                        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    }
                }
                Pass::Forward { .. } => {}
            }
            t0 += m;
        }
        Ok(())
    }

    /// Batches submitted to all devices.
    pub fn batches(&self) -> u64 {
        self.slots.iter().map(|s| s.batches).sum()
    }

    fn run(&mut self, device: u8, id: WeightId, x: &[f32], n: usize, out: &mut [f32]) -> Result<(), DeviceError> {
        let slot = self.slots.get_mut(usize::from(device)).ok_or_else(|| DeviceError::new("placement", ErrorKind::InvalidArgument, format!("no device {device}")))?;
        let Some(w) = slot.weights.get(&(id.layer, id.kind as u8)) else {
            return Err(DeviceError::new(&slot.label, ErrorKind::InvalidArgument, format!("weight {}.{} is not on this device", id.layer, id.kind.name())));
        };
        let (xb, xs, yb, ys) = slot.io.ok_or_else(|| DeviceError::new(&slot.label, ErrorKind::Other, "no activation buffers"))?;
        let (rows, cols) = (w.rows, w.cols);
        let per = ((xs as usize / (4 * cols)).min(ys as usize / (4 * rows))).max(1);
        let (wbuf, wsize, dtype, woff) = (w.buf, w.size, w.dtype, w.offset);
        let mut t0 = 0;
        while t0 < n {
            let m = per.min(n - t0);
            let view = slot.dev.host_view(xb)?;
            for (dst, v) in view.chunks_exact_mut(4).zip(&x[t0 * cols..(t0 + m) * cols]) {
                dst.copy_from_slice(&v.to_le_bytes());
            }
            let (tensors, op) = matmul_desc(dtype, rows as u32, cols as u32, m as u32, woff)
                .ok_or_else(|| DeviceError::new(&slot.label, ErrorKind::InvalidArgument, "product too large for a descriptor"))?;
            let buffers = [BufferRef { id: wbuf, size: wsize }, BufferRef { id: xb, size: xs }, BufferRef { id: yb, size: ys }];
            let batch = Batch { buffers: &buffers, tensors: &tensors, ops: &[op] };
            let status = slot.run_batch(&batch)?;
            if status != BatchStatus::Done {
                return Err(DeviceError::new(slot.dev.name(), ErrorKind::BadResponse, format!("MatMul of {}.{} failed: {status:?}", id.layer, id.kind.name())));
            }
            let view = slot.dev.host_view(yb)?;
            for (o, b) in out[t0 * rows..(t0 + m) * rows].iter_mut().zip(view.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            t0 += m;
        }
        Ok(())
    }
}

impl Offload for Devices {
    fn matmul(&mut self, device: u8, id: WeightId, x: &[f32], n: usize, out: &mut [f32]) -> Result<(), DeviceFailed> {
        if self.error.is_some() {
            return Err(DeviceFailed { device });
        }
        self.run(device, id, x, n, out).map_err(|e| {
            self.error = Some(e);
            DeviceFailed { device }
        })
    }

    fn layers(&mut self, device: u8, layers: std::ops::Range<u16>, x: &mut [f32], n: usize, pos: usize) -> Result<(), DeviceFailed> {
        if self.error.is_some() {
            return Err(DeviceFailed { device });
        }
        self.run_pass(device, layers, n, pos, Pass::Layers { x }).map_err(|e| {
            self.error = Some(e);
            DeviceFailed { device }
        })
    }

    fn forward(&mut self, device: u8, tokens: &[u32], pos: usize, out_rows: usize, logits: &mut [f32]) -> Result<(), DeviceFailed> {
        if self.error.is_some() {
            return Err(DeviceFailed { device });
        }
        let n_layers = self.slots.get(usize::from(device)).map_or(0, |s| s.resident.keys().max().map_or(0, |&l| l + 1));
        self.run_pass(device, 0..n_layers, tokens.len(), pos, Pass::Forward { tokens, out_rows, logits }).map_err(|e| {
            self.error = Some(e);
            DeviceFailed { device }
        })
    }
}

/// What a pass of whole layers starts from and gives back.
enum Pass<'a> {
    /// Residual rows in, residual rows out.
    Layers { x: &'a mut [f32] },
    /// Token ids in, the logits of the last `out_rows` tokens out.
    Forward { tokens: &'a [u32], out_rows: usize, logits: &'a mut [f32] },
}

/// Writes `v` as little-endian f32 at the start of `dst`.
fn put_f32(dst: &mut [u8], v: &[f32]) {
    for (d, x) in dst.chunks_exact_mut(4).zip(v) {
        d.copy_from_slice(&x.to_le_bytes());
    }
}

/// Converts a weight's rows to `to` (dequantize, then keel-core's reference quantizer).
pub fn convert(kern: &Kernels, t: &keel_core::model::Tensor<'_>, to: GgmlType) -> Result<Vec<u8>, String> {
    let rb = to.row_bytes(t.cols as u64).ok_or_else(|| format!("{} columns are not whole {to} blocks", t.cols))? as usize;
    let mut out = vec![0u8; rb * t.rows];
    let mut row = vec![0f32; t.cols];
    for r in 0..t.rows {
        kern.dequantize_row(t.ty, t.row(r), &mut row).map_err(|e| format!("cannot dequantize {}: {e:?}", t.ty))?;
        quantize_row_ref(to, &row, &mut out[r * rb..(r + 1) * rb]).map_err(|e| format!("cannot quantize to {to}: {e:?}"))?;
    }
    Ok(out)
}

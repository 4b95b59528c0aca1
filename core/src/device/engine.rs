//! The device engine: one device's share of a placement ([`crate::placement`]), over
//! nothing but the HAL (`keel_npu_hal::{Device, SharedBuffers, Queue}`) and a
//! [`DelayNs`] for its bounded waits. A host supplies the device; everything else is
//! here, for every device and architecture.
//!
//! - **Plan**: a [`DeviceEngine`] is a [`DeviceInfo`]: it asks its device, through the
//!   HAL's `supports(op)` on real descriptors, which weights it can hold (and how many
//!   bytes they take in the Tiles32 layout), which layers it runs whole
//!   ([`super::lower::probe_ops`]) and whether it looks up embeddings.
//! - **Load** ([`DeviceEngine::load`]): converts (types the device lacks → the policy's
//!   type, with keel-core's reference quantizer) and repacks every weight placed here,
//!   one 32-row group at a time with the caller's scratch, into as few shared buffers as
//!   the device's largest mapping allows, 128-byte aligned; then, for the layers that run
//!   whole here, their vectors (norm weights, biases, head norms, conv taps, gates) in
//!   one buffer, the F16 KV caches (`kv_ctx` positions per attention layer) and the
//!   delta-net layers' conv and recurrent states; the token embedding's copy and the
//!   output norm when the whole forward pass runs here; and the work and output buffers.
//! - **Pipelining** ([`DeviceEngine::in_flight`], default [`DEFAULT_IN_FLIGHT`]): the
//!   batches of a whole-layer pass go out back to back, up to that many in flight (the
//!   HAL's queue runs them in order), and its chunks of tokens alternate between two
//!   work buffers, so the host writes one chunk's inputs and reads another's outputs
//!   while the device runs; it waits only for a result it needs or for room. A failed
//!   batch is an error naming it, after the others in flight are waited for. A single
//!   sequence's decode step cannot overlap the next (its token is sampled from this
//!   one's logits); the products of `matmul` mode go one at a time. Across devices,
//!   [`DeviceEngine::layers_begin`] leaves a one-chunk pass in flight and returns, and
//!   [`DeviceEngine::layers_end`] collects it: the session runs the prompt's chunks as a
//!   pipeline (this device on the next chunk while the others run this one).
//! - **Run**: one batch (one MatMul op) per product and chunk of tokens
//!   ([`DeviceEngine::matmul`]); batches of whole layers ([`DeviceEngine::layers`], as
//!   many consecutive layers per batch as the device's op limit, the wire's tables and
//!   [`DeviceEngine::batch_work`] allow), and the whole forward pass
//!   ([`DeviceEngine::forward`]: token ids in, logits out).
//!
//! No allocation anywhere: the per-layer tables are the caller's storage (`S`, a
//! `&mut [LayerSlot]` or anything that derefs to one, [`LayerSlot::EMPTY`] each), the
//! batch builder lives in the engine and is reused, batches are tracked by the HAL's
//! [`Tracker`] (up to [`DeviceEngine::depth`] in flight), and nothing is formatted: errors are
//! [`EngineError`]s of numbers and static text that the host describes.

use core::ops::{DerefMut, Range};

use embedded_hal::delay::DelayNs;
use keel_npu_hal::device::{BatchStatus, Device, Queue, SharedBuffers};
use keel_npu_hal::op::{Batch, BufferRef, DType, Layout, OpDesc, OpKind, Support, TensorDesc};
use keel_npu_hal::wait::{Tracker, WaitError, WaitPolicy};
use keel_npu_hal::{tile, BufferId, ErrorKind};

use super::lower::{cache_bytes, probe_embedding, probe_ops, state_bytes, Builder, DeltaResident, LowerError, Placed, Resident, Table, Weight, Work};
use crate::block::{layer_ops, BlockOps, Op, Param};
use crate::ggml_type::GgmlType;
use crate::model::{Mixer, Model, Tensor};
use crate::placement::{for_each_weight, layer_shape, DeviceFailed, DeviceInfo, LayerShape, Offload, Placement, WeightId, WeightKind, Where, OUTPUT_LAYER};
use crate::quant::{quantize_row_ref, Kernels};

/// Bytes of shared memory kept for one product's activations (the work buffer) and
/// outputs (the output buffer), each.
pub const IO_BYTES: u64 = 8 << 20;

/// Default for [`DeviceEngine::batch_work`]: weight bytes × tokens one batch of whole
/// layers may stream. The emulated DSP takes about 0.06 s per MiB·token (SmolLM2 Q8_0:
/// 144 MiB per token at ~0.12 tokens/s), so 32 MiB keeps a batch near 2 s, the size of
/// the largest product batch (SmolLM2's output projection, 28 MiB) and far below a
/// device's hang timeout.
pub const BATCH_WORK: u64 = 32 << 20;

/// Alignment of a weight or vector inside a device buffer (one HVX vector).
pub const WEIGHT_ALIGN: u64 = 128;

/// Batches the engine's tracker keeps in flight at most.
pub const IN_FLIGHT: usize = 4;

/// Default of [`DeviceEngine::in_flight`]: two batches, one running while the host
/// prepares or collects the other.
pub const DEFAULT_IN_FLIGHT: u8 = 2;

/// Most buffers the weights of one device are packed into.
pub const MAX_WEIGHT_BUFFERS: usize = 8;

/// Most buffers the KV caches of one device are packed into.
pub const MAX_CACHE_BUFFERS: usize = 8;

/// Widest RoPE table row (`n_rot`) the engine computes on the host.
pub const MAX_ROT: usize = 512;

/// Matrix kinds of a layer (every [`WeightKind`] but the output projection).
const LAYER_KINDS: usize = WeightKind::Output as usize;

/// The HAL type of a ggml weight type, if the HAL has a tiled product for it.
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

/// What one layer has on one device: its products' weights and, when it runs whole
/// there, its block's ops, shape and resident tensors.
#[derive(Clone, Debug)]
pub struct LayerSlot {
    weights: [Option<Weight>; LAYER_KINDS],
    whole: Option<Whole>,
}

#[derive(Clone, Debug)]
struct Whole {
    ops: BlockOps,
    shape: LayerShape,
    resident: Resident,
}

impl LayerSlot {
    /// Nothing on the device.
    pub const EMPTY: LayerSlot = LayerSlot { weights: [None; LAYER_KINDS], whole: None };
}

/// What an engine allocated and holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes of repacked weights, layer vectors and the embedding's copy.
    pub model_bytes: u64,
    /// Bytes of KV caches and recurrent states.
    pub context_bytes: u64,
    /// Bytes of the work and output buffers.
    pub compute_bytes: u64,
    /// Weights held.
    pub weights: usize,
    /// Of which converted at load.
    pub converted: usize,
    /// Batches submitted.
    pub batches: u64,
    /// Passes [`DeviceEngine::layers_begin`] left in flight (chunks pipelined).
    pub begun: u64,
}

impl Stats {
    /// `model + context + compute`.
    pub fn used(&self) -> u64 {
        self.model_bytes + self.context_bytes + self.compute_bytes
    }
}

/// What a failed batch was doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// One product of weight `id`.
    MatMul(WeightId),
    /// Whole layers `first..=last` (with the logits when `output`).
    Layers {
        /// First layer of the batch.
        first: u16,
        /// Last layer of the batch.
        last: u16,
        /// The batch ended with the final norm and output projection.
        output: bool,
    },
}

/// Why the engine could not do what it was asked.
#[derive(Debug, PartialEq)]
pub enum EngineError<E> {
    /// The device reported an error.
    Device(E),
    /// The bounded wait failed (timeout, unknown completion, full table).
    Wait(WaitError<E>),
    /// A batch completed with a failure.
    Batch {
        /// What it was.
        stage: Stage,
        /// How it ended.
        status: BatchStatus,
        /// Tokens in the batch.
        tokens: usize,
        /// Position of its first token.
        pos: usize,
    },
    /// A layer could not be lowered to a batch.
    Lower {
        /// The layer.
        layer: u16,
        /// Why.
        why: LowerError,
    },
    /// A load or run precondition failed (with the layer, when there is one).
    Invalid {
        /// What is wrong.
        what: &'static str,
        /// The layer concerned, if any.
        layer: Option<u16>,
    },
    /// The device lacks a type the placement asked for.
    NoType(GgmlType),
}

impl<E: keel_npu_hal::Error> keel_npu_hal::Error for EngineError<E> {
    fn kind(&self) -> ErrorKind {
        match self {
            EngineError::Device(e) => e.kind(),
            EngineError::Wait(w) => w.kind(),
            EngineError::Batch { .. } => ErrorKind::BadResponse,
            EngineError::Lower { .. } | EngineError::Invalid { .. } => ErrorKind::InvalidArgument,
            EngineError::NoType(_) => ErrorKind::Unsupported,
        }
    }
}

impl<E: core::fmt::Debug> core::fmt::Display for EngineError<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EngineError::Device(e) => write!(f, "{e:?}"),
            EngineError::Wait(w) => write!(f, "{w:?}"),
            EngineError::Batch { stage: Stage::MatMul(id), status, tokens, pos: _ } => {
                write!(f, "MatMul of {}.{} for {tokens} tokens failed: {status:?}", id.layer, id.kind.name())
            }
            EngineError::Batch { stage: Stage::Layers { first, last, output }, status, tokens, pos } => write!(
                f,
                "whole layers {first}..={last}{} for {tokens} tokens at position {pos} failed: {status:?}",
                if *output { " with the output projection" } else { "" }
            ),
            EngineError::Lower { layer, why } => write!(f, "layer {layer}: {why}"),
            EngineError::Invalid { what, layer: Some(l) } => write!(f, "layer {l}: {what}"),
            EngineError::Invalid { what, layer: None } => f.write_str(what),
            EngineError::NoType(t) => write!(f, "the device has no type for {t}"),
        }
    }
}

fn invalid<E>(what: &'static str, layer: Option<u16>) -> EngineError<E> {
    EngineError::Invalid { what, layer }
}

/// The caller's scratch for converting weights at load: one F32 row of the widest
/// weight and 32 rows of it in the device type ([`DeviceEngine::load_scratch`] sizes it).
pub struct LoadScratch<'a> {
    /// `max cols` floats.
    pub row: &'a mut [f32],
    /// 32 rows of the widest converted weight, in its device type.
    pub group: &'a mut [u8],
}

/// One device and its share of a model.
pub struct DeviceEngine<D: keel_npu_hal::ErrorType, Dl, S> {
    /// The device.
    pub dev: D,
    delay: Dl,
    policy: WaitPolicy,
    inflight: Tracker<IN_FLIGHT>,
    builder: Builder,
    layers: S,
    /// Index of this device in the placement.
    index: u8,
    output: Option<Weight>,
    /// The token embedding's copy and the output norm weight (whole forward pass here).
    forward: Option<(Table, Placed)>,
    /// The shape whole layers here share (layout of the work buffer).
    shape: Option<LayerShape>,
    embd_scale: f32,
    /// Work (activations) and output buffers.
    io: Option<(BufferRef, BufferRef)>,
    /// The second work buffer of whole-layer passes (loaded when [`DeviceEngine::depth`]
    /// is at least 2): one chunk of tokens runs from each while the host fills the other.
    work2: Option<BufferRef>,
    /// Batches this engine keeps in flight at most (asked for; [`DeviceEngine::depth`]
    /// caps it by the device's `max_in_flight` and [`IN_FLIGHT`]). 1: each batch is
    /// submitted and waited for before the next. Set before [`DeviceEngine::load`].
    pub in_flight: u8,
    /// Most weight bytes × tokens one batch of whole layers streams (at least one layer
    /// for one token goes in every batch): bounds a batch's run time.
    pub batch_work: u64,
    /// What was allocated, held and submitted.
    pub stats: Stats,
    /// The first failure of an [`Offload`] call (later calls are refused).
    pub error: Option<EngineError<D::Error>>,
    /// A pass [`DeviceEngine::layers_begin`] left in flight, until
    /// [`DeviceEngine::layers_end`] collects it.
    begun: Option<Begun>,
}

impl<D, Dl, S> DeviceEngine<D, Dl, S>
where
    D: Device + SharedBuffers + Queue,
    Dl: DelayNs,
    S: DerefMut<Target = [LayerSlot]>,
{
    /// An engine over `dev` (device `index` of a placement), waiting for batches with
    /// `delay` under `policy`; `layers` holds one [`LayerSlot::EMPTY`] per model layer
    /// ([`DeviceEngine::load`] refuses fewer).
    pub fn new(dev: D, index: u8, delay: Dl, policy: WaitPolicy, layers: S) -> Self {
        DeviceEngine {
            dev,
            delay,
            policy,
            inflight: Tracker::new(),
            builder: Builder::new(),
            layers,
            index,
            output: None,
            forward: None,
            shape: None,
            embd_scale: 1.0,
            io: None,
            work2: None,
            in_flight: DEFAULT_IN_FLIGHT,
            batch_work: BATCH_WORK,
            stats: Stats::default(),
            error: None,
            begun: None,
        }
    }

    /// Replaces the layer table (one [`LayerSlot::EMPTY`] per model layer) before
    /// [`DeviceEngine::load`].
    pub fn set_layers(&mut self, layers: S) {
        self.layers = layers;
    }

    /// Batches in flight at most: [`DeviceEngine::in_flight`] within the device's
    /// `max_in_flight` and [`IN_FLIGHT`], at least 1.
    pub fn depth(&self) -> usize {
        usize::from(self.in_flight).min(usize::from(self.dev.caps().max_in_flight)).min(IN_FLIGHT).max(1)
    }

    /// Batches submitted and not yet collected (0 between calls: a call returns only
    /// when every batch it submitted has been collected, or, after an error, waited for;
    /// except a pass [`DeviceEngine::layers_begin`] left in flight).
    pub fn batches_in_flight(&self) -> usize {
        self.inflight.in_flight()
    }

    /// Floats and bytes of [`LoadScratch`] that loading under `placement` needs
    /// on this device.
    pub fn load_scratch(&self, placement: &Placement<'_>) -> (usize, usize) {
        let (mut floats, mut bytes) = (0usize, 0usize);
        for d in placement.decisions() {
            if d.place == Where::Device(self.index) && d.converted() {
                floats = floats.max(d.shape.1);
                bytes = bytes.max(d.device_ty.row_bytes(d.shape.1 as u64).unwrap_or(0) as usize * tile::TILE_ROWS as usize);
            }
        }
        (floats, bytes)
    }

    fn slot(&self, id: WeightId) -> Option<&Weight> {
        if id.layer == OUTPUT_LAYER {
            return self.output.as_ref();
        }
        self.layers.get(usize::from(id.layer))?.weights.get(id.kind as usize)?.as_ref()
    }

    fn alloc(&mut self, size: u64) -> Result<(BufferId, u64), EngineError<D::Error>> {
        let id = self.dev.alloc(size).map_err(EngineError::Device)?;
        let len = self.dev.host_view(id).map_err(EngineError::Device)?.len() as u64;
        Ok((id, len))
    }

    fn view(&mut self, at: Placed) -> Result<&mut [u8], EngineError<D::Error>> {
        let v = self.dev.host_view(at.buf).map_err(EngineError::Device)?;
        v.get_mut(at.offset as usize..).ok_or(invalid("a tensor lies outside its buffer", None))
    }

    /// Converts and repacks every weight `placement` puts on this device into its shared
    /// memory, loads what the layers that run whole here keep on the device, and
    /// reserves the work and output buffers. Allocates device memory only.
    pub fn load(&mut self, model: &Model<'_>, placement: &Placement<'_>, kern: &Kernels, scratch: &mut LoadScratch<'_>) -> Result<(), EngineError<D::Error>> {
        if self.layers.len() < model.layers.len() {
            return Err(invalid("fewer layer slots than the model has layers", None));
        }
        let here = Where::Device(self.index);
        let max = self.dev.buffer_rules().max_size.min(u64::from(u32::MAX));
        // Layout: each placed weight at a 128-byte aligned offset of as few buffers as
        // the largest mapping allows (the device maps a bounded number of buffers).
        let mut sizes: heapless::Vec<u64, MAX_WEIGHT_BUFFERS> = heapless::Vec::new();
        let mut err = None;
        let mut place = |id: WeightId, t: &Tensor<'_>, this: &mut Self| -> Result<(), EngineError<D::Error>> {
            let Some(d) = placement.decision(id).filter(|d| d.place == here) else { return Ok(()) };
            let dtype = hal_dtype(d.device_ty).ok_or(EngineError::NoType(d.device_ty))?;
            let packed = tile::packed_size(dtype, t.rows as u32, t.cols as u32).ok_or(invalid("a weight has no tiled layout", Some(id.layer)))? as u64;
            if sizes.last().is_none_or(|&cur| cur.next_multiple_of(WEIGHT_ALIGN) + packed > max) {
                sizes.push(0).map_err(|_| invalid("the weights need more buffers than a device maps", None))?;
            }
            let cur = sizes.last_mut().ok_or(invalid("no weight buffer", None))?;
            let off = cur.next_multiple_of(WEIGHT_ALIGN);
            *cur = off + packed;
            // The buffer's index for now; its id once allocated.
            let at = Placed { buf: BufferId(sizes.len() as u32 - 1), size: 0, offset: off as u32 };
            let w = Some(Weight { at, dtype, rows: t.rows, cols: t.cols });
            if id.layer == OUTPUT_LAYER {
                this.output = w;
            } else {
                this.layers[usize::from(id.layer)].weights[id.kind as usize] = w;
            }
            Ok(())
        };
        for_each_weight(model, |id, t| {
            if err.is_none() {
                err = place(id, t, self).err();
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        let mut ids: heapless::Vec<(BufferId, u64), MAX_WEIGHT_BUFFERS> = heapless::Vec::new();
        for &size in &sizes {
            let b = self.alloc(size)?;
            self.stats.model_bytes += b.1;
            let _ = ids.push(b);
        }
        // Fill: convert (if the device lacks the file's type) and repack, one row group
        // at a time.
        let mut err = None;
        for_each_weight(model, |id, t| {
            if err.is_none() {
                err = self.fill(id, t, placement, kern, scratch, &ids).err();
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        for &(b, _) in &ids {
            self.dev.map(b).map_err(EngineError::Device)?;
        }
        self.load_layers(model, placement)?;
        if self.stats.weights > 0 || self.shape.is_some() {
            let (x, xs) = self.alloc(IO_BYTES)?;
            let (y, ys) = self.alloc(IO_BYTES)?;
            self.dev.map(x).map_err(EngineError::Device)?;
            self.dev.map(y).map_err(EngineError::Device)?;
            self.stats.compute_bytes = xs + ys;
            self.io = Some((BufferRef { id: x, size: xs }, BufferRef { id: y, size: ys }));
            if self.shape.is_some() && self.depth() > 1 {
                let (x2, xs2) = self.alloc(IO_BYTES)?;
                self.dev.map(x2).map_err(EngineError::Device)?;
                self.stats.compute_bytes += xs2;
                self.work2 = Some(BufferRef { id: x2, size: xs2 });
            }
        }
        Ok(())
    }

    /// Repacks weight `id` (converted when its decision says so) into its place.
    fn fill(&mut self, id: WeightId, t: &Tensor<'_>, placement: &Placement<'_>, kern: &Kernels, scratch: &mut LoadScratch<'_>, ids: &[(BufferId, u64)]) -> Result<(), EngineError<D::Error>> {
        let Some(d) = placement.decision(id).filter(|d| d.place == Where::Device(self.index)) else { return Ok(()) };
        let mut w = *self.slot(id).ok_or(invalid("a placed weight has no slot", Some(id.layer)))?;
        let (buf, size) = ids[w.at.buf.0 as usize];
        w.at.buf = buf;
        w.at.size = size;
        if id.layer == OUTPUT_LAYER {
            self.output = Some(w);
        } else {
            self.layers[usize::from(id.layer)].weights[id.kind as usize] = Some(w);
        }
        let (rows, cols) = (t.rows as u32, t.cols as u32);
        let packed = tile::packed_size(w.dtype, rows, cols).unwrap_or(0);
        let converted = d.converted();
        let src_rb = t.ty.row_bytes(t.cols as u64).unwrap_or(0) as usize;
        let dst_rb = d.device_ty.row_bytes(t.cols as u64).unwrap_or(0) as usize;
        let view = self.view(w.at)?;
        let dst = view.get_mut(..packed).ok_or(invalid("a weight lies outside its buffer", Some(id.layer)))?;
        for g in 0..tile::groups(rows) {
            let r0 = g * tile::TILE_ROWS as usize;
            let n = (t.rows - r0).min(tile::TILE_ROWS as usize);
            let src: &[u8] = if converted {
                let group = scratch.group.get_mut(..n * dst_rb).ok_or(invalid("the load scratch is too small", Some(id.layer)))?;
                let row = scratch.row.get_mut(..t.cols).ok_or(invalid("the load scratch is too small", Some(id.layer)))?;
                let src = t.data.get(r0 * src_rb..(r0 + n) * src_rb).ok_or(invalid("a weight's rows are short", Some(id.layer)))?;
                convert_rows(kern, t.ty, src, d.device_ty, row, group).map_err(|_| EngineError::NoType(d.device_ty))?;
                group
            } else {
                t.data.get(r0 * src_rb..(r0 + n) * src_rb).ok_or(invalid("a weight's rows are short", Some(id.layer)))?
            };
            tile::repack_group(w.dtype, rows, cols, g, src, dst).map_err(|_| invalid("a weight cannot be repacked", Some(id.layer)))?;
        }
        self.stats.weights += 1;
        self.stats.converted += usize::from(converted);
        Ok(())
    }

    /// Loads what the layers that run whole here keep on the device: their vectors in one
    /// buffer (attention and feed-forward norm weights first, two per layer, then the
    /// output norm when the forward pass runs here, then each layer's biases, head norms,
    /// delta-net tensors and post-norms), each attention layer's K and V cache (F16,
    /// `placement.kv_ctx()` positions) packed into buffers of at most the largest
    /// mapping, the delta-net layers' states in one buffer, and the token embedding's
    /// copy (the file's type and rows) in its own.
    fn load_layers(&mut self, model: &Model<'_>, placement: &Placement<'_>) -> Result<(), EngineError<D::Error>> {
        let index = self.index;
        let mine = |l: usize| placement.layer_device(l) == Some(index);
        let Some(first) = (0..model.layers.len()).find(|&l| mine(l)) else { return Ok(()) };
        let shape = layer_shape(model, first).map_err(|w| invalid(w, Some(first as u16)))?;
        if shape.n_rot > MAX_ROT {
            return Err(invalid("RoPE rotates more dimensions than the engine's table row holds", Some(first as u16)));
        }
        let is_delta = |l: usize| matches!(model.layers[l].mixer, Mixer::DeltaNet(_));
        let (mut n_layers, mut n_attn, mut extras) = (0u64, 0u64, 0u64);
        for l in (0..model.layers.len()).filter(|&l| mine(l)) {
            if !layer_shape(model, l).is_ok_and(|s| s.same_layout(&shape)) {
                return Err(invalid("this layer differs in shape from the first on the device; whole layers on one device share one shape", Some(l as u16)));
            }
            n_layers += 1;
            n_attn += u64::from(!is_delta(l));
            extras += vector_bytes(model, l, &shape);
        }
        let norm_bytes = vec_bytes(shape.n_embd);
        let forward = placement.forward_placed().is_some_and(|(d, _)| d == self.index);
        let n_norms = 2 * n_layers + u64::from(forward);
        let (nbuf, nsize) = self.alloc(norm_bytes * n_norms + extras)?;
        self.stats.model_bytes += nsize;
        let cache = cache_bytes(&shape, placement.kv_ctx());
        let max = self.dev.buffer_rules().max_size.min(u64::from(u32::MAX));
        let per_buf = (max / (2 * cache)).max(1);
        let mut kv_bufs: heapless::Vec<(BufferId, u64), MAX_CACHE_BUFFERS> = heapless::Vec::new();
        let mut left = n_attn;
        while left > 0 {
            let n = left.min(per_buf);
            let b = self.alloc(2 * cache * n)?;
            self.stats.context_bytes += b.1;
            kv_bufs.push(b).map_err(|_| invalid("the KV caches need more buffers than a device maps", None))?;
            left -= n;
        }
        let (conv_b, ssm_b) = shape.ssm.map_or((0, 0), |d| state_bytes(&d));
        let n_delta = n_layers - n_attn;
        let state_buf = if n_delta > 0 {
            let b = self.alloc((conv_b + ssm_b) * n_delta)?;
            self.stats.context_bytes += b.1;
            Some(b)
        } else {
            None
        };
        let p = |offset: u64, (buf, size): (BufferId, u64)| Placed { buf, size, offset: offset as u32 };
        let nb = (nbuf, nsize);
        let mut extra_at = norm_bytes * n_norms;
        let (mut i, mut ai, mut si) = (0u64, 0u64, 0u64);
        for l in (0..model.layers.len()).filter(|&l| mine(l)) {
            let ly = &model.layers[l];
            let lu = l as u16;
            let (a, f) = (2 * i * norm_bytes, (2 * i + 1) * norm_bytes);
            i += 1;
            let attn_norm = self.put(p(a, nb), Some(ly.attn_norm), shape.n_embd, lu)?;
            let ffn_norm = self.put(p(f, nb), Some(ly.ffn_norm), shape.n_embd, lu)?;
            // This layer's vectors, after every norm of the buffer.
            let mut at = extra_at;
            extra_at += vector_bytes(model, l, &shape);
            let mut next = |this: &mut Self, param: Param, floats: usize| -> Result<Placed, EngineError<D::Error>> {
                let placed = this.put(p(at, nb), param.of(ly), floats, lu)?;
                at += vec_bytes(floats);
                Ok(placed)
            };
            let (qd, kvd, hd) = (shape.n_head * shape.head_dim, shape.kv_dim(), shape.head_dim);
            let (kv, v_offset, mut biases, mut head_norms, mut delta) = (p(0, nb), 0, None, None, None);
            let (mut kv, mut v_offset) = (kv, v_offset);
            match (&ly.mixer, shape.ssm, state_buf) {
                (Mixer::DeltaNet(_), Some(s), Some(sb)) => {
                    let taps = next(self, Param::Conv1d, s.d_conv * s.conv_channels())?;
                    let (dt_bias, a) = (next(self, Param::DtBias, s.n_v_heads)?, next(self, Param::A, s.n_v_heads)?);
                    let norm = next(self, Param::SsmNorm, s.d_state)?;
                    let base = si * (conv_b + ssm_b);
                    si += 1;
                    delta = Some(DeltaResident { taps, dt_bias, a, norm, conv_state: p(base, sb), ssm_state: p(base + conv_b, sb) });
                }
                (Mixer::DeltaNet(_), ..) => return Err(invalid("a delta-net layer without the model's delta-net dimensions", Some(lu))),
                (Mixer::Attention(_), ..) => {
                    let kb = kv_bufs[(ai / per_buf) as usize];
                    let k_off = (ai % per_buf) * 2 * cache;
                    ai += 1;
                    (kv, v_offset) = (p(k_off, kb), (k_off + cache) as u32);
                    if shape.biases {
                        biases = Some([next(self, Param::QBias, qd)?, next(self, Param::KBias, kvd)?, next(self, Param::VBias, kvd)?]);
                    }
                    if shape.head_norms {
                        head_norms = Some([next(self, Param::QNorm, hd)?, next(self, Param::KNorm, hd)?]);
                    }
                }
            }
            let post_norms = if shape.post_norms { Some([next(self, Param::AttnPostNorm, shape.n_embd)?, next(self, Param::FfnPostNorm, shape.n_embd)?]) } else { None };
            let own = layer_shape(model, l).map_err(|w| invalid(w, Some(lu)))?;
            let resident = Resident { attn_norm, ffn_norm, biases, head_norms, post_norms, kv, v_offset, delta };
            self.layers[l].whole = Some(Whole { ops: layer_ops(&model.hp, l, ly), shape: own, resident });
        }
        if forward {
            let norm = self.put(p(2 * n_layers * norm_bytes, nb), Some(model.output_norm), shape.n_embd, OUTPUT_LAYER)?;
            let t = &model.tok_embd;
            let dtype = hal_row_dtype(t.ty).ok_or(EngineError::NoType(t.ty))?;
            let (ebuf, esize) = self.alloc(t.data.len() as u64)?;
            self.view(Placed { buf: ebuf, size: esize, offset: 0 })?[..t.data.len()].copy_from_slice(t.data);
            self.dev.map(ebuf).map_err(EngineError::Device)?;
            self.stats.model_bytes += esize;
            self.forward = Some((Table { at: Placed { buf: ebuf, size: esize, offset: 0 }, dtype, rows: t.rows, cols: t.cols }, norm));
        }
        self.dev.map(nbuf).map_err(EngineError::Device)?;
        for &(b, _) in kv_bufs.iter().chain(state_buf.iter()) {
            self.dev.map(b).map_err(EngineError::Device)?;
        }
        self.shape = Some(shape);
        self.embd_scale = model.hp.embd_scale;
        Ok(())
    }

    /// Copies the first `floats` F32 values of `t` to `at`.
    fn put(&mut self, at: Placed, t: Option<Tensor<'_>>, floats: usize, layer: u16) -> Result<Placed, EngineError<D::Error>> {
        let t = t.ok_or(invalid("a norm weight, bias or delta-net vector is missing", Some(layer)))?;
        let src = t.data.get(..4 * floats).ok_or(invalid("a layer vector is shorter than its shape", Some(layer)))?;
        self.view(at)?.get_mut(..4 * floats).ok_or(invalid("a layer vector lies outside its buffer", Some(layer)))?.copy_from_slice(src);
        Ok(at)
    }

    /// `out[i · rows + r] = Σ_k W[r, k] · x[i · cols + k]` for the `n` rows of `x`, with
    /// weight `id` held here: one batch per chunk of tokens the activation buffers hold.
    pub fn matmul(&mut self, id: WeightId, x: &[f32], n: usize, out: &mut [f32]) -> Result<(), EngineError<D::Error>> {
        let layer = Some(id.layer);
        self.idle()?;
        let w = *self.slot(id).ok_or(invalid("the weight is not on this device", layer))?;
        let (xb, yb) = self.io.ok_or(invalid("no activation buffers were loaded", None))?;
        let (rows, cols) = (w.rows, w.cols);
        if x.len() < n * cols || out.len() < n * rows {
            return Err(invalid("fewer activations or outputs than the product's tokens need", layer));
        }
        let per = ((xb.size as usize / (4 * cols)).min(yb.size as usize / (4 * rows))).max(1);
        let mut t0 = 0;
        while t0 < n {
            let m = per.min(n - t0);
            put_f32(self.dev.host_view(xb.id).map_err(EngineError::Device)?, &x[t0 * cols..(t0 + m) * cols]);
            let (tensors, op) = matmul_desc(w.dtype, rows as u32, cols as u32, m as u32, w.at.offset).ok_or(invalid("the product is too large for a descriptor", layer))?;
            let buffers = [BufferRef { id: w.at.buf, size: w.at.size }, xb, yb];
            let status = submit_wait(&mut self.inflight, &mut self.dev, &mut self.delay, self.policy, &mut self.stats, Batch { buffers: &buffers, tensors: &tensors, ops: &[op] })?;
            if status != BatchStatus::Done {
                return Err(EngineError::Batch { stage: Stage::MatMul(id), status, tokens: m, pos: 0 });
            }
            get_f32(&mut out[t0 * rows..(t0 + m) * rows], self.dev.host_view(yb.id).map_err(EngineError::Device)?);
            t0 += m;
        }
        Ok(())
    }

    /// Runs layers `layers` (whole here) for `n` tokens at positions `pos ..` over the
    /// residual rows `x` (`n × n_embd`, replaced by the rows after the last layer).
    pub fn layers(&mut self, layers: Range<u16>, x: &mut [f32], n: usize, pos: usize) -> Result<(), EngineError<D::Error>> {
        self.run_pass(layers, n, pos, Pass::Layers { x }, false).map(|_| ())
    }

    /// [`DeviceEngine::layers`] without waiting: writes the inputs from `x`, submits the
    /// pass's batches and returns `Ok(true)`, the pass in flight until
    /// [`DeviceEngine::layers_end`] (every other call is refused until then). `Ok(false)`,
    /// nothing submitted: one batch at a time ([`DeviceEngine::depth`] 1) or more tokens
    /// than one chunk of the work buffer. A failure waits for what it submitted.
    pub fn layers_begin(&mut self, layers: Range<u16>, x: &[f32], n: usize, pos: usize) -> Result<bool, EngineError<D::Error>> {
        if self.depth() < 2 {
            self.idle()?;
            return Ok(false);
        }
        self.run_pass(layers, n, pos, Pass::Begin { x }, true)
    }

    /// Waits for the pass [`DeviceEngine::layers_begin`] left in flight and reads its
    /// residual rows into `x`; a failed batch is an error naming it, after the rest of
    /// the pass is waited for.
    pub fn layers_end(&mut self, x: &mut [f32]) -> Result<(), EngineError<D::Error>> {
        let Begun { fl, outs, n } = self.begun.take().ok_or(invalid("no pass was begun on this device", None))?;
        if x.len() < n * outs.e {
            self.begun = Some(Begun { fl, outs, n });
            return Err(invalid("fewer residual values than the pass's tokens need", None));
        }
        self.finish(fl, Pass::Layers { x }, &outs)
    }

    /// Refuses a call while a begun pass is in flight.
    fn idle(&self) -> Result<(), EngineError<D::Error>> {
        match self.begun {
            Some(_) => Err(invalid("a pass begun with layers_begin is still in flight; end it first", None)),
            None => Ok(()),
        }
    }

    /// Collects every batch of `fl`, reading its chunks' outputs into `pass`; after a
    /// failure the rest are waited for (each wait bounded by the policy) and dropped.
    fn finish(&mut self, mut fl: Flight, mut pass: Pass<'_>, outs: &Outs) -> Result<(), EngineError<D::Error>> {
        let mut r = Ok(());
        while r.is_ok() && !fl.batches.is_empty() {
            r = retire(&mut self.inflight, &mut self.dev, &mut self.delay, self.policy, &mut fl, &mut pass, outs);
        }
        self.abandon(fl);
        r
    }

    /// Waits for every batch of `fl` (each wait bounded by the policy) and drops its results.
    fn abandon(&mut self, mut fl: Flight) {
        while let Some(b) = fl.batches.pop_front() {
            let _ = self.inflight.wait(&mut self.dev, b.seq, &mut self.delay, self.policy);
        }
    }

    /// Runs the whole forward pass here for `tokens` at positions `pos ..`: the logits of
    /// the last `out_rows` tokens into `logits` (`out_rows × n_vocab`).
    pub fn forward(&mut self, tokens: &[u32], pos: usize, out_rows: usize, logits: &mut [f32]) -> Result<(), EngineError<D::Error>> {
        let n_layers = self.layers.iter().rposition(|s| s.whole.is_some()).map_or(0, |l| l as u16 + 1);
        self.run_pass(0..n_layers, tokens.len(), pos, Pass::Forward { tokens, out_rows, logits }, false).map(|_| ())
    }

    /// Runs layers `layers` for `n` tokens at positions `pos..`: with [`Pass::Layers`]
    /// over the residual rows given, with [`Pass::Forward`] from the tokens to the logits
    /// (the embedding lookup in the first batch of each chunk of tokens, the final norm
    /// and output projection in the last one when it still fits the batch work and
    /// tables, else in a batch of their own). With `keep` (a [`Pass::Begin`]), the
    /// pass's one chunk is left in flight in [`DeviceEngine::begun`] (`Ok(true)`), or
    /// nothing is submitted if it takes more than one chunk (`Ok(false)`).
    fn run_pass(&mut self, layers: Range<u16>, n: usize, pos: usize, mut pass: Pass<'_>, keep: bool) -> Result<bool, EngineError<D::Error>> {
        self.idle()?;
        let sh = self.shape.ok_or(invalid("no whole layers were loaded on this device", None))?;
        let (work, out_buf) = self.io.ok_or(invalid("no work buffer was loaded", None))?;
        let (ws, ys) = (work.size.min(self.work2.map_or(work.size, |w| w.size)), out_buf.size);
        let e = sh.n_embd;
        match &pass {
            Pass::Layers { x } if x.len() < n * e => return Err(invalid("fewer residual values than the pass's tokens need", None)),
            Pass::Begin { x } if x.len() < n * e => return Err(invalid("fewer residual values than the pass's tokens need", None)),
            _ => {}
        }
        // Weight bytes one layer streams per token: the most of any layer of the range.
        let mut layer_bytes = 1u64;
        for l in layers.clone() {
            let slot = self.layers.get(usize::from(l)).ok_or(invalid("no such layer", Some(l)))?;
            let whole = slot.whole.as_ref().ok_or(invalid("the layer is not resident on this device", Some(l)))?;
            let mut bytes = 0u64;
            for op in whole.ops.iter() {
                if let Op::MatMul { w: kind, .. } = op {
                    let h = slot.weights[*kind as usize].as_ref().ok_or(EngineError::Lower { layer: l, why: LowerError::MissingWeight(*kind) })?;
                    bytes += tile::packed_size(h.dtype, h.rows as u32, h.cols as u32).unwrap_or(0) as u64;
                }
            }
            layer_bytes = layer_bytes.max(bytes);
        }
        // A new sequence: the delta-net layers' states start from zero (as the CPU's).
        if pos == 0 {
            let (conv_b, ssm_b) = sh.ssm.map_or((0, 0), |s| state_bytes(&s));
            for l in layers.clone() {
                if let Some(d) = self.layers[usize::from(l)].whole.as_ref().and_then(|w| w.resident.delta) {
                    self.view(d.conv_state)?.get_mut(..conv_b as usize).ok_or(invalid("a conv state lies outside its buffer", Some(l)))?.fill(0);
                    self.view(d.ssm_state)?.get_mut(..ssm_b as usize).ok_or(invalid("a recurrent state lies outside its buffer", Some(l)))?.fill(0);
                }
            }
        }
        // The forward pass's embedding table, output norm and output weight.
        let mut tail = None;
        if let Pass::Forward { out_rows, logits, tokens } = &pass {
            let (table, norm) = self.forward.ok_or(invalid("the token embedding is not on this device", None))?;
            let out = self.output.ok_or(invalid("the output projection is not on this device", None))?;
            if tokens.len() != n || logits.len() < out_rows * out.rows || *out_rows > n {
                return Err(invalid("the logits do not hold the rows asked for", None));
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
                return Err(invalid("one row of logits does not fit the output buffer", None));
            }
        }
        while per > 1 && Work::new(&sh, per).is_none_or(|w| w.end > ws) {
            per = per.div_ceil(2);
        }
        if keep && per < n {
            // A begun pass is one chunk: its outputs are read once, at the end.
            return Ok(false);
        }
        let max_ops = usize::from(self.dev.caps().max_batch_ops);
        let first_out = match &pass {
            Pass::Forward { out_rows, .. } => n - out_rows,
            Pass::Layers { .. } | Pass::Begin { .. } => n,
        };
        // Up to `depth` batches in flight. A chunk's batches go out back to back (the
        // device runs them in order, each over the work buffer the one before left); with
        // two work buffers the next chunk's inputs are written into the other while this
        // one runs, and a chunk's outputs are read when its last batch is collected.
        let depth = self.depth();
        let works = [work, self.work2.filter(|_| depth > 1).unwrap_or(work)];
        let n_works = if works[1].id == work.id { 1 } else { 2 };
        let v = tail.as_ref().map_or(0, |t| t.2.rows);
        let outs = Outs { buf: out_buf, v, first_out, e };
        let mut fl = Flight { batches: heapless::Deque::new(), chunks: [None, None] };
        let r = (|| -> Result<(), EngineError<D::Error>> {
            let mut t0 = 0;
            let mut c = 0usize;
            while t0 < n {
                let m = per.min(n - t0);
                // Rows of this chunk that produce logits: its last k.
                let k = (t0 + m).saturating_sub(first_out.max(t0));
                let w = Work::new(&sh, m).filter(|w| w.end <= ws).ok_or(invalid("one token's activations do not fit the work buffer", None))?;
                let slot = c % n_works;
                c += 1;
                let work = works[slot];
                // The buffer's last chunk is collected first; so is any chunk with logits
                // before one with logits (they share the output buffer).
                while fl.chunks[slot].is_some() || (k > 0 && fl.chunks.iter().flatten().any(|c| c.k > 0)) {
                    retire(&mut self.inflight, &mut self.dev, &mut self.delay, self.policy, &mut fl, &mut pass, &outs)?;
                }
                // Residual rows (or token ids), positions and the RoPE table (keel's own angles, as the CPU).
                let view = self.dev.host_view(work.id).map_err(EngineError::Device)?;
                match &pass {
                    Pass::Layers { x } => put_f32(&mut view[w.x() as usize..], &x[t0 * e..(t0 + m) * e]),
                    Pass::Begin { x } => put_f32(&mut view[w.x() as usize..], &x[t0 * e..(t0 + m) * e]),
                    Pass::Forward { tokens, .. } => {
                        for (i, &t) in tokens[t0..t0 + m].iter().enumerate() {
                            let id = i32::try_from(t).map_err(|_| invalid("a token id does not fit the device's I32", None))?;
                            view[w.tok() as usize + 4 * i..][..4].copy_from_slice(&id.to_le_bytes());
                        }
                    }
                }
                let mut cs = [0f32; MAX_ROT];
                let cs = &mut cs[..sh.n_rot];
                for i in 0..m {
                    let p = pos + t0 + i;
                    let pv = i32::try_from(p).map_err(|_| invalid("a position does not fit the device's I32", None))?;
                    view[w.pos() as usize + 4 * i..][..4].copy_from_slice(&pv.to_le_bytes());
                    crate::ops::rope_angles(p, sh.rope_base, sh.n_rot, cs);
                    put_f32(&mut view[w.cs() as usize + 4 * sh.n_rot * i..], cs);
                }
                fl.chunks[slot] = Some(Chunk { t0, m, k, work, w });
                let mut l = layers.start;
                let mut tail_done = k == 0;
                let mut first = true;
                while l < layers.end || !tail_done {
                    let b = &mut self.builder;
                    b.start(&sh, &w, work, m).map_err(|why| EngineError::Lower { layer: l, why })?;
                    if let (true, Some((table, ..))) = (first && l == layers.start, &tail) {
                        b.add_embedding(table, &w, m, self.embd_scale).map_err(|why| EngineError::Lower { layer: l, why })?;
                    }
                    first = false;
                    let batch_first = l;
                    while l < layers.end {
                        if b.layers > 0 && (b.layers as u64 + 1) * layer_bytes * m as u64 > self.batch_work {
                            break;
                        }
                        let slot = &self.layers[usize::from(l)];
                        let whole = slot.whole.as_ref().ok_or(invalid("the layer is not resident on this device", Some(l)))?;
                        let weights = &slot.weights;
                        let weight = |kind: WeightKind| weights.get(kind as usize).copied().flatten();
                        let mark = b.mark();
                        let added = b.add_layer(&whole.shape, sh.rope_base, &whole.ops, &weight, &whole.resident, m, pos + t0);
                        match added {
                            Ok(()) if b.fits(max_ops) => l += 1,
                            Ok(()) if b.layers > 1 => {
                                b.truncate(mark);
                                break;
                            }
                            Err(LowerError::Full) if b.layers > 0 => {
                                b.undo(mark);
                                break;
                            }
                            Ok(()) | Err(LowerError::Full) => {
                                return Err(invalid("one layer (with the embedding lookup, if any) needs more ops, tensors or buffers than a batch carries", Some(l)));
                            }
                            Err(why) => return Err(EngineError::Lower { layer: l, why }),
                        }
                    }
                    if let (false, true, Some((_, norm, out, out_bytes))) = (tail_done, l == layers.end, &tail) {
                        // The logits join the last layer batch if it has the work and room for them.
                        if b.layers == 0 || (b.layers as u64 * layer_bytes + out_bytes) * m as u64 <= self.batch_work {
                            let mark = b.mark();
                            match b.add_output(&sh, &w, *norm, out, out_buf, m, k) {
                                Ok(()) if b.fits(max_ops) => tail_done = true,
                                Ok(()) | Err(LowerError::Full) if b.layers > 0 => b.undo(mark),
                                Ok(()) | Err(LowerError::Full) => return Err(invalid("the final norm and output projection do not fit a batch", None)),
                                Err(why) => return Err(EngineError::Lower { layer: OUTPUT_LAYER, why }),
                            }
                        }
                    }
                    let in_batch = b.layers;
                    let output = tail_done && l == layers.end && k > 0;
                    let last = if in_batch == 0 { batch_first } else { l.saturating_sub(1) };
                    let stage = Stage::Layers { first: batch_first, last, output };
                    while fl.batches.len() >= depth {
                        retire(&mut self.inflight, &mut self.dev, &mut self.delay, self.policy, &mut fl, &mut pass, &outs)?;
                    }
                    let seq = self.inflight.submit(&mut self.dev, &self.builder.batch()).map_err(EngineError::Wait)?;
                    self.stats.batches += 1;
                    let ends_chunk = l == layers.end && tail_done;
                    // Room: fewer than `depth` ≤ IN_FLIGHT are in flight.
                    let _ = fl.batches.push_back(Pending { seq, stage, tokens: m, pos: pos + t0, chunk: slot, ends_chunk });
                }
                t0 += m;
            }
            Ok(())
        })();
        match r {
            Ok(()) if keep => {
                self.stats.begun += 1;
                self.begun = Some(Begun { fl, outs, n });
                Ok(true)
            }
            Ok(()) => self.finish(fl, pass, &outs).map(|()| false),
            Err(e) => {
                // Nothing is left in flight behind an error: the others are waited for
                // and their results dropped.
                self.abandon(fl);
                Err(e)
            }
        }
    }
}

/// A pass [`DeviceEngine::layers_begin`] left in flight: its batches, where its outputs
/// are, and its tokens.
struct Begun {
    fl: Flight,
    outs: Outs,
    n: usize,
}

/// A pass's batches in flight, oldest first, and the chunks of tokens they run
/// (one per work buffer).
struct Flight {
    batches: heapless::Deque<Pending, IN_FLIGHT>,
    chunks: [Option<Chunk>; 2],
}

/// One batch of a pass in flight.
#[derive(Clone, Copy)]
struct Pending {
    seq: keel_npu_hal::Seq,
    /// What it runs (named when it fails).
    stage: Stage,
    tokens: usize,
    pos: usize,
    /// Its chunk's index in [`Flight::chunks`].
    chunk: usize,
    /// The chunk's last batch: its outputs are ready when this one completes.
    ends_chunk: bool,
}

/// A chunk of tokens whose batches are in flight.
#[derive(Clone, Copy)]
struct Chunk {
    t0: usize,
    m: usize,
    /// Rows of logits it produces (its last k tokens).
    k: usize,
    work: BufferRef,
    w: Work,
}

/// Where a pass's outputs are: the output buffer, logits per row (`v`), the first
/// token with logits, floats per residual row (`e`).
struct Outs {
    buf: BufferRef,
    v: usize,
    first_out: usize,
    e: usize,
}

/// Waits for the oldest batch in flight; when it ends its chunk, reads the chunk's
/// outputs (residual rows or logits). A failed batch is an error naming it.
fn retire<D: SharedBuffers + Queue, Dl: DelayNs>(inflight: &mut Tracker<IN_FLIGHT>, dev: &mut D, delay: &mut Dl, policy: WaitPolicy, fl: &mut Flight, pass: &mut Pass<'_>, o: &Outs) -> Result<(), EngineError<D::Error>> {
    let b = fl.batches.pop_front().ok_or(invalid("a chunk waits for outputs no batch in flight produces", None))?;
    let status = inflight.wait(dev, b.seq, delay, policy).map_err(EngineError::Wait)?;
    if status != BatchStatus::Done {
        return Err(EngineError::Batch { stage: b.stage, status, tokens: b.tokens, pos: b.pos });
    }
    let Some(c) = fl.chunks[b.chunk].filter(|_| b.ends_chunk) else { return Ok(()) };
    fl.chunks[b.chunk] = None;
    match pass {
        Pass::Layers { x } => {
            let view = dev.host_view(c.work.id).map_err(EngineError::Device)?;
            get_f32(&mut x[c.t0 * o.e..(c.t0 + c.m) * o.e], &view[c.w.x() as usize..]);
        }
        Pass::Forward { logits, .. } if c.k > 0 => {
            let row0 = c.t0 + c.m - c.k - o.first_out;
            let view = dev.host_view(o.buf.id).map_err(EngineError::Device)?;
            get_f32(&mut logits[row0 * o.v..(row0 + c.k) * o.v], view);
        }
        Pass::Forward { .. } => {}
        Pass::Begin { .. } => return Err(invalid("a begun pass's outputs are read by layers_end", None)),
    }
    Ok(())
}

/// Converts whole ggml rows `src` of type `from` (each `row.len()` wide) to rows of
/// type `to` in `out`: dequantized into `row`, then keel-core's reference quantizer
/// (what a device that lacks `from` holds instead). `Err`: a type cannot be converted,
/// or the sizes disagree.
pub fn convert_rows(kern: &Kernels, from: GgmlType, src: &[u8], to: GgmlType, row: &mut [f32], out: &mut [u8]) -> Result<(), crate::quant::Unsupported> {
    let cols = row.len() as u64;
    let bad = crate::quant::Unsupported { ty: to, reason: crate::quant::Reason::NoQuantize };
    let (src_rb, dst_rb) = (from.row_bytes(cols).ok_or(bad)? as usize, to.row_bytes(cols).ok_or(bad)? as usize);
    if src_rb == 0 || dst_rb == 0 || !src.len().is_multiple_of(src_rb) || out.len() != src.len() / src_rb * dst_rb {
        return Err(bad);
    }
    for (s, o) in src.chunks_exact(src_rb).zip(out.chunks_exact_mut(dst_rb)) {
        kern.dequantize_row(from, s, row)?;
        quantize_row_ref(to, row, o)?;
    }
    Ok(())
}

/// Submits `batch` and waits for it with the HAL's bounded wait (one batch in flight
/// today; the tracker takes up to [`IN_FLIGHT`]).
fn submit_wait<D: Queue, Dl: DelayNs>(inflight: &mut Tracker<IN_FLIGHT>, dev: &mut D, delay: &mut Dl, policy: WaitPolicy, stats: &mut Stats, batch: Batch<'_>) -> Result<BatchStatus, EngineError<D::Error>> {
    let seq = inflight.submit(dev, &batch).map_err(EngineError::Wait)?;
    stats.batches += 1;
    inflight.wait(dev, seq, delay, policy).map_err(EngineError::Wait)
}

/// Bytes of a vector of `floats` F32 values in a device buffer (vector-aligned).
fn vec_bytes(floats: usize) -> u64 {
    (4 * floats as u64).next_multiple_of(WEIGHT_ALIGN)
}

/// Bytes of layer `l`'s vectors after the norms: an attention layer's biases and head
/// norms, a delta-net layer's conv taps, gate vectors and output norm weight; and the
/// post-norms of either.
fn vector_bytes(model: &Model<'_>, l: usize, shape: &LayerShape) -> u64 {
    let post = if shape.post_norms { 2 * vec_bytes(shape.n_embd) } else { 0 };
    let (qd, kvd, hd) = (shape.n_head * shape.head_dim, shape.kv_dim(), shape.head_dim);
    match (&model.layers[l].mixer, shape.ssm) {
        (Mixer::DeltaNet(_), Some(d)) => vec_bytes(d.d_conv * d.conv_channels()) + 2 * vec_bytes(d.n_v_heads) + vec_bytes(d.d_state) + post,
        _ => (if shape.biases { vec_bytes(qd) + 2 * vec_bytes(kvd) } else { 0 }) + (if shape.head_norms { 2 * vec_bytes(hd) } else { 0 }) + post,
    }
}

impl<D, Dl, S> DeviceInfo for DeviceEngine<D, Dl, S>
where
    D: Device + SharedBuffers + Queue,
    Dl: DelayNs,
    S: DerefMut<Target = [LayerSlot]>,
{
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
        // The work and output buffers, and the second work buffer when batches overlap.
        let io = if self.depth() > 1 { 3 } else { 2 };
        self.dev.caps().memory.va_budget.saturating_sub(io * IO_BYTES)
    }

    fn layer_kv_bytes(&self, shape: &LayerShape, n_ctx: usize) -> Option<u64> {
        if shape.n_rot > MAX_ROT || !probe_ops(shape, &mut |op, t| self.dev.supports(op, t) == Support::Yes) {
            return None;
        }
        // An attention layer's K and V cache, a delta-net layer's conv and recurrent state.
        let bytes = match (shape.delta, shape.ssm) {
            (true, Some(d)) => {
                let (c, s) = state_bytes(&d);
                c + s
            }
            (true, None) => return None,
            (false, _) => 2 * cache_bytes(shape, n_ctx),
        };
        // The work buffer must hold at least one token's activations.
        let w = Work::new(shape, 1)?;
        (w.end <= IO_BYTES && bytes <= self.dev.buffer_rules().max_size).then_some(bytes)
    }

    fn embedding_bytes(&self, ty: GgmlType, n_vocab: usize, n_embd: usize, scaled: bool) -> Option<u64> {
        let dtype = hal_row_dtype(ty)?;
        if !probe_embedding(dtype, n_vocab, n_embd, scaled, &mut |op, t| self.dev.supports(op, t) == Support::Yes) {
            return None;
        }
        let bytes = dtype.row_bytes(u32::try_from(n_embd).ok()?)?.checked_mul(n_vocab as u64)?;
        (bytes <= self.dev.buffer_rules().max_size.min(u64::from(u32::MAX))).then_some(bytes.next_multiple_of(WEIGHT_ALIGN))
    }
}

/// A placement's devices, each an engine (device `n` of the placement is `.0[n]`):
/// what a session's `Exec` takes as its `Offload`. Each call goes to its device's
/// engine, whose first failure is kept in its [`DeviceEngine::error`] (later calls to it
/// are refused).
pub struct Engines<'e, D: keel_npu_hal::ErrorType, Dl, S>(pub &'e mut [DeviceEngine<D, Dl, S>]);

impl<D, Dl, S> Offload for Engines<'_, D, Dl, S>
where
    D: Device + SharedBuffers + Queue,
    Dl: DelayNs,
    S: DerefMut<Target = [LayerSlot]>,
{
    fn matmul(&mut self, device: u8, id: WeightId, x: &[f32], n: usize, out: &mut [f32]) -> Result<(), DeviceFailed> {
        offload_call(self.0, device, |e| e.matmul(id, x, n, out))
    }

    fn layers(&mut self, device: u8, layers: Range<u16>, x: &mut [f32], n: usize, pos: usize) -> Result<(), DeviceFailed> {
        offload_call(self.0, device, |e| e.layers(layers, x, n, pos))
    }

    fn layers_begin(&mut self, device: u8, layers: Range<u16>, x: &[f32], n: usize, pos: usize) -> Result<bool, DeviceFailed> {
        offload_call(self.0, device, |e| e.layers_begin(layers, x, n, pos))
    }

    fn layers_end(&mut self, device: u8, x: &mut [f32]) -> Result<(), DeviceFailed> {
        offload_call(self.0, device, |e| e.layers_end(x))
    }

    fn forward(&mut self, device: u8, tokens: &[u32], pos: usize, out_rows: usize, logits: &mut [f32]) -> Result<(), DeviceFailed> {
        offload_call(self.0, device, |e| e.forward(tokens, pos, out_rows, logits))
    }
}

/// Runs `f` on engine `device` unless it failed before; keeps its first failure.
pub fn offload_call<D, Dl, S, T>(engines: &mut [DeviceEngine<D, Dl, S>], device: u8, f: impl FnOnce(&mut DeviceEngine<D, Dl, S>) -> Result<T, EngineError<D::Error>>) -> Result<T, DeviceFailed>
where
    D: Device + SharedBuffers + Queue,
    Dl: DelayNs,
    S: DerefMut<Target = [LayerSlot]>,
{
    let e = engines.get_mut(usize::from(device)).ok_or(DeviceFailed { device })?;
    if e.error.is_some() {
        return Err(DeviceFailed { device });
    }
    f(e).map_err(|err| {
        e.error = Some(err);
        DeviceFailed { device }
    })
}

/// What a pass of whole layers starts from and gives back.
enum Pass<'a> {
    /// Residual rows in, residual rows out.
    Layers { x: &'a mut [f32] },
    /// Residual rows in; the rows out are read later, by [`DeviceEngine::layers_end`].
    Begin { x: &'a [f32] },
    /// Token ids in, the logits of the last `out_rows` tokens out.
    Forward { tokens: &'a [u32], out_rows: usize, logits: &'a mut [f32] },
}

/// Writes `v` as little-endian f32 at the start of `dst`.
fn put_f32(dst: &mut [u8], v: &[f32]) {
    for (d, x) in dst.chunks_exact_mut(4).zip(v) {
        d.copy_from_slice(&x.to_le_bytes());
    }
}

/// Reads little-endian f32 from the start of `src` into `out`.
fn get_f32(out: &mut [f32], src: &[u8]) {
    for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

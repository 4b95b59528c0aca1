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
//! per product and chunk of tokens, completed before the CPU continues.
//!
//! Memory is counted by kind (model, context, compute) from the buffers this module
//! allocates, and the total from what the firmware measured (`Caps::memory.va_budget`,
//! the shared region it mapped); [`Devices::breakdown`] reports it per device.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use keel_core::ggml_type::GgmlType;
use keel_core::model::Model;
use keel_core::placement::{for_each_weight, Decision, DeviceFailed, DeviceInfo, Offload, Placement, Policy, WeightId, Where};
use keel_core::quant::{quantize_row_ref, Kernels};
use keel_npu_hal::device::{BatchStatus, Device, Queue, SharedBuffers};
use keel_npu_hal::op::{Batch, BufferRef, DType, Layout, OpDesc, OpKind, Support, TensorDesc};
use keel_npu_hal::{tile, BufferId, ErrorKind};

use super::{DeviceError, HexagonSim, SimConfig};

/// Bytes of shared memory kept for one product's activations and outputs.
pub const IO_BYTES: u64 = 8 << 20;

/// The HAL type of a ggml weight type, if the HAL has it.
pub fn hal_dtype(t: GgmlType) -> Option<DType> {
    match t {
        GgmlType::Q8_0 => Some(DType::Q8_0),
        GgmlType::Q4_0 => Some(DType::Q4_0),
        GgmlType::IQ4_NL => Some(DType::IQ4NL),
        _ => None,
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
    /// Bytes of repacked weights.
    pub model_bytes: u64,
    /// Bytes of activation/output buffers.
    pub compute_bytes: u64,
    /// Weights held, of which converted at load.
    pub weights_held: (usize, usize),
    /// Batches submitted.
    pub batches: u64,
    /// Time spent waiting for the device.
    pub busy: Duration,
}

/// The devices of a run.
pub struct Devices {
    /// Device sessions in `--device` order.
    pub slots: Vec<Slot>,
    /// The first failure, with its full description.
    pub error: Option<DeviceError>,
    /// Time spent converting and repacking weights at load.
    pub load_time: Duration,
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
            slots.push(Slot {
                dev,
                label: format!("{name}{i}"),
                weights: HashMap::new(),
                io: None,
                model_bytes: 0,
                compute_bytes: 0,
                weights_held: (0, 0),
                batches: 0,
                busy: Duration::ZERO,
            });
        }
        Ok(Devices { slots, error: None, load_time: Duration::ZERO })
    }

    /// No devices: everything on the CPU.
    pub fn none() -> Devices {
        Devices { slots: Vec::new(), error: None, load_time: Duration::ZERO }
    }

    /// Decides placement for `model` under `policy` (decisions written into `slots`).
    pub fn plan<'s>(&self, model: &Model<'_>, policy: &Policy, slots: &'s mut [Decision]) -> Result<Placement<'s>, keel_core::Error> {
        let infos: Vec<Info<'_>> = self.slots.iter().map(|s| Info { dev: &s.dev, reserve: IO_BYTES + IO_BYTES }).collect();
        let dyns: Vec<&dyn DeviceInfo> = infos.iter().map(|i| i as &dyn DeviceInfo).collect();
        let mut p = *policy;
        p.n_devices = p.n_devices.min(self.slots.len());
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
                    context: 0,
                    compute: s.compute_bytes,
                    weights: s.weights_held,
                }
            })
            .collect()
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
            let start = Instant::now();
            let seq = slot.dev.submit(&batch)?;
            slot.batches += 1;
            let status = slot.dev.wait(seq)?;
            slot.busy += start.elapsed();
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

//! Running a model's matrix products on devices: the host side of keel-core's
//! placement ([`keel_core::placement`]) and device engine ([`keel_core::device`]).
//!
//! [`Devices::open`] opens each device of a `--device` list (`hexagon-sim`, several times
//! for several sessions; `cpu` is implicit) and wraps each in keel-core's
//! [`DeviceEngine`], which does everything else over the HAL alone: [`Devices::plan`]
//! asks the engines (through the HAL's `supports(op)`) what they hold and run and lets
//! keel-core decide; [`Devices::load`] has each engine convert and repack its weights and
//! load its layers' resident tensors; then [`Devices`] implements [`Offload`] by handing
//! each call to the device's engine, timing it. This module adds only what a command
//! line needs: names, labels, the time spent, and the memory breakdown.

use std::time::{Duration, Instant};

use keel_core::device::engine::{LayerSlot, LoadScratch};
use keel_core::device::{DeviceEngine, EngineError};
use keel_core::model::Model;
use keel_core::placement::{Decision, DeviceFailed, DeviceInfo, Offload, Placement, Policy, WeightId};
use keel_core::quant::Kernels;
use keel_npu_hal::device::Device;
use keel_npu_hal::wait::{WaitError, WaitPolicy};
use keel_npu_hal::Error as _;

pub use keel_core::device::engine::{convert_rows, hal_dtype, hal_row_dtype, BATCH_WORK, IO_BYTES};

use super::any::AnyDevice;
use super::fastrpc::{FastRpcConfig, Hexagon};
use super::rknpu::device::Rknpu;
use super::rknpu::w8a8::Scheme;
use keel_npu_hal::ErrorKind;
use super::{DeviceError, HexagonSim, SimConfig};

/// How long the NPU may take for one job (PREP_BO's absolute deadline): the kernel's own
/// per-job timeout is 500 ms.
pub const RKNPU_TIMEOUT: Duration = Duration::from_secs(2);

/// The node the rocket driver makes.
pub const RKNPU_NODE: &str = "/dev/accel/accel0";

/// Opens `rknpu` on the real node with `scheme` (keel's W8A8 scheme and its products).
fn open_rknpu(scheme: Scheme) -> Result<Rknpu, DeviceError> {
    let node = crate::device::rknpu::ioctl::Node::open(std::path::Path::new(RKNPU_NODE)).map_err(|e| {
        DeviceError::new(
            "rknpu",
            ErrorKind::DeviceLost,
            format!("cannot open {RKNPU_NODE}: {e}; the NPU needs Linux 6.18+ with CONFIG_DRM_ACCEL_ROCKET, the rknn-core nodes enabled in the device tree, and read/write access to the node (the render group or a udev rule)"),
        )
    })?;
    Rknpu::new(Box::new(node), "rknpu", scheme, RKNPU_TIMEOUT)
}

/// Microseconds between polls of a batch's completion.
const POLL_US: u32 = 50;

/// The host's `DelayNs` for the HAL's bounded wait: the thread sleeps.
pub struct Sleep;

impl embedded_hal::delay::DelayNs for Sleep {
    fn delay_ns(&mut self, ns: u32) {
        std::thread::sleep(Duration::from_nanos(u64::from(ns)));
    }
}

/// keel-core's engine over one device, its layer table on the heap (sized at open).
pub type SimEngine = DeviceEngine<AnyDevice, Sleep, Vec<LayerSlot>>;

/// One device session.
pub struct Slot {
    /// The engine and its device.
    pub engine: SimEngine,
    /// Its name in the `--device` list with its index (`hexagon-sim0`).
    pub label: String,
    /// Time spent in the device's batches.
    pub busy: Duration,
}

impl Slot {
    /// The device.
    pub fn dev(&self) -> &AnyDevice {
        &self.engine.dev
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

/// An engine's error as a device error naming the device.
fn engine_error(label: &str, e: EngineError<DeviceError>) -> DeviceError {
    match e {
        EngineError::Device(e) | EngineError::Wait(WaitError::Device(e)) => e,
        other => DeviceError::new(label, other.kind(), other.to_string()),
    }
}

impl Devices {
    /// Opens each named device (each `hexagon-sim` is its own QEMU session, each
    /// `hexagon` its own FastRPC session).
    pub fn open(names: &[String], cfg: &SimConfig) -> Result<Devices, DeviceError> {
        Self::open_with(names, cfg, Scheme::default())
    }

    /// [`Devices::open`] with `rknpu`'s scheme chosen (`--rknpu-products`).
    pub fn open_with(names: &[String], cfg: &SimConfig, rknpu: Scheme) -> Result<Devices, DeviceError> {
        let mut slots = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let (dev, timeout) = if name == "rknpu" {
                (AnyDevice::Rknpu(open_rknpu(rknpu)?), RKNPU_TIMEOUT)
            } else if name == "hexagon" {
                let mut fcfg = FastRpcConfig::from_env();
                // A second `hexagon` in the list is a second session on the same DSP.
                let nth = names[..i].iter().filter(|n| *n == "hexagon").count() as u32;
                fcfg.session = fcfg.session.map(|s| s + nth).or((nth > 0).then_some(nth));
                (AnyDevice::Hexagon(Hexagon::open(&fcfg)?), fcfg.timeout)
            } else {
                (AnyDevice::Sim(HexagonSim::open(cfg)?), cfg.timeout)
            };
            slots.push(Self::slot(dev, timeout, i, name));
        }
        Ok(Devices { slots, error: None, load_time: Duration::ZERO, batch_work: BATCH_WORK })
    }

    /// Devices already opened (a test's, e.g. `rknpu` over the recording double), each
    /// with its completion limit and its name in the `--device` list.
    pub fn with(devs: Vec<(AnyDevice, Duration, &str)>) -> Devices {
        let slots = devs.into_iter().enumerate().map(|(i, (d, t, name))| Self::slot(d, t, i, name)).collect();
        Devices { slots, error: None, load_time: Duration::ZERO, batch_work: BATCH_WORK }
    }

    fn slot(dev: AnyDevice, timeout: Duration, i: usize, name: &str) -> Slot {
        {
            // The device's own limit decides (its poll ends a hung session with a clear
            // error); the wait's count of delays is a lower bound of the time, a backstop.
            let timeout_us = u32::try_from(timeout.as_micros()).unwrap_or(u32::MAX);
            let policy = WaitPolicy { timeout_us: timeout_us.saturating_add(timeout_us / 2), poll_us: POLL_US };
            let engine = DeviceEngine::new(dev, i as u8, Sleep, policy, Vec::new());
            Slot { engine, label: format!("{name}{i}"), busy: Duration::ZERO }
        }
    }

    /// No devices: everything on the CPU.
    pub fn none() -> Devices {
        Devices { slots: Vec::new(), error: None, load_time: Duration::ZERO, batch_work: BATCH_WORK }
    }

    /// Decides placement for `model` under `policy` (decisions written into `slots`);
    /// whole layers get a KV cache of `n_ctx` positions on their device.
    pub fn plan<'s>(&self, model: &Model<'_>, policy: &Policy, n_ctx: usize, slots: &'s mut [Decision]) -> Result<Placement<'s>, keel_core::Error> {
        let dyns: Vec<&dyn DeviceInfo> = self.slots.iter().map(|s| &s.engine as &dyn DeviceInfo).collect();
        let mut p = *policy;
        p.n_devices = p.n_devices.min(self.slots.len());
        p.kv_ctx = n_ctx;
        Placement::plan(model, &p, &dyns, slots)
    }

    /// Has each device's engine convert and repack the weights `placement` puts there and
    /// load its whole layers' resident tensors and its work buffers.
    pub fn load(&mut self, model: &Model<'_>, placement: &Placement<'_>, kern: &Kernels) -> Result<(), DeviceError> {
        let t0 = Instant::now();
        for slot in &mut self.slots {
            slot.engine.batch_work = self.batch_work;
            slot.engine.set_layers(vec![LayerSlot::EMPTY; model.layers.len()]);
            let (floats, bytes) = slot.engine.load_scratch(placement);
            let (mut row, mut group) = (vec![0f32; floats], vec![0u8; bytes]);
            let mut scratch = LoadScratch { row: &mut row, group: &mut group };
            slot.engine.load(model, placement, kern, &mut scratch).map_err(|e| engine_error(&slot.label, e))?;
        }
        self.load_time = t0.elapsed();
        Ok(())
    }

    /// Memory per device, from the buffers allocated and the total the firmware measured.
    pub fn breakdown(&self) -> Vec<Breakdown> {
        self.slots
            .iter()
            .map(|s| {
                let total = s.dev().caps().memory.va_budget;
                let id = s.dev().identity();
                let arch = match id.arch {
                    keel_npu_hal::Arch::Hexagon { version } => format!("Hexagon v{version}"),
                    other => format!("{other:?}"),
                };
                let st = s.engine.stats;
                Breakdown {
                    name: s.label.clone(),
                    what: format!("{arch}{}", if id.emulated { ", emulated" } else { "" }),
                    total,
                    free: total.saturating_sub(s.dev().allocated_bytes()),
                    model: st.model_bytes,
                    context: st.context_bytes,
                    compute: st.compute_bytes,
                    weights: (st.weights, st.converted),
                }
            })
            .collect()
    }

    /// Asks every device's engine to keep up to `n` batches in flight (before
    /// [`Devices::plan`]: the second work buffer counts against the budget); each takes
    /// at most what its device does.
    pub fn set_in_flight(&mut self, n: u8) {
        for s in &mut self.slots {
            s.engine.in_flight = n;
        }
    }

    /// Batches in flight at most on any device (0 without devices).
    pub fn in_flight(&self) -> usize {
        self.slots.iter().map(|s| s.engine.depth()).max().unwrap_or(0)
    }

    /// Batches submitted to all devices.
    pub fn batches(&self) -> u64 {
        self.slots.iter().map(|s| s.engine.stats.batches).sum()
    }

    /// Passes of whole layers left in flight while the session ran other stages (prompt
    /// chunks pipelined), on all devices.
    pub fn passes_begun(&self) -> u64 {
        self.slots.iter().map(|s| s.engine.stats.begun).sum()
    }

    /// Hands one call to device `device`'s engine, timing it; keeps the first failure.
    fn call<T>(&mut self, device: u8, f: impl FnOnce(&mut SimEngine) -> Result<T, EngineError<DeviceError>>) -> Result<T, DeviceFailed> {
        if self.error.is_some() {
            return Err(DeviceFailed { device });
        }
        let Some(slot) = self.slots.get_mut(usize::from(device)) else { return Err(DeviceFailed { device }) };
        let start = Instant::now();
        let r = f(&mut slot.engine);
        slot.busy += start.elapsed();
        r.map_err(|e| {
            self.error = Some(engine_error(&slot.label, e));
            DeviceFailed { device }
        })
    }
}

impl Offload for Devices {
    fn matmul(&mut self, device: u8, id: WeightId, x: &[f32], n: usize, out: &mut [f32]) -> Result<(), DeviceFailed> {
        self.call(device, |e| e.matmul(id, x, n, out))
    }

    fn layers(&mut self, device: u8, layers: std::ops::Range<u16>, x: &mut [f32], n: usize, pos: usize) -> Result<(), DeviceFailed> {
        self.call(device, |e| e.layers(layers, x, n, pos))
    }

    fn layers_begin(&mut self, device: u8, layers: std::ops::Range<u16>, x: &[f32], n: usize, pos: usize) -> Result<bool, DeviceFailed> {
        self.call(device, |e| e.layers_begin(layers, x, n, pos))
    }

    fn layers_end(&mut self, device: u8, x: &mut [f32]) -> Result<(), DeviceFailed> {
        self.call(device, |e| e.layers_end(x))
    }

    fn forward(&mut self, device: u8, tokens: &[u32], pos: usize, out_rows: usize, logits: &mut [f32]) -> Result<(), DeviceFailed> {
        self.call(device, |e| e.forward(tokens, pos, out_rows, logits))
    }
}

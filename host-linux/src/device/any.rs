//! One type for "any device a `--device` list names", so that keel-core's one
//! [`keel_core::device::DeviceEngine`] runs over each: every HAL call is handed to
//! the device it wraps, nothing more.

use keel_npu_hal::device::{Completion, Device, Queue, Seq, SharedBuffers};
use keel_npu_hal::op::{Batch, OpDesc, Support, TensorDesc};
use keel_npu_hal::{BufferId, Caps, ErrorType, Identity};

use super::fastrpc::Hexagon;
use super::rknpu::device::Rknpu;
use super::{DeviceError, HexagonSim};

/// An opened device of any kind.
pub enum AnyDevice {
    /// keel's firmware under qemu-hexagon.
    Sim(HexagonSim),
    /// A Hexagon DSP through libcdsprpc (FastRPC).
    Hexagon(Hexagon),
    /// The RK3588 NPU through the rocket driver (or its recording double).
    Rknpu(Rknpu),
}

macro_rules! each {
    ($self:expr, $d:ident => $e:expr) => {
        match $self {
            AnyDevice::Sim($d) => $e,
            AnyDevice::Hexagon($d) => $e,
            AnyDevice::Rknpu($d) => $e,
        }
    };
}

impl AnyDevice {
    /// The device's name in errors.
    pub fn name(&self) -> &str {
        each!(self, d => d.name())
    }
    /// Bytes allocated to buffers now.
    pub fn allocated_bytes(&self) -> u64 {
        each!(self, d => d.allocated_bytes())
    }
}

impl ErrorType for AnyDevice {
    type Error = DeviceError;
}

impl Device for AnyDevice {
    fn identity(&self) -> &Identity {
        each!(self, d => d.identity())
    }
    fn caps(&self) -> &Caps {
        each!(self, d => d.caps())
    }
    fn supports(&self, op: &OpDesc, tensors: &[TensorDesc]) -> Support {
        each!(self, d => d.supports(op, tensors))
    }
}

impl SharedBuffers for AnyDevice {
    fn alloc(&mut self, size: u64) -> Result<BufferId, DeviceError> {
        each!(self, d => d.alloc(size))
    }
    fn map(&mut self, id: BufferId) -> Result<(), DeviceError> {
        each!(self, d => d.map(id))
    }
    fn host_view(&mut self, id: BufferId) -> Result<&mut [u8], DeviceError> {
        each!(self, d => d.host_view(id))
    }
    fn free(&mut self, id: BufferId) -> Result<(), DeviceError> {
        each!(self, d => d.free(id))
    }
}

impl Queue for AnyDevice {
    fn submit(&mut self, batch: &Batch<'_>) -> Result<Seq, DeviceError> {
        each!(self, d => d.submit(batch))
    }
    fn poll(&mut self) -> Result<Option<Completion>, DeviceError> {
        each!(self, d => d.poll())
    }
}

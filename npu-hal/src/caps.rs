//! Who a device is and what it can do, as measured when it was opened (never
//! assumed from a build flag), and the generic `supports(op)` check built on it.
//! This module owns the capability types; the op rules live in [`crate::op`].

use crate::buffer::BufferRules;
use crate::op::{DType, OpKind};

/// Processor architecture of a device.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Arch {
    /// Qualcomm Hexagon DSP; `version` is the decimal-looking arch number (68 for v68, 73 for v73).
    Hexagon {
        /// Architecture version, e.g. 68 or 73.
        version: u8,
    },
    /// Rockchip RK3588 NPU.
    Rk3588,
    /// A software device (test double or reference backend).
    Software,
}

/// What is known about one kind of compute unit.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum UnitState {
    /// The device does not have it.
    Absent,
    /// The device reports it, but no known-input test has run on it yet.
    Present,
    /// A known-input test ran on it and gave the right answer.
    Verified,
    /// A known-input test ran on it and gave a wrong answer: do not use it.
    Failed,
}

impl UnitState {
    /// True only for a unit that has proven it computes.
    pub fn usable(self) -> bool {
        self == UnitState::Verified
    }
}

/// Compute units of a device.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Units {
    /// Number of HVX contexts (0 when absent).
    pub hvx_contexts: u8,
    /// State of the HVX vector units.
    pub hvx: UnitState,
    /// State of the HMX matrix unit (v73+).
    pub hmx: UnitState,
    /// Number of NPU cores (RK3588: 3; 0 elsewhere).
    pub npu_cores: u8,
    /// State of the NPU cores.
    pub npu: UnitState,
}

/// Memory limits, queried from the device.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct MemoryLimits {
    /// Bytes of device virtual address space one session may map (about 3 GiB on v73).
    pub va_budget: u64,
    /// Bytes of VTCM (Hexagon) or on-chip SRAM (RK3588) the firmware may use as scratch.
    pub scratch_bytes: u32,
    /// Rules for shared buffers.
    pub buffers: BufferRules,
}

/// Identity of an opened device.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Identity {
    /// Architecture, as reported by the hardware.
    pub arch: Arch,
    /// Firmware version, `major << 16 | minor << 8 | patch`.
    pub firmware_version: u32,
    /// Wire protocol version both sides agreed on.
    pub protocol_version: u16,
    /// True when the "device" is an emulator (qemu-hexagon): numbers are right, timings are not.
    pub emulated: bool,
}

/// A set of op kinds, one bit per [`OpKind::code`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct OpSet(pub u32);

impl OpSet {
    /// The set with one more op kind.
    pub const fn with(self, code: u8) -> OpSet {
        OpSet(self.0 | 1 << code)
    }
    /// Whether the op kind is in the set.
    pub fn contains(self, kind: &OpKind) -> bool {
        self.0 & (1 << kind.code()) != 0
    }
}

/// A set of tensor types, one bit per [`DType::code`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DTypeSet(pub u16);

impl DTypeSet {
    /// The set with one more type.
    pub const fn with(self, t: DType) -> DTypeSet {
        DTypeSet(self.0 | 1 << t.code())
    }
    /// Whether the type is in the set.
    pub fn contains(self, t: DType) -> bool {
        self.0 & (1 << t.code()) != 0
    }
}

/// Everything the scheduler needs to decide what to place on the device.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Caps {
    /// Compute units present and verified.
    pub units: Units,
    /// Memory limits.
    pub memory: MemoryLimits,
    /// Op kinds the firmware implements.
    pub ops: OpSet,
    /// Weight types the matrix products accept (in [`crate::op::Layout::Tiles32`]).
    pub matmul_weights: DTypeSet,
    /// Batches that may be in flight at once.
    pub max_in_flight: u8,
    /// Most ops one batch may carry.
    pub max_batch_ops: u16,
}

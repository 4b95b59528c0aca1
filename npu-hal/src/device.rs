//! The device traits, kept apart as in ggml's backend interface: [`Device`]
//! (identity, capabilities, `supports`), [`SharedBuffers`] (memory both sides see
//! without copies) and [`Queue`] (op batches, split-phase). Implementations live
//! in the hosts (FastRPC, rocket, the QEMU shim); this module only states the contract.
//!
//! Split-phase, as in Tock's HIL: [`Queue::submit`] returning `Ok(seq)` means a
//! [`Completion`] with that `seq` *will* be returned by [`Queue::poll`] (with a
//! success or failure status) unless the device is lost, in which case `poll`
//! returns an error of kind [`ErrorKind::DeviceLost`]. `Err` means nothing was
//! queued. A buffer named by a batch in flight must not be touched by the host:
//! [`SharedBuffers::host_view`] refuses it with [`ErrorKind::Busy`].

use crate::buffer::{BufferId, BufferRules};
use crate::caps::{Caps, Identity};
use crate::error::{ErrorKind, ErrorType};
use crate::op::{Batch, OpDesc, Support, TensorDesc};
use crate::support::check_op;

/// Sequence number of a submitted batch (wraps around; unique among batches in flight).
pub type Seq = u32;

/// How a batch ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum BatchStatus {
    /// Every op ran; every destination tensor is written.
    Done,
    /// Op `op` failed; ops before it ran, it and those after did not. Outputs
    /// of the batch must not be used.
    Failed {
        /// Index of the failing op in the batch.
        op: u16,
        /// Why.
        kind: ErrorKind,
    },
}

/// The end of one batch.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Completion {
    /// The batch's sequence number, as returned by `submit`.
    pub seq: Seq,
    /// Its outcome.
    pub status: BatchStatus,
}

/// An opened device: who it is and what it can run.
pub trait Device: ErrorType {
    /// Identity measured at open.
    fn identity(&self) -> &Identity;

    /// Capabilities measured at open (units verified by the self-test).
    fn caps(&self) -> &Caps;

    /// Whether the device runs `op` over `tensors`. Provided: the generic rules
    /// of [`crate::support::check_op`] over [`Device::caps`]; override to be stricter.
    fn supports(&self, op: &OpDesc, tensors: &[TensorDesc]) -> Support {
        check_op(self.caps(), op, tensors)
    }
}

/// Buffers shared by host and device without copies.
pub trait SharedBuffers: Device {
    /// The device's alignment and size rules. Provided: from the capabilities.
    fn buffer_rules(&self) -> BufferRules {
        self.caps().memory.buffers
    }

    /// Allocates `size` bytes (rounded up by [`BufferRules::rounded_size`]) of shared memory.
    fn alloc(&mut self, size: u64) -> Result<BufferId, Self::Error>;

    /// Maps the buffer into the device's address space; needed before a batch names it.
    fn map(&mut self, id: BufferId) -> Result<(), Self::Error>;

    /// The host's view of the buffer, `Busy` while a batch in flight names it.
    fn host_view(&mut self, id: BufferId) -> Result<&mut [u8], Self::Error>;

    /// Unmaps (if mapped) and frees the buffer; `Busy` while a batch in flight names it.
    fn free(&mut self, id: BufferId) -> Result<(), Self::Error>;
}

/// Op batches, submitted as one message each and completed split-phase. A device
/// runs its batches in submission order, each seeing every write of those before it
/// (one queue, as a stream), so dependent batches may be in flight together.
pub trait Queue: Device {
    /// Sends the batch. `Ok(seq)`: a completion for `seq` will come. `Err`:
    /// nothing was queued (`Busy` when [`Caps::max_in_flight`] batches are out).
    fn submit(&mut self, batch: &Batch<'_>) -> Result<Seq, Self::Error>;

    /// The next completion, if one has arrived; never blocks.
    fn poll(&mut self) -> Result<Option<Completion>, Self::Error>;
}

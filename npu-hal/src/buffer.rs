//! Shared buffers: the handles the host and the device both name, and the
//! device's alignment and size rules. This module owns no memory; the device
//! implementation does (rpcmem/dma-buf on FastRPC, a `/dev/shm` file under QEMU).

use crate::error::ErrorKind;

/// A buffer both sides know by number. Ids are chosen by the device
/// implementation and are only meaningful within one open device.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BufferId(pub u32);

/// What a device demands of a shared buffer.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BufferRules {
    /// Required alignment of the buffer start, in bytes (a power of two).
    pub align: u32,
    /// Sizes are rounded up to a multiple of this (a power of two; 4096 for FastRPC mappings).
    pub granule: u32,
    /// Largest single buffer the device can map, in bytes.
    pub max_size: u64,
}

impl BufferRules {
    /// The size actually reserved for a request of `size` bytes, or why it cannot be.
    ///
    /// Zero-sized buffers are refused (`InvalidArgument`), too large ones give
    /// `OutOfMemory`, and rules that are not powers of two give `Protocol` (the
    /// device reported nonsense).
    pub fn rounded_size(&self, size: u64) -> Result<u64, ErrorKind> {
        if !self.align.is_power_of_two() || !self.granule.is_power_of_two() {
            return Err(ErrorKind::Protocol);
        }
        if size == 0 {
            return Err(ErrorKind::InvalidArgument);
        }
        let g = u64::from(self.granule);
        let rounded = size.checked_add(g - 1).ok_or(ErrorKind::OutOfMemory)? & !(g - 1);
        if rounded > self.max_size {
            return Err(ErrorKind::OutOfMemory);
        }
        Ok(rounded)
    }

    /// Whether an address satisfies the alignment rule.
    pub fn is_aligned(&self, addr: u64) -> bool {
        self.align.is_power_of_two() && addr & (u64::from(self.align) - 1) == 0
    }
}

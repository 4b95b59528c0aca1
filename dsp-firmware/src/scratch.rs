//! VTCM (or any fast scratch) as a managed region: the platform hands over one
//! slice whose size it measured (QuRT's VTCM request on a DSP, a harness
//! parameter under QEMU); kernels carve 128-byte aligned pieces from it per op
//! and size their chunks from [`Scratch::remaining`], never from a constant.

use keel_npu_hal::ErrorKind;

/// HVX vector alignment.
pub const ALIGN: usize = 128;

/// A bump allocator over a borrowed region; pieces live as long as the region.
pub struct Scratch<'a> {
    mem: &'a mut [u8],
}

impl<'a> Scratch<'a> {
    /// Manages `mem` (its unaligned head is skipped).
    pub fn new(mem: &'a mut [u8]) -> Self {
        let pad = mem.as_ptr().align_offset(ALIGN).min(mem.len());
        Scratch { mem: &mut mem[pad..] }
    }

    /// Bytes still free (the start is always aligned).
    pub fn remaining(&self) -> usize {
        self.mem.len()
    }

    /// The free part as a scratch of its own, for one op: what the op takes is
    /// given back when the scope ends.
    pub fn scope(&mut self) -> Scratch<'_> {
        Scratch { mem: &mut *self.mem }
    }

    /// Takes `len` bytes (rounded up to [`ALIGN`]); `OutOfMemory` if they are not there.
    pub fn take(&mut self, len: usize) -> Result<&'a mut [u8], ErrorKind> {
        let rounded = len.checked_next_multiple_of(ALIGN).ok_or(ErrorKind::OutOfMemory)?;
        if rounded > self.mem.len() {
            return Err(ErrorKind::OutOfMemory);
        }
        let mem = core::mem::take(&mut self.mem);
        let (piece, rest) = mem.split_at_mut(rounded);
        self.mem = rest;
        Ok(&mut piece[..len])
    }
}

//! Fast scratch memory as a managed region: the platform hands over one slice whose
//! size it measured (QuRT's VTCM request on a DSP, a harness parameter under QEMU,
//! any memory on a host); ops carve [`ALIGN`]-aligned pieces from it and size their
//! chunks from [`Scratch::remaining`], never from a constant.

use keel_npu_hal::ErrorKind;

/// HVX vector alignment (`tiles32::ALIGN`): every piece of a [`Scratch`] starts on it,
/// and so must a `MatMul`'s Tiles32 weights in memory.
pub const ALIGN: usize = crate::quant::tiles32::ALIGN;

/// A bump allocator over a borrowed region; pieces live as long as the region.
pub struct Scratch<'a> {
    mem: &'a mut [u8],
}

impl<'a> Scratch<'a> {
    /// Manages `mem` (its unaligned head is skipped).
    pub fn new(mem: &'a mut [u8]) -> Self {
        let pad = mem.as_ptr().addr().wrapping_neg() % ALIGN;
        let pad = pad.min(mem.len());
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

    /// Takes `len` bytes (and the padding after them up to [`ALIGN`], or to the end);
    /// `OutOfMemory` if they are not there. `take(remaining())` takes the rest.
    pub fn take(&mut self, len: usize) -> Result<&'a mut [u8], ErrorKind> {
        if len > self.mem.len() {
            return Err(ErrorKind::OutOfMemory);
        }
        // No overflow: a slice is at most isize::MAX bytes.
        let step = len.next_multiple_of(ALIGN).min(self.mem.len());
        let mem = core::mem::take(&mut self.mem);
        let (piece, rest) = mem.split_at_mut(step);
        self.mem = rest;
        Ok(&mut piece[..len])
    }
}

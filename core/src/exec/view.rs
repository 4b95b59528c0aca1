//! Tensors of a batch as address ranges, and slices over them.
//!
//! Aliasing rule for every op: a destination either does not overlap a source
//! or is exactly the same bytes with the same layout (the op then runs in
//! place). [`Tensors::same_or_disjoint`] and [`Tensors::disjoint`] apply it.
//! Slices are made only for ranges that `Batch::validate` and `run_batch`
//! checked lie inside the buffers (`Buffers`).

use keel_npu_hal::op::{OpDesc, TensorDesc};
use keel_npu_hal::ErrorKind;

use super::Scratch;

/// A tensor's bytes, `[start, end)` addresses.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn overlaps(self, o: Span) -> bool {
        self.start < o.end && o.start < self.end
    }
}

/// The tensor table with the buffers' addresses (see `Buffers`).
pub struct Tensors<'a> {
    pub t: &'a [TensorDesc],
    pub bases: &'a [*mut u8],
}

impl Tensors<'_> {
    /// Source `n` of `op` (present: `check_op` checked the indices it needs).
    pub fn src(&self, op: &OpDesc, n: usize) -> Result<&TensorDesc, ErrorKind> {
        op.src[n].and_then(|i| self.t.get(usize::from(i))).ok_or(ErrorKind::InvalidArgument)
    }

    /// Destination of `op`.
    pub fn dst(&self, op: &OpDesc) -> Result<&TensorDesc, ErrorKind> {
        self.t.get(usize::from(op.dst)).ok_or(ErrorKind::InvalidArgument)
    }

    /// The bytes of `t`: a pointer to the first and the addresses they span.
    fn locate(&self, t: &TensorDesc) -> Result<(*mut u8, Span), ErrorKind> {
        let base = *self.bases.get(usize::from(t.buffer)).ok_or(ErrorKind::InvalidArgument)?;
        // `validate` checked that `end` exists and lies inside the buffer, and
        // `run_batch` that the buffer's memory is at least that long.
        let end = t.end().ok_or(ErrorKind::InvalidArgument)?;
        let start = base.wrapping_add(t.offset as usize);
        Ok((start, Span { start: start.addr(), end: base.addr() + end as usize }))
    }

    /// The bytes of `t`, as addresses.
    pub fn span(&self, t: &TensorDesc) -> Result<Span, ErrorKind> {
        Ok(self.locate(t)?.1)
    }

    /// Whether `dst` is exactly `src` (run in place), after checking that it
    /// is that or disjoint from it.
    pub fn same_or_disjoint(&self, dst: &TensorDesc, src: &TensorDesc) -> Result<bool, ErrorKind> {
        let (d, s) = (self.span(dst)?, self.span(src)?);
        if d == s && dst.nb == src.nb && dst.ne == src.ne && dst.dtype == src.dtype {
            Ok(true)
        } else if d.overlaps(s) {
            Err(ErrorKind::InvalidArgument)
        } else {
            Ok(false)
        }
    }

    /// Checks that `dst` does not overlap `src` at all.
    pub fn disjoint(&self, dst: &TensorDesc, src: &TensorDesc) -> Result<(), ErrorKind> {
        if self.span(dst)?.overlaps(self.span(src)?) {
            return Err(ErrorKind::InvalidArgument);
        }
        Ok(())
    }

    /// The bytes of `t`, to read.
    ///
    /// # Safety
    /// No mutable slice over these bytes may be alive while this one is.
    pub unsafe fn bytes(&self, t: &TensorDesc) -> Result<&[u8], ErrorKind> {
        let (start, s) = self.locate(t)?;
        // SAFETY: [start, end) lies in a buffer (validate + run_batch) that stays
        // valid and untouched by anything else while the batch runs (the `Buffers`
        // contract), so for as long as `self`; the caller rules out a live mutable view.
        Ok(unsafe { core::slice::from_raw_parts(start, s.end - s.start) })
    }

    /// The bytes of `t`, to write, for a lifetime the caller picks (the
    /// buffers stay valid as long as the batch runs).
    ///
    /// # Safety
    /// No other slice over these bytes may be alive while this one is, and it
    /// must not outlive the batch.
    pub unsafe fn bytes_mut<'m>(&self, t: &TensorDesc) -> Result<&'m mut [u8], ErrorKind> {
        let (start, s) = self.locate(t)?;
        // SAFETY: as for `bytes` (the buffers are writable), and the caller makes
        // this the only view and keeps it within the batch.
        Ok(unsafe { core::slice::from_raw_parts_mut(start, s.end - s.start) })
    }
}

/// Whether `t` is densely packed in ggml's row-major order.
pub fn contiguous(t: &TensorDesc) -> bool {
    TensorDesc::contiguous(t.dtype, t.ne, t.buffer, t.offset).is_some_and(|c| c.nb == t.nb)
}

/// Plain values (f32, i32, f16) valid for any bit pattern.
pub trait Word: Copy {}
impl Word for f32 {}
impl Word for i32 {}
impl Word for half::f16 {}

/// Bytes as `T`s; `InvalidArgument` if misaligned or ragged.
pub fn words<T: Word>(b: &[u8]) -> Result<&[T], ErrorKind> {
    // SAFETY: T is a plain type valid for any bits; align_to only yields aligned elements.
    let (pre, w, post) = unsafe { b.align_to::<T>() };
    if pre.is_empty() && post.is_empty() {
        Ok(w)
    } else {
        Err(ErrorKind::InvalidArgument)
    }
}

/// Mutable bytes as `T`s; `InvalidArgument` if misaligned or ragged.
pub fn words_mut<T: Word>(b: &mut [u8]) -> Result<&mut [T], ErrorKind> {
    // SAFETY: as in `words`.
    let (pre, w, post) = unsafe { b.align_to_mut::<T>() };
    if pre.is_empty() && post.is_empty() {
        Ok(w)
    } else {
        Err(ErrorKind::InvalidArgument)
    }
}

/// `n` f32 of scratch.
pub fn scratch_f32<'s>(s: &mut Scratch<'s>, n: usize) -> Result<&'s mut [f32], ErrorKind> {
    words_mut(s.take(n * 4)?)
}

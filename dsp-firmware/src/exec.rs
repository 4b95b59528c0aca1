//! Executes one op batch over mapped shared buffers: resolves the buffer table
//! against [`SharedRegion`], checks every op against the device's capabilities
//! (`keel_npu_hal::support`), and runs the ops in order. The first failing op
//! stops the batch (`BatchStatus::Failed { op, kind }`); ops before it ran.
//!
//! Ops: `MatMul` of Tiles32 Q8_0/Q4_0 weights by F32 activation columns into
//! F32 outputs: each column is quantized to Q8_0 on the DSP (into scratch), then
//! [`crate::matvec`] runs the HVX block sums and the scales.

use keel_npu_hal::op::{DType, OpDesc, OpKind, Support, TensorDesc};
use keel_npu_hal::support::check_op;
use keel_npu_hal::wire::{BatchMsg, MAX_BUFFERS};
use keel_npu_hal::{BatchStatus, Caps, ErrorKind};

use crate::matvec::{matvec, TiledWeights};
use crate::quantize::{quantize_row, ActBlock};
use crate::scratch::{Scratch, ALIGN};
use crate::shm::SharedRegion;

/// Runs `msg`'s ops in order.
pub fn run_batch(msg: &BatchMsg, region: &SharedRegion, caps: &Caps, scratch: &mut Scratch<'_>) -> BatchStatus {
    let failed = |op: usize, kind| BatchStatus::Failed { op: op as u16, kind };
    let batch = msg.batch();
    if let Err(kind) = batch.validate() {
        return failed(0, kind);
    }
    // Device address of each buffer in the table, checked against its mapping.
    let mut bases = [0usize; MAX_BUFFERS];
    for (base, r) in bases.iter_mut().zip(batch.buffers) {
        match region.get(r.id) {
            Some((addr, len)) if r.size <= u64::from(len) => *base = addr,
            _ => return failed(0, ErrorKind::InvalidArgument),
        }
    }
    for (i, op) in batch.ops.iter().enumerate() {
        if check_op(caps, op, batch.tensors) != Support::Yes {
            return failed(i, ErrorKind::Unsupported);
        }
        let r = match op.kind {
            OpKind::MatMul => matmul(op, batch.tensors, &bases, &mut scratch.scope()),
            _ => Err(ErrorKind::Unsupported),
        };
        if let Err(kind) = r {
            return failed(i, kind);
        }
    }
    BatchStatus::Done
}

/// A tensor's bytes as a device address range.
fn span(t: &TensorDesc, bases: &[usize]) -> Result<(usize, usize), ErrorKind> {
    let start = bases[usize::from(t.buffer)] + t.offset as usize;
    // `validate` checked that `end` exists and lies inside the buffer.
    let end = bases[usize::from(t.buffer)] + t.end().ok_or(ErrorKind::InvalidArgument)? as usize;
    Ok((start, end))
}

fn contiguous(t: &TensorDesc) -> bool {
    TensorDesc::contiguous(t.dtype, t.ne, t.buffer, t.offset).is_some_and(|c| c.nb == t.nb)
}

fn matmul(op: &OpDesc, t: &[TensorDesc], bases: &[usize], scratch: &mut Scratch<'_>) -> Result<(), ErrorKind> {
    let idx = |i: Option<u16>| i.map(usize::from).ok_or(ErrorKind::InvalidArgument);
    let (w, x, d) = (&t[idx(op.src[0])?], &t[idx(op.src[1])?], &t[usize::from(op.dst)]);
    if !contiguous(x) || !contiguous(d) || x.dtype != DType::F32 {
        return Err(ErrorKind::Unsupported);
    }
    let (ws, we) = span(w, bases)?;
    let (xs, xe) = span(x, bases)?;
    let (ds, de) = span(d, bases)?;
    let overlaps = |(s, e): (usize, usize)| s < de && ds < e;
    if overlaps((ws, we)) || overlaps((xs, xe)) || ws % ALIGN != 0 || xs % 4 != 0 || ds % 4 != 0 {
        return Err(ErrorKind::InvalidArgument);
    }
    let (k, rows, cols) = (x.ne[0] as usize, w.ne[1] as usize, x.ne[1] as usize);
    let nb = k / 32;

    // Quantize every column first, into scratch (VTCM).
    let act_bytes = scratch.take(cols * nb * core::mem::size_of::<ActBlock>())?;
    // SAFETY: ActBlock is repr(C) of u32/i32/f32/u16 fields, valid for any bit
    // pattern; align_to_mut only yields correctly aligned elements.
    let (_, acts, _) = unsafe { act_bytes.align_to_mut::<ActBlock>() };
    let acts = acts.get_mut(..cols * nb).ok_or(ErrorKind::OutOfMemory)?;
    // SAFETY: [xs, xe) lies inside a buffer mapped by `SharedRegion` (checked by
    // `validate` and `run_batch`), is 4-aligned, holds cols·k f32 (contiguous),
    // and the host does not touch buffers of a batch in flight.
    let xv = unsafe { core::slice::from_raw_parts(xs as *const f32, cols * k) };
    for (col, a) in xv.chunks_exact(k).zip(acts.chunks_exact_mut(nb.max(1))) {
        quantize_row(col, a);
    }
    // SAFETY: as for x; [ws, we) is 128-aligned and does not overlap dst.
    let packed = unsafe { core::slice::from_raw_parts(ws as *const u8, we - ws) };
    // SAFETY: [ds, de) is mapped, 4-aligned, holds rows·cols f32, and overlaps
    // neither source (checked above), so this is the only live view of it.
    let out = unsafe { core::slice::from_raw_parts_mut(ds as *mut f32, rows * cols) };
    let weights = TiledWeights { dtype: w.dtype, rows: rows as u32, k: k as u32, packed };
    for (c, o) in out.chunks_exact_mut(rows).enumerate() {
        matvec(&weights, &acts[c * nb..][..nb], &mut scratch.scope(), o, None)?;
    }
    Ok(())
}

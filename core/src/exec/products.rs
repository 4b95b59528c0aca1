//! Matrix products and data movement: `MatMul`, `Quantize`, `GetRows`, `Copy`, each a
//! call into keel-core's quant code (`quant::tiles32`, `Kernels`): this module only
//! resolves the tensors and hands out scratch.

use half::f16;
use keel_npu_hal::op::{DType, OpDesc, TensorDesc};
use keel_npu_hal::ErrorKind;

use super::view::{contiguous, words, words_mut, Tensors};
use super::{kernels, Scratch, ALIGN};
use crate::ggml_type::GgmlType;
use crate::matmul::SharedMut;
use crate::parallel::{split_range, Parallel};
use core::sync::atomic::{AtomicU32, Ordering};
use crate::quant::tiles32::{self, quantize_act, ActBlock, TiledWeights};

/// `dst[col] = W · x[col]`: W in Tiles32 (Q8_0, Q4_0, IQ4_NL); x F32 (each column
/// quantized to Q8_0 here, into scratch, by keel-core's rule) or Q8_0 ggml blocks.
pub fn matmul(op: &OpDesc, ts: &Tensors<'_>, scratch: &mut Scratch<'_>, par: &dyn Parallel) -> Result<(), ErrorKind> {
    let (w, x, d) = (ts.src(op, 0)?, ts.src(op, 1)?, ts.dst(op)?);
    if !contiguous(x) || !contiguous(d) {
        return Err(ErrorKind::Unsupported);
    }
    ts.disjoint(d, w)?;
    ts.disjoint(d, x)?;
    if ts.span(w)?.start % ALIGN != 0 {
        return Err(ErrorKind::InvalidArgument);
    }
    let (k, rows, cols) = (x.ne[0] as usize, w.ne[1] as usize, x.ne[1] as usize);
    let nb = k / 32;
    let kern = kernels();

    // The columns as Q8_0 blocks in the kernels' form, in scratch.
    let act_bytes = scratch.take(cols * nb * core::mem::size_of::<ActBlock>())?;
    // SAFETY: ActBlock is repr(C) of u32/i32/f32/u16 fields, valid for any bit
    // pattern; align_to_mut only yields correctly aligned elements.
    let (_, acts, _) = unsafe { act_bytes.align_to_mut::<ActBlock>() };
    let acts = acts.get_mut(..cols * nb).ok_or(ErrorKind::OutOfMemory)?;
    // SAFETY: x and w do not overlap d (checked), the only mutable view.
    let (xb, packed) = unsafe { (ts.bytes(x)?, ts.bytes(w)?) };
    match x.dtype {
        DType::F32 => {
            // Block by block (each block's scale is its own), the blocks split over par's
            // tasks: the same bytes whatever the split.
            let xs = words::<f32>(xb)?.get(..cols * k).filter(|_| k % 32 == 0).ok_or(ErrorKind::InvalidArgument)?;
            let n = cols * nb;
            let tasks = par.n_threads().clamp(1, n.max(1));
            let blocks = SharedMut::new(acts);
            let failed = AtomicU32::new(0);
            par.run(tasks, &|i| {
                let r = split_range(n, tasks, i);
                // SAFETY: task i alone writes blocks r (the tasks' ranges are disjoint).
                let out = unsafe { blocks.slice(r.start, r.len()) };
                if quantize_act(&kern, &xs[32 * r.start..32 * r.end], out).is_err() {
                    failed.store(1, Ordering::Relaxed);
                }
            });
            if failed.load(Ordering::Relaxed) != 0 {
                return Err(ErrorKind::InvalidArgument);
            }
        }
        DType::Q8_0 => {
            for (a, blk) in acts.iter_mut().zip(xb.chunks_exact(34)) {
                *a = ActBlock::from_q8_0(blk.try_into().map_err(|_| ErrorKind::InvalidArgument)?);
            }
        }
        _ => return Err(ErrorKind::Unsupported),
    }
    // SAFETY: d overlaps neither source (checked): the only view of its bytes.
    let out = words_mut::<f32>(unsafe { ts.bytes_mut(d)? })?;
    let weights = TiledWeights { dtype: w.dtype, rows, k, packed };
    let free = scratch.take(scratch.remaining())?;
    // All columns in one pass over the weights: each chunk of tiles serves every column;
    // the row groups are split over par's tasks.
    tiles32::matmul_par(&kern, &weights, &acts[..cols * nb], cols, free, out.get_mut(..cols * rows).ok_or(ErrorKind::InvalidArgument)?, par)?;
    Ok(())
}

/// F32 rows → Q8_0 ggml blocks (f16 d, 32 × i8), keel-core's activation rule.
pub fn quantize(op: &OpDesc, ts: &Tensors<'_>) -> Result<(), ErrorKind> {
    let (x, d) = (ts.src(op, 0)?, ts.dst(op)?);
    if !contiguous(x) || !contiguous(d) {
        return Err(ErrorKind::Unsupported);
    }
    ts.disjoint(d, x)?;
    // SAFETY: x and d are disjoint (checked); d's view is the only mutable one.
    let (xv, out) = unsafe { (words::<f32>(ts.bytes(x)?)?, ts.bytes_mut(d)?) };
    let n = xv.len() - xv.len() % 32;
    let out = out.get_mut(..n / 32 * 34).ok_or(ErrorKind::InvalidArgument)?;
    kernels().quantize_activations(GgmlType::Q8_0, &xv[..n], out).map_err(|_| ErrorKind::InvalidArgument)
}

/// `dst[i] = row idx[i] of src0`, dequantized to F32 (embedding lookup) by keel-core.
pub fn get_rows(op: &OpDesc, ts: &Tensors<'_>) -> Result<(), ErrorKind> {
    let (a, idx, d) = (ts.src(op, 0)?, ts.src(op, 1)?, ts.dst(op)?);
    if !contiguous(idx) || !contiguous(d) || a.ne[2] != 1 || a.ne[3] != 1 {
        return Err(ErrorKind::Unsupported);
    }
    ts.disjoint(d, a)?;
    ts.disjoint(d, idx)?;
    let ty = GgmlType::from_id(a.dtype.ggml_type_id()).ok_or(ErrorKind::Unsupported)?;
    let row_bytes = a.dtype.row_bytes(a.ne[0]).ok_or(ErrorKind::InvalidArgument)? as usize;
    // SAFETY: d overlaps neither source (checked): its view is the only mutable one.
    let (src, ids, out) = unsafe { (ts.bytes(a)?, words::<i32>(ts.bytes(idx)?)?, words_mut::<f32>(ts.bytes_mut(d)?)?) };
    let kern = kernels();
    for (&i, o) in ids.iter().zip(out.chunks_exact_mut(a.ne[0] as usize)) {
        let r = usize::try_from(i).ok().filter(|&r| r < a.ne[1] as usize).ok_or(ErrorKind::InvalidArgument)?;
        let at = r * a.nb[1] as usize;
        kern.dequantize_row(ty, &src[at..at + row_bytes], o).map_err(|_| ErrorKind::Unsupported)?;
    }
    Ok(())
}

/// F32 → F32 or F16 (keel-core's conversion, round to nearest even), same shape,
/// either side strided (rows contiguous).
pub fn copy(op: &OpDesc, ts: &Tensors<'_>) -> Result<(), ErrorKind> {
    let (x, d) = (ts.src(op, 0)?, ts.dst(op)?);
    let es = d.dtype.block_bytes() as usize;
    if x.nb[0] != 4 || d.nb[0] as usize != es {
        return Err(ErrorKind::Unsupported);
    }
    if ts.same_or_disjoint(d, x)? {
        return Ok(()); // the very same F32 tensor
    }
    // SAFETY: disjoint (checked); d's view is the only mutable one.
    let (src, out) = unsafe { (ts.bytes(x)?, ts.bytes_mut(d)?) };
    let (n0, kern) = (x.ne[0] as usize, kernels());
    for i3 in 0..x.ne[3] as usize {
        for i2 in 0..x.ne[2] as usize {
            for i1 in 0..x.ne[1] as usize {
                let off = |t: &TensorDesc| i1 * t.nb[1] as usize + i2 * t.nb[2] as usize + i3 * t.nb[3] as usize;
                let row = words::<f32>(&src[off(x)..off(x) + 4 * n0])?;
                let o = &mut out[off(d)..off(d) + es * n0];
                if es == 2 {
                    kern.f32_to_f16(row, words_mut::<f16>(o)?);
                } else {
                    o.iter_mut().zip(row.iter().flat_map(|v| v.to_le_bytes())).for_each(|(o, b)| *o = b);
                }
            }
        }
    }
    Ok(())
}

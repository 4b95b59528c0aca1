//! The float ops of a layer: descriptors → keel-core's ops (`crate::ops`,
//! `crate::attention`) over slices, so a device computes the CPU's bits. Every op
//! here writes a contiguous F32 destination that is either its first source (in place)
//! or disjoint from it: the first source is copied over first when they differ, then
//! the op runs in place. Other sources must be disjoint.

use half::f16;
use keel_npu_hal::op::{DType, OpDesc, OpKind, TensorDesc};
use keel_npu_hal::ErrorKind;

use super::view::{contiguous, scratch_f32, words, words_mut, Tensors};
use super::{kernels, Scratch};
use crate::attention::{attend_heads, KeySpan};
use crate::ops;
use crate::matmul::SharedMut;
use crate::parallel::{split_range, Parallel};
use core::sync::atomic::{AtomicU32, Ordering};

/// The destination as F32, holding a copy of source `a` (or being it).
///
/// # Safety
/// No other view of `d`'s bytes may be alive while the result is (sources
/// other than `a` must have been checked disjoint from `d`).
unsafe fn dst_from<'m>(ts: &Tensors<'_>, d: &TensorDesc, a: &TensorDesc) -> Result<&'m mut [f32], ErrorKind> {
    if !contiguous(a) || !contiguous(d) {
        return Err(ErrorKind::Unsupported);
    }
    let same = ts.same_or_disjoint(d, a)?;
    // SAFETY: d is a or disjoint from it (checked); the caller makes this the
    // only view of d; `a`'s bytes are read below only when disjoint from d.
    let out = words_mut::<f32>(unsafe { ts.bytes_mut(d)? })?;
    if !same {
        // SAFETY: disjoint from d (checked above).
        out.copy_from_slice(words::<f32>(unsafe { ts.bytes(a)? })?);
    }
    Ok(out)
}

/// A read-only F32 source that must not overlap the destination.
fn other<'t>(ts: &'t Tensors<'_>, d: &TensorDesc, b: &TensorDesc) -> Result<&'t [f32], ErrorKind> {
    if !contiguous(b) {
        return Err(ErrorKind::Unsupported);
    }
    ts.disjoint(d, b)?;
    // SAFETY: disjoint from the destination (checked), the only mutable view.
    words::<f32>(unsafe { ts.bytes(b)? })
}

/// `f` on every row of src0, into dst.
pub fn unary(op: &OpDesc, ts: &Tensors<'_>, f: impl Fn(&mut [f32])) -> Result<(), ErrorKind> {
    let (a, d) = (ts.src(op, 0)?, ts.dst(op)?);
    // SAFETY: the op's only view of d.
    let x = unsafe { dst_from(ts, d, a)? };
    x.chunks_exact_mut(a.ne[0] as usize).for_each(f);
    Ok(())
}

/// RMSNorm of each row, times the weight row src1 if given.
pub fn norm(op: &OpDesc, ts: &Tensors<'_>, eps: f32) -> Result<(), ErrorKind> {
    let (a, d) = (ts.src(op, 0)?, ts.dst(op)?);
    let w = match op.src[1] {
        Some(_) => Some(other(ts, d, ts.src(op, 1)?)?),
        None => None,
    };
    let n = a.ne[0] as usize;
    if w.is_some_and(|w| w.len() < n) {
        return Err(ErrorKind::InvalidArgument);
    }
    // SAFETY: the weight row was checked disjoint from d; the op's only view of d.
    let x = unsafe { dst_from(ts, d, a)? };
    for row in x.chunks_exact_mut(n) {
        match w {
            Some(w) => ops::rms_norm_weighted(row, &w[..n], eps),
            None => ops::rms_norm_unweighted(row, eps),
        }
    }
    Ok(())
}

/// Add, Mul (src1 the same shape or one broadcast row), SwiGLU, GeGLU.
pub fn binary(op: &OpDesc, ts: &Tensors<'_>) -> Result<(), ErrorKind> {
    let (mut a, mut b, d) = (ts.src(op, 0)?, ts.src(op, 1)?, ts.dst(op)?);
    // A commutative op may run in place on its second operand instead.
    if matches!(op.kind, OpKind::Add | OpKind::Mul) && b.ne == a.ne && ts.span(b)? == ts.span(d)? {
        core::mem::swap(&mut a, &mut b);
    }
    let y = other(ts, d, b)?;
    // SAFETY: y was checked disjoint from d; the op's only view of d.
    let x = unsafe { dst_from(ts, d, a)? };
    let kern = kernels();
    match op.kind {
        OpKind::Add => x.chunks_mut(y.len()).for_each(|row| ops::add_assign(row, y)),
        OpKind::Mul => x.chunks_mut(y.len()).for_each(|row| ops::mul_assign(row, y)),
        OpKind::SwiGlu if y.len() == x.len() => kern.swiglu(x, y),
        OpKind::GeGlu if y.len() == x.len() => kern.geglu(x, y),
        OpKind::SwiGlu | OpKind::GeGlu => return Err(ErrorKind::InvalidArgument),
        _ => return Err(ErrorKind::Unsupported),
    }
    Ok(())
}

/// RoPE of `[head_dim, n_head, n_tokens]` at the I32 positions src1, with the
/// host's `(cos, sin)` table src2 or angles computed here (`ops::rope_angles`).
pub fn rope(op: &OpDesc, ts: &Tensors<'_>, n_dims: u16, mode: u8, base: f32, s: &mut Scratch<'_>) -> Result<(), ErrorKind> {
    let (a, d) = (ts.src(op, 0)?, ts.dst(op)?);
    let pos = words::<i32>({
        let p = ts.src(op, 1)?;
        ts.disjoint(d, p)?;
        // SAFETY: disjoint from the destination (checked).
        unsafe { ts.bytes(p)? }
    })?;
    let table = match op.src[2] {
        Some(_) => Some(other(ts, d, ts.src(op, 2)?)?),
        None => None,
    };
    if a.ne[3] != 1 {
        return Err(ErrorKind::Unsupported);
    }
    let n = usize::from(n_dims);
    let own = scratch_f32(s, n)?;
    // SAFETY: positions and table were checked disjoint from d; the op's only view of d.
    let x = unsafe { dst_from(ts, d, a)? };
    let (head_dim, n_head) = (a.ne[0] as usize, a.ne[1] as usize);
    if n > head_dim || n % 2 != 0 || table.is_some_and(|tab| tab.len() < n * (x.len() / (head_dim * n_head).max(1))) {
        return Err(ErrorKind::InvalidArgument);
    }
    for (t, tok) in x.chunks_exact_mut(head_dim * n_head).enumerate() {
        let cs: &[f32] = match table {
            Some(tab) => &tab[t * n..][..n],
            None => {
                let p = pos.get(t).and_then(|&p| usize::try_from(p).ok()).ok_or(ErrorKind::InvalidArgument)?;
                ops::rope_angles(p, base, n, own);
                own
            }
        };
        for head in tok.chunks_exact_mut(head_dim) {
            if mode == 2 {
                ops::rope_neox(head, cs, n);
            } else {
                ops::rope_normal(head, cs, n);
            }
        }
    }
    Ok(())
}

/// Causal attention of Q `[head_dim, n_head, n_tokens]` over K, V
/// `[head_dim, n_kv, n_head_kv]` (F16 caches, any row strides, e.g. keel's
/// position-major cache) into dst (Q's shape, contiguous; may be Q itself), one
/// `crate::attention::attend_heads` call per query head (keel's CPU arithmetic).
/// Query head `h` reads cache head `h / (n_head / n_head_kv)`; token `t` (position
/// `p = n_kv − n_tokens + t`) sees positions `0 ..= p`, or `p + 1 − window ..= p` with a
/// sliding window (the keys in position order: keel's CPU ring cache gives the same).
#[allow(clippy::too_many_arguments)]
pub fn attention(op: &OpDesc, ts: &Tensors<'_>, n_head: u16, n_head_kv: u16, scale: f32, window: u32, s: &mut Scratch<'_>, par: &dyn Parallel) -> Result<(), ErrorKind> {
    let (q, k, v, d) = (ts.src(op, 0)?, ts.src(op, 1)?, ts.src(op, 2)?, ts.dst(op)?);
    let (head_dim, n_tokens, n_kv) = (q.ne[0] as usize, q.ne[2] as usize, k.ne[1] as usize);
    // A cache as f16 elements with its position and head strides (in elements).
    let cache = |c: &TensorDesc| -> Result<(&[f16], usize, usize), ErrorKind> {
        if c.dtype != DType::F16 {
            return Err(ErrorKind::Unsupported);
        }
        if c.nb[0] != 2 || !c.nb[1].is_multiple_of(2) || !c.nb[2].is_multiple_of(2) || c.ne[0] as usize != head_dim || c.ne[1] as usize != n_kv {
            return Err(ErrorKind::InvalidArgument);
        }
        ts.disjoint(d, c)?;
        // SAFETY: disjoint from the destination (checked).
        let bytes = unsafe { ts.bytes(c)? };
        Ok((words::<f16>(&bytes[..bytes.len() - bytes.len() % 2])?, c.nb[1] as usize / 2, c.nb[2] as usize / 2))
    };
    let ((kc, kps, khs), (vc, vps, vhs)) = (cache(k)?, cache(v)?);
    if q.nb[0] != 4 || !contiguous(d) || n_head_kv == 0 || !n_head.is_multiple_of(n_head_kv) || n_tokens > n_kv {
        return Err(ErrorKind::Unsupported);
    }
    let same = ts.same_or_disjoint(d, q)?;
    // The (token, head) pairs split over par's tasks, each with its own work rows.
    let pairs = n_tokens * usize::from(n_head);
    let tasks = par.n_threads().clamp(1, pairs.max(1));
    let qbufs = scratch_f32(s, tasks * head_dim)?;
    let (qhs, accs) = (scratch_f16(s, tasks * head_dim)?, scratch_f16(s, tasks * head_dim)?);
    let (qbufs, qhs, accs) = (SharedMut::new(qbufs), SharedMut::new(qhs), SharedMut::new(accs));
    // Q, when it is not the destination: read in place; when it is, each pair's row is
    // copied into qbuf first.
    // SAFETY: disjoint from the destination (checked by same_or_disjoint).
    let qbytes = if same { None } else { Some(unsafe { ts.bytes(q)? }) };
    // SAFETY: the destination overlaps neither cache (checked) and Q only if it is Q.
    let out = words_mut::<f32>(unsafe { ts.bytes_mut(d)? })?;
    let (out_len, out) = (out.len(), SharedMut::new(out));
    let (group, kern) = (usize::from(n_head / n_head_kv), kernels());
    let task = |i: usize| -> Result<(), ErrorKind> {
        // SAFETY: task i alone uses row i of each work buffer (i < tasks).
        let (qbuf, qh, acc) = unsafe { (qbufs.slice(i * head_dim, head_dim), qhs.slice(i * head_dim, head_dim), accs.slice(i * head_dim, head_dim)) };
        for p in split_range(pairs, tasks, i) {
            let (t, h) = (p / usize::from(n_head), p % usize::from(n_head));
            let n_pos = n_kv - n_tokens + t + 1;
            let o = p * head_dim;
            if o + head_dim > out_len {
                return Err(ErrorKind::InvalidArgument);
            }
            let kvh = h / group;
            let first = if window > 0 { n_pos.saturating_sub(window as usize) } else { 0 };
            let span = KeySpan { len: n_pos - first, first_slot: first, ring: n_kv, k_base: kvh * khs, k_stride: kps, v_base: kvh * vhs, v_stride: vps };
            let last = |base: usize, stride: usize| base + (n_pos - 1) * stride + head_dim;
            if last(span.k_base, kps) > kc.len() || last(span.v_base, vps) > vc.len() {
                return Err(ErrorKind::InvalidArgument);
            }
            // SAFETY: pair p's row of the destination is this task's alone.
            let dst = unsafe { out.slice(o, head_dim) };
            let qrow: &[f32] = match qbytes {
                Some(qb) => {
                    let at = t * q.nb[2] as usize + h * q.nb[1] as usize;
                    words::<f32>(qb.get(at..at + 4 * head_dim).ok_or(ErrorKind::InvalidArgument)?)?
                }
                None => {
                    qbuf.copy_from_slice(dst);
                    qbuf
                }
            };
            attend_heads(&kern, qrow, head_dim, head_dim, kc, vc, span, scale, qh, acc, dst);
        }
        Ok(())
    };
    // Every error a task can meet is an InvalidArgument (a row outside its tensor).
    let invalid = AtomicU32::new(0);
    par.run(tasks, &|i| {
        if task(i).is_err() {
            invalid.store(1, Ordering::Relaxed);
        }
    });
    if invalid.load(Ordering::Relaxed) != 0 {
        return Err(ErrorKind::InvalidArgument);
    }
    Ok(())
}

/// `n` f16 of scratch.
fn scratch_f16<'s>(s: &mut Scratch<'s>, n: usize) -> Result<&'s mut [f16], ErrorKind> {
    words_mut::<f16>(s.take(2 * n)?)
}

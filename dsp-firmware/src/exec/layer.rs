//! The float ops of a layer: descriptors → [`crate::ops`] over slices. Every
//! op here writes a contiguous F32 destination that is either its first source
//! (in place) or disjoint from it: the first source is copied over first when
//! they differ, then the op runs in place. Other sources must be disjoint.

use keel_npu_hal::op::{DType, OpDesc, OpKind, TensorDesc};
use keel_npu_hal::ErrorKind;

use super::view::{contiguous, scratch_f32, words, words_mut, Tensors};
use crate::ops::attention::{attend, attend_f16, Cache};
use crate::ops::{act, norm, rope as rot};
use crate::scratch::Scratch;

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
pub fn rms_norm(op: &OpDesc, ts: &Tensors<'_>, eps: f32) -> Result<(), ErrorKind> {
    let (a, d) = (ts.src(op, 0)?, ts.dst(op)?);
    let w = match op.src[1] {
        Some(_) => Some(other(ts, d, ts.src(op, 1)?)?),
        None => None,
    };
    // SAFETY: the weight row was checked disjoint from d; the op's only view of d.
    let x = unsafe { dst_from(ts, d, a)? };
    x.chunks_exact_mut(a.ne[0] as usize).for_each(|row| norm::rms_norm(row, w, eps));
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
    match op.kind {
        OpKind::Add => act::add(x, y),
        OpKind::Mul => act::mul(x, y),
        OpKind::SwiGlu => act::swiglu(x, y),
        OpKind::GeGlu => act::geglu(x, y),
        _ => return Err(ErrorKind::Unsupported),
    }
    Ok(())
}

/// RoPE of `[head_dim, n_head, n_tokens]` at the I32 positions src1, with the
/// host's `(cos, sin)` table src2 or angles computed here ([`rot::angles`]).
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
    for (t, tok) in x.chunks_exact_mut(head_dim * n_head).enumerate() {
        let cs: &[f32] = match table {
            Some(tab) => &tab[t * n..][..n],
            None => {
                rot::angles(pos[t], base, own);
                own
            }
        };
        for head in tok.chunks_exact_mut(head_dim) {
            if mode == 2 {
                rot::neox(head, cs);
            } else {
                rot::normal(head, cs);
            }
        }
    }
    Ok(())
}

/// Causal attention of Q `[head_dim, n_head, n_tokens]` over K, V
/// `[head_dim, n_kv, n_head_kv]` (F32 or F16, strided) into dst (Q's shape,
/// contiguous; may be Q itself). Query head `h` reads cache head
/// `h / (n_head / n_head_kv)`; token `t` sees positions `0 ..= n_kv − n_tokens + t`.
pub fn attention(op: &OpDesc, ts: &Tensors<'_>, n_head: u16, n_head_kv: u16, scale: f32, s: &mut Scratch<'_>) -> Result<(), ErrorKind> {
    let (q, k, v, d) = (ts.src(op, 0)?, ts.src(op, 1)?, ts.src(op, 2)?, ts.dst(op)?);
    let (head_dim, n_tokens, n_kv) = (q.ne[0] as usize, q.ne[2] as usize, k.ne[1] as usize);
    let cache = |c: &TensorDesc| -> Result<Cache<'_>, ErrorKind> {
        let f16 = c.dtype == DType::F16;
        if c.nb[0] != c.dtype.block_bytes() {
            return Err(ErrorKind::Unsupported);
        }
        ts.disjoint(d, c)?;
        // SAFETY: disjoint from the destination (checked).
        Ok(Cache { bytes: unsafe { ts.bytes(c)? }, f16, pos_stride: c.nb[1] as usize, head_stride: c.nb[2] as usize })
    };
    let (kc, vc) = (cache(k)?, cache(v)?);
    if q.nb[0] != 4 || !contiguous(d) {
        return Err(ErrorKind::Unsupported);
    }
    let same = ts.same_or_disjoint(d, q)?;
    let (qbuf, obuf) = (scratch_f32(s, head_dim)?, scratch_f32(s, head_dim)?);
    let f16 = kc.f16 && vc.f16;
    let (qh, acc) = if f16 { (scratch_f32(s, head_dim)?, scratch_f32(s, head_dim)?) } else { (&mut [][..], &mut [][..]) };
    // Q, when it is not the destination: copied head by head into qbuf below.
    // SAFETY: disjoint from the destination (checked by same_or_disjoint).
    let qbytes = if same { None } else { Some(unsafe { ts.bytes(q)? }) };
    // SAFETY: the destination overlaps neither cache (checked) and Q only if it is Q.
    let out = words_mut::<f32>(unsafe { ts.bytes_mut(d)? })?;
    let group = usize::from(n_head / n_head_kv);
    for t in 0..n_tokens {
        let n_pos = n_kv - n_tokens + t + 1;
        for h in 0..usize::from(n_head) {
            let o = (t * usize::from(n_head) + h) * head_dim;
            match qbytes {
                Some(qb) => {
                    let at = t * q.nb[2] as usize + h * q.nb[1] as usize;
                    qbuf.copy_from_slice(words::<f32>(&qb[at..at + 4 * head_dim])?);
                }
                None => qbuf.copy_from_slice(&out[o..o + head_dim]),
            }
            if f16 {
                attend_f16(qbuf, &kc, &vc, h / group, n_pos, scale, qh, acc, obuf);
            } else {
                attend(qbuf, &kc, &vc, h / group, n_pos, scale, obuf);
            }
            out[o..o + head_dim].copy_from_slice(obuf);
        }
    }
    Ok(())
}

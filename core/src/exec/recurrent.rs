//! The delta-net ops (Qwen 3.5's recurrent layers): descriptors → keel-core's
//! `delta_net` functions, one call per row, channel, or (token or chunk, head), the
//! CPU session's calls. The conv and delta-rule states are tensors resident in
//! device buffers, read and updated in place by their op; they must not overlap the
//! op's other tensors.

use keel_npu_hal::op::{OpDesc, TensorDesc};
use keel_npu_hal::ErrorKind;

use super::view::{contiguous, scratch_f32, words, words_mut, Tensors};
use super::Scratch;
use crate::delta_net;

/// Whether `t`'s rows are contiguous F32 and its strides whole f32 words (a view
/// the ops here can walk row by row).
fn f32_rows(t: &TensorDesc) -> bool {
    t.nb[0] == 4 && t.nb[1..].iter().all(|&b| b % 4 == 0)
}

/// The f32 offset of every row of `t`, in ggml order.
fn rows(t: &TensorDesc) -> impl Iterator<Item = usize> + '_ {
    let [_, n1, n2, n3] = t.ne.map(|n| n as usize);
    let [_, b1, b2, b3] = t.nb.map(|b| b as usize / 4);
    (0..n3).flat_map(move |i3| (0..n2).flat_map(move |i2| (0..n1).map(move |i1| i1 * b1 + i2 * b2 + i3 * b3)))
}

/// `L2Norm`: `delta_net::l2_norm` of each row of src0 into dst, which is src0 itself
/// (any row strides: e.g. the q and k heads inside a conv output) or disjoint from it
/// (then src0's rows are copied over first).
pub fn l2_norm_rows(op: &OpDesc, ts: &Tensors<'_>, eps: f32) -> Result<(), ErrorKind> {
    let (a, d) = (ts.src(op, 0)?, ts.dst(op)?);
    if !f32_rows(a) || !f32_rows(d) {
        return Err(ErrorKind::Unsupported);
    }
    let same = ts.same_or_disjoint(d, a)?;
    let n = a.ne[0] as usize;
    // SAFETY: d is a or disjoint from it (checked): the op's only view of d's bytes;
    // a's bytes are read only when disjoint.
    let out = words_mut::<f32>(unsafe { ts.bytes_mut(d)? })?;
    if !same {
        // SAFETY: disjoint from d (checked above).
        let src = words::<f32>(unsafe { ts.bytes(a)? })?;
        for (oa, od) in rows(a).zip(rows(d)) {
            out[od..od + n].copy_from_slice(&src[oa..oa + n]);
        }
    }
    for od in rows(d) {
        delta_net::l2_norm(&mut out[od..od + n], eps);
    }
    Ok(())
}

/// `SsmConv`: the causal depthwise conv1d + SiLU of the new inputs src0 `[ch, n]` over
/// each channel's state (src2 `[d_conv − 1, ch]`, updated in place) with the taps src1
/// `[d_conv, ch]`, into dst `[ch, n]`: `delta_net::conv_channel` per channel.
pub fn ssm_conv(op: &OpDesc, ts: &Tensors<'_>) -> Result<(), ErrorKind> {
    let (x, w, st, d) = (ts.src(op, 0)?, ts.src(op, 1)?, ts.src(op, 2)?, ts.dst(op)?);
    if ![x, w, st, d].into_iter().all(contiguous) {
        return Err(ErrorKind::Unsupported);
    }
    for src in [x, w, st] {
        ts.disjoint(d, src)?;
    }
    ts.disjoint(st, x)?;
    ts.disjoint(st, w)?;
    let (ch, n, k1) = (x.ne[0] as usize, x.ne[1] as usize, st.ne[0] as usize);
    if w.ne[0] as usize != k1 + 1 || w.ne[1] as usize != ch || st.ne[1] as usize != ch || d.ne != x.ne {
        return Err(ErrorKind::InvalidArgument);
    }
    let kb = 4 * (k1 + 1);
    // SAFETY: dst and the state overlap no other tensor of the op (checked): each
    // mutable view is the only view of its bytes.
    let (xv, taps, state, out) = unsafe { (words::<f32>(ts.bytes(x)?)?, ts.bytes(w)?, words_mut::<f32>(ts.bytes_mut(st)?)?, words_mut::<f32>(ts.bytes_mut(d)?)?) };
    for c in 0..ch {
        delta_net::conv_channel(&mut state[c * k1..(c + 1) * k1], &xv[c..], ch, &taps[c * kb..(c + 1) * kb], &mut out[c..], ch, n);
    }
    Ok(())
}

/// `GatedDeltaRule`: per value head `h` (q/k head `h % n_k_heads`) over the tokens of
/// src0 (`[d, 2·n_k_heads + n_v_heads, n]`: q heads, k heads, v heads; rows
/// contiguous, any head and token strides), with the gates src1 (`[n_v_heads, n, 2]`:
/// `beta`, then `g`; any strides) and the transposed states src2 (`[d, d, n_v_heads]`,
/// updated in place), into dst `[d, n_v_heads, n]`: `delta_net::step` per token and
/// head (`chunk` 0), else `delta_net::chunk` per run of `chunk` tokens and head.
pub fn gated_delta_rule(op: &OpDesc, ts: &Tensors<'_>, n_k_heads: u16, chunk: u16, scale: f32, s: &mut Scratch<'_>) -> Result<(), ErrorKind> {
    let (qkv, g, st, d) = (ts.src(op, 0)?, ts.src(op, 1)?, ts.src(op, 2)?, ts.dst(op)?);
    if !f32_rows(qkv) || !f32_rows(g) || !contiguous(st) || !contiguous(d) {
        return Err(ErrorKind::Unsupported);
    }
    for src in [qkv, g, st] {
        ts.disjoint(d, src)?;
    }
    ts.disjoint(st, qkv)?;
    ts.disjoint(st, g)?;
    let (ds, nk, nv, n) = (qkv.ne[0] as usize, usize::from(n_k_heads), st.ne[2] as usize, qkv.ne[2] as usize);
    if nk == 0 || qkv.ne[1] as usize != 2 * nk + nv || st.ne[..2] != [ds as u32; 2] || g.ne[..3] != [nv as u32, n as u32, 2] || d.ne != [ds as u32, nv as u32, n as u32, 1] {
        return Err(ErrorKind::InvalidArgument);
    }
    // Strides in f32: qkv's heads and tokens, the gates' tokens and planes, dst's tokens.
    let (hs, ts_) = (qkv.nb[1] as usize / 4, qkv.nb[2] as usize / 4);
    let (gt, gp) = (g.nb[1] as usize / 4, g.nb[2] as usize / 4);
    let od = nv * ds;
    // Scratch: the step's delta row, or a chunk's work (no larger than the tokens need).
    let c = usize::from(chunk).min(n);
    let need = if chunk == 0 { Some(ds) } else { c.checked_mul(c).and_then(|cc| cc.checked_add(c.checked_mul(ds)?)?.checked_add(c)) };
    let need = need.filter(|&f| f <= s.remaining() / 4).ok_or(ErrorKind::OutOfMemory)?;
    let work = scratch_f32(s, need)?;
    // SAFETY: dst and the states overlap no other tensor of the op (checked): each
    // mutable view is the only view of its bytes.
    let (x, gw, m, out) = unsafe { (words::<f32>(ts.bytes(qkv)?)?, words::<f32>(ts.bytes(g)?)?, words_mut::<f32>(ts.bytes_mut(st)?)?, words_mut::<f32>(ts.bytes_mut(d)?)?) };
    for (h, mh) in m.chunks_exact_mut(ds * ds).enumerate() {
        let (qh, kh, vh) = (h % nk * hs, (nk + h % nk) * hs, (2 * nk + h) * hs);
        if chunk == 0 {
            for i in 0..n {
                let t = i * ts_;
                let (q, k, v) = (&x[t + qh..][..ds], &x[t + kh..][..ds], &x[t + vh..][..ds]);
                delta_net::step(mh, q, k, v, gw[gp + i * gt + h], gw[i * gt + h], scale, work, &mut out[i * od + h * ds..][..ds]);
            }
            continue;
        }
        let mut i0 = 0;
        while i0 < n {
            let len = c.min(n - i0);
            let t = i0 * ts_;
            let gb = i0 * gt + h;
            delta_net::chunk(mh, &x[t + qh..], &x[t + kh..], ts_, &x[t + vh..], ts_, &mut out[i0 * od + h * ds..], od, &gw[gp + gb..], &gw[gb..], gt, len, ds, scale, work);
            i0 += len;
        }
    }
    Ok(())
}

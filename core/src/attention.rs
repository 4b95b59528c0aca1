//! Attention of one token's query heads over f16 key and value rows: keel's attention
//! arithmetic, written once. The CPU session calls it for every (token, KV head) item
//! and the DSP firmware for every query head of an `Attention` op, so both compute the
//! same bits.
//!
//! The arithmetic is llama.cpp's CPU flash attention (`one_chunk` path) operation for
//! operation, per head: q rounded to f16; per key in order `s = dot(k, q)·scale` (f16
//! dot order of [`Kernels::f16_dot`]); online softmax with the value accumulator in
//! **f16** (on a new maximum `acc *= exp(old - max)`, else `vs = exp(s - max)`;
//! `acc += v·vs` rounded to f16 each step; `sum = fma(sum, ms, vs)`); finally
//! `out = f32(acc) · (1/sum)`. Heads computed together only share the key and value
//! rows (loaded once for all of them on x86); each head's operations are its own, so
//! grouping changes no bit.
//!
//! Owns no memory: the caller passes the f16 scratch (`qh`, `acc`); a chunk's scores and
//! row offsets live on the stack.

use half::f16;

use crate::quant::Kernels;

/// Keys per chunk of the online softmax (scores and exponentials on the stack).
pub const CHUNK: usize = 64;
/// The most query heads one [`attend_heads`] call computes (heads sharing a KV head).
pub const MAX_HEADS: usize = 4;

/// Where the keys of one attention span live in the K and V rows (offsets in f16
/// elements). Key `c` of the span is in cache slot `(first_slot + c) % ring`; its key
/// row starts at `k_base + slot·k_stride`, its value row at `v_base + slot·v_stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeySpan {
    /// Keys attended to, in order.
    pub len: usize,
    /// Cache slot of the first key.
    pub first_slot: usize,
    /// Slots before the cache wraps (a sliding-window ring's size; else the cache size).
    pub ring: usize,
    /// Offset of slot 0's key row for this KV head.
    pub k_base: usize,
    /// Elements between the key rows of consecutive slots.
    pub k_stride: usize,
    /// Offset of slot 0's value row for this KV head.
    pub v_base: usize,
    /// Elements between the value rows of consecutive slots.
    pub v_stride: usize,
}

/// Attention of `nh = q.len() / hd` query heads (`q`: `nh` rows of `hd` f32, at most
/// [`MAX_HEADS`]) over the keys of `span` in `k` / `v`, into `out` (`nh` rows of `hdv`).
/// `qh` (at least `nh·hd`) and `acc` (at least `nh·hdv`) are scratch.
///
/// Panics if a row of the span lies outside `k` or `v`, or the shapes do not fit (a
/// caller's bug, not an input error: callers check their tensors first).
#[allow(clippy::too_many_arguments)]
pub fn attend_heads(kern: &Kernels, q: &[f32], hd: usize, hdv: usize, k: &[f16], v: &[f16], span: KeySpan, scale: f32, qh: &mut [f16], acc: &mut [f16], out: &mut [f32]) {
    let nh = q.len() / hd;
    assert!(nh <= MAX_HEADS && nh * hd == q.len() && out.len() == nh * hdv, "attend_heads: {nh} heads of {hd}/{hdv}");
    let (qh, acc) = (&mut qh[..nh * hd], &mut acc[..nh * hdv]);
    for (src, dst) in q.chunks_exact(hd).zip(qh.chunks_exact_mut(hd)) {
        kern.f32_to_f16(src, dst);
    }
    acc.fill(f16::ZERO);
    let (mut max, mut sum) = ([f32::NEG_INFINITY; MAX_HEADS], [0.0f32; MAX_HEADS]);
    // A chunk's scores/exponents, new-maximum flags and row offsets (each chunk writes
    // the part it reads).
    let mut e = [0.0f32; MAX_HEADS * CHUNK];
    let mut new_max = [false; MAX_HEADS * CHUNK];
    let (mut koff, mut voff) = ([0usize; CHUNK], [0usize; CHUNK]);
    // Keys in chunks: the chunk's scores, then every exponent the online softmax will
    // take (the running maximum depends only on the scores), exponentiated together
    // (`expf_batch` gives `ops::expf`'s bits), then the accumulator updates in key
    // order: the same operations on the same values as one key at a time.
    let mut slot = if span.ring == 0 { 0 } else { span.first_slot % span.ring };
    let mut c0 = 0;
    while c0 < span.len {
        let len = (span.len - c0).min(CHUNK);
        for c in 0..len {
            (koff[c], voff[c]) = (span.k_base + slot * span.k_stride, span.v_base + slot * span.v_stride);
            slot = if slot + 1 == span.ring { 0 } else { slot + 1 };
        }
        kern.f16_dot_keys_heads(k, &koff[..len], qh, hd, nh, &mut e[..nh * len]);
        for g in 0..nh {
            kern.softmax_scores(&mut e[g * len..(g + 1) * len], &mut new_max[g * len..(g + 1) * len], scale, &mut max[g]);
        }
        kern.expf_batch(&mut e[..nh * len]);
        kern.f16_mad_keys_heads(acc, hdv, nh, v, &voff[..len], &new_max[..nh * len], &e[..nh * len], &mut sum[..nh]);
        c0 += len;
    }
    for (g, o) in out.chunks_exact_mut(hdv).enumerate() {
        kern.f16_to_f32(&acc[g * hdv..(g + 1) * hdv], o);
        let inv = if sum[g] == 0.0 { 0.0 } else { 1.0 / sum[g] };
        for v in o.iter_mut() {
            *v *= inv;
        }
    }
}

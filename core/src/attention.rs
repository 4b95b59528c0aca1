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

use core::mem::MaybeUninit;

use half::f16;

use crate::prefetch::{self, Level};
use crate::quant::{Kernels, KeysDot};

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

/// The first `n` of `m` as values, `m[..*done]` being written already: the elements from
/// `*done` to `n` are set to `v` first (so each element is written once per call, and
/// only as far as it is used).
#[inline(always)]
fn prefix<'a, T: Copy>(m: &'a mut [MaybeUninit<T>], done: &mut usize, n: usize, v: T) -> &'a mut [T] {
    if n > *done {
        m[*done..n].iter_mut().for_each(|x| _ = x.write(v));
        *done = n;
    }
    // SAFETY: m[..*done] (and n <= *done) is written: before this call or just above.
    unsafe { filled(&mut m[..n]) }
}

/// `m` as the values it holds.
///
/// # Safety
/// Every element of `m` has been written.
#[inline(always)]
unsafe fn filled<T: Copy>(m: &mut [MaybeUninit<T>]) -> &mut [T] {
    // SAFETY: initialized (the caller's promise); MaybeUninit<T> has T's layout.
    unsafe { &mut *(core::ptr::from_mut(m) as *mut [T]) }
}

/// Queries one [`attend_block`] call computes together at most: 32 on x86, whose block
/// kernels convert a chunk's keys and values once per block (SmolLM2 Q4_0 pp512 at depth
/// 4096: ~5% faster than blocks of 16, BENCHMARKS.md), 16 elsewhere (stacks are small).
pub const QBLOCK: usize = if cfg!(target_arch = "x86_64") { 32 } else { 16 };

/// Room for a chunk's scores of every query of a block ([`Kernels::f16_dot_keys_queries`]:
/// the keys converted once for all of them). Only x86 has that kernel; elsewhere the
/// room is not set aside (the DSP's and microcontrollers' stacks are small).
const BLOCK_SCORES: usize = if cfg!(target_arch = "x86_64") { QBLOCK * MAX_HEADS * CHUNK } else { 0 };

/// Room for a chunk's value rows in f32 when they are rows of 64 (x86 only, as
/// [`BLOCK_SCORES`]): converted once for every query of a block
/// ([`Kernels::f32_mad_keys_heads`], the same bits).
const BLOCK_VALUES: usize = if cfg!(target_arch = "x86_64") { CHUNK * 64 } else { 0 };

/// Room for a chunk's key rows of 64 in f32, transposed (x86 only, as
/// [`BLOCK_SCORES`]): [`Kernels::f16_keys_transposed`] once per block, then each query's
/// scores by [`Kernels::f32_mad_keys_heads_dot`] during the previous query's value update.
const BLOCK_KEYS: usize = if cfg!(target_arch = "x86_64") { CHUNK * 64 } else { 0 };

/// Attention of `nh = q.len() / hd` query heads (`q`: `nh` rows of `hd` f32, at most
/// [`MAX_HEADS`]) over the keys of `span` in `k` / `v`, into `out` (`nh` rows of `hdv`).
/// `qh` (at least `nh·hd`) and `acc` (at least `nh·hdv`) are scratch. One query's
/// [`attend_block`].
///
/// Panics if a row of the span lies outside `k` or `v`, or the shapes do not fit (a
/// caller's bug, not an input error: callers check their tensors first).
#[allow(clippy::too_many_arguments)]
pub fn attend_heads(kern: &Kernels, q: &[f32], hd: usize, hdv: usize, k: &[f16], v: &[f16], span: KeySpan, scale: f32, qh: &mut [f16], acc: &mut [f16], out: &mut [f32]) {
    let nh = q.len() / hd;
    assert!(nh * hd == q.len(), "attend_heads: {nh} heads of {hd}");
    let mut out = Some(out);
    attend_block(kern, (hd, hdv, nh), k, v, scale, 1, |_| (q, span), qh, acc, |_| out.take().expect("attend_heads: one query"));
}

/// [`attend_heads`] for `nq` queries (at most [`QBLOCK`]) at once: query `j`'s `nh` heads
/// (`query(j)`: their `nh·hd` f32 and its span) into `out(j)` (`nh·hdv` f32; called once
/// per query, after its last key). The spans share the cache layout (`ring`, bases,
/// strides) and count `first_slot` in the same positions (a causal block: `0..=pos` or
/// a window ending at `pos`). Keys are taken in chunks of [`CHUNK`] positions over the
/// union of the spans, and every query whose span meets a chunk computes that part of
/// it while the chunk's key and value rows are in cache: each K/V row is read once per
/// block, not once per query (and where the kernel set can, the chunk's key rows are
/// converted once and every query's scores computed together: [`Kernels::f16_dot_keys_queries`],
/// or, rows of 64 where the set has [`Kernels::f16_keys_transposed`], transposed once and
/// each query's scores computed inside the previous query's value update:
/// [`Kernels::f32_mad_keys_heads_dot`]; and its value rows of 64 converted to f32 once for
/// every query's update: [`Kernels::f32_mad_keys_heads`]; the same bits). Per query the operations are [`attend_heads`]' in key
/// order (chunking changes no bit: the running maximum, the exponents and the
/// accumulator steps are per key); `qh` (at least `nq·nh·hd`) and `acc` (at least
/// `nq·nh·hdv`) are scratch.
///
/// Panics as [`attend_heads`], or if the spans' layouts differ.
#[allow(clippy::too_many_arguments)]
pub fn attend_block<'q, 'o>(
    kern: &Kernels,
    (hd, hdv, nh): (usize, usize, usize),
    k: &[f16],
    v: &[f16],
    scale: f32,
    nq: usize,
    query: impl Fn(usize) -> (&'q [f32], KeySpan),
    qh: &mut [f16],
    acc: &mut [f16],
    mut out: impl FnMut(usize) -> &'o mut [f32],
) {
    assert!((1..=MAX_HEADS).contains(&nh) && (1..=QBLOCK).contains(&nq), "attend_block: {nq} queries of {nh} heads of {hd}/{hdv}");
    let (qh, acc) = (&mut qh[..nq * nh * hd], &mut acc[..nq * nh * hdv]);
    let (mut lo, mut hi) = (usize::MAX, 0);
    let lay = query(0).1;
    for j in 0..nq {
        let (q, s) = query(j);
        assert!(q.len() == nh * hd, "attend_block: query {j} has {} elements, not {nh}·{hd}", q.len());
        assert!((s.ring, s.k_base, s.k_stride, s.v_base, s.v_stride) == (lay.ring, lay.k_base, lay.k_stride, lay.v_base, lay.v_stride), "attend_block: spans of different layouts");
        for (src, dst) in q.chunks_exact(hd).zip(qh[j * nh * hd..(j + 1) * nh * hd].chunks_exact_mut(hd)) {
            kern.f32_to_f16(src, dst);
        }
        (lo, hi) = (lo.min(s.first_slot), hi.max(s.first_slot + s.len));
    }
    acc.fill(f16::ZERO);
    // Each (query, head)'s running maximum and sum (`j·nh + g`): only the `nq·nh` used
    // are set (a whole-array initialization is a memset per call, slow on the DSP).
    let (mut max_mem, mut sum_mem) = ([MaybeUninit::<f32>::uninit(); QBLOCK * MAX_HEADS], [MaybeUninit::<f32>::uninit(); QBLOCK * MAX_HEADS]);
    let max = prefix(&mut max_mem, &mut 0, nq * nh, f32::NEG_INFINITY);
    let sum = prefix(&mut sum_mem, &mut 0, nq * nh, 0.0);
    // A chunk's scores/exponents, new-maximum flags (the kernels write the part a query's
    // pass reads; set once per call as far as it is used) and row offsets: not zeroed as
    // a whole per call (2.3 KiB per query head on the DSP, whose memset is slow).
    let mut e_mem = [MaybeUninit::<f32>::uninit(); MAX_HEADS * CHUNK];
    let mut new_max_mem = [MaybeUninit::<bool>::uninit(); MAX_HEADS * CHUNK];
    let (mut koff_mem, mut voff_mem) = ([MaybeUninit::<usize>::uninit(); CHUNK], [MaybeUninit::<usize>::uninit(); CHUNK]);
    let mut eb_mem = [MaybeUninit::<f32>::uninit(); BLOCK_SCORES];
    let mut vf_mem = [MaybeUninit::<f32>::uninit(); BLOCK_VALUES];
    let mut kt_mem = [MaybeUninit::<f32>::uninit(); BLOCK_KEYS];
    let (mut e_done, mut new_max_done, mut eb_done, mut vf_done, mut kt_done) = (0, 0, 0, 0, 0);
    // Per query and chunk: the part's scores, then every exponent the online softmax will
    // take (the running maximum depends only on the scores), exponentiated together
    // (`expf_batch` gives `ops::expf`'s bits), then the accumulator updates in key
    // order: the same operations on the same values as one key at a time.
    // The first chunk's key rows asked for at once (the loop below asks for each next
    // chunk's while it works on this one): in decode the cache's rows come from memory
    // (the weights streamed since evicted them), and the dot would otherwise meet each
    // row's miss in turn.
    for p in lo..(lo + CHUNK).min(hi) {
        let slot = if lay.ring == 0 { p } else { p % lay.ring };
        prefetch::lines(k.as_ptr().wrapping_add(lay.k_base + slot * lay.k_stride).cast(), 2 * hd, Level::L2);
    }
    let mut p0 = lo;
    while p0 < hi {
        let clen = (hi - p0).min(CHUNK);
        for c in 0..clen {
            let slot = if lay.ring == 0 { p0 + c } else { (p0 + c) % lay.ring };
            koff_mem[c].write(lay.k_base + slot * lay.k_stride);
            voff_mem[c].write(lay.v_base + slot * lay.v_stride);
        }
        // SAFETY: positions 0..clen were written just above.
        let (koff, voff) = unsafe { (filled(&mut koff_mem[..clen]), filled(&mut voff_mem[..clen])) };
        // The chunk's value rows (read after its scores) and the next chunk's key rows,
        // asked for into L2 now (a hint: no effect on any result) so that they arrive
        // while this chunk's keys are read and its scores computed: without it, decode at
        // depth waits on each value row's load.
        for &off in &voff[..clen] {
            prefetch::lines(v.as_ptr().wrapping_add(off).cast(), 2 * hdv, Level::L2);
        }
        for p in p0 + clen..(p0 + 2 * CHUNK).min(hi) {
            let slot = if lay.ring == 0 { p } else { p % lay.ring };
            prefetch::lines(k.as_ptr().wrapping_add(lay.k_base + slot * lay.k_stride).cast(), 2 * hd, Level::L2);
        }
        // The part of the chunk some query attends to: with more than one query, every
        // query's scores over it at once where the kernel set can (`ub > ua` then).
        let part = |j: usize| {
            let s = query(j).1;
            (s.first_slot.max(p0), (s.first_slot + s.len).min(p0 + clen))
        };
        let (ua, ub) = if nq > 1 && BLOCK_SCORES > 0 { (0..nq).map(part).filter(|(a, b)| a < b).fold((usize::MAX, 0), |(lo, hi), (a, b)| (lo.min(a), hi.max(b))) } else { (0, 0) };
        let ulen = ub.saturating_sub(ua);
        let eb = prefix(&mut eb_mem, &mut eb_done, (nq * nh * ulen).min(BLOCK_SCORES), 0.0);
        let fits = nq > 1 && ulen > 0 && nq * nh * ulen <= BLOCK_SCORES;
        // Rows of 64 where the kernel set can: the chunk's keys transposed once, and each
        // query's scores computed while the previous query's values update (`scored`:
        // the queries whose rows of `eb` are written); else every query's scores now.
        let kt = prefix(&mut kt_mem, &mut kt_done, if fits && hdv == 64 { BLOCK_KEYS } else { 0 }, 0.0);
        let fused = fits && hdv == 64 && kern.f16_keys_transposed(k, &koff[ua - p0..ub - p0], hd, kt);
        let block = fused || (fits && kern.f16_dot_keys_queries(k, &koff[ua - p0..ub - p0], qh, hd, nh, nq, eb));
        let mut scored = if fused { 0 } else { nq };
        // With the block's scores, its value rows of 64 in f32 too (converted exactly).
        let vf = if block && hdv == 64 && ulen * hdv <= BLOCK_VALUES {
            let vf = prefix(&mut vf_mem, &mut vf_done, ulen * hdv, 0.0);
            kern.f16_rows_to_f32(v, &voff[ua - p0..ub - p0], hdv, vf);
            Some(vf)
        } else {
            None
        };
        for j in 0..nq {
            let (a, b) = part(j);
            if a >= b {
                continue;
            }
            let (len, r) = (b - a, a - p0..b - p0);
            if scored <= j {
                let d = KeysDot { kt, keys: ulen, qs: &qh[j * nh * hd..(j + 1) * nh * hd], out: &mut eb[j * nh * ulen..(j + 1) * nh * ulen] };
                assert!(kern.f32_dot_transposed(nh, d), "attend_block: transposed keys without their dot");
                scored = j + 1;
            }
            // The next query's rows of `eb` (written during this query's value update).
            let (eb, eb_next) = eb.split_at_mut(((j + 1) * nh * ulen).min(eb.len()));
            let qh_next = &qh[((j + 1) * nh * hd).min(qh.len())..];
            let (qh, acc) = (&qh[j * nh * hd..(j + 1) * nh * hd], &mut acc[j * nh * hdv..(j + 1) * nh * hdv]);
            let new_max = prefix(&mut new_max_mem, &mut new_max_done, nh * len, false);
            // The query's scores: its rows of the block's when it attends to the whole
            // union, a copy of their part of them when not, else its own dots.
            let e = if block && len == ulen {
                &mut eb[j * nh * ulen..(j + 1) * nh * ulen]
            } else {
                let e = prefix(&mut e_mem, &mut e_done, nh * len, 0.0);
                if block {
                    for g in 0..nh {
                        e[g * len..(g + 1) * len].copy_from_slice(&eb[(j * nh + g) * ulen + (a - ua)..][..len]);
                    }
                } else {
                    kern.f16_dot_keys_heads(k, &koff[r.clone()], qh, hd, nh, &mut e[..nh * len]);
                }
                e
            };
            kern.softmax_scores(&mut e[..nh * len], new_max, scale, &mut max[j * nh..(j + 1) * nh]);
            kern.expf_batch(&mut e[..nh * len]);
            let (nm, e, sm) = (&new_max[..nh * len], &e[..nh * len], &mut sum[j * nh..(j + 1) * nh]);
            let xf = vf.as_deref().map(|vf| &vf[(a - ua) * hdv..(b - ua) * hdv]);
            if fused && scored == j + 1 && j + 1 < nq {
                let d = KeysDot { kt, keys: ulen, qs: &qh_next[..nh * hd], out: &mut eb_next[..nh * ulen] };
                if xf.is_some_and(|xf| kern.f32_mad_keys_heads_dot(acc, hdv, nh, xf, nm, e, sm, d)) {
                    scored = j + 2;
                    continue;
                }
            }
            if !xf.is_some_and(|xf| kern.f32_mad_keys_heads(acc, hdv, nh, xf, nm, e, sm)) {
                kern.f16_mad_keys_heads(acc, hdv, nh, v, &voff[r], nm, e, sm);
            }
        }
        p0 += clen;
    }
    for j in 0..nq {
        let o = out(j);
        assert!(o.len() == nh * hdv, "attend_block: output {j} has {} elements, not {nh}·{hdv}", o.len());
        for (g, o) in o.chunks_exact_mut(hdv).enumerate() {
            kern.f16_to_f32(&acc[(j * nh + g) * hdv..(j * nh + g + 1) * hdv], o);
            let inv = if sum[j * nh + g] == 0.0 { 0.0 } else { 1.0 / sum[j * nh + g] };
            for v in o.iter_mut() {
                *v *= inv;
            }
        }
    }
}

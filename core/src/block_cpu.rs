//! The CPU's execution of block ops ([`crate::block`]): each op over the session's arena
//! buffers, with the arithmetic of `ops`, `attention`, `attn_tiled`, `delta_net` and
//! `matmul`. The session walks a layer's op list and calls [`run`] for each op; what a
//! block is lives in `block.rs`, not here.
//!
//! Owns: how each op maps onto buffers and threads on the CPU (work split by rows, heads
//! or channels, never inside a reduction, so results do not depend on the thread count).

use half::f16;

use crate::attention::{attend_block, KeySpan, QBLOCK};
use crate::attn_tiled;
use crate::block::{Buf, Op, Param};
use crate::delta_net;
use crate::ggml_type::GgmlType;
use crate::matmul::{matmul_as, matvec_group, quantize_rows, SharedMut, GROUP_MAX};
use crate::model::{FfnAct, HParams, Layer, RopeMode, Tensor};
use crate::ops;
use crate::parallel::{split_range, Claims, Parallel};
use crate::placement::{Offload, Placement, WeightId, WeightKind};
use crate::prefetch::{self, Level};
use crate::quant::Kernels;

/// Tokens per chunk of the chunked delta-net prompt path.
pub(crate) const DELTA_CHUNK: usize = 64;

/// The activation buffers of one forward pass (arena regions), by [`Buf`].
pub(crate) struct Bufs<'s> {
    pub x: &'s mut [f32],
    pub xn: &'s mut [f32],
    /// Queries, or a delta-net layer's `Qkv`.
    pub q: &'s mut [f32],
    /// Keys, or a delta-net layer's `Z`.
    pub k: &'s mut [f32],
    pub v: &'s mut [f32],
    pub gate: &'s mut [f32],
    pub attn: &'s mut [f32],
    pub ffn_a: &'s mut [f32],
    pub ffn_b: &'s mut [f32],
    pub beta: &'s mut [f32],
    pub alpha: &'s mut [f32],
    pub conv: &'s mut [f32],
    /// One token's RoPE `(cos, sin)` table.
    pub rope: &'s mut [f32],
    /// What `rope` holds the table of, when it holds one: a one-token pass's layers with
    /// the same base and scaling share it instead of computing the same angles again.
    pub rope_of: Option<RopeTable>,
    /// Attention's per-task f16 scratch.
    pub attn_scratch: &'s mut [f16],
    /// The delta rule's per-task scratch.
    pub gdn_scratch: &'s mut [f32],
    /// Scratch for llama.cpp's tiled attention, when this batch uses it.
    pub tile: Option<&'s mut [f32]>,
}

impl<'s> Bufs<'s> {
    /// The slot holding `b` (the delta-net buffers share the attention ones' regions).
    fn slot(&mut self, b: Buf) -> &mut &'s mut [f32] {
        match b {
            Buf::X => &mut self.x,
            Buf::Xn => &mut self.xn,
            Buf::Q | Buf::Qkv => &mut self.q,
            Buf::K | Buf::Z => &mut self.k,
            Buf::V => &mut self.v,
            Buf::Gate => &mut self.gate,
            Buf::Attn => &mut self.attn,
            Buf::FfnA => &mut self.ffn_a,
            Buf::FfnB => &mut self.ffn_b,
            Buf::Beta => &mut self.beta,
            Buf::Alpha => &mut self.alpha,
            Buf::Conv => &mut self.conv,
        }
    }
}

/// The inputs of one token's RoPE table ([`ops::rope_angles_scaled`]): a table computed
/// from equal inputs is the same table.
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct RopeTable {
    pos: usize,
    base: f32,
    scale: ops::RopeScale,
    /// The frequency factors' address and length (a layer's own tensor, or none).
    freqs: (usize, usize),
}

/// One attention layer's view of the KV cache: `rows` rows (a ring of the last `rows`
/// positions when `window > 0`).
pub(crate) struct Cache<'c> {
    pub kv_k: &'c mut [f16],
    pub kv_v: &'c mut [f16],
    pub rows: usize,
    pub n_past: usize,
    /// Sliding-window width (0: none).
    pub window: usize,
}

/// Bytes of each of a layer's K and V caches [`prefetch_cache`] asks for.
const KV_PREFETCH_MAX: usize = 96 * 1024;

/// After an attention layer's [`Op::KvStore`], keeps only its last `keep` of `n` rows for
/// the ops after it: the rows they read (queries, the gates of a gated query, the residual
/// stream) move to the front, and the cache's queries start `n - keep` positions later.
pub(crate) fn keep_last_rows(hp: &HParams, b: &mut Bufs<'_>, c: &mut Cache<'_>, n: usize, keep: usize) {
    let (skip, qd, e) = (n - keep, hp.q_dim(), hp.n_embd);
    b.q.copy_within(skip * qd..n * qd, 0);
    if hp.attn_gated {
        b.gate.copy_within(skip * qd..n * qd, 0);
    }
    b.x.copy_within(skip * e..n * e, 0);
    c.n_past += skip;
}

/// Asks for the first rows of the layer's K and V caches in use (up to
/// [`KV_PREFETCH_MAX`] bytes each) into L2: a one-token pass calls it at the layer's
/// start, so the rows its attention reads arrive while the layer's first products stream
/// their weights (between tokens the weights evict them; the attention would otherwise
/// wait on its first rows' misses). A hint only: it changes no value.
pub(crate) fn prefetch_cache(c: &Cache<'_>, hp: &HParams) {
    let used = c.n_past.min(c.rows);
    prefetch::lines(c.kv_k.as_ptr().cast(), (used * hp.k_dim() * 2).min(KV_PREFETCH_MAX), Level::L2);
    prefetch::lines(c.kv_v.as_ptr().cast(), (used * hp.v_dim() * 2).min(KV_PREFETCH_MAX), Level::L2);
}

/// One recurrent layer's conv and delta-rule state.
pub(crate) struct DeltaState<'s> {
    pub conv: &'s mut [f32],
    pub ssm: &'s mut [f32],
}

/// A layer's state: its KV cache rows or its recurrent state.
pub(crate) enum LayerState<'s> {
    /// An attention layer's cache.
    Attention(Cache<'s>),
    /// A delta-net layer's conv and recurrent state.
    DeltaNet(DeltaState<'s>),
}

/// What every op of one layer's pass shares.
pub(crate) struct Step<'a, 'm> {
    pub hp: &'a HParams,
    pub layer: &'a Layer<'m>,
    /// Layer index.
    pub l: usize,
    /// Tokens in the pass.
    pub n: usize,
    /// Most tasks an op splits into.
    pub n_tasks: usize,
    /// Delta-net batches in the chunked form.
    pub chunked: bool,
    pub par: &'a dyn Parallel,
}

/// Runs one op of a layer on the CPU.
pub(crate) fn run(op: Op, s: &Step<'_, '_>, b: &mut Bufs<'_>, st: &mut LayerState<'_>, act: &mut Act<'_>) {
    let (hp, n, par, kern) = (s.hp, s.n, s.par, act.kern);
    let e = hp.n_embd;
    let param = |p: Param| p.of(s.layer);
    match op {
        Op::Norm { w, src, dst } => {
            let Some(w) = param(w) else { return };
            let x = core::mem::take(b.slot(src));
            let out = SharedMut::new(&mut b.slot(dst)[..n * e]);
            rows_parallel(par, n, &|r| {
                // SAFETY: the tasks' row ranges are disjoint.
                let out = unsafe { out.slice(r.start * e, r.len() * e) };
                for (i, o) in r.zip(out.chunks_exact_mut(e)) {
                    ops::rms_norm(&x[i * e..(i + 1) * e], w.data, hp.rms_eps, o);
                }
            });
            *b.slot(src) = x;
        }
        Op::MatMul { w, src, dst } => {
            let Some(t) = crate::block::weight(s.layer, w) else { return };
            let x = core::mem::take(b.slot(src));
            act.project(par, w, &t, x, n, b.slot(dst));
            *b.slot(src) = x;
        }
        Op::SplitQueryGate => split_query_gate(hp, b, n),
        Op::Bias { w, dst } => {
            let width = match dst {
                Buf::Q => hp.q_dim(),
                Buf::K => hp.k_dim(),
                _ => hp.v_dim(),
            };
            add_bias(b.slot(dst), param(w), n, width);
        }
        Op::HeadNorm { w, dst } => {
            let width = if dst == Buf::Q { hp.q_dim() } else { hp.k_dim() };
            head_norm(b.slot(dst), param(w), n, width, hp.head_dim, hp.rms_eps);
        }
        Op::Rope => {
            let LayerState::Attention(c) = st else { return };
            let freqs = match s.layer.mixer {
                crate::model::Mixer::Attention(a) => a.rope_freqs.map(|t| t.data),
                crate::model::Mixer::DeltaNet(_) => None,
            };
            rope(hp, &kern, s.l, c.n_past, freqs, b, n, par);
        }
        Op::KvStore => {
            let LayerState::Attention(c) = st else { return };
            let (kd, vd) = (hp.k_dim(), hp.v_dim());
            for i in 0..n {
                let slot = (c.n_past + i) % c.rows;
                kern.f32_to_f16(&b.k[i * kd..(i + 1) * kd], &mut c.kv_k[slot * kd..(slot + 1) * kd]);
                kern.f32_to_f16(&b.v[i * vd..(i + 1) * vd], &mut c.kv_v[slot * vd..(slot + 1) * vd]);
            }
        }
        Op::QueryScale => ops::scale(&mut b.q[..n * hp.q_dim()], hp.attn_scale),
        Op::Attention { window } => {
            let LayerState::Attention(c) = st else { return };
            // The block's window (the cache's ring rows were planned from the same rule).
            c.window = window;
            // Queries scaled beforehand (QueryScale) attend with scale 1.
            let scale = if hp.q_prescale { 1.0 } else { hp.attn_scale };
            match b.tile.as_deref_mut() {
                Some(tile) => attention_tiled(hp, &kern, c, b.q, scale, b.attn, tile, s.n_tasks, n, par),
                None => attention(hp, &kern, c, b.q, scale, b.attn, b.attn_scratch, s.n_tasks, n, par),
            }
        }
        Op::AttnGate => {
            let aw = hp.n_head * hp.head_dim_v;
            ops::mul_sigmoid(&mut b.attn[..n * aw], b.gate);
        }
        Op::DeltaGates => delta_gates(s, b),
        Op::SsmConv => {
            let LayerState::DeltaNet(d) = st else { return };
            ssm_conv(s, b, d);
        }
        Op::QkL2Norm => qk_l2_norm(s, b),
        Op::DeltaRule => {
            let LayerState::DeltaNet(d) = st else { return };
            delta_rule(s, b, d);
        }
        Op::GatedNorm => gated_norm(s, b),
        Op::Residual { src, post_norm } => {
            let y = core::mem::take(b.slot(src));
            add_residual(hp, par, post_norm.and_then(param), &y[..n * e], &mut b.xn[..n * e], &mut b.x[..n * e], n);
            *b.slot(src) = y;
        }
        Op::FfnAct(a) => {
            let f = hp.n_ff;
            ffn_activation(&kern, par, a, &mut b.ffn_a[..n * f], &b.ffn_b[..n * f]);
        }
    }
}

/// How many ops from the first of `ops` are products of one input (`MatMul`s with the
/// same `src`, as q, k and v; gate and up), at most [`GROUP_MAX`]; 0 when the first is
/// not a product.
fn products_of_one_input(ops: &[Op]) -> usize {
    let Some(&Op::MatMul { src, .. }) = ops.first() else { return 0 };
    ops.iter().take(GROUP_MAX).take_while(|op| matches!(op, Op::MatMul { src: s, .. } if *s == src)).count()
}

/// The weights and output buffers of the products at the start of `ops` that a forward
/// pass of one token runs as one parallel job on the CPU with the kernels `k`
/// ([`matvec_group`]): two or more products of one input ([`products_of_one_input`]),
/// every weight in the layer, which [`crate::matmul::groupable`] takes. `None` where the
/// first op goes alone. The one rule behind both the session's loop ([`run_products`])
/// and the rows the host places for each thread ([`for_each_one_token_job`]).
fn one_job<'m>(k: &Kernels, layer: &Layer<'m>, ops: &[Op]) -> Option<heapless::Vec<(Tensor<'m>, Buf), GROUP_MAX>> {
    let g = products_of_one_input(ops);
    if g < 2 {
        return None;
    }
    let mut ws = heapless::Vec::new();
    for op in &ops[..g] {
        let &Op::MatMul { w, dst, .. } = op else { return None };
        ws.push((crate::block::weight(layer, w)?, dst)).ok()?;
    }
    let together = {
        let refs: heapless::Vec<&Tensor<'m>, GROUP_MAX> = ws.iter().map(|(t, _)| t).collect();
        crate::matmul::groupable(k, &refs)
    };
    together.then_some(ws)
}

/// Runs the products at the start of `ops` that go together ([`one_job`]) for a single
/// token as one parallel job ([`matvec_group`]): the same outputs as running them one by
/// one. Returns how many ops it ran: 0, with nothing run, where the first op goes alone
/// or they cannot go together here (not one token, a device placement, llama.cpp's batch
/// choice giving a product another kernel): the caller then runs them one by one.
pub(crate) fn run_products(ops: &[Op], s: &Step<'_, '_>, b: &mut Bufs<'_>, act: &mut Act<'_>) -> usize {
    let (1, Some(&Op::MatMul { src, .. })) = (s.n, ops.first()) else { return 0 };
    let Some(ws) = one_job(&act.kern, s.layer, ops) else { return 0 };
    for (op, (t, _)) in ops.iter().zip(&ws) {
        let &Op::MatMul { w, .. } = op else { return 0 };
        if act.placement.is_some_and(|p| p.device_for(WeightId { layer: act.layer, kind: w }, 1).is_some()) {
            return 0;
        }
        // With llama.cpp's batch choices a product takes the kernel `matmul_as` would
        // give its one token; only the plain dot joins a group.
        if act.llama_cpp_batches && act.kern.dot_fn_in_batch(t.ty, t.rows, 1, 0).map(|f| f as usize) != act.kern.dot_fn(t.ty).map(|f| f as usize) {
            return 0;
        }
    }
    if act.failed.is_some() {
        // As `project`: after a device failed, the pass computes nothing more.
        return ws.len();
    }
    let tensors: heapless::Vec<&Tensor<'_>, GROUP_MAX> = ws.iter().map(|(t, _)| t).collect();
    let x = core::mem::take(b.slot(src));
    let mut outs: heapless::Vec<&mut [f32], GROUP_MAX> = ws.iter().map(|&(_, d)| core::mem::take(b.slot(d))).collect();
    let done = act.product_group(s.par, &tensors, x, &mut outs);
    for (o, &(_, d)) in outs.into_iter().zip(&ws) {
        *b.slot(d) = o;
    }
    *b.slot(src) = x;
    if done {
        ws.len()
    } else {
        0
    }
}

/// The products of layer `l` as a forward pass of one token runs them on the CPU (no
/// device placement, keel's own kernel choice: the session's loop with
/// [`run_products`]): `f(weights)` for each parallel job in order, the products
/// [`one_job`] puts together as one, every other product alone
/// ([`crate::matmul::for_each_one_token_job`]).
pub(crate) fn for_each_one_token_job<'m>(k: &Kernels, hp: &HParams, l: usize, layer: &Layer<'m>, mut f: impl FnMut(&[&Tensor<'m>])) {
    let ops = crate::block::layer_ops(hp, l, layer);
    let mut j = 0;
    while j < ops.len() {
        if let Some(ws) = one_job(k, layer, &ops[j..]) {
            let refs: heapless::Vec<&Tensor<'m>, GROUP_MAX> = ws.iter().map(|(t, _)| t).collect();
            f(&refs);
            j += ws.len();
        } else {
            if let Op::MatMul { w, .. } = ops[j] {
                if let Some(t) = crate::block::weight(layer, w) {
                    f(&[&t]);
                }
            }
            j += 1;
        }
    }
}

/// The first of `n` rows of `width` floats at the start of `buf` that holds a NaN or an
/// infinity.
pub(crate) fn first_non_finite_row(buf: &[f32], n: usize, width: usize) -> Option<usize> {
    buf.get(..n * width).unwrap_or(buf).chunks(width.max(1)).position(|r| r.iter().any(|v| !v.is_finite()))
}

/// The first row (token of the batch) that `op` just wrote a NaN or an infinity to, in
/// any buffer it writes. Reference mode runs this after every op, to name the first op
/// that produced a non-finite value; the fast path never calls it.
pub(crate) fn wrote_non_finite(op: Op, s: &Step<'_, '_>, b: &mut Bufs<'_>) -> Option<usize> {
    let hp = s.hp;
    let ssm = hp.ssm.filter(|_| hp.is_recurrent(s.l));
    let rows = |buf: &[f32], width: usize| first_non_finite_row(buf, s.n, width);
    let either = |a: Option<usize>, b: Option<usize>| a.into_iter().chain(b).min();
    let attn_w = ssm.map_or(hp.n_head * hp.head_dim_v, |d| d.d_inner);
    match op {
        Op::MatMul { w, dst, .. } => crate::block::weight(s.layer, w).and_then(|t| rows(b.slot(dst), t.rows)),
        Op::Norm { dst, .. } => rows(b.slot(dst), hp.n_embd),
        Op::Residual { .. } => rows(b.x, hp.n_embd),
        Op::Bias { dst: Buf::Q, .. } | Op::HeadNorm { dst: Buf::Q, .. } | Op::QueryScale => rows(b.q, hp.q_dim()),
        Op::Bias { dst: Buf::K, .. } | Op::HeadNorm { dst: Buf::K, .. } => rows(b.k, hp.k_dim()),
        Op::Bias { dst, .. } | Op::HeadNorm { dst, .. } => rows(b.slot(dst), hp.v_dim()),
        Op::SplitQueryGate => either(rows(b.q, hp.q_dim()), rows(b.gate, hp.q_dim())),
        Op::Rope => either(rows(b.q, hp.q_dim()), rows(b.k, hp.k_dim())),
        // Writes the f16 cache from K and V, which the ops before it checked.
        Op::KvStore => None,
        Op::Attention { .. } | Op::AttnGate | Op::DeltaRule | Op::GatedNorm => rows(b.attn, attn_w),
        Op::DeltaGates => ssm.and_then(|d| either(rows(b.beta, d.n_v_heads), rows(b.alpha, d.n_v_heads))),
        Op::SsmConv | Op::QkL2Norm => ssm.and_then(|d| rows(b.conv, d.conv_channels())),
        Op::FfnAct(_) => rows(b.ffn_a, hp.n_ff),
    }
}

/// Rows are `[q | gate]` per head: moves the gates out, then packs q (destination offsets
/// never pass the source, so a forward copy is safe).
fn split_query_gate(hp: &HParams, b: &mut Bufs<'_>, n: usize) {
    let (qd, hd) = (hp.q_dim(), hp.head_dim);
    for i in 0..n {
        for h in 0..hp.n_head {
            let src = i * 2 * qd + h * 2 * hd;
            b.gate[i * qd + h * hd..i * qd + (h + 1) * hd].copy_from_slice(&b.q[src + hd..src + 2 * hd]);
            b.q.copy_within(src..src + hd, i * qd + h * hd);
        }
    }
}

/// RoPE of the query and key heads of `n` tokens at positions `n_past..`, with the
/// model's frequency scaling and the layer's frequency factors (`freqs`, f32 bytes).
/// The most rotated dimensions whose `(cos, sin)` table [`rope`] keeps on a task's stack
/// (more: the batch is rotated on the calling thread, in `Bufs::rope`).
const ROPE_STACK: usize = 512;

/// RoPE on the batch's queries and keys, token by token (each token's table of angles,
/// then its heads), split in token ranges across the threads from [`ROWS_PARALLEL_MIN`]
/// tokens: each token's arithmetic is its own, so the split changes no bit.
fn rope(hp: &HParams, kern: &Kernels, l: usize, n_past: usize, freqs: Option<&[u8]>, b: &mut Bufs<'_>, n: usize, par: &dyn Parallel) {
    let (qd, kd, hd, n_rot) = (hp.q_dim(), hp.k_dim(), hp.head_dim, hp.n_rot);
    let neox = hp.rope_mode == RopeMode::Neox;
    let (base, scale) = (hp.rope_base_of(l), hp.rope_scale_of(l));
    let token = |i: usize, q: &mut [f32], k: &mut [f32], cs: &mut [f32]| {
        ops::rope_angles_scaled(n_past + i, base, n_rot, &scale, freqs, cs);
        kern.rope(q, hd, cs, n_rot, neox);
        kern.rope(k, hd, cs, n_rot, neox);
    };
    if n == 1 {
        // One token: its table is the previous layer's when the inputs are (every layer
        // of most models; Gemma 3's local and global layers alternate two bases).
        let of = RopeTable { pos: n_past, base, scale, freqs: freqs.map_or((0, 0), |f| (f.as_ptr() as usize, f.len())) };
        if b.rope_of != Some(of) {
            ops::rope_angles_scaled(n_past, base, n_rot, &scale, freqs, b.rope);
            b.rope_of = Some(of);
        }
        let cs = &b.rope[..n_rot];
        kern.rope(&mut b.q[..hp.n_head * hd], hd, cs, n_rot, neox);
        kern.rope(&mut b.k[..hp.n_head_kv * hd], hd, cs, n_rot, neox);
        return;
    }
    if n < ROWS_PARALLEL_MIN || n_rot > ROPE_STACK || par.n_threads() < 2 {
        for i in 0..n {
            token(i, &mut b.q[i * qd..][..hp.n_head * hd], &mut b.k[i * kd..][..hp.n_head_kv * hd], b.rope);
        }
        return;
    }
    let (q, k) = (SharedMut::new(&mut b.q[..n * qd]), SharedMut::new(&mut b.k[..n * kd]));
    let tasks = par.n_threads().min(n);
    par.run(tasks, &|t| {
        let mut cs = [0.0f32; ROPE_STACK];
        for i in split_range(n, tasks, t) {
            // SAFETY: token i's query and key rows belong to the one task owning token i.
            let (q, k) = unsafe { (q.slice(i * qd, hp.n_head * hd), k.slice(i * kd, hp.n_head_kv * hd)) };
            token(i, q, k, &mut cs[..n_rot]);
        }
    });
}

/// `a = act(a) * b` elementwise (SwiGLU or GeGLU), split in ranges across the threads:
/// each element's arithmetic does not depend on the split.
fn ffn_activation(kern: &Kernels, par: &dyn Parallel, act: FfnAct, a: &mut [f32], b: &[f32]) {
    let len = a.len().min(b.len());
    let tasks = par.n_threads().min(len / 2048).max(1);
    let shared = SharedMut::new(&mut a[..len]);
    par.run(tasks, &|t| {
        let r = split_range(len, tasks, t);
        // SAFETY: the tasks' ranges are disjoint.
        let g = unsafe { shared.slice(r.start, r.len()) };
        match act {
            FfnAct::Silu => kern.swiglu(g, &b[r]),
            FfnAct::GeluTanh => kern.geglu(g, &b[r]),
        }
    });
}

/// Tokens a pass needs before its per-row ops (norms, residual adds) are split across the
/// threads: with fewer (decode, short batches) a hand-off costs more than the rows.
const ROWS_PARALLEL_MIN: usize = 16;

/// `f(rows)` for the token rows `0..n` in ranges across the threads (one range, on the
/// calling thread, below [`ROWS_PARALLEL_MIN`] tokens). Each row's arithmetic is its own,
/// so the split changes no result.
fn rows_parallel(par: &dyn Parallel, n: usize, f: &(dyn Fn(core::ops::Range<usize>) + Sync)) {
    let tasks = if n >= ROWS_PARALLEL_MIN { par.n_threads().min(n) } else { 1 };
    par.run(tasks, &|t| f(split_range(n, tasks, t)));
}

/// `x += post_norm(y)` (or `x += y` without a post-norm) for `n` rows; `tmp` is scratch.
fn add_residual(hp: &HParams, par: &dyn Parallel, post_norm: Option<Tensor<'_>>, y: &[f32], tmp: &mut [f32], x: &mut [f32], n: usize) {
    let e = hp.n_embd;
    let (tmp, x) = (SharedMut::new(&mut tmp[..n * e]), SharedMut::new(&mut x[..n * e]));
    rows_parallel(par, n, &|r| {
        // SAFETY: the tasks' row ranges are disjoint.
        let (tmp, x) = unsafe { (tmp.slice(r.start * e, r.len() * e), x.slice(r.start * e, r.len() * e)) };
        let y = &y[r.start * e..r.end * e];
        match post_norm {
            Some(w) => {
                for (y, t) in y.chunks_exact(e).zip(tmp.chunks_exact_mut(e)) {
                    ops::rms_norm(y, w.data, hp.rms_eps, t);
                }
                ops::add_assign(x, tmp);
            }
            None => ops::add_assign(x, y),
        }
    });
}

/// Adds an f32 bias (raw bytes) to each of `n` rows of width `w`.
fn add_bias(x: &mut [f32], bias: Option<Tensor<'_>>, n: usize, w: usize) {
    if let Some(b) = bias {
        for i in 0..n {
            for (j, v) in x[i * w..(i + 1) * w].iter_mut().enumerate() {
                *v += ops::f32_at(b.data, j);
            }
        }
    }
}

/// RMSNorm of each `hd`-wide head of `n` rows of width `w`, in place.
fn head_norm(x: &mut [f32], norm: Option<Tensor<'_>>, n: usize, w: usize, hd: usize, eps: f32) {
    if let Some(t) = norm {
        for i in 0..n {
            for h in 0..w / hd {
                ops::rms_norm_in_place(&mut x[i * w + h * hd..i * w + (h + 1) * hd], t.data, eps);
            }
        }
    }
}

/// Query heads sharing a KV head that [`attention`] computes together.
pub(crate) const ATTN_HEADS: usize = crate::attention::MAX_HEADS;

/// Causal grouped-query attention of the `n` new tokens over one layer's cache, split
/// by (token block, heads) items — up to [`QBLOCK`] consecutive tokens and up to
/// [`ATTN_HEADS`] query heads that share a KV head — claimed by whichever of at most
/// `max_tasks` tasks is free, the costliest first ([`Claims`]), each task with its own
/// f16 scratch; each item is one [`crate::attention::attend_block`] call, which reads
/// each key and value row once for the block (its doc and [`crate::attention::attend_heads`]' give the arithmetic:
/// llama.cpp's CPU flash attention, `one_chunk` path, per query). llama.cpp uses a
/// different, tiled arithmetic for batches of 64 or more queries; keel always uses this
/// one, so a position's output does not depend on the batch (nor on the blocking). With
/// a sliding window a query at `pos` sees keys `pos - window + 1 ..= pos`.
#[allow(clippy::too_many_arguments)]
fn attention(hp: &HParams, kern: &Kernels, c: &Cache<'_>, q: &[f32], scale: f32, out: &mut [f32], scratch: &mut [f16], max_tasks: usize, n: usize, par: &dyn Parallel) {
    let (hd, hdv) = (hp.head_dim, hp.head_dim_v);
    let (qd, kd, vd) = (hp.q_dim(), hp.k_dim(), hp.v_dim());
    let group = hp.n_head / hp.n_head_kv;
    let threads = par.n_threads().min(max_tasks).max(1);
    // Tokens per block: as many as leave at least 4 (block, KV head) pairs per thread.
    // (Each task's scratch holds `qcap` tokens' heads: QBLOCK, or n_batch if smaller; see
    // `session::plan_session`.)
    let per_task = scratch.len() / max_tasks.max(1);
    let qcap = per_task / (ATTN_HEADS * (hd + hdv));
    let qb = (n * hp.n_head_kv / (4 * threads)).clamp(1, QBLOCK).min(qcap).max(1);
    let blocks = n.div_ceil(qb);
    // Items per KV head and block: its query heads in runs of at most ATTN_HEADS, fewer
    // when there are too few (block, KV head) pairs to keep the threads busy (decode),
    // but as many as leave each thread one run: every run reads its KV head's rows once,
    // and at depth decode is bound by those reads. The same bits either way.
    let per_item = ATTN_HEADS.min(group).min((blocks * hp.n_head).div_ceil(threads)).max(1);
    let runs = group.div_ceil(per_item);
    let (rows, n_past, window) = (c.rows, c.n_past, c.window);
    let (kv_k, kv_v) = (&*c.kv_k, &*c.kv_v);
    let items = blocks * hp.n_head_kv * runs;
    let tasks = threads.min(items).max(1);
    let scratch = SharedMut::new(scratch);
    let out_w = hp.n_head * hdv;
    let out = SharedMut::new(&mut out[..n * out_w]);
    // Items claimed by whichever task is free, the last block (the most keys) first: a
    // fixed deal made both threads wait for the one whose vCPU the host had slowed.
    let claims = Claims::new(items);
    par.run(tasks, &|t| {
        // SAFETY: task t owns scratch slot t (tasks <= the n_threads slots planned).
        let s = unsafe { scratch.slice(t * per_task, per_task) };
        let (qh, acc) = s.split_at_mut(qcap * ATTN_HEADS * hd);
        for item in claims.iter() {
            let (blk, rest) = (item / (hp.n_head_kv * runs), item % (hp.n_head_kv * runs));
            let (kvh, run) = (rest / runs, rest % runs);
            let h0 = kvh * group + run * per_item;
            let nh = (group - run * per_item).min(per_item);
            let i0 = blk * qb;
            let query = |j: usize| {
                let pos = n_past + i0 + j;
                let first = if window > 0 { (pos + 1).saturating_sub(window) } else { 0 };
                let span = KeySpan { len: pos + 1 - first, first_slot: first, ring: rows, k_base: kvh * hd, k_stride: kd, v_base: kvh * hdv, v_stride: vd };
                (&q[(i0 + j) * qd + h0 * hd..][..nh * hd], span)
            };
            // SAFETY: outputs (i, h0 .. h0 + nh) are written by exactly one task, each once.
            let o = |j: usize| unsafe { out.slice((i0 + j) * out_w + h0 * hdv, nh * hdv) };
            attend_block(kern, (hd, hdv, nh), kv_k, kv_v, scale, qb.min(n - i0), query, qh, acc, o);
        }
    });
}

/// [`attention`] with llama.cpp's tiled arithmetic ([`attn_tiled`]): items of up to
/// [`attn_tiled::QB`] consecutive tokens × a run of at most [`attn_tiled::MAX_HEADS`]
/// query heads sharing a KV head, claimed by the tasks as in [`attention`]; each item is one
/// [`attn_tiled::block`] call (each key tile converted once for the item; per row the
/// bits of the row alone).
#[allow(clippy::too_many_arguments)]
fn attention_tiled(hp: &HParams, kern: &Kernels, c: &Cache<'_>, q: &[f32], scale: f32, out: &mut [f32], scratch: &mut [f32], max_tasks: usize, n: usize, par: &dyn Parallel) {
    let (hd, hdv) = (hp.head_dim, hp.head_dim_v);
    let (qd, kd, vd) = (hp.q_dim(), hp.k_dim(), hp.v_dim());
    let group = hp.n_head / hp.n_head_kv;
    let (kv_k, kv_v) = (&*c.kv_k, &*c.kv_v);
    let per_task = attn_tiled::scratch_len(hd, hdv);
    let per_item = group.min(attn_tiled::MAX_HEADS);
    let runs = group.div_ceil(per_item);
    let blocks = n.div_ceil(attn_tiled::QB);
    let items = blocks * hp.n_head_kv * runs;
    let tasks = par.n_threads().min(max_tasks).min(items).max(1);
    let scratch = SharedMut::new(scratch);
    let out_w = hp.n_head * hdv;
    let out = SharedMut::new(&mut out[..n * out_w]);
    let (rows, n_past, window) = (c.rows, c.n_past, c.window);
    // Claimed as in `attention`: later tokens see more keys.
    let claims = Claims::new(items);
    par.run(tasks, &|t| {
        // SAFETY: task t owns scratch slot t.
        let s = unsafe { scratch.slice(t * per_task, per_task) };
        for item in claims.iter() {
            let (blk, rest) = (item / (hp.n_head_kv * runs), item % (hp.n_head_kv * runs));
            let (kvh, run) = (rest / runs, rest % runs);
            let h0 = kvh * group + run * per_item;
            let nh = (group - run * per_item).min(per_item);
            let i0 = blk * attn_tiled::QB;
            let lay = attn_tiled::Layout { rows, kd, vd, k_off: kvh * hd, v_off: kvh * hdv };
            let query = |j: usize| {
                let pos = n_past + i0 + j;
                let first = if window > 0 { (pos + 1).saturating_sub(window) } else { 0 };
                (&q[(i0 + j) * qd + h0 * hd..][..nh * hd], first, pos)
            };
            // SAFETY: outputs (i, h0 .. h0 + nh) are written by exactly one task, each once.
            let o = |j: usize| unsafe { out.slice((i0 + j) * out_w + h0 * hdv, nh * hdv) };
            attn_tiled::block(kern, kv_k, kv_v, lay, (hd, hdv, nh), scale, attn_tiled::QB.min(n - i0), query, s, o);
        }
    });
}

/// `Beta = sigmoid(Beta)`, `Alpha = softplus(Alpha + dt_bias)·a` per value head.
fn delta_gates(s: &Step<'_, '_>, b: &mut Bufs<'_>) {
    let Some(ssm) = s.hp.ssm else { return };
    let (n, nvh) = (s.n, ssm.n_v_heads);
    let (Some(dt_bias), Some(a)) = (Param::DtBias.of(s.layer), Param::A.of(s.layer)) else { return };
    delta_net::gates(&mut b.beta[..n * nvh], &mut b.alpha[..n * nvh], dt_bias.data, a.data, nvh);
}

/// Causal depthwise conv1d + SiLU of the `Qkv` rows into `Conv`, updating the conv state.
fn ssm_conv(s: &Step<'_, '_>, b: &mut Bufs<'_>, st: &mut DeltaState<'_>) {
    let hp = s.hp;
    let Some(ssm) = hp.ssm else { return };
    let n = s.n;
    let (ch, kc) = (ssm.conv_channels(), ssm.d_conv);
    let Some(conv1d) = Param::Conv1d.of(s.layer) else { return };
    // Causal depthwise conv over [state (kc-1 previous inputs) | the n new inputs].
    for c in 0..ch {
        delta_net::conv_channel(&mut st.conv[c * (kc - 1)..(c + 1) * (kc - 1)], &b.q[c..], ch, &conv1d.data[c * kc * 4..(c + 1) * kc * 4], &mut b.conv[c..], ch, n);
    }
}

/// L2 normalization of every query and key head of `Conv`.
fn qk_l2_norm(s: &Step<'_, '_>, b: &mut Bufs<'_>) {
    let hp = s.hp;
    let Some(ssm) = hp.ssm else { return };
    let n = s.n;
    let (ch, ds, nkh) = (ssm.conv_channels(), ssm.d_state, ssm.n_k_heads);
    // L2-normalize each q and k head.
    for i in 0..n {
        for h in 0..2 * nkh {
            delta_net::l2_norm(&mut b.conv[i * ch + h * ds..i * ch + (h + 1) * ds], hp.rms_eps);
        }
    }
}

/// The gated delta rule per value head (token by token, as llama.cpp's fused op, or
/// chunked), one task per group of value heads, into `Attn`.
fn delta_rule(s: &Step<'_, '_>, b: &mut Bufs<'_>, st: &mut DeltaState<'_>) {
    let hp = s.hp;
    let Some(ssm) = hp.ssm else { return };
    let n = s.n;
    let (ch, ds, nvh, nkh) = (ssm.conv_channels(), ssm.d_state, ssm.n_v_heads, ssm.n_k_heads);
    let (par, n_tasks, chunked) = (s.par, s.n_tasks, s.chunked);
    let kdim = nkh * ds;
    // The delta rule, one task per group of value heads.
    let scale = 1.0 / libm::sqrtf(ds as f32);
    let tasks = par.n_threads().min(n_tasks).min(nvh).max(1);
    let ssm = SharedMut::new(&mut *st.ssm);
    let scratch = SharedMut::new(&mut *b.gdn_scratch);
    let o = SharedMut::new(&mut b.attn[..n * nvh * ds]);
    let (conv, beta, g) = (&*b.conv, &*b.beta, &b.alpha[..n * nvh]);
    let per_task = delta_net::chunk_scratch_len(DELTA_CHUNK, ds) + DELTA_CHUNK * ds;
    par.run(tasks, &|t| {
        // SAFETY: task t owns scratch slot t, the state of its heads, and their outputs.
        let work = unsafe { scratch.slice(t * per_task, per_task) };
        for h in split_range(nvh, tasks, t) {
            let m = unsafe { ssm.slice(h * ds * ds, ds * ds) };
            let kh = h % nkh;
            if chunked {
                let mut i0 = 0;
                while i0 < n {
                    let c = DELTA_CHUNK.min(n - i0);
                    let base = &conv[i0 * ch..];
                    let (cw, tmp) = work.split_at_mut(delta_net::chunk_scratch_len(DELTA_CHUNK, ds));
                    delta_net::chunk(m, &base[kh * ds..], &base[kdim + kh * ds..], ch, &base[2 * kdim + h * ds..], ch, tmp, ds, &g[i0 * nvh + h..], &beta[i0 * nvh + h..], nvh, c, ds, scale, cw);
                    for j in 0..c {
                        // SAFETY: output (i0 + j, h) belongs to this task.
                        unsafe { o.slice((i0 + j) * nvh * ds + h * ds, ds) }.copy_from_slice(&tmp[j * ds..(j + 1) * ds]);
                    }
                    i0 += c;
                }
                continue;
            }
            let delta = &mut work[..ds];
            for i in 0..n {
                let row = &conv[i * ch..(i + 1) * ch];
                let q = &row[kh * ds..(kh + 1) * ds];
                let k = &row[kdim + kh * ds..kdim + (kh + 1) * ds];
                let v = &row[2 * kdim + h * ds..2 * kdim + (h + 1) * ds];
                // SAFETY: output (i, h) belongs to this task.
                let out = unsafe { o.slice(i * nvh * ds + h * ds, ds) };
                delta_net::step(m, q, k, v, g[i * nvh + h], beta[i * nvh + h], scale, delta, out);
            }
        }
    });
}

/// `Attn = rms_norm(Attn)·w·silu(Z)` per value head.
fn gated_norm(s: &Step<'_, '_>, b: &mut Bufs<'_>) {
    let hp = s.hp;
    let Some(ssm) = hp.ssm else { return };
    let n = s.n;
    let (ds, nvh) = (ssm.d_state, ssm.n_v_heads);
    let Some(norm) = Param::SsmNorm.of(s.layer) else { return };
    // Gated RMSNorm per head: norm(o) * w * silu(z).
    for i in 0..n {
        for h in 0..nvh {
            let r = i * nvh * ds + h * ds;
            delta_net::gated_norm(&mut b.attn[r..r + ds], &b.k[r..r + ds], norm.data, hp.rms_eps);
        }
    }
}

/// The quantized-activation buffer and which type it currently holds, so q, k and v
/// (or gate and up) quantize their shared input once.
pub(crate) struct Act<'b> {
    pub kern: Kernels,
    pub buf: &'b mut [u8],
    pub cur: Option<GgmlType>,
    /// Use llama.cpp's batch-dependent kernel choice ([`matmul_as`]).
    pub llama_cpp_batches: bool,
    /// Products placed on devices, when a placement is in use.
    pub placement: Option<&'b Placement<'b>>,
    pub offload: Option<&'b mut dyn Offload>,
    /// The layer whose products run now ([`crate::placement::OUTPUT_LAYER`] for the output projection).
    pub layer: u16,
    /// The first device that failed in this forward pass (later products are skipped).
    pub failed: Option<u8>,
}

impl Act<'_> {
    /// The input changed: the next projection must quantize again.
    pub(crate) fn invalidate(&mut self) {
        self.cur = None;
    }

    /// `outs[m] = x W_m` for one row `x` and the matrices `ws` ([`matvec_group`]); false
    /// (nothing computed) where they cannot go in one job.
    fn product_group(&mut self, par: &dyn Parallel, ws: &[&Tensor<'_>], x: &[f32], outs: &mut [&mut [f32]]) -> bool {
        let Some(vdt) = Kernels::vec_dot_type(ws[0].ty) else { return false };
        if ws.iter().any(|w| Kernels::vec_dot_type(w.ty) != Some(vdt) || w.cols != ws[0].cols) {
            return false;
        }
        if self.cur != Some(vdt) {
            let rb = vdt.row_bytes(ws[0].cols as u64).unwrap_or(0) as usize;
            quantize_rows(&self.kern, par, vdt, x, 1, ws[0].cols, &mut self.buf[..rb]);
            self.cur = Some(vdt);
        }
        matvec_group(&self.kern, par, ws, self.buf, outs)
    }

    /// `out = x W` for `n` rows of `x` (each `w.cols` wide).
    pub(crate) fn project(&mut self, par: &dyn Parallel, kind: WeightKind, w: &Tensor<'_>, x: &[f32], n: usize, out: &mut [f32]) {
        if self.failed.is_some() {
            return;
        }
        if let (Some(p), Some(off)) = (self.placement, self.offload.as_deref_mut()) {
            let id = WeightId { layer: self.layer, kind };
            if let Some(dev) = p.device_for(id, n) {
                if off.matmul(dev, id, &x[..n * w.cols], n, &mut out[..n * w.rows]).is_err() {
                    self.failed = Some(dev);
                }
                return;
            }
        }
        let Some(vdt) = Kernels::vec_dot_type(w.ty) else { return };
        if self.cur != Some(vdt) {
            let rb = vdt.row_bytes(w.cols as u64).unwrap_or(0) as usize;
            quantize_rows(&self.kern, par, vdt, x, n, w.cols, &mut self.buf[..n * rb]);
            self.cur = Some(vdt);
        }
        matmul_as(&self.kern, par, w, self.buf, n, out, self.llama_cpp_batches);
    }
}

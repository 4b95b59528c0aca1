//! A session: the KV cache and activation buffers of one sequence, and the forward pass.
//!
//! Owns: the arena regions of one running sequence and the order of operations of the
//! llama-family block. Batched prompt evaluation and single-token decode run the same
//! per-row arithmetic. Never allocates.

use crate::arena::{Carver, Plan};
use crate::error::Error;
use crate::ggml_type::GgmlType;
use crate::gguf::Gguf;
use crate::matmul::{act_row_bytes, matmul, quantize_rows, SharedMut};
use crate::model::{HParams, Model, RopeMode, Tensor};
use crate::ops;
use crate::parallel::{split_range, Parallel};
use crate::quant::Kernels;
use half::f16;

/// Run limits that size a session's arena regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionConfig {
    /// Context length (positions in the KV cache).
    pub n_ctx: usize,
    /// Most tokens evaluated in one forward pass (longer inputs are split).
    pub n_batch: usize,
    /// Most logits rows one `eval` returns.
    pub n_outputs: usize,
    /// Most threads the host will run tasks on.
    pub n_threads: usize,
}

/// Which positions of an `eval` produce logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outputs {
    /// Only the last token.
    Last,
    /// Every token (needs `n_outputs >= tokens`).
    All,
}

/// Region names in plan order.
const REGIONS: [&str; 14] = ["kv_k", "kv_v", "x", "xn", "q", "k", "v", "attn", "ffn_a", "ffn_b", "act_q", "attn_scratch", "rope", "logits"];

/// The largest activation row (bytes) any matrix product of this file needs.
pub fn max_act_row_bytes(g: &Gguf<'_>) -> usize {
    g.tensors().filter(|t| t.n_dims >= 2).filter_map(|t| act_row_bytes(t.ty, t.ne[0] as usize)).max().unwrap_or(0)
}

/// Appends a session's regions to `plan`.
pub fn plan_session(plan: &mut Plan, hp: &HParams, act_row: usize, cfg: &SessionConfig) -> Result<(), Error> {
    if cfg.n_ctx == 0 || cfg.n_batch == 0 || cfg.n_outputs == 0 || cfg.n_threads == 0 {
        return Err(Error::BadConfig("n_ctx, n_batch, n_outputs and n_threads must be > 0"));
    }
    let (b, f4, f2) = (cfg.n_batch, 4, 2);
    let kv = |dim: usize| hp.n_layer.checked_mul(cfg.n_ctx).and_then(|v| v.checked_mul(dim)).ok_or(Error::BadConfig("KV cache size overflows; lower -c"));
    plan.add(REGIONS[0], kv(hp.k_dim())?, f2)?;
    plan.add(REGIONS[1], kv(hp.v_dim())?, f2)?;
    plan.add(REGIONS[2], b * hp.n_embd, f4)?;
    plan.add(REGIONS[3], b * hp.n_embd, f4)?;
    plan.add(REGIONS[4], b * hp.q_dim(), f4)?;
    plan.add(REGIONS[5], b * hp.k_dim(), f4)?;
    plan.add(REGIONS[6], b * hp.v_dim(), f4)?;
    plan.add(REGIONS[7], b * hp.n_head * hp.head_dim_v, f4)?;
    plan.add(REGIONS[8], b * hp.n_ff, f4)?;
    plan.add(REGIONS[9], b * hp.n_ff, f4)?;
    plan.add(REGIONS[10], b.max(cfg.n_outputs), act_row)?;
    plan.add(REGIONS[11], cfg.n_threads * (hp.head_dim + hp.head_dim_v), f2)?;
    plan.add(REGIONS[12], hp.n_rot, f4)?;
    plan.add(REGIONS[13], cfg.n_outputs.checked_mul(hp.n_vocab).ok_or(Error::BadConfig("logits size overflows"))?, f4)?;
    Ok(())
}

/// One sequence's state and scratch, all in the arena.
pub struct Session<'a> {
    cfg: SessionConfig,
    kernels: Kernels,
    kv_k: &'a mut [f16],
    kv_v: &'a mut [f16],
    x: &'a mut [f32],
    xn: &'a mut [f32],
    q: &'a mut [f32],
    k: &'a mut [f32],
    v: &'a mut [f32],
    attn: &'a mut [f32],
    ffn_a: &'a mut [f32],
    ffn_b: &'a mut [f32],
    act_q: &'a mut [u8],
    attn_scratch: &'a mut [f16],
    rope: &'a mut [f32],
    logits: &'a mut [f32],
    n_logits: usize,
    n_past: usize,
}

impl<'a> Session<'a> {
    /// Takes the session's regions (planned by [`plan_session`]) from `carver`.
    pub fn new(carver: &mut Carver<'a>, plan: &Plan, cfg: SessionConfig, kernels: Kernels) -> Session<'a> {
        let r = |name: &'static str| plan.region(name).unwrap_or(crate::arena::Region { name, offset: 0, bytes: 0 });
        Session {
            cfg,
            kernels,
            kv_k: carver.f16s(r(REGIONS[0])),
            kv_v: carver.f16s(r(REGIONS[1])),
            x: carver.f32s(r(REGIONS[2])),
            xn: carver.f32s(r(REGIONS[3])),
            q: carver.f32s(r(REGIONS[4])),
            k: carver.f32s(r(REGIONS[5])),
            v: carver.f32s(r(REGIONS[6])),
            attn: carver.f32s(r(REGIONS[7])),
            ffn_a: carver.f32s(r(REGIONS[8])),
            ffn_b: carver.f32s(r(REGIONS[9])),
            act_q: carver.bytes(r(REGIONS[10])),
            attn_scratch: carver.f16s(r(REGIONS[11])),
            rope: carver.f32s(r(REGIONS[12])),
            logits: carver.f32s(r(REGIONS[13])),
            n_logits: 0,
            n_past: 0,
        }
    }

    /// Tokens in the context.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// The context length.
    pub fn n_ctx(&self) -> usize {
        self.cfg.n_ctx
    }

    /// The run limits.
    pub fn config(&self) -> SessionConfig {
        self.cfg
    }

    /// The kernels in use.
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// Forgets the context after the first `n` tokens (0 = start over).
    pub fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
        self.n_logits = 0;
    }

    /// Logits rows from the last `eval`, `n_vocab` each.
    pub fn logits(&self, n_vocab: usize) -> &[f32] {
        &self.logits[..self.n_logits * n_vocab]
    }

    /// Logits of the last row produced by the last `eval`.
    pub fn last_logits(&self, n_vocab: usize) -> &[f32] {
        let n = self.n_logits.max(1);
        &self.logits[(n - 1) * n_vocab..n * n_vocab]
    }

    /// Appends `tokens` to the context and computes logits for `outputs`.
    pub fn eval(&mut self, model: &Model<'_>, tokens: &[u32], outputs: Outputs, par: &dyn Parallel) -> Result<(), Error> {
        let hp = &model.hp;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= hp.n_vocab) {
            return Err(Error::BadToken { id, n_vocab: hp.n_vocab });
        }
        if tokens.is_empty() {
            return Err(Error::BadConfig("eval needs at least one token"));
        }
        if self.n_past + tokens.len() > self.cfg.n_ctx {
            return Err(Error::ContextFull { n_past: self.n_past, n_tokens: tokens.len(), n_ctx: self.cfg.n_ctx });
        }
        let want = if outputs == Outputs::All { tokens.len() } else { 1 };
        if want > self.cfg.n_outputs {
            return Err(Error::TooManyOutputs { asked: want, planned: self.cfg.n_outputs });
        }
        self.n_logits = 0;
        let mut done = 0;
        while done < tokens.len() {
            let n = (tokens.len() - done).min(self.cfg.n_batch);
            let chunk = &tokens[done..done + n];
            let last_chunk = done + n == tokens.len();
            let out_rows = match outputs {
                Outputs::All => n,
                Outputs::Last if last_chunk => 1,
                Outputs::Last => 0,
            };
            self.forward(model, chunk, out_rows, par);
            done += n;
        }
        Ok(())
    }

    /// One forward pass over `n <= n_batch` tokens; logits for the last `out_rows` of them
    /// are appended after the rows already produced by this `eval`.
    fn forward(&mut self, model: &Model<'_>, tokens: &[u32], out_rows: usize, par: &dyn Parallel) {
        let hp = &model.hp;
        let n = tokens.len();
        let (e, f) = (hp.n_embd, hp.n_ff);
        let kern = self.kernels;
        let n_ctx = self.cfg.n_ctx;
        let n_tasks = self.cfg.n_threads;
        let n_past = self.n_past;
        let Session { kv_k, kv_v, x, xn, q, k, v, attn, ffn_a, ffn_b, act_q, attn_scratch, rope, logits, .. } = self;
        let mut act = Act { kern, buf: &mut **act_q, cur: None };

        // Token embedding rows -> x (n, n_embd).
        for (i, &t) in tokens.iter().enumerate() {
            let _ = kern.dequantize_row(model.tok_embd.ty, model.tok_embd.row(t as usize), &mut x[i * e..(i + 1) * e]);
        }

        let attn_w = hp.n_head * hp.head_dim_v;
        for (l, layer) in model.layers.iter().enumerate() {
            // Attention: xn = norm(x); q, k, v = xn W.
            for i in 0..n {
                ops::rms_norm(&x[i * e..(i + 1) * e], layer.attn_norm.data, hp.rms_eps, &mut xn[i * e..(i + 1) * e]);
            }
            act.invalidate();
            act.project(par, &layer.wq, &xn[..n * e], n, q);
            act.project(par, &layer.wk, &xn[..n * e], n, k);
            act.project(par, &layer.wv, &xn[..n * e], n, v);
            let cache = Cache { kv_k, kv_v, n_ctx, layer: l, n_past };
            rope_and_store(hp, &kern, cache, q, k, v, rope, n);
            let cache = Cache { kv_k, kv_v, n_ctx, layer: l, n_past };
            attention(hp, &kern, &cache, q, attn, attn_scratch, n_tasks, n, par);
            // x += attn Wo
            act.invalidate();
            act.project(par, &layer.wo, &attn[..n * attn_w], n, xn);
            ops::add_assign(&mut x[..n * e], &xn[..n * e]);

            // Feed-forward: x += (silu(xn Wg) * (xn Wu)) Wd
            for i in 0..n {
                ops::rms_norm(&x[i * e..(i + 1) * e], layer.ffn_norm.data, hp.rms_eps, &mut xn[i * e..(i + 1) * e]);
            }
            act.invalidate();
            act.project(par, &layer.ffn_gate, &xn[..n * e], n, ffn_a);
            act.project(par, &layer.ffn_up, &xn[..n * e], n, ffn_b);
            kern.swiglu(&mut ffn_a[..n * f], &ffn_b[..n * f]);
            act.invalidate();
            act.project(par, &layer.ffn_down, &ffn_a[..n * f], n, xn);
            ops::add_assign(&mut x[..n * e], &xn[..n * e]);
        }
        self.n_past += n;

        if out_rows > 0 {
            // Final norm of the rows that produce logits, then the output projection.
            let first = n - out_rows;
            for j in 0..out_rows {
                let i = first + j;
                ops::rms_norm(&x[i * e..(i + 1) * e], model.output_norm.data, hp.rms_eps, &mut xn[j * e..(j + 1) * e]);
            }
            let v = hp.n_vocab;
            let base = self.n_logits * v;
            act.invalidate();
            act.project(par, &model.output, &xn[..out_rows * e], out_rows, &mut logits[base..base + out_rows * v]);
            self.n_logits += out_rows;
        }
    }

}

/// One layer's view of the KV cache.
struct Cache<'c> {
    kv_k: &'c mut [f16],
    kv_v: &'c mut [f16],
    n_ctx: usize,
    layer: usize,
    n_past: usize,
}

/// RoPE on q and k of `n` tokens, then k and v into the cache as f16.
#[allow(clippy::too_many_arguments)]
fn rope_and_store(hp: &HParams, kern: &Kernels, c: Cache<'_>, q: &mut [f32], k: &mut [f32], v: &[f32], rope: &mut [f32], n: usize) {
    let (qd, kd, vd) = (hp.q_dim(), hp.k_dim(), hp.v_dim());
    let hd = hp.head_dim;
    let rotate: fn(&mut [f32], &[f32], usize) = match hp.rope_mode {
        RopeMode::Normal => ops::rope_normal,
        RopeMode::Neox => ops::rope_neox,
    };
    for i in 0..n {
        let pos = c.n_past + i;
        ops::rope_angles(pos, hp.rope_base, hp.n_rot, rope);
        for h in 0..hp.n_head {
            rotate(&mut q[i * qd + h * hd..i * qd + (h + 1) * hd], rope, hp.n_rot);
        }
        for h in 0..hp.n_head_kv {
            rotate(&mut k[i * kd + h * hd..i * kd + (h + 1) * hd], rope, hp.n_rot);
        }
        let kc = (c.layer * c.n_ctx + pos) * kd;
        kern.f32_to_f16(&k[i * kd..(i + 1) * kd], &mut c.kv_k[kc..kc + kd]);
        let vc = (c.layer * c.n_ctx + pos) * vd;
        kern.f32_to_f16(&v[i * vd..(i + 1) * vd], &mut c.kv_v[vc..vc + vd]);
    }
}

/// Causal grouped-query attention of the `n` new tokens over one layer's cache, split
/// by (token, head) across at most `max_tasks` tasks, each with its own f16 scratch.
///
/// The arithmetic is llama.cpp's CPU flash attention (`one_chunk` path) operation for
/// operation: q rounded to f16; per key in order `s = dot(k, q)·scale` (f16 dot order of
/// `Kernels::f16_dot`); online softmax with the value accumulator in **f16** (on a new
/// maximum `acc *= exp(old - max)`, else `vs = exp(s - max)`; `acc += v·vs` rounded to
/// f16 each step; `sum = fma(sum, ms, vs)`); finally `out = f32(acc) · (1/sum)`.
/// llama.cpp uses a different, tiled arithmetic for batches of 64 or more queries; keel
/// always uses this one, so a position's output does not depend on the batch.
#[allow(clippy::too_many_arguments)]
fn attention(hp: &HParams, kern: &Kernels, c: &Cache<'_>, q: &[f32], out: &mut [f32], scratch: &mut [f16], max_tasks: usize, n: usize, par: &dyn Parallel) {
    let (hd, hdv) = (hp.head_dim, hp.head_dim_v);
    let (qd, kd, vd) = (hp.q_dim(), hp.k_dim(), hp.v_dim());
    let group = hp.n_head / hp.n_head_kv;
    let (n_ctx, l, n_past) = (c.n_ctx, c.layer, c.n_past);
    let scale = 1.0 / libm::sqrtf(hd as f32);
    let (kv_k, kv_v) = (&*c.kv_k, &*c.kv_v);
    let per_task = hd + hdv;
    let tasks = par.n_threads().min(max_tasks).min(n * hp.n_head).max(1);
    let scratch = SharedMut::new(scratch);
    let out_w = hp.n_head * hdv;
    let out = SharedMut::new(&mut out[..n * out_w]);
    par.run(tasks, &|t| {
        // SAFETY: task t owns scratch slot t (tasks <= the n_threads slots planned).
        let s = unsafe { scratch.slice(t * per_task, per_task) };
        let (qh, acc) = s.split_at_mut(hd);
        for pair in split_range(n * hp.n_head, tasks, t) {
            let (i, h) = (pair / hp.n_head, pair % hp.n_head);
            let pos = n_past + i;
            let kvh = h / group;
            kern.f32_to_f16(&q[i * qd + h * hd..][..hd], qh);
            acc.fill(f16::ZERO);
            let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
            for j in 0..=pos {
                let kr = &kv_k[(l * n_ctx + j) * kd + kvh * hd..][..hd];
                let s = kern.f16_dot(kr, qh) * scale;
                let (ms, vs) = if s > max {
                    let ms = ops::expf(max - s);
                    max = s;
                    kern.f16_scale(acc, ms);
                    (ms, 1.0)
                } else {
                    (1.0, ops::expf(s - max))
                };
                kern.f16_mad(acc, &kv_v[(l * n_ctx + j) * vd + kvh * hdv..][..hdv], vs);
                sum = libm::fmaf(sum, ms, vs);
            }
            // SAFETY: output (i, h) is written by exactly one task.
            let o = unsafe { out.slice(i * out_w + h * hdv, hdv) };
            kern.f16_to_f32(acc, o);
            let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
            for v in o.iter_mut() {
                *v *= inv;
            }
        }
    });
}

/// The quantized-activation buffer and which type it currently holds, so q, k and v
/// (or gate and up) quantize their shared input once.
struct Act<'b> {
    kern: Kernels,
    buf: &'b mut [u8],
    cur: Option<GgmlType>,
}

impl Act<'_> {
    /// The input changed: the next projection must quantize again.
    fn invalidate(&mut self) {
        self.cur = None;
    }

    /// `out = x W` for `n` rows of `x` (each `w.cols` wide).
    fn project(&mut self, par: &dyn Parallel, w: &Tensor<'_>, x: &[f32], n: usize, out: &mut [f32]) {
        let Some(vdt) = Kernels::vec_dot_type(w.ty) else { return };
        if self.cur != Some(vdt) {
            let rb = vdt.row_bytes(w.cols as u64).unwrap_or(0) as usize;
            quantize_rows(&self.kern, par, vdt, x, n, w.cols, &mut self.buf[..n * rb]);
            self.cur = Some(vdt);
        }
        matmul(&self.kern, par, w, self.buf, n, out);
    }
}

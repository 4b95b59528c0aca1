//! A session: the KV cache and activation buffers of one sequence, and the forward pass.
//!
//! Owns: the arena regions of one running sequence and the order of operations of the
//! llama-family block. Batched prompt evaluation and single-token decode run the same
//! per-row arithmetic. Never allocates.

use crate::arena::{Carver, Plan};
use crate::error::Error;
use crate::ggml_type::GgmlType;
use crate::gguf::Gguf;
use crate::matmul::{act_row_bytes, matmul_as, quantize_rows, SharedMut};
use crate::attention::{attend_heads, KeySpan};
use crate::attn_tiled;
use crate::delta_net;
use crate::model::{Attention, DeltaNet, FfnAct, HParams, Mixer, Model, RopeMode, Ssm, Tensor};
use crate::ops;
use crate::placement::{Exec, Offload, Placement, WeightId, WeightKind, OUTPUT_LAYER};
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
const REGIONS: [&str; 21] = [
    "kv_k", "kv_v", "conv_state", "ssm_state", "x", "xn", "q", "k", "v", "gate", "attn", "ffn_a", "ffn_b", "act_q", "attn_scratch", "rope", "gdn_ab", "conv_out", "gdn_scratch", "attn_tile", "logits",
];

/// Tokens per chunk of the chunked delta-net prompt path.
const DELTA_CHUNK: usize = 64;

/// The largest activation row (bytes) any matrix product of this file needs.
pub fn max_act_row_bytes(g: &Gguf<'_>) -> usize {
    g.tensors().filter(|t| t.n_dims >= 2).filter_map(|t| act_row_bytes(t.ty, t.ne[0] as usize)).max().unwrap_or(0)
}

/// Elements (count, element size) of each region, in `REGIONS` order.
fn region_sizes(hp: &HParams, act_row: usize, cfg: &SessionConfig) -> Result<[(usize, usize); 21], Error> {
    let overflow = || Error::BadConfig("KV cache size overflows; lower -c");
    let (b, f4, f2) = (cfg.n_batch, 4, 2);
    let mut kv_rows = 0usize;
    for l in 0..hp.n_layer {
        kv_rows = kv_rows.checked_add(hp.kv_rows(l, cfg.n_ctx, cfg.n_batch)).ok_or_else(overflow)?;
    }
    let kv = |dim: usize| kv_rows.checked_mul(dim).ok_or_else(overflow);
    let n_recr = hp.n_recurrent();
    let (conv_state, ssm_state, ch, d_inner, n_vh, d_state) = match hp.ssm {
        Some(s) => (n_recr * s.conv_state_len(), n_recr * s.state_len(), s.conv_channels(), s.d_inner, s.n_v_heads, s.d_state),
        None => (0, 0, 0, 0, 0, 0),
    };
    let q_rows = if hp.attn_gated { 2 * hp.q_dim() } else { hp.q_dim() };
    let gate = if hp.attn_gated { b * hp.q_dim() } else { 0 };
    let logits = cfg.n_outputs.checked_mul(hp.n_vocab).ok_or(Error::BadConfig("logits size overflows"))?;
    Ok([
        (kv(hp.k_dim())?, f2),
        (kv(hp.v_dim())?, f2),
        (conv_state, f4),
        (ssm_state, f4),
        (b * hp.n_embd, f4),
        (b * hp.n_embd, f4),
        (b * q_rows.max(ch), f4),
        (b * hp.k_dim().max(d_inner), f4),
        (b * hp.v_dim(), f4),
        (gate, f4),
        (b * (hp.n_head * hp.head_dim_v).max(d_inner), f4),
        (b * hp.n_ff.max(hp.n_embd), f4),
        (b * hp.n_ff.max(hp.n_embd), f4),
        (b.max(cfg.n_outputs), act_row),
        (cfg.n_threads * ATTN_HEADS * (hp.head_dim + hp.head_dim_v), f2),
        (hp.n_rot, f4),
        (2 * b * n_vh, f4),
        (b * ch, f4),
        (if d_state > 0 { cfg.n_threads * (delta_net::chunk_scratch_len(DELTA_CHUNK, d_state) + DELTA_CHUNK * d_state) } else { 0 }, f4),
        (cfg.n_threads * attn_tiled::scratch_len(hp.head_dim, hp.head_dim_v), f4),
        (logits, f4),
    ])
}

/// Appends a session's regions to `plan`.
pub fn plan_session(plan: &mut Plan, hp: &HParams, act_row: usize, cfg: &SessionConfig) -> Result<(), Error> {
    if cfg.n_ctx == 0 || cfg.n_batch == 0 || cfg.n_outputs == 0 || cfg.n_threads == 0 {
        return Err(Error::BadConfig("n_ctx, n_batch, n_outputs and n_threads must be > 0"));
    }
    for (name, (count, size)) in REGIONS.iter().zip(region_sizes(hp, act_row, cfg)?) {
        plan.add(name, count, size)?;
    }
    Ok(())
}

/// One sequence's state and scratch, all in the arena.
pub struct Session<'a> {
    cfg: SessionConfig,
    kernels: Kernels,
    kv_k: &'a mut [f16],
    kv_v: &'a mut [f16],
    conv_state: &'a mut [f32],
    ssm_state: &'a mut [f32],
    x: &'a mut [f32],
    xn: &'a mut [f32],
    q: &'a mut [f32],
    k: &'a mut [f32],
    v: &'a mut [f32],
    gate: &'a mut [f32],
    attn: &'a mut [f32],
    ffn_a: &'a mut [f32],
    ffn_b: &'a mut [f32],
    act_q: &'a mut [u8],
    attn_scratch: &'a mut [f16],
    rope: &'a mut [f32],
    gdn_ab: &'a mut [f32],
    conv_out: &'a mut [f32],
    gdn_scratch: &'a mut [f32],
    attn_tile: &'a mut [f32],
    logits: &'a mut [f32],
    tiled_batches: bool,
    delta_chunked: bool,
    n_logits: usize,
    n_past: usize,
    /// The placement's layer generation when this sequence started with whole layers
    /// on devices (`None`: every layer's KV cache is in the arena).
    seq_layers: Option<u32>,
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
            conv_state: carver.f32s(r(REGIONS[2])),
            ssm_state: carver.f32s(r(REGIONS[3])),
            x: carver.f32s(r(REGIONS[4])),
            xn: carver.f32s(r(REGIONS[5])),
            q: carver.f32s(r(REGIONS[6])),
            k: carver.f32s(r(REGIONS[7])),
            v: carver.f32s(r(REGIONS[8])),
            gate: carver.f32s(r(REGIONS[9])),
            attn: carver.f32s(r(REGIONS[10])),
            ffn_a: carver.f32s(r(REGIONS[11])),
            ffn_b: carver.f32s(r(REGIONS[12])),
            act_q: carver.bytes(r(REGIONS[13])),
            attn_scratch: carver.f16s(r(REGIONS[14])),
            rope: carver.f32s(r(REGIONS[15])),
            gdn_ab: carver.f32s(r(REGIONS[16])),
            conv_out: carver.f32s(r(REGIONS[17])),
            gdn_scratch: carver.f32s(r(REGIONS[18])),
            attn_tile: carver.f32s(r(REGIONS[19])),
            logits: carver.f32s(r(REGIONS[20])),
            tiled_batches: false,
            delta_chunked: false,
            n_logits: 0,
            n_past: 0,
            seq_layers: None,
        }
    }

    /// With `on`, keel follows llama.cpp's batch-dependent choices: forward passes over 64
    /// or more tokens use its tiled attention arithmetic ([`crate::attn_tiled`]), and
    /// matrix products use the kernel llama.cpp uses for each token of the batch
    /// ([`Kernels::dot_fn_in_batch`]: repacked GEMM groups of 4 for Q4_K/Q2_K, the tiled
    /// K-quant matmul for 8+ tokens), so prompts give llama.cpp's numbers. A token's logits
    /// then depend on the batch it was evaluated in. Off (the default): every batch uses the one-query arithmetic, and logits
    /// never depend on batching.
    pub fn set_llama_cpp_batches(&mut self, on: bool) {
        self.tiled_batches = on;
    }

    /// With `on`, delta-net layers evaluate batches of several tokens in the chunked
    /// (matrix) form ([`delta_net::chunk`]) instead of token by token. The results agree
    /// to float rounding, not bit for bit; off (the default) follows llama.cpp's fused op.
    pub fn set_delta_net_chunked(&mut self, on: bool) {
        self.delta_chunked = on;
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
    ///
    /// A model with recurrent (delta-net) layers keeps one state, not one per position,
    /// so it can only start over: any `0 < n < n_past` is refused.
    pub fn truncate(&mut self, n: usize) -> Result<(), Error> {
        if n > 0 && n < self.n_past && !self.ssm_state.is_empty() {
            return Err(Error::BadConfig("a model with recurrent layers cannot rewind its context; start over instead"));
        }
        self.n_past = self.n_past.min(n);
        self.n_logits = 0;
        Ok(())
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
        self.eval_on(model, tokens, outputs, par, None)
    }

    /// [`Session::eval`] with matrix products placed by `exec` (each one the placement
    /// assigns to a device runs there; the rest on the CPU), and layers the placement
    /// runs whole on a device handed to [`crate::placement::Offload::layers`] (their KV
    /// cache is on the device; the arena's rows for them are not used). When the
    /// placement runs the whole forward pass on one device
    /// ([`Placement::forward_device`]), the tokens go to
    /// [`crate::placement::Offload::forward`] and the logits come back from it: the CPU
    /// does no embedding lookup, layer, final norm or output projection. A device failure
    /// stops the request with [`Error::Device`]: the session's context is then unusable
    /// (start over). If the devices holding whole layers were switched since this
    /// sequence started, the call fails with [`Error::DeviceLayersSwitched`].
    pub fn eval_on(&mut self, model: &Model<'_>, tokens: &[u32], outputs: Outputs, par: &dyn Parallel, mut exec: Option<&mut Exec<'_, '_>>) -> Result<(), Error> {
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
        // Whole layers keep their KV cache on the device: a sequence stays where it started.
        let layers = exec.as_deref().map(|e| e.placement).filter(|p| p.has_device_layers()).map(|p| p.layer_generation());
        if self.n_past == 0 {
            self.seq_layers = layers;
        } else if self.seq_layers != layers {
            return Err(Error::DeviceLayersSwitched);
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
            self.forward(model, chunk, out_rows, par, exec.as_deref_mut())?;
            done += n;
        }
        Ok(())
    }

    /// One forward pass over `n <= n_batch` tokens; logits for the last `out_rows` of them
    /// are appended after the rows already produced by this `eval`.
    fn forward(&mut self, model: &Model<'_>, tokens: &[u32], out_rows: usize, par: &dyn Parallel, exec: Option<&mut Exec<'_, '_>>) -> Result<(), Error> {
        let hp = &model.hp;
        let n = tokens.len();
        let (e, f) = (hp.n_embd, hp.n_ff);
        let kern = self.kernels;
        let (n_ctx, n_batch) = (self.cfg.n_ctx, self.cfg.n_batch);
        let n_tasks = self.cfg.n_threads;
        let n_past = self.n_past;
        let tiled = self.tiled_batches && n >= attn_tiled::TILE;
        let self_tiled_mode = self.tiled_batches;
        let chunked = self.delta_chunked && n > 1;
        let Session { kv_k, kv_v, conv_state, ssm_state, x, xn, q, k, v, gate, attn, ffn_a, ffn_b, act_q, attn_scratch, rope, gdn_ab, conv_out, gdn_scratch, attn_tile, logits, .. } = self;
        let (placement, mut offload): (Option<&Placement<'_>>, Option<&mut dyn Offload>) = match exec {
            Some(e) => (Some(e.placement), Some(&mut *e.offload)),
            None => (None, None),
        };
        if let (Some(dev), Some(off)) = (placement.and_then(|p| p.forward_device(out_rows)), offload.as_deref_mut()) {
            // The whole pass on one device: tokens in, logits of the last out_rows rows out.
            let v = hp.n_vocab;
            let base = self.n_logits * v;
            if off.forward(dev, tokens, n_past, out_rows, &mut logits[base..base + out_rows * v]).is_err() {
                return Err(Error::Device { device: dev });
            }
            self.n_past += n;
            self.n_logits += out_rows;
            return Ok(());
        }
        let mut act = Act { kern, buf: &mut **act_q, cur: None, llama_cpp_batches: self_tiled_mode, placement, offload, layer: 0, failed: None };
        if n_past == 0 {
            // A new sequence: recurrent layers start from zero state.
            conv_state.fill(0.0);
            ssm_state.fill(0.0);
        }

        // Token embedding rows -> x (n, n_embd), scaled for Gemma.
        for (i, &t) in tokens.iter().enumerate() {
            let row = &mut x[i * e..(i + 1) * e];
            let _ = kern.dequantize_row(model.tok_embd.ty, model.tok_embd.row(t as usize), row);
            if hp.embd_scale != 1.0 {
                for v in row.iter_mut() {
                    *v *= hp.embd_scale;
                }
            }
        }

        let (mut kv_row0, mut recr) = (0usize, 0usize);
        let mut on_device_until = 0;
        for (l, layer) in model.layers.iter().enumerate() {
            act.layer = l as u16;
            if l < on_device_until {
                kv_row0 += hp.kv_rows(l, n_ctx, n_batch);
                continue;
            }
            if let Some(dev) = placement.and_then(|p| p.layer_device(l)) {
                // Layers l.. on this device run there whole, with their KV cache; x goes
                // in and comes back.
                let mut l1 = l + 1;
                while l1 < model.layers.len() && placement.and_then(|p| p.layer_device(l1)) == Some(dev) {
                    l1 += 1;
                }
                if act.failed.is_none() {
                    let ok = match act.offload.as_deref_mut() {
                        Some(off) => off.layers(dev, l as u16..l1 as u16, &mut x[..n * e], n, n_past).is_ok(),
                        None => false,
                    };
                    if !ok {
                        act.failed = Some(dev);
                    }
                }
                on_device_until = l1;
                kv_row0 += hp.kv_rows(l, n_ctx, n_batch);
                continue;
            }
            for i in 0..n {
                ops::rms_norm(&x[i * e..(i + 1) * e], layer.attn_norm.data, hp.rms_eps, &mut xn[i * e..(i + 1) * e]);
            }
            act.invalidate();
            match &layer.mixer {
                Mixer::Attention(a) => {
                    let rows = hp.kv_rows(l, n_ctx, n_batch);
                    let bufs = AttnBufs { q, k, v, gate, attn, rope, scratch: attn_scratch, tile: if tiled { Some(&mut **attn_tile) } else { None } };
                    let cache = Cache { kv_k: &mut kv_k[kv_row0 * hp.k_dim()..(kv_row0 + rows) * hp.k_dim()], kv_v: &mut kv_v[kv_row0 * hp.v_dim()..(kv_row0 + rows) * hp.v_dim()], rows, n_past, window: if hp.is_swa(l) { hp.n_swa } else { 0 } };
                    attention_block(hp, l, a, &mut act, cache, bufs, &xn[..n * e], &mut ffn_a[..n * e], n_tasks, n, par);
                    kv_row0 += rows;
                }
                Mixer::DeltaNet(d) => {
                    let Some(s) = hp.ssm else { return Err(Error::BadConfig("a delta-net layer without ssm parameters")) };
                    let st = DeltaState { conv: &mut conv_state[recr * s.conv_state_len()..(recr + 1) * s.conv_state_len()], ssm: &mut ssm_state[recr * s.state_len()..(recr + 1) * s.state_len()] };
                    let bufs = DeltaBufs { qkv: q, z: k, ab: gdn_ab, conv: conv_out, out: attn, scratch: gdn_scratch };
                    delta_net_block(hp, &s, d, &mut act, st, bufs, &xn[..n * e], &mut ffn_a[..n * e], n_tasks, n, chunked, par);
                    recr += 1;
                }
            }
            // The mixer output is in ffn_a; optional post-norm, then the residual add.
            add_residual(hp, layer.attn_post_norm, &ffn_a[..n * e], &mut xn[..n * e], &mut x[..n * e], n);

            // Feed-forward: x += act(xn Wg) * (xn Wu)) Wd
            for i in 0..n {
                ops::rms_norm(&x[i * e..(i + 1) * e], layer.ffn_norm.data, hp.rms_eps, &mut xn[i * e..(i + 1) * e]);
            }
            act.invalidate();
            act.project(par, WeightKind::Gate, &layer.ffn_gate, &xn[..n * e], n, ffn_a);
            act.project(par, WeightKind::Up, &layer.ffn_up, &xn[..n * e], n, ffn_b);
            ffn_activation(&kern, par, hp.ffn_act, &mut ffn_a[..n * f], &ffn_b[..n * f]);
            act.invalidate();
            act.project(par, WeightKind::Down, &layer.ffn_down, &ffn_a[..n * f], n, ffn_b);
            add_residual(hp, layer.ffn_post_norm, &ffn_b[..n * e], &mut xn[..n * e], &mut x[..n * e], n);
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
            act.layer = OUTPUT_LAYER;
            act.project(par, WeightKind::Output, &model.output, &xn[..out_rows * e], out_rows, &mut logits[base..base + out_rows * v]);
            self.n_logits += out_rows;
        }
        match act.failed {
            Some(device) => Err(Error::Device { device }),
            None => Ok(()),
        }
    }
}

/// `x += post_norm(y)` (or `x += y` without a post-norm) for `n` rows; `tmp` is scratch.
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

fn add_residual(hp: &HParams, post_norm: Option<Tensor<'_>>, y: &[f32], tmp: &mut [f32], x: &mut [f32], n: usize) {
    let e = hp.n_embd;
    match post_norm {
        Some(w) => {
            for i in 0..n {
                ops::rms_norm(&y[i * e..(i + 1) * e], w.data, hp.rms_eps, &mut tmp[i * e..(i + 1) * e]);
            }
            ops::add_assign(x, tmp);
        }
        None => ops::add_assign(x, y),
    }
}

/// One attention layer's view of the KV cache: `rows` rows (a ring of the last `rows`
/// positions when `window > 0`).
struct Cache<'c> {
    kv_k: &'c mut [f16],
    kv_v: &'c mut [f16],
    rows: usize,
    n_past: usize,
    /// Sliding-window width (0: none).
    window: usize,
}

/// Activation buffers an attention layer uses.
struct AttnBufs<'b> {
    q: &'b mut [f32],
    k: &'b mut [f32],
    v: &'b mut [f32],
    gate: &'b mut [f32],
    attn: &'b mut [f32],
    rope: &'b mut [f32],
    scratch: &'b mut [f16],
    /// Scratch for the tiled arithmetic, when this batch uses it.
    tile: Option<&'b mut [f32]>,
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

/// Attention mixer of layer `l`: projections, norms, RoPE, cache, attention, output
/// projection into `out` (`n` rows of `n_embd`).
#[allow(clippy::too_many_arguments)]
fn attention_block(hp: &HParams, l: usize, a: &Attention<'_>, act: &mut Act<'_>, c: Cache<'_>, b: AttnBufs<'_>, xn: &[f32], out: &mut [f32], n_tasks: usize, n: usize, par: &dyn Parallel) {
    let (qd, kd, vd, hd) = (hp.q_dim(), hp.k_dim(), hp.v_dim(), hp.head_dim);
    let kern = act.kern;
    act.project(par, WeightKind::Q, &a.wq, xn, n, b.q);
    act.project(par, WeightKind::K, &a.wk, xn, n, b.k);
    act.project(par, WeightKind::V, &a.wv, xn, n, b.v);
    if hp.attn_gated {
        // Rows are [q | gate] per head: move the gates out, then pack q (destination
        // offsets never pass the source, so a forward copy is safe).
        for i in 0..n {
            for h in 0..hp.n_head {
                let src = i * 2 * qd + h * 2 * hd;
                b.gate[i * qd + h * hd..i * qd + (h + 1) * hd].copy_from_slice(&b.q[src + hd..src + 2 * hd]);
                b.q.copy_within(src..src + hd, i * qd + h * hd);
            }
        }
    }
    add_bias(b.q, a.bq, n, qd);
    add_bias(b.k, a.bk, n, kd);
    add_bias(b.v, a.bv, n, vd);
    head_norm(b.q, a.q_norm, n, qd, hd, hp.rms_eps);
    head_norm(b.k, a.k_norm, n, kd, hd, hp.rms_eps);
    let rotate: fn(&mut [f32], &[f32], usize) = match hp.rope_mode {
        RopeMode::Normal => ops::rope_normal,
        RopeMode::Neox => ops::rope_neox,
    };
    let base = hp.rope_base_of(l);
    for i in 0..n {
        let pos = c.n_past + i;
        ops::rope_angles(pos, base, hp.n_rot, b.rope);
        for h in 0..hp.n_head {
            rotate(&mut b.q[i * qd + h * hd..i * qd + (h + 1) * hd], b.rope, hp.n_rot);
        }
        for h in 0..hp.n_head_kv {
            rotate(&mut b.k[i * kd + h * hd..i * kd + (h + 1) * hd], b.rope, hp.n_rot);
        }
        let slot = pos % c.rows;
        kern.f32_to_f16(&b.k[i * kd..(i + 1) * kd], &mut c.kv_k[slot * kd..(slot + 1) * kd]);
        kern.f32_to_f16(&b.v[i * vd..(i + 1) * vd], &mut c.kv_v[slot * vd..(slot + 1) * vd]);
    }
    let mut scale = hp.attn_scale;
    if hp.q_prescale {
        for v in b.q[..n * qd].iter_mut() {
            *v *= scale;
        }
        scale = 1.0;
    }
    match b.tile {
        Some(tile) => attention_tiled(hp, &kern, &c, b.q, scale, b.attn, tile, n_tasks, n, par),
        None => attention(hp, &kern, &c, b.q, scale, b.attn, b.scratch, n_tasks, n, par),
    }
    let aw = hp.n_head * hp.head_dim_v;
    if hp.attn_gated {
        for (o, &g) in b.attn[..n * aw].iter_mut().zip(b.gate.iter()) {
            *o *= ops::sigmoid(g);
        }
    }
    act.invalidate();
    act.project(par, WeightKind::O, &a.wo, &b.attn[..n * aw], n, out);
}

/// Query heads sharing a KV head that [`attention`] computes together.
pub(crate) const ATTN_HEADS: usize = crate::attention::MAX_HEADS;

/// Causal grouped-query attention of the `n` new tokens over one layer's cache, split
/// by (token, heads) items — up to [`ATTN_HEADS`] query heads that share a KV head —
/// dealt round-robin to at most `max_tasks` tasks, each with its own f16 scratch; each
/// item is one [`crate::attention::attend_heads`] call (its doc gives the arithmetic:
/// llama.cpp's CPU flash attention, `one_chunk` path). llama.cpp uses a different,
/// tiled arithmetic for batches of 64 or more queries; keel always uses this one, so a
/// position's output does not depend on the batch. With a sliding window a query at
/// `pos` sees keys `pos - window + 1 ..= pos`.
#[allow(clippy::too_many_arguments)]
fn attention(hp: &HParams, kern: &Kernels, c: &Cache<'_>, q: &[f32], scale: f32, out: &mut [f32], scratch: &mut [f16], max_tasks: usize, n: usize, par: &dyn Parallel) {
    let (hd, hdv) = (hp.head_dim, hp.head_dim_v);
    let (qd, kd, vd) = (hp.q_dim(), hp.k_dim(), hp.v_dim());
    let group = hp.n_head / hp.n_head_kv;
    // Items per KV head and token: its query heads in runs of at most ATTN_HEADS, or one
    // head per item when there are too few (token, KV head) pairs to keep the threads
    // busy (decode): the same bits either way.
    let per_item = if n * hp.n_head_kv >= 4 * par.n_threads() { ATTN_HEADS.min(group) } else { 1 };
    let runs = group.div_ceil(per_item);
    let (rows, n_past, window) = (c.rows, c.n_past, c.window);
    let (kv_k, kv_v) = (&*c.kv_k, &*c.kv_v);
    let per_task = ATTN_HEADS * (hd + hdv);
    let items = n * hp.n_head_kv * runs;
    let tasks = par.n_threads().min(max_tasks).min(items).max(1);
    let scratch = SharedMut::new(scratch);
    let out_w = hp.n_head * hdv;
    let out = SharedMut::new(&mut out[..n * out_w]);
    par.run(tasks, &|t| {
        // SAFETY: task t owns scratch slot t (tasks <= the n_threads slots planned).
        let s = unsafe { scratch.slice(t * per_task, per_task) };
        let (qh, acc) = s.split_at_mut(ATTN_HEADS * hd);
        // Items dealt round-robin: a later token attends to more keys, so contiguous
        // ranges would leave the last task most of a prompt's work.
        for item in (t..items).step_by(tasks) {
            let (i, rest) = (item / (hp.n_head_kv * runs), item % (hp.n_head_kv * runs));
            let (kvh, run) = (rest / runs, rest % runs);
            let h0 = kvh * group + run * per_item;
            let nh = (group - run * per_item).min(per_item);
            let pos = n_past + i;
            let first = if window > 0 { (pos + 1).saturating_sub(window) } else { 0 };
            let span = KeySpan { len: pos + 1 - first, first_slot: first, ring: rows, k_base: kvh * hd, k_stride: kd, v_base: kvh * hdv, v_stride: vd };
            // SAFETY: outputs (i, h0 .. h0 + nh) are written by exactly one task.
            let o = unsafe { out.slice(i * out_w + h0 * hdv, nh * hdv) };
            attend_heads(kern, &q[i * qd + h0 * hd..][..nh * hd], hd, hdv, kv_k, kv_v, span, scale, qh, acc, o);
        }
    });
}

/// [`attention`] with llama.cpp's tiled arithmetic ([`attn_tiled::row`]) per query row.
#[allow(clippy::too_many_arguments)]
fn attention_tiled(hp: &HParams, kern: &Kernels, c: &Cache<'_>, q: &[f32], scale: f32, out: &mut [f32], scratch: &mut [f32], max_tasks: usize, n: usize, par: &dyn Parallel) {
    let (hd, hdv) = (hp.head_dim, hp.head_dim_v);
    let (qd, kd, vd) = (hp.q_dim(), hp.k_dim(), hp.v_dim());
    let group = hp.n_head / hp.n_head_kv;
    let (kv_k, kv_v) = (&*c.kv_k, &*c.kv_v);
    let per_task = attn_tiled::scratch_len(hd, hdv);
    let tasks = par.n_threads().min(max_tasks).min(n * hp.n_head).max(1);
    let scratch = SharedMut::new(scratch);
    let out_w = hp.n_head * hdv;
    let out = SharedMut::new(&mut out[..n * out_w]);
    par.run(tasks, &|t| {
        // SAFETY: task t owns scratch slot t.
        let s = unsafe { scratch.slice(t * per_task, per_task) };
        // Round-robin, as in `attention`.
        for pair in (t..n * hp.n_head).step_by(tasks) {
            let (i, h) = (pair / hp.n_head, pair % hp.n_head);
            let pos = c.n_past + i;
            let first = if c.window > 0 { (pos + 1).saturating_sub(c.window) } else { 0 };
            let kvh = h / group;
            // SAFETY: output (i, h) is written by exactly one task.
            let o = unsafe { out.slice(i * out_w + h * hdv, hdv) };
            attn_tiled::row(kern, &q[i * qd + h * hd..][..hd], kv_k, kv_v, (c.rows, kd, vd, kvh * hd, kvh * hdv), first, pos, scale, s, o);
        }
    });
}

/// One recurrent layer's conv and delta-rule state.
struct DeltaState<'s> {
    conv: &'s mut [f32],
    ssm: &'s mut [f32],
}

/// Activation buffers a delta-net layer uses.
struct DeltaBufs<'b> {
    qkv: &'b mut [f32],
    z: &'b mut [f32],
    ab: &'b mut [f32],
    conv: &'b mut [f32],
    out: &'b mut [f32],
    scratch: &'b mut [f32],
}

/// Gated delta-net mixer: mixed QKV projection, causal conv1d + SiLU, L2-normalized q/k,
/// the delta rule per value head (token by token, as llama.cpp's fused op), the gated
/// output RMSNorm and the output projection into `out`.
#[allow(clippy::too_many_arguments)]
fn delta_net_block(hp: &HParams, s: &Ssm, d: &DeltaNet<'_>, act: &mut Act<'_>, st: DeltaState<'_>, b: DeltaBufs<'_>, xn: &[f32], out: &mut [f32], n_tasks: usize, n: usize, chunked: bool, par: &dyn Parallel) {
    let ch = s.conv_channels();
    let (ds, nvh, nkh) = (s.d_state, s.n_v_heads, s.n_k_heads);
    let kc = s.d_conv;
    act.project(par, WeightKind::Qkv, &d.wqkv, xn, n, b.qkv);
    act.project(par, WeightKind::Z, &d.wgate, xn, n, b.z);
    let (beta, alpha) = b.ab.split_at_mut(n * nvh);
    act.project(par, WeightKind::Beta, &d.wbeta, xn, n, beta);
    act.project(par, WeightKind::Alpha, &d.walpha, xn, n, &mut alpha[..n * nvh]);
    // beta = sigmoid(.); g = softplus(alpha + dt_bias) * a (stored in alpha).
    for i in 0..n {
        for h in 0..nvh {
            beta[i * nvh + h] = ops::sigmoid(beta[i * nvh + h]);
            let ab = alpha[i * nvh + h] + ops::f32_at(d.dt_bias.data, h);
            alpha[i * nvh + h] = ops::softplus(ab) * ops::f32_at(d.a.data, h);
        }
    }
    // Causal depthwise conv over [state (kc-1 previous inputs) | the n new inputs].
    let w = |c: usize, t: usize| ops::f32_at(d.conv1d.data, c * kc + t);
    for c in 0..ch {
        let state = &st.conv[c * (kc - 1)..(c + 1) * (kc - 1)];
        let input = |j: usize| if j < kc - 1 { state[j] } else { b.qkv[(j - (kc - 1)) * ch + c] };
        for i in 0..n {
            let mut sum = 0.0f32;
            for t in 0..kc {
                sum = libm::fmaf(input(i + t), w(c, t), sum);
            }
            b.conv[i * ch + c] = ops::silu(sum);
        }
        // The new state: the last kc-1 of [state | inputs].
        let mut last = [0.0f32; 64];
        for (t, v) in last[..kc - 1].iter_mut().enumerate() {
            *v = input(n + t);
        }
        st.conv[c * (kc - 1)..(c + 1) * (kc - 1)].copy_from_slice(&last[..kc - 1]);
    }
    // L2-normalize each q and k head.
    let kdim = nkh * ds;
    for i in 0..n {
        for h in 0..2 * nkh {
            delta_net::l2_norm(&mut b.conv[i * ch + h * ds..i * ch + (h + 1) * ds], hp.rms_eps);
        }
    }
    // The delta rule, one task per group of value heads.
    let scale = 1.0 / libm::sqrtf(ds as f32);
    let tasks = par.n_threads().min(n_tasks).min(nvh).max(1);
    let ssm = SharedMut::new(st.ssm);
    let scratch = SharedMut::new(b.scratch);
    let o = SharedMut::new(&mut b.out[..n * nvh * ds]);
    let (conv, beta, g) = (&*b.conv, &*beta, &alpha[..n * nvh]);
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
    // Gated RMSNorm per head: norm(o) * w * silu(z).
    for i in 0..n {
        for h in 0..nvh {
            let r = i * nvh * ds + h * ds;
            ops::rms_norm_in_place(&mut b.out[r..r + ds], d.norm.data, hp.rms_eps);
            for (v, &z) in b.out[r..r + ds].iter_mut().zip(&b.z[r..r + ds]) {
                *v *= ops::silu(z);
            }
        }
    }
    act.invalidate();
    act.project(par, WeightKind::Out, &d.wout, &b.out[..n * s.d_inner], n, out);
}

/// The quantized-activation buffer and which type it currently holds, so q, k and v
/// (or gate and up) quantize their shared input once.
struct Act<'b> {
    kern: Kernels,
    buf: &'b mut [u8],
    cur: Option<GgmlType>,
    /// Use llama.cpp's batch-dependent kernel choice ([`matmul_as`]).
    llama_cpp_batches: bool,
    /// Products placed on devices, when a placement is in use.
    placement: Option<&'b Placement<'b>>,
    offload: Option<&'b mut dyn Offload>,
    /// The layer whose products run now ([`OUTPUT_LAYER`] for the output projection).
    layer: u16,
    /// The first device that failed in this forward pass (later products are skipped).
    failed: Option<u8>,
}

impl Act<'_> {
    /// The input changed: the next projection must quantize again.
    fn invalidate(&mut self) {
        self.cur = None;
    }

    /// `out = x W` for `n` rows of `x` (each `w.cols` wide).
    fn project(&mut self, par: &dyn Parallel, kind: WeightKind, w: &Tensor<'_>, x: &[f32], n: usize, out: &mut [f32]) {
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

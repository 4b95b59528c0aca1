//! A session: the KV cache and activation buffers of one sequence, and the forward pass.
//!
//! Owns: the arena regions of one running sequence and the forward pass around the
//! blocks (embedding lookup, layer by layer: on a device or op by op on the CPU through
//! `block_cpu` from `block::layer_ops`, then the final norm and output projection).
//! Batched prompt evaluation and single-token decode run the same per-row arithmetic.
//! When the first layers run whole on a device and later stages elsewhere (another
//! device, the CPU), an `eval`'s chunks run as a pipeline: the next chunk's first stage
//! is begun on its device ([`crate::placement::Offload::layers_begin`]) before this
//! chunk's later stages run, with the same chunks and bits as one after the other.
//! Never allocates.

use crate::arena::{Carver, Plan};
use crate::error::Error;
use crate::gguf::Gguf;
use crate::matmul::act_row_bytes;
use crate::attn_tiled;
use crate::block::{self, Op};
use crate::block_cpu::{self, Act, Bufs, Cache, DeltaState, LayerState, Step, ATTN_HEADS, DELTA_CHUNK};
use crate::delta_net;
use crate::model::{HParams, Mixer, Model};
use crate::ops;
use crate::placement::{Exec, Offload, Placement, WeightKind, Where, OUTPUT_LAYER};
use crate::parallel::Parallel;
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

/// Where reference mode first saw a NaN or an infinity in a sequence: the op whose
/// output held it ([`Session::first_non_finite`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NonFinite {
    /// The layer (`None`: the token embedding, the final norm or the output projection).
    pub layer: Option<usize>,
    /// The op, by the tensor it applies or its name (`ffn_down`, `attn_norm`, `rope`,
    /// `token_embd`, `output_norm`, `output`).
    pub op: &'static str,
    /// The position (token) whose value went non-finite.
    pub pos: usize,
}

impl core::fmt::Display for NonFinite {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.layer {
            Some(l) => write!(f, "layer {l} {}", self.op),
            None => f.write_str(self.op),
        }
    }
}

/// Region names in plan order.
const REGIONS: [&str; 21] = [
    "kv_k", "kv_v", "conv_state", "ssm_state", "x", "xn", "q", "k", "v", "gate", "attn", "ffn_a", "ffn_b", "act_q", "attn_scratch", "rope", "gdn_ab", "conv_out", "gdn_scratch", "attn_tile", "logits",
];

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
        (cfg.n_threads * crate::attention::QBLOCK.min(cfg.n_batch) * ATTN_HEADS * (hp.head_dim + hp.head_dim_v), f2),
        (hp.n_rot, f4),
        (2 * b * n_vh, f4),
        (b * ch, f4),
        (if d_state > 0 { cfg.n_threads * (delta_net::chunk_scratch_len(DELTA_CHUNK, d_state) + DELTA_CHUNK * d_state) } else { 0 }, f4),
        // (Tiled attention runs only for batches of TILE or more tokens.)
        (if cfg.n_batch >= attn_tiled::TILE { cfg.n_threads * attn_tiled::scratch_len(hp.head_dim, hp.head_dim_v) } else { 0 }, f4),
        (logits, f4),
    ])
}

/// Appends a session's regions to `plan`.
pub fn plan_session(plan: &mut Plan, hp: &HParams, act_row: usize, cfg: &SessionConfig) -> Result<(), Error> {
    plan_session_with(plan, hp, act_row, cfg, false)
}

/// The checkpoint regions' names: a copy of the recurrent state ([`Session::checkpoint`]).
const CHECKPOINT: [&str; 2] = ["ckpt_conv", "ckpt_ssm"];

/// [`plan_session`], with `checkpoint`: also room for one copy of the recurrent
/// (delta-net) state, so that [`Session::rewind`] can go back within a sequence (what
/// speculative decoding needs). Exactly the recurrent state's size; nothing for a model
/// without recurrent layers, whose KV cache rewinds by itself.
pub fn plan_session_with(plan: &mut Plan, hp: &HParams, act_row: usize, cfg: &SessionConfig, checkpoint: bool) -> Result<(), Error> {
    if cfg.n_ctx == 0 || cfg.n_batch == 0 || cfg.n_outputs == 0 || cfg.n_threads == 0 {
        return Err(Error::BadConfig("n_ctx, n_batch, n_outputs and n_threads must be > 0"));
    }
    let sizes = region_sizes(hp, act_row, cfg)?;
    for (name, &(count, size)) in REGIONS.iter().zip(sizes.iter()) {
        plan.add(name, count, size)?;
    }
    if checkpoint {
        plan.add(CHECKPOINT[0], sizes[2].0, sizes[2].1)?;
        plan.add(CHECKPOINT[1], sizes[3].0, sizes[3].1)?;
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
    /// The recurrent state as it was at `ckpt_pos` (empty unless planned).
    ckpt_conv: &'a mut [f32],
    ckpt_ssm: &'a mut [f32],
    /// Where the last [`Session::checkpoint`] was taken in this sequence.
    ckpt_pos: Option<usize>,
    tiled_batches: bool,
    delta_chunked: bool,
    n_logits: usize,
    n_past: usize,
    /// Reference kernels only: the first op of this sequence that wrote a non-finite value.
    non_finite: Option<NonFinite>,
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
            ckpt_conv: match plan.region(CHECKPOINT[0]) {
                Some(reg) => carver.f32s(reg),
                None => &mut [],
            },
            ckpt_ssm: match plan.region(CHECKPOINT[1]) {
                Some(reg) => carver.f32s(reg),
                None => &mut [],
            },
            ckpt_pos: None,
            tiled_batches: false,
            delta_chunked: false,
            n_logits: 0,
            n_past: 0,
            non_finite: None,
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

    /// True when a token's logits do not depend on the batch it is evaluated in (neither
    /// [`Session::set_llama_cpp_batches`] nor [`Session::set_delta_net_chunked`] is on).
    pub fn batch_invariant(&self) -> bool {
        !self.tiled_batches && !self.delta_chunked
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
        if self.ckpt_pos.is_some_and(|c| c > self.n_past) || self.n_past == 0 {
            self.ckpt_pos = None;
        }
        Ok(())
    }

    /// Remembers the sequence as it is now, so that [`Session::rewind`] can come back
    /// to any length from here on. The KV cache needs no copy (positions past a rewind
    /// are simply written again); the recurrent state of a model with delta-net layers is
    /// copied into the checkpoint regions, which the arena must have been planned with
    /// ([`plan_session_with`]), else this is an error.
    pub fn checkpoint(&mut self) -> Result<(), Error> {
        if !self.ssm_state.is_empty() {
            if self.ckpt_ssm.len() != self.ssm_state.len() || self.ckpt_conv.len() != self.conv_state.len() {
                return Err(Error::BadConfig("a model with recurrent layers needs checkpoint space to rewind; plan the session with a checkpoint (plan_session_with)"));
            }
            if self.seq_layers.is_some() {
                return Err(Error::BadConfig("a model with recurrent layers whose layers run whole on a device cannot rewind: its state is on the device"));
            }
            self.ckpt_conv.copy_from_slice(self.conv_state);
            self.ckpt_ssm.copy_from_slice(self.ssm_state);
        }
        self.ckpt_pos = Some(self.n_past);
        Ok(())
    }

    /// Forgets the context after the first `n` tokens, where `n` is at least the
    /// position of the last [`Session::checkpoint`]. Returns the length the context now
    /// has: `n` for a model with only attention layers; for one with recurrent layers the
    /// checkpoint's position (its state is restored to the checkpoint), and the caller
    /// evaluates the tokens from there to `n` again (with keel's batch-invariant logits
    /// this recomputes the very same state). A batch evaluated since the checkpoint must
    /// not have been longer than `n_batch` (a sliding-window cache keeps exactly that much
    /// beyond its window).
    pub fn rewind(&mut self, n: usize) -> Result<usize, Error> {
        if n > self.n_past {
            return Err(Error::BadConfig("rewind past the end of the context"));
        }
        if n == self.n_past {
            return Ok(n);
        }
        if n == 0 {
            self.truncate(0)?;
            return Ok(0);
        }
        let Some(c) = self.ckpt_pos.filter(|&c| c <= n) else {
            return Err(Error::BadConfig("rewind before the last checkpoint"));
        };
        self.n_logits = 0;
        if self.ssm_state.is_empty() {
            self.n_past = n;
            return Ok(n);
        }
        self.conv_state.copy_from_slice(self.ckpt_conv);
        self.ssm_state.copy_from_slice(self.ckpt_ssm);
        self.n_past = c;
        Ok(c)
    }

    /// With the reference kernels ([`Kernels::is_reference`]), every op's output is
    /// checked as it is computed on the CPU: this is the first op of the current sequence
    /// that produced a NaN or an infinity, if any (so an error about non-finite logits
    /// can name where they came from). Always `None` with other kernels, which skip the
    /// check.
    pub fn first_non_finite(&self) -> Option<NonFinite> {
        self.non_finite
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
        // Chunks as a pipeline when there are several and the first layers run whole on a
        // device that takes nothing else (reference mode checks every op in order: not
        // there). A one-chunk eval (every decode step) does not look.
        let stage0 = match exec.as_deref() {
            Some(e) if tokens.len() > self.cfg.n_batch && !self.kernels.is_reference() => first_stage(model, e.placement),
            _ => None,
        };
        let mut ahead = false;
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
            let next = &tokens[done + n..(done + n + self.cfg.n_batch).min(tokens.len())];
            let pipe = Pipe { stage0, next };
            if let Err(err) = self.forward(model, chunk, out_rows, par, exec.as_deref_mut(), pipe, &mut ahead) {
                // Nothing stays in flight behind an error.
                if let (true, Some((dev, _)), Some(e)) = (ahead, stage0, exec.as_deref_mut()) {
                    let _ = e.offload.layers_end(dev, &mut self.xn[..]);
                }
                return Err(err);
            }
            done += n;
        }
        Ok(())
    }

    /// One forward pass over `n <= n_batch` tokens; logits for the last `out_rows` of them
    /// are appended after the rows already produced by this `eval`. With a first stage
    /// ([`Pipe::stage0`]): `ahead` on entry says that stage already runs for these tokens
    /// (begun by the call before), and on return whether it runs for `pipe.next`, begun
    /// once these tokens are through it and before their other stages.
    #[allow(clippy::too_many_arguments)]
    fn forward(&mut self, model: &Model<'_>, tokens: &[u32], out_rows: usize, par: &dyn Parallel, exec: Option<&mut Exec<'_, '_>>, pipe: Pipe<'_>, ahead: &mut bool) -> Result<(), Error> {
        let hp = &model.hp;
        let n = tokens.len();
        let e = hp.n_embd;
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
            self.non_finite = None;
        }
        // Reference mode names the first op that produced a NaN or an infinity.
        let check = kern.is_reference();
        let non_finite = &mut self.non_finite;
        let mut note = |row: Option<usize>, layer: Option<usize>, op: &'static str| {
            if let Some(row) = row.filter(|_| non_finite.is_none()) {
                *non_finite = Some(NonFinite { layer, op, pos: n_past + row });
            }
        };

        // Token embedding rows -> x (n, n_embd), scaled for Gemma; unless the first stage
        // already has them.
        if !*ahead {
            embed(model, &kern, tokens, x);
            if check {
                note(block_cpu::first_non_finite_row(x, n, e), None, "token_embd");
            }
        }
        let mut on_device_until = 0;
        if let (Some((dev, a)), Some(off)) = (pipe.stage0, act.offload.as_deref_mut()) {
            // The first stage for these tokens: collected if begun, else run now.
            let r = if core::mem::take(ahead) { off.layers_end(dev, &mut x[..n * e]) } else { off.layers(dev, 0..a, &mut x[..n * e], n, n_past) };
            r.map_err(|_| Error::Device { device: dev })?;
            // The next chunk's first stage runs on the device while the rest of these
            // tokens' stages run here; its inputs go out now, so `xn` is free again.
            if !pipe.next.is_empty() {
                let m = pipe.next.len();
                embed(model, &kern, pipe.next, xn);
                *ahead = off.layers_begin(dev, 0..a, &xn[..m * e], m, n_past + n).map_err(|_| Error::Device { device: dev })?;
            }
            on_device_until = usize::from(a);
        }

        let nvh = hp.ssm.map_or(0, |s| s.n_v_heads);
        let (beta, alpha) = gdn_ab.split_at_mut((n * nvh).min(gdn_ab.len()));
        let mut bufs = Bufs {
            x: &mut x[..],
            xn: &mut xn[..],
            q: &mut q[..],
            k: &mut k[..],
            v: &mut v[..],
            gate: &mut gate[..],
            attn: &mut attn[..],
            ffn_a: &mut ffn_a[..],
            ffn_b: &mut ffn_b[..],
            beta,
            alpha,
            conv: &mut conv_out[..],
            rope: &mut rope[..],
            rope_of: None,
            attn_scratch: &mut attn_scratch[..],
            gdn_scratch: &mut gdn_scratch[..],
            tile: if tiled { Some(&mut attn_tile[..]) } else { None },
        };
        let (mut kv_row0, mut recr) = (0usize, 0usize);
        // Where the rows that give logits start in x (moved to the front when the last
        // layer leaves the others out).
        let mut x_first = n - out_rows;
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
                        Some(off) => off.layers(dev, l as u16..l1 as u16, &mut bufs.x[..n * e], n, n_past).is_ok(),
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
            // The layer's state: its rows of the KV cache, or its recurrent state.
            let mut state = match &layer.mixer {
                Mixer::Attention(_) => {
                    let rows = hp.kv_rows(l, n_ctx, n_batch);
                    let c = Cache { kv_k: &mut kv_k[kv_row0 * hp.k_dim()..(kv_row0 + rows) * hp.k_dim()], kv_v: &mut kv_v[kv_row0 * hp.v_dim()..(kv_row0 + rows) * hp.v_dim()], rows, n_past, window: 0 };
                    kv_row0 += rows;
                    LayerState::Attention(c)
                }
                Mixer::DeltaNet(_) => {
                    let Some(s) = hp.ssm else { return Err(Error::BadConfig("a delta-net layer without ssm parameters")) };
                    let st = DeltaState { conv: &mut conv_state[recr * s.conv_state_len()..(recr + 1) * s.conv_state_len()], ssm: &mut ssm_state[recr * s.state_len()..(recr + 1) * s.state_len()] };
                    recr += 1;
                    LayerState::DeltaNet(st)
                }
            };
            if let (1, LayerState::Attention(c)) = (n, &state) {
                block_cpu::prefetch_cache(c, hp);
            }
            // The block's ops, in order (`block::layer_ops`: the one description of it).
            let mut step = Step { hp, layer, l, n, n_tasks, chunked, par };
            // The last layer's rows that no output reads: once its keys and values are in
            // the cache, only the rows that give logits go on (none in a chunk without
            // them; a delta-net layer stores none, so keeps every row). Every row's bits
            // are its own in keel's batch arithmetic, so those rows come out the same; not
            // with llama.cpp's (its tiled attention depends on the batch), nor in reference
            // mode (which checks every row of every op).
            let prune = l + 1 == model.layers.len() && out_rows < n && !self_tiled_mode && !check;
            let mut prev: Option<Op> = None;
            let ops = block::layer_ops(hp, l, layer);
            let mut j = 0;
            while j < ops.len() {
                // Products of one input in a row (q, k, v; gate, up) quantize it once, and
                // for one token run as one parallel job where they can.
                if let Op::MatMul { src, .. } = ops[j] {
                    if !matches!(prev, Some(Op::MatMul { src: s0, .. }) if s0 == src) {
                        act.invalidate();
                    }
                }
                let g = block_cpu::run_products(&ops[j..], &step, &mut bufs, &mut act);
                let run = if g > 0 {
                    &ops[j..j + g]
                } else {
                    block_cpu::run(ops[j], &step, &mut bufs, &mut state, &mut act);
                    &ops[j..j + 1]
                };
                for &op in run {
                    if check && act.failed.is_none() {
                        note(block_cpu::wrote_non_finite(op, &step, &mut bufs), Some(l), op.label());
                    }
                    prev = Some(op);
                }
                j += run.len();
                if let (true, LayerState::Attention(c)) = (prune && run.contains(&Op::KvStore), &mut state) {
                    if out_rows == 0 {
                        break;
                    }
                    block_cpu::keep_last_rows(hp, &mut bufs, c, n, out_rows);
                    step = Step { n: out_rows, ..step };
                    x_first = 0;
                }
            }
        }
        let Bufs { x, xn, .. } = bufs;
        self.n_past += n;

        if out_rows > 0 {
            // Final norm of the rows that produce logits, then the output projection.
            let first = n - out_rows;
            for j in 0..out_rows {
                let i = x_first + j;
                ops::rms_norm(&x[i * e..(i + 1) * e], model.output_norm.data, hp.rms_eps, &mut xn[j * e..(j + 1) * e]);
            }
            let v = hp.n_vocab;
            let base = self.n_logits * v;
            act.invalidate();
            act.layer = OUTPUT_LAYER;
            act.project(par, WeightKind::Output, &model.output, &xn[..out_rows * e], out_rows, &mut logits[base..base + out_rows * v]);
            if check {
                note(block_cpu::first_non_finite_row(xn, out_rows, e).map(|j| first + j), None, "output_norm");
                note(block_cpu::first_non_finite_row(&logits[base..], out_rows, v).map(|j| first + j), None, "output");
            }
            self.n_logits += out_rows;
        }
        match act.failed {
            Some(device) => Err(Error::Device { device }),
            None => Ok(()),
        }
    }
}

/// How one chunk of an `eval` takes part in a pipeline of chunks.
#[derive(Clone, Copy)]
struct Pipe<'t> {
    /// The first stage: layers `0..a` whole on device `dev`, which runs nothing else.
    stage0: Option<(u8, u16)>,
    /// The next chunk's tokens (empty: this is the last chunk).
    next: &'t [u32],
}

/// The first stage of a pipeline of chunks, if `placement` has one: layers `0..a` run
/// whole on one device that holds nothing after them (no later layer, product or output
/// projection; so between beginning a chunk there and collecting it, it gets no other
/// call), while later stages (another device's layers, the CPU's layers or its output
/// projection) run elsewhere.
fn first_stage(model: &Model<'_>, placement: &Placement<'_>) -> Option<(u8, u16)> {
    let dev = placement.layer_device(0)?;
    let a = (0..model.layers.len()).find(|&l| placement.layer_device(l) != Some(dev)).unwrap_or(model.layers.len());
    let later = |layer: u16| layer == OUTPUT_LAYER || usize::from(layer) >= a;
    if placement.decisions().iter().any(|d| d.place == Where::Device(dev) && later(d.id.layer)) {
        return None;
    }
    Some((dev, u16::try_from(a).ok()?))
}

/// Token embedding rows of `tokens` -> `x` (`n × n_embd`), scaled for Gemma.
fn embed(model: &Model<'_>, kern: &Kernels, tokens: &[u32], x: &mut [f32]) {
    let e = model.hp.n_embd;
    for (i, &t) in tokens.iter().enumerate() {
        let row = &mut x[i * e..(i + 1) * e];
        let _ = model.tok_embd.dequantize_row(kern, t as usize, row);
        if model.hp.embd_scale != 1.0 {
            ops::scale(row, model.hp.embd_scale);
        }
    }
}

//! keel's INT8 GEMM `Y[M,N] = X[M,K]·W[K,N]` on the RK3588 NPU as 1×1 convolutions.
//!
//! The input is posed as NHWC 1×1×M×K (M rows in the NPU's height, which tasks split).
//! Unlike Mesa, which declares all weights in one task even when they exceed the
//! convolution buffer, keel tiles N so that every tile's weights stay resident (at most
//! 9 of the 12 banks, one spare): each tile is Mesa's convolution for `N_tile` outputs,
//! its rows split into tasks exactly as Mesa splits them, and all tasks are chained into
//! one job. Tile `t` reads its weights from its own packed block, its biases at `4·n0`
//! and writes the output's 16-channel groups from `n0/16` on (`n0` a multiple of 32), so
//! the output buffer is the whole `[ceil(N/16)][M][16]` result.

use super::conv::{self, Addrs, Conv, Quant, Tail, Task, CBUF_BANKS, TASK_ENTRIES, TASK_STRIDE};
use super::pack;

/// One N tile: first output channel and width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tile {
    /// First output channel (a multiple of 32).
    pub n0: u32,
    /// Output channels in this tile.
    pub n: u32,
    /// Byte offset of the tile's packed weights in the weight buffer.
    pub weights_at: u32,
    /// Index of its first task.
    pub first_task: usize,
}

/// A planned GEMM.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Rows, inner dimension, outputs.
    pub m: u32,
    /// K.
    pub k: u32,
    /// N.
    pub n: u32,
    /// The N tiles.
    pub tiles: Vec<Tile>,
    /// Every task, in submission order (one job).
    pub tasks: Vec<Task>,
    /// Buffer sizes: packed weights, biases, input, output, regcmd.
    pub weights_len: usize,
    /// Bias len.
    pub bias_len: usize,
    /// Input len.
    pub input_len: usize,
    /// Output len.
    pub output_len: usize,
    /// Regcmd len.
    pub regcmd_len: usize,
}

/// The widest tile (a multiple of 32 outputs) whose `k`-deep weights stay resident.
pub fn tile_width(k: u32, n: u32) -> Result<u32, String> {
    let mut t = n.div_ceil(32) * 32;
    while t > 32 && conv::weight_banks(k, t) + 1 >= CBUF_BANKS {
        t -= 32;
    }
    if conv::weight_banks(k, t.min(n.max(1))) + 1 >= CBUF_BANKS {
        return Err(format!("k={k}: even 32 output channels of weights ({} KiB) do not fit the convolution buffer beside one input bank", k * 32 / 1024));
    }
    Ok(t)
}

/// Plans `Y[M,N] = X[M,K]·W[K,N]` with buffers at `base` (Mesa's int8 output).
pub fn plan(m: u32, k: u32, n: u32, q: Quant, base: &Addrs) -> Result<Plan, String> {
    plan_out(m, k, n, q, base, false)
}

/// Bytes of the int32 output of `m` rows and `n` outputs: `[ceil(N/4)][M][4]` int32.
pub fn output32_len(m: u32, n: u32) -> usize {
    16 * (n.div_ceil(4) * m) as usize
}

/// Where output `(row, channel)` of the int32 output lies: byte offset of its int32.
pub fn output32_at(m: u32, row: u32, ch: u32) -> usize {
    16 * ((ch / 4) * m + row) as usize + 4 * (ch % 4) as usize
}

/// [`plan`], in keel's int32 mode when `out32` ([`super::conv::Task::out32`]): every tile
/// writes its raw int32 sums at `4·n0·m` in the `[ceil(N/4)][M][4]` output, no bias.
pub fn plan_out(m: u32, k: u32, n: u32, q: Quant, base: &Addrs, out32: bool) -> Result<Plan, String> {
    if m == 0 || n == 0 {
        return Err(format!("empty GEMM m={m} n={n}"));
    }
    let width = tile_width(k, n)?;
    let mut tiles = Vec::new();
    let mut tasks: Vec<Task> = Vec::new();
    let mut weights_at = 0u32;
    let mut n0 = 0;
    while n0 < n {
        let nt = width.min(n - n0);
        let c = Conv { h: 1, w: m, k, n: nt, q, out32 };
        let a = Addrs {
            input: base.input,
            weights: base.weights + weights_at,
            output: base.output + if out32 { 4 * n0 * m } else { n0 * m },
            bias: base.bias + 4 * n0,
            regcmd: base.regcmd,
        };
        tiles.push(Tile { n0, n: nt, weights_at, first_task: tasks.len() });
        tasks.extend(conv::plan_with(&c, &a, conv::MAX_ROWS)?);
        weights_at += pack::weights_packed_len(k, nt) as u32;
        n0 += nt;
    }
    let count = tasks.len();
    let amount = ((TASK_ENTRIES as u32 - 4) / 2).div_ceil(2) * 2;
    for (i, t) in tasks.iter_mut().enumerate() {
        t.tail = if count == 1 {
            Tail::Single
        } else if i + 1 < count {
            Tail::Chain { next: base.regcmd + TASK_STRIDE * (i as u32 + 1), amount }
        } else {
            Tail::Chain { next: 0, amount: 0 }
        };
    }
    Ok(Plan {
        m,
        k,
        n,
        tiles,
        tasks,
        weights_len: weights_at as usize,
        bias_len: 4 * n as usize,
        input_len: pack::input_len(1, m, k),
        output_len: if out32 { output32_len(m, n) } else { pack::output_len(1, m, n) },
        regcmd_len: TASK_STRIDE as usize * count,
    })
}

/// Packs `W` given as `w[n][k]` (raw bytes, one row per output channel) tile by tile.
pub fn pack_weights(p: &Plan, w: &[u8], w_zp: i32) -> Result<Vec<u8>, String> {
    let ku = p.k as usize;
    if w.len() != ku * p.n as usize {
        return Err(format!("weights: {} bytes, {}x{} needs {}", w.len(), p.n, p.k, ku * p.n as usize));
    }
    let mut out = Vec::with_capacity(p.weights_len);
    for t in &p.tiles {
        let rows = &w[t.n0 as usize * ku..(t.n0 + t.n) as usize * ku];
        let packed = pack::weights(rows, p.k, t.n, w_zp)?;
        out.extend_from_slice(&packed[..pack::weights_packed_len(p.k, t.n)]);
    }
    Ok(out)
}

/// The regcmd buffer: every task's stream at its [`TASK_STRIDE`] slot.
pub fn regcmd_buffer(p: &Plan) -> Vec<u8> {
    let mut out = vec![0u8; p.regcmd_len];
    for (i, t) in p.tasks.iter().enumerate() {
        let s = super::regcmd::to_bytes(&conv::encode(t));
        let at = i * TASK_STRIDE as usize;
        out[at..at + s.len()].copy_from_slice(&s);
    }
    out
}

//! The command stream of a quantized 1×1 convolution (GEMM) on the RK3588 NPU: task
//! planning (how the convolution buffer is shared and the rows are split into tasks), the
//! register values of each task ([`Task`]), their encoding into a 130-entry regcmd stream
//! ([`encode`]) and the inverse ([`decode`]).
//!
//! Where keel runs the configuration Mesa's rocket driver uses (a per-tensor int8/uint8
//! 1×1 convolution with int8 output requantized by the DPU), the values and their order are
//! Mesa 26.2.6's, checked entry for entry against its captures (tests/golden/rocket). The
//! rules below are written from the register semantics and from how Mesa derives each
//! field (facts, no code copied):
//!
//! - The NPU's data *width* is NHWC H and its *height* NHWC W; tasks split the height.
//! - The convolution buffer (CBUF) has 12 banks of 256 entries of 128 bytes. Weights take
//!   `ceil(bytes/128/256) + 1` banks; if that leaves a spare bank they stay resident and
//!   later tasks set `WEIGHT_REUSE`; otherwise data gets 7 banks and weights 5.
//! - A row of input takes `entries_per_row` CBUF entries (16-byte atoms, 8 per entry).
//!
//! Owns: the values of the registers. Not: buffer contents ([`super::pack`]) or files.

use super::regcmd::{self, entry, ENABLE, PC_BASE_ADDRESS, PC_REGISTER_AMOUNTS, PRE_ENABLE};

/// CBUF banks per core.
pub const CBUF_BANKS: u32 = 12;
/// Entries per bank.
pub const CBUF_ENTRIES_PER_BANK: u32 = 256;
/// Bytes per entry.
pub const CBUF_ENTRY_BYTES: u32 = 128;
/// Entries in every task's stream (tail included).
pub const TASK_ENTRIES: usize = 130;
/// Bytes between consecutive task streams in the regcmd buffer (64-byte aligned).
pub const TASK_STRIDE: u32 = ((TASK_ENTRIES as u32 * 8) + 63) / 64 * 64;

fn div_up(a: u32, b: u32) -> u32 {
    a.div_ceil(b)
}
fn align(a: u32, b: u32) -> u32 {
    div_up(a, b) * b
}

/// Per-tensor quantization of the convolution, as the model states it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quant {
    /// Input zero point (TFLite's value: −128 for the int8 default).
    pub in_zp: i32,
    /// Weight zero point.
    pub w_zp: i32,
    /// Output zero point.
    pub out_zp: i32,
    /// Input scale.
    pub in_scale: f32,
    /// Weight scale.
    pub w_scale: f32,
    /// Output scale.
    pub out_scale: f32,
}

/// A 1×1, stride-1, unpadded convolution: NHWC input 1×`h`×`w`×`k`, `n` outputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conv {
    /// NHWC H (the NPU's data width).
    pub h: u32,
    /// NHWC W (the NPU's data height; tasks split it).
    pub w: u32,
    /// Input channels.
    pub k: u32,
    /// Output channels.
    pub n: u32,
    /// Quantization.
    pub q: Quant,
    /// keel's int32 mode ([`Task::out32`]): raw int32 sums out, the DPU's stages bypassed.
    pub out32: bool,
}

/// NPU addresses of the buffers one convolution uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Addrs {
    /// Input (packed activations).
    pub input: u32,
    /// Packed weights.
    pub weights: u32,
    /// Output.
    pub output: u32,
    /// Biases (int32 per output channel).
    pub bias: u32,
    /// The regcmd buffer holding this convolution's task streams, one per [`TASK_STRIDE`].
    pub regcmd: u32,
}

/// How a task's stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    /// The only task of its operation: a plain zero entry where the next address goes.
    Single,
    /// One of a chain: the next task's stream address and how many entries to fetch (0, 0
    /// on the last).
    Chain {
        /// NPU address of the next stream (0 on the last).
        next: u32,
        /// Entries of the next stream to fetch (0 on the last).
        amount: u32,
    },
}

/// Every value a task's stream carries, in the register semantics' own terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Task {
    /// CBUF banks for input data / for weights; weights kept from the previous task.
    pub data_banks: u32,
    /// Weight banks.
    pub weight_banks: u32,
    /// Weight reuse.
    pub weight_reuse: bool,
    /// Data width (NHWC H), this task's rows (NHWC W) and the whole operation's rows.
    pub width: u32,
    /// Rows.
    pub rows: u32,
    /// All rows.
    pub all_rows: u32,
    /// Input channels: padded to 16, and as given.
    pub channels: u32,
    /// Channels real.
    pub channels_real: u32,
    /// Weight kernels (N rounded up to 2), output channels padded to 32 and as given.
    pub kernels: u32,
    /// Out channels.
    pub out_channels: u32,
    /// Out channels real.
    pub out_channels_real: u32,
    /// CBUF entries of one input line.
    pub data_entries: u32,
    /// Buffer addresses (input and output already offset to this task's rows).
    pub input_addr: u32,
    /// Weights addr.
    pub weights_addr: u32,
    /// Output addr.
    pub output_addr: u32,
    /// Bias addr.
    pub bias_addr: u32,
    /// `CNA_PAD_CON1`: the input zero point in the NPU's signed view.
    pub pad_value: u32,
    /// `CORE_CLIP_TRUNCATE`.
    pub truncate: u32,
    /// `DPU_BS_OW_OP`: 0x80 minus the weight zero point.
    pub ow_op: u32,
    /// `DPU_OUT_CVT_OFFSET`, `_SCALE`, `_SHIFT`: output requantization.
    pub out_offset: u32,
    /// Out scale.
    pub out_scale: u32,
    /// Out shift.
    pub out_shift: u32,
    /// keel's int32 mode instead of Mesa's int8 output: the DPU writes each output's raw
    /// int32 sum (BS/BN/EW stages and the output converter bypassed, no bias read) as
    /// `[ceil(N/4)][rows][4]` int32; the scales are applied on the CPU. See [`OUT32_REGISTERS`].
    pub out32: bool,
    /// The stream's end.
    pub tail: Tail,
}

/// The registers whose values keel's int32 mode ([`Task::out32`]) sets differently from
/// Mesa's int8 configuration, with the value and why (register semantics; no board has run
/// this mode yet):
pub const OUT32_REGISTERS: [(u16, &str, &str); 11] = [
    (0x4010, "0x80000000", "DPU_DATA_FORMAT: OUT_PRECISION (bits 31:29) = 4, int32; IN/PROC_PRECISION stay int8 (0); MC_SURF_OUT (bit 3) = 0: one 16-byte surface per pixel, 4 int32 channels per atom"),
    (0x4040, "0x00000053", "DPU_BS_CFG: the whole BS stage bypassed (BS, ALU, MUL and ReLU bypass bits 0, 1, 4, 6): no bias is added, the sum passes unchanged"),
    (0x4050, "0x000007fe", "DPU_BS_OW_CFG: SIZE_E_0..2 (bits 4:2, 7:5, 10:8) = 7 for 4-byte elements (Mesa: 1); OD_BYPASS (bit 1) set: the output converter is skipped"),
    (0x4054, "0", "DPU_BS_OW_OP: no weight zero-point correction (keel's weights are symmetric)"),
    (0x4080, "0", "DPU_OUT_CVT_OFFSET: identity conversion (no output zero point)"),
    (0x4084, "1", "DPU_OUT_CVT_SCALE: identity (the scales are keel's per-token × per-channel floats, applied on the CPU)"),
    (0x4088, "0", "DPU_OUT_CVT_SHIFT: identity"),
    (0x40C0, "rows·width·8 << 4", "DPU_SURFACE_ADD: the task's own rows × width × 8 (Mesa: all rows × 2), the int32 writer's surface step"),
    (0x301C, "0", "CORE_CLIP_TRUNCATE: no truncation of the accumulator (every bit of the sum is kept)"),
    (0x501C, "1", "DPU_RDMA_RDMA_BRDMA_CFG: bias reads disabled (Mesa: 2, read the bias)"),
    (0x5020, "0", "DPU_RDMA_RDMA_BS_BASE_ADDR: no bias buffer"),
];

/// Weight scales (f32 bit patterns) for which Mesa 26.2.6 truncates the accumulator by one
/// bit (`CORE_CLIP_TRUNCATE` = 1, biases halved). An observed list, not a rule; kept so
/// keel's streams equal Mesa's for those models too.
const TRUNCATE_SCALES: [u32; 15] = [
    0x3a88323f, 0x3c0060de, 0x3c06022d, 0x3c1642e3, 0x3c1e3f51, 0x3c5c8aa8, 0x3c615e93, 0x3c7326a2, 0x3c783013, 0x3d1748e6,
    0x3d282992, 0x3d2e87ae, 0x3d77f5f6, 0x3a9a5956, 0x3caebc56,
];

/// Truncation bits of the accumulator for this weight scale.
pub fn truncate_bits(w_scale: f32) -> u32 {
    u32::from(TRUNCATE_SCALES.contains(&w_scale.to_bits()))
}

/// `(scale, shift register value)` of the DPU's output conversion for a real multiplier
/// `m = in_scale·w_scale/out_scale`: a 15-bit mantissa (rounded up, top bit forced) and a
/// right shift from the exponent.
pub fn out_cvt(m: f32, truncate: u32) -> (u32, u32) {
    let bits = m.to_bits();
    let mut shift = (127 + 31 - 32 + 16u32).wrapping_sub(bits >> 23);
    if truncate > 0 {
        shift = shift.wrapping_sub(1);
    }
    let mut scale = ((bits >> 9) & 0x7fff) + 1;
    if scale < 1 << 14 {
        scale |= 1 << 14;
    }
    (scale, shift.wrapping_sub(1))
}

/// CBUF entries one row (one NPU height step) of input takes.
fn entries_per_row(c: &Conv) -> u32 {
    let atomics = div_up(c.k, 16);
    let last = atomics % 8;
    let whole = (atomics / 8) * c.h;
    let part = if last == 3 { c.h } else { div_up(last * c.h, 8) };
    whole + part
}

/// CBUF banks the weights of `k × n` int8 need (one spare included).
pub fn weight_banks(k: u32, n: u32) -> u32 {
    div_up(div_up(k * n, CBUF_ENTRY_BYTES), CBUF_ENTRIES_PER_BANK) + 1
}

/// Errors of planning: the shape the hardware or this generator cannot take.
pub fn check(c: &Conv) -> Result<(), String> {
    if c.k < 2 || c.n < 1 || c.h < 1 || c.w < 1 {
        return Err(format!("unsupported shape h={} w={} k={} n={}: keel's generator needs k >= 2 and non-empty dimensions", c.h, c.w, c.k, c.n));
    }
    if c.h > 2047 {
        return Err(format!("h={} exceeds the 11-bit DATAIN_WIDTH (2047); put the rows in w", c.h));
    }
    if c.k > 0xffff || c.n > 0x3fff {
        return Err(format!("k={} or n={} exceeds the register fields (k <= 65535, n <= 16383)", c.k, c.n));
    }
    Ok(())
}

/// The tasks of one convolution exactly as Mesa 26.2.6 splits it, with buffer addresses
/// `a`. Mesa puts up to 2560 rows in one task although `DATAIN_HEIGHT` has 11 bits (the
/// stream then carries the row count modulo 2048, as captured); [`wraps`] says when.
pub fn plan(c: &Conv, a: &Addrs) -> Result<Vec<Task>, String> {
    plan_with(c, a, u32::MAX)
}

/// Whether a task's row count overflows the 11-bit height fields.
pub fn wraps(t: &Task) -> bool {
    t.rows > MAX_ROWS
}

/// The most rows the 11-bit height fields hold.
pub const MAX_ROWS: u32 = 2047;

/// [`plan`] with at most `max_rows` rows per task (keel passes [`MAX_ROWS`]).
pub fn plan_with(c: &Conv, a: &Addrs, max_rows: u32) -> Result<Vec<Task>, String> {
    check(c)?;
    let per_row = entries_per_row(c);
    let need_data = div_up(per_row * c.w, CBUF_ENTRIES_PER_BANK);
    let need_w = weight_banks(c.k, c.n);
    let reuse = need_w + 1 < CBUF_BANKS;
    let (avail_data, avail_w) = if reuse { (CBUF_BANKS - need_w, need_w) } else { (7, 5) };
    // (first row, rows, data banks, weight banks)
    let mut spans: Vec<(u32, u32, u32, u32)> = Vec::new();
    if need_data <= avail_data && c.w <= max_rows {
        spans.push((0, c.w, need_data, CBUF_BANKS - need_data));
    } else {
        let rows = (CBUF_ENTRIES_PER_BANK * avail_data / per_row).min(max_rows);
        if rows == 0 {
            return Err(format!("one input row of k={} h={} does not fit the {avail_data} data banks left beside the weights", c.k, c.h));
        }
        let mut top = 0;
        while top < c.w {
            let r = rows.min(c.w - top);
            spans.push((top, r, avail_data, avail_w));
            top += r;
        }
    }
    let t = if c.out32 { 0 } else { truncate_bits(c.q.w_scale) };
    let m = (c.q.in_scale * c.q.w_scale) / c.q.out_scale;
    let (out_scale, out_shift) = if c.out32 { (1, 0) } else { out_cvt(m, t) };
    let zp = |z: i32| u32::from(z as u8);
    let count = spans.len();
    let amount = align((TASK_ENTRIES as u32 - 4) / 2, 2);
    Ok(spans
        .iter()
        .enumerate()
        .map(|(i, &(top, rows, data_banks, weight_banks))| Task {
            data_banks,
            weight_banks,
            weight_reuse: i > 0 && reuse,
            width: c.h,
            rows,
            all_rows: c.w,
            channels: align(c.k.max(16), 16),
            channels_real: c.k,
            kernels: align(c.n, 2),
            out_channels: align(c.n.max(32), 32),
            out_channels_real: c.n,
            data_entries: div_up(c.h * 2 * div_up(c.k, 16), 8),
            input_addr: a.input.wrapping_add(16 * c.h * top),
            weights_addr: a.weights,
            output_addr: a.output.wrapping_add(16 * c.h * top),
            bias_addr: if c.out32 { 0 } else { a.bias },
            pad_value: zp(c.q.in_zp).wrapping_sub(0x80),
            truncate: t,
            ow_op: if c.out32 { 0 } else { 0x80u32.wrapping_sub(zp(c.q.w_zp)) & 0xffff },
            out_offset: if c.out32 { 0 } else { zp(c.q.out_zp).wrapping_sub(0x80) },
            out32: c.out32,
            out_scale,
            out_shift,
            tail: if count == 1 {
                Tail::Single
            } else if i + 1 < count {
                Tail::Chain { next: a.regcmd.wrapping_add(TASK_STRIDE * (i as u32 + 1)), amount }
            } else {
                Tail::Chain { next: 0, amount: 0 }
            },
        })
        .collect())
}

/// `DPU_DATA_FORMAT` of the int32 mode: OUT_PRECISION int32 (4 << 29).
pub const OUT32_FORMAT: u32 = 4 << 29;
/// `DPU_BS_OW_CFG` of the int32 mode: SIZE_E_0..2 = 7, OD_BYPASS.
pub const OUT32_OW_CFG: u32 = (7 << 8) | (7 << 5) | (7 << 2) | (1 << 1);

/// The 130-entry stream of one task.
pub fn encode(t: &Task) -> Vec<u64> {
    let cbuf0 = (u32::from(t.weight_reuse) << 13) | (t.weight_banks << 4) | t.data_banks;
    let atomics = t.width * t.rows;
    let surf = t.width * t.all_rows;
    let mut e: Vec<u64> = Vec::with_capacity(TASK_ENTRIES);
    let mut r = |reg: u16, v: u32| e.push(entry(reg, v));
    r(0x1040, cbuf0); // CNA_CBUF_CON0
    r(0x1104, 0); // CNA_DCOMP_REGNUM
    r(0x1100, 0); // CNA_DCOMP_CTRL
    r(0x100C, 0); // CNA_CONV_CON1: direct convolution, aligned DMA
    r(0x4004, 0xe); // DPU_S_POINTER: ping-pong mode, executer and pointer ping-pong enabled
    r(0x5004, 0xe); // DPU_RDMA_RDMA_S_POINTER: the same
    r(0x100C, 0); // CNA_CONV_CON1 again
    r(0x1010, (50 + 1 + 1) << 4); // CNA_CONV_CON2: FEATURE_GRAINS = 50 + stride + 1
    r(0x1014, 1 | (1 << 3)); // CNA_CONV_CON3: x and y stride 1
    r(0x1020, (t.width << 16) | (t.rows & 0x7ff)); // CNA_DATA_SIZE0: width, height (11 bits)
    r(0x1024, ((t.channels_real - 1) << 16) | t.channels); // CNA_DATA_SIZE1
    r(0x1028, t.width); // CNA_DATA_SIZE2: output width
    r(0x102C, atomics); // CNA_DATA_SIZE3: output atomics
    r(0x1030, t.channels * t.kernels); // CNA_WEIGHT_SIZE0: all weight bytes
    r(0x1034, t.channels); // CNA_WEIGHT_SIZE1: bytes per kernel
    r(0x1038, (1 << 24) | (1 << 16) | t.kernels); // CNA_WEIGHT_SIZE2: 1×1 kernels
    r(0x1040, cbuf0); // CNA_CBUF_CON0 again
    r(0x1044, t.data_entries); // CNA_CBUF_CON1
    r(0x104C, 0xb); // CNA_CVT_CON0: input conversion bypassed, signed data
    for reg in [0x1050, 0x1054, 0x1058, 0x105C] {
        r(reg, 1 << 16); // CNA_CVT_CON1..4: scale 1, offset 0
    }
    r(0x1060, 0); // CNA_FC_CON0
    r(0x1064, 0); // CNA_FC_CON1
    r(0x1068, 0); // CNA_PAD_CON0: no padding
    r(0x1070, t.input_addr); // CNA_FEATURE_DATA_ADDR
    r(0x1074, 0); // CNA_FC_CON2
    r(0x1078, 0x000f_000f); // CNA_DMA_CON0: weight and data burst length 15
    r(0x107C, 4 * t.width); // CNA_DMA_CON1: line stride (16-byte atoms / 4)
    r(0x1080, (t.width * t.all_rows).wrapping_sub(4 * t.width) & 0x0fff_ffff); // CNA_DMA_CON2: surface stride
    r(0x1084, (t.width << 16) | (t.rows & 0x7ff)); // CNA_FC_DATA_SIZE0: DMA width, height (11 bits)
    r(0x1088, t.channels); // CNA_FC_DATA_SIZE1: DMA channels
    r(0x1100, 0); // CNA_DCOMP_CTRL: weights not compressed
    r(0x1104, 0); // CNA_DCOMP_REGNUM
    r(0x1110, t.weights_addr); // CNA_DCOMP_ADDR0
    for i in 0..16u16 {
        r(0x1140 + 4 * i, 0); // CNA_DCOMP_AMOUNT0..15
    }
    r(0x1180, 0); // CNA_CVT_CON5
    r(0x1184, t.pad_value); // CNA_PAD_CON1
    r(0x3010, 1); // CORE_MISC_CFG: QD_EN
    r(0x3014, ((t.rows - 1) << 16) | (t.width - 1)); // CORE_DATAOUT_SIZE_0
    r(0x3018, t.out_channels - 1); // CORE_DATAOUT_SIZE_1
    r(0x301C, t.truncate); // CORE_CLIP_TRUNCATE
    r(0x3030, 0); // (unnamed CORE register Mesa clears)
    r(0x400C, 0x1e4); // DPU_FEATURE_MODE_CFG: burst 15, output to memory
    r(0x4010, if t.out32 { OUT32_FORMAT } else { 0 }); // DPU_DATA_FORMAT
    r(0x4014, 0); // DPU_OFFSET_PEND
    r(0x4020, t.output_addr); // DPU_DST_BASE_ADDR
    r(0x4024, surf << 4); // DPU_DST_SURF_STRIDE
    r(0x4030, t.width - 1); // DPU_DATA_CUBE_WIDTH
    r(0x4034, t.rows - 1); // DPU_DATA_CUBE_HEIGHT
    r(0x4038, 0); // DPU_DATA_CUBE_NOTCH_ADDR
    r(0x403C, ((t.out_channels_real - 1) << 16) | (t.out_channels - 1)); // DPU_DATA_CUBE_CHANNEL
    r(0x4040, if t.out32 { 0x53 } else { 0x0002_0150 }); // DPU_BS_CFG: ALU adds the bias from memory; ReLU and multiplier bypassed (int32: all bypassed)
    r(0x4044, 0); // DPU_BS_ALU_CFG
    r(0x4048, 0); // DPU_BS_MUL_CFG
    r(0x404C, 0); // DPU_BS_RELUX_CMP_VALUE
    r(0x4050, if t.out32 { OUT32_OW_CFG } else { 0x124 }); // DPU_BS_OW_CFG: sizes 1 (int32: 7, output converter bypassed)
    r(0x4054, t.ow_op); // DPU_BS_OW_OP
    r(0x4058, t.out_channels - 1); // DPU_WDMA_SIZE_0
    r(0x405C, ((t.rows - 1) << 16) | (t.width - 1)); // DPU_WDMA_SIZE_1
    r(0x4060, 0x53); // DPU_BN_CFG: batch-norm stage bypassed
    r(0x4064, 0); // DPU_BN_ALU_CFG
    r(0x4068, 0); // DPU_BN_MUL_CFG
    r(0x406C, 0); // DPU_BN_RELUX_CMP_VALUE
    r(0x4070, 0x383); // DPU_EW_CFG: element-wise stage bypassed
    r(0x4074, 0); // DPU_EW_CVT_OFFSET_VALUE
    r(0x4078, 1); // DPU_EW_CVT_SCALE_VALUE
    r(0x407C, 0); // DPU_EW_RELUX_CMP_VALUE
    r(0x4080, t.out_offset); // DPU_OUT_CVT_OFFSET
    r(0x4084, t.out_scale); // DPU_OUT_CVT_SCALE
    r(0x4088, t.out_shift); // DPU_OUT_CVT_SHIFT
    for i in 0..8u16 {
        r(0x4090 + 4 * i, 0); // DPU_EW_OP_VALUE_0..7
    }
    r(0x40C0, if t.out32 { (atomics * 8) << 4 } else { (surf * 2) << 4 }); // DPU_SURFACE_ADD
    r(0x40C4, 0); // (unnamed DPU register Mesa clears)
    for i in 0..12u16 {
        r(0x4100 + 4 * i, 0); // DPU_LUT_*: no lookup table
    }
    r(0x500C, t.width - 1); // DPU_RDMA_RDMA_DATA_CUBE_WIDTH
    r(0x5010, t.rows - 1); // DPU_RDMA_RDMA_DATA_CUBE_HEIGHT
    r(0x5014, t.out_channels - 1); // DPU_RDMA_RDMA_DATA_CUBE_CHANNEL
    r(0x5018, 0); // DPU_RDMA_RDMA_SRC_BASE_ADDR: no element-wise input
    r(0x501C, if t.out32 { 1 } else { 2 }); // DPU_RDMA_RDMA_BRDMA_CFG: read the bias (int32: disabled)
    r(0x5020, t.bias_addr); // DPU_RDMA_RDMA_BS_BASE_ADDR
    r(0x5028, 0); // DPU_RDMA_RDMA_NRDMA_CFG
    r(0x502C, 0); // DPU_RDMA_RDMA_BN_BASE_ADDR
    r(0x5034, 1); // DPU_RDMA_RDMA_ERDMA_CFG: disabled
    r(0x5038, 0); // DPU_RDMA_RDMA_EW_BASE_ADDR
    r(0x5040, 0); // DPU_RDMA_RDMA_EW_SURF_STRIDE
    r(0x5044, 0x7810); // DPU_RDMA_RDMA_FEATURE_MODE_CFG: burst 15, MRDMA disabled
    r(0x5048, 0); // DPU_RDMA_RDMA_SRC_DMA_CFG
    r(0x504C, 0); // DPU_RDMA_RDMA_SURF_NOTCH
    r(0x5064, 0); // DPU_RDMA_RDMA_PAD_CFG
    r(0x5068, 0x0101_0101); // DPU_RDMA_RDMA_WEIGHT
    r(0x506C, 0); // DPU_RDMA_RDMA_EW_SURF_NOTCH
    match t.tail {
        Tail::Single => {
            e.push(0);
            e.push(entry(PC_REGISTER_AMOUNTS, 0));
        }
        Tail::Chain { next, amount } => {
            e.push(entry(PC_BASE_ADDRESS, next));
            e.push(entry(PC_REGISTER_AMOUNTS, amount));
        }
    }
    e.push(PRE_ENABLE);
    e.push(ENABLE);
    e
}

/// The task a stream encodes: reads every field back and checks that encoding them again
/// gives the same stream, entry for entry; the error names the first entry that differs.
pub fn decode(s: &[u64]) -> Result<Task, String> {
    let t = decode_fields(s)?;
    let again = encode(&t);
    if let Some(i) = (0..TASK_ENTRIES).find(|&i| again[i] != s[i]) {
        let (_, reg, v) = regcmd::split(s[i]);
        return Err(format!(
            "entry {i} (0x{reg:04x} {}) = 0x{v:08x} is not what a 1x1 convolution task with these fields has (0x{:016x})",
            regcmd::name(reg).unwrap_or_default(),
            again[i]
        ));
    }
    Ok(t)
}

/// The fields of a task's stream, read register by register without [`decode`]'s check
/// that they re-encode to the same stream (allocation-free on success).
pub fn decode_fields(s: &[u64]) -> Result<Task, String> {
    if s.len() != TASK_ENTRIES {
        return Err(format!("a convolution task has {TASK_ENTRIES} entries, this stream {}", s.len()));
    }
    let get = |reg: u16| -> Result<u32, String> {
        s.iter()
            .map(|&e| regcmd::split(e))
            .find(|&(t, r, _)| r == reg && t != 0)
            .map(|(_, _, v)| v)
            .ok_or_else(|| format!("register 0x{reg:04x} ({}) is not in the stream", regcmd::name(reg).unwrap_or_default()))
    };
    let cbuf0 = get(0x1040)?;
    let size0 = get(0x1020)?;
    let size1 = get(0x1024)?;
    let width = size0 >> 16;
    let surf = get(0x4024)? >> 4;
    let chan = get(0x403C)?;
    let tail = if s[126] == 0 {
        Tail::Single
    } else {
        let (_, _, next) = regcmd::split(s[126]);
        let (_, _, amount) = regcmd::split(s[127]);
        Tail::Chain { next, amount }
    };
    let t = Task {
        data_banks: cbuf0 & 0xf,
        weight_banks: (cbuf0 >> 4) & 0xf,
        weight_reuse: cbuf0 & (1 << 13) != 0,
        width,
        rows: (get(0x3014)? >> 16) + 1,
        all_rows: if width == 0 { 0 } else { surf / width },
        channels: size1 & 0xffff,
        channels_real: ((size1 >> 16) & 0x3fff) + 1,
        kernels: get(0x1038)? & 0x3fff,
        out_channels: (chan & 0x1fff) + 1,
        out_channels_real: ((chan >> 16) & 0x1fff) + 1,
        data_entries: get(0x1044)?,
        input_addr: get(0x1070)?,
        weights_addr: get(0x1110)?,
        output_addr: get(0x4020)?,
        bias_addr: get(0x5020)?,
        pad_value: get(0x1184)?,
        truncate: get(0x301C)?,
        ow_op: get(0x4054)?,
        out_offset: get(0x4080)?,
        out_scale: get(0x4084)?,
        out_shift: get(0x4088)?,
        out32: get(0x4010)? == OUT32_FORMAT,
        tail,
    };
    if t.width == 0 || t.rows == 0 {
        return Err("the stream's data size is empty (CNA_DATA_SIZE0)".into());
    }
    Ok(t)
}

//! Scalar reference, straight from ggml's block definitions:
//! Q8_0 = f16 d + 32 × i8, `x = d·q`; Q4_0 = f16 d + 16 bytes, element j in
//! the low nibble of byte j and element j+16 in the high nibble, `x = d·(q−8)`;
//! IQ4_NL = Q4_0's bytes, but `x = d·kvalues_iq4nl[q]` with ggml's table
//! {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}.
//! Activations (keel's CPU rule, llama.cpp's x86 variant): `d = max|x|/127`,
//! `q = rint(x · (127/max|x|))` (half to even), d stored as f16. Dot: per block
//! the exact int32 sum, then `sumf = fma(sumi, dw · da, sumf)` (Q4_0, IQ4_NL),
//! blocks in order from 0; Q8_0 in llama.cpp's x86 order (8 lanes of 4 products,
//! `lane = fma(dw · da, lane_sum, lane)`, AVX horizontal sum).

use half::f16;

/// Weight types the reference knows.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum WType {
    /// ggml Q8_0.
    Q8_0,
    /// ggml Q4_0.
    Q4_0,
    /// ggml IQ4_NL.
    IQ4NL,
}

/// ggml's `kvalues_iq4nl`.
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

impl WType {
    /// `keel_npu_hal::op::DType::code` of the type.
    pub fn code(self) -> u32 {
        match self {
            WType::Q4_0 => 2,
            WType::Q8_0 => 3,
            WType::IQ4NL => 4,
        }
    }
    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            WType::Q8_0 => 34,
            WType::Q4_0 | WType::IQ4NL => 18,
        }
    }
}

/// A quantized activation block: f16 scale bits and quants.
#[derive(Clone, Debug, PartialEq)]
pub struct ActBlock {
    /// f16 bits of d.
    pub d16: u16,
    /// Quants.
    pub q: [i8; 32],
}

impl ActBlock {
    /// ggml bytes.
    pub fn bytes(&self) -> Vec<u8> {
        let mut v = self.d16.to_le_bytes().to_vec();
        v.extend(self.q.iter().map(|&q| q as u8));
        v
    }
}

/// One activation block, as keel's CPU kernels quantize it.
pub fn quantize_q8_0(x: &[f32]) -> ActBlock {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let q = std::array::from_fn(|j| (x[j] * id).round_ties_even() as i8);
    ActBlock { d16: f16::from_f32(d).to_bits(), q }
}

/// Weight quant values (already offset: Q4_0 gives q−8, IQ4_NL the table value) and scale of one block.
pub fn weight_block(t: WType, blk: &[u8]) -> ([i32; 32], f32) {
    let d = f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
    let q = std::array::from_fn(|j| match t {
        WType::Q8_0 => i32::from(blk[2 + j] as i8),
        WType::Q4_0 if j < 16 => i32::from(blk[2 + j] & 15) - 8,
        WType::Q4_0 => i32::from(blk[2 + j - 16] >> 4) - 8,
        WType::IQ4NL if j < 16 => i32::from(KVALUES_IQ4NL[usize::from(blk[2 + j] & 15)]),
        WType::IQ4NL => i32::from(KVALUES_IQ4NL[usize::from(blk[2 + j - 16] >> 4)]),
    });
    (q, d)
}

/// Exact int32 block sums `[block][row]` and f32 outputs for one activation column.
pub fn matvec(t: WType, w: &[u8], rows: usize, k: usize, act: &[ActBlock]) -> (Vec<i32>, Vec<f32>) {
    let nb = k / 32;
    let bb = t.block_bytes();
    let mut sums = vec![0i32; nb * rows];
    let mut out = vec![0f32; rows];
    for (r, o) in out.iter_mut().enumerate() {
        let mut sumf = 0f32;
        // Q8_0: llama.cpp's x86 order (8 lanes of 4 products, fma per block, AVX hsum).
        let mut lanes = [0f32; 8];
        for (b, a) in act.iter().enumerate() {
            let (q, dw) = weight_block(t, &w[(r * nb + b) * bb..][..bb]);
            let sumi: i32 = q.iter().zip(a.q.iter()).map(|(&w, &a)| w * i32::from(a)).sum();
            sums[b * rows + r] = sumi;
            let da = f16::from_bits(a.d16).to_f32();
            if t == WType::Q8_0 {
                for (l, acc) in lanes.iter_mut().enumerate() {
                    let ls: i32 = (4 * l..4 * l + 4).map(|j| q[j] * i32::from(a.q[j])).sum();
                    *acc = (dw * da).mul_add(ls as f32, *acc);
                }
                continue;
            }
            // Q4_0 and IQ4_NL: keel's CPU (llama.cpp's repacked gemv) order, one fma per block.
            sumf = (sumi as f32).mul_add(dw * da, sumf);
        }
        if t == WType::Q8_0 {
            let h = [lanes[4] + lanes[0], lanes[5] + lanes[1], lanes[6] + lanes[2], lanes[7] + lanes[3]];
            sumf = (h[0] + h[2]) + (h[1] + h[3]);
        }
        *o = sumf;
    }
    (sums, out)
}

//! Activations quantized on the DSP to Q8_0 blocks, with the rule keel's CPU
//! kernels use (llama.cpp's x86 variant, `keel_core::quant`), in scalar Hexagon
//! float: `d = max|x| / 127`, `q = rint(x · (127 / max|x|))` rounding half to
//! even; `d` is stored as f16 and used widened back. Same bytes as the CPU path,
//! so a product on the DSP equals the CPU's. Each block is kept in the form the HVX kernels want: the
//! 32 quants as 8 little-endian words (the `Rt` operands of `vrmpy`) and their sum.

use keel_npu_hal::f16::{f16_to_f32, f32_to_f16};

/// One quantized activation block.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
#[repr(C)]
pub struct ActBlock {
    /// Quants `4w..4w+4` packed little-endian in word `w`.
    pub words: [u32; 8],
    /// Sum of the 32 quants (for the weight-offset correction).
    pub sum: i32,
    /// The scale, f16-rounded, as f32.
    pub d: f32,
    /// The scale as stored (f16 bits).
    pub d16: u16,
}

impl ActBlock {
    /// Quant `j` (0..32).
    pub fn q(&self, j: usize) -> i8 {
        (self.words[j / 4] >> (8 * (j % 4))) as u8 as i8
    }
    /// The block in ggml's byte form (f16 d, then 32 int8).
    pub fn ggml_bytes(&self) -> [u8; 34] {
        let mut b = [0u8; 34];
        b[..2].copy_from_slice(&self.d16.to_le_bytes());
        (0..32).for_each(|j| b[2 + j] = self.q(j) as u8);
        b
    }
}

/// Rounds half to even (C's `rintf` in the default mode), for |v| < 2^23.
fn round_even(v: f32) -> i32 {
    let t = v as i32;
    let frac = v - t as f32; // exact for |v| < 2^23
    let odd = t & 1 != 0;
    if frac > 0.5 || (frac == 0.5 && odd) {
        t + 1
    } else if frac < -0.5 || (frac == -0.5 && odd) {
        t - 1
    } else {
        t
    }
}

/// Quantizes 32 values.
pub fn quantize_block(x: &[f32; 32]) -> ActBlock {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut words = [0u32; 8];
    let mut sum = 0i32;
    for (j, &v) in x.iter().enumerate() {
        let q = round_even(v * id).clamp(-128, 127);
        sum += q;
        words[j / 4] |= u32::from(q as i8 as u8) << (8 * (j % 4));
    }
    let d16 = f32_to_f16(d);
    ActBlock { words, sum, d: f16_to_f32(d16), d16 }
}

/// Quantizes a row of `32 · out.len()` values.
pub fn quantize_row(x: &[f32], out: &mut [ActBlock]) {
    for (blk, chunk) in out.iter_mut().zip(x.chunks_exact(32)) {
        // chunks_exact(32) yields 32-element slices.
        *blk = quantize_block(chunk.try_into().unwrap_or(&[0.0; 32]));
    }
}

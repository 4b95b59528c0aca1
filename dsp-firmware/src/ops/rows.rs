//! Rows of ggml tensors as f32 (embedding lookup), and f32 → f16 stores.

use keel_npu_hal::f16::{f16_to_f32, f32_to_f16};
use keel_npu_hal::op::DType;
use keel_npu_hal::ErrorKind;

use crate::hvx::KVALUES_IQ4NL;

/// Dequantizes one ggml row of `dtype` (`src`: exactly `out.len()` elements'
/// bytes) into `out`, as ggml's `dequantize_row_*`: Q8_0 `q·d`, Q4_0 `(q−8)·d`,
/// IQ4_NL `d·kvalues[q]` (one f32 product each, so exact to the CPU's bits).
pub fn dequantize_row(dtype: DType, src: &[u8], out: &mut [f32]) -> Result<(), ErrorKind> {
    let h = |b: &[u8], i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
    match dtype {
        DType::F32 => out.iter_mut().zip(src.chunks_exact(4)).for_each(|(o, b)| *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DType::F16 => out.iter_mut().zip(src.chunks_exact(2)).for_each(|(o, b)| *o = f16_to_f32(h(b, 0))),
        DType::Q8_0 => {
            for (o, blk) in out.chunks_exact_mut(32).zip(src.chunks_exact(34)) {
                let d = f16_to_f32(h(blk, 0));
                o.iter_mut().zip(&blk[2..]).for_each(|(o, &q)| *o = f32::from(q as i8) * d);
            }
        }
        DType::Q4_0 | DType::IQ4NL => {
            for (o, blk) in out.chunks_exact_mut(32).zip(src.chunks_exact(18)) {
                let d = f16_to_f32(h(blk, 0));
                let (lo, hi) = o.split_at_mut(16);
                for ((l, u), &q) in lo.iter_mut().zip(hi).zip(&blk[2..]) {
                    if dtype == DType::Q4_0 {
                        *l = f32::from(i16::from(q & 15) - 8) * d;
                        *u = f32::from(i16::from(q >> 4) - 8) * d;
                    } else {
                        *l = d * f32::from(KVALUES_IQ4NL[usize::from(q & 15)]);
                        *u = d * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
                    }
                }
            }
        }
        _ => return Err(ErrorKind::Unsupported),
    }
    Ok(())
}

/// Stores `x` as binary16 (round to nearest, ties to even) little-endian into `out`.
pub fn store_f16(x: &[f32], out: &mut [u8]) {
    out.chunks_exact_mut(2).zip(x).for_each(|(o, &v)| o.copy_from_slice(&f32_to_f16(v).to_le_bytes()));
}

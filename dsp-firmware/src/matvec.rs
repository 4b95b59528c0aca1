//! Matrix-vector products over Tiles32 weights: the HVX block-sum kernels
//! ([`crate::hvx`]) for the integer part, then, in scalar code, the weight-bias
//! correction (`− bias·Σa`, exact int32) and the scales, per block and in a
//! fixed order:
//!
//! `y[r] = Σ_b (sumi[r][b] as f32) · (dw[r][b] · da[b])` for Q8_0 and IQ4_NL,
//! `Σ_b ((sumi as f32) · dw) · da` for Q4_0, blocks ascending from `0.0`: the
//! operations and order of keel's scalar reference (`keel_core::quant`, after
//! ggml's), so the products are bit for bit the CPU reference's.
//!
//! Work is split by 32-row groups into chunks whose int32 block sums fit the
//! scratch region that is left; the chunk size comes from the scratch size.

use core::arch::hexagon::v128::HvxVector;

use keel_npu_hal::op::DType;
use keel_npu_hal::tile;
use keel_npu_hal::ErrorKind;

use crate::hvx;
use crate::quantize::ActBlock;
use crate::scratch::{Scratch, ALIGN};

/// A weight matrix in Tiles32 layout.
pub struct TiledWeights<'a> {
    /// Q8_0, Q4_0 or IQ4_NL.
    pub dtype: DType,
    /// Output rows (ggml `ne[1]`).
    pub rows: u32,
    /// Inputs per row (ggml `ne[0]`, a multiple of 32).
    pub k: u32,
    /// The packed bytes, 128-byte aligned, exactly `tile::packed_size` long.
    pub packed: &'a [u8],
}

type Kernel = unsafe fn(*const HvxVector, usize, &[u32; 8], *mut HvxVector);

fn kernel(dtype: DType) -> Result<(Kernel, usize, i32), ErrorKind> {
    match dtype {
        DType::Q8_0 => Ok((hvx::q8_0_block_sums, hvx::Q8_0_TILE, hvx::Q8_0_BIAS)),
        DType::Q4_0 => Ok((hvx::q4_0_block_sums, hvx::Q4_0_TILE, hvx::Q4_0_BIAS)),
        DType::IQ4NL => Ok((hvx::iq4_nl_block_sums, hvx::Q4_0_TILE, hvx::IQ4_NL_BIAS)),
        _ => Err(ErrorKind::Unsupported),
    }
}

/// `out[r] = Σ_k w[r][k] · x[k]` with `x` given as quantized blocks.
///
/// If `sums` is given (length `k/32 · rows`), the exact int32 block sums are
/// also written there, `[block][row]`, for tests.
pub fn matvec(
    w: &TiledWeights<'_>,
    act: &[ActBlock],
    scratch: &mut Scratch<'_>,
    out: &mut [f32],
    mut sums: Option<&mut [i32]>,
) -> Result<(), ErrorKind> {
    let (kern, tile_bytes, bias) = kernel(w.dtype)?;
    // Q8_0 and IQ4_NL scale as `sumi · (dw · da)`, Q4_0 as `(sumi · dw) · da` (ggml's generic dots).
    let q8 = w.dtype != DType::Q4_0;
    let size = tile::packed_size(w.dtype, w.rows, w.k).ok_or(ErrorKind::InvalidArgument)?;
    let (rows, nb, groups) = (w.rows as usize, w.k as usize / 32, tile::groups(w.rows));
    let bad_sums = sums.as_ref().is_some_and(|s| s.len() != nb * rows);
    if w.packed.len() != size || act.len() != nb || out.len() != rows || bad_sums {
        return Err(ErrorKind::InvalidArgument);
    }
    if w.packed.as_ptr().align_offset(ALIGN) != 0 {
        return Err(ErrorKind::InvalidArgument);
    }
    let chunk = groups.min(scratch.remaining() / 128);
    if chunk == 0 {
        return Err(ErrorKind::OutOfMemory);
    }
    let buf = scratch.take(chunk * 128)?;
    let scales = &w.packed[tile::scales_offset(w.dtype, w.rows, w.k).ok_or(ErrorKind::InvalidArgument)?..];
    out.fill(0.0);
    for (b, a) in act.iter().enumerate() {
        let mut g0 = 0;
        while g0 < groups {
            let n = chunk.min(groups - g0);
            let tiles = w.packed[(b * groups + g0) * tile_bytes..].as_ptr() as *const HvxVector;
            // SAFETY: the packed size was checked, so `n` tiles from tile (b, g0)
            // are in bounds; `packed` and `buf` are 128-byte aligned (checked /
            // from Scratch) and `buf` holds `chunk ≥ n` vectors; HVX is enabled.
            unsafe { kern(tiles, n, &a.words, buf.as_mut_ptr() as *mut HvxVector) };
            let corr = -bias * a.sum;
            for (i, s4) in buf[..n * 128].chunks_exact(4).enumerate() {
                let row = g0 * 32 + i;
                if row >= rows {
                    break;
                }
                let s = i32::from_le_bytes([s4[0], s4[1], s4[2], s4[3]]) + corr;
                let si = ((b * groups + g0) * 32 + i) * 4;
                let dw = f32::from_le_bytes([scales[si], scales[si + 1], scales[si + 2], scales[si + 3]]);
                out[row] += if q8 { s as f32 * (dw * a.d) } else { s as f32 * dw * a.d };
                if let Some(sums) = sums.as_deref_mut() {
                    sums[b * rows + row] = s;
                }
            }
            g0 += n;
        }
    }
    Ok(())
}

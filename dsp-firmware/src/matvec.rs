//! Matrix-vector products over Tiles32 weights: the HVX block-sum kernels
//! ([`crate::hvx`]) for the integer part, then, in scalar code, the weight-bias
//! correction (`− bias·Σa`, exact int32) and the scales, per block and in a
//! fixed order:
//!
//! `y[r] = fma(sumi[r][b] as f32, dw[r][b] · da[b], y[r])` for Q4_0 and IQ4_NL,
//! blocks ascending from `0.0` (llama.cpp's repacked q4_0_8x8 / iq4_nl_8x8 order), and
//! Q8_0 in 8 lanes ([`matvec_q8_0_lanes`]): the operations and order of keel's CPU
//! kernels (`keel_core::quant`), so the products are bit for bit the CPU's.
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
    if w.dtype == DType::Q8_0 {
        return matvec_q8_0_lanes(w, act, scratch, out, sums);
    }
    let (kern, tile_bytes, bias) = kernel(w.dtype)?;
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
                // keel's CPU order for Q4_0 and IQ4_NL (llama.cpp's repacked gemv):
                // `acc = fma(f32(sumi), dw·da, acc)`, one rounding per block.
                // SAFETY: a pure float operation (an intrinsic with no preconditions).
                out[row] = unsafe { core::intrinsics::fmaf32(s as f32, dw * a.d, out[row]) };
                if let Some(sums) = sums.as_deref_mut() {
                    sums[b * rows + row] = s;
                }
            }
            g0 += n;
        }
    }
    Ok(())
}

/// Q8_0 in llama.cpp's x86 order (`ggml_vec_dot_q8_0_q8_0`, keel's CPU): per row, 8
/// lane accumulators, `acc[l] = fma(dw·da, (lane sum l) as f32, acc[l])` over the
/// blocks ascending, then AVX's horizontal sum `((a4+a0) + (a6+a2)) + ((a5+a1) + (a7+a3))`.
/// The lane sums come from [`hvx::q8_0_lane_sums`] (weight bias corrected per lane,
/// exact). Row groups are the outer loop so the accumulators of one chunk of rows live
/// in scratch.
/// Row groups whose Q8_0 lane accumulators one pass keeps (on the stack: 4 KiB).
const LANE_GROUPS: usize = 4;

fn matvec_q8_0_lanes(
    w: &TiledWeights<'_>,
    act: &[ActBlock],
    scratch: &mut Scratch<'_>,
    out: &mut [f32],
    mut sums: Option<&mut [i32]>,
) -> Result<(), ErrorKind> {
    let size = tile::packed_size(w.dtype, w.rows, w.k).ok_or(ErrorKind::InvalidArgument)?;
    let (rows, nb, groups) = (w.rows as usize, w.k as usize / 32, tile::groups(w.rows));
    let bad_sums = sums.as_ref().is_some_and(|s| s.len() != nb * rows);
    if w.packed.len() != size || act.len() != nb || out.len() != rows || bad_sums {
        return Err(ErrorKind::InvalidArgument);
    }
    if w.packed.as_ptr().align_offset(ALIGN) != 0 {
        return Err(ErrorKind::InvalidArgument);
    }
    // Per group: the 8 lane-result vectors (1024 bytes) in scratch, or, when the scratch
    // is smaller, one lane at a time through the block-sum kernel with the other 7
    // activation words zeroed (128 bytes per group, 8 passes: same numbers). The
    // 32 rows × 8 f32 accumulators of at most `LANE_GROUPS` groups live on the stack.
    let whole = scratch.remaining() >= 1024;
    let per_group = if whole { 1024 } else { 128 };
    let chunk = groups.min(scratch.remaining() / per_group).min(LANE_GROUPS);
    if chunk == 0 {
        return Err(ErrorKind::OutOfMemory);
    }
    let buf = scratch.take(chunk * per_group)?;
    let mut acc = [0f32; LANE_GROUPS * 32 * 8];
    let scales = &w.packed[tile::scales_offset(w.dtype, w.rows, w.k).ok_or(ErrorKind::InvalidArgument)?..];
    let tile_bytes = hvx::Q8_0_TILE;
    let bias = hvx::Q8_0_BIAS;
    let mut g0 = 0;
    while g0 < groups {
        let n = chunk.min(groups - g0);
        let n_rows = (rows - g0 * 32).min(n * 32);
        acc[..n_rows * 8].fill(0.0);
        for (b, a) in act.iter().enumerate() {
            let tiles = w.packed[(b * groups + g0) * tile_bytes..].as_ptr() as *const HvxVector;
            let out_v = buf.as_mut_ptr() as *mut HvxVector;
            if whole {
                // SAFETY: the packed size was checked, so `n` tiles from tile (b, g0) are
                // in bounds; `packed` and `buf` are 128-byte aligned (checked / from
                // Scratch) and `buf` holds `8·chunk ≥ 8·n` vectors; HVX is enabled.
                unsafe { hvx::q8_0_lane_sums(tiles, n, &a.words, out_v) };
            }
            for l in 0..8 {
                if !whole {
                    let mut words = [0u32; 8];
                    words[l] = a.words[l];
                    // SAFETY: as above, with `buf` holding `chunk ≥ n` vectors.
                    unsafe { hvx::q8_0_block_sums(tiles, n, &words, out_v) };
                }
                // The weight-bias correction of this lane: −128 · Σ of its 4 activation quants.
                let wd = a.words[l];
                let corr = -bias * (0..4).map(|j| i32::from((wd >> (8 * j)) as u8 as i8)).sum::<i32>();
                for i in 0..n_rows {
                    let (g, r) = (i / 32, i % 32);
                    let si = ((b * groups + g0 + g) * 32 + r) * 4;
                    let dw = f32::from_le_bytes([scales[si], scales[si + 1], scales[si + 2], scales[si + 3]]);
                    let at = if whole { ((g * 8 + l) * 32 + r) * 4 } else { i * 4 };
                    let s = i32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) + corr;
                    // The hardware's fused multiply-add (`sffma`: one rounding, as `fmaf`).
                    // SAFETY: a pure float operation (an intrinsic with no preconditions).
                    acc[i * 8 + l] = unsafe { core::intrinsics::fmaf32(dw * a.d, s as f32, acc[i * 8 + l]) };
                    if let Some(sums) = sums.as_deref_mut() {
                        let o = &mut sums[b * rows + g0 * 32 + i];
                        *o = if l == 0 { s } else { *o + s };
                    }
                }
            }
        }
        for i in 0..n_rows {
            let a = &acc[i * 8..i * 8 + 8];
            let r = [a[4] + a[0], a[5] + a[1], a[6] + a[2], a[7] + a[3]];
            out[g0 * 32 + i] = (r[0] + r[2]) + (r[1] + r[3]);
        }
        g0 += n;
    }
    Ok(())
}

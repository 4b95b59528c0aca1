//! keel's weight tile layout ("Tiles32") for HVX matrix products. The host
//! repacks ggml weight rows into it once, at load; the firmware reads it with
//! aligned 128-byte vector loads. This module owns the layout and the repack.
//!
//! A weight matrix has `rows` outputs (ggml `ne[1]`) and `k` inputs (`ne[0]`, a
//! multiple of 32). Rows are grouped by 32 (`G = ceil(rows / 32)` groups, the last
//! padded); `k` is split into `nb = k / 32` blocks. The packed bytes are:
//!
//! 1. **Quant section**: one tile per (block `b`, group `g`), block-major, tile
//!    `(b, g)` at `(b·G + g)·T`. For a fixed block the tiles of all groups are
//!    adjacent, so the kernel can hold one activation block in registers while
//!    streaming every row group.
//!    - Q8_0, `T = 1024`: 8 vectors of 128 bytes; byte `4r + j` of vector `v` is
//!      `q[32g + r][32b + 4v + j] ^ 0x80` (int8 biased to uint8, so that
//!      `vrmpy(Vu.ub, Rt.b)` applies; the kernel subtracts `128·Σa` per block).
//!    - Q4_0 and IQ4_NL, `T = 512`: 4 vectors; byte `4r + j` of vector `m` is
//!      ggml's byte `4m + j` of that row's block: low nibble element `4m + j`,
//!      high nibble element `16 + 4m + j`. So nibble vector `m` unpacks into the
//!      byte vectors for elements `4m..4m+4` (low) and `16+4m..` (high).
//!    - Padding rows hold the zero code (0x80 for Q8_0, 0x88 for the 4-bit types).
//! 2. **Scale section**, at `nb·G·T`: `f32` little-endian scales (the f16 block
//!    scale widened, which is exact), scale of row `32g + r`, block `b` at
//!    `((b·G + g)·32 + r)·4`. Padding rows have scale 0. Stored as `f32` so the
//!    DSP's scalar float unit needs no f16 conversion in the inner loop (+128 B
//!    per tile: 11 % more than f16 for Q4_0).

use crate::error::ErrorKind;
use crate::op::DType;

/// Rows per tile (one int32 lane per row in a 128-byte HVX vector).
pub const TILE_ROWS: u32 = 32;
/// Zero code of a padded Q8_0 row (0 biased by 0x80).
pub const Q8_0_PAD: u8 = 0x80;
/// Zero-ish code of a padded 4-bit row (nibble 8 in both halves).
pub const Q4_PAD: u8 = 0x88;

/// Bytes of one tile's quants, for the types that have a tile layout.
pub fn tile_quant_bytes(dtype: DType) -> Option<usize> {
    match dtype {
        DType::Q8_0 => Some(1024),
        DType::Q4_0 | DType::IQ4NL => Some(512),
        _ => None,
    }
}

/// Number of 32-row groups for `rows` rows.
pub fn groups(rows: u32) -> usize {
    rows.div_ceil(TILE_ROWS) as usize
}

/// Byte offset of the scale section, or `None` for a type or shape without tiles.
pub fn scales_offset(dtype: DType, rows: u32, k: u32) -> Option<usize> {
    if k == 0 || k % 32 != 0 || rows == 0 {
        return None;
    }
    let t = tile_quant_bytes(dtype)?;
    (k as usize / 32).checked_mul(groups(rows))?.checked_mul(t)
}

/// Total packed bytes for a `rows × k` matrix.
pub fn packed_size(dtype: DType, rows: u32, k: u32) -> Option<usize> {
    let q = scales_offset(dtype, rows, k)?;
    let scales = (k as usize / 32).checked_mul(groups(rows))?.checked_mul(128)?;
    q.checked_add(scales)
}

/// Repacks ggml rows (`rows` rows of `k / 32` blocks each, row-major) into Tiles32.
///
/// `dst` must be exactly [`packed_size`] bytes; `src` exactly `rows` ggml rows.
pub fn repack(dtype: DType, rows: u32, k: u32, src: &[u8], dst: &mut [u8]) -> Result<(), ErrorKind> {
    packed_size(dtype, rows, k).ok_or(ErrorKind::Unsupported)?;
    let row_bytes = (k as usize / 32) * dtype.block_bytes() as usize;
    if src.len() != rows as usize * row_bytes {
        return Err(ErrorKind::InvalidArgument);
    }
    for g in 0..groups(rows) {
        let end = ((g + 1) * TILE_ROWS as usize).min(rows as usize);
        repack_group(dtype, rows, k, g, &src[g * TILE_ROWS as usize * row_bytes..end * row_bytes], dst)?;
    }
    Ok(())
}

/// Repacks row group `g` (ggml rows `32g ..` up to 32 of them, or to `rows`) into its
/// tiles and scales in `dst`, the whole matrix's packed bytes: a host can convert and
/// repack a weight one group at a time, with scratch for 32 rows.
///
/// `dst` must be exactly [`packed_size`] bytes; `src` exactly the group's ggml rows.
pub fn repack_group(dtype: DType, rows: u32, k: u32, g: usize, src: &[u8], dst: &mut [u8]) -> Result<(), ErrorKind> {
    let size = packed_size(dtype, rows, k).ok_or(ErrorKind::Unsupported)?;
    let bb = dtype.block_bytes() as usize;
    let nb = k as usize / 32;
    let g_count = groups(rows);
    let first = g * TILE_ROWS as usize;
    let n_rows = (rows as usize).saturating_sub(first).min(TILE_ROWS as usize);
    if dst.len() != size || g >= g_count || src.len() != n_rows * nb * bb {
        return Err(ErrorKind::InvalidArgument);
    }
    let t = tile_quant_bytes(dtype).ok_or(ErrorKind::Unsupported)?;
    let (quants, scales) = dst.split_at_mut(nb * g_count * t);
    for b in 0..nb {
        let tile = &mut quants[(b * g_count + g) * t..][..t];
        for r in 0..32 {
            let si = ((b * g_count + g) * 32 + r) * 4;
            if r >= n_rows {
                let pad = if dtype == DType::Q8_0 { Q8_0_PAD } else { Q4_PAD };
                (0..t / 128).for_each(|v| tile[v * 128 + 4 * r..][..4].fill(pad));
                scales[si..si + 4].copy_from_slice(&0f32.to_le_bytes());
                continue;
            }
            let blk = &src[(r * nb + b) * bb..][..bb];
            let d = half::f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
            scales[si..si + 4].copy_from_slice(&d.to_le_bytes());
            let q = &blk[2..];
            for v in 0..t / 128 {
                for j in 0..4 {
                    let byte = q[4 * v + j];
                    tile[v * 128 + 4 * r + j] = if dtype == DType::Q8_0 { byte ^ 0x80 } else { byte };
                }
            }
        }
    }
    Ok(())
}

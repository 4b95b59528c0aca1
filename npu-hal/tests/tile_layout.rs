//! The Tiles32 repack against the layout its module documents, read back
//! element by element.

use keel_npu_hal::op::DType;
use keel_npu_hal::tile::{self, packed_size, repack, scales_offset};
use keel_npu_hal::ErrorKind;

fn rng(seed: &mut u64) -> u32 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    (*seed >> 16) as u32
}

/// ggml rows of random blocks; scales are random small f16 values.
fn ggml_rows(dtype: DType, rows: usize, k: usize, seed: &mut u64) -> Vec<u8> {
    let bb = dtype.block_bytes() as usize;
    let mut v = Vec::new();
    for _ in 0..rows * k / 32 {
        let d = half::f16::from_f32((rng(seed) % 1000) as f32 / 4096.0 + 1e-3).to_bits();
        v.extend_from_slice(&d.to_le_bytes());
        (0..bb - 2).for_each(|_| v.push(rng(seed) as u8));
    }
    v
}

/// Quant code and scale of element (row, col), read straight from ggml rows.
fn ggml_elem(dtype: DType, src: &[u8], k: usize, row: usize, col: usize) -> (u8, f32) {
    let bb = dtype.block_bytes() as usize;
    let blk = &src[(row * k / 32 + col / 32) * bb..][..bb];
    let d = half::f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
    let j = col % 32;
    let q = match dtype {
        DType::Q8_0 => blk[2 + j],
        _ if j < 16 => blk[2 + j] & 15,
        _ => blk[2 + j - 16] >> 4,
    };
    (q, d)
}

/// The same element, read from the packed tiles by the documented formulas.
fn tile_elem(dtype: DType, packed: &[u8], rows: usize, k: usize, row: usize, col: usize) -> (u8, f32) {
    let g_count = tile::groups(rows as u32);
    let t = tile::tile_quant_bytes(dtype).unwrap();
    let (g, r, b, j) = (row / 32, row % 32, col / 32, col % 32);
    let tile = &packed[(b * g_count + g) * t..][..t];
    let q = match dtype {
        DType::Q8_0 => tile[(j / 4) * 128 + 4 * r + j % 4] ^ 0x80,
        _ => {
            let m = (j % 16) / 4;
            let byte = tile[m * 128 + 4 * r + j % 4];
            if j < 16 { byte & 15 } else { byte >> 4 }
        }
    };
    let s = scales_offset(dtype, rows as u32, k as u32).unwrap() + ((b * g_count + g) * 32 + r) * 4;
    (q, f32::from_le_bytes(packed[s..s + 4].try_into().unwrap()))
}

#[test]
fn repack_places_every_element_where_documented() {
    let mut seed = 0x1234_5678_9abc_def0;
    for dtype in [DType::Q8_0, DType::Q4_0, DType::IQ4NL] {
        for (rows, k) in [(1, 32), (32, 64), (45, 96), (64, 256), (100, 32)] {
            let src = ggml_rows(dtype, rows, k, &mut seed);
            let mut dst = vec![0u8; packed_size(dtype, rows as u32, k as u32).unwrap()];
            repack(dtype, rows as u32, k as u32, &src, &mut dst).unwrap();
            for row in 0..rows {
                for col in 0..k {
                    assert_eq!(ggml_elem(dtype, &src, k, row, col), tile_elem(dtype, &dst, rows, k, row, col), "{dtype:?} {rows}x{k} ({row},{col})");
                }
            }
            // Padding rows: zero code and zero scale.
            for row in rows..tile::groups(rows as u32) * 32 {
                let (q, d) = tile_elem(dtype, &dst, rows, k, row, 0);
                assert_eq!((q, d), (if dtype == DType::Q8_0 { 0 } else { 8 }, 0.0));
            }
        }
    }
}

#[test]
fn repack_refuses_bad_sizes() {
    let src = vec![0u8; 34 * 2];
    let mut dst = vec![0u8; packed_size(DType::Q8_0, 1, 64).unwrap()];
    assert_eq!(packed_size(DType::Q8_0, 1, 64), Some(2 * 1024 + 2 * 128));
    assert_eq!(repack(DType::Q8_0, 1, 64, &src[..67], &mut dst), Err(ErrorKind::InvalidArgument));
    assert_eq!(repack(DType::Q8_0, 1, 64, &src, &mut dst[1..]), Err(ErrorKind::InvalidArgument));
    assert_eq!(repack(DType::F32, 1, 64, &src, &mut dst), Err(ErrorKind::Unsupported));
    assert_eq!(packed_size(DType::Q4_0, 1, 33), None);
    assert_eq!(repack(DType::Q8_0, 1, 64, &src, &mut dst), Ok(()));
}

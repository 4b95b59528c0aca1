//! Tiles32 products (reference block sums + the scale pass) against the row dots of
//! every kernel set, bit for bit. The HVX block sums are checked against the same
//! reference under qemu-hexagon (`dsp-firmware/qemu-tests`).

extern crate std;
use std::{vec, vec::Vec};

use keel_npu_hal::op::DType;
use keel_npu_hal::tile;

use super::tests::{activations, fast_kernel_sets, quantized, random_row, Reversed, Rng};
use super::tiles32::{self, quantize_act, ActBlock, TileError, TiledWeights, ALIGN, REFERENCE};
use super::*;
use crate::ggml_type::GgmlType;

/// A buffer whose `len` bytes from the returned offset are `ALIGN`-aligned.
fn aligned(len: usize) -> (Vec<u8>, usize) {
    let v = vec![0u8; len + ALIGN];
    let off = v.as_ptr().align_offset(ALIGN);
    (v, off)
}

fn tiled(ty: GgmlType, dt: DType, w: &[u8], rows: usize, k: usize) -> (Vec<u8>, usize) {
    let size = tile::packed_size(dt, rows as u32, k as u32).unwrap();
    let (mut v, off) = aligned(size);
    tile::repack(dt, rows as u32, k as u32, w, &mut v[off..off + size]).unwrap();
    assert_eq!(ty.row_bytes(k as u64).unwrap() as usize * rows, w.len());
    (v, off)
}

#[test]
fn tile_products_equal_row_dots() {
    let mut rng = Rng::new(32);
    let mut sets = vec![Kernels::reference()];
    sets.extend(fast_kernel_sets());
    let types = [(GgmlType::Q8_0, DType::Q8_0), (GgmlType::Q4_0, DType::Q4_0), (GgmlType::IQ4_NL, DType::IQ4NL)];
    let mut cases = 0;
    for (ty, dt) in types {
        for (rows, k) in [(1, 32), (31, 64), (32, 32), (33, 96), (100, 256), (130, 512), (40, 1088)] {
            let w: Vec<u8> = (0..rows).flat_map(|_| quantized(ty, &random_row(&mut rng, k))).collect();
            let x = random_row(&mut rng, k);
            let (packed, off) = tiled(ty, dt, &w, rows, k);
            let weights = TiledWeights { dtype: dt, rows, k, packed: &packed[off..off + packed.len() - ALIGN] };
            let rb = ty.row_bytes(k as u64).unwrap() as usize;
            for kern in &sets {
                let a = activations(kern, GgmlType::Q8_0, &x);
                let dot = kern.dot_fn(ty).unwrap();
                let want: Vec<f32> = (0..rows).map(|r| dot(k, &w[r * rb..(r + 1) * rb], &a)).collect();
                let mut act = vec![ActBlock::default(); k / 32];
                quantize_act(kern, &x, &mut act).unwrap();
                let back: Vec<u8> = act.iter().flat_map(|b| b.to_q8_0()).collect();
                assert_eq!(back, a, "{ty}: activation blocks");
                // Scratch for 1 group's block sums (Q8_0: the one-lane-at-a-time path),
                // a few groups' lane sums, and plenty.
                for scratch_len in [128, 1024 * 2, 1024 * 5, 1 << 16] {
                    let (mut scratch, soff) = aligned(scratch_len);
                    let mut out = vec![f32::NAN; rows];
                    let mut sums = vec![0i32; rows * k / 32];
                    tiles32::matvec(kern, &weights, &act, &mut scratch[soff..soff + scratch_len], &mut out, Some(&mut sums)).unwrap();
                    for r in 0..rows {
                        assert_eq!(out[r].to_bits(), want[r].to_bits(), "{ty} {rows}x{k} row {r} scratch {scratch_len} ({}): {} vs {}", kern.name(), out[r], want[r]);
                    }
                    cases += 1;
                }
                // Several columns in one pass (row chunks outside the columns): each
                // column's outputs are its own product's, bit for bit.
                let cols = 3;
                let xs: Vec<f32> = (0..cols).flat_map(|c| if c == 1 { x.clone() } else { random_row(&mut rng, k) }).collect();
                let mut acts = vec![ActBlock::default(); cols * k / 32];
                quantize_act(kern, &xs, &mut acts).unwrap();
                // The larger scratches hold a chunk's tiles staged beside its sums
                // (`StageFn`); the smaller ones read the tiles in place.
                for scratch_len in [128, 1024 * 2, 1024 * 5, 1 << 16, 1 << 18] {
                    let (mut scratch, soff) = aligned(scratch_len);
                    let mut outs = vec![f32::NAN; cols * rows];
                    tiles32::matmul(kern, &weights, &acts, cols, &mut scratch[soff..soff + scratch_len], &mut outs).unwrap();
                    for c in 0..cols {
                        let a: Vec<u8> = acts[c * k / 32..][..k / 32].iter().flat_map(|b| b.to_q8_0()).collect();
                        for r in 0..rows {
                            let want = dot(k, &w[r * rb..(r + 1) * rb], &a);
                            assert_eq!(outs[c * rows + r].to_bits(), want.to_bits(), "{ty} {rows}x{k} column {c} row {r} scratch {scratch_len} ({})", kern.name());
                        }
                    }
                    // Row groups split over tasks (each with its share of the scratch),
                    // run in reverse: the same bits; a share too small for one group is
                    // refused, not miscomputed.
                    for tasks in [2, 3, 5] {
                        let mut par_outs = vec![f32::NAN; cols * rows];
                        let r = tiles32::matmul_par(kern, &weights, &acts, cols, &mut scratch[soff..soff + scratch_len], &mut par_outs, &Reversed(tasks));
                        let groups = tile::groups(rows as u32);
                        if scratch_len / tasks.min(groups) < 128 && groups > 1 {
                            assert_eq!(r, Err(TileError::Scratch), "{ty} {rows}x{k} {tasks} tasks, scratch {scratch_len}");
                            continue;
                        }
                        r.unwrap();
                        let same = par_outs.iter().zip(&outs).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{ty} {rows}x{k} {tasks} tasks, scratch {scratch_len} ({}): not matmul's bits", kern.name());
                    }
                }
            }
        }
    }
    assert!(cases >= 3 * 7 * 4, "{cases} cases");
}

/// Bytes staged by [`counting_stage`] (only `several_columns_read_staged_tiles` uses it).
static STAGED: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// A `StageFn` that copies and counts.
fn counting_stage(src: &[u8], dst: &mut [u8]) {
    STAGED.fetch_add(src.len(), core::sync::atomic::Ordering::Relaxed);
    dst.copy_from_slice(src);
}

#[test]
fn several_columns_read_staged_tiles() {
    // A product of several columns copies every chunk's tiles once into the scratch
    // when it holds them beside one pass's sums, and reads them from there (a stage
    // that drops the last vector changes the outputs: seen to fail); one column, or a
    // scratch too small, reads them in place. The outputs are matmul's, bit for bit.
    let mut rng = Rng::new(24);
    let kern = Kernels::reference();
    let tk = tiles32::TileKernels { stage: counting_stage, ..REFERENCE };
    let mut staged_cases = 0;
    for (ty, dt, tile_bytes) in [(GgmlType::Q8_0, DType::Q8_0, 1024), (GgmlType::Q4_0, DType::Q4_0, 512), (GgmlType::IQ4_NL, DType::IQ4NL, 512)] {
        let (rows, k) = (200, 256);
        let w: Vec<u8> = (0..rows).flat_map(|_| quantized(ty, &random_row(&mut rng, k))).collect();
        let (packed, off) = tiled(ty, dt, &w, rows, k);
        let weights = TiledWeights { dtype: dt, rows, k, packed: &packed[off..off + packed.len() - ALIGN] };
        let tiles = tile::groups(rows as u32) * (k / 32) * tile_bytes;
        for cols in [1, 4] {
            let xs = random_row(&mut rng, cols * k);
            let mut acts = vec![ActBlock::default(); cols * k / 32];
            quantize_act(&kern, &xs, &mut acts).unwrap();
            for scratch_len in [1024 * 5, 1 << 18] {
                let (mut scratch, soff) = aligned(scratch_len);
                let mut want = vec![f32::NAN; cols * rows];
                tiles32::matmul(&kern, &weights, &acts, cols, &mut scratch[soff..soff + scratch_len], &mut want).unwrap();
                let mut got = vec![f32::NAN; cols * rows];
                STAGED.store(0, core::sync::atomic::Ordering::Relaxed);
                tiles32::matmul_par_with(&tk, &weights, &acts, cols, &mut scratch[soff..soff + scratch_len], &mut got, &crate::parallel::Sequential).unwrap();
                let staged = STAGED.load(core::sync::atomic::Ordering::Relaxed);
                let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{ty} {cols} columns, scratch {scratch_len}: not matmul's bits");
                let expect = if cols > 1 && scratch_len == 1 << 18 { tiles } else { 0 };
                assert_eq!(staged, expect, "{ty} {cols} columns, scratch {scratch_len}: bytes staged");
                staged_cases += usize::from(expect > 0);
            }
        }
    }
    assert_eq!(staged_cases, 3);
}

#[test]
fn reference_block_sums_are_the_integer_dots() {
    // Raw sums minus the bias correction are Σ q·a over the block, for every type.
    let mut rng = Rng::new(7);
    for (ty, dt, bias) in [(GgmlType::Q8_0, DType::Q8_0, 128), (GgmlType::Q4_0, DType::Q4_0, 8), (GgmlType::IQ4_NL, DType::IQ4NL, 128)] {
        let (rows, k) = (40, 64);
        let w: Vec<u8> = (0..rows).flat_map(|_| quantized(ty, &random_row(&mut rng, k))).collect();
        let (packed, off) = tiled(ty, dt, &w, rows, k);
        let a = activations(&Kernels::reference(), GgmlType::Q8_0, &random_row(&mut rng, k));
        let blocks: Vec<ActBlock> = a.chunks_exact(34).map(|b| ActBlock::from_q8_0(b.try_into().unwrap())).collect();
        let f = match dt {
            DType::Q8_0 => REFERENCE.q8_0,
            DType::Q4_0 => REFERENCE.q4_0,
            _ => REFERENCE.iq4_nl,
        };
        let g = tile::groups(rows as u32);
        let tb = tile::tile_quant_bytes(dt).unwrap();
        let rb = ty.row_bytes(k as u64).unwrap() as usize;
        for (b, blk) in blocks.iter().enumerate() {
            let mut out = vec![0i32; 32 * g];
            f(&packed[off + b * g * tb..], g, &blk.words, &mut out);
            for r in 0..rows {
                let wb = &w[r * rb + b * ty.type_size()..][..ty.type_size()];
                let q = |j: usize| -> i32 {
                    match ty {
                        GgmlType::Q8_0 => i32::from(wb[2 + j] as i8),
                        _ => {
                            let c = if j < 16 { wb[2 + j] & 15 } else { wb[2 + j - 16] >> 4 };
                            if ty == GgmlType::Q4_0 { i32::from(c) - 8 } else { i32::from(blocks::KVALUES_IQ4NL[usize::from(c)]) }
                        }
                    }
                };
                let dot: i32 = (0..32).map(|j| q(j) * i32::from(blk.q(j))).sum();
                assert_eq!(out[r] - bias * blk.sum, dot, "{ty} row {r} block {b}");
            }
        }
    }
}

#[test]
fn bad_shapes_are_refused() {
    let kern = Kernels::reference();
    let (packed, off) = aligned(2048 + 128);
    let act = [ActBlock::default(); 1];
    let mut out = [0f32; 1];
    let mut scratch = [0u8; 4096];
    let w = TiledWeights { dtype: DType::Q8_0, rows: 1, k: 32, packed: &packed[off..off + 1024 + 128] };
    assert_eq!(tiles32::matvec(&kern, &w, &act[..0], &mut scratch, &mut out, None), Err(TileError::Shape));
    assert_eq!(tiles32::matvec(&kern, &TiledWeights { packed: &packed[off + 1..off + 1025 + 128], ..w }, &act, &mut scratch, &mut out, None), Err(TileError::Shape));
    assert_eq!(tiles32::matvec(&kern, &TiledWeights { dtype: DType::F32, ..w }, &act, &mut scratch, &mut out, None), Err(TileError::Unsupported));
    assert_eq!(tiles32::matvec(&kern, &w, &act, &mut scratch[..64], &mut out, None), Err(TileError::Scratch));
    assert_eq!(quantize_act(&kern, &[0.0; 31], &mut [ActBlock::default()]), Err(TileError::Shape));
    assert_eq!(tiles32::matvec(&kern, &w, &act, &mut scratch, &mut out, None), Ok(()));
}

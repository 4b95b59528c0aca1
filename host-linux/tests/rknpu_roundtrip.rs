//! keel's RK3588 GEMM streams decode back to exactly what was intended (acceptance 2 of the
//! rocket work): for 24 shapes (M = 1 decode rows up to 512-row prompts, K and N not
//! multiples of 32, weights larger than the on-chip buffer so N is tiled, inputs split into
//! several tasks), every task's stream decodes to the planned task, and the planned tasks
//! are the ones the shape asks for, checked field by field from the shape itself.

use keel_host_linux::device::rknpu::conv::{self, Addrs, Quant, Tail, CBUF_ENTRIES_PER_BANK, CBUF_ENTRY_BYTES, TASK_ENTRIES, TASK_STRIDE};
use keel_host_linux::device::rknpu::{gemm, pack, regcmd};

const SHAPES: [(u32, u32, u32); 24] = [
    (1, 64, 64),
    (1, 576, 576),
    (1, 576, 1536),
    (1, 2048, 8192),
    (1, 20, 33),
    (1, 100, 70),
    (1, 8192, 256),
    (2, 40, 2),
    (7, 100, 70),
    (16, 576, 64),
    (32, 128, 128),
    (64, 960, 2560),
    (100, 1000, 1000),
    (128, 576, 576),
    (255, 33, 31),
    (256, 2048, 2048),
    (300, 1536, 8960),
    (333, 48, 4000),
    (480, 576, 64),
    (500, 4096, 96),
    (512, 576, 1536),
    (512, 2048, 2048),
    (512, 9000, 64),
    (512, 17, 1),
];

const BASE: Addrs = Addrs { input: 0x1000_0000, weights: 0x2000_0000, output: 0x3000_0000, bias: 0x3f00_0000, regcmd: 0x3f80_0000 };

fn q() -> Quant {
    Quant { in_zp: -128, w_zp: 0, out_zp: 0, in_scale: 0.05, w_scale: 0.004, out_scale: 0.4 }
}

#[test]
fn every_field_decoded_equals_the_intended_one() {
    let mut tiled = 0;
    let mut split = 0;
    for (m, k, n) in SHAPES {
        let p = gemm::plan(m, k, n, q(), &BASE).unwrap_or_else(|e| panic!("m={m} k={k} n={n}: {e}"));
        let ctx = format!("m={m} k={k} n={n}");
        // Tiles cover N in order; each tile's weights stay resident (a spare bank left).
        let mut n0 = 0;
        let mut w_at = 0;
        for (i, t) in p.tiles.iter().enumerate() {
            assert_eq!((t.n0, t.weights_at), (n0, w_at), "{ctx} tile {i}");
            assert!(t.n0 % 32 == 0 && t.n > 0);
            assert!(conv::weight_banks(k, t.n) + 1 < conv::CBUF_BANKS, "{ctx} tile {i}: weights not resident");
            n0 += t.n;
            w_at += pack::weights_packed_len(k, t.n) as u32;
        }
        assert_eq!(n0, n, "{ctx}: tiles cover N");
        assert_eq!(p.weights_len, w_at as usize);
        tiled += usize::from(p.tiles.len() > 1);
        let total_weights = k * n;
        if total_weights > 12 * CBUF_ENTRIES_PER_BANK * CBUF_ENTRY_BYTES {
            assert!(p.tiles.len() > 1, "{ctx}: weights larger than the buffer must be tiled");
        }
        for (ti, tile) in p.tiles.iter().enumerate() {
            let end = p.tiles.get(ti + 1).map_or(p.tasks.len(), |t| t.first_task);
            let tasks = &p.tasks[tile.first_task..end];
            split += usize::from(tasks.len() > 1);
            let mut top = 0;
            for (j, t) in tasks.iter().enumerate() {
                let c = format!("{ctx} tile {ti} task {j}");
                let s = conv::encode(t);
                assert_eq!(s.len(), TASK_ENTRIES, "{c}");
                let d = conv::decode(&s).unwrap_or_else(|e| panic!("{c}: {e}"));
                assert_eq!(d, *t, "{c}: decoded");
                // The intended values, from the shape.
                assert_eq!((d.width, d.all_rows), (1, m), "{c}");
                assert!(d.rows >= 1 && d.rows <= conv::MAX_ROWS, "{c}: rows {}", d.rows);
                assert_eq!((d.channels_real, d.channels), (k, k.max(16).div_ceil(16) * 16), "{c}");
                assert_eq!((d.out_channels_real, d.out_channels, d.kernels), (tile.n, tile.n.div_ceil(32) * 32, tile.n.div_ceil(2) * 2), "{c}");
                assert_eq!(d.input_addr, BASE.input + 16 * top, "{c}");
                assert_eq!(d.output_addr, BASE.output + tile.n0 * m + 16 * top, "{c}");
                assert_eq!(d.weights_addr, BASE.weights + tile.weights_at, "{c}");
                assert_eq!(d.bias_addr, BASE.bias + 4 * tile.n0, "{c}");
                assert_eq!(d.weight_reuse, j > 0, "{c}: weights reused after the tile's first task");
                assert_eq!(d.data_banks + d.weight_banks, 12, "{c}");
                assert!(d.channels * d.kernels <= (d.weight_banks - 1) * CBUF_ENTRIES_PER_BANK * CBUF_ENTRY_BYTES, "{c}: weights fit their banks");
                let row_entries = k.div_ceil(16).div_ceil(8);
                assert!(d.rows * row_entries <= d.data_banks * CBUF_ENTRIES_PER_BANK, "{c}: rows fit the data banks");
                assert_eq!(d.pad_value, 0, "{c}: int8 input zero point -128 is 0 in the NPU's view");
                top += d.rows;
            }
            assert_eq!(top, m, "{ctx} tile {ti}: tasks cover all rows");
        }
        // One job: every task chains to the next stream slot, the last ends the chain.
        let count = p.tasks.len();
        for (i, t) in p.tasks.iter().enumerate() {
            let want = match (count, i + 1 < count) {
                (1, _) => Tail::Single,
                (_, true) => Tail::Chain { next: BASE.regcmd + TASK_STRIDE * (i as u32 + 1), amount: 64 },
                (_, false) => Tail::Chain { next: 0, amount: 0 },
            };
            assert_eq!(t.tail, want, "{ctx} task {i}");
        }
        assert_eq!(p.regcmd_len, count * TASK_STRIDE as usize);
        let buf = gemm::regcmd_buffer(&p);
        assert_eq!(buf.len(), p.regcmd_len);
    }
    assert!(tiled >= 5 && split >= 5, "the shapes exercise tiling ({tiled}) and row splits ({split})");
}

#[test]
fn shapes_the_buffer_cannot_take_are_refused() {
    let e = gemm::plan(4, 40000, 64, q(), &BASE).unwrap_err();
    assert!(e.contains("do not fit"), "{e}");
    assert!(gemm::plan(0, 64, 64, q(), &BASE).is_err());
    assert!(gemm::plan(4, 1, 64, q(), &BASE).is_err());
}

#[test]
fn packed_weights_follow_the_tiles() {
    let (k, n) = (100, 70);
    let w: Vec<u8> = (0..k * n).map(|i| (i * 7 % 251) as u8).collect();
    let big = gemm::plan(3, k, 4096, q(), &BASE).unwrap();
    assert!(big.tiles.len() > 1);
    let wb: Vec<u8> = (0..k * 4096).map(|i| (i % 253) as u8).collect();
    let pb = gemm::pack_weights(&big, &wb, 0).unwrap();
    let t1 = big.tiles[1];
    assert_eq!(pb[t1.weights_at as usize], wb[(t1.n0 * k) as usize].wrapping_sub(0x80), "tile 1 starts with its own first kernel");
    let p = gemm::plan(3, k, n, q(), &BASE).unwrap();
    let packed = gemm::pack_weights(&p, &w, 0).unwrap();
    assert_eq!(packed.len(), p.weights_len);
    // Output channel 0, input channel 1 sits at byte 1 (the NPU's signed view: minus 0x80).
    assert_eq!(packed[1], w[1].wrapping_sub(0x80));
    assert!(gemm::pack_weights(&p, &w[1..], 0).is_err());
}

/// keel's int32 mode (the `rknpu` device's products) round-trips too, on the same 24
/// shapes: every task decodes to itself with `out32`, writes its tile's int32 surfaces at
/// `4·n0·m` (plus the task's rows), reads no bias, and differs from Mesa's configuration
/// of the same task only in the registers `conv::OUT32_REGISTERS` lists.
#[test]
fn the_int32_mode_round_trips_and_differs_only_where_listed() {
    let listed: Vec<u16> = conv::OUT32_REGISTERS.iter().map(|r| r.0).collect();
    for (m, k, n) in SHAPES {
        let ctx = format!("m={m} k={k} n={n}");
        let p = gemm::plan_out(m, k, n, q(), &BASE, true).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let mesa = gemm::plan(m, k, n, q(), &BASE).unwrap();
        assert_eq!(p.tasks.len(), mesa.tasks.len(), "{ctx}: the same task split");
        assert_eq!(p.output_len, gemm::output32_len(m, n), "{ctx}");
        for (ti, tile) in p.tiles.iter().enumerate() {
            let end = p.tiles.get(ti + 1).map_or(p.tasks.len(), |t| t.first_task);
            let mut top = 0;
            for i in tile.first_task..end {
                let (t, c) = (&p.tasks[i], format!("{ctx} tile {ti} task {i}"));
                let s = conv::encode(t);
                let d = conv::decode(&s).unwrap_or_else(|e| panic!("{c}: {e}"));
                assert_eq!(d, *t, "{c}: decoded");
                assert!(d.out32 && d.bias_addr == 0 && d.truncate == 0, "{c}");
                assert_eq!((d.out_offset, d.out_scale, d.out_shift, d.ow_op), (0, 1, 0, 0), "{c}: identity conversion");
                assert_eq!(d.output_addr, BASE.output + 4 * tile.n0 * m + 16 * top, "{c}");
                assert_eq!(d.output_addr - BASE.output, gemm::output32_at(m, top, tile.n0) as u32, "{c}");
                let sm = conv::encode(&mesa.tasks[i]);
                for (j, (a, b)) in s.iter().zip(&sm).enumerate() {
                    let (_, reg, _) = regcmd::split(*a);
                    let (_, reg_m, _) = regcmd::split(*b);
                    assert_eq!(reg, reg_m, "{c}: entry {j} is the same register");
                    let out_addr = reg == 0x4020;
                    assert!(a == b || listed.contains(&reg) || out_addr, "{c}: entry {j} (0x{reg:04x}) differs but is not listed");
                }
                top += d.rows;
            }
        }
    }
}

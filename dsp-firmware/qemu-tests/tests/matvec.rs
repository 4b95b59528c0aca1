//! Q8_0, Q4_0 and IQ4_NL matrix-vector (and multi-column) products run as Hexagon code
//! (`CMD_MATMUL`: keel-core's HVX Tiles32 kernels) under qemu-hexagon, on many shapes
//! and scratch sizes, against keel-core on the host, bit for bit:
//! - the DSP's Q8_0 activation bytes = `Kernels::reference().quantize_activations(Q8_0)`;
//! - its int32 block sums = host `tiles32::matvec(&Kernels::reference(), ..)`'s;
//! - its f32 outputs = host `tiles32::matvec`'s = `Kernels::reference().dot_fn(ty)` of
//!   each ggml weight row with the quantized column (the CPU's row dot).

use keel_core::quant::tiles32::ActBlock;
use keel_dsp_qemu_tests::expect::{self as e, Tiled};
use keel_dsp_qemu_tests::{
    activations, assert_same_bytes, assert_same_f32, assert_same_i32, bytes_f32, elf, ggml_weights, put, run_elf, words, Rng, CMD_MATMUL, MAGIC,
};
use keel_npu_hal::op::DType;

struct Case {
    t: DType,
    rows: usize,
    k: usize,
    cols: usize,
    scratch: usize,
}

fn check(c: &Case, seed: u64) {
    let mut rng = Rng(seed);
    let w = ggml_weights(c.t, c.rows, c.k, &mut rng);
    let x = activations(c.k * c.cols, &mut rng);
    check_with(c, &w, &x);
}

fn check_with(c: &Case, w: &[u8], x: &[f32]) {
    let (nb, rows) = (c.k / 32, c.rows);
    let mut req = MAGIC.to_vec();
    put(&mut req, &[CMD_MATMUL, u32::from(c.t.code()), rows as u32, c.k as u32, c.cols as u32, c.scratch as u32]);
    req.extend_from_slice(w);
    req.resize(req.len().next_multiple_of(4), 0);
    x.iter().for_each(|v| req.extend_from_slice(&v.to_le_bytes()));

    let resp = run_elf(&elf(), &req);
    let what = format!("{:?} rows={rows} k={} cols={} scratch={}", c.t, c.k, c.cols, c.scratch);
    assert_eq!(words(&resp[..4]).next(), Some(0), "status, {what}");
    let body = &resp[4..];
    let act_len = (c.cols * nb * 34).next_multiple_of(4);
    assert_eq!(body.len(), act_len + c.cols * (nb + 1) * rows * 4, "{what}");
    let sums: Vec<i32> = words(&body[act_len..]).take(c.cols * nb * rows).map(|w| w as i32).collect();
    let outs = bytes_f32(&body[act_len + c.cols * nb * rows * 4..]);
    let tiled = Tiled::new(c.t, rows, c.k, w);
    for col in 0..c.cols {
        let want_q = e::quantize_q8_0(&x[col * c.k..][..c.k]);
        assert_same_bytes(&body[col * nb * 34..][..nb * 34], &want_q, &format!("Q8_0 activation blocks of column {col}, {what}"));
        let (want_sums, want_out) = e::tiled_matvec(&tiled, &want_q);
        assert_same_i32(&sums[col * nb * rows..][..nb * rows], &want_sums, &format!("int32 block sums [block][row], column {col}, {what}"));
        let got = &outs[col * rows..][..rows];
        assert_same_f32(got, &want_out, &format!("outputs vs host tiles32::matvec, column {col}, {what}"));
        let cpu = e::row_dots(c.t, w, rows, c.k, &want_q);
        assert_same_f32(got, &cpu, &format!("outputs vs the CPU row dot (dot_fn), column {col}, {what}"));
    }
}

fn shapes(t: DType) -> Vec<Case> {
    let mut v = Vec::new();
    for (rows, k) in [(1, 32), (7, 64), (31, 96), (32, 32), (33, 128), (64, 256), (100, 160), (256, 512), (300, 1024), (96, 2048)] {
        v.push(Case { t, rows, k, cols: 1, scratch: 1 << 20 });
    }
    // Several columns (matrix-matrix), and scratch so small that row groups are
    // chunked (one group at a time; for Q8_0 below 1 KiB per group: the lane-by-lane
    // fallback through the block sums).
    v.push(Case { t, rows: 70, k: 192, cols: 3, scratch: 1 << 20 });
    let acts = 3 * 6 * std::mem::size_of::<ActBlock>();
    v.push(Case { t, rows: 70, k: 192, cols: 3, scratch: acts.next_multiple_of(128) + 128 });
    v.push(Case { t, rows: 200, k: 64, cols: 2, scratch: 1024 });
    // Room for two 32-row groups at a time (Q8_0: with their lane sums).
    v.push(Case { t, rows: 150, k: 96, cols: 1, scratch: 256 + 2 * 1024 + 128 });
    v
}

#[test]
fn q8_0_matvec_equals_keel_core() {
    for (i, c) in shapes(DType::Q8_0).iter().enumerate() {
        check(c, 0x5eed_0000 + i as u64);
    }
}

#[test]
fn q4_0_matvec_equals_keel_core() {
    for (i, c) in shapes(DType::Q4_0).iter().enumerate() {
        check(c, 0x4b1d_0000 + i as u64);
    }
}

#[test]
fn iq4_nl_matvec_equals_keel_core() {
    for (i, c) in shapes(DType::IQ4NL).iter().enumerate() {
        check(c, 0x1a4e_0000 + i as u64);
    }
}

/// Sums at the ends of their range and at zero (the HVX int32 → f32 conversion of the
/// scale pass: zero, both signs, the largest magnitudes): blocks whose quants are all
/// the extreme codes or all zero, against a column of zeros, one of alternating ±max
/// activations and a random one.
#[test]
fn extreme_and_zero_sums_equal_keel_core() {
    let mut rng = Rng(0xe7_7e3e);
    for t in [DType::Q8_0, DType::Q4_0, DType::IQ4NL] {
        let (rows, k, cols) = (70, 128, 3);
        let mut w = ggml_weights(t, rows, k, &mut rng);
        for (i, blk) in w.chunks_mut(t.block_bytes() as usize).enumerate() {
            let fill = [0x00, 0xff, 0x80, 0x7f, 0x88, 0x77][i % 7 % 6];
            if i % 7 != 6 {
                blk[2..].fill(fill);
            }
        }
        let mut x = vec![0.0f32; k * cols];
        x[k..2 * k].iter_mut().enumerate().for_each(|(j, v)| *v = if (j / 3) % 2 == 0 { 3.0 } else { -3.0 });
        x[2 * k..].copy_from_slice(&activations(k, &mut rng));
        check_with(&Case { t, rows, k, cols, scratch: 1 << 20 }, &w, &x);
    }
}

#[test]
fn too_little_scratch_is_an_error_not_a_crash() {
    let mut req = MAGIC.to_vec();
    put(&mut req, &[CMD_MATMUL, u32::from(DType::Q8_0.code()), 32, 32, 1, 64]);
    req.extend_from_slice(&[0u8; 32 * 34]);
    req.extend_from_slice(&[0u8; 128]);
    let resp = run_elf(&elf(), &req);
    assert_eq!(words(&resp).collect::<Vec<_>>(), vec![1 + 2], "OutOfMemory");
    // Truncated request (one activation missing), given enough scratch: Protocol.
    req[24..28].copy_from_slice(&(1u32 << 20).to_le_bytes());
    let resp = run_elf(&elf(), &req[..req.len() - 4]);
    assert_eq!(words(&resp).collect::<Vec<_>>(), vec![1 + 4], "Protocol");
}

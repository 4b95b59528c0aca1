//! Q8_0, Q4_0 and IQ4_NL matrix-vector (and multi-column) products run as Hexagon code
//! under qemu-hexagon, on many shapes and scratch sizes, against the scalar
//! reference: activation quantization, int32 block sums and f32 outputs must
//! all be bit-exact (same operations in the same order on IEEE binary32).

use keel_dsp_qemu_tests::reference::{self, ActBlock, WType};
use keel_dsp_qemu_tests::{elf, put, run_elf, words, Rng, CMD_MATMUL, MAGIC};

/// Random ggml weight rows: scales of both signs and many magnitudes.
fn weights(t: WType, rows: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let mut v = Vec::new();
    for _ in 0..rows * k / 32 {
        let d = rng.f32() * [1e-3, 0.02, 0.5, 4.0][(rng.u32() % 4) as usize];
        v.extend_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
        (0..t.block_bytes() - 2).for_each(|_| v.push(rng.u32() as u8));
    }
    v
}

/// Activations: random, with a zero block, integer ramps (rounding ties) and spikes.
fn activations(k: usize, cols: usize, rng: &mut Rng) -> Vec<f32> {
    (0..cols * k)
        .map(|i| match (i / 32) % 5 {
            1 if i / 32 == 1 => 0.0,
            2 => ((i % 32) as f32 - 16.0) * 0.25,
            3 if i % 7 == 0 => rng.f32() * 300.0,
            _ => rng.f32() * 3.0,
        })
        .collect()
}

struct Case {
    t: WType,
    rows: usize,
    k: usize,
    cols: usize,
    scratch: usize,
}

fn check(c: &Case, seed: u64) {
    let mut rng = Rng(seed);
    let (nb, rows) = (c.k / 32, c.rows);
    let w = weights(c.t, rows, c.k, &mut rng);
    let x = activations(c.k, c.cols, &mut rng);
    let mut req = MAGIC.to_vec();
    put(&mut req, &[CMD_MATMUL, c.t.code(), rows as u32, c.k as u32, c.cols as u32, c.scratch as u32]);
    req.extend_from_slice(&w);
    req.resize(req.len().next_multiple_of(4), 0);
    x.iter().for_each(|v| req.extend_from_slice(&v.to_le_bytes()));

    let resp = run_elf(&elf(), &req);
    let what = format!("{:?} rows={rows} k={} cols={} scratch={}", c.t, c.k, c.cols, c.scratch);
    assert_eq!(words(&resp[..4]).next(), Some(0), "status, {what}");
    let body = &resp[4..];
    let act_len = (c.cols * nb * 34).next_multiple_of(4);
    assert_eq!(body.len(), act_len + c.cols * (nb + 1) * rows * 4, "{what}");
    let sums: Vec<i32> = words(&body[act_len..]).take(c.cols * nb * rows).map(|w| w as i32).collect();
    let outs: Vec<u32> = words(&body[act_len + c.cols * nb * rows * 4..]).collect();
    for col in 0..c.cols {
        let acts: Vec<ActBlock> = x[col * c.k..][..c.k].chunks(32).map(reference::quantize_q8_0).collect();
        for (b, a) in acts.iter().enumerate() {
            let at = (col * nb + b) * 34;
            assert_eq!(&body[at..at + 34], &a.bytes()[..], "activation block {b} of column {col}, {what}");
        }
        let (want_sums, want_out) = reference::matvec(c.t, &w, rows, c.k, &acts);
        assert_eq!(&sums[col * nb * rows..][..nb * rows], &want_sums[..], "int32 block sums, column {col}, {what}");
        for (r, want) in want_out.iter().enumerate() {
            let got = outs[col * rows + r];
            assert_eq!(got, want.to_bits(), "row {r} col {col}: {} vs {want}, {what}", f32::from_bits(got));
        }
    }
}

fn shapes(t: WType) -> Vec<Case> {
    let mut v = Vec::new();
    for (rows, k) in [(1, 32), (7, 64), (31, 96), (32, 32), (33, 128), (64, 256), (100, 160), (256, 512), (300, 1024), (96, 2048)] {
        v.push(Case { t, rows, k, cols: 1, scratch: 1 << 20 });
    }
    // Several columns (matrix-matrix), and scratch so small that row groups are chunked.
    v.push(Case { t, rows: 70, k: 192, cols: 3, scratch: 1 << 20 });
    let acts: usize = 3 * 6 * 44; // size_of::<ActBlock>() in the firmware is 44
    v.push(Case { t, rows: 70, k: 192, cols: 3, scratch: acts.next_multiple_of(128) + 128 });
    v.push(Case { t, rows: 200, k: 64, cols: 2, scratch: 1024 });
    v
}

#[test]
fn q8_0_matvec_matches_reference() {
    for (i, c) in shapes(WType::Q8_0).iter().enumerate() {
        check(c, 0x5eed_0000 + i as u64);
    }
}

#[test]
fn q4_0_matvec_matches_reference() {
    for (i, c) in shapes(WType::Q4_0).iter().enumerate() {
        check(c, 0x4b1d_0000 + i as u64);
    }
}

#[test]
fn iq4_nl_matvec_matches_reference() {
    for (i, c) in shapes(WType::IQ4NL).iter().enumerate() {
        check(c, 0x1a4e_0000 + i as u64);
    }
}

#[test]
fn too_little_scratch_is_an_error_not_a_crash() {
    let mut req = MAGIC.to_vec();
    put(&mut req, &[CMD_MATMUL, WType::Q8_0.code(), 32, 32, 1, 64]);
    req.extend_from_slice(&[0u8; 32 * 34]);
    req.extend_from_slice(&[0u8; 128]);
    let resp = run_elf(&elf(), &req);
    assert_eq!(words(&resp).collect::<Vec<_>>(), vec![1 + 2], "OutOfMemory");
    // Truncated request (one activation missing), given enough scratch: Protocol.
    req[24..28].copy_from_slice(&(1u32 << 20).to_le_bytes());
    let resp = run_elf(&elf(), &req[..req.len() - 4]);
    assert_eq!(words(&resp).collect::<Vec<_>>(), vec![1 + 4]);
}

//! Attention's K·Q dots on the DSP (`Kernels::f16_dot_keys` of its HVX kernel set: the
//! hand-scheduled rows of 32 and 64, the compiled rows of other lengths) against keel-core's
//! reference on the host, bit for bit. The values span a wide range of magnitudes, so that
//! the products' sums round at every step of the reference's order (a dot whose partial
//! sums are exact would hide an order changed), with signed zeros, f16 subnormals and the
//! largest f16 among them. Every head length the models use (and some they do not), from
//! one key to odd and even counts, all keys in one call and in short runs.

use half::f16;
use keel_core::quant::Kernels;
use keel_dsp_qemu_tests::{elf, put, run_elf, words, Rng, CMD_DOT, MAGIC};

/// A value whose magnitude is `2^e`-scaled for `e` in -10..=10, or now and then a special.
fn wide(rng: &mut Rng) -> f16 {
    let r = rng.u32();
    match r % 53 {
        0 => f16::from_f32(0.0),
        1 => f16::from_f32(-0.0),
        2 => f16::from_bits(0x0001 | (r >> 16 & 0x8000) as u16), // ± the smallest subnormal
        3 => f16::from_bits(0x03ff), // the largest subnormal
        4 => f16::from_f32(if r & 64 == 0 { 65504.0 } else { -65504.0 }),
        _ => f16::from_f32(rng.f32() * (2.0f32).powi((r >> 8) as i32 % 21 - 10)),
    }
}

fn dsp_dots(n: usize, q: &[f16], keys: &[f16]) -> (Vec<f32>, Vec<f32>) {
    let nk = keys.len() / n;
    let mut req = MAGIC.to_vec();
    put(&mut req, &[CMD_DOT, n as u32, nk as u32]);
    q.iter().chain(keys).for_each(|h| req.extend_from_slice(&h.to_bits().to_le_bytes()));
    req.resize(req.len().next_multiple_of(4), 0);
    let resp = run_elf(&elf(), &req);
    assert_eq!(words(&resp[..4]).next(), Some(0), "status");
    let body: Vec<f32> = words(&resp[4..]).map(f32::from_bits).collect();
    assert_eq!(body.len(), 2 * nk, "response length");
    (body[..nk].to_vec(), body[nk..].to_vec())
}

#[test]
fn k_q_dots_on_the_dsp_equal_keel_core_for_every_head_length() {
    let mut rng = Rng(0xd07);
    let reference = Kernels::reference();
    let (mut order_matters, mut keys_seen) = (0, 0);
    let cases = [(64, 37), (32, 41), (64, 1), (32, 2), (32, 1), (128, 9), (256, 4), (16, 7), (48, 6), (80, 5), (96, 3), (1, 5), (33, 4), (65, 3)];
    // Each length twice: q as drawn, then q made positive (so the key of negative zeros
    // below has every product -0).
    for (n, nk, positive) in cases.iter().flat_map(|&(n, nk)| [(n, nk, false), (n, nk, true)]) {
        let q: Vec<f16> = (0..n).map(|_| wide(&mut rng)).map(|h| if positive { f16::from_bits(h.to_bits() & 0x7fff) } else { h }).collect();
        let mut keys: Vec<f16> = (0..n * nk).map(|_| wide(&mut rng)).collect();
        // One key of only negative zeros against a positive q: each product is -0, which the
        // reference's lanes (fma from +0) turn into +0.
        if nk > 2 {
            keys[n..2 * n].fill(f16::from_f32(-0.0));
        }
        let offs: Vec<usize> = (0..nk).map(|i| i * n).collect();
        let mut want = vec![0f32; nk];
        reference.f16_dot_keys(&keys, &offs, &q, &mut want);
        let (all, runs) = dsp_dots(n, &q, &keys);
        for (what, got) in [("all keys in one call", &all), ("keys in runs", &runs)] {
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "n={n} key {i} of {nk} ({what}): DSP {g:e}, keel-core {w:e}");
            }
        }
        // How many keys' dots another order of the same products changes (below).
        for (&o, w) in offs.iter().zip(&want) {
            let reordered = keys[o..o + n].iter().zip(&q).rev().fold(0f32, |s, (k, q)| s + k.to_f32() * q.to_f32());
            order_matters += (reordered.to_bits() != w.to_bits()) as usize;
            keys_seen += 1;
        }
    }
    // The data must make the order matter: were the dots exact in any order, a kernel
    // that summed in another order would pass.
    assert!(4 * order_matters > keys_seen, "only {order_matters} of {keys_seen} dots change in another order: the data cannot show an order changed");
}

//! Attention's K·Q dots and value updates on the DSP (`Kernels::f16_dot_keys` and
//! `f16_mad_keys` of its HVX kernel set: the hand-scheduled rows of 32 and 64, the compiled
//! rows of other lengths, the accumulator's plain rounding and its fallback) against
//! keel-core's reference on the host, bit for bit. The values span a wide range of magnitudes, so that
//! the products' sums round at every step of the reference's order (a dot whose partial
//! sums are exact would hide an order changed), with signed zeros, f16 subnormals and the
//! largest f16 among them. Every head length the models use (and some they do not), from
//! one key to odd and even counts, all keys in one call and in short runs.

use half::f16;
use keel_core::quant::Kernels;
use keel_dsp_qemu_tests::{elf, put, run_elf, words, Rng, CMD_DOT, CMD_MAD, MAGIC};

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

/// The accumulator after `f16_mad_keys` over all keys in one call, and over the same keys
/// in runs of calls.
fn dsp_mad(n: usize, y: &[f16], x: &[f16], new_max: &[bool], e: &[f32]) -> (Vec<u16>, Vec<u16>) {
    let nk = e.len();
    let mut req = MAGIC.to_vec();
    put(&mut req, &[CMD_MAD, n as u32, nk as u32]);
    put(&mut req, &e.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    put(&mut req, &new_max.iter().map(|&b| b as u32).collect::<Vec<_>>());
    y.iter().chain(x).for_each(|h| req.extend_from_slice(&h.to_bits().to_le_bytes()));
    req.resize(req.len().next_multiple_of(4), 0);
    let resp = run_elf(&elf(), &req);
    assert_eq!(words(&resp[..4]).next(), Some(0), "status");
    let body = &resp[4..];
    let padded = (2 * n).next_multiple_of(4);
    assert_eq!(body.len(), 2 * padded, "response length");
    let halves = |b: &[u8]| (0..n).map(|i| u16::from_le_bytes([b[2 * i], b[2 * i + 1]])).collect::<Vec<_>>();
    (halves(&body[..padded]), halves(&body[padded..]))
}

/// The value update in the accumulator's ranges: moderate values (every rounding a plain
/// one), values falling below 2^-14 (f16 subnormals: the call is redone with the full
/// conversions), and values rising to 65520 and past (to +inf), at every head length.
#[test]
fn value_updates_on_the_dsp_equal_keel_core_in_every_range() {
    let mut rng = Rng(0x3ad);
    let reference = Kernels::reference();
    let (mut subnormals, mut infinities) = (0, 0);
    for (n, nk) in [(64, 23), (32, 30), (64, 1), (32, 2), (128, 5), (16, 6), (48, 4), (80, 3), (96, 4), (33, 3)] {
        for range in ["moderate", "tiny", "huge"] {
            let (scale, exps): (f32, fn(&mut Rng) -> f32) = match range {
                "moderate" => (1.5, |r| 0.05 + 0.95 * (r.f32() * 0.5 + 0.5)),
                "tiny" => (1e-3, |r| (r.f32() * 0.5 + 0.5) * 1e-3),
                // Now and then a small exponent: a value past 65520 (infinity to the
                // reference) scaled back into range would show a rounding that missed it.
                _ => (3e4, |r| if r.u32() % 3 == 0 { 0.05 } else { 0.5 + r.f32().abs() }),
            };
            // Positive values where they may reach infinity: no inf - inf (NaN bits differ
            // between hosts, and attention's values never meet it).
            let val = |r: &mut Rng| {
                let v = r.f32() * scale;
                f16::from_f32(if range == "huge" { v.abs() } else { v })
            };
            let y: Vec<f16> = (0..n).map(|_| val(&mut rng)).collect();
            let x: Vec<f16> = (0..n * nk).map(|_| val(&mut rng)).collect();
            let e: Vec<f32> = (0..nk).map(|_| exps(&mut rng)).collect();
            let new_max: Vec<bool> = (0..nk).map(|i| i == 0 || rng.u32() % 4 == 0).collect();
            let offs: Vec<usize> = (0..nk).map(|i| i * n).collect();
            let mut want = y.clone();
            reference.f16_mad_keys(&mut want, &x, &offs, &new_max, &e);
            let want: Vec<u16> = want.iter().map(|h| h.to_bits()).collect();
            let (all, runs) = dsp_mad(n, &y, &x, &new_max, &e);
            assert_eq!(all, want, "n={n} keys={nk} {range} values, one call");
            assert_eq!(runs, want, "n={n} keys={nk} {range} values, runs of calls");
            let sub = want.iter().filter(|&&h| h & 0x7c00 == 0 && h & 0x3ff != 0).count();
            let inf = want.iter().filter(|&&h| h & 0x7fff == 0x7c00).count();
            match range {
                "tiny" => subnormals += sub,
                "huge" => infinities += inf,
                _ => assert!(sub == 0 && inf == 0, "n={n}: the moderate case left the normals"),
            }
        }
    }
    // The fallback's cases were met: results in the f16 subnormals and at infinity.
    assert!(subnormals > 0 && infinities > 0, "{subnormals} subnormal and {infinities} infinite results: the ranges were not reached");
}

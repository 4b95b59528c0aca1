//! Tests of the attention f16 accumulator (`Kernels::f16_mad`, `f16_scale`): every
//! kernel set — AVX2 (the f32 TwoSum / round-to-odd path), AVX-512 without FP16 (the
//! same arithmetic on 512-bit vectors, round-to-odd by per-instruction rounding),
//! AVX512-FP16 (the native
//! `vfmadd231ph`) where the CPU has it, NEON — against the scalar reference, bit for
//! bit, over every length up to 640 (tails that are not whole vectors or whole 128-element
//! steps) and over adversarial values: exact ties between f16 neighbours and values just
//! beside them, f16 subnormals in every operand, cancellation, sums that overflow to
//! infinity, infinite operands, and exponent gaps of up to 2^56 between `x·v` and `y`.
//! NaN operands are not compared: llama.cpp's attention never sees one in a finite
//! model, and NaN payloads differ between the instruction and the emulation.

extern crate std;
use std::{vec, vec::Vec};

use super::tests::Rng;
use super::*;
use half::f16;

/// The kernel sets to compare with the reference on this CPU (with and without
/// AVX512-FP16 on x86_64, so both exact paths run where the instruction exists).
/// `k`'s name, with "/f16-via-memory" where its AVX-512 value updates round through
/// memory (`Kernels::other_rounding`): the tests' and benchmarks' label of a set.
pub(super) fn label(k: &Kernels) -> std::string::String {
    #[cfg(target_arch = "x86_64")]
    if super::x86::rounds_via_memory(k.t) {
        return std::format!("{}/f16-via-memory", k.name());
    }
    k.name().into()
}

pub(super) fn kernel_sets() -> Vec<Kernels> {
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("f16c") {
        v.push(Kernels::new(Isa { avx2_fma: true, ..Isa::default() }));
        // AVX-512 without AVX512-FP16 (as Zen 4: F/BW/VL and VNNI), forced on any AVX-512 CPU.
        if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw") && std::is_x86_feature_detected!("avx512vl") {
            v.push(Kernels::new(Isa { avx2_fma: true, avx512: true, avx512_vnni: std::is_x86_feature_detected!("avx512vnni"), ..Isa::default() }));
        } else {
            std::println!("note: no AVX-512 on this CPU; its f16 kernels are not tested");
        }
        let fp16 = Kernels::new(Isa { avx2_fma: true, avx512: true, avx512_fp16: true, ..Isa::default() });
        if fp16.name() == "avx2+fp16" {
            v.push(fp16);
        } else {
            std::println!("note: no AVX512-FP16 on this CPU; its f16 path is not tested");
        }
    }
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("neon") {
        v.push(Kernels::new(Isa { neon: true, ..Isa::default() }));
    }
    // Every AVX-512 set again with its value updates' other f16 rounding form (memory or
    // register round trip, chosen by the CPU's vendor: the same bits).
    #[cfg(target_arch = "x86_64")]
    {
        let twins: Vec<Kernels> = v.iter().filter_map(Kernels::other_rounding).collect();
        v.extend(twins);
    }
    v
}

/// How many of `sets` ([`kernel_sets`]) have AVX-512: on an x86 CPU with AVX-512 F/BW/VL,
/// the set without AVX512-FP16, and the FP16 one where the CPU has AVX512-FP16 too.
fn avx512_sets(sets: &[Kernels]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw") && std::is_x86_feature_detected!("avx512vl") {
        return sets.iter().filter(|k| k.other_rounding().is_some()).count();
    }
    let _ = sets;
    0
}

/// A finite f16 with any sign and exponent (subnormals and the largest values included).
fn any_finite(rng: &mut Rng) -> f16 {
    loop {
        let h = f16::from_bits(rng.below(0x10000) as u16);
        if h.is_finite() {
            return h;
        }
    }
}

/// `y += x·v` by every kernel set and by the reference; panics at the first difference.
fn check_mad(sets: &[Kernels], y: &[f16], x: &[f16], v: f32, what: &str) {
    let reference = Kernels::reference();
    let mut want = y.to_vec();
    reference.f16_mad(&mut want, x, v);
    for k in sets {
        let mut got = y.to_vec();
        k.f16_mad(&mut got, x, v);
        for i in 0..y.len() {
            assert_eq!(
                got[i].to_bits(),
                want[i].to_bits(),
                "{} mad {what}: n={} i={i} x={} v={v} y={}: {} vs reference {}",
                k.name(),
                y.len(),
                x[i],
                y[i],
                got[i],
                want[i]
            );
        }
    }
}

#[test]
fn f16_mad_and_scale_match_reference_at_every_length() {
    let sets = kernel_sets();
    let reference = Kernels::reference();
    let mut rng = Rng::new(11);
    for n in 0..=640usize {
        let x: Vec<f16> = (0..n).map(|_| f16::from_f32(rng.unit() * 3.0)).collect();
        let y: Vec<f16> = (0..n).map(|_| f16::from_f32(rng.unit() * 8.0)).collect();
        let v = rng.unit() * 2.0;
        check_mad(&sets, &y, &x, v, "random");
        for k in &sets {
            let (mut a, mut b) = (y.clone(), y.clone());
            k.f16_scale(&mut a, v);
            reference.f16_scale(&mut b, v);
            assert_eq!(a, b, "{} scale n={n} v={v}", label(k));
        }
    }
}

#[test]
fn f16_mad_matches_reference_on_adversarial_values() {
    let sets = kernel_sets();
    let mut rng = Rng::new(12);
    let n = 512; // the native-f16 part for all but the last 0 elements
    let pow2 = |e: i32| libm::ldexpf(1.0, e);
    for round in 0..4000 {
        // v: ordinary, an f16 subnormal, tiny (rounds to 0 or the least subnormal), huge,
        // or exactly between two f16 (v's own rounding to f16 ties).
        let v = match round % 6 {
            0 => rng.unit() * 4.0,
            1 => any_finite(&mut rng).to_f32(),
            2 => pow2(-14 - rng.below(11) as i32) * (1.0 + rng.unit().abs()),
            3 => pow2(-25) * (1.0 + rng.unit()),
            4 => 60000.0 * rng.unit(),
            _ => {
                let h = any_finite(&mut rng);
                let next = f16::from_bits(h.to_bits() ^ 1);
                ((h.to_f64() + next.to_f64()) / 2.0) as f32
            }
        };
        let vh = f16::from_f32(v).to_f64();
        let mut x = vec![f16::ZERO; n];
        let mut y = vec![f16::ZERO; n];
        for i in 0..n {
            let xi = any_finite(&mut rng);
            let p = xi.to_f64() * vh; // exact
            let yi = match rng.below(8) {
                // Anything: gaps up to 2^56 between p and y both ways.
                0 | 1 => any_finite(&mut rng),
                // Cancellation: y next to -p.
                2 => f16::from_bits(f16::from_f64(-p).to_bits().wrapping_add(rng.below(5) as u16).wrapping_sub(2)),
                // y a few binades above or below p.
                3 => f16::from_f64(p * libm::ldexp(1.0, rng.below(30) as i32 - 15) * (1.0 + rng.unit() as f64)),
                // Subnormal y.
                4 => f16::from_bits((rng.below(0x400) as u16) | (rng.below(2) as u16) << 15),
                // Near the overflow threshold (65520 rounds to infinity).
                5 => f16::from_f64(65504.0 - p.abs() * rng.unit().abs() as f64).max(f16::from_f32(-65504.0)),
                // Infinite y.
                6 if rng.below(8) == 0 => if rng.below(2) == 0 { f16::INFINITY } else { f16::NEG_INFINITY },
                _ => f16::from_f32(rng.unit() * 16.0),
            };
            x[i] = xi;
            y[i] = if yi.is_nan() { f16::ZERO } else { yi };
        }
        check_mad(&sets, &y, &x, v, "adversarial");
    }
}

#[test]
fn f16_mad_matches_reference_at_ties() {
    // p = x·v16 exactly half an ulp of y (or an odd number of half ulps), one f16 step
    // of x beside that: ties to even and their neighbours; and (`sticky` rounds)
    // p = ±(1 - 2^-20)·ulp(y)/2, just beside a tie by far less than an f32 ulp of the sum.
    let sets = kernel_sets();
    let mut rng = Rng::new(13);
    let n = 256;
    for round in 0..4000 {
        let sticky = round % 2 == 1;
        let e_v = rng.below(20) as i32 - 14; // v16 = 2^e_v, normal f16
        let v = libm::ldexpf(if sticky { 1.0 - 1.0 / 1024.0 } else { 1.0 }, e_v);
        let mut x = vec![f16::ZERO; n];
        let mut y = vec![f16::ZERO; n];
        for i in 0..n {
            // y normal with exponent e_y, ulp 2^(e_y - 10); x·v = (2k+1)·2^(e_y - 11).
            let yb = (rng.below(0x7800) as u16 + 0x400) | (rng.below(2) as u16) << 15;
            let yi = f16::from_bits(yb);
            let e_y = ((yb >> 10) & 0x1F) as i32 - 15;
            let k = if sticky { 0.0 } else { rng.below(8) as f64 };
            let m = if sticky { 1.0 + 1.0 / 1024.0 } else { 2.0 * k + 1.0 };
            let mut xv = m * libm::ldexp(1.0, e_y - 11 - e_v);
            if rng.below(2) == 0 {
                xv = -xv;
            }
            let mut xi = f16::from_f64(xv);
            match if sticky { 3 } else { rng.below(4) } {
                0 => xi = f16::from_bits(xi.to_bits().wrapping_add(1)),
                1 => xi = f16::from_bits(xi.to_bits().wrapping_sub(1)),
                _ => {}
            }
            x[i] = if xi.is_nan() { f16::ONE } else { xi };
            y[i] = yi;
        }
        check_mad(&sets, &y, &x, v, "ties");
    }
}

#[test]
fn f16_mad_matches_reference_for_every_x() {
    // Every finite f16 x against a few y and v16 (subnormal, ordinary, huge).
    let sets = kernel_sets();
    let xs: Vec<f16> = (0..=0xFFFFu16).map(f16::from_bits).filter(|h| h.is_finite()).collect();
    let n = xs.len() - xs.len() % 128;
    let xs = &xs[..n];
    for &v in &[1.0f32, 0.3, -7.5e-6, 5.96e-8, 1024.5, -65504.0, 0.999] {
        for &y0 in &[0.0f32, -0.0, 1.0, -3.14, 6.1e-5, -2.4e-7, 65504.0, 1000.0] {
            let y = vec![f16::from_f32(y0); n];
            check_mad(&sets, &y, xs, v, "every x");
        }
    }
}

/// The chunked attention ops (`f16_dot_keys`, `softmax_sum`, `f16_mad_keys`: rows kept in registers
/// between keys for lengths up to 64) give the bits of the one-key ops, with the
/// reference's one-key ops as the measure: random chunks of up to 32 keys over a ring of
/// value rows, every pattern of new maxima, lengths that take each path (whole vectors up
/// to 64, odd lengths, 128 and beyond for the f16 path), values across the f16 range.
#[test]
fn chunked_attention_ops_match_one_key_at_a_time() {
    let reference = Kernels::reference();
    let sets = kernel_sets();
    let mut rng = Rng::new(0xc4a7);
    for &n in &[8usize, 16, 24, 32, 40, 64, 72, 128, 136, 256] {
        for round in 0..60 {
            let rows = 40;
            let stride = n + (round % 3) * 8;
            // Moderate values (attention-like), or any finite f16 every fourth round.
            let val = |rng: &mut Rng| if round % 4 == 3 { any_finite(rng) } else { f16::from_f32((rng.below(2001) as f32 - 1000.0) / 256.0) };
            let kv: Vec<f16> = (0..rows * stride).map(|_| val(&mut rng)).collect();
            let q: Vec<f16> = (0..n).map(|_| val(&mut rng)).collect();
            let y0: Vec<f16> = (0..n).map(|_| val(&mut rng)).collect();
            let len = 1 + rng.below(64) as usize;
            let offs: Vec<usize> = (0..len).map(|_| rng.below(rows as u64) as usize * stride).collect();
            let new_max: Vec<bool> = (0..len).map(|c| c == 0 || rng.below(4) == 0).collect();
            let e: Vec<f32> = (0..len).map(|_| (rng.below(1 << 20) as f32) / (1 << 20) as f32).collect();
            // One key at a time, reference kernels.
            let mut want_s = vec![0.0f32; len];
            for (c, &o) in offs.iter().enumerate() {
                want_s[c] = reference.f16_dot(&kv[o..o + n], &q);
            }
            let mut want_y = y0.clone();
            for (c, &o) in offs.iter().enumerate() {
                if new_max[c] {
                    reference.f16_scale(&mut want_y, e[c]);
                    reference.f16_mad(&mut want_y, &kv[o..o + n], 1.0);
                } else {
                    reference.f16_mad(&mut want_y, &kv[o..o + n], e[c]);
                }
            }
            let mut want_sum = 0.5f32;
            for c in 0..len {
                let (ms, vs) = if new_max[c] { (e[c], 1.0) } else { (1.0, e[c]) };
                want_sum = libm::fmaf(want_sum, ms, vs);
            }
            for k in sets.iter().chain([&reference]) {
                assert_eq!(k.softmax_sum(0.5, &new_max, &e).to_bits(), want_sum.to_bits(), "{} softmax_sum", label(k));
                let mut s = vec![f32::NAN; len];
                k.f16_dot_keys(&kv, &offs, &q, &mut s);
                let mut y = y0.clone();
                k.f16_mad_keys(&mut y, &kv, &offs, &new_max, &e);
                for c in 0..len {
                    assert_eq!(s[c].to_bits(), want_s[c].to_bits(), "{} dot n={n} round={round} key {c}", label(k));
                }
                for i in 0..n {
                    assert_eq!(y[i].to_bits(), want_y[i].to_bits(), "{} mad n={n} round={round} element {i}", label(k));
                }
            }
        }
    }
}

/// Asserts that a grouped value update left each of its `heads` rows of `n` in `y` and
/// running sums in `sums` with the bits of the reference's one-head update over the value
/// rows at `offs` in `kv` (`f16_mad_keys` from `y0`, `softmax_sum` from `sums0`); `what`
/// names the call in a failure.
#[allow(clippy::too_many_arguments)]
fn assert_update_per_head(what: &str, y: &[f16], sums: &[f32], y0: &[f16], sums0: &[f32], kv: &[f16], offs: &[usize], new_max: &[bool], e: &[f32], n: usize, heads: usize) {
    let reference = Kernels::reference();
    let len = offs.len();
    for h in 0..heads {
        let (nm, eh) = (&new_max[h * len..(h + 1) * len], &e[h * len..(h + 1) * len]);
        let mut want = y0[h * n..(h + 1) * n].to_vec();
        reference.f16_mad_keys(&mut want, kv, offs, nm, eh);
        for i in 0..n {
            assert_eq!(y[h * n + i].to_bits(), want[i].to_bits(), "{what}: update n={n} heads={heads} h={h} element {i}");
        }
        let want_sum = reference.softmax_sum(sums0[h], nm, eh);
        assert_eq!(sums[h].to_bits(), want_sum.to_bits(), "{what}: sum n={n} heads={heads} h={h}");
    }
}

/// The grouped chunk ops (`f16_dot_keys_heads`, `f16_mad_keys_heads`: up to four heads
/// over the same keys, each key and value row read once) give each head the bits of the
/// one-head ops (and each head's running sum that of `softmax_sum`), for every kernel
/// set, 1 to 4 heads, row lengths with and without the fast paths (64, 128 and 256; 32
/// without) and every pattern of new maxima, a key of zeros against negative queries
/// among them (each dot's products -0, its first step's sums +0).
#[test]
fn grouped_attention_ops_match_one_head_at_a_time() {
    let reference = Kernels::reference();
    let sets = kernel_sets();
    let mut rng = Rng::new(0x6a7d);
    for &n in &[64usize, 32, 128, 256] {
        for round in 0..80 {
            let heads = 1 + round % 4;
            let (rows, stride) = (24, n + (round % 3) * 8);
            let val = |rng: &mut Rng| if round % 5 == 4 { any_finite(rng) } else { f16::from_f32((rng.below(2001) as f32 - 1000.0) / 256.0) };
            let mut kv: Vec<f16> = (0..rows * stride).map(|_| val(&mut rng)).collect();
            let mut qs: Vec<f16> = (0..heads * n).map(|_| val(&mut rng)).collect();
            let y0: Vec<f16> = (0..heads * n).map(|_| val(&mut rng)).collect();
            // (Up to 100 keys: past the exact path's passes of 64.)
            let len = 1 + rng.below(100) as usize;
            let mut offs: Vec<usize> = (0..len).map(|_| rng.below(rows as u64) as usize * stride).collect();
            if round % 6 == 5 {
                // A key of zeros against negative queries: every product is -0, and the
                // dot's first step `fma(k, q, +0)` makes it +0.
                kv[..n].fill(f16::ZERO);
                qs.iter_mut().for_each(|q| *q = f16::from_bits(q.to_bits() | 0x8000));
                offs[len / 2] = 0;
            }
            let new_max: Vec<bool> = (0..heads * len).map(|i| i % len == 0 || rng.below(4) == 0).collect();
            let e: Vec<f32> = (0..heads * len).map(|_| (rng.below(1 << 20) as f32) / (1 << 20) as f32).collect();
            for k in sets.iter().chain([&reference]) {
                let mut s = vec![f32::NAN; heads * len];
                k.f16_dot_keys_heads(&kv, &offs, &qs, n, heads, &mut s);
                let mut y = y0.clone();
                let sums0: Vec<f32> = (0..heads).map(|h| 0.25 + h as f32).collect();
                let mut sums = sums0.clone();
                k.f16_mad_keys_heads(&mut y, n, heads, &kv, &offs, &new_max, &e, &mut sums);
                for h in 0..heads {
                    let mut want_s = vec![0.0f32; len];
                    reference.f16_dot_keys(&kv, &offs, &qs[h * n..(h + 1) * n], &mut want_s);
                    for c in 0..len {
                        assert_eq!(s[h * len + c].to_bits(), want_s[c].to_bits(), "{} dot n={n} heads={heads} h={h} key {c}", label(k));
                    }
                }
                assert_update_per_head(&label(k), &y, &sums, &y0, &sums0, &kv, &offs, &new_max, &e, n, heads);
            }
        }
    }
}

/// `f32_mad_keys_heads` (x86 with AVX-512: value rows of 64 already in f32, up to four
/// heads) gives each head the bits of the reference's one-head update over the f16 rows,
/// and each head's sum that of `softmax_sum`, for 1 to 8 heads (5 to 8 and rows of 128:
/// not taken), every pattern of new maxima, values over the whole finite f16 range
/// (overflows to infinities) among them; a call it does not take writes nothing.
#[test]
fn f32_value_update_matches_one_head_at_a_time() {
    let reference = Kernels::reference();
    let sets = kernel_sets();
    let mut rng = Rng::new(0xf32a);
    let mut taken = 0;
    for round in 0..160 {
        let (n, heads, rows) = (if round % 10 == 9 { 128 } else { 64 }, 1 + round % 8, 24);
        let val = |rng: &mut Rng| if round % 5 == 4 { any_finite(rng) } else { f16::from_f32((rng.below(2001) as f32 - 1000.0) / 256.0) };
        let kv: Vec<f16> = (0..rows * n).map(|_| val(&mut rng)).collect();
        let y0: Vec<f16> = (0..heads * n).map(|_| val(&mut rng)).collect();
        let len = 1 + rng.below(64) as usize;
        let offs: Vec<usize> = (0..len).map(|_| rng.below(rows as u64) as usize * n).collect();
        let mut xf = vec![0.0f32; len * n];
        reference.f16_rows_to_f32(&kv, &offs, n, &mut xf);
        let new_max: Vec<bool> = (0..heads * len).map(|i| i % len == 0 || rng.below(4) == 0).collect();
        let e: Vec<f32> = (0..heads * len).map(|_| (rng.below(1 << 20) as f32) / (1 << 20) as f32).collect();
        let sums0: Vec<f32> = (0..heads).map(|h| 0.25 + h as f32).collect();
        for k in sets.iter().chain([&reference]) {
            let (mut y, mut sums) = (y0.clone(), sums0.clone());
            if !k.f32_mad_keys_heads(&mut y, n, heads, &xf, &new_max, &e, &mut sums) {
                assert!(y == y0 && sums == sums0, "{}: wrote although it did not take {heads} heads of {n}", label(k));
                continue;
            }
            assert!(n == 64 && heads <= 4, "{} took {heads} heads of {n}", label(k));
            taken += 1;
            assert_update_per_head(&std::format!("{} round {round}", label(k)), &y, &sums, &y0, &sums0, &kv, &offs, &new_max, &e, n, heads);
        }
    }
    // Rows of 64 with 1 to 4 heads: 72 of the 160 rounds, for each AVX-512 set.
    let avx512_sets = avx512_sets(&sets);
    assert!(taken >= avx512_sets * 72, "only {taken} calls taken by {avx512_sets} AVX-512 sets");
}

/// `f16_dot_keys_queries` (x86 with AVX-512: keys transposed into the lanes, the dot's
/// lane sums and sum tree 16 keys at a time) gives every (query, head, key) the bits of
/// the reference's one-key dot, for 1 to 32 queries (33: not taken), 1 to 4 heads, 1 to 64 keys (whole
/// and partial groups of 16, repeated keys), rows of 64 and 128, with values over
/// the whole finite f16 range (products overflowing to infinities, sums to NaN); shapes
/// it does not take return `false` and leave `out` as it was.
#[test]
fn queries_dot_matches_each_query() {
    let reference = Kernels::reference();
    let sets = kernel_sets();
    let mut rng = Rng::new(0x9d07);
    let mut taken = 0;
    for &n in &[64usize, 128, 256, 32, 192] {
        for round in 0..60 {
            let (heads, queries) = (1 + round % 4, if round % 12 == 11 { 33 } else { 1 + rng.below(32) as usize });
            let (rows, stride) = (80, n + (round % 3) * 8);
            let val = |rng: &mut Rng| if round % 5 == 4 { any_finite(rng) } else { f16::from_f32((rng.below(2001) as f32 - 1000.0) / 256.0) };
            let mut kv: Vec<f16> = (0..rows * stride).map(|_| val(&mut rng)).collect();
            let mut qs: Vec<f16> = (0..queries * heads * n).map(|_| val(&mut rng)).collect();
            if round % 6 == 5 {
                // A key of zeros against negative queries: every product is -0, and the
                // dot's first step `fma(k, q, +0)` makes it +0.
                kv[..n].fill(f16::ZERO);
                qs.iter_mut().for_each(|q| *q = f16::from_bits(q.to_bits() | 0x8000));
            }
            let len = if round % 10 == 9 { 65 } else { 1 + rng.below(64) as usize };
            let mut offs: Vec<usize> = (0..len).map(|_| rng.below(rows as u64) as usize * stride).collect();
            offs[len / 2] = 0;
            let fits = matches!(n, 64 | 128) && len <= 64 && queries <= 32;
            for k in sets.iter().chain([&reference]) {
                let mut s = vec![f32::from_bits(0x7fc0_1234); queries * heads * len];
                if !k.f16_dot_keys_queries(&kv, &offs, &qs, n, heads, queries, &mut s) {
                    assert!(s.iter().all(|v| v.to_bits() == 0x7fc0_1234), "{}: wrote although it did not take n={n}", label(k));
                    continue;
                }
                assert!(fits, "{} took n={n} with {len} keys", label(k));
                taken += 1;
                for j in 0..queries {
                    for h in 0..heads {
                        let mut want = vec![0.0f32; len];
                        let q = &qs[(j * heads + h) * n..(j * heads + h + 1) * n];
                        reference.f16_dot_keys(&kv, &offs, q, &mut want);
                        for c in 0..len {
                            assert_eq!(s[(j * heads + h) * len + c].to_bits(), want[c].to_bits(), "{} n={n} query {j}/{queries} head {h}/{heads} key {c}/{len}", label(k));
                        }
                    }
                }
            }
        }
    }
    // (The AVX-512 sets take every shape that fits: about 50 rounds each of rows of 64
    // and 128.)
    let avx512_sets = avx512_sets(&sets);
    assert!(taken >= avx512_sets * 2 * 50, "only {taken} calls taken by {avx512_sets} AVX-512 sets");
}

/// `f16_keys_transposed` + `f32_dot_transposed` (x86 with AVX-512: one query's scores
/// against a chunk's keys transposed once) give every (head, key) the bits of the
/// reference's one-key dot, and `f32_mad_keys_heads_dot` (the value update of one query
/// that computes another's scores meanwhile) gives both the update's bits (each head's
/// row and running sum) and the dot's, for 1 to 4 heads (5: not taken), 1 to 64 keys
/// (65, and rows of 128: not taken; nothing written), 0 to 64 value rows, values over the
/// whole finite f16 range and a key of zeros against negative queries among them.
#[test]
fn transposed_dot_and_fused_update_match_each_query() {
    let reference = Kernels::reference();
    let sets = kernel_sets();
    let mut rng = Rng::new(0x7d0f);
    let mut taken = 0;
    const UNSET: u32 = 0x7fc0_4321;
    for round in 0..240 {
        let n = if round % 16 == 15 { 128 } else { 64 };
        let heads = 1 + round % 5;
        let rows = 80;
        let val = |rng: &mut Rng| if round % 5 == 3 { any_finite(rng) } else { f16::from_f32((rng.below(2001) as f32 - 1000.0) / 256.0) };
        let mut kv: Vec<f16> = (0..rows * n).map(|_| val(&mut rng)).collect();
        let mut qs: Vec<f16> = (0..2 * heads * n).map(|_| val(&mut rng)).collect();
        if round % 6 == 5 {
            kv[..n].fill(f16::ZERO);
            qs.iter_mut().for_each(|q| *q = f16::from_bits(q.to_bits() | 0x8000));
        }
        let keys = if round % 20 == 19 { 65 } else { 1 + rng.below(64) as usize };
        let mut offs: Vec<usize> = (0..keys).map(|_| rng.below(rows as u64) as usize * n).collect();
        offs[keys / 2] = 0;
        // The update's own value rows (another part of the cache), exponents and flags.
        let len = rng.below(65) as usize;
        let voffs: Vec<usize> = (0..len).map(|_| rng.below(rows as u64) as usize * n).collect();
        let mut xf = vec![0.0f32; len * n];
        reference.f16_rows_to_f32(&kv, &voffs, n, &mut xf);
        let new_max: Vec<bool> = (0..heads * len).map(|i| i % len == 0 || rng.below(4) == 0).collect();
        let e: Vec<f32> = (0..heads * len).map(|_| (rng.below(1 << 20) as f32) / (1 << 20) as f32).collect();
        let y0: Vec<f16> = (0..heads * n).map(|_| val(&mut rng)).collect();
        let sums0: Vec<f32> = (0..heads).map(|h| 0.25 + h as f32).collect();
        let want = |q: &[f16]| {
            let mut w = vec![0.0f32; heads * keys];
            for h in 0..heads {
                reference.f16_dot_keys(&kv, &offs, &q[h * n..(h + 1) * n], &mut w[h * keys..(h + 1) * keys]);
            }
            w
        };
        let (want0, want1) = (want(&qs[..heads * n]), want(&qs[heads * n..]));
        for k in sets.iter().chain([&reference]) {
            let mut kt = vec![f32::from_bits(UNSET); 64 * 64];
            if !k.f16_keys_transposed(&kv, &offs, n, &mut kt) {
                assert!(kt.iter().all(|v| v.to_bits() == UNSET), "{}: transposed although it did not take {keys} keys of {n}", label(k));
                continue;
            }
            assert!(n == 64 && keys <= 64, "{} transposed {keys} keys of {n}", label(k));
            let mut out = vec![f32::from_bits(UNSET); heads * keys];
            let took = k.f32_dot_transposed(heads, KeysDot { kt: &kt, keys, qs: &qs[..heads * n], out: &mut out });
            assert_eq!(took, heads <= 4, "{}: dot of {heads} heads", label(k));
            let (mut y, mut sums, mut out1) = (y0.clone(), sums0.clone(), vec![f32::from_bits(UNSET); heads * keys]);
            let fused = k.f32_mad_keys_heads_dot(&mut y, n, heads, &xf, &new_max, &e, &mut sums, KeysDot { kt: &kt, keys, qs: &qs[heads * n..], out: &mut out1 });
            assert_eq!(fused, heads <= 4, "{}: fused update of {heads} heads", label(k));
            if !took {
                assert!(out.iter().chain(&out1).all(|v| v.to_bits() == UNSET) && y == y0 && sums == sums0, "{}: wrote although it did not take {heads} heads", label(k));
                continue;
            }
            taken += 1;
            for i in 0..heads * keys {
                assert_eq!(out[i].to_bits(), want0[i].to_bits(), "{} round {round} dot head {} key {} of {keys}", label(k), i / keys, i % keys);
                assert_eq!(out1[i].to_bits(), want1[i].to_bits(), "{} round {round} fused dot head {} key {} of {keys}", label(k), i / keys, i % keys);
            }
            assert_update_per_head(&std::format!("{} round {round} fused", label(k)), &y, &sums, &y0, &sums0, &kv, &voffs, &new_max, &e, n, heads);
        }
    }
    // Rows of 64, up to 64 keys and 4 heads: about 135 of the 240 rounds, per set with
    // these kernels (the AVX-512 sets that round through registers: on an Intel CPU the
    // twin of its own set; `x86::build`).
    let with = sets.iter().filter(|k| k.f16_keys_transposed(&[f16::ZERO; 64], &[0], 64, &mut [0.0; 64 * 64])).count();
    assert!(with >= avx512_sets(&sets).min(1), "no AVX-512 set has the transposed K·Q");
    assert!(taken >= with * 120, "only {taken} calls taken by {with} sets");
}

/// `softmax_scores` (x86 with AVX-512: a prefix maximum over 16 keys, up to four heads
/// side by side) gives the one-key loop's new-maximum flags and the bits of `expf` of
/// every exponent, and the same running maxima, for 1 to 5 heads over chunks of 1 to 40
/// keys carried from one to the next, with ties, signed zeros, infinities and NaN scores.
#[test]
fn softmax_scores_match_the_key_by_key_loop() {
    let reference = Kernels::reference();
    let mut sets = kernel_sets();
    sets.push(Kernels::new(Isa { avx2_fma: true, avx512: true, ..Isa::default() }));
    let mut rng = Rng::new(0x5c07e);
    for round in 0..3000 {
        let scale = if round % 7 == 0 { 1.0 } else { 0.125 + rng.unit().abs() };
        let heads = 1 + round as usize % 5;
        let chunks: Vec<Vec<f32>> = (0..1 + rng.below(4))
            .map(|_| {
                (0..heads * (1 + rng.below(40) as usize))
                    .map(|_| match rng.below(12) {
                        0 => 0.0,
                        1 => -0.0,
                        2 => f32::NAN,
                        3 => f32::NEG_INFINITY,
                        4 => f32::INFINITY,
                        5 => 2.0,
                        _ => rng.unit() * (1 + round % 9) as f32 * 4.0,
                    })
                    .collect()
            })
            .collect();
        for k in &sets {
            let (mut max, mut want_max) = (vec![f32::NEG_INFINITY; heads], vec![f32::NEG_INFINITY; heads]);
            for (ci, chunk) in chunks.iter().enumerate() {
                let (mut e, mut want_e) = (chunk.clone(), chunk.clone());
                // One flag more than the scores: a kernel writing past its rows is caught.
                let (mut nm, mut want_nm) = (vec![true; chunk.len() + 1], vec![true; chunk.len() + 1]);
                k.softmax_scores(&mut e, &mut nm, scale, &mut max);
                for ((e, nm), m) in want_e.chunks_exact_mut(chunk.len() / heads).zip(want_nm.chunks_exact_mut(chunk.len() / heads)).zip(want_max.iter_mut()) {
                    reference.softmax_scores(e, nm, scale, core::slice::from_mut(m));
                }
                assert_eq!(nm, want_nm, "{} round {round} chunk {ci}: new-maximum flags", label(k));
                for c in 0..chunk.len() {
                    let (got, want) = (crate::ops::expf(e[c]), crate::ops::expf(want_e[c]));
                    assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{} round {round} chunk {ci} key {c}: {got} vs {want}", label(k));
                }
                for (h, (m, w)) in max.iter().zip(&want_max).enumerate() {
                    assert!(m == w || (m.is_nan() && w.is_nan()), "{} round {round} chunk {ci} head {h}: max {m} vs {w}", label(k));
                }
            }
        }
    }
}

/// The grouped value update's exact path on a sum where rounding to f32 first lands on an
/// f16 midpoint below f16's normal range (a double-rounding trap that the f16-normal
/// midpoint test alone would miss): `y = 17·2^-24`, `x = (1 + 2^-10)·2^-14`,
/// `e = (1 - 2^-10)·2^-11`, so `x·e + y = 17.5·2^-24 - 2^-45`, one rounding gives
/// `17·2^-24` and two (f32, then f16 to even) `18·2^-24`; every kernel set, 1 to 4 heads,
/// rows of 128 and 256, keys with and without a new maximum.
#[test]
fn grouped_value_update_rounds_once_below_f16_normals() {
    let (y0, x0, e0) = (f16::from_bits(17), f16::from_bits(0x0401), f16::from_f32((1.0 - 1.0 / 1024.0) / 2048.0));
    assert_eq!(e0.to_f32(), (1.0 - 1.0 / 1024.0) / 2048.0);
    let twice = f16::from_f32(libm::fmaf(x0.to_f32(), e0.to_f32(), y0.to_f32()));
    // (The reference's native-path single rounding: f16_from_f64 of the f64 fma.)
    let single = f16ops::f16_from_f64(libm::fma(x0.to_f64(), e0.to_f64(), y0.to_f64()));
    assert_eq!((single.to_bits(), twice.to_bits()), (17, 18), "not a double-rounding case");
    let reference = Kernels::reference();
    for n in [128usize, 256] {
        for heads in 1..=4usize {
            let len = 3;
            let kv = vec![x0; 2 * n];
            let offs = [0, n, 0];
            let new_max: Vec<bool> = (0..heads * len).map(|i| i % len == 0 && i / len % 2 == 1).collect();
            let e = vec![e0.to_f32(); heads * len];
            for k in kernel_sets() {
                let mut y = vec![y0; heads * n];
                let mut sums = vec![1.0f32; heads];
                k.f16_mad_keys_heads(&mut y, n, heads, &kv, &offs, &new_max, &e, &mut sums);
                for h in 0..heads {
                    let mut want = vec![y0; n];
                    reference.f16_mad_keys(&mut want, &kv, &offs, &new_max[h * len..(h + 1) * len], &e[h * len..(h + 1) * len]);
                    for i in 0..n {
                        assert_eq!(y[h * n + i].to_bits(), want[i].to_bits(), "{} n={n} heads={heads} h={h} element {i}", label(&k));
                    }
                }
            }
        }
    }
}

/// The grouped value update finds a double-rounding trap at any key of a run, in any head
/// and element: one key of a run of up to 100 (the keys before it leave every accumulator
/// as it is, the keys after it are random) adds to one element of one head
/// `x·e = (1 - 2^-20)·ulp(y)/2` with `y`'s sign, `y` an f16 with an odd significand:
/// rounded to f32 first the sum is the f16 midpoint and goes to even (away from `y`),
/// rounded once it stays `y`. Every kernel set, 1 to 4 heads, rows of 128 and 256, against
/// the reference (the AVX2 update takes a key's steps unchecked and takes the key again
/// checked only where some sum of it may have rounded twice).
#[test]
fn grouped_value_update_finds_each_double_rounding_trap() {
    let reference = Kernels::reference();
    let sets = kernel_sets();
    let mut rng = Rng::new(0xd0_0b1e);
    for round in 0..400 {
        let n = if round % 2 == 0 { 256 } else { 128 };
        let heads = 1 + round / 2 % 4;
        let len = 1 + rng.below(100) as usize;
        let (trap, th, ti) = (rng.below(len as u64) as usize, rng.below(heads as u64) as usize, rng.below(n as u64) as usize);
        // Accumulators: normal f16 with odd significands, exponents -8..=8, either sign.
        let y0: Vec<f16> = (0..heads * n).map(|_| f16::from_bits((rng.below(17) as u16 + 7) << 10 | (rng.below(512) as u16) << 1 | 1 | (rng.below(2) as u16) << 15)).collect();
        let y = y0[th * n + ti];
        let e_y = ((y.to_bits() >> 10) & 0x1f) as i32 - 15;
        // v = (1 - 2^-10)·2^e_v a normal f16 at most 1, x's exponent e_y - 11 - e_v at least -14.
        let e_v = -14 + rng.below(((e_y + 3).min(-1) + 15) as u64) as i32;
        let v = libm::ldexpf(1.0 - 1.0 / 1024.0, e_v);
        let xt = f16::from_f32(libm::ldexpf(1.0 + 1.0 / 1024.0, e_y - 11 - e_v).copysign(y.to_f32()));
        let single = f16ops::f16_from_f64(libm::fma(xt.to_f64(), v as f64, y.to_f64()));
        let twice = f16::from_f32(libm::fmaf(xt.to_f32(), v, y.to_f32()));
        assert!(single == y && twice != y, "round {round}: not a double-rounding trap ({y} + {xt}·{v})");
        // Value rows: key c's row at c·n; the trap key's row is zero but for the trap.
        let mut kv: Vec<f16> = (0..len * n).map(|_| f16::from_f32((rng.below(2001) as f32 - 1000.0) / 512.0)).collect();
        kv[trap * n..(trap + 1) * n].fill(f16::ZERO);
        kv[trap * n + ti] = xt;
        let offs: Vec<usize> = (0..len).map(|c| c * n).collect();
        // Scores: 0 before the trap key, its `v` there for the trap's head, random
        // elsewhere; new maxima only after it.
        let e: Vec<f32> = (0..heads * len).map(|i| match (i / len, i % len) {
            (_, c) if c < trap => 0.0,
            (h, c) if c == trap && h == th => v,
            _ => rng.below(1 << 11) as f32 / (1 << 11) as f32,
        }).collect();
        let new_max: Vec<bool> = (0..heads * len).map(|i| i % len > trap && rng.below(8) == 0).collect();
        let sums0 = vec![1.0f32; heads];
        for k in sets.iter().chain([&reference]) {
            let (mut got, mut sums) = (y0.clone(), sums0.clone());
            k.f16_mad_keys_heads(&mut got, n, heads, &kv, &offs, &new_max, &e, &mut sums);
            assert_update_per_head(&std::format!("{} round {round} trap key {trap}/{len} head {th} element {ti}", label(k)), &got, &sums, &y0, &sums0, &kv, &offs, &new_max, &e, n, heads);
        }
    }
}

/// The grouped value update on keys whose multiplier `f16(e)` is a power of two or 0 (the
/// AVX2 update does not watch their sums: exact, or no f16 midpoint) mixed with keys whose
/// multiplier has two or three significant bits (watched), and new maxima (multiplier 1):
/// values and accumulators of 1 to 11 significant bits over exponents -24..=4 (f16
/// subnormals among them), so that sums land on f16 midpoints, exactly and not, at
/// every exponent distance and below f16's normal range. Every kernel set, 1 to 4 heads,
/// rows of 128 and 256, against the reference.
#[test]
fn grouped_value_update_power_of_two_multipliers() {
    let sets = kernel_sets();
    let mut rng = Rng::new(0x2_0f_20);
    let few_bits = |rng: &mut Rng| {
        let bits = 1 + rng.below(11) as i32;
        let sig = (1u32 << (bits - 1)) | rng.below(1 << (bits - 1)) as u32;
        let v = libm::ldexpf(sig as f32, -24 + rng.below(29) as i32 - bits + 1);
        f16::from_f32(if rng.below(2) == 0 { v } else { -v })
    };
    let mut exempt = 0usize;
    for round in 0..240 {
        let n = if round % 2 == 0 { 256 } else { 128 };
        let heads = 1 + round / 2 % 4;
        let len = 1 + rng.below(100) as usize;
        let y0: Vec<f16> = (0..heads * n).map(|_| few_bits(&mut rng)).collect();
        let kv: Vec<f16> = (0..len * n).map(|_| few_bits(&mut rng)).collect();
        let offs: Vec<usize> = (0..len).map(|c| c * n).collect();
        // 2^-k (k up to 26: f16 subnormals and 0 among them), or (1 + 2^-a)·2^-k, or
        // (1 + 2^-a + 2^-b)·2^-k.
        let e: Vec<f32> = (0..heads * len).map(|_| {
            let k = -(rng.below(27) as i32);
            let (a, b) = (1 + rng.below(9) as i32, 11 - rng.below(2) as i32);
            let m = match rng.below(3) {
                0 => 1.0,
                1 => 1.0 + libm::ldexpf(1.0, -a),
                _ => 1.0 + libm::ldexpf(1.0, -a) + libm::ldexpf(1.0, -b),
            };
            libm::ldexpf(m, k)
        }).collect();
        exempt += e.iter().filter(|&&v| f16::from_f32(v).to_f32().to_bits() & 0x7f_ffff == 0).count();
        let new_max: Vec<bool> = (0..heads * len).map(|i| i % len == 0 || rng.below(8) == 0).collect();
        let sums0 = vec![1.0f32; heads];
        for k in sets.iter().chain([&Kernels::reference()]) {
            let (mut got, mut sums) = (y0.clone(), sums0.clone());
            k.f16_mad_keys_heads(&mut got, n, heads, &kv, &offs, &new_max, &e, &mut sums);
            assert_update_per_head(&std::format!("{} round {round}", label(k)), &got, &sums, &y0, &sums0, &kv, &offs, &new_max, &e, n, heads);
        }
    }
    assert!(exempt > 1000, "only {exempt} power-of-two multipliers");
    // Where a multiplier of two bits must be watched: `x·0.75 = 1.5 + 2^-10 + 2^-11` (12
    // bits, an f16 midpoint) plus `y = -2^-24` rounds to f32 first onto the midpoint (a
    // tie, to even) and from there up; once, down to `1.5 + 2^-10`.
    let (y0, x0, e0) = (f16::from_bits(0x8001), f16::from_bits(0x4001), 0.75f32);
    let single = f16ops::f16_from_f64(libm::fma(x0.to_f64(), e0 as f64, y0.to_f64()));
    let twice = f16::from_f32(libm::fmaf(x0.to_f32(), e0, y0.to_f32()));
    assert_eq!((single.to_f32(), twice.to_f32()), (1.5 + 1.0 / 1024.0, 1.5 + 2.0 / 1024.0), "not a double-rounding case");
    for n in [128usize, 256] {
        for heads in 1..=4usize {
            let (kv, offs) = (vec![x0; n], [0usize]);
            let (y0, e, new_max, sums0) = (vec![y0; heads * n], vec![e0; heads], vec![false; heads], vec![1.0f32; heads]);
            for k in sets.iter().chain([&Kernels::reference()]) {
                let (mut got, mut sums) = (y0.clone(), sums0.clone());
                k.f16_mad_keys_heads(&mut got, n, heads, &kv, &offs, &new_max, &e, &mut sums);
                assert_update_per_head(&std::format!("{} two-bit multiplier", label(k)), &got, &sums, &y0, &sums0, &kv, &offs, &new_max, &e, n, heads);
            }
        }
    }
}

/// A KV cache of `n_kvh` KV heads of `hd` for positions `0 ..= past + nq - 1` (a ring of
/// `window` slots when windowed, as keel's sliding-window cache) and `nq × nh` query rows,
/// from `rng` (keys and queries times `big`): `(rows, row stride, keys, values, queries)`.
pub(super) fn random_attention(rng: &mut Rng, (hd, n_kvh, nh, nq): (usize, usize, usize, usize), window: usize, past: usize, big: f32) -> (usize, usize, Vec<f16>, Vec<f16>, Vec<f32>) {
    let rows = if window > 0 { window } else { past + nq };
    let stride = n_kvh * hd;
    let kc = (0..rows * stride).map(|_| f16::from_f32(rng.unit() * big)).collect();
    let vc = (0..rows * stride).map(|_| f16::from_f32(rng.unit())).collect();
    let q = (0..nq * nh * hd).map(|_| rng.unit() * big).collect();
    (rows, stride, kc, vc, q)
}

/// `attention::attend_block` gives every query of a block the bits of `attend_heads`
/// for that query alone (the one-query arithmetic), for every kernel set and the
/// reference: head sizes with and without the fast paths, 1 to 4 heads, blocks of 1 to
/// `QBLOCK` queries, causal spans from 0 and sliding windows (spans starting at different
/// positions, so the block's chunks cut each query's keys elsewhere than its own would),
/// a ring cache that wraps, and scores large enough that new maxima come late.
#[test]
fn blocked_attention_matches_one_query_at_a_time() {
    use crate::attention::{attend_block, attend_heads, KeySpan, MAX_HEADS, QBLOCK};
    let mut sets = kernel_sets();
    sets.push(Kernels::reference());
    let mut rng = Rng::new(0xb10c);
    for &hd in &[64usize, 128, 256, 48] {
        for round in 0..12 {
            let nh = 1 + round % MAX_HEADS;
            let nq = 1 + rng.below(QBLOCK as u64) as usize;
            let n_kvh = 2;
            let kvh = round % n_kvh;
            // Positions 0 ..= past + nq - 1; with a window, a ring of `window` slots (as keel's
            // sliding-window cache), else one slot per position.
            let window = [0usize, 37, 64, 100][round % 4];
            let past = rng.below(200) as usize;
            let big = if round % 3 == 2 { 8.0 } else { 1.0 };
            let (rows, stride, kc, vc, q) = random_attention(&mut rng, (hd, n_kvh, nh, nq), window, past, big);
            let span = |j: usize| {
                let pos = past + j;
                let first = if window > 0 { (pos + 1).saturating_sub(window) } else { 0 };
                KeySpan { len: pos + 1 - first, first_slot: first, ring: rows, k_base: kvh * hd, k_stride: stride, v_base: kvh * hd, v_stride: stride }
            };
            for k in &sets {
                let (mut qh, mut acc) = (vec![f16::ZERO; QBLOCK * nh * hd], vec![f16::ZERO; QBLOCK * nh * hd]);
                let mut got = vec![f32::NAN; nq * nh * hd];
                {
                    let mut rows_out: Vec<&mut [f32]> = got.chunks_exact_mut(nh * hd).collect();
                    let mut outs = rows_out.iter_mut().map(|r| &mut **r);
                    attend_block(k, (hd, hd, nh), &kc, &vc, 0.125, nq, |j| (&q[j * nh * hd..(j + 1) * nh * hd], span(j)), &mut qh, &mut acc, |_| outs.next().unwrap());
                }
                for j in 0..nq {
                    let mut want = vec![f32::NAN; nh * hd];
                    attend_heads(k, &q[j * nh * hd..(j + 1) * nh * hd], hd, hd, &kc, &vc, span(j), 0.125, &mut qh, &mut acc, &mut want);
                    for (i, (g, w)) in got[j * nh * hd..(j + 1) * nh * hd].iter().zip(&want).enumerate() {
                        assert_eq!(g.to_bits(), w.to_bits(), "{} hd={hd} heads={nh} window={window} query {j} of {nq} element {i}", label(k));
                    }
                }
            }
        }
    }
}

/// `tiled_step_heads` gives every head the bits of the reference's `tiled_step` for that
/// row alone: 1 to 4 heads, key and value sizes with and without whole vectors, random
/// visible ranges and running states (a first tile, later tiles with and without a new
/// maximum), and a head whose every score is -inf (no visible key: its state must stay
/// untouched while the others update).
#[test]
fn tiled_step_heads_give_each_row_the_steps_bits() {
    use crate::attn_tiled::{TiledRow, TILE};
    let reference = Kernels::reference();
    let mut sets = kernel_sets();
    sets.push(Kernels::reference());
    let mut rng = Rng::new(0x4ead);
    let mut f = |scale: f32| (rng.next() as u32 as f32 / u32::MAX as f32 * 2.0 - 1.0) * scale;
    for (round, &(hd, hdv)) in [(64usize, 64usize), (256, 256), (48, 80), (128, 200)].iter().cycle().take(40).enumerate() {
        let nh = 1 + round % 4;
        let mut kt: Vec<f32> = (0..hd * TILE).map(|_| f(1.0)).collect();
        let vt: Vec<f32> = (0..TILE * hdv).map(|_| f(2.0)).collect();
        let mut qs: Vec<f32> = (0..nh * hd).map(|_| f(1.5)).collect();
        let (lo, hi) = match round % 4 {
            0 => (0, TILE),
            1 => (round % 7, TILE - round % 5),
            2 => (0, 1 + round % 63),
            _ => (round % 60, round % 60 + 1),
        };
        // Head 1 of every fifth round sees only -inf scores (-3e38·4 overflows, then
        // fma(k, 0, -inf) keeps it).
        if round % 5 == 3 && nh > 1 {
            for d in 0..hd {
                qs[hd + d] = if d == 0 { -3.0e38 } else { 0.0 };
            }
            kt[..TILE].fill(4.0);
        }
        let accs0: Vec<f32> = (0..nh * hdv).map(|_| if round % 3 == 0 { 0.0 } else { f(3.0) }).collect();
        let ms0: Vec<f32> = (0..nh).map(|h| if round % 3 == 0 { f32::NEG_INFINITY } else if h % 2 == 0 { f(0.5) } else { 40.0 }).collect();
        let ss0: Vec<f32> = (0..nh).map(|_| if round % 3 == 0 { 0.0 } else { 1.0 + f(0.5).abs() }).collect();
        let (mut wa, mut wm, mut ws) = (accs0.clone(), ms0.clone(), ss0.clone());
        let mut kq = vec![f32::NAN; 4 * TILE];
        for h in 0..nh {
            let row = TiledRow { acc: &mut wa[h * hdv..(h + 1) * hdv], m: &mut wm[h], s: &mut ws[h] };
            reference.tiled_step(&qs[h * hd..(h + 1) * hd], &kt, &vt, &mut kq[..TILE], lo, hi, 0.125, row);
        }
        if round % 5 == 3 && nh > 1 {
            assert_eq!((wm[1].to_bits(), ws[1].to_bits()), (ms0[1].to_bits(), ss0[1].to_bits()), "the -inf head's state changed");
        }
        for k in &sets {
            let (mut ga, mut gm, mut gs) = (accs0.clone(), ms0.clone(), ss0.clone());
            let mut kq = vec![f32::NAN; 4 * TILE];
            k.tiled_step_heads(&qs, &kt, &vt, &mut kq, lo, hi, 0.125, &mut ga, &mut gm, &mut gs);
            let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same(&gm, &wm) && same(&gs, &ws), "{} round {round} ({nh} heads, {hd}/{hdv}, {lo}..{hi}): maxima {gm:?} vs {wm:?}, sums {gs:?} vs {ws:?}", label(k));
            for (i, (g, w)) in ga.iter().zip(&wa).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{} round {round} ({nh} heads, {hd}/{hdv}, {lo}..{hi}): head {} column {}", k.name(), i / hdv, i % hdv);
            }
        }
    }
}

#[test]
fn tiled_attention_blocks_match_the_reference_one_row_at_a_time() {
    use crate::attn_tiled::{block, scratch_len, Layout, MAX_HEADS, QB};
    let mut sets = kernel_sets();
    sets.push(Kernels::reference());
    let reference = Kernels::reference();
    let mut rng = Rng::new(0x711e);
    for &hd in &[64usize, 128, 256, 48] {
        for round in 0..10 {
            let nh = 1 + round % MAX_HEADS;
            let nq = 1 + rng.below(QB as u64) as usize;
            let n_kvh = 2;
            let kvh = round % n_kvh;
            // Positions 0 ..= past + nq - 1 over several tiles; with a window, a ring of `window`
            // slots (as keel's sliding-window cache), else one slot per position.
            let window = [0usize, 37, 64, 100, 0][round % 5];
            let past = rng.below(300) as usize;
            let big = if round % 3 == 2 { 8.0 } else { 1.0 };
            let (rows, stride, kc, vc, q) = random_attention(&mut rng, (hd, n_kvh, nh, nq), window, past, big);
            let lay = Layout { rows, kd: stride, vd: stride, k_off: kvh * hd, v_off: kvh * hd };
            let span = |j: usize| {
                let pos = past + j;
                ((if window > 0 { (pos + 1).saturating_sub(window) } else { 0 }), pos)
            };
            // Stale values in the scratch must not matter.
            let mut scratch = vec![f32::NAN; scratch_len(hd, hd)];
            let mut want = vec![f32::NAN; nq * nh * hd];
            for j in 0..nq {
                for h in 0..nh {
                    let qr = &q[(j * nh + h) * hd..][..hd];
                    let mut o = Some(&mut want[(j * nh + h) * hd..][..hd]);
                    block(&reference, &kc, &vc, lay, (hd, hd, 1), 0.125, 1, |_| (qr, span(j).0, span(j).1), &mut scratch, |_| o.take().unwrap());
                }
            }
            for k in &sets {
                let mut got = vec![f32::NAN; nq * nh * hd];
                {
                    let mut rows_out: Vec<&mut [f32]> = got.chunks_exact_mut(nh * hd).collect();
                    let mut outs = rows_out.iter_mut().map(|r| &mut **r);
                    let query = |j: usize| (&q[j * nh * hd..(j + 1) * nh * hd], span(j).0, span(j).1);
                    block(k, &kc, &vc, lay, (hd, hd, nh), 0.125, nq, query, &mut scratch, |_| outs.next().unwrap());
                }
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(g.is_finite(), "{} hd={hd} element {i} is {g}", label(k));
                    assert_eq!(g.to_bits(), w.to_bits(), "{} hd={hd} heads={nh} window={window} past={past} tokens={nq} element {i}", label(k));
                }
            }
        }
    }
}

/// `f16ops::h2f` is `half`'s `to_f32` for all 65,536 f16 bit patterns (NaNs included,
/// bit for bit), and `f16ops::f2h` is `half`'s `from_f32` for every f32 near an f16
/// (each f16's value, its f32 neighbours, the midpoints to the next f16 and theirs: the
/// rounding boundaries), near 65,520 and the subnormal range, every f32 exponent, and
/// 2^20 random bit patterns (NaN payloads compared bit for bit too).
#[test]
fn f16_conversions_match_half_for_every_input() {
    use super::f16ops::{f2h, h2f};
    let check = |v: f32| {
        let (got, want) = (f2h(v).to_bits(), f16::from_f32(v).to_bits());
        assert_eq!(got, want, "f2h({v:e}) (bits {:#010x}): {got:#06x}, half {want:#06x}", v.to_bits());
    };
    for h in 0..=u16::MAX {
        let x = f16::from_bits(h);
        assert_eq!(h2f(x).to_bits(), x.to_f32().to_bits(), "h2f({h:#06x})");
        let f = x.to_f32();
        if !f.is_finite() {
            check(f);
            continue;
        }
        let next = f16::from_bits(h.wrapping_add(1)).to_f32();
        let mid = if next.is_finite() { (f as f64 + next as f64) / 2.0 } else { f as f64 };
        for c in [f, mid as f32] {
            let b = c.to_bits();
            for d in 0..=3u32 {
                check(f32::from_bits(b.wrapping_add(d)));
                check(f32::from_bits(b.wrapping_sub(d)));
            }
        }
    }
    for e in 0..=255u32 {
        for m in [0, 1, 0x1000, 0x0fff, 0x2000, 0x3fff_ff, 0x40_0000, 0x7f_ffff] {
            check(f32::from_bits(e << 23 | m));
            check(f32::from_bits(0x8000_0000 | e << 23 | m));
        }
    }
    for v in [65504.0f32, 65519.99, 65520.0, 65535.9, 65536.0, 6.1035156e-5, 5.9604645e-8, 2.9802322e-8, 2.9802326e-8, 0.0, -0.0] {
        check(v);
        check(-v);
    }
    let mut rng = Rng::new(0x5eed_f16c);
    for _ in 0..1 << 20 {
        check(f32::from_bits(rng.next() as u32));
    }
}

/// `f16_rows_to_f32` gives each row's exact conversion, for every kernel set and the
/// reference: rows of whole vectors and not, offsets in any order, repeated rows.
#[test]
fn rows_to_f32_converts_each_row() {
    let mut sets = kernel_sets();
    sets.push(Kernels::reference());
    let mut rng = Rng::new(0x0f32);
    let src: Vec<f16> = (0..4096).map(|_| f16::from_bits(rng.next() as u16 & 0x7bff | if rng.next() & 1 == 1 { 0x8000 } else { 0 })).collect();
    for &n in &[64usize, 128, 48, 16, 7] {
        let offs: Vec<usize> = (0..37).map(|i| if i == 5 { 0 } else { rng.below((src.len() - n) as u64) as usize }).chain([0, src.len() - n]).collect();
        for k in &sets {
            let mut dst = vec![f32::NAN; offs.len() * n + 3];
            k.f16_rows_to_f32(&src, &offs, n, &mut dst);
            for (c, &off) in offs.iter().enumerate() {
                for i in 0..n {
                    assert_eq!(dst[c * n + i].to_bits(), src[off + i].to_f32().to_bits(), "{} n={n} row {c} element {i}", label(k));
                }
            }
            assert!(dst[offs.len() * n..].iter().all(|x| x.is_nan()), "{} n={n}: wrote past the rows", label(k));
        }
    }
}

//! Tests of the quant module: known blocks, round-trip error bounds, the reference dot
//! against an f64 sum, the SIMD dots against the reference, and byte equality of the
//! SIMD and reference activation quantizers. SIMD tests run only where the CPU has the
//! features (they print a note and pass otherwise). The K-quant, IQ4_NL and MXFP4
//! tests are in `tests_k.rs`.
//!
//! Tolerances (L1 = Σ|w_i·a_i| over the dequantized rows, plus Σ|m·s| for Q4_1/Q5_1
//! and Σ|dmin·m·a| for the K-quants with mins):
//! - reference dot vs f64 sum of dequantized products: 1e-5·L1 (+ 2^-10·Σ|m·s|, since
//!   `s` is an f16 rounding of `d·Σq`);
//! - SIMD dot vs reference dot: 1e-5·L1 (only the float summation order differs), and
//!   bit equality for the types whose kernels follow llama.cpp's order in both sets
//!   (every quant type; the float types sum in a different order);
//! - round trip |x - dequant(quant(x))| per element, with d the block's scale and
//!   h(v) = max(|v|·2^-11, 2^-25) the error of storing v as f16: Q4_0 |d| + 8·h(d) and
//!   Q5_0 |d| + 16·h(d) (the top value may clamp by one step), Q4_1 / Q5_1
//!   0.5·d + 15·h(d) (31·h(d)) + h(min), Q8_0 / Q8_1 0.5·d + 127·h(d), each plus
//!   1e-6·max|x| for f32 rounding; F16 h(x), BF16 |x|·2^-8, F32 exact.

extern crate std;
use std::{format, println, vec, vec::Vec};

use super::blocks::*;
use super::*;
use crate::ggml_type::GgmlType::{self, *};

pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub(super) fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Uniform in [-1, 1).
    pub(super) fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// A row with a different magnitude per 32-block, some all-zero blocks, some outliers,
/// some all-positive blocks, and some values that land on rounding ties.
pub(crate) fn random_row(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut x = vec![0.0f32; n];
    for block in x.chunks_mut(32) {
        let kind = rng.below(16);
        let scale = libm::powf(10.0, rng.unit() * 2.0 - 1.0); // 1e-3 .. 10
        for v in block.iter_mut() {
            *v = match kind {
                0 => 0.0,
                1 => rng.unit().abs() * scale + scale,
                2 => (rng.below(255) as f32 - 127.0) * 0.5, // ties for Q8 when amax = 63.5
                _ => rng.unit() * scale,
            };
        }
        if kind == 3 {
            let i = rng.below(block.len() as u64) as usize;
            block[i] *= 20.0;
        }
    }
    x
}

/// The SIMD kernel set, if this CPU has it.
/// Every SIMD kernel set this CPU can run: [`fast_kernels`] and, on x86_64, the
/// AVX-512 (with VNNI) variant where the CPU has it.
pub(super) fn fast_kernel_sets() -> Vec<Kernels> {
    let Some(k) = fast_kernels() else { return Vec::new() };
    #[allow(unused_mut)]
    let mut sets = vec![k];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") {
            let v = Kernels::new(Isa { avx2_fma: true, avx512: true, avx512_vnni: true, ..Isa::default() });
            assert_eq!(v.name(), "avx2+vnni", "CPUID disagrees with std's feature detection");
            sets.push(v);
        }
    }
    sets
}

/// [`fast_kernel_sets`] and, on x86, each AVX-512 set's twins with the other CPU vendor's
/// tuning ([`Kernels::other_rounding`]) and with the hints turned the other way
/// ([`Kernels::other_rows16_prefetch`]; for the AVX2 set, its other two forms), and the
/// one with AMD's distance non-temporal ([`Kernels::streaming`]): the rows16 kernels at
/// every prefetch distance and hint (none, Intel's, AMD's, AMD's non-temporal; AVX2's
/// one stream, three streams and Intel's), whatever the CPU.
pub(super) fn rows16_kernel_sets() -> Vec<Kernels> {
    #[allow(unused_mut)]
    let mut sets = fast_kernel_sets();
    #[cfg(target_arch = "x86_64")]
    {
        let twins: Vec<Kernels> = sets.iter().filter_map(Kernels::other_rounding).collect();
        sets.extend(twins);
        let flipped: Vec<Kernels> = sets.iter().filter_map(Kernels::other_rows16_prefetch).collect();
        // The AVX2 set's third form (its forms are a cycle of three; no AVX-512 twin).
        let third: Vec<Kernels> = flipped.iter().filter(|k| k.other_rounding().is_none()).filter_map(Kernels::other_rows16_prefetch).collect();
        sets.extend(flipped);
        sets.extend(third);
        let streaming: Vec<Kernels> = sets.iter().filter_map(Kernels::streaming).collect();
        sets.extend(streaming);
    }
    sets
}

pub(super) fn fast_kernels() -> Option<Kernels> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("f16c") {
        let k = Kernels::new(Isa { avx2_fma: true, ..Isa::default() });
        assert!(!k.is_reference(), "CPUID disagrees with std's feature detection");
        return Some(k);
    }
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("neon") {
        // `sdot` variants where the CPU has them (qemu -cpu max), else plain NEON (qemu
        // -cpu cortex-a53): tests/aarch64.sh runs both.
        let k = Kernels::new(Isa { neon: true, neon_dotprod: std::arch::is_aarch64_feature_detected!("dotprod"), ..Isa::default() });
        println!("note: SIMD kernels: {}", k.name());
        return Some(k);
    }
    println!("note: no SIMD kernels on this CPU; SIMD comparisons skipped");
    None
}

pub(super) fn bytes_of(ty: GgmlType, n: usize) -> usize {
    ty.row_bytes(n as u64).unwrap() as usize
}

pub(crate) fn quantized(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; bytes_of(ty, x.len())];
    quantize_row_ref(ty, x, &mut out).unwrap();
    out
}

pub(crate) fn activations(k: &Kernels, ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; bytes_of(ty, x.len())];
    k.quantize_activations(ty, x, &mut out).unwrap();
    out
}

pub(super) fn dequantized(ty: GgmlType, src: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    Kernels::reference().dequantize_row(ty, src, &mut out).unwrap();
    out
}

pub(super) const DOT_TYPES: [GgmlType; 15] = [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K];

/// Types whose SIMD dot gives the reference's bits (see `x86/mod.rs`): all quant types.
pub(super) fn simd_bit_exact(ty: GgmlType) -> bool {
    !matches!(ty, F32 | F16 | BF16)
}

/// (f64 sum of dequantized products, L1 of them, Σ|m·s| for the Q8_1 pairings and
/// Σ|dmin·m·a| for the K-quants with mins).
pub(super) fn exact_dot(wtype: GgmlType, w: &[u8], a: &[u8], n: usize) -> (f64, f64, f64) {
    let atype = Kernels::vec_dot_type(wtype).unwrap();
    let (wf, af) = (dequantized(wtype, w, n), dequantized(atype, a, n));
    let (mut sum, mut l1) = (0.0f64, 0.0f64);
    for (x, y) in wf.iter().zip(&af) {
        sum += *x as f64 * *y as f64;
        l1 += (*x as f64 * *y as f64).abs();
    }
    let mut ms = 0.0f64;
    if atype == Q8_1 {
        let ws = wtype.type_size();
        for (bw, ba) in w.chunks_exact(ws).zip(a.chunks_exact(36)) {
            ms += (f16_to_f32(u16::from_le_bytes([bw[2], bw[3]])) as f64 * f16_to_f32(u16::from_le_bytes([ba[2], ba[3]])) as f64).abs();
        }
    }
    let mins = super::tests_k::min_offsets(wtype, w, n);
    if !mins.is_empty() {
        // The dequantized weight is scaled part - min part: count both in the L1.
        ms = mins.iter().zip(&af).map(|(m, y)| (*m as f64 * *y as f64).abs()).sum::<f64>();
        l1 = wf.iter().zip(&mins).zip(&af).map(|((x, m), y)| ((*x + *m) as f64 * *y as f64).abs()).sum::<f64>();
    }
    (sum, l1, ms)
}

pub(super) fn random_n(rng: &mut Rng, ty: GgmlType, i: usize) -> usize {
    if ty.block_size() == 256 {
        const FIXED: [usize; 5] = [256, 512, 768, 1536, 4096];
        return if i < FIXED.len() { FIXED[i] } else { 256 * (1 + rng.below(16) as usize) };
    }
    const FIXED: [usize; 7] = [32, 64, 96, 576, 1536, 2048, 4096];
    if i < FIXED.len() {
        return FIXED[i];
    }
    if ty.block_size() == 1 && i % 3 == 0 {
        return 1 + rng.below(300) as usize; // odd lengths for the float tails
    }
    32 * (1 + rng.below(128) as usize)
}

#[test]
fn block_structs_match_ggml_sizes() {
    // The ggml tables (`ggml-common.h` static_asserts): bytes per block and elements.
    for (ty, size, elems) in [(Q2_K, 84, 256), (Q3_K, 110, 256), (Q4_K, 144, 256), (Q5_K, 176, 256), (Q6_K, 210, 256), (Q8_K, 292, 256), (IQ4_NL, 18, 32), (MXFP4, 17, 32)] {
        assert_eq!((ty.type_size(), ty.block_size()), (size, elems), "{ty}");
    }
    assert_eq!(core::mem::size_of::<BlockQ2K>(), Q2_K.type_size());
    assert_eq!(core::mem::size_of::<BlockQ3K>(), Q3_K.type_size());
    assert_eq!(core::mem::size_of::<BlockQ4K>(), Q4_K.type_size());
    assert_eq!(core::mem::size_of::<BlockQ5K>(), Q5_K.type_size());
    assert_eq!(core::mem::size_of::<BlockQ6K>(), Q6_K.type_size());
    assert_eq!(core::mem::size_of::<BlockQ8K>(), Q8_K.type_size());
    assert_eq!(core::mem::size_of::<BlockIq4Nl>(), IQ4_NL.type_size());
    assert_eq!(core::mem::size_of::<BlockMxfp4>(), MXFP4.type_size());
    assert_eq!(core::mem::size_of::<BlockQ4_0>(), Q4_0.type_size());
    assert_eq!(core::mem::size_of::<BlockQ4_1>(), Q4_1.type_size());
    assert_eq!(core::mem::size_of::<BlockQ5_0>(), Q5_0.type_size());
    assert_eq!(core::mem::size_of::<BlockQ5_1>(), Q5_1.type_size());
    assert_eq!(core::mem::size_of::<BlockQ8_0>(), Q8_0.type_size());
    assert_eq!(core::mem::size_of::<BlockQ8_1>(), Q8_1.type_size());
}

#[test]
fn as_blocks_checks_length_and_alignment() {
    let buf = [0u16; 40]; // 80 bytes, 2-aligned
    // SAFETY: u16 has no padding; viewing its storage as bytes is always valid.
    let bytes = unsafe { core::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), 80) };
    assert_eq!(as_blocks::<BlockQ4_1>(&bytes[..60]).map(|b| b.len()), Some(3));
    assert!(as_blocks::<BlockQ4_1>(&bytes[..59]).is_none());
    assert!(as_blocks::<BlockQ4_0>(&bytes[1..19]).is_none(), "odd address accepted");
    assert_eq!(as_blocks::<BlockQ4_0>(&bytes[2..38]).map(|b| b.len()), Some(2));
    assert_eq!(as_blocks::<BlockQ8_0>(&[]).map(|b| b.len()), Some(0));
}

#[test]
fn known_q4_0_block() {
    // d = 0.5; qs[j] = j | (15 - j) << 4 → x[j] = (j - 8)/2, x[j+16] = (7 - j)/2.
    let mut b = [0u8; 18];
    b[..2].copy_from_slice(&0x3800u16.to_le_bytes());
    for j in 0..16 {
        b[2 + j] = j as u8 | ((15 - j as u8) << 4);
    }
    let x = dequantized(Q4_0, &b, 32);
    assert_eq!(&x[..4], &[-4.0, -3.5, -3.0, -2.5]);
    assert_eq!(x[15], 3.5);
    assert_eq!(&x[16..18], &[3.5, 3.0]);
    assert_eq!(x[31], -4.0);
    let blk = as_blocks::<BlockQ4_0>(&b).map(|s| s[0]).or_else(|| read_block::<BlockQ4_0>(&b)).unwrap();
    assert_eq!(blk.d.to_f32(), 0.5);
}

#[test]
fn known_q4_1_q5_blocks() {
    // Q4_1: d = 0.25, m = -1, qs[j] = j | j << 4 → x[j] = x[j+16] = j/4 - 1.
    let mut b = [0u8; 20];
    b[..2].copy_from_slice(&0x3400u16.to_le_bytes());
    b[2..4].copy_from_slice(&0xBC00u16.to_le_bytes());
    for j in 0..16 {
        b[4 + j] = (j as u8) | ((j as u8) << 4);
    }
    let x = dequantized(Q4_1, &b, 32);
    assert_eq!((x[0], x[5], x[15], x[16], x[31]), (-1.0, 0.25, 2.75, -1.0, 2.75));

    // Q5_0: d = 1, qh = 0xAAAA5555, qs[j] = j | (j+1)%16 << 4.
    // x[0]: 0 | bit0(1)<<4 = 16 → 0; x[1]: 1, bit1 = 0 → -15; x[14]: 14 | 16 → 14;
    // x[16]: 1, bit16 = 0 → -15;
    // x[17]: 2, bit17 = 1 → 18 → 2; x[31]: 0, bit31 = 1 → 0.
    let mut b = [0u8; 22];
    b[..2].copy_from_slice(&0x3C00u16.to_le_bytes());
    b[2..6].copy_from_slice(&0xAAAA_5555u32.to_le_bytes());
    for j in 0..16 {
        b[6 + j] = (j as u8) | ((((j + 1) % 16) as u8) << 4);
    }
    let x = dequantized(Q5_0, &b, 32);
    assert_eq!((x[0], x[1], x[14], x[16], x[17], x[31]), (0.0, -15.0, 14.0, -15.0, 2.0, 0.0));

    // Q5_1 with the same qh/qs, d = 0.5, m = 1: x[i] = u/2 + 1 with u the 5-bit value.
    let mut b5 = [0u8; 24];
    b5[..2].copy_from_slice(&0x3800u16.to_le_bytes());
    b5[2..4].copy_from_slice(&0x3C00u16.to_le_bytes());
    b5[4..24].copy_from_slice(&b[2..22]);
    let x = dequantized(Q5_1, &b5, 32);
    assert_eq!((x[0], x[1], x[17], x[31]), (9.0, 1.5, 10.0, 9.0));
}

#[test]
fn known_q8_0_block() {
    let mut b = [0u8; 34];
    b[..2].copy_from_slice(&0x4000u16.to_le_bytes()); // d = 2
    for j in 0..32 {
        b[2 + j] = (j as i32 * 8 - 128) as i8 as u8;
    }
    let x = dequantized(Q8_0, &b, 32);
    assert_eq!((x[0], x[16], x[31]), (-256.0, 0.0, 240.0));
}

#[test]
fn known_q4_0_quantization() {
    // x[0] = -4 is the signed max → d = 0.5, id = 2; for j >= 1, x[j] = (j-16)/4 gives
    // q = trunc((j-16)/2 + 8.5) = trunc(j/2 + 0.5), clamped to 15.
    let mut x = [0.0f32; 32];
    x[0] = -4.0;
    for (j, v) in x.iter_mut().enumerate().skip(1) {
        *v = (j as f32 - 16.0) * 0.25;
    }
    let b = quantized(Q4_0, &x);
    assert_eq!(u16::from_le_bytes([b[0], b[1]]), 0x3800);
    let q = |j: usize| if j == 0 { 0u8 } else { (j as u8).div_ceil(2).min(15) };
    for j in 0..16 {
        assert_eq!(b[2 + j], q(j) | (q(j + 16) << 4), "byte {j}");
    }
}

#[test]
fn q8_weight_and_activation_roundings_differ_only_at_ties() {
    // amax = 127 → d = 1 and id = 1 exactly in both schemes; x·id lands on ties.
    let mut x = [0.0f32; 32];
    x[..7].copy_from_slice(&[127.0, 2.5, 3.5, -2.5, 0.5, -0.5, 1.5]);
    let w = quantized(Q8_0, &x);
    let want_w: [i8; 7] = [127, 3, 4, -3, 1, -1, 2]; // roundf: ties away from zero
    let want_a: [i8; 7] = [127, 2, 4, -2, 0, 0, 2]; // ties to even
    assert_eq!(&w[2..9], &want_w.map(|v| v as u8));
    let a = activations(&Kernels::reference(), Q8_0, &x);
    assert_eq!(&a[2..9], &want_a.map(|v| v as u8));
    if let Some(k) = fast_kernels() {
        assert_eq!(activations(&k, Q8_0, &x), a);
    }
}

#[test]
fn round_trip_error_is_bounded() {
    let mut rng = Rng::new(1);
    for ty in [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1] {
        for _ in 0..50 {
            let n = 32 * (1 + rng.below(64) as usize);
            let x = random_row(&mut rng, n);
            let y = dequantized(ty, &quantized(ty, &x), n);
            for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
                let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let min = xb.iter().fold(f32::MAX, |m, v| m.min(*v));
                let max = xb.iter().fold(-f32::MAX, |m, v| m.max(*v));
                for (i, (&v, &r)) in xb.iter().zip(yb).enumerate() {
                    // Error of storing a scale as f16 (relative, or half a subnormal step).
                    let h = |v: f32| (v.abs() / 2048.0).max(1.0 / (1u32 << 25) as f32);
                    let slack = amax * 1e-6 + 1e-9;
                    let bound = match ty {
                        F32 => 0.0,
                        F16 => h(v),
                        BF16 => v.abs() / 256.0,
                        Q4_0 => amax / 8.0 + 8.0 * h(amax / 8.0) + slack,
                        Q5_0 => amax / 16.0 + 16.0 * h(amax / 16.0) + slack,
                        Q4_1 | Q5_1 => {
                            let top = if ty == Q4_1 { 15.0 } else { 31.0 };
                            let d = (max - min) / top;
                            0.5 * d + top * h(d) + h(min) + slack + min.abs() * 1e-6
                        }
                        _ => 0.5 * amax / 127.0 + 127.0 * h(amax / 127.0) + slack,
                    };
                    assert!((v - r).abs() <= bound, "{ty} block {b} elem {i}: {v} -> {r} (bound {bound})");
                }
            }
        }
    }
}

#[test]
fn reference_dot_matches_f64_sum() {
    let mut rng = Rng::new(2);
    let k = Kernels::reference();
    for wtype in DOT_TYPES {
        let atype = Kernels::vec_dot_type(wtype).unwrap();
        let dot = k.dot_fn(wtype).unwrap();
        for i in 0..60 {
            let n = random_n(&mut rng, wtype, i);
            let w = quantized(wtype, &random_row(&mut rng, n));
            let a = activations(&k, atype, &random_row(&mut rng, n));
            let got = dot(n, &w, &a) as f64;
            let (want, l1, ms) = exact_dot(wtype, &w, &a, n);
            let tol = 1e-5 * (l1 + ms) + if atype == Q8_1 { ms / 1024.0 } else { 0.0 };
            assert!((got - want).abs() <= tol, "{wtype} n={n}: {got} vs {want} (tol {tol})");
        }
    }
}

#[test]
fn simd_dot_matches_reference() {
    let Some(fast) = fast_kernels() else { return };
    let reference = Kernels::reference();
    let mut rng = Rng::new(3);
    for wtype in DOT_TYPES {
        let atype = Kernels::vec_dot_type(wtype).unwrap();
        let (f, r) = (fast.dot_fn(wtype).unwrap(), reference.dot_fn(wtype).unwrap());
        let mut worst = 0.0f64;
        for i in 0..300 {
            let n = random_n(&mut rng, wtype, i);
            let w = quantized(wtype, &random_row(&mut rng, n));
            let a = activations(&fast, atype, &random_row(&mut rng, n));
            let got32 = f(n, &w, &a);
            let (got, want) = (got32 as f64, r(n, &w, &a) as f64);
            let (_, l1, ms) = exact_dot(wtype, &w, &a, n);
            let scale = l1 + ms;
            let err = if scale > 0.0 { (got - want).abs() / scale } else { (got - want).abs() };
            assert!(err <= 1e-5, "{wtype} n={n}: simd {got} vs reference {want} (L1 {scale})");
            if simd_bit_exact(wtype) {
                // These follow llama.cpp's x86 order in both kernel sets: same bits.
                assert_eq!(got32.to_bits(), r(n, &w, &a).to_bits(), "{wtype} n={n}: simd and reference bits differ");
            }
            worst = worst.max(err);

            // Same bits from a misaligned copy of the same rows.
            let mut w2 = vec![0u8; w.len() + 1];
            w2[1..].copy_from_slice(&w);
            let mut a2 = vec![0u8; a.len() + 3];
            a2[3..].copy_from_slice(&a);
            assert_eq!(f(n, &w2[1..], &a2[3..]).to_bits(), got32.to_bits(), "{wtype} n={n}: alignment changed the bits");
        }
        println!("{wtype}: worst |simd - reference| / L1 = {worst:.2e}");
    }
}

#[test]
fn simd_activations_are_byte_identical() {
    let Some(fast) = fast_kernels() else { return };
    let reference = Kernels::reference();
    let mut rng = Rng::new(4);
    for ty in [F32, F16, BF16, Q8_0, Q8_1, Q8_K] {
        for i in 0..200 {
            let n = if ty == Q8_K {
                256 * (1 + rng.below(16) as usize)
            } else if ty.block_size() == 1 && i % 2 == 0 {
                1 + rng.below(300) as usize
            } else {
                32 * (1 + rng.below(128) as usize)
            };
            let x = random_row(&mut rng, n);
            assert_eq!(activations(&fast, ty, &x), activations(&reference, ty, &x), "{ty} n={n}");
        }
    }
    // Q8_K's edge cases: magnitude ties of either sign (the first wins), zero, NaN and
    // infinite elements, an all-zero and an all-NaN super-block.
    let mut x = random_row(&mut rng, 256 * 6);
    x[7] = -3.0;
    x[200] = 3.0;
    x[300] = 4.0;
    x[301] = -4.0;
    x[600] = f32::NAN;
    x[700] = f32::INFINITY;
    x[800] = -f32::NAN;
    x[801] = -9.0;
    x[900] = f32::from_bits(0x7FC0_1234);
    x[901] = f32::from_bits(0xFFC0_0077);
    x[1024..1280].iter_mut().for_each(|v| *v = 0.0);
    x[1280..1536].iter_mut().for_each(|v| *v = f32::NAN);
    for v in x[..256].iter_mut().filter(|v| v.abs() > 3.0) {
        *v = 0.5;
    }
    for v in x[256..512].iter_mut().filter(|v| v.abs() > 4.0) {
        *v = 0.5;
    }
    assert_eq!(activations(&fast, Q8_K, &x), activations(&reference, Q8_K, &x), "Q8_K edge cases");
    // Every byte is written, whatever the buffer held.
    let mut dirty = vec![0xA5u8; bytes_of(Q8_K, x.len())];
    fast.quantize_activations(Q8_K, &x, &mut dirty).unwrap();
    assert_eq!(dirty, activations(&reference, Q8_K, &x), "Q8_K into a used buffer");
}

#[test]
fn api_checks_types_and_shapes() {
    let k = Kernels::reference();
    assert!(Kernels::new(Isa::default()).is_reference());
    assert_eq!(k.dot_fn(IQ2_XXS).unwrap_err(), Unsupported { ty: IQ2_XXS, reason: Reason::NoDot });
    assert!(format!("{}", k.dot_fn(IQ4_XS).unwrap_err()).contains("iq4_xs"));
    assert_eq!(Kernels::vec_dot_type(Q4_1), Some(Q8_1));
    // llama.cpp's type_traits_cpu pairings.
    for (w, a) in [(Q2_K, Q8_K), (Q3_K, Q8_K), (Q4_K, Q8_K), (Q5_K, Q8_K), (Q6_K, Q8_K), (IQ4_NL, Q8_0), (MXFP4, Q8_0)] {
        assert_eq!(Kernels::vec_dot_type(w), Some(a), "{w}");
    }
    assert_eq!(Kernels::vec_dot_type(IQ4_XS), None);
    assert_eq!(Kernels::vec_dot_type(Q8_K), None, "Q8_K is an activation type only");
    let e = k.quantize_activations(Q8_K, &[0.5f32; 64], &mut [0u8; 292]).unwrap_err();
    assert_eq!(e.reason, Reason::RowShape { n: 64, bytes: 292 }, "K rows are whole 256-blocks");
    let x = [0.5f32; 64];
    let mut out = [0u8; 68];
    assert!(k.quantize_activations(Q8_0, &x, &mut out).is_ok());
    let e = k.quantize_activations(Q4_0, &x, &mut out).unwrap_err();
    assert_eq!(e.reason, Reason::NotActivationType);
    let e = k.quantize_activations(Q8_0, &x[..33], &mut out).unwrap_err();
    assert_eq!(e.reason, Reason::RowShape { n: 33, bytes: 68 });
    assert!(format!("{e}").contains("q8_0"));
    let mut short = [0u8; 67];
    assert!(quantize_row_ref(Q8_0, &x, &mut short).is_err());
    let mut y = [0.0f32; 64];
    assert!(k.dequantize_row(Q8_0, &out, &mut y).is_ok());
    assert!(k.dequantize_row(Q8_0, &out[..34], &mut y).is_err());
    assert_eq!(k.dequantize_row(IQ2_XS, &out, &mut y).unwrap_err().reason, Reason::NoDequantize);
    let e = quantize_row_ref(IQ4_XS, &x, &mut out).unwrap_err();
    assert_eq!(e.reason, Reason::NoQuantize);
    assert!(format!("{e}").contains("iq4_xs"));
}

#[test]
fn simd_attention_f16_ops_and_swiglu_match_reference_bits() {
    use half::f16;
    let Some(fast) = fast_kernels() else { return };
    let reference = Kernels::reference();
    let mut rng = Rng::new(5);
    for &n in &[64usize, 72, 128, 200, 7] {
        let x: Vec<f16> = (0..n).map(|_| f16::from_f32(rng.unit() * 4.0)).collect();
        let y: Vec<f16> = (0..n).map(|_| f16::from_f32(rng.unit() * 4.0)).collect();
        assert_eq!(fast.f16_dot(&x, &y).to_bits(), reference.f16_dot(&x, &y).to_bits(), "dot n={n}");
        let v = rng.unit();
        let (mut a, mut b) = (y.clone(), y.clone());
        fast.f16_mad(&mut a, &x, v);
        reference.f16_mad(&mut b, &x, v);
        assert_eq!(a, b, "mad n={n}");
        fast.f16_scale(&mut a, v);
        reference.f16_scale(&mut b, v);
        assert_eq!(a, b, "scale n={n}");
        let src: Vec<f32> = (0..n).map(|_| rng.unit() * 100.0).collect();
        let (mut h1, mut h2) = (vec![f16::ZERO; n], vec![f16::ZERO; n]);
        fast.f32_to_f16(&src, &mut h1);
        reference.f32_to_f16(&src, &mut h2);
        assert_eq!(h1, h2, "to_f16 n={n}");
    }
    // GeGLU at every f16 input, at values beside them, and at the ±10 cut-offs.
    let mut gate: Vec<f32> = (0..=0xFFFFu16).map(|b| f16::from_bits(b).to_f32()).collect();
    gate.extend((0..20000).map(|_| rng.unit() * 12.0));
    gate.extend([-10.0, 10.0, -9.999, 9.999, f32::from_bits(0x4120_0001), f32::NEG_INFINITY, f32::INFINITY]);
    gate.extend([f32::NAN, -f32::NAN, f32::from_bits(0xFFFF_FFFF), f32::from_bits(0x7F80_0001), f32::from_bits(0xFF80_2001), 1e-8, -3e-7]);
    let up: Vec<f32> = (0..gate.len()).map(|_| rng.unit() * 3.0).collect();
    for _ in 0..2 {
        // Twice: the table is built by the first call.
        let (mut a, mut b) = (gate.clone(), gate.clone());
        fast.geglu(&mut a, &up);
        crate::ops::geglu(&mut b, &up);
        for i in 0..a.len() {
            assert_eq!(a[i].to_bits(), b[i].to_bits(), "geglu x={} up={}", gate[i], up[i]);
        }
    }
    // SwiGLU over a wide range, including |x| large enough to saturate the exponential.
    let gate: Vec<f32> = (0..4099).map(|i| if i % 97 == 0 { rng.unit() * 400.0 } else { rng.unit() * 30.0 }).collect();
    let up: Vec<f32> = (0..4099).map(|_| rng.unit() * 3.0).collect();
    let (mut a, mut b) = (gate.clone(), gate.clone());
    fast.swiglu(&mut a, &up);
    reference.swiglu(&mut b, &up);
    for i in 0..a.len() {
        assert_eq!(a[i].to_bits(), b[i].to_bits(), "swiglu x={} up={}", gate[i], up[i]);
    }
}


#[test]
fn f16_rounding_of_f64_is_one_rounding() {
    // Just above / below / on the midpoint between adjacent f16 values a < b: b / a / the
    // even one. (`half`'s `f16::from_f64` rounds twice and gets "just above" wrong.)
    use half::f16;
    let mut rng = Rng::new(9);
    for _ in 0..20000 {
        let bits = (rng.below(0x7BFF) as u16) | if rng.below(2) == 0 { 0 } else { 0x8000 };
        let a = f16::from_bits(bits);
        let b = f16::from_bits(bits + 1); // next away from zero
        let (af, bf) = (a.to_f64(), b.to_f64());
        let m = (af + bf) / 2.0; // exact
        let d = (bf - af).abs() * libm::ldexp(1.0, -(12 + rng.below(28) as i32)); // >= 2^-51 of m: exact in f64
        let toward_b = if bf > af { d } else { -d };
        assert_eq!(super::f16ops::f16_from_f64(m + toward_b).to_bits(), b.to_bits(), "{a} {b}: just past the midpoint");
        assert_eq!(super::f16ops::f16_from_f64(m - toward_b).to_bits(), a.to_bits(), "{a} {b}: just short of the midpoint");
        let even = if bits % 2 == 0 { a } else { b };
        assert_eq!(super::f16ops::f16_from_f64(m).to_bits(), even.to_bits(), "{a} {b}: the midpoint");
        assert_eq!(super::f16ops::f16_from_f64(af).to_bits(), a.to_bits());
    }
}

/// The f64 method of wasm32's 8-lane fma (`scalar::fma_via_f64`, which the simd128 lanes
/// transliterate) equals a single-rounding `fma` bit for bit: on random f32 triples over
/// the whole exponent range, on the shapes the dots produce (scale × integer lane sum +
/// accumulator), and on crafted ties, cancellations, subnormals and overflow.
#[test]
fn fma_via_f64_rounds_once() {
    use super::scalar::fma_via_f64;
    let check = |x: f32, y: f32, z: f32| {
        let (got, want) = (fma_via_f64(x, y, z), libm::fmaf(x, y, z));
        assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "fma({x:e}, {y:e}, {z:e}): {got:e} ({:#x}) vs {want:e} ({:#x})", got.to_bits(), want.to_bits());
    };
    let mut rng = Rng::new(0x5eed_f0a);
    for _ in 0..2_000_000 {
        let r = rng.next();
        let (x, y, z) = (f32::from_bits(r as u32), f32::from_bits((r >> 32) as u32), f32::from_bits(rng.next() as u32));
        check(x, y, z);
        // Dot shapes: a positive scale, an integer lane sum, an accumulator of similar size.
        let d = f32::from_bits(0x3000_0000 + (r as u32 & 0x0fff_ffff));
        let s = ((r >> 40) as i32 % 70_000) as f32;
        let acc = (d * s) * f32::from_bits(0x3f00_0000 + ((r >> 8) as u32 & 0x00ff_ffff)) * if r & 1 == 0 { -1.0 } else { 1.0 };
        check(d, s, acc);
        check(d, s, -d * s);
    }
    // Products that land exactly half an ulp off the accumulator's grid, and one past.
    for k in 0..2000u32 {
        let z = f32::from_bits(0x3f80_0000 + k);
        let half_ulp = f32::from_bits(0x3380_0000); // 2^-24: half an ulp of [1, 2)
        for (x, y) in [(half_ulp, 1.0), (half_ulp, -1.0), (half_ulp * 3.0, 0.5), (f32::from_bits(0x3380_0001), 1.0), (f32::from_bits(0x337f_ffff), -1.0)] {
            check(x, y, z);
            check(x, y, -z);
        }
    }
    for (x, y, z) in [
        (f32::MAX, 2.0, -f32::MAX),
        (f32::MAX, 1.0, f32::MAX),
        (f32::MIN_POSITIVE, 0.5, 0.0),
        (f32::MIN_POSITIVE, f32::MIN_POSITIVE, -0.0),
        (1e-45, 0.5, 1e-45),
        (1.0, f32::INFINITY, 1.0),
        (f32::NAN, 1.0, 1.0),
        (0.0, -1.0, 0.0),
        (-0.0, 1.0, -0.0),
        (1.0 + f32::EPSILON, 1.0 - f32::EPSILON, -1.0),
        (16_777_217.0, 1.0, 0.0),
    ] {
        check(x, y, z);
    }
}

/// The i8 lane sums equal the closure form on every weight range the dots decode to.
#[test]
fn lane_sums_i8_equal_the_closure_form() {
    use super::scalar::{lane_sums, lane_sums_i8};
    let mut rng = Rng::new(0x1a5e);
    for _ in 0..10_000 {
        let x: [i8; 32] = core::array::from_fn(|_| rng.next() as i8);
        let y: [i8; 32] = core::array::from_fn(|_| rng.next() as i8);
        assert_eq!(lane_sums_i8(&x, &y), lane_sums(|k| x[k] as i32, &y));
    }
    let (x, y) = ([-128i8; 32], [-128i8; 32]);
    assert_eq!(lane_sums_i8(&x, &y), [65536; 8]);
}

/// A tile's operands: `rows` random weight rows of `n` quantized as `ty`, `wrow` bytes
/// apart, and `tokens` activation rows quantized for it by `k`, `arow` bytes apart (the
/// gaps zero).
fn strided_operands(k: &Kernels, rng: &mut Rng, ty: GgmlType, n: usize, (rows, wrow): (usize, usize), (tokens, arow): (usize, usize)) -> (Vec<u8>, Vec<u8>) {
    let vdt = Kernels::vec_dot_type(ty).unwrap();
    let mut w = vec![0u8; rows * wrow];
    for r in 0..rows {
        let q = quantized(ty, &random_row(rng, n));
        w[r * wrow..r * wrow + q.len()].copy_from_slice(&q);
    }
    let mut a = vec![0u8; tokens * arow];
    for t in 0..tokens {
        let q = activations(k, vdt, &random_row(rng, n));
        a[t * arow..t * arow + q.len()].copy_from_slice(&q);
    }
    (w, a)
}

#[test]
fn dot_tiles_give_each_dots_bits() {
    let (sets, mut checked) = (fast_kernel_sets(), 0);
    for &k in &sets {
        let mut rng = Rng::new(21);
        for &ty in &[Q8_0, Q5_0, Q4_1, Q4_0, Q4_K, Q6_K] {
            let Some(tile) = k.dot_tile_fn(ty) else { continue };
            let tile_rows = tile.rows;
            let dot = k.dot_fn(ty).unwrap();
            let vdt = Kernels::vec_dot_type(ty).unwrap();
            // The tile, and its narrower tile for a chunk's last tokens where it has one.
            for i in 0..40 {
                let (tile, tt) = match tile.rest {
                    Some(rest) if i % 2 == 1 => rest,
                    _ => (tile.f, tile.tokens),
                };
                let n = random_n(&mut rng, ty, i);
                // One to three groups of rows per call, or nine (more than one pass of
                // the rows-in-lanes tiles' staged groups).
                let tr = tile_rows * [1, 2, 3, 9][i % 4];
                let (wrow, arow) = (bytes_of(ty, n) + 2 * (i % 3), bytes_of(vdt, n) + i % 5);
                let (w, a) = strided_operands(&k, &mut rng, ty, n, (tr, wrow), (tt, arow));
                let ostride = tr + i % 3;
                let mut out = vec![f32::NAN; tt * ostride];
                tile(n, &w, wrow, tr, &a, arow, &mut out, ostride);
                for r in 0..tr {
                    for t in 0..tt {
                        let want = dot(n, &w[r * wrow..], &a[t * arow..]);
                        assert_eq!(out[t * ostride + r].to_bits(), want.to_bits(), "{} {ty} n={n} r={r} t={t}", k.name());
                    }
                }
                checked += 1;
            }
        }
    }
    // Every x86 kernel set has tiles for six types.
    #[cfg(target_arch = "x86_64")]
    assert_eq!(checked, 6 * 40 * sets.len(), "tiles checked");
    let _ = checked;
}

/// The tiles of llama.cpp's batch orders give every (row, token) they cover the bits of
/// that token's kernel in the batch (`dot_fn_in_batch`), for batch sizes around the
/// orders' boundaries (4-token `gemm` groups, 8 tokens for the tiled order) and row
/// counts with and without the repacked layout.
#[test]
fn dot_tiles_in_batch_give_each_tokens_bits() {
    for &k in &fast_kernel_sets() {
        let mut rng = Rng::new(27);
        for &ty in &[Q4_K, Q6_K, Q2_K, Q3_K, Q5_K] {
            let mut checked = 0;
            let vdt = Kernels::vec_dot_type(ty).unwrap();
            for i in 0..24 {
                let n = random_n(&mut rng, ty, i);
                let rows = [8, 16, 9, 24][i % 4];
                let n_tokens = [4, 8, 9, 12, 16, 17][i % 6];
                let Some((tile, covered)) = k.dot_tile_in_batch(ty, rows, n_tokens) else { continue };
                assert!(covered > 0 && covered <= n_tokens && covered % tile.tokens == 0, "{} {ty}: covers {covered} of {n_tokens}", k.name());
                let tr = rows - rows % tile.rows;
                let (wrow, arow) = (bytes_of(ty, n) + 2 * (i % 3), bytes_of(vdt, n) + i % 5);
                let (w, a) = strided_operands(&k, &mut rng, ty, n, (rows, wrow), (n_tokens, arow));
                let ostride = tr + i % 3;
                for t0 in (0..covered).step_by(tile.tokens) {
                    let mut out = vec![f32::NAN; tile.tokens * ostride];
                    (tile.f)(n, &w, wrow, tr, &a[t0 * arow..], arow, &mut out, ostride);
                    for r in 0..tr {
                        for t in 0..tile.tokens {
                            let dot = k.dot_fn_in_batch(ty, rows, n_tokens, t0 + t).unwrap();
                            let want = dot(n, &w[r * wrow..], &a[(t0 + t) * arow..]);
                            assert_eq!(out[t * ostride + r].to_bits(), want.to_bits(), "{} {ty} n={n} rows={rows} batch={n_tokens} r={r} t={}", k.name(), t0 + t);
                        }
                    }
                }
                checked += 1;
            }
            // Every x86 kernel set has Q4_K's gemm-order tile and Q4_K's and Q6_K's
            // tiled-order ones: most of the 24 shapes take one (not the batches too short
            // for a tile).
            #[cfg(target_arch = "x86_64")]
            assert!(!matches!(ty, Q4_K | Q6_K) || checked >= 16, "{} {ty}: {checked} shapes had a tile", k.name());
            let _ = checked;
        }
    }
}

/// The short-batch kernels give every (row, token) the bits of its single dot (every
/// pair count, 4 to 20 rows, odd strides, random lengths).
#[test]
fn dot_pairs_give_each_dots_bits() {
    let sets = fast_kernel_sets();
    let mut rng = Rng::new(23);
    let mut checked = 0;
    for k in &sets {
        let Some(pairs_fn) = k.dot_pairs_fn(Q8_0) else { continue };
        let dot = k.dot_fn(Q8_0).unwrap();
        for i in 0..60 {
            let n = random_n(&mut rng, Q8_0, i);
            let (pairs, rows) = (1 + i % DOT_PAIRS_MAX, 4 * (1 + i % 5));
            let (wrow, arow) = (bytes_of(Q8_0, n) + i % 3, bytes_of(Q8_0, n) + 2 * (i % 4));
            let mut w = vec![0u8; rows * wrow];
            for r in 0..rows {
                let q = quantized(Q8_0, &random_row(&mut rng, n));
                w[r * wrow..r * wrow + q.len()].copy_from_slice(&q);
            }
            let mut a = vec![0u8; 2 * pairs * arow];
            for t in 0..2 * pairs {
                let q = activations(k, Q8_0, &random_row(&mut rng, n));
                a[t * arow..t * arow + q.len()].copy_from_slice(&q);
            }
            let ostride = rows + i % 3;
            let mut out = vec![f32::NAN; 2 * pairs * ostride];
            pairs_fn(n, &w, wrow, rows, &a, arow, pairs, &mut out, ostride);
            for r in 0..rows {
                for t in 0..2 * pairs {
                    let want = dot(n, &w[r * wrow..], &a[t * arow..]);
                    assert_eq!(out[t * ostride + r].to_bits(), want.to_bits(), "{} n={n} pairs={pairs} r={r} t={t}", k.name());
                }
            }
            checked += 1;
        }
    }
    // The AVX-512 VNNI set has them wherever this CPU has VNNI.
    #[cfg(target_arch = "x86_64")]
    assert_eq!(checked, 60 * (sets.len() - 1), "Q8_0 pairs kernels checked");
    let _ = checked;
}

/// Runs the tasks one after another in reverse (as threads may, in any order).
pub(crate) struct Reversed(pub(crate) usize);

impl crate::parallel::Parallel for Reversed {
    fn n_threads(&self) -> usize {
        self.0
    }
    fn run(&self, n_tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        (0..n_tasks).rev().for_each(task)
    }
}

/// A matmul's operands: `rows` random rows of `cols` weights quantized as `ty`, and `n`
/// random activation rows quantized for it by `k`; with their row sizes in bytes
/// (weights, activations).
pub(super) fn matmul_operands(k: &Kernels, rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize, n: usize) -> (Vec<u8>, Vec<u8>, usize, usize) {
    use crate::matmul::quantize_rows;
    use crate::parallel::Sequential;
    let wrb = bytes_of(ty, cols);
    let mut w = vec![0u8; rows * wrb];
    for r in 0..rows {
        let q = quantized(ty, &random_row(rng, cols));
        w[r * wrb..(r + 1) * wrb].copy_from_slice(&q);
    }
    let vdt = Kernels::vec_dot_type(ty).unwrap();
    let rb = bytes_of(vdt, cols);
    let x: Vec<f32> = (0..n).flat_map(|_| random_row(rng, cols)).collect();
    let mut a = vec![0u8; n * rb];
    quantize_rows(k, &Sequential, vdt, &x, n, cols, &mut a);
    (w, a, wrb, rb)
}

/// A matmul of 1 to 17, 31 to 33, 40, 48, 69, 72, 150 or 200 tokens gives each token the
/// bits of that token alone, on one thread and on several (whatever path the batch takes:
/// 8-row kernel, pairs, tiles and a narrower tile for a chunk's last tokens, rows split
/// between the tasks or chunks of tokens dealt out, a short one last), for the types with
/// short-batch or tile kernels; row counts not a multiple of 8 (nor of 16).
#[test]
fn matmul_rows_do_not_depend_on_the_batch() {
    use crate::matmul::matmul;
    use crate::model::Tensor;
    use crate::parallel::{Parallel, Sequential};
    let mut rng = Rng::new(24);
    for k in fast_kernel_sets() {
        for (ty, cols) in [(Q8_0, 96usize), (Q5_0, 96), (Q4_0, 96), (Q4_1, 96), (Q4_K, 512), (Q6_K, 512)] {
            let rows = 76usize;
            let (w, a, _, rb) = matmul_operands(&k, &mut rng, ty, rows, cols, 200);
            let t = Tensor { ty, cols, rows, data: &w, hi: &[], layout: crate::model::Layout::Plain };
            let mut one = vec![0.0f32; 200 * rows];
            for i in 0..200 {
                matmul(&k, &Sequential, &t, &a[i * rb..(i + 1) * rb], 1, &mut one[i * rows..(i + 1) * rows]);
            }
            // Up to two token tiles of the widest tiles (32: Q4_0 with VNNI) and tokens
            // past them, for its narrower tile and the 8-row kernel after it; batches long
            // enough to be dealt out by chunks of tokens on two and three tasks.
            for n in (1..=17).chain([31, 32, 33, 40, 48, 69, 72, 150, 200]) {
                for par in [&Sequential as &dyn Parallel, &Reversed(2), &Reversed(3)] {
                    let mut out = vec![f32::NAN; n * rows];
                    matmul(&k, par, &t, &a[..n * rb], n, &mut out);
                    for (j, (o, e)) in out.iter().zip(&one).enumerate() {
                        assert_eq!(o.to_bits(), e.to_bits(), "{} {ty} batch of {n}, token {} row {}, {} tasks", k.name(), j / rows, j % rows, par.n_threads());
                    }
                }
            }
        }
    }
}

/// A one-token product of a matrix past `matmul::BALANCE_BYTES` goes out in parts that
/// any thread may take (more tasks than threads): each row still gets its bits, every row
/// is written once, alone and in a `matvec_group`, whatever order the tasks run in; the
/// parts are whole 8-row groups covering the rows in order.
#[test]
fn balanced_one_token_products_keep_every_rows_bits() {
    use crate::matmul::{matmul, matvec_group, task_rows, BALANCE_BYTES};
    use crate::model::Tensor;
    use crate::parallel::{Parallel, Sequential};
    for (rows, unit, tasks) in [(970usize, 8usize, 16usize), (49152, 8, 16), (7, 8, 4), (100, 1, 3)] {
        let mut next = 0;
        for t in 0..tasks {
            let r = task_rows(rows, unit, tasks, t);
            assert!(r.start == next && (r.start % unit == 0 || r.is_empty()) && r.end <= rows, "{rows} rows in {tasks} parts of {unit}: part {t} is {r:?}");
            next = r.end;
        }
        assert_eq!(next, rows, "{rows} rows in {tasks} parts of {unit}");
    }
    let mut rng = Rng::new(31);
    let k = fast_kernel_sets().pop().unwrap_or_else(Kernels::reference);
    let (cols, rows) = (4096usize, 970usize);
    let (w, a, wrb, _) = matmul_operands(&k, &mut rng, Q8_0, rows, cols, 1);
    assert!(rows * wrb >= BALANCE_BYTES, "the matrix is below the balancing size");
    let t = Tensor { ty: Q8_0, cols, rows, data: &w, hi: &[], layout: crate::model::Layout::Plain };
    let mut want = vec![0.0f32; rows];
    matmul(&k, &Sequential, &t, &a, 1, &mut want);
    for par in [&Reversed(2) as &dyn Parallel, &Reversed(3)] {
        let mut out = vec![f32::NAN; rows];
        matmul(&k, par, &t, &a, 1, &mut out);
        let mut outs = [vec![f32::NAN; rows]];
        let mut slices: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
        assert!(matvec_group(&k, par, &[&t], &a, &mut slices), "{}: group refused", k.name());
        for (r, e) in want.iter().enumerate() {
            assert_eq!(out[r].to_bits(), e.to_bits(), "{} row {r}, {} threads", k.name(), par.n_threads());
            assert_eq!(outs[0][r].to_bits(), e.to_bits(), "{} group row {r}, {} threads", k.name(), par.n_threads());
        }
    }
}

/// `matvec_group` gives each matrix of a group the bits `matmul` gives it alone: groups of
/// one activation type (types with and without 8-row kernels mixed, row counts not a
/// multiple of 8, matrices of very different sizes) on 1 to 5 tasks; groups it cannot
/// take (activation types or widths that differ) are refused with nothing written.
#[test]
fn matvec_group_gives_each_matrix_its_own_bits() {
    use crate::matmul::{matmul, matvec_group};
    use crate::model::Tensor;
    use crate::parallel::{Parallel, Sequential};
    let mut rng = Rng::new(29);
    for k in fast_kernel_sets() {
        let groups: [&[(GgmlType, usize)]; 4] = [&[(Q8_0, 76), (Q4_0, 24), (Q4_0, 24)], &[(Q4_1, 8), (Q4_1, 203)], &[(Q4_K, 64), (Q6_K, 19), (Q4_K, 3)], &[(Q5_0, 5), (Q8_0, 9), (Q4_0, 130), (Q8_0, 1)]];
        for (gi, group) in groups.iter().enumerate() {
            let cols = if group[0].0 == Q4_K { 512 } else { 96 };
            let ops: Vec<_> = group.iter().map(|&(ty, rows)| (ty, rows, matmul_operands(&k, &mut rng, ty, rows, cols, 1))).collect();
            // One activation row for all (the same type for every matrix of a group).
            let a = &ops[0].2 .1;
            let ts: Vec<Tensor<'_>> = ops.iter().map(|(ty, rows, (w, ..))| Tensor { ty: *ty, cols, rows: *rows, data: w, hi: &[], layout: crate::model::Layout::Plain }).collect();
            let alone: Vec<Vec<f32>> = ts.iter().map(|t| {
                let mut o = vec![0.0f32; t.rows];
                matmul(&k, &Sequential, t, a, 1, &mut o);
                o
            }).collect();
            let refs: Vec<&Tensor<'_>> = ts.iter().collect();
            for par in [&Sequential as &dyn Parallel, &Reversed(2), &Reversed(3), &Reversed(5)] {
                let mut outs: Vec<Vec<f32>> = ts.iter().map(|t| vec![f32::NAN; t.rows]).collect();
                let mut slices: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
                assert!(matvec_group(&k, par, &refs, a, &mut slices), "{} group {gi} refused", k.name());
                for (m, (o, e)) in outs.iter().zip(&alone).enumerate() {
                    for (r, (x, y)) in o.iter().zip(e).enumerate() {
                        assert_eq!(x.to_bits(), y.to_bits(), "{} group {gi} matrix {m} row {r}, {} tasks", k.name(), par.n_threads());
                    }
                }
            }
        }
        // Refused: Q8_0 and Q4_K activations differ; widths differ.
        let (w8, a8, ..) = matmul_operands(&k, &mut rng, Q8_0, 8, 512, 1);
        let (wk, ..) = matmul_operands(&k, &mut rng, Q4_K, 8, 512, 1);
        let (w8n, ..) = matmul_operands(&k, &mut rng, Q8_0, 8, 256, 1);
        let (t8, tk, t8n) = (Tensor { ty: Q8_0, cols: 512, rows: 8, data: &w8, hi: &[], layout: crate::model::Layout::Plain }, Tensor { ty: Q4_K, cols: 512, rows: 8, data: &wk, hi: &[], layout: crate::model::Layout::Plain }, Tensor { ty: Q8_0, cols: 256, rows: 8, data: &w8n, hi: &[], layout: crate::model::Layout::Plain });
        for pair in [[&t8, &tk], [&t8, &t8n]] {
            let (mut o1, mut o2) = ([f32::NAN; 8], [f32::NAN; 8]);
            assert!(!matvec_group(&k, &Reversed(2), &pair, &a8, &mut [&mut o1[..], &mut o2[..]]), "{}: a group of {} and {} x {} taken", k.name(), pair[0].ty, pair[1].ty, pair[1].cols);
            assert!(o1.iter().chain(&o2).all(|v| v.is_nan()), "a refused group wrote outputs");
        }
    }
}

/// Runs only task `.1` of a job, as thread `.1` of `.0` threads would (the rest are left
/// undone): which outputs a task writes.
struct OnlyTask(usize, usize);

impl crate::parallel::Parallel for OnlyTask {
    fn n_threads(&self) -> usize {
        self.0
    }
    fn run(&self, n_tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        if self.1 < n_tasks {
            task(self.1)
        }
    }
}

/// `matmul::one_token_shares` names the groups of 16 rows each thread computes for one
/// token, the rows the host places in that thread's run of bytes: for one rows16 matrix
/// (`matmul`) and for two and three (`matvec_group`), on two and three threads, task `t`
/// writes exactly the rows of its shares and the shares cover every group once; `None`
/// for a product past `matmul::BALANCE_BYTES` (in parts any thread may take) and for a
/// plain matrix.
#[test]
fn one_token_shares_are_the_tasks_rows() {
    use crate::matmul::{matmul, matvec_group, one_token_shares};
    use crate::model::{Layout, Tensor};
    use crate::quant::rows16::ROWS16;
    let mut rng = Rng::new(31);
    let Some(k) = rows16_kernel_sets().into_iter().find(|k| k.packs_rows16(Q4_0, 64) && k.packs_rows16(Q8_0, 64)) else { return };
    let cols = 576;
    let mats: Vec<(GgmlType, usize, Vec<u8>)> = [(Q4_0, 576), (Q4_0, 192), (Q4_0, 192), (Q8_0, 1536)].into_iter().map(|(ty, rows)| {
        let (mut w, _, wrb, _) = matmul_operands(&k, &mut rng, ty, rows, cols, 1);
        crate::quant::rows16::pack_in_place(ty, rows, cols, &mut w, &mut vec![0u8; ROWS16 * wrb]).unwrap();
        (ty, rows, w)
    }).collect();
    let (_, a, ..) = matmul_operands(&k, &mut rng, Q4_0, 16, cols, 1);
    let ts: Vec<Tensor<'_>> = mats.iter().map(|(ty, rows, w)| Tensor { ty: *ty, cols, rows: *rows, data: w, hi: &[], layout: Layout::Rows16 }).collect();
    for threads in [2, 3] {
        for ws in [vec![&ts[0]], vec![&ts[3]], vec![&ts[0], &ts[1], &ts[2]], vec![&ts[1], &ts[2]]] {
            let mut covered: Vec<Vec<u32>> = ws.iter().map(|w| vec![0; w.rows / ROWS16]).collect();
            for t in 0..threads {
                let shares = one_token_shares(&ws, threads, t).expect("a product under BALANCE_BYTES");
                let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; w.rows]).collect();
                if let [w] = ws[..] {
                    matmul(&k, &OnlyTask(threads, t), w, &a, 1, &mut outs[0]);
                } else {
                    let mut slices: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
                    assert!(matvec_group(&k, &OnlyTask(threads, t), &ws, &a, &mut slices));
                }
                for (i, o) in outs.iter().enumerate() {
                    for (r, v) in o.iter().enumerate() {
                        assert_eq!(!v.is_nan(), shares[i].contains(&(r / ROWS16)), "{} matrices, {threads} threads, task {t}: matrix {i} row {r}", ws.len());
                    }
                    for g in shares[i].clone() {
                        covered[i][g] += 1;
                    }
                }
            }
            assert!(covered.iter().flatten().all(|&c| c == 1), "{} matrices, {threads} threads: the shares cover every group once", ws.len());
        }
    }
    // Past BALANCE_BYTES (parts any thread may take), or plain: no shares.
    let big = vec![0u8; crate::matmul::BALANCE_BYTES + 34 * 18 * 16];
    let rows = big.len() / (34 * 18) / ROWS16 * ROWS16;
    let large = Tensor { ty: Q8_0, cols, rows, data: &big[..rows * 34 * 18], hi: &[], layout: Layout::Rows16 };
    assert!(one_token_shares(&[&large], 2, 0).is_none());
    let plain = Tensor { layout: Layout::Plain, ..ts[1] };
    assert!(one_token_shares(&[&ts[0], &plain], 2, 0).is_none());
}

/// With llama.cpp's batch arithmetic (`matmul_as(.., true)`), a matmul gives each (row,
/// token) the bits of that token's kernel in the batch (`dot_fn_in_batch`), whether a
/// tile or the per-token dot computes it: batches of 1 to 33 tokens around the 4-token
/// `gemm` groups, the 8-token tiled threshold and the tiles' widths, and of 72 and 102
/// (dealt out by spans of tokens on two and three tasks, the last span short), 1 to 3
/// tasks, row counts with and without the repacked layout (K-quants, the types with such
/// tiles).
#[test]
fn llama_cpp_batches_give_each_tokens_kernel_bits() {
    use crate::matmul::matmul_as;
    use crate::model::Tensor;
    use crate::parallel::{Parallel, Sequential};
    let mut rng = Rng::new(28);
    for k in fast_kernel_sets() {
        for (ty, rows) in [(Q4_K, 48usize), (Q4_K, 44), (Q6_K, 44), (Q2_K, 40)] {
            let cols = 512;
            let (w, a, wrb, rb) = matmul_operands(&k, &mut rng, ty, rows, cols, 102);
            let t = Tensor { ty, cols, rows, data: &w, hi: &[], layout: crate::model::Layout::Plain };
            for n in (1..=20).chain([24, 31, 33, 72, 102]) {
                for par in [&Sequential as &dyn Parallel, &Reversed(2), &Reversed(3)] {
                    let mut out = vec![f32::NAN; n * rows];
                    matmul_as(&k, par, &t, &a[..n * rb], n, &mut out, true);
                    for i in 0..n {
                        let dot = k.dot_fn_in_batch(ty, rows, n, i).unwrap();
                        for r in 0..rows {
                            let want = dot(cols, &w[r * wrb..(r + 1) * wrb], &a[i * rb..(i + 1) * rb]);
                            assert_eq!(out[i * rows + r].to_bits(), want.to_bits(), "{} {ty} {rows} rows, batch of {n}, token {i} row {r}, {} tasks", k.name(), par.n_threads());
                        }
                    }
                }
            }
        }
    }
}

/// The 8-row kernels give every row the bits of its single dot (odd row strides, random
/// lengths, every type that has one), with their far prefetch into L1 and into L2.
#[test]
fn dot_rows_give_each_dots_bits() {
    #[allow(unused_mut)]
    let mut sets = fast_kernel_sets();
    #[cfg(target_arch = "x86_64")]
    {
        let twins: Vec<Kernels> = sets.iter().filter_map(Kernels::other_prefetch).collect();
        assert_eq!(twins.len(), sets.len(), "every x86 set has a twin with the other prefetch level");
        sets.extend(twins);
    }
    let mut rng = Rng::new(22);
    let mut checked = 0;
    for k in &sets {
        for &ty in &[Q4_0, IQ4_NL, MXFP4, Q8_0, Q4_1, Q5_0, Q5_1, Q4_K] {
            let Some(rows) = k.dot_rows_fn(ty) else { continue };
            let dot = k.dot_fn(ty).unwrap();
            let vdt = Kernels::vec_dot_type(ty).unwrap();
            for i in 0..60 {
                let n = random_n(&mut rng, ty, i);
                let wrow = bytes_of(ty, n) + 3 * (i % 4);
                let mut w = vec![0u8; DOT_ROWS * wrow];
                for r in 0..DOT_ROWS {
                    let q = quantized(ty, &random_row(&mut rng, n));
                    w[r * wrow..r * wrow + q.len()].copy_from_slice(&q);
                }
                let a = activations(k, vdt, &random_row(&mut rng, n));
                let mut out = [f32::NAN; DOT_ROWS];
                rows(n, &w, wrow, &a, &mut out);
                for (r, o) in out.iter().enumerate() {
                    let want = dot(n, &w[r * wrow..], &a);
                    assert_eq!(o.to_bits(), want.to_bits(), "{ty} n={n} row {r}");
                }
                checked += 1;
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        let vnni = sets.iter().filter(|k| k.name().contains("vnni")).count();
        assert_eq!(checked, 420 * sets.len() + 60 * vnni, "Q4_0, IQ4_NL, MXFP4, Q8_0, Q4_1, Q5_0 and Q5_1 have 8-row kernels on AVX2, and Q4_K on AVX-512 VNNI");
    }
    let _ = checked;
}

/// The Q4_K prompt tiles at the integer extremes: every level 15 or 0 and every 6-bit
/// scale and min 63 against activations of ±127, rows all 15 (each 32-element
/// sub-block's sum as large as it gets, 32·15·127, and 8 `maddubs` pairs 8·2·15·127 =
/// 30480, which a tile may add as i16) and rows mixed by row, block and byte, so an i16
/// overflow in a tile's sums would show as a wrong output.
#[test]
fn q4_k_tiles_hold_the_extreme_sums() {
    let mut checked = 0;
    for k in &fast_kernel_sets() {
        let (Some(tile), Ok(dot)) = (k.dot_tile_fn(Q4_K), k.dot_fn(Q4_K)) else { continue };
        for (tile_f, tt) in [Some((tile.f, tile.tokens)), tile.rest].into_iter().flatten() {
            for n in [256usize, 1024, 2048] {
                let rows = 2 * tile.rows;
                let wrow = bytes_of(Q4_K, n);
                let mut w = vec![0u8; rows * wrow];
                for r in 0..rows {
                    for b in 0..n / 256 {
                        let blk = &mut w[r * wrow + b * 144..r * wrow + (b + 1) * 144];
                        blk[..2].copy_from_slice(&half::f16::from_f32(0.5).to_bits().to_le_bytes());
                        blk[2..4].copy_from_slice(&half::f16::from_f32(0.25).to_bits().to_le_bytes());
                        // Every scale and min 63 (all twelve bytes 0xFF).
                        blk[4..16].fill(0xFF);
                        for (i, q) in blk[16..].iter_mut().enumerate() {
                            *q = match r {
                                0 => 0xFF,
                                1 => 0x00,
                                _ if (r + b + i / 4) % 3 == 0 => 0x0F,
                                _ => 0xFF,
                            };
                        }
                    }
                }
                for (sign, flip) in [(1.0f32, false), (-1.0, false), (1.0, true)] {
                    let x: Vec<f32> = (0..n).map(|i| if flip && i % 7 == 3 { -sign } else { sign }).collect();
                    let one = activations(k, Q8_K, &x);
                    let arow = one.len();
                    let a: Vec<u8> = (0..tt).flat_map(|_| one.iter().copied()).collect();
                    let mut out = vec![f32::NAN; tt * rows];
                    tile_f(n, &w, wrow, rows, &a, arow, &mut out, rows);
                    let want: Vec<u32> = (0..rows).map(|r| dot(n, &w[r * wrow..], &one).to_bits()).collect();
                    for t in 0..tt {
                        for r in 0..rows {
                            assert_eq!(out[t * rows + r].to_bits(), want[r], "{} n={n} row {r} token {t} sign {sign}", k.name());
                        }
                    }
                    checked += 1;
                }
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    assert!(checked > 0 || fast_kernel_sets().is_empty(), "no Q4_K tile was checked");
    let _ = checked;
}

/// The Q4_0 8-row kernels at the integer extremes: every level -8 or +7 against
/// activations of ±127, rows 0 and 1 all -8 and all +7 (each 16-element sum as large as
/// it gets, 16·8·127, and `Σ q·y` 16·15·127), so an i16 overflow in a kernel's sums
/// would show as a wrong row.
#[test]
fn q4_0_dot_rows_hold_the_extreme_sums() {
    let mut checked = 0;
    for k in &fast_kernel_sets() {
        let (Some(rows), Ok(dot)) = (k.dot_rows_fn(Q4_0), k.dot_fn(Q4_0)) else { continue };
        for n in [32usize, 64, 576] {
            let wrow = bytes_of(Q4_0, n);
            let mut w = vec![0u8; DOT_ROWS * wrow];
            for r in 0..DOT_ROWS {
                for b in 0..n / 32 {
                    let blk = &mut w[r * wrow + b * 18..r * wrow + (b + 1) * 18];
                    blk[..2].copy_from_slice(&half::f16::from_f32(0.5).to_bits().to_le_bytes());
                    // Levels -8 (nibble 0) or +7 (nibble 15), both halves of each byte
                    // alike: row 0 all -8, row 1 all +7, the others mixed by row, block
                    // and group of four bytes.
                    for (i, q) in blk[2..].iter_mut().enumerate() {
                        *q = match r {
                            0 => 0x00,
                            1 => 0xFF,
                            _ if (r + b + i / 4) % 3 == 0 => 0x00,
                            _ => 0xFF,
                        };
                    }
                }
            }
            for (sign, flip) in [(1.0f32, false), (-1.0, false), (1.0, true), (-1.0, true)] {
                let x: Vec<f32> = (0..n).map(|i| if flip && i % 5 == 4 { -sign } else { sign }).collect();
                let a = activations(k, Q8_0, &x);
                let mut out = [f32::NAN; DOT_ROWS];
                rows(n, &w, wrow, &a, &mut out);
                for (r, o) in out.iter().enumerate() {
                    let want = dot(n, &w[r * wrow..], &a);
                    assert_eq!(o.to_bits(), want.to_bits(), "{} n={n} row {r} sign {sign}", k.name());
                }
                checked += 1;
            }
        }
    }
    // (The x86 sets have Q4_0 8-row kernels; NEON has none.)
    #[cfg(target_arch = "x86_64")]
    assert!(checked > 0 || fast_kernel_sets().is_empty(), "no Q4_0 8-row kernel was checked");
    let _ = checked;
}

/// The Q8_0 8-row kernels on weight bytes quantizing never makes: every byte value,
/// -128 included, in rows of random bytes, rows with a -128 in one block only, and rows of
/// -128 and 127 against activations of ±127 (the largest pair sums), each row against its
/// single dot and the reference.
#[test]
fn q8_0_dot_rows_take_any_weight_byte() {
    let reference = Kernels::reference().dot_fn(Q8_0).unwrap();
    let mut rng = Rng::new(0x5108);
    let mut checked = 0;
    for k in &fast_kernel_sets() {
        let (Some(rows), Ok(dot)) = (k.dot_rows_fn(Q8_0), k.dot_fn(Q8_0)) else { continue };
        for (i, n) in [32usize, 64, 576, 1536, 96, 2048].into_iter().enumerate() {
            let wrow = bytes_of(Q8_0, n) + i % 3;
            let mut w = vec![0u8; DOT_ROWS * wrow];
            for r in 0..DOT_ROWS {
                for b in 0..n / 32 {
                    let blk = &mut w[r * wrow + b * 34..r * wrow + (b + 1) * 34];
                    blk[..2].copy_from_slice(&half::f16::from_f32(0.25 + (r + b) as f32 / 64.0).to_bits().to_le_bytes());
                    for (j, q) in blk[2..].iter_mut().enumerate() {
                        *q = match (i + r) % 4 {
                            // Random bytes (-128 about once a block).
                            0 | 1 => rng.below(256) as u8,
                            // Quantizer-like bytes with a -128 in the middle block only.
                            2 => if b == n / 64 && j == 7 { 0x80 } else { (rng.below(255) as i32 - 127) as i8 as u8 },
                            // -128 and 127 only.
                            _ => if (r + b + j) % 3 == 0 { 0x80 } else { 0x7f },
                        };
                    }
                }
            }
            for x in [random_row(&mut rng, n), (0..n).map(|j| if j % 3 == 1 { 1.0 } else { -1.0 }).collect::<Vec<f32>>(), vec![-1.0; n]] {
                let a = activations(k, Q8_0, &x);
                let mut out = [f32::NAN; DOT_ROWS];
                rows(n, &w, wrow, &a, &mut out);
                for (r, o) in out.iter().enumerate() {
                    let want = dot(n, &w[r * wrow..], &a);
                    assert_eq!(o.to_bits(), want.to_bits(), "{} n={n} row {r}: rows kernel against its dot", k.name());
                    assert_eq!(want.to_bits(), reference(n, &w[r * wrow..], &a).to_bits(), "{} n={n} row {r}: dot against the reference", k.name());
                }
                checked += 1;
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    assert!(checked > 0 || fast_kernel_sets().is_empty(), "no Q8_0 8-row kernel was checked");
    let _ = checked;
}

/// The x86 sets prefetch far ahead into L1 exactly where CPUID's L1 data cache is 48 KiB
/// or more, and CPUID's L1 data cache is the one Linux reports (sysfs).
#[cfg(target_arch = "x86_64")]
#[test]
fn far_prefetch_level_follows_the_l1_data_cache() {
    let sysfs = (0..8)
        .find_map(|i| {
            let dir = std::format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
            let read = |f: &str| std::fs::read_to_string(std::format!("{dir}/{f}")).ok().map(|s| std::string::String::from(s.trim()));
            (read("level")? == "1" && read("type")? == "Data").then(|| read("size")).flatten()
        })
        .expect("sysfs names cpu0's level-1 data cache");
    let kib: usize = sysfs.strip_suffix('K').and_then(|k| k.parse().ok()).unwrap_or_else(|| panic!("sysfs L1d size {sysfs:?}"));
    assert_eq!(super::x86::cpu_l1d_bytes(), Some(kib << 10), "CPUID's L1 data cache against sysfs's {sysfs}");
    for k in fast_kernel_sets() {
        assert_eq!(k.prefetches_far_into_l1(), kib >= 48, "{}: L1d {kib} KiB", k.name());
        assert_ne!(k.other_prefetch().unwrap().prefetches_far_into_l1(), kib >= 48);
    }
}

/// The AVX-512 rows16 kernels ask for their weights Intel's distance ahead on Intel CPUs,
/// none on AMD family 19h (Zen 4) and AMD's elsewhere, and the AVX2 ones Intel's on Intel
/// and their own elsewhere, by the vendor and family Linux reports (/proc/cpuinfo); a set
/// and its twins run every distance; CPUID's family is read as the documented encoding
/// gives it.
#[cfg(target_arch = "x86_64")]
#[test]
fn rows16_prefetch_distance_follows_the_cpu() {
    use super::x86::cpuid_family;
    // Leaf 1 EAX of a Skylake-SP (family 6), a Zen 4 (19h) and a Zen 5 (1Ah).
    assert_eq!((cpuid_family(0x0005_0654), cpuid_family(0x00A1_0F11), cpuid_family(0x00B0_0F21)), (6, 0x19, 0x1A));
    let info = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim() == name).map(|(_, v)| std::string::String::from(v.trim())))
            .unwrap_or_else(|| panic!("/proc/cpuinfo has no {name}"))
    };
    let (vendor, family) = (field("vendor_id"), field("cpu family").parse::<u32>().expect("cpu family"));
    let (intel, amd, avx2, avx2_streams) = super::x86::ROWS16_PREFETCH_DISTANCES;
    let want = match (vendor.as_str(), family) {
        ("GenuineIntel", _) => intel,
        ("AuthenticAMD", 0x19) => 0,
        _ => amd,
    };
    let want_avx2 = match (vendor.as_str(), family) {
        ("GenuineIntel", _) => intel,
        ("AuthenticAMD", 0x19) => avx2_streams,
        _ => avx2,
    };
    let (mut avx512, mut avx2_sets) = (0, 0);
    for k in fast_kernel_sets() {
        let d = k.rows16_prefetch_distance().unwrap_or_else(|| panic!("{}: no rows16 distance", k.name()));
        if k.other_rounding().is_none() {
            // AVX2 alone: Intel's distance on Intel, three streams on AMD family 19h,
            // else one stream; its twin and the twin's twin the other two.
            avx2_sets += 1;
            assert_eq!(d, want_avx2, "{}: {vendor}, family {family:#x}", k.name());
            let twin = k.other_rows16_prefetch().unwrap();
            let mut seen = [d, twin.rows16_prefetch_distance().unwrap(), twin.other_rows16_prefetch().unwrap().rows16_prefetch_distance().unwrap()];
            seen.sort_unstable();
            let mut all = [avx2, avx2_streams, intel];
            all.sort_unstable();
            assert_eq!(seen, all, "{}: the twins' distances", k.name());
            continue;
        }
        avx512 += 1;
        assert_eq!(d, want, "{}: {vendor}, family {family:#x}", k.name());
        let twin = k.other_rounding().unwrap();
        let mut seen: Vec<usize> = [k, twin, k.other_rows16_prefetch().unwrap(), twin.other_rows16_prefetch().unwrap()].iter().map(|s| s.rows16_prefetch_distance().unwrap()).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, [0, intel, amd], "{}: the twins' distances", k.name());
    }
    assert_eq!(avx512 > 0, std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vnni"), "AVX-512 sets: {avx512}");
    assert_eq!(avx2_sets, 1, "the AVX2 set");
    // One-token products over plain rows add the far hint into L2 exactly where the rows16
    // kernels take Intel's distance (every set and its twins: both answers on any CPU).
    assert_eq!(Kernels::reference().plain_far_l2(), 0, "the reference");
    for s in rows16_kernel_sets() {
        let d = s.rows16_prefetch_distance().unwrap();
        assert_eq!(s.plain_far_l2() != 0, d == intel, "{}: plain rows' L2 hint {} beside rows16 distance {d}", s.name(), s.plain_far_l2());
    }
    // Non-temporal hints for a model far beyond the L3, only where the distance is AMD's
    // and the L3 is known (AMD's CPUID), never for a small one; the sets run them all.
    let l3 = super::x86::cpu_l3_bytes_amd();
    // CPUID's L3 is the one Linux reports for cpu0 (sysfs), on AMD.
    if vendor == "AuthenticAMD" {
        let sysfs = (0..8).find_map(|i| {
            let dir = std::format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
            let read = |f: &str| std::fs::read_to_string(std::format!("{dir}/{f}")).ok().map(|s| std::string::String::from(s.trim()));
            (read("level")? == "3").then(|| read("size")).flatten()
        });
        let kib = sysfs.as_deref().and_then(|s| s.strip_suffix('K')).and_then(|k| k.parse::<usize>().ok());
        assert_eq!(l3, kib.map(|k| k << 10), "CPUID's L3 against sysfs's {sysfs:?}");
    }
    for k in fast_kernel_sets() {
        let streams = k.rows16_prefetch_distance() == Some(amd) && l3.is_some();
        let big = k.for_weights(usize::MAX);
        assert_eq!(big.rows16_prefetch_distance() == Some(amd + 1), streams, "{}: L3 {l3:?}", k.name());
        assert_eq!(k.for_weights(1 << 20).rows16_prefetch_distance(), k.rows16_prefetch_distance(), "{}: 1 MiB of weights", k.name());
        if let Some(l3) = l3 {
            let edge = super::STREAM_L3_TIMES * l3;
            assert_eq!(k.for_weights(edge).rows16_prefetch_distance(), k.rows16_prefetch_distance(), "{}", k.name());
        }
        assert_eq!(big.name(), k.name());
    }
    let distances: Vec<Option<usize>> = rows16_kernel_sets().iter().map(Kernels::rows16_prefetch_distance).collect();
    for d in [0, amd, amd + 1] {
        assert_eq!(distances.contains(&Some(d)), avx512 > 0, "distance {d} among the rows16 test sets");
    }
    for d in [intel, avx2, avx2_streams] {
        assert!(distances.contains(&Some(d)), "distance {d} among the rows16 test sets");
    }
}

/// `Kernels::rope` gives `ops::rope_heads`' bits: both pair layouts, head widths wider
/// than the rotated dims, rotated dims the vectors do not cover (the reference's path),
/// angles of every size (a real table, positions up to 1M) and values of every scale.
#[test]
fn rope_gives_the_reference_bits() {
    let mut rng = Rng::new(31);
    let mut checked = 0;
    for k in &fast_kernel_sets() {
        for &(hd, n_rot) in &[(64, 64), (128, 128), (256, 256), (128, 64), (80, 48), (64, 24), (96, 96), (40, 40), (32, 16), (64, 0)] {
            for neox in [false, true] {
                for pos in [0usize, 1, 7, 4095, 32767, 1 << 20] {
                    let mut cs = vec![0.0f32; n_rot];
                    let scale = crate::ops::RopeScale { freq_scale: 1.0, ext_factor: 0.0, mscale: 1.0, corr_dims: [0.0, 0.0] };
                    if n_rot > 0 {
                        crate::ops::rope_angles_scaled(pos, 10000.0, n_rot, &scale, None, &mut cs);
                    }
                    let heads: Vec<f32> = (0..3 * hd).map(|_| (rng.unit() * 2.0 - 1.0) * libm::powf(10.0, rng.unit() * 8.0 - 4.0)).collect();
                    let (mut want, mut got) = (heads.clone(), heads.clone());
                    crate::ops::rope_heads(&mut want, hd, &cs, n_rot, neox);
                    k.rope(&mut got, hd, &cs, n_rot, neox);
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(g.to_bits(), w.to_bits(), "{}: hd {hd} n_rot {n_rot} neox {neox} pos {pos} element {i}: {g} vs {w}", k.name());
                    }
                    checked += 1;
                }
            }
        }
    }
    let _ = checked;
    #[cfg(target_arch = "x86_64")]
    assert!(checked > 0, "no SIMD kernel set checked");
}

/// Checks `k.expf_batch` against `ops::expf` on `xs` (in slices of varied length, so
/// the 16-, 8- and 4-lane bodies and the scalar tail all run); returns how many were checked.
fn check_expf_batch(k: &Kernels, xs: &[f32]) -> usize {
    let mut buf = xs.to_vec();
    let mut at = 0;
    let mut len = 1;
    while at < buf.len() {
        let end = (at + len).min(buf.len());
        k.expf_batch(&mut buf[at..end]);
        at = end;
        len = len % 37 + 1;
    }
    for (x, y) in xs.iter().zip(&buf) {
        assert_eq!(y.to_bits(), crate::ops::expf(*x).to_bits(), "expf_batch({x:e} = {:#010x})", x.to_bits());
    }
    xs.len()
}

/// The fast `expf_batch` gives `ops::expf`'s bits: special values and the range edges,
/// every f32 in dense windows (around 0, the softmax range near -1 and -20, the edges at
/// -87 and 88), inputs of the fast path's fallback, and 4M random values over the range.
#[test]
fn expf_batch_gives_the_reference_bits() {
    let sets = fast_kernel_sets();
    let mut xs: Vec<f32> = vec![0.0, -0.0, 1.0, -1.0, f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MIN, f32::MAX,
        f32::MIN_POSITIVE, -f32::MIN_POSITIVE, 1e-45, -1e-45, -87.0, 88.0, -87.33655, 88.72283, 88.7229, -103.97208, -103.9721, -200.0, 200.0];
    for centre in [0.0f32, -1.0, -20.0, -87.0, 88.0, 0.5, -0.3465736] {
        let b = centre.to_bits();
        for d in 0..20_000u32 {
            xs.push(f32::from_bits(b.wrapping_add(d)));
            xs.push(f32::from_bits(b.wrapping_sub(d)));
        }
    }
    let mut rng = Rng::new(41);
    for _ in 0..4_000_000 {
        xs.push(-104.0 + (rng.next() >> 40) as f32 / (1u64 << 24) as f32 * 194.0);
    }
    // Every kernel set (AVX2's 4 lanes, AVX-512's 8 where the CPU has it).
    for k in &sets {
        let n = check_expf_batch(k, &xs);
        assert!(n > 4_200_000);
    }
}

/// Every f32 in (-87, 88) (2.2·10^9 values) in every kernel set the CPU has (~10 s in
/// release for two sets, so CI runs it: it guards the claim that x86_64's fast
/// exponentials are the reference's on every input).
/// Native x86_64 only: under qemu-aarch64 it would take minutes, and there the 4.3M
/// values of `expf_batch_gives_the_reference_bits` check every kernel set.
#[cfg(target_arch = "x86_64")]
#[test]
fn expf_batch_every_f32_in_range() {
    // Every kernel set this CPU has (AVX2's 4 lanes, AVX-512's 8 where present).
    let sets = fast_kernel_sets();
    assert!(!sets.is_empty(), "no x86_64 kernel set on this CPU");
    let mut buf = vec![0.0f32; 1 << 16];
    let mut want = vec![0.0f32; 1 << 16];
    let (mut n, mut bits) = (0u64, 0u64);
    while bits <= u32::MAX as u64 {
        let mut m = 0;
        while m < buf.len() && bits <= u32::MAX as u64 {
            let x = f32::from_bits(bits as u32);
            bits += 1;
            if x > -87.0 && x < 88.0 {
                buf[m] = x;
                m += 1;
            }
        }
        for (w, x) in want[..m].iter_mut().zip(&buf[..m]) {
            *w = crate::ops::expf(*x);
        }
        for k in &sets {
            let mut got = buf[..m].to_vec();
            k.expf_batch(&mut got);
            for i in 0..m {
                assert_eq!(got[i].to_bits(), want[i].to_bits(), "{}: expf_batch({:e})", k.name(), buf[i]);
            }
        }
        n += m as u64;
    }
    println!("{n} inputs checked");
}

/// The activation quantizer's rounding (`quantize::rint_i8`) is `libm::rintf(t) as i8`
/// on every input: each multiple of 1/4 from -160 to 160 (ties to even among them),
/// the f32 neighbours of every half-integer there, 2^22 and around it, ±inf, NaN and
/// 2^20 random bit patterns.
#[test]
fn activation_rounding_is_rintf_everywhere() {
    let check = |t: f32| assert_eq!(super::quantize::rint_i8(t), libm::rintf(t) as i8, "rint_i8({t:e}) (bits {:#010x})", t.to_bits());
    for i in -640..=640 {
        let t = i as f32 / 4.0;
        check(t);
        for d in 1..=2 {
            check(f32::from_bits(t.to_bits().wrapping_add(d)));
            check(f32::from_bits(t.to_bits().wrapping_sub(d)));
        }
    }
    for t in [4_194_304.0f32, 4_194_303.5, 4_194_304.5, 8_388_608.0, 1e30, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -0.0, 0.5, -0.5, 1.5, -1.5, 127.5, -128.5] {
        check(t);
        check(-t);
    }
    let mut rng = Rng::new(0x21e7);
    for _ in 0..1 << 20 {
        check(f32::from_bits(rng.next() as u32));
    }
}

/// A matrix packed in the rows16 layout gives, in `matmul` (batches of 1 to 20, 64 and 150
/// tokens, one to five tasks in any order; 64 and 150 dealt out by tokens on one and two
/// tasks, 150 with a last item shorter than a tile) and in a `matvec_group` beside plain
/// matrices, every (token, row) the bits the plain matrix gives — in keel's batches and in
/// llama.cpp's (`matmul_as` with `llama_cpp_batches`) — for each kernel set with rows16
/// kernels, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K, with a product past `matmul::BALANCE_BYTES`
/// (one token in parts) among them, and a Q4_0 matrix of 63 groups (several calls of
/// `ROWS16_Q4_0_GROUPS` per task), and one token's groups in three streams (where the set
/// takes them: AMD's hints, on every x86 through the twins) with passes whole and cut. So does the packed matrix placed in two parts
/// (`Tensor::hi`: cut after its first group, in the middle, before its last), in
/// `matmul`, `matvec_group` and `Tensor::dequantize_row`.
#[test]
fn rows16_matrices_give_the_plain_matrices_bits() {
    use crate::matmul::{matmul, matmul_as, matvec_group};
    use crate::model::{Layout, Tensor};
    use crate::parallel::{Parallel, Sequential};
    use crate::quant::rows16::{pack_in_place, ROWS16};
    let mut rng = Rng::new(30);
    let mut checked = 0;
    for k in rows16_kernel_sets() {
        for (ty, rows, cols) in [(Q4_1, 48usize, 96usize), (Q4_1, 32, 640), (Q4_1, 96, 576), (Q5_0, 96, 576), (Q8_0, 48, 608), (Q4_0, 48, 576), (Q4_0, 32, 1280), (Q4_0, 1008, 64), (Q5_0, 80, 640), (Q8_0, 80, 576), (Q8_0, 4096, 1024), (Q4_K, 48, 512), (Q4_K, 8192, 1024), (Q6_K, 48, 768), (Q6_K, 6144, 1024)] {
            if !k.packs_rows16(ty, rows) {
                continue;
            }
            let n_max = if rows > 1024 { 1 } else { 150 };
            let (w, a, wrb, rb) = matmul_operands(&k, &mut rng, ty, rows, cols, n_max);
            let mut p = w.clone();
            pack_in_place(ty, rows, cols, &mut p, &mut vec![0u8; ROWS16 * wrb]).unwrap();
            let plain = Tensor { ty, cols, rows, data: &w, hi: &[], layout: Layout::Plain };
            let packed = Tensor { ty, cols, rows, data: &p, hi: &[], layout: Layout::Rows16 };
            // The same matrix placed in two parts (`Tensor::hi`, as the host places a
            // matrix two threads share): after its first group, in the middle, before
            // its last group; each part in a buffer of its own.
            let groups = rows / ROWS16;
            let cuts: Vec<usize> = [1, groups / 2, groups - 1].into_iter().filter(|&c| c > 0 && c < groups).collect();
            let parts: Vec<(Vec<u8>, Vec<u8>)> = cuts.iter().map(|&c| (p[..c * ROWS16 * wrb].to_vec(), p[c * ROWS16 * wrb..].to_vec())).collect();
            let split: Vec<Tensor<'_>> = parts.iter().map(|(lo, hi)| Tensor { ty, cols, rows, data: lo, hi, layout: Layout::Rows16 }).collect();
            for (t, c) in split.iter().zip(&cuts) {
                assert_eq!(t.hi_group(), *c);
                for r in [0, c * ROWS16 - 1, c * ROWS16, rows - 1] {
                    let (mut x, mut y) = (vec![0.0f32; cols], vec![1.0f32; cols]);
                    packed.dequantize_row(&k, r, &mut x).unwrap();
                    t.dequantize_row(&k, r, &mut y).unwrap();
                    assert!(x.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()), "{} {ty} row {r} of a matrix cut at group {c}", k.name());
                }
            }
            for n in (1..=20.min(n_max)).chain([64, 150].into_iter().filter(|&n| n <= n_max)) {
                let mut want = vec![0.0f32; n * rows];
                matmul(&k, &Sequential, &plain, &a[..n * rb], n, &mut want);
                let mut want_llama = vec![0.0f32; n * rows];
                matmul_as(&k, &Sequential, &plain, &a[..n * rb], n, &mut want_llama, true);
                for par in [&Sequential as &dyn Parallel, &Reversed(2), &Reversed(5)] {
                    // The matrix in one part, and in two (fewer batches: the calls that
                    // meet the cut are the same at every size past a tile).
                    let cut = if n <= 3 || n == 17 || n == 64 { &split[..] } else { &[] };
                    for (s, t) in core::iter::once(&packed).chain(cut).enumerate() {
                        let mut out = vec![f32::NAN; n * rows];
                        matmul(&k, par, t, &a[..n * rb], n, &mut out);
                        for (j, (o, e)) in out.iter().zip(&want).enumerate() {
                            assert_eq!(o.to_bits(), e.to_bits(), "{} {ty} batch of {n}, token {} row {}, {} tasks, parts {s}", k.name(), j / rows, j % rows, par.n_threads());
                        }
                        let mut out = vec![f32::NAN; n * rows];
                        matmul_as(&k, par, t, &a[..n * rb], n, &mut out, true);
                        for (j, (o, e)) in out.iter().zip(&want_llama).enumerate() {
                            assert_eq!(o.to_bits(), e.to_bits(), "{} {ty} llama.cpp's batch of {n}, token {} row {}, {} tasks, parts {s}", k.name(), j / rows, j % rows, par.n_threads());
                        }
                    }
                }
            }
            // Beside a plain matrix of the same activation type in one group.
            let (w2, ..) = matmul_operands(&k, &mut rng, ty, 24, cols, 1);
            let other = Tensor { ty, cols, rows: 24, data: &w2, hi: &[], layout: Layout::Plain };
            let alone: Vec<Vec<f32>> = [&plain, &other].iter().map(|t| {
                let mut o = vec![0.0f32; t.rows];
                matmul(&k, &Sequential, t, &a[..rb], 1, &mut o);
                o
            }).collect();
            for par in [&Sequential as &dyn Parallel, &Reversed(2), &Reversed(3)] {
                for (s, t) in core::iter::once(&packed).chain(&split).enumerate() {
                    let mut outs = [vec![f32::NAN; rows], vec![f32::NAN; 24]];
                    let [o0, o1] = &mut outs;
                    assert!(matvec_group(&k, par, &[t, &other], &a[..rb], &mut [&mut o0[..], &mut o1[..]]), "{} {ty} group refused", k.name());
                    for (m, (o, e)) in outs.iter().zip(&alone).enumerate() {
                        for (r, (x, y)) in o.iter().zip(e).enumerate() {
                            assert_eq!(x.to_bits(), y.to_bits(), "{} {ty} group matrix {m} row {r}, {} tasks, parts {s}", k.name(), par.n_threads());
                        }
                    }
                }
            }
            checked += 1;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if crate::quant::x86::cpu_has_avx512_vnni() {
        assert!(checked >= 12, "the AVX-512 VNNI sets pack Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K");
    }
    let _ = checked;
}

//! `cargo test -p keel-core --release quant::bench -- --ignored --nocapture`: ns per
//! `vec_dot` call of each kernel set, with the weight rows hot in L1 (8 rows cycled) and
//! streamed from a matrix larger than L2 (rows of ~16 MiB in total, as in decode).

extern crate std;
use std::{hint::black_box, println, time::Instant, vec::Vec};

use super::tests::{fast_kernels, random_row, Rng};
use super::*;
use crate::ggml_type::GgmlType::{self, *};

/// ns per call of `f`: the fastest of `rounds` rounds of 20 calls.
fn fastest_ns(f: &dyn Fn(), rounds: usize) -> f64 {
    let mut b = u128::MAX;
    for _ in 0..rounds {
        let t0 = Instant::now();
        for _ in 0..20 {
            f();
        }
        b = b.min(t0.elapsed().as_nanos());
    }
    b as f64 / 20.0
}

/// ns per call: rows are timed in chunks of 8 consecutive calls and the fastest chunk
/// wins (the machine may be shared: a chunk is short enough to run undisturbed often).
/// Hot: the same 8 rows over and over; streamed: every row of a ~16 MiB matrix in turn.
fn ns_per_call(dot: DotFn, n: usize, rows: &[Vec<u8>], a: &[u8]) -> f64 {
    let passes = (2_000_000 / (rows.len() * n)).max(3);
    let mut s = 0.0f32;
    let mut best = u128::MAX;
    for _ in 0..passes {
        for chunk in rows.chunks_exact(8) {
            let t = Instant::now();
            for r in chunk {
                s += dot(n, black_box(r), black_box(a));
            }
            best = best.min(t.elapsed().as_nanos());
        }
    }
    black_box(s);
    best as f64 / 8.0
}

#[test]
#[ignore]
fn bench_vec_dot() {
    let reference = Kernels::reference();
    let fast = fast_kernels();
    let mut rng = Rng::new(7);
    for wtype in [Q4_1, Q8_0, Q4_0, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F16, F32] {
        let atype = Kernels::vec_dot_type(wtype).unwrap();
        for n in [576usize, 1536] {
            if n % wtype.block_size() != 0 {
                continue;
            }
            let row_bytes = wtype.row_bytes(n as u64).unwrap() as usize;
            let n_big = (16 << 20) / row_bytes;
            let rows: Vec<Vec<u8>> = (0..n_big)
                .map(|i| {
                    let mut out = std::vec![0u8; row_bytes];
                    if i < 8 {
                        quantize_row_ref(wtype, &random_row(&mut rng, n), &mut out).unwrap();
                    } else {
                        out.copy_from_slice(&[0x5Au8, 0x3C].repeat(row_bytes / 2 + 1)[..row_bytes]);
                    }
                    out
                })
                .collect();
            let mut a = std::vec![0u8; atype.row_bytes(n as u64).unwrap() as usize];
            reference.quantize_activations(atype, &random_row(&mut rng, n), &mut a).unwrap();
            let r_hot = ns_per_call(reference.dot_fn(wtype).unwrap(), n, &rows[..8], &a);
            let line = match fast {
                Some(k) => {
                    let f = k.dot_fn(wtype).unwrap();
                    let hot = ns_per_call(f, n, &rows[..8], &a);
                    let cold = ns_per_call(f, n, &rows, &a);
                    std::format!("{} hot {hot:7.1} ns  streamed {cold:7.1} ns ({:.1} GB/s)", k.name(), row_bytes as f64 / cold)
                }
                None => std::string::String::from("no SIMD"),
            };
            println!("{:>5} n={n:5}: reference hot {r_hot:8.1} ns | {line}", GgmlType::name(wtype));
        }
    }
}

/// `cargo test -p keel-core --release quant::bench::bench_matmul -- --ignored --nocapture`:
/// GFLOP/s of `matmul::matmul` on one thread (`parallel::Sequential`) for a batch of 512
/// tokens against 1536 weight rows of 576 (1024 for the K-quants) columns — the prompt
/// tiles where a type has one, in cache — for every kernel set this CPU has, in the plain
/// layout and, where the set packs the type, in the rows16 layout (`quant::rows16`, as a
/// model's matrices are loaded); best of 20.
#[test]
#[ignore]
fn bench_matmul() {
    use crate::matmul::{matmul, quantize_rows};
    use crate::model::Tensor;
    use crate::parallel::Sequential;
    let mut rng = Rng::new(9);
    let n = 512;
    for wtype in [Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K] {
        let (rows, cols) = (1536usize, if wtype.block_size() == 256 { 1024 } else { 576 });
        let wrb = wtype.row_bytes(cols as u64).unwrap() as usize;
        let mut w = std::vec![0u8; rows * wrb];
        for r in 0..rows {
            quantize_row_ref(wtype, &random_row(&mut rng, cols), &mut w[r * wrb..(r + 1) * wrb]).unwrap();
        }
        let x: Vec<f32> = (0..n).flat_map(|_| random_row(&mut rng, cols)).collect();
        let mut packed = w.clone();
        let rows16_ok = crate::quant::rows16::pack_in_place(wtype, rows, cols, &mut packed, &mut std::vec![0u8; crate::quant::rows16::ROWS16 * wrb]).is_ok();
        let mut out = std::vec![0.0f32; n * rows];
        for k in super::tests::fast_kernel_sets().into_iter().chain([Kernels::reference()]) {
            let atype = Kernels::vec_dot_type(wtype).unwrap();
            let mut a = std::vec![0u8; n * atype.row_bytes(cols as u64).unwrap() as usize];
            quantize_rows(&k, &Sequential, atype, &x, n, cols, &mut a);
            let plain = Tensor { ty: wtype, cols, rows, data: &w, hi: &[], layout: crate::model::Layout::Plain };
            let rows16 = Tensor { ty: wtype, cols, rows, data: &packed, hi: &[], layout: crate::model::Layout::Rows16 };
            let layouts = if rows16_ok && k.packs_rows16(wtype, rows) { &[("plain", plain), ("rows16", rows16)][..] } else { &[("plain", plain)][..] };
            for (name, t) in layouts {
                let reps = if k.is_reference() { 1 } else { 20 };
                let mut best = f64::MAX;
                for _ in 0..reps {
                    let t0 = Instant::now();
                    matmul(&k, &Sequential, t, black_box(&a), n, &mut out);
                    best = best.min(t0.elapsed().as_secs_f64());
                }
                black_box(&out);
                let gflops = 2.0 * (rows * cols * n) as f64 / best / 1e9;
                println!("{:>5} {rows}x{cols} x {n} tokens, {:>16}, {name:>6}: {gflops:6.1} GFLOP/s ({:.2} ms)", GgmlType::name(wtype), k.name(), best * 1e3);
            }
        }
    }
}

/// `cargo test -p keel-core --release quant::bench::bench_attention -- --ignored --nocapture`:
/// ns per (key, head) of the attention's chunk ops — `f16_dot_keys_heads` (K·Q) and
/// `f16_mad_keys_heads` (value updates with the running sum) — for the query heads of one
/// KV head (1, 3 and 4 of them) over 16 chunks of 64 keys from a 512-position cache
/// (rows of 64, 128 and 256 f16, in cache), and per (query, key, head) of K·Q for a block
/// of 16 queries (`f16_dot_keys_queries` where the set has it, else query by query), for
/// every kernel set this CPU has (the f16 sets of the attention tests); kernel sets
/// interleaved, best of 300.
#[test]
#[ignore]
fn bench_attention() {
    use half::f16;
    let sets = super::tests_f16::kernel_sets();
    let mut rng = Rng::new(10);
    let (positions, len, chunks) = (512usize, 64usize, 16usize);
    const QUERIES: usize = 16;
    for n in [64usize, 128, 256] {
        let stride = 3 * n;
        let kv: Vec<f16> = (0..positions * stride).map(|_| f16::from_f32(rng.unit())).collect();
        let offs: Vec<Vec<usize>> = (0..chunks).map(|ch| (0..len).map(|c| ((ch * len + c) % positions) * stride).collect()).collect();
        for heads in [1usize, 3, 4] {
            let qs: Vec<f16> = (0..QUERIES * heads * n).map(|_| f16::from_f32(rng.unit())).collect();
            let e: Vec<f32> = (0..heads * len).map(|_| rng.unit().abs()).collect();
            let new_max: Vec<bool> = (0..heads * len).map(|i| i % len == 0).collect();
            let mut best = std::vec![[f64::MAX; 3]; sets.len()];
            let (mut out, mut y, mut sums) = (std::vec![0.0f32; QUERIES * heads * len], std::vec![f16::ZERO; heads * n], std::vec![0.0f32; heads]);
            for _ in 0..300 {
                for (ki, k) in sets.iter().enumerate() {
                    let t0 = Instant::now();
                    for o in &offs {
                        k.f16_dot_keys_heads(&kv, o, &qs[..heads * n], n, heads, &mut out[..heads * len]);
                    }
                    best[ki][0] = best[ki][0].min(t0.elapsed().as_secs_f64());
                    let t0 = Instant::now();
                    for o in &offs {
                        if !k.f16_dot_keys_queries(&kv, o, &qs, n, heads, QUERIES, &mut out) {
                            for (q, out) in qs.chunks_exact(heads * n).zip(out.chunks_exact_mut(heads * len)) {
                                k.f16_dot_keys_heads(&kv, o, q, n, heads, out);
                            }
                        }
                    }
                    best[ki][2] = best[ki][2].min(t0.elapsed().as_secs_f64() / QUERIES as f64);
                    let t0 = Instant::now();
                    for o in &offs {
                        k.f16_mad_keys_heads(&mut y, n, heads, &kv, o, &new_max, &e, &mut sums);
                    }
                    best[ki][1] = best[ki][1].min(t0.elapsed().as_secs_f64());
                }
            }
            black_box((&out, &y, &sums));
            let per = (chunks * len * heads) as f64 / 1e9;
            for (k, b) in sets.iter().zip(&best) {
                println!("rows of {n:3}, {heads} head(s), {:>26}: K·Q {:6.2} ns ({QUERIES} queries: {:6.2} ns), value update {:6.2} ns per key and head", super::tests_f16::label(k), b[0] / per, b[2] / per, b[1] / per);
            }
        }
    }
}

/// `cargo test -p keel-core --release --lib bench_expf -- --ignored --nocapture`: ns per
/// value of `expf_batch` (the softmax's exponentials) for each kernel set, 4096 values in
/// [-20, 0] as a softmax gives them, the fastest of 200 rounds (each from the same inputs).
#[test]
#[ignore]
fn bench_expf() {
    let mut rng = Rng::new(23);
    let src: Vec<f32> = (0..4096).map(|_| -20.0 * rng.unit().abs()).collect();
    let mut buf = src.clone();
    for k in super::tests::fast_kernel_sets() {
        let mut best = f64::MAX;
        for _ in 0..200 {
            buf.copy_from_slice(&src);
            let t0 = Instant::now();
            k.expf_batch(black_box(&mut buf));
            best = best.min(t0.elapsed().as_nanos() as f64);
        }
        black_box(&buf);
        println!("{:>10}: expf_batch {:.3} ns per value", k.name(), best / src.len() as f64);
    }
}

/// This thread's CPU time in seconds (so that time the shared machine gives to others
/// does not count).
fn thread_cpu_s() -> f64 {
    #[repr(C)]
    struct Ts {
        s: i64,
        ns: i64,
    }
    extern "C" {
        fn clock_gettime(clk: i32, ts: *mut Ts) -> i32;
    }
    let mut ts = Ts { s: 0, ns: 0 };
    // SAFETY: a valid pointer to a timespec; CLOCK_THREAD_CPUTIME_ID is 3 on Linux.
    unsafe { clock_gettime(3, &mut ts) };
    ts.s as f64 + ts.ns as f64 * 1e-9
}

/// `cargo test -p keel-core --release quant::bench::bench_matmul_short -- --ignored --nocapture`:
/// CPU time per `matmul::matmul` on one thread of short batches (1..=9 tokens, as
/// speculative verification runs them) against a Q8_0 / Q4_0 matrix of 576 columns
/// streamed from memory (~100 MiB, as in decode), relative to one token; batch sizes
/// interleaved, best of 7.
#[test]
#[ignore]
fn bench_matmul_short() {
    use crate::matmul::{matmul, quantize_rows};
    use crate::model::Tensor;
    use crate::parallel::Sequential;
    let mut rng = Rng::new(11);
    for k in super::tests::fast_kernel_sets() {
        for wtype in [Q8_0, Q4_0] {
            let cols = 576usize;
            let wrb = wtype.row_bytes(cols as u64).unwrap() as usize;
            let rows = (100usize << 20) / wrb / 64 * 64;
            let mut w = std::vec![0u8; rows * wrb];
            let mut row = std::vec![0u8; wrb];
            for r in 0..rows {
                if r < 64 {
                    quantize_row_ref(wtype, &random_row(&mut rng, cols), &mut row).unwrap();
                }
                w[r * wrb..(r + 1) * wrb].copy_from_slice(&row);
            }
            let atype = Kernels::vec_dot_type(wtype).unwrap();
            let t = Tensor { ty: wtype, cols, rows, data: &w, hi: &[], layout: crate::model::Layout::Plain };
            let x: Vec<f32> = (0..9).flat_map(|_| random_row(&mut rng, cols)).collect();
            let mut a = std::vec![0u8; 9 * atype.row_bytes(cols as u64).unwrap() as usize];
            quantize_rows(&k, &Sequential, atype, &x, 9, cols, &mut a);
            let mut out = std::vec![0.0f32; 9 * rows];
            let mut best = [[f64::MAX; 9]; 2];
            for _ in 0..7 {
                for n in 1..=9usize {
                    for (j, b) in best.iter_mut().enumerate() {
                        crate::matmul::NO_PAIRS.store(j == 1, core::sync::atomic::Ordering::Relaxed);
                        let t0 = thread_cpu_s();
                        matmul(&k, &Sequential, &t, black_box(&a), n, &mut out);
                        b[n - 1] = b[n - 1].min(thread_cpu_s() - t0);
                    }
                }
            }
            crate::matmul::NO_PAIRS.store(false, core::sync::atomic::Ordering::Relaxed);
            black_box(&out);
            for n in 1..=9 {
                let [p, g] = [best[0][n - 1], best[1][n - 1]];
                println!("{:>5} {:>9} {rows}x{cols} x {n}: {:7.3} ms CPU, {:.2}x one token (general path: {:.2}x)", GgmlType::name(wtype), k.name(), p * 1e3, p / best[0][0], g / best[0][0]);
            }
        }
    }
}

/// `cargo test -p keel-core --release quant::bench::bench_short_kernels -- --ignored --nocapture`:
/// the 8-row kernel (decode's) and the tile kernel of each weight type with everything in
/// L1 (8 rows of 2048 columns, 9-35 KiB; the tiles' rows may reach L2), best of many short runs: ns per (row, token,
/// block) and the weight bytes per second that rate consumes. Decode streams weights from
/// memory at the read loop's rate (`keel bench --roofline`) only where the 8-row kernel
/// runs faster than that from L1.
#[test]
#[ignore]
fn bench_short_kernels() {
    let mut rng = Rng::new(12);
    let cols = 2048usize;
    for ty in [Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K] {
        let wrb = ty.row_bytes(cols as u64).unwrap() as usize;
        let nb = cols / 32;
        let mut w = std::vec![0u8; 32 * wrb];
        for r in 0..32 {
            quantize_row_ref(ty, &random_row(&mut rng, cols), &mut w[r * wrb..(r + 1) * wrb]).unwrap();
        }
        let atype = Kernels::vec_dot_type(ty).unwrap();
        let arb = atype.row_bytes(cols as u64).unwrap() as usize;
        let mut a = std::vec![0u8; 32 * arb];
        for t in 0..32 {
            fast_kernels().unwrap().quantize_activations(atype, &random_row(&mut rng, cols), &mut a[t * arb..(t + 1) * arb]).unwrap();
        }
        for k in super::tests::fast_kernel_sets() {
            let best = |f: &dyn Fn()| fastest_ns(f, 2000);
            let name = GgmlType::name(ty);
            if let Some(rows) = k.dot_rows_fn(ty) {
                let mut o = [0.0f32; DOT_ROWS];
                let t = best(&|| rows(cols, black_box(&w), wrb, black_box(&a), black_box(&mut o.clone())));
                black_box(&mut o);
                println!("{name:>6} {:>16} rows 8x1: {:.3} ns per (row, token, block), {:.1} GB/s of weights", k.name(), t / (8 * nb) as f64, (8 * wrb) as f64 / t);
            }
            if let Some(tile) = k.dot_tile_fn(ty) {
                let o = std::vec![0.0f32; tile.tokens * tile.rows];
                let t = best(&|| (tile.f)(cols, black_box(&w), wrb, tile.rows, black_box(&a), arb, black_box(&mut o.clone()), tile.rows));
                println!("{name:>6} {:>16} tile {}x{}: {:.3} ns per (row, token, block)", k.name(), tile.rows, tile.tokens, t / (tile.rows * tile.tokens * nb) as f64);
            }
        }
    }
}

/// Issue rates of the 512-bit operations the x86 kernels lean on, in ns per operation or
/// step over 12 independent chains (inputs through `black_box`, so nothing folds): the
/// integer multiplies and the decode kernels' other steps (int-to-float conversion,
/// variable shift, lane permute) alone and beside an independent fma
/// (same ns: separate pipes; about twice: shared ones), and the exact value update's step
/// (fma, then the f16 round trip) on 512- and 256-bit vectors and with the round to odd.
/// Prints only: the CPU decides.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn bench_vector_ports() {
    use core::arch::x86_64::*;
    if !crate::quant::x86::cpu_has_avx512_vnni() {
        println!("no AVX-512 VNNI: nothing to measure");
        return;
    }
    const STEPS: usize = 4_000_000;
    const C: usize = 12;
    // Fastest of 5 runs of STEPS rounds of C chains, in ns per chain step.
    let best = |f: &dyn Fn() -> u32| {
        let mut b = f64::MAX;
        for _ in 0..5 {
            let t0 = Instant::now();
            black_box(f());
            b = b.min(t0.elapsed().as_nanos() as f64 / (STEPS * C) as f64);
        }
        b
    };
    // (Const parameters: one loop per operation, no dispatch inside it.)
    /// `chains`' operation number for no integer operation (the fma alone).
    const FMA_ONLY: u8 = u8::MAX;
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn chains<const OP: u8, const FMA: bool>() -> u32 {
        // (Value-only intrinsics; AVX-512 F/BW/VNNI present: checked by the caller.)
        let (u, s) = (_mm512_set1_epi8(black_box(3)), _mm512_set1_epi8(black_box(-2)));
        let (p, q) = (_mm512_set1_ps(black_box(0.999)), _mm512_set1_ps(black_box(0.5)));
        let idx = _mm512_set1_epi32(black_box(3));
        let mut a = [_mm512_set1_epi32(black_box(1)); C];
        let mut f = [_mm512_set1_ps(black_box(1.0)); C];
        for _ in 0..STEPS {
            for i in 0..C {
                a[i] = match OP {
                    0 => _mm512_dpbusd_epi32(a[i], u, s),
                    1 => _mm512_maddubs_epi16(a[i], s),
                    2 => _mm512_madd_epi16(a[i], s),
                    3 => _mm512_castps_si512(_mm512_cvtepi32_ps(a[i])),
                    4 => _mm512_srlv_epi32(a[i], idx),
                    5 => _mm512_permutexvar_epi32(idx, a[i]),
                    _ => a[i],
                };
                if FMA {
                    f[i] = _mm512_fmadd_ps(p, q, f[i]);
                }
            }
        }
        let mut r = 0u32;
        for i in 0..C {
            r = r.wrapping_add(_mm512_reduce_add_epi32(a[i]) as u32).wrapping_add(_mm512_reduce_add_ps(f[i]) as u32);
        }
        r
    }
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    unsafe fn value_steps(kind: u8) -> u32 {
        // SAFETY: value-only intrinsics and stores into the local `t`; AVX-512 F present
        // (checked by the caller).
        unsafe {
            const RD: i32 = _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC;
            const RU: i32 = _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC;
            let (x, e) = (_mm512_set1_ps(black_box(0.999)), _mm512_set1_ps(black_box(0.5)));
            let one = _mm512_set1_epi32(1);
            let mut z = [_mm512_set1_ps(black_box(1.0)); C];
            let mut y = [_mm256_set1_ps(black_box(1.0)); C];
            for _ in 0..STEPS {
                for i in 0..C {
                    match kind {
                        0 => z[i] = _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_fmadd_ps(x, e, z[i]))),
                        1 => {
                            let v = _mm256_fmadd_ps(_mm512_castps512_ps256(x), _mm512_castps512_ps256(e), y[i]);
                            y[i] = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
                        }
                        _ => {
                            let rd = _mm512_castps_si512(_mm512_fmadd_round_ps::<RD>(x, e, z[i]));
                            let ru = _mm512_castps_si512(_mm512_fmadd_round_ps::<RU>(x, e, z[i]));
                            let odd = _mm512_mask_blend_epi32(_mm512_test_epi32_mask(rd, one), ru, rd);
                            z[i] = _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_castsi512_ps(odd)));
                        }
                    }
                }
            }
            let mut r = 0u32;
            for i in 0..C {
                let mut t = [0.0f32; 8];
                _mm256_storeu_ps(t.as_mut_ptr(), y[i]);
                r = r.wrapping_add(_mm512_reduce_add_ps(z[i]) as u32).wrapping_add(t[0] as u32);
            }
            r
        }
    }
    // SAFETY (each call below): AVX-512 F/BW/VL/VNNI present (checked above).
    macro_rules! rates {
        ($($name:expr => $op:expr),*) => {$(
            let alone = best(&|| unsafe { chains::<$op, false>() });
            let beside = best(&|| unsafe { chains::<$op, true>() });
            println!("{:>12}: {alone:.3} ns alone, {beside:.3} ns with an independent fma per op", $name);
        )*};
    }
    rates!("vpdpbusd" => 0, "vpmaddubsw" => 1, "vpmaddwd" => 2, "vcvtdq2ps" => 3, "vpsrlvd" => 4, "vpermd" => 5);
    println!("{:>12}: {:.3} ns alone", "vfmadd", best(&|| unsafe { chains::<FMA_ONLY, true>() }));
    let zmm = best(&|| unsafe { value_steps(0) });
    let ymm = best(&|| unsafe { value_steps(1) });
    let odd = best(&|| unsafe { value_steps(2) });
    println!("value update step, 16 elements: fma + f16 round trip {zmm:.3} ns (512-bit), {:.3} ns (2 x 256-bit); with the round to odd {odd:.3} ns", 2.0 * ymm);
}

/// The rows16 kernels (`quant::rows16`) against the plain 8-row kernels (Q6_K, which has
/// none: its dot row by row), weights hot in
/// L1, at SmolLM2's row length (576; not the K-quants') and 2048: ns per (row, 32 weights) and
/// GB/s of weights, for each kernel set (the 8-row kernel alone where a set has no rows16
/// kernel for the type, as AVX2's). Prints only.
#[test]
#[ignore]
fn bench_rows16() {
    use crate::quant::rows16::{pack_in_place, ROWS16};
    let mut rng = Rng::new(13);
    for k in super::tests::fast_kernel_sets() {
        for ty in [Q4_0, Q4_1, Q5_0, Q8_0, GgmlType::Q4_K, Q6_K] {
            let (rows_fn, Ok(dot)) = (k.dot_rows_fn(ty), k.dot_fn(ty)) else { continue };
            let f = k.dot_rows16_fn(ty);
            let atype = Kernels::vec_dot_type(ty).unwrap();
            for cols in [576usize, 2048].into_iter().filter(|c| c % ty.block_size() == 0) {
                let nb = cols / 32;
                let wrb = ty.row_bytes(cols as u64).unwrap() as usize;
                let mut w = std::vec![0u8; ROWS16 * wrb];
                for r in 0..ROWS16 {
                    quantize_row_ref(ty, &random_row(&mut rng, cols), &mut w[r * wrb..(r + 1) * wrb]).unwrap();
                }
                let mut p = w.clone();
                if f.is_some() {
                    pack_in_place(ty, ROWS16, cols, &mut p, &mut std::vec![0u8; w.len()]).unwrap();
                }
                let mut a = std::vec![0u8; atype.row_bytes(cols as u64).unwrap() as usize];
                k.quantize_activations(atype, &random_row(&mut rng, cols), &mut a).unwrap();
                let best = |f: &dyn Fn()| fastest_ns(f, 4000);
                // The plain layout's kernel: the 8-row one, or the dot row by row where the
                // type has none (Q6_K).
                let plain = best(&|| {
                    let mut o = [0.0f32; DOT_ROWS];
                    for h in 0..ROWS16 / DOT_ROWS {
                        match rows_fn {
                            Some(rows_fn) => rows_fn(cols, black_box(&w[h * DOT_ROWS * wrb..]), wrb, black_box(&a), &mut o),
                            None => {
                                for (r, o) in o.iter_mut().enumerate() {
                                    *o = dot(cols, black_box(&w[(h * DOT_ROWS + r) * wrb..]), black_box(&a));
                                }
                            }
                        }
                    }
                    black_box(&mut o);
                });
                let per = |t: f64| t / (ROWS16 * nb) as f64;
                let gbs = |t: f64| (ROWS16 * wrb) as f64 / t;
                let plain_kernel = if rows_fn.is_some() { "8-row kernel" } else { "dot row by row" };
                let head = std::format!("{:>4} {cols:>4} columns, {}: {plain_kernel} {:.3} ns per (row, 32 weights) ({:.1} GB/s)", GgmlType::name(ty), k.name(), per(plain), gbs(plain));
                let Some(f) = f else {
                    println!("{head}, no rows16 kernel");
                    continue;
                };
                let packed = best(&|| {
                    let mut o = [0.0f32; ROWS16];
                    f(cols, 1, black_box(&p), black_box(&a), a.len(), 1, &mut o, ROWS16);
                    black_box(&mut o);
                });
                println!("{head}, rows16 {:.3} ({:.1} GB/s, {:.2}x)", per(packed), gbs(packed), plain / packed);
            }
        }
    }
}

/// `cargo test -p keel-core --release quant::bench::bench_fused_update -- --ignored --nocapture`:
/// the 64-wide value update over f32 value rows (`Kernels::f32_mad_keys_heads`) alone and
/// with the next query's K·Q inside it (`Kernels::f32_mad_keys_heads_dot`), 1 to 4 heads
/// (4 to 16 independent chains of f16 roundings: where the time per head falls with more
/// heads, the chains' latency bounds it) and 64 keys hot in L1, ns per (key, head); for
/// the kernel sets that have them. Prints only.
#[test]
#[ignore]
fn bench_fused_update() {
    use half::f16;
    let mut rng = Rng::new(10);
    for heads in 1..=4 {
        let (len, n) = (64usize, 64usize);
        let kv: Vec<f16> = (0..len * n).map(|_| f16::from_f32(rng.unit())).collect();
        let offs: Vec<usize> = (0..len).map(|c| c * n).collect();
        let xf: Vec<f32> = kv.iter().map(|v| v.to_f32()).collect();
        let qs: Vec<f16> = (0..heads * n).map(|_| f16::from_f32(rng.unit())).collect();
        let e: Vec<f32> = (0..heads * len).map(|_| rng.unit().abs()).collect();
        let new_max: Vec<bool> = (0..heads * len).map(|i| i % len == 0).collect();
        let (mut kt, mut out) = (std::vec![0.0f32; 64 * 64], std::vec![0.0f32; heads * len]);
        let (mut y, mut sums) = (std::vec![f16::ZERO; heads * n], std::vec![0.0f32; heads]);
        for k in super::tests_f16::kernel_sets() {
            if !k.f16_keys_transposed(&kv, &offs, n, &mut kt) {
                continue;
            }
            let (mut alone, mut fused) = (f64::MAX, f64::MAX);
            for _ in 0..2000 {
                let t0 = Instant::now();
                for _ in 0..16 {
                    assert!(k.f32_mad_keys_heads(&mut y, n, heads, &xf, &new_max, &e, &mut sums));
                }
                alone = alone.min(t0.elapsed().as_secs_f64());
                let t0 = Instant::now();
                for _ in 0..16 {
                    assert!(k.f32_mad_keys_heads_dot(&mut y, n, heads, &xf, &new_max, &e, &mut sums, KeysDot { kt: &kt, keys: len, qs: &qs, out: &mut out }));
                }
                fused = fused.min(t0.elapsed().as_secs_f64());
            }
            black_box((&y, &out, &sums));
            let per = (16 * len * heads) as f64 / 1e9;
            println!("{:>26}, {heads} heads: value update {:.3} ns, with the next query's K·Q {:.3} ns per key and head", super::tests_f16::label(&k), alone / per, fused / per);
        }
    }
}

/// `cargo test -p keel-core --release quant::bench::bench_f16_round_trip_ports -- --ignored --nocapture`:
/// what the f16 round trip of the value updates shares its vector pipes with: ns per group
/// of 512-bit operations, 8 independent groups an iteration (inline assembly, so that the
/// compiler neither folds nor reorders them; inputs 1.0 and 0.5): the two conversions
/// alone and together, a mask test beside an fma and beside an add (which pipes the test
/// takes), and the round trip beside an add, an independent fma, a mask test, a logic op, a
/// memory broadcast or an fma taking its multiplier by embedded broadcast, and the exact
/// (round-to-odd) update's operations, with the round trip or with the f16 rounding in f32
/// arithmetic instead (the sum's exponent field, at least f16's smallest normal's, plus 13
/// and a half as `m`, then `(s + m) - m` and the sign of `s` put back: `vpandd`, `vpmaxud`,
/// `vpaddd`, `vaddps`, `vsubps`, `vpternlogd`). An added operation that costs nothing runs on other
/// pipes. Prints only: the CPU decides (BENCHMARKS.md, "The f16 value update on Zen 4's
/// vector pipes").
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn bench_f16_round_trip_ports() {
    use core::arch::x86_64::*;
    if !crate::quant::x86::cpu_has_avx512() {
        println!("no AVX-512: nothing to measure");
        return;
    }
    const ITERS: usize = 2_000_000;
    let buf = [1.0f32; 16];
    #[target_feature(enable = "avx512f")]
    unsafe fn run(buf: &[f32; 16]) {
        let (a, b) = (_mm512_set1_ps(1.0), _mm512_set1_ps(0.5));
        let p = buf.as_ptr();
        macro_rules! port_loop {
            ($name:expr; $($line:literal),+) => {{
                let mut best = f64::MAX;
                for _ in 0..5 {
                    let t0 = Instant::now();
                    for _ in 0..ITERS {
                        // SAFETY: register-only operations and reads of `buf` (16 f32 at
                        // `p`, offsets below 32 bytes); every register written is declared.
                        unsafe {
                            core::arch::asm!($($line),+, in("rax") p, in("zmm30") a, in("zmm31") b,
                                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _, out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                                out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _, out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                                out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _, out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _,
                                out("zmm24") _, out("zmm25") _, out("zmm26") _, out("zmm27") _, out("k1") _, out("k2") _, options(nostack, readonly, preserves_flags));
                        }
                    }
                    best = best.min(t0.elapsed().as_nanos() as f64 / (ITERS * 8) as f64);
                }
                println!("{:>58}: {best:.3} ns per group", $name);
            }};
        }
        port_loop!("vcvtps2ph zmm->ymm"; "vcvtps2ph ymm0, zmm30, 0", "vcvtps2ph ymm1, zmm30, 0", "vcvtps2ph ymm2, zmm30, 0", "vcvtps2ph ymm3, zmm30, 0", "vcvtps2ph ymm4, zmm30, 0", "vcvtps2ph ymm5, zmm30, 0", "vcvtps2ph ymm6, zmm30, 0", "vcvtps2ph ymm7, zmm30, 0");
        port_loop!("vcvtph2ps ymm->zmm"; "vcvtph2ps zmm8, ymm31", "vcvtph2ps zmm9, ymm31", "vcvtph2ps zmm10, ymm31", "vcvtph2ps zmm11, ymm31", "vcvtph2ps zmm12, ymm31", "vcvtph2ps zmm13, ymm31", "vcvtph2ps zmm14, ymm31", "vcvtph2ps zmm15, ymm31");
        port_loop!("vaddps"; "vaddps zmm16, zmm30, zmm31", "vaddps zmm17, zmm30, zmm31", "vaddps zmm18, zmm30, zmm31", "vaddps zmm19, zmm30, zmm31", "vaddps zmm20, zmm30, zmm31", "vaddps zmm21, zmm30, zmm31", "vaddps zmm22, zmm30, zmm31", "vaddps zmm23, zmm30, zmm31");
        port_loop!("round trip (vcvtps2ph + vcvtph2ps)"; "vcvtps2ph ymm0, zmm30, 0", "vcvtph2ps zmm8, ymm31", "vcvtps2ph ymm1, zmm30, 0", "vcvtph2ps zmm9, ymm31", "vcvtps2ph ymm2, zmm30, 0", "vcvtph2ps zmm10, ymm31", "vcvtps2ph ymm3, zmm30, 0", "vcvtph2ps zmm11, ymm31", "vcvtps2ph ymm4, zmm30, 0", "vcvtph2ps zmm12, ymm31", "vcvtps2ph ymm5, zmm30, 0", "vcvtph2ps zmm13, ymm31", "vcvtps2ph ymm6, zmm30, 0", "vcvtph2ps zmm14, ymm31", "vcvtps2ph ymm7, zmm30, 0", "vcvtph2ps zmm15, ymm31");
        port_loop!("round trip + vaddps"; "vcvtps2ph ymm0, zmm30, 0", "vcvtph2ps zmm8, ymm31", "vaddps zmm16, zmm30, zmm31", "vcvtps2ph ymm1, zmm30, 0", "vcvtph2ps zmm9, ymm31", "vaddps zmm17, zmm30, zmm31", "vcvtps2ph ymm2, zmm30, 0", "vcvtph2ps zmm10, ymm31", "vaddps zmm18, zmm30, zmm31", "vcvtps2ph ymm3, zmm30, 0", "vcvtph2ps zmm11, ymm31", "vaddps zmm19, zmm30, zmm31", "vcvtps2ph ymm4, zmm30, 0", "vcvtph2ps zmm12, ymm31", "vaddps zmm20, zmm30, zmm31", "vcvtps2ph ymm5, zmm30, 0", "vcvtph2ps zmm13, ymm31", "vaddps zmm21, zmm30, zmm31", "vcvtps2ph ymm6, zmm30, 0", "vcvtph2ps zmm14, ymm31", "vaddps zmm22, zmm30, zmm31", "vcvtps2ph ymm7, zmm30, 0", "vcvtph2ps zmm15, ymm31", "vaddps zmm23, zmm30, zmm31");
        port_loop!("round trip + vfmadd231ps"; "vcvtps2ph ymm0, zmm30, 0", "vcvtph2ps zmm8, ymm31", "vfmadd231ps zmm16, zmm30, zmm31", "vcvtps2ph ymm1, zmm30, 0", "vcvtph2ps zmm9, ymm31", "vfmadd231ps zmm17, zmm30, zmm31", "vcvtps2ph ymm2, zmm30, 0", "vcvtph2ps zmm10, ymm31", "vfmadd231ps zmm18, zmm30, zmm31", "vcvtps2ph ymm3, zmm30, 0", "vcvtph2ps zmm11, ymm31", "vfmadd231ps zmm19, zmm30, zmm31", "vcvtps2ph ymm4, zmm30, 0", "vcvtph2ps zmm12, ymm31", "vfmadd231ps zmm20, zmm30, zmm31", "vcvtps2ph ymm5, zmm30, 0", "vcvtph2ps zmm13, ymm31", "vfmadd231ps zmm21, zmm30, zmm31", "vcvtps2ph ymm6, zmm30, 0", "vcvtph2ps zmm14, ymm31", "vfmadd231ps zmm22, zmm30, zmm31", "vcvtps2ph ymm7, zmm30, 0", "vcvtph2ps zmm15, ymm31", "vfmadd231ps zmm23, zmm30, zmm31");
        port_loop!("round trip + vptestmd"; "vcvtps2ph ymm0, zmm30, 0", "vcvtph2ps zmm8, ymm31", "vptestmd k1, zmm30, zmm31", "vcvtps2ph ymm1, zmm30, 0", "vcvtph2ps zmm9, ymm31", "vptestmd k1, zmm30, zmm31", "vcvtps2ph ymm2, zmm30, 0", "vcvtph2ps zmm10, ymm31", "vptestmd k1, zmm30, zmm31", "vcvtps2ph ymm3, zmm30, 0", "vcvtph2ps zmm11, ymm31", "vptestmd k1, zmm30, zmm31", "vcvtps2ph ymm4, zmm30, 0", "vcvtph2ps zmm12, ymm31", "vptestmd k1, zmm30, zmm31", "vcvtps2ph ymm5, zmm30, 0", "vcvtph2ps zmm13, ymm31", "vptestmd k1, zmm30, zmm31", "vcvtps2ph ymm6, zmm30, 0", "vcvtph2ps zmm14, ymm31", "vptestmd k1, zmm30, zmm31", "vcvtps2ph ymm7, zmm30, 0", "vcvtph2ps zmm15, ymm31", "vptestmd k1, zmm30, zmm31");
        port_loop!("vfmadd231ps + vptestmd"; "vfmadd231ps zmm16, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vfmadd231ps zmm17, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vfmadd231ps zmm18, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vfmadd231ps zmm19, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vfmadd231ps zmm20, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vfmadd231ps zmm21, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vfmadd231ps zmm22, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vfmadd231ps zmm23, zmm30, zmm31", "vptestmd k1, zmm30, zmm31");
        port_loop!("vaddps + vptestmd"; "vaddps zmm16, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vaddps zmm17, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vaddps zmm18, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vaddps zmm19, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vaddps zmm20, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vaddps zmm21, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vaddps zmm22, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vaddps zmm23, zmm30, zmm31", "vptestmd k1, zmm30, zmm31");
        port_loop!("round trip + vpandd"; "vcvtps2ph ymm0, zmm30, 0", "vcvtph2ps zmm8, ymm31", "vpandd zmm16, zmm30, zmm31", "vcvtps2ph ymm1, zmm30, 0", "vcvtph2ps zmm9, ymm31", "vpandd zmm17, zmm30, zmm31", "vcvtps2ph ymm2, zmm30, 0", "vcvtph2ps zmm10, ymm31", "vpandd zmm18, zmm30, zmm31", "vcvtps2ph ymm3, zmm30, 0", "vcvtph2ps zmm11, ymm31", "vpandd zmm19, zmm30, zmm31", "vcvtps2ph ymm4, zmm30, 0", "vcvtph2ps zmm12, ymm31", "vpandd zmm20, zmm30, zmm31", "vcvtps2ph ymm5, zmm30, 0", "vcvtph2ps zmm13, ymm31", "vpandd zmm21, zmm30, zmm31", "vcvtps2ph ymm6, zmm30, 0", "vcvtph2ps zmm14, ymm31", "vpandd zmm22, zmm30, zmm31", "vcvtps2ph ymm7, zmm30, 0", "vcvtph2ps zmm15, ymm31", "vpandd zmm23, zmm30, zmm31");
        port_loop!("round trip + vbroadcastss m32"; "vcvtps2ph ymm0, zmm30, 0", "vcvtph2ps zmm8, ymm31", "vbroadcastss zmm16, dword ptr [rax + 0]", "vcvtps2ph ymm1, zmm30, 0", "vcvtph2ps zmm9, ymm31", "vbroadcastss zmm17, dword ptr [rax + 4]", "vcvtps2ph ymm2, zmm30, 0", "vcvtph2ps zmm10, ymm31", "vbroadcastss zmm18, dword ptr [rax + 8]", "vcvtps2ph ymm3, zmm30, 0", "vcvtph2ps zmm11, ymm31", "vbroadcastss zmm19, dword ptr [rax + 12]", "vcvtps2ph ymm4, zmm30, 0", "vcvtph2ps zmm12, ymm31", "vbroadcastss zmm20, dword ptr [rax + 16]", "vcvtps2ph ymm5, zmm30, 0", "vcvtph2ps zmm13, ymm31", "vbroadcastss zmm21, dword ptr [rax + 20]", "vcvtps2ph ymm6, zmm30, 0", "vcvtph2ps zmm14, ymm31", "vbroadcastss zmm22, dword ptr [rax + 24]", "vcvtps2ph ymm7, zmm30, 0", "vcvtph2ps zmm15, ymm31", "vbroadcastss zmm23, dword ptr [rax + 28]");
        port_loop!("round trip + vfmadd231ps m32{1to16}"; "vcvtps2ph ymm0, zmm30, 0", "vcvtph2ps zmm8, ymm31", "vfmadd231ps zmm16, zmm30, dword ptr [rax + 0]{{1to16}}", "vcvtps2ph ymm1, zmm30, 0", "vcvtph2ps zmm9, ymm31", "vfmadd231ps zmm17, zmm30, dword ptr [rax + 4]{{1to16}}", "vcvtps2ph ymm2, zmm30, 0", "vcvtph2ps zmm10, ymm31", "vfmadd231ps zmm18, zmm30, dword ptr [rax + 8]{{1to16}}", "vcvtps2ph ymm3, zmm30, 0", "vcvtph2ps zmm11, ymm31", "vfmadd231ps zmm19, zmm30, dword ptr [rax + 12]{{1to16}}", "vcvtps2ph ymm4, zmm30, 0", "vcvtph2ps zmm12, ymm31", "vfmadd231ps zmm20, zmm30, dword ptr [rax + 16]{{1to16}}", "vcvtps2ph ymm5, zmm30, 0", "vcvtph2ps zmm13, ymm31", "vfmadd231ps zmm21, zmm30, dword ptr [rax + 20]{{1to16}}", "vcvtps2ph ymm6, zmm30, 0", "vcvtph2ps zmm14, ymm31", "vfmadd231ps zmm22, zmm30, dword ptr [rax + 24]{{1to16}}", "vcvtps2ph ymm7, zmm30, 0", "vcvtph2ps zmm15, ymm31", "vfmadd231ps zmm23, zmm30, dword ptr [rax + 28]{{1to16}}");
        port_loop!("exact step, f16 rounding by a magic add (6 ops)"; "vmulps zmm16, zmm30, zmm31", "vmulps zmm24, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vpblendmd zmm24{{k2}}, zmm30, zmm31", "vpandd zmm0, zmm30, zmm31", "vpmaxud zmm0, zmm0, zmm31", "vpaddd zmm0, zmm0, zmm30", "vaddps zmm8, zmm30, zmm0", "vsubps zmm8, zmm8, zmm0", "vpternlogd zmm8, zmm30, zmm31, 0xf8", "vmulps zmm17, zmm30, zmm31", "vmulps zmm25, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vpblendmd zmm25{{k2}}, zmm30, zmm31", "vpandd zmm1, zmm30, zmm31", "vpmaxud zmm1, zmm1, zmm31", "vpaddd zmm1, zmm1, zmm30", "vaddps zmm9, zmm30, zmm1", "vsubps zmm9, zmm9, zmm1", "vpternlogd zmm9, zmm30, zmm31, 0xf8", "vmulps zmm18, zmm30, zmm31", "vmulps zmm26, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vpblendmd zmm26{{k2}}, zmm30, zmm31", "vpandd zmm2, zmm30, zmm31", "vpmaxud zmm2, zmm2, zmm31", "vpaddd zmm2, zmm2, zmm30", "vaddps zmm10, zmm30, zmm2", "vsubps zmm10, zmm10, zmm2", "vpternlogd zmm10, zmm30, zmm31, 0xf8", "vmulps zmm19, zmm30, zmm31", "vmulps zmm27, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vpblendmd zmm27{{k2}}, zmm30, zmm31", "vpandd zmm3, zmm30, zmm31", "vpmaxud zmm3, zmm3, zmm31", "vpaddd zmm3, zmm3, zmm30", "vaddps zmm11, zmm30, zmm3", "vsubps zmm11, zmm11, zmm3", "vpternlogd zmm11, zmm30, zmm31, 0xf8", "vmulps zmm20, zmm30, zmm31", "vmulps zmm24, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vpblendmd zmm24{{k2}}, zmm30, zmm31", "vpandd zmm4, zmm30, zmm31", "vpmaxud zmm4, zmm4, zmm31", "vpaddd zmm4, zmm4, zmm30", "vaddps zmm12, zmm30, zmm4", "vsubps zmm12, zmm12, zmm4", "vpternlogd zmm12, zmm30, zmm31, 0xf8", "vmulps zmm21, zmm30, zmm31", "vmulps zmm25, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vpblendmd zmm25{{k2}}, zmm30, zmm31", "vpandd zmm5, zmm30, zmm31", "vpmaxud zmm5, zmm5, zmm31", "vpaddd zmm5, zmm5, zmm30", "vaddps zmm13, zmm30, zmm5", "vsubps zmm13, zmm13, zmm5", "vpternlogd zmm13, zmm30, zmm31, 0xf8", "vmulps zmm22, zmm30, zmm31", "vmulps zmm26, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vpblendmd zmm26{{k2}}, zmm30, zmm31", "vpandd zmm6, zmm30, zmm31", "vpmaxud zmm6, zmm6, zmm31", "vpaddd zmm6, zmm6, zmm30", "vaddps zmm14, zmm30, zmm6", "vsubps zmm14, zmm14, zmm6", "vpternlogd zmm14, zmm30, zmm31, 0xf8", "vmulps zmm23, zmm30, zmm31", "vmulps zmm27, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vpblendmd zmm27{{k2}}, zmm30, zmm31", "vpandd zmm7, zmm30, zmm31", "vpmaxud zmm7, zmm7, zmm31", "vpaddd zmm7, zmm7, zmm30", "vaddps zmm15, zmm30, zmm7", "vsubps zmm15, zmm15, zmm7", "vpternlogd zmm15, zmm30, zmm31, 0xf8");
        port_loop!("exact step: round trip + 2 vmulps + vptestmd + vpblendmd"; "vcvtps2ph ymm0, zmm30, 0", "vcvtph2ps zmm8, ymm31", "vmulps zmm16, zmm30, zmm31", "vmulps zmm24, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vpblendmd zmm24{{k2}}, zmm30, zmm31", "vcvtps2ph ymm1, zmm30, 0", "vcvtph2ps zmm9, ymm31", "vmulps zmm17, zmm30, zmm31", "vmulps zmm25, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vpblendmd zmm25{{k2}}, zmm30, zmm31", "vcvtps2ph ymm2, zmm30, 0", "vcvtph2ps zmm10, ymm31", "vmulps zmm18, zmm30, zmm31", "vmulps zmm26, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vpblendmd zmm26{{k2}}, zmm30, zmm31", "vcvtps2ph ymm3, zmm30, 0", "vcvtph2ps zmm11, ymm31", "vmulps zmm19, zmm30, zmm31", "vmulps zmm27, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vpblendmd zmm27{{k2}}, zmm30, zmm31", "vcvtps2ph ymm4, zmm30, 0", "vcvtph2ps zmm12, ymm31", "vmulps zmm20, zmm30, zmm31", "vmulps zmm24, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vpblendmd zmm24{{k2}}, zmm30, zmm31", "vcvtps2ph ymm5, zmm30, 0", "vcvtph2ps zmm13, ymm31", "vmulps zmm21, zmm30, zmm31", "vmulps zmm25, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vpblendmd zmm25{{k2}}, zmm30, zmm31", "vcvtps2ph ymm6, zmm30, 0", "vcvtph2ps zmm14, ymm31", "vmulps zmm22, zmm30, zmm31", "vmulps zmm26, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vpblendmd zmm26{{k2}}, zmm30, zmm31", "vcvtps2ph ymm7, zmm30, 0", "vcvtph2ps zmm15, ymm31", "vmulps zmm23, zmm30, zmm31", "vmulps zmm27, zmm30, zmm31", "vptestmd k1, zmm30, zmm31", "vpblendmd zmm27{{k2}}, zmm30, zmm31");
    }
    // SAFETY: AVX-512 F present (checked above).
    unsafe { run(&buf) };
}

/// `cargo test -p keel-core --release quant::bench::bench_avx2_product_step_ports -- --ignored --nocapture`:
/// what bounds one step of the AVX2 products (32 multiply-adds of bytes: `maddubs`,
/// `madd`, `cvt`, `fma`, with the sign trick's `sign` for Q8_0 or the correction's `sub`
/// for Q5_0) on this CPU: 256-bit operations 8 independent groups an iteration (inline
/// assembly: the compiler neither folds nor reorders them), in cycles per group, a cycle
/// being one step of a chain of dependent integer adds measured beside them. An
/// operation added to a group that costs nothing runs on other pipes. Prints only: the
/// CPU decides (BENCHMARKS.md, "Zen 1, a second session").
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn bench_avx2_product_step_ports() {
    if !crate::quant::x86::cpu_has_avx2_fma() {
        println!("no AVX2: nothing to measure");
        return;
    }
    const ITERS: usize = 2_000_000;
    let buf = [1i32; 8];
    // One cycle: ns per add of a dependent chain.
    let mut cycle = f64::MAX;
    for _ in 0..5 {
        let mut x = 0u64;
        let t0 = Instant::now();
        for _ in 0..ITERS {
            // SAFETY: register-only integer adds.
            unsafe { core::arch::asm!("add {x}, 1", "add {x}, 1", "add {x}, 1", "add {x}, 1", "add {x}, 1", "add {x}, 1", "add {x}, 1", "add {x}, 1", x = inout(reg) x, options(nomem, nostack)) };
        }
        cycle = cycle.min(t0.elapsed().as_nanos() as f64 / (ITERS * 8) as f64);
        black_box(x);
    }
    println!("one cycle (dependent integer add): {cycle:.3} ns");
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run(buf: &[i32; 8], cycle: f64) {
        let p = buf.as_ptr();
        macro_rules! port_loop {
            ($name:expr, $ops:expr; $($line:literal),+) => {{
                let mut best = f64::MAX;
                for _ in 0..5 {
                    let t0 = Instant::now();
                    for _ in 0..ITERS {
                        // SAFETY: register-only operations and reads of `buf` (8 i32 at
                        // `p`, offsets below 32 bytes); every register written is declared.
                        unsafe {
                            core::arch::asm!($($line),+, in("rax") p, in("ymm14") core::arch::x86_64::_mm256_set1_epi8(3), in("ymm15") core::arch::x86_64::_mm256_set1_epi8(-5),
                                out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
                                out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _, out("ymm12") _, out("ymm13") _, options(nostack, readonly, preserves_flags));
                        }
                    }
                    best = best.min(t0.elapsed().as_nanos() as f64 / (ITERS * 8) as f64);
                }
                println!("{:>58}: {:.2} cycles per group of {}", $name, best / cycle, $ops);
            }};
        }
        port_loop!("vpmaddubsw", 1; "vpmaddubsw ymm0, ymm14, ymm15", "vpmaddubsw ymm1, ymm14, ymm15", "vpmaddubsw ymm2, ymm14, ymm15", "vpmaddubsw ymm3, ymm14, ymm15", "vpmaddubsw ymm4, ymm14, ymm15", "vpmaddubsw ymm5, ymm14, ymm15", "vpmaddubsw ymm6, ymm14, ymm15", "vpmaddubsw ymm7, ymm14, ymm15");
        port_loop!("vpmaddwd", 1; "vpmaddwd ymm0, ymm14, ymm15", "vpmaddwd ymm1, ymm14, ymm15", "vpmaddwd ymm2, ymm14, ymm15", "vpmaddwd ymm3, ymm14, ymm15", "vpmaddwd ymm4, ymm14, ymm15", "vpmaddwd ymm5, ymm14, ymm15", "vpmaddwd ymm6, ymm14, ymm15", "vpmaddwd ymm7, ymm14, ymm15");
        port_loop!("vpmaddubsw + vpmaddwd", 2; "vpmaddubsw ymm0, ymm14, ymm15", "vpmaddwd ymm1, ymm14, ymm15", "vpmaddubsw ymm2, ymm14, ymm15", "vpmaddwd ymm3, ymm14, ymm15", "vpmaddubsw ymm4, ymm14, ymm15", "vpmaddwd ymm5, ymm14, ymm15", "vpmaddubsw ymm6, ymm14, ymm15", "vpmaddwd ymm7, ymm14, ymm15", "vpmaddubsw ymm8, ymm14, ymm15", "vpmaddwd ymm9, ymm14, ymm15", "vpmaddubsw ymm10, ymm14, ymm15", "vpmaddwd ymm11, ymm14, ymm15", "vpmaddubsw ymm12, ymm14, ymm15", "vpmaddwd ymm13, ymm14, ymm15", "vpmaddubsw ymm0, ymm14, ymm15", "vpmaddwd ymm1, ymm14, ymm15");
        port_loop!("vcvtdq2ps", 1; "vcvtdq2ps ymm0, ymm14", "vcvtdq2ps ymm1, ymm14", "vcvtdq2ps ymm2, ymm14", "vcvtdq2ps ymm3, ymm14", "vcvtdq2ps ymm4, ymm14", "vcvtdq2ps ymm5, ymm14", "vcvtdq2ps ymm6, ymm14", "vcvtdq2ps ymm7, ymm14");
        port_loop!("vpsignb", 1; "vpsignb ymm0, ymm14, ymm15", "vpsignb ymm1, ymm14, ymm15", "vpsignb ymm2, ymm14, ymm15", "vpsignb ymm3, ymm14, ymm15", "vpsignb ymm4, ymm14, ymm15", "vpsignb ymm5, ymm14, ymm15", "vpsignb ymm6, ymm14, ymm15", "vpsignb ymm7, ymm14, ymm15");
        port_loop!("vfmadd231ps", 1; "vfmadd231ps ymm0, ymm14, ymm15", "vfmadd231ps ymm1, ymm14, ymm15", "vfmadd231ps ymm2, ymm14, ymm15", "vfmadd231ps ymm3, ymm14, ymm15", "vfmadd231ps ymm4, ymm14, ymm15", "vfmadd231ps ymm5, ymm14, ymm15", "vfmadd231ps ymm6, ymm14, ymm15", "vfmadd231ps ymm7, ymm14, ymm15");
        port_loop!("vpsubd", 1; "vpsubd ymm0, ymm14, ymm15", "vpsubd ymm1, ymm14, ymm15", "vpsubd ymm2, ymm14, ymm15", "vpsubd ymm3, ymm14, ymm15", "vpsubd ymm4, ymm14, ymm15", "vpsubd ymm5, ymm14, ymm15", "vpsubd ymm6, ymm14, ymm15", "vpsubd ymm7, ymm14, ymm15");
        port_loop!("vpbroadcastd m32", 1; "vpbroadcastd ymm0, dword ptr [rax + 0]", "vpbroadcastd ymm1, dword ptr [rax + 4]", "vpbroadcastd ymm2, dword ptr [rax + 8]", "vpbroadcastd ymm3, dword ptr [rax + 12]", "vpbroadcastd ymm4, dword ptr [rax + 16]", "vpbroadcastd ymm5, dword ptr [rax + 20]", "vpbroadcastd ymm6, dword ptr [rax + 24]", "vpbroadcastd ymm7, dword ptr [rax + 28]");
        port_loop!("step: maddubs, madd, cvt, fma", 4; "vpmaddubsw ymm0, ymm14, ymm15", "vpmaddwd ymm1, ymm14, ymm15", "vcvtdq2ps ymm2, ymm14", "vfmadd231ps ymm3, ymm14, ymm15", "vpmaddubsw ymm4, ymm14, ymm15", "vpmaddwd ymm5, ymm14, ymm15", "vcvtdq2ps ymm6, ymm14", "vfmadd231ps ymm7, ymm14, ymm15", "vpmaddubsw ymm8, ymm14, ymm15", "vpmaddwd ymm9, ymm14, ymm15", "vcvtdq2ps ymm10, ymm14", "vfmadd231ps ymm11, ymm14, ymm15", "vpmaddubsw ymm12, ymm14, ymm15", "vpmaddwd ymm13, ymm14, ymm15", "vcvtdq2ps ymm0, ymm14", "vfmadd231ps ymm1, ymm14, ymm15", "vpmaddubsw ymm2, ymm14, ymm15", "vpmaddwd ymm3, ymm14, ymm15", "vcvtdq2ps ymm4, ymm14", "vfmadd231ps ymm5, ymm14, ymm15", "vpmaddubsw ymm6, ymm14, ymm15", "vpmaddwd ymm7, ymm14, ymm15", "vcvtdq2ps ymm8, ymm14", "vfmadd231ps ymm9, ymm14, ymm15", "vpmaddubsw ymm10, ymm14, ymm15", "vpmaddwd ymm11, ymm14, ymm15", "vcvtdq2ps ymm12, ymm14", "vfmadd231ps ymm13, ymm14, ymm15", "vpmaddubsw ymm0, ymm14, ymm15", "vpmaddwd ymm1, ymm14, ymm15", "vcvtdq2ps ymm2, ymm14", "vfmadd231ps ymm3, ymm14, ymm15");
        port_loop!("step + sign (Q8_0's sign trick)", 5; "vpsignb ymm0, ymm14, ymm15", "vpmaddubsw ymm1, ymm14, ymm15", "vpmaddwd ymm2, ymm14, ymm15", "vcvtdq2ps ymm3, ymm14", "vfmadd231ps ymm4, ymm14, ymm15", "vpsignb ymm5, ymm14, ymm15", "vpmaddubsw ymm6, ymm14, ymm15", "vpmaddwd ymm7, ymm14, ymm15", "vcvtdq2ps ymm8, ymm14", "vfmadd231ps ymm9, ymm14, ymm15", "vpsignb ymm10, ymm14, ymm15", "vpmaddubsw ymm11, ymm14, ymm15", "vpmaddwd ymm12, ymm14, ymm15", "vcvtdq2ps ymm13, ymm14", "vfmadd231ps ymm0, ymm14, ymm15", "vpsignb ymm1, ymm14, ymm15", "vpmaddubsw ymm2, ymm14, ymm15", "vpmaddwd ymm3, ymm14, ymm15", "vcvtdq2ps ymm4, ymm14", "vfmadd231ps ymm5, ymm14, ymm15", "vpsignb ymm6, ymm14, ymm15", "vpmaddubsw ymm7, ymm14, ymm15", "vpmaddwd ymm8, ymm14, ymm15", "vcvtdq2ps ymm9, ymm14", "vfmadd231ps ymm10, ymm14, ymm15", "vpsignb ymm11, ymm14, ymm15", "vpmaddubsw ymm12, ymm14, ymm15", "vpmaddwd ymm13, ymm14, ymm15", "vcvtdq2ps ymm0, ymm14", "vfmadd231ps ymm1, ymm14, ymm15", "vpsignb ymm2, ymm14, ymm15", "vpmaddubsw ymm3, ymm14, ymm15", "vpmaddwd ymm4, ymm14, ymm15", "vcvtdq2ps ymm5, ymm14", "vfmadd231ps ymm6, ymm14, ymm15", "vpsignb ymm7, ymm14, ymm15", "vpmaddubsw ymm8, ymm14, ymm15", "vpmaddwd ymm9, ymm14, ymm15", "vcvtdq2ps ymm10, ymm14", "vfmadd231ps ymm11, ymm14, ymm15");
        port_loop!("step + vpsubd (Q5_0's correction)", 5; "vpmaddubsw ymm0, ymm14, ymm15", "vpmaddwd ymm1, ymm14, ymm15", "vpsubd ymm2, ymm14, ymm15", "vcvtdq2ps ymm3, ymm14", "vfmadd231ps ymm4, ymm14, ymm15", "vpmaddubsw ymm5, ymm14, ymm15", "vpmaddwd ymm6, ymm14, ymm15", "vpsubd ymm7, ymm14, ymm15", "vcvtdq2ps ymm8, ymm14", "vfmadd231ps ymm9, ymm14, ymm15", "vpmaddubsw ymm10, ymm14, ymm15", "vpmaddwd ymm11, ymm14, ymm15", "vpsubd ymm12, ymm14, ymm15", "vcvtdq2ps ymm13, ymm14", "vfmadd231ps ymm0, ymm14, ymm15", "vpmaddubsw ymm1, ymm14, ymm15", "vpmaddwd ymm2, ymm14, ymm15", "vpsubd ymm3, ymm14, ymm15", "vcvtdq2ps ymm4, ymm14", "vfmadd231ps ymm5, ymm14, ymm15", "vpmaddubsw ymm6, ymm14, ymm15", "vpmaddwd ymm7, ymm14, ymm15", "vpsubd ymm8, ymm14, ymm15", "vcvtdq2ps ymm9, ymm14", "vfmadd231ps ymm10, ymm14, ymm15", "vpmaddubsw ymm11, ymm14, ymm15", "vpmaddwd ymm12, ymm14, ymm15", "vpsubd ymm13, ymm14, ymm15", "vcvtdq2ps ymm0, ymm14", "vfmadd231ps ymm1, ymm14, ymm15", "vpmaddubsw ymm2, ymm14, ymm15", "vpmaddwd ymm3, ymm14, ymm15", "vpsubd ymm4, ymm14, ymm15", "vcvtdq2ps ymm5, ymm14", "vfmadd231ps ymm6, ymm14, ymm15", "vpmaddubsw ymm7, ymm14, ymm15", "vpmaddwd ymm8, ymm14, ymm15", "vpsubd ymm9, ymm14, ymm15", "vcvtdq2ps ymm10, ymm14", "vfmadd231ps ymm11, ymm14, ymm15");
        port_loop!("Q5_0 step, magic conversion: vpaddd, vsubps for vpsubd, cvt", 5; "vpmaddubsw ymm0, ymm14, ymm15", "vpmaddwd ymm1, ymm14, ymm15", "vpaddd ymm2, ymm14, ymm15", "vsubps ymm3, ymm14, ymm15", "vfmadd231ps ymm4, ymm14, ymm15", "vpmaddubsw ymm5, ymm14, ymm15", "vpmaddwd ymm6, ymm14, ymm15", "vpaddd ymm7, ymm14, ymm15", "vsubps ymm8, ymm14, ymm15", "vfmadd231ps ymm9, ymm14, ymm15", "vpmaddubsw ymm10, ymm14, ymm15", "vpmaddwd ymm11, ymm14, ymm15", "vpaddd ymm12, ymm14, ymm15", "vsubps ymm13, ymm14, ymm15", "vfmadd231ps ymm0, ymm14, ymm15", "vpmaddubsw ymm1, ymm14, ymm15", "vpmaddwd ymm2, ymm14, ymm15", "vpaddd ymm3, ymm14, ymm15", "vsubps ymm4, ymm14, ymm15", "vfmadd231ps ymm5, ymm14, ymm15", "vpmaddubsw ymm6, ymm14, ymm15", "vpmaddwd ymm7, ymm14, ymm15", "vpaddd ymm8, ymm14, ymm15", "vsubps ymm9, ymm14, ymm15", "vfmadd231ps ymm10, ymm14, ymm15", "vpmaddubsw ymm11, ymm14, ymm15", "vpmaddwd ymm12, ymm14, ymm15", "vpaddd ymm13, ymm14, ymm15", "vsubps ymm0, ymm14, ymm15", "vfmadd231ps ymm1, ymm14, ymm15", "vpmaddubsw ymm2, ymm14, ymm15", "vpmaddwd ymm3, ymm14, ymm15", "vpaddd ymm4, ymm14, ymm15", "vsubps ymm5, ymm14, ymm15", "vfmadd231ps ymm6, ymm14, ymm15", "vpmaddubsw ymm7, ymm14, ymm15", "vpmaddwd ymm8, ymm14, ymm15", "vpaddd ymm9, ymm14, ymm15", "vsubps ymm10, ymm14, ymm15", "vfmadd231ps ymm11, ymm14, ymm15");
        port_loop!("i16 step: 2 vpmaddwd + vpaddd, cvt, fma", 5; "vpmaddwd ymm0, ymm14, ymm15", "vpmaddwd ymm1, ymm14, ymm15", "vpaddd ymm2, ymm14, ymm15", "vcvtdq2ps ymm3, ymm14", "vfmadd231ps ymm4, ymm14, ymm15", "vpmaddwd ymm5, ymm14, ymm15", "vpmaddwd ymm6, ymm14, ymm15", "vpaddd ymm7, ymm14, ymm15", "vcvtdq2ps ymm8, ymm14", "vfmadd231ps ymm9, ymm14, ymm15", "vpmaddwd ymm10, ymm14, ymm15", "vpmaddwd ymm11, ymm14, ymm15", "vpaddd ymm12, ymm14, ymm15", "vcvtdq2ps ymm13, ymm14", "vfmadd231ps ymm0, ymm14, ymm15", "vpmaddwd ymm1, ymm14, ymm15", "vpmaddwd ymm2, ymm14, ymm15", "vpaddd ymm3, ymm14, ymm15", "vcvtdq2ps ymm4, ymm14", "vfmadd231ps ymm5, ymm14, ymm15", "vpmaddwd ymm6, ymm14, ymm15", "vpmaddwd ymm7, ymm14, ymm15", "vpaddd ymm8, ymm14, ymm15", "vcvtdq2ps ymm9, ymm14", "vfmadd231ps ymm10, ymm14, ymm15", "vpmaddwd ymm11, ymm14, ymm15", "vpmaddwd ymm12, ymm14, ymm15", "vpaddd ymm13, ymm14, ymm15", "vcvtdq2ps ymm0, ymm14", "vfmadd231ps ymm1, ymm14, ymm15", "vpmaddwd ymm2, ymm14, ymm15", "vpmaddwd ymm3, ymm14, ymm15", "vpaddd ymm4, ymm14, ymm15", "vcvtdq2ps ymm5, ymm14", "vfmadd231ps ymm6, ymm14, ymm15", "vpmaddwd ymm7, ymm14, ymm15", "vpmaddwd ymm8, ymm14, ymm15", "vpaddd ymm9, ymm14, ymm15", "vcvtdq2ps ymm10, ymm14", "vfmadd231ps ymm11, ymm14, ymm15");
    }
    // SAFETY: AVX2 and FMA present (checked above).
    unsafe { run(&buf, cycle) };
}

/// `cargo test -p keel-core --release quant::bench::bench_exact_step_chains -- --ignored --nocapture`:
/// the exact (single-rounding) f16 value update's step as `mad_exact_avx512` runs it, 16
/// dependent chains (4 heads × 4 vectors: each step's input is the previous step's f16
/// result, a key's value vector shared by the four heads, one multiplier), and the same
/// chains with other ways to round to odd or to watch for the cases where rounding twice
/// could differ; ns per 16-element step (inline assembly: the compiler neither folds nor
/// reorders). `bench_f16_round_trip_ports` measures the operations side by side without
/// the chains' dependencies, which understates the selection's cost. Prints only
/// (BENCHMARKS.md, "The exact f16 step, dependent").
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn bench_exact_step_chains() {
    use core::arch::x86_64::*;
    if !crate::quant::x86::cpu_has_avx512() {
        println!("no AVX-512: nothing to measure");
        return;
    }
    // One step of chain `a` (accumulator zmm{a}, value vector zmm{x}, temporaries zmm{t},
    // zmm{u}; zmm20 the multiplier, zmm24 ones in every dword, zmm25/zmm26 f32 bit masks
    // 0x1000/0x1fff, zmm27..29 running minima, zmm31 1.0 where the step takes no `u`, k2
    // a fixed mask), from these pieces: the fmas rounded down
    // (into t) and up (into a), as `mad_exact_avx512`; the f16 round trip of `src` into a;
    // one fma with the f32 sum's low 13 bits against f16's midpoint pattern beside it
    // (`(s ^ 0x1000) & 0x1fff`, zero at a midpoint) folded into a running minimum, to be
    // tested once per key.
    macro_rules! rd_ru {
        ($a:literal, $x:literal, $t:literal) => {
            concat!("vmovaps zmm", $t, ", zmm20\n", "vfmadd213ps zmm", $t, ", zmm", $x, ", zmm", $a, ", {{rd-sae}}\n", "vfmadd231ps zmm", $a, ", zmm", $x, ", zmm20, {{ru-sae}}\n")
        };
    }
    macro_rules! round_trip {
        ($a:literal, $src:literal) => {
            concat!("vcvtps2ph ymm", $a, ", zmm", $src, ", 0\n", "vcvtph2ps zmm", $a, ", ymm", $a, "\n")
        };
    }
    macro_rules! fma_watch_midpoint {
        ($a:literal, $x:literal, $t:literal) => {
            concat!("vfmadd231ps zmm", $a, ", zmm", $x, ", zmm20\n", "vmovaps zmm", $t, ", zmm", $a, "\n", "vpternlogd zmm", $t, ", zmm25, zmm26, 0x28\n", "vpminud zmm27, zmm27, zmm", $t, "\n")
        };
    }
    macro_rules! kernel_step {
        // `mad_exact_avx512`: the odd one of the two kept (`vptestnmd`, masked move).
        ($a:literal, $x:literal, $t:literal, $u:literal) => {
            concat!(rd_ru!($a, $x, $t), "vptestnmd k1, zmm", $t, ", zmm24\n", "vmovaps zmm", $t, "{{k1}}, zmm", $a, "\n", round_trip!($a, $t))
        };
    }
    macro_rules! plain_step {
        // One fma and the round trip (the 64-wide update's step: rounding twice).
        ($a:literal, $x:literal, $t:literal, $u:literal) => {
            concat!("vfmadd231ps zmm", $a, ", zmm", $x, ", zmm20\n", round_trip!($a, $a))
        };
    }
    macro_rules! two_fma_step {
        // The kernel's two fmas and round trip without the selection.
        ($a:literal, $x:literal, $t:literal, $u:literal) => {
            concat!(rd_ru!($a, $x, $t), round_trip!($a, $t))
        };
    }
    macro_rules! select_logic_step {
        // The odd one selected without a mask register: `(rd & 1) - 1` (0 or all ones)
        // picks rd or ru in one ternary-logic operation (`mask ? ru : rd`).
        ($a:literal, $x:literal, $t:literal, $u:literal) => {
            concat!(
                rd_ru!($a, $x, $t),
                "vpandd zmm", $u, ", zmm", $t, ", zmm24\n",
                "vpsubd zmm", $u, ", zmm", $u, ", zmm24\n",
                "vpternlogd zmm", $u, ", zmm", $t, ", zmm", $a, ", 0xac\n",
                round_trip!($a, $u)
            )
        };
    }
    macro_rules! toward_zero_step {
        // Round to odd as `rz | ((rd ^ ru) & 1)`: a third fma (toward zero), one
        // ternary-logic operation and an or.
        ($a:literal, $x:literal, $t:literal, $u:literal) => {
            concat!(
                "vmovaps zmm", $u, ", zmm20\n",
                "vfmadd213ps zmm", $u, ", zmm", $x, ", zmm", $a, ", {{rz-sae}}\n",
                rd_ru!($a, $x, $t),
                "vpternlogd zmm", $t, ", zmm", $a, ", zmm24, 0x28\n",
                "vpord zmm", $u, ", zmm", $u, ", zmm", $t, "\n",
                round_trip!($a, $u)
            )
        };
    }
    macro_rules! min_or_step {
        // The odd one as `min_u(rd, ru) | ((rd ^ ru) & 1)` (bit patterns one apart or
        // equal, the smaller toward zero): a minimum, one ternary-logic operation and an
        // or, no mask register (whose test takes an FMA pipe on Zen 4).
        ($a:literal, $x:literal, $t:literal, $u:literal) => {
            concat!(
                rd_ru!($a, $x, $t),
                "vpminud zmm", $u, ", zmm", $t, ", zmm", $a, "\n",
                "vpternlogd zmm", $t, ", zmm", $a, ", zmm24, 0x28\n",
                "vpord zmm", $u, ", zmm", $u, ", zmm", $t, "\n",
                round_trip!($a, $u)
            )
        };
    }
    macro_rules! mul_select_step {
        // The kernel's selection as a masked multiply by 1.0 (zmm31), an FMA-pipe
        // operation, instead of the masked move.
        ($a:literal, $x:literal, $t:literal, $u:literal) => {
            concat!(rd_ru!($a, $x, $t), "vptestnmd k1, zmm", $t, ", zmm24\n", "vmulps zmm", $t, "{{k1}}, zmm", $a, ", zmm31\n", round_trip!($a, $t))
        };
    }
    // Two probes of the selection's cost (wrong bits): the test without the move, and the
    // move (by a fixed mask in k2) without the test.
    macro_rules! test_only_step {
        ($a:literal, $x:literal, $t:literal, $u:literal) => {
            concat!(rd_ru!($a, $x, $t), "vptestnmd k1, zmm", $t, ", zmm24\n", round_trip!($a, $t))
        };
    }
    macro_rules! move_only_step {
        ($a:literal, $x:literal, $t:literal, $u:literal) => {
            concat!(rd_ru!($a, $x, $t), "vmovaps zmm", $t, "{{k2}}, zmm", $a, "\n", round_trip!($a, $t))
        };
    }
    macro_rules! plain_test_step {
        // The test beside one fma only (wrong bits): whether it is free where the FMA pipes
        // have room.
        ($a:literal, $x:literal, $t:literal, $u:literal) => {
            concat!("vfmadd231ps zmm", $a, ", zmm", $x, ", zmm20\n", "vptestnmd k1, zmm", $a, ", zmm24\n", round_trip!($a, $a))
        };
    }
    macro_rules! watch_midpoint_step {
        // One fma and the round trip, f16 midpoints watched.
        ($a:literal, $x:literal, $t:literal, $u:literal) => {
            concat!(fma_watch_midpoint!($a, $x, $t), round_trip!($a, $a))
        };
    }
    macro_rules! watch_both_step {
        // As the previous, and f16's subnormal range watched too (unsigned and signed
        // running minima of the sum's bits: below 2^-14 in magnitude either way).
        ($a:literal, $x:literal, $t:literal, $u:literal) => {
            concat!(fma_watch_midpoint!($a, $x, $t), "vpminud zmm28, zmm28, zmm", $a, "\n", "vpminsd zmm29, zmm29, zmm", $a, "\n", round_trip!($a, $a))
        };
    }
    // The 16 chains of one key: heads h = a / 4 with value vectors zmm16..19 (j = a % 4).
    // One head's four chains (accumulators zmm$a0.., value vectors zmm16..19) grouped by
    // operation: four fmas down, four up, four tests, four selections, four round trips.
    macro_rules! head_grouped {
        ($a0:literal, $a1:literal, $a2:literal, $a3:literal) => {
            concat!(
                "vmovaps zmm21, zmm20\n", "vmovaps zmm22, zmm20\n", "vmovaps zmm23, zmm20\n", "vmovaps zmm30, zmm20\n",
                "vfmadd213ps zmm21, zmm16, zmm", $a0, ", {{rd-sae}}\n", "vfmadd213ps zmm22, zmm17, zmm", $a1, ", {{rd-sae}}\n",
                "vfmadd213ps zmm23, zmm18, zmm", $a2, ", {{rd-sae}}\n", "vfmadd213ps zmm30, zmm19, zmm", $a3, ", {{rd-sae}}\n",
                "vfmadd231ps zmm", $a0, ", zmm16, zmm20, {{ru-sae}}\n", "vfmadd231ps zmm", $a1, ", zmm17, zmm20, {{ru-sae}}\n",
                "vfmadd231ps zmm", $a2, ", zmm18, zmm20, {{ru-sae}}\n", "vfmadd231ps zmm", $a3, ", zmm19, zmm20, {{ru-sae}}\n",
                "vptestnmd k1, zmm21, zmm24\n", "vptestnmd k2, zmm22, zmm24\n", "vptestnmd k3, zmm23, zmm24\n", "vptestnmd k4, zmm30, zmm24\n",
                "vmovaps zmm21{{k1}}, zmm", $a0, "\n", "vmovaps zmm22{{k2}}, zmm", $a1, "\n", "vmovaps zmm23{{k3}}, zmm", $a2, "\n", "vmovaps zmm30{{k4}}, zmm", $a3, "\n",
                round_trip!($a0, 21), round_trip!($a1, 22), round_trip!($a2, 23), round_trip!($a3, 30)
            )
        };
    }
    macro_rules! key {
        // The kernel's step, each head's four vectors grouped by operation.
        (grouped) => {
            concat!(head_grouped!(0, 1, 2, 3), head_grouped!(4, 5, 6, 7), head_grouped!(8, 9, 10, 11), head_grouped!(12, 13, 14, 15))
        };
        (mixed) => {
            concat!(
                kernel_step!(0, 16, 21, 30), mul_select_step!(1, 17, 22, 31), kernel_step!(2, 18, 23, 30), mul_select_step!(3, 19, 21, 31),
                kernel_step!(4, 16, 22, 30), mul_select_step!(5, 17, 23, 31), kernel_step!(6, 18, 21, 30), mul_select_step!(7, 19, 22, 31),
                kernel_step!(8, 16, 23, 30), mul_select_step!(9, 17, 21, 31), kernel_step!(10, 18, 22, 30), mul_select_step!(11, 19, 23, 31),
                kernel_step!(12, 16, 21, 30), mul_select_step!(13, 17, 22, 31), kernel_step!(14, 18, 23, 30), mul_select_step!(15, 19, 21, 31)
            )
        };
        ($step:ident) => {
            concat!(
                $step!(0, 16, 21, 30), $step!(1, 17, 22, 31), $step!(2, 18, 23, 30), $step!(3, 19, 21, 31),
                $step!(4, 16, 22, 30), $step!(5, 17, 23, 31), $step!(6, 18, 21, 30), $step!(7, 19, 22, 31),
                $step!(8, 16, 23, 30), $step!(9, 17, 21, 31), $step!(10, 18, 22, 30), $step!(11, 19, 23, 31),
                $step!(12, 16, 21, 30), $step!(13, 17, 22, 31), $step!(14, 18, 23, 30), $step!(15, 19, 21, 31)
            )
        };
    }
    const KEYS: usize = 1_000_000;
    #[target_feature(enable = "avx512f")]
    unsafe fn run() {
        macro_rules! chains {
            ($name:expr, $step:ident) => {{
                let mut best = f64::MAX;
                for _ in 0..5 {
                    let t0 = Instant::now();
                    // SAFETY: register-only operations; every register written is declared.
                    unsafe {
                        core::arch::asm!(
                            // Accumulators 0.75, values 0.001, multiplier 0.75: sums stay
                            // normal and unchanging, so no value slows a step down.
                            "vbroadcastss zmm0, xmm30",
                            "vmovaps zmm1, zmm0", "vmovaps zmm2, zmm0", "vmovaps zmm3, zmm0", "vmovaps zmm4, zmm0", "vmovaps zmm5, zmm0", "vmovaps zmm6, zmm0", "vmovaps zmm7, zmm0",
                            "vmovaps zmm8, zmm0", "vmovaps zmm9, zmm0", "vmovaps zmm10, zmm0", "vmovaps zmm11, zmm0", "vmovaps zmm12, zmm0", "vmovaps zmm13, zmm0", "vmovaps zmm14, zmm0", "vmovaps zmm15, zmm0",
                            "vbroadcastss zmm16, xmm31", "vmovaps zmm17, zmm16", "vmovaps zmm18, zmm16", "vmovaps zmm19, zmm16", "vmovaps zmm20, zmm0",
                            "vpternlogd zmm24, zmm24, zmm24, 0xff", "vpsrld zmm24, zmm24, 31",
                            "vpslld zmm25, zmm24, 12", "vpslld zmm26, zmm24, 13", "vpsubd zmm26, zmm26, zmm24",
                            "vpternlogd zmm27, zmm27, zmm27, 0xff", "vmovaps zmm28, zmm27", "vpsrld zmm29, zmm27, 1", "vcvtdq2ps zmm31, zmm24", "mov eax, 0x5555", "kmovw k2, eax",
                            "2:",
                            key!($step),
                            "dec rcx",
                            "jnz 2b",
                            inout("rcx") KEYS => _, out("eax") _, inout("xmm30") _mm_set1_ps(0.75) => _, inout("xmm31") _mm_set1_ps(0.001) => _,
                            out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _, out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                            out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _, out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                            out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _, out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _,
                            out("zmm24") _, out("zmm25") _, out("zmm26") _, out("zmm27") _, out("zmm28") _, out("zmm29") _, out("k1") _, out("k2") _, out("k3") _, out("k4") _,
                            options(nostack, nomem),
                        );
                    }
                    best = best.min(t0.elapsed().as_nanos() as f64 / (KEYS * 16) as f64);
                }
                println!("{:>72}: {best:.3} ns per step", $name);
            }};
        }
        chains!("the exact step (rd, ru fmas; vptestnmd; masked move; round trip)", kernel_step);
        chains!("one fma + round trip (the 64-wide step)", plain_step);
        chains!("rd, ru fmas + round trip, no selection", two_fma_step);
        chains!("rd, ru fmas; selection by and, sub, ternary logic; round trip", select_logic_step);
        chains!("rd, rz, ru fmas; rz | ((rd ^ ru) & 1); round trip", toward_zero_step);
        chains!("rd, ru fmas; min_u(rd, ru) | ((rd ^ ru) & 1); round trip", min_or_step);
        chains!("the exact step, each head's four vectors grouped by operation", grouped);
        chains!("the exact step, selection by masked multiply by 1", mul_select_step);
        chains!("the exact step, masked move and masked multiply alternating", mixed);
        chains!("the exact step (again, for the run's noise)", kernel_step);
        chains!("rd, ru fmas; vptestnmd, no move; round trip", test_only_step);
        chains!("rd, ru fmas; masked move by a fixed mask, no test; round trip", move_only_step);
        chains!("one fma; vptestnmd; round trip", plain_test_step);
        chains!("one fma + round trip + f16 midpoint watch", watch_midpoint_step);
        chains!("one fma + round trip + midpoint and subnormal watch", watch_both_step);
    }
    // SAFETY: AVX-512 F present (checked above).
    unsafe { run() };
}

/// `cargo test -p keel-core --release quant::bench::bench_attend_block -- --ignored --nocapture`:
/// CPU time of `attention::attend_block` for a prompt's block of `QBLOCK` queries at
/// depth 4096, ns per (query, key, head): Gemma 3's shape (4 heads of 256 on one KV head)
/// with each query's span all positions before it and itself (its global layers) and the
/// last 512 (its sliding-window layers), and SmolLM2's (3 heads of 64, the first of 3 KV
/// heads; causal); the cache (4 MiB and 6 MiB) larger than L2 as in a prompt at depth; for
/// every kernel set of the attention tests, interleaved, best of 7.
#[test]
#[ignore]
fn bench_attend_block() {
    use crate::attention::{attend_block, KeySpan, QBLOCK};
    use half::f16;
    let sets = super::tests_f16::kernel_sets();
    let mut rng = Rng::new(21);
    let (past, nq) = (4096usize, QBLOCK);
    for (hd, nh, n_kvh, window) in [(256usize, 4usize, 1usize, 0usize), (256, 4, 1, 512), (64, 3, 3, 0)] {
        // One slot per position (no ring): a window is only the spans' starts.
        let (rows, stride, kc, vc, q) = super::tests_f16::random_attention(&mut rng, (hd, n_kvh, nh, nq), 0, past, 1.0);
        let span = |j: usize| KeySpan { len: if window > 0 { window } else { past + j + 1 }, first_slot: if window > 0 { past + j + 1 - window } else { 0 }, ring: rows, k_base: 0, k_stride: stride, v_base: 0, v_stride: stride };
        let (mut qh, mut acc, mut out) = (std::vec![f16::ZERO; nq * nh * hd], std::vec![f16::ZERO; nq * nh * hd], std::vec![0.0f32; nq * nh * hd]);
        let mut best = std::vec![f64::MAX; sets.len()];
        for _ in 0..7 {
            for (k, best) in sets.iter().zip(&mut best) {
                let t0 = thread_cpu_s();
                let mut outs = out.chunks_exact_mut(nh * hd);
                attend_block(k, (hd, hd, nh), &kc, &vc, 1.0 / (hd as f32).sqrt(), nq, |j| (&q[j * nh * hd..(j + 1) * nh * hd], span(j)), &mut qh, &mut acc, |_| outs.next().unwrap());
                *best = best.min(thread_cpu_s() - t0);
            }
        }
        black_box(&out);
        let pairs = (0..nq).map(|j| (span(j).len * nh) as f64).sum::<f64>();
        for (k, best) in sets.iter().zip(&best) {
            let spans = if window > 0 { std::format!("window {window}") } else { "causal".into() };
            println!("{:>26}, {nh} heads of {hd:3}, {nq} queries at depth {past}, {spans:>10}: {:.3} ns per (query, key, head), {:.2} ms per block", super::tests_f16::label(k), best * 1e9 / pairs, best * 1e3);
        }
    }
}

/// `cargo test -p keel-core --release quant::bench::bench_plain_stream -- --ignored
/// --nocapture`: GB/s of one token's product (`matmul`, one thread) over a ~240 MiB
/// matrix in the plain layout (rows one by one, as decode takes a type without the rows16
/// layout), with and without the plain rows' far hint into L2 (`Kernels::plain_far_l2`):
/// for each kernel set of the CPU, a set with it and one without among the set and its
/// twins (`tests::rows16_kernel_sets`: the same kernels, other hints), in turn, five
/// products each per round; medians of each.
#[test]
#[ignore]
fn bench_plain_stream() {
    use crate::matmul::matmul;
    use crate::model::{Layout, Tensor};
    use crate::parallel::Sequential;
    let sets = super::tests::rows16_kernel_sets();
    let Some(&k0) = sets.first() else { return };
    let mut names: Vec<&str> = Vec::new();
    for k in &sets {
        if !names.contains(&k.name()) {
            names.push(k.name());
        }
    }
    let mut rng = Rng::new(3);
    for (ty, cols) in [(Q6_K, 2048usize), (Q5_K, 2048), (Q6_K, 2560)] {
        let (w0, a, wrb, _) = super::tests::matmul_operands(&k0, &mut rng, ty, 64, cols, 1);
        let rows = (240 << 20) / wrb / 64 * 64;
        let mut w = std::vec![0u8; rows * wrb];
        for c in w.chunks_exact_mut(64 * wrb) {
            c.copy_from_slice(&w0);
        }
        let t = Tensor { ty, cols, rows, data: &w, hi: &[], layout: Layout::Plain };
        let out = core::cell::RefCell::new(std::vec![0f32; rows]);
        for &name in &names {
            let pick = |far: bool| sets.iter().find(|s| s.name() == name && (s.plain_far_l2() != 0) == far).copied();
            let (Some(with), Some(without)) = (pick(true), pick(false)) else {
                println!("{name}: no twin differs in the plain rows' L2 hint");
                continue;
            };
            let [m1, m0] = alternated_gbs(w.len(), [&|| matmul(&with, &Sequential, &t, &a, 1, &mut out.borrow_mut()), &|| matmul(&without, &Sequential, &t, &a, 1, &mut out.borrow_mut())]);
            println!("{ty:?}, {rows} x {cols} ({} MiB), {name}: with the L2 hint {} bytes ahead {m1:.2} GB/s, without {m0:.2} GB/s: {:.3}x", w.len() >> 20, with.plain_far_l2(), m1 / m0);
        }
    }
}

/// `cargo test -p keel-core --release quant::bench::bench_rows16_stream -- --ignored
/// --nocapture`: GB/s of one token's product (`matmul`, one thread) over a ~240 MiB matrix
/// in the plain layout and in the rows16 layout, as decode streams a model's matrices, for
/// each kernel set of the CPU that packs the type (Q6_K and Q4_K at 2048 columns, Q8_0 and
/// Q5_0 at 640, Q4_1 and Q4_0 at 576): the two in turn, five products each per round, five
/// rounds; medians of each.
#[test]
#[ignore]
fn bench_rows16_stream() {
    use crate::matmul::matmul;
    use crate::model::{Layout, Tensor};
    use crate::parallel::Sequential;
    use crate::quant::rows16::{pack_in_place, ROWS16};
    let mut rng = Rng::new(5);
    for k in super::tests::fast_kernel_sets() {
        for (ty, cols) in [(Q6_K, 2048usize), (GgmlType::Q4_K, 2048), (Q8_0, 640), (Q5_0, 640), (Q4_1, 576), (Q4_0, 576)] {
            if !k.packs_rows16(ty, 64) {
                println!("{ty:?}, {}: no rows16 kernel", k.name());
                continue;
            }
            let (w0, a, wrb, _) = super::tests::matmul_operands(&k, &mut rng, ty, 64, cols, 1);
            let rows = (240 << 20) / wrb / 64 * 64;
            let mut w = std::vec![0u8; rows * wrb];
            for c in w.chunks_exact_mut(64 * wrb) {
                c.copy_from_slice(&w0);
            }
            let mut p = w.clone();
            pack_in_place(ty, rows, cols, &mut p, &mut std::vec![0u8; ROWS16 * wrb]).unwrap();
            let plain = Tensor { ty, cols, rows, data: &w, hi: &[], layout: Layout::Plain };
            let packed = Tensor { ty, cols, rows, data: &p, hi: &[], layout: Layout::Rows16 };
            let out = core::cell::RefCell::new(std::vec![0f32; rows]);
            let [m0, m1] = alternated_gbs(w.len(), [&|| matmul(&k, &Sequential, &plain, &a, 1, &mut out.borrow_mut()), &|| matmul(&k, &Sequential, &packed, &a, 1, &mut out.borrow_mut())]);
            println!("{ty:?}, {rows} x {cols} ({} MiB), {}: plain {m0:.2} GB/s, rows16 {m1:.2} GB/s: {:.3}x", w.len() >> 20, k.name(), m1 / m0);
        }
    }
}

/// GB/s of `bytes` per call of each of `runs`, alternated: five rounds of five calls each,
/// the median of each's 25 (the products of `bench_plain_stream` and `bench_rows16_stream`).
fn alternated_gbs(bytes: usize, runs: [&dyn Fn(); 2]) -> [f64; 2] {
    let mut gbs = [Vec::new(), Vec::new()];
    for _ in 0..5 {
        for (run, g) in runs.iter().zip(gbs.iter_mut()) {
            for _ in 0..5 {
                let t0 = Instant::now();
                run();
                g.push(bytes as f64 / t0.elapsed().as_secs_f64() / 1e9);
            }
        }
    }
    gbs.map(|mut g| {
        g.sort_by(|x, y| x.total_cmp(y));
        g[g.len() / 2]
    })
}

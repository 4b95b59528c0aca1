//! `cargo test -p keel-core --release quant::bench -- --ignored --nocapture`: ns per
//! `vec_dot` call of each kernel set, with the weight rows hot in L1 (8 rows cycled) and
//! streamed from a matrix larger than L2 (rows of ~16 MiB in total, as in decode).

extern crate std;
use std::{hint::black_box, println, time::Instant, vec::Vec};

use super::tests::{fast_kernels, random_row, Rng};
use super::*;
use crate::ggml_type::GgmlType::{self, *};

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

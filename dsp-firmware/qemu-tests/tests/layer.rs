//! The float ops of a transformer layer, run as Hexagon code by the device's
//! batch executor under qemu-hexagon, against `layer_ref`. Tolerances
//! (`|got − want| ≤ rel·|want| + abs`), stated per op:
//!
//! | op | tolerance |
//! |---|---|
//! | RmsNorm, Add, Mul, RoPE with a host cos/sin table, GetRows, Copy (F16), Quantize | exact (same bits) |
//! | Softmax | rel 1e-6, abs 1e-9 |
//! | SiLU, SwiGLU | rel 2e-6, abs 1e-30 |
//! | GELU | rel 1e-5, abs 1e-6 |
//! | GeGLU | rel 2e-3 (one f16 step of the table value), abs 1e-6 |
//! | RoPE with angles computed on the DSP | abs 2e-6·(|x0| + |x1|) per pair |
//! | Attention over F32 caches | abs 2e-6·max|v| (vs f64) |
//! | Attention over F16 caches | exact, against keel's CPU arithmetic (`layer_ref::attend_f16_cpu`) |

use keel_dsp_qemu_tests::batch::{bytes_f32, Builder, Failed, INVALID_ARGUMENT, UNSUPPORTED};
use keel_dsp_qemu_tests::layer_ref::{self as r, check_close, check_exact};
use keel_dsp_qemu_tests::Rng;
use keel_npu_hal::op::{DType, OpKind, TensorDesc};

fn randv(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.f32() * scale).collect()
}

fn out_f32(b: &Builder, bufs: &[Vec<u8>], t: u16) -> Vec<f32> {
    bytes_f32(b.tensor_bytes(bufs, t))
}

#[test]
fn rms_norm_is_exact_with_and_without_weight_in_place_or_not() {
    let mut rng = Rng(0x5a);
    for (n, rows, eps) in [(1usize, 1usize, 1e-5f32), (7, 3, 1e-6), (64, 4, 1e-5), (576, 2, 1e-5), (2048, 1, 1e-6)] {
        let x = randv(&mut rng, n * rows, 4.0);
        let w = randv(&mut rng, n, 2.0);
        let mut b = Builder::new();
        let ne = [n as u32, rows as u32, 1, 1];
        let xt = b.f32s(ne, &x);
        let wt = b.f32s([n as u32, 1, 1, 1], &w);
        let d1 = b.zeros(DType::F32, ne);
        let xt2 = b.f32s(ne, &x);
        b.op(OpKind::RmsNorm { eps }, [Some(xt), None, None], d1);
        b.op(OpKind::RmsNorm { eps }, [Some(xt2), Some(wt), None], xt2); // in place, weighted
        let bufs = b.run().unwrap();
        let (mut plain, mut weighted) = (Vec::new(), Vec::new());
        for row in x.chunks(n) {
            plain.extend(r::rms_norm(row, None, eps));
            weighted.extend(r::rms_norm(row, Some(&w), eps));
        }
        check_exact(&out_f32(&b, &bufs, d1), &plain, &format!("rms_norm n={n}"));
        check_exact(&out_f32(&b, &bufs, xt2), &weighted, &format!("rms_norm·w n={n}"));
    }
}

#[test]
fn add_and_mul_are_exact_with_broadcast_and_in_place() {
    let mut rng = Rng(0xadd);
    let (n, rows) = (96usize, 5usize);
    let ne = [n as u32, rows as u32, 1, 1];
    let (x, y, row) = (randv(&mut rng, n * rows, 10.0), randv(&mut rng, n * rows, 10.0), randv(&mut rng, n, 3.0));
    let mut b = Builder::new();
    let (xt, yt, rt) = (b.f32s(ne, &x), b.f32s(ne, &y), b.f32s([n as u32, 1, 1, 1], &row));
    let (sum, prod) = (b.zeros(DType::F32, ne), b.zeros(DType::F32, ne));
    let y2 = b.f32s(ne, &y);
    b.op(OpKind::Add, [Some(xt), Some(yt), None], sum);
    b.op(OpKind::Mul, [Some(xt), Some(rt), None], prod); // broadcast row
    b.op(OpKind::Add, [Some(xt), Some(y2), None], y2); // in place on the second operand
    let bufs = b.run().unwrap();
    let want_sum: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    let want_prod: Vec<f32> = x.iter().enumerate().map(|(i, a)| a * row[i % n]).collect();
    check_exact(&out_f32(&b, &bufs, sum), &want_sum, "add");
    check_exact(&out_f32(&b, &bufs, prod), &want_prod, "mul broadcast");
    check_exact(&out_f32(&b, &bufs, y2), &want_sum, "add in place on src1");
}

/// Values spanning the interesting ranges of the activations.
fn act_inputs(rng: &mut Rng) -> Vec<f32> {
    let mut v: Vec<f32> = (0..=400).map(|i| (i as f32 - 200.0) * 0.1).collect(); // -20..20
    v.extend([0.0, -0.0, 1e-8, -1e-8, 88.0, -88.0, 100.0, -100.0, 9.999, 10.0, -10.0, -9.999]);
    v.extend(randv(rng, 200, 6.0));
    v.resize(v.len().next_multiple_of(32), 0.5);
    v
}

#[test]
fn activations_and_gated_products_are_within_tolerance() {
    let mut rng = Rng(0xac7);
    let x = act_inputs(&mut rng);
    let u = randv(&mut rng, x.len(), 3.0);
    let ne = [32, (x.len() / 32) as u32, 1, 1];
    let mut b = Builder::new();
    let (xt, ut) = (b.f32s(ne, &x), b.f32s(ne, &u));
    let outs: Vec<u16> = (0..4).map(|_| b.zeros(DType::F32, ne)).collect();
    let x2 = b.f32s(ne, &x);
    b.op(OpKind::Silu, [Some(xt), None, None], outs[0]);
    b.op(OpKind::Gelu, [Some(xt), None, None], outs[1]);
    b.op(OpKind::SwiGlu, [Some(xt), Some(ut), None], outs[2]);
    b.op(OpKind::GeGlu, [Some(xt), Some(ut), None], outs[3]);
    b.op(OpKind::Silu, [Some(x2), None, None], x2); // in place
    let bufs = b.run().unwrap();
    let silu: Vec<f32> = x.iter().map(|&v| r::silu(v)).collect();
    let gelu: Vec<f32> = x.iter().map(|&v| r::gelu(v)).collect();
    let swiglu: Vec<f32> = x.iter().zip(&u).map(|(&v, &w)| r::silu(v) * w).collect();
    let geglu: Vec<f32> = x.iter().zip(&u).map(|(&v, &w)| r::geglu(v, w)).collect();
    let w = [
        check_close(&out_f32(&b, &bufs, outs[0]), &silu, 2e-6, 1e-30, "silu"),
        check_close(&out_f32(&b, &bufs, outs[1]), &gelu, 1e-5, 1e-6, "gelu"),
        check_close(&out_f32(&b, &bufs, outs[2]), &swiglu, 2e-6, 1e-30, "swiglu"),
        check_close(&out_f32(&b, &bufs, outs[3]), &geglu, 2e-3, 1e-6, "geglu"),
        check_close(&out_f32(&b, &bufs, x2), &silu, 2e-6, 1e-30, "silu in place"),
    ];
    eprintln!("worst error / bound: silu {} gelu {} swiglu {} geglu {}", w[0], w[1], w[2], w[3]);
}

#[test]
fn softmax_rows_are_within_tolerance() {
    let mut rng = Rng(0x50f7);
    for (n, rows, scale, mag) in [(1usize, 1usize, 1.0f32, 1.0f32), (10, 3, 0.125, 50.0), (257, 2, 1.0, 5.0), (1000, 1, 0.5, 30.0)] {
        let x = randv(&mut rng, n * rows, mag);
        let mut b = Builder::new();
        let xt = b.f32s([n as u32, rows as u32, 1, 1], &x);
        b.op(OpKind::Softmax { scale }, [Some(xt), None, None], xt);
        let bufs = b.run().unwrap();
        let want: Vec<f32> = x.chunks(n).flat_map(|row| r::softmax(row, scale)).collect();
        check_close(&out_f32(&b, &bufs, xt), &want, 1e-6, 1e-9, &format!("softmax n={n}"));
    }
}

#[test]
fn rope_normal_and_neox_with_host_table_are_exact_and_computed_angles_are_close() {
    let mut rng = Rng(0x20be);
    for (head_dim, n_head, n_tokens, n_dims, mode, base) in
        [(64u32, 4u32, 3u32, 64u16, 0u8, 10000f32), (64, 2, 2, 64, 2, 10000.0), (128, 2, 2, 64, 2, 1e6), (32, 3, 4, 16, 0, 500000.0)]
    {
        let ne = [head_dim, n_head, n_tokens, 1];
        let n = (head_dim * n_head * n_tokens) as usize;
        let x = randv(&mut rng, n, 2.0);
        let pos: Vec<i32> = (0..n_tokens as i32).map(|t| [0, 1, 17, 4095, 123_456][t as usize % 5] + t).collect();
        let cs: Vec<f32> = pos.iter().flat_map(|&p| r::rope_angles(p, base, n_dims as usize)).collect();
        let mut b = Builder::new();
        let (xt, xt2, pt) = (b.f32s(ne, &x), b.f32s(ne, &x), b.i32s(&pos));
        let ct = b.f32s([u32::from(n_dims), n_tokens, 1, 1], &cs);
        let d = b.zeros(DType::F32, ne);
        let kind = OpKind::Rope { n_dims, mode, freq_base: base };
        b.op(kind, [Some(xt), Some(pt), Some(ct)], xt); // host table, in place
        b.op(kind, [Some(xt2), Some(pt), None], d); // angles computed on the DSP
        let bufs = b.run().unwrap();
        let mut want = x.clone();
        for (t, tok) in want.chunks_mut((head_dim * n_head) as usize).enumerate() {
            for head in tok.chunks_mut(head_dim as usize) {
                r::rope_head(head, &cs[t * n_dims as usize..][..n_dims as usize], mode == 2);
            }
        }
        let what = format!("rope hd={head_dim} n_dims={n_dims} mode={mode}");
        check_exact(&out_f32(&b, &bufs, xt), &want, &format!("{what}, table"));
        // Computed angles: per pair, |Δ| ≤ 2e-6·(|x0| + |x1|).
        let got = out_f32(&b, &bufs, d);
        let half = n_dims as usize / 2;
        for (hi, (g, w)) in got.chunks(head_dim as usize).zip(want.chunks(head_dim as usize)).enumerate() {
            let src = &x[hi * head_dim as usize..];
            for i in 0..half {
                let (a, c) = if mode == 2 { (i, i + half) } else { (2 * i, 2 * i + 1) };
                let bound = 2e-6 * (src[a].abs() + src[c].abs());
                for j in [a, c] {
                    assert!((g[j] - w[j]).abs() <= bound, "{what}, computed: head {hi} dim {j}: {} vs {} (bound {bound:e})", g[j], w[j]);
                }
            }
            check_exact(&g[n_dims as usize..], &w[n_dims as usize..], &format!("{what}: unrotated tail"));
        }
    }
}

/// K/V caches laid out position-major (`[n_ctx][n_head_kv][head_dim]`, how a
/// product writes one position's K), described as `[head_dim, n_kv, n_head_kv]`
/// strided views of the first `n_kv` positions.
#[test]
fn attention_over_strided_f32_and_f16_caches_is_within_tolerance() {
    let mut rng = Rng(0xa77e);
    for (head_dim, n_head, n_head_kv, n_kv, n_tokens, f16) in [
        (64u32, 4u32, 4u32, 1u32, 1u32, false),
        (64, 4, 2, 37, 1, true),
        (32, 6, 2, 300, 3, false),
        (128, 2, 1, 129, 2, true),
        (16, 8, 8, 5, 5, false),
    ] {
        let n_ctx = n_kv + 3;
        let dtype = if f16 { DType::F16 } else { DType::F32 };
        let es = if f16 { 2 } else { 4 };
        let cache_vals = |rng: &mut Rng| randv(rng, (n_ctx * n_head_kv * head_dim) as usize, 1.5);
        let (kv, vv) = (cache_vals(&mut rng), cache_vals(&mut rng));
        let store = |v: &[f32]| -> Vec<u8> {
            if f16 {
                v.iter().flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes()).collect()
            } else {
                v.iter().flat_map(|x| x.to_le_bytes()).collect()
            }
        };
        let load = |v: &[f32], j: usize, h: usize, i: usize| {
            let x = v[(j * n_head_kv as usize + h) * head_dim as usize + i];
            if f16 {
                half::f16::from_f32(x).to_f32()
            } else {
                x
            }
        };
        let q = randv(&mut rng, (head_dim * n_head * n_tokens) as usize, 1.0);
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut b = Builder::new();
        let qne = [head_dim, n_head, n_tokens, 1];
        let (qt, q2) = (b.f32s(qne, &q), b.f32s(qne, &q));
        let (kb, vb) = (b.buffer(store(&kv)), b.buffer(store(&vv)));
        let view = |buf| TensorDesc {
            dtype,
            layout: keel_npu_hal::op::Layout::RowMajor,
            ne: [head_dim, n_kv, n_head_kv, 1],
            nb: [es, es * head_dim * n_head_kv, es * head_dim, es * head_dim * n_head_kv * n_ctx],
            buffer: buf,
            offset: 0,
        };
        let (kt, vt) = (b.tensor(view(kb)), b.tensor(view(vb)));
        let d = b.zeros(DType::F32, qne);
        let kind = OpKind::Attention { n_head: n_head as u16, n_head_kv: n_head_kv as u16, scale };
        b.op(kind, [Some(qt), Some(kt), Some(vt)], d);
        b.op(kind, [Some(q2), Some(kt), Some(vt)], q2); // in place over Q
        let bufs = b.run().unwrap();
        let mut want = Vec::new();
        let group = (n_head / n_head_kv) as usize;
        for t in 0..n_tokens as usize {
            for h in 0..n_head as usize {
                let qh = &q[(t * n_head as usize + h) * head_dim as usize..][..head_dim as usize];
                let hk = h / group;
                let n = (n_kv - n_tokens) as usize + t + 1;
                if f16 {
                    want.extend(r::attend_f16_cpu(qh, |j, i| load(&kv, j, hk, i), |j, i| load(&vv, j, hk, i), n, scale));
                } else {
                    want.extend(r::attend(qh, |j, i| load(&kv, j, hk, i), |j, i| load(&vv, j, hk, i), n, scale));
                }
            }
        }
        let what = format!("attention hd={head_dim} heads={n_head}/{n_head_kv} n_kv={n_kv} tokens={n_tokens} f16={f16}");
        if f16 {
            check_exact(&out_f32(&b, &bufs, d), &want, &what);
            check_exact(&out_f32(&b, &bufs, q2), &want, &format!("{what}, in place"));
        } else {
            check_close(&out_f32(&b, &bufs, d), &want, 0.0, 2e-6 * 1.5, &what);
            check_close(&out_f32(&b, &bufs, q2), &want, 0.0, 2e-6 * 1.5, &format!("{what}, in place"));
        }
    }
}

#[test]
fn copy_to_an_f16_cache_view_is_exact() {
    let mut rng = Rng(0xc0b1);
    let (head_dim, n_head_kv, n_ctx, pos) = (32u32, 2u32, 8u32, 5u32);
    let x = randv(&mut rng, (head_dim * n_head_kv) as usize, 70000.0); // some overflow to ±inf
    let mut b = Builder::new();
    let xt = b.f32s([head_dim, n_head_kv, 1, 1], &x);
    let cache = b.buffer(vec![0; (2 * head_dim * n_head_kv * n_ctx) as usize]);
    let row = 2 * head_dim * n_head_kv;
    let dst = b.tensor(TensorDesc {
        dtype: DType::F16,
        layout: keel_npu_hal::op::Layout::RowMajor,
        ne: [head_dim, n_head_kv, 1, 1],
        nb: [2, 2 * head_dim, row, row],
        buffer: cache,
        offset: pos * row,
    });
    b.op(OpKind::Copy, [Some(xt), None, None], dst);
    let bufs = b.run().unwrap();
    let c = &bufs[usize::from(cache)];
    for (i, &v) in x.iter().enumerate() {
        let at = (pos * row) as usize + 2 * i;
        assert_eq!(u16::from_le_bytes([c[at], c[at + 1]]), half::f16::from_f32(v).to_bits(), "element {i} ({v})");
    }
    assert!(c[..(pos * row) as usize].iter().chain(&c[((pos + 1) * row) as usize..]).all(|&b| b == 0), "other positions untouched");
}

#[test]
fn bad_requests_fail_their_op() {
    let mut b = Builder::new();
    let buf = b.buffer(vec![0; 4 * 192]);
    let x = b.view(DType::F32, [64, 2, 1, 1], buf, 0);
    // A destination that overlaps its source without being it.
    let shifted = b.view(DType::F32, [64, 2, 1, 1], buf, 4 * 32);
    b.op(OpKind::Silu, [Some(x), None, None], shifted);
    assert_eq!(b.run().unwrap_err(), Failed { op: 0, code: INVALID_ARGUMENT });
    // RoPE mode 1 is not a mode the firmware knows.
    let mut b = Builder::new();
    let x = b.f32s([64, 1, 1, 1], &[1.0; 64]);
    let p = b.i32s(&[3]);
    b.op(OpKind::Silu, [Some(x), None, None], x);
    b.op(OpKind::Rope { n_dims: 64, mode: 1, freq_base: 1e4 }, [Some(x), Some(p), None], x);
    assert_eq!(b.run().unwrap_err(), Failed { op: 1, code: UNSUPPORTED });
}

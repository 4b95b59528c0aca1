//! The float ops of a transformer layer, run as Hexagon code by the device's batch
//! executor (`CMD_BATCH`) under qemu-hexagon, against keel-core on the host
//! (`keel_dsp_qemu_tests::expect`: `keel_core::ops`, `keel_core::attention`,
//! `Kernels::reference()`), bit for bit: RMSNorm, Add, Mul, SiLU, GELU, SwiGLU, GeGLU,
//! Softmax, RoPE (host table or angles computed on the DSP), attention over strided F16
//! caches, Copy into an F16 cache. GELU and GeGLU see all 65,536 f16 values; SiLU,
//! Softmax, SwiGLU and GeGLU a large set of f32 values of every kind (tiny, huge,
//! ±0, ±∞, subnormal, NaN, and around the exponentials' range limits).

use half::f16;
use keel_dsp_qemu_tests::batch::{Builder, Failed, INVALID_ARGUMENT, UNSUPPORTED};
use keel_dsp_qemu_tests::expect::{self as e, Attn, Cache};
use keel_dsp_qemu_tests::{assert_same_bytes, assert_same_f32, every_f16, f16_bytes, wide_values, Rng};
use keel_npu_hal::op::{DType, Layout, OpKind, TensorDesc};

#[test]
fn norm_rows_equal_keel_core_with_and_without_weight_in_place_or_not() {
    let mut rng = Rng(0x5a);
    for (n, rows, eps) in [(1usize, 1usize, 1e-5f32), (7, 3, 1e-6), (64, 4, 1e-5), (576, 2, 1e-5), (2048, 1, 1e-6)] {
        let x = rng.vec(n * rows, 4.0);
        let w = rng.vec(n, 2.0);
        let mut b = Builder::new();
        let ne = [n as u32, rows as u32, 1, 1];
        let xt = b.f32s(ne, &x);
        let wt = b.f32s([n as u32, 1, 1, 1], &w);
        let (d1, d2) = (b.zeros(DType::F32, ne), b.zeros(DType::F32, ne));
        let xt2 = b.f32s(ne, &x);
        b.op(OpKind::RmsNorm { eps }, [Some(xt), None, None], d1);
        b.op(OpKind::RmsNorm { eps }, [Some(xt), Some(wt), None], d2);
        b.op(OpKind::RmsNorm { eps }, [Some(xt2), Some(wt), None], xt2); // in place, weighted
        let bufs = b.run().unwrap();
        let (plain, weighted) = (e::norm_rows(&x, n, None, eps), e::norm_rows(&x, n, Some(&w), eps));
        assert_same_f32(&b.f32_of(&bufs, d1), &plain, &format!("rms_norm n={n} rows={rows}"));
        assert_same_f32(&b.f32_of(&bufs, d2), &weighted, &format!("rms_norm·w n={n} rows={rows}"));
        assert_same_f32(&b.f32_of(&bufs, xt2), &weighted, &format!("rms_norm·w in place n={n} rows={rows}"));
    }
}

#[test]
fn add_and_mul_equal_keel_core_with_broadcast_and_in_place() {
    let mut rng = Rng(0xadd);
    let (n, rows) = (96usize, 5usize);
    let ne = [n as u32, rows as u32, 1, 1];
    let (x, y, row) = (rng.vec(n * rows, 10.0), rng.vec(n * rows, 10.0), rng.vec(n, 3.0));
    let mut b = Builder::new();
    let (xt, yt, rt) = (b.f32s(ne, &x), b.f32s(ne, &y), b.f32s([n as u32, 1, 1, 1], &row));
    let (sum, prod, prod_b, sum_b) = (b.zeros(DType::F32, ne), b.zeros(DType::F32, ne), b.zeros(DType::F32, ne), b.zeros(DType::F32, ne));
    let (x2, y2) = (b.f32s(ne, &x), b.f32s(ne, &y));
    b.op(OpKind::Add, [Some(xt), Some(yt), None], sum);
    b.op(OpKind::Mul, [Some(xt), Some(yt), None], prod);
    b.op(OpKind::Mul, [Some(xt), Some(rt), None], prod_b); // broadcast row
    b.op(OpKind::Add, [Some(xt), Some(rt), None], sum_b); // broadcast row
    b.op(OpKind::Add, [Some(xt), Some(y2), None], y2); // in place on the second operand
    b.op(OpKind::Mul, [Some(x2), Some(rt), None], x2); // in place on the first, broadcast
    let bufs = b.run().unwrap();
    assert_same_f32(&b.f32_of(&bufs, sum), &e::add(&x, &y), "add");
    assert_same_f32(&b.f32_of(&bufs, prod), &e::mul(&x, &y), "mul");
    assert_same_f32(&b.f32_of(&bufs, prod_b), &e::mul(&x, &row), "mul broadcast row");
    assert_same_f32(&b.f32_of(&bufs, sum_b), &e::add(&x, &row), "add broadcast row");
    // In place on src1 the firmware adds src0 into src1's bytes (add_assign(y, x)).
    assert_same_f32(&b.f32_of(&bufs, y2), &e::add(&y, &x), "add in place on src1");
    assert_same_f32(&b.f32_of(&bufs, x2), &e::mul(&x, &row), "mul in place, broadcast");
}

#[test]
fn every_f16_value_through_gelu_and_geglu_equals_keel_core() {
    let mut rng = Rng(0x6e1);
    let x = every_f16();
    let up = rng.vec(x.len(), 3.0);
    let ne = [256, 256, 1, 1];
    let mut b = Builder::new();
    let (xt, ut) = (b.f32s(ne, &x), b.f32s(ne, &up));
    let (gelu, geglu) = (b.zeros(DType::F32, ne), b.zeros(DType::F32, ne));
    b.op(OpKind::Gelu, [Some(xt), None, None], gelu);
    b.op(OpKind::GeGlu, [Some(xt), Some(ut), None], geglu);
    let bufs = b.run().unwrap();
    assert_same_f32(&b.f32_of(&bufs, gelu), &e::each_gelu(&x), "gelu of every f16 value");
    assert_same_f32(&b.f32_of(&bufs, geglu), &e::geglu(&x, &up), "geglu of every f16 value");
}

/// SwiGLU where the DSP's four-at-a-time path takes its values (every gate of a step
/// below 80 in magnitude): every exponent `n` of `ggml_expf` from −116 to 116 (which
/// the DSP adds to the exponent field of `j`, the reference by two multiplications), ±0,
/// subnormals, values just below ±80, and steps where one gate of four is 80 or more
/// (the reference for that step), over a length that leaves a tail of 3.
#[test]
fn swiglu_on_the_dsps_fast_path_equals_keel_core() {
    let mut rng = Rng(0x5e1f);
    let mut x: Vec<f32> = (-116..=116).map(|n| -(n as f32) * core::f32::consts::LN_2 + rng.f32() * 0.3).collect();
    x.extend([0.0, -0.0, f32::from_bits(1), f32::from_bits(0x8000_0001), 79.99999, -79.99999, f32::from_bits(0x429f_ffff), f32::from_bits(0xc29f_ffff)]);
    x.extend((0..3999).map(|i| if i % 97 == 0 { 80.0 + rng.f32().abs() * 10.0 } else { rng.f32() * 80.0 }));
    x.extend((0..3).map(|_| rng.f32() * 5.0));
    let n = x.len();
    assert_eq!(n % 4, 3);
    let up: Vec<f32> = (0..n).map(|_| rng.f32() * 4.0).collect();
    let mut b = Builder::new();
    let (xt, ut) = (b.f32s([n as u32, 1, 1, 1], &x), b.f32s([n as u32, 1, 1, 1], &up));
    let out = b.zeros(DType::F32, [n as u32, 1, 1, 1]);
    b.op(OpKind::SwiGlu, [Some(xt), Some(ut), None], out);
    let bufs = b.run().unwrap();
    assert_same_f32(&b.f32_of(&bufs, out), &e::swiglu(&x, &up), "swiglu, fast range");
}

#[test]
fn a_large_set_through_silu_gelu_swiglu_geglu_equals_keel_core() {
    let mut rng = Rng(0xac7);
    let n = 262_144;
    let x = wide_values(&mut rng, n);
    let count = |f: fn(&f32) -> bool| x.iter().filter(|v| f(v)).count();
    let kinds = [
        ("NaN", count(|v| v.is_nan())),
        ("±∞", count(|v| v.is_infinite())),
        ("±0", count(|&v| v == 0.0)),
        ("subnormal", count(|v| v.is_subnormal())),
        ("|x| in [87, 140)", count(|v| (87.0..140.0).contains(&v.abs()))),
        ("|x| ≥ 2^40", count(|v| v.is_finite() && v.abs() >= 2f32.powi(40))),
    ];
    assert!(kinds.iter().all(|k| k.1 > 0), "the set lacks a kind: {kinds:?}");
    eprintln!("{n} inputs, among them {kinds:?}");
    // Up values: mostly moderate, a fifth of every kind.
    let up: Vec<f32> = wide_values(&mut rng, n).into_iter().map(|v| if rng.u32().is_multiple_of(5) { v } else { rng.f32() * 4.0 }).collect();
    let ne = [512, (n / 512) as u32, 1, 1];
    let mut b = Builder::new();
    let (xt, ut) = (b.f32s(ne, &x), b.f32s(ne, &up));
    let outs: Vec<u16> = (0..4).map(|_| b.zeros(DType::F32, ne)).collect();
    let small = [32, 64, 1, 1];
    let x2 = b.f32s(small, &x[..32 * 64]);
    b.op(OpKind::Silu, [Some(xt), None, None], outs[0]);
    b.op(OpKind::Gelu, [Some(xt), None, None], outs[1]);
    b.op(OpKind::SwiGlu, [Some(xt), Some(ut), None], outs[2]);
    b.op(OpKind::GeGlu, [Some(xt), Some(ut), None], outs[3]);
    b.op(OpKind::Silu, [Some(x2), None, None], x2); // in place
    let bufs = b.run().unwrap();
    assert_same_f32(&b.f32_of(&bufs, outs[0]), &e::each_silu(&x), "silu");
    assert_same_f32(&b.f32_of(&bufs, outs[1]), &e::each_gelu(&x), "gelu");
    assert_same_f32(&b.f32_of(&bufs, outs[2]), &e::swiglu(&x, &up), "swiglu");
    assert_same_f32(&b.f32_of(&bufs, outs[3]), &e::geglu(&x, &up), "geglu");
    assert_same_f32(&b.f32_of(&bufs, x2), &e::each_silu(&x[..32 * 64]), "silu in place");
}

#[test]
fn softmax_rows_equal_keel_core_on_a_large_set() {
    let mut rng = Rng(0x50f7);
    // Rows of one kind each, so most rows keep finite sums: moderate logits, logits
    // whose exponentials underflow to subnormals and zero, huge and tiny ones; every
    // 16th row of every kind (with ±∞, NaN, subnormals) and one of every finite kind.
    let kinds = |rng: &mut Rng, n: usize, r: usize| -> Vec<f32> {
        match r % 16 {
            15 => wide_values(rng, n),
            14 => wide_values(rng, 2 * n).into_iter().filter(|v| v.is_finite()).take(n).collect(),
            k if k % 4 == 0 => rng.vec(n, 8.0),
            k if k % 4 == 1 => rng.vec(n, 120.0),
            k if k % 4 == 2 => rng.vec(n, 1e-30),
            _ => (0..n).map(|_| rng.f32() * f32::from_bits(0x3f80_0000 + ((rng.u32() % 60) << 23))).collect(),
        }
    };
    let mut b = Builder::new();
    let mut checks = Vec::new();
    for (n, rows, scale) in [(1usize, 3usize, 1.0f32), (10, 3, 0.125), (257, 2, 1.0), (1000, 100, 1.0), (777, 64, 0.0625), (4096, 13, 3.5)] {
        let x: Vec<f32> = (0..rows).flat_map(|r| kinds(&mut rng, n, r)).collect();
        let t = b.f32s([n as u32, rows as u32, 1, 1], &x);
        b.op(OpKind::Softmax { scale }, [Some(t), None, None], t);
        checks.push((t, e::softmax(&x, n, scale), format!("softmax n={n} rows={rows} scale={scale}")));
    }
    let x = rng.vec(300, 30.0);
    let (xt, d) = (b.f32s([300, 1, 1, 1], &x), b.zeros(DType::F32, [300, 1, 1, 1]));
    b.op(OpKind::Softmax { scale: 0.5 }, [Some(xt), None, None], d); // disjoint destination
    checks.push((d, e::softmax(&x, 300, 0.5), "softmax into another tensor".into()));
    let bufs = b.run().unwrap();
    let total: usize = checks.iter().map(|c| c.1.len()).sum();
    assert!(total >= 100_000, "{total} values");
    let count = |f: fn(&f32) -> bool| checks.iter().flat_map(|c| &c.1).filter(|v| f(v)).count();
    let (nan, sub, zero) = (count(|v| v.is_nan()), count(|v| v.is_subnormal()), count(|&v| v == 0.0));
    assert!(nan * 10 < total && sub > 0 && zero > 0, "{total} outputs: {nan} NaN, {sub} subnormal, {zero} zero");
    eprintln!("softmax: {total} outputs, {nan} NaN, {sub} subnormal, {zero} zero");
    for (t, want, what) in checks {
        assert_same_f32(&b.f32_of(&bufs, t), &want, &what);
    }
}

#[test]
fn rope_normal_and_neox_with_host_table_or_computed_angles_equal_keel_core() {
    let mut rng = Rng(0x20be);
    for (head_dim, n_head, n_tokens, n_dims, mode, base) in [
        (64u32, 4u32, 3u32, 64u16, 0u8, 10000f32),
        (64, 2, 2, 64, 2, 10000.0),
        (128, 2, 2, 64, 2, 1e6),
        (32, 3, 4, 16, 0, 500000.0),
        (96, 1, 5, 96, 0, 10000.0),
    ] {
        let ne = [head_dim, n_head, n_tokens, 1];
        let (hd, nh, nd) = (head_dim as usize, n_head as usize, usize::from(n_dims));
        let x = rng.vec(hd * nh * n_tokens as usize, 2.0);
        let pos: Vec<i32> = (0..n_tokens as i32).map(|t| [0, 1, 17, 4095, 123_456][t as usize % 5] + t).collect();
        let cs = e::rope_table(&pos, base, nd);
        let mut b = Builder::new();
        let (xt, xt2, pt) = (b.f32s(ne, &x), b.f32s(ne, &x), b.i32s(&pos));
        let ct = b.f32s([u32::from(n_dims), n_tokens, 1, 1], &cs);
        let (d1, d2) = (b.zeros(DType::F32, ne), b.zeros(DType::F32, ne));
        let kind = OpKind::Rope { n_dims, mode, freq_base: base };
        b.op(kind, [Some(xt), Some(pt), Some(ct)], xt); // host table, in place
        b.op(kind, [Some(xt2), Some(pt), Some(ct)], d1); // host table, disjoint
        b.op(kind, [Some(xt2), Some(pt), None], d2); // angles computed on the DSP
        let bufs = b.run().unwrap();
        let what = format!("rope hd={head_dim} heads={n_head} tokens={n_tokens} n_dims={n_dims} mode={mode} base={base}");
        let with_table = e::rope(&x, hd, nh, &pos, nd, mode, base, Some(&cs));
        assert_same_f32(&b.f32_of(&bufs, xt), &with_table, &format!("{what}, table, in place"));
        assert_same_f32(&b.f32_of(&bufs, d1), &with_table, &format!("{what}, table"));
        assert_same_f32(&b.f32_of(&bufs, d2), &e::rope(&x, hd, nh, &pos, nd, mode, base, None), &format!("{what}, computed angles"));
    }
}

/// K/V caches laid out position-major (`[n_ctx][n_head_kv][head_dim]`, how keel's
/// cache holds one position's K), described as `[head_dim, n_kv, n_head_kv]` strided
/// views of the first `n_kv` positions.
fn cache_view(dtype: DType, head_dim: u32, n_kv: u32, n_head_kv: u32, n_ctx: u32, buffer: u16) -> TensorDesc {
    let es = dtype.block_bytes();
    TensorDesc {
        dtype,
        layout: Layout::RowMajor,
        ne: [head_dim, n_kv, n_head_kv, 1],
        nb: [es, es * head_dim * n_head_kv, es * head_dim, es * head_dim * n_head_kv * n_ctx],
        buffer,
        offset: 0,
    }
}

#[test]
fn attention_over_strided_f16_caches_equals_keel_core() {
    let mut rng = Rng(0xa77e);
    for (head_dim, n_head, n_head_kv, n_kv, n_tokens) in
        [(64u32, 4u32, 4u32, 1u32, 1u32), (64, 4, 2, 37, 1), (32, 6, 2, 300, 3), (128, 2, 1, 129, 2), (16, 8, 8, 5, 5), (80, 3, 1, 70, 4), (96, 2, 2, 67, 3), (48, 2, 1, 130, 2), (256, 2, 1, 40, 2)]
    {
        let n_ctx = n_kv + 3;
        let (hd, nh, nkv) = (head_dim as usize, n_head as usize, n_head_kv as usize);
        let cache_vals = |rng: &mut Rng| -> Vec<f16> { rng.vec(n_ctx as usize * nkv * hd, 1.5).into_iter().map(f16::from_f32).collect() };
        let (kv, vv) = (cache_vals(&mut rng), cache_vals(&mut rng));
        let q = rng.vec(hd * nh * n_tokens as usize, 1.0);
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut b = Builder::new();
        let qne = [head_dim, n_head, n_tokens, 1];
        let (qt, q2) = (b.f32s(qne, &q), b.f32s(qne, &q));
        let (kb, vb) = (b.buffer(f16_bytes(&kv)), b.buffer(f16_bytes(&vv)));
        let (kt, vt) = (
            b.tensor(cache_view(DType::F16, head_dim, n_kv, n_head_kv, n_ctx, kb)),
            b.tensor(cache_view(DType::F16, head_dim, n_kv, n_head_kv, n_ctx, vb)),
        );
        let d = b.zeros(DType::F32, qne);
        let kind = OpKind::Attention { n_head: n_head as u16, n_head_kv: n_head_kv as u16, scale, window: 0 };
        b.op(kind, [Some(qt), Some(kt), Some(vt)], d);
        b.op(kind, [Some(q2), Some(kt), Some(vt)], q2); // in place over Q
        let bufs = b.run().unwrap();
        let shape = Attn { head_dim: hd, n_head: nh, n_head_kv: nkv, n_tokens: n_tokens as usize, n_kv: n_kv as usize, scale, window: 0 };
        let cache = |data| Cache { data, pos_stride: nkv * hd, head_stride: hd };
        let want = e::attention(&q, shape, cache(&kv), cache(&vv));
        let what = format!("attention hd={head_dim} heads={n_head}/{n_head_kv} n_kv={n_kv} tokens={n_tokens}");
        assert_same_f32(&b.f32_of(&bufs, d), &want, &what);
        assert_same_f32(&b.f32_of(&bufs, q2), &want, &format!("{what}, in place"));
        assert_same_bytes(&bufs[usize::from(kb)], &f16_bytes(&kv), "K cache untouched");
    }
}

/// keel's caches are F16; attention over F32 caches is refused, not computed.
#[test]
fn attention_over_f32_caches_is_unsupported() {
    let (head_dim, n_head, n_kv) = (32u32, 2u32, 4u32);
    let mut b = Builder::new();
    let q = b.f32s([head_dim, n_head, 1, 1], &vec![0.5; (head_dim * n_head) as usize]);
    let (kb, vb) = (b.buffer(vec![0; (4 * head_dim * n_kv) as usize]), b.buffer(vec![0; (4 * head_dim * n_kv) as usize]));
    let (kt, vt) = (b.tensor(cache_view(DType::F32, head_dim, n_kv, 1, n_kv, kb)), b.tensor(cache_view(DType::F32, head_dim, n_kv, 1, n_kv, vb)));
    let d = b.zeros(DType::F32, [head_dim, n_head, 1, 1]);
    b.op(OpKind::Silu, [Some(q), None, None], q);
    b.op(OpKind::Attention { n_head: n_head as u16, n_head_kv: 1, scale: 0.25, window: 0 }, [Some(q), Some(kt), Some(vt)], d);
    assert_eq!(b.run().unwrap_err(), Failed { op: 1, code: UNSUPPORTED });
}

#[test]
fn copy_to_an_f16_cache_view_equals_keel_core() {
    let mut rng = Rng(0xc0b1);
    let (head_dim, n_head_kv, n_ctx, pos) = (32u32, 2u32, 8u32, 5u32);
    let mut x = rng.vec((head_dim * n_head_kv) as usize, 70000.0); // some overflow to ±inf
    x[..8].copy_from_slice(&[0.0, -0.0, 1e-8, -6e-8, 65519.0, 65520.0, f32::INFINITY, 2.0f32.powi(-24) * 1.5]);
    let mut b = Builder::new();
    let xt = b.f32s([head_dim, n_head_kv, 1, 1], &x);
    let cache = b.buffer(vec![0; (2 * head_dim * n_head_kv * n_ctx) as usize]);
    let row = 2 * head_dim * n_head_kv;
    let dst = b.tensor(TensorDesc {
        dtype: DType::F16,
        layout: Layout::RowMajor,
        ne: [head_dim, n_head_kv, 1, 1],
        nb: [2, 2 * head_dim, row, row],
        buffer: cache,
        offset: pos * row,
    });
    let y = b.zeros(DType::F32, [head_dim, n_head_kv, 1, 1]);
    b.op(OpKind::Copy, [Some(xt), None, None], dst);
    b.op(OpKind::Copy, [Some(xt), None, None], y); // F32 → F32
    let bufs = b.run().unwrap();
    let c = &bufs[usize::from(cache)];
    let (at, end) = ((pos * row) as usize, ((pos + 1) * row) as usize);
    assert_same_bytes(&c[at..end], &f16_bytes(&e::to_f16(&x)), "F16 cache row");
    assert!(c[..at].iter().chain(&c[end..]).all(|&b| b == 0), "other positions untouched");
    assert_same_f32(&b.f32_of(&bufs, y), &x, "F32 copy");
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
    // SwiGLU's operands must have the same shape (no broadcast row).
    let mut b = Builder::new();
    let (g, u) = (b.f32s([32, 2, 1, 1], &[1.0; 64]), b.f32s([32, 1, 1, 1], &[1.0; 32]));
    b.op(OpKind::SwiGlu, [Some(g), Some(u), None], g);
    assert_eq!(b.run().unwrap_err(), Failed { op: 0, code: UNSUPPORTED });
}

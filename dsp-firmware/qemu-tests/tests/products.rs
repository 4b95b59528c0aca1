//! Products and data movement through the device's batch executor under
//! qemu-hexagon: embedding rows, activation quantization on the DSP, matrix products
//! taking those Q8_0 activations or F32 columns (all three weight types); and one whole
//! llama-style decoder layer as a single batch — each against keel-core on the host
//! (`keel_dsp_qemu_tests::expect`, chained by `keel_dsp_qemu_tests::llama`), bit for bit.

use half::f16;
use keel_dsp_qemu_tests::batch::{Builder, Failed, INVALID_ARGUMENT, OUT_OF_MEMORY};
use keel_dsp_qemu_tests::expect::{self as e, Tiled};
use keel_dsp_qemu_tests::llama::{self, Layer};
use keel_dsp_qemu_tests::{assert_same_bytes, assert_same_f32, f16_bytes, ggml_weights, Rng};
use keel_npu_hal::op::{DType, Layout, OpKind, TensorDesc};

#[test]
fn get_rows_equals_keel_core_for_every_type() {
    let mut rng = Rng(0x6e7);
    let (n, vocab) = (96usize, 11usize);
    let ids = [3i32, 0, 10, 3, 7];
    for t in [DType::Q8_0, DType::Q4_0, DType::IQ4NL] {
        let table = ggml_weights(t, vocab, n, &mut rng);
        let mut b = Builder::new();
        let tb = b.buffer(table.clone());
        let tt = b.view(t, [n as u32, vocab as u32, 1, 1], tb, 0);
        let it = b.i32s(&ids);
        let d = b.zeros(DType::F32, [n as u32, ids.len() as u32, 1, 1]);
        b.op(OpKind::GetRows, [Some(tt), Some(it), None], d);
        let bufs = b.run().unwrap();
        assert_same_f32(&b.f32_of(&bufs, d), &e::get_rows(t, &table, n, &ids), &format!("get_rows {t:?}"));
    }
    // F32 and F16 tables (F16 values of every kind), and an index out of range.
    let vals = rng.vec(n * vocab, 9.0);
    let mut halves: Vec<f16> = vals.iter().map(|&v| f16::from_f32(v)).collect();
    halves[..8].copy_from_slice(&[
        f16::INFINITY,
        f16::NEG_INFINITY,
        f16::NAN,
        f16::from_bits(1),
        f16::from_bits(0x83ff),
        f16::MAX,
        f16::ZERO,
        f16::NEG_ZERO,
    ]);
    let mut b = Builder::new();
    let tf = b.f32s([n as u32, vocab as u32, 1, 1], &vals);
    let hb = b.buffer(f16_bytes(&halves));
    let th = b.view(DType::F16, [n as u32, vocab as u32, 1, 1], hb, 0);
    let it = b.i32s(&ids);
    let (d1, d2) = (b.zeros(DType::F32, [n as u32, 5, 1, 1]), b.zeros(DType::F32, [n as u32, 5, 1, 1]));
    b.op(OpKind::GetRows, [Some(tf), Some(it), None], d1);
    b.op(OpKind::GetRows, [Some(th), Some(it), None], d2);
    let bufs = b.run().unwrap();
    assert_same_f32(&b.f32_of(&bufs, d1), &e::get_rows(DType::F32, &keel_dsp_qemu_tests::f32_bytes(&vals), n, &ids), "get_rows F32");
    assert_same_f32(&b.f32_of(&bufs, d2), &e::get_rows(DType::F16, &f16_bytes(&halves), n, &ids), "get_rows F16");
    let mut b = Builder::new();
    let tf = b.f32s([n as u32, vocab as u32, 1, 1], &vals);
    let it = b.i32s(&[1, vocab as i32]);
    let d = b.zeros(DType::F32, [n as u32, 2, 1, 1]);
    b.op(OpKind::GetRows, [Some(tf), Some(it), None], d);
    assert_eq!(b.run().unwrap_err(), Failed { op: 0, code: INVALID_ARGUMENT });
}

#[test]
fn quantize_on_the_dsp_then_products_equal_keel_core() {
    let mut rng = Rng(0x9a7);
    for (t, rows, k, cols) in [
        (DType::Q8_0, 70usize, 192usize, 3usize),
        (DType::Q4_0, 33, 256, 2),
        (DType::IQ4NL, 100, 160, 1),
        (DType::IQ4NL, 300, 1024, 2),
        (DType::Q8_0, 257, 512, 2),
    ] {
        let w = ggml_weights(t, rows, k, &mut rng);
        let mut x: Vec<f32> = (0..k * cols).map(|i| if i % 97 == 0 { rng.f32() * 200.0 } else { rng.f32() * 3.0 }).collect();
        x[32..64].fill(0.0); // an all-zero block
        x[64..96].iter_mut().enumerate().for_each(|(i, v)| *v = (i as f32 - 16.0) * 0.25); // rounding ties
        let mut b = Builder::new();
        let wt = b.tiled(t, rows as u32, k as u32, &w);
        let xt = b.f32s([k as u32, cols as u32, 1, 1], &x);
        let xq = b.zeros(DType::Q8_0, [k as u32, cols as u32, 1, 1]);
        let (d1, d2) = (b.zeros(DType::F32, [rows as u32, cols as u32, 1, 1]), b.zeros(DType::F32, [rows as u32, cols as u32, 1, 1]));
        b.op(OpKind::Quantize, [Some(xt), None, None], xq);
        b.op(OpKind::MatMul, [Some(wt), Some(xq), None], d1); // pre-quantized columns
        b.op(OpKind::MatMul, [Some(wt), Some(xt), None], d2); // F32 columns, quantized inside
        let bufs = b.run().unwrap();
        let what = format!("{t:?} rows={rows} k={k} cols={cols}");
        let want_q = e::quantize_q8_0(&x);
        assert_same_bytes(b.tensor_bytes(&bufs, xq), &want_q, &format!("Q8_0 activations, {what}"));
        let want = e::matmul(&Tiled::new(t, rows, k, &w), &want_q);
        assert_same_f32(&b.f32_of(&bufs, d1), &want, &format!("{what}, Q8_0 columns"));
        assert_same_f32(&b.f32_of(&bufs, d2), &want, &format!("{what}, F32 columns"));
        let cpu: Vec<f32> = want_q.chunks(k / 32 * 34).flat_map(|col| e::row_dots(t, &w, rows, k, col)).collect();
        assert_same_f32(&b.f32_of(&bufs, d1), &cpu, &format!("{what}, vs the CPU row dot"));
    }
    // A product whose quantized columns do not fit the scratch fails its op (the
    // scratch still holds the self-test the harness runs first).
    let mut b = Builder::new();
    let wt = b.tiled(DType::Q4_0, 64, 1024, &ggml_weights(DType::Q4_0, 64, 1024, &mut rng));
    let xt = b.f32s([1024, 32, 1, 1], &vec![1.0; 1024 * 32]);
    let d = b.zeros(DType::F32, [64, 32, 1, 1]);
    b.op(OpKind::MatMul, [Some(wt), Some(xt), None], d);
    b.scratch = 32 << 10;
    assert_eq!(b.run().unwrap_err(), Failed { op: 0, code: OUT_OF_MEMORY });
}

/// F32 columns quantized inside a product on the DSP (its HVX-and-scalar quantizer)
/// give keel-core's Q8_0 blocks on the blocks its fast path takes and on those it hands
/// to the reference: each column one kind of block beside an ordinary one (a NaN, ±∞,
/// subnormal values, an `amax` whose `127/amax` overflows or nearly does, rounding ties
/// at `id = 1`, values near f32::MAX, zeros of both signs), and the same columns at a
/// 4-byte offset (not 8-aligned: the reference for every block); and the `Quantize` op's
/// bytes from the same blocks (which also show the quants of blocks whose f16 scale is 0,
/// where a product cannot).
#[test]
fn f32_columns_quantized_in_a_product_on_edge_blocks_equal_keel_core() {
    let mut rng = Rng(0x51ce);
    let k = 64;
    let mut cols: Vec<[f32; 32]> = Vec::new();
    let ordinary = |rng: &mut Rng, scale: f32| -> [f32; 32] { core::array::from_fn(|_| rng.f32() * scale) };
    let with = |at: usize, v: f32, rng: &mut Rng| {
        let mut b = ordinary(rng, 2.0);
        b[at] = v;
        b
    };
    cols.push(with(5, f32::NAN, &mut rng));
    cols.push(with(31, f32::INFINITY, &mut rng));
    cols.push(with(0, f32::NEG_INFINITY, &mut rng));
    cols.push(ordinary(&mut rng, 1e-40)); // subnormal amax: 127/amax = ∞
    cols.push(ordinary(&mut rng, 1e-37)); // normal amax, 127/amax still ∞
    cols.push(ordinary(&mut rng, 6e-37)); // 127/amax finite, near f32::MAX
    cols.push(core::array::from_fn(|i| if i == 0 { 127.0 } else { i as f32 - 15.5 })); // ties at id = 1
    cols.push(core::array::from_fn(|i| if i == 7 { -127.0 } else { (i as f32 - 16.0) * 0.5 + 0.25 }));
    cols.push(ordinary(&mut rng, 3e38));
    cols.push(core::array::from_fn(|i| if i % 2 == 0 { 0.0 } else { -0.0 }));
    cols.push(core::array::from_fn(|i| if i == 3 { f32::MAX } else { f32::MIN_POSITIVE * i as f32 }));
    cols.push(ordinary(&mut rng, 40.0));
    let n = cols.len();
    // Column c: its edge block, then an ordinary one.
    let x: Vec<f32> = cols.iter().flat_map(|b| b.iter().copied().chain(ordinary(&mut rng, 3.0))).collect();
    assert_eq!(x.len(), k * n);
    for t in [DType::Q8_0, DType::Q4_0] {
        let rows = 40;
        let w = ggml_weights(t, rows, k, &mut rng);
        let want = e::matmul(&Tiled::new(t, rows, k, &w), &e::quantize_q8_0(&x));
        let mut b = Builder::new();
        let wt = b.tiled(t, rows as u32, k as u32, &w);
        let xt = b.f32s([k as u32, n as u32, 1, 1], &x);
        // The same values 4 bytes into a buffer.
        let shifted = b.buffer([0u8; 4].into_iter().chain(x.iter().flat_map(|v| v.to_le_bytes())).collect());
        let xs = b.view(DType::F32, [k as u32, n as u32, 1, 1], shifted, 4);
        let (d1, d2) = (b.zeros(DType::F32, [rows as u32, n as u32, 1, 1]), b.zeros(DType::F32, [rows as u32, n as u32, 1, 1]));
        let (q1, q2) = (b.zeros(DType::Q8_0, [k as u32, n as u32, 1, 1]), b.zeros(DType::Q8_0, [k as u32, n as u32, 1, 1]));
        b.op(OpKind::MatMul, [Some(wt), Some(xt), None], d1);
        b.op(OpKind::MatMul, [Some(wt), Some(xs), None], d2);
        b.op(OpKind::Quantize, [Some(xt), None, None], q1);
        b.op(OpKind::Quantize, [Some(xs), None, None], q2);
        let bufs = b.run().unwrap();
        assert_same_bytes(b.tensor_bytes(&bufs, q1), &e::quantize_q8_0(&x), "Quantize of the edge blocks");
        assert_same_bytes(b.tensor_bytes(&bufs, q2), &e::quantize_q8_0(&x), "Quantize of the edge blocks, 4-byte aligned");
        assert_same_f32(&b.f32_of(&bufs, d1), &want, &format!("{t:?}: F32 columns with edge blocks"));
        assert_same_f32(&b.f32_of(&bufs, d2), &want, &format!("{t:?}: the same columns, 4-byte aligned"));
    }
}

/// A llama-style decoder layer for two tokens at positions 6 and 7, as one batch of 22
/// ops: embedding rows (Q8_0 GetRows), RMSNorm·w, Q8_0 quantization, Q/K/V products
/// (Q4_0, IQ4_NL, Q8_0), RoPE of Q and K (angles computed on the DSP), Copy of K and V
/// into position-major F16 caches, GQA attention over the caches, quantization, output
/// product (Q4_0), residual add, RMSNorm·w, quantization, gate/up products (IQ4_NL,
/// Q8_0), SwiGLU, quantization, down product (Q4_0), residual add; against the same
/// chain of keel-core calls on the host (`llama::run`): every intermediate, the caches
/// and the output equal bit for bit (max |Δ| = 0).
#[test]
fn a_whole_decoder_layer_equals_keel_core() {
    let mut rng = Rng(0x1a7e5);
    let l = Layer::random(&mut rng);
    let (tokens, pos0) = ([13i32, 2], 6usize);
    let (dim, qd, kd, hd, ffn, nt) = (l.dim, l.q_dim(), l.kv_dim(), l.head_dim, l.ffn, tokens.len());
    let kcache: Vec<f16> = rng.vec(l.n_ctx * kd, 1.0).into_iter().map(f16::from_f32).collect();
    let vcache: Vec<f16> = rng.vec(l.n_ctx * kd, 1.0).into_iter().map(f16::from_f32).collect();

    let mut b = Builder::new();
    let u = |n: usize| n as u32;
    let eb = b.buffer(l.embd.clone());
    let et = b.view(DType::Q8_0, [u(dim), u(l.vocab), 1, 1], eb, 0);
    let tiled = |b: &mut Builder, w: &(DType, Vec<u8>), rows: usize, k: usize| b.tiled(w.0, u(rows), u(k), &w.1);
    let (tq, tk, tv) = (tiled(&mut b, &l.wq, qd, dim), tiled(&mut b, &l.wk, kd, dim), tiled(&mut b, &l.wv, kd, dim));
    let (to, tg) = (tiled(&mut b, &l.wo, dim, qd), tiled(&mut b, &l.wg, ffn, dim));
    let (tu, td) = (tiled(&mut b, &l.wu, ffn, dim), tiled(&mut b, &l.wd, dim, ffn));
    let norms = b.buffer(keel_dsp_qemu_tests::f32_bytes(&[l.norm1.clone(), l.norm2.clone()].concat()));
    let (nt1, nt2) = (b.view(DType::F32, [u(dim), 1, 1, 1], norms, 0), b.view(DType::F32, [u(dim), 1, 1, 1], norms, u(4 * dim)));
    let ids = b.i32s(&tokens);
    let pos: Vec<i32> = (0..nt).map(|t| (pos0 + t) as i32).collect();
    let post = b.i32s(&pos);
    let (kb, vb) = (b.buffer(f16_bytes(&kcache)), b.buffer(f16_bytes(&vcache)));
    // Activations: one buffer, 128-byte aligned pieces; every intermediate its own.
    let ab = b.buffer(vec![0; 1 << 17]);
    let mut off = 0u32;
    let mut act = |b: &mut Builder, t: DType, ne: [u32; 4]| {
        let id = b.view(t, ne, ab, off);
        off += (TensorDesc::contiguous(t, ne, 0, 0).unwrap().end().unwrap() as u32).next_multiple_of(128);
        id
    };
    let rows = |n: usize| [u(n), u(nt), 1, 1];
    let heads = |n: usize| [u(hd), u(n), u(nt), 1];
    let x = act(&mut b, DType::F32, rows(dim));
    let h = act(&mut b, DType::F32, rows(dim));
    let hq = act(&mut b, DType::Q8_0, rows(dim));
    let q = act(&mut b, DType::F32, rows(qd));
    let k = act(&mut b, DType::F32, rows(kd));
    let v = act(&mut b, DType::F32, rows(kd));
    let q_rope = act(&mut b, DType::F32, heads(l.n_head));
    let k_rope = act(&mut b, DType::F32, heads(l.n_head_kv));
    let att = act(&mut b, DType::F32, heads(l.n_head));
    let attq = act(&mut b, DType::Q8_0, rows(qd));
    let o = act(&mut b, DType::F32, rows(dim));
    let x1 = act(&mut b, DType::F32, rows(dim));
    let h2 = act(&mut b, DType::F32, rows(dim));
    let h2q = act(&mut b, DType::Q8_0, rows(dim));
    let g = act(&mut b, DType::F32, rows(ffn));
    let up = act(&mut b, DType::F32, rows(ffn));
    let s = act(&mut b, DType::F32, rows(ffn));
    let sq = act(&mut b, DType::Q8_0, rows(ffn));
    let f = act(&mut b, DType::F32, rows(dim));
    let out = act(&mut b, DType::F32, rows(dim));
    // The same bytes in other shapes: products' [n, tokens] as heads, and back.
    let view_of = |b: &mut Builder, t: u16, ne: [u32; 4]| {
        let off = b.tensors[usize::from(t)].offset;
        b.view(DType::F32, ne, ab, off)
    };
    let (q3, k3, v3, att2) = (
        view_of(&mut b, q, heads(l.n_head)),
        view_of(&mut b, k, heads(l.n_head_kv)),
        view_of(&mut b, v, heads(l.n_head_kv)),
        view_of(&mut b, att, rows(qd)),
    );
    // The caches: these tokens' rows (what Copy writes), and positions 0 ..= pos0+nt-1
    // as [hd, n_kv, n_head_kv] for the attention.
    let row = u(2 * kd);
    let slot = |b: &mut Builder, buffer| {
        b.tensor(TensorDesc {
            dtype: DType::F16,
            layout: Layout::RowMajor,
            ne: heads(l.n_head_kv),
            nb: [2, u(2 * hd), row, row * u(nt)],
            buffer,
            offset: u(pos0) * row,
        })
    };
    let (kslot, vslot) = (slot(&mut b, kb), slot(&mut b, vb));
    let n_kv = pos0 + nt;
    let cache_view = |b: &mut Builder, buffer| {
        b.tensor(TensorDesc {
            dtype: DType::F16,
            layout: Layout::RowMajor,
            ne: [u(hd), u(n_kv), u(l.n_head_kv), 1],
            nb: [2, row, u(2 * hd), row * u(l.n_ctx)],
            buffer,
            offset: 0,
        })
    };
    let (kview, vview) = (cache_view(&mut b, kb), cache_view(&mut b, vb));
    let rope = OpKind::Rope { n_dims: hd as u16, mode: 0, freq_base: l.base };
    let attn = OpKind::Attention { n_head: l.n_head as u16, n_head_kv: l.n_head_kv as u16, scale: l.scale(), window: 0 };
    for (kind, src, dst) in [
        (OpKind::GetRows, [Some(et), Some(ids), None], x),
        (OpKind::RmsNorm { eps: l.eps }, [Some(x), Some(nt1), None], h),
        (OpKind::Quantize, [Some(h), None, None], hq),
        (OpKind::MatMul, [Some(tq), Some(hq), None], q),
        (OpKind::MatMul, [Some(tk), Some(hq), None], k),
        (OpKind::MatMul, [Some(tv), Some(hq), None], v),
        (rope, [Some(q3), Some(post), None], q_rope),
        (rope, [Some(k3), Some(post), None], k_rope),
        (OpKind::Copy, [Some(k_rope), None, None], kslot),
        (OpKind::Copy, [Some(v3), None, None], vslot),
        (attn, [Some(q_rope), Some(kview), Some(vview)], att),
        (OpKind::Quantize, [Some(att2), None, None], attq),
        (OpKind::MatMul, [Some(to), Some(attq), None], o),
        (OpKind::Add, [Some(x), Some(o), None], x1),
        (OpKind::RmsNorm { eps: l.eps }, [Some(x1), Some(nt2), None], h2),
        (OpKind::Quantize, [Some(h2), None, None], h2q),
        (OpKind::MatMul, [Some(tg), Some(h2q), None], g),
        (OpKind::MatMul, [Some(tu), Some(h2q), None], up),
        (OpKind::SwiGlu, [Some(g), Some(up), None], s),
        (OpKind::Quantize, [Some(s), None, None], sq),
        (OpKind::MatMul, [Some(td), Some(sq), None], f),
        (OpKind::Add, [Some(x1), Some(f), None], out),
    ] {
        b.op(kind, src, dst);
    }
    let bufs = b.run().unwrap();

    let (mut kc, mut vc) = (kcache.clone(), vcache.clone());
    let r = llama::run(&l, &tokens, pos0, &mut kc, &mut vc);
    // Every intermediate in op order, so a difference names the op that made it.
    for (what, t, want) in [
        ("GetRows (embedding)", x, &r.x),
        ("RmsNorm·w (attention norm)", h, &r.h),
        ("MatMul Q (Q4_0)", q, &r.q),
        ("MatMul K (IQ4_NL)", k, &r.k),
        ("MatMul V (Q8_0)", v, &r.v),
        ("RoPE Q", q_rope, &r.q_rope),
        ("RoPE K", k_rope, &r.k_rope),
        ("Attention", att, &r.att),
        ("MatMul output (Q4_0)", o, &r.o),
        ("Add (attention residual)", x1, &r.x1),
        ("RmsNorm·w (FFN norm)", h2, &r.h2),
        ("MatMul gate (IQ4_NL)", g, &r.g),
        ("MatMul up (Q8_0)", up, &r.up),
        ("SwiGLU", s, &r.s),
        ("MatMul down (Q4_0)", f, &r.f),
        ("Add (FFN residual): the layer output", out, &r.out),
    ] {
        assert_same_f32(&b.f32_of(&bufs, t), want, &format!("layer: {what}"));
    }
    for (what, t, want) in
        [("Quantize h", hq, &r.hq), ("Quantize attention", attq, &r.attq), ("Quantize h2", h2q, &r.h2q), ("Quantize SwiGLU", sq, &r.sq)]
    {
        assert_same_bytes(b.tensor_bytes(&bufs, t), want, &format!("layer: {what}"));
    }
    assert_same_bytes(&bufs[usize::from(kb)], &f16_bytes(&kc), "layer: K cache (these tokens' rows after RoPE, the rest untouched)");
    assert_same_bytes(&bufs[usize::from(vb)], &f16_bytes(&vc), "layer: V cache");
    assert_ne!(kc, kcache, "the host chain wrote the K rows");
    let got = b.f32_of(&bufs, out);
    let max_abs = r.out.iter().fold(0f32, |m, v| m.max(v.abs()));
    let max_delta = got.iter().zip(&r.out).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert_eq!(max_delta, 0.0, "layer output: max |Δ|");
    eprintln!("layer output: {} values, max |x| {max_abs}, max |Δ| {max_delta}", got.len());
}

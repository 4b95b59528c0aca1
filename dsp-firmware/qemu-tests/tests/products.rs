//! Products and data movement through the device's batch executor under
//! qemu-hexagon: embedding rows, activation quantization on the DSP, matrix
//! products taking those Q8_0 activations (all three weight types), all exact;
//! and one whole llama-style decoder layer as a single batch, against the
//! reference chain (tolerance stated there).

use keel_dsp_qemu_tests::batch::{bytes_f32, Builder, Failed, INVALID_ARGUMENT};
use keel_dsp_qemu_tests::layer_ref::{self as r, check_close, check_exact};
use keel_dsp_qemu_tests::reference::{self as q, ActBlock, WType, KVALUES_IQ4NL};
use keel_dsp_qemu_tests::{ggml_weights, Rng};
use keel_npu_hal::op::{DType, Layout, OpKind, TensorDesc};

fn dtype(t: WType) -> DType {
    match t {
        WType::Q8_0 => DType::Q8_0,
        WType::Q4_0 => DType::Q4_0,
        WType::IQ4NL => DType::IQ4NL,
    }
}

/// One ggml row dequantized (ggml's `dequantize_row_*`: one product per value).
fn dequant(t: WType, row: &[u8]) -> Vec<f32> {
    let mut out = Vec::new();
    for blk in row.chunks(t.block_bytes()) {
        let d = half::f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
        let v: Vec<f32> = match t {
            WType::Q8_0 => blk[2..].iter().map(|&q| (q as i8) as f32 * d).collect(),
            WType::Q4_0 => (0..32).map(|j| ((if j < 16 { blk[2 + j] & 15 } else { blk[2 + j - 16] >> 4 }) as f32 - 8.0) * d).collect(),
            WType::IQ4NL => {
                (0..32).map(|j| d * KVALUES_IQ4NL[usize::from(if j < 16 { blk[2 + j] & 15 } else { blk[2 + j - 16] >> 4 })] as f32).collect()
            }
        };
        out.extend(v);
    }
    out
}

#[test]
fn get_rows_dequantizes_every_type_exactly() {
    let mut rng = Rng(0x6e7);
    let (n, vocab) = (96usize, 11usize);
    let ids = [3i32, 0, 10, 3, 7];
    for t in [WType::Q8_0, WType::Q4_0, WType::IQ4NL] {
        let table = ggml_weights(t, vocab, n, &mut rng);
        let mut b = Builder::new();
        let tb = b.buffer(table.clone());
        let tt = b.view(dtype(t), [n as u32, vocab as u32, 1, 1], tb, 0);
        let it = b.i32s(&ids);
        let d = b.zeros(DType::F32, [n as u32, ids.len() as u32, 1, 1]);
        b.op(OpKind::GetRows, [Some(tt), Some(it), None], d);
        let bufs = b.run().unwrap();
        let rb = n / 32 * t.block_bytes();
        let want: Vec<f32> = ids.iter().flat_map(|&i| dequant(t, &table[i as usize * rb..][..rb])).collect();
        check_exact(&bytes_f32(b.tensor_bytes(&bufs, d)), &want, &format!("get_rows {t:?}"));
    }
    // F32 and F16 tables, and an index out of range.
    let vals: Vec<f32> = (0..n * vocab).map(|_| rng.f32() * 9.0).collect();
    let mut b = Builder::new();
    let tf = b.f32s([n as u32, vocab as u32, 1, 1], &vals);
    let hb = b.buffer(vals.iter().flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes()).collect());
    let th = b.view(DType::F16, [n as u32, vocab as u32, 1, 1], hb, 0);
    let it = b.i32s(&ids);
    let (d1, d2) = (b.zeros(DType::F32, [n as u32, 5, 1, 1]), b.zeros(DType::F32, [n as u32, 5, 1, 1]));
    b.op(OpKind::GetRows, [Some(tf), Some(it), None], d1);
    b.op(OpKind::GetRows, [Some(th), Some(it), None], d2);
    let bufs = b.run().unwrap();
    let want: Vec<f32> = ids.iter().flat_map(|&i| vals[i as usize * n..][..n].to_vec()).collect();
    check_exact(&bytes_f32(b.tensor_bytes(&bufs, d1)), &want, "get_rows F32");
    let want16: Vec<f32> = want.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
    check_exact(&bytes_f32(b.tensor_bytes(&bufs, d2)), &want16, "get_rows F16");
    let mut b = Builder::new();
    let tf = b.f32s([n as u32, vocab as u32, 1, 1], &vals);
    let it = b.i32s(&[1, vocab as i32]);
    let d = b.zeros(DType::F32, [n as u32, 2, 1, 1]);
    b.op(OpKind::GetRows, [Some(tf), Some(it), None], d);
    assert_eq!(b.run().unwrap_err(), Failed { op: 0, code: INVALID_ARGUMENT });
}

#[test]
fn quantize_on_the_dsp_then_products_of_q8_0_columns_are_exact() {
    let mut rng = Rng(0x9a7);
    for (t, rows, k, cols) in [(WType::Q8_0, 70usize, 192usize, 3usize), (WType::Q4_0, 33, 256, 2), (WType::IQ4NL, 100, 160, 1), (WType::IQ4NL, 300, 1024, 2)] {
        let w = ggml_weights(t, rows, k, &mut rng);
        let x: Vec<f32> = (0..k * cols).map(|i| if i % 97 == 0 { rng.f32() * 200.0 } else { rng.f32() * 3.0 }).collect();
        let mut b = Builder::new();
        let wt = b.tiled(dtype(t), rows as u32, k as u32, &w);
        let xt = b.f32s([k as u32, cols as u32, 1, 1], &x);
        let xq = b.zeros(DType::Q8_0, [k as u32, cols as u32, 1, 1]);
        let (d1, d2) = (b.zeros(DType::F32, [rows as u32, cols as u32, 1, 1]), b.zeros(DType::F32, [rows as u32, cols as u32, 1, 1]));
        b.op(OpKind::Quantize, [Some(xt), None, None], xq);
        b.op(OpKind::MatMul, [Some(wt), Some(xq), None], d1); // pre-quantized columns
        b.op(OpKind::MatMul, [Some(wt), Some(xt), None], d2); // F32 columns, quantized inside
        let bufs = b.run().unwrap();
        let acts: Vec<ActBlock> = x.chunks(32).map(q::quantize_q8_0).collect();
        let want_q: Vec<u8> = acts.iter().flat_map(|a| a.bytes()).collect();
        assert_eq!(b.tensor_bytes(&bufs, xq), &want_q[..], "Q8_0 activations {t:?}");
        let nb = k / 32;
        let want: Vec<f32> = (0..cols).flat_map(|c| q::matvec(t, &w, rows, k, &acts[c * nb..][..nb]).1).collect();
        let what = format!("{t:?} rows={rows} k={k} cols={cols}");
        check_exact(&bytes_f32(b.tensor_bytes(&bufs, d1)), &want, &format!("{what}, Q8_0 columns"));
        check_exact(&bytes_f32(b.tensor_bytes(&bufs, d2)), &want, &format!("{what}, F32 columns"));
    }
}

/// Weights with modest scales, so activations stay O(1) through a layer.
fn small_weights(t: WType, rows: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let mut w = ggml_weights(t, rows, k, rng);
    for blk in w.chunks_mut(t.block_bytes()) {
        let d = (0.01 + 0.02 * (rng.f32() + 1.0) / 2.0) / if t == WType::Q8_0 { 16.0 } else { 2.0 };
        blk[..2].copy_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
    }
    w
}

/// A llama-style decoder layer for one token at position `pos`, as one batch
/// of 20 ops (embedding row, RMSNorm·w, Q8_0 quantization, Q/K/V products with
/// K and V written straight into position-major F32 caches, RoPE of Q and K,
/// GQA attention over the caches, output product, residual add, RMSNorm·w,
/// gate/up products, SwiGLU, down product, residual add), against the
/// reference chain. Tolerance: |Δ| ≤ 2e-3·max|x| on the layer output (the
/// attention and SiLU are not bit-exact, and a one-unit change in a Q8_0
/// activation code moves the products by about one quantization step).
#[test]
fn a_whole_decoder_layer_runs_as_one_batch() {
    let mut rng = Rng(0x1a7e5);
    let (dim, n_head, n_head_kv, hd, ffn, vocab, n_ctx, pos) = (128usize, 4usize, 2usize, 32usize, 256usize, 20usize, 16usize, 6usize);
    let (qd, kd) = (n_head * hd, n_head_kv * hd);
    let (eps, base, token) = (1e-5f32, 10000f32, 13i32);
    let embd = small_weights(WType::Q8_0, vocab, dim, &mut rng);
    let wq = small_weights(WType::Q4_0, qd, dim, &mut rng);
    let wk = small_weights(WType::IQ4NL, kd, dim, &mut rng);
    let wv = small_weights(WType::Q8_0, kd, dim, &mut rng);
    let wo = small_weights(WType::Q4_0, dim, qd, &mut rng);
    let wg = small_weights(WType::IQ4NL, ffn, dim, &mut rng);
    let wu = small_weights(WType::Q8_0, ffn, dim, &mut rng);
    let wd = small_weights(WType::Q4_0, dim, ffn, &mut rng);
    let (n1, n2): (Vec<f32>, Vec<f32>) = ((0..dim).map(|_| 1.0 + 0.3 * rng.f32()).collect(), (0..dim).map(|_| 1.0 + 0.3 * rng.f32()).collect());
    let mut kcache: Vec<f32> = (0..n_ctx * kd).map(|_| rng.f32()).collect();
    let mut vcache: Vec<f32> = (0..n_ctx * kd).map(|_| rng.f32()).collect();
    let cs = r::rope_angles(pos as i32, base, hd);

    let mut b = Builder::new();
    let u = |n: usize| n as u32;
    let eb = b.buffer(embd.clone());
    let et = b.view(DType::Q8_0, [u(dim), u(vocab), 1, 1], eb, 0);
    let (tq, tk, tv) = (b.tiled(DType::Q4_0, u(qd), u(dim), &wq), b.tiled(DType::IQ4NL, u(kd), u(dim), &wk), b.tiled(DType::Q8_0, u(kd), u(dim), &wv));
    let (to, tg) = (b.tiled(DType::Q4_0, u(dim), u(qd), &wo), b.tiled(DType::IQ4NL, u(ffn), u(dim), &wg));
    let (tu, td) = (b.tiled(DType::Q8_0, u(ffn), u(dim), &wu), b.tiled(DType::Q4_0, u(dim), u(ffn), &wd));
    let nt1 = b.f32s([u(dim), 1, 1, 1], &n1);
    let nt2 = b.f32s([u(dim), 1, 1, 1], &n2);
    let ids = b.i32s(&[token]);
    let post = b.i32s(&[pos as i32]);
    let cst = b.f32s([u(hd), 1, 1, 1], &cs);
    let kb = b.buffer(keel_dsp_qemu_tests::batch::f32_bytes(&kcache));
    let vb = b.buffer(keel_dsp_qemu_tests::batch::f32_bytes(&vcache));
    // Activations: one buffer, 128-byte aligned pieces.
    let ab = b.buffer(vec![0; 1 << 16]);
    let mut off = 0u32;
    let mut act = |b: &mut Builder, t: DType, ne: [u32; 4]| {
        let id = b.view(t, ne, ab, off);
        off += (TensorDesc::contiguous(t, ne, 0, 0).unwrap().end().unwrap() as u32).next_multiple_of(128);
        id
    };
    let x = act(&mut b, DType::F32, [u(dim), 1, 1, 1]);
    let h = act(&mut b, DType::F32, [u(dim), 1, 1, 1]);
    let hq = act(&mut b, DType::Q8_0, [u(dim), 1, 1, 1]);
    let q = act(&mut b, DType::F32, [u(qd), 1, 1, 1]);
    let q3 = b.view(DType::F32, [u(hd), u(n_head), 1, 1], ab, b.tensors[usize::from(q)].offset);
    let att3 = act(&mut b, DType::F32, [u(hd), u(n_head), 1, 1]);
    let att = b.view(DType::F32, [u(qd), 1, 1, 1], ab, b.tensors[usize::from(att3)].offset);
    let attq = act(&mut b, DType::Q8_0, [u(qd), 1, 1, 1]);
    let o = act(&mut b, DType::F32, [u(dim), 1, 1, 1]);
    let h2 = act(&mut b, DType::F32, [u(dim), 1, 1, 1]);
    let h2q = act(&mut b, DType::Q8_0, [u(dim), 1, 1, 1]);
    let g = act(&mut b, DType::F32, [u(ffn), 1, 1, 1]);
    let up = act(&mut b, DType::F32, [u(ffn), 1, 1, 1]);
    let gq = act(&mut b, DType::Q8_0, [u(ffn), 1, 1, 1]);
    let f = act(&mut b, DType::F32, [u(dim), 1, 1, 1]);
    // Cache views: this position's row (what the K/V products write), and the
    // first pos+1 positions as [hd, n_kv, n_head_kv] for the attention.
    let row = u(kd * 4);
    let kslot = b.view(DType::F32, [u(kd), 1, 1, 1], kb, u(pos) * row);
    let k3 = b.view(DType::F32, [u(hd), u(n_head_kv), 1, 1], kb, u(pos) * row);
    let vslot = b.view(DType::F32, [u(kd), 1, 1, 1], vb, u(pos) * row);
    let cache_view = |buf| TensorDesc {
        dtype: DType::F32,
        layout: Layout::RowMajor,
        ne: [u(hd), u(pos + 1), u(n_head_kv), 1],
        nb: [4, row, u(hd * 4), row * u(n_ctx)],
        buffer: buf,
        offset: 0,
    };
    let (kview, vview) = (b.tensor(cache_view(kb)), b.tensor(cache_view(vb)));
    let scale = 1.0 / (hd as f32).sqrt();
    let rope = OpKind::Rope { n_dims: hd as u16, mode: 0, freq_base: base };
    for (kind, src, dst) in [
        (OpKind::GetRows, [Some(et), Some(ids), None], x),
        (OpKind::RmsNorm { eps }, [Some(x), Some(nt1), None], h),
        (OpKind::Quantize, [Some(h), None, None], hq),
        (OpKind::MatMul, [Some(tq), Some(hq), None], q),
        (OpKind::MatMul, [Some(tk), Some(hq), None], kslot),
        (OpKind::MatMul, [Some(tv), Some(hq), None], vslot),
        (rope, [Some(q3), Some(post), Some(cst)], q3),
        (rope, [Some(k3), Some(post), Some(cst)], k3),
        (OpKind::Attention { n_head: n_head as u16, n_head_kv: n_head_kv as u16, scale }, [Some(q3), Some(kview), Some(vview)], att3),
        (OpKind::Quantize, [Some(att), None, None], attq),
        (OpKind::MatMul, [Some(to), Some(attq), None], o),
        (OpKind::Add, [Some(x), Some(o), None], x),
        (OpKind::RmsNorm { eps }, [Some(x), Some(nt2), None], h2),
        (OpKind::Quantize, [Some(h2), None, None], h2q),
        (OpKind::MatMul, [Some(tg), Some(h2q), None], g),
        (OpKind::MatMul, [Some(tu), Some(h2q), None], up),
        (OpKind::SwiGlu, [Some(g), Some(up), None], g),
        (OpKind::Quantize, [Some(g), None, None], gq),
        (OpKind::MatMul, [Some(td), Some(gq), None], f),
        (OpKind::Add, [Some(x), Some(f), None], x),
    ] {
        b.op(kind, src, dst);
    }
    let bufs = b.run().unwrap();

    // The reference chain.
    let rb = dim / 32 * 34;
    let mut xr = dequant(WType::Q8_0, &embd[token as usize * rb..][..rb]);
    let quant = |v: &[f32]| -> Vec<ActBlock> { v.chunks(32).map(q::quantize_q8_0).collect() };
    let hq_r = quant(&r::rms_norm(&xr, Some(&n1), eps));
    let mut q_r = q::matvec(WType::Q4_0, &wq, qd, dim, &hq_r).1;
    let mut k_r = q::matvec(WType::IQ4NL, &wk, kd, dim, &hq_r).1;
    let v_r = q::matvec(WType::Q8_0, &wv, kd, dim, &hq_r).1;
    q_r.chunks_mut(hd).for_each(|hh| r::rope_head(hh, &cs, false));
    k_r.chunks_mut(hd).for_each(|hh| r::rope_head(hh, &cs, false));
    kcache[pos * kd..][..kd].copy_from_slice(&k_r);
    vcache[pos * kd..][..kd].copy_from_slice(&v_r);
    let at = |c: &[f32], j: usize, hk: usize, i: usize| c[j * kd + hk * hd + i];
    let mut att_r = Vec::new();
    for hh in 0..n_head {
        let hk = hh / (n_head / n_head_kv);
        att_r.extend(r::attend(&q_r[hh * hd..][..hd], |j, i| at(&kcache, j, hk, i), |j, i| at(&vcache, j, hk, i), pos + 1, scale));
    }
    let o_r = q::matvec(WType::Q4_0, &wo, dim, qd, &quant(&att_r)).1;
    xr.iter_mut().zip(&o_r).for_each(|(a, b)| *a += b);
    let h2q_r = quant(&r::rms_norm(&xr, Some(&n2), eps));
    let g_r = q::matvec(WType::IQ4NL, &wg, ffn, dim, &h2q_r).1;
    let u_r = q::matvec(WType::Q8_0, &wu, ffn, dim, &h2q_r).1;
    let s_r: Vec<f32> = g_r.iter().zip(&u_r).map(|(&g, &u)| r::silu(g) * u).collect();
    let f_r = q::matvec(WType::Q4_0, &wd, dim, ffn, &quant(&s_r)).1;
    xr.iter_mut().zip(&f_r).for_each(|(a, b)| *a += b);

    // The caches got this position's K (after RoPE) and V; other rows untouched.
    let kc = bytes_f32(&bufs[usize::from(kb)]);
    check_close(&kc[pos * kd..][..kd], &k_r, 0.0, 1e-6, "K cache row");
    assert_eq!(&kc[..pos * kd], &kcache[..pos * kd], "earlier K rows untouched");
    check_exact(&bytes_f32(&bufs[usize::from(vb)])[pos * kd..][..kd], &v_r, "V cache row");
    let got = bytes_f32(b.tensor_bytes(&bufs, x));
    let max = xr.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = check_close(&got, &xr, 0.0, 2e-3 * max, "layer output");
    let dev = got.iter().zip(&xr).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    eprintln!("layer output: max |x| {max}, max |Δ| {dev:e} ({worst} of the bound)");
}

//! The ops of the qwen2, qwen3, gemma3 and qwen35 blocks beyond llama's, run by the
//! device's batch executor (`CMD_BATCH`) under qemu-hexagon, against the CPU
//! session's own keel-core calls on the host, bit for bit:
//!
//! - new ops: `Scale`, `Sigmoid`, `Softplus`, `L2Norm`, `SsmConv` and
//!   `GatedDeltaRule` (with their states resident in device buffers and updated in
//!   place over several ops; token by token and chunked), `Attention` with a sliding
//!   window (against the CPU's ring cache, with poisoned keys before the window);
//! - existing ops proven to give the CPU's bits for block parts: biases (`Add` of a
//!   broadcast row), per-head q/k norms (`RmsNorm` over a `[head_dim, heads·n]` view),
//!   the `[q | gate]` split (strided `Copy`), the attention output gate (`Sigmoid` +
//!   `Mul` = `ops::mul_sigmoid`), the delta-net gates (`Sigmoid`, `Add`, `Softplus`,
//!   `Mul` = `delta_net::gates`), the gated norm (`RmsNorm`·w then `SwiGlu(z, o)` =
//!   `delta_net::gated_norm`);
//! - bad requests: overlapping states, in-place where the op cannot, bad shapes,
//!   too little scratch.

use half::f16;
use keel_dsp_qemu_tests::batch::{Builder, Failed, INVALID_ARGUMENT, OUT_OF_MEMORY, UNSUPPORTED};
use keel_dsp_qemu_tests::expect::{self as e, Attn, Cache, Delta};
use keel_dsp_qemu_tests::{assert_same_bytes, assert_same_f32, every_f16, f16_bytes, f32_bytes, wide_values, Rng};
use keel_npu_hal::op::{DType, Layout, OpKind, TensorDesc};

/// A row-major F32 view of buffer `buffer` with explicit strides (bytes).
fn f32_view(ne: [u32; 4], nb: [u32; 4], buffer: u16, offset: u32) -> TensorDesc {
    TensorDesc { dtype: DType::F32, layout: Layout::RowMajor, ne, nb, buffer, offset }
}

#[test]
fn scale_sigmoid_softplus_equal_keel_core_on_a_large_set() {
    let mut rng = Rng(0x5c1e);
    let mut x = every_f16();
    x.extend(wide_values(&mut rng, 65_536));
    let ne = [512, (x.len() / 512) as u32, 1, 1];
    let mut b = Builder::new();
    let xt = b.f32s(ne, &x);
    let outs: Vec<u16> = (0..4).map(|_| b.zeros(DType::F32, ne)).collect();
    let small = [64, 16, 1, 1];
    let (x2, x3, x4) = (b.f32s(small, &x[..1024]), b.f32s(small, &x[..1024]), b.f32s(small, &x[..1024]));
    let gemma = 640f32.sqrt();
    b.op(OpKind::Scale { s: gemma }, [Some(xt), None, None], outs[0]);
    b.op(OpKind::Scale { s: 0.0625 }, [Some(xt), None, None], outs[1]);
    b.op(OpKind::Sigmoid, [Some(xt), None, None], outs[2]);
    b.op(OpKind::Softplus, [Some(xt), None, None], outs[3]);
    b.op(OpKind::Scale { s: -3.5 }, [Some(x2), None, None], x2); // in place
    b.op(OpKind::Sigmoid, [Some(x3), None, None], x3);
    b.op(OpKind::Softplus, [Some(x4), None, None], x4);
    let bufs = b.run().unwrap();
    assert_same_f32(&b.f32_of(&bufs, outs[0]), &e::scale(&x, gemma), "scale by sqrt(640)");
    assert_same_f32(&b.f32_of(&bufs, outs[1]), &e::scale(&x, 0.0625), "scale by 1/16");
    assert_same_f32(&b.f32_of(&bufs, outs[2]), &e::each_sigmoid(&x), "sigmoid");
    assert_same_f32(&b.f32_of(&bufs, outs[3]), &e::each_softplus(&x), "softplus");
    assert_same_f32(&b.f32_of(&bufs, x2), &e::scale(&x[..1024], -3.5), "scale in place");
    assert_same_f32(&b.f32_of(&bufs, x3), &e::each_sigmoid(&x[..1024]), "sigmoid in place");
    assert_same_f32(&b.f32_of(&bufs, x4), &e::each_softplus(&x[..1024]), "softplus in place");
}

#[test]
fn l2_norm_of_rows_and_of_the_q_k_heads_inside_a_conv_output() {
    let mut rng = Rng(0x12a0);
    let (d, nk, nv, n) = (32usize, 2usize, 4usize, 3usize);
    let row = (2 * nk + nv) * d + 8; // the conv output's floats per token, with slack
    let conv: Vec<f32> = rng.vec(row * n, 3.0);
    let plain = rng.vec(64 * 5, 10.0);
    let mut b = Builder::new();
    let cb = b.buffer(f32_bytes(&conv));
    // The q and k heads of every token: [d, 2·nk, n] with the token stride of the rows.
    let qk = b.tensor(f32_view([d as u32, 2 * nk as u32, n as u32, 1], [4, 4 * d as u32, 4 * row as u32, 4 * (row * n) as u32], cb, 0));
    let pt = b.f32s([64, 5, 1, 1], &plain);
    let pd = b.zeros(DType::F32, [64, 5, 1, 1]);
    let qk_out = b.zeros(DType::F32, [d as u32, 2 * nk as u32, n as u32, 1]);
    let eps = 1e-6;
    b.op(OpKind::L2Norm { eps }, [Some(qk), None, None], qk_out); // strided source, contiguous dst
    b.op(OpKind::L2Norm { eps }, [Some(qk), None, None], qk); // in place over the view
    b.op(OpKind::L2Norm { eps }, [Some(pt), None, None], pd);
    let bufs = b.run().unwrap();
    let heads: Vec<f32> = conv.chunks_exact(row).flat_map(|r| r[..2 * nk * d].to_vec()).collect();
    let want_heads = e::l2_norm_rows(&heads, d, 1e-6);
    assert_same_f32(&b.f32_of(&bufs, qk_out), &want_heads, "l2 norm of the q/k heads into a contiguous dst");
    let got = keel_dsp_qemu_tests::bytes_f32(&bufs[usize::from(cb)]);
    for t in 0..n {
        let r = &got[t * row..(t + 1) * row];
        assert_same_f32(&r[..2 * nk * d], &want_heads[t * 2 * nk * d..(t + 1) * 2 * nk * d], &format!("l2 norm in place, token {t}"));
        assert_same_f32(&r[2 * nk * d..], &conv[t * row + 2 * nk * d..(t + 1) * row], &format!("v heads and slack untouched, token {t}"));
    }
    assert_same_f32(&b.f32_of(&bufs, pd), &e::l2_norm_rows(&plain, 64, 1e-6), "l2 norm of plain rows");

    // A destination overlapping its source without being it.
    let mut b = Builder::new();
    let buf = b.buffer(vec![0; 4 * 192]);
    let x = b.view(DType::F32, [64, 2, 1, 1], buf, 0);
    let shifted = b.view(DType::F32, [64, 2, 1, 1], buf, 4 * 32);
    b.op(OpKind::L2Norm { eps: 1e-6 }, [Some(x), None, None], shifted);
    assert_eq!(b.run().unwrap_err(), Failed { op: 0, code: INVALID_ARGUMENT });
}

/// K/V caches position-major (`[n_ctx][n_head_kv][head_dim]`) as `[head_dim, n_kv, n_head_kv]` views.
fn cache_view(head_dim: u32, n_kv: u32, n_head_kv: u32, n_ctx: u32, buffer: u16) -> TensorDesc {
    TensorDesc {
        dtype: DType::F16,
        layout: Layout::RowMajor,
        ne: [head_dim, n_kv, n_head_kv, 1],
        nb: [2, 2 * head_dim * n_head_kv, 2 * head_dim, 2 * head_dim * n_head_kv * n_ctx],
        buffer,
        offset: 0,
    }
}

/// The device keeps every position; the CPU a ring of `window + n_batch − 1` rows. Keys
/// before the window are in the device's cache, poisoned (NaN, ±∞, huge): any use of
/// them would show.
#[test]
fn sliding_window_attention_over_a_full_cache_equals_the_cpus_ring_cache() {
    let mut rng = Rng(0x5a1d);
    for (head_dim, n_head, n_head_kv, n_kv, n_tokens, window) in [
        (64u32, 4u32, 2u32, 40u32, 1u32, 8usize),
        (32, 4, 4, 100, 5, 8),
        (64, 8, 2, 200, 3, 64),
        (16, 2, 1, 70, 70, 16), // a whole prompt: the first tokens see fewer than window keys
        (32, 2, 2, 9, 2, 1),
        (32, 2, 1, 30, 4, 64), // a window wider than the context: no effect
    ] {
        let n_ctx = n_kv + 2;
        let (hd, nh, nkv, nt) = (head_dim as usize, n_head as usize, n_head_kv as usize, n_tokens as usize);
        let stride = nkv * hd;
        let poison = [f16::NAN, f16::INFINITY, f16::NEG_INFINITY, f16::MAX, f16::MIN];
        let cache_vals = |rng: &mut Rng| -> Vec<f16> {
            let mut c: Vec<f16> = rng.vec(n_ctx as usize * stride, 1.5).into_iter().map(f16::from_f32).collect();
            // Positions no query of this batch sees (before the first query's window).
            let first_seen = (n_kv as usize - nt + 1).saturating_sub(window);
            for (i, v) in c[..first_seen * stride].iter_mut().enumerate() {
                *v = poison[i % poison.len()];
            }
            c
        };
        let (kv, vv) = (cache_vals(&mut rng), cache_vals(&mut rng));
        let q = rng.vec(hd * nh * nt, 1.0);
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut b = Builder::new();
        let qne = [head_dim, n_head, n_tokens, 1];
        let (qt, q2) = (b.f32s(qne, &q), b.f32s(qne, &q));
        let (kb, vb) = (b.buffer(f16_bytes(&kv)), b.buffer(f16_bytes(&vv)));
        let (kt, vt) = (b.tensor(cache_view(head_dim, n_kv, n_head_kv, n_ctx, kb)), b.tensor(cache_view(head_dim, n_kv, n_head_kv, n_ctx, vb)));
        let d = b.zeros(DType::F32, qne);
        let kind = OpKind::Attention { n_head: n_head as u16, n_head_kv: n_head_kv as u16, scale, window: window as u32 };
        b.op(kind, [Some(qt), Some(kt), Some(vt)], d);
        b.op(kind, [Some(q2), Some(kt), Some(vt)], q2); // in place over Q
        let bufs = b.run().unwrap();
        let shape = Attn { head_dim: hd, n_head: nh, n_head_kv: nkv, n_tokens: nt, n_kv: n_kv as usize, scale, window };
        // The CPU's ring: window + n_batch − 1 rows (n_batch = this batch's tokens).
        let rows = (window + nt - 1).min(n_ctx as usize);
        let (kr, vr) = (e::ring_cache(&kv, stride, n_kv as usize, rows), e::ring_cache(&vv, stride, n_kv as usize, rows));
        let ring = |data| Cache { data, pos_stride: stride, head_stride: hd };
        let want = e::attention_ring(&q, shape, ring(&kr), ring(&vr), rows);
        assert!(want.iter().all(|v| v.is_finite()), "the CPU's result is finite");
        let what = format!("attention hd={head_dim} heads={n_head}/{n_head_kv} n_kv={n_kv} tokens={n_tokens} window={window}");
        assert_same_f32(&b.f32_of(&bufs, d), &want, &what);
        assert_same_f32(&b.f32_of(&bufs, q2), &want, &format!("{what}, in place"));
        assert_same_bytes(&bufs[usize::from(kb)], &f16_bytes(&kv), "K cache untouched");
    }
}

/// qwen2's q/k/v biases are `Add` of a broadcast row (the CPU's `add_bias`: one f32 add
/// per element, `ops::add_assign`'s); qwen3's per-head q/k norms are `RmsNorm` over
/// a `[head_dim, heads·n]` view with a `head_dim` weight row, equal to the CPU's
/// `ops::rms_norm_in_place` per head.
#[test]
fn biases_and_per_head_norms_are_add_and_rms_norm() {
    let mut rng = Rng(0xb1a5);
    let (hd, nh, n) = (64usize, 6usize, 3usize);
    let x = rng.vec(hd * nh * n, 8.0);
    let bias = rng.vec(hd * nh, 2.0);
    let w = rng.vec(hd, 1.5);
    let mut b = Builder::new();
    let xt = b.f32s([(hd * nh) as u32, n as u32, 1, 1], &x);
    let bt = b.f32s([(hd * nh) as u32, 1, 1, 1], &bias);
    let wt = b.f32s([hd as u32, 1, 1, 1], &w);
    let heads = b.view(DType::F32, [hd as u32, (nh * n) as u32, 1, 1], b.tensors[usize::from(xt)].buffer, 0);
    let biased = b.zeros(DType::F32, [(hd * nh) as u32, n as u32, 1, 1]);
    b.op(OpKind::Add, [Some(xt), Some(bt), None], biased);
    b.op(OpKind::RmsNorm { eps: 1e-6 }, [Some(heads), Some(wt), None], heads); // in place
    let bufs = b.run().unwrap();
    assert_same_f32(&b.f32_of(&bufs, biased), &e::add(&x, &bias), "bias add");
    assert_same_f32(&b.f32_of(&bufs, xt), &e::head_norm(&x, hd, &w, 1e-6), "per-head RMSNorm vs the CPU's rms_norm_in_place per head");
}

/// qwen35's gated attention: the projection's rows are `[q | gate]` per head; a strided
/// `Copy` splits them (the CPU moves them), and the output gate `o · sigmoid(gate)` is
/// `Sigmoid` on the gate then `Mul`, equal to the CPU's `ops::mul_sigmoid`.
#[test]
fn gated_attention_split_and_output_gate_are_copy_sigmoid_mul() {
    let mut rng = Rng(0x9a7e);
    let (hd, nh, n) = (32usize, 4usize, 3usize);
    let qd = hd * nh;
    let proj: Vec<f32> = wide_values(&mut rng, 2 * qd * n).into_iter().map(|v| if rng.u32() % 4 == 0 { v } else { rng.f32() * 12.0 }).collect();
    let o = rng.vec(qd * n, 4.0);
    let mut b = Builder::new();
    let pb = b.buffer(f32_bytes(&proj));
    let (u, rowb) = (|v: usize| v as u32, 4 * 2 * qd as u32);
    let nb = [4, 4 * 2 * hd as u32, rowb, rowb * n as u32];
    let q_src = b.tensor(f32_view([u(hd), u(nh), u(n), 1], nb, pb, 0));
    let g_src = b.tensor(f32_view([u(hd), u(nh), u(n), 1], nb, pb, 4 * hd as u32));
    let (qt, gt) = (b.zeros(DType::F32, [u(hd), u(nh), u(n), 1]), b.zeros(DType::F32, [u(hd), u(nh), u(n), 1]));
    let ot = b.f32s([u(qd), u(n), 1, 1], &o);
    let gflat = b.view(DType::F32, [u(qd), u(n), 1, 1], b.tensors[usize::from(gt)].buffer, 0);
    b.op(OpKind::Copy, [Some(q_src), None, None], qt);
    b.op(OpKind::Copy, [Some(g_src), None, None], gt);
    b.op(OpKind::Sigmoid, [Some(gflat), None, None], gflat);
    b.op(OpKind::Mul, [Some(ot), Some(gflat), None], ot);
    let bufs = b.run().unwrap();
    // The CPU's split (block_cpu.rs split_query_gate): per token and head, q then gate.
    let (mut q, mut gate) = (Vec::new(), Vec::new());
    for r in proj.chunks_exact(2 * hd) {
        q.extend_from_slice(&r[..hd]);
        gate.extend_from_slice(&r[hd..]);
    }
    assert_same_f32(&b.f32_of(&bufs, qt), &q, "q rows out of [q | gate]");
    assert_same_f32(&b.f32_of(&bufs, ot), &e::mul_sigmoid(&o, &gate), "o · sigmoid(gate) vs ops::mul_sigmoid");
}

/// The delta-net gates `beta = sigmoid(b)`, `g = softplus(alpha + dt_bias)·a` are
/// `Sigmoid`, `Add` (a broadcast row), `Softplus`, `Mul` (a broadcast row) over the
/// planes of the `[n_v_heads, n, 2]` gates tensor `GatedDeltaRule` reads: equal to the
/// CPU's `delta_net::gates`.
#[test]
fn delta_net_gates_are_sigmoid_add_softplus_mul() {
    let mut rng = Rng(0x6a7e);
    let (nv, n) = (16usize, 40usize);
    let wide = |rng: &mut Rng| -> Vec<f32> { wide_values(rng, nv * n).into_iter().map(|v| if rng.u32() % 3 == 0 { v } else { rng.f32() * 30.0 }).collect() };
    let (beta, alpha) = (wide(&mut rng), wide(&mut rng));
    let dt = rng.vec(nv, 3.0);
    let a: Vec<f32> = rng.vec(nv, 8.0);
    let mut b = Builder::new();
    let gb = b.buffer(f32_bytes(&[beta.clone(), alpha.clone()].concat()));
    let plane = |b: &mut Builder, i: u32| b.view(DType::F32, [nv as u32, n as u32, 1, 1], gb, i * 4 * (nv * n) as u32);
    let (bt, at) = (plane(&mut b, 0), plane(&mut b, 1));
    let (dtt, aat) = (b.f32s([nv as u32, 1, 1, 1], &dt), b.f32s([nv as u32, 1, 1, 1], &a));
    b.op(OpKind::Sigmoid, [Some(bt), None, None], bt);
    b.op(OpKind::Add, [Some(at), Some(dtt), None], at);
    b.op(OpKind::Softplus, [Some(at), None, None], at);
    b.op(OpKind::Mul, [Some(at), Some(aat), None], at);
    let bufs = b.run().unwrap();
    let (want_b, want_g) = e::gates(&beta, &alpha, &dt, &a, nv);
    assert_same_f32(&b.f32_of(&bufs, bt), &want_b, "beta vs delta_net::gates");
    assert_same_f32(&b.f32_of(&bufs, at), &want_g, "g vs delta_net::gates");
}

/// The gated norm `rms_norm(o)·w·silu(z)` is `RmsNorm`·w over `[d, heads·n]` then
/// `SwiGlu(z, o)` (`silu(z)·o`: the product commutes): equal to the CPU's
/// `delta_net::gated_norm`, z of every kind.
#[test]
fn gated_norm_is_rms_norm_then_swiglu() {
    let mut rng = Rng(0x9a0e);
    let (d, nv, n) = (128usize, 4usize, 64usize);
    let len = d * nv * n;
    let o = rng.vec(len, 5.0);
    let z = wide_values(&mut rng, len);
    let w = rng.vec(d, 2.0);
    let mut b = Builder::new();
    let ot = b.f32s([d as u32, (nv * n) as u32, 1, 1], &o);
    let zt = b.f32s([d as u32, (nv * n) as u32, 1, 1], &z);
    let wt = b.f32s([d as u32, 1, 1, 1], &w);
    b.op(OpKind::RmsNorm { eps: 1e-6 }, [Some(ot), Some(wt), None], ot);
    b.op(OpKind::SwiGlu, [Some(zt), Some(ot), None], zt);
    let bufs = b.run().unwrap();
    assert_same_f32(&b.f32_of(&bufs, zt), &e::gated_norm(&o, &z, d, &w, 1e-6), "RmsNorm·w + SwiGlu(z, o) vs delta_net::gated_norm");
}

#[test]
fn ssm_conv_over_several_batches_carries_its_state_on_the_device() {
    let mut rng = Rng(0xc0a7);
    for (ch, kc) in [(96usize, 4usize), (40, 2), (24, 7)] {
        let k1 = kc - 1;
        let w = rng.vec(kc * ch, 1.0);
        let state0 = rng.vec(k1 * ch, 2.0);
        let mut b = Builder::new();
        let wt = b.f32s([kc as u32, ch as u32, 1, 1], &w);
        let st = b.f32s([k1 as u32, ch as u32, 1, 1], &state0);
        let mut state = state0.clone();
        let mut checks = Vec::new();
        // Prompts and decode steps: more tokens than the state holds, one, two, fewer.
        for n in [5usize, 1, 2, 1, 9, (k1 - 1).max(1)] {
            let x = rng.vec(ch * n, 3.0);
            let xt = b.f32s([ch as u32, n as u32, 1, 1], &x);
            let d = b.zeros(DType::F32, [ch as u32, n as u32, 1, 1]);
            b.op(OpKind::SsmConv, [Some(xt), Some(wt), Some(st)], d);
            checks.push((d, e::ssm_conv(&x, ch, &w, &mut state), n));
        }
        let bufs = b.run().unwrap();
        for (i, (d, want, n)) in checks.into_iter().enumerate() {
            assert_same_f32(&b.f32_of(&bufs, d), &want, &format!("ssm_conv ch={ch} d_conv={kc}, batch {i} of {n} tokens"));
        }
        assert_same_f32(&b.f32_of(&bufs, st), &state, &format!("ssm_conv ch={ch} d_conv={kc}: the state after every batch"));
    }

    // In place (the conv reads inputs after writing outputs), a state overlapping the
    // output, and a state of the wrong length fail.
    let (ch, kc, n) = (32u32, 4u32, 3u32);
    let mut b = Builder::new();
    let x = b.f32s([ch, n, 1, 1], &vec![0.5; (ch * n) as usize]);
    let w = b.f32s([kc, ch, 1, 1], &vec![0.25; (kc * ch) as usize]);
    let st = b.zeros(DType::F32, [kc - 1, ch, 1, 1]);
    b.op(OpKind::SsmConv, [Some(x), Some(w), Some(st)], x);
    assert_eq!(b.run().unwrap_err(), Failed { op: 0, code: INVALID_ARGUMENT });
    let mut b = Builder::new();
    let x = b.f32s([ch, n, 1, 1], &vec![0.5; (ch * n) as usize]);
    let w = b.f32s([kc, ch, 1, 1], &vec![0.25; (kc * ch) as usize]);
    let both = b.buffer(vec![0; 4 * ((kc - 1) * ch + ch * n) as usize]);
    let st = b.view(DType::F32, [kc - 1, ch, 1, 1], both, 0);
    let d = b.view(DType::F32, [ch, n, 1, 1], both, 4 * (kc - 2) * ch); // overlaps the state's tail
    b.op(OpKind::SsmConv, [Some(x), Some(w), Some(st)], d);
    assert_eq!(b.run().unwrap_err(), Failed { op: 0, code: INVALID_ARGUMENT });
    let mut b = Builder::new();
    let x = b.f32s([ch, n, 1, 1], &vec![0.5; (ch * n) as usize]);
    let w = b.f32s([kc, ch, 1, 1], &vec![0.25; (kc * ch) as usize]);
    let st = b.zeros(DType::F32, [kc, ch, 1, 1]);
    let d = b.zeros(DType::F32, [ch, n, 1, 1]);
    b.op(OpKind::SsmConv, [Some(x), Some(w), Some(st)], d);
    assert_eq!(b.run().unwrap_err(), Failed { op: 0, code: UNSUPPORTED });
}

/// Inputs of one delta-rule batch as the CPU has them: the conv output rows (`row`
/// floats per token, q and k heads L2-normalized by keel-core) and the gates.
fn delta_inputs(rng: &mut Rng, s: Delta, n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let qk = 2 * s.n_k_heads * s.d;
    let mut conv = rng.vec(s.row * n, 2.0);
    for r in conv.chunks_exact_mut(s.row) {
        let normed = e::l2_norm_rows(&r[..qk], s.d, 1e-6);
        r[..qk].copy_from_slice(&normed);
    }
    let beta: Vec<f32> = (0..s.n_v_heads * n).map(|_| (rng.f32() + 1.0) / 2.0).collect();
    let g: Vec<f32> = (0..s.n_v_heads * n).map(|_| -(rng.f32() + 1.0) * 0.6).collect();
    (conv, beta, g)
}

/// Runs batches of `ns` tokens (chunk lengths `chunks`) through `GatedDeltaRule` ops of
/// one device batch sharing one state, and the same through the CPU's calls.
fn delta_case(seed: u64, s: Delta, runs: &[(usize, usize)]) {
    let mut rng = Rng(seed);
    let (d, nk, nv, row) = (s.d as u32, s.n_k_heads as u32, s.n_v_heads as u32, s.row as u32);
    let m0 = rng.vec(s.d * s.d * s.n_v_heads, 0.2);
    let mut m = m0.clone();
    let mut b = Builder::new();
    let st = b.f32s([d, d, nv, 1], &m0);
    let mut checks = Vec::new();
    for &(n, chunk) in runs {
        let (conv, beta, g) = delta_inputs(&mut rng, s, n);
        let cb = b.buffer(f32_bytes(&conv));
        let qkv = b.tensor(f32_view([d, 2 * nk + nv, n as u32, 1], [4, 4 * d, 4 * row, 4 * row * n as u32], cb, 0));
        let gates = b.f32s([nv, n as u32, 2, 1], &[beta.clone(), g.clone()].concat());
        let o = b.zeros(DType::F32, [d, nv, n as u32, 1]);
        b.op(OpKind::GatedDeltaRule { n_k_heads: nk as u16, chunk: chunk as u16, scale: s.scale }, [Some(qkv), Some(gates), Some(st)], o);
        let want = e::delta_rule(Delta { chunk, ..s }, &conv, &beta, &g, &mut m);
        checks.push((o, want, format!("delta rule d={d} heads={nk}/{nv}: {n} tokens, chunk {chunk}")));
    }
    let bufs = b.run().unwrap();
    for (o, want, what) in checks {
        assert_same_f32(&b.f32_of(&bufs, o), &want, &what);
    }
    assert_same_f32(&b.f32_of(&bufs, st), &m, &format!("delta rule d={d} heads={nk}/{nv}: the state after {runs:?}"));
}

#[test]
fn gated_delta_rule_token_by_token_with_a_resident_state() {
    let s = Delta { d: 32, n_k_heads: 2, n_v_heads: 4, row: (2 * 2 + 4) * 32 + 8, chunk: 0, scale: 1.0 / 32f32.sqrt() };
    delta_case(0xde17a, s, &[(5, 0), (1, 0), (1, 0), (3, 0)]);
    // qwen35's head width, one k head shared by two value heads.
    let s = Delta { d: 128, n_k_heads: 1, n_v_heads: 2, row: 4 * 128, chunk: 0, scale: 1.0 / 128f32.sqrt() };
    delta_case(0xde17b, s, &[(3, 0), (1, 0)]);
}

#[test]
fn gated_delta_rule_chunked_then_token_by_token_with_a_resident_state() {
    // A prompt over a full chunk of 64 and a partial one, then decoding from its state.
    let s = Delta { d: 32, n_k_heads: 1, n_v_heads: 2, row: 4 * 32 + 4, chunk: 0, scale: 1.0 / 32f32.sqrt() };
    delta_case(0xc4a1, s, &[(70, 64), (1, 0), (2, 0)]);
    // Chunks of 7 over 20 tokens (three full, one partial), twice, GQA by modulo.
    let s = Delta { d: 16, n_k_heads: 2, n_v_heads: 6, row: 10 * 16, chunk: 0, scale: 0.25 };
    delta_case(0xc4a2, s, &[(20, 7), (20, 7), (1, 0)]);
    // qwen35's head width: a chunk longer than the prompt (one chunk of all tokens).
    let s = Delta { d: 128, n_k_heads: 1, n_v_heads: 1, row: 3 * 128, chunk: 0, scale: 1.0 / 128f32.sqrt() };
    delta_case(0xc4a3, s, &[(9, 64), (1, 0)]);
}

#[test]
fn gated_delta_rule_bad_requests_fail() {
    let (d, nk, nv, n) = (16u32, 1u32, 2u32, 3u32);
    let kind = |chunk| OpKind::GatedDeltaRule { n_k_heads: nk as u16, chunk, scale: 0.25 };
    let setup = |b: &mut Builder| {
        let qkv = b.f32s([d, 2 * nk + nv, n, 1], &vec![0.1; (d * (2 * nk + nv) * n) as usize]);
        let g = b.f32s([nv, n, 2, 1], &vec![-0.5; (nv * n * 2) as usize]);
        let st = b.zeros(DType::F32, [d, d, nv, 1]);
        (qkv, g, st)
    };
    // The output over the q/k/v rows (the rule reads them after writing).
    let mut b = Builder::new();
    let (qkv, g, st) = setup(&mut b);
    let over = b.view(DType::F32, [d, nv, n, 1], b.tensors[usize::from(qkv)].buffer, 0);
    b.op(kind(0), [Some(qkv), Some(g), Some(st)], over);
    assert_eq!(b.run().unwrap_err(), Failed { op: 0, code: INVALID_ARGUMENT });
    // The state overlapping the gates.
    let mut b = Builder::new();
    let (qkv, _, _) = setup(&mut b);
    let big = b.buffer(vec![0; 4 * (d * d * nv) as usize]);
    let st = b.view(DType::F32, [d, d, nv, 1], big, 0);
    let g2 = b.view(DType::F32, [nv, n, 2, 1], big, 4 * d);
    let o = b.zeros(DType::F32, [d, nv, n, 1]);
    b.op(kind(0), [Some(qkv), Some(g2), Some(st)], o);
    assert_eq!(b.run().unwrap_err(), Failed { op: 0, code: INVALID_ARGUMENT });
    // Gates with one plane; a state for other heads.
    let mut b = Builder::new();
    let (qkv, _, st) = setup(&mut b);
    let g1 = b.zeros(DType::F32, [nv, n, 1, 1]);
    let o = b.zeros(DType::F32, [d, nv, n, 1]);
    b.op(kind(0), [Some(qkv), Some(g1), Some(st)], o);
    assert_eq!(b.run().unwrap_err(), Failed { op: 0, code: UNSUPPORTED });
    let mut b = Builder::new();
    let (qkv, g, _) = setup(&mut b);
    let st = b.zeros(DType::F32, [d, d, nv + 1, 1]);
    let o = b.zeros(DType::F32, [d, nv, n, 1]);
    b.op(kind(0), [Some(qkv), Some(g), Some(st)], o);
    assert_eq!(b.run().unwrap_err(), Failed { op: 0, code: UNSUPPORTED });
    // Too little scratch for a chunk's work: a chunk of 300 tokens of 16 needs
    // (300² + 300·16 + 300)·4 bytes, about 380 KB; 64 KiB is granted (enough for the
    // self-test, which must pass for the op to be accepted at all).
    let n = 300u32;
    let mut b = Builder::new();
    b.scratch = 64 << 10;
    let qkv = b.f32s([d, 2 * nk + nv, n, 1], &vec![0.1; (d * (2 * nk + nv) * n) as usize]);
    let g = b.f32s([nv, n, 2, 1], &vec![-0.5; (nv * n * 2) as usize]);
    let st = b.zeros(DType::F32, [d, d, nv, 1]);
    let o = b.zeros(DType::F32, [d, nv, n, 1]);
    b.op(kind(0), [Some(qkv), Some(g), Some(st)], o); // token by token: fits
    b.op(kind(300), [Some(qkv), Some(g), Some(st)], o);
    assert_eq!(b.run().unwrap_err(), Failed { op: 1, code: OUT_OF_MEMORY });
}

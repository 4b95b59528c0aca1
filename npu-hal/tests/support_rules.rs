//! `check_op`'s shape, type and layout rules for the ops of the qwen2/qwen3/gemma3/
//! qwen35 blocks: the sliding-window `Attention`, `Scale`, `Sigmoid`, `Softplus`,
//! `L2Norm`, `SsmConv` and `GatedDeltaRule`.

use keel_npu_hal::buffer::BufferRules;
use keel_npu_hal::caps::{Caps, DTypeSet, MemoryLimits, OpSet, UnitState, Units};
use keel_npu_hal::op::{DType, Layout, OpDesc, OpKind, Reason, Support, TensorDesc};
use keel_npu_hal::support::check_op;

fn caps(codes: std::ops::Range<u8>) -> Caps {
    Caps {
        units: Units { hvx_contexts: 4, hvx: UnitState::Verified, hmx: UnitState::Absent, npu_cores: 0, npu: UnitState::Absent },
        memory: MemoryLimits { va_budget: 1 << 30, scratch_bytes: 1 << 20, buffers: BufferRules { align: 4096, granule: 4096, max_size: 1 << 30 } },
        ops: codes.fold(OpSet::default(), |s, c| s.with(c)),
        matmul_weights: DTypeSet::default().with(DType::Q8_0),
        max_in_flight: 1,
        max_batch_ops: 64,
    }
}

fn f32s(ne: [u32; 4]) -> TensorDesc {
    TensorDesc::contiguous(DType::F32, ne, 0, 0).unwrap()
}

fn with(t: TensorDesc, dtype: DType) -> TensorDesc {
    TensorDesc { dtype, ..t }
}

/// `kind` over tensors `t` (src i = tensor i for the first `n_src`, dst the last).
fn check(kind: OpKind, t: &[TensorDesc], n_src: usize) -> Support {
    let mut src = [None; 3];
    for (i, s) in src.iter_mut().enumerate().take(n_src) {
        *s = Some(i as u16);
    }
    check_op(&caps(0..20), &OpDesc { kind, src, dst: (t.len() - 1) as u16 }, t)
}

#[test]
fn new_op_kinds_need_their_capability_bit() {
    let x = f32s([8, 2, 1, 1]);
    let op = OpDesc { kind: OpKind::Sigmoid, src: [Some(0), None, None], dst: 1 };
    assert_eq!(check_op(&caps(0..14), &op, &[x, x]), Support::No(Reason::OpKind));
    assert_eq!(check_op(&caps(0..20), &op, &[x, x]), Support::Yes);
    let codes = [
        OpKind::Scale { s: 2.0 }.code(),
        OpKind::Sigmoid.code(),
        OpKind::Softplus.code(),
        OpKind::L2Norm { eps: 1e-6 }.code(),
        OpKind::SsmConv.code(),
        OpKind::GatedDeltaRule { n_k_heads: 1, chunk: 0, scale: 1.0 }.code(),
    ];
    assert_eq!(codes, [14, 15, 16, 17, 18, 19]);
}

#[test]
fn elementwise_ops_and_l2_norm_keep_the_shape_and_take_f32() {
    let x = f32s([64, 3, 2, 1]);
    for kind in [OpKind::Scale { s: 0.5 }, OpKind::Sigmoid, OpKind::Softplus, OpKind::L2Norm { eps: 1e-6 }] {
        assert_eq!(check(kind, &[x, x], 1), Support::Yes, "{kind:?}");
        assert_eq!(check(kind, &[x, f32s([64, 6, 1, 1])], 1), Support::No(Reason::Shape), "{kind:?}");
        assert_eq!(check(kind, &[with(x, DType::F16), x], 1), Support::No(Reason::DType), "{kind:?}");
        assert_eq!(check(kind, &[x, with(x, DType::F16)], 1), Support::No(Reason::DType), "{kind:?}");
        assert_eq!(check(kind, &[x], 0), Support::No(Reason::Index), "{kind:?}");
    }
}

#[test]
fn attention_with_a_window_has_the_rules_of_attention() {
    let q = f32s([64, 4, 2, 1]);
    let kv = TensorDesc::contiguous(DType::F16, [64, 10, 2, 1], 0, 0).unwrap();
    for window in [0, 1, 4, 1 << 20] {
        let kind = OpKind::Attention { n_head: 4, n_head_kv: 2, scale: 0.125, window };
        assert_eq!(check(kind, &[q, kv, kv, q], 3), Support::Yes);
        assert_eq!(check(kind, &[q, with(kv, DType::F32), kv, q], 3), Support::No(Reason::DType));
        let kind = OpKind::Attention { n_head: 4, n_head_kv: 3, scale: 0.125, window };
        assert_eq!(check(kind, &[q, kv, kv, q], 3), Support::No(Reason::Shape));
    }
}

#[test]
fn ssm_conv_shapes() {
    let (ch, n, k) = (96, 5, 4);
    let (x, w, st, d) = (f32s([ch, n, 1, 1]), f32s([k, ch, 1, 1]), f32s([k - 1, ch, 1, 1]), f32s([ch, n, 1, 1]));
    assert_eq!(check(OpKind::SsmConv, &[x, w, st, d], 3), Support::Yes);
    assert_eq!(check(OpKind::SsmConv, &[f32s([ch, 1, 1, 1]), w, st, f32s([ch, 1, 1, 1])], 3), Support::Yes);
    // A missing state, a state of the wrong length, taps for other channels, one tap.
    assert_eq!(check(OpKind::SsmConv, &[x, w, d], 2), Support::No(Reason::Index));
    assert_eq!(check(OpKind::SsmConv, &[x, w, f32s([k, ch, 1, 1]), d], 3), Support::No(Reason::Shape));
    assert_eq!(check(OpKind::SsmConv, &[x, f32s([k, ch + 1, 1, 1]), st, d], 3), Support::No(Reason::Shape));
    assert_eq!(check(OpKind::SsmConv, &[x, f32s([1, ch, 1, 1]), f32s([1, ch, 1, 1]), d], 3), Support::No(Reason::Shape));
    // dst not x's shape; x with a third dimension; an F16 state or taps.
    assert_eq!(check(OpKind::SsmConv, &[x, w, st, f32s([ch, n + 1, 1, 1])], 3), Support::No(Reason::Shape));
    assert_eq!(check(OpKind::SsmConv, &[f32s([ch, n, 2, 1]), w, st, f32s([ch, n, 2, 1])], 3), Support::No(Reason::Shape));
    assert_eq!(check(OpKind::SsmConv, &[x, w, with(st, DType::F16), d], 3), Support::No(Reason::DType));
    assert_eq!(check(OpKind::SsmConv, &[x, with(w, DType::F16), st, d], 3), Support::No(Reason::DType));
}

#[test]
fn gated_delta_rule_shapes() {
    let (d, nk, nv, n) = (32u32, 2u32, 4u32, 3u32);
    let kind = |n_k_heads| OpKind::GatedDeltaRule { n_k_heads, chunk: 64, scale: 0.17 };
    let (qkv, g, st, o) = (f32s([d, 2 * nk + nv, n, 1]), f32s([nv, n, 2, 1]), f32s([d, d, nv, 1]), f32s([d, nv, n, 1]));
    assert_eq!(check(kind(2), &[qkv, g, st, o], 3), Support::Yes);
    // A strided view of the conv output rows (channels 2·nk·d + nv·d, plus slack) is fine.
    let view = TensorDesc { nb: [4, 4 * d, 4 * (2 * nk + nv + 1) * d, 4 * (2 * nk + nv + 1) * d * n], ..qkv };
    assert_eq!(check(kind(2), &[view, g, st, o], 3), Support::Yes);
    // n_k_heads 0, not dividing n_v_heads, or not matching the rows.
    assert_eq!(check(kind(0), &[qkv, g, st, o], 3), Support::No(Reason::Shape));
    assert_eq!(check(kind(3), &[f32s([d, 6 + nv, n, 1]), g, st, o], 3), Support::No(Reason::Shape));
    assert_eq!(check(kind(1), &[qkv, g, st, o], 3), Support::No(Reason::Shape));
    // Gates, state, output of the wrong shape or type.
    assert_eq!(check(kind(2), &[qkv, f32s([nv, n, 1, 1]), st, o], 3), Support::No(Reason::Shape));
    assert_eq!(check(kind(2), &[qkv, f32s([nv, n + 1, 2, 1]), st, o], 3), Support::No(Reason::Shape));
    assert_eq!(check(kind(2), &[qkv, g, f32s([d, d, nv + 1, 1]), o], 3), Support::No(Reason::Shape));
    assert_eq!(check(kind(2), &[qkv, g, f32s([d, d - 1, nv, 1]), o], 3), Support::No(Reason::Shape));
    assert_eq!(check(kind(2), &[qkv, g, st, f32s([d, nv, n - 1, 1])], 3), Support::No(Reason::Shape));
    assert_eq!(check(kind(2), &[qkv, g, with(st, DType::F16), o], 3), Support::No(Reason::DType));
    assert_eq!(check(kind(2), &[qkv, g, st, with(o, DType::F16)], 3), Support::No(Reason::DType));
    let tiled = TensorDesc { layout: Layout::Tiles32, ..g };
    assert_eq!(check(kind(2), &[qkv, tiled, st, o], 3), Support::No(Reason::Layout));
    assert_eq!(check(kind(2), &[qkv, g, o], 2), Support::No(Reason::Index));
}

//! The generic `supports(op)` rules: what a device with given [`Caps`] can run,
//! from the op kind, tensor types, layouts and shapes. Devices answer with this
//! by default (see [`crate::Device::supports`]) and may be stricter.

use crate::caps::Caps;
use crate::op::{DType, Layout, OpDesc, OpKind, Reason, Support, TensorDesc};

fn get(tensors: &[TensorDesc], i: Option<u16>) -> Result<&TensorDesc, Reason> {
    i.and_then(|i| tensors.get(usize::from(i))).ok_or(Reason::Index)
}

fn need(cond: bool, r: Reason) -> Result<(), Reason> {
    if cond {
        Ok(())
    } else {
        Err(r)
    }
}

fn is_f32_rows(t: &TensorDesc) -> Result<(), Reason> {
    is_rows(t, DType::F32)
}

/// Whether a device with `caps` supports `op` over the tensor table `tensors`.
pub fn check_op(caps: &Caps, op: &OpDesc, tensors: &[TensorDesc]) -> Support {
    match check(caps, op, tensors) {
        Ok(()) => Support::Yes,
        Err(r) => Support::No(r),
    }
}

fn is_rows(t: &TensorDesc, dtype: DType) -> Result<(), Reason> {
    need(t.dtype == dtype, Reason::DType)?;
    need(t.layout == Layout::RowMajor, Reason::Layout)
}

/// A single row of `n` values broadcast over everything (ggml's `[n, 1, 1, 1]`).
fn is_row_of(t: &TensorDesc, n: u32) -> bool {
    t.ne[0] == n && t.ne[1..].iter().all(|&d| d == 1)
}

fn check(caps: &Caps, op: &OpDesc, t: &[TensorDesc]) -> Result<(), Reason> {
    need(caps.ops.contains(&op.kind), Reason::OpKind)?;
    need(caps.units.hvx.usable() || caps.units.npu.usable(), Reason::Unit)?;
    let dst = get(t, Some(op.dst))?;
    let a = get(t, op.src[0])?;
    match op.kind {
        OpKind::Quantize => is_rows(dst, DType::Q8_0)?,
        OpKind::Copy => {
            need(matches!(dst.dtype, DType::F32 | DType::F16), Reason::DType)?;
            need(dst.layout == Layout::RowMajor, Reason::Layout)?;
        }
        _ => is_f32_rows(dst)?,
    }
    match op.kind {
        OpKind::MatMul => {
            let x = get(t, op.src[1])?;
            need(matches!(x.dtype, DType::F32 | DType::Q8_0), Reason::DType)?;
            need(x.layout == Layout::RowMajor, Reason::Layout)?;
            need(caps.matmul_weights.contains(a.dtype), Reason::DType)?;
            need(a.layout == Layout::Tiles32, Reason::Layout)?;
            need(a.ne[0] % 32 == 0 && a.ne[2] == 1 && a.ne[3] == 1, Reason::Shape)?;
            need(x.ne[0] == a.ne[0] && x.ne[2] == 1 && x.ne[3] == 1, Reason::Shape)?;
            need(dst.ne == [a.ne[1], x.ne[1], 1, 1], Reason::Shape)
        }
        OpKind::GetRows => {
            let idx = get(t, op.src[1])?;
            need(idx.dtype == DType::I32, Reason::DType)?;
            need(matches!(a.dtype, DType::F32 | DType::F16 | DType::Q8_0 | DType::Q4_0 | DType::IQ4NL), Reason::DType)?;
            need(a.layout == Layout::RowMajor, Reason::Layout)?;
            need(dst.ne == [a.ne[0], idx.ne[0], 1, 1], Reason::Shape)
        }
        OpKind::RmsNorm { .. } => {
            is_f32_rows(a)?;
            if op.src[1].is_some() {
                let w = get(t, op.src[1])?;
                is_f32_rows(w)?;
                need(is_row_of(w, a.ne[0]), Reason::Shape)?;
            }
            need(dst.ne == a.ne, Reason::Shape)
        }
        OpKind::Silu
        | OpKind::Gelu
        | OpKind::Softmax { .. }
        | OpKind::Copy
        | OpKind::Scale { .. }
        | OpKind::Sigmoid
        | OpKind::Softplus
        | OpKind::L2Norm { .. } => {
            is_f32_rows(a)?;
            need(dst.ne == a.ne, Reason::Shape)
        }
        OpKind::Quantize => {
            is_f32_rows(a)?;
            need(a.ne[0] % 32 == 0 && dst.ne == a.ne, Reason::Shape)
        }
        OpKind::SwiGlu | OpKind::GeGlu | OpKind::Mul | OpKind::Add => {
            let b = get(t, op.src[1])?;
            is_f32_rows(a)?;
            is_f32_rows(b)?;
            need(dst.ne == a.ne, Reason::Shape)?;
            let gated = matches!(op.kind, OpKind::SwiGlu | OpKind::GeGlu);
            need(b.ne == a.ne || (is_row_of(b, a.ne[0]) && !gated), Reason::Shape)
        }
        OpKind::Rope { n_dims, mode, .. } => {
            // a: [head_dim, n_head, n_tokens]; positions: [n_tokens] I32; cos/sin: [n_dims, n_tokens].
            let pos = get(t, op.src[1])?;
            is_f32_rows(a)?;
            need(pos.dtype == DType::I32, Reason::DType)?;
            need(mode == 0 || mode == 2, Reason::Shape)?;
            let n = u32::from(n_dims);
            need(n % 2 == 0 && n > 0 && n <= a.ne[0], Reason::Shape)?;
            if op.src[2].is_some() {
                let cs = get(t, op.src[2])?;
                is_f32_rows(cs)?;
                need(cs.ne == [n, a.ne[2], 1, 1], Reason::Shape)?;
            }
            need(pos.ne[0] == a.ne[2] && dst.ne == a.ne, Reason::Shape)
        }
        OpKind::Attention { n_head, n_head_kv, .. } => {
            // q: [head_dim, n_head, n_tokens]; k, v: [head_dim, n_kv, n_head_kv], F16
            // (keel's cache type: the attention arithmetic keeps f16 rows and accumulator).
            let k = get(t, op.src[1])?;
            let v = get(t, op.src[2])?;
            is_f32_rows(a)?;
            for c in [k, v] {
                need(c.dtype == DType::F16, Reason::DType)?;
                need(c.layout == Layout::RowMajor, Reason::Layout)?;
            }
            let (nh, nkv) = (u32::from(n_head), u32::from(n_head_kv));
            need(nkv > 0 && nh % nkv == 0 && a.ne[1] == nh, Reason::Shape)?;
            need(k.ne[0] == a.ne[0] && k.ne[2] == nkv && v.ne == k.ne, Reason::Shape)?;
            need(k.ne[1] >= a.ne[2] && a.ne[3] == 1 && k.ne[3] == 1, Reason::Shape)?;
            need(dst.ne == a.ne, Reason::Shape)
        }
        OpKind::SsmConv => {
            // x: [ch, n_tokens]; taps: [d_conv, ch]; state: [d_conv - 1, ch]; dst: x's shape.
            let (w, state) = (get(t, op.src[1])?, get(t, op.src[2])?);
            for s in [a, w, state] {
                is_f32_rows(s)?;
            }
            let ch = a.ne[0];
            need(a.ne[2] == 1 && a.ne[3] == 1 && dst.ne == a.ne, Reason::Shape)?;
            need(w.ne[0] >= 2 && w.ne[1] == ch && w.ne[2] == 1 && w.ne[3] == 1, Reason::Shape)?;
            need(state.ne == [w.ne[0] - 1, ch, 1, 1], Reason::Shape)
        }
        OpKind::GatedDeltaRule { n_k_heads, .. } => {
            // qkv: [d, 2·n_k_heads + n_v_heads, n_tokens]; gates: [n_v_heads, n_tokens, 2];
            // states: [d, d, n_v_heads]; dst: [d, n_v_heads, n_tokens].
            let (g, state) = (get(t, op.src[1])?, get(t, op.src[2])?);
            for s in [a, g, state] {
                is_f32_rows(s)?;
            }
            let (d, nk, nv, n) = (a.ne[0], u32::from(n_k_heads), state.ne[2], a.ne[2]);
            need(nk > 0 && nv % nk == 0 && state.ne == [d, d, nv, 1], Reason::Shape)?;
            need(a.ne[1] == 2 * nk + nv && a.ne[3] == 1, Reason::Shape)?;
            need(g.ne == [nv, n, 2, 1] && dst.ne == [d, nv, n, 1], Reason::Shape)
        }
    }
}

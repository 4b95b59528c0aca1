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
    need(t.dtype == DType::F32, Reason::DType)?;
    need(t.layout == Layout::RowMajor, Reason::Layout)
}

/// Whether a device with `caps` supports `op` over the tensor table `tensors`.
pub fn check_op(caps: &Caps, op: &OpDesc, tensors: &[TensorDesc]) -> Support {
    match check(caps, op, tensors) {
        Ok(()) => Support::Yes,
        Err(r) => Support::No(r),
    }
}

fn check(caps: &Caps, op: &OpDesc, t: &[TensorDesc]) -> Result<(), Reason> {
    need(caps.ops.contains(&op.kind), Reason::OpKind)?;
    need(caps.units.hvx.usable() || caps.units.npu.usable(), Reason::Unit)?;
    let dst = get(t, Some(op.dst))?;
    let a = get(t, op.src[0])?;
    is_f32_rows(dst)?;
    match op.kind {
        OpKind::MatMul => {
            let x = get(t, op.src[1])?;
            is_f32_rows(x)?;
            need(caps.matmul_weights.contains(a.dtype), Reason::DType)?;
            need(a.layout == Layout::Tiles32, Reason::Layout)?;
            need(a.ne[0] % 32 == 0 && a.ne[2] == 1 && a.ne[3] == 1, Reason::Shape)?;
            need(x.ne[0] == a.ne[0] && x.ne[2] == 1 && x.ne[3] == 1, Reason::Shape)?;
            need(dst.ne == [a.ne[1], x.ne[1], 1, 1], Reason::Shape)
        }
        OpKind::GetRows => {
            let idx = get(t, op.src[1])?;
            need(idx.dtype == DType::I32, Reason::DType)?;
            need(matches!(a.dtype, DType::F32 | DType::F16 | DType::Q8_0 | DType::Q4_0), Reason::DType)?;
            need(a.layout == Layout::RowMajor, Reason::Layout)?;
            need(dst.ne == [a.ne[0], idx.ne[0], 1, 1], Reason::Shape)
        }
        OpKind::RmsNorm { .. } | OpKind::Silu | OpKind::Gelu | OpKind::Softmax { .. } => {
            is_f32_rows(a)?;
            need(dst.ne == a.ne, Reason::Shape)
        }
        OpKind::SwiGlu | OpKind::Mul | OpKind::Add => {
            let b = get(t, op.src[1])?;
            is_f32_rows(a)?;
            is_f32_rows(b)?;
            need(dst.ne == a.ne, Reason::Shape)?;
            let broadcast = b.ne[0] == a.ne[0] && b.ne[1..].iter().all(|&n| n == 1);
            let same = b.ne == a.ne;
            need(same || (broadcast && op.kind != OpKind::SwiGlu), Reason::Shape)
        }
        OpKind::Rope { n_dims, mode, .. } => {
            // a: [head_dim, n_head, n_tokens]; positions: [n_tokens] I32.
            let pos = get(t, op.src[1])?;
            is_f32_rows(a)?;
            need(pos.dtype == DType::I32, Reason::DType)?;
            need(mode == 0 || mode == 2, Reason::Shape)?;
            let n = u32::from(n_dims);
            need(n % 2 == 0 && n > 0 && n <= a.ne[0], Reason::Shape)?;
            need(pos.ne[0] == a.ne[2] && dst.ne == a.ne, Reason::Shape)
        }
        OpKind::Attention { n_head, n_head_kv, .. } => {
            // q: [head_dim, n_head, n_tokens]; k, v: [head_dim, n_ctx, n_head_kv].
            let k = get(t, op.src[1])?;
            let v = get(t, op.src[2])?;
            is_f32_rows(a)?;
            for c in [k, v] {
                need(matches!(c.dtype, DType::F32 | DType::F16), Reason::DType)?;
                need(c.layout == Layout::RowMajor, Reason::Layout)?;
            }
            let (nh, nkv) = (u32::from(n_head), u32::from(n_head_kv));
            need(nkv > 0 && nh % nkv == 0 && a.ne[1] == nh, Reason::Shape)?;
            need(k.ne[0] == a.ne[0] && k.ne[2] == nkv && v.ne == k.ne, Reason::Shape)?;
            need(dst.ne == a.ne, Reason::Shape)
        }
    }
}

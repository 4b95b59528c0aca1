//! Markers for the executed-packet cost model (`keel-dsp-cost`, `bench/dsp-cost.sh`).
//!
//! Under `qemu-hexagon -d exec,nochain` every executed translation block is logged with
//! the symbol it starts in. The message loop calls one of these empty, never-inlined
//! functions before each batch (`keel_cost_batch_one`: a batch whose first `MatMul`
//! has one token column, a decode step; `keel_cost_batch_many`: several, a prompt
//! chunk) and before each op (`keel_cost_op_<kind>`); an embedding lookup (`GetRows`,
//! the start of a forward pass run whole on the device) also marks the pass by its
//! token count (`keel_cost_forward_one` / `keel_cost_forward_many`), which holds for
//! every batch of the pass (its output projection alone has one column even in a
//! prompt). The counter attributes every packet that follows to the pass or batch
//! kind and the op kind by their names alone. Each
//! marker is one or two packets; nothing else reads them.

use keel_npu_hal::op::{Batch, OpDesc, OpKind, TensorDesc};

macro_rules! markers {
    ($($name:ident = $n:literal),* $(,)?) => {$(
        #[no_mangle]
        #[inline(never)]
        pub extern "C" fn $name() {
            // An asm statement the optimizer must keep (the call stays), with a body of
            // its own (`r0 = #n`) so the linker cannot fold the markers into one address.
            // SAFETY: writes only r0, declared clobbered.
            unsafe { core::arch::asm!("r0 = #{n}", n = const $n, out("r0") _, options(nomem, nostack, preserves_flags)) }
        }
    )*};
}

markers!(
    keel_cost_batch_one = 1,
    keel_cost_batch_many = 2,
    keel_cost_op_matmul = 3,
    keel_cost_op_get_rows = 4,
    keel_cost_op_rms_norm = 5,
    keel_cost_op_rope = 6,
    keel_cost_op_attention = 7,
    keel_cost_op_quantize = 8,
    keel_cost_op_copy = 9,
    keel_cost_op_elementwise = 10,
    keel_cost_op_recurrent = 11,
    keel_cost_forward_one = 12,
    keel_cost_forward_many = 13,
);

/// Marks the start of a batch: one token column or several.
pub fn batch(b: &Batch<'_>) {
    let cols = b.ops.iter().find(|o| matches!(o.kind, OpKind::MatMul)).and_then(|o| o.src[1]).and_then(|t| b.tensors.get(usize::from(t))).map_or(1, |t| t.ne[1]);
    if cols > 1 {
        keel_cost_batch_many()
    } else {
        keel_cost_batch_one()
    }
}

/// Marks the start of an op by its kind's group (and a forward pass by its tokens).
pub fn op(tensors: &[TensorDesc], op: &OpDesc) {
    match op.kind {
        OpKind::MatMul => keel_cost_op_matmul(),
        OpKind::GetRows => {
            let ids = op.src[1].and_then(|t| tensors.get(usize::from(t))).map_or(1, |t| t.ne[0]);
            if ids > 1 {
                keel_cost_forward_many()
            } else {
                keel_cost_forward_one()
            }
            keel_cost_op_get_rows()
        }
        OpKind::RmsNorm { .. } | OpKind::L2Norm { .. } => keel_cost_op_rms_norm(),
        OpKind::Rope { .. } => keel_cost_op_rope(),
        OpKind::Attention { .. } => keel_cost_op_attention(),
        OpKind::Quantize => keel_cost_op_quantize(),
        OpKind::Copy => keel_cost_op_copy(),
        OpKind::SsmConv | OpKind::GatedDeltaRule { .. } => keel_cost_op_recurrent(),
        _ => keel_cost_op_elementwise(),
    }
}

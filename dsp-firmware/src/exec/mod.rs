//! Executes one op batch over mapped buffers: resolves the buffer table
//! ([`Buffers`]: the shared region on the device, the harness's memory under
//! test), checks every op against the device's capabilities
//! (`keel_npu_hal::support`), and runs the ops in order. The first failing op
//! stops the batch (`BatchStatus::Failed { op, kind }`); ops before it ran.
//!
//! - [`products`]: `MatMul` (Tiles32 Q8_0/Q4_0/IQ4_NL weights by F32 columns,
//!   quantized to Q8_0 here, or by Q8_0 columns), `Quantize`, `GetRows`, `Copy`.
//! - [`layer`]: the float ops (`RmsNorm`, `Rope`, `Attention` with an optional
//!   sliding window, `Softmax`, `Silu`, `Gelu`, `Sigmoid`, `Softplus`, `Scale`,
//!   `SwiGlu`, `GeGlu`, `Add`, `Mul`).
//! - [`recurrent`]: the delta-net ops (`L2Norm`, `SsmConv` and `GatedDeltaRule`
//!   with their device-resident states).
//!
//! Every value is computed by keel-core (`keel_core::ops`, `keel_core::attention`,
//! `keel_core::delta_net`, `keel_core::quant`), so the DSP gives the CPU's bits.
//! - [`view`]: tensors as byte ranges and slices, and the aliasing rules: a
//!   destination is either disjoint from a source or the very same tensor
//!   (in place); anything else is `InvalidArgument`.

mod layer;
mod products;
mod recurrent;
mod view;

use keel_core::ops;
use keel_npu_hal::op::{OpKind, Support};
use keel_npu_hal::support::check_op;
use keel_npu_hal::wire::{BatchMsg, MAX_BUFFERS};
use keel_npu_hal::{BatchStatus, BufferId, Caps, ErrorKind};

use crate::scratch::Scratch;
use crate::shm::SharedRegion;
use view::Tensors;

/// Where the buffers of a batch live: device address and length of buffer `id`.
pub trait Buffers {
    /// Address and length of a mapped buffer.
    fn get(&self, id: BufferId) -> Option<(usize, u32)>;
}

impl Buffers for SharedRegion {
    fn get(&self, id: BufferId) -> Option<(usize, u32)> {
        SharedRegion::get(self, id)
    }
}

/// Runs `msg`'s ops in order.
pub fn run_batch(msg: &BatchMsg, buffers: &impl Buffers, caps: &Caps, scratch: &mut Scratch<'_>) -> BatchStatus {
    let failed = |op: usize, kind| BatchStatus::Failed { op: op as u16, kind };
    let batch = msg.batch();
    if let Err(kind) = batch.validate() {
        return failed(0, kind);
    }
    // Device address of each buffer in the table, checked against its mapping.
    let mut bases = [0usize; MAX_BUFFERS];
    for (base, r) in bases.iter_mut().zip(batch.buffers) {
        match buffers.get(r.id) {
            Some((addr, len)) if r.size <= u64::from(len) => *base = addr,
            _ => return failed(0, ErrorKind::InvalidArgument),
        }
    }
    let ts = Tensors { t: batch.tensors, bases: &bases };
    for (i, op) in batch.ops.iter().enumerate() {
        if check_op(caps, op, batch.tensors) != Support::Yes {
            return failed(i, ErrorKind::Unsupported);
        }
        let s = &mut scratch.scope();
        let r = match op.kind {
            OpKind::MatMul => products::matmul(op, &ts, s),
            OpKind::Quantize => products::quantize(op, &ts),
            OpKind::GetRows => products::get_rows(op, &ts),
            OpKind::Copy => products::copy(op, &ts),
            OpKind::RmsNorm { eps } => layer::norm(op, &ts, eps),
            OpKind::Softmax { scale } => layer::unary(op, &ts, |row| ops::softmax(row, scale)),
            OpKind::Silu => layer::unary(op, &ts, |row| row.iter_mut().for_each(|v| *v = ops::silu(*v))),
            OpKind::Gelu => layer::unary(op, &ts, |row| row.iter_mut().for_each(|v| *v = ops::gelu_tanh(*v))),
            OpKind::Scale { s } => layer::unary(op, &ts, |row| ops::scale(row, s)),
            OpKind::Sigmoid => layer::unary(op, &ts, |row| row.iter_mut().for_each(|v| *v = ops::sigmoid(*v))),
            OpKind::Softplus => layer::unary(op, &ts, |row| row.iter_mut().for_each(|v| *v = ops::softplus(*v))),
            OpKind::L2Norm { eps } => recurrent::l2_norm_rows(op, &ts, eps),
            OpKind::SsmConv => recurrent::ssm_conv(op, &ts),
            OpKind::GatedDeltaRule { n_k_heads, chunk, scale } => recurrent::gated_delta_rule(op, &ts, n_k_heads, chunk, scale, s),
            OpKind::SwiGlu | OpKind::GeGlu | OpKind::Add | OpKind::Mul => layer::binary(op, &ts),
            OpKind::Rope { n_dims, mode, freq_base } => layer::rope(op, &ts, n_dims, mode, freq_base, s),
            OpKind::Attention { n_head, n_head_kv, scale, window } => layer::attention(op, &ts, n_head, n_head_kv, scale, window, s),
            _ => Err(ErrorKind::Unsupported),
        };
        if let Err(kind) = r {
            return failed(i, kind);
        }
    }
    BatchStatus::Done
}

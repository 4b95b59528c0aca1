//! What a HAL op batch computes: [`run_batch`] executes a `keel_npu_hal::op::Batch`
//! over buffers the caller has in memory ([`Buffers`]: the shared region on the DSP,
//! the harness's work memory under QEMU, plain host memory in a CPU-backed device).
//! This is the one executor of batches: the Hexagon firmware runs it, and so can
//! any other device that computes on the CPU it runs on.
//!
//! It checks the batch (`Batch::validate`, every buffer against its memory, the
//! tables within the wire's bounds), checks every op against the device's
//! capabilities (`keel_npu_hal::support::check_op`), and runs the ops in order. The
//! first failing op stops the batch (`BatchStatus::Failed { op, kind }`); ops before
//! it ran.
//!
//! Every value is computed by keel-core's own functions ([`crate::ops`],
//! [`crate::attention`], [`crate::delta_net`], [`crate::quant`]) with the kernel set
//! of [`kernels`], so a device gives the CPU's bits, and the same bits on every target.
//!
//! - `products`: `MatMul` (Tiles32 Q8_0/Q4_0/IQ4_NL weights by F32 columns,
//!   quantized to Q8_0 here, or by Q8_0 columns), `Quantize`, `GetRows`, `Copy`.
//! - `layer`: the float ops (`RmsNorm`, `Rope`, `Attention` with an optional
//!   sliding window, `Softmax`, `Silu`, `Gelu`, `Sigmoid`, `Softplus`, `Scale`,
//!   `SwiGlu`, `GeGlu`, `Add`, `Mul`).
//! - `recurrent`: the delta-net ops (`L2Norm`, `SsmConv` and `GatedDeltaRule`
//!   with their device-resident states).
//! - `view`: tensors as byte ranges and slices, and the aliasing rules: a
//!   destination is either disjoint from a source or the very same tensor
//!   (in place); anything else is `InvalidArgument`.
//! - [`Scratch`]: the per-batch work memory (VTCM on the DSP) ops carve pieces from.

mod layer;
mod products;
mod recurrent;
mod scratch;
mod view;

#[cfg(test)]
mod tests;

use keel_npu_hal::op::{Batch, OpDesc, OpKind, Support};
use keel_npu_hal::support::check_op;
use keel_npu_hal::wire::{MAX_BUFFERS, MAX_OPS, MAX_TENSORS};
use keel_npu_hal::caps::OpSet;
use keel_npu_hal::{BatchStatus, BufferId, Caps, ErrorKind};

use crate::ops;
use crate::parallel::{Parallel, Sequential};
use crate::quant::{Isa, Kernels};
pub use scratch::{Scratch, ALIGN};
use view::Tensors;

/// Where the buffers of a batch live: the address and length of each buffer by id.
///
/// Alignment: an op fails with `InvalidArgument` where an F32, I32 or F16 tensor it
/// works on as values does not lie on its element size in memory, or where a `MatMul`'s
/// Tiles32 weights do not start on [`ALIGN`]; a device places its buffers on its
/// `caps.memory.buffers.align`.
///
/// # Safety
/// For every `id` it answers `Some((ptr, len))` for, `ptr` must point to `len` bytes
/// that are valid for reads and writes, stay so while a batch runs ([`run_batch`]),
/// and are not read, written or referenced through anything else (another thread,
/// the host side of a shared mapping, a live Rust reference, the batch's
/// [`Scratch`]) until it returns. Several ids may answer the same or overlapping
/// bytes: the executor compares addresses, never ids, when it checks aliasing.
pub unsafe trait Buffers {
    /// Address and length of buffer `id`, if there is such a buffer.
    fn get(&self, id: BufferId) -> Option<(*mut u8, usize)>;
}

/// The kernel set batches run with: `Kernels::new(Isa { hvx: true, .. })`, keel-core's
/// HVX table on a Hexagon build, the scalar reference on any other target. The HVX
/// table's kernels (the Tiles32 sums and scale passes, activation quantization, SwiGLU,
/// attention's f16 steps and exponentials) give the reference's bits, so a batch gives
/// the same bits on every target.
pub fn kernels() -> Kernels {
    Kernels::new(Isa { hvx: true, ..Isa::default() })
}

/// The op kinds [`run_batch`] executes (a device that runs it reports these in its caps).
pub const OPS: [OpKind; 20] = [
    OpKind::MatMul,
    OpKind::GetRows,
    OpKind::RmsNorm { eps: 0.0 },
    OpKind::Rope { n_dims: 0, mode: 0, freq_base: 0.0 },
    OpKind::Attention { n_head: 0, n_head_kv: 0, scale: 0.0, window: 0 },
    OpKind::Softmax { scale: 0.0 },
    OpKind::Silu,
    OpKind::Gelu,
    OpKind::SwiGlu,
    OpKind::Mul,
    OpKind::Add,
    OpKind::GeGlu,
    OpKind::Quantize,
    OpKind::Copy,
    OpKind::Scale { s: 0.0 },
    OpKind::Sigmoid,
    OpKind::Softplus,
    OpKind::L2Norm { eps: 0.0 },
    OpKind::SsmConv,
    OpKind::GatedDeltaRule { n_k_heads: 0, chunk: 0, scale: 0.0 },
];

/// [`OPS`] as the capability set a device reports.
pub fn op_set() -> OpSet {
    OPS.iter().fold(OpSet::default(), |set, k| set.with(k.code()))
}

/// Runs `batch`'s ops in order over `buffers`, each op first checked against `caps`,
/// with `scratch` as work memory (each op's pieces are given back when it ends).
///
/// Fails at op 0 with `InvalidArgument` if the batch does not validate or names a
/// buffer `buffers` does not have (or has shorter than the batch says), with
/// `Unsupported` if a table is longer than the wire carries (`wire::MAX_BUFFERS`,
/// `MAX_TENSORS`, `MAX_OPS`); at op `i` with `Unsupported` if `check_op` refuses it,
/// else with the op's own error.
pub fn run_batch(batch: &Batch<'_>, buffers: &impl Buffers, caps: &Caps, scratch: &mut Scratch<'_>) -> BatchStatus {
    run_batch_observed(batch, buffers, caps, scratch, &Sequential, |_| {})
}

/// [`run_batch`] with the matrix products' row groups and attention's (token, head)
/// pairs split over `par`'s tasks (the same bits whatever the number: each output row is
/// one task's, e.g. [`tiles32::matmul_par`](crate::quant::tiles32::matmul_par)),
/// calling `on_op` with each op just before it runs (after its checks): the Hexagon
/// firmware runs its hardware threads as `par` and marks op boundaries in `on_op` for
/// its executed-packet cost model (`dsp-firmware/src/cost.rs`). Allocates nothing.
pub fn run_batch_observed(batch: &Batch<'_>, buffers: &impl Buffers, caps: &Caps, scratch: &mut Scratch<'_>, par: &dyn Parallel, mut on_op: impl FnMut(&OpDesc)) -> BatchStatus {
    let failed = |op: usize, kind| BatchStatus::Failed { op: op as u16, kind };
    if batch.buffers.len() > MAX_BUFFERS || batch.tensors.len() > MAX_TENSORS || batch.ops.len() > MAX_OPS {
        return failed(0, ErrorKind::Unsupported);
    }
    if let Err(kind) = batch.validate() {
        return failed(0, kind);
    }
    // Address of each buffer in the table, checked against its memory.
    let mut bases = [core::ptr::null_mut(); MAX_BUFFERS];
    for (base, r) in bases.iter_mut().zip(batch.buffers) {
        match buffers.get(r.id) {
            Some((ptr, len)) if r.size <= len as u64 => *base = ptr,
            _ => return failed(0, ErrorKind::InvalidArgument),
        }
    }
    let ts = Tensors { t: batch.tensors, bases: &bases[..batch.buffers.len()] };
    for (i, op) in batch.ops.iter().enumerate() {
        if check_op(caps, op, batch.tensors) != Support::Yes {
            return failed(i, ErrorKind::Unsupported);
        }
        on_op(op);
        let s = &mut scratch.scope();
        let r = match op.kind {
            OpKind::MatMul => products::matmul(op, &ts, s, par),
            OpKind::Quantize => products::quantize(op, &ts),
            OpKind::GetRows => products::get_rows(op, &ts),
            OpKind::Copy => products::copy(op, &ts),
            OpKind::RmsNorm { eps } => layer::norm(op, &ts, eps),
            OpKind::Softmax { scale } => {
                let kern = kernels();
                layer::unary(op, &ts, |row| ops::softmax_with(row, scale, |x| kern.expf_batch(x)))
            }
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
            OpKind::Attention { n_head, n_head_kv, scale, window } => layer::attention(op, &ts, n_head, n_head_kv, scale, window, s, par),
            _ => Err(ErrorKind::Unsupported),
        };
        if let Err(kind) = r {
            return failed(i, kind);
        }
    }
    BatchStatus::Done
}

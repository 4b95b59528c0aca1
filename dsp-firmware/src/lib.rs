//! keel's Hexagon DSP firmware: keel-core compiled for Hexagon (its HVX kernel set and
//! all of its arithmetic) plus what only the DSP side has. Module map:
//! - [`scratch`]: VTCM as a managed scratch region
//! - [`selftest`]: the known-input test run at open
//! - [`exec`]: op batches over mapped buffers (descriptors → keel-core calls)
//! - [`msgloop`]: the wire-protocol message loop (handshake, caps, buffers, batches)
//! - [`shm`]: the shared-memory region and the buffers mapped from it
//! - [`args`]: the device ELF's command line
//! - [`harness`]: the qemu-hexagon test-vector protocol
//! - [`sys`]: Linux system calls under qemu-hexagon
//!
//! Every float op, quantization rule and integer kernel is keel-core's
//! (`keel_core::ops`, `keel_core::attention`, `keel_core::quant`); this crate never
//! computes a value itself.
#![no_std]
// System calls are `trap0` inline asm (Hexagon asm is unstable: nightly).
#![feature(asm_experimental_arch)]

#[cfg(not(target_arch = "hexagon"))]
compile_error!("keel-dsp-firmware builds only for Hexagon: see dsp-firmware/README.md");

pub mod args;
pub mod exec;
pub mod harness;
pub mod msgloop;
pub mod scratch;
pub mod selftest;
pub mod shm;
pub mod sys;

use keel_core::ggml_type::GgmlType;
use keel_core::quant::tiles32::TileError;
use keel_core::quant::{Isa, Kernels};
use keel_npu_hal::op::DType;
use keel_npu_hal::ErrorKind;

/// keel-core's kernel set for this DSP: HVX (the firmware is built with 128-byte HVX;
/// the open-time self-test proves the unit computes before the host trusts it).
pub fn kernels() -> Kernels {
    Kernels::new(Isa { hvx: true, ..Isa::default() })
}

/// keel-core's name for a wire type.
pub fn ggml_type(d: DType) -> Result<GgmlType, ErrorKind> {
    GgmlType::from_id(d.ggml_type_id()).ok_or(ErrorKind::Unsupported)
}

/// A Tiles32 error as the HAL's error kind.
pub fn tile_error(e: TileError) -> ErrorKind {
    match e {
        TileError::Unsupported => ErrorKind::Unsupported,
        TileError::Shape => ErrorKind::InvalidArgument,
        TileError::Scratch => ErrorKind::OutOfMemory,
    }
}

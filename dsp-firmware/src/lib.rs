//! keel's Hexagon DSP firmware. Module map:
//! - [`hvx`]: HVX integer kernels (vrmpy block sums over Tiles32 weights)
//! - [`quantize`]: activations → Q8_0 blocks, on the DSP
//! - [`matvec`]: matrix-vector products (kernels + per-block scales)
//! - [`ops`]: the float ops of a layer (RMSNorm, RoPE, attention, activations…)
//! - [`scratch`]: VTCM as a managed scratch region
//! - [`selftest`]: the known-input test run at open
//! - [`exec`]: op batches over mapped buffers (descriptors → kernels)
//! - [`msgloop`]: the wire-protocol message loop (handshake, caps, buffers, batches)
//! - [`shm`]: the shared-memory region and the buffers mapped from it
//! - [`args`]: the device ELF's command line
//! - [`harness`]: the qemu-hexagon test-vector protocol
//! - [`sys`]: Linux system calls under qemu-hexagon
#![no_std]
#![feature(stdarch_hexagon, asm_experimental_arch, core_intrinsics)]
#![allow(internal_features, unused_unsafe)]

#[cfg(not(target_arch = "hexagon"))]
compile_error!("keel-dsp-firmware builds only for Hexagon: see dsp-firmware/README.md");

pub mod args;
pub mod exec;
pub mod harness;
pub mod hvx;
pub mod matvec;
pub mod msgloop;
pub mod ops;
pub mod quantize;
pub mod scratch;
pub mod selftest;
pub mod shm;
pub mod sys;

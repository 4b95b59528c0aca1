//! keel's Hexagon DSP firmware: keel-core compiled for Hexagon (its HVX kernel set, all
//! of its arithmetic, and its batch executor `keel_core::exec`: op batches over mapped
//! buffers, VTCM as its `Scratch`) plus what only the DSP side has. Module map:
//! - [`selftest`]: the known-input test run at open
//! - [`msgloop`]: the wire-protocol message loop (handshake, caps, buffers, batches)
//! - [`shm`]: the shared-memory region and the buffers mapped from it
//! - [`args`]: the device ELF's command line
//! - [`cost`]: markers of batches and ops for the executed-packet cost model
//! - [`harness`]: the qemu-hexagon test-vector protocol
//! - [`sys`]: Linux system calls under qemu-hexagon
//! - [`threads`]: hardware threads that share a product's row groups (`--threads`)
//!
//! Every float op, quantization rule and integer kernel is keel-core's
//! (`keel_core::ops`, `keel_core::attention`, `keel_core::quant`, run by
//! `keel_core::exec`); this crate never computes a value itself.
#![no_std]
// System calls are `trap0` inline asm (Hexagon asm is unstable: nightly).
#![feature(asm_experimental_arch)]

#[cfg(not(target_arch = "hexagon"))]
compile_error!("keel-dsp-firmware builds only for Hexagon: see dsp-firmware/README.md");

pub mod args;
pub mod cost;
pub mod harness;
pub mod msgloop;
pub mod selftest;
pub mod shm;
pub mod sys;
pub mod threads;

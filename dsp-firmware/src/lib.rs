//! keel's Hexagon DSP firmware. Module map:
//! - [`hvx`]: HVX integer kernels (vrmpy block sums over Tiles32 weights)
//! - [`quantize`]: activations → Q8_0 blocks, on the DSP
//! - [`matvec`]: matrix-vector products (kernels + per-block scales)
//! - [`scratch`]: VTCM as a managed scratch region
//! - [`selftest`]: the known-input test run at open
//! - [`harness`]: the qemu-hexagon test-vector protocol
//! - [`sys`]: Linux system calls for the QEMU harness
#![no_std]
#![feature(stdarch_hexagon, asm_experimental_arch)]

#[cfg(not(target_arch = "hexagon"))]
compile_error!("keel-dsp-firmware builds only for Hexagon: see dsp-firmware/README.md");

pub mod harness;
pub mod hvx;
pub mod matvec;
pub mod quantize;
pub mod scratch;
pub mod selftest;
pub mod sys;

//! The RK3588 NPU through the mainline `rocket` accel driver: register command streams for
//! INT8 matrix products posed as 1×1 convolutions, the buffers they read and write, and
//! the tools that compare them with Mesa's rocket driver.
//!
//! - [`regcmd`]: the 64-bit entry format, register names ([`names`]), readable listings.
//! - [`conv`]: task planning, the register values of a task, encode and decode.
//! - [`pack`]: weight, bias and input packers; the output unpacker.
//! - [`fixture`]: capture-tool fixtures in, keel's stream and buffers out.
//! - [`w8a8`]: keel's W8A8 scheme (per-channel/per-token scales, Hadamard rotation) and the
//!   exact CPU emulation of the NPU's integer arithmetic.
//! - [`ioctl`]: the driver's ioctls behind a trait, the real node, one GEMM run through them.
//! - [`device`]: the `rknpu` device, keel's HAL over the ioctls (W8A8 products in keel's
//!   int32 mode); [`sim`] models what the NPU computes for such a task and [`double`] is
//!   the recording driver double whose "hardware" it is.
//! - [`gemm`]: keel's GEMM `Y[M,N] = X[M,K]·W[K,N]`, tiled along N so that each tile's
//!   weights stay resident in the convolution buffer.
//!
//! Nothing here has run on hardware: the streams equal Mesa 26.2.6's for every captured
//! fixture, which is the strongest check available without a board.

pub mod conv;
pub mod device;
pub mod double;
pub mod fixture;
pub mod gemm;
pub mod ioctl;
pub mod names;
pub mod pack;
pub mod regcmd;
pub mod sim;
pub mod uapi;
pub mod w8a8;

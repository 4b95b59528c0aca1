//! Device shims: the host side of keel's NPU HAL (`keel_npu_hal`). Each device
//! implements `Device`, `SharedBuffers` and `Queue` exactly as a board's will;
//! errors are [`DeviceError`]s naming the device.
//!
//! - [`hexagon_sim`]: keel's Hexagon firmware under `qemu-hexagon`, buffers in a
//!   shared `/dev/shm` file, messages over the process's pipes.
//! - [`fastrpc`] (`hexagon`): a real DSP through the system's `libcdsprpc.so`
//!   (dlopen), rpcmem buffers, messages over a `dspqueue`.
//!
//! - [`rknpu`]: the RK3588 NPU through the mainline `rocket` driver's ioctls.
//!
//! [`any::AnyDevice`] wraps any of them so one engine type runs over both.
//!
//! Pieces: [`config`] (what to start), [`transport`] (the process and its framed
//! pipes), [`link`] (messages with timeouts and fatal-fault handling), [`shm`]
//! (the shared pool), [`error`].

pub mod any;
pub mod config;
pub mod fastrpc;
pub mod error;
pub mod hexagon_sim;
pub mod inflight;
pub mod link;
pub mod offload;
pub mod rknpu;
pub mod shm;
pub mod transport;


pub use config::SimConfig;
pub use error::DeviceError;
pub use hexagon_sim::{HexagonSim, SelfTestReport};

/// Device names `open` knows.
pub const KNOWN: &[&str] = &["hexagon-sim", "hexagon", "rknpu"];

#![doc = include_str!("../README.md")]
#![no_std]
#![warn(missing_docs)]
#![forbid(unsafe_code)]
// `x % n != 0` stays: `is_multiple_of` is newer than the workspace MSRV (1.85).
#![allow(unknown_lints, clippy::manual_is_multiple_of)]

pub mod buffer;
pub mod caps;
pub mod device;
pub mod error;
pub mod op;
pub mod selftest;
pub mod support;
pub mod tile;
pub mod wait;
pub mod wire;

pub use buffer::{BufferId, BufferRules};
pub use caps::{Arch, Caps, Identity, MemoryLimits, UnitState, Units};
pub use device::{BatchStatus, Completion, Device, Queue, Seq, SharedBuffers};
pub use error::{Error, ErrorKind, ErrorType};
pub use op::{Batch, DType, Layout, OpDesc, OpKind, Support, TensorDesc};

//! The float ops of a transformer layer, in scalar Hexagon float (QEMU runs it;
//! HVX float does not exist there), each over plain slices with a fixed order of
//! operations: the rules of keel's CPU reference (`keel_core::ops`), so a layer
//! run on the DSP gives the CPU's numbers. [`crate::exec`] maps op descriptors
//! onto these functions; they own no memory (scratch comes from the caller).
//!
//! - [`norm`]: RMSNorm (optionally times a weight row), softmax
//! - [`rope`]: rotary embedding, adjacent (normal) or half-split (NeoX) pairs
//! - [`act`]: SiLU, GELU, SwiGLU, GeGLU, add, mul
//! - [`attention`]: one query over a K/V cache, online softmax
//! - [`rows`]: embedding rows (dequantize F16/Q8_0/Q4_0/IQ4_NL), F32 → F16
//! - [`math`]: exp, sin/cos, tanh-GELU with the CPU reference's algorithms

pub mod act;
pub mod attention;
pub mod math;
pub mod norm;
pub mod rope;
pub mod rows;

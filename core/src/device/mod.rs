//! Running a model on NPUs through the HAL alone: [`engine`] (one device's share of a
//! placement: weights converted and repacked at load, the resident KV caches and
//! recurrent states, batches of products, of whole layers and of the whole forward
//! pass) over [`lower`] (each block's op list, [`crate::block::layer_ops`], as HAL op
//! batches). A host supplies only a `keel_npu_hal::{Device, SharedBuffers, Queue}`
//! implementation and an `embedded_hal::delay::DelayNs`.

pub mod engine;
pub mod lower;

pub use engine::{DeviceEngine, EngineError, Engines, LayerSlot, LoadScratch, Stage, Stats};

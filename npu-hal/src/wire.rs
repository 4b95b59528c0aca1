//! The wire protocol between host and firmware: postcard-encoded messages,
//! one per transport packet (a dspqueue message, a FastRPC buffer, a pipe frame).
//!
//! Rules that keep old firmware and new hosts talking:
//! - The first exchange is [`HostMsg::Hello`] → [`DeviceMsg::HelloAck`]; the device
//!   answers [`DeviceMsg::Error`] of kind `Protocol` to a magic or version it does
//!   not speak, and to anything before a successful hello.
//! - Message enums and every enum inside them are **append-only**: postcard
//!   encodes a variant as its index, so a new variant goes at the end and an old
//!   one is never removed or reordered. Changing a struct's fields bumps
//!   [`PROTOCOL_VERSION`]. The golden byte tests in `tests/wire_golden.rs` fail on drift.
//! - Descriptor tables are bounded ([`MAX_BUFFERS`], [`MAX_TENSORS`], [`MAX_OPS`])
//!   so both sides decode without an allocator.

use heapless::Vec;
use serde::{Deserialize, Serialize};

use crate::buffer::BufferId;
use crate::caps::{Caps, Identity};
use crate::device::{BatchStatus, Seq};
use crate::error::ErrorKind;
use crate::op::{Batch, BufferRef, OpDesc, TensorDesc};

/// `b"KEEL"` read little-endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"KEEL");
/// Version of this protocol.
/// 2: `OpKind::Attention` gained `window` (and ops 14–19 were appended).
pub const PROTOCOL_VERSION: u16 = 2;
/// Most buffers one batch may name.
pub const MAX_BUFFERS: usize = 16;
/// Most tensors one batch may describe (not fewer than [`MAX_OPS`]: a host that keeps
/// to a device's reported `max_batch_ops` then stays within an older firmware's
/// tensor table too, as long as its batches have no more tensors than ops).
pub const MAX_TENSORS: usize = 512;
/// Most ops one batch may carry: enough for the 30 layers of a SmolLM2-sized model
/// (17 ops each) as one batch.
pub const MAX_OPS: usize = 512;
/// Longest encoded message, bytes (a full batch with worst-case varints, every op an
/// `Attention` with its `window`, is 41,723 bytes; 40 KiB until protocol 2).
pub const MAX_MESSAGE: usize = 44 << 10;

/// An op batch on the wire: the three descriptor tables, by value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BatchMsg {
    /// Sequence number the completion will carry.
    pub seq: Seq,
    /// Buffer table.
    pub buffers: Vec<BufferRef, MAX_BUFFERS>,
    /// Tensor table.
    pub tensors: Vec<TensorDesc, MAX_TENSORS>,
    /// Op table, executed in order.
    pub ops: Vec<OpDesc, MAX_OPS>,
}

impl BatchMsg {
    /// Copies a batch into wire form; `Unsupported` if a table is too long.
    pub fn new(seq: Seq, batch: &Batch<'_>) -> Result<Self, ErrorKind> {
        let long = |_| ErrorKind::Unsupported;
        Ok(BatchMsg {
            seq,
            buffers: Vec::from_slice(batch.buffers).map_err(long)?,
            tensors: Vec::from_slice(batch.tensors).map_err(long)?,
            ops: Vec::from_slice(batch.ops).map_err(long)?,
        })
    }

    /// The tables as a [`Batch`] (to validate or execute).
    pub fn batch(&self) -> Batch<'_> {
        Batch { buffers: &self.buffers, tensors: &self.tensors, ops: &self.ops }
    }

    /// Seq 0 and empty tables: the slot [`decode_host`] decodes batches into (a `const`,
    /// so a firmware can keep it in a static).
    pub const fn empty() -> Self {
        BatchMsg { seq: 0, buffers: Vec::new(), tensors: Vec::new(), ops: Vec::new() }
    }
}

/// Host → device messages. Append-only.
// The batch variant is large on purpose: bounded tables by value, no allocator.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum HostMsg {
    /// Opens the conversation.
    Hello {
        /// Must be [`MAGIC`].
        magic: u32,
        /// The host's [`PROTOCOL_VERSION`].
        protocol_version: u16,
    },
    /// Asks for [`DeviceMsg::Caps`].
    QueryCaps,
    /// Device-private memory (for example a device-resident KV cache).
    AllocBuffer {
        /// Bytes wanted.
        size: u64,
    },
    /// Host shared memory to map on the device (a dma-buf / file descriptor).
    MapBuffer {
        /// Id the host chose for it.
        id: BufferId,
        /// Descriptor the device side can map (fd for FastRPC; for QEMU an fd
        /// number valid in the guest).
        fd: i32,
        /// Offset into the descriptor, bytes (4 KiB aligned).
        offset: u64,
        /// Length, bytes.
        len: u64,
    },
    /// Unmaps or frees a buffer.
    FreeBuffer {
        /// The buffer.
        id: BufferId,
    },
    /// Runs an op batch; answered by [`DeviceMsg::BatchDone`] with the same seq.
    SubmitBatch(BatchMsg),
    /// Runs the known-input test of [`crate::selftest`] for `seed`.
    SelfTest {
        /// Chosen by the host at random, so that a constant answer cannot pass.
        seed: u32,
    },
}

/// Device → host messages. Append-only.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum DeviceMsg {
    /// Answer to `Hello`.
    HelloAck {
        /// Who the device is; `identity.protocol_version` is what it speaks.
        identity: Identity,
    },
    /// Answer to `QueryCaps`.
    Caps(Caps),
    /// Answer to `AllocBuffer`.
    BufferAllocated {
        /// Id of the new buffer.
        id: BufferId,
        /// Bytes reserved (rounded by the device's rules).
        size: u64,
    },
    /// Answer to `MapBuffer`.
    BufferMapped {
        /// The buffer.
        id: BufferId,
        /// Its address in the device's address space.
        device_addr: u64,
    },
    /// Answer to `FreeBuffer`.
    BufferFreed {
        /// The buffer.
        id: BufferId,
    },
    /// Completion of a `SubmitBatch`.
    BatchDone {
        /// The batch.
        seq: Seq,
        /// Its outcome.
        status: BatchStatus,
    },
    /// Answer to `SelfTest`.
    SelfTestResult {
        /// The seed it ran with.
        seed: u32,
        /// [`crate::selftest::Digest`] of the block sums.
        digest: u32,
    },
    /// A request failed as a whole.
    Error {
        /// Why.
        kind: ErrorKind,
        /// Device-specific detail (an errno, a DSP error code), 0 if none.
        detail: u32,
    },
}

/// Encodes a message into `buf`, returning the used prefix.
pub fn encode<'b, T: Serialize>(msg: &T, buf: &'b mut [u8]) -> Result<&'b mut [u8], ErrorKind> {
    postcard::to_slice(msg, buf).map_err(|_| ErrorKind::InvalidArgument)
}

/// Decodes one message that must fill `bytes` exactly; anything else is `Protocol`.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ErrorKind> {
    match postcard::take_from_bytes(bytes) {
        Ok((msg, [])) => Ok(msg),
        _ => Err(ErrorKind::Protocol),
    }
}

/// [`HostMsg::SubmitBatch`]'s variant index, which postcard writes first (a varint).
const SUBMIT_BATCH: u32 = 5;

/// A host message as [`decode_host`] returns it.
// `Other` is as large as `HostMsg`; the batch, the frequent message, is by reference.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq)]
pub enum Request<'s> {
    /// A `SubmitBatch`, decoded into the caller's slot.
    Batch(&'s BatchMsg),
    /// Any other message, by value.
    Other(HostMsg),
}

/// [`decode`] of a [`HostMsg`] that writes a `SubmitBatch`'s tables straight into
/// `slot`, element by element: a batch is ~60 KiB by value (its tables at capacity,
/// `heapless::Vec`), which a by-value decode copies several times on the stack, about
/// 200 KB of copying per batch on the DSP. Accepts and rejects exactly the bytes
/// [`decode`] does (the same postcard reads in the same order; any error is
/// `Protocol`). On an error `slot` holds whatever was decoded so far.
pub fn decode_host<'s>(bytes: &[u8], slot: &'s mut BatchMsg) -> Result<Request<'s>, ErrorKind> {
    let mut de = postcard::Deserializer::from_bytes(bytes);
    if u32::deserialize(&mut de).map_err(|_| ErrorKind::Protocol)? != SUBMIT_BATCH {
        return decode::<HostMsg>(bytes).map(Request::Other);
    }
    decode_batch(&mut de, slot).map_err(|_| ErrorKind::Protocol)?;
    match de.finalize() {
        Ok([]) => Ok(Request::Batch(slot)),
        _ => Err(ErrorKind::Protocol),
    }
}

/// `BatchMsg`'s fields in order, each table as postcard writes a sequence: its length (a
/// varint of the target's `usize`) then the elements.
fn decode_batch<'de>(de: &mut postcard::Deserializer<'de, postcard::de_flavors::Slice<'de>>, slot: &mut BatchMsg) -> postcard::Result<()> {
    slot.seq = Seq::deserialize(&mut *de)?;
    table(de, &mut slot.buffers)?;
    table(de, &mut slot.tensors)?;
    table(de, &mut slot.ops)
}

fn table<'de, T: Deserialize<'de>, const N: usize>(de: &mut postcard::Deserializer<'de, postcard::de_flavors::Slice<'de>>, out: &mut Vec<T, N>) -> postcard::Result<()> {
    #[cfg(target_pointer_width = "16")]
    let n = u16::deserialize(&mut *de)? as usize;
    #[cfg(target_pointer_width = "32")]
    let n = u32::deserialize(&mut *de)? as usize;
    #[cfg(target_pointer_width = "64")]
    let n = u64::deserialize(&mut *de)? as usize;
    out.clear();
    for _ in 0..n {
        // heapless refuses a sequence longer than its capacity the same way.
        out.push(T::deserialize(&mut *de)?).map_err(|_| postcard::Error::DeserializeBadEncoding)?;
    }
    Ok(())
}

/// What a device answers to a `Hello`: `Ok` if it speaks the host's version.
pub fn check_hello(magic: u32, protocol_version: u16) -> Result<(), ErrorKind> {
    if magic == MAGIC && protocol_version == PROTOCOL_VERSION {
        Ok(())
    } else {
        Err(ErrorKind::Protocol)
    }
}

//! The host side's record of batches in flight, shared by the devices (hexagon-sim,
//! hexagon): whether a batch may be queued, which buffers each batch holds (the host must
//! not touch them), completions matched to batches by sequence number, and the oldest
//! batch's age for timeouts. Sized once at open: recording and completing a batch
//! allocate nothing.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use keel_npu_hal::device::{BatchStatus, Completion, Seq};
use keel_npu_hal::op::Batch;
use keel_npu_hal::wire::MAX_BUFFERS;
use keel_npu_hal::{Caps, ErrorKind};

/// One batch in flight.
pub struct Pending {
    /// Its sequence number.
    pub seq: Seq,
    /// When it was sent.
    pub sent: Instant,
    /// The ids of the buffers it names, `buffers[..n_buffers]` (by value: nothing allocated).
    pub buffers: [u32; MAX_BUFFERS],
    /// How many.
    pub n_buffers: usize,
}

/// Batches sent and not answered, and completions not yet collected.
#[derive(Default)]
pub struct InFlight {
    /// Sent, in order.
    pub pending: Vec<Pending>,
    /// Answered, not yet returned by `poll`.
    pub ready: VecDeque<Completion>,
}

impl InFlight {
    /// Room for `n` batches at once.
    pub fn with_capacity(n: usize) -> InFlight {
        InFlight { pending: Vec::with_capacity(n), ready: VecDeque::with_capacity(n) }
    }

    /// Batches submitted and not yet collected.
    pub fn len(&self) -> usize {
        self.pending.len() + self.ready.len()
    }

    /// Whether nothing is in flight or waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `batch` may be queued now on a device with `caps`; why not, in words.
    pub fn admit(&self, caps: &Caps, batch: &Batch<'_>) -> Result<(), (ErrorKind, String)> {
        if self.pending.len() >= usize::from(caps.max_in_flight) {
            return Err((ErrorKind::Busy, format!("{} batches already in flight", self.pending.len())));
        }
        if batch.ops.len() > usize::from(caps.max_batch_ops) {
            return Err((ErrorKind::Unsupported, format!("{} ops exceed the device's {} per batch", batch.ops.len(), caps.max_batch_ops)));
        }
        if batch.buffers.len() > MAX_BUFFERS {
            return Err((ErrorKind::Unsupported, format!("{} buffers exceed the wire's {MAX_BUFFERS}", batch.buffers.len())));
        }
        batch.validate().map_err(|k| (k, "bad batch: a tensor or op index is out of range or a tensor overruns its buffer".to_string()))
    }

    /// Records batch `seq` as sent now; the ids of the buffers it holds.
    pub fn add(&mut self, seq: Seq, batch: &Batch<'_>) -> &[u32] {
        let mut buffers = [0; MAX_BUFFERS];
        for (slot, r) in buffers.iter_mut().zip(batch.buffers) {
            *slot = r.id.0;
        }
        let n_buffers = batch.buffers.len().min(MAX_BUFFERS);
        self.pending.push(Pending { seq, sent: Instant::now(), buffers, n_buffers });
        let p = self.pending.last().expect("just pushed");
        &p.buffers[..p.n_buffers]
    }

    /// Batch `seq` ended: moved to `ready`; the buffers it held, or why the answer is wrong.
    pub fn finish(&mut self, seq: Seq, status: BatchStatus) -> Result<([u32; MAX_BUFFERS], usize), String> {
        let Some(i) = self.pending.iter().position(|p| p.seq == seq) else {
            let inflight: Vec<Seq> = self.pending.iter().map(|p| p.seq).collect();
            return Err(format!("completion for batch {seq}, which is not in flight (in flight: {inflight:?})"));
        };
        let p = self.pending.remove(i);
        self.ready.push_back(Completion { seq, status });
        Ok((p.buffers, p.n_buffers))
    }

    /// The oldest batch, if it has waited longer than `timeout`.
    pub fn overdue(&self, timeout: Duration) -> Option<Seq> {
        self.pending.first().filter(|p| p.sent.elapsed() > timeout).map(|p| p.seq)
    }
}

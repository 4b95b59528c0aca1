//! Blocking waits for no_std hosts without an executor: a small table of the
//! batches in flight, polled with [`embedded_hal::delay::DelayNs`] between
//! attempts. Time is counted as the sum of the delays asked for (a lower bound
//! of the real time; a host with a clock can pass a tighter `DelayNs`).
//! Completions of other batches that arrive meanwhile are kept, not lost.

use embedded_hal::delay::DelayNs;

use crate::device::{BatchStatus, Queue, Seq};
use crate::error::{Error, ErrorKind};
use crate::op::Batch;

/// Why a tracked submit or wait failed.
#[derive(Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum WaitError<E> {
    /// The device reported an error.
    Device(E),
    /// The batch did not complete within the timeout; it is still in flight.
    Timeout(Seq),
    /// The device completed a batch that is not in flight (protocol fault).
    UnknownCompletion(Seq),
    /// The tracker's table is full (`Busy`), or a seq was reused while in flight (`Protocol`).
    Table(ErrorKind),
    /// `wait` was asked for a seq that is not in flight.
    NotInFlight(Seq),
}

impl<E: Error> Error for WaitError<E> {
    fn kind(&self) -> ErrorKind {
        match self {
            WaitError::Device(e) => e.kind(),
            WaitError::Timeout(_) => ErrorKind::Timeout,
            WaitError::UnknownCompletion(_) => ErrorKind::Protocol,
            WaitError::Table(k) => *k,
            WaitError::NotInFlight(_) => ErrorKind::InvalidArgument,
        }
    }
}

/// How long to wait and how often to poll.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct WaitPolicy {
    /// Give up after this many microseconds of delays.
    pub timeout_us: u32,
    /// Delay between polls, in microseconds (at least 1).
    pub poll_us: u32,
}

/// The batches in flight (at most `N`) and their completions not yet collected.
#[derive(Debug, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Tracker<const N: usize> {
    slots: heapless::Vec<(Seq, Option<BatchStatus>), N>,
}

impl<const N: usize> Tracker<N> {
    /// An empty table.
    pub const fn new() -> Self {
        Tracker { slots: heapless::Vec::new() }
    }

    /// Batches submitted and not yet collected by `wait`.
    pub fn in_flight(&self) -> usize {
        self.slots.len()
    }

    /// Submits through the tracker; refuses (without touching the device) when the table is full.
    pub fn submit<Q: Queue>(&mut self, dev: &mut Q, batch: &Batch<'_>) -> Result<Seq, WaitError<Q::Error>> {
        if self.slots.is_full() {
            return Err(WaitError::Table(ErrorKind::Busy));
        }
        let seq = dev.submit(batch).map_err(WaitError::Device)?;
        if self.slots.iter().any(|s| s.0 == seq) {
            return Err(WaitError::Table(ErrorKind::Protocol));
        }
        // Cannot fail: checked for room above.
        let _ = self.slots.push((seq, None));
        Ok(seq)
    }

    /// Drains every completion the device has, recording each against its batch.
    pub fn drain<Q: Queue>(&mut self, dev: &mut Q) -> Result<(), WaitError<Q::Error>> {
        while let Some(c) = dev.poll().map_err(WaitError::Device)? {
            match self.slots.iter_mut().find(|s| s.0 == c.seq && s.1.is_none()) {
                Some(slot) => slot.1 = Some(c.status),
                None => return Err(WaitError::UnknownCompletion(c.seq)),
            }
        }
        Ok(())
    }

    /// Blocks until batch `seq` completes, then forgets it and returns its status.
    pub fn wait<Q: Queue, D: DelayNs>(
        &mut self,
        dev: &mut Q,
        seq: Seq,
        delay: &mut D,
        policy: WaitPolicy,
    ) -> Result<BatchStatus, WaitError<Q::Error>> {
        let pos = self.slots.iter().position(|s| s.0 == seq).ok_or(WaitError::NotInFlight(seq))?;
        let step = policy.poll_us.max(1);
        let mut waited: u32 = 0;
        loop {
            self.drain(dev)?;
            if let Some(status) = self.slots[pos].1 {
                self.slots.swap_remove(pos);
                return Ok(status);
            }
            if waited >= policy.timeout_us {
                return Err(WaitError::Timeout(seq));
            }
            delay.delay_us(step);
            waited = waited.saturating_add(step);
        }
    }
}

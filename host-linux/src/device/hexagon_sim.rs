//! The `hexagon-sim` device: keel's Hexagon firmware (`dsp-firmware`, the
//! `keel-dsp-device` ELF) run as real Hexagon machine code under `qemu-hexagon`,
//! behind the same HAL traits a board's FastRPC device implements.
//!
//! - Shared buffers live in one `/dev/shm` file ([`ShmPool`]) that both the host
//!   and the emulated DSP map `MAP_SHARED`: no copies, as with dma-buf.
//!   `MapBuffer.fd` is 0, the region the firmware opened from its command line.
//! - Messages (`keel_npu_hal::wire`) go over the process's stdin/stdout ([`Link`]).
//! - Open = start QEMU, versioned handshake, `QueryCaps` (measured by the
//!   firmware: scratch granted, shared size, HVX verified at start), then a
//!   known-input self-test with a fresh seed, checked here; a device whose
//!   vector unit computes wrong (e.g. zeros) is refused with the failed check named.
//! - Every wait is bounded by [`SimConfig::timeout`] (per reply; per batch from
//!   its submission). A dead process, a hang past the timeout, a malformed or
//!   out-of-sequence reply end the session with an error naming the device and
//!   what happened; the process is killed, and [`HexagonSim::open`] starts afresh.
//! - After open and the buffers' allocation and mapping, `submit`, `poll`, `wait`
//!   and `host_view` allocate nothing when they succeed: replies are read in place
//!   from the transport's one receive buffer, the bookkeeping of batches in flight
//!   is sized at open from `max_in_flight`, and what a wait is for is put in words
//!   only when it fails (`tests/sim_no_alloc.rs` counts).

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use keel_npu_hal::device::{BatchStatus, Completion, Device, Queue, Seq, SharedBuffers};
use keel_npu_hal::op::Batch;
use keel_npu_hal::wire::{BatchMsg, DeviceMsg, HostMsg, MAGIC, MAX_MESSAGE, PROTOCOL_VERSION};
use keel_npu_hal::{selftest, BufferId, Caps, ErrorKind, ErrorType, Identity, UnitState};

use super::config::SimConfig;
use super::error::DeviceError;
use super::inflight::InFlight;
use super::link::Link;
use super::shm::ShmPool;
use super::transport::Transport;

/// What the open-time self-test found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelfTestReport {
    /// The firmware's own check of its HVX path when it started.
    pub at_start: UnitState,
    /// The seed the host chose.
    pub seed: u32,
    /// The digest the device returned.
    pub digest: u32,
    /// The digest a correct device returns.
    pub expected: u32,
    /// Round trip of the self-test request.
    pub elapsed: Duration,
}

impl SelfTestReport {
    /// Whether both checks passed.
    pub fn passed(&self) -> bool {
        self.at_start == UnitState::Verified && self.digest == self.expected
    }
}

struct Buf {
    offset: u64,
    size: u64,
    mapped: bool,
    busy: u32,
}


/// An opened hexagon-sim device.
pub struct HexagonSim {
    link: Link,
    identity: Identity,
    caps: Caps,
    selftest: SelfTestReport,
    pool: ShmPool,
    bufs: HashMap<u32, Buf>,
    next_id: u32,
    next_seq: Seq,
    flight: InFlight,
}

impl ErrorType for HexagonSim {
    type Error = DeviceError;
}

impl HexagonSim {
    /// Starts the emulator on the firmware, shakes hands, reads the capabilities
    /// and runs the self-test; refuses a device that fails any of it.
    pub fn open(cfg: &SimConfig) -> Result<HexagonSim, DeviceError> {
        let cpu = &cfg.cpu;
        let short = format!("hexagon-sim ({} -cpu {cpu})", cfg.qemu.display());
        if let Some(missing) = cfg.missing() {
            return Err(DeviceError::new(&short, ErrorKind::Other, missing));
        }
        let mut pool = ShmPool::create(cfg.pool_bytes)
            .map_err(|e| DeviceError::new(&short, ErrorKind::OutOfMemory, format!("cannot create the shared-memory file: {e}")))?;
        let mut cmd = Command::new(&cfg.qemu);
        cmd.args(["-cpu", cpu]).arg(&cfg.elf).arg("--shm").arg(pool.path()).args(["--vtcm", &cfg.vtcm_bytes.to_string()]).args(["--threads", &cfg.threads.to_string()]);
        if let Some(f) = &cfg.fault {
            cmd.args(["--fault", f]);
        }
        let t = Transport::spawn(cmd, MAX_MESSAGE)
            .map_err(|e| DeviceError::new(&short, ErrorKind::Other, format!("cannot start {}: {e}", cfg.qemu.display())))?;
        let name = format!("hexagon-sim ({} -cpu {cpu}, pid {})", cfg.qemu.display(), t.pid());
        let mut link = Link::new(name, cfg.timeout, t);

        let hello = HostMsg::Hello { magic: MAGIC, protocol_version: PROTOCOL_VERSION };
        let identity = match link.call(&hello, "the handshake (HelloAck)")? {
            DeviceMsg::HelloAck { identity } => identity,
            DeviceMsg::Error { kind: ErrorKind::Protocol, detail } => {
                let w = format!("the firmware refused protocol version {PROTOCOL_VERSION} (it speaks version {detail})");
                return Err(link.fail(ErrorKind::Protocol, w));
            }
            other => return Err(link.unexpected(other, "the handshake")),
        };
        if identity.protocol_version != PROTOCOL_VERSION {
            let v = identity.protocol_version;
            return Err(link.fail(ErrorKind::Protocol, format!("protocol version mismatch: the firmware speaks version {v}, the host {PROTOCOL_VERSION}")));
        }
        // The firmware opened the file before answering: drop its name now.
        pool.unlink();
        let caps = match link.call(&HostMsg::QueryCaps, "the capabilities (Caps)")? {
            DeviceMsg::Caps(c) => c,
            other => return Err(link.unexpected(other, "QueryCaps")),
        };
        if caps.memory.buffers.rounded_size(1).is_err() || caps.memory.va_budget > pool.len() {
            return Err(link.fail(ErrorKind::Protocol, format!("nonsense capabilities: {caps:?}")));
        }
        let rules = caps.memory.buffers;
        pool.set_granule(u64::from(rules.granule.max(rules.align)));
        let seed = fresh_seed();
        let start = Instant::now();
        let digest = match link.call(&HostMsg::SelfTest { seed }, "the self-test result")? {
            DeviceMsg::SelfTestResult { seed: s, digest } if s == seed => digest,
            other => return Err(link.unexpected(other, "SelfTest")),
        };
        let report = SelfTestReport { at_start: caps.units.hvx, seed, digest, expected: selftest::expected_digest(seed), elapsed: start.elapsed() };
        if !report.passed() {
            let w = format!(
                "self-test failed, device refused: HVX int8 matvec ({} rows × {} blocks, seed {seed:#010x}) gave digest {digest:#010x}, \
                 expected {:#010x}; the firmware's own start-up check says HVX is {:?}. The vector unit does not compute \
                 (it may return zeros).",
                selftest::ROWS,
                selftest::BLOCKS,
                report.expected,
                report.at_start
            );
            return Err(link.fail(ErrorKind::BadResponse, w));
        }
        // Room for every batch the device takes at once: the queue's steady state allocates nothing.
        let in_flight = usize::from(caps.max_in_flight);
        link.done.reserve(in_flight);
        let dev = HexagonSim {
            link,
            identity,
            caps,
            selftest: report,
            pool,
            bufs: HashMap::new(),
            next_id: 1,
            next_seq: 1,
            flight: InFlight::with_capacity(in_flight),
        };
        Ok(dev)
    }

    /// The device's name in errors (includes the QEMU process id).
    pub fn name(&self) -> &str {
        &self.link.name
    }

    /// The QEMU process id (fault tests kill it).
    pub fn pid(&self) -> u32 {
        self.link.pid()
    }

    /// The open-time self-test.
    pub fn self_test(&self) -> &SelfTestReport {
        &self.selftest
    }

    /// Bytes of the shared pool (what `alloc` can hand out in total).
    pub fn shared_bytes(&self) -> u64 {
        self.pool.len()
    }

    /// Bytes of shared memory allocated to buffers now (rounded as the device rules say).
    pub fn allocated_bytes(&self) -> u64 {
        self.bufs.values().map(|b| b.size).sum()
    }

    /// Batches submitted and not yet collected.
    pub fn in_flight(&self) -> usize {
        self.flight.len()
    }

    /// Blocks until batch `seq` completes (or the timeout, counted from its submission).
    pub fn wait(&mut self, seq: Seq) -> Result<BatchStatus, DeviceError> {
        loop {
            self.collect()?;
            if let Some(c) = self.flight.ready.iter().position(|c| c.seq == seq).and_then(|i| self.flight.ready.remove(i)) {
                return Ok(c.status);
            }
            let Some(p) = self.flight.pending.iter().find(|p| p.seq == seq) else {
                return Err(self.link.err(ErrorKind::InvalidArgument, format!("batch {seq} is not in flight")));
            };
            let deadline = p.sent + self.link.timeout;
            match self.link.recv(Some(deadline), format_args!("the completion of batch {seq}"))? {
                Some(DeviceMsg::BatchDone { seq, status }) => self.link.done.push_back((seq, status)),
                Some(other) => return Err(self.link.fail(ErrorKind::Protocol, format!("expected BatchDone, got {other:?}"))),
                None => {}
            }
        }
    }

    /// Moves completions the link received to `ready`, checking each against the batches in flight.
    fn collect(&mut self) -> Result<(), DeviceError> {
        while let Some((seq, status)) = self.link.done.pop_front() {
            let (held, n) = self.flight.finish(seq, status).map_err(|w| self.link.fail(ErrorKind::Protocol, w))?;
            for id in &held[..n] {
                if let Some(b) = self.bufs.get_mut(id) {
                    b.busy -= 1;
                }
            }
        }
        Ok(())
    }

    fn buf(&self, id: BufferId) -> Result<&Buf, DeviceError> {
        self.bufs.get(&id.0).ok_or_else(|| self.link.err(ErrorKind::InvalidArgument, format!("unknown buffer {}", id.0)))
    }
}

/// A seed for the self-test that a constant answer cannot match.
pub(crate) fn fresh_seed() -> u32 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (t.subsec_nanos() ^ (t.as_secs() as u32).rotate_left(13) ^ std::process::id().rotate_left(7)).wrapping_mul(0x9e37_79b9)
}

impl Device for HexagonSim {
    fn identity(&self) -> &Identity {
        &self.identity
    }
    fn caps(&self) -> &Caps {
        &self.caps
    }
}

impl SharedBuffers for HexagonSim {
    fn alloc(&mut self, size: u64) -> Result<BufferId, DeviceError> {
        self.link.check()?;
        let size = self.buffer_rules().rounded_size(size).map_err(|k| self.link.err(k, format!("cannot allocate {size} bytes")))?;
        let offset = self.pool.place(size).ok_or_else(|| {
            self.link.err(ErrorKind::OutOfMemory, format!("{size} bytes do not fit the {}-byte shared pool", self.pool.len()))
        })?;
        let id = self.next_id;
        self.next_id += 1;
        self.bufs.insert(id, Buf { offset, size, mapped: false, busy: 0 });
        Ok(BufferId(id))
    }

    fn map(&mut self, id: BufferId) -> Result<(), DeviceError> {
        let b = self.buf(id)?;
        if b.mapped {
            return Ok(());
        }
        let msg = HostMsg::MapBuffer { id, fd: 0, offset: b.offset, len: b.size };
        match self.link.call(&msg, "MapBuffer")? {
            DeviceMsg::BufferMapped { id: got, .. } if got == id => {}
            other => return Err(self.link.unexpected(other, "MapBuffer")),
        }
        if let Some(b) = self.bufs.get_mut(&id.0) {
            b.mapped = true;
        }
        Ok(())
    }

    fn host_view(&mut self, id: BufferId) -> Result<&mut [u8], DeviceError> {
        self.collect()?;
        let b = self.buf(id)?;
        if b.busy > 0 {
            return Err(self.link.err(ErrorKind::Busy, format!("buffer {} is named by a batch in flight", id.0)));
        }
        let (offset, size) = (b.offset, b.size);
        let pool_len = self.pool.len();
        let link = &self.link;
        self.pool.bytes_mut(offset, size).ok_or_else(|| link.err(ErrorKind::Other, format!("buffer {} lies outside the {pool_len}-byte pool", id.0)))
    }

    fn free(&mut self, id: BufferId) -> Result<(), DeviceError> {
        self.collect()?;
        let b = self.buf(id)?;
        if b.busy > 0 {
            return Err(self.link.err(ErrorKind::Busy, format!("buffer {} is named by a batch in flight", id.0)));
        }
        let (mapped, offset) = (b.mapped, b.offset);
        if mapped {
            match self.link.call(&HostMsg::FreeBuffer { id }, "FreeBuffer")? {
                DeviceMsg::BufferFreed { id: got } if got == id => {}
                other => return Err(self.link.unexpected(other, "FreeBuffer")),
            }
        }
        self.pool.release(offset);
        self.bufs.remove(&id.0);
        Ok(())
    }
}

impl Queue for HexagonSim {
    fn submit(&mut self, batch: &Batch<'_>) -> Result<Seq, DeviceError> {
        self.link.check()?;
        self.collect()?;
        self.flight.admit(&self.caps, batch).map_err(|(k, w)| self.link.err(k, w))?;
        for r in batch.buffers {
            let b = self.buf(r.id)?;
            if !b.mapped || r.size > b.size {
                return Err(self.link.err(ErrorKind::InvalidArgument, format!("buffer {} is not mapped or is smaller than {} bytes", r.id.0, r.size)));
            }
        }
        let seq = self.next_seq;
        let msg = BatchMsg::new(seq, batch).map_err(|k| self.link.err(k, "batch tables exceed the wire limits"))?;
        self.link.send(&HostMsg::SubmitBatch(msg))?;
        self.next_seq = self.next_seq.wrapping_add(1);
        for id in self.flight.add(seq, batch) {
            if let Some(b) = self.bufs.get_mut(id) {
                b.busy += 1;
            }
        }
        Ok(seq)
    }

    fn poll(&mut self) -> Result<Option<Completion>, DeviceError> {
        while let Some(m) = self.link.recv(None, "a batch completion")? {
            match m {
                DeviceMsg::BatchDone { seq, status } => self.link.done.push_back((seq, status)),
                other => return Err(self.link.fail(ErrorKind::Protocol, format!("unsolicited message {other:?}"))),
            }
        }
        self.collect()?;
        if let Some(c) = self.flight.ready.pop_front() {
            return Ok(Some(c));
        }
        if let Some(seq) = self.flight.overdue(self.link.timeout) {
            let t = self.link.timeout;
            return Err(self.link.fail(ErrorKind::Timeout, format!("batch {seq} did not complete within {t:?}; the device is hung and was killed")));
        }
        Ok(None)
    }
}

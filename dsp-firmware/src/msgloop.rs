//! The device's message loop: wire messages (`keel_npu_hal::wire`, postcard)
//! framed on a byte stream as a little-endian `u32` length then the message.
//! Under QEMU the stream is the ELF's stdin (host → DSP) and stdout (DSP → host);
//! on a board it would be a dspqueue. One reply per request, in order.
//!
//! Rules: the first message must be `Hello` with our magic and version (else
//! `Error { Protocol }`); `QueryCaps` answers with what was measured at start
//! (scratch granted, shared region size, HVX verified by the self-test);
//! `SubmitBatch` is answered by `BatchDone` with the batch's sequence number.
//! A frame longer than `MAX_MESSAGE` cannot be resynchronised: the loop exits.

use keel_npu_hal::caps::{Arch, Caps, DTypeSet, Identity, MemoryLimits, UnitState, Units};
use keel_npu_hal::op::DType;
use keel_npu_hal::wire::{self, BatchMsg, DeviceMsg, HostMsg, Request, MAX_MESSAGE, MAX_OPS, PROTOCOL_VERSION};
use keel_npu_hal::{BufferRules, ErrorKind};

use keel_core::exec::{run_batch_observed, Buffers, Scratch};
use keel_core::parallel::Parallel;
use keel_npu_hal::BufferId;

use crate::args::Fault;
use crate::shm::SharedRegion;
use crate::sys;

/// `major << 16 | minor << 8 | patch` of this crate.
pub const FIRMWARE_VERSION: u32 = 0x0001_0400;
/// Batches the host may have in flight (the pipe holds them; they run in order).
pub const MAX_IN_FLIGHT: u8 = 8;

/// Hexagon version this build targets. QEMU's user mode hides the REV system
/// register, so the build's target is what the firmware can know; on a board
/// the skel reads the revision from QuRT.
pub const fn arch_version() -> u8 {
    if cfg!(target_feature = "v73") {
        73
    } else if cfg!(target_feature = "v69") {
        69
    } else if cfg!(target_feature = "v68") {
        68
    } else {
        67
    }
}


/// What the firmware measured at start.
pub struct Measured {
    /// Scratch (VTCM) bytes granted and present.
    pub scratch_bytes: usize,
    /// Size of the shared region, bytes.
    pub shared_bytes: u64,
    /// Page size: shared buffers start and end on it.
    pub page: u32,
    /// Result of the start-up self-test of the HVX path.
    pub hvx: UnitState,
    /// Hardware threads running the products (reported as HVX contexts).
    pub threads: u8,
}

/// The capabilities this firmware reports.
pub fn caps(m: &Measured) -> Caps {
    Caps {
        units: Units { hvx_contexts: m.threads.max(1), hvx: m.hvx, hmx: UnitState::Absent, npu_cores: 0, npu: UnitState::Absent },
        memory: MemoryLimits {
            va_budget: m.shared_bytes,
            scratch_bytes: m.scratch_bytes as u32,
            buffers: BufferRules { align: m.page, granule: m.page, max_size: m.shared_bytes },
        },
        ops: keel_core::exec::op_set(),
        matmul_weights: DTypeSet::default().with(DType::Q4_0).with(DType::Q8_0).with(DType::IQ4NL),
        max_in_flight: MAX_IN_FLIGHT,
        max_batch_ops: MAX_OPS as u16,
    }
}

/// Where a device's buffers come from: the `/dev/shm` region under qemu-hexagon
/// ([`SharedRegion`], mapped by `MapBuffer` messages), or the buffer references of the
/// current dspqueue packet in the FastRPC skel (mapped by the host's `fastrpc_mmap`).
pub trait Mapper: Buffers {
    /// Maps a buffer the host names; the device address.
    fn map(&mut self, id: BufferId, fd: i32, offset: u64, len: u64) -> Result<u64, ErrorKind>;
    /// Unmaps it.
    fn free(&mut self, id: BufferId) -> Result<(), ErrorKind>;
}

impl Mapper for SharedRegion {
    fn map(&mut self, id: BufferId, fd: i32, offset: u64, len: u64) -> Result<u64, ErrorKind> {
        SharedRegion::map(self, id, fd, offset, len)
    }
    fn free(&mut self, id: BufferId) -> Result<(), ErrorKind> {
        SharedRegion::free(self, id)
    }
}

/// The loop's state.
pub struct Device<'a, R: Mapper = SharedRegion> {
    /// Misbehaviour asked for on the command line.
    pub fault: Fault,
    /// The buffers.
    pub region: R,
    /// Scratch (VTCM), at the granted size.
    pub scratch: &'a mut [u8],
    /// Reported capabilities.
    pub caps: Caps,
    /// The threads a batch's products are split over.
    pub par: &'a dyn Parallel,
    /// Where each `SubmitBatch` is decoded (`wire::decode_host`): ~60 KiB kept out of
    /// the stack and never copied.
    batch: &'a mut BatchMsg,
    greeted: bool,
}

enum Reply {
    Msg(DeviceMsg),
    Raw(&'static [u8]),
}

impl<'a, R: Mapper> Device<'a, R> {
    /// A device that has not been greeted yet, decoding batches into `batch`.
    pub fn new(fault: Fault, region: R, scratch: &'a mut [u8], caps: Caps, par: &'a dyn Parallel, batch: &'a mut BatchMsg) -> Self {
        Device { fault, region, scratch, caps, par, batch, greeted: false }
    }

    /// Answers one message (`input`) into `out`; the answer's length.
    pub fn answer(&mut self, input: &[u8], out: &mut [u8]) -> Result<usize, ErrorKind> {
        let reply = match wire::decode_host(input, self.batch) {
            Ok(Request::Batch(_)) if !self.greeted => Reply::Msg(DeviceMsg::Error { kind: ErrorKind::Protocol, detail: 0 }),
            Ok(Request::Batch(b)) => submit(b, self.fault, &self.region, &self.caps, self.scratch, self.par),
            Ok(Request::Other(msg)) => self.handle(msg),
            Err(kind) => Reply::Msg(DeviceMsg::Error { kind, detail: 0 }),
        };
        match reply {
            Reply::Msg(m) => wire::encode(&m, out).map(|b| b.len()),
            Reply::Raw(bytes) => {
                out.get_mut(..bytes.len()).ok_or(ErrorKind::InvalidArgument)?.copy_from_slice(bytes);
                Ok(bytes.len())
            }
        }
    }

    /// Serves frames from stdin until it closes; never returns.
    pub fn serve(&mut self, inbuf: &mut [u8; MAX_MESSAGE], outbuf: &mut [u8; MAX_MESSAGE + 4]) -> ! {
        loop {
            let mut len = [0u8; 4];
            match sys::read_exact(0, &mut len) {
                Some(true) => {}
                Some(false) => sys::exit(0), // the host closed the pipe: done
                None => sys::exit(4),
            }
            let n = u32::from_le_bytes(len) as usize;
            if n > MAX_MESSAGE {
                self.send(Reply::Msg(DeviceMsg::Error { kind: ErrorKind::Protocol, detail: n as u32 }), outbuf);
                sys::exit(5);
            }
            if sys::read_exact(0, &mut inbuf[..n]) != Some(true) {
                sys::exit(4);
            }
            let (head, body) = outbuf.split_at_mut(4);
            let Ok(n) = self.answer(&inbuf[..n], body) else { sys::exit(6) };
            head.copy_from_slice(&(n as u32).to_le_bytes());
            if !sys::write_all(1, &outbuf[..4 + n]) {
                sys::exit(7);
            }
        }
    }

    fn send(&self, reply: Reply, outbuf: &mut [u8; MAX_MESSAGE + 4]) {
        let (head, body) = outbuf.split_at_mut(4);
        let n = match reply {
            Reply::Msg(m) => match wire::encode(&m, body) {
                Ok(b) => b.len(),
                Err(_) => sys::exit(6),
            },
            Reply::Raw(bytes) => {
                body[..bytes.len()].copy_from_slice(bytes);
                bytes.len()
            }
        };
        head.copy_from_slice(&(n as u32).to_le_bytes());
        if !sys::write_all(1, &outbuf[..4 + n]) {
            sys::exit(7);
        }
    }

    fn handle(&mut self, msg: HostMsg) -> Reply {
        let err = |kind| Reply::Msg(DeviceMsg::Error { kind, detail: 0 });
        if !self.greeted && !matches!(msg, HostMsg::Hello { .. }) {
            return err(ErrorKind::Protocol);
        }
        Reply::Msg(match msg {
            HostMsg::Hello { magic, protocol_version } => {
                if wire::check_hello(magic, protocol_version).is_err() {
                    return Reply::Msg(DeviceMsg::Error { kind: ErrorKind::Protocol, detail: u32::from(PROTOCOL_VERSION) });
                }
                self.greeted = true;
                let version = if self.fault == Fault::OtherVersion { PROTOCOL_VERSION + 1 } else { PROTOCOL_VERSION };
                let arch = Arch::Hexagon { version: arch_version() };
                DeviceMsg::HelloAck { identity: Identity { arch, firmware_version: FIRMWARE_VERSION, protocol_version: version, emulated: true } }
            }
            HostMsg::QueryCaps => DeviceMsg::Caps(self.caps),
            // Device-private memory is not offered yet: every buffer is host-shared.
            HostMsg::AllocBuffer { .. } => return err(ErrorKind::Unsupported),
            HostMsg::MapBuffer { id, fd, offset, len } => match self.region.map(id, fd, offset, len) {
                Ok(device_addr) => DeviceMsg::BufferMapped { id, device_addr },
                Err(kind) => return err(kind),
            },
            HostMsg::FreeBuffer { id } => match self.region.free(id) {
                Ok(()) => DeviceMsg::BufferFreed { id },
                Err(kind) => return err(kind),
            },
            HostMsg::SelfTest { seed } => match crate::selftest::run(seed, &mut Scratch::new(self.scratch)) {
                Ok(digest) => DeviceMsg::SelfTestResult { seed, digest },
                Err(kind) => return err(kind),
            },
            // `decode_host` puts batches in the slot; one given whole runs the same way.
            HostMsg::SubmitBatch(b) => return submit(&b, self.fault, &self.region, &self.caps, self.scratch, self.par),
        })
    }
}

/// Runs a batch (after the faults asked for on the command line) and answers
/// `BatchDone` with its status.
fn submit<R: Mapper>(b: &BatchMsg, fault: Fault, region: &R, caps: &Caps, scratch: &mut [u8], par: &dyn Parallel) -> Reply {
    match fault {
        Fault::HangOnBatch => loop {
            sys::sleep_ms(1000);
        },
        Fault::MalformedReply => return Reply::Raw(&[0xff, 0xff, 0xff, 0xff, 0x7f]),
        _ => {}
    }
    let batch = b.batch();
    crate::cost::batch(&batch);
    let status = run_batch_observed(&batch, region, caps, &mut Scratch::new(scratch), par, |op| crate::cost::op(batch.tensors, op));
    let seq = if fault == Fault::WrongSeq { b.seq.wrapping_add(1000) } else { b.seq };
    Reply::Msg(DeviceMsg::BatchDone { seq, status })
}

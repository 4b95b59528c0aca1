//! A software test double for the device traits, with faults to inject. It
//! runs `Add` and `Mul` on F32 tensors (enough to see data go through shared
//! buffers) and fails every other op with `Unsupported`.

use std::collections::VecDeque;

use keel_npu_hal::buffer::{BufferId, BufferRules};
use keel_npu_hal::caps::{Arch, Caps, DTypeSet, Identity, MemoryLimits, OpSet, UnitState, Units};
use keel_npu_hal::device::{BatchStatus, Completion, Device, Queue, Seq, SharedBuffers};
use keel_npu_hal::error::{Error, ErrorKind, ErrorType};
use keel_npu_hal::op::{Batch, DType, OpDesc, OpKind, TensorDesc};

#[derive(Debug, PartialEq, Eq)]
pub struct MockError(pub ErrorKind);

impl Error for MockError {
    fn kind(&self) -> ErrorKind {
        self.0
    }
}

/// Faults the mock can be told to commit.
#[derive(Default)]
pub struct Faults {
    /// The n-th `alloc` (0-based) fails with `OutOfMemory`.
    pub oom_on_alloc: Option<usize>,
    /// The batch with this seq never completes.
    pub drop_seq: Option<Seq>,
    /// Polls before a batch completes, per seq (default 0: on the next poll).
    pub latency: Vec<(Seq, u32)>,
    /// After this many polls every call fails with `DeviceLost`.
    pub lost_after_polls: Option<u32>,
    /// Emit a completion for a seq that was never submitted.
    pub spurious: Option<Seq>,
}

struct Buf {
    data: Vec<u8>,
    mapped: bool,
    busy: u32,
}

struct Pending {
    seq: Seq,
    polls_left: u32,
    buffers: Vec<usize>,
    status: BatchStatus,
}

pub struct MockDevice {
    pub identity: Identity,
    pub caps: Caps,
    pub faults: Faults,
    pub submits: usize,
    bufs: Vec<Option<Buf>>,
    pending: VecDeque<Pending>,
    allocs: usize,
    polls: u32,
    next_seq: Seq,
}

pub fn hexagon_caps(hvx: UnitState) -> Caps {
    let mut ops = OpSet::default();
    for code in 0..=13 {
        ops = ops.with(code);
    }
    Caps {
        units: Units { hvx_contexts: 4, hvx, hmx: UnitState::Absent, npu_cores: 0, npu: UnitState::Absent },
        memory: MemoryLimits { va_budget: 3 << 30, scratch_bytes: 8 << 20, buffers: BufferRules { align: 4096, granule: 4096, max_size: 1 << 24 } },
        ops,
        matmul_weights: DTypeSet::default().with(DType::Q4_0).with(DType::Q8_0).with(DType::IQ4NL),
        max_in_flight: 4,
        max_batch_ops: 32,
    }
}

impl MockDevice {
    pub fn new(faults: Faults) -> Self {
        MockDevice {
            identity: Identity { arch: Arch::Software, firmware_version: 0x0001_0000, protocol_version: 1, emulated: true },
            caps: hexagon_caps(UnitState::Verified),
            faults,
            submits: 0,
            bufs: Vec::new(),
            pending: VecDeque::new(),
            allocs: 0,
            polls: 0,
            next_seq: 100,
        }
    }

    fn lost(&self) -> Result<(), MockError> {
        match self.faults.lost_after_polls {
            Some(n) if self.polls >= n => Err(MockError(ErrorKind::DeviceLost)),
            _ => Ok(()),
        }
    }

    fn buf(&mut self, id: BufferId) -> Result<&mut Buf, MockError> {
        self.bufs.get_mut(id.0 as usize).and_then(Option::as_mut).ok_or(MockError(ErrorKind::InvalidArgument))
    }

    fn run(&mut self, b: &Batch<'_>) -> BatchStatus {
        for (i, op) in b.ops.iter().enumerate() {
            if let Err(kind) = self.run_op(b, op) {
                return BatchStatus::Failed { op: i as u16, kind };
            }
        }
        BatchStatus::Done
    }

    fn read(&self, b: &Batch<'_>, t: &TensorDesc) -> Vec<f32> {
        let buf = self.bufs[b.buffers[t.buffer as usize].id.0 as usize].as_ref().unwrap();
        let n = t.n_elements() as usize;
        buf.data[t.offset as usize..][..4 * n].chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    fn run_op(&mut self, b: &Batch<'_>, op: &OpDesc) -> Result<(), ErrorKind> {
        let f: fn(f32, f32) -> f32 = match op.kind {
            OpKind::Add => |x, y| x + y,
            OpKind::Mul => |x, y| x * y,
            _ => return Err(ErrorKind::Unsupported),
        };
        let t = |i: Option<u16>| b.tensors[i.unwrap() as usize];
        let (x, y, d) = (t(op.src[0]), t(op.src[1]), t(Some(op.dst)));
        let contiguous = [x, y, d].iter().all(|t| TensorDesc::contiguous(t.dtype, t.ne, t.buffer, t.offset) == Some(*t));
        if !contiguous || x.ne != y.ne || x.ne != d.ne || [x, y, d].iter().any(|t| t.dtype != DType::F32) {
            return Err(ErrorKind::Unsupported);
        }
        let out: Vec<f32> = self.read(b, &x).iter().zip(self.read(b, &y)).map(|(&p, q)| f(p, q)).collect();
        let buf = self.bufs[b.buffers[d.buffer as usize].id.0 as usize].as_mut().unwrap();
        for (i, v) in out.iter().enumerate() {
            buf.data[d.offset as usize + 4 * i..][..4].copy_from_slice(&v.to_le_bytes());
        }
        Ok(())
    }
}

impl ErrorType for MockDevice {
    type Error = MockError;
}

impl Device for MockDevice {
    fn identity(&self) -> &Identity {
        &self.identity
    }
    fn caps(&self) -> &Caps {
        &self.caps
    }
}

impl SharedBuffers for MockDevice {
    fn alloc(&mut self, size: u64) -> Result<BufferId, MockError> {
        self.lost()?;
        let n = self.allocs;
        self.allocs += 1;
        if self.faults.oom_on_alloc == Some(n) {
            return Err(MockError(ErrorKind::OutOfMemory));
        }
        let size = self.buffer_rules().rounded_size(size).map_err(MockError)?;
        self.bufs.push(Some(Buf { data: vec![0; size as usize], mapped: false, busy: 0 }));
        Ok(BufferId(self.bufs.len() as u32 - 1))
    }

    fn map(&mut self, id: BufferId) -> Result<(), MockError> {
        self.lost()?;
        self.buf(id)?.mapped = true;
        Ok(())
    }

    fn host_view(&mut self, id: BufferId) -> Result<&mut [u8], MockError> {
        let b = self.buf(id)?;
        if b.busy > 0 {
            return Err(MockError(ErrorKind::Busy));
        }
        Ok(&mut b.data)
    }

    fn free(&mut self, id: BufferId) -> Result<(), MockError> {
        if self.buf(id)?.busy > 0 {
            return Err(MockError(ErrorKind::Busy));
        }
        self.bufs[id.0 as usize] = None;
        Ok(())
    }
}

impl Queue for MockDevice {
    fn submit(&mut self, batch: &Batch<'_>) -> Result<Seq, MockError> {
        self.lost()?;
        self.submits += 1;
        if self.pending.len() >= usize::from(self.caps.max_in_flight) {
            return Err(MockError(ErrorKind::Busy));
        }
        batch.validate().map_err(MockError)?;
        let mut used = Vec::new();
        for r in batch.buffers {
            let b = self.buf(r.id)?;
            if !b.mapped || b.data.len() as u64 != r.size {
                return Err(MockError(ErrorKind::InvalidArgument));
            }
            used.push(r.id.0 as usize);
        }
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        // The device "runs" the batch now but reports it later, as hardware would.
        let status = self.run(batch);
        used.iter().for_each(|&i| self.bufs[i].as_mut().unwrap().busy += 1);
        let polls_left = self.faults.latency.iter().find(|l| l.0 == seq).map_or(0, |l| l.1);
        self.pending.push_back(Pending { seq, polls_left, buffers: used, status });
        Ok(seq)
    }

    fn poll(&mut self) -> Result<Option<Completion>, MockError> {
        self.lost()?;
        self.polls += 1;
        if let Some(seq) = self.faults.spurious.take() {
            return Ok(Some(Completion { seq, status: BatchStatus::Done }));
        }
        let drop = self.faults.drop_seq;
        let ready = self.pending.iter().position(|p| p.polls_left == 0 && Some(p.seq) != drop);
        self.pending.iter_mut().for_each(|p| p.polls_left = p.polls_left.saturating_sub(1));
        let Some(i) = ready else { return Ok(None) };
        let p = self.pending.remove(i).unwrap();
        for b in p.buffers {
            if let Some(buf) = self.bufs[b].as_mut() {
                buf.busy -= 1;
            }
        }
        Ok(Some(Completion { seq: p.seq, status: p.status }))
    }
}

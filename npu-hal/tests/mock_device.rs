//! The device traits and the blocking tracker, driven through a mock device
//! with injected faults: timeouts, lost devices, spurious completions, busy
//! buffers, out-of-memory, and completions out of order.

mod mock;

use embedded_hal::delay::DelayNs;
use keel_npu_hal::buffer::BufferId;
use keel_npu_hal::caps::UnitState;
use keel_npu_hal::device::{BatchStatus, Device, Queue, SharedBuffers};
use keel_npu_hal::op::{Batch, BufferRef, DType, Layout, OpDesc, OpKind, Reason, Support, TensorDesc};
use keel_npu_hal::wait::{Tracker, WaitError, WaitPolicy};
use keel_npu_hal::{Error, ErrorKind};
use mock::{Faults, MockDevice};

/// A delay that only counts the time it was asked to wait.
#[derive(Default)]
struct CountingDelay {
    ns: u64,
}

impl DelayNs for CountingDelay {
    fn delay_ns(&mut self, ns: u32) {
        self.ns += u64::from(ns);
    }
}

const POLICY: WaitPolicy = WaitPolicy { timeout_us: 1000, poll_us: 10 };

/// One 4096-byte buffer holding x (8 f32 at 0), y (at 64), out (at 128).
fn setup(dev: &mut MockDevice) -> (BufferId, [BufferRef; 1], [TensorDesc; 3]) {
    let id = dev.alloc(100).unwrap();
    dev.map(id).unwrap();
    let view = dev.host_view(id).unwrap();
    for i in 0..8 {
        view[4 * i..][..4].copy_from_slice(&(i as f32).to_le_bytes());
        view[64 + 4 * i..][..4].copy_from_slice(&(10.0f32).to_le_bytes());
    }
    let t = |off| TensorDesc::contiguous(DType::F32, [8, 1, 1, 1], 0, off).unwrap();
    (id, [BufferRef { id, size: 4096 }], [t(0), t(64), t(128)])
}

fn op(kind: OpKind) -> [OpDesc; 1] {
    [OpDesc { kind, src: [Some(0), Some(1), None], dst: 2 }]
}

fn out(dev: &mut MockDevice, id: BufferId) -> Vec<f32> {
    let v = dev.host_view(id).unwrap();
    v[128..160].chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn batch_runs_over_shared_buffers_without_copies() {
    let mut dev = MockDevice::new(Faults::default());
    let (id, bufs, tensors) = setup(&mut dev);
    let ops = op(OpKind::Add);
    let mut tr = Tracker::<4>::new();
    let seq = tr.submit(&mut dev, &Batch { buffers: &bufs, tensors: &tensors, ops: &ops }).unwrap();
    let mut delay = CountingDelay::default();
    assert_eq!(tr.wait(&mut dev, seq, &mut delay, POLICY), Ok(BatchStatus::Done));
    assert_eq!(out(&mut dev, id), (0..8).map(|i| i as f32 + 10.0).collect::<Vec<_>>());
    assert_eq!(tr.in_flight(), 0);
}

#[test]
fn buffers_are_off_limits_while_in_flight() {
    let mut dev = MockDevice::new(Faults { latency: vec![(100, 3)], ..Faults::default() });
    let (id, bufs, tensors) = setup(&mut dev);
    let ops = op(OpKind::Mul);
    let seq = dev.submit(&Batch { buffers: &bufs, tensors: &tensors, ops: &ops }).unwrap();
    assert_eq!(dev.host_view(id).unwrap_err().kind(), ErrorKind::Busy);
    assert_eq!(dev.free(id).unwrap_err().kind(), ErrorKind::Busy);
    let mut tr = Tracker::<4>::new();
    // A seq the tracker never saw is refused, not waited on.
    assert_eq!(tr.wait(&mut dev, seq, &mut CountingDelay::default(), POLICY), Err(WaitError::NotInFlight(seq)));
    while dev.poll().unwrap().is_none() {}
    assert_eq!(out(&mut dev, id)[3], 30.0);
    dev.free(id).unwrap();
    assert_eq!(dev.host_view(id).unwrap_err().kind(), ErrorKind::InvalidArgument);
}

#[test]
fn several_in_flight_complete_out_of_order() {
    // seq 100 takes 5 polls, seq 101 one: waiting on 100 must keep 101's completion.
    let mut dev = MockDevice::new(Faults { latency: vec![(100, 5), (101, 1)], ..Faults::default() });
    let (_, bufs, tensors) = setup(&mut dev);
    let (add, mul) = (op(OpKind::Add), op(OpKind::Rope { n_dims: 2, mode: 0, freq_base: 1e4 }));
    let mut tr = Tracker::<4>::new();
    let a = tr.submit(&mut dev, &Batch { buffers: &bufs, tensors: &tensors, ops: &add }).unwrap();
    let b = tr.submit(&mut dev, &Batch { buffers: &bufs, tensors: &tensors, ops: &mul }).unwrap();
    assert_eq!((a, b), (100, 101));
    let mut delay = CountingDelay::default();
    assert_eq!(tr.wait(&mut dev, a, &mut delay, POLICY), Ok(BatchStatus::Done));
    assert_eq!(tr.in_flight(), 1);
    // Already collected by the first wait: returns at once, without a delay.
    let before = delay.ns;
    let failed = BatchStatus::Failed { op: 0, kind: ErrorKind::Unsupported };
    assert_eq!(tr.wait(&mut dev, b, &mut delay, POLICY), Ok(failed));
    assert_eq!(delay.ns, before);
}

#[test]
fn lost_completion_times_out_and_stays_in_flight() {
    let mut dev = MockDevice::new(Faults { drop_seq: Some(100), ..Faults::default() });
    let (_, bufs, tensors) = setup(&mut dev);
    let ops = op(OpKind::Add);
    let mut tr = Tracker::<2>::new();
    let seq = tr.submit(&mut dev, &Batch { buffers: &bufs, tensors: &tensors, ops: &ops }).unwrap();
    let mut delay = CountingDelay::default();
    let err = tr.wait(&mut dev, seq, &mut delay, POLICY).unwrap_err();
    assert_eq!(err, WaitError::Timeout(seq));
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(delay.ns, 1_000_000);
    assert_eq!(tr.in_flight(), 1);
}

#[test]
fn device_lost_is_reported_as_such() {
    let mut dev = MockDevice::new(Faults { lost_after_polls: Some(2), latency: vec![(100, 9)], ..Faults::default() });
    let (_, bufs, tensors) = setup(&mut dev);
    let ops = op(OpKind::Add);
    let batch = Batch { buffers: &bufs, tensors: &tensors, ops: &ops };
    let mut tr = Tracker::<2>::new();
    let seq = tr.submit(&mut dev, &batch).unwrap();
    let err = tr.wait(&mut dev, seq, &mut CountingDelay::default(), POLICY).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DeviceLost);
    assert_eq!(tr.submit(&mut dev, &batch).unwrap_err().kind(), ErrorKind::DeviceLost);
    assert_eq!(tr.in_flight(), 1, "Err means nothing more was queued");
}

#[test]
fn spurious_completion_is_a_protocol_error() {
    let mut dev = MockDevice::new(Faults { spurious: Some(7), ..Faults::default() });
    let (_, bufs, tensors) = setup(&mut dev);
    let ops = op(OpKind::Add);
    let mut tr = Tracker::<2>::new();
    let seq = tr.submit(&mut dev, &Batch { buffers: &bufs, tensors: &tensors, ops: &ops }).unwrap();
    let err = tr.wait(&mut dev, seq, &mut CountingDelay::default(), POLICY).unwrap_err();
    assert_eq!((err.kind(), err), (ErrorKind::Protocol, WaitError::UnknownCompletion(7)));
}

#[test]
fn queue_limits_refuse_without_queueing() {
    let mut dev = MockDevice::new(Faults { drop_seq: Some(100), ..Faults::default() });
    let (_, bufs, tensors) = setup(&mut dev);
    let ops = op(OpKind::Add);
    let batch = Batch { buffers: &bufs, tensors: &tensors, ops: &ops };
    let mut tr = Tracker::<2>::new();
    tr.submit(&mut dev, &batch).unwrap();
    tr.submit(&mut dev, &batch).unwrap();
    assert_eq!(tr.submit(&mut dev, &batch).unwrap_err(), WaitError::Table(ErrorKind::Busy));
    assert_eq!(dev.submits, 2, "the full tracker did not reach the device");
    // The device's own limit (max_in_flight = 4) also answers Busy.
    for _ in 0..2 {
        dev.submit(&batch).unwrap();
    }
    assert_eq!(dev.submit(&batch).unwrap_err().kind(), ErrorKind::Busy);
}

#[test]
fn bad_batches_are_refused() {
    let mut dev = MockDevice::new(Faults::default());
    let (_, bufs, mut tensors) = setup(&mut dev);
    let ops = op(OpKind::Add);
    let unmapped = dev.alloc(10).unwrap();
    let bad_buf = [BufferRef { id: unmapped, size: 4096 }];
    assert_eq!(dev.submit(&Batch { buffers: &bad_buf, tensors: &tensors, ops: &ops }).unwrap_err().kind(), ErrorKind::InvalidArgument);
    let bad_op = [OpDesc { kind: OpKind::Add, src: [Some(0), Some(9), None], dst: 2 }];
    assert_eq!(dev.submit(&Batch { buffers: &bufs, tensors: &tensors, ops: &bad_op }).unwrap_err().kind(), ErrorKind::InvalidArgument);
    tensors[2].offset = 4096 - 16; // runs past the buffer end
    assert_eq!(dev.submit(&Batch { buffers: &bufs, tensors: &tensors, ops: &ops }).unwrap_err().kind(), ErrorKind::InvalidArgument);
}

#[test]
fn alloc_rules_and_out_of_memory() {
    let mut dev = MockDevice::new(Faults { oom_on_alloc: Some(1), ..Faults::default() });
    let a = dev.alloc(1).unwrap();
    assert_eq!(dev.host_view(a).unwrap().len(), 4096);
    assert_eq!(dev.alloc(1).unwrap_err().kind(), ErrorKind::OutOfMemory);
    assert_eq!(dev.alloc(0).unwrap_err().kind(), ErrorKind::InvalidArgument);
    assert_eq!(dev.alloc((1 << 24) + 1).unwrap_err().kind(), ErrorKind::OutOfMemory);
    assert_eq!(dev.alloc(1 << 24).map(|_| ()), Ok(()));
    assert!(dev.buffer_rules().is_aligned(8192) && !dev.buffer_rules().is_aligned(8193));
}

fn matmul_tables(wtype: DType, layout: Layout, k: u32) -> [TensorDesc; 3] {
    let w = TensorDesc { dtype: wtype, layout, ne: [k, 64, 1, 1], nb: [0; 4], buffer: 0, offset: 0 };
    let x = TensorDesc::contiguous(DType::F32, [k, 1, 1, 1], 1, 0).unwrap();
    let d = TensorDesc::contiguous(DType::F32, [64, 1, 1, 1], 1, 0).unwrap();
    [w, x, d]
}

#[test]
fn supports_follows_types_layouts_shapes_and_units() {
    let mut dev = MockDevice::new(Faults::default());
    let mm = [OpDesc { kind: OpKind::MatMul, src: [Some(0), Some(1), None], dst: 2 }];
    for t in [DType::Q4_0, DType::Q8_0, DType::IQ4NL] {
        assert_eq!(dev.supports(&mm[0], &matmul_tables(t, Layout::Tiles32, 256)), Support::Yes);
    }
    assert_eq!(dev.supports(&mm[0], &matmul_tables(DType::F16, Layout::Tiles32, 256)), Support::No(Reason::DType));
    assert_eq!(dev.supports(&mm[0], &matmul_tables(DType::Q8_0, Layout::RowMajor, 256)), Support::No(Reason::Layout));
    assert_eq!(dev.supports(&mm[0], &matmul_tables(DType::Q8_0, Layout::Tiles32, 100)), Support::No(Reason::Shape));
    let bad_idx = OpDesc { kind: OpKind::MatMul, src: [Some(0), None, None], dst: 2 };
    assert_eq!(dev.supports(&bad_idx, &matmul_tables(DType::Q8_0, Layout::Tiles32, 64)), Support::No(Reason::Index));
    let rope = OpDesc { kind: OpKind::Rope { n_dims: 64, mode: 0, freq_base: 1e4 }, src: [Some(0), Some(1), None], dst: 0 };
    let q = TensorDesc::contiguous(DType::F32, [64, 8, 5, 1], 0, 0).unwrap();
    let pos = TensorDesc::contiguous(DType::I32, [5, 1, 1, 1], 1, 0).unwrap();
    assert_eq!(dev.supports(&rope, &[q, pos]), Support::Yes);
    let pos4 = TensorDesc::contiguous(DType::I32, [4, 1, 1, 1], 1, 0).unwrap();
    assert_eq!(dev.supports(&rope, &[q, pos4]), Support::No(Reason::Shape));
    // Optional sources: a cos/sin table for RoPE, a weight row for RMSNorm.
    let rope_cs = OpDesc { src: [Some(0), Some(1), Some(2)], ..rope };
    let cs = TensorDesc::contiguous(DType::F32, [64, 5, 1, 1], 1, 0).unwrap();
    assert_eq!(dev.supports(&rope_cs, &[q, pos, cs]), Support::Yes);
    let cs_short = TensorDesc::contiguous(DType::F32, [32, 5, 1, 1], 1, 0).unwrap();
    assert_eq!(dev.supports(&rope_cs, &[q, pos, cs_short]), Support::No(Reason::Shape));
    let norm = OpDesc { kind: OpKind::RmsNorm { eps: 1e-5 }, src: [Some(0), Some(1), None], dst: 0 };
    let w = TensorDesc::contiguous(DType::F32, [64, 1, 1, 1], 1, 0).unwrap();
    assert_eq!(dev.supports(&norm, &[q, w]), Support::Yes);
    assert_eq!(dev.supports(&norm, &[q, cs]), Support::No(Reason::Shape));
    // Activations quantized on the device, then a product that takes them as Q8_0.
    let x = TensorDesc::contiguous(DType::F32, [256, 3, 1, 1], 1, 0).unwrap();
    let xq = TensorDesc::contiguous(DType::Q8_0, [256, 3, 1, 1], 1, 4096).unwrap();
    let quant = OpDesc { kind: OpKind::Quantize, src: [Some(0), None, None], dst: 1 };
    assert_eq!(dev.supports(&quant, &[x, xq]), Support::Yes);
    assert_eq!(dev.supports(&quant, &[x, x]), Support::No(Reason::DType));
    let [wt, _, _] = matmul_tables(DType::IQ4NL, Layout::Tiles32, 256);
    let d = TensorDesc::contiguous(DType::F32, [64, 3, 1, 1], 1, 0).unwrap();
    assert_eq!(dev.supports(&mm[0], &[wt, xq, d]), Support::Yes);
    // GeGLU does not broadcast; Copy writes F16.
    let geglu = OpDesc { kind: OpKind::GeGlu, src: [Some(0), Some(1), None], dst: 0 };
    assert_eq!(dev.supports(&geglu, &[q, q]), Support::Yes);
    assert_eq!(dev.supports(&geglu, &[q, w]), Support::No(Reason::Shape));
    let copy = OpDesc { kind: OpKind::Copy, src: [Some(0), None, None], dst: 1 };
    let q16 = TensorDesc::contiguous(DType::F16, [64, 8, 5, 1], 1, 0).unwrap();
    assert_eq!(dev.supports(&copy, &[q, q16]), Support::Yes);
    // A unit that failed its self-test runs nothing.
    dev.caps = mock::hexagon_caps(UnitState::Failed);
    assert_eq!(dev.supports(&mm[0], &matmul_tables(DType::Q8_0, Layout::Tiles32, 64)), Support::No(Reason::Unit));
    dev.caps.ops = Default::default();
    assert_eq!(dev.supports(&mm[0], &matmul_tables(DType::Q8_0, Layout::Tiles32, 64)), Support::No(Reason::OpKind));
}

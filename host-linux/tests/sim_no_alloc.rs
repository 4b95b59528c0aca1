//! The hexagon-sim device's steady state allocates nothing: once it is open and its
//! buffers are allocated, mapped and written, a generation loop's calls — `submit` and
//! `wait` of the HAL's `Tracker` (so `Queue::submit` and `Queue::poll`) with a sleeping
//! `DelayNs`, and `SharedBuffers::host_view` to write inputs and read results — make
//! zero heap allocations in the whole process (a counting global allocator watches;
//! the QEMU child is another process). Every batch's results must equal keel-core's.
//! Skips loudly without qemu-hexagon or the firmware ELF (`KEEL_REQUIRE_DSP=1`: fails).
//!
//! This binary holds a single test so that nothing else allocates while it counts.

mod sim;

use std::time::Duration;

use keel_host_linux::device::HexagonSim;
use keel_host_linux::mem::{allocations, CountingAllocator};
use keel_npu_hal::device::{BatchStatus, SharedBuffers};
use keel_npu_hal::op::{Batch, BufferRef, DType, Layout, OpDesc, OpKind, TensorDesc};
use keel_npu_hal::tile;
use keel_npu_hal::wait::{Tracker, WaitPolicy};
use sim::{config, reference, Product, Rng};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator::new();

/// A `DelayNs` that sleeps, as a host's generation loop waits.
struct Sleep;

impl embedded_hal::delay::DelayNs for Sleep {
    fn delay_ns(&mut self, ns: u32) {
        std::thread::sleep(Duration::from_nanos(u64::from(ns)));
    }
}

const ROWS: usize = 96;
const K: usize = 256;
/// Batches counted (after one warm-up batch).
const BATCHES: usize = 20;

/// Byte offsets in the activation buffer: input x, product y = W·x, residual r, sum z = y + r.
const X: usize = 0;
const Y: usize = X + 4 * K;
const R: usize = Y + 4 * ROWS;
const Z: usize = R + 4 * ROWS;
const IO_BYTES: usize = Z + 4 * ROWS;

fn write_f32(dst: &mut [u8], v: &[f32]) {
    for (d, x) in dst.chunks_exact_mut(4).zip(v) {
        d.copy_from_slice(&x.to_le_bytes());
    }
}

fn read_bits(src: &[u8], out: &mut [u32]) {
    for (o, s) in out.iter_mut().zip(src.chunks_exact(4)) {
        *o = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

#[test]
fn matmul_and_add_batches_through_the_tracker_allocate_nothing() {
    let Some(cfg) = config("matmul_and_add_batches_through_the_tracker_allocate_nothing") else { return };
    let mut dev = HexagonSim::open(&cfg).unwrap();

    // Q8_0 weights with unit scales and integer activations: the product is the exact
    // int32 sum on both sides, and the Add then rounds the same on both (bit for bit).
    let w = Product::integer(DType::Q8_0, ROWS, K, 1, 0x5eed).w;
    let mut rng = Rng(0xadd);
    let inputs: Vec<(Vec<f32>, Vec<f32>)> = (0..=BATCHES)
        .map(|i| (Product::integer(DType::Q8_0, ROWS, K, 1, 100 + i as u64).x, (0..ROWS).map(|_| rng.f32() * 1000.0).collect()))
        .collect();
    // keel-core's results: the scalar reference product, then its `add_assign`.
    let want: Vec<(Vec<u32>, Vec<u32>)> = inputs
        .iter()
        .map(|(x, r)| {
            let mut y: Vec<f32> = reference(DType::Q8_0, &w, ROWS, K, x).iter().map(|&(v, _)| v).collect();
            let y_bits = y.iter().map(|v| v.to_bits()).collect();
            keel_core::ops::add_assign(&mut y, r);
            (y_bits, y.iter().map(|v| v.to_bits()).collect())
        })
        .collect();

    // Load time: buffers allocated, mapped, weights repacked into place.
    let wsize = tile::packed_size(DType::Q8_0, ROWS as u32, K as u32).unwrap();
    let (wbuf, iobuf) = (dev.alloc(wsize as u64).unwrap(), dev.alloc(IO_BYTES as u64).unwrap());
    dev.map(wbuf).unwrap();
    dev.map(iobuf).unwrap();
    tile::repack(DType::Q8_0, ROWS as u32, K as u32, &w, &mut dev.host_view(wbuf).unwrap()[..wsize]).unwrap();
    let buffers = [BufferRef { id: wbuf, size: wsize as u64 }, BufferRef { id: iobuf, size: IO_BYTES as u64 }];
    let f32s = |n: usize, at: usize| TensorDesc::contiguous(DType::F32, [n as u32, 1, 1, 1], 1, at as u32).unwrap();
    let tensors = [
        TensorDesc { dtype: DType::Q8_0, layout: Layout::Tiles32, ne: [K as u32, ROWS as u32, 1, 1], nb: [0; 4], buffer: 0, offset: 0 },
        f32s(K, X),
        f32s(ROWS, Y),
        f32s(ROWS, R),
        f32s(ROWS, Z),
    ];
    let ops = [
        OpDesc { kind: OpKind::MatMul, src: [Some(0), Some(1), None], dst: 2 },
        OpDesc { kind: OpKind::Add, src: [Some(2), Some(3), None], dst: 4 },
    ];
    let batch = Batch { buffers: &buffers, tensors: &tensors, ops: &ops };
    let mut tracker = Tracker::<4>::new();
    let policy = WaitPolicy { timeout_us: u32::try_from(cfg.timeout.as_micros() * 3 / 2).unwrap_or(u32::MAX), poll_us: 50 };
    let mut got = vec![(vec![0u32; ROWS], vec![0u32; ROWS]); BATCHES + 1];
    let mut statuses = [BatchStatus::Done; BATCHES + 1];

    // One batch: inputs written and outputs poisoned through `host_view`, submitted and
    // waited for through the tracker, results read back through `host_view`.
    let mut run = |i: usize| {
        let (x, r) = &inputs[i];
        let io = dev.host_view(iobuf).unwrap();
        write_f32(&mut io[X..Y], x);
        write_f32(&mut io[R..Z], r);
        io[Y..R].fill(0xAB);
        io[Z..IO_BYTES].fill(0xAB);
        let seq = tracker.submit(&mut dev, &batch).unwrap();
        statuses[i] = tracker.wait(&mut dev, seq, &mut Sleep, policy).unwrap();
        let io = dev.host_view(iobuf).unwrap();
        read_bits(&io[Y..R], &mut got[i].0);
        read_bits(&io[Z..IO_BYTES], &mut got[i].1);
    };
    run(0); // warm-up
    let before = allocations();
    for i in 1..=BATCHES {
        run(i);
    }
    let after = allocations();

    assert!(before > 0, "the counting allocator is installed");
    assert_eq!(after - before, 0, "{BATCHES} batches through hexagon-sim allocated {} times", after - before);
    assert_eq!(tracker.in_flight(), 0);
    for (i, ((status, (y, z)), (want_y, want_z))) in statuses.iter().zip(&got).zip(&want).enumerate() {
        assert_eq!(*status, BatchStatus::Done, "batch {i}");
        assert_eq!(y, want_y, "batch {i}: the Q8_0 product differs from keel-core's reference");
        assert_eq!(z, want_z, "batch {i}: product + residual differs from keel-core's add_assign");
    }
    // The batches saw different inputs (a device replaying one result would not pass).
    assert_ne!(got[1].1, got[2].1);
}

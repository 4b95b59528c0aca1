//! The hexagon-sim device end to end: keel's firmware as Hexagon code under
//! qemu-hexagon, opened through the HAL traits. Open + handshake + measured
//! capabilities; matrix products over shared buffers equal keel-core's scalar
//! reference bit for bit; batch-level errors; the HVX-zeros firmware refused.
//! Skips loudly without qemu-hexagon or the firmware ELF (`KEEL_REQUIRE_DSP=1`: fails).

use crate::sim;

use keel_host_linux::device::HexagonSim;
use keel_npu_hal::caps::Arch;
use keel_npu_hal::device::{BatchStatus, Device, Queue, SharedBuffers};
use keel_npu_hal::op::{DType, OpDesc, OpKind, Support};
use keel_npu_hal::wire::PROTOCOL_VERSION;
use keel_npu_hal::{Error, ErrorKind, UnitState};
use crate::sim::{config, run_and_check, stage, Product};

#[test]
fn open_handshake_and_measured_capabilities() {
    let Some(cfg) = config("open_handshake_and_measured_capabilities") else { return };
    let dev = HexagonSim::open(&cfg).unwrap();
    let id = dev.identity();
    let want_arch = cfg.cpu.trim_start_matches('v').parse::<u8>().unwrap();
    assert_eq!(id.arch, Arch::Hexagon { version: want_arch });
    assert_eq!(id.protocol_version, PROTOCOL_VERSION);
    assert!(id.emulated);
    let caps = dev.caps();
    assert_eq!(caps.units.hvx, UnitState::Verified, "HVX verified by the start-up self-test");
    assert_eq!(caps.memory.scratch_bytes, cfg.vtcm_bytes, "VTCM granted is what the firmware reports");
    assert_eq!(caps.memory.va_budget, dev.shared_bytes(), "the firmware measured the shared region");
    assert_eq!(caps.units.hvx_contexts, cfg.threads, "the firmware runs the threads it was given");
    assert!(dev.self_test().passed());
    assert_eq!(dev.self_test().digest, keel_npu_hal::selftest::expected_digest(dev.self_test().seed));
    assert!(dev.name().contains("hexagon-sim") && dev.name().contains(&format!("pid {}", dev.pid())));
    // Two sessions at once do not share anything.
    let other = HexagonSim::open(&cfg).unwrap();
    assert_ne!(other.pid(), dev.pid());
}

/// (rows, k, columns): single rows, partial row groups, several columns, model sizes.
const SHAPES: [(usize, usize, usize); 8] = [(1, 32, 1), (7, 64, 1), (31, 96, 2), (33, 128, 2), (70, 192, 3), (100, 160, 1), (256, 512, 1), (300, 576, 1)];

fn products(t: DType, integer: bool, seed: u64) -> Vec<Product> {
    let make = if integer { Product::integer } else { Product::random };
    SHAPES.iter().enumerate().map(|(i, &(r, k, c))| make(t, r, k, c, seed + i as u64)).collect()
}

#[test]
fn q8_0_integer_sums_equal_the_cpu_reference_bit_for_bit() {
    let Some(cfg) = config("q8_0_integer_sums_equal_the_cpu_reference_bit_for_bit") else { return };
    let mut dev = HexagonSim::open(&cfg).unwrap();
    run_and_check(&mut dev, &products(DType::Q8_0, true, 0x5eed), true);
}

#[test]
fn q4_0_integer_sums_equal_the_cpu_reference_bit_for_bit() {
    let Some(cfg) = config("q4_0_integer_sums_equal_the_cpu_reference_bit_for_bit") else { return };
    let mut dev = HexagonSim::open(&cfg).unwrap();
    run_and_check(&mut dev, &products(DType::Q4_0, true, 0x4b1d), true);
}

#[test]
fn q8_0_and_q4_0_products_match_the_cpu_reference() {
    let Some(cfg) = config("q8_0_and_q4_0_products_match_the_cpu_reference") else { return };
    let mut dev = HexagonSim::open(&cfg).unwrap();
    let mut ps = products(DType::Q8_0, false, 0x5eed_0001);
    ps.extend(products(DType::Q4_0, false, 0x4b1d_0001));
    ps.push(Product::random(DType::Q8_0, 96, 2048, 1, 1));
    ps.push(Product::random(DType::Q4_0, 576, 1536, 1, 2));
    run_and_check(&mut dev, &ps[..9], false);
    run_and_check(&mut dev, &ps[9..], false);
}

/// The products' row groups split over 1, 2, 3, 4 and 8 hardware threads (uneven shares,
/// and more threads than a small product has row groups): the integer products equal
/// the CPU reference bit for bit, and every output equals one thread's, bit for bit.
#[test]
fn products_split_over_hardware_threads_keep_their_bits() {
    let Some(base) = config("products_split_over_hardware_threads_keep_their_bits") else { return };
    let integer = products(DType::Q8_0, true, 0x7e4d);
    let mut ps = products(DType::Q8_0, false, 0x7e4e);
    ps.extend(products(DType::Q4_0, false, 0x7e4f));
    ps.push(Product::random(DType::Q8_0, 576, 576, 3, 3));
    ps.push(Product::random(DType::Q4_0, 1536, 576, 2, 4));
    let mut one: Option<Vec<Vec<u32>>> = None;
    for threads in [1, 2, 3, 4, 8] {
        let cfg = keel_host_linux::device::SimConfig { threads, ..base.clone() };
        let mut dev = HexagonSim::open(&cfg).unwrap();
        assert_eq!(dev.caps().units.hvx_contexts, threads);
        run_and_check(&mut dev, &integer, true);
        let mut outs = Vec::new();
        for chunk in ps.chunks(6) {
            let s = stage(&mut dev, chunk);
            let seq = dev.submit(&s.batch()).unwrap();
            assert_eq!(dev.wait(seq).unwrap(), BatchStatus::Done);
            outs.extend(chunk.iter().enumerate().map(|(i, p)| s.output(&mut dev, i, p.rows * p.cols)));
            s.free(&mut dev);
        }
        match &one {
            None => one = Some(outs),
            Some(want) => {
                for (i, (g, w)) in outs.iter().zip(want).enumerate() {
                    let p = &ps[i];
                    assert!(g == w, "{threads} threads: {:?} {}x{} ({} columns) differs from one thread's", p.t, p.rows, p.k, p.cols);
                }
            }
        }
    }
    let bad = keel_host_linux::device::SimConfig { threads: 9, ..base };
    let e = HexagonSim::open(&bad).err().expect("9 threads refused").to_string();
    assert!(e.contains("KEEL_DSP_THREADS") && e.contains("1 to 8"), "{e}");
}

#[test]
fn several_batches_in_flight_complete_in_order() {
    let Some(cfg) = config("several_batches_in_flight_complete_in_order") else { return };
    let mut dev = HexagonSim::open(&cfg).unwrap();
    let sets: Vec<Vec<Product>> = (0..4).map(|i| vec![Product::random(DType::Q8_0, 64, 256, 1, 100 + i)]).collect();
    let staged: Vec<_> = sets.iter().map(|ps| stage(&mut dev, ps)).collect();
    let seqs: Vec<u32> = staged.iter().map(|s| dev.submit(&s.batch()).unwrap()).collect();
    assert_eq!(dev.in_flight(), 4);
    // Buffers named by a batch in flight are off limits to the host.
    assert_eq!(dev.host_view(staged[3].iobuf).unwrap_err().kind(), ErrorKind::Busy);
    assert_eq!(dev.free(staged[3].wbuf).unwrap_err().kind(), ErrorKind::Busy);
    // Wait for the last first: the others' completions are kept, in order.
    assert_eq!(dev.wait(seqs[3]).unwrap(), BatchStatus::Done);
    let mut polled = Vec::new();
    while polled.len() < 3 {
        if let Some(c) = dev.poll().unwrap() {
            assert_eq!(c.status, BatchStatus::Done);
            polled.push(c.seq);
        }
    }
    assert_eq!(polled, seqs[..3]);
    for (s, ps) in staged.into_iter().zip(&sets) {
        let p = &ps[0];
        sim::check(p, &s.output(&mut dev, 0, p.rows), false);
        s.free(&mut dev);
    }
}

#[test]
fn unsupported_op_fails_its_batch_and_the_device_carries_on() {
    let Some(cfg) = config("unsupported_op_fails_its_batch_and_the_device_carries_on") else { return };
    let mut dev = HexagonSim::open(&cfg).unwrap();
    let p = [Product::random(DType::Q8_0, 32, 64, 1, 7)];
    let mut s = stage(&mut dev, &p);
    // RoPE mode 1 is neither normal (0) nor NeoX (2): the firmware does not take it.
    let rope = OpDesc { kind: OpKind::Rope { n_dims: 2, mode: 1, freq_base: 1e4 }, src: [Some(2), None, None], dst: 2 };
    assert_ne!(dev.supports(&rope, &s.tensors), Support::Yes, "the firmware does not claim RoPE mode 1");
    s.ops.push(rope);
    let seq = dev.submit(&s.batch()).unwrap();
    assert_eq!(dev.wait(seq).unwrap(), BatchStatus::Failed { op: 1, kind: ErrorKind::Unsupported });
    // A bad request is refused before it reaches the device.
    s.tensors[2].offset = u32::MAX - 64;
    assert_eq!(dev.submit(&s.batch()).unwrap_err().kind(), ErrorKind::InvalidArgument);
    assert_eq!(dev.wait(999).unwrap_err().kind(), ErrorKind::InvalidArgument);
    s.free(&mut dev);
    run_and_check(&mut dev, &[Product::integer(DType::Q4_0, 40, 96, 2, 8)], true);
}

#[test]
fn zero_writing_hvx_firmware_is_refused_at_open() {
    let Some(mut cfg) = config("zero_writing_hvx_firmware_is_refused_at_open") else { return };
    let broken = std::env::var("KEEL_DSP_ELF_BROKEN").map(Into::into).unwrap_or_else(|_| {
        keel_host_linux::device::config::default_elf(&format!("{}-broken", cfg.cpu))
    });
    if !broken.is_file() {
        assert!(std::env::var("KEEL_REQUIRE_DSP").map_or(true, |v| v != "1"), "missing {}", broken.display());
        eprintln!("\n*** SKIPPED zero_writing_hvx_firmware_is_refused_at_open: {} not built ***\n", broken.display());
        return;
    }
    cfg.elf = broken;
    let err = HexagonSim::open(&cfg).err().expect("a zero-writing HVX unit must be refused");
    assert_eq!(err.kind(), ErrorKind::BadResponse);
    let msg = err.to_string();
    assert!(msg.contains("hexagon-sim") && msg.contains("self-test failed") && msg.contains("HVX"), "{msg}");
}


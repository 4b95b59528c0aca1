//! Faults of the hexagon-sim device, each injected for real: the QEMU process
//! killed mid-batch, a firmware that hangs, one that answers with malformed
//! bytes, one with the wrong sequence number, one that speaks another protocol
//! version. Each must end in an error naming the device and the fault, within
//! the timeout (never a hang), and a fresh open must work afterwards.

use std::time::{Duration, Instant};

use keel_host_linux::device::HexagonSim;
use keel_npu_hal::device::{Queue, SharedBuffers};
use keel_npu_hal::op::DType;
use keel_npu_hal::{Error, ErrorKind};
use crate::sim::{config, faulty, run_and_check, stage, Product};

/// Submits one product and waits; returns the error and how long it took.
fn submit_and_wait(dev: &mut HexagonSim) -> (keel_host_linux::device::DeviceError, Duration) {
    let s = stage(dev, &[Product::random(DType::Q8_0, 64, 128, 1, 3)]);
    let seq = dev.submit(&s.batch()).unwrap();
    let t = Instant::now();
    let e = dev.wait(seq).expect_err("the fault must surface as an error");
    (e, t.elapsed())
}

fn reopen_works(test: &str) {
    let cfg = config(test).unwrap();
    let mut dev = HexagonSim::open(&cfg).unwrap();
    run_and_check(&mut dev, &[Product::integer(DType::Q4_0, 33, 64, 1, 11)], true);
}

#[test]
fn killed_process_mid_batch_is_device_lost() {
    let Some(cfg) = faulty("killed_process_mid_batch_is_device_lost", "hang-on-batch") else { return };
    let mut dev = HexagonSim::open(&cfg).unwrap();
    let s = stage(&mut dev, &[Product::random(DType::Q8_0, 64, 128, 1, 3)]);
    let seq = dev.submit(&s.batch()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: sends SIGKILL to the QEMU process this test started (its pid).
    assert_eq!(unsafe { libc::kill(dev.pid() as i32, libc::SIGKILL) }, 0);
    let t = Instant::now();
    let e = dev.wait(seq).unwrap_err();
    // Bounds with room for a loaded host: what they tell apart is "at once" from "at the timeout".
    assert!(t.elapsed() < cfg.timeout / 2, "noticed at once, not at the timeout: {:?}", t.elapsed());
    assert_eq!(e.kind(), ErrorKind::DeviceLost, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("hexagon-sim") && msg.contains("went away") && msg.contains("signal: 9"), "{msg}");
    // Every later call says the session is over.
    assert_eq!(dev.alloc(4096).unwrap_err().kind(), ErrorKind::DeviceLost);
    assert_eq!(dev.poll().unwrap_err().kind(), ErrorKind::DeviceLost);
    drop(dev);
    reopen_works("killed_process_mid_batch_is_device_lost");
}

#[test]
fn hung_firmware_times_out() {
    let Some(cfg) = faulty("hung_firmware_times_out", "hang-on-batch") else { return };
    let mut dev = HexagonSim::open(&cfg).unwrap();
    let (e, took) = submit_and_wait(&mut dev);
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(took >= cfg.timeout - Duration::from_millis(100) && took < cfg.timeout * 2, "at the timeout: {took:?}");
    assert!(e.to_string().contains("hexagon-sim") && e.to_string().contains("hung"), "{e}");
    reopen_works("hung_firmware_times_out");
}

#[test]
fn hung_firmware_times_out_through_poll() {
    let Some(mut cfg) = faulty("hung_firmware_times_out_through_poll", "hang-on-batch") else { return };
    cfg.timeout = Duration::from_millis(500);
    let mut dev = HexagonSim::open(&cfg).unwrap();
    let s = stage(&mut dev, &[Product::random(DType::Q8_0, 32, 32, 1, 4)]);
    dev.submit(&s.batch()).unwrap();
    let t = Instant::now();
    let e = loop {
        match dev.poll() {
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Ok(Some(c)) => panic!("a hung device completed {c:?}"),
            Err(e) => break e,
        }
    };
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(t.elapsed() < cfg.timeout * 4, "at the timeout, not much later: {:?}", t.elapsed());
}

#[test]
fn malformed_reply_is_a_protocol_error() {
    let Some(cfg) = faulty("malformed_reply_is_a_protocol_error", "malformed-reply") else { return };
    let mut dev = HexagonSim::open(&cfg).unwrap();
    let (e, took) = submit_and_wait(&mut dev);
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
    assert!(took < cfg.timeout);
    assert!(e.to_string().contains("malformed reply"), "{e}");
    reopen_works("malformed_reply_is_a_protocol_error");
}

#[test]
fn out_of_sequence_completion_is_a_protocol_error() {
    let Some(cfg) = faulty("out_of_sequence_completion_is_a_protocol_error", "wrong-seq") else { return };
    let mut dev = HexagonSim::open(&cfg).unwrap();
    let (e, took) = submit_and_wait(&mut dev);
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
    assert!(took < cfg.timeout);
    assert!(e.to_string().contains("not in flight"), "{e}");
    reopen_works("out_of_sequence_completion_is_a_protocol_error");
}

#[test]
fn protocol_version_mismatch_is_refused_at_open() {
    let Some(cfg) = faulty("protocol_version_mismatch_is_refused_at_open", "other-version") else { return };
    let t = Instant::now();
    let e = HexagonSim::open(&cfg).err().expect("another protocol version must be refused");
    assert!(t.elapsed() < cfg.timeout);
    assert_eq!(e.kind(), ErrorKind::Protocol);
    assert!(e.to_string().contains("protocol version mismatch"), "{e}");
    reopen_works("protocol_version_mismatch_is_refused_at_open");
}

#[test]
fn missing_firmware_is_a_clear_error() {
    let Some(mut cfg) = config("missing_firmware_is_a_clear_error") else { return };
    cfg.elf = "/nonexistent/keel-dsp-device".into();
    let e = HexagonSim::open(&cfg).err().unwrap();
    assert!(e.to_string().contains("/nonexistent/keel-dsp-device") && e.to_string().contains("dsp-firmware/ci.sh"), "{e}");
}

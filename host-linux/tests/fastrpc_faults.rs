//! Faults of the `hexagon` (FastRPC) device, injected by the libcdsprpc test double:
//! each ends in an error naming the step and the library's code, within the timeout, with
//! nothing left open, allocated or mapped in the library; after the DSP process dies a new
//! session opens and computes; a DSP that accepts every call and computes zeros is refused
//! at open; several batches in flight complete in order; the session's address budget is
//! measured at open and a buffer past it is refused by name. One test: the double's fault
//! switch is process-wide, so the cases run in turn.

mod fastrpc;
mod sim;

use std::time::Duration;

use keel_host_linux::device::fastrpc::{FastRpcConfig, Hexagon};
use keel_host_linux::device::DeviceError;
use keel_npu_hal::device::{BatchStatus, Device, Queue, SharedBuffers};
use keel_npu_hal::op::DType;
use keel_npu_hal::{Error, ErrorKind};
use sim::{check, stage, Product};

struct Double {
    set_fault: unsafe extern "C" fn(*const std::ffi::c_char),
    set_budget: unsafe extern "C" fn(u64),
    live: unsafe extern "C" fn(*mut u64),
    _lib: libloading::Library,
}

impl Double {
    fn fault(&self, f: &str) {
        let c = std::ffi::CString::new(f).unwrap();
        // SAFETY: the double's hook takes a NUL-terminated name.
        unsafe { (self.set_fault)(c.as_ptr()) }
    }

    /// Sessions, queues, allocations, mappings, rpcmem_init depth.
    fn live(&self) -> [u64; 5] {
        let mut v = [9u64; 5];
        // SAFETY: room for the five words.
        unsafe { (self.live)(v.as_mut_ptr()) };
        v
    }
}

const TIMEOUT: Duration = Duration::from_millis(3000);

fn cfg() -> FastRpcConfig {
    FastRpcConfig { timeout: TIMEOUT, ..FastRpcConfig::from_env() }
}

/// Polls until the batch ends or the device fails; panics if neither happens within
/// far more polls than the timeout allows (a hang).
fn wait(dev: &mut Hexagon, seq: u32) -> Result<BatchStatus, DeviceError> {
    for _ in 0..(TIMEOUT.as_millis() as usize * 10) {
        if let Some(c) = dev.poll()? {
            assert_eq!(c.seq, seq);
            return Ok(c.status);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("batch {seq}: no completion and no error: the device hangs past its timeout");
}

fn product() -> Product {
    Product::integer(DType::Q8_0, 40, 96, 2, 7)
}

/// Opens a session and checks one product bit for bit.
fn works(d: &Double) {
    let mut dev = Hexagon::open(&cfg()).unwrap();
    let p = product();
    let s = stage(&mut dev, std::slice::from_ref(&p));
    let seq = dev.submit(&s.batch()).unwrap();
    assert_eq!(wait(&mut dev, seq).unwrap(), BatchStatus::Done);
    check(&p, &s.output(&mut dev, 0, p.rows * p.cols), true);
    s.free(&mut dev);
    drop(dev);
    assert_eq!(d.live(), [0; 5], "nothing left open after a clean session");
}

/// Four batches in flight at once: consecutive sequence numbers, completed in order, each
/// product bit for bit.
fn several_in_flight(d: &Double) {
    let mut dev = Hexagon::open(&cfg()).unwrap();
    let ps: Vec<Product> = (0..4).map(|i| Product::integer(DType::Q8_0, 24 + 8 * i, 64, 1, 100 + i as u64)).collect();
    let staged: Vec<_> = ps.iter().map(|p| stage(&mut dev, std::slice::from_ref(p))).collect();
    let seqs: Vec<u32> = staged.iter().map(|s| dev.submit(&s.batch()).unwrap()).collect();
    assert!(dev.in_flight() == 4, "four batches are out before any is collected");
    assert!(seqs.windows(2).all(|w| w[1] == w[0].wrapping_add(1)), "{seqs:?}");
    let mut got = Vec::new();
    for _ in 0..(TIMEOUT.as_millis() as usize * 10) {
        if got.len() == seqs.len() {
            break;
        }
        match dev.poll().unwrap() {
            Some(c) => got.push(c),
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    assert_eq!(got.iter().map(|c| c.seq).collect::<Vec<_>>(), seqs, "completions in order, one per batch");
    assert!(got.iter().all(|c| c.status == BatchStatus::Done));
    for (s, p) in staged.into_iter().zip(&ps) {
        check(p, &s.output(&mut dev, 0, p.rows * p.cols), true);
        s.free(&mut dev);
    }
    drop(dev);
    assert_eq!(d.live(), [0; 5]);
}

fn says(e: &DeviceError, kind: ErrorKind, parts: &[&str]) {
    let m = e.to_string();
    assert_eq!(e.kind(), kind, "{m}");
    for p in parts {
        assert!(m.contains(p), "`{p}` missing from: {m}");
    }
}

#[test]
fn every_injected_fault_names_its_step_and_code_and_leaks_nothing() {
    let Some(lib) = fastrpc::double("every_injected_fault_names_its_step_and_code_and_leaks_nothing") else { return };
    std::env::set_var("KEEL_CDSPRPC", &lib);
    std::env::remove_var("KEEL_CDSPRPC_FAULT");
    std::env::remove_var("KEEL_CDSPRPC_LOG");
    // SAFETY: the same library the device dlopens (one copy in the process); the hooks' prototypes.
    let d = unsafe {
        let l = libloading::Library::new(&lib).unwrap();
        Double {
            set_fault: *l.get(b"keel_double_set_fault\0").unwrap(),
            set_budget: *l.get(b"keel_double_set_va_budget\0").unwrap(),
            live: *l.get(b"keel_double_live\0").unwrap(),
            _lib: l,
        }
    };
    works(&d);
    several_in_flight(&d);

    d.fault("unsigned-refused");
    let e = Hexagon::open(&cfg()).err().expect("unsigned PD refused");
    says(&e, ErrorKind::Unsupported, &["remote_handle64_open", "0x80000600", "unsigned PD"]);
    assert_eq!(d.live(), [0; 5], "{e}");

    // The skel is looked for on DSP_LIBRARY_PATH, as on a board.
    d.fault("");
    let empty = std::env::temp_dir().join(format!("keel-no-skel-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    std::env::set_var("DSP_LIBRARY_PATH", &empty);
    let e = Hexagon::open(&cfg()).err().expect("no skel on DSP_LIBRARY_PATH");
    std::env::remove_var("DSP_LIBRARY_PATH");
    let _ = std::fs::remove_dir(&empty);
    says(&e, ErrorKind::Other, &["remote_handle64_open", "0x3e", "libkeel_skel.so was not found", "DSP_LIBRARY_PATH"]);
    assert_eq!(d.live(), [0; 5], "{e}");

    d.fault("dspqueue-create");
    let e = Hexagon::open(&cfg()).err().expect("dspqueue_create failing");
    says(&e, ErrorKind::Other, &["dspqueue_create", "0x14", "AEE_EUNSUPPORTED"]);
    assert_eq!(d.live(), [0; 5], "the session opened before the queue is closed again: {e}");

    d.fault("zeros");
    let e = Hexagon::open(&cfg()).err().expect("a DSP computing zeros must be refused");
    says(&e, ErrorKind::BadResponse, &["self-test failed", "HVX"]);
    assert_eq!(d.live(), [0; 5], "{e}");

    // The capability query refused (as on some v68 Linux images): noted, not fatal.
    d.fault("caps-refused");
    let dev = Hexagon::open(&cfg()).unwrap();
    assert!(dev.dsp_info().arch.is_none());
    assert!(dev.dsp_info().notes.iter().any(|n| n.contains("ARCH_VER") && n.contains("0x80000600")), "{:?}", dev.dsp_info().notes);
    drop(dev);
    assert_eq!(d.live(), [0; 5]);

    // Mapping failing after the open: the buffer's map fails naming the call and code.
    d.fault("");
    let mut dev = Hexagon::open(&cfg()).unwrap();
    d.fault("mmap-fail");
    let id = dev.alloc(8192).unwrap();
    let e = dev.map(id).unwrap_err();
    says(&e, ErrorKind::OutOfMemory, &["fastrpc_mmap", "0x2", "AEE_ENOMEMORY"]);
    drop(dev);
    assert_eq!(d.live(), [0; 5], "the unmapped buffer is freed at close");
    // Every mapping failing from the start: the open's budget probe maps nothing and says so.
    let e = Hexagon::open(&cfg()).err().expect("a DSP that maps nothing is refused at open");
    says(&e, ErrorKind::OutOfMemory, &["could not map", "address-budget probe", "fastrpc_mmap", "0x2", "AEE_ENOMEMORY"]);
    assert_eq!(d.live(), [0; 5], "{e}");

    // A small session budget: measured at open (within the probe's granule), the probe's
    // buffers all gone afterwards, and a buffer past it refused by name, without a call.
    d.fault("");
    let budget = (40u64 << 20) + (256 << 10);
    // SAFETY: the hook's prototype.
    unsafe { (d.set_budget)(budget) };
    let mut dev = Hexagon::open(&cfg()).unwrap();
    let got = dev.caps().memory.va_budget;
    assert!(got <= budget && budget - got < 1 << 20, "measured {got} for {budget}");
    assert_eq!(d.live(), [1, 1, 0, 0, 1], "the probe left no buffer or mapping behind");
    let small = dev.alloc(8 << 20).unwrap();
    dev.map(small).unwrap();
    let big = dev.alloc(36 << 20).unwrap();
    let e = dev.map(big).unwrap_err();
    says(&e, ErrorKind::OutOfMemory, &["address budget", &format!("{got} bytes"), "measured at open"]);
    drop(dev);
    assert_eq!(d.live(), [0; 5], "{e}");
    // SAFETY: as above; back to the double's default (a v73 session's 3 GiB).
    unsafe { (d.set_budget)(3 << 30) };

    d.fault("queue-timeout");
    let mut dev = Hexagon::open(&cfg()).unwrap();
    let s = stage(&mut dev, &[product()]);
    let seq = dev.submit(&s.batch()).unwrap();
    let e = wait(&mut dev, seq).unwrap_err();
    says(&e, ErrorKind::Timeout, &[&format!("batch {seq}"), "AEE_EEXPIRED", "hung"]);
    assert_eq!(dev.submit(&s.batch()).unwrap_err().kind(), ErrorKind::Timeout, "the session stays failed");
    drop(dev);
    assert_eq!(d.live(), [0; 5], "{e}");

    d.fault("dsp-exit");
    let mut dev = Hexagon::open(&cfg()).unwrap();
    let s = stage(&mut dev, &[product()]);
    let seq = dev.submit(&s.batch()).unwrap();
    let e = wait(&mut dev, seq).unwrap_err();
    says(&e, ErrorKind::DeviceLost, &["dspqueue_read", "0x68", "AEE_ECONNRESET", "reopen"]);
    drop(dev);
    assert_eq!(d.live(), [0; 5], "{e}");
    // A new session opens on a fresh DSP process and computes.
    d.fault("");
    works(&d);
}

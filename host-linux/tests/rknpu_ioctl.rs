//! The rocket ioctl sequence of a GEMM, seen by a recording double of the driver: create,
//! map, fini, submit, prep, close with no handle leaked, the submitted streams pointing
//! into the right buffers; and every error path (ETIMEDOUT, EBUSY, EINVAL, a device that
//! vanishes at any call) gives a clear error, closes what was created, and never waits.

use keel_host_linux::device::rknpu::conv::{self, Quant, TASK_ENTRIES, TASK_STRIDE};
use keel_host_linux::device::rknpu::ioctl::{run_gemm, Errno, Ioctl, Job};
use keel_host_linux::device::rknpu::regcmd;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Create(u32),
    Map(u32),
    Fini(u32),
    Submit(Vec<Job>),
    Prep(u32, i64),
    Close(u32),
}

struct Bo {
    handle: u32,
    dma: u32,
    size: u32,
    mem: Option<Vec<u8>>,
    device_owned: bool,
    open: bool,
}

#[derive(Default)]
struct Double {
    calls: Vec<Call>,
    bos: Vec<Bo>,
    /// Fail the first call of this kind with this errno.
    fail: Option<(&'static str, Errno)>,
    /// From this call index on, every call fails with ENODEV.
    vanish_at: Option<usize>,
    /// The regcmd buffer's bytes as submitted.
    submitted_regcmd: Vec<Vec<u8>>,
}

const NOW: i64 = 5_000_000_000;

impl Double {
    fn gate(&mut self, kind: &'static str) -> Result<(), Errno> {
        if self.vanish_at.is_some_and(|n| self.calls.len() >= n) {
            return Err(libc::ENODEV);
        }
        if let Some((k, e)) = self.fail {
            if k == kind {
                self.fail = None;
                return Err(e);
            }
        }
        Ok(())
    }
    fn bo(&mut self, h: u32) -> &mut Bo {
        self.bos.iter_mut().find(|b| b.handle == h && b.open).unwrap_or_else(|| panic!("handle {h} is not open"))
    }
}

impl Ioctl for Double {
    fn create_bo(&mut self, size: u32) -> Result<(u32, u32, u64), Errno> {
        self.gate("create")?;
        let handle = self.bos.len() as u32 + 1;
        let dma = self.bos.last().map_or(0x1000_1000, |b| b.dma + b.size.div_ceil(4096) * 4096 + 4096);
        self.bos.push(Bo { handle, dma, size, mem: None, device_owned: false, open: true });
        self.calls.push(Call::Create(size));
        Ok((handle, dma, u64::from(handle) << 12))
    }
    fn map(&mut self, handle: u32, offset: u64, size: usize) -> Result<(), Errno> {
        self.gate("map")?;
        assert_eq!(offset, u64::from(handle) << 12, "mmap at the offset CREATE_BO gave");
        let b = self.bo(handle);
        assert!(b.mem.is_none() && size <= b.size as usize);
        b.mem = Some(vec![0; size]);
        self.calls.push(Call::Map(handle));
        Ok(())
    }
    fn bytes(&mut self, handle: u32) -> Option<&mut [u8]> {
        let b = self.bo(handle);
        assert!(!b.device_owned, "CPU access to BO {handle} while the device owns it (no PREP_BO)");
        b.mem.as_deref_mut()
    }
    fn fini_bo(&mut self, handle: u32) -> Result<(), Errno> {
        self.gate("fini")?;
        self.bo(handle).device_owned = true;
        self.calls.push(Call::Fini(handle));
        Ok(())
    }
    fn submit(&mut self, jobs: &[Job]) -> Result<(), Errno> {
        self.gate("submit")?;
        for j in jobs {
            for &h in j.inputs.iter().chain(&j.outputs) {
                assert!(self.bo(h).device_owned, "SUBMIT names BO {h} the CPU still owns");
            }
            let rb = self.bos.iter().find(|b| b.open && j.tasks.iter().all(|&(a, _)| a >= b.dma && a < b.dma + b.size)).expect("tasks in one BO");
            self.submitted_regcmd.push(rb.mem.clone().unwrap());
        }
        self.calls.push(Call::Submit(jobs.to_vec()));
        Ok(())
    }
    fn prep_bo(&mut self, handle: u32, deadline_ns: i64) -> Result<(), Errno> {
        self.gate("prep")?;
        self.bo(handle).device_owned = false;
        self.calls.push(Call::Prep(handle, deadline_ns));
        Ok(())
    }
    fn close_bo(&mut self, handle: u32) -> Result<(), Errno> {
        self.calls.push(Call::Close(handle));
        let b = self.bo(handle);
        b.open = false;
        b.mem = None;
        if self.vanish_at.is_some_and(|n| self.calls.len() > n) {
            return Err(libc::ENODEV);
        }
        Ok(())
    }
    fn now_ns(&self) -> i64 {
        NOW
    }
}

fn q() -> Quant {
    Quant { in_zp: -128, w_zp: 0, out_zp: 0, in_scale: 0.05, w_scale: 0.004, out_scale: 0.4 }
}

fn inputs(m: u32, k: u32, n: u32) -> (Vec<u8>, Vec<i32>, Vec<u8>) {
    let w = (0..k * n).map(|i| (i * 31 % 251) as u8).collect();
    let b = (0..n as i32).map(|i| i * 17 - 300).collect();
    let x = (0..m * k).map(|i| (i * 7 % 253) as u8).collect();
    (w, b, x)
}

const TIMEOUT: Duration = Duration::from_millis(500);

#[test]
fn a_gemm_is_a_valid_ioctl_sequence() {
    // Weights larger than the on-chip buffer (tiled) and rows split into tasks.
    let (m, k, n) = (300, 1000, 700);
    let (w, b, x) = inputs(m, k, n);
    let mut d = Double::default();
    let out = run_gemm(&mut d, m, k, n, q(), &w, &b, &x, TIMEOUT).unwrap();
    assert_eq!(out.len(), (m * n) as usize);
    let kinds: Vec<&str> = d.calls.iter().map(|c| match c {
        Call::Create(_) => "create",
        Call::Map(_) => "map",
        Call::Fini(_) => "fini",
        Call::Submit(_) => "submit",
        Call::Prep(..) => "prep",
        Call::Close(_) => "close",
    }).collect();
    let want: Vec<&str> = [["create", "map"].repeat(5), vec!["fini"; 5], vec!["submit", "prep"], vec!["close"; 5]].concat();
    assert_eq!(kinds, want);
    assert!(d.bos.iter().all(|b| !b.open), "every BO closed");
    let Call::Submit(jobs) = &d.calls[15] else { panic!() };
    assert_eq!(jobs.len(), 1);
    let (out_h, regcmd) = (jobs[0].outputs[0], &d.submitted_regcmd[0]);
    assert_eq!(d.calls[16], Call::Prep(out_h, NOW + TIMEOUT.as_nanos() as i64), "PREP_BO on the output with an absolute deadline");
    let addr_of = |h: u32| d.bos.iter().find(|b| b.handle == h).map(|b| (b.dma, b.dma + b.size)).unwrap();
    let (rc0, _) = addr_of(jobs[0].inputs[3]);
    assert!(jobs[0].tasks.len() > 2);
    for (i, &(a, count)) in jobs[0].tasks.iter().enumerate() {
        assert_eq!((a, count), (rc0 + TASK_STRIDE * i as u32, TASK_ENTRIES as u32));
        let at = (a - rc0) as usize;
        let s = regcmd::from_bytes(&regcmd[at..at + TASK_ENTRIES * 8]).unwrap();
        let t = conv::decode(&s).unwrap_or_else(|e| panic!("task {i}: {e}"));
        let inside = |addr: u32, h: u32| {
            let (lo, hi) = addr_of(h);
            addr >= lo && addr < hi
        };
        assert!(inside(t.weights_addr, jobs[0].inputs[0]) && inside(t.bias_addr, jobs[0].inputs[1]), "task {i}");
        assert!(inside(t.input_addr, jobs[0].inputs[2]) && inside(t.output_addr, out_h), "task {i}");
    }
}

#[test]
fn every_error_path_is_clear_and_closes_everything() {
    let (m, k, n) = (8, 64, 64);
    let (w, b, x) = inputs(m, k, n);
    for (kind, errno, says) in [
        ("prep", libc::ETIMEDOUT, "did not finish within 500 ms"),
        ("prep", libc::EBUSY, "EBUSY"),
        ("submit", libc::EINVAL, "SUBMIT: the kernel refused"),
        ("fini", libc::EBUSY, "FINI_BO"),
        ("create", libc::ENOMEM, "ENOMEM"),
        ("map", libc::EINVAL, "mmap"),
    ] {
        let mut d = Double { fail: Some((kind, errno)), ..Default::default() };
        let e = run_gemm(&mut d, m, k, n, q(), &w, &b, &x, TIMEOUT).unwrap_err().to_string();
        assert!(e.starts_with("rknpu: ") && e.contains(says), "{kind}/{errno}: {e}");
        assert!(d.bos.iter().all(|b| !b.open), "{kind}/{errno}: a handle leaked");
    }
    // The device vanishes at every possible call: always an error naming it, never a hang,
    // and every created BO still gets its close.
    let total = {
        let mut d = Double::default();
        run_gemm(&mut d, m, k, n, q(), &w, &b, &x, TIMEOUT).unwrap();
        d.calls.len()
    };
    for at in 0..total {
        let mut d = Double { vanish_at: Some(at), ..Default::default() };
        let e = run_gemm(&mut d, m, k, n, q(), &w, &b, &x, TIMEOUT).unwrap_err().to_string();
        assert!(e.contains("the device is gone"), "vanish at call {at}: {e}");
        assert!(d.bos.iter().all(|b| !b.open), "vanish at call {at}: a handle was not closed");
    }
}

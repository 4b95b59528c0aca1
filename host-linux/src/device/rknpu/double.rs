//! A recording double of the rocket driver for tests: it implements [`Ioctl`] over memory,
//! records every call, checks the ownership rules (CPU access only between PREP_BO and
//! FINI_BO, SUBMIT only of device-owned BOs), and runs each submitted task through the
//! NPU model ([`super::sim`]): its "hardware" computes the exact int32 sums keel's W8A8
//! emulation assumes. Faults are injected by call kind and count (ETIMEDOUT, EBUSY,
//! EINVAL, ...) or by making every call from some point on fail with ENODEV (the device
//! vanished). The log is shared ([`RecordingNpu::log`]) so a test reads it after the
//! device that owned the double is gone.

use super::conv::{self, TASK_ENTRIES};
use super::ioctl::{Errno, Ioctl, Job};
use super::sim;
use std::cell::RefCell;
use std::rc::Rc;

/// One recorded call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// CREATE_BO → handle.
    Create(u32),
    /// mmap of a handle.
    Map(u32),
    /// FINI_BO.
    Fini(u32),
    /// SUBMIT of one job with this many tasks, its output BO.
    Submit(usize, u32),
    /// PREP_BO with its absolute deadline.
    Prep(u32, i64),
    /// GEM_CLOSE.
    Close(u32),
}

/// One buffer object.
#[derive(Debug)]
pub struct Bo {
    /// Handle.
    pub handle: u32,
    /// NPU address.
    pub dma: u32,
    /// Size.
    pub size: u32,
    /// Mapped bytes.
    pub mem: Vec<u8>,
    /// Between FINI_BO and PREP_BO.
    pub device_owned: bool,
    /// Not closed yet.
    pub open: bool,
}

/// What the double saw and holds.
#[derive(Debug, Default)]
pub struct Log {
    /// Calls in order (when [`Log::record`]).
    pub calls: Vec<Call>,
    /// Whether calls are recorded (off for allocation counting).
    pub record: bool,
    /// Every BO ever created.
    pub bos: Vec<Bo>,
    /// Fail the `n`-th call (0-based, counted from the start) of this kind with this errno:
    /// `("create" | "map" | "fini" | "submit" | "prep", n, errno)`.
    pub fail: Option<(&'static str, usize, Errno)>,
    /// Calls of each kind so far: create, map, fini, submit, prep.
    pub counts: [usize; 5],
    /// From this many calls in total on, every call fails with ENODEV.
    pub vanish_at: Option<usize>,
    /// Calls in total.
    pub total: usize,
    /// Tasks the hardware ran.
    pub tasks_run: usize,
    /// The first violation of the driver's rules (a test asserts it is `None`).
    pub violation: Option<String>,
}

impl Log {
    /// Handles created and not closed.
    pub fn open_handles(&self) -> usize {
        self.bos.iter().filter(|b| b.open).count()
    }
    fn gate(&mut self, kind: &'static str) -> Result<(), Errno> {
        self.total += 1;
        if self.vanish_at.is_some_and(|n| self.total > n) {
            return Err(libc::ENODEV);
        }
        let i = ["create", "map", "fini", "submit", "prep"].iter().position(|k| *k == kind).unwrap_or(0);
        let n = self.counts[i];
        self.counts[i] += 1;
        match self.fail {
            Some((k, at, e)) if k == kind && at == n => Err(e),
            _ => Ok(()),
        }
    }
    fn push(&mut self, c: Call) {
        if self.record {
            self.calls.push(c);
        }
    }
    fn bo(&mut self, h: u32) -> Option<&mut Bo> {
        self.bos.iter_mut().find(|b| b.handle == h && b.open)
    }
    fn violate(&mut self, what: String) {
        self.violation.get_or_insert(what);
    }
    /// Index of the open BO holding NPU address `a`, and the offset in it.
    fn at(&self, a: u32) -> Option<(usize, usize)> {
        let i = self.bos.iter().position(|b| b.open && a >= b.dma && a < b.dma + b.size)?;
        Some((i, (a - self.bos[i].dma) as usize))
    }
    /// Runs one task stream at NPU address `a` with `entries` entries.
    fn run(&mut self, a: u32, entries: u32) -> Result<(), String> {
        let (bi, off) = self.at(a).ok_or("a task's stream is in no open BO")?;
        if entries as usize != TASK_ENTRIES {
            return Err(format!("a task of {entries} entries (keel's are {TASK_ENTRIES})"));
        }
        let mut s = [0u64; TASK_ENTRIES];
        let src = self.bos[bi].mem.get(off..off + 8 * TASK_ENTRIES).ok_or("a task's stream runs past its BO")?;
        for (e, b) in s.iter_mut().zip(src.chunks_exact(8)) {
            *e = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        }
        let t = conv::decode_fields(&s)?;
        let (ii, io) = self.at(t.input_addr).ok_or("the input address is in no open BO")?;
        let (wi, wo) = self.at(t.weights_addr).ok_or("the weight address is in no open BO")?;
        let (oi, oo) = self.at(t.output_addr).ok_or("the output address is in no open BO")?;
        if oi == ii || oi == wi {
            return Err("the output BO is also an input".into());
        }
        let mut out = std::mem::take(&mut self.bos[oi].mem);
        let r = sim::run_task(&t, &self.bos[ii].mem[io..], &self.bos[wi].mem[wo..], &mut out[oo..]);
        self.bos[oi].mem = out;
        self.tasks_run += 1;
        r
    }
}

/// The double: an [`Ioctl`] over a shared [`Log`].
pub struct RecordingNpu {
    /// Shared with the test.
    pub log: Rc<RefCell<Log>>,
}

impl RecordingNpu {
    /// A double recording every call, and its log.
    pub fn new() -> (RecordingNpu, Rc<RefCell<Log>>) {
        let log = Rc::new(RefCell::new(Log { record: true, ..Log::default() }));
        (RecordingNpu { log: log.clone() }, log)
    }
}

/// The clock the double reports, ns.
pub const NOW: i64 = 5_000_000_000;

impl Ioctl for RecordingNpu {
    fn create_bo(&mut self, size: u32) -> Result<(u32, u32, u64), Errno> {
        let mut l = self.log.borrow_mut();
        l.gate("create")?;
        let handle = l.bos.len() as u32 + 1;
        let dma = l.bos.last().map_or(0x1000_0000, |b| b.dma + b.size.div_ceil(4096) * 4096 + 4096);
        if u64::from(dma) + u64::from(size) > 1 << 32 {
            return Err(libc::ENOMEM);
        }
        l.bos.push(Bo { handle, dma, size, mem: Vec::new(), device_owned: false, open: true });
        l.push(Call::Create(handle));
        Ok((handle, dma, u64::from(handle) << 12))
    }
    fn map(&mut self, handle: u32, offset: u64, size: usize) -> Result<(), Errno> {
        let mut l = self.log.borrow_mut();
        l.gate("map")?;
        if offset != u64::from(handle) << 12 {
            l.violate(format!("mmap of BO {handle} at an offset CREATE_BO did not give"));
            return Err(libc::EINVAL);
        }
        let b = l.bo(handle).ok_or(libc::EINVAL)?;
        if size > b.size as usize || !b.mem.is_empty() {
            return Err(libc::EINVAL);
        }
        b.mem = vec![0xAA; size];
        l.push(Call::Map(handle));
        Ok(())
    }
    fn bytes(&mut self, handle: u32) -> Option<&mut [u8]> {
        let l = self.log.as_ptr();
        // SAFETY: the log lives as long as `self` (an Rc this double holds); the slice is
        // tied to `&mut self`, and the double is not re-entered while it is used.
        let l = unsafe { &mut *l };
        let owned = l.bo(handle)?.device_owned;
        if owned {
            l.violate(format!("CPU access to BO {handle} while the device owns it (FINI_BO without PREP_BO)"));
        }
        Some(&mut l.bo(handle)?.mem[..])
    }
    fn fini_bo(&mut self, handle: u32) -> Result<(), Errno> {
        let mut l = self.log.borrow_mut();
        l.gate("fini")?;
        l.bo(handle).ok_or(libc::EINVAL)?.device_owned = true;
        l.push(Call::Fini(handle));
        Ok(())
    }
    fn submit(&mut self, jobs: &[Job]) -> Result<(), Errno> {
        let mut l = self.log.borrow_mut();
        l.gate("submit")?;
        for j in jobs {
            for &h in j.inputs.iter().chain(&j.outputs) {
                if !l.bo(h).is_some_and(|b| b.device_owned) {
                    l.violate(format!("SUBMIT names BO {h}, which the CPU owns or is closed"));
                    return Err(libc::EINVAL);
                }
            }
            l.push(Call::Submit(j.tasks.len(), j.outputs.first().copied().unwrap_or(0)));
            for &(a, n) in &j.tasks {
                if let Err(e) = l.run(a, n) {
                    l.violate(format!("a task the hardware cannot run: {e}"));
                    return Err(libc::EINVAL);
                }
            }
        }
        Ok(())
    }
    fn prep_bo(&mut self, handle: u32, deadline_ns: i64) -> Result<(), Errno> {
        let mut l = self.log.borrow_mut();
        l.gate("prep")?;
        if deadline_ns <= NOW {
            l.violate(format!("PREP_BO of BO {handle} with a deadline not in the future ({deadline_ns})"));
        }
        l.bo(handle).ok_or(libc::EINVAL)?.device_owned = false;
        l.push(Call::Prep(handle, deadline_ns));
        Ok(())
    }
    fn close_bo(&mut self, handle: u32) -> Result<(), Errno> {
        let mut l = self.log.borrow_mut();
        l.total += 1;
        l.push(Call::Close(handle));
        let b = l.bo(handle).ok_or(libc::EINVAL)?;
        b.open = false;
        b.mem = Vec::new();
        if l.vanish_at.is_some_and(|n| l.total > n) {
            return Err(libc::ENODEV);
        }
        Ok(())
    }
    fn now_ns(&self) -> i64 {
        NOW
    }
}

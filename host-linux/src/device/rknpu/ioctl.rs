//! The rocket driver's ioctls behind a small trait ([`Ioctl`]), the real node
//! ([`Node`]: `/dev/accel/accel0`), and one GEMM run through them ([`run_gemm`]): buffer
//! objects created and mapped, filled, handed to the device (FINI), one SUBMIT of a job
//! of chained tasks, completion by PREP_BO on the output with an absolute timeout, the
//! result read, every buffer unmapped and closed on every path. Tests substitute a
//! recording double for [`Node`].

use super::conv::{Addrs, Quant, TASK_ENTRIES, TASK_STRIDE};
use super::uapi::{drm_rocket_create_bo, IOCTL_CREATE_BO, IOCTL_FINI_BO, IOCTL_PREP_BO, IOCTL_SUBMIT};
use super::{gemm, pack};
use std::time::Duration;

/// An errno from the driver.
pub type Errno = i32;

/// One job as SUBMIT carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// `(regcmd address, entries)` per task, in order.
    pub tasks: Vec<(u32, u32)>,
    /// BOs the job reads.
    pub inputs: Vec<u32>,
    /// BOs the job writes.
    pub outputs: Vec<u32>,
}

/// The driver's operations on one open node.
pub trait Ioctl {
    /// CREATE_BO: `(handle, NPU address, mmap offset)`.
    fn create_bo(&mut self, size: u32) -> Result<(u32, u32, u64), Errno>;
    /// Maps a BO (by its mmap offset) for the CPU.
    fn map(&mut self, handle: u32, offset: u64, size: usize) -> Result<(), Errno>;
    /// The mapped bytes of a BO.
    fn bytes(&mut self, handle: u32) -> Option<&mut [u8]>;
    /// FINI_BO: the device owns the BO again.
    fn fini_bo(&mut self, handle: u32) -> Result<(), Errno>;
    /// SUBMIT.
    fn submit(&mut self, jobs: &[Job]) -> Result<(), Errno>;
    /// PREP_BO: waits until `deadline_ns` (CLOCK_MONOTONIC) for the BO's writers.
    fn prep_bo(&mut self, handle: u32, deadline_ns: i64) -> Result<(), Errno>;
    /// Unmaps (if mapped) and closes a BO (GEM_CLOSE).
    fn close_bo(&mut self, handle: u32) -> Result<(), Errno>;
    /// CLOCK_MONOTONIC now, ns.
    fn now_ns(&self) -> i64;
}

/// A failed run: what failed, in words that name the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunError(pub String);

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RunError {}

/// An errno as a clear error naming what failed and the likely fix.
pub fn explain(what: &str, e: Errno, timeout: Duration) -> RunError {
    let why = match e {
        libc::ETIMEDOUT => format!("the NPU did not finish within {} ms (ETIMEDOUT): the job hung or the cores are busy; outputs are not used", timeout.as_millis()),
        libc::EBUSY => "the buffer is still in use by the device (EBUSY)".to_string(),
        libc::EINVAL => "the kernel refused the arguments (EINVAL): a driver/uAPI mismatch or a bad stream; check the kernel is 6.18+".to_string(),
        libc::ENOMEM => "out of NPU-addressable memory (ENOMEM)".to_string(),
        libc::ENODEV | libc::EIO | libc::ENXIO | libc::EBADF => format!("the device is gone (errno {e}): the driver was unloaded or the NPU reset"),
        _ => format!("errno {e}"),
    };
    RunError(format!("rknpu: {what}: {why}"))
}

/// `Y = X·W` on the NPU: `w` raw int8 `[n][k]`, `bias` int32 per output, `x` raw int8
/// `[m][k]`; returns the output buffer's int8 `[m][n]` (via [`pack::output`]). Every BO
/// created is closed before returning, whatever happens.
#[allow(clippy::too_many_arguments)]
pub fn run_gemm<I: Ioctl>(io: &mut I, m: u32, k: u32, n: u32, q: Quant, w: &[u8], bias: &[i32], x: &[u8], timeout: Duration) -> Result<Vec<u8>, RunError> {
    let sizes = gemm::plan(m, k, n, q, &Addrs::default()).map_err(RunError)?;
    let lens = [sizes.weights_len, sizes.bias_len, sizes.input_len, sizes.output_len, sizes.regcmd_len];
    let mut bos: Vec<(u32, u32)> = Vec::with_capacity(5);
    let r = (|| {
        for &len in &lens {
            let size = u32::try_from(len).map_err(|_| RunError(format!("rknpu: a {len}-byte buffer exceeds the 32-bit NPU window")))?;
            let (h, dma, off) = io.create_bo(size).map_err(|e| explain("CREATE_BO", e, timeout))?;
            bos.push((h, dma));
            io.map(h, off, len).map_err(|e| explain("mmap", e, timeout))?;
        }
        let base = Addrs { weights: bos[0].1, bias: bos[1].1, input: bos[2].1, output: bos[3].1, regcmd: bos[4].1 };
        let p = gemm::plan(m, k, n, q, &base).map_err(RunError)?;
        let wq = gemm::pack_weights(&p, w, q.w_zp).map_err(RunError)?;
        let bq = pack::biases(bias, w, k, n, q.in_zp, q.w_zp, super::conv::truncate_bits(q.w_scale)).map_err(RunError)?;
        let xq = pack::input(x, 1, m, k, q.in_zp).map_err(RunError)?;
        let rq = gemm::regcmd_buffer(&p);
        for (i, data) in [(0, &wq), (1, &bq), (2, &xq), (4, &rq)] {
            let dst = io.bytes(bos[i].0).ok_or_else(|| RunError("rknpu: a buffer is not mapped".into()))?;
            let len = dst.len();
            dst.get_mut(..data.len()).ok_or_else(|| RunError(format!("rknpu: {} bytes do not fit a {len}-byte buffer", data.len())))?.copy_from_slice(data);
        }
        for &(h, _) in &bos {
            io.fini_bo(h).map_err(|e| explain("FINI_BO", e, timeout))?;
        }
        let tasks = (0..p.tasks.len()).map(|i| (base.regcmd + TASK_STRIDE * i as u32, TASK_ENTRIES as u32)).collect();
        let job = Job { tasks, inputs: vec![bos[0].0, bos[1].0, bos[2].0, bos[4].0], outputs: vec![bos[3].0] };
        io.submit(&[job]).map_err(|e| explain("SUBMIT", e, timeout))?;
        let deadline = io.now_ns().saturating_add(i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX));
        io.prep_bo(bos[3].0, deadline).map_err(|e| explain("waiting for the output (PREP_BO)", e, timeout))?;
        let out = io.bytes(bos[3].0).ok_or_else(|| RunError("rknpu: the output buffer is not mapped".into()))?;
        pack::output(out, 1, m, n).map_err(RunError)
    })();
    let mut close_err = None;
    for &(h, _) in bos.iter().rev() {
        if let Err(e) = io.close_bo(h) {
            close_err.get_or_insert(explain("closing a buffer", e, timeout));
        }
    }
    match (r, close_err) {
        (Err(e), _) => Err(e),
        (Ok(_), Some(e)) => Err(e),
        (Ok(v), None) => Ok(v),
    }
}

/// The real node: `/dev/accel/accel0` opened read/write.
pub struct Node {
    fd: std::fs::File,
    maps: Vec<(u32, *mut u8, usize)>,
    /// SUBMIT's tables, kept so that a submit allocates nothing once they have grown.
    tasks: Vec<super::uapi::drm_rocket_task>,
    jobs: Vec<super::uapi::drm_rocket_job>,
}

impl Node {
    /// Opens the node.
    pub fn open(path: &std::path::Path) -> std::io::Result<Node> {
        Ok(Node { fd: std::fs::OpenOptions::new().read(true).write(true).open(path)?, maps: Vec::new(), tasks: Vec::new(), jobs: Vec::new() })
    }

    fn ioctl<T>(&self, req: u64, arg: &mut T) -> Result<(), Errno> {
        use std::os::fd::AsRawFd;
        loop {
            // SAFETY: `arg` is a live, exclusively borrowed #[repr(C)] struct of the size the
            // request number encodes; the kernel reads/writes only those bytes.
            let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), req as libc::Ioctl, arg as *mut T) };
            if r >= 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
            if e != libc::EINTR && e != libc::EAGAIN {
                return Err(e);
            }
        }
    }
}

/// `struct drm_gem_close` (the DRM core's, not rocket's).
#[repr(C)]
struct GemClose {
    handle: u32,
    pad: u32,
}
const IOCTL_GEM_CLOSE: u64 = (1 << 30) | (8 << 16) | ((b'd' as u64) << 8) | 0x09;

impl Ioctl for Node {
    fn create_bo(&mut self, size: u32) -> Result<(u32, u32, u64), Errno> {
        let mut a = drm_rocket_create_bo { size, ..Default::default() };
        self.ioctl(IOCTL_CREATE_BO, &mut a)?;
        let dma = u32::try_from(a.dma_address).map_err(|_| libc::EINVAL)?;
        Ok((a.handle, dma, a.offset))
    }
    fn map(&mut self, handle: u32, offset: u64, size: usize) -> Result<(), Errno> {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of the BO at the offset the driver returned; the
        // pointer is kept with its length and unmapped in close_bo (or drop).
        let p = unsafe { libc::mmap(std::ptr::null_mut(), size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, self.fd.as_raw_fd(), offset as libc::off_t) };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
        }
        self.maps.push((handle, p.cast(), size));
        Ok(())
    }
    fn bytes(&mut self, handle: u32) -> Option<&mut [u8]> {
        let &(_, p, len) = self.maps.iter().find(|m| m.0 == handle)?;
        // SAFETY: the mapping is live (removed only by close_bo/drop) and `&mut self` makes
        // this the only view handed out.
        Some(unsafe { std::slice::from_raw_parts_mut(p, len) })
    }
    fn fini_bo(&mut self, handle: u32) -> Result<(), Errno> {
        let mut a = super::uapi::drm_rocket_fini_bo { handle, reserved: 0 };
        self.ioctl(IOCTL_FINI_BO, &mut a)
    }
    fn submit(&mut self, jobs: &[Job]) -> Result<(), Errno> {
        use super::uapi::{drm_rocket_job, drm_rocket_submit, drm_rocket_task};
        self.tasks.clear();
        for j in jobs {
            self.tasks.extend(j.tasks.iter().map(|&(regcmd, regcmd_count)| drm_rocket_task { regcmd, regcmd_count }));
        }
        self.jobs.clear();
        let mut at = 0;
        for j in jobs {
            let t = &self.tasks[at..at + j.tasks.len()];
            at += j.tasks.len();
            self.jobs.push(drm_rocket_job {
                tasks: t.as_ptr() as u64,
                in_bo_handles: j.inputs.as_ptr() as u64,
                out_bo_handles: j.outputs.as_ptr() as u64,
                task_count: t.len() as u32,
                task_struct_size: std::mem::size_of::<drm_rocket_task>() as u32,
                in_bo_handle_count: j.inputs.len() as u32,
                out_bo_handle_count: j.outputs.len() as u32,
            });
        }
        let mut s = drm_rocket_submit { jobs: self.jobs.as_ptr() as u64, job_count: self.jobs.len() as u32, job_struct_size: std::mem::size_of::<drm_rocket_job>() as u32, reserved: 0 };
        self.ioctl(IOCTL_SUBMIT, &mut s)
    }
    fn prep_bo(&mut self, handle: u32, deadline_ns: i64) -> Result<(), Errno> {
        let mut a = super::uapi::drm_rocket_prep_bo { handle, reserved: 0, timeout_ns: deadline_ns };
        self.ioctl(IOCTL_PREP_BO, &mut a)
    }
    fn close_bo(&mut self, handle: u32) -> Result<(), Errno> {
        if let Some(i) = self.maps.iter().position(|m| m.0 == handle) {
            let (_, p, len) = self.maps.swap_remove(i);
            // SAFETY: `p`/`len` is a mapping this node made and has not unmapped.
            unsafe { libc::munmap(p.cast(), len) };
        }
        self.ioctl(IOCTL_GEM_CLOSE, &mut GemClose { handle, pad: 0 })
    }
    fn now_ns(&self) -> i64 {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes the timespec it is given.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
        t.tv_sec.saturating_mul(1_000_000_000).saturating_add(t.tv_nsec)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for &(_, p, len) in &self.maps {
            // SAFETY: mappings this node made and has not unmapped.
            unsafe { libc::munmap(p.cast(), len) };
        }
    }
}

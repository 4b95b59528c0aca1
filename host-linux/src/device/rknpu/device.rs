//! The `rknpu` device: keel's HAL traits (`Device`, `SharedBuffers`, `Queue`) over the
//! rocket driver's ioctls ([`Ioctl`]), so keel-core's one device engine drives it as it
//! drives `hexagon-sim` and `hexagon`. It runs one op, MatMul over Q8_0 weights (the
//! engine converts other types at load), as keel's W8A8 scheme ([`super::w8a8`]): the
//! first product of a weight dequantizes its Tiles32 rows, rotates them (randomized
//! Hadamard, when the scheme says), quantizes them to int8 with one scale per output
//! channel and packs them into a weight BO with two command streams (one row, and
//! [`BATCH_ROWS`] rows), all kept, and with the scheme's residual weights the same again
//! for what the int8 matrix misses; every product then rotates and quantizes each
//! activation row on the CPU (one scale per token; with residual activations its rounding
//! error again), packs the rows into the input BO, and runs one job of int32-mode tasks
//! ([`super::conv::OUT32_REGISTERS`]) per (activation pass, weight matrix): FINI_BO,
//! SUBMIT, PREP_BO on the output with an absolute deadline, and `y (+)= f32(sum) · (sx ·
//! sw)` in the emulation's order, so the emulation ([`super::w8a8::matmul`]) gives the
//! same bits.
//!
//! Buffers the engine allocates are host memory (the NPU never reads them: activations
//! are requantized into the input BO). Allocation: BOs and streams are made on a weight's
//! first product and at open; after that a product allocates nothing. Nothing here has
//! run on hardware.

use std::time::Duration;

use keel_npu_hal::caps::{DTypeSet, MemoryLimits, OpSet, Units};
use keel_npu_hal::device::{BatchStatus, Completion, Device, Queue, Seq, SharedBuffers};
use keel_npu_hal::op::{Batch, DType, Layout, OpDesc, OpKind, Reason, Support, TensorDesc};
use keel_npu_hal::support::check_op;
use keel_npu_hal::{tile, Arch, BufferId, BufferRules, Caps, ErrorKind, ErrorType, Identity, UnitState};

use super::conv::{Addrs, Quant, TASK_ENTRIES, TASK_STRIDE};
use super::ioctl::{explain, Errno, Ioctl, Job};
use super::w8a8::{self, Scheme};
use super::{gemm, pack};
use crate::device::DeviceError;

/// Rows of one NPU job for a prompt batch (a batch of more rows runs as several jobs,
/// fewer rows as this many with the rest ignored); a single row has its own streams.
pub const BATCH_ROWS: u32 = 64;
/// Widest inner dimension (K) the input BO holds.
pub const MAX_K: u32 = 16384;
/// Most outputs (N) the output BO holds.
pub const MAX_N: u32 = 65536;
/// Smallest product (rows × cols) the device takes: smaller ones stay on the CPU.
pub const MIN_WEIGHTS: u64 = 64 * 64;

/// The per-tensor fields of the streams: symmetric int8 (zero points 0 in the NPU's
/// signed view), scales unused (int32 mode).
const Q: Quant = Quant { in_zp: -128, w_zp: -128, out_zp: 0, in_scale: 1.0, w_scale: 1.0, out_scale: 1.0 };

/// A weight as the NPU holds it.
struct Prepared {
    /// Where the engine put its Tiles32 bytes.
    buf: BufferId,
    offset: u32,
    rows: u32,
    cols: u32,
    /// Per-output-channel scales.
    scale: Vec<f32>,
    /// The jobs of one row and of a batch.
    jobs: [Job; 2],
    /// With the scheme's residual weights: their scales and jobs (a second weight BO).
    residual: Option<(Vec<f32>, [Job; 2])>,
}

impl Prepared {
    /// The weight matrices of a product, in the emulation's order: the int8 matrix's
    /// scales and jobs, then the residual matrix's (with the scheme's residual weights).
    fn passes(&self) -> impl Iterator<Item = (&[f32], &[Job; 2])> {
        core::iter::once((&self.scale[..], &self.jobs)).chain(self.residual.as_ref().map(|(s, j)| (&s[..], j)))
    }
}

/// An open `rknpu` device.
pub struct Rknpu {
    io: Box<dyn Ioctl>,
    name: String,
    identity: Identity,
    caps: Caps,
    scheme: Scheme,
    timeout: Duration,
    bufs: Vec<Option<(Vec<u8>, bool)>>,
    weights: Vec<Prepared>,
    /// Input and output BOs: (handle, NPU address).
    input: (u32, u32),
    output: (u32, u32),
    signs: Vec<(usize, Vec<f32>)>,
    /// Scratch: one rotated row, one int8 row, the batch's activation scales, and with
    /// the scheme's residual activations their int8 rows and scales.
    row: Vec<f32>,
    qrow: Vec<i8>,
    sx: Vec<f32>,
    qres: Vec<i8>,
    sx2: Vec<f32>,
    done: Option<Completion>,
    seq: Seq,
    lost: Option<String>,
    /// Every BO created and not closed.
    handles: Vec<u32>,
}

impl Rknpu {
    /// Opens the device over `io`: the input and output BOs, then a 64×64 product checked
    /// against the CPU (the unit is usable only if it matches).
    pub fn new(io: Box<dyn Ioctl>, name: &str, scheme: Scheme, timeout: Duration) -> Result<Rknpu, DeviceError> {
        let mut d = Rknpu {
            io,
            name: name.to_string(),
            identity: Identity { arch: Arch::Rk3588, firmware_version: 0, protocol_version: 0, emulated: false },
            caps: Caps {
                units: Units { hvx_contexts: 0, hvx: UnitState::Absent, hmx: UnitState::Absent, npu_cores: 3, npu: UnitState::Present },
                memory: MemoryLimits { va_budget: 3 << 30, scratch_bytes: 384 << 10, buffers: BufferRules { align: 64, granule: 64, max_size: 1 << 31 } },
                ops: OpSet::default().with(OpKind::MatMul.code()),
                matmul_weights: DTypeSet::default().with(DType::Q8_0),
                max_in_flight: 1,
                max_batch_ops: 1,
            },
            scheme: Scheme { fine: true, ..scheme },
            timeout,
            bufs: Vec::new(),
            weights: Vec::new(),
            input: (0, 0),
            output: (0, 0),
            signs: Vec::new(),
            row: vec![0.0; MAX_K as usize],
            qrow: vec![0; MAX_K as usize],
            sx: vec![0.0; BATCH_ROWS as usize],
            qres: vec![0; if scheme.x_residual { (BATCH_ROWS * MAX_K) as usize } else { 0 }],
            sx2: vec![0.0; BATCH_ROWS as usize],
            done: None,
            seq: 0,
            lost: None,
            handles: Vec::new(),
        };
        d.input = d.bo(pack::input_len(1, BATCH_ROWS, MAX_K))?;
        d.output = d.bo(gemm::output32_len(BATCH_ROWS, MAX_N))?;
        d.self_test()?;
        Ok(d)
    }

    /// The device's name in errors.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes of host buffers allocated now.
    pub fn allocated_bytes(&self) -> u64 {
        self.bufs.iter().flatten().map(|(b, _)| b.len() as u64).sum()
    }

    fn err(&self, kind: ErrorKind, what: impl Into<String>) -> DeviceError {
        DeviceError::new(&self.name, kind, what)
    }

    /// An ioctl failure as a device error; a vanished device is remembered (later calls fail at once).
    fn ioctl_err(&mut self, what: &str, e: Errno) -> DeviceError {
        let kind = match e {
            libc::ETIMEDOUT => ErrorKind::Timeout,
            libc::EBUSY => ErrorKind::Busy,
            libc::EINVAL => ErrorKind::InvalidArgument,
            libc::ENOMEM => ErrorKind::OutOfMemory,
            libc::ENODEV | libc::EIO | libc::ENXIO | libc::EBADF => ErrorKind::DeviceLost,
            _ => ErrorKind::Other,
        };
        let msg = explain(what, e, self.timeout).0;
        if matches!(kind, ErrorKind::DeviceLost | ErrorKind::Timeout) {
            self.lost.get_or_insert(msg.clone());
        }
        self.err(kind, msg)
    }

    fn check(&self) -> Result<(), DeviceError> {
        match &self.lost {
            Some(why) => Err(self.err(ErrorKind::DeviceLost, format!("unusable after an earlier failure: {why}"))),
            None => Ok(()),
        }
    }

    /// Creates and maps a BO of `len` bytes: (handle, NPU address).
    fn bo(&mut self, len: usize) -> Result<(u32, u32), DeviceError> {
        let size = u32::try_from(len).map_err(|_| self.err(ErrorKind::OutOfMemory, format!("a {len}-byte buffer exceeds the NPU's 32-bit window")))?;
        let (h, dma, off) = self.io.create_bo(size).map_err(|e| self.ioctl_err("CREATE_BO", e))?;
        self.handles.push(h);
        self.io.map(h, off, len).map_err(|e| self.ioctl_err("mmap", e))?;
        Ok((h, dma))
    }

    /// A BO's mapped bytes.
    fn bytes(&mut self, h: u32) -> Result<&mut [u8], DeviceError> {
        if self.io.bytes(h).is_none() {
            return Err(self.err(ErrorKind::Other, format!("BO {h} is not mapped")));
        }
        self.io.bytes(h).ok_or_else(|| DeviceError::new("rknpu", ErrorKind::Other, format!("BO {h} is not mapped")))
    }

    /// A BO filled with `data` and handed to the device.
    fn bo_with(&mut self, data: &[u8]) -> Result<(u32, u32), DeviceError> {
        let (h, dma) = self.bo(data.len())?;
        self.bytes(h)?[..data.len()].copy_from_slice(data);
        self.io.fini_bo(h).map_err(|e| self.ioctl_err("FINI_BO", e))?;
        Ok((h, dma))
    }

    /// Closes every BO (also on drop); the first failure is returned.
    pub fn close(&mut self) -> Result<(), DeviceError> {
        let mut first = None;
        while let Some(h) = self.handles.pop() {
            if let Err(e) = self.io.close_bo(h) {
                let e = self.ioctl_err("closing a buffer", e);
                first.get_or_insert(e);
            }
        }
        self.weights.clear();
        first.map_or(Ok(()), Err)
    }

    /// Packs int8 weights `q` (`rows × cols`, one row per output) into a weight BO with
    /// its two streams.
    fn prepare_q(&mut self, q: &[i8], rows: u32, cols: u32) -> Result<[Job; 2], DeviceError> {
        let raw: Vec<u8> = q.iter().map(|&v| (v as u8) ^ 0x80).collect();
        let p = gemm::plan_out(1, cols, rows, Q, &Addrs::default(), true).map_err(|e| self.err(ErrorKind::Unsupported, e))?;
        let packed = gemm::pack_weights(&p, &raw, Q.w_zp).map_err(|e| self.err(ErrorKind::InvalidArgument, e))?;
        let (wh, wdma) = self.bo_with(&packed)?;
        let mut jobs = [Job { tasks: Vec::new(), inputs: Vec::new(), outputs: Vec::new() }, Job { tasks: Vec::new(), inputs: Vec::new(), outputs: Vec::new() }];
        for (i, m) in [1, BATCH_ROWS].into_iter().enumerate() {
            let len = gemm::plan_out(m, cols, rows, Q, &Addrs::default(), true).map_err(|e| self.err(ErrorKind::Unsupported, e))?.regcmd_len;
            let (rh, rdma) = self.bo(len)?;
            let base = Addrs { input: self.input.1, weights: wdma, output: self.output.1, bias: 0, regcmd: rdma };
            let p = gemm::plan_out(m, cols, rows, Q, &base, true).map_err(|e| self.err(ErrorKind::Unsupported, e))?;
            let rc = gemm::regcmd_buffer(&p);
            self.bytes(rh)?[..rc.len()].copy_from_slice(&rc);
            self.io.fini_bo(rh).map_err(|e| self.ioctl_err("FINI_BO", e))?;
            jobs[i] = Job {
                tasks: (0..p.tasks.len()).map(|t| (rdma + TASK_STRIDE * t as u32, TASK_ENTRIES as u32)).collect(),
                inputs: vec![wh, self.input.0, rh],
                outputs: vec![self.output.0],
            };
        }
        Ok(jobs)
    }

    /// Runs job `job` over the int8 rows already in the input BO; the int32 sums are then
    /// in the output BO (CPU-owned again).
    fn run_job(&mut self, job: &Job) -> Result<(), DeviceError> {
        self.io.fini_bo(self.input.0).map_err(|e| self.ioctl_err("FINI_BO (input)", e))?;
        self.io.fini_bo(self.output.0).map_err(|e| self.ioctl_err("FINI_BO (output)", e))?;
        self.io.submit(std::slice::from_ref(job)).map_err(|e| self.ioctl_err("SUBMIT", e))?;
        let deadline = self.io.now_ns().saturating_add(i64::try_from(self.timeout.as_nanos()).unwrap_or(i64::MAX));
        self.io.prep_bo(self.output.0, deadline).map_err(|e| self.ioctl_err("waiting for the output (PREP_BO)", e))?;
        self.io.prep_bo(self.input.0, deadline).map_err(|e| self.ioctl_err("taking the input back (PREP_BO)", e))?;
        Ok(())
    }

    /// Writes int8 row `i` (of `m_rows` in the job) into the input BO's `[K/16][rows][16]` layout.
    fn put_row(input: &mut [u8], q: &[i8], i: usize, m_rows: usize) {
        let k = q.len();
        for g in 0..k.div_ceil(16) {
            let dst = &mut input[g * m_rows * 16 + i * 16..][..16];
            for (c, d) in dst.iter_mut().enumerate() {
                *d = q.get(g * 16 + c).map_or(0, |&v| v as u8);
            }
        }
    }

    /// A 64×64 product of known int8 values compared with the CPU's integer sums.
    fn self_test(&mut self) -> Result<(), DeviceError> {
        let (n, k) = (64u32, 64u32);
        let w: Vec<i8> = (0..n * k).map(|i| ((i * 37 + 11) % 255) as i32 - 127).map(|v| v as i8).collect();
        let x: Vec<i8> = (0..k).map(|i| ((i * 53 + 5) % 255) as i32 - 127).map(|v| v as i8).collect();
        let before = self.handles.len();
        let jobs = self.prepare_q(&w, n, k)?;
        let ih = self.input.0;
        Self::put_row(self.bytes(ih)?, &x, 0, 1);
        self.run_job(&jobs[0])?;
        let oh = self.output.0;
        let out = self.bytes(oh)?;
        let ok = (0..n).all(|r| {
            let want = w8a8::dot_i8(&x, &w[(r * k) as usize..((r + 1) * k) as usize]);
            let at = gemm::output32_at(1, 0, r);
            i32::from_le_bytes([out[at], out[at + 1], out[at + 2], out[at + 3]]) == want
        });
        // The test's BOs go again.
        while self.handles.len() > before {
            let h = self.handles.pop().unwrap_or_default();
            self.io.close_bo(h).map_err(|e| self.ioctl_err("closing a buffer", e))?;
        }
        if !ok {
            self.caps.units.npu = UnitState::Failed;
            return Err(self.err(ErrorKind::BadResponse, "the self-test's 64x64 int8 product differs from the CPU's: the NPU is not used"));
        }
        self.caps.units.npu = UnitState::Verified;
        Ok(())
    }

    /// The weight at `(buf, offset)`, prepared on its first product.
    fn weight(&mut self, w: &TensorDesc, buf: BufferId) -> Result<usize, DeviceError> {
        let (cols, rows) = (w.ne[0], w.ne[1]);
        if let Some(i) = self.weights.iter().position(|p| p.buf == buf && p.offset == w.offset && p.rows == rows && p.cols == cols) {
            return Ok(i);
        }
        // Dequantize the Tiles32 Q8_0 bytes (d · q, as keel's CPU dequantizes Q8_0).
        let g_count = tile::groups(rows);
        let sc = tile::scales_offset(DType::Q8_0, rows, cols).ok_or_else(|| self.err(ErrorKind::Unsupported, "a weight with no Tiles32 layout"))?;
        let size = tile::packed_size(DType::Q8_0, rows, cols).unwrap_or(0);
        let name = self.name.clone();
        let src = self.buf(buf)?.get(w.offset as usize..w.offset as usize + size).ok_or_else(|| DeviceError::new(&name, ErrorKind::InvalidArgument, "a weight lies outside its buffer"))?;
        let (ru, cu) = (rows as usize, cols as usize);
        let mut f = vec![0f32; ru * cu];
        for r in 0..ru {
            let (g, rr) = (r / 32, r % 32);
            for b in 0..cu / 32 {
                let t = (b * g_count + g) * 1024;
                let si = sc + ((b * g_count + g) * 32 + rr) * 4;
                let d = f32::from_le_bytes([src[si], src[si + 1], src[si + 2], src[si + 3]]);
                for kk in 0..32 {
                    let q = (src[t + (kk / 4) * 128 + 4 * rr + kk % 4] ^ 0x80) as i8;
                    f[r * cu + 32 * b + kk] = f32::from(q) * d;
                }
            }
        }
        if self.scheme.rotate {
            let s = self.signs_for(cu);
            for row in f.chunks_exact_mut(cu) {
                w8a8::rotate(row, s);
            }
        }
        let qm = w8a8::QMatrix::new(&f, ru, cu, true, self.scheme.residual);
        let jobs = self.prepare_q(&qm.q, rows, cols)?;
        let residual = if self.scheme.residual { Some((qm.scale2, self.prepare_q(&qm.q2, rows, cols)?)) } else { None };
        self.weights.push(Prepared { buf, offset: w.offset, rows, cols, scale: qm.scale, jobs, residual });
        Ok(self.weights.len() - 1)
    }

    fn signs_for(&mut self, n: usize) -> &[f32] {
        if !self.signs.iter().any(|(c, _)| *c == n) {
            self.signs.push((n, w8a8::signs(n, self.scheme.seed ^ n as u64)));
        }
        &self.signs.iter().find(|(c, _)| *c == n).map(|(_, s)| s.as_slice()).unwrap_or(&[])
    }

    fn buf(&mut self, id: BufferId) -> Result<&mut Vec<u8>, DeviceError> {
        let i = id.0 as usize;
        if !matches!(self.bufs.get(i), Some(Some(_))) {
            return Err(self.err(ErrorKind::InvalidArgument, format!("unknown buffer {i}")));
        }
        match &mut self.bufs[i] {
            Some((b, _)) => Ok(b),
            None => Err(DeviceError::new("rknpu", ErrorKind::InvalidArgument, format!("unknown buffer {i}"))),
        }
    }

    /// `y[i·rows + r] = Σ_k W[r,k]·x[i·cols + k]` through the scheme, on the NPU.
    fn matmul(&mut self, batch: &Batch<'_>, op: &OpDesc) -> Result<(), DeviceError> {
        let t = |i: Option<u16>| i.and_then(|i| batch.tensors.get(usize::from(i))).copied();
        let (Some(w), Some(x), Some(y)) = (t(op.src[0]), t(op.src[1]), t(Some(op.dst))) else {
            return Err(self.err(ErrorKind::InvalidArgument, "a MatMul names a tensor the batch does not have"));
        };
        let buf_of = |d: &TensorDesc| batch.buffers.get(usize::from(d.buffer)).map(|b| b.id);
        let (Some(wb), Some(xb), Some(yb)) = (buf_of(&w), buf_of(&x), buf_of(&y)) else {
            return Err(self.err(ErrorKind::InvalidArgument, "a MatMul names a buffer the batch does not have"));
        };
        if xb == yb || xb == wb || yb == wb {
            return Err(self.err(ErrorKind::InvalidArgument, "a MatMul's weights, activations and outputs must be in different buffers"));
        }
        let wi = self.weight(&w, wb)?;
        let (rows, cols, n) = (w.ne[1] as usize, w.ne[0] as usize, x.ne[1] as usize);
        // Take the activation and output buffers out while the device works (no copy).
        let mut xv = std::mem::take(self.buf(xb)?);
        let mut yv = std::mem::take(self.buf(yb)?);
        // And the prepared weights (their jobs and scales are read while the device runs).
        let weights = std::mem::take(&mut self.weights);
        let r = self.run_rows(&weights[wi], &xv[x.offset as usize..], &mut yv[y.offset as usize..], rows, cols, n);
        self.weights = weights;
        std::mem::swap(self.buf(xb)?, &mut xv);
        std::mem::swap(self.buf(yb)?, &mut yv);
        r
    }

    /// Runs the scheme's int8 products for `n` activation rows (f32 bytes in `x`) into
    /// `y`: per job of up to [`BATCH_ROWS`] rows, each row rotated and quantized (and,
    /// with residual activations, its rounding error quantized again), then one NPU job per
    /// (activation pass, weight matrix) in the emulation's order, each job's int32 sums
    /// scaled and added into `y` as [`w8a8::matmul`] adds them.
    fn run_rows(&mut self, p: &Prepared, x: &[u8], y: &mut [u8], rows: usize, cols: usize, n: usize) -> Result<(), DeviceError> {
        if x.len() < 4 * n * cols || y.len() < 4 * n * rows {
            return Err(self.err(ErrorKind::InvalidArgument, "a MatMul's activations or outputs lie outside their buffers"));
        }
        let (rotate, x_res) = (self.scheme.rotate, self.scheme.x_residual);
        let mut t0 = 0;
        while t0 < n {
            let m = if n - t0 == 1 { 1 } else { (n - t0).min(BATCH_ROWS as usize) };
            let m_rows = if m == 1 { 1 } else { BATCH_ROWS as usize };
            for i in 0..m {
                let src = &x[4 * (t0 + i) * cols..4 * (t0 + i + 1) * cols];
                for (d, b) in self.row[..cols].iter_mut().zip(src.chunks_exact(4)) {
                    *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
                if rotate {
                    let at = self.signs.iter().position(|(c, _)| *c == cols).ok_or_else(|| self.err(ErrorKind::Other, "no rotation signs for this width"))?;
                    w8a8::rotate(&mut self.row[..cols], &self.signs[at].1);
                }
                self.sx[i] = w8a8::quantize_row(&self.row[..cols], &mut self.qrow[..cols]);
                if x_res {
                    // The row's rounding error, quantized with its own scale (the emulation's
                    // `xr - q·sx`, then the per-token rule).
                    let sx = self.sx[i];
                    for (v, &q) in self.row[..cols].iter_mut().zip(&self.qrow[..cols]) {
                        *v -= f32::from(q) * sx;
                    }
                    self.sx2[i] = w8a8::quantize_row(&self.row[..cols], &mut self.qres[i * cols..(i + 1) * cols]);
                }
                let ih = self.input.0;
                let qrow = std::mem::take(&mut self.qrow);
                let r = self.bytes(ih).map(|inp| Self::put_row(inp, &qrow[..cols], i, m_rows));
                self.qrow = qrow;
                r?;
            }
            if m_rows > 1 {
                let ih = self.input.0;
                let inp = self.bytes(ih)?;
                for i in m..m_rows {
                    for g in 0..cols.div_ceil(16) {
                        inp[g * m_rows * 16 + i * 16..][..16].fill(0);
                    }
                }
            }
            for xp in 0..1 + usize::from(x_res) {
                if xp == 1 {
                    // The residual rows replace the first pass's in the input BO (the rows
                    // past `m` stay zero).
                    let ih = self.input.0;
                    let qres = std::mem::take(&mut self.qres);
                    let r = self.bytes(ih).map(|inp| (0..m).for_each(|i| Self::put_row(inp, &qres[i * cols..(i + 1) * cols], i, m_rows)));
                    self.qres = qres;
                    r?;
                }
                for (wp, (sw, jobs)) in p.passes().enumerate() {
                    self.run_job(&jobs[usize::from(m_rows > 1)])?;
                    let sx = std::mem::take(if xp == 0 { &mut self.sx } else { &mut self.sx2 });
                    let oh = self.output.0;
                    let r = self.bytes(oh).map(|out| Self::accumulate(out, &sx[..m], sw, m_rows, &mut y[4 * t0 * rows..4 * (t0 + m) * rows], xp + wp == 0));
                    *(if xp == 0 { &mut self.sx } else { &mut self.sx2 }) = sx;
                    r?;
                }
            }
            t0 += m;
        }
        Ok(())
    }

    /// `y[i·rows + r] (=|+=) f32(sum[i][r]) · (sx[i] · sw[r])` for the job's rows, from the
    /// output BO's int32 sums: the first pass writes, later passes add.
    fn accumulate(out: &[u8], sx: &[f32], sw: &[f32], m_rows: usize, y: &mut [u8], first: bool) {
        let rows = sw.len();
        for (i, &sxi) in sx.iter().enumerate() {
            for (r, &swr) in sw.iter().enumerate() {
                let at = gemm::output32_at(m_rows as u32, i as u32, r as u32);
                let acc = i32::from_le_bytes([out[at], out[at + 1], out[at + 2], out[at + 3]]);
                let v = acc as f32 * (sxi * swr);
                let d = &mut y[4 * (i * rows + r)..][..4];
                let v = if first { v } else { f32::from_le_bytes([d[0], d[1], d[2], d[3]]) + v };
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

impl Drop for Rknpu {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl ErrorType for Rknpu {
    type Error = DeviceError;
}

impl Device for Rknpu {
    fn identity(&self) -> &Identity {
        &self.identity
    }
    fn caps(&self) -> &Caps {
        &self.caps
    }
    fn supports(&self, op: &OpDesc, tensors: &[TensorDesc]) -> Support {
        let s = check_op(&self.caps, op, tensors);
        if s != Support::Yes {
            return s;
        }
        let Some(w) = op.src[0].and_then(|i| tensors.get(usize::from(i))) else { return Support::No(Reason::Index) };
        let (cols, rows) = (w.ne[0], w.ne[1]);
        if w.layout != Layout::Tiles32 || cols > MAX_K || rows > MAX_N || u64::from(cols) * u64::from(rows) < MIN_WEIGHTS {
            return Support::No(Reason::Shape);
        }
        Support::Yes
    }
}

impl SharedBuffers for Rknpu {
    fn alloc(&mut self, size: u64) -> Result<BufferId, DeviceError> {
        self.check()?;
        let size = self.buffer_rules().rounded_size(size).map_err(|k| self.err(k, format!("cannot allocate {size} bytes")))?;
        let b = vec![0u8; usize::try_from(size).map_err(|_| self.err(ErrorKind::OutOfMemory, "too large"))?];
        let id = match self.bufs.iter().position(Option::is_none) {
            Some(i) => {
                self.bufs[i] = Some((b, false));
                i
            }
            None => {
                self.bufs.push(Some((b, false)));
                self.bufs.len() - 1
            }
        };
        Ok(BufferId(id as u32))
    }
    fn map(&mut self, id: BufferId) -> Result<(), DeviceError> {
        self.buf(id)?;
        if let Some(Some(b)) = self.bufs.get_mut(id.0 as usize) {
            b.1 = true;
        }
        Ok(())
    }
    fn host_view(&mut self, id: BufferId) -> Result<&mut [u8], DeviceError> {
        Ok(self.buf(id)?.as_mut_slice())
    }
    fn free(&mut self, id: BufferId) -> Result<(), DeviceError> {
        self.buf(id)?;
        self.bufs[id.0 as usize] = None;
        Ok(())
    }
}

impl Queue for Rknpu {
    fn submit(&mut self, batch: &Batch<'_>) -> Result<Seq, DeviceError> {
        self.check()?;
        if self.done.is_some() {
            return Err(self.err(ErrorKind::Busy, "a batch is already in flight"));
        }
        batch.validate().map_err(|k| self.err(k, "the batch's tables are inconsistent"))?;
        let seq = self.seq;
        let mut status = BatchStatus::Done;
        for (i, op) in batch.ops.iter().enumerate() {
            if !matches!(op.kind, OpKind::MatMul) {
                status = BatchStatus::Failed { op: i as u16, kind: ErrorKind::Unsupported };
                break;
            }
            self.matmul(batch, op)?;
        }
        self.seq = self.seq.wrapping_add(1);
        self.done = Some(Completion { seq, status });
        Ok(seq)
    }
    fn poll(&mut self) -> Result<Option<Completion>, DeviceError> {
        Ok(self.done.take())
    }
}

//! The qemu-hexagon test harness protocol: one request on stdin, one response
//! on stdout, little-endian. The host test (`qemu-tests/`) writes random inputs,
//! runs the ELF, and checks the response against keel-core's host build.
//!
//! Request: `b"KDSP"`, command word, then
//! - `CMD_MATMUL`: dtype code (`DType::code`: Q4_0 2, Q8_0 3, IQ4_NL 4), rows, k, n_cols,
//!   scratch bytes; ggml weight rows (padded to 4 bytes); `n_cols × k` f32 activations.
//! - `CMD_SELFTEST`: seed, scratch bytes.
//! - `CMD_BATCH`: scratch bytes, then a postcard `BatchMsg` (length word, bytes
//!   padded to 4), then the buffers: count, and per buffer its id, length and
//!   bytes (padded to 4). The harness places each buffer 128-byte aligned in its
//!   work memory and runs the batch with the device's own executor
//!   (`keel_core::exec::run_batch`, caps as the device reports them after its self-test).
//! - `CMD_F16`: `n_h`, `n_f`, then `n_h` f16 (padded to 4) and `n_f` f32.
//! - `CMD_THREADS`: threads, tasks (at most 256), cycles: per cycle the Linux thread pool
//!   is started, runs the tasks twice (task i adds i + 1 to its own slot) and is stopped.
//! - `CMD_DOT`: `n` (1..=256), `n_keys` (at most 512), then `n` f16 of q and `n_keys · n`
//!   f16 of key rows, one after another (together padded to 4).
//! - `CMD_MAD`: `n` (1..=256), `n_keys` (at most 512), then the keys' exponents (`n_keys`
//!   f32) and new-maximum flags (`n_keys` words, 0 or 1), then `n` f16 of the accumulator
//!   and `n_keys · n` f16 of value rows (together padded to 4).
//!
//! Response: status word (0 ok, else 1 + error code), then
//! - `CMD_MATMUL`: the DSP-quantized activation blocks in ggml form
//!   (`n_cols × k/32 × 34` bytes, padded to 4), the int32 block sums
//!   (`[col][block][row]`), the f32 outputs (`[col][row]`).
//! - `CMD_SELFTEST`: the digest word.
//! - `CMD_BATCH`: the batch status (0 done, else 1 + failing op index), the
//!   error code (`error_code`, 0 when done), then every buffer's bytes after
//!   the batch, in request order (each padded to 4).
//! - `CMD_F16`: the halves as f32 by the device's kernel set (`Kernels::f16_to_f32`),
//!   then the f32s as halves (`Kernels::f32_to_f16`, padded to 4); each converted in
//!   runs of 1, 2, … 129 values from successive offsets, so every alignment and
//!   partial tail of the vector code is taken.
//! - `CMD_THREADS`: per cycle the threads the pool started and the slots not holding
//!   2·(i + 1) (or 0 past the tasks): a task skipped or run an extra time shows there.
//! - `CMD_DOT`: the `n_keys` scores of `Kernels::f16_dot_keys` (attention's K·Q) as f32,
//!   twice: all keys in one call, then in runs of 1, 2, … keys (odd runs and last keys
//!   of the kernels that take keys in pairs).
//! - `CMD_MAD`: the accumulator after `Kernels::f16_mad_keys` (attention's value update)
//!   over all keys in one call, then after the same keys in runs of 1, 2, … (each run
//!   a call), as f16 (each padded to 4).

use keel_core::exec::{kernels, run_batch, Buffers, Scratch, ALIGN};
use keel_core::quant::tiles32::{self, quantize_act, ActBlock, TiledWeights};
use keel_npu_hal::op::DType;
use keel_npu_hal::wire::{self, BatchMsg, MAX_BUFFERS};
use keel_npu_hal::{tile, BatchStatus, BufferId, ErrorKind, UnitState};

use crate::msgloop::{caps, Measured};

/// `b"KDSP"` read little-endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"KDSP");
/// Matrix product of ggml weights by f32 activations.
pub const CMD_MATMUL: u32 = 1;
/// The open-time self-test.
pub const CMD_SELFTEST: u32 = 2;
/// An op batch over buffers in harness memory.
pub const CMD_BATCH: u32 = 3;
/// f16 ↔ f32 conversions command.
pub const CMD_F16: u32 = 4;
/// Attention's K·Q dots command.
pub const CMD_DOT: u32 = 6;
/// Attention's value-update command.
pub const CMD_MAD: u32 = 7;
/// The thread pool started, used and stopped, several times.
pub const CMD_THREADS: u32 = 5;

/// Memory the platform lends to one request.
pub struct Regions<'a> {
    /// Main-memory work area (repacked weights), 128-byte aligned.
    pub work: &'a mut [u8],
    /// The scratch region at its largest; the request says how much to use.
    pub scratch: &'a mut [u8],
    /// Where the response goes.
    pub out: &'a mut [u8],
}

/// Error codes on the harness wire (1 + this).
pub fn error_code(k: ErrorKind) -> u32 {
    match k {
        ErrorKind::Timeout => 0,
        ErrorKind::DeviceLost => 1,
        ErrorKind::OutOfMemory => 2,
        ErrorKind::Unsupported => 3,
        ErrorKind::Protocol => 4,
        ErrorKind::BadResponse => 5,
        ErrorKind::InvalidArgument => 6,
        ErrorKind::Busy => 7,
        _ => 8,
    }
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], ErrorKind> {
        if n > self.buf.len() {
            return Err(ErrorKind::Protocol);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn u32(&mut self) -> Result<u32, ErrorKind> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

struct Writer<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), ErrorKind> {
        let dst = self.buf.get_mut(self.len..self.len + bytes.len()).ok_or(ErrorKind::OutOfMemory)?;
        dst.copy_from_slice(bytes);
        self.len += bytes.len();
        Ok(())
    }
    /// Reserves `n` zeroed bytes and returns them.
    fn take(&mut self, n: usize) -> Result<&mut [u8], ErrorKind> {
        let start = self.len;
        let dst = self.buf.get_mut(start..start + n).ok_or(ErrorKind::OutOfMemory)?;
        dst.fill(0);
        self.len += n;
        Ok(dst)
    }
    fn pad4(&mut self) -> Result<(), ErrorKind> {
        while !self.len.is_multiple_of(4) {
            self.put(&[0])?;
        }
        Ok(())
    }
}

/// Serves one request; returns the response length in `r.out`.
pub fn serve(input: &[u8], r: Regions<'_>) -> usize {
    let (status_slot, body) = r.out.split_at_mut(4);
    let mut w = Writer { buf: body, len: 0 };
    let status = match dispatch(input, r.work, r.scratch, &mut w) {
        Ok(()) => 0,
        Err(k) => {
            w.len = 0;
            1 + error_code(k)
        }
    };
    status_slot.copy_from_slice(&status.to_le_bytes());
    4 + w.len
}

fn dispatch(input: &[u8], work: &mut [u8], scratch: &mut [u8], w: &mut Writer<'_>) -> Result<(), ErrorKind> {
    let mut rd = Reader { buf: input };
    if rd.u32()? != MAGIC {
        return Err(ErrorKind::Protocol);
    }
    match rd.u32()? {
        CMD_MATMUL => matmul(&mut rd, work, scratch, w),
        CMD_SELFTEST => {
            let seed = rd.u32()?;
            let n = rd.u32()? as usize;
            let mut s = Scratch::new(scratch.get_mut(..n).ok_or(ErrorKind::OutOfMemory)?);
            w.put(&crate::selftest::run(seed, &mut s)?.to_le_bytes())
        }
        CMD_BATCH => batch(&mut rd, work, scratch, w),
        CMD_F16 => convert_f16(&mut rd, w),
        CMD_THREADS => threads(&mut rd, w),
        CMD_DOT => dot_keys(&mut rd, work, w),
        CMD_MAD => mad_keys(&mut rd, work, w),
        _ => Err(ErrorKind::Unsupported),
    }
}

/// Buffers placed in the harness's work memory: id, offset and length of each.
struct Placed {
    work: *mut u8,
    bufs: [(BufferId, usize, usize); MAX_BUFFERS],
    n: usize,
}

// SAFETY: each buffer is a range of `work` (checked when placed), which the request
// lends to the batch alone: nothing else reads or writes it until `run_batch` returns.
unsafe impl Buffers for Placed {
    fn get(&self, id: BufferId) -> Option<(*mut u8, usize)> {
        self.bufs[..self.n].iter().find(|b| b.0 == id).map(|b| (self.work.wrapping_add(b.1), b.2))
    }
}

fn batch(rd: &mut Reader<'_>, work: &mut [u8], scratch: &mut [u8], w: &mut Writer<'_>) -> Result<(), ErrorKind> {
    let scratch_bytes = rd.u32()? as usize;
    let len = rd.u32()? as usize;
    let msg: BatchMsg = wire::decode(&rd.bytes(len.next_multiple_of(4))?[..len])?;
    let n = rd.u32()? as usize;
    if n > MAX_BUFFERS {
        return Err(ErrorKind::Unsupported);
    }
    let mut bufs = [(BufferId(0), 0, 0); MAX_BUFFERS];
    let mut at = 0;
    for slot in bufs[..n].iter_mut() {
        let (id, len) = (BufferId(rd.u32()?), rd.u32()? as usize);
        let dst = work.get_mut(at..at + len).ok_or(ErrorKind::OutOfMemory)?;
        dst.copy_from_slice(&rd.bytes(len.next_multiple_of(4))?[..len]);
        *slot = (id, at, len);
        at = (at + len).next_multiple_of(ALIGN);
    }
    let scratch = scratch.get_mut(..scratch_bytes).ok_or(ErrorKind::OutOfMemory)?;
    let hvx = match crate::selftest::run(1, &mut Scratch::new(scratch)) {
        Ok(d) if keel_npu_hal::selftest::check(1, d).is_ok() => UnitState::Verified,
        _ => UnitState::Failed,
    };
    let m = Measured { scratch_bytes, shared_bytes: work.len() as u64, page: ALIGN as u32, hvx, threads: 1 };
    let placed = Placed { work: work.as_mut_ptr(), bufs, n };
    let status = run_batch(&msg.batch(), &placed, &caps(&m), &mut Scratch::new(scratch));
    let (op, kind) = match status {
        BatchStatus::Done => (0, 0),
        BatchStatus::Failed { op, kind } => (1 + u32::from(op), error_code(kind)),
    };
    w.put(&op.to_le_bytes())?;
    w.put(&kind.to_le_bytes())?;
    for &(_, start, len) in &bufs[..n] {
        w.put(&work[start..start + len])?;
        w.pad4()?;
    }
    Ok(())
}

/// `(offset, length)` runs over `0..n` of 1, 2, … 129 values, then 1, 2, … again: every
/// offset and tail length of the vector code gets converted.
fn runs(n: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut state = (0, 1);
    core::iter::from_fn(move || {
        let (at, len) = state;
        (at < n).then(|| {
            let m = len.min(n - at);
            state = (at + m, if len == 129 { 1 } else { len + 1 });
            (at, m)
        })
    })
}

fn convert_f16(rd: &mut Reader<'_>, w: &mut Writer<'_>) -> Result<(), ErrorKind> {
    let (n_h, n_f) = (rd.u32()? as usize, rd.u32()? as usize);
    let halves = rd.bytes((2 * n_h).next_multiple_of(4))?;
    let floats = rd.bytes(4 * n_f)?;
    let kern = kernels();
    let (mut h, mut f) = ([half::f16::ZERO; 129], [0f32; 129]);
    for (at, m) in runs(n_h) {
        for (j, d) in h[..m].iter_mut().enumerate() {
            *d = half::f16::from_bits(u16::from_le_bytes([halves[2 * (at + j)], halves[2 * (at + j) + 1]]));
        }
        kern.f16_to_f32(&h[..m], &mut f[..m]);
        f[..m].iter().try_for_each(|v| w.put(&v.to_le_bytes()))?;
    }
    for (at, m) in runs(n_f) {
        for (j, d) in f[..m].iter_mut().enumerate() {
            let b = &floats[4 * (at + j)..4 * (at + j) + 4];
            *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        kern.f32_to_f16(&f[..m], &mut h[..m]);
        h[..m].iter().try_for_each(|v| w.put(&v.to_bits().to_le_bytes()))?;
    }
    w.pad4()
}

/// Most keys `CMD_DOT` and `CMD_MAD` take.
const MAX_KEYS: usize = 512;

/// The attention commands' `n` (1..=256) and `n_keys` (at most [`MAX_KEYS`]), and the key
/// rows' offsets `i·n`.
fn key_shape(rd: &mut Reader<'_>) -> Result<(usize, usize, [usize; MAX_KEYS]), ErrorKind> {
    let (n, nk) = (rd.u32()? as usize, rd.u32()? as usize);
    if !(1..=256).contains(&n) || nk > MAX_KEYS {
        return Err(ErrorKind::InvalidArgument);
    }
    Ok((n, nk, core::array::from_fn(|i| i * n)))
}

/// `len` halves of the request (padded to 4) at the start of work memory, aligned as the
/// KV cache is, with `extra` more halves after them for the caller.
fn halves_in<'w>(rd: &mut Reader<'_>, work: &'w mut [u8], len: usize, extra: usize) -> Result<&'w mut [half::f16], ErrorKind> {
    let raw = rd.bytes((2 * len).next_multiple_of(4))?;
    // SAFETY: any bits are an f16; align_to_mut only yields correctly aligned elements.
    let (head, halves, _) = unsafe { work.align_to_mut::<half::f16>() };
    let halves = halves.get_mut(..len + extra).filter(|_| head.is_empty()).ok_or(ErrorKind::OutOfMemory)?;
    for (j, h) in halves[..len].iter_mut().enumerate() {
        *h = half::f16::from_bits(u16::from_le_bytes([raw[2 * j], raw[2 * j + 1]]));
    }
    Ok(halves)
}

fn dot_keys(rd: &mut Reader<'_>, work: &mut [u8], w: &mut Writer<'_>) -> Result<(), ErrorKind> {
    let (n, nk, offs) = key_shape(rd)?;
    let halves = halves_in(rd, work, n * (nk + 1), 0)?;
    let (q, k) = halves.split_at(n);
    let (kern, mut out) = (kernels(), [0f32; MAX_KEYS]);
    kern.f16_dot_keys(k, &offs[..nk], q, &mut out[..nk]);
    out[..nk].iter().try_for_each(|v| w.put(&v.to_le_bytes()))?;
    for (at, m) in runs(nk) {
        kern.f16_dot_keys(k, &offs[at..at + m], q, &mut out[at..at + m]);
    }
    out[..nk].iter().try_for_each(|v| w.put(&v.to_le_bytes()))
}

fn mad_keys(rd: &mut Reader<'_>, work: &mut [u8], w: &mut Writer<'_>) -> Result<(), ErrorKind> {
    let (n, nk, offs) = key_shape(rd)?;
    let (mut e, mut new_max) = ([0f32; MAX_KEYS], [false; MAX_KEYS]);
    for v in e[..nk].iter_mut() {
        *v = f32::from_bits(rd.u32()?);
    }
    for v in new_max[..nk].iter_mut() {
        *v = rd.u32()? != 0;
    }
    // The accumulator (then its copy for the runs of calls) around the value rows.
    let halves = halves_in(rd, work, n * (nk + 1), n)?;
    let (y0, rest) = halves.split_at_mut(n);
    let (x, y1) = rest.split_at_mut(nk * n);
    y1.copy_from_slice(y0);
    let kern = kernels();
    kern.f16_mad_keys(y0, x, &offs[..nk], &new_max[..nk], &e[..nk]);
    for (at, m) in runs(nk) {
        kern.f16_mad_keys(y1, x, &offs[at..at + m], &new_max[at..at + m], &e[at..at + m]);
    }
    for y in [&*y0, &*y1] {
        y.iter().try_for_each(|v| w.put(&v.to_bits().to_le_bytes()))?;
        w.pad4()?;
    }
    Ok(())
}

fn matmul(rd: &mut Reader<'_>, work: &mut [u8], scratch: &mut [u8], w: &mut Writer<'_>) -> Result<(), ErrorKind> {
    let dtype = match rd.u32()? {
        2 => DType::Q4_0,
        3 => DType::Q8_0,
        4 => DType::IQ4NL,
        _ => return Err(ErrorKind::Unsupported),
    };
    let (rows, k, n_cols, scratch_bytes) = (rd.u32()? as usize, rd.u32()? as usize, rd.u32()? as usize, rd.u32()? as usize);
    let size = tile::packed_size(dtype, rows as u32, k as u32).ok_or(ErrorKind::InvalidArgument)?;
    let nb = k / 32;
    let src_len = rows * nb * dtype.block_bytes() as usize;
    let src = rd.bytes(src_len.next_multiple_of(4))?;
    let packed = work.get_mut(..size).ok_or(ErrorKind::OutOfMemory)?;
    tile::repack(dtype, rows as u32, k as u32, &src[..src_len], packed)?;
    let weights = TiledWeights { dtype, rows, k, packed };

    let kern = kernels();
    let mut s = Scratch::new(scratch.get_mut(..scratch_bytes).ok_or(ErrorKind::OutOfMemory)?);
    let act_bytes = s.take(n_cols * nb * core::mem::size_of::<ActBlock>())?;
    // SAFETY: ActBlock is repr(C) of u32/i32/f32/u16 fields, valid for any bit
    // pattern; align_to_mut only yields correctly aligned elements.
    let (_, acts, _) = unsafe { act_bytes.align_to_mut::<ActBlock>() };
    let acts = acts.get_mut(..n_cols * nb).ok_or(ErrorKind::OutOfMemory)?;
    for a in acts.iter_mut() {
        let x = rd.bytes(128)?;
        let x: [f32; 32] = core::array::from_fn(|j| f32::from_le_bytes([x[4 * j], x[4 * j + 1], x[4 * j + 2], x[4 * j + 3]]));
        quantize_act(&kern, &x, core::slice::from_mut(a))?;
        w.put(&a.to_q8_0())?;
    }
    w.pad4()?;
    let (sums, outs) = w.take(n_cols * (nb + 1) * rows * 4)?.split_at_mut(n_cols * nb * rows * 4);
    let (sums, outs) = (as_words::<i32>(sums)?, as_words::<f32>(outs)?);
    let free = s.take(s.remaining())?;
    for c in 0..n_cols {
        let (a, sums) = (&acts[c * nb..][..nb], &mut sums[c * nb * rows..][..nb * rows]);
        tiles32::matvec(&kern, &weights, a, free, &mut outs[c * rows..][..rows], Some(sums))?;
    }
    Ok(())
}

/// Plain 4-byte values that any bit pattern makes valid.
trait Word: Copy {}
impl Word for i32 {}
impl Word for f32 {}

/// Views 4-aligned bytes as words (the DSP is little-endian, as the wire is).
fn as_words<T: Word>(b: &mut [u8]) -> Result<&mut [T], ErrorKind> {
    // SAFETY: T is a 4-byte plain value type (Word) valid for any bit pattern;
    // align_to_mut yields only aligned elements, and we refuse a misaligned split.
    let (pre, words, post) = unsafe { b.align_to_mut::<T>() };
    if pre.is_empty() && post.is_empty() {
        Ok(words)
    } else {
        Err(ErrorKind::InvalidArgument)
    }
}

/// `CMD_THREADS` (see the module doc).
fn threads(rd: &mut Reader<'_>, w: &mut Writer<'_>) -> Result<(), ErrorKind> {
    use crate::threads::{Linux, Threads};
    use core::sync::atomic::{AtomicU32, Ordering};
    use keel_core::parallel::Parallel;
    const MAX_TASKS: usize = 256;
    let (n, tasks, cycles) = (rd.u32()? as usize, rd.u32()? as usize, rd.u32()?);
    if tasks > MAX_TASKS {
        return Err(ErrorKind::InvalidArgument);
    }
    let slots = [const { AtomicU32::new(0) }; MAX_TASKS];
    for _ in 0..cycles {
        slots.iter().for_each(|s| s.store(0, Ordering::Relaxed));
        let pool = Threads::<Linux>::start(n);
        for _ in 0..2 {
            pool.run(tasks, &|i| {
                slots[i].fetch_add(i as u32 + 1, Ordering::Relaxed);
            });
        }
        let started = pool.n_threads() as u32;
        pool.stop();
        let wrong = slots.iter().enumerate().filter(|&(i, s)| s.load(Ordering::Relaxed) != if i < tasks { 2 * (i as u32 + 1) } else { 0 }).count() as u32;
        w.put(&started.to_le_bytes())?;
        w.put(&wrong.to_le_bytes())?;
    }
    Ok(())
}

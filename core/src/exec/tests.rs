//! The executor on the host over `Vec<u8>` buffers: a small layer (RmsNorm, MatMul over
//! Tiles32 Q8_0 weights, Add) against the same keel-core calls made directly, bit for
//! bit; and the refusals (aliasing, out-of-bounds tensors, unknown or short buffers,
//! misaligned weights, unsupported ops, tables too long for the wire).

extern crate std;
use std::{vec, vec::Vec};

use keel_npu_hal::caps::{DTypeSet, MemoryLimits, OpSet, UnitState, Units};
use keel_npu_hal::op::{Batch, BufferRef, DType, Layout, OpDesc, OpKind, TensorDesc};
use keel_npu_hal::wire::MAX_BUFFERS;
use keel_npu_hal::{tile, BatchStatus, BufferId, BufferRules, Caps, ErrorKind};

use super::{run_batch, run_batch_observed, Buffers, Scratch, ALIGN};
use crate::parallel::{Parallel, Sequential};
use crate::quant::tests::Reversed;
use crate::ggml_type::GgmlType;
use crate::ops;
use crate::quant::tests::{activations, quantized, random_row, Rng};
use crate::quant::tiles32::{self, quantize_act, ActBlock, TiledWeights};
use crate::quant::Kernels;

/// Buffers in host memory, buffer `i` with id `i + 1`, each starting [`ALIGN`]-aligned
/// inside its `Vec` (as a device's mappings start on a page).
struct Mem {
    bufs: Vec<(Vec<u8>, usize, usize)>,
}

impl Mem {
    fn new(contents: &[&[u8]]) -> Mem {
        let bufs = contents
            .iter()
            .map(|c| {
                let mut v = vec![0u8; c.len() + ALIGN];
                let off = v.as_ptr().align_offset(ALIGN);
                v[off..off + c.len()].copy_from_slice(c);
                (v, off, c.len())
            })
            .collect();
        Mem { bufs }
    }

    /// Buffer `i` (index in the batch's table).
    fn buf(&self, i: usize) -> &[u8] {
        let (v, off, len) = &self.bufs[i];
        &v[*off..off + len]
    }

    /// The batch's buffer table: every buffer at its full length.
    fn refs(&self) -> Vec<BufferRef> {
        (0..self.bufs.len()).map(|i| BufferRef { id: BufferId(i as u32 + 1), size: self.buf(i).len() as u64 }).collect()
    }

    /// Runs `ops` over `tensors` with these buffers and 256 KiB of scratch.
    fn run(&mut self, tensors: &[TensorDesc], ops: &[OpDesc], caps: &Caps) -> BatchStatus {
        let refs = self.refs();
        self.run_with(&Batch { buffers: &refs, tensors, ops }, caps)
    }

    fn run_with(&mut self, batch: &Batch<'_>, caps: &Caps) -> BatchStatus {
        self.run_par(batch, caps, &Sequential)
    }

    /// Runs `batch` with its work split over `par`'s tasks.
    fn run_par(&mut self, batch: &Batch<'_>, caps: &Caps, par: &dyn Parallel) -> BatchStatus {
        let mut scratch = vec![0u8; 256 << 10];
        let placed = Placed(self.bufs.iter_mut().map(|(v, off, len)| (v[*off..].as_mut_ptr(), *len)).collect());
        if par.n_threads() == 1 {
            return run_batch(batch, &placed, caps, &mut Scratch::new(&mut scratch));
        }
        run_batch_observed(batch, &placed, caps, &mut Scratch::new(&mut scratch), par, |_| {})
    }
}

/// The buffers' pointers, taken while `Mem` is mutably borrowed.
struct Placed(Vec<(*mut u8, usize)>);

// SAFETY: each pointer comes from a distinct `Vec` held mutably borrowed by `Mem::run_with`
// for as long as `Placed` lives (the whole batch), with `len` bytes behind it.
unsafe impl Buffers for Placed {
    fn get(&self, id: BufferId) -> Option<(*mut u8, usize)> {
        self.0.get(usize::try_from(id.0).ok()?.checked_sub(1)?).copied()
    }
}

/// A device that runs every op kind with HVX verified, as the firmware reports it.
fn caps() -> Caps {
    let ops = (0..20).fold(OpSet::default(), |set, code| set.with(code));
    let rules = BufferRules { align: ALIGN as u32, granule: ALIGN as u32, max_size: 1 << 30 };
    Caps {
        units: Units { hvx_contexts: 1, hvx: UnitState::Verified, hmx: UnitState::Absent, npu_cores: 0, npu: UnitState::Absent },
        memory: MemoryLimits { va_budget: 1 << 30, scratch_bytes: 256 << 10, buffers: rules },
        ops,
        matmul_weights: DTypeSet::default().with(DType::Q8_0).with(DType::Q4_0).with(DType::IQ4NL),
        max_in_flight: 1,
        max_batch_ops: 512,
    }
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn f32_tensor(ne: [u32; 4], buffer: u16, offset: u32) -> TensorDesc {
    TensorDesc::contiguous(DType::F32, ne, buffer, offset).unwrap()
}

fn op(kind: OpKind, src: [Option<u16>; 3], dst: u16) -> OpDesc {
    OpDesc { kind, src, dst }
}

/// Bit equality, NaNs included.
fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}[{i}]: executor {g:e} vs keel-core {w:e}");
    }
}

#[test]
fn norm_matmul_add_batch_equals_keel_core_calls() {
    let (k, rows, cols, eps) = (96usize, 40usize, 3usize, 1e-5f32);
    let mut rng = Rng::new(0xe8ec);
    let x: Vec<f32> = (0..cols).flat_map(|_| random_row(&mut rng, k)).collect();
    let norm_w = random_row(&mut rng, k);
    let resid: Vec<f32> = (0..cols).flat_map(|_| random_row(&mut rng, rows)).collect();
    let w: Vec<u8> = (0..rows).flat_map(|_| quantized(GgmlType::Q8_0, &random_row(&mut rng, k))).collect();
    let size = tile::packed_size(DType::Q8_0, rows as u32, k as u32).unwrap();
    let mut packed = vec![0u8; size];
    tile::repack(DType::Q8_0, rows as u32, k as u32, &w, &mut packed).unwrap();

    // Buffers: 0 x then the residual, 1 the norm weight, 2 the weights, 3 the normed
    // columns then the output.
    let at = (4 * k * cols) as u32;
    let mut mem = Mem::new(&[&[f32s(&x), f32s(&resid)].concat(), &f32s(&norm_w), &packed, &vec![0u8; 4 * (k + rows) * cols]]);
    let tensors = [
        f32_tensor([k as u32, cols as u32, 1, 1], 0, 0),
        f32_tensor([k as u32, 1, 1, 1], 1, 0),
        TensorDesc { dtype: DType::Q8_0, layout: Layout::Tiles32, ne: [k as u32, rows as u32, 1, 1], nb: [0; 4], buffer: 2, offset: 0 },
        f32_tensor([k as u32, cols as u32, 1, 1], 3, 0),
        f32_tensor([rows as u32, cols as u32, 1, 1], 3, at),
        f32_tensor([rows as u32, cols as u32, 1, 1], 0, at),
    ];
    let ops = [
        op(OpKind::RmsNorm { eps }, [Some(0), Some(1), None], 3),
        op(OpKind::MatMul, [Some(2), Some(3), None], 4),
        op(OpKind::Add, [Some(4), Some(5), None], 4),
    ];
    assert_eq!(mem.run(&tensors, &ops, &caps()), BatchStatus::Done);

    // The same calls, made directly with the reference kernels.
    let kern = Kernels::reference();
    let mut h = x.clone();
    h.chunks_exact_mut(k).for_each(|row| ops::rms_norm_weighted(row, &norm_w, eps));
    let (mut tiles, mut scratch) = (vec![0u8; size + ALIGN], vec![0u8; 64 << 10]);
    let mut s = Scratch::new(&mut tiles);
    let tiles = s.take(size).unwrap();
    tiles.copy_from_slice(&packed);
    let weights = TiledWeights { dtype: DType::Q8_0, rows, k, packed: tiles };
    let mut want = vec![0f32; rows * cols];
    for ((col, out), r) in h.chunks_exact(k).zip(want.chunks_exact_mut(rows)).zip(resid.chunks_exact(rows)) {
        let mut act = vec![ActBlock::default(); k / 32];
        quantize_act(&kern, col, &mut act).unwrap();
        let free = Scratch::new(&mut scratch).take(32 << 10).unwrap();
        tiles32::matvec(&kern, &weights, &act, free, out, None).unwrap();
        // And the CPU's row dot gives these bits too (before the residual).
        let (dot, a) = (kern.dot_fn(GgmlType::Q8_0).unwrap(), activations(&kern, GgmlType::Q8_0, col));
        let row_dots: Vec<f32> = w.chunks_exact(k / 32 * 34).map(|wr| dot(k, wr, &a)).collect();
        assert_bits(out, &row_dots, "tiles32 product vs row dots");
        ops::add_assign(out, r);
    }
    assert_bits(&floats(&mem.buf(3)[..at as usize]), &h, "rms_norm");
    assert_bits(&floats(&mem.buf(3)[at as usize..]), &want, "matmul + add");
    assert_eq!(mem.buf(0), &[f32s(&x), f32s(&resid)].concat()[..], "sources untouched");
}

/// A batch's products (the activations' blocks, then the row groups) and attention
/// ((token, head) pairs, GQA, a separate
/// destination and in place over Q with a window) split over 2, 3 and 16 tasks run in
/// reverse: every byte of every buffer as with one task.
#[test]
fn work_split_over_tasks_keeps_every_bit() {
    let (k, rows, cols) = (64usize, 100usize, 3usize);
    let (hd, n_head, n_kv_head, n_tok, n_kv) = (32usize, 4usize, 2usize, 3usize, 5usize);
    let mut rng = Rng::new(0x7a5c);
    let x: Vec<f32> = (0..cols).flat_map(|_| random_row(&mut rng, k)).collect();
    let w: Vec<u8> = (0..rows).flat_map(|_| quantized(GgmlType::Q4_0, &random_row(&mut rng, k))).collect();
    let size = tile::packed_size(DType::Q4_0, rows as u32, k as u32).unwrap();
    let mut packed = vec![0u8; size];
    tile::repack(DType::Q4_0, rows as u32, k as u32, &w, &mut packed).unwrap();
    let q = random_row(&mut rng, hd * n_head * n_tok);
    let f16s = |v: Vec<f32>| -> Vec<u8> { v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect() };
    let (kc, vc) = (f16s(random_row(&mut rng, hd * n_kv * n_kv_head)), f16s(random_row(&mut rng, hd * n_kv * n_kv_head)));
    // Buffers: 0 x, 1 weights, 2 the product's output, 3 Q (attended in place too),
    // 4 K, 5 V, 6 attention's separate output.
    let contents: [&[u8]; 7] = [&f32s(&x), &packed, &vec![0u8; 4 * rows * cols], &f32s(&q), &kc, &vc, &vec![0u8; 4 * q.len()]];
    let qt = f32_tensor([hd as u32, n_head as u32, n_tok as u32, 1], 3, 0);
    let cache = |b| TensorDesc::contiguous(DType::F16, [hd as u32, n_kv as u32, n_kv_head as u32, 1], b, 0).unwrap();
    let tensors = [
        f32_tensor([k as u32, cols as u32, 1, 1], 0, 0),
        TensorDesc { dtype: DType::Q4_0, layout: Layout::Tiles32, ne: [k as u32, rows as u32, 1, 1], nb: [0; 4], buffer: 1, offset: 0 },
        f32_tensor([rows as u32, cols as u32, 1, 1], 2, 0),
        qt,
        cache(4),
        cache(5),
        f32_tensor([hd as u32, n_head as u32, n_tok as u32, 1], 6, 0),
    ];
    let attn = |window| OpKind::Attention { n_head: n_head as u16, n_head_kv: n_kv_head as u16, scale: 0.17, window };
    let ops = [
        op(OpKind::MatMul, [Some(1), Some(0), None], 2),
        op(attn(0), [Some(3), Some(4), Some(5)], 6),
        op(attn(2), [Some(3), Some(4), Some(5)], 3),
    ];
    let mut one = Mem::new(&contents);
    assert_eq!(one.run(&tensors, &ops, &caps()), BatchStatus::Done);
    for tasks in [2, 3, 16] {
        let mut split = Mem::new(&contents);
        let refs = split.refs();
        assert_eq!(split.run_par(&Batch { buffers: &refs, tensors: &tensors, ops: &ops }, &caps(), &Reversed(tasks)), BatchStatus::Done);
        for b in [2, 3, 6] {
            assert!(split.buf(b) == one.buf(b), "{tasks} tasks: buffer {b} differs from one task's");
        }
    }
    assert_ne!(one.buf(3), &f32s(&q)[..], "attention in place wrote Q");
}

#[test]
fn overlapping_and_out_of_bounds_tensors_are_refused() {
    let n = 64u32;
    let x: Vec<f32> = (0..2 * n).map(|i| i as f32 * 0.25 - 3.0).collect();
    let mut mem = Mem::new(&[&f32s(&x)]);
    let row = |offset: u32| f32_tensor([n, 1, 1, 1], 0, offset);
    let failed = |op, kind| BatchStatus::Failed { op, kind };
    let invalid = ErrorKind::InvalidArgument;

    // Op 0 runs in place; op 1's destination overlaps its source by all but one value.
    let ops = [op(OpKind::Silu, [Some(0), None, None], 0), op(OpKind::Silu, [Some(0), None, None], 1)];
    assert_eq!(mem.run(&[row(0), row(4)], &ops, &caps()), failed(1, invalid));
    let silu: Vec<f32> = x[..n as usize].iter().map(|&v| ops::silu(v)).collect();
    assert_bits(&floats(&mem.buf(0)[..4 * n as usize]), &silu, "op 0 ran");
    assert_bits(&floats(&mem.buf(0)[4 * n as usize..]), &x[n as usize..], "op 1 wrote nothing");

    // A second source overlapping the destination.
    let add = [op(OpKind::Add, [Some(0), Some(1), None], 2)];
    assert_eq!(mem.run(&[row(0), row(4 * n), row(4 * n - 8)], &add, &caps()), failed(0, invalid));

    // Past the buffer's end (the table's size), past its memory, an unknown buffer.
    assert_eq!(mem.run(&[row(0), row(4 * n + 4)], &ops[1..], &caps()), failed(0, invalid));
    let refs = [BufferRef { id: BufferId(1), size: 8 * u64::from(n) + 4 }];
    assert_eq!(mem.run_with(&Batch { buffers: &refs, tensors: &[row(0), row(4 * n)], ops: &ops[1..] }, &caps()), failed(0, invalid));
    let refs = [BufferRef { id: BufferId(7), size: 4 }];
    assert_eq!(mem.run_with(&Batch { buffers: &refs, tensors: &[], ops: &[] }, &caps()), failed(0, invalid));
    assert_eq!(mem.buf(0), &f32s(&silu).into_iter().chain(f32s(&x[n as usize..])).collect::<Vec<u8>>()[..]);
}

#[test]
fn unsupported_ops_misaligned_weights_and_long_tables_are_refused() {
    let (k, rows) = (32u32, 32u32);
    let size = tile::packed_size(DType::Q8_0, rows, k).unwrap();
    let mut mem = Mem::new(&[&vec![0u8; size + ALIGN], &vec![0u8; 4 * (k + rows) as usize]]);
    let weights = |offset| TensorDesc { dtype: DType::Q8_0, layout: Layout::Tiles32, ne: [k, rows, 1, 1], nb: [0; 4], buffer: 0, offset };
    let tensors = [weights(0), weights(4), f32_tensor([k, 1, 1, 1], 1, 0), f32_tensor([rows, 1, 1, 1], 1, 4 * k)];
    let matmul = |w| [op(OpKind::MatMul, [Some(w), Some(2), None], 3)];
    let failed = |op, kind| BatchStatus::Failed { op, kind };
    assert_eq!(mem.run(&tensors, &matmul(0), &caps()), BatchStatus::Done);
    assert_eq!(mem.run(&tensors, &matmul(1), &caps()), failed(0, ErrorKind::InvalidArgument));
    // An op kind the caps leave out, and no verified unit.
    let no_matmul = Caps { ops: OpSet(caps().ops.0 & !1), ..caps() };
    assert_eq!(mem.run(&tensors, &matmul(0), &no_matmul), failed(0, ErrorKind::Unsupported));
    let no_unit = Caps { units: Units { hvx: UnitState::Failed, ..caps().units }, ..caps() };
    assert_eq!(mem.run(&tensors, &matmul(0), &no_unit), failed(0, ErrorKind::Unsupported));
    // More buffers than the wire carries.
    let refs = vec![BufferRef { id: BufferId(1), size: 4 }; MAX_BUFFERS + 1];
    assert_eq!(mem.run_with(&Batch { buffers: &refs, tensors: &[], ops: &[] }, &caps()), failed(0, ErrorKind::Unsupported));
}

#[test]
fn scratch_pieces_are_aligned_scoped_and_bounded() {
    let mut mem = vec![0u8; 5 * ALIGN];
    let off = mem.as_ptr().align_offset(ALIGN) + 1; // one past an aligned address
    let mut s = Scratch::new(&mut mem[off..off + 4 * ALIGN]);
    assert_eq!(s.remaining(), 3 * ALIGN + 1);
    {
        let mut one_op = s.scope();
        let a = one_op.take(5).unwrap();
        assert_eq!((a.len(), a.as_ptr().align_offset(ALIGN)), (5, 0));
        assert_eq!(one_op.remaining(), 2 * ALIGN + 1);
        assert_eq!(one_op.take(3 * ALIGN), Err(ErrorKind::OutOfMemory));
    }
    assert_eq!(s.remaining(), 3 * ALIGN + 1, "a scope gives its pieces back");
    assert_eq!(s.take(usize::MAX), Err(ErrorKind::OutOfMemory));
    assert_eq!(s.take(ALIGN + 1).map(|p| p.len()), Ok(ALIGN + 1));
    assert_eq!(s.take(s.remaining()).map(|p| p.len()), Ok(ALIGN + 1), "the rest, not a multiple of ALIGN");
    assert_eq!(s.remaining(), 0);
}

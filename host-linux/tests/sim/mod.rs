//! Shared pieces of the hexagon-sim tests: finding the emulator and firmware
//! (skipping loudly when absent, failing with `KEEL_REQUIRE_DSP=1`), random
//! ggml weights, and a matrix product through the device checked against
//! keel-core's scalar reference: bit for bit when the inputs make every float
//! operation exact (scales 1.0, integer activations with max |x| = 127, so the
//! output *is* the int32 sum), otherwise within the rounding bound of two
//! summation orders (keel-core's Q8_0 reference follows llama.cpp's x86 lane
//! order; the DSP sums blocks in sequence).

#![allow(dead_code)]

use keel_core::ggml_type::GgmlType;
use keel_core::quant::Kernels;
use keel_host_linux::device::{HexagonSim, SimConfig};
use keel_npu_hal::device::{BatchStatus, Queue, SharedBuffers};
use keel_npu_hal::op::{Batch, BufferRef, DType, Layout, OpDesc, OpKind, TensorDesc};
use keel_npu_hal::{tile, BufferId};

/// The config, or `None` (after a loud SKIPPED line) when a piece is missing.
pub fn config(test: &str) -> Option<SimConfig> {
    let cfg = SimConfig::from_env();
    let Some(missing) = cfg.missing() else { return Some(cfg) };
    if std::env::var("KEEL_REQUIRE_DSP").is_ok_and(|v| v == "1") {
        panic!("KEEL_REQUIRE_DSP=1 but the hexagon-sim device cannot start: {missing}");
    }
    eprintln!("\n*** SKIPPED {test}: {missing} (set KEEL_REQUIRE_DSP=1 to make this a failure) ***\n");
    None
}

/// The config with a firmware fault mode.
pub fn faulty(test: &str, fault: &str) -> Option<SimConfig> {
    let mut cfg = config(test)?;
    cfg.fault = Some(fault.into());
    cfg.timeout = std::time::Duration::from_millis(3000);
    Some(cfg)
}

pub use keel_test_support::{activations, Rng};

pub fn ggml(t: DType) -> GgmlType {
    match t {
        DType::Q8_0 => GgmlType::Q8_0,
        DType::Q4_0 => GgmlType::Q4_0,
        other => panic!("no ggml type for {other:?}"),
    }
}

/// Random ggml weight rows (scales of both signs, several magnitudes).
pub fn weights(t: DType, rows: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let mut v = Vec::new();
    for _ in 0..rows * k / 32 {
        let d = rng.f32() * [1e-3, 0.02, 0.5, 4.0][(rng.u32() % 4) as usize];
        v.extend_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
        (0..t.block_bytes() - 2).for_each(|_| v.push(rng.u32() as u8));
    }
    v
}

/// Weight quant `j` of a ggml block (Q4_0 already offset by −8).
fn wq(t: DType, blk: &[u8], j: usize) -> i32 {
    match t {
        DType::Q8_0 => i32::from(blk[2 + j] as i8),
        _ if j < 16 => i32::from(blk[2 + j] & 15) - 8,
        _ => i32::from(blk[2 + j - 16] >> 4) - 8,
    }
}

fn f16(b: &[u8]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// keel-core's scalar reference (quantize each column to Q8_0, dot each row),
/// with each output's rounding scale `Σ_b |dw·da|·Σ_j |qw·qa|`.
pub fn reference(t: DType, w: &[u8], rows: usize, k: usize, x: &[f32]) -> Vec<(f32, f32)> {
    let kern = Kernels::reference();
    let dot = kern.dot_fn(ggml(t)).unwrap();
    let bb = t.block_bytes() as usize;
    let row_bytes = k / 32 * bb;
    let mut out = Vec::new();
    for col in x.chunks(k) {
        let mut q = vec![0u8; k / 32 * 34];
        kern.quantize_activations(GgmlType::Q8_0, col, &mut q).unwrap();
        out.extend((0..rows).map(|r| {
            let row = &w[r * row_bytes..][..row_bytes];
            let scale: f32 = row
                .chunks(bb)
                .zip(q.chunks(34))
                .map(|(wb, ab)| (f16(wb) * f16(ab)).abs() * (0..32).map(|j| (wq(t, wb, j) * i32::from(ab[2 + j] as i8)).abs()).sum::<i32>() as f32)
                .sum();
            (dot(k, row, &q), scale)
        }));
    }
    out
}

/// One matrix product to run: weights `rows × k`, `cols` activation columns.
pub struct Product {
    pub t: DType,
    pub rows: usize,
    pub k: usize,
    pub cols: usize,
    pub w: Vec<u8>,
    pub x: Vec<f32>,
}

impl Product {
    pub fn random(t: DType, rows: usize, k: usize, cols: usize, seed: u64) -> Product {
        let mut rng = Rng(seed);
        let w = weights(t, rows, k, &mut rng);
        let x = activations(cols * k, &mut rng);
        Product { t, rows, k, cols, w, x }
    }

    /// Inputs on which every float step is exact: weight scales 1.0, integer
    /// activations with one ±127 per block (so the DSP's and the CPU's activation
    /// scale are 1.0 too); the output is the exact int32 sum (k ≤ 1024 keeps |sum| ≤ 1024·128·127 < 2^24).
    pub fn integer(t: DType, rows: usize, k: usize, cols: usize, seed: u64) -> Product {
        assert!(k <= 1024);
        let mut rng = Rng(seed);
        let mut w = weights(t, rows, k, &mut rng);
        w.chunks_mut(t.block_bytes() as usize).for_each(|b| b[..2].copy_from_slice(&0x3c00u16.to_le_bytes()));
        let x = (0..cols * k)
            .map(|i| if i % 32 == (i / 32) % 32 { [127.0, -127.0][i % 2] } else { (rng.u32() % 255) as f32 - 127.0 })
            .collect();
        Product { t, rows, k, cols, w, x }
    }
}

/// Device buffers holding several products: one for tiled weights, one for
/// activations and outputs; the tensor and op tables of one batch.
pub struct Staged {
    pub wbuf: BufferId,
    pub iobuf: BufferId,
    pub buffers: Vec<BufferRef>,
    pub tensors: Vec<TensorDesc>,
    pub ops: Vec<OpDesc>,
    /// Byte offset of each product's output in `iobuf`.
    pub outs: Vec<usize>,
}

fn up(n: usize, a: usize) -> usize {
    n.div_ceil(a) * a
}

/// Repacks and writes every product into fresh shared buffers.
pub fn stage(dev: &mut impl SharedBuffers, ps: &[Product]) -> Staged {
    let wsize: usize = ps.iter().map(|p| up(tile::packed_size(p.t, p.rows as u32, p.k as u32).unwrap(), 128)).sum();
    let iosize: usize = ps.iter().map(|p| up(4 * p.cols * p.k, 128) + up(4 * p.cols * p.rows, 128)).sum();
    let (wbuf, iobuf) = (dev.alloc(wsize as u64).unwrap(), dev.alloc(iosize as u64).unwrap());
    dev.map(wbuf).unwrap();
    dev.map(iobuf).unwrap();
    let wlen = dev.host_view(wbuf).unwrap().len() as u64;
    let iolen = dev.host_view(iobuf).unwrap().len() as u64;
    let buffers = vec![BufferRef { id: wbuf, size: wlen }, BufferRef { id: iobuf, size: iolen }];
    let (mut tensors, mut ops, mut outs) = (Vec::new(), Vec::new(), Vec::new());
    let (mut wo, mut io) = (0usize, 0usize);
    for p in ps {
        let size = tile::packed_size(p.t, p.rows as u32, p.k as u32).unwrap();
        let view = dev.host_view(wbuf).unwrap();
        tile::repack(p.t, p.rows as u32, p.k as u32, &p.w, &mut view[wo..wo + size]).unwrap();
        let wt = TensorDesc { dtype: p.t, layout: Layout::Tiles32, ne: [p.k as u32, p.rows as u32, 1, 1], nb: [0; 4], buffer: 0, offset: wo as u32 };
        wo += up(size, 128);
        let view = dev.host_view(iobuf).unwrap();
        for (i, v) in p.x.iter().enumerate() {
            view[io + 4 * i..][..4].copy_from_slice(&v.to_le_bytes());
        }
        let xt = TensorDesc::contiguous(DType::F32, [p.k as u32, p.cols as u32, 1, 1], 1, io as u32).unwrap();
        io += up(4 * p.cols * p.k, 128);
        view[io..io + 4 * p.cols * p.rows].fill(0xAB); // poison: every output must be written
        let dt = TensorDesc::contiguous(DType::F32, [p.rows as u32, p.cols as u32, 1, 1], 1, io as u32).unwrap();
        outs.push(io);
        io += up(4 * p.cols * p.rows, 128);
        let base = tensors.len() as u16;
        tensors.extend([wt, xt, dt]);
        ops.push(OpDesc { kind: OpKind::MatMul, src: [Some(base), Some(base + 1), None], dst: base + 2 });
    }
    Staged { wbuf, iobuf, buffers, tensors, ops, outs }
}

impl Staged {
    pub fn batch(&self) -> Batch<'_> {
        Batch { buffers: &self.buffers, tensors: &self.tensors, ops: &self.ops }
    }

    /// Output `i` as f32 bits.
    pub fn output(&self, dev: &mut impl SharedBuffers, i: usize, n: usize) -> Vec<u32> {
        let view = dev.host_view(self.iobuf).unwrap();
        view[self.outs[i]..][..4 * n].chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    pub fn free(self, dev: &mut impl SharedBuffers) {
        dev.free(self.wbuf).unwrap();
        dev.free(self.iobuf).unwrap();
    }
}

/// Checks outputs `got` (f32 bits) of product `p`: bit for bit if `exact`,
/// else within `(2·nb + 8)·ε·scale` (two summation orders of nb block terms).
pub fn check(p: &Product, got: &[u32], exact: bool) {
    let want = reference(p.t, &p.w, p.rows, p.k, &p.x);
    assert_eq!(got.len(), want.len());
    let what = format!("{:?} rows={} k={} cols={}", p.t, p.rows, p.k, p.cols);
    for (j, (&g, &(w, scale))) in got.iter().zip(&want).enumerate() {
        let (r, c, gf) = (j % p.rows, j / p.rows, f32::from_bits(g));
        if exact {
            assert_eq!(g, w.to_bits(), "{what}: row {r} col {c}: dsp {gf} vs cpu {w} (integer sums must be exact)");
        } else {
            let tol = (2 * p.k / 32 + 8) as f32 * f32::EPSILON * scale;
            assert!((gf - w).abs() <= tol, "{what}: row {r} col {c}: dsp {gf} vs cpu {w}, |Δ| > {tol}");
        }
    }
}

/// Runs the products in one batch and checks every output against the reference.
pub fn run_and_check(dev: &mut HexagonSim, ps: &[Product], exact: bool) {
    let s = stage(dev, ps);
    let seq = dev.submit(&s.batch()).unwrap();
    assert_eq!(dev.wait(seq).unwrap(), BatchStatus::Done);
    for (i, p) in ps.iter().enumerate() {
        check(p, &s.output(dev, i, p.rows * p.cols), exact);
    }
    s.free(dev);
}

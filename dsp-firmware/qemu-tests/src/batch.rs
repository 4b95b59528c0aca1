//! Op batches for the harness's `CMD_BATCH`: buffers, tensor and op tables
//! built on the host with `keel_npu_hal`'s own types, encoded as the device
//! receives them (postcard `BatchMsg`), run under qemu-hexagon by the device's
//! executor; the answer is the batch status and every buffer after the batch.

use keel_npu_hal::op::{Batch, BufferRef, DType, Layout, OpDesc, OpKind, TensorDesc};
use keel_npu_hal::wire::{self, BatchMsg, MAX_MESSAGE};
use keel_npu_hal::BufferId;

use crate::{bytes_f32, elf, f32_bytes, put, run_elf, words, MAGIC};

/// Harness command number of an op batch.
pub const CMD_BATCH: u32 = 3;

/// A batch under construction.
#[derive(Default)]
pub struct Builder {
    /// Buffer contents, in table order (id = index + 1).
    pub bufs: Vec<Vec<u8>>,
    /// Tensor table.
    pub tensors: Vec<TensorDesc>,
    /// Op table.
    pub ops: Vec<OpDesc>,
    /// Scratch (VTCM) bytes the harness grants.
    pub scratch: u32,
}

/// A failed batch: the failing op and the harness's error code (1 + `ErrorKind` code).
#[derive(Debug, PartialEq, Eq)]
pub struct Failed {
    /// Index of the op that failed.
    pub op: u32,
    /// `harness::error_code` of its error kind (OutOfMemory 2, Unsupported 3, InvalidArgument 6).
    pub code: u32,
}

/// Error codes of `harness::error_code`.
pub const OUT_OF_MEMORY: u32 = 2;
/// See [`OUT_OF_MEMORY`].
pub const UNSUPPORTED: u32 = 3;
/// See [`UNSUPPORTED`].
pub const INVALID_ARGUMENT: u32 = 6;

impl Builder {
    /// An empty batch with 1 MiB of scratch.
    pub fn new() -> Self {
        Builder { scratch: 1 << 20, ..Default::default() }
    }

    /// Adds a buffer; returns its table index.
    pub fn buffer(&mut self, bytes: Vec<u8>) -> u16 {
        self.bufs.push(bytes);
        (self.bufs.len() - 1) as u16
    }

    /// Adds a tensor; returns its table index.
    pub fn tensor(&mut self, t: TensorDesc) -> u16 {
        self.tensors.push(t);
        (self.tensors.len() - 1) as u16
    }

    /// A contiguous tensor in buffer `buf` at `offset`.
    pub fn view(&mut self, dtype: DType, ne: [u32; 4], buf: u16, offset: u32) -> u16 {
        self.tensor(TensorDesc::contiguous(dtype, ne, buf, offset).unwrap())
    }

    /// A new buffer holding `data` as a contiguous F32 tensor of shape `ne`.
    pub fn f32s(&mut self, ne: [u32; 4], data: &[f32]) -> u16 {
        assert_eq!(data.len() as u64, ne.iter().map(|&n| u64::from(n)).product::<u64>());
        let b = self.buffer(f32_bytes(data));
        self.view(DType::F32, ne, b, 0)
    }

    /// A new buffer of `ne` elements of `dtype`, zeroed, as a contiguous tensor.
    pub fn zeros(&mut self, dtype: DType, ne: [u32; 4]) -> u16 {
        let t = TensorDesc::contiguous(dtype, ne, 0, 0).unwrap();
        let b = self.buffer(vec![0; t.end().unwrap() as usize]);
        self.view(dtype, ne, b, 0)
    }

    /// A new buffer holding I32 values as a 1-D tensor.
    pub fn i32s(&mut self, v: &[i32]) -> u16 {
        let b = self.buffer(v.iter().flat_map(|x| x.to_le_bytes()).collect());
        self.view(DType::I32, [v.len() as u32, 1, 1, 1], b, 0)
    }

    /// A new buffer with Tiles32 weights (`tile::repack` of ggml rows).
    pub fn tiled(&mut self, dtype: DType, rows: u32, k: u32, ggml: &[u8]) -> u16 {
        let size = keel_npu_hal::tile::packed_size(dtype, rows, k).unwrap();
        let mut packed = vec![0u8; size];
        keel_npu_hal::tile::repack(dtype, rows, k, ggml, &mut packed).unwrap();
        let b = self.buffer(packed);
        self.tensor(TensorDesc { dtype, layout: Layout::Tiles32, ne: [k, rows, 1, 1], nb: [0; 4], buffer: b, offset: 0 })
    }

    /// Appends an op.
    pub fn op(&mut self, kind: OpKind, src: [Option<u16>; 3], dst: u16) {
        self.ops.push(OpDesc { kind, src, dst });
    }

    /// The bytes of tensor `t`'s buffer from its offset on.
    pub fn tensor_bytes<'a>(&self, bufs: &'a [Vec<u8>], t: u16) -> &'a [u8] {
        let d = &self.tensors[usize::from(t)];
        &bufs[usize::from(d.buffer)][d.offset as usize..d.end().unwrap() as usize]
    }

    /// Tensor `t` after the batch, as f32 values.
    pub fn f32_of(&self, bufs: &[Vec<u8>], t: u16) -> Vec<f32> {
        bytes_f32(self.tensor_bytes(bufs, t))
    }

    /// Runs the batch; `Ok` holds every buffer afterwards.
    pub fn run(&self) -> Result<Vec<Vec<u8>>, Failed> {
        let refs: Vec<BufferRef> =
            self.bufs.iter().enumerate().map(|(i, b)| BufferRef { id: BufferId(i as u32 + 1), size: b.len() as u64 }).collect();
        let msg = BatchMsg::new(1, &Batch { buffers: &refs, tensors: &self.tensors, ops: &self.ops }).unwrap();
        let mut enc = vec![0u8; MAX_MESSAGE];
        let enc = wire::encode(&msg, &mut enc).unwrap().to_vec();
        let mut req = MAGIC.to_vec();
        put(&mut req, &[CMD_BATCH, self.scratch, enc.len() as u32]);
        req.extend_from_slice(&enc);
        req.resize(req.len().next_multiple_of(4), 0);
        put(&mut req, &[self.bufs.len() as u32]);
        for (i, b) in self.bufs.iter().enumerate() {
            put(&mut req, &[i as u32 + 1, b.len() as u32]);
            req.extend_from_slice(b);
            req.resize(req.len().next_multiple_of(4), 0);
        }
        let resp = run_elf(&elf(), &req);
        let w: Vec<u32> = words(&resp[..12]).collect();
        assert_eq!(w[0], 0, "harness status");
        if w[1] != 0 {
            return Err(Failed { op: w[1] - 1, code: w[2] });
        }
        let mut at = 12;
        let mut out = Vec::new();
        for b in &self.bufs {
            out.push(resp[at..at + b.len()].to_vec());
            at += b.len().next_multiple_of(4);
        }
        assert_eq!(at, resp.len(), "response length");
        Ok(out)
    }
}

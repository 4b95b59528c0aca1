//! Op descriptors: tensor types and layouts, tensor and op descriptor tables,
//! and the batch that carries them. This module owns shapes and validation, not
//! execution; the `supports` rules are in [`crate::support`].
//!
//! Shapes follow ggml: `ne[0]` is the innermost (contiguous) dimension; `nb[i]`
//! is the byte stride of dimension `i` (`nb[0]` is the element or block size).

use crate::buffer::BufferId;
use crate::error::ErrorKind;
use crate::tile;

/// Element types a tensor may have.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// ggml Q4_0: blocks of 32, f16 scale + 16 nibble bytes (18 bytes).
    Q4_0,
    /// ggml Q8_0: blocks of 32, f16 scale + 32 int8 (34 bytes).
    Q8_0,
    /// ggml IQ4_NL: like Q4_0 with a non-linear 16-entry value table (18 bytes).
    IQ4NL,
    /// 32-bit signed integer (row indices, positions).
    I32,
}

impl DType {
    /// Stable code used in capability bit sets.
    pub const fn code(self) -> u8 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q8_0 => 3,
            DType::IQ4NL => 4,
            DType::I32 => 5,
        }
    }
    /// ggml's number for this type (`ggml_type`: F32 0, F16 1, Q4_0 2, Q8_0 8, IQ4_NL 20,
    /// I32 26), as GGUF files store it: how a host or firmware names the type to keel-core.
    pub const fn ggml_type_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q8_0 => 8,
            DType::IQ4NL => 20,
            DType::I32 => 26,
        }
    }
    /// Elements per block (1 for plain types).
    pub const fn block_len(self) -> u32 {
        match self {
            DType::Q4_0 | DType::Q8_0 | DType::IQ4NL => 32,
            _ => 1,
        }
    }
    /// Bytes per block (per element for plain types).
    pub const fn block_bytes(self) -> u32 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 => 2,
            DType::Q4_0 | DType::IQ4NL => 18,
            DType::Q8_0 => 34,
        }
    }
    /// Whether this is a block-quantized type.
    pub const fn is_quantized(self) -> bool {
        self.block_len() > 1
    }
    /// Bytes of one row of `n` elements, or `None` if `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: u32) -> Option<u64> {
        if n % self.block_len() != 0 {
            return None;
        }
        Some(u64::from(n / self.block_len()) * u64::from(self.block_bytes()))
    }
}

/// How a tensor's bytes are arranged.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Layout {
    /// ggml layout: rows of blocks, strides in `nb`.
    RowMajor,
    /// keel's 32×32 weight tiles for HVX (see [`crate::tile`]); 2-D only, `nb` ignored.
    Tiles32,
}

/// One tensor in a batch's tensor table.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TensorDesc {
    /// Element type.
    pub dtype: DType,
    /// Byte arrangement.
    pub layout: Layout,
    /// Elements per dimension, innermost first.
    pub ne: [u32; 4],
    /// Byte stride per dimension (row-major only).
    pub nb: [u32; 4],
    /// Index into the batch's buffer table.
    pub buffer: u16,
    /// Byte offset of element 0 in that buffer.
    pub offset: u32,
}

impl TensorDesc {
    /// A contiguous row-major tensor.
    pub fn contiguous(dtype: DType, ne: [u32; 4], buffer: u16, offset: u32) -> Option<TensorDesc> {
        let row = u32::try_from(dtype.row_bytes(ne[0])?).ok()?;
        let nb1 = row;
        let nb2 = nb1.checked_mul(ne[1])?;
        let nb3 = nb2.checked_mul(ne[2])?;
        nb3.checked_mul(ne[3])?;
        Some(TensorDesc { dtype, layout: Layout::RowMajor, ne, nb: [dtype.block_bytes(), nb1, nb2, nb3], buffer, offset })
    }

    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().map(|&n| u64::from(n)).product()
    }

    /// One past the last byte this tensor touches, relative to its buffer start.
    pub fn end(&self) -> Option<u64> {
        if self.ne.contains(&0) {
            return None;
        }
        let extent = match self.layout {
            Layout::RowMajor => {
                let mut e = self.dtype.row_bytes(self.ne[0])?;
                for d in 1..4 {
                    e = e.checked_add(u64::from(self.ne[d] - 1).checked_mul(u64::from(self.nb[d]))?)?;
                }
                e
            }
            Layout::Tiles32 => {
                if self.ne[2] != 1 || self.ne[3] != 1 {
                    return None;
                }
                tile::packed_size(self.dtype, self.ne[1], self.ne[0])? as u64
            }
        };
        u64::from(self.offset).checked_add(extent)
    }
}

/// What an op does, with its parameters.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum OpKind {
    /// `dst[n, m] = Σ_k src0[m, k] · src1[n, k]` (ggml MUL_MAT; a mat-vec when src1 has one row).
    /// src1 is F32 (quantized to Q8_0 on the device) or Q8_0 already (see [`OpKind::Quantize`]).
    MatMul,
    /// Rows of src0 (any type) picked by the I32 indices in src1, as F32.
    GetRows,
    /// Root-mean-square normalisation of each row: `x / sqrt(mean(x²) + eps)`,
    /// times the F32 weight row src1 if given (fused, as `(x · scale) · w`).
    RmsNorm {
        /// Added to the mean square before the square root.
        eps: f32,
    },
    /// Rotary position embedding of src0 at the I32 positions src1. If src2 is
    /// given it is the F32 `(cos, sin)` table, `[n_dims, n_tokens]` (pair `i` of
    /// token `t` at `2i`, `2i + 1`), and `freq_base` is not used.
    Rope {
        /// Leading dimensions of each head that are rotated.
        n_dims: u16,
        /// 0: adjacent pairs (ggml "normal"); 2: halves (NeoX).
        mode: u8,
        /// Frequency base θ.
        freq_base: f32,
    },
    /// Causal attention of Q (src0) over the device-resident K (src1) and V (src2)
    /// caches: of `n_kv = k.ne[1]` positions, query token `t` of `n_tokens` (at position
    /// `p = n_kv − n_tokens + t`: the queries are the last `n_tokens` positions) sees
    /// `0 ..= p`, or with a sliding window `max(0, p + 1 − window) ..= p` (keys before
    /// the window may be in the cache; they are ignored). Keys are visited in position
    /// order, so a full-length cache gives the bits of keel's CPU ring cache.
    /// (Protocol 2 added `window`.)
    Attention {
        /// Query heads.
        n_head: u16,
        /// Key/value heads (divides `n_head`).
        n_head_kv: u16,
        /// Usually `1/sqrt(head_dim)`.
        scale: f32,
        /// Sliding-window width in positions (0: none, every earlier position).
        window: u32,
    },
    /// Softmax of each row after multiplying by `scale`.
    Softmax {
        /// Pre-multiplier.
        scale: f32,
    },
    /// `x·σ(x)`.
    Silu,
    /// GELU (tanh approximation).
    Gelu,
    /// `silu(src0) · src1` (the gated FFN product).
    SwiGlu,
    /// Element-wise product; src1 may broadcast over rows.
    Mul,
    /// Element-wise sum; src1 may broadcast over rows.
    Add,
    /// `gelu(src0) · src1` (the gated FFN product with GELU, tanh approximation).
    GeGlu,
    /// Quantizes the F32 rows of src0 into dst, a Q8_0 row-major tensor of the
    /// same shape, with keel's CPU activation rule (`d = max|x|/127` as f16,
    /// `q = rint(x · 127/max|x|)`, half to even).
    Quantize,
    /// Copies the F32 src0 into dst (F32 or F16, round to nearest even) of the
    /// same shape; either may be a strided view (for writing K/V cache rows).
    Copy,
    /// `x · s` per element (ggml SCALE): Gemma's embedding scale and query prescale.
    Scale {
        /// The factor.
        s: f32,
    },
    /// `1 / (1 + e^−x)` per element (keel-core `ops::sigmoid`).
    Sigmoid,
    /// `ln(1 + e^x)`, `x` itself above 20, per element (keel-core `ops::softplus`).
    Softplus,
    /// Each row (`ne[0]` values) divided by its L2 norm, as keel-core
    /// `delta_net::l2_norm`: `(x · 1/sqrt(mean(x²) + eps/n)) · 1/sqrt(n)`. src0 may be
    /// a view with strided rows (e.g. the q and k heads of a delta-net conv output)
    /// when dst is that same view (in place) or disjoint from it.
    L2Norm {
        /// Added to the squared norm (as `eps/n` to the mean square).
        eps: f32,
    },
    /// Causal depthwise conv1d + SiLU with a device-resident state (ggml SSM_CONV with
    /// the SiLU fused): src0 the new inputs `[ch, n_tokens]`, src1 the taps
    /// `[d_conv, ch]`, src2 the state `[d_conv − 1, ch]` (the last `d_conv − 1` inputs
    /// of each channel, read and **updated in place**), dst `[ch, n_tokens]`:
    /// `dst[c, i] = silu(Σ_t input_c(i + t) · w[c, t])` over `[state_c | x_c]`
    /// (keel-core `delta_net::conv_channel` per channel). dst is disjoint from every
    /// source; the state from src0 and src1.
    SsmConv,
    /// The gated delta rule per value head with a device-resident state (keel-core
    /// `delta_net::step` per token and head, or `delta_net::chunk` per chunk and head).
    /// src0: q, k, v heads `[d, 2·n_k_heads + n_v_heads, n_tokens]` (q heads, then k
    /// heads, then v heads of each token, L2-normalized q and k; rows contiguous, any
    /// head and token strides, e.g. a view of the conv output); src1: the gates
    /// `[n_v_heads, n_tokens, 2]` (plane 0: `beta`, plane 1: the log-decay `g`); src2:
    /// the transposed states `[d, d, n_v_heads]` (`m[j·d + i] = S[i][j]`, **updated in
    /// place**); dst: `[d, n_v_heads, n_tokens]`. Value head `h` reads q/k head
    /// `h % n_k_heads`. dst and the state are disjoint from each other and every source.
    GatedDeltaRule {
        /// Query/key heads (divides `n_v_heads`).
        n_k_heads: u16,
        /// 0: token by token (`step`); `c > 0`: chunks of `c` tokens (`chunk`; keel's
        /// CPU uses 64, and token by token for a single token).
        chunk: u16,
        /// Output scale, usually `1/sqrt(d)`.
        scale: f32,
    },
}

impl OpKind {
    /// Stable code used in capability bit sets.
    pub const fn code(&self) -> u8 {
        match self {
            OpKind::MatMul => 0,
            OpKind::GetRows => 1,
            OpKind::RmsNorm { .. } => 2,
            OpKind::Rope { .. } => 3,
            OpKind::Attention { .. } => 4,
            OpKind::Softmax { .. } => 5,
            OpKind::Silu => 6,
            OpKind::Gelu => 7,
            OpKind::SwiGlu => 8,
            OpKind::Mul => 9,
            OpKind::Add => 10,
            OpKind::GeGlu => 11,
            OpKind::Quantize => 12,
            OpKind::Copy => 13,
            OpKind::Scale { .. } => 14,
            OpKind::Sigmoid => 15,
            OpKind::Softplus => 16,
            OpKind::L2Norm { .. } => 17,
            OpKind::SsmConv => 18,
            OpKind::GatedDeltaRule { .. } => 19,
        }
    }
}

/// One op in a batch: what, and which tensors (indices into the tensor table).
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct OpDesc {
    /// The op.
    pub kind: OpKind,
    /// Source tensors.
    pub src: [Option<u16>; 3],
    /// Destination tensor.
    pub dst: u16,
}

/// A buffer named by a batch: its id and the size the device knows it by.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BufferRef {
    /// The buffer.
    pub id: BufferId,
    /// Its size in bytes.
    pub size: u64,
}

/// An op batch as the host builds it: three descriptor tables.
#[derive(Copy, Clone, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Batch<'a> {
    /// Buffers the tensors live in.
    pub buffers: &'a [BufferRef],
    /// Tensors the ops read and write.
    pub tensors: &'a [TensorDesc],
    /// Ops, executed in order.
    pub ops: &'a [OpDesc],
}

impl Batch<'_> {
    /// Checks every index and that every tensor lies inside its buffer.
    pub fn validate(&self) -> Result<(), ErrorKind> {
        for t in self.tensors {
            let buf = self.buffers.get(usize::from(t.buffer)).ok_or(ErrorKind::InvalidArgument)?;
            let end = t.end().ok_or(ErrorKind::InvalidArgument)?;
            if end > buf.size {
                return Err(ErrorKind::InvalidArgument);
            }
        }
        let n = self.tensors.len();
        for op in self.ops {
            let idx = op.src.iter().flatten().chain(core::iter::once(&op.dst));
            if idx.into_iter().any(|&i| usize::from(i) >= n) {
                return Err(ErrorKind::InvalidArgument);
            }
        }
        Ok(())
    }
}

/// Why an op is not supported.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Reason {
    /// The firmware does not implement this op kind.
    OpKind,
    /// A tensor type is not accepted.
    DType,
    /// A tensor layout is not accepted.
    Layout,
    /// Shapes do not fit the op or the kernel's rules.
    Shape,
    /// The unit that runs it is absent or failed its self-test.
    Unit,
    /// A tensor index is missing or out of range.
    Index,
}

/// Answer to `supports(op)`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Support {
    /// The device runs it.
    Yes,
    /// It does not, and why.
    No(Reason),
}

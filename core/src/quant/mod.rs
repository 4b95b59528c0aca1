//! Quant formats and the kernels that compute with them.
//!
//! Owns: the block layouts of the 32-element ggml quant types ([`blocks`]), the scalar
//! reference (dequantize, `vec_dot`, quantizers) and the SIMD kernels, and the choice
//! between them ([`Kernels`]). Knows nothing of tensors, models or threads: every entry
//! point works on one row, so a caller may split rows across threads freely and get the
//! same bits (each row's arithmetic depends only on that row and `n`).
//!
//! A matmul `y[r] = W[r] · x` runs as: pick `dot = kernels.dot_fn(W.type)` once;
//! quantize `x` once into the weight type's [`Kernels::vec_dot_type`] with
//! [`Kernels::quantize_activations`]; then `y[r] = dot(n, row r of W, x_q)` per row.
//!
//! Types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (weights) and Q8_0/Q8_1
//! (activations). K-quants and IQ types are not here yet ([`Unsupported`]).
//!
//! Roundings (see `quantize.rs`): [`quantize_row_ref`] is llama.cpp's reference weight
//! quantizer (`roundf`, ties away from zero) and reproduces `llama-quantize`'s bytes
//! (checked against `golden/smollm2-135m-requant/tensor-digests.json`: every Q4_0, Q5_0
//! and Q8_0 tensor re-quantized from the Q4_1 source matches);
//! activation quantization is llama.cpp's x86 variant (`id = 127/amax`, ties to even),
//! and the reference and SIMD paths produce identical activation bytes.
//!
//! Errors vs contracts: functions that take a whole row (`quantize_activations`,
//! `dequantize_row`, `quantize_row_ref`) check the row shape and return an error naming
//! the problem. The [`DotFn`]s, called once per output row, only `debug_assert!` their
//! contract; in release a broken contract gives a wrong number, never a panic or an
//! out-of-bounds read.

pub mod blocks;
mod f16ops;
mod quantize;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(test)]
mod bench;
#[cfg(test)]
mod tests;

pub use blocks::{as_blocks, Block, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};

use crate::ggml_type::GgmlType;
use half::f16;

/// CPU features the host detected (no_std cannot ask the OS itself).
///
/// On x86_64 [`Kernels::new`] also confirms `avx2_fma` with CPUID (AVX2, FMA, F16C and
/// OS support for YMM state), so a wrong report cannot run unsupported instructions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Isa {
    /// x86_64 AVX2 + FMA (F16C is implied on every such CPU and confirmed by CPUID).
    pub avx2_fma: bool,
    /// x86_64 AVX-512 F/BW/VL (not used yet).
    pub avx512: bool,
    /// x86_64 AVX-512 VNNI (not used yet).
    pub avx512_vnni: bool,
    /// aarch64 dot-product instructions (not used yet).
    pub neon_dotprod: bool,
    /// aarch64 int8 matrix multiply (not used yet).
    pub i8mm: bool,
}

/// A row dot product: `n` elements of a weight row `w` (in the weight type) times an
/// activation row `a` (in the weight type's vec dot type).
///
/// Contract: `n` is a multiple of the weight type's block size, `w` and `a` hold at
/// least `n` elements each, and Q8 activations come from
/// [`Kernels::quantize_activations`] (all |q| <= 127). Checked with `debug_assert!`
/// only; see the module doc.
pub type DotFn = fn(n: usize, w: &[u8], a: &[u8]) -> f32;

/// A type/operation pair keel cannot do, or a row whose shape does not fit its type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unsupported {
    /// The type concerned.
    pub ty: GgmlType,
    /// What was asked of it.
    pub reason: Reason,
}

/// Why an [`Unsupported`] was returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// No `vec_dot` kernel for this weight type.
    NoDot,
    /// Not a vec dot (activation) type: F32, F16, BF16, Q8_0 or Q8_1 are.
    NotActivationType,
    /// No dequantizer for this type.
    NoDequantize,
    /// No reference quantizer for this type.
    NoQuantize,
    /// `n` elements do not make whole blocks, or `bytes` is not their size.
    RowShape {
        /// Elements in the row.
        n: usize,
        /// Bytes given for the row.
        bytes: usize,
    },
}

impl core::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let ty = self.ty;
        match self.reason {
            Reason::NoDot => write!(f, "no vec_dot kernel for weight type {ty}"),
            Reason::NotActivationType => write!(f, "{ty} is not an activation (vec dot) type"),
            Reason::NoDequantize => write!(f, "dequantizing {ty} is not supported"),
            Reason::NoQuantize => write!(f, "quantizing to {ty} is not supported"),
            Reason::RowShape { n, bytes } => write!(
                f,
                "{ty}: a row of {n} elements does not fit {bytes} bytes \
                 (rows are whole blocks of {} elements, {} bytes each)",
                ty.block_size(),
                ty.type_size()
            ),
        }
    }
}

/// The kernel set chosen for this CPU: the scalar reference, or SIMD where available.
#[derive(Clone, Copy, Debug)]
pub struct Kernels {
    /// AVX2 + FMA + F16C kernels (x86_64 only; confirmed by CPUID).
    avx2: bool,
}

impl Kernels {
    /// The scalar reference only: bit-identical on every target.
    pub fn reference() -> Self {
        Kernels { avx2: false }
    }

    /// The fastest kernels `isa` allows (and, on x86_64, CPUID confirms).
    pub fn new(isa: Isa) -> Self {
        #[cfg(target_arch = "x86_64")]
        if isa.avx2_fma && x86::cpu_has_avx2_fma() {
            return Kernels { avx2: true };
        }
        let _ = isa;
        Self::reference()
    }

    /// True if this is the scalar reference.
    pub fn is_reference(&self) -> bool {
        !self.avx2
    }

    /// A short name for logs: `"reference"` or `"avx2"`.
    pub fn name(&self) -> &'static str {
        if self.avx2 {
            "avx2"
        } else {
            "reference"
        }
    }

    /// The activation type a weight type's dot expects, as llama.cpp pairs them
    /// (`None` if keel has no dot for `wtype`).
    pub fn vec_dot_type(wtype: GgmlType) -> Option<GgmlType> {
        use GgmlType::*;
        match wtype {
            F32 => Some(F32),
            F16 => Some(F16),
            BF16 => Some(BF16),
            Q4_0 | Q5_0 | Q8_0 => Some(Q8_0),
            Q4_1 | Q5_1 => Some(Q8_1),
            _ => None,
        }
    }

    /// The dot kernel for weight type `wtype`; choose once per matmul, call per row.
    pub fn dot_fn(&self, wtype: GgmlType) -> Result<DotFn, Unsupported> {
        if let Some(f) = self.fast_dot(wtype) {
            return Ok(f);
        }
        use GgmlType::*;
        let f: DotFn = match wtype {
            F32 => scalar::vec_dot_f32,
            F16 => scalar::vec_dot_f16,
            BF16 => scalar::vec_dot_bf16,
            Q4_0 => scalar::vec_dot_q4_0_q8_0,
            Q4_1 => scalar::vec_dot_q4_1_q8_1,
            Q5_0 => scalar::vec_dot_q5_0_q8_0,
            Q5_1 => scalar::vec_dot_q5_1_q8_1,
            Q8_0 => scalar::vec_dot_q8_0_q8_0,
            _ => return Err(Unsupported { ty: wtype, reason: Reason::NoDot }),
        };
        Ok(f)
    }

    fn fast_dot(&self, wtype: GgmlType) -> Option<DotFn> {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            use GgmlType::*;
            let f: DotFn = match wtype {
                F32 => x86::vec_dot_f32,
                F16 => x86::vec_dot_f16,
                BF16 => x86::vec_dot_bf16,
                Q4_0 => x86::vec_dot_q4_0_q8_0,
                Q4_1 => x86::vec_dot_q4_1_q8_1,
                Q5_0 => x86::vec_dot_q5_0_q8_0,
                Q5_1 => x86::vec_dot_q5_1_q8_1,
                Q8_0 => x86::vec_dot_q8_0_q8_0,
                _ => return None,
            };
            return Some(f);
        }
        let _ = wtype;
        None
    }

    /// `gate[i] = silu(gate[i]) * up[i]` with llama.cpp's vectorized exponential
    /// ([`crate::ops::swiglu`]); the same bits with every kernel set.
    pub fn swiglu(&self, gate: &mut [f32], up: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            return x86::act::swiglu(gate, up);
        }
        crate::ops::swiglu(gate, up)
    }

    /// Dot product of two f16 rows in llama.cpp's flash-attention order (K·Q); the same
    /// bits with every kernel set. See `f16ops.rs` for the order.
    pub fn f16_dot(&self, x: &[f16], y: &[f16]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            return x86::f16ops::dot(x, y);
        }
        f16ops::dot(x, y)
    }

    /// `y += x·v` on an f16 accumulator, rounding to f16 as llama.cpp's attention does.
    pub fn f16_mad(&self, y: &mut [f16], x: &[f16], v: f32) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            return x86::f16ops::mad(y, x, v);
        }
        f16ops::mad(y, x, v)
    }

    /// `y *= v` on an f16 accumulator, rounding to f16 as llama.cpp's attention does.
    pub fn f16_scale(&self, y: &mut [f16], v: f32) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            return x86::f16ops::scale(y, v);
        }
        f16ops::scale(y, v)
    }

    /// `dst[i] = f16(src[i])` (round to nearest even; F16C where available).
    pub fn f32_to_f16(&self, src: &[f32], dst: &mut [f16]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            return x86::f16ops::to_f16(src, dst);
        }
        f16ops::to_f16(src, dst)
    }

    /// `dst[i] = f32(src[i])` (exact; F16C where available).
    pub fn f16_to_f32(&self, src: &[f16], dst: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            return x86::f16ops::to_f32(src, dst);
        }
        f16ops::to_f32(src, dst)
    }

    /// Converts an activation row `x` (n floats) into `ty` (a vec dot type) in `out`,
    /// which must be exactly `ty.row_bytes(n)` long. F32 is copied, F16 rounds to
    /// nearest even, BF16 as ggml, Q8_0/Q8_1 as described in the module doc; the bytes
    /// are the same whichever kernel set runs.
    pub fn quantize_activations(&self, ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), Unsupported> {
        use GgmlType::*;
        if !matches!(ty, F32 | F16 | BF16 | Q8_0 | Q8_1) {
            return Err(Unsupported { ty, reason: Reason::NotActivationType });
        }
        check_row(ty, x.len(), out.len())?;
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            match ty {
                Q8_0 => x86::quantize_q8(x, out, false),
                Q8_1 => x86::quantize_q8(x, out, true),
                F16 => x86::convert_f16(x, out),
                _ => quantize::convert_row(ty, x, out),
            }
            return Ok(());
        }
        match ty {
            Q8_0 => quantize::quantize_act_q8_0(x, out),
            Q8_1 => quantize::quantize_act_q8_1(x, out),
            _ => quantize::convert_row(ty, x, out),
        }
        Ok(())
    }

    /// Dequantizes one row: `src` holds `dst.len()` elements of `ty`, exactly
    /// `ty.row_bytes(dst.len())` bytes. Supports F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
    /// Q8_0 and Q8_1, with llama.cpp's per-element formulas (mul then add, unfused), so
    /// every kernel set gives the same values.
    pub fn dequantize_row(&self, ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), Unsupported> {
        use GgmlType::*;
        if !matches!(ty, F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1) {
            return Err(Unsupported { ty, reason: Reason::NoDequantize });
        }
        check_row(ty, dst.len(), src.len())?;
        let done = scalar::dequantize_row(ty, src, dst);
        debug_assert!(done, "dequantize_row: {ty} passed the type check but has no kernel");
        Ok(())
    }
}

/// Quantizes a row with llama.cpp's reference rounding (`quantize_row_*_ref`), which
/// `llama-quantize` uses when no importance matrix is given: Q4_0, Q4_1, Q5_0, Q5_1,
/// Q8_0, Q8_1, plus plain conversion to F32/F16/BF16. `out` must be exactly
/// `ty.row_bytes(x.len())` long.
pub fn quantize_row_ref(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), Unsupported> {
    use GgmlType::*;
    if !matches!(ty, F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1) {
        return Err(Unsupported { ty, reason: Reason::NoQuantize });
    }
    check_row(ty, x.len(), out.len())?;
    let done = quantize::quantize_row_ref(ty, x, out);
    debug_assert!(done, "quantize_row_ref: {ty} passed the type check but has no kernel");
    Ok(())
}

fn check_row(ty: GgmlType, n: usize, bytes: usize) -> Result<(), Unsupported> {
    match ty.row_bytes(n as u64) {
        Some(b) if b == bytes as u64 => Ok(()),
        _ => Err(Unsupported { ty, reason: Reason::RowShape { n, bytes } }),
    }
}

//! Quant formats and the kernels that compute with them.
//!
//! Owns: the block layouts of the ggml quant types ([`blocks`]), the scalar reference
//! (dequantize, `vec_dot`, quantizers) and the SIMD kernels, and the choice between them
//! ([`Kernels`]). Knows nothing of tensors, models or threads: every entry
//! point works on one row, so a caller may split rows across threads freely and get the
//! same bits (each row's arithmetic depends only on that row and `n`).
//!
//! Dispatch: one kernel table per ISA and set of flags (`KernelTable`: the dot of every
//! weight type, its 8-row and tile versions and batch orders, the activation quantizers,
//! the FFN activations and attention's f16 and softmax operations), built at compile
//! time. The scalar reference's (`REFERENCE`) has every entry; an ISA module (`x86/`,
//! `aarch64/`) has a `table(isa)` that returns its table for what `isa` reports (and, on
//! x86_64, CPUID confirms), made by starting from the reference's and replacing what the
//! ISA has. [`Kernels::new`] asks each compiled-in ISA module once and keeps the table
//! it gets (else the reference's); each [`Kernels`] method looks its entry up and calls
//! it. Where an ISA kernel takes only some shapes (x86's grouped attention dots), its
//! entry is a wrapper in the ISA module that falls back to the reference's loop. A new
//! ISA is one module with a `table` and one line in [`Kernels::new`].
//!
//! A matmul `y[r] = W[r] · x` runs as: pick `dot = kernels.dot_fn(W.type)` once;
//! quantize `x` once into the weight type's [`Kernels::vec_dot_type`] with
//! [`Kernels::quantize_activations`]; then `y[r] = dot(n, row r of W, x_q)` per row.
//!
//! Types: weights F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4 (32-element
//! blocks) and the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-element super-blocks);
//! activations Q8_0 (for Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4), Q8_1 (Q4_1, Q5_1) and Q8_K
//! (the K-quants), as llama.cpp's `type_traits_cpu` pairs them. Every supported type
//! has a scalar dot, a dequantizer and llama.cpp's reference quantizer; AVX2 dots and
//! aarch64 NEON dots (`aarch64/`, with `sdot` where the host reports it; the reference's
//! bits for every quantized type) exist for all of them. Any other type (the IQ1/IQ2/IQ3
//! grids, IQ4_XS, TQ*) is refused with an [`Unsupported`] that names it.
//!
//! Roundings (see `quantize.rs`, `quantize_k.rs`): [`quantize_row_ref`] is what
//! `llama-quantize` writes without an importance matrix — llama.cpp's
//! `quantize_row_*_ref` (`roundf` or `nearest_int`, its scale searches for the K-quants),
//! and for IQ4_NL `quantize_iq4_nl` with no weights — and reproduces its bytes (checked
//! against `golden/smollm2-135m-requant/tensor-digests.json`: every tensor of the Q8_0,
//! Q4_0, IQ4_NL and Q4_K_M files re-quantized from the Q4_1 source matches);
//! Q8_0/Q8_1 activation quantization is llama.cpp's x86 variant (`id = 127/amax`, ties to
//! even), Q8_K activations are `quantize_row_q8_K_ref` (which llama.cpp's x86 build also
//! uses), and the reference and SIMD paths produce identical activation bytes.
//!
//! Summation orders: each dot follows the kernel llama.cpp 11434 runs for that weight
//! type on an AVX2 CPU, and the scalar reference and the AVX2 kernel of every type give
//! the same bits. Where llama.cpp repacks the weights (`CPU_REPACK`: Q4_0, Q4_K, IQ4_NL
//! and MXFP4 on AVX2, Q2_K on AVX-512, whenever the matrix has a multiple of 8 rows) keel
//! follows the repacked single-token kernels' (`gemv`) per-output order — per
//! (super-)block an exact integer sum, then one fma into one accumulator (two for
//! Q4_K/Q2_K: scales and mins, subtracted at the end). Q3_K, Q5_K and Q6_K are not
//! repacked on x86 and follow `ggml_vec_dot_q*_K_q8_K` (8 lane accumulators,
//! `scalar_k.rs`); nor are Q4_1, Q5_0, Q5_1 and Q8_0, which follow `ggml_vec_dot_*`
//! (one fma per block into 8 lane accumulators, `scalar.rs`).
//!
//! Batches: llama.cpp 11434 does not compute a row the same way in every batch. Its
//! repacked Q4_K/Q2_K `gemm` (tokens in groups of four) accumulates per 64 / 128
//! elements instead of per super-block, and for batches of 8+ tokens over K-quant
//! weights it does not repack (Q3_K, Q5_K, Q6_K on x86) it runs a new tiled matmul with
//! its own order. [`Kernels::dot_fn`] follows the single-token kernels (so batched and
//! single-token evaluation stay identical in keel); [`Kernels::dot_fn_in_batch`] gives
//! the kernel llama.cpp uses for a given row of a given batch, for a caller that wants
//! llama.cpp's prompt bits instead. Q4_0, IQ4_NL and MXFP4 have one order for every
//! batch (repacked `gemm` = `gemv`), and so have the unrepacked 32-element types:
//! llama.cpp runs Q5_0, Q8_0 (and Q4_0 with `rows % 8 != 0`) batches through llamafile's
//! `tinyBLAS_Q0_AVX`, whose per-output order is `vec_dot`'s, and Q4_1/Q5_1 through
//! `vec_dot` itself; for Q4_0 with `rows % 8 != 0` that is not [`Kernels::dot_fn`]'s
//! (repacked) order, so `dot_fn_in_batch` returns the `vec_dot` one.
//! All of this is checked bit for bit against llama.cpp's own matmul outputs
//! (`golden/quant-llamacpp-11434`: 1-, 5- and 13-token batches).
//!
//! Errors vs contracts: functions that take a whole row (`quantize_activations`,
//! `dequantize_row`, `quantize_row_ref`) check the row shape and return an error naming
//! the problem. The [`DotFn`]s, called once per output row, only `debug_assert!` their
//! contract; in release a broken contract gives a wrong number, never a panic or an
//! out-of-bounds read.

pub mod blocks;
#[cfg(any(target_arch = "hexagon", test))]
mod expf64;
mod f16ops;
mod quantize;
mod quantize_k;
pub mod rows16;
mod scalar;
mod scalar_k;
pub mod tiles32;
#[cfg(target_arch = "hexagon")]
mod hexagon;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm32;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
mod aarch64;
#[cfg(test)]
mod bench;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_f16;
#[cfg(test)]
mod tests_k;
#[cfg(test)]
mod tests_tiles32;

pub use blocks::{
    as_blocks, Block, BlockIq4Nl, BlockMxfp4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K,
    BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};

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
    /// x86_64 AVX-512 F/BW/VL: 8-lane f64 exponentials in attention's softmax;
    /// confirmed by CPUID in [`Kernels::new`].
    pub avx512: bool,
    /// x86_64 AVX-512 VNNI (with AVX-512 F/BW/VL): `vpdpbusd` in the prompt tiles;
    /// confirmed by CPUID in [`Kernels::new`].
    pub avx512_vnni: bool,
    /// x86_64 AVX512-FP16 (with AVX-512 F/VL): the native f16 fma of attention's value
    /// accumulator; confirmed by CPUID in [`Kernels::new`].
    pub avx512_fp16: bool,
    /// aarch64 Advanced SIMD (NEON): the NEON kernels (`aarch64/`).
    pub neon: bool,
    /// aarch64 dot-product instructions (`sdot`; used by the NEON kernels if `neon`).
    pub neon_dotprod: bool,
    /// aarch64 int8 matrix multiply (not used yet).
    pub i8mm: bool,
    /// Hexagon HVX with 128-byte vectors: the HVX Tiles32 kernels (`hexagon/`).
    pub hvx: bool,
}

/// A row dot product: `n` elements of a weight row `w` (in the weight type) times an
/// activation row `a` (in the weight type's vec dot type).
///
/// Contract: `n` is a multiple of the weight type's block size, `w` and `a` hold at
/// least `n` elements each, and Q8 activations come from
/// [`Kernels::quantize_activations`] (all |q| <= 127). Checked with `debug_assert!`
/// only; see the module doc.
pub type DotFn = fn(n: usize, w: &[u8], a: &[u8]) -> f32;

/// Tiles of dots: `out[t * ostride + r] = dot(n, w[r * wrow..], a[t * arow..])` for
/// `r < rows` weight rows (any multiple of the [`DotTile`]'s `rows`, all sharing the
/// same tokens) and `t < tokens` activation rows (the tile's `tokens`), each output the
/// bits of the [`DotFn`] it stands for (see [`Kernels::dot_tile_fn`]).
///
/// Contract: as [`DotFn`] for every pair; `w`, `a` and `out` hold every row, token and
/// output and `ostride >= rows` (checked: a short slice or a bad `rows` panics).
pub type DotTileFn = fn(n: usize, w: &[u8], wrow: usize, rows: usize, a: &[u8], arow: usize, out: &mut [f32], ostride: usize);

/// Short batches (speculative verification): `out[t * ostride + r] = dot(n, w[r * wrow..],
/// a[t * arow..])` for `r < rows` (a multiple of 4) and `t < 2·pairs` tokens, `pairs` in
/// `1..=`[`DOT_PAIRS_MAX`], the weights read once for every token; each output the bits
/// of [`Kernels::dot_fn`] for its pair (see [`Kernels::dot_pairs_fn`]). Contract as
/// [`DotTileFn`] (a short slice or a bad shape panics).
pub type DotPairsFn = fn(n: usize, w: &[u8], wrow: usize, rows: usize, a: &[u8], arow: usize, pairs: usize, out: &mut [f32], ostride: usize);

/// The most token pairs a [`DotPairsFn`] takes.
pub const DOT_PAIRS_MAX: usize = 4;

/// A tile kernel and its shape.
#[derive(Clone, Copy, Debug)]
pub struct DotTile {
    /// The kernel.
    pub f: DotTileFn,
    /// Weight rows per tile (at most [`DOT_TILE_MAX_ROWS`]).
    pub rows: usize,
    /// Activation rows (tokens) per tile (at most [`DOT_TILE_MAX_TOKENS`]).
    pub tokens: usize,
    /// A narrower tile of the same rows for the tokens after the last whole tile (its
    /// kernel and tokens, fewer than `tokens`), where the type has one.
    pub rest: Option<(DotTileFn, usize)>,
}

/// The most weight rows any [`DotTile`] has (16: x86's rows-in-lanes tiles; 8 on the
/// targets without them, whose callers size their tile buffers by it).
pub const DOT_TILE_MAX_ROWS: usize = if cfg!(target_arch = "x86_64") { 16 } else { 8 };
/// The most tokens any [`DotTile`] has (32: x86's AVX-512 VNNI Q4_0 tile; 16 on the
/// targets without it, whose callers size their tile buffers by it).
pub const DOT_TILE_MAX_TOKENS: usize = if cfg!(target_arch = "x86_64") { 32 } else { 16 };

/// [`DOT_ROWS`] weight rows (`wrow` bytes apart in `w`) · one activation row `a`: each
/// output the bits of [`Kernels::dot_fn`] for its row (see [`Kernels::dot_rows_fn`]).
pub type DotRowsFn = fn(n: usize, w: &[u8], wrow: usize, a: &[u8], out: &mut [f32; DOT_ROWS]);

/// Weight rows of a [`DotRowsFn`].
pub const DOT_ROWS: usize = 8;

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
    /// Not a vec dot (activation) type: F32, F16, BF16, Q8_0, Q8_1 or Q8_K are.
    NotActivationType,
    /// No dequantizer for this type.
    NoDequantize,
    /// No reference quantizer for this type.
    NoQuantize,
    /// No rows16 layout for this type, or a matrix shape or buffer it cannot take
    /// ([`rows16::pack_in_place`]).
    NoRows16,
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
            Reason::NoRows16 => write!(f, "{ty}: no rows16 layout for this matrix (types Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K, rows in whole groups of 16)"),
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

/// One entry per type this module knows (see the module doc): the weight types, then
/// the activation-only Q8_1 and Q8_K. [`PerType::get`] is the one place the types are
/// matched to their entries.
#[derive(Clone, Copy)]
pub(crate) struct PerType<T> {
    pub(crate) f32: T,
    pub(crate) f16: T,
    pub(crate) bf16: T,
    pub(crate) q4_0: T,
    pub(crate) q4_1: T,
    pub(crate) q5_0: T,
    pub(crate) q5_1: T,
    pub(crate) q8_0: T,
    pub(crate) iq4_nl: T,
    pub(crate) mxfp4: T,
    pub(crate) q2_k: T,
    pub(crate) q3_k: T,
    pub(crate) q4_k: T,
    pub(crate) q5_k: T,
    pub(crate) q6_k: T,
    pub(crate) q8_1: T,
    pub(crate) q8_k: T,
}

impl<T: Copy> PerType<T> {
    /// `v` for every type.
    pub(crate) const fn splat(v: T) -> Self {
        PerType { f32: v, f16: v, bf16: v, q4_0: v, q4_1: v, q5_0: v, q5_1: v, q8_0: v, iq4_nl: v, mxfp4: v, q2_k: v, q3_k: v, q4_k: v, q5_k: v, q6_k: v, q8_1: v, q8_k: v }
    }
}

impl<T: Copy> PerType<Option<T>> {
    /// The entry of type `ty` (`None` for a type without one, or one this module does
    /// not know).
    #[inline]
    pub(crate) fn get(&self, ty: GgmlType) -> Option<T> {
        use GgmlType::*;
        match ty {
            F32 => self.f32,
            F16 => self.f16,
            BF16 => self.bf16,
            Q4_0 => self.q4_0,
            Q4_1 => self.q4_1,
            Q5_0 => self.q5_0,
            Q5_1 => self.q5_1,
            Q8_0 => self.q8_0,
            IQ4_NL => self.iq4_nl,
            MXFP4 => self.mxfp4,
            Q2_K => self.q2_k,
            Q3_K => self.q3_k,
            Q4_K => self.q4_k,
            Q5_K => self.q5_k,
            Q6_K => self.q6_k,
            Q8_1 => self.q8_1,
            Q8_K => self.q8_k,
            _ => None,
        }
    }
}

/// The [`PerType`] dots of the functions `vec_dot_f32`, `vec_dot_f16`, `vec_dot_bf16`
/// and `vec_dot_<weight>_<activation>` in scope: the names the reference's and every
/// ISA module's dots have.
macro_rules! vec_dots {
    () => {
        $crate::quant::PerType::<Option<$crate::quant::DotFn>> {
            f32: Some(vec_dot_f32),
            f16: Some(vec_dot_f16),
            bf16: Some(vec_dot_bf16),
            q4_0: Some(vec_dot_q4_0_q8_0),
            q4_1: Some(vec_dot_q4_1_q8_1),
            q5_0: Some(vec_dot_q5_0_q8_0),
            q5_1: Some(vec_dot_q5_1_q8_1),
            q8_0: Some(vec_dot_q8_0_q8_0),
            iq4_nl: Some(vec_dot_iq4_nl_q8_0),
            mxfp4: Some(vec_dot_mxfp4_q8_0),
            q2_k: Some(vec_dot_q2_k_q8_k),
            q3_k: Some(vec_dot_q3_k_q8_k),
            q4_k: Some(vec_dot_q4_k_q8_k),
            q5_k: Some(vec_dot_q5_k_q8_k),
            q6_k: Some(vec_dot_q6_k_q8_k),
            q8_1: None,
            q8_k: None,
        }
    };
}
pub(crate) use vec_dots;

/// An activation row (f32) into an activation type, whole rows of the right size (see
/// [`Kernels::quantize_activations`]).
pub(crate) type QuantizeFn = fn(x: &[f32], out: &mut [u8]);

/// [`Kernels::f16_dot_keys`] with the table it is an entry of.
pub(crate) type DotKeysFn = fn(t: &KernelTable, k: &[f16], offs: &[usize], q: &[f16], out: &mut [f32]);
/// [`Kernels::f16_mad_keys`] with the table it is an entry of.
pub(crate) type MadKeysFn = fn(t: &KernelTable, y: &mut [f16], x: &[f16], offs: &[usize], new_max: &[bool], e: &[f32]);
/// [`Kernels::f16_dot_keys_heads`] with the table it is an entry of.
pub(crate) type DotKeysHeadsFn = fn(t: &KernelTable, k: &[f16], offs: &[usize], qs: &[f16], n: usize, heads: usize, out: &mut [f32]);
/// [`Kernels::f16_dot_keys_queries`]'s kernel: `false` (nothing written) for shapes it
/// does not take.
pub(crate) type DotKeysQueriesFn = fn(k: &[f16], offs: &[usize], qs: &[f16], n: usize, heads: usize, queries: usize, out: &mut [f32]) -> bool;
/// [`Kernels::f16_mad_keys_heads`] with the table it is an entry of.
pub(crate) type MadKeysHeadsFn =
    fn(t: &KernelTable, ys: &mut [f16], n: usize, heads: usize, x: &[f16], offs: &[usize], new_max: &[bool], e: &[f32], sums: &mut [f32]);

/// [`Kernels::f32_mad_keys_heads`]'s kernel: `false` (nothing written) for shapes it
/// does not take.
pub(crate) type MadKeysHeadsF32Fn = fn(ys: &mut [f16], n: usize, heads: usize, xf: &[f32], new_max: &[bool], e: &[f32], sums: &mut [f32]) -> bool;
/// [`Kernels::f16_keys_transposed`]'s kernel (`false`: nothing written).
pub(crate) type KeysTransposedFn = fn(k: &[f16], offs: &[usize], n: usize, kt: &mut [f32]) -> bool;
/// [`Kernels::f32_dot_transposed`]'s kernel (`false`: nothing written).
pub(crate) type DotTransposedFn = fn(kt: &[f32], keys: usize, qs: &[f16], heads: usize, out: &mut [f32]) -> bool;
/// [`Kernels::f32_mad_keys_heads_dot`]'s kernel for rows of 64 (`false`: nothing written).
pub(crate) type MadKeysHeadsDotFn = fn(ys: &mut [f16], heads: usize, xf: &[f32], new_max: &[bool], e: &[f32], sums: &mut [f32], kt: &[f32], keys: usize, qs: &[f16], out: &mut [f32]) -> bool;

/// One query's K·Q scores against keys already transposed by
/// [`Kernels::f16_keys_transposed`]: `kt` (its output), the number of `keys`, the
/// query's head rows `qs` (f16, `heads` rows of the key row length) and `out` (`heads`
/// rows of `keys`).
pub struct KeysDot<'a> {
    /// The transposed keys.
    pub kt: &'a [f32],
    /// Keys transposed (the `offs.len()` of the transposing call).
    pub keys: usize,
    /// The query's head rows.
    pub qs: &'a [f16],
    /// The scores, `out[h·keys + c]`.
    pub out: &'a mut [f32],
}

/// Every kernel [`Kernels`] hands out or calls, for one ISA and set of flags: the
/// reference's ([`REFERENCE`]), or an ISA module's (`x86::table`, `aarch64::table`, `hexagon::table`),
/// which starts from the reference's and replaces what that ISA has. Built at compile
/// time (`const`), chosen once by [`Kernels::new`]. The chunk operations of attention
/// take the table they belong to, so a generic loop (`*_by_key`, `*_by_head`) calls
/// that table's per-row kernels.
#[derive(Clone, Copy)]
pub(crate) struct KernelTable {
    /// [`Kernels::name`].
    pub(crate) name: &'static str,
    /// [`Kernels::dot_fn`].
    pub(crate) dot: PerType<Option<DotFn>>,
    /// [`Kernels::dot_rows_fn`].
    pub(crate) dot_rows: PerType<Option<DotRowsFn>>,
    /// [`Kernels::dot_rows16_fn`].
    pub(crate) dot_rows16: PerType<Option<rows16::Rows16Fn>>,
    /// [`Kernels::dot_tile_rows16_fn`].
    pub(crate) dot_tile_rows16: PerType<Option<DotTile>>,
    /// [`Kernels::dot_rows16_fn_in_batch`]'s `gemm` order (Q4_K).
    pub(crate) dot_rows16_gemm: PerType<Option<rows16::Rows16Fn>>,
    /// [`Kernels::dot_rows16_fn_in_batch`]'s tiled order (Q6_K).
    pub(crate) dot_rows16_tiled: PerType<Option<rows16::Rows16Fn>>,
    /// [`Kernels::dot_tile_fn`].
    pub(crate) dot_tile: PerType<Option<DotTile>>,
    /// [`Kernels::dot_pairs_fn`].
    pub(crate) dot_pairs: PerType<Option<DotPairsFn>>,
    /// [`Kernels::dot_fn_in_batch`]: llama.cpp's `vec_dot` order where keel's dot follows
    /// its repacked one (Q4_0).
    pub(crate) dot_lanes: PerType<Option<DotFn>>,
    /// [`Kernels::dot_fn_in_batch`]: the repacked `gemm` order (Q2_K, Q4_K).
    pub(crate) dot_gemm: PerType<Option<DotFn>>,
    /// [`Kernels::dot_fn_in_batch`]: the tiled matmul's order (Q2_K .. Q6_K).
    pub(crate) dot_tiled: PerType<Option<DotFn>>,
    /// [`Kernels::dot_tile_in_batch`]: tiles in the `gemm` order of `dot_gemm`.
    pub(crate) tile_gemm: PerType<Option<DotTile>>,
    /// [`Kernels::dot_tile_in_batch`]: tiles in the tiled order of `dot_tiled`.
    pub(crate) tile_tiled: PerType<Option<DotTile>>,
    /// [`Kernels::quantize_activations`] (the activation types).
    pub(crate) quantize: PerType<Option<QuantizeFn>>,
    /// [`Kernels::rope`].
    pub(crate) rope: fn(heads: &mut [f32], hd: usize, cs: &[f32], n_rot: usize, neox: bool),
    /// [`Kernels::swiglu`].
    pub(crate) swiglu: fn(gate: &mut [f32], up: &[f32]),
    /// [`Kernels::geglu`].
    pub(crate) geglu: fn(gate: &mut [f32], up: &[f32]),
    /// [`Kernels::expf_batch`].
    pub(crate) expf_batch: fn(x: &mut [f32]),
    /// [`Kernels::f16_dot`].
    pub(crate) f16_dot: fn(x: &[f16], y: &[f16]) -> f32,
    /// [`Kernels::f16_mad`].
    pub(crate) f16_mad: fn(y: &mut [f16], x: &[f16], v: f32),
    /// [`Kernels::f16_scale`].
    pub(crate) f16_scale: fn(y: &mut [f16], v: f32),
    /// [`Kernels::f32_to_f16`].
    pub(crate) f32_to_f16: fn(src: &[f32], dst: &mut [f16]),
    /// [`Kernels::f16_to_f32`].
    pub(crate) f16_to_f32: fn(src: &[f16], dst: &mut [f32]),
    /// [`Kernels::f16_rows_to_f32`] with the table it is an entry of.
    pub(crate) f16_rows_to_f32: fn(t: &KernelTable, src: &[f16], offs: &[usize], n: usize, dst: &mut [f32]),
    /// [`Kernels::f16_dot_keys`].
    pub(crate) f16_dot_keys: DotKeysFn,
    /// [`Kernels::f16_mad_keys`].
    pub(crate) f16_mad_keys: MadKeysFn,
    /// [`Kernels::f16_dot_keys_heads`].
    pub(crate) f16_dot_keys_heads: DotKeysHeadsFn,
    /// [`Kernels::f16_dot_keys_queries`] (`None`: each query's `f16_dot_keys_heads`).
    pub(crate) f16_dot_keys_queries: Option<DotKeysQueriesFn>,
    /// [`Kernels::f16_mad_keys_heads`].
    pub(crate) f16_mad_keys_heads: MadKeysHeadsFn,
    /// [`Kernels::f32_mad_keys_heads`] (`None`: not taken, the caller uses
    /// `f16_mad_keys_heads`).
    pub(crate) f32_mad_keys_heads: Option<MadKeysHeadsF32Fn>,
    /// [`Kernels::f16_keys_transposed`] (`None`: not taken).
    pub(crate) f16_keys_transposed: Option<KeysTransposedFn>,
    /// [`Kernels::f32_dot_transposed`] (`None`: not taken).
    pub(crate) f32_dot_transposed: Option<DotTransposedFn>,
    /// [`Kernels::f32_mad_keys_heads_dot`] (`None`: not taken).
    pub(crate) f32_mad_keys_heads_dot: Option<MadKeysHeadsDotFn>,
    /// [`Kernels::softmax_scores`].
    pub(crate) softmax_scores: fn(e: &mut [f32], new_max: &mut [bool], scale: f32, max: &mut [f32]),
    /// [`Kernels::softmax_sum`].
    pub(crate) softmax_sum: fn(sum: f32, new_max: &[bool], e: &[f32]) -> f32,
    /// `softmax_sum` for the heads of a KV head at once (`sums[h]` over row h of `new_max`
    /// and `e`, rows of `e.len() / sums.len()`), each head's bits those of `softmax_sum`.
    pub(crate) softmax_sums: fn(t: &KernelTable, sums: &mut [f32], new_max: &[bool], e: &[f32]),
    /// [`Kernels::tiled_step`].
    pub(crate) tiled_step: TiledStepFn,
    /// [`Kernels::tiled_step_heads`] (`None`: `tiled_step` per row).
    pub(crate) tiled_step_heads: Option<TiledStepHeadsFn>,
    /// [`Kernels::tile_sums`]: the block-sum kernels over Tiles32 weights.
    pub(crate) tiles: tiles32::TileKernels,
    /// [`Kernels::plain_far_l2`] (0: none).
    pub(crate) plain_far_l2: usize,
}

/// [`Kernels::tiled_step_heads`]'s kernel.
pub(crate) type TiledStepHeadsFn = fn(qs: &[f32], kt: &[f32], vt: &[f32], kq: &mut [f32], lo: usize, hi: usize, scale: f32, accs: &mut [f32], ms: &mut [f32], ss: &mut [f32]);

/// [`Kernels::tiled_step`]'s kernel.
pub(crate) type TiledStepFn = fn(q: &[f32], kt: &[f32], vt: &[f32], kq: &mut [f32], lo: usize, hi: usize, scale: f32, row: crate::attn_tiled::TiledRow<'_>);

impl DotTile {
    /// A tile entry for a [`KernelTable`], its shape checked against
    /// [`DOT_TILE_MAX_ROWS`] and [`DOT_TILE_MAX_TOKENS`] (tables are built at compile
    /// time, so a bad shape does not compile). Only tables with tiles use it.
    #[allow(dead_code)]
    pub(crate) const fn entry(f: DotTileFn, rows: usize, tokens: usize) -> Option<DotTile> {
        assert!(rows >= 1 && rows <= DOT_TILE_MAX_ROWS && tokens >= 1 && tokens <= DOT_TILE_MAX_TOKENS, "dot tile shape");
        Some(DotTile { f, rows, tokens, rest: None })
    }

    /// [`DotTile::entry`] with a narrower tile of the same rows for the tokens after the
    /// last whole tile (`rest_tokens < tokens`).
    #[allow(dead_code)]
    pub(crate) const fn entry_with_rest(f: DotTileFn, rows: usize, tokens: usize, rest: DotTileFn, rest_tokens: usize) -> Option<DotTile> {
        assert!(rows >= 1 && rows <= DOT_TILE_MAX_ROWS && tokens >= 1 && tokens <= DOT_TILE_MAX_TOKENS && rest_tokens >= 1 && rest_tokens < tokens, "dot tile shape");
        Some(DotTile { f, rows, tokens, rest: Some((rest, rest_tokens)) })
    }
}

/// The order llama.cpp's kernel for one token of a batch follows (see
/// [`Kernels::dot_fn_in_batch`]).
#[derive(Clone, Copy)]
enum BatchOrder {
    /// `vec_dot`'s lanes where keel's dot follows the repacked order (Q4_0, rows not a
    /// multiple of 8).
    Lanes,
    /// The repacked `gemm` (Q4_K, Q2_K in whole groups of 4 tokens).
    Gemm,
    /// The tiled K-quant matmul (batches of 8 or more, weights not repacked).
    Tiled,
    /// [`Kernels::dot_fn`]'s.
    Dot,
}

impl BatchOrder {
    /// Token `token` of a batch of `n_tokens` against `rows` rows of `wtype`.
    fn of(wtype: GgmlType, rows: usize, n_tokens: usize, token: usize) -> BatchOrder {
        use GgmlType::*;
        if wtype == Q4_0 && !rows.is_multiple_of(8) {
            return BatchOrder::Lanes;
        }
        let repacked = matches!(wtype, Q4_K | Q2_K) && rows.is_multiple_of(8);
        if repacked && token < n_tokens - n_tokens % 4 {
            BatchOrder::Gemm
        } else if !repacked && n_tokens >= 8 && matches!(wtype, Q2_K | Q3_K | Q4_K | Q5_K | Q6_K) {
            BatchOrder::Tiled
        } else {
            BatchOrder::Dot
        }
    }
}

/// The scalar reference's table: bit-identical on every target, and what every ISA's
/// table starts from.
pub(crate) const REFERENCE: KernelTable = KernelTable {
    name: "reference",
    dot: {
        use scalar::*;
        use scalar_k::*;
        self::vec_dots!()
    },
    dot_rows: PerType::splat(None),
    dot_rows16: PerType::splat(None),
    dot_tile_rows16: PerType::splat(None),
    dot_rows16_gemm: PerType::splat(None),
    dot_rows16_tiled: PerType::splat(None),
    dot_tile: PerType::splat(None),
    dot_pairs: PerType::splat(None),
    dot_lanes: PerType { q4_0: Some(scalar::vec_dot_q4_0_q8_0_lanes), ..PerType::splat(None) },
    dot_gemm: PerType { q2_k: Some(scalar_k::vec_dot_q2_k_q8_k_gemm), q4_k: Some(scalar_k::vec_dot_q4_k_q8_k_gemm), ..PerType::splat(None) },
    dot_tiled: PerType {
        q2_k: Some(scalar_k::vec_dot_q2_k_q8_k_tiled),
        q3_k: Some(scalar_k::vec_dot_q3_k_q8_k_tiled),
        q4_k: Some(scalar_k::vec_dot_q4_k_q8_k_tiled),
        q5_k: Some(scalar_k::vec_dot_q5_k_q8_k_tiled),
        q6_k: Some(scalar_k::vec_dot_q6_k_q8_k_tiled),
        ..PerType::splat(None)
    },
    tile_gemm: PerType::splat(None),
    tile_tiled: PerType::splat(None),
    quantize: PerType::<Option<QuantizeFn>> {
        f32: Some(|x, out| quantize::convert_row(GgmlType::F32, x, out)),
        f16: Some(|x, out| quantize::convert_row(GgmlType::F16, x, out)),
        bf16: Some(|x, out| quantize::convert_row(GgmlType::BF16, x, out)),
        q8_0: Some(quantize::quantize_act_q8_0),
        q8_1: Some(quantize::quantize_act_q8_1),
        q8_k: Some(quantize::quantize_act_q8_k),
        ..PerType::splat(None)
    },
    rope: crate::ops::rope_heads,
    swiglu: crate::ops::swiglu,
    geglu: crate::ops::geglu,
    expf_batch: expf_by_element,
    f16_dot: f16ops::dot,
    f16_mad: f16ops::mad,
    f16_scale: f16ops::scale,
    f32_to_f16: f16ops::to_f16,
    f16_to_f32: f16ops::to_f32,
    f16_rows_to_f32: rows_to_f32_by_row,
    f16_dot_keys: dot_keys_by_key,
    f16_mad_keys: mad_keys_by_key,
    f16_dot_keys_heads: dot_keys_by_head,
    f16_dot_keys_queries: None,
    f16_mad_keys_heads: mad_keys_by_head,
    f32_mad_keys_heads: None,
    f16_keys_transposed: None,
    f32_dot_transposed: None,
    f32_mad_keys_heads_dot: None,
    softmax_scores: softmax_scores_by_key,
    softmax_sum: softmax_sum_by_key,
    softmax_sums: softmax_sums_by_head,
    tiled_step: crate::attn_tiled::step_ref,
    tiled_step_heads: None,
    tiles: tiles32::REFERENCE,
    plain_far_l2: 0,
};

/// [`REFERENCE`] where [`Kernels`] points to it.
static REFERENCE_TABLE: KernelTable = REFERENCE;

/// `x[i] = ops::expf(x[i])`, one element at a time.
fn expf_by_element(x: &mut [f32]) {
    for v in x {
        *v = crate::ops::expf(*v);
    }
}

/// [`Kernels::f16_dot_keys`] key by key with `t`'s `f16_dot`.
fn dot_keys_by_key(t: &KernelTable, k: &[f16], offs: &[usize], q: &[f16], out: &mut [f32]) {
    for (o, &off) in out.iter_mut().zip(offs) {
        *o = (t.f16_dot)(&k[off..][..q.len()], q);
    }
}

/// [`Kernels::f16_mad_keys`] key by key with `t`'s `f16_scale` and `f16_mad`.
fn mad_keys_by_key(t: &KernelTable, y: &mut [f16], x: &[f16], offs: &[usize], new_max: &[bool], e: &[f32]) {
    let n = y.len();
    for (c, &off) in offs.iter().enumerate() {
        if new_max[c] {
            (t.f16_scale)(y, e[c]);
            (t.f16_mad)(y, &x[off..][..n], 1.0);
        } else {
            (t.f16_mad)(y, &x[off..][..n], e[c]);
        }
    }
}

/// [`Kernels::f16_dot_keys_heads`] head by head with `t`'s `f16_dot_keys`.
pub(crate) fn dot_keys_by_head(t: &KernelTable, k: &[f16], offs: &[usize], qs: &[f16], n: usize, heads: usize, out: &mut [f32]) {
    let len = offs.len();
    for h in 0..heads {
        (t.f16_dot_keys)(t, k, offs, &qs[h * n..(h + 1) * n], &mut out[h * len..(h + 1) * len]);
    }
}

/// [`Kernels::f16_rows_to_f32`] row by row with `t`'s `f16_to_f32`.
pub(crate) fn rows_to_f32_by_row(t: &KernelTable, src: &[f16], offs: &[usize], n: usize, dst: &mut [f32]) {
    assert!(dst.len() >= offs.len() * n, "f16_rows_to_f32: {} rows of {n} do not fit in {}", offs.len(), dst.len());
    for (&off, d) in offs.iter().zip(dst.chunks_exact_mut(n.max(1))) {
        (t.f16_to_f32)(&src[off..off + n], &mut d[..n]);
    }
}

/// [`Kernels::f16_mad_keys_heads`] head by head with `t`'s `f16_mad_keys` and
/// `softmax_sum`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mad_keys_by_head(t: &KernelTable, ys: &mut [f16], n: usize, heads: usize, x: &[f16], offs: &[usize], new_max: &[bool], e: &[f32], sums: &mut [f32]) {
    let len = offs.len();
    for h in 0..heads {
        let r = h * len..(h + 1) * len;
        (t.f16_mad_keys)(t, &mut ys[h * n..(h + 1) * n], x, offs, &new_max[r.clone()], &e[r]);
    }
    (t.softmax_sums)(t, &mut sums[..heads], &new_max[..heads * len], &e[..heads * len]);
}

/// `KernelTable::softmax_sums` head by head with `t`'s `softmax_sum`.
fn softmax_sums_by_head(t: &KernelTable, sums: &mut [f32], new_max: &[bool], e: &[f32]) {
    let len = e.len() / sums.len().max(1);
    for (h, sum) in sums.iter_mut().enumerate() {
        let r = h * len..(h + 1) * len;
        *sum = (t.softmax_sum)(*sum, &new_max[r.clone()], &e[r]);
    }
}

/// [`Kernels::softmax_scores`] row by row, key by key.
fn softmax_scores_by_key(e: &mut [f32], new_max: &mut [bool], scale: f32, max: &mut [f32]) {
    let len = e.len() / max.len().max(1);
    for ((e, new_max), max) in e.chunks_exact_mut(len.max(1)).zip(new_max.chunks_exact_mut(len.max(1))).zip(max.iter_mut()) {
        for (ec, nm) in e.iter_mut().zip(new_max.iter_mut()) {
            let s = *ec * scale;
            if s > *max {
                (*ec, *nm) = (*max - s, true);
                *max = s;
            } else {
                (*ec, *nm) = (s - *max, false);
            }
        }
    }
}

/// [`Kernels::softmax_sum`] key by key ([`crate::fused::fmaf`]).
fn softmax_sum_by_key(mut sum: f32, new_max: &[bool], e: &[f32]) -> f32 {
    for (&nm, &ec) in new_max.iter().zip(e) {
        let (ms, vs) = if nm { (ec, 1.0) } else { (1.0, ec) };
        sum = crate::fused::fmaf(sum, ms, vs);
    }
    sum
}

/// How many times the L3 cache a model's weights a token must exceed for
/// [`Kernels::for_weights`] to make the rows16 kernels' hints non-temporal. On the Zen 5
/// VM (32 MiB L3; 2026-12-05), one-thread decode with them: Gemma 3 270M Q4_K_M (246 MB,
/// 7.3 times) +8-13%, SmolLM2 Q8_0 (143 MB, 4.3 times) level to +2%, SmolLM2 Q4_1 and Q4_0 (90-96
/// MB, ~2.8 times) -5-6% (BENCHMARKS.md).
pub const STREAM_L3_TIMES: usize = 4;

/// The kernel set chosen for this CPU: the scalar reference, or SIMD where available
/// (a reference to its [`KernelTable`]; copying it is free).
#[derive(Clone, Copy)]
pub struct Kernels {
    t: &'static KernelTable,
}

impl core::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Kernels").field("name", &self.t.name).finish()
    }
}

impl Kernels {
    /// The scalar reference only: bit-identical on every target.
    pub fn reference() -> Self {
        Kernels { t: &REFERENCE_TABLE }
    }

    /// The fastest kernels `isa` allows (and, on x86_64, CPUID confirms).
    pub fn new(isa: Isa) -> Self {
        // One line per ISA: its module's table for `isa`, if it has one.
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = x86::table(isa) {
            return Kernels { t };
        }
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        if let Some(t) = aarch64::table(isa) {
            return Kernels { t };
        }
        #[cfg(target_arch = "hexagon")]
        if let Some(t) = hexagon::table(isa) {
            return Kernels { t };
        }
        let _ = isa;
        Self::reference()
    }

    /// How far ahead of a row a one-token product over plain rows (a type without the
    /// rows16 layout, or a set without its kernels) asks for the row's lines a second time,
    /// into L2, beside its hint into L1 (`matmul`); 0: no second hint. On x86 the sets
    /// whose rows16 kernels take Intel's far hint into L2 (`x86::rows16::PREFETCH_INTEL`)
    /// take it here too, at the same distance: on the faster Xeon VM (2026-12-07) one
    /// token's product over a ~240 MiB Q6_K or Q5_K matrix streamed 13-29% faster with it
    /// (`quant::bench::bench_plain_stream`, BENCHMARKS.md); on AMD the rows16 kernels' far
    /// hint made decode slower.
    pub(crate) fn plain_far_l2(&self) -> usize {
        self.t.plain_far_l2
    }

    /// This set for a model whose weights a token reads are `bytes`: on an AMD CPU whose
    /// AVX-512 rows16 kernels ask for their weights 8 KiB ahead (not Zen 4, not Intel),
    /// with those hints non-temporal when `bytes` is more than [`STREAM_L3_TIMES`] times
    /// the L3 cache (CPUID's), where no weight survives in it until the next token; else
    /// this set. The same bits either way (hints only). `Engine::new` applies it.
    pub fn for_weights(self, bytes: usize) -> Kernels {
        #[cfg(target_arch = "x86_64")]
        if let (Some(t), Some(l3)) = (x86::streaming(self.t), x86::cpu_l3_bytes_amd()) {
            if bytes > STREAM_L3_TIMES * l3 {
                return Kernels { t };
            }
        }
        let _ = bytes;
        self
    }

    /// This set with its AVX-512 rows16 kernels' hints non-temporal ([`Kernels::for_weights`]'s
    /// choice for a large model), where it has AMD's distance: `None` elsewhere.
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(crate) fn streaming(&self) -> Option<Kernels> {
        x86::streaming(self.t).map(|t| Kernels { t })
    }

    /// This set with the AVX-512 value updates' other f16 rounding form (through memory
    /// as on Intel, or through registers as elsewhere; the same bits) and its rows16
    /// kernels' prefetch distance the other vendor's (Intel's or AMD's): `None` where the
    /// set has no AVX-512. Tests run both forms on whatever CPU they find.
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(crate) fn other_rounding(&self) -> Option<Kernels> {
        x86::other_rounding(self.t).map(|t| Kernels { t })
    }

    /// This set with its rows16 kernels' prefetch hints the other way (the same bits):
    /// with AVX-512, turned off where they are on and on where they are off; with AVX2
    /// alone, the next of its three forms (one stream, three streams, Intel's with the
    /// far hint into L2).
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(crate) fn other_rows16_prefetch(&self) -> Option<Kernels> {
        x86::other_rows16_prefetch(self.t).map(|t| Kernels { t })
    }

    /// How far ahead this set's rows16 kernels (AVX-512 or AVX2) ask for their weights,
    /// as their `PF` encodes it (0: no hints); `None` for a set without x86 kernels.
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(crate) fn rows16_prefetch_distance(&self) -> Option<usize> {
        x86::rows16_prefetch_distance(self.t)
    }

    /// This set with its 8-row kernels' far prefetch at the other cache level (L1 or L2;
    /// the same bits): tests run both variants on whatever CPU they find.
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(crate) fn other_prefetch(&self) -> Option<Kernels> {
        x86::other_prefetch(self.t).map(|t| Kernels { t })
    }

    /// Whether this set's 8-row kernels prefetch far ahead into L1 (x86: where the L1 data
    /// cache holds 48 KiB or more).
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(crate) fn prefetches_far_into_l1(&self) -> bool {
        x86::prefetches_far_into_l1(self.t)
    }

    /// True if this is the scalar reference.
    pub fn is_reference(&self) -> bool {
        core::ptr::eq(self.t, &REFERENCE_TABLE)
    }

    /// The Tiles32 block-sum kernels of this set ([`tiles32`]): HVX on Hexagon, else the
    /// scalar reference (the same integers).
    pub fn tile_sums(&self) -> tiles32::TileKernels {
        self.t.tiles
    }

    /// A short name for logs: `"reference"`, `"avx2"`, `"avx2+fp16"` (AVX512-FP16 for the
    /// f16 ops), `"avx2+vnni"` (AVX-512 VNNI for the tiles), `"avx2+vnni+fp16"`, `"neon"`
    /// `"neon-dotprod"` or `"hvx"`.
    pub fn name(&self) -> &'static str {
        self.t.name
    }

    /// The activation type a weight type's dot expects, as llama.cpp pairs them
    /// (`None` if keel has no dot for `wtype`).
    pub fn vec_dot_type(wtype: GgmlType) -> Option<GgmlType> {
        use GgmlType::*;
        match wtype {
            F32 => Some(F32),
            F16 => Some(F16),
            BF16 => Some(BF16),
            Q4_0 | Q5_0 | Q8_0 | IQ4_NL | MXFP4 => Some(Q8_0),
            Q4_1 | Q5_1 => Some(Q8_1),
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => Some(Q8_K),
            _ => None,
        }
    }

    /// The dot kernel for weight type `wtype`; choose once per matmul, call per row.
    pub fn dot_fn(&self, wtype: GgmlType) -> Result<DotFn, Unsupported> {
        self.t.dot.get(wtype).ok_or(Unsupported { ty: wtype, reason: Reason::NoDot })
    }

    /// The dot that reproduces, bit for bit, output `(row, token)` of llama.cpp 11434's
    /// CPU matmul of a weight with `rows` rows by a batch of `n_tokens` activation rows,
    /// `token` being this activation row's index in the batch — on llama.cpp's x86
    /// AVX-512 build with CPU_REPACK on (its default, and how keel's goldens were made).
    /// llama.cpp picks its kernel by batch geometry:
    /// - Q4_K and Q2_K with `rows % 8 == 0` are repacked: tokens in whole groups of four
    ///   (`token < n_tokens - n_tokens % 4`) go through `gemm`, whose order has an fma
    ///   pair per 64 (Q4_K) / 128 (Q2_K) elements; the rest go through `gemv`, whose
    ///   order [`Kernels::dot_fn`] follows;
    /// - Q2_K .. Q6_K weights that are not repacked, in batches of 8 or more tokens, go
    ///   through the tiled matmul (`ggml-cpu/tiled/`, new in 11434): per super-block
    ///   `r = f32(s1)·dw`, `r = fma(-dminw, f32(s2), r)`, `acc = fma(r, da, acc)`;
    /// - Q4_0 with `rows % 8 != 0` is not repacked: every token goes through
    ///   `ggml_vec_dot_q4_0_q8_0` or (batches) llamafile's `tinyBLAS_Q0_AVX`, which share
    ///   the Q8_0-style lane order, not the repacked order of [`Kernels::dot_fn`];
    /// - everything else uses [`Kernels::dot_fn`]'s order (Q4_0's repacked `gemm` and
    ///   `gemv` share it; Q5_0 and Q8_0 batches run llamafile's `tinyBLAS_Q0_AVX`, whose
    ///   per-output order is `vec_dot`'s).
    ///
    /// Not reproduced (this returns `dot_fn`): Q4_K/Q2_K with `rows % 8 != 0` in batches
    /// of fewer than 8 (llama.cpp's `vec_dot` lanes), IQ4_NL/MXFP4 with `rows % 8 != 0`.
    /// Opt-in: a caller using it gives up keel's rule that a row's dot does not depend
    /// on the batch the row is in.
    pub fn dot_fn_in_batch(&self, wtype: GgmlType, rows: usize, n_tokens: usize, token: usize) -> Result<DotFn, Unsupported> {
        let order = match BatchOrder::of(wtype, rows, n_tokens, token) {
            BatchOrder::Lanes => &self.t.dot_lanes,
            BatchOrder::Gemm => &self.t.dot_gemm,
            BatchOrder::Tiled => &self.t.dot_tiled,
            BatchOrder::Dot => return self.dot_fn(wtype),
        };
        // (Every table has these orders for these types: the reference's.)
        match order.get(wtype) {
            Some(f) => Ok(f),
            None => self.dot_fn(wtype),
        }
    }

    /// A tile version of [`Kernels::dot_fn_in_batch`] for a batch of `n_tokens` against
    /// `rows` weight rows: the tile and how many of the batch's first tokens it may take
    /// (a multiple of its `tokens`; at least one tile), each output having the bits that
    /// `dot_fn_in_batch(wtype, rows, n_tokens, token)` gives for its (row, token) pair.
    /// `None` where the batch's order has no tile in this kernel set, or where every
    /// token takes [`Kernels::dot_fn`] (then [`Kernels::dot_tile_fn`] applies). For now
    /// x86's Q4_K in the `gemm` order (8 rows × 8 tokens with AVX-512 VNNI) and Q4_K and
    /// Q6_K in the tiled order.
    pub fn dot_tile_in_batch(&self, wtype: GgmlType, rows: usize, n_tokens: usize) -> Option<(DotTile, usize)> {
        // Token 0's order is that of every token up to the last whole `gemm` group (the
        // tiled order is the whole batch's).
        let (tile, covered) = match BatchOrder::of(wtype, rows, n_tokens, 0) {
            BatchOrder::Gemm => (self.t.tile_gemm.get(wtype)?, n_tokens - n_tokens % 4),
            BatchOrder::Tiled => (self.t.tile_tiled.get(wtype)?, n_tokens),
            BatchOrder::Lanes | BatchOrder::Dot => return None,
        };
        let covered = covered - covered % tile.tokens;
        (covered > 0).then_some((tile, covered))
    }

    /// An 8-row version of [`Kernels::dot_fn`]`(wtype)` for one activation row: output
    /// `r` has the bits that dot gives for row `r`, so a matmul may use it for groups of
    /// 8 rows (decode) and the dot for the rest. `None` where there is none: for now
    /// AVX2's Q4_0, IQ4_NL and MXFP4, whose dot is one scalar fma chain per row
    /// (llama.cpp's repacked order): one row at a time each block waits on the previous
    /// fma; eight rows' chains side by side in one vector overlap. And Q8_0, Q5_0, Q4_1,
    /// Q5_1 (one 8-lane accumulator per row): four rows per pass share each activation
    /// block and convert their scales together, and their fma chains overlap. With AVX-512
    /// VNNI (Q4_0, Q8_0, Q5_0, Q4_1, Q5_1) each row's block sum by one `vpdpbusd` and a
    /// correction formed once per activation block; and Q4_K there, two rows per 512-bit
    /// vector with the eight rows' sums and float steps side by side.
    pub fn dot_rows_fn(&self, wtype: GgmlType) -> Option<DotRowsFn> {
        self.t.dot_rows.get(wtype)
    }

    /// A tile version of [`Kernels::dot_fn`]`(wtype)`: every output of the tile has the
    /// bits that dot gives for its (row, token) pair, so a matmul may use it for whole
    /// tiles and the dot for the rest. `None` where there is none (the caller uses the
    /// dot): for now x86's Q8_0, Q5_0, Q4_1, Q4_0 (with AVX-512 VNNI, `vpdpbusd`
    /// versions and larger Q4_0 and Q4_K tiles), Q4_K and Q6_K (one row × several tokens).
    pub fn dot_tile_fn(&self, wtype: GgmlType) -> Option<DotTile> {
        self.t.dot_tile.get(wtype)
    }

    /// A short-batch version of [`Kernels::dot_fn`]`(wtype)` ([`DotPairsFn`]): every
    /// output has the bits that dot gives for its (row, token) pair, so a matmul of 2 to
    /// 9 tokens may use it for token pairs and the 8-row kernel for an odd last token.
    /// `None` where there is none: for now x86's Q8_0 with AVX-512 VNNI.
    pub fn dot_pairs_fn(&self, wtype: GgmlType) -> Option<DotPairsFn> {
        self.t.dot_pairs.get(wtype)
    }

    /// Rotates the first `n_rot` dims of each `hd`-wide head of `heads` by the `(cos, sin)`
    /// pairs `cs` ([`crate::ops::rope_heads`]: adjacent pairs, or NeoX's halves with
    /// `neox`); the same bits with every kernel set.
    pub fn rope(&self, heads: &mut [f32], hd: usize, cs: &[f32], n_rot: usize, neox: bool) {
        (self.t.rope)(heads, hd, cs, n_rot, neox)
    }

    /// `gate[i] = silu(gate[i]) * up[i]` with llama.cpp's vectorized exponential
    /// ([`crate::ops::swiglu`]); the same bits with every kernel set.
    pub fn swiglu(&self, gate: &mut [f32], up: &[f32]) {
        (self.t.swiglu)(gate, up)
    }

    /// `gate[i] = gelu(gate[i]) * up[i]` as [`crate::ops::geglu`] (ggml's f16 GELU table);
    /// the same bits with every kernel set.
    pub fn geglu(&self, gate: &mut [f32], up: &[f32]) {
        (self.t.geglu)(gate, up)
    }

    /// Dot product of two f16 rows in llama.cpp's flash-attention order (K·Q); the same
    /// bits with every kernel set. See `f16ops.rs` for the order.
    #[inline]
    pub fn f16_dot(&self, x: &[f16], y: &[f16]) -> f32 {
        (self.t.f16_dot)(x, y)
    }

    /// `y += x·v` on an f16 accumulator, rounding to f16 as llama.cpp's attention does.
    #[inline]
    pub fn f16_mad(&self, y: &mut [f16], x: &[f16], v: f32) {
        (self.t.f16_mad)(y, x, v)
    }

    /// `out[c] = f16_dot(k[offs[c]..][..q.len()], q)` for each key c of a chunk (the
    /// same bits; panics if a key lies outside `k`).
    pub fn f16_dot_keys(&self, k: &[f16], offs: &[usize], q: &[f16], out: &mut [f32]) {
        (self.t.f16_dot_keys)(self.t, k, offs, q, out)
    }

    /// The value accumulator's updates for a chunk of keys, in key order: for key c with
    /// `x_c = x[offs[c]..][..y.len()]`, if `new_max[c]` then `f16_scale(y, e[c])` and
    /// `f16_mad(y, x_c, 1.0)`, else `f16_mad(y, x_c, e[c])` — the same bits (panics if a
    /// row lies outside `x`).
    pub fn f16_mad_keys(&self, y: &mut [f16], x: &[f16], offs: &[usize], new_max: &[bool], e: &[f32]) {
        (self.t.f16_mad_keys)(self.t, y, x, offs, new_max, e)
    }

    /// [`Kernels::f16_dot_keys`] for `heads` query rows of `n` (`qs`) against the same
    /// keys: `out[h·offs.len() + c]` (each key row is read once for all heads on x86);
    /// the same bits.
    pub fn f16_dot_keys_heads(&self, k: &[f16], offs: &[usize], qs: &[f16], n: usize, heads: usize, out: &mut [f32]) {
        (self.t.f16_dot_keys_heads)(self.t, k, offs, qs, n, heads, out)
    }

    /// [`Kernels::f16_dot_keys_heads`] for `queries` queries against the same keys
    /// (`qs`: `queries·heads` rows of `n`, query-major): `out[(j·heads + h)·offs.len() + c]`,
    /// each the bits of query `j`'s own call. Where the kernel set has a kernel for the
    /// shapes (x86 with AVX-512: rows of 64 or 128, up to 4 heads, 32 queries and 64
    /// keys) the key rows are converted once for every query; `false` (nothing written)
    /// elsewhere, and the caller takes each query's `f16_dot_keys_heads`.
    #[allow(clippy::too_many_arguments)]
    pub fn f16_dot_keys_queries(&self, k: &[f16], offs: &[usize], qs: &[f16], n: usize, heads: usize, queries: usize, out: &mut [f32]) -> bool {
        self.t.f16_dot_keys_queries.is_some_and(|f| f(k, offs, qs, n, heads, queries, out))
    }

    /// [`Kernels::f16_mad_keys`] for `heads` accumulator rows of `n` (`ys`) over the
    /// same value rows, `new_max` and `e` holding `heads` rows of `offs.len()` (each value
    /// row is read once for all heads on x86), and each head's running sum
    /// `sums[h] = softmax_sum(sums[h], ..)` over its row of `new_max` and `e`; the same
    /// bits.
    #[allow(clippy::too_many_arguments)]
    pub fn f16_mad_keys_heads(&self, ys: &mut [f16], n: usize, heads: usize, x: &[f16], offs: &[usize], new_max: &[bool], e: &[f32], sums: &mut [f32]) {
        (self.t.f16_mad_keys_heads)(self.t, ys, n, heads, x, offs, new_max, e, sums)
    }

    /// [`Kernels::f16_mad_keys_heads`] over value rows already converted to f32 (`xf`:
    /// `xf.len() / n` rows of `n`, row c for key c, each holding f16 values exactly): the
    /// same bits, without converting a row again for each query that reads it (x86 with
    /// AVX-512: rows of 64, up to 4 heads). `false` (nothing written) where the kernel set
    /// has no such kernel; the caller then takes `f16_mad_keys_heads`.
    #[allow(clippy::too_many_arguments)]
    pub fn f32_mad_keys_heads(&self, ys: &mut [f16], n: usize, heads: usize, xf: &[f32], new_max: &[bool], e: &[f32], sums: &mut [f32]) -> bool {
        self.t.f32_mad_keys_heads.is_some_and(|f| f(ys, n, heads, xf, new_max, e, sums))
    }

    /// A chunk's key rows (`offs`, rows of `n`) converted to f32 and transposed into `kt`
    /// (at least `64·64`) for [`Kernels::f32_dot_transposed`] and
    /// [`Kernels::f32_mad_keys_heads_dot`]: x86 with AVX-512 on CPUs other than Intel's
    /// (where the value update's conversions leave the FMA units idle), rows of 64, 1 to
    /// 64 keys; `false` (nothing written) elsewhere, and the caller takes
    /// [`Kernels::f16_dot_keys_queries`].
    pub fn f16_keys_transposed(&self, k: &[f16], offs: &[usize], n: usize, kt: &mut [f32]) -> bool {
        self.t.f16_keys_transposed.is_some_and(|f| f(k, offs, n, kt))
    }

    /// One query's scores against transposed keys (`d`; `heads` rows of 1 to 4): each
    /// the bits of [`Kernels::f16_dot_keys_heads`] for that key. `false` (nothing
    /// written) where the kernel set has no such kernel or the shapes do not fit.
    pub fn f32_dot_transposed(&self, heads: usize, d: KeysDot<'_>) -> bool {
        self.t.f32_dot_transposed.is_some_and(|f| f(d.kt, d.keys, d.qs, heads, d.out))
    }

    /// [`Kernels::f32_mad_keys_heads`] (rows of 64) that also computes another query's
    /// scores `d` ([`Kernels::f32_dot_transposed`]) while it runs: the value update is
    /// bound by f16 conversions and leaves the multipliers free for the dot. The same
    /// bits as the two calls. `false` (nothing written) where the kernel set has no such
    /// kernel or the shapes do not fit; the caller then makes the two calls.
    #[allow(clippy::too_many_arguments)]
    pub fn f32_mad_keys_heads_dot(&self, ys: &mut [f16], n: usize, heads: usize, xf: &[f32], new_max: &[bool], e: &[f32], sums: &mut [f32], d: KeysDot<'_>) -> bool {
        n == 64 && self.t.f32_mad_keys_heads_dot.is_some_and(|f| f(ys, heads, xf, new_max, e, sums, d.kt, d.keys, d.qs, d.out))
    }

    /// The online softmax's exponents for a chunk of the scores of `max.len()` heads
    /// (`e`: a row of `e.len() / max.len()` keys per head, `new_max` the same shape), each
    /// row in key order with its head's running maximum `max[h]`: `s = e[c]·scale`; if
    /// `s > max` then `e[c] = max - s`, `new_max[c] = true` and `max = s`, else
    /// `e[c] = s - max`, `new_max[c] = false` (x86 with AVX-512: 16 keys per step by a
    /// prefix maximum, up to four heads side by side; the same flags and values, up to
    /// the sign of a zero exponent or maximum, which `expf` and the comparisons do not
    /// see).
    ///
    /// Panics if `e` is not whole rows or `new_max` is shorter than `e`.
    pub fn softmax_scores(&self, e: &mut [f32], new_max: &mut [bool], scale: f32, max: &mut [f32]) {
        assert!(!max.is_empty() && e.len().is_multiple_of(max.len()) && new_max.len() >= e.len(), "softmax_scores: {} rows of {} scores", max.len(), e.len());
        (self.t.softmax_scores)(e, &mut new_max[..e.len()], scale, max)
    }

    /// The online softmax's running sum over a chunk of keys, in key order:
    /// `sum = fma(sum, e[c], 1)` where `new_max[c]`, else `fma(sum, 1, e[c])` — bit for
    /// bit `libm::fmaf` (x86: the FMA instruction, no call per key).
    pub fn softmax_sum(&self, sum: f32, new_max: &[bool], e: &[f32]) -> f32 {
        (self.t.softmax_sum)(sum, new_max, e)
    }

    /// `x[i] = ops::expf(x[i])` for every element, bit for bit (AVX2: four lanes in f64,
    /// AVX-512: eight, with `ops::expf` itself for the rare lane whose rounding the fast
    /// path cannot decide; see `x86::act::expf_batch`).
    pub fn expf_batch(&self, x: &mut [f32]) {
        (self.t.expf_batch)(x)
    }

    /// `y *= v` on an f16 accumulator, rounding to f16 as llama.cpp's attention does.
    #[inline]
    pub fn f16_scale(&self, y: &mut [f16], v: f32) {
        (self.t.f16_scale)(y, v)
    }

    /// `dst[i] = f16(src[i])` (round to nearest even; F16C where available).
    pub fn f32_to_f16(&self, src: &[f32], dst: &mut [f16]) {
        (self.t.f32_to_f16)(src, dst)
    }

    /// One query row's step over one key tile of llama.cpp's tiled attention
    /// ([`crate::attn_tiled`]): the bits of `attn_tiled::step_ref` (x86: 8 or 16 lanes).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn tiled_step(&self, q: &[f32], kt: &[f32], vt: &[f32], kq: &mut [f32], lo: usize, hi: usize, scale: f32, row: crate::attn_tiled::TiledRow<'_>) {
        (self.t.tiled_step)(q, kt, vt, kq, lo, hi, scale, row)
    }

    /// [`Kernels::tiled_step`] for the `ms.len()` (1 to 4) query rows of one token that
    /// share a KV head (so the same keys `lo..hi`): `qs` their queries (rows of
    /// `qs.len() / ms.len()`), `accs` their accumulators (rows of `accs.len() / ms.len()`),
    /// `ms`/`ss` their maxima and sums, `kq` at least `ms.len()·TILE` scratch floats.
    /// Each row gets `tiled_step`'s bits; a kernel set may share each key and value
    /// load between the rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tiled_step_heads(&self, qs: &[f32], kt: &[f32], vt: &[f32], kq: &mut [f32], lo: usize, hi: usize, scale: f32, accs: &mut [f32], ms: &mut [f32], ss: &mut [f32]) {
        if let Some(f) = self.t.tiled_step_heads {
            return f(qs, kt, vt, kq, lo, hi, scale, accs, ms, ss);
        }
        let nh = ms.len();
        let (hd, hdv) = (qs.len() / nh, accs.len() / nh);
        for (h, ((acc, m), s)) in accs.chunks_exact_mut(hdv).zip(ms.iter_mut()).zip(ss.iter_mut()).enumerate() {
            let row = crate::attn_tiled::TiledRow { acc, m, s };
            self.tiled_step(&qs[h * hd..(h + 1) * hd], kt, vt, &mut kq[..crate::attn_tiled::TILE], lo, hi, scale, row);
        }
    }

    /// `dst[i] = f32(src[i])` (exact; F16C where available).
    pub fn f16_to_f32(&self, src: &[f16], dst: &mut [f32]) {
        (self.t.f16_to_f32)(src, dst)
    }

    /// Rows of `n` f16 at `src[offs[c]..]` into `dst[c·n..][..n]` as f32, exactly (one
    /// call for a chunk's rows; panics if a row lies outside `src` or `dst` is short).
    pub fn f16_rows_to_f32(&self, src: &[f16], offs: &[usize], n: usize, dst: &mut [f32]) {
        (self.t.f16_rows_to_f32)(self.t, src, offs, n, dst)
    }

    /// Converts an activation row `x` (n floats) into `ty` (a vec dot type) in `out`,
    /// which must be exactly `ty.row_bytes(n)` long. F32 is copied, F16 rounds to
    /// nearest even, BF16 as ggml, Q8_0/Q8_1/Q8_K as described in the module doc; the
    /// bytes are the same whichever kernel set runs.
    pub fn quantize_activations(&self, ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), Unsupported> {
        let Some(f) = self.t.quantize.get(ty) else {
            return Err(Unsupported { ty, reason: Reason::NotActivationType });
        };
        check_row(ty, x.len(), out.len())?;
        f(x, out);
        Ok(())
    }

    /// Dequantizes one row: `src` holds `dst.len()` elements of `ty`, exactly
    /// `ty.row_bytes(dst.len())` bytes. Supports every type of the module doc (weights
    /// and activations), with llama.cpp's per-element formulas (mul then add, unfused),
    /// so every kernel set gives the same values.
    pub fn dequantize_row(&self, ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), Unsupported> {
        if !is_known(ty) {
            return Err(Unsupported { ty, reason: Reason::NoDequantize });
        }
        check_row(ty, dst.len(), src.len())?;
        let done = scalar::dequantize_row(ty, src, dst);
        debug_assert!(done, "dequantize_row: {ty} passed the type check but has no kernel");
        Ok(())
    }
}

/// Quantizes a row as `llama-quantize` does when no importance matrix is given
/// (llama.cpp's `quantize_row_*_ref`; for IQ4_NL `quantize_iq4_nl` without weights):
/// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
/// Q8_K, plus plain conversion to F32/F16/BF16. `out` must be exactly
/// `ty.row_bytes(x.len())` long.
pub fn quantize_row_ref(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), Unsupported> {
    if !is_known(ty) {
        return Err(Unsupported { ty, reason: Reason::NoQuantize });
    }
    check_row(ty, x.len(), out.len())?;
    let done = quantize::quantize_row_ref(ty, x, out);
    debug_assert!(done, "quantize_row_ref: {ty} passed the type check but has no kernel");
    Ok(())
}

/// The types this module can store and convert (see the module doc).
fn is_known(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K)
}

fn check_row(ty: GgmlType, n: usize, bytes: usize) -> Result<(), Unsupported> {
    match ty.row_bytes(n as u64) {
        Some(b) if b == bytes as u64 => Ok(()),
        _ => Err(Unsupported { ty, reason: Reason::RowShape { n, bytes } }),
    }
}

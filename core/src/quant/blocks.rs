//! The byte layout of ggml's quant blocks, as `#[repr(C)]` structs.
//!
//! Owns: the block structs, the [`Block`] marker trait, the zero-copy checked cast
//! [`as_blocks`], alignment-free [`read_block`] / [`write_block`], the scalar
//! f16/bf16/E8M0 conversions every kernel agrees on, the non-linear value tables
//! ([`KVALUES_IQ4NL`], [`KVALUES_MXFP4`]) and the unpacking of packed K-quant scales.
//! Knows nothing about arithmetic.
//!
//! Layouts of the 32-element blocks (little-endian; "element j" is position j in the row
//! segment the block covers):
//!
//! ```text
//! Q4_0    18 B  d:f16 | qs[16]            x[j] = ((qs[j] & 15) - 8) * d,  x[j+16] = ((qs[j] >> 4) - 8) * d
//! Q4_1    20 B  d:f16 m:f16 | qs[16]      x[j] = (qs[j] & 15) * d + m,    x[j+16] = (qs[j] >> 4) * d + m
//! Q5_0    22 B  d:f16 | qh[4] | qs[16]    5th bit of element i is bit i of the u32 qh; value - 16, times d
//! Q5_1    24 B  d:f16 m:f16 | qh[4] | qs[16]   as Q5_0 without the -16, plus m
//! Q8_0    34 B  d:f16 | qs[32] i8         x[j] = qs[j] * d
//! Q8_1    36 B  d:f16 s:f16 | qs[32] i8   as Q8_0; s = d * sum(qs) (used by the Q4_1/Q5_1 dots)
//! IQ4_NL  18 B  d:f16 | qs[16]            x[j] = d * KVALUES_IQ4NL[qs[j] & 15], x[j+16] = d * KV[qs[j] >> 4]
//! MXFP4   17 B  e:u8 | qs[16]             as IQ4_NL with KVALUES_MXFP4 (2x the E2M1 values) and
//!                                         d = 2^(e-128) (E8M0 halved: `e8m0_to_f32_half`)
//! ```
//!
//! The K-quants pack 256 elements ("super-block") in sub-blocks of 16 or 32, each with
//! its own small integer scale (and min), scaled again by f16 super-block factors. For
//! every type the sub-block of element e is simply e / 16 (Q2_K, Q3_K, Q6_K) or e / 32
//! (Q4_K, Q5_K); where the bits of element e sit:
//!
//! ```text
//! Q2_K  84 B  scales[16] | qs[64] | d:f16 dmin:f16
//!             e = 128h + 32s + l: q = (qs[32h+l] >> 2s) & 3 (0..3); sc = scales[e/16] & 15,
//!             m = scales[e/16] >> 4;  x = (d*sc) * q - dmin*m
//! Q3_K  110 B hmask[32] | qs[64] | scales[12] | d:f16
//!             e = 128h + 32s + l: q = ((qs[32h+l] >> 2s) & 3) - (bit 4h+s of hmask[l] ? 0 : 4);
//!             16 six-bit scales (see `q3_k_scales`), minus 32;  x = (d*sc) * q
//! Q4_K  144 B d:f16 dmin:f16 | scales[12] | qs[128]
//!             e = 64j + 32t + l: q = qs[32j+l] low (t = 0) or high (t = 1) nibble;
//!             8 six-bit scales and mins (see `scale_min_k4`);  x = (d*sc) * q - dmin*m
//! Q5_K  176 B d:f16 dmin:f16 | scales[12] | qh[32] | qs[128]
//!             as Q4_K plus bit e/32 of qh[e % 32] as the 5th bit (q = 0..31)
//! Q6_K  210 B ql[128] | qh[64] | scales[16] i8 | d:f16
//!             e = 128h + 32t + l: low 4 bits from ql[64h + 32(t&1) + l] (t < 2: low nibble,
//!             else high), high 2 bits = (qh[32h+l] >> 2t) & 3; q = that - 32;  x = (d*sc) * q
//! Q8_K  292 B d:f32 | qs[256] i8 | bsums[16] i16   (activations of the K-quant dots)
//!             x = d * qs[e]; bsums[j] = sum of qs[16j..16j+16]
//! ```
//!
//! GGUF aligns tensor data to 32 bytes in the file, and every weight block size here
//! except MXFP4's 17 is even, so rows of an mmapped tensor are 2-aligned and
//! [`as_blocks`] succeeds on them (MXFP4 blocks have alignment 1, Q8_K blocks 4); the
//! kernels themselves never rely on alignment (they read with unaligned loads).

use half::f16;

use crate::ggml_type::GgmlType;

/// Elements per block of the 32-element types (Q4_0 .. Q8_1, IQ4_NL, MXFP4).
pub const QK: usize = 32;

/// Elements per K-quant super-block (Q2_K .. Q8_K).
pub const QK_K: usize = crate::ggml_type::QK_K;

/// A ggml quant block: plain old data, any bit pattern valid, no padding.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain only integer, integer-array, `f32` and
/// `half::f16` fields, have no padding, and have `size_of::<Self>() == TYPE.type_size()`.
/// [`as_blocks`], [`read_block`] and [`write_block`] rely on all of that.
pub unsafe trait Block: Copy + 'static {
    /// The ggml type this block is one block of.
    const TYPE: GgmlType;
}

/// Q4_0: 32 signed 4-bit values (offset 8) and one f16 scale.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Element j in the low nibble of `qs[j]`, element j+16 in its high nibble.
    pub qs: [u8; 16],
}

/// Q4_1: 32 unsigned 4-bit values, a scale and a minimum.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum (added after scaling).
    pub m: f16,
    /// Nibbles, laid out as in [`BlockQ4_0`].
    pub qs: [u8; 16],
}

/// Q5_0: 32 signed 5-bit values (offset 16) and one f16 scale.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// The 5th bits: bit i of this little-endian u32 belongs to element i.
    pub qh: [u8; 4],
    /// The low 4 bits, laid out as in [`BlockQ4_0`].
    pub qs: [u8; 16],
}

/// Q5_1: 32 unsigned 5-bit values, a scale and a minimum.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: f16,
    /// Minimum (added after scaling).
    pub m: f16,
    /// The 5th bits, as in [`BlockQ5_0`].
    pub qh: [u8; 4],
    /// The low 4 bits, laid out as in [`BlockQ4_0`].
    pub qs: [u8; 16],
}

/// Q8_0: 32 signed bytes and one f16 scale.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Values, in element order.
    pub qs: [i8; 32],
}

/// Q8_1: as Q8_0 plus `s = d * sum(qs)`, the activation type of Q4_1 and Q5_1.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_1 {
    /// Scale.
    pub d: f16,
    /// `d * sum(qs)`, rounded to f16.
    pub s: f16,
    /// Values, in element order.
    pub qs: [i8; 32],
}

/// IQ4_NL: 32 4-bit indices into the non-linear table [`KVALUES_IQ4NL`], one f16 scale.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockIq4Nl {
    /// Scale.
    pub d: f16,
    /// Indices, laid out as the nibbles of [`BlockQ4_0`].
    pub qs: [u8; 16],
}

/// MXFP4: 32 E2M1 values (as 4-bit indices into [`KVALUES_MXFP4`]) and a shared E8M0
/// exponent.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockMxfp4 {
    /// E8M0 exponent; the scale of the (doubled) table values is `e8m0_to_f32_half(e)`.
    pub e: u8,
    /// Indices, laid out as the nibbles of [`BlockQ4_0`].
    pub qs: [u8; 16],
}

/// Q2_K: 256 2-bit values in 16 sub-blocks of 16, each with a 4-bit scale and min.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ2K {
    /// Sub-block j: scale in the low nibble of `scales[j]`, min in the high nibble.
    pub scales: [u8; 16],
    /// Four 2-bit values per byte (see the module doc for the order).
    pub qs: [u8; 64],
    /// Super-block factor of the scales.
    pub d: f16,
    /// Super-block factor of the mins.
    pub dmin: f16,
}

/// Q3_K: 256 3-bit signed values in 16 sub-blocks of 16 with 6-bit signed scales.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ3K {
    /// The 3rd bits: element e's is bit e / 32 of `hmask[e % 32]` (set: no -4).
    pub hmask: [u8; 32],
    /// The low 2 bits, four per byte.
    pub qs: [u8; 64],
    /// 16 six-bit scales, packed (see [`q3_k_scales`]).
    pub scales: [u8; 12],
    /// Super-block factor of the scales.
    pub d: f16,
}

/// Q4_K: 256 4-bit values in 8 sub-blocks of 32, each with a 6-bit scale and min.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4K {
    /// Super-block factor of the scales.
    pub d: f16,
    /// Super-block factor of the mins.
    pub dmin: f16,
    /// 8 six-bit scales and 8 six-bit mins, packed (see [`scale_min_k4`]).
    pub scales: [u8; 12],
    /// Nibbles: 64 elements per 32 bytes (low nibbles first).
    pub qs: [u8; 128],
}

/// Q5_K: Q4_K plus a 5th bit per element.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5K {
    /// Super-block factor of the scales.
    pub d: f16,
    /// Super-block factor of the mins.
    pub dmin: f16,
    /// As in [`BlockQ4K`].
    pub scales: [u8; 12],
    /// The 5th bits: element e's is bit e / 32 of `qh[e % 32]`.
    pub qh: [u8; 32],
    /// The low 4 bits, as in [`BlockQ4K`].
    pub qs: [u8; 128],
}

/// Q6_K: 256 6-bit signed values in 16 sub-blocks of 16 with 8-bit signed scales.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ6K {
    /// The low 4 bits (see the module doc for the order).
    pub ql: [u8; 128],
    /// The high 2 bits, four per byte.
    pub qh: [u8; 64],
    /// Sub-block scales.
    pub scales: [i8; 16],
    /// Super-block factor of the scales.
    pub d: f16,
}

/// Q8_K: 256 signed bytes, an f32 scale and the sums of each 16 (the activation type of
/// the K-quant dots).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    /// Scale (f32, unlike the other blocks).
    pub d: f32,
    /// Values, in element order.
    pub qs: [i8; 256],
    /// `bsums[j]` = sum of `qs[16j..16j+16]`.
    pub bsums: [i16; 16],
}

macro_rules! impl_block {
    ($t:ty, $ty:ident, $size:expr, align $align:expr) => {
        // SAFETY: repr(C), fields are f16/f32 and integer arrays only (the size checks
        // below prove there is no padding), and every bit pattern of those fields is valid.
        unsafe impl Block for $t {
            const TYPE: GgmlType = GgmlType::$ty;
        }
        const _: () = assert!(core::mem::size_of::<$t>() == $size);
        const _: () = assert!(core::mem::size_of::<$t>() == GgmlType::$ty.type_size());
        const _: () = assert!(core::mem::align_of::<$t>() == $align);
    };
    ($t:ty, $ty:ident, $size:expr) => {
        impl_block!($t, $ty, $size, align 2);
    };
}

impl_block!(BlockQ4_0, Q4_0, 18);
impl_block!(BlockQ4_1, Q4_1, 20);
impl_block!(BlockQ5_0, Q5_0, 22);
impl_block!(BlockQ5_1, Q5_1, 24);
impl_block!(BlockQ8_0, Q8_0, 34);
impl_block!(BlockQ8_1, Q8_1, 36);
impl_block!(BlockIq4Nl, IQ4_NL, 18);
impl_block!(BlockMxfp4, MXFP4, 17, align 1);
impl_block!(BlockQ2K, Q2_K, 84);
impl_block!(BlockQ3K, Q3_K, 110);
impl_block!(BlockQ4K, Q4_K, 144);
impl_block!(BlockQ5K, Q5_K, 176);
impl_block!(BlockQ6K, Q6_K, 210);
impl_block!(BlockQ8K, Q8_K, 292, align 4);

/// Views `bytes` as a slice of blocks, without copying. `None` if the length is not a
/// whole number of blocks or the start is not aligned for `B` (2 bytes for most blocks,
/// 1 for MXFP4, 4 for Q8_K).
pub fn as_blocks<B: Block>(bytes: &[u8]) -> Option<&[B]> {
    let size = core::mem::size_of::<B>();
    if bytes.is_empty() {
        return Some(&[]);
    }
    if bytes.len() % size != 0 || bytes.as_ptr().align_offset(core::mem::align_of::<B>()) != 0 {
        return None;
    }
    // SAFETY: the pointer is aligned for B (checked), the length covers exactly
    // len/size values of B (checked), B is plain old data valid for any bit pattern
    // (Block's contract), and the lifetime and immutability are inherited from `bytes`.
    Some(unsafe { core::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) })
}

/// Copies one block out of the first `size_of::<B>()` bytes of `bytes` (any alignment).
/// `None` if `bytes` is too short.
#[inline]
pub fn read_block<B: Block>(bytes: &[u8]) -> Option<B> {
    if bytes.len() < core::mem::size_of::<B>() {
        return None;
    }
    // SAFETY: at least size_of::<B>() readable bytes (checked); read_unaligned has no
    // alignment requirement; B is valid for any bit pattern (Block's contract).
    Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<B>()) })
}

/// Writes `block` into the first `size_of::<B>()` bytes of `out`; `false` if too short.
#[inline]
pub fn write_block<B: Block>(block: &B, out: &mut [u8]) -> bool {
    let size = core::mem::size_of::<B>();
    if out.len() < size {
        return false;
    }
    // SAFETY: B has no padding (Block's contract), so all size_of::<B>() bytes of
    // `block` are initialized; the slice borrows `block` for this statement only.
    let bytes = unsafe { core::slice::from_raw_parts((block as *const B).cast::<u8>(), size) };
    out[..size].copy_from_slice(bytes);
    true
}

/// The 32-bit `qh` field of a Q5 block.
#[inline]
pub fn qh_u32(qh: [u8; 4]) -> u32 {
    u32::from_le_bytes(qh)
}

/// f16 → f32, exact.
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// f32 → f16, round to nearest even (as F16C `vcvtps2ph` with imm 0 and ggml's
/// `GGML_FP32_TO_FP16`; only NaN payloads may differ).
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// bf16 → f32, exact.
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 → bf16 as ggml's `ggml_compute_fp32_to_bf16`: NaN is kept and made quiet,
/// everything else rounds to nearest even (subnormals are not flushed).
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// E8M0 → f32, halved (ggml's `GGML_E8M0_TO_FP32_HALF`): `2^(e - 128)`, exact
/// (subnormal for e < 2). MXFP4 scales its doubled table values with it.
#[inline]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { (e as u32 - 1) << 23 };
    f32::from_bits(bits)
}

/// IQ4_NL's 16 non-linear levels (ggml's `kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// MXFP4's 16 E2M1 values, doubled to integers (ggml's `kvalues_mxfp4`): index 8 is -0.
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Scale and min (6 bits each) of sub-block `j` (0..8) of a Q4_K/Q5_K block, from its
/// 12 packed bytes (ggml's `get_scale_min_k4`): sub-blocks 0..4 use the low 6 bits of
/// bytes j and j+4; sub-blocks 4..8 take their low 4 bits from byte j+4 and their top 2
/// bits from the spare top bits of bytes j-4 and j.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The 16 signed scales (-32..=31) of a Q3_K block from its 12 packed bytes: low 4 bits
/// of scale j in the low (j < 8) or high (j >= 8) nibble of byte j % 8, top 2 bits at
/// bit 2·(j / 4) of byte 8 + j % 4; stored offset by 32.
#[inline]
pub fn q3_k_scales(q: &[u8; 12]) -> [i8; 16] {
    let mut s = [0i8; 16];
    for (j, v) in s.iter_mut().enumerate() {
        let lo = if j < 8 { q[j] & 0xF } else { q[j - 8] >> 4 };
        let hi = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
        *v = (lo | (hi << 4)) as i8 - 32;
    }
    s
}

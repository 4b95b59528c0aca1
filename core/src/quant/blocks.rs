//! The byte layout of ggml's 32-element quant blocks, as `#[repr(C)]` structs.
//!
//! Owns: the block structs, the [`Block`] marker trait, the zero-copy checked cast
//! [`as_blocks`], alignment-free [`read_block`] / [`write_block`], and the scalar
//! f16/bf16 conversions every kernel agrees on. Knows nothing about arithmetic.
//!
//! Layouts (little-endian, all 32 elements per block; "element j" is position j in the
//! row segment the block covers):
//!
//! ```text
//! Q4_0  18 B  d:f16 | qs[16]            x[j] = ((qs[j] & 15) - 8) * d,  x[j+16] = ((qs[j] >> 4) - 8) * d
//! Q4_1  20 B  d:f16 m:f16 | qs[16]      x[j] = (qs[j] & 15) * d + m,    x[j+16] = (qs[j] >> 4) * d + m
//! Q5_0  22 B  d:f16 | qh[4] | qs[16]    5th bit of element i is bit i of the u32 qh; value - 16, times d
//! Q5_1  24 B  d:f16 m:f16 | qh[4] | qs[16]   as Q5_0 without the -16, plus m
//! Q8_0  34 B  d:f16 | qs[32] i8         x[j] = qs[j] * d
//! Q8_1  36 B  d:f16 s:f16 | qs[32] i8   as Q8_0; s = d * sum(qs) (used by the Q4_1/Q5_1 dots)
//! ```
//!
//! GGUF aligns tensor data to 32 bytes in the file, and every block size here is even,
//! so rows of an mmapped tensor are 2-aligned and [`as_blocks`] succeeds on them; the
//! kernels themselves never rely on alignment (they read with unaligned loads).

use half::f16;

use crate::ggml_type::GgmlType;

/// Elements per block of every type in this file.
pub const QK: usize = 32;

/// A ggml quant block: plain old data, any bit pattern valid, no padding.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain only integer, `[u8; N]`/`[i8; N]` and
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

macro_rules! impl_block {
    ($t:ty, $ty:ident, $size:expr) => {
        // SAFETY: repr(C), fields are f16 and byte arrays only (checked sizes below prove
        // there is no padding), and every bit pattern of those fields is valid.
        unsafe impl Block for $t {
            const TYPE: GgmlType = GgmlType::$ty;
        }
        const _: () = assert!(core::mem::size_of::<$t>() == $size);
        const _: () = assert!(core::mem::align_of::<$t>() == 2);
    };
}

impl_block!(BlockQ4_0, Q4_0, 18);
impl_block!(BlockQ4_1, Q4_1, 20);
impl_block!(BlockQ5_0, Q5_0, 22);
impl_block!(BlockQ5_1, Q5_1, 24);
impl_block!(BlockQ8_0, Q8_0, 34);
impl_block!(BlockQ8_1, Q8_1, 36);

/// Views `bytes` as a slice of blocks, without copying. `None` if the length is not a
/// whole number of blocks or the start is not aligned for `B` (2 bytes for all blocks).
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

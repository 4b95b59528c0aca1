//! NEON kernels for aarch64 (with the dot-product instruction `sdot` where the host
//! reports it): the decode hot path on the boards.
//!
//! Owns the NEON `vec_dot`s (32-element types in `qdot.rs`, K-quants in `kdot.rs`), the
//! NEON Q8_0/Q8_1 activation quantizer and the attention f16 operations (`f16ops.rs`,
//! the reference's bits). Every public-in-crate `vec_dot_*` here is a
//! safe wrapper with the [`super::DotFn`] shape; the `*_sdot` variants run `sdot` and may
//! only be handed out when the host reported `Isa::neon_dotprod` ([`table`], the only
//! way out of this module, does that: the reference's kernel table with what this module
//! has in its place, with or without the `sdot` variants). NEON itself is part of every aarch64 target this module is compiled for
//! (`target_feature = "neon"`).
//!
//! Arithmetic: every kernel gives the scalar reference's bits (tested, `tests*.rs`). The
//! integer part of each block is computed in SIMD — exact, so its order is free: `sdot`
//! (4 lanes, each the sum of 4 consecutive i8·i8 products) or, without it, the same lanes
//! from `vmull_s8` + `vpaddlq_s16` + `vpaddq_s32` ([`Lanes`]) — and the float part then
//! repeats the reference's operations in the reference's order:
//! - Q4_0, IQ4_NL, MXFP4, Q2_K, Q4_K (llama.cpp's repacked order): one scalar fma chain
//!   (two for Q2_K/Q4_K) per row, fed by the block's exact integer sum(s);
//! - Q4_1, Q5_0, Q5_1, Q8_0, Q3_K, Q5_K, Q6_K: llama.cpp's x86 8-lane accumulators, two
//!   NEON `float32x4_t` here (`vfmaq_f32` is the same fused operation as `fmaf`), then
//!   [`hsum8`] in the reference's order;
//! - F32, F16, BF16: *not* the reference's order (its single serial chain cannot be
//!   vectorized); they follow the AVX2 kernels' order instead (4×8 fma accumulators,
//!   then 8 at a time, the AVX `hsum`, then a serial tail), so NEON and AVX2 give the
//!   same bits, and the tests bound the difference to the reference (1e-5·L1).
//!
//! If the reference's order for a type changes, the float tail of that kernel here must
//! change with it (the bit-equality tests will say so).
#![allow(unused_unsafe)]

use core::arch::aarch64::*;

pub(crate) mod f16ops;
mod kdot;
mod qdot;

use super::blocks::bf16_to_f32;
use super::{vec_dots, Isa, KernelTable, REFERENCE};

/// How a kernel forms the 4 lane sums of 16 i8·i8 products (lane `l` = Σ over
/// `4l..4l+4`, exact in i32), added to `acc`.
pub(super) trait Lanes {
    /// `acc[l] + Σ_{e<4} a[4l+e]·b[4l+e]`.
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

/// The `sdot` instruction (ARMv8.2 dot product), through stable inline asm.
pub(super) struct Sdot;

/// Plain NEON: widening multiplies and pairwise adds.
pub(super) struct Widen;

impl Lanes for Sdot {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let mut acc = acc;
        // SAFETY: register-only instruction; only reached from `#[target_feature(enable
        // = "dotprod")]` functions, which are only handed out when the host reported it.
        unsafe {
            core::arch::asm!(
                "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
                acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        acc
    }
}

impl Lanes for Widen {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: value-only NEON intrinsics (NEON is enabled for this module's targets).
        unsafe {
            let lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
            let hi = vpaddlq_s16(vmull_high_s8(a, b));
            vaddq_s32(acc, vpaddq_s32(lo, hi))
        }
    }
}

/// Whole blocks to process: the caller contract says `n / bs`; clamp to what the
/// slices hold so a broken contract cannot read out of bounds in release builds.
#[inline]
fn fit(n: usize, bs: usize, w: &[u8], wsize: usize, a: &[u8], asize: usize) -> usize {
    debug_assert!(n % bs == 0, "vec_dot: n = {n} is not a multiple of the block size {bs}");
    debug_assert!(w.len() >= n / bs * wsize && a.len() >= n / bs * asize, "vec_dot: row too short");
    (n / bs).min(w.len() / wsize).min(a.len() / asize)
}

/// A pair of wrappers around the generic body `$body::<L>`: `$name` (plain NEON) and
/// `$sdot` (`sdot`; hand out only when the host reported the dot-product extension).
macro_rules! dot_pair {
    ($(#[$doc:meta])* $name:ident, $sdot:ident, $m:ident :: $f:ident, $bs:expr, $wsize:expr, $asize:expr) => {
        $(#[$doc])*
        pub(crate) fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = fit(n, $bs, w, $wsize, a, $asize);
            // SAFETY: `nb` units of $wsize / $asize bytes lie inside `w` / `a` (fit clamps
            // to them); plain NEON is always present on this target.
            unsafe { $m::$f::<Widen>(nb, w.as_ptr(), a.as_ptr()) }
        }
        $(#[$doc])*
        /// (`sdot` variant.)
        pub(crate) fn $sdot(n: usize, w: &[u8], a: &[u8]) -> f32 {
            #[target_feature(enable = "dotprod")]
            unsafe fn inner(nb: usize, w: *const u8, a: *const u8) -> f32 {
                // SAFETY: forwarded from the wrapper below.
                unsafe { $m::$f::<Sdot>(nb, w, a) }
            }
            let nb = fit(n, $bs, w, $wsize, a, $asize);
            // SAFETY: bounds as above; only handed out when the host reported dotprod
            // (module contract).
            unsafe { inner(nb, w.as_ptr(), a.as_ptr()) }
        }
    };
}

dot_pair!(/// NEON Q4_0 · Q8_0.
    vec_dot_q4_0_q8_0, vec_dot_q4_0_q8_0_sdot, qdot::q4_0_q8_0, 32, 18, 34);
dot_pair!(/// NEON Q4_1 · Q8_1.
    vec_dot_q4_1_q8_1, vec_dot_q4_1_q8_1_sdot, qdot::q4_1_q8_1, 32, 20, 36);
dot_pair!(/// NEON Q5_0 · Q8_0.
    vec_dot_q5_0_q8_0, vec_dot_q5_0_q8_0_sdot, qdot::q5_0_q8_0, 32, 22, 34);
dot_pair!(/// NEON Q5_1 · Q8_1.
    vec_dot_q5_1_q8_1, vec_dot_q5_1_q8_1_sdot, qdot::q5_1_q8_1, 32, 24, 36);
dot_pair!(/// NEON Q8_0 · Q8_0.
    vec_dot_q8_0_q8_0, vec_dot_q8_0_q8_0_sdot, qdot::q8_0_q8_0, 32, 34, 34);
dot_pair!(/// NEON IQ4_NL · Q8_0.
    vec_dot_iq4_nl_q8_0, vec_dot_iq4_nl_q8_0_sdot, qdot::iq4_nl_q8_0, 32, 18, 34);
dot_pair!(/// NEON MXFP4 · Q8_0.
    vec_dot_mxfp4_q8_0, vec_dot_mxfp4_q8_0_sdot, qdot::mxfp4_q8_0, 32, 17, 34);
dot_pair!(/// NEON Q2_K · Q8_K.
    vec_dot_q2_k_q8_k, vec_dot_q2_k_q8_k_sdot, kdot::q2_k_q8_k, 256, 84, 292);
dot_pair!(/// NEON Q3_K · Q8_K.
    vec_dot_q3_k_q8_k, vec_dot_q3_k_q8_k_sdot, kdot::q3_k_q8_k, 256, 110, 292);
dot_pair!(/// NEON Q4_K · Q8_K.
    vec_dot_q4_k_q8_k, vec_dot_q4_k_q8_k_sdot, kdot::q4_k_q8_k, 256, 144, 292);
dot_pair!(/// NEON Q5_K · Q8_K.
    vec_dot_q5_k_q8_k, vec_dot_q5_k_q8_k_sdot, kdot::q5_k_q8_k, 256, 176, 292);
dot_pair!(/// NEON Q6_K · Q8_K.
    vec_dot_q6_k_q8_k, vec_dot_q6_k_q8_k_sdot, kdot::q6_k_q8_k, 256, 210, 292);

/// Kernels without i8 products: one plain NEON wrapper each.
macro_rules! dot_one {
    ($(#[$doc:meta])* $name:ident, $body:path, $wsize:expr) => {
        $(#[$doc])*
        pub(crate) fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = fit(n, 1, w, $wsize, a, $wsize);
            // SAFETY: `nb` elements of $wsize bytes lie inside `w` and `a` (fit clamps).
            unsafe { $body(nb, w.as_ptr(), a.as_ptr()) }
        }
    };
}

dot_one!(/// NEON F32 · F32 (AVX2 order; see the module doc).
    vec_dot_f32, f32_f32, 4);
dot_one!(/// NEON F16 · F16 (AVX2 order).
    vec_dot_f16, f16_f16, 2);
dot_one!(/// NEON BF16 · BF16 (AVX2 order).
    vec_dot_bf16, bf16_bf16, 2);

// ---------------------------------------------------------------- kernel table

/// The NEON kernel table if `isa` reports NEON (with the `sdot` variants if it reports
/// the dot-product extension): NEON is part of the target (this module is compiled only
/// with it); `sdot` is trusted from the host's report (no_std cannot ask the OS).
pub(crate) fn table(isa: Isa) -> Option<&'static KernelTable> {
    match (isa.neon, isa.neon_dotprod) {
        (false, _) => None,
        (true, false) => Some(&NEON),
        (true, true) => Some(&NEON_DOTPROD),
    }
}

static NEON: KernelTable = build(false);
static NEON_DOTPROD: KernelTable = build(true);

/// The reference's table with this module's kernels in its place (`sdot`: the dots'
/// `sdot` variants).
const fn build(sdot: bool) -> KernelTable {
    let mut t = REFERENCE;
    t.name = if sdot { "neon-dotprod" } else { "neon" };
    t.dot = vec_dots!();
    if sdot {
        t.dot.q4_0 = Some(vec_dot_q4_0_q8_0_sdot);
        t.dot.q4_1 = Some(vec_dot_q4_1_q8_1_sdot);
        t.dot.q5_0 = Some(vec_dot_q5_0_q8_0_sdot);
        t.dot.q5_1 = Some(vec_dot_q5_1_q8_1_sdot);
        t.dot.q8_0 = Some(vec_dot_q8_0_q8_0_sdot);
        t.dot.iq4_nl = Some(vec_dot_iq4_nl_q8_0_sdot);
        t.dot.mxfp4 = Some(vec_dot_mxfp4_q8_0_sdot);
        t.dot.q2_k = Some(vec_dot_q2_k_q8_k_sdot);
        t.dot.q3_k = Some(vec_dot_q3_k_q8_k_sdot);
        t.dot.q4_k = Some(vec_dot_q4_k_q8_k_sdot);
        t.dot.q5_k = Some(vec_dot_q5_k_q8_k_sdot);
        t.dot.q6_k = Some(vec_dot_q6_k_q8_k_sdot);
    }
    t.quantize.q8_0 = Some(quantize_q8::<false>);
    t.quantize.q8_1 = Some(quantize_q8::<true>);
    t.f16_dot = f16ops::dot;
    t.f16_mad = f16ops::mad;
    t.f16_scale = f16ops::scale;
    t.f32_to_f16 = f16ops::to_f16;
    t.f16_to_f32 = f16ops::to_f32;
    t
}

// ---------------------------------------------------------------- helpers

/// `a·b + c`, fused (the same operation as `libm::fmaf`, in one instruction).
#[inline(always)]
pub(super) fn fmaf(a: f32, b: f32, c: f32) -> f32 {
    // SAFETY: value-only NEON intrinsics.
    unsafe { vget_lane_f32::<0>(vfma_f32(vdup_n_f32(c), vdup_n_f32(a), vdup_n_f32(b))) }
}

/// The reference's `hsum8` of the 8 lanes `lo` (0..4) and `hi` (4..8):
/// `((a4+a0) + (a6+a2)) + ((a5+a1) + (a7+a3))`.
#[inline(always)]
pub(super) unsafe fn hsum8(lo: float32x4_t, hi: float32x4_t) -> f32 {
    // SAFETY: value-only NEON intrinsics.
    unsafe {
        let r = vaddq_f32(hi, lo); // [a4+a0, a5+a1, a6+a2, a7+a3]
        let s = vadd_f32(vget_low_f32(r), vget_high_f32(r)); // [r0+r2, r1+r3]
        vget_lane_f32::<0>(s) + vget_lane_f32::<1>(s)
    }
}

/// `acc = fma(f32(lanes), d, acc)` on 4 lanes (the reference's `fmaf(d, s, acc)`).
#[inline(always)]
pub(super) unsafe fn fma_lanes(acc: float32x4_t, lanes: int32x4_t, d: f32) -> float32x4_t {
    // SAFETY: value-only NEON intrinsics.
    unsafe { vfmaq_n_f32(acc, vcvtq_f32_s32(lanes), d) }
}

/// The f16 at p as f32 (exact; `fcvtl`, as [`ld_f16x4`], instead of a software
/// conversion).
#[inline(always)]
pub(super) unsafe fn rd_f16(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees 2 readable bytes at p; then register-only code.
    unsafe {
        let h = vdup_n_u16(core::ptr::read_unaligned(p.cast::<u16>()));
        let out: float32x4_t;
        core::arch::asm!("fcvtl {o:v}.4s, {h:v}.4h", o = lateout(vreg) out, h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags));
        vgetq_lane_f32::<0>(out)
    }
}

#[inline(always)]
pub(super) unsafe fn rd_f32(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees 4 readable bytes at p.
    unsafe { core::ptr::read_unaligned(p.cast::<f32>()) }
}

#[inline(always)]
pub(super) unsafe fn ld_s8(p: *const u8) -> int8x16_t {
    // SAFETY: the caller guarantees 16 readable bytes at p (NEON loads are unaligned).
    unsafe { vld1q_s8(p.cast()) }
}

#[inline(always)]
pub(super) unsafe fn ld_u8(p: *const u8) -> uint8x16_t {
    // SAFETY: the caller guarantees 16 readable bytes at p.
    unsafe { vld1q_u8(p) }
}

// ---------------------------------------------------------------- float dots

/// 4 f32 from element i of an f16 row (`fcvtl`, exact; the f16 vector types are not
/// stable Rust yet, hence the asm).
#[inline(always)]
unsafe fn ld_f16x4(p: *const u8, i: usize) -> float32x4_t {
    // SAFETY: the caller guarantees 8 readable bytes at p + 2i.
    unsafe {
        let h = vld1_u16(p.add(2 * i).cast());
        let out: float32x4_t;
        // SAFETY: register-only base ARMv8 instruction (half → single, exact).
        core::arch::asm!("fcvtl {o:v}.4s, {h:v}.4h", o = lateout(vreg) out, h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags));
        out
    }
}

#[inline(always)]
unsafe fn ld_bf16x4(p: *const u8, i: usize) -> float32x4_t {
    // SAFETY: the caller guarantees 8 readable bytes at p + 2i.
    unsafe { vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p.add(2 * i).cast()))) }
}

/// Shared loop of the float dots in the AVX2 kernels' order: an AVX "8-lane" vector is
/// two NEON vectors (lo, hi); 32 elements per iteration in 4 such accumulators, then 8 at
/// a time into the first, the AVX hsum of `(acc0+acc1)+(acc2+acc3)`, a serial tail.
macro_rules! float_dot {
    ($n:expr, $w:expr, $a:expr, $load:ident, $scalar:expr) => {{
        let (n, w, a) = ($n, $w, $a);
        let z = vdupq_n_f32(0.0);
        let mut acc = [[z; 2]; 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, acc) in acc.iter_mut().enumerate() {
                for h in 0..2 {
                    let j = i + 8 * k + 4 * h;
                    acc[h] = vfmaq_f32(acc[h], $load(w, j), $load(a, j));
                }
            }
            i += 32;
        }
        while i + 8 <= n {
            for h in 0..2 {
                acc[0][h] = vfmaq_f32(acc[0][h], $load(w, i + 4 * h), $load(a, i + 4 * h));
            }
            i += 8;
        }
        let s = |h: usize| vaddq_f32(vaddq_f32(acc[0][h], acc[1][h]), vaddq_f32(acc[2][h], acc[3][h]));
        let mut sum = hsum8(s(0), s(1));
        while i < n {
            sum += $scalar(w, i) * $scalar(a, i);
            i += 1;
        }
        sum
    }};
}

#[inline(always)]
unsafe fn ld_f32x4(p: *const u8, i: usize) -> float32x4_t {
    // SAFETY: the caller guarantees 16 readable bytes at p + 4i.
    unsafe { vld1q_f32(p.add(4 * i).cast()) }
}

unsafe fn f32_f32(n: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: n f32 (4n bytes) readable at w and a; unaligned loads only.
    unsafe { float_dot!(n, w, a, ld_f32x4, |p: *const u8, i: usize| rd_f32(p.add(4 * i))) }
}

unsafe fn f16_f16(n: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: n f16 (2n bytes) readable at w and a; unaligned loads only.
    unsafe { float_dot!(n, w, a, ld_f16x4, |p: *const u8, i: usize| rd_f16(p.add(2 * i))) }
}

unsafe fn bf16_bf16(n: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: n bf16 (2n bytes) readable at w and a; unaligned loads only.
    unsafe {
        float_dot!(n, w, a, ld_bf16x4, |p: *const u8, i: usize| bf16_to_f32(core::ptr::read_unaligned(p.add(2 * i).cast::<u16>())))
    }
}

// ---------------------------------------------------------------- activations

/// f32 activations → Q8_0 (`WITH_SUM = false`, 34-byte blocks) or Q8_1 (36-byte
/// blocks); whole blocks only. Same bytes as `quantize::quantize_act_q8_*`:
/// `id = 127/amax`, `q = round_half_even(x·id)`, `d = f16(amax/127)`, `s = f16(d·Σq)`.
pub(crate) fn quantize_q8<const WITH_SUM: bool>(x: &[f32], out: &mut [u8]) {
    let with_sum = WITH_SUM;
    let size = if with_sum { 36 } else { 34 };
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(size)) {
        // SAFETY: xb holds 32 f32, ob `size` bytes; unaligned loads and stores only.
        unsafe {
            let p = xb.as_ptr();
            let v = [vld1q_f32(p), vld1q_f32(p.add(4)), vld1q_f32(p.add(8)), vld1q_f32(p.add(12)),
                vld1q_f32(p.add(16)), vld1q_f32(p.add(20)), vld1q_f32(p.add(24)), vld1q_f32(p.add(28))];
            let mut m = vabsq_f32(v[0]);
            for vi in &v[1..] {
                m = vmaxq_f32(m, vabsq_f32(*vi));
            }
            let amax = vmaxvq_f32(m);
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let mut q = [vdupq_n_s32(0); 8];
            for (qi, vi) in q.iter_mut().zip(&v) {
                *qi = vcvtnq_s32_f32(vmulq_n_f32(*vi, id)); // round half to even
            }
            let h = |a: usize| vcombine_s16(vqmovn_s32(q[a]), vqmovn_s32(q[a + 1]));
            let (h0, h1, h2, h3) = (h(0), h(2), h(4), h(6));
            let b0 = vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1));
            let b1 = vcombine_s8(vqmovn_s16(h2), vqmovn_s16(h3));
            let op = ob.as_mut_ptr();
            core::ptr::write_unaligned(op.cast::<[u8; 2]>(), super::blocks::f32_to_f16(d).to_le_bytes());
            if with_sum {
                let sum = vaddvq_s32(vaddq_s32(vaddq_s32(vaddq_s32(q[0], q[1]), vaddq_s32(q[2], q[3])), vaddq_s32(vaddq_s32(q[4], q[5]), vaddq_s32(q[6], q[7]))));
                core::ptr::write_unaligned(op.add(2).cast::<[u8; 2]>(), super::blocks::f32_to_f16(d * sum as f32).to_le_bytes());
            }
            vst1q_s8(op.add(size - 32).cast(), b0);
            vst1q_s8(op.add(size - 16).cast(), b1);
        }
    }
}

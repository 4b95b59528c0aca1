//! HVX integer kernels over Tiles32 weights (layout: `keel_npu_hal::tile`).
//! One call handles one K-block for a run of 32-row groups: it holds the
//! block's 8 activation words in scalar registers and streams the groups'
//! tiles through `vrmpy(Vu.ub, Rt.b)` (int8×int8 → int32, one lane per row).
//!
//! Weights are unsigned where `vrmpy` sees them (Q8_0 biased by +128 in the
//! tiles, Q4_0 codes 0..15, IQ4_NL table values looked up +128), so the sums
//! returned are *raw*: `Σ u·a` with `u = w + bias`; the caller subtracts
//! `bias · Σa` ([`Q8_0_BIAS`], [`Q4_0_BIAS`], [`IQ4_NL_BIAS`]) in its scalar
//! scale pass.
//!
//! The Q8_0 loop is hand-scheduled (inline asm): 8 packets per 1024-byte
//! tile, each `{ vector load .cur; vrmpy }`, the store riding in the last one,
//! which is the bound of one vector load per packet. Q4_0 (`hvx/q4_0.rs`) is
//! hand-pipelined too: 6 packets per 512-byte tile, its floor. IQ4_NL
//! (`hvx/iq4_nl.rs`) turns code bytes into table values with `vlut32` (one per
//! packet, its bound): 8 packets per tile, hand-pipelined the same way.
//!
//! Feature `broken-hvx-zeros` makes every result zero, as a fused-off unit
//! would, so that the open-time self-test can be seen to refuse such a build.

use core::arch::hexagon::v128::{HvxVector, Q6_V_vsplat_R};

mod iq4_nl;
mod q4_0;
pub use iq4_nl::{iq4_nl_block_sums, IQ4_NL_BIAS, KVALUES_IQ4NL};
pub use q4_0::q4_0_block_sums;

/// Bytes of one Q8_0 tile (8 vectors).
pub const Q8_0_TILE: usize = 1024;
/// Bytes of one Q4_0 tile (4 vectors).
pub const Q4_0_TILE: usize = 512;
/// Offset of the Q8_0 tile codes (`u = q + 128`).
pub const Q8_0_BIAS: i32 = 128;
/// Offset of the Q4_0 codes (`x = d·(u − 8)`).
pub const Q4_0_BIAS: i32 = 8;

use core::arch::asm;

#[inline(always)]
pub(crate) unsafe fn broken_zeros(out: *mut HvxVector, n_groups: usize) {
    if cfg!(feature = "broken-hvx-zeros") {
        for g in 0..n_groups {
            *out.add(g) = Q6_V_vsplat_R(0);
        }
    }
}

/// Raw block sums of `n_groups` Q8_0 tiles for one activation block.
///
/// # Safety
/// `tiles` points to `n_groups · 1024` readable bytes and `out` to `n_groups · 128`
/// writable bytes, both 128-byte aligned; HVX (128-byte mode) is enabled.
#[inline(never)]
pub unsafe fn q8_0_block_sums(tiles: *const HvxVector, n_groups: usize, a: &[u32; 8], out: *mut HvxVector) {
    if n_groups == 0 {
        return;
    }
    let [a0, a1, a2, a3, a4, a5, a6, a7] = *a;
    // SAFETY: reads n_groups·8 vectors from `tiles` and writes n_groups vectors
    // to `out` (the caller guarantees both, aligned); clobbers only v0/v1 and
    // hardware loop 0 (LC0/SA0), which no caller keeps live across this
    // non-inlined call. One packet per 128 weight bytes: a .cur load feeding
    // its vrmpy; the result is stored (.new) in the last packet of the tile.
    asm!(
        "loop0(2f, {n})",
        ".falign",
        "2:",
        "{{ v0.cur = vmem({t}++#1); v1.w = vrmpy(v0.ub, {a0}.b) }}",
        "{{ v0.cur = vmem({t}++#1); v1.w += vrmpy(v0.ub, {a1}.b) }}",
        "{{ v0.cur = vmem({t}++#1); v1.w += vrmpy(v0.ub, {a2}.b) }}",
        "{{ v0.cur = vmem({t}++#1); v1.w += vrmpy(v0.ub, {a3}.b) }}",
        "{{ v0.cur = vmem({t}++#1); v1.w += vrmpy(v0.ub, {a4}.b) }}",
        "{{ v0.cur = vmem({t}++#1); v1.w += vrmpy(v0.ub, {a5}.b) }}",
        "{{ v0.cur = vmem({t}++#1); v1.w += vrmpy(v0.ub, {a6}.b) }}",
        "{{ v0.cur = vmem({t}++#1); v1.w += vrmpy(v0.ub, {a7}.b); vmem({o}++#1) = v1.new }}:endloop0",
        n = in(reg) n_groups,
        t = inout(reg) tiles => _,
        o = inout(reg) out => _,
        a0 = in(reg) a0, a1 = in(reg) a1, a2 = in(reg) a2, a3 = in(reg) a3,
        a4 = in(reg) a4, a5 = in(reg) a5, a6 = in(reg) a6, a7 = in(reg) a7,
        out("v0") _, out("v1") _,
        options(nostack),
    );
    broken_zeros(out, n_groups);
}

/// Raw *lane* sums of `n_groups` Q8_0 tiles for one activation block: for group `g`
/// and lane `l` (inputs `4l..4l+4` of the block), vector `8g + l` of `out` holds one
/// int32 per row, `Σ u·a` over those 4 inputs (`u = q + 128`). These are the 8 lanes
/// llama.cpp's x86 Q8_0 dot (and keel's CPU) accumulate separately before their
/// horizontal sum; [`crate::matvec`] applies the scales in that order.
///
/// Same packets as [`q8_0_block_sums`] (one vector load and one `vrmpy` per packet,
/// 1.0 packet per 128 weight bytes), each packet also storing its result.
///
/// # Safety
/// `tiles` points to `n_groups · 1024` readable bytes and `out` to `n_groups · 1024`
/// writable bytes, both 128-byte aligned; HVX (128-byte mode) is enabled.
#[inline(never)]
pub unsafe fn q8_0_lane_sums(tiles: *const HvxVector, n_groups: usize, a: &[u32; 8], out: *mut HvxVector) {
    if n_groups == 0 {
        return;
    }
    let [a0, a1, a2, a3, a4, a5, a6, a7] = *a;
    // SAFETY: reads n_groups·8 vectors from `tiles` and writes n_groups·8 vectors
    // to `out` (the caller guarantees both, aligned); clobbers only v0/v1 and
    // hardware loop 0 (LC0/SA0), which no caller keeps live across this
    // non-inlined call. Each packet: a .cur load feeding its vrmpy, whose result
    // is stored (.new) in the same packet.
    asm!(
        "loop0(2f, {n})",
        ".falign",
        "2:",
        "{{ v0.cur = vmem({t}++#1); v1.w = vrmpy(v0.ub, {a0}.b); vmem({o}++#1) = v1.new }}",
        "{{ v0.cur = vmem({t}++#1); v1.w = vrmpy(v0.ub, {a1}.b); vmem({o}++#1) = v1.new }}",
        "{{ v0.cur = vmem({t}++#1); v1.w = vrmpy(v0.ub, {a2}.b); vmem({o}++#1) = v1.new }}",
        "{{ v0.cur = vmem({t}++#1); v1.w = vrmpy(v0.ub, {a3}.b); vmem({o}++#1) = v1.new }}",
        "{{ v0.cur = vmem({t}++#1); v1.w = vrmpy(v0.ub, {a4}.b); vmem({o}++#1) = v1.new }}",
        "{{ v0.cur = vmem({t}++#1); v1.w = vrmpy(v0.ub, {a5}.b); vmem({o}++#1) = v1.new }}",
        "{{ v0.cur = vmem({t}++#1); v1.w = vrmpy(v0.ub, {a6}.b); vmem({o}++#1) = v1.new }}",
        "{{ v0.cur = vmem({t}++#1); v1.w = vrmpy(v0.ub, {a7}.b); vmem({o}++#1) = v1.new }}:endloop0",
        n = in(reg) n_groups,
        t = inout(reg) tiles => _,
        o = inout(reg) out => _,
        a0 = in(reg) a0, a1 = in(reg) a1, a2 = in(reg) a2, a3 = in(reg) a3,
        a4 = in(reg) a4, a5 = in(reg) a5, a6 = in(reg) a6, a7 = in(reg) a7,
        out("v0") _, out("v1") _,
        options(nostack),
    );
    broken_zeros(out, n_groups * 8);
}

//! HVX integer kernels over Tiles32 weights (layout: `keel_npu_hal::tile`).
//! One call handles one K-block for a run of 32-row groups: it holds the
//! block's 8 activation words in scalar registers and streams the groups'
//! tiles, `vrmpy(Vu.ub, Rt.b)` int8×int8 → int32, one int32 lane per row.
//! Weights are unsigned in the tile (Q8_0 biased by +128, 4-bit codes 0..15),
//! so each block sum is corrected by `-bias · Σa` (the accumulator starts there).
//!
//! Feature `broken-hvx-zeros` makes every product zero, as a fused-off unit
//! would, so that the open-time self-test can be seen to refuse it.

use core::arch::hexagon::v128::{
    HvxVector, Q6_V_vand_VV, Q6_V_vsplat_R, Q6_Vw_vadd_VwVw, Q6_Vw_vasr_VwR, Q6_Vw_vrmpyacc_VwVubRb,
};

/// Bytes of one Q8_0 tile (8 vectors).
pub const Q8_0_TILE: usize = 1024;
/// Bytes of one Q4_0 tile (4 vectors).
pub const Q4_0_TILE: usize = 512;

#[inline(always)]
fn finish(acc: HvxVector) -> HvxVector {
    if cfg!(feature = "broken-hvx-zeros") {
        // SAFETY: HVX is enabled for the whole build (see .cargo/config.toml).
        unsafe { Q6_V_vsplat_R(0) }
    } else {
        acc
    }
}

/// Block sums of `n_groups` Q8_0 tiles for one activation block.
///
/// # Safety
/// `tiles` points to `n_groups · 1024` readable bytes and `out` to `n_groups · 128`
/// writable bytes, both 128-byte aligned; HVX (128-byte mode) is enabled.
#[inline(never)]
pub unsafe fn q8_0_block_sums(tiles: *const HvxVector, n_groups: usize, a: &[u32; 8], asum: i32, out: *mut HvxVector) {
    let corr = Q6_V_vsplat_R(asum.wrapping_mul(-128));
    let [a0, a1, a2, a3, a4, a5, a6, a7] = a.map(|w| w as i32);
    for g in 0..n_groups {
        let t = tiles.add(8 * g);
        let mut acc = Q6_Vw_vrmpyacc_VwVubRb(corr, *t, a0);
        acc = Q6_Vw_vrmpyacc_VwVubRb(acc, *t.add(1), a1);
        acc = Q6_Vw_vrmpyacc_VwVubRb(acc, *t.add(2), a2);
        acc = Q6_Vw_vrmpyacc_VwVubRb(acc, *t.add(3), a3);
        acc = Q6_Vw_vrmpyacc_VwVubRb(acc, *t.add(4), a4);
        acc = Q6_Vw_vrmpyacc_VwVubRb(acc, *t.add(5), a5);
        acc = Q6_Vw_vrmpyacc_VwVubRb(acc, *t.add(6), a6);
        acc = Q6_Vw_vrmpyacc_VwVubRb(acc, *t.add(7), a7);
        *out.add(g) = finish(acc);
    }
}

/// Block sums of `n_groups` Q4_0 tiles for one activation block.
///
/// Low nibbles are masked to 0..15; high nibbles are masked in place (16·q) into
/// a second accumulator that is shifted down by 4 at the end (exact: it is a
/// multiple of 16), which saves a shift per vector.
///
/// # Safety
/// As [`q8_0_block_sums`], with `n_groups · 512` bytes of tiles.
#[inline(never)]
pub unsafe fn q4_0_block_sums(tiles: *const HvxVector, n_groups: usize, a: &[u32; 8], asum: i32, out: *mut HvxVector) {
    let corr = Q6_V_vsplat_R(asum.wrapping_mul(-8));
    let lo_mask = Q6_V_vsplat_R(0x0f0f_0f0f);
    let hi_mask = Q6_V_vsplat_R(0xf0f0_f0f0_u32 as i32);
    let zero = Q6_V_vsplat_R(0);
    let [a0, a1, a2, a3, a4, a5, a6, a7] = a.map(|w| w as i32);
    for g in 0..n_groups {
        let t = tiles.add(4 * g);
        let (n0, n1, n2, n3) = (*t, *t.add(1), *t.add(2), *t.add(3));
        let mut lo = Q6_Vw_vrmpyacc_VwVubRb(corr, Q6_V_vand_VV(n0, lo_mask), a0);
        let mut hi = Q6_Vw_vrmpyacc_VwVubRb(zero, Q6_V_vand_VV(n0, hi_mask), a4);
        lo = Q6_Vw_vrmpyacc_VwVubRb(lo, Q6_V_vand_VV(n1, lo_mask), a1);
        hi = Q6_Vw_vrmpyacc_VwVubRb(hi, Q6_V_vand_VV(n1, hi_mask), a5);
        lo = Q6_Vw_vrmpyacc_VwVubRb(lo, Q6_V_vand_VV(n2, lo_mask), a2);
        hi = Q6_Vw_vrmpyacc_VwVubRb(hi, Q6_V_vand_VV(n2, hi_mask), a6);
        lo = Q6_Vw_vrmpyacc_VwVubRb(lo, Q6_V_vand_VV(n3, lo_mask), a3);
        hi = Q6_Vw_vrmpyacc_VwVubRb(hi, Q6_V_vand_VV(n3, hi_mask), a7);
        *out.add(g) = finish(Q6_Vw_vadd_VwVw(lo, Q6_Vw_vasr_VwR(hi, 4)));
    }
}

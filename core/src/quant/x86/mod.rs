//! AVX2 + FMA (+ F16C) kernels for x86_64: the decode hot path.
//!
//! Owns the SIMD `vec_dot`s (32-element types in `qdot.rs`, K-quants in `kdot.rs`) and
//! the SIMD activation quantizers (Q8_K activations use the scalar reference on every
//! kernel set). Every public-in-crate
//! function here is a safe wrapper with the [`super::DotFn`] shape around an
//! `unsafe #[target_feature]` body; the wrappers may only be handed out after
//! [`cpu_has_avx2_fma`] returned true. They are handed out through this module's
//! kernel tables only ([`table`], which checks that; tests check it too): the
//! reference's table with what this module has in its place, one per set of flags.
//!
//! Arithmetic of the 32-element types (the K-quants: see `kdot.rs`), per weight/activation
//! block pair:
//! - integer part exact: `maddubs` (u8 × i8 → i16 pairs, never saturating for these
//!   ranges) then `madd` with ones → 8 i32 lane sums; signed weights are handled either
//!   by an offset (`q - 8`, `q - 16`: subtract `maddubs(offset, y)`) or by the sign trick
//!   (`|x|`, `y·sign(x)`; needs activations in -127..=127, which every keel activation
//!   quantizer guarantees);
//! - float part, in llama.cpp's order (see `qdot.rs`): either `acc = fma(dw·da,
//!   f32(lanes), acc)` per block into one 8-lane accumulator and one final horizontal sum
//!   (Q4_1/Q5_1 add `Σ mw·sa`, accumulated by fma), or, for the repacked types, the lanes
//!   summed to one exact integer per block and `acc = fma(f32(sumi), dw·da, acc)`.
//!
//! The order is fixed by `n` alone, so a row gives the same bits however many rows are
//! computed and on whichever thread. Every dot here gives the scalar reference's bits
//! exactly.
//!
//! Activation quantizers compute exactly what `quantize.rs` does (`id = 127/amax`,
//! round half to even), so their bytes equal the reference's (tested).
//!
//! With AVX-512 VNNI (and F/BW/VL; [`cpu_has_avx512_vnni`]) the prompt tiles use
//! `vpdpbusd` on 256-bit vectors, with 32 vector registers (`qtile.rs`).
//!
//! The value-only intrinsics are safe inside `#[target_feature]` functions on current
//! compilers; some `unsafe` blocks below predate that, hence `allow(unused_unsafe)`.
#![allow(unused_unsafe)]

use core::arch::x86_64::*;

pub(crate) mod act;
pub(crate) mod f16ops;
mod kdot;
mod qdot;
mod qtile;
mod rows16;
mod tiled;

use super::blocks::{bf16_to_f32, f16_to_f32};
use super::{vec_dots, DotTile, Isa, KernelTable, REFERENCE};
use kdot::{q2_k_q8_k, q3_k_q8_k, q4_k_q8_k, q5_k_q8_k, q6_k_q8_k, GEMM, NATIVE, TILED};
use qdot::{iq4_nl_q8_0, mxfp4_q8_0, q4_0_q8_0, q4_0_q8_0_lanes, q4_1_q8_1, q5_0_q8_0, q5_1_q8_1, q8_0_q8_0};

/// True if this CPU (and OS) can run the kernels here: AVX, AVX2, FMA, F16C, and the OS
/// saves YMM state (XCR0 bits 1 and 2).
pub(crate) fn cpu_has_avx2_fma() -> bool {
    // SAFETY: CPUID exists on every x86_64 CPU.
    let max_leaf = unsafe { __cpuid(0) }.eax;
    if max_leaf < 7 {
        return false;
    }
    // SAFETY: leaf 1 exists (max_leaf >= 7).
    let ecx = unsafe { __cpuid(1) }.ecx;
    let (fma, osxsave, avx, f16c) = (ecx >> 12 & 1, ecx >> 27 & 1, ecx >> 28 & 1, ecx >> 29 & 1);
    if fma & osxsave & avx & f16c == 0 {
        return false;
    }
    // SAFETY: OSXSAVE is set, so XGETBV is available and XCR0 is readable.
    let xcr0 = unsafe { xcr0() };
    if xcr0 & 0b110 != 0b110 {
        return false;
    }
    // SAFETY: leaf 7 exists (checked above).
    let ebx = unsafe { __cpuid_count(7, 0) }.ebx;
    ebx >> 5 & 1 == 1
}

/// True if, besides [`cpu_has_avx2_fma`], this CPU (and OS) has AVX-512 F, BW and VL,
/// and the OS saves the opmask and ZMM state (XCR0 bits 5, 6, 7).
pub(crate) fn cpu_has_avx512() -> bool {
    if !cpu_has_avx2_fma() {
        return false;
    }
    // SAFETY: leaf 7 exists and OSXSAVE is set (cpu_has_avx2_fma checked both).
    let (leaf7, xcr0) = unsafe { (__cpuid_count(7, 0), xcr0()) };
    let (f, bw, vl) = (leaf7.ebx >> 16 & 1, leaf7.ebx >> 30 & 1, leaf7.ebx >> 31 & 1);
    f & bw & vl == 1 && xcr0 & 0xE6 == 0xE6
}

/// True if, besides [`cpu_has_avx512`], this CPU has AVX512-FP16.
pub(crate) fn cpu_has_avx512_fp16() -> bool {
    // SAFETY: leaf 7 exists (cpu_has_avx512 checked it).
    cpu_has_avx512() && unsafe { __cpuid_count(7, 0) }.edx >> 23 & 1 == 1
}

/// True if, besides [`cpu_has_avx512`], this CPU has AVX-512 VNNI.
pub(crate) fn cpu_has_avx512_vnni() -> bool {
    // SAFETY: leaf 7 exists (cpu_has_avx512 checked it).
    cpu_has_avx512() && unsafe { __cpuid_count(7, 0) }.ecx >> 11 & 1 == 1
}

/// The L1 data cache of this core in bytes, from CPUID (Intel: leaf 4's level-1 data
/// cache; AMD and Hygon: leaf 0x8000_0005), or `None` where CPUID does not say.
pub(crate) fn cpu_l1d_bytes() -> Option<usize> {
    // SAFETY: CPUID leaf 0 exists on every x86_64 CPU.
    let l0 = unsafe { __cpuid(0) };
    let vendor = (l0.ebx, l0.edx, l0.ecx);
    let amd = vendor == (u32::from_le_bytes(*b"Auth"), u32::from_le_bytes(*b"enti"), u32::from_le_bytes(*b"cAMD"))
        || vendor == (u32::from_le_bytes(*b"Hygo"), u32::from_le_bytes(*b"nGen"), u32::from_le_bytes(*b"uine"));
    if amd {
        // SAFETY: leaf 0x8000_0000 exists on every x86_64 CPU (long mode is reported there).
        if unsafe { __cpuid(0x8000_0000) }.eax < 0x8000_0005 {
            return None;
        }
        // SAFETY: the extended leaf exists (checked above).
        let kib = (unsafe { __cpuid(0x8000_0005) }.ecx >> 24) as usize;
        return (kib > 0).then_some(kib << 10);
    }
    if l0.eax < 4 {
        return None;
    }
    // SAFETY: leaf 4 exists (max leaf >= 4).
    unsafe { cache_bytes(4, 1) }
}

/// The size in bytes of the level-`level` data or unified cache that the deterministic
/// cache parameters leaf `leaf` (Intel's 4, AMD's 0x8000_001D: the same layout) reports,
/// its subleaves read until type 0: ways × partitions × line × sets. `None` if none.
///
/// # Safety
/// CPUID leaf `leaf` exists (its range's maximum leaf is at least `leaf`).
unsafe fn cache_bytes(leaf: u32, level: u32) -> Option<usize> {
    for sub in 0..16 {
        // SAFETY: the caller's contract; subleaves past the last report type 0.
        let r = unsafe { __cpuid_count(leaf, sub) };
        let kind = r.eax & 0x1F;
        if kind == 0 {
            break;
        }
        if r.eax >> 5 & 7 == level && (kind == 1 || kind == 3) {
            let ways = (r.ebx >> 22) as usize + 1;
            let partitions = (r.ebx >> 12 & 0x3FF) as usize + 1;
            let line = (r.ebx & 0xFFF) as usize + 1;
            return Some(ways * partitions * line * (r.ecx as usize + 1));
        }
    }
    None
}

/// True if CPUID's vendor is AMD (`AuthenticAMD`).
fn cpu_is_amd() -> bool {
    // SAFETY: CPUID leaf 0 exists on every x86_64 CPU.
    let l0 = unsafe { __cpuid(0) };
    (l0.ebx, l0.edx, l0.ecx) == (u32::from_le_bytes(*b"Auth"), u32::from_le_bytes(*b"enti"), u32::from_le_bytes(*b"cAMD"))
}

/// The least L1 data cache, in bytes, into which the 8-row kernels of the small-block
/// types prefetch `qdot::FAR_BYTES` ahead (smaller: into L2; see there).
const FAR_L1_MIN_L1D: usize = 48 << 10;

#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    // SAFETY: the caller checked OSXSAVE.
    unsafe { _xgetbv(0) }
}

/// Whole blocks to process: the caller contract says `n / bs`; clamp to what the
/// slices hold so a broken contract cannot read out of bounds in release builds.
#[inline]
fn fit(n: usize, bs: usize, w: &[u8], wsize: usize, a: &[u8], asize: usize) -> usize {
    debug_assert!(n % bs == 0, "vec_dot: n = {n} is not a multiple of the block size {bs}");
    debug_assert!(w.len() >= n / bs * wsize && a.len() >= n / bs * asize, "vec_dot: row too short");
    (n / bs).min(w.len() / wsize).min(a.len() / asize)
}

/// Runs tile body `$body` (see `qtile.rs`) on whole blocks, after checking that the
/// slices hold the tile (a broken contract panics; it cannot read out of bounds): once
/// per group of `$rows` rows, or (`panel`) once for all of them.
macro_rules! tile_wrapper {
    ($(#[$doc:meta])* $name:ident, $body:path, $bs:expr, $wsize:expr, $asize:expr) => {
        tile_wrapper!($(#[$doc])* $name, $body, $bs, $wsize, $asize, qtile::TILE_ROWS, qtile::TILE_TOKENS, cpu_has_avx2_fma);
    };
    ($(#[$doc:meta])* $name:ident, $body:path, $bs:expr, $wsize:expr, $asize:expr, $rows:expr, $tokens:expr, $cpu:ident) => {
        tile_wrapper!(@fn $(#[$doc])* $name, $bs, $wsize, $asize, $rows, $tokens, $cpu, |nb, w, wrow, rows, a, arow, out, ostride| {
            for g in (0..rows).step_by($rows) {
                $body(nb, w.add(g * wrow), wrow, a, arow, out.add(g), ostride);
            }
        });
    };
    ($(#[$doc:meta])* $name:ident, panel $body:path, $bs:expr, $wsize:expr, $asize:expr, $rows:expr, $tokens:expr, $cpu:ident) => {
        tile_wrapper!(@fn $(#[$doc])* $name, $bs, $wsize, $asize, $rows, $tokens, $cpu, |nb, w, wrow, rows, a, arow, out, ostride| {
            $body(nb, w, wrow, rows, a, arow, out, ostride);
        });
    };
    (@fn $(#[$doc:meta])* $name:ident, $bs:expr, $wsize:expr, $asize:expr, $rows:expr, $tokens:expr, $cpu:ident,
     |$nb:ident, $w:ident, $wrow:ident, $nr:ident, $a:ident, $arow:ident, $out:ident, $ostride:ident| $run:block) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn $name(n: usize, w: &[u8], wrow: usize, rows: usize, a: &[u8], arow: usize, out: &mut [f32], ostride: usize) {
            const TILE_ROWS: usize = $rows;
            const TILE_TOKENS: usize = $tokens;
            let nb = n / $bs;
            debug_assert!(n % $bs == 0, "dot tile: n = {n} is not a multiple of the block size {}", $bs);
            assert!(
                rows >= TILE_ROWS
                    && rows.is_multiple_of(TILE_ROWS)
                    && w.len() >= (rows - 1) * wrow + nb * $wsize
                    && a.len() >= (TILE_TOKENS - 1) * arow + nb * $asize
                    && out.len() >= (TILE_TOKENS - 1) * ostride + rows
                    && ostride >= rows,
                "dot tile: slices too short"
            );
            // SAFETY: only handed out after $cpu() (module contract); every group's
            // blocks and outputs lie inside w, a and out (checked above).
            unsafe {
                let ($nb, $w, $wrow, $nr, $a, $arow, $out, $ostride) = (nb, w.as_ptr(), wrow, rows, a.as_ptr(), arow, out.as_mut_ptr(), ostride);
                $run
            }
        }
    };
}

tile_wrapper!(/// AVX-512 VNNI Q8_0 · Q8_0 tile, 16 rows in the lanes of a vector × 32 tokens (each
    /// output as [`vec_dot_q8_0_q8_0`]); only handed out after [`cpu_has_avx512_vnni`].
    tile_q8_0_q8_0_lanes, panel qtile::q8_0_q8_0_lanes::<{ qtile::LANES_TILE_TOKENS }>, 32, 34, 34, qtile::LANES_TILE_ROWS, qtile::LANES_TILE_TOKENS, cpu_has_avx512_vnni);
tile_wrapper!(/// [`tile_q8_0_q8_0_lanes`] for 16 tokens (a chunk's tokens after its last whole tile).
    tile_q8_0_q8_0_lanes16, panel qtile::q8_0_q8_0_lanes::<{ qtile::LANES_REST_TOKENS }>, 32, 34, 34, qtile::LANES_TILE_ROWS, qtile::LANES_REST_TOKENS, cpu_has_avx512_vnni);
tile_wrapper!(/// [`tile_q8_0_q8_0_lanes`] over a matrix in the rows16 layout (`quant::rows16`).
    tile_q8_0_q8_0_lanes_rows16, panel qtile::q8_0_q8_0_lanes_rows16::<{ qtile::LANES_TILE_TOKENS }>, 32, 34, 34, qtile::LANES_TILE_ROWS, qtile::LANES_TILE_TOKENS, cpu_has_avx512_vnni);
tile_wrapper!(/// [`tile_q5_0_q8_0_lanes`] over a matrix in the rows16 layout (`quant::rows16`).
    tile_q5_0_q8_0_lanes_rows16, panel qtile::q5_0_q8_0_lanes_rows16::<{ qtile::LANES_TILE_TOKENS }>, 32, 22, 34, qtile::LANES_TILE_ROWS, qtile::LANES_TILE_TOKENS, cpu_has_avx512_vnni);
tile_wrapper!(/// [`tile_q5_0_q8_0_lanes_rows16`] for 16 tokens (a chunk's tokens after its last whole tile).
    tile_q5_0_q8_0_lanes16_rows16, panel qtile::q5_0_q8_0_lanes_rows16::<{ qtile::LANES_REST_TOKENS }>, 32, 22, 34, qtile::LANES_TILE_ROWS, qtile::LANES_REST_TOKENS, cpu_has_avx512_vnni);
tile_wrapper!(/// [`tile_q8_0_q8_0_lanes_rows16`] for 16 tokens (a chunk's tokens after its last whole tile).
    tile_q8_0_q8_0_lanes16_rows16, panel qtile::q8_0_q8_0_lanes_rows16::<{ qtile::LANES_REST_TOKENS }>, 32, 34, 34, qtile::LANES_TILE_ROWS, qtile::LANES_REST_TOKENS, cpu_has_avx512_vnni);
tile_wrapper!(/// AVX-512 VNNI Q5_0 · Q8_0 tile, 16 rows in the lanes of a vector × 32 tokens (each
    /// output as [`vec_dot_q5_0_q8_0`]); only handed out after [`cpu_has_avx512_vnni`].
    tile_q5_0_q8_0_lanes, panel qtile::q5_0_q8_0_lanes::<{ qtile::LANES_TILE_TOKENS }>, 32, 22, 34, qtile::LANES_TILE_ROWS, qtile::LANES_TILE_TOKENS, cpu_has_avx512_vnni);
tile_wrapper!(/// [`tile_q5_0_q8_0_lanes`] for 16 tokens (a chunk's tokens after its last whole tile).
    tile_q5_0_q8_0_lanes16, panel qtile::q5_0_q8_0_lanes::<{ qtile::LANES_REST_TOKENS }>, 32, 22, 34, qtile::LANES_TILE_ROWS, qtile::LANES_REST_TOKENS, cpu_has_avx512_vnni);
tile_wrapper!(/// AVX-512 VNNI Q4_1 · Q8_1 tile (each output as [`vec_dot_q4_1_q8_1`]); only handed
    /// out after [`cpu_has_avx512_vnni`].
    tile_q4_1_q8_1_vnni, qtile::q4_1_q8_1_zmm, 32, 20, 36, qtile::TILE_ROWS, qtile::ZMM_TILE_TOKENS, cpu_has_avx512_vnni);
tile_wrapper!(/// AVX2 Q4_K · Q8_K tile, [`kdot::KLANES8_ROWS`] rows in lanes ×
    /// [`kdot::KLANES8_TOKENS`] tokens (each output as [`vec_dot_q4_k_q8_k`]).
    tile_q4_k_q8_k_lanes8, panel kdot::q4_k_q8_k_lanes8::<{ kdot::KLANES8_TOKENS }, false>, 256, 144, 292, kdot::KLANES8_ROWS, kdot::KLANES8_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// [`tile_q4_k_q8_k_lanes8`] for [`kdot::KLANES8_REST_TOKENS`] tokens (a chunk's tokens
    /// after its last whole tile).
    tile_q4_k_q8_k_lanes8_rest, panel kdot::q4_k_q8_k_lanes8::<{ kdot::KLANES8_REST_TOKENS }, false>, 256, 144, 292, kdot::KLANES8_ROWS, kdot::KLANES8_REST_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// [`tile_q4_k_q8_k_lanes8`] over a matrix in the rows16 layout (`quant::rows16`).
    tile_q4_k_q8_k_lanes8_rows16, panel kdot::q4_k_q8_k_lanes8::<{ kdot::KLANES8_TOKENS }, true>, 256, 144, 292, 16, kdot::KLANES8_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// [`tile_q4_k_q8_k_lanes8_rows16`] for [`kdot::KLANES8_REST_TOKENS`] tokens (a chunk's tokens after its last whole tile).
    tile_q4_k_q8_k_lanes8_rest_rows16, panel kdot::q4_k_q8_k_lanes8::<{ kdot::KLANES8_REST_TOKENS }, true>, 256, 144, 292, 16, kdot::KLANES8_REST_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// AVX2 Q4_K · Q8_K tile in llama.cpp's `gemm` order, one row × [`kdot::KTILE_TOKENS`]
    /// tokens (each output as [`vec_dot_q4_k_q8_k_gemm`]).
    tile_q4_k_q8_k_gemm, kdot::q4_k_q8_k_tile::<GEMM>, 256, 144, 292, 1, kdot::KTILE_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// AVX2 Q4_K · Q8_K tile in llama.cpp's tiled order, one row × [`kdot::KTILE_TOKENS`]
    /// tokens (each output as [`vec_dot_q4_k_q8_k_tiled`]).
    tile_q4_k_q8_k_tiled, kdot::q4_k_q8_k_tile::<TILED>, 256, 144, 292, 1, kdot::KTILE_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// AVX-512 VNNI Q4_K · Q8_K tile, 8 rows × [`kdot::Q4_K_TILE_TOKENS`] tokens (each
    /// output as [`vec_dot_q4_k_q8_k`]); only handed out after [`cpu_has_avx512_vnni`].
    tile_q4_k_q8_k_vnni, kdot::q4_k_q8_k_tile_vnni::<NATIVE>, 256, 144, 292, kdot::Q4_K_TILE_ROWS, kdot::Q4_K_TILE_TOKENS, cpu_has_avx512_vnni);
tile_wrapper!(/// AVX-512 VNNI Q4_K · Q8_K tile in llama.cpp's `gemm` order, 8 rows ×
    /// [`kdot::Q4_K_TILE_TOKENS`] tokens (each output as [`vec_dot_q4_k_q8_k_gemm`]); only
    /// handed out after [`cpu_has_avx512_vnni`].
    tile_q4_k_q8_k_gemm_vnni, kdot::q4_k_q8_k_tile_vnni::<GEMM>, 256, 144, 292, kdot::Q4_K_TILE_ROWS, kdot::Q4_K_TILE_TOKENS, cpu_has_avx512_vnni);
tile_wrapper!(/// AVX2 Q6_K · Q8_K tile, [`kdot::KLANES8_ROWS`] rows in lanes ×
    /// [`kdot::KLANES8_TOKENS`] tokens (each output as [`vec_dot_q6_k_q8_k`]).
    tile_q6_k_q8_k_lanes8, panel kdot::q6_k_q8_k_lanes8::<{ kdot::KLANES8_TOKENS }>, 256, 210, 292, kdot::KLANES8_ROWS, kdot::KLANES8_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// [`tile_q6_k_q8_k_lanes8`] for [`kdot::KLANES8_REST_TOKENS`] tokens (a chunk's tokens
    /// after its last whole tile).
    tile_q6_k_q8_k_lanes8_rest, panel kdot::q6_k_q8_k_lanes8::<{ kdot::KLANES8_REST_TOKENS }>, 256, 210, 292, kdot::KLANES8_ROWS, kdot::KLANES8_REST_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// AVX2 Q6_K · Q8_K tile, one row × [`kdot::KTILE_TOKENS`] tokens (each output as
    /// [`vec_dot_q6_k_q8_k`]).
    tile_q6_k_q8_k, kdot::q6_k_q8_k_tile::<NATIVE>, 256, 210, 292, 1, kdot::KTILE_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// AVX-512 VNNI Q6_K · Q8_K tile, one row × [`kdot::Q6_K_NATIVE_TOKENS`] tokens (each
    /// output as [`vec_dot_q6_k_q8_k`]); only handed out after [`cpu_has_avx512_vnni`].
    tile_q6_k_q8_k_vnni, kdot::q6_k_q8_k_tile_vnni, 256, 210, 292, 1, kdot::Q6_K_NATIVE_TOKENS, cpu_has_avx512_vnni);
tile_wrapper!(/// AVX-512 VNNI Q6_K · Q8_K tile in llama.cpp's tiled order, 8 rows ×
    /// [`kdot::Q6_K_TILE_TOKENS`] tokens (each output as [`vec_dot_q6_k_q8_k_tiled`]); only
    /// handed out after [`cpu_has_avx512_vnni`].
    tile_q6_k_q8_k_tiled_vnni, kdot::q6_k_q8_k_tile_tiled_vnni, 256, 210, 292, kdot::Q6_K_TILE_ROWS, kdot::Q6_K_TILE_TOKENS, cpu_has_avx512_vnni);
tile_wrapper!(/// AVX2 Q6_K · Q8_K tile in llama.cpp's tiled order, one row × [`kdot::KTILE_TOKENS`]
    /// tokens (each output as [`vec_dot_q6_k_q8_k_tiled`]).
    tile_q6_k_q8_k_tiled, kdot::q6_k_q8_k_tile::<TILED>, 256, 210, 292, 1, kdot::KTILE_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// AVX2 Q8_0 · Q8_0 tile, 8 rows in the lanes of a vector × 32 tokens (each output
    /// as [`vec_dot_q8_0_q8_0`]).
    tile_q8_0_q8_0_lanes8, panel qtile::q8_0_q8_0_lanes8::<{ qtile::LANES8_TILE_TOKENS }>, 32, 34, 34, qtile::LANES8_TILE_ROWS, qtile::LANES8_TILE_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// [`tile_q8_0_q8_0_lanes8`] for 8 tokens (a chunk's tokens after its last whole tile).
    tile_q8_0_q8_0_lanes8_rest, panel qtile::q8_0_q8_0_lanes8::<{ qtile::LANES8_REST_TOKENS }>, 32, 34, 34, qtile::LANES8_TILE_ROWS, qtile::LANES8_REST_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// [`tile_q8_0_q8_0_lanes8`] over a matrix in the rows16 layout (`quant::rows16`).
    tile_q8_0_q8_0_lanes8_rows16, panel qtile::q8_0_q8_0_lanes8_rows16::<{ qtile::LANES8_TILE_TOKENS }>, 32, 34, 34, 16, qtile::LANES8_TILE_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// [`tile_q8_0_q8_0_lanes8_rows16`] for 8 tokens (a chunk's tokens after its last whole tile).
    tile_q8_0_q8_0_lanes8_rest_rows16, panel qtile::q8_0_q8_0_lanes8_rows16::<{ qtile::LANES8_REST_TOKENS }>, 32, 34, 34, 16, qtile::LANES8_REST_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// AVX2 Q5_0 · Q8_0 tile, 8 rows in the lanes of a vector × 32 tokens (each output
    /// as [`vec_dot_q5_0_q8_0`]).
    tile_q5_0_q8_0_lanes8, panel qtile::q5_0_q8_0_lanes8::<{ qtile::LANES8_TILE_TOKENS }>, 32, 22, 34, qtile::LANES8_TILE_ROWS, qtile::LANES8_TILE_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// [`tile_q5_0_q8_0_lanes8`] for 8 tokens (a chunk's tokens after its last whole tile).
    tile_q5_0_q8_0_lanes8_rest, panel qtile::q5_0_q8_0_lanes8::<{ qtile::LANES8_REST_TOKENS }>, 32, 22, 34, qtile::LANES8_TILE_ROWS, qtile::LANES8_REST_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// AVX2 Q4_1 · Q8_1 tile, 8 rows in the lanes of a vector × 32 tokens (each output
    /// as [`vec_dot_q4_1_q8_1`]).
    tile_q4_1_q8_1_lanes8, panel qtile::q4_1_q8_1_lanes8::<{ qtile::LANES8_TILE_TOKENS }>, 32, 20, 36, qtile::LANES8_TILE_ROWS, qtile::LANES8_TILE_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// [`tile_q5_0_q8_0_lanes8`] over a matrix in the rows16 layout (`quant::rows16`).
    tile_q5_0_q8_0_lanes8_rows16, panel qtile::q5_0_q8_0_lanes8_rows16::<{ qtile::LANES8_TILE_TOKENS }>, 32, 22, 34, 16, qtile::LANES8_TILE_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// [`tile_q5_0_q8_0_lanes8_rows16`] for 8 tokens (a chunk's tokens after its last whole tile).
    tile_q5_0_q8_0_lanes8_rest_rows16, panel qtile::q5_0_q8_0_lanes8_rows16::<{ qtile::LANES8_REST_TOKENS }>, 32, 22, 34, 16, qtile::LANES8_REST_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// [`tile_q4_1_q8_1_lanes8`] over a matrix in the rows16 layout (`quant::rows16`).
    tile_q4_1_q8_1_lanes8_rows16, panel qtile::q4_1_q8_1_lanes8_rows16::<{ qtile::LANES8_TILE_TOKENS }>, 32, 20, 36, 16, qtile::LANES8_TILE_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// [`tile_q4_1_q8_1_lanes8_rows16`] for 8 tokens (a chunk's tokens after its last whole tile).
    tile_q4_1_q8_1_lanes8_rest_rows16, panel qtile::q4_1_q8_1_lanes8_rows16::<{ qtile::LANES8_REST_TOKENS }>, 32, 20, 36, 16, qtile::LANES8_REST_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// [`tile_q4_1_q8_1_lanes8`] for 8 tokens (a chunk's tokens after its last whole tile).
    tile_q4_1_q8_1_lanes8_rest, panel qtile::q4_1_q8_1_lanes8::<{ qtile::LANES8_REST_TOKENS }>, 32, 20, 36, qtile::LANES8_TILE_ROWS, qtile::LANES8_REST_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// AVX2 Q4_0 · Q8_0 tile (each output as [`vec_dot_q4_0_q8_0`]).
    tile_q4_0_q8_0, panel qtile::q4_0_q8_0::<{ qtile::Q4_0_TILE_TOKENS }>, 32, 18, 34, qtile::Q4_0_TILE_ROWS, qtile::Q4_0_TILE_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// [`tile_q4_0_q8_0_wide`] over a matrix in the rows16 layout (`quant::rows16`).
    tile_q4_0_q8_0_wide_rows16, panel qtile::q4_0_q8_0_rows16::<{ qtile::Q4_0_WIDE_TILE_TOKENS }>, 32, 18, 34, 16, qtile::Q4_0_WIDE_TILE_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// [`tile_q4_0_q8_0`] over a matrix in the rows16 layout (`quant::rows16`).
    tile_q4_0_q8_0_rows16, panel qtile::q4_0_q8_0_rows16::<{ qtile::Q4_0_TILE_TOKENS }>, 32, 18, 34, 16, qtile::Q4_0_TILE_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// [`tile_q4_0_q8_0`] for [`qtile::Q4_0_WIDE_TILE_TOKENS`] tokens (each block transposed once).
    tile_q4_0_q8_0_wide, panel qtile::q4_0_q8_0::<{ qtile::Q4_0_WIDE_TILE_TOKENS }>, 32, 18, 34, qtile::Q4_0_TILE_ROWS, qtile::Q4_0_WIDE_TILE_TOKENS, cpu_has_avx2_fma);
tile_wrapper!(/// AVX-512 VNNI Q4_0 · Q8_0 tile of 16 tokens (each output as
    /// [`vec_dot_q4_0_q8_0`]); only handed out after [`cpu_has_avx512_vnni`].
    tile_q4_0_q8_0_vnni, panel qtile::q4_0_q8_0_zmm::<8>, 32, 18, 34, qtile::Q4_0_TILE_ROWS, qtile::Q4_0_TILE_TOKENS_VNNI, cpu_has_avx512_vnni);
tile_wrapper!(/// AVX-512 VNNI Q4_0 · Q8_0 tile of 32 tokens (each output as
    /// [`vec_dot_q4_0_q8_0`]); only handed out after [`cpu_has_avx512_vnni`].
    tile_q4_0_q8_0_vnni32, panel qtile::q4_0_q8_0_zmm::<16>, 32, 18, 34, qtile::Q4_0_TILE_ROWS, qtile::Q4_0_TILE_TOKENS_VNNI32, cpu_has_avx512_vnni);

/// AVX-512 VNNI Q8_0 · Q8_0 for short batches ([`crate::quant::DotPairsFn`]): `rows` (a
/// multiple of 4) × `2·pairs` tokens (1..=[`qtile::PAIRS_MAX`] pairs), each output as
/// [`vec_dot_q8_0_q8_0`]; only handed out after [`cpu_has_avx512_vnni`]. Eight rows per
/// call of the kernel where one or two pairs leave the registers room, else four.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pairs_q8_0_q8_0_vnni(n: usize, w: &[u8], wrow: usize, rows: usize, a: &[u8], arow: usize, pairs: usize, out: &mut [f32], ostride: usize) {
    let nb = n / 32;
    debug_assert!(n % 32 == 0, "dot pairs: n = {n} is not a multiple of the block size 32");
    let tokens = 2 * pairs;
    assert!(
        (1..=qtile::PAIRS_MAX).contains(&pairs)
            && rows >= 4
            && rows.is_multiple_of(4)
            && w.len() >= (rows - 1) * wrow + nb * 34
            && a.len() >= (tokens - 1) * arow + nb * 34
            && out.len() >= (tokens - 1) * ostride + rows
            && ostride >= rows,
        "dot pairs: slices too short or bad shape"
    );
    // SAFETY: only handed out after cpu_has_avx512_vnni() (module contract); every
    // group's blocks and outputs lie inside w, a and out (checked above).
    unsafe {
        let (w, a, out) = (w.as_ptr(), a.as_ptr(), out.as_mut_ptr());
        let mut g = 0;
        while g < rows {
            let (wg, og) = (w.add(g * wrow), out.add(g));
            let eight = rows - g >= 8;
            match (pairs, eight) {
                (1, true) => qtile::q8_0_q8_0_pairs_zmm::<8, 1>(nb, wg, wrow, a, arow, og, ostride),
                (2, true) => qtile::q8_0_q8_0_pairs_zmm::<8, 2>(nb, wg, wrow, a, arow, og, ostride),
                (1, false) => qtile::q8_0_q8_0_pairs_zmm::<4, 1>(nb, wg, wrow, a, arow, og, ostride),
                (2, false) => qtile::q8_0_q8_0_pairs_zmm::<4, 2>(nb, wg, wrow, a, arow, og, ostride),
                (3, _) => qtile::q8_0_q8_0_pairs_zmm::<4, 3>(nb, wg, wrow, a, arow, og, ostride),
                _ => qtile::q8_0_q8_0_pairs_zmm::<4, 4>(nb, wg, wrow, a, arow, og, ostride),
            }
            g += if eight && pairs <= 2 { 8 } else { 4 };
        }
    }
}
pub(crate) use kdot::{KTILE_TOKENS, Q4_K_TILE_ROWS, Q4_K_TILE_TOKENS};
pub(crate) use qtile::{LANES8_REST_TOKENS, LANES8_TILE_ROWS, LANES8_TILE_TOKENS, LANES_REST_TOKENS, LANES_TILE_ROWS, LANES_TILE_TOKENS, Q4_0_TILE_ROWS, Q4_0_TILE_TOKENS, Q4_0_TILE_TOKENS_VNNI, Q4_0_WIDE_TILE_TOKENS, Q4_0_TILE_TOKENS_VNNI32, TILE_ROWS, TILE_TOKENS, ZMM_TILE_TOKENS};

/// Runs 8-row body `$body` (see `qdot::table_dot_rows`) on whole blocks, after checking
/// that the slices hold the rows (a broken contract panics; it cannot read out of bounds).
/// `FAR_L1`: the body's far prefetch goes into L1 rather than L2 (`qdot::FAR_BYTES`).
macro_rules! rows_wrapper {
    ($(#[$doc:meta])* $name:ident, $($body:ident)::+, $bs:expr, $wsize:expr, $asize:expr) => {
        rows_wrapper!($(#[$doc])* $name, $($body)::+, $bs, $wsize, $asize, cpu_has_avx2_fma);
    };
    ($(#[$doc:meta])* $name:ident, $($body:ident)::+, $bs:expr, $wsize:expr, $asize:expr, $cpu:ident) => {
        $(#[$doc])*
        pub(crate) fn $name<const FAR_L1: bool>(n: usize, w: &[u8], wrow: usize, a: &[u8], out: &mut [f32; qdot::ROWS]) {
            let nb = n / $bs;
            debug_assert!(n % $bs == 0, "dot rows: n = {n} is not a multiple of the block size {}", $bs);
            assert!(w.len() >= (qdot::ROWS - 1) * wrow + nb * $wsize && a.len() >= nb * $asize, "dot rows: slices too short");
            // SAFETY: only handed out after $cpu() (module contract); the rows' blocks,
            // the activation blocks and the 8 outputs are in bounds (checked above).
            unsafe { $($body)::+::<FAR_L1>(nb, w.as_ptr(), wrow, a.as_ptr(), out.as_mut_ptr()) }
        }
    };
}

/// A rows16 kernel's safe wrapper: checks the slices (blocks of `$bs` elements, `$wsize`
/// and `$asize` bytes), then runs `$run` (AVX-512 VNNI, or AVX2 for the `_avx2` ones) with
/// `nb`, `groups`, the pointers and `tokens`, `arow`, `ostride`; `PF` (the wrapper's
/// parameter) is the group kernels' (how far ahead they ask for their weights, 0 for not
/// at all: by CPU for AVX-512, see `rows16::PREFETCH_INTEL`; always for AVX2). With
/// `each token KERNEL` in place of `$run`: KERNEL (one group against one token) for every
/// group and token.
macro_rules! rows16_wrapper {
    ($(#[$doc:meta])* $name:ident, $bs:expr, $wsize:expr, $asize:expr, in streams $($group3:ident)::+, each token $($group:ident)::+) => {
        rows16_wrapper!($(#[$doc])* $name, $bs, $wsize, $asize, |nb, groups, w, a, arow, tokens, out, ostride| {
            let gb = nb * 16 * $wsize;
            let q = streams_of::<PF>(groups, tokens);
            for g in 0..q {
                let wg = |s: usize| w.add((g + s * q) * gb);
                let og = |s: usize| out.add(16 * (g + s * q));
                $($group3)::+(nb, [wg(0), wg(1), wg(2)], a, [og(0), og(1), og(2)]);
            }
            for g in 3 * q..groups {
                for t in 0..tokens {
                    $($group)::+::<PF>(nb, w.add(g * gb), a.add(t * arow), out.add(t * ostride + 16 * g));
                }
            }
        });
    };
    ($(#[$doc:meta])* $name:ident, $bs:expr, $wsize:expr, $asize:expr, each token $($group:ident)::+) => {
        rows16_wrapper!($(#[$doc])* $name, $bs, $wsize, $asize, |nb, groups, w, a, arow, tokens, out, ostride| {
            for g in 0..groups {
                for t in 0..tokens {
                    $($group)::+::<PF>(nb, w.add(g * 16 * nb * $wsize), a.add(t * arow), out.add(t * ostride + 16 * g));
                }
            }
        });
    };
    ($(#[$doc:meta])* $name:ident, $bs:expr, $wsize:expr, $asize:expr, |$nb:ident, $groups:ident, $w:ident, $a:ident, $arow:ident, $tokens:ident, $out:ident, $ostride:ident| $run:block) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        fn $name<const PF: usize>(n: usize, groups: usize, w: &[u8], a: &[u8], arow: usize, tokens: usize, out: &mut [f32], ostride: usize) {
            let nb = n / $bs;
            debug_assert!(n % $bs == 0, "rows16: n = {n} is not a multiple of {}", $bs);
            if tokens == 0 || groups == 0 {
                return;
            }
            assert!(
                w.len() >= groups * 16 * nb * $wsize && a.len() >= (tokens - 1) * arow + nb * $asize && ostride >= 16 * groups && out.len() >= (tokens - 1) * ostride + 16 * groups,
                "rows16: slices too short"
            );
            // SAFETY: only handed out where the CPU has the group kernel's features (the
            // table: after cpu_has_avx512_vnni() for the AVX-512 ones, cpu_has_avx2_fma()
            // for the `_avx2` ones); the groups' blocks, every token's blocks and outputs
            // are in bounds (checked).
            unsafe {
                let ($nb, $groups, $w, $a, $arow, $tokens, $out, $ostride) = (nb, groups, w.as_ptr(), a.as_ptr(), arow, tokens, out.as_mut_ptr(), ostride);
                $run
            }
        }
    };
}

/// Groups per stream where a rows16 product of `groups` groups and `tokens` tokens reads
/// its weights as three streams side by side (groups `g`, `g + q` and `g + 2q` by one
/// kernel call, `q` the value; the rest of the groups one at a time): one token, and the
/// table's three-stream form (`PF` = `rows16::PREFETCH_AVX2_STREAMS`: AMD family 19h
/// without AVX-512; every other table keeps one stream). On the AMD EPYC Zen 3 one core
/// then streams a Q4_0, Q4_1 or Q8_0 matrix 30-41% faster (Q5_0, bound by its arithmetic,
/// about as before) and decodes 9-16% faster (BENCHMARKS.md, "Speed II on the AMD EPYC
/// Zen 3, seventh session"); on the Zen 5 with the AVX2 set forced it decoded 1.2-1.6x
/// slower ("Speed II on the AMD EPYC Zen 5, twentieth session").
const fn streams_of<const PF: usize>(groups: usize, tokens: usize) -> usize {
    if tokens == 1 && PF == rows16::PREFETCH_AVX2_STREAMS {
        groups / 3
    } else {
        0
    }
}

rows16_wrapper!(/// AVX-512 VNNI Q4_1 · Q8_1, rows16 groups (each output as [`vec_dot_q4_1_q8_1`]).
    rows16_q4_1_q8_1, 32, 20, 36, each token rows16::q4_1_q8_1_group);
rows16_wrapper!(/// AVX2 Q4_1 · Q8_1, rows16 groups (each output as [`vec_dot_q4_1_q8_1`]): one
    /// token's groups in three streams (as [`rows16_q4_0_q8_0_avx2`]).
    rows16_q4_1_q8_1_avx2, 32, 20, 36, in streams rows16::q4_1_q8_1_group3_avx2, each token rows16::q4_1_q8_1_group_avx2);
rows16_wrapper!(/// AVX2 Q4_0 · Q8_0, rows16 groups (each output as [`vec_dot_q4_0_q8_0`]): one
    /// token's groups in three streams where the table asks for plain hints (AMD: see
    /// [`streams_of`]), the rest one at a time.
    rows16_q4_0_q8_0_avx2, 32, 18, 34, in streams rows16::q4_0_q8_0_group3_avx2, each token rows16::q4_0_q8_0_group_avx2);
rows16_wrapper!(/// AVX2 Q8_0 · Q8_0, rows16 groups (each output as [`vec_dot_q8_0_q8_0`]): one
    /// token's groups in three streams (as [`rows16_q4_0_q8_0_avx2`]).
    rows16_q8_0_q8_0_avx2, 32, 34, 34, in streams rows16::q8_0_q8_0_group3_avx2, each token rows16::q8_0_q8_0_group_avx2);
rows16_wrapper!(/// AVX2 Q5_0 · Q8_0, rows16 groups (each output as [`vec_dot_q5_0_q8_0`]): one
    /// token's groups in three streams (as [`rows16_q4_0_q8_0_avx2`]).
    rows16_q5_0_q8_0_avx2, 32, 22, 34, in streams rows16::q5_0_q8_0_group3_avx2, each token rows16::q5_0_q8_0_group_avx2);
rows16_wrapper!(/// AVX-512 VNNI Q8_0 · Q8_0, rows16 groups (each output as [`vec_dot_q8_0_q8_0`]).
    rows16_q8_0_q8_0, 32, 34, 34, each token rows16::q8_0_q8_0_group);
rows16_wrapper!(/// AVX-512 VNNI Q5_0 · Q8_0, rows16 groups (each output as [`vec_dot_q5_0_q8_0`]).
    rows16_q5_0_q8_0, 32, 22, 34, each token rows16::q5_0_q8_0_group);
/// A K-quant rows16 group kernel (`rows16::q4_k_q8_k_group`, `rows16::q6_k_q8_k_group`)
/// for one count of tokens: `(nb, w, a, arow, out, ostride)`.
type KGroupFn = unsafe fn(usize, *const u8, *const u8, usize, *mut f32, usize);

/// The groups of a K-quant's rows16 product, `gb` bytes a (group, super-block): for each
/// group, its tokens through the kernels `kernels` (`(tokens, kernel)`, most tokens
/// first, the last for one), each taking as many calls as it can.
///
/// # Safety
/// The wrappers' (AVX-512 VNNI; `groups` groups of `nb` super-blocks at `w`, `nb` Q8_K
/// blocks at `a + t·arow` and 16 outputs per group at `out + t·ostride` for `t < tokens`),
/// and `kernels` the group kernels of one type and order for their counts of tokens.
#[allow(clippy::too_many_arguments)]
unsafe fn k_groups(kernels: &[(usize, KGroupFn)], gb: usize, nb: usize, groups: usize, w: *const u8, a: *const u8, arow: usize, tokens: usize, out: *mut f32, ostride: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        for g in 0..groups {
            let wg = w.add(g * nb * gb);
            let mut t = 0;
            for &(step, f) in kernels {
                while t + step <= tokens {
                    f(nb, wg, a.add(t * arow), arow, out.add(t * ostride + 16 * g), ostride);
                    t += step;
                }
            }
        }
    }
}

/// [`k_groups`] over `rows16::q4_k_q8_k_group` in `MODE`: eight tokens a call, then four,
/// then one (a batch of 512 on the Xeon VM, one thread, in cache: 380 GFLOP/s with eight,
/// 350 with four at most; `quant::bench::bench_matmul`).
///
/// # Safety
/// As [`k_groups`].
#[allow(clippy::too_many_arguments)]
unsafe fn q4_k_groups<const MODE: u8, const PF: usize>(nb: usize, groups: usize, w: *const u8, a: *const u8, arow: usize, tokens: usize, out: *mut f32, ostride: usize) {
    use rows16::q4_k_q8_k_group as f;
    // SAFETY: the caller's contract; the kernels of one type and order.
    unsafe { k_groups(&[(8, f::<8, MODE, PF>), (4, f::<4, MODE, PF>), (1, f::<1, MODE, PF>)], rows16::GROUP_BLOCK_BYTES_Q4_K, nb, groups, w, a, arow, tokens, out, ostride) }
}

/// [`k_groups`] over `rows16::q6_k_q8_k_group` in `MODE`: eight tokens a call, then four,
/// then one (a batch of 512 on the Xeon VM, one thread, in cache: 181 GFLOP/s with eight,
/// 160 with four at most; the plain layout's tile 152; `quant::bench::bench_matmul`).
///
/// # Safety
/// As [`k_groups`].
#[allow(clippy::too_many_arguments)]
unsafe fn q6_k_groups<const MODE: u8, const PF: usize>(nb: usize, groups: usize, w: *const u8, a: *const u8, arow: usize, tokens: usize, out: *mut f32, ostride: usize) {
    use rows16::q6_k_q8_k_group as f;
    // SAFETY: the caller's contract; the kernels of one type and order.
    unsafe { k_groups(&[(8, f::<8, MODE, PF>), (4, f::<4, MODE, PF>), (1, f::<1, MODE, PF>)], rows16::GROUP_BLOCK_BYTES_Q6_K, nb, groups, w, a, arow, tokens, out, ostride) }
}

/// [`k_groups`] over `rows16::q4_k_q8_k_group_avx2` in `MODE`: four tokens a call (each
/// token's accumulators in registers), then one.
///
/// # Safety
/// As [`k_groups`], with AVX2, FMA and F16C available instead of AVX-512 VNNI.
#[allow(clippy::too_many_arguments)]
unsafe fn q4_k_groups_avx2<const MODE: u8, const PF: usize>(nb: usize, groups: usize, w: *const u8, a: *const u8, arow: usize, tokens: usize, out: *mut f32, ostride: usize) {
    use rows16::q4_k_q8_k_group_avx2 as f;
    // SAFETY: the caller's contract; the kernels of one type and order.
    unsafe { k_groups(&[(4, f::<4, MODE, PF>), (1, f::<1, MODE, PF>)], rows16::GROUP_BLOCK_BYTES_Q4_K, nb, groups, w, a, arow, tokens, out, ostride) }
}

rows16_wrapper!(/// AVX2 Q4_K · Q8_K, rows16 groups (each output as [`vec_dot_q4_k_q8_k`]).
    rows16_q4_k_q8_k_avx2, 256, 144, 292, |nb, groups, w, a, arow, tokens, out, ostride| {
        q4_k_groups_avx2::<{ kdot::NATIVE }, PF>(nb, groups, w, a, arow, tokens, out, ostride)
    });
rows16_wrapper!(/// AVX2 Q4_K · Q8_K in llama.cpp's `gemm` order, rows16 groups (each output as
    /// [`vec_dot_q4_k_q8_k_gemm`]).
    rows16_q4_k_q8_k_gemm_avx2, 256, 144, 292, |nb, groups, w, a, arow, tokens, out, ostride| {
        q4_k_groups_avx2::<{ kdot::GEMM }, PF>(nb, groups, w, a, arow, tokens, out, ostride)
    });
rows16_wrapper!(/// AVX-512 VNNI Q4_K · Q8_K, rows16 groups (each output as [`vec_dot_q4_k_q8_k`]).
    rows16_q4_k_q8_k, 256, 144, 292, |nb, groups, w, a, arow, tokens, out, ostride| {
        q4_k_groups::<{ kdot::NATIVE }, PF>(nb, groups, w, a, arow, tokens, out, ostride)
    });
rows16_wrapper!(/// AVX-512 VNNI Q4_K · Q8_K in llama.cpp's `gemm` order, rows16 groups (each output as
    /// [`vec_dot_q4_k_q8_k_gemm`]).
    rows16_q4_k_q8_k_gemm, 256, 144, 292, |nb, groups, w, a, arow, tokens, out, ostride| {
        q4_k_groups::<{ kdot::GEMM }, PF>(nb, groups, w, a, arow, tokens, out, ostride)
    });
rows16_wrapper!(/// AVX-512 VNNI Q6_K · Q8_K, rows16 groups (each output as [`vec_dot_q6_k_q8_k`]).
    rows16_q6_k_q8_k, 256, 210, 292, |nb, groups, w, a, arow, tokens, out, ostride| {
        q6_k_groups::<{ kdot::NATIVE }, PF>(nb, groups, w, a, arow, tokens, out, ostride)
    });
rows16_wrapper!(/// AVX-512 VNNI Q6_K · Q8_K in llama.cpp's tiled order, rows16 groups (each output as
    /// [`vec_dot_q6_k_q8_k_tiled`]).
    rows16_q6_k_q8_k_tiled, 256, 210, 292, |nb, groups, w, a, arow, tokens, out, ostride| {
        q6_k_groups::<{ kdot::TILED }, PF>(nb, groups, w, a, arow, tokens, out, ostride)
    });

rows16_wrapper!(/// AVX-512 VNNI Q4_0 · Q8_0, rows16 groups (each output as [`vec_dot_q4_0_q8_0`]),
    /// eight tokens at a time; with more than one group (and rows of at most
    /// [`rows16::Q4_0_TABLE_BLOCKS`] blocks) each token's block scales and `-8·Σ y` are
    /// computed once for all the groups ([`rows16::q4_0_activation_table`]), not per group.
    rows16_q4_0_q8_0, 32, 18, 34, |nb, groups, w, a, arow, tokens, out, ostride| {
        let gb = 16 * nb * 18;
        let table = groups > 1 && nb <= rows16::Q4_0_TABLE_BLOCKS;
        // (Written by `q4_0_activation_table` before any read, so not zeroed: one-group
        // calls never touch them.)
        let mut da = core::mem::MaybeUninit::<[f32; 8 * rows16::Q4_0_TABLE_BLOCKS]>::uninit();
        let mut cs = core::mem::MaybeUninit::<[i32; 8 * rows16::Q4_0_TABLE_BLOCKS]>::uninit();
        let (da, cs) = (da.as_mut_ptr().cast::<f32>(), cs.as_mut_ptr().cast::<i32>());
        let mut t0 = 0;
        while t0 < tokens {
            let tt = (tokens - t0).min(8);
            let at = a.add(t0 * arow);
            if table {
                rows16::q4_0_activation_table(nb, at, arow, tt, da, cs);
            }
            for g in 0..groups {
                let (wg, og) = (w.add(g * gb), out.add(t0 * ostride + 16 * g));
                let mut t = 0;
                macro_rules! run {
                    ($t:literal) => {
                        if table {
                            rows16::q4_0_q8_0_group::<$t, true, PF>(nb, wg, at.add(t * arow), arow, da.add(t * nb), cs.add(t * nb), og.add(t * ostride), ostride);
                        } else {
                            rows16::q4_0_q8_0_group::<$t, false, PF>(nb, wg, at.add(t * arow), arow, core::ptr::null(), core::ptr::null(), og.add(t * ostride), ostride);
                        }
                        t += $t;
                    };
                }
                if tt == 8 {
                    run!(8);
                }
                if t + 4 <= tt {
                    run!(4);
                }
                while t < tt {
                    run!(1);
                }
            }
            t0 += tt;
        }
    });

rows_wrapper!(/// AVX2 Q4_0 · Q8_0, 8 rows (each output as [`vec_dot_q4_0_q8_0`]).
    rows_q4_0_q8_0, qdot::q4_0_q8_0_rows, 32, 18, 34);
rows_wrapper!(/// AVX2 IQ4_NL · Q8_0, 8 rows (each output as [`vec_dot_iq4_nl_q8_0`]).
    rows_iq4_nl_q8_0, qdot::iq4_nl_q8_0_rows, 32, 18, 34);
rows_wrapper!(/// AVX2 MXFP4 · Q8_0, 8 rows (each output as [`vec_dot_mxfp4_q8_0`]).
    rows_mxfp4_q8_0, qdot::mxfp4_q8_0_rows, 32, 17, 34);
rows_wrapper!(/// AVX2 Q8_0 · Q8_0, 8 rows (each output as [`vec_dot_q8_0_q8_0`]).
    rows_q8_0_q8_0, qdot::q8_0_q8_0_rows, 32, 34, 34);
rows_wrapper!(/// AVX2 Q5_0 · Q8_0, 8 rows (each output as [`vec_dot_q5_0_q8_0`]).
    rows_q5_0_q8_0, qdot::q5_0_q8_0_rows, 32, 22, 34);
rows_wrapper!(/// AVX2 Q4_1 · Q8_1, 8 rows (each output as [`vec_dot_q4_1_q8_1`]).
    rows_q4_1_q8_1, qdot::q4_1_q8_1_rows, 32, 20, 36);
rows_wrapper!(/// AVX2 Q5_1 · Q8_1, 8 rows (each output as [`vec_dot_q5_1_q8_1`]).
    rows_q5_1_q8_1, qdot::q5_1_q8_1_rows, 32, 24, 36);
rows_wrapper!(/// AVX-512 VNNI Q4_0 · Q8_0, 8 rows (each output as [`vec_dot_q4_0_q8_0`]); only
    /// handed out after [`cpu_has_avx512_vnni`].
    rows_q4_0_q8_0_vnni, qdot::q4_0_q8_0_rows_vnni, 32, 18, 34, cpu_has_avx512_vnni);
rows_wrapper!(/// AVX-512 VNNI Q8_0 · Q8_0, 8 rows (each output as [`vec_dot_q8_0_q8_0`]); only
    /// handed out after [`cpu_has_avx512_vnni`].
    rows_q8_0_q8_0_vnni, qdot::q8_0_q8_0_rows_vnni, 32, 34, 34, cpu_has_avx512_vnni);
rows_wrapper!(/// AVX-512 VNNI Q5_0 · Q8_0, 8 rows (each output as [`vec_dot_q5_0_q8_0`]); only
    /// handed out after [`cpu_has_avx512_vnni`].
    rows_q5_0_q8_0_vnni, qdot::q5_0_q8_0_rows_vnni, 32, 22, 34, cpu_has_avx512_vnni);
rows_wrapper!(/// AVX-512 VNNI Q4_1 · Q8_1, 8 rows (each output as [`vec_dot_q4_1_q8_1`]); only
    /// handed out after [`cpu_has_avx512_vnni`].
    rows_q4_1_q8_1_vnni, qdot::q4_1_q8_1_rows_vnni, 32, 20, 36, cpu_has_avx512_vnni);
rows_wrapper!(/// AVX-512 VNNI Q5_1 · Q8_1, 8 rows (each output as [`vec_dot_q5_1_q8_1`]); only
    /// handed out after [`cpu_has_avx512_vnni`].
    rows_q5_1_q8_1_vnni, qdot::q5_1_q8_1_rows_vnni, 32, 24, 36, cpu_has_avx512_vnni);
rows_wrapper!(/// AVX-512 VNNI Q4_K · Q8_K, 8 rows (each output as [`vec_dot_q4_k_q8_k`]); only
    /// handed out after [`cpu_has_avx512_vnni`].
    rows_q4_k_q8_k_vnni, kdot::q4_k_q8_k_rows_vnni, 256, 144, 292, cpu_has_avx512_vnni);

macro_rules! dot_wrapper {
    ($(#[$doc:meta])* $name:ident, $body:path, $bs:expr, $wsize:expr, $asize:expr) => {
        $(#[$doc])*
        pub(crate) fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = fit(n, $bs, w, $wsize, a, $asize);
            // SAFETY: only handed out after cpu_has_avx2_fma() (module contract); `nb`
            // units of $wsize / $asize bytes lie inside `w` / `a` (fit clamps to them).
            unsafe { $body(nb, w.as_ptr(), a.as_ptr()) }
        }
    };
}

dot_wrapper!(/// AVX2 Q4_0 · Q8_0 (llama.cpp's repacked order).
    vec_dot_q4_0_q8_0, q4_0_q8_0, 32, 18, 34);
dot_wrapper!(/// AVX2 Q4_0 · Q8_0 in llama.cpp's `vec_dot` order (weights it does not repack).
    vec_dot_q4_0_q8_0_lanes, q4_0_q8_0_lanes, 32, 18, 34);
dot_wrapper!(/// AVX2 Q4_1 · Q8_1.
    vec_dot_q4_1_q8_1, q4_1_q8_1, 32, 20, 36);
dot_wrapper!(/// AVX2 Q5_0 · Q8_0.
    vec_dot_q5_0_q8_0, q5_0_q8_0, 32, 22, 34);
dot_wrapper!(/// AVX2 Q5_1 · Q8_1.
    vec_dot_q5_1_q8_1, q5_1_q8_1, 32, 24, 36);
dot_wrapper!(/// AVX2 Q8_0 · Q8_0.
    vec_dot_q8_0_q8_0, q8_0_q8_0, 32, 34, 34);
dot_wrapper!(/// AVX2 IQ4_NL · Q8_0.
    vec_dot_iq4_nl_q8_0, iq4_nl_q8_0, 32, 18, 34);
dot_wrapper!(/// AVX2 MXFP4 · Q8_0.
    vec_dot_mxfp4_q8_0, mxfp4_q8_0, 32, 17, 34);
dot_wrapper!(/// AVX2 Q2_K · Q8_K.
    vec_dot_q2_k_q8_k, q2_k_q8_k::<NATIVE>, 256, 84, 292);
dot_wrapper!(/// AVX2 Q3_K · Q8_K.
    vec_dot_q3_k_q8_k, q3_k_q8_k::<NATIVE>, 256, 110, 292);
dot_wrapper!(/// AVX2 Q4_K · Q8_K.
    vec_dot_q4_k_q8_k, q4_k_q8_k::<NATIVE>, 256, 144, 292);
dot_wrapper!(/// AVX2 Q5_K · Q8_K.
    vec_dot_q5_k_q8_k, q5_k_q8_k::<NATIVE>, 256, 176, 292);
dot_wrapper!(/// AVX2 Q6_K · Q8_K.
    vec_dot_q6_k_q8_k, q6_k_q8_k::<NATIVE>, 256, 210, 292);
dot_wrapper!(/// AVX2 Q2_K · Q8_K in llama.cpp's `gemm` order.
    vec_dot_q2_k_q8_k_gemm, q2_k_q8_k::<GEMM>, 256, 84, 292);
dot_wrapper!(/// AVX2 Q4_K · Q8_K in llama.cpp's `gemm` order.
    vec_dot_q4_k_q8_k_gemm, q4_k_q8_k::<GEMM>, 256, 144, 292);
dot_wrapper!(/// AVX2 Q2_K · Q8_K in llama.cpp's tiled order.
    vec_dot_q2_k_q8_k_tiled, q2_k_q8_k::<TILED>, 256, 84, 292);
dot_wrapper!(/// AVX2 Q3_K · Q8_K in llama.cpp's tiled order.
    vec_dot_q3_k_q8_k_tiled, q3_k_q8_k::<TILED>, 256, 110, 292);
dot_wrapper!(/// AVX2 Q4_K · Q8_K in llama.cpp's tiled order.
    vec_dot_q4_k_q8_k_tiled, q4_k_q8_k::<TILED>, 256, 144, 292);
dot_wrapper!(/// AVX2 Q5_K · Q8_K in llama.cpp's tiled order.
    vec_dot_q5_k_q8_k_tiled, q5_k_q8_k::<TILED>, 256, 176, 292);
dot_wrapper!(/// AVX2 Q6_K · Q8_K in llama.cpp's tiled order.
    vec_dot_q6_k_q8_k_tiled, q6_k_q8_k::<TILED>, 256, 210, 292);
dot_wrapper!(/// AVX2 F32 · F32.
    vec_dot_f32, f32_f32, 1, 4, 4);
dot_wrapper!(/// AVX2 F16 · F16.
    vec_dot_f16, f16_f16, 1, 2, 2);
dot_wrapper!(/// AVX2 BF16 · BF16.
    vec_dot_bf16, bf16_bf16, 1, 2, 2);

// ---------------------------------------------------------------- kernel table

/// The x86 kernel table `isa` allows and CPUID confirms: `None` without AVX2 + FMA +
/// F16C ([`cpu_has_avx2_fma`]; nothing here is handed out otherwise), else the AVX2
/// kernels with AVX-512 F/BW/VL, AVX-512 VNNI (only with AVX-512) and AVX512-FP16 where
/// both `isa` and CPUID report them.
pub(crate) fn table(isa: Isa) -> Option<&'static KernelTable> {
    if !(isa.avx2_fma && cpu_has_avx2_fma()) {
        return None;
    }
    let fp16 = isa.avx512_fp16 && cpu_has_avx512_fp16();
    let avx512 = isa.avx512 && cpu_has_avx512();
    let vnni = avx512 && isa.avx512_vnni && cpu_has_avx512_vnni();
    let intel = cpu_is_intel();
    let small_l1 = cpu_l1d_bytes().is_some_and(|b| b < FAR_L1_MIN_L1D);
    let amd19 = cpu_is_amd_family_19h();
    table_of(avx512 as usize | (vnni as usize) << 1 | (fp16 as usize) << 2 | (intel as usize) << 3 | (small_l1 as usize) << 4 | (amd19 as usize) << 5)
}

/// `t` (one of [`TABLES`]) with the AVX-512 value updates' other f16 rounding form and
/// the rows16 kernels' prefetch distance the other vendor's (Intel's or AMD's; same bits,
/// other speed): what tests run to cover both forms on any AVX-512 CPU. `None` for a
/// table without AVX-512 (the forms are AVX-512 kernels) or not in [`TABLES`].
#[cfg(test)]
pub(crate) fn other_rounding(t: &'static KernelTable) -> Option<&'static KernelTable> {
    let f = flags_of(t)?;
    if f & 1 != 0 { table_of(f ^ 8) } else { None }
}

/// `t` (one of [`TABLES`]) with its rows16 kernels' prefetch hints the other way (same
/// bits, other speed): with AVX-512, off where they are on and on where off (the Zen 4
/// choice, `amd19`, flipped; with [`other_rounding`], tests run every AVX-512 distance on
/// any AVX-512 CPU); with AVX2 alone, the next of its three forms (one stream, three
/// streams, Intel's: `PREFETCH_AVX2`, `PREFETCH_AVX2_STREAMS`, `PREFETCH_INTEL`, in a
/// cycle, so that twice from any gives all three on any CPU). `None` for a table not in
/// [`TABLES`].
#[cfg(test)]
pub(crate) fn other_rows16_prefetch(t: &'static KernelTable) -> Option<&'static KernelTable> {
    let f = flags_of(t)?;
    table_of(if f & 1 != 0 {
        f ^ 32
    } else if f & 8 != 0 {
        f & !8
    } else if f & 32 != 0 {
        (f & !32) | 8
    } else {
        f | 32
    })
}

/// How far ahead `t`'s rows16 kernels (AVX-512 or AVX2) ask for their weights, as their
/// `PF` encodes it (0: no hints; see `rows16::PREFETCH_INTEL`); `None` for a table not
/// in [`TABLES`].
#[cfg(test)]
pub(crate) fn rows16_prefetch_distance(t: &'static KernelTable) -> Option<usize> {
    flags_of(t).map(rows16_distance)
}

/// Intel's and AMD's AVX-512 rows16 prefetch distances (`rows16::PREFETCH_INTEL`), the
/// AVX2 kernels' elsewhere, and theirs with three streams (AMD family 19h), for the tests.
#[cfg(test)]
pub(super) const ROWS16_PREFETCH_DISTANCES: (usize, usize, usize, usize) = (rows16::PREFETCH_INTEL, rows16::PREFETCH_AMD, rows16::PREFETCH_AVX2, rows16::PREFETCH_AVX2_STREAMS);

/// The rows16 kernels' prefetch distance for a table's flags. AVX-512: none with
/// `amd19` (Zen 4), Intel's with `intel`, AMD's non-temporal with `stream`, else AMD's.
/// AVX2 alone: Intel's with `intel` (its far hint into L2 as well), three streams with
/// `amd19` (Zen 3: `PREFETCH_AVX2_STREAMS`), else `PREFETCH_AVX2`.
const fn rows16_distance(flags: usize) -> usize {
    if flags & 1 == 0 {
        if flags & 8 != 0 {
            rows16::PREFETCH_INTEL
        } else if flags & 32 != 0 {
            rows16::PREFETCH_AVX2_STREAMS
        } else {
            rows16::PREFETCH_AVX2
        }
    } else if flags & 32 != 0 {
        0
    } else if flags & 8 != 0 {
        rows16::PREFETCH_INTEL
    } else if flags & 64 != 0 {
        rows16::PREFETCH_AMD_STREAM
    } else {
        rows16::PREFETCH_AMD
    }
}

/// `t` (one of [`TABLES`]) with its 8-row kernels' far prefetch at the other cache level
/// (L1 or L2; the same bits, another speed): what tests run to cover both variants on
/// any CPU. `None` for a table not in [`TABLES`].
#[cfg(test)]
pub(crate) fn other_prefetch(t: &'static KernelTable) -> Option<&'static KernelTable> {
    table_of(flags_of(t)? ^ 16)
}

/// Whether `t`'s 8-row kernels prefetch far ahead into L1 (`small_l1` clear).
#[cfg(test)]
pub(crate) fn prefetches_far_into_l1(t: &'static KernelTable) -> bool {
    flags_of(t).is_some_and(|f| f & 16 == 0)
}

/// Whether `t`'s AVX-512 value updates round through memory (the `intel` flag).
#[cfg(test)]
pub(crate) fn rounds_via_memory(t: &'static KernelTable) -> bool {
    flags_of(t).is_some_and(|f| f & 9 == 9)
}

/// True if CPUID's vendor is Intel: the AVX-512 value updates then round their f16
/// accumulators through memory ([`f16_round_to`]; the same bits, a different speed), and
/// the rows16 kernels (AVX-512 and AVX2 alike) prefetch their weights
/// `rows16::PREFETCH_INTEL` ahead.
fn cpu_is_intel() -> bool {
    // SAFETY: CPUID leaf 0 exists on every x86_64 CPU.
    let l0 = unsafe { __cpuid(0) };
    (l0.ebx, l0.edx, l0.ecx) == (u32::from_le_bytes(*b"Genu"), u32::from_le_bytes(*b"ineI"), u32::from_le_bytes(*b"ntel"))
}

/// True on an AMD CPU of family 19h (Zen 3 and Zen 4; with AVX-512, Zen 4), the table's
/// `amd19` flag: its AVX-512 rows16 kernels ask for no weights ahead, where they made
/// decode slower (`rows16::PREFETCH_INTEL`), and its AVX2 ones read one token's groups as
/// three streams (`rows16::PREFETCH_AVX2_STREAMS`).
fn cpu_is_amd_family_19h() -> bool {
    // SAFETY: CPUID leaf 1 exists on every x86_64 CPU.
    cpu_is_amd() && cpuid_family(unsafe { __cpuid(1) }.eax) == 0x19
}

/// The display family of CPUID leaf 1's EAX (base family, plus the extended family
/// where the base is 0Fh).
pub(super) const fn cpuid_family(eax: u32) -> u32 {
    let base = (eax >> 8) & 0xF;
    if base == 0xF { base + ((eax >> 20) & 0xFF) } else { base }
}

/// A table's flags: `avx512 | vnni << 1 | fp16 << 2 | intel << 3 | small_l1 << 4 | amd19
/// << 5 | stream << 6` (`small_l1`: an L1 data cache under [`FAR_L1_MIN_L1D`]; `amd19`:
/// [`cpu_is_amd_family_19h`], with AVX-512 rows16 kernels without prefetch hints, with
/// AVX2 alone three streams; `stream`: AMD's AVX-512 hints non-temporal, [`streaming`]).
/// `vnni` only ever comes with `avx512` ([`table`]; `intel` with or without it), `amd19`
/// without `avx512` only without `intel` (the tests' twins give it with both on
/// AVX-512), `stream` only with `avx512` and neither `intel` nor `amd19`: 52 of the 128
/// values are tables.
const FLAG_VALUES: usize = 128;

/// Whether `flags` names a table: `vnni` only with `avx512`, `amd19` without it only
/// without `intel`, and `stream` only with `avx512` and neither `intel` nor `amd19`.
const fn is_table(flags: usize) -> bool {
    flags < FLAG_VALUES && (flags & 1 != 0 || (flags & 2 == 0 && flags & (8 | 32) != (8 | 32))) && (flags & 64 == 0 || (flags & 1 != 0 && flags & (8 | 32) == 0))
}

/// How many flag values name a table.
const N_TABLES: usize = {
    let (mut n, mut f) = (0, 0);
    while f < FLAG_VALUES {
        n += is_table(f) as usize;
        f += 1;
    }
    n
};

const _: () = assert!(N_TABLES == 52, "12 tables without AVX-512 (fp16, small_l1, intel or amd19 or neither), 32 with, 8 streaming");

/// The flags of each of [`TABLES`], in order.
static TABLE_FLAGS: [u8; N_TABLES] = {
    let (mut t, mut n, mut f) = ([0u8; N_TABLES], 0, 0);
    while f < FLAG_VALUES {
        if is_table(f) {
            t[n] = f as u8;
            n += 1;
        }
        f += 1;
    }
    t
};

/// The table of every set of flags that names one (in [`TABLE_FLAGS`]' order; 52 rather
/// than 128, since each is ~4 KiB of function pointers in every binary).
static TABLES: [KernelTable; N_TABLES] = {
    let mut t = [REFERENCE; N_TABLES];
    let mut i = 0;
    while i < N_TABLES {
        t[i] = build(TABLE_FLAGS[i] as usize);
        i += 1;
    }
    t
};

/// The table of `flags`, `None` where they name none ([`is_table`]).
fn table_of(flags: usize) -> Option<&'static KernelTable> {
    if !is_table(flags) {
        return None;
    }
    TABLE_FLAGS.iter().position(|&f| usize::from(f) == flags).map(|i| &TABLES[i])
}

/// `t` with its AVX-512 rows16 kernels' prefetch hints non-temporal
/// (`rows16::PREFETCH_AMD_STREAM`), where `t` has AMD's distance: `None` for any other
/// table (no AVX-512, Intel's distance or none, or already streaming).
pub(crate) fn streaming(t: &'static KernelTable) -> Option<&'static KernelTable> {
    let f = flags_of(t)?;
    if f & 64 == 0 { table_of(f | 64) } else { None }
}

/// The L3 cache's size in bytes as CPUID's cache topology leaf reports it on AMD (0x8000_001D,
/// the level-3 subleaf: ways × partitions × line × sets, one core complex's L3, as Linux's
/// sysfs gives it; leaf 0x8000_0006's L3 field is the whole socket's on an EPYC: 384 MiB
/// on the Zen 5 VM, whose core complex has 32); `None` elsewhere or where none is reported.
pub(crate) fn cpu_l3_bytes_amd() -> Option<usize> {
    // SAFETY: leaf 0x8000_0000 exists on every x86_64 CPU (long mode is reported there).
    if !cpu_is_amd() || unsafe { __cpuid(0x8000_0000) }.eax < 0x8000_001D {
        return None;
    }
    // SAFETY: the leaf exists (checked above).
    unsafe { cache_bytes(0x8000_001D, 3) }
}

/// The flags of `t`, `None` for a table not in [`TABLES`].
fn flags_of(t: &'static KernelTable) -> Option<usize> {
    TABLES.iter().position(|x| core::ptr::eq(x, t)).map(|i| usize::from(TABLE_FLAGS[i]))
}

/// The reference's table with every kernel this module has for `flags` (see
/// [`TABLES`]) in its place.
const fn build(flags: usize) -> KernelTable {
    let (avx512, vnni, fp16, intel) = (flags & 1 != 0, flags & 2 != 0, flags & 4 != 0, flags & 8 != 0);
    let far_l1 = flags & 16 == 0;
    let r16_pf = rows16_distance(flags);
    // An 8-row kernel with its far prefetch into L1 (`far_l1`) or L2.
    macro_rules! rows {
        ($f:ident) => {
            if far_l1 { $f::<true> as super::DotRowsFn } else { $f::<false> }
        };
    }
    let mut t = REFERENCE;
    t.name = match (vnni, fp16) {
        (true, true) => "avx2+vnni+fp16",
        (true, false) => "avx2+vnni",
        (false, true) => "avx2+fp16",
        (false, false) => "avx2",
    };
    t.dot = vec_dots!();
    t.dot_lanes.q4_0 = Some(vec_dot_q4_0_q8_0_lanes);
    t.dot_gemm.q2_k = Some(vec_dot_q2_k_q8_k_gemm);
    t.dot_gemm.q4_k = Some(vec_dot_q4_k_q8_k_gemm);
    t.dot_tiled.q2_k = Some(vec_dot_q2_k_q8_k_tiled);
    t.dot_tiled.q3_k = Some(vec_dot_q3_k_q8_k_tiled);
    t.dot_tiled.q4_k = Some(vec_dot_q4_k_q8_k_tiled);
    t.dot_tiled.q5_k = Some(vec_dot_q5_k_q8_k_tiled);
    t.dot_tiled.q6_k = Some(vec_dot_q6_k_q8_k_tiled);

    // 8-row dots and tiles: the AVX-512 VNNI ones where `vnni` and they exist.
    t.dot_rows.q4_0 = Some(if vnni { rows!(rows_q4_0_q8_0_vnni) } else { rows!(rows_q4_0_q8_0) });
    t.dot_rows.q8_0 = Some(if vnni { rows!(rows_q8_0_q8_0_vnni) } else { rows!(rows_q8_0_q8_0) });
    t.dot_rows.q5_0 = Some(if vnni { rows!(rows_q5_0_q8_0_vnni) } else { rows!(rows_q5_0_q8_0) });
    t.dot_rows.q4_1 = Some(if vnni { rows!(rows_q4_1_q8_1_vnni) } else { rows!(rows_q4_1_q8_1) });
    t.dot_rows.q5_1 = Some(if vnni { rows!(rows_q5_1_q8_1_vnni) } else { rows!(rows_q5_1_q8_1) });
    t.dot_rows.q4_k = if vnni { Some(rows!(rows_q4_k_q8_k_vnni)) } else { None };
    t.dot_rows.iq4_nl = Some(rows!(rows_iq4_nl_q8_0));
    if vnni {
        // (The group kernels' prefetch distance by CPU: `rows16::PREFETCH_INTEL`.)
        macro_rules! r16 {
            ($f:ident) => {
                Some(match r16_pf {
                    rows16::PREFETCH_INTEL => $f::<{ rows16::PREFETCH_INTEL }> as super::rows16::Rows16Fn,
                    rows16::PREFETCH_AMD => $f::<{ rows16::PREFETCH_AMD }>,
                    rows16::PREFETCH_AMD_STREAM => $f::<{ rows16::PREFETCH_AMD_STREAM }>,
                    _ => $f::<0>,
                })
            };
        }
        t.dot_rows16.q4_1 = r16!(rows16_q4_1_q8_1);
        t.dot_rows16.q8_0 = r16!(rows16_q8_0_q8_0);
        t.dot_rows16.q4_0 = r16!(rows16_q4_0_q8_0);
        t.dot_rows16.q5_0 = r16!(rows16_q5_0_q8_0);
        t.dot_rows16.q4_k = r16!(rows16_q4_k_q8_k);
        t.dot_rows16_gemm.q4_k = r16!(rows16_q4_k_q8_k_gemm);
        t.dot_rows16.q6_k = r16!(rows16_q6_k_q8_k);
        t.dot_rows16_tiled.q6_k = r16!(rows16_q6_k_q8_k_tiled);
        t.dot_tile_rows16.q5_0 = DotTile::entry_with_rest(tile_q5_0_q8_0_lanes_rows16, LANES_TILE_ROWS, LANES_TILE_TOKENS, tile_q5_0_q8_0_lanes16_rows16, LANES_REST_TOKENS);
        t.dot_tile_rows16.q8_0 = DotTile::entry_with_rest(tile_q8_0_q8_0_lanes_rows16, LANES_TILE_ROWS, LANES_TILE_TOKENS, tile_q8_0_q8_0_lanes16_rows16, LANES_REST_TOKENS);
    } else {
        // AVX2 only: Q4_1, Q4_0, Q8_0, Q5_0 and Q4_K in the layout (rows in lanes without
        // transposing; Q6_K's AVX2 kernels have none yet), with Intel's hints on Intel.
        macro_rules! r16_avx2 {
            ($f:ident) => {
                Some(match r16_pf {
                    rows16::PREFETCH_INTEL => $f::<{ rows16::PREFETCH_INTEL }> as super::rows16::Rows16Fn,
                    rows16::PREFETCH_AVX2_STREAMS => $f::<{ rows16::PREFETCH_AVX2_STREAMS }>,
                    _ => $f::<{ rows16::PREFETCH_AVX2 }>,
                })
            };
        }
        t.dot_rows16.q4_1 = r16_avx2!(rows16_q4_1_q8_1_avx2);
        t.dot_tile_rows16.q4_1 = DotTile::entry_with_rest(tile_q4_1_q8_1_lanes8_rows16, 16, LANES8_TILE_TOKENS, tile_q4_1_q8_1_lanes8_rest_rows16, LANES8_REST_TOKENS);
        t.dot_rows16.q4_0 = r16_avx2!(rows16_q4_0_q8_0_avx2);
        t.dot_tile_rows16.q4_0 = DotTile::entry_with_rest(tile_q4_0_q8_0_wide_rows16, 16, Q4_0_WIDE_TILE_TOKENS, tile_q4_0_q8_0_rows16, Q4_0_TILE_TOKENS);
        t.dot_rows16.q8_0 = r16_avx2!(rows16_q8_0_q8_0_avx2);
        t.dot_tile_rows16.q8_0 = DotTile::entry_with_rest(tile_q8_0_q8_0_lanes8_rows16, 16, LANES8_TILE_TOKENS, tile_q8_0_q8_0_lanes8_rest_rows16, LANES8_REST_TOKENS);
        t.dot_rows16.q5_0 = r16_avx2!(rows16_q5_0_q8_0_avx2);
        t.dot_tile_rows16.q5_0 = DotTile::entry_with_rest(tile_q5_0_q8_0_lanes8_rows16, 16, LANES8_TILE_TOKENS, tile_q5_0_q8_0_lanes8_rest_rows16, LANES8_REST_TOKENS);
        t.dot_rows16.q4_k = r16_avx2!(rows16_q4_k_q8_k_avx2);
        t.dot_tile_rows16.q4_k = DotTile::entry_with_rest(tile_q4_k_q8_k_lanes8_rows16, 16, kdot::KLANES8_TOKENS, tile_q4_k_q8_k_lanes8_rest_rows16, kdot::KLANES8_REST_TOKENS);
        t.dot_rows16_gemm.q4_k = r16_avx2!(rows16_q4_k_q8_k_gemm_avx2);
    }
    // Plain rows' second hint into L2 where the rows16 kernels take Intel's far one.
    t.plain_far_l2 = if r16_pf == rows16::PREFETCH_INTEL { rows16::PREFETCH_FAR_L2 } else { 0 };
    t.dot_rows.mxfp4 = Some(rows!(rows_mxfp4_q8_0));
    let tile_tokens = if vnni { ZMM_TILE_TOKENS } else { TILE_TOKENS };
    t.dot_pairs.q8_0 = if vnni { Some(pairs_q8_0_q8_0_vnni) } else { None };
    t.dot_tile.q8_0 = if vnni { DotTile::entry_with_rest(tile_q8_0_q8_0_lanes, LANES_TILE_ROWS, LANES_TILE_TOKENS, tile_q8_0_q8_0_lanes16, LANES_REST_TOKENS) } else { DotTile::entry_with_rest(tile_q8_0_q8_0_lanes8, LANES8_TILE_ROWS, LANES8_TILE_TOKENS, tile_q8_0_q8_0_lanes8_rest, LANES8_REST_TOKENS) };
    t.dot_tile.q5_0 = if vnni { DotTile::entry_with_rest(tile_q5_0_q8_0_lanes, LANES_TILE_ROWS, LANES_TILE_TOKENS, tile_q5_0_q8_0_lanes16, LANES_REST_TOKENS) } else { DotTile::entry_with_rest(tile_q5_0_q8_0_lanes8, LANES8_TILE_ROWS, LANES8_TILE_TOKENS, tile_q5_0_q8_0_lanes8_rest, LANES8_REST_TOKENS) };
    t.dot_tile.q4_1 = if vnni { DotTile::entry(tile_q4_1_q8_1_vnni, TILE_ROWS, tile_tokens) } else { DotTile::entry_with_rest(tile_q4_1_q8_1_lanes8, LANES8_TILE_ROWS, LANES8_TILE_TOKENS, tile_q4_1_q8_1_lanes8_rest, LANES8_REST_TOKENS) };
    // (With VNNI, 32 tokens per tile and the 16-token tile for the rest of a chunk.)
    t.dot_tile.q4_0 = if vnni {
        DotTile::entry_with_rest(tile_q4_0_q8_0_vnni32, Q4_0_TILE_ROWS, Q4_0_TILE_TOKENS_VNNI32, tile_q4_0_q8_0_vnni, Q4_0_TILE_TOKENS_VNNI)
    } else {
        DotTile::entry_with_rest(tile_q4_0_q8_0_wide, Q4_0_TILE_ROWS, Q4_0_WIDE_TILE_TOKENS, tile_q4_0_q8_0, Q4_0_TILE_TOKENS)
    };
    t.dot_tile.q4_k = if vnni {
        DotTile::entry(tile_q4_k_q8_k_vnni, Q4_K_TILE_ROWS, Q4_K_TILE_TOKENS)
    } else {
        DotTile::entry_with_rest(tile_q4_k_q8_k_lanes8, kdot::KLANES8_ROWS, kdot::KLANES8_TOKENS, tile_q4_k_q8_k_lanes8_rest, kdot::KLANES8_REST_TOKENS)
    };
    // (With VNNI, 16 tokens per tile and the AVX2 tile of 4 for the rest of a chunk.)
    t.dot_tile.q6_k = if vnni {
        DotTile::entry_with_rest(tile_q6_k_q8_k_vnni, 1, kdot::Q6_K_NATIVE_TOKENS, tile_q6_k_q8_k, KTILE_TOKENS)
    } else {
        DotTile::entry_with_rest(tile_q6_k_q8_k_lanes8, kdot::KLANES8_ROWS, kdot::KLANES8_TOKENS, tile_q6_k_q8_k_lanes8_rest, kdot::KLANES8_REST_TOKENS)
    };
    // Tiles in llama.cpp's batch orders (`Kernels::dot_tile_in_batch`).
    t.tile_gemm.q4_k = if vnni {
        DotTile::entry(tile_q4_k_q8_k_gemm_vnni, Q4_K_TILE_ROWS, Q4_K_TILE_TOKENS)
    } else {
        DotTile::entry(tile_q4_k_q8_k_gemm, 1, KTILE_TOKENS)
    };
    t.tile_tiled.q4_k = DotTile::entry(tile_q4_k_q8_k_tiled, 1, KTILE_TOKENS);
    t.tile_tiled.q6_k = if vnni {
        DotTile::entry(tile_q6_k_q8_k_tiled_vnni, kdot::Q6_K_TILE_ROWS, kdot::Q6_K_TILE_TOKENS)
    } else {
        DotTile::entry(tile_q6_k_q8_k_tiled, 1, KTILE_TOKENS)
    };

    // (F32 and BF16 activations: the reference's conversion.)
    t.quantize.f16 = Some(convert_f16);
    t.quantize.q8_0 = Some(quantize_q8::<false>);
    t.quantize.q8_1 = Some(quantize_q8::<true>);
    t.quantize.q8_k = Some(quantize_q8_k);

    t.rope = act::rope;
    t.swiglu = act::swiglu;
    t.geglu = act::geglu;
    t.expf_batch = if avx512 { entry::expf_batch::<true> } else { entry::expf_batch::<false> };

    t.f16_dot = f16ops::dot;
    t.f16_mad = if fp16 { entry::mad::<true> } else { entry::mad::<false> };
    t.f16_scale = f16ops::scale;
    t.f32_to_f16 = f16ops::to_f16;
    t.f16_to_f32 = f16ops::to_f32;
    if avx512 {
        t.f16_rows_to_f32 = entry::rows_to_f32;
    }
    t.f16_dot_keys = if avx512 { entry::dot_keys::<true> } else { entry::dot_keys::<false> };
    t.f16_mad_keys = if fp16 { entry::mad_keys::<true> } else { entry::mad_keys::<false> };
    t.f16_dot_keys_heads = if avx512 { entry::dot_keys_heads::<true> } else { entry::dot_keys_heads::<false> };
    t.f16_dot_keys_queries = if avx512 { Some(f16ops::dot_keys_queries) } else { None };
    t.f16_mad_keys_heads = match (avx512, fp16, intel) {
        (true, true, true) => entry::mad_keys_heads::<true, true, true>,
        (true, true, false) => entry::mad_keys_heads::<true, true, false>,
        (true, false, true) => entry::mad_keys_heads::<true, false, true>,
        (true, false, false) => entry::mad_keys_heads::<true, false, false>,
        (false, true, _) => entry::mad_keys_heads::<false, true, false>,
        (false, false, _) => entry::mad_keys_heads::<false, false, false>,
    };
    t.f32_mad_keys_heads = match (avx512, intel) {
        (true, true) => Some(entry::f32_mad_keys_heads::<true>),
        (true, false) => Some(entry::f32_mad_keys_heads::<false>),
        (false, _) => None,
    };
    // The K·Q inside the value update only where that update's f16 conversions leave
    // the FMA units idle (AMD Zen: separate pipes; measured on Zen 5). On Intel cores the
    // conversions take the FMA ports (0 and 5), so there the block's scores come first,
    // as before (`f16_dot_keys_queries`; not measured on Intel either way).
    if avx512 && !intel {
        t.f16_keys_transposed = Some(f16ops::keys_transposed64);
        t.f32_dot_transposed = Some(f16ops::dot_transposed64);
        t.f32_mad_keys_heads_dot = Some(entry::f32_mad_keys_heads_dot);
    }
    t.softmax_scores = if avx512 { f16ops::softmax_scores } else { f16ops::softmax_scores_avx2 };
    t.softmax_sum = f16ops::softmax_sum;
    t.softmax_sums = |_, sums, new_max, e| f16ops::softmax_sums(sums, new_max, e);
    t.tiled_step = if avx512 { tiled::step_avx512 } else { tiled::step_avx2 };
    t.tiled_step_heads = if avx512 { Some(tiled::step_heads_avx512) } else { None };
    t
}

/// Table entries for the functions above that take a flag (fixed here: `FP16` only in a
/// table built after `cpu_has_avx512_fp16()`, `AVX512` after `cpu_has_avx512()`) or
/// take only some shapes (the others go to the reference's loop, which calls this
/// table's per-key kernels).
mod entry {
    use super::{act, f16ops};
    use crate::quant::{mad_keys_by_head, dot_keys_by_head, KernelTable};
    use half::f16;

    pub(super) fn expf_batch<const AVX512: bool>(x: &mut [f32]) {
        act::expf_batch(x, AVX512)
    }

    pub(super) fn mad<const FP16: bool>(y: &mut [f16], x: &[f16], v: f32) {
        f16ops::mad(y, x, v, FP16)
    }

    pub(super) fn dot_keys<const AVX512: bool>(_: &KernelTable, k: &[f16], offs: &[usize], q: &[f16], out: &mut [f32]) {
        f16ops::dot_keys(k, offs, q, out, AVX512)
    }

    pub(super) fn mad_keys<const FP16: bool>(_: &KernelTable, y: &mut [f16], x: &[f16], offs: &[usize], new_max: &[bool], e: &[f32]) {
        f16ops::mad_keys(y, x, offs, new_max, e, FP16)
    }

    /// The grouped K·Q dots for rows and head counts they take.
    pub(super) fn dot_keys_heads<const AVX512: bool>(t: &KernelTable, k: &[f16], offs: &[usize], qs: &[f16], n: usize, heads: usize, out: &mut [f32]) {
        if f16ops::dot_keys_heads_fits(n, AVX512) && (1..=4).contains(&heads) {
            f16ops::dot_keys_heads(k, offs, qs, n, heads, out, AVX512)
        } else {
            dot_keys_by_head(t, k, offs, qs, n, heads, out)
        }
    }

    /// Rows of whole 16-element vectors by AVX-512 (tables with it only), others row by row.
    pub(super) fn rows_to_f32(t: &KernelTable, src: &[f16], offs: &[usize], n: usize, dst: &mut [f32]) {
        if n.is_multiple_of(16) {
            f16ops::rows_to_f32_avx512(src, offs, n, dst)
        } else {
            crate::quant::rows_to_f32_by_row(t, src, offs, n, dst)
        }
    }

    /// The grouped value updates over f32 value rows: rows of 64, up to 4 heads (tables
    /// with AVX-512 only).
    pub(super) fn f32_mad_keys_heads<const VIA: bool>(ys: &mut [f16], n: usize, heads: usize, xf: &[f32], new_max: &[bool], e: &[f32], sums: &mut [f32]) -> bool {
        if n != 64 || !(1..=4).contains(&heads) {
            return false;
        }
        f16ops::mad_keys_heads64_f32(ys, heads, xf, new_max, e, sums, VIA);
        true
    }

    /// [`f16ops::mad_keys_heads64_f32_dot`] (non-Intel tables: the register round trip).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn f32_mad_keys_heads_dot(ys: &mut [f16], heads: usize, xf: &[f32], new_max: &[bool], e: &[f32], sums: &mut [f32], kt: &[f32], keys: usize, qs: &[f16], out: &mut [f32]) -> bool {
        f16ops::mad_keys_heads64_f32_dot(ys, heads, xf, new_max, e, sums, kt, keys, qs, out)
    }

    /// The grouped value updates for rows of 64 and up to 4 heads, and without
    /// AVX512-FP16 for rows of whole 128-element steps (the exact f16 accumulator in f32
    /// lanes; with it, `mad_keys`' `vfmadd231ph` head by head).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mad_keys_heads<const AVX512: bool, const FP16: bool, const VIA: bool>(t: &KernelTable, ys: &mut [f16], n: usize, heads: usize, x: &[f16], offs: &[usize], new_max: &[bool], e: &[f32], sums: &mut [f32]) {
        if n == 64 && heads <= 4 {
            f16ops::mad_keys_heads64(ys, heads, x, offs, new_max, e, sums, AVX512, VIA)
        } else if !FP16 && f16ops::mad_keys_heads_exact_fits(n) && (1..=4).contains(&heads) {
            f16ops::mad_keys_heads_exact(ys, n, heads, x, offs, new_max, e, sums, AVX512, VIA)
        } else {
            mad_keys_by_head(t, ys, n, heads, x, offs, new_max, e, sums)
        }
    }
}

// ---------------------------------------------------------------- helpers

/// 16 f16 at `p` converted to f32 by `vcvtph2ps` with a memory operand. The intrinsic
/// `_mm512_cvtph_ps` is always the register form (it carries `{sae}`, which a memory
/// operand cannot), a load and then a conversion that takes a shuffle port as well on
/// Intel cores; the memory form leaves the conversion's second half to the load, which
/// frees that port for the kernels' other work (measured: the 64-wide value update
/// of three heads ~15% faster). Same values: every f16 converts exactly.
///
/// # Safety
/// AVX-512 F present; 32 bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(super) unsafe fn cvtph_ps_m512(p: *const u16) -> __m512 {
    let r: __m512;
    // SAFETY: the caller's contract (32 bytes at p, AVX-512 F); reads only.
    unsafe { core::arch::asm!("vcvtph2ps {r}, ymmword ptr [{p}]", r = out(zmm_reg) r, p = in(reg) p, options(nostack, readonly, preserves_flags)) };
    r
}

/// The stack slots of [`f16_round_via`]: 16 chains' 16 f16 each, 64-byte aligned so that
/// no slot straddles a cache line (a split store is not forwarded to its load: with an
/// unaligned array the value update of three 64-wide heads took 2.3x as long in one of
/// two otherwise identical builds).
#[repr(C, align(64))]
pub(super) struct RoundSlots([u16; 16 * 16]);

impl RoundSlots {
    pub(super) fn new() -> Self {
        Self([0; 16 * 16])
    }

    /// Chain `i`'s slot (`i < 16`).
    #[inline(always)]
    pub(super) fn at(&mut self, i: usize) -> *mut u16 {
        self.0[16 * i..16 * (i + 1)].as_mut_ptr()
    }
}

/// `v` rounded to f16 (nearest, ties to even; overflow to infinity) and back to f32,
/// through `slot`: `vcvtps2ph` stores the f16 there and [`cvtph_ps_m512`] reads them
/// back, so the widening takes the load port instead of a shuffle port (the register
/// round trip's two conversions both take one). Same bits as
/// `_mm512_cvtph_ps(_mm512_cvtps_ph(v))`; the store-to-load forwarding adds latency,
/// so it pays where enough independent chains run side by side.
///
/// # Safety
/// AVX-512 F present; 32 bytes writable at `slot` (a [`RoundSlots`] slot), which nothing
/// else uses meanwhile.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(super) unsafe fn f16_round_via(v: __m512, slot: *mut u16) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe {
        _mm256_storeu_si256(slot.cast(), _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
        cvtph_ps_m512(slot)
    }
}

/// `v` rounded to f16 and back to f32 as the value updates' chains do it: with `VIA`
/// through chain `i`'s slot of `slots` ([`f16_round_via`]), else by the register round
/// trip `_mm512_cvtph_ps(_mm512_cvtps_ph(v))`. Same bits either way; which is faster is
/// the core's: on Intel (Sapphire Rapids, 2026-11-26) the slot's load-port widening made
/// the 64-wide update ~30% faster, on AMD Zen 5 (2026-11-29) the register trip made
/// SmolLM2 Q4_0's prompt at depth 4096 ~14% faster (BENCHMARKS.md). [`build`] picks by
/// the table's `intel` flag (CPUID's vendor).
///
/// # Safety
/// AVX-512 F present; `i < 16`.
#[inline(always)]
pub(super) unsafe fn f16_round_to<const VIA: bool>(v: __m512, slots: &mut RoundSlots, i: usize) -> __m512 {
    // SAFETY: the caller's contract; the slot is this chain's alone.
    unsafe {
        if VIA {
            f16_round_via(v, slots.at(i))
        } else {
            _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_ps(v: __m256) -> f32 {
    // SAFETY: value-only intrinsics; the caller has AVX2, FMA and F16C (this fn's target features).
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    // SAFETY: value-only intrinsics; the caller has AVX2, FMA and F16C (this fn's target features).
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s)))
    }
}

#[inline]
unsafe fn rd16(p: *const u8) -> i16 {
    // SAFETY: the caller guarantees 2 readable bytes at p.
    unsafe { core::ptr::read_unaligned(p.cast::<i16>()) }
}

#[inline]
unsafe fn rd32(p: *const u8) -> i32 {
    // SAFETY: the caller guarantees 4 readable bytes at p.
    unsafe { core::ptr::read_unaligned(p.cast::<i32>()) }
}

// ---------------------------------------------------------------- float dots

/// Shared loop of the float dots: `load(p, i)` gives 8 f32 from element i of row p;
/// 32 elements per iteration in 4 accumulators, then 8 at a time, then a scalar tail.
macro_rules! float_dot {
    ($n:expr, $w:expr, $a:expr, |$p:ident, $i:ident| $load:expr, |$q:ident, $j:ident| $scalar:expr) => {{
        let (n, w, a) = ($n, $w, $a);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, acc) in acc.iter_mut().enumerate() {
                let x = { let ($p, $i) = (w, i + 8 * k); $load };
                let y = { let ($p, $i) = (a, i + 8 * k); $load };
                *acc = _mm256_fmadd_ps(x, y, *acc);
            }
            i += 32;
        }
        while i + 8 <= n {
            let x = { let ($p, $i) = (w, i); $load };
            let y = { let ($p, $i) = (a, i); $load };
            acc[0] = _mm256_fmadd_ps(x, y, acc[0]);
            i += 8;
        }
        let mut sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
        while i < n {
            let x = { let ($q, $j) = (w, i); $scalar };
            let y = { let ($q, $j) = (a, i); $scalar };
            sum += x * y;
            i += 1;
        }
        sum
    }};
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_f32(n: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: n f32 (4n bytes) readable at w and a; unaligned loads only.
    unsafe {
        float_dot!(n, w, a, |p, i| _mm256_loadu_ps(p.add(4 * i).cast()),
            |p, i| core::ptr::read_unaligned(p.add(4 * i).cast::<f32>()))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_f16(n: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: n f16 (2n bytes) readable at w and a; unaligned loads only.
    unsafe {
        float_dot!(n, w, a, |p, i| _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i).cast())),
            |p, i| f16_to_f32(rd16(p.add(2 * i)) as u16))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bf16_bf16(n: usize, w: *const u8, a: *const u8) -> f32 {
    // SAFETY: n bf16 (2n bytes) readable at w and a; unaligned loads only.
    unsafe {
        float_dot!(n, w, a,
            |p, i| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(2 * i).cast())))),
            |p, i| bf16_to_f32(rd16(p.add(2 * i)) as u16))
    }
}

// ---------------------------------------------------------------- activations

/// f32 activations → Q8_0 (`WITH_SUM = false`, 34-byte blocks) or Q8_1 (36-byte
/// blocks); whole blocks only. Same bytes as `quantize::quantize_act_q8_*`.
pub(crate) fn quantize_q8<const WITH_SUM: bool>(x: &[f32], out: &mut [u8]) {
    let with_sum = WITH_SUM;
    let size = if with_sum { 36 } else { 34 };
    let nb = (x.len() / 32).min(out.len() / size);
    // SAFETY: only called after cpu_has_avx2_fma() (module contract); nb blocks of
    // input (32 f32) and output (`size` bytes) are inside `x` and `out`.
    unsafe { quantize_q8_avx2(nb, x.as_ptr(), out.as_mut_ptr(), with_sum) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_avx2(nb: usize, x: *const f32, out: *mut u8, with_sum: bool) {
    // SAFETY: nb blocks in bounds (caller); unaligned loads and stores only.
    unsafe {
        let size = if with_sum { 36 } else { 34 };
        let sign = _mm256_set1_ps(-0.0);
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for b in 0..nb {
            let (xp, op) = (x.add(32 * b), out.add(size * b));
            let v = [_mm256_loadu_ps(xp), _mm256_loadu_ps(xp.add(8)), _mm256_loadu_ps(xp.add(16)), _mm256_loadu_ps(xp.add(24))];
            let m = _mm256_max_ps(
                _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
            );
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let (i0, i1, i2, i3) = (round_i32(v[0], id), round_i32(v[1], id), round_i32(v[2], id), round_i32(v[3], id));
            let p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            let p = _mm256_permutevar8x32_epi32(p, order);
            let dh = _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d))) as u16;
            core::ptr::write_unaligned(op.cast::<[u8; 2]>(), dh.to_le_bytes());
            if with_sum {
                let sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
                let s = _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d * sum as f32))) as u16;
                core::ptr::write_unaligned(op.add(2).cast::<[u8; 2]>(), s.to_le_bytes());
            }
            _mm256_storeu_si256(op.add(size - 32).cast(), p);
        }
    }
}

/// `round_half_even(v * id)` as i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn round_i32(v: __m256, id: __m256) -> __m256i {
    // SAFETY: value-only intrinsics; the caller has AVX2, FMA and F16C (this fn's target features).
    unsafe { _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v, id))) }
}

/// Activations → Q8_K, the bytes of `quantize::quantize_act_q8_k` (ggml's
/// `quantize_row_q8_K`): per super-block of 256, the first element of largest magnitude
/// `max` (NaNs skipped), `iscale = -127 / max`, `q = min(nearest_int(iscale·x), 127)` by
/// the same magic-number rounding (so NaN and infinite inputs give the same bytes too),
/// the 16 sums of 16, `d = 1 / iscale`; an all-zero (or all-NaN) block stays zero.
pub(crate) fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    let nb = (x.len() / 256).min(out.len() / 292);
    // SAFETY: only called after cpu_has_avx2_fma() (module contract); nb super-blocks of
    // input (256 f32) and output (292 bytes) are inside `x` and `out`.
    unsafe { quantize_q8_k_avx2(nb, x.as_ptr(), out.as_mut_ptr()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_k_avx2(nb: usize, x: *const f32, out: *mut u8) {
    // SAFETY: nb super-blocks in bounds (caller); unaligned loads and stores only.
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for b in 0..nb {
            let (xp, op) = (x.add(256 * b), out.add(292 * b));
            // (A NaN as the first operand of max_ps yields the second: NaNs never win.)
            let mut m = _mm256_setzero_ps();
            for k in 0..32 {
                m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xp.add(8 * k))), m);
            }
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            if amax == 0.0 {
                core::ptr::write_bytes(op, 0, 292);
                continue;
            }
            let am = _mm256_set1_ps(amax);
            let mut first = 0;
            for k in 0..32 {
                let eq = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_andnot_ps(sign, _mm256_loadu_ps(xp.add(8 * k))), am));
                if eq != 0 {
                    first = 8 * k + eq.trailing_zeros() as usize;
                    break;
                }
            }
            let iscale = -127.0 / *xp.add(first);
            let is = _mm256_set1_ps(iscale);
            // nearest_int: (f + 1.5·2^23) bits & 0x7fffff, minus 0x400000.
            let (magic, mask, bias, top) = (_mm256_set1_ps(12_582_912.0), _mm256_set1_epi32(0x007f_ffff), _mm256_set1_epi32(0x0040_0000), _mm256_set1_epi32(127));
            let q = |k: usize| {
                let f = _mm256_add_ps(_mm256_mul_ps(is, _mm256_loadu_ps(xp.add(8 * k))), magic);
                _mm256_min_epi32(_mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(f), mask), bias), top)
            };
            let mut sums = [0i16; 16];
            for j in 0..8 {
                let (i0, i1, i2, i3) = (q(4 * j), q(4 * j + 1), q(4 * j + 2), q(4 * j + 3));
                // (Every q is within -128..=127 here — as i8 in the scalar code: the packs
                // below saturate nothing else.)
                let p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
                _mm256_storeu_si256(op.add(4 + 32 * j).cast(), _mm256_permutevar8x32_epi32(p, order));
                // The sums of elements 32j..32j+16 and 32j+16..32j+32, as the i8 values.
                let i8s = |v: __m256i| _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(v));
                let (a, c) = (_mm256_add_epi32(i8s(i0), i8s(i1)), _mm256_add_epi32(i8s(i2), i8s(i3)));
                let h = _mm256_hadd_epi32(a, c);
                let h = _mm256_hadd_epi32(h, h);
                let t = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
                sums[2 * j] = _mm_cvtsi128_si32(t) as i16;
                sums[2 * j + 1] = _mm_extract_epi32::<1>(t) as i16;
            }
            // (d, the 256 values and the 16 sums: all 292 bytes of the block written.)
            core::ptr::copy_nonoverlapping((1.0 / iscale).to_le_bytes().as_ptr(), op, 4);
            for (j, s) in sums.iter().enumerate() {
                core::ptr::copy_nonoverlapping(s.to_le_bytes().as_ptr(), op.add(260 + 2 * j), 2);
            }
        }
    }
}

/// f32 → f16 activations (round to nearest even), same bytes as the scalar conversion.
pub(crate) fn convert_f16(x: &[f32], out: &mut [u8]) {
    let n = x.len().min(out.len() / 2);
    // SAFETY: only called after cpu_has_avx2_fma() (module contract); n inputs and 2n
    // output bytes are in bounds.
    unsafe { convert_f16_avx2(n, x.as_ptr(), out.as_mut_ptr()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn convert_f16_avx2(n: usize, x: *const f32, out: *mut u8) {
    // SAFETY: n elements in bounds (caller); unaligned loads and stores only.
    unsafe {
        let mut i = 0;
        while i + 8 <= n {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x.add(i)));
            _mm_storeu_si128(out.add(2 * i).cast(), h);
            i += 8;
        }
        while i < n {
            let h = _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(*x.add(i)))) as u16;
            core::ptr::write_unaligned(out.add(2 * i).cast::<[u8; 2]>(), h.to_le_bytes());
            i += 1;
        }
    }
}

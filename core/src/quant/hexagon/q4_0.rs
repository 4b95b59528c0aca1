//! Q4_0 block sums, hand-pipelined: 6 packets per 512-byte tile (1.5 per 128
//! weight bytes, the floor for its 22 HVX instructions in 4-slot packets).
//!
//! Per tile: 4 nibble vectors `n0..n3` (vector `m`: low nibbles = elements
//! `4m..4m+4`, high nibbles = elements `16+4m..`, one int32 lane per row);
//! `l = n & 0x0f`, `h = n & 0xf0` (16 × the high code, masked in place);
//! `lo = Σ vrmpy(l_m, a_m)`, `hi = Σ vrmpy(h_m, a_{4+m})`; then
//! `lo += hi >> 4` (exact: `hi` is a multiple of 16) is the raw block sum.
//!
//! Modulo schedule, II = 6, two tiles (A: v10/v11, B: v12/v13) per loop trip so
//! each tile's tail (last high vrmpy, shift-accumulate and store) overlaps the
//! next tile's loads. Tile starting at packet s: loads with both masks (`.cur`)
//! at s..s+3; vrmpy at s+1, s+2, s+3, 2× s+4, 2× s+5, s+6; `lo += vasr(hi)` and
//! the store (`.new`) at s+10. Packets (A starts at 0, B at 6, B of the previous
//! trip finishes at 0 and 4):
//!
//! | p | load + masks | vrmpy | shift-acc + store |
//! |---|---|---|---|
//! | 0 | A n0 | B' h3·a7 | |
//! | 1 | A n1 | A l0·a0 | |
//! | 2 | A n2 | A h0·a4 | |
//! | 3 | A n3 | A l1·a1 | |
//! | 4 | | A h1·a5, l2·a2 | B' |
//! | 5 | | A h2·a6, l3·a3 | |
//! | 6 | B n0 | A h3·a7 | |
//! | 7–11 | as 1–5 for B | | A at 10 |
//!
//! The first trip is peeled (no B' work), the last B finishes after the loop,
//! and an odd last tile runs alone (8 packets, not in the loop).

use core::arch::asm;
use core::arch::hexagon::v128::HvxVector;

/// Load a nibble vector; its low nibbles (masked) into `$l`, high (masked in place) into `$h`.
macro_rules! ld {
    ($l:literal, $h:literal) => {
        concat!("v0.cur = vmem({t}++#1); ", $l, " = vand(v0,v14); ", $h, " = vand(v0,v15)")
    };
}

/// Raw block sums of `n_groups` Q4_0 tiles for one activation block.
///
/// # Safety
/// `tiles` points to `n_groups · 512` readable bytes and `out` to `n_groups · 128`
/// writable bytes, both 128-byte aligned; HVX (128-byte mode) is enabled.
#[inline(never)]
pub(super) unsafe fn q4_0_block_sums(tiles: *const HvxVector, n_groups: usize, a: &[u32; 8], out: *mut HvxVector) {
    let [a0, a1, a2, a3, a4, a5, a6, a7] = *a;
    let (mut t, mut o) = (tiles, out);
    let pairs = n_groups / 2;
    if pairs > 0 {
        // SAFETY: reads 2·pairs tiles (8 vectors each pair) from `t` and writes
        // 2·pairs vectors to `o`, within what the caller guarantees; clobbers
        // only the vector registers listed, p0 and hardware loop 0 (LC0/SA0),
        // which no caller keeps live across this non-inlined call.
        unsafe {
            asm!(
                "{{ v14 = vsplat({mlo}); v15 = vsplat({mhi}) }}",
                // Trip 0, peeled: no previous B to finish.
                concat!("{{ ", ld!("v1", "v5"), " }}"),
                concat!("{{ ", ld!("v2", "v6"), "; v10.w = vrmpy(v1.ub,{a0}.b) }}"),
                concat!("{{ ", ld!("v3", "v7"), "; v11.w = vrmpy(v5.ub,{a4}.b) }}"),
                concat!("{{ ", ld!("v4", "v8"), "; v10.w += vrmpy(v2.ub,{a1}.b) }}"),
                "{{ v11.w += vrmpy(v6.ub,{a5}.b); v10.w += vrmpy(v3.ub,{a2}.b) }}",
                "{{ v11.w += vrmpy(v7.ub,{a6}.b); v10.w += vrmpy(v4.ub,{a3}.b) }}",
                concat!("{{ ", ld!("v1", "v5"), "; v11.w += vrmpy(v8.ub,{a7}.b) }}"),
                concat!("{{ ", ld!("v2", "v6"), "; v12.w = vrmpy(v1.ub,{a0}.b) }}"),
                concat!("{{ ", ld!("v3", "v7"), "; v13.w = vrmpy(v5.ub,{a4}.b) }}"),
                concat!("{{ ", ld!("v4", "v8"), "; v12.w += vrmpy(v2.ub,{a1}.b) }}"),
                "{{ v13.w += vrmpy(v6.ub,{a5}.b); v12.w += vrmpy(v3.ub,{a2}.b); v10.w += vasr(v11.w,{sh}); vmem({o}++#1) = v10.new }}",
                "{{ v13.w += vrmpy(v7.ub,{a6}.b); v12.w += vrmpy(v4.ub,{a3}.b); p0 = cmp.eq({n},#0) }}",
                "{{ if (p0) jump 4f }}",
                "loop0(3f, {n})",
                ".falign",
                "3:",
                concat!("{{ ", ld!("v1", "v5"), "; v13.w += vrmpy(v8.ub,{a7}.b) }}"),
                concat!("{{ ", ld!("v2", "v6"), "; v10.w = vrmpy(v1.ub,{a0}.b) }}"),
                concat!("{{ ", ld!("v3", "v7"), "; v11.w = vrmpy(v5.ub,{a4}.b) }}"),
                concat!("{{ ", ld!("v4", "v8"), "; v10.w += vrmpy(v2.ub,{a1}.b) }}"),
                "{{ v11.w += vrmpy(v6.ub,{a5}.b); v10.w += vrmpy(v3.ub,{a2}.b); v12.w += vasr(v13.w,{sh}); vmem({o}++#1) = v12.new }}",
                "{{ v11.w += vrmpy(v7.ub,{a6}.b); v10.w += vrmpy(v4.ub,{a3}.b) }}",
                concat!("{{ ", ld!("v1", "v5"), "; v11.w += vrmpy(v8.ub,{a7}.b) }}"),
                concat!("{{ ", ld!("v2", "v6"), "; v12.w = vrmpy(v1.ub,{a0}.b) }}"),
                concat!("{{ ", ld!("v3", "v7"), "; v13.w = vrmpy(v5.ub,{a4}.b) }}"),
                concat!("{{ ", ld!("v4", "v8"), "; v12.w += vrmpy(v2.ub,{a1}.b) }}"),
                "{{ v13.w += vrmpy(v6.ub,{a5}.b); v12.w += vrmpy(v3.ub,{a2}.b); v10.w += vasr(v11.w,{sh}); vmem({o}++#1) = v10.new }}",
                "{{ v13.w += vrmpy(v7.ub,{a6}.b); v12.w += vrmpy(v4.ub,{a3}.b) }}:endloop0",
                "4:",
                // The last B.
                "{{ v13.w += vrmpy(v8.ub,{a7}.b) }}",
                "{{ v12.w += vasr(v13.w,{sh}); vmem({o}++#1) = v12.new }}",
                n = in(reg) pairs - 1,
                t = inout(reg) t,
                o = inout(reg) o,
                mlo = in(reg) 0x0f0f_0f0f_u32,
                mhi = in(reg) 0xf0f0_f0f0_u32,
                sh = in(reg) 4u32,
                a0 = in(reg) a0, a1 = in(reg) a1, a2 = in(reg) a2, a3 = in(reg) a3,
                a4 = in(reg) a4, a5 = in(reg) a5, a6 = in(reg) a6, a7 = in(reg) a7,
                out("v0") _, out("v1") _, out("v2") _, out("v3") _, out("v4") _,
                out("v5") _, out("v6") _, out("v7") _, out("v8") _,
                out("v10") _, out("v11") _, out("v12") _, out("v13") _, out("v14") _, out("v15") _,
                out("p0") _,
                options(nostack),
            );
        }
    }
    if n_groups % 2 == 1 {
        // SAFETY: one more tile at `t` and one vector at `o`, both inside what
        // the caller guarantees (the pairs advanced them by 2·pairs tiles).
        unsafe {
            asm!(
                "{{ v14 = vsplat({mlo}); v15 = vsplat({mhi}) }}",
                concat!("{{ ", ld!("v1", "v5"), " }}"),
                concat!("{{ ", ld!("v2", "v6"), "; v10.w = vrmpy(v1.ub,{a0}.b) }}"),
                concat!("{{ ", ld!("v3", "v7"), "; v11.w = vrmpy(v5.ub,{a4}.b) }}"),
                concat!("{{ ", ld!("v4", "v8"), "; v10.w += vrmpy(v2.ub,{a1}.b) }}"),
                "{{ v11.w += vrmpy(v6.ub,{a5}.b); v10.w += vrmpy(v3.ub,{a2}.b) }}",
                "{{ v11.w += vrmpy(v7.ub,{a6}.b); v10.w += vrmpy(v4.ub,{a3}.b) }}",
                "{{ v11.w += vrmpy(v8.ub,{a7}.b) }}",
                "{{ v10.w += vasr(v11.w,{sh}); vmem({o}+#0) = v10.new }}",
                t = inout(reg) t => _,
                o = in(reg) o,
                mlo = in(reg) 0x0f0f_0f0f_u32,
                mhi = in(reg) 0xf0f0_f0f0_u32,
                sh = in(reg) 4u32,
                a0 = in(reg) a0, a1 = in(reg) a1, a2 = in(reg) a2, a3 = in(reg) a3,
                a4 = in(reg) a4, a5 = in(reg) a5, a6 = in(reg) a6, a7 = in(reg) a7,
                out("v0") _, out("v1") _, out("v2") _, out("v3") _, out("v4") _,
                out("v5") _, out("v6") _, out("v7") _, out("v8") _,
                out("v10") _, out("v11") _, out("v14") _, out("v15") _,
                options(nostack),
            );
        }
    }
    // SAFETY: the `n_groups` result vectors the caller guarantees.
    unsafe { super::broken_zeros(out, n_groups) };
}

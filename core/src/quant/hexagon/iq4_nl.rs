//! IQ4_NL block sums: Q4_0's tile layout (`quant::tiles32`), but each
//! 4-bit code indexes ggml's 16-entry non-linear table `kvalues_iq4nl`. The
//! kernel splits every nibble vector into its low (`n & 0x0f`) and high
//! (`n >> 4`) code bytes, maps each code byte to `kvalues[code] + 128` (1..241,
//! an unsigned byte) with one `vlut32`, and feeds the bytes to
//! `vrmpy(Vu.ub, Rt.b)`. The sums are raw, `Σ (w + 128)·a`: the caller subtracts
//! `128·Σa` ([`IQ4_NL_BIAS`]), exactly as for Q8_0.
//!
//! `vlut32(Vu.b, Vv.b, #0)` reads, for an index byte `i < 32`, a byte of
//! halfword `i` of the table vector; the table stores each entry in both bytes
//! of halfwords `i`, `i + 16`, `i + 32`, `i + 48`, so every documented
//! byte-select variant reads the same value.
//!
//! Hand-pipelined (inline asm): one `vlut32` per packet is the bound (the
//! permute resource), 8 per 512-byte tile, so 8 packets per tile = 2.0 per 128
//! weight bytes. Modulo schedule, II = 8, two tiles per trip (A: accumulators
//! v10/v11, B: v12/v13). Tile starting at packet s: loads with mask and shift
//! (`.cur`) at s..s+3 (code bytes l0..l3 = v1..v4, h0..h3 = v5..v8); lookups
//! l0 h0 l1 h1 l2 h2 l3 h3 at s+1..s+8 (into v16..v19, v20..v23); vrmpy at s+4
//! (2), s+5 (2), s+6, s+7, s+14, s+15 (low codes into S, high into U); `S + U`
//! at s+20 and its store at s+21 (both in the next trip). The first trip is
//! peeled, the last pair finishes after the loop, an odd last tile runs alone.

use core::arch::asm;
use core::arch::hexagon::v128::HvxVector;

use crate::quant::blocks::KVALUES_IQ4NL;
use crate::quant::tiles32::IQ4_NL_BIAS;

/// The `vlut32` table vector (see the module docs).
#[repr(C, align(128))]
struct Table([u8; 128]);

static TABLE: Table = Table({
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = (KVALUES_IQ4NL[(i / 2) % 16] as i32 + IQ4_NL_BIAS) as u8;
        i += 1;
    }
    t
});

/// Load a nibble vector; its low code bytes into `$l`, high into `$h`.
macro_rules! ld {
    ($l:literal, $h:literal) => {
        concat!("v0.cur = vmem({t}++#1); ", $l, " = vand(v0,v15); ", $h, ".ub = vlsr(v0.ub,{sh})")
    };
}

/// Table lookup of the code bytes `$src` into `$dst`.
macro_rules! lut {
    ($dst:literal, $src:literal) => {
        concat!($dst, ".b = vlut32(", $src, ".b,v14.b,#0)")
    };
}

/// Raw block sums of `n_groups` IQ4_NL tiles for one activation block.
///
/// # Safety
/// `tiles` points to `n_groups · 512` readable bytes and `out` to `n_groups · 128`
/// writable bytes, both 128-byte aligned; HVX (128-byte mode) is enabled.
#[inline(never)]
pub(super) unsafe fn iq4_nl_block_sums(tiles: *const HvxVector, n_groups: usize, a: &[u32; 8], out: *mut HvxVector) {
    let [a0, a1, a2, a3, a4, a5, a6, a7] = *a;
    let tbl = TABLE.0.as_ptr();
    let (mut t, mut o) = (tiles, out);
    let pairs = n_groups / 2;
    if pairs > 0 {
        // SAFETY: reads 2·pairs tiles from `t` and the 128-byte table, writes
        // 2·pairs vectors to `o`, within what the caller guarantees; clobbers
        // only the vector registers listed, p0 and hardware loop 0 (LC0/SA0),
        // which no caller keeps live across this non-inlined call.
        unsafe {
            asm!(
                "{{ v14 = vmem({tbl}+#0); v15 = vsplat({mask}) }}",
                // Trip 0, peeled: nothing of a previous trip to finish.
                concat!("{{ ", ld!("v1", "v5"), " }}"),
                concat!("{{ ", ld!("v2", "v6"), "; ", lut!("v16", "v1"), " }}"),
                concat!("{{ ", ld!("v3", "v7"), "; ", lut!("v20", "v5"), " }}"),
                concat!("{{ ", ld!("v4", "v8"), "; ", lut!("v17", "v2"), " }}"),
                concat!("{{ ", lut!("v21", "v6"), "; v10.w = vrmpy(v16.ub,{a0}.b); v11.w = vrmpy(v20.ub,{a4}.b) }}"),
                concat!("{{ ", lut!("v18", "v3"), "; v10.w += vrmpy(v17.ub,{a1}.b); v11.w += vrmpy(v21.ub,{a5}.b) }}"),
                concat!("{{ ", lut!("v22", "v7"), "; v10.w += vrmpy(v18.ub,{a2}.b) }}"),
                concat!("{{ ", lut!("v19", "v4"), "; v11.w += vrmpy(v22.ub,{a6}.b) }}"),
                concat!("{{ ", ld!("v1", "v5"), "; ", lut!("v23", "v8"), " }}"),
                concat!("{{ ", ld!("v2", "v6"), "; ", lut!("v16", "v1"), " }}"),
                concat!("{{ ", ld!("v3", "v7"), "; ", lut!("v20", "v5"), " }}"),
                concat!("{{ ", ld!("v4", "v8"), "; ", lut!("v17", "v2"), " }}"),
                concat!("{{ ", lut!("v21", "v6"), "; v12.w = vrmpy(v16.ub,{a0}.b); v13.w = vrmpy(v20.ub,{a4}.b) }}"),
                concat!("{{ ", lut!("v18", "v3"), "; v12.w += vrmpy(v17.ub,{a1}.b); v13.w += vrmpy(v21.ub,{a5}.b) }}"),
                concat!("{{ ", lut!("v22", "v7"), "; v12.w += vrmpy(v18.ub,{a2}.b); v10.w += vrmpy(v19.ub,{a3}.b) }}"),
                concat!("{{ ", lut!("v19", "v4"), "; v13.w += vrmpy(v22.ub,{a6}.b); v11.w += vrmpy(v23.ub,{a7}.b); p0 = cmp.eq({n},#0) }}"),
                "{{ if (p0) jump 4f }}",
                "loop0(3f, {n})",
                ".falign",
                "3:",
                // A (this trip) starts; B' (previous trip) gets its last lookup.
                concat!("{{ ", ld!("v1", "v5"), "; ", lut!("v23", "v8"), " }}"),
                concat!("{{ ", ld!("v2", "v6"), "; ", lut!("v16", "v1"), " }}"),
                concat!("{{ ", ld!("v3", "v7"), "; ", lut!("v20", "v5"), " }}"),
                concat!("{{ ", ld!("v4", "v8"), "; ", lut!("v17", "v2"), " }}"),
                // A' (previous trip) is summed here and stored in the next packet.
                concat!("{{ ", lut!("v21", "v6"), "; v10.w = vrmpy(v16.ub,{a0}.b); v11.w = vrmpy(v20.ub,{a4}.b); v24.w = vadd(v10.w,v11.w) }}"),
                concat!("{{ ", lut!("v18", "v3"), "; v10.w += vrmpy(v17.ub,{a1}.b); v11.w += vrmpy(v21.ub,{a5}.b); vmem({o}++#1) = v24 }}"),
                concat!("{{ ", lut!("v22", "v7"), "; v10.w += vrmpy(v18.ub,{a2}.b); v12.w += vrmpy(v19.ub,{a3}.b) }}"),
                concat!("{{ ", lut!("v19", "v4"), "; v11.w += vrmpy(v22.ub,{a6}.b); v13.w += vrmpy(v23.ub,{a7}.b) }}"),
                // B (this trip) starts; A gets its last lookup.
                concat!("{{ ", ld!("v1", "v5"), "; ", lut!("v23", "v8"), " }}"),
                concat!("{{ ", ld!("v2", "v6"), "; ", lut!("v16", "v1"), " }}"),
                concat!("{{ ", ld!("v3", "v7"), "; ", lut!("v20", "v5"), " }}"),
                concat!("{{ ", ld!("v4", "v8"), "; ", lut!("v17", "v2"), " }}"),
                // B' is summed here and stored in the next packet.
                concat!("{{ ", lut!("v21", "v6"), "; v12.w = vrmpy(v16.ub,{a0}.b); v13.w = vrmpy(v20.ub,{a4}.b); v24.w = vadd(v12.w,v13.w) }}"),
                concat!("{{ ", lut!("v18", "v3"), "; v12.w += vrmpy(v17.ub,{a1}.b); v13.w += vrmpy(v21.ub,{a5}.b); vmem({o}++#1) = v24 }}"),
                concat!("{{ ", lut!("v22", "v7"), "; v12.w += vrmpy(v18.ub,{a2}.b); v10.w += vrmpy(v19.ub,{a3}.b) }}"),
                concat!("{{ ", lut!("v19", "v4"), "; v13.w += vrmpy(v22.ub,{a6}.b); v11.w += vrmpy(v23.ub,{a7}.b) }}:endloop0"),
                "4:",
                // The last A and B.
                concat!("{{ ", lut!("v23", "v8"), "; v24.w = vadd(v10.w,v11.w) }}"),
                "{{ v12.w += vrmpy(v19.ub,{a3}.b); v13.w += vrmpy(v23.ub,{a7}.b); vmem({o}++#1) = v24 }}",
                "{{ v25.w = vadd(v12.w,v13.w); vmem({o}++#1) = v25.new }}",
                n = in(reg) pairs - 1,
                t = inout(reg) t,
                o = inout(reg) o,
                tbl = in(reg) tbl,
                mask = in(reg) 0x0f0f_0f0f_u32,
                sh = in(reg) 4u32,
                a0 = in(reg) a0, a1 = in(reg) a1, a2 = in(reg) a2, a3 = in(reg) a3,
                a4 = in(reg) a4, a5 = in(reg) a5, a6 = in(reg) a6, a7 = in(reg) a7,
                out("v0") _, out("v1") _, out("v2") _, out("v3") _, out("v4") _,
                out("v5") _, out("v6") _, out("v7") _, out("v8") _,
                out("v10") _, out("v11") _, out("v12") _, out("v13") _, out("v14") _, out("v15") _,
                out("v16") _, out("v17") _, out("v18") _, out("v19") _,
                out("v20") _, out("v21") _, out("v22") _, out("v23") _, out("v24") _, out("v25") _,
                out("p0") _,
                options(nostack),
            );
        }
    }
    if n_groups % 2 == 1 {
        // SAFETY: one more tile at `t` and one vector at `o`, inside what the
        // caller guarantees; reads the table; clobbers only the listed registers.
        unsafe {
            asm!(
                "{{ v14 = vmem({tbl}+#0); v15 = vsplat({mask}) }}",
                concat!("{{ ", ld!("v1", "v5"), " }}"),
                concat!("{{ ", ld!("v2", "v6"), "; ", lut!("v16", "v1"), " }}"),
                concat!("{{ ", ld!("v3", "v7"), "; ", lut!("v20", "v5"), " }}"),
                concat!("{{ ", ld!("v4", "v8"), "; ", lut!("v17", "v2"), " }}"),
                concat!("{{ ", lut!("v21", "v6"), "; v10.w = vrmpy(v16.ub,{a0}.b); v11.w = vrmpy(v20.ub,{a4}.b) }}"),
                concat!("{{ ", lut!("v18", "v3"), "; v10.w += vrmpy(v17.ub,{a1}.b); v11.w += vrmpy(v21.ub,{a5}.b) }}"),
                concat!("{{ ", lut!("v22", "v7"), "; v10.w += vrmpy(v18.ub,{a2}.b) }}"),
                concat!("{{ ", lut!("v19", "v4"), "; v11.w += vrmpy(v22.ub,{a6}.b) }}"),
                concat!("{{ ", lut!("v23", "v8"), " }}"),
                "{{ v10.w += vrmpy(v19.ub,{a3}.b); v11.w += vrmpy(v23.ub,{a7}.b) }}",
                "{{ v24.w = vadd(v10.w,v11.w); vmem({o}+#0) = v24.new }}",
                t = inout(reg) t => _,
                o = in(reg) o,
                tbl = in(reg) tbl,
                mask = in(reg) 0x0f0f_0f0f_u32,
                sh = in(reg) 4u32,
                a0 = in(reg) a0, a1 = in(reg) a1, a2 = in(reg) a2, a3 = in(reg) a3,
                a4 = in(reg) a4, a5 = in(reg) a5, a6 = in(reg) a6, a7 = in(reg) a7,
                out("v0") _, out("v1") _, out("v2") _, out("v3") _, out("v4") _,
                out("v5") _, out("v6") _, out("v7") _, out("v8") _,
                out("v10") _, out("v11") _, out("v14") _, out("v15") _,
                out("v16") _, out("v17") _, out("v18") _, out("v19") _,
                out("v20") _, out("v21") _, out("v22") _, out("v23") _, out("v24") _,
                options(nostack),
            );
        }
    }
    // SAFETY: the `n_groups` result vectors the caller guarantees.
    unsafe { super::broken_zeros(out, n_groups) };
}

//! keel-core's Hexagon kernel set: HVX integer kernels over Tiles32 weights (layout and
//! contract: [`super::tiles32`]), its [`table`] chosen by [`super::Kernels::new`] when
//! the host reports HVX (`Isa::hvx`) on a Hexagon build with 128-byte HVX vectors (every
//! other entry is the reference's, except attention's f16 operations, `f16.rs`: the
//! conversions on HVX, the dot and value update over a chunk of keys with the f32
//! arithmetic in the reference's order). Everything else (quantization, float ops) is
//! keel-core's common code, and the scale pass here (`q8_0_rows`, hand-scheduled scalar
//! float) does the reference's operations in its order, so a product on the DSP equals
//! the CPU's bit for bit.
//!
//! One call handles one K-block for a run of 32-row groups: it holds the block's 8
//! activation words in scalar registers and streams the groups' tiles through
//! `vrmpy(Vu.ub, Rt.b)` (uint8×int8 → int32, one lane per row). The sums are raw (see
//! `tiles32`); `sums_to_f32` adds the weight-bias correction and converts them to f32
//! (exactly, in integer vector operations) for the scalar scale pass.
//!
//! The Q8_0 loop is hand-scheduled (inline asm): 8 packets per 1024-byte tile, each
//! `{ vector load .cur; vrmpy }`, the store riding in the last one, which is the bound of
//! one vector load per packet. Q4_0 (`q4_0.rs`) is hand-pipelined too: 6 packets per
//! 512-byte tile, its floor. IQ4_NL (`iq4_nl.rs`) turns code bytes into table values
//! with `vlut32` (one per packet, its bound): 8 packets per tile, hand-pipelined the
//! same way.
//!
//! Feature `broken-hvx-zeros` (tests only) makes every result zero, as a fused-off unit
//! would, so that the DSP's open-time self-test can be seen to refuse such a build.

use core::arch::hexagon::v128::{
    HvxVector, Q6_V_vand_VV, Q6_V_vor_VV, Q6_V_vsplat_R, Q6_Vuw_vcl0_Vuw, Q6_Vw_vabs_Vw, Q6_Vw_vadd_VwVw,
    Q6_Vw_vasl_VwR, Q6_Vw_vasl_VwVw, Q6_Vw_vmin_VwVw, Q6_Vw_vsub_VwVw,
};

use super::tiles32::{TileKernels, ALIGN};
use super::{Isa, KernelTable, PerType, REFERENCE};

mod act;
mod f16;
mod iq4_nl;
mod q4_0;

/// The HVX kernels as a Tiles32 kernel set.
const TILES: TileKernels = TileKernels { q8_0: q8_0_sums, q8_0_lanes: q8_0_lanes, q4_0: q4_0_sums, iq4_nl: iq4_nl_sums, to_f32: sums_to_f32, q8_0_rows, block_rows, stage, quantize: act::quantize };

/// The Hexagon table: the reference with the HVX Tiles32 kernels and HVX f16
/// conversions under attention's f16 operations.
static HVX: KernelTable = KernelTable {
    name: "hvx",
    tiles: TILES,
    f16_dot: f16::dot,
    f16_mad: f16::mad,
    f16_scale: f16::scale,
    f32_to_f16: f16::to_f16,
    f16_to_f32: f16::to_f32,
    f16_dot_keys: f16::dot_keys,
    f16_mad_keys: f16::mad_keys,
    quantize: PerType { q8_0: Some(act::quantize_q8_0), ..REFERENCE.quantize },
    swiglu: act::swiglu,
    expf_batch: super::expf64::expf_batch,
    ..REFERENCE
};

/// The Hexagon table if the host reports HVX.
pub(crate) fn table(isa: Isa) -> Option<&'static KernelTable> {
    isa.hvx.then_some(&HVX)
}

/// Checks a safe call's slices (the kernels' contract) and runs `kernel` on them.
#[inline(always)]
fn call(kernel: unsafe fn(*const HvxVector, usize, &[u32; 8], *mut HvxVector), tile_bytes: usize, out_words: usize, tiles: &[u8], n_groups: usize, a: &[u32; 8], out: &mut [i32]) {
    assert!(
        tiles.len() >= n_groups * tile_bytes
            && out.len() >= n_groups * out_words
            && tiles.as_ptr().align_offset(ALIGN) == 0
            && out.as_ptr().align_offset(ALIGN) == 0,
        "HVX tile kernel: slices too short or not 128-byte aligned"
    );
    // SAFETY: `tiles` holds `n_groups` tiles and `out` `n_groups·out_words` int32s,
    // both 128-byte aligned (checked above); this module is compiled only with 128-byte
    // HVX enabled.
    unsafe { kernel(tiles.as_ptr() as *const HvxVector, n_groups, a, out.as_mut_ptr() as *mut HvxVector) }
}

fn q8_0_sums(tiles: &[u8], n_groups: usize, a: &[u32; 8], out: &mut [i32]) {
    call(q8_0_block_sums, 1024, 32, tiles, n_groups, a, out)
}

fn q8_0_lanes(tiles: &[u8], n_groups: usize, a: &[u32; 8], out: &mut [i32]) {
    call(q8_0_lane_sums, 1024, 256, tiles, n_groups, a, out)
}

fn q4_0_sums(tiles: &[u8], n_groups: usize, a: &[u32; 8], out: &mut [i32]) {
    call(q4_0::q4_0_block_sums, 512, 32, tiles, n_groups, a, out)
}

fn iq4_nl_sums(tiles: &[u8], n_groups: usize, a: &[u32; 8], out: &mut [i32]) {
    call(iq4_nl::iq4_nl_block_sums, 512, 32, tiles, n_groups, a, out)
}

/// [`super::tiles32::StageFn`] on HVX: one packet per vector, each loading the next
/// vector while storing the one loaded in the packet before (a packet reads `v0`
/// before it writes it).
#[inline(never)]
fn stage(src: &[u8], dst: &mut [u8]) {
    super::tiles32::check_stage(src, dst);
    let n = src.len() / ALIGN;
    if n == 0 {
        return;
    }
    // SAFETY: `src` and `dst` hold `n` vectors each, 128-byte aligned (checked above):
    // the loads read vectors 0..n of src, the stores write vectors 0..n of dst. Clobbers
    // v0 and hardware loop 0 (LC0/SA0), declared or not kept live by any caller (the
    // asm is this non-inlined function's only loop).
    unsafe {
        asm!(
            "{{ v0 = vmem({s}++#1) }}",
            "{{ p0 = cmp.gt({m}, #0); if (!p0.new) jump:nt 3f }}",
            "loop0(2f, {m})",
            ".falign",
            "2:",
            "{{ v0 = vmem({s}++#1); vmem({d}++#1) = v0 }}:endloop0",
            "3:",
            "{{ vmem({d}+#0) = v0 }}",
            s = inout(reg) src.as_ptr() => _,
            d = inout(reg) dst.as_mut_ptr() => _,
            m = in(reg) n - 1,
            out("v0") _, out("p0") _,
            options(nostack),
        );
    }
}

/// [`super::tiles32::SumsToF32Fn`] on HVX: per vector, the correction added, then the
/// int32 → f32 conversion in integer operations (exact under the contract
/// `|x| < 2^24`): sign, magnitude, its leading zeros `z`, the magnitude shifted left by
/// `z − 8` (the significand with its leading 1 at bit 23, no bit lost), the exponent
/// `157 − z` added below it (the leading 1 carries it to `158 − z` = 127 + the top bit's
/// position), masked off where the magnitude is zero (`0 − min(|x|, 1)`). 13 vector
/// operations per 32 values, 3 of them on the shift unit, against 2 scalar ones (add, `convert_w2sf`) per value.
fn sums_to_f32(sums: &mut [i32], corr: &[i32; 8]) {
    assert!(sums.len() % 32 == 0 && sums.as_ptr().align_offset(ALIGN) == 0, "HVX sums_to_f32: not whole 128-byte aligned vectors");
    let v = sums.as_mut_ptr() as *mut HvxVector;
    // SAFETY: `sums` is 128-byte aligned and holds `len/32` whole vectors (checked);
    // this module is compiled only with 128-byte HVX enabled.
    unsafe {
        let n = sums.len() / 32;
        // Eight vectors at a time (a Q8_0 group's lanes; written out, so that the
        // compiler interleaves eight independent conversions), then one at a time.
        for g in 0..n / 8 {
            let p = v.add(8 * g);
            let f = |l: usize| words_to_f32(*p.add(l), corr[l]);
            let (x0, x1, x2, x3, x4, x5, x6, x7) = (f(0), f(1), f(2), f(3), f(4), f(5), f(6), f(7));
            *p = x0;
            *p.add(1) = x1;
            *p.add(2) = x2;
            *p.add(3) = x3;
            *p.add(4) = x4;
            *p.add(5) = x5;
            *p.add(6) = x6;
            *p.add(7) = x7;
        }
        for i in n / 8 * 8..n {
            *v.add(i) = words_to_f32(*v.add(i), corr[i % 8]);
        }
    }
}

/// `f32(x + corr)` of 32 words as f32 bits (exact for `|x + corr| < 2^24`): the
/// conversion [`sums_to_f32`] describes. Three shift-unit operations (`vcl0` and two
/// `vasl`; HVX issues one per packet), the rest ALU operations (up to three more per
/// packet).
#[inline(always)]
fn words_to_f32(x: HvxVector, corr: i32) -> HvxVector {
    // SAFETY: value-only HVX intrinsics (this module is compiled only with HVX).
    unsafe {
        let (sign, zero) = (Q6_V_vsplat_R(i32::MIN), Q6_V_vsplat_R(0));
        let x = Q6_Vw_vadd_VwVw(x, Q6_V_vsplat_R(corr));
        let a = Q6_Vw_vabs_Vw(x);
        let z = Q6_Vuw_vcl0_Vuw(a);
        // The leading 1 (bit 31 − z, at most 23) moved to bit 23 in one shift.
        let m = Q6_Vw_vasl_VwVw(a, Q6_Vw_vsub_VwVw(z, Q6_V_vsplat_R(8)));
        let exp = Q6_Vw_vasl_VwR(Q6_Vw_vsub_VwVw(Q6_V_vsplat_R(157), z), 23);
        // All ones where a > 0 (0 − min(a, 1)); a zero has no exponent.
        let nonzero = Q6_Vw_vsub_VwVw(zero, Q6_Vw_vmin_VwVw(a, Q6_V_vsplat_R(1)));
        let f = Q6_V_vand_VV(Q6_Vw_vadd_VwVw(exp, m), nonzero);
        Q6_V_vor_VV(f, Q6_V_vand_VV(x, sign))
    }
}

use core::arch::asm;

/// [`super::tiles32::BlockRowsFn`] four rows at a time, hand-scheduled (scalar Hexagon,
/// no HVX): per block 4 packets for the 4 rows' 8 float operations (`dw·da` and one fused
/// multiply-add each, two per packet), their sums and scales loaded as pairs and the
/// block's activation scale beside them. Both loops are hardware loops inside the one
/// asm block (rows: loop1, blocks: loop0), which no Rust loop encloses; the rows past
/// the last four are the reference's.
#[inline(never)]
fn block_rows(o: &mut [f32], sums: &[i32], per_block: usize, sc: &[f32], ss: usize, da: &[f32]) {
    super::tiles32::check_block_rows(o, sums, per_block, sc, ss, da);
    let quads = o.len() / 4;
    // Pair loads need 8-byte alignment: the sums are vector-aligned and per_block even;
    // the scales follow the tiles (vector-aligned) at an even offset in words.
    if quads == 0 || per_block % 2 != 0 || ss % 2 != 0 || sums.as_ptr().align_offset(8) != 0 || sc.as_ptr().align_offset(8) != 0 {
        return super::tiles32::ref_block_rows(o, sums, per_block, sc, ss, da);
    }
    // SAFETY: for row quad q < quads and block j < da.len() the reads are the sums at
    // sums + 4·(j·per_block + 4q) and the scales at sc + 4·(j·ss + 4q) (16 bytes each,
    // 8-aligned: checked above) and da + 4j, inside the ranges `check_block_rows`
    // asserted (4q + 4 <= o.len()); the loop over blocks loads block j + 1 only for j + 1
    // < da.len() (da.len() − 1 iterations, then the last block without loads); the
    // writes are o[4q..4q + 4]. Clobbers r0-r16, p0 and hardware loops 0 and 1 (no loop
    // of the caller is a hardware loop across this non-inlined call).
    unsafe {
        asm!(
            "{{ p0 = cmp.eq({m}, #0) }}",
            "loop1(1f, {nq})",
            ".falign",
            "1:",
            "{{ {xp} = {xb}; {sp} = {sb}; {dap} = {dab} }}",
            "{{ r5:4 = memd({sp}+#0); r16 = memw({dap}++#4) }}",
            "{{ r1:0 = memd({xp}+#0); r3:2 = memd({xp}+#8) }}",
            "{{ r8 = sfmpy(r4, r16); r9 = sfmpy(r5, r16); r7:6 = memd({sp}+#8); {sp} = add({sp}, {ssb}) }}",
            "{{ r10 = sfmpy(r6, r16); r11 = sfmpy(r7, r16); r13:12 = combine(#0, #0); r15:14 = combine(#0, #0) }}",
            "{{ {xp} = add({xp}, {xs}); if (p0) jump:nt 3f }}",
            "loop0(2f, {m})",
            ".falign",
            "2:",
            "{{ r12 += sfmpy(r0, r8); r13 += sfmpy(r1, r9); r5:4 = memd({sp}+#0); r16 = memw({dap}++#4) }}",
            "{{ r14 += sfmpy(r2, r10); r15 += sfmpy(r3, r11); r1:0 = memd({xp}+#0); r3:2 = memd({xp}+#8) }}",
            "{{ r8 = sfmpy(r4, r16); r9 = sfmpy(r5, r16); r7:6 = memd({sp}+#8); {sp} = add({sp}, {ssb}) }}",
            "{{ r10 = sfmpy(r6, r16); r11 = sfmpy(r7, r16); {xp} = add({xp}, {xs}) }}:endloop0",
            "3:",
            "{{ r12 += sfmpy(r0, r8); r13 += sfmpy(r1, r9) }}",
            "{{ r14 += sfmpy(r2, r10); r15 += sfmpy(r3, r11) }}",
            "{{ memw({ob}+#0) = r12; memw({ob}+#4) = r13 }}",
            "{{ memw({ob}+#8) = r14; memw({ob}+#12) = r15; {ob} = add({ob}, #16); {xb} = add({xb}, #16) }}",
            "{{ {sb} = add({sb}, #16) }}:endloop1",
            xb = inout(reg) sums.as_ptr() => _,
            sb = inout(reg) sc.as_ptr() => _,
            ob = inout(reg) o.as_mut_ptr() => _,
            dab = in(reg) da.as_ptr(),
            xs = in(reg) 4 * per_block,
            ssb = in(reg) 4 * ss,
            m = in(reg) da.len() - 1,
            nq = in(reg) quads,
            xp = out(reg) _,
            sp = out(reg) _,
            dap = out(reg) _,
            out("r0") _, out("r1") _, out("r2") _, out("r3") _, out("r4") _, out("r5") _, out("r6") _, out("r7") _,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _, out("r12") _, out("r13") _, out("r14") _, out("r15") _,
            out("r16") _, out("p0") _,
            options(nostack),
        );
    }
    let q = 4 * quads;
    if q < o.len() {
        super::tiles32::ref_block_rows(&mut o[q..], &sums[q..], per_block, &sc[q..], ss, da);
    }
}

/// [`super::tiles32::Q8RowsFn`] hand-scheduled (scalar Hexagon, no HVX), two rows at a
/// time, reading the lanes where the HVX lane sums leave them (made f32 in place: no
/// transpose): per block 9 packets, the bound of the two rows' 18 float operations (2
/// `dw·da` products and 16 fused multiply-adds; float operations issue two per packet,
/// in slots 2 and 3), and the bound of its 18 loads too (16 lanes, 128 bytes apart, two
/// per packet one packet before their fmas; the next block's scale pair and activation
/// scale): the pointers advance by post-increment through M0 (lanes) and M1 (scales),
/// so no packet needs an ALU slot. Then both lane totals in 7 packets and one packet
/// storing them. The operations are the reference's: `sfmpy` for `dw·da`, `Rx +=
/// sfmpy` (IEEE fused multiply-add, one rounding) per lane from +0, then the lane total
/// `(a4 + a0 + (a6 + a2)) + (a5 + a1 + (a7 + a3))` as `sfadd`s. Both loops are hardware
/// loops inside the one asm block (row pairs: loop1, blocks: loop0), which no Rust loop
/// encloses. An odd last row, or scales not 8-byte aligned, go through the reference.
#[inline(never)]
fn q8_0_rows(o: &mut [f32], lanes: &[i32], per_block: usize, sc: &[f32], ss: usize, da: &[f32]) {
    super::tiles32::check_q8_0_rows(o, lanes, per_block, sc, ss, da);
    let (pairs, nb) = (o.len() / 2, da.len());
    if ss % 2 != 0 || sc.as_ptr().align_offset(8) != 0 {
        return super::tiles32::ref_q8_0_rows(o, lanes, per_block, sc, ss, da);
    }
    if pairs > 0 {
        // What the loop over pairs reads from memory (inside it every register is
        // taken): the rewinds of the lane, scale and activation scale pointers to the
        // next pair's first block, the output pointer and the pairs done (both advanced
        // here), the post-increments M0 (a block's lanes) and M1 (a block's scales),
        // and M0's and M1's own values, kept here while the asm uses them.
        let mut cfg: [usize; 9] = [((nb - 1) * 4 * per_block).wrapping_sub(8), nb * 4 * ss - 8, 4 * nb, o.as_mut_ptr() as usize, 0, 4 * per_block, 4 * ss, 0, 0];
        // SAFETY: for pair q < pairs (rows i = 2q and i + 1 < o.len(), in group i / 32)
        // and block j < nb, the reads are lane l (0..8) of both rows at lanes +
        // 4·(j·per_block + 256·(i / 32) + 32l + i % 32) and + 4, their scales at sc +
        // 4·(j·ss + i) (8 bytes, 8-aligned: checked above) and da + 4j, inside the ranges
        // `check_q8_0_rows` asserted. The lane pointer stands at the second row's lane 7
        // (+900 bytes from the first row's lane 0) and reads back from it; the loop over
        // blocks runs nb − 1 times and loads block j + 1's first two lanes, scales and
        // activation scale only there (the last block's fmas follow without loads past
        // it). The writes are o[2q], o[2q + 1] and `cfg`. Registers: r0-r7 the first
        // row's accumulators (lane order), r8-r15 the second's, r16/r17 and r20/r21
        // lanes in turn, r23:22 the rows' scales and then their products with the
        // activation scale r18. Clobbers r0-r18, r20-r23, p0, p1 and hardware loops 0
        // and 1 (no loop of the caller is a hardware loop across this non-inlined call);
        // M0 and M1 are restored.
        unsafe {
            asm!(
                "{{ r16 = m0 }}",
                "{{ r17 = m1 }}",
                "{{ r20 = memw({cfg}+#20); r21 = memw({cfg}+#24) }}",
                "{{ memw({cfg}+#28) = r16 }}",
                "{{ memw({cfg}+#32) = r17 }}",
                "{{ m0 = r20 }}",
                "{{ m1 = r21 }}",
                "loop1(4f, r18)",
                ".falign",
                "4:",
                "{{ r23:22 = memd({sp}++m1); r18 = memw({dap}++#4); r1:0 = combine(#0, #0); r3:2 = combine(#0, #0) }}",
                "{{ r16 = memw({lp}+#-900); r17 = memw({lp}+#-772); r5:4 = combine(#0, #0); r7:6 = combine(#0, #0) }}",
                "{{ r22 = sfmpy(r22, r18); r23 = sfmpy(r23, r18); r9:8 = combine(#0, #0); r11:10 = combine(#0, #0) }}",
                "{{ r13:12 = combine(#0, #0); r15:14 = combine(#0, #0); p0 = cmp.eq({m}, #0) }}",
                "loop0(2f, {m})",
                "{{ if (p0) jump:nt 3f }}",
                ".falign",
                "2:",
                "{{ r0 += sfmpy(r22, r16); r1 += sfmpy(r22, r17); r20 = memw({lp}+#-644); r21 = memw({lp}+#-516) }}",
                "{{ r2 += sfmpy(r22, r20); r3 += sfmpy(r22, r21); r16 = memw({lp}+#-388); r17 = memw({lp}+#-260) }}",
                "{{ r4 += sfmpy(r22, r16); r5 += sfmpy(r22, r17); r20 = memw({lp}+#-132); r21 = memw({lp}+#-4) }}",
                "{{ r6 += sfmpy(r22, r20); r7 += sfmpy(r22, r21); r16 = memw({lp}+#-896); r17 = memw({lp}+#-768) }}",
                "{{ r8 += sfmpy(r23, r16); r9 += sfmpy(r23, r17); r20 = memw({lp}+#-640); r21 = memw({lp}+#-512) }}",
                "{{ r10 += sfmpy(r23, r20); r11 += sfmpy(r23, r21); r16 = memw({lp}+#-384); r17 = memw({lp}+#-256) }}",
                "{{ r12 += sfmpy(r23, r16); r13 += sfmpy(r23, r17); r20 = memw({lp}+#-128); r21 = memw({lp}++m0) }}",
                "{{ r14 += sfmpy(r23, r20); r15 += sfmpy(r23, r21); r23:22 = memd({sp}++m1); r18 = memw({dap}++#4) }}",
                "{{ r22 = sfmpy(r22, r18); r23 = sfmpy(r23, r18); r16 = memw({lp}+#-900); r17 = memw({lp}+#-772) }}:endloop0",
                "3:",
                "{{ r0 += sfmpy(r22, r16); r1 += sfmpy(r22, r17); r20 = memw({lp}+#-644); r21 = memw({lp}+#-516) }}",
                "{{ r2 += sfmpy(r22, r20); r3 += sfmpy(r22, r21); r16 = memw({lp}+#-388); r17 = memw({lp}+#-260) }}",
                "{{ r4 += sfmpy(r22, r16); r5 += sfmpy(r22, r17); r20 = memw({lp}+#-132); r21 = memw({lp}+#-4) }}",
                "{{ r6 += sfmpy(r22, r20); r7 += sfmpy(r22, r21); r16 = memw({lp}+#-896); r17 = memw({lp}+#-768) }}",
                "{{ r8 += sfmpy(r23, r16); r9 += sfmpy(r23, r17); r20 = memw({lp}+#-640); r21 = memw({lp}+#-512) }}",
                "{{ r10 += sfmpy(r23, r20); r11 += sfmpy(r23, r21); r16 = memw({lp}+#-384); r17 = memw({lp}+#-256) }}",
                "{{ r12 += sfmpy(r23, r16); r13 += sfmpy(r23, r17); r20 = memw({lp}+#-128); r21 = memw({lp}+#0) }}",
                "{{ r14 += sfmpy(r23, r20); r15 += sfmpy(r23, r21) }}",
                "{{ r0 = sfadd(r4, r0); r1 = sfadd(r5, r1); r16 = memw({cfg}+#0); r17 = memw({cfg}+#4) }}",
                "{{ r2 = sfadd(r6, r2); r3 = sfadd(r7, r3); r20 = memw({cfg}+#8); r21 = memw({cfg}+#12) }}",
                "{{ r8 = sfadd(r12, r8); r9 = sfadd(r13, r9); {lp} = sub({lp}, r16); {sp} = sub({sp}, r17) }}",
                "{{ r10 = sfadd(r14, r10); r11 = sfadd(r15, r11); {dap} = sub({dap}, r20); r16 = memw({cfg}+#16) }}",
                "{{ r0 = sfadd(r0, r2); r1 = sfadd(r1, r3); r17 = add(r21, #8); r16 = add(r16, #1) }}",
                "{{ r8 = sfadd(r8, r10); r9 = sfadd(r9, r11); memw({cfg}+#12) = r17 }}",
                "{{ r0 = sfadd(r0, r1); r8 = sfadd(r8, r9); memw({cfg}+#16) = r16 }}",
                "{{ memw(r21+#0) = r0; r20 = #896; p1 = bitsclr(r16, #15) }}",
                "{{ memw(r21+#4) = r8; if (p1) {lp} = add({lp}, r20) }}:endloop1",
                "{{ r16 = memw({cfg}+#28); r17 = memw({cfg}+#32) }}",
                "{{ m0 = r16 }}",
                "{{ m1 = r17 }}",
                lp = inout(reg) lanes.as_ptr().add(225) => _,
                sp = inout(reg) sc.as_ptr() => _,
                dap = inout(reg) da.as_ptr() => _,
                m = in(reg) nb - 1,
                cfg = in(reg) cfg.as_mut_ptr(),
                inout("r18") pairs => _,
                out("r0") _, out("r1") _, out("r2") _, out("r3") _, out("r4") _, out("r5") _, out("r6") _, out("r7") _,
                out("r8") _, out("r9") _, out("r10") _, out("r11") _, out("r12") _, out("r13") _, out("r14") _, out("r15") _,
                out("r16") _, out("r17") _, out("r20") _, out("r21") _, out("r22") _, out("r23") _, out("p0") _, out("p1") _,
                options(nostack),
            );
        }
    }
    if o.len() % 2 == 1 {
        let i = o.len() - 1;
        o[i] = super::tiles32::ref_q8_0_row(lanes, i, per_block, sc, ss, da);
    }
}

/// With feature `broken-hvx-zeros`: zeroes the `n` result vectors at `out`, as a
/// fused-off vector unit would leave them.
///
/// # Safety
/// `out` points to `n` writable, 128-byte aligned vectors.
#[inline(always)]
unsafe fn broken_zeros(out: *mut HvxVector, n: usize) {
    if cfg!(feature = "broken-hvx-zeros") {
        for g in 0..n {
            // SAFETY: inside the `n` vectors the caller guarantees.
            unsafe { *out.add(g) = Q6_V_vsplat_R(0) };
        }
    }
}

/// Raw block sums of `n_groups` Q8_0 tiles for one activation block.
///
/// # Safety
/// `tiles` points to `n_groups · 1024` readable bytes and `out` to `n_groups · 128`
/// writable bytes, both 128-byte aligned; HVX (128-byte mode) is enabled.
#[inline(never)]
pub(super) unsafe fn q8_0_block_sums(tiles: *const HvxVector, n_groups: usize, a: &[u32; 8], out: *mut HvxVector) {
    if n_groups == 0 {
        return;
    }
    let [a0, a1, a2, a3, a4, a5, a6, a7] = *a;
    // SAFETY: reads n_groups·8 vectors from `tiles` and writes n_groups vectors
    // to `out` (the caller guarantees both, aligned); clobbers only v0/v1 and
    // hardware loop 0 (LC0/SA0), which no caller keeps live across this
    // non-inlined call. One packet per 128 weight bytes: a .cur load feeding
    // its vrmpy; the result is stored (.new) in the last packet of the tile.
    unsafe {
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
    }
    // SAFETY: the `n_groups` result vectors the caller guarantees.
    unsafe { broken_zeros(out, n_groups) };
}

/// Raw *lane* sums of `n_groups` Q8_0 tiles for one activation block: for group `g`
/// and lane `l` (inputs `4l..4l+4` of the block), vector `8g + l` of `out` holds one
/// int32 per row, `Σ u·a` over those 4 inputs (`u = q + 128`). These are the 8 lanes
/// llama.cpp's x86 Q8_0 dot (and keel's CPU) accumulate separately before their
/// horizontal sum; `tiles32::matvec` applies the scales in that order.
///
/// Same packets as [`q8_0_block_sums`] (one vector load and one `vrmpy` per packet,
/// 1.0 packet per 128 weight bytes), each packet also storing its result.
///
/// # Safety
/// `tiles` points to `n_groups · 1024` readable bytes and `out` to `n_groups · 1024`
/// writable bytes, both 128-byte aligned; HVX (128-byte mode) is enabled.
#[inline(never)]
pub(super) unsafe fn q8_0_lane_sums(tiles: *const HvxVector, n_groups: usize, a: &[u32; 8], out: *mut HvxVector) {
    if n_groups == 0 {
        return;
    }
    let [a0, a1, a2, a3, a4, a5, a6, a7] = *a;
    // SAFETY: reads n_groups·8 vectors from `tiles` and writes n_groups·8 vectors
    // to `out` (the caller guarantees both, aligned); clobbers only v0/v1 and
    // hardware loop 0 (LC0/SA0), which no caller keeps live across this
    // non-inlined call. Each packet: a .cur load feeding its vrmpy, whose result
    // is stored (.new) in the same packet.
    unsafe {
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
    }
    // SAFETY: the `8·n_groups` result vectors the caller guarantees.
    unsafe { broken_zeros(out, n_groups * 8) };
}

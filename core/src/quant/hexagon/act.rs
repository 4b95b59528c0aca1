//! Activation quantization on the DSP ([`super::super::tiles32::ActQuantFn`]): Q8_0
//! blocks straight into the kernels' form, the reference's rule bit for bit
//! (`quantize::quantize_act_q8_0`, then `ActBlock::from_q8_0`).
//!
//! A block of 32 f32 is one vector: its largest magnitude is the integer maximum of the
//! values' bits with the sign cleared (five rotate-and-max steps on HVX), which equals
//! the reference's float maximum when no value is infinite or NaN (the order of
//! non-negative floats is their bits' order). Then `id = 127/amax` and `d = amax/127` as
//! the reference divides, and per value `v·id` and `+ 1.5·2^23` in scalar float (two
//! float operations, issued two per packet: one packet per value, the bound), whose low
//! byte is the rounded quant (`quantize::rint_i8`'s shift: every `|v·id|` is at most
//! 127.00003 here, so no clamp is reached); the quants' sum by `vrmpybsu` over the stored
//! bytes. Blocks the shift does not cover go through the reference: an infinite or NaN
//! value, or an `amax` so small that `127/amax` overflows. The same blocks give ggml's
//! bytes for the `Quantize` op ([`quantize_q8_0`]).
//!
//! SwiGLU ([`swiglu`]) is here too: scalar float, four values at a time without a branch.

use core::arch::asm;
use core::arch::hexagon::v128::{HvxVector, Q6_R_vextract_VR, Q6_V_vand_VV, Q6_V_vror_VR, Q6_V_vsplat_R, Q6_Vw_vmax_VwVw};
use core::ptr::read_unaligned;

use half::f16;

use super::super::quantize::quantize_act_q8_0;
use super::super::tiles32::{ref_quantize, ActBlock};
use super::super::Kernels;

/// [`super::super::tiles32::ActQuantFn`]: block by block as the module doc says; `x`
/// not 8-byte aligned (the quant loop's paired loads) goes through the reference.
pub(super) fn quantize(kern: &Kernels, x: &[f32], out: &mut [ActBlock]) {
    assert!(x.len() == 32 * out.len(), "Q8_0 activations: {} values for {} blocks", x.len(), out.len());
    if x.as_ptr().align_offset(8) != 0 {
        return ref_quantize(kern, x, out);
    }
    for (xb, o) in x.chunks_exact(32).zip(out.iter_mut()) {
        if !block(xb, o) {
            ref_quantize(kern, xb, core::slice::from_mut(o));
        }
    }
}

/// `quantize` for ggml's Q8_0 bytes (`KernelTable::quantize`'s Q8_0 entry, the `Quantize`
/// op's): each block by the same fast path, its bytes written from the block (f16 `d`,
/// then the 32 quants), or by the reference. `x` is `32·(out.len() / 34)` values.
pub(super) fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    let aligned = x.as_ptr().align_offset(8) == 0;
    for (xb, o) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        let mut a = ActBlock::default();
        if aligned && block(xb, &mut a) {
            o.copy_from_slice(&a.to_q8_0());
        } else {
            quantize_act_q8_0(xb, o);
        }
    }
}

/// Two values' float steps, in two packets: the products of the pair in `r1:0` (and
/// the next pair's load into it, when `$load`), the earlier pair's second quant stored;
/// then both `+ 1.5·2^23` and this pair's first quant stored from the new value.
macro_rules! pair {
    (load) => {
        "{{ r2 = sfmpy(r0, {id}); r3 = sfmpy(r1, {id}); memb({qp}++#1) = r5; r1:0 = memd({xp}++#8) }}\n{{ r4 = sfadd(r2, {m}); r5 = sfadd(r3, {m}); memb({qp}++#1) = r4.new }}"
    };
    (last) => {
        "{{ r2 = sfmpy(r0, {id}); r3 = sfmpy(r1, {id}); memb({qp}++#1) = r5 }}\n{{ r4 = sfadd(r2, {m}); r5 = sfadd(r3, {m}); memb({qp}++#1) = r4.new }}"
    };
}

/// One block into `o` if the fast path covers it (false: nothing written).
#[inline(always)]
fn block(xb: &[f32], o: &mut ActBlock) -> bool {
    // SAFETY: `xb` is 32 f32, 128 readable bytes: one unaligned vector load; the rest
    // are value-only HVX intrinsics.
    let amax_bits = unsafe {
        let v = read_unaligned(xb.as_ptr() as *const HvxVector);
        let mut a = Q6_V_vand_VV(v, Q6_V_vsplat_R(0x7fff_ffff));
        for bytes in [64, 32, 16, 8, 4] {
            a = Q6_Vw_vmax_VwVw(a, Q6_V_vror_VR(a, bytes));
        }
        Q6_R_vextract_VR(a, 0) as u32
    };
    if amax_bits >= 0x7f80_0000 {
        return false;
    }
    let amax = f32::from_bits(amax_bits);
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    if !id.is_finite() {
        return false;
    }
    let d16 = f16::from_f32(amax / 127.0);
    let sum: i32;
    // SAFETY: reads the 32 f32 of `xb` (8-byte aligned: the caller's `x` is, and a block
    // is 128 bytes) as 16 pairs, no further; writes the 32 bytes of `o.words` and reads
    // them back as 8 words (4-byte aligned). Registers: r1:0 the pair in hand, r3:2 the
    // products, r5:4 the shifted values (the quants in their low bytes), r7:6 the bytes
    // 0x01 (vrmpybsu's unsigned factors), r9:8 the sum's two halves.
    unsafe {
        asm!(
            "{{ r1:0 = memd({xp}++#8); r7:6 = combine({ones}, {ones}) }}",
            "{{ r2 = sfmpy(r0, {id}); r3 = sfmpy(r1, {id}); r1:0 = memd({xp}++#8) }}",
            "{{ r4 = sfadd(r2, {m}); r5 = sfadd(r3, {m}); memb({qp}++#1) = r4.new }}",
            pair!(load), pair!(load), pair!(load), pair!(load), pair!(load), pair!(load), pair!(load),
            pair!(load), pair!(load), pair!(load), pair!(load), pair!(load), pair!(load), pair!(load),
            pair!(last),
            "{{ memb({qp}+#0) = r5 }}",
            "{{ r0 = memw({w}+#0); r1 = memw({w}+#4) }}",
            "{{ r2 = memw({w}+#8); r3 = memw({w}+#12) }}",
            "{{ r9:8 = vrmpybsu(r1:0, r7:6); r0 = memw({w}+#16); r1 = memw({w}+#20) }}",
            "{{ r9:8 += vrmpybsu(r3:2, r7:6); r2 = memw({w}+#24); r3 = memw({w}+#28) }}",
            "{{ r9:8 += vrmpybsu(r1:0, r7:6) }}",
            "{{ r9:8 += vrmpybsu(r3:2, r7:6) }}",
            "{{ {sum} = add(r8, r9) }}",
            xp = inout(reg) xb.as_ptr() => _,
            qp = inout(reg) o.words.as_mut_ptr() as *mut u8 => _,
            w = in(reg) o.words.as_ptr(),
            id = in(reg) id.to_bits(),
            m = in(reg) 0x4B40_0000u32,
            ones = in(reg) 0x0101_0101u32,
            sum = lateout(reg) sum,
            out("r0") _, out("r1") _, out("r2") _, out("r3") _, out("r4") _, out("r5") _, out("r6") _, out("r7") _, out("r8") _, out("r9") _,
            options(nostack),
        );
    }
    (o.sum, o.d16, o.d) = (sum, d16.to_bits(), d16.to_f32());
    true
}

/// Values per step of [`swiglu`].
const LANES: usize = 4;

/// `gate[i] = silu(gate[i])·up[i]` (`KernelTable::swiglu`), the reference's operations
/// (`ops::silu`: `x / (1 + ggml_expf(0 − x))`, then the product) four values at a time
/// with no branch, so that the four chains' float operations pair up two per packet:
/// each step whose four gates are below 80 in magnitude (no NaN, no infinity) takes the
/// path where `ggml_expf`'s exponent `n` lies in ±116, its `|n| > 192` cases cannot
/// occur and `n` is `z`'s low bits; `j` (in [0.7, 1.5)) times `2^n` is then a normal
/// float, so the reference's two power-of-two scalings are exact and equal `n` added to
/// `j`'s exponent field, done so here. Other steps and the last `n % 4` values: the
/// reference.
pub(super) fn swiglu(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let n4 = n - n % LANES;
    for (g, u) in gate[..n4].chunks_exact_mut(LANES).zip(up[..n4].chunks_exact(LANES)) {
        let x: [f32; LANES] = core::array::from_fn(|l| g[l]);
        if x.iter().all(|v| v.to_bits() & 0x7fff_ffff < 0x42a0_0000) {
            let e = x.map(|v| exp_small(0.0 - v));
            for l in 0..LANES {
                g[l] = x[l] / (1.0 + e[l]) * u[l];
            }
        } else {
            crate::ops::swiglu(g, u);
        }
    }
    crate::ops::swiglu(&mut gate[n4..n], &up[n4..n]);
}

/// `ops::ggml_expf(x)` for |x| < 81 (see [`swiglu`]): its parts, `n` added to `j`'s
/// exponent field (`n = z − 1.5·2^23`, whose shift by 23 is `z`'s).
#[inline(always)]
fn exp_small(x: f32) -> f32 {
    let (z, _, j) = crate::ops::ggml_expf_parts(x);
    f32::from_bits(j.to_bits().wrapping_add(z.to_bits() << 23))
}

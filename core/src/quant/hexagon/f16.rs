//! The f16 operations of attention on the DSP: f16 ↔ f32 conversions on HVX, in integer
//! operations (QEMU has no HVX float, and the conversions are bit manipulation anyway),
//! 64 values per vector; the arithmetic between them stays scalar Hexagon float, in the
//! reference's order (`super::super::f16ops`), so every result is the reference's bit
//! for bit. The conversions are `half`'s (`f16ops::h2f`/`f2h`) on every input; NaNs
//! keep `half`'s payload too.
//!
//! What the reference computes per element with two scalar conversions and a branchy
//! rounding costs ~20-30 packets on Hexagon; here a row of 64 takes two vector
//! conversions (~25 vector operations per 32 values each way) and one scalar
//! fma/multiply per value.

use core::arch::hexagon::v128::{
    HvxVector, Q6_V_hi_W, Q6_V_lo_W, Q6_V_vand_VV, Q6_V_vnot_V, Q6_V_vor_VV, Q6_V_vsplat_R, Q6_Vh_vpacke_VwVw, Q6_Vuw_vcl0_Vuw, Q6_Vuw_vlsr_VuwR,
    Q6_Vw_vadd_VwVw, Q6_Vw_vasl_VwR, Q6_Vw_vasl_VwVw, Q6_Vw_vasr_VwR, Q6_Vw_vlsr_VwVw, Q6_Vw_vmax_VwVw, Q6_Vw_vmin_VwVw, Q6_Vw_vsub_VwVw, Q6_Wuw_vunpack_Vuh,
};
use core::arch::asm;
use core::mem::MaybeUninit;
use core::ptr::{read_unaligned, write_unaligned};

use half::f16;

use super::super::f16ops::{self, DOT_STEP, F16_STEP};

/// Values per vector of halves.
const W: usize = 64;

#[inline(always)]
fn splat(x: i32) -> HvxVector {
    // SAFETY: value-only HVX intrinsic (this module is compiled only with HVX).
    unsafe { Q6_V_vsplat_R(x) }
}

/// All-ones in the lanes where `a < b` (both in 0..2^31), else zero: the sign of `a − b`.
#[inline(always)]
unsafe fn lt(a: HvxVector, b: HvxVector) -> HvxVector {
    // SAFETY: value-only HVX intrinsics.
    unsafe { Q6_Vw_vasr_VwR(Q6_Vw_vsub_VwVw(a, b), 31) }
}

/// 32 halves (zero-extended in word lanes) to f32 bits, as `f16ops::h2f`.
#[inline(always)]
unsafe fn h2f_words(h: HvxVector) -> HvxVector {
    // SAFETY: value-only HVX intrinsics.
    unsafe {
        let sign = Q6_Vw_vasl_VwR(Q6_V_vand_VV(h, splat(0x8000)), 16);
        let mag = Q6_V_vand_VV(h, splat(0x7fff));
        let is_sub = lt(mag, splat(0x0400));
        let is_zero = lt(mag, splat(1));
        let is_special = lt(splat(0x7bff), mag);
        let is_nan = lt(splat(0x7c00), mag);
        // Normals: rebias by 112; infinities and NaNs by 224 (exponent 255), NaNs quiet.
        let rebias = Q6_Vw_vadd_VwVw(splat(112 << 23), Q6_V_vand_VV(is_special, splat(112 << 23)));
        let norm = Q6_V_vor_VV(Q6_Vw_vadd_VwVw(Q6_Vw_vasl_VwR(mag, 13), rebias), Q6_V_vand_VV(is_nan, splat(0x0040_0000)));
        // Subnormals, mag·2^-24: the leading 1 (bit 31 − z) moved to bit 23, whose carry
        // into the exponent field makes `133 − z` the exponent 127 − 24 + (31 − z).
        let z = Q6_Vuw_vcl0_Vuw(mag);
        let sub = Q6_Vw_vadd_VwVw(Q6_Vw_vasl_VwR(Q6_Vw_vsub_VwVw(splat(133), z), 23), Q6_Vw_vasl_VwVw(mag, Q6_Vw_vsub_VwVw(z, splat(8))));
        let sub = Q6_V_vand_VV(sub, Q6_V_vand_VV(is_sub, Q6_V_vnot_V(is_zero)));
        Q6_V_vor_VV(Q6_V_vor_VV(Q6_V_vand_VV(norm, Q6_V_vnot_V(is_sub)), sub), sign)
    }
}

/// 32 f32 (bits) to halves in the low 16 bits of each word, as `f16ops::f2h`.
#[inline(always)]
unsafe fn f2h_words(x: HvxVector) -> HvxVector {
    // SAFETY: value-only HVX intrinsics.
    unsafe {
        let sign = Q6_V_vand_VV(Q6_Vuw_vlsr_VuwR(x, 16), splat(0x8000));
        let a = Q6_V_vand_VV(x, splat(0x7fff_ffff));
        // f16 normals: rebias, round the 13 dropped bits to nearest even; at and above
        // 65520 (and for infinities) the result reaches 0x7c00 and is held there.
        let r = Q6_Vw_vsub_VwVw(a, splat(0x3800_0000));
        let odd = Q6_V_vand_VV(Q6_Vuw_vlsr_VuwR(r, 13), splat(1));
        let hn = Q6_Vuw_vlsr_VuwR(Q6_Vw_vadd_VwVw(Q6_Vw_vadd_VwVw(r, splat(0x0fff)), odd), 13);
        let hn = Q6_Vw_vmin_VwVw(hn, splat(0x7c00));
        // NaNs: quiet, the payload's top 10 bits kept.
        let is_nan = lt(splat(0x7f80_0000), a);
        let hn = Q6_V_vor_VV(hn, Q6_V_vand_VV(is_nan, Q6_V_vor_VV(splat(0x0200), Q6_V_vand_VV(Q6_Vuw_vlsr_VuwR(a, 13), splat(0x03ff)))));
        // Below 2^-14: the significand (leading 1 at bit 23) shifted down by 126 − e,
        // rounded to nearest even (at most 31: everything below 2^-25 goes to 0).
        let e = Q6_Vuw_vlsr_VuwR(a, 23);
        let shift = Q6_Vw_vmin_VwVw(Q6_Vw_vsub_VwVw(splat(126), e), splat(31));
        let m = Q6_V_vor_VV(Q6_V_vand_VV(a, splat(0x007f_ffff)), splat(0x0080_0000));
        let half_less = Q6_Vw_vsub_VwVw(Q6_Vw_vasl_VwVw(splat(1), Q6_Vw_vsub_VwVw(shift, splat(1))), splat(1));
        let odd_s = Q6_V_vand_VV(Q6_Vw_vlsr_VwVw(m, shift), splat(1));
        let hs = Q6_Vw_vlsr_VwVw(Q6_Vw_vadd_VwVw(Q6_Vw_vadd_VwVw(m, half_less), odd_s), shift);
        let is_sub = lt(a, splat(0x3880_0000));
        Q6_V_vor_VV(Q6_V_vor_VV(Q6_V_vand_VV(hn, Q6_V_vnot_V(is_sub)), Q6_V_vand_VV(hs, is_sub)), sign)
    }
}

/// Up to 64 halves (`x.len() <= 64`) as 64 f32 (the lanes past `x.len()` are zero's):
/// [`load_in`] of the whole slice.
#[inline(always)]
fn load(x: &[f16]) -> [f32; W] {
    let v = load_in::<2>(x, 0, x.len());
    *v.as_flattened().first_chunk::<W>().expect("two vectors are 64 f32")
}

/// The first `y.len()` (at most 64) of `f` as halves into `y`.
#[inline(always)]
fn store(f: [f32; W], y: &mut [f16]) {
    // SAFETY: value-only HVX intrinsics; 64 f32 are two vectors.
    let packed = unsafe {
        let [lo, hi] = core::mem::transmute::<[f32; W], [HvxVector; 2]>(f);
        Q6_Vh_vpacke_VwVw(f2h_words(hi), f2h_words(lo))
    };
    if y.len() == W {
        // SAFETY: 64 halves = 128 writable bytes; unaligned vector store.
        unsafe { write_unaligned(y.as_mut_ptr() as *mut HvxVector, packed) };
    } else {
        // SAFETY: a vector is 64 halves.
        let h = unsafe { core::mem::transmute::<HvxVector, [f16; W]>(packed) };
        let m = y.len();
        y.copy_from_slice(&h[..m]);
    }
}

/// `dst[i] = f32(src[i])` (`Kernels::f16_to_f32`): chunks of 64 by one vector load
/// each; a chunk of 32 (a head of 32) from 8-aligned halves by [`halves_32`] and one
/// vector store, no padded copy; shorter ones padded.
pub(super) fn to_f32(src: &[f16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    for (s, d) in src[..n].chunks(W).zip(dst[..n].chunks_mut(W)) {
        if let (Some(f), 32) = (halves_32(s), d.len()) {
            // SAFETY: `d` is 32 f32 = 128 writable bytes.
            unsafe { write_unaligned(d.as_mut_ptr() as *mut HvxVector, f) };
            continue;
        }
        let f = load(s);
        if d.len() == W {
            // SAFETY: 64 f32 = 256 writable bytes.
            unsafe { write_unaligned(d.as_mut_ptr() as *mut [f32; W], f) };
        } else {
            let m = d.len();
            d.copy_from_slice(&f[..m]);
        }
    }
}

/// Exactly 32 halves at an 8-byte aligned address as one vector of 32 f32, read by
/// eight word-pair loads (no padded copy): `None` otherwise.
#[inline(always)]
fn halves_32(s: &[f16]) -> Option<HvxVector> {
    if s.len() != 32 || s.as_ptr().align_offset(8) != 0 {
        return None;
    }
    let p = s.as_ptr() as *const u64;
    // SAFETY: 32 halves = 8 aligned u64; a vector is 16 u64; value-only HVX intrinsics.
    Some(unsafe {
        let h = core::mem::transmute::<[u64; 16], HvxVector>(core::array::from_fn(|i| if i < 8 { p.add(i).read() } else { 0 }));
        h2f_words(Q6_V_lo_W(Q6_Wuw_vunpack_Vuh(h)))
    })
}

/// `dst[i] = f16(src[i])` (`Kernels::f32_to_f16`): chunks of 64 by vector loads and a
/// vector store; a chunk of 32 (a head of 32) by one vector load and, into 8-aligned
/// halves, eight word-pair stores; shorter ones padded.
pub(super) fn to_f16(src: &[f32], dst: &mut [f16]) {
    let n = src.len().min(dst.len());
    for (s, d) in src[..n].chunks(W).zip(dst[..n].chunks_mut(W)) {
        if s.len() == 32 && d.as_ptr().align_offset(8) == 0 {
            // SAFETY: 32 f32 = one readable vector.
            store_32(unsafe { read_unaligned(s.as_ptr() as *const HvxVector) }, d);
            continue;
        }
        let f = if s.len() == W {
            // SAFETY: 64 f32 = 256 readable bytes.
            unsafe { read_unaligned(s.as_ptr() as *const [f32; W]) }
        } else {
            let mut f = [0f32; W];
            f[..s.len()].copy_from_slice(s);
            f
        };
        store(f, d);
    }
}

/// `y = f16(op(f32(y), f32(x)))` element by element over chunks of 64, for the rows
/// whose reference arithmetic is that one operation in f32 (`n <` [`F16_STEP`]).
#[inline(always)]
fn by_chunks(y: &mut [f16], x: Option<&[f16]>, op: impl Fn(f32, f32) -> f32) {
    let n = y.len();
    for c in (0..n).step_by(W) {
        let m = (n - c).min(W);
        let mut yf = load(&y[c..c + m]);
        match x {
            Some(x) => {
                let xf = load(&x[c..c + m]);
                for (a, &b) in yf[..m].iter_mut().zip(&xf[..m]) {
                    *a = op(*a, b);
                }
            }
            None => yf[..m].iter_mut().for_each(|a| *a = op(*a, 0.0)),
        }
        store(yf, &mut y[c..c + m]);
    }
}

/// `y += x·v` (`Kernels::f16_mad`): the reference's `f16(fma(x, v, y))` below
/// [`F16_STEP`] elements; longer rows (their native-f16 part) are the reference's code.
pub(super) fn mad(y: &mut [f16], x: &[f16], v: f32) {
    let n = y.len().min(x.len());
    if n >= F16_STEP {
        return f16ops::mad(y, x, v);
    }
    by_chunks(&mut y[..n], Some(&x[..n]), |y, x| crate::fused::fmaf(x, v, y));
}

/// `y *= v` (`Kernels::f16_scale`): the reference's `f16(y·v)` below [`F16_STEP`].
pub(super) fn scale(y: &mut [f16], v: f32) {
    if y.len() >= F16_STEP {
        return f16ops::scale(y, v);
    }
    by_chunks(y, None, |y, _| y * v);
}

/// K·Q dot (`Kernels::f16_dot`), the reference's operations in its order: whole
/// [`DOT_STEP`]s in 64 lanes of fma chains and their fixed reduction, then the leftover
/// products added in f64.
pub(super) fn dot(x: &[f16], y: &[f16]) -> f32 {
    let n = x.len().min(y.len());
    let np = n - n % DOT_STEP;
    let mut acc = [0f32; DOT_STEP];
    for i in (0..np).step_by(DOT_STEP) {
        let (xf, yf) = (load(&x[i..i + DOT_STEP]), load(&y[i..i + DOT_STEP]));
        for ((a, &p), &q) in acc.iter_mut().zip(&xf).zip(&yf) {
            *a = crate::fused::fmaf(p, q, *a);
        }
    }
    let mut sum = f16ops::reduce_lanes(&acc) as f64;
    if np < n {
        let (xf, yf) = (load(&x[np..n]), load(&y[np..n]));
        for (&p, &q) in xf[..n - np].iter().zip(&yf[..n - np]) {
            sum += (p * q) as f64;
        }
    }
    sum as f32
}

/// `V` vectors of f32 (`32·V` values; `V` is 1 or 2) from the halves of `base` at `off`
/// (`m <= 32·V` of them wanted, `off + m <= base.len()`): one unaligned vector load
/// straight from `base` when 64 halves from `off` lie inside it (the lanes past `m` are
/// then the row's neighbours, never used), else a padded copy. A key or value row of a
/// cache is almost always followed by more of the cache, so rows shorter than a vector
/// cost no copy; rows of 32 convert one vector, not two.
#[inline(always)]
fn load_in<const V: usize>(base: &[f16], off: usize, m: usize) -> [[f32; 32]; V] {
    let v = if base.len() - off >= W {
        // SAFETY: 64 halves = 128 readable bytes from `off`; unaligned vector load.
        unsafe { read_unaligned(base[off..].as_ptr() as *const HvxVector) }
    } else {
        let mut h = [f16::ZERO; W];
        h[..m].copy_from_slice(&base[off..off + m]);
        // SAFETY: a whole stack array of 64 halves.
        unsafe { read_unaligned(h.as_ptr() as *const HvxVector) }
    };
    // SAFETY: value-only HVX intrinsics; a vector is 32 f32.
    unsafe {
        let w = Q6_Wuw_vunpack_Vuh(v);
        core::array::from_fn(|i| core::mem::transmute::<HvxVector, [f32; 32]>(h2f_words(if i == 0 { Q6_V_lo_W(w) } else { Q6_V_hi_W(w) })))
    }
}

/// The most elements per row [`dot_keys`] keeps in f32 on the stack; longer rows go key
/// by key ([`super::super::dot_keys_by_key`]).
const ROW_MAX: usize = 256;
// `dot_keys` takes a chunk of `W` key elements as one step of `DOT_STEP` lanes.
const _: () = assert!(W == DOT_STEP);

/// `Kernels::f16_dot_keys`: [`dot`] of every key row with `q`, `q` converted once for all
/// keys and each key row converted straight from the cache. The same operations as
/// [`dot`] in its order; with no whole [`DOT_STEP`] (rows of 32), the sum starts from
/// 0.0, which is what reducing 64 zero lanes gives.
pub(super) fn dot_keys(t: &super::super::KernelTable, k: &[f16], offs: &[usize], q: &[f16], out: &mut [f32]) {
    let n = q.len();
    if n > ROW_MAX || n == 0 {
        return super::super::dot_keys_by_key(t, k, offs, q, out);
    }
    if n == 32 {
        return dot_keys_32(k, offs, q, out);
    }
    if n == DOT_STEP {
        return dot_keys_64(k, offs, q, out);
    }
    let np = n - n % DOT_STEP;
    // q as f32, [`W`] at a time: only the chunks `n` covers are written (not zeroed
    // first: a call per query and head) and read.
    let mut qmem = [MaybeUninit::<[[f32; 32]; 2]>::uninit(); ROW_MAX / W];
    for (c, qc) in qmem.iter_mut().zip(q.chunks(W)) {
        c.write(load_in::<2>(qc, 0, qc.len()));
    }
    // SAFETY: the first n.div_ceil(W) chunks were written just above.
    let qf = unsafe { &*(core::ptr::from_ref(&qmem[..n.div_ceil(W)]) as *const [[[f32; 32]; 2]]) };
    let tail = n - np;
    for (o, &off) in out.iter_mut().zip(offs) {
        assert!(off <= k.len() && k.len() - off >= n, "f16 dot_keys: key row outside the cache");
        let mut sum = 0f64;
        if np > 0 {
            // The lanes start as the first chunk's `fma(k, q, +0.0)`, the reference's step
            // from zeroed lanes (not zeroed first: a 256-byte memset per key).
            let (kf, q0) = (load_in::<2>(k, off, W), qf[0].as_flattened());
            let mut acc: [f32; DOT_STEP] = core::array::from_fn(|j| crate::fused::fmaf(kf.as_flattened()[j], q0[j], 0.0));
            for (i, qc) in qf[..np / W].iter().enumerate().skip(1) {
                let kf = load_in::<2>(k, off + i * W, W);
                for ((a, &p), &q) in acc.iter_mut().zip(kf.as_flattened()).zip(qc.as_flattened()) {
                    *a = crate::fused::fmaf(p, q, *a);
                }
            }
            sum = f16ops::reduce_lanes(&acc) as f64;
        }
        let qt = if tail > 0 { &qf[np / W].as_flattened()[..tail] } else { &[] };
        if tail > 32 {
            sum = add_products(sum, &load_in::<2>(k, off + np, tail), qt);
        } else if tail > 0 {
            sum = add_products(sum, &load_in::<1>(k, off + np, tail), qt);
        }
        *o = sum as f32;
    }
}

/// [`dot_keys`] for rows of 32 (no whole [`DOT_STEP`]: the reference's sum is `+0.0`
/// plus each product `k·q` rounded to f32, added in f64 in element order, then rounded
/// to f32), two keys at a time by [`dot2_32`]; an odd last key as [`dot_keys`] does.
fn dot_keys_32(k: &[f16], offs: &[usize], q: &[f16], out: &mut [f32]) {
    let mut qv = Vectors([splat(0); 4]);
    qv.0[0] = as_vector(load_in::<1>(q, 0, 32)[0]);
    let row = |off: usize| {
        assert!(off <= k.len() && k.len() - off >= 32, "f16 dot_keys: key row outside the cache");
        load_in::<1>(k, off, 32)
    };
    let mut kv = Vectors([splat(0); 4]);
    let pairs = offs.len().min(out.len()) / 2;
    for (o, off) in out[..2 * pairs].chunks_exact_mut(2).zip(offs.chunks_exact(2)) {
        (kv.0[0], kv.0[1]) = (as_vector(row(off[0])[0]), as_vector(row(off[1])[0]));
        // SAFETY: three aligned vectors of 32 f32 each.
        let (a, b) = unsafe { dot2_32(kv.0.as_ptr() as *const f32, kv.0.as_ptr().add(1) as *const f32, qv.0.as_ptr() as *const f32) };
        (o[0], o[1]) = (a, b);
    }
    if let (Some(o), Some(&off)) = (out.get_mut(2 * pairs), offs.get(2 * pairs)) {
        *o = add_products(0.0, &row(off), &qv.f32s()[..32]) as f32;
    }
}

/// [`dot_keys`] for rows of one [`DOT_STEP`] (64, no tail): `q` made f32 once, each key
/// row made f32 on HVX into an aligned buffer, then [`dot_64`].
fn dot_keys_64(k: &[f16], offs: &[usize], q: &[f16], out: &mut [f32]) {
    let (mut qv, mut kv) = (Vectors([splat(0); 4]), Vectors([splat(0); 4]));
    let qf = load_in::<2>(q, 0, DOT_STEP);
    (qv.0[0], qv.0[1]) = (as_vector(qf[0]), as_vector(qf[1]));
    for (o, &off) in out.iter_mut().zip(offs) {
        assert!(off <= k.len() && k.len() - off >= DOT_STEP, "f16 dot_keys: key row outside the cache");
        let kf = load_in::<2>(k, off, DOT_STEP);
        (kv.0[0], kv.0[1]) = (as_vector(kf[0]), as_vector(kf[1]));
        // SAFETY: two aligned vectors (64 f32) in each buffer.
        *o = unsafe { dot_64(kv.0.as_ptr() as *const f32, qv.0.as_ptr() as *const f32) };
    }
}

/// The dot of a row of 64 f32 (`k`) with `q` in the reference's operations (see
/// [`dot_keys`]: lane `l` = `fma(k[l], q[l], +0.0)`, then `f16ops::reduce_lanes`: `s[l] =
/// (a[l] + a[32+l]) + (a[16+l] + a[48+l])`, `t[i] = s[8+i] + s[i]`, then `hsum8(t)`), lanes
/// `l` and `l + 1` as register pairs (`memd`): 127 float operations in 65 packets (the
/// two float slots full but for one), each lane's zeroed accumulator (`combine`) and the
/// loads beside them. Scheduled by a list scheduler (the float and memory slots, one
/// packet from a result to its use) with registers allocated by liveness.
///
/// # Safety
/// `k` and `q` each point to 64 f32, 8-byte aligned.
#[inline(always)]
unsafe fn dot_64(k: *const f32, q: *const f32) -> f32 {
    let out: u32;
    // SAFETY: reads the caller's 256 bytes at each pointer; r0-r17 and r20-r25 are
    // declared clobbered.
    unsafe {
        asm!(
            "{{ r1:0 = memd({kp}+#0); r3:2 = memd({qp}+#0); r5:4 = combine(#0, #0); r7:6 = combine(#0, #0) }}",
            "{{ r4 += sfmpy(r0, r2); r5 += sfmpy(r1, r3); r9:8 = memd({kp}+#128); r11:10 = memd({qp}+#128) }}",
            "{{ r6 += sfmpy(r8, r10); r7 += sfmpy(r9, r11); r13:12 = memd({kp}+#64); r15:14 = memd({qp}+#64) }}",
            "{{ r16 = sfadd(r4, r6); r17 = sfadd(r5, r7); r21:20 = combine(#0, #0); r23:22 = memd({kp}+#192) }}",
            "{{ r20 += sfmpy(r12, r14); r21 += sfmpy(r13, r15); r25:24 = memd({qp}+#192); r1:0 = combine(#0, #0) }}",
            "{{ r0 += sfmpy(r22, r24); r1 += sfmpy(r23, r25); r3:2 = memd({kp}+#32); r9:8 = memd({qp}+#32) }}",
            "{{ r10 = sfadd(r20, r0); r11 = sfadd(r21, r1); r5:4 = combine(#0, #0); r7:6 = memd({kp}+#160) }}",
            "{{ r12 = sfadd(r16, r10); r13 = sfadd(r17, r11); r15:14 = memd({qp}+#160); r23:22 = combine(#0, #0) }}",
            "{{ r4 += sfmpy(r2, r8); r5 += sfmpy(r3, r9); r25:24 = memd({kp}+#96) }}",
            "{{ r22 += sfmpy(r6, r14); r23 += sfmpy(r7, r15); r21:20 = memd({qp}+#96); r1:0 = combine(#0, #0) }}",
            "{{ r16 = sfadd(r4, r22); r17 = sfadd(r5, r23); r11:10 = memd({kp}+#224); r3:2 = memd({qp}+#224) }}",
            "{{ r0 += sfmpy(r24, r20); r1 += sfmpy(r25, r21); r9:8 = combine(#0, #0) }}",
            "{{ r8 += sfmpy(r10, r2); r9 += sfmpy(r11, r3); r7:6 = memd({kp}+#8); r15:14 = memd({qp}+#8) }}",
            "{{ r4 = sfadd(r0, r8); r5 = sfadd(r1, r9); r23:22 = combine(#0, #0); r25:24 = memd({kp}+#136) }}",
            "{{ r20 = sfadd(r16, r4); r21 = sfadd(r17, r5); r11:10 = memd({qp}+#136); r3:2 = combine(#0, #0) }}",
            "{{ r0 = sfadd(r20, r12); r1 = sfadd(r21, r13); r9:8 = memd({kp}+#72) }}",
            "{{ r22 += sfmpy(r6, r14); r23 += sfmpy(r7, r15) }}",
            "{{ r2 += sfmpy(r24, r10); r3 += sfmpy(r25, r11); r17:16 = memd({qp}+#72); r5:4 = combine(#0, #0) }}",
            "{{ r12 = sfadd(r22, r2); r13 = sfadd(r23, r3); r21:20 = memd({kp}+#200); r7:6 = memd({qp}+#200) }}",
            "{{ r4 += sfmpy(r8, r16); r5 += sfmpy(r9, r17); r15:14 = combine(#0, #0) }}",
            "{{ r14 += sfmpy(r20, r6); r15 += sfmpy(r21, r7); r25:24 = memd({kp}+#40); r11:10 = memd({qp}+#40) }}",
            "{{ r22 = sfadd(r4, r14); r23 = sfadd(r5, r15); r3:2 = combine(#0, #0); r9:8 = memd({kp}+#168) }}",
            "{{ r16 = sfadd(r12, r22); r17 = sfadd(r13, r23); r21:20 = memd({qp}+#168); r7:6 = combine(#0, #0) }}",
            "{{ r2 += sfmpy(r24, r10); r3 += sfmpy(r25, r11); r5:4 = memd({kp}+#104) }}",
            "{{ r6 += sfmpy(r8, r20); r7 += sfmpy(r9, r21); r15:14 = memd({qp}+#104); r13:12 = combine(#0, #0) }}",
            "{{ r22 = sfadd(r2, r6); r23 = sfadd(r3, r7); r25:24 = memd({kp}+#232); r11:10 = memd({qp}+#232) }}",
            "{{ r12 += sfmpy(r4, r14); r13 += sfmpy(r5, r15); r9:8 = combine(#0, #0) }}",
            "{{ r8 += sfmpy(r24, r10); r9 += sfmpy(r25, r11); r21:20 = memd({kp}+#16); r3:2 = memd({qp}+#16) }}",
            "{{ r6 = sfadd(r12, r8); r7 = sfadd(r13, r9); r5:4 = combine(#0, #0); r15:14 = memd({kp}+#144) }}",
            "{{ r24 = sfadd(r22, r6); r25 = sfadd(r23, r7); r11:10 = memd({qp}+#144); r13:12 = combine(#0, #0) }}",
            "{{ r8 = sfadd(r24, r16); r9 = sfadd(r25, r17); r23:22 = memd({kp}+#80) }}",
            "{{ r4 += sfmpy(r20, r2); r5 += sfmpy(r21, r3) }}",
            "{{ r12 += sfmpy(r14, r10); r13 += sfmpy(r15, r11); r7:6 = memd({qp}+#80); r17:16 = combine(#0, #0) }}",
            "{{ r24 = sfadd(r4, r12); r25 = sfadd(r5, r13); r21:20 = memd({kp}+#208); r3:2 = memd({qp}+#208) }}",
            "{{ r16 += sfmpy(r22, r6); r17 += sfmpy(r23, r7); r15:14 = combine(#0, #0) }}",
            "{{ r14 += sfmpy(r20, r2); r15 += sfmpy(r21, r3); r11:10 = memd({kp}+#48); r5:4 = memd({qp}+#48) }}",
            "{{ r12 = sfadd(r16, r14); r13 = sfadd(r17, r15); r23:22 = combine(#0, #0); r7:6 = memd({kp}+#176) }}",
            "{{ r20 = sfadd(r24, r12); r21 = sfadd(r25, r13); r3:2 = memd({qp}+#176); r17:16 = combine(#0, #0) }}",
            "{{ r22 += sfmpy(r10, r4); r23 += sfmpy(r11, r5); r15:14 = memd({kp}+#112) }}",
            "{{ r16 += sfmpy(r6, r2); r17 += sfmpy(r7, r3); r25:24 = memd({qp}+#112); r13:12 = combine(#0, #0) }}",
            "{{ r10 = sfadd(r22, r16); r11 = sfadd(r23, r17); r5:4 = memd({kp}+#240); r7:6 = memd({qp}+#240) }}",
            "{{ r12 += sfmpy(r14, r24); r13 += sfmpy(r15, r25); r3:2 = combine(#0, #0) }}",
            "{{ r2 += sfmpy(r4, r6); r3 += sfmpy(r5, r7); r23:22 = memd({kp}+#24); r17:16 = memd({qp}+#24) }}",
            "{{ r14 = sfadd(r12, r2); r15 = sfadd(r13, r3); r25:24 = combine(#0, #0); r5:4 = memd({kp}+#152) }}",
            "{{ r6 = sfadd(r10, r14); r7 = sfadd(r11, r15); r13:12 = memd({qp}+#152); r3:2 = combine(#0, #0) }}",
            "{{ r10 = sfadd(r6, r20); r11 = sfadd(r7, r21); r15:14 = memd({kp}+#88) }}",
            "{{ r24 += sfmpy(r22, r16); r25 += sfmpy(r23, r17) }}",
            "{{ r2 += sfmpy(r4, r12); r3 += sfmpy(r5, r13); r21:20 = memd({qp}+#88); r7:6 = combine(#0, #0) }}",
            "{{ r22 = sfadd(r24, r2); r23 = sfadd(r25, r3); r17:16 = memd({kp}+#216); r5:4 = memd({qp}+#216) }}",
            "{{ r6 += sfmpy(r14, r20); r7 += sfmpy(r15, r21); r13:12 = combine(#0, #0) }}",
            "{{ r12 += sfmpy(r16, r4); r13 += sfmpy(r17, r5); r25:24 = memd({kp}+#56); r3:2 = memd({qp}+#56) }}",
            "{{ r14 = sfadd(r6, r12); r15 = sfadd(r7, r13); r21:20 = combine(#0, #0); r17:16 = memd({kp}+#184) }}",
            "{{ r4 = sfadd(r22, r14); r5 = sfadd(r23, r15); r7:6 = memd({qp}+#184); r13:12 = combine(#0, #0) }}",
            "{{ r20 += sfmpy(r24, r2); r21 += sfmpy(r25, r3); r23:22 = memd({kp}+#120) }}",
            "{{ r12 += sfmpy(r16, r6); r13 += sfmpy(r17, r7); r15:14 = memd({qp}+#120); r25:24 = combine(#0, #0) }}",
            "{{ r2 = sfadd(r20, r12); r3 = sfadd(r21, r13); r17:16 = memd({kp}+#248); r7:6 = memd({qp}+#248) }}",
            "{{ r24 += sfmpy(r22, r14); r25 += sfmpy(r23, r15); r21:20 = combine(#0, #0) }}",
            "{{ r20 += sfmpy(r16, r6); r21 += sfmpy(r17, r7) }}",
            "{{ r12 = sfadd(r24, r20); r13 = sfadd(r25, r21) }}",
            "{{ r22 = sfadd(r2, r12); r23 = sfadd(r3, r13) }}",
            "{{ r14 = sfadd(r22, r4); r15 = sfadd(r23, r5) }}",
            "{{ r16 = sfadd(r10, r0); r17 = sfadd(r11, r1) }}",
            "{{ r6 = sfadd(r14, r8); r7 = sfadd(r15, r9) }}",
            "{{ r24 = sfadd(r16, r6); r25 = sfadd(r17, r7) }}",
            "{{ {out} = sfadd(r24, r25) }}",
            kp = in(reg) k,
            qp = in(reg) q,
            out = lateout(reg) out,
            out("r0") _, out("r1") _, out("r2") _, out("r3") _, out("r4") _, out("r5") _, out("r6") _, out("r7") _,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _, out("r12") _, out("r13") _, out("r14") _, out("r15") _,
            out("r16") _, out("r17") _, out("r20") _, out("r21") _, out("r22") _, out("r23") _, out("r24") _, out("r25") _,
            options(nostack, readonly),
        );
    }
    f32::from_bits(out)
}

/// The dots of two rows of 32 f32 (`ka`, `kb`) with `q` in the reference's operations
/// (see [`dot_keys_32`]): per element both products (`sfmpy`), their conversions to f64,
/// both f64 additions, one packet each (the two float slots full: 96 packets for the
/// pair), the next element pair's three `memd` loads beside them.
///
/// # Safety
/// `ka`, `kb` and `q` each point to 32 f32, 8-byte aligned.
#[inline(always)]
unsafe fn dot2_32(ka: *const f32, kb: *const f32, q: *const f32) -> (f32, f32) {
    let (a, b): (u32, u32);
    // SAFETY: the caller's 3 × 128 bytes, read only; r0-r18 and r20-r23 clobbered (r19
    // is not used).
    unsafe {
        asm!(
            "{{ r5:4 = memd({ka}+#0); r7:6 = memd({kb}+#0) }}",
            "{{ r9:8 = memd({qp}+#0); r1:0 = combine(#0, #0); r3:2 = combine(#0, #0) }}",
            "{{ r16 = sfmpy(r4, r8); r17 = sfmpy(r6, r8) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17); r11:10 = memd({ka}+#8); r13:12 = memd({kb}+#8) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22); r15:14 = memd({qp}+#8) }}",
            "{{ r16 = sfmpy(r5, r9); r17 = sfmpy(r7, r9) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ r16 = sfmpy(r10, r14); r17 = sfmpy(r12, r14) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17); r5:4 = memd({ka}+#16); r7:6 = memd({kb}+#16) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22); r9:8 = memd({qp}+#16) }}",
            "{{ r16 = sfmpy(r11, r15); r17 = sfmpy(r13, r15) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ r16 = sfmpy(r4, r8); r17 = sfmpy(r6, r8) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17); r11:10 = memd({ka}+#24); r13:12 = memd({kb}+#24) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22); r15:14 = memd({qp}+#24) }}",
            "{{ r16 = sfmpy(r5, r9); r17 = sfmpy(r7, r9) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ r16 = sfmpy(r10, r14); r17 = sfmpy(r12, r14) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17); r5:4 = memd({ka}+#32); r7:6 = memd({kb}+#32) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22); r9:8 = memd({qp}+#32) }}",
            "{{ r16 = sfmpy(r11, r15); r17 = sfmpy(r13, r15) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ r16 = sfmpy(r4, r8); r17 = sfmpy(r6, r8) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17); r11:10 = memd({ka}+#40); r13:12 = memd({kb}+#40) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22); r15:14 = memd({qp}+#40) }}",
            "{{ r16 = sfmpy(r5, r9); r17 = sfmpy(r7, r9) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ r16 = sfmpy(r10, r14); r17 = sfmpy(r12, r14) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17); r5:4 = memd({ka}+#48); r7:6 = memd({kb}+#48) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22); r9:8 = memd({qp}+#48) }}",
            "{{ r16 = sfmpy(r11, r15); r17 = sfmpy(r13, r15) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ r16 = sfmpy(r4, r8); r17 = sfmpy(r6, r8) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17); r11:10 = memd({ka}+#56); r13:12 = memd({kb}+#56) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22); r15:14 = memd({qp}+#56) }}",
            "{{ r16 = sfmpy(r5, r9); r17 = sfmpy(r7, r9) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ r16 = sfmpy(r10, r14); r17 = sfmpy(r12, r14) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17); r5:4 = memd({ka}+#64); r7:6 = memd({kb}+#64) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22); r9:8 = memd({qp}+#64) }}",
            "{{ r16 = sfmpy(r11, r15); r17 = sfmpy(r13, r15) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ r16 = sfmpy(r4, r8); r17 = sfmpy(r6, r8) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17); r11:10 = memd({ka}+#72); r13:12 = memd({kb}+#72) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22); r15:14 = memd({qp}+#72) }}",
            "{{ r16 = sfmpy(r5, r9); r17 = sfmpy(r7, r9) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ r16 = sfmpy(r10, r14); r17 = sfmpy(r12, r14) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17); r5:4 = memd({ka}+#80); r7:6 = memd({kb}+#80) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22); r9:8 = memd({qp}+#80) }}",
            "{{ r16 = sfmpy(r11, r15); r17 = sfmpy(r13, r15) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ r16 = sfmpy(r4, r8); r17 = sfmpy(r6, r8) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17); r11:10 = memd({ka}+#88); r13:12 = memd({kb}+#88) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22); r15:14 = memd({qp}+#88) }}",
            "{{ r16 = sfmpy(r5, r9); r17 = sfmpy(r7, r9) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ r16 = sfmpy(r10, r14); r17 = sfmpy(r12, r14) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17); r5:4 = memd({ka}+#96); r7:6 = memd({kb}+#96) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22); r9:8 = memd({qp}+#96) }}",
            "{{ r16 = sfmpy(r11, r15); r17 = sfmpy(r13, r15) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ r16 = sfmpy(r4, r8); r17 = sfmpy(r6, r8) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17); r11:10 = memd({ka}+#104); r13:12 = memd({kb}+#104) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22); r15:14 = memd({qp}+#104) }}",
            "{{ r16 = sfmpy(r5, r9); r17 = sfmpy(r7, r9) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ r16 = sfmpy(r10, r14); r17 = sfmpy(r12, r14) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17); r5:4 = memd({ka}+#112); r7:6 = memd({kb}+#112) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22); r9:8 = memd({qp}+#112) }}",
            "{{ r16 = sfmpy(r11, r15); r17 = sfmpy(r13, r15) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ r16 = sfmpy(r4, r8); r17 = sfmpy(r6, r8) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17); r11:10 = memd({ka}+#120); r13:12 = memd({kb}+#120) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22); r15:14 = memd({qp}+#120) }}",
            "{{ r16 = sfmpy(r5, r9); r17 = sfmpy(r7, r9) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ r16 = sfmpy(r10, r14); r17 = sfmpy(r12, r14) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ r16 = sfmpy(r11, r15); r17 = sfmpy(r13, r15) }}",
            "{{ r21:20 = convert_sf2df(r16); r23:22 = convert_sf2df(r17) }}",
            "{{ r1:0 = dfadd(r1:0, r21:20); r3:2 = dfadd(r3:2, r23:22) }}",
            "{{ {a} = convert_df2sf(r1:0); {b} = convert_df2sf(r3:2) }}",
            ka = in(reg) ka,
            kb = in(reg) kb,
            qp = in(reg) q,
            a = lateout(reg) a,
            b = lateout(reg) b,
            out("r0") _, out("r1") _, out("r2") _, out("r3") _, out("r4") _, out("r5") _, out("r6") _, out("r7") _,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _, out("r12") _, out("r13") _, out("r14") _, out("r15") _,
            out("r16") _, out("r17") _, out("r20") _, out("r21") _, out("r22") _, out("r23") _,
            options(nostack, readonly),
        );
    }
    (f32::from_bits(a), f32::from_bits(b))
}

/// `sum` plus the products `kf[i]·q[i]` (`i < q.len()`, at most `32·V`), each added in
/// f64 in order: the reference dot's leftover elements.
#[inline(always)]
fn add_products<const V: usize>(mut sum: f64, kf: &[[f32; 32]; V], q: &[f32]) -> f64 {
    for (&p, &q) in kf.as_flattened().iter().zip(q) {
        sum += (p * q) as f64;
    }
    sum
}

/// `Kernels::f16_mad_keys` for rows shorter than [`F16_STEP`] (longer ones go key by
/// key): the f16 accumulator `y` is held as f32 of f16 values across the keys (read
/// once, written once) in vectors of 32, each step `y = f16(fma(x, v, y))` (after `y =
/// f16(y·e)` on a new maximum, then `v = 1`), as [`scale`] and [`mad`] compute it key by
/// key: per key and 32 values, the value row converted on HVX into an aligned buffer,
/// the 32 fused multiply-adds by [`fma_32`] (scalar `sffma`, pairs loaded and stored by
/// `memd`: 25 packets, the bound of its 48 loads and stores), and the rounding to f16 and
/// back on HVX: as a 13-bit rounding of the bits ([`Plain`]) while every value stays
/// in the f16 normals' range, else (seen at the end of the call) the whole call again
/// with the full conversions.
pub(super) fn mad_keys(t: &super::super::KernelTable, y: &mut [f16], x: &[f16], offs: &[usize], new_max: &[bool], e: &[f32]) {
    let n = y.len();
    if n >= F16_STEP || n == 0 {
        return super::super::mad_keys_by_key(t, y, x, offs, new_max, e);
    }
    // The roundings as plain 13-bit roundings of the f32 bits ([`Plain`]); if a value left
    // their range, the call again with the full conversions (same bits, slower).
    let mut range = Plain::new();
    let acc = mad_keys_with(y, x, offs, new_max, e, |v| range.round(v));
    let acc = if range.held() { acc } else { mad_keys_with(y, x, offs, new_max, e, round_vectors) };
    for (k, ys) in y.chunks_mut(32).enumerate() {
        store_32(acc.0[k], ys);
    }
}

/// [`mad_keys`]' steps over every key with `round` as the rounding to f16 and back: the
/// accumulator (`y` as f32, at most four vectors) after the last key.
#[inline(always)]
fn mad_keys_with(y: &[f16], x: &[f16], offs: &[usize], new_max: &[bool], e: &[f32], mut round: impl FnMut(&mut [HvxVector])) -> Vectors {
    let n = y.len();
    // The accumulator and the key's value row as f32, 32 per vector (at most 4).
    let nv = n.div_ceil(32);
    let (mut acc, mut row) = (Vectors([splat(0); 4]), Vectors([splat(0); 4]));
    for (k, yc) in y.chunks(32).enumerate() {
        acc.0[k] = halves_32(yc).unwrap_or_else(|| as_vector(load_in::<1>(yc, 0, yc.len())[0]));
    }
    for ((&off, &nm), &ec) in offs.iter().zip(new_max).zip(e) {
        assert!(off <= x.len() && x.len() - off >= n, "f16 mad_keys: value row outside the cache");
        for k in 0..nv {
            let m = (n - 32 * k).min(32);
            row.0[k] = as_vector(load_in::<1>(x, off + 32 * k, m)[0]);
        }
        let v = if nm {
            for a in acc.f32s_mut()[..32 * nv].iter_mut() {
                *a *= ec;
            }
            round(&mut acc.0[..nv]);
            1.0
        } else {
            ec
        };
        for k in 0..nv {
            // SAFETY: vector k of each buffer: 32 f32, 128-byte aligned.
            unsafe { fma_32(acc.0.as_mut_ptr().add(k) as *mut f32, row.0.as_ptr().add(k) as *const f32, v) };
        }
        round(&mut acc.0[..nv]);
    }
    acc
}

/// Rounding f32 to f16 and back where that is a plain rounding of the bits: for zero and
/// for `2^-14 <= |x| < 65520` (the f16 normals and what rounds to them), `f32(f16(x))` is
/// `x` with its 13 low bits rounded to nearest even (`(x + 0xfff + bit 13) & !0x1fff`: a
/// carry into the exponent is the rounding up to the next binade). 5 vector operations
/// (one shift) against the full conversions' ~50; beside them the smallest nonzero and the
/// largest magnitude seen, so that [`Plain::held`] can say whether every value was in
/// that range (else the caller computes again with the full conversions).
struct Plain {
    /// Per lane the largest `|x|` bits.
    hi: HvxVector,
    /// Per lane the smallest `|x| + 0x7fff_ffff` (wrapping; zero maps to `i32::MAX`).
    lo: HvxVector,
}

impl Plain {
    fn new() -> Self {
        Plain { hi: splat(0), lo: splat(i32::MAX) }
    }

    #[inline(always)]
    fn round(&mut self, v: &mut [HvxVector]) {
        for c in v {
            // SAFETY: value-only HVX intrinsics.
            unsafe {
                let a = Q6_V_vand_VV(*c, splat(0x7fff_ffff));
                self.hi = Q6_Vw_vmax_VwVw(self.hi, a);
                self.lo = Q6_Vw_vmin_VwVw(self.lo, Q6_Vw_vadd_VwVw(a, splat(0x7fff_ffff)));
                let odd = Q6_V_vand_VV(Q6_Vuw_vlsr_VuwR(*c, 13), splat(1));
                *c = Q6_V_vand_VV(Q6_Vw_vadd_VwVw(Q6_Vw_vadd_VwVw(*c, splat(0x0fff)), odd), splat(!0x1fff));
            }
        }
    }

    /// Whether every value rounded was zero or in `[2^-14, 65520)` in magnitude.
    fn held(&self) -> bool {
        // SAFETY: a vector is 32 i32.
        let (hi, lo) = unsafe { (core::mem::transmute::<HvxVector, [i32; 32]>(self.hi), core::mem::transmute::<HvxVector, [i32; 32]>(self.lo)) };
        // |x| >= 2^-14 is `lo >= 0x3880_0000 − 1 + i32::MIN` for nonzero x (zero stays at
        // i32::MAX); |x| < 65520 is `hi < 0x477f_f000` (NaN and ±inf are above).
        hi.iter().all(|&h| h < 0x477f_f000) && lo.iter().all(|&l| l >= (0x3880_0000 - 1) + i32::MIN)
    }
}

/// The first `y.len()` (at most 32) of the 32 f32 in `v` as halves into `y`: eight
/// word-pair stores when `y` is 32 halves, 8-byte aligned, else a copy.
#[inline(always)]
fn store_32(v: HvxVector, y: &mut [f16]) {
    // SAFETY: value-only HVX intrinsics; a vector is 16 u64.
    let w = unsafe { core::mem::transmute::<HvxVector, [u64; 16]>(Q6_Vh_vpacke_VwVw(splat(0), f2h_words(v))) };
    if y.len() == 32 && y.as_ptr().align_offset(8) == 0 {
        let p = y.as_mut_ptr() as *mut u64;
        for (i, &x) in w[..8].iter().enumerate() {
            // SAFETY: 32 halves = 8 aligned, writable u64.
            unsafe { p.add(i).write(x) };
        }
    } else {
        // SAFETY: 16 u64 are 64 halves.
        let h = unsafe { core::mem::transmute::<[u64; 16], [f16; W]>(w) };
        let m = y.len();
        y.copy_from_slice(&h[..m]);
    }
}

/// Four aligned vectors (128 f32).
#[repr(C, align(128))]
struct Vectors([HvxVector; 4]);

impl Vectors {
    fn f32s(&self) -> &[f32; 128] {
        // SAFETY: four vectors are 128 f32 (any bits are valid).
        unsafe { &*(self.0.as_ptr() as *const [f32; 128]) }
    }

    fn f32s_mut(&mut self) -> &mut [f32; 128] {
        // SAFETY: as above.
        unsafe { &mut *(self.0.as_mut_ptr() as *mut [f32; 128]) }
    }
}

#[inline(always)]
fn as_vector(f: [f32; 32]) -> HvxVector {
    // SAFETY: 32 f32 are one vector.
    unsafe { core::mem::transmute::<[f32; 32], HvxVector>(f) }
}

/// Each vector's 32 f32 rounded to f16 and back (the accumulator's rounding after each
/// step).
#[inline(always)]
fn round_vectors(v: &mut [HvxVector]) {
    for c in v {
        // SAFETY: value-only HVX intrinsics.
        unsafe { *c = h2f_words(f2h_words(*c)) };
    }
}

/// `y[i] = fma(x[i], v, y[i])` for 32 f32 (`sffma`, one rounding), hand-scheduled:
/// 16 pairs, each loaded by two `memd` and stored by one, two multiply-adds per packet.
///
/// # Safety
/// `y` and `x` point to 32 f32 each, 8-byte aligned, `y` writable.
#[inline(always)]
unsafe fn fma_32(y: *mut f32, x: *const f32, v: f32) {
    // SAFETY: the caller's 256 bytes; registers r0-r15 (four pairs for x, four for y,
    // in turn) are declared clobbered.
    unsafe {
        asm!(
            "{{ r1:0 = memd({xp}+#0); r9:8 = memd({yp}+#0) }}",
            "{{ r8 += sfmpy(r0, {v}); r9 += sfmpy(r1, {v}); r3:2 = memd({xp}+#8); r11:10 = memd({yp}+#8) }}",
            "{{ r10 += sfmpy(r2, {v}); r11 += sfmpy(r3, {v}); memd({yp}+#0) = r9:8; r5:4 = memd({xp}+#16) }}",
            "{{ memd({yp}+#8) = r11:10; r13:12 = memd({yp}+#16) }}",
            "{{ r12 += sfmpy(r4, {v}); r13 += sfmpy(r5, {v}); r7:6 = memd({xp}+#24); r15:14 = memd({yp}+#24) }}",
            "{{ r14 += sfmpy(r6, {v}); r15 += sfmpy(r7, {v}); memd({yp}+#16) = r13:12; r1:0 = memd({xp}+#32) }}",
            "{{ memd({yp}+#24) = r15:14; r9:8 = memd({yp}+#32) }}",
            "{{ r8 += sfmpy(r0, {v}); r9 += sfmpy(r1, {v}); r3:2 = memd({xp}+#40); r11:10 = memd({yp}+#40) }}",
            "{{ r10 += sfmpy(r2, {v}); r11 += sfmpy(r3, {v}); memd({yp}+#32) = r9:8; r5:4 = memd({xp}+#48) }}",
            "{{ memd({yp}+#40) = r11:10; r13:12 = memd({yp}+#48) }}",
            "{{ r12 += sfmpy(r4, {v}); r13 += sfmpy(r5, {v}); r7:6 = memd({xp}+#56); r15:14 = memd({yp}+#56) }}",
            "{{ r14 += sfmpy(r6, {v}); r15 += sfmpy(r7, {v}); memd({yp}+#48) = r13:12; r1:0 = memd({xp}+#64) }}",
            "{{ memd({yp}+#56) = r15:14; r9:8 = memd({yp}+#64) }}",
            "{{ r8 += sfmpy(r0, {v}); r9 += sfmpy(r1, {v}); r3:2 = memd({xp}+#72); r11:10 = memd({yp}+#72) }}",
            "{{ r10 += sfmpy(r2, {v}); r11 += sfmpy(r3, {v}); memd({yp}+#64) = r9:8; r5:4 = memd({xp}+#80) }}",
            "{{ memd({yp}+#72) = r11:10; r13:12 = memd({yp}+#80) }}",
            "{{ r12 += sfmpy(r4, {v}); r13 += sfmpy(r5, {v}); r7:6 = memd({xp}+#88); r15:14 = memd({yp}+#88) }}",
            "{{ r14 += sfmpy(r6, {v}); r15 += sfmpy(r7, {v}); memd({yp}+#80) = r13:12; r1:0 = memd({xp}+#96) }}",
            "{{ memd({yp}+#88) = r15:14; r9:8 = memd({yp}+#96) }}",
            "{{ r8 += sfmpy(r0, {v}); r9 += sfmpy(r1, {v}); r3:2 = memd({xp}+#104); r11:10 = memd({yp}+#104) }}",
            "{{ r10 += sfmpy(r2, {v}); r11 += sfmpy(r3, {v}); memd({yp}+#96) = r9:8; r5:4 = memd({xp}+#112) }}",
            "{{ memd({yp}+#104) = r11:10; r13:12 = memd({yp}+#112) }}",
            "{{ r12 += sfmpy(r4, {v}); r13 += sfmpy(r5, {v}); r7:6 = memd({xp}+#120); r15:14 = memd({yp}+#120) }}",
            "{{ r14 += sfmpy(r6, {v}); r15 += sfmpy(r7, {v}); memd({yp}+#112) = r13:12 }}",
            "{{ memd({yp}+#120) = r15:14 }}",
            yp = in(reg) y,
            xp = in(reg) x,
            v = in(reg) v.to_bits(),
            out("r0") _, out("r1") _, out("r2") _, out("r3") _, out("r4") _, out("r5") _, out("r6") _, out("r7") _,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _, out("r12") _, out("r13") _, out("r14") _, out("r15") _,
            options(nostack),
        );
    }
}

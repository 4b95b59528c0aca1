//! AVX2 + FMA SwiGLU with llama.cpp's vectorized exponential (`ops::ggml_expf`), 8
//! lanes at a time, the same bits as the scalar `ops::swiglu`: every fma and rounding of
//! the reference happens here on the same values, and `vscalefps` is replaced by two
//! exact power-of-two multiplies of which only the second rounds. Only handed out after
//! `cpu_has_avx2_fma()` (module contract of `x86`).
//!
//! GeGLU by table, as ggml's CPU does: `ops::geglu` rounds its input to f16 and its GELU
//! to f16, so the GELU is a function of the input's 16 bits; the 65536 values are
//! computed once with `ops::gelu_tanh` (the reference's own function) into a static
//! table (128 KiB, x86_64 builds only), and looked up. Until the table is built (the
//! first caller builds it; others racing with it compute directly) the reference runs.

use core::arch::x86_64::*;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU8, Ordering};
use half::f16;

/// Entries of the GELU table: one per f16, and one unused so that a 4-byte gather at any
/// entry stays inside the table.
const GELU_LEN: usize = 65536 + 2;

/// `f16(gelu_tanh(f32(h)))` by the bits of `h`, for [`geglu`].
struct GeluTable(UnsafeCell<[u16; GELU_LEN]>);

// SAFETY: written only by the one thread that moved GELU_STATE from EMPTY to BUILDING,
// read only after GELU_STATE is READY (release/acquire), never written after that.
unsafe impl Sync for GeluTable {}

static GELU: GeluTable = GeluTable(UnsafeCell::new([0; GELU_LEN]));
static GELU_STATE: AtomicU8 = AtomicU8::new(EMPTY);
const EMPTY: u8 = 0;
const BUILDING: u8 = 1;
const READY: u8 = 2;

/// The GELU table once built (building it if no thread has started to).
fn gelu_table() -> Option<&'static [u16; GELU_LEN]> {
    match GELU_STATE.load(Ordering::Acquire) {
        // SAFETY: READY: fully written, never written again (see GeluTable).
        READY => return Some(unsafe { &*GELU.0.get() }),
        BUILDING => return None,
        _ => {}
    }
    if GELU_STATE.compare_exchange(EMPTY, BUILDING, Ordering::Acquire, Ordering::Relaxed).is_err() {
        return None;
    }
    // SAFETY: this thread won EMPTY -> BUILDING: the only writer, and no reader yet.
    let t = unsafe { &mut *GELU.0.get() };
    for (bits, e) in t[..65536].iter_mut().enumerate() {
        *e = f16::from_f32(crate::ops::gelu_tanh(f16::from_bits(bits as u16).to_f32())).to_bits();
    }
    GELU_STATE.store(READY, Ordering::Release);
    // SAFETY: READY from here on.
    Some(unsafe { &*GELU.0.get() })
}

/// `gate[i] = gelu(gate[i]) * up[i]`, the bits of `ops::geglu`.
pub(crate) fn geglu(gate: &mut [f32], up: &[f32]) {
    let Some(t) = gelu_table() else { return crate::ops::geglu(gate, up) };
    let n = gate.len().min(up.len());
    let n8 = n - n % 8;
    // SAFETY: AVX2/FMA/F16C present (module contract); n8 elements in both slices; the
    // table has GELU_LEN entries.
    unsafe { geglu_avx2(n8, gate.as_mut_ptr(), up.as_ptr(), t) };
    for (g, &u) in gate[n8..n].iter_mut().zip(&up[n8..n]) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            f16::from_bits(t[f16::from_f32(x).to_bits() as usize]).to_f32() * u
        };
    }
}

/// [`geglu`] 8 lanes at a time: the input to f16 by F16C (round to nearest even, as
/// `f16::from_f32`; NaNs keep their payload's top bits and become quiet in both), the
/// table entries by one gather (4 bytes at entry `h`: its 16 bits and the next entry's,
/// dropped), back to f32 (exact), times `up`; `0.0` where `x <= -10`, `x·up` where
/// `x >= 10` (NaN: neither, as in the scalar loop).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn geglu_avx2(n: usize, g: *mut f32, u: *const f32, t: &[u16; GELU_LEN]) {
    // SAFETY: n elements at g and u (caller); unaligned loads and stores only; every
    // gather reads 4 bytes at entry h ≤ 65535 of a table of GELU_LEN entries.
    unsafe {
        let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
        // The low 16 bits of each 32-bit lane, packed into the low 8 bytes of each half.
        let low16 = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
        let mut i = 0;
        while i < n {
            let x = _mm256_loadu_ps(g.add(i));
            let up = _mm256_loadu_ps(u.add(i));
            let h = _mm256_cvtepu16_epi32(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
            let e = _mm256_i32gather_epi32::<2>(t.as_ptr().cast(), h);
            let e = _mm256_permute4x64_epi64::<0b1000>(_mm256_shuffle_epi8(e, low16));
            let y = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(e)), up);
            let y = _mm256_blendv_ps(y, _mm256_mul_ps(x, up), _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi));
            let y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps::<_CMP_LE_OQ>(x, lo));
            _mm256_storeu_ps(g.add(i), y);
            i += 8;
        }
    }
}

/// [`crate::ops::rope_heads`] with the FMA unit's fused multiply-add (the reference's
/// `fmaf` is a software one where the build does not assume FMA): the same products,
/// negation and fmas per element, so the same bits. Heads whose rotated dims are not
/// whole vectors (`n_rot` not a multiple of 8, or of 16 with `neox`) take the reference.
pub(crate) fn rope(heads: &mut [f32], hd: usize, cs: &[f32], n_rot: usize, neox: bool) {
    let step = if neox { 16 } else { 8 };
    if hd == 0 || n_rot == 0 || !n_rot.is_multiple_of(step) || n_rot > hd || cs.len() < n_rot {
        return crate::ops::rope_heads(heads, hd, cs, n_rot, neox);
    }
    for h in heads.chunks_exact_mut(hd) {
        // SAFETY: AVX2/FMA present (module contract); n_rot <= hd elements of the head and
        // n_rot of cs (checked above).
        unsafe { rope_avx2(h.as_mut_ptr(), cs.as_ptr(), n_rot, neox) };
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn rope_avx2(h: *mut f32, cs: *const f32, n_rot: usize, neox: bool) {
    // SAFETY: n_rot elements at h and cs, n_rot a multiple of 8 (16 with neox) (caller);
    // unaligned loads and stores only.
    unsafe {
        let neg = |v: __m256| _mm256_xor_ps(v, _mm256_set1_ps(-0.0));
        if neox {
            // Pairs (i, i + n_rot/2): x0' = fma(x0, c, -(x1·s)), x1' = fma(x0, s, x1·c).
            let half = n_rot / 2;
            for i in (0..half).step_by(8) {
                let (a, b) = (_mm256_loadu_ps(cs.add(2 * i)), _mm256_loadu_ps(cs.add(2 * i + 8)));
                // [c0 s0 c1 s1 ..] -> c0..c7 and s0..s7.
                let c = _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(_mm256_shuffle_ps::<0b10_00_10_00>(a, b))));
                let s = _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(_mm256_shuffle_ps::<0b11_01_11_01>(a, b))));
                let (x0, x1) = (_mm256_loadu_ps(h.add(i)), _mm256_loadu_ps(h.add(half + i)));
                _mm256_storeu_ps(h.add(i), _mm256_fmadd_ps(x0, c, neg(_mm256_mul_ps(x1, s))));
                _mm256_storeu_ps(h.add(half + i), _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
            }
        } else {
            // Adjacent pairs: even lanes fma(x0, c, -(x1·s)), odd lanes fma(x0, s, x1·c).
            for i in (0..n_rot).step_by(8) {
                let (x, p) = (_mm256_loadu_ps(h.add(i)), _mm256_loadu_ps(cs.add(i)));
                let (c, s) = (_mm256_moveldup_ps(p), _mm256_movehdup_ps(p));
                let xs = _mm256_permute_ps::<0b10_11_00_01>(x); // [x1 x0 ..]
                let even = _mm256_fmadd_ps(x, c, neg(_mm256_mul_ps(xs, s)));
                let odd = _mm256_fmadd_ps(xs, s, _mm256_mul_ps(x, c));
                _mm256_storeu_ps(h.add(i), _mm256_blend_ps::<0b1010_1010>(even, odd));
            }
        }
    }
}

/// `gate[i] = silu(gate[i]) * up[i]`.
pub(crate) fn swiglu(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let n8 = n - n % 8;
    // SAFETY: AVX2/FMA present (module contract); n8 elements in both slices.
    unsafe { swiglu_avx2(n8, gate.as_mut_ptr(), up.as_ptr()) };
    crate::ops::swiglu(&mut gate[n8..n], &up[n8..n]);
}

#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_avx2(n: usize, g: *mut f32, u: *const f32) {
    // SAFETY: n elements at g and u (caller); unaligned loads and stores only.
    unsafe {
        let mut i = 0;
        while i < n {
            let x = _mm256_loadu_ps(g.add(i));
            let e = expf8(_mm256_sub_ps(_mm256_setzero_ps(), x));
            let s = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            _mm256_storeu_ps(g.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(u.add(i))));
            i += 8;
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn expf8(x: __m256) -> __m256 {
    // SAFETY: value-only intrinsics; AVX2 and FMA available (this fn's target features).
    unsafe {
        let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
        let r = c(0x4B40_0000);
        let z = _mm256_fmadd_ps(x, c(0x3FB8_AA3B), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(n, c(0x35BF_BE8E), _mm256_fnmadd_ps(n, c(0x3F31_7200), x));
        let u = _mm256_mul_ps(b, b);
        let p1 = _mm256_fmadd_ps(_mm256_fmadd_ps(c(0x3C07_2010), b, c(0x3D2B_9F17)), u, _mm256_fmadd_ps(c(0x3E2A_AF33), b, c(0x3EFF_FEDB)));
        let j = _mm256_fmadd_ps(p1, u, _mm256_fmadd_ps(c(0x3F7F_FFF6), b, _mm256_set1_ps(1.0)));
        // j · 2^n as two exact power-of-two factors (|n| <= 192 lanes).
        let ni = _mm256_cvtps_epi32(n);
        let n1 = _mm256_srai_epi32::<1>(ni);
        let n2 = _mm256_sub_epi32(ni, n1);
        let pow = |e: __m256i| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(e, _mm256_set1_epi32(127))));
        let res = _mm256_mul_ps(_mm256_mul_ps(j, pow(n1)), pow(n2));
        let big = _mm256_cmp_ps::<_CMP_GT_OQ>(_mm256_andnot_ps(_mm256_set1_ps(-0.0), n), _mm256_set1_ps(192.0));
        if _mm256_testz_ps(big, big) == 1 {
            return res;
        }
        let alt = _mm256_blendv_ps(_mm256_set1_ps(f32::INFINITY), _mm256_setzero_ps(), _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps()));
        _mm256_blendv_ps(res, alt, big)
    }
}

/// `x[i] = ops::expf(x[i])` (the f64 exponential rounded to f32), bit for bit, four lanes
/// at a time in f64 ([`expf_avx2`]; with AVX-512 eight, [`expf_avx512`]): `e^x` as
/// `2^(k/m)·e^r` from a table of `2^(j/m)` and a Taylor polynomial in the remainder `r`,
/// within 2^-43 of e^x (relative), and libm's f64 `exp` within 1 ulp (2^-52), so both
/// round to the same f32 unless e^x lies within ~2^-42 of a point halfway between two
/// f32s; a lane whose f64 result is within 2^12 f64 ulps (2^-40) of such a point, or
/// whose x is outside (-87, 87) (no normal f32 result, or NaN), is recomputed by
/// `ops::expf` itself. (Tests `expf_batch_gives_the_reference_bits` and
/// `expf_batch_every_f32_in_range`: every f32 in (-87, 88) gives ops::expf's bits in both
/// kernel sets.)
pub(crate) fn expf_batch(x: &mut [f32], avx512: bool) {
    let mut done = 0;
    if avx512 {
        done = x.len() - x.len() % 8;
        // SAFETY: AVX-512 F/BW/VL present (`avx512`: the caller checked
        // cpu_has_avx512()); `done` elements at x.
        unsafe { expf_avx512(done, x.as_mut_ptr()) };
    }
    let n4 = done + (x.len() - done) / 4 * 4;
    // SAFETY: AVX2/FMA present (module contract); n4 - done elements at x + done.
    unsafe { expf_avx2(n4 - done, x.as_mut_ptr().add(done)) };
    for v in &mut x[n4..] {
        *v = crate::ops::expf(*v);
    }
}

/// The lanes of a batched `expf` step that its vector result cannot vouch for (bit `l`
/// of `redo`): `x[l] = ops::expf(src[l])` for each, `src` the step's inputs.
///
/// # Safety
/// `src.len()` writable elements at `x`.
#[inline]
unsafe fn expf_lanes_again(x: *mut f32, src: &[f32], redo: u32) {
    for (l, s) in src.iter().enumerate() {
        if redo >> l & 1 == 1 {
            // SAFETY: l < src.len() elements at x (the caller's contract).
            unsafe { *x.add(l) = crate::ops::expf(*s) };
        }
    }
}

/// `2^(j/16)` for j in 0..16, each the f64 nearest to it ([`expf_avx512`]'s table).
const EXP2_SIXTEENTHS: [u64; 16] = [
    0x3FF0_0000_0000_0000, 0x3FF0_B558_6CF9_890F, 0x3FF1_72B8_3C7D_517B, 0x3FF2_387A_6E75_6238,
    0x3FF3_06FE_0A31_B715, 0x3FF3_DEA6_4C12_3422, 0x3FF4_BFDA_D536_2A27, 0x3FF5_AB07_DD48_5429,
    0x3FF6_A09E_667F_3BCD, 0x3FF7_A114_73EB_0187, 0x3FF8_ACE5_422A_A0DB, 0x3FF9_C491_82A3_F090,
    0x3FFA_E89F_995A_D3AD, 0x3FFC_199B_DD85_529C, 0x3FFD_5818_DCFB_A487, 0x3FFE_A4AF_A2A4_90DA,
];

/// [`expf_avx2`]'s method on eight lanes (512-bit f64 vectors) with a table: `k =
/// round(x·16/log 2)` (the 1.5·2^52 shift, which leaves `k + 16·1023` in the low bits),
/// `r = x - k·log 2/16` in two fma steps (|r| <= log 2/32 < 0.02167), Taylor degree 5 in
/// `r` (within r^6/720·e^|r| < 1.5·10^-13 < 2^-42.6 of e^r, relatively), times
/// `2^(k mod 16 / 16)` from the table and `2^floor(k/16)` by `vscalefpd`: within 2^-42.5
/// of e^x relatively, inside the window of 2^12 ulps (at least 2^-41 relatively) around
/// an f32 halfway point whose lanes are recomputed (the same test as `expf_avx2`; lanes
/// with x outside (-87, 87) or NaN are recomputed too). 23 vector operations per 8 lanes
/// instead of 34, two such chains a step (test `expf_batch_every_f32_in_range` checks every
/// f32).
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
unsafe fn expf_avx512(n: usize, x: *mut f32) {
    // SAFETY: n elements at x (caller, a multiple of 8); unaligned loads and stores only.
    unsafe {
        let c = _mm512_set1_pd;
        let t = |i: usize| _mm512_castsi512_pd(_mm512_loadu_si512(EXP2_SIXTEENTHS.as_ptr().add(i).cast()));
        let (t0, t1) = (t(0), t(8));
        // 1.5·2^52 + 16·1023: k's integer, biased by 16·1023, in the low bits of the sum.
        let shift = c(6_755_399_441_072_112.0);
        // Eight lanes from xs: their results, and the lanes to recompute.
        let lanes8 = |xs: __m256| -> (__m256, u8) {
            // NaN, or |x| >= 87 (no normal f32 result, or near the edge): recomputed.
            let out = _mm256_cmp_ps_mask::<_CMP_NLT_UQ>(_mm256_andnot_ps(_mm256_set1_ps(-0.0), xs), _mm256_set1_ps(87.0));
            let xd = _mm512_cvtps_pd(xs);
            let z = _mm512_fmadd_pd(xd, c(f64::from_bits(0x4037_1547_652B_82FE)), shift); // 16/log 2
            let k = _mm512_sub_pd(z, shift);
            let r = _mm512_fnmadd_pd(k, c(f64::from_bits(0x3FA6_2E42_FEFA_39EF)), xd); // log 2/16
            let r = _mm512_fnmadd_pd(k, c(f64::from_bits(0x3C3A_BC9E_3B39_803F)), r); // log 2/16 - that
            let mut p = c(1.0 / 120.0);
            for coef in [1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
                p = _mm512_fmadd_pd(p, r, c(coef));
            }
            // Table entry k mod 16 (the index's low four bits), times 2^floor(k/16)
            // (`vscalefpd` scales by 2^floor of its second operand; k/16 is exact).
            let tj = _mm512_permutex2var_pd(t0, _mm512_castpd_si512(z), t1);
            let y = _mm512_scalef_pd(_mm512_mul_pd(p, tj), _mm512_mul_pd(k, c(0.0625)));
            // Within 2^12 ulps of an f32 halfway point: the 29 bits dropped by the
            // rounding to f32 within 2^12 of 2^28 (their sum with 2^12 - 2^28 below 2^13).
            let low = _mm512_add_epi64(_mm512_castpd_si512(y), _mm512_set1_epi64((1 << 12) - (1 << 28)));
            let near = _mm512_testn_epi64_mask(low, _mm512_set1_epi64(((1 << 29) - 1) & !((1 << 13) - 1)));
            (_mm512_cvtpd_ps(y), near | out)
        };
        // Sixteen lanes a step (two independent chains, one branch), then eight.
        let mut i = 0;
        while i < n {
            let m = (n - i).min(16);
            let xa = _mm256_loadu_ps(x.add(i));
            let xb = if m == 16 { _mm256_loadu_ps(x.add(i + 8)) } else { xa };
            let (ya, ra) = lanes8(xa);
            let (yb, rb) = if m == 16 { lanes8(xb) } else { (ya, 0) };
            let redo = u16::from(ra) | u16::from(rb) << 8;
            _mm256_storeu_ps(x.add(i), ya);
            if m == 16 {
                _mm256_storeu_ps(x.add(i + 8), yb);
            }
            if redo != 0 {
                let mut src = [0.0f32; 16];
                _mm256_storeu_ps(src.as_mut_ptr(), xa);
                _mm256_storeu_ps(src.as_mut_ptr().add(8), xb);
                expf_lanes_again(x.add(i), &src[..m], u32::from(redo));
            }
            i += m;
        }
    }
}

/// [`expf_batch`]'s AVX2 method, four lanes of f64 at a time, eight a step: `k =
/// round(x·4/log 2)` (the 1.5·2^52 shift, which leaves `k + 4·1023` in the low bits of the
/// sum), `r = x - k·log 2/4` in two fma steps (|r| <= log 2/8 < 0.0867), Taylor degree 7
/// in `r` (within r^8/8!·e^|r| < 8.7·10^-14 < 2^-43.3 of e^r, relatively), times
/// `2^(k mod 4 / 4)` (entries 0, 4, 8 and 12 of [`EXP2_SIXTEENTHS`], chosen by two
/// in-lane permutes and a blend on k's two low bits) and `2^floor(k/4)` (the sum's bits
/// shifted into the exponent): within 2^-43 of e^x, inside the window of 2^12 ulps (at
/// least 2^-41 relatively) around an f32 halfway point whose lanes are recomputed by
/// `ops::expf`, as are lanes with x outside (-87, 87) or NaN. Before the table, Taylor
/// degree 11 over |r| <= log 2/2, a rounding instruction for k and a two-sided window
/// test: 1.09-1.11 ns a value on a Zen 5, now 0.82-0.84 (`quant::bench::bench_expf`).
#[target_feature(enable = "avx2,fma")]
unsafe fn expf_avx2(n: usize, x: *mut f32) {
    // SAFETY: n elements at x (caller, a multiple of 4); unaligned loads and stores only.
    unsafe {
        let c = _mm256_set1_pd;
        let t = |j: usize| f64::from_bits(EXP2_SIXTEENTHS[4 * j]);
        // 2^(j/4) for k mod 4 = j: bit 0 picks within a pair (`vpermilpd` reads bit 1 of
        // its control), bit 1 the pair.
        let (t01, t23) = (_mm256_setr_pd(t(0), t(1), t(0), t(1)), _mm256_setr_pd(t(2), t(3), t(2), t(3)));
        // 1.5·2^52 + 4·1023: k's integer, biased by 4·1023, in the low bits of the sum.
        let shift = c(6_755_399_441_059_836.0);
        // Four lanes from xs: their results, and the lanes near a halfway point.
        let lanes4 = |xs: __m128| -> (__m128, i32) {
            let xd = _mm256_cvtps_pd(xs);
            let z = _mm256_fmadd_pd(xd, c(f64::from_bits(0x4017_1547_652B_82FE)), shift); // 4/log 2
            let k = _mm256_sub_pd(z, shift);
            let r = _mm256_fnmadd_pd(k, c(f64::from_bits(0x3FC6_2E42_FEFA_39EF)), xd); // log 2/4
            let r = _mm256_fnmadd_pd(k, c(f64::from_bits(0x3C5A_BC9E_3B39_803F)), r); // log 2/4 - that
            let mut p = c(1.0 / 5_040.0);
            for coef in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
                p = _mm256_fmadd_pd(p, r, c(coef));
            }
            let zi = _mm256_castpd_si256(z);
            let ctl = _mm256_slli_epi64::<1>(zi);
            let tj = _mm256_blendv_pd(_mm256_permutevar_pd(t01, ctl), _mm256_permutevar_pd(t23, ctl), _mm256_castsi256_pd(_mm256_slli_epi64::<62>(zi)));
            // 2^floor(k/4): bits 2..13 of the sum (floor(k/4) + 1023, at most 11 bits for
            // |x| < 87) into the exponent.
            let scale = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(_mm256_srli_epi64::<2>(zi)));
            let y = _mm256_mul_pd(_mm256_mul_pd(p, tj), scale);
            // Within 2^12 ulps of an f32 halfway point: the 29 bits dropped by the
            // rounding to f32 within 2^12 of 2^28 (their sum with 2^12 - 2^28 below 2^13).
            let low = _mm256_add_epi64(_mm256_castpd_si256(y), _mm256_set1_epi64x((1 << 12) - (1 << 28)));
            let near = _mm256_cmpeq_epi64(_mm256_and_si256(low, _mm256_set1_epi64x(((1 << 29) - 1) & !((1 << 13) - 1))), _mm256_setzero_si256());
            (_mm256_cvtpd_ps(y), _mm256_movemask_pd(_mm256_castsi256_pd(near)))
        };
        // NaN, or |x| >= 87 (no normal f32 result, or near the edge): recomputed.
        let out = |xs: __m128| _mm_movemask_ps(_mm_cmp_ps::<_CMP_NLT_UQ>(_mm_andnot_ps(_mm_set1_ps(-0.0), xs), _mm_set1_ps(87.0)));
        let mut i = 0;
        while i < n {
            // Eight lanes a step (two independent chains, one branch), then four.
            let m = (n - i).min(8);
            let xa = _mm_loadu_ps(x.add(i));
            let xb = if m == 8 { _mm_loadu_ps(x.add(i + 4)) } else { xa };
            let (ya, ra) = lanes4(xa);
            let (yb, rb) = if m == 8 { lanes4(xb) } else { (ya, 0) };
            _mm_storeu_ps(x.add(i), ya);
            if m == 8 {
                _mm_storeu_ps(x.add(i + 4), yb);
            }
            let redo = (ra | out(xa)) | if m == 8 { (rb | out(xb)) << 4 } else { 0 };
            if redo != 0 {
                let mut src = [0.0f32; 8];
                _mm_storeu_ps(src.as_mut_ptr(), xa);
                _mm_storeu_ps(src.as_mut_ptr().add(4), xb);
                expf_lanes_again(x.add(i), &src[..m], redo as u32);
            }
            i += m;
        }
    }
}

#[cfg(test)]
mod tests {
    /// Each table entry is 2^(j/16) to within half an f64 ulp: its distance from libm's
    /// `exp2` (itself within an ulp) is at most one ulp, and the entry squared four times
    /// (j/16 doubled to j) lands within a few ulps of 2^j.
    #[test]
    fn exp2_sixteenths_table() {
        for (j, &bits) in super::EXP2_SIXTEENTHS.iter().enumerate() {
            let t = f64::from_bits(bits);
            let want = libm::exp2(j as f64 / 16.0);
            assert!((t.to_bits() as i64 - want.to_bits() as i64).abs() <= 1, "entry {j}: {t:e} vs {want:e}");
            let p = (0..4).fold(t, |p, _| p * p);
            assert!((p / (1u64 << j) as f64 - 1.0).abs() < 1e-14, "entry {j}: {t:e}^16 = {p:e}");
        }
    }
}

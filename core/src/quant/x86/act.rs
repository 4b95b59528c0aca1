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

/// `f16(gelu_tanh(f32(h)))` by the bits of `h`, for [`geglu`].
struct GeluTable(UnsafeCell<[u16; 65536]>);

// SAFETY: written only by the one thread that moved GELU_STATE from EMPTY to BUILDING,
// read only after GELU_STATE is READY (release/acquire), never written after that.
unsafe impl Sync for GeluTable {}

static GELU: GeluTable = GeluTable(UnsafeCell::new([0; 65536]));
static GELU_STATE: AtomicU8 = AtomicU8::new(EMPTY);
const EMPTY: u8 = 0;
const BUILDING: u8 = 1;
const READY: u8 = 2;

/// The GELU table once built (building it if no thread has started to).
fn gelu_table() -> Option<&'static [u16; 65536]> {
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
    for (bits, e) in t.iter_mut().enumerate() {
        *e = f16::from_f32(crate::ops::gelu_tanh(f16::from_bits(bits as u16).to_f32())).to_bits();
    }
    GELU_STATE.store(READY, Ordering::Release);
    // SAFETY: READY from here on.
    Some(unsafe { &*GELU.0.get() })
}

/// `gate[i] = gelu(gate[i]) * up[i]`, the bits of `ops::geglu`.
pub(crate) fn geglu(gate: &mut [f32], up: &[f32]) {
    let Some(t) = gelu_table() else { return crate::ops::geglu(gate, up) };
    for (g, &u) in gate.iter_mut().zip(up) {
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
unsafe fn expf8(x: __m256) -> __m256 {
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

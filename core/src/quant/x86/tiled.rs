//! One query row's step over one key tile of llama.cpp's tiled attention
//! (`attn_tiled::step_ref`'s bits): the scores of all 64 keys (one fma per head element
//! and key, in element order), masked and scaled; the exponentials by `ggml_v_expf`'s
//! operations 8 lanes at a time; each group of 16 reduced in `_mm512_reduce_add_ps`'s
//! order; the accumulator's fma chain over the keys in order. AVX2 (8 lanes) and
//! AVX-512 (16 lanes) give the same bits: every lane's operations are the reference's.

use core::arch::x86_64::*;

use super::act::expf8;
use crate::attn_tiled::{new_max, TiledRow, TILE};

/// Checks the slices every load and store of a step stays inside.
fn check(q: &[f32], kt: &[f32], vt: &[f32], kq: &[f32], hi: usize, hdv: usize) {
    assert!(kt.len() >= q.len() * TILE && kq.len() >= TILE && hi <= TILE && vt.len() >= hi * hdv, "tiled step: scratch too small");
}

/// Sum of 16 exponentials (two halves of 8) in `_mm512_reduce_add_ps`'s order.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn reduce16(lo: __m256, hi: __m256) -> f32 {
    // SAFETY: value-only intrinsics (this fn's target features).
    unsafe {
        let t3 = _mm256_add_ps(hi, lo);
        let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
        let u = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
        _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps::<1>(u, u)))
    }
}

/// The maximum of 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hmax(v: __m256) -> f32 {
    // SAFETY: value-only intrinsics (this fn's target features).
    unsafe {
        let m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)))
    }
}

/// The exponentials of `kq[t] - m` for the 64 scores (in place) and their sum as
/// `attn_tiled::step_ref` forms it (groups of 16 reduced in f32, added in f64).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exps(kq: &mut [f32], m: f32) -> f64 {
    // SAFETY: kq holds TILE floats (checked by the callers); AVX2/FMA (this fn's features).
    unsafe {
        let mv = _mm256_set1_ps(m);
        let p = kq.as_mut_ptr();
        let mut sum = 0.0f64;
        for g in 0..TILE / 16 {
            let lo = expf8(_mm256_sub_ps(_mm256_loadu_ps(p.add(16 * g)), mv));
            let hi = expf8(_mm256_sub_ps(_mm256_loadu_ps(p.add(16 * g + 8)), mv));
            _mm256_storeu_ps(p.add(16 * g), lo);
            _mm256_storeu_ps(p.add(16 * g + 8), hi);
            sum += reduce16(lo, hi) as f64;
        }
        sum
    }
}

/// The step with 8-lane vectors.
#[allow(clippy::too_many_arguments)]
pub(super) fn step_avx2(q: &[f32], kt: &[f32], vt: &[f32], kq: &mut [f32], lo: usize, hi: usize, scale: f32, row: TiledRow<'_>) {
    check(q, kt, vt, kq, hi, row.acc.len());
    // SAFETY: slices checked above; AVX2/FMA are present (this table is built only then).
    unsafe { avx2(q, kt, vt, kq, lo, hi, scale, row) }
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2(q: &[f32], kt: &[f32], vt: &[f32], kq: &mut [f32], lo: usize, hi: usize, scale: f32, row: TiledRow<'_>) {
    let hdv = row.acc.len();
    // SAFETY: every access is inside kt (q.len()·TILE), kq (TILE), vt (hi·hdv) or acc
    // (hdv) (checked by `step_avx2`).
    unsafe {
        let mut acc = [_mm256_setzero_ps(); TILE / 8];
        for (d, &x) in q.iter().enumerate() {
            let p = _mm256_set1_ps(x);
            let r = kt.as_ptr().add(d * TILE);
            for (g, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(r.add(g * 8)), p, *a);
            }
        }
        let (sc, ninf) = (_mm256_set1_ps(scale), _mm256_set1_ps(f32::NEG_INFINITY));
        let (lov, hiv) = (_mm256_set1_epi32(lo as i32), _mm256_set1_epi32(hi as i32));
        let mut mx = ninf;
        for (g, a) in acc.iter().enumerate() {
            let t = _mm256_add_epi32(_mm256_set1_epi32(8 * g as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            // lo <= t < hi
            let vis = _mm256_andnot_si256(_mm256_cmpgt_epi32(lov, t), _mm256_cmpgt_epi32(hiv, t));
            let s = _mm256_blendv_ps(ninf, _mm256_mul_ps(*a, sc), _mm256_castsi256_ps(vis));
            _mm256_storeu_ps(kq.as_mut_ptr().add(g * 8), s);
            mx = _mm256_max_ps(mx, s);
        }
        let Some(m) = new_max(hmax(mx), row.m, row.acc, row.s) else { return };
        *row.s = (*row.s as f64 + exps(kq, m)) as f32;
        // acc[c] = fma(kq[t], v_t[c], acc[c]) for t in lo..hi, 32 columns at a time.
        let out = row.acc.as_mut_ptr();
        let mut c = 0;
        while c + 32 <= hdv {
            let mut a: [__m256; 4] = core::array::from_fn(|l| _mm256_loadu_ps(out.add(c + 8 * l)));
            for t in lo..hi {
                let p = _mm256_set1_ps(*kq.get_unchecked(t));
                let v = vt.as_ptr().add(t * hdv + c);
                for (l, a) in a.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(p, _mm256_loadu_ps(v.add(8 * l)), *a);
                }
            }
            for (l, a) in a.iter().enumerate() {
                _mm256_storeu_ps(out.add(c + 8 * l), *a);
            }
            c += 32;
        }
        while c + 8 <= hdv {
            let mut a = _mm256_loadu_ps(out.add(c));
            for t in lo..hi {
                a = _mm256_fmadd_ps(_mm256_set1_ps(*kq.get_unchecked(t)), _mm256_loadu_ps(vt.as_ptr().add(t * hdv + c)), a);
            }
            _mm256_storeu_ps(out.add(c), a);
            c += 8;
        }
        for c in c..hdv {
            for t in lo..hi {
                *out.add(c) = libm::fmaf(*kq.get_unchecked(t), *vt.get_unchecked(t * hdv + c), *out.add(c));
            }
        }
    }
}

/// The step with 16-lane vectors (AVX-512 F).
#[allow(clippy::too_many_arguments)]
pub(super) fn step_avx512(q: &[f32], kt: &[f32], vt: &[f32], kq: &mut [f32], lo: usize, hi: usize, scale: f32, row: TiledRow<'_>) {
    check(q, kt, vt, kq, hi, row.acc.len());
    // SAFETY: slices checked above; AVX-512 F/BW/VL are present (this entry is set only
    // in a table built after `cpu_has_avx512()`), and AVX2/FMA with them.
    unsafe { avx512(q, kt, vt, kq, lo, hi, scale, row) }
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
unsafe fn avx512(q: &[f32], kt: &[f32], vt: &[f32], kq: &mut [f32], lo: usize, hi: usize, scale: f32, row: TiledRow<'_>) {
    let hdv = row.acc.len();
    // SAFETY: as in `avx2` (checked by `step_avx512`): one row of the heads' step.
    unsafe { heads_avx512::<1>(q, q.len(), kt, vt, kq, lo, hi, scale, row.acc, hdv, core::slice::from_mut(row.m), core::slice::from_mut(row.s)) }
}

/// The 64 keys' dots with `H` query rows of `hd` (`qs`: row h at `h·hd`), one fma per
/// element and key in element order (`k·q + acc`), as 4 vectors of 16 keys per row:
/// each key tile vector is loaded once for the `H` rows.
///
/// # Safety
/// AVX-512 F present; `kt` holds `hd·TILE` floats, `qs` `H·hd`.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
unsafe fn scores_avx512<const H: usize>(qs: &[f32], hd: usize, kt: &[f32]) -> [[__m512; TILE / 16]; H] {
    // SAFETY: d·TILE + 64 <= hd·TILE floats of kt, h·hd + d < H·hd of qs (caller).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); TILE / 16]; H];
        for d in 0..hd {
            let r = kt.as_ptr().add(d * TILE);
            let k: [__m512; TILE / 16] = core::array::from_fn(|g| _mm512_loadu_ps(r.add(g * 16)));
            for (h, acc) in acc.iter_mut().enumerate() {
                let p = _mm512_set1_ps(*qs.get_unchecked(h * hd + d));
                for (g, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(k[g], p, *a);
                }
            }
        }
        acc
    }
}

/// One row's scores (`acc`: its dots) masked to `lo..hi` and scaled into `kq`, the new
/// maximum (`new_max`: scales the accumulator and sum) and the exponentials in place
/// with their sum added to `s`. False if the tile has no visible key for the row (then
/// the accumulator is not to be updated).
///
/// # Safety
/// AVX-512 F present; `kq` holds TILE floats.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
unsafe fn softmax_avx512(acc: &[__m512; TILE / 16], kq: &mut [f32], lo: usize, hi: usize, scale: f32, m: &mut f32, racc: &mut [f32], s: &mut f32) -> bool {
    // SAFETY: 64 floats stored into kq (caller); value-only intrinsics otherwise.
    unsafe {
        let (sc, ninf) = (_mm512_set1_ps(scale), _mm512_set1_ps(f32::NEG_INFINITY));
        // Visible lanes lo..hi of the 64 as a bit mask.
        let vis: u64 = if hi - lo == 64 { !0 } else { ((1u64 << (hi - lo)) - 1) << lo };
        let mut mx = ninf;
        for (g, a) in acc.iter().enumerate() {
            let s = _mm512_mask_mul_ps(ninf, (vis >> (16 * g)) as u16, *a, sc);
            _mm512_storeu_ps(kq.as_mut_ptr().add(g * 16), s);
            mx = _mm512_max_ps(mx, s);
        }
        let m8 = _mm256_max_ps(_mm512_castps512_ps256(mx), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(mx))));
        let Some(mn) = new_max(hmax(m8), m, racc, s) else { return false };
        *s = (*s as f64 + exps(kq, mn)) as f32;
        true
    }
}

/// `out[c] = fma(kq[t], vt[t·hdv + c], out[c])` for t in `lo..hi` (in order), columns
/// `c0..hdv`: 64 at a time, then 16, then one.
///
/// # Safety
/// AVX-512 F present; `kq` holds TILE floats, `vt` `hi·hdv`, `out` `hdv`.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
unsafe fn acc_update_avx512(kq: &[f32], vt: &[f32], lo: usize, hi: usize, out: *mut f32, hdv: usize, c0: usize) {
    // SAFETY: as stated (caller).
    unsafe {
        let mut c = c0;
        while c + 64 <= hdv {
            let mut a: [__m512; 4] = core::array::from_fn(|l| _mm512_loadu_ps(out.add(c + 16 * l)));
            for t in lo..hi {
                let p = _mm512_set1_ps(*kq.get_unchecked(t));
                let v = vt.as_ptr().add(t * hdv + c);
                for (l, a) in a.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(p, _mm512_loadu_ps(v.add(16 * l)), *a);
                }
            }
            for (l, a) in a.iter().enumerate() {
                _mm512_storeu_ps(out.add(c + 16 * l), *a);
            }
            c += 64;
        }
        while c + 16 <= hdv {
            let mut a = _mm512_loadu_ps(out.add(c));
            for t in lo..hi {
                a = _mm512_fmadd_ps(_mm512_set1_ps(*kq.get_unchecked(t)), _mm512_loadu_ps(vt.as_ptr().add(t * hdv + c)), a);
            }
            _mm512_storeu_ps(out.add(c), a);
            c += 16;
        }
        for c in c..hdv {
            for t in lo..hi {
                *out.add(c) = libm::fmaf(*kq.get_unchecked(t), *vt.get_unchecked(t * hdv + c), *out.add(c));
            }
        }
    }
}

/// The steps of up to 4 query rows that see the same keys (the heads of one token):
/// `qs` their queries (row h at `h·hd`), `accs`/`ms`/`ss` their accumulators (rows of
/// `hdv`), maxima and sums, `kq` scratch for 64 scores per row. Each row's operations
/// are [`step_avx512`]'s, in the same order; the key tile is read once for every row
/// (the scores), and each value vector once for every row (the accumulators, 64
/// columns at a time, when every row has a visible key in the tile).
#[allow(clippy::too_many_arguments)]
pub(super) fn step_heads_avx512(qs: &[f32], kt: &[f32], vt: &[f32], kq: &mut [f32], lo: usize, hi: usize, scale: f32, accs: &mut [f32], ms: &mut [f32], ss: &mut [f32]) {
    let nh = ms.len();
    assert!((1..=4).contains(&nh) && ss.len() == nh && qs.len().is_multiple_of(nh) && accs.len().is_multiple_of(nh), "tiled step: {nh} heads");
    let (hd, hdv) = (qs.len() / nh, accs.len() / nh);
    assert!(kt.len() >= hd * TILE && kq.len() >= nh * TILE && hi <= TILE && lo <= hi && vt.len() >= hi * hdv, "tiled step: scratch too small");
    // SAFETY: slices checked above; AVX-512 F/BW/VL are present (this entry is set only
    // in a table built after `cpu_has_avx512()`), and AVX2/FMA with them.
    unsafe {
        match nh {
            1 => heads_avx512::<1>(qs, hd, kt, vt, kq, lo, hi, scale, accs, hdv, ms, ss),
            2 => heads_avx512::<2>(qs, hd, kt, vt, kq, lo, hi, scale, accs, hdv, ms, ss),
            3 => heads_avx512::<3>(qs, hd, kt, vt, kq, lo, hi, scale, accs, hdv, ms, ss),
            _ => heads_avx512::<4>(qs, hd, kt, vt, kq, lo, hi, scale, accs, hdv, ms, ss),
        }
    }
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
unsafe fn heads_avx512<const H: usize>(qs: &[f32], hd: usize, kt: &[f32], vt: &[f32], kq: &mut [f32], lo: usize, hi: usize, scale: f32, accs: &mut [f32], hdv: usize, ms: &mut [f32], ss: &mut [f32]) {
    // SAFETY: as checked by `step_heads_avx512`: kq holds H·TILE, accs H·hdv, ms and ss
    // H, vt hi·hdv, kt hd·TILE.
    unsafe {
        let acc = scores_avx512::<H>(qs, hd, kt);
        let mut active = [false; H];
        for h in 0..H {
            let (racc, m, s) = (&mut accs[h * hdv..(h + 1) * hdv], &mut ms[h], &mut ss[h]);
            active[h] = softmax_avx512(&acc[h], &mut kq[h * TILE..(h + 1) * TILE], lo, hi, scale, m, racc, s);
        }
        let out = accs.as_mut_ptr();
        let mut c = 0;
        if active.iter().all(|&a| a) {
            while c + 64 <= hdv {
                let mut a: [[__m512; 4]; H] = core::array::from_fn(|h| core::array::from_fn(|l| _mm512_loadu_ps(out.add(h * hdv + c + 16 * l))));
                for t in lo..hi {
                    let v = vt.as_ptr().add(t * hdv + c);
                    let vv: [__m512; 4] = core::array::from_fn(|l| _mm512_loadu_ps(v.add(16 * l)));
                    for (h, a) in a.iter_mut().enumerate() {
                        let p = _mm512_set1_ps(*kq.get_unchecked(h * TILE + t));
                        for (l, a) in a.iter_mut().enumerate() {
                            *a = _mm512_fmadd_ps(p, vv[l], *a);
                        }
                    }
                }
                for (h, a) in a.iter().enumerate() {
                    for (l, a) in a.iter().enumerate() {
                        _mm512_storeu_ps(out.add(h * hdv + c + 16 * l), *a);
                    }
                }
                c += 64;
            }
        }
        for h in (0..H).filter(|&h| active[h]) {
            acc_update_avx512(&kq[h * TILE..(h + 1) * TILE], vt, lo, hi, out.add(h * hdv), hdv, c);
        }
    }
}

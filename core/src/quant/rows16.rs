//! The rows16 weight layout: a matrix's rows in groups of [`ROWS16`], each group's
//! blocks rearranged so that one 512-bit vector holds the same four bytes of sixteen
//! rows (row `r` in 32-bit lane `r`). The CPU's one-token products then need no shuffle
//! to put rows in lanes (each row's weights are already there), and each group is one
//! contiguous stream of bytes. The same bytes as the plain layout, permuted within each
//! group of `16 × row_bytes` bytes: the same size, at the same place.
//!
//! Per (group, block of 32 columns), for the types it applies to:
//! - **Q4_1** (20 bytes a block, 320 a group block): the sixteen f16 `d` (bytes 0..32),
//!   the sixteen f16 `m` (32..64), then four chunks `c` of 64 bytes (64 + 64c..) whose
//!   byte `4r + i` is row `r`'s packed byte `4c + i` (low nibble: element `4c + i`, high
//!   nibble: element `16 + 4c + i`).
//! - **Q8_0** (34 bytes a block, 544 a group block): the sixteen f16 `d` (0..32), then
//!   eight chunks `j` of 64 bytes (32 + 64j..) whose byte `4r + i` is row `r`'s weight
//!   `4j + i`.
//! - **Q4_0** (18 bytes a block, 288 a group block): the sixteen f16 `d` (0..32), then four
//!   chunks as Q4_1's (32 + 64c..).
//! - **Q5_0** (22 bytes a block, 352 a group block): the sixteen f16 `d` (0..32), the
//!   sixteen rows' `qh` (32..96: row `r`'s four bytes at `32 + 4r`, so one vector holds
//!   every row's fifth bits in its lanes), its bits transposed ([`q5_0_qh_to_layout`]:
//!   element `4j + i`'s fifth bit at bit `8i + j`, so that the four bits of the kernels'
//!   lane `j` are one constant shift from bit 4 of each byte), then four chunks of `qs`
//!   as Q4_1's (96 + 64c..).
//! - **Q4_K** (144 bytes a super-block of 256, 2304 a group block): the sixteen f16 `d`
//!   (0..32), the sixteen `dmin` (32..64), then 35 chunks `c` of 64 bytes (64 + 64c..)
//!   whose bytes `4r..4r + 4` are row `r`'s bytes `4c..4c + 4` of the 140 after `d` and
//!   `dmin`: chunks 0..3 its packed 6-bit scales and mins, chunk `3 + m` its `qs` dword
//!   `m`. The products of a batch in llama.cpp's arithmetic (`--batches llama-cpp`) have
//!   their own rows16 kernel for its repacked `gemm` order
//!   ([`Kernels::dot_rows16_fn_in_batch`]).
//! - **Q6_K** (210 bytes a super-block of 256, 3360 a group block; its f16 `d` is the block's
//!   last two bytes): the sixteen `d` (0..32), then 52 chunks of 64 bytes (32 + 64p..) whose
//!   bytes `4r..4r + 4` are row `r`'s dword `c` of the 208 bytes before `d`, in the order the
//!   kernel reads them ([`q6_k_chunk_at`] gives `p` for `c`): first the sixteen 8-bit scales
//!   (dwords 48..52), then for each lane `m` of 4 elements (0..8) and each half `h` of 128
//!   (0..2) the `ql` dwords `16h + m` and `16h + 8 + m` and the `qh` dword `32 + 8h + m`.
//!   Batches of 8 or more tokens in llama.cpp's arithmetic have their own rows16 kernel for
//!   its tiled order.
//!
//! A host packs a matrix in place ([`pack_in_place`]) where the kernel set has the
//! layout's kernels ([`Kernels::dot_rows16_fn`]) and marks it so that the model's tensor
//! says [`crate::model::Layout::Rows16`]; `matmul` then runs the rows16 kernels on it.

use super::{Kernels, Reason, Unsupported};
use crate::ggml_type::GgmlType;

/// Rows per group: one per 32-bit lane of a 512-bit vector.
pub const ROWS16: usize = 16;

/// Whether `ty` has a rows16 layout.
pub fn has_layout(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q4_K | GgmlType::Q6_K)
}

/// The f16 words of a block of `ty` that the layout gathers in their own rows of 16 (Q4_1's
/// `d` and `m`, Q4_K's `d` and `dmin`; one `d` for the others), and the byte they start at
/// (the block's start, but Q6_K's `d` at its end).
fn scale_words(ty: GgmlType) -> (usize, usize) {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q4_K => (2, 0),
        GgmlType::Q6_K => (1, Q6_K_D_AT),
        _ => (1, 0),
    }
}

/// Where a Q6_K block's f16 `d` lies (after `ql`, `qh` and the scales).
const Q6_K_D_AT: usize = 208;

/// The chunk of a Q6_K (group, super-block) that holds the rows' dword `c` of the 208 bytes
/// before `d` (see the module doc): the scales first, then per lane `m` and half `h` its two
/// `ql` dwords and its `qh` dword.
pub(crate) const fn q6_k_chunk_at(c: usize) -> usize {
    if c >= 48 {
        c - 48
    } else if c >= 32 {
        4 + 6 * ((c - 32) % 8) + 3 * ((c - 32) / 8) + 2
    } else {
        4 + 6 * (c % 8) + 3 * (c / 16) + (c % 16) / 8
    }
}

/// The chunk of a (group, block) of `BS`-byte blocks that holds the rows' dword `c` (Q6_K:
/// [`q6_k_chunk_at`]; the others in order).
const fn chunk_at(bs: usize, c: usize) -> usize {
    if bs == 210 {
        q6_k_chunk_at(c)
    } else {
        c
    }
}

/// The first of the block bytes the layout moves a dword at a time (those beside the
/// scale words: after them, or from 0 when they end the block), for `sc` scale words at
/// byte `at`.
const fn data_start(sc: usize, at: usize) -> usize {
    if at == 0 {
        2 * sc
    } else {
        0
    }
}

/// Packs one group: [`ROWS16`] plain rows of `nb` blocks (row `r` at `src[r * wrow..]`)
/// into `dst` (`ROWS16 * nb * type_size` bytes) in the rows16 layout.
fn pack_group(ty: GgmlType, nb: usize, src: &[u8], wrow: usize, dst: &mut [u8]) {
    // Each type's block size and scale words as constants, so that the moves of a block
    // are fixed-size copies the compiler unrolls: SmolLM2 Q4_1's 211 matrices (96 MB) in
    // ~10 ms instead of ~26 with the sizes as variables (AMD EPYC Zen 5), a load's time.
    debug_assert!(has_layout(ty));
    match ty {
        GgmlType::Q4_0 => pack_group_of::<18, 1, 0>(nb, src, wrow, dst, false),
        GgmlType::Q4_1 => pack_group_of::<20, 2, 0>(nb, src, wrow, dst, false),
        GgmlType::Q5_0 => pack_group_of::<22, 1, 0>(nb, src, wrow, dst, true),
        GgmlType::Q8_0 => pack_group_of::<34, 1, 0>(nb, src, wrow, dst, false),
        GgmlType::Q4_K => pack_group_of::<144, 2, 0>(nb, src, wrow, dst, false),
        GgmlType::Q6_K => pack_group_of::<210, 1, Q6_K_D_AT>(nb, src, wrow, dst, false),
        _ => unreachable!("pack_group: {ty:?} has no rows16 layout (checked by the caller)"),
    }
}

/// [`pack_group`] for blocks of `BS` bytes with `SC` f16 scale words at byte `AT` (the
/// block's start or its end; Q5_0's `qh` transposed where `q5`).
#[inline(always)]
fn pack_group_of<const BS: usize, const SC: usize, const AT: usize>(nb: usize, src: &[u8], wrow: usize, dst: &mut [u8], q5: bool) {
    debug_assert!(SC * 2 + 16 <= BS && (AT == 0 || AT + 2 * SC == BS));
    let (gb, d0) = (ROWS16 * BS, data_start(SC, AT));
    for (k, g) in dst[..nb * gb].chunks_exact_mut(gb).enumerate() {
        for r in 0..ROWS16 {
            let b: &[u8; BS] = src[r * wrow + k * BS..][..BS].try_into().expect("a whole block");
            for s in 0..SC {
                g[32 * s + 2 * r..][..2].copy_from_slice(&b[AT + 2 * s..AT + 2 * s + 2]);
            }
            let at = 32 * SC;
            for c in 0..(BS - 2 * SC) / 4 {
                g[at + 64 * chunk_at(BS, c) + 4 * r..][..4].copy_from_slice(&b[d0 + 4 * c..d0 + 4 * c + 4]);
            }
            if q5 {
                let qh = &mut g[at + 4 * r..][..4];
                let t = q5_0_qh_to_layout(u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]));
                qh.copy_from_slice(&t.to_le_bytes());
            }
        }
    }
}

/// A Q5_0 block's `qh` (bit `e`: element `e`'s fifth bit) as the rows16 layout holds it:
/// element `4j + i`'s bit at bit `8i + j` (byte `i`, bit `j`), `j` the 8-lane kernels'
/// lane (elements `4j..4j + 4`). Lane `j`'s four bits then sit at bit `j` of each byte,
/// one constant shift from bit 4 where the weight `q = nibble + 16·bit` needs them.
/// (A byte at a time: byte `m` holds elements `8m + b`, whose bits go to `8(b mod 4) +
/// b/4 + 2m`, so [`Q5_0_QH_BYTE`]`[byte] << 2m`.)
pub(crate) fn q5_0_qh_to_layout(qh: u32) -> u32 {
    qh.to_le_bytes().iter().enumerate().fold(0, |t, (m, &v)| t | Q5_0_QH_BYTE[v as usize] << (2 * m))
}

/// [`q5_0_qh_to_layout`] of a `qh` with only its byte 0 set, for each value of that byte.
const Q5_0_QH_BYTE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut v = 0;
    while v < 256 {
        let mut b = 0;
        while b < 8 {
            if (v >> b) & 1 == 1 {
                table[v] |= 1 << (8 * (b % 4) + b / 4);
            }
            b += 1;
        }
        v += 1;
    }
    table
};

/// The inverse of [`q5_0_qh_to_layout`]: the plain block's `qh`.
pub(crate) fn q5_0_qh_from_layout(t: u32) -> u32 {
    (0..32).fold(0, |qh, e| qh | ((t >> (8 * (e % 4) + e / 4)) & 1) << e)
}

/// Rearranges a plain `rows × cols` matrix of `ty` in `data` into the rows16 layout, in
/// place, through `scratch` (at least `ROWS16 * row_bytes` bytes). Fails (touching
/// nothing) for a type without the layout, rows not a multiple of [`ROWS16`], columns
/// not whole blocks, or slices too short.
pub fn pack_in_place(ty: GgmlType, rows: usize, cols: usize, data: &mut [u8], scratch: &mut [u8]) -> Result<(), Unsupported> {
    let bad = Unsupported { ty, reason: Reason::NoRows16 };
    let bs = ty.block_size();
    if !has_layout(ty) || !rows.is_multiple_of(ROWS16) || !cols.is_multiple_of(bs) {
        return Err(bad);
    }
    let wrow = cols / bs * ty.type_size();
    let group = ROWS16 * wrow;
    if data.len() < rows * wrow || scratch.len() < group {
        return Err(bad);
    }
    for g in data[..rows * wrow].chunks_exact_mut(group) {
        scratch[..group].copy_from_slice(g);
        pack_group(ty, cols / bs, &scratch[..group], wrow, g);
    }
    Ok(())
}

/// Row `r` of a `cols`-column matrix of `ty` held in the rows16 layout in `data`,
/// dequantized into `out` (`cols` floats): each block gathered back to its plain bytes,
/// then dequantized as the plain row's block is (the same floats).
pub fn dequantize_row(k: &Kernels, ty: GgmlType, cols: usize, data: &[u8], r: usize, out: &mut [f32]) -> Result<(), Unsupported> {
    let bad = Unsupported { ty, reason: Reason::NoRows16 };
    let (bs, n) = (ty.type_size(), ty.block_size());
    if !has_layout(ty) || !cols.is_multiple_of(n) || out.len() != cols {
        return Err(bad);
    }
    let gb = ROWS16 * bs;
    let group = data.get((r / ROWS16) * ROWS16 * (cols / n) * bs..).ok_or(bad)?;
    let (i, (scales, at)) = (r % ROWS16, scale_words(ty));
    let d0 = data_start(scales, at);
    let mut b = [0u8; 210];
    for (kb, o) in out.chunks_exact_mut(n).enumerate() {
        let g = group.get(kb * gb..(kb + 1) * gb).ok_or(bad)?;
        for s in 0..scales {
            b[at + 2 * s..at + 2 * s + 2].copy_from_slice(&g[32 * s + 2 * i..32 * s + 2 * i + 2]);
        }
        for c in 0..(bs - 2 * scales) / 4 {
            let p = 32 * scales + 64 * chunk_at(bs, c) + 4 * i;
            b[d0 + 4 * c..d0 + 4 * c + 4].copy_from_slice(&g[p..p + 4]);
        }
        if ty == GgmlType::Q5_0 {
            let qh = q5_0_qh_from_layout(u32::from_le_bytes([b[2], b[3], b[4], b[5]]));
            b[2..6].copy_from_slice(&qh.to_le_bytes());
        }
        k.dequantize_row(ty, &b[..bs], o)?;
    }
    Ok(())
}

impl Kernels {
    /// The rows16 kernel of weight type `wtype` ([`Rows16Fn`]), where this kernel set
    /// has one: x86 with AVX-512 VNNI, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K; x86 with AVX2
    /// alone, Q4_0, Q4_1, Q5_0, Q8_0 and Q4_K.
    pub fn dot_rows16_fn(&self, wtype: GgmlType) -> Option<Rows16Fn> {
        self.t.dot_rows16.get(wtype)
    }

    /// A tile over a matrix in the rows16 layout (its `w` the packed rows, `wrow` the
    /// plain row length in bytes; otherwise as [`Kernels::dot_tile_fn`]: every output the
    /// bits of the type's dot), where this kernel set has one: x86 with AVX-512 VNNI, Q8_0
    /// and Q5_0, with AVX2 alone Q4_1, Q4_0, Q8_0, Q5_0 and Q4_K (their rows-in-lanes tiles
    /// reading the layout without transposing). Where there is none, a batch takes
    /// [`Kernels::dot_rows16_fn`] token by token. (A batch in llama.cpp's arithmetic takes the
    /// tile only where each of its tokens takes the dot's order: not Q4_K's `gemm` tokens.)
    pub fn dot_tile_rows16_fn(&self, wtype: GgmlType) -> Option<super::DotTile> {
        self.t.dot_tile_rows16.get(wtype)
    }

    /// The rows16 kernel whose outputs have the bits of [`Kernels::dot_fn_in_batch`]`(wtype,
    /// rows, n_tokens, token)` (llama.cpp's arithmetic for that token of a batch): Q4_K's
    /// `gemm` order for the tokens of its whole groups of 4, Q6_K's tiled order in batches
    /// of 8 or more tokens, else [`Kernels::dot_rows16_fn`].
    /// `None` where this kernel set has no rows16 kernel for that order (it has one for every
    /// order of every type it packs: tested).
    pub fn dot_rows16_fn_in_batch(&self, wtype: GgmlType, rows: usize, n_tokens: usize, token: usize) -> Option<Rows16Fn> {
        match super::BatchOrder::of(wtype, rows, n_tokens, token) {
            super::BatchOrder::Dot => self.dot_rows16_fn(wtype),
            super::BatchOrder::Gemm => self.t.dot_rows16_gemm.get(wtype),
            super::BatchOrder::Tiled => self.t.dot_rows16_tiled.get(wtype),
            super::BatchOrder::Lanes => None,
        }
    }

    /// Whether a `rows`-row matrix of `wtype` may be packed in the rows16 layout for this
    /// kernel set (it has the kernel, and the rows come in whole groups).
    pub fn packs_rows16(&self, wtype: GgmlType, rows: usize) -> bool {
        self.dot_rows16_fn(wtype).is_some() && rows.is_multiple_of(ROWS16) && rows > 0
    }
}

/// `groups` consecutive groups of [`ROWS16`] rows in the rows16 layout (`w`: their
/// `groups × 16 × row_bytes(n)` bytes) against `tokens` activation rows (`a`, `arow`
/// bytes apart, quantized to the type's activation type): `out[t * ostride + 16 * g + r]`
/// gets the bits [`super::DotFn`] gives for plain row `16 * g + r` and token `t`
/// (`ostride >= 16 * groups`). Work that depends only on a token's activations may be done
/// once per call for all its groups (Q4_0's block sums).
pub type Rows16Fn = fn(n: usize, groups: usize, w: &[u8], a: &[u8], arow: usize, tokens: usize, out: &mut [f32], ostride: usize);

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{vec, vec::Vec};

    use super::*;
    use crate::ggml_type::GgmlType::{Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q6_K, Q8_0};
    use crate::quant::tests::{activations, fast_kernel_sets, quantized, random_row, rows16_kernel_sets, Rng};

    /// Every row of every group of a packed matrix gets the plain dot's bits, for every
    /// kernel set with rows16 kernels, their prefetch on and off (row lengths of 1 to 48 blocks, two groups, one call
    /// per group and one for both against 1 to 19 tokens; random rows and activations, and
    /// rows and activations at their extremes).
    #[test]
    fn rows16_kernels_give_each_rows_dot_bits() {
        let mut rng = Rng::new(41);
        let mut checked = 0;
        for k in rows16_kernel_sets() {
            for ty in [Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K] {
                let Some(f) = k.dot_rows16_fn(ty) else { continue };
                let dot = k.dot_fn(ty).unwrap();
                let vdt = Kernels::vec_dot_type(ty).unwrap();
                let nbs: &[usize] = if ty.block_size() == 256 { &[1, 2, 3, 8] } else { &[1, 2, 3, 18, 20, 48] };
                for &nb in nbs {
                    let n = ty.block_size() * nb;
                    let rows = 2 * ROWS16;
                    // Random rows, and at the extremes of the scales and mins: a constant
                    // negative row and a ramp.
                    let row = |r: usize, rng: &mut Rng| match r {
                        0 => vec![-3.0f32; n],
                        1 => (0..n).map(|i| i as f32 / n as f32 * 2.0 - 1.0).collect(),
                        _ => random_row(rng, n),
                    };
                    let w: Vec<u8> = (0..rows).flat_map(|r| quantized(ty, &row(r, &mut rng))).collect();
                    let wrow = w.len() / rows;
                    let mut p = w.clone();
                    pack_in_place(ty, rows, n, &mut p, &mut vec![0u8; ROWS16 * wrow]).unwrap();
                    assert_ne!(p, w, "{ty}: packing moved nothing");
                    // A random activation row, and rows whose quants all sit at -128 or 127
                    // (the block sums at their extremes).
                    for x in [random_row(&mut rng, n), vec![-1.0f32; n], vec![1.0f32; n]] {
                        let a = activations(&k, vdt, &x);
                        for g in 0..2 {
                            let mut out = [f32::NAN; ROWS16];
                            f(n, 1, &p[g * ROWS16 * wrow..(g + 1) * ROWS16 * wrow], &a, a.len(), 1, &mut out, ROWS16);
                            for (r, o) in out.iter().enumerate() {
                                let want = dot(n, &w[(g * ROWS16 + r) * wrow..], &a);
                                assert_eq!(o.to_bits(), want.to_bits(), "{} {ty} n={n} group {g} row {r}", k.name());
                            }
                        }
                    }
                    // Both groups in one call against 1 to 19 tokens (whole and partial
                    // chunks of eight), outputs `ostride` apart with a gap that stays
                    // untouched.
                    let tokens_max = 19;
                    let acts: Vec<u8> = (0..tokens_max).flat_map(|_| activations(&k, vdt, &random_row(&mut rng, n))).collect();
                    let arow = acts.len() / tokens_max;
                    for tokens in [1usize, 2, 4, 5, 8, 9, 12, 16, 19] {
                        let ostride = 2 * ROWS16 + 3;
                        let mut out = vec![f32::NAN; tokens * ostride];
                        f(n, 2, &p, &acts, arow, tokens, &mut out, ostride);
                        for t in 0..tokens {
                            for r in 0..2 * ROWS16 {
                                let want = dot(n, &w[r * wrow..], &acts[t * arow..(t + 1) * arow]);
                                assert_eq!(out[t * ostride + r].to_bits(), want.to_bits(), "{} {ty} n={n} {tokens} tokens: token {t} row {r}", k.name());
                            }
                            assert!(out[t * ostride + 2 * ROWS16..(t + 1) * ostride].iter().all(|v| v.is_nan()), "{} {ty}: wrote past the groups", k.name());
                        }
                    }
                    checked += 1;
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if crate::quant::x86::cpu_has_avx2_fma() {
            assert!(checked > 0, "an AVX2 or AVX-512 VNNI CPU's kernel sets have rows16 kernels");
        }
        let _ = checked;
    }

    /// In llama.cpp's batch arithmetic too: for every type a kernel set packs, each token of
    /// batches of 1 to 13 has a rows16 kernel ([`Kernels::dot_rows16_fn_in_batch`]) whose
    /// outputs have the bits of [`Kernels::dot_fn_in_batch`] for it (Q4_K: its `gemm`
    /// order for whole groups of 4 tokens, Q6_K its tiled order from 8 tokens, both of
    /// which differ from the dot).
    #[test]
    fn rows16_kernels_in_batch_give_llama_cpps_bits() {
        let mut rng = Rng::new(47);
        let (mut gemm_checked, mut tiled_checked) = (false, false);
        for k in rows16_kernel_sets() {
            for ty in [Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K] {
                if k.dot_rows16_fn(ty).is_none() {
                    continue;
                }
                let vdt = Kernels::vec_dot_type(ty).unwrap();
                let (rows, n) = (2 * ROWS16, 3 * ty.block_size());
                let w: Vec<u8> = (0..rows).flat_map(|_| quantized(ty, &random_row(&mut rng, n))).collect();
                let wrow = w.len() / rows;
                let mut p = w.clone();
                pack_in_place(ty, rows, n, &mut p, &mut vec![0u8; ROWS16 * wrow]).unwrap();
                for n_tokens in 1..=13 {
                    for token in 0..n_tokens {
                        let f = k.dot_rows16_fn_in_batch(ty, rows, n_tokens, token).unwrap_or_else(|| panic!("{} {ty}: no rows16 kernel for token {token} of {n_tokens}", k.name()));
                        let dot = k.dot_fn_in_batch(ty, rows, n_tokens, token).unwrap();
                        let other_order = dot as usize != k.dot_fn(ty).unwrap() as usize;
                        gemm_checked |= other_order && ty == Q4_K;
                        tiled_checked |= other_order && ty == Q6_K;
                        let a = activations(&k, vdt, &random_row(&mut rng, n));
                        let mut out = [f32::NAN; 2 * ROWS16];
                        f(n, 2, &p, &a, a.len(), 1, &mut out, 2 * ROWS16);
                        for (r, o) in out.iter().enumerate() {
                            let want = dot(n, &w[r * wrow..], &a);
                            assert_eq!(o.to_bits(), want.to_bits(), "{} {ty}: token {token} of {n_tokens}, row {r}", k.name());
                        }
                    }
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if crate::quant::x86::cpu_has_avx512_vnni() {
            assert!(gemm_checked, "Q4_K's gemm order was among the orders checked");
            assert!(tiled_checked, "Q6_K's tiled order was among the orders checked");
        }
        let _ = (gemm_checked, tiled_checked);
    }

    /// The layout as documented: row r's scale of block k, and its byte 4c + i.
    #[test]
    fn packing_puts_each_byte_where_the_layout_says() {
        let mut rng = Rng::new(43);
        for ty in [Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K] {
            let n = 2 * ty.block_size();
            let w: Vec<u8> = (0..ROWS16).flat_map(|_| quantized(ty, &random_row(&mut rng, n))).collect();
            let (bs, wrow) = (ty.type_size(), w.len() / ROWS16);
            let scales = if matches!(ty, Q4_1 | Q4_K) { 2 } else { 1 };
            // Where the scale words start in a plain block, and the bytes after them (Q6_K:
            // its `d` is its last two bytes, the 208 before it move).
            let (at, d0) = if ty == Q6_K { (208, 0) } else { (0, 2 * scales) };
            // Q6_K's chunks in the kernel's order: the four of scales, then per lane m and
            // half h the ql dwords 16h + m, 16h + 8 + m and the qh dword 32 + 8h + m.
            let q6_order: Vec<usize> = (48..52).chain((0..8).flat_map(|m| (0..2).flat_map(move |h| [16 * h + m, 16 * h + 8 + m, 32 + 8 * h + m]))).collect();
            let chunk = |c: usize| if ty == Q6_K { q6_order.iter().position(|&x| x == c).unwrap() } else { c };
            let mut p = w.clone();
            pack_in_place(ty, ROWS16, n, &mut p, &mut vec![0u8; w.len()]).unwrap();
            for r in 0..ROWS16 {
                for k in 0..2 {
                    let (b, g) = (&w[r * wrow + k * bs..], &p[k * ROWS16 * bs..]);
                    for s in 0..scales {
                        assert_eq!(&g[32 * s + 2 * r..][..2], &b[at + 2 * s..at + 2 * s + 2], "{ty} row {r} block {k} scale {s}");
                    }
                    for q in 0..bs - 2 * scales {
                        let (c, i) = (q / 4, q % 4);
                        if ty == Q5_0 && c == 0 {
                            continue;
                        }
                        assert_eq!(g[32 * scales + 64 * chunk(c) + 4 * r + i], b[d0 + q], "{ty} row {r} block {k} byte {q}");
                    }
                    if ty == Q5_0 {
                        // qh transposed: element 4j + i's fifth bit at bit j of byte i.
                        let (qh, t) = (u32::from_le_bytes([b[2], b[3], b[4], b[5]]), &g[32 + 4 * r..][..4]);
                        for e in 0..32 {
                            assert_eq!((t[e % 4] >> (e / 4)) & 1, ((qh >> e) & 1) as u8, "Q5_0 row {r} block {k}: element {e}'s fifth bit");
                        }
                    }
                }
            }
        }
    }

    /// Q5_0's `qh` transposition, a byte at a time, against its definition bit by bit, and
    /// its inverse.
    #[test]
    fn q5_0_qh_transposition_moves_each_bit_where_the_layout_says() {
        let mut rng = Rng::new(44);
        let words = (0..32).map(|e| 1u32 << e).chain([0, u32::MAX, 0x8000_0001]).chain((0..2000).map(|_| rng.next() as u32));
        for qh in words {
            let want = (0..32).fold(0u32, |t, e| t | ((qh >> e) & 1) << (8 * (e % 4) + e / 4));
            assert_eq!(q5_0_qh_to_layout(qh), want, "qh {qh:#010x}");
            assert_eq!(q5_0_qh_from_layout(want), qh, "qh {qh:#010x} back");
        }
    }

    /// A packed matrix's rows dequantize to the plain rows' floats.
    #[test]
    fn packed_rows_dequantize_as_plain_rows() {
        let mut rng = Rng::new(45);
        let k = &fast_kernel_sets()[0];
        for ty in [Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K] {
            let (rows, n) = (2 * ROWS16, 3 * ty.block_size());
            let w: Vec<u8> = (0..rows).flat_map(|_| quantized(ty, &random_row(&mut rng, n))).collect();
            let wrow = w.len() / rows;
            let mut p = w.clone();
            pack_in_place(ty, rows, n, &mut p, &mut vec![0u8; ROWS16 * wrow]).unwrap();
            for r in 0..rows {
                let (mut want, mut got) = (vec![0.0f32; n], vec![f32::NAN; n]);
                k.dequantize_row(ty, &w[r * wrow..(r + 1) * wrow], &mut want).unwrap();
                dequantize_row(k, ty, n, &p, r, &mut got).unwrap();
                assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{ty} row {r}");
            }
            assert!(dequantize_row(k, ty, n, &p, rows, &mut vec![0.0; n]).is_err(), "{ty}: a row past the matrix");
            assert!(dequantize_row(k, ty, n, &p, 0, &mut vec![0.0; n - 1]).is_err(), "{ty}: an output of the wrong length");
        }
    }

    /// Shapes and types without the layout are refused and leave the data as it was.
    #[test]
    fn packing_refuses_what_it_cannot_lay_out() {
        let mut rng = Rng::new(44);
        let w: Vec<u8> = (0..ROWS16).flat_map(|_| quantized(Q4_1, &random_row(&mut rng, 64))).collect();
        let mut p = w.clone();
        let mut s = vec![0u8; w.len()];
        assert!(pack_in_place(Q5_1, ROWS16, 64, &mut p, &mut s).is_err(), "Q5_1 has no rows16 layout");
        assert!(pack_in_place(Q4_1, 15, 64, &mut p, &mut s).is_err(), "15 rows are not a group");
        assert!(pack_in_place(Q4_1, ROWS16, 48, &mut p, &mut s).is_err(), "48 columns are not whole blocks");
        assert!(pack_in_place(Q4_1, 2 * ROWS16, 64, &mut p, &mut s).is_err(), "the data holds one group, not two");
        assert!(pack_in_place(Q4_1, ROWS16, 64, &mut p, &mut s[..w.len() - 1]).is_err(), "the scratch is a byte short");
        assert_eq!(p, w);
        let e = pack_in_place(Q5_1, ROWS16, 64, &mut p, &mut s).unwrap_err();
        assert!(std::format!("{e}").contains("rows16"), "{e}");
    }
}

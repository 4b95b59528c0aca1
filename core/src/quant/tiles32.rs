//! The "Tiles32" weight layout of the HVX matrix products, and those products.
//!
//! Owns: the layout and the repack of ggml rows into it (done once, at load, by the
//! host), the Q8_0 activation block in the form the kernels take ([`ActBlock`]), the
//! block-sum kernels' contract and their scalar reference, and the matrix-vector
//! product ([`matvec`]) that turns block sums into outputs with exactly the operations
//! of keel's row dots ([`Kernels::dot_fn`]): a product over Tiles32 equals the CPU's
//! dot bit for bit, whichever kernel set computes the integer sums. The Hexagon kernel
//! set (`quant/hexagon/`) supplies HVX block sums through [`Kernels::tile_sums`].
//!
//! The layout itself (tiles of 32 rows × one 32-element block, block-major, then f32
//! scales) and the repack belong to the HAL, which devices and hosts share:
//! [`keel_npu_hal::tile`].
//!
//! Block sums are *raw*: the kernels multiply unsigned weight codes (`u = w + bias`:
//! Q8_0 `q + 128`, Q4_0 the code `0..15`, IQ4_NL `kvalues[code] + 128`) by the signed
//! activation quants, and [`matvec`] subtracts `bias·Σa` (exact int32) before scaling.

use half::f16;
use keel_npu_hal::op::DType;
use keel_npu_hal::tile;

use core::mem::MaybeUninit;
use core::ops::Range;
use core::sync::atomic::{AtomicU32, Ordering};

use super::blocks::KVALUES_IQ4NL;
use super::Kernels;
use crate::fused::fmaf as fma;
use crate::ggml_type::GgmlType;
use crate::matmul::SharedMut;
use crate::parallel::{split_range, Parallel, Sequential};

/// Alignment of packed weights and of the kernels' scratch (one HVX vector).
pub const ALIGN: usize = 128;
/// Offset of the Q8_0 tile codes (`u = q + 128`).
pub const Q8_0_BIAS: i32 = 128;
/// Offset of the Q4_0 codes (`x = d·(u − 8)`).
pub const Q4_0_BIAS: i32 = 8;
/// Offset of the IQ4_NL table values the kernels multiply (`u = kvalues[code] + 128`).
pub const IQ4_NL_BIAS: i32 = 128;

/// Why a Tiles32 operation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TileError {
    /// The type has no tile layout (only Q8_0, Q4_0 and IQ4_NL have).
    Unsupported,
    /// A shape or a length does not fit (k not a multiple of 32, a slice of the wrong
    /// size, packed weights not [`ALIGN`]-aligned).
    Shape,
    /// The scratch is too small for one row group.
    Scratch,
}

/// As the HAL reports it: `Unsupported`, `InvalidArgument` (a shape), `OutOfMemory`
/// (the scratch).
impl From<TileError> for keel_npu_hal::ErrorKind {
    fn from(e: TileError) -> Self {
        match e {
            TileError::Unsupported => Self::Unsupported,
            TileError::Shape => Self::InvalidArgument,
            TileError::Scratch => Self::OutOfMemory,
        }
    }
}

/// Raw block sums of `n_groups` 32-row groups' tiles of one block (`tiles`: the
/// groups' tiles, adjacent) by one activation block (`a`: its 32 quants as 8
/// little-endian words): `out[32g + r] = Σ u·a` over the block's 32 inputs of row
/// `32g + r`. `tiles` and `out` are [`ALIGN`]-aligned (the HVX kernels' vector loads and
/// stores), `tiles` holds `n_groups` tiles and `out` at least `32·n_groups` sums.
pub type TileSumsFn = fn(tiles: &[u8], n_groups: usize, a: &[u32; 8], out: &mut [i32]);

/// Raw *lane* sums of `n_groups` Q8_0 tiles by one activation block: for group `g` and
/// lane `l` (inputs `4l..4l+4` of the block), `out[(8g + l)·32 + r] = Σ u·a` over
/// those 4 inputs of row `32g + r`: the 8 lanes llama.cpp's x86 Q8_0 dot (and keel's)
/// accumulate separately. Alignment as [`TileSumsFn`]; `out` holds `256·n_groups`.
pub type LaneSumsFn = fn(tiles: &[u8], n_groups: usize, a: &[u32; 8], out: &mut [i32]);

/// Raw sums to the f32 values the scale pass multiplies, in place: word `i` of `sums`
/// (a whole number of 32-word vectors, [`ALIGN`]-aligned) becomes the bits of
/// `f32(sums[i] + corr[(i / 32) % 8])` (the weight-bias correction of its vector: a Q8_0
/// lane's, or a block's repeated). Exact: the contract is `|sums[i] + corr| < 2^24`,
/// which every tile type's sums keep (a Q8_0 lane is below 2^17, an IQ4_NL block below
/// 2^20).
pub type SumsToF32Fn = fn(sums: &mut [i32], corr: &[i32; 8]);

/// The Q8_0 scale pass over whole rows when one pass holds every block: `o[i]` = the
/// lane total of row `i`'s 8 accumulators over the blocks `j < da.len()`, each step
/// `acc = fma(dw·da[j], lane, acc)` from 0, `dw = sc[j·ss + i]`, lane `l` of row `i`
/// (f32 bits: [`LaneSumsFn`]'s layout made f32 by [`SumsToF32Fn`]) at
/// `lanes[j·per_block + 256·(i / 32) + 32·l + i % 32]`. `lanes` is [`ALIGN`]-aligned and
/// `per_block` a multiple of 256; an implementation checks the ranges.
pub type Q8RowsFn = fn(o: &mut [f32], lanes: &[i32], per_block: usize, sc: &[f32], ss: usize, da: &[f32]);

/// Stages tiles into the scratch: `dst = src`, both [`ALIGN`]-aligned, of the same
/// length, a multiple of [`ALIGN`] (whole tiles). A product of several columns copies
/// each chunk's tiles once and reads them from there for every column.
pub type StageFn = fn(src: &[u8], dst: &mut [u8]);

/// Quantizes activations into Q8_0 blocks in the kernels' form: `x` is `32·out.len()`
/// values (checked by the caller), block `b` of `out` from `x[32b..32b + 32]` by
/// [`super::Kernels::quantize_activations`]' rule (`kern`'s, the bytes every kernel set
/// gives), its quants' sum and its scale as f16 bits and as f32.
pub type ActQuantFn = fn(kern: &super::Kernels, x: &[f32], out: &mut [ActBlock]);

/// The kernels of one kernel set for Tiles32 weights.
#[derive(Clone, Copy, Debug)]
pub struct TileKernels {
    /// Block sums of Q8_0 tiles.
    pub q8_0: TileSumsFn,
    /// Lane sums of Q8_0 tiles.
    pub q8_0_lanes: LaneSumsFn,
    /// Block sums of Q4_0 tiles.
    pub q4_0: TileSumsFn,
    /// Block sums of IQ4_NL tiles.
    pub iq4_nl: TileSumsFn,
    /// Sums to f32, corrected.
    pub to_f32: SumsToF32Fn,
    /// The Q8_0 scale pass over those rows.
    pub q8_0_rows: Q8RowsFn,
    /// The one-sum-per-block scale pass over whole rows.
    pub block_rows: BlockRowsFn,
    /// The copy of a chunk's tiles into the scratch.
    pub stage: StageFn,
    /// Activation quantization into blocks.
    pub quantize: ActQuantFn,
}

/// The scalar reference kernels (the same integers as every other set).
pub const REFERENCE: TileKernels = TileKernels { q8_0: ref_q8_0_sums, q8_0_lanes: ref_q8_0_lane_sums, q4_0: ref_q4_0_sums, iq4_nl: ref_iq4_nl_sums, to_f32: ref_to_f32, q8_0_rows: ref_q8_0_rows, block_rows: ref_block_rows, stage: ref_stage, quantize: ref_quantize };

/// One Q8_0 activation block in the form the kernels take.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
#[repr(C)]
pub struct ActBlock {
    /// Quants `4w..4w+4` packed little-endian in word `w` (the `Rt` operands of `vrmpy`).
    pub words: [u32; 8],
    /// Sum of the 32 quants (for the weight-bias correction).
    pub sum: i32,
    /// The scale, f16-rounded, as f32.
    pub d: f32,
    /// The scale as stored (f16 bits).
    pub d16: u16,
}

impl ActBlock {
    /// A ggml Q8_0 block (f16 scale, then 32 int8) in the kernels' form.
    pub fn from_q8_0(b: &[u8; 34]) -> ActBlock {
        let d16 = u16::from_le_bytes([b[0], b[1]]);
        let words = core::array::from_fn(|w| u32::from_le_bytes([b[2 + 4 * w], b[3 + 4 * w], b[4 + 4 * w], b[5 + 4 * w]]));
        let sum = b[2..].iter().map(|&q| i32::from(q as i8)).sum();
        ActBlock { words, sum, d: f16::from_bits(d16).to_f32(), d16 }
    }

    /// Quant `j` (0..32).
    pub fn q(&self, j: usize) -> i8 {
        (self.words[j / 4] >> (8 * (j % 4))) as u8 as i8
    }

    /// The block in ggml's byte form (f16 d, then 32 int8).
    pub fn to_q8_0(&self) -> [u8; 34] {
        let mut b = [0u8; 34];
        b[..2].copy_from_slice(&self.d16.to_le_bytes());
        (0..32).for_each(|j| b[2 + j] = self.q(j) as u8);
        b
    }
}

/// Quantizes `x` (`32·out.len()` values) into Q8_0 activation blocks with
/// [`Kernels::quantize_activations`]' rule (the bytes every kernel set gives), by
/// `kern`'s [`TileKernels::quantize`].
pub fn quantize_act(kern: &Kernels, x: &[f32], out: &mut [ActBlock]) -> Result<(), TileError> {
    if x.len() != 32 * out.len() {
        return Err(TileError::Shape);
    }
    (kern.tile_sums().quantize)(kern, x, out);
    Ok(())
}

/// [`ActQuantFn`] by `kern`'s ggml Q8_0 quantization, block by block, each block then
/// parsed by [`ActBlock::from_q8_0`].
pub fn ref_quantize(kern: &Kernels, x: &[f32], out: &mut [ActBlock]) {
    let mut b = [0u8; 34];
    for (blk, chunk) in out.iter_mut().zip(x.chunks_exact(32)) {
        kern.quantize_activations(GgmlType::Q8_0, chunk, &mut b).expect("Q8_0 activations: one block into 34 bytes");
        *blk = ActBlock::from_q8_0(&b);
    }
}

/// A weight matrix in Tiles32 layout.
#[derive(Clone, Copy, Debug)]
pub struct TiledWeights<'a> {
    /// Q8_0, Q4_0 or IQ4_NL.
    pub dtype: DType,
    /// Output rows (ggml `ne[1]`).
    pub rows: usize,
    /// Inputs per row (ggml `ne[0]`, a multiple of 32).
    pub k: usize,
    /// The packed bytes, [`ALIGN`]-aligned, exactly `tile::packed_size` long.
    pub packed: &'a [u8],
}

impl TiledWeights<'_> {
    fn check(&self, act: &[ActBlock], out: &[f32], sums: &Option<&mut [i32]>) -> Result<(), TileError> {
        let (rows, k) = (u32::try_from(self.rows).map_err(|_| TileError::Shape)?, u32::try_from(self.k).map_err(|_| TileError::Shape)?);
        let size = tile::packed_size(self.dtype, rows, k).ok_or(TileError::Unsupported)?;
        let nb = self.k / 32;
        let bad_sums = sums.as_ref().is_some_and(|s| s.len() != nb * self.rows);
        if self.packed.len() != size || act.len() != nb || out.len() != self.rows || bad_sums || self.packed.as_ptr().align_offset(ALIGN) != 0 {
            return Err(TileError::Shape);
        }
        Ok(())
    }
}

/// The scratch as aligned int32 words (its unaligned head skipped).
fn scratch_words(scratch: &mut [u8]) -> &mut [i32] {
    let pad = scratch.as_ptr().align_offset(ALIGN).min(scratch.len());
    // SAFETY: i32 is valid for any bit pattern; `align_to_mut` yields only aligned,
    // in-bounds elements.
    let (_, words, _) = unsafe { scratch[pad..].align_to_mut::<i32>() };
    words
}

/// `out[r] = Σ_k w[r][k]·x[k]` with `x` given as Q8_0 activation blocks (`k/32` of
/// them), with the integer sums from `kern`'s tile kernels (weight-bias corrected and
/// made f32 by its [`SumsToF32Fn`]) and, in scalar code, the scales in the order of
/// keel's row dot for the type
/// (so `out[r]` is [`Kernels::dot_fn`]'s result for row `r` bit for bit):
/// - Q4_0 and IQ4_NL: `y = fma(f32(sumi_b), dw_b·da_b, y)` over the blocks ascending
///   from 0 (llama.cpp's repacked q4_0_8x8 / iq4_nl_8x8 gemv order);
/// - Q8_0: 8 lane accumulators `acc[l] = fma(dw_b·da_b, f32(lane sum), acc[l])`, then
///   AVX's horizontal sum `((a4+a0) + (a6+a2)) + ((a5+a1) + (a7+a3))`.
///
/// Work is split into chunks of 32-row groups whose sums fit `scratch` (any bytes;
/// the aligned part is used): at least 128 bytes (one group's block sums; Q8_0 is
/// faster with 1024 per group, its lane sums). If `sums` is given (`k/32 · rows`), the
/// exact int32 block sums are written there, `[block][row]`, for tests.
/// One column of [`matmul`].
pub fn matvec(kern: &Kernels, w: &TiledWeights<'_>, act: &[ActBlock], scratch: &mut [u8], out: &mut [f32], sums: Option<&mut [i32]>) -> Result<(), TileError> {
    w.check(act, out, &sums)?;
    let groups = 0..tile::groups(w.rows as u32);
    matmul_checked(&kern.tile_sums(), w, act, groups, scratch, &Out::new(out, w.rows), sums)
}

/// Weight bytes of one chunk of row groups (all its blocks) that a product of several
/// columns keeps reusing before it moves on: the chunk is read from DDR once, copied
/// into the scratch ([`StageFn`]; VTCM on the DSP) when the scratch holds it beside one
/// pass's sums, and read from there (else from the cache, L2) for every column. A
/// budget well inside the L2 of a v68/v73 cDSP, and a quarter of a v68's 4 MiB VTCM
/// (which four hardware threads share, each staging its own chunk).
pub const REUSE_BYTES: usize = 256 * 1024;

/// `out[c·rows + r] = Σ_k w[r][k]·x_c[k]` for `cols` columns whose Q8_0 activation
/// blocks are `acts[c·k/32 ..][.. k/32]`: each column's outputs are [`matvec`]'s bit
/// for bit (the same operations in the same order), but the loop runs over chunks of
/// row groups outside the columns, so one chunk's tiles (at most [`REUSE_BYTES`] when
/// `cols > 1`) serve every column of the batch per load from memory instead of being
/// streamed again for each token.
pub fn matmul(kern: &Kernels, w: &TiledWeights<'_>, acts: &[ActBlock], cols: usize, scratch: &mut [u8], out: &mut [f32]) -> Result<(), TileError> {
    matmul_par(kern, w, acts, cols, scratch, out, &Sequential)
}

/// [`matmul`] with its row groups split over `par`'s tasks (contiguous ranges of
/// 32-row groups, one per task, each with an equal, [`ALIGN`]ed share of `scratch`):
/// every output is computed by the same operations in the same order as by
/// [`matmul`], so the result is the same bit for bit whatever the number of tasks.
/// Allocates nothing.
pub fn matmul_par(kern: &Kernels, w: &TiledWeights<'_>, acts: &[ActBlock], cols: usize, scratch: &mut [u8], out: &mut [f32], par: &dyn Parallel) -> Result<(), TileError> {
    matmul_par_with(&kern.tile_sums(), w, acts, cols, scratch, out, par)
}

/// [`matmul_par`] with the Tiles32 kernels `tk` (tests give it a set whose calls they
/// observe).
pub(super) fn matmul_par_with(tk: &TileKernels, w: &TiledWeights<'_>, acts: &[ActBlock], cols: usize, scratch: &mut [u8], out: &mut [f32], par: &dyn Parallel) -> Result<(), TileError> {
    let nb = w.k / 32;
    if cols == 0 || acts.len() != cols * nb || out.len() != cols * w.rows {
        return Err(TileError::Shape);
    }
    w.check(&acts[..nb], &out[..w.rows], &None)?;
    let g_count = tile::groups(w.rows as u32);
    let tasks = par.n_threads().clamp(1, g_count.max(1));
    let out = Out::new(out, w.rows);
    if tasks == 1 {
        return matmul_checked(tk, w, acts, 0..g_count, scratch, &out, None);
    }
    let pad = scratch.as_ptr().align_offset(ALIGN).min(scratch.len());
    let scratch = &mut scratch[pad..];
    let share = scratch.len() / tasks / ALIGN * ALIGN;
    let pieces = SharedMut::new(scratch);
    // The first error any task met (a TileError's code + 1; 0: none).
    let failed = AtomicU32::new(0);
    par.run(tasks, &|i| {
        // SAFETY: task i alone uses share bytes at i·share (i < tasks, tasks·share ≤
        // the scratch's length), and writes only the rows of its own groups.
        let scratch = unsafe { pieces.slice(i * share, share) };
        if let Err(e) = matmul_checked(tk, w, acts, split_range(g_count, tasks, i), scratch, &out, None) {
            failed.store(e as u32 + 1, Ordering::Relaxed);
        }
    });
    match failed.load(Ordering::Relaxed) {
        0 => Ok(()),
        1 => Err(TileError::Unsupported),
        2 => Err(TileError::Shape),
        _ => Err(TileError::Scratch),
    }
}

/// A product's outputs `[col][row]`, written by row range: tasks of one product own
/// disjoint row groups, so each writes elements no other touches.
struct Out {
    all: SharedMut<f32>,
    rows: usize,
}

impl Out {
    fn new(out: &mut [f32], rows: usize) -> Out {
        Out { all: SharedMut::new(out), rows }
    }

    /// Column `c`'s outputs of rows `r0 .. r0 + n` (checked to lie inside).
    ///
    /// # Safety
    /// No other live reference covers those elements.
    #[allow(clippy::mut_from_ref)]
    unsafe fn rows(&self, c: usize, r0: usize, n: usize) -> &mut [f32] {
        assert!(r0 + n <= self.rows);
        // SAFETY: exclusive as the caller guarantees.
        unsafe { self.all.slice(c * self.rows + r0, n) }
    }
}

/// The scale section of `w` as f32, `[block][group][row in group]` (so block `b`'s
/// scales of rows `r` are `scales[b·32·groups + r]`).
fn scales<'a>(w: &TiledWeights<'a>) -> Result<&'a [f32], TileError> {
    let n = (w.k / 32) * tile::groups(w.rows as u32) * 32;
    let bytes = &w.packed[w.packed.len() - 4 * n..];
    // SAFETY: f32 is valid for any bit pattern; `align_to` yields only aligned elements
    // (the section starts on 4: packed weights are ALIGN-aligned and every part before
    // it is a multiple of 128 bytes). Little-endian targets only (as the layout).
    let (head, f, _) = unsafe { bytes.align_to::<f32>() };
    if !head.is_empty() || f.len() < n || cfg!(target_endian = "big") {
        return Err(TileError::Shape);
    }
    Ok(&f[..n])
}

/// The end of `buf` as an area of `bytes` (aligned) for staged tiles, if what is left
/// before it still holds `keep` words; else `buf` whole and no area.
fn stage_area(buf: &mut [i32], bytes: usize, keep: usize) -> (&mut [i32], Option<&mut [u8]>) {
    let words = bytes.div_ceil(4);
    if buf.len() < keep + words {
        return (buf, None);
    }
    // The split on a vector boundary (buf starts on one), at or after `keep`.
    let at = (buf.len() - words) / 32 * 32;
    if at < keep {
        return (buf, None);
    }
    let (buf, area) = buf.split_at_mut(at);
    // SAFETY: u8 has no alignment and is valid for any bit pattern; the bytes are the
    // area's words, whose borrow this takes over.
    let area = unsafe { core::slice::from_raw_parts_mut(area.as_mut_ptr() as *mut u8, 4 * area.len()) };
    (buf, Some(&mut area[..bytes]))
}

/// Where one chunk's tiles are read: block `b`'s tiles of the chunk's groups are
/// `base[b·stride + off ..][.. bytes]`.
struct ChunkTiles<'t> {
    base: &'t [u8],
    stride: usize,
    off: usize,
    bytes: usize,
}

impl ChunkTiles<'_> {
    /// Block `b`'s tiles of the chunk (its groups adjacent, as the kernels take them).
    fn block(&self, b: usize) -> &[u8] {
        &self.base[b * self.stride + self.off..][..self.bytes]
    }
}

/// The tiles of `groups` for every one of `nb` blocks (`tb` bytes per tile): copied by
/// `stage` into `area` (block after block) when there is one, else where they lie in
/// `packed` (block-major: block `b`'s tiles of every group are adjacent).
fn chunk_tiles<'t>(stage: StageFn, packed: &'t [u8], g_count: usize, groups: Range<usize>, nb: usize, tb: usize, area: Option<&'t mut [u8]>) -> ChunkTiles<'t> {
    let bytes = groups.len() * tb;
    let Some(area) = area else {
        return ChunkTiles { base: packed, stride: g_count * tb, off: groups.start * tb, bytes };
    };
    for b in 0..nb {
        stage(&packed[(b * g_count + groups.start) * tb..][..bytes], &mut area[b * bytes..][..bytes]);
    }
    ChunkTiles { base: area, stride: bytes, off: 0, bytes }
}

/// [`StageFn`]'s preconditions.
pub(crate) fn check_stage(src: &[u8], dst: &[u8]) {
    assert!(
        src.len() == dst.len() && src.len().is_multiple_of(ALIGN) && src.as_ptr().align_offset(ALIGN) == 0 && dst.as_ptr().align_offset(ALIGN) == 0,
        "stage: tiles and area must be whole, aligned and of one length"
    );
}

/// [`StageFn`] by a slice copy.
fn ref_stage(src: &[u8], dst: &mut [u8]) {
    check_stage(src, dst);
    dst.copy_from_slice(src);
}

/// Blocks whose sums (Q8_0: lane sums) one pass of the scale loop holds, scratch
/// permitting (their activation scales live on the stack): rows of up to 4096 inputs
/// take one pass, so each row's output is written at once ([`Q8RowsFn`],
/// [`BlockRowsFn`]).
const PASS_BLOCKS: usize = 128;

/// The products of `groups` (32-row groups) for every column of `acts` (`k/32` blocks each).
fn matmul_checked(tk: &TileKernels, w: &TiledWeights<'_>, acts: &[ActBlock], groups: Range<usize>, scratch: &mut [u8], out: &Out, mut sums: Option<&mut [i32]>) -> Result<(), TileError> {
    let cols = acts.len() / (w.k / 32).max(1);
    let (f, bias, tile_bytes) = match w.dtype {
        DType::Q8_0 => return matmul_q8_0_lanes(tk, w, acts, groups, scratch, out, sums),
        DType::Q4_0 => (tk.q4_0, Q4_0_BIAS, 512),
        DType::IQ4NL => (tk.iq4_nl, IQ4_NL_BIAS, 512),
        _ => return Err(TileError::Unsupported),
    };
    let (rows, g_count, nb) = (w.rows, tile::groups(w.rows as u32), w.k / 32);
    let scales = scales(w)?;
    let buf = scratch_words(scratch);
    if buf.len() < 32 {
        return Err(TileError::Scratch);
    }
    // As many groups as leave room for the sums of every block (up to PASS_BLOCKS) of
    // one pass.
    let mut chunk = groups.len().min((buf.len() / (32 * nb.min(PASS_BLOCKS))).max(1));
    if cols > 1 {
        chunk = chunk.min((REUSE_BYTES / (nb * tile_bytes)).max(1));
    }
    // Several columns: the chunk's tiles staged in the scratch, if it holds them beside
    // one pass over every block (up to PASS_BLOCKS) of the chunk's sums.
    let (buf, mut area) = if cols > 1 { stage_area(buf, chunk * nb * tile_bytes, 32 * chunk * nb.min(PASS_BLOCKS)) } else { (buf, None) };
    let mut g0 = groups.start;
    while g0 < groups.end {
        let n = chunk.min(groups.end - g0);
        let n_rows = (rows - g0 * 32).min(n * 32);
        let tiles = chunk_tiles(tk.stage, w.packed, g_count, g0..g0 + n, nb, tile_bytes, area.as_deref_mut());
        // The sums of `pass` blocks at a time (`32·n` words each), made f32; then each
        // row's accumulator runs through them in block order in a register.
        let pass = (buf.len() / (32 * n)).clamp(1, PASS_BLOCKS);
        for c in 0..cols {
            // SAFETY: this call's groups are its own (matmul_par gives each task others).
            let o = unsafe { out.rows(c, g0 * 32, n_rows) };
            let col = &acts[c * nb..][..nb];
            let mut b0 = 0;
            while b0 < nb {
                let nbb = pass.min(nb - b0);
                for (j, a) in col[b0..b0 + nbb].iter().enumerate() {
                    let b = b0 + j;
                    let corr = -bias * a.sum;
                    let part = &mut buf[j * 32 * n..][..32 * n];
                    f(tiles.block(b), n, &a.words, part);
                    if let Some(sums) = sums.as_deref_mut() {
                        for (i, &raw) in part[..n_rows].iter().enumerate() {
                            sums[b * rows + g0 * 32 + i] = raw + corr;
                        }
                    }
                    (tk.to_f32)(part, &[corr; 8]);
                }
                if nbb == nb {
                    // Every block in one pass: each row's accumulator stays in a register.
                    let mut da_mem = [MaybeUninit::<f32>::uninit(); PASS_BLOCKS];
                    let da = act_scales(&mut da_mem, col);
                    (tk.block_rows)(o, &buf[..nbb * 32 * n], 32 * n, &scales[g0 * 32..], g_count * 32, da);
                    break;
                }
                for (j, a) in col[b0..b0 + nbb].iter().enumerate() {
                    let sc = &scales[((b0 + j) * g_count + g0) * 32..][..n_rows];
                    scale_block(o, &buf[j * 32 * n..][..n_rows], sc, a.d, b0 + j == 0);
                }
                b0 += nbb;
            }
        }
        g0 += n;
    }
    Ok(())
}

/// One block's scale pass over a chunk's rows: `o[r] = fma(x[r], dw[r]·da, o[r])` (0
/// for `o[r]` in the first block), `x` the block sums as f32 bits. A function of its own
/// so that the outputs, which come from a raw pointer when a product is split over tasks,
/// are known not to alias the sums and scales (the loop is software-pipelined only then).
#[inline(never)]
fn scale_block(o: &mut [f32], x: &[i32], dw: &[f32], da: f32, first: bool) {
    for ((y, &x), &dw) in o.iter_mut().zip(x).zip(dw) {
        let acc = if first { 0.0 } else { *y };
        *y = fma(f32::from_bits(x as u32), dw * da, acc);
    }
}

/// Row groups whose Q8_0 lane accumulators one pass keeps (on the stack: 4 KiB).
const LANE_GROUPS: usize = 4;

/// [`matmul`] for Q8_0: row groups are the outer loop so the 8 lane accumulators of
/// one chunk of rows stay on the stack (and the chunk's tiles in the cache across the
/// columns). With 1024 scratch bytes per group the lane sums come from one
/// [`LaneSumsFn`] call per block, made f32 by the set's [`SumsToF32Fn`], for as many
/// blocks as the scratch holds (up to [`PASS_BLOCKS`]); then each row's 8 lane
/// accumulators run through those blocks in registers, its scale formed once per block
/// for the 8 lanes. Below that, one lane at a time through the block sums with the other
/// 7 activation words zeroed (8 passes, the same integers).
fn matmul_q8_0_lanes(tk: &TileKernels, w: &TiledWeights<'_>, acts: &[ActBlock], groups: Range<usize>, scratch: &mut [u8], out: &Out, mut sums: Option<&mut [i32]>) -> Result<(), TileError> {
    let cols = acts.len() / (w.k / 32).max(1);
    let (rows, g_count, nb) = (w.rows, tile::groups(w.rows as u32), w.k / 32);
    let scales = scales(w)?;
    let buf = scratch_words(scratch);
    let whole = buf.len() >= 256;
    let per_group = if whole { 256 } else { 32 };
    let chunk = groups.len().min(buf.len() / per_group).min(LANE_GROUPS);
    if chunk == 0 {
        return if groups.is_empty() { Ok(()) } else { Err(TileError::Scratch) };
    }
    // Several columns: the chunk's tiles staged in the scratch, if it holds them beside
    // one pass over every block (up to PASS_BLOCKS) of the chunk's lane sums.
    let (buf, mut area) = if cols > 1 && whole { stage_area(buf, chunk * nb * 1024, 256 * chunk * nb.min(PASS_BLOCKS)) } else { (buf, None) };
    // The chunk's lane accumulators, never zeroed as a whole (16 KiB per call, per task):
    // each column's first pass writes the ones it then reads (below).
    let mut acc_mem = [MaybeUninit::<f32>::uninit(); LANE_GROUPS * 32 * 8];
    let mut g0 = groups.start;
    while g0 < groups.end {
        let n = chunk.min(groups.end - g0);
        let n_rows = (rows - g0 * 32).min(n * 32);
        let tiles = chunk_tiles(tk.stage, w.packed, g_count, g0..g0 + n, nb, 1024, area.as_deref_mut());
        'cols: for c in 0..cols {
            let col = &acts[c * nb..][..nb];
            if whole {
                let per_block = 256 * n;
                let pass = (buf.len() / per_block).clamp(1, PASS_BLOCKS);
                let mut b0 = 0;
                while b0 < nb {
                    let nbb = pass.min(nb - b0);
                    // Each block's lane sums, corrected and made f32 by the kernel set.
                    for (j, a) in col[b0..b0 + nbb].iter().enumerate() {
                        let b = b0 + j;
                        let corr = lane_corrections(a);
                        let lanes = &mut buf[j * per_block..][..per_block];
                        (tk.q8_0_lanes)(tiles.block(b), n, &a.words, lanes);
                        if let Some(sums) = sums.as_deref_mut() {
                            for i in 0..n_rows {
                                let (g, r) = (i / 32, i % 32);
                                sums[b * rows + g0 * 32 + i] = (0..8).map(|l| lanes[(g * 8 + l) * 32 + r] + corr[l]).sum();
                            }
                        }
                        (tk.to_f32)(lanes, &corr);
                    }
                    let mut da_mem = [MaybeUninit::<f32>::uninit(); PASS_BLOCKS];
                    let da = act_scales(&mut da_mem, &col[b0..b0 + nbb]);
                    // Block j's scales of this chunk's rows are `scales[s0 + j·ss ..][..n_rows]`
                    // and its lane sums `buf[j·per_block ..][..per_block]`: the reads below
                    // stay inside both (checked here once, not per read).
                    let (s0, ss) = ((b0 * g_count + g0) * 32, g_count * 32);
                    assert!(nbb >= 1 && s0 + (nbb - 1) * ss + n_rows <= scales.len() && nbb * per_block <= buf.len() && n_rows <= n * 32);
                    if nbb == nb {
                        // One pass over every block: each row's lanes go into its output
                        // at once (no accumulators kept between passes).
                        // SAFETY: this call's groups are its own (matmul_par gives each task others).
                        let o = unsafe { out.rows(c, g0 * 32, n_rows) };
                        (tk.q8_0_rows)(o, &buf[..nbb * per_block], per_block, &scales[s0..], ss, da);
                        continue 'cols;
                    }
                    for (i, acc8) in acc_mem[..n_rows * 8].chunks_exact_mut(8).enumerate() {
                        let (g, r) = (i / 32, i % 32);
                        // SAFETY: past this column's first pass (b0 > 0), which wrote acc8.
                        let mut a8: [f32; 8] = if b0 == 0 { [0.0; 8] } else { core::array::from_fn(|l| unsafe { acc8[l].assume_init() }) };
                        let (mut sp, mut lp) = (s0 + i, g * 256 + r);
                        for &da in &da[..nbb] {
                            // SAFETY: for block j (0..nbb), sp = s0 + j·ss + i with i < n_rows:
                            // in bounds by the assertion above. (The lanes, at lp = j·per_block
                            // + g·256 + r, are read checked.)
                            let dw = unsafe { *scales.get_unchecked(sp) };
                            lane_step(&mut a8, buf, lp, dw * da);
                            (sp, lp) = (sp + ss, lp + per_block);
                        }
                        acc8.iter_mut().zip(a8).for_each(|(m, v)| _ = m.write(v));
                    }
                    b0 += nbb;
                }
            } else {
                acc_mem[..n_rows * 8].iter_mut().for_each(|m| _ = m.write(0.0));
                // SAFETY: just written.
                let acc = unsafe { assume_init(&mut acc_mem[..n_rows * 8]) };
                for (b, a) in col.iter().enumerate() {
                    let tiles = tiles.block(b);
                    let sc = &scales[(b * g_count + g0) * 32..][..n_rows];
                    let corr = lane_corrections(a);
                    for l in 0..8 {
                        let mut words = [0u32; 8];
                        words[l] = a.words[l];
                        (tk.q8_0)(tiles, n, &words, &mut buf[..32 * n]);
                        for (i, &dw) in sc.iter().enumerate() {
                            let s = buf[i] + corr[l];
                            acc[i * 8 + l] = fma(dw * a.d, s as f32, acc[i * 8 + l]);
                            if let Some(sums) = sums.as_deref_mut() {
                                let o = &mut sums[b * rows + g0 * 32 + i];
                                *o = if l == 0 { s } else { *o + s };
                            }
                        }
                    }
                }
            }
            // SAFETY: this call's groups are its own (matmul_par gives each task others).
            let o = unsafe { out.rows(c, g0 * 32, n_rows) };
            // SAFETY: either path above wrote all n_rows·8 accumulators for this column.
            let acc = unsafe { assume_init(&mut acc_mem[..n_rows * 8]) };
            for (y, a) in o.iter_mut().zip(acc.chunks_exact(8)) {
                *y = lane_total(a.try_into().expect("8 lanes"));
            }
        }
        g0 += n;
    }
    Ok(())
}

/// The one-sum-per-block scale pass (Q4_0, IQ4_NL) over whole rows when one pass holds
/// every block: `o[i]` = the accumulator of row `i` over the blocks `j < da.len()`, each
/// step `acc = fma(sum, dw·da[j], acc)` from 0, `sum` the f32 bits at
/// `sums[j·per_block + i]`, `dw = sc[j·ss + i]`: the operations of [`scale_block`] block
/// after block, with the accumulator kept in a register instead of the output.
pub type BlockRowsFn = fn(o: &mut [f32], sums: &[i32], per_block: usize, sc: &[f32], ss: usize, da: &[f32]);

/// [`BlockRowsFn`]'s preconditions (the ranges every read stays in), checked once per call.
pub(crate) fn check_block_rows(o: &[f32], sums: &[i32], per_block: usize, sc: &[f32], ss: usize, da: &[f32]) {
    let (n, nbb) = (o.len(), da.len());
    assert!(nbb >= 1 && n <= per_block && (nbb - 1) * per_block + n <= sums.len() && (nbb - 1) * ss + n <= sc.len(), "block_rows: sums or scales out of range");
}

/// [`BlockRowsFn`], row by row.
pub(crate) fn ref_block_rows(o: &mut [f32], sums: &[i32], per_block: usize, sc: &[f32], ss: usize, da: &[f32]) {
    check_block_rows(o, sums, per_block, sc, ss, da);
    for (i, y) in o.iter_mut().enumerate() {
        let mut acc = 0.0;
        for (j, &da) in da.iter().enumerate() {
            acc = fma(f32::from_bits(sums[j * per_block + i] as u32), sc[j * ss + i] * da, acc);
        }
        *y = acc;
    }
}

/// [`Q8RowsFn`]'s preconditions (the ranges every read stays in), checked once per call.
pub(crate) fn check_q8_0_rows(o: &[f32], lanes: &[i32], per_block: usize, sc: &[f32], ss: usize, da: &[f32]) {
    let (n, nbb) = (o.len(), da.len());
    assert!(
        nbb >= 1
            && n * 8 <= per_block
            && (nbb - 1) * per_block + 256 * n.div_ceil(32) <= lanes.len()
            && (nbb - 1) * ss + n <= sc.len()
            && per_block.is_multiple_of(256)
            && lanes.as_ptr().align_offset(ALIGN) == 0,
        "q8_0_rows: lanes or scales out of range"
    );
}

/// [`Q8RowsFn`], row by row. A function of its own so that its few live values stay
/// in registers.
#[inline(never)]
pub(crate) fn ref_q8_0_rows(o: &mut [f32], lanes: &[i32], per_block: usize, sc: &[f32], ss: usize, da: &[f32]) {
    check_q8_0_rows(o, lanes, per_block, sc, ss, da);
    for (i, y) in o.iter_mut().enumerate() {
        *y = ref_q8_0_row(lanes, i, per_block, sc, ss, da);
    }
}

/// Row `i`'s output of [`Q8RowsFn`] (a row `check_q8_0_rows` accepted).
#[inline(always)]
pub(crate) fn ref_q8_0_row(lanes: &[i32], i: usize, per_block: usize, sc: &[f32], ss: usize, da: &[f32]) -> f32 {
    let mut a = [0f32; 8];
    let (mut lp, mut sp) = (256 * (i / 32) + i % 32, i);
    for &da in da {
        // Row i's lanes in block j start at lp = j·per_block + 256·(i / 32) + i % 32, its
        // scale is sc[sp], sp = j·ss + i.
        lane_step(&mut a, lanes, lp, sc[sp] * da);
        (lp, sp) = (lp + per_block, sp + ss);
    }
    lane_total(&a)
}

/// One block's step of a row's 8 Q8_0 lane accumulators, `acc[l] = fma(d, lane l,
/// acc[l])`, lane `l` the f32 bits at `lanes[lp + 32l]` ([`LaneSumsFn`]'s layout).
#[inline(always)]
fn lane_step(acc: &mut [f32; 8], lanes: &[i32], lp: usize, d: f32) {
    for (l, a) in acc.iter_mut().enumerate() {
        *a = fma(d, f32::from_bits(lanes[lp + 32 * l] as u32), *a);
    }
}

/// The activation scales of one pass's blocks (at most [`PASS_BLOCKS`]) in `mem`, only
/// as many as there are blocks written (no zeroing of the rest per column and chunk).
#[inline(always)]
fn act_scales<'m>(mem: &'m mut [MaybeUninit<f32>; PASS_BLOCKS], blocks: &[ActBlock]) -> &'m [f32] {
    let n = blocks.len().min(PASS_BLOCKS);
    for (m, a) in mem.iter_mut().zip(blocks) {
        m.write(a.d);
    }
    // SAFETY: the first n were written just above.
    unsafe { assume_init(&mut mem[..n]) }
}

/// A row's 8 Q8_0 lane accumulators summed in the order of keel's (and llama.cpp's x86)
/// horizontal sum.
#[inline(always)]
fn lane_total(a: &[f32; 8]) -> f32 {
    let r = [a[4] + a[0], a[5] + a[1], a[6] + a[2], a[7] + a[3]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// `m` as the floats it holds.
///
/// # Safety
/// Every element of `m` has been written.
unsafe fn assume_init(m: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    // SAFETY: MaybeUninit<f32> has f32's layout; initialized as the caller guarantees.
    unsafe { &mut *(core::ptr::from_mut(m) as *mut [f32]) }
}

/// The weight-bias correction of a Q8_0 activation block's 8 lanes: −128 · Σ of each
/// lane's 4 quants.
#[inline]
fn lane_corrections(a: &ActBlock) -> [i32; 8] {
    core::array::from_fn(|l| -Q8_0_BIAS * (0..4).map(|j| i32::from((a.words[l] >> (8 * j)) as u8 as i8)).sum::<i32>())
}

/// Activation quant `j` of a block's words.
#[inline(always)]
fn aq(a: &[u32; 8], j: usize) -> i32 {
    i32::from((a[j / 4] >> (8 * (j % 4))) as u8 as i8)
}

fn ref_to_f32(sums: &mut [i32], corr: &[i32; 8]) {
    for (v, x) in sums.chunks_mut(32).enumerate() {
        for w in x {
            *w = ((*w + corr[v % 8]) as f32).to_bits() as i32;
        }
    }
}

fn ref_q8_0_sums(tiles: &[u8], n_groups: usize, a: &[u32; 8], out: &mut [i32]) {
    for g in 0..n_groups {
        let tile = &tiles[g * 1024..][..1024];
        for r in 0..32 {
            out[g * 32 + r] = (0..32).map(|j| i32::from(tile[(j / 4) * 128 + 4 * r + j % 4]) * aq(a, j)).sum();
        }
    }
}

fn ref_q8_0_lane_sums(tiles: &[u8], n_groups: usize, a: &[u32; 8], out: &mut [i32]) {
    for g in 0..n_groups {
        let tile = &tiles[g * 1024..][..1024];
        for l in 0..8 {
            for r in 0..32 {
                out[(g * 8 + l) * 32 + r] = (0..4).map(|j| i32::from(tile[l * 128 + 4 * r + j]) * aq(a, 4 * l + j)).sum();
            }
        }
    }
}

/// Raw sums of 4-bit tiles whose code `c` stands for `value(c)`.
fn ref_nibble_sums(tiles: &[u8], n_groups: usize, a: &[u32; 8], out: &mut [i32], value: impl Fn(u8) -> i32) {
    for g in 0..n_groups {
        let tile = &tiles[g * 512..][..512];
        for r in 0..32 {
            let mut s = 0;
            for m in 0..4 {
                for j in 0..4 {
                    let byte = tile[m * 128 + 4 * r + j];
                    s += value(byte & 15) * aq(a, 4 * m + j) + value(byte >> 4) * aq(a, 16 + 4 * m + j);
                }
            }
            out[g * 32 + r] = s;
        }
    }
}

fn ref_q4_0_sums(tiles: &[u8], n_groups: usize, a: &[u32; 8], out: &mut [i32]) {
    ref_nibble_sums(tiles, n_groups, a, out, i32::from);
}

fn ref_iq4_nl_sums(tiles: &[u8], n_groups: usize, a: &[u32; 8], out: &mut [i32]) {
    ref_nibble_sums(tiles, n_groups, a, out, |c| i32::from(KVALUES_IQ4NL[usize::from(c)]) + IQ4_NL_BIAS);
}

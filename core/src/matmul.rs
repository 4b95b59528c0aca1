//! Matrix products of quantized weights with a batch of activation rows.
//!
//! Work is split by weight rows across the host's threads (a long batch: by tokens, each
//! task claiming a tile or chunk of them at a time); each (row, token) dot product
//! is the same call whatever the batch size or thread count, so results are bit-identical
//! between batched and single-token evaluation and across `-t`. Owns: activation
//! quantization for a batch and the row split. The dot kernels live in `quant`.

use crate::ggml_type::GgmlType;
use crate::model::{Layout, Tensor};
use crate::parallel::{split_range, Claims, Parallel};
use crate::prefetch::{self, Level};
use crate::quant::rows16::ROWS16;
use crate::quant::{DotFn, DotPairsFn, DotRowsFn, Kernels, DOT_PAIRS_MAX, DOT_ROWS, DOT_TILE_MAX_ROWS, DOT_TILE_MAX_TOKENS};

/// A pointer to a slice that several tasks write at disjoint indices.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: SharedMut is only used to hand disjoint parts of one exclusively borrowed slice
// to tasks of a single `Parallel::run` call, which returns before the borrow ends.
unsafe impl<T: Send> Sync for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub(crate) fn new(s: &mut [T]) -> Self {
        SharedMut { ptr: s.as_mut_ptr(), len: s.len() }
    }

    /// `len` elements from `start`.
    ///
    /// # Safety
    /// No two live slices obtained from the same `SharedMut` may overlap, and the slice
    /// must not outlive the borrow `new` was given.
    pub(crate) unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        assert!(start <= self.len && len <= self.len - start, "SharedMut range out of bounds");
        // SAFETY: in bounds (checked above); exclusivity is the caller's contract.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }

    /// The address of element `i` (for cache hints only: never read or written through).
    pub(crate) fn addr(&self, i: usize) -> *const u8 {
        self.ptr.wrapping_add(i).cast_const().cast()
    }
}

/// How far ahead of the row being multiplied the weight stream is prefetched.
const PREFETCH_BYTES: usize = 2048;

/// Bytes of one activation row of `cols` values quantized for weights of type `wtype`.
pub fn act_row_bytes(wtype: GgmlType, cols: usize) -> Option<usize> {
    let vdt = Kernels::vec_dot_type(wtype)?;
    vdt.row_bytes(cols as u64).map(|b| b as usize)
}

/// Quantizes `n` rows of `cols` floats from `x` into `out` as `vdt` rows, in parallel.
pub fn quantize_rows(k: &Kernels, par: &dyn Parallel, vdt: GgmlType, x: &[f32], n: usize, cols: usize, out: &mut [u8]) {
    let rb = vdt.row_bytes(cols as u64).unwrap_or(0) as usize;
    let out = SharedMut::new(&mut out[..n * rb]);
    let tasks = par.n_threads().min(n).max(1);
    par.run(tasks, &|t| {
        for i in split_range(n, tasks, t) {
            // SAFETY: each row i belongs to exactly one task.
            let dst = unsafe { out.slice(i * rb, rb) };
            // The type was checked when the model loaded; a failure cannot happen here.
            let _ = k.quantize_activations(vdt, &x[i * cols..(i + 1) * cols], dst);
        }
    });
}

/// Tokens processed together against each weight row (keeps their activations in L1); a
/// type whose tile takes more tokens takes that many.
const TOKEN_TILE: usize = 16;
/// The most weight rows one tile call covers when a chunk holds a single tile of tokens
/// (x86_64, where the tiles are: 128; elsewhere the tile's own rows, so that no target
/// without tiles carries the larger output buffer on its stack).
const PANEL_ROWS: usize = if cfg!(target_arch = "x86_64") { 128 } else { DOT_TILE_MAX_ROWS };
const _: () = assert!(DOT_TILE_MAX_ROWS <= PANEL_ROWS);

/// `out[i * w.rows + r] = dot(w row r, activation row i)` for `n` activation rows `xq`
/// (already quantized for `w.ty`).
pub fn matmul(k: &Kernels, par: &dyn Parallel, w: &Tensor<'_>, xq: &[u8], n: usize, out: &mut [f32]) {
    matmul_as(k, par, w, xq, n, out, false)
}

/// [`matmul`]; with `llama_cpp_batches`, each token's dot is the kernel llama.cpp uses
/// for that token of a batch of `n` ([`Kernels::dot_fn_in_batch`]), so a row's result
/// may depend on the batch (as it does in llama.cpp).
pub fn matmul_as(k: &Kernels, par: &dyn Parallel, w: &Tensor<'_>, xq: &[u8], n: usize, out: &mut [f32], llama_cpp_batches: bool) {
    if w.layout == Layout::Rows16 {
        // (Q4_0, Q4_1, Q5_0 and Q8_0 with whole groups of 16 rows take `dot` in every
        // batch, llama.cpp's order too; Q4_K takes llama.cpp's `gemm` order for a batch's
        // whole groups of 4 tokens with `llama_cpp_batches`.)
        return matmul_rows16(k, par, w, xq, n, out, llama_cpp_batches);
    }
    let Ok(dot) = k.dot_fn(w.ty) else { return };
    if llama_cpp_batches && (0..n).any(|i| k.dot_fn_in_batch(w.ty, w.rows, n, i).map(|f| f as usize) != Ok(dot as usize)) {
        return matmul_per_token(k, par, w, xq, n, out);
    }
    let rows = w.rows;
    let rb = act_row_bytes(w.ty, w.cols).unwrap_or(0);
    let wrb = w.row_bytes();
    let out = SharedMut::new(&mut out[..n * rows]);
    let (tasks, unit) = product_tasks(par.n_threads(), n, rows, wrb);
    let cols = w.cols;
    let tile = k.dot_tile_fn(w.ty);
    // Groups of DOT_ROWS rows per token where no tile applies (decode, short batches),
    // each output the bits of `dot` (see `Kernels::dot_rows_fn`).
    let rows_fn = k.dot_rows_fn(w.ty);
    // Short batches (4..=9 tokens: speculative verification) where the type has a pairs
    // kernel: the weights read once for every token, as decode reads them.
    if let (Some(pairs_fn), Some(rows_fn), true) = (k.dot_pairs_fn(w.ty), rows_fn, (SHORT_MIN..=2 * DOT_PAIRS_MAX + 1).contains(&n) && !no_pairs()) {
        let short = Short { pairs_fn, rows_fn, dot, w, xq, rb, n };
        return par.run(tasks, &|t| short.rows(split_range(rows, tasks, t), &out));
    }
    let threads = par.n_threads().max(1);
    let chunk = tile.map_or(TOKEN_TILE, |t| t.tokens.max(TOKEN_TILE));
    // Rows `range` for tokens `i0..i1`, which no other call of the job writes; a tile's
    // outputs go through `put` ([`Put`]), the 8-row kernel's and `dot`'s in place.
    let part = |range: core::ops::Range<usize>, (i0, i1): (usize, usize), put: &mut Put<'_>| {
        // Whole tiles of `tile.rows` rows × `tile.tokens` tokens, each output the bits of
        // `dot` (see `Kernels::dot_tile_fn`), then whole tiles of its narrower tile where
        // it has one; the rest pair by pair.
        let (mut r_done, mut i_done) = (range.start, i0);
        if let Some(tile) = tile {
            let tr = tile.rows;
            let nr = range.len() - range.len() % tr;
            // The tile, then its narrower one (if any) for the tokens left.
            for (f, tt) in [Some((tile.f, tile.tokens)), tile.rest].into_iter().flatten() {
                let ni = (i1 - i_done) - (i1 - i_done) % tt;
                // One tile of tokens: up to PANEL_ROWS rows per call (a tile may prepare
                // the tokens once for all of them); several: one group of rows per call,
                // each weight block reused by every token tile while in cache.
                let pr = if ni == tt { PANEL_ROWS - PANEL_ROWS % tr } else { tr };
                if ni > 0 {
                    for r in (range.start..range.start + nr).step_by(pr) {
                        let k = pr.min(range.start + nr - r);
                        for i in (i_done..i_done + ni).step_by(tt) {
                            // The outputs' lines asked into L2 while the tile computes (a
                            // hint, no effect on any result): a batch's outputs outgrow the
                            // caches, and the stores would wait on each line.
                            for ti in 0..tt {
                                prefetch::lines(out.addr((i + ti) * rows + r), 4 * k, Level::L2);
                            }
                            put(i, tt, r, k, &mut |o, os| f(cols, &w.data[r * wrb..(r + k) * wrb], wrb, k, &xq[i * rb..(i + tt) * rb], rb, o, os));
                        }
                    }
                    r_done = range.start + nr;
                    i_done += ni;
                }
            }
        }
        let mut r_first = range.start;
        // Groups of DOT_ROWS rows for the tokens the tiles left: every token of the chunk
        // where no tile touched it, else the tokens after the tiles' in the tiles' rows
        // (whole groups, as the tile rows are) and every token in the rows after them.
        if let (Some(rows_fn), true) = (rows_fn, i_done == i0 || (r_done - range.start).is_multiple_of(DOT_ROWS)) {
            let nr = range.len() - range.len() % DOT_ROWS;
            for r in (range.start..range.start + nr).step_by(DOT_ROWS) {
                let first = if r < r_done { i_done } else { i0 };
                for i in first..i1 {
                    // SAFETY: elements (i, r..r + DOT_ROWS) are written by this call alone.
                    let o = unsafe { out.slice(i * rows + r, DOT_ROWS) };
                    rows_fn(cols, &w.data[r * wrb..(r + DOT_ROWS) * wrb], wrb, &xq[i * rb..(i + 1) * rb], o.try_into().expect("DOT_ROWS outputs"));
                }
            }
            r_first = range.start + nr;
        }
        // The rest one row at a time: each row's lines asked for ahead into L1, and
        // farther ahead into L2 as well where the set says so (`Kernels::plain_far_l2`).
        let far_l2 = k.plain_far_l2();
        for r in r_first..range.end {
            let wrow = &w.data[r * wrb..(r + 1) * wrb];
            if i0 == 0 {
                prefetch::lines(wrow.as_ptr().wrapping_add(PREFETCH_BYTES), wrb, Level::L1);
                if far_l2 > 0 {
                    prefetch::lines(wrow.as_ptr().wrapping_add(far_l2), wrb, Level::L2);
                }
            }
            // Rows done in tiles still need the tokens after the last whole tile.
            let first = if r < r_done { i_done } else { i0 };
            for i in first..i1 {
                let v = dot(cols, wrow, &xq[i * rb..(i + 1) * rb]);
                // SAFETY: element (i, r) is written by this call alone.
                unsafe { out.slice(i * rows + r, 1)[0] = v };
            }
        }
    };
    if n >= TOKEN_ITEMS * threads * chunk {
        return deal_by_tokens(par, n, chunk, &out, rows, &|tokens, put| part(0..rows, tokens, put));
    }
    par.run(tasks, &|t| {
        let range = task_rows(rows, unit, tasks, t);
        if n == 1 {
            // As in `matvec_group`: the task's first lines asked for at once.
            prefetch::lines(w.data.as_ptr().wrapping_add(range.start * wrb), (range.len() * wrb).min(START_BYTES), Level::L2);
        }
        // Tile outputs, staged (each call writes every element it hands back).
        let mut o = [0.0f32; DOT_TILE_MAX_TOKENS * PANEL_ROWS];
        for i0 in (0..n).step_by(chunk) {
            // SAFETY: the task's rows are its own for every token.
            part(range.clone(), (i0, (i0 + chunk).min(n)), &mut |i, tt, r, k, call| unsafe { put_staged(&mut o, &out, rows, (i, tt, r, k), call) });
        }
    });
}

/// Tokens per call of a rows16 kernel in a batch (Q4_0's unpacks each block once for
/// eight of them).
const ROWS16_TOKENS: usize = 16;

/// Groups of 16 rows per call of a rows16 tile or kernel in a batch (the Q8_0 lanes tile
/// shares each token's staged activation between four).
const ROWS16_TILE_GROUPS: usize = 4;

/// Groups per call of Q4_0's rows16 kernel in a batch: it computes each token's block
/// scales and sums once per call for all its groups (`rows16_q4_0_q8_0`'s table), which
/// at [`ROWS16_TILE_GROUPS`] a call was ~5% of SmolLM2 Q4_0's prompt at depth 4096 on
/// the Xeon VM (`perf`); with 16, its pp512 at two threads went 704-925 -> 838-1107 t/s
/// (six alternations, BENCHMARKS.md). Other types gain nothing from more (Gemma 3's
/// Q4_K prompt was, if anything, slower), so they keep four.
const ROWS16_Q4_0_GROUPS: usize = 16;

/// [`matmul_as`] for a matrix in the rows16 layout. A batch of at least
/// [`TOKEN_ITEMS`] items per thread (of a tile's tokens, or [`ROWS16_TOKENS`] where the
/// type has no tile) is dealt out by tokens: each item every row of its tokens, claimed
/// one at a time by whichever task is free (a task whose core is slower for a while
/// takes fewer, where a fixed half of the rows each leaves the faster waiting), the
/// kernels writing their outputs in place (the item's tokens' rows are its own). Else
/// whole groups of 16 rows per task (for one token on several threads in
/// [`stream_parts`] parts per thread, as the plain layout's groups), the outputs staged
/// and copied. Either way a batch takes the type's rows16 tile for whole tiles of tokens
/// where it has one (then its narrower one), and the rest through the rows16 kernel, up
/// to 16 tokens and [`ROWS16_TILE_GROUPS`] groups a call (Q4_0: [`ROWS16_Q4_0_GROUPS`];
/// one token: the task's groups in one call), the groups' tokens while the groups are in
/// cache. Every output has `dot`'s bits (the kernels' contract), or with `llama_cpp_batches` those of
/// [`Kernels::dot_fn_in_batch`] for its token (each run of tokens that take the same
/// rows16 kernel, [`Kernels::dot_rows16_fn_in_batch`], in calls of their own: Q4_K's `gemm`
/// order). Nothing is computed for a kernel set without the type's rows16 kernel (the
/// host packs only for a set that has it).
fn matmul_rows16(k: &Kernels, par: &dyn Parallel, w: &Tensor<'_>, xq: &[u8], n: usize, out: &mut [f32], llama_cpp_batches: bool) {
    let (Some(f), Some(rb)) = (k.dot_rows16_fn(w.ty), act_row_bytes(w.ty, w.cols)) else { return };
    // (Every kernel table has a rows16 kernel for every order of every type it packs,
    // tested, so the fallback to `f` is never taken.)
    let kernel = |j: usize| if llama_cpp_batches { k.dot_rows16_fn_in_batch(w.ty, w.rows, n, j).unwrap_or(f) } else { f };
    let (rows, cols, wrb) = (w.rows, w.cols, w.row_bytes());
    let groups = rows / ROWS16;
    let out = SharedMut::new(&mut out[..n * rows]);
    let threads = par.n_threads().max(1);
    // A tile gives `dot`'s bits: in llama.cpp's arithmetic only where every token of the
    // batch takes `dot`'s order (Q4_K's `gemm` order for whole groups of 4 does not).
    let tile = k.dot_tile_rows16_fn(w.ty).filter(|_| !llama_cpp_batches || (0..n).all(|j| kernel(j) as usize == f as usize));
    let call_groups = if w.ty == GgmlType::Q4_0 { ROWS16_Q4_0_GROUPS } else { ROWS16_TILE_GROUPS };
    // The groups `range` for tokens `i0..i1`, which no other call of the job writes:
    // whole tiles of tokens first, then the rest through the kernel, handing each call's
    // outputs (tokens i..i + tt, rows g0·16.., nr of them) to `put` ([`Put`]).
    let part = |range: core::ops::Range<usize>, (i0, i1): (usize, usize), put: &mut Put<'_>| {
        let mut i = i0;
        // (A call's groups lie in one part of a matrix split in two: `Tensor::groups`.)
        let parts = w.group_parts(range);
        for (tf, tt) in tile.iter().flat_map(|t| [Some((t.f, t.tokens)), t.rest]).flatten() {
            while i + tt <= i1 {
                for range in parts.iter().cloned() {
                    for g0 in range.clone().step_by(ROWS16_TILE_GROUPS) {
                        let g1 = (g0 + ROWS16_TILE_GROUPS).min(range.end);
                        let nr = (g1 - g0) * ROWS16;
                        put(i, tt, g0 * ROWS16, nr, &mut |o, os| tf(cols, w.groups(g0, g1), wrb, nr, &xq[i * rb..(i + tt) * rb], rb, o, os));
                    }
                }
                i += tt;
            }
        }
        // Up to ROWS16_TOKENS tokens that take the same kernel and `call_groups` groups
        // per call, the groups' tokens while they are in cache.
        for (range, g0) in parts.iter().flat_map(|r| r.clone().step_by(call_groups).map(move |g0| (r.clone(), g0))) {
            let g1 = (g0 + call_groups).min(range.end);
            let nr = (g1 - g0) * ROWS16;
            let wg = w.groups(g0, g1);
            let mut j = i;
            while j < i1 {
                let kf = kernel(j);
                let mut tt = 1;
                while tt < ROWS16_TOKENS && j + tt < i1 && kernel(j + tt) as usize == kf as usize {
                    tt += 1;
                }
                put(j, tt, g0 * ROWS16, nr, &mut |o, os| kf(cols, g1 - g0, wg, &xq[j * rb..(j + tt) * rb], rb, tt, o, os));
                j += tt;
            }
        }
    };
    let item = tile.map_or(ROWS16_TOKENS, |t| t.tokens);
    if n >= TOKEN_ITEMS * threads * item {
        return deal_by_tokens(par, n, item, &out, rows, &|tokens, put| part(0..groups, tokens, put));
    }
    let tasks = if n == 1 { rows16_tasks(threads, groups, rows * wrb) } else { threads.min(groups).max(1) };
    par.run(tasks, &|t| {
        let range = split_range(groups, tasks, t);
        // One token: the task's groups in one call, straight into the output (a call
        // shares each token's activation work between its groups).
        if n == 1 {
            for range in w.group_parts(range).into_iter().filter(|r| !r.is_empty()) {
                let nr = range.len() * ROWS16;
                // SAFETY: rows range.start·16.. belong to this task alone.
                f(cols, range.len(), w.groups(range.start, range.end), &xq[..rb], rb, 1, unsafe { out.slice(range.start * ROWS16, nr) }, nr);
            }
            return;
        }
        // The outputs staged in an array zeroed once per task, not per call (every call
        // writes all it is given): a zeroing per group was ~1% of decode (`perf`, Zen 4).
        let mut o = [0.0f32; STAGE];
        // SAFETY: the task's groups' rows are its own for every token.
        part(range, (0, n), &mut |i, tt, r, nr, call| unsafe { put_staged(&mut o, &out, rows, (i, tt, r, nr), call) });
    });
}

/// Items per thread from which a batch is dealt out by tokens ([`matmul_as`],
/// [`matmul_rows16`]): enough for a slower core to take fewer.
const TOKEN_ITEMS: usize = 2;

/// How a product's body hands out a kernel call's outputs: `put(i, tt, r, k, call)` gives
/// `call` the outputs of tokens `i..i + tt` and rows `r..r + k` and their stride, in place
/// ([`deal_by_tokens`]) or staged ([`put_staged`]).
type Put<'a> = dyn FnMut(usize, usize, usize, usize, &mut dyn FnMut(&mut [f32], usize)) + 'a;

/// A batch of `n` tokens dealt out by items of `item` tokens, claimed one at a time by
/// whichever task is free (a task whose core is slower for a while takes fewer, where a
/// fixed part of the rows each leaves the faster waiting): `part(tokens, put)` computes
/// every row of its tokens, the calls writing in place (the item's tokens' rows of `out`,
/// `rows` apart, are its own).
fn deal_by_tokens(par: &dyn Parallel, n: usize, item: usize, out: &SharedMut<f32>, rows: usize, part: &(dyn Fn((usize, usize), &mut Put<'_>) + Sync)) {
    let items = Claims::new(n.div_ceil(item));
    par.run(par.n_threads().max(1), &|_| {
        for it in items.iter() {
            // SAFETY: in place: the item's tokens' outputs are written by this call alone.
            part((it * item, ((it + 1) * item).min(n)), &mut |i, tt, r, k, call| call(unsafe { out.slice(i * rows + r, (tt - 1) * rows + k) }, rows));
        }
    });
}

/// [`Put`] through the staging array `o` (a call writes every element it is given): the
/// outputs of tokens `i..i + tt`, rows `r..r + k`, then copied to `out` (`rows` apart).
///
/// # Safety
/// Those outputs of `out` are written by the calling task alone (its rows, for every token).
unsafe fn put_staged(o: &mut [f32], out: &SharedMut<f32>, rows: usize, (i, tt, r, k): (usize, usize, usize, usize), call: &mut dyn FnMut(&mut [f32], usize)) {
    call(&mut o[..tt * k], k);
    for (ti, orow) in o[..tt * k].chunks_exact(k).enumerate() {
        // SAFETY: the caller's contract.
        let dst = unsafe { out.slice((i + ti) * rows + r, k) };
        // (Fixed lengths for the usual shapes: inline moves, not a memcpy call per 16 or
        // 32 bytes.)
        match k {
            4 => dst[..4].copy_from_slice(&orow[..4]),
            8 => dst[..8].copy_from_slice(&orow[..8]),
            _ => dst.copy_from_slice(orow),
        }
    }
}

/// Floats of a rows16 call's staged outputs: its tokens (a tile's, or up to
/// [`ROWS16_TOKENS`]) by its rows.
const STAGE: usize = {
    let (a, b) = (DOT_TILE_MAX_TOKENS * ROWS16_TILE_GROUPS * ROWS16, ROWS16_TOKENS * ROWS16_Q4_0_GROUPS * ROWS16);
    if a > b { a } else { b }
};

/// Bytes of its weights a one-token task asks for before it starts ([`matvec_group`]).
const START_BYTES: usize = 8192;

/// A one-token product's matrix size from which its rows go out in [`BALANCE_PARTS`]
/// parts per thread, taken by whichever thread is free (the pool hands out tasks past
/// the first `n_threads` in turn): two cores of one machine stream at different rates
/// from minute to minute, and with one half each the faster waits for the slower at
/// the end of every such product (SmolLM2's 30 MB output matrix on a two-core AMD EPYC
/// VM: in slow minutes the calling thread's half took up to 1.8x the other's;
/// BENCHMARKS.md). Smaller products keep one part per thread: more, shorter parts
/// slowed their decode down (each part starts a new stream).
pub(crate) const BALANCE_BYTES: usize = 4 << 20;

/// Parts per thread of a product of at least [`BALANCE_BYTES`].
const BALANCE_PARTS: usize = 8;

/// `matmul_as`'s tasks and the rows they split in units of: for one token on several
/// threads whole groups of [`DOT_ROWS`] rows, one part per thread or, for a matrix of at
/// least [`BALANCE_BYTES`], [`BALANCE_PARTS`]; else one task per thread and single rows.
fn product_tasks(threads: usize, n: usize, rows: usize, row_bytes: usize) -> (usize, usize) {
    if n == 1 && threads > 1 {
        ((threads * stream_parts(threads, rows * row_bytes)).min(rows.div_ceil(DOT_ROWS)).max(1), DOT_ROWS)
    } else {
        (threads.min(rows).max(1), 1)
    }
}

/// Parts per thread of a one-token product of `bytes`.
fn stream_parts(threads: usize, bytes: usize) -> usize {
    if threads > 1 && bytes >= BALANCE_BYTES { BALANCE_PARTS } else { 1 }
}

/// Task `t`'s rows of `rows` split in `tasks` parts of whole `unit`s (the last may be short).
pub(crate) fn task_rows(rows: usize, unit: usize, tasks: usize, t: usize) -> core::ops::Range<usize> {
    let r = split_range(rows.div_ceil(unit), tasks, t);
    (r.start * unit).min(rows)..(r.end * unit).min(rows)
}

/// Whether [`matvec_group`] takes `ws` as one job: at most [`GROUP_MAX`] matrices of one
/// width and activation type, each with a kernel for its layout.
pub fn groupable(k: &Kernels, ws: &[&Tensor<'_>]) -> bool {
    !ws.is_empty()
        && ws.len() <= GROUP_MAX
        && ws.iter().all(|w| Kernels::vec_dot_type(w.ty) == Kernels::vec_dot_type(ws[0].ty) && w.cols == ws[0].cols && (w.layout != Layout::Rows16 || k.dot_rows16_fn(w.ty).is_some()))
}

/// [`matvec_group`]'s tasks for `ws` (`total` bytes) on `threads` threads.
fn group_tasks(threads: usize, ws: &[&Tensor<'_>], total: usize) -> usize {
    (threads * stream_parts(threads, total)).min(ws.iter().map(|w| w.rows.div_ceil(DOT_ROWS)).sum()).max(1)
}

/// The groups (of `gb` bytes) of the matrix at bytes `at` of a [`matvec_group`] stream
/// that start in the task's bytes `share`.
fn share_groups(share: &core::ops::Range<usize>, at: core::ops::Range<usize>, gb: usize) -> core::ops::Range<usize> {
    let first = |b: usize| b.clamp(at.start, at.end).saturating_sub(at.start).div_ceil(gb.max(1));
    first(share.start)..first(share.end)
}

/// A one-token product's tasks for a rows16 matrix of `groups` groups and `bytes` bytes
/// alone ([`matmul`]) on `threads` threads.
fn rows16_tasks(threads: usize, groups: usize, bytes: usize) -> usize {
    (threads * stream_parts(threads, bytes)).min(groups).max(1)
}

/// The groups of 16 rows of each of `ws` (rows16 matrices, one job of a token's forward
/// pass: `block_cpu::for_each_one_token_job`) that thread `t` of `threads` computes: the
/// shares of [`matvec_group`] for two or more matrices, of [`matmul`] for one. `None`
/// where the job has more tasks than threads (a large product in parts any thread may
/// take, [`BALANCE_BYTES`]) or a matrix is not in the rows16 layout. The host places a
/// matrix's rows by these shares (`Gguf::with_splits`), so that each thread's shares of
/// consecutive products lie one after another.
pub fn one_token_shares(ws: &[&Tensor<'_>], threads: usize, t: usize) -> Option<[core::ops::Range<usize>; GROUP_MAX]> {
    let mut out: [core::ops::Range<usize>; GROUP_MAX] = Default::default();
    if ws.is_empty() || ws.len() > GROUP_MAX || ws.iter().any(|w| w.layout != Layout::Rows16) {
        return None;
    }
    if let [w] = ws {
        let groups = w.rows / ROWS16;
        if rows16_tasks(threads, groups, w.rows * w.row_bytes()) != threads {
            return None;
        }
        out[0] = split_range(groups, threads, t);
        return Some(out);
    }
    let mut start = [0usize; GROUP_MAX + 1];
    for (i, w) in ws.iter().enumerate() {
        start[i + 1] = start[i] + w.rows * w.row_bytes();
    }
    if group_tasks(threads, ws, start[ws.len()]) != threads {
        return None;
    }
    let share = split_range(start[ws.len()], threads, t);
    for (i, w) in ws.iter().enumerate() {
        out[i] = share_groups(&share, start[i]..start[i + 1], ROWS16 * w.row_bytes());
    }
    Some(out)
}

/// Every parallel job of the products of a forward pass of one token through `model`'s
/// layers on the CPU with the kernels `k`, in order: `f(layer, weights)`, q, k and v (or
/// gate and up) together where [`matvec_group`] takes them, every other product alone.
/// With [`one_token_shares`] it tells the host which rows each thread reads.
pub fn for_each_one_token_job<'m>(k: &Kernels, model: &crate::model::Model<'m>, mut f: impl FnMut(usize, &[&Tensor<'m>])) {
    for (l, layer) in model.layers.iter().enumerate() {
        crate::block_cpu::for_each_one_token_job(k, &model.hp, l, layer, |ws| f(l, ws));
    }
}

/// Most matrices of one [`matvec_group`].
pub const GROUP_MAX: usize = 4;

/// [`matmul`] of one activation row `xq` with several matrices that take the same
/// quantized input (q, k and v; gate and up), in one parallel job instead of one per
/// matrix: decode's hand-offs between threads are a fixed cost per job, and the small
/// ones (k and v) are mostly that cost. The matrices' bytes are taken as one stream and
/// split into equal consecutive shares, each share the groups of [`DOT_ROWS`] rows that
/// start in it (a matrix's last group may be shorter); a whole group takes the type's
/// 8-row kernel, any other row its `dot` (a matrix in the rows16 layout: groups of 16
/// rows, its rows16 kernel). Every output has `dot`'s bits, as in `matmul`. `outs[m]`
/// receives matrix `m`'s `rows` outputs. Returns false (and computes nothing) when a
/// matrix has no kernel (or no rows16 kernel for its layout) or another width, the
/// matrices do not share an activation type, or there are more than [`GROUP_MAX`].
pub fn matvec_group(k: &Kernels, par: &dyn Parallel, ws: &[&Tensor<'_>], xq: &[u8], outs: &mut [&mut [f32]]) -> bool {
    let m = ws.len();
    if !groupable(k, ws) || outs.len() != m {
        return false;
    }
    let Some(rb) = act_row_bytes(ws[0].ty, ws[0].cols) else { return false };
    if xq.len() < rb || outs.iter().zip(ws).any(|(o, w)| o.len() < w.rows) {
        return false;
    }
    let mut dots: [Option<(DotFn, Option<DotRowsFn>)>; GROUP_MAX] = [None; GROUP_MAX];
    // Where each matrix starts in the stream of all their bytes, then the total.
    let mut start = [0usize; GROUP_MAX + 1];
    for (i, w) in ws.iter().enumerate() {
        let Ok(dot) = k.dot_fn(w.ty) else { return false };
        dots[i] = Some((dot, k.dot_rows_fn(w.ty)));
        start[i + 1] = start[i] + w.rows * w.row_bytes();
    }
    let shared: [Option<SharedMut<f32>>; GROUP_MAX] = core::array::from_fn(|i| outs.get_mut(i).map(|o| SharedMut::new(o)));
    let (xq, cols) = (&xq[..rb], ws[0].cols);
    let tasks = group_tasks(par.n_threads(), ws, start[m]);
    par.run(tasks, &|t| {
        let share = split_range(start[m], tasks, t);
        // The share's first lines asked for at once (the kernels' own hints run ahead of
        // the group they compute, so a share's start would otherwise come in line by line).
        let mut left = START_BYTES;
        for (i, w) in ws.iter().enumerate() {
            let (a, b) = (share.start.clamp(start[i], start[i + 1]), share.end.clamp(start[i], start[i + 1]));
            let take = (b - a).min(left);
            if take > 0 {
                prefetch::lines(w.byte_ptr(a - start[i]), take, Level::L2);
                left -= take;
            }
        }
        for (i, w) in ws.iter().enumerate() {
            let (Some((dot, rows_fn)), Some(out)) = (dots[i], shared[i].as_ref()) else { continue };
            // Groups of 16 rows in the rows16 layout (its kernel: checked above), else of
            // DOT_ROWS.
            let rows16 = if w.layout == Layout::Rows16 { k.dot_rows16_fn(w.ty) } else { None };
            let gr = if rows16.is_some() { ROWS16 } else { DOT_ROWS };
            let gb = gr * w.row_bytes();
            let wrb = w.row_bytes();
            let groups = share_groups(&share, start[i]..start[i + 1], gb);
            if let Some(f) = rows16 {
                // The share's groups of this matrix in one call (which shares the token's
                // activation work between them), straight into the output.
                for groups in w.group_parts(groups).into_iter().filter(|g| !g.is_empty()) {
                    let (r0, r1) = (groups.start * ROWS16, groups.end * ROWS16);
                    // SAFETY: a group starts in exactly one share, so its rows belong to
                    // this task alone.
                    f(cols, groups.len(), w.groups(groups.start, groups.end), xq, rb, 1, unsafe { out.slice(r0, r1 - r0) }, r1 - r0);
                }
                continue;
            }
            for g in groups {
                let (r0, r1) = (g * gr, (g * gr + gr).min(w.rows));
                match rows_fn {
                    Some(rows_fn) if r1 - r0 == DOT_ROWS => {
                        let mut o = [0.0f32; DOT_ROWS];
                        rows_fn(cols, &w.data[r0 * wrb..r1 * wrb], wrb, xq, &mut o);
                        // SAFETY: a group starts in exactly one share, so rows r0..r1 of
                        // matrix i belong to this task alone.
                        unsafe { out.slice(r0, DOT_ROWS) }.copy_from_slice(&o);
                    }
                    _ => {
                        for r in r0..r1 {
                            // SAFETY: as above.
                            unsafe { out.slice(r, 1)[0] = dot(cols, &w.data[r * wrb..(r + 1) * wrb], xq) };
                        }
                    }
                }
            }
        }
    });
    true
}

/// Benchmarks compare the short-batch path with the general one (`quant::bench`).
#[cfg(test)]
pub(crate) static NO_PAIRS: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

#[inline]
fn no_pairs() -> bool {
    #[cfg(test)]
    return NO_PAIRS.load(core::sync::atomic::Ordering::Relaxed);
    #[cfg(not(test))]
    false
}

/// The fewest tokens that take the pairs kernel: with one pair it is no faster than the
/// 8-row kernel once per token (`quant::bench::bench_matmul_short`).
const SHORT_MIN: usize = 4;

/// A short batch's kernels and operands (see [`matmul_as`]).
struct Short<'s, 'w> {
    pairs_fn: DotPairsFn,
    rows_fn: DotRowsFn,
    dot: DotFn,
    w: &'s Tensor<'w>,
    xq: &'s [u8],
    rb: usize,
    n: usize,
}

impl Short<'_, '_> {
    /// Weight rows `range` against every token: groups of [`DOT_ROWS`] rows by the pairs
    /// kernel (the next group prefetched) and, for an odd last token, the 8-row kernel;
    /// rows after the last whole group pair by pair. Each output is `dot`'s bits.
    fn rows(&self, range: core::ops::Range<usize>, out: &SharedMut<f32>) {
        let (w, xq, rb, n) = (self.w, self.xq, self.rb, self.n);
        let (rows, wrb, cols, pairs) = (w.rows, w.row_bytes(), w.cols, n / 2);
        let nr = range.len() - range.len() % DOT_ROWS;
        let mut o = [0.0f32; 2 * DOT_PAIRS_MAX * DOT_ROWS];
        for r in (range.start..range.start + nr).step_by(DOT_ROWS) {
            prefetch::lines(w.data.as_ptr().wrapping_add((r + DOT_ROWS) * wrb), DOT_ROWS * wrb, Level::L1);
            let g = &w.data[r * wrb..(r + DOT_ROWS) * wrb];
            (self.pairs_fn)(cols, g, wrb, DOT_ROWS, &xq[..2 * pairs * rb], rb, pairs, &mut o[..2 * pairs * DOT_ROWS], DOT_ROWS);
            for (i, orow) in o[..2 * pairs * DOT_ROWS].chunks_exact(DOT_ROWS).enumerate() {
                // SAFETY: elements (i, r..r + DOT_ROWS) are written by the one task owning
                // those rows.
                unsafe { out.slice(i * rows + r, DOT_ROWS) }.copy_from_slice(orow);
            }
            if n % 2 == 1 {
                let mut o1 = [0.0f32; DOT_ROWS];
                (self.rows_fn)(cols, g, wrb, &xq[(n - 1) * rb..n * rb], &mut o1);
                // SAFETY: as above.
                unsafe { out.slice((n - 1) * rows + r, DOT_ROWS) }.copy_from_slice(&o1);
            }
        }
        for r in range.start + nr..range.end {
            let wrow = &w.data[r * wrb..(r + 1) * wrb];
            for i in 0..n {
                let v = (self.dot)(cols, wrow, &xq[i * rb..(i + 1) * rb]);
                // SAFETY: element (i, r) is written by the one task owning row r.
                unsafe { out.slice(i * rows + r, 1)[0] = v };
            }
        }
    }
}

/// [`matmul`] with llama.cpp's per-token kernel choice: whole tiles of
/// [`Kernels::dot_tile_in_batch`] where the batch's order has one (each output the bits
/// of its token's kernel), the per-token dot for every other (row, token) pair; the
/// tokens in spans of [`TOKEN_TILE`] (or of one tile, if wider), a long batch's spans
/// dealt out as [`matmul_as`] deals its chunks.
fn matmul_per_token(k: &Kernels, par: &dyn Parallel, w: &Tensor<'_>, xq: &[u8], n: usize, out: &mut [f32]) {
    let rows = w.rows;
    let rb = act_row_bytes(w.ty, w.cols).unwrap_or(0);
    let wrb = w.row_bytes();
    let out = SharedMut::new(&mut out[..n * rows]);
    let threads = par.n_threads().max(1);
    let cols = w.cols;
    let tile = k.dot_tile_in_batch(w.ty, rows, n);
    // Spans of whole tiles (the tiles' first `covered` tokens are whole tiles too), so that
    // a group's weights are reused from cache by every token tile of the span.
    let span = tile.map_or(TOKEN_TILE, |(t, _)| TOKEN_TILE.max(t.tokens) - TOKEN_TILE.max(t.tokens) % t.tokens);
    // Rows `range` for tokens `i0..i1`, which no other call of the job writes; `put` as
    // in `matmul_as`.
    let part = |range: core::ops::Range<usize>, (i0, i1): (usize, usize), put: &mut Put<'_>| {
        // Rows range.start..r_done have tokens i0..i_done done by tiles.
        let (mut r_done, mut i_done) = (range.start, i0);
        if let Some((tile, covered)) = tile {
            let (tr, tt) = (tile.rows, tile.tokens);
            let nr = range.len() - range.len() % tr;
            let ti = i1.min(covered).max(i0);
            for r in (range.start..range.start + nr).step_by(tr) {
                for i in (i0..ti).step_by(tt) {
                    put(i, tt, r, tr, &mut |o, os| (tile.f)(cols, &w.data[r * wrb..(r + tr) * wrb], wrb, tr, &xq[i * rb..(i + tt) * rb], rb, o, os));
                }
            }
            (r_done, i_done) = (range.start + nr, ti);
        }
        for i in i0..i1 {
            let Ok(dot) = k.dot_fn_in_batch(w.ty, rows, n, i) else { return };
            let first = if i < i_done { r_done } else { range.start };
            for r in first..range.end {
                let v = dot(cols, &w.data[r * wrb..(r + 1) * wrb], &xq[i * rb..(i + 1) * rb]);
                // SAFETY: element (i, r) is written by this call alone.
                unsafe { out.slice(i * rows + r, 1)[0] = v };
            }
        }
    };
    if n >= TOKEN_ITEMS * threads * span {
        return deal_by_tokens(par, n, span, &out, rows, &|tokens, put| part(0..rows, tokens, put));
    }
    let tasks = threads.min(rows).max(1);
    par.run(tasks, &|t| {
        let range = split_range(rows, tasks, t);
        let mut o = [0.0f32; DOT_TILE_MAX_TOKENS * DOT_TILE_MAX_ROWS];
        for i0 in (0..n).step_by(span) {
            // SAFETY: the task's rows are its own for every token.
            part(range.clone(), (i0, (i0 + span).min(n)), &mut |i, tt, r, k, call| unsafe { put_staged(&mut o, &out, rows, (i, tt, r, k), call) });
        }
    });
}

//! Opening a model for a subcommand: resolve the name, map the file, parse it, plan and
//! allocate the arena once, build the engine and the thread pool.

use crate::mmap::{Arena, ModelFile};
use crate::pool::ThreadPool;
use anyhow::{bail, Context, Result};
use keel_core::engine::{plan_with, Engine};
use keel_core::gguf::Gguf;
use keel_core::quant::Kernels;
use keel_core::sampler::SamplerConfig;
use keel_core::session::SessionConfig;
use std::path::PathBuf;

/// Whether [`open_to_run`] maps model files (`--mmap`) instead of reading them into huge
/// pages.
static MMAP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Sets how [`open_to_run`] holds model files from now on: `true` maps them (`--mmap`:
/// shared with the page cache, paged in on demand), `false` (the default) reads each into
/// private memory in transparent huge pages ([`ModelFile::load`]).
pub fn set_mmap(map: bool) {
    MMAP.store(map, std::sync::atomic::Ordering::Relaxed);
}

/// The model file's bytes.
pub struct Opened {
    /// Where it is.
    pub path: PathBuf,
    /// Its bytes.
    pub file: ModelFile,
    /// File offsets (sorted) of the matrices [`Opened::pack_for_cpu`] rearranged in the
    /// rows16 layout.
    rows16: Vec<u64>,
    /// The matrices [`Opened::place_for_threads`] placed in two parts.
    splits: Vec<keel_core::gguf::Split>,
}

/// Resolves `-m` (a path or a known model name, pulled on first use) and maps it: for
/// the commands that read the file's header or pass over it once (`info`, `plan`,
/// `tokenize`, `quantize`).
pub fn open(model: &str) -> Result<Opened> {
    let path = crate::pull::resolve_model(model)?;
    let file = ModelFile::open(&path)?;
    Ok(Opened { path, file, rows16: Vec::new(), splits: Vec::new() })
}

/// [`open`] for the commands that run the model (every token reads every weight):
/// reads it into private memory in huge pages, its tensors in the order a forward pass
/// reads them ([`ModelFile::load_in_execution_order`]), or maps it with
/// `--mmap` ([`set_mmap`]) or when the file is larger than the memory available now (a
/// copy would push the machine into swap or the OOM killer; a map pages in and out).
pub fn open_to_run(model: &str) -> Result<Opened> {
    let path = crate::pull::resolve_model(model)?;
    let size = std::fs::metadata(&path).map_or(0, |m| m.len());
    let available = crate::mem::available_memory();
    let file = if MMAP.load(std::sync::atomic::Ordering::Relaxed) {
        ModelFile::open(&path)?
    } else if !fits_in_memory(size, available) {
        eprintln!(
            "keel: note: {} ({} MiB) is larger than the memory available now ({} MiB): mapping it, as --mmap does, instead of reading it into memory",
            path.display(),
            size >> 20,
            available.unwrap_or(0) >> 20
        );
        ModelFile::open(&path)?
    } else {
        ModelFile::load_in_execution_order(&path)?
    };
    Ok(Opened { path, file, rows16: Vec::new(), splits: Vec::new() })
}

/// Whether a file of `size` bytes may be read into memory when `available` bytes are
/// available (`None`: not known, so yes).
fn fits_in_memory(size: u64, available: Option<u64>) -> bool {
    available.is_none_or(|a| size <= a)
}

/// [`open_to_run`] for a model that runs on the CPU only, with the kernels of
/// `reference`, on `threads` threads: its matrices that have rows16 kernels there are
/// packed for them ([`Opened::pack_for_cpu`]) and placed by thread
/// ([`Opened::place_for_threads`]).
pub fn open_for_cpu(model: &str, reference: bool, threads: usize) -> Result<Opened> {
    let mut o = open_to_run(model)?;
    let k = kernels(reference);
    o.pack_for_cpu(&k)?;
    o.place_for_threads(&k, threads)?;
    Ok(o)
}

impl Opened {
    /// Parses the GGUF header; errors name the file. The matrices
    /// [`Opened::pack_for_cpu`] rearranged are marked so (their tensors' layout).
    pub fn gguf(&self) -> Result<Gguf<'_>> {
        Gguf::parse(self.file.bytes()).map(|g| g.with_rows16(&self.rows16).with_splits(&self.splits)).map_err(|e| anyhow::anyhow!("{}: {e}", self.path.display()))
    }

    /// How many matrices [`Opened::place_for_threads`] placed in two parts.
    pub fn split_matrices(&self) -> usize {
        self.splits.iter().filter(|s| s.hi_at != 0).count()
    }

    /// Places the rows16 matrices of every layer by the thread that reads them when a
    /// token runs on `threads` threads (2 or more) with the kernels `k`: every one-token
    /// job's shares (`keel_core::matmul::one_token_shares`) go, job after job and layer
    /// after layer, into one run of bytes per thread, a matrix whose rows two threads
    /// share in two parts, so that each thread streams its token's weights from one job to
    /// the next instead of restarting at every job past the other thread's share
    /// (BENCHMARKS.md, "One stream per thread"). The layers' other tensors (norms) follow
    /// the runs; the header stays as it is, the new places told to the core
    /// (`Gguf::with_splits`). Only a private copy is rewritten (as
    /// [`Opened::pack_for_cpu`], after it); nothing is moved for one thread, for a map of
    /// the file, or where a job does not split its rows in two parts per matrix at most
    /// (3 or more threads: few jobs do). The moved bytes are read again from the file
    /// into their new places (and packed again), so no buffer of the layers' size is held;
    /// every moved tensor's bytes are then checked against what they were, and a file
    /// that changed in between is an error. Returns how many matrices were placed in two
    /// parts.
    pub fn place_for_threads(&mut self, k: &Kernels, threads: usize) -> Result<usize> {
        use std::os::unix::fs::FileExt;
        if threads < 2 || self.rows16.is_empty() || !self.splits.is_empty() || !self.file.is_copy() {
            return Ok(0);
        }
        let Some(ThreadPlan { moves, splits }) = self.thread_plan(k, threads)? else { return Ok(0) };
        let path = self.path.clone();
        let fail = |what: &str, e: std::io::Error| anyhow::anyhow!("{}: {what}: {e}", path.display());
        // Where each moved tensor's bytes are in the file (its header's order may differ).
        let file = std::fs::File::open(&path).map_err(|e| fail("open", e))?;
        let map = ModelFile::open(&path)?;
        let fg = Gguf::parse(map.bytes()).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let in_file: std::collections::HashMap<&[u8], u64> = fg.tensors().map(|t| (t.name, t.offset)).collect();
        // Each moved tensor: its name, its file offset and its bytes' hash as they are.
        let mut moved: Vec<(Vec<u8>, u64, u64)> = Vec::new();
        {
            let g = self.gguf()?;
            for t in g.tensors().filter(|t| moves.iter().any(|m| m.offset == t.offset)) {
                let Some(&at) = in_file.get(t.name) else { return Ok(0) };
                moved.push((t.name.to_vec(), at, Checksum::of(&[t.data])));
            }
        }
        let file_at: std::collections::HashMap<&[u8], u64> = moved.iter().map(|(n, at, _)| (&n[..], *at)).collect();
        let done = self.file.rewrite(|bytes| -> Result<()> {
            let mut scratch = Vec::new();
            for m in &moves {
                let dst = &mut bytes[m.to..m.to + m.len];
                file.read_exact_at(dst, file_at[&m.name[..]] + m.from as u64).map_err(|e| fail("read", e))?;
                if let Some((ty, cols, wrb)) = m.pack {
                    scratch.resize(keel_core::quant::rows16::ROWS16 * wrb, 0);
                    keel_core::quant::rows16::pack_in_place(ty, m.len / wrb, cols, dst, &mut scratch).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                }
            }
            Ok(())
        });
        match done {
            None => return Ok(0),
            Some(r) => r?,
        }
        self.splits = splits;
        let g = self.gguf()?;
        for t in g.tensors() {
            if let Some((name, _, h)) = moved.iter().find(|m| m.0 == t.name) {
                if Checksum::of(&[t.data, t.hi]) != *h {
                    bail!("{}: tensor {} changed while it was read (the file was rewritten during the load?); run the command again", path.display(), String::from_utf8_lossy(name));
                }
            }
        }
        Ok(self.split_matrices())
    }

    /// [`Opened::place_for_threads`]'s plan, or `None` where nothing is to be moved.
    fn thread_plan(&self, k: &Kernels, threads: usize) -> Result<Option<ThreadPlan>> {
        use keel_core::model::{HParams, Layer, Model, Tensor};
        use std::collections::HashMap;
        let g = self.gguf()?;
        let Ok(hp) = HParams::from_gguf(&g) else { return Ok(None) };
        let mut table: Vec<std::mem::MaybeUninit<Layer<'_>>> = (0..hp.n_layer).map(|_| std::mem::MaybeUninit::uninit()).collect();
        let Ok(model) = Model::load(&g, hp, &mut table) else { return Ok(None) };
        let base = self.file.bytes().as_ptr() as usize;
        let at = |t: &Tensor<'_>| (t.data.as_ptr() as usize - base) as u64;
        // Each thread's run: (tensor offset, its groups), job after job.
        let mut runs: Vec<Vec<(u64, std::ops::Range<usize>)>> = vec![Vec::new(); threads];
        // Each moved matrix: its group bytes, groups, the groups of its first part.
        let mut matrices: HashMap<u64, (usize, usize, usize)> = HashMap::new();
        let mut ok = true;
        keel_core::matmul::for_each_one_token_job(k, &model, |_, ws| {
            let shares: Option<Vec<_>> = (0..threads).map(|t| keel_core::matmul::one_token_shares(ws, threads, t)).collect();
            let Some(shares) = shares else { return };
            for (i, w) in ws.iter().enumerate() {
                let groups = w.rows / keel_core::quant::rows16::ROWS16;
                // Pieces of this matrix, in thread order: at most two, the first from group 0.
                let pieces: Vec<_> = shares.iter().map(|s| s[i].clone()).filter(|r| !r.is_empty()).collect();
                let lo = match pieces.as_slice() {
                    [a] if *a == (0..groups) => groups,
                    [a, b] if a.start == 0 && a.end == b.start && b.end == groups => a.end,
                    [a, b] if b.start == 0 && b.end == a.start && a.end == groups => b.end,
                    _ => {
                        ok = false;
                        return;
                    }
                };
                if matrices.insert(at(w), (w.row_bytes() * keel_core::quant::rows16::ROWS16, groups, lo)).is_some() || !self.rows16.contains(&at(w)) {
                    ok = false;
                    return;
                }
                for (t, s) in shares.iter().enumerate() {
                    if !s[i].is_empty() {
                        runs[t].push((at(w), s[i].clone()));
                    }
                }
            }
        });
        if !ok || matrices.is_empty() {
            return Ok(None);
        }
        // The span the moved matrices occupy, and the other tensors in it.
        let align = g.alignment() as usize;
        let all: Vec<(u64, usize, &[u8], keel_core::ggml_type::GgmlType, usize)> = g.tensors().map(|t| (t.offset, t.data.len(), t.name, t.ty, t.ne[0] as usize)).collect();
        let info = |o: u64| all.iter().find(|a| a.0 == o).copied();
        let span = {
            let first = matrices.keys().min().copied().unwrap_or(0) as usize;
            let last = matrices.iter().map(|(&o, &(gb, groups, _))| o as usize + gb * groups).max().unwrap_or(0);
            first..last
        };
        let inside = |o: u64, len: usize| (o as usize) < span.end && o as usize + len > span.start;
        if all.iter().any(|&(o, len, ..)| !matrices.contains_key(&o) && inside(o, len) && ((o as usize) < span.start || o as usize + len > span.end)) {
            return Ok(None);
        }
        // The new places: each thread's run, then the span's other tensors in offset order.
        let mut moves: Vec<Move> = Vec::new();
        let mut pos = span.start;
        let (mut new_at, mut hi_at): (HashMap<u64, u64>, HashMap<u64, u64>) = (HashMap::new(), HashMap::new());
        let packs = |o: u64, ty: keel_core::ggml_type::GgmlType, cols: usize| self.rows16.contains(&o).then(|| (ty, cols, ty.row_bytes(cols as u64).unwrap_or(0) as usize));
        for run in &runs {
            for (o, r) in run {
                let (gb, _, lo) = matrices[o];
                let Some((_, _, name, ty, cols)) = info(*o) else { return Ok(None) };
                pos = pos.next_multiple_of(align);
                moves.push(Move { offset: *o, name: name.to_vec(), from: r.start * gb, len: r.len() * gb, to: pos, pack: packs(*o, ty, cols) });
                if r.start == 0 {
                    new_at.insert(*o, pos as u64);
                } else if r.start == lo {
                    hi_at.insert(*o, pos as u64);
                }
                pos += r.len() * gb;
            }
        }
        let mut others: Vec<_> = all.iter().copied().filter(|&(o, len, ..)| !matrices.contains_key(&o) && inside(o, len)).collect();
        others.sort_unstable_by_key(|a| a.0);
        for &(o, len, name, ty, cols) in &others {
            pos = pos.next_multiple_of(align);
            moves.push(Move { offset: o, name: name.to_vec(), from: 0, len, to: pos, pack: packs(o, ty, cols) });
            new_at.insert(o, pos as u64);
            pos += len;
        }
        if pos > span.end || moves.iter().any(|m| m.pack.is_some_and(|(_, _, wrb)| wrb == 0 || m.len % (keel_core::quant::rows16::ROWS16 * wrb) != 0)) {
            return Ok(None);
        }
        // Every tensor moved: a matrix's first part, or all of it; the others' all.
        let mut splits: Vec<keel_core::gguf::Split> = matrices
            .iter()
            .map(|(&o, &(gb, _, lo))| keel_core::gguf::Split { offset: o, at: new_at[&o], lo_bytes: (lo * gb) as u64, hi_at: hi_at.get(&o).copied().unwrap_or(0) })
            .chain(others.iter().map(|&(o, len, ..)| keel_core::gguf::Split { offset: o, at: new_at[&o], lo_bytes: len as u64, hi_at: 0 }))
            .collect();
        splits.sort_unstable();
        Ok(Some(ThreadPlan { moves, splits }))
    }
}

/// A checksum of a run of bytes given in pieces (the same for any cut): four
/// multiply-xor lanes over 32-byte blocks, then the last bytes and the length. It only has
/// to tell a changed tensor from its bytes before a move ([`Opened::place_for_threads`]),
/// at memory speed (a general hasher took ~50 ms over SmolLM2's layers).
#[derive(Default)]
struct Checksum {
    lanes: [u64; 4],
    pending: [u8; 32],
    held: usize,
    len: u64,
}

impl Checksum {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;

    /// The checksum of `parts` one after another.
    fn of(parts: &[&[u8]]) -> u64 {
        let mut c = Self::default();
        for p in parts {
            c.write(p);
        }
        c.finish()
    }

    fn block(&mut self, b: &[u8]) {
        for (j, l) in self.lanes.iter_mut().enumerate() {
            let w = u64::from_le_bytes([b[8 * j], b[8 * j + 1], b[8 * j + 2], b[8 * j + 3], b[8 * j + 4], b[8 * j + 5], b[8 * j + 6], b[8 * j + 7]]);
            *l = (*l ^ w).wrapping_mul(Self::K).rotate_left(29);
        }
    }

    fn write(&mut self, mut b: &[u8]) {
        self.len += b.len() as u64;
        if self.held > 0 {
            let k = (32 - self.held).min(b.len());
            self.pending[self.held..self.held + k].copy_from_slice(&b[..k]);
            self.held += k;
            b = &b[k..];
            if self.held < 32 {
                return;
            }
            let p = self.pending;
            self.block(&p);
            self.held = 0;
        }
        let mut it = b.chunks_exact(32);
        for c in &mut it {
            self.block(c);
        }
        let r = it.remainder();
        self.pending[..r.len()].copy_from_slice(r);
        self.held = r.len();
    }

    fn finish(&self) -> u64 {
        let tail = self.pending[..self.held].iter().fold(self.len, |h, &b| (h ^ b as u64).wrapping_mul(Self::K));
        self.lanes.iter().fold(tail, |h, &l| (h ^ l).wrapping_mul(Self::K).rotate_left(31))
    }
}

/// [`Opened::place_for_threads`]'s plan: the bytes to read from the file into their new
/// places, then where every moved tensor is.
struct ThreadPlan {
    moves: Vec<Move>,
    splits: Vec<keel_core::gguf::Split>,
}

/// One run of a tensor's bytes read again from the file into its new place.
struct Move {
    /// The tensor's offset in the copy (its header's).
    offset: u64,
    /// Its name (to find it in the file).
    name: Vec<u8>,
    /// The run's first byte within the tensor (a rows16 matrix: whole groups).
    from: usize,
    /// The run's bytes.
    len: usize,
    /// Where they go in the copy.
    to: usize,
    /// For a rows16 matrix, its type, columns and row bytes (the run is packed again).
    pack: Option<(keel_core::ggml_type::GgmlType, usize, usize)>,
}

impl Opened {

    /// How many matrices [`Opened::pack_for_cpu`] packed.
    pub fn rows16_matrices(&self) -> usize {
        self.rows16.len()
    }

    /// Rearranges, in place, the matrices the kernel set `k` has rows16 kernels for
    /// (`keel_core::quant::rows16`: Q4_0, Q4_1, Q5_0, Q8_0 and Q4_K with AVX-512 VNNI): every
    /// layer's attention and feed-forward projections, the output projection and the
    /// token embedding (the output of a tied model; its rows are looked up through
    /// `Tensor::dequantize_row`), when their rows come in whole groups of 16. Only a
    /// private copy of the file is written (not a map: `--mmap`, or a file larger than the
    /// memory available); the file itself never is. Call before [`Opened::gguf`], once,
    /// and run the model with `k` only: the one-token products then stream each group of
    /// 16 rows as one run of bytes without shuffles (BENCHMARKS.md, "rows16"). Returns how
    /// many matrices were packed.
    pub fn pack_for_cpu(&mut self, k: &Kernels) -> Result<usize> {
        if !self.rows16.is_empty() {
            return Ok(self.rows16.len());
        }
        if !self.file.is_copy() {
            return Ok(0);
        }
        // The matrices to pack: (offset, type, rows, columns), from the header.
        let jobs: Vec<(u64, keel_core::ggml_type::GgmlType, usize, usize)> = {
            let g = Gguf::parse(self.file.bytes()).map_err(|e| anyhow::anyhow!("{}: {e}", self.path.display()))?;
            // Every tensor's bytes, to leave alone a matrix whose bytes any other tensor
            // shares (a file may point two tensors at the same data).
            let spans: Vec<(u64, u64)> = g.tensors().map(|t| (t.offset, t.offset + t.data.len() as u64)).collect();
            let shared = |a: u64, b: u64| spans.iter().filter(|&&(x, y)| x < b && a < y).count() > 1;
            g.tensors()
                .filter(|t| t.n_dims == 2 && keel_core::model::rows16_tensor(t.name) && k.packs_rows16(t.ty, t.ne[1] as usize) && !shared(t.offset, t.offset + t.data.len() as u64))
                .map(|t| (t.offset, t.ty, t.ne[1] as usize, t.ne[0] as usize))
                .collect()
        };
        let packed = self.file.rewrite(|bytes| {
            let mut scratch = Vec::new();
            for &(off, ty, rows, cols) in &jobs {
                let size = ty.row_bytes(cols as u64).unwrap_or(0) as usize * rows;
                scratch.resize(keel_core::quant::rows16::ROWS16 * size / rows, 0);
                let data = &mut bytes[off as usize..off as usize + size];
                keel_core::quant::rows16::pack_in_place(ty, rows, cols, data, &mut scratch)?;
            }
            Ok::<_, keel_core::quant::Unsupported>(())
        });
        match packed {
            // (The copy stayed read-only: nothing was packed, the plain kernels run.)
            None => return Ok(0),
            Some(r) => r.map_err(|e| anyhow::anyhow!("{}: {e}", self.path.display()))?,
        }
        self.rows16 = jobs.iter().map(|j| j.0).collect();
        self.rows16.sort_unstable();
        Ok(jobs.len())
    }
}

/// Run limits and kernel choice shared by the subcommands that evaluate.
#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    /// Context length.
    pub n_ctx: usize,
    /// Tokens per forward pass.
    pub n_batch: usize,
    /// Logits rows per eval.
    pub n_outputs: usize,
    /// Threads.
    pub threads: usize,
    /// Scalar reference kernels instead of the fastest.
    pub reference: bool,
    /// `--force-ctx`: no warning for a context beyond the model's training length.
    pub force_ctx: bool,
}

/// The kernels for `opts` on this CPU.
pub fn kernels(reference: bool) -> Kernels {
    if reference {
        Kernels::reference()
    } else {
        // (KEEL_ISA was checked when the command started: see `cli::main_os`.)
        Kernels::new(crate::isa::chosen().unwrap_or_else(|_| crate::isa::detect()))
    }
}

/// A model ready to run: the arena (kept alive) and the pool; the engine borrows both.
pub struct Loaded {
    /// The arena memory.
    pub arena: Arena,
    /// The thread pool.
    pub pool: ThreadPool,
    /// The session limits used.
    pub cfg: SessionConfig,
    /// Whether the arena has room to rewind a recurrent model (speculative decoding).
    pub checkpoint: bool,
}

/// The session limits `opts` asks for.
pub fn session_config(opts: &RunOptions) -> SessionConfig {
    SessionConfig { n_ctx: opts.n_ctx, n_batch: opts.n_batch.min(opts.n_ctx), n_outputs: opts.n_outputs, n_threads: opts.threads }
}

/// The arena `opts` needs for this model, in bytes, and this machine's physical memory
/// when the arena is larger (`None`: it fits, or the memory is unknown).
pub fn arena_beyond_memory(g: &Gguf<'_>, path: &std::path::Path, opts: &RunOptions) -> Result<(usize, Option<u64>)> {
    arena_beyond_memory_with(g, path, opts, false)
}

/// [`arena_beyond_memory`] for an arena with `checkpoint` room (speculative decoding).
fn arena_beyond_memory_with(g: &Gguf<'_>, path: &std::path::Path, opts: &RunOptions, checkpoint: bool) -> Result<(usize, Option<u64>)> {
    let total = plan_with(g, &session_config(opts), checkpoint).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?.total_bytes();
    Ok((total, crate::mem::physical_memory().filter(|&m| total as u64 > m)))
}

/// The model's training context when the file states it: `(<arch>.context_length, its value)`.
pub fn training_context(g: &Gguf<'_>) -> Option<(String, usize)> {
    let hp = keel_core::model::HParams::from_gguf(g).ok()?;
    let mut keys = keel_core::model::hparams::ArchKeys::new(hp.arch);
    let key = keys.key("context_length");
    let train = g.u32_opt(key).ok()??;
    Some((key.to_string(), train as usize))
}

/// Warns (stderr) when `-c` is beyond the model's training context
/// (`<arch>.context_length`), unless `--force-ctx`: positions past it were never trained.
pub fn warn_past_training_context(g: &Gguf<'_>, opts: &RunOptions) {
    if let Some((key, train)) = training_context(g).filter(|&(_, t)| !opts.force_ctx && opts.n_ctx > t) {
        eprintln!(
            "keel: warning: -c {} is beyond the model's training context ({key} = {train}): positions past {train} were never trained and may give wrong answers; lower -c, or pass --force-ctx to go on without this warning",
            opts.n_ctx
        );
    }
}

/// Plans and allocates the arena and starts the pool. An arena larger than this
/// machine's physical memory is refused before anything is mapped (the message gives
/// both sizes and a `-c` that fits); a context beyond the model's training length is
/// warned about unless `--force-ctx`.
pub fn prepare(g: &Gguf<'_>, path: &std::path::Path, opts: &RunOptions) -> Result<Loaded> {
    prepare_with(g, path, opts, false)
}

/// [`prepare`], with `checkpoint`: room for the session to rewind a recurrent model
/// (speculative decoding; [`keel_core::engine::plan_with`]).
pub fn prepare_with(g: &Gguf<'_>, path: &std::path::Path, opts: &RunOptions, checkpoint: bool) -> Result<Loaded> {
    let cfg = session_config(opts);
    if let (total, Some(mem)) = arena_beyond_memory_with(g, path, opts, checkpoint)? {
        // The largest power-of-two context (down from -c) whose arena fits.
        let fits = (0..20).map(|i| opts.n_ctx >> i).take_while(|&c| c > 0).find(|&c| arena_beyond_memory_with(g, path, &RunOptions { n_ctx: c, n_outputs: opts.n_outputs.min(c), ..*opts }, checkpoint).is_ok_and(|(_, over)| over.is_none()));
        let hint = match fits {
            Some(c) => format!("lower -c (-c {c} fits)"),
            None => "this model does not fit in this machine's memory at any -c".into(),
        };
        bail!(
            "{}: the planned arena for -c {} is {} but this machine has {} of physical memory; {hint}",
            path.display(),
            opts.n_ctx,
            super::common::mib(total as u64),
            super::common::mib(mem)
        );
    }
    warn_past_training_context(g, opts);
    let plan = plan_with(g, &cfg, checkpoint).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let arena = Arena::new(plan.total_bytes()).with_context(|| format!("allocating the {} byte arena", plan.total_bytes()))?;
    let pool = ThreadPool::new(opts.threads).context("starting the thread pool")?;
    Ok(Loaded { arena, pool, cfg, checkpoint })
}

/// Builds the engine inside a prepared arena.
pub fn engine<'a>(g: &Gguf<'a>, path: &std::path::Path, loaded: &'a mut Loaded, reference: bool, sampling: SamplerConfig) -> Result<(Engine<'a>, &'a ThreadPool)> {
    let Loaded { arena, pool, cfg, checkpoint } = loaded;
    let e = Engine::new_with(g, arena.as_mut_slice(), *cfg, kernels(reference), sampling, *checkpoint).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok((e, pool))
}

#[cfg(test)]
mod tests {
    use super::fits_in_memory;

    /// `place_for_threads` on SmolLM2 (Q4_1, the rows16 layout) for two threads: q, o and
    /// down of every layer in two parts (90 matrices), each thread's shares of the token's
    /// jobs one run of bytes (each piece starting where the thread's last one ended), every
    /// tensor the same bytes under its name, and a prompt and four greedy steps on two
    /// threads the same logits bits as the copy not placed; for one thread nothing moves.
    #[test]
    fn places_each_threads_shares_in_one_run() {
        use keel_core::model::{HParams, Layer, Model};
        use keel_core::session::Outputs;
        let Some(model) = keel_test_support::smollm2_path() else { return };
        let path = model.to_str().unwrap();
        let k = super::kernels(false);
        if !k.packs_rows16(keel_core::ggml_type::GgmlType::Q4_1, 576) {
            return;
        }
        let mut one = super::open_to_run(path).unwrap();
        one.pack_for_cpu(&k).unwrap();
        assert_eq!(one.place_for_threads(&k, 1).unwrap(), 0);
        let two = super::open_for_cpu(path, false, 2).unwrap();
        assert_eq!(two.split_matrices(), 90);
        let (g1, g2) = (one.gguf().unwrap(), two.gguf().unwrap());
        for (a, b) in g1.tensors().zip(g2.tensors()) {
            assert_eq!(a.name, b.name);
            assert!(a.hi.is_empty());
            assert!(a.data.len() == b.data.len() + b.hi.len() && a.data[..b.data.len()] == *b.data && a.data[b.data.len()..] == *b.hi, "{}", String::from_utf8_lossy(a.name));
        }
        // Each thread's pieces follow one another, job after job, layer after layer.
        let hp = HParams::from_gguf(&g2).unwrap();
        let mut table: Vec<std::mem::MaybeUninit<Layer<'_>>> = (0..hp.n_layer).map(|_| std::mem::MaybeUninit::uninit()).collect();
        let m = Model::load(&g2, hp, &mut table).unwrap();
        let mut end = [0usize; 2];
        let (mut pieces, mut jumps) = (0, 0);
        keel_core::matmul::for_each_one_token_job(&k, &m, |_, ws| {
            for (t, e) in end.iter_mut().enumerate() {
                let shares = keel_core::matmul::one_token_shares(ws, 2, t).unwrap();
                for (w, r) in ws.iter().zip(&shares).filter(|(_, r)| !r.is_empty()) {
                    let bytes = w.groups(r.start, r.end);
                    let at = bytes.as_ptr() as usize;
                    pieces += 1;
                    if *e != 0 && at != *e {
                        jumps += 1;
                    }
                    *e = at + bytes.len();
                }
            }
        });
        assert!(pieces >= 30 * 9 && jumps == 0, "{pieces} pieces, {jumps} not where the thread's last one ended");
        // The same logits, placed or not.
        let opts = super::RunOptions { n_ctx: 64, n_batch: 64, n_outputs: 1, threads: 2, reference: false, force_ctx: false };
        let run = |o: &super::Opened| -> Vec<Vec<u32>> {
            let g = o.gguf().unwrap();
            let mut l = super::prepare(&g, &o.path, &opts).unwrap();
            let (mut e, pool) = super::engine(&g, &o.path, &mut l, false, keel_core::sampler::SamplerConfig::default()).unwrap();
            let mut out = Vec::new();
            let mut tok = vec![1u32, 504, 3458, 282, 4649, 314];
            for _ in 0..5 {
                let logits = e.eval(&tok, Outputs::Last, pool).unwrap();
                out.push(logits.iter().map(|v| v.to_bits()).collect::<Vec<u32>>());
                let best = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap();
                tok = vec![best as u32];
            }
            out
        };
        assert!(run(&one) == run(&two), "placed for two threads, the logits changed");
    }

    /// The placement's checksum is the same for a run of bytes however it is cut, and
    /// changes with any one byte.
    #[test]
    fn checksum_is_the_same_for_any_cut() {
        let b: Vec<u8> = (0..301u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        let sum = super::Checksum::of;
        let whole = sum(&[&b]);
        for cut in [0, 1, 31, 32, 33, 64, 200, 300, 301] {
            assert_eq!(sum(&[&b[..cut], &b[cut..]]), whole, "cut at {cut}");
            assert_eq!(sum(&[&b[..cut / 2], &b[cut / 2..cut], &b[cut..]]), whole, "cuts at {} and {cut}", cut / 2);
        }
        for i in [0, 17, 31, 32, 250, 300] {
            let mut c = b.clone();
            c[i] ^= 1;
            assert_ne!(sum(&[&c]), whole, "byte {i}");
        }
        assert_ne!(sum(&[&b[..300]]), whole);
    }

    /// A file rewritten between the load and `place_for_threads` (which reads the moved
    /// bytes again from it): an error naming the file and a tensor, not a model of two
    /// files' bytes.
    #[test]
    fn placing_a_file_that_changed_is_an_error() {
        let Some(model) = keel_test_support::smollm2_path() else { return };
        let k = super::kernels(false);
        if !k.packs_rows16(keel_core::ggml_type::GgmlType::Q4_1, 576) {
            return;
        }
        let dir = crate::fsutil::test_dir("placed-changed");
        let copy = dir.join("m.gguf");
        std::fs::copy(&model, &copy).unwrap();
        let mut o = super::open_to_run(copy.to_str().unwrap()).unwrap();
        o.pack_for_cpu(&k).unwrap();
        // One byte of blk.3.attn_q.weight's quants, in the file only.
        let at = {
            let g = o.gguf().unwrap();
            let map = crate::mmap::ModelFile::open(&copy).unwrap();
            let fg = keel_core::gguf::Gguf::parse(map.bytes()).unwrap();
            let t = fg.tensor("blk.3.attn_q.weight").unwrap();
            assert!(g.tensor("blk.3.attn_q.weight").is_some());
            t.offset + 100
        };
        let mut bytes = std::fs::read(&copy).unwrap();
        bytes[at as usize] ^= 0x11;
        std::fs::write(&copy, &bytes).unwrap();
        let err = o.place_for_threads(&k, 2).unwrap_err().to_string();
        assert!(err.contains("m.gguf") && err.contains("blk.3.attn_q.weight") && err.contains("changed"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_model_larger_than_the_memory_available_is_mapped() {
        assert!(fits_in_memory(100 << 20, Some(1 << 30)));
        assert!(fits_in_memory(1 << 30, Some(1 << 30)));
        assert!(!fits_in_memory((1 << 30) + 1, Some(1 << 30)));
        assert!(fits_in_memory(u64::MAX, None));
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(crate::mem::parse_meminfo_field(text, "MemAvailable"), Some(2 << 20));
        assert_eq!(crate::mem::parse_meminfo_field(text, "MemFree"), Some(100 << 10));
        assert_eq!(crate::mem::parse_meminfo_total(text), Some(24_000_000 << 10));
        assert_eq!(crate::mem::parse_meminfo_field(text, "Mem"), None);
    }
}

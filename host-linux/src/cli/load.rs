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
    /// Where [`open_for_cpu`] placed the layers' tensors for its threads (a matrix two
    /// threads share in two parts).
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
    open_to_run_placed(model, None)
}

/// [`open_to_run`], and where it reads the file into memory, with the layers' tensors
/// placed for the kernels `k` on `threads` threads as it reads them (`Some((k, threads))`:
/// [`thread_plan`]).
fn open_to_run_placed(model: &str, cpu: Option<(&Kernels, usize)>) -> Result<Opened> {
    let path = crate::pull::resolve_model(model)?;
    let size = std::fs::metadata(&path).map_or(0, |m| m.len());
    let available = crate::mem::available_memory();
    let mut splits = Vec::new();
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
    } else if let Some((k, threads)) = cpu.filter(|&(_, t)| t >= 2) {
        ModelFile::load_in_execution_order_placed(&path, &mut |copy| match thread_plan(copy, k, threads) {
            Some(plan) => {
                splits = plan.splits;
                plan.pieces
            }
            None => Vec::new(),
        })?
    } else {
        ModelFile::load_in_execution_order(&path)?
    };
    Ok(Opened { path, file, rows16: Vec::new(), splits })
}

/// Whether a file of `size` bytes may be read into memory when `available` bytes are
/// available (`None`: not known, so yes).
fn fits_in_memory(size: u64, available: Option<u64>) -> bool {
    available.is_none_or(|a| size <= a)
}

/// [`open_to_run`] for a model that runs on the CPU only, with the kernels of
/// `reference`, on `threads` threads: on two threads the layers' tensors are placed by
/// the thread that reads them as the file is read ([`thread_plan`]), then the matrices
/// that have rows16 kernels there are packed for them ([`Opened::pack_for_cpu`]).
pub fn open_for_cpu(model: &str, reference: bool, threads: usize) -> Result<Opened> {
    let k = kernels(reference);
    let mut o = open_to_run_placed(model, Some((&k, threads)))?;
    o.pack_for_cpu(&k)?;
    Ok(o)
}

impl Opened {
    /// Parses the GGUF header; errors name the file. The matrices
    /// [`Opened::pack_for_cpu`] rearranged are marked so (their tensors' layout).
    pub fn gguf(&self) -> Result<Gguf<'_>> {
        Gguf::parse(self.file.bytes()).map(|g| g.with_rows16(&self.rows16).with_splits(&self.splits)).map_err(|e| anyhow::anyhow!("{}: {e}", self.path.display()))
    }

    /// How many matrices [`open_for_cpu`] placed in two parts.
    pub fn split_matrices(&self) -> usize {
        self.splits.iter().filter(|s| s.hi_at != 0).count()
    }
}

/// Where [`open_for_cpu`] reads the layers' tensors for `threads` threads (2 or more)
/// with the kernels `k`, from the copy's header (`copy`: its tensors not read yet): every
/// one-token job's shares (`keel_core::matmul::one_token_shares`) go, job after job and
/// layer after layer, into one run of bytes per thread, a matrix whose rows two threads
/// share in two parts, so that each thread streams its token's weights from one job to
/// the next instead of restarting at every job past the other thread's share
/// (BENCHMARKS.md, "One stream per thread"). The layers' other tensors (norms) follow the
/// runs. Each piece is read from the file straight into its place, once; the header stays
/// as it is, the places told to the core (`Gguf::with_splits`). `None` (nothing placed)
/// where a job does not split its rows in two parts per matrix at most (3 or more
/// threads: few jobs do) or the model does not load.
fn thread_plan(copy: &[u8], k: &Kernels, threads: usize) -> Option<ThreadPlan> {
    use keel_core::model::{HParams, Layer, Model, Tensor};
    use std::collections::HashMap;
    let g = Gguf::parse(copy).ok()?;
    // The matrices `pack_for_cpu` will pack (the shares are those of their kernels).
    let mut rows16: Vec<u64> = rows16_jobs(&g, k).iter().map(|j| j.0).collect();
    rows16.sort_unstable();
    let g = g.with_rows16(&rows16);
    let hp = HParams::from_gguf(&g).ok()?;
    let mut table: Vec<std::mem::MaybeUninit<Layer<'_>>> = (0..hp.n_layer).map(|_| std::mem::MaybeUninit::uninit()).collect();
    let model = Model::load(&g, hp, &mut table).ok()?;
    let base = copy.as_ptr() as usize;
    let at = |t: &Tensor<'_>| (t.data.as_ptr() as usize - base) as u64;
    // Each thread's run: (tensor offset, its groups), job after job.
    let mut runs: Vec<Vec<(u64, std::ops::Range<usize>)>> = vec![Vec::new(); threads];
    // Each placed matrix: its group bytes, groups, the groups of its first part.
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
            if matrices.insert(at(w), (w.row_bytes() * keel_core::quant::rows16::ROWS16, groups, lo)).is_some() || rows16.binary_search(&at(w)).is_err() {
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
        return None;
    }
    // The span the placed matrices occupy, and the other tensors in it.
    let align = g.alignment() as usize;
    let all: Vec<(u64, usize)> = g.tensors().map(|t| (t.offset, t.data.len())).collect();
    let span = {
        let first = matrices.keys().min().copied().unwrap_or(0) as usize;
        let last = matrices.iter().map(|(&o, &(gb, groups, _))| o as usize + gb * groups).max().unwrap_or(0);
        first..last
    };
    let inside = |o: u64, len: usize| (o as usize) < span.end && o as usize + len > span.start;
    if all.iter().any(|&(o, len)| !matrices.contains_key(&o) && inside(o, len) && ((o as usize) < span.start || o as usize + len > span.end)) {
        return None;
    }
    // The new places: each thread's run, then the span's other tensors in offset order.
    let mut pieces: Vec<crate::mmap::Piece> = Vec::new();
    let mut pos = span.start;
    let (mut new_at, mut hi_at): (HashMap<u64, u64>, HashMap<u64, u64>) = (HashMap::new(), HashMap::new());
    for run in &runs {
        for (o, r) in run {
            let (gb, _, lo) = matrices[o];
            pos = pos.next_multiple_of(align);
            pieces.push(crate::mmap::Piece { offset: *o, from: r.start * gb, len: r.len() * gb, to: pos });
            if r.start == 0 {
                new_at.insert(*o, pos as u64);
            } else if r.start == lo {
                hi_at.insert(*o, pos as u64);
            }
            pos += r.len() * gb;
        }
    }
    let mut others: Vec<_> = all.iter().copied().filter(|&(o, len)| !matrices.contains_key(&o) && inside(o, len)).collect();
    others.sort_unstable_by_key(|a| a.0);
    for &(o, len) in &others {
        pos = pos.next_multiple_of(align);
        pieces.push(crate::mmap::Piece { offset: o, from: 0, len, to: pos });
        new_at.insert(o, pos as u64);
        pos += len;
    }
    if pos > span.end {
        return None;
    }
    // Every tensor placed: a matrix's first part, or all of it; the others' all.
    let mut splits: Vec<keel_core::gguf::Split> = matrices
        .iter()
        .map(|(&o, &(gb, _, lo))| keel_core::gguf::Split { offset: o, at: new_at[&o], lo_bytes: (lo * gb) as u64, hi_at: hi_at.get(&o).copied().unwrap_or(0) })
        .chain(others.iter().map(|&(o, len)| keel_core::gguf::Split { offset: o, at: new_at[&o], lo_bytes: len as u64, hi_at: 0 }))
        .collect();
    splits.sort_unstable();
    Some(ThreadPlan { pieces, splits })
}

/// [`thread_plan`]'s result: the runs to read from the file into their places, then where
/// every placed tensor is.
struct ThreadPlan {
    pieces: Vec<crate::mmap::Piece>,
    splits: Vec<keel_core::gguf::Split>,
}

/// The matrices [`Opened::pack_for_cpu`] packs for the kernels `k`, from the header `g`
/// (not split): (offset, type, rows, columns).
fn rows16_jobs(g: &Gguf<'_>, k: &Kernels) -> Vec<(u64, keel_core::ggml_type::GgmlType, usize, usize)> {
    // Every tensor's bytes, to leave alone a matrix whose bytes any other tensor shares
    // (a file may point two tensors at the same data).
    let spans: Vec<(u64, u64)> = g.tensors().map(|t| (t.offset, t.offset + t.data.len() as u64)).collect();
    let shared = |a: u64, b: u64| spans.iter().filter(|&&(x, y)| x < b && a < y).count() > 1;
    g.tensors()
        .filter(|t| t.n_dims == 2 && keel_core::model::rows16_tensor(t.name) && k.packs_rows16(t.ty, t.ne[1] as usize) && !shared(t.offset, t.offset + t.data.len() as u64))
        .map(|t| (t.offset, t.ty, t.ne[1] as usize, t.ne[0] as usize))
        .collect()
}

impl Opened {
    /// How many matrices [`Opened::pack_for_cpu`] packed.
    pub fn rows16_matrices(&self) -> usize {
        self.rows16.len()
    }

    /// Rearranges, in place, the matrices the kernel set `k` has rows16 kernels for
    /// (`keel_core::quant::rows16`: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K with AVX-512 VNNI): every
    /// layer's attention and feed-forward projections, the output projection and the
    /// token embedding (the output of a tied model; its rows are looked up through
    /// `Tensor::dequantize_row`), when their rows come in whole groups of 16. Only a
    /// private copy of the file is written (not a map: `--mmap`, or a file larger than the
    /// memory available); the file itself never is. Call before [`Opened::gguf`], once,
    /// and run the model with `k` only: the one-token products then stream each group of
    /// 16 rows as one run of bytes without shuffles (BENCHMARKS.md, "rows16"). A matrix
    /// [`open_for_cpu`] placed is packed where it lies (each part of one in two parts on
    /// its own: whole groups, so the same bytes). Returns how many matrices were packed.
    pub fn pack_for_cpu(&mut self, k: &Kernels) -> Result<usize> {
        if !self.rows16.is_empty() {
            return Ok(self.rows16.len());
        }
        if !self.file.is_copy() {
            return Ok(0);
        }
        // The matrices to pack: (offset, type, rows, columns), from the header.
        let jobs = rows16_jobs(&Gguf::parse(self.file.bytes()).map_err(|e| anyhow::anyhow!("{}: {e}", self.path.display()))?, k);
        let splits = &self.splits;
        let packed = self.file.rewrite(|bytes| {
            let mut scratch = Vec::new();
            for &(off, ty, rows, cols) in &jobs {
                let wrb = ty.row_bytes(cols as u64).unwrap_or(0) as usize;
                let size = wrb * rows;
                scratch.resize(keel_core::quant::rows16::ROWS16 * wrb, 0);
                // Its bytes where they are: where `open_for_cpu` placed them (one run, or
                // two parts of whole groups), else at the header's offset.
                let parts = match splits.iter().find(|s| s.offset == off) {
                    Some(s) if s.hi_at != 0 => [(s.at, s.lo_bytes as usize), (s.hi_at, size.saturating_sub(s.lo_bytes as usize))],
                    Some(s) => [(s.at, size), (0, 0)],
                    None => [(off, size), (0, 0)],
                };
                for (at, len) in parts.into_iter().filter(|p| p.1 > 0) {
                    let data = &mut bytes[at as usize..at as usize + len];
                    keel_core::quant::rows16::pack_in_place(ty, len / wrb.max(1), cols, data, &mut scratch)?;
                }
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

    /// `open_for_cpu` on SmolLM2 (Q4_1, the rows16 layout) for two threads: q, o and
    /// down of every layer in two parts (90 matrices), each thread's shares of the token's
    /// jobs one run of bytes (each piece starting where the thread's last one ended), every
    /// tensor the same bytes under its name, and a prompt and four greedy steps on two
    /// threads the same logits bits as the copy not placed, each step handing off the
    /// jobs the placement was made for (`for_each_one_token_job`) and no others but each
    /// layer's attention and the output projection; for one thread nothing moves.
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
        let one = super::open_for_cpu(path, false, 1).unwrap();
        assert_eq!(one.split_matrices(), 0);
        assert_eq!(one.rows16_matrices(), 211);
        let two = super::open_for_cpu(path, false, 2).unwrap();
        assert_eq!(two.rows16_matrices(), 211);
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
        let mut listed = 0u32;
        keel_core::matmul::for_each_one_token_job(&k, &m, |_, _| listed += 1);
        // The same logits, placed or not; a token's products run as the jobs listed (one
        // hand-off each), beside each layer's attention and the output projection.
        let opts = super::RunOptions { n_ctx: 64, n_batch: 64, n_outputs: 1, threads: 2, reference: false, force_ctx: false };
        let run = |o: &super::Opened| -> Vec<Vec<u32>> {
            let g = o.gguf().unwrap();
            let mut l = super::prepare(&g, &o.path, &opts).unwrap();
            let (mut e, pool) = super::engine(&g, &o.path, &mut l, false, keel_core::sampler::SamplerConfig::default()).unwrap();
            let mut out = Vec::new();
            let mut tok = vec![1u32, 504, 3458, 282, 4649, 314];
            for step in 0..5 {
                let j0 = pool.jobs();
                let logits = e.eval(&tok, Outputs::Last, pool).unwrap();
                if step > 0 {
                    assert_eq!(pool.jobs().wrapping_sub(j0), listed + 30 + 1, "one token's hand-offs against the jobs listed for placement ({listed})");
                }
                out.push(logits.iter().map(|v| v.to_bits()).collect::<Vec<u32>>());
                let best = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap();
                tok = vec![best as u32];
            }
            out
        };
        assert!(run(&one) == run(&two), "placed for two threads, the logits changed");
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

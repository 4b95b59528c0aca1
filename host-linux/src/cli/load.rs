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
}

/// Resolves `-m` (a path or a known model name, pulled on first use) and maps it: for
/// the commands that read the file's header or pass over it once (`info`, `plan`,
/// `tokenize`, `quantize`).
pub fn open(model: &str) -> Result<Opened> {
    let path = crate::pull::resolve_model(model)?;
    let file = ModelFile::open(&path)?;
    Ok(Opened { path, file, rows16: Vec::new() })
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
    Ok(Opened { path, file, rows16: Vec::new() })
}

/// Whether a file of `size` bytes may be read into memory when `available` bytes are
/// available (`None`: not known, so yes).
fn fits_in_memory(size: u64, available: Option<u64>) -> bool {
    available.is_none_or(|a| size <= a)
}

/// [`open_to_run`] for a model that runs on the CPU only, with the kernels of
/// `reference`: its matrices that have rows16 kernels there are packed for them
/// ([`Opened::pack_for_cpu`]).
pub fn open_for_cpu(model: &str, reference: bool) -> Result<Opened> {
    let mut o = open_to_run(model)?;
    o.pack_for_cpu(&kernels(reference))?;
    Ok(o)
}

impl Opened {
    /// Parses the GGUF header; errors name the file. The matrices
    /// [`Opened::pack_for_cpu`] rearranged are marked so (their tensors' layout).
    pub fn gguf(&self) -> Result<Gguf<'_>> {
        Gguf::parse(self.file.bytes()).map(|g| g.with_rows16(&self.rows16)).map_err(|e| anyhow::anyhow!("{}: {e}", self.path.display()))
    }

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

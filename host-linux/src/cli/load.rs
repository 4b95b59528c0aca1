//! Opening a model for a subcommand: resolve the name, map the file, parse it, plan and
//! allocate the arena once, build the engine and the thread pool.

use crate::mmap::{Arena, ModelFile};
use crate::pool::ThreadPool;
use anyhow::{Context, Result};
use keel_core::engine::{plan, Engine};
use keel_core::gguf::Gguf;
use keel_core::quant::Kernels;
use keel_core::sampler::SamplerConfig;
use keel_core::session::SessionConfig;
use std::path::PathBuf;

/// The model file, mapped.
pub struct Opened {
    /// Where it is.
    pub path: PathBuf,
    /// Its bytes.
    pub file: ModelFile,
}

/// Resolves `-m` (a path or a known model name, pulled on first use) and maps it.
pub fn open(model: &str) -> Result<Opened> {
    let path = crate::pull::resolve_model(model)?;
    let file = ModelFile::open(&path)?;
    Ok(Opened { path, file })
}

impl Opened {
    /// Parses the GGUF header; errors name the file.
    pub fn gguf(&self) -> Result<Gguf<'_>> {
        Gguf::parse(self.file.bytes()).map_err(|e| anyhow::anyhow!("{}: {e}", self.path.display()))
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
}

/// The kernels for `opts` on this CPU.
pub fn kernels(reference: bool) -> Kernels {
    if reference {
        Kernels::reference()
    } else {
        Kernels::new(crate::isa::detect())
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
}

/// Plans and allocates the arena and starts the pool.
pub fn prepare(g: &Gguf<'_>, path: &std::path::Path, opts: &RunOptions) -> Result<Loaded> {
    let cfg = SessionConfig { n_ctx: opts.n_ctx, n_batch: opts.n_batch.min(opts.n_ctx), n_outputs: opts.n_outputs, n_threads: opts.threads };
    let plan = plan(g, &cfg).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let arena = Arena::new(plan.total_bytes()).with_context(|| format!("allocating the {} byte arena", plan.total_bytes()))?;
    let pool = ThreadPool::new(opts.threads).context("starting the thread pool")?;
    Ok(Loaded { arena, pool, cfg })
}

/// Builds the engine inside a prepared arena.
pub fn engine<'a>(g: &Gguf<'a>, path: &std::path::Path, loaded: &'a mut Loaded, reference: bool, sampling: SamplerConfig) -> Result<(Engine<'a>, &'a ThreadPool)> {
    let Loaded { arena, pool, cfg } = loaded;
    let e = Engine::new(g, arena.as_mut_slice(), *cfg, kernels(reference), sampling).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok((e, pool))
}

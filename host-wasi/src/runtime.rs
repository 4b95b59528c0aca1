//! The wasmtime embedding: one engine configured for determinism, the guest module
//! (checked to import nothing), and a store per model with fixed limits and fuel.
//!
//! Determinism settings (see the README's host-wasi section):
//! - `cranelift_nan_canonicalization(true)`: every float operation that can produce a
//!   NaN produces the canonical one, so NaN bits never depend on the host CPU;
//! - relaxed SIMD off (and its deterministic lowering on, should a module use it);
//! - threads off: wasmtime is built without its `threads` feature, so shared memories
//!   and atomics-based threading do not validate; the guest is single-threaded;
//! - no imports at all: a module that imports anything (a clock, randomness, WASI) is
//!   refused before it is instantiated;
//! - fixed memory limits (`StoreLimits`: one instance, one memory of at most
//!   `max_memory` bytes, growth past it fails inside the guest) and fuel metering: a run
//!   that uses up its fuel stops with an error, never with a partial result.

use anyhow::{anyhow, bail, Context, Result};
use std::io::Read;
use std::path::Path;
use wasmtime::{Config, Engine, Instance, Memory, Module, OptLevel, Store, StoreLimits, StoreLimitsBuilder, Trap, TypedFunc};

/// The guest built by `build.rs`.
pub const GUEST_WASM: &[u8] = include_bytes!(env!("KEEL_GUEST_WASM"));

/// The ABI version this host speaks (the guest's `keel_abi_version`).
const ABI_VERSION: u32 = 1;

/// Limits of one store.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most bytes of linear memory the guest may have (wasm32: at most 4 GiB).
    pub max_memory: usize,
    /// Fuel given to each `run` (wasmtime's unit: about one per wasm operator).
    pub fuel: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_memory: 2 << 30, fuel: DEFAULT_FUEL }
    }
}

/// Default fuel per run: far more than 6 SmolLM2-135M prompts x 32 tokens need (each
/// about 10^11), small enough that a runaway guest stops in minutes.
pub const DEFAULT_FUEL: u64 = 10_000_000_000_000;

/// The engine and the compiled guest.
pub struct Guest {
    engine: Engine,
    module: Module,
}

/// The engine configuration: see the module doc.
pub fn config() -> Config {
    let mut c = Config::new();
    c.cranelift_opt_level(OptLevel::Speed)
        .cranelift_nan_canonicalization(true)
        .wasm_relaxed_simd(false)
        .relaxed_simd_deterministic(true)
        .wasm_shared_everything_threads(false)
        .consume_fuel(true);
    c
}

impl Guest {
    /// Compiles the embedded guest.
    pub fn embedded() -> Result<Guest> {
        Guest::from_wasm(GUEST_WASM)
    }

    /// Compiles a guest module, refusing one that imports anything.
    pub fn from_wasm(wasm: &[u8]) -> Result<Guest> {
        let engine = Engine::new(&config()).map_err(|e| anyhow!("configuring wasmtime: {e}"))?;
        let module = Module::new(&engine, wasm).map_err(|e| anyhow!("compiling the guest: {e}"))?;
        if let Some(i) = module.imports().next() {
            bail!("the guest imports {}::{}; a reference guest must import nothing", i.module(), i.name());
        }
        Ok(Guest { engine, module })
    }

    /// The names the module imports (empty for a good guest).
    pub fn imports(&self) -> Vec<String> {
        self.module.imports().map(|i| format!("{}::{}", i.module(), i.name())).collect()
    }

    /// Instantiates the guest and loads the model file at `path` into it (read straight
    /// into guest memory: the only copy), with an `n_ctx` token context.
    pub fn load(&self, path: &Path, n_ctx: u32, limits: Limits) -> Result<Loaded> {
        let mut file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let len = file.metadata().with_context(|| format!("reading {}", path.display()))?.len();
        let len32 = u32::try_from(len).map_err(|_| anyhow!("{}: {len} bytes do not fit in a wasm32 guest", path.display()))?;
        let mut g = Loaded::instantiate(self, limits)?;
        let r = g.alloc.call(&mut g.store, len32);
        let ptr = g.check(r)?;
        if ptr == 0 {
            bail!("{}: the {len} byte model does not fit in the {} byte memory limit", path.display(), limits.max_memory);
        }
        let dst = &mut g.memory.data_mut(&mut g.store)[ptr as usize..ptr as usize + len as usize];
        file.read_exact(dst).with_context(|| format!("reading {}", path.display()))?;
        let r = g.load.call(&mut g.store, (ptr, len32, n_ctx, n_ctx.min(512)));
        let status = g.check(r)?;
        if status != 0 {
            bail!("{}: {}", path.display(), g.error());
        }
        Ok(g)
    }
}

/// A guest instance with a model loaded.
pub struct Loaded {
    store: Store<StoreLimits>,
    memory: Memory,
    limits: Limits,
    alloc: TypedFunc<u32, u32>,
    load: TypedFunc<(u32, u32, u32, u32), i32>,
    input: TypedFunc<u32, u32>,
    run: TypedFunc<(u32, u32), i32>,
    result_ptr: TypedFunc<(), u32>,
    result_len: TypedFunc<(), u32>,
    error_ptr: TypedFunc<(), u32>,
    error_len: TypedFunc<(), u32>,
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// `n_predict` tokens were generated.
    Length,
    /// The model chose an end-of-generation token (not included in `generated`).
    EndOfGeneration,
    /// The context filled up.
    ContextFull,
}

impl Stop {
    /// The name `keel run --json` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Stop::Length => "length",
            Stop::EndOfGeneration => "end of generation",
            Stop::ContextFull => "context full",
        }
    }
}

/// What one guest run produced.
#[derive(Clone, Debug)]
pub struct RunOutput {
    /// Prompt token ids.
    pub tokens: Vec<u32>,
    /// Generated token ids.
    pub generated: Vec<u32>,
    /// SHA-256 of every logits row a token was chosen from, concatenated in order.
    pub logits_sha256: [u8; 32],
    /// SHA-256 of each of those rows alone.
    pub row_sha256: Vec<[u8; 32]>,
    /// The generated text (pieces joined; invalid UTF-8 replaced).
    pub text: String,
    /// Why generation stopped.
    pub stop: Stop,
    /// Fuel the run used.
    pub fuel_used: u64,
}

impl Loaded {
    fn instantiate(guest: &Guest, limits: Limits) -> Result<Loaded> {
        let store_limits = StoreLimitsBuilder::new().memory_size(limits.max_memory).instances(1).memories(1).tables(1).build();
        let mut store = Store::new(&guest.engine, store_limits);
        store.limiter(|l| l);
        store.set_fuel(limits.fuel)?;
        let instance = Instance::new(&mut store, &guest.module, &[]).map_err(|e| anyhow!("instantiating the guest: {e}"))?;
        let memory = instance.get_memory(&mut store, "memory").ok_or_else(|| anyhow!("the guest exports no memory"))?;
        macro_rules! f {
            ($name:literal) => {
                instance.get_typed_func(&mut store, $name).map_err(|e| anyhow!("guest export {}: {e}", $name))?
            };
        }
        let version: TypedFunc<(), u32> = f!("keel_abi_version");
        let v = version.call(&mut store, ())?;
        if v != ABI_VERSION {
            bail!("the guest speaks ABI {v}, this host {ABI_VERSION}");
        }
        Ok(Loaded {
            alloc: f!("keel_alloc"),
            load: f!("keel_load"),
            input: f!("keel_input"),
            run: f!("keel_run"),
            result_ptr: f!("keel_result_ptr"),
            result_len: f!("keel_result_len"),
            error_ptr: f!("keel_error_ptr"),
            error_len: f!("keel_error_len"),
            store,
            memory,
            limits,
        })
    }

    /// A guest call's result; a trap becomes an error carrying the guest's message.
    fn check<T>(&mut self, r: wasmtime::Result<T>) -> Result<T> {
        r.map_err(|e| {
            if let Some(Trap::OutOfFuel) = e.downcast_ref::<Trap>() {
                return anyhow!("the guest ran out of fuel (limit {}); raise --fuel", self.limits.fuel);
            }
            match self.error() {
                msg if msg.is_empty() => anyhow!("the guest trapped: {e:?}"),
                msg => anyhow!("the guest trapped: {msg}"),
            }
        })
    }

    /// The guest's last error message.
    fn error(&mut self) -> String {
        // A trap may have left no fuel for the two calls below (the next run refills it).
        let _ = self.store.set_fuel(1_000_000);
        let (Ok(p), Ok(n)) = (self.error_ptr.call(&mut self.store, ()), self.error_len.call(&mut self.store, ())) else {
            return String::new();
        };
        let data = self.memory.data(&self.store);
        data.get(p as usize..p as usize + n as usize).map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default()
    }

    /// Tokenizes `prompt`, evaluates it from an empty context and generates up to
    /// `n_predict` tokens greedily, with `self.limits.fuel` fuel (refilled per run).
    pub fn run(&mut self, prompt: &str, n_predict: u32) -> Result<RunOutput> {
        self.store.set_fuel(self.limits.fuel)?;
        let len = u32::try_from(prompt.len()).map_err(|_| anyhow!("the prompt is too long"))?;
        let r = self.input.call(&mut self.store, len);
        let p = self.check(r)?;
        if p == 0 {
            bail!("the prompt does not fit in the memory limit");
        }
        self.memory.data_mut(&mut self.store)[p as usize..(p + len) as usize].copy_from_slice(prompt.as_bytes());
        let r = self.run.call(&mut self.store, (len, n_predict));
        let status = self.check(r)?;
        if status != 0 {
            bail!("{}", self.error());
        }
        let fuel_used = self.limits.fuel - self.store.get_fuel()?;
        // The two accessor calls below are not part of the run's budget.
        self.store.set_fuel(1_000_000)?;
        let rp = self.result_ptr.call(&mut self.store, ())? as usize;
        let rn = self.result_len.call(&mut self.store, ())? as usize;
        let rec = self.memory.data(&self.store).get(rp..rp + rn).ok_or_else(|| anyhow!("the guest's result record is out of bounds"))?;
        let mut out = parse_record(rec)?;
        out.fuel_used = fuel_used;
        Ok(out)
    }

    /// Sets the fuel each later `run` gets.
    pub fn set_fuel(&mut self, fuel: u64) {
        self.limits.fuel = fuel;
    }
}

/// Parses a result record (layout in the guest's crate doc).
fn parse_record(rec: &[u8]) -> Result<RunOutput> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8]> {
        let b = rec.get(at..at + n).ok_or_else(|| anyhow!("the guest's result record is truncated"))?;
        at += n;
        Ok(b)
    };
    let word = |b: &[u8], i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
    let h = take(24)?;
    let (version, stop, n_prompt, n_gen, n_rows, n_text) = (word(h, 0), word(h, 1), word(h, 2) as usize, word(h, 3) as usize, word(h, 4) as usize, word(h, 5) as usize);
    if version != 1 {
        bail!("the guest's result record has version {version}, expected 1");
    }
    let ids = |b: &[u8]| b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<u32>>();
    let tokens = ids(take(4 * n_prompt)?);
    let generated = ids(take(4 * n_gen)?);
    let logits_sha256: [u8; 32] = take(32)?.try_into().expect("32 bytes");
    let row_sha256 = take(32 * n_rows)?.chunks_exact(32).map(|c| c.try_into().expect("32 bytes")).collect();
    let text = String::from_utf8_lossy(take(n_text)?).into_owned();
    let stop = match stop {
        0 => Stop::Length,
        1 => Stop::EndOfGeneration,
        2 => Stop::ContextFull,
        s => bail!("the guest's result record has stop code {s}"),
    };
    Ok(RunOutput { tokens, generated, logits_sha256, row_sha256, text, stop, fuel_used: 0 })
}

/// Lowercase hex of a digest.
pub fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

//! The per-session DSP address budget, measured at open rather than taken from the skel.
//!
//! The DSP is 32-bit and a session's mappings share its ~3 GiB of virtual address space
//! with the skel, the queue and whatever else the PD holds, so how much of a model the
//! session can map is measured: rpcmem buffers are allocated and `fastrpc_mmap`ed
//! (`FASTRPC_MAP_FD`, as a model's buffers are) in doubling chunks from 16 MiB until a
//! mapping is refused or the cap is reached, then in halving chunks down to
//! [`GRANULE`], keeping every mapping that succeeds; the sum mapped is the budget (within
//! one granule below the true figure). At most [`MAX_STEPS`] buffers, so the open stays
//! quick. Everything is unmapped and freed before the probe returns, on every path
//! ([`super::RpcBuf`] is RAII). The buffers' pages are never touched.
//!
//! The library says "the DSP cannot map more" with `AEE_EFAILED` (it reports a refused
//! MEM_MAP ioctl so) or `AEE_ENOMEMORY`; any other code ends the open with the step and
//! code. An rpcmem allocation refused (host memory, not DSP address space) stops the
//! probe: the figure is then a lower bound, and the probe says so.
//!
//! Cost on a board: the system dma-buf heap commits pages when it allocates, so while
//! probing the process briefly holds up to the cap in dma-buf memory. `KEEL_FASTRPC_PROBE_CAP`
//! (bytes) sets the cap (default: the figure the skel reports); the budget is then at most that.

/// First chunk tried.
pub const FIRST_CHUNK: u64 = 16 << 20;
/// Smallest chunk tried: the measured budget is within this of the session's.
pub const GRANULE: u64 = 1 << 20;
/// Most mappings one probe makes (a 3 GiB cap needs about 20).
pub const MAX_STEPS: usize = 32;

/// What one attempt to map `size` more bytes gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Mapped (and kept until the probe ends).
    Mapped,
    /// The DSP refused the mapping (the library's code): no room for this size.
    Refused(i32),
    /// rpcmem could not allocate it: stop, the figure is a lower bound.
    NoHostMemory,
}

/// What stopped the probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Limit {
    /// The DSP refused mappings: the figure is the session's budget (within [`GRANULE`]).
    #[default]
    Dsp,
    /// Everything up to the cap mapped: the session holds at least the cap.
    Cap,
    /// rpcmem refused an allocation: at least this much.
    HostMemory,
    /// [`MAX_STEPS`] mappings made before the DSP refused one: at least this much.
    Steps,
}

/// A finished probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Probe {
    /// Bytes mapped at once: the budget used.
    pub measured: u64,
    /// The most the probe would map.
    pub cap: u64,
    /// fastrpc_mmap calls made (refused ones included).
    pub calls: u32,
    /// What ended it.
    pub limit: Limit,
    /// The code of the last refused mapping.
    pub refused_code: Option<i32>,
}

impl Probe {
    /// How `keel probe` says where the figure comes from.
    pub fn describe(&self) -> String {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        match self.limit {
            Limit::Dsp => format!("measured: the DSP refused further fastrpc_mmap past it, within {} MiB; {} calls", GRANULE >> 20, self.calls),
            Limit::Cap => format!("measured: every mapping up to the probe's cap of {:.0} MiB succeeded, so at least this; {} calls", mib(self.cap), self.calls),
            Limit::HostMemory => format!("measured, lower bound: rpcmem_alloc refused more host memory before the DSP refused a mapping; {} calls", self.calls),
            Limit::Steps => format!("measured, lower bound: the probe stopped after {} mappings", self.calls),
        }
    }
}

/// Runs the probe with `try_map(size)` mapping `size` more bytes (kept until the caller
/// releases them after this returns); `Err` from `try_map` ends it at once.
pub fn run<E>(cap: u64, mut try_map: impl FnMut(u64) -> Result<Step, E>) -> Result<Probe, E> {
    let cap = cap / GRANULE * GRANULE;
    let mut p = Probe { measured: 0, cap, calls: 0, limit: Limit::Cap, refused_code: None };
    let mut chunk = FIRST_CHUNK;
    let mut growing = true;
    loop {
        let size = if growing { chunk.min(cap - p.measured) } else { chunk };
        if size == 0 {
            break;
        }
        if p.calls as usize == MAX_STEPS {
            p.limit = Limit::Steps;
            break;
        }
        p.calls += 1;
        match try_map(size)? {
            Step::Mapped => {
                p.measured += size;
                if growing {
                    chunk = chunk.saturating_mul(2);
                    continue;
                }
            }
            Step::Refused(code) => {
                p.limit = Limit::Dsp;
                p.refused_code = Some(code);
                if growing {
                    growing = false;
                    chunk = size;
                }
            }
            Step::NoHostMemory => {
                p.limit = Limit::HostMemory;
                break;
            }
        }
        // Refining: what is left is below `chunk`; halve it (granule-rounded) to the granule.
        if chunk <= GRANULE {
            break;
        }
        chunk = (chunk / 2).div_ceil(GRANULE) * GRANULE;
    }
    Ok(p)
}

//! Speculative decoding for `keel run`: the flags (`--draft-model`, `--draft-max`,
//! `--draft-fixed`, `--device-draft`, `--lookup`), the generation loop over keel-core's
//! [`Speculator`], and the statistics it reports.

use super::args::Args;
use super::offload::OffloadOptions;
use crate::json;
use anyhow::{bail, Result};
use keel_core::speculative::{Drafter, Lm, SpecConfig, Speculator, Stats};

/// Most tokens drafted per step that `--draft-max` / `--lookup` take.
pub const MAX_DRAFT: usize = 64;

/// The parsed speculation flags.
pub struct SpecOptions {
    /// `--draft-model`: the draft model (`None`: prompt lookup).
    pub draft_model: Option<String>,
    /// Most tokens drafted per step.
    pub n_max: usize,
    /// `--draft-fixed`: always draft `n_max` tokens (no adaptive length).
    pub fixed: bool,
    /// `--device-draft`: where the draft model runs.
    pub draft_devices: OffloadOptions,
}

impl SpecOptions {
    /// Reads the flags; `None` when neither `--draft-model` nor `--lookup` is given.
    pub fn parse(a: &mut Args) -> Result<Option<SpecOptions>> {
        let draft_model: Option<String> = a.value(&["--draft-model", "-md", "--model-draft"], "a draft model file or name")?;
        let draft_max: Option<usize> = a.value(&["--draft-max", "--draft"], "a token count")?;
        let lookup: Option<usize> = a.value(&["--lookup"], "most tokens drafted per step by prompt lookup")?;
        let fixed = a.flag(&["--draft-fixed"]);
        let list: Option<String> = a.value(&["--device-draft", "-devd"], "a device list for the draft model, e.g. hexagon-sim")?;
        let n_max = match (&draft_model, lookup) {
            (Some(_), Some(_)) => bail!("--draft-model and --lookup are two ways of drafting; give one"),
            (Some(_), None) => draft_max.unwrap_or(8),
            (None, Some(n)) => {
                if draft_max.is_some() {
                    bail!("--draft-max is for --draft-model; with --lookup the value of --lookup is the most tokens drafted");
                }
                n
            }
            (None, None) => {
                for (given, flag) in [(draft_max.is_some(), "--draft-max"), (fixed, "--draft-fixed"), (list.is_some(), "--device-draft")] {
                    if given {
                        bail!("{flag} needs --draft-model M (or --lookup N)");
                    }
                }
                return Ok(None);
            }
        };
        if n_max == 0 || n_max > MAX_DRAFT {
            bail!("{} {n_max}: draft 1..={MAX_DRAFT} tokens per step", if draft_model.is_some() { "--draft-max" } else { "--lookup" });
        }
        if list.is_some() && draft_model.is_none() {
            bail!("--device-draft places the draft model; give --draft-model M");
        }
        let devices = crate::device::offload::parse_device_list(list.as_deref().unwrap_or("cpu")).map_err(|e| anyhow::anyhow!("--device-draft: {e}"))?;
        let policy = keel_core::placement::Policy::all(devices.len());
        Ok(Some(SpecOptions { draft_model, n_max, fixed, draft_devices: OffloadOptions { devices, policy } }))
    }

    /// The core's settings; `draft_cost` is the draft's weight bytes over the target's.
    pub fn config(&self, draft_cost: f32) -> SpecConfig {
        SpecConfig { n_max: self.n_max, adaptive: !self.fixed, draft_cost, ..SpecConfig::default() }
    }

    /// `draft <file>` or `lookup`.
    pub fn name(&self) -> String {
        match &self.draft_model {
            Some(m) => format!("draft model {m}"),
            None => "prompt lookup".into(),
        }
    }
}

/// Generates up to `n_predict` tokens after `prompt`; `emit` gets each one and returns
/// false to stop (end of generation). Returns why generation stopped.
pub fn generate(sp: &mut Speculator<'_>, target: &mut dyn Lm, drafter: &mut dyn Drafter, prompt: &[u32], n_predict: usize, mut emit: impl FnMut(u32) -> bool) -> Result<&'static str, keel_core::Error> {
    sp.start(target, drafter, prompt)?;
    let mut n = 0;
    while n < n_predict {
        if !sp.can_step(target) {
            return Ok("context full");
        }
        let before = sp.stats();
        let toks = sp.step(target, drafter)?.to_vec();
        if std::env::var_os("KEEL_SPEC_DEBUG").is_some() {
            let a = sp.stats();
            eprintln!("step: drafted {} accepted {} -> {:?}", a.drafted - before.drafted, a.accepted - before.accepted, toks);
        }
        for &t in &toks {
            if n == n_predict {
                break;
            }
            if !emit(t) {
                return Ok("end of generation");
            }
            n += 1;
        }
    }
    Ok("length")
}

/// The statistics line (stderr) and `--json` object.
pub fn report(stats: &Stats, what: &str, tps: f64, o: Option<&mut json::Object>) {
    match o {
        Some(o) => {
            o.obj("speculative", |s| {
                s.str("drafter", what).u64("steps", stats.steps).u64("drafted", stats.drafted).u64("accepted", stats.accepted);
                s.f64("acceptance_rate", stats.acceptance()).f64("mean_accepted_length", stats.mean_accepted()).f64("tokens_per_second", tps);
            });
        }
        None => eprintln!(
            "keel: speculative ({what}): drafted {}, accepted {} ({:.1}%), mean accepted length {:.2} in {} verify steps, {:.1} t/s",
            stats.drafted,
            stats.accepted,
            100.0 * stats.acceptance(),
            stats.mean_accepted(),
            stats.draft_steps,
            tps
        ),
    }
}

//! `keel probe --device hexagon`: what a board's DSP is and whether it computes. Opens a
//! session as a run does (the capability queries, the unsigned PD, the queue, the
//! firmware's measured limits, the known-input self-test, the address-budget probe) and
//! prints the arch, HVX contexts, HMX, VTCM, the measured address budget and the self-test. On a machine without a DSP
//! (no library, no device node, no permission) it says what is missing and what to do,
//! and exits with code 2, so scripts can tell "no DSP here" from "the DSP failed" (1).

use std::fmt::Write as _;

use keel_npu_hal::{Arch, Device, ErrorKind};

use super::{api, FastRpcConfig, Hexagon};

/// Exit code for "there is no usable DSP on this machine".
pub const NO_DSP: i32 = 2;

/// What is missing, or `None` when the library loads and a session could be tried.
pub fn missing() -> Option<String> {
    match api::Api::load() {
        Err(e) => {
            let mut m = e.to_string();
            if let Some(n) = api::node_problem() {
                let _ = write!(m, "; also: {n}");
            }
            Some(m)
        }
        Ok(_) => None,
    }
}

fn bail_no_dsp(what: &str) -> ! {
    eprintln!("keel probe --device hexagon: no usable Hexagon DSP: {what}");
    std::process::exit(NO_DSP)
}

/// Runs the probe; exits with [`NO_DSP`] when there is no DSP to talk to.
pub fn run(as_json: bool) -> anyhow::Result<()> {
    if let Some(m) = missing() {
        bail_no_dsp(&m);
    }
    let dev = match Hexagon::open(&FastRpcConfig::from_env()) {
        Ok(d) => d,
        // No DSP answered: the nodes are absent or closed to this user.
        Err(e) if e.kind == ErrorKind::DeviceLost => bail_no_dsp(&e.to_string()),
        Err(e) => return Err(e.into()),
    };
    let (id, c, st, info, bp) = (dev.identity(), dev.caps(), dev.self_test(), dev.dsp_info(), dev.budget_probe());
    let arch = match id.arch {
        Arch::Hexagon { version } => format!("v{version}"),
        other => format!("{other:?}"),
    };
    if as_json {
        #[derive(serde::Serialize)]
        struct SelfTest {
            passed: bool,
            seed: u64,
            digest: u64,
            expected: u64,
        }
        #[derive(serde::Serialize)]
        struct Budget {
            cap: u64,
            calls: u32,
            limit: String,
            detail: String,
        }
        #[derive(serde::Serialize)]
        struct Probe<'a> {
            device: &'a str,
            name: &'a str,
            arch: &'a str,
            emulated: bool,
            hvx_contexts: u64,
            hvx_threads: u64,
            hmx: String,
            vtcm_bytes: u64,
            scratch_bytes: u64,
            va_budget: u64,
            va_budget_source: &'static str,
            va_budget_probe: Budget,
            self_test: SelfTest,
            notes: &'a [String],
        }
        crate::cli::print_json(&Probe {
            device: "hexagon",
            name: dev.name(),
            arch: &arch,
            emulated: id.emulated,
            hvx_contexts: info.hvx_contexts.map_or(c.units.hvx_contexts.into(), u64::from),
            hvx_threads: c.units.hvx_contexts.into(),
            hmx: format!("{:?}", c.units.hmx).to_lowercase(),
            vtcm_bytes: info.vtcm_bytes.unwrap_or(c.memory.scratch_bytes.into()),
            scratch_bytes: c.memory.scratch_bytes.into(),
            va_budget: c.memory.va_budget,
            va_budget_source: "measured",
            va_budget_probe: Budget { cap: bp.cap, calls: bp.calls, limit: format!("{:?}", bp.limit).to_lowercase(), detail: bp.describe() },
            self_test: SelfTest { passed: st.passed(), seed: st.seed.into(), digest: st.digest.into(), expected: st.expected.into() },
            notes: &info.notes,
        });
        return Ok(());
    }
    println!("device     {}", dev.name());
    println!("arch       Hexagon {arch}{}", if id.emulated { " (emulated: numbers are real, timings are not)" } else { "" });
    let contexts = info.hvx_contexts.map_or(c.units.hvx_contexts.into(), u64::from);
    println!("units      {contexts} HVX context(s), the skel runs the products on {} thread(s); HVX {:?}, HMX {:?}", c.units.hvx_contexts, c.units.hvx, c.units.hmx);
    let vtcm = info.vtcm_bytes.unwrap_or(c.memory.scratch_bytes.into());
    println!(
        "memory     VTCM {} KiB (the skel's scratch: {} KiB, probed free at start), DSP address budget {} MiB ({})",
        vtcm >> 10,
        c.memory.scratch_bytes >> 10,
        c.memory.va_budget >> 20,
        bp.describe()
    );
    println!(
        "self-test  {}: seed {:#010x} digest {:#010x} (expected {:#010x})",
        if st.passed() { "passed" } else { "FAILED" },
        st.seed,
        st.digest,
        st.expected
    );
    for n in &info.notes {
        println!("note       {n}");
    }
    Ok(())
}

//! `keel probe --device D [--json]`: opens a device the way a run would
//! (handshake, measured capabilities, known-input self-test) and prints its
//! identity, units, memory, ops and the self-test result. A device that fails
//! its self-test is refused, and the error says which check failed.

use super::args::Args;
use crate::device::{HexagonSim, SimConfig, KNOWN};
use crate::json;
use anyhow::{bail, Result};
use keel_npu_hal::caps::{Arch, Caps, Identity};
use keel_npu_hal::op::DType;
use keel_npu_hal::{Device, UnitState};

const OPS: [&str; 14] = ["mat_mul", "get_rows", "rms_norm", "rope", "attention", "softmax", "silu", "gelu", "swiglu", "mul", "add", "geglu", "quantize", "copy"];
const TYPES: [(DType, &str); 6] = [(DType::F32, "f32"), (DType::F16, "f16"), (DType::Q4_0, "q4_0"), (DType::Q8_0, "q8_0"), (DType::IQ4NL, "iq4_nl"), (DType::I32, "i32")];

fn unit(s: UnitState) -> &'static str {
    match s {
        UnitState::Absent => "absent",
        UnitState::Present => "present (not tested)",
        UnitState::Verified => "verified",
        UnitState::Failed => "FAILED its self-test",
    }
}

fn arch(id: &Identity) -> (String, Option<u8>) {
    match id.arch {
        Arch::Hexagon { version } => ("hexagon".into(), Some(version)),
        Arch::Rk3588 => ("rk3588".into(), None),
        Arch::Software => ("software".into(), None),
        _ => ("unknown".into(), None),
    }
}

fn version(v: u32) -> String {
    format!("{}.{}.{}", v >> 16, (v >> 8) & 0xff, v & 0xff)
}

fn ops(c: &Caps) -> Vec<&'static str> {
    OPS.iter().enumerate().filter(|(i, _)| c.ops.0 & (1 << i) != 0).map(|(_, n)| *n).collect()
}

fn weights(c: &Caps) -> Vec<&'static str> {
    TYPES.iter().filter(|(t, _)| c.matmul_weights.contains(*t)).map(|(_, n)| *n).collect()
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// `keel probe`.
pub fn main(mut a: Args) -> Result<()> {
    let as_json = a.flag(&["--json"]);
    let device: Option<String> = a.value(&["--device", "-d"], "a device name")?;
    a.finish()?;
    let Some(device) = device else { bail!("keel probe --device NAME; known: {}", KNOWN.join(", ")) };
    if device == "hexagon" {
        return crate::device::fastrpc::probe::run(as_json);
    }
    if device != "hexagon-sim" {
        bail!("unknown device '{device}'; known: {}", KNOWN.join(", "));
    }
    let dev = HexagonSim::open(&SimConfig::from_env())?;
    let (id, c, st) = (dev.identity(), dev.caps(), dev.self_test());
    let (arch_name, arch_ver) = arch(id);
    let m = &c.memory;
    if as_json {
        let mut o = json::Object::new();
        o.str("device", &device).str("name", dev.name());
        o.obj("identity", |j| {
            j.str("arch", &arch_name);
            match arch_ver {
                Some(v) => j.u64("arch_version", v.into()),
                None => j.null("arch_version"),
            };
            j.str("firmware_version", &version(id.firmware_version)).u64("protocol_version", id.protocol_version.into()).bool("emulated", id.emulated);
        });
        o.obj("units", |u| {
            u.str("hvx", unit(c.units.hvx)).u64("hvx_contexts", c.units.hvx_contexts.into()).str("hmx", unit(c.units.hmx));
            u.str("npu", unit(c.units.npu)).u64("npu_cores", c.units.npu_cores.into());
        });
        o.obj("memory", |j| {
            j.u64("scratch_bytes", m.scratch_bytes.into()).u64("va_budget", m.va_budget);
            j.u64("buffer_align", m.buffers.align.into()).u64("buffer_granule", m.buffers.granule.into()).u64("buffer_max", m.buffers.max_size);
        });
        o.arr("ops", |j| {
            for n in ops(c) {
                j.str(n);
            }
        });
        o.arr("matmul_weights", |j| {
            for n in weights(c) {
                j.str(n);
            }
        });
        o.u64("max_in_flight", c.max_in_flight.into()).u64("max_batch_ops", c.max_batch_ops.into());
        o.obj("self_test", |j| {
            j.bool("passed", st.passed()).str("at_start", unit(st.at_start)).u64("seed", st.seed.into());
            j.u64("digest", st.digest.into()).u64("expected", st.expected.into()).f64("ms", st.elapsed.as_secs_f64() * 1e3);
        });
        o.print();
        return Ok(());
    }
    let ver = arch_ver.map_or(String::new(), |v| format!(" v{v}"));
    let emu = if id.emulated { ", emulated (numbers are real, timings are not)" } else { "" };
    println!("device     {}", dev.name());
    println!("identity   {arch_name}{ver}, firmware {}, protocol {}{emu}", version(id.firmware_version), id.protocol_version);
    println!(
        "units      HVX {} ({} context{}), HMX {}, NPU {}",
        unit(c.units.hvx),
        c.units.hvx_contexts,
        if c.units.hvx_contexts == 1 { "" } else { "s" },
        unit(c.units.hmx),
        unit(c.units.npu)
    );
    println!("memory     scratch (VTCM) {}, shared address budget {} (both reported by the device)", mib(m.scratch_bytes.into()), mib(m.va_budget));
    println!("buffers    align {} B, granule {} B, largest {}", m.buffers.align, m.buffers.granule, mib(m.buffers.max_size));
    println!("ops        {}; matmul weights {} (Tiles32)", ops(c).join(", "), weights(c).join(", "));
    println!("queue      {} batches in flight, {} ops per batch", c.max_in_flight, c.max_batch_ops);
    println!(
        "self-test  {}: firmware start-up check {}; int8 matvec seed {:#010x} digest {:#010x} (expected {:#010x}), {:.1} ms",
        if st.passed() { "passed" } else { "FAILED" },
        unit(st.at_start),
        st.seed,
        st.digest,
        st.expected,
        st.elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}

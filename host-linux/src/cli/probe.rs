//! `keel probe --device D [--json]`: opens a device the way a run would
//! (handshake, measured capabilities, known-input self-test) and prints its
//! identity, units, memory, ops and the self-test result. A device that fails
//! its self-test is refused, and the error says which check failed.

use crate::device::{HexagonSim, SimConfig, KNOWN};
use serde::Serialize;
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
#[derive(clap::Args, Debug)]
pub struct ProbeArgs {
    /// The device to open (known: hexagon-sim, hexagon, rknpu); llama.cpp's -dev is read as --device
    #[arg(short = 'd', long = "device", value_name = "NAME")]
    pub device: Option<String>,
    /// With --device rknpu: print a regcmd stream file with register names (and its decoded task) instead of opening the NPU
    #[arg(long = "dump-regcmd", value_name = "FILE")]
    pub dump_regcmd: Option<String>,
    /// JSON output
    #[arg(long = "json")]
    pub json: bool,
}

/// `keel probe --json`.
#[derive(Serialize)]
struct ProbeJson<'a> {
    device: &'a str,
    name: &'a str,
    identity: IdentityJson,
    units: UnitsJson,
    memory: MemoryJson,
    ops: Vec<&'static str>,
    matmul_weights: Vec<&'static str>,
    max_in_flight: u32,
    max_batch_ops: u32,
    self_test: SelfTestJson,
}

#[derive(Serialize)]
struct IdentityJson {
    arch: String,
    arch_version: Option<u8>,
    firmware_version: String,
    protocol_version: u32,
    emulated: bool,
}

#[derive(Serialize)]
struct UnitsJson {
    hvx: &'static str,
    hvx_contexts: u32,
    hmx: &'static str,
    npu: &'static str,
    npu_cores: u32,
}

#[derive(Serialize)]
struct MemoryJson {
    scratch_bytes: u64,
    va_budget: u64,
    buffer_align: u64,
    buffer_granule: u64,
    buffer_max: u64,
}

#[derive(Serialize)]
struct SelfTestJson {
    passed: bool,
    at_start: &'static str,
    seed: u64,
    digest: u64,
    expected: u64,
    ms: f64,
}

/// `keel probe`.
pub fn main(a: ProbeArgs) -> Result<()> {
    let as_json = a.json;
    let Some(device) = a.device else { bail!("keel probe --device NAME; known: {}, rknpu", KNOWN.join(", ")) };
    if device == "rknpu" {
        return super::rknpu::probe(a.dump_regcmd);
    }
    if device == "hexagon" {
        if a.dump_regcmd.is_some() {
            bail!("--dump-regcmd goes with --device rknpu");
        }
        return crate::device::fastrpc::probe::run(as_json);
    }
    if a.dump_regcmd.is_some() {
        bail!("--dump-regcmd goes with --device rknpu");
    }
    if device != "hexagon-sim" {
        bail!("unknown device '{device}'; known: {}", KNOWN.join(", "));
    }
    let dev = HexagonSim::open(&SimConfig::from_env())?;
    let (id, c, st) = (dev.identity(), dev.caps(), dev.self_test());
    let (arch_name, arch_ver) = arch(id);
    let m = &c.memory;
    if as_json {
        crate::cli::print_json(&ProbeJson {
            device: &device,
            name: dev.name(),
            identity: IdentityJson { arch: arch_name, arch_version: arch_ver, firmware_version: version(id.firmware_version), protocol_version: id.protocol_version.into(), emulated: id.emulated },
            units: UnitsJson { hvx: unit(c.units.hvx), hvx_contexts: c.units.hvx_contexts.into(), hmx: unit(c.units.hmx), npu: unit(c.units.npu), npu_cores: c.units.npu_cores.into() },
            memory: MemoryJson { scratch_bytes: m.scratch_bytes.into(), va_budget: m.va_budget, buffer_align: m.buffers.align.into(), buffer_granule: m.buffers.granule.into(), buffer_max: m.buffers.max_size },
            ops: ops(c),
            matmul_weights: weights(c),
            max_in_flight: c.max_in_flight.into(),
            max_batch_ops: c.max_batch_ops.into(),
            self_test: SelfTestJson { passed: st.passed(), at_start: unit(st.at_start), seed: st.seed.into(), digest: st.digest.into(), expected: st.expected.into(), ms: st.elapsed.as_secs_f64() * 1e3 },
        });
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

//! `keel probe --device hexagon-sim [--json]` as a user runs it: the JSON
//! object's fields, the text form, the refusal of a zero-writing HVX build,
//! and unknown devices. Skips loudly without qemu-hexagon or the firmware
//! (`KEEL_REQUIRE_DSP=1`: fails).

use crate::sim;

use std::process::{Command, Output};

fn keel(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_keel"));
    c.args(args);
    c.envs(env.iter().copied());
    c.output().unwrap()
}

#[test]
fn probe_prints_identity_caps_memory_and_self_test() {
    let Some(cfg) = sim::config("probe_prints_identity_caps_memory_and_self_test") else { return };
    let out = keel(&["probe", "--device", "hexagon-sim", "--json"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["identity"]["arch"], "hexagon");
    assert_eq!(v["identity"]["arch_version"], cfg.cpu[1..].parse::<u64>().unwrap());
    assert_eq!(v["identity"]["emulated"], true);
    assert_eq!(v["units"]["hvx"], "verified");
    assert_eq!(v["memory"]["scratch_bytes"], u64::from(cfg.vtcm_bytes));
    assert_eq!(v["memory"]["va_budget"], cfg.pool_bytes);
    assert_eq!(v["ops"], serde_json::json!(["mat_mul", "get_rows", "rms_norm", "rope", "attention", "softmax", "silu", "gelu", "swiglu", "mul", "add", "geglu", "quantize", "copy"]));
    assert_eq!(v["matmul_weights"], serde_json::json!(["q4_0", "q8_0", "iq4_nl"]));
    assert_eq!(v["self_test"]["passed"], true);
    assert_eq!(v["self_test"]["digest"], v["self_test"]["expected"]);

    let text = keel(&["probe", "--device", "hexagon-sim"], &[]);
    let text = String::from_utf8(text.stdout).unwrap();
    for want in ["identity   hexagon v", "HVX verified", "scratch (VTCM)", "self-test  passed"] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
}

#[test]
fn probe_refuses_zero_writing_hvx_and_unknown_devices() {
    let Some(cfg) = sim::config("probe_refuses_zero_writing_hvx_and_unknown_devices") else { return };
    let broken = keel_host_linux::device::config::default_elf(&format!("{}-broken", cfg.cpu));
    if broken.is_file() {
        let out = keel(&["probe", "--device", "hexagon-sim"], &[("KEEL_DSP_ELF", broken.to_str().unwrap())]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1));
        assert!(err.contains("self-test failed") && err.contains("hexagon-sim"), "{err}");
    }
    let out = keel(&["probe", "--device", "npu9000"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown device 'npu9000'; known: hexagon-sim"));
}

/// A `KEEL_DSP_TIMEOUT_MS` that is not a number of milliseconds is refused before the
/// emulator starts (it was once read as the default): exit 1 naming the variable, its
/// value and the fix. Needs nothing built beyond keel.
#[test]
fn probe_refuses_an_unreadable_dsp_timeout() {
    for bad in ["10s", "0", "-1"] {
        let out = keel(&["probe", "--device", "hexagon-sim"], &[("KEEL_DSP_TIMEOUT_MS", bad)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{bad}: {err}");
        for want in ["KEEL_DSP_TIMEOUT_MS", &format!("{bad:?}"), "milliseconds", "unset it (60000 ms)"] {
            assert!(err.contains(want), "{bad}: `{want}` missing from: {err}");
        }
    }
}

/// The same for `KEEL_DSP_THREADS` (the firmware's hardware threads, 1 to 8), read by the
/// same function as the timeout.
#[test]
fn probe_refuses_an_unreadable_dsp_thread_count() {
    for bad in ["0", "9", "four", "2.5"] {
        let out = keel(&["probe", "--device", "hexagon-sim"], &[("KEEL_DSP_THREADS", bad)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{bad}: {err}");
        for want in ["KEEL_DSP_THREADS", &format!("{bad:?}"), "hardware thread count (1 to 8)", "unset it (4)"] {
            assert!(err.contains(want), "{bad}: `{want}` missing from: {err}");
        }
    }
}

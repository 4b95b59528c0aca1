//! The `hexagon` device (FastRPC through libcdsprpc) end to end, through the test double
//! of the library whose DSP is keel's firmware under qemu-hexagon: the real shim path
//! (dlopen, session control, open, capability queries, rpcmem, fastrpc_mmap, dspqueue).
//! `keel run --device hexagon` on every synthetic model gives the tokens and logits bits
//! of `--device hexagon-sim` and of the CPU; the double's call log shows a valid order
//! and nothing left allocated or mapped at exit.

mod fastrpc;
mod sim;

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `keel run … --json` with `--device device`, the double's log in `log` (for `hexagon`).
fn run(double: &Path, model: &Path, device: &str, log: Option<&Path>) -> serde_json::Value {
    let mut cmd = keel_test_support::keel_command(env!("CARGO_BIN_EXE_keel"));
    cmd.arg("run").arg("-m").arg(model).args(["-p", "Hello world", "-n", "8", "--temp", "0", "--json", "--device", device]);
    cmd.env("KEEL_CDSPRPC", double).env_remove("KEEL_CDSPRPC_FAULT");
    if let Some(l) = log {
        cmd.env("KEEL_CDSPRPC_LOG", l);
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "keel run --device {device} {}: {err}", model.display());
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn keel_run_device_hexagon_equals_hexagon_sim_and_cpu_on_every_synthetic_model() {
    let Some(double) = fastrpc::double("keel_run_device_hexagon_equals_hexagon_sim_and_cpu_on_every_synthetic_model") else { return };
    let dir = root().join("tests/golden/synth");
    let mut models: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "gguf")).collect();
    models.sort();
    assert!(models.len() >= 6, "expected the six synthetic models in {}", dir.display());
    let tmp = std::env::temp_dir().join(format!("keel-fastrpc-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for m in &models {
        let name = m.file_stem().unwrap().to_string_lossy().to_string();
        // Qwen 3.5's file keeps its small beta/alpha projections in F32, which a device
        // converts to Q8_0 at load: every side runs a copy whose matrices are all Q8_0
        // already (`keel quantize`), so all compute with the same weights.
        let requantized;
        let m = if name.contains("qwen35") {
            let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("keel-fastrpc");
            requantized = keel_test_support::requantized(Path::new(env!("CARGO_BIN_EXE_keel")), m, "Q8_0", &out);
            &requantized
        } else {
            m
        };
        let log = tmp.join(format!("{name}.log"));
        let _ = std::fs::remove_file(&log);
        let dsp = run(&double, m, "hexagon", Some(&log));
        let sim = run(&double, m, "hexagon-sim", None);
        let cpu = run(&double, m, "cpu", None);
        assert!(dsp["device_batches"].as_u64().unwrap() > 0, "{name}: nothing ran on the device");
        assert_eq!(dsp["device_forward"], true, "{name}: the whole forward pass runs on the device");
        assert_eq!(dsp["generated"], sim["generated"], "{name}: tokens differ from hexagon-sim");
        assert_eq!(dsp["logits_sha256"], sim["logits_sha256"], "{name}: logits bits differ from hexagon-sim");
        assert_eq!(dsp["generated"], cpu["generated"], "{name}: tokens differ from the CPU");
        assert_eq!(dsp["logits_sha256"], cpu["logits_sha256"], "{name}: logits bits differ from the CPU");
        let s = fastrpc::check_log(&std::fs::read_to_string(&log).unwrap());
        assert_eq!(s.batches as u64, dsp["device_batches"].as_u64().unwrap(), "{name}: every batch went over the dspqueue");
        assert!(s.allocs > 0 && s.maps > 0);
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// No libcdsprpc here: `keel probe --device hexagon` exits 2 naming the library and what to
/// do (this needs nothing built: it must hold on every machine without a DSP). Cargo puts
/// target/release on LD_LIBRARY_PATH, where the double is named libcdsprpc.so: removed.
#[test]
fn probe_without_the_library_exits_2_naming_it() {
    let out = keel_test_support::keel_command(env!("CARGO_BIN_EXE_keel"))
        .args(["probe", "--device", "hexagon"])
        .env_remove("KEEL_CDSPRPC")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for want in ["libcdsprpc.so", "cannot be loaded", "KEEL_CDSPRPC", "/dev/fastrpc-cdsp"] {
        assert!(err.contains(want), "`{want}` missing from: {err}");
    }
    // A path that is not there is named too.
    let out = keel_test_support::keel_command(env!("CARGO_BIN_EXE_keel")).args(["probe", "--device", "hexagon"]).env("KEEL_CDSPRPC", "/nonexistent/libcdsprpc.so").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/libcdsprpc.so"));
}

/// Through the double: the probe reports the arch, HVX, VTCM, the budget and the self-test.
#[test]
fn probe_through_the_double_reports_the_dsp() {
    let Some(double) = fastrpc::double("probe_through_the_double_reports_the_dsp") else { return };
    let out = keel_test_support::keel_command(env!("CARGO_BIN_EXE_keel")).args(["probe", "--device", "hexagon", "--json"]).env("KEEL_CDSPRPC", &double).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cpu = std::env::var("KEEL_QEMU_CPU").unwrap_or_else(|_| "v68".into());
    assert_eq!(v["arch"], cpu.as_str());
    assert!(v["hvx_contexts"].as_u64().unwrap() >= 4);
    assert!(v["va_budget"].as_u64().unwrap() > 0 && v["vtcm_bytes"].as_u64().unwrap() >= 4 << 20);
    assert_eq!(v["self_test"]["passed"], true);
    assert_eq!(v["self_test"]["digest"], v["self_test"]["expected"]);
}

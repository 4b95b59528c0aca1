//! The `hexagon` device (FastRPC through libcdsprpc) end to end, through the test double
//! of the library whose DSP is keel's firmware under qemu-hexagon: the real shim path
//! (dlopen, session control, open, capability queries, rpcmem, fastrpc_mmap, dspqueue).
//! `keel run --device hexagon` on every synthetic model gives the tokens and logits bits
//! of `--device hexagon-sim` and of the CPU; the double's call log shows a valid order
//! and nothing left allocated or mapped at exit. The session's address budget is
//! measured at open against the double's configured one.

use crate::fastrpc;

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

/// Through the double, `--device hexagon --device-in-flight 2` (several batches on the
/// dspqueue at once) gives the bits of one at a time and the CPU's.
#[test]
fn two_batches_in_flight_through_fastrpc_give_the_bits_of_one() {
    let Some(double) = fastrpc::double("two_batches_in_flight_through_fastrpc_give_the_bits_of_one") else { return };
    let m = root().join("tests/golden/synth/synth-llama-q8_0.gguf");
    keel_test_support::check_in_flight_bits(env!("CARGO_BIN_EXE_keel"), &m, "hexagon", &[("KEEL_CDSPRPC", double.as_os_str())]);
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
/// `KEEL_FASTRPC_SESSION` and `KEEL_DSP_TIMEOUT_MS` set to what they cannot mean are
/// refused before a session opens, naming the variable (both were once read as unset).
#[test]
fn probe_refuses_unreadable_fastrpc_variables() {
    let Some(double) = fastrpc::double("probe_refuses_unreadable_fastrpc_variables") else { return };
    for (var, bad, want) in [("KEEL_FASTRPC_SESSION", "second", "a session id (0 to 4294967295)"), ("KEEL_DSP_TIMEOUT_MS", "1.5", "a whole number of milliseconds (1 or more)")] {
        let out = keel_test_support::keel_command(env!("CARGO_BIN_EXE_keel")).args(["probe", "--device", "hexagon"]).env("KEEL_CDSPRPC", &double).env(var, bad).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{var}={bad}: {err}");
        assert!(err.contains(&format!("{var}={bad:?} is not {want}")), "{var}={bad}: {err}");
    }
}

#[test]
fn probe_through_the_double_reports_the_dsp() {
    let Some(double) = fastrpc::double("probe_through_the_double_reports_the_dsp") else { return };
    let out = keel_test_support::keel_command(env!("CARGO_BIN_EXE_keel"))
        .args(["probe", "--device", "hexagon", "--json"])
        .env("KEEL_CDSPRPC", &double)
        .env_remove("KEEL_CDSPRPC_VA_BUDGET")
        .env_remove("KEEL_FASTRPC_PROBE_CAP")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cpu = std::env::var("KEEL_QEMU_CPU").unwrap_or_else(|_| "v68".into());
    assert_eq!(v["arch"], cpu.as_str());
    assert!(v["hvx_contexts"].as_u64().unwrap() >= 4);
    assert!(v["va_budget"].as_u64().unwrap() > 0 && v["vtcm_bytes"].as_u64().unwrap() >= 4 << 20);
    assert_eq!(v["self_test"]["passed"], true);
    assert_eq!(v["self_test"]["digest"], v["self_test"]["expected"]);
    assert_eq!(v["va_budget_source"], "measured");
    // The double's default session (3 GiB, as a v73's) maps everything up to the probe's
    // cap, the skel's 3 GiB: the figure is the cap, said as such.
    assert_eq!((v["va_budget"].as_u64(), &v["va_budget_probe"]["limit"]), (Some(3 << 30), &serde_json::json!("cap")), "{v}");
}

/// `keel probe --device hexagon` with the double's session budget set to `budget`: the
/// JSON, the text and the double's call log.
fn probe_with_budget(double: &Path, budget: u64, log: &Path) -> (serde_json::Value, String) {
    let _ = std::fs::remove_file(log);
    let probe = |json: bool| {
        let mut cmd = keel_test_support::keel_command(env!("CARGO_BIN_EXE_keel"));
        cmd.args(["probe", "--device", "hexagon"]).args(json.then_some("--json"));
        cmd.env("KEEL_CDSPRPC", double).env("KEEL_CDSPRPC_VA_BUDGET", budget.to_string()).env_remove("KEEL_CDSPRPC_FAULT").env_remove("KEEL_FASTRPC_PROBE_CAP");
        if json {
            cmd.env("KEEL_CDSPRPC_LOG", log);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    let v = serde_json::from_slice(&probe(true)).unwrap();
    (v, String::from_utf8(probe(false)).unwrap())
}

/// The address budget is measured, not assumed: for two budgets of the double's session
/// (neither a power of two), the probed figure is within the probe's 1 MiB granule below
/// it, the refused mappings are the "DSP"'s `AEE_EFAILED`, and the log shows every probe
/// mapping unmapped and every probe buffer freed before the session closes.
#[test]
fn probe_measures_the_sessions_address_budget() {
    let Some(double) = fastrpc::double("probe_measures_the_sessions_address_budget") else { return };
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("keel-fastrpc-budget-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for budget in [(200u64 << 20) + (300 << 10), (1300 << 20) + (64 << 10)] {
        let log = tmp.join(format!("{budget}.log"));
        let (v, text) = probe_with_budget(&double, budget, &log);
        let got = v["va_budget"].as_u64().unwrap();
        assert!(got <= budget && budget - got < 1 << 20, "budget {budget}: measured {got}");
        assert_eq!(v["va_budget_source"], "measured");
        assert_eq!(v["va_budget_probe"]["limit"], "dsp", "{v}");
        assert!(v["va_budget_probe"]["calls"].as_u64().unwrap() <= 32);
        assert!(text.contains(&format!("DSP address budget {} MiB (measured", got >> 20)), "{text}");
        let s = fastrpc::check_log(&std::fs::read_to_string(&log).unwrap());
        assert_eq!(s.probe_bytes, got, "the log's mapped total is the figure reported");
        assert!(s.probe_refused > 0 && s.probe_calls as u64 == v["va_budget_probe"]["calls"].as_u64().unwrap(), "{s:?}");
        assert_eq!((s.batches, s.maps, s.allocs), (0, s.probe_calls - s.probe_refused, s.probe_calls), "a probe maps and frees its own buffers only");
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A session whose budget is smaller than the model: `keel run --device hexagon` places
/// what fits the measured budget on the DSP (here: nothing, said loudly) and the rest on
/// the CPU, with the CPU's tokens; no crash, nothing leaked.
#[test]
fn a_model_larger_than_the_measured_budget_runs_split_not_crashing() {
    let Some(double) = fastrpc::double("a_model_larger_than_the_measured_budget_runs_split_not_crashing") else { return };
    let m = root().join("tests/golden/synth/synth-llama-q8_0.gguf");
    let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("keel-fastrpc-small-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let mut cmd = keel_test_support::keel_command(env!("CARGO_BIN_EXE_keel"));
    cmd.arg("run").arg("-m").arg(&m).args(["-p", "Hello world", "-n", "8", "--temp", "0", "--json", "--device", "hexagon"]);
    cmd.env("KEEL_CDSPRPC", &double).env_remove("KEEL_CDSPRPC_FAULT").env("KEEL_CDSPRPC_VA_BUDGET", (12u64 << 20).to_string()).env("KEEL_CDSPRPC_LOG", &log);
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cpu = run(&double, &m, "cpu", None);
    assert_eq!(v["generated"], cpu["generated"]);
    assert_eq!(v["offloaded_weights"], 0, "{err}");
    assert!(err.contains("NOTHING was placed"), "{err}");
    assert_eq!(v["memory_breakdown"][0]["total"], 12u64 << 20, "the measured budget is the device's total");
    let s = fastrpc::check_log(&std::fs::read_to_string(&log).unwrap());
    assert_eq!(s.probe_bytes, 12 << 20);
    let _ = std::fs::remove_file(&log);
}

/// Through the double, two FastRPC sessions splitting the layers (`--device hexagon,hexagon
/// --tensor-split 1,1`) run the prompt's chunks as a pipeline with two in flight (session
/// 0 on the next chunk while session 1 runs this one), with the bits of one in flight and
/// the CPU's.
#[test]
fn pipelined_prompt_chunks_over_two_fastrpc_sessions_give_the_bits_of_one_in_flight() {
    let Some(double) = fastrpc::double("pipelined_prompt_chunks_over_two_fastrpc_sessions_give_the_bits_of_one_in_flight") else { return };
    let m = root().join("tests/golden/synth/synth-llama-q8_0.gguf");
    let two = ["--device", "hexagon,hexagon", "--tensor-split", "1,1"];
    keel_test_support::check_pipelined_bits(env!("CARGO_BIN_EXE_keel"), &m, &two, &[], true, &[("KEEL_CDSPRPC", double.as_os_str())]);
}

/// The skel sizes itself from the chip, as the double's chip says: it runs the products on
/// every 128-byte HVX context (`qurt_hvx_get_units`) with QuRT worker threads that each
/// hold a context only while they run their share (the shell stops if more are held at
/// once than the chip has, or a thread exits holding one), ended and joined at close (the
/// shell stops if one is left); it takes the VTCM it finds free (`HAP_query_avail_VTCM`)
/// as its scratch and refuses to start below 256 KiB, the reason and the fix named. Every
/// thread count gives the same tokens and logits bits.
#[test]
fn the_skel_runs_on_every_hvx_context_and_takes_the_vtcm_it_finds() {
    let Some(double) = fastrpc::double("the_skel_runs_on_every_hvx_context_and_takes_the_vtcm_it_finds") else { return };
    let m = root().join("tests/golden/synth/synth-llama-q8_0.gguf");
    let chip = |cmd: &mut std::process::Command, units: u32, vtcm: u32| {
        cmd.env("KEEL_CDSPRPC", &double)
            .env("KEEL_CDSPRPC_HVX_UNITS", units.to_string())
            .env("KEEL_CDSPRPC_VTCM", vtcm.to_string())
            .env("KEEL_CDSPRPC_STDERR", "1")
            .env_remove("KEEL_CDSPRPC_FAULT");
    };
    let mut first: Option<serde_json::Value> = None;
    for (units, vtcm) in [(1u32, 4u32 << 20), (2, 1 << 20), (4, 4 << 20), (6, 8 << 20)] {
        let mut probe = keel_test_support::keel_command(env!("CARGO_BIN_EXE_keel"));
        probe.args(["probe", "--device", "hexagon", "--json"]);
        chip(&mut probe, units, vtcm);
        let out = probe.output().unwrap();
        assert!(out.status.success(), "probe with {units} HVX contexts: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!((v["hvx_contexts"].as_u64(), v["hvx_threads"].as_u64()), (Some(units.into()), Some(units.into())), "{v}");
        assert_eq!(v["scratch_bytes"].as_u64(), Some(vtcm.into()), "the skel's scratch is the VTCM found free: {v}");

        let mut run = keel_test_support::keel_command(env!("CARGO_BIN_EXE_keel"));
        run.arg("run").arg("-m").arg(&m).args(["-p", "Hello world", "-n", "8", "--temp", "0", "--json", "--device", "hexagon"]);
        chip(&mut run, units, vtcm);
        let out = run.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "run with {units} HVX contexts: {err}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["device_batches"].as_u64().unwrap() > 0);
        let report = err.lines().find(|l| l.starts_with("keel-dsp-shell: close:")).unwrap_or_else(|| panic!("no close report from the shell (the skel's close did not run or failed): {err}"));
        assert!(report.contains(&format!(": {} worker thread(s) started and joined;", units - 1)), "{report}");
        let took: u64 = report.split("workers took an HVX context ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok()).unwrap();
        assert_eq!(took > 0, units > 1, "workers ran shares only when there are workers: {report}");
        // The FastRPC thread holds a context through a whole batch, so a worker's share
        // makes two at once; how many overlap beyond that is the host's scheduling.
        let most: u32 = report.split("at most ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok()).unwrap();
        assert!(report.ends_with(&format!(" of {units} held at once")) && most >= units.min(2) && most <= units, "{report}");
        match &first {
            None => first = Some(v),
            Some(f) => {
                assert_eq!(v["generated"], f["generated"], "{units} HVX contexts: tokens differ from one");
                assert_eq!(v["logits_sha256"], f["logits_sha256"], "{units} HVX contexts: logits bits differ from one");
            }
        }
    }

    let mut probe = keel_test_support::keel_command(env!("CARGO_BIN_EXE_keel"));
    probe.args(["probe", "--device", "hexagon"]);
    chip(&mut probe, 4, 128 << 10);
    let out = probe.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "128 KiB of VTCM must be refused");
    for want in ["AEE_ENOMEMORY", "less than 256 KiB of VTCM free", "HAP_query_avail_VTCM", "--device cpu"] {
        assert!(err.contains(want), "{want:?} not in: {err}");
    }
}

//! `keel-dsp-cost` (the DSP cost model from executed packets under qemu-hexagon) on the
//! synthetic llama: a short run (8 prompt tokens, 2 generated) whose counts must be
//! attributed to batches and op kinds by the firmware's markers. Skips loudly without
//! qemu-hexagon or the firmware ELF (`KEEL_REQUIRE_DSP=1`: fails).

use crate::sim;

use std::process::Command;

fn tool() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_keel-dsp-cost"));
    c.args(["--keel", env!("CARGO_BIN_EXE_keel")]);
    c
}

/// Runs the tool on the synthetic llama with `threads` hardware threads and checks the
/// attribution; (threads seen, decode packets per token, its critical path).
fn attributed(threads: Option<&str>) -> (u64, f64, f64) {
    let model = keel_test_support::golden_path("synth/synth-llama-q8_0.gguf");
    let mut cmd = tool();
    if let Some(t) = threads {
        cmd.env("KEEL_DSP_THREADS", t);
    }
    let out = cmd.arg("-m").arg(&model).args(["-p", "8", "-n", "2", "--json"]).output().expect("keel-dsp-cost runs");
    assert!(out.status.success(), "keel-dsp-cost failed: {}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert!(j["prompt_batches"].as_u64().unwrap() >= 1 && j["decode_batches"].as_u64().unwrap() >= 1, "{j}");
    assert!(j["prompt_tokens"].as_u64().unwrap() >= 2, "{j}");
    // The whole forward pass runs on the device: one decode step (embedding lookup of one
    // token) per generated token, told apart from the prompt's output batch (one column too).
    assert_eq!(j["decode_steps"].as_f64().unwrap(), j["generated"].as_u64().unwrap() as f64, "{j}");
    for phase in ["prompt", "decode"] {
        let ops = j[format!("{phase}_ops")].as_object().unwrap();
        let total: f64 = ops.values().map(|v| v.as_f64().unwrap()).sum();
        let per_token = j[format!("{phase}_packets_per_token")].as_f64().unwrap();
        assert!((total - per_token).abs() <= 1e-6 * per_token, "{phase}: the op kinds do not add up to the total: {j}");
        // A llama layer on the DSP: products, attention, norms, RoPE and SwiGLU all ran there.
        for k in ["matmul", "attention", "rms_norm", "rope", "elementwise"] {
            assert!(ops[k].as_f64().unwrap() > 0.0, "{phase}: no packets for {k}: {j}");
        }
        let mm = ops["matmul"].as_f64().unwrap();
        assert!(ops.iter().all(|(k, v)| k == "matmul" || v.as_f64().unwrap() < mm), "{phase}: the products are not the largest cost: {j}");
        let hvx = j[format!("{phase}_hvx_kernel_packets_per_token")].as_f64().unwrap();
        assert!(hvx > 0.0 && hvx < mm, "{phase}: HVX kernel packets {hvx} vs matmul {mm}: {j}");
    }
    assert!(j["device_model_bytes"].as_u64().unwrap() > 1 << 20, "{j}");
    // A generated token reads every matrix; the prompt's tokens share one read of them.
    let (tg, pp) = (j["decode_bytes_per_token"].as_f64().unwrap(), j["prompt_bytes_per_token"].as_f64().unwrap());
    assert!(tg > (1 << 20) as f64 && pp < tg / 4.0, "bytes per token: prompt {pp}, decode {tg}: {j}");
    let targets = j["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 2, "{j}");
    for t in targets {
        let tps = t["decode_tps"].as_f64().unwrap();
        assert!(tps.is_finite() && tps > 0.0 && tps <= t["decode_tps_bandwidth_bound"].as_f64().unwrap(), "{t}");
        assert!(t["decode_tps_as_run"].as_f64().unwrap() >= tps, "the threads' critical path is no longer than one thread's work: {t}");
    }
    (j["threads"].as_u64().unwrap(), j["decode_packets_per_token"].as_f64().unwrap(), j["decode_critical_packets_per_token"].as_f64().unwrap())
}

#[test]
fn the_cost_model_attributes_packets_to_batches_and_op_kinds() {
    let Some(_) = sim::config("the_cost_model_attributes_packets_to_batches_and_op_kinds") else { return };
    // One hardware thread: the critical path is all of the work.
    let (n, total, critical) = attributed(Some("1"));
    assert_eq!(n, 1);
    assert_eq!(critical, total, "one thread: the critical path is every packet");
    // Four (what a v68 runs): the products' row groups are shared, so the busiest
    // thread's packets are well under the total, which stays about one thread's (the
    // hand-offs add some; smaller shares of rows change the chunking a little).
    let (n4, total4, critical4) = attributed(Some("4"));
    assert_eq!(n4, 4, "the firmware's workers execute and are seen");
    assert!(critical4 < 0.6 * total4, "4 threads: critical path {critical4} of {total4} packets");
    assert!((total4 - total).abs() < 0.1 * total, "4 threads: {total4} packets against one thread's {total}");
}

#[test]
fn bad_arguments_are_named() {
    let out = tool().args(["-m", "/nonexistent/model.gguf", "-p", "1"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("-p and -n must be at least 2"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = tool().output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("give -m MODEL.gguf"), "{}", String::from_utf8_lossy(&out.stderr));
}

//! `keel plan --placement`: every op of every layer's block (`keel_core::block`) and
//! where it runs, for the six synthetic models of every architecture, with no device:
//! each architecture's block as its description says, every op on the CPU with the
//! reason. (With `--device hexagon-sim`: `placement_sim.rs`.)

use std::path::Path;
use std::process::Command;

fn plan_json(model: &str, extra: &[&str]) -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/golden/synth/{model}.gguf"));
    let out = Command::new(env!("CARGO_BIN_EXE_keel")).args(["plan", "-m"]).arg(&p).args(["--placement", "--json"]).args(extra).output().unwrap();
    assert!(out.status.success(), "keel plan --placement {model}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{model}: not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// `op:tensor` names of a layer's ops.
fn ops(layer: &serde_json::Value) -> Vec<String> {
    layer["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| match o["tensor"].as_str() {
            Some(t) => format!("{}:{t}", o["op"].as_str().unwrap()),
            None => o["op"].as_str().unwrap().to_string(),
        })
        .collect()
}

const FFN: &str = "residual norm:ffn_norm matmul:ffn_gate matmul:ffn_up swiglu matmul:ffn_down residual";

#[test]
fn each_architecture_lists_its_block_and_every_op_on_the_cpu_says_why() {
    let attn = |extra: &str| format!("norm:attn_norm matmul:attn_q matmul:attn_k matmul:attn_v {extra}rope kv_store attention matmul:attn_output {FFN}");
    let cases = [
        ("synth-llama-q8_0", attn("")),
        ("synth-llama-q4_0", attn("")),
        ("synth-qwen2-q8_0", attn("bias:attn_q.bias bias:attn_k.bias bias:attn_v.bias ")),
        ("synth-qwen3-q8_0", attn("head_norm:attn_q_norm head_norm:attn_k_norm ")),
    ];
    for (model, want) in &cases {
        let j = plan_json(model, &[]);
        let layers = j["layers"].as_array().unwrap();
        assert!(!layers.is_empty(), "{model}: no layers");
        for l in layers {
            assert_eq!(ops(l).join(" "), *want, "{model} layer {}", l["layer"]);
        }
    }
    // Qwen 3.5: delta-net layers and gated attention layers.
    let j = plan_json("synth-qwen35-q8_0", &[]);
    let delta = format!("norm:attn_norm matmul:attn_qkv matmul:attn_gate matmul:ssm_beta matmul:ssm_alpha delta_gates ssm_conv qk_l2_norm delta_rule gated_norm matmul:ssm_out {FFN}");
    let gated = format!("norm:attn_norm matmul:attn_q matmul:attn_k matmul:attn_v split_q_gate head_norm:attn_q_norm head_norm:attn_k_norm rope kv_store attention attn_gate matmul:attn_output {FFN}");
    let kinds: Vec<&str> = j["layers"].as_array().unwrap().iter().map(|l| l["mixer"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"delta-net") && kinds.contains(&"attention"), "{kinds:?}");
    for l in j["layers"].as_array().unwrap() {
        let want = if l["mixer"] == "delta-net" { &delta } else { &gated };
        assert_eq!(ops(l).join(" "), *want, "qwen35 layer {}", l["layer"]);
    }
    // Gemma 3: pre-scaled queries, post-norms, GeGLU, sliding-window layers.
    let j = plan_json("synth-gemma3-q8_0", &[]);
    let want = "norm:attn_norm matmul:attn_q matmul:attn_k matmul:attn_v head_norm:attn_q_norm head_norm:attn_k_norm rope kv_store q_scale attention matmul:attn_output residual:post_attention_norm norm:ffn_norm matmul:ffn_gate matmul:ffn_up geglu matmul:ffn_down residual:post_ffw_norm";
    let mut windows = 0;
    for l in j["layers"].as_array().unwrap() {
        assert_eq!(ops(l).join(" "), want, "gemma3 layer {}", l["layer"]);
        windows += l["ops"].as_array().unwrap().iter().filter(|o| o["window"].as_u64().is_some_and(|w| w > 0)).count();
    }
    assert!(windows > 0, "gemma3: no sliding-window layer listed");
    // No device: everything on the CPU, each with a reason.
    for l in j["layers"].as_array().unwrap() {
        assert!(l["whole_on"].is_null());
        for o in l["ops"].as_array().unwrap() {
            assert_eq!(o["where"], "cpu");
            assert_eq!(o["why"], "no device was given");
        }
    }
    assert_eq!(j["output"]["where"], "cpu");
}

#[test]
fn the_text_listing_names_each_layer_and_op() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/synth/synth-qwen35-q8_0.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_keel")).args(["plan", "-m"]).arg(&p).arg("--placement").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("layer 0 (delta-net):"), "{text}");
    assert!(text.contains("delta_rule") && text.contains("(no device was given)"), "{text}");
    assert!(text.contains("output projection: cpu"), "{text}");
}

//! llama.cpp's common flags as keel takes them (issue 20, item 2): `-f -` reads standard
//! input, `-e` escapes, `--ignore-eos`, `-r` stop strings, the random seed printed and
//! reported; `info --json` with typed hyper-parameters; `keel pull` saying which variant
//! it fetched. On the synthetic llama (SmolLM2's tokenizer).

use std::io::Write;
use std::process::{Output, Stdio};
use crate::support::{keel, synth};

fn run(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = keel().args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn m() -> String {
    synth().to_str().unwrap().to_string()
}

#[test]
fn prompt_from_stdin_and_escapes() {
    let m = m();
    let base = ["run", "-m", &m, "-n", "2", "--temp", "0", "--json"];
    let direct = json(&run(&[&base[..], &["-p", "Hello\nworld"]].concat(), None));
    let piped = json(&run(&[&base[..], &["-f", "-"]].concat(), Some("Hello\nworld")));
    assert_eq!(piped["prompt_tokens"], direct["prompt_tokens"], "-f - reads the prompt from stdin");
    let escaped = json(&run(&[&base[..], &["-e", "-p", "Hello\\nworld"]].concat(), None));
    assert_eq!(escaped["prompt_tokens"], direct["prompt_tokens"], "-e turns \\n into a newline");
    let raw = json(&run(&[&base[..], &["-p", "Hello\\nworld"]].concat(), None));
    assert_ne!(raw["prompt_tokens"], direct["prompt_tokens"], "without -e a backslash is text");
    // tokenize and perplexity read `-f -` too.
    let t = json(&run(&["tokenize", "-m", &m, "--json", "-f", "-"], Some("Hello\nworld")));
    assert!(!t["tokens"].as_array().unwrap().is_empty());
}

#[test]
fn ignore_eos_and_stop_strings() {
    let m = m();
    // Seed 20 on this model ends with an end-of-generation token after 196 tokens on the
    // machine this was written on (where the kernels sample the same, the check below of
    // the common prefix applies; --ignore-eos must run the full -n everywhere).
    let free = json(&run(&["run", "-m", &m, "-p", "hi", "-n", "200", "-s", "20", "--json"], None));
    let ended = free["stop"] == "end of generation";
    let forced = json(&run(&["run", "-m", &m, "-p", "hi", "-n", "200", "-s", "20", "--ignore-eos", "--json"], None));
    assert_eq!(forced["stop"], "length", "--ignore-eos generates -n tokens: {forced}");
    assert_eq!(forced["generated"].as_array().unwrap().len(), 200);
    if ended {
        let n = free["generated"].as_array().unwrap().len();
        assert_eq!(forced["generated"].as_array().unwrap()[..n], free["generated"].as_array().unwrap()[..], "the same tokens up to where the free run stopped");
    }
    // A stop string taken from the text the run generates ends it where it first appears.
    let text = forced["text"].as_str().unwrap();
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() > 40, "{text:?}");
    let stop: String = chars[30..33].iter().collect();
    let stopped = json(&run(&["run", "-m", &m, "-p", "hi", "-n", "200", "-s", "20", "--ignore-eos", "-r", &stop, "--json"], None));
    assert_eq!(stopped["stop"], "stop string", "{stopped}");
    let t = stopped["text"].as_str().unwrap();
    let first = text.find(&stop).unwrap() + stop.len();
    assert!(text.starts_with(t) && t.len() >= first, "{t:?} should be {text:?} up to the token holding the first {stop:?}");
    let last = stopped["generated"].as_array().unwrap().len();
    let before = json(&run(&["run", "-m", &m, "-p", "hi", "-n", &(last - 1).to_string(), "-s", "20", "--ignore-eos", "--json"], None));
    assert!(!before["text"].as_str().unwrap().contains(&stop), "the run stopped at the first token that completed {stop:?}");
}

#[test]
fn a_random_seed_is_printed_and_repeats_the_run() {
    let m = m();
    let o = run(&["run", "-m", &m, "-p", "hi", "-n", "8", "--json"], None);
    let v = json(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    let seed = v["seed"].as_u64().unwrap();
    assert!(err.contains(&format!("seed {seed} (drawn at random; -s {seed} repeats this run)")), "{err}");
    let again = json(&run(&["run", "-m", &m, "-p", "hi", "-n", "8", "--json", "-s", &seed.to_string()], None));
    assert_eq!(again["generated"], v["generated"]);
    let o = run(&["run", "-m", &m, "-p", "hi", "-n", "1", "-s", "5"], None);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("drawn at random"), "a given seed is not announced");
}

#[test]
fn info_json_has_typed_hyper_parameters() {
    let v = json(&run(&["info", &m(), "--json"], None));
    let hp = &v["hparams"];
    assert_eq!(hp["arch"], "llama");
    assert_eq!(hp["n_layer"], 4);
    assert_eq!(hp["n_embd"], 128);
    assert_eq!(hp["n_ctx_train"], 4096);
    assert_eq!(hp["rope_base"], 10000.0);
    assert_eq!(hp["rms_eps"], 1e-5);
    assert_eq!(v["metadata"]["llama.block_count"], 4);
    assert_eq!(v["metadata"]["llama.attention.layer_norm_rms_epsilon"], 1e-5);
    assert_eq!(v["metadata"]["tokenizer.ggml.tokens"]["array"], "string");
}

#[test]
fn pull_says_which_variant() {
    let Some(path) = keel_test_support::model_path("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m") else { return };
    let o = keel().args(["pull", "smollm2-135m"]).env("KEEL_MODELS", path.parent().unwrap()).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), path.to_str().unwrap());
    assert!(err.contains("smollm2-135m is SmolLM2-135M-Instruct, Q4_1: instruction-tuned"), "{err}");
    for known in keel_host_linux::pull::KNOWN_MODELS {
        assert!(!known.variant.is_empty() && (known.variant.contains("instruction-tuned")), "{}: say whether it is instruction-tuned", known.name);
    }
}

/// `--device-in-flight 0` and `--device-batch-work 0` are refused before any device opens,
/// naming the flag and what it takes; on the CPU alone the device flags change nothing.
#[test]
fn device_pipelining_flags_refuse_zero_and_leave_the_cpu_alone() {
    for (flag, want) in [("--device-in-flight", "at least 1 batch"), ("--device-batch-work", "at least 1 MiB")] {
        let o = run(&["run", "-m", &m(), "-p", "Hello", "-n", "1", flag, "0"], None);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(flag) && err.contains(want), "{flag} 0: {err}");
    }
    let plain = json(&run(&["run", "-m", &m(), "-p", "Hello", "-n", "4", "--temp", "0", "--json"], None));
    let flagged = json(&run(&["run", "-m", &m(), "-p", "Hello", "-n", "4", "--temp", "0", "--json", "--device-in-flight", "3", "--device-batch-work", "1"], None));
    assert_eq!(plain["logits_sha256"], flagged["logits_sha256"]);
    assert_eq!((flagged["device_in_flight"].as_u64(), flagged["device_batches"].as_u64()), (Some(0), Some(0)), "no device: nothing in flight");
}

/// `--tensor-split` (`-ts`) needs one whole-number share per device session and one
/// above 0: anything else is refused before a device opens, naming the flag and the fix.
#[test]
fn tensor_split_refuses_bad_shares_naming_the_fix() {
    for (devices, shares, want) in [("hexagon-sim", "1,1", "2 shares for 1 device sessions"), ("hexagon-sim,hexagon-sim", "1,x", "expected a whole number share"), ("hexagon-sim,hexagon-sim", "0,0", "every share is 0"), ("cpu", "1", "1 shares for 0 device sessions")] {
        for spelling in ["--tensor-split", "-ts"] {
            let o = run(&["run", "-m", &m(), "-p", "Hello", "-n", "1", "--device", devices, spelling, shares], None);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success() && err.contains("--tensor-split") && err.contains(want), "{devices} {spelling} {shares}: {err}");
        }
    }
}

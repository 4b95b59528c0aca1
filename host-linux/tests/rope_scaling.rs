//! RoPE scaling (issue 22): linear, YaRN and Llama 3's `rope_freqs` factors against
//! llama.cpp's outputs, and the scaling keys and tensors keel does not implement refused
//! with an error naming them.
//!
//! The scaled models are made here, at test time, from the committed synthetic models
//! (tests/golden/synth/) by [`write_variant`]: the same weights with `rope.scaling.*`
//! keys set and, for Llama 3 style, a `rope_freqs.weight` tensor appended. llama.cpp's
//! logits for the same files are the goldens in tests/golden/rope/ (see its README).

use keel_core::gguf::{Gguf, Value};
use keel_core::session::Outputs;
use keel_host_linux::cli::load::{engine, open, prepare, RunOptions};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

fn synth(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/golden/synth/{name}.gguf"))
}

fn scratch(tag: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("rope-{tag}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A metadata value to set in a variant.
#[derive(Clone, Copy)]
enum Kv {
    Str(&'static str),
    F32(f32),
    U32(u32),
}

/// Writes `dst`: the model `src` with the keys `set` (each `<arch>.` + suffix) replaced or
/// appended and, if given, one more F32 vector tensor appended.
fn write_variant(src: &Path, dst: &Path, set: &[(&str, Kv)], tensor: Option<(&str, &[f32])>) {
    let bytes = std::fs::read(src).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    let arch = std::str::from_utf8(g.str_opt("general.architecture").unwrap().unwrap()).unwrap().to_string();
    let full: Vec<String> = set.iter().map(|(k, _)| format!("{arch}.{k}")).collect();
    let values: Vec<(&str, Value<'_>)> = full
        .iter()
        .zip(set)
        .map(|(name, (_, v))| {
            let v = match *v {
                Kv::Str(s) => Value::Str(s.as_bytes()),
                Kv::F32(x) => Value::F32(x),
                Kv::U32(x) => Value::U32(x),
            };
            (name.as_str(), v)
        })
        .collect();
    keel_test_support::model_variant(src, dst, &values, tensor);
}

/// Llama 3.1's frequency factors (as its converter computes them: factor 8, low/high
/// frequency factors 1 and 4) for a RoPE of `n_rot` dims and base `base`, with a small
/// original context so that the synthetic model's 16 pairs span all three regimes.
fn llama3_factors(n_rot: usize, base: f64, orig_ctx: f64) -> Vec<f32> {
    let (factor, low, high) = (8.0f64, 1.0f64, 4.0f64);
    let (low_wl, high_wl) = (orig_ctx / low, orig_ctx / high);
    (0..n_rot / 2)
        .map(|i| {
            let freq = 1.0 / base.powf(2.0 * i as f64 / n_rot as f64);
            let wl = 2.0 * std::f64::consts::PI / freq;
            if wl < high_wl {
                1.0
            } else if wl > low_wl {
                factor as f32
            } else {
                let smooth = (orig_ctx / wl - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

/// One scaled model of the goldens: its name, the synthetic model it is made from, the
/// keys set, and whether it carries Llama 3 frequency factors.
struct Variant {
    name: &'static str,
    base: &'static str,
    keys: &'static [(&'static str, Kv)],
    freqs: bool,
}

const VARIANTS: [Variant; 5] = [
    Variant { name: "llama-linear4", base: "synth-llama-q8_0", keys: &[("rope.scaling.type", Kv::Str("linear")), ("rope.scaling.factor", Kv::F32(4.0))], freqs: false },
    Variant {
        name: "llama-yarn4",
        base: "synth-llama-q8_0",
        keys: &[("rope.scaling.type", Kv::Str("yarn")), ("rope.scaling.factor", Kv::F32(4.0)), ("rope.scaling.original_context_length", Kv::U32(32))],
        freqs: false,
    },
    Variant { name: "llama-rope-freqs", base: "synth-llama-q8_0", keys: &[], freqs: true },
    Variant {
        name: "qwen2-yarn8",
        base: "synth-qwen2-q8_0",
        keys: &[("rope.scaling.type", Kv::Str("yarn")), ("rope.scaling.factor", Kv::F32(8.0)), ("rope.scaling.original_context_length", Kv::U32(32768)), ("rope.scaling.attn_factor", Kv::F32(1.25))],
        freqs: false,
    },
    Variant { name: "gemma3-linear8", base: "synth-gemma3-q8_0", keys: &[("rope.scaling.type", Kv::Str("linear")), ("rope.scaling.factor", Kv::F32(8.0))], freqs: false },
];

/// Writes the variant into `dir` and returns its path.
fn make(v: &Variant, dir: &Path) -> PathBuf {
    let dst = dir.join(format!("{}.gguf", v.name));
    let freqs = llama3_factors(32, 10000.0, 64.0);
    write_variant(&synth(v.base), &dst, v.keys, v.freqs.then_some(("rope_freqs.weight", &freqs[..])));
    dst
}

fn golden(name: &str) -> Vec<serde_json::Value> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/golden/rope/{name}.jsonl"));
    let raw = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    raw.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Every position's logits row of every golden prompt equals llama.cpp's bit for bit
/// (sha256 of the row's little-endian f32 bytes), and its top-10 values exactly.
#[test]
fn scaled_models_match_llama_cpp_bit_for_bit() {
    let dir = scratch("golden");
    let paths: Vec<PathBuf> = VARIANTS.iter().map(|v| make(v, &dir)).collect();
    for (v, path) in VARIANTS.iter().zip(&paths) {
        let opened = open(path.to_str().unwrap()).unwrap();
        let g = opened.gguf().unwrap();
        let opts = RunOptions { n_ctx: 128, n_batch: 128, n_outputs: 128, threads: 2, reference: false, force_ctx: false };
        let mut loaded = prepare(&g, &opened.path, &opts).unwrap();
        let (mut e, pool) = engine(&g, &opened.path, &mut loaded, false, Default::default()).unwrap();
        assert!(e.model.hp.rope_scaled() || v.freqs, "{}: the variant is scaled", v.name);
        // Prompts of >= 64 tokens are one batch evaluated with llama.cpp's tiled attention.
        e.session.set_llama_cpp_batches(true);
        let n_vocab = e.model.hp.n_vocab;
        for line in golden(v.name) {
            let toks: Vec<u32> = line["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
            e.reset();
            let logits = e.eval(&toks, Outputs::All, pool).unwrap().to_vec();
            for (p, gp) in line["positions"].as_array().unwrap().iter().enumerate() {
                let row = &logits[p * n_vocab..(p + 1) * n_vocab];
                for t in gp["top"].as_array().unwrap() {
                    let (id, want) = (t[0].as_u64().unwrap() as usize, t[1].as_f64().unwrap() as f32);
                    assert_eq!(row[id].to_bits(), want.to_bits(), "{} prompt {} position {p} token {id}: {} vs llama.cpp {want}", v.name, line["prompt"], row[id]);
                }
                let bytes: Vec<u8> = row.iter().flat_map(|x| x.to_le_bytes()).collect();
                let digest: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
                assert_eq!(digest, gp["sha256"].as_str().unwrap(), "{} prompt {} position {p}: logits row differs from llama.cpp's", v.name, line["prompt"]);
            }
        }
    }
}

fn keel() -> Command {
    keel_test_support::keel_command(env!("CARGO_BIN_EXE_keel"))
}

/// `keel run` on `model` exits 1 with an `error:` line naming `needle`, no panic.
fn refused(model: &Path, needle: &str) {
    let out = keel().args(["run", "-c", "64", "-n", "1", "--temp", "0", "-p", "hi", "-m"]).arg(model).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{}: panicked: {err}", model.display());
    assert_eq!(out.status.code(), Some(1), "{}: expected exit 1, got {:?}; stderr: {err}", model.display(), out.status);
    assert!(err.contains("error:") && err.contains(needle), "{}: the error should name {needle:?}: {err}", model.display());
}

/// Each RoPE scaling key or type keel does not implement, and each frequency-factor
/// tensor it does not apply, makes keel refuse the model, naming the key or tensor.
#[test]
fn unimplemented_scaling_is_refused_naming_the_key() {
    let dir = scratch("refused");
    let yarn = [("rope.scaling.type", Kv::Str("yarn")), ("rope.scaling.factor", Kv::F32(4.0))];
    let key_cases: [(&str, &[(&str, Kv)], &str); 9] = [
        ("longrope", &[("rope.scaling.type", Kv::Str("longrope")), ("rope.scaling.factor", Kv::F32(4.0))], "llama.rope.scaling.type"),
        ("unknown-type", &[("rope.scaling.type", Kv::Str("ntk-by-parts"))], "llama.rope.scaling.type"),
        ("log-mul", &[yarn[0], yarn[1], ("rope.scaling.yarn_log_multiplier", Kv::F32(0.1))], "llama.rope.scaling.yarn_log_multiplier"),
        ("ext-factor", &[yarn[0], yarn[1], ("rope.scaling.yarn_ext_factor", Kv::F32(0.5))], "llama.rope.scaling.yarn_ext_factor"),
        ("yarn-attn", &[yarn[0], yarn[1], ("rope.scaling.yarn_attn_factor", Kv::F32(2.0))], "llama.rope.scaling.yarn_attn_factor"),
        ("beta-fast", &[yarn[0], yarn[1], ("rope.scaling.yarn_beta_fast", Kv::F32(16.0))], "llama.rope.scaling.yarn_beta_fast"),
        ("beta-slow", &[yarn[0], yarn[1], ("rope.scaling.yarn_beta_slow", Kv::F32(2.0))], "llama.rope.scaling.yarn_beta_slow"),
        ("alpha", &[("rope.scaling.alpha", Kv::F32(1000.0))], "llama.rope.scaling.alpha"),
        ("bad-factor", &[("rope.scaling.factor", Kv::F32(-2.0))], "llama.rope.scaling.factor"),
    ];
    for (tag, keys, needle) in key_cases {
        let p = dir.join(format!("{tag}.gguf"));
        write_variant(&synth("synth-llama-q8_0"), &p, keys, None);
        refused(&p, needle);
    }
    let freqs = llama3_factors(32, 10000.0, 64.0);
    let tensor_cases = [("synth-llama-q8_0", "rope_factors_long.weight"), ("synth-llama-q8_0", "rope_factors_short.weight"), ("synth-qwen2-q8_0", "rope_freqs.weight"), ("synth-gemma3-q8_0", "rope_freqs.weight")];
    for (i, (base, name)) in tensor_cases.into_iter().enumerate() {
        let p = dir.join(format!("tensor-{i}.gguf"));
        write_variant(&synth(base), &p, &[], Some((name, &freqs[..])));
        refused(&p, name);
    }
    let mut zero = freqs.clone();
    zero[3] = 0.0;
    let p = dir.join("zero-factor.gguf");
    write_variant(&synth("synth-llama-q8_0"), &p, &[], Some(("rope_freqs.weight", &zero[..])));
    refused(&p, "rope_freqs.weight");
    // The same keys holding the value llama.cpp applies anyway are accepted.
    let p = dir.join("defaults.gguf");
    let defaults = [yarn[0], yarn[1], ("rope.scaling.yarn_beta_fast", Kv::F32(32.0)), ("rope.scaling.yarn_beta_slow", Kv::F32(1.0)), ("rope.scaling.yarn_ext_factor", Kv::F32(1.0)), ("rope.scaling.yarn_log_multiplier", Kv::F32(0.0))];
    write_variant(&synth("synth-llama-q8_0"), &p, &defaults, None);
    let out = keel().args(["run", "-c", "64", "-n", "1", "--temp", "0", "-p", "hi", "-m"]).arg(&p).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A device's RoPE takes plain (cos, sin) tables, so placement keeps every layer of a
/// scaled model (and of one with frequency factors) on the CPU, saying why; the
/// unscaled model's layers may go to a device.
#[test]
fn scaled_layers_stay_on_the_cpu() {
    let dir = scratch("placement");
    let plain = synth("synth-llama-q8_0");
    for (path, scaled) in VARIANTS.iter().map(|v| (make(v, &dir), true)).chain([(plain, false)]) {
        let opened = open(path.to_str().unwrap()).unwrap();
        let g = opened.gguf().unwrap();
        let opts = RunOptions { n_ctx: 64, n_batch: 64, n_outputs: 1, threads: 1, reference: false, force_ctx: false };
        let mut loaded = prepare(&g, &opened.path, &opts).unwrap();
        let (e, _) = engine(&g, &opened.path, &mut loaded, false, Default::default()).unwrap();
        for l in 0..e.model.layers.len() {
            let shape = keel_core::placement::layer_shape(&e.model, l);
            match scaled {
                true => assert_eq!(shape.err(), Some("RoPE scaling (linear, YaRN or rope_freqs factors) runs on the CPU only"), "{} layer {l}", path.display()),
                false => assert!(shape.is_ok(), "{} layer {l}: {shape:?}", path.display()),
            }
        }
    }
}

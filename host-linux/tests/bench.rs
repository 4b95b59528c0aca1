//! `keel bench` checks its own output: a model whose logits are NaN or constant gets no
//! speed reported (exit 1, a message saying why); a working model gets a JSON report.

use keel_core::gguf::Gguf;
use std::path::{Path, PathBuf};
use std::process::Command;

fn seed() -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/fuzz/seeds/tiny-llama.gguf")).unwrap()
}

/// The seed model with every `output_norm.weight` value replaced by `v`.
fn with_output_norm(v: f32) -> PathBuf {
    let mut b = seed();
    let (start, len) = {
        let g = Gguf::parse(&b).unwrap();
        let t = g.tensor("output_norm.weight").unwrap();
        (t.offset as usize, t.data.len())
    };
    for c in b[start..start + len].chunks_exact_mut(4) {
        c.copy_from_slice(&v.to_le_bytes());
    }
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-norm-{v}.gguf"));
    std::fs::write(&p, &b).unwrap();
    p
}

fn bench(model: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_keel")).args(["bench", "-p", "8", "-n", "4", "-r", "2", "-t", "1", "--json", "-m"]).arg(model).output().unwrap()
}

#[test]
fn reports_a_working_model() {
    let p = with_output_norm(1.0);
    let out = bench(&p);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["test"], "pp8");
    assert_eq!(v[1]["test"], "tg4");
    assert!(v[1]["tps"].as_f64().unwrap() > 0.0);
}

#[test]
fn refuses_nan_and_constant_logits() {
    for (v, why) in [(f32::NAN, "NaN"), (0.0, "equal")] {
        let out = bench(&with_output_norm(v));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{why}: {stderr}");
        assert!(stderr.contains("refusing") && stderr.contains(why), "{why}: {stderr}");
        assert!(out.stdout.is_empty(), "no speed may be printed: {}", String::from_utf8_lossy(&out.stdout));
    }
}

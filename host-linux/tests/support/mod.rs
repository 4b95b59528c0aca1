//! Shared by the hostile-input suites: the binary under test and generated models.
#![allow(dead_code)] // each test crate uses its own subset

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `keel` binary under test (`KEEL_TEST_BIN=/path/to/keel` runs another build, e.g.
/// the code before a fix, to see a test fail there).
pub fn keel() -> Command {
    match std::env::var_os("KEEL_TEST_BIN") {
        Some(b) => Command::new(b),
        None => Command::new(env!("CARGO_BIN_EXE_keel")),
    }
}

/// The synthetic llama (tests/golden/synth).
pub fn synth() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/synth/synth-llama-q8_0.gguf")
}

/// A copy of the synthetic model in `dir` with the metadata `set` (replacing keys of the
/// same name, adding the others), written by keel's own GGUF writer.
pub fn synth_with(dir: &Path, name: &str, set: &[(&str, keel_core::gguf::Value<'static>)]) -> PathBuf {
    use keel_host_linux::gguf_write::{encode_kv, GgufWriter, TensorDecl};
    let bytes = std::fs::read(synth()).unwrap();
    let g = keel_core::gguf::Gguf::parse(&bytes).unwrap();
    let (mut kv, mut n_kv) = (Vec::new(), 0);
    for i in 0..g.n_keys() {
        let (k, v) = g.key_at(i).unwrap();
        if !set.iter().any(|(s, _)| s.as_bytes() == k) {
            encode_kv(&mut kv, k, &v);
            n_kv += 1;
        }
    }
    for (k, v) in set {
        encode_kv(&mut kv, k.as_bytes(), v);
        n_kv += 1;
    }
    let decls: Vec<TensorDecl> = g.tensors().map(|t| TensorDecl { name: t.name.to_vec(), ne: t.ne, n_dims: t.n_dims, ty: t.ty }).collect();
    let path = dir.join(name);
    let mut w = GgufWriter::create(&path, &kv, n_kv, &decls, g.alignment()).unwrap();
    for t in g.tensors() {
        w.write_data(t.data).unwrap();
        w.end_tensor().unwrap();
    }
    w.finish().unwrap();
    path
}

//! Shared by the hostile-input suites: the binary under test and generated models.
#![allow(dead_code)] // each test crate uses its own subset

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `keel` binary under test (`KEEL_TEST_BIN` runs another build).
pub fn keel() -> Command {
    keel_test_support::keel_command(env!("CARGO_BIN_EXE_keel"))
}

/// The synthetic llama (tests/golden/synth).
pub fn synth() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/synth/synth-llama-q8_0.gguf")
}

/// A copy of the synthetic model in `dir` with the metadata `set` (replacing keys of the
/// same name, adding the others), written by keel's own GGUF writer.
pub fn synth_with(dir: &Path, name: &str, set: &[(&str, keel_core::gguf::Value<'static>)]) -> PathBuf {
    let path = dir.join(name);
    keel_test_support::model_variant(&synth(), &path, set, None);
    path
}

//! Building the guest (`guest/`, its own workspace) for `wasm32-unknown-unknown` with the
//! cargo that runs this build. Used by `build.rs` (the normal guest, embedded in the
//! host) and by the perturbed-kernel test (a second guest built with
//! `--cfg keel_perturb_for_test`, in a directory of its own).
//!
//! Only `std`: `build.rs` includes this file as a module too.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The wasm target the guest is built for.
pub const TARGET: &str = "wasm32-unknown-unknown";

/// Which guest to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// The reference guest.
    Normal,
    /// keel-core with `--cfg keel_perturb_for_test` (one horizontal sum in the scalar
    /// kernels adds its lanes in another order). For the test that the digest check
    /// catches a changed kernel; never embedded.
    Perturbed,
}

/// Builds the guest in `guest_dir` (the directory holding its Cargo.toml) with `cargo`,
/// into `target_dir`, and returns the path of the `.wasm` file.
pub fn build(cargo: &Path, guest_dir: &Path, target_dir: &Path, variant: Variant) -> Result<PathBuf, String> {
    let mut cmd = Command::new(cargo);
    cmd.current_dir(guest_dir)
        .args(["build", "--release", "--target", TARGET, "--manifest-path"])
        .arg(guest_dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    // The guest's flags are fixed here, whatever the outer build was given: flags meant
    // for the host (say `-C target-cpu=native`) must not reach the wasm build, and a
    // build script's environment carries the outer build's settings.
    for var in ["RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "CARGO_BUILD_RUSTFLAGS", "CARGO_BUILD_TARGET", "CARGO_TARGET_DIR", "CARGO_BUILD_TARGET_DIR", "RUSTC_WORKSPACE_WRAPPER"] {
        cmd.env_remove(var);
    }
    // Its own release profile too (lto, one codegen unit), whatever profile overrides
    // the caller set (tests/run.sh sets `CARGO_PROFILE_RELEASE_LTO` for the workspace).
    for (var, _) in std::env::vars_os().filter(|(k, _)| k.to_string_lossy().starts_with("CARGO_PROFILE_")) {
        cmd.env_remove(var);
    }
    // simd128 (fixed-width SIMD, deterministic; relaxed SIMD stays off): keel-core's
    // reference kernels then form their integer lane sums and single-rounding fmas with
    // it (core/src/quant/wasm32.rs), with the same bits as the scalar code.
    let rustflags = match variant {
        Variant::Normal => r#"["-C", "target-feature=+simd128"]"#,
        Variant::Perturbed => r#"["-C", "target-feature=+simd128", "--cfg", "keel_perturb_for_test"]"#,
    };
    cmd.arg("--config").arg(format!("target.{TARGET}.rustflags = {rustflags}"));
    let out = cmd.output().map_err(|e| format!("running {}: {e}", cargo.display()))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let hint = if stderr.contains("target may not be installed") || stderr.contains("can't find crate for `core`") {
            format!("\nthe wasm target is missing: rustup target add {TARGET}")
        } else {
            String::new()
        };
        return Err(format!("building the guest ({}) failed:\n{stderr}{hint}", guest_dir.display()));
    }
    let wasm = target_dir.join(TARGET).join("release").join("keel_wasi_guest.wasm");
    if !wasm.is_file() {
        return Err(format!("the guest build succeeded but {} is missing", wasm.display()));
    }
    Ok(wasm)
}

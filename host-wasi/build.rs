//! Builds the guest (`guest/`) for wasm32-unknown-unknown and hands its path to the
//! crate as `KEEL_GUEST_WASM` (embedded with `include_bytes!`).
//!
//! The guest gets its own target directory beside this build's (`<target>/keel-guest`),
//! so debug and release builds of the host share one guest build.

#[allow(dead_code)] // the perturbed variant is for the tests
#[path = "src/guest_build.rs"]
mod guest_build;

use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cargo = PathBuf::from(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    let guest = manifest.join("guest");
    let core = manifest.join("../core");
    for p in [guest.join("src"), guest.join("Cargo.toml"), guest.join("Cargo.lock"), core.join("src"), core.join("Cargo.toml"), manifest.join("src/guest_build.rs")] {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let target_dir = target_root(&out).join("keel-guest");
    match guest_build::build(&cargo, &guest, &target_dir, guest_build::Variant::Normal) {
        Ok(wasm) => println!("cargo:rustc-env=KEEL_GUEST_WASM={}", wasm.display()),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}

/// The target directory this build runs in: the nearest ancestor of `OUT_DIR` with
/// cargo's `CACHEDIR.TAG`, else `OUT_DIR` itself.
fn target_root(out: &Path) -> PathBuf {
    out.ancestors().find(|d| d.join("CACHEDIR.TAG").is_file()).unwrap_or(out).to_path_buf()
}

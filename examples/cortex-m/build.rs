//! Sizes the arena at build time: parses the model with keel-core, asks keel-core's plan
//! how many bytes the session in src/config.rs needs, and writes them to
//! `$OUT_DIR/arena.rs` (`PLAN_BYTES`, `ARENA_BYTES`) for src/main.rs's `static` arena.
//! Also puts memory.x where cortex-m-rt's link.x finds it.
//!
//! `KEEL_CORTEX_M_MODEL=PATH` embeds that model instead of config::MODEL.
//! `KEEL_ARENA_BYTES=N` sets the arena to N bytes instead of the plan's size; N smaller
//! than the plan fails the build here, with both sizes in the message.

#[path = "src/config.rs"]
#[allow(dead_code)]
mod config;

use keel_core::engine::plan;
use keel_core::gguf::Gguf;
use keel_core::session::SessionConfig;
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-env-changed=KEEL_CORTEX_M_MODEL");
    println!("cargo:rerun-if-env-changed=KEEL_ARENA_BYTES");
    println!("cargo:rerun-if-changed=src/config.rs");
    println!("cargo:rerun-if-changed=memory.x");

    std::fs::copy(dir.join("memory.x"), out_dir.join("memory.x")).unwrap_or_else(|e| fail(&format!("copying memory.x: {e}")));
    println!("cargo:rustc-link-search={}", out_dir.display());

    let model = match std::env::var_os("KEEL_CORTEX_M_MODEL") {
        Some(p) => PathBuf::from(p),
        None => dir.join(config::MODEL),
    };
    let model = model.canonicalize().unwrap_or_else(|e| {
        fail(&format!("the model {}: {e} (tests/cortex_m.sh writes it: cargo run -p keel-test-support --features gguf --bin keel-tiny-llama -- OUT)", model.display()))
    });
    println!("cargo:rerun-if-changed={}", model.display());
    let bytes = std::fs::read(&model).unwrap_or_else(|e| fail(&format!("reading the model {}: {e}", model.display())));
    let gguf = Gguf::parse(&bytes).unwrap_or_else(|e| fail(&format!("{}: {e}", model.display())));
    let cfg = SessionConfig { n_ctx: config::N_CTX, n_batch: config::N_BATCH, n_outputs: config::N_OUTPUTS, n_threads: config::N_THREADS };
    let plan_bytes = plan(&gguf, &cfg).unwrap_or_else(|e| fail(&format!("{}: planning the arena: {e}", model.display()))).total_bytes();

    let arena_bytes = match std::env::var("KEEL_ARENA_BYTES") {
        Err(_) => plan_bytes,
        Ok(v) => v.trim().parse::<usize>().unwrap_or_else(|_| fail(&format!("KEEL_ARENA_BYTES={v:?} is not a byte count"))),
    };
    if arena_bytes < plan_bytes {
        fail(&format!(
            "the arena is {arena_bytes} bytes (KEEL_ARENA_BYTES) but keel-core's plan for {} with n_ctx {} needs {plan_bytes} bytes ({} more)",
            model.display(),
            config::N_CTX,
            plan_bytes - arena_bytes
        ));
    }

    let code = format!(
        "/// Bytes keel-core's plan needs for the model and session in config.rs.\npub const PLAN_BYTES: usize = {plan_bytes};\n/// Bytes of the static arena (the plan's, or KEEL_ARENA_BYTES).\npub const ARENA_BYTES: usize = {arena_bytes};\n/// Bytes of the embedded model.\npub const MODEL_BYTES: usize = {};\n",
        bytes.len()
    );
    let out = out_dir.join("arena.rs");
    std::fs::write(&out, code).unwrap_or_else(|e| fail(&format!("writing {}: {e}", out.display())));
    println!("cargo:rustc-env=KEEL_CORTEX_M_MODEL_PATH={}", model.display());
}

/// Fails the build with `msg` (cargo shows it as the build script's error).
fn fail(msg: &str) -> ! {
    println!("cargo:warning={msg}");
    eprintln!("error: {msg}");
    std::process::exit(1);
}

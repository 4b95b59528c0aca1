#!/usr/bin/env bash
# The test command: fetches the test models if needed, builds, runs every test, then a
# bounded fuzzing run of the model-loading path. Models are cached under $KEEL_MODELS
# (default ~/.cache/keel/models).
set -euo pipefail
cd "$(dirname "$0")/.."
export KEEL_REQUIRE_MODELS=1   # a missing model fails the tests instead of skipping them

echo "== apt mirror derivation"
# ci.sh takes the backports mirror from this machine's own apt sources (no mirror named
# in the repo): its parser against made-up deb822 and one-line sources.
bash dsp-firmware/scripts/apt-mirror-test.sh

echo "== hexagon firmware"
# Hexagon firmware: installs the pinned nightly (dsp-firmware/rust-toolchain.toml) with
# rust-src/llvm-tools and qemu-user (bookworm-backports, apt-get update first;
# idempotent), builds the device and harness ELFs for v68 and v73
# (plus the broken-hvx-zeros builds), runs the HVX kernel tests under qemu-hexagon, and
# prints the packets-per-128-weight-bytes counts.
bash dsp-firmware/ci.sh
# The hexagon-sim device tests (host-linux/tests/hexagon_sim*.rs, sim_no_alloc.rs, probe_cli.rs) then run
# in the workspace tests below against dsp-firmware/target/v68/…/keel-dsp-device; with
# this set, a missing emulator or firmware fails them instead of skipping.
export KEEL_REQUIRE_DSP=1

# The tests build the main workspace without the release profile's cross-crate (thin)
# LTO and debug info: every test binary and every cross build links the whole program,
# and link-time optimization took most of the test build (fresh, on the 2-core Xeon:
# ~15 min for `keel` and the test binaries with them, ~6 without). The bits are the same:
# LTO only moves code across crates (inlining), and Rust gives LLVM no licence to
# contract or reorder float operations. The release build users run and the benchmarks
# measure (`cargo build --release`, `bench/*.sh`) keeps the profile as written; after
# this script, `target/release/keel` is the test build until the next plain build.
# The examples with release profiles of their own (linux-nolibc, cortex-m) and the
# firmware (above) build as their Cargo.toml say.
export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_DEBUG=0

echo "== python packages: the openai client for the keel serve tests (host-linux/tests/serve.rs)"
# From pip's configured index; idempotent (pip skips what is installed). A system Python
# that refuses user packages (PEP 668) gets them with --break-system-packages.
python3 -m pip install -q -r tests/serve/requirements.txt 2>/dev/null \
    || python3 -m pip install -q --break-system-packages -r tests/serve/requirements.txt
command -v curl >/dev/null || { apt-get update -qq && apt-get install -y -qq curl; }

echo "== build"
cargo build --release -p keel-host-linux
# The libcdsprpc test double (target/release/libcdsprpc.so) the `hexagon` FastRPC device
# tests load through KEEL_CDSPRPC (host-linux/tests/fastrpc_*.rs; its DSP is the firmware above).
cargo build --release -p keel-cdsprpc-double
./target/release/keel pull smollm2-135m
./target/release/keel pull gemma3-270m

echo "== examples: library and linux-nolibc (x86_64, aarch64 under qemu) against keel run"
# The tokens of each equal `keel run --temp 0`'s; the no-libc example with a one-byte-too-
# small arena fails to build, naming both sizes (qemu-user: installed by dsp-firmware/ci.sh).
SECONDS=0
bash tests/examples.sh
echo "examples: ${SECONDS} s"

echo "== examples/cortex-m: bare metal under qemu-system-arm (MPS2 AN386) against keel run"
# Writes the tiny llama (test-support's keel-tiny-llama), builds the thumbv7em-none-eabihf
# image with it in flash, runs it under qemu-system-arm (installed with apt-get if absent)
# and compares its tokens with `keel run --temp 0`'s; ~1 minute, most of it the build.
SECONDS=0
bash tests/cortex_m.sh
echo "cortex-m: ${SECONDS} s"

echo "== no_std: keel-core and keel-npu-hal build for targets without std"
rustup target add wasm32-unknown-unknown thumbv7em-none-eabihf >/dev/null
cargo build --release -p keel-core --target wasm32-unknown-unknown
cargo build --release -p keel-core -p keel-npu-hal --target thumbv7em-none-eabihf
# keel-npu-hal's `defmt` feature (defmt::Format on every public type), for defmt firmware.
cargo build --release -p keel-npu-hal --features defmt --target thumbv7em-none-eabihf

echo "== cargo test"
cargo test --release --workspace

echo "== hexagon FastRPC device: the aarch64-unknown-linux-gnu keel and libcdsprpc double under qemu-aarch64"
# Installs Debian's aarch64 cross gcc and arm64 libc (apt-get) if absent; cross-builds keel
# and the double, then every synthetic model through `--device hexagon` (the skel under
# qemu-hexagon) against the x86_64 hexagon-sim and CPU bits, with the call log's balance.
SECONDS=0
bash tests/fastrpc_aarch64.sh
echo "fastrpc aarch64: ${SECONDS} s"

echo "== C ABI: examples/c against keel run, under valgrind"
# Installs cc and valgrind with apt-get if absent; ~10 s once keel-ffi is built.
bash tests/c_abi.sh

echo "== host-wasi: deterministic reference digests (wasmtime, native, aarch64 under qemu)"
# host-wasi is its own workspace (wasmtime takes ~10 minutes to compile on 2 cores):
# plain cargo builds above never compile it. Its target dir is kept outside the clone
# (override with KEEL_WASI_TARGET_DIR) so later CI runs on the same machine reuse it.
rustup target add wasm32-unknown-unknown aarch64-unknown-linux-musl >/dev/null
main_target=${CARGO_TARGET_DIR:-target}
wasi_target=${KEEL_WASI_TARGET_DIR:-$HOME/.cache/keel/target-wasi}
keel_wasi=$wasi_target/release/keel-wasi
(cd host-wasi && CARGO_TARGET_DIR=$wasi_target cargo build --release --locked)
# The guest in wasmtime against tests/golden/reference-digests.json: 6 SmolLM2 prompts
# and the synthetic llama, 32 tokens each (the issue's bar: under 3 minutes).
SECONDS=0
"$keel_wasi" check
echo "wasm reference check: ${SECONDS} s"
# The issue's bar is 3 minutes on an idle runner; a loaded machine can exceed it, so the
# time is reported (and recorded in BENCHMARKS.md), never a reason to fail.
[ "$SECONDS" -lt 180 ] || echo "note: the wasm reference check took ${SECONDS} s (aim: under 180 s on an idle runner)" >&2
# host-wasi's own tests: no imports, fuel invariance, llama.cpp's tokens, and the
# perturbed-kernel guest failing the check at the first differing position (the full
# wasm check just ran above, so it is skipped here).
(cd host-wasi && CARGO_TARGET_DIR=$wasi_target cargo test --release --locked -- --skip committed_digests_match_in_wasmtime)
# Native x86_64 `keel run --reference --json` must give the same tokens and digests.
"$keel_wasi" check --keel "$main_target/release/keel"
# The static aarch64 build under qemu-aarch64 (installed by dsp-firmware/ci.sh above);
# linked with rust-lld (.cargo/config.toml). The first 3 prompts of each model (6 of the
# 12 runs wasmtime and x86_64 just checked): all 12 took 241 s under QEMU on the Intel
# Xeon CI kind, these ~2 minutes; `--prompts` dropped, the check runs all of them.
command -v qemu-aarch64 >/dev/null || { echo "qemu-aarch64 is missing: apt-get install qemu-user" >&2; exit 1; }
cargo build --release -p keel-host-linux --target aarch64-unknown-linux-musl
SECONDS=0
"$keel_wasi" check --keel "$main_target/aarch64-unknown-linux-musl/release/keel" --wrap "qemu-aarch64 -cpu max" --prompts 3
echo "aarch64 (qemu) reference check: ${SECONDS} s"
# NEON kernels: keel-core's kernel tests under qemu-aarch64 (-cpu max: dot-product path;
# -cpu cortex-a53: plain NEON), then one SmolLM2 greedy golden check with the NEON kernels.
bash tests/aarch64.sh
# The static keel (x86_64 and aarch64 musl) in an otherwise empty root (chroot; aarch64
# through a static qemu-aarch64 copied into the root): the same tokens as outside it, and
# the glibc build failing there as the control. ~5 s (the x86_64 musl build is extra).
SECONDS=0
bash tests/empty_root.sh
echo "empty root: ${SECONDS} s"

echo "== fuzz: GGUF parser, tokenizer index, plan and model loader (bounded run)"
# cargo-fuzz needs a nightly: the firmware's pinned one (dsp-firmware/rust-toolchain.toml,
# installed by dsp-firmware/ci.sh above), so the project builds with one nightly.
nightly=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' dsp-firmware/rust-toolchain.toml)
rustc +"$nightly" --version >/dev/null 2>&1 || rustup toolchain install "$nightly" --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
corpus=$(mktemp -d)
(cd core/fuzz && cargo +"$nightly" fuzz run gguf "$corpus" seeds -- -runs=200000 -max_len=65536 -seed=1 2>&1 | tail -n 3)
rm -rf "$corpus"
echo "fuzz: 200000 executions, no crash"

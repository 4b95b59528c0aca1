#!/usr/bin/env bash
# The test command: fetches the test models if needed, builds, runs every test, then a
# bounded fuzzing run of the model-loading path. Models are cached under $KEEL_MODELS
# (default ~/.cache/keel/models).
set -euo pipefail
cd "$(dirname "$0")/.."
export KEEL_REQUIRE_MODELS=1   # a missing model fails the tests instead of skipping them

echo "== hexagon firmware"
# Hexagon firmware: installs nightly rust-src/llvm-tools and qemu-user (bookworm-backports,
# apt-get update first; idempotent), builds the device and harness ELFs for v68 and v73
# (plus the broken-hvx-zeros builds), runs the HVX kernel tests under qemu-hexagon, and
# prints the packets-per-128-weight-bytes counts.
bash dsp-firmware/ci.sh
# The hexagon-sim device tests (host-linux/tests/hexagon_sim*.rs, probe_cli.rs) then run
# in the workspace tests below against dsp-firmware/target/v68/…/keel-dsp-device; with
# this set, a missing emulator or firmware fails them instead of skipping.
export KEEL_REQUIRE_DSP=1

echo "== build"
cargo build --release -p keel-host-linux
./target/release/keel pull smollm2-135m
./target/release/keel pull gemma3-270m

echo "== no_std: keel-core and keel-npu-hal build for targets without std"
rustup target add wasm32-unknown-unknown thumbv7em-none-eabihf >/dev/null
cargo build --release -p keel-core --target wasm32-unknown-unknown
cargo build --release -p keel-core -p keel-npu-hal --target thumbv7em-none-eabihf

echo "== cargo test"
cargo test --release --workspace

echo "== fuzz: GGUF parser, tokenizer index, plan and model loader (bounded run)"
if ! rustup toolchain list | grep -q '^nightly'; then
    echo "the nightly toolchain is missing (cargo-fuzz needs it): rustup toolchain install nightly" >&2
    exit 1
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
corpus=$(mktemp -d)
(cd core/fuzz && cargo +nightly fuzz run gguf "$corpus" seeds -- -runs=200000 -max_len=65536 -seed=1 2>&1 | tail -n 3)
rm -rf "$corpus"
echo "fuzz: 200000 executions, no crash"

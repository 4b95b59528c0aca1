#!/usr/bin/env bash
# The test command: fetches the test models if needed, builds, runs every test, then a
# bounded fuzzing run of the model-loading path. Models are cached under $KEEL_MODELS
# (default ~/.cache/keel/models).
set -euo pipefail
cd "$(dirname "$0")/.."
export KEEL_REQUIRE_MODELS=1   # a missing model fails the tests instead of skipping them

echo "== build"
cargo build --release -p keel-host-linux
./target/release/keel pull smollm2-135m
./target/release/keel pull gemma3-270m

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

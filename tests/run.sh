#!/usr/bin/env bash
# The test command: fetches the test model if needed, builds, and runs every test.
# Models are cached under $KEEL_MODELS (default ~/.cache/keel/models).
set -euo pipefail
cd "$(dirname "$0")/.."
export KEEL_REQUIRE_MODELS=1   # a missing model fails the tests instead of skipping them

cargo build --release -p keel-host-linux
./target/release/keel pull smollm2-135m
./target/release/keel pull gemma3-270m

cargo test --release --workspace

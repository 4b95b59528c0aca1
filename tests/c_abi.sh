#!/usr/bin/env bash
# The C ABI from C (issue 19): builds keel-ffi's static library and examples/c with the
# system C compiler, checks that the C example's greedy tokens equal `keel run --temp 0`'s
# for the same model and prompt, and runs the example and the bad-argument test under
# valgrind (any error or leak fails). Needs ./target/release/keel (tests/run.sh builds it).
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
command -v cc >/dev/null || { $sudo apt-get update -qq && $sudo apt-get install -y -qq gcc libc6-dev >/dev/null; }
command -v valgrind >/dev/null || { $sudo apt-get update -qq && $sudo apt-get install -y -qq valgrind >/dev/null; }

target=${CARGO_TARGET_DIR:-target}
cargo build --release -p keel-ffi
make -s -C examples/c KEEL_LIB="$PWD/$target/release/libkeel_ffi.a"

model=tests/golden/synth/synth-llama-q8_0.gguf
prompt="Once upon a time"
n=16
vg=(valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=all)

# Line 1: the prompt's ids; line 2: the generated ids.
c_ids=$("${vg[@]}" examples/c/keel-c "$model" "$prompt" "$n" --ids)
keel_ids=$("$target/release/keel" run -m "$model" -p "$prompt" -n "$n" --temp 0 --json 2>/dev/null |
  python3 -c 'import json, sys; d = json.load(sys.stdin); print(*d["prompt_tokens"]); print(*d["generated"])')
if [ "$c_ids" != "$keel_ids" ]; then
  printf 'the C example and keel run --temp 0 differ\nC example:\n%s\nkeel run:\n%s\n' "$c_ids" "$keel_ids" >&2
  exit 1
fi
[ "$(sed -n 2p <<<"$c_ids" | wc -w)" -eq "$n" ] || { echo "the C example generated fewer than $n tokens" >&2; exit 1; }
echo "C example: the same $n greedy tokens as keel run --temp 0 (valgrind: no errors, no leaks)"

# The text path (keel_token_to_text) under valgrind too.
"${vg[@]}" examples/c/keel-c "$model" "$prompt" "$n" >/dev/null
"${vg[@]}" examples/c/bad-args "$model"

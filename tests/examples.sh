#!/usr/bin/env bash
# The examples (issue 19): each must generate the same tokens as `keel run --temp 0` on
# the synthetic llama for the prompt and count in examples/linux-nolibc/src/config.rs:
#   - examples/library (the Rust library API on the host);
#   - examples/linux-nolibc, x86_64 natively and aarch64 (static, rust-lld) under
#     qemu-aarch64 -cpu max;
# and the no-libc example built with an arena one byte smaller than keel-core's plan must
# fail at build time, naming both sizes.
#
# Needs ./target/release/keel (cargo build --release -p keel-host-linux), qemu-user and the
# aarch64-unknown-linux-musl target. Fails loudly.
set -euo pipefail
cd "$(dirname "$0")/.."

main_target=$(realpath "${CARGO_TARGET_DIR:-target}")
keel=$main_target/release/keel
model=tests/golden/synth/synth-llama-q8_0.gguf
config=examples/linux-nolibc/src/config.rs
prompt=$(sed -n 's/^pub const PROMPT: &str = "\(.*\)";$/\1/p' "$config")
n=$(sed -n 's/^pub const N_PREDICT: usize = \([0-9]*\);$/\1/p' "$config")
[ -n "$prompt" ] && [ -n "$n" ] || { echo "examples.sh: no PROMPT/N_PREDICT in $config" >&2; exit 1; }
command -v qemu-aarch64 >/dev/null || { echo "examples.sh: qemu-aarch64 is missing: apt-get install qemu-user" >&2; exit 1; }
rustup target add aarch64-unknown-linux-musl >/dev/null
# The no-libc builds get their own target dir (their flags differ from the workspace's).
nolibc_target=$main_target/linux-nolibc
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$keel" run -m "$model" -p "$prompt" -n "$n" --temp 0 --json >"$work/keel.json"

echo "== examples/library"
# The root's target dir and release profile: the keel crates are already built.
(cd examples/library && CARGO_TARGET_DIR=$main_target cargo build --release --locked --quiet)
"$main_target/release/keel-example-library" "$model" "$prompt" "$n" >"$work/library.out" 2>"$work/library.ids"

echo "== examples/linux-nolibc: x86_64, aarch64"
# Its own release profile (lto, panic = "abort"), whatever profile overrides the caller
# set (tests/run.sh sets some for the workspace, which the library above shares).
unset CARGO_PROFILE_RELEASE_LTO CARGO_PROFILE_RELEASE_DEBUG
(cd examples/linux-nolibc && CARGO_TARGET_DIR=$nolibc_target cargo build --release --locked --quiet)
(cd examples/linux-nolibc && CARGO_TARGET_DIR=$nolibc_target cargo build --release --locked --quiet --target aarch64-unknown-linux-musl)
"$nolibc_target/x86_64-unknown-linux-gnu/release/keel-example-linux-nolibc" >"$work/nolibc-x86_64.out"
qemu-aarch64 -cpu max "$nolibc_target/aarch64-unknown-linux-musl/release/keel-example-linux-nolibc" >"$work/nolibc-aarch64.out"

python3 - "$work" <<'PY'
import json, re, sys
work = sys.argv[1]
want = json.load(open(f"{work}/keel.json"))
ids, text = want["generated"], want["text"]
assert ids, "keel run generated nothing"

lib_ids = json.loads(open(f"{work}/library.ids").read().strip().splitlines()[-1])
lib_text = open(f"{work}/library.out", encoding="utf-8").read()
assert lib_ids == ids, f"library: {lib_ids}\n keel run: {ids}"
assert lib_text == text + "\n", f"library text {lib_text!r}\n keel run {text!r}"
print(f"library: {len(ids)} tokens and the text equal keel run's")

for arch in ("x86_64", "aarch64"):
    out = open(f"{work}/nolibc-{arch}.out", encoding="utf-8").read()
    m = re.fullmatch(r"(?s)(.*)\ntokens:((?: \d+)*)\nkernels: (\S+)\narena: (\d+) bytes \(keel-core's plan: (\d+)\)\n", out)
    assert m, f"nolibc {arch}: unexpected output {out!r}"
    got = [int(t) for t in m[2].split()]
    assert got == ids, f"nolibc {arch}: {got}\n keel run: {ids}"
    assert m[1] == text, f"nolibc {arch}: text {m[1]!r}\n keel run {text!r}"
    assert m[4] == m[5], f"nolibc {arch}: arena {m[4]} != plan {m[5]}"
    print(f"linux-nolibc {arch} ({m[3]} kernels): {len(ids)} tokens and the text equal keel run's; arena {m[4]} bytes")
PY

echo "== examples/linux-nolibc: an arena one byte smaller than the plan fails the build"
plan=$(sed -n "s/^arena: [0-9]* bytes (keel-core's plan: \([0-9]*\))$/\1/p" "$work/nolibc-x86_64.out")
small=$((plan - 1))
if (cd examples/linux-nolibc && KEEL_ARENA_BYTES=$small CARGO_TARGET_DIR=$nolibc_target cargo build --release --locked --quiet) >"$work/small.log" 2>&1; then
    echo "examples.sh: the no-libc example built with KEEL_ARENA_BYTES=$small (plan: $plan)" >&2
    exit 1
fi
msg="the arena is $small bytes (KEEL_ARENA_BYTES) but keel-core's plan for"
grep -F "$msg" "$work/small.log" | grep -F "needs $plan bytes" | sed 's/^ *//' | head -n 1 | grep . || {
    cat "$work/small.log" >&2
    echo "examples.sh: the failed build does not state both sizes ($small, $plan)" >&2
    exit 1
}
echo "examples: all checks passed"

#!/usr/bin/env bash
# aarch64 under QEMU (issue 4, item 6): the static `aarch64-unknown-linux-musl` build, the
# kernel test suite (every NEON path against the scalar reference) and one end-to-end
# greedy golden check on SmolLM2 with the default (NEON) kernels.
#
#   1. keel-core's unit tests (quant tests included) under `qemu-aarch64 -cpu max` (NEON
#      with `sdot`) and `-cpu cortex-a53` (plain NEON, no dot product);
#   2. `keel run` (the default kernels; the run must report neon-dotprod) on the first
#      prompt of tests/golden/smollm2-135m-q4_1/greedy.jsonl, 16 greedy tokens, under
#      `-cpu max`: the ids must equal llama.cpp's, and every logits row's SHA-256 must equal the
#      scalar reference's committed digest (tests/golden/reference-digests.json), since
#      the NEON kernels give the reference's bits.
#
# Needs qemu-user (dsp-firmware/ci.sh installs it) and the SmolLM2 Q4_1 model in
# $KEEL_MODELS (default ~/.cache/keel/models; `keel pull smollm2-135m`). Fails loudly.
set -euo pipefail
cd "$(dirname "$0")/.."

target=aarch64-unknown-linux-musl
command -v qemu-aarch64 >/dev/null || { echo "aarch64.sh: qemu-aarch64 is missing: apt-get install qemu-user" >&2; exit 1; }
rustup target add "$target" >/dev/null
models=${KEEL_MODELS:-$HOME/.cache/keel/models}
model=$models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model" ] || { echo "aarch64.sh: $model is missing: keel pull smollm2-135m" >&2; exit 1; }
main_target=${CARGO_TARGET_DIR:-target}
runner_var=CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_RUNNER
cpus=(max cortex-a53)

echo "== aarch64: build (static musl, rust-lld)"
SECONDS=0
cargo test --release -p keel-core --lib --target "$target" --no-run
cargo build --release -p keel-host-linux --target "$target"
echo "aarch64 builds: ${SECONDS} s"

for cpu in "${cpus[@]}"; do
    echo "== aarch64: keel-core unit tests under qemu-aarch64 -cpu $cpu"
    SECONDS=0
    # cargo runs the test binary through the runner (from core/, as natively).
    log=$(mktemp)
    if ! env "$runner_var=qemu-aarch64 -cpu $cpu" cargo test --release -p keel-core --lib --target "$target" -- --nocapture >"$log" 2>&1; then
        grep -E "^test .*FAILED|panicked|^failures:|^    " "$log" | head -n 60 >&2
        echo "aarch64.sh: keel-core tests FAILED under qemu-aarch64 -cpu $cpu (log: $log)" >&2
        exit 1
    fi
    # The SIMD comparisons must have run, with the kernels this CPU should get.
    want_kernels=$([ "$cpu" = max ] && echo neon-dotprod || echo neon)
    grep -q "^note: SIMD kernels: $want_kernels\$" "$log" || { echo "aarch64.sh: -cpu $cpu did not test the $want_kernels kernels (log: $log)" >&2; exit 1; }
    grep -E "^test result" "$log"
    rm -f "$log"
    echo "keel-core tests (-cpu $cpu): ${SECONDS} s"
done

keel=$main_target/$target/release/keel
golden=tests/golden/smollm2-135m-q4_1/greedy.jsonl
prompt=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["prompt"], end="")' "$golden")
# One CPU by default (the unit tests above already hold both NEON variants to the
# reference's bits; each run takes ~30-60 s under QEMU); KEEL_AARCH64_E2E_CPUS="max
# cortex-a53" runs more.
for cpu in ${KEEL_AARCH64_E2E_CPUS:-max}; do
    echo "== aarch64: SmolLM2 Q4_1 greedy golden under qemu-aarch64 -cpu $cpu"
    SECONDS=0
    out=$(qemu-aarch64 -cpu "$cpu" "$keel" run -m "$model" -p "$prompt" -n 16 --temp 0 --json)
    python3 - "$golden" tests/golden/reference-digests.json "$cpu" "$out" <<'EOF'
import json, sys
golden, digests, cpu, out = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
want = json.loads(open(golden).readline())
kernels = out.get("kernels")
expected = "neon-dotprod" if cpu == "max" else "neon"
assert kernels == expected, f"-cpu {cpu}: keel ran with {kernels!r} kernels, not {expected}"
assert out["tokens"] == want["prompt_tokens"], f"-cpu {cpu}: prompt tokens {out['tokens']} != {want['prompt_tokens']}"
got, ref = out["generated"], want["generated"][:16]
assert got == ref, f"-cpu {cpu}: generated {got}\n  llama.cpp {ref}"
runs = [r for m in json.load(open(digests))["models"] if m["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf" for r in m["runs"]]
run = next(r for r in runs if r["tokens"] == want["prompt_tokens"])
rows = out["row_sha256"]
assert len(rows) >= 16, f"-cpu {cpu}: only {len(rows)} logits rows"
bad = [i for i, (a, b) in enumerate(zip(rows, run["row_sha256"])) if a != b]
assert not bad, f"-cpu {cpu}: logits rows {bad} differ from the scalar reference's digests"
print(f"-cpu {cpu} ({kernels}): 16/16 tokens equal llama.cpp's, {min(len(rows), len(run['row_sha256']))} logits rows bit-equal to the reference")
EOF
    echo "greedy golden (-cpu $cpu): ${SECONDS} s"
done
echo "aarch64: all checks passed"

#!/usr/bin/env bash
# Speculative decoding speed (BENCHMARKS.md): `keel bench --draft-sweep` on the SmolLM2
# golden prompts and on the code-editing prompts bench/code-edit.txt (an edit request whose
# answer, begun with its code fence, repeats the given code) and bench/code-edit-prose.txt
# (the earlier one: the model answers with prose and code of its own), for the draft pair (SmolLM2 Q4_0 drafting
# for SmolLM2 Q8_0, both made by `keel quantize` from the cached Q4_1 file) and for
# prompt lookup. Each sweep interleaves plain and speculative runs and prints medians;
# every run must generate the plain greedy tokens or the sweep fails.
#
# usage: bench/speculative.sh [KEEL] [-- extra bench flags]
#   env: THREADS (2), REPS (3), N_GEN (128; for the golden prompts), N_GEN_CODE ("128 256";
#        the code-editing prompts' lengths, each swept: at 128 the answer is the edited code,
#        at 256 it goes on with the model's prose about it), SWEEP_LOOKUP (1..8), SWEEP_DRAFT (1..4),
#        DRAFTERS ("lookup draft"), PROMPTS (all; code: the code-editing prompts only; golden:
#        the golden prompts only), OUT (a scratch dir for the
#        quantized files; default a temp dir, removed at exit)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
keel="${1:-$root/target/release/keel}"
threads="${THREADS:-2}" reps="${REPS:-3}"
models="${KEEL_MODELS:-$HOME/.cache/keel/models}"
src="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -x "$keel" ] || { echo "no keel binary at $keel; cargo build --release -p keel-host-linux" >&2; exit 1; }
[ -f "$src" ] || { echo "no $src; run: keel pull smollm2-135m" >&2; exit 1; }
out="${OUT:-}"
[ -z "$out" ] || mkdir -p "$out"
if [ -z "$out" ]; then
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' EXIT
fi
for ty in Q8_0 Q4_0; do
  [ -f "$out/smollm2.$ty.gguf" ] || "$keel" quantize "$src" "$out/smollm2.$ty.gguf" "$ty" --allow-requantize -t "$threads" >/dev/null
done
target="$out/smollm2.Q8_0.gguf" draft="$out/smollm2.Q4_0.gguf"

echo "# keel speculative decoding sweep: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $threads threads, medians of $reps interleaved runs"
# The prompts: the code-editing prompts, then each golden prompt (a file each).
python3 - "$root/tests/golden/smollm2-135m-q4_1/greedy.jsonl" "$out" <<'PY'
import json, sys
for i, line in enumerate(open(sys.argv[1])):
    open(f"{sys.argv[2]}/prompt{i}.txt", "w").write(json.loads(line)["prompt"])
PY
case "${PROMPTS:-all}" in
  code) prompts=("$root/bench/code-edit.txt" "$root/bench/code-edit-prose.txt") ;;
  golden) prompts=("$out"/prompt*.txt) ;;
  *) prompts=("$root/bench/code-edit.txt" "$root/bench/code-edit-prose.txt" "$out"/prompt*.txt) ;;
esac
for p in "${prompts[@]}"; do
  for drafter in ${DRAFTERS:-lookup draft}; do
    echo
    echo "## $drafter, prompt $(basename "$p"): $(head -c 60 "$p" | tr '\n' ' ')"
    if [ "$drafter" = lookup ]; then how=(--lookup); sweep="${SWEEP_LOOKUP:-1..8}"; else how=(--draft-model "$draft"); sweep="${SWEEP_DRAFT:-1..4}"; fi
    case "$p" in *code-edit*) lengths="${N_GEN_CODE:-128 256}" ;; *) lengths="${N_GEN:-128}" ;; esac
    for n_gen in $lengths; do
      echo "-n $n_gen"
      "$keel" bench -m "$target" --draft-sweep "$sweep" "${how[@]}" -f "$p" -n "$n_gen" -r "$reps" -t "$threads" "${@:2}"
    done
  done
done

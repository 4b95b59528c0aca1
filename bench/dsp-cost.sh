#!/usr/bin/env bash
# The Hexagon DSP cost model (BENCHMARKS.md, "Hexagon DSP: executed packets per token"):
# `keel-dsp-cost` runs `keel run --device hexagon-sim` under qemu-hexagon's translation
# log and prints executed packets per prompt and per generated token by op kind, weight
# bytes per token and estimated tokens/s on a v68 (QCS6490) and a v73 cDSP, for the
# synthetic llama (Q8_0, Q4_0) and SmolLM2-135M (Q8_0, Q4_0 made by `keel quantize` from
# the cached Q4_1 file), each with a 32-token prompt (the issue's batch; QEMU logs one line
# per executed block, so a SmolLM2 model takes ~6 minutes on two cores, P_SMOLLM2=4
# about two). Packet counts do not depend on the machine or its load; only the wall
# time does.
#
# usage: bench/dsp-cost.sh [--json]
#   env: CPU (v68), P_SYNTH (32), P_SMOLLM2 (32), N_GEN (2), MODELS ("synth smollm2"),
#        OUT (a scratch dir for the quantized files; default a temp dir, removed at exit),
#        KEEL_DSP_ELF (the firmware; default what dsp-firmware/ci.sh builds),
#        KEEL_DSP_THREADS (the firmware's hardware threads, default 4; the tables give
#        1 and 4: `for t in 1 4; do KEEL_DSP_THREADS=$t N_GEN=3 bench/dsp-cost.sh; done`)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/target/release"
for b in keel keel-dsp-cost; do
  [ -x "$bin/$b" ] || { echo "no $bin/$b; cargo build --release -p keel-host-linux" >&2; exit 1; }
done
cpu="${CPU:-v68}" n_gen="${N_GEN:-2}"
src="${KEEL_MODELS:-$HOME/.cache/keel/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
out="${OUT:-}"
if [ -z "$out" ]; then
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"
cost() { # model prompt-tokens
  echo "== $1 (-p $2 -n $n_gen, -cpu $cpu)"
  "$bin/keel-dsp-cost" --keel "$bin/keel" --cpu "$cpu" -m "$1" -p "$2" -n "$n_gen" "${@:3}"
}
for set in ${MODELS:-synth smollm2}; do
  case "$set" in
    synth)
      for ty in q8_0 q4_0; do cost "$root/tests/golden/synth/synth-llama-$ty.gguf" "${P_SYNTH:-32}" "$@"; done ;;
    smollm2)
      [ -f "$src" ] || { echo "no $src; run: keel pull smollm2-135m" >&2; exit 1; }
      for ty in Q8_0 Q4_0; do
        [ -f "$out/smollm2.$ty.gguf" ] || "$bin/keel" quantize "$src" "$out/smollm2.$ty.gguf" "$ty" --allow-requantize -t 2 >/dev/null
        cost "$out/smollm2.$ty.gguf" "${P_SMOLLM2:-32}" "$@"
      done ;;
    *) echo "unknown model set $set (synth, smollm2)" >&2; exit 1 ;;
  esac
done

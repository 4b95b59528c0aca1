#!/usr/bin/env bash
# Batches in flight on hexagon-sim (BENCHMARKS.md, "Batches in flight"): the synthetic
# llama's wall time per prompt and per generated token with `--device-in-flight 1` and 2,
# interleaved rounds, at the default batch work (one batch per token) and at 1 MiB
# (`--device-batch-work 1`: the prompt in chunks of 6 tokens with one layer per batch,
# two batches per generated token: the layers, then the logits). Prints every run and
# the medians. QEMU's wall time is the emulator's, not a DSP's: this shows what the
# engine's overlap saves around the device, not how fast a DSP is.
#
# usage: bench/in-flight.sh
#   env: ROUNDS (5), N_GEN (64), MODEL (tests/golden/synth/synth-llama-q8_0.gguf),
#        KEEL_DSP_ELF (the firmware; default what dsp-firmware/ci.sh builds)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
keel="$root/target/release/keel"
[ -x "$keel" ] || { echo "no $keel; cargo build --release -p keel-host-linux" >&2; exit 1; }
model="${MODEL:-$root/tests/golden/synth/synth-llama-q8_0.gguf}"
rounds="${ROUNDS:-5}" n_gen="${N_GEN:-64}"
prompt="The quick brown fox jumps over the lazy dog and then runs far away into the forest where nobody finds it"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "model: $model, -n $n_gen, $rounds interleaved rounds"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for r in $(seq "$rounds"); do
  for work in 32 1; do
    for depth in 1 2; do
      j=$("$keel" run -m "$model" -p "$prompt" -n "$n_gen" --temp 0 --ignore-eos --json --device hexagon-sim \
            --device-in-flight "$depth" --device-batch-work "$work" 2>/dev/null)
      jq -c --arg r "$r" --arg w "$work" '{round: ($r|tonumber), work: ($w|tonumber), depth: .device_in_flight,
        prompt_tokens: (.prompt_tokens|length), prompt_ms: (1000 / .prompt_tps), gen_ms: (1000 / .gen_tps),
        batches_per_token: .device_batches_per_token, digest: .logits_sha256[0:16]}' <<<"$j" | tee -a "$out"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "median ms per token (batch work MiB, depth): prompt, generated"
jq -s -r 'group_by([.work, .depth])[] | sort_by(.prompt_ms) as $p | sort_by(.gen_ms) as $g | ($p|length) as $n
  | "work \($p[0].work) MiB, \($p[0].depth) in flight: prompt \($p[($n/2|floor)].prompt_ms*100|round/100) ms, generated \($g[($n/2|floor)].gen_ms*100|round/100) ms (\($p[0].batches_per_token) batches/token, \($n) runs)"' "$out"

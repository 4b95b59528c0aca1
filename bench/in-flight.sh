#!/usr/bin/env bash
# Batches in flight on hexagon-sim (BENCHMARKS.md, "Batches in flight"): the synthetic
# llama's wall time per prompt and per generated token with `--device-in-flight 1` and 2,
# interleaved rounds, for each placement row:
#   one    one session at the default batch work (one batch per token) and at 1 MiB
#          (`--device-batch-work 1`: the prompt in chunks of 6 tokens with one layer per
#          batch, two batches per generated token: the layers, then the logits), the
#          21-token prompt;
#   split  two sessions splitting the layers (`--device hexagon-sim,hexagon-sim
#          --tensor-split 1,1`: two QEMU processes) and one session with the CPU's layers
#          after it (`-ngl 2 --offload-output off`), an 88-token prompt in 6 chunks of up to 16
#          (`-b 16`): with 2 in flight the prompt chunks run as a pipeline (the first
#          stage on the next chunk while the later stages run this one).
# Prints every run and the medians. QEMU's wall time is the emulator's, not a DSP's:
# this shows what the engine's overlap saves around the device, not how fast a DSP is.
#
# usage: bench/in-flight.sh
#   env: ROWS ("one split"), ROUNDS (5), N_GEN (64),
#        MODEL (tests/golden/synth/synth-llama-q8_0.gguf),
#        KEEL_DSP_ELF (the firmware; default what dsp-firmware/ci.sh builds),
#        KEEL_DSP_THREADS (the firmware's hardware threads; 1 here unless set: the
#        figures in BENCHMARKS.md were taken before the firmware had threads, and with
#        two sessions of 4 threads each the QEMU processes share the host's cores)
set -euo pipefail
export KEEL_DSP_THREADS="${KEEL_DSP_THREADS:-1}"

root="$(cd "$(dirname "$0")/.." && pwd)"
keel="$root/target/release/keel"
[ -x "$keel" ] || { echo "no $keel; cargo build --release -p keel-host-linux" >&2; exit 1; }
model="${MODEL:-$root/tests/golden/synth/synth-llama-q8_0.gguf}"
rounds="${ROUNDS:-5}" n_gen="${N_GEN:-64}" rows="${ROWS:-one split}"
short="The quick brown fox jumps over the lazy dog and then runs far away into the forest where nobody finds it"
long="$short. $short. $short. $short."
# name | flags | prompt
configs=()
for r in $rows; do
  case "$r" in
    one) configs+=("1 session, 32 MiB work|--device hexagon-sim --device-batch-work 32|short"
                   "1 session, 1 MiB work|--device hexagon-sim --device-batch-work 1|short") ;;
    split) configs+=("2 sessions -ts 1,1, -b 16|--device hexagon-sim,hexagon-sim --tensor-split 1,1 -b 16|long"
                     "1 session -ngl 2 + CPU, -b 16|--device hexagon-sim -ngl 2 --offload-output off -b 16|long") ;;
    *) echo "ROWS: unknown row '$r' (one, split)" >&2; exit 2 ;;
  esac
done
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "model: $model, -n $n_gen, $rounds interleaved rounds"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for r in $(seq "$rounds"); do
  for c in "${configs[@]}"; do
    IFS='|' read -r name flags which <<<"$c"
    prompt="$short"; [ "$which" = long ] && prompt="$long"
    for depth in 1 2; do
      # shellcheck disable=SC2086  # $flags is a list of flags
      j=$("$keel" run -m "$model" -p "$prompt" -n "$n_gen" --temp 0 --ignore-eos --json $flags \
            --device-in-flight "$depth" 2>/dev/null)
      jq -c --arg r "$r" --arg c "$name" '{round: ($r|tonumber), config: $c, depth: .device_in_flight,
        prompt_tokens: (.prompt_tokens|length), prompt_ms: (1000 / .prompt_tps), gen_ms: (1000 / .gen_tps),
        batches_per_token: .device_batches_per_token, pipelined: .device_pipelined, digest: .logits_sha256[0:16]}' <<<"$j" | tee -a "$out"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "median (min-max) ms per token (config, depth): prompt, generated"
jq -s -r 'group_by([.config, .depth])[] | sort_by(.prompt_ms) as $p | sort_by(.gen_ms) as $g | ($p|length) as $n
  | def r: .*100|round/100;
  "\($p[0].config), \($p[0].depth) in flight: prompt \($p[($n/2|floor)].prompt_ms|r) (\($p[0].prompt_ms|r)-\($p[-1].prompt_ms|r)) ms, generated \($g[($n/2|floor)].gen_ms|r) (\($g[0].gen_ms|r)-\($g[-1].gen_ms|r)) ms (\($p[0].prompt_tokens) prompt tokens, \($p[0].batches_per_token) batches/token, \($p[0].pipelined) passes pipelined, digests \([.[] | .digest] | unique | join(",")), \($n) runs)"' <(jq -c '.' "$out" | jq -s -c '.[]' | jq -c --slurp 'map(.)[]')

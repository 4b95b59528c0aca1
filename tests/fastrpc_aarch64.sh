#!/usr/bin/env bash
# The `hexagon` FastRPC device in the build boards use: keel and the libcdsprpc test double
# cross-built for aarch64-unknown-linux-gnu (Debian's aarch64 toolchain, installed with
# apt-get if absent) and run under qemu-aarch64 with the arm64 sysroot; the double's DSP is
# the skel under qemu-hexagon as on x86_64. On every synthetic model `keel run --device
# hexagon` gives the tokens and logits bits of the x86_64 `--device hexagon-sim` and CPU
# runs, every call succeeds, every buffer is freed and every mapping unmapped.
# Needs: target/release/keel (x86_64), dsp-firmware/ci.sh's skel and shell, qemu-user.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
if ! command -v aarch64-linux-gnu-gcc >/dev/null || [ ! -e /usr/aarch64-linux-gnu/lib/libc.so.6 ]; then
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null
fi
command -v qemu-aarch64 >/dev/null || { echo "qemu-aarch64 is missing: apt-get install qemu-user (dsp-firmware/ci.sh does)" >&2; exit 1; }
rustup target add aarch64-unknown-linux-gnu >/dev/null
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
cargo build --release -p keel-host-linux -p keel-cdsprpc-double --target aarch64-unknown-linux-gnu

t=${CARGO_TARGET_DIR:-target}
keel_x86=$t/release/keel
keel_a64=$t/aarch64-unknown-linux-gnu/release/keel
double_a64=$(pwd)/$t/aarch64-unknown-linux-gnu/release/libcdsprpc.so
[ -x "$keel_x86" ] || cargo build --release -p keel-host-linux
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The tokens and the logits digest of a `keel run --json`.
fields() { grep -o '"generated":\[[0-9,]*\]\|"logits_sha256":"[0-9a-f]*"' | tr '\n' ' '; }
args=(-p "Hello world" -n 8 --temp 0 --json)

# No library: exit 2 naming it, in this build too.
set +e
out=$(env -u LD_LIBRARY_PATH -u KEEL_CDSPRPC qemu-aarch64 -L /usr/aarch64-linux-gnu "$keel_a64" probe --device hexagon 2>&1)
rc=$?
set -e
[ $rc = 2 ] && grep -q 'libcdsprpc.so' <<<"$out" || { echo "aarch64 keel probe --device hexagon: exit $rc: $out" >&2; exit 1; }

fail=0
for m in tests/golden/synth/*.gguf; do
  name=$(basename "$m" .gguf)
  # Qwen 3.5's F32 beta/alpha matrices: every side runs its Q8_0 copy (a device converts them).
  if [[ $name == *qwen35* ]]; then
    "$keel_x86" quantize "$m" "$tmp/$name.q8_0.gguf" Q8_0 --allow-requantize -t 1 >/dev/null 2>&1
    m=$tmp/$name.q8_0.gguf
  fi
  log=$tmp/$name.log
  dsp=$(KEEL_CDSPRPC="$double_a64" KEEL_CDSPRPC_LOG="$log" qemu-aarch64 -L /usr/aarch64-linux-gnu "$keel_a64" run -m "$m" "${args[@]}" --device hexagon 2>"$tmp/err" | fields) \
    || { echo "$name: aarch64 keel run --device hexagon failed: $(tail -3 "$tmp/err")" >&2; fail=1; continue; }
  sim=$("$keel_x86" run -m "$m" "${args[@]}" --device hexagon-sim 2>/dev/null | fields)
  cpu=$("$keel_x86" run -m "$m" "${args[@]}" --device cpu 2>/dev/null | fields)
  allocs=$(grep -c '^rpcmem_alloc' "$log" || true)
  frees=$(grep -c '^rpcmem_free fd=[0-9]*$' "$log" || true)
  maps=$(grep -c '^fastrpc_mmap' "$log" || true)
  unmaps=$(grep -c '^fastrpc_munmap .* -> 0$' "$log" || true)
  bad=$(grep -c -- '-> [1-9-]' "$log" || true)
  batches=$(grep -c ' batch -> 0$' "$log" || true)
  echo "$name: aarch64 hexagon $dsp| batches $batches, buffers $allocs/$frees freed, mappings $maps/$unmaps unmapped"
  if [ -z "$dsp" ] || [ "$dsp" != "$sim" ] || [ "$dsp" != "$cpu" ]; then
    echo "$name: differs: hexagon-sim $sim| cpu $cpu" >&2
    fail=1
  fi
  if [ "$allocs" = 0 ] || [ "$allocs" != "$frees" ] || [ "$maps" != "$unmaps" ] || [ "$bad" != 0 ] || [ "$batches" = 0 ]; then
    echo "$name: the call log shows a failed call, a leak or no batch: $log" >&2
    cat "$log" >&2
    fail=1
  fi
done
exit $fail

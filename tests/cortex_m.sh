#!/usr/bin/env bash
# examples/cortex-m (issue 19): writes the tiny llama (test-support's keel-tiny-llama) into
# the target dir, builds the bare-metal example for thumbv7em-none-eabihf with that model
# in flash, runs it under qemu-system-arm (MPS2 AN386, Cortex-M4; semihosting) with a
# timeout, and checks its token ids and text against `keel run --temp 0` on the same model,
# prompt and count (examples/cortex-m/src/config.rs). Prints the image's flash and RAM use.
#
# Needs ./target/release/keel (cargo build --release -p keel-host-linux). Installs
# qemu-system-arm with apt-get if absent. Fails loudly.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
if ! command -v qemu-system-arm >/dev/null; then
    # bookworm-backports first where dsp-firmware/ci.sh enabled it (its qemu-utils would
    # otherwise conflict with bookworm's qemu-system-arm).
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-arm >/dev/null 2>&1 ||
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-arm >/dev/null
fi
rustup target add thumbv7em-none-eabihf >/dev/null

main_target=$(realpath "${CARGO_TARGET_DIR:-target}")
keel=$main_target/release/keel
model=$main_target/keel-tiny-llama-q8_0.gguf
config=examples/cortex-m/src/config.rs
prompt=$(sed -n 's/^pub const PROMPT: &str = "\(.*\)";$/\1/p' "$config")
n=$(sed -n 's/^pub const N_PREDICT: usize = \([0-9]*\);$/\1/p' "$config")
n_ctx=$(sed -n 's/^pub const N_CTX: usize = \([0-9]*\);$/\1/p' "$config")
[ -n "$prompt" ] && [ -n "$n" ] && [ -n "$n_ctx" ] || { echo "cortex_m.sh: no PROMPT/N_PREDICT/N_CTX in $config" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== the tiny llama"
cargo run --release --locked --quiet -p keel-test-support --features gguf --bin keel-tiny-llama -- "$model"

echo "== examples/cortex-m: build, run under qemu-system-arm"
# Its own target dir (its own target and link flags) and its own release profile (lto,
# one codegen unit), whatever profile overrides the caller set (tests/run.sh sets some).
cm_target=$main_target/cortex-m
unset CARGO_PROFILE_RELEASE_LTO CARGO_PROFILE_RELEASE_DEBUG
(cd examples/cortex-m && KEEL_CORTEX_M_MODEL=$model CARGO_TARGET_DIR=$cm_target cargo build --release --locked --quiet)
elf=$cm_target/thumbv7em-none-eabihf/release/keel-example-cortex-m
status=0
timeout 120 qemu-system-arm -machine mps2-an386 -cpu cortex-m4 -nographic -monitor none -serial none \
    -semihosting-config enable=on,target=native -kernel "$elf" >"$work/cm.out" 2>"$work/cm.err" || status=$?
if [ "$status" -ne 0 ]; then
    cat "$work/cm.out" "$work/cm.err" >&2
    echo "cortex_m.sh: the example under qemu-system-arm exited with $status (124: timed out)" >&2
    exit 1
fi

"$keel" run -m "$model" -p "$prompt" -n "$n" -c "$n_ctx" --temp 0 --json >"$work/keel.json"

python3 - "$work" "$elf" "$model" <<'PY'
import json, os, re, struct, sys
work, elf, model = sys.argv[1:4]
want = json.load(open(f"{work}/keel.json"))
ids, text = want["generated"], want["text"]
assert ids, "keel run generated nothing"
out = open(f"{work}/cm.out", encoding="utf-8").read()
m = re.fullmatch(
    r"(?s)(.*)\ntokens:((?: \d+)*)\nkernels: (\S+)\narena: (\d+) bytes \(keel-core's plan: (\d+)\)\nmodel: (\d+) bytes\n"
    r"time: prompt (\d+) us, prompt \+ (\d+) tokens (\d+) us .*\nstack: (\d+) bytes used\ndefmt: (\d+) bytes of log frames in RAM\n",
    out,
)
assert m, f"cortex-m: unexpected output {out!r}"
got = [int(t) for t in m[2].split()]
assert got == ids, f"cortex-m: {got}\n keel run: {ids}"
assert m[1] == text, f"cortex-m: text {m[1]!r}\n keel run {text!r}"
arena, plan, model_bytes, stack, defmt = int(m[4]), int(m[5]), int(m[6]), int(m[10]), int(m[11])
assert arena == plan, f"cortex-m: arena {arena} != plan {plan}"
assert model_bytes == os.path.getsize(model), "cortex-m: the embedded model is not the generated one"
assert defmt > 0, "cortex-m: defmt logged nothing"

# The image: allocated sections of the ELF (32-bit little-endian section headers).
b = open(elf, "rb").read()
shoff, = struct.unpack_from("<I", b, 0x20)
shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x2E)
secs = [struct.unpack_from("<IIIIIIIIII", b, shoff + i * shentsize) for i in range(shnum)]
strtab = secs[shstrndx][4]
def name(s): return b[strtab + s[0]:b.index(b"\0", strtab + s[0])].decode()
SHF_ALLOC, NOBITS = 2, 8
flash = sum(s[5] for s in secs if s[2] & SHF_ALLOC and s[1] != NOBITS and s[5] and name(s) != ".defmt")
ram = sum(s[5] for s in secs if s[2] & SHF_ALLOC and (s[1] == NOBITS or name(s) == ".data"))
print(f"cortex-m ({m[3]} kernels): {len(ids)} tokens and the text equal keel run's")
print(f"cortex-m image: {flash} bytes of flash, {flash - model_bytes} without the {model_bytes}-byte model; "
      f"RAM: {ram} bytes static (arena {arena}) + {stack} bytes of stack used; "
      f"{m[8]} tokens in {int(m[9]) / 1e6:.2f} s under QEMU; defmt: {defmt} bytes")
PY
echo "cortex-m: all checks passed"

#!/usr/bin/env bash
# Install (idempotently), build and test keel's Hexagon firmware under qemu-hexagon.
#   bash dsp-firmware/ci.sh
# Steps: the dated nightly of rust-toolchain.toml with rust-src + llvm-tools;
# qemu-user (bookworm-backports 10.x for v68/v73, else bookworm's 7.2 for v67);
# build the harness and device ELFs per CPU (`target/<cpu>/…/keel-dsp-harness`,
# `…/keel-dsp-device`), plus `broken-hvx-zeros` builds (`target/<cpu>-broken/…`);
# run the qemu-tests crate against each; print the packets-per-128-weight-bytes of
# the HVX inner loops from llvm-objdump.
# The host's hexagon-sim device tests (cargo test -p keel-host-linux) use the v68
# device ELFs built here; tests/run.sh runs them with KEEL_REQUIRE_DSP=1.
# Env: KEEL_DSP_TARGET_DIR (default dsp-firmware/target).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
target=hexagon-unknown-none-elf
td=${KEEL_DSP_TARGET_DIR:-$here/target}
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo

echo "== toolchain"
# The dated nightly named in rust-toolchain.toml, with rust-src (-Zbuild-std) and
# llvm-tools (llvm-objdump), downloaded once from rustup's server; later runs find it
# installed and download nothing. Every cargo/rustc call below names it.
toolchain=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
[ -n "$toolchain" ] || { echo "no channel in $here/rust-toolchain.toml" >&2; exit 1; }
have=$(rustup component list --installed --toolchain "$toolchain" 2>/dev/null || true)
if ! grep -q '^rust-src$' <<<"$have" || ! grep -q '^llvm-tools' <<<"$have"; then
  rustup toolchain install "$toolchain" --profile minimal --component rust-src,llvm-tools
fi
rustc +"$toolchain" --version

echo "== qemu-hexagon"
if ! (qemu-hexagon -cpu help 2>/dev/null || true) | grep -qw v73; then
  export DEBIAN_FRONTEND=noninteractive
  if grep -q 'VERSION_CODENAME=bookworm' /etc/os-release; then
    src=/etc/apt/sources.list.d/bookworm-backports.sources
    if ! bash scripts/apt-mirror.sh bookworm-backports >/dev/null 2>&1; then
      # The mirror this machine already uses for bookworm (deb822 or one-line sources;
      # scripts/apt-mirror-test.sh tests the parsing).
      uri=$(bash scripts/apt-mirror.sh bookworm) || { echo "ci.sh: no bookworm apt source configured to take the backports mirror from" >&2; exit 1; }
      printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uri" | $sudo tee "$src" >/dev/null
    fi
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq -t bookworm-backports qemu-user >/dev/null || $sudo apt-get install -y -qq qemu-user >/dev/null
  else
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq qemu-user >/dev/null
  fi
fi
qemu-hexagon --version | head -1
cpus=$( (qemu-hexagon -cpu help || true) | tr -s ' \t' '\n' | grep -E '^v[0-9]+$' | tr '\n' ' ')
echo "qemu-hexagon CPUs: $cpus"

# name:target-cpu:hvx-feature
configs=()
if [[ " $cpus " == *" v73 "* ]]; then configs+=("v68:hexagonv68:hvxv68" "v73:hexagonv73:hvxv73")
elif [[ " $cpus " == *" v68 "* ]]; then configs+=("v68:hexagonv68:hvxv68")
else configs+=("v67:hexagonv67:hvxv66"); fi

build() { # name cpu hvx [features]
  local flags="-C target-cpu=$2 -C target-feature=+$3,+hvx-length128b"
  RUSTFLAGS="$flags" cargo +"$toolchain" build -q --release --target $target -Zbuild-std=core \
    --target-dir "$td/$1" ${4:+--features $4}
}

# The zeros build shares the plain build's target dir (they differ in a feature only, so
# build-std's core, compiler_builtins and the dependencies compile once, ~20 s of each
# ~45 s build); it comes first, and its ELFs are copied to target/<cpu>-broken before the
# plain build (which cargo then finishes from what is fresh) puts its own in place.
copy_elfs() { # from-dir to-dir
  mkdir -p "$2"
  for f in keel-dsp-harness keel-dsp-device keel-dsp-shell; do cp "$1/$f" "$2/$f"; done
}

packets_out=""
objdump=${LLVM_OBJDUMP:-$(rustc +"$toolchain" --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/bin/llvm-objdump}
for c in "${configs[@]}"; do
  IFS=: read -r name cpu hvx <<<"$c"
  echo "== build $name ($cpu, $hvx)"
  build "$name" "$cpu" "$hvx" broken-hvx-zeros
  copy_elfs "$td/$name/$target/release" "$td/$name-broken/$target/release"
  build "$name" "$cpu" "$hvx"
  # The FastRPC skel (libkeel_skel.so): built, linked shared, exports and imports checked.
  # The double of libcdsprpc (host-linux/cdsprpc-double) runs it under qemu-hexagon through
  # keel-dsp-shell, and the zeros build to check the host refuses it.
  # (The zeros skel first as well: both build in target/skel-<cpu>, see skel.sh.)
  bash scripts/skel.sh "$name-broken" "$cpu" "$hvx" "$toolchain" "$td" broken-hvx-zeros
  bash scripts/skel.sh "$name" "$cpu" "$hvx" "$toolchain" "$td"
  elf="$td/$name/$target/release/keel-dsp-harness"
  echo "== test under qemu-hexagon -cpu $name"
  (cd qemu-tests && KEEL_DSP_ELF="$elf" KEEL_DSP_ELF_BROKEN="$td/$name-broken/$target/release/keel-dsp-harness" \
    KEEL_QEMU_CPU="$name" cargo +"$toolchain" test --release --target-dir "$td/host")
  packets_out+="$(LLVM_OBJDUMP="$objdump" scripts/packets.sh "$elf" | sed "s/^/$name /")"$'\n'
done
echo "== packets per 128 weight bytes (bound: one vector load per packet = 1.0)"
printf '%s' "$packets_out"

#!/usr/bin/env bash
# Builds keel's FastRPC skel for one Hexagon CPU and checks its symbols:
#   scripts/skel.sh NAME TARGET-CPU HVX-FEATURE TOOLCHAIN TARGET-DIR [FEATURES]
# The firmware crate's skel (skel/, a PIC static library) is linked into a shared object
# with ld.lld (`rust-lld -flavor gnu -shared`, the toolchain's own linker), exporting only
# the entry points of skel/exports.ver. Then: its dynamic exports must be exactly those,
# and its undefined symbols exactly the functions skel/src/lib.rs declares in its
# `extern "C"` block (the DSP image's dspqueue/HAP/QuRT functions), nothing else.
set -euo pipefail
name=$1 cpu=$2 hvx=$3 toolchain=$4 td=$5
here=$(cd "$(dirname "$0")/.." && pwd)
target=hexagon-unknown-none-elf
bin=$(rustc +"$toolchain" --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/bin
out="$td/skel-$name/$target/release"
# Built in target/skel-<cpu> whatever the features (a NAME ending in -broken builds there
# too: build-std's core and the dependencies compile once for both), linked into
# target/skel-NAME right after its build, while the archive is this build's.
build_dir="$td/skel-${name%-broken}"
(cd "$here/skel" && RUSTFLAGS="-C target-cpu=$cpu -C target-feature=+$hvx,+hvx-length128b -C relocation-model=pic" \
  cargo +"$toolchain" build -q --release --target $target -Zbuild-std=core --target-dir "$build_dir" ${6:+--features $6})
mkdir -p "$out"
"$bin/rust-lld" -flavor gnu -shared --gc-sections --version-script "$here/skel/exports.ver" -soname libkeel_skel.so \
  -o "$out/libkeel_skel.so" --whole-archive "$build_dir/$target/release/libkeel_dsp_skel.a"

exports=$("$bin/llvm-nm" -D --defined-only "$out/libkeel_skel.so" | awk '{print $3}' | sort | tr '\n' ' ')
want_exports=$(grep -o 'keel_skel_[a-z_]*' "$here/skel/exports.ver" | sort -u | tr '\n' ' ')
imports=$("$bin/llvm-nm" -D --undefined-only "$out/libkeel_skel.so" | awk '{print $2}' | sort | tr '\n' ' ')
want_imports=$(sed -n '/^extern "C" {/,/^}/p' "$here/skel/src/lib.rs" | grep -o 'fn [A-Za-z_0-9]*' | awk '{print $2}' | sort | tr '\n' ' ')
type=$("$bin/llvm-readobj" -h "$out/libkeel_skel.so" | awk '/Type:/ {print $2} /Machine:/ {print $2}' | tr '\n' ' ')
echo "skel $name: $out/libkeel_skel.so ($type)"
echo "  exports: $exports"
echo "  imports: $imports"
fail=0
[ "$type" = "SharedObject EM_HEXAGON " ] || { echo "skel $name: not a Hexagon shared object: $type" >&2; fail=1; }
[ "$exports" = "$want_exports" ] || { echo "skel $name: exports differ from skel/exports.ver ($want_exports)" >&2; fail=1; }
[ "$imports" = "$want_imports" ] || { echo "skel $name: undefined symbols differ from the declared set ($want_imports)" >&2; fail=1; }
exit $fail

#!/usr/bin/env bash
# Packets per 128 weight bytes in the main hardware loop of each HVX kernel,
# from `llvm-objdump -d` of the firmware ELF. The loop body runs from the
# target of the first `loop0(ADDR, …)` to the packet ending in `:endloop0`;
# weight bytes = 128 × the vector loads (`… = vmem(…)`) in it.
# Usage: scripts/packets.sh ELF [kernel-name …]   (default: the q8_0 lane sums, q8_0/q4_0/iq4_nl block sums)
set -euo pipefail
elf=$1; shift
kernels=("$@")
[ ${#kernels[@]} -gt 0 ] || kernels=(q8_0_lane_sums q8_0_block_sums q4_0_block_sums iq4_nl_block_sums)
objdump=${LLVM_OBJDUMP:-$(rustc +nightly --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/bin/llvm-objdump}
dis=$("$objdump" -d --no-show-raw-insn "$elf")
for k in "${kernels[@]}"; do
  echo "$dis" | awk -v k="$k" '
    /^[0-9a-f]+ </ { infn = index($0, k ">") > 0 }
    !infn { next }
    !start && match($0, /loop0\(0x[0-9a-f]+/) { start = substr($0, RSTART + 8, RLENGTH - 8); next }
    start && !inloop && $1 == start ":" { inloop = 1 }
    inloop {
      if (index($0, "{")) packets++
      if ($0 ~ /v[0-9]+(\.cur|\.tmp)? = vmem\(/) loads++
      if (index($0, "vrmpy")) mpys++
      if (index($0, ":endloop0")) { inloop = 0; done = 1; infn = 0 }
    }
    END {
      if (!done || loads == 0) { printf "%s: main loop not found\n", k; exit 1 }
      printf "%s: %d packets, %d vector loads (%d weight bytes), %d vrmpy: %.3f packets per 128 weight bytes\n",
             k, packets, loads, loads * 128, mpys, packets / loads
    }'
done

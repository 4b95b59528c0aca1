#!/usr/bin/env python3
"""keel builds side by side: `keel bench` of each in interleaved rounds (the first build,
the second, ..., then again), with every run's figures and, per test, each build's median
and its ratio to the first build's.

The way to measure a change of keel's speed: copy the binary before and after it
(`cp target/release/keel /tmp/keel-before`, rebuild, `cp ... /tmp/keel-after`) and run
them here, alternating in the same minutes; a VM's speed moves from minute to minute, so
two builds timed a few minutes apart say little. Each run is
  BIN bench -m MODEL -t THREADS --json BENCH_ARGS
with BENCH_ARGS after `--` (default: -p 0 -n 128 -r 3 --roofline, the decode test and its
bandwidth bound). For every test a run reports (pp512, tg128, ...) it prints t/s and,
with --roofline, the fraction of the bound and the read pass's GB/s.

Besides each build's median, every build gets the median of its rounds' ratios to the
first build's run of the same round (`paired`: the rounds' runs are seconds apart, so the
ratio of a pair moves less with the machine's minutes than either run). With --roofline
and two or more threads each run also reports the pool's hand-off (`keel bench`'s
hand_off_after), and the rounds are also split by it: on a shared VM the threads run on
two hardware threads of one core in some minutes (hand-offs under 250 ns) and on two
cores in others (400-600 ns on the two-vCPU Zen 5), and two-thread decode compares
differently in each (BENCHMARKS.md).

Examples:
  python3 bench/ab.py -m gemma3-270m /tmp/keel-before /tmp/keel-after
  python3 bench/ab.py -r 5 -t 2 --isa avx2 /tmp/keel-before /tmp/keel-after -- -p 512 -n 0 -r 3

--isa avx2 or avx512 runs every build with a smaller machine's kernel set (KEEL_ISA, as
bench/speed-set.py --isa): an AVX2-only CPU's kernels, or Zen 4's, on the CPU at hand.
Speed is never a test: this is a tool for people, not part of CI.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchlib import ISA_KEEL, cpu_description, hand_offs, log

# Options the script sets itself; BENCH_ARGS may not give them again.
OWN_FLAGS = {"-m", "--model", "-t", "--threads", "--json"}
DEFAULT_BENCH_ARGS = ["-p", "0", "-n", "128", "-r", "3", "--roofline"]


def parse_args(argv):
    own, bench_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, None)
    ap = argparse.ArgumentParser(prog="bench/ab.py", description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter, usage="%(prog)s [options] BIN [BIN ...] [-- BENCH_ARGS]")
    ap.add_argument("bins", nargs="+", metavar="BIN", help="keel binaries to compare (the first is the baseline of the ratios)")
    ap.add_argument("-r", "--rounds", type=int, default=3, help="interleaved rounds (default 3; the medians are over them)")
    ap.add_argument("-t", "--threads", type=int, default=1, help="keel bench -t (default 1)")
    ap.add_argument("-m", "--model", default="smollm2-135m", help="keel bench -m: a .gguf file or a known name (default smollm2-135m)")
    ap.add_argument("--isa", choices=("native", "avx2", "avx512"), default="native", help="kernel set of every run: native (default), avx2 (KEEL_ISA=avx2_fma) or avx512 (AVX-512 without AVX512-FP16)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout (every run's records and the medians) instead of the tables")
    a = ap.parse_args(own)
    if a.rounds < 1:
        ap.error(f"-r {a.rounds}: give at least 1 round")
    if a.threads < 1:
        ap.error(f"-t {a.threads}: give at least 1 thread")
    for b in a.bins:
        p = Path(b)
        if not p.is_file() or not os.access(p, os.X_OK):
            ap.error(f"BIN {b}: not an executable file (copy a build, e.g. cp target/release/keel /tmp/keel-before)")
    if len(set(map(str, (Path(b).resolve() for b in a.bins)))) != len(a.bins):
        ap.error("the same binary is named twice: give each build once")
    a.bench_args = DEFAULT_BENCH_ARGS if bench_args is None else bench_args
    clash = sorted(f for f in a.bench_args if f.split("=")[0] in OWN_FLAGS)
    if clash:
        ap.error(f"BENCH_ARGS {' '.join(clash)}: set by this script; use its own -m, -t (and --json)")
    if a.isa != "native" and os.environ.get("KEEL_ISA", "").strip():
        ap.error(f"KEEL_ISA={os.environ['KEEL_ISA']} and --isa {a.isa} both choose keel's kernels; unset KEEL_ISA")
    return a


def bench(binary, a, env):
    """One `keel bench --json` run's records, or exits naming the build and keel's error."""
    cmd = [binary, "bench", "-m", a.model, "-t", str(a.threads), "--json", *a.bench_args]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if p.returncode != 0:
        tail = "\n".join(p.stderr.strip().splitlines()[-15:])
        sys.exit(f"ab: {' '.join(cmd)} failed (exit {p.returncode}):\n{tail}")
    try:
        records = json.loads(p.stdout)
    except json.JSONDecodeError as e:
        sys.exit(f"ab: {binary} bench --json printed no JSON ({e}); is {binary} a keel build?")
    return records if isinstance(records, list) else [records]


# A run whose median hand-off is at least this ran its threads on two cores (below: on
# two hardware threads of one core).
TWO_CORES_HAND_OFF_S = 250e-9


def minutes(r):
    """Where a record's threads ran, by its median hand-off: 'one core', 'two cores', or
    None where the record has no hand-off (one thread, or no --roofline)."""
    h = [x for x in r.get("hand_off_after") or [] if x > 0]
    if not h:
        return None
    return "two cores" if statistics.median(h) >= TWO_CORES_HAND_OFF_S else "one core"


def describe(r):
    s = f"{r['test']} {r['tps']:.1f} t/s"
    if "fraction_of_bound" in r:
        s += f" ({100 * r['fraction_of_bound']:.1f}% of the bound, read pass {r.get('read_bytes_per_s', 0) / 1e9:.1f} GB/s"
        if hand_offs(r):
            s += f", hand-off {hand_offs(r)}"
        s += ")"
    return s


def paired(runs, t, base, b, keep=lambda r, q: True):
    """Per round where `base` and `b` both ran test `t` (and `keep(base's record, b's
    record)` holds), b's t/s over base's; their median (None for no round) and count."""
    by = {}
    for x in runs:
        for r in x["records"]:
            if r["test"] == t:
                by.setdefault(x["round"], {})[x["bin"]] = r
    ratios = [p[b]["tps"] / p[base]["tps"] for p in by.values() if base in p and b in p and p[base]["tps"] > 0 and keep(p[base], p[b])]
    return (statistics.median(ratios) if ratios else None), len(ratios)


def main():
    a = parse_args(sys.argv[1:])
    env = dict(os.environ)
    if a.isa != "native":
        env["KEEL_ISA"] = ISA_KEEL[a.isa]
    runs = []
    for rnd in range(1, a.rounds + 1):
        for b in a.bins:
            log(f"round {rnd}/{a.rounds}: {b}")
            recs = bench(b, a, env)
            runs.append({"round": rnd, "bin": b, "records": recs})
            if not a.json:
                print(f"round {rnd} {b}: " + "; ".join(describe(r) for r in recs), flush=True)
    tests = list(dict.fromkeys(r["test"] for x in runs for r in x["records"]))
    medians = {}
    for t in tests:
        medians[t] = {}
        for b in a.bins:
            tps = [r["tps"] for x in runs if x["bin"] == b for r in x["records"] if r["test"] == t]
            frac = [r["fraction_of_bound"] for x in runs if x["bin"] == b for r in x["records"] if r["test"] == t and "fraction_of_bound" in r]
            medians[t][b] = {"tps": tps, "median_tps": statistics.median(tps) if tps else None, "median_fraction_of_bound": statistics.median(frac) if frac else None, "paired": paired(runs, t, a.bins[0], b)[0]}
    # The runs by where the threads ran; a round's pair counts where both its runs did so.
    kinds = [k for k in ("one core", "two cores") if any(minutes(r) == k for x in runs for r in x["records"])]
    split = {}
    for t in tests:
        for k in kinds:
            for b in a.bins:
                tps = [r["tps"] for x in runs if x["bin"] == b for r in x["records"] if r["test"] == t and minutes(r) == k]
                ratio_k, rounds_k = paired(runs, t, a.bins[0], b, lambda p, q, k=k: minutes(p) == minutes(q) == k)
                split.setdefault(t, {}).setdefault(k, {})[b] = {"runs_in_minutes": len(tps), "median_tps": statistics.median(tps) if tps else None, "paired": ratio_k, "rounds": rounds_k}
    head = {"cpu": cpu_description(), "model": a.model, "threads": a.threads, "isa": a.isa, "bench_args": a.bench_args, "rounds": a.rounds}
    if a.json:
        print(json.dumps({**head, "runs": runs, "medians": medians, "by_minutes": split}))
        return
    ratio = lambda v: "-" if v is None else f"{v:.3f}x"
    print(f"\nCPU {head['cpu']}; model {a.model}; {a.threads} thread(s); kernel set {a.isa}; {a.rounds} rounds of keel bench {' '.join(a.bench_args)}\n")
    print("| test | build | rounds (t/s) | median | vs the first | paired | median of the bound |")
    print("|---|---|---|---|---|---|---|")
    for t in tests:
        base = medians[t][a.bins[0]]["median_tps"]
        for b in a.bins:
            m = medians[t][b]
            vs = ratio(m["median_tps"] / base) if m["median_tps"] and base else "-"
            fb = f"{100 * m['median_fraction_of_bound']:.1f}%" if m["median_fraction_of_bound"] is not None else "-"
            print(f"| {t} | {b} | {', '.join(f'{x:.1f}' for x in m['tps'])} | {m['median_tps']:.1f} | {vs} | {ratio(m['paired'])} | {fb} |")
    if kinds:
        print(f"\nBy where the threads ran (the pool's hand-off under or over {TWO_CORES_HAND_OFF_S * 1e9:.0f} ns): each build's median over its runs of that kind, and its paired ratio over the rounds whose two runs were both of it\n")
        print("| test | threads on | build | runs | median | paired (rounds) |")
        print("|---|---|---|---|---|---|")
        for t in tests:
            for k in kinds:
                for b in a.bins:
                    m = split[t][k][b]
                    med = "-" if m["median_tps"] is None else f"{m['median_tps']:.1f}"
                    print(f"| {t} | {k} | {b} | {m['runs_in_minutes']} | {med} | {ratio(m['paired'])} ({m['rounds']}) |")


if __name__ == "__main__":
    main()

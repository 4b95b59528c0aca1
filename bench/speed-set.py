#!/usr/bin/env python3
"""Speed II's acceptance set (issue 23) in one command: keel beside llama.cpp on the
issue's models, in interleaved rounds, with each bar's median and verdict.

Each round runs, in this order (so every pair of runs being compared is a minute apart,
and each measurement's rounds are spread over the whole set):
  1. every model: pp512 and tg128 beside llama-bench (bench/compare-llama-cpp.sh -r 1);
  2. every depth model at depth 4096, in keel's default batch arithmetic and with
     `--batches llama-cpp` (llama.cpp's own, the one llama-bench measures);
  3. every model: `keel bench -p 0 -n 128 -r 3 --roofline` at 1 thread and at -t.
Then it prints, per bar, the rounds' figures, their median and whether the median meets
the issue's bar (1: pp and tg >= 1.3x; 2: default mode, pp and tg >= 1.2x; 3: tg >= 85%
of the roofline bound at 1 and -t threads), and the raw output of every run.

Models: a .gguf path, a known name (`keel pull` fetches it), or NAME@TYPE: NAME's file
requantized to TYPE by `keel quantize --allow-requantize`, written once into the models
directory ($KEEL_MODELS, default ~/.cache/keel/models) and reused. The defaults are the
issue's: SmolLM2-135M Q4_1 as published, its Q8_0 and Q4_0 requantizations, Gemma 3 270M
Q4_K_M; at depth SmolLM2 Q4_0 and Gemma 3.

--isa avx2 or avx512 runs both keel and llama.cpp with a smaller machine's instruction set
on this CPU (bench/compare-llama-cpp.sh --isa): the kernels of an AVX2-only CPU, or of
Zen 4, measured on whatever machine is at hand. A proxy for the kernels, not for that
machine (its caches, memory and instruction costs differ); the report names the set.

keel is built once at the start and every run takes a copy of that binary
(bench/compare-llama-cpp.sh --keel), so the set measures one build even if the checkout
changes while it runs; the report names the commit it was built from.

llama.cpp is built on first use by bench/compare-llama-cpp.sh (~5 minutes). The machine's
speed moves from minute to minute; the rounds are what make a median worth reading.
Speed is never a test: this is a tool for people, not part of CI.
"""

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import ISA_KEEL, cpu_description, hand_offs, log

ROOT = Path(__file__).resolve().parent.parent
BUILT = ROOT / "target" / "release" / "keel"
# The set's keel: a copy of the build made at its start (`main`), so that every run of the
# set is the same binary even if the checkout is rebuilt meanwhile.
KEEL = BUILT
COMPARE = ROOT / "bench" / "compare-llama-cpp.sh"

BAR_A1, BAR_A2, BAR_A3 = 1.3, 1.2, 0.85

# Every finished run: {round, bar, label, model, ...raw output}.
RUNS = []


def run(cmd, what, env=None):
    """Runs `cmd` (in `env`, default this process's); its stdout, or exits naming the step
    and showing the end of its stderr (after the raw output of the runs finished before
    it, so that a long set's work is not lost)."""
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if p.returncode != 0:
        if RUNS:
            print(f"speed-set: the {len(RUNS)} runs finished before the failure, raw:", file=sys.stderr)
            for x in RUNS:
                print(json.dumps(x), file=sys.stderr)
        tail = "\n".join(p.stderr.strip().splitlines()[-15:])
        sys.exit(f"speed-set: {what} failed (exit {p.returncode}): {' '.join(map(str, cmd))}\n{tail}")
    return p.stdout


def models_dir():
    d = os.environ.get("KEEL_MODELS")
    return Path(d) if d else Path.home() / ".cache" / "keel" / "models"


def resolve(spec):
    """A model spec's file path (fetching or requantizing it first where needed)."""
    name, _, ty = spec.partition("@")
    if Path(name).suffix == ".gguf":
        src = Path(name)
        if not src.is_file():
            sys.exit(f"speed-set: model {name}: no such file (give a .gguf path, a known name such as smollm2-135m, or NAME@TYPE)")
    else:
        src = Path(run([KEEL, "pull", name], f"keel pull {name}").strip().splitlines()[-1])
    if not ty:
        LABELS[str(src)] = name if Path(name).suffix != ".gguf" else src.name
        return src
    out = models_dir() / f"{src.stem}.requantized-{ty.upper()}.gguf"
    if not out.is_file():
        log(f"requantizing {src.name} to {ty.upper()} -> {out}")
        run([KEEL, "quantize", "--allow-requantize", src, out, ty.upper()], f"keel quantize {src} {ty}")
    LABELS[str(out)] = f"{name if Path(name).suffix != '.gguf' else src.name}@{ty.upper()}"
    return out


LABELS = {}


def short(path):
    """The model as the command line named it (a known name, NAME@TYPE, or the file's name)."""
    return LABELS.get(str(path), Path(path).name)


def pct(x):
    return f"{100 * x:.0f}%"


def ratio(x):
    return f"{x:.2f}x"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-r", "--rounds", type=int, default=3, help="interleaved rounds (default 3; the bars take the median)")
    ap.add_argument("-t", "--threads", type=int, default=2, help="threads of the side-by-side runs and the second roofline run (default 2)")
    ap.add_argument("-d", "--depth", type=int, default=4096, help="KV positions before the depth runs (default 4096)")
    ap.add_argument("--models", nargs="+", metavar="MODEL", default=["smollm2-135m", "smollm2-135m@Q8_0", "smollm2-135m@Q4_0", "gemma3-270m"], help="models of bars 1 and 3")
    ap.add_argument("--depth-models", nargs="+", metavar="MODEL", default=["smollm2-135m@Q4_0", "gemma3-270m"], help="models of bar 2")
    ap.add_argument("--only", default="1,2,3", help="which bars to measure, e.g. 2 or 1,3 (default 1,2,3)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout (every run's raw output, the medians, the verdicts) instead of the tables")
    ap.add_argument("--strict", action="store_true", help="exit 3 when a measured bar's median is not met")
    ap.add_argument("--isa", choices=("native", "avx2", "avx512"), default="native", help="instruction set of both: native (default), avx2 (an AVX2-only CPU's kernels: keel with KEEL_ISA=avx2_fma, llama.cpp built for AVX2) or avx512 (AVX-512 without AVX512-FP16, Zen 4's); see bench/compare-llama-cpp.sh --help")
    a = ap.parse_args()
    only = {x.strip() for x in a.only.split(",")}
    if a.rounds < 1 or a.threads < 1 or a.depth < 0 or not only <= {"1", "2", "3"}:
        ap.error("--rounds and --threads must be at least 1, --depth at least 0, --only a list of 1, 2, 3")
    if a.isa != "native" and os.environ.get("KEEL_ISA", "").strip():
        ap.error(f"KEEL_ISA={os.environ['KEEL_ISA']} and --isa {a.isa} both choose keel's kernels; unset KEEL_ISA")
    # keel's own runs (bar 3) take the kernel set --isa names, as compare-llama-cpp.sh does.
    keel_env = dict(os.environ)
    if a.isa != "native":
        keel_env["KEEL_ISA"] = ISA_KEEL[a.isa]

    log("building keel (cargo build --release -p keel-host-linux)")
    run(["cargo", "build", "--release", "-q", "-p", "keel-host-linux"], "cargo build")
    global KEEL
    keep = tempfile.mkdtemp(prefix="keel-speed-set-")
    atexit.register(shutil.rmtree, keep, True)
    KEEL = Path(keep) / "keel"
    shutil.copy2(BUILT, KEEL)
    models = [resolve(m) for m in a.models] if only & {"1", "3"} else []
    dmodels = [resolve(m) for m in a.depth_models] if "2" in only else []
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() or "?"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    cpu = cpu_description()
    log(f"{cpu}; keel {head}{' (uncommitted changes)' if dirty else ''}; instruction set {a.isa}; {a.rounds} round{'s' if a.rounds > 1 else ''}")

    runs = RUNS
    for r in range(1, a.rounds + 1):
        if "1" in only:
            for m in models:
                log(f"round {r}/{a.rounds}, bar 1: {short(m)} pp512/tg128 beside llama-bench, {a.threads} threads")
                out = json.loads(run(["bash", COMPARE, "-m", m, "-t", str(a.threads), "-r", "1", "--isa", a.isa, "--keel", KEEL, "--json"], f"compare {short(m)}"))
                runs.append({"round": r, "bar": 1, "label": short(m), "model": str(m), "batches": "invariant", "compare": out})
        if "2" in only:
            for m in dmodels:
                for b in ("invariant", "llama-cpp"):
                    log(f"round {r}/{a.rounds}, bar 2: {short(m)} at depth {a.depth}, --batches {b}")
                    out = json.loads(run(["bash", COMPARE, "-m", m, "-t", str(a.threads), "-d", str(a.depth), "-r", "1", "--batches", b, "--isa", a.isa, "--keel", KEEL, "--json"], f"compare {short(m)} -d {a.depth}"))
                    runs.append({"round": r, "bar": 2, "label": short(m), "model": str(m), "batches": b, "compare": out})
        if "3" in only:
            for m in models:
                for t in sorted({1, a.threads}):
                    log(f"round {r}/{a.rounds}, bar 3: {short(m)} tg128 against the roofline, {t} thread{'s' if t > 1 else ''}")
                    out = json.loads(run([KEEL, "bench", "-m", m, "-t", str(t), "-p", "0", "-n", "128", "-r", "3", "--roofline", "--json"], f"keel bench --roofline {short(m)}", keel_env))
                    runs.append({"round": r, "bar": 3, "label": short(m), "model": str(m), "threads": t, "bench": out})

    # Rows: (bar, model, what, [per-round values], bar value or None, formatter)
    rows = []
    for bar, mods, modes in ((1, models, ("invariant",)), (2, dmodels, ("invariant", "llama-cpp"))):
        if str(bar) not in only:
            continue
        for m in mods:
            for b in modes:
                sel = [x for x in runs if x["bar"] == bar and x["model"] == str(m) and x["batches"] == b]
                for test in [t["test"] for t in sel[0]["compare"]["tests"]] if sel else []:
                    vals = [t["ratio"] for x in sel for t in x["compare"]["tests"] if t["test"] == test]
                    what = f"{test}{', --batches llama-cpp' if b == 'llama-cpp' else ''}"
                    rows.append((bar, short(m), what, vals, (BAR_A1 if bar == 1 else BAR_A2) if b == "invariant" else None, ratio))
    if "3" in only:
        for m in models:
            for t in sorted({1, a.threads}):
                sel = [x["bench"][0] for x in runs if x["bar"] == 3 and x["model"] == str(m) and x["threads"] == t]
                rows.append((3, short(m), f"tg128 / bound, {t} thread{'s' if t > 1 else ''}", [s["fraction_of_bound"] for s in sel], BAR_A3, pct))

    verdicts = []
    for bar, m, what, vals, need, fmt in rows:
        med = statistics.median(vals)
        verdicts.append({"bar": bar, "model": m, "what": what, "rounds": vals, "median": med, "needs": need, "met": None if need is None else med >= need})
    kernels = next((x["compare"]["kernels"] for x in runs if "compare" in x), None) or next((x["bench"][0]["kernels"] for x in runs if "bench" in x), "?")
    unmet = [v for v in verdicts if v["met"] is False]

    if a.json:
        print(json.dumps({"cpu": cpu, "kernels": kernels, "isa": a.isa, "head": head, "uncommitted_changes": bool(dirty), "rounds": a.rounds, "threads": a.threads, "depth": a.depth, "verdicts": verdicts, "runs": runs}))
    else:
        print(f"CPU {cpu}; keel {head}{' (uncommitted changes)' if dirty else ''}, kernel set {kernels}; llama.cpp 11434 ({a.isa} build); {a.rounds} round{'s' if a.rounds > 1 else ''}, {a.threads} thread{'s' if a.threads > 1 else ''}")
        print()
        print("| bar | model | measure | rounds | median | needs | |")
        print("|---|---|---|---|---|---|---|")
        for v, (_, _, _, _, _, fmt) in zip(verdicts, rows):
            needs = "-" if v["needs"] is None else f">= {fmt(v['needs'])}"
            met = "" if v["met"] is None else ("met" if v["met"] else "**not met**")
            print(f"| {v['bar']} | {v['model']} | {v['what']} | {', '.join(fmt(x) for x in v['rounds'])} | {fmt(v['median'])} | {needs} | {met} |")
        print()
        if any(x["bar"] == 3 for x in runs):
            print("bar 3, run by run: the fastest read pass, the bound it gives, tg128 against it, each repetition against the pass right after it and (two threads) the pool's hand-off after it")
            for x in runs:
                if x["bar"] == 3:
                    s = x["bench"][0]
                    hand = f"; hand-off {hand_offs(s)}" if hand_offs(s) else ""
                    print(f"  round {x['round']} {short(x['model'])} -t {x['threads']}: {s['read_bytes_per_s'] / 1e9:.1f} GB/s, bound {s['bound_tps']:.1f} t/s, tg128 {s['tps']:.1f} t/s ({pct(s['fraction_of_bound'])}); after each repetition {', '.join(pct(f) for f in s.get('fraction_of_pass_after', []))}{hand}")
            print()
        print(f"{len(verdicts) - sum(v['met'] is None for v in verdicts) - len(unmet)} bars met, {len(unmet)} not met" + (": " + "; ".join(f"{v['model']} {v['what']} {(ratio if v['bar'] < 3 else pct)(v['median'])}" for v in unmet) if unmet else ""))
        print()
        print("raw output, run by run:")
        for x in runs:
            print(json.dumps(x))
    if a.strict and unmet:
        sys.exit(3)


if __name__ == "__main__":
    main()

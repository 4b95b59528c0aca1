"""What the Python bench scripts share (bench/speed-set.py, bench/ab.py): the kernel set
`--isa` chooses, the CPU's description for a report, a run's hand-offs as printed, and
timestamped progress on stderr."""

import datetime
import os
import sys
from pathlib import Path

# --isa's KEEL_ISA for keel (bench/compare-llama-cpp.sh sets the same for its runs).
ISA_KEEL = {"avx2": "avx2_fma", "avx512": "avx2_fma avx512 avx512_vnni"}


def log(msg):
    print(f"[{datetime.datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cpu_description():
    """The CPU as a report names it: model name, family and model, its widest vector set,
    the number of CPUs."""
    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            k = k.strip()
            if k in ("model name", "cpu family", "model", "flags") and k not in info:
                info[k] = v.strip()
    except OSError:
        pass
    flags = set(info.get("flags", "").split())
    isa = "AVX512-FP16" if "avx512fp16" in flags else ("AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "no AVX2"))
    return f"{info.get('model name', '?')} (family {info.get('cpu family', '?')} model {info.get('model', '?')}, {isa}, {os.cpu_count()} CPUs)"


def hand_offs(record):
    """`keel bench --roofline`'s hand-off after each tg repetition (two or more threads),
    as a report prints them ("94, 92, 90 ns"); "" where the record has none."""
    h = record.get("hand_off_after") or []
    return f"{', '.join(f'{x * 1e9:.0f}' for x in h)} ns" if h else ""

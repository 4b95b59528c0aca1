#!/usr/bin/env python3
"""Differential tokenization: random texts through `keel tokenize` and llama.cpp's
`llama-tokenize` (build 11434, the build the golden outputs were made with), token ids
compared one text at a time. A tool for people, not part of CI (the goldens cover fixed
texts; this covers texts nobody wrote down).

    bench/tokenize-vs-llama-cpp.py [-m MODEL]... [-n 300] [--seed 1] [--texts mixed|codepoints] [--json]

Texts: `mixed` joins 1-25 pieces drawn from words, contractions ('s 'LL ...), digit
runs, punctuation, whitespace of every kind (tabs, CR LF, no-break and ideographic
spaces), accented and combining letters, scripts (CJK, Hangul, Thai, Devanagari, Arabic,
Hebrew), emoji with modifiers and joiners, and the special-token texts of the models keel
knows; `codepoints` joins runs of random code points from 22 Unicode blocks (private use,
variation selectors, tags and supplementary planes among them), long whitespace, digit and
letter runs. Both sides parse special-token text and add no BOS (keel: --parse-special;
llama-tokenize: --no-bos --no-escape). Each text goes through a file, byte for byte.

Exit status 1 if any text's ids differ (each printed with both id lists), 2 on a tool
error. The llama.cpp build is the one bench/compare-llama-cpp.sh makes ($KEEL_LLAMA_CPP,
default ~/.cache/keel/llama.cpp-11434); without llama-tokenize there, run
`bench/compare-llama-cpp.sh --build -m /nonexistent` once, or pass --llama-tokenize PATH.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

PIECES = [
    ' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', ' \n', '\u00a0', '\u3000', '\u2003',
    'a', 'A', 'z', 'hello', 'Hello', 'HELLO', 'world', "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE",
    '0', '1', '12', '123', '1234', '12345', '3.14', '1,000', '-', '_', '__', '--', '...', '!', '?', '.', ',', ';', ':',
    '(', ')', '[', ']', '{', '}', '<', '>', '/', '\\', '"', '`', '~', '@', '#', '$', '%', '^', '&', '*', '+', '=', '|',
    'é', 'ü', 'ñ', 'ß', 'Ä', 'ø', 'ç', 'Ω', 'λ', 'Ж', 'ж', 'ب', 'ש', '日本', '中文', '한국어', 'ไทย', 'हिन्दी',
    '😀', '👍🏽', '👨\u200d👩\u200d👧', '🇫🇷', 'e\u0301', '\u200b', '\u200d', '\ufeff', 'ﬁ', 'Ⅻ', '①', '½', '²',
    '<|im_start|>', '<|im_end|>', '<start_of_turn>', '<end_of_turn>', '<bos>', '<eos>', '<|endoftext|>',
    '<s>', '</s>', '<unk>', '<pad>', '<mask>', '[INST]',
    'def ', '    return ', 'import ', 'http://x.com/a?b=c', 'foo_bar', 'fooBar', 'CamelCase', 'x86_64', 'v1.2.3',
    '#include <stdio.h>', ' the', ' The', ' of', 'ing', 'tion',
]

BLOCKS = [
    (0x20, 0x7e), (0xa0, 0x24f), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff), (0x900, 0x97f),
    (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f), (0x2100, 0x23ff), (0x2460, 0x24ff), (0x3000, 0x30ff),
    (0x4e00, 0x4fff), (0xac00, 0xacff), (0xe000, 0xe0ff), (0xfe00, 0xfe0f), (0xff00, 0xffef), (0x1f300, 0x1f6ff),
    (0x1f900, 0x1f9ff), (0x20000, 0x200ff), (0xe0000, 0xe007f),
]


def mixed(rng):
    return ''.join(rng.choice(PIECES) for _ in range(rng.randint(1, 25)))


def codepoints(rng):
    out = []
    for _ in range(rng.randint(1, 12)):
        r = rng.random()
        if r < 0.55:
            a, b = rng.choice(BLOCKS)
            out.append(''.join(chr(rng.randint(a, b)) for _ in range(rng.randint(1, 6))))
        elif r < 0.65:
            out.append(' ' * rng.randint(1, 40))
        elif r < 0.72:
            out.append('\n' * rng.randint(1, 6))
        elif r < 0.80:
            out.append(''.join(rng.choice('0123456789') for _ in range(rng.randint(1, 30))))
        elif r < 0.88:
            out.append(rng.choice(['a', 'ab', 'the', 'xyz', 'é', '!', '.']) * rng.randint(2, 60))
        else:
            out.append(rng.choice(["'s", "'S", "'ll", "'LL", "'Re", '\u2019s', '\u02bcs', " '"]))
    return ''.join(out)


def die(msg):
    """A tool error: the message on stderr, exit status 2."""
    print(f'tokenize-vs-llama-cpp: {msg}', file=sys.stderr)
    sys.exit(2)


def run(cmd):
    """stdout of cmd; a failure is a tool error (exit 2) naming the command."""
    p = subprocess.run(cmd, capture_output=True)
    if p.returncode != 0:
        die(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.decode(errors='replace').strip()[-400:]}")
    return p.stdout.decode()


def keel_ids(keel, model, path):
    return json.loads(run([keel, 'tokenize', '-m', model, '--parse-special', '--json', '-f', path]))['tokens']


def llama_ids(tok, model, path):
    out = run([tok, '-m', model, '--no-bos', '--no-escape', '--ids', '--log-disable', '-f', path])
    lists = [line for line in out.splitlines() if line.startswith('[')]
    if not lists:
        die(f"no id list in llama-tokenize's output for {path}: {out[-300:]!r}")
    return json.loads(lists[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], epilog='\n\n'.join(__doc__.split('\n\n')[2:]), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('-m', '--model', action='append', help='a .gguf file or a name keel pull knows (repeatable; default: smollm2-135m and gemma3-270m)')
    ap.add_argument('-n', type=int, default=300, help='texts per model (default 300)')
    ap.add_argument('--seed', type=int, default=1, help='the random texts\' seed (default 1); the same seed gives the same texts')
    ap.add_argument('--texts', choices=['mixed', 'codepoints'], default='mixed', help='how texts are made (default mixed)')
    ap.add_argument('--keel', metavar='PATH', help="the keel binary (default: this checkout's target/release/keel, built if missing)")
    ap.add_argument('--llama-tokenize', metavar='PATH', default=os.path.join(os.environ.get('KEEL_LLAMA_CPP', os.path.expanduser('~/.cache/keel/llama.cpp-11434')), 'build', 'bin', 'llama-tokenize'), help='the llama-tokenize binary (default: the one bench/compare-llama-cpp.sh builds)')
    ap.add_argument('--json', action='store_true', help='print one JSON object per model: {"model","texts","mismatches":[{"text","keel","llama_cpp"}]}')
    a = ap.parse_args()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
    if a.n < 1:
        die('-n must be at least 1')
    if not os.access(a.llama_tokenize, os.X_OK):
        die(f'no llama-tokenize at {a.llama_tokenize}; run `bench/compare-llama-cpp.sh --build -m /nonexistent` once (it builds llama-bench and llama-tokenize), or pass --llama-tokenize PATH')
    if a.keel is None:
        a.keel = os.path.join(root, 'target', 'release', 'keel')
        if not os.access(a.keel, os.X_OK) and subprocess.run(['cargo', 'build', '--release', '-q', '-p', 'keel-host-linux'], cwd=root).returncode != 0:
            die('cargo build --release -p keel-host-linux failed')
    # A known name becomes its file as `keel pull` gives it (fetched on first use), as in
    # bench/compare-llama-cpp.sh; anything else is taken as a path.
    models = []
    for m in a.model or ['smollm2-135m', 'gemma3-270m']:
        p = subprocess.run([a.keel, 'pull', m], capture_output=True, text=True)
        path = p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else m
        if not os.path.isfile(path):
            die(f'model {m} not found: give a .gguf file or a name `keel pull` knows')
        models.append(path)
    make = mixed if a.texts == 'mixed' else codepoints
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for m in models:
            rng = random.Random(a.seed)
            bad = []
            for i in range(a.n):
                text = make(rng)
                path = os.path.join(tmp, 'text')
                with open(path, 'w', encoding='utf-8', newline='') as f:
                    f.write(text)
                k, l = keel_ids(a.keel, m, path), llama_ids(a.llama_tokenize, m, path)
                if k != l:
                    bad.append({'text': text, 'keel': k, 'llama_cpp': l})
                    if not a.json:
                        print(f'MISMATCH {os.path.basename(m)} text {i}: {text!r}\n  keel      {k}\n  llama.cpp {l}', flush=True)
                if (i + 1) % 50 == 0 and not a.json:
                    print(f'{os.path.basename(m)}: {i + 1}/{a.n} texts, {len(bad)} differ', file=sys.stderr, flush=True)
            failed |= bool(bad)
            if a.json:
                print(json.dumps({'model': m, 'texts': a.n, 'seed': a.seed, 'kind': a.texts, 'mismatches': bad}, ensure_ascii=False))
            else:
                print(f'{m}: {a.n} {a.texts} texts (seed {a.seed}), {len(bad)} with different ids')
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()

#!/usr/bin/env bash
# The static `keel` in an otherwise empty root (issue 19, item 3): proof that the CLI needs
# nothing from the image it runs in: no libc, no dynamic loader, no /etc, /proc, /dev or /tmp.
#
#   1. builds `keel` for x86_64-unknown-linux-musl and aarch64-unknown-linux-musl (rust-lld,
#      .cargo/config.toml; a no-op when tests/run.sh built them already) and checks that
#      `ldd` calls each a static executable;
#   2. for each, makes a fresh directory holding only `/keel` and `/model.gguf` (the
#      synthetic llama Q8_0), plus for aarch64 a statically linked `/qemu-aarch64` (the
#      emulator must live inside the root too: `qemu-aarch64 -L DIR` would run keel with
#      the host's files still visible), and lists it: nothing else may be there;
#   3. runs `keel run -m /model.gguf -p "The capital of France is" -n 8 --temp 0 --json`
#      inside it (`chroot`, or `unshare -r -R` when not root) and compares the prompt and
#      generated token ids and the logits rows' digests with the same binary's run outside
#      the root (and x86_64's with the native glibc build's);
#   4. control: the dynamically linked glibc build in a root prepared the same way must fail
#      (no dynamic loader there), so the root is really empty and the check can fail.
#
# Needs a statically linked qemu-aarch64 (Debian's qemu-user from bookworm-backports, which
# dsp-firmware/ci.sh installs, or qemu-user-static) and ./target/release/keel. ~5 s once built.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
main_target=${CARGO_TARGET_DIR:-target}
model=tests/golden/synth/synth-llama-q8_0.gguf
prompt="The capital of France is"
args=(run -m /model.gguf -p "$prompt" -n 8 --temp 0 --json)

is_static() { # ldd's verdict on a file: static, or a list of shared libraries
    local out
    out=$(ldd "$1" 2>&1 || true)
    grep -Eq "not a dynamic executable|statically linked" <<<"$out"
}

# A statically linked qemu-aarch64 to copy into the root.
qemu=""
for q in qemu-aarch64-static qemu-aarch64; do
    p=$(command -v "$q" || true)
    if [ -n "$p" ] && is_static "$p"; then qemu=$p; break; fi
done
if [ -z "$qemu" ]; then
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq qemu-user-static >/dev/null
    qemu=$(command -v qemu-aarch64-static)
    is_static "$qemu" || { echo "empty_root.sh: $qemu is not statically linked" >&2; exit 1; }
fi

# chroot needs root; otherwise a user namespace maps us to root first.
in_root() { # DIR CMD...
    local dir=$1; shift
    if [ "$(id -u)" -eq 0 ]; then chroot "$dir" "$@"; else unshare -r -R "$dir" "$@"; fi
}

echo "== empty root: build the static keel (x86_64 and aarch64 musl)"
rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl >/dev/null
cargo build --release -p keel-host-linux --target x86_64-unknown-linux-musl
cargo build --release -p keel-host-linux --target aarch64-unknown-linux-musl
[ -x "$main_target/release/keel" ] || cargo build --release -p keel-host-linux

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The ids and digests keel reports, one line each (ids, then the rows' digests).
summary() { python3 -c 'import json, sys
d = json.loads(sys.stdin.read())
assert len(d["generated"]) == 8, "not 8 tokens generated"
print(*d["prompt_tokens"]); print(*d["generated"]); print(*d["row_sha256"])'; }

make_root() { # DIR BINARY [EXTRA...]: a root with only /keel, /model.gguf and EXTRA
    local dir=$1 bin=$2; shift 2
    mkdir "$dir"
    cp "$bin" "$dir/keel"
    cp "$model" "$dir/model.gguf"
    for f in "$@"; do cp "$f" "$dir/"; done
    local want got
    want=$(printf '%s\n' keel model.gguf "${@##*/}" | sort)
    got=$(cd "$dir" && find . -mindepth 1 | sed 's|^\./||' | sort)
    [ "$got" = "$want" ] || { printf 'empty_root.sh: %s holds\n%s\n' "$dir" "$got" >&2; exit 1; }
}

native_ref=$("$main_target/release/keel" run -m "$model" -p "$prompt" -n 8 --temp 0 --json 2>/dev/null | summary)

for arch in x86_64 aarch64; do
    bin=$main_target/$arch-unknown-linux-musl/release/keel
    is_static "$bin" || { echo "empty_root.sh: ldd: $bin is not static: $(ldd "$bin" 2>&1)" >&2; exit 1; }
    echo "ldd $bin: $(ldd "$bin" 2>&1 | head -n 1 | sed 's/^[[:space:]]*//')"
    root=$work/root-$arch
    if [ "$arch" = x86_64 ]; then
        make_root "$root" "$bin"
        inside=$(in_root "$root" /keel "${args[@]}" 2>"$work/err" | summary) || { cat "$work/err" >&2; exit 1; }
        outside=$("$root/keel" run -m "$root/model.gguf" -p "$prompt" -n 8 --temp 0 --json 2>/dev/null | summary)
    else
        make_root "$root" "$bin" "$qemu"
        q=/${qemu##*/}
        inside=$(in_root "$root" "$q" -cpu max /keel "${args[@]}" 2>"$work/err" | summary) || { cat "$work/err" >&2; exit 1; }
        outside=$("$qemu" -cpu max "$root/keel" run -m "$root/model.gguf" -p "$prompt" -n 8 --temp 0 --json 2>/dev/null | summary)
    fi
    echo "root ($arch): $(cd "$root" && ls | tr '\n' ' ')"
    if [ "$inside" != "$outside" ]; then
        printf 'empty_root.sh: %s: inside the empty root\n%s\noutside\n%s\n' "$arch" "$inside" "$outside" >&2
        exit 1
    fi
    if [ "$arch" = x86_64 ] && [ "$inside" != "$native_ref" ]; then
        printf 'empty_root.sh: the static x86_64 keel\n%s\nthe glibc build\n%s\n' "$inside" "$native_ref" >&2
        exit 1
    fi
    echo "$arch: in the empty root, prompt ids [$(sed -n 1p <<<"$inside")], generated [$(sed -n 2p <<<"$inside")]: equal to the run outside, logits digests too"
done

# The control: the glibc build cannot run there (no /lib64/ld-linux-x86-64.so.2, no libc).
make_root "$work/root-glibc" "$main_target/release/keel"
if in_root "$work/root-glibc" /keel "${args[@]}" >/dev/null 2>&1; then
    echo "empty_root.sh: the dynamically linked keel ran in the empty root: the root is not empty" >&2
    exit 1
fi
echo "control: the dynamically linked glibc keel fails in the same empty root"
echo "empty root: all checks passed"

#!/usr/bin/env bash
# Tests apt-mirror.sh on made-up apt configurations in a temp dir (never the machine's
# own /etc/apt), then, read-only, on this machine's real sources when it is Debian.
#   bash dsp-firmware/scripts/apt-mirror-test.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
# check NAME SUITE WANT: apt-mirror.sh on the tree NAME prints WANT (or fails: "FAIL").
check() {
  local name=$1 suite=$2 want=$3 got
  if got=$(bash "$here/apt-mirror.sh" --root "$tmp/$name" "$suite" 2>/dev/null); then :; else got=FAIL; fi
  if [ "$got" != "$want" ]; then echo "FAIL $name ($suite): got $got, want $want" >&2; fails=$((fails + 1)); else echo "ok $name ($suite)"; fi
}
# put NAME PATH: writes stdin to NAME's etc/apt/PATH.
put() {
  mkdir -p "$(dirname "$tmp/$1/etc/apt/$2")"
  cat > "$tmp/$1/etc/apt/$2"
}

# The stock Debian 12 container layout: deb822, two stanzas, comments.
put stock sources.list.d/debian.sources <<'S'
Types: deb
# http://snapshot.example.invalid/archive/debian/20250520T000000Z
URIs: http://mirror-a.example.invalid/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror-a.example.invalid/debian-security
Suites: bookworm-security
Components: main
S
check stock bookworm http://mirror-a.example.invalid/debian
check stock bookworm-updates http://mirror-a.example.invalid/debian
check stock bookworm-security http://mirror-a.example.invalid/debian-security
check stock bookworm-backports FAIL

# deb822: disabled stanza, deb-src only, lower-case keys, several URIs, continuation.
put d822 sources.list.d/a.sources <<'S'
Types: deb
URIs: http://disabled.example.invalid/debian
Suites: bookworm
Enabled: no

Types: deb-src
URIs: http://src.example.invalid/debian
Suites: bookworm
S
put d822 sources.list.d/b.sources <<'S'
types: deb deb-src
uris: http://mirror-b.example.invalid/debian http://mirror-c.example.invalid/debian
suites:
 trixie
 bookworm
components: main
S
check d822 bookworm http://mirror-b.example.invalid/debian
check d822 trixie http://mirror-b.example.invalid/debian
check d822 bookworm-security FAIL

# One-line sources with options, comments, other suites; a disabled *.list.save ignored.
put oneline sources.list <<'S'
# deb http://commented.example.invalid/debian bookworm main
deb-src http://src.example.invalid/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://mirror-d.example.invalid/debian bookworm main
deb http://mirror-e.example.invalid/debian-security bookworm-security main
S
put oneline sources.list.d/old.list.save <<'S'
deb http://saved.example.invalid/debian bookworm-backports main
S
check oneline bookworm http://mirror-d.example.invalid/debian
check oneline bookworm-security http://mirror-e.example.invalid/debian-security
check oneline bookworm-backports FAIL

# deb822 preferred over one-line; one-line used when deb822 lacks the suite.
put both sources.list <<'S'
deb http://oneline.example.invalid/debian bookworm main
deb [ signed-by=/k.gpg ] http://oneline.example.invalid/ports sid main
S
put both sources.list.d/x.sources <<'S'
Types: deb
URIs: http://deb822.example.invalid/debian
Suites: bookworm
S
check both bookworm http://deb822.example.invalid/debian
check both sid http://oneline.example.invalid/ports

# Nothing configured.
mkdir -p "$tmp/empty/etc/apt"
check empty bookworm FAIL

# This machine's own sources (read only): where it is Debian bookworm, a mirror is found.
if grep -qs 'VERSION_CODENAME=bookworm' /etc/os-release; then
  if uri=$(bash "$here/apt-mirror.sh" bookworm); then echo "ok this machine's bookworm mirror: $uri"; else echo "FAIL: no bookworm mirror found in this machine's apt sources" >&2; fails=$((fails + 1)); fi
fi
[ "$fails" = 0 ] || { echo "apt-mirror-test.sh: $fails failure(s)" >&2; exit 1; }
echo "apt-mirror-test.sh: all passed"

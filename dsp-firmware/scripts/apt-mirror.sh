#!/usr/bin/env bash
# Prints the archive URI this machine's own apt sources use for Debian suite SUITE (the
# first enabled `deb` entry naming it), so a script can add a sibling suite (ci.sh:
# SUITE-backports) on the same mirror without naming any mirror itself.
#   bash dsp-firmware/scripts/apt-mirror.sh [--root DIR] SUITE
# Reads DIR/etc/apt/sources.list.d/*.sources (deb822: stanzas of `Types`, `URIs`,
# `Suites`, `Enabled`, comments and continuation lines allowed), then the one-line
# DIR/etc/apt/sources.list and sources.list.d/*.list (`deb [options] URI SUITE ...`).
# Exit 1 with a message if no source names SUITE. --root (default /) is for the tests
# (apt-mirror-test.sh).
set -euo pipefail
root=/
if [ "${1:-}" = --root ]; then root=$2; shift 2; fi
[ $# = 1 ] || { echo "usage: apt-mirror.sh [--root DIR] SUITE" >&2; exit 2; }
suite=$1
etc=${root%/}/etc/apt

uri=""
shopt -s nullglob
sources=("$etc"/sources.list.d/*.sources)
if [ ${#sources[@]} -gt 0 ]; then
  uri=$(awk -v want="$suite" '
    function has(list, w,   n, a, i) { n = split(list, a, /[ \t]+/); for (i = 1; i <= n; i++) if (a[i] == w) return 1; return 0 }
    function done_stanza() {
      if (!found && types != "" && has(types, "deb") && has(suites, want) && tolower(enabled) != "no" && uris != "") {
        split(uris, u, /[ \t]+/); print u[1]; found = 1
      }
      types = suites = uris = enabled = ""; field = ""
    }
    FNR == 1 { done_stanza() }
    /^[ \t]*#/ { next }
    /^[ \t]*$/ { done_stanza(); next }
    /^[ \t]/ { if (field == "uris") uris = uris " " $0; else if (field == "suites") suites = suites " " $0; else if (field == "types") types = types " " $0; next }
    {
      i = index($0, ":"); if (i == 0) next
      field = tolower(substr($0, 1, i - 1)); v = substr($0, i + 1); gsub(/^[ \t]+|[ \t]+$/, "", v)
      if (field == "types") types = v; else if (field == "suites") suites = v; else if (field == "uris") uris = v; else if (field == "enabled") enabled = v
    }
    END { done_stanza() }
  ' "${sources[@]}")
fi
if [ -z "$uri" ]; then
  lists=()
  [ -f "$etc/sources.list" ] && lists+=("$etc/sources.list")
  lists+=("$etc"/sources.list.d/*.list)
  if [ ${#lists[@]} -gt 0 ]; then
    uri=$(awk -v want="$suite" '
      /^[ \t]*#/ || NF < 3 || $1 != "deb" { next }
      {
        i = 2
        # Options: `[arch=amd64 signed-by=...]`, possibly spread over several fields.
        if (substr($i, 1, 1) == "[") { while (i <= NF && substr($i, length($i), 1) != "]") i++; i++ }
        if (i + 1 <= NF && $(i + 1) == want) { print $i; exit }
      }
    ' "${lists[@]}")
  fi
fi
[ -n "$uri" ] || { echo "apt-mirror.sh: no enabled deb source for suite $suite under $etc (sources.list, sources.list.d/*.sources, *.list)" >&2; exit 1; }
printf '%s\n' "$uri"

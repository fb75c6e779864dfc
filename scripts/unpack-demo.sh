#!/usr/bin/env bash
# Unpack the demo model's weights and tokenizer (models/dsv4-demo/weights.tar.xz, committed) next to its config,
# and check them against models/dsv4-demo/SHA256SUMS. Idempotent: does nothing when the files are there and match.
# Usage: scripts/unpack-demo.sh   (scripts/setup.sh, scripts/test.sh and scripts/build-cuda.sh call it)
set -euo pipefail
cd "$(dirname "$0")/../models/dsv4-demo"
die() { echo "unpack-demo: error: $*" >&2; exit 1; }
{ [ -f SHA256SUMS ] && [ -f weights.tar.xz ]; } || die "models/dsv4-demo/weights.tar.xz or SHA256SUMS is missing"
sha256sum --status -c SHA256SUMS 2>/dev/null && exit 0

# Unpack into a scratch folder beside the files, check, then move into place (no half-written files are left).
T=$(mktemp -d .unpack.XXXXXX)
trap 'rm -rf "$T"' EXIT
A=$PWD/weights.tar.xz
if command -v cmake >/dev/null && (cd "$T" && cmake -E tar xJf "$A") 2>/dev/null; then :
elif command -v xz >/dev/null && (cd "$T" && tar xJf "$A") 2>/dev/null; then :
elif command -v python3 >/dev/null && python3 -c 'import sys, tarfile
kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], **kw)' "$A" "$T"; then :
else die "cannot unpack models/dsv4-demo/weights.tar.xz (tried cmake -E tar, tar + xz, python3)"
fi
(cd "$T" && sha256sum --quiet -c ../SHA256SUMS) >&2 ||
  die "models/dsv4-demo/weights.tar.xz does not match models/dsv4-demo/SHA256SUMS (corrupt or stale archive)"
awk '{print $2}' SHA256SUMS | while read -r f; do mv -f "$T/$f" "$f"; done
echo "unpack-demo: unpacked $(wc -l < SHA256SUMS) files into models/dsv4-demo" >&2

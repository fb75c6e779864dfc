#!/usr/bin/env bash
# Run the GPU tests (tests/gpu, the program test_gpu of a CUDA build: scripts/build-cuda.sh) and keep a log.
# Usage: scripts/test-gpu.sh [--log FILE] [BUILD_DIR] [extra gtest arguments, e.g. --gtest_filter=Gemm*]
#   --log FILE  default tests/gpu/results/test-gpu-<UTC date>.log; the gtest JSON report goes next to it (.log
#               replaced by .json). BUILD_DIR defaults to $BUILD_DIR, else build; relative paths are from the repo root.
# The log starts with the date, the commit (git, else $DSV4_COMMIT, else "unknown"), `nvidia-smi -L` and the exact
# command. Exits non-zero when a test fails; without a GPU the tests skip themselves and the run passes.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "test-gpu: error: $*" >&2; exit 2; }
B=${BUILD_DIR:-build} LOG="" EXTRA=()
while (($#)); do
  case $1 in
    --log) [ $# -ge 2 ] || die "--log needs a file"; LOG=$2; shift 2 ;;
    --log=*) LOG=${1#--log=}; shift ;;
    -*) EXTRA+=("$1"); shift ;;
    *) B=$1; shift ;;
  esac
done
PROG=$B/test_gpu
# a configured CUDA build (scripts/setup.sh -DDSV4_CUDA=ON builds only dsv4): build test_gpu first
if [ -f "$B/CMakeCache.txt" ] && grep -q "^DSV4_CUDA:BOOL=ON" "$B/CMakeCache.txt"; then
  cmake --build "$B" -j"$(nproc)" --target test_gpu
fi
[ -x "$PROG" ] || die "$PROG not found: build with scripts/build-cuda.sh first"
LOG=${LOG:-tests/gpu/results/test-gpu-$(date -u +%Y%m%dT%H%M%SZ).log}
JSON=${LOG%.log}.json
mkdir -p "$(dirname "$LOG")"
CMD=("$PROG" --gtest_output="json:$JSON" "${EXTRA[@]}")

{
  echo "# dsv4 GPU tests"
  echo "date:    $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  # the caller may name the commit (a copied tree, or a prebuilt binary of another commit); else ask git
  if [ -n "${DSV4_COMMIT:-}" ]; then rev=$DSV4_COMMIT
  elif rev=$(git rev-parse HEAD 2>/dev/null); then
    git diff --quiet HEAD 2>/dev/null || rev="$rev (+ local changes)"
  else rev=unknown; fi
  echo "commit:  $rev"
  echo "host:    $(uname -n) $(uname -r)"
  echo "gpus:"
  if command -v nvidia-smi >/dev/null; then nvidia-smi -L 2>&1 | sed 's/^/  /' || true; else echo "  (no nvidia-smi)"; fi
  echo "command: ${CMD[*]}"
  echo
} > "$LOG"
echo "test-gpu: log $LOG, report $JSON" >&2
set +e
"${CMD[@]}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
set -e
echo "exit status: $rc" >> "$LOG"
[ "$rc" = 0 ] && echo "test-gpu: passed" >&2 || echo "test-gpu: FAILED (exit status $rc), see $LOG" >&2
exit "$rc"

#!/usr/bin/env bash
# Build dsv4 with the CUDA backend (Release), also on a machine without network that lacks cpp-httplib, PCRE2 and xxHash
# (the Ubuntu 24.04 GPU machine). A missing one is unpacked from .debs/ (gitignored; scripts/fetch-debs.sh fills it,
# and this script runs it when .debs/ has none: that needs network) with dpkg -x into BUILD_DIR/deps-prefix.
# Usage: scripts/build-cuda.sh [BUILD_DIR] [--force-debs] [-DNAME=VALUE ...]
#   BUILD_DIR     relative to the repo root; default $BUILD_DIR, else build
#   --force-debs  take both from .debs/ even where the system has them (or DSV4_FORCE_DEBS=1; for testing)
#   -D...         passed to cmake after -DDSV4_CUDA=ON, so they can override it (e.g. -DDSV4_BUILD_BENCH=OFF)
#   DSV4_TARGETS  (environment) build only these targets, e.g. DSV4_TARGETS="dsv4 test_gpu"
set -euo pipefail
cd "$(dirname "$0")/.."
trap 'echo "build-cuda: FAILED (line $LINENO: $BASH_COMMAND)" >&2' ERR
die() { echo "build-cuda: FAILED: $*" >&2; exit 1; }
B=${BUILD_DIR:-build} FORCE=${DSV4_FORCE_DEBS:-0} ARGS=()
for a in "$@"; do
  case $a in
    --force-debs) FORCE=1 ;;
    -*) ARGS+=("$a") ;;
    *) B=$a ;;
  esac
done
for t in cmake pkg-config dpkg; do command -v $t >/dev/null || die "$t is missing"; done
mkdir -p "$B" && B=$(cd "$B" && pwd)

scripts/unpack-demo.sh

# A dependency is there when pkg-config knows it and its header preprocesses with its flags.
# shellcheck disable=SC2046  # the flags are meant to split
has() { pkg-config --exists "$1" && printf '%s\n#include <%s>\n' "${3:-}" "$2" |
        ${CXX:-c++} $(pkg-config --cflags "$1") -x c++ -E - >/dev/null 2>&1; }
need=()
{ [ "$FORCE" = 0 ] && has cpp-httplib httplib.h; } || need+=(dsv4-httplib-header)
{ [ "$FORCE" = 0 ] && has libpcre2-8 pcre2.h "#define PCRE2_CODE_UNIT_WIDTH 8"; } || need+=(libpcre2-dev)
{ [ "$FORCE" = 0 ] && printf '#include <xxhash.h>\n' | ${CXX:-c++} -x c++ -E - >/dev/null 2>&1; } || need+=(libxxhash-dev)

if ((${#need[@]})); then
  newest() { find .debs -maxdepth 1 -name "$1_*.deb" 2>/dev/null | sort -V | tail -n1 || true; }
  debs=()
  for p in "${need[@]}"; do
    if [ -z "$(newest "$p")" ]; then
      echo "build-cuda: no .debs/${p}_*.deb: running scripts/fetch-debs.sh (needs network)" >&2
      scripts/fetch-debs.sh || die "no .debs/${p}_*.deb and scripts/fetch-debs.sh failed; run it on a machine" \
                                   "with network and bring .debs/ here (device run: carry \".debs\")"
    fi
    debs+=("$(newest "$p")")
    [ -n "${debs[-1]}" ] || die "scripts/fetch-debs.sh left no .debs/${p}_*.deb"
  done
  P=$B/deps-prefix
  stamp=$(basename -a "${debs[@]}")
  if [ "$(cat "$P/.debs" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$P" && mkdir -p "$P"
    for f in "${debs[@]}"; do dpkg -x "$f" "$P"; done
    # The .pc files say /usr: point them at the prefix.
    find "$P" -name '*.pc' -exec sed -i -e "s|^prefix=/usr|prefix=$P/usr|" \
         -e "s|^\(exec_prefix\|libdir\|includedir\)=/usr|\1=$P/usr|" {} +
    # libpcre2-8.so (dev package) points at libpcre2-8.so.0.* of the runtime package, which is not unpacked: drop
    # such dangling links, so that -lpcre2-8 finds the dev package's static libpcre2-8.a (nothing needed at run time).
    find "$P" -xtype l -delete
    echo "$stamp" > "$P/.debs"
  fi
  echo "build-cuda: from .debs/ into $P: ${stamp//$'\n'/ }" >&2
  PCP=$(find "$P/usr/lib" "$P/usr/share" -maxdepth 2 -type d -name pkgconfig 2>/dev/null | paste -sd: || true)
  export PKG_CONFIG_PATH=$PCP${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  ARGS=(-DCMAKE_PREFIX_PATH="$P/usr" "${ARGS[@]}")
fi

# CUDA 13 lives in /usr/local/cuda/bin, often not on PATH (and /usr/bin/nvcc may be an old 11.x).
if [ -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDACXX:-}" ] &&
   ! printf '%s\n' "${ARGS[@]}" | grep -q '^-DCMAKE_CUDA_COMPILER[:=]'; then
  ARGS=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc "${ARGS[@]}")
fi

cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DDSV4_CUDA=ON "${ARGS[@]}"
# DSV4_TARGETS (optional): build only these targets (e.g. "dsv4 test_gpu" on the GPU machine, to save its time)
# shellcheck disable=SC2086  # the targets are meant to split
cmake --build "$B" -j"$(nproc)" ${DSV4_TARGETS:+--target $DSV4_TARGETS}
echo "build-cuda: built $B/dsv4" >&2

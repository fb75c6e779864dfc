#!/usr/bin/env bash
# Install what a fresh Debian 12 machine lacks, then configure and build the dsv4 program into ./build (Release).
# The test and benchmark programs are built by scripts/test.sh (or `cmake --build build`), not here.
# Usage: scripts/setup.sh [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(build-essential cmake pkg-config nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev
      libcpp-httplib-dev libpcre2-dev libxxhash-dev libcli11-dev libfmt-dev libspdlog-dev nodejs npm)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# nodejs/npm may come from outside Debian's packages (e.g. a NodeSource or nvm install): accept a node on PATH.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
read -r -a missing <<<"${missing[*]}"
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
scripts/unpack-demo.sh
# -DDSV4_CUDA=ON: take CUDA's /usr/local/cuda/bin/nvcc when nvcc is not on PATH or older than 12.9 (Debian's is 11.x).
cuda=0 given=0
for a in "$@"; do
  case $a in
    -DDSV4_CUDA=*|-DDSV4_CUDA:BOOL=*) case ${a#*=} in ON|on|On|1|TRUE|true|YES|yes) cuda=1 ;; *) cuda=0 ;; esac ;;
    -DCMAKE_CUDA_COMPILER=*|-DCMAKE_CUDA_COMPILER:*) given=1 ;;
  esac
done
if ((cuda && !given)) && [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  v=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p' || true)
  [ "$(printf '%s\n' 12.9 "${v:-0}" | sort -V | head -n1)" = 12.9 ] || set -- "$@" -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)" --target dsv4
echo "setup: built ./build/dsv4" >&2

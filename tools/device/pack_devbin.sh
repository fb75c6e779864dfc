#!/usr/bin/env bash
# Pack a CUDA build made on the dev machine (build-cuda/, same CUDA 13.0 as the GPU machine) for a device run:
# .scratch/devbin.tar.xz with stripped dsv4 + test_gpu and the shared libraries Ubuntu 24.04 lacks in the versions
# they were linked against (spdlog 1.10, fmt 9, Debian's split cpp-httplib 0.11 and its brotli). tools/device/cuda_run.sh unpacks and uses it.
set -euo pipefail
cd "$(dirname "$0")/../.."
# BASE=<a dsv4 binary> BASE_COMMIT=<its commit>: also packed, as build-cuda/dsv4-base-<commit> (speed_run.sh's ab step).
# xz -9e: its 64 MiB window finds the CUDA code dsv4, test_gpu and a base binary share (~9 MB instead of ~15 for two).
B=${1:-build-cuda}   # e.g. /tmp/wt/build-cuda for a build of a clean worktree (then DSV4_BUILT_AT=/tmp/wt on the device)
T=$(mktemp -d)
mkdir -p "$T/build-cuda/lib" .scratch
cp "$B/dsv4" "$B/test_gpu" "$T/build-cuda/"
strip "$T/build-cuda/dsv4" "$T/build-cuda/test_gpu"
if [ -n "${BASE:-}" ]; then cp "$BASE" "$T/build-cuda/dsv4-base-${BASE_COMMIT:?BASE_COMMIT}" && strip "$T/build-cuda/dsv4-base-$BASE_COMMIT"; fi
for l in libspdlog.so.1.10 libfmt.so.9 libcpp-httplib.so.0.11 libbrotlidec.so.1 libbrotlienc.so.1 libbrotlicommon.so.1; do cp -L "/lib/x86_64-linux-gnu/$l" "$T/build-cuda/lib/"; done
tar -C "$T" -cf - build-cuda | xz -T2 -9e > .scratch/devbin.tar.xz
rm -rf "$T"
ls -la .scratch/devbin.tar.xz

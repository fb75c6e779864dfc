#!/usr/bin/env bash
# Run the test suite: every GoogleTest suite through CTest, then the end-to-end server tests with the
# official OpenAI and Anthropic Node SDKs and ajv (tests/e2e). Builds first if needed (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/dsv4 ] || scripts/setup.sh
cmake --build build -j"$(nproc)"
scripts/unpack-demo.sh   # the demo model's weights and tokenizer (models/dsv4-demo/weights.tar.xz)
# OpenMP worker threads sleep instead of spinning between parallel regions (shared CI cores).
export OMP_WAIT_POLICY=passive
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
if [ -f tests/e2e/package.json ]; then
  # (Re)install when node_modules is missing or lacks a dependency of package-lock.json.
  (cd tests/e2e && { npm ls --depth=0 >/dev/null 2>&1 || npm ci --no-audit --no-fund --loglevel=error; } && node --test)
fi

#!/usr/bin/env bash
# One device session of the CUDA backend on the GPU machine (run from the repo root by the `run` tool):
#   bash tools/device/cuda_run.sh [STEPS]     STEPS: comma list of build,golden,test,demo,bench (default all)
#   build   scripts/build-cuda.sh into build/ — or, when build-cuda/ was carried prebuilt (dsv4 + test_gpu built on
#           the dev machine with the same CUDA 13.0; its shared libraries that Ubuntu lacks in build-cuda/lib), use it
#   golden  HF transformers dense golden of the demo model (tests/data/golden/dsv4-demo.dense.json) if missing
#   test    scripts/test-gpu.sh (every GPU test), log + gtest JSON into $OUT
#   demo    `dsv4 generate` on the demo model with --device cuda (both numerics)
#   bench   `dsv4 bench model` on dummy V4-Flash weights (24 layers) when the build has it
#   buildcheck  scripts/build-cuda.sh into build/ with the time left (checks the committed build script on this
#           machine even when prebuilt binaries ran the tests)
# Environment: OUT (results folder, from the run tool), DSV4_COMMIT (the commit the tree is, for the logs),
# DSV4_BUILT_AT (the source path a carried prebuilt tree was built from, default /work/main),
# GTEST_FILTER (optional, narrows the tests). Everything is time-limited so partial results still come back.
set -u
OUT=${OUT:-/tmp/dsv4-out}
mkdir -p "$OUT"
STEPS=${1:-build,golden,test,demo,bench}
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=passive
PY=python3
[ -x /opt/torch/.venv/bin/python ] && PY=/opt/torch/.venv/bin/python
T0=$(date +%s)
log() { echo "== $* ($(($(date +%s) - T0)) s)"; }
has() { [[ ",$STEPS," == *",$1,"* ]]; }
LOG=$OUT/run.log
{
  log "start $(date -u) steps=$STEPS commit=${DSV4_COMMIT:-unknown}"
  nvidia-smi -L 2>&1 | head -4
  echo "cpus $(nproc), $(free -g | awk '/Mem/{print $2}') GiB"
  scripts/unpack-demo.sh || echo "unpack-demo failed"

  B=build
  # a prebuilt tree may come as .scratch/devbin.tar.xz (build-cuda/{dsv4,test_gpu,lib/*}: xz keeps it small)
  [ -f .scratch/devbin.tar.xz ] && tar -xJf .scratch/devbin.tar.xz && log "unpacked .scratch/devbin.tar.xz"
  if [ -x build-cuda/test_gpu ] && [ -x build-cuda/dsv4 ]; then
    B=build-cuda
    export LD_LIBRARY_PATH=$PWD/build-cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # the test programs name their data and the CLI by the absolute source path they were built from
    # (DSV4_BUILT_AT, default /work/main): make it point here
    SRC=${DSV4_BUILT_AT:-/work/main}
    if [ "$(readlink -f "$SRC" 2>/dev/null)" != "$(readlink -f "$PWD")" ]; then
      [ -e "$SRC" ] && [ ! -L "$SRC" ] && echo "warning: $SRC exists and is not this tree"
      [ -e "$SRC" ] || { mkdir -p "$(dirname "$SRC")" && ln -s "$PWD" "$SRC"; }
    fi
    log "using the carried prebuilt build-cuda/"
  elif has build; then
    log "build"
    timeout 420 scripts/build-cuda.sh > "$OUT/build.log" 2>&1
    echo "build rc=$?"
    tail -5 "$OUT/build.log"
  fi

  if has golden && [ ! -f tests/data/golden/dsv4-demo.dense.json ]; then
    log "HF dense golden of the demo model"
    timeout 150 $PY tools/oracle/hf_golden.py --model-dir models/dsv4-demo --out-dir tests/data/golden
    echo "golden rc=$?"
    cp tests/data/golden/dsv4-demo.dense.json "$OUT/" 2>/dev/null
  fi

  if has test && [ -x "$B/test_gpu" ]; then
    log "GPU tests"
    LEFT=$((560 - ($(date +%s) - T0)))
    F=()
    [ -n "${GTEST_FILTER:-}" ] && F=(--gtest_filter="$GTEST_FILTER")
    DSV4_COMMIT=${DSV4_COMMIT:-unknown} timeout $((LEFT > 30 ? LEFT - 20 : 10)) \
      scripts/test-gpu.sh --log "$OUT/test-gpu.log" "$B" "${F[@]}" > /dev/null 2>&1
    echo "tests rc=$?"
    grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests? ran" "$OUT/test-gpu.log" | tail -40
  fi

  if has demo && [ -x "$B/dsv4" ]; then
    for num in reference dense; do
      log "demo generate on cuda ($num)"
      timeout 30 "$B/dsv4" generate -m models/dsv4-demo -p "The Congress of the United States" -n 48 \
        --numerics $num --device cuda 2>&1 | tail -4
    done
  fi

  if has bench && [ -x "$B/dsv4" ] && "$B/dsv4" bench --help 2>&1 | grep -q model; then
    log "bench"
    LEFT=$((585 - ($(date +%s) - T0)))
    [ $LEFT -gt 20 ] && timeout $((LEFT - 5)) "$B/dsv4" bench model --config tests/data/configs/deepseek-v4-flash-config.json \
      --load-format dummy --layers 24 --device cuda --prefill 512 --ctx 512 --steps 16 --json > "$OUT/bench-model.json" 2> "$OUT/bench-model.log"
    echo "bench rc=$?"
    tail -6 "$OUT/bench-model.log"
  fi
  if has buildcheck; then
    LEFT=$((590 - ($(date +%s) - T0)))
    if [ $LEFT -gt 60 ]; then
      log "buildcheck (limit ${LEFT}s)"
      timeout $((LEFT - 5)) scripts/build-cuda.sh > "$OUT/build.log" 2>&1
      echo "buildcheck rc=$?"
      tail -3 "$OUT/build.log"
    fi
  fi
  log "done"
} > "$LOG" 2>&1
tail -60 "$LOG"

#!/usr/bin/env bash
# One device session for the GPU speed work (issue 9), run from the repo root by the `run` tool:
#   bash tools/device/speed_run.sh [STEPS]    STEPS: comma list of build,test,bench,prefill,dense,batch (default all)
#   build    scripts/build-cuda.sh build (targets dsv4 + test_gpu only)
#   test     scripts/test-gpu.sh (every GPU test), log + gtest JSON into $OUT
#   bench    dsv4 bench model, 24 dummy V4-Flash layers, batch-1 decode at ctx 4096: fast (default) and
#            --deterministic (the CPU-order kernels: the baseline)
#   prefill  the same, prefill of 8192 tokens (fast)
#   dense    batch-1 decode at ctx 4096 with --numerics dense (fast)
#   batch    --batch 8, 32, 128 at ctx 4096 when the bench supports --batch
# Environment: OUT (results folder), DSV4_COMMIT (the commit the tree is), GTEST_FILTER (optional).
# Every step is time-limited (the whole run stays under ~560 s) so partial results still come back.
set -u
OUT=${OUT:-/tmp/dsv4-out}
mkdir -p "$OUT"
STEPS=${1:-build,test,bench,prefill,dense,batch}
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=passive
T0=$(date +%s)
log() { echo "== $* ($(($(date +%s) - T0)) s)"; }
has() { [[ ",$STEPS," == *",$1,"* ]]; }
left() { echo $((${LIMIT:-570} - ($(date +%s) - T0))); }
CFG=tests/data/configs/deepseek-v4-flash-config.json
B=build
bench() {  # bench NAME ARGS...: one dsv4 bench model run, JSON into $OUT/bench-NAME.json, stderr into the log
  local name=$1; shift
  local l; l=$(left)
  if [ "$l" -lt 40 ]; then echo "skip bench $name (time)"; return; fi
  local cmd=("$B/dsv4" bench model --config "$CFG" --load-format dummy --layers 24 --device cuda "$@" --json)
  log "bench $name: ${cmd[*]}"
  timeout $((l - 10)) "${cmd[@]}" > "$OUT/bench-$name.json" 2> "$OUT/bench-$name.err"
  echo "bench $name rc=$?"
  grep -v '^\[warning\]' "$OUT/bench-$name.err" | tail -6
  cat "$OUT/bench-$name.err" >> "$OUT/bench.log"; rm -f "$OUT/bench-$name.err"
}
{
  log "start $(date -u) steps=$STEPS commit=${DSV4_COMMIT:-unknown}"
  nvidia-smi -L 2>&1 | head -2
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv 2>&1 | tail -1
  echo "cpus $(nproc)"
  if has build; then
    log "build"
    DSV4_TARGETS="dsv4 test_gpu" timeout 330 scripts/build-cuda.sh build -DDSV4_BUILD_BENCH=OFF > /tmp/build.log 2>&1
    echo "build rc=$?"
    grep -E "error|FAILED" /tmp/build.log | head -30
    tail -2 /tmp/build.log
  fi
  if [ -x "$B/dsv4" ]; then
    has bench && bench b1-ctx4096 --ctx 4096 --prefill 0 --steps 32
    has bench && bench b1-ctx4096-deterministic --ctx 4096 --prefill 0 --steps 16 --deterministic
  fi
  if has test && [ -x "$B/test_gpu" ]; then
    log "GPU tests"
    F=()
    [ -n "${GTEST_FILTER:-}" ] && F=(--gtest_filter="$GTEST_FILTER")
    l=$(left)
    DSV4_COMMIT=${DSV4_COMMIT:-unknown} timeout $((l > 200 ? l - 110 : 30)) \
      scripts/test-gpu.sh --log "$OUT/test-gpu.log" "$B" "${F[@]}" > /dev/null 2>&1
    echo "tests rc=$?"
    grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests? ran" "$OUT/test-gpu.log" | tail -40
  fi
  if [ -x "$B/dsv4" ]; then
    has dense && bench b1-ctx4096-dense --ctx 4096 --prefill 0 --steps 16 --numerics dense --no-profile
    has prefill && bench prefill8192 --ctx 0 --prefill 8192 --steps 1 --no-profile
    if has batch && "$B/dsv4" bench model --help 2>&1 | grep -q -- "--batch"; then
      for b in 8 32 128; do bench b$b-ctx4096 --batch $b --ctx 4096 --prefill 0 --steps 8 --no-profile; done
    fi
  fi
  log "done"
} > "$OUT/run.log" 2>&1
tail -70 "$OUT/run.log"

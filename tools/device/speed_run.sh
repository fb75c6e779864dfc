#!/usr/bin/env bash
# One device session for the GPU speed work (issue 9), run from the repo root by the `run` tool:
#   bash tools/device/speed_run.sh [STEPS]    STEPS: comma list of build,test,bench,prefill,dense,batch (default all)
#   build    scripts/build-cuda.sh build (targets dsv4 + test_gpu only); skipped when .scratch/devbin.tar.xz is carried
#            (a prebuilt build-cuda/ from tools/device/pack_devbin.sh: then every step uses it)
#   test     scripts/test-gpu.sh (every GPU test), log + gtest JSON into $OUT
#   bench    dsv4 bench model, 24 dummy V4-Flash layers, batch-1 decode at ctx 4096: fast (default: CUDA graphs)
#            and the same with --no-cuda-graph (every kernel launched); with `det` also --deterministic (the
#            CPU-order kernels: the baseline)
#   bench1   only the first of those (CUDA graphs)
#   pdl      batch-1 decode at ctx 4096 (CUDA graphs) with Programmatic Dependent Launch (the default) and with
#            --no-pdl, interleaved, 3 runs each (JSON "pdl" tells which way each ran)
#   ab       the built dsv4 against a baseline binary build-cuda/dsv4-base-<commit> (packed by pack_devbin.sh with
#            BASE=<stripped dsv4> BASE_COMMIT=<commit>) or carried as .scratch/base-dsv4-<commit>.xz, interleaved on the same card, 2 rounds: b1 (ctx 4096), b8 / b32 / b128 (ctx 4096)
#            and prefill of 8192 tokens, --no-profile (AB_CFGS="b1 prefill8192 ..." picks some; AB_NOPDL=1 adds the built
#            dsv4 with --no-pdl); JSON bench-ab-{new,newnopdl,base}-*.json
#   prefill  the same, prefill of 8192 tokens (fast)
#   wgmma    prefill of 8192 tokens at 4 layers with the prefill experts on wgmma (--wgmma; opt-in until its GPU tests
#            pass) and on mma.sync (the default), interleaved, 2 rounds (bench-prefill8192-l4-{wgmma,nowgmma}-r*.json)
#   dense    batch-1 decode at ctx 4096 with --numerics dense (fast)
#   batch    --batch 128, 8, 32 at ctx 4096 (batched decode over one state pool)
#   ncu      Nsight Compute kernel durations of a few decode steps (4 layers, ctx 0), CSV into $OUT/ncu.csv
#   serve    dsv4 bench serve on the demo model with --device cuda at 1, 8, 64 and 256 concurrent HTTP clients
#            (issue 10), JSON into $OUT/bench-serve.json
#   spec     dsv4 bench spec, 24 dummy V4-Flash layers with the MTP module, batch 1 and 8 (issue 13), JSON into
#            $OUT/bench-spec.json
#   specdet  the same at batch 8 with --deterministic (greedy tokens must equal plain decoding), $OUT/bench-spec-det.json
#   hyb1     hybrid GPU + CPU (issue 11): all 43 dummy V4-Flash layers, --gpu-experts auto (the experts that do not
#            fit the GPU on the CPU), batch-1 decode at ctx 1024 (32 steps, per-op profile) + prefill of 2048 tokens
#   hyb4     the same placement, batch-4 decode at ctx 1024
#   hyb8k    the same placement, prefill of 8192 tokens
#   hybn     --n-cpu-moe 8 (the experts of the last 8 layers on the CPU), batch-1 decode at ctx 1024
#   hybstage the --gpu-experts auto placement, prefill of 2048 tokens with the CPU experts staged on the GPU (the
#            default, model/expert_staging.h) and with --stage-tokens 0 (the CPU runs them, as before), then 8192
#            tokens staged
#   cpuserve dsv4 bench serve on the demo model on the machine's CPU (issue 10's 8-vs-1 clients benchmark) with 16,
#            8, 4 and 2 threads, OpenMP's default wait policy and passive, 2 rounds, JSON lines into $OUT/bench-serve-cpu.jsonl
#   prefpow  prefill of 8192 tokens (as `prefill`) with the GPU's SM clock, power and temperature sampled every
#            100 ms (nvidia-smi), CSV into $OUT/prefill-power.csv
#   gemm     dsv4 bench gemm on the machine's CPU (all threads), JSON into $OUT/bench-gemm.json
#   pprof    prefill of 2048 and 8192 tokens at 4 layers with the per-op breakdown
#   bprof    batched decode (batch 128 and 32, ctx 4096) at 4 layers with the per-op breakdown
#   ncub     Nsight Compute per-kernel durations and DRAM bytes of eager batch-128 decode steps (2 layers, ctx 4096)
#   ncuk     Nsight Compute sections (speed of light, warp stalls, occupancy, launch, memory) of the gemv and
#            gemv_tc, moe_tc_small and hc_finish kernels of eager decode steps (2 layers, ctx 4096), CSV into $OUT/ncu-kernels.csv
#   timeline where an unsynchronized prefill's time goes without nsys or ncu: the 4-layer prefill of 8192 tokens with
#            --timeline (one more prefill traced: per op the host's enqueue times and a CUDA event after it), the rows
#            into $OUT/timeline-prefill8192.tsv, the summary in bench.log and the JSON (bench-timeline-prefill8192-l4)
#   ncum     Nsight Compute sections of the prefill expert kernel (moe_wgmma_kernel, else moe_tc_big_kernel;
#            w1|w3 and w2 of a 1-layer prefill of 2048 tokens), CSV into
#            $OUT/ncu-moe-big.csv
#   ncup     where an unsynchronized prefill's time goes: the 4-layer prefill of 8192 tokens timed (bench, no profile),
#            then every kernel of one such prefill under Nsight Compute at unlocked clocks (gpu__time_duration.sum),
#            CSV into $OUT/ncu-prefill.csv: the kernels' sum vs the wall time is the GPU's idle time
#   ncud     Nsight Compute per-kernel durations, cycles and DRAM bytes of eager decode steps (2 layers, ctx 4096;
#            ncu's locked base clocks: an unlocked idle GPU between serialized kernels runs latency-bound ones slowly)
#   prof     Nsight Systems trace of batch-1 decode (24 layers, ctx 4096, CUDA graphs traced per node): the kernel
#            summary and the gzipped per-kernel trace into $OUT (nsys-kern.csv, nsys-trace.csv.gz); skipped without nsys
#   hf       tools/bench/hf_side_by_side.py (issue 9 item 5): HF transformers vs dsv4, 4 layers, into $OUT/side-by-side.json
# Environment: OUT (results folder), DSV4_COMMIT (the commit the tree is: pass it as a literal, e.g.
# DSV4_COMMIT=0a8d6df; `$(git rev-parse --short HEAD)` on the device resolves to main's tip, not the tree sent),
# GTEST_FILTER (optional), AB_CFGS (ab: which configurations), LAYERS (dummy layers of the 24-layer runs; default 24
# where the GPU has more than 100 GB, else 16, which fits an 80 GB H100).
# Every step is time-limited (the whole run stays under ~560 s) so partial results still come back.
set -u
OUT=${OUT:-/tmp/dsv4-out}
mkdir -p "$OUT"
STEPS=${1:-build,test,bench,prefill,dense,batch,ncu}
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=passive
T0=$(date +%s)
log() { echo "== $* ($(($(date +%s) - T0)) s)"; }
has() { [[ ",$STEPS," == *",$1,"* ]]; }
left() { echo $((${LIMIT:-570} - ($(date +%s) - T0))); }
CFG=tests/data/configs/deepseek-v4-flash-config.json
B=build
bench_run() {  # bench_run LABEL TAIL NAME ARGS...: one dsv4 bench model run, JSON bench-NAME.json into
                #   $OUT/bench-json.tar, stderr into $OUT/bench.log (its last TAIL lines on stdout)
  local label=$1 tail_n=$2 name=$3; shift 3
  local l; l=$(left)
  if [ "$l" -lt 40 ]; then echo "skip $label $name (time)"; return; fi
  local cmd=("$B/${DSV4_BIN:-dsv4}" bench model --config "$CFG" --load-format dummy "$@" --json)
  log "$label $name: ${cmd[*]}"
  mkdir -p /tmp/benchjson
  timeout $((l - 10)) "${cmd[@]}" > "/tmp/benchjson/bench-$name.json" 2> /tmp/bench.err
  echo "$label $name rc=$?"
  grep -v '^\[warning\]' /tmp/bench.err | tail -"$tail_n"
  { echo "== ${cmd[*]}"; cat /tmp/bench.err; } >> "$OUT/bench.log"
  tar -cf "$OUT/bench-json.tar" -C /tmp/benchjson .  # one file back for every run (the tool returns <= 8 files)
}
bench() { local name=$1; shift; bench_run bench 6 "$name" --layers "${LAYERS:-24}" --device cuda "$@"; }  # 24 layers (H100: LAYERS=16)
hbench() { local name=$1; shift; bench_run hybrid 9 "$name" --device cuda "$@"; }  # hybrid: all 43 layers
{
  log "start $(date -u) steps=$STEPS commit=${DSV4_COMMIT:-unknown}"
  nvidia-smi -L 2>&1 | head -2
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv 2>&1 | tail -1
  echo "cpus $(nproc): $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  if [ -z "${LAYERS:-}" ]; then  # 24 dummy layers where they fit (H200: 141 GB), else 16 (H100 80 GB)
    MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
    LAYERS=16; [ "${MIB:-0}" -gt 100000 ] 2>/dev/null && LAYERS=24
    echo "LAYERS=$LAYERS (GPU memory ${MIB:-?} MiB)"
  fi
  # a prebuilt tree may come as .scratch/devbin.tar.xz (tools/device/pack_devbin.sh: build-cuda/{dsv4,test_gpu,lib/*}
  # built on the dev machine with the same CUDA 13.0); it names its data by the source path it was built from
  # (DSV4_BUILT_AT, default /work/main): make that path point here
  if [ -f .scratch/devbin.tar.xz ]; then
    tar -xJf .scratch/devbin.tar.xz && B=build-cuda && export LD_LIBRARY_PATH=$PWD/build-cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    SRC=${DSV4_BUILT_AT:-/work/main}
    [ -e "$SRC" ] || { mkdir -p "$(dirname "$SRC")" && ln -s "$PWD" "$SRC"; }
    log "using the carried prebuilt build-cuda/ ($(readlink -f "$SRC"))"
    scripts/unpack-demo.sh > /dev/null
  elif has build; then
    log "build"
    DSV4_TARGETS="dsv4 test_gpu" timeout 330 scripts/build-cuda.sh build -DDSV4_BUILD_BENCH=OFF > /tmp/build.log 2>&1
    echo "build rc=$?"
    grep -E "error|FAILED" /tmp/build.log | head -30
    tail -2 /tmp/build.log
  fi
  if [ -x "$B/dsv4" ]; then
    (has bench || has bench1) && bench b1-ctx4096 --ctx 4096 --prefill 0 --steps 32
    has bench && bench b1-ctx4096-nograph --ctx 4096 --prefill 0 --steps 32 --no-cuda-graph --no-profile
    has bench && has det && bench b1-ctx4096-deterministic --ctx 4096 --prefill 0 --steps 16 --deterministic
    if has pdl; then
      for r in 1 2 3; do
        bench b1-ctx4096-pdl-$r --ctx 4096 --prefill 0 --steps 32 --no-profile
        bench b1-ctx4096-nopdl-$r --ctx 4096 --prefill 0 --steps 32 --no-profile --no-pdl
      done
    fi
  fi
  if has ab && [ -x "$B/dsv4" ] && { compgen -G "$B/dsv4-base-*" > /dev/null || compgen -G ".scratch/base-dsv4-*.xz" > /dev/null; }; then
    if compgen -G "$B/dsv4-base-*" > /dev/null; then  # packed in the devbin (pack_devbin.sh with a base binary)
      BASEC=$(ls "$B"/dsv4-base-* | head -1); BASEC=${BASEC##*/dsv4-base-}
    else
      BASEXZ=$(ls .scratch/base-dsv4-*.xz | head -1); BASEC=${BASEXZ##*/base-dsv4-}; BASEC=${BASEC%.xz}
      xz -dc "$BASEXZ" > "$B/dsv4-base-$BASEC" && chmod +x "$B/dsv4-base-$BASEC"
    fi
    for r in 1 2; do
      for cfg in "b1:--ctx 4096 --prefill 0 --steps 32" "b128:--batch 128 --ctx 4096 --prefill 0 --steps 8" \
                 "prefill8192:--ctx 0 --prefill 8192 --steps 1" "b32:--batch 32 --ctx 4096 --prefill 0 --steps 8" \
                 "b8:--batch 8 --ctx 4096 --prefill 0 --steps 8"; do
        [[ " ${AB_CFGS:-b1 b128 prefill8192 b32 b8} " == *" ${cfg%%:*} "* ]] || continue
        for side in new ${AB_NOPDL:+newnopdl} base; do
          BIN=dsv4; X=; [ $side = base ] && BIN=dsv4-base-$BASEC; [ $side = newnopdl ] && X=--no-pdl
          # shellcheck disable=SC2086
          DSV4_BIN=$BIN bench ab-$side-${cfg%%:*}-r$r ${cfg#*:} --no-profile $X
        done
      done
    done
  fi
  if has test && [ -x "$B/test_gpu" ]; then
    log "GPU tests"
    F=()
    [ -n "${GTEST_FILTER:-}" ] && F=(--gtest_filter="$GTEST_FILTER")
    l=$(left)
    DSV4_COMMIT=${DSV4_COMMIT:-unknown} timeout $((l > 200 ? l - 100 : 30)) \
      scripts/test-gpu.sh --log "$OUT/test-gpu.log" "$B" "${F[@]}" > /dev/null 2>&1
    echo "tests rc=$?"
    grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests? ran" "$OUT/test-gpu.log" | tail -40
  fi
  if has wgmma && [ -x "$B/dsv4" ]; then
    for r in 1 2; do
      bench_run wgmma 4 prefill8192-l4-wgmma-r$r --layers 4 --device cuda --ctx 0 --prefill 8192 --steps 1 --no-profile \
        --wgmma
      bench_run wgmma 4 prefill8192-l4-nowgmma-r$r --layers 4 --device cuda --ctx 0 --prefill 8192 --steps 1 --no-profile
    done
  fi
  if [ -x "$B/dsv4" ]; then
    has dense && bench b1-ctx4096-dense --ctx 4096 --prefill 0 --steps 16 --numerics dense --no-profile
    has prefill && bench prefill8192 --ctx 0 --prefill 8192 --steps 1 --no-profile
    if has batch; then
      for b in 8 32 128; do bench b$b-ctx4096 --batch $b --ctx 4096 --prefill 0 --steps 8 --no-profile; done
      bench b8-ctx4096-nograph --batch 8 --ctx 4096 --prefill 0 --steps 8 --no-profile --no-cuda-graph
    fi
  fi
  if [ -x "$B/dsv4" ]; then
    has hyb1 && hbench hyb-b1-ctx1024-prefill2048 --gpu-experts auto --batch 1 --ctx 1024 --prefill 2048 --steps 32
    has hyb4 && hbench hyb-b4-ctx1024 --gpu-experts auto --batch 4 --ctx 1024 --prefill 0 --steps 16 --no-profile
    has hyb8k && hbench hyb-prefill8192 --gpu-experts auto --batch 1 --ctx 0 --prefill 8192 --steps 2 --no-profile
    has hybn && hbench hyb-ncpumoe8-b1-ctx1024 --n-cpu-moe 8 --batch 1 --ctx 1024 --prefill 0 --steps 16 --no-profile
    if has hybstage; then
      hbench hyb-stage-prefill2048 --gpu-experts auto --batch 1 --ctx 0 --prefill 2048 --steps 2 --no-profile
      hbench hyb-nostage-prefill2048 --gpu-experts auto --batch 1 --ctx 0 --prefill 2048 --steps 2 --no-profile \
        --stage-tokens 0
      hbench hyb-stage-prefill8192 --gpu-experts auto --batch 1 --ctx 0 --prefill 8192 --steps 2 --no-profile
    fi
  fi
  if has gemm && [ -x "$B/dsv4" ] && [ "$(left)" -gt 40 ]; then
    log "bench gemm ($(nproc) threads)"
    timeout $(($(left) - 10)) "$B/dsv4" bench gemm --threads "$(nproc)" --json > "$OUT/bench-gemm.json" \
      2> /tmp/gemm.err
    echo "bench gemm rc=$?"
    tail -12 /tmp/gemm.err
  fi
  if has serve && [ -x "$B/dsv4" ] && [ "$(left)" -gt 60 ]; then
    log "bench serve"
    timeout $(($(left) - 30)) "$B/dsv4" bench serve -m models/dsv4-demo --device cuda --clients 1,8,64,256 \
      --tokens 64 --requests 2 --json > "$OUT/bench-serve.json" 2> /tmp/serve.err
    echo "bench serve rc=$?"
    tail -8 /tmp/serve.err
  fi
  if has cpuserve && [ -x "$B/dsv4" ]; then  # OpenMP's default wait policy (what a user gets) and passive (the tests')
    for r in 1 2; do for pol in default passive; do for t in 16 8 4 2; do
      [ "$(left)" -gt 40 ] || break 3
      log "bench serve cpu threads $t round $r OMP_WAIT_POLICY $pol"
      E=(env -u OMP_WAIT_POLICY); [ "$pol" = passive ] && E=(env OMP_WAIT_POLICY=passive)
      timeout $(($(left) - 20)) "${E[@]}" "$B/dsv4" bench serve -m models/dsv4-demo --device cpu --clients 1,8 --tokens 64 \
        --requests 4 --threads $t --json > /tmp/serve-cpu.json 2> /tmp/serve-cpu.err
      echo "bench serve cpu rc=$?"; tail -3 /tmp/serve-cpu.err
      { printf '{"threads": %s, "round": %s, "omp_wait_policy": "%s", "result": ' $t $r $pol; tr -d '\n' < /tmp/serve-cpu.json; echo '}'; } >> "$OUT/bench-serve-cpu.jsonl"
    done; done; done
  fi
  if has prefpow && [ -x "$B/dsv4" ]; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
      --format=csv -lms 100 > "$OUT/prefill-power.csv" 2>&1 &
    SMI=$!
    bench prefill8192-pow --ctx 0 --prefill 8192 --steps 1 --no-profile
    kill $SMI
  fi
  if has spec && [ -x "$B/dsv4" ] && [ "$(left)" -gt 60 ]; then
    log "bench spec"
    timeout $(($(left) - 20)) "$B/dsv4" bench spec --config "$CFG" --load-format dummy --layers "${LAYERS:-24}" --device cuda \
      --batch 1,8 --draft 1,2,3 -n 48 --json > "$OUT/bench-spec.json" 2> /tmp/spec.err
    echo "bench spec rc=$?"
    tail -8 /tmp/spec.err
  fi
  if has specdet && [ -x "$B/dsv4" ] && [ "$(left)" -gt 60 ]; then
    log "bench spec (deterministic, batch 8)"
    timeout $(($(left) - 20)) "$B/dsv4" bench spec --config "$CFG" --load-format dummy --layers "${LAYERS:-24}" --device cuda \
      --batch 8 --draft 1,2 -n 32 --deterministic --json > "$OUT/bench-spec-det.json" 2> /tmp/specdet.err
    echo "bench spec det rc=$?"
    tail -8 /tmp/specdet.err
  fi
  if has pprof && [ -x "$B/dsv4" ]; then  # prefill per-op breakdown (4 layers)
    bench_run pprof 12 p4-prefill2048 --layers 4 --device cuda --ctx 0 --prefill 2048 --steps 1
    bench_run pprof 12 p4-prefill8192 --layers 4 --device cuda --ctx 0 --prefill 8192 --steps 1
  fi
  if has bprof && [ -x "$B/dsv4" ]; then  # batched decode per-op breakdown (4 layers)
    bench_run bprof 12 p4-b128-ctx4096 --layers 4 --device cuda --batch 128 --ctx 4096 --prefill 0 --steps 4
    bench_run bprof 12 p4-b32-ctx4096 --layers 4 --device cuda --batch 32 --ctx 4096 --prefill 0 --steps 4
  fi
  if has ncub && [ -x "$B/dsv4" ] && command -v ncu > /dev/null && [ "$(left)" -gt 70 ]; then
    log "ncu batch-128 decode (2 layers, ctx 4096, eager; launches 1400.. skip the context prefill of 4096 tokens and the first warm-up steps)"
    timeout $(($(left) - 15)) ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__cycles_elapsed.avg \
      --kernel-name regex:'^(?!.*(fill_random|random_fill))' --launch-skip 1400 --launch-count 300 "$B/dsv4" bench model --config "$CFG" --load-format dummy --layers 2 \
      --device cuda --batch 128 --ctx 4096 --prefill 0 --steps 6 --no-cuda-graph --no-profile > "$OUT/ncu-b128.csv" 2> /tmp/ncu.err
    echo "ncu b128 rc=$? ($(wc -l < "$OUT/ncu-b128.csv") lines)"
    tail -3 /tmp/ncu.err
  fi
  if has prof && [ -x "$B/dsv4" ] && [ "$(left)" -gt 90 ]; then
    if command -v nsys > /dev/null; then
      log "nsys"
      timeout $(($(left) - 30)) nsys profile -o /tmp/prof -f true --trace=cuda --cuda-graph-trace=node \
        "$B/dsv4" bench model --config "$CFG" --load-format dummy --layers "${LAYERS:-24}" --device cuda --ctx 4096 --prefill 0 \
        --steps 16 --no-profile > /tmp/nsys.out 2>&1
      echo "nsys rc=$?"; tail -4 /tmp/nsys.out
      nsys stats --report cuda_gpu_kern_sum --format csv -o /tmp/kern /tmp/prof.nsys-rep > /dev/null 2>&1
      nsys stats --report cuda_gpu_trace --format csv -o /tmp/trace /tmp/prof.nsys-rep > /dev/null 2>&1
      cp /tmp/kern*.csv "$OUT/nsys-kern.csv" 2> /dev/null
      gzip -c /tmp/trace*.csv > "$OUT/nsys-trace.csv.gz" 2> /dev/null
      ls -la "$OUT"
    else
      echo "prof: no nsys on this machine"
    fi
  fi
  if has hf && [ -x "$B/dsv4" ] && [ "$(left)" -gt 90 ]; then
    log "hf side by side"
    timeout $(($(left) - 15)) python3 tools/bench/hf_side_by_side.py --dsv4 "$B/dsv4" --config "$CFG" --layers 4 \
      --prefill 2048 --steps 16 --out "$OUT/side-by-side.json" > /tmp/hf.out 2>&1
    echo "hf rc=$?"; tail -25 /tmp/hf.out; cp /tmp/hf.out "$OUT/side-by-side.log"
  fi
  if has ncud && [ -x "$B/dsv4" ] && command -v ncu > /dev/null && [ "$(left)" -gt 70 ]; then
    log "ncu decode (2 layers, ctx 4096, eager; the weight fills are not counted; launches 300.. skip the context prefill and the first warm-up steps)"
    timeout $(($(left) - 15)) ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__cycles_elapsed.avg \
      --kernel-name regex:'^(?!.*(fill_random|random_fill))' --launch-skip 300 --launch-count 700 "$B/dsv4" bench model --config "$CFG" --load-format dummy --layers 2 \
      --device cuda --ctx 4096 --prefill 0 --steps 4 --no-cuda-graph --no-profile > "$OUT/ncu-decode.csv" 2> /tmp/ncu.err
    echo "ncu decode rc=$? ($(wc -l < "$OUT/ncu-decode.csv") lines)"
    tail -3 /tmp/ncu.err
  fi
  if has ncup && [ -x "$B/dsv4" ] && command -v ncu > /dev/null && [ "$(left)" -gt 90 ]; then
    bench_run ncup 4 prefill8192-l4 --layers 4 --device cuda --ctx 0 --prefill 8192 --steps 1 --no-profile
    log "ncu prefill (4 layers, 8192 tokens, unlocked clocks, every kernel but the weight fills)"
    timeout $(($(left) - 15)) ncu --clock-control none --csv --metrics gpu__time_duration.sum \
      --kernel-name regex:'^(?!.*(fill_random|random_fill))' "$B/dsv4" bench model --config "$CFG" --load-format dummy \
      --layers 4 --device cuda --ctx 0 --prefill 8192 --steps 1 --no-profile > "$OUT/ncu-prefill.csv" 2> /tmp/ncu.err
    echo "ncu prefill rc=$? ($(wc -l < "$OUT/ncu-prefill.csv") lines)"
    tail -3 /tmp/ncu.err
  fi
  if has timeline && [ -x "$B/dsv4" ]; then
    bench_run timeline 8 timeline-prefill8192-l4 --layers 4 --device cuda --ctx 0 --prefill 8192 --steps 1 --no-profile \
      --timeline "$OUT/timeline-prefill8192.tsv"
  fi
  if has ncum && [ -x "$B/dsv4" ] && command -v ncu > /dev/null && [ "$(left)" -gt 70 ]; then
    log "ncu moe_tc_big_kernel / moe_wgmma_kernel details (prefill of 2048 tokens, 1 layer)"
    timeout $(($(left) - 15)) ncu --csv --page details --section SpeedOfLight --section WarpStateStats \
      --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      --kernel-name regex:'moe_tc_big|moe_wgmma' --launch-count 2 "$B/dsv4" bench model --config "$CFG" --load-format dummy \
      --layers 1 --device cuda --ctx 0 --prefill 2048 --steps 1 --no-profile > "$OUT/ncu-moe-big.csv" 2> /tmp/ncu.err
    echo "ncu moe_tc_big rc=$? ($(wc -l < "$OUT/ncu-moe-big.csv") lines)"
    tail -3 /tmp/ncu.err
  fi
  if has ncuk && [ -x "$B/dsv4" ] && command -v ncu > /dev/null && [ "$(left)" -gt 70 ]; then
    log "ncu kernel details (gemv, gemv_tc, moe_tc_small, hc_finish; 2 layers, ctx 4096, eager decode)"
    timeout $(($(left) - 15)) ncu --csv --page details --section SpeedOfLight --section WarpStateStats \
      --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      --kernel-name regex:'gemv_kernel|gemv_tc|moe_tc_small|hc_finish' --launch-skip 110 --launch-count 40 "$B/dsv4" bench model \
      --config "$CFG" --load-format dummy --layers 2 --device cuda --ctx 4096 --prefill 0 --steps 4 --no-cuda-graph \
      --no-profile > "$OUT/ncu-kernels.csv" 2> /tmp/ncu.err
    echo "ncu kernels rc=$? ($(wc -l < "$OUT/ncu-kernels.csv") lines)"
    tail -3 /tmp/ncu.err
  fi
  if has ncu && [ -x "$B/dsv4" ] && command -v ncu > /dev/null && [ "$(left)" -gt 70 ]; then
    log "ncu"
    timeout $(($(left) - 15)) ncu --clock-control none --csv --metrics gpu__time_duration.sum \
      --kernel-name regex:'gemv|moe|hc_|attn|indexer|rmsnorm|act_quant|tile|small|swiglu|route|rope' \
      --launch-count 400 "$B/dsv4" bench model --config "$CFG" --load-format dummy --layers 4 --device cuda \
      --ctx 0 --prefill 0 --steps 2 --no-profile > "$OUT/ncu.csv" 2> /tmp/ncu.err
    echo "ncu rc=$? ($(wc -l < "$OUT/ncu.csv") lines)"
    tail -3 /tmp/ncu.err
  fi
  log "done"
} > "$OUT/run.log" 2>&1
tail -70 "$OUT/run.log"

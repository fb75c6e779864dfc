#!/bin/bash
# Device script of helper B (tokenizer): HF `tokenizers` golden ids for tests/data/tokenizer/corpus.jsonl and a
# single-thread throughput comparison HF vs dsv4 on the same text and the same CPU core.
# Run from the repo root on the GPU machine: `bash tools/device/B.sh` with $OUT set and `.scratch/devbin` carried
# (bench_tokenizer built here + the non-system shared libraries it needs, and tokenizer.json.xz for when
# models/dsv4-demo/tokenizer.json is left out of the tree to keep it under the transfer limit).
# Writes only $OUT/B.tgz: golden.jsonl, hf_bench.json, dsv4_bench.json, B.log. Budget: <= 45 s.
set -u
export PYTHONUNBUFFERED=1
W=$(mktemp -d)
finish() {
  trap - EXIT TERM INT
  tar -czf "$OUT/B.tgz" -C "$W" .
  tail -n 40 "$W/B.log"
}
trap finish EXIT TERM INT

run_all() {
  local PY=/opt/torch/.venv/bin/python
  [ -x "$PY" ] || PY=python3
  "$PY" -c 'import sys, tokenizers; print("python", sys.version.split()[0], "tokenizers", tokenizers.__version__)'
  nproc; lscpu | grep -m1 "Model name"; grep -m1 -o 'avx512[a-z]*\|avx2' /proc/cpuinfo | sort -u | head -3
  local B=.scratch/devbin LP=.scratch/devbin CPU=$(( $(nproc) > 3 ? 3 : 0 ))
  local TOK=models/dsv4-demo/tokenizer.json
  if [ ! -f "$TOK" ]; then
    TOK=$(mktemp -d)/tokenizer.json
    xz -dc $B/tokenizer.json.xz > "$TOK" || "$PY" -c 'import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' $B/tokenizer.json.xz > "$TOK"
  fi
  sha256sum "$TOK"
  echo "LD_LIBRARY_PATH=$LP"
  echo "== golden + HF timing"
  timeout 22 taskset -c $CPU "$PY" tools/oracle/tokenizer_golden.py "$TOK" \
    tests/data/tokenizer/corpus.jsonl "$W/golden.jsonl" "$W/hf_bench.json"
  echo "rc=$?"
  echo "== dsv4 timing"
  LD_LIBRARY_PATH=$LP timeout 15 taskset -c $CPU $B/bench_tokenizer --benchmark_min_time=0.2 \
    --benchmark_out="$W/dsv4_bench.json" --benchmark_out_format=json \
    --tokenizer="$TOK" --corpus=tests/data/tokenizer/corpus.jsonl
  echo "rc=$?"
}
run_all > "$W/B.log" 2>&1

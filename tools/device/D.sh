#!/bin/bash
# Task D (golden fixtures) device script. Run from the repo root on the GPU machine:
#   bash tools/device/D.sh          tiny-model goldens (HF dense + reference oracle + CPU noise floor), <= ~120 s,
#                                   then, if models/dsv4-demo has weights and tests/data/demo/prompts.json exists, the
#                                   reference greedy fixture in the time left (total <= 178 s; partial output kept)
#   bash tools/device/D.sh greedy   only the greedy fixture (<= 170 s)
# Needs the carried path .scratch/official (official inference/model.py, never committed). Writes ONLY $OUT/D.tgz
# (golden/*.json or demo/greedy_reference.json, plus D.log); each step is guarded by `timeout`.
set -u
MODE=${1:-goldens}
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
OUT=${OUT:-/tmp/D_out}; mkdir -p "$OUT"
W=$(mktemp -d); mkdir -p "$W/golden" "$W/lp" "$W/demo"
LOG="$W/D.log"
finish() { rm -rf "$W/lp"; tar -C "$W" -czf "$OUT/D.tgz" . ; }
trap finish EXIT
PY=python3; [ -x /opt/torch/.venv/bin/python ] && PY=/opt/torch/.venv/bin/python
T0=$(date +%s)
{
  echo "== env $(date -u) mode=$MODE"; nvidia-smi -L 2>&1 | head -2
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  ls -la .scratch/official
  if [ "$MODE" != greedy ]; then
    echo "== hf dense goldens $(( $(date +%s) - T0 ))s"
    timeout 40 $PY tools/oracle/hf_golden.py --model-dir tests/data/tiny-a --model-dir tests/data/tiny-b \
        --out-dir "$W/golden" --logprob-dir "$W/lp"; echo "hf rc=$?"
    echo "== reference oracle $(( $(date +%s) - T0 ))s"
    timeout 80 $PY tools/oracle/reference_oracle.py --model-dir tests/data/tiny-a --model-dir tests/data/tiny-b \
        --official .scratch/official --out-dir "$W/golden" --logprob-dir "$W/lp" --noise-device cpu; echo "ref rc=$?"
  fi
  LEFT=$(( 175 - ($(date +%s) - T0) ))
  if ls models/dsv4-demo/*.safetensors >/dev/null 2>&1 && [ -f tests/data/demo/prompts.json ] && [ $LEFT -gt 20 ]; then
    echo "== greedy demo fixture $(( $(date +%s) - T0 ))s (limit ${LEFT}s)"
    ls -la models/dsv4-demo tests/data/demo
    cp tests/data/demo/greedy_dense.json "$W/demo/" 2>/dev/null
    timeout $LEFT $PY tools/oracle/reference_oracle.py --greedy-model models/dsv4-demo \
        --greedy-prompts tests/data/demo/prompts.json --greedy-out "$W/demo/greedy_reference.json" \
        --official .scratch/official; echo "greedy rc=$?"
    rm -f "$W/demo/greedy_dense.json"
  else
    echo "== greedy demo fixture skipped (no model/prompts or no time: ${LEFT}s)"
  fi
  echo "== done $(( $(date +%s) - T0 ))s"; ls -la "$W/golden" "$W/demo"
} > "$LOG" 2>&1

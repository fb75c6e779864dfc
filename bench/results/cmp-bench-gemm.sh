#!/bin/bash
# Interleaved old/new `dsv4 bench gemm` (decode figures; small prefill): per run the read / copy bandwidth, the decode
# MoE layer, the old per-linear layer measure (new binaries only), the FP4 / FP8 GEMVs, % of copy / read; then medians.
# Run from the repository root on a shared machine (OMP_WAIT_POLICY=passive is set here).
# usage: cmp-bench-gemm.sh OLD NEW RUNS THREADS   (OUT=file for the per-run lines, default /tmp/cmp-bench-gemm.txt)
OLD=$1; NEW=$2; RUNS=${3:-5}; TH=${4:-2}; OUT=${OUT:-/tmp/cmp-bench-gemm.txt}
: > "$OUT"
for r in $(seq "$RUNS"); do
  for b in old new; do
    BIN=$OLD; [ $b = new ] && BIN=$NEW
    OMP_WAIT_POLICY=passive $BIN bench gemm --threads "$TH" --no-head --prefill-tokens 64 --seconds 1 --json 2>/dev/null |
      python3 -c "
import json, sys
d = json.load(sys.stdin); g = d['decode_gemv_GBps']
pl = d.get('decode_moe_layer_per_linear', {}).get('GBps', float('nan'))
print('$b', *(round(v, 2) for v in (d['read_GBps'], d['copy_GBps'], d['decode_moe_layer']['GBps'], pl, g['fp4_expert_w1'],
      g['fp8_w1_streamed'], g['fp8_w1_streamed_no_subnormal_codes'], d['decode_moe_layer']['pct_of_copy'],
      100 * g['fp8_w1_streamed'] / d['read_GBps'])))" | tee -a "$OUT"
  done
done
python3 - "$OUT" <<'P'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1])]
names = ['read', 'copy', 'moe_layer', 'moe_per_linear', 'fp4_w1', 'fp8_streamed', 'fp8_nosub', 'moe_pct_of_copy',
         'fp8_pct_of_read']
for b in ('old', 'new'):
    r = [x for x in rows if x[0] == b]
    print(b, 'medians:', ' '.join(f"{n}={st.median(float(x[i + 1]) for x in r):.2f}" for i, n in enumerate(names)))
P
echo "load average after: $(cat /proc/loadavg)"

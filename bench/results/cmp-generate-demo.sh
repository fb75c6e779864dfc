#!/bin/bash
# Interleaved old/new dsv4 generate on the demo model (512-token prompt, 128 greedy tokens): per-run prefill and decode tok/s, then medians.
# Run from the repository root with OMP_WAIT_POLICY=passive on a shared machine.
# usage: cmp.sh OLD NEW RUNS THREADS  -> prints per-run prefill/decode tok/s, then medians
OLD=$1; NEW=$2; RUNS=${3:-5}; TH=${4:-2}
IDS=$(python3 -c "print(','.join(str(100+(i*37)%5000) for i in range(512)))")
M=${MODEL:-models/dsv4-demo}
for r in $(seq $RUNS); do
  for b in old new; do
    BIN=$OLD; [ $b = new ] && BIN=$NEW
    $BIN generate -m $M --prompt-ids "$IDS" -n 128 --temp 0 --ignore-eos --threads $TH --json --ctx 1024 2>/dev/null \
      | python3 -c "import json,sys;d=json.load(sys.stdin);t=d['timings'];print('$b', round(t['prefill_tokens_per_s']), round(t['decode_tokens_per_s'],1), hash(tuple(d['ids'])))"
  done
done | tee ${OUT:-/tmp/cmp-generate-demo.txt}
python3 - <<'P'
import os, statistics as st
rows=[l.split() for l in open(os.environ.get('OUT', '/tmp/cmp-generate-demo.txt'))]
for b in ('old','new'):
    p=[float(r[1]) for r in rows if r[0]==b]; d=[float(r[2]) for r in rows if r[0]==b]
    print(b,'prefill median',st.median(p),'decode median',st.median(d), 'ids', set(r[3] for r in rows if r[0]==b))
P

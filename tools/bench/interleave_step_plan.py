#!/usr/bin/env python3
# Interleaved runs of bench_step_plan binaries: ROUNDS rounds, each running every binary once (order rotated per
# round) with the same arguments; per binary the medians over all reps of all rounds, and the load average.
#   tools/bench/interleave_step_plan.py ROUNDS NAME="BINARY [ARGS]"... -- ARGS
# (a binary's own arguments come before the common ones)
import json, os, shlex, statistics, subprocess, sys
rounds = int(sys.argv[1]); i = sys.argv.index("--")
bins = [a.split("=", 1) for a in sys.argv[2:i]]; args = sys.argv[i + 1:]
reps = {n: {"build": [], "pack_upload": [], "total": []} for n, _ in bins}
loads = []
for r in range(rounds):
    for k in range(len(bins)):
        name, exe = bins[(r + k) % len(bins)]
        loads.append(os.getloadavg()[0])
        d = json.loads(subprocess.run(shlex.split(exe) + args, check=True, capture_output=True, text=True).stdout)
        reps[name]["build"] += d["build_ms"]; reps[name]["pack_upload"] += d["pack_upload_ms"]
        reps[name]["total"] += [a + b for a, b in zip(d["build_ms"], d["pack_upload_ms"])]
print(f"args: {' '.join(args)}; {rounds} rounds; load average (1 min) {min(loads):.2f}-{max(loads):.2f}, "
      f"median {statistics.median(loads):.2f}")
for name, v in reps.items():
    print(f"  {name:10s} reps {len(v['build']):4d}  build {statistics.median(v['build']):8.3f} ms  "
          f"pack+upload {statistics.median(v['pack_upload']):7.3f} ms  build+pack+upload "
          f"{statistics.median(v['total']):8.3f} ms")

#!/usr/bin/env python3
"""Interleaved runs of `dsv4 bench serve --json` with several dsv4 binaries, for old-vs-new comparisons on a shared,
noisy machine.

    tools/bench/interleave.py ROUNDS NAME=BINARY [NAME=BINARY ...] [-- BENCH ARGS]

Each round runs every binary once, the order rotated from round to round, each run started only once the machine is
quiet (less than 0.15 of a CPU busy over one second, waiting at most 300 s; `quiet 0` in the line when it never
was). The bench arguments default to issue 10's CPU measurement (`bench serve -m models/dsv4-demo --device cpu --clients
1,8 --tokens 64 --requests 3 --threads 2 --json`); the environment (e.g. OMP_WAIT_POLICY) is passed on. One line per
run: name, round, the 1-minute load average at its start, whether it started quiet, the CPU-seconds other processes
used during it, then per level tok/s and tokens per CPU-second of the bench process, and the ratio of the last level's
tok/s to the first's. At the end: per binary the medians, and per binary the paired medians (same round) against the
first binary."""
import json
import os
import statistics
import subprocess
import sys
import time

DEFAULT_ARGS = ("bench serve -m models/dsv4-demo --device cpu --clients 1,8 --tokens 64 --requests 3 --threads 2 "
                "--json").split()


def cpu_jiffies():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v), v[3] + v[4]  # all, idle + iowait


def busy_cpus(seconds):
    t0, i0 = cpu_jiffies()
    time.sleep(seconds)
    t1, i1 = cpu_jiffies()
    return (t1 - t0 - (i1 - i0)) / max(1, t1 - t0) * os.cpu_count()


def wait_quiet(limit=0.15, max_wait=300):
    start = time.time()
    while time.time() - start < max_wait:
        if busy_cpus(1.0) < limit:
            return True
    return False


def main():
    argv = sys.argv[1:]
    bench_args = DEFAULT_ARGS
    if "--" in argv:
        bench_args = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    rounds = int(argv[0])
    bins = [a.split("=", 1) for a in argv[1:]]
    runs = {name: {} for name, _ in bins}
    for r in range(rounds):
        for name, binary in bins[r % len(bins):] + bins[:r % len(bins)]:
            quiet = wait_quiet()
            load = open("/proc/loadavg").read().split()[0]
            t0, i0 = cpu_jiffies()
            c0 = os.times()
            p = subprocess.run([binary] + bench_args, capture_output=True, text=True)
            c1 = os.times()
            t1, i1 = cpu_jiffies()
            ours = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
            others = (t1 - t0 - (i1 - i0)) / os.sysconf("SC_CLK_TCK") - ours
            try:
                levels = json.loads(p.stdout[p.stdout.index("{"):])["levels"]
            except ValueError:
                print(f"{name} r{r} failed: {p.stderr[-300:]}", flush=True)
                continue
            runs[name][r] = levels
            line = " ".join(f"tok{l['clients']} {l['tokens_per_s']:.0f} cpu{l['clients']} {l['tokens_per_cpu_s']:.0f}"
                            for l in levels)
            ratio = levels[-1]["tokens_per_s"] / levels[0]["tokens_per_s"]
            print(f"{name} r{r} load {load} quiet {int(quiet)} others_cpu_s {others:.2f} {line} ratio {ratio:.3f}",
                  flush=True)
    first = bins[0][0]
    for name, _ in bins:
        got = list(runs[name].values())
        if not got:
            continue
        med = [statistics.median(lv[i]["tokens_per_s"] for lv in got) for i in range(len(got[0]))]
        print(f"median {name} ({len(got)} runs): " +
              " ".join(f"{lv['clients']} clients {m:.0f} tok/s" for lv, m in zip(got[0], med)) +
              f", ratio of medians {med[-1] / med[0]:.2f}, median ratio "
              f"{statistics.median(lv[-1]['tokens_per_s'] / lv[0]['tokens_per_s'] for lv in got):.2f}")
        if name != first:
            common = sorted(set(runs[name]) & set(runs[first]))
            for i, lv in enumerate(got[0]):
                pr = statistics.median(runs[name][k][i]["tokens_per_s"] / runs[first][k][i]["tokens_per_s"]
                                       for k in common)
                print(f"  paired median {name}/{first}, {lv['clients']} clients: x{pr:.3f} ({len(common)} rounds)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Compare a candidate logprob dump against a golden file (pure stdlib; runs anywhere).

Both files use the golden format of tests/data/golden/README.md ({"prompts":[{"ids","top_ids","top_logprobs"}]});
the candidate may hold fewer positions per prompt (a prefix) or fewer than 20 entries per position, or be the
`dsv4 logprobs --json` output ({"positions": [...]}) of one prompt given with --prompt-index. For every
position, |Δ logprob| is taken over the golden top-20 ids that the candidate also lists; the report gives the median,
p99 and max of those differences, the top-1 agreement, and how many golden ids were missing from the candidate lists.

Usage: compare_golden.py GOLDEN.json CANDIDATE.json [--max-p99 X] [--min-top1 Y]   (exit 1 when a limit is exceeded)
"""
import argparse
import json
import sys


def quantile(sorted_vals, q):
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[i]


def compare(golden, cand, prompt_index=None):
    diffs, top1, positions, missing = [], 0, 0, 0
    if "positions" in cand:  # `dsv4 logprobs --json` output: one prompt, {"positions": [{"top_ids", "top_logprobs"}]}
        if prompt_index is None:
            raise ValueError("candidate holds a single prompt: pass --prompt-index")
        pos = cand["positions"]
        gp = golden["prompts"][prompt_index]
        cand = {"prompts": [{"ids": gp["ids"][:len(pos)], "top_ids": [p["top_ids"] for p in pos],
                             "top_logprobs": [p["top_logprobs"] for p in pos]}]}
        golden = {"prompts": [gp]}
    for gp, cp in zip(golden["prompts"], cand["prompts"]):
        if gp["ids"][:len(cp["ids"])] != cp["ids"][:len(gp["ids"])]:
            raise ValueError("prompt ids differ between golden and candidate")
        for gi, gl, ci, cl in zip(gp["top_ids"], gp["top_logprobs"], cp["top_ids"], cp["top_logprobs"]):
            positions += 1
            cmap = dict(zip(ci, cl))
            top1 += int(ci[0] == gi[0])
            for t, v in zip(gi, gl):
                if t in cmap:
                    diffs.append(abs(cmap[t] - v))
                else:
                    missing += 1
    diffs.sort()
    return {"positions": positions, "median": quantile(diffs, 0.5), "p99": quantile(diffs, 0.99),
            "max": diffs[-1] if diffs else float("nan"), "top1_agree": top1 / max(positions, 1),
            "missing_ids": missing}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("golden")
    ap.add_argument("candidate")
    ap.add_argument("--prompt-index", type=int, default=None,
                    help="golden prompt the candidate belongs to when it is a `dsv4 logprobs --json` dump")
    ap.add_argument("--max-p99", type=float, default=None)
    ap.add_argument("--min-top1", type=float, default=None)
    args = ap.parse_args()
    r = compare(json.load(open(args.golden)), json.load(open(args.candidate)), args.prompt_index)
    print(json.dumps(r))
    bad = (args.max_p99 is not None and not r["p99"] <= args.max_p99) or \
          (args.min_top1 is not None and not r["top1_agree"] >= args.min_top1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

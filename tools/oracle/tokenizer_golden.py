#!/usr/bin/env python3
"""GPU-machine oracle for the tokenizer: golden token ids from Hugging Face `tokenizers`, plus HF throughput.

Reads tests/data/tokenizer/corpus.jsonl (one JSON string per line) and writes, line for line,
  GOLDEN (default tests/data/tokenizer/golden.jsonl): first a header object
    {"tokenizers": VERSION, "corpus_sha256": HEX, "lines": N, "plain": true|false}, then per corpus line
    {"ids": [...]}  -- tok.encode(text, add_special_tokens=False).ids (special tokens matched, HF default)
    plus "plain": [...] when encoding with special-token matching off (encode_special_tokens=True) differs.
  BENCH_JSON (optional): single-thread HF throughput on the text the C++ benchmark uses
    (corpus lines joined by "\n", repeated until >= 2,000,000 bytes).
Also checks tok.decode(ids) == text for every line and reports mismatches.
Usage: python3 tools/oracle/tokenizer_golden.py TOKENIZER_JSON CORPUS GOLDEN [BENCH_JSON]
"""
import hashlib
import json
import os
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["RAYON_RS_NUM_CPUS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def main():
    tok_path, corpus_path, golden_path = sys.argv[1:4]
    bench_path = sys.argv[4] if len(sys.argv) > 4 else None
    raw = open(corpus_path, "rb").read()
    lines = [json.loads(l) for l in raw.decode("utf-8").split("\n") if l]
    tok = Tokenizer.from_file(tok_path)

    golden = [tok.encode(t, add_special_tokens=False).ids for t in lines]
    bad_decode = [i for i, (t, ids) in enumerate(zip(lines, golden)) if tok.decode(ids, skip_special_tokens=False) != t]
    plain = None
    if hasattr(tok, "encode_special_tokens"):
        tok.encode_special_tokens = True
        plain = [tok.encode(t, add_special_tokens=False).ids for t in lines]
        tok.encode_special_tokens = False
    with open(golden_path, "w", encoding="utf-8", newline="\n") as f:
        head = {"tokenizers": tokenizers.__version__, "corpus_sha256": hashlib.sha256(raw).hexdigest(),
                "lines": len(lines), "plain": plain is not None}
        f.write(json.dumps(head) + "\n")
        for i, ids in enumerate(golden):
            rec = {"ids": ids}
            if plain is not None and plain[i] != ids:
                rec["plain"] = plain[i]
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    print(f"golden: {len(lines)} lines, {sum(map(len, golden))} tokens, decode mismatches: {bad_decode[:20]}")

    if bench_path:
        text = "\n".join(lines)
        big = text
        while len(big.encode("utf-8")) < 2_000_000:
            big += "\n" + text
        nbytes = len(big.encode("utf-8"))
        res = {"tokenizers": tokenizers.__version__, "bytes": nbytes}
        best = 1e9
        for _ in range(5):
            t0 = time.perf_counter()
            n = len(tok.encode(big, add_special_tokens=False).ids)
            best = min(best, time.perf_counter() - t0)
        res.update(whole_tokens=n, whole_s=best, whole_MBps=nbytes / best / 1e6)
        tbytes = len(text.encode("utf-8")) - (len(lines) - 1)
        best = 1e9
        for _ in range(3):
            t0 = time.perf_counter()
            for t in lines:
                tok.encode(t, add_special_tokens=False)
            best = min(best, time.perf_counter() - t0)
        res.update(lines_s=best, lines_MBps=tbytes / best / 1e6)
        best = 1e9
        for _ in range(3):
            t0 = time.perf_counter()
            tok.encode_batch(lines, add_special_tokens=False)
            best = min(best, time.perf_counter() - t0)
        res.update(batch_s=best, batch_MBps=tbytes / best / 1e6)
        with open(bench_path, "w") as f:
            json.dump(res, f, indent=1)
        print("HF bench:", json.dumps(res))


if __name__ == "__main__":
    main()

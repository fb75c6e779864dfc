#!/usr/bin/env python3
"""Instructions per k-block (128 columns) of moe_tc_big_kernel (src/backend/cuda/k_moe_tc.cu), counted in its SASS.

Usage: tools/device/moe_big_sass_count.py [--src REPO] [--nvdisasm PATH] [--lines]

Compiles REPO's k_moe_tc.cu for sm_90a with the build's flags (CUDA 13.0 nvcc at /usr/local/cuda), disassembles it
and, for each instantiation (kW13 / kW2, and where the source has them the f16 and the e4m3 forms of the kernels
before the f16-weight one), walks the K loop once along each way through its conditional branches that issues the
next stage's loads (LDGSTS), and prints:
  f16-weight kernel (no form parameter): 'fast' = the shortest walk with the accumulators' rescale (64 FMUL) and no
    FFMA (a block whose E8M0 codes are all in the f16 range: every k-block but the first), 'fast, k-block 0' = the
    shortest walk (no rescale), 'slow' = the longest (per-group scales: codes 0 / 255 / outside the f16 range);
  older forms: the shortest walk (blocks without an E8M0 code 0) and, where longer, the longest ('+ 0').
For each, the warp's instructions on that path by opcode, those of the ALU pipe (integer / logic / conversion: LOP3,
SHF, PRMT, F2FP, ...) and of the FMA pipe (IMAD, FFMA, FMUL, FADD, HMUL2), and the local-memory ones (spills: LDL /
STL); --lines adds them per source line. A static count: it says nothing about stalls, only what a warp issues per
k-block (f16-weight kernel: 128 HMMA.16816 = 4 m16 tiles x 4 n8 tiles x 8 k16 steps).
Shares the SASS parsing of moe_small_sass_count.py (nvdisasm notes there).
"""
import argparse
import collections
import itertools
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_small_sass_count import ALU, FMA, disassemble, op, parse  # noqa: E402


def kblock_paths(ins, tgt):
    """The K loop (the shortest backward branch around the HMMAs) walked once: of the conditional branches inside it
    both ways, every walk that issues the loads (LDGSTS)."""
    loops = [(tgt[k], k) for k in tgt if tgt[k] <= k and any('HMMA' in ins[q][1] for q in range(tgt[k], k + 1))]
    j, i = min(loops, key=lambda l: l[1] - l[0])
    cond = [k for k in range(j, i) if k in tgt and ins[k][1].startswith('@')]
    walks = []
    for bits in itertools.product([False, True], repeat=len(cond)):
        choice, k, path = dict(zip(cond, bits)), j, []
        while len(path) < 20000 and j <= k <= i:
            path.append(k)
            if k == i:
                break
            k = tgt[k] if k in tgt and (not ins[k][1].startswith('@') or choice.get(k, False)) else k + 1
        if path[-1] != i or not any('LDGSTS' in ins[q][1] for q in path):
            continue
        walks.append(path)
    return walks


def count(ins, path, label, lines):
    c = collections.Counter(op(ins[k][1]) for k in path)
    alu = sum(n for o, n in c.items() if o in ALU or o.startswith('UNK_'))
    fma = sum(n for o, n in c.items() if o in FMA)
    print('%-14s %4d instructions per k-block: ALU pipe %d, FMA pipe %d, HMMA %d, LDS %d, LDSM %d, LDGSTS %d, '
          'LDL %d, STL %d' % (label, len(path), alu, fma, c['HMMA'], c['LDS'], c['LDSM'], c['LDGSTS'], c['LDL'],
                              c['STL']))
    print('               ' + ' '.join('%s:%d' % kv for kv in c.most_common()))
    if lines:
        by = collections.defaultdict(collections.Counter)
        for k in path:
            by[ins[k][2]][op(ins[k][1])] += 1
        for ln in sorted(by, key=lambda x: x or ('', 0)):
            print('                 %s:%s %d %s' % (ln[0], ln[1], sum(by[ln].values()), dict(by[ln])) if ln else '')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--src', default=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
    ap.add_argument('--nvdisasm', default=shutil.which('nvdisasm') or '/usr/local/cuda/bin/nvdisasm')
    ap.add_argument('--lines', action='store_true', help='also per source line')
    a = ap.parse_args()
    if not os.path.exists(a.nvdisasm):
        sys.exit('no nvdisasm at %s (--nvdisasm PATH; Debian: apt-get install nvidia-cuda-toolkit)' % a.nvdisasm)
    with tempfile.TemporaryDirectory() as work:
        sass = disassemble(a.src, a.nvdisasm, work, 'k_moe_tc')
    names = sorted(set(re.findall(r'^(_Z\S*moe_tc_big_kernel\S*):$', sass, re.M)))
    for name in names:
        m = re.search(r'moe_tc_big_kernelILi(\d)E(?:Lb(\d)E)?', name)
        label = ('kW13' if m.group(1) == '0' else 'kW2') + ('' if m.group(2) is None else
                                                             ', f16' if m.group(2) == '1' else ', e4m3')
        ins, tgt = parse(sass, name)
        walks = kblock_paths(ins, tgt)
        short, long = min(walks, key=len), max(walks, key=len)
        if m.group(2) is None:  # the f16-weight kernel
            ops = lambda w, o: sum(1 for q in w if op(ins[q][1]) == o)  # noqa: E731
            fast = [w for w in walks if ops(w, 'FMUL') >= 64 and ops(w, 'FFMA') == 0]
            shown = ([(min(fast, key=len), ', fast')] if fast else []) + [(short, ', fast, k-block 0'),
                                                                           (long, ', slow')]
        else:
            shown = [(short, '')] + ([(long, ', + 0')] if len(long) != len(short) else [])
        for path, what in shown:
            count(ins, path, label + what, a.lines)


if __name__ == '__main__':
    main()

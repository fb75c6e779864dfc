#!/usr/bin/env python3
"""Instructions per item of moe_tc_small_kernel (src/backend/cuda/k_gemm.cu), counted in its SASS without a GPU.

Usage: tools/device/moe_small_sass_count.py [--slow] [--lines] [--src REPO] [--nvdisasm PATH]

Compiles REPO's k_gemm.cu for sm_90a with the build's flags (CUDA 13.0 nvcc at /usr/local/cuda), disassembles it and,
for each instantiation (kW13 / kW2 x KB = 2 / 1), walks the item loop once along the hot path: the fill issued,
no tile end, no new tile's sources, and (in sources with a per-stage vote, mt_plain_scales) the plain-scale path
(--slow: the path with the special-code masks). Prints the instructions on that path by opcode and the ones of the
ALU pipe (integer / logic / conversion: LOP3, SHF, IADD3, F2FP, PRMT, ...) and of the FMA pipe (IMAD, FFMA, FMUL,
FADD, HMUL2, ...), and the size of the item loop's code (tile end included: what the instruction caches must hold
while the loop runs); --lines adds the path's instructions per source line.

nvdisasm: the one of CUDA 13 where installed; else the CUDA 11.8 one of Debian's nvidia-cuda-toolkit (it reads
sm_90 instructions but not the ELF header that CUDA 13 writes, so the header is rewritten to the older layout first;
instructions newer than 11.8, e.g. VIADD, print as hex only and are counted as UNK_<opcode>, ALU pipe).
A static count: it says nothing about stalls, only how many instructions the warp issues per item.
"""
import argparse
import collections
import itertools
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

KINDS = [('kW13, KB=2', '1ELi2'), ('kW13, KB=1', '1ELi1'), ('kW2, KB=2', '2ELi2'), ('kW2, KB=1', '2ELi1')]
ALU = {'LOP3', 'SHF', 'IADD3', 'ISETP', 'PRMT', 'SEL', 'F2FP', 'FMNMX', 'LEA', 'VOTE', 'FSETP', 'PLOP3', 'P2R',
       'R2P', 'IABS', 'FLO', 'POPC', 'BREV', 'IMNMX', 'I2F', 'F2I'}
FMA = {'IMAD', 'FFMA', 'FMUL', 'FADD', 'HFMA2', 'HMUL2', 'HADD2', 'FSEL', 'IMUL'}


def disassemble(src, nvdisasm, work, unit='k_gemm'):
    """SASS text of src/backend/cuda/UNIT.cu of the checkout src, compiled for sm_90a."""
    cubin = os.path.join(work, unit + '.cubin')
    subprocess.run(['/usr/local/cuda/bin/nvcc', '-O3', '-DNDEBUG', '-arch=sm_90a', '-cubin', '-lineinfo',
                    '--expt-relaxed-constexpr', '-std=c++20', '-I' + os.path.join(src, 'src'), '-DDSV4_WITH_CUDA=1',
                    os.path.join(src, 'src/backend/cuda', unit + '.cu'), '-o', cubin], check=True)
    ver = subprocess.run([nvdisasm, '--version'], capture_output=True, text=True).stdout
    if 'release 11.' in ver:  # the pre-CUDA-12 ELF header: ABI version 7, flags with the SM in the low byte
        b = bytearray(open(cubin, 'rb').read())
        b[8] = 7
        struct.pack_into('<I', b, 0x30, 0x5a055a)
        open(cubin, 'wb').write(b)
    return subprocess.run([nvdisasm, '-hex', '-g', '-c', cubin], capture_output=True, text=True, check=True).stdout


def parse(sass, name):
    """Instructions (address, text, (file, line), encoding) of function `name`, labels, branch targets by index."""
    ins, labels, line, inside, need_hi = [], {}, None, False, False
    for l in sass.split('\n'):
        if re.match(r'^_Z\S*:$', l):
            if inside:
                break
            inside = name in l
            continue
        if not inside:
            continue
        m = re.match(r'\s*//## File "([^"]*)", line (\d+)', l)
        if m:
            line = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = re.match(r'^(\.L_x_\d+):', l)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = re.match(r'\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;(?:\s*/\* (0x[0-9a-f]{16}) \*/)?', l)
        if m:
            ins.append((int(m.group(1), 16), m.group(2), line, int(m.group(3), 16) if m.group(3) else None))
            need_hi = True
            continue
        m = re.match(r'^\s+/\* (0x[0-9a-f]{16}) \*/\s*$', l)
        if m:
            if need_hi:
                need_hi = False
            else:  # an instruction this nvdisasm cannot decode
                e = int(m.group(1), 16)
                ins.append((ins[-1][0] + 16, 'UNK_%03x' % (e & 0xfff), line, e))
                need_hi = True
    addr = {x[0]: k for k, x in enumerate(ins)}
    tgt = {}
    for k, x in enumerate(ins):
        m = re.search(r'BRA.*`\((\.L_x_\d+)\)', x[1])
        if not m:
            continue
        if m.group(1) in labels:
            tgt[k] = labels[m.group(1)]
        elif x[3] is not None:  # a label nvdisasm did not print: the target from the encoding
            e = x[3]
            hi = (e >> 32) & 0xffffffff
            hi = hi - (1 << 32) if hi >> 31 else hi
            tgt[k] = addr[x[0] + 16 + (hi << 8) + (((e >> 16) & 0xff) << 2)]
    return ins, tgt


def op(t):
    return re.sub(r'^@!?U?P\w+\s+', '', t).split()[0].split('.')[0]


def item_path(ins, tgt, srcl, slow):
    """The longest walk through the item loop that avoids the tile end (and the new tile's sources, and the masked or
    the plain decoding): the conditional branches of moe_tc_small_run are tried both ways."""
    loops = [(tgt[k], k) for k in tgt if tgt[k] <= k and any('MMA' in ins[q][1] for q in range(tgt[k], k + 1))]
    j, i = min(loops, key=lambda l: l[1] - l[0])
    lo = next(n for n, l in enumerate(srcl) if 'void moe_tc_small_run(' in l) - 40
    hi = next(n for n, l in enumerate(srcl) if 'moe_tc_small_kernel(const GArgs A)' in l)

    def src_line(k):
        ln = ins[k][2]
        return srcl[ln[1] - 1] if ln and ln[0] == 'k_gemm.cu' else ''

    rule = [k for k in range(j, i + 1) if k in tgt and ins[k][1].startswith('@') and ins[k][2] and
            ins[k][2][0] == 'k_gemm.cu' and lo <= ins[k][2][1] <= hi]
    has_plain = any('mt_plain_scales' in l for l in srcl)
    avoid = ['red[warp]', 'tile_sources();'] + (['__vcmpeq4'] if has_plain and not slow else [])
    best = None
    for bits in itertools.product([False, True], repeat=len(rule)):
        choice, k, path = dict(zip(rule, bits)), j, []
        while len(path) < 20000:
            path.append(k)
            if k == i:
                break
            k = tgt[k] if k in tgt and (not ins[k][1].startswith('@') or choice.get(k, False)) else k + 1
        txt = [src_line(k) for k in path]
        if any(a in l for l in txt for a in avoid) or not any('LDGSTS' in ins[k][1] for k in path):
            continue
        if slow and has_plain and not any('__vcmpeq4' in l for l in txt):
            continue
        if best is None or len(path) > len(best):
            best = path
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--src', default=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
    ap.add_argument('--nvdisasm', default=shutil.which('nvdisasm') or '/usr/local/cuda/bin/nvdisasm')
    ap.add_argument('--slow', action='store_true', help='the item path with the special-code masks')
    ap.add_argument('--lines', action='store_true', help='also per source line')
    a = ap.parse_args()
    if not os.path.exists(a.nvdisasm):
        sys.exit('no nvdisasm at %s (--nvdisasm PATH; Debian: apt-get install nvidia-cuda-toolkit)' % a.nvdisasm)
    srcl = open(os.path.join(a.src, 'src/backend/cuda/k_gemm.cu')).read().split('\n')
    with tempfile.TemporaryDirectory() as work:
        sass = disassemble(a.src, a.nvdisasm, work)
    for label, suffix in KINDS:
        ins, tgt = parse(sass, 'moe_tc_small_kernelILi%sE' % suffix)
        path = item_path(ins, tgt, srcl, a.slow)
        c = collections.Counter(op(ins[k][1]) for k in path)
        alu = sum(n for o, n in c.items() if o in ALU or o.startswith('UNK_'))
        fma = sum(n for o, n in c.items() if o in FMA)
        # the item loop's code (from its head to its last back branch: the tile end and the new tile's sources too)
        head = path[0]
        size = max(k for k in tgt if tgt[k] == head and k >= head) - head + 1
        print('%-11s %4d instructions per item: ALU pipe %d, FMA pipe %d, HMMA %d, LDS %d, LDSM %d, LDGSTS %d; '
              'item loop %d instructions (%.1f KB of code)' %
              (label, len(path), alu, fma, c['HMMA'], c['LDS'], c['LDSM'], c['LDGSTS'], size, size * 16 / 1024))
        print('            ' + ' '.join('%s:%d' % kv for kv in c.most_common()))
        if a.lines:
            by = collections.defaultdict(collections.Counter)
            for k in path:
                by[ins[k][2]][op(ins[k][1])] += 1
            for ln in sorted(by, key=lambda x: x or ('', 0)):
                print('              %s:%s %d %s' % (ln[0], ln[1], sum(by[ln].values()), dict(by[ln])) if ln else '')


if __name__ == '__main__':
    main()

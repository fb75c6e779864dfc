#!/usr/bin/env python3
"""Host check of moe_tc_big_kernel's data movement (src/backend/cuda/k_moe_tc.cu), no GPU needed.

Usage: /usr/bin/python3 tools/device/moe_big_layout_check.py   (needs numpy: Debian python3-numpy)

Re-implements, in Python, the index arithmetic of the kernel and of moe_a16_kernel: the loader's cp.async source and
destination of every thread, the shared-memory swizzles, each lane's ldmatrix and weight-word addresses, the FP4 ->
f16 conversion with the folded E8M0 factor (fp4x8_as_f16x2, f16_factor, e8m0_word_fast), the fast / slow block
paths, the accumulator rescale and the epilogue's output columns; ldmatrix .x4 and mma.sync m16n8k16 are modelled
from the PTX ISA's fragment layouts, not from the kernel. Checks:
  * the conversion of every byte value at every position, the factor of every fast-range code, the range test;
  * one block of each kind (kW13 / kW2; K 256 and 128; full, partial and one-row tiles; fast codes, and codes
    outside the f16 range for the slow path) against a direct fp64 product: equal to ~1e-13 (fp64 noise), so every
    product lands in the right output once;
  * that every stage byte is written once, and that each warp's cp.async writes, ldmatrix reads and weight-word
    reads are free of shared-memory bank conflicts (16-byte accesses in 8-lane phases, 4-byte ones per warp).
The formulas here are copies of the kernel's: a change to its layouts must be made here too (then re-run).
"""
import numpy as np
import struct

rng = np.random.default_rng(1)

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1(n):
    v = E2M1[n & 7]
    return -v if n & 8 else v


def f16_from_bits(b):
    return float(np.frombuffer(struct.pack('<H', b & 0xFFFF), dtype=np.float16)[0])


def f16_bits(x):
    return int(np.frombuffer(np.float16(x).tobytes(), dtype=np.uint16)[0])


def byte_perm(x, y, s):
    src = [(x >> (8 * i)) & 0xFF for i in range(4)] + [(y >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for n in range(4):
        out |= src[(s >> (4 * n)) & 7] << (8 * n)
    return out


def hmul2(a, b):
    lo = np.float16(f16_from_bits(a)) * np.float16(f16_from_bits(b))
    hi = np.float16(f16_from_bits(a >> 16)) * np.float16(f16_from_bits(b >> 16))
    return f16_bits(lo) | (f16_bits(hi) << 16)


def fp4x8_as_f16x2(w, f):
    M = 0xFFFFFFFF
    e2 = (w << 1) & 0x1E1E1E1E
    he = (e2 + 7 * (e2 & 0x10101010)) & M
    ho = ((w >> 3) & 0x0E0E0E0E) | (w & 0x80808080)
    return [hmul2(byte_perm(he, 0, 0x1404), f), hmul2(byte_perm(ho, 0, 0x1404), f),
            hmul2(byte_perm(he, 0, 0x3424), f), hmul2(byte_perm(ho, 0, 0x3424), f)]


def e8m0_word_fast(w):
    b = (((w & 0x7F7F7F7F) + 0x18181818) ^ (w & 0x80808080)) & 0xFFFFFFFF
    bad = ((~b) & 0x80808080) | (((b & 0x7F7F7F7F) + 0x67676767) & 0x80808080)
    return bad == 0


def e8m0_word_f16_hi(w):
    return (w * 4 + 0x76767678) & 0xFFFFFFFF


def f16_factor(hi4, G):
    return byte_perm(hi4, 0, 0x0404 + 0x1010 * G)


def a_swizzle(r):
    return (r & 7) ^ ((r & 1) << 2)


# ---- unit checks of the helpers
for w in range(256):  # every byte value, every position: the conversion with factor 2^14 = the E2M1 values
    for pos in range(4):
        word = (w << (8 * pos)) | (rng.integers(0, 2**32) & ~(0xFF << (8 * pos)) & 0xFFFFFFFF)
        r = fp4x8_as_f16x2(word, 0x74007400)
        nib = [(word >> (4 * v)) & 0xF for v in range(8)]
        want = [(nib[0], nib[2]), (nib[1], nib[3]), (nib[4], nib[6]), (nib[5], nib[7])]
        for k in range(4):
            got = (f16_from_bits(r[k]), f16_from_bits(r[k] >> 16))
            assert got == (e2m1(want[k][0]), e2m1(want[k][1])), (hex(word), k, got, want[k])
for e in range(256):  # the fast range and the factors
    w = e * 0x01010101
    assert e8m0_word_fast(w) == (104 <= e <= 128), e
    if 104 <= e <= 128:
        for G in range(4):
            f = f16_factor(e8m0_word_f16_hi(w), G)
            assert f16_from_bits(f) == 2.0 ** (e - 113) and f16_from_bits(f >> 16) == 2.0 ** (e - 113)
            for n in range(16):  # every nibble times the scale, exact
                word = n * 0x11111111
                r = fp4x8_as_f16x2(word, f)
                assert f16_from_bits(r[0]) == e2m1(n) * 2.0 ** (e - 127), (e, n)
for _ in range(20000):  # mixed words: one bad byte anywhere makes the word slow
    bytes_ = [int(rng.integers(104, 129)) for _ in range(4)]
    if rng.random() < 0.5:
        bytes_[int(rng.integers(0, 4))] = int(rng.choice([0, 1, 103, 129, 200, 255, 232, 231]))
    w = sum(b << (8 * i) for i, b in enumerate(bytes_))
    assert e8m0_word_fast(w) == all(104 <= b <= 128 for b in bytes_)
print('helpers: conversion of every byte value, fast range and factors of every code: ok')

# ---- one block
BT_M, BT_N, BT_KT = 64, 256, 128
ST_A, ST_B = 0, 64 * 256
ST_S = ST_B + 256 * 64
ST_R = ST_S + 256 * 4
ST_BYTES = ST_R + 64 * 4


def b_row(kind, w, j):
    return (j >> 1) * 128 + 16 * w + 8 * (j & 1) if kind == 0 else 32 * w + 8 * j


def banks_free(addrs_by_lane, width):
    """Shared-memory wavefronts of one warp access: the number of 128-byte wavefronts needed vs the minimum."""
    # group lanes into the hardware's phases: 4-byte: 1 phase of 32 lanes; 8-byte: 2 of 16; 16-byte: 4 of 8
    per = {4: 32, 8: 16, 16: 8}[width]
    for p0 in range(0, 32, per):
        used = {}
        for l in range(p0, p0 + per):
            a = addrs_by_lane[l]
            if a is None:
                continue
            for b in range(a // 4, (a + width) // 4):
                used.setdefault(b % 32, set()).add(b)
        if any(len(v) > 1 for v in used.values()):
            return False
    return True


def run_block(kind, K, mcnt, scale_codes, check_banks):
    nkb = K // BT_KT
    rows_act = 80
    n_w = 256 if kind == 1 else 128
    # activation codes (e4m3 values) and scales
    codes = rng.choice(np.array([0, 0.001953125, 0.5, 1, 1.5, -2, 3.5, -448, 240, -0.0625, 13]), size=(rows_act, K))
    sa = 2.0 ** rng.integers(-8, 4, size=(rows_act, nkb)).astype(float)
    # moe_a16_kernel's layout: per 8 columns (thread i) words at (i >> 2) * 16 + (i & 3) + {0, 4, 8, 12}
    act16 = np.zeros((rows_act, K), dtype=np.float64)  # f16 values by storage position
    for r in range(rows_act):
        for i8 in range(K // 8):
            v = codes[r, 8 * i8:8 * i8 + 8]
            base = (i8 >> 2) * 16 + (i8 & 3)
            for p, (x0, x1) in enumerate([(0, 2), (1, 3), (4, 6), (5, 7)]):
                word = base + 4 * p
                act16[r, 2 * word], act16[r, 2 * word + 1] = v[x0], v[x1]
    ratio = np.ones((rows_act, nkb))
    ratio[:, 1:] = sa[:, :-1] / sa[:, 1:]
    # weights: W0, W1 rows [n_w + 128 (kW2: 256)], FP4 bytes and scale codes
    nrows = 384
    W = [rng.integers(0, 256, size=(nrows, K // 2), dtype=np.int64) for _ in range(2)]
    S = [scale_codes(nrows, K // 32) for _ in range(2)]
    n0 = 128 if kind == 0 else 0
    m0 = 5
    row_tok = rng.permutation(rows_act)
    src_row = [row_tok[m0 + min(r, mcnt - 1)] for r in range(64)]
    if kind == 1:
        src_row = [m0 + min(r, mcnt - 1) for r in range(64)]

    def weight_row(R):  # staged row R -> (matrix, global row)
        if kind == 0:
            return (0, n0 + R) if R < 128 else (1, n0 + R - 128)
        return (0, n0 + R)

    acc = np.zeros((8, 32, 4, 4, 4))  # [warp][lane][i][j][c]
    for kb in range(nkb):
        smem = {}  # byte address -> value; A: f16 values at 2-byte granularity, B: bytes, S: words, R: floats
        # ---- the loader (every thread)
        cpa = {c: [None] * 256 for c in range(4)}
        cpb = {c: [None] * 256 for c in range(4)}
        for tid in range(256):
            r, q = tid >> 2, tid & 3
            ad, ax = ST_A + r * 256, 16 * (q ^ a_swizzle(r))
            for c in range(4):
                dst = ad + ((64 * c) ^ ax)
                src_col = kb * BT_KT + (64 * c + 16 * q) // 2  # f16 element index of the 16-byte chunk
                cpa[c][tid] = dst
                for e in range(8):
                    smem[dst + 2 * e] = ('a', act16[src_row[r], src_col + e])
            bd = ST_B + r * 64 + 16 * (q ^ ((r >> 1) & 3))
            for c in range(4):
                R = r + 64 * c
                mat, gr = weight_row(R)
                dst = bd + 4096 * c
                cpb[c][tid] = dst
                for e in range(16):
                    smem[dst + e] = ('b', int(W[mat][gr, kb * 64 + 16 * q + e]))
            mat, gr = weight_row(tid)
            word = sum(int(S[mat][gr, kb * 4 + G]) << (8 * G) for G in range(4))
            smem[ST_S + 4 * tid] = ('s', word)
            if tid < 64:
                smem[ST_R + 4 * ((tid & 7) * 8 + (tid >> 3))] = ('r', ratio[src_row[tid], kb])
        if check_banks:
            for c in range(4):
                for w0 in range(0, 256, 32):
                    assert banks_free(cpa[c][w0:w0 + 32], 16), ('A copy', c, w0)
                    assert banks_free(cpb[c][w0:w0 + 32], 16), ('B copy', c, w0)
        # every byte of the stage written once: A 16 KB, B 16 KB
        assert sum(1 for k, v in smem.items() if v[0] == 'a') == 64 * 128
        assert sum(1 for k, v in smem.items() if v[0] == 'b') == 256 * 64

        def lds32_b(addr):
            return sum(smem[addr + e][1] << (8 * e) for e in range(4))

        def ldsm_x4(addr_by_lane):  # PTX ldmatrix .x4 .b16: r[j] of lane l = row l / 4 of matrix j, elements
            # 2 (l % 4), 2 (l % 4) + 1; lanes 8 j .. 8 j + 7 give matrix j's row addresses
            out = []
            for l in range(32):
                regs = []
                for j in range(4):
                    row_addr = addr_by_lane[8 * j + (l >> 2)]
                    regs.append((smem[row_addr + 4 * (l & 3)][1], smem[row_addr + 4 * (l & 3) + 2][1]))
                out.append(regs)
            return out

        for warp in range(8):
            # rescale
            for l in range(32):
                g = l >> 2
                r8 = [smem[ST_R + 32 * g + 4 * q][1] for q in range(8)]
                for i in range(4):
                    for j in range(4):
                        for c in range(4):
                            if kb > 0:
                                acc[warp, l, i, j, c] *= r8[2 * i + (c >> 1)]
            words = {l: smem[ST_S + 4 * (b_row(kind, warp, l & 3) + (l >> 2))][1] for l in range(32)}
            fast = all(e8m0_word_fast(words[l]) for l in range(32))
            lanes = []
            for l in range(32):
                g, t = l >> 2, l & 3
                lanes.append(dict(g=g, t=t, a_row=ST_A + ((l & 7) + 8 * ((l >> 3) & 1)) * 256,
                                  ax16=16 * ((l >> 4) ^ a_swizzle(l & 7)), b_lane=ST_B + g * 64 + 4 * t,
                                  gx16=16 * ((l >> 3) & 3)))

            def a_addr(L, s):
                return L['a_row'] + ((32 * (s & 3)) ^ L['ax16']) + 128 * (s >> 2)

            def b_addr(L, G):
                return L['b_lane'] + ((16 * G) ^ L['gx16'])

            for G in range(4):
                # B fragments of every lane and tile
                bfr = {}
                for l, L in enumerate(lanes):
                    for j in range(4):
                        addr = b_addr(L, G) + 64 * b_row(kind, warp, j)
                        w = lds32_b(addr)
                        if fast:
                            f = f16_factor(e8m0_word_f16_hi(smem[ST_S + 4 * (b_row(kind, warp, j) + L['g'])][1]), G)
                        else:
                            f = 0x74007400
                        bfr[l, j] = fp4x8_as_f16x2(w, f)
                if check_banks:
                    for j in range(4):
                        addrs = [b_addr(L, G) + 64 * b_row(kind, warp, j) for L in lanes]
                        assert banks_free(addrs, 4), ('B read', G, j)
                dgrp = np.zeros((32, 4, 4, 4))
                for h in range(2):
                    s = 2 * G + h
                    for i in range(4):
                        addrs = [a_addr(L, s) + 4096 * i for L in lanes]
                        if check_banks:
                            assert banks_free(addrs, 16), ('ldmatrix', s, i)
                        afr = ldsm_x4(addrs)
                        # mma.sync m16n8k16 (PTX): A[16x16] from the lanes' a regs, B[16x8] from b regs
                        for j in range(4):
                            Am = np.zeros((16, 16))
                            Bm = np.zeros((16, 8))
                            for l in range(32):
                                g, t = l >> 2, l & 3
                                a = afr[l]
                                Am[g, 2 * t], Am[g, 2 * t + 1] = a[0]
                                Am[g + 8, 2 * t], Am[g + 8, 2 * t + 1] = a[1]
                                Am[g, 2 * t + 8], Am[g, 2 * t + 9] = a[2]
                                Am[g + 8, 2 * t + 8], Am[g + 8, 2 * t + 9] = a[3]
                                b0, b1 = bfr[l, j][2 * h], bfr[l, j][2 * h + 1]
                                Bm[2 * t, g], Bm[2 * t + 1, g] = f16_from_bits(b0), f16_from_bits(b0 >> 16)
                                Bm[2 * t + 8, g], Bm[2 * t + 9, g] = f16_from_bits(b1), f16_from_bits(b1 >> 16)
                            D = Am @ Bm
                            for l in range(32):
                                g, t = l >> 2, l & 3
                                d = [D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]]
                                for c in range(4):
                                    if fast:
                                        acc[warp, l, i, j, c] += d[c]
                                    else:
                                        dgrp[l, i, j, c] += d[c]
                if not fast:
                    for l in range(32):
                        t = l & 3
                        for j in range(4):
                            for c in range(4):
                                wsc = smem[ST_S + 4 * (b_row(kind, warp, j) + 2 * t + (c & 1))][1]
                                e = (wsc >> (8 * G)) & 0xFF
                                sc = 0.0 if e == 0 else (np.inf if e == 255 else 2.0 ** (e - 127))
                                for i in range(4):
                                    acc[warp, l, i, j, c] += dgrp[l, i, j, c] * sc
    # epilogue: times sa of the last block; outputs by (tile row, staged row)
    got = np.full((64, 256), np.nan)
    for warp in range(8):
        for l in range(32):
            g, t = l >> 2, l & 3
            for i in range(4):
                for h in range(2):
                    m = 16 * i + g + 8 * h
                    if m >= mcnt:
                        continue
                    for j in range(4):
                        for c in range(2):
                            n = b_row(kind, warp, j) + 2 * t + c
                            got[m, n] = acc[warp, l, i, j, 2 * h + c] * sa[src_row[m], nkb - 1]
    # reference
    ref = np.full((64, 256), np.nan)
    for m in range(mcnt):
        x = codes[src_row[m]] * np.repeat(sa[src_row[m]], BT_KT)
        for R in range(256):
            mat, gr = weight_row(R)
            wv = np.array([e2m1((int(W[mat][gr, k // 2]) >> (4 * (k & 1))) & 0xF) for k in range(K)])
            ev = np.repeat(S[mat][gr], 32)
            sv = np.where(ev == 0, 0.0, np.where(ev == 255, np.inf, 2.0 ** (ev.astype(float) - 127)))
            with np.errstate(invalid='ignore'):
                ref[m, R] = np.sum(x * wv * sv)
    return got, ref


def fast_codes(n, g):
    return rng.integers(104, 129, size=(n, g))


def mixed_codes(n, g):
    c = rng.integers(110, 125, size=(n, g))
    mask = rng.random((n, g)) < 0.05
    c[mask] = rng.choice([0, 1, 90, 103, 129, 140, 200], size=mask.sum())
    return c


for kind in (0, 1):
    for K, mcnt, codes_fn, banks in [(256, 64, fast_codes, True), (256, 37, mixed_codes, False),
                                     (128, 1, fast_codes, False)]:
        got, ref = run_block(kind, K, mcnt, codes_fn, banks)
        ok = np.isnan(got) == np.isnan(ref)
        fin = ~np.isnan(ref)
        rel = np.abs(got[fin] - ref[fin]) / np.maximum(np.abs(ref[fin]), 1e-30)
        print('kind %s K %d rows %d %s: %d outputs, max rel diff %.3g, nan pattern %s' %
              ('kW13' if kind == 0 else 'kW2', K, mcnt, codes_fn.__name__, fin.sum(), rel.max(), ok.all()))
        assert ok.all() and rel.max() < 1e-9
print('all ok')

#!/usr/bin/env python3
"""Host replay of the index arithmetic of moe_wgmma_kernel (src/backend/cuda/k_moe_wgmma.cu), without a GPU.

Usage: tools/device/moe_wgmma_layout_check.py [--seed N]

Rebuilds one CTA's shared memory for a k-block the way the kernel's code writes it, byte address by byte address:
the f16 activations as moe_a16_kernel orders them (columns permuted within each 32) copied by load()'s A part into
the 128-byte-swizzled A tile, the FP4 weights by load()'s B part into the FP4 ring, their conversion by convert()
(thread j of warpgroup h: B row j, chunk (4 (G % 2) + p) ^ (j % 8)) into the f16 B tiles. Then it reads the tiles
back the way wgmma does, from the descriptors the kernel builds (wgmma_desc_sw128: start address, SBO, 128-byte
swizzle as an XOR of address bits 4..6 with bits 7..9), multiplies the 8 k16 steps, hands out the accumulators
through the m64nNk16 fragment layout (d[4 j + v0 + 2 v1] = D[16 w + g + 8 v1][8 j + 2 t + v0]) and writes outputs
through the kernel's epilogue column arithmetic (kW13: w1 and w3 columns c and c + 64 of a warpgroup; kW2). Every
output must equal the plain dot product of the activation row and the weight row (natural column order, integers:
exact). The other-block path's m64n32 sub-tiles (B start + 4,096 q) are checked the same way. Also: the shared
stores of load() and convert() free of bank conflicts (per 8-lane phase of a 16-byte store: 8 distinct 16-byte bank
groups), descriptor fields in range, every tile 1,024-aligned.
Exit status 0 when every check passes.
"""
import argparse
import random
import sys

OFF_A, A_STAGE, A_S, A_R = 0, 18432, 16384, 17408
OFF_F, F_STAGE = 3 * 18432, 16384
OFF_B, B_WG = OFF_F + 2 * 16384, 32768
SMEM_USED = OFF_B + 4 * B_WG


def desc_sw128(addr):
    return ((addr & 0x3FFFF) >> 4) | (1 << 16) | ((1024 >> 4) << 32) | (1 << 62)


def desc_fields(d):
    return (d & 0x3FFF) << 4, ((d >> 16) & 0x3FFF) << 4, ((d >> 32) & 0x3FFF) << 4, (d >> 49) & 7, d >> 62


def wgmma_read(mem, desc, rows):
    """[rows, 16] f16-slot values of a K-major, 128-byte-swizzled operand as wgmma reads it (one k16 step)."""
    start, _, sbo, base_off, swz = desc_fields(desc)
    assert swz == 1 and base_off == 0 and sbo == 1024
    out = [[0] * 16 for _ in range(rows)]
    for m in range(rows):
        for k in range(16):
            a = start + (m // 8) * sbo + (m % 8) * 128 + (k // 8) * 16 + (k % 8) * 2
            a ^= ((a >> 7) & 7) << 4
            out[m][k] = mem[a // 2]
    return out


def kpos(col):
    """moe_a16_kernel's position of column col (0..127) of a block: word 4 p + t of its group holds pair p of columns
    8 t .. 8 t + 7, pairs (0, 2), (1, 3), (4, 6), (5, 7)."""
    G, c = divmod(col, 32)
    t, v = divmod(c, 8)
    p, hf = {0: (0, 0), 2: (0, 1), 1: (1, 0), 3: (1, 1), 4: (2, 0), 6: (2, 1), 5: (3, 0), 7: (3, 1)}[v]
    return 32 * G + 2 * (4 * p + t) + hf


def conflicts(addrs):
    """16-byte stores of one warp instruction (lane order): per 8-lane phase, the 16-byte bank groups must differ."""
    bad = 0
    for ph in range(0, 32, 8):
        groups = [(a % 128) // 16 for a in addrs[ph:ph + 8]]
        bad += len(groups) - len(set(groups))
    return bad


def staged_row(kind, h, j):
    if kind == 'w13':
        return 64 * h + j if j < 64 else 128 + 64 * h + (j - 64)
    return 128 * h + j


def check(kind, seed, base):
    rng = random.Random(seed)
    errors = []
    # values: activations and weights as small integers (exact products and sums), the weight of staged row sr,
    # column c = wv[sr, c] (its FP4 nibble's value; the fold of the scale is a per-(row, group) factor, here 1 + G so
    # that a wrong group shows)
    act = [[rng.randint(-8, 8) for _ in range(128)] for _ in range(64)]
    wv = [[rng.randint(-6, 6) for _ in range(128)] for _ in range(256)]
    fac = lambda G: 1 + G
    mem = [0] * ((base + SMEM_USED + 2048) // 2)  # f16 slots

    # load(): A (16 lanes per row's 256 bytes; round c: row 16 c + tid / 16, chunk tid % 16)
    SA = base + OFF_A
    gl = [[0] * 128 for _ in range(64)]  # the global f16 rows in moe_a16 order
    for r in range(64):
        for col in range(128):
            gl[r][kpos(col)] = act[r][col]
    for c in range(4):
        for w in range(8):
            addrs = []
            for lane in range(32):
                tid = 32 * w + lane
                r, ch = 16 * c + (tid >> 4), tid & 15
                dst = SA + (ch >> 3) * 8192 + r * 128 + 16 * ((ch & 7) ^ (r & 7))
                addrs.append(dst)
                assert dst % 16 == 0 and SA <= dst < SA + 16384
                for e in range(8):
                    mem[dst // 2 + e] = gl[r][ch * 8 + e]
            if conflicts(addrs):
                errors.append(f'{kind}: A copy round {c} warp {w}: bank conflicts')

    # load() FP4 part + convert(): the FP4 ring holds nibbles; the conversion places value wv * factor of column
    # 8 t + colmap(p, hf) of group G at chunk 4 (G % 2) + p, element 2 t + hf (fp4x8_as_f16x2's pairs)
    colmap = {(0, 0): 0, (0, 1): 2, (1, 0): 1, (1, 1): 3, (2, 0): 4, (2, 1): 6, (3, 0): 5, (3, 1): 7}
    ring = {}
    for tid in range(256):
        r, q = tid >> 2, tid & 3
        for c in range(4):
            sr = r + 64 * c
            ring[(sr, 16 * (q ^ ((sr >> 1) & 3)))] = q  # group q of staged row sr at this chunk
    for kb_buf in (0, 1):
        for x in range(256):
            h, j = x >> 7, x & 127
            sr = staged_row(kind, h, j)
            for G in range(4):
                assert ring[(sr, 16 * (G ^ ((sr >> 1) & 3)))] == G, 'FP4 ring: group read is not the group copied'
        for G in range(4):
            for p in range(4):
                for w in range(8):
                    addrs = []
                    for lane in range(32):
                        x = 32 * w + lane
                        h, j = x >> 7, x & 127
                        sr = staged_row(kind, h, j)
                        dst = base + OFF_B + (kb_buf * 2 + h) * B_WG + j * 128 + (G >> 1) * 16384 + \
                            16 * ((4 * (G & 1) + p) ^ (j & 7))
                        addrs.append(dst)
                        for t in range(4):
                            for hf in range(2):
                                mem[dst // 2 + 2 * t + hf] = wv[sr][32 * G + 8 * t + colmap[(p, hf)]] * fac(G)
                    if conflicts(addrs):
                        errors.append(f'{kind}: convert store G {G} p {p} warp {w}: bank conflicts')

    # wgmma: per warpgroup h, 8 k16 steps over A (64 rows) and B (128 rows), then the fragment layout and epilogue
    want_w = lambda sr: [wv[sr][col] * fac(col // 32) for col in range(128)]
    dot = lambda x, y: sum(u * v for u, v in zip(x, y))
    for kb_buf in (0, 1):
        for h in range(2):
            D = [[0] * 128 for _ in range(64)]
            Dq = [[0] * 128 for _ in range(64)]
            for s in range(8):
                da = desc_sw128(base + OFF_A + (s >> 2) * 8192 + 32 * (s & 3))
                db = desc_sw128(base + OFF_B + (kb_buf * 2 + h) * B_WG + (s >> 2) * 16384 + 32 * (s & 3))
                for d in (da, db):
                    if desc_fields(d)[0] % 16 or (desc_fields(d)[0] - 32 * (s & 3)) % 1024:
                        errors.append(f'{kind}: step {s}: tile not 1,024-aligned')
                a = wgmma_read(mem, da, 64)
                b = wgmma_read(mem, db, 128)
                for m in range(64):
                    for n in range(128):
                        D[m][n] += dot(a[m], b[n])
                for q in range(4):  # the other-block path's m64n32 sub-tiles
                    bq = wgmma_read(mem, db + q * (4096 >> 4), 32)
                    for m in range(64):
                        for n in range(32):
                            Dq[m][32 * q + n] += dot(a[m], bq[n])
            if D != Dq:
                errors.append(f'{kind}: m64n32 sub-tiles differ from the m64n128 tile')
            # fragment: thread (warp w, lane g t) holds d[4 j + v0 + 2 v1] = D[16 w + g + 8 v1][8 j + 2 t + v0]
            out = {}
            for w in range(4):
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    acc = [None] * 64
                    for j in range(16):
                        for v0 in range(2):
                            for v1 in range(2):
                                acc[4 * j + v0 + 2 * v1] = D[16 * w + g + 8 * v1][8 * j + 2 * t + v0]
                    for v1 in range(2):
                        m = 16 * w + g + 8 * v1
                        if kind == 'w13':
                            for j in range(8):
                                for v0 in range(2):
                                    col = 64 * h + 8 * j + 2 * t + v0
                                    key = (m, col)
                                    if key in out:
                                        errors.append(f'{kind}: output {key} written twice')
                                    out[key] = (acc[4 * j + v0 + 2 * v1], acc[4 * (j + 8) + v0 + 2 * v1])
                        else:
                            for j in range(16):
                                for v0 in range(2):
                                    col = 128 * h + 8 * j + 2 * t + v0
                                    out[(m, col)] = acc[4 * j + v0 + 2 * v1]
            for (m, col), v in out.items():
                if kind == 'w13':  # g from w1 row col (staged col), u from w3 row col (staged 128 + col)
                    want = (dot(act[m], want_w(col)), dot(act[m], want_w(128 + col)))
                else:
                    want = dot(act[m], want_w(col))
                if v != want:
                    errors.append(f'{kind}: buffer {kb_buf} warpgroup {h} output row {m} col {col}: {v} != {want}')
                    break
            ncols = 64 if kind == 'w13' else 128
            if len(out) != 64 * ncols:
                errors.append(f'{kind}: warpgroup {h} wrote {len(out)} outputs, want {64 * ncols}')
    # the other-block path's scales: column 32 q + 8 j + 2 t + v0 of the m64n32 tile q is B row staged_row(h, ...)
    # (the same column arithmetic as above, so nothing more to replay); the scale words S live at A_S of the stage
    if base + SMEM_USED > 1 << 18:  # the descriptor's start address field: bits 4..17 of the address
        errors.append(f'base {base:#x}: tiles past the 18-bit address range of a descriptor')
    if SMEM_USED + 1024 + 296 > 232448:
        errors.append('shared memory over the 227 KiB a block may have')
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--seed', type=int, default=1)
    args = ap.parse_args()
    errors = []
    for kind in ('w13', 'w2'):
        for base in (0x400, 0x800):  # 1,024-aligned bases (after the 1 KiB the system reserves, the static 296 bytes)
            errors += check(kind, args.seed, base)
    for e in errors[:20]:
        print('FAIL', e)
    print(f'moe_wgmma layout: {"PASS" if not errors else "FAIL"} ({len(errors)} errors)')
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main())

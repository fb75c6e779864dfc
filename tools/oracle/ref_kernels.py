"""Pure-PyTorch stand-ins for the TileLang kernels of the official DeepSeek V4 `inference/kernel.py`
and for `fast_hadamard_transform.hadamard_transform`, written from the spec (§4.3-4.6, §4.8, §5.3).

Same call signatures as the official module, so the official `inference/model.py` can import them as `kernel`
(reference_oracle.py installs this module as sys.modules["kernel"]). Runs on CPU or CUDA (GPU machine only).

Deviations from the TileLang kernels (documented in tests/data/golden/README.md):
  * dimensions that are not multiples of the block size (only in the tiny test models) are handled with a partial
    last block (amax / scales over the elements that exist); the official kernels assert N % block == 0;
  * GEMM accumulation order inside a K block differs (fp32 matmul instead of tensor-core MMA).
"""
import types

import torch
import torch.nn.functional as F

FP8_MAX = 448.0
FP4_MAX = 6.0
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between consecutive e2m1 magnitudes; a tie rounds to the even code (codes 0,2,4,6 are "even").
_E2M1_MID = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _pow2_ceil_scale(amax, max_inv):
    """2^ceil(log2(amax * max_inv)) with the kernel's bit trick (fast_log2_ceil + fast_pow2), fp32."""
    t = amax.float() * torch.tensor(max_inv, dtype=torch.float32, device=amax.device)
    bits = t.view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return ((e + 127) << 23).view(torch.float32)


def _blocks(n, block):
    return [(i, min(i + block, n)) for i in range(0, n, block)]


def e8m0_to_float(s):
    """E8M0 (or already-float) scale tensor -> float32 values 2^(e-127)."""
    if s.dtype == torch.float8_e8m0fnu or s.dtype == torch.uint8:
        e = s.view(torch.uint8).to(torch.float64) - 127.0
        return torch.pow(2.0, e).to(torch.float32)
    return s.float()


def act_quant(x, block_size=128, scale_fmt=None, scale_dtype=torch.float32, inplace=False):
    """Block-wise FP8 e4m3 quantization along the last dim (spec §4.3).
    Returns (y float8_e4m3fn, s float32 [..., ceil(N/block)]) or, inplace, x <- dequant(quant(x)) in x's dtype."""
    n = x.size(-1)
    xf = x.float()
    ys, ss = [], []
    for a, b in _blocks(n, block_size):
        blk = xf[..., a:b]
        amax = blk.abs().amax(-1, keepdim=True).clamp(min=1e-4)
        if scale_fmt is not None:
            s = _pow2_ceil_scale(amax, 1.0 / FP8_MAX)
        else:
            s = amax * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32, device=x.device)
        q = (blk / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        ys.append(q)
        ss.append(s)
    if inplace:
        deq = torch.cat([q.float() * s for q, s in zip(ys, ss)], dim=-1)
        x.copy_(deq.to(x.dtype))
        return x
    return torch.cat(ys, dim=-1), torch.cat(ss, dim=-1)


def _e2m1_round(v):
    """Round |v| <= 6 to the nearest e2m1 value, ties to even code. Returns float32 values (sign kept)."""
    mag = v.abs()
    mids = torch.tensor(_E2M1_MID, dtype=torch.float32, device=v.device)
    odd = torch.tensor([i % 2 == 1 for i in range(7)], device=v.device)
    code = (mag.unsqueeze(-1) > mids).sum(-1) + ((mag.unsqueeze(-1) == mids) & odd).sum(-1)
    grid = torch.tensor(_E2M1, dtype=torch.float32, device=v.device)
    return torch.copysign(grid[code], v)


def fp4_act_quant(x, block_size=32, inplace=False):
    """Block-wise FP4 e2m1 quantization (spec §4.4). Only the in-place (fake-quant) form is used by model.py."""
    n = x.size(-1)
    xf = x.float()
    outs = []
    for a, b in _blocks(n, block_size):
        blk = xf[..., a:b]
        amax = blk.abs().amax(-1, keepdim=True).clamp(min=6 * 2.0 ** -126)
        s = _pow2_ceil_scale(amax, 1.0 / FP4_MAX)
        outs.append(_e2m1_round((blk / s).clamp(-FP4_MAX, FP4_MAX)) * s)
    deq = torch.cat(outs, dim=-1)
    if inplace:
        x.copy_(deq.to(x.dtype))
        return x
    raise NotImplementedError("fp4_act_quant(inplace=False) is not used by the reference model")


def fp8_gemm(a, a_s, b, b_s, scale_dtype=torch.float32):
    """C[M,N] = sum_kb (A_kb . B_kb^T) * sa[m,kb] * sb[n/128,kb]; fp32 accumulators, output in the default dtype."""
    k = a.size(-1)
    lead = a.shape[:-1]
    a2 = a.reshape(-1, k)
    sa = e8m0_to_float(a_s).reshape(a2.size(0), -1)
    sb = e8m0_to_float(b_s)
    n = b.size(0)
    sb_rows = sb.repeat_interleave(128, dim=0)[:n]  # [N, ceil(K/128)]
    acc = torch.zeros(a2.size(0), n, dtype=torch.float32, device=a.device)
    for kb, (lo, hi) in enumerate(_blocks(k, 128)):
        part = a2[:, lo:hi].float() @ b[:, lo:hi].float().t()
        acc += part * (sa[:, kb:kb + 1] * sb_rows[:, kb].unsqueeze(0))
    return acc.to(torch.get_default_dtype()).reshape(*lead, n)


def _fp4_weight_to_float(b):
    """float4_e2m1fn_x2 [N, K/2] (low nibble = even k) -> float32 [N, K]."""
    u = b.view(torch.uint8)
    lut = torch.tensor([(-1.0 if i & 8 else 1.0) * _E2M1[i & 7] for i in range(16)], dtype=torch.float32,
                       device=b.device)
    lo = lut[(u & 0x0F).long()]
    hi = lut[(u >> 4).long()]
    return torch.stack([lo, hi], dim=-1).reshape(u.size(0), u.size(1) * 2)


def fp4_gemm(a, a_s, b, b_s, scale_dtype=torch.float32):
    """FP8 activations x FP4 weights: acc += (A_k32 . W_k32^T) * sa[m, k/128] * sw[n, k/32]; output default dtype."""
    k = a.size(-1)
    lead = a.shape[:-1]
    a2 = a.reshape(-1, k)
    sa = e8m0_to_float(a_s).reshape(a2.size(0), -1)
    sw = e8m0_to_float(b_s)
    w = _fp4_weight_to_float(b)
    acc = torch.zeros(a2.size(0), w.size(0), dtype=torch.float32, device=a.device)
    for kb, (lo, hi) in enumerate(_blocks(k, 32)):
        part = a2[:, lo:hi].float() @ w[:, lo:hi].t()
        acc += part * sa[:, lo // 128: lo // 128 + 1] * sw[:, kb].unsqueeze(0)
    return acc.to(torch.get_default_dtype()).reshape(*lead, w.size(0))


def sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale, block=64):
    """Sparse attention with a per-head sink (spec §4.8): online softmax over blocks of `block` indices in list
    order; the sink only enters the denominator; P is rounded to bf16 before the PV product; output q.dtype."""
    bsz, s, h, d = q.shape
    idx = topk_idxs.long()
    valid = idx >= 0
    safe = idx.clamp(min=0)
    bi = torch.arange(bsz, device=q.device).view(bsz, 1, 1)
    kvg = kv[bi, safe].float()  # [b, s, K, d]
    f32 = dict(dtype=torch.float32, device=q.device)  # explicit: the reference sets the default dtype to bf16
    kvg = torch.where(valid.unsqueeze(-1), kvg, torch.zeros((), **f32))
    scores = torch.einsum("bshd,bskd->bshk", q.float(), kvg) * softmax_scale
    scores = scores.masked_fill(~valid.unsqueeze(2), float("-inf"))
    m = torch.full((bsz, s, h), float("-inf"), **f32)
    l = torch.zeros((bsz, s, h), **f32)
    acc = torch.zeros((bsz, s, h, d), **f32)
    for lo in range(0, idx.size(-1), block):
        sc = scores[..., lo:lo + block]
        m_new = torch.maximum(m, sc.amax(-1))
        alpha = torch.where(torch.isinf(m_new), torch.ones_like(m), torch.exp(m - m_new))
        p = torch.exp(sc - m_new.unsqueeze(-1))
        p = torch.where(torch.isinf(m_new).unsqueeze(-1), torch.zeros_like(p), p)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha.unsqueeze(-1) + torch.einsum("bshk,bskd->bshd", p.to(torch.bfloat16).float(),
                                                       kvg[:, :, lo:lo + block])
        m = m_new
    l = l + torch.exp(attn_sink.float().view(1, 1, h) - m)
    return (acc / l.unsqueeze(-1)).to(q.dtype)


def hc_split_sinkhorn(mixes, hc_scale, hc_base, hc_mult=4, sinkhorn_iters=20, eps=1e-6):
    """mHC pre/post/comb from the mixes (spec §5.3), fp32."""
    hc = hc_mult
    mixes = mixes.float()
    pre = torch.sigmoid(mixes[..., :hc] * hc_scale[0] + hc_base[:hc]) + eps
    post = 2 * torch.sigmoid(mixes[..., hc:2 * hc] * hc_scale[1] + hc_base[hc:2 * hc])
    comb = mixes[..., 2 * hc:].unflatten(-1, (hc, hc)) * hc_scale[2] + hc_base[2 * hc:].view(hc, hc)
    comb = torch.exp(comb - comb.amax(-1, keepdim=True))
    comb = comb / comb.sum(-1, keepdim=True) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(sinkhorn_iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb


def hadamard_transform(x, scale=1.0):
    """Sylvester (natural order) Walsh-Hadamard transform on the last dim (power of two), fp32 inside,
    result times `scale`, returned in x.dtype (spec §4.6)."""
    n = x.size(-1)
    y = x.float()
    lead = y.shape[:-1]
    hgap = 1
    while hgap < n:
        y = y.reshape(*lead, n // (2 * hgap), 2, hgap)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack([a + b, a - b], dim=-2)
        hgap *= 2
    return (y.reshape(*lead, n) * scale).to(x.dtype)


# Module object usable as sys.modules["fast_hadamard_transform"].
fast_hadamard_transform = types.ModuleType("fast_hadamard_transform")
fast_hadamard_transform.hadamard_transform = hadamard_transform

"""Shared helpers of the golden-fixture scripts (GPU machine): official-format checkpoint reading, exact
dequantization, the fixed prompts, and the golden JSON writer.

Format of tests/data/golden/<model>.<dense|reference>.json: see tests/data/golden/README.md.
"""
import json
import os
import random
import struct

import torch

PROMPT_LENGTHS = (9, 130, 258, 513, 2050)
PROMPT_SEED = 20261201
TOP_K = 20

_RAW = {"F32": torch.float32, "BF16": torch.bfloat16, "I64": torch.int64, "I8": torch.uint8,
        "F8_E4M3": torch.uint8, "F8_E8M0": torch.uint8}


def read_safetensors(path):
    """{name: (dtype string, raw torch tensor)}; FP8/E8M0/I8 come back as uint8 bytes (bit patterns untouched)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + a:base + b]), dtype=_RAW[meta["dtype"]])
        out[name] = (meta["dtype"], t.reshape(meta["shape"]))
    return out


def read_checkpoint(model_dir):
    """read_safetensors of a checkpoint folder: model.safetensors, or the shards named by
    model.safetensors.index.json (sharded layout, e.g. models/dsv4-demo)."""
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)
    index = json.load(open(os.path.join(model_dir, "model.safetensors.index.json")))
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        out.update(read_safetensors(os.path.join(model_dir, shard)))
    return out


def e8m0_to_f32(u8):
    return torch.pow(2.0, u8.to(torch.float64) - 127.0).to(torch.float32)


def _e4m3_lut():
    vals = []
    for c in range(256):
        s = -1.0 if c & 0x80 else 1.0
        e, m = (c >> 3) & 0xF, c & 7
        if e == 0xF and m == 7:
            vals.append(float("nan"))
        elif e == 0:
            vals.append(s * m * 2.0 ** -9)
        else:
            vals.append(s * (1 + m / 8.0) * 2.0 ** (e - 7))
    return torch.tensor(vals, dtype=torch.float32)


E4M3_LUT = _e4m3_lut()
E2M1_LUT = torch.tensor([(-1.0 if i & 8 else 1.0) * (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)[i & 7]
                         for i in range(16)], dtype=torch.float32)


def dequant_fp8(w_u8, s_u8):
    """W[o,i] = e4m3(Q[o,i]) * 2^(S[o/128, i/128] - 127), fp32 (exact)."""
    out, inp = w_u8.shape
    s = e8m0_to_f32(s_u8).repeat_interleave(128, 0)[:out].repeat_interleave(128, 1)[:, :inp]
    return E4M3_LUT[w_u8.long()] * s


def dequant_fp4(w_u8, s_u8):
    """Packed e2m1 [out, in/2] (low nibble = even input) x E8M0 per 32 -> fp32 [out, in] (exact)."""
    out, half = w_u8.shape
    w = torch.stack([E2M1_LUT[(w_u8 & 0x0F).long()], E2M1_LUT[(w_u8 >> 4).long()]], dim=-1).reshape(out, 2 * half)
    return w * e8m0_to_f32(s_u8).repeat_interleave(32, 1)


def dense_tensor(T, name):
    """fp32 value of official tensor `name` ("x.weight" of an FP8/FP4 pair is dequantized with "x.scale")."""
    dt, t = T[name]
    if name.endswith(".weight") and name[:-7] + ".scale" in T:
        s = T[name[:-7] + ".scale"][1]
        return dequant_fp4(t, s) if dt == "I8" else dequant_fp8(t, s)
    if dt in ("F32", "BF16"):
        return t.float()
    return t


def prompts(vocab_size):
    """The fixed prompts: one per length, uniform random ids from a fixed seed (no BOS)."""
    res = []
    for n in PROMPT_LENGTHS:
        rng = random.Random(PROMPT_SEED + n)
        res.append([rng.randrange(vocab_size) for _ in range(n)])
    return res


def top_entries(logits):
    """logits [L, V] (any float) -> (ids [L][20], natural-log logprobs [L][20]) from an fp64 log_softmax."""
    lp = torch.log_softmax(logits.double(), dim=-1)
    vals, ids = lp.topk(TOP_K, dim=-1)
    return ids.tolist(), [[round(v, 5) for v in row] for row in vals.tolist()]


def compare(lp_a, lp_b, ids_a):
    """|Δ logprob| of B against A at A's top-20 ids, plus top-1 agreement. lp_*: [L, V] fp64 log-softmax."""
    idx = torch.tensor(ids_a, dtype=torch.long)
    d = (lp_a.gather(1, idx) - lp_b.gather(1, idx)).abs().flatten()
    q = torch.quantile(d, torch.tensor([0.5, 0.99], dtype=d.dtype))
    top1 = (lp_a.argmax(-1) == lp_b.argmax(-1)).double().mean().item()
    return {"median": float(q[0]), "p99": float(q[1]), "max": float(d.max()), "top1_agree": top1}


def write_golden(path, model, numerics, source, versions, prompt_results, extra=None):
    doc = {"model": model, "numerics": numerics, "source": source, "versions": versions}
    if extra:
        doc.update(extra)
    doc["prompts"] = [{"ids": ids, "top_ids": ti, "top_logprobs": tl} for ids, ti, tl in prompt_results]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)", flush=True)


def versions():
    v = {"torch": torch.__version__}
    try:
        import transformers
        v["transformers"] = transformers.__version__
    except Exception:  # noqa: BLE001
        pass
    if torch.cuda.is_available():
        v["gpu"] = torch.cuda.get_device_name(0)
        v["cuda"] = torch.version.cuda
    return v


def set_deterministic():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Deterministic mode fills new tensors with NaN, which torch has no kernel for on float4_e2m1fn_x2
    # (the official model.py allocates its FP4 expert weights with torch.empty).
    torch.utils.deterministic.fill_uninitialized_memory = False

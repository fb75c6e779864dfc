#!/usr/bin/env python3
"""Write tiny DeepSeek V4 checkpoints in the OFFICIAL on-disk format (spec §3), deterministically.

Pure Python standard library (no numpy / torch) so it runs anywhere, including CI.

Each model folder gets
  config.json        official key names (model_type deepseek_v4, quantization_config as in V4-Flash, expert_dtype fp4)
  model.safetensors  one shard, official tensor names and dtypes:
      FP8 e4m3fn weights (F8_E4M3) + E8M0 128x128 block scales (F8_E8M0, ceil-sized grid) for the dense matrices,
      FP4 e2m1 routed experts packed two per byte in I8 (low nibble = even input index) + E8M0 scale per 32 inputs,
      BF16 embed / head / norms / router weight / compressor wkv+wgate / indexer weights_proj,
      F32 hc_* / attn_sink / ape / gate.bias, I64 tid2eid, and the MTP module mtp.0.* (spec §3.5) — or, for
      tiny-dspark, a DSpark drafter mtp.0-2.* (docs/dspark.md: three window-only stages, main_proj / main_norm,
      norm / hc_head, Markov head, confidence head) with the dspark_* config keys of the 0731 release.

Values are chosen directly as codes: random valid e4m3 codes (including +-0 and subnormals, never NaN), random e2m1
nibbles (all 16 codes), E8M0 exponents picked per block with jitter so per-block scaling matters. Magnitudes are set
so that activations stay O(1) and the final logits have a standard deviation of about 2.

Usage: make_tiny_models.py --out tests/data [--seed 1234] [--only tiny-a] [--check]
  --check  regenerate into memory and compare byte-for-byte with the files on disk (exit 1 on mismatch).
"""
import argparse
import hashlib
import json
import math
import os
import random
import struct
import sys

# ---------------------------------------------------------------------------------------------------------------------
# Model shapes.  compress_ratios has num_hidden_layers + num_nextn_predict_layers entries (last = MTP, always 0), or
# num_hidden_layers + DSpark stages entries (all 0) for a model with a "dspark" entry.

MODELS = {
    # Every FP8 GEMM dimension a multiple of 128 except the expert down-projection input (moe_inter 64).
    # Layer 0: CSA (ratio 4, overlapping compressor + indexer) with hash routing; layer 1: HCA (ratio 128), top-k
    # routing; MTP block: sliding-window only.
    "tiny-a": dict(
        vocab_size=256, hidden_size=128, num_attention_heads=2, head_dim=128, qk_rope_head_dim=64,
        q_lora_rank=128, o_groups=2, o_lora_rank=64, num_hidden_layers=2, compress_ratios=[4, 128, 0],
        num_hash_layers=1, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        moe_intermediate_size=64, index_n_heads=1, index_head_dim=128, index_topk=16, sliding_window=128,
        hc_mult=4,
    ),
    # Partial edge blocks: vocab 200, hidden 96 (< 128), q_lora 144 (128 + 16), o_lora 48, moe_inter 32; 16 experts top-3;
    # layers CSA(hash) / sliding-only / HCA; sliding window 64; index_topk 8.
    "tiny-b": dict(
        vocab_size=200, hidden_size=96, num_attention_heads=2, head_dim=128, qk_rope_head_dim=64,
        q_lora_rank=144, o_groups=1, o_lora_rank=48, num_hidden_layers=3, compress_ratios=[4, 0, 128, 0],
        num_hash_layers=1, n_routed_experts=16, num_experts_per_tok=3, n_shared_experts=1,
        moe_intermediate_size=32, index_n_heads=1, index_head_dim=128, index_topk=8, sliding_window=64,
        hc_mult=4,
    ),
    # A DSpark drafter (the 0731 layout, docs/dspark.md) on a 3-layer backbone: window-only hash layer 0, CSA layer 1,
    # HCA layer 2; three window-only stages (block 5, as 0731) reading the inputs of layers 0 and 1; a window of 32
    # so that tests cross the ring; hidden 64 (partial FP8 blocks) to stay under the size limit.
    "tiny-dspark": dict(
        vocab_size=256, hidden_size=64, num_attention_heads=2, head_dim=128, qk_rope_head_dim=64,
        q_lora_rank=64, o_groups=2, o_lora_rank=32, num_hidden_layers=3, compress_ratios=[0, 4, 128, 0, 0, 0],
        num_hash_layers=1, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        moe_intermediate_size=64, index_n_heads=1, index_head_dim=128, index_topk=8, sliding_window=32,
        hc_mult=4,
        dspark=dict(block_size=5, target_layer_ids=[0, 1], markov_rank=32, noise_token_id=255, n_stages=3),
    ),
}

SIZE_LIMIT = 1_500_000  # bytes per model.safetensors (task constraint)


def make_config(m):
    """config.json content with the official V4-Flash key names and non-shape values."""
    c = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "hc_eps": 1e-06,
        "hc_mult": m["hc_mult"],
        "hc_sinkhorn_iters": 20,
        "head_dim": m["head_dim"],
        "hidden_act": "silu",
        "hidden_size": m["hidden_size"],
        "index_head_dim": m["index_head_dim"],
        "index_n_heads": m["index_n_heads"],
        "index_topk": m["index_topk"],
        "initializer_range": 0.02,
        "max_position_embeddings": 1048576,
        "model_type": "deepseek_v4",
        "moe_intermediate_size": m["moe_intermediate_size"],
        "n_routed_experts": m["n_routed_experts"],
        "n_shared_experts": m["n_shared_experts"],
        "norm_topk_prob": True,
        "num_attention_heads": m["num_attention_heads"],
        "num_experts_per_tok": m["num_experts_per_tok"],
        "num_hidden_layers": m["num_hidden_layers"],
        "num_hash_layers": m["num_hash_layers"],
        "num_key_value_heads": 1,
        "num_nextn_predict_layers": 1,
        "o_groups": m["o_groups"],
        "o_lora_rank": m["o_lora_rank"],
        "q_lora_rank": m["q_lora_rank"],
        "qk_rope_head_dim": m["qk_rope_head_dim"],
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "scale_fmt": "ue8m0",
            "weight_block_size": [128, 128],
        },
        "rms_norm_eps": 1e-06,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 16,
            "original_max_position_embeddings": 65536,
            "type": "yarn",
        },
        "rope_theta": 10000,
        "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus",
        "sliding_window": m["sliding_window"],
        "swiglu_limit": 10.0,
        "tie_word_embeddings": False,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.57.1",
        "use_cache": True,
        "vocab_size": m["vocab_size"],
        "compress_rope_theta": 160000,
        "compress_ratios": list(m["compress_ratios"]),
        "expert_dtype": "fp4",
    }
    ds = m.get("dspark")
    if ds:  # the 0731 keys; num_nextn_predict_layers stays 1 there too (a legacy value, not the stage count)
        c["dspark_block_size"] = ds["block_size"]
        c["dspark_target_layer_ids"] = list(ds["target_layer_ids"])
        c["dspark_markov_rank"] = ds["markov_rank"]
        c["dspark_noise_token_id"] = ds["noise_token_id"]
    assert len(c["compress_ratios"]) == m["num_hidden_layers"] + (ds["n_stages"] if ds else 1)
    return c


# ---------------------------------------------------------------------------------------------------------------------
# Encoders (exact, pure Python)

def bf16_bits(x):
    """float -> bf16 bit pattern, round to nearest even (finite inputs only)."""
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    lsb = (b >> 16) & 1
    b = (b + 0x7FFF + lsb) >> 16
    return b & 0xFFFF


def e4m3_value(code):
    """OCP e4m3fn decode (bias 7, no inf, 0x7F/0xFF NaN)."""
    s = -1.0 if code & 0x80 else 1.0
    e = (code >> 3) & 0xF
    m = code & 7
    if e == 0xF and m == 7:
        return float("nan")
    if e == 0:
        return s * m * 2.0 ** -9
    return s * (1.0 + m / 8.0) * 2.0 ** (e - 7)


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_value(nib):
    return (-1.0 if nib & 8 else 1.0) * E2M1[nib & 7]


# ---------------------------------------------------------------------------------------------------------------------
# Tensor generators. Each returns (dtype, shape, bytes).

class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def gauss(self, std):
        return self.r.gauss(0.0, std)

    def f32(self, shape, fn):
        n = _numel(shape)
        return ("F32", shape, struct.pack("<%df" % n, *[fn(i) for i in range(n)]))

    def bf16(self, shape, fn):
        n = _numel(shape)
        return ("BF16", shape, struct.pack("<%dH" % n, *[bf16_bits(fn(i)) for i in range(n)]))

    def e4m3_code(self):
        """Random valid e4m3fn code: mostly normals around 1.0, some +-0, subnormals and large values; never NaN."""
        r = self.r.random()
        sign = 0x80 if self.r.random() < 0.5 else 0
        if r < 0.02:
            return sign  # +-0
        if r < 0.05:
            return sign | self.r.randint(1, 7)  # subnormal m * 2^-9
        if r < 0.053:
            return sign | (0xF << 3) | self.r.randint(0, 6)  # 256 .. 448 (largest finite)
        e = 7 + int(round(self.r.gauss(0.0, 1.1)))
        e = min(max(e, 1), 14)
        return sign | (e << 3) | self.r.randint(0, 7)

    def fp8_weight(self, out, inp, target_std):
        """FP8 e4m3fn [out, inp] + E8M0 scale [ceil(out/128), ceil(inp/128)] with per-block exponent jitter."""
        codes = bytes(self.e4m3_code() for _ in range(out * inp))
        vals = [e4m3_value(c) for c in codes[: min(len(codes), 4096)]]
        code_std = math.sqrt(sum(v * v for v in vals) / len(vals))
        base = int(round(math.log2(target_std / code_std))) + 127
        so, si = (out + 127) // 128, (inp + 127) // 128
        scale = bytes(min(max(base + self.r.choice((-1, 0, 0, 1)), 1), 254) for _ in range(so * si))
        return ("F8_E4M3", [out, inp], codes), ("F8_E8M0", [so, si], scale)

    def fp4_weight(self, out, inp, target_std):
        """FP4 e2m1 packed [out, inp/2] I8 (low nibble = element 2j) + E8M0 scale [out, inp/32]."""
        assert inp % 32 == 0
        packed = bytes(self.r.randint(0, 15) | (self.r.randint(0, 15) << 4) for _ in range(out * inp // 2))
        code_std = math.sqrt(sum(v * v for v in E2M1) / 8.0)
        base = int(round(math.log2(target_std / code_std))) + 127
        scale = bytes(min(max(base + self.r.choice((-1, 0, 0, 1)), 1), 254) for _ in range(out * inp // 32))
        return ("I8", [out, inp // 2], packed), ("F8_E8M0", [out, inp // 32], scale)

    def i64(self, shape, values):
        return ("I64", shape, struct.pack("<%dq" % len(values), *values))


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


# ---------------------------------------------------------------------------------------------------------------------

def build_tensors(m, seed):
    """Return {name: (dtype, shape, bytes)} for model shape dict m."""
    g = Gen(seed)
    T = {}
    V, D, H, hd = m["vocab_size"], m["hidden_size"], m["num_attention_heads"], m["head_dim"]
    qr, G, R = m["q_lora_rank"], m["o_groups"], m["o_lora_rank"]
    E, k, I = m["n_routed_experts"], m["num_experts_per_tok"], m["moe_intermediate_size"]
    IH, ihd, hc = m["index_n_heads"], m["index_head_dim"], m["hc_mult"]
    mix = (2 + hc) * hc
    nL = m["num_hidden_layers"]

    def put(name, t):
        assert name not in T, name
        T[name] = t

    def fp8(name, out, inp, std):
        w, s = g.fp8_weight(out, inp, std)
        put(name + ".weight", w)
        put(name + ".scale", s)

    def norm_w(name, n):
        put(name, g.bf16([n], lambda i: 1.0 + g.gauss(0.15)))

    def hc_site(prefix, site):
        # mixes = (fn @ x) * rsqrt(mean x^2): x has unit RMS after the rsqrt, so std(fn) ~ 1/sqrt(hc*D) gives O(1).
        put(f"{prefix}hc_{site}_fn", g.f32([mix, hc * D], lambda i: g.gauss(1.0 / math.sqrt(hc * D))))
        put(f"{prefix}hc_{site}_base", g.f32([mix], lambda i: g.gauss(0.8)))
        put(f"{prefix}hc_{site}_scale", g.f32([3], lambda i: 0.5 + g.r.random()))

    def block(prefix, layer_id, ratio, is_hash):
        hc_site(prefix, "attn")
        hc_site(prefix, "ffn")
        norm_w(prefix + "attn_norm.weight", D)
        norm_w(prefix + "ffn_norm.weight", D)
        a = prefix + "attn."
        put(a + "attn_sink", g.f32([H], lambda i: g.gauss(1.5)))
        fp8(a + "wq_a", qr, D, 1.0 / math.sqrt(D))
        norm_w(a + "q_norm.weight", qr)
        fp8(a + "wq_b", H * hd, qr, 1.0 / math.sqrt(qr))
        fp8(a + "wkv", hd, D, 1.0 / math.sqrt(D))
        norm_w(a + "kv_norm.weight", hd)
        fp8(a + "wo_a", G * R, H * hd // G, 1.0 / math.sqrt(H * hd // G))
        fp8(a + "wo_b", D, G * R, 1.0 / math.sqrt(G * R))
        if ratio:
            coff = 2 if ratio == 4 else 1
            c = a + "compressor."
            put(c + "ape", g.f32([ratio, coff * hd], lambda i: g.gauss(0.7)))
            put(c + "wkv.weight", g.bf16([coff * hd, D], lambda i: g.gauss(1.0 / math.sqrt(D))))
            put(c + "wgate.weight", g.bf16([coff * hd, D], lambda i: g.gauss(1.5 / math.sqrt(D))))
            norm_w(c + "norm.weight", hd)
            if ratio == 4:
                ix = a + "indexer."
                fp8(ix + "wq_b", IH * ihd, qr, 1.0 / math.sqrt(qr))
                put(ix + "weights_proj.weight", g.bf16([IH, D], lambda i: g.gauss(1.0 / math.sqrt(D))))
                ic = ix + "compressor."
                put(ic + "ape", g.f32([ratio, 2 * ihd], lambda i: g.gauss(0.7)))
                put(ic + "wkv.weight", g.bf16([2 * ihd, D], lambda i: g.gauss(1.0 / math.sqrt(D))))
                put(ic + "wgate.weight", g.bf16([2 * ihd, D], lambda i: g.gauss(1.5 / math.sqrt(D))))
                norm_w(ic + "norm.weight", ihd)
        f = prefix + "ffn."
        put(f + "gate.weight", g.bf16([E, D], lambda i: g.gauss(1.0 / math.sqrt(D))))
        if is_hash:
            ids = []
            for _ in range(V):
                ids.extend(g.r.sample(range(E), k))
            put(f + "gate.tid2eid", g.i64([V, k], ids))
        else:
            put(f + "gate.bias", g.f32([E], lambda i: g.gauss(0.3)))
        # Shared expert with a larger gate/up scale so the swiglu_limit clamp (10) is actually hit sometimes.
        fp8(f + "shared_experts.w1", I, D, 3.0 / math.sqrt(D))
        fp8(f + "shared_experts.w3", I, D, 3.0 / math.sqrt(D))
        fp8(f + "shared_experts.w2", D, I, 0.3 / math.sqrt(I))
        for e in range(E):
            big = 3.0 if e % 4 == 0 else 1.0  # every 4th expert: larger pre-activations (clamp exercised)
            for wn, (o, i_, std) in (("w1", (I, D, big / math.sqrt(D))), ("w3", (I, D, big / math.sqrt(D))),
                                     ("w2", (D, I, 0.5 / (big * math.sqrt(I))))):
                w, s = g.fp4_weight(o, i_, std)
                put(f"{f}experts.{e}.{wn}.weight", w)
                put(f"{f}experts.{e}.{wn}.scale", s)

    put("embed.weight", g.bf16([V, D], lambda i: g.gauss(1.0)))
    for L in range(nL):
        block(f"layers.{L}.", L, m["compress_ratios"][L], L < m["num_hash_layers"])
    norm_w("norm.weight", D)
    put("hc_head_fn", g.f32([hc, hc * D], lambda i: g.gauss(1.0 / math.sqrt(hc * D))))
    put("hc_head_base", g.f32([hc], lambda i: g.gauss(0.8)))
    put("hc_head_scale", g.f32([1], lambda i: 0.5 + g.r.random()))
    put("head.weight", g.bf16([V, D], lambda i: g.gauss(2.0 / math.sqrt(D))))
    ds = m.get("dspark")
    if ds:
        # DSpark drafter (docs/dspark.md): stages mtp.0 .. mtp.S-1 (ratio-0, non-hash blocks), stage 0's main_proj
        # (FP8 [D, T*D]) + main_norm, the last stage's norm, hc_head_*, Markov head (BF16 [V, r] twice: the bias
        # W2 . W1[prev] has a standard deviation of about 1) and confidence projection (BF16 [1, D + r], no bias).
        S, nT, r = ds["n_stages"], len(ds["target_layer_ids"]), ds["markov_rank"]
        for k in range(S):
            block(f"mtp.{k}.", nL + k, m["compress_ratios"][nL + k], False)
        fp8("mtp.0.main_proj", D, nT * D, 1.0 / math.sqrt(nT * D))
        norm_w("mtp.0.main_norm.weight", D)
        p = f"mtp.{S - 1}."
        norm_w(p + "norm.weight", D)
        put(p + "hc_head_fn", g.f32([hc, hc * D], lambda i: g.gauss(1.0 / math.sqrt(hc * D))))
        put(p + "hc_head_base", g.f32([hc], lambda i: g.gauss(0.8)))
        put(p + "hc_head_scale", g.f32([1], lambda i: 0.5 + g.r.random()))
        put(p + "markov_head.markov_w1.weight", g.bf16([V, r], lambda i: g.gauss(1.0)))
        put(p + "markov_head.markov_w2.weight", g.bf16([V, r], lambda i: g.gauss(1.0 / math.sqrt(r))))
        put(p + "confidence_head.proj.weight", g.bf16([1, D + r], lambda i: g.gauss(1.0 / math.sqrt(D + r))))
        return T
    # MTP module (spec §3.5): a ratio-0, non-hash block + e_proj/h_proj/enorm/hnorm/norm/hc_head_*.
    p = "mtp.0."
    block(p, nL, m["compress_ratios"][nL], False)
    fp8(p + "e_proj", D, D, 1.0 / math.sqrt(D))
    fp8(p + "h_proj", D, D, 1.0 / math.sqrt(D))
    norm_w(p + "enorm.weight", D)
    norm_w(p + "hnorm.weight", D)
    norm_w(p + "norm.weight", D)
    put(p + "hc_head_fn", g.f32([hc, hc * D], lambda i: g.gauss(1.0 / math.sqrt(hc * D))))
    put(p + "hc_head_base", g.f32([hc], lambda i: g.gauss(0.8)))
    put(p + "hc_head_scale", g.f32([1], lambda i: 0.5 + g.r.random()))
    return T


DTYPE_SIZE = {"I64": 8, "F32": 4, "BF16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1}


def serialize(T):
    """safetensors bytes: 8-byte LE header length, JSON header (space-padded to 8), data.
    Tensors are laid out by descending element size then name, so every tensor is naturally aligned."""
    names = sorted(T, key=lambda n: (-DTYPE_SIZE[T[n][0]], n))
    header, off = {}, 0
    for n in names:
        dt, shape, data = T[n]
        assert len(data) == _numel(shape) * DTYPE_SIZE[dt], n
        header[n] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(T[n][2] for n in names)


def model_seed(seed, name):
    return int(hashlib.sha256(f"{seed}:{name}".encode()).hexdigest()[:16], 16)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="parent folder; models go to OUT/<name>/")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--only", choices=sorted(MODELS), action="append")
    ap.add_argument("--check", action="store_true", help="compare with existing files instead of writing")
    args = ap.parse_args()
    bad = 0
    for name in args.only or sorted(MODELS):
        m = MODELS[name]
        cfg = (json.dumps(make_config(m), indent=2) + "\n").encode()
        st = serialize(build_tensors(m, model_seed(args.seed, name)))
        if len(st) > SIZE_LIMIT:
            print(f"{name}: model.safetensors is {len(st)} bytes > {SIZE_LIMIT}", file=sys.stderr)
            return 1
        d = os.path.join(args.out, name)
        if args.check:
            for fn, data in (("config.json", cfg), ("model.safetensors", st)):
                p = os.path.join(d, fn)
                ok = os.path.exists(p) and open(p, "rb").read() == data
                print(f"{p}: {'OK' if ok else 'MISMATCH'}")
                bad += not ok
            continue
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "wb") as f:
            f.write(cfg)
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(st)
        print(f"{d}: model.safetensors {len(st)} bytes, sha256 {hashlib.sha256(st).hexdigest()[:16]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

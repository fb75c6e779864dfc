#!/usr/bin/env python3
"""HF-transformers dense golden logits for the tiny official-format checkpoints (GPU machine).

The official FP8/FP4 weights are dequantized exactly to fp32 (oracle_common.dense_tensor), mapped to the transformers
names (spec §3.7) and loaded into DeepseekV4ForCausalLM built in fp32 with eager attention, TF32 off, deterministic
algorithms on. One full prefill per prompt (no cache); per position the top-20 ids and natural-log logprobs are saved.

Usage: python3 tools/oracle/hf_golden.py --model-dir tests/data/tiny-a --model-dir tests/data/tiny-b
         --out-dir tests/data/golden [--logprob-dir DIR]   (DIR/<model>.dense.pt: full fp64 log-softmax per prompt)
"""
import argparse
import json
import os
import re
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_common as oc  # noqa: E402


def hf_config(cfg_dict):
    from transformers import DeepseekV4Config
    d = dict(cfg_dict)
    d.pop("quantization_config", None)  # weights are handed over dequantized
    try:
        cfg = DeepseekV4Config.from_dict(d)
    except Exception as e:  # noqa: BLE001
        print(f"from_dict failed ({e!r}); trying the constructor", flush=True)
        cfg = DeepseekV4Config(**d)
    comp = (cfg.rope_parameters or {}).get("compress", {})
    if comp.get("rope_type") != "yarn" and "rope_scaling" in d:
        # rope_scaling was not folded into rope_parameters by this transformers version: pass it explicitly.
        print(f"rope_scaling not picked up (compress rope = {comp}); passing rope_parameters explicitly", flush=True)
        rs = dict(d.pop("rope_scaling"))
        rs["rope_type"] = rs.pop("type", "yarn")
        d["rope_parameters"] = rs
        cfg = DeepseekV4Config(**d)
    comp, main = cfg.rope_parameters["compress"], cfg.rope_parameters["main"]
    assert comp.get("rope_type") == "yarn" and float(comp.get("factor")) == 16.0, comp
    assert float(comp.get("attention_factor", 1.0)) == 1.0, comp
    assert float(comp["rope_theta"]) == float(d["compress_rope_theta"]), comp
    assert main.get("rope_type", "default") == "default" and float(main["rope_theta"]) == float(d["rope_theta"]), main
    assert cfg.qk_rope_head_dim == d["qk_rope_head_dim"], cfg.qk_rope_head_dim
    n, nh = d["num_hidden_layers"], d["num_hash_layers"]
    kinds = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    want_lt = [kinds[r] for r in d["compress_ratios"][:n]]
    want_mlp = ["hash_moe"] * min(n, nh) + ["moe"] * max(0, n - nh)
    if list(cfg.layer_types) != want_lt:
        print(f"fixing layer_types {cfg.layer_types} -> {want_lt}", flush=True)
        cfg.layer_types = want_lt
    if list(cfg.mlp_layer_types) != want_mlp:
        print(f"fixing mlp_layer_types {cfg.mlp_layer_types} -> {want_mlp}", flush=True)
        cfg.mlp_layer_types = want_mlp
    for attr in ("_attn_implementation", "_experts_implementation"):
        try:
            setattr(cfg, attr, "eager")  # plain matmul experts loop / eager attention in fp32
        except Exception as e:  # noqa: BLE001
            print(f"could not set {attr}=eager: {e!r}", flush=True)
    return cfg


_ATTN = {
    "q_a_proj.weight": "attn.wq_a.weight", "q_a_norm.weight": "attn.q_norm.weight",
    "q_b_proj.weight": "attn.wq_b.weight", "kv_proj.weight": "attn.wkv.weight",
    "kv_norm.weight": "attn.kv_norm.weight", "o_a_proj.weight": "attn.wo_a.weight",
    "o_b_proj.weight": "attn.wo_b.weight", "sinks": "attn.attn_sink",
    "compressor.kv_proj.weight": "attn.compressor.wkv.weight",
    "compressor.gate_proj.weight": "attn.compressor.wgate.weight",
    "compressor.position_bias": "attn.compressor.ape",
    "compressor.kv_norm.weight": "attn.compressor.norm.weight",
    "compressor.indexer.kv_proj.weight": "attn.indexer.compressor.wkv.weight",
    "compressor.indexer.gate_proj.weight": "attn.indexer.compressor.wgate.weight",
    "compressor.indexer.position_bias": "attn.indexer.compressor.ape",
    "compressor.indexer.kv_norm.weight": "attn.indexer.compressor.norm.weight",
    "compressor.indexer.q_b_proj.weight": "attn.indexer.wq_b.weight",
    "compressor.indexer.scorer.weights_proj.weight": "attn.indexer.weights_proj.weight",
}
_LAYER = {
    "attn_hc.fn": "hc_attn_fn", "attn_hc.base": "hc_attn_base", "attn_hc.scale": "hc_attn_scale",
    "ffn_hc.fn": "hc_ffn_fn", "ffn_hc.base": "hc_ffn_base", "ffn_hc.scale": "hc_ffn_scale",
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate.weight": "ffn.gate.weight", "mlp.gate.e_score_correction_bias": "ffn.gate.bias",
    "mlp.gate.tid2eid": "ffn.gate.tid2eid",
    "mlp.shared_experts.gate_proj.weight": "ffn.shared_experts.w1.weight",
    "mlp.shared_experts.up_proj.weight": "ffn.shared_experts.w3.weight",
    "mlp.shared_experts.down_proj.weight": "ffn.shared_experts.w2.weight",
}
_GLOBAL = {
    "model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight", "model.norm.weight": "norm.weight",
    "model.hc_head.hc_fn": "hc_head_fn", "model.hc_head.hc_base": "hc_head_base",
    "model.hc_head.hc_scale": "hc_head_scale",
}


def hf_state_dict(model_keys, T, n_experts):
    """Map every transformers state-dict key to dequantized official tensors. Returns (sd, used official names)."""
    sd, used = {}, set()

    def get(name):
        used.add(name)
        if name.endswith(".weight") and name[:-7] + ".scale" in T:
            used.add(name[:-7] + ".scale")
        return oc.dense_tensor(T, name)

    for k in model_keys:
        if k in _GLOBAL:
            sd[k] = get(_GLOBAL[k])
            continue
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", k)
        if not m:
            raise KeyError(f"unmapped transformers key {k}")
        L, rest = m.group(1), m.group(2)
        p = f"layers.{L}."
        if rest in _LAYER:
            sd[k] = get(p + _LAYER[rest])
        elif rest.startswith("self_attn.") and rest[len("self_attn."):] in _ATTN:
            sd[k] = get(p + _ATTN[rest[len("self_attn."):]])
        elif rest == "mlp.experts.gate_up_proj":
            sd[k] = torch.stack([torch.cat([get(f"{p}ffn.experts.{e}.w1.weight"), get(f"{p}ffn.experts.{e}.w3.weight")])
                                 for e in range(n_experts)])
        elif rest == "mlp.experts.down_proj":
            sd[k] = torch.stack([get(f"{p}ffn.experts.{e}.w2.weight") for e in range(n_experts)])
        else:
            raise KeyError(f"unmapped transformers key {k}")
    return sd, used


def golden_one(model_dir, out_dir, logprob_dir, device):
    from transformers import DeepseekV4ForCausalLM

    name = os.path.basename(os.path.normpath(model_dir))
    cfg_dict = json.load(open(os.path.join(model_dir, "config.json")))
    T = oc.read_checkpoint(model_dir)
    cfg = hf_config(cfg_dict)
    print(f"[{name}] layer_types={cfg.layer_types} mlp_layer_types={cfg.mlp_layer_types} "
          f"rope={cfg.rope_parameters}", flush=True)
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM(cfg).float()
    keys = list(model.state_dict().keys())
    sd, used = hf_state_dict(keys, T, cfg_dict["n_routed_experts"])
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"load_state_dict: missing={missing} unexpected={unexpected}")
    unused = sorted(n for n in T if n not in used and not n.startswith("mtp."))
    if unused:
        raise RuntimeError(f"official tensors not used by the HF model: {unused}")
    for k, v in model.state_dict().items():  # loaded values must equal what we handed over (no silent tying)
        if not torch.equal(v.cpu().to(sd[k].dtype), sd[k]):
            raise RuntimeError(f"tensor {k} differs after loading")
    print(f"[{name}] impl={getattr(model.config, '_attn_implementation', '?')} loaded {len(sd)} tensors", flush=True)
    model.to(device).eval()

    results, logprobs = [], []
    for ids in oc.prompts(cfg_dict["vocab_size"]):
        t0 = time.time()
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids], device=device), use_cache=False)
        logits = out.logits[0].float().cpu()
        lp = torch.log_softmax(logits.double(), -1)
        logprobs.append(lp)
        ti, tl = oc.top_entries(logits)
        results.append((ids, ti, tl))
        print(f"[{name}] L={len(ids)} logits std={logits.std().item():.3f} max|.|={logits.abs().max().item():.2f} "
              f"mean top1 p={lp.max(-1).values.exp().mean().item():.3f} finite={bool(torch.isfinite(logits).all())} "
              f"({time.time() - t0:.1f}s)", flush=True)
    # Causality / prefix consistency: a prefill of the first 130 tokens of the longest prompt must reproduce the
    # first 130 positions of the full prefill.
    ids = oc.prompts(cfg_dict["vocab_size"])[-1]
    with torch.no_grad():
        short = model(input_ids=torch.tensor([ids[:130]], device=device), use_cache=False).logits[0]
    d = (torch.log_softmax(short.double().cpu(), -1) - logprobs[-1][:130]).abs().max().item()
    print(f"[{name}] prefix-consistency max|dlogprob| (130 of 2050) = {d:.3e}", flush=True)
    if logprob_dir:
        torch.save(logprobs, os.path.join(logprob_dir, f"{name}.dense.pt"))
    oc.write_golden(os.path.join(out_dir, f"{name}.dense.json"), name,
                    "fp32 dense: exactly dequantized FP8/FP4 weights, fp32 activations, no quantization simulation "
                    "(transformers eager attention, TF32 off)",
                    "transformers DeepseekV4ForCausalLM (tools/oracle/hf_golden.py)", oc.versions(), results,
                    {"prefix_consistency_max_abs": d})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", action="append", required=True, help="repeatable")
    ap.add_argument("--out-dir", required=True, help="writes <out-dir>/<model>.dense.json")
    ap.add_argument("--logprob-dir", default=None, help="also save full fp64 log-softmax tensors <model>.dense.pt")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    oc.set_deterministic()
    failed = 0
    for d in args.model_dir:
        try:
            golden_one(d, args.out_dir, args.logprob_dir, args.device)
        except Exception:  # noqa: BLE001  (keep going: the other model's golden is still useful)
            traceback.print_exc()
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

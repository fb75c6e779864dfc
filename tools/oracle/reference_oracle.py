#!/usr/bin/env python3
"""Reference-oracle golden logits: the OFFICIAL DeepSeek V4 `inference/model.py` (HF revision 60d8d707, kept in the
git-ignored .scratch/official/, never committed) run with the pure-PyTorch kernel stand-ins of ref_kernels.py, in the
reference's own dtypes (bf16 default dtype, FP8 weights + E8M0 scales, FP4 experts, FP8/FP4 activation simulation).

Only deviation inside model.py: ParallelHead.get_logits is patched to return the logits of EVERY position instead of
only the last one (same fp32 F.linear per row). The checkpoint load mirrors inference/convert.py: names are the
official ones, wo_a is dequantized FP8 -> BF16, experts' I8 bytes are reinterpreted as float4_e2m1fn_x2, bf16 norms /
compressor / head weights are upcast to the fp32 parameters, tid2eid I64 -> int32.

Noise floor: the same prompts are also run on CPU (--noise-device cpu); median / p99 / max |Δ logprob| at the CUDA
run's top-20 ids are stored in the golden file ("noise_floor") and printed. With --logprob-dir (where
hf_golden.py saved its logprobs) the gap to the HF fp32 dense model is reported too ("dense_gap").

Usage: python3 tools/oracle/reference_oracle.py --model-dir tests/data/tiny-a --model-dir tests/data/tiny-b
         --official .scratch/official --out-dir tests/data/golden [--noise-device cpu] [--logprob-dir DIR]
       python3 tools/oracle/reference_oracle.py --greedy-model models/dsv4-demo \
         [--greedy-prompts tests/data/demo/prompts.json --greedy-out tests/data/demo/greedy_reference.json]
"""
import argparse
import importlib.util
import json
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_common as oc  # noqa: E402
import ref_kernels  # noqa: E402


def load_official_model_module(official_dir):
    sys.modules["kernel"] = ref_kernels
    sys.modules["fast_hadamard_transform"] = ref_kernels.fast_hadamard_transform
    spec = importlib.util.spec_from_file_location("official_model", os.path.join(official_dir, "model.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.ParallelHead.get_logits = lambda self, x: F.linear(x.float(), self.weight)  # all positions
    return mod


def model_args(mod, c, max_seq_len):
    rs = c["rope_scaling"]
    return mod.ModelArgs(
        max_batch_size=1, max_seq_len=max_seq_len, dtype="fp8", scale_fmt="ue8m0",
        expert_dtype=c.get("expert_dtype", "fp4"), scale_dtype="fp8", vocab_size=c["vocab_size"],
        dim=c["hidden_size"], moe_inter_dim=c["moe_intermediate_size"], n_layers=c["num_hidden_layers"],
        n_hash_layers=c["num_hash_layers"], n_mtp_layers=c["num_nextn_predict_layers"],
        n_heads=c["num_attention_heads"], n_routed_experts=c["n_routed_experts"],
        n_shared_experts=c["n_shared_experts"], n_activated_experts=c["num_experts_per_tok"],
        score_func=c["scoring_func"], route_scale=c["routed_scaling_factor"], swiglu_limit=c["swiglu_limit"],
        q_lora_rank=c["q_lora_rank"], head_dim=c["head_dim"], rope_head_dim=c["qk_rope_head_dim"],
        norm_eps=c["rms_norm_eps"], o_groups=c["o_groups"], o_lora_rank=c["o_lora_rank"],
        window_size=c["sliding_window"], compress_ratios=tuple(c["compress_ratios"]),
        compress_rope_theta=float(c["compress_rope_theta"]), original_seq_len=rs["original_max_position_embeddings"],
        rope_theta=float(c["rope_theta"]), rope_factor=rs["factor"], beta_fast=rs["beta_fast"],
        beta_slow=rs["beta_slow"], index_n_heads=c["index_n_heads"], index_head_dim=c["index_head_dim"],
        index_topk=c["index_topk"], hc_mult=c["hc_mult"], hc_sinkhorn_iters=c["hc_sinkhorn_iters"],
        hc_eps=c["hc_eps"])


def build(mod, cfg, T, device, max_seq_len):
    for fn in (mod.precompute_freqs_cis, mod.get_window_topk_idxs, mod.get_compress_topk_idxs):
        fn.cache_clear()
    torch.set_default_device(device)
    torch.set_default_dtype(torch.bfloat16)
    det = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)  # construction only (torch.empty of float4 params, see main)
    try:
        with torch.device(device):
            model = mod.Transformer(model_args(mod, cfg, max_seq_len))
    finally:
        torch.use_deterministic_algorithms(det, warn_only=True)
    used = set()
    for name, p in model.named_parameters():
        if name.startswith("mtp.") and (".embed." in name or ".head." in name):
            continue  # shared with the main model (convert.py drops them)
        if name not in T:
            raise KeyError(f"reference parameter {name} {tuple(p.shape)} {p.dtype} not in checkpoint")
        dt, raw = T[name]
        used.add(name)
        if p.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2):
            assert dt in ("F8_E4M3", "F8_E8M0", "I8"), (name, dt)
            new = raw.to(device).view(p.dtype)
        elif dt == "F8_E4M3":  # wo_a: FP8 in the checkpoint, BF16 parameter (convert.py dequantizes it)
            used.add(name[:-7] + ".scale")
            new = oc.dense_tensor(T, name).to(p.dtype)
        else:
            new = raw.to(p.dtype)
        if tuple(new.shape) != tuple(p.shape):
            raise ValueError(f"{name}: checkpoint {tuple(new.shape)} vs model {tuple(p.shape)}")
        p.data = new.to(device)
    torch.set_default_device("cpu")
    unused = sorted(n for n in T if n not in used)
    if unused:
        raise RuntimeError(f"checkpoint tensors unused by the reference: {unused}")
    return model.eval()


def run(model, prompts, device):
    """One full prefill (start_pos 0) per prompt; returns fp32 CPU logits [L, V] per prompt."""
    outs = []
    torch.set_default_device(device)  # model.py creates index tensors on the default device
    try:
        for ids in prompts:
            t0 = time.time()
            logits = model(torch.tensor([ids], dtype=torch.long, device=device), 0)[0].float().cpu()
            outs.append(logits)
            print(f"  [{device}] L={len(ids)} logits std={logits.std().item():.3f} "
                  f"max|.|={logits.abs().max().item():.2f} finite={bool(torch.isfinite(logits).all())} "
                  f"({time.time() - t0:.1f}s)", flush=True)
    finally:
        torch.set_default_device("cpu")
    return outs


def oracle_one(mod, model_dir, out_dir, device, noise_device, logprob_dir, max_seq_len):
    name = os.path.basename(os.path.normpath(model_dir))
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    T = oc.read_safetensors(os.path.join(model_dir, "model.safetensors"))
    prompts = oc.prompts(cfg["vocab_size"])

    print(f"[{name}] reference on {device}", flush=True)
    model = build(mod, cfg, T, device, max_seq_len)
    main_logits = run(model, prompts, device)
    lp_main = [torch.log_softmax(x.double(), -1) for x in main_logits]
    # Prefix consistency: the first 130 tokens of the longest prompt as their own prefill.
    short = run(model, [prompts[-1][:130]], device)[0]
    prefix_d = (torch.log_softmax(short.double(), -1) - lp_main[-1][:130]).abs()
    prefix = {"median": prefix_d.median().item(), "max": prefix_d.max().item()}
    print(f"[{name}] prefix consistency (130 of 2050): {prefix}", flush=True)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()

    results, all_ids = [], []
    for ids, logits in zip(prompts, main_logits):
        ti, tl = oc.top_entries(logits)
        results.append((ids, ti, tl))
        all_ids.extend(ti)
    lp_cat = torch.cat(lp_main)
    extra = {"prefix_consistency": prefix}
    dense_path = os.path.join(logprob_dir, f"{name}.dense.pt") if logprob_dir else None
    if dense_path and os.path.exists(dense_path):
        dense = torch.cat(torch.load(dense_path))
        extra["dense_gap"] = oc.compare(lp_cat, dense, all_ids)
        print(f"[{name}] reference vs HF fp32 dense: {extra['dense_gap']}", flush=True)
    out = os.path.join(out_dir, f"{name}.reference.json")
    numerics = ("official reference numerics: bf16 activations, FP8 (e4m3, ue8m0 per 128) activation quantization "
                "for FP8/FP4 GEMMs, FP8 KV / FP4 indexer simulation, fp32 logits")
    source = ("official inference/model.py @60d8d707 + tools/oracle/ref_kernels.py stand-ins "
              "(tools/oracle/reference_oracle.py)")
    oc.write_golden(out, name, numerics, source, oc.versions(), results, extra)  # written before the slow CPU run
    if noise_device:
        print(f"[{name}] noise floor run on {noise_device}", flush=True)
        model = build(mod, cfg, T, noise_device, max_seq_len)
        other = run(model, prompts, noise_device)
        del model
        lp_other = torch.cat([torch.log_softmax(x.double(), -1) for x in other])
        extra["noise_floor"] = dict(oc.compare(lp_cat, lp_other, all_ids), vs=noise_device)
        print(f"[{name}] noise floor ({device} vs {noise_device}): {extra['noise_floor']}", flush=True)
        oc.write_golden(out, name, numerics, source, oc.versions(), results, extra)


def read_checkpoint(model_dir):
    """All tensors of model.safetensors or of the shards listed in model.safetensors.index.json."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if not os.path.exists(index):
        return oc.read_safetensors(os.path.join(model_dir, "model.safetensors"))
    T = {}
    for shard in sorted(set(json.load(open(index))["weight_map"].values())):
        T.update(oc.read_safetensors(os.path.join(model_dir, shard)))
    return T


def reset_state(model):
    """Per-sequence reset of the compressor running state (the release never resets it; spec §5.5 caveat)."""
    for m in model.modules():
        if hasattr(m, "kv_state") and hasattr(m, "score_state"):
            m.kv_state.zero_()
            m.score_state.fill_(float("-inf"))


def greedy(mod, model_dir, prompts_path, out_path, n_new, device, max_seq_len):
    """Reference greedy decoding the way generate.py does it: one prefill at start_pos 0, then one token per call."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    T = read_checkpoint(model_dir)
    doc = json.load(open(prompts_path))
    items = doc["prompts"] if isinstance(doc, dict) else doc
    model = build(mod, cfg, T, device, max_seq_len)
    torch.set_default_device(device)
    res = []
    try:
        for it in items:
            ids = list(it.get("prompt_ids") or it.get("ids"))
            reset_state(model)
            t0 = time.time()
            logits = model(torch.tensor([ids], dtype=torch.long, device=device), 0)[0, -1]
            out, pos = [], len(ids)
            for _ in range(n_new):
                nxt = int(logits.argmax())
                out.append(nxt)
                logits = model(torch.tensor([[nxt]], dtype=torch.long, device=device), pos)[0, -1]
                pos += 1
            res.append({"text": it.get("text"), "prompt_ids": ids, "greedy_ids": out})
            print(f"  greedy prompt {len(res)}: {len(ids)} + {n_new} tokens ({time.time() - t0:.1f}s)", flush=True)
            with open(out_path + ".partial", "w") as f:  # survives a timeout
                json.dump({"prompts": res}, f)
    finally:
        torch.set_default_device("cpu")
    dense_path = os.path.join(os.path.dirname(out_path), "greedy_dense.json")
    agree = None
    if os.path.exists(dense_path):
        dense = json.load(open(dense_path))["prompts"]
        agree = []
        for r, d in zip(res, dense):
            n = 0
            while n < min(len(r["greedy_ids"]), len(d["greedy_ids"])) and r["greedy_ids"][n] == d["greedy_ids"][n]:
                n += 1
            agree.append(n)
        print(f"  common greedy prefix with greedy_dense.json per prompt: {agree}", flush=True)
    with open(out_path, "w") as f:
        json.dump({"model": os.path.basename(os.path.normpath(model_dir)),
                   "numerics": "official reference numerics (bf16, FP8/FP4 simulation), prefill + 1-token decode",
                   "source": "official inference/model.py @60d8d707 + tools/oracle/ref_kernels.py "
                             "(tools/oracle/reference_oracle.py --greedy-model)",
                   "versions": oc.versions(), "common_prefix_with_dense": agree, "prompts": res}, f)
        f.write("\n")
    print(f"wrote {out_path}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", action="append", default=[], help="repeatable")
    ap.add_argument("--greedy-model", default=None, help="greedy mode: model folder (may be sharded)")
    ap.add_argument("--greedy-prompts", default="tests/data/demo/prompts.json")
    ap.add_argument("--greedy-out", default="tests/data/demo/greedy_reference.json")
    ap.add_argument("--greedy-new", type=int, default=64)
    ap.add_argument("--official", default=".scratch/official", help="folder holding the official model.py")
    ap.add_argument("--out-dir", default=None, help="writes <out-dir>/<model>.reference.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--noise-device", default="cpu", help="second run for the noise floor ('' to skip)")
    ap.add_argument("--logprob-dir", default=None, help="where hf_golden.py saved <model>.dense.pt")
    ap.add_argument("--max-seq-len", type=int, default=4096)
    args = ap.parse_args()
    oc.set_deterministic()  # (also turns off the NaN fill of torch.empty: no kernel for float4_e2m1fn_x2)
    mod = load_official_model_module(args.official)
    failed = 0
    if args.greedy_model:
        try:
            greedy(mod, args.greedy_model, args.greedy_prompts, args.greedy_out, args.greedy_new, args.device,
                   args.max_seq_len)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            failed += 1
    for d in args.model_dir:
        try:
            oracle_one(mod, d, args.out_dir, args.device, args.noise_device, args.logprob_dir, args.max_seq_len)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

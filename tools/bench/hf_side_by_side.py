#!/usr/bin/env python3
"""dsv4 and HF transformers side by side on one GPU (issue 9, item 5).

Runs `dsv4 bench model --load-format dummy` and then transformers' DeepseekV4ForCausalLM with random bf16 weights
of the same config and the same number of layers on the same GPU, one after the other, and prints decode and
prefill tok/s of both and the ratios dsv4 / HF. Full bf16 V4-Flash layers are ~13 GB each in HF (the routed experts
are not quantized there), so the layer count is what fits the GPU in bf16 (default 4); both sides run that count.

HF: prefill of --prefill random tokens (one forward with use_cache=True), then --steps greedy decode steps with the
returned cache, bf16, the config's default attention / experts implementation (falls back to eager if that fails).
dsv4: decode at --ctx = --prefill tokens of context (batch 1) and a prefill of --prefill tokens, fast kernels.

Usage (GPU machine, after a CUDA build):
  python3 tools/bench/hf_side_by_side.py --dsv4 build/dsv4 \
      --config tests/data/configs/deepseek-v4-flash-config.json --layers 4 --prefill 2048 --steps 16 \
      --out bench/results/side-by-side.json
"""
import argparse
import json
import os
import subprocess
import sys
import time

ORACLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle")


def run_dsv4(args, extra):
    cmd = [args.dsv4, "bench", "model", "--config", args.config, "--load-format", "dummy", "--layers",
           str(args.layers), "--device", "cuda", "--no-profile", "--json"] + extra
    print("dsv4:", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        raise SystemExit(f"dsv4 bench model failed with exit code {p.returncode}")
    return " ".join(cmd), json.loads(p.stdout)


def hf_model(cfg_dict, layers, impl):
    import torch
    sys.path.insert(0, ORACLE)
    from hf_golden import hf_config  # the oracle's config mapping (layer types, rope parameters)
    from transformers import DeepseekV4ForCausalLM

    d = dict(cfg_dict)
    d["num_hidden_layers"] = layers
    d["compress_ratios"] = list(d["compress_ratios"][:layers])
    cfg = hf_config(d)
    if impl == "default":  # hf_config chose eager (the oracle's exact mode); None = the library's default choice
        for attr in ("_attn_implementation", "_experts_implementation"):
            try:
                setattr(cfg, attr, None)
            except Exception as e:  # noqa: BLE001
                print(f"could not reset {attr}: {e!r}", flush=True)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = DeepseekV4ForCausalLM(cfg)
    return model.eval()


def hf_run(model, vocab, prefill, steps):
    import torch
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, vocab, (1, prefill), device="cuda", generator=g)
    with torch.no_grad():
        out = model(input_ids=ids[:, :16], use_cache=True)  # warm-up: kernels, allocator
        model(input_ids=out.logits[:, -1:].argmax(-1), past_key_values=out.past_key_values, use_cache=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=ids, use_cache=True)
        torch.cuda.synchronize()
        t_prefill = time.perf_counter() - t0
        pkv, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        if not torch.isfinite(out.logits[:, -1]).all():
            raise SystemExit("HF: non-finite logits with random weights")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=tok, past_key_values=pkv, use_cache=True)
            pkv, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        t_decode = (time.perf_counter() - t0) / steps
    return {"prefill_ms": t_prefill * 1e3, "prefill_tok_s": prefill / t_prefill, "decode_ms_per_step": t_decode * 1e3,
            "decode_tok_s": 1.0 / t_decode}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsv4", default="build/dsv4")
    ap.add_argument("--config", default="tests/data/configs/deepseek-v4-flash-config.json")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prefill", type=int, default=2048, help="prompt tokens (a multiple of 128)")
    ap.add_argument("--steps", type=int, default=16, help="decode steps")
    ap.add_argument("--hf-impl", choices=["default", "eager"], default="default")
    ap.add_argument("--commit", default=os.environ.get("DSV4_COMMIT", "unknown"))
    ap.add_argument("--out", help="write the JSON here (also printed)")
    args = ap.parse_args()
    if args.prefill <= 0 or args.prefill % 128:
        raise SystemExit("--prefill must be a positive multiple of 128")
    cfg_dict = json.load(open(args.config))

    dec_cmd, dec = run_dsv4(args, ["--ctx", str(args.prefill), "--prefill", "0", "--steps", str(max(args.steps, 8))])
    pre_cmd, pre = run_dsv4(args, ["--ctx", "0", "--prefill", str(args.prefill), "--steps", "1"])
    dec, pre = dec.get("result", dec), pre.get("result", pre)

    import torch
    import transformers
    impl = args.hf_impl
    try:
        model = hf_model(cfg_dict, args.layers, impl)
        hf = hf_run(model, cfg_dict["vocab_size"], args.prefill, args.steps)
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001
        if impl == "eager":
            raise
        print(f"HF with the default implementation failed ({e!r}); eager instead", flush=True)
        model = None
        torch.cuda.empty_cache()
        impl = "eager"
        model = hf_model(cfg_dict, args.layers, impl)
        hf = hf_run(model, cfg_dict["vocab_size"], args.prefill, args.steps)
    hf["implementation"] = impl

    res = {
        "command": "python3 " + " ".join(sys.argv),
        "commit": args.commit,
        "device": torch.cuda.get_device_name(0),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "config": args.config,
        "layers": args.layers,
        "prefill_tokens": args.prefill,
        "decode_ctx": args.prefill,
        "dsv4": {"decode_command": dec_cmd, "prefill_command": pre_cmd,
                 "decode_ms_per_step": dec["decode_ms_per_step"], "decode_tok_s": dec["decode_tok_s"],
                 "prefill_tok_s": pre["prefill_tok_s"]},
        "hf": hf,
    }
    res["ratio_decode"] = res["dsv4"]["decode_tok_s"] / hf["decode_tok_s"]
    res["ratio_prefill"] = res["dsv4"]["prefill_tok_s"] / hf["prefill_tok_s"]
    print(f"{args.layers} layers, prefill {args.prefill}: decode dsv4 {res['dsv4']['decode_tok_s']:.1f} tok/s, "
          f"HF {hf['decode_tok_s']:.2f} tok/s, ratio {res['ratio_decode']:.1f}x; prefill dsv4 "
          f"{res['dsv4']['prefill_tok_s']:.0f} tok/s, HF {hf['prefill_tok_s']:.0f} tok/s, "
          f"ratio {res['ratio_prefill']:.1f}x", flush=True)
    text = json.dumps(res, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""HF transformers as the second speed peer of `dflash bench` (issue 4): a Qwen3-8B-shaped model with random
bf16 weights on the GPU (speed does not depend on the values), greedy generate() with the static cache, SDPA
attention. Runs on the GPU machine (PyTorch and transformers are installed there; no weights needed).

  python3 tools/bench/hf_peer.py [--prompts 512,4096] [--gen 64] [--compile]

Prefill tok/s = prompt / time(generate 1 token); decode tok/s = (gen - 1) / (time(gen) - time(1)), medians
of 3 after a warm-up. --compile: torch.compile(mode="reduce-overhead") on the forward (minutes to compile).
"""
import argparse, json, statistics, time

import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--prompts", default="512,4096")
ap.add_argument("--gen", type=int, default=64)
ap.add_argument("--compile", action="store_true")
a = ap.parse_args()

cfg = Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                  rope_theta=1e6, tie_word_embeddings=False)
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)  # build the weights in bf16 directly (fp32 first would take 32 GB)
with torch.device("cuda"):
    model = Qwen3ForCausalLM(cfg).eval()
torch.set_default_dtype(torch.float32)
if a.compile:
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)


def timed(ids, new):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                       cache_implementation="static", pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


rows = []
for n in [int(x) for x in a.prompts.split(",")]:
    ids = torch.randint(0, cfg.vocab_size, (1, n), device="cuda")
    timed(ids, 2)  # warm-up
    t1 = statistics.median(timed(ids, 1) for _ in range(3))
    tg = statistics.median(timed(ids, a.gen) for _ in range(3))
    rows.append({"prompt": n, "prefill_tok_s": n / t1, "decode_tok_s": (a.gen - 1) / max(tg - t1, 1e-9),
                 "torch": torch.__version__, "transformers": transformers.__version__, "compile": a.compile,
                 "gpu": torch.cuda.get_device_name(0)})
    print(json.dumps(rows[-1]), flush=True)

#!/usr/bin/env python3
"""Writes small random-weight HF models and their reference outputs (HF transformers is the oracle).

Runs on the GPU machine (transformers 5.17, torch; no internet, no weights needed):
    python3 tools/reference/make_tiny_models.py tests/fixtures/models

For each model it writes <out>/<name>/{config.json, model.safetensors, reference.safetensors, reference.json}:
  reference.safetensors  logits.<k>  [len_k, vocab] f32, logits of every position of prompt k
                         hidden.<k>.<l> [len_k, hidden] f32, output of decoder layer l (HF hidden_states[l+1])
                                        for prompt 1 only (the ~50-token one)
  reference.json         prompts (token ids), greedy continuations (16 tokens), dims, seed, versions
Weights are drawn with unit-scale statistics (not HF's tiny init) so logits are far from uniform and
top-k / greedy comparisons mean something. Compute is float32 on the CPU (no TF32, deterministic).
"""
import json
import math
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3_5ForCausalLM, Qwen3_5TextConfig

SEED = 20261122
PROMPT_LENGTHS = [1, 50, 7, 300]   # 300 tokens = several 64-token DeltaNet chunks, not a multiple of 64
GREEDY_TOKENS = 16


def randomize(model, generator):
    """Unit-scale random weights: linear rows ~ N(0, 1/fan_in), norms around 1, stable DeltaNet decay."""
    zero_centred = getattr(model.config, "model_type", "").startswith("qwen3_5")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty(p.shape).uniform_(1.0, 8.0, generator=generator)))
            elif name.endswith("dt_bias"):
                p.copy_(torch.empty(p.shape).uniform_(-1.0, 1.0, generator=generator))
            elif "norm" in name:
                base = 0.0 if zero_centred and "linear_attn.norm" not in name else 1.0
                p.copy_(base + 0.2 * torch.randn(p.shape, generator=generator))
            elif "conv1d" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=generator))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=generator))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=generator) / math.sqrt(p.shape[1]))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))


def build(name):
    if name == "tiny-qwen3":
        cfg = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                          max_position_embeddings=4096, rope_theta=1000000.0, tie_word_embeddings=True,
                          bos_token_id=1, eos_token_id=2)
        return cfg, Qwen3ForCausalLM
    if name == "tiny-qwen35":
        cfg = Qwen3_5TextConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                                max_position_embeddings=4096, tie_word_embeddings=False,
                                rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                                 "partial_rotary_factor": 0.25,
                                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True},
                                linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                                linear_num_key_heads=2, linear_num_value_heads=4,
                                bos_token_id=1, eos_token_id=2)
        return cfg, Qwen3_5ForCausalLM
    raise SystemExit(f"unknown model {name}")


def main():
    out_root = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/models"
    names = sys.argv[2:] or ["tiny-qwen3", "tiny-qwen35"]
    torch.set_default_dtype(torch.float32)
    torch.backends.cuda.matmul.allow_tf32 = False
    for i, name in enumerate(names):
        g = torch.Generator().manual_seed(SEED + i)
        cfg, cls = build(name)
        model = cls(cfg).eval()
        randomize(model, g)
        out = os.path.join(out_root, name)
        os.makedirs(out, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)

        prompts = [torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
        tensors, greedy = {}, []
        with torch.no_grad():
            for k, ids in enumerate(prompts):
                x = torch.tensor([ids])
                res = model(input_ids=x, output_hidden_states=(k == 1), use_cache=False)
                tensors[f"logits.{k}"] = res.logits[0].float().contiguous()
                if k == 1:
                    for l, h in enumerate(res.hidden_states[1:]):
                        tensors[f"hidden.{k}.{l}"] = h[0].float().contiguous()
                gen = model.generate(x, max_new_tokens=GREEDY_TOKENS, do_sample=False, min_new_tokens=GREEDY_TOKENS,
                                     eos_token_id=None, pad_token_id=0)
                greedy.append(gen[0, len(ids):].tolist())
        save_file(tensors, os.path.join(out, "reference.safetensors"))
        meta = {"model": name, "seed": SEED + i, "prompts": prompts, "greedy": greedy,
                "greedy_tokens": GREEDY_TOKENS, "hidden_prompt": 1,
                "torch": torch.__version__, "transformers": transformers.__version__}
        with open(os.path.join(out, "reference.json"), "w") as f:
            json.dump(meta, f)
        print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters -> {out}")


if __name__ == "__main__":
    main()

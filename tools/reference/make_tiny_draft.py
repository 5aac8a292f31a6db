#!/usr/bin/env python3
"""Writes a random-weight tiny DFlash draft for tiny-qwen35 and its reference outputs, the oracle for the C++
draft forward (algorithms.md A.3). HF transformers runs the target; tools/train/dflash_draft.py is the draft.

Runs on the GPU machine (torch, transformers 5.17, safetensors; no internet), after make_tiny_models.py wrote
<out>/tiny-qwen35:
    python3 tools/reference/make_tiny_draft.py tests/fixtures/models

Writes <out>/tiny-qwen35-dflash/:
  config.json            published DFlash layout: 2 layers, H 64, 4 heads x 16 / 2 KV, FFN 128, block 8,
                         target_layer_ids [1, 5], mask_token_id 511, rope_theta 1e7, float32
  model.safetensors      float32, the published names (fc.weight, hidden_norm.weight, layers.i....)
  reference.safetensors  features        [50, 128] f32: F[t] = concat(hidden_states[l+1][t], l in [1, 5]) of
                                         tiny-qwen35 on its reference prompt 1 (50 tokens)
                         draft_logits.k  [7, 512] f32: draft call k, block rows 1..7 @ the target's lm_head
                         draft_hidden.0  [8, 64] f32: final-normed draft hidden of all block rows, call 0
  reference.json         target, prompt (ids), calls [{s, root}], block_size, mask_token_id, seed, versions
Call k: context = positions 0..s-1 (features F[0..s-1]), block = [prompt[s], MASK x 7] at positions s..s+7;
s = 40 and 45. Weights are unit-scale random (as make_tiny_models.randomize) so logits are far from uniform.
Compute is float32 on the CPU (no TF32, deterministic).
"""
import json
import math
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5ForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
import dflash_draft as dd  # noqa: E402

SEED = 20261122 + 7
TARGET = "tiny-qwen35"
NAME = "tiny-qwen35-dflash"
CALLS = [40, 45]          # s of each draft call (the block root is prompt[s])


def randomize(model, generator):
    """Unit-scale random weights: linear rows ~ N(0, 1/fan_in), norms 1 + 0.2 N(0, 1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=generator))
            else:
                assert p.dim() == 2, name
                p.copy_(torch.randn(p.shape, generator=generator) / math.sqrt(p.shape[1]))


def main():
    out_root = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/models"
    torch.set_default_dtype(torch.float32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(SEED)
    dd.self_test()

    tdir = os.path.join(out_root, TARGET)
    with open(os.path.join(tdir, "reference.json")) as f:
        tref = json.load(f)
    prompt = tref["prompts"][1]
    assert len(prompt) == 50, len(prompt)
    target = Qwen3_5ForCausalLM.from_pretrained(tdir, dtype=torch.float32).eval()
    tc = target.config
    H, n_layers, vocab = tc.hidden_size, tc.num_hidden_layers, tc.vocab_size
    assert (H, n_layers, vocab) == (64, 8, 512), (H, n_layers, vocab)

    cfg = dd.draft_config(hidden_size=H, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, num_target_layers=n_layers, target_layer_ids=[1, 5],
                          mask_token_id=511, vocab_size=vocab, block_size=8, rope_theta=10000000.0,
                          rms_norm_eps=1e-6, max_position_embeddings=4096, dtype="float32",
                          bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id)
    g = torch.Generator().manual_seed(SEED)
    draft = dd.DFlashDraft(cfg).eval()
    randomize(draft, g)
    B, mask_id, layer_ids = cfg["block_size"], cfg["dflash_config"]["mask_token_id"], cfg["dflash_config"]["target_layer_ids"]

    embed = target.get_input_embeddings().weight          # [V, H]
    head = target.get_output_embeddings().weight          # [V, H], untied here
    assert embed.shape == head.shape == (vocab, H)
    assert embed.data_ptr() != head.data_ptr(), "tiny-qwen35 has an untied head"

    with torch.no_grad():
        res = target(input_ids=torch.tensor([prompt]), output_hidden_states=True, use_cache=False)
        hs = res.hidden_states
        assert len(hs) == n_layers + 1, len(hs)
        assert torch.equal(hs[0][0], embed[torch.tensor(prompt)]), "hidden_states[0] is not the embedding"
        # The target must reproduce its own committed reference (same transformers math as make_tiny_models).
        oracle = load_file(os.path.join(tdir, "reference.safetensors"))
        for l in layer_ids:
            err = (hs[l + 1][0] - oracle[f"hidden.1.{l}"]).abs().max().item()
            assert err < 1e-4, f"hidden_states[{l + 1}] differs from tiny-qwen35 reference hidden.1.{l} by {err}"
        err = (res.logits[0] - oracle["logits.1"]).abs().max().item()
        assert err < 1e-3, f"logits differ from tiny-qwen35 reference logits.1 by {err}"

        feats = torch.cat([hs[l + 1][0] for l in layer_ids], dim=-1).float().contiguous()
        assert feats.shape == (50, len(layer_ids) * H), feats.shape
        C = draft.context(feats)
        assert C.shape == (50, H)

        tensors = {"features": feats}
        calls = []
        for k, s in enumerate(CALLS):
            root = prompt[s]
            assert root != mask_id
            block = torch.tensor([root] + [mask_id] * (B - 1))
            emb = embed[block]                                   # [B, H]
            hid = draft.forward_infer(C[:s], emb, s)             # [B, H]
            assert hid.shape == (B, H)
            # The training form (mask, context 0..49 visible only below s) must give the same rows.
            hid_t = draft.forward_train(C, emb, torch.tensor([s]), 50)
            err = (hid_t - hid).abs().max().item()
            assert err < 1e-5, f"forward_train differs from forward_infer by {err} (call {k})"
            logits = hid[1:] @ head.T                            # [B-1, V]
            assert logits.shape == (B - 1, vocab)
            tensors[f"draft_logits.{k}"] = logits.float().contiguous()
            if k == 0:
                tensors["draft_hidden.0"] = hid.float().contiguous().clone()
            calls.append({"s": s, "root": root})
            p = torch.softmax(logits, -1)
            print(f"call {k}: s {s} root {root}: max |logit| {logits.abs().max().item():.2f}, "
                  f"top-1 prob mean {p.max(-1).values.mean().item():.3f}, argmax {logits.argmax(-1).tolist()}", flush=True)

    out = os.path.join(out_root, NAME)
    dd.save_draft(draft, out, cfg, torch.float32)
    save_file(tensors, os.path.join(out, "reference.safetensors"))
    meta = {"target": TARGET, "prompt": prompt, "calls": calls, "block_size": B, "mask_token_id": mask_id,
            "target_layer_ids": layer_ids, "seed": SEED, "torch": torch.__version__,
            "transformers": transformers.__version__}
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(meta, f)
    # Reload what was written and check it reproduces call 0.
    again, _ = dd.load_draft(out)
    with torch.no_grad():
        s = CALLS[0]
        block = torch.tensor([prompt[s]] + [mask_id] * (B - 1))
        hid = again.forward_infer(again.context(feats)[:s], embed[block], s)
    assert (hid - tensors["draft_hidden.0"]).abs().max().item() < 1e-6, "reloaded draft differs"
    print(f"{NAME}: {sum(p.numel() for p in draft.parameters())} parameters -> {out}", flush=True)


if __name__ == "__main__":
    main()

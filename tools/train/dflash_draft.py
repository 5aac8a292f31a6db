#!/usr/bin/env python3
"""The DFlash block-diffusion draft model in torch, exactly as algorithms.md A.3
(z-lab `DFlashDraftModel`): a small Qwen3-style stack that reads fused target features as extra keys/values
in every layer and predicts a whole block [root, MASK x (B-1)] in one bidirectional forward.

Imported by tools/train/train_dflash_draft.py (training form, A.6) and tools/reference/make_tiny_draft.py
(inference form, the oracle of the C++ draft forward). Run on its own it is a CPU self-test (torch only):

    python3 tools/train/dflash_draft.py

Parameter names are the published safetensors names (fc.weight, hidden_norm.weight, norm.weight,
layers.i.self_attn.{q,k,v,o}_proj.weight, layers.i.self_attn.{q,k}_norm.weight,
layers.i.{input,post_attention}_layernorm.weight, layers.i.mlp.{gate,up,down}_proj.weight). The draft has
no embedding and no head: callers embed block tokens with the target's embedding table and take logits as
hidden @ target_lm_head.T (the embedding table for a tied target).
"""
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


def default_target_layer_ids(num_target_layers, n):
    """z-lab `build_target_layer_ids` (A.1): one id -> [N/2]; else round(1 + i*(N-4)/(n-1)), i = 0..n-1."""
    if n == 1:
        return [num_target_layers // 2]
    return [int(round(1 + i * (num_target_layers - 4) / (n - 1))) for i in range(n)]


def draft_config(*, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
                 head_dim, num_target_layers, target_layer_ids, mask_token_id, vocab_size, block_size=16,
                 rope_theta=10000000.0, rms_norm_eps=1e-6, max_position_embeddings=32768, dtype="bfloat16",
                 bos_token_id=None, eos_token_id=None):
    """A config.json dict in the published layout (tests/fixtures/configs/qwen3_8b_dflash.json)."""
    return {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": int(block_size),
        "bos_token_id": bos_token_id,
        "dflash_config": {"mask_token_id": int(mask_token_id), "target_layer_ids": [int(i) for i in target_layer_ids]},
        "dtype": dtype,
        "eos_token_id": eos_token_id,
        "head_dim": int(head_dim),
        "hidden_act": "silu",
        "hidden_size": int(hidden_size),
        "initializer_range": 0.02,
        "intermediate_size": int(intermediate_size),
        "layer_types": ["full_attention"] * int(num_hidden_layers),
        "max_position_embeddings": int(max_position_embeddings),
        "max_window_layers": int(num_hidden_layers),
        "model_type": "qwen3",
        "num_attention_heads": int(num_attention_heads),
        "num_hidden_layers": int(num_hidden_layers),
        "num_key_value_heads": int(num_key_value_heads),
        "num_target_layers": int(num_target_layers),
        "rms_norm_eps": float(rms_norm_eps),
        "rope_scaling": None,
        "rope_theta": float(rope_theta),
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": int(vocab_size),
    }


def parameter_names(cfg):
    """The published safetensors names of a draft with config `cfg`, with their shapes."""
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    ffn, m = cfg["intermediate_size"], len(cfg["dflash_config"]["target_layer_ids"])
    out = {"fc.weight": (H, m * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        out.update({p + "self_attn.q_proj.weight": (nh * hd, H), p + "self_attn.k_proj.weight": (nkv * hd, H),
                    p + "self_attn.v_proj.weight": (nkv * hd, H), p + "self_attn.o_proj.weight": (H, nh * hd),
                    p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                    p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                    p + "mlp.gate_proj.weight": (ffn, H), p + "mlp.up_proj.weight": (ffn, H),
                    p + "mlp.down_proj.weight": (H, ffn)})
    return out


class RMSNorm(nn.Module):
    """Standard (not zero-centred) RMSNorm: x * rsqrt(mean(x^2) + eps) * w, computed in float32."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.to(y.dtype)).to(x.dtype)


def rope_cos_sin(pos, head_dim, theta):
    """cos, sin [..., P, hd] for integer positions pos [..., P]: angle_i = pos * theta^(-2i/hd), i < hd/2,
    duplicated to the full head (NEOX layout: pair i with i + hd/2)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=pos.device).float() / head_dim))
    ang = pos.to(torch.float32)[..., None] * inv
    ang = torch.cat([ang, ang], -1)
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):
    """x [b, P, heads, hd]; cos, sin [b or 1, P, hd]. Rotate-half over the full head dim."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    c, s = cos[:, :, None, :].to(xf.dtype), sin[:, :, None, :].to(xf.dtype)
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * c + torch.cat([-x2, x1], -1) * s).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H = cfg["hidden_size"]
        self.nh, self.nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or H // self.nh
        assert self.nh % self.nkv == 0
        self.q_proj = nn.Linear(H, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.q_norm = RMSNorm(self.hd, cfg["rms_norm_eps"])
        self.k_norm = RMSNorm(self.hd, cfg["rms_norm_eps"])

    def forward(self, xn, c, rope_x, rope_c, mask):
        """xn [b, Lx, H] normed block states; c [b, Lc, H] context (the same C in every layer);
        mask None (all keys visible) or bool [b, Lx, Lc + Lx], True = attend; keys are [context ; block]."""
        b, Lx, _ = xn.shape
        Lc = c.shape[1]
        q = self.q_norm(self.q_proj(xn).view(b, Lx, self.nh, self.hd))
        kx = self.k_norm(self.k_proj(xn).view(b, Lx, self.nkv, self.hd))
        vx = self.v_proj(xn).view(b, Lx, self.nkv, self.hd)
        kc = self.k_norm(self.k_proj(c).view(b, Lc, self.nkv, self.hd))
        vc = self.v_proj(c).view(b, Lc, self.nkv, self.hd)
        q, kx = apply_rope(q, *rope_x), apply_rope(kx, *rope_x)
        kc = apply_rope(kc, *rope_c)
        k = torch.cat([kc, kx], 1).transpose(1, 2)          # [b, nkv, Lc+Lx, hd]
        v = torch.cat([vc, vx], 1).transpose(1, 2)
        rep = self.nh // self.nkv                           # GQA: query head j uses KV head j // rep
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        q = q.transpose(1, 2)                               # [b, nh, Lx, hd]
        assert q.dtype == k.dtype == v.dtype, (q.dtype, k.dtype, v.dtype)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask[:, None])
        return self.o_proj(o.transpose(1, 2).reshape(b, Lx, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, ffn = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(H, ffn, bias=False)
        self.up_proj = nn.Linear(H, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, x, c, rope_x, rope_c, mask):
        x = x + self.self_attn(self.input_layernorm(x), c, rope_x, rope_c, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraft(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert all(t == "full_attention" for t in cfg.get("layer_types") or []), "only full-attention drafts"
        assert not cfg.get("rope_scaling"), "rope_scaling is not implemented"
        self.cfg = cfg
        H = cfg["hidden_size"]
        self.hidden_size = H
        self.block_size = cfg["block_size"]
        self.target_layer_ids = list(cfg["dflash_config"]["target_layer_ids"])
        self.mask_token_id = cfg["dflash_config"]["mask_token_id"]
        self.head_dim = cfg.get("head_dim") or H // cfg["num_attention_heads"]
        self.rope_theta = float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {})["rope_theta"])
        m = len(self.target_layer_ids)
        self.fc = nn.Linear(m * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg["rms_norm_eps"])
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(H, cfg["rms_norm_eps"])
        names = {k: tuple(v.shape) for k, v in self.state_dict().items()}
        assert names == parameter_names(cfg), sorted(set(names) ^ set(parameter_names(cfg)))

    def context(self, features):
        """C = RMSNorm(features @ fc.T ; hidden_norm), features [..., S, m*H] -> [..., S, H]."""
        assert features.shape[-1] == self.fc.in_features, features.shape
        return self.hidden_norm(self.fc(features))

    def _run(self, x, c, pos_x, pos_c, mask):
        rope_x = rope_cos_sin(pos_x, self.head_dim, self.rope_theta)
        rope_c = rope_cos_sin(pos_c, self.head_dim, self.rope_theta)
        for layer in self.layers:
            x = layer(x, c, rope_x, rope_c, mask)
        return self.norm(x)

    def train_mask(self, anchors, S):
        """A.6 step 4. anchors [b, N] -> bool [b, N*B, S + N*B]: query (block j, any offset) sees context key t
        iff t < a_j, and every key of its own block j (bidirectional); other blocks never."""
        b, N = anchors.shape
        B = self.block_size
        qa = anchors.repeat_interleave(B, dim=1)                                    # [b, N*B]
        ctx = torch.arange(S, device=anchors.device)[None, None, :] < qa[:, :, None]  # [b, N*B, S]
        blk = torch.arange(N, device=anchors.device).repeat_interleave(B)          # [N*B]
        same = (blk[:, None] == blk[None, :])[None].expand(b, -1, -1)              # [b, N*B, N*B]
        return torch.cat([ctx, same], dim=-1)

    def forward_train(self, ctx_C, block_emb, anchors, S=None):
        """Training form (A.6). ctx_C [S, H] (or [b, S, H]) context for positions 0..S-1; block_emb [N*B, H]
        (or [b, N*B, H]) embedded blocks [x_{a_j}, MASK x (B-1)]; anchors [N] (or [b, N]) int; block j sits at
        positions a_j..a_j+B-1. Returns the final-normed hidden [N*B, H] (or [b, N*B, H])."""
        single = ctx_C.dim() == 2
        if single:
            ctx_C, block_emb, anchors = ctx_C[None], block_emb[None], anchors[None]
        b, S_, H = ctx_C.shape
        S = S_ if S is None else S
        B = self.block_size
        N = anchors.shape[1]
        assert S == S_ and H == self.hidden_size, (ctx_C.shape, S)
        assert anchors.shape == (b, N) and block_emb.shape == (b, N * B, H), (anchors.shape, block_emb.shape)
        anchors = anchors.to(device=ctx_C.device, dtype=torch.int64)
        pos_x = (anchors[:, :, None] + torch.arange(B, device=ctx_C.device)).reshape(b, N * B)
        pos_c = torch.arange(S, device=ctx_C.device)[None]
        h = self._run(block_emb, ctx_C, pos_x, pos_c, self.train_mask(anchors, S))
        assert h.shape == (b, N * B, H)
        return h[0] if single else h

    def forward_infer(self, ctx_C_all, block_emb, s):
        """Inference form (A.3). ctx_C_all [s, H] (or [b, s, H]): context of positions 0..s-1; block_emb [B, H]
        (or [b, B, H]) at positions s..s+B-1; no mask (block bidirectional, all context visible). Returns the
        final-normed hidden [B, H]. Equals the cached incremental form: a context position's K/V depends
        only on its own feature and position."""
        single = ctx_C_all.dim() == 2
        if single:
            ctx_C_all, block_emb = ctx_C_all[None], block_emb[None]
        b, s_, H = ctx_C_all.shape
        B = self.block_size
        assert s_ == s and H == self.hidden_size and block_emb.shape == (b, B, H), (ctx_C_all.shape, block_emb.shape, s)
        dev = ctx_C_all.device
        h = self._run(block_emb, ctx_C_all, torch.arange(s, s + B, device=dev)[None], torch.arange(s, device=dev)[None], None)
        assert h.shape == (b, B, H)
        return h[0] if single else h


def save_draft(model, out_dir, cfg, dtype):
    """Writes out_dir/config.json and out_dir/model.safetensors (the published names, `dtype`)."""
    from safetensors.torch import save_file
    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v.detach().to(device="cpu", dtype=dtype).contiguous().clone() for k, v in model.state_dict().items()}
    want = parameter_names(cfg)
    assert {k: tuple(v.shape) for k, v in sd.items()} == want
    save_file(sd, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def load_draft(path, device="cpu", dtype=None):
    from safetensors.torch import load_file
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    model = DFlashDraft(cfg)
    sd = load_file(os.path.join(path, "model.safetensors"))
    model.load_state_dict(sd, strict=True)
    if dtype is not None:
        model = model.to(dtype)
    return model.to(device).eval(), cfg


# ---------------------------------------------------------------------------------------------------------
# Self-test: an independent, loop-by-loop implementation of A.3 (explicit RoPE pairs, per-head softmax) and
# the equivalence of the training form (masked, many blocks, batched with padding) with the inference form.

def _naive_infer(model, C, emb, s):
    """A.3 written out per head in float64, sharing only the weights with DFlashDraft."""
    cfg = model.cfg
    H, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], model.head_dim
    eps, theta, B = cfg["rms_norm_eps"], model.rope_theta, model.block_size
    d = torch.float64

    def norm(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w.to(d)

    def rope(x, p):                                   # x [hd], position p
        out = x.clone()
        for i in range(hd // 2):
            a = p * theta ** (-2.0 * i / hd)
            x1, x2 = x[i], x[i + hd // 2]
            out[i] = x1 * math.cos(a) - x2 * math.sin(a)
            out[i + hd // 2] = x2 * math.cos(a) + x1 * math.sin(a)
        return out

    C, x = C.to(d), emb.to(d)
    for layer in model.layers:
        at, W = layer.self_attn, lambda lin: lin.weight.to(d)
        xn = norm(x, layer.input_layernorm.weight)
        keys, vals = [], []                           # per position: [nkv, hd]
        for src, pos0 in ((C, 0), (xn, s)):
            k = (src @ W(at.k_proj).T).view(-1, nkv, hd)
            v = (src @ W(at.v_proj).T).view(-1, nkv, hd)
            for t in range(src.shape[0]):
                keys.append(torch.stack([rope(norm(k[t, h], at.k_norm.weight), pos0 + t) for h in range(nkv)]))
                vals.append(v[t])
        K, V = torch.stack(keys), torch.stack(vals)   # [s+B, nkv, hd]
        q = (xn @ W(at.q_proj).T).view(B, nh, hd)
        o = torch.zeros(B, nh, hd, dtype=d)
        for i in range(B):
            for h in range(nh):
                g = h // (nh // nkv)
                qi = rope(norm(q[i, h], at.q_norm.weight), s + i)
                p = torch.softmax(K[:, g] @ qi / math.sqrt(hd), 0)
                o[i, h] = p @ V[:, g]
        x = x + o.reshape(B, nh * hd) @ W(at.o_proj).T
        xn2 = norm(x, layer.post_attention_layernorm.weight)
        mlp = layer.mlp
        x = x + (F.silu(xn2 @ W(mlp.gate_proj).T) * (xn2 @ W(mlp.up_proj).T)) @ W(mlp.down_proj).T
    return norm(x, model.norm.weight)


def self_test(verbose=True):
    g = torch.Generator().manual_seed(1234)
    cfg = draft_config(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, num_target_layers=6, target_layer_ids=[1, 3],
                       mask_token_id=0, vocab_size=50, block_size=4, rope_theta=10000.0, dtype="float32")
    model = DFlashDraft(cfg).to(torch.float64).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g) if "norm" in name
                    else torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
        H, B, S = 32, 4, 11
        feats = torch.randn(S, 2 * H, generator=g, dtype=torch.float64)
        C = model.context(feats)
        assert C.shape == (S, H)
        anchors = torch.tensor([0, 3, 4, 9])                       # anchor 0: an empty context
        emb = torch.randn(len(anchors) * B, H, generator=g, dtype=torch.float64)
        ht = model.forward_train(C, emb, anchors, S)
        assert ht.shape == (len(anchors) * B, H)
        worst = 0.0
        for j, a in enumerate(anchors.tolist()):
            hi = model.forward_infer(C[:a], emb[j * B:(j + 1) * B], a)
            worst = max(worst, (hi - ht[j * B:(j + 1) * B]).abs().max().item())
            if a in (3, 9):
                hn = _naive_infer(model, C[:a], emb[j * B:(j + 1) * B], a)
                err = (hn - hi).abs().max().item()
                assert err < 1e-5, f"forward_infer differs from the naive A.3 by {err}"
        assert worst < 1e-9, f"forward_train differs from forward_infer by {worst}"
        # Batched with padding: sequence 2 is shorter (S2 = 7), its context padded with garbage.
        C2 = model.context(torch.randn(7, 2 * H, generator=g, dtype=torch.float64))
        an2 = torch.tensor([2, 5, 0, 0])
        emb2 = torch.randn(len(an2) * B, H, generator=g, dtype=torch.float64)
        Cb = torch.stack([C, torch.cat([C2, 100 * torch.randn(S - 7, H, generator=g, dtype=torch.float64)])])
        hb = model.forward_train(Cb, torch.stack([emb, emb2]), torch.stack([anchors, an2]), S)
        assert (hb[0] - ht).abs().max().item() < 1e-9
        h2 = model.forward_train(C2, emb2, an2, 7)
        assert (hb[1] - h2).abs().max().item() < 1e-9
    if verbose:
        print(f"dflash_draft self-test passed (train vs infer {worst:.1e})", flush=True)


if __name__ == "__main__":
    self_test()

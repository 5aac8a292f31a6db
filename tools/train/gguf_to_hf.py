#!/usr/bin/env python3
"""Writes an HF directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json) for a
Qwen3.5-layout GGUF written by `dflash convert`, such as the bundled models/default-coder-19m-q8_0.gguf.

Why: tools/train/train_dflash_draft.py trains a draft against an HF target in transformers. Training it
against the GGUF that dflash serves (Q8_0 weights, dequantized exactly to f32 here) makes the draft learn the
target it will be paired with, and needs no copy of the bf16 checkpoint the GGUF was made from.

    python3 tools/train/gguf_to_hf.py models/default-coder-19m-q8_0.gguf -o /tmp/target-hf

Reads GGUF v3 with f32, f16, bf16 and q8_0 tensors (numpy only). Undoes what dflash's HF -> GGUF conversion
did (src/formats/tensor_names.cpp, src/model/hf_to_gguf.cpp): GGUF names to HF names, zero-centred norms
(value - 1), ssm_a = -exp(A_log) back to A_log, the DeltaNet V-heads from GGUF's tiled order back to HF's
grouped one, and conv1d's unit dimension. Weights are written in f32. The check that this is right:
`dflash logits` of the written directory equals that of the GGUF (both load through dflash's HF and GGUF
paths), and on the GPU machine transformers' logits of the directory match dflash's (--check-transformers).
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

GGML_F32, GGML_F16, GGML_Q8_0, GGML_BF16 = 0, 1, 8, 30
QK8_0 = 32


# ---------------------------------------------------------------------------------------------------------
# GGUF

class Reader:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return v[0]

    def string(self):
        n = self.take("Q")
        if n > len(self.buf) - self.pos:
            raise ValueError(f"string of {n} bytes runs past the end of the file")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return s

    SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(self, t):
        if t in self.SCALAR:
            return self.take(self.SCALAR[t])
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("I"), self.take("Q")
            return [self.value(et) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {t}")


def read_gguf(path):
    """(metadata dict, {name: np.ndarray f32 in HF-style shape [rows, cols] or [n]})."""
    buf = memoryview(open(path, "rb").read())
    r = Reader(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    r.pos = 4
    version = r.take("I")
    if version != 3:
        raise ValueError(f"{path}: GGUF version {version}; this reads version 3")
    n_tensors, n_kv = r.take("Q"), r.take("Q")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.take("I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("Q") for _ in range(r.take("I"))]
        infos.append((name, dims, r.take("I"), r.take("Q")))
    align = int(meta.get("general.alignment", 32))
    data = -(-r.pos // align) * align
    tensors = {}
    for name, dims, t, off in infos:
        n = int(np.prod(dims))
        start = data + off
        if t == GGML_F32:
            x = np.frombuffer(buf, np.float32, n, start)
        elif t == GGML_F16:
            x = np.frombuffer(buf, np.float16, n, start).astype(np.float32)
        elif t == GGML_BF16:
            x = (np.frombuffer(buf, np.uint16, n, start).astype(np.uint32) << 16).view(np.float32)
        elif t == GGML_Q8_0:
            if n % QK8_0:
                raise ValueError(f"{name}: {n} elements are not whole q8_0 blocks")
            blocks = np.frombuffer(buf, np.uint8, n // QK8_0 * 34, start).reshape(-1, 34)
            d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
            q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
            x = (d * q).reshape(-1)
        else:
            raise ValueError(f"{name}: ggml type {t} is not read here (f32, f16, bf16, q8_0)")
        tensors[name] = x.reshape(list(reversed(dims))).astype(np.float32)   # ggml's ne[0] is the fastest
    return meta, tensors


# ---------------------------------------------------------------------------------------------------------
# Qwen3.5: GGUF -> HF

def v_head_perm(n_k, n_v, size):
    """hf_index[t]: the HF (grouped) position whose value sits at GGUF (tiled) position t."""
    r = n_v // n_k
    perm = np.empty(n_v * size, dtype=np.int64)
    for v in range(r):
        for k in range(n_k):
            t = (v * n_k + k) * size
            perm[t:t + size] = np.arange(size) + (k * r + v) * size
    return perm


def untile(x, perm, axis):
    """GGUF tiled -> HF grouped along `axis`: out[perm[t]] = x[t]."""
    out = np.empty_like(x)
    idx = [slice(None)] * x.ndim
    idx[axis] = perm
    out[tuple(idx)] = x
    return out


def convert(meta, t):
    arch = meta.get("general.architecture")
    if arch != "qwen35":
        raise ValueError(f"architecture {arch!r}: this writes Qwen3.5 (qwen35) models only")
    g = lambda k: meta[f"qwen35.{k}"]  # noqa: E731
    L, H = int(g("block_count")), int(g("embedding_length"))
    recurrent = list(g("attention.recurrent_layers"))
    n_k, d_k = int(g("ssm.group_count")), int(g("ssm.state_size"))
    n_v = int(g("ssm.time_step_rank"))
    d_v = int(g("ssm.inner_size")) // n_v
    if n_v % n_k:
        raise ValueError(f"{n_v} V-heads are not a multiple of {n_k} K-heads")
    head_dim = int(g("attention.key_length"))
    tied = "output.weight" not in t
    out = {}
    used = set()

    def take(name):
        used.add(name)
        return t[name]

    out["model.embed_tokens.weight"] = take("token_embd.weight")
    out["model.norm.weight"] = take("output_norm.weight") - 1.0
    if not tied:
        out["lm_head.weight"] = take("output.weight")
    vrows = v_head_perm(n_k, n_v, 1)
    for i in range(L):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        out[h + "input_layernorm.weight"] = take(b + "attn_norm.weight") - 1.0
        out[h + "post_attention_layernorm.weight"] = take(b + "post_attention_norm.weight") - 1.0
        for gg, hh in (("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
            out[h + f"mlp.{hh}.weight"] = take(b + gg + ".weight")
        if not recurrent[i]:
            for gg, hh in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")):
                out[h + f"self_attn.{hh}.weight"] = take(b + gg + ".weight")
            out[h + "self_attn.q_norm.weight"] = take(b + "attn_q_norm.weight") - 1.0
            out[h + "self_attn.k_norm.weight"] = take(b + "attn_k_norm.weight") - 1.0
            continue
        a = h + "linear_attn."
        qk = 2 * n_k * d_k
        v_part = np.concatenate([np.arange(qk), qk + v_head_perm(n_k, n_v, d_v)])
        out[a + "in_proj_qkv.weight"] = untile(take(b + "attn_qkv.weight"), v_part, 0)
        out[a + "in_proj_z.weight"] = untile(take(b + "attn_gate.weight"), v_head_perm(n_k, n_v, d_v), 0)
        out[a + "in_proj_b.weight"] = untile(take(b + "ssm_beta.weight"), vrows, 0)
        out[a + "in_proj_a.weight"] = untile(take(b + "ssm_alpha.weight"), vrows, 0)
        conv = untile(take(b + "ssm_conv1d.weight"), v_part, 0)          # [conv_dim, K]
        out[a + "conv1d.weight"] = conv[:, None, :]                       # HF: [conv_dim, 1, K]
        out[a + "dt_bias"] = untile(take(b + "ssm_dt.bias"), vrows, 0)
        ssm_a = take(b + "ssm_a")
        if (ssm_a >= 0).any():
            raise ValueError(f"{b}ssm_a has non-negative values; expected -exp(A_log)")
        out[a + "A_log"] = untile(np.log(-ssm_a), vrows, 0)
        out[a + "norm.weight"] = take(b + "ssm_norm.weight")
        out[a + "out_proj.weight"] = untile(take(b + "ssm_out.weight"), v_head_perm(n_k, n_v, d_v), 1)
    left = sorted(set(t) - used)
    if left:
        raise ValueError(f"{len(left)} GGUF tensor(s) this does not map, e.g. {left[0]!r}")

    tok_ids = meta["tokenizer.ggml.tokens"]
    eos = int(meta["tokenizer.ggml.eos_token_id"])
    pad = meta.get("tokenizer.ggml.padding_token_id")
    sections = list(g("rope.dimension_sections"))[:3]
    rope_dims = int(g("rope.dimension_count"))
    config = {
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None, "eos_token_id": eos,
        "pad_token_id": None if pad is None else int(pad), "dtype": "float32",
        "head_dim": head_dim, "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02,
        "intermediate_size": int(g("feed_forward_length")),
        "layer_types": ["linear_attention" if x else "full_attention" for x in recurrent],
        "linear_conv_kernel_dim": int(g("ssm.conv_kernel")), "linear_key_head_dim": d_k,
        "linear_num_key_heads": n_k, "linear_num_value_heads": n_v, "linear_value_head_dim": d_v,
        "max_position_embeddings": int(g("context_length")),
        "num_attention_heads": int(g("attention.head_count")), "num_hidden_layers": L,
        "num_key_value_heads": int(g("attention.head_count_kv")),
        "partial_rotary_factor": rope_dims / head_dim, "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon")),
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": sections,
                            "partial_rotary_factor": rope_dims / head_dim,
                            "rope_theta": float(g("rope.freq_base")), "rope_type": "default"},
        "tie_word_embeddings": tied, "use_cache": True, "vocab_size": len(tok_ids),
    }
    return out, config


# ---------------------------------------------------------------------------------------------------------
# Tokenizer

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4


def tokenizer_files(meta):
    if meta.get("tokenizer.ggml.model") != "gpt2" or meta.get("tokenizer.ggml.pre") != "qwen2":
        raise ValueError("tokenizer: expected a byte-level BPE with the qwen2 pre-tokenizer")
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": ty == TOKEN_CONTROL}
             for i, (s, ty) in enumerate(zip(tokens, types)) if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {s: i for i, s in enumerate(tokens)}, "merges": list(meta["tokenizer.ggml.merges"])},
    }
    eos = tokens[int(meta["tokenizer.ggml.eos_token_id"])]
    pad = meta.get("tokenizer.ggml.padding_token_id")
    config = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": eos,
              "pad_token": None if pad is None else tokens[int(pad)],
              "model_max_length": int(meta["qwen35.context_length"]), "tokenizer_class": "Qwen2Tokenizer",
              "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added}}
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta["tokenizer.chat_template"]
    return tok, config


# ---------------------------------------------------------------------------------------------------------

def write_safetensors(path, tensors):
    header, off, blobs = {}, 0, []
    for name in sorted(tensors):
        x = np.ascontiguousarray(tensors[name], dtype=np.float32)
        header[name] = {"dtype": "F32", "shape": list(x.shape), "data_offsets": [off, off + x.nbytes]}
        off += x.nbytes
        blobs.append(x)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for x in blobs:
            f.write(x.tobytes())


def check_transformers(out_dir, gguf, dflash):
    """transformers' logits of the written directory against `dflash logits` of the GGUF (CPU)."""
    import subprocess
    import tempfile
    import torch
    from transformers import AutoTokenizer, Qwen3_5ForCausalLM
    tk = AutoTokenizer.from_pretrained(out_dir)
    text = tk.apply_chat_template([{"role": "user", "content": "Write a Python function that reverses a list."}],
                                  tokenize=False, add_generation_prompt=True) + "```python\ndef reverse(xs):\n"
    ids = tk(text, add_special_tokens=False)["input_ids"]
    with tempfile.TemporaryDirectory() as d:
        raw = os.path.join(d, "logits.f32")
        subprocess.run([dflash, "logits", "-m", gguf, "--tokens", ",".join(map(str, ids)), "-o", raw, "--all",
                        "--device", "cpu"], check=True, capture_output=True)
        ref = np.fromfile(raw, np.float32).reshape(len(ids), -1)
        want = subprocess.run([dflash, "tokenize", "-m", gguf, "--special", "-t", text], check=True,
                              capture_output=True, text=True).stdout
    model = Qwen3_5ForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        got = model(input_ids=torch.tensor([ids])).logits[0].numpy()
    diff = float(np.abs(got - ref).max())
    agree = float((got.argmax(-1) == ref.argmax(-1)).mean())
    same_ids = json.loads(want) == ids
    print(f"check: {len(ids)} tokens; tokenizer ids equal dflash's: {same_ids}; max |logit diff| {diff:.3g} "
          f"(logits up to {float(np.abs(ref).max()):.3g}); argmax agrees on {agree:.0%} of positions")
    if not same_ids or diff > 1e-2 * max(1.0, float(np.abs(ref).max())) or agree < 1.0:
        raise SystemExit("check failed: transformers does not reproduce dflash on the converted directory")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("-o", "--out", required=True, help="HF directory to write")
    ap.add_argument("--check-transformers", metavar="DFLASH",
                    help="then compare transformers' logits with this dflash binary's (needs torch, transformers)")
    args = ap.parse_args()
    try:
        meta, tensors = read_gguf(args.gguf)
        weights, config = convert(meta, tensors)
        tok, tok_config = tokenizer_files(meta)
    except (OSError, ValueError, KeyError, struct.error) as e:   # a damaged or unsupported file: say so
        what = f"missing key {e}" if isinstance(e, KeyError) else str(e)
        print(f"gguf_to_hf: {args.gguf}: {what}", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    write_safetensors(os.path.join(args.out, "model.safetensors"), weights)
    for name, obj in (("config.json", config), ("tokenizer.json", tok), ("tokenizer_config.json", tok_config)):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)
    n = sum(x.size for x in weights.values())
    print(f"wrote {args.out}: {len(weights)} tensors, {n / 1e6:.2f} M parameters (f32), "
          f"{len(meta['tokenizer.ggml.tokens'])} tokens")
    if args.check_transformers:
        check_transformers(args.out, args.gguf, args.check_transformers)
    return 0


if __name__ == "__main__":
    sys.exit(main())

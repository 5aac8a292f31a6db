#!/usr/bin/env python3
"""Trains dflash's bundled default model: a small Qwen3.5-layout model (Gated DeltaNet + gated attention,
3:1) on Python source (the standard library whole, then installed packages sampled up to a size), with its own byte-level BPE vocabulary and chat-formatted pairs made
from the same source (a function's docstring as the user turn, its code as the reply).

Runs on the GPU machine (torch, transformers 5.17, tokenizers; no internet, no weights):

    python3 tools/train/train_default_model.py --out /tmp/default --minutes 6

Writes OUT/hf/ (config.json, model.safetensors in bf16, tokenizer.json, tokenizer_config.json with the
Qwen3.5 chat template), OUT/loss.csv (step, seconds, tokens seen, train loss, eval loss) and
OUT/samples.json (greedy replies to a few chat prompts, for the record). `dflash convert OUT/hf -o
model.gguf --type q8_0` makes the GGUF that models/ holds. Everything is seeded; the data, the
tokenizer and the model's shape depend only on the Python found at run time (its stdlib) and the flags.
"""
import argparse
import ast
import csv
import json
import math
import os
import random
import sys
import sysconfig
import textwrap
import time

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Control tokens (never shown) and the chat-format words the template and the output parser use (shown).
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_WORDS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
SEED = 20261122

USER_FORMS = [
    "Write a Python function `{sig}` that {summary_lc}",
    "{doc}\n\nImplement this as `{name}` in Python.",
    "Implement `{sig}` in Python:\n\n{doc}",
    "How would you write `{name}`? It should: {summary_lc}",
    "Can you show me a Python implementation of {name}? {summary}",
]


def python_files(root):
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "dist-packages", "__pycache__"))
        for f in sorted(files):
            if f.endswith(".py"):
                yield os.path.join(d, f)


def read_source(path, limit=400_000):
    try:
        if os.path.getsize(path) > limit:
            return None
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def signature(fn):
    return f"{fn.name}({ast.unparse(fn.args)})"


def source_nodes(src):
    """Every AST node of a source file (ast.walk order), or none when it does not parse."""
    try:
        return list(ast.walk(ast.parse(src)))
    except (SyntaxError, ValueError):
        return []


def chat_pairs(path, src, rng):  # noqa: ARG001 (path: for the seed)
    """(user, think, reply) triples from the documented top-level and method functions of one file."""
    out = []
    for node in source_nodes(src):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 24 or node.name.startswith("test"):
            continue
        code = ast.get_source_segment(src, node)
        if code is None or len(code) > 3000 or code.count("\n") < 3:
            continue
        code = textwrap.dedent(" " * node.col_offset + code)
        doc = doc.strip()
        summary = doc.split("\n\n")[0].replace("\n", " ").strip()
        if len(summary) > 300:
            continue
        summary_lc = summary[0].lower() + summary[1:] if summary[:1].isupper() and summary[1:2].islower() else summary
        sig = signature(node)
        form = rng.choice(USER_FORMS)
        user = form.format(sig=sig, name=node.name, doc=doc if len(doc) < 1200 else summary, summary=summary,
                           summary_lc=summary_lc)
        think = ""
        if rng.random() < 0.5:
            think = f"The user wants `{node.name}`: {summary_lc} I will write it in Python."
        reply = f"```python\n{code.rstrip()}\n```"
        out.append((user, think, reply))
    return out


def render_chat(user, think, reply):
    """What Qwen3.5's chat template renders for a user turn and an assistant reply (thinking on)."""
    return (f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n<think>\n{think}\n</think>\n\n"
            f"{reply}<|im_end|>\n")


def file_pairs(path):
    src = read_source(path)
    if not src or len(src) < 200:
        return None, []
    return src, [render_chat(*t) for t in chat_pairs(path, src, random.Random(f"{SEED}:{path}"))]


def build_corpus(roots, max_mb):
    """Source files of `roots` (the first root, the stdlib, whole; later roots sampled, seeded, until the
    raw text reaches max_mb) and the chat pairs made from them, parsed on every core."""
    import multiprocessing
    paths = list(python_files(roots[0]))
    extra = [p for r in roots[1:] for p in python_files(r)]
    random.Random(SEED).shuffle(extra)
    with multiprocessing.Pool() as pool:
        raw, chats, total = [], [], 0
        for i, (src, pairs) in enumerate(pool.imap(file_pairs, paths + extra, chunksize=16)):
            if src is None:
                continue
            if i >= len(paths) and total + len(src) > max_mb * 1e6:
                break
            total += len(src)
            raw.append(src)
            chats.extend(pairs)
        pool.terminate()
    return raw, chats


def train_tokenizer(texts, vocab_size, out_dir, template):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(CHAT_WORDS), special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(w, special=False, normalized=False) for w in CHAT_WORDS])
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                       "single_word": False, "special": t in SPECIALS} for t in SPECIALS + CHAT_WORDS}
    config = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "model_max_length": 32768, "tokenizer_class": "Qwen2Tokenizer",
              "added_tokens_decoder": added, "chat_template": template}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    return tok


def model_config(vocab, tok, args):
    from transformers import Qwen3_5TextConfig
    # The layout of Qwen3.5's small models, scaled down: 3 Gated DeltaNet layers to 1 gated-attention layer,
    # attention heads of 256 with a quarter rotated (64 dims, interleaved M-RoPE sections as Qwen3.5),
    # DeltaNet heads of 128 with twice as many V heads as K heads, a tied head.
    layers = args.layers
    return Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.ffn, num_hidden_layers=layers,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        num_attention_heads=2, num_key_value_heads=1, head_dim=256, rms_norm_eps=1e-6,
        max_position_embeddings=32768, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_num_key_heads=2, linear_num_value_heads=4,
        bos_token_id=None, eos_token_id=tok.token_to_id("<|im_end|>"), pad_token_id=tok.token_to_id("<|endoftext|>"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=6.0, help="training time budget (the schedule follows it)")
    ap.add_argument("--stdlib", default=sysconfig.get_paths()["stdlib"])
    ap.add_argument("--extra", nargs="*", default=[sysconfig.get_paths()["purelib"]],
                    help="more source trees (sampled): the installed packages by default")
    ap.add_argument("--max-mb", type=float, default=48, help="raw source text at most (MB)")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--template", default=os.path.join(os.path.dirname(__file__), "../../tests/fixtures/templates/qwen3.5.jinja"))
    ap.add_argument("--max-files", type=int, default=0, help="use only this many source files (smoke runs)")
    args = ap.parse_args()

    import torch
    from transformers import Qwen3_5ForCausalLM

    t_start = time.time()
    rng = random.Random(SEED)
    torch.manual_seed(SEED)
    raw, chats = build_corpus([args.stdlib] + args.extra, args.max_mb)
    if args.max_files:
        raw, chats = raw[:args.max_files], chats[:args.max_files * 4]
    print(f"corpus: {len(raw)} files ({sum(map(len, raw)) / 1e6:.1f} MB), {len(chats)} chat pairs "
          f"({sum(map(len, chats)) / 1e6:.1f} MB) from {args.stdlib} {args.extra}", flush=True)

    hf_dir = os.path.join(args.out, "hf")
    template = open(args.template, encoding="utf-8").read()
    tok = train_tokenizer(raw + chats, args.vocab, hf_dir, template)
    vocab = tok.get_vocab_size()
    eot = tok.token_to_id("<|endoftext|>")
    print(f"tokenizer: {vocab} tokens ({time.time() - t_start:.0f} s)", flush=True)

    # One token stream: whole files (each followed by <|endoftext|>) and chat pairs (twice: they are what
    # users see), shuffled; the last 0.5% of the documents are held out for the eval loss.
    docs = [(s, True) for s in raw] + [(c, False) for c in chats] * 2
    rng.shuffle(docs)
    enc = tok.encode_batch([d for d, _ in docs], add_special_tokens=False)
    ids = []
    for e, (_, is_file) in zip(enc, docs):
        ids.extend(e.ids)
        if is_file:
            ids.append(eot)
    split = int(len(ids) * 0.995)
    data = torch.tensor(ids[:split], dtype=torch.int64, device="cuda")
    held = torch.tensor(ids[split:], dtype=torch.int64, device="cuda")
    print(f"tokens: {len(ids) / 1e6:.2f} M ({sum(map(len, (d for d, _ in docs))) / len(ids):.2f} bytes/token), "
          f"eval {held.numel()}", flush=True)

    cfg = model_config(vocab, tok, args)
    model = Qwen3_5ForCausalLM(cfg).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters, layers {cfg.layer_types}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    seq, batch = args.seq, args.batch
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    offsets = torch.arange(seq + 1, device="cuda")

    def windows(src, n, g=None):
        starts = torch.randint(0, src.numel() - seq - 1, (n, 1), device="cuda", generator=g)
        return src[starts + offsets]

    eval_x = windows(held, 32, torch.Generator(device="cuda").manual_seed(SEED + 1))

    def eval_loss():
        model.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=eval_x, labels=eval_x, use_cache=False).loss
        model.train()
        return float(loss)

    budget = args.minutes * 60
    warmup = 100
    rows = []
    step, seen, t0 = 0, 0, time.time()
    model.train()
    while True:
        elapsed = time.time() - t0
        frac = elapsed / budget
        if frac >= 1.0:
            break
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x = windows(data, batch, gen)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen += batch * seq
        if step % 50 == 0 or step == 1:
            ev = eval_loss() if step % 250 == 0 or step == 1 else ""
            rows.append([step, round(time.time() - t0, 1), seen, round(loss.item(), 4), ev if ev == "" else round(ev, 4)])
            print(f"step {step} t {rows[-1][1]} s tokens {seen / 1e6:.1f} M loss {float(loss):.3f} lr {lr:.2e}"
                  + (f" eval {ev:.3f}" if ev != "" else ""), flush=True)
    final_eval = eval_loss()
    rows.append([step, round(time.time() - t0, 1), seen, round(float(loss), 4), round(final_eval, 4)])
    print(f"done: {step} steps, {seen / 1e6:.1f} M tokens, eval loss {final_eval:.3f} "
          f"({seen / (time.time() - t0):.0f} tokens/s)", flush=True)
    with open(os.path.join(args.out, "loss.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "seconds", "tokens", "train_loss", "eval_loss"])
        w.writerows(rows)

    model = model.to(torch.bfloat16).eval()
    model.save_pretrained(hf_dir, safe_serialization=True)
    prompts = ["Write a Python function `is_prime(n)` that returns True when n is a prime number.",
               "How do I read a JSON file in Python?", "Hello! Who are you?"]
    samples = []
    for p in prompts:
        text = f"<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n<think>\n"
        x = torch.tensor([tok.encode(text, add_special_tokens=False).ids], device="cuda")
        with torch.no_grad():
            y = model.generate(x, max_new_tokens=160, do_sample=False, eos_token_id=cfg.eos_token_id,
                               pad_token_id=cfg.pad_token_id)
        ids_out = y[0, x.shape[1]:].tolist()
        samples.append({"prompt": p, "ids": ids_out, "text": tok.decode(ids_out, skip_special_tokens=False)})
        print(f"--- {p}\n{samples[-1]['text']}", flush=True)
    meta = {"parameters": n_params, "steps": step, "tokens_seen": seen, "eval_loss": final_eval,
            "train_minutes": args.minutes, "corpus_files": len(raw), "chat_pairs": len(chats),
            "corpus_tokens": len(ids), "roots": [args.stdlib] + args.extra, "python": sys.version.split()[0],
            "torch": torch.__version__, "args": vars(args), "samples": samples}
    import transformers
    meta["transformers"] = transformers.__version__
    with open(os.path.join(args.out, "samples.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False, indent=1)
    print(f"total {time.time() - t_start:.0f} s", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Reference renders of the chat-template fixtures, for dflash's Jinja engine tests.

Reads tests/fixtures/templates/*.jinja (the templates named in TEMPLATES below) and
tests/fixtures/templates/conversations.json, renders every template x conversation and writes
tests/fixtures/templates/expected.json: {template name: {conversation id: {"text": ...} or {"error": ...}}}.

The oracle is transformers' own rendering function (transformers.utils.chat_template_utils
.render_jinja_template), so its environment, tojson and globals are the real ones. When transformers
is not importable the script falls back to jinja2 with transformers' environment replicated
(ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks, loopcontrols), transformers' tojson,
raise_exception and strftime_now) and says so in the output's "generator" field.

The request is normalized the way dflash's ChatTemplate normalizes it before rendering: an assistant
tool call whose function.arguments is a string holding a JSON object is parsed into that object
(OpenAI clients send arguments as a JSON string; templates such as Qwen's iterate them as a mapping).

strftime_now() is frozen at NOW so the renders are reproducible.

Usage:  python3 tools/reference/make_template_fixtures.py [--fallback] [--out PATH]
"""

import argparse
import copy
import datetime as _dt
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "templates")

# 2025-01-15 12:00:00 UTC: noon, so the local date is the same in every time zone within +-11 h.
NOW = 1736942400

# name -> template file and the special tokens transformers would pass (None: not passed at all).
TEMPLATES = {
    "qwen3": {"file": "qwen3.jinja", "bos_token": None, "eos_token": "<|im_end|>"},
    "qwen3.5": {"file": "qwen3.5.jinja", "bos_token": None, "eos_token": "<|im_end|>"},
    "qwen3.6": {"file": "qwen3.6.jinja", "bos_token": None, "eos_token": "<|im_end|>"},
    "llama-3.1": {"file": "llama-3.1.jinja", "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama-3.2": {"file": "llama-3.2.jinja", "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "gemma-2": {"file": "gemma-2.jinja", "bos_token": "<bos>", "eos_token": "<eos>"},
    "gemma-4": {"file": "gemma-4.jinja", "bos_token": "<bos>", "eos_token": "<eos>"},
}


def normalize_messages(messages):
    """Parses string tool-call arguments that hold a JSON object (what dflash's ChatTemplate does)."""
    messages = copy.deepcopy(messages)
    for m in messages:
        for call in m.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                try:
                    parsed = json.loads(fn["arguments"])
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    fn["arguments"] = parsed
    return messages


class FrozenDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return _dt.datetime.fromtimestamp(NOW, tz)


def transformers_renderer():
    from transformers.utils import chat_template_utils as ctu  # noqa: raises ImportError when absent
    import transformers

    # transformers' strftime_now calls datetime.now() through the module's global `datetime`.
    if hasattr(ctu, "datetime"):
        ctu.datetime = FrozenDatetime
    if hasattr(ctu, "_compile_jinja_template") and hasattr(ctu._compile_jinja_template, "cache_clear"):
        ctu._compile_jinja_template.cache_clear()

    def render(template, messages, tools, add_generation_prompt, kwargs):
        rendered, _ = ctu.render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
        return rendered[0]

    probe = render("{{ strftime_now('%Y-%m-%d') }}", [{"role": "user", "content": "x"}], None, False, {})
    expected = _dt.datetime.fromtimestamp(NOW).strftime("%Y-%m-%d")
    if probe != expected:
        raise RuntimeError(f"could not freeze strftime_now (got {probe!r}, want {expected!r})")
    import jinja2

    return render, f"transformers {transformers.__version__} render_jinja_template (jinja2 {jinja2.__version__})"


def jinja2_renderer():
    """transformers' chat-template environment, replicated on plain jinja2."""
    import jinja2
    import jinja2.ext
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):  # transformers' {% generation %} tag, without the tracking
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return FrozenDatetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now

    def render(template, messages, tools, add_generation_prompt, kwargs):
        return env.from_string(template).render(
            messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **kwargs
        )

    return render, f"jinja2 {jinja2.__version__} with transformers' chat-template environment replicated"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fallback", action="store_true", help="use plain jinja2 even if transformers is importable")
    ap.add_argument("--out", default=os.path.join(FIXTURES, "expected.json"))
    args = ap.parse_args()

    render = generator = None
    if not args.fallback:
        try:
            render, generator = transformers_renderer()
        except ImportError:
            print("transformers is not importable; using the jinja2 fallback", file=sys.stderr)
    if render is None:
        render, generator = jinja2_renderer()

    with open(os.path.join(FIXTURES, "conversations.json"), encoding="utf-8") as f:
        conversations = json.load(f)

    renders = {}
    for name, spec in TEMPLATES.items():
        with open(os.path.join(FIXTURES, spec["file"]), encoding="utf-8", newline="") as f:
            template = f.read()
        renders[name] = {}
        for conv in conversations:
            kwargs = {}
            for token in ("bos_token", "eos_token"):
                if spec[token] is not None:
                    kwargs[token] = spec[token]
            kwargs.update(conv.get("chat_template_kwargs") or {})
            messages = normalize_messages(conv["messages"])
            try:
                text = render(template, messages, conv.get("tools"), bool(conv.get("add_generation_prompt")), kwargs)
                renders[name][conv["id"]] = {"text": text}
            except Exception as e:  # the template's own raise_exception, or a jinja error
                renders[name][conv["id"]] = {"error": str(e), "error_type": type(e).__name__}

    out = {
        "generator": generator,
        "now": NOW,
        "templates": TEMPLATES,
        "renders": renders,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_ok = sum(1 for t in renders.values() for r in t.values() if "text" in r)
    n_err = sum(1 for t in renders.values() for r in t.values() if "error" in r)
    print(f"{generator}: wrote {args.out} ({n_ok} renders, {n_err} errors)")


if __name__ == "__main__":
    main()

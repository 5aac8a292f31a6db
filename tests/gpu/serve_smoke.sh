#!/usr/bin/env bash
# `dflash serve --device cuda:0` end to end on the GPU machine, with the bundled default model (or $1):
# two slots, two concurrent greedy chat requests plus json_object ones; each greedy reply must equal
# `dflash run --device cuda:0` on the same prompt (and how far it agrees with the CPU engine is printed),
# and every json_object reply that ends by itself must parse (at least one of six must). Prints one
# line per check and "serve smoke: PASS|FAIL". Run from the repository root with a GPU bundle built by
# tests/gpu/run_gpu_tests.sh bundle:   DFLASH_GPU_BUILD=build tests/gpu/serve_smoke.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bundle_env.sh"
model=("$@")
port=18765
log="${OUT:-/tmp}/serve_smoke.log"
fail=0

"$bin" serve "${model[@]}" --device "$device" --parallel 2 --port "$port" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.2
done

ask() {  # ask PROMPT MAX_TOKENS [EXTRA_JSON] -> the reply's content
  python3 - "$port" "$1" "$2" "${3:-{\}}" <<'PY'
import json, sys, urllib.request
port, prompt, n, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False}, **extra}
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["message"]["content"], end="")
PY
}

p1='Write a Python function `is_prime(n)` that returns True when n is a prime number.'
p2='Write a Python function `add(a, b)` that returns the sum of a and b.'
ask "$p1" 96 >/tmp/r1 &
a=$!
ask "$p2" 64 >/tmp/r2 &
b=$!
wait $a $b
for i in 1 2; do
  p=p$i
  n=$([ $i = 1 ] && echo 96 || echo 64)
  "$bin" run "${model[@]}" --device "$device" --chat -p "${!p}" -n "$n" --temperature 0 2>/dev/null | head -c -1 >/tmp/g$i
  "$bin" run "${model[@]}" --chat -p "${!p}" -n "$n" --temperature 0 2>/dev/null | head -c -1 >/tmp/c$i
  if cmp -s /tmp/r$i /tmp/g$i; then echo "greedy reply $i (serve, 2 slots at once) == dflash run on $device: ok"
  else echo "greedy reply $i (serve) differs from dflash run on $device:"; diff /tmp/r$i /tmp/g$i | head -8; fail=1; fi
  python3 - "$i" <<'PY'
import sys
i = sys.argv[1]
g, c = open(f"/tmp/g{i}").read(), open(f"/tmp/c{i}").read()
k = next((j for j, (x, y) in enumerate(zip(g, c)) if x != y), min(len(g), len(c)))
print(f"  cuda vs cpu greedy (int8 activations vs f32): {k} of {max(len(g), len(c))} characters agree")
PY
done
# json_object: sampled replies (six seeds); every reply that ends by itself parses as a JSON object and
# at least one does (the bundled model often runs out of tokens inside a string first).
if python3 - "$port" <<'PY'
import json, sys, urllib.request
port, done = sys.argv[1], 0
for seed in range(6):
    body = {"messages": [{"role": "user", "content": "Return a JSON object with keys name and age for Ann, 31."}],
            "max_tokens": 160, "temperature": 1, "seed": seed, "response_format": {"type": "json_object"}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    c = json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]
    text = c["message"]["content"]
    if not text.startswith("{"):
        sys.exit(f"seed {seed}: the reply does not open with its object: {text[:80]!r}")
    if c["finish_reason"] == "stop":
        if not isinstance(json.loads(text), dict):
            sys.exit(f"seed {seed}: not a JSON object: {text[:200]!r}")
        done += 1
print(f"json_object: {done} of 6 sampled replies ended by themselves, each a JSON object")
sys.exit(0 if done else "no reply ended within 160 tokens")
PY
then echo "json_object replies: ok"; else fail=1; fi
# The prefix cache on the device: turn 2 of a chat restored from turn 1's snapshot gives the same greedy
# reply as turn 2 prefilled cold (after POST /cache/clear).
turn2() {  # turn2 warm|cold: warm sends turn 1 first (its snapshots are what turn 2 restores)
  python3 - "$port" "$1" <<'PY'
import json, sys, urllib.request
port, mode = sys.argv[1], sys.argv[2]
sys_prompt = "You write small, correct Python functions. " * 40
msgs = [{"role": "system", "content": sys_prompt},
        {"role": "user", "content": "Write a Python function `add(a, b)` that returns the sum of a and b."},
        {"role": "assistant", "content": "```python\ndef add(a, b):\n    return a + b\n```"},
        {"role": "user", "content": "Now write `mul(a, b)` that returns the product of a and b."}]
def chat(m):
    body = {"messages": m, "max_tokens": 48, "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))
if mode == "warm":
    chat(msgs[:2])
r = chat(msgs)
print(r["usage"]["prompt_tokens_details"]["cached_tokens"], json.dumps(r["choices"][0]["message"]["content"]))
PY
}
read -r hit text_hit < <(turn2 warm)
curl -s -X POST "http://127.0.0.1:$port/cache/clear" -d "{}" >/dev/null
read -r cold text_cold < <(turn2 cold)
if [ "${hit:-0}" -gt 0 ] && [ "${cold:-1}" = 0 ] && [ "$text_hit" = "$text_cold" ]; then
  echo "prefix cache on $device: turn 2 restored $hit tokens, reply == cold prefill: ok"
else
  echo "prefix cache on $device: cached $hit, replies differ or no hit: $text_hit vs $text_cold"; fail=1
fi
grep -h "request \|ready" "$log" | sed 's/^/  log: /'
[ $fail = 0 ] && echo "serve smoke: PASS" || echo "serve smoke: FAIL"
exit $fail

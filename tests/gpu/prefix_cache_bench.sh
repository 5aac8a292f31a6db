#!/usr/bin/env bash
# Time to first token of one long prompt (~27K tokens of Python source as the system message) on
# `dflash serve --device cuda:0` with the bundled default model: cold, restored from memory, and restored
# from disk after a restart; then the snapshot file's size and the disk's sequential read speed (dd).
# Run on the GPU machine from the repository root with a GPU bundle (tests/gpu/run_gpu_tests.sh bundle):
#   DFLASH_GPU_BUILD=build tests/gpu/prefix_cache_bench.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bundle_env.sh"
chars="${DFLASH_BENCH_CHARS:-100000}"
port=18767
dir=$(mktemp -d /tmp/kvbench.XXXXXX)
log="${OUT:-/tmp}/prefix_cache_bench.log"

start() {
  "$bin" serve --device "$device" --port "$port" --kv-cache-dir "$dir/kv" --kv-cache-min-tokens 512 >>"$log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && return; sleep 0.1; done
  echo "the server did not start; see $log"; exit 1
}
ask() {  # prints: wall ms, prompt tokens, cached tokens, a hash of the greedy reply
  python3 - "$port" "$chars" "${1:-1}" <<'PY'
import glob, hashlib, json, sys, time, urllib.request
port, chars = sys.argv[1], int(sys.argv[2])
text = ""
for f in sorted(glob.glob("/usr/lib/python3*/json/*.py") + glob.glob("/usr/lib/python3*/email/*.py")):
    text += open(f, encoding="utf-8", errors="replace").read()
    if len(text) >= chars:
        break
body = {"messages": [{"role": "system", "content": text[:chars]},
                     {"role": "user", "content": "Write a Python function `add(a, b)`."}],
        "max_tokens": int(sys.argv[3]), "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}}
t0 = time.time()
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=600))
u = r["usage"]
reply = r["choices"][0]["message"]["content"]
print(f"{(time.time() - t0) * 1000:.0f} {u['prompt_tokens']} {u['prompt_tokens_details']['cached_tokens']} "
      f"{hashlib.sha1(reply.encode()).hexdigest()[:12]}")
PY
}

start
read -r cold n c0 h0 < <(ask)
read -r mem _ c1 h1 < <(ask)
kill -TERM $pid; wait $pid 2>/dev/null
start
read -r disk _ c2 h2 < <(ask)
kill -TERM $pid; wait $pid 2>/dev/null
# Exactness: 32 greedy tokens after a disk restore (a fresh restart), after a memory restore and cold
# (cache cleared).
start
read -r _ _ d32 g2 < <(ask 32)
read -r _ _ m32 g1 < <(ask 32)
curl -s -X POST "http://127.0.0.1:$port/cache/clear" -d '{"disk": true}' >/dev/null
read -r _ _ c32 g0 < <(ask 32)
kill -TERM $pid; wait $pid 2>/dev/null
echo "prompt of $n tokens, time to first token (wall, one token generated):"
echo "  cold                      $cold ms (cached $c0)"
echo "  memory hit                $mem ms (cached $c1)"
echo "  disk hit after a restart  $disk ms (cached $c2)"
if [ "$g0" = "$g1" ] && [ "$g0" = "$g2" ] && [ "$c32" = 0 ]; then
  echo "  32 greedy tokens: disk restore (cached $d32) == memory restore (cached $m32) == cold: ok"
else
  echo "  32 greedy tokens differ: disk $g2 (cached $d32), memory $g1 (cached $m32), cold $g0 (cached $c32)"
fi
f=$(ls -S "$dir"/kv/* 2>/dev/null | head -1)
if [ -n "$f" ]; then
  echo "  largest snapshot file: $(du -m "$f" | cut -f1) MiB"
  echo "  dd read of it: $(dd if="$f" of=/dev/null bs=16M 2>&1 | tail -1)"
fi
grep -h "disk_hit\|memory_hit" "$log" | tail -2 | sed 's/^/  log: /'
rm -rf "$dir"

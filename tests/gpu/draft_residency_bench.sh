#!/usr/bin/env bash
# Draft residency on the GPU machine: `dflash serve --device cuda:0` with a random Qwen3-8B Q4_K_M target and a
# random draft of z-lab's Qwen3-8B DFlash shape (2.1 GB bf16), --lazy-draft against persistent: /props
# speculative (parked, unparks, last_unpark_ms, resident_bytes) and the device memory nvidia-smi reports after
# each of three requests. Run from the repository root with a GPU bundle (tests/gpu/run_gpu_tests.sh bundle).
source "$(dirname "${BASH_SOURCE[0]}")/bundle_env.sh"
( "$bin" bench --make-random qwen3-8b --type q4_k_m --tokenizer models/default-coder-19m-q8_0.gguf -o /dev/shm/q8b.gguf >/dev/null 2>&1 & "$bin" bench --make-random qwen3-8b-dflash --type bf16 -o /dev/shm/q8b-dflash.gguf >/dev/null 2>&1; wait )
mem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader; }
for policy in "--lazy-draft" "--draft-residency persistent"; do
  "$bin" serve /dev/shm/q8b.gguf --device cuda:0 --draft /dev/shm/q8b-dflash.gguf $policy --port 18800 >/tmp/serve.log 2>&1 &
  pid=$!
  for _ in $(seq 300); do curl -sf http://127.0.0.1:18800/health >/dev/null && break; sleep 0.2; done
  echo "== $policy: after start: $(mem)"
  for i in 1 2 3; do
    curl -s http://127.0.0.1:18800/v1/completions -H 'Content-Type: application/json' -d '{"prompt":"def main():","max_tokens":16,"temperature":0}' >/dev/null
    curl -s http://127.0.0.1:18800/props | python3 -c "import json,sys; s=json.load(sys.stdin)['speculative']; print({k:s[k] for k in ['parked','unparks','last_unpark_ms','draft_bytes','resident_bytes','steps']})"
    echo "   device memory after request $i: $(mem)"
  done
  grep -E "unparked|parked:" /tmp/serve.log | tail -2
  kill $pid; wait $pid 2>/dev/null
done

#!/usr/bin/env bash
# Target layer split on the GPU machine (FEATURES.md F2): with two GPUs (nvidia-h200-x2), greedy `dflash run`
# on the bundled model split cuda:0,cuda:1 must print exactly the text of --device cuda:0 (plain, DFlash chain,
# DDTree: the same kernels on both GPUs); with one GPU the split is cuda:0,cpu, whose CPU layers compute with
# other kernels, so its text is printed beside one device's rather than required equal. Then `dflash bench` on
# random Q4_K_M models of the SPLIT_MODELS shapes (default qwen3-8b; SPLIT_8B=0 skips them), at SPLIT_CTX
# contexts: one device vs the 50/50 split, decode tokens/s and the host time of the hand-offs per token. Prints one line per check, a table, and "layer split: PASS|FAIL". Run from the
# repository root with a GPU bundle built by tests/gpu/run_gpu_tests.sh bundle.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bundle_env.sh"
log="${OUT:-/tmp}/layer_split_bench.log"
: >"$log"
[[ -n "${OUT:-}" ]] && exec > >(tee "$OUT/layer_split_bench.txt")
fail=0
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [[ "$gpus" -ge 2 ]]; then split="cuda:0,cuda:1"; exact=1; else split="cuda:0,cpu"; exact=0; fi
echo "GPUs: $gpus; split $split"
prompt='Write a Python function `is_prime(n)` that returns True when n is a prime number.'
for m in "--draft none" "--no-adaptive-draft" "--ddtree --no-adaptive-draft"; do
  # shellcheck disable=SC2086
  "$bin" run --device cuda:0 --chat -p "$prompt" -n 128 --temperature 0 $m >/tmp/split_one.txt 2>>"$log"
  # shellcheck disable=SC2086
  "$bin" run --target-devices "$split" --chat -p "$prompt" -n 128 --temperature 0 $m >/tmp/split_two.txt \
    2>/tmp/split_err.txt
  cat /tmp/split_err.txt >>"$log"
  stats="$(grep -o 'speculative: .*' /tmp/split_err.txt | head -1)"
  if cmp -s /tmp/split_one.txt /tmp/split_two.txt; then
    echo "[$m] $split: same text as cuda:0 ($stats)"
  elif [[ $exact == 1 ]]; then
    echo "[$m] $split: TEXT DIFFERS from cuda:0"
    diff <(head -c 300 /tmp/split_one.txt) <(head -c 300 /tmp/split_two.txt) | head -6
    fail=1
  else
    same=$(cmp /tmp/split_one.txt /tmp/split_two.txt | grep -o 'byte [0-9]*' | head -1)
    echo "[$m] $split: text departs from cuda:0 at $same (CPU layers: other kernels) ($stats)"
  fi
done
# SPLIT_MODELS: the random shapes to bench (default qwen3-8b; qwen3.5-27b is issue 8's shape).
if [[ "${SPLIT_8B:-1}" == 1 ]]; then
  printf '%-12s %-28s %6s %10s %12s %14s\n' model placement ctx decode_t/s prefill_t/s handoff_ms/tok
  for shape in ${SPLIT_MODELS:-qwen3-8b}; do
    file="/dev/shm/$shape.gguf"
    "$bin" bench --make-random "$shape" --type q4_k_m --tokenizer "$root/models/default-coder-19m-q8_0.gguf" \
      -o "$file" >>"$log" 2>&1 || { fail=1; continue; }
    for ctx in ${SPLIT_CTX:-512 4096}; do
      for where in "--device cuda:0" "--target-devices $split"; do
        # shellcheck disable=SC2086
        "$bin" bench --model "$file" $where --prompt-len "$ctx" --gen-len 64 --json 2>>"$log" |
          python3 -c '
import json, sys
j = json.load(sys.stdin)
print("%-12s %-28s %6d %10.1f %12.1f %14.3f" % (sys.argv[2], j["backend"], int(sys.argv[1]), j["decode_tok_s"],
      j["prefill_tok_s"], j["handoff_ms_per_token"]))' "$ctx" "$shape" || fail=1
      done
    done
    rm -f "$file"
  done
fi
[[ $fail -eq 0 ]] && echo "layer split: PASS" || echo "layer split: FAIL"
exit $fail

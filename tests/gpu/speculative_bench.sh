#!/usr/bin/env bash
# DFlash on the GPU machine with the bundled default model and its trained draft (models/): for a few code
# and chat prompts, greedy `dflash run --device cuda:0` with the draft (chain, DDTree) must print exactly
# the text of `--draft none`; then `dflash bench` measures plain vs speculative decode speed on each prompt
# (tokens/s, speedup, acceptance length, draft and verify time per step). Prints one line per check, a
# table, and "speculative: PASS|FAIL". Run from the repository root with a GPU bundle built by
# tests/gpu/run_gpu_tests.sh bundle (DFLASH_SMOKE_DEVICE=cpu tries it on the dev machine).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bundle_env.sh"
log="${OUT:-/tmp}/speculative_bench.log"
: >"$log"
# What it prints is kept beside the log, so a run cut short by a time limit still tells what it checked.
[[ -n "${OUT:-}" ]] && exec > >(tee "$OUT/speculative_bench.txt")
n="${SPEC_TOKENS:-256}"
fail=0
prompts=(
  'Write a Python function `is_prime(n)` that returns True when n is a prime number.'
  'Write a Python class `Stack` with push, pop and peek methods.'
  'Parse a JSON file and return the value of the key "name".'
  'Implement binary search over a sorted list in Python.'
)
prompts=("${prompts[@]:0:${SPEC_PROMPTS:-4}}")  # SPEC_PROMPTS=N: the first N prompts only
modes=("" "--ddtree" "--ddtree --ddtree-budget 40" "--no-adaptive-draft" "--ddtree --no-adaptive-draft"
       "--draft-device cpu --no-adaptive-draft")
for i in "${!prompts[@]}"; do
  p="${prompts[$i]}"
  "$bin" run --device "$device" --chat -p "$p" -n "$n" --temperature 0 --draft none >/tmp/spec_plain.txt 2>>"$log"
  for m in "${modes[@]}"; do
    # shellcheck disable=SC2086
    "$bin" run --device "$device" --chat -p "$p" -n "$n" --temperature 0 $m >/tmp/spec_draft.txt 2>/tmp/spec_err.txt
    cat /tmp/spec_err.txt >>"$log"
    stats="$(grep -o 'speculative: .*' /tmp/spec_err.txt | head -1)"
    if cmp -s /tmp/spec_plain.txt /tmp/spec_draft.txt; then
      echo "prompt $i [${m:-chain}]: same text as --draft none ($stats)"
    else
      echo "prompt $i [${m:-chain}]: TEXT DIFFERS from --draft none ($stats)"
      diff <(head -c 400 /tmp/spec_plain.txt) <(head -c 400 /tmp/spec_draft.txt) | head -8
      fail=1
    fi
  done
done
echo
row() {  # row LABEL MODE -- bench args: one table row from `dflash bench --json`'s speculative section
  local label="$1" mode="$2"
  shift 3
  # shellcheck disable=SC2086
  "$bin" bench --device "$device" "$@" $mode --json 2>>"$log" |
    python3 -c '
import json, sys
j = json.load(sys.stdin)["speculative"]
print("%-9s %-28s %9.1f %9.1f %7.2f %6.2f %8.3f %8.3f %9.3f %9.3f %8.2f%s" % (sys.argv[1], sys.argv[2],
      j["plain_tok_s"], j["spec_tok_s"], j["speedup"], j["acceptance_length"], j["draft_ms_per_step"],
      j["tree_ms_per_step"], j["verify_ms_per_step"], j["commit_ms_per_step"], j["break_even_tau"],
      "" if j["same_text"] else "  TOKENS DIFFER"))' "$label" "${mode:-chain}" || fail=1
}
header() {
  printf '%-9s %-28s %9s %9s %7s %6s %8s %8s %9s %9s %8s\n' "$1" mode plain_t/s spec_t/s speedup tau draft_ms tree_ms \
    verify_ms commit_ms break_even
}
bench_modes=("" "--ddtree" "--ddtree --ddtree-budget 15" "--ddtree --ddtree-budget 40")
header prompt
for i in "${!prompts[@]}"; do
  for m in "${bench_modes[@]}"; do
    row "$i" "$m" -- --model "$root/models/default-coder-19m-q8_0.gguf" --prompt-len 32 --gen-len "$n" --prompt "${prompts[$i]}" --chat
  done
done
# The cost of a step at a real size: random Qwen3-8B Q4_K_M with a random z-lab-layout draft (bf16). Random
# weights accept nothing, so tau is ~1: the row gives the draft and verify time per step and the break-even
# acceptance length (z-lab reports ~6.5 on Qwen3-8B with its trained draft).
if [[ "${SPEC_8B:-1}" == 1 && "$device" != cpu ]]; then
  echo
  "$bin" bench --make-random qwen3-8b --type q4_k_m --tokenizer "$root/models/default-coder-19m-q8_0.gguf" \
    -o /dev/shm/q8b.gguf >>"$log" 2>&1 &&
    "$bin" bench --make-random qwen3-8b-dflash --type bf16 -o /dev/shm/q8b-dflash.gguf >>"$log" 2>&1 || fail=1
  header ctx
  for ctx in 512 4096; do
    for m in "" "--ddtree --ddtree-budget 15" "--ddtree"; do
      row "$ctx" "$m" -- --model /dev/shm/q8b.gguf --draft /dev/shm/q8b-dflash.gguf --prompt-len "$ctx" --gen-len 64
    done
  done
fi
[[ $fail -eq 0 ]] && echo "speculative: PASS" || echo "speculative: FAIL"
exit $fail

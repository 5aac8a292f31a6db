#!/usr/bin/env bash
# The rows of docs/benchmarks.md's "Decode and prefill" table on the GPU machine: random Qwen3-8B files
# (Q4_K_M and BF16; PERF_27B=1 adds the Qwen3.5-27B Q4_K_M shape, written with --distinct-rows) benchmarked by
# `dflash bench` at prompts of 512 / 4096 / 32768 tokens, and, when the llama.cpp peer's libraries are on the
# machine (PERF_PEER=/dir holding llbench and its libraries, see ../shared/tools/llamacpp-peer), `llbench`
# on the same files in the same run. Prints one table line per figure; full outputs go to $OUT (or /tmp).
#
#   PERF_PROMPTS="512 4096 32768"  the prompt lengths (a 32K prompt adds ~30 s a file)
#   PERF_TYPES="q4_k_m bf16"       the 8B file types
#   PERF_FILES="a.gguf b.gguf"      bench these files instead of writing random ones
#
# Run from the repository root with a GPU bundle built by `tests/gpu/run_gpu_tests.sh bundle`. The peer's
# libraries are larger than one device call carries with the repository: pack them without the CPU
# variants (libggml-cpu-x64.so alone) as tar.xz (~23 MB), split it in two, carry one half in a first call
# that copies it to /tmp and the other in the next call while the machine is warm, then join and unpack
# them into PERF_PEER before this script.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bundle_env.sh"
out="${OUT:-/tmp}"
prompts="${PERF_PROMPTS:-512 4096 32768}"
types="${PERF_TYPES:-q4_k_m bf16}"
peer="${PERF_PEER:-}"
[[ -x "$bin" ]] || { echo "perf bench: no dflash at $bin (build the bundle first)"; exit 2; }

files=()
[[ -n "${PERF_FILES:-}" ]] && read -r -a files <<<"$PERF_FILES" && types=""
for t in $types; do
  f="/dev/shm/perf-qwen3-8b-$t.gguf"
  [[ -s "$f" ]] || "$bin" bench --make-random qwen3-8b --type "$t" -o "$f" >"$out/make-8b-$t.log" 2>&1 ||
    { echo "perf bench: could not write $f (see $out/make-8b-$t.log)"; exit 1; }
  files+=("$f")
done
if [[ "${PERF_27B:-0}" == 1 && -z "${PERF_FILES:-}" ]]; then
  f=/dev/shm/perf-qwen3.5-27b-q4_k_m.gguf
  # --distinct-rows: the 27B file in seconds (over 400 s with every row quantized); speed is value-blind.
  [[ -s "$f" ]] || "$bin" bench --make-random qwen3.5-27b --type q4_k_m --distinct-rows 256 -o "$f" \
    >"$out/make-27b.log" 2>&1 ||
    { echo "perf bench: could not write $f"; exit 1; }
  files+=("$f")
fi

printf '%-34s %7s %13s %9s %7s %13s %9s\n' file prompt prefill_t/s ratio ttft_ms decode_t/s ratio
for f in "${files[@]}"; do
  for p in $prompts; do
    gen=128
    reps=3
    [[ "$p" -ge 16384 ]] && gen=64 && reps=2
    j="$out/$(basename "$f" .gguf)-$p.json"
    if ! timeout 300 "$bin" bench -m "$f" --device "$device" --prompt-len "$p" --gen-len "$gen" --reps "$reps" \
        --json >"$j" 2>"$j.err"; then
      echo "$(basename "$f") $p: dflash bench failed (see $j.err)"
      continue
    fi
    python3 - "$j" "$(basename "$f")" "$p" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
r = j.get("prefill_ratio")
print("%-34s %7s %13.1f %9s %7.1f %13.2f %9.2f" % (sys.argv[2], sys.argv[3], j["prefill_tok_s"],
      "%.2f" % r if r is not None else "n/a", j["ttft_ms"], j["decode_tok_s"], j["decode_ratio"]))
EOF
  done
done

if [[ -n "$peer" && -x "$peer/llbench" ]]; then
  export CUDA_CACHE_PATH="$peer/nvcache" CUDA_CACHE_MAXSIZE=4294967296
  mkdir -p "$CUDA_CACHE_PATH"
  pp=$(echo "$prompts" | tr ' ' ',')
  for f in "${files[@]}"; do
    # The first run of a model family pays the PTX JIT (~30 s); llbench discards its first prefill rep.
    LD_LIBRARY_PATH="$peer:/usr/local/cuda/lib64:/usr/local/nvidia/lib64" timeout 400 "$peer/llbench" bench "$f" \
      --pp "$pp" --reps 3 --tgctx 512 --tgsteps 64 >"$out/$(basename "$f" .gguf)-llbench.txt" 2>&1
    # Decode at each longer prompt's context too (one short prefill to set it up).
    for p in $prompts; do
      [[ "$p" -gt 512 ]] || continue
      LD_LIBRARY_PATH="$peer:/usr/local/cuda/lib64:/usr/local/nvidia/lib64" timeout 200 "$peer/llbench" bench "$f" \
        --pp 512 --reps 1 --tgctx "$p" --tgsteps 64 2>&1 | grep "RESULT decode ctx" | grep -v near-empty \
        >>"$out/$(basename "$f" .gguf)-llbench.txt"
    done
    echo "llama.cpp $(basename "$f"):"
    grep RESULT "$out/$(basename "$f" .gguf)-llbench.txt" | sed 's/^\[llb\] RESULT /  /'
  done
else
  echo "llama.cpp peer: not run (PERF_PEER unset or without llbench)"
fi

#!/usr/bin/env bash
# Starts dflash on the bundled default model (README's first command): installs what the build needs,
# builds the binary, and serves the OpenAI-compatible API on http://127.0.0.1:8080 (extra arguments go
# to `dflash serve`, e.g. scripts/start.sh --port 9000 --device cuda:0).
set -euo pipefail
cd "$(dirname "$0")/.."
DFLASH_SKIP_NPM=1 scripts/setup-debian.sh  # the test oracles (npm) are not needed to serve
# GPU code for this machine's GPUs (compute capability 9.0 as 90a, for Hopper's wgmma kernels), or 90a where
# nvidia-smi finds none; DFLASH_CUDA_ARCHS overrides.
archs=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
  awk -F. '/^[0-9]+\.[0-9]+$/ { a = $1 $2; if (a == "90") a = "90a"; print a }' | sort -u | paste -sd';' || true)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${DFLASH_CUDA_ARCHS:-${archs:-90a}}" >/dev/null
cmake --build build -j"$(nproc)" --target dflash
cat <<'MSG'
== dflash serve: the bundled default model (models/, docs/default-model.md). Try:
   curl -s http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \
     -d '{"messages":[{"role":"user","content":"Write a Python function that reverses a string."}],"temperature":0.2}'
MSG
exec build/src/dflash serve "$@"

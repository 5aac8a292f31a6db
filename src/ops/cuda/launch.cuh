// Kernel launches with programmatic dependent launch (PDL, sm_90+): `launch_pdl` launches a kernel with
// cudaLaunchAttributeProgrammaticStreamSerialization, so that its CTAs may be scheduled (and run their
// prologue) while the kernel before it on the stream drains; stream capture records the dependency as a
// programmatic graph edge, so recorded steps keep the overlap. The attribute relaxes only the dependency on
// the immediately preceding KERNEL of the stream: a preceding copy, memset or event wait stays a full
// dependency.
//
// The contract of a kernel launched by launch_pdl: every thread calls pdl_wait() before its first access to
// memory that earlier work on the stream may write or read (anything but constant data such as weights),
// and no thread returns before it. pdl_wait() (griddepcontrol.wait) returns once every prerequisite grid
// has completed and its writes are visible. Because every such kernel waits before it finishes, its
// completion implies its predecessors' (the dependency stays transitive for the kernels after it, PDL or
// not). pdl_launch_dependents() (griddepcontrol.launch_dependents) lets the next kernel's CTAs be scheduled
// before this one ends; our kernels call it right after the wait (pdl_begin), so the next kernel launches
// once every CTA of this one is resident and then only waits: it cannot take SM slots this kernel still
// needs. Without the attribute (PDL off, or an older GPU) both are no-ops and the launch is an ordinary one.
//
// ptxas treats non-coherent loads (__ldg, ld.global.nc) as reads of memory constant for the kernel's lifetime and may
// schedule them above griddepcontrol.wait. A kernel that loads anything before its wait (gemv16_mma, gemv16_kernel,
// gemv_q8_kernel and mmq_kernel: their first weight chunks) therefore reads what earlier kernels wrote with coherent
// loads (__ldca): gemv16_mma's x loads sat above the wait, and a bf16 product read an RMSNorm's output before the norm
// had finished (docs/benchmarks.md, twenty-ninth session). tests/gpu/pdl_sass_check.py (run by run_gpu_tests.sh) checks
// every kernel's SASS for loads above its wait.
//
// Off switch: DFLASH_PDL=0 in the environment (read once per process) launches every kernel without the
// attribute.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "ops/cuda/sm_count.h"

namespace dflash::cuda {

// 0: PDL off; 1: on (the default).
inline int pdl_mode() {
  static const int mode = [] {
    const char* v = std::getenv("DFLASH_PDL");
    if (v == nullptr || *v == '\0') return 1;
    const int m = std::atoi(v);
    return m <= 0 ? 0 : 1;
  }();
  return mode;
}

// Whether launches on the current device use PDL: pdl_mode() != 0 and compute capability >= 9.0.
inline bool pdl_enabled() { return pdl_mode() != 0 && current_compute_capability() >= 90; }

// Launches kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when pdl_enabled().
// Returns the launch status (also left in cudaGetLastError, as for <<<>>>).
template <typename... KArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// Lets kKernel (a __global__ function) use `bytes` of dynamic shared memory on the current device: one
// cudaFuncSetAttribute per device (a bit per device index below 64 remembers it; a device past 63 sets it at
// every call); nothing to do up to the default 48 KiB. `bytes` must be the same at every call of a kernel
// (its fixed size), since a device is raised only once.
template <auto kKernel>
cudaError_t allow_dynamic_smem(size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  static std::atomic<uint64_t> raised{0};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t{1} << dev : 0;
  if (bit != 0 && (raised.load(std::memory_order_relaxed) & bit)) return cudaSuccess;
  err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (err == cudaSuccess) raised.fetch_or(bit, std::memory_order_relaxed);
  return err;
}

// Calls f(std::integral_constant<int, P>{}) for the least P of kPers that is at least `per` (none past the last):
// the kernels that keep a row's values in registers are instantiated for a few counts a thread, since their
// unrolled loops issue every step, predicated off or not.
template <int... kPers, typename F>
void with_per(int64_t per, F&& f) {
  bool done = false;
  ((done = done || (per <= kPers && (f(std::integral_constant<int, kPers>{}), true))), ...);
}

// griddepcontrol.wait: blocks until the grids this one depends on programmatically have completed and their
// memory operations are visible. A no-op for a grid launched without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// griddepcontrol.launch_dependents: this CTA no longer delays the launch of the dependent grid.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The prologue of every kernel launched by launch_pdl: wait for the predecessors, then release the
// dependents. Call it from every thread before any global memory access (and before any early return).
__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
  pdl_launch_dependents();
}

}  // namespace dflash::cuda

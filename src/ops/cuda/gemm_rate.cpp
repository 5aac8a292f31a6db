// measure_bf16_gemm_flops (gemm_rate.h).
#include "ops/cuda/gemm_rate.h"

#include <cublas_v2.h>

#include <algorithm>

#include "ops/cuda/fill.h"

namespace dflash::cuda {

Result<double> measure_bf16_gemm_flops(cudaStream_t stream) {
  constexpr int kN = 8192;
  constexpr size_t kElems = size_t{kN} * kN;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  cublasHandle_t handle = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  const auto cleanup = [&] {
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (handle) cublasDestroy(handle);
    for (void* p : {a, b, c})
      if (p) cudaFree(p);
    cudaGetLastError();
  };
  const auto fail = [&](const char* what, const char* why) -> Status {
    cleanup();
    return io_error("measuring the bf16 GEMM rate: {}: {}", what, why);
  };
  if (cudaMalloc(&a, 2 * kElems) != cudaSuccess || cudaMalloc(&b, 2 * kElems) != cudaSuccess ||
      cudaMalloc(&c, 4 * kElems) != cudaSuccess)
    return fail("cudaMalloc of 768 MiB", cudaGetErrorString(cudaGetLastError()));
  // Non-zero operands (bf16 1.0 and 0.5): the multipliers switch, as they do on real data.
  if (fill_u32(static_cast<uint32_t*>(a), kElems / 2, 0x3f803f80u, stream) != cudaSuccess ||
      fill_u32(static_cast<uint32_t*>(b), kElems / 2, 0x3f003f00u, stream) != cudaSuccess)
    return fail("filling the operands", cudaGetErrorString(cudaGetLastError()));
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return fail("cublasCreate", "failed");
  if (cublasSetStream(handle, stream) != CUBLAS_STATUS_SUCCESS) return fail("cublasSetStream", "failed");
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
    return fail("cudaEventCreate", cudaGetErrorString(cudaGetLastError()));
  const float alpha = 1.0f, beta = 0.0f;
  const auto gemm = [&] {
    return cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, kN, kN, kN, &alpha, a, CUDA_R_16BF, kN, b, CUDA_R_16BF, kN,
                        &beta, c, CUDA_R_32F, kN, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    if (cudaEventRecord(e0, stream) != cudaSuccess) return fail("cudaEventRecord", "failed");
    if (const cublasStatus_t s = gemm(); s != CUBLAS_STATUS_SUCCESS) return fail("cublasGemmEx", cublasGetStatusString(s));
    if (cudaEventRecord(e1, stream) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess)
      return fail("timing", cudaGetErrorString(cudaGetLastError()));
    float ms = 0;
    if (cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess || ms <= 0) return fail("cudaEventElapsedTime", "failed");
    if (rep > 0) best = std::max(best, 2.0 * kN * kN * static_cast<double>(kN) / (ms * 1e-3));  // rep 0 warms up
  }
  cleanup();
  return best;
}

}  // namespace dflash::cuda

// Elementwise fills on the device: poisoning outputs before a kernel test, zeroing state buffers.
#include "ops/cuda/fill.h"
#include "ops/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

__global__ void fill_u32_kernel(uint32_t* dst, uint64_t n, uint32_t value) {
  pdl_begin();
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    dst[i] = value;
}

}  // namespace

cudaError_t fill_u32(uint32_t* dst, uint64_t n, uint32_t value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  uint64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535u * 16u) blocks = 65535u * 16u;
  launch_pdl(fill_u32_kernel, dim3(static_cast<unsigned>(blocks)), dim3(threads), 0, stream, dst, n, value);
  return cudaGetLastError();
}

}  // namespace dflash::cuda

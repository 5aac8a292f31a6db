// Short causal conv + SiLU kernels (conv.h): one thread per output element; a second launch moves the
// chain form's window.
#include "ops/cuda/conv.h"
#include "ops/cuda/conv.cuh"
#include "ops/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 256;

template <int KC>
__global__ void __launch_bounds__(kThreads)
    conv_out_kernel(const float* __restrict__ x, int64_t n, int64_t C, const float* __restrict__ w, int K,
                    const float* __restrict__ conv_state, float* __restrict__ out, const int32_t* __restrict__ parents) {
  pdl_begin();
  const int64_t total = n * C;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / C, c = idx - t * C;
    out[idx] = conv_silu_at<KC>(x, t, c, C, w, K, conv_state, parents);
  }
}

__global__ void __launch_bounds__(kThreads)
    conv_state_kernel(const float* __restrict__ x, int64_t n, int64_t C, int hist, float* conv_state) {
  pdl_begin();
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x)
    conv_shift_state(x, n, c, C, hist, conv_state);
}

unsigned grid_for(int64_t items) {
  int64_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks > 65535 * 16) blocks = 65535 * 16;
  return unsigned(blocks < 1 ? 1 : blocks);
}

}  // namespace

cudaError_t causal_conv1d_silu(const float* x, int64_t n, int64_t channels, const float* w, int64_t kernel,
                               float* conv_state, float* out, const int32_t* parents, cudaStream_t stream) {
  if (n < 0 || channels < 1 || kernel < 1 || kernel > kConvMaxKernel) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (!x || !w || !out || (kernel > 1 && !conv_state)) return cudaErrorInvalidValue;
  if (n > INT64_MAX / channels) return cudaErrorInvalidValue;
  const int K = int(kernel);
  launch_pdl(K == kConvCommonKernel ? conv_out_kernel<kConvCommonKernel> : conv_out_kernel<0>,
             dim3(grid_for(n * channels)), dim3(kThreads), 0, stream, x, n, channels, w, K, conv_state, out, parents);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || parents != nullptr || K == 1) return err;
  return conv_shift_window(x, n, channels, kernel, conv_state, stream);
}

cudaError_t conv_shift_window(const float* x, int64_t n, int64_t channels, int64_t kernel, float* conv_state,
                              cudaStream_t stream) {
  if (n < 0 || channels < 1 || kernel < 1 || kernel > kConvMaxKernel) return cudaErrorInvalidValue;
  if (n == 0 || kernel == 1) return cudaSuccess;
  if (!x || !conv_state) return cudaErrorInvalidValue;
  launch_pdl(conv_state_kernel, dim3(grid_for(channels)), dim3(kThreads), 0, stream, x, n, channels,
             static_cast<int>(kernel) - 1, conv_state);
  return cudaGetLastError();
}

}  // namespace dflash::cuda

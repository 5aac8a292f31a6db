// Short causal conv + SiLU kernels (conv.h): one thread per output element; a second launch moves the
// chain form's window.
#include "ops/cuda/conv.h"
#include "ops/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxK = int(kConvMaxKernel);

__global__ void __launch_bounds__(kThreads)
    conv_out_kernel(const float* __restrict__ x, int64_t n, int64_t C, const float* __restrict__ w, int K,
                    const float* __restrict__ conv_state, float* __restrict__ out, const int32_t* __restrict__ parents) {
  pdl_begin();
  const int hist = K - 1;
  const int64_t total = n * C;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / C, c = idx - t * C;
    const float* wc = w + c * K;
    float o;
    if (parents == nullptr) {
      // Window slot j is row t + j of concat(conv_state, x).
      o = 0.0f;
      for (int j = 0; j < K; ++j) {
        const int64_t u = t + j;
        const float in = u < hist ? conv_state[u * C + c] : x[(u - hist) * C + c];
        const float p = __fmul_rn(wc[j], in);
        o = j == 0 ? p : __fadd_rn(o, p);
      }
    } else {
      // src[j] >= 0: a row of x; < 0: row -(src + 1) of conv_state.
      int64_t src[kMaxK];
      src[hist] = t;
      int64_t cur = parents[t];
      if (cur >= t || cur < -1) cur = -1;
      int srow = hist - 1;
      for (int j = hist - 1; j >= 0; --j) {
        if (cur >= 0) {
          src[j] = cur;
          int64_t next = parents[cur];
          if (next >= cur || next < -1) next = -1;
          cur = next;
        } else {
          src[j] = -int64_t(srow--) - 1;
        }
      }
      o = 0.0f;
      for (int j = 0; j < K; ++j) {
        const int64_t s = src[j];
        const float in = s >= 0 ? x[s * C + c] : conv_state[(-s - 1) * C + c];
        const float p = __fmul_rn(wc[j], in);
        o = j == 0 ? p : __fadd_rn(o, p);
      }
    }
    out[idx] = o / (1.0f + expf(-o));
  }
}

// conv_state row r <- row n + r of concat(conv_state, x); rows ascending, so a state row is read before
// it is overwritten (n + r > r).
__global__ void __launch_bounds__(kThreads)
    conv_state_kernel(const float* __restrict__ x, int64_t n, int64_t C, int hist, float* conv_state) {
  pdl_begin();
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x)
    for (int r = 0; r < hist; ++r) {
      const int64_t u = n + r;
      conv_state[r * C + c] = u < hist ? conv_state[u * C + c] : x[(u - hist) * C + c];
    }
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
  launch_pdl(conv_out_kernel, dim3(grid_for(n * channels)), dim3(kThreads), 0, stream, x, n, channels, w, K, conv_state,
             out, parents);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || parents != nullptr || K == 1) return err;
  launch_pdl(conv_state_kernel, dim3(grid_for(channels)), dim3(kThreads), 0, stream, x, n, channels, K - 1, conv_state);
  return cudaGetLastError();
}

}  // namespace dflash::cuda

// Short causal depthwise conv with SiLU on the device (kernels in conv.cu): the same math and semantics
// as cpu::causal_conv1d_silu (ops/cpu/ops.h; algorithms.md D.4 and B.7). Per output the K products are
// summed oldest first with separately rounded multiplies and adds, as on the CPU; only SiLU's exponential
// may differ by an ulp or two.
//
// Device float32 buffers: x [n, C]; w [C, K]; conv_state [K-1, C] (oldest first); out [n, C]; parents
// (device int32, n entries) for the tree form.
//   out[t, c] = silu(sum_j w[c, j] * in_{t-(K-1)+j}[c]), inputs before the first new token from conv_state.
// Chain form (parents null): conv_state becomes the last K-1 rows of concat(conv_state, x).
// Tree form: token i's window is its ancestors' inputs (nearest last), then conv_state rows when the
// ancestry runs out; conv_state is unchanged. parents[i] must be in [-1, i); an entry outside is taken as
// -1 (memory stays safe, the result is meaningless).
//
// Included by nvcc-compiled code: no base/status.h here; the Status wrapper is in conv_host.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dflash::cuda {

inline constexpr int64_t kConvMaxKernel = 16;
inline constexpr int kConvCommonKernel = 4;  // the kernel size the kernels are also compiled for (Qwen3.5's)

// cudaErrorInvalidValue (nothing launched) for n < 0, channels < 1, kernel outside [1, kConvMaxKernel], or
// a null pointer that is needed (conv_state may be null only when kernel == 1). out must not overlap x or
// conv_state. Two launches in the chain form (outputs, then the window update), one in the tree form.
cudaError_t causal_conv1d_silu(const float* x, int64_t n, int64_t channels, const float* w, int64_t kernel,
                               float* conv_state, float* out, const int32_t* parents,
                               cudaStream_t stream = nullptr);

// The chain form's window update alone: conv_state [K-1, C] becomes the last K-1 rows of concat(conv_state,
// x [n, C]) (one launch; what causal_conv1d_silu does after its outputs).
cudaError_t conv_shift_window(const float* x, int64_t n, int64_t channels, int64_t kernel, float* conv_state,
                              cudaStream_t stream = nullptr);

}  // namespace dflash::cuda

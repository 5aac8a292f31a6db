// Argument checks and CUDA-error-to-Status glue for the short causal conv (conv.cu).
#include "ops/cuda/conv_host.h"

namespace dflash::cuda {

Status run_causal_conv1d_silu(const float* x, int64_t n, int64_t channels, const float* w, int64_t kernel,
                              float* conv_state, float* out, const int32_t* parents, cudaStream_t stream) {
  constexpr const char* op = "causal conv1d + SiLU (CUDA)";
  if (n < 0 || channels < 1) return invalid_argument("{}: bad shape, {} tokens x {} channels", op, n, channels);
  if (kernel < 1 || kernel > kConvMaxKernel)
    return invalid_argument("{}: kernel size {} outside [1, {}]", op, kernel, kConvMaxKernel);
  if (n == 0) return Status();
  if (!x || !w || !out) return invalid_argument("{}: null input, weight or output buffer", op);
  if (kernel > 1 && conv_state == nullptr) return invalid_argument("{}: null conv state for kernel {}", op, kernel);
  const cudaError_t err = causal_conv1d_silu(x, n, channels, w, kernel, conv_state, out, parents, stream);
  if (err != cudaSuccess)
    return io_error("{} ({} tokens x {} channels, kernel {}): {}", op, n, channels, kernel, cudaGetErrorString(err));
  return Status();
}

}  // namespace dflash::cuda

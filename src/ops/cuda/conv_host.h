// Status-returning wrapper of the device short causal conv + SiLU (conv.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "ops/cuda/conv.h"

namespace dflash::cuda {

// causal_conv1d_silu (conv.h) with argument messages: n < 0, channels < 1, kernel outside
// [1, kConvMaxKernel], a null buffer that is needed. Device pointers; parents null for the chain form.
Status run_causal_conv1d_silu(const float* x, int64_t n, int64_t channels, const float* w, int64_t kernel,
                              float* conv_state, float* out, const int32_t* parents, cudaStream_t stream = nullptr);

}  // namespace dflash::cuda

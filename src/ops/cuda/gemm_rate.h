// The device's dense bf16 tensor-core rate as cuBLAS reaches it: the ceiling `dflash bench` puts beside
// prefill (FLOPs of the prompt / this rate).
#pragma once

#include <cuda_runtime.h>

#include "base/status.h"

namespace dflash::cuda {

// FLOP/s of a bf16 x bf16 -> f32 GEMM of 8192 x 8192 x 8192 (f32 accumulation) on the current device,
// the best of 5 timed runs after a warm-up, on `stream`. Needs ~768 MiB of free device memory.
Result<double> measure_bf16_gemm_flops(cudaStream_t stream);

}  // namespace dflash::cuda

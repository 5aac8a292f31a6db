// Status-returning wrappers of the device dequantization (dequantize.h): argument checks with messages.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "tensor/dtype.h"

namespace dflash::cuda {

// A rows x cols tensor of `type` at device pointer src (rows contiguous, row r at
// r * row_bytes(type, cols)) to rows * cols elements at device pointer dst, enqueued on `stream`.
// f32 is bit-identical with dequantize_row (tensor/quant.h); bf16/f16 are that value rounded to nearest
// even (fp32_to_bf16 / fp32_to_fp16). Errors name the type and shape; nothing is written on an error.
// Completion (and any fault in the kernel) is seen at the next synchronization of `stream`.
Status dequantize_rows_to_f32(DType type, const void* src, float* dst, int64_t rows, int64_t cols,
                              cudaStream_t stream = nullptr);
Status dequantize_rows_to_bf16(DType type, const void* src, __nv_bfloat16* dst, int64_t rows, int64_t cols,
                               cudaStream_t stream = nullptr);
Status dequantize_rows_to_f16(DType type, const void* src, __half* dst, int64_t rows, int64_t cols,
                              cudaStream_t stream = nullptr);

}  // namespace dflash::cuda

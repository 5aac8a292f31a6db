// Device dequantization (kernels in dequantize.cu): rows of a stored type to f32, bf16 or f16.
//
// The f32 output is bit-identical with the CPU dequantize_row (tensor/quant.h), hence with ggml, for
// every finite block: the kernels repeat the CPU codecs' float operations in the same order, each
// rounded on its own (no fused multiply-add). bf16 and f16 outputs are that f32 value rounded to nearest
// even exactly as tensor/half.h's fp32_to_bf16 / fp32_to_fp16 do (NaN handling included).
// A block whose fp16 scale is inf or NaN yields NaN where the CPU does, but the NaN bits may differ (x86
// and the GPU make different default NaNs).
//
// Layout: a rows x cols tensor, rows contiguous: row r of the source starts at r * row_bytes(type, cols)
// (q6_K, q8_0 and q4_0: the device form, weight_form.h), row r of the destination at r * cols elements. Any
// source alignment is accepted, except for those three (16 bytes).
//
// This header is included by nvcc-compiled kernels, so it must not pull in base/status.h (fmt); DType
// is declared opaquely here. The Status-returning wrappers with argument messages are in
// dequantize_host.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dflash {
enum class DType : uint32_t;  // tensor/dtype.h
}  // namespace dflash

namespace dflash::cuda {

// Source types the kernels decode: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K,
// q5_K, q6_K, q8_K (the set tensor/quant.h converts).
bool dequantize_supported(DType type);

// Enqueues the conversion on `stream` and returns the launch status. cudaErrorInvalidValue (and nothing
// written) for an unsupported type, negative rows/cols, cols not a multiple of the type's block size, a
// size that overflows, or a null pointer with a non-empty tensor. rows == 0 or cols == 0 is a no-op.
// src and dst are device pointers and must not overlap.
cudaError_t dequantize_rows(DType type, const void* src, float* dst, int64_t rows, int64_t cols,
                            cudaStream_t stream = nullptr);
cudaError_t dequantize_rows(DType type, const void* src, __nv_bfloat16* dst, int64_t rows, int64_t cols,
                            cudaStream_t stream = nullptr);
cudaError_t dequantize_rows(DType type, const void* src, __half* dst, int64_t rows, int64_t cols,
                            cudaStream_t stream = nullptr);

}  // namespace dflash::cuda

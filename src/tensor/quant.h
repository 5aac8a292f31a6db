// Row conversions between fp32 and the stored element types (f32, f16, bf16, ggml block quants).
//
// Dequantization is bit-identical with ggml's dequantize_row_*; quantization with ggml's
// quantize_row_*_ref (what llama-quantize writes when it has no importance matrix), so a model
// converted here has the same bytes as one converted by llama.cpp.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "tensor/dtype.h"

namespace dflash {

// True for the types dequantize_row / quantize_row / convert_rows handle:
// f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, q8_K.
bool row_conversion_supported(DType t);

// `n` elements of type t at src (n a multiple of t's block size) to n floats at dst.
Status dequantize_row(DType t, const void* src, float* dst, int64_t n);

// n floats to n elements of type t (row_bytes(t, n) bytes at dst). src and dst must not overlap.
Status quantize_row(DType t, const float* src, void* dst, int64_t n);

// A rows x cols tensor of src_type to dst_type, row by row through fp32 (dequantize, then quantize),
// with rows split across `threads` std::threads (<= 0: one per hardware thread). Rows are contiguous:
// row r starts at r * row_bytes(type, cols) in both buffers. Equal types copy the bytes unchanged.
Status convert_rows(DType src_type, const void* src, DType dst_type, void* dst, int64_t rows, int64_t cols,
                    int threads);

}  // namespace dflash

// Per-type block codecs behind quant.h: each turns `blocks` whole blocks to fp32 and back.
//
// Internal to the tensor layer; callers use dequantize_row / quantize_row / convert_rows from quant.h,
// which check row lengths and pick the codec. Block pointers need no alignment: codecs copy each block
// in and out with memcpy. Every function reproduces ggml's reference arithmetic operation for
// operation (same order, same float rounding), so outputs are bit-identical with ggml's
// dequantize_row_* and quantize_row_*_ref.
#pragma once

#include <bit>
#include <cstdint>

namespace dflash::codec {

// Legacy 32-element blocks (quant_legacy.cpp).
void dequantize_q4_0(const void* src, float* dst, int64_t blocks);
void dequantize_q4_1(const void* src, float* dst, int64_t blocks);
void dequantize_q5_0(const void* src, float* dst, int64_t blocks);
void dequantize_q5_1(const void* src, float* dst, int64_t blocks);
void dequantize_q8_0(const void* src, float* dst, int64_t blocks);
void quantize_q4_0(const float* src, void* dst, int64_t blocks);
void quantize_q4_1(const float* src, void* dst, int64_t blocks);
void quantize_q5_0(const float* src, void* dst, int64_t blocks);
void quantize_q5_1(const float* src, void* dst, int64_t blocks);
void quantize_q8_0(const float* src, void* dst, int64_t blocks);

// K-quant 256-element super-blocks (quant_k.cpp).
void dequantize_q2_K(const void* src, float* dst, int64_t blocks);
void dequantize_q3_K(const void* src, float* dst, int64_t blocks);
void dequantize_q4_K(const void* src, float* dst, int64_t blocks);
void dequantize_q5_K(const void* src, float* dst, int64_t blocks);
void dequantize_q6_K(const void* src, float* dst, int64_t blocks);
void dequantize_q8_K(const void* src, float* dst, int64_t blocks);
void quantize_q2_K(const float* src, void* dst, int64_t blocks);
void quantize_q3_K(const float* src, void* dst, int64_t blocks);
void quantize_q4_K(const float* src, void* dst, int64_t blocks);
void quantize_q5_K(const float* src, void* dst, int64_t blocks);
void quantize_q6_K(const float* src, void* dst, int64_t blocks);
void quantize_q8_K(const float* src, void* dst, int64_t blocks);

// Round to nearest, ties to even, for |v| < 2^22, the way ggml's k-quants round: adding 1.5 * 2^23
// puts the sum in [2^23, 2^24), where the float spacing is exactly 1, so the addition itself rounds v
// and the integer lands in the low mantissa bits (offset by 2^22). Kept as this bit trick rather than
// std::nearbyint so that even out-of-range input (NaN from a zero-range block) maps to what ggml gives.
inline int nearest_int(float v) {
  const float biased = v + 12582912.0f;
  return static_cast<int>(std::bit_cast<uint32_t>(biased) & 0x7fffffu) - 0x400000;
}

}  // namespace dflash::codec

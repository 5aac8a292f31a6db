// Legacy ggml quant types (32-element blocks): q4_0, q4_1, q5_0, q5_1, q8_0 to and from fp32.
//
// Layouts (dtype.h), for a block of elements x[0..31]:
//   q4_0  d:fp16, qs[16]            x[j] = d * (q - 8),        q 4 bits
//   q4_1  d:fp16, m:fp16, qs[16]    x[j] = d * q + m,          q 4 bits
//   q5_0  d:fp16, qh[4], qs[16]     x[j] = d * (q - 16),       q 5 bits
//   q5_1  d:fp16, m:fp16, qh[4], qs x[j] = d * q + m,          q 5 bits
//   q8_0  d:fp16, qs[32] int8       x[j] = d * q
// The 4-bit codes pair element j (low nibble of qs[j]) with element j+16 (high nibble). The fifth bit of
// q5 codes sits in the little-endian 32-bit word qh: bit j belongs to element j.
//
// Quantization follows ggml's quantize_row_*_ref (what llama-quantize uses without an importance
// matrix): one scale per block from the block's extreme values, codes by truncating x/d + offset + 0.5.
// Every float operation below happens in the same order as there, so the bytes come out identical.
// Bit-exactness with ggml needs every a*b+c rounded twice, as written: forbid fused multiply-add
// contraction here even when the build targets FMA hardware (-march=native). GCC contracts by default
// in C++ mode; clang within expressions.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <cmath>
#include <cstring>
#include <limits>

#include "tensor/dtype.h"
#include "tensor/half.h"
#include "tensor/quant_codecs.h"

namespace dflash::codec {
namespace {

template <typename Block>
Block load_block(const void* src, int64_t i) {
  Block b;
  std::memcpy(&b, static_cast<const uint8_t*>(src) + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
  return b;
}

template <typename Block>
void store_block(void* dst, int64_t i, const Block& b) {
  std::memcpy(static_cast<uint8_t*>(dst) + i * static_cast<int64_t>(sizeof(Block)), &b, sizeof(Block));
}

// The element of largest magnitude, keeping its sign; the first one wins a tie. 0 for an all-zero block.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// Symmetric codes for q4_0 (bits = 4) and q5_0 (bits = 5): the extreme element maps to code 0, i.e.
// d = extreme / -2^(bits-1), so the opposite end gets the one extra positive level. Codes truncate
// x/d + 2^(bits-1) + 0.5 (round half up) and are capped at 2^bits - 1. Returns d.
float symmetric_codes(const float* x, int bits, uint8_t* q) {
  const float half_range = static_cast<float>(1 << (bits - 1));
  const int top = (1 << bits) - 1;
  const float d = signed_absmax(x, kQK) / -half_range;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (uint32_t j = 0; j < kQK; ++j) {
    const int code = static_cast<int>(x[j] * id + (half_range + 0.5f));  // truncation toward zero
    q[j] = static_cast<uint8_t>(code < top ? code : top);
  }
  return d;
}

// Affine codes for q4_1 (bits = 4) and q5_1 (bits = 5): [min, max] spans codes 0 .. 2^bits - 1.
// Returns d and sets *min. The cap never binds for finite input (x - min <= max - min); it only keeps
// a code inside its bits.
float affine_codes(const float* x, int bits, uint8_t* q, float* min_out) {
  float min = std::numeric_limits<float>::max();
  float max = -std::numeric_limits<float>::max();
  for (uint32_t j = 0; j < kQK; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
  const int top = (1 << bits) - 1;
  const float d = (max - min) / static_cast<float>(top);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (uint32_t j = 0; j < kQK; ++j) {
    const int code = static_cast<int>((x[j] - min) * id + 0.5f);
    q[j] = static_cast<uint8_t>(code < top ? code : top);
  }
  *min_out = min;
  return d;
}

// Nibble packing shared by all 4/5-bit legacy types: element j low, element j + 16 high.
void pack_nibbles(const uint8_t* q, uint8_t* qs) {
  for (uint32_t j = 0; j < kQK / 2; ++j) qs[j] = static_cast<uint8_t>((q[j] & 0x0f) | ((q[j + kQK / 2] & 0x0f) << 4));
}

// The fifth bits of 32 five-bit codes as the little-endian word stored in qh.
void pack_high_bits(const uint8_t* q, uint8_t* qh) {
  uint32_t bits = 0;
  for (uint32_t j = 0; j < kQK; ++j) bits |= static_cast<uint32_t>((q[j] >> 4) & 1u) << j;
  for (int b = 0; b < 4; ++b) qh[b] = static_cast<uint8_t>(bits >> (8 * b));
}

// Unpacks 5-bit codes: nibbles from qs, bit 4 from qh.
void unpack_5bit(const uint8_t* qs, const uint8_t* qh, int* q) {
  const uint32_t bits = qh[0] | (uint32_t{qh[1]} << 8) | (uint32_t{qh[2]} << 16) | (uint32_t{qh[3]} << 24);
  for (uint32_t j = 0; j < kQK / 2; ++j) {
    q[j] = (qs[j] & 0x0f) | static_cast<int>(((bits >> j) & 1u) << 4);
    q[j + kQK / 2] = (qs[j] >> 4) | static_cast<int>(((bits >> (j + kQK / 2)) & 1u) << 4);
  }
}

}  // namespace

void dequantize_q4_0(const void* src, float* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i, dst += kQK) {
    const auto b = load_block<BlockQ4_0>(src, i);
    const float d = fp16_to_fp32(b.d);
    for (uint32_t j = 0; j < kQK / 2; ++j) {
      dst[j] = static_cast<float>((b.qs[j] & 0x0f) - 8) * d;
      dst[j + kQK / 2] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const void* src, float* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i, dst += kQK) {
    const auto b = load_block<BlockQ4_1>(src, i);
    const float d = fp16_to_fp32(b.d);
    const float m = fp16_to_fp32(b.m);
    for (uint32_t j = 0; j < kQK / 2; ++j) {
      dst[j] = static_cast<float>(b.qs[j] & 0x0f) * d + m;
      dst[j + kQK / 2] = static_cast<float>(b.qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_q5_0(const void* src, float* dst, int64_t blocks) {
  int q[kQK];
  for (int64_t i = 0; i < blocks; ++i, dst += kQK) {
    const auto b = load_block<BlockQ5_0>(src, i);
    const float d = fp16_to_fp32(b.d);
    unpack_5bit(b.qs, b.qh, q);
    for (uint32_t j = 0; j < kQK; ++j) dst[j] = static_cast<float>(q[j] - 16) * d;
  }
}

void dequantize_q5_1(const void* src, float* dst, int64_t blocks) {
  int q[kQK];
  for (int64_t i = 0; i < blocks; ++i, dst += kQK) {
    const auto b = load_block<BlockQ5_1>(src, i);
    const float d = fp16_to_fp32(b.d);
    const float m = fp16_to_fp32(b.m);
    unpack_5bit(b.qs, b.qh, q);
    for (uint32_t j = 0; j < kQK; ++j) dst[j] = static_cast<float>(q[j]) * d + m;
  }
}

void dequantize_q8_0(const void* src, float* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i, dst += kQK) {
    const auto b = load_block<BlockQ8_0>(src, i);
    const float d = fp16_to_fp32(b.d);
    for (uint32_t j = 0; j < kQK; ++j) dst[j] = static_cast<float>(b.qs[j]) * d;
  }
}

void quantize_q4_0(const float* src, void* dst, int64_t blocks) {
  uint8_t q[kQK];
  for (int64_t i = 0; i < blocks; ++i, src += kQK) {
    BlockQ4_0 b;
    b.d = fp32_to_fp16(symmetric_codes(src, 4, q));
    pack_nibbles(q, b.qs);
    store_block(dst, i, b);
  }
}

void quantize_q4_1(const float* src, void* dst, int64_t blocks) {
  uint8_t q[kQK];
  for (int64_t i = 0; i < blocks; ++i, src += kQK) {
    BlockQ4_1 b;
    float min = 0.0f;
    b.d = fp32_to_fp16(affine_codes(src, 4, q, &min));
    b.m = fp32_to_fp16(min);
    pack_nibbles(q, b.qs);
    store_block(dst, i, b);
  }
}

void quantize_q5_0(const float* src, void* dst, int64_t blocks) {
  uint8_t q[kQK];
  for (int64_t i = 0; i < blocks; ++i, src += kQK) {
    BlockQ5_0 b;
    b.d = fp32_to_fp16(symmetric_codes(src, 5, q));
    pack_nibbles(q, b.qs);
    pack_high_bits(q, b.qh);
    store_block(dst, i, b);
  }
}

void quantize_q5_1(const float* src, void* dst, int64_t blocks) {
  uint8_t q[kQK];
  for (int64_t i = 0; i < blocks; ++i, src += kQK) {
    BlockQ5_1 b;
    float min = 0.0f;
    b.d = fp32_to_fp16(affine_codes(src, 5, q, &min));
    b.m = fp32_to_fp16(min);
    pack_nibbles(q, b.qs);
    pack_high_bits(q, b.qh);
    store_block(dst, i, b);
  }
}

// q8_0: d = absmax / 127, codes round(x / d) half away from zero (std::round), in [-127, 127].
void quantize_q8_0(const float* src, void* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i, src += kQK) {
    float amax = 0.0f;
    for (uint32_t j = 0; j < kQK; ++j) amax = std::fabs(src[j]) > amax ? std::fabs(src[j]) : amax;
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_0 b;
    b.d = fp32_to_fp16(d);
    for (uint32_t j = 0; j < kQK; ++j) b.qs[j] = static_cast<int8_t>(std::round(src[j] * id));
    store_block(dst, i, b);
  }
}

}  // namespace dflash::codec

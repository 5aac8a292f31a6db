#include "support/random_blocks.h"

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

#include "tensor/half.h"

namespace dflash::test {

std::vector<size_t> half_scale_fields(DType t) {
  switch (t) {
    case DType::kQ4_0: return {offsetof(BlockQ4_0, d)};
    case DType::kQ4_1: return {offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)};
    case DType::kQ5_0: return {offsetof(BlockQ5_0, d)};
    case DType::kQ5_1: return {offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)};
    case DType::kQ8_0: return {offsetof(BlockQ8_0, d)};
    case DType::kQ2_K: return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
    case DType::kQ3_K: return {offsetof(BlockQ3_K, d)};
    case DType::kQ4_K: return {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)};
    case DType::kQ5_K: return {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)};
    case DType::kQ6_K: return {offsetof(BlockQ6_K, d)};
    default: return {};
  }
}

uint16_t random_half_scale(std::mt19937& rng) {
  std::uniform_int_distribution<int> kind(0, 19);
  std::uniform_real_distribution<float> exponent(-20.0f, 6.0f);
  const uint16_t sign = (rng() & 1) ? 0x8000 : 0;
  switch (kind(rng)) {
    case 0: return sign;                                               // zero
    case 1: return static_cast<uint16_t>(sign | (1 + rng() % 0x3ff));  // subnormal
    default: return static_cast<uint16_t>(sign | fp32_to_fp16(std::exp2(exponent(rng))));
  }
}

uint16_t random_nonfinite_half_scale(std::mt19937& rng) {
  const uint16_t sign = (rng() & 1) ? 0x8000 : 0;
  switch (rng() % 4) {
    case 0: return static_cast<uint16_t>(sign | 0x7c00u);                          // inf
    case 1: return static_cast<uint16_t>(sign | 0x7c00u | (1 + rng() % 0x3ffu));  // NaN
    default: return random_half_scale(rng);
  }
}

void randomize_block_scales(DType t, uint8_t* bytes, size_t n, std::mt19937& rng, bool nonfinite) {
  const auto info = dtype_info(t);
  if (!info || !info->quantized) return;
  std::uniform_real_distribution<float> exponent(-30.0f, 10.0f);
  for (size_t off = 0; off + info->block_bytes <= n; off += info->block_bytes) {
    uint8_t* block = bytes + off;
    if (t == DType::kQ8_K) {  // fp32 d
      float d = ((rng() & 1) ? -1.0f : 1.0f) * std::exp2(exponent(rng));
      if (nonfinite && rng() % 2) d = (rng() % 2) ? std::numeric_limits<float>::infinity() : std::nanf("");
      std::memcpy(block + offsetof(BlockQ8_K, d), &d, sizeof d);
      continue;
    }
    for (size_t field : half_scale_fields(t)) {
      const uint16_t h = nonfinite ? random_nonfinite_half_scale(rng) : random_half_scale(rng);
      std::memcpy(block + field, &h, sizeof h);
    }
  }
}

std::vector<uint8_t> random_blocks(DType t, int64_t blocks, std::mt19937& rng) {
  std::vector<uint8_t> bytes(dtype_info(t)->block_bytes * static_cast<size_t>(blocks));
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  randomize_block_scales(t, bytes.data(), bytes.size(), rng);
  return bytes;
}

}  // namespace dflash::test

// Half-width floats: IEEE binary16 (fp16) and bfloat16 (bf16) to and from fp32, bit-identical with ggml.
//
// Both are held as raw uint16_t bit patterns (as in GGUF files and the ggml block structs).
//   fp16: 1 sign, 5 exponent (bias 15), 10 mantissa.  bf16: 1 sign, 8 exponent (bias 127), 7 mantissa,
//   i.e. the top half of an fp32.
// Widening is exact. Narrowing rounds to nearest, ties to even, the way ggml's reference conversions do:
//   fp32 -> fp16: subnormal results kept, |x| >= 65520 becomes inf, every NaN becomes the quiet NaN
//                 0x7e00 with x's sign (ggml's portable conversion drops NaN payloads).
//   fp32 -> bf16: NaN keeps its top payload bits and is forced quiet (bit 6 of the bf16); finite values
//                 that round past the largest bf16 become inf; fp32 subnormals are rounded, not flushed.
#pragma once

#include <bit>
#include <cstdint>

namespace dflash {

constexpr float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {
    // inf stays inf; a NaN keeps its payload and comes out quiet, as x86 arithmetic on it would.
    return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
  }
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
  if (mant == 0) return std::bit_cast<float>(sign);
  // Subnormal fp16: mant * 2^-24 with the leading one at bit p, i.e. 1.f * 2^(p - 24), a normal fp32.
  const uint32_t p = 31u - static_cast<uint32_t>(std::countl_zero(mant));
  const uint32_t frac = (mant << (10u - p)) & 0x3ffu;  // drop the leading one (it becomes implicit)
  return std::bit_cast<float>(sign | ((p + 127u - 24u) << 23) | (frac << 13));
}

constexpr uint16_t fp32_to_fp16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;     // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;    // >= 65520 (halfway past 65504) or inf
  const uint32_t exp = abs >> 23;
  if (exp >= 113) {
    // Normal fp16: rebias the exponent, keep 10 of 23 mantissa bits, round the 13 dropped bits to even.
    // A carry out of the mantissa correctly bumps the exponent.
    uint32_t h = ((exp - 112) << 10) | ((abs >> 13) & 0x3ffu);
    const uint32_t rest = abs & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  // Subnormal (or zero) fp16: result = round(|f| / 2^-24) with |f| = m * 2^(exp - 150), m with implicit bit.
  // That is m >> (126 - exp), rounded to even; below 2^-25 everything rounds to zero.
  const uint32_t shift = 126 - exp;
  if (shift > 24) return sign;
  const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
  uint32_t h = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

constexpr float bf16_to_fp32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

constexpr uint16_t fp32_to_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  // Add just under half an ulp of the result (plus one when the kept lsb is odd): ties go to even.
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Row forms over n elements (n >= 0; src and dst must not overlap).
void fp16_to_fp32_row(const uint16_t* src, float* dst, int64_t n);
void fp32_to_fp16_row(const float* src, uint16_t* dst, int64_t n);
void bf16_to_fp32_row(const uint16_t* src, float* dst, int64_t n);
void fp32_to_bf16_row(const float* src, uint16_t* dst, int64_t n);

}  // namespace dflash

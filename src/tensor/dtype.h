// DType: the element types a tensor can hold (float and ggml block-quantized), with their block layouts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "base/status.h"

namespace dflash {

// Values equal ggml's `enum ggml_type`, so GGUF files store them as they are.
enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

struct DTypeInfo {
  DType type;
  std::string_view name;  // ggml's name: "f32", "q4_K", ...
  uint32_t block_elems;   // elements per block (1 for plain types)
  uint32_t block_bytes;   // bytes per block
  bool quantized;
};

// Layout facts for a type this build knows; nullopt for ids it does not (e.g. IQ types).
std::optional<DTypeInfo> dtype_info(DType t);
std::optional<DTypeInfo> dtype_info(uint32_t ggml_type_id);
std::string_view dtype_name(DType t);
// Accepts ggml's names in any case ("q4_k", "Q4_K", "bf16").
std::optional<DType> dtype_from_name(std::string_view name);

// Bytes of a row of `n` elements; error when n is not a multiple of the block size or overflows.
Result<uint64_t> row_bytes(DType t, uint64_t n);

inline constexpr uint32_t kQK = 32;     // elements per block of the legacy quant types
inline constexpr uint32_t kQK_K = 256;  // elements per super-block of the k-quants
inline constexpr uint32_t kKScaleBytes = 12;  // packed 6-bit scales/mins of q4_K and q5_K

// Block layouts, byte-compatible with ggml's (static_asserts below pin the sizes).
// `uint16_t` fields named d/m/dmin hold IEEE half floats.
struct BlockQ4_0 { uint16_t d; uint8_t qs[kQK / 2]; };
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[kQK / 2]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
struct BlockQ5_1 { uint16_t d; uint16_t m; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[kQK]; };
struct BlockQ8_1 { uint16_t d; uint16_t s; int8_t qs[kQK]; };
struct BlockQ2_K { uint8_t scales[kQK_K / 16]; uint8_t qs[kQK_K / 4]; uint16_t d; uint16_t dmin; };
struct BlockQ3_K { uint8_t hmask[kQK_K / 8]; uint8_t qs[kQK_K / 4]; uint8_t scales[12]; uint16_t d; };
struct BlockQ4_K { uint16_t d; uint16_t dmin; uint8_t scales[kKScaleBytes]; uint8_t qs[kQK_K / 2]; };
struct BlockQ5_K { uint16_t d; uint16_t dmin; uint8_t scales[kKScaleBytes]; uint8_t qh[kQK_K / 8]; uint8_t qs[kQK_K / 2]; };
struct BlockQ6_K { uint8_t ql[kQK_K / 2]; uint8_t qh[kQK_K / 4]; int8_t scales[kQK_K / 16]; uint16_t d; };
struct BlockQ8_K { float d; int8_t qs[kQK_K]; int16_t bsums[kQK_K / 16]; };

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

}  // namespace dflash

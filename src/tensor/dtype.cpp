#include "tensor/dtype.h"

#include <array>
#include <cctype>

#include "base/checked_math.h"

namespace dflash {
namespace {

constexpr std::array<DTypeInfo, 20> kInfos = {{
    {DType::kF32, "f32", 1, 4, false},
    {DType::kF16, "f16", 1, 2, false},
    {DType::kQ4_0, "q4_0", kQK, sizeof(BlockQ4_0), true},
    {DType::kQ4_1, "q4_1", kQK, sizeof(BlockQ4_1), true},
    {DType::kQ5_0, "q5_0", kQK, sizeof(BlockQ5_0), true},
    {DType::kQ5_1, "q5_1", kQK, sizeof(BlockQ5_1), true},
    {DType::kQ8_0, "q8_0", kQK, sizeof(BlockQ8_0), true},
    {DType::kQ8_1, "q8_1", kQK, sizeof(BlockQ8_1), true},
    {DType::kQ2_K, "q2_K", kQK_K, sizeof(BlockQ2_K), true},
    {DType::kQ3_K, "q3_K", kQK_K, sizeof(BlockQ3_K), true},
    {DType::kQ4_K, "q4_K", kQK_K, sizeof(BlockQ4_K), true},
    {DType::kQ5_K, "q5_K", kQK_K, sizeof(BlockQ5_K), true},
    {DType::kQ6_K, "q6_K", kQK_K, sizeof(BlockQ6_K), true},
    {DType::kQ8_K, "q8_K", kQK_K, sizeof(BlockQ8_K), true},
    {DType::kI8, "i8", 1, 1, false},
    {DType::kI16, "i16", 1, 2, false},
    {DType::kI32, "i32", 1, 4, false},
    {DType::kI64, "i64", 1, 8, false},
    {DType::kF64, "f64", 1, 8, false},
    {DType::kBF16, "bf16", 1, 2, false},
}};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

}  // namespace

std::optional<DTypeInfo> dtype_info(DType t) {
  for (const auto& i : kInfos)
    if (i.type == t) return i;
  return std::nullopt;
}

std::optional<DTypeInfo> dtype_info(uint32_t ggml_type_id) { return dtype_info(static_cast<DType>(ggml_type_id)); }

std::string_view dtype_name(DType t) {
  auto i = dtype_info(t);
  return i ? i->name : std::string_view("unknown");
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& i : kInfos)
    if (iequals(i.name, name)) return i.type;
  return std::nullopt;
}

Result<uint64_t> row_bytes(DType t, uint64_t n) {
  auto info = dtype_info(t);
  if (!info) return unsupported("tensor type id {} is not supported", static_cast<uint32_t>(t));
  if (n % info->block_elems != 0)
    return invalid_argument("a row of {} elements is not a multiple of the {} block size {}", n, info->name,
                            info->block_elems);
  auto bytes = checked_mul(n / info->block_elems, info->block_bytes);
  if (!bytes) return invalid_argument("row of {} {} elements overflows", n, info->name);
  return *bytes;
}

}  // namespace dflash

// The device form of weights (weight_form.h): the host side.
#include "ops/cuda/weight_form.h"

#include <climits>
#include <cstddef>
#include <cstring>

#include "tensor/dtype.h"

namespace dflash::cuda {

static_assert(offsetof(BlockQ6_K, d) == kQ6Body && sizeof(BlockQ6_K) == kQ6Body + 2);

int64_t device_row_bytes(DType type, int64_t cols) {
  if (cols < 0) return -1;
  if (type == DType::kQ6_K) return cols % kQK_K == 0 ? q6k_row_bytes(cols / kQK_K) : -1;
  const auto rb = row_bytes(type, static_cast<uint64_t>(cols));
  if (!rb.ok() || *rb > static_cast<uint64_t>(INT64_MAX)) return -1;
  return static_cast<int64_t>(*rb);
}

int device_weight_align(DType type) { return type == DType::kQ6_K ? 16 : 1; }

bool to_device_form(DType type, const void* src, int64_t rows, int64_t cols, void* dst) {
  const int64_t drb = device_row_bytes(type, cols);
  if (drb < 0 || rows < 0) return false;
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  if (type != DType::kQ6_K) {
    std::memcpy(d, s, static_cast<size_t>(drb) * static_cast<size_t>(rows));
    return true;
  }
  const int64_t blocks = cols / kQK_K, srb = blocks * static_cast<int64_t>(sizeof(BlockQ6_K));
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* in = s + r * srb;
    uint8_t* out = d + r * drb;
    std::memset(out + q6k_d_offset(blocks, 0), 0, static_cast<size_t>(drb - kQ6Body * blocks));
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = in + b * static_cast<int64_t>(sizeof(BlockQ6_K));
      std::memcpy(out + b * kQ6Body, blk, kQ6Body);
      std::memcpy(out + q6k_d_offset(blocks, b), blk + kQ6Body, 2);
    }
  }
  return true;
}

}  // namespace dflash::cuda

// The device form of weights (weight_form.h): the host side.
#include "ops/cuda/weight_form.h"

#include <climits>
#include <cstddef>
#include <cstring>
#include <optional>

#include "tensor/dtype.h"

namespace dflash::cuda {

static_assert(offsetof(BlockQ6_K, d) == kQ6Body && sizeof(BlockQ6_K) == kQ6Body + 2);
static_assert(offsetof(BlockQ8_0, qs) == 2 && sizeof(BlockQ8_0) == kQ80Body + 2);
static_assert(offsetof(BlockQ4_0, qs) == 2 && sizeof(BlockQ4_0) == kQ40Body + 2);
static_assert(sizeof(BlockQ3_K) + 2 == kQ3Stride && kQ3Stride % 16 == 0);
static_assert(offsetof(BlockQ2_K, qs) == 16 && offsetof(BlockQ2_K, d) == kQ2Body && sizeof(BlockQ2_K) == kQ2Body + 4);

namespace {

// A split form's facts: elements a block, body bytes, where the body and d sit in the stored block, d's bytes.
struct Split {
  int64_t elems;
  int body, body_at, d_at, d_bytes;
};
std::optional<Split> split_of(DType type) {
  if (type == DType::kQ6_K) return Split{kQK_K, kQ6Body, 0, kQ6Body, 2};
  if (type == DType::kQ8_0) return Split{kQK, kQ80Body, 2, 0, 2};
  if (type == DType::kQ4_0) return Split{kQK, kQ40Body, 2, 0, 2};
  if (type == DType::kQ2_K) return Split{kQK_K, kQ2Body, 0, kQ2Body, 4};
  return std::nullopt;
}

// A padded form's facts: elements a block, its stored bytes, and the stride its blocks keep in a device row.
struct Padded {
  int64_t elems;
  int stored, stride;
};
std::optional<Padded> padded_of(DType type) {
  if (type == DType::kQ3_K) return Padded{kQK_K, static_cast<int>(sizeof(BlockQ3_K)), kQ3Stride};
  return std::nullopt;
}

}  // namespace

int64_t device_row_bytes(DType type, int64_t cols) {
  if (cols < 0) return -1;
  if (const auto sp = split_of(type))
    return cols % sp->elems == 0 ? split_row_bytes(cols / sp->elems, sp->body, sp->d_bytes) : -1;
  if (const auto pd = padded_of(type)) {
    if (cols % pd->elems != 0 || cols / pd->elems > INT64_MAX / pd->stride) return -1;
    return cols / pd->elems * pd->stride;
  }
  const auto rb = row_bytes(type, static_cast<uint64_t>(cols));
  if (!rb.ok() || *rb > static_cast<uint64_t>(INT64_MAX)) return -1;
  return static_cast<int64_t>(*rb);
}

int device_weight_align(DType type) { return split_of(type) || padded_of(type) ? 16 : 1; }

bool to_device_form(DType type, const void* src, int64_t rows, int64_t cols, void* dst) {
  const int64_t drb = device_row_bytes(type, cols);
  if (drb < 0 || rows < 0) return false;
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  if (const auto pd = padded_of(type)) {
    const int64_t blocks = rows * (cols / pd->elems);  // rows are whole blocks, so the blocks run on
    for (int64_t b = 0; b < blocks; ++b) {
      std::memcpy(d + b * pd->stride, s + b * pd->stored, static_cast<size_t>(pd->stored));
      std::memset(d + b * pd->stride + pd->stored, 0, static_cast<size_t>(pd->stride - pd->stored));
    }
    return true;
  }
  const auto sp = split_of(type);
  if (!sp) {
    std::memcpy(d, s, static_cast<size_t>(drb) * static_cast<size_t>(rows));
    return true;
  }
  const int64_t blocks = cols / sp->elems, stored = sp->body + sp->d_bytes, srb = blocks * stored;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* in = s + r * srb;
    uint8_t* out = d + r * drb;
    std::memset(out + sp->body * blocks, 0, static_cast<size_t>(drb - sp->body * blocks));
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = in + b * stored;
      std::memcpy(out + b * sp->body, blk + sp->body_at, static_cast<size_t>(sp->body));
      std::memcpy(out + split_d_offset(blocks, sp->body, b, sp->d_bytes), blk + sp->d_at,
                  static_cast<size_t>(sp->d_bytes));
    }
  }
  return true;
}

}  // namespace dflash::cuda

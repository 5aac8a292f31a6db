// Dispatch from DType to the row codecs, and the multithreaded whole-tensor conversion.
#include "tensor/quant.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "base/checked_math.h"
#include "tensor/half.h"
#include "tensor/quant_codecs.h"

namespace dflash {
namespace {

// Codecs work on whole blocks; for the plain float types a "block" is one element.
using DecodeFn = void (*)(const void* src, float* dst, int64_t blocks);
using EncodeFn = void (*)(const float* src, void* dst, int64_t blocks);

struct RowCodec {
  DType type;
  DecodeFn decode;
  EncodeFn encode;
};

void decode_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void encode_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
// Half-float rows may sit at any byte offset of a file mapping, so elements go through memcpy (which
// compiles to plain 2-byte loads and stores).
template <uint16_t (*narrow)(float)>
void encode_half(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = narrow(src[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}
template <float (*widen)(uint16_t)>
void decode_half(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    dst[i] = widen(h);
  }
}
void decode_f16(const void* src, float* dst, int64_t n) { decode_half<fp16_to_fp32>(src, dst, n); }
void encode_f16(const float* src, void* dst, int64_t n) { encode_half<fp32_to_fp16>(src, dst, n); }
void decode_bf16(const void* src, float* dst, int64_t n) { decode_half<bf16_to_fp32>(src, dst, n); }
void encode_bf16(const float* src, void* dst, int64_t n) { encode_half<fp32_to_bf16>(src, dst, n); }

constexpr RowCodec kCodecs[] = {
    {DType::kF32, decode_f32, encode_f32},
    {DType::kF16, decode_f16, encode_f16},
    {DType::kBF16, decode_bf16, encode_bf16},
    {DType::kQ4_0, codec::dequantize_q4_0, codec::quantize_q4_0},
    {DType::kQ4_1, codec::dequantize_q4_1, codec::quantize_q4_1},
    {DType::kQ5_0, codec::dequantize_q5_0, codec::quantize_q5_0},
    {DType::kQ5_1, codec::dequantize_q5_1, codec::quantize_q5_1},
    {DType::kQ8_0, codec::dequantize_q8_0, codec::quantize_q8_0},
    {DType::kQ2_K, codec::dequantize_q2_K, codec::quantize_q2_K},
    {DType::kQ3_K, codec::dequantize_q3_K, codec::quantize_q3_K},
    {DType::kQ4_K, codec::dequantize_q4_K, codec::quantize_q4_K},
    {DType::kQ5_K, codec::dequantize_q5_K, codec::quantize_q5_K},
    {DType::kQ6_K, codec::dequantize_q6_K, codec::quantize_q6_K},
    {DType::kQ8_K, codec::dequantize_q8_K, codec::quantize_q8_K},
};

const RowCodec* find_codec(DType t) {
  for (const auto& c : kCodecs)
    if (c.type == t) return &c;
  return nullptr;
}

// The codec for t and the number of blocks in a row of n elements, or why there is none.
Status check_row(DType t, int64_t n, const RowCodec** codec, int64_t* blocks) {
  *codec = find_codec(t);
  if (*codec == nullptr)
    return unsupported("conversion to or from {} (type id {}) is not supported", dtype_name(t),
                       static_cast<uint32_t>(t));
  if (n < 0) return invalid_argument("row length {} is negative", n);
  const auto info = dtype_info(t);  // present for every codec type
  if (n % info->block_elems != 0)
    return invalid_argument("a row of {} elements is not a multiple of the {} block size {}", n, info->name,
                            info->block_elems);
  *blocks = n / info->block_elems;
  return Status();
}

}  // namespace

bool row_conversion_supported(DType t) { return find_codec(t) != nullptr; }

Status dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const RowCodec* codec = nullptr;
  int64_t blocks = 0;
  DF_RETURN_IF_ERROR(check_row(t, n, &codec, &blocks));
  codec->decode(src, dst, blocks);
  return Status();
}

Status quantize_row(DType t, const float* src, void* dst, int64_t n) {
  const RowCodec* codec = nullptr;
  int64_t blocks = 0;
  DF_RETURN_IF_ERROR(check_row(t, n, &codec, &blocks));
  codec->encode(src, dst, blocks);
  return Status();
}

Status convert_rows(DType src_type, const void* src, DType dst_type, void* dst, int64_t rows, int64_t cols,
                    int threads) {
  const RowCodec* from = nullptr;
  const RowCodec* to = nullptr;
  int64_t src_blocks = 0, dst_blocks = 0;
  DF_RETURN_IF_ERROR(check_row(src_type, cols, &from, &src_blocks).with_context("source: "));
  DF_RETURN_IF_ERROR(check_row(dst_type, cols, &to, &dst_blocks).with_context("destination: "));
  if (rows < 0) return invalid_argument("row count {} is negative", rows);
  DF_ASSIGN_OR_RETURN(const uint64_t src_row, row_bytes(src_type, static_cast<uint64_t>(cols)));
  DF_ASSIGN_OR_RETURN(const uint64_t dst_row, row_bytes(dst_type, static_cast<uint64_t>(cols)));
  const auto src_total = checked_mul(src_row, static_cast<uint64_t>(rows));
  const auto dst_total = checked_mul(dst_row, static_cast<uint64_t>(rows));
  if (!src_total || !dst_total) return invalid_argument("a {} x {} tensor overflows the address space", rows, cols);
  if (rows == 0 || cols == 0) return Status();
  if (src_type == dst_type) {
    std::memcpy(dst, src, *src_total);
    return Status();
  }

  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  // Rows [begin, end): straight into dst when it is f32, straight from src when that is f32, else via
  // one row of fp32 scratch per worker.
  auto convert_range = [=](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    if (src_type != DType::kF32 && dst_type != DType::kF32) scratch.resize(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* s = in + static_cast<uint64_t>(r) * src_row;
      uint8_t* d = out + static_cast<uint64_t>(r) * dst_row;
      if (dst_type == DType::kF32) {
        from->decode(s, reinterpret_cast<float*>(d), src_blocks);
      } else if (src_type == DType::kF32) {
        to->encode(reinterpret_cast<const float*>(s), d, dst_blocks);
      } else {
        from->decode(s, scratch.data(), src_blocks);
        to->encode(scratch.data(), d, dst_blocks);
      }
    }
  };

  int64_t workers = threads > 0 ? threads : static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  workers = std::min(workers, rows);
  const int64_t per_worker = (rows + workers - 1) / workers;
  std::vector<std::thread> pool;
  int64_t next = 0;  // first row not yet handed to a thread
  try {
    pool.reserve(static_cast<size_t>(workers - 1));
    // The calling thread takes the last range itself.
    while (static_cast<int64_t>(pool.size()) + 1 < workers && next + per_worker < rows) {
      pool.emplace_back(convert_range, next, next + per_worker);
      next += per_worker;
    }
  } catch (const std::exception&) {  // std::system_error, or bad_alloc from reserve
    // Could not start another thread: the caller converts whatever was not handed out.
  }
  convert_range(next, rows);
  for (auto& t : pool) t.join();
  return Status();
}

}  // namespace dflash

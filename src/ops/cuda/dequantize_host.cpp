// Argument checks and CUDA-error-to-Status glue for the dequantization kernels (dequantize.cu).
#include "ops/cuda/dequantize_host.h"

#include <climits>
#include <cstddef>

#include "base/checked_math.h"
#include "ops/cuda/dequantize.h"
#include "ops/cuda/weight_form.h"

namespace dflash::cuda {
namespace {

// dequantize.cu cannot include tensor/dtype.h (nvcc rejects fmt), so it restates the type ids and the
// block layouts; pin here the facts it relies on.
static_assert(static_cast<uint32_t>(DType::kF32) == 0 && static_cast<uint32_t>(DType::kF16) == 1 &&
              static_cast<uint32_t>(DType::kBF16) == 30 && static_cast<uint32_t>(DType::kQ4_0) == 2 &&
              static_cast<uint32_t>(DType::kQ4_1) == 3 && static_cast<uint32_t>(DType::kQ5_0) == 6 &&
              static_cast<uint32_t>(DType::kQ5_1) == 7 && static_cast<uint32_t>(DType::kQ8_0) == 8 &&
              static_cast<uint32_t>(DType::kQ2_K) == 10 && static_cast<uint32_t>(DType::kQ3_K) == 11 &&
              static_cast<uint32_t>(DType::kQ4_K) == 12 && static_cast<uint32_t>(DType::kQ5_K) == 13 &&
              static_cast<uint32_t>(DType::kQ6_K) == 14 && static_cast<uint32_t>(DType::kQ8_K) == 15);
static_assert(offsetof(BlockQ4_1, qs) == 4 && offsetof(BlockQ5_0, qh) == 2 && offsetof(BlockQ5_0, qs) == 6 &&
              offsetof(BlockQ5_1, qh) == 4 && offsetof(BlockQ5_1, qs) == 8 && offsetof(BlockQ8_0, qs) == 2);
static_assert(offsetof(BlockQ2_K, qs) == 16 && offsetof(BlockQ2_K, d) == 80 && offsetof(BlockQ2_K, dmin) == 82);
static_assert(offsetof(BlockQ3_K, qs) == 32 && offsetof(BlockQ3_K, scales) == 96 && offsetof(BlockQ3_K, d) == 108);
static_assert(offsetof(BlockQ4_K, scales) == 4 && offsetof(BlockQ4_K, qs) == 16);
static_assert(offsetof(BlockQ5_K, scales) == 4 && offsetof(BlockQ5_K, qh) == 16 && offsetof(BlockQ5_K, qs) == 48);
static_assert(offsetof(BlockQ6_K, qh) == 128 && offsetof(BlockQ6_K, scales) == 192 && offsetof(BlockQ6_K, d) == 208);
static_assert(offsetof(BlockQ8_K, qs) == 4);

template <typename Out>
Status run_checked(DType type, const void* src, Out* dst, int64_t rows, int64_t cols, cudaStream_t stream,
                   const char* out_name) {
  const auto info = dtype_info(type);
  if (!info || !dequantize_supported(type))
    return unsupported("dequantizing {} (type id {}) on the GPU is not supported", dtype_name(type),
                       static_cast<uint32_t>(type));
  if (rows < 0 || cols < 0) return invalid_argument("dequantize {}: negative shape {} x {}", info->name, rows, cols);
  if (cols % info->block_elems != 0)
    return invalid_argument("dequantize {}: a row of {} elements is not a multiple of the block size {}", info->name,
                            cols, info->block_elems);
  const int64_t device_rb = device_row_bytes(type, cols);
  if (device_rb < 0) return invalid_argument("dequantize {}: no device form for rows of {} elements", info->name, cols);
  const auto row_size = static_cast<uint64_t>(device_rb);
  const auto src_bytes = checked_mul(row_size, static_cast<uint64_t>(rows));
  const auto elems = checked_mul(static_cast<uint64_t>(rows), static_cast<uint64_t>(cols));
  const auto dst_bytes = elems ? checked_mul(*elems, sizeof(Out)) : std::nullopt;
  if (!src_bytes || !dst_bytes || *src_bytes > INT64_MAX || *dst_bytes > INT64_MAX)
    return invalid_argument("dequantize {}: a {} x {} tensor overflows the address space", info->name, rows, cols);
  if (rows == 0 || cols == 0) return Status();
  if (src == nullptr || dst == nullptr)
    return invalid_argument("dequantize {}: null {} pointer for a {} x {} tensor", info->name,
                            src == nullptr ? "source" : "destination", rows, cols);
  if (!is_aligned(src, device_weight_align(type)))
    return invalid_argument("dequantize {}: the source must be {}-byte aligned (its device form)", info->name,
                            device_weight_align(type));
  const cudaError_t err = dequantize_rows(type, src, dst, rows, cols, stream);
  if (err != cudaSuccess)
    return io_error("dequantize {} ({} x {}) to {} on the GPU: {}", info->name, rows, cols, out_name,
                    cudaGetErrorString(err));
  return Status();
}

}  // namespace

Status dequantize_rows_to_f32(DType type, const void* src, float* dst, int64_t rows, int64_t cols,
                              cudaStream_t stream) {
  return run_checked(type, src, dst, rows, cols, stream, "f32");
}

Status dequantize_rows_to_bf16(DType type, const void* src, __nv_bfloat16* dst, int64_t rows, int64_t cols,
                               cudaStream_t stream) {
  return run_checked(type, src, dst, rows, cols, stream, "bf16");
}

Status dequantize_rows_to_f16(DType type, const void* src, __half* dst, int64_t rows, int64_t cols,
                              cudaStream_t stream) {
  return run_checked(type, src, dst, rows, cols, stream, "f16");
}

}  // namespace dflash::cuda

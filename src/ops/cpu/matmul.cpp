// matmul (y = x W^T with W in any row-convertible DType) and embedding_lookup.
//
// Work split: output rows in contiguous ranges over the pool. Each worker walks its range in tiles
// of a few rows, dequantizes the tile once into an f32 buffer (f32 weights are used in place), then
// multiplies it with every token in register blocks of 4 rows x 4 tokens. Each y[t, r] is one dot
// product in the fixed order of kernels_internal.h (8 lanes over k, then a fixed reduction), so the
// result does not depend on n, the tiling or the thread count: a token's row of a batched matmul is
// bit-identical with the same token alone. On x86-64 CPUs with AVX2+FMA the same loops are also
// compiled for that ISA and picked at run time (then the lane updates may be fused multiply-adds).
#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/cpu/kernels_internal.h"
#include "ops/cpu/ops.h"
#include "tensor/half.h"
#include "tensor/quant.h"

namespace dflash::cpu {
namespace {

using detail::kLanes;

constexpr int kMR = 4;  // rows per register block
constexpr int kMT = 4;  // tokens per register block

// y[t * ldy + r] = dot(w[r], x[t]) for r < R, t < T (the order of kernels_internal.h).
template <int R, int T>
DFLASH_ALWAYS_INLINE void micro_kernel(const float* const* w, const float* const* x, int64_t k_len, float* y,
                                       int64_t ldy) {
  using detail::V8;
  V8 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = detail::zero8();
  int64_t k = 0;
  for (; k + kLanes <= k_len; k += kLanes) {
    V8 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = detail::load8(w[r] + k);
    for (int t = 0; t < T; ++t) {
      const V8 xv = detail::load8(x[t] + k);
      for (int r = 0; r < R; ++r) acc[r][t] += wv[r] * xv;
    }
  }
  if (k < k_len) {
    const int64_t rest = k_len - k;
    for (int t = 0; t < T; ++t) {
      const V8 xv = detail::load_partial(x[t] + k, rest);
      for (int r = 0; r < R; ++r) acc[r][t] += detail::load_partial(w[r] + k, rest) * xv;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = detail::reduce_lanes(acc[r][t]);
}

template <int R>
DFLASH_ALWAYS_INLINE void micro_rows(int nt, const float* const* w, const float* const* x, int64_t k_len, float* y,
                                     int64_t ldy) {
  switch (nt) {
    case 1: micro_kernel<R, 1>(w, x, k_len, y, ldy); break;
    case 2: micro_kernel<R, 2>(w, x, k_len, y, ldy); break;
    case 3: micro_kernel<R, 3>(w, x, k_len, y, ldy); break;
    default: micro_kernel<R, 4>(w, x, k_len, y, ldy); break;
  }
}

// One tile: rows w[0..nr) (f32, k_len each) times all n tokens of x [n, k_len]; y points at the
// tile's first output column of row 0 of y [n, ldy].
DFLASH_ALWAYS_INLINE void tile_impl(const float* const* w, int nr, const float* x, int64_t n, int64_t k_len,
                                    float* y, int64_t ldy) {
  for (int64_t t0 = 0; t0 < n; t0 += kMT) {
    const int nt = static_cast<int>(std::min<int64_t>(kMT, n - t0));
    const float* xp[kMT];
    for (int t = 0; t < nt; ++t) xp[t] = x + (t0 + t) * k_len;
    float* yt = y + t0 * ldy;
    for (int r0 = 0; r0 < nr; r0 += kMR) {
      const int mr = std::min(kMR, nr - r0);
      switch (mr) {
        case 1: micro_rows<1>(nt, w + r0, xp, k_len, yt + r0, ldy); break;
        case 2: micro_rows<2>(nt, w + r0, xp, k_len, yt + r0, ldy); break;
        case 3: micro_rows<3>(nt, w + r0, xp, k_len, yt + r0, ldy); break;
        default: micro_rows<4>(nt, w + r0, xp, k_len, yt + r0, ldy); break;
      }
    }
  }
}

// Everything one worker does for output rows [begin, end).
struct Job {
  DType type;
  const uint8_t* base;  // weight rows, rb bytes each
  uint64_t rb;
  int64_t rows, cols, tile_rows;
  const float* x;
  int64_t n;
  float* y;
};

constexpr int kMaxTileRows = 16;

// q8_0 inline (the codec's value float(q) * d exactly: one rounding either way), so it vectorizes
// with the caller's ISA; the other types through dequantize_row.
DFLASH_ALWAYS_INLINE void dequantize_q8_0_row(const uint8_t* src, float* dst, int64_t cols) {
  for (int64_t b = 0; b < cols / kQK; ++b, src += sizeof(BlockQ8_0), dst += kQK) {
    uint16_t dh;
    std::memcpy(&dh, src, sizeof(dh));
    const float d = fp16_to_fp32(dh);
    const auto* qs = reinterpret_cast<const int8_t*>(src + sizeof(dh));  // byte access: no alignment, no aliasing issue
    for (uint32_t j = 0; j < kQK; ++j) dst[j] = static_cast<float>(qs[j]) * d;
  }
}

DFLASH_ALWAYS_INLINE void run_rows_impl(const Job& job, int64_t begin, int64_t end) {
  const int64_t cols = job.cols;
  const bool in_place = job.type == DType::kF32;
  std::vector<float> buf;
  if (!in_place) buf.resize(static_cast<size_t>(job.tile_rows * cols));
  const float* wrows[kMaxTileRows];
  for (int64_t r0 = begin; r0 < end; r0 += job.tile_rows) {
    const int nr = static_cast<int>(std::min(job.tile_rows, end - r0));
    for (int i = 0; i < nr; ++i) {
      const uint8_t* src = job.base + static_cast<uint64_t>(r0 + i) * job.rb;
      if (in_place) {
        wrows[i] = reinterpret_cast<const float*>(src);
        continue;
      }
      float* dst = buf.data() + i * cols;
      if (job.type == DType::kQ8_0)
        dequantize_q8_0_row(src, dst, cols);
      else
        (void)dequantize_row(job.type, src, dst, cols);  // validated by matmul: cannot fail
      wrows[i] = dst;
    }
    tile_impl(wrows, nr, job.x, job.n, cols, job.y + r0, job.rows);
  }
}

void run_rows_generic(const Job& job, int64_t begin, int64_t end) { run_rows_impl(job, begin, end); }

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) void run_rows_avx2(const Job& job, int64_t begin, int64_t end) {
  run_rows_impl(job, begin, end);
}
#endif

using RunRowsFn = void (*)(const Job&, int64_t, int64_t);

RunRowsFn pick_run_rows() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return run_rows_avx2;
#endif
  return run_rows_generic;
}

}  // namespace

Status matmul(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool) {
  if (!row_conversion_supported(w.type))
    return unsupported("matmul: weight type {} is not supported", dtype_name(w.type));
  if (w.rows < 0 || w.cols < 0 || n < 0)
    return invalid_argument("matmul: negative shape (rows {}, cols {}, n {})", w.rows, w.cols, n);
  DF_ASSIGN_OR_RETURN(const uint64_t rb, row_bytes(w.type, static_cast<uint64_t>(w.cols)));
  if (n == 0 || w.rows == 0) return Status();
  if (y == nullptr || (w.cols > 0 && (x == nullptr || w.data == nullptr)))
    return invalid_argument("matmul: null buffer");
  if (w.cols == 0) {
    std::fill(y, y + n * w.rows, 0.0f);
    return Status();
  }

  const int64_t rows = w.rows, cols = w.cols;
  // Rows dequantized at once, a multiple of the register block: for a few tokens one register block
  // (stays in L1 between dequantize and use), for more about 128 KiB of f32 (L2) to reuse across them.
  const int64_t tile_rows =
      n < kMT ? kMR : std::clamp<int64_t>((32768 / cols) / kMR * kMR, kMR, kMaxTileRows);
  const Job job{w.type, static_cast<const uint8_t*>(w.data), rb, rows, cols, tile_rows, x, n, y};
  static const RunRowsFn run_rows = pick_run_rows();  // first use, not static-init order
  pool.parallel_for(rows, tile_rows, [&](int64_t begin, int64_t end) { run_rows(job, begin, end); });
  return Status();
}

Status embedding_lookup(const WeightView& table, std::span<const int32_t> ids, float* out) {
  if (!row_conversion_supported(table.type))
    return unsupported("embedding_lookup: table type {} is not supported", dtype_name(table.type));
  if (table.rows < 0 || table.cols < 0)
    return invalid_argument("embedding_lookup: negative shape ({} x {})", table.rows, table.cols);
  DF_ASSIGN_OR_RETURN(const uint64_t rb, row_bytes(table.type, static_cast<uint64_t>(table.cols)));
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= table.rows)
      return invalid_argument("embedding_lookup: token id {} (position {}) is outside the vocabulary [0, {})", ids[i],
                              i, table.rows);
  if (ids.empty() || table.cols == 0) return Status();
  if (table.data == nullptr || out == nullptr) return invalid_argument("embedding_lookup: null buffer");
  const auto* base = static_cast<const uint8_t*>(table.data);
  for (size_t i = 0; i < ids.size(); ++i)
    DF_RETURN_IF_ERROR(dequantize_row(table.type, base + static_cast<uint64_t>(ids[i]) * rb,
                                      out + static_cast<int64_t>(i) * table.cols, table.cols));
  return Status();
}

}  // namespace dflash::cpu

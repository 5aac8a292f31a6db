// Sampling helpers (ops.h): per-row top-k with the row's log-sum-exp, the reference of Backend::top_k_rows.
#include <cmath>
#include <limits>

#include "ops/cpu/ops.h"

namespace dflash::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Entry {
  float value;
  int32_t col;
};

// a ranks before b: the larger value, ties to the lower column (-0 == +0 ties too).
inline bool ranks_before(const Entry& a, const Entry& b) {
  return a.value > b.value || (a.value == b.value && a.col < b.col);
}

// The k best of one row, best first, into ids/values. Columns come in increasing order, so an element
// equal to the worst kept one never displaces it (its column is larger).
void row_top_k(const float* row, int64_t cols, int64_t k, int32_t* ids, float* values) {
  Entry best[kMaxTopK];
  int64_t n = 0;
  for (int64_t j = 0; j < cols; ++j) {
    const float x = row[j];
    if (n == k && !(x > best[k - 1].value)) continue;  // the usual case; NaN lands here too
    const Entry e{std::isnan(x) ? -kInf : x, static_cast<int32_t>(j)};
    int64_t p = n < k ? n++ : k - 1;
    while (p > 0 && ranks_before(e, best[p - 1])) {
      best[p] = best[p - 1];
      --p;
    }
    best[p] = e;
  }
  for (int64_t i = 0; i < k; ++i) {
    ids[i] = best[i].col;
    values[i] = best[i].value;
  }
}

// log(sum_j exp(row[j])) for a row whose maximum (NaN as -inf) is `max`: in double throughout.
float row_lse(const float* row, int64_t cols, float max) {
  if (max == -kInf || max == kInf) return max;
  double sum = 0.0;
  for (int64_t j = 0; j < cols; ++j) {
    const float x = row[j];
    if (x > -kInf) sum += std::exp(static_cast<double>(x) - static_cast<double>(max));  // NaN fails the test
  }
  return static_cast<float>(static_cast<double>(max) + std::log(sum));
}

}  // namespace

Status check_top_k_rows(int64_t rows, int64_t cols, int64_t k) {
  if (rows < 0) return invalid_argument("top_k_rows: {} rows", rows);
  if (cols < 1 || cols > std::numeric_limits<int32_t>::max())
    return invalid_argument("top_k_rows: {} columns (must be in [1, {}])", cols, std::numeric_limits<int32_t>::max());
  if (k < 1 || k > kMaxTopK || k > cols)
    return invalid_argument("top_k_rows: k = {} must be in [1, min(columns {}, {})]", k, cols, kMaxTopK);
  return Status();
}

Status top_k_rows(const float* x, int64_t rows, int64_t cols, int64_t k, int32_t* ids, float* values, float* lse,
                  ThreadPool& pool) {
  DF_RETURN_IF_ERROR(check_top_k_rows(rows, cols, k));
  if (rows == 0) return Status();
  if (x == nullptr || ids == nullptr || values == nullptr)
    return invalid_argument("top_k_rows: null input, ids or values array");
  pool.parallel_for(rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x + r * cols;
      row_top_k(row, cols, k, ids + r * k, values + r * k);
      if (lse != nullptr) lse[r] = row_lse(row, cols, values[r * k]);
    }
  });
  return Status();
}

}  // namespace dflash::cpu

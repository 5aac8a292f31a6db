// cpu::top_k_rows (the reference of Backend::top_k_rows) against a full sort of each row and a double
// log-sum-exp: random rows with ties, -inf, NaN and signed zeros; k 1..16; 1 to 248320 columns; the
// special rows (all -inf, all NaN, +inf); the argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/cpu/ops.h"
#include "ops_test_util.h"

namespace dflash::cpu {
namespace {

using test::SeededRng;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// How a random row is drawn: plain normal logits; few distinct levels (many ties); or normal logits with
// -inf, NaN and signed zeros sprinkled in.
using test::Fill;
using test::fill_name;
using test::random_rows;

struct Expected {
  std::vector<int32_t> ids;
  std::vector<float> values;
  std::vector<double> lse;
};

// Every row fully sorted (value desc, column asc; NaN as -inf), and its log-sum-exp in long double.
Expected naive(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t k) {
  Expected e;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> v(x.begin() + r * cols, x.begin() + (r + 1) * cols);
    for (float& f : v)
      if (std::isnan(f)) f = -kInf;
    std::vector<int32_t> order(static_cast<size_t>(cols));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
    for (int64_t j = 0; j < k; ++j) {
      e.ids.push_back(order[static_cast<size_t>(j)]);
      e.values.push_back(v[static_cast<size_t>(order[static_cast<size_t>(j)])]);
    }
    const float mx = v[static_cast<size_t>(order[0])];
    if (std::isinf(mx)) {
      e.lse.push_back(mx);
      continue;
    }
    long double s = 0;
    for (float f : v) s += std::exp(static_cast<long double>(f) - mx);
    e.lse.push_back(static_cast<double>(mx + std::log(s)));
  }
  return e;
}

struct Got {
  std::vector<int32_t> ids;
  std::vector<float> values, lse;
};

Got run(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t k, ThreadPool& pool, bool with_lse = true) {
  Got g;
  g.ids.assign(static_cast<size_t>(rows * k), -7);
  g.values.assign(static_cast<size_t>(rows * k), kNaN);
  g.lse.assign(static_cast<size_t>(rows), kNaN);
  const Status st = top_k_rows(x.data(), rows, cols, k, g.ids.data(), g.values.data(), with_lse ? g.lse.data() : nullptr,
                               pool);
  EXPECT_TRUE(st.ok()) << st.message();
  return g;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_matches(const Got& got, const Expected& want, const std::string& what) {
  EXPECT_EQ(got.ids, want.ids) << what;
  EXPECT_TRUE(same_bits(got.values, want.values)) << what << ": values differ (bit for bit)";
  ASSERT_EQ(got.lse.size(), want.lse.size()) << what;
  for (size_t r = 0; r < want.lse.size(); ++r) {
    if (std::isinf(want.lse[r])) {
      EXPECT_EQ(got.lse[r], static_cast<float>(want.lse[r])) << what << " row " << r;
    } else {
      EXPECT_NEAR(got.lse[r], want.lse[r], 1e-6 * std::max(1.0, std::abs(want.lse[r]))) << what << " row " << r;
    }
  }
}

TEST(TopKRows, MatchesFullSortAndDoubleLogSumExp) {
  SeededRng s;
  ThreadPool pool(4);
  struct Case {
    int64_t rows, cols;
  };
  for (const Case c : {Case{1, 1}, Case{3, 7}, Case{5, 16}, Case{4, 31}, Case{9, 33}, Case{64, 100}, Case{6, 8192},
                       Case{2, 248320}})
    for (Fill fill : {Fill::kNormal, Fill::kTies, Fill::kSpecial})
      for (int64_t k : {1, 2, 3, 8, 16}) {
        if (k > c.cols) continue;
        const std::string what = "rows " + std::to_string(c.rows) + " cols " + std::to_string(c.cols) + " k " +
                                 std::to_string(k) + " fill " + std::to_string(static_cast<int>(fill));
        const auto x = random_rows(s.rng, c.rows, c.cols, fill);
        expect_matches(run(x, c.rows, c.cols, k, pool), naive(x, c.rows, c.cols, k), what);
      }
}

// An all -inf (or all NaN) row: values -inf, the first k columns in order, lse -inf. A row holding +inf:
// the +inf entries first by column, lse +inf. A NaN never outranks a finite value.
TEST(TopKRows, InfiniteAndNaNRows) {
  ThreadPool pool(2);
  const int64_t cols = 40, k = 5;
  std::vector<float> x(4 * cols, -kInf);
  std::fill(x.begin() + cols, x.begin() + 2 * cols, kNaN);
  for (int64_t j = 0; j < cols; ++j) x[2 * cols + j] = static_cast<float>(j % 7);
  x[2 * cols + 30] = kInf;
  x[2 * cols + 3] = kInf;
  for (int64_t j = 0; j < cols; ++j) x[3 * cols + j] = j % 3 == 0 ? kNaN : -1.0f - static_cast<float>(j);
  const Got g = run(x, 4, cols, k, pool);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(std::vector<int32_t>(g.ids.begin() + r * k, g.ids.begin() + (r + 1) * k), (std::vector<int32_t>{0, 1, 2, 3, 4}));
    for (int64_t j = 0; j < k; ++j) EXPECT_EQ(g.values[r * k + j], -kInf);
    EXPECT_EQ(g.lse[r], -kInf);
  }
  EXPECT_EQ(std::vector<int32_t>(g.ids.begin() + 2 * k, g.ids.begin() + 3 * k), (std::vector<int32_t>{3, 30, 6, 13, 20}));
  EXPECT_EQ(g.values[2 * k], kInf);
  EXPECT_EQ(g.values[2 * k + 1], kInf);
  EXPECT_EQ(g.values[2 * k + 2], 6.0f);
  EXPECT_EQ(g.lse[2], kInf);
  EXPECT_EQ(std::vector<int32_t>(g.ids.begin() + 3 * k, g.ids.begin() + 4 * k), (std::vector<int32_t>{1, 2, 4, 5, 7}));
  EXPECT_TRUE(std::isfinite(g.lse[3]));
  expect_matches(g, naive(x, 4, cols, k), "special rows");
}

// -0 and +0 tie (the lower column first), and each reports its own bits.
TEST(TopKRows, SignedZerosTieByColumn) {
  ThreadPool pool(1);
  const std::vector<float> x = {-1.0f, -0.0f, 0.0f, -0.0f, -2.0f};
  const Got g = run(x, 1, 5, 4, pool);
  EXPECT_EQ(g.ids, (std::vector<int32_t>{1, 2, 3, 0}));
  EXPECT_TRUE(std::signbit(g.values[0]));
  EXPECT_FALSE(std::signbit(g.values[1]));
  EXPECT_TRUE(std::signbit(g.values[2]));
}

TEST(TopKRows, SameResultWithoutLseAndOnAnyPoolSize) {
  SeededRng s;
  const int64_t rows = 13, cols = 3000, k = 16;
  const auto x = random_rows(s.rng, rows, cols, Fill::kTies);
  ThreadPool one(1), many(5);
  const Got a = run(x, rows, cols, k, one), b = run(x, rows, cols, k, many), c = run(x, rows, cols, k, many, false);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_TRUE(same_bits(a.values, b.values));
  EXPECT_TRUE(same_bits(a.lse, b.lse));
  EXPECT_EQ(a.ids, c.ids);
  EXPECT_TRUE(same_bits(a.values, c.values));
  EXPECT_TRUE(std::all_of(c.lse.begin(), c.lse.end(), [](float v) { return std::isnan(v); })) << "lse was written";
}

TEST(TopKRows, CpuBackendRunsTheReference) {
  SeededRng s;
  const int64_t rows = 7, cols = 500, k = 8;
  const auto x = random_rows(s.rng, rows, cols, Fill::kSpecial);
  CpuBackend be(3);
  Got g;
  g.ids.resize(rows * k);
  g.values.resize(rows * k);
  g.lse.resize(rows);
  ASSERT_TRUE(be.top_k_rows(x.data(), rows, cols, k, g.ids.data(), g.values.data(), g.lse.data()).ok());
  expect_matches(g, naive(x, rows, cols, k), "CpuBackend");
  EXPECT_FALSE(be.top_k_rows(x.data(), rows, cols, Backend::kMaxTopK + 1, g.ids.data(), g.values.data(), nullptr).ok());
}

TEST(TopKRows, RejectsBadShapesAndNullArrays) {
  ThreadPool pool(1);
  std::vector<float> x(64, 1.0f), values(64), lse(4);
  std::vector<int32_t> ids(64);
  const auto call = [&](int64_t rows, int64_t cols, int64_t k) {
    return top_k_rows(x.data(), rows, cols, k, ids.data(), values.data(), lse.data(), pool);
  };
  EXPECT_TRUE(call(2, 8, 8).ok());
  EXPECT_TRUE(call(0, 8, 8).ok());  // nothing to do
  EXPECT_EQ(call(-1, 8, 1).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(call(1, 0, 1).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(call(1, int64_t{1} << 31, 1).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(call(1, 8, 0).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(call(1, 8, 9).code(), ErrorCode::kInvalidArgument);   // k > cols
  EXPECT_EQ(call(1, 64, 17).code(), ErrorCode::kInvalidArgument);  // k > kMaxTopK
  EXPECT_FALSE(top_k_rows(nullptr, 1, 8, 1, ids.data(), values.data(), nullptr, pool).ok());
  EXPECT_FALSE(top_k_rows(x.data(), 1, 8, 1, nullptr, values.data(), nullptr, pool).ok());
  EXPECT_FALSE(top_k_rows(x.data(), 1, 8, 1, ids.data(), nullptr, nullptr, pool).ok());
  EXPECT_TRUE(top_k_rows(nullptr, 0, 8, 1, nullptr, nullptr, nullptr, pool).ok());
  EXPECT_TRUE(check_top_k_rows(3, 16, 16).ok());
  EXPECT_FALSE(check_top_k_rows(3, 15, 16).ok());
}

}  // namespace
}  // namespace dflash::cpu

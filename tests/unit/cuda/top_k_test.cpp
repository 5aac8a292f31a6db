// CudaBackend::top_k_rows (ops/cuda/top_k.h) against the CPU reference (cpu::top_k_rows): the same ids and
// the same value bits; lse within 1e-5 x max(1, |lse|) (float exponentials summed in double on the device,
// all double on the CPU). Rows 1..64 (one block a row, and rows split over many blocks with a second merge
// launch), columns 7, 33, 8192, 151936 and 248320, k 1, 2, 3, 8, 16; plain, tied (few levels) and special
// (-inf, NaN, signed zeros) values; rows of all -inf, all NaN, holding +inf. Host outputs are poisoned
// before each call; the kernels' device outputs with NaN words. A fresh seed per test, printed on failure
// (DFLASH_TEST_SEED=<n> replays it).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "decode/profiling_backend.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/top_k.h"
#include "support/cuda_test_util.h"
#include "support/test_paths.h"
#include "unit/ops/ops_test_util.h"

namespace dflash {
namespace {

using test::SeededRng;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

using test::Fill;
using test::fill_name;
using test::random_rows;

struct TopK {
  std::vector<int32_t> ids;
  std::vector<float> values, lse;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_same(const TopK& got, const TopK& want, bool with_lse, const std::string& what) {
  EXPECT_EQ(got.ids, want.ids) << what;
  EXPECT_TRUE(same_bits(got.values, want.values)) << what << ": values differ (bit for bit)";
  if (!with_lse) return;
  ASSERT_EQ(got.lse.size(), want.lse.size());
  for (size_t r = 0; r < want.lse.size(); ++r) {
    const float w = want.lse[r], g = got.lse[r];
    if (std::isinf(w)) {
      EXPECT_EQ(g, w) << what << " row " << r;
    } else {
      EXPECT_NEAR(g, w, 1e-5 * std::max(1.0, std::abs(double(w)))) << what << " row " << r;
    }
  }
}

class CudaTopK : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
    auto be = CudaBackend::create(0);
    ASSERT_TRUE(be.ok()) << be.status().to_string();
    be_ = std::move(be).value();
  }
  Buffer upload(const std::vector<float>& v) {
    auto b = be_->alloc(static_cast<int64_t>(v.size()));
    EXPECT_TRUE(b.ok());
    EXPECT_TRUE(be_->upload(b->data(), v.data(), static_cast<int64_t>(v.size())).ok());
    return std::move(b).value();
  }
  TopK reference(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t k) {
    TopK t{std::vector<int32_t>(rows * k), std::vector<float>(rows * k), std::vector<float>(rows)};
    const Status st = cpu::top_k_rows(x.data(), rows, cols, k, t.ids.data(), t.values.data(), t.lse.data(), pool_);
    EXPECT_TRUE(st.ok()) << st.message();
    return t;
  }
  // Through the backend: host outputs poisoned first (ids -7, values and lse NaN).
  TopK on_device(Backend& be, const float* x, int64_t rows, int64_t cols, int64_t k, bool with_lse) {
    TopK t{std::vector<int32_t>(rows * k, -7), std::vector<float>(rows * k, kNaN), std::vector<float>(rows, kNaN)};
    const Status st =
        be.top_k_rows(x, rows, cols, k, t.ids.data(), t.values.data(), with_lse ? t.lse.data() : nullptr);
    EXPECT_TRUE(st.ok()) << st.message();
    return t;
  }

  std::unique_ptr<CudaBackend> be_;
  ThreadPool pool_{0};
};

TEST_F(CudaTopK, MatchesCpuReference) {
  SeededRng s;
  std::uniform_int_distribution<int64_t> any_rows(2, 63);
  for (int64_t cols : {7, 33, 8192, 151936, 248320})
    for (int64_t rows : {int64_t{1}, any_rows(s.rng), int64_t{64}})
      for (Fill fill : {Fill::kNormal, Fill::kTies, Fill::kSpecial}) {
        const auto x = random_rows(s.rng, rows, cols, fill);
        const Buffer dx = upload(x);
        for (int64_t k : {1, 2, 3, 8, 16}) {
          if (k > cols) continue;
          const std::string what = "rows " + std::to_string(rows) + " cols " + std::to_string(cols) + " k " +
                                   std::to_string(k) + " " + fill_name(fill) + " (splits " +
                                   std::to_string(cuda::plan_top_k_rows(rows, cols, k, 132).splits) + " on 132 SMs)";
          const TopK want = reference(x, rows, cols, k);
          expect_same(on_device(*be_, dx.data(), rows, cols, k, true), want, true, what);
          if (k == 1 || k == 16) {  // without lse: the other kernel instantiation, lse left alone
            const TopK got = on_device(*be_, dx.data(), rows, cols, k, false);
            expect_same(got, want, false, what + " without lse");
            for (float v : got.lse) EXPECT_TRUE(std::isnan(v)) << what << ": lse written though not asked for";
          }
        }
      }
}

// All -inf and all NaN rows: values -inf, ids 0..k-1, lse -inf. A row holding +inf: the +inf first, lse
// +inf. Each once in a row of its own block and once in rows split over blocks.
TEST_F(CudaTopK, InfiniteAndNaNRows) {
  SeededRng s;
  for (int64_t cols : {40, 200000}) {
    const int64_t rows = 5, k = 16;
    auto x = random_rows(s.rng, rows, cols, Fill::kNormal);
    std::fill(x.begin(), x.begin() + cols, -kInf);
    std::fill(x.begin() + cols, x.begin() + 2 * cols, kNaN);
    x[2 * cols + cols - 1] = kInf;
    x[2 * cols + cols / 2] = kInf;
    for (int64_t j = 0; j < cols; ++j)
      if (j % 2 == 0) x[3 * cols + j] = kNaN;  // row 3: NaN never outranks a finite value
    const Buffer dx = upload(x);
    const TopK want = reference(x, rows, cols, k), got = on_device(*be_, dx.data(), rows, cols, k, true);
    expect_same(got, want, true, "special rows, cols " + std::to_string(cols));
    for (int r = 0; r < 2; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        EXPECT_EQ(got.ids[r * k + j], j);
        EXPECT_EQ(got.values[r * k + j], -kInf);
      }
      EXPECT_EQ(got.lse[r], -kInf);
    }
    EXPECT_EQ(got.ids[2 * k], cols / 2);
    EXPECT_EQ(got.ids[2 * k + 1], cols - 1);
    EXPECT_EQ(got.lse[2], kInf);
    EXPECT_EQ(got.ids[3 * k] % 2, 1);
  }
}

// More rows than the first scratch and pinned reservation hold; then a small call again.
TEST_F(CudaTopK, ScratchGrowsForManyRows) {
  SeededRng s;
  struct Shape {
    int64_t rows, cols;
  };
  for (const auto [rows, cols] : {Shape{1000, 33}, Shape{3000, 300}, Shape{2, 8192}}) {
    const auto x = random_rows(s.rng, rows, cols, Fill::kTies);
    const Buffer dx = upload(x);
    expect_same(on_device(*be_, dx.data(), rows, cols, 16, true), reference(x, rows, cols, 16), true,
                "rows " + std::to_string(rows));
  }
}

// The kernels alone: device outputs poisoned with NaN words; the argument errors.
TEST_F(CudaTopK, KernelWritesEveryOutputAndRejectsBadArguments) {
  SeededRng s;
  const int64_t rows = 3, cols = 100000, k = 5;
  const auto x = random_rows(s.rng, rows, cols, Fill::kSpecial);
  test::DevArray<float> dx(x), values(rows * k), lse(rows);
  test::DevArray<int32_t> ids(rows * k);
  const cuda::TopKPlan plan = cuda::plan_top_k_rows(rows, cols, k, 132);
  ASSERT_GT(plan.splits, 1);
  test::DeviceBuffer ws(plan.workspace_bytes);
  DF_ASSERT_CUDA(ws.error());
  DF_ASSERT_CUDA(cuda::top_k_rows(dx.get(), rows, cols, k, plan, ws.get(), ids.get(), values.get(), lse.get()));
  DF_ASSERT_CUDA(cudaDeviceSynchronize());
  const TopK want = reference(x, rows, cols, k);
  expect_same(TopK{ids.host(), values.host(), lse.host()}, want, true, "kernel");

  const auto call = [&](int64_t r, int64_t c, int64_t kk, const cuda::TopKPlan& p, void* w) {
    return cuda::top_k_rows(dx.get(), r, c, kk, p, w, ids.get(), values.get(), nullptr);
  };
  EXPECT_EQ(call(-1, cols, k, plan, ws.get()), cudaErrorInvalidValue);
  EXPECT_EQ(call(rows, 0, 1, plan, ws.get()), cudaErrorInvalidValue);
  EXPECT_EQ(call(rows, 4, 5, plan, ws.get()), cudaErrorInvalidValue);   // k > cols
  EXPECT_EQ(call(rows, cols, 17, plan, ws.get()), cudaErrorInvalidValue);
  EXPECT_EQ(call(rows, cols, k, plan, nullptr), cudaErrorInvalidValue);  // a split plan needs its workspace
  cuda::TopKPlan small = plan;
  small.workspace_bytes -= 8;
  EXPECT_EQ(call(rows, cols, k, small, ws.get()), cudaErrorInvalidValue);
  EXPECT_EQ(call(0, cols, k, plan, nullptr), cudaSuccess);
}

TEST_F(CudaTopK, BackendChecksArgumentsAndProfilerForwards) {
  const std::vector<float> x = {1.0f, 3.0f, 2.0f, 3.0f};
  const Buffer dx = upload(x);
  int32_t ids[4];
  float values[4], lse[2];
  EXPECT_EQ(be_->top_k_rows(dx.data(), 1, 4, 5, ids, values, lse).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(be_->top_k_rows(dx.data(), 1, 4, 0, ids, values, lse).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(be_->top_k_rows(dx.data(), 1, 4, 2, nullptr, values, lse).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(be_->top_k_rows(dx.data(), 0, 4, 2, nullptr, nullptr, nullptr).ok());
  ProfilingBackend prof(*be_);
  ASSERT_TRUE(prof.top_k_rows(dx.data(), 2, 2, 2, ids, values, lse).ok());
  EXPECT_EQ(ids[0], 1);  // row [1, 3]
  EXPECT_EQ(ids[1], 0);
  EXPECT_EQ(ids[2], 1);  // row [2, 3]
  EXPECT_EQ(values[2], 3.0f);
  EXPECT_EQ(values[3], 2.0f);
  EXPECT_NEAR(lse[1], std::log(std::exp(2.0) + std::exp(3.0)), 1e-6);
  ASSERT_TRUE(prof.collect().ok());
  const auto report = prof.report();
  ASSERT_EQ(report.size(), 1u);
  EXPECT_EQ(report[0].op, "top_k_rows");
  EXPECT_EQ(report[0].bytes, 16.0);
}

}  // namespace
}  // namespace dflash

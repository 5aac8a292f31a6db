// Device RMSNorm, RoPE, activations, softmax and the elementwise ops (ops/cuda/norm_rope.h) against the
// CPU reference (ops/cpu/ops.h) on random inputs, outputs poisoned with NaN first.
// Tolerances: rms_norm, rope, add, mul repeat the CPU's float operations (no FMA contraction), so they
// agree to 2e-6 relative (the double sum or the double cos/sin may round differently in rare cases);
// silu/sigmoid/swiglu/softmax use the device expf (<= 2 ulp), checked to 2e-6 relative.
#include "ops/cuda/norm_rope.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/ops.h"
#include "ops/cuda/fill.h"
#include "support/cuda_test_util.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

constexpr uint32_t kNaN = 0x7fc00000u;


template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) { err_ = cudaMalloc(&p_, sizeof(T) * (n == 0 ? 1 : n)); }
  ~Dev() {
    if (p_) cudaFree(p_);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return p_; }
  cudaError_t error() const { return err_; }
  cudaError_t upload(const std::vector<T>& v) {
    return cudaMemcpy(p_, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice);
  }
  cudaError_t poison() {
    static_assert(sizeof(T) == 4);
    return cuda::fill_u32(reinterpret_cast<uint32_t*>(p_), n_, kNaN);
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    if (cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(v.data(), p_, sizeof(T) * n_, cudaMemcpyDeviceToHost) != cudaSuccess)
      std::fill(v.begin(), v.end(), T{});
    return v;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
  cudaError_t err_ = cudaSuccess;
};

class NormRopeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
    const char* s = std::getenv("DFLASH_TEST_SEED");
    seed_ = s ? static_cast<uint32_t>(std::strtoul(s, nullptr, 10)) : std::random_device{}();
    rng_.seed(seed_);
  }
  std::string seed_note() const {
    return "seed " + std::to_string(seed_) + " (rerun with DFLASH_TEST_SEED=" + std::to_string(seed_) + ")";
  }
  std::vector<float> random(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
  uint32_t seed_ = 0;
  std::mt19937 rng_;
};

// Every element: |got - want| <= rel * |want| + abs; reports the first few mismatches.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel, double abs,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const bool ok = std::isnan(w) ? std::isnan(g) : (!std::isnan(g) && std::fabs(g - w) <= rel * std::fabs(w) + abs);
    if (!std::isnan(w) && !std::isnan(g) && std::isfinite(w)) worst = std::max(worst, std::fabs(g - w) / (std::fabs(w) + abs));
    if (!ok && bad++ < 5) ADD_FAILURE() << "MISMATCH " << what << " at " << i << ": got " << g << ", want " << w;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements differ";
}

TEST_F(NormRopeTest, RmsNormMatchesCpu) {
  SCOPED_TRACE(seed_note());
  for (int64_t dim : {64, 128, 256, 1000, 1024, 1025, 4096, 5120}) {
    for (int64_t n : {1, 3, 17}) {
      for (bool weighted : {true, false}) {
        const std::string what = "rms_norm n=" + std::to_string(n) + " dim=" + std::to_string(dim) +
                                 (weighted ? " weighted" : " unweighted");
        auto x = random(static_cast<size_t>(n * dim), -3.0f, 3.0f);
        auto w = random(static_cast<size_t>(dim), -2.0f, 2.0f);
        std::vector<float> want(x.size());
        cpu::rms_norm(x.data(), weighted ? w.data() : nullptr, 1e-6f, n, dim, want.data());
        Dev<float> dx(x.size()), dw(w.size()), dy(x.size());
        DF_ASSERT_CUDA(dx.upload(x));
        DF_ASSERT_CUDA(dw.upload(w));
        DF_ASSERT_CUDA(dy.poison());
        DF_ASSERT_CUDA(cuda::rms_norm(dx.get(), weighted ? dw.get() : nullptr, 1e-6f, n, dim, dy.get()));
        expect_close(dy.download(), want, 2e-6, 0.0, what);
        // In place.
        DF_ASSERT_CUDA(cuda::rms_norm(dx.get(), weighted ? dw.get() : nullptr, 1e-6f, n, dim, dx.get()));
        expect_close(dx.download(), want, 2e-6, 0.0, what + " in place");
      }
    }
  }
}

// Per-head use on the gated q rows [q_h | gate_h]: the q halves, strided, into a packed output.
TEST_F(NormRopeTest, RmsNormStridedPerHead) {
  SCOPED_TRACE(seed_note());
  const int64_t n = 5, nh = 6, hd = 256;
  auto qg = random(static_cast<size_t>(n * nh * 2 * hd), -4.0f, 4.0f);
  auto w = random(static_cast<size_t>(hd), 0.5f, 1.5f);
  std::vector<float> q(static_cast<size_t>(n * nh * hd)), want(q.size());
  for (int64_t r = 0; r < n * nh; ++r)
    std::copy_n(qg.begin() + r * 2 * hd, hd, q.begin() + r * hd);
  cpu::rms_norm(q.data(), w.data(), 1e-6f, n * nh, hd, want.data());
  Dev<float> dqg(qg.size()), dw(w.size()), dy(q.size());
  DF_ASSERT_CUDA(dqg.upload(qg));
  DF_ASSERT_CUDA(dw.upload(w));
  DF_ASSERT_CUDA(dy.poison());
  DF_ASSERT_CUDA(cuda::rms_norm_strided(dqg.get(), 2 * hd, dw.get(), 1e-6f, n * nh, hd, dy.get(), hd));
  expect_close(dy.download(), want, 2e-6, 0.0, "strided rms_norm");
  EXPECT_EQ(cuda::rms_norm_strided(dqg.get(), hd - 1, dw.get(), 1e-6f, 1, hd, dy.get(), hd), cudaErrorInvalidValue);
}

TEST_F(NormRopeTest, RopeNeoxMatchesCpu) {
  SCOPED_TRACE(seed_note());
  struct Case {
    int64_t n, heads, hd, rot;
    double theta, freq_scale;
    int32_t max_pos;
  };
  const Case cases[] = {
      {1, 4, 128, 128, 1e6, 1.0, 40000},   {37, 3, 128, 64, 1e4, 1.0, 100000}, {19, 6, 256, 64, 1e7, 1.0, 250000},
      {8, 2, 64, 64, 1e4, 2.0, 5000},      {65, 5, 256, 256, 1e7, 1.0, 1000},  {3, 2, 128, 0, 1e6, 1.0, 10},
      {11, 1, 80, 32, 1e4, 4.0, 20000},
  };
  for (const Case& c : cases) {
    const std::string what = "rope n=" + std::to_string(c.n) + " heads=" + std::to_string(c.heads) +
                             " hd=" + std::to_string(c.hd) + " rot=" + std::to_string(c.rot);
    auto x = random(static_cast<size_t>(c.n * c.heads * c.hd), -2.0f, 2.0f);
    std::vector<int32_t> pos(static_cast<size_t>(c.n));
    std::uniform_int_distribution<int32_t> pd(0, c.max_pos);
    for (auto& p : pos) p = pd(rng_);
    pos[0] = 0;
    std::vector<float> want = x;
    cpu::rope_neox(want.data(), c.n, c.heads, c.hd, c.rot, pos, c.theta, c.freq_scale);
    Dev<float> dx(x.size());
    Dev<int32_t> dp(pos.size());
    DF_ASSERT_CUDA(dx.upload(x));
    DF_ASSERT_CUDA(dp.upload(pos));
    DF_ASSERT_CUDA(cuda::rope_neox(dx.get(), c.n, c.heads, c.hd, c.rot, dp.get(), c.theta, c.freq_scale));
    expect_close(dx.download(), want, 2e-6, 1e-6, what);
    // With the host's frequency table (what CudaBackend passes).
    if (c.rot == 0) continue;
    std::vector<double> inv(static_cast<size_t>(c.rot / 2));
    for (size_t i = 0; i < inv.size(); ++i)
      inv[i] = std::pow(c.theta, -2.0 * static_cast<double>(i) / static_cast<double>(c.rot)) / c.freq_scale;
    Dev<double> dinv(inv.size());
    DF_ASSERT_CUDA(dinv.upload(inv));
    DF_ASSERT_CUDA(dx.upload(x));
    DF_ASSERT_CUDA(
        cuda::rope_neox(dx.get(), c.n, c.heads, c.hd, c.rot, dp.get(), -1.0, -1.0, nullptr, dinv.get()));
    expect_close(dx.download(), want, 2e-6, 1e-6, what + " (host table)");
  }
  Dev<float> dx(64);
  Dev<int32_t> dp(1);
  EXPECT_EQ(cuda::rope_neox(dx.get(), 1, 1, 64, 63, dp.get(), 1e4), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::rope_neox(dx.get(), 1, 1, 64, 66, dp.get(), 1e4), cudaErrorInvalidValue);
}

TEST_F(NormRopeTest, ActivationsMatchCpu) {
  SCOPED_TRACE(seed_note());
  for (int64_t n : {1, 1000, 70001}) {
    auto a = random(static_cast<size_t>(n), -30.0f, 30.0f);
    auto b = random(static_cast<size_t>(n), -5.0f, 5.0f);
    Dev<float> da(a.size()), db(b.size()), dout(a.size());
    DF_ASSERT_CUDA(db.upload(b));
    const std::string sn = " n=" + std::to_string(n);
    {
      auto want = a;
      cpu::silu_inplace(want.data(), n);
      DF_ASSERT_CUDA(da.upload(a));
      DF_ASSERT_CUDA(cuda::silu_inplace(da.get(), n));
      expect_close(da.download(), want, 2e-6, 1e-37, "silu" + sn);
    }
    {
      auto want = a;
      cpu::sigmoid_inplace(want.data(), n);
      DF_ASSERT_CUDA(da.upload(a));
      DF_ASSERT_CUDA(cuda::sigmoid_inplace(da.get(), n));
      expect_close(da.download(), want, 2e-6, 1e-37, "sigmoid" + sn);
    }
    {
      std::vector<float> want(a.size());
      cpu::swiglu(a.data(), b.data(), want.data(), n);
      DF_ASSERT_CUDA(da.upload(a));
      DF_ASSERT_CUDA(dout.poison());
      DF_ASSERT_CUDA(cuda::swiglu(da.get(), db.get(), dout.get(), n));
      expect_close(dout.download(), want, 2e-6, 1e-37, "swiglu" + sn);
      DF_ASSERT_CUDA(cuda::swiglu(da.get(), db.get(), da.get(), n));  // in place over gate
      expect_close(da.download(), want, 2e-6, 1e-37, "swiglu in place" + sn);
    }
    {
      std::vector<float> sum(a.size()), prod(a.size());
      for (size_t i = 0; i < a.size(); ++i) {
        sum[i] = a[i] + b[i];
        prod[i] = a[i] * b[i];
      }
      DF_ASSERT_CUDA(da.upload(a));
      DF_ASSERT_CUDA(dout.poison());
      DF_ASSERT_CUDA(cuda::add(da.get(), db.get(), dout.get(), n));
      expect_close(dout.download(), sum, 0.0, 0.0, "add" + sn);
      DF_ASSERT_CUDA(cuda::mul(da.get(), db.get(), dout.get(), n));
      expect_close(dout.download(), prod, 0.0, 0.0, "mul" + sn);
      DF_ASSERT_CUDA(cuda::add(da.get(), db.get(), da.get(), n));  // the residual add, in place
      expect_close(da.download(), sum, 0.0, 0.0, "add in place" + sn);
    }
  }
}

TEST_F(NormRopeTest, SoftmaxRowsMatchesCpu) {
  SCOPED_TRACE(seed_note());
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int64_t dim : {1, 7, 256, 5000}) {
    const int64_t n = 6;
    auto x = random(static_cast<size_t>(n * dim), -20.0f, 20.0f);
    std::bernoulli_distribution masked(0.3);
    for (auto& v : x)
      if (masked(rng_)) v = -kInf;
    for (int64_t i = 0; i < dim; ++i) x[static_cast<size_t>(2 * dim + i)] = -kInf;  // row 2 all masked
    auto want = x;
    cpu::softmax_rows(want.data(), n, dim);
    Dev<float> dx(x.size());
    DF_ASSERT_CUDA(dx.upload(x));
    DF_ASSERT_CUDA(cuda::softmax_rows(dx.get(), n, dim));
    expect_close(dx.download(), want, 2e-6, 1e-12, "softmax dim=" + std::to_string(dim));
  }
}

}  // namespace
}  // namespace dflash

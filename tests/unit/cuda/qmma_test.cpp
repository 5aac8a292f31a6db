// The f16 tensor-core product of q4_K weights (ops/cuda/qmma.h).
//
// Reference: the CPU in double, the weights exactly (tensor/quant.h's dequantize_row) and x exactly. The kernel
// rounds a weight w = q ds - dm three times, each within 2^-11 relatively: ds and dm to fp16 (so by up to
// 2^-11 (|q ds| + |dm|) <= 2^-11 (|w| + 2 |dm|)) and the fused q ds - dm; an activation once (x / s_t to fp16;
// fp16 subnormals only far below the token's max); and sums in f32. So every output is checked to within
// 2^-9 sum_k (|w_k| + |dm_k|) |x_k| of the exact product (a bound, not a typical error); dm_k, the sub-block's
// min, is read off the block with its codes zeroed (every weight then -dm). The same outputs for every token
// count: each token of a batch of n = 1..32 equals its one-token product bit for bit, at every split.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/qmma.h"
#include "support/cuda_test_util.h"
#include "support/random_blocks.h"
#include "tensor/dtype.h"
#include "tensor/half.h"
#include "tensor/quant.h"

namespace dflash {
namespace {

using test::DevArray;

class CudaQmma : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::cuda_device_present()) GTEST_SKIP() << "no CUDA device";
    const char* s = std::getenv("DFLASH_TEST_SEED");
    seed_ = s ? static_cast<uint32_t>(std::strtoul(s, nullptr, 10)) : std::random_device{}();
    rng_.seed(seed_);
  }
  std::string seed_note() const { return "seed " + std::to_string(seed_) + " (DFLASH_TEST_SEED)"; }

  // Random q4_K weights: the stored bytes (= the device form) and their exact values. d and dmin are positive
  // powers of 2^[-14, -2) (a model's range: a sub-block's fp16 scale d sc then stays a normal fp16 number; the
  // kernel's fp16 weights lose precision below 6e-5, qmma.h).
  struct Weights {
    std::vector<uint8_t> bytes;
    std::vector<float> values;  // [rows, cols]
    std::vector<float> mins;    // [rows, cols]: -dm of each weight's sub-block
    void* dev = nullptr;
    ~Weights() { cudaFree(dev); }
  };
  void make_weights(int64_t rows, int64_t cols, Weights& w) {
    w.bytes = test::random_blocks(DType::kQ4_K, rows * cols / 256, rng_);
    std::uniform_real_distribution<float> e(-14.0f, -2.0f);
    for (size_t b = 0; b < w.bytes.size() / 144; ++b)
      for (size_t field : {size_t{0}, size_t{2}}) {
        const uint16_t h = fp32_to_fp16(std::exp2(e(rng_)));
        std::memcpy(w.bytes.data() + b * 144 + field, &h, sizeof h);
      }
    w.values.resize(static_cast<size_t>(rows * cols));
    w.mins.resize(static_cast<size_t>(rows * cols));
    const size_t rb = static_cast<size_t>(cols / 256 * 144);
    std::vector<uint8_t> zeroed = w.bytes;
    for (size_t b = 0; b < zeroed.size() / 144; ++b) std::fill_n(zeroed.begin() + b * 144 + 16, 128, uint8_t{0});
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(dequantize_row(DType::kQ4_K, w.bytes.data() + r * rb, w.values.data() + r * cols, cols).ok());
      ASSERT_TRUE(dequantize_row(DType::kQ4_K, zeroed.data() + r * rb, w.mins.data() + r * cols, cols).ok());
    }
    ASSERT_EQ(cudaMalloc(&w.dev, w.bytes.size()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(w.dev, w.bytes.data(), w.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<float> random_x(int64_t n, int64_t cols, float scale) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> x(static_cast<size_t>(n * cols));
    for (auto& v : x) v = d(rng_);
    return x;
  }
  // y [n, rows] on the device: pack then product.
  std::vector<float> run(const Weights& w, int64_t rows, int64_t cols, const std::vector<float>& x, int64_t n,
                         int split = 0) {
    DevArray<float> dx(x), dy(static_cast<size_t>(n * rows));
    void* xp = nullptr;
    EXPECT_EQ(cudaMalloc(&xp, cuda::qmma_x_bytes(n, cols)), cudaSuccess);
    EXPECT_EQ(cuda::qmma_pack_x(dx.get(), n, cols, xp), cudaSuccess);
    EXPECT_EQ(cuda::qmma(DType::kQ4_K, w.dev, rows, cols, xp, n, dy.get(), nullptr, split), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(xp);
    return dy.host();
  }
  void expect_near_exact(const Weights& w, int64_t rows, int64_t cols, const std::vector<float>& x, int64_t n,
                         const std::vector<float>& y, const std::string& what) {
    ASSERT_EQ(y.size(), static_cast<size_t>(n * rows)) << what;
    int bad = 0;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        double exact = 0, mag = 0;
        for (int64_t k = 0; k < cols; ++k) {
          const double xv = x[t * cols + k], wv = w.values[r * cols + k];
          exact += wv * xv;
          mag += (std::fabs(wv) + std::fabs(double{w.mins[r * cols + k]})) * std::fabs(xv);
        }
        const double got = y[t * rows + r];
        if (!(std::fabs(got - exact) <= 0x1p-9 * mag + 1e-30) && bad++ < 5)
          ADD_FAILURE() << what << ": token " << t << " row " << r << ": " << got << " vs " << exact
                        << " (sum (|w| + |dm|) |x| " << mag << ")";
      }
    EXPECT_EQ(bad, 0) << what;
  }

  uint32_t seed_ = 0;
  std::mt19937 rng_;
};

TEST_F(CudaQmma, matches_the_exact_product) {
  SCOPED_TRACE(seed_note());
  struct Shape {
    int64_t rows, cols, n;
  };
  for (const Shape& s : {Shape{1, 256, 1}, Shape{17, 768, 5}, Shape{64, 2048, 16}, Shape{100, 512, 23},
                         Shape{333, 1024, 32}, Shape{40, 256, 9}}) {
    const std::string what = std::to_string(s.rows) + "x" + std::to_string(s.cols) + " n " + std::to_string(s.n);
    Weights w;
    make_weights(s.rows, s.cols, w);
    // Tokens of very different magnitudes (the per-token scale), one of them all zeros.
    std::vector<float> x = random_x(s.n, s.cols, 1.0f);
    for (int64_t t = 0; t < s.n; ++t) {
      const float m = t % 3 == 0 ? 1e-3f : t % 3 == 1 ? 1.0f : 3e3f;
      for (int64_t k = 0; k < s.cols; ++k) x[t * s.cols + k] *= m;
    }
    if (s.n > 2)
      for (int64_t k = 0; k < s.cols; ++k) x[s.cols + k] = 0.0f;
    for (int split : {0, 1, 2, 4, 8}) {
      if (split > s.cols / 256) continue;
      expect_near_exact(w, s.rows, s.cols, x, s.n, run(w, s.rows, s.cols, x, s.n, split),
                        what + " split " + std::to_string(split));
      if (HasFailure()) return;
    }
  }
}

TEST_F(CudaQmma, every_token_count_equals_one_token_bit_for_bit) {
  SCOPED_TRACE(seed_note());
  const int64_t cols = 1024;
  for (int64_t rows : {int64_t{45}, int64_t{700}, int64_t{5000}}) {
    Weights w;
    make_weights(rows, cols, w);
    const std::vector<float> x = random_x(cuda::kQmmaMaxTokens, cols, 2.0f);
    for (int split : {0, 1, 4}) {
      std::vector<std::vector<float>> alone;
      for (int64_t k = 0; k < cuda::kQmmaMaxTokens; ++k)
        alone.push_back(run(w, rows, cols, std::vector<float>(x.begin() + k * cols, x.begin() + (k + 1) * cols), 1,
                            split));
      for (int64_t n : {2, 7, 8, 9, 16, 17, 23, 24, 31, 32}) {
        const auto all = run(w, rows, cols, std::vector<float>(x.begin(), x.begin() + n * cols), n, split);
        ASSERT_EQ(all.size(), static_cast<size_t>(n * rows));
        for (int64_t k = 0; k < n; ++k)
          for (int64_t r = 0; r < rows; ++r)
            ASSERT_EQ(std::bit_cast<uint32_t>(alone[k][r]), std::bit_cast<uint32_t>(all[k * rows + r]))
                << "rows " << rows << " split " << split << " n " << n << " token " << k << " row " << r;
      }
    }
  }
}

TEST_F(CudaQmma, a_token_with_inf_or_nan_gives_nan_and_leaves_the_others) {
  const int64_t rows = 20, cols = 512, n = 3;
  Weights w;
  make_weights(rows, cols, w);
  std::vector<float> x = random_x(n, cols, 1.0f);
  x[cols + 7] = INFINITY;
  x[2 * cols + 300] = NAN;
  const auto y = run(w, rows, cols, x, n);
  ASSERT_EQ(y.size(), static_cast<size_t>(n * rows));
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(std::isfinite(y[r])) << r;
    EXPECT_TRUE(std::isnan(y[rows + r])) << r;
    EXPECT_TRUE(std::isnan(y[2 * rows + r])) << r;
  }
  const auto one = run(w, rows, cols, std::vector<float>(x.begin(), x.begin() + cols), 1);
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(std::bit_cast<uint32_t>(one[r]), std::bit_cast<uint32_t>(y[r]));
}

TEST_F(CudaQmma, bad_arguments_enqueue_nothing) {
  Weights w;
  make_weights(16, 256, w);
  DevArray<float> x(256 * 40), y(16 * 40);
  void* xp = nullptr;
  ASSERT_EQ(cudaMalloc(&xp, cuda::qmma_x_bytes(32, 512)), cudaSuccess);
  EXPECT_EQ(cuda::qmma_pack_x(x.get(), 0, 256, xp), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::qmma_pack_x(x.get(), 33, 256, xp), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::qmma_pack_x(x.get(), 1, 255, xp), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::qmma_pack_x(x.get(), 1, 256, static_cast<uint8_t*>(xp) + 8), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::qmma(DType::kQ6_K, w.dev, 16, 256, xp, 1, y.get()), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::qmma(DType::kQ4_K, w.dev, 0, 256, xp, 1, y.get()), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::qmma(DType::kQ4_K, w.dev, 16, 300, xp, 1, y.get()), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::qmma(DType::kQ4_K, w.dev, 16, 256, xp, 33, y.get()), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::qmma(DType::kQ4_K, w.dev, 16, 256, xp, 1, y.get(), nullptr, 3), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::qmma(DType::kQ4_K, static_cast<uint8_t*>(w.dev) + 4, 16, 256, xp, 1, y.get()),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::qmma(DType::kQ4_K, w.dev, 16, 256, nullptr, 1, y.get()), cudaErrorInvalidValue);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (float v : y.host()) EXPECT_TRUE(std::isnan(v));  // still the poison: nothing was written
  cudaFree(xp);
}

}  // namespace
}  // namespace dflash

// rms_norm, rope_neox and the activations against direct double-precision formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/ops.h"
#include "ops_test_util.h"

namespace dflash::cpu {
namespace {

using test::SeededRng;

TEST(RmsNorm, MatchesDoubleWithAndWithoutWeightAndAliased) {
  SeededRng s;
  const int64_t n = 5, dim = 333;
  const auto x = test::normal_vec(s.rng, n * dim, 3.0f);
  const auto w = test::normal_vec(s.rng, dim);
  for (bool with_w : {true, false}) {
    std::vector<float> y(x.size());
    rms_norm(x.data(), with_w ? w.data() : nullptr, 1e-6f, n, dim, y.data());
    std::vector<float> inplace = x;
    rms_norm(inplace.data(), with_w ? w.data() : nullptr, 1e-6f, n, dim, inplace.data());
    EXPECT_EQ(inplace, y);
    for (int64_t r = 0; r < n; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
      const double inv = 1.0 / std::sqrt(ss / dim + 1e-6);
      for (int64_t i = 0; i < dim; ++i) {
        const double ref = x[r * dim + i] * inv * (with_w ? w[i] : 1.0);
        ASSERT_NEAR(y[r * dim + i], ref, 1e-6 * (std::abs(ref) + 1e-3));
      }
    }
  }
}

TEST(Rope, NeoxPartialAndFullAgainstDouble) {
  SeededRng s;
  const int64_t n = 7, heads = 3;
  std::uniform_int_distribution<int32_t> pos_d(0, 200000);
  struct Case { int64_t head_dim, rot; double theta, freq_scale; };
  for (const Case c : {Case{16, 8, 10000.0, 1.0}, Case{32, 32, 1e6, 1.0}, Case{24, 12, 1e7, 4.0}}) {
    std::vector<int32_t> pos(n);
    for (auto& p : pos) p = pos_d(s.rng);
    pos[0] = 0;
    const auto x0 = test::normal_vec(s.rng, n * heads * c.head_dim);
    auto x = x0;
    rope_neox(x.data(), n, heads, c.head_dim, c.rot, pos, c.theta, c.freq_scale);
    const int64_t half = c.rot / 2;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const float* a = x0.data() + (t * heads + h) * c.head_dim;
        const float* b = x.data() + (t * heads + h) * c.head_dim;
        for (int64_t i = 0; i < c.head_dim; ++i) {
          double ref = a[i];
          if (i < c.rot) {
            const int64_t f = i % half;
            const double ang = pos[t] * std::pow(c.theta, -2.0 * f / c.rot) / c.freq_scale;
            ref = i < half ? a[i] * std::cos(ang) - a[i + half] * std::sin(ang)
                           : a[i - half] * std::sin(ang) + a[i] * std::cos(ang);
          }
          ASSERT_NEAR(b[i], ref, 2e-6 * (std::abs(a[i]) + std::abs(a[i < half ? i + half : i - half]) + 1e-3))
              << "t " << t << " h " << h << " i " << i;
        }
      }
  }
}

TEST(Activations, SiluSigmoidSwigluSoftmax) {
  SeededRng s;
  const auto x = test::normal_vec(s.rng, 1000, 6.0f);
  const auto u = test::normal_vec(s.rng, 1000);
  auto si = x, sg = x;
  std::vector<float> sw(x.size());
  silu_inplace(si.data(), si.size());
  sigmoid_inplace(sg.data(), sg.size());
  swiglu(x.data(), u.data(), sw.data(), sw.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double sig = 1.0 / (1.0 + std::exp(-double(x[i])));
    ASSERT_NEAR(sg[i], sig, 1e-6 * sig + 1e-30);
    ASSERT_NEAR(si[i], x[i] * sig, 1e-6 * std::abs(x[i] * sig) + 1e-30);
    ASSERT_NEAR(sw[i], x[i] * sig * u[i], 2e-6 * std::abs(x[i] * sig * u[i]) + 1e-30);
  }
  const int64_t rows = 4, dim = 250;
  auto sm = x;
  sm.resize(rows * dim);
  const auto sm0 = sm;
  sm[3 * dim + 7] = -std::numeric_limits<float>::infinity();
  softmax_rows(sm.data(), rows, dim);
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -1e300, sum = 0;
    for (int64_t i = 0; i < dim; ++i)
      if (!(r == 3 && i == 7)) mx = std::max(mx, double(sm0[r * dim + i]));
    for (int64_t i = 0; i < dim; ++i)
      if (!(r == 3 && i == 7)) sum += std::exp(sm0[r * dim + i] - mx);
    for (int64_t i = 0; i < dim; ++i) {
      const double ref = (r == 3 && i == 7) ? 0.0 : std::exp(sm0[r * dim + i] - mx) / sum;
      // exp of a float x - max: relative error grows with |x - max| (~1 ulp of it).
      const double arg = std::abs(sm0[r * dim + i] - mx);
      ASSERT_NEAR(sm[r * dim + i], ref, 1e-6 * ref * (1.0 + arg) + 1e-30);
    }
  }
  std::vector<float> masked(8, -std::numeric_limits<float>::infinity());
  softmax_rows(masked.data(), 1, 8);
  for (float v : masked) EXPECT_EQ(v, 0.0f);
  EXPECT_FLOAT_EQ(softplus(0.0f), std::log(2.0f));
  EXPECT_EQ(softplus(50.0f), 50.0f);
}

}  // namespace
}  // namespace dflash::cpu

// causal_conv1d_silu: chain vs a naive double formula, split calls == one call, tree vs the chain
// along each node's ancestor path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ops/cpu/ops.h"
#include "ops_test_util.h"

namespace dflash::cpu {
namespace {

using test::SeededRng;

TEST(CausalConv, ChainMatchesNaive) {
  SeededRng s;
  const int64_t C = 19;
  for (int64_t K : {4, 2, 1})
    for (int64_t n : {1, 2, 3, 9}) {
      SCOPED_TRACE("K " + std::to_string(K) + " n " + std::to_string(n));
      const auto x = test::normal_vec(s.rng, n * C), w = test::normal_vec(s.rng, C * K);
      const auto st0 = test::normal_vec(s.rng, (K - 1) * C);
      std::vector<float> cat = st0;  // concat(state, x)
      cat.insert(cat.end(), x.begin(), x.end());
      auto st = st0;
      std::vector<float> out(n * C);
      causal_conv1d_silu(x.data(), n, C, w.data(), K, st.data(), out.data(), {});
      for (int64_t t = 0; t < n; ++t)
        for (int64_t c = 0; c < C; ++c) {
          double sum = 0;
          for (int64_t j = 0; j < K; ++j) sum += double(w[c * K + j]) * cat[(t + j) * C + c];
          const double ref = sum / (1.0 + std::exp(-sum));
          ASSERT_NEAR(out[t * C + c], ref, 1e-6 * (std::abs(ref) + 1.0));
        }
      const std::vector<float> want_state(cat.end() - (K - 1) * C, cat.end());
      EXPECT_EQ(st, want_state);
    }
}

TEST(CausalConv, SplitCallsEqualOneCall) {
  SeededRng s;
  const int64_t C = 13, K = 4, n = 7;
  const auto x = test::normal_vec(s.rng, n * C), w = test::normal_vec(s.rng, C * K);
  const auto st0 = test::normal_vec(s.rng, (K - 1) * C);
  auto st_one = st0;
  std::vector<float> out_one(n * C);
  causal_conv1d_silu(x.data(), n, C, w.data(), K, st_one.data(), out_one.data(), {});
  for (int64_t first : {1, 2, 3, 5}) {
    auto st = st0;
    std::vector<float> out(n * C);
    causal_conv1d_silu(x.data(), first, C, w.data(), K, st.data(), out.data(), {});
    causal_conv1d_silu(x.data() + first * C, n - first, C, w.data(), K, st.data(), out.data() + first * C, {});
    EXPECT_EQ(out, out_one) << "split at " << first;
    EXPECT_EQ(st, st_one) << "split at " << first;
  }
}

TEST(CausalConv, TreeEqualsChainAlongAncestors) {
  SeededRng s;
  const int64_t C = 11, K = 4, n = 20;
  const auto x = test::normal_vec(s.rng, n * C), w = test::normal_vec(s.rng, C * K);
  const auto st0 = test::normal_vec(s.rng, (K - 1) * C);
  std::vector<int32_t> parents(n);
  parents[0] = -1;
  for (int64_t i = 1; i < n; ++i)
    parents[i] = (i % 7 == 0) ? -1 : static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, i - 1)(s.rng));
  auto st = st0;
  std::vector<float> out(n * C);
  causal_conv1d_silu(x.data(), n, C, w.data(), K, st.data(), out.data(), parents);
  EXPECT_EQ(st, st0);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> path_x;
    int64_t m = 0;
    for (int64_t a = i; a >= 0; a = parents[a], ++m) path_x.insert(path_x.begin(), x.begin() + a * C, x.begin() + (a + 1) * C);
    auto cst = st0;
    std::vector<float> cout(m * C);
    causal_conv1d_silu(path_x.data(), m, C, w.data(), K, cst.data(), cout.data(), {});
    ASSERT_EQ(0, std::memcmp(cout.data() + (m - 1) * C, out.data() + i * C, C * sizeof(float))) << "node " << i;
  }
}

}  // namespace
}  // namespace dflash::cpu

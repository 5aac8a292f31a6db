// CUDA short causal conv + SiLU (ops/cuda/conv.h) against the CPU reference (cpu::causal_conv1d_silu):
// chain form (outputs, and the window bit for bit), split calls vs one call, tree form with random parents
// (window unchanged); kernel sizes 1, 2, 4, 5; n = 1 .. 300; outputs poisoned with NaN words first.
// A fresh seed per test, printed on failure (DFLASH_TEST_SEED=<n> replays it).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/ops.h"
#include "ops/cuda/conv.h"
#include "ops/cuda/conv_host.h"
#include "ops/cuda/fill.h"
#include "support/cuda_test_util.h"
#include "support/test_paths.h"
#include "unit/ops/ops_test_util.h"

namespace dflash {
namespace {

using test::normal_vec;
using test::SeededRng;

using test::cuda_device_present;
using test::DevArray;
using test::kNanPoison;


struct ConvCase {
  int64_t C, K;
};
const ConvCase kCases[] = {{7, 4}, {1000, 4}, {10240, 4}, {19, 1}, {33, 2}, {40, 5}};
const int64_t kLengths[] = {1, 2, 3, 5, 16, 63, 64, 65, 300};

// |gpu - cpu| <= 1e-6 (|cpu| + 1): the sums are rounded as on the CPU; SiLU's exponential may differ by
// an ulp or two.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-6 * (std::abs(want[i]) + 1.0)) << what << " element " << i;
}

TEST(CudaCausalConv, ChainMatchesCpu) {
  if (!cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
  SeededRng s;
  for (const auto& cc : kCases)
    for (int64_t n : kLengths) {
      const int64_t C = cc.C, K = cc.K;
      SCOPED_TRACE("C " + std::to_string(C) + " K " + std::to_string(K) + " n " + std::to_string(n));
      const auto x = normal_vec(s.rng, n * C), w = normal_vec(s.rng, C * K);
      const auto st0 = normal_vec(s.rng, (K - 1) * C);
      auto cpu_state = st0;
      std::vector<float> cpu_out(n * C);
      cpu::causal_conv1d_silu(x.data(), n, C, w.data(), K, cpu_state.data(), cpu_out.data(), {});
      DevArray<float> dx(x), dw(w), dstate(st0), dout(n * C);
      DF_ASSERT_CUDA(dout.error());
      const Status st = cuda::run_causal_conv1d_silu(dx.get(), n, C, dw.get(), K, K > 1 ? dstate.get() : nullptr,
                                                     dout.get(), nullptr);
      ASSERT_TRUE(st.ok()) << st.message();
      DF_ASSERT_CUDA(cudaDeviceSynchronize());
      expect_close(dout.host(), cpu_out, "outputs");
      EXPECT_EQ(dstate.host(), cpu_state) << "the window must be the last K-1 inputs, bit for bit";
    }
}

// Decode-style calls of a few tokens each reproduce one call (state carried on the device).
TEST(CudaCausalConv, SplitCallsEqualOneCall) {
  if (!cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
  SeededRng s;
  const int64_t C = 513, K = 4, n = 11;
  const auto x = normal_vec(s.rng, n * C), w = normal_vec(s.rng, C * K);
  const auto st0 = normal_vec(s.rng, (K - 1) * C);
  DevArray<float> dx(x), dw(w), st_one(st0), out_one(n * C), st_split(st0), out_split(n * C);
  ASSERT_TRUE(cuda::run_causal_conv1d_silu(dx.get(), n, C, dw.get(), K, st_one.get(), out_one.get(), nullptr).ok());
  for (int64_t t0 : {0, 1, 3, 4, 9}) {
    const int64_t len = (t0 == 0 ? 1 : t0 == 1 ? 2 : t0 == 3 ? 1 : t0 == 4 ? 5 : 2);
    ASSERT_TRUE(cuda::run_causal_conv1d_silu(dx.get() + t0 * C, len, C, dw.get(), K, st_split.get(),
                                             out_split.get() + t0 * C, nullptr)
                    .ok());
  }
  DF_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(out_split.host(), out_one.host());
  EXPECT_EQ(st_split.host(), st_one.host());
}

TEST(CudaCausalConv, TreeMatchesCpu) {
  if (!cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
  SeededRng s;
  for (const auto& cc : kCases)
    for (int64_t n : {1, 2, 5, 16, 32, 63}) {
      const int64_t C = cc.C, K = cc.K;
      SCOPED_TRACE("tree C " + std::to_string(C) + " K " + std::to_string(K) + " n " + std::to_string(n));
      std::vector<int32_t> parents(n);
      parents[0] = -1;
      for (int64_t i = 1; i < n; ++i) {
        const int64_t r = std::uniform_int_distribution<int64_t>(0, 9)(s.rng);
        parents[i] = r == 0 ? -1
                     : r < 5 ? static_cast<int32_t>(i - 1)
                             : static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, i - 1)(s.rng));
      }
      const auto x = normal_vec(s.rng, n * C), w = normal_vec(s.rng, C * K);
      const auto st0 = normal_vec(s.rng, (K - 1) * C);
      auto cpu_state = st0;
      std::vector<float> cpu_out(n * C);
      cpu::causal_conv1d_silu(x.data(), n, C, w.data(), K, cpu_state.data(), cpu_out.data(), parents);
      DevArray<float> dx(x), dw(w), dstate(st0), dout(n * C);
      DevArray<int32_t> dparents(parents);
      DF_ASSERT_CUDA(dout.error());
      const Status st = cuda::run_causal_conv1d_silu(dx.get(), n, C, dw.get(), K, K > 1 ? dstate.get() : nullptr,
                                                     dout.get(), dparents.get());
      ASSERT_TRUE(st.ok()) << st.message();
      DF_ASSERT_CUDA(cudaDeviceSynchronize());
      expect_close(dout.host(), cpu_out, "outputs");
      EXPECT_EQ(dstate.host(), st0) << "the tree form must leave the window alone";
    }
}

TEST(CudaCausalConv, ArgumentErrors) {
  float dummy = 0;
  float* p = &dummy;
  EXPECT_FALSE(cuda::run_causal_conv1d_silu(p, -1, 4, p, 4, p, p, nullptr).ok());
  EXPECT_FALSE(cuda::run_causal_conv1d_silu(p, 1, 0, p, 4, p, p, nullptr).ok());
  EXPECT_FALSE(cuda::run_causal_conv1d_silu(p, 1, 4, p, 0, p, p, nullptr).ok());
  EXPECT_FALSE(cuda::run_causal_conv1d_silu(p, 1, 4, p, cuda::kConvMaxKernel + 1, p, p, nullptr).ok());
  EXPECT_FALSE(cuda::run_causal_conv1d_silu(p, 1, 4, p, 4, nullptr, p, nullptr).ok());
  EXPECT_FALSE(cuda::run_causal_conv1d_silu(nullptr, 1, 4, p, 4, p, p, nullptr).ok());
  EXPECT_TRUE(cuda::run_causal_conv1d_silu(nullptr, 0, 4, nullptr, 4, nullptr, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace dflash

// GPU matmul (ops/cuda/matmul_host.h) against the CPU reference cpu::matmul for every weight type:
// the GEMV path (n <= 16) to 1e-5 of sum_k |x||w| per output; the bf16 GEMM path (prefill) against the
// CPU matmul of the bf16-rounded inputs to the same tolerance, and against the f32 CPU result to the
// bf16 rounding (2^-7 of sum |x||w|). Outputs are poisoned with NaN first, a guard after them must
// stay poisoned; the seed of every run is printed on failure (DFLASH_TEST_SEED replays it).
#include "ops/cuda/matmul_host.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/fill.h"
#include "ops/cuda/matmul.h"
#include "support/random_blocks.h"
#include "support/cuda_test_util.h"
#include "support/test_paths.h"
#include "unit/ops/ops_test_util.h"
#include "tensor/dtype.h"
#include "tensor/half.h"
#include "tensor/quant.h"

namespace dflash {
namespace {

constexpr DType kTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ4_0, DType::kQ4_1,
                            DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kQ2_K, DType::kQ3_K,
                            DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_K};

constexpr uint32_t kPoison = 0x7fc00000u;  // quiet NaN
constexpr int64_t kGuard = 19;             // floats after y that must stay poisoned
constexpr double kGemvTol = 1e-5;          // of sum_k |x_k w_k|
constexpr double kGemmTol = 2e-5;          // vs the CPU on bf16-rounded inputs
constexpr double kBf16Tol = 1.0 / 128;     // vs the CPU on f32 inputs


uint64_t bytes_for(DType t, int64_t cols) { return row_bytes(t, static_cast<uint64_t>(cols)).value(); }

// rows x cols weights of type t: plain types from uniform [-1, 1], block types random valid blocks.
std::vector<uint8_t> random_weights(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const auto info = dtype_info(t).value();
  if (info.quantized)
    return test::random_blocks(t, rows * cols / static_cast<int64_t>(info.block_elems), rng);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint8_t> out(bytes_for(t, cols) * static_cast<uint64_t>(rows));
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float f = u(rng);
    if (t == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &f, 4);
    } else {
      const uint16_t h = t == DType::kF16 ? fp32_to_fp16(f) : fp32_to_bf16(f);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

std::vector<float> random_x(int64_t n, int64_t cols, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = u(rng);
  return x;
}

float round_bf16(float f) { return bf16_to_fp32(fp32_to_bf16(f)); }

struct Case {
  DType type;
  int64_t rows, cols, n;
  cuda::MatmulPath path = cuda::MatmulPath::kAuto;
  int64_t w_offset = 0;  // bytes into the device weight buffer
  int split = -1;        // >= 0: call cuda::gemv directly with this split
};

std::string describe(const Case& c) {
  std::string s = std::string(dtype_name(c.type)) + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols) +
                  " n=" + std::to_string(c.n);
  if (c.path == cuda::MatmulPath::kGemmBf16) s += " gemm-bf16";
  if (c.path == cuda::MatmulPath::kGemv) s += " gemv";
  if (c.w_offset) s += " W+" + std::to_string(c.w_offset) + "B";
  if (c.split >= 0) s += " split=" + std::to_string(c.split);
  return s;
}

class CudaMatmul : public testing::Test {
 protected:
  void SetUp() override {
    if (!test::cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
    seed_ = test::fresh_seed();
    rng_.seed(seed_);
  }
  std::string seed_note() const {
    return "seed " + std::to_string(seed_) + " (rerun with DFLASH_TEST_SEED=" + std::to_string(seed_) + ")";
  }

  // Runs the case on the device; returns y (n x rows) or an empty vector after a failure.
  std::vector<float> run_gpu(const Case& c, const std::vector<uint8_t>& w, const std::vector<float>& x) {
    test::DeviceBuffer dw(w.size() + static_cast<size_t>(c.w_offset)), dx(x.size() * 4),
        dy(static_cast<size_t>(c.n * c.rows + kGuard) * 4);
    EXPECT_EQ(dw.error(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(dw.get() + c.w_offset, w.data(), w.size(), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    const uint64_t words = static_cast<uint64_t>(c.n * c.rows + kGuard);
    EXPECT_EQ(cuda::fill_u32(reinterpret_cast<uint32_t*>(dy.get()), words, kPoison), cudaSuccess);
    const auto* xp = reinterpret_cast<const float*>(dx.get());
    auto* yp = reinterpret_cast<float*>(dy.get());
    if (c.split >= 0) {
      const cudaError_t e = cuda::gemv(c.type, dw.get() + c.w_offset, c.rows, c.cols, xp, c.n, yp, nullptr, c.split);
      EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
    } else {
      const Status st = cuda::matmul(c.type, dw.get() + c.w_offset, c.rows, c.cols, xp, c.n, yp, nullptr, c.path);
      EXPECT_TRUE(st.ok()) << st.to_string();
    }
    const cudaError_t sync = cudaDeviceSynchronize();
    EXPECT_EQ(sync, cudaSuccess) << cudaGetErrorString(sync);
    std::vector<float> y(words);
    EXPECT_EQ(cudaMemcpy(y.data(), dy.get(), words * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t i = c.n * c.rows; i < c.n * c.rows + kGuard; ++i)
      if (std::bit_cast<uint32_t>(y[i]) != kPoison) {
        ADD_FAILURE() << describe(c) << ": the guard after y was overwritten at +" << i - c.n * c.rows;
        break;
      }
    if (HasFailure()) return {};
    y.resize(static_cast<size_t>(c.n * c.rows));
    return y;
  }

  void check(const Case& c) {
    SCOPED_TRACE(describe(c));
    const auto w = random_weights(c.type, c.rows, c.cols, rng_);
    const auto x = random_x(c.n, c.cols, rng_);
    const std::vector<float> got = run_gpu(c, w, x);
    if (got.empty()) return;

    // The dequantized weights (for the tolerance scale and the bf16 reference).
    const uint64_t rb = bytes_for(c.type, c.cols);
    std::vector<float> wf(static_cast<size_t>(c.rows * c.cols));
    for (int64_t r = 0; r < c.rows; ++r)
      ASSERT_TRUE(dequantize_row(c.type, w.data() + r * rb, wf.data() + r * c.cols, c.cols).ok());
    const bool gemm = c.path == cuda::MatmulPath::kGemmBf16 ||
                      (c.path == cuda::MatmulPath::kAuto && c.n > cuda::kGemvMaxTokens && c.split < 0);

    std::vector<float> ref(got.size()), ref_bf16;
    ASSERT_TRUE(cpu::matmul({c.type, c.rows, c.cols, w.data()}, x.data(), c.n, ref.data(), pool_).ok());
    std::vector<float> xr;
    std::vector<uint16_t> wb;
    if (gemm) {
      xr.resize(x.size());
      for (size_t i = 0; i < x.size(); ++i) xr[i] = round_bf16(x[i]);
      wb.resize(wf.size());
      for (size_t i = 0; i < wf.size(); ++i) wb[i] = fp32_to_bf16(wf[i]);
      ref_bf16.resize(got.size());
      ASSERT_TRUE(cpu::matmul({DType::kBF16, c.rows, c.cols, wb.data()}, xr.data(), c.n, ref_bf16.data(), pool_).ok());
    }

    int64_t bad = 0;
    std::string first;
    for (int64_t t = 0; t < c.n; ++t)
      for (int64_t r = 0; r < c.rows; ++r) {
        double scale = 0, scale_r = 0;
        for (int64_t k = 0; k < c.cols; ++k) {
          scale += std::fabs(double{x[t * c.cols + k]} * wf[r * c.cols + k]);
          if (gemm) scale_r += std::fabs(double{xr[t * c.cols + k]} * bf16_to_fp32(wb[r * c.cols + k]));
        }
        const size_t i = static_cast<size_t>(t * c.rows + r);
        const double g = got[i];
        bool ok;
        double want, tol;
        if (gemm) {
          want = ref_bf16[i];
          tol = kGemmTol * scale_r + 1e-30;
          ok = std::fabs(g - want) <= tol && std::fabs(g - ref[i]) <= kBf16Tol * scale + 1e-30;
        } else {
          want = ref[i];
          tol = kGemvTol * scale + 1e-30;
          ok = std::fabs(g - want) <= tol;
        }
        if (ok) continue;
        if (bad++ == 0) {
          char buf[256];
          std::snprintf(buf, sizeof buf, "token %lld row %lld: gpu %.9g, want %.9g (f32 cpu %.9g), tol %.3g",
                        static_cast<long long>(t), static_cast<long long>(r), g, want, double{ref[i]}, tol);
          first = buf;
        }
      }
    if (bad) ADD_FAILURE() << "MISMATCH " << describe(c) << ": " << bad << " of " << got.size() << " outputs; first "
                           << first;
  }

  uint32_t seed_ = 0;
  std::mt19937 rng_;
  ThreadPool pool_{4};
};

std::vector<int64_t> cols_for(DType t) {
  const int64_t e = dtype_info(t)->block_elems;
  if (e == 1) return {1, 7, 40, 1000, 1024};
  if (e == 32) return {32, 96, 1088};
  return {256, 768, 2048};
}

TEST_F(CudaMatmul, gemv_every_type_and_shape_matches_cpu) {
  SCOPED_TRACE(seed_note());
  for (DType t : kTypes)
    for (int64_t cols : cols_for(t))
      for (int64_t rows : {1, 7, 131})
        for (int64_t n : {1, 2, 5, 16}) {
          check({t, rows, cols, n});
          if (HasFailure()) return;
        }
}

TEST_F(CudaMatmul, gemv_many_rows_unaligned_weights_and_every_split_match_cpu) {
  SCOPED_TRACE(seed_note());
  for (DType t : kTypes) {
    const int64_t cols = cols_for(t)[1];
    for (int64_t n : {1, 5}) check({t, 4500, cols, n});  // enough rows for one warp per row
    for (int64_t off : {1, 2, 8}) check({t, 37, cols_for(t)[2], 3, cuda::MatmulPath::kGemv, off});
    for (int split : {1, 2, 4}) check({t, 13, cols_for(t)[2], 3, cuda::MatmulPath::kAuto, 0, split});
    if (HasFailure()) return;
  }
}

TEST_F(CudaMatmul, gemm_bf16_every_type_matches_cpu_on_bf16_inputs) {
  SCOPED_TRACE(seed_note());
  for (DType t : kTypes) {
    for (int64_t n : {17, 64, 300}) check({t, 131, cols_for(t)[1], n});
    check({t, 7, cols_for(t)[2], 2, cuda::MatmulPath::kGemmBf16});
    if (HasFailure()) return;
  }
}

// A token's GEMV output does not depend on the tokens beside it (a verify batch reproduces decode).
TEST_F(CudaMatmul, gemv_token_alone_equals_token_in_a_batch_bit_for_bit) {
  SCOPED_TRACE(seed_note());
  for (DType t : kTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const int64_t rows = 57, cols = cols_for(t)[2], n = 11;
    const auto w = random_weights(t, rows, cols, rng_);
    const auto x = random_x(n, cols, rng_);
    const auto all = run_gpu({t, rows, cols, n}, w, x);
    for (int64_t k : {0L, 6L, 10L}) {
      const std::vector<float> one_x(x.begin() + k * cols, x.begin() + (k + 1) * cols);
      const auto one = run_gpu({t, rows, cols, 1}, w, one_x);
      ASSERT_EQ(one.size(), static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r)
        ASSERT_EQ(std::bit_cast<uint32_t>(one[r]), std::bit_cast<uint32_t>(all[k * rows + r])) << "token " << k << " row " << r;
    }
  }
}

TEST_F(CudaMatmul, argument_errors_write_nothing) {
  test::DeviceBuffer w(4096), x(4096), y(4096);
  DF_ASSERT_CUDA(cuda::fill_u32(reinterpret_cast<uint32_t*>(y.get()), 1024, kPoison));
  const auto* xp = reinterpret_cast<const float*>(x.get());
  auto* yp = reinterpret_cast<float*>(y.get());
  EXPECT_FALSE(cuda::matmul(DType::kQ4_K, w.get(), 2, 100, xp, 1, yp).ok());  // not a block multiple
  EXPECT_FALSE(cuda::matmul(DType::kQ8_0, w.get(), -1, 32, xp, 1, yp).ok());
  EXPECT_FALSE(cuda::matmul(DType::kQ8_0, w.get(), 2, 32, xp, 17, yp, nullptr, cuda::MatmulPath::kGemv).ok());
  EXPECT_FALSE(cuda::matmul(DType::kQ8_0, nullptr, 2, 32, xp, 1, yp).ok());
  EXPECT_EQ(cuda::gemv(DType::kQ8_0, w.get(), 2, 32, xp, 0, yp), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gemv(DType::kQ8_0, w.get(), 2, 32, xp, 1, yp, nullptr, 3), cudaErrorInvalidValue);
  DF_ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<uint32_t> got(1024);
  DF_ASSERT_CUDA(cudaMemcpy(got.data(), y.get(), 4096, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], kPoison) << "element " << i << " was written";
}

}  // namespace
}  // namespace dflash

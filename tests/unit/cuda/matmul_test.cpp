// GPU matmul (ops/cuda/matmul_host.h) against the CPU reference cpu::matmul for every weight type:
// the f32 GEMV path (n <= 16) to 1e-5 of sum_k |x||w| per output; the integer-dot GEMV (gemv_q8.h) against
// the CPU matmul of the int8-quantized activations (quantized here by the reference below, which the
// device quantizer must match bit for bit) to the same tolerance, and against the f32 result to the
// activation rounding (sum_k |w_k| xd_k / 2); the bf16 GEMM path (prefill) against the
// CPU matmul of the bf16-rounded inputs to the same tolerance, and against the f32 CPU result to the
// bf16 rounding (2^-7 of sum |x||w|). A token's integer-dot outputs must also be bit-identical whatever
// the token count and the grouping of the launch (what the DFlash verify relies on). Outputs are poisoned
// with NaN first, a guard after them must stay poisoned; the seed of every run is printed on failure
// (DFLASH_TEST_SEED replays it).
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
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/dequantize.h"
#include "ops/cuda/fill.h"
#include "ops/cuda/gemm_q.h"
#include "ops/cuda/gemv16_mma.h"
#include "ops/cuda/gemv_q8.h"
#include "ops/cuda/matmul.h"
#include "ops/cuda/norm_rope.h"
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

// The reference of cuda::quantize_q8_rows: per 32-element block, amax = max |x|, xd = amax / 127,
// xq = rint(x * (127 / amax)) (ties to even), non-finite blocks xd = NaN and codes 0.
void quantize_q8_reference(const std::vector<float>& x, std::vector<int8_t>& xq, std::vector<float>& xd) {
  const size_t blocks = x.size() / 32;
  xq.assign(x.size(), 0);
  xd.assign(blocks, 0.0f);
  for (size_t b = 0; b < blocks; ++b) {
    float amax = 0.0f;
    bool bad = false;
    for (size_t i = 0; i < 32; ++i) {
      bad = bad || !std::isfinite(x[32 * b + i]);
      amax = std::max(amax, std::fabs(x[32 * b + i]));
    }
    if (bad) {
      xd[b] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    xd[b] = amax / 127.0f;
    if (amax == 0.0f) continue;
    const float id = 127.0f / amax;
    for (size_t i = 0; i < 32; ++i) xq[32 * b + i] = static_cast<int8_t>(std::nearbyint(x[32 * b + i] * id));
  }
}

// x as the integer-dot GEMV sees it: xd * xq.
std::vector<float> q8_dequantized(const std::vector<float>& x) {
  std::vector<int8_t> xq;
  std::vector<float> xd;
  quantize_q8_reference(x, xq, xd);
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = xd[i / 32] * static_cast<float>(xq[i]);
  return out;
}

struct Case {
  DType type;
  int64_t rows, cols, n;
  cuda::MatmulPath path = cuda::MatmulPath::kAuto;
  int64_t w_offset = 0;  // bytes into the device weight buffer
  int split = -1;        // >= 0: call cuda::gemv directly with this split
  cuda::GemmQPlan plan{0, 0};  // bn > 0: call cuda::gemm_q directly with this plan (x rounded to bf16 first)
};

bool is_gemm_path(cuda::MatmulPath p) {
  return p == cuda::MatmulPath::kGemmBf16 || p == cuda::MatmulPath::kGemmDequant || p == cuda::MatmulPath::kGemmFused;
}

std::string describe(const Case& c) {
  std::string s = std::string(dtype_name(c.type)) + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols) +
                  " n=" + std::to_string(c.n);
  if (c.path == cuda::MatmulPath::kGemmBf16) s += " gemm-bf16";
  if (c.path == cuda::MatmulPath::kGemmDequant) s += " gemm-dequant";
  if (c.path == cuda::MatmulPath::kGemmFused) s += " gemm-fused";
  if (c.plan.bn > 0) s += " gemm_q bn=" + std::to_string(c.plan.bn) + " split=" + std::to_string(c.plan.split);
  if (c.path == cuda::MatmulPath::kGemv) s += " gemv";
  if (c.path == cuda::MatmulPath::kGemvQ8) s += " gemv-q8";
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
  std::vector<float> run_gpu(const Case& c, const std::vector<uint8_t>& stored, const std::vector<float>& x) {
    const std::vector<uint8_t> w = test::device_form(c.type, stored, c.rows, c.cols);
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
    } else if (c.plan.bn > 0) {
      test::DeviceBuffer xb(x.size() * 2), ws(std::max<size_t>(16, cuda::gemm_q_workspace_bytes(c.plan, c.rows,
                                                                                                  c.cols, c.n)));
      auto* xbp = reinterpret_cast<__nv_bfloat16*>(xb.get());
      EXPECT_EQ(cuda::dequantize_rows(DType::kF32, xp, xbp, c.n, c.cols), cudaSuccess);
      const cudaError_t e = cuda::gemm_q(c.type, dw.get() + c.w_offset, c.rows, c.cols, xbp, c.n, yp, c.plan,
                                         reinterpret_cast<float*>(ws.get()));
      EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // before xb and ws go
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

  // Runs one grouped integer-dot launch (matmul_group, kGemvQ8) of weights ws (rows[i] x cols each, of
  // type t) on x (n tokens); returns each target's y (n x rows[i]), or nothing after a failure. Every y is
  // poisoned first and followed by a guard that must stay poisoned.
  std::vector<std::vector<float>> run_group(DType t, const std::vector<std::vector<uint8_t>>& ws,
                                            const std::vector<int64_t>& rows, int64_t cols,
                                            const std::vector<float>& x, int64_t n) {
    test::DeviceBuffer dx(x.size() * 4);
    EXPECT_EQ(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    std::vector<std::unique_ptr<test::DeviceBuffer>> dw, dy;
    std::vector<cuda::MatmulTarget> targets;
    for (size_t i = 0; i < ws.size(); ++i) {
      const uint64_t words = static_cast<uint64_t>(n * rows[i] + kGuard);
      const std::vector<uint8_t> wd = test::device_form(t, ws[i], rows[i], cols);
      dw.push_back(std::make_unique<test::DeviceBuffer>(wd.size()));
      dy.push_back(std::make_unique<test::DeviceBuffer>(words * 4));
      EXPECT_EQ(cudaMemcpy(dw[i]->get(), wd.data(), wd.size(), cudaMemcpyHostToDevice), cudaSuccess);
      EXPECT_EQ(cuda::fill_u32(reinterpret_cast<uint32_t*>(dy[i]->get()), words, kPoison), cudaSuccess);
      targets.push_back({t, dw[i]->get(), rows[i], reinterpret_cast<float*>(dy[i]->get())});
    }
    const Status st = cuda::matmul_group(targets, cols, reinterpret_cast<const float*>(dx.get()), n, nullptr,
                                         cuda::MatmulPath::kGemvQ8);
    EXPECT_TRUE(st.ok()) << st.to_string();
    const cudaError_t sync = cudaDeviceSynchronize();
    EXPECT_EQ(sync, cudaSuccess) << cudaGetErrorString(sync);
    std::vector<std::vector<float>> ys;
    for (size_t i = 0; i < ws.size(); ++i) {
      const int64_t count = n * rows[i];
      std::vector<float> y(static_cast<size_t>(count + kGuard));
      EXPECT_EQ(cudaMemcpy(y.data(), dy[i]->get(), y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int64_t k = count; k < count + kGuard; ++k)
        if (std::bit_cast<uint32_t>(y[k]) != kPoison) {
          ADD_FAILURE() << "target " << i << ": the guard after y was overwritten at +" << k - count;
          break;
        }
      for (int64_t k = 0; k < count; ++k)
        if (std::bit_cast<uint32_t>(y[k]) == kPoison) {
          ADD_FAILURE() << "target " << i << ": y[" << k << "] was not written";
          break;
        }
      y.resize(static_cast<size_t>(count));
      ys.push_back(std::move(y));
    }
    if (HasFailure()) return {};
    return ys;
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
    const bool gemm = is_gemm_path(c.path) || c.plan.bn > 0 ||
                      (c.path == cuda::MatmulPath::kAuto && c.n > cuda::kGemvMaxTokens && c.split < 0) ||
                      uses_mma16(c);  // x rounded to bf16 as well
    const bool q8 = uses_q8(c);

    std::vector<float> ref(got.size()), ref_bf16, ref_q8;
    ASSERT_TRUE(cpu::matmul({c.type, c.rows, c.cols, w.data()}, x.data(), c.n, ref.data(), pool_).ok());
    std::vector<float> xq8;
    if (q8) {
      xq8 = q8_dequantized(x);
      ref_q8.resize(got.size());
      ASSERT_TRUE(cpu::matmul({c.type, c.rows, c.cols, w.data()}, xq8.data(), c.n, ref_q8.data(), pool_).ok());
    }
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
        double scale = 0, scale_r = 0, act = 0;
        for (int64_t k = 0; k < c.cols; ++k) {
          scale += std::fabs(double{x[t * c.cols + k]} * wf[r * c.cols + k]);
          if (gemm) scale_r += std::fabs(double{xr[t * c.cols + k]} * bf16_to_fp32(wb[r * c.cols + k]));
          if (q8) {
            scale_r += std::fabs(double{xq8[t * c.cols + k]} * wf[r * c.cols + k]);
            act += std::fabs(double{wf[r * c.cols + k]} * (x[t * c.cols + k] - xq8[t * c.cols + k]));
          }
        }
        const size_t i = static_cast<size_t>(t * c.rows + r);
        const double g = got[i];
        bool ok;
        double want, tol;
        if (gemm) {
          want = ref_bf16[i];
          tol = kGemmTol * scale_r + 1e-30;
          ok = std::fabs(g - want) <= tol && std::fabs(g - ref[i]) <= kBf16Tol * scale + 1e-30;
        } else if (q8) {
          want = ref_q8[i];
          tol = kGemvTol * scale_r + 1e-30;
          ok = std::fabs(g - want) <= tol && std::fabs(g - ref[i]) <= act + tol + kGemvTol * scale;
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

  // bf16 weights that the tensor-core GEMV takes (gemv16_mma.h), through matmul's kTokenExact (kAuto keeps the
  // f32 16-bit GEMV).
  static bool uses_mma16(const Case& c) {
    return c.split < 0 && c.plan.bn <= 0 && c.type == DType::kBF16 && c.w_offset % 16 == 0 && c.cols % 64 == 0 &&
           c.path == cuda::MatmulPath::kTokenExact;
  }

  static bool uses_q8(const Case& c) {
    if (c.split >= 0 || c.plan.bn > 0 || !cuda::gemv_q8_supported(c.type)) return false;
    if (c.path == cuda::MatmulPath::kGemvQ8) return c.n <= cuda::kQ8MaxSharedTokens;
    if (c.n > cuda::kGemvMaxTokens) return false;
    const bool k4 = c.type == DType::kQ4_K || c.type == DType::kQ5_K || cuda::device_weight_align(c.type) == 16;
    return c.path == cuda::MatmulPath::kAuto && c.w_offset % (k4 ? 16 : 2) == 0;
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
    // The split and padded device forms (q6_K, q8_0, q4_0, q2_K; q3_K) must be 16-byte aligned (other offsets
    // are refused: argument_errors_write_nothing).
    const bool split = cuda::device_weight_align(t) == 16;
    for (int64_t off : split ? std::vector<int64_t>{16, 48} : std::vector<int64_t>{1, 2, 8})
      check({t, 37, cols_for(t)[2], 3, cuda::MatmulPath::kGemv, off});
    for (int64_t off : split ? std::vector<int64_t>{32} : std::vector<int64_t>{1, 2, 16})
      check({t, 37, cols_for(t)[2], 3, cuda::MatmulPath::kAuto, off});
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

constexpr DType kFusedTypes[] = {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_0};

// The fused kernel through matmul (kGemmFused, and kGemmBf16 where it picks it) and dequantize + cuBLAS
// (kGemmDequant) on the same shapes: partial row tiles (1, 131, 300 rows), partial token tiles, one unit
// of columns and several.
TEST_F(CudaMatmul, gemm_fused_and_dequantize_paths_match_cpu_on_bf16_inputs) {
  SCOPED_TRACE(seed_note());
  for (DType t : kFusedTypes) {
    ASSERT_TRUE(cuda::gemm_q_supported(t));
    const int64_t c0 = 256;
    struct Shape {
      int64_t rows, cols, n;
    };
    for (const Shape& s : {Shape{1, c0, 17}, Shape{131, c0, 64}, Shape{300, 4 * c0, 200}, Shape{129, 2048, 300},
                           Shape{64, 2048, 2}}) {
      for (auto path : {cuda::MatmulPath::kGemmFused, cuda::MatmulPath::kGemmDequant, cuda::MatmulPath::kGemmBf16})
        check({t, s.rows, s.cols, s.n, path});
      if (HasFailure()) return;
    }
  }
}

// Every plan of the fused kernel (64, 128 or 256 tokens a CTA, 1 to 4 column ranges and more than there are),
// each run twice: the same bits both times.
TEST_F(CudaMatmul, gemm_fused_every_plan_matches_cpu_and_repeats_bit_for_bit) {
  SCOPED_TRACE(seed_note());
  struct Shape {
    int64_t rows, cols, n;
  };
  for (DType t : kFusedTypes)
    for (const Shape& sh : {Shape{200, 2048, 150}, Shape{131, 1024, 37}})  // the second: an odd output count
      for (int bn : {64, 128, 256})
        for (int split : {1, 2, 3, 4, 100}) {
          const Case c{t, sh.rows, sh.cols, sh.n, cuda::MatmulPath::kAuto, 0, -1, cuda::GemmQPlan{bn, split}};
          check(c);
          const auto w = random_weights(t, sh.rows, sh.cols, rng_);
          const auto x = random_x(sh.n, sh.cols, rng_);
          const auto a = run_gpu(c, w, x), b = run_gpu(c, w, x);
          ASSERT_EQ(a.size(), b.size());
          ASSERT_EQ(a.size(), static_cast<size_t>(sh.n * sh.rows));
          for (size_t i = 0; i < a.size(); ++i)
            ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i])) << describe(c) << " at " << i;
          if (HasFailure()) return;
        }
}

// Weights the fused kernel does not take (misaligned, a row length it does not cover) fall back to
// dequantize + cuBLAS under kGemmBf16; bf16 weights go to cuBLAS as they are (or through a copy when
// misaligned); many small slabs give the same result as one.
TEST_F(CudaMatmul, gemm_fallbacks_slabs_and_bf16_weights_match_cpu) {
  SCOPED_TRACE(seed_note());
  check({DType::kQ4_K, 70, 512, 33, cuda::MatmulPath::kGemmBf16, 4});   // 4-byte aligned: no fused kernel
  check({DType::kQ6_K, 70, 768, 33, cuda::MatmulPath::kGemmBf16});      // device rows of an odd unit count
  check({DType::kQ4_0, 70, 512, 33, cuda::MatmulPath::kGemmBf16});      // no fused kernel for q4_0
  check({DType::kBF16, 70, 1000, 33, cuda::MatmulPath::kGemmBf16});     // cuBLAS on W directly
  check({DType::kBF16, 70, 1000, 33, cuda::MatmulPath::kGemmBf16, 1});  // misaligned: copied first
  check({DType::kBF16, 5, 40, 2, cuda::MatmulPath::kGemmBf16});
  const int64_t slab_default = cuda::gemm_slab_bytes();
  cuda::set_gemm_slab_bytes(40000);  // 20000 bf16: slabs of 9 rows of 2048 (34 slabs), 75 of 256 (4)
  EXPECT_EQ(cuda::gemm_slab_bytes(), 40000);
  for (DType t : {DType::kQ4_K, DType::kQ6_K, DType::kQ2_K, DType::kF16, DType::kF32, DType::kQ8_0})
    for (int64_t cols : {256L, 2048L}) check({t, 300, cols, 40, cuda::MatmulPath::kGemmDequant});
  cuda::set_gemm_slab_bytes(0);
  EXPECT_EQ(cuda::gemm_slab_bytes(), slab_default);
}

// A token's GEMV output does not depend on the tokens beside it (a verify batch reproduces decode). q4_K and
// q6_K weights of 512+ rows take mmq from 4 tokens on the default path too.
TEST_F(CudaMatmul, gemv_token_alone_equals_token_in_a_batch_bit_for_bit) {
  SCOPED_TRACE(seed_note());
  for (DType t : kTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const bool mmq = t == DType::kQ4_K || t == DType::kQ6_K;
    const int64_t rows = mmq ? cuda::kExactMmqMinRows + 57 : 57, cols = cols_for(t)[2], n = 11;
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

TEST_F(CudaMatmul, gemv_q8_explicit_path_every_token_count) {
  SCOPED_TRACE(seed_note());
  for (DType t : kTypes) {
    if (!cuda::gemv_q8_supported(t)) continue;
    for (int64_t n = 1; n <= cuda::kGemvMaxTokens; ++n) check({t, 67, cols_for(t)[n % 3], n, cuda::MatmulPath::kGemvQ8});
    if (HasFailure()) return;
  }
}

int sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) !=
                                                cudaSuccess)
    return 0;
  return sms;
}

// Row counts whose launches take each split (gemv_auto_split: 4, 2 and 1 warps a row), none a multiple of
// the 2 or 4 rows a warp of the integer-dot kernels takes.
std::vector<int64_t> rows_for_every_split() {
  const int64_t sms = sm_count();
  const std::vector<int64_t> rows = {16 * sms - 3, 16 * sms + 5, 32 * sms + 3};
  EXPECT_EQ(cuda::gemv_auto_split(rows[0]), 4);
  EXPECT_EQ(cuda::gemv_auto_split(rows[1]), 2);
  EXPECT_EQ(cuda::gemv_auto_split(rows[2]), 1);
  return rows;
}

// Whatever kernel a token count picks (rows a warp, tokens a launch), a token's row is summed in the same
// order with the same float expression: each token of a batch of n = 1..32 equals its one-token product
// bit for bit, at row counts that leave a partial row group and at every split. The batches of the
// split row counts are also checked against the CPU. Long rows take several blocks a lane at split 1; short
// rows (one warp step of blocks: 12 q8_0 blocks, 4 super-blocks, 3 K-quant blocks) have a split's warps take
// shares of the tokens instead, and there one launch takes up to 32 tokens (16 a warp); elsewhere the host
// slices batches of more than 16. 12 K-quant blocks end q5_K's two-row kernels at split 1 in a half-full
// warp step (half_tail), its four-row kernel (8 tokens) in a full-width one.
TEST_F(CudaMatmul, gemv_q8_every_token_count_equals_one_token_bit_for_bit) {
  SCOPED_TRACE(seed_note());
  std::vector<int64_t> row_counts = {1, 3, 6, 37};
  for (int64_t r : rows_for_every_split()) row_counts.push_back(r);
  for (DType t : kTypes) {
    if (!cuda::gemv_q8_supported(t)) continue;
    std::vector<std::pair<int64_t, int64_t>> shapes;  // (cols, rows)
    const bool b32 = dtype_info(t)->block_elems == 32;
    const std::vector<int64_t> col_counts = b32 ? std::vector<int64_t>{cols_for(t)[2], 384, 1024}
                                                : std::vector<int64_t>{cols_for(t)[2], 768, 3072};
    for (int64_t cols : col_counts)
      for (int64_t rows : row_counts) shapes.emplace_back(cols, rows);
    for (const auto& [cols, rows] : shapes) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " rows " + std::to_string(rows) + " cols " + std::to_string(cols));
      const auto w = random_weights(t, rows, cols, rng_);
      const int64_t most = cuda::kQ8MaxSharedTokens;
      const auto x = random_x(most, cols, rng_);
      std::vector<std::vector<float>> alone;
      for (int64_t k = 0; k < most; ++k) {
        alone.push_back(run_gpu({t, rows, cols, 1, cuda::MatmulPath::kGemvQ8}, w,
                                std::vector<float>(x.begin() + k * cols, x.begin() + (k + 1) * cols)));
        ASSERT_EQ(alone.back().size(), static_cast<size_t>(rows));
      }
      for (int64_t n = 2; n <= most; ++n) {
        const auto all = run_gpu({t, rows, cols, n, cuda::MatmulPath::kGemvQ8}, w,
                                 std::vector<float>(x.begin(), x.begin() + n * cols));
        ASSERT_EQ(all.size(), static_cast<size_t>(n * rows));
        for (int64_t k = 0; k < n; ++k)
          for (int64_t r = 0; r < rows; ++r)
            ASSERT_EQ(std::bit_cast<uint32_t>(alone[k][r]), std::bit_cast<uint32_t>(all[k * rows + r]))
                << "n " << n << " token " << k << " row " << r;
      }
      if (rows > 100) check({t, rows, cols, most, cuda::MatmulPath::kGemvQ8});
      if (HasFailure()) return;
    }
  }
}

// One gemv_q8 launch takes up to 32 tokens where a split's warps share them (rows of one warp step of blocks at
// split 2 or 4), else 16, and refuses more (nothing enqueued); the host path slices by the same count.
TEST_F(CudaMatmul, gemv_q8_takes_32_tokens_a_launch_only_where_warps_share_them) {
  const std::vector<int64_t> split = rows_for_every_split();  // 4, 2, 1 warps a row
  struct Case {
    DType type;
    int64_t cols, rows, most;
  };
  const std::vector<Case> cases = {
      {DType::kQ8_0, 384, split[0], 32},   // 12 blocks: one warp step (16 blocks of 2 lanes), 4 warps a row
      {DType::kQ8_0, 384, split[1], 32},   // 2 warps a row: 2 x 16
      {DType::kQ8_0, 384, split[2], 16},   // 1 warp a row: no sharing
      {DType::kQ8_0, 4096, split[0], 16},  // 16 super-blocks of 8 lanes: four warp steps
      {DType::kQ6_K, 768, split[0], 32},   // 3 blocks of 8 lanes: one warp step
      {DType::kQ4_K, 4096, split[0], 16}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.type)) + " cols " + std::to_string(c.cols) + " rows " +
                 std::to_string(c.rows));
    EXPECT_EQ(cuda::gemv_q8_max_tokens(c.type, c.cols, c.rows), c.most);
    const int64_t n = c.most + 1;
    const auto wd = test::device_form(c.type, random_weights(c.type, c.rows, c.cols, rng_), c.rows, c.cols);
    test::DeviceBuffer w(wd.size()), xq(n * c.cols), xd(n * c.cols / 8), xs(n * c.cols / 4), y(4 * n * c.rows);
    DF_ASSERT_CUDA(cudaMemcpy(w.get(), wd.data(), wd.size(), cudaMemcpyHostToDevice));
    DF_ASSERT_CUDA(cudaMemset(xq.get(), 0, n * c.cols));
    DF_ASSERT_CUDA(cudaMemset(xd.get(), 0, n * c.cols / 8));
    DF_ASSERT_CUDA(cudaMemset(xs.get(), 0, n * c.cols / 4));
    const cuda::Q8Part part{w.get(), c.rows, reinterpret_cast<float*>(y.get())};
    const auto* q = reinterpret_cast<const int8_t*>(xq.get());
    const auto* d = reinterpret_cast<const float*>(xd.get());
    const auto* s = reinterpret_cast<const int*>(xs.get());
    EXPECT_EQ(cuda::gemv_q8(c.type, &part, 1, c.cols, q, d, s, n, nullptr), cudaErrorInvalidValue);
    EXPECT_EQ(cuda::gemv_q8(c.type, &part, 1, c.cols, q, d, s, c.most, nullptr), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
}

// Grouped launches (a layer's q/k/v, gate/up) whose part boundaries fall inside row groups, at each split:
// every part's rows are written (nothing past them), each token equals its one-token grouped product bit
// for bit, and each part equals its own single product bit for bit where both launches take the same split
// (to float rounding where they do not: another split sums the row's blocks in another order).
TEST_F(CudaMatmul, gemv_q8_grouped_parts_split_inside_row_groups) {
  SCOPED_TRACE(seed_note());
  const std::vector<int64_t> split = rows_for_every_split();  // 4, 2, 1 warps a row
  const std::vector<std::vector<int64_t>> layouts = {
      {1, 2, 5, 3}, {7, 9, 1}, {split[1] - 2, 3}, {split[2] - 2, 1, 5, split[2] + 2}};
  for (DType t : kTypes) {
    if (!cuda::gemv_q8_supported(t)) continue;
    const int64_t cols = cols_for(t)[1];
    for (const auto& rows : layouts) {
      int64_t total = 0;
      std::vector<std::vector<uint8_t>> ws;
      for (int64_t r : rows) {
        total += r;
        ws.push_back(random_weights(t, r, cols, rng_));
      }
      for (int64_t n : {1, 2, 5, 16}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " parts of " + std::to_string(rows[0]) + ", " +
                     std::to_string(rows[1]) + ", ... rows, n " + std::to_string(n));
        const auto x = random_x(n, cols, rng_);
        const auto group = run_group(t, ws, rows, cols, x, n);
        ASSERT_EQ(group.size(), rows.size());
        for (int64_t k = 0; k < n; ++k) {
          const std::vector<float> xk(x.begin() + k * cols, x.begin() + (k + 1) * cols);
          const auto alone = run_group(t, ws, rows, cols, xk, 1);
          ASSERT_EQ(alone.size(), rows.size());
          for (size_t i = 0; i < rows.size(); ++i)
            for (int64_t r = 0; r < rows[i]; ++r)
              ASSERT_EQ(std::bit_cast<uint32_t>(alone[i][r]), std::bit_cast<uint32_t>(group[i][k * rows[i] + r]))
                  << "target " << i << " token " << k << " row " << r;
        }
        const std::vector<float> xq8 = q8_dequantized(x);
        for (size_t i = 0; i < rows.size(); ++i) {
          const auto one = run_gpu({t, rows[i], cols, n, cuda::MatmulPath::kGemvQ8}, ws[i], x);
          ASSERT_EQ(one.size(), group[i].size());
          const bool same_split = cuda::gemv_q8_split(t, rows[i]) == cuda::gemv_q8_split(t, total);
          std::vector<float> wf(static_cast<size_t>(cols));
          for (int64_t r = 0; r < rows[i]; ++r) {
            if (!same_split) {
              ASSERT_TRUE(dequantize_row(t, ws[i].data() + r * bytes_for(t, cols), wf.data(), cols).ok());
            }
            for (int64_t k = 0; k < n; ++k) {
              const size_t at = static_cast<size_t>(k * rows[i] + r);
              if (same_split) {
                ASSERT_EQ(std::bit_cast<uint32_t>(one[at]), std::bit_cast<uint32_t>(group[i][at]))
                    << "target " << i << " token " << k << " row " << r;
                continue;
              }
              // Two summation orders of the same terms: each within kGemvTol of sum |x' w| of the exact sum.
              double scale = 0;
              for (int64_t c = 0; c < cols; ++c) scale += std::fabs(double{xq8[k * cols + c]} * wf[c]);
              ASSERT_NEAR(group[i][at], one[at], 2 * kGemvTol * scale + 1e-30)
                  << "target " << i << " token " << k << " row " << r;
            }
          }
        }
      }
    }
  }
}

// The token-exact path (speculative verify): for 1..32 tokens every token's row equals, bit for bit, what the
// one-token product of the same targets on that path gives it, and for every type but bf16 what the one-token
// kAuto product gives it (bf16 weights keep the f32 16-bit GEMV there). The groups are laid out so that the large
// q4_K and q6_K weights take mmq at each of the one-token launch's splits (q4_K at splits 1 and 2: 4 and 8 parts,
// not at 4: 16 parts, gemv_q8; q6_K at 1, 2 and 4: 2, 4, 8 parts), beside small weights that stay in the group's
// gemv_q8 launch, and other types (gemv_q8 in 16-token slices, gemv16_mma for bf16). Rows of 4 and 12 blocks end
// the one-token GEMV at split 1 in a half-full warp step (q5_K: gemv_q8's half_tail).
TEST_F(CudaMatmul, token_exact_path_equals_one_token_products_bit_for_bit) {
  SCOPED_TRACE(seed_note());
  const int64_t sms = sm_count();
  ASSERT_GT(sms, 0);
  struct Layout {
    std::vector<DType> types;
    std::vector<int64_t> rows;
    int64_t cols = 1024;
  };
  const std::vector<Layout> layouts = {
      {{DType::kQ4_K, DType::kQ4_K, DType::kQ4_K, DType::kQ6_K}, {32 * sms + 3, 48, 600, 70}},  // split 1
      {{DType::kQ4_K, DType::kQ5_K, DType::kQ4_K}, {32 * sms + 1, 40, 7}, 3072},                // split 1, 12 blocks
      {{DType::kQ4_K, DType::kQ4_K}, {16 * sms + 5, 48}},                                        // split 2
      {{DType::kQ4_K, DType::kBF16, DType::kQ8_0, DType::kQ5_K}, {700, 33, 65, 129}},           // split 4
      {{DType::kQ6_K, DType::kQ6_K, DType::kQ4_K}, {32 * sms + 7, 40, 520}},                     // q6_K split 1
      {{DType::kQ6_K}, {16 * sms + 9}},                                                          // q6_K split 2
      {{DType::kQ6_K, DType::kQ6_K}, {900, 600}},                                                // q6_K split 4
  };
  for (const Layout& l : layouts) {
    const int64_t cols = l.cols;
    std::string what = "layout, " + std::to_string(cols) + " columns:";
    for (size_t i = 0; i < l.types.size(); ++i) what += " " + std::string(dtype_name(l.types[i])) + " x" + std::to_string(l.rows[i]);
    SCOPED_TRACE(what);
    std::vector<std::unique_ptr<test::DeviceBuffer>> dw;
    for (size_t i = 0; i < l.types.size(); ++i) {
      const auto w = test::device_form(l.types[i], random_weights(l.types[i], l.rows[i], cols, rng_), l.rows[i], cols);
      dw.push_back(std::make_unique<test::DeviceBuffer>(w.size()));
      DF_ASSERT_CUDA(cudaMemcpy(dw[i]->get(), w.data(), w.size(), cudaMemcpyHostToDevice));
    }
    // y of every target for the tokens x (n of them) on `path`; a guard after each must stay poisoned.
    auto run = [&](const std::vector<float>& x, int64_t n, cuda::MatmulPath path) {
      test::DeviceBuffer dx(x.size() * 4);
      EXPECT_EQ(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      std::vector<std::unique_ptr<test::DeviceBuffer>> dy;
      std::vector<cuda::MatmulTarget> targets;
      for (size_t i = 0; i < l.types.size(); ++i) {
        const int64_t words = n * l.rows[i] + kGuard;
        dy.push_back(std::make_unique<test::DeviceBuffer>(static_cast<size_t>(words) * 4));
        EXPECT_EQ(cuda::fill_u32(reinterpret_cast<uint32_t*>(dy[i]->get()), words, kPoison), cudaSuccess);
        targets.push_back({l.types[i], dw[i]->get(), l.rows[i], reinterpret_cast<float*>(dy[i]->get())});
      }
      const Status st = cuda::matmul_group(targets, cols, reinterpret_cast<const float*>(dx.get()), n, nullptr, path);
      EXPECT_TRUE(st.ok()) << st.to_string();
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<std::vector<float>> ys;
      for (size_t i = 0; i < l.types.size(); ++i) {
        std::vector<float> y(static_cast<size_t>(n * l.rows[i] + kGuard));
        EXPECT_EQ(cudaMemcpy(y.data(), dy[i]->get(), y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        for (size_t k = static_cast<size_t>(n * l.rows[i]); k < y.size(); ++k)
          EXPECT_EQ(std::bit_cast<uint32_t>(y[k]), kPoison) << "target " << i << ": guard overwritten";
        y.resize(static_cast<size_t>(n * l.rows[i]));
        ys.push_back(std::move(y));
      }
      return ys;
    };
    const int64_t most = cuda::kMmqMaxTokens;
    const auto x = random_x(most, cols, rng_);
    std::vector<std::vector<std::vector<float>>> alone;  // [token][target][row]
    for (int64_t k = 0; k < most; ++k) {
      const std::vector<float> xk(x.begin() + k * cols, x.begin() + (k + 1) * cols);
      alone.push_back(run(xk, 1, cuda::MatmulPath::kTokenExact));
      const auto automatic = run(xk, 1, cuda::MatmulPath::kAuto);
      ASSERT_FALSE(HasFailure());
      for (size_t i = 0; i < l.types.size(); ++i) {
        if (l.types[i] == DType::kBF16) continue;  // kAuto keeps the f32 16-bit GEMV for bf16
        for (int64_t r = 0; r < l.rows[i]; ++r)
          ASSERT_EQ(std::bit_cast<uint32_t>(alone[k][i][r]), std::bit_cast<uint32_t>(automatic[i][r]))
              << dtype_name(l.types[i]) << " target " << i << ": kAuto, token " << k << ", row " << r;
      }
    }
    for (int64_t n : {1, 2, 8, 9, 16, 17, 23, 32}) {
      const auto all = run(std::vector<float>(x.begin(), x.begin() + n * cols), n, cuda::MatmulPath::kTokenExact);
      ASSERT_FALSE(HasFailure()) << "n " << n;
      for (size_t i = 0; i < l.types.size(); ++i)
        for (int64_t k = 0; k < n; ++k)
          for (int64_t r = 0; r < l.rows[i]; ++r)
            ASSERT_EQ(std::bit_cast<uint32_t>(alone[k][i][r]), std::bit_cast<uint32_t>(all[i][k * l.rows[i] + r]))
                << dtype_name(l.types[i]) << " target " << i << ", n " << n << ", token " << k << ", row " << r;
    }
  }
  // Past kMmqMaxTokens the path refuses (nothing written).
  test::DeviceBuffer w(4096), x(4 * 1024 * 33), y(4 * 64 * 33);
  EXPECT_FALSE(cuda::matmul(DType::kQ4_K, w.get(), 64, 256, reinterpret_cast<const float*>(x.get()), 33,
                            reinterpret_cast<float*>(y.get()), nullptr, cuda::MatmulPath::kTokenExact)
                   .ok());
}

TEST_F(CudaMatmul, quantize_q8_matches_the_reference_bit_for_bit) {
  SCOPED_TRACE(seed_note());
  const int64_t n = 5, cols = 4096;
  std::vector<float> x = random_x(n, cols, rng_);
  std::uniform_real_distribution<float> mag(-30.0f, 30.0f);
  for (int64_t b = 0; b < n * cols / 32; ++b) {  // blocks of very different ranges
    const float s = std::ldexp(1.0f, static_cast<int>(mag(rng_)));
    for (int i = 0; i < 32; ++i) x[32 * b + i] *= s;
  }
  for (int i = 0; i < 32; ++i) x[64 + i] = 0.0f;             // an all-zero block
  x[200] = std::numeric_limits<float>::infinity();           // a block with inf
  x[300] = std::numeric_limits<float>::quiet_NaN();          // a block with NaN
  x[1000] = 5e-39f;                                          // a subnormal
  std::vector<int8_t> want_q;
  std::vector<float> want_d;
  quantize_q8_reference(x, want_q, want_d);
  test::DeviceBuffer dx(x.size() * 4), dq(x.size()), dd(want_d.size() * 4), ds(want_d.size() * 8);
  DF_ASSERT_CUDA(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  DF_ASSERT_CUDA(cudaMemset(dq.get(), 0x55, x.size()));
  DF_ASSERT_CUDA(cuda::quantize_q8_rows(reinterpret_cast<const float*>(dx.get()), n, cols,
                                        reinterpret_cast<int8_t*>(dq.get()), reinterpret_cast<float*>(dd.get()),
                                        reinterpret_cast<int*>(ds.get())));
  DF_ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<int8_t> got_q(x.size());
  std::vector<float> got_d(want_d.size());
  DF_ASSERT_CUDA(cudaMemcpy(got_q.data(), dq.get(), got_q.size(), cudaMemcpyDeviceToHost));
  DF_ASSERT_CUDA(cudaMemcpy(got_d.data(), dd.get(), got_d.size() * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < got_q.size(); ++i) ASSERT_EQ(got_q[i], want_q[i]) << "element " << i;
  std::vector<int> got_s(want_d.size() * 2);
  DF_ASSERT_CUDA(cudaMemcpy(got_s.data(), ds.get(), got_s.size() * 4, cudaMemcpyDeviceToHost));
  for (size_t h = 0; h < got_s.size(); ++h) {
    int want = 0;
    for (size_t i = 0; i < 16; ++i) want += want_q[16 * h + i];
    ASSERT_EQ(got_s[h], want) << "half block " << h;
  }
  for (size_t b = 0; b < got_d.size(); ++b) {
    if (std::isnan(want_d[b])) {
      ASSERT_TRUE(std::isnan(got_d[b])) << "block " << b;
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(got_d[b]), std::bit_cast<uint32_t>(want_d[b])) << "block " << b;
  }
}

// Grouped products (a layer's q/k/v): each output as the single product would give it, mixed types too.
TEST_F(CudaMatmul, matmul_group_matches_single_products) {
  SCOPED_TRACE(seed_note());
  const int64_t cols = 512;
  for (int64_t n : {1, 3, 16, 40}) {
    const DType types[] = {DType::kQ4_K, DType::kQ4_K, DType::kQ6_K, DType::kF32, DType::kQ4_K, DType::kQ8_0,
                           DType::kBF16, DType::kBF16, DType::kF16};
    const int64_t rows[] = {96, 1, 33, 20, 130, 7, 45, 9, 3};
    const auto x = random_x(n, cols, rng_);
    test::DeviceBuffer dx(x.size() * 4);
    DF_ASSERT_CUDA(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    const auto* xp = reinterpret_cast<const float*>(dx.get());
    std::vector<std::vector<uint8_t>> ws;
    std::vector<std::unique_ptr<test::DeviceBuffer>> dw, dy, dy1;
    std::vector<cuda::MatmulTarget> targets;
    for (size_t i = 0; i < std::size(types); ++i) {
      ws.push_back(test::device_form(types[i], random_weights(types[i], rows[i], cols, rng_), rows[i], cols));
      dw.push_back(std::make_unique<test::DeviceBuffer>(ws[i].size()));
      dy.push_back(std::make_unique<test::DeviceBuffer>(static_cast<size_t>(n * rows[i]) * 4));
      dy1.push_back(std::make_unique<test::DeviceBuffer>(static_cast<size_t>(n * rows[i]) * 4));
      DF_ASSERT_CUDA(cudaMemcpy(dw[i]->get(), ws[i].data(), ws[i].size(), cudaMemcpyHostToDevice));
      DF_ASSERT_CUDA(cuda::fill_u32(reinterpret_cast<uint32_t*>(dy[i]->get()), n * rows[i], kPoison));
      targets.push_back({types[i], dw[i]->get(), rows[i], reinterpret_cast<float*>(dy[i]->get())});
    }
    const Status st = cuda::matmul_group(targets, cols, xp, n);
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (size_t i = 0; i < std::size(types); ++i) {
      ASSERT_TRUE(cuda::matmul(types[i], dw[i]->get(), rows[i], cols, xp, n, reinterpret_cast<float*>(dy1[i]->get()))
                      .ok());
      DF_ASSERT_CUDA(cudaDeviceSynchronize());
      std::vector<float> g(static_cast<size_t>(n * rows[i])), one(g.size());
      DF_ASSERT_CUDA(cudaMemcpy(g.data(), dy[i]->get(), g.size() * 4, cudaMemcpyDeviceToHost));
      DF_ASSERT_CUDA(cudaMemcpy(one.data(), dy1[i]->get(), one.size() * 4, cudaMemcpyDeviceToHost));
      // The grouped launch may pick another split (warps per row) than the single one: float rounding.
      for (size_t k = 0; k < g.size(); ++k)
        ASSERT_NEAR(g[k], one[k], 1e-4 * (1.0 + std::fabs(one[k]))) << "target " << i << " n " << n << " at " << k;
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
  EXPECT_FALSE(cuda::matmul(DType::kQ4_1, w.get(), 2, 256, xp, 1, yp, nullptr, cuda::MatmulPath::kGemvQ8).ok());
  EXPECT_FALSE(cuda::matmul(DType::kQ4_K, w.get() + 1, 2, 256, xp, 1, yp, nullptr, cuda::MatmulPath::kGemvQ8).ok());
  // The fused GEMM: misaligned weights, a type or a row length it does not take.
  EXPECT_FALSE(cuda::matmul(DType::kQ4_K, w.get() + 4, 2, 256, xp, 3, yp, nullptr, cuda::MatmulPath::kGemmFused).ok());
  EXPECT_FALSE(cuda::matmul(DType::kQ2_K, w.get(), 2, 256, xp, 3, yp, nullptr, cuda::MatmulPath::kGemmFused).ok());
  // The split and padded device forms (ops/cuda/weight_form.h: q6_K, q8_0, q4_0, q2_K; q3_K) are 16-byte aligned:
  // any other address is refused on every path.
  EXPECT_FALSE(cuda::matmul(DType::kQ6_K, w.get() + 2, 2, 256, xp, 3, yp, nullptr, cuda::MatmulPath::kGemmFused).ok());
  EXPECT_FALSE(cuda::matmul(DType::kQ6_K, w.get() + 8, 2, 256, xp, 1, yp).ok());
  EXPECT_FALSE(cuda::matmul(DType::kQ6_K, w.get() + 2, 2, 256, xp, 1, yp, nullptr, cuda::MatmulPath::kGemv).ok());
  EXPECT_EQ(cuda::gemv(DType::kQ6_K, w.get() + 2, 2, 256, xp, 1, yp), cudaErrorInvalidValue);
  EXPECT_FALSE(cuda::gemm_q_applies(DType::kQ6_K, w.get() + 4, 2, 256));
  EXPECT_FALSE(cuda::matmul(DType::kQ8_0, w.get() + 2, 2, 256, xp, 1, yp).ok());
  EXPECT_FALSE(cuda::matmul(DType::kQ8_0, w.get() + 2, 2, 256, xp, 3, yp, nullptr, cuda::MatmulPath::kGemmFused).ok());
  EXPECT_EQ(cuda::gemv(DType::kQ8_0, w.get() + 8, 2, 256, xp, 1, yp), cudaErrorInvalidValue);
  EXPECT_FALSE(cuda::gemm_q_applies(DType::kQ8_0, w.get() + 4, 2, 256));
  EXPECT_FALSE(cuda::matmul(DType::kQ4_0, w.get() + 2, 2, 256, xp, 1, yp).ok());
  EXPECT_EQ(cuda::gemv(DType::kQ4_0, w.get() + 8, 2, 256, xp, 1, yp), cudaErrorInvalidValue);
  EXPECT_FALSE(cuda::matmul(DType::kQ3_K, w.get() + 2, 2, 256, xp, 1, yp).ok());  // the padded form, as the split
  EXPECT_FALSE(cuda::matmul(DType::kQ2_K, w.get() + 4, 2, 256, xp, 1, yp).ok());
  EXPECT_EQ(cuda::gemv(DType::kQ2_K, w.get() + 8, 2, 256, xp, 1, yp), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gemv(DType::kQ3_K, w.get() + 8, 2, 256, xp, 1, yp), cudaErrorInvalidValue);
  const cuda::GemmQPlan plan{64, 1};
  const auto* xbp = reinterpret_cast<const __nv_bfloat16*>(x.get());
  EXPECT_EQ(cuda::gemm_q(DType::kQ4_K, w.get(), 2, 256, xbp, 0, yp, plan, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gemm_q(DType::kQ4_K, w.get(), 2, 256, xbp + 1, 3, yp, plan, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gemm_q(DType::kQ4_K, w.get(), 2, 256, xbp, 3, yp, cuda::GemmQPlan{32, 1}, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gemm_q(DType::kQ4_K, w.get(), 2, 512, xbp, 3, yp, cuda::GemmQPlan{64, 2}, nullptr),
            cudaErrorInvalidValue);  // a split without its workspace
  const cuda::Q8Part five[5] = {};
  const auto* xs = reinterpret_cast<const int*>(x.get());
  EXPECT_EQ(cuda::gemv_q8(DType::kQ4_K, five, 5, 256, reinterpret_cast<const int8_t*>(x.get()), xp, xs, 1),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::quantize_q8_rows(xp, 1, 33, reinterpret_cast<int8_t*>(y.get()), yp, reinterpret_cast<int*>(yp)),
            cudaErrorInvalidValue);
  DF_ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<uint32_t> got(1024);
  DF_ASSERT_CUDA(cudaMemcpy(got.data(), y.get(), 4096, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], kPoison) << "element " << i << " was written";
}

// The 16-bit GEMV (f16/bf16 weights with 16-byte aligned rows: 8 weights a load, several rows a warp by
// token count): model-sized rows (4096, 12288), an odd multiple of 8 (4104: a partial round of loads) and
// row lengths it leaves to the general kernel (1004: not a multiple of 8; W 2 bytes off alignment), row
// counts that are not a multiple of any tile, every split, 1, 3 and 16 tokens, against the CPU.
TEST_F(CudaMatmul, gemv_16bit_weights_model_rows_match_cpu) {
  SCOPED_TRACE(seed_note());
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (int64_t cols : {4096L, 12288L, 4104L, 1004L})
      for (int64_t rows : {37L, 131L})
        for (int64_t n : {1L, 3L, 16L}) {
          check({t, rows, cols, n});
          if (HasFailure()) return;
        }
    for (int split : {1, 2, 4})
      for (int64_t n : {1L, 3L, 16L}) check({t, 13, 4104, n, cuda::MatmulPath::kAuto, 0, split});
    for (int64_t n : {1L, 3L}) check({t, 5, 4096, n, cuda::MatmulPath::kGemv, 2});  // misaligned W
    check({t, 4500, 4096, 1});  // many rows: one warp per row
    if (HasFailure()) return;
  }
}

// A token's 16-bit GEMV output is the same bits alone and in a batch of 2..16 (the tile, rows per warp,
// changes with the token count; the summation order must not), for every split.
TEST_F(CudaMatmul, gemv_16bit_weights_token_alone_equals_token_in_a_batch_bit_for_bit) {
  SCOPED_TRACE(seed_note());
  for (DType t : {DType::kBF16, DType::kF16})
    for (int64_t cols : {4096L, 4104L})
      for (int split : {-1, 1, 2, 4}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " cols " + std::to_string(cols) + " split " + std::to_string(split));
        const int64_t rows = 37;
        const auto w = random_weights(t, rows, cols, rng_);
        const auto x = random_x(16, cols, rng_);
        std::vector<std::vector<float>> alone;
        for (int64_t k = 0; k < 16; ++k) {
          const std::vector<float> one_x(x.begin() + k * cols, x.begin() + (k + 1) * cols);
          alone.push_back(run_gpu({t, rows, cols, 1, cuda::MatmulPath::kAuto, 0, split}, w, one_x));
          ASSERT_EQ(alone.back().size(), static_cast<size_t>(rows));
        }
        for (int64_t n : {2L, 3L, 4L, 5L, 8L, 16L}) {
          const std::vector<float> xs(x.begin(), x.begin() + n * cols);
          const auto all = run_gpu({t, rows, cols, n, cuda::MatmulPath::kAuto, 0, split}, w, xs);
          ASSERT_EQ(all.size(), static_cast<size_t>(n * rows));
          for (int64_t k = 0; k < n; ++k)
            for (int64_t r = 0; r < rows; ++r)
              ASSERT_EQ(std::bit_cast<uint32_t>(alone[k][r]), std::bit_cast<uint32_t>(all[k * rows + r]))
                  << "n " << n << " token " << k << " row " << r;
        }
      }
}

// A grouped 16-bit GEMV launch (gemv16_group: a decode step's q/k/v or gate/up) gives each part the bits of that
// part's own launch at the group's split, with row groups that span two parts (rows not multiples of the R rows a
// warp takes at 5-16 tokens), empty parts, and every y written exactly (poisoned first, a guard after each).
TEST_F(CudaMatmul, gemv16_group_parts_equal_their_own_launches_bit_for_bit) {
  SCOPED_TRACE(seed_note());
  for (DType t : {DType::kBF16, DType::kF16})
    for (int64_t cols : {512L, 4104L}) {
      const std::vector<int64_t> rows = {13, 0, 7, 38};
      const auto x = random_x(16, cols, rng_);
      test::DeviceBuffer dx(x.size() * 4);
      DF_ASSERT_CUDA(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
      const auto* xp = reinterpret_cast<const float*>(dx.get());
      std::vector<std::unique_ptr<test::DeviceBuffer>> dw, dy, dy1;
      int64_t total = 0;
      for (int64_t r : rows) {
        const auto w = test::device_form(t, random_weights(t, std::max<int64_t>(r, 1), cols, rng_),
                                         std::max<int64_t>(r, 1), cols);
        dw.push_back(std::make_unique<test::DeviceBuffer>(w.size()));
        DF_ASSERT_CUDA(cudaMemcpy(dw.back()->get(), w.data(), w.size(), cudaMemcpyHostToDevice));
        dy.push_back(std::make_unique<test::DeviceBuffer>(static_cast<size_t>(16 * r + kGuard) * 4));
        dy1.push_back(std::make_unique<test::DeviceBuffer>(static_cast<size_t>(16 * r + kGuard) * 4));
        total += r;
      }
      for (int split : {0, 1, 2, 4})
        for (int64_t n : {1L, 3L, 5L, 16L}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " cols " + std::to_string(cols) + " split " +
                       std::to_string(split) + " n " + std::to_string(n));
          std::vector<cuda::GemvPart> parts;
          for (size_t i = 0; i < rows.size(); ++i) {
            const uint64_t words = static_cast<uint64_t>(n * rows[i] + kGuard);
            DF_ASSERT_CUDA(cuda::fill_u32(reinterpret_cast<uint32_t*>(dy[i]->get()), words, kPoison));
            parts.push_back({dw[i]->get(), rows[i], reinterpret_cast<float*>(dy[i]->get())});
          }
          DF_ASSERT_CUDA(cuda::gemv16_group(t, parts.data(), static_cast<int>(parts.size()), cols, xp, n, nullptr,
                                            split));
          const int used = split != 0 ? split : cuda::gemv16_auto_split(total);
          for (size_t i = 0; i < rows.size(); ++i)
            if (rows[i] > 0)
              DF_ASSERT_CUDA(cuda::gemv(t, dw[i]->get(), rows[i], cols, xp, n,
                                        reinterpret_cast<float*>(dy1[i]->get()), nullptr, used));
          DF_ASSERT_CUDA(cudaDeviceSynchronize());
          for (size_t i = 0; i < rows.size(); ++i) {
            const size_t count = static_cast<size_t>(n * rows[i]);
            std::vector<uint32_t> g(count + kGuard), one(count);
            DF_ASSERT_CUDA(cudaMemcpy(g.data(), dy[i]->get(), g.size() * 4, cudaMemcpyDeviceToHost));
            DF_ASSERT_CUDA(cudaMemcpy(one.data(), dy1[i]->get(), one.size() * 4, cudaMemcpyDeviceToHost));
            for (size_t k = count; k < g.size(); ++k) ASSERT_EQ(g[k], kPoison) << "part " << i << " guard +" << k;
            for (size_t k = 0; k < count; ++k) ASSERT_EQ(g[k], one[k]) << "part " << i << " at " << k;
          }
        }
      cuda::GemvPart bad{dw[0]->get(), rows[0], reinterpret_cast<float*>(dy[0]->get())};
      EXPECT_EQ(cuda::gemv16_group(t, &bad, 1, cols, xp, 17), cudaErrorInvalidValue);
      EXPECT_EQ(cuda::gemv16_group(t, &bad, 1, cols, xp + 1, 1), cudaErrorInvalidValue);  // x not 16-byte aligned
      EXPECT_EQ(cuda::gemv16_group(t, &bad, 1, cols, xp, 1, nullptr, 3), cudaErrorInvalidValue);
      EXPECT_EQ(cuda::gemv16_group(DType::kQ8_0, &bad, 1, cols, xp, 1), cudaErrorInvalidValue);
    }
}

// The bf16 tensor-core GEMV (gemv16_mma.h) on its own: groups of weights whose row counts are not multiples of
// its 16-row tile (at 1024 columns one of them more than a wave of CTAs), rows of 64 to 5120 columns, 1-32 tokens,
// x 16-byte aligned or not, or already in bf16 (gemv16_mma_bf16x). Against the CPU on bf16-rounded x (as the prefill
// GEMM); every token's outputs the same bits alone, in any batch, at either alignment of x, and from either form of x.
TEST_F(CudaMatmul, bf16_tensor_core_gemv_matches_cpu_and_every_batch_bit_for_bit) {
  SCOPED_TRACE(seed_note());
  for (int64_t cols : {64L, 1024L, 5120L}) {
    SCOPED_TRACE("cols " + std::to_string(cols));
    // At 1024 columns a fourth weight of more 32-row blocks than two an SM: the persistent CTAs take several blocks
    // each (from 9 tokens on the balanced grid), as the large weights of a Qwen3.5-27B verify step do.
    const std::vector<int64_t> rows =
        cols == 1024 ? std::vector<int64_t>{1, 37, 300, 32 * 2 * sm_count() + 41} : std::vector<int64_t>{1, 37, 300};
    std::vector<std::vector<uint8_t>> ws;
    std::vector<std::unique_ptr<test::DeviceBuffer>> dw;
    for (int64_t r : rows) {
      ws.push_back(random_weights(DType::kBF16, r, cols, rng_));
      dw.push_back(std::make_unique<test::DeviceBuffer>(ws.back().size()));
      DF_ASSERT_CUDA(cudaMemcpy(dw.back()->get(), ws.back().data(), ws.back().size(), cudaMemcpyHostToDevice));
      ASSERT_TRUE(cuda::gemv16_mma_applies(DType::kBF16, dw.back()->get(), cols));
    }
    const int64_t most = cuda::kGemv16MmaMaxTokens;
    const auto x = random_x(most, cols, rng_);
    // x rounded to bf16 on the host (fp32_to_bf16: nearest even, as dequantize_rows does on the device).
    std::vector<uint16_t> xb16(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb16[i] = fp32_to_bf16(x[i]);
    // Every part's y for tokens [0, n) of x, x placed `shift` floats into its buffer (shift < 0: x in bf16).
    auto run = [&](int64_t k0, int64_t n, int shift) {
      test::DeviceBuffer dx((x.size() + 4) * 4);
      float* xp = reinterpret_cast<float*>(dx.get()) + (shift < 0 ? 0 : shift);
      const auto* xbp = reinterpret_cast<const uint16_t*>(dx.get());
      if (shift < 0)
        EXPECT_EQ(cudaMemcpy(dx.get(), xb16.data() + k0 * cols, static_cast<size_t>(n * cols) * 2,
                             cudaMemcpyHostToDevice),
                  cudaSuccess);
      else
        EXPECT_EQ(cudaMemcpy(xp, x.data() + k0 * cols, static_cast<size_t>(n * cols) * 4, cudaMemcpyHostToDevice),
                  cudaSuccess);
      std::vector<std::unique_ptr<test::DeviceBuffer>> dy;
      cuda::Gemv16Part parts[cuda::kGemv16MmaMaxParts];
      for (size_t i = 0; i < rows.size(); ++i) {
        const int64_t words = n * rows[i] + kGuard;
        dy.push_back(std::make_unique<test::DeviceBuffer>(static_cast<size_t>(words) * 4));
        EXPECT_EQ(cuda::fill_u32(reinterpret_cast<uint32_t*>(dy[i]->get()), words, kPoison), cudaSuccess);
        parts[i] = {dw[i]->get(), rows[i], reinterpret_cast<float*>(dy[i]->get())};
      }
      const int np = static_cast<int>(rows.size());
      EXPECT_EQ(shift < 0 ? cuda::gemv16_mma_bf16x(parts, np, cols, xbp, n) : cuda::gemv16_mma(parts, np, cols, xp, n),
                cudaSuccess);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<std::vector<float>> ys;
      for (size_t i = 0; i < rows.size(); ++i) {
        std::vector<float> y(static_cast<size_t>(n * rows[i] + kGuard));
        EXPECT_EQ(cudaMemcpy(y.data(), dy[i]->get(), y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        for (size_t k = static_cast<size_t>(n * rows[i]); k < y.size(); ++k)
          EXPECT_EQ(std::bit_cast<uint32_t>(y[k]), kPoison) << "part " << i << ": guard overwritten";
        y.resize(static_cast<size_t>(n * rows[i]));
        ys.push_back(std::move(y));
      }
      return ys;
    };
    const auto all = run(0, most, 0);
    ASSERT_FALSE(HasFailure());
    // Against the CPU on bf16-rounded x.
    std::vector<float> xr(x.size());
    for (size_t i = 0; i < x.size(); ++i) xr[i] = round_bf16(x[i]);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::vector<float> ref(static_cast<size_t>(most * rows[i]));
      ASSERT_TRUE(cpu::matmul({DType::kBF16, rows[i], cols, ws[i].data()}, xr.data(), most, ref.data(), pool_).ok());
      const auto* wb = reinterpret_cast<const uint16_t*>(ws[i].data());
      for (int64_t t = 0; t < most; ++t)
        for (int64_t r = 0; r < rows[i]; ++r) {
          double scale = 0;
          for (int64_t k = 0; k < cols; ++k)
            scale += std::fabs(double{xr[t * cols + k]} * bf16_to_fp32(wb[r * cols + k]));
          const size_t e = static_cast<size_t>(t * rows[i] + r);
          ASSERT_LE(std::fabs(double{all[i][e]} - ref[e]), kGemmTol * scale + 1e-30)
              << "part " << i << " token " << t << " row " << r << ": gpu " << all[i][e] << ", cpu " << ref[e];
        }
    }
    // Each token alone, and batches of every n-tile count, at both alignments of x and with x in bf16.
    for (int64_t n : {1L, 7L, 8L, 9L, 17L, 23L, 32L})
      for (int shift : {0, 1, -1}) {
        for (int64_t k0 : {0L, most - n}) {
          const auto got = run(k0, n, shift);
          ASSERT_FALSE(HasFailure());
          for (size_t i = 0; i < rows.size(); ++i)
            for (int64_t t = 0; t < n; ++t)
              for (int64_t r = 0; r < rows[i]; ++r)
                ASSERT_EQ(std::bit_cast<uint32_t>(got[i][t * rows[i] + r]),
                          std::bit_cast<uint32_t>(all[i][(k0 + t) * rows[i] + r]))
                    << "n " << n << " shift " << shift << " part " << i << " token " << k0 + t << " row " << r;
        }
      }
  }
  // Refused: f16 weights, rows of a length that is not a multiple of 64, too many tokens, misaligned weights.
  test::DeviceBuffer w(4096 * 2 + 16), x(4 * 64 * 33), y(4 * 64 * 33);
  EXPECT_FALSE(cuda::gemv16_mma_applies(DType::kF16, w.get(), 64));
  EXPECT_FALSE(cuda::gemv16_mma_applies(DType::kBF16, w.get(), 96));
  EXPECT_FALSE(cuda::gemv16_mma_applies(DType::kBF16, w.get() + 2, 64));
  const cuda::Gemv16Part part{w.get(), 64, reinterpret_cast<float*>(y.get())};
  EXPECT_EQ(cuda::gemv16_mma(&part, 1, 64, reinterpret_cast<const float*>(x.get()), 33), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gemv16_mma(&part, 1, 96, reinterpret_cast<const float*>(x.get()), 1), cudaErrorInvalidValue);
  const auto* xb = reinterpret_cast<const uint16_t*>(x.get());
  EXPECT_EQ(cuda::gemv16_mma_bf16x(&part, 1, 64, xb, 33), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gemv16_mma_bf16x(&part, 1, 64, xb + 4, 1), cudaErrorInvalidValue);  // 8-byte aligned
  EXPECT_EQ(cuda::gemv16_mma_bf16x(&part, 1, 64, nullptr, 1), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gemv16_mma(nullptr, 1, 64, reinterpret_cast<const float*>(x.get()), 1), cudaErrorInvalidValue);
}

// gemv16_mma_swiglu: act = swiglu(gate product, up product) of gemv16_mma, bit for bit, for rows that end inside a
// tile and weights of more tiles than the device holds at once, both n-tile counts, x at both alignments; nothing
// past the outputs written. Then the argument errors.
TEST_F(CudaMatmul, bf16_gate_up_swiglu_equals_the_products_then_swiglu_bit_for_bit) {
  SCOPED_TRACE(seed_note());
  const int64_t cols = 1024, most = cuda::kGemv16MmaMaxTokens;
  for (int64_t rows : {int64_t{5}, int64_t{300}, int64_t{16} * 2 * sm_count() + 13}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    const auto wg = random_weights(DType::kBF16, rows, cols, rng_), wu = random_weights(DType::kBF16, rows, cols, rng_);
    test::DeviceBuffer dg(wg.size()), du(wu.size());
    DF_ASSERT_CUDA(cudaMemcpy(dg.get(), wg.data(), wg.size(), cudaMemcpyHostToDevice));
    DF_ASSERT_CUDA(cudaMemcpy(du.get(), wu.data(), wu.size(), cudaMemcpyHostToDevice));
    const auto x = random_x(most, cols, rng_);
    for (int64_t n : {1L, 7L, 8L, 9L, 16L})
      for (int shift : {0, 1}) {  // x `shift` floats into its buffer
        SCOPED_TRACE("n " + std::to_string(n) + " shift " + std::to_string(shift));
        test::DeviceBuffer dx((x.size() + 4) * 4);
        float* xp = reinterpret_cast<float*>(dx.get()) + shift;
        DF_ASSERT_CUDA(cudaMemcpy(xp, x.data(), static_cast<size_t>(n * cols) * 4, cudaMemcpyHostToDevice));
        const int64_t words = n * rows + kGuard;
        test::DeviceBuffer yg(words * 4), yu(words * 4), act(words * 4), ref(words * 4);
        for (auto* b : {&yg, &yu, &act, &ref})
          DF_ASSERT_CUDA(cuda::fill_u32(reinterpret_cast<uint32_t*>(b->get()), words, kPoison));
        cuda::Gemv16Part parts[2] = {{dg.get(), rows, reinterpret_cast<float*>(yg.get())},
                                     {du.get(), rows, reinterpret_cast<float*>(yu.get())}};
        DF_ASSERT_CUDA(cuda::gemv16_mma(parts, 2, cols, xp, n));
        DF_ASSERT_CUDA(cuda::swiglu(reinterpret_cast<float*>(yg.get()), reinterpret_cast<float*>(yu.get()),
                                    reinterpret_cast<float*>(ref.get()), n * rows));
        DF_ASSERT_CUDA(cuda::gemv16_mma_swiglu(dg.get(), du.get(), rows, cols, xp, n,
                                               reinterpret_cast<float*>(act.get())));
        DF_ASSERT_CUDA(cudaDeviceSynchronize());
        std::vector<uint32_t> got(static_cast<size_t>(words)), want(got.size());
        DF_ASSERT_CUDA(cudaMemcpy(got.data(), act.get(), got.size() * 4, cudaMemcpyDeviceToHost));
        DF_ASSERT_CUDA(cudaMemcpy(want.data(), ref.get(), want.size() * 4, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < n * rows; ++i) {
          ASSERT_TRUE(std::isfinite(std::bit_cast<float>(want[i]))) << "token " << i / rows << " row " << i % rows;
          ASSERT_EQ(got[i], want[i]) << "token " << i / rows << " row " << i % rows;
        }
        for (int64_t i = n * rows; i < words; ++i) ASSERT_EQ(got[i], kPoison) << "guard overwritten at " << i;
      }
  }
  // Refused: a bad shape, null or misaligned pointers.
  test::DeviceBuffer w(64 * 64 * 2 + 16), x(4 * 64 * 33), y(4 * 64 * 33);
  const auto* xf = reinterpret_cast<const float*>(x.get());
  auto* yf = reinterpret_cast<float*>(y.get());
  EXPECT_EQ(cuda::gemv16_mma_swiglu(w.get(), w.get(), 64, 64, xf, cuda::kGemv16MmaBf16XFrom, yf),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gemv16_mma_swiglu(w.get(), w.get(), 64, 64, xf, 0, yf), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gemv16_mma_swiglu(w.get(), w.get(), 64, 96, xf, 1, yf), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gemv16_mma_swiglu(w.get(), w.get(), 64, 64, nullptr, 1, yf), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gemv16_mma_swiglu(w.get(), w.get(), 64, 64, xf + 1, 1, yf + 1), cudaSuccess);  // x 4-byte aligned
  EXPECT_EQ(cuda::gemv16_mma_swiglu(w.get() + 2, w.get(), 64, 64, xf, 1, yf), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gemv16_mma_swiglu(w.get(), nullptr, 64, 64, xf, 1, yf), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gemv16_mma_swiglu(w.get(), w.get(), 64, 64, xf, 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gemv16_mma_swiglu(w.get(), w.get(), -1, 64, xf, 1, yf), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gemv16_mma_swiglu(w.get(), w.get(), 0, 64, xf, 1, yf), cudaSuccess);
  DF_ASSERT_CUDA(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace dflash

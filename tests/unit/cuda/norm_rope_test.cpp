// Device RMSNorm, RoPE, activations, softmax and the elementwise ops (ops/cuda/norm_rope.h) against the
// CPU reference (ops/cpu/ops.h) on random inputs, outputs poisoned with NaN first.
// Tolerances: rms_norm, rope, add, mul repeat the CPU's float operations (no FMA contraction), so they
// agree to 2e-6 relative (the double sum or the double cos/sin may round differently in rare cases);
// silu/sigmoid/swiglu/softmax use the device expf (<= 2 ulp), checked to 2e-6 relative.
#include "ops/cuda/norm_rope.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "ops/cpu/ops.h"
#include "ops/cuda/dequantize.h"
#include "ops/cuda/fill.h"
#include "ops/cuda/gemv_q8.h"
#include "support/cuda_test_util.h"
#include "support/test_paths.h"
#include "tensor/dtype.h"

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
  for (int64_t dim : {64, 128, 256, 257, 384, 1000, 1024, 1025, 4096, 5120, 6000, 8192}) {
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

// The residual add fused with the next norm: x becomes x + delta bit for bit, y its norm.
TEST_F(NormRopeTest, AddRmsNormMatchesAddThenNorm) {
  SCOPED_TRACE(seed_note());
  for (int64_t dim : {128, 384, 1000, 4096, 5120, 9000}) {
    for (int64_t n : {1, 3}) {
      const std::string what = "add_rms_norm n=" + std::to_string(n) + " dim=" + std::to_string(dim);
      auto x = random(static_cast<size_t>(n * dim), -3.0f, 3.0f);
      auto delta = random(x.size(), -3.0f, 3.0f);
      auto w = random(static_cast<size_t>(dim), -2.0f, 2.0f);
      std::vector<float> sum(x.size()), want(x.size());
      for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + delta[i];
      cpu::rms_norm(sum.data(), w.data(), 1e-6f, n, dim, want.data());
      Dev<float> dx(x.size()), dd(x.size()), dw(w.size()), dy(x.size());
      DF_ASSERT_CUDA(dx.upload(x));
      DF_ASSERT_CUDA(dd.upload(delta));
      DF_ASSERT_CUDA(dw.upload(w));
      DF_ASSERT_CUDA(dy.poison());
      DF_ASSERT_CUDA(cuda::add_rms_norm(dx.get(), dd.get(), dw.get(), 1e-6f, n, dim, dy.get()));
      EXPECT_EQ(dx.download(), sum) << what;
      expect_close(dy.download(), want, 2e-6, 0.0, what);
    }
  }
  Dev<float> d(64);
  EXPECT_EQ(cuda::add_rms_norm(d.get(), d.get(), nullptr, 1e-6f, 1, 64, d.get()), cudaErrorInvalidValue);
}

// RMSNorm (and the residual add fused with it) writing its output's int8 form beside it, for the warp kernel
// (dim <= 256) and the block kernel (a lane pair a block from the row staged in shared memory, including a
// last warp only partly on: dims 384 and 4128): y is unchanged, and the int8 form is bit for bit what quantize_q8_rows
// makes of y, also for a row of zeros (codes and scale 0) and a row holding inf (scale NaN, codes 0).
// Widths the kernels cannot quantize are refused.
TEST_F(NormRopeTest, RmsNormQ8OutputEqualsQuantizingTheOutput) {
  SCOPED_TRACE(seed_note());
  for (int64_t dim : {64, 256, 384, 1024, 4096, 4128, 5120, 8192}) {
    for (int64_t n : {1, 4}) {
      for (bool add : {false, true}) {
        const std::string what = std::string(add ? "add_rms_norm" : "rms_norm") + " n=" + std::to_string(n) +
                                 " dim=" + std::to_string(dim);
        const size_t e = static_cast<size_t>(n * dim);
        auto x = random(e, -3.0f, 3.0f);
        auto delta = random(e, -1.0f, 1.0f);
        auto w = random(static_cast<size_t>(dim), -2.0f, 2.0f);
        if (n > 1) {
          std::fill(x.begin() + dim, x.begin() + 2 * dim, 0.0f);  // row 1: zeros
          std::fill(delta.begin() + dim, delta.begin() + 2 * dim, 0.0f);
          x[static_cast<size_t>(2 * dim + 37)] = std::numeric_limits<float>::infinity();  // row 2: an inf
        }
        Dev<float> dx(e), dd(e), dw(w.size()), dy(e), plain(e), x2(e), wd(e / 32), qd(e / 32);
        Dev<int8_t> q(e), wq(e);
        Dev<int> qs(e / 16), ws(e / 16);
        DF_ASSERT_CUDA(dx.upload(x));
        DF_ASSERT_CUDA(x2.upload(x));
        DF_ASSERT_CUDA(dd.upload(delta));
        DF_ASSERT_CUDA(dw.upload(w));
        DF_ASSERT_CUDA(dy.poison());
        const cuda::Q8Out q8{q.get(), qd.get(), qs.get()};
        if (add) {
          DF_ASSERT_CUDA(cuda::add_rms_norm(dx.get(), dd.get(), dw.get(), 1e-6f, n, dim, dy.get(), nullptr, q8));
          DF_ASSERT_CUDA(cuda::add_rms_norm(x2.get(), dd.get(), dw.get(), 1e-6f, n, dim, plain.get()));
          EXPECT_EQ(dx.download(), x2.download()) << what;
        } else {
          DF_ASSERT_CUDA(cuda::rms_norm(dx.get(), dw.get(), 1e-6f, n, dim, dy.get(), nullptr, q8));
          DF_ASSERT_CUDA(cuda::rms_norm(dx.get(), dw.get(), 1e-6f, n, dim, plain.get()));
        }
        const auto y = dy.download(), want_y = plain.download();
        EXPECT_EQ(0, std::memcmp(y.data(), want_y.data(), e * 4)) << what;
        DF_ASSERT_CUDA(cuda::quantize_q8_rows(dy.get(), n, dim, wq.get(), wd.get(), ws.get()));
        EXPECT_EQ(q.download(), wq.download()) << what;
        const auto gd = qd.download(), want_d = wd.download();
        EXPECT_EQ(0, std::memcmp(gd.data(), want_d.data(), gd.size() * 4)) << what;
        EXPECT_EQ(qs.download(), ws.download()) << what;
        if (n > 1) {
          EXPECT_EQ(gd[static_cast<size_t>(dim / 32)], 0.0f) << what << ": the zero row's scale";
          EXPECT_TRUE(std::isnan(gd[static_cast<size_t>(2 * dim / 32 + 1)])) << what << ": the inf's block";
        }
      }
    }
  }
  EXPECT_TRUE(cuda::rms_norm_q8_supported(8192));
  Dev<float> d(8224 * 2);
  Dev<int8_t> q(8224 * 2);
  Dev<float> qd(8224 * 2 / 32);
  Dev<int> qs(8224 * 2 / 16);
  const cuda::Q8Out q8{q.get(), qd.get(), qs.get()};
  for (int64_t dim : {80, 8224}) {
    EXPECT_FALSE(cuda::rms_norm_q8_supported(dim));
    EXPECT_EQ(cuda::rms_norm(d.get(), nullptr, 1e-6f, 1, dim, d.get(), nullptr, q8), cudaErrorInvalidValue) << dim;
  }
  const cuda::Q8Out misaligned{q.get() + 4, qd.get(), qs.get()};
  EXPECT_EQ(cuda::rms_norm(d.get(), nullptr, 1e-6f, 1, 64, d.get(), nullptr, misaligned), cudaErrorInvalidValue);
}

// SwiGLU writing its output's int8 form beside it (what the down projection's GEMV reads instead of
// quantizing): the f32 output is unchanged, and the int8 form is bit for bit what quantize_q8_rows makes
// of it, also when the grid-stride loop wraps; a length that is not a multiple of 32 is refused.
TEST_F(NormRopeTest, SwigluQ8OutputEqualsQuantizingTheOutput) {
  SCOPED_TRACE(seed_note());
  for (int64_t e : {int64_t{32}, int64_t{12288}, int64_t{3} * 17408, int64_t{1} << 24}) {
    const std::string what = "swiglu n=" + std::to_string(e);
    auto g = random(static_cast<size_t>(e), -4.0f, 4.0f);
    auto u = random(static_cast<size_t>(e), -3.0f, 3.0f);
    Dev<float> dg(g.size()), du(u.size()), dy(g.size()), plain(g.size()), wd(g.size() / 32);
    Dev<int8_t> q(g.size()), wq(g.size());
    Dev<float> qd(g.size() / 32);
    Dev<int> qs(g.size() / 16), ws(g.size() / 16);
    DF_ASSERT_CUDA(dg.upload(g));
    DF_ASSERT_CUDA(du.upload(u));
    DF_ASSERT_CUDA(dy.poison());
    DF_ASSERT_CUDA(cuda::swiglu(dg.get(), du.get(), dy.get(), e, nullptr, cuda::Q8Out{q.get(), qd.get(), qs.get()}));
    DF_ASSERT_CUDA(cuda::swiglu(dg.get(), du.get(), plain.get(), e));
    const auto y = dy.download();
    EXPECT_EQ(y, plain.download()) << what;
    DF_ASSERT_CUDA(cuda::quantize_q8_rows(dy.get(), 1, e, wq.get(), wd.get(), ws.get()));
    EXPECT_EQ(q.download(), wq.download()) << what;
    const auto gd = qd.download(), want_d = wd.download();
    EXPECT_EQ(0, std::memcmp(gd.data(), want_d.data(), gd.size() * 4)) << what;
    EXPECT_EQ(qs.download(), ws.download()) << what;
  }
  Dev<float> d(96);
  Dev<int8_t> q(96);
  Dev<float> qd(3);
  Dev<int> qs(6);
  EXPECT_EQ(cuda::swiglu(d.get(), d.get(), d.get(), 80, nullptr, cuda::Q8Out{q.get(), qd.get(), qs.get()}),
            cudaErrorInvalidValue);
}

// The producers' bf16 side (Q8Out::xb): rms_norm and add_rms_norm (the warp kernel at 64, the block kernel at 384,
// 1024 and 5120), swiglu (also where the grid-stride loop wraps) and sigmoid_gate_mul write their output's bf16
// bits beside it, with the int8 form or without it: the f32 output is unchanged, and the bits are what
// dequantize_rows (F32 -> BF16: the conversion they save) makes of it. A width the norms cannot take is refused.
TEST_F(NormRopeTest, ProducersWriteTheBf16FormOfTheirOutput) {
  SCOPED_TRACE(seed_note());
  const auto make_xb = [](size_t e) {
    auto xb = std::make_unique<Dev<uint16_t>>(e);
    EXPECT_EQ(cudaMemset(xb->get(), 0xff, 2 * e), cudaSuccess);  // 0xffff: a NaN no conversion writes
    return xb;
  };
  const auto expect_bf16_of = [&](const float* y, const Dev<uint16_t>& xb, int64_t rows, int64_t dim,
                                  const std::string& what) {
    const auto want = make_xb(static_cast<size_t>(rows * dim));
    ASSERT_EQ(cuda::dequantize_rows(DType::kF32, y, reinterpret_cast<__nv_bfloat16*>(want->get()), rows, dim),
              cudaSuccess)
        << what;
    EXPECT_EQ(xb.download(), want->download()) << what;
  };
  for (int64_t dim : {64, 384, 1024, 5120})
    for (int64_t n : {1, 23})
      for (bool add : {false, true})
        for (bool with_q8 : {false, true}) {
          const std::string what = std::string(add ? "add_rms_norm" : "rms_norm") + " n=" + std::to_string(n) +
                                   " dim=" + std::to_string(dim) + (with_q8 ? " with int8" : "");
          const size_t e = static_cast<size_t>(n * dim);
          Dev<float> dx(e), dd(e), dw(static_cast<size_t>(dim)), dy(e), plain(e), x2(e), qd(e / 32);
          Dev<int8_t> q(e);
          Dev<int> qs(e / 16);
          const auto xb = make_xb(e);
          const auto x = random(e, -3.0f, 3.0f);
          DF_ASSERT_CUDA(dx.upload(x));
          DF_ASSERT_CUDA(x2.upload(x));
          DF_ASSERT_CUDA(dd.upload(random(e, -1.0f, 1.0f)));
          DF_ASSERT_CUDA(dw.upload(random(static_cast<size_t>(dim), -2.0f, 2.0f)));
          DF_ASSERT_CUDA(dy.poison());
          const cuda::Q8Out out{with_q8 ? q.get() : nullptr, with_q8 ? qd.get() : nullptr,
                                with_q8 ? qs.get() : nullptr, xb->get()};
          if (add) {
            DF_ASSERT_CUDA(cuda::add_rms_norm(dx.get(), dd.get(), dw.get(), 1e-6f, n, dim, dy.get(), nullptr, out));
            DF_ASSERT_CUDA(cuda::add_rms_norm(x2.get(), dd.get(), dw.get(), 1e-6f, n, dim, plain.get()));
          } else {
            DF_ASSERT_CUDA(cuda::rms_norm(dx.get(), dw.get(), 1e-6f, n, dim, dy.get(), nullptr, out));
            DF_ASSERT_CUDA(cuda::rms_norm(dx.get(), dw.get(), 1e-6f, n, dim, plain.get()));
          }
          const auto y = dy.download(), want_y = plain.download();
          EXPECT_EQ(0, std::memcmp(y.data(), want_y.data(), e * 4)) << what;
          expect_bf16_of(dy.get(), *xb, n, dim, what);
        }
  for (int64_t e : {int64_t{32} * 23, int64_t{23} * 17408, int64_t{1} << 24}) {
    const std::string what = "swiglu n=" + std::to_string(e);
    const size_t ne = static_cast<size_t>(e);
    Dev<float> dg(ne), du(ne), dy(ne), plain(ne);
    const auto xb = make_xb(ne);
    DF_ASSERT_CUDA(dg.upload(random(ne, -4.0f, 4.0f)));
    DF_ASSERT_CUDA(du.upload(random(ne, -3.0f, 3.0f)));
    DF_ASSERT_CUDA(dy.poison());
    DF_ASSERT_CUDA(
        cuda::swiglu(dg.get(), du.get(), dy.get(), e, nullptr, cuda::Q8Out{nullptr, nullptr, nullptr, xb->get()}));
    DF_ASSERT_CUDA(cuda::swiglu(dg.get(), du.get(), plain.get(), e));
    EXPECT_EQ(dy.download(), plain.download()) << what;
    expect_bf16_of(dy.get(), *xb, 1, e, what);
  }
  {
    const int64_t rows = 23, dim = 256;
    const size_t e = static_cast<size_t>(rows * dim);
    const auto o = random(e, -2.0f, 2.0f);
    Dev<float> d_o(e), d_plain(e), gate(2 * e);
    const auto xb = make_xb(e);
    DF_ASSERT_CUDA(d_o.upload(o));
    DF_ASSERT_CUDA(d_plain.upload(o));
    DF_ASSERT_CUDA(gate.upload(random(2 * e, -3.0f, 3.0f)));
    DF_ASSERT_CUDA(cuda::sigmoid_gate_mul(d_o.get(), gate.get() + dim, rows, dim, 2 * dim, nullptr,
                                          cuda::Q8Out{nullptr, nullptr, nullptr, xb->get()}));
    DF_ASSERT_CUDA(cuda::sigmoid_gate_mul(d_plain.get(), gate.get() + dim, rows, dim, 2 * dim));
    EXPECT_EQ(d_o.download(), d_plain.download()) << "sigmoid_gate_mul";
    expect_bf16_of(d_o.get(), *xb, rows, dim, "sigmoid_gate_mul");
  }
  Dev<float> d(8224);
  const auto xb = make_xb(8224);
  EXPECT_EQ(cuda::rms_norm(d.get(), nullptr, 1e-6f, 1, 8224, d.get(), nullptr,
                           cuda::Q8Out{nullptr, nullptr, nullptr, xb->get()}),
            cudaErrorInvalidValue);
}

// The fused attention input prep against rms_norm + rope_neox + the KV rows placed by hand on the CPU. q_from > 0:
// queries of the last n - q_from tokens only (a DFlash draft's block over its context and block keys).
TEST_F(NormRopeTest, QkPrepMatchesNormRopeAndKvWrite) {
  SCOPED_TRACE(seed_note());
  struct Case {
    int64_t n, nh, nkv, hd, rot, first_slot, q_from;
  };
  for (const Case& c : {Case{1, 32, 8, 128, 128, 130, 0}, Case{5, 4, 2, 256, 64, 61, 0}, Case{3, 2, 1, 64, 64, 0, 0},
                        Case{26, 6, 2, 64, 64, 40, 10}, Case{4, 2, 1, 64, 64, 3, 3}}) {
    const std::string what = "qk_prep n=" + std::to_string(c.n) + " hd=" + std::to_string(c.hd) +
                             " rot=" + std::to_string(c.rot) + " q_from=" + std::to_string(c.q_from);
    ASSERT_TRUE(cuda::qk_prep_supported(c.hd, c.rot)) << what;
    const int64_t nq = c.n - c.q_from;
    auto q = random(static_cast<size_t>(nq * c.nh * c.hd), -3.0f, 3.0f);
    auto k = random(static_cast<size_t>(c.n * c.nkv * c.hd), -3.0f, 3.0f);
    auto v = random(k.size(), -3.0f, 3.0f);
    auto qn = random(static_cast<size_t>(c.hd), -2.0f, 2.0f), kn = random(static_cast<size_t>(c.hd), -2.0f, 2.0f);
    std::vector<int32_t> pos(static_cast<size_t>(c.n));
    for (int64_t t = 0; t < c.n; ++t) pos[t] = static_cast<int32_t>(c.first_slot + 3 * t + 1);  // not the slots
    const double theta = 1e6;
    std::vector<float> want_q = q, want_k = k;
    cpu::rms_norm(want_q.data(), qn.data(), 1e-6f, nq * c.nh, c.hd, want_q.data());
    cpu::rms_norm(want_k.data(), kn.data(), 1e-6f, c.n * c.nkv, c.hd, want_k.data());
    cpu::rope_neox(want_q.data(), nq, c.nh, c.hd, c.rot, std::span<const int32_t>(pos).subspan(c.q_from), theta, 1.0);
    cpu::rope_neox(want_k.data(), c.n, c.nkv, c.hd, c.rot, pos, theta, 1.0);
    std::vector<double> inv(static_cast<size_t>(c.rot / 2));
    for (size_t i = 0; i < inv.size(); ++i) inv[i] = std::pow(theta, -2.0 * static_cast<double>(i) / c.rot);
    const int64_t chunk = 64, row = c.nkv * c.hd, chunks = (c.first_slot + c.n) / chunk + 1;
    std::vector<std::unique_ptr<Dev<float>>> kc, vc;
    std::vector<float*> kp, vp;
    for (int64_t i = 0; i < chunks; ++i) {
      kc.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(chunk * row)));
      vc.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(chunk * row)));
      DF_ASSERT_CUDA(kc.back()->poison());
      DF_ASSERT_CUDA(vc.back()->poison());
      kp.push_back(kc.back()->get());
      vp.push_back(vc.back()->get());
    }
    Dev<float*> kt(kp.size()), vt(vp.size());
    DF_ASSERT_CUDA(kt.upload(kp));
    DF_ASSERT_CUDA(vt.upload(vp));
    Dev<float> dq(q.size()), dk(k.size()), dv(v.size()), dqn(qn.size()), dkn(kn.size());
    Dev<double> dinv(inv.size());
    Dev<int32_t> dpos(pos.size());
    DF_ASSERT_CUDA(dq.upload(q));
    DF_ASSERT_CUDA(dk.upload(k));
    DF_ASSERT_CUDA(dv.upload(v));
    DF_ASSERT_CUDA(dqn.upload(qn));
    DF_ASSERT_CUDA(dkn.upload(kn));
    DF_ASSERT_CUDA(dinv.upload(inv));
    DF_ASSERT_CUDA(dpos.upload(pos));
    cuda::QkPrepArgs a{dq.get(), dk.get(), dv.get(), c.n, c.nh, c.nkv, c.hd, c.rot, dqn.get(), dkn.get(), 1e-6f,
                       dinv.get(), dpos.get(), kt.get(), vt.get(), chunk, c.first_slot, nullptr};
    a.q_from = c.n + 1;
    EXPECT_EQ(cuda::qk_prep(a), cudaErrorInvalidValue) << what << ": queries past the tokens";
    a.q_from = c.q_from;
    DF_ASSERT_CUDA(cuda::qk_prep(a));
    DF_ASSERT_CUDA(cudaDeviceSynchronize());
    expect_close(dq.download(), want_q, 2e-6, 1e-6, what + " q");
    std::vector<float> got_k, got_v;
    for (int64_t t = 0; t < c.n; ++t) {
      const int64_t slot = c.first_slot + t;
      const auto kh = kc[static_cast<size_t>(slot / chunk)]->download(), vh = vc[static_cast<size_t>(slot / chunk)]->download();
      got_k.insert(got_k.end(), kh.begin() + (slot % chunk) * row, kh.begin() + (slot % chunk + 1) * row);
      got_v.insert(got_v.end(), vh.begin() + (slot % chunk) * row, vh.begin() + (slot % chunk + 1) * row);
    }
    expect_close(got_k, want_k, 2e-6, 1e-6, what + " k in the store");
    EXPECT_EQ(got_v, v) << what << " v in the store";
    const auto before = kc[static_cast<size_t>((c.first_slot + c.n) / chunk)]->download();
    EXPECT_TRUE(std::isnan(before[((c.first_slot + c.n) % chunk) * row])) << what << ": the next slot was written";
  }
  EXPECT_FALSE(cuda::qk_prep_supported(64, 16));
  EXPECT_FALSE(cuda::qk_prep_supported(48, 48));
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

// The CUDA glue kernels against CpuBackend's on random inputs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/cuda/dequantize.h"
#include "ops/cuda/fill.h"
#include "ops/cuda/glue.h"
#include "ops/cuda/gemv_q8.h"
#include "ops/cuda/norm_rope.h"
#include "support/cuda_test_util.h"
#include "support/test_paths.h"
#include "tensor/dtype.h"

namespace dflash {
namespace {


template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  // Zeroed: an element no kernel writes compares equal between two arrays (not whatever the allocator left).
  explicit Dev(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  void put(const std::vector<T>& h) { ASSERT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  void poison() { ASSERT_EQ(cuda::fill_u32(reinterpret_cast<uint32_t*>(p), n * sizeof(T) / 4, 0x7fc00000u), cudaSuccess); }
};

class CudaGlue : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  std::vector<float> normal(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
  uint32_t seed_ = 0;
  std::mt19937 rng_;
  CpuBackend cpu_{1};
};

TEST_F(CudaGlue, slice_columns_and_gather_rows_copy_exactly) {
  const int64_t rows = 37, width = 300;
  auto src = normal(rows * width);
  Dev<float> d_src(src.size()), d_dst(rows * 64);
  d_src.put(src);
  d_dst.poison();
  ASSERT_EQ(cuda::slice_columns(d_src.p, rows, width, 100, 64, d_dst.p), cudaSuccess);
  std::vector<float> want(rows * 64);
  ASSERT_TRUE(cpu_.slice_columns(src.data(), rows, width, 100, 64, want.data()).ok());
  EXPECT_EQ(d_dst.get(), want) << "seed " << seed_;
  EXPECT_EQ(cuda::slice_columns(d_src.p, rows, width, 250, 64, d_dst.p), cudaErrorInvalidValue);

  std::vector<int64_t> idx = {5, 0, 36, 5};
  Dev<int64_t> d_idx(idx.size());
  d_idx.put(idx);
  Dev<float> d_g(idx.size() * width);
  d_g.poison();
  ASSERT_EQ(cuda::gather_rows(d_src.p, width, d_idx.p, static_cast<int64_t>(idx.size()), d_g.p), cudaSuccess);
  std::vector<float> gw(idx.size() * width);
  ASSERT_TRUE(cpu_.gather_rows(src.data(), width, idx, gw.data()).ok());
  EXPECT_EQ(d_g.get(), gw);
}

// The warp's butterfly sums the squares in another order than the CPU's loop: a few ulps.
TEST_F(CudaGlue, l2_norm_rows_match_within_ulps) {
  for (int64_t dim : {16, 128, 129}) {
    const int64_t rows = 75;
    auto x = normal(rows * dim, 3.0f);
    Dev<float> d(x.size());
    d.put(x);
    ASSERT_EQ(cuda::l2_norm_rows(d.p, rows, dim, 1e-6f, 0.125f), cudaSuccess);
    auto want = x;
    ASSERT_TRUE(cpu_.l2_norm_rows(want.data(), rows, dim, 1e-6f, 0.125f).ok());
    auto got = d.get();
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-6f * std::abs(want[i]) + 1e-12f) << "dim " << dim << " " << i << " seed " << seed_;
  }
}

TEST_F(CudaGlue, deltanet_gates_match_within_libm_ulps) {
  const int64_t n = 33, heads = 48;
  auto a = normal(n * heads, 4.0f), b = normal(n * heads, 4.0f), dt = normal(heads), ssm = normal(heads);
  for (auto& s : ssm) s = -std::exp(s);
  Dev<float> da(a.size()), db(b.size()), ddt(dt.size()), dssm(ssm.size());
  da.put(a);
  db.put(b);
  ddt.put(dt);
  dssm.put(ssm);
  ASSERT_EQ(cuda::deltanet_gates(da.p, db.p, ddt.p, dssm.p, n, heads), cudaSuccess);
  ASSERT_TRUE(cpu_.deltanet_gates(a.data(), b.data(), dt.data(), ssm.data(), n, heads).ok());
  auto ga = da.get(), gb = db.get();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(ga[i], a[i], 1e-5f * std::max(1.0f, std::abs(a[i]))) << i << " seed " << seed_;
    EXPECT_NEAR(gb[i], b[i], 1e-6f) << i;
  }
}

// deltanet_prep (one fused launch) against CpuBackend's composite (conv, slices, L2 norms, gates): chain
// form (window moved as the CPU moves it, bit for bit), tree form (window untouched), several head shapes
// and token counts; outputs poisoned first. Then one-token calls reproduce one call bit for bit.
struct PrepShape {
  int64_t Hk, Hv, dk, dv, K;
};
struct PrepRun {
  std::vector<float> q, k, v, a, b, state;
};

class CudaDeltaNetPrep : public CudaGlue {
 protected:
  void SetUp() override {
    CudaGlue::SetUp();
  }
  void make(const PrepShape& sh, int64_t n) {
    const int64_t C = 2 * sh.Hk * sh.dk + sh.Hv * sh.dv;
    mixed_ = normal(n * C, 2.0f), w_ = normal(C * sh.K, 0.5f), st0_ = normal((sh.K - 1) * C);
    a_ = normal(n * sh.Hv, 3.0f), b_ = normal(n * sh.Hv, 3.0f), dt_ = normal(sh.Hv), ssm_ = normal(sh.Hv);
    for (auto& x : ssm_) x = -std::exp(x);
  }
  PrepRun cpu_run(const PrepShape& sh, int64_t n, std::span<const int32_t> parents) {
    PrepRun r{std::vector<float>(n * sh.Hk * sh.dk), std::vector<float>(n * sh.Hk * sh.dk),
              std::vector<float>(n * sh.Hv * sh.dv), a_, b_, st0_};
    const cpu::DeltaNetShape s{sh.Hk, sh.Hv, sh.dk, sh.dv};
    EXPECT_TRUE(cpu_.deltanet_prep(mixed_.data(), n, s, w_.data(), sh.K, r.state.data(), parents, r.q.data(),
                                   r.k.data(), r.v.data(), r.a.data(), r.b.data(), dt_.data(), ssm_.data())
                    .ok());
    return r;
  }
  // Calls of `steps` tokens each (their sum is n), the window carried on the device. The first call also writes
  // its capture (DeltaNetPrepArgs::conv_capture), checked bit for bit: the window before it, then its inputs.
  PrepRun gpu_run(const PrepShape& sh, int64_t n, const std::vector<int32_t>& parents, std::vector<int64_t> steps) {
    const int64_t C = 2 * sh.Hk * sh.dk + sh.Hv * sh.dv;
    Dev<float> dm(mixed_.size()), dw(w_.size()), dst(std::max<size_t>(1, st0_.size())), dq(n * sh.Hk * sh.dk),
        dk(n * sh.Hk * sh.dk), dv(n * sh.Hv * sh.dv), da(a_.size()), db(b_.size()), ddt(dt_.size()), dssm(ssm_.size());
    Dev<int32_t> dpar(std::max<size_t>(1, parents.size()));
    dm.put(mixed_), dw.put(w_), da.put(a_), db.put(b_), ddt.put(dt_), dssm.put(ssm_);
    if (!st0_.empty()) dst.put(st0_);
    if (!parents.empty()) dpar.put(parents);
    dq.poison(), dk.poison(), dv.poison();
    Dev<float> cap((sh.K - 1 + steps.at(0)) * C);
    cap.poison();
    int64_t t0 = 0;
    for (const int64_t len : steps) {
      cuda::DeltaNetPrepArgs a;
      a.mixed = dm.p + t0 * C;
      a.n_k_heads = sh.Hk, a.n_v_heads = sh.Hv, a.d_k = sh.dk, a.d_v = sh.dv;
      a.conv_w = dw.p;
      a.kernel = static_cast<int>(sh.K);
      a.conv_state = sh.K > 1 ? dst.p : nullptr;
      a.parents = parents.empty() ? nullptr : dpar.p;
      a.q = dq.p + t0 * sh.Hk * sh.dk, a.k = dk.p + t0 * sh.Hk * sh.dk, a.v = dv.p + t0 * sh.Hv * sh.dv;
      a.alpha = da.p + t0 * sh.Hv, a.beta = db.p + t0 * sh.Hv;
      a.dt_bias = ddt.p, a.ssm_a = dssm.p;
      a.q_scale = 1.0f / std::sqrt(static_cast<float>(sh.dk));
      if (t0 == 0) a.conv_capture = cap.p;
      EXPECT_EQ(cuda::deltanet_prep(a, len, nullptr), cudaSuccess);
      t0 += len;
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> want_cap = st0_;
    want_cap.insert(want_cap.end(), mixed_.begin(), mixed_.begin() + steps[0] * C);
    EXPECT_EQ(cap.get(), want_cap) << "conv capture of the first call";
    PrepRun r{dq.get(), dk.get(), dv.get(), da.get(), db.get(), st0_.empty() ? std::vector<float>{} : dst.get()};
    return r;
  }
  void expect_close(const PrepRun& got, const PrepRun& want) {
    const auto near = [&](const std::vector<float>& g, const std::vector<float>& w, const char* what, float rel) {
      ASSERT_EQ(g.size(), w.size()) << what;
      for (size_t i = 0; i < w.size(); ++i)
        ASSERT_NEAR(g[i], w[i], rel * (std::abs(w[i]) + 1e-3f)) << what << " " << i << " seed " << seed_;
    };
    near(got.q, want.q, "q", 4e-6f);
    near(got.k, want.k, "k", 4e-6f);
    near(got.v, want.v, "v", 2e-6f);
    near(got.a, want.a, "decay", 1e-5f);
    near(got.b, want.b, "beta", 1e-5f);
  }
  std::vector<float> mixed_, w_, st0_, a_, b_, dt_, ssm_;
};

const PrepShape kPrepShapes[] = {{2, 4, 128, 128, 4}, {1, 3, 32, 64, 4}, {2, 2, 200, 256, 2}, {3, 3, 40, 72, 1}};

TEST_F(CudaDeltaNetPrep, chain_matches_cpu_and_moves_the_window_bit_for_bit) {
  for (const auto& sh : kPrepShapes)
    for (int64_t n : {1, 2, 7, 64}) {
      SCOPED_TRACE("dk " + std::to_string(sh.dk) + " K " + std::to_string(sh.K) + " n " + std::to_string(n));
      make(sh, n);
      const PrepRun want = cpu_run(sh, n, {});
      const PrepRun got = gpu_run(sh, n, {}, {n});
      expect_close(got, want);
      EXPECT_EQ(got.state, sh.K > 1 ? want.state : std::vector<float>{});
    }
}

TEST_F(CudaDeltaNetPrep, tree_matches_cpu_and_leaves_the_window) {
  for (const auto& sh : kPrepShapes)
    for (int64_t n : {1, 5, 23}) {
      SCOPED_TRACE("tree dk " + std::to_string(sh.dk) + " n " + std::to_string(n));
      std::vector<int32_t> parents(static_cast<size_t>(n));
      parents[0] = -1;
      for (int64_t i = 1; i < n; ++i)
        parents[static_cast<size_t>(i)] = static_cast<int32_t>(std::uniform_int_distribution<int64_t>(-1, i - 1)(rng_));
      make(sh, n);
      const PrepRun want = cpu_run(sh, n, parents);
      const PrepRun got = gpu_run(sh, n, parents, {n});
      expect_close(got, want);
      EXPECT_EQ(got.state, sh.K > 1 ? st0_ : std::vector<float>{});
    }
}

// A token's outputs do not depend on how many tokens share the call (decode steps vs a verify chain).
TEST_F(CudaDeltaNetPrep, one_token_calls_equal_one_call) {
  const PrepShape sh{2, 4, 128, 128, 4};
  const int64_t n = 9;
  make(sh, n);
  const PrepRun one = gpu_run(sh, n, {}, {n});
  const PrepRun split = gpu_run(sh, n, {}, {1, 1, 3, 1, 2, 1});
  EXPECT_EQ(split.q, one.q);
  EXPECT_EQ(split.k, one.k);
  EXPECT_EQ(split.v, one.v);
  EXPECT_EQ(split.a, one.a);
  EXPECT_EQ(split.b, one.b);
  EXPECT_EQ(split.state, one.state);
}

TEST_F(CudaDeltaNetPrep, refuses_bad_arguments) {
  cuda::DeltaNetPrepArgs a;
  EXPECT_EQ(cuda::deltanet_prep(a, 1, nullptr), cudaErrorInvalidValue);  // no shape, null buffers
  a.n_k_heads = 1, a.n_v_heads = 1, a.d_k = 512, a.d_v = 64, a.kernel = 4;
  EXPECT_EQ(cuda::deltanet_prep(a, 1, nullptr), cudaErrorInvalidValue);  // head dim past 256
}

// The int8 and bf16 forms a fused op writes beside its output (Q8Out), and the check that they equal
// quantize_q8_rows and dequantize_rows (F32 -> BF16) of that output bit for bit.
struct Q8Capture {
  explicit Q8Capture(int64_t elems)
      : xq(elems), xq_ref(elems), xd(elems / 32 + 1), xd_ref(elems / 32 + 1), xs(elems / 16 + 1),
        xs_ref(elems / 16 + 1), xb(elems), xb_ref(elems) {}
  cuda::Q8Out out(bool on) const { return on ? cuda::Q8Out{xq.p, xd.p, xs.p, xb.p} : cuda::Q8Out{}; }
  void expect_quantized(const float* y, int64_t rows, int64_t dim) {
    ASSERT_EQ(cuda::quantize_q8_rows(y, rows, dim, xq_ref.p, xd_ref.p, xs_ref.p), cudaSuccess);
    EXPECT_EQ(xq.get(), xq_ref.get());
    EXPECT_EQ(xd.get(), xd_ref.get());
    EXPECT_EQ(xs.get(), xs_ref.get());
    ASSERT_EQ(cuda::dequantize_rows(DType::kF32, y, reinterpret_cast<__nv_bfloat16*>(xb_ref.p), rows, dim),
              cudaSuccess);
    EXPECT_EQ(xb.get(), xb_ref.get());
  }
  Dev<int8_t> xq, xq_ref;
  Dev<float> xd, xd_ref;
  Dev<int> xs, xs_ref;
  Dev<uint16_t> xb, xb_ref;
};

// rms_norm_silu_gate against the CPU's rms_norm, silu and mul; with q8 its int8 and bf16 forms equal
// quantize_q8_rows and the bf16 conversion of its output bit for bit.
TEST_F(CudaGlue, rms_norm_silu_gate_matches_cpu_and_quantizes_its_output) {
  for (int64_t dim : {128, 100, 1024}) {
    const int64_t rows = 37;
    SCOPED_TRACE("dim " + std::to_string(dim));
    const auto o = normal(rows * dim, 2.0f), z = normal(rows * dim, 2.0f), w = normal(dim);
    Dev<float> d_o(o.size()), d_z(z.size()), d_w(w.size());
    d_o.put(o), d_z.put(z), d_w.put(w);
    const bool q8 = dim % 32 == 0;
    Q8Capture cap(rows * dim);
    const cuda::Q8Out out = cap.out(q8);
    ASSERT_EQ(cuda::rms_norm_silu_gate(d_o.p, d_w.p, 1e-6f, rows, dim, d_z.p, nullptr, out), cudaSuccess);
    auto want_o = o, want_z = z;
    ASSERT_TRUE(cpu_.rms_norm_silu_gate(want_o.data(), w.data(), 1e-6f, rows, dim, want_z.data()).ok());
    const auto got = d_o.get();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want_o[i], 2e-6f * (std::abs(want_o[i]) + 1e-3f)) << i << " seed " << seed_;
    if (q8) cap.expect_quantized(d_o.p, rows, dim);
  }
}

// sigmoid_gate_mul (gates read in place from rows of twice the width) against the CPU's slice, sigmoid and
// mul; with q8 its int8 and bf16 forms equal quantize_q8_rows and the bf16 conversion of its output bit for bit.
TEST_F(CudaGlue, sigmoid_gate_mul_matches_cpu_and_quantizes_its_output) {
  for (int64_t dim : {256, 100}) {
    const int64_t rows = 29;
    SCOPED_TRACE("dim " + std::to_string(dim));
    const auto o = normal(rows * dim, 2.0f), qg = normal(rows * 2 * dim, 3.0f);
    Dev<float> d_o(o.size()), d_qg(qg.size());
    d_o.put(o), d_qg.put(qg);
    const bool q8 = dim % 32 == 0;
    Q8Capture cap(rows * dim);
    const cuda::Q8Out out = cap.out(q8);
    ASSERT_EQ(cuda::sigmoid_gate_mul(d_o.p, d_qg.p + dim, rows, dim, 2 * dim, nullptr, out), cudaSuccess);
    auto want = o;
    ASSERT_TRUE(cpu_.sigmoid_gate_mul(want.data(), qg.data() + dim, rows, dim, 2 * dim).ok());
    const auto got = d_o.get();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 2e-6f * (std::abs(want[i]) + 1e-3f)) << i << " seed " << seed_;
    if (q8) cap.expect_quantized(d_o.p, rows, dim);
  }
  EXPECT_EQ(cuda::sigmoid_gate_mul(nullptr, nullptr, 2, 32, 16), cudaErrorInvalidValue);  // stride < dim
}

// copy_batch: items of many sizes in one launch (the float4 path where both pointers are 16-byte aligned and the
// count a multiple of 4, the scalar path otherwise, and an item far larger than the grid), each equal to its
// source; floats between the items untouched; bad arguments refused.
TEST_F(CudaGlue, copy_batch_copies_every_item) {
  const int64_t total = (int64_t{1} << 21) + 8192;
  const auto src = normal(static_cast<size_t>(total));
  Dev<float> d_src(src.size()), d_dst(src.size());
  d_src.put(src);
  d_dst.poison();
  // (dst offset, src offset, n), no two destinations overlapping: aligned and vectorised, odd counts, odd offsets,
  // one float, the large one.
  const std::vector<std::array<int64_t, 3>> spec = {{0, 64, 256},   {300, 1000, 77},  {401, 5, 64}, {600, 2001, 1},
                                                    {700, 3, 4093}, {8192, 4096, int64_t{1} << 21}};
  std::vector<cuda::DeviceCopy> items;
  for (const auto& [d, s, n] : spec) items.push_back({d_dst.p + d, d_src.p + s, n});
  Dev<cuda::DeviceCopy> table(items.size());
  table.put(items);
  ASSERT_EQ(cuda::copy_batch(table.p, static_cast<int>(items.size()), int64_t{1} << 21), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = d_dst.get();
  std::vector<bool> written(got.size(), false);
  for (const auto& [d, s, n] : spec)
    for (int64_t i = 0; i < n; ++i) {
      written[static_cast<size_t>(d + i)] = true;
      ASSERT_EQ(got[static_cast<size_t>(d + i)], src[static_cast<size_t>(s + i)]) << "item at " << d << ", float " << i;
    }
  for (size_t i = 0; i < got.size(); ++i) {
    if (!written[i]) {
      ASSERT_TRUE(std::isnan(got[i])) << "float " << i << " is no item's";
    }
  }
  EXPECT_EQ(cuda::copy_batch(table.p, 0, 0), cudaSuccess);
  EXPECT_EQ(cuda::copy_batch(nullptr, 2, 16), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::copy_batch(table.p, -1, 16), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::copy_batch(table.p, 70000, 16), cudaErrorInvalidValue);
}

// copy_floats: one copy a launch, aligned (float4) and not, one float, and one far larger than the grid; the floats
// around it untouched; bad arguments refused.
TEST_F(CudaGlue, copy_floats_copies_and_touches_nothing_else) {
  const int64_t total = (int64_t{1} << 21) + 8192;
  const auto src = normal(static_cast<size_t>(total));
  Dev<float> d_src(src.size()), d_dst(src.size());
  d_src.put(src);
  for (const auto& [d, s, n] : std::vector<std::array<int64_t, 3>>{
           {0, 64, 256}, {300, 1000, 77}, {401, 5, 64}, {600, 2001, 1}, {4096, 8192, int64_t{1} << 21}}) {
    SCOPED_TRACE("dst " + std::to_string(d) + ", src " + std::to_string(s) + ", n " + std::to_string(n));
    d_dst.poison();
    ASSERT_EQ(cuda::copy_floats(d_dst.p + d, d_src.p + s, n), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = d_dst.get();
    for (int64_t i = 0; i < total; ++i) {
      const auto at = static_cast<size_t>(i);
      if (i >= d && i < d + n) {
        ASSERT_EQ(got[at], src[static_cast<size_t>(s + i - d)]) << "float " << i - d;
      } else {
        ASSERT_TRUE(std::isnan(got[at])) << "float " << i << " is outside the copy";
      }
    }
  }
  EXPECT_EQ(cuda::copy_floats(d_dst.p, d_src.p, 0), cudaSuccess);
  EXPECT_EQ(cuda::copy_floats(nullptr, d_src.p, 4), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::copy_floats(d_dst.p, d_src.p, -1), cudaErrorInvalidValue);
}

// KV rows land at their positions across chunk boundaries, from a host or a device position.
TEST_F(CudaGlue, kv_write_places_rows_at_their_positions) {
  const int64_t chunk = 64, row = 96, chunks = 3, n = 7;
  std::vector<Dev<float>*> kc, vc;
  std::vector<float*> kp, vp;
  for (int64_t c = 0; c < chunks; ++c) {
    kc.push_back(new Dev<float>(chunk * row));
    vc.push_back(new Dev<float>(chunk * row));
    kc.back()->poison();
    vc.back()->poison();
    kp.push_back(kc.back()->p);
    vp.push_back(vc.back()->p);
  }
  Dev<float*> kt(chunks), vt(chunks);
  kt.put(kp);
  vt.put(vp);
  const auto k = normal(n * row), v = normal(n * row);
  Dev<float> dk(k.size()), dv(v.size());
  dk.put(k);
  dv.put(v);
  ASSERT_EQ(cuda::kv_write(kt.p, vt.p, chunk, row, dk.p, dv.p, n, 60, nullptr), cudaSuccess);  // 60..66
  Dev<int32_t> first(1);
  first.put({130});
  ASSERT_EQ(cuda::kv_write(kt.p, vt.p, chunk, row, dk.p, dv.p, 1, 0, first.p), cudaSuccess);  // row 0 at 130
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto at = [&](std::vector<Dev<float>*>& cs, int64_t pos) {
    const auto h = cs[static_cast<size_t>(pos / chunk)]->get();
    return std::vector<float>(h.begin() + (pos % chunk) * row, h.begin() + (pos % chunk + 1) * row);
  };
  for (int64_t t = 0; t < n; ++t) {
    EXPECT_EQ(at(kc, 60 + t), std::vector<float>(k.begin() + t * row, k.begin() + (t + 1) * row)) << t;
    EXPECT_EQ(at(vc, 60 + t), std::vector<float>(v.begin() + t * row, v.begin() + (t + 1) * row)) << t;
  }
  EXPECT_EQ(at(kc, 130), std::vector<float>(k.begin(), k.begin() + row));
  EXPECT_TRUE(std::isnan(at(kc, 59)[0]));  // untouched
  EXPECT_TRUE(std::isnan(at(kc, 67)[0]));
  for (auto* d : kc) delete d;
  for (auto* d : vc) delete d;
}

TEST_F(CudaGlue, gather_row_bytes_copies_rows_and_zeroes_bad_ids) {
  const int64_t rows = 10, rb = 37;
  std::vector<uint8_t> table(rows * rb);
  for (auto& b : table) b = static_cast<uint8_t>(rng_());
  Dev<uint8_t> dt(table.size()), out(4 * rb);
  dt.put(table);
  Dev<int32_t> ids(4);
  ids.put({3, 9, -1, 10});
  ASSERT_EQ(cuda::gather_row_bytes(dt.p, rb, rows, ids.p, 4, out.p), cudaSuccess);
  const auto got = out.get();
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + rb, table.begin() + 3 * rb));
  EXPECT_TRUE(std::equal(got.begin() + rb, got.begin() + 2 * rb, table.begin() + 9 * rb));
  for (int64_t i = 2 * rb; i < 4 * rb; ++i) EXPECT_EQ(got[i], 0) << i;
}

}  // namespace
}  // namespace dflash

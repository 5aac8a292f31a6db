// The CUDA glue kernels against CpuBackend's on random inputs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ops/backend.h"
#include "ops/cuda/fill.h"
#include "ops/cuda/glue.h"
#include "support/cuda_test_util.h"
#include "support/test_paths.h"

namespace dflash {
namespace {


template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess); }
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

TEST_F(CudaGlue, l2_norm_rows_is_bit_identical) {
  for (int64_t dim : {16, 128, 129}) {
    const int64_t rows = 75;
    auto x = normal(rows * dim, 3.0f);
    Dev<float> d(x.size());
    d.put(x);
    ASSERT_EQ(cuda::l2_norm_rows(d.p, rows, dim, 1e-6f, 0.125f), cudaSuccess);
    auto want = x;
    ASSERT_TRUE(cpu_.l2_norm_rows(want.data(), rows, dim, 1e-6f, 0.125f).ok());
    auto got = d.get();
    ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << "dim " << dim << " seed " << seed_;
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

// matmul and embedding_lookup against dequantize_row + a double dot, for every convertible type;
// bit-exact invariance to n and thread count; argument errors; an opt-in throughput benchmark.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "ops/backend.h"
#include "ops/cpu/ops.h"
#include "ops_test_util.h"
#include "tensor/quant.h"

namespace dflash::cpu {
namespace {

using test::SeededRng;

constexpr DType kAllTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ4_0, DType::kQ4_1,
                               DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kQ2_K, DType::kQ3_K,
                               DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_K};

struct Weight {
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // rows x cols, as dequantize_row gives them
  WeightView view;
};

Weight make_weight(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  Weight w;
  const uint64_t rb = row_bytes(t, static_cast<uint64_t>(cols)).value();
  w.bytes.resize(rb * rows);
  w.deq.resize(static_cast<size_t>(rows * cols));
  const auto src = test::normal_vec(rng, static_cast<size_t>(rows * cols), 0.05f);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(quantize_row(t, src.data() + r * cols, w.bytes.data() + r * rb, cols).ok());
    EXPECT_TRUE(dequantize_row(t, w.bytes.data() + r * rb, w.deq.data() + r * cols, cols).ok());
  }
  w.view = WeightView{t, rows, cols, w.bytes.data()};
  return w;
}

TEST(Matmul, EveryTypeMatchesDequantizedDoubleDot) {
  SeededRng s;
  ThreadPool pool(3);
  for (DType t : kAllTypes) {
    ASSERT_TRUE(row_conversion_supported(t));
    const int64_t block = dtype_info(t)->block_elems;
    // cols: a multiple of the block; plain types also get a ragged length (lane tail).
    std::vector<int64_t> col_cases = {block == 1 ? 96 : 2 * block, block == 1 ? 1001 : 512};
    if (block == 1) col_cases.push_back(13);
    for (int64_t cols : col_cases) {
      const int64_t rows = 37;
      Weight w = make_weight(t, rows, cols, s.rng);
      for (int64_t n : {1, 3, 17, 64}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " cols " + std::to_string(cols) + " n " + std::to_string(n));
        const auto x = test::normal_vec(s.rng, static_cast<size_t>(n * cols));
        std::vector<float> y(static_cast<size_t>(n * rows), NAN);
        ASSERT_TRUE(matmul(w.view, x.data(), n, y.data(), pool).ok());
        for (int64_t i = 0; i < n; ++i)
          for (int64_t r = 0; r < rows; ++r) {
            double ref = 0, mag = 0;
            for (int64_t c = 0; c < cols; ++c) {
              const double p = static_cast<double>(w.deq[r * cols + c]) * x[i * cols + c];
              ref += p;
              mag += std::abs(p);
            }
            ASSERT_NEAR(y[i * rows + r], ref, 1e-5 * mag + 1e-30) << "token " << i << " row " << r;
          }
      }
    }
  }
}

// x = identity: y[t, r] = W[r, t] exactly, so the weights matmul sees are dequantize_row's, bit for bit
// (up to the sign of zero).
TEST(Matmul, IdentityInputReproducesDequantizedWeights) {
  SeededRng s;
  ThreadPool pool(2);
  for (DType t : kAllTypes) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t block = dtype_info(t)->block_elems;
    const int64_t rows = 21, cols = block == 1 ? 40 : block * (block == 32 ? 3 : 1);
    Weight w = make_weight(t, rows, cols, s.rng);
    std::vector<float> eye(cols * cols, 0.0f), y(cols * rows);
    for (int64_t i = 0; i < cols; ++i) eye[i * cols + i] = 1.0f;
    ASSERT_TRUE(matmul(w.view, eye.data(), cols, y.data(), pool).ok());
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(y[c * rows + r], w.deq[r * cols + c]) << "row " << r << " col " << c;
  }
}

TEST(Matmul, BitIdenticalAcrossBatchSizeAndThreads) {
  SeededRng s;
  ThreadPool pool1(1), pool4(4);
  for (DType t : {DType::kF32, DType::kQ8_0, DType::kQ4_K}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t rows = 53, cols = 768, n = 19;
    Weight w = make_weight(t, rows, cols, s.rng);
    const auto x = test::normal_vec(s.rng, static_cast<size_t>(n * cols));
    std::vector<float> batched(static_cast<size_t>(n * rows)), threaded(batched.size());
    ASSERT_TRUE(matmul(w.view, x.data(), n, batched.data(), pool1).ok());
    ASSERT_TRUE(matmul(w.view, x.data(), n, threaded.data(), pool4).ok());
    ASSERT_EQ(0, std::memcmp(batched.data(), threaded.data(), batched.size() * sizeof(float)));
    std::vector<float> one(static_cast<size_t>(rows));
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(matmul(w.view, x.data() + i * cols, 1, one.data(), pool4).ok());
      ASSERT_EQ(0, std::memcmp(one.data(), batched.data() + i * rows, one.size() * sizeof(float))) << "token " << i;
    }
  }
}

TEST(Matmul, ArgumentErrors) {
  ThreadPool pool(1);
  std::vector<float> x(64), y(64);
  std::vector<uint8_t> data(4096);
  EXPECT_FALSE(matmul(WeightView{DType::kI32, 2, 32, data.data()}, x.data(), 1, y.data(), pool).ok());
  EXPECT_FALSE(matmul(WeightView{DType::kQ8_0, 2, 33, data.data()}, x.data(), 1, y.data(), pool).ok());
  EXPECT_FALSE(matmul(WeightView{DType::kQ4_K, 2, 32, data.data()}, x.data(), 1, y.data(), pool).ok());
  EXPECT_FALSE(matmul(WeightView{DType::kF32, -1, 32, data.data()}, x.data(), 1, y.data(), pool).ok());
  EXPECT_TRUE(matmul(WeightView{DType::kF32, 2, 32, data.data()}, x.data(), 0, y.data(), pool).ok());
}

TEST(EmbeddingLookup, RowsMatchDequantizeAndBadIdsFail) {
  SeededRng s;
  for (DType t : {DType::kF32, DType::kBF16, DType::kQ8_0, DType::kQ6_K}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t vocab = 11, dim = 256;
    Weight w = make_weight(t, vocab, dim, s.rng);
    const std::vector<int32_t> ids = {3, 0, 10, 3};
    std::vector<float> out(ids.size() * dim);
    ASSERT_TRUE(embedding_lookup(w.view, ids, out.data()).ok());
    for (size_t i = 0; i < ids.size(); ++i)
      ASSERT_EQ(0, std::memcmp(out.data() + i * dim, w.deq.data() + ids[i] * dim, dim * sizeof(float)));
    const std::vector<int32_t> bad = {1, 11};
    EXPECT_FALSE(embedding_lookup(w.view, bad, out.data()).ok());
    const std::vector<int32_t> neg = {-1};
    EXPECT_FALSE(embedding_lookup(w.view, neg, out.data()).ok());
  }
}

// Backend::weight_bytes / pack_weight (what Weights::to_backend uploads): on the CPU the stored bytes as they are,
// and an impossible shape is an error, not an allocation.
TEST(BackendWeights, the_default_form_is_the_stored_bytes) {
  SeededRng s;
  CpuBackend be(1);
  for (DType t : {DType::kF32, DType::kBF16, DType::kQ8_0, DType::kQ6_K}) {
    SCOPED_TRACE(dtype_name(t));
    Weight w = make_weight(t, 3, 256, s.rng);
    const auto bytes = be.weight_bytes(w.view);
    ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
    EXPECT_EQ(*bytes, *row_bytes(t, 256) * 3);
    std::vector<uint8_t> packed(*bytes, 0xaa);
    ASSERT_TRUE(be.pack_weight(w.view, packed.data()).ok());
    EXPECT_EQ(0, std::memcmp(packed.data(), w.view.data, *bytes));
  }
  EXPECT_FALSE(be.weight_bytes(WeightView{DType::kQ4_K, 2, 100, nullptr}).ok());  // not whole blocks
  EXPECT_FALSE(be.weight_bytes(WeightView{DType::kF32, int64_t{1} << 62, int64_t{1} << 20, nullptr}).ok());
  EXPECT_FALSE(be.weight_bytes(WeightView{DType::kF32, -1, 32, nullptr}).ok());
}

// Backend::matmul_swiglu's default (what the CPU backend runs): g = silu(x gate^T) * (x up^T) as matmul of each
// then swiglu, bit for bit; gate and up of different shapes refused with g untouched.
TEST(BackendMatmulSwiglu, the_default_is_the_products_then_swiglu) {
  SeededRng s;
  CpuBackend be(2);
  const int64_t rows = 37, cols = 256, n = 3;
  for (DType t : {DType::kBF16, DType::kQ8_0}) {
    SCOPED_TRACE(dtype_name(t));
    Weight wg = make_weight(t, rows, cols, s.rng), wu = make_weight(t, rows, cols, s.rng);
    const auto x = test::normal_vec(s.rng, static_cast<size_t>(n * cols), 2.0f);
    std::vector<float> g(static_cast<size_t>(n * rows)), u(g.size()), rg(g.size()), ru(g.size());
    ASSERT_TRUE(be.matmul_swiglu(wg.view, wu.view, x.data(), n, g.data(), u.data()).ok());
    ASSERT_TRUE(be.matmul(wg.view, x.data(), n, rg.data()).ok());
    ASSERT_TRUE(be.matmul(wu.view, x.data(), n, ru.data()).ok());
    ASSERT_TRUE(be.swiglu(rg.data(), ru.data(), rg.data(), n * rows).ok());
    EXPECT_EQ(g, rg);
    Weight narrow = make_weight(t, rows - 5, cols, s.rng);
    std::vector<float> before = g;
    EXPECT_EQ(be.matmul_swiglu(wg.view, narrow.view, x.data(), n, g.data(), u.data()).code(),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(g, before);
  }
}

}  // namespace
}  // namespace dflash::cpu

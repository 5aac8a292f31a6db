// CudaBackend's int8 side output: SwiGLU and the RMSNorms write their output's int8 form beside it, and the
// integer-dot GEMV that reads that output next (the down projection, the projections after a norm) uses it
// instead of quantizing.
// Checked against the same GEMV on a copy of the input (a copy is not a producer, so that GEMV quantizes
// for itself): the outputs must be equal bit for bit. An op that rewrites the input between its producer
// and the GEMV must make the GEMV quantize afresh (else it would multiply stale codes).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/gemv16_mma.h"
#include "ops/cuda/mmq.h"
#include "support/cuda_test_util.h"
#include "support/random_blocks.h"
#include "support/test_paths.h"
#include "tensor/dtype.h"
#include "tensor/half.h"

namespace dflash {
namespace {

class CudaQ8Side : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
    auto be = CudaBackend::create(0);
    ASSERT_TRUE(be.ok()) << be.status().to_string();
    be_ = std::move(be).value();
    const char* s = std::getenv("DFLASH_TEST_SEED");
    seed_ = s ? static_cast<uint32_t>(std::strtoul(s, nullptr, 10)) : std::random_device{}();
    rng_.seed(seed_);
  }
  void TearDown() override {
    for (void* p : device_) cudaFree(p);
  }
  Buffer upload(const std::vector<float>& v) {
    auto b = be_->alloc(static_cast<int64_t>(v.size()));
    EXPECT_TRUE(b.ok());
    EXPECT_TRUE(be_->upload(b->data(), v.data(), static_cast<int64_t>(v.size())).ok());
    return std::move(b).value();
  }
  Buffer alloc(int64_t n) { return std::move(be_->alloc(n)).value(); }
  std::vector<float> download(const Buffer& b) {
    std::vector<float> v(static_cast<size_t>(b.size()));
    EXPECT_TRUE(be_->download(v.data(), b.data(), b.size()).ok());
    return v;
  }
  std::vector<float> random(int64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = d(rng_);
    return v;
  }
  // Random weights: valid blocks of a quantized type; bf16 values from [-1, 1] (random bits would hold NaNs).
  cpu::WeightView weight(DType t, int64_t rows, int64_t cols) {
    const auto info = dtype_info(t).value();
    std::vector<uint8_t> raw;
    if (t == DType::kBF16) {
      raw.resize(static_cast<size_t>(2 * rows * cols));
      const auto v = random(rows * cols, -1, 1);
      bf16_host_.resize(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t b = fp32_to_bf16(v[i]);
        std::memcpy(raw.data() + 2 * i, &b, 2);
        bf16_host_[i] = bf16_to_fp32(b);
      }
    } else {
      raw = test::random_blocks(t, rows * cols / static_cast<int64_t>(info.block_elems), rng_);
    }
    const auto bytes = test::device_form(t, raw, rows, cols);
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, bytes.size()), cudaSuccess);
    device_.push_back(d);
    EXPECT_EQ(cudaMemcpy(d, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    return cpu::WeightView{t, rows, cols, d};
  }
  // The product of W and x, computed from a copy of x (so the GEMV quantizes x itself).
  std::vector<float> product_of_copy(const cpu::WeightView& w, const Buffer& x, int64_t n) {
    Buffer c = alloc(x.size()), y = alloc(n * w.rows);
    EXPECT_TRUE(be_->copy(c.data(), x.data(), x.size()).ok());
    EXPECT_TRUE(be_->matmul(w, c.data(), n, y.data()).ok());
    return download(y);
  }
  std::vector<float> product(const cpu::WeightView& w, const Buffer& x, int64_t n) {
    Buffer y = alloc(n * w.rows);
    EXPECT_TRUE(be_->matmul(w, x.data(), n, y.data()).ok());
    return download(y);
  }

  // The last bf16 weight's values (rows x cols) and the check of a device product of it against the host's: x
  // rounded to bf16, sums in double; each output within 1e-4 of the sum of |w x| (f32 accumulation, any order).
  void expect_host_product(const std::vector<float>& got, const Buffer& x, int64_t n, int64_t rows,
                           const std::string& what) {
    const std::vector<float> xv = download(x);
    const int64_t cols = static_cast<int64_t>(xv.size()) / n;
    ASSERT_EQ(got.size(), static_cast<size_t>(n * rows)) << what;
    int bad = 0;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        double s = 0.0, mag = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
          const double p = double{bf16_host_[r * cols + c]} * bf16_to_fp32(fp32_to_bf16(xv[t * cols + c]));
          s += p;
          mag += std::abs(p);
        }
        const float g = got[t * rows + r];
        if (!(std::abs(g - s) <= 1e-4 * mag + 1e-6) && ++bad <= 3)
          ADD_FAILURE() << what << ": token " << t << " row " << r << ": " << g << ", host " << s;
      }
  }

  std::vector<float> bf16_host_;
  std::unique_ptr<CudaBackend> be_;
  std::vector<void*> device_;
  uint32_t seed_ = 0;
  std::mt19937 rng_;
};

TEST_F(CudaQ8Side, gemv_after_its_producer_equals_gemv_on_a_copy_and_rewrites_invalidate) {
  SCOPED_TRACE("seed " + std::to_string(seed_) + " (DFLASH_TEST_SEED)");
  for (DType t : {DType::kQ4_K, DType::kQ6_K, DType::kQ8_0}) {
    for (int64_t n : {1, 3, 16}) {
      const int64_t cols = 512, rows = 96;
      const std::string what = std::string(dtype_name(t)) + " n=" + std::to_string(n);
      const cpu::WeightView w = weight(t, rows, cols);
      const cpu::WeightView w_group = weight(t, 32, cols);
      Buffer gate = upload(random(n * cols, -3, 3)), up = upload(random(n * cols, -2, 2));
      Buffer delta = upload(random(n * cols, -1, 1)), y = alloc(n * cols);
      const int64_t uses = be_->q8_side_uses();

      // SwiGLU then the down projection: the side output is used, and equals quantizing y.
      ASSERT_TRUE(be_->swiglu(gate.data(), up.data(), y.data(), n * cols).ok());
      auto fused = product(w, y, n);  // first: the reference's copy ends the side
      EXPECT_EQ(be_->q8_side_uses(), uses + 1) << "the GEMV after swiglu should read its int8 side";
      EXPECT_EQ(fused, product_of_copy(w, y, n)) << "swiglu " << what;

      // A grouped product reads it too.
      ASSERT_TRUE(be_->swiglu(gate.data(), up.data(), y.data(), n * cols).ok());
      Buffer y1 = alloc(n * rows), y2 = alloc(n * 32);
      const cpu::WeightView* ws[] = {&w, &w_group};
      float* ys[] = {y1.data(), y2.data()};
      ASSERT_TRUE(be_->matmul_group(ws, y.data(), n, ys).ok());
      EXPECT_EQ(be_->q8_side_uses(), uses + 2);
      EXPECT_EQ(download(y1), product_of_copy(w, y, n)) << "group " << what;
      EXPECT_EQ(download(y2), product_of_copy(w_group, y, n)) << "group " << what;

      // The input rewritten between its producer and the GEMV: the GEMV must see the new values.
      ASSERT_TRUE(be_->swiglu(gate.data(), up.data(), y.data(), n * cols).ok());
      ASSERT_TRUE(be_->add_inplace(y.data(), delta.data(), n * cols).ok());
      fused = product(w, y, n);
      EXPECT_EQ(fused, product_of_copy(w, y, n)) << "added to after swiglu " << what;
      ASSERT_TRUE(be_->swiglu(gate.data(), up.data(), y.data(), n * cols).ok());
      ASSERT_TRUE(be_->upload(y.data(), random(n * cols, -1, 1).data(), n * cols).ok());
      fused = product(w, y, n);
      EXPECT_EQ(fused, product_of_copy(w, y, n)) << "uploaded after swiglu " << what;
      // A norm over the output: the GEMV reads the norm's side (of the new values).
      ASSERT_TRUE(be_->swiglu(gate.data(), up.data(), y.data(), n * cols).ok());
      ASSERT_TRUE(be_->rms_norm(gate.data(), nullptr, 1e-6f, n, cols, y.data()).ok());
      fused = product(w, y, n);
      EXPECT_EQ(be_->q8_side_uses(), uses + 3) << "the GEMV after rms_norm should read its int8 side";
      EXPECT_EQ(fused, product_of_copy(w, y, n)) << "normed over after swiglu " << what;
      // The residual add fused with the norm: its side too, and x is not the side.
      Buffer h = upload(random(n * cols, -3, 3)), wn = upload(random(cols, -2, 2));
      ASSERT_TRUE(be_->add_rms_norm(h.data(), delta.data(), wn.data(), 1e-6f, n, cols, y.data()).ok());
      fused = product(w, y, n);
      EXPECT_EQ(be_->q8_side_uses(), uses + 4) << "the GEMV after add_rms_norm should read its int8 side";
      EXPECT_EQ(fused, product_of_copy(w, y, n)) << "add_rms_norm " << what;
      ASSERT_TRUE(be_->add_rms_norm(h.data(), delta.data(), wn.data(), 1e-6f, n, cols, y.data()).ok());
      fused = product(w, h, n);
      EXPECT_EQ(fused, product_of_copy(w, h, n)) << "the norm's input " << what;
      // Another buffer of the same size as the producer's output is not its side.
      Buffer other = upload(random(n * cols, -3, 3));
      ASSERT_TRUE(be_->swiglu(gate.data(), up.data(), y.data(), n * cols).ok());
      fused = product(w, other, n);
      EXPECT_EQ(fused, product_of_copy(w, other, n)) << "another input " << what;
      EXPECT_EQ(be_->q8_side_uses(), uses + 4) << "only the GEMVs right after their producer use a side";
    }
  }
}

// Products of 17..32 tokens whose weights the GEMM would dequantize to bf16 first (q8_0 rows of 384, q4_0: no fused
// kernel takes them) run the token-exact integer-dot kernels even in plain steps: the same bits as a token-exact
// product, where the GEMM's bf16 rounding of x would differ. 33 tokens, and a q8_0 weight the fused GEMM takes
// (512 columns), stay on the GEMM.
TEST_F(CudaQ8Side, few_token_products_of_dequantized_types_take_the_integer_dot_kernels) {
  SCOPED_TRACE("seed " + std::to_string(seed_) + " (DFLASH_TEST_SEED)");
  struct Case {
    DType type;
    int64_t cols;
    bool integer_dot;  // from 17 to 32 tokens
  };
  for (const Case c : {Case{DType::kQ8_0, 384, true}, Case{DType::kQ4_0, 512, true}, Case{DType::kQ8_0, 512, false}}) {
    const cpu::WeightView wk = weight(c.type, 128, c.cols), wv = weight(c.type, 64, c.cols);
    for (int64_t n : {17, 24, 32, 33}) {
      const std::string what = std::string(dtype_name(c.type)) + " cols=" + std::to_string(c.cols) + " n=" +
                               std::to_string(n);
      Buffer x = upload(random(n * c.cols, -2, 2));
      // The first m tokens' rows of K and V.
      auto group = [&](bool exact, int64_t m) {
        be_->set_token_exact(exact);
        Buffer k = alloc(m * wk.rows), v = alloc(m * wv.rows);
        const cpu::WeightView* ws[] = {&wk, &wv};
        float* ys[] = {k.data(), v.data()};
        EXPECT_TRUE(be_->matmul_group(ws, x.data(), m, ys).ok()) << what;
        be_->set_token_exact(false);
        auto out = download(k);
        out.resize(static_cast<size_t>(std::min(m, cuda::kMmqMaxTokens) * wk.rows));
        auto vo = download(v);
        vo.resize(static_cast<size_t>(std::min(m, cuda::kMmqMaxTokens) * wv.rows));
        out.insert(out.end(), vo.begin(), vo.end());
        return out;
      };
      const auto plain = group(false, n), exact = group(true, std::min<int64_t>(n, cuda::kMmqMaxTokens));
      for (float f : plain) ASSERT_TRUE(std::isfinite(f)) << what;
      if (c.integer_dot && n <= cuda::kMmqMaxTokens)
        EXPECT_EQ(plain, exact) << what << ": should run the token-exact kernels";
      else
        EXPECT_NE(plain, exact) << what << ": should run the GEMM (x rounded to bf16)";
    }
  }
}

// A copy between a producer and its GEMV (a layer's captured output, copied after the norm that formed it) keeps
// the side when it writes another buffer, and drops it when it writes into the producer's output: the product
// then quantizes the copied values.
TEST_F(CudaQ8Side, a_copy_elsewhere_keeps_the_side_and_a_copy_into_the_output_drops_it) {
  SCOPED_TRACE("seed " + std::to_string(seed_) + " (DFLASH_TEST_SEED)");
  const int64_t cols = 512, rows = 96, n = 4;
  const cpu::WeightView w = weight(DType::kQ8_0, rows, cols);
  Buffer gate = upload(random(n * cols, -3, 3)), up = upload(random(n * cols, -2, 2)), y = alloc(n * cols);
  Buffer h = upload(random(n * cols, -3, 3)), elsewhere = alloc(n * cols);
  const int64_t uses = be_->q8_side_uses();
  ASSERT_TRUE(be_->swiglu(gate.data(), up.data(), y.data(), n * cols).ok());
  ASSERT_TRUE(be_->copy(elsewhere.data(), h.data(), n * cols).ok());
  auto fused = product(w, y, n);
  EXPECT_EQ(be_->q8_side_uses(), uses + 1) << "a copy into another buffer keeps the side";
  EXPECT_EQ(fused, product_of_copy(w, y, n));
  ASSERT_TRUE(be_->swiglu(gate.data(), up.data(), y.data(), n * cols).ok());
  ASSERT_TRUE(be_->copy(y.data() + cols, h.data(), cols).ok());  // one row of the output rewritten
  fused = product(w, y, n);
  EXPECT_EQ(be_->q8_side_uses(), uses + 1) << "a copy into the output drops the side";
  EXPECT_EQ(fused, product_of_copy(w, y, n));
}

// The bf16 side: in token-exact products of bf16 weights from kGemv16MmaBf16XFrom tokens (a verify's), the first
// such product asks the producers for their output's bf16 form (and converts its own x), and from then on the
// product right after SwiGLU or an RMSNorm reads that form instead of converting: the outputs equal the same
// product of a copy of x (which converts) bit for bit. Fewer tokens, and steps that are not token-exact, convert
// or read f32 x as before.
TEST_F(CudaQ8Side, bf16_products_from_17_tokens_read_the_producers_bf16_form) {
  SCOPED_TRACE("seed " + std::to_string(seed_) + " (DFLASH_TEST_SEED)");
  const int64_t cols = 512, rows = 96;
  const cpu::WeightView w = weight(DType::kBF16, rows, cols);
  be_->set_token_exact(true);
  for (int64_t n : {23, 16, 32}) {
    const std::string what = "n=" + std::to_string(n);
    const bool reads = n >= cuda::kGemv16MmaBf16XFrom;
    Buffer gate = upload(random(n * cols, -3, 3)), up = upload(random(n * cols, -2, 2)), y = alloc(n * cols);
    Buffer h = upload(random(n * cols, -3, 3)), delta = upload(random(n * cols, -1, 1));
    Buffer wn = upload(random(cols, -2, 2));
    ASSERT_TRUE(be_->swiglu(gate.data(), up.data(), y.data(), n * cols).ok());
    const auto first = product(w, y, n);  // at 17 tokens or more: asks for the side from now on
    EXPECT_EQ(first, product_of_copy(w, y, n)) << what;
    const int64_t uses = be_->bf16_side_uses();
    ASSERT_TRUE(be_->swiglu(gate.data(), up.data(), y.data(), n * cols).ok());
    auto fused = product(w, y, n);
    EXPECT_EQ(be_->bf16_side_uses(), uses + (reads ? 1 : 0)) << "the product after swiglu, " << what;
    expect_host_product(fused, y, n, rows, "the product after swiglu, " + what);
    EXPECT_EQ(fused, product_of_copy(w, y, n)) << "swiglu " << what;
    ASSERT_TRUE(be_->rms_norm(gate.data(), wn.data(), 1e-6f, n, cols, y.data()).ok());
    fused = product(w, y, n);
    EXPECT_EQ(be_->bf16_side_uses(), uses + (reads ? 2 : 0)) << "the product after rms_norm, " << what;
    expect_host_product(fused, y, n, rows, "the product after rms_norm, " + what);
    const auto copied = product_of_copy(w, y, n);
    expect_host_product(copied, y, n, rows, "the product of rms_norm's output's copy, " + what);
    EXPECT_EQ(fused, copied) << "rms_norm " << what;
    ASSERT_TRUE(be_->add_rms_norm(h.data(), delta.data(), wn.data(), 1e-6f, n, cols, y.data()).ok());
    Buffer y1 = alloc(n * rows), y2 = alloc(n * rows);
    const cpu::WeightView* ws[] = {&w, &w};
    float* ys[] = {y1.data(), y2.data()};
    ASSERT_TRUE(be_->matmul_group(ws, y.data(), n, ys).ok());
    EXPECT_EQ(be_->bf16_side_uses(), uses + (reads ? 3 : 0)) << "the group after add_rms_norm, " << what;
    const auto want = product_of_copy(w, y, n);
    EXPECT_EQ(download(y1), want) << "add_rms_norm " << what;
    EXPECT_EQ(download(y2), want) << "add_rms_norm " << what;
    // The input rewritten after its producer: the product converts the new values.
    ASSERT_TRUE(be_->swiglu(gate.data(), up.data(), y.data(), n * cols).ok());
    ASSERT_TRUE(be_->add_inplace(y.data(), delta.data(), n * cols).ok());
    fused = product(w, y, n);
    EXPECT_EQ(be_->bf16_side_uses(), uses + (reads ? 3 : 0)) << what;
    EXPECT_EQ(fused, product_of_copy(w, y, n)) << "added to after swiglu " << what;
  }
  be_->set_token_exact(false);
  const int64_t n = 23, uses = be_->bf16_side_uses();
  Buffer gate = upload(random(n * cols, -3, 3)), up = upload(random(n * cols, -2, 2)), y = alloc(n * cols);
  ASSERT_TRUE(be_->swiglu(gate.data(), up.data(), y.data(), n * cols).ok());
  const auto plain = product(w, y, n);
  EXPECT_EQ(be_->bf16_side_uses(), uses) << "not token-exact: no bf16 side";
  EXPECT_EQ(plain, product_of_copy(w, y, n));
}

// matmul_swiglu while token-exact, bf16 weights, up to kSwigluFusedMaxTokens tokens: one launch
// (gemv16_mma_swiglu) whose output is the bits of the grouped products then swiglu, and which leaves no side behind
// (the down product after it equals the product of a copy). Above that count, not token-exact, or with weights the
// kernel does not take, it is the default (products, then swiglu: its side read as before).
TEST_F(CudaQ8Side, matmul_swiglu_equals_the_products_then_swiglu) {
  SCOPED_TRACE("seed " + std::to_string(seed_) + " (DFLASH_TEST_SEED)");
  const int64_t cols = 512, rows = 192, out = 96;
  const cpu::WeightView wg = weight(DType::kBF16, rows, cols), wu = weight(DType::kBF16, rows, cols);
  const cpu::WeightView wd = weight(DType::kBF16, out, rows);  // bf16_host_: the down weight's values
  const cpu::WeightView wq = weight(DType::kQ8_0, rows, cols), wqd = weight(DType::kQ8_0, out, rows);
  auto unfused = [&](const cpu::WeightView& g, const cpu::WeightView& u, const Buffer& x, int64_t n) {
    Buffer c = alloc(x.size()), a = alloc(n * rows), b = alloc(n * rows);
    EXPECT_TRUE(be_->copy(c.data(), x.data(), x.size()).ok());
    const cpu::WeightView* ws[] = {&g, &u};
    float* ys[] = {a.data(), b.data()};
    EXPECT_TRUE(be_->matmul_group(ws, c.data(), n, ys).ok());
    EXPECT_TRUE(be_->swiglu(a.data(), b.data(), a.data(), n * rows).ok());
    return download(a);
  };
  for (bool exact : {true, false})
    for (int64_t n : {1, 16, 17, 23, 32}) {
      const std::string what = std::string(exact ? "token-exact" : "plain") + " n=" + std::to_string(n);
      be_->set_token_exact(exact);
      Buffer h = upload(random(n * cols, -3, 3)), wn = upload(random(cols, -2, 2)), x = alloc(n * cols);
      Buffer g = alloc(n * rows), u = alloc(n * rows);
      ASSERT_TRUE(be_->rms_norm(h.data(), wn.data(), 1e-6f, n, cols, x.data()).ok());
      ASSERT_TRUE(be_->matmul_swiglu(wg, wu, x.data(), n, g.data(), u.data()).ok()) << what;
      const auto got = download(g);
      for (float v : got) ASSERT_TRUE(std::isfinite(v)) << what;
      EXPECT_EQ(got, unfused(wg, wu, x, n)) << what;
      // The down product right after it: the same bits as the product of a copy of its input.
      ASSERT_TRUE(be_->matmul_swiglu(wg, wu, x.data(), n, g.data(), u.data()).ok()) << what;
      const auto down = product(wd, g, n);
      if (exact) expect_host_product(down, g, n, out, "the down product, " + what);
      EXPECT_EQ(down, product_of_copy(wd, g, n)) << what;
      // Weights the kernel does not take: the default, the same values, its int8 side read by the next product.
      ASSERT_TRUE(be_->matmul_swiglu(wq, wq, x.data(), n, g.data(), u.data()).ok()) << what;
      const int64_t uses = be_->q8_side_uses();
      const auto qdown = product(wqd, g, n);
      // 192 columns: no fused GEMM for them, so 17..32 tokens take the integer-dot kernels too
      EXPECT_EQ(be_->q8_side_uses(), uses + 1) << "q8_0 " << what;
      EXPECT_EQ(qdown, product_of_copy(wqd, g, n)) << "q8_0 " << what;
      EXPECT_EQ(download(g), unfused(wq, wq, x, n)) << "q8_0 " << what;
    }
  be_->set_token_exact(false);
  Buffer x = alloc(cols), g = alloc(rows), u = alloc(rows);
  const cpu::WeightView narrow = weight(DType::kBF16, rows / 2, cols);
  EXPECT_FALSE(be_->matmul_swiglu(wg, narrow, x.data(), 1, g.data(), u.data()).ok()) << "rows differ";
}

}  // namespace
}  // namespace dflash

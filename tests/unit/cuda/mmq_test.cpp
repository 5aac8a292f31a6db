// The int8 tensor-core product (ops/cuda/mmq.h) of q4_K / q6_K weights with quantized tokens.
//
// Reference: the same math on the CPU in double: the block's weights (d sc q - dmin m for q4_K, d sc
// (q - 32) for q6_K, exact in double) times x' = xd * xq, from the very xq / xd / xs the device's
// quantize_q8_rows produced. The kernel's only inexact steps are f32 roundings of a sum of S terms (S =
// cols / 32 sub-block terms plus a few products per term and the split partials), so each output is
// checked to (S + 16) * 2^-24 * M, M the sum of the terms' magnitudes (recursive summation bound).
// The host decoder is checked against tensor/quant.h's dequantize_row first.
//
// Independence: for 32 random tokens, every n in 1..32 and every start o, the batch of tokens o, o + 1,
// ... (mod 32) must give each token exactly (bit for bit) its n = 1 output.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/gemv_q8.h"
#include "ops/cuda/mmq.h"
#include "support/cuda_test_util.h"
#include "support/random_blocks.h"
#include "support/test_paths.h"
#include "tensor/dtype.h"
#include "tensor/half.h"
#include "tensor/quant.h"
#include "unit/ops/ops_test_util.h"

namespace dflash {
namespace {

using test::DevArray;

// Quantized tokens on the device and their host copies.
struct Tokens {
  int64_t n = 0, cols = 0;
  int8_t* xq = nullptr;
  float* xd = nullptr;
  int* xs = nullptr;
  std::vector<int8_t> hq;
  std::vector<float> hd;
  std::vector<int> hs;
  ~Tokens() {
    cudaFree(xq);
    cudaFree(xd);
    cudaFree(xs);
  }
};

void quantize(const std::vector<float>& x, int64_t n, int64_t cols, Tokens& t) {
  t.n = n, t.cols = cols;
  float* dx = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, sizeof(float) * x.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&t.xq, n * cols), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&t.xd, sizeof(float) * n * cols / 32), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&t.xs, sizeof(int) * n * cols / 16), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx, x.data(), sizeof(float) * x.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cuda::quantize_q8_rows(dx, n, cols, t.xq, t.xd, t.xs), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(dx);
  t.hq.resize(n * cols);
  t.hd.resize(n * cols / 32);
  t.hs.resize(n * cols / 16);
  ASSERT_EQ(cudaMemcpy(t.hq.data(), t.xq, t.hq.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(t.hd.data(), t.xd, sizeof(float) * t.hd.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(t.hs.data(), t.xs, sizeof(int) * t.hs.size(), cudaMemcpyDeviceToHost), cudaSuccess);
}

// Random activations: each 32-element block at a random magnitude (some all zero).
std::vector<float> random_x(int64_t n, int64_t cols, std::mt19937& rng) {
  std::vector<float> x(n * cols);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), e(-8.0f, 4.0f);
  for (int64_t b = 0; b < n * cols / 32; ++b) {
    const float scale = rng() % 16 == 0 ? 0.0f : std::exp2(e(rng));
    for (int i = 0; i < 32; ++i) x[b * 32 + i] = scale * u(rng);
  }
  return x;
}

// mmq of tokens o..o + n - 1 of x: packed by mmq_pack_x into a poisoned buffer (every byte must be rewritten),
// then the product; synchronized before the buffer is freed.
cudaError_t packed_mmq(DType t, const void* w, int64_t rows, int64_t cols, const Tokens& x, int64_t o, int64_t n,
                       float* y, int split = 0) {
  DevArray<uint32_t> xp(static_cast<size_t>(cuda::mmq_x_bytes(n, cols) / 4));
  cudaError_t e = xp.error();
  if (e == cudaSuccess)
    e = cuda::mmq_pack_x(t, x.xq + o * cols, x.xd + o * cols / 32, x.xs + o * cols / 16, n, cols, xp.get());
  if (e == cudaSuccess) e = cuda::mmq(t, w, rows, cols, xp.get(), n, y, nullptr, split);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  return e;
}

// The weights of one block in double (exact), element order.
void decode_block(DType t, const uint8_t* b, double (&w)[256], int (&code)[256], double (&ds)[16],
                  double (&ms)[16]) {
  if (t == DType::kQ4_K || t == DType::kQ5_K) {  // q5_K: qh[32] at 16, the nibbles at 48
    const bool high = t == DType::kQ5_K;
    const double d = fp16_to_fp32(static_cast<uint16_t>(b[0] | b[1] << 8));
    const double dmin = fp16_to_fp32(static_cast<uint16_t>(b[2] | b[3] << 8));
    const uint8_t* q = b + 4;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      if (j < 4) {
        sc = q[j] & 63, m = q[j + 4] & 63;
      } else {
        sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
      }
      ds[j] = d * sc, ms[j] = dmin * m;
      for (int l = 0; l < 32; ++l) {
        int c = (b[(high ? 48 : 16) + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0xf;
        if (high) c |= ((b[16 + l] >> j) & 1) << 4;
        code[32 * j + l] = c;
        w[32 * j + l] = ds[j] * c - ms[j];
      }
    }
  } else if (t == DType::kQ2_K) {  // scales@0[16] qs@16[64] d@80 dmin@82, 16-element groups with mins
    const double d = fp16_to_fp32(static_cast<uint16_t>(b[80] | b[81] << 8));
    const double dmin = fp16_to_fp32(static_cast<uint16_t>(b[82] | b[83] << 8));
    for (int g = 0; g < 16; ++g) ds[g] = d * (b[g] & 0xf), ms[g] = dmin * (b[g] >> 4);
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const int e = 128 * h + 32 * k + l, g = 8 * h + 2 * k + l / 16;
          code[e] = (b[16 + 32 * h + l] >> (2 * k)) & 3;
          w[e] = ds[g] * code[e] - ms[g];
        }
  } else if (t == DType::kQ4_0) {  // 8 blocks of d (fp16) + 16 bytes: low nibbles elements 0-15, high 16-31
    for (int j = 0; j < 8; ++j) {
      const uint8_t* q = b + 18 * j;
      const double d = fp16_to_fp32(static_cast<uint16_t>(q[0] | q[1] << 8));
      ds[2 * j] = ds[2 * j + 1] = d, ms[2 * j] = ms[2 * j + 1] = 0;
      for (int l = 0; l < 32; ++l) {
        code[32 * j + l] = ((q[2 + l % 16] >> (4 * (l / 16))) & 0xf) - 8;
        w[32 * j + l] = d * code[32 * j + l];
      }
    }
  } else if (t == DType::kQ8_0) {  // 8 blocks of d (fp16) + 32 int8 codes; ds per 16-element group
    for (int j = 0; j < 8; ++j) {
      const uint8_t* q = b + 34 * j;
      const double d = fp16_to_fp32(static_cast<uint16_t>(q[0] | q[1] << 8));
      ds[2 * j] = ds[2 * j + 1] = d, ms[2 * j] = ms[2 * j + 1] = 0;
      for (int l = 0; l < 32; ++l) {
        code[32 * j + l] = static_cast<int8_t>(q[2 + l]);
        w[32 * j + l] = d * code[32 * j + l];
      }
    }
  } else if (t == DType::kQ3_K) {  // hmask@0[32] qs@32[64] scales@96[12] d@108, 16-element groups
    const double d = fp16_to_fp32(static_cast<uint16_t>(b[108] | b[109] << 8));
    const uint8_t* sc = b + 96;
    for (int g = 0; g < 16; ++g) {
      const int low = g < 8 ? (sc[g] & 0xf) : (sc[g - 8] >> 4), high = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
      ds[g] = d * ((low | high << 4) - 32), ms[g] = 0;
    }
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const int e = 128 * h + 32 * k + l, g = 8 * h + 2 * k + l / 16;
          code[e] = ((b[32 + 32 * h + l] >> (2 * k)) & 3) - (((b[l] >> (4 * h + k)) & 1) ? 0 : 4);
          w[e] = ds[g] * code[e];
        }
  } else {
    const double d = fp16_to_fp32(static_cast<uint16_t>(b[208] | b[209] << 8));
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const int lo = (b[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 0xf;
          const int hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
          const int e = 128 * h + 32 * k + l, g = 8 * h + 2 * k + l / 16;
          ds[g] = d * static_cast<int8_t>(b[192 + g]), ms[g] = 0;
          code[e] = (lo | hi << 4) - 32;
          w[e] = ds[g] * code[e];
        }
  }
}

int64_t block_bytes(DType t) {  // stored bytes of 256 elements
  if (t == DType::kQ4_K || t == DType::kQ4_0) return 144;
  if (t == DType::kQ5_K) return 176;
  if (t == DType::kQ3_K) return 110;
  if (t == DType::kQ2_K) return 84;
  return t == DType::kQ8_0 ? 272 : 210;
}

// Random stored weights of n256 runs of 256 elements (q8_0, q4_0: 8 blocks each).
std::vector<uint8_t> random_weights(DType t, int64_t n256, std::mt19937& rng) {
  return test::random_blocks(t, t == DType::kQ8_0 || t == DType::kQ4_0 ? 8 * n256 : n256, rng);
}
bool k4_like(DType t) { return t == DType::kQ4_K || t == DType::kQ5_K; }  // sub-block scales and mins

// ref[t * rows + r] and the magnitudes of its terms.
void reference(DType t, const std::vector<uint8_t>& wb, int64_t rows, int64_t cols, const Tokens& x, int64_t n,
               std::vector<double>& ref, std::vector<double>& mag) {
  const int64_t bytes = block_bytes(t), nb = cols / 256;
  ref.assign(n * rows, 0.0);
  mag.assign(n * rows, 0.0);
  double w[256], ds[16], ms[16];
  int code[256];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      decode_block(t, wb.data() + (r * nb + b) * bytes, w, code, ds, ms);
      for (int64_t tok = 0; tok < n; ++tok) {
        const int8_t* q = x.hq.data() + tok * cols + b * 256;
        const float* xd = x.hd.data() + tok * (cols / 32) + b * 8;
        double sum = 0, m = 0;
        for (int g = 0; g < 8; ++g) {  // 32-element groups
          double s = 0;
          for (int l = 0; l < 32; ++l) s += w[32 * g + l] * q[32 * g + l];
          sum += xd[g] * s;
          if (k4_like(t)) {
            int64_t isum = 0, xsum = 0;
            for (int l = 0; l < 32; ++l) isum += int64_t{code[32 * g + l]} * q[32 * g + l], xsum += q[32 * g + l];
            m += std::fabs(xd[g]) * (std::fabs(ds[g] * isum) + std::fabs(ms[g] * xsum));
          } else if (t == DType::kQ2_K) {  // scales and mins per 16-element group
            for (int hg = 2 * g; hg < 2 * g + 2; ++hg) {
              int64_t isum = 0, xsum = 0;
              for (int l = 16 * hg; l < 16 * hg + 16; ++l) isum += int64_t{code[l]} * q[l], xsum += q[l];
              m += std::fabs(xd[g]) * (std::fabs(ds[hg] * isum) + std::fabs(ms[hg] * xsum));
            }
          } else {
            m += std::fabs(xd[g] * s);
          }
        }
        ref[tok * rows + r] += sum;
        mag[tok * rows + r] += m;
      }
    }
}

class Mmq : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
    seed_ = test::fresh_seed();
    rng_.seed(seed_);
  }
  // rows x cols weights of `t` (stored form) in device memory, in the kernels' device form (weight_form.h).
  uint8_t* upload(DType t, const std::vector<uint8_t>& stored, int64_t rows, int64_t cols) {
    const std::vector<uint8_t> bytes = test::device_form(t, stored, rows, cols);
    EXPECT_FALSE(bytes.empty());
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, bytes.size() + 64), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    device_.push_back(d);
    return static_cast<uint8_t*>(d);
  }
  void TearDown() override {
    for (void* p : device_) cudaFree(p);
  }
  // Runs mmq and checks every output against the reference, and that nothing past n * rows is written.
  void check(DType t, const std::vector<uint8_t>& wb, int64_t rows, int64_t cols, const Tokens& x, int64_t n,
             const std::string& what) {
    const uint8_t* w = upload(t, wb, rows, cols);
    DevArray<float> y(static_cast<size_t>(n * rows + 64));
    ASSERT_EQ(y.error(), cudaSuccess);
    ASSERT_EQ(packed_mmq(t, w, rows, cols, x, 0, n, y.get()), cudaSuccess) << what;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
    const std::vector<float> got = y.host();
    std::vector<double> ref, mag;
    reference(t, wb, rows, cols, x, n, ref, mag);
    const double eps = std::ldexp(1.0, -24), terms = static_cast<double>(cols / 32 + 16);
    int bad = 0;
    for (int64_t i = 0; i < n * rows && bad < 5; ++i) {
      const double tol = terms * eps * mag[i] + 1e-37;
      if (!(std::fabs(got[i] - ref[i]) <= tol)) {
        ++bad;
        ADD_FAILURE() << what << ": token " << i / rows << " row " << i % rows << ": got " << got[i] << ", want "
                      << ref[i] << " +- " << tol;
      }
    }
    for (size_t i = n * rows; i < got.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &got[i], 4);
      ASSERT_EQ(bits, test::kNanPoison) << what << ": wrote past y[n * rows]";
    }
  }
  uint32_t seed_ = 0;
  std::mt19937 rng_;
  std::vector<void*> device_;
};

TEST_F(Mmq, host_decoder_matches_dequantize_row) {
  for (DType t : {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_0, DType::kQ4_0}) {
    const auto bytes = random_weights(t, 64, rng_);
    std::vector<float> f(64 * 256);
    ASSERT_TRUE(dequantize_row(t, bytes.data(), f.data(), 64 * 256).ok());
    double w[256], ds[16], ms[16];
    int code[256];
    for (int b = 0; b < 64; ++b) {
      decode_block(t, bytes.data() + b * block_bytes(t), w, code, ds, ms);
      for (int e = 0; e < 256; ++e) {
        const int g = k4_like(t) ? e / 32 : e / 16;
        const double tol = std::ldexp(1.0, -22) * (std::fabs(ds[g] * code[e]) + std::fabs(ms[g])) + 1e-45;
        ASSERT_NEAR(f[b * 256 + e], w[e], tol) << dtype_name(t) << " block " << b << " element " << e;
      }
    }
  }
}

TEST_F(Mmq, matches_the_double_reference) {
  SCOPED_TRACE("seed " + std::to_string(seed_) + " (DFLASH_TEST_SEED)");
  struct Case {
    int64_t rows, cols;
    std::vector<int64_t> ns;
  };
  // Rows not a multiple of the 16-row tile; splits 8 (few rows), 4 (1040+ rows... up to 2048 tiles), 2.
  const Case cases[] = {{37, 4096, {1, 2, 5, 8, 9, 16, 23, 32}},
                        {100, 12288, {1, 16, 23, 32}},
                        {1, 256, {1, 32}},
                        {1040, 4096, {1, 17}},
                        {9000, 4096, {3}},
                        {40000, 512, {1, 32}}};
  for (DType t : {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_0, DType::kQ4_0})
    for (const Case& c : cases) {
      const auto wb = random_weights(t, c.rows * c.cols / 256, rng_);
      Tokens x;
      quantize(random_x(32, c.cols, rng_), 32, c.cols, x);
      for (int64_t n : c.ns)
        check(t, wb, c.rows, c.cols, x, n,
              std::string(dtype_name(t)) + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols) + " n=" +
                  std::to_string(n) + " split " + std::to_string(cuda::mmq_split(c.rows, c.cols)));
    }
}

TEST_F(Mmq, extreme_scales) {
  SCOPED_TRACE("seed " + std::to_string(seed_) + " (DFLASH_TEST_SEED)");
  const int64_t rows = 48, cols = 4096;
  const uint16_t halves[] = {0x7bff, 0xfbff, 0x0001, 0x8001, 0x0400, 0x0000, 0x3c00};
  for (DType t : {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_0, DType::kQ4_0}) {
    const int64_t bytes = block_bytes(t);
    auto wb = random_weights(t, rows * cols / 256, rng_);
    for (int64_t b = 0; b < rows * cols / 256; ++b) {
      uint8_t* p = wb.data() + b * bytes;
      const int kind = static_cast<int>(rng_() % 4);
      if (kind == 0) std::memset(p, 0xff, bytes);  // every code and 6-bit scale at its maximum
      if (kind == 1) std::memset(p, 0x00, bytes);
      if (t == DType::kQ6_K && kind == 2) std::memset(p + 192, 0x80, 16);  // scales -128
      const uint16_t h0 = halves[rng_() % 7], h1 = halves[rng_() % 7];
      if (k4_like(t)) {
        p[0] = h0 & 0xff, p[1] = h0 >> 8, p[2] = h1 & 0xff, p[3] = h1 >> 8;
      } else if (t == DType::kQ3_K) {
        p[108] = h0 & 0xff, p[109] = h0 >> 8;
      } else if (t == DType::kQ2_K) {
        p[80] = h0 & 0xff, p[81] = h0 >> 8, p[82] = h1 & 0xff, p[83] = h1 >> 8;
      } else if (t == DType::kQ8_0 || t == DType::kQ4_0) {
        const int stride = t == DType::kQ8_0 ? 34 : 18;
        for (int j = 0; j < 8; ++j) {
          const uint16_t h = j % 2 ? h1 : h0;
          p[stride * j] = h & 0xff, p[stride * j + 1] = h >> 8;
        }
      } else {
        p[208] = h0 & 0xff, p[209] = h0 >> 8;
      }
    }
    // Tokens at +-max codes (xq = +-127) with small scales, and random ones.
    std::vector<float> xv = random_x(8, cols, rng_);
    for (int64_t i = 0; i < 4 * cols; ++i) xv[i] = (i % 3 == 0 ? -1e-4f : 1e-4f);
    Tokens x;
    quantize(xv, 8, cols, x);
    for (int64_t n : {1, 8})
      check(t, wb, rows, cols, x, n, std::string(dtype_name(t)) + " extreme n=" + std::to_string(n));
  }
}

TEST_F(Mmq, token_outputs_do_not_depend_on_the_batch) {
  SCOPED_TRACE("seed " + std::to_string(seed_) + " (DFLASH_TEST_SEED)");
  // The default launch variant (3) and the other extreme (0: 2 CTAs a SM, q4_K loads through L1); 16400 rows
  // take two row tiles a warp for q4_K above 24 tokens (tiles_a_warp).
  struct Case {
    int variant;
    int64_t rows, cols;
  };
  for (const Case c : {Case{3, 100, 4096}, Case{3, 100, 12288}, Case{0, 100, 4096}, Case{0, 100, 12288},
                       Case{3, 16400, 4096}})
  for (DType t : {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_0, DType::kQ4_0}) {
      const int64_t rows = c.rows, cols = c.cols;
      cuda::mmq_set_variant(c.variant);
      const std::string what = std::string(dtype_name(t)) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                               " variant " + std::to_string(c.variant);
      const uint8_t* w = upload(t, random_weights(t, rows * cols / 256, rng_), rows, cols);
      // 64 tokens: 32 random ones twice, so a batch starting at o is a rotation of the 32.
      std::vector<float> xv = random_x(32, cols, rng_);
      xv.insert(xv.end(), xv.begin(), xv.end());
      Tokens x;
      quantize(xv, 64, cols, x);
      auto run = [&](int64_t o, int64_t n) {
        DevArray<float> y(static_cast<size_t>(n * rows));
        EXPECT_EQ(packed_mmq(t, w, rows, cols, x, o, n, y.get()), cudaSuccess);
        return y.host();
      };
      std::vector<std::vector<float>> one(32);
      for (int64_t tok = 0; tok < 32; ++tok) one[tok] = run(tok, 1);
      for (int64_t n = 1; n <= 32; ++n)
        for (int64_t o = 0; o < 32; ++o) {
          const std::vector<float> y = run(o, n);
          ASSERT_EQ(y.size(), static_cast<size_t>(n * rows));
          for (int64_t i = 0; i < n; ++i) {
            const int64_t tok = (o + i) % 32;
            ASSERT_EQ(std::memcmp(y.data() + i * rows, one[tok].data(), sizeof(float) * rows), 0)
                << what << ": token " << tok << " at position " << i << " of " << n << " differs from its n = 1 output";
          }
        }
    }
  cuda::mmq_set_variant(3);
}

// The canonical order (mmq.h): gemv_q8 at one token and mmq with gemv_q8_parts(type, rows) parts form every
// q2_K..q6_K, q8_0 and q4_0 sum in the same order, so a verify step's products on the tensor cores can equal plain
// decoding's bit for bit. Row counts give each split of the one-token launch on this GPU (1, 2, 4 warps a
// row group: 4, 8, 16 parts for q4_K and q6_K); past 8 parts mmq does not take the product.
TEST_F(Mmq, one_token_gemv_q8_equals_mmq_in_its_parts) {
  SCOPED_TRACE("seed " + std::to_string(seed_) + " (DFLASH_TEST_SEED)");
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  for (DType type : {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_0, DType::kQ4_0})
    for (int64_t rows : {int64_t{64 * sms + 16}, int64_t{16 * sms + 16}, int64_t{20 * sms}, int64_t{8 * sms + 3}})
      for (int64_t cols : {int64_t{4096}, int64_t{2560}}) {
        const int parts = cuda::gemv_q8_parts(type, rows);
        if (parts > 8) continue;  // past mmq's split (the product falls back to gemv_q8 there)
        const std::string what = std::string(dtype_name(type)) + " rows " + std::to_string(rows) + " cols " +
                                 std::to_string(cols) + " parts " + std::to_string(parts);
        const uint8_t* w = upload(type, random_weights(type, rows * cols / 256, rng_), rows, cols);
        Tokens x;
        quantize(random_x(5, cols, rng_), 5, cols, x);
        DevArray<float> ym(static_cast<size_t>(5 * rows));
        ASSERT_EQ(packed_mmq(type, w, rows, cols, x, 0, 5, ym.get(), parts), cudaSuccess) << what;
        const std::vector<float> m = ym.host();
        for (int64_t tok = 0; tok < 5; ++tok) {
          DevArray<float> yg(static_cast<size_t>(rows));
          const cuda::Q8Part part{w, rows, yg.get()};
          ASSERT_EQ(cuda::gemv_q8(type, &part, 1, cols, x.xq + tok * cols, x.xd + tok * cols / 32,
                                  x.xs + tok * cols / 16, 1),
                    cudaSuccess)
              << what;
          const std::vector<float> g = yg.host();
          for (int64_t r = 0; r < rows; ++r)
            ASSERT_EQ(std::memcmp(&g[r], &m[tok * rows + r], sizeof(float)), 0)
                << what << ": token " << tok << " row " << r << ": gemv_q8 " << g[r] << ", mmq " << m[tok * rows + r];
        }
      }
}

// A grouped launch (several weights, one grid) computes each weight's rows as its own launch of the same split
// does, bit for bit, and writes nothing past any part's output; parts of 0 rows are skipped.
TEST_F(Mmq, grouped_launch_equals_one_launch_a_part) {
  SCOPED_TRACE("seed " + std::to_string(seed_) + " (DFLASH_TEST_SEED)");
  const int64_t cols = 2560, rows[] = {700, 0, 37, 17000};
  for (DType type : {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ8_0, DType::kQ4_0})
    for (int64_t n : {int64_t{5}, int64_t{23}, int64_t{32}}) {
      Tokens x;
      quantize(random_x(n, cols, rng_), n, cols, x);
      DevArray<uint32_t> xp(static_cast<size_t>(cuda::mmq_x_bytes(n, cols) / 4));
      ASSERT_EQ(cuda::mmq_pack_x(type, x.xq, x.xd, x.xs, n, cols, xp.get()), cudaSuccess);
      const int split = cuda::mmq_split(700 + 37 + 17000, cols);
      std::vector<std::unique_ptr<DevArray<float>>> grouped, alone;
      cuda::Q8Part parts[4];
      for (int p = 0; p < 4; ++p) {
        const int64_t r = std::max<int64_t>(rows[p], 1);
        const uint8_t* w = upload(type, random_weights(type, r * cols / 256, rng_), r, cols);
        grouped.push_back(std::make_unique<DevArray<float>>(static_cast<size_t>(n * rows[p] + 16)));
        alone.push_back(std::make_unique<DevArray<float>>(static_cast<size_t>(n * rows[p] + 16)));
        parts[p] = cuda::Q8Part{w, rows[p], grouped[p]->get()};
        ASSERT_EQ(cuda::mmq(type, w, rows[p], cols, xp.get(), n, alone[p]->get(), nullptr, split), cudaSuccess);
      }
      ASSERT_EQ(cuda::mmq(type, parts, 4, cols, xp.get(), n, nullptr, split), cudaSuccess);
      for (int p = 0; p < 4; ++p) {
        const std::vector<float> g = grouped[p]->host(), a = alone[p]->host();
        ASSERT_EQ(g.size(), a.size());
        EXPECT_EQ(std::memcmp(g.data(), a.data(), sizeof(float) * g.size()), 0)
            << dtype_name(type) << " n=" << n << " part " << p << " (" << rows[p] << " rows)";
        for (size_t i = n * rows[p]; i < g.size(); ++i) {
          uint32_t bits;
          std::memcpy(&bits, &g[i], 4);
          ASSERT_EQ(bits, test::kNanPoison) << "part " << p << ": wrote past its output";
        }
      }
    }
}

TEST_F(Mmq, rejects_bad_arguments) {
  const int64_t rows = 16, cols = 512;
  const uint8_t* w4 = upload(DType::kQ4_K, random_weights(DType::kQ4_K, rows * cols / 256, rng_), rows, cols);
  const uint8_t* w6 = upload(DType::kQ6_K, random_weights(DType::kQ6_K, rows * cols / 256, rng_), rows, cols);
  Tokens x;
  quantize(random_x(4, cols, rng_), 4, cols, x);
  DevArray<float> y(static_cast<size_t>(4 * rows + 4));
  float* yp = y.get();
  DevArray<uint32_t> packed(static_cast<size_t>(cuda::mmq_x_bytes(4, cols) / 4 + 4));
  void* xp = packed.get();
  const auto ok = cudaSuccess, bad = cudaErrorInvalidValue;
  using cuda::mmq;
  using cuda::mmq_pack_x;
  EXPECT_EQ(cuda::mmq_x_bytes(4, cols), 8 * cols + 2 * cols);  // tokens padded to 8: codes, then 16 bytes a chunk
  EXPECT_EQ(mmq_pack_x(DType::kQ4_K, x.xq, x.xd, x.xs, 4, cols, xp), ok);
  EXPECT_EQ(mmq_pack_x(DType::kQ5_0, x.xq, x.xd, x.xs, 4, cols, xp), bad);
  EXPECT_EQ(mmq_pack_x(DType::kQ4_K, x.xq, x.xd, x.xs, 0, cols, xp), bad);
  EXPECT_EQ(mmq_pack_x(DType::kQ4_K, x.xq, x.xd, x.xs, 33, cols, xp), bad);
  EXPECT_EQ(mmq_pack_x(DType::kQ4_K, x.xq, x.xd, x.xs, 4, 320, xp), bad);
  EXPECT_EQ(mmq_pack_x(DType::kQ4_K, nullptr, x.xd, x.xs, 4, cols, xp), bad);
  EXPECT_EQ(mmq_pack_x(DType::kQ4_K, x.xq, nullptr, x.xs, 4, cols, xp), bad);
  EXPECT_EQ(mmq_pack_x(DType::kQ4_K, x.xq, x.xd, nullptr, 4, cols, xp), bad);
  EXPECT_EQ(mmq_pack_x(DType::kQ4_K, x.xq, x.xd, x.xs, 4, cols, nullptr), bad);
  EXPECT_EQ(mmq_pack_x(DType::kQ4_K, x.xq + 8, x.xd, x.xs, 4, cols, xp), bad);
  EXPECT_EQ(mmq_pack_x(DType::kQ4_K, x.xq, x.xd + 1, x.xs, 4, cols, xp), bad);
  EXPECT_EQ(mmq_pack_x(DType::kQ4_K, x.xq, x.xd, x.xs + 2, 4, cols, xp), bad);
  EXPECT_EQ(mmq_pack_x(DType::kQ4_K, x.xq, x.xd, x.xs, 4, cols, static_cast<uint8_t*>(xp) + 8), bad);
  EXPECT_EQ(mmq(DType::kQ4_K, w4, rows, cols, xp, 4, yp), ok);
  EXPECT_EQ(mmq(DType::kQ4_K, w4, 0, cols, xp, 4, yp), ok);  // nothing to do
  const cuda::Q8Part five[5] = {{w4, rows, yp}, {w4, rows, yp}, {w4, rows, yp}, {w4, rows, yp}, {w4, rows, yp}};
  EXPECT_EQ(mmq(DType::kQ4_K, five, 4, cols, xp, 4), ok);
  EXPECT_EQ(mmq(DType::kQ4_K, five, 5, cols, xp, 4), bad);  // at most kQ8MaxParts
  EXPECT_EQ(mmq(DType::kQ4_K, five, 0, cols, xp, 4), bad);
  EXPECT_EQ(mmq(DType::kQ4_K, nullptr, 1, cols, xp, 4), bad);
  EXPECT_EQ(mmq(DType::kQ4_K, w4, int64_t{INT_MAX} + 1, cols, xp, 4, yp), bad);  // rows at most INT_MAX
  EXPECT_EQ(mmq(DType::kQ5_0, w4, rows, cols, xp, 4, yp), bad);
  EXPECT_EQ(mmq(DType::kQ5_1, w4, rows, cols, xp, 4, yp), bad);
  EXPECT_EQ(mmq(DType::kQ4_K, w4, -1, cols, xp, 4, yp), bad);
  EXPECT_EQ(mmq(DType::kQ4_K, w4, rows, 0, xp, 4, yp), bad);
  EXPECT_EQ(mmq(DType::kQ4_K, w4, rows, 320, xp, 4, yp), bad);
  EXPECT_EQ(mmq(DType::kQ4_K, w4, rows, cols, xp, 0, yp), bad);
  EXPECT_EQ(mmq(DType::kQ4_K, w4, rows, cols, xp, 33, yp), bad);
  EXPECT_EQ(mmq(DType::kQ4_K, w4, rows, cols, xp, 4, yp, nullptr, 3), bad);  // split 1, 2, 4 or 8
  EXPECT_EQ(mmq(DType::kQ4_K, nullptr, rows, cols, xp, 4, yp), bad);
  EXPECT_EQ(mmq(DType::kQ4_K, w4, rows, cols, nullptr, 4, yp), bad);
  EXPECT_EQ(mmq(DType::kQ4_K, w4, rows, cols, xp, 4, nullptr), bad);
  EXPECT_EQ(mmq(DType::kQ4_K, w4 + 2, rows, cols, xp, 4, yp), bad);  // q4_K: 16-byte aligned
  EXPECT_EQ(mmq(DType::kQ6_K, w6, rows, cols, xp, 4, yp), ok);
  EXPECT_EQ(mmq(DType::kQ6_K, w6 + 2, rows, cols, xp, 4, yp), bad);  // q6_K: its device form, 16-byte aligned
  EXPECT_EQ(mmq(DType::kQ6_K, w6 + 8, rows, cols, xp, 4, yp), bad);
  EXPECT_EQ(mmq(DType::kQ4_K, w4, rows, cols, static_cast<uint8_t*>(xp) + 8, 4, yp), bad);
  EXPECT_EQ(mmq(DType::kQ4_K, w4, rows, cols, xp, 4, reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(yp) + 2)),
            bad);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a rejected call must enqueue nothing";
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace dflash

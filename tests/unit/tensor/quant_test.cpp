// Row (de)quantization: bit equality with ggml on random blocks and data, round-trip error bounds,
// known values, argument errors, and the multithreaded convert_rows.
#include "tensor/quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/ggml_oracle.h"
#include "support/random_blocks.h"
#include "support/test_paths.h"
#include "tensor/half.h"

namespace dflash {
namespace {

struct QuantType {
  DType type;
  const char* ggml;  // suffix of ggml's dequantize_row_* / quantize_row_*_ref
};

constexpr QuantType kQuantTypes[] = {
    {DType::kQ4_0, "q4_0"}, {DType::kQ4_1, "q4_1"}, {DType::kQ5_0, "q5_0"}, {DType::kQ5_1, "q5_1"},
    {DType::kQ8_0, "q8_0"}, {DType::kQ2_K, "q2_K"}, {DType::kQ3_K, "q3_K"}, {DType::kQ4_K, "q4_K"},
    {DType::kQ5_K, "q5_K"}, {DType::kQ6_K, "q6_K"}, {DType::kQ8_K, "q8_K"},
};

uint32_t block_elems(DType t) { return dtype_info(t)->block_elems; }
uint64_t bytes_for(DType t, int64_t n) { return row_bytes(t, static_cast<uint64_t>(n)).value(); }
uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

// Distributions of weights to quantize: shapes real tensors have and the corner cases of the fits.
enum class Dist { kNormal, kUniform, kOutliers, kZeroBlocks, kTiny, kLarge, kMixedScale, kSparse, kConstant,
                  kFewLevels, kPositive, kNegative, kSubnormal, kWildScale, kHuge, kTies };
constexpr Dist kAllDists[] = {Dist::kNormal, Dist::kUniform, Dist::kOutliers, Dist::kZeroBlocks, Dist::kTiny,
                              Dist::kLarge, Dist::kMixedScale, Dist::kSparse, Dist::kConstant, Dist::kFewLevels,
                              Dist::kPositive, Dist::kNegative, Dist::kSubnormal, Dist::kWildScale, Dist::kHuge,
                              Dist::kTies};

const char* dist_name(Dist d) {
  switch (d) {
    case Dist::kNormal: return "normal";
    case Dist::kUniform: return "uniform";
    case Dist::kOutliers: return "outliers";
    case Dist::kZeroBlocks: return "zero_blocks";
    case Dist::kTiny: return "tiny";
    case Dist::kLarge: return "large";
    case Dist::kMixedScale: return "mixed_scale";
    case Dist::kSparse: return "sparse";
    case Dist::kConstant: return "constant_blocks";
    case Dist::kFewLevels: return "few_levels";
    case Dist::kPositive: return "positive";
    case Dist::kNegative: return "negative";
    case Dist::kSubnormal: return "subnormal";
    case Dist::kWildScale: return "wild_scale";
    case Dist::kHuge: return "huge";
    case Dist::kTies: return "ties";
  }
  return "?";
}

std::vector<float> make_data(Dist dist, int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float& v = x[static_cast<size_t>(i)];
    switch (dist) {
      case Dist::kNormal: v = 0.02f * normal(rng); break;
      case Dist::kUniform: v = uniform(rng); break;
      case Dist::kOutliers: v = (rng() % 97 == 0) ? 40.0f * normal(rng) : normal(rng); break;
      case Dist::kZeroBlocks: v = ((i / 32) % 3 == 1) ? normal(rng) : 0.0f; break;
      case Dist::kTiny: v = 1e-6f * normal(rng); break;
      case Dist::kLarge: v = 2000.0f * normal(rng); break;
      case Dist::kMixedScale: v = std::exp2(static_cast<float>((i / 16) % 24) - 16.0f) * normal(rng); break;
      case Dist::kSparse: v = (rng() % 8 == 0) ? normal(rng) : 0.0f; break;
      case Dist::kConstant: v = 0.25f * static_cast<float>((i / 32) % 5) - 0.5f; break;
      case Dist::kFewLevels: v = 0.125f * static_cast<float>(static_cast<int>(rng() % 7) - 3); break;
      case Dist::kPositive: v = 0.5f + std::fabs(normal(rng)); break;
      case Dist::kNegative: v = -0.5f - std::fabs(normal(rng)); break;
      case Dist::kSubnormal: v = 1e-39f * normal(rng); break;
      // Each element its own magnitude, 2^-30 .. 2^30.
      case Dist::kWildScale: v = std::exp2(static_cast<float>(rng() % 61) - 30.0f) * normal(rng); break;
      // Block scales past the fp16 range (stored as inf, as ggml does).
      case Dist::kHuge: v = 1e6f * normal(rng); break;
      // Values halfway between codes once scaled.
      case Dist::kTies: v = 0.5f * static_cast<float>(static_cast<int>(rng() % 33) - 16) + 0.25f; break;
    }
  }
  return x;
}

double rms(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += static_cast<double>(v) * v;
  return std::sqrt(s / static_cast<double>(x.size()));
}

double rmse(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(s / static_cast<double>(a.size()));
}

std::vector<float> dequantized(DType t, const std::vector<uint8_t>& q, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  EXPECT_TRUE(dequantize_row(t, q.data(), y.data(), n).ok());
  return y;
}

std::vector<uint8_t> quantized(DType t, const std::vector<float>& x) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(bytes_for(t, n), 0);
  EXPECT_TRUE(quantize_row(t, x.data(), q.data(), n).ok());
  return q;
}

uint32_t fresh_seed() { return std::random_device{}(); }

// ---- Against ggml ----

TEST(QuantOracle, dequantize_is_bit_identical_to_ggml_on_random_blocks) {
  DF_REQUIRE_GGML_ORACLE();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& qt : kQuantTypes) {
    auto ggml = test::ggml_symbol<test::GgmlToFloat>((std::string("dequantize_row_") + qt.ggml).c_str());
    ASSERT_NE(ggml, nullptr) << qt.ggml;
    for (int64_t blocks : {1, 2, 7, 64}) {
      for (int rep = 0; rep < 40; ++rep) {
        const auto bytes = test::random_blocks(qt.type, blocks, rng);
        const int64_t n = blocks * block_elems(qt.type);
        std::vector<float> ours(static_cast<size_t>(n)), theirs(static_cast<size_t>(n));
        ASSERT_TRUE(dequantize_row(qt.type, bytes.data(), ours.data(), n).ok());
        ggml(bytes.data(), theirs.data(), n);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(bits_of(ours[i]), bits_of(theirs[i]))
              << qt.ggml << " element " << i << " of " << n << ": ours " << ours[i] << " ggml " << theirs[i];
      }
    }
  }
}

TEST(QuantOracle, quantize_is_byte_identical_to_ggml_reference) {
  DF_REQUIRE_GGML_ORACLE();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& qt : kQuantTypes) {
    auto ggml = test::ggml_symbol<test::GgmlFromFloat>((std::string("quantize_row_") + qt.ggml + "_ref").c_str());
    ASSERT_NE(ggml, nullptr) << qt.ggml;
    const uint32_t block_bytes = dtype_info(qt.type)->block_bytes;
    for (Dist dist : kAllDists) {
      for (int64_t n : {256, 768, 4096, 65536}) {
        const auto x = make_data(dist, n, rng);
        const auto ours = quantized(qt.type, x);
        std::vector<uint8_t> theirs(ours.size(), 0);
        ggml(x.data(), theirs.data(), n);
        if (ours == theirs) continue;
        size_t first = 0;
        while (ours[first] == theirs[first]) ++first;
        ADD_FAILURE() << qt.ggml << " on " << dist_name(dist) << " data, n=" << n << ": first differing byte "
                      << first << " (block " << first / block_bytes << ", offset " << first % block_bytes
                      << "); rmse ours " << rmse(x, dequantized(qt.type, ours, n)) << " ggml "
                      << rmse(x, dequantized(qt.type, theirs, n));
        break;  // one report per type and distribution
      }
    }
  }
}

// ---- Round trips and known values (no oracle needed) ----

// Relative RMSE (to the data's RMS) of quantize -> dequantize on normal and uniform weights: about
// 1.25x what ggml's quantizers reach (for instance q4_K 0.072, q6_K 0.018, q8_0 0.0053 on normal data).
double round_trip_bound(DType t) {
  switch (t) {
    case DType::kQ8_0: return 0.007;
    case DType::kQ8_K: return 0.009;
    case DType::kQ6_K: return 0.022;
    case DType::kQ5_0: return 0.055;
    case DType::kQ5_1: return 0.05;
    case DType::kQ5_K: return 0.045;
    case DType::kQ4_0: return 0.11;
    case DType::kQ4_1: return 0.1;
    case DType::kQ4_K: return 0.09;
    case DType::kQ3_K: return 0.19;
    case DType::kQ2_K: return 0.37;
    default: return 0.0;
  }
}

TEST(Quant, round_trip_error_is_bounded) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& qt : kQuantTypes) {
    // (Not kTiny: below ~6e-8 the fp16 block scale itself underflows, by design of the formats; not
    // kOutliers: one outlier stretches a whole block's scale. The oracle tests cover both.)
    for (Dist dist : {Dist::kNormal, Dist::kUniform, Dist::kLarge}) {
      const int64_t n = 8192;
      const auto x = make_data(dist, n, rng);
      const auto y = dequantized(qt.type, quantized(qt.type, x), n);
      const double rel = rmse(x, y) / rms(x);
      EXPECT_LT(rel, round_trip_bound(qt.type)) << qt.ggml << " on " << dist_name(dist);
      // No element may land further from its value than the largest magnitude of its block.
      const int64_t be = block_elems(qt.type);
      for (int64_t b = 0; b < n / be; ++b) {
        float amax = 0;
        for (int64_t i = b * be; i < (b + 1) * be; ++i) amax = std::max(amax, std::fabs(x[i]));
        for (int64_t i = b * be; i < (b + 1) * be; ++i)
          ASSERT_LE(std::fabs(x[i] - y[i]), amax) << qt.ggml << " element " << i;
      }
    }
  }
}

TEST(Quant, zero_input_quantizes_to_exact_zeros) {
  for (const auto& qt : kQuantTypes) {
    const std::vector<float> x(512, 0.0f);
    const auto y = dequantized(qt.type, quantized(qt.type, x), 512);
    for (float v : y) ASSERT_EQ(v, 0.0f) << qt.ggml;
  }
}

TEST(Quant, values_on_the_quant_grid_round_trip_exactly) {
  // Integers times a power of two, with the extreme at the negative end, are exactly representable by
  // the symmetric legacy types: the fitted scale is exact, so every code is.
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct Grid { DType type; int lo; int hi; };
  for (const Grid g : {Grid{DType::kQ4_0, -8, 7}, Grid{DType::kQ5_0, -16, 15}, Grid{DType::kQ8_0, -127, 127}}) {
    std::vector<float> x(256);
    for (size_t i = 0; i < x.size(); ++i) {
      const int code = (i % 32 == 0) ? g.lo : g.lo + static_cast<int>(rng() % static_cast<uint32_t>(g.hi - g.lo + 1));
      x[i] = std::ldexp(static_cast<float>(code), -3);
    }
    const auto y = dequantized(g.type, quantized(g.type, x), 256);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], y[i]) << dtype_name(g.type) << " element " << i;
  }
}

TEST(Quant, known_q8_0_block) {
  // x = 0..31: d = 31/127, codes round(x * 127/31); decoding gives code * fp16(d).
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i);
  const auto q = quantized(DType::kQ8_0, x);
  BlockQ8_0 b;
  std::memcpy(&b, q.data(), sizeof b);
  EXPECT_EQ(b.d, fp32_to_fp16(31.0f / 127.0f));
  EXPECT_EQ(b.qs[0], 0);
  EXPECT_EQ(b.qs[31], 127);
  EXPECT_EQ(b.qs[1], 4);   // 4.097 -> 4
  EXPECT_EQ(b.qs[16], 66);  // 65.55 -> 66
}

TEST(Quant, known_q4_0_and_q4_K_blocks_decode) {
  BlockQ4_0 b0;
  b0.d = fp32_to_fp16(0.5f);
  std::memset(b0.qs, 0x9f, sizeof b0.qs);  // low nibble 15 -> 7*0.5, high nibble 9 -> 1*0.5
  std::vector<float> y(32);
  ASSERT_TRUE(dequantize_row(DType::kQ4_0, &b0, y.data(), 32).ok());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(y[i], 3.5f);
  for (int i = 16; i < 32; ++i) EXPECT_EQ(y[i], 0.5f);

  // q4_K: only sub-block 5 (elements 160..191) has a scale (33) and min (2), both packed in the j >= 4
  // form that splits their bits over three bytes; all codes 3. x = d*33*3 - dmin*2 there, 0 elsewhere.
  BlockQ4_K bk;
  std::memset(&bk, 0, sizeof bk);
  bk.d = fp32_to_fp16(1.0f);
  bk.dmin = fp32_to_fp16(0.25f);
  const int j = 5;
  const uint8_t s = 33, m = 2;
  bk.scales[j + 4] = static_cast<uint8_t>((s & 0x0f) | ((m & 0x0f) << 4));
  bk.scales[j - 4] |= static_cast<uint8_t>((s >> 4) << 6);
  bk.scales[j] |= static_cast<uint8_t>((m >> 4) << 6);
  std::memset(bk.qs, 0x33, sizeof bk.qs);
  std::vector<float> yk(256);
  ASSERT_TRUE(dequantize_row(DType::kQ4_K, &bk, yk.data(), 256).ok());
  for (int i = 0; i < 256; ++i) EXPECT_EQ(yk[i], i / 32 == j ? 33.0f * 3.0f - 0.5f : 0.0f) << i;
}

TEST(Quant, float_types_are_the_half_conversions) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const auto x = make_data(Dist::kOutliers, 1000, rng);
  std::vector<uint16_t> h(1000), b(1000);
  ASSERT_TRUE(quantize_row(DType::kF16, x.data(), h.data(), 1000).ok());
  ASSERT_TRUE(quantize_row(DType::kBF16, x.data(), b.data(), 1000).ok());
  std::vector<float> f(1000), back(1000);
  ASSERT_TRUE(quantize_row(DType::kF32, x.data(), f.data(), 1000).ok());
  ASSERT_TRUE(dequantize_row(DType::kF16, h.data(), back.data(), 1000).ok());
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(h[i], fp32_to_fp16(x[i]));
    ASSERT_EQ(b[i], fp32_to_bf16(x[i]));
    ASSERT_EQ(bits_of(f[i]), bits_of(x[i]));
    ASSERT_EQ(bits_of(back[i]), bits_of(fp16_to_fp32(h[i])));
  }
}

TEST(Quant, unaligned_buffers_work) {
  // Blocks inside a file mapping need not be aligned; the codecs copy them.
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const auto x = make_data(Dist::kNormal, 512, rng);
  for (const auto& qt : kQuantTypes) {
    const auto aligned = quantized(qt.type, x);
    std::vector<uint8_t> shifted(aligned.size() + 1);
    ASSERT_TRUE(quantize_row(qt.type, x.data(), shifted.data() + 1, 512).ok());
    ASSERT_EQ(0, std::memcmp(aligned.data(), shifted.data() + 1, aligned.size())) << qt.ggml;
    std::vector<float> a(512), b(512);
    ASSERT_TRUE(dequantize_row(qt.type, aligned.data(), a.data(), 512).ok());
    ASSERT_TRUE(dequantize_row(qt.type, shifted.data() + 1, b.data(), 512).ok());
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), 512 * sizeof(float))) << qt.ggml;
  }
}

TEST(Quant, bad_lengths_and_types_are_errors) {
  std::vector<float> x(512, 1.0f);
  std::vector<uint8_t> q(4096);
  for (const auto& qt : kQuantTypes) {
    const int64_t bad = block_elems(qt.type) + 1;
    EXPECT_EQ(quantize_row(qt.type, x.data(), q.data(), bad).code(), ErrorCode::kInvalidArgument) << qt.ggml;
    EXPECT_EQ(dequantize_row(qt.type, q.data(), x.data(), bad).code(), ErrorCode::kInvalidArgument) << qt.ggml;
    EXPECT_EQ(quantize_row(qt.type, x.data(), q.data(), -static_cast<int64_t>(block_elems(qt.type))).code(),
              ErrorCode::kInvalidArgument);
    EXPECT_TRUE(quantize_row(qt.type, x.data(), q.data(), 0).ok());
  }
  for (DType t : {DType::kQ8_1, DType::kI8, DType::kI32, DType::kF64, static_cast<DType>(99)}) {
    EXPECT_FALSE(row_conversion_supported(t));
    const Status s = dequantize_row(t, q.data(), x.data(), 32);
    EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
    EXPECT_EQ(quantize_row(t, x.data(), q.data(), 32).code(), ErrorCode::kUnsupported);
  }
  EXPECT_NE(dequantize_row(DType::kI8, q.data(), x.data(), 32).message().find("i8"), std::string::npos);
}

// ---- convert_rows ----

TEST(ConvertRows, matches_row_by_row_conversion_for_any_thread_count) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t rows = 37, cols = 512;
  const auto x = make_data(Dist::kNormal, rows * cols, rng);
  const std::pair<DType, DType> pairs[] = {{DType::kF32, DType::kQ4_K}, {DType::kQ4_K, DType::kF32},
                                           {DType::kF16, DType::kQ6_K}, {DType::kQ8_0, DType::kQ5_1},
                                           {DType::kBF16, DType::kF16}, {DType::kQ3_K, DType::kQ2_K}};
  for (const auto& [from, to] : pairs) {
    // Source tensor in `from`, built row by row.
    std::vector<uint8_t> src(bytes_for(from, cols) * rows);
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_TRUE(quantize_row(from, x.data() + r * cols, src.data() + r * bytes_for(from, cols), cols).ok());
    // Expected: each row dequantized then quantized by hand.
    std::vector<uint8_t> expected(bytes_for(to, cols) * rows);
    std::vector<float> tmp(cols);
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(dequantize_row(from, src.data() + r * bytes_for(from, cols), tmp.data(), cols).ok());
      ASSERT_TRUE(quantize_row(to, tmp.data(), expected.data() + r * bytes_for(to, cols), cols).ok());
    }
    for (int threads : {1, 2, 3, 8, 100, 0}) {
      std::vector<uint8_t> got(expected.size(), 0xcd);
      ASSERT_TRUE(convert_rows(from, src.data(), to, got.data(), rows, cols, threads).ok());
      ASSERT_EQ(got, expected) << dtype_name(from) << " -> " << dtype_name(to) << " threads " << threads;
    }
  }
}

TEST(ConvertRows, same_type_copies_and_empty_is_ok) {
  std::vector<uint8_t> src(2 * sizeof(BlockQ4_K));
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7);
  std::vector<uint8_t> dst(src.size());
  ASSERT_TRUE(convert_rows(DType::kQ4_K, src.data(), DType::kQ4_K, dst.data(), 2, 256, 2).ok());
  EXPECT_EQ(src, dst);
  EXPECT_TRUE(convert_rows(DType::kF32, nullptr, DType::kQ8_0, nullptr, 0, 256, 4).ok());
  EXPECT_TRUE(convert_rows(DType::kF32, nullptr, DType::kQ8_0, nullptr, 5, 0, 4).ok());
}

TEST(ConvertRows, rejects_bad_shapes_and_types) {
  std::vector<float> x(1024);
  std::vector<uint8_t> y(4096);
  // 288 columns fit q8_0 blocks but not q4_K super-blocks.
  const Status s = convert_rows(DType::kF32, x.data(), DType::kQ4_K, y.data(), 2, 288, 2);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("destination"), std::string::npos) << s.message();
  EXPECT_EQ(convert_rows(DType::kF32, x.data(), DType::kQ8_0, y.data(), -1, 32, 2).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(convert_rows(DType::kI16, x.data(), DType::kQ8_0, y.data(), 1, 32, 2).code(), ErrorCode::kUnsupported);
  EXPECT_EQ(convert_rows(DType::kF32, x.data(), DType::kQ4_0, y.data(), int64_t{1} << 62, 1 << 20, 2).code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace dflash

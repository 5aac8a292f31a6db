// fp16 / bf16 conversions: known values, exhaustive round trips, and bit equality with ggml's rows.
#include "tensor/half.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "support/ggml_oracle.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

uint16_t h16(float f) { return fp32_to_fp16(f); }
float from_bits(uint32_t b) { return std::bit_cast<float>(b); }
uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

TEST(Half, fp16_known_values) {
  EXPECT_EQ(h16(0.0f), 0x0000);
  EXPECT_EQ(h16(-0.0f), 0x8000);
  EXPECT_EQ(h16(1.0f), 0x3c00);
  EXPECT_EQ(h16(-2.0f), 0xc000);
  EXPECT_EQ(h16(0.5f), 0x3800);
  EXPECT_EQ(h16(65504.0f), 0x7bff);                 // largest finite
  EXPECT_EQ(h16(65519.996f), 0x7bff);               // just below the halfway point to 65536
  EXPECT_EQ(h16(65520.0f), 0x7c00);                 // halfway, ties to even = inf
  EXPECT_EQ(h16(1e10f), 0x7c00);
  EXPECT_EQ(h16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(h16(std::ldexp(1.0f, -14)), 0x0400);    // smallest normal
  EXPECT_EQ(h16(std::ldexp(1.0f, -24)), 0x0001);    // smallest subnormal
  EXPECT_EQ(h16(std::ldexp(1.0f, -25)), 0x0000);    // halfway to it: ties to even = 0
  EXPECT_EQ(h16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(h16(std::ldexp(3.0f, -25)), 0x0002);    // 1.5 ulp ties to even = 2
  EXPECT_EQ(h16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie, even stays
  EXPECT_EQ(h16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie, odd rounds up
  EXPECT_EQ(h16(from_bits(0x7fc00000)), 0x7e00);    // NaN -> canonical quiet NaN
  EXPECT_EQ(h16(from_bits(0xff800001)), 0xfe00);    // signalling, negative
  EXPECT_EQ(h16(std::numeric_limits<float>::denorm_min()), 0x0000);

  EXPECT_EQ(bits_of(fp16_to_fp32(0x3c00)), bits_of(1.0f));
  EXPECT_EQ(bits_of(fp16_to_fp32(0x8000)), bits_of(-0.0f));
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_fp32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(fp16_to_fp32(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7e00)));
  EXPECT_EQ(bits_of(fp16_to_fp32(0x7c01)), 0x7fc02000u);  // signalling NaN comes out quiet
}

TEST(Half, bf16_known_values) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3f818000)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3f808001)), 0x3f81);
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past the top: inf
  EXPECT_EQ(fp32_to_bf16(from_bits(0x7f800001)), 0x7fc0);  // signalling NaN forced quiet
  EXPECT_EQ(fp32_to_bf16(from_bits(0xffa12345)), 0xffe1);  // payload top bits kept
  EXPECT_EQ(fp32_to_bf16(from_bits(0x00008000)), 0x0000);  // subnormal tie to even
  EXPECT_EQ(fp32_to_bf16(from_bits(0x00018000)), 0x0002);
  EXPECT_EQ(bits_of(bf16_to_fp32(0x3f80)), bits_of(1.0f));
  EXPECT_EQ(bits_of(bf16_to_fp32(0x8001)), 0x80010000u);
}

TEST(Half, every_fp16_survives_a_round_trip_through_fp32) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_EQ(fp32_to_fp16(f) & 0x7fff, 0x7e00) << std::hex << h;
      continue;
    }
    ASSERT_EQ(fp32_to_fp16(f), h) << std::hex << h;
    ASSERT_EQ(fp32_to_bf16(bf16_to_fp32(static_cast<uint16_t>(h))), (h & 0x7fff) > 0x7f80 ? (h | 0x40) : h)
        << std::hex << h;
  }
}

TEST(Half, fp16_rounding_is_nearest_even_against_double_arithmetic) {
  // Check each narrowing against the exact answer: the representable neighbours in double.
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int i = 0; i < 200000; ++i) {
    const float f = from_bits(rng() % 0x477ff000u);  // finite, positive, below 65520
    const uint16_t h = fp32_to_fp16(f);
    const double got = fp16_to_fp32(h);
    const double below = h ? fp16_to_fp32(static_cast<uint16_t>(h - 1)) : 0.0;
    const double above = fp16_to_fp32(static_cast<uint16_t>(h + 1));
    const double err = std::fabs(got - f);
    ASSERT_LE(err, std::fabs(below - f)) << f;
    ASSERT_LE(err, std::fabs(above - f)) << f;
    if (err == std::fabs(above - f) || (h && err == std::fabs(below - f))) {
      ASSERT_EQ(h & 1, 0) << f;  // a tie went to the even neighbour
    }
  }
}

TEST(Half, row_forms_equal_scalar_forms) {
  std::vector<float> x = {0.0f, -1.5f, 3.14159f, 1e-6f, 7e4f, -1e-30f};
  std::vector<uint16_t> h(x.size()), b(x.size());
  std::vector<float> y(x.size()), z(x.size());
  fp32_to_fp16_row(x.data(), h.data(), static_cast<int64_t>(x.size()));
  fp32_to_bf16_row(x.data(), b.data(), static_cast<int64_t>(x.size()));
  fp16_to_fp32_row(h.data(), y.data(), static_cast<int64_t>(x.size()));
  bf16_to_fp32_row(b.data(), z.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(h[i], fp32_to_fp16(x[i]));
    EXPECT_EQ(b[i], fp32_to_bf16(x[i]));
    EXPECT_EQ(bits_of(y[i]), bits_of(fp16_to_fp32(h[i])));
    EXPECT_EQ(bits_of(z[i]), bits_of(bf16_to_fp32(b[i])));
  }
}

// ---- Against ggml ----

// Every 16-bit pattern.
std::vector<uint16_t> all_halves() {
  std::vector<uint16_t> v(0x10000);
  for (uint32_t i = 0; i < 0x10000; ++i) v[i] = static_cast<uint16_t>(i);
  return v;
}

// fp32 bit patterns that probe every rounding boundary: each of the 65536 upper halves combined with
// low halves around the fp16 (bit 12/13) and bf16 (bit 15/16) rounding points, plus random patterns.
std::vector<float> probe_floats(std::mt19937& rng) {
  static constexpr uint32_t kLow[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x2001,
                                      0x7fff, 0x8000, 0x8001, 0xefff, 0xf000, 0xffff};
  std::vector<float> v;
  v.reserve(0x10000 * (std::size(kLow) + 2) + (1 << 21));
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    for (uint32_t lo : kLow) v.push_back(from_bits((hi << 16) | lo));
    for (int r = 0; r < 2; ++r) v.push_back(from_bits((hi << 16) | (rng() & 0xffff)));
  }
  for (int i = 0; i < (1 << 21); ++i) v.push_back(from_bits(rng()));
  return v;
}

TEST(HalfOracle, fp16_to_fp32_matches_ggml_for_every_value) {
  DF_REQUIRE_GGML_ORACLE();
  auto ggml = test::ggml_symbol<test::GgmlToFloat>("ggml_fp16_to_fp32_row");
  ASSERT_NE(ggml, nullptr);
  const auto h = all_halves();
  std::vector<float> ours(h.size()), theirs(h.size());
  fp16_to_fp32_row(h.data(), ours.data(), static_cast<int64_t>(h.size()));
  ggml(h.data(), theirs.data(), static_cast<int64_t>(h.size()));
  for (size_t i = 0; i < h.size(); ++i)
    ASSERT_EQ(bits_of(ours[i]), bits_of(theirs[i])) << "fp16 0x" << std::hex << h[i];
}

TEST(HalfOracle, bf16_to_fp32_matches_ggml_for_every_value) {
  DF_REQUIRE_GGML_ORACLE();
  auto ggml = test::ggml_symbol<test::GgmlToFloat>("ggml_bf16_to_fp32_row");
  ASSERT_NE(ggml, nullptr);
  const auto h = all_halves();
  std::vector<float> ours(h.size()), theirs(h.size());
  bf16_to_fp32_row(h.data(), ours.data(), static_cast<int64_t>(h.size()));
  ggml(h.data(), theirs.data(), static_cast<int64_t>(h.size()));
  for (size_t i = 0; i < h.size(); ++i)
    ASSERT_EQ(bits_of(ours[i]), bits_of(theirs[i])) << "bf16 0x" << std::hex << h[i];
}

TEST(HalfOracle, fp32_to_fp16_matches_ggml_on_every_rounding_boundary) {
  DF_REQUIRE_GGML_ORACLE();
  auto ggml = test::ggml_symbol<test::GgmlFromFloat>("ggml_fp32_to_fp16_row");
  ASSERT_NE(ggml, nullptr);
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const auto x = probe_floats(rng);
  std::vector<uint16_t> ours(x.size()), theirs(x.size());
  fp32_to_fp16_row(x.data(), ours.data(), static_cast<int64_t>(x.size()));
  ggml(x.data(), theirs.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(ours[i], theirs[i]) << "fp32 0x" << std::hex << bits_of(x[i]);
}

TEST(HalfOracle, fp32_to_bf16_matches_ggml_ref_on_every_rounding_boundary) {
  DF_REQUIRE_GGML_ORACLE();
  auto ggml = test::ggml_symbol<test::GgmlFromFloat>("ggml_fp32_to_bf16_row_ref");
  ASSERT_NE(ggml, nullptr);
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const auto x = probe_floats(rng);
  std::vector<uint16_t> ours(x.size()), theirs(x.size());
  fp32_to_bf16_row(x.data(), ours.data(), static_cast<int64_t>(x.size()));
  ggml(x.data(), theirs.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(ours[i], theirs[i]) << "fp32 0x" << std::hex << bits_of(x[i]);
}

}  // namespace
}  // namespace dflash

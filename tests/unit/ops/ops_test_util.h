// Helpers for the ops/cpu tests: fresh seeds (printed on failure; DFLASH_TEST_SEED replays one) and
// random buffers.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace dflash::test {

inline uint32_t fresh_seed() {
  if (const char* env = std::getenv("DFLASH_TEST_SEED")) return static_cast<uint32_t>(std::strtoul(env, nullptr, 0));
  return std::random_device{}();
}

// A seeded generator whose seed shows in every failure message of the scope.
struct SeededRng {
  SeededRng() : seed(fresh_seed()), rng(seed), trace(__FILE__, __LINE__, "seed " + std::to_string(seed) +
                                                                         " (replay: DFLASH_TEST_SEED=" +
                                                                         std::to_string(seed) + ")") {}
  uint32_t seed;
  std::mt19937 rng;
  ::testing::ScopedTrace trace;
};

inline std::vector<float> normal_vec(std::mt19937& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<float> uniform_vec(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// max |a - b| / max(max |b|, floor)
template <typename A, typename B>
double rel_err(const std::vector<A>& a, const std::vector<B>& b, double floor = 1e-30) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = floor;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return num / den;
}

// Logit rows for the sampling helpers' tests (top_k_rows): plain normal logits; few distinct levels (many
// ties); or normal logits with -inf, NaN and signed zeros sprinkled in.
enum class Fill { kNormal, kTies, kSpecial };
inline const char* fill_name(Fill f) { return f == Fill::kNormal ? "normal" : f == Fill::kTies ? "ties" : "special"; }
inline std::vector<float> random_rows(std::mt19937& rng, int64_t rows, int64_t cols, Fill fill) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> level(-3, 3);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (auto& v : x) {
    switch (fill) {
      case Fill::kNormal: v = normal(rng); break;
      case Fill::kTies: v = 0.5f * static_cast<float>(level(rng)); break;
      case Fill::kSpecial: {
        const float p = u(rng);
        v = p < 0.05f ? -kInf : p < 0.07f ? kNaN : p < 0.09f ? -0.0f : p < 0.11f ? 0.0f : normal(rng);
        break;
      }
    }
  }
  return x;
}

}  // namespace dflash::test

// Helpers the decode tests share: the argmax of a logits row and comparisons of float rows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "decode/dflash.h"
#include "decode/runner.h"
#include "state/feature_ring.h"
#include "state/sequence_state.h"

namespace dflash::test {

inline int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

inline bool bit_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  double d = a.size() == b.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

inline double max_abs(std::span<const float> a) {
  double m = 0;
  for (float x : a) m = std::max(m, std::fabs(double(x)));
  return m;
}

// Greedy speculative decoding of `prompt` on a fresh sequence of `r` with `draft` (7 drafts a step, DDTree of
// budget 12 when `ddtree`) until at least `n` tokens; the tokens (the first from the prefill) and the
// steps taken. Test failures are recorded in the calling test.
inline std::vector<int32_t> speculative_greedy(Runner& r, DFlashDraft& draft, std::span<const int32_t> prompt,
                                               size_t n, bool ddtree, int64_t* steps = nullptr) {
  SpecOptions opts;
  opts.ddtree = ddtree;
  opts.ddtree_budget = 12;
  SequenceState st(r.spec(), r.state_layout());
  FeatureRing ring(draft.feature_width(), opts.feature_window, feature_tag(draft.capture_layers()));
  DFlashDraft::Context ctx(draft);
  auto pre = forward_capturing(r, st, ring, draft.capture_layers(), prompt);
  EXPECT_TRUE(pre.ok()) << pre.status().to_string();
  if (!pre.ok()) return {};
  std::vector<int32_t> got = {argmax(pre->logits)};
  const ChooseFn choose = [](NodeLogits& l) -> Result<Choice> { return Choice{l.argmax(), false}; };
  SpecStats stats;
  while (got.size() < n) {
    auto step = speculative_step(r, st, ring, draft, ctx, got.back(), 7, opts, choose, &stats);
    EXPECT_TRUE(step.ok()) << step.status().to_string();
    if (!step.ok()) break;
    got.insert(got.end(), step->tokens.begin(), step->tokens.end());
  }
  if (steps != nullptr) *steps = stats.steps;
  return got;
}

}  // namespace dflash::test

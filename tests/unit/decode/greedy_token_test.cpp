// Runner::greedy_token: the greedy choice reduced on the backend from a step's device logits (what plain greedy
// decoding in the server and `dflash bench` take) equals the sampler's greedy choice of the same row, step after
// step, and refuses what the sampler refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "decode/dflash.h"
#include "decode/runner.h"
#include "decode/sampler.h"
#include "state/sequence_state.h"
#include "support/fixture_models.h"
#include "unit/decode/decode_test_util.h"

namespace dflash {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// A step output over `row` (host memory: the CPU backend's), as Runner::forward leaves device logits.
StepOutput device_row(std::vector<float>& row) {
  StepOutput out;
  out.rows = 1;
  out.device_logits = Buffer(nullptr, row.data(), static_cast<int64_t>(row.size()));
  return out;
}

TEST(GreedyToken, EqualsTheSamplersGreedyChoiceStepAfterStep) {
  for (const char* name : {"tiny-qwen35", "tiny-qwen3"}) {
    const Weights& w = test::fixture_model(name);
    Runner runner(w, 2);
    const int64_t V = runner.spec().vocab;
    const std::vector<int32_t> prompt = {1, 7, 42, 5, 19, 3, 11};
    SequenceState host(runner.spec(), runner.state_layout()), dev(runner.spec(), runner.state_layout());
    auto a = runner.prefill(host, prompt);
    auto b = runner.prefill(dev, prompt);
    ASSERT_TRUE(a.ok() && b.ok());
    Sampler sampler(SamplingParams{});  // temperature 0: greedy
    ASSERT_TRUE(sampler.params().greedy());
    std::vector<int32_t> history(prompt);
    auto first = sampler.sample(*a, history);
    ASSERT_TRUE(first.ok());
    int32_t t_host = *first, t_dev = *first;
    for (int i = 0; i < 12; ++i) {
      Step hs;
      hs.tokens = std::span<const int32_t>(&t_host, 1);
      auto ho = runner.forward(host, hs);
      ASSERT_TRUE(ho.ok()) << ho.status().to_string();
      Step ds;
      ds.tokens = std::span<const int32_t>(&t_dev, 1);
      ds.logits_on_device = true;
      auto d = runner.forward(dev, ds);
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      ASSERT_TRUE(d->logits.empty());
      ASSERT_EQ(d->device_logits.size(), V);
      history.push_back(t_host);
      auto want = sampler.sample(ho->logits, history);
      ASSERT_TRUE(want.ok());
      auto got = runner.greedy_token(*d);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      EXPECT_EQ(*got, *want) << name << " step " << i;
      EXPECT_EQ(*got, test::argmax(ho->logits)) << name << " step " << i;
      t_host = *want, t_dev = *got;
    }
  }
}

TEST(GreedyToken, TiesGoToTheLowestIdAndFaultsAreRefused) {
  Runner runner(test::fixture_model("tiny-qwen3"), 2);
  const auto V = static_cast<size_t>(runner.spec().vocab);
  std::vector<float> row(V, -1.0f);
  row[9] = row[4] = row[V - 1] = 2.5f;
  auto t = runner.greedy_token(device_row(row));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(*t, 4);
  row[4] = -0.0f, row[9] = 0.0f, row[V - 1] = -2.0f;  // -0 and +0 tie: the lower id
  for (size_t i = 0; i < V; ++i) row[i] = i == 4 || i == 9 ? row[i] : -3.0f;
  t = runner.greedy_token(device_row(row));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, 4);
  row[7] = kInf;  // the sampler's "numeric fault upstream"
  EXPECT_FALSE(runner.greedy_token(device_row(row)).ok());
  std::fill(row.begin(), row.end(), -kInf);  // every token masked
  EXPECT_FALSE(runner.greedy_token(device_row(row)).ok());
  std::fill(row.begin(), row.end(), std::nanf(""));  // NaN counts as -inf: nothing left
  EXPECT_FALSE(runner.greedy_token(device_row(row)).ok());
  // A step that downloaded its logits left none on the device.
  StepOutput host;
  host.rows = 1;
  host.logits.assign(V, 0.0f);
  EXPECT_FALSE(runner.greedy_token(host).ok());
}

// A speculative step's greedy choice at a verified node (NodeLogits::greedy, from the node's argmax and logit as
// the backend reduced them) gives what Runner::greedy_token gives plain greedy decoding: the same token, or the
// same error, with the sampler's text for a +inf logit and for a fully masked row.
TEST(GreedyToken, SpeculativeNodesChooseAndFailAsPlainDecodingDoes) {
  Runner runner(test::fixture_model("tiny-qwen3"), 2);
  const auto V = static_cast<size_t>(runner.spec().vocab);
  Sampler sampler(SamplingParams{});
  const std::vector<int32_t> no_history;
  std::vector<float> row(V);
  for (int kind = 0; kind < 5; ++kind) {
    SCOPED_TRACE("row kind " + std::to_string(kind));
    for (size_t i = 0; i < V; ++i) row[i] = static_cast<float>((i * 7919) % 101) * 0.25f - 10.0f;
    if (kind == 1) row[5] = row[17] = 40.0f;                        // a tie: the lower id
    if (kind == 2) row[23] = kInf;                                  // a numeric fault
    if (kind == 3) std::fill(row.begin(), row.end(), -kInf);        // every token masked
    if (kind == 4) std::fill(row.begin(), row.end(), std::nanf(""));  // NaN counts as -inf
    int32_t id = -1;
    float best = 0;
    ASSERT_TRUE(runner.backend().top_k_rows(row.data(), 1, static_cast<int64_t>(V), 1, &id, &best, nullptr).ok());
    const NodeLogits node(runner.backend(), row.data(), static_cast<int64_t>(V), id, best);
    const Result<int32_t> got = node.greedy();
    const Result<int32_t> plain = runner.greedy_token(device_row(row));
    ASSERT_EQ(got.ok(), plain.ok());
    ASSERT_EQ(got.ok(), kind < 2);
    if (got.ok()) {
      EXPECT_EQ(*got, *plain);
      EXPECT_EQ(*got, test::argmax(row));
      if (kind == 1) EXPECT_EQ(*got, 5);
      continue;
    }
    EXPECT_EQ(got.status().message(), plain.status().message());
    if (kind == 2 || kind == 3) {
      const Result<int32_t> sampled = sampler.sample(row, no_history);
      ASSERT_FALSE(sampled.ok());
      EXPECT_EQ(got.status().message(), sampled.status().message());
    }
  }
}

}  // namespace
}  // namespace dflash

// Runner::warm_up leaves no trace: a sequence prefilled and decoded after it gets the logits a runner that
// never warmed up gets, bit for bit (both fixture families; the steps are the CPU kernels', which do not
// depend on earlier calls). tests/unit/cuda/model_cuda_test.cpp checks the same on a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "decode/runner.h"
#include "state/sequence_state.h"
#include "support/fixture_models.h"
#include "unit/decode/decode_test_util.h"

namespace dflash {
namespace {

std::vector<std::vector<float>> prefill_then_decode(Runner& r, const std::vector<int32_t>& prompt) {
  SequenceState st(r.spec(), r.state_layout());
  auto logits = r.prefill(st, prompt);
  EXPECT_TRUE(logits.ok()) << logits.status().to_string();
  std::vector<std::vector<float>> out = {*logits};
  for (int i = 0; i < 3 && logits.ok(); ++i) {
    const int32_t t = test::argmax(out.back());
    Step step;
    step.tokens = std::span<const int32_t>(&t, 1);
    auto o = r.forward(st, step);
    EXPECT_TRUE(o.ok()) << o.status().to_string();
    if (!o.ok()) break;
    out.push_back(o->logits);
  }
  return out;
}

TEST(RunnerWarmUp, leaves_no_trace_in_later_results) {
  for (const std::string name : {"tiny-qwen3", "tiny-qwen35"}) {
    const Weights& w = test::fixture_model(name);
    std::vector<int32_t> prompt(40);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 31 + 5) % w.spec().vocab);
    Runner cold(w, 2);
    const auto want = prefill_then_decode(cold, prompt);
    Runner warm(w, 2);
    ASSERT_TRUE(warm.warm_up(Runner::kPrefillChunk).ok()) << name;
    const auto got = prefill_then_decode(warm, prompt);
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t k = 0; k < got.size(); ++k) EXPECT_TRUE(test::bit_equal(got[k], want[k])) << name << " step " << k;
    EXPECT_TRUE(warm.warm_up(0).ok());  // nothing fits: a no-op
  }
}

}  // namespace
}  // namespace dflash

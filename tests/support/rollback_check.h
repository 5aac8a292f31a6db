// The rollback check the CPU and CUDA model tests share: a captured (verify-shaped) step rolled back to its
// first tokens must leave the state a step of only those tokens leaves.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "decode/runner.h"
#include "state/sequence_state.h"

namespace dflash::test {

// Sets chain_capture_min_floats (model/forward.h) for a scope, restoring it even when an assertion returns early.
class ChainCaptureThreshold {
 public:
  explicit ChainCaptureThreshold(int64_t floats) : saved_(chain_capture_min_floats()) {
    chain_capture_min_floats() = floats;
  }
  ~ChainCaptureThreshold() { chain_capture_min_floats() = saved_; }
  ChainCaptureThreshold(const ChainCaptureThreshold&) = delete;
  ChainCaptureThreshold& operator=(const ChainCaptureThreshold&) = delete;

 private:
  int64_t saved_;
};

// Two states after `prompt`: one runs `block` as a captured step and rolls it back to its first `keep` tokens,
// the other runs only those tokens (captured too: the same recurrent DeltaNet form). Returns the logits each
// then gives for one more token (empty on a failure, which is reported).
inline std::pair<std::vector<float>, std::vector<float>> rollback_and_kept_logits(
    Runner& runner, const ModelSpec& spec, Backend& be, std::span<const int32_t> prompt,
    std::span<const int32_t> block, int64_t keep) {
  SequenceState a(spec, be), b(spec, be);
  if (!runner.prefill(a, prompt).ok() || !runner.prefill(b, prompt).ok()) {
    ADD_FAILURE() << "prefill failed";
    return {};
  }
  Step verify;
  verify.tokens = block;
  verify.all_logits = true;
  verify.capture_recurrent = true;
  Step kept;
  kept.tokens = block.first(static_cast<size_t>(keep));
  kept.capture_recurrent = true;
  if (!runner.forward(a, verify).ok() || !a.rollback_captured(keep).ok() || !runner.forward(b, kept).ok()) {
    ADD_FAILURE() << "verify, rollback or kept step failed (keep " << keep << ")";
    return {};
  }
  EXPECT_EQ(a.n_past(), b.n_past());
  int32_t next = 42;
  Step step;
  step.tokens = std::span<const int32_t>(&next, 1);
  auto oa = runner.forward(a, step);
  auto ob = runner.forward(b, step);
  if (!oa.ok() || !ob.ok()) {
    ADD_FAILURE() << "the step after failed";
    return {};
  }
  return {std::move(oa->logits), std::move(ob->logits)};
}

}  // namespace dflash::test

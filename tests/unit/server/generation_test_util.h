// What the server tests compare between two generations.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "server/generation.h"

namespace dflash::server {

// The same output: text, finish reason, token counts and every token's id; with `logprobs` also each token's
// log-probability and alternatives, bit for bit.
inline void expect_same_generation(const GenerationResult& a, const GenerationResult& b, bool logprobs,
                                   const std::string& what) {
  EXPECT_EQ(a.text, b.text) << what;
  EXPECT_EQ(a.finish_reason, b.finish_reason) << what;
  EXPECT_EQ(a.prompt_tokens, b.prompt_tokens) << what;
  EXPECT_EQ(a.completion_tokens, b.completion_tokens) << what;
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
  for (size_t i = 0; i < a.logprobs.size(); ++i) {
    EXPECT_EQ(a.logprobs[i].id, b.logprobs[i].id) << what << " token " << i;
    if (!logprobs) continue;
    EXPECT_EQ(a.logprobs[i].logprob, b.logprobs[i].logprob) << what << " token " << i;
    EXPECT_EQ(a.logprobs[i].top, b.logprobs[i].top) << what << " token " << i;
  }
}

}  // namespace dflash::server

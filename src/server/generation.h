// One completion on the engine: prefill of the prompt, then the decode loop with sampling, end-of-generation
// tokens, stop strings, a token budget, a deadline and cancellation; text leaves through a sink as soon
// as no stop string can still claim it. Used by every generating endpoint of the server.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "decode/runner.h"
#include "decode/sampler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace dflash::server {

// What the server generates with (owned by the caller, outliving the server).
struct Engine {
  Runner* runner = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  // null: the model has none (chat endpoints refuse)
  bool xml_tool_calls = false;  // the template writes calls as <function=NAME> (Qwen3.5), not JSON (Qwen3)
  std::string model_id;
  int64_t n_ctx = 0;    // prompt + generated tokens a request may use
  std::string device;   // "cpu", "cuda:0", ... (for /props)
  std::string version;  // dflash's version (for /props)
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 0;          // generated tokens at most (>= 1)
  std::vector<std::string> stop;   // stop strings (not included in the output)
  int top_logprobs = -1;           // -1: no logprobs; 0..20: each token's and this many alternatives
};

// A generated token's log-probability under the model (log-softmax of its raw logits) and the most
// likely alternatives.
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

struct GenerationResult {
  std::string text;
  std::string finish_reason;  // "stop" (end of generation or a stop string) or "length"
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double prefill_ms = 0;
  double decode_ms = 0;
  std::vector<TokenLogprob> logprobs;  // per generated token, when asked for
};

// Receives text as it becomes final; returns false when the receiver is gone (the request is cancelled).
using TextSink = std::function<bool(std::string_view delta)>;

// Holds back the end of the generated text while it could still be the start of a stop string, and
// finds the first stop string. Bytes are only released at UTF-8 character boundaries.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // Appends text; returns the newly releasable text. After a stop string is found, stopped() is true,
  // the text up to it has been released and everything after is dropped.
  std::string push(std::string_view text);
  // The text still held back (at the end of generation).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  size_t max_len_ = 0;
  std::string held_;
  bool stopped_ = false;
};

// Runs the request on a fresh sequence. Errors: invalid parameters or a prompt plus max_tokens beyond
// n_ctx (kInvalidArgument), the sink refusing text, *cancel set, or the deadline passing (kCancelled,
// checked every step), engine failures.
Result<GenerationResult> generate(const Engine& engine, const GenerationRequest& req, const TextSink& sink,
                                  const std::atomic<bool>* cancel = nullptr,
                                  std::chrono::steady_clock::time_point deadline =
                                      std::chrono::steady_clock::time_point::max());

}  // namespace dflash::server

#include "server/generation.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "state/sequence_state.h"
#include "tokenizer/stream_detokenizer.h"

namespace dflash::server {
namespace {

// Length of the longest prefix of s that ends on a UTF-8 character boundary.
size_t utf8_boundary(std::string_view s, size_t len) {
  while (len > 0 && len < s.size() && (static_cast<unsigned char>(s[len]) & 0xC0) == 0x80) --len;
  return len;
}

// log-softmax of the raw logits at `id`, and the `top` most likely ids with theirs.
TokenLogprob logprob_of(std::span<const float> logits, int32_t id, int top) {
  float mx = -INFINITY;
  for (float l : logits) mx = std::max(mx, l);
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
  const double lse = mx + std::log(sum);
  TokenLogprob t;
  t.id = id;
  t.logprob = static_cast<float>(logits[static_cast<size_t>(id)] - lse);
  if (top > 0) {
    std::vector<int32_t> idx(logits.size());
    std::iota(idx.begin(), idx.end(), 0);
    const auto k = static_cast<size_t>(std::min<int64_t>(top, static_cast<int64_t>(idx.size())));
    std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                      [&](int32_t a, int32_t b) { return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)]; });
    for (size_t i = 0; i < k; ++i)
      t.top.emplace_back(idx[i], static_cast<float>(logits[static_cast<size_t>(idx[i])] - lse));
  }
  return t;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
  for (const auto& s : stops_) max_len_ = std::max(max_len_, s.size());
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Keep the longest tail that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_)
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  const size_t release = utf8_boundary(held_, held_.size() - keep);
  std::string out = held_.substr(0, release);
  held_.erase(0, release);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return stopped_ ? std::string() : out;
}

Result<GenerationResult> generate(const Engine& engine, const GenerationRequest& req, const TextSink& sink,
                                  const std::atomic<bool>* cancel, std::chrono::steady_clock::time_point deadline) {
  if (engine.runner == nullptr || engine.tokenizer == nullptr) return internal_error("the engine is not loaded");
  DF_RETURN_IF_ERROR(req.sampling.validate());
  if (req.top_logprobs > 20) return invalid_argument("top_logprobs must be at most 20");
  const auto n_prompt = static_cast<int64_t>(req.prompt.size());
  if (n_prompt == 0) return invalid_argument("the prompt is empty");
  if (req.max_tokens < 1) return invalid_argument("max_tokens must be at least 1");
  if (n_prompt + req.max_tokens > engine.n_ctx)
    return invalid_argument("the prompt ({} tokens) plus max_tokens ({}) exceed the context of {} tokens", n_prompt,
                            req.max_tokens, engine.n_ctx);
  Runner& runner = *engine.runner;
  const int64_t vocab = runner.spec().vocab;
  for (int32_t t : req.prompt)
    if (t < 0 || t >= vocab) return invalid_argument("token id {} is outside the vocabulary of {}", t, vocab);
  auto check_live = [&]() -> Status {
    if (cancel != nullptr && cancel->load()) return Status(ErrorCode::kCancelled, "the client went away");
    if (std::chrono::steady_clock::now() > deadline) return Status(ErrorCode::kCancelled, "the request deadline passed");
    return Status();
  };

  GenerationResult res;
  res.prompt_tokens = n_prompt;
  DF_ASSIGN_OR_RETURN(Sampler sampler, Sampler::create(req.sampling));
  SequenceState state(runner.spec(), runner.backend());
  DF_RETURN_IF_ERROR(state.status());
  const auto t0 = std::chrono::steady_clock::now();
  DF_ASSIGN_OR_RETURN(std::vector<float> logits, runner.prefill(state, req.prompt));
  res.prefill_ms = ms_since(t0);

  const std::vector<int32_t> eog = engine.tokenizer->vocab().end_of_generation_ids();
  StreamDetokenizer detok(*engine.tokenizer, /*skip_special=*/true);
  StopMatcher stops(req.stop);
  std::vector<int32_t> history = req.prompt;
  auto emit = [&](const std::string& text) -> Status {
    if (text.empty()) return Status();
    res.text += text;
    if (!sink || sink(text)) return Status();
    return Status(ErrorCode::kCancelled, "the client went away");
  };
  res.finish_reason = "length";
  const auto t1 = std::chrono::steady_clock::now();
  while (res.completion_tokens < req.max_tokens) {
    DF_RETURN_IF_ERROR(check_live());
    DF_ASSIGN_OR_RETURN(int32_t next, sampler.sample(logits, history));
    if (req.top_logprobs >= 0) res.logprobs.push_back(logprob_of(logits, next, req.top_logprobs));
    history.push_back(next);
    ++res.completion_tokens;
    if (std::find(eog.begin(), eog.end(), next) != eog.end()) {
      res.finish_reason = "stop";
      break;
    }
    DF_RETURN_IF_ERROR(emit(stops.push(detok.push(next))));
    if (stops.stopped()) {
      res.finish_reason = "stop";
      break;
    }
    if (res.completion_tokens == req.max_tokens) break;
    Step step;
    step.tokens = std::span<const int32_t>(&history.back(), 1);
    DF_ASSIGN_OR_RETURN(StepOutput out, runner.forward(state, step));
    logits = std::move(out.logits);
  }
  if (!stops.stopped()) {
    DF_RETURN_IF_ERROR(emit(stops.push(detok.finish())));
    if (stops.stopped()) res.finish_reason = "stop";
    DF_RETURN_IF_ERROR(emit(stops.flush()));
  }
  res.decode_ms = ms_since(t1);
  return res;
}

}  // namespace dflash::server

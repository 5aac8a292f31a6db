// The scheduler on the tiny Qwen3 fixture: slots interleave (a short request overtakes a long one; one
// slot is FIFO), interleaved and reused slots give exactly what generate() gives alone (and greedy what
// transformers gives), the queue bound, cancellation and deadlines freeing slots, a failing request
// failing alone, and stop() while busy. Also Generation's step structure (prefill in chunks, cut at turn
// boundaries) and the prefix cache's exactness on the tiny Qwen3 and Qwen3.5 fixtures.
#include "server/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "model/weights.h"
#include "support/test_paths.h"
#include "tokenizer/load_tokenizer.h"
#include "unit/server/generation_test_util.h"

namespace dflash::server {
namespace {

using Clock = std::chrono::steady_clock;

// Waits (up to 60 s) for `cond`; false on timeout.
template <typename F>
bool eventually(F cond) {
  for (int i = 0; i < 6000; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// A tiny fixture model on the CPU with its tokenizer (what both fixtures below generate with).
struct TinyModel {
  std::unique_ptr<Weights> weights;
  std::unique_ptr<Runner> runner;
  std::unique_ptr<Tokenizer> tokenizer;
  void load(const std::string& name) {
    const std::string dir = test::fixture_path("models/" + name);
    auto w = Weights::load(dir, 1);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    weights = std::make_unique<Weights>(std::move(w).value());
    runner = std::make_unique<Runner>(*weights, 1);
    auto tok = load_tokenizer(dir);
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    tokenizer = std::make_unique<Tokenizer>(std::move(tok).value());
  }
};

// The outcome of a submitted job, filled in by its done callback.
struct Outcome {
  std::promise<Result<GenerationResult>> promise;
  std::shared_future<Result<GenerationResult>> future = promise.get_future().share();
  std::atomic<int> deltas{0};
  Result<GenerationResult> get() { return future.get(); }
  bool ready() const { return future.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
};

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_.load("tiny-qwen3");
    if (HasFatalFailure()) return;
    runner_ = model_.runner.get();
    tokenizer_ = model_.tokenizer.get();
    engine_.runner = runner_;
    engine_.tokenizer = tokenizer_;
    engine_.model_id = "tiny-qwen3";
    engine_.n_ctx = 4096;
    auto ref = nlohmann::json::parse(*read_text_file(test::fixture_path("models/tiny-qwen3/reference.json")));
    prompts_ = ref["prompts"].get<std::vector<std::vector<int32_t>>>();
    greedy_ = ref["greedy"].get<std::vector<std::vector<int32_t>>>();
  }

  // A greedy request that runs its whole budget (end-of-generation tokens banned).
  GenerationRequest long_request(int64_t max_tokens, size_t prompt = 1) const {
    GenerationRequest r;
    r.prompt = prompts_[prompt];
    r.max_tokens = max_tokens;
    for (int32_t id : tokenizer_->vocab().end_of_generation_ids()) r.sampling.logit_bias[id] = -INFINITY;
    return r;
  }
  // long_request(7) with a prompt of `tokens` ids (prompt 3's, repeated).
  GenerationRequest request_of_prompt_tokens(int tokens) const {
    GenerationRequest r = long_request(7);
    r.prompt.clear();
    for (int i = 0; i < tokens; ++i) r.prompt.push_back(prompts_[3][static_cast<size_t>(i) % prompts_[3].size()]);
    return r;
  }

  // Submits `req`; the outcome fills `out`. `on_delta` (optional) runs on the scheduler thread per delta.
  Scheduler::Admission submit(Scheduler& s, GenerationRequest req, Outcome& out,
                              std::shared_ptr<std::atomic<bool>> cancel = nullptr,
                              std::function<bool(std::string_view)> on_delta = nullptr,
                              Clock::time_point deadline = Clock::time_point::max()) {
    GenerationJob job;
    job.request = std::move(req);
    job.sink = [&out, on_delta](std::string_view d) {
      ++out.deltas;
      return on_delta ? on_delta(d) : true;
    };
    job.cancel = std::move(cancel);
    job.deadline = deadline;
    job.done = [&out](Result<GenerationResult> r) { out.promise.set_value(std::move(r)); };
    return s.submit(std::move(job));
  }

  static void expect_same(const GenerationResult& a, const GenerationResult& b, const std::string& what) {
    expect_same_generation(a, b, /*logprobs=*/true, what);
  }

  TinyModel model_;
  Runner* runner_ = nullptr;
  Tokenizer* tokenizer_ = nullptr;
  Engine engine_;
  std::vector<std::vector<int32_t>> prompts_, greedy_;
};

// A sink that takes a millisecond a token: requests that would otherwise finish within the test's polling.
bool slow(std::string_view) {
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return true;
}

// A long request (started first) holds its first token until the short one is queued, so the order of
// events is fixed: with two slots the short one is admitted next to it and finishes first; with one slot
// it waits for the long one (first come, first served).
TEST_F(SchedulerTest, a_short_request_overtakes_a_long_one_with_two_slots) {
  for (int slots : {2, 1}) {
    Scheduler s(engine_, slots, 4);
    std::promise<void> short_queued;
    std::shared_future<void> queued = short_queued.get_future().share();
    std::mutex order_mu;
    std::vector<std::string> order;
    Outcome lng, shrt;
    auto note = [&](const char* who) {
      std::lock_guard<std::mutex> lock(order_mu);
      order.push_back(who);
    };
    GenerationJob lj;
    lj.request = long_request(600);
    lj.sink = [&, first = true](std::string_view) mutable {
      if (first) queued.wait();  // the scheduler thread holds here until the short request is queued
      first = false;
      ++lng.deltas;
      return true;
    };
    lj.done = [&](Result<GenerationResult> r) {
      note("long");
      lng.promise.set_value(std::move(r));
    };
    ASSERT_EQ(s.submit(std::move(lj)), Scheduler::Admission::kQueued);
    GenerationJob sj;
    sj.request = long_request(4, 2);
    sj.done = [&](Result<GenerationResult> r) {
      note("short");
      shrt.promise.set_value(std::move(r));
    };
    ASSERT_TRUE(eventually([&] { return s.busy() == 1; }));
    ASSERT_EQ(s.submit(std::move(sj)), Scheduler::Admission::kQueued);
    short_queued.set_value();
    auto rl = lng.get();
    auto rs = shrt.get();
    ASSERT_TRUE(rl.ok()) << rl.status().to_string();
    ASSERT_TRUE(rs.ok()) << rs.status().to_string();
    EXPECT_EQ(rl->completion_tokens, 600);
    EXPECT_EQ(rs->completion_tokens, 4);
    const std::vector<std::string> want =
        slots == 2 ? std::vector<std::string>{"short", "long"} : std::vector<std::string>{"long", "short"};
    EXPECT_EQ(order, want) << slots << " slots";
    EXPECT_TRUE(eventually([&] { return s.busy() == 0 && s.waiting() == 0; }));
  }
}

// Requests of every kind (greedy, seeded sampling with penalties, stop strings, logprobs, a prompt longer
// than a prefill chunk) interleaved over three slots, more requests than slots, twice (the second round
// reuses the slots' sequences): each result equals generate() alone, and greedy equals transformers.
TEST_F(SchedulerTest, interleaved_and_reused_slots_reproduce_generate_exactly) {
  std::vector<GenerationRequest> reqs;
  for (size_t k = 0; k < prompts_.size(); ++k) {
    GenerationRequest r;
    r.prompt = prompts_[k];
    r.max_tokens = static_cast<int64_t>(greedy_[k].size());
    r.top_logprobs = 0;  // the ids, to compare with transformers
    reqs.push_back(r);
  }
  GenerationRequest sampled = long_request(40, 1);
  sampled.sampling.temperature = 0.9f;
  sampled.sampling.top_k = 40;
  sampled.sampling.seed = 5;
  sampled.sampling.presence_penalty = 0.5f;
  sampled.top_logprobs = 3;
  reqs.push_back(sampled);
  GenerationRequest stopped = long_request(48, 3);
  stopped.top_logprobs = 2;
  reqs.push_back(stopped);

  std::vector<GenerationResult> alone;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto r = generate(engine_, reqs[i], nullptr);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    alone.push_back(std::move(r).value());
  }
  // A stop string taken from the middle of its own output: the request ends there.
  ASSERT_GE(alone.back().text.size(), 8u);
  reqs.back().stop = {alone.back().text.substr(alone.back().text.size() / 2, 3)};
  {
    auto r = generate(engine_, reqs.back(), nullptr);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->finish_reason, "stop");
    alone.back() = std::move(r).value();
  }
  // Greedy equals transformers' continuation (up to an end-of-generation token it may pick).
  for (size_t k = 0; k < prompts_.size(); ++k) {
    std::vector<int32_t> ids;
    for (const auto& t : alone[k].logprobs) ids.push_back(t.id);
    ASSERT_LE(ids.size(), greedy_[k].size());
    EXPECT_EQ(ids, std::vector<int32_t>(greedy_[k].begin(), greedy_[k].begin() + static_cast<ptrdiff_t>(ids.size())))
        << "prompt " << k;
    if (alone[k].finish_reason == "length") {
      EXPECT_EQ(ids.size(), greedy_[k].size());
    }
    // Without logprobs the request is argmax-only: each decode step's token is reduced on the backend
    // (Runner::greedy_token) instead of sampled from the downloaded row. The same continuation.
    GenerationRequest bare = reqs[k];
    bare.top_logprobs = -1;
    auto b = generate(engine_, bare, nullptr);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(b->text, alone[k].text) << "prompt " << k;
    EXPECT_EQ(b->completion_tokens, alone[k].completion_tokens) << "prompt " << k;
    EXPECT_EQ(b->finish_reason, alone[k].finish_reason) << "prompt " << k;
  }

  Scheduler s(engine_, 3, 16);
  for (int round = 0; round < 2; ++round) {
    std::vector<std::unique_ptr<Outcome>> outs;
    std::vector<std::string> streamed(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      outs.push_back(std::make_unique<Outcome>());
      ASSERT_EQ(submit(s, reqs[i], *outs.back(), nullptr,
                       [&streamed, i](std::string_view d) {
                         streamed[i] += d;
                         return true;
                       }),
                Scheduler::Admission::kQueued);
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto r = outs[i]->get();
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      expect_same(*r, alone[i], "round " + std::to_string(round) + " request " + std::to_string(i));
      EXPECT_EQ(streamed[i], r->text);
    }
  }
}

TEST_F(SchedulerTest, a_full_queue_refuses_until_a_request_finishes) {
  Scheduler s(engine_, 1, 1);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  Outcome a, b, c, d;
  ASSERT_EQ(submit(s, long_request(20), a, nullptr,
                   [released](std::string_view) {
                     released.wait();
                     return true;
                   }),
            Scheduler::Admission::kQueued);
  ASSERT_EQ(submit(s, long_request(5), b), Scheduler::Admission::kQueued);
  // One in the slot and one waiting: the queue (max 1 waiting) is full.
  EXPECT_EQ(submit(s, long_request(5), c), Scheduler::Admission::kFull);
  ASSERT_TRUE(eventually([&] { return a.deltas.load() > 0; }));
  EXPECT_EQ(s.busy(), 1);
  EXPECT_EQ(s.waiting(), 1);
  EXPECT_EQ(submit(s, long_request(5), c), Scheduler::Admission::kFull);
  release.set_value();
  EXPECT_TRUE(a.get().ok());
  EXPECT_TRUE(b.get().ok());
  ASSERT_TRUE(eventually([&] { return s.busy() == 0; }));
  ASSERT_EQ(submit(s, long_request(5), d), Scheduler::Admission::kQueued);
  EXPECT_TRUE(d.get().ok());
}

TEST_F(SchedulerTest, cancellation_and_deadlines_free_the_slot) {
  Scheduler s(engine_, 1, 4);
  // Cancelled by its requester mid-decode.
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  Outcome a, b, c, d, e;
  ASSERT_EQ(submit(s, long_request(3000), a, cancel, slow), Scheduler::Admission::kQueued);
  ASSERT_EQ(submit(s, long_request(6, 0), b), Scheduler::Admission::kQueued);
  ASSERT_TRUE(eventually([&] { return a.deltas.load() >= 5; }));
  cancel->store(true);
  auto ra = a.get();
  ASSERT_FALSE(ra.ok());
  EXPECT_EQ(ra.status().code(), ErrorCode::kCancelled);
  EXPECT_LT(a.deltas.load(), 3000);
  auto rb = b.get();  // the freed slot serves the waiting request
  ASSERT_TRUE(rb.ok()) << rb.status().to_string();
  EXPECT_EQ(rb->completion_tokens, 6);
  // A sink that refuses text (the client went away) cancels too.
  ASSERT_EQ(submit(s, long_request(3000), c, nullptr, [](std::string_view) { return false; }),
            Scheduler::Admission::kQueued);
  EXPECT_EQ(c.get().status().code(), ErrorCode::kCancelled);
  // A deadline that passes mid-decode, and one already past.
  ASSERT_EQ(submit(s, long_request(4000), d, nullptr, slow, Clock::now() + std::chrono::milliseconds(50)),
            Scheduler::Admission::kQueued);
  ASSERT_EQ(submit(s, long_request(5), e, nullptr, nullptr, Clock::now() - std::chrono::seconds(1)),
            Scheduler::Admission::kQueued);
  const auto rd = d.get();
  EXPECT_EQ(rd.status().code(), ErrorCode::kCancelled) << (rd.ok() ? "finished" : rd.status().to_string());
  EXPECT_EQ(e.get().status().code(), ErrorCode::kCancelled);
  EXPECT_TRUE(eventually([&] { return s.busy() == 0 && s.waiting() == 0; }));
}

TEST_F(SchedulerTest, a_failing_request_fails_alone) {
  Scheduler s(engine_, 2, 4);
  Outcome good, bad_token, too_long, bad_sampling;
  GenerationRequest bt = long_request(4);
  bt.prompt.push_back(100000);
  GenerationRequest tl = long_request(5000);
  GenerationRequest bs = long_request(4);
  bs.sampling.temperature = -1;
  ASSERT_EQ(submit(s, long_request(30), good), Scheduler::Admission::kQueued);
  ASSERT_EQ(submit(s, bt, bad_token), Scheduler::Admission::kQueued);
  ASSERT_EQ(submit(s, tl, too_long), Scheduler::Admission::kQueued);
  ASSERT_EQ(submit(s, bs, bad_sampling), Scheduler::Admission::kQueued);
  EXPECT_EQ(bad_token.get().status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(too_long.get().status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad_sampling.get().status().code(), ErrorCode::kInvalidArgument);
  auto r = good.get();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto alone = generate(engine_, long_request(30), nullptr);
  ASSERT_TRUE(alone.ok());
  expect_same(*r, *alone, "next to failing requests");
}

TEST_F(SchedulerTest, stop_while_busy_cancels_everything_and_returns) {
  std::vector<std::unique_ptr<Outcome>> outs;
  {
    Scheduler s(engine_, 2, 4);
    for (int i = 0; i < 5; ++i) {
      outs.push_back(std::make_unique<Outcome>());
      ASSERT_EQ(submit(s, long_request(3000), *outs.back(), nullptr, slow), Scheduler::Admission::kQueued);
    }
    ASSERT_TRUE(eventually([&] { return s.busy() == 2 && outs[0]->deltas.load() > 3 && outs[1]->deltas.load() > 3; }));
    s.stop();
    Outcome late;
    EXPECT_EQ(submit(s, long_request(3), late), Scheduler::Admission::kStopped);
    s.stop();  // idempotent; the destructor stops again
  }
  for (auto& o : outs) {
    ASSERT_TRUE(o->ready());
    EXPECT_EQ(o->get().status().code(), ErrorCode::kCancelled);
  }
}

// A prompt is evaluated the runner's prefill_chunk() tokens per step (512 on the CPU), then one token per
// step; the steps' forwards are those of generate(), so the result is the same.
TEST_F(SchedulerTest, generation_prefills_in_chunks_then_decodes_a_token_per_step) {
  const GenerationRequest r = request_of_prompt_tokens(600);
  Generation g(engine_, r, nullptr);
  SequenceState state(runner_->spec(), runner_->backend());
  ASSERT_TRUE(g.start(state).ok());
  int prefill_steps = 0, decode_steps = 0;
  for (;;) {
    const bool was_prefilling = g.prefilling();
    auto done = g.step();
    ASSERT_TRUE(done.ok()) << done.status().to_string();
    (was_prefilling ? prefill_steps : decode_steps) += 1;
    if (was_prefilling) {
      EXPECT_EQ(state.n_past(), std::min<int64_t>(600, prefill_steps * runner_->prefill_chunk()));
    }
    if (*done) break;
  }
  EXPECT_EQ(prefill_steps, 2);  // 512 + 88
  EXPECT_EQ(decode_steps, 7);
  auto alone = generate(engine_, r, nullptr);
  ASSERT_TRUE(alone.ok());
  expect_same(g.result(), *alone, "stepped by hand");
  // A sequence that is not empty is refused.
  Generation again(engine_, r, nullptr);
  EXPECT_EQ(again.start(state).code(), ErrorCode::kInternal);
}

// Runner::set_prefill_chunk (--prefill-chunk) sets the steps a prompt is prefilled in.
TEST_F(SchedulerTest, generation_prefill_steps_follow_the_runners_chunk) {
  ASSERT_EQ(runner_->prefill_chunk(), Runner::kPrefillChunk);  // the CPU's default
  for (const int64_t chunk : {int64_t{256}, int64_t{1000}}) {
    runner_->set_prefill_chunk(chunk);
    Generation g(engine_, request_of_prompt_tokens(600), nullptr);
    SequenceState state(runner_->spec(), runner_->backend());
    ASSERT_TRUE(g.start(state).ok());
    int prefill_steps = 0;
    while (g.prefilling()) {
      auto done = g.step();
      ASSERT_TRUE(done.ok()) << done.status().to_string();
      ++prefill_steps;
      EXPECT_EQ(state.n_past(), std::min<int64_t>(600, prefill_steps * chunk)) << chunk;
    }
    EXPECT_EQ(prefill_steps, (600 + chunk - 1) / chunk);
  }
  runner_->set_prefill_chunk(0);  // no change: the chunk stays 1000
  EXPECT_EQ(runner_->prefill_chunk(), 1000);
  runner_->set_prefill_chunk(Runner::kPrefillChunk);
}

// The prefix cache on both tiny fixtures (Qwen3: attention only; Qwen3.5: DeltaNet, whose chunked prefill
// depends on how the prompt is split into steps): a prompt with turn boundaries continues bit for bit from
// a snapshot taken at any of its cuts exactly as from a cold prefill (the logits the first token is
// sampled from, and a 16-token greedy continuation with its log-probabilities).
class PrefixRestore : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    model_.load(GetParam());
    if (HasFatalFailure()) return;
    runner_ = model_.runner.get();
    tokenizer_ = model_.tokenizer.get();
    cold_.runner = runner_;
    cold_.tokenizer = tokenizer_;
    cold_.n_ctx = 4096;
    auto im_end = tokenizer_->token_to_id("<|im_end|>");
    auto nl = tokenizer_->encode("\n", false);
    ASSERT_TRUE(im_end.has_value());
    ASSERT_TRUE(nl.ok() && nl->size() == 1);
    im_end_ = *im_end;
    newline_ = (*nl)[0];
    // Body ids: the reference prompts' ids, less those that end a turn, cycled.
    const std::string ref_path = test::fixture_path("models/" + GetParam() + "/reference.json");
    auto ref = nlohmann::json::parse(*read_text_file(ref_path));
    const auto eog = tokenizer_->vocab().end_of_generation_ids();
    for (const auto& p : ref["prompts"].get<std::vector<std::vector<int32_t>>>())
      for (int32_t id : p)
        if (std::find(eog.begin(), eog.end(), id) == eog.end()) body_.push_back(id);
  }

  // Turns of `lengths` tokens each (the last `<|im_end|>` `\n`), then an open turn of `tail` tokens.
  std::vector<int32_t> chat_like(const std::vector<int>& lengths, int tail) const {
    std::vector<int32_t> p;
    size_t k = 0;
    auto body = [&](int n) {
      for (int i = 0; i < n; ++i) p.push_back(body_[k++ % body_.size()]);
    };
    for (int len : lengths) {
      body(len - 2);
      p.push_back(im_end_);
      p.push_back(newline_);
    }
    body(tail);
    return p;
  }

  // A greedy 16-token request (end of generation banned) with each token's log-probability and top 5.
  GenerationRequest request(std::vector<int32_t> prompt, int64_t max_tokens = 16) const {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.top_logprobs = 5;
    for (int32_t id : tokenizer_->vocab().end_of_generation_ids()) r.sampling.logit_bias[id] = -INFINITY;
    return r;
  }

  struct Run {
    GenerationResult result;
    std::vector<float> first_logits;  // what the first token was sampled from
    std::vector<int64_t> prefill_n_past;  // the sequence's length after each prefill step
  };
  // Runs `r` on a fresh sequence, step by step.
  Run run(const Engine& e, const GenerationRequest& r) const {
    Run out;
    Generation g(e, r, nullptr);
    SequenceState state(runner_->spec(), runner_->backend());
    const Status st = g.start(state);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return out;
    while (g.prefilling()) {
      auto done = g.step();
      EXPECT_TRUE(done.ok()) << done.status().to_string();
      if (!done.ok()) return out;
      out.prefill_n_past.push_back(state.n_past());
    }
    out.first_logits = g.logits();
    for (;;) {
      auto done = g.step();
      EXPECT_TRUE(done.ok()) << done.status().to_string();
      if (!done.ok() || *done) break;
    }
    out.result = g.take_result();
    return out;
  }

  static void expect_identical(const Run& a, const Run& cold, const std::string& what) {
    ASSERT_EQ(a.first_logits.size(), cold.first_logits.size()) << what;
    EXPECT_EQ(0, std::memcmp(a.first_logits.data(), cold.first_logits.data(), a.first_logits.size() * sizeof(float)))
        << what << ": the logits after the prefill differ";
    EXPECT_EQ(a.result.text, cold.result.text) << what;
    ASSERT_EQ(a.result.logprobs.size(), cold.result.logprobs.size()) << what;
    for (size_t i = 0; i < a.result.logprobs.size(); ++i) {
      EXPECT_EQ(a.result.logprobs[i].id, cold.result.logprobs[i].id) << what << " token " << i;
      EXPECT_EQ(a.result.logprobs[i].logprob, cold.result.logprobs[i].logprob) << what << " token " << i;
      EXPECT_EQ(a.result.logprobs[i].top, cold.result.logprobs[i].top) << what << " token " << i;
    }
  }

  TinyModel model_;
  Runner* runner_ = nullptr;
  Tokenizer* tokenizer_ = nullptr;
  Engine cold_;  // no prefix cache
  int32_t im_end_ = 0, newline_ = 0;
  std::vector<int32_t> body_;
};

// Turns of 40, 600, 10 and 45 tokens, then 70: cuts after 40, 640 and 695 (the 10-token turn is shorter
// than kMinPrefixSegment, so it is no cut), and at the end (765). The cold prefill steps through them.
TEST_P(PrefixRestore, the_prefill_schedule_is_cut_at_turn_boundaries) {
  const auto prompt = chat_like({40, 600, 10, 45}, 70);
  const int32_t ends[] = {im_end_};
  EXPECT_EQ(prefill_cuts(prompt, ends, newline_, Generation::kMinPrefixSegment),
            (std::vector<int64_t>{40, 640, 695, 765}));
  // A turn end with no newline after it, a turn end as the prompt's last id, no turn ends at all.
  const std::vector<int32_t> bare = {1, 2, 3, im_end_, 4, 5, im_end_};
  EXPECT_EQ(prefill_cuts(bare, ends, newline_, 2), (std::vector<int64_t>{4, 7}));
  EXPECT_EQ(prefill_cuts(std::vector<int32_t>{1, 2, 3}, ends, newline_, 2), (std::vector<int64_t>{3}));
  const Run cold = run(cold_, request(prompt));
  EXPECT_EQ(cold.prefill_n_past, (std::vector<int64_t>{40, 552, 640, 695, 765}));  // 600 = 512 + 88
  EXPECT_EQ(cold.result.cached_tokens, 0);
}

TEST_P(PrefixRestore, restoring_at_any_cut_continues_exactly_like_a_cold_prefill) {
  const auto prompt = chat_like({40, 600, 10, 45}, 70);
  const Run cold = run(cold_, request(prompt));
  ASSERT_EQ(cold.result.completion_tokens, 16);
  for (int64_t cut : {40, 640, 695}) {
    PrefixCache cache(256u << 20);
    Engine warm = cold_;
    warm.prefix_cache = &cache;
    // The prompt up to the cut leaves a snapshot at its end; the whole prompt then starts from it.
    const Run prefix = run(warm, request(std::vector<int32_t>(prompt.begin(), prompt.begin() + cut), 1));
    ASSERT_TRUE(cache.contains(std::span<const int32_t>(prompt).first(static_cast<size_t>(cut))));
    const Run hit = run(warm, request(prompt));
    EXPECT_EQ(hit.result.cached_tokens, cut);
    ASSERT_FALSE(hit.prefill_n_past.empty());
    EXPECT_EQ(hit.prefill_n_past.back(), 765);
    EXPECT_GT(hit.prefill_n_past.front(), cut);
    expect_identical(hit, cold, GetParam() + " restored at " + std::to_string(cut));
    EXPECT_EQ(cache.stats().hits, 1u);
  }
}

// The same prompt again needs no forward: the snapshot at its end holds the logits of its last token.
// Snapshots are taken where a later request branches: the first turn boundary, the last two, the end.
TEST_P(PrefixRestore, a_repeated_prompt_runs_no_prefill_and_gives_the_same_output) {
  const auto prompt = chat_like({40, 600, 10, 45}, 70);
  PrefixCache cache(256u << 20);
  Engine warm = cold_;
  warm.prefix_cache = &cache;
  const Run first = run(warm, request(prompt));
  EXPECT_EQ(first.result.cached_tokens, 0);
  for (int64_t cut : {40, 640, 695, 765})
    EXPECT_TRUE(cache.contains(std::span<const int32_t>(prompt).first(static_cast<size_t>(cut)))) << cut;
  EXPECT_EQ(cache.stats().entries, 4);
  const Run again = run(warm, request(prompt));
  EXPECT_EQ(again.result.cached_tokens, 765);
  EXPECT_TRUE(again.prefill_n_past.empty());
  expect_identical(again, first, GetParam() + " repeated");
  expect_identical(again, run(cold_, request(prompt)), GetParam() + " repeated vs cold");
  // A longer conversation: turn boundaries past the cached ones; the longest cached cut is restored.
  auto longer = prompt;
  longer.push_back(im_end_);
  longer.push_back(newline_);
  const auto more = chat_like({50}, 20);
  longer.insert(longer.end(), more.begin(), more.end());
  const Run next = run(warm, request(longer));
  EXPECT_EQ(next.result.cached_tokens, 695);  // the end of the shorter prompt is no cut of the longer one
  expect_identical(next, run(cold_, request(longer)), GetParam() + " next turn");
}

// A snapshot whose length is not a cut of the new prompt is not used, even though its ids are a prefix:
// the steps that led to it differ from the new prompt's own schedule.
TEST_P(PrefixRestore, a_snapshot_off_the_prompts_cuts_is_not_restored) {
  const auto prompt = chat_like({40, 600, 10, 45}, 70);
  PrefixCache cache(256u << 20);
  Engine warm = cold_;
  warm.prefix_cache = &cache;
  run(warm, request(std::vector<int32_t>(prompt.begin(), prompt.begin() + 200), 1));  // cuts 40, 200
  EXPECT_TRUE(cache.contains(std::span<const int32_t>(prompt).first(200)));
  const Run hit = run(warm, request(prompt));
  EXPECT_EQ(hit.result.cached_tokens, 40);
  expect_identical(hit, run(cold_, request(prompt)), GetParam() + " restored at 40");
}

INSTANTIATE_TEST_SUITE_P(TinyModels, PrefixRestore, ::testing::Values("tiny-qwen3", "tiny-qwen35"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                           return n;
                         });

}  // namespace
}  // namespace dflash::server

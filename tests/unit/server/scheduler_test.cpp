// The scheduler on the tiny Qwen3 fixture: slots interleave (a short request overtakes a long one; one
// slot is FIFO), interleaved and reused slots give exactly what generate() gives alone (and greedy what
// transformers gives), the queue bound, cancellation and deadlines freeing slots, a failing request
// failing alone, and stop() while busy. Also Generation's step structure (prefill in chunks).
#include "server/scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
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
    const std::string dir = test::fixture_path("models/tiny-qwen3");
    auto w = Weights::load(dir, 1);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    weights_ = std::make_unique<Weights>(std::move(w).value());
    runner_ = std::make_unique<Runner>(*weights_, 1);
    auto tok = load_tokenizer(dir);
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    tokenizer_ = std::make_unique<Tokenizer>(std::move(tok).value());
    engine_.runner = runner_.get();
    engine_.tokenizer = tokenizer_.get();
    engine_.model_id = "tiny-qwen3";
    engine_.n_ctx = 4096;
    auto ref = nlohmann::json::parse(*read_text_file(dir + "/reference.json"));
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
    EXPECT_EQ(a.text, b.text) << what;
    EXPECT_EQ(a.finish_reason, b.finish_reason) << what;
    EXPECT_EQ(a.prompt_tokens, b.prompt_tokens) << what;
    EXPECT_EQ(a.completion_tokens, b.completion_tokens) << what;
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
    for (size_t i = 0; i < a.logprobs.size(); ++i) {
      EXPECT_EQ(a.logprobs[i].id, b.logprobs[i].id) << what << " token " << i;
      EXPECT_EQ(a.logprobs[i].logprob, b.logprobs[i].logprob) << what << " token " << i;  // bit for bit
      EXPECT_EQ(a.logprobs[i].top, b.logprobs[i].top) << what << " token " << i;
    }
  }

  std::unique_ptr<Weights> weights_;
  std::unique_ptr<Runner> runner_;
  std::unique_ptr<Tokenizer> tokenizer_;
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

// A prompt is evaluated kPrefillChunk tokens per step, then one token per step; the steps' forwards are
// those of generate(), so the result is the same.
TEST_F(SchedulerTest, generation_prefills_in_chunks_then_decodes_a_token_per_step) {
  GenerationRequest r = long_request(7);
  r.prompt.clear();
  for (int i = 0; i < 600; ++i) r.prompt.push_back(prompts_[3][static_cast<size_t>(i) % prompts_[3].size()]);
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
      EXPECT_EQ(state.n_past(), std::min<int64_t>(600, prefill_steps * Generation::kPrefillChunk));
    }
    if (*done) break;
  }
  EXPECT_EQ(prefill_steps, 3);  // 256 + 256 + 88
  EXPECT_EQ(decode_steps, 7);
  auto alone = generate(engine_, r, nullptr);
  ASSERT_TRUE(alone.ok());
  expect_same(g.result(), *alone, "stepped by hand");
  // A sequence that is not empty is refused.
  Generation again(engine_, r, nullptr);
  EXPECT_EQ(again.start(state).code(), ErrorCode::kInternal);
}

}  // namespace
}  // namespace dflash::server

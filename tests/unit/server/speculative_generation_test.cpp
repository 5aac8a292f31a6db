// generate() with a DFlash draft (Engine::draft, a ResidentDraft of the tiny random draft for tiny-qwen35)
// against generate() without one: the same text, token counts, finish reason and log-probabilities, for
// greedy and for seeded sampling (temperature 0.8, top-p 0.9, penalties), chain and DDTree (budgets 6 and 22),
// token budgets 1, 2 and 17, stop strings, end-of-generation tokens and json_object. The decoder draws from
// the request's sampler exactly once per emitted token, in order, from logits equal to plain decoding's, so a
// sampled run is the plain sampled run. With a prefix cache: a repeated prompt restores the target state and
// the draft's feature window from the snapshot and continues identically. Residency: a request-scoped draft
// is parked whenever no request holds it; a persistent one never is.
//
// Log-probabilities are compared bit for bit where the sequence stays inside the first 64-token KV chunk
// (prompt + max_tokens + tree nodes <= 64): there the verify's logits are plain decoding's bit for bit. A DDTree
// node whose KV slot and position fall in different chunks can differ in the last bits (see
// tests/unit/decode/dflash_test.cpp, ddtree_path_in_another_kv_chunk_than_its_positions_is_exact); longer runs
// compare the text and the token counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "cache/prefix_cache.h"
#include "decode/resident_draft.h"
#include "model/weights.h"
#include "server/generation.h"
#include "state/feature_ring.h"
#include "support/random_hf_model.h"
#include "support/test_paths.h"
#include "tokenizer/load_tokenizer.h"
#include "unit/ops/ops_test_util.h"
#include "unit/server/generation_test_util.h"

namespace dflash::server {
namespace {

constexpr int kThreads = 2;

struct Mode {
  const char* name;
  bool ddtree;
  int64_t budget;
};
constexpr Mode kModes[] = {{"chain", false, 22}, {"ddtree 6", true, 6}, {"ddtree 22", true, 22}};

class SpeculativeGeneration : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = test::fixture_path("models/tiny-qwen35");
    auto w = Weights::load(dir, kThreads);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    target_ = new Weights(std::move(w).value());
    runner_ = new Runner(*target_, kThreads);
    auto tok = load_tokenizer(dir);
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    tokenizer_ = new Tokenizer(std::move(tok).value());
    auto ref = nlohmann::json::parse(*read_text_file(dir + "/reference.json"));
    prompts_ = new std::vector<std::vector<int32_t>>(ref["prompts"].get<std::vector<std::vector<int32_t>>>());
  }
  static void TearDownTestSuite() {
    delete prompts_;
    delete tokenizer_;
    delete runner_;
    delete target_;
    prompts_ = nullptr, tokenizer_ = nullptr, runner_ = nullptr, target_ = nullptr;
  }

  static std::string draft_path() { return test::fixture_path("models/tiny-qwen35-dflash"); }
  static std::unique_ptr<ResidentDraft> load_draft(DraftResidency policy) {
    auto d = ResidentDraft::load(draft_path(), *target_, runner_->backend(), *target_, nullptr, policy, kThreads);
    EXPECT_TRUE(d.ok()) << d.status().to_string();
    return d.ok() ? std::move(d).value() : nullptr;
  }

  static Engine plain_engine() {
    Engine e;
    e.runner = runner_;
    e.tokenizer = tokenizer_;
    e.model_id = "tiny-qwen35";
    e.n_ctx = 4096;
    return e;
  }
  static Engine spec_engine(ResidentDraft* draft, const Mode& m, bool adaptive = false) {
    Engine e = plain_engine();
    e.draft = draft;
    e.spec.ddtree = m.ddtree;
    e.spec.ddtree_budget = m.budget;
    e.spec.adaptive = adaptive;
    return e;
  }

  // A request; end-of-generation tokens banned unless `allow_eog`.
  static GenerationRequest request(std::vector<int32_t> prompt, int64_t max_tokens, bool allow_eog = false) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.top_logprobs = 3;
    if (!allow_eog)
      for (int32_t id : tokenizer_->vocab().end_of_generation_ids()) r.sampling.logit_bias[id] = -INFINITY;
    return r;
  }
  // Plain greedy with nothing that needs a node's whole row (no bias, no logprobs): the decoder takes each
  // verified node's argmax as reduced on the backend.
  static void make_argmax_only(GenerationRequest& r) {
    r.sampling.logit_bias.clear();
    r.top_logprobs = -1;
  }
  static void make_sampled(GenerationRequest& r, uint64_t seed, bool penalties = false) {
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.9f;
    r.sampling.seed = seed;
    if (penalties) {
      r.sampling.repetition_penalty = 1.15f;
      r.sampling.presence_penalty = 0.4f;
    }
  }

  struct Run {
    GenerationResult result;
    std::string streamed;  // what the sink received, concatenated
  };
  static Run run(const Engine& e, const GenerationRequest& r) {
    Run out;
    auto res = generate(e, r, [&out](std::string_view d) {
      out.streamed += d;
      return true;
    });
    EXPECT_TRUE(res.ok()) << res.status().to_string();
    if (res.ok()) out.result = std::move(res).value();
    return out;
  }

  // Same output; log-probabilities bit for bit when `logprobs`.
  static void expect_same(const Run& got, const Run& want, bool logprobs, const std::string& what) {
    const GenerationResult &a = got.result, &b = want.result;
    EXPECT_EQ(got.streamed, a.text) << what;
    expect_same_generation(a, b, logprobs, what);
    EXPECT_TRUE(a.speculative) << what;
    EXPECT_FALSE(b.speculative) << what;
  }

  // SpecStats as the decoder keeps them: accepted_at sums to accepted, falls with depth.
  static void expect_consistent(const SpecStats& s, const std::string& what) {
    int64_t sum = 0;
    for (size_t i = 0; i < s.accepted_at.size(); ++i) {
      sum += s.accepted_at[i];
      if (i > 0) {
        EXPECT_LE(s.accepted_at[i], s.accepted_at[i - 1]) << what;
      }
    }
    EXPECT_EQ(sum, s.accepted) << what;
    EXPECT_LE(s.accepted, s.drafted) << what;
  }

  static std::vector<int32_t> random_prompt(std::mt19937& rng, size_t n) {
    const auto eog = tokenizer_->vocab().end_of_generation_ids();
    std::vector<int32_t> p;
    while (p.size() < n) {
      const auto t = static_cast<int32_t>(rng() % 509);  // the vocabulary's ordinary tokens (added ones above)
      if (std::find(eog.begin(), eog.end(), t) == eog.end()) p.push_back(t);
    }
    return p;
  }

  static Weights* target_;
  static Runner* runner_;
  static Tokenizer* tokenizer_;
  static std::vector<std::vector<int32_t>>* prompts_;
};

Weights* SpeculativeGeneration::target_ = nullptr;
Runner* SpeculativeGeneration::runner_ = nullptr;
Tokenizer* SpeculativeGeneration::tokenizer_ = nullptr;
std::vector<std::vector<int32_t>>* SpeculativeGeneration::prompts_ = nullptr;

// Short sequences (inside the first KV chunk): every mode, greedy (with logprobs, and argmax-only), sampled
// (with and without penalties), budgets 1, 2 and 17: identical output and log-probabilities.
TEST_F(SpeculativeGeneration, short_runs_equal_plain_decoding_bit_for_bit) {
  test::SeededRng seeded;
  auto draft = load_draft(DraftResidency::kPersistent);
  ASSERT_NE(draft, nullptr);
  const Engine plain = plain_engine();
  const std::vector<std::vector<int32_t>> prompts = {(*prompts_)[2], random_prompt(seeded.rng, 20)};
  for (const auto& prompt : prompts) {
    ASSERT_LE(static_cast<int64_t>(prompt.size()) + 17 + 22, 64);
    for (int sampling = 0; sampling < 4; ++sampling) {
      const uint64_t seed = seeded.rng();
      for (int64_t max_tokens : {1, 2, 17}) {
        GenerationRequest r = request(prompt, max_tokens);
        if (sampling == 1 || sampling == 2) make_sampled(r, seed, sampling == 2);
        if (sampling == 3) make_argmax_only(r);
        const Run want = run(plain, r);
        if (sampling != 3) {
          ASSERT_EQ(want.result.completion_tokens, max_tokens);  // (argmax-only may meet an end of generation)
        }
        for (const Mode& m : kModes) {
          static const char* const kind[] = {" greedy", " sampled", " sampled+penalties", " argmax-only"};
          const std::string what = std::string(m.name) + kind[sampling] + " max_tokens " + std::to_string(max_tokens) +
                                   " prompt of " + std::to_string(prompt.size());
          const Run got = run(spec_engine(draft.get(), m), r);
          expect_same(got, want, true, what);
          expect_consistent(got.result.spec, what);
          // The first token comes from the prompt's logits; each draft step emits at least one more; the
          // last one or two may be plain steps (no room left for a draft).
          if (max_tokens == 17 && want.result.completion_tokens == 17) {
            EXPECT_GE(got.result.spec.steps, 1) << what;
            EXPECT_LE(got.result.spec.steps, 15) << what;
          }
          if (max_tokens <= 2) {
            EXPECT_EQ(got.result.spec.steps, 0) << what;
          }
        }
      }
    }
  }
}

// The 50-token prompt, 40 tokens, and the 300-token prompt (prefilled in two chunks, features of both
// captured), 24 tokens: the same text and tokens, adaptive fallback on and off.
TEST_F(SpeculativeGeneration, long_runs_equal_plain_decoding) {
  test::SeededRng seeded;
  auto draft = load_draft(DraftResidency::kAuto);
  ASSERT_NE(draft, nullptr);
  const Engine plain = plain_engine();
  for (int sampling = 0; sampling < 4; ++sampling) {
    GenerationRequest r = sampling != 2 ? request((*prompts_)[1], 40) : request((*prompts_)[3], 24);
    if (sampling == 1) make_sampled(r, seeded.rng(), true);
    if (sampling == 3) make_argmax_only(r);
    const Run want = run(plain, r);
    for (const Mode& m : kModes) {
      for (bool adaptive : {false, true}) {
        const std::string what = std::string(m.name) + (sampling == 1 ? " sampled" : sampling == 3 ? " argmax-only" : " greedy") +
                                 " prompt of " + std::to_string(r.prompt.size()) + (adaptive ? " adaptive" : "");
        const Run got = run(spec_engine(draft.get(), m, adaptive), r);
        expect_same(got, want, false, what);
        expect_consistent(got.result.spec, what);
        EXPECT_EQ(got.result.spec.steps + got.result.spec.accepted + got.result.ar_tokens,
                  got.result.completion_tokens) << what;
        if (want.result.completion_tokens >= 3) {
          EXPECT_GE(got.result.spec.steps, 1) << what;
        }
        if (!adaptive) {
          // The first token (from the prefill's logits), and the last when no draft fits the budget.
          EXPECT_LE(got.result.ar_tokens, 2) << what;
        }
      }
    }
  }
}

// A stop string found mid-block, end-of-generation tokens allowed, response_format json_object.
TEST_F(SpeculativeGeneration, stop_strings_eog_and_json_object_equal_plain_decoding) {
  test::SeededRng seeded;
  auto draft = load_draft(DraftResidency::kPersistent);
  ASSERT_NE(draft, nullptr);
  const Engine plain = plain_engine();
  const std::vector<int32_t> prompt = (*prompts_)[1];
  // A stop string taken from the middle of the plain output (two ASCII characters).
  const Run free_run = run(plain, request(prompt, 40));
  const std::string& text = free_run.result.text;
  std::string stop;
  for (size_t i = text.size() / 3; i + 2 <= text.size() && stop.empty(); ++i)
    if (static_cast<unsigned char>(text[i]) < 0x80 && static_cast<unsigned char>(text[i + 1]) < 0x80 &&
        text.find(text.substr(i, 2)) >= 3)
      stop = text.substr(i, 2);
  ASSERT_FALSE(stop.empty()) << "no ASCII pair in the generated text to stop at: '" << text << "'";
  for (int sampling = 0; sampling < 2; ++sampling) {
    GenerationRequest r = request(prompt, 40);
    r.stop = {stop, "\x01never"};
    if (sampling) make_sampled(r, seeded.rng());
    const Run want = run(plain, r);
    if (sampling == 0) {
      EXPECT_EQ(want.result.finish_reason, "stop");
      EXPECT_LT(want.result.completion_tokens, 40);
    }
    for (const Mode& m : kModes) expect_same(run(spec_engine(draft.get(), m), r), want, false, std::string(m.name) + " stop string");
  }
  // End of generation allowed (sampled, so the tiny model may well emit one).
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r = request(prompt, 40, /*allow_eog=*/true);
    make_sampled(r, seeded.rng());
    r.sampling.temperature = 1.5f;
    r.sampling.top_p = 1.0f;
    const Run want = run(plain, r);
    for (const Mode& m : kModes) expect_same(run(spec_engine(draft.get(), m), r), want, false, std::string(m.name) + " eog allowed");
  }
  // json_object: every token constrained to keep the output a JSON object prefix.
  for (int sampling = 0; sampling < 2; ++sampling) {
    // End of generation allowed: once the object closes it is the only token left.
    GenerationRequest r = request((*prompts_)[2], 17, /*allow_eog=*/true);
    r.json_object = true;
    if (sampling) make_sampled(r, seeded.rng());
    const Run want = run(plain, r);
    const size_t brace = want.result.text.find_first_not_of(" \t\r\n");
    ASSERT_NE(brace, std::string::npos) << "'" << want.result.text << "'";
    EXPECT_EQ(want.result.text[brace], '{') << want.result.text;
    for (const Mode& m : kModes) expect_same(run(spec_engine(draft.get(), m), r), want, true, std::string(m.name) + " json_object");
  }
}

// With a prefix cache: the second identical request restores the whole prompt (target state and the draft's
// feature window) and gives the same output and the same drafting (SpecStats) as the first; the snapshot
// carries the prompt's feature rows, equal to a capture of the same prefill.
TEST_F(SpeculativeGeneration, a_cached_prompt_restores_the_feature_window_and_continues_identically) {
  auto draft = load_draft(DraftResidency::kPersistent);
  ASSERT_NE(draft, nullptr);
  const std::vector<int32_t> prompt = (*prompts_)[1];
  const GenerationRequest r = request(prompt, 17);
  const Run want = run(plain_engine(), r);
  for (const Mode& m : kModes) {
    SCOPED_TRACE(m.name);
    PrefixCache cache(64u << 20);
    Engine e = spec_engine(draft.get(), m);
    e.prefix_cache = &cache;
    const Run cold = run(e, r);
    const Run warm = run(e, r);
    EXPECT_EQ(cold.result.cached_tokens, 0);
    EXPECT_EQ(warm.result.cached_tokens, static_cast<int64_t>(prompt.size()));
    expect_same(cold, want, false, "cold");
    expect_same(warm, want, false, "warm");
    EXPECT_EQ(warm.result.spec.steps, cold.result.spec.steps);
    EXPECT_EQ(warm.result.spec.drafted, cold.result.spec.drafted);
    EXPECT_EQ(warm.result.spec.accepted, cold.result.spec.accepted);
    EXPECT_EQ(warm.result.spec.accepted_at, cold.result.spec.accepted_at);
    // The snapshot of the prompt holds its feature rows.
    auto snap = cache.lookup(prompt);
    ASSERT_NE(snap, nullptr);
    ASSERT_EQ(snap->n_past, static_cast<int64_t>(prompt.size()));
    const SnapshotTensor* meta = snap->find("dflash_feature_meta");
    const SnapshotTensor* data = snap->find("dflash_feature_data");
    ASSERT_NE(meta, nullptr);
    ASSERT_NE(data, nullptr);
    const int64_t n = static_cast<int64_t>(prompt.size());
    const std::vector<int64_t> layers = {1, 5};
    EXPECT_EQ(meta->data, (std::vector<float>{0, static_cast<float>(n), 128, static_cast<float>(feature_tag(layers))}));
    EXPECT_EQ(data->shape, (std::vector<int64_t>{n, 128}));
    SequenceState st(target_->spec(), runner_->backend());
    Step step;
    step.tokens = prompt;
    step.capture_layers = layers;
    auto out = runner_->forward(st, step);
    ASSERT_TRUE(out.ok());
    FeatureRing ring(128, 4096, feature_tag(layers));
    ASSERT_TRUE(append_features(ring, 0, *out, n).ok());
    EXPECT_EQ(data->data, *ring.rows_from(0));
  }
  // A snapshot left by a request without the draft: restored all the same (the draft's context then
  // starts at the restored position), same output.
  PrefixCache cache(64u << 20);
  Engine p = plain_engine();
  p.prefix_cache = &cache;
  const Run first = run(p, r);
  EXPECT_EQ(cache.lookup(prompt)->find("dflash_feature_meta"), nullptr);
  for (const Mode& m : kModes) {
    Engine e = spec_engine(draft.get(), m);
    e.prefix_cache = &cache;
    const Run got = run(e, r);
    EXPECT_EQ(got.result.cached_tokens, static_cast<int64_t>(prompt.size())) << m.name;
    expect_same(got, want, false, std::string(m.name) + " from a snapshot without features");
  }
  // And the other way: a snapshot with features serves a request without the draft.
  PrefixCache cache2(64u << 20);
  Engine s = spec_engine(draft.get(), kModes[0]);
  s.prefix_cache = &cache2;
  run(s, r);
  Engine p2 = plain_engine();
  p2.prefix_cache = &cache2;
  const Run plain_warm = run(p2, r);
  EXPECT_EQ(plain_warm.result.cached_tokens, static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(plain_warm.result.text, want.result.text);
}

// A request that runs to the end of the target's context (prompt + max_tokens = max_context). The decoder
// limits the drafted depth to the positions left, but a DDTree step puts up to budget + 1 nodes into KV
// slots n_past .. n_past + budget: near the end those slots run past the context even though every node's
// position is inside it, and the target refuses the step. Expected: the same output as plain decoding.
// Target: a random 8-layer qwen3 (hidden 64, vocabulary 512, so the tiny draft fits) of context 96.
TEST_F(SpeculativeGeneration, a_request_that_fills_the_context_equals_plain_decoding) {
  test::SeededRng seeded;
  const std::string dir = test::scratch_dir() + "/ctx96";
  auto cfg = test::tiny_qwen3_config(512, false);
  cfg["num_hidden_layers"] = 8;
  cfg["max_position_embeddings"] = 96;
  ASSERT_TRUE(test::write_random_hf_model(dir, cfg, seeded.seed, SafetensorsDType::kF32).ok());
  auto w = Weights::load(dir, kThreads);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_EQ(w->spec().max_context, 96);
  Runner runner(*w, kThreads);
  auto draft = ResidentDraft::load(draft_path(), *w, runner.backend(), *w, nullptr, DraftResidency::kPersistent, kThreads);
  ASSERT_TRUE(draft.ok()) << draft.status().to_string();
  Engine plain = plain_engine();
  plain.runner = &runner;
  plain.n_ctx = 96;
  GenerationRequest r = request(random_prompt(seeded.rng, 80), 16);
  const Run want = run(plain, r);
  ASSERT_EQ(want.result.completion_tokens, 16);
  for (const Mode& m : kModes) {
    Engine e = spec_engine(draft->get(), m);
    e.runner = &runner;
    e.n_ctx = 96;
    auto got = generate(e, r, nullptr);
    EXPECT_TRUE(got.ok()) << m.name << ": " << got.status().to_string();
    if (!got.ok()) continue;
    EXPECT_EQ(got->text, want.result.text) << m.name;
    EXPECT_EQ(got->completion_tokens, 16) << m.name;
  }
}

// Residency: request-scoped parks the draft whenever no request holds it and unparks it per request;
// persistent (and auto, for DFlash decoding) keeps it loaded.
TEST_F(SpeculativeGeneration, request_scoped_drafts_are_parked_between_requests) {
  const GenerationRequest r = request((*prompts_)[2], 9);
  const Run want = run(plain_engine(), r);
  {
    auto draft = load_draft(DraftResidency::kRequestScoped);
    ASSERT_NE(draft, nullptr);
    EXPECT_TRUE(draft->stats().parked);
    EXPECT_EQ(draft->stats().unparks, 0);
    EXPECT_EQ(draft->stats().resident_bytes, 0u);
    const Engine e = spec_engine(draft.get(), kModes[2]);
    for (int k = 1; k <= 3; ++k) {
      expect_same(run(e, r), want, true, "request " + std::to_string(k));
      const auto st = draft->stats();
      EXPECT_TRUE(st.parked) << k;
      EXPECT_EQ(st.unparks, k);
      EXPECT_EQ(st.parks, k + 1);  // parked at load, then after each request
      EXPECT_EQ(st.resident_bytes, 0u);
    }
    // While a generation runs, it holds the draft; once it is done the draft is parked again (before the
    // Generation itself goes away).
    Generation g(e, r, nullptr);
    SequenceState state(target_->spec(), runner_->backend());
    ASSERT_TRUE(g.start(state).ok());
    EXPECT_FALSE(draft->stats().parked);
    EXPECT_GT(draft->stats().resident_bytes, 0u);
    for (;;) {
      auto done = g.step();
      ASSERT_TRUE(done.ok()) << done.status().to_string();
      if (*done) break;
    }
    EXPECT_TRUE(draft->stats().parked);
    EXPECT_EQ(draft->stats().unparks, 4);
    // A generation dropped before it finished releases the draft too.
    {
      Generation h(e, r, nullptr);
      SequenceState s2(target_->spec(), runner_->backend());
      ASSERT_TRUE(h.start(s2).ok());
      ASSERT_TRUE(h.step().ok());
      EXPECT_FALSE(draft->stats().parked);
    }
    EXPECT_TRUE(draft->stats().parked);
  }
  for (DraftResidency policy : {DraftResidency::kPersistent, DraftResidency::kAuto}) {
    auto draft = load_draft(policy);
    ASSERT_NE(draft, nullptr);
    const Engine e = spec_engine(draft.get(), kModes[0]);
    for (int k = 0; k < 2; ++k) expect_same(run(e, r), want, true, draft_residency_name(policy));
    const auto st = draft->stats();
    EXPECT_FALSE(st.parked) << draft_residency_name(policy);
    EXPECT_EQ(st.unparks, 0);
    EXPECT_EQ(st.parks, 0);
    EXPECT_GT(st.resident_bytes, 0u);
  }
}

}  // namespace
}  // namespace dflash::server

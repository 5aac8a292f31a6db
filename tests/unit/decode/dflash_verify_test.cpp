// DFlash verify and speculative steps on the tiny fixtures (algorithms.md A.4-A.5, B.5-B.7):
//  - verify_tree with crafted chains and trees against plain decoding on a second sequence: the emitted
//    tokens, the committed state (the logits of the steps that follow), the committed feature rows, the
//    logits `choose` sees, SpecStats, stopping mid-path, and sampling (one draw per emitted token, in order),
//    on the hybrid and the all-attention target, including tree paths whose KV slots lie in another 64-token
//    KV chunk than their positions;
//  - speculative_step end to end with the tiny random draft: greedy output equals plain greedy decoding, and
//    sampled output follows the target's distribution (a chi-square test with a stated false-alarm rate).
// The CPU kernels are batch-invariant by design, so everything compared here is compared bit for bit.
#include "decode/dflash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "decode/ddtree.h"
#include "decode/runner.h"
#include "decode/sampler.h"
#include "formats/safetensors.h"
#include "model/forward.h"
#include "model/weights.h"
#include "state/feature_ring.h"
#include "state/sequence_state.h"
#include "support/random_hf_model.h"
#include "support/fixture_models.h"
#include "support/test_paths.h"
#include "unit/decode/decode_test_util.h"
#include "unit/ops/ops_test_util.h"

namespace dflash {
namespace {

using test::argmax;
using test::bit_equal;
using test::max_abs_diff;

constexpr int kThreads = 2;

const Weights& model(const std::string& name) { return test::fixture_model(name); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ---------------------------------------------------------------------------------------------------------
// verify_tree with crafted trees against plain greedy decoding.

struct TargetCase {
  const char* name;
  std::vector<int64_t> layers;
};

void PrintTo(const TargetCase& c, std::ostream* os) { *os << c.name; }

std::string case_name(const ::testing::TestParamInfo<TargetCase>& info) {
  std::string s = info.param.name;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

class VerifyTree : public ::testing::TestWithParam<TargetCase> {
 protected:
  static constexpr int64_t kTruth = 24;  // greedy tokens of the reference run

  void SetUp() override {
    w_ = &model(GetParam().name);
    runner_ = std::make_unique<Runner>(*w_, kThreads);
    reseed(test::fresh_seed());
  }
  void reseed(uint32_t seed) {
    seed_ = seed;
    rng_.seed(seed);
  }
  std::string seed_note() const {
    return "seed " + std::to_string(seed_) + " (replay: DFLASH_TEST_SEED=" + std::to_string(seed_) + ")";
  }
  int64_t V() const { return w_->spec().vocab; }
  int64_t width() const { return static_cast<int64_t>(GetParam().layers.size()) * w_->spec().hidden; }
  std::span<const int64_t> layers() const { return GetParam().layers; }

  // A sequence with its feature ring.
  struct Seq {
    std::unique_ptr<SequenceState> state;
    std::unique_ptr<FeatureRing> ring;
  };

  // A fresh sequence that ran the prompt in one step with features captured.
  Seq prefilled(std::vector<float>* last_logits = nullptr) {
    Seq q{std::make_unique<SequenceState>(w_->spec(), runner_->backend()),
          std::make_unique<FeatureRing>(width(), 4096, feature_tag(layers()))};
    Step step;
    step.tokens = prompt_;
    step.capture_layers = layers();
    auto out = runner_->forward(*q.state, step);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    if (!out.ok()) return q;
    EXPECT_TRUE(append_features(*q.ring, 0, *out, static_cast<int64_t>(prompt_.size())).ok());
    if (last_logits) *last_logits = out->logits;
    return q;
  }

  // The reference: a random prompt of `len` tokens, then plain decoding one token at a time with features
  // captured, greedy or with `sampler` (one draw per token). truth_[i] is the token at position s + i
  // (truth_[0] from the prompt's logits), logits_[i] the logits after it (what truth_[i + 1] is chosen
  // from), ref_ the features of every position.
  void make_reference(int64_t len, Sampler* sampler = nullptr) {
    prompt_.resize(static_cast<size_t>(len));
    for (auto& t : prompt_) t = static_cast<int32_t>(rng_() % V());
    s_ = len;
    std::vector<float> first;
    ref_ = prefilled(&first);
    std::vector<int32_t> history = prompt_;
    auto pick = [&](std::span<const float> l) -> int32_t {
      if (sampler == nullptr) return argmax(l);
      auto t = sampler->sample(l, history);
      EXPECT_TRUE(t.ok()) << t.status().to_string();
      return t.ok() ? *t : 0;
    };
    truth_ = {pick(first)};
    history.push_back(truth_.back());
    logits_.clear();
    for (int64_t i = 0; i < kTruth; ++i) {
      Step step;
      step.tokens = std::span<const int32_t>(&truth_.back(), 1);
      step.capture_layers = layers();
      const int64_t pos = ref_.state->n_past();
      auto out = runner_->forward(*ref_.state, step);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      ASSERT_TRUE(append_features(*ref_.ring, pos, *out, 1).ok());
      logits_.push_back(out->logits);
      truth_.push_back(pick(out->logits));
      history.push_back(truth_.back());
    }
  }

  // A token that is none of `avoid`.
  int32_t other_than(std::initializer_list<int32_t> avoid) {
    for (;;) {
      const auto t = static_cast<int32_t>(rng_() % V());
      if (std::find(avoid.begin(), avoid.end(), t) == avoid.end()) return t;
    }
  }

  // Greedy choose (the backend's argmax, checked against the row's) that records the logits it was shown
  // and stops at call `stop_at` (1-based; 0: never).
  ChooseFn greedy(std::vector<std::vector<float>>* seen, int stop_at = 0) {
    return [seen, stop_at, calls = 0](NodeLogits& logits) mutable -> Result<Choice> {
      ++calls;
      DF_ASSIGN_OR_RETURN(std::span<const float> row, logits.row());
      seen->emplace_back(row.begin(), row.end());
      EXPECT_EQ(logits.argmax(), argmax(row)) << "call " << calls;
      return Choice{logits.argmax(), stop_at > 0 && calls == stop_at};
    };
  }

  // After verify_tree committed m tokens (truth_[0..m)) and emitted `tokens`: everything equals the
  // reference. `seen` are the logits choose was shown (the i-th call: those after truth_[i]).
  void expect_exact(Seq& q, const SpecStepResult& res, int64_t m, const std::vector<std::vector<float>>& seen,
                    const std::string& what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(q.state->n_past(), s_ + m);
    // Emitted: truth_[1 ..], one per choose call.
    ASSERT_EQ(res.tokens.size(), seen.size());
    for (size_t i = 0; i < res.tokens.size(); ++i) {
      EXPECT_EQ(res.tokens[i], truth_[i + 1]) << "emitted token " << i;
      EXPECT_TRUE(bit_equal(seen[i], logits_[i])) << "the logits choose saw at call " << i + 1 << " differ from plain "
                                                  << "decoding's by up to " << max_abs_diff(seen[i], logits_[i]);
    }
    // The committed feature rows: the reference's rows of positions s .. s + m - 1.
    EXPECT_EQ(q.ring->end(), s_ + m);
    auto got = q.ring->rows_from(s_);
    auto want = ref_.ring->rows_from(s_);
    ASSERT_TRUE(got.ok() && want.ok());
    ASSERT_EQ(got->size(), static_cast<size_t>(m * width()));
    EXPECT_TRUE(bit_equal(*got, std::span<const float>(*want).first(got->size())))
        << "committed features differ by up to " << max_abs_diff(*got, std::span<const float>(*want).first(got->size()));
    // Plain decoding goes on exactly: feed truth_[m], truth_[m + 1], ...
    for (int64_t j = m; j < std::min<int64_t>(m + 4, kTruth); ++j) {
      Step step;
      step.tokens = std::span<const int32_t>(&truth_[static_cast<size_t>(j)], 1);
      auto out = runner_->forward(*q.state, step);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      EXPECT_TRUE(bit_equal(out->logits, logits_[static_cast<size_t>(j)]))
          << "logits after position " << s_ + j << " differ by up to " << max_abs_diff(out->logits, logits_[j]);
    }
  }

  static void expect_stats(const SpecStats& st, int64_t drafted, int64_t accepted, size_t depth) {
    EXPECT_EQ(st.steps, 1);
    EXPECT_EQ(st.drafted, drafted);
    EXPECT_EQ(st.accepted, accepted);
    ASSERT_EQ(st.accepted_at.size(), depth);
    for (size_t d = 0; d < depth; ++d) EXPECT_EQ(st.accepted_at[d], static_cast<int64_t>(d) < accepted ? 1 : 0) << d;
    EXPECT_GE(st.verify_ms, 0.0);
    EXPECT_GE(st.commit_ms, 0.0);
  }

  const Weights* w_ = nullptr;
  std::unique_ptr<Runner> runner_;
  uint32_t seed_ = 0;
  std::mt19937 rng_;
  std::vector<int32_t> prompt_;
  int64_t s_ = 0;
  Seq ref_;
  std::vector<int32_t> truth_;
  std::vector<std::vector<float>> logits_;
};

// (i) A chain whose first k drafts are right and draft k + 1 wrong: k + 1 tokens (the last the target's
// correction), the state k + 1 further (root + k drafts). k = 0 (nothing accepted) through 6.
TEST_P(VerifyTree, chain_with_k_right_drafts_emits_k_plus_one_exact_tokens) {
  SCOPED_TRACE(seed_note());
  make_reference(70);
  if (HasFatalFailure()) return;
  for (int64_t k : {0, 1, 3, 6}) {
    std::vector<int32_t> drafts;
    for (int64_t i = 1; i <= k; ++i) drafts.push_back(truth_[i]);
    drafts.push_back(other_than({truth_[k + 1]}));
    while (drafts.size() < 7) drafts.push_back(static_cast<int32_t>(rng_() % V()));
    Seq q = prefilled();
    std::vector<std::vector<float>> seen;
    SpecStats st;
    auto res = verify_tree(*runner_, *q.state, *q.ring, layers(), chain_tree(truth_[0], drafts), greedy(&seen), &st);
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    EXPECT_FALSE(res->stopped);
    EXPECT_EQ(res->tokens.size(), static_cast<size_t>(k + 1));
    expect_exact(q, *res, k + 1, seen, "k = " + std::to_string(k));
    expect_stats(st, 7, k, 7);
  }
}

// (iii) Every draft right: the bonus after the last one; B tokens from one step.
TEST_P(VerifyTree, full_accept_chain_emits_every_draft_and_the_bonus) {
  SCOPED_TRACE(seed_note());
  make_reference(70);
  if (HasFatalFailure()) return;
  const std::vector<int32_t> drafts(truth_.begin() + 1, truth_.begin() + 8);
  Seq q = prefilled();
  std::vector<std::vector<float>> seen;
  SpecStats st;
  auto res = verify_tree(*runner_, *q.state, *q.ring, layers(), chain_tree(truth_[0], drafts), greedy(&seen), &st);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_FALSE(res->stopped);
  EXPECT_EQ(res->tokens.size(), 8u);
  expect_exact(q, *res, 8, seen, "full accept");
  expect_stats(st, 7, 7, 7);
  // A root-only tree: the plain decode step of the root.
  Seq r = prefilled();
  seen.clear();
  SpecStats st1;
  auto one = verify_tree(*runner_, *r.state, *r.ring, layers(), DraftTree::with_root(truth_[0]), greedy(&seen), &st1);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  expect_exact(r, *one, 1, seen, "root only");
  EXPECT_EQ(st1.drafted, 0);
  EXPECT_EQ(st1.accepted, 0);
}

// (ii) A DDTree whose right path runs through later children at every depth, with wrong siblings and
// right tokens placed under wrong branches (which must not be taken). Node slots stay in the prompt's last
// KV chunk (70 + 16 < 128).
//
//   0 ─┬─ 1 (x1) ── 3 (t2)
//      ├─ 2 (y1) ── 5 (z)
//      └─ 4 (t1) ─┬─ 6 (w2) ── 8 (t3)
//                 └─ 7 (t2) ─┬─ 9 (w3a) ── 15 (t4)
//                            ├─ 10 (w3b)
//                            └─ 11 (t3) ─┬─ 12 (w4a) ── 14 (t5)
//                                        └─ 13 (w4b)
// The walk: 0 -> 4 -> 7 -> 11, then t4 is no child of 11: emitted t1 t2 t3 t4, 4 positions committed.
DraftTree crafted_tree(const std::vector<int32_t>& t, const std::function<int32_t(std::initializer_list<int32_t>)>& other,
                       std::vector<int32_t>* path) {
  DraftTree tree = DraftTree::with_root(t[0]);
  auto add = [&](int32_t parent, int32_t tok) {
    auto r = tree.add_child(parent, tok);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? *r : -1;
  };
  const int32_t x1 = other({t[1]}), y1 = other({t[1], x1});
  const int32_t n1 = add(0, x1), n2 = add(0, y1);
  add(n1, t[2]);
  const int32_t n4 = add(0, t[1]);
  add(n2, other({}));
  const int32_t n6 = add(n4, other({t[2]}));
  const int32_t n7 = add(n4, t[2]);
  add(n6, t[3]);
  const int32_t w3a = other({t[3]});
  const int32_t n9 = add(n7, w3a);
  add(n7, other({t[3], w3a}));
  const int32_t n11 = add(n7, t[3]);
  const int32_t w4a = other({t[4]});
  const int32_t n12 = add(n11, w4a);
  add(n11, other({t[4], w4a}));
  add(n12, t[5]);
  add(n9, t[4]);
  EXPECT_EQ(tree.size(), 16);
  *path = {0, n4, n7, n11};
  return tree;
}

TEST_P(VerifyTree, ddtree_path_through_later_children_is_exact) {
  SCOPED_TRACE(seed_note());
  make_reference(70);
  if (HasFatalFailure()) return;
  std::vector<int32_t> path;
  const DraftTree tree = crafted_tree(truth_, [this](std::initializer_list<int32_t> a) { return other_than(a); }, &path);
  ASSERT_EQ(path, (std::vector<int32_t>{0, 4, 7, 11}));
  Seq q = prefilled();
  std::vector<std::vector<float>> seen;
  SpecStats st;
  auto res = verify_tree(*runner_, *q.state, *q.ring, layers(), tree, greedy(&seen), &st);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_FALSE(res->stopped);
  EXPECT_EQ(res->tokens.size(), 4u);
  expect_exact(q, *res, 4, seen, "crafted tree");
  expect_stats(st, 15, 3, 5);
}

// Seeds whose prompts show the chunk effect below on these fixtures (x86-64 with AVX2, fixtures as committed).
std::vector<uint32_t> known_chunk_seeds(const std::string& model) {
  if (model == "tiny-qwen3") return {17, 19};
  return {3, 4};
}

// The same kind of tree where the right path's nodes sit in the next KV chunk while their positions do
// not: s = 120, twelve wrong children of the root take slots 121..132, the right child of the root is node
// 13 (slot 133), its right child node 14 (slot 134). Positions 121, 122 are in chunk 1 (64..127) in plain
// decoding; the tree step sees those keys at slots 133, 134, in chunk 2. Plain decoding and the verify must
// still agree bit for bit (the output of greedy DDTree must be the output of plain greedy decoding).
//
// FAILS today (a bug in cpu::attention's tree mask, src/ops/cpu/attention.cpp): the flash-style walk groups
// keys by their physical KV chunk, so a path node's own key (at slot 133) is folded in as a chunk of its
// own, after the running max of chunk 1 was fixed, instead of inside chunk 1 as at position 121 in plain
// decoding. When that key scores highest for some head, the rescaling order differs: the logits differ in
// the last bits (seen: up to 7.6e-6), and so do the committed K/V of later layers, the features, and every
// logit after. A greedy near-tie can then flip a token: DDTree output is not plain decoding's.
TEST_P(VerifyTree, ddtree_path_in_another_kv_chunk_than_its_positions_is_exact) {
  // The difference shows only when, for some head, a path node's own key (or its in-tree ancestor's)
  // scores above every key of the chunk its position falls in: the seeds listed first do that on these
  // fixtures (found by running fresh ones), then a few fresh prompts.
  std::vector<uint32_t> seeds = known_chunk_seeds(GetParam().name);
  for (int i = 0; i < 3; ++i) seeds.push_back(test::fresh_seed());
  for (uint32_t seed : seeds) {
    reseed(seed);
    SCOPED_TRACE(seed_note());
    make_reference(120);
    if (HasFatalFailure()) return;
    DraftTree tree = DraftTree::with_root(truth_[0]);
    std::vector<int32_t> wrong;
    for (int i = 0; i < 12; ++i) {
      int32_t x;
      do x = other_than({truth_[1]});
      while (std::find(wrong.begin(), wrong.end(), x) != wrong.end());
      wrong.push_back(x);
      ASSERT_TRUE(tree.add_child(0, x).ok());
    }
    const int32_t a = *tree.add_child(0, truth_[1]);
    const int32_t b = *tree.add_child(a, truth_[2]);
    ASSERT_TRUE(tree.add_child(b, other_than({truth_[3]})).ok());
    ASSERT_EQ(a, 13);
    Seq q = prefilled();
    std::vector<std::vector<float>> seen;
    SpecStats st;
    auto res = verify_tree(*runner_, *q.state, *q.ring, layers(), tree, greedy(&seen), &st);
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    EXPECT_EQ(res->tokens.size(), 3u);
    expect_exact(q, *res, 3, seen, "path in the next KV chunk");
    expect_stats(st, 15, 2, 3);
    if (HasFatalFailure()) return;
  }
}

// (iv) choose saying stop ends the walk at that token: nothing after it is asked for or committed past it.
TEST_P(VerifyTree, stop_from_choose_ends_the_walk_there) {
  SCOPED_TRACE(seed_note());
  make_reference(70);
  if (HasFatalFailure()) return;
  const std::vector<int32_t> drafts(truth_.begin() + 1, truth_.begin() + 8);
  for (int stop_at : {1, 3, 7, 8}) {
    Seq q = prefilled();
    std::vector<std::vector<float>> seen;
    SpecStats st;
    auto res = verify_tree(*runner_, *q.state, *q.ring, layers(), chain_tree(truth_[0], drafts), greedy(&seen, stop_at), &st);
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    // Stopping at the 8th token is the end of a full accept: stopped all the same.
    EXPECT_TRUE(res->stopped) << stop_at;
    EXPECT_EQ(res->tokens.size(), static_cast<size_t>(stop_at));
    EXPECT_EQ(seen.size(), static_cast<size_t>(stop_at));
    // Committed: the root and the drafts the walk passed (stop_at - 1 of them).
    expect_exact(q, *res, stop_at, seen, "chain, stop at call " + std::to_string(stop_at));
    EXPECT_EQ(st.accepted, stop_at - 1);
  }
  // In the crafted tree, stopping at the second token (t2, chosen at node 4).
  std::vector<int32_t> path;
  const DraftTree tree = crafted_tree(truth_, [this](std::initializer_list<int32_t> a) { return other_than(a); }, &path);
  Seq q = prefilled();
  std::vector<std::vector<float>> seen;
  SpecStats st;
  auto res = verify_tree(*runner_, *q.state, *q.ring, layers(), tree, greedy(&seen, 2), &st);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_TRUE(res->stopped);
  EXPECT_EQ(res->tokens.size(), 2u);
  expect_exact(q, *res, 2, seen, "tree, stop at call 2");
  expect_stats(st, 15, 1, 5);
}

// Sampling (A.5, B.5): the walk asks the caller's sampler once per emitted token, in order, from logits equal
// to plain decoding's, so the tokens and the sampler's random stream are those of plain sampling: a chain
// and the crafted tree built on a sampled continuation emit it, and sampling goes on in step afterwards.
TEST_P(VerifyTree, sampled_walk_draws_once_per_emitted_token_like_plain_sampling) {
  SCOPED_TRACE(seed_note());
  SamplingParams params;
  params.temperature = 0.8f;
  params.top_p = 0.9f;
  params.seed = rng_();
  Sampler ref_sampler(params);
  make_reference(70, &ref_sampler);
  if (HasFatalFailure()) return;
  for (int shape = 0; shape < 2; ++shape) {
    SCOPED_TRACE(shape == 0 ? "chain" : "crafted tree");
    Sampler sampler(params);
    std::vector<int32_t> history = prompt_;
    std::vector<float> first;
    Seq q = prefilled(&first);
    auto t0 = sampler.sample(first, history);
    ASSERT_TRUE(t0.ok());
    ASSERT_EQ(*t0, truth_[0]);
    history.push_back(*t0);
    DraftTree tree;
    int64_t m = 0;  // positions committed
    if (shape == 0) {
      std::vector<int32_t> drafts(truth_.begin() + 1, truth_.begin() + 6);
      drafts.push_back(other_than({truth_[6]}));
      drafts.push_back(truth_[7]);
      tree = chain_tree(truth_[0], drafts);
      m = 6;
    } else {
      std::vector<int32_t> path;
      tree = crafted_tree(truth_, [this](std::initializer_list<int32_t> a) { return other_than(a); }, &path);
      m = 4;
    }
    std::vector<std::vector<float>> seen;
    const ChooseFn choose = [&](NodeLogits& logits) -> Result<Choice> {
      DF_ASSIGN_OR_RETURN(std::span<const float> row, logits.row());
      seen.emplace_back(row.begin(), row.end());
      DF_ASSIGN_OR_RETURN(int32_t t, sampler.sample(row, history));
      history.push_back(t);
      return Choice{t, false};
    };
    auto res = verify_tree(*runner_, *q.state, *q.ring, layers(), tree, choose, nullptr);
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    EXPECT_EQ(res->tokens.size(), static_cast<size_t>(m));
    expect_exact(q, *res, m, seen, "sampled");
    // The sampler is where plain sampling's is: the next draws agree (the state went 4 tokens further in
    // expect_exact, fed truth_[m .. m + 3]; replay the draws from the reference logits).
    for (int64_t j = m; j < m + 4; ++j) {
      auto t = sampler.sample(logits_[static_cast<size_t>(j)], history);
      ASSERT_TRUE(t.ok());
      EXPECT_EQ(*t, truth_[static_cast<size_t>(j + 1)]) << "draw for position " << s_ + j + 1;
      history.push_back(*t);
    }
  }
}

TEST_P(VerifyTree, choose_errors_and_a_ring_off_the_sequence_are_returned) {
  SCOPED_TRACE(seed_note());
  make_reference(20);
  if (HasFatalFailure()) return;
  const std::vector<int32_t> drafts(truth_.begin() + 1, truth_.begin() + 8);
  Seq q = prefilled();
  int calls = 0;
  const ChooseFn failing = [&calls](NodeLogits& logits) -> Result<Choice> {
    if (++calls == 3) return invalid_argument("the sampler refused call {}", calls);
    return Choice{logits.argmax(), false};
  };
  auto res = verify_tree(*runner_, *q.state, *q.ring, layers(), chain_tree(truth_[0], drafts), failing, nullptr);
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(res.status().message(), "the sampler refused call 3")) << res.status().message();
  EXPECT_EQ(calls, 3);
  // A ring that does not end where the sequence does.
  Seq r = prefilled();
  r.ring->clear(5);
  std::vector<std::vector<float>> seen;
  auto off = verify_tree(*runner_, *r.state, *r.ring, layers(), chain_tree(truth_[0], drafts), greedy(&seen), nullptr);
  ASSERT_FALSE(off.ok());
  EXPECT_EQ(off.status().code(), ErrorCode::kInternal);
  EXPECT_EQ(r.state->n_past(), s_);
  // An empty tree.
  auto empty = verify_tree(*runner_, *r.state, *r.ring, layers(), DraftTree{}, failing, nullptr);
  EXPECT_FALSE(empty.ok());
}

INSTANTIATE_TEST_SUITE_P(Targets, VerifyTree,
                         ::testing::Values(TargetCase{"tiny-qwen35", {1, 5}}, TargetCase{"tiny-qwen3", {1, 2}}),
                         case_name);

// ---------------------------------------------------------------------------------------------------------
// speculative_step end to end with the tiny random draft: greedy output equals plain greedy decoding.

struct SpecCase {
  const char* name;
  bool ddtree;
  int64_t budget;
  int64_t window;         // feature ring capacity
  int64_t nodes_per_step; // drafted tokens each full step puts to the target
};

void PrintTo(const SpecCase& c, std::ostream* os) { *os << c.name; }

class SpeculativeStep : public ::testing::TestWithParam<SpecCase> {};

TEST_P(SpeculativeStep, greedy_output_equals_plain_greedy_decoding) {
  const SpecCase& c = GetParam();
  const Weights& target = model("tiny-qwen35");
  Runner runner(target, kThreads);
  auto d = DFlashDraft::create(model("tiny-qwen35-dflash"), target, runner.backend());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  DFlashDraft& draft = **d;
  test::SeededRng seeded;
  std::mt19937& rng = seeded.rng;
  std::vector<int32_t> prompt(50);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % 512);
  constexpr int64_t kWant = 40, kRef = kWant + 8;

  // Plain greedy decoding.
  std::vector<int32_t> plain;
  {
    SequenceState st(target.spec(), runner.backend());
    auto l = runner.prefill(st, prompt);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    plain.push_back(argmax(*l));
    while (static_cast<int64_t>(plain.size()) < kRef) {
      Step step;
      step.tokens = std::span<const int32_t>(&plain.back(), 1);
      auto out = runner.forward(st, step);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      plain.push_back(argmax(out->logits));
    }
  }

  // Speculative: prefill with features, the root from the prompt's logits, then steps.
  SpecOptions opts;
  opts.ddtree = c.ddtree;
  opts.ddtree_budget = c.budget;
  opts.feature_window = c.window;
  SequenceState st(target.spec(), runner.backend());
  FeatureRing ring(draft.feature_width(), c.window, feature_tag(draft.capture_layers()));
  DFlashDraft::Context ctx(draft);
  Step pre;
  pre.tokens = prompt;
  pre.capture_layers = draft.capture_layers();
  auto out = runner.forward(st, pre);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_TRUE(append_features(ring, 0, *out, 50).ok());
  std::vector<int32_t> spec = {argmax(out->logits)};
  SpecStats stats;
  int64_t steps = 0, accepted = 0;
  const ChooseFn choose = [](NodeLogits& logits) -> Result<Choice> { return Choice{logits.argmax(), false}; };
  while (static_cast<int64_t>(spec.size()) < kWant) {
    auto r = speculative_step(runner, st, ring, draft, ctx, spec.back(), 7, opts, choose, &stats);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_FALSE(r->stopped);
    ASSERT_GE(r->tokens.size(), 1u);
    ++steps;
    accepted += static_cast<int64_t>(r->tokens.size()) - 1;
    spec.insert(spec.end(), r->tokens.begin(), r->tokens.end());
    // The state holds everything emitted but the last token (the next root); so does the ring.
    EXPECT_EQ(st.n_past(), 50 + static_cast<int64_t>(spec.size()) - 1);
    EXPECT_EQ(ring.end(), st.n_past());
    EXPECT_LE(ring.end() - ring.first(), c.window);
  }
  ASSERT_LE(static_cast<int64_t>(spec.size()), kRef);
  EXPECT_EQ(spec, std::vector<int32_t>(plain.begin(), plain.begin() + static_cast<int64_t>(spec.size())));
  EXPECT_EQ(stats.steps, steps);
  EXPECT_EQ(stats.drafted, steps * c.nodes_per_step);
  EXPECT_EQ(stats.accepted, accepted);
  EXPECT_EQ(static_cast<int64_t>(stats.accepted_at.size()), std::min<int64_t>(7, c.budget));
  int64_t sum = 0;
  for (size_t i = 0; i < stats.accepted_at.size(); ++i) {
    sum += stats.accepted_at[i];
    if (i > 0) {
      EXPECT_LE(stats.accepted_at[i], stats.accepted_at[i - 1]) << i;
    }
  }
  EXPECT_EQ(sum, stats.accepted);
  EXPECT_GT(stats.draft_ms, 0.0);
  EXPECT_GE(stats.tree_ms, 0.0);
  EXPECT_GT(stats.verify_ms, 0.0);
  EXPECT_GT(stats.commit_ms, 0.0);
  std::printf("  %s: %lld tokens in %lld steps (%lld drafted tokens accepted)\n", c.name,
              static_cast<long long>(spec.size()), static_cast<long long>(steps), static_cast<long long>(accepted));

  // Refusals: no room for a draft; a ring that does not end at the sequence.
  auto none = speculative_step(runner, st, ring, draft, ctx, spec.back(), 0, opts, choose, nullptr);
  EXPECT_EQ(none.status().code(), ErrorCode::kInvalidArgument);
  ring.clear(st.n_past() + 1);
  auto off = speculative_step(runner, st, ring, draft, ctx, spec.back(), 7, opts, choose, nullptr);
  EXPECT_EQ(off.status().code(), ErrorCode::kInternal);
}

INSTANTIATE_TEST_SUITE_P(Modes, SpeculativeStep,
                         ::testing::Values(SpecCase{"chain", false, 22, 4096, 7},
                                           SpecCase{"chain_window_8", false, 22, 8, 7},
                                           SpecCase{"ddtree_budget_6", true, 6, 4096, 6},
                                           SpecCase{"ddtree_budget_22", true, 22, 4096, 22},
                                           SpecCase{"ddtree_budget_22_window_8", true, 22, 8, 22}),
                         [](const ::testing::TestParamInfo<SpecCase>& i) { return std::string(i.param.name); });

// ---------------------------------------------------------------------------------------------------------
// Sampled speculative decoding against the target's own distribution (algorithms.md A.5/B.5): over many
// seeds, the first two tokens a request emits -- t1 sampled from the prompt's logits, t2 from the first
// speculative step (chain and DDTree) -- are distributed as plain sampling's P(t1) P(t2 | t1), computed
// exactly from the target. Pearson chi-square over the joint's 9 cells (top-k 3: every cell well filled):
// with 8 degrees of freedom P(chi2 > 31.8) = 1e-4 is the false-alarm rate; the seeds are fixed, so a run
// either always passes or always fails.
TEST(SpeculativeSampling, emitted_tokens_follow_the_target_distribution) {
  const Weights& target = model("tiny-qwen35");
  Runner runner(target, kThreads);
  auto d = DFlashDraft::create(model("tiny-qwen35-dflash"), target, runner.backend());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  DFlashDraft& draft = **d;
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 29 + 7) % 500);
  SamplingParams params;
  params.temperature = 1.5f;
  params.top_k = 3;
  const int64_t V = target.spec().vocab;

  // The exact joint of plain sampling over its support.
  SequenceState st(target.spec(), runner.state_layout());
  auto l0 = runner.prefill(st, prompt);
  ASSERT_TRUE(l0.ok());
  auto snap = st.export_snapshot();
  ASSERT_TRUE(snap.ok());
  Sampler probe(params);
  auto p1 = probe.probabilities(*l0, prompt);
  ASSERT_TRUE(p1.ok());
  std::map<std::pair<int32_t, int32_t>, double> expect;
  for (int32_t a = 0; a < V; ++a) {
    if ((*p1)[a] == 0.0f) continue;
    SequenceState s2(target.spec(), runner.state_layout());
    ASSERT_TRUE(s2.import_snapshot(*snap).ok());
    Step step;
    step.tokens = std::span<const int32_t>(&a, 1);
    auto o = runner.forward(s2, step);
    ASSERT_TRUE(o.ok());
    std::vector<int32_t> history = prompt;
    history.push_back(a);
    auto p2 = probe.probabilities(o->logits, history);
    ASSERT_TRUE(p2.ok());
    for (int32_t b = 0; b < V; ++b)
      if ((*p2)[b] > 0.0f) expect[{a, b}] = double((*p1)[a]) * (*p2)[b];
  }
  ASSERT_EQ(expect.size(), 9u);

  // Every draw starts from the same prefilled state and feature window.
  SequenceState base(target.spec(), runner.state_layout());
  FeatureRing base_ring(draft.feature_width(), 64, feature_tag(draft.capture_layers()));
  auto pre = forward_capturing(runner, base, base_ring, draft.capture_layers(), prompt);
  ASSERT_TRUE(pre.ok());
  ASSERT_TRUE(bit_equal(pre->logits, *l0));
  auto base_snap = base.export_snapshot();
  ASSERT_TRUE(base_snap.ok());
  for (bool ddtree : {false, true}) {
    SCOPED_TRACE(ddtree ? "ddtree" : "chain");
    SpecOptions opts;
    opts.ddtree = ddtree;
    opts.ddtree_budget = 12;
    constexpr int kDraws = 500;
    std::map<std::pair<int32_t, int32_t>, int64_t> seen;
    SequenceState s(target.spec(), runner.state_layout());
    for (int seed = 0; seed < kDraws; ++seed) {
      params.seed = 1000003ull * static_cast<uint64_t>(seed + 1);
      Sampler sampler(params);
      ASSERT_TRUE(s.import_snapshot(*base_snap).ok());
      FeatureRing ring = base_ring;
      std::vector<int32_t> history = prompt;
      auto t1 = sampler.sample(pre->logits, history);
      ASSERT_TRUE(t1.ok());
      history.push_back(*t1);
      DFlashDraft::Context ctx(draft);
      const ChooseFn choose = [&](NodeLogits& logits) -> Result<Choice> {
        DF_ASSIGN_OR_RETURN(std::span<const float> row, logits.row());
        DF_ASSIGN_OR_RETURN(int32_t t, sampler.sample(row, history));
        history.push_back(t);
        return Choice{t, false};
      };
      auto r = speculative_step(runner, s, ring, draft, ctx, *t1, 7, opts, choose, nullptr);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      ASSERT_FALSE(r->tokens.empty());
      ++seen[{*t1, r->tokens[0]}];
    }
    double chi = 0;
    for (const auto& [cell, p] : expect) {
      const double e = p * kDraws;
      const double o = static_cast<double>(seen.count(cell) ? seen[cell] : 0);
      chi += (o - e) * (o - e) / e;
    }
    int64_t outside = 0;
    for (const auto& [cell, n] : seen)
      if (!expect.count(cell)) outside += n;
    EXPECT_EQ(outside, 0) << "tokens outside the target's support";
    EXPECT_LT(chi, 31.8) << "chi-square over " << expect.size() << " cells";
    double least = 1.0;
    for (const auto& [cell, p] : expect) least = std::min(least, p);
    std::printf("  %s: chi-square %.2f over %zu cells (%d draws, fewest expected in a cell %.1f)\n",
                ddtree ? "ddtree" : "chain", chi, expect.size(), kDraws, least * kDraws);
  }
}

}  // namespace
}  // namespace dflash

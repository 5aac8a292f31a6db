// DDTree: draft_top_k (on the CPU backend) against a full sort of log_softmax (ties, masked and NaN tokens, bad
// input, a full-size vocabulary),
// build_ddtree's structure (topological, valid parents and depths, unique (parent, token), budget, chain
// seed) and, without the chain seed, against a brute-force enumeration of the top-budget prefixes;
// chain_tree; walk_tree on hand-built trees (accept all, reject at the root, a non-first child, early stop,
// error propagation, choose called once per path node).
#include "decode/ddtree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace dflash {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Naive reference: full sort of (logit desc, id asc), log_softmax in double.
void naive_top_k(const std::vector<float>& logits, int64_t rows, int64_t vocab, int64_t k,
                 std::vector<int32_t>& tokens, std::vector<double>& logprobs) {
  k = std::min(k, vocab);
  tokens.clear();
  logprobs.clear();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * vocab;
    std::vector<int32_t> ids(static_cast<size_t>(vocab));
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    double mx = row[ids[0]];
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(row[i]) - mx);
    const double lse = mx + std::log(sum);
    for (int64_t j = 0; j < k; ++j) {
      tokens.push_back(ids[static_cast<size_t>(j)]);
      logprobs.push_back(static_cast<double>(row[ids[static_cast<size_t>(j)]]) - lse);
    }
  }
}

CpuBackend& cpu() {
  static CpuBackend be(2);
  return be;
}

Result<DraftTopK> top_k(const std::vector<float>& logits, int64_t rows, int64_t vocab, int64_t k) {
  return draft_top_k(cpu(), logits.data(), rows, vocab, k);
}

void expect_matches_naive(const std::vector<float>& logits, int64_t rows, int64_t vocab, int64_t k) {
  auto r = top_k(logits, rows, vocab, k);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::vector<int32_t> tokens;
  std::vector<double> lps;
  naive_top_k(logits, rows, vocab, k, tokens, lps);
  EXPECT_EQ(r->depth, rows);
  EXPECT_EQ(r->k, k);
  ASSERT_EQ(r->tokens, tokens) << "rows " << rows << " vocab " << vocab << " k " << k;
  ASSERT_EQ(r->logprobs.size(), lps.size());
  for (size_t i = 0; i < lps.size(); ++i) {
    if (std::isinf(lps[i])) {
      EXPECT_EQ(r->logprobs[i], -kInf);
    } else {
      EXPECT_NEAR(r->logprobs[i], lps[i], 1e-5 * std::max(1.0, std::abs(lps[i]))) << "entry " << i;
    }
  }
}

TEST(DraftTopK, MatchesFullSortOnRandomLogits) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t vocab : {1, 2, 5, 37, 1000}) {
    for (int64_t k : {1, 3, 8, 16}) {
      if (k > vocab) continue;
      const int64_t rows = 4;
      std::vector<float> logits(static_cast<size_t>(rows * vocab));
      for (float& x : logits) x = normal(rng);
      expect_matches_naive(logits, rows, vocab, k);
    }
  }
}

TEST(DraftTopK, TiesGoToTheLowerId) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> small(0, 3);  // many equal logits
  for (int64_t k : {1, 2, 8, 16}) {
    const int64_t rows = 3, vocab = 300;
    std::vector<float> logits(static_cast<size_t>(rows * vocab));
    for (float& x : logits) x = static_cast<float>(small(rng));
    expect_matches_naive(logits, rows, vocab, k);
  }
  // Signed zeros compare equal: ties by id, whichever zero comes first.
  for (int64_t k : {1, 3, 16}) {
    std::vector<float> zeros(200);
    for (size_t i = 0; i < zeros.size(); ++i) zeros[i] = (i * 7919) % 3 == 0 ? -0.0f : (i % 5 == 0 ? -1.0f : 0.0f);
    expect_matches_naive(zeros, 2, 100, k);
  }
  // All equal: the first k ids, each log(1/V).
  std::vector<float> flat(10, 2.5f);
  auto r = top_k(flat, 1, 10, 4);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tokens, (std::vector<int32_t>{0, 1, 2, 3}));
  for (float lp : r->logprobs) EXPECT_NEAR(lp, std::log(0.1), 1e-6);
}

TEST(DraftTopK, MaskedTokensComeLastWithMinusInfinity) {
  std::vector<float> logits = {-kInf, 1.0f, -kInf, 0.0f};
  auto r = top_k(logits, 1, 4, 3);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tokens, (std::vector<int32_t>{1, 3, 0}));
  EXPECT_NEAR(r->logprobs[0], -std::log1p(std::exp(-1.0)), 1e-6);
  EXPECT_EQ(r->logprobs[2], -kInf);
  // NaN counts as a masked token (Backend::top_k_rows).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> with_nan = {nan, 1.0f, 0.0f, std::copysign(nan, -1.0f)};
  auto n = top_k(with_nan, 1, 4, 3);
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(n->tokens, (std::vector<int32_t>{1, 2, 0}));
  EXPECT_NEAR(n->logprobs[0], -std::log1p(std::exp(-1.0)), 1e-6);
  EXPECT_EQ(n->logprobs[2], -kInf);
}

TEST(DraftTopK, ZeroRowsGiveAnEmptyResult) {
  auto r = top_k({}, 0, 100, 8);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->depth, 0);
  EXPECT_TRUE(r->tokens.empty());
}

TEST(DraftTopK, BadInputIsAnError) {
  std::vector<float> logits(12, 0.0f);
  auto expect_invalid = [](const Result<DraftTopK>& r, const char* what) {
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << what;
    EXPECT_FALSE(r.status().message().empty());
  };
  expect_invalid(top_k(logits, 3, 4, 0), "k = 0");
  expect_invalid(top_k(logits, 3, 4, -1), "k < 0");
  expect_invalid(top_k(logits, 3, 4, 5), "k > vocab");
  expect_invalid(top_k(logits, -1, 4, 2), "rows < 0");
  expect_invalid(top_k(logits, 0, 0, 2), "vocab = 0");
  std::vector<float> wide(2 * 100, 0.0f);
  expect_invalid(top_k(wide, 2, 100, 17), "k > 16");
  std::vector<float> l(200, 0.0f);
  l[150] = kInf;
  auto inf = top_k(l, 2, 100, 2);
  expect_invalid(inf, "+inf");
  EXPECT_NE(inf.status().message().find("row 1"), std::string::npos) << inf.status().message();
  std::vector<float> masked = {0.0f, 1.0f, -kInf, -kInf};
  auto r = top_k(masked, 2, 2, 1);
  expect_invalid(r, "all -inf row");
  EXPECT_NE(r.status().message().find("row 1"), std::string::npos) << r.status().message();
}

TEST(DraftTopK, FullVocabularyRowsAreExact) {
  // Qwen3.5's vocabulary, a DFlash block's 15 drafted rows, K = 8 (lucebox's DDTree setting).
  const int64_t rows = 15, vocab = 248320, k = 8;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  for (float& x : logits) x = normal(rng);
  auto r = top_k(logits, rows, vocab, k);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::vector<int32_t> tokens;
  std::vector<double> lps;
  naive_top_k(logits, rows, vocab, k, tokens, lps);
  EXPECT_EQ(r->tokens, tokens);
  for (size_t i = 0; i < lps.size(); ++i) EXPECT_NEAR(r->logprobs[i], lps[i], 1e-4);
}

// ------------------------------------------------------------------------------------------ trees

// Random top-K tables: each row K distinct tokens sorted by a random log-softmax.
DraftTopK random_topk(std::mt19937& rng, int64_t depth, int64_t k, int32_t vocab = 50) {
  DraftTopK t;
  t.depth = depth;
  t.k = k;
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t d = 0; d < depth; ++d) {
    std::vector<float> logits(static_cast<size_t>(vocab));
    for (float& x : logits) x = normal(rng);
    auto r = top_k(logits, 1, vocab, k);
    EXPECT_TRUE(r.ok());
    t.tokens.insert(t.tokens.end(), r->tokens.begin(), r->tokens.end());
    t.logprobs.insert(t.logprobs.end(), r->logprobs.begin(), r->logprobs.end());
  }
  return t;
}

// The ancestors of a node via parents, nearest first; fails the test on a cycle or a bad parent.
std::vector<int32_t> ancestors(const DraftTree& t, int32_t node) {
  std::vector<int32_t> out;
  int32_t cur = t.parents[static_cast<size_t>(node)];
  while (cur >= 0) {
    EXPECT_LT(cur, t.size());
    if (cur >= t.size() || out.size() > static_cast<size_t>(t.size())) break;
    out.push_back(cur);
    cur = t.parents[static_cast<size_t>(cur)];
  }
  return out;
}

// The token sequence from the root's child down to node (the prefix the node stands for).
std::vector<int32_t> prefix_of(const DraftTree& t, int32_t node) {
  std::vector<int32_t> out;
  for (int32_t c = node; c > 0; c = t.parents[static_cast<size_t>(c)]) out.push_back(t.tokens[static_cast<size_t>(c)]);
  std::reverse(out.begin(), out.end());
  return out;
}

void expect_well_formed(const DraftTree& t, int32_t root, int64_t budget, int64_t max_depth) {
  ASSERT_GE(t.size(), 1);
  ASSERT_EQ(t.parents.size(), t.tokens.size());
  ASSERT_EQ(t.depths.size(), t.tokens.size());
  EXPECT_EQ(t.tokens[0], root);
  EXPECT_EQ(t.parents[0], -1);
  EXPECT_EQ(t.depths[0], 0);
  EXPECT_LE(t.size(), std::max<int64_t>(budget, 0) + 1);
  std::set<std::pair<int32_t, int32_t>> seen;
  for (int32_t i = 1; i < t.size(); ++i) {
    const int32_t p = t.parents[static_cast<size_t>(i)];
    ASSERT_GE(p, 0) << "node " << i;
    ASSERT_LT(p, i) << "node " << i << " is not after its parent (topological order)";
    EXPECT_EQ(t.depths[static_cast<size_t>(i)], t.depths[static_cast<size_t>(p)] + 1) << "node " << i;
    EXPECT_LE(t.depths[static_cast<size_t>(i)], max_depth);
    EXPECT_TRUE(seen.insert({p, t.tokens[static_cast<size_t>(i)]}).second) << "duplicate (parent, token) at " << i;
    EXPECT_EQ(t.child(p, t.tokens[static_cast<size_t>(i)]), i);
    const auto anc = ancestors(t, i);
    ASSERT_EQ(static_cast<int64_t>(anc.size()), t.depths[static_cast<size_t>(i)]) << "node " << i;
    EXPECT_EQ(anc.back(), 0) << "node " << i << " does not reach the root";
  }
}

// Brute force: every prefix of depth 1..L over the K ranks, sorted by cumulative log-prob (summed in
// double from depth 1, as build_ddtree does); the top `budget` as token sequences.
std::set<std::vector<int32_t>> top_prefixes(const DraftTopK& t, int64_t budget) {
  std::vector<std::pair<double, std::vector<int32_t>>> all;
  std::vector<std::pair<double, std::vector<int32_t>>> level = {{0.0, {}}};
  for (int64_t d = 1; d <= t.depth; ++d) {
    std::vector<std::pair<double, std::vector<int32_t>>> next;
    for (const auto& [s, p] : level) {
      for (int64_t r = 0; r < t.k; ++r) {
        auto q = p;
        q.push_back(t.tokens[static_cast<size_t>((d - 1) * t.k + r)]);
        next.push_back({s + static_cast<double>(t.logprobs[static_cast<size_t>((d - 1) * t.k + r)]), q});
      }
    }
    all.insert(all.end(), next.begin(), next.end());
    level = std::move(next);
  }
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::set<std::vector<int32_t>> out;
  for (int64_t i = 0; i < budget && i < static_cast<int64_t>(all.size()); ++i) out.insert(all[static_cast<size_t>(i)].second);
  return out;
}

std::set<std::vector<int32_t>> prefixes_of(const DraftTree& t) {
  std::set<std::vector<int32_t>> out;
  for (int32_t i = 1; i < t.size(); ++i) out.insert(prefix_of(t, i));
  return out;
}

std::vector<int32_t> top1_chain(const DraftTopK& t, int64_t n) {
  std::vector<int32_t> out;
  for (int64_t d = 0; d < std::min(t.depth, n); ++d) out.push_back(t.tokens[static_cast<size_t>(d * t.k)]);
  return out;
}

bool same_tree(const DraftTree& a, const DraftTree& b) {
  return a.tokens == b.tokens && a.parents == b.parents && a.depths == b.depths;
}

TEST(BuildDDTree, PureBestFirstEqualsTheTopBudgetPrefixes) {
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 40; ++trial) {
    const DraftTopK topk = random_topk(rng, 4, 3);
    for (int64_t budget = 1; budget <= 20; ++budget) {
      const DraftTree t = build_ddtree(100, topk, budget, /*chain_seed=*/false);
      expect_well_formed(t, 100, budget, 4);
      EXPECT_EQ(t.size(), budget + 1);
      EXPECT_EQ(prefixes_of(t), top_prefixes(topk, budget)) << "trial " << trial << " budget " << budget;
    }
  }
}

TEST(BuildDDTree, ChainSeedContainsTheTop1ChainAndIsWellFormed) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 40; ++trial) {
    const DraftTopK topk = random_topk(rng, 6, 4);
    for (int64_t budget : {1, 2, 3, 5, 6, 7, 10, 22, 40, 200}) {
      const DraftTree t = build_ddtree(5, topk, budget, /*chain_seed=*/true);
      expect_well_formed(t, 5, budget, 6);
      const auto chain = top1_chain(topk, budget);
      // The chain is nodes 1..D, in order.
      ASSERT_GE(t.size(), static_cast<int64_t>(chain.size()) + 1);
      for (size_t d = 0; d < chain.size(); ++d) {
        EXPECT_EQ(t.tokens[d + 1], chain[d]);
        EXPECT_EQ(t.parents[d + 1], static_cast<int32_t>(d));
      }
      // Enough candidates (4 + 16 + ... >> budget except for the largest) fill the budget.
      const int64_t total = 4 + 16 + 64 + 256 + 1024 + 4096;
      EXPECT_EQ(t.size() - 1, std::min(budget, total));
    }
  }
}

TEST(BuildDDTree, ChainSeedThenBestFirstPicksTheBestRemainingPrefixes) {
  // After the seeded chain, the remaining nodes are the best prefixes among the rest: the tree's
  // weakest non-chain node is at least as likely as any prefix it left out whose parent is in the tree.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 30; ++trial) {
    const DraftTopK topk = random_topk(rng, 4, 3);
    for (int64_t budget = 5; budget <= 30; ++budget) {
      const DraftTree t = build_ddtree(1, topk, budget, true);
      auto score = [&](const std::vector<int32_t>& p) {
        double s = 0;
        for (size_t d = 0; d < p.size(); ++d) {
          for (int64_t r = 0; r < topk.k; ++r) {
            if (topk.tokens[d * topk.k + r] == p[d]) s += topk.logprobs[d * topk.k + r];
          }
        }
        return s;
      };
      const auto in_tree = prefixes_of(t);
      double weakest = 0;
      for (int32_t i = 5; i < t.size(); ++i) weakest = std::min(weakest, score(prefix_of(t, i)));
      for (const auto& p : top_prefixes(topk, 1000)) {
        if (in_tree.count(p)) continue;
        auto parent = p;
        parent.pop_back();
        if (!parent.empty() && !in_tree.count(parent)) continue;
        if (t.size() > 5) {
          EXPECT_LE(score(p), weakest + 1e-12) << "trial " << trial << " budget " << budget;
        }
      }
    }
  }
}

TEST(BuildDDTree, BudgetZeroIsTheRootOnly) {
  std::mt19937 rng(1);
  const DraftTopK topk = random_topk(rng, 5, 3);
  for (bool seed : {false, true}) {
    for (int64_t budget : {0, -3}) {
      const DraftTree t = build_ddtree(42, topk, budget, seed);
      EXPECT_EQ(t.size(), 1);
      EXPECT_EQ(t.tokens, std::vector<int32_t>{42});
      EXPECT_EQ(t.parents, std::vector<int32_t>{-1});
    }
  }
  EXPECT_EQ(build_ddtree(42, DraftTopK{}, 10).size(), 1);  // nothing drafted
}

TEST(BuildDDTree, KOneIsTheChain) {
  std::mt19937 rng(8);
  const DraftTopK topk = random_topk(rng, 7, 1);
  for (bool seed : {false, true}) {
    for (int64_t budget : {1, 3, 7, 15}) {
      const DraftTree t = build_ddtree(9, topk, budget, seed);
      const auto chain = top1_chain(topk, budget);
      EXPECT_TRUE(same_tree(t, chain_tree(9, chain))) << "budget " << budget << " seed " << seed;
    }
  }
}

TEST(BuildDDTree, IsDeterministicUnderTies) {
  // Every log-prob equal: ties everywhere; two builds agree and stay well formed.
  DraftTopK topk;
  topk.depth = 3;
  topk.k = 3;
  topk.tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  topk.logprobs.assign(9, std::log(1.0f / 3.0f));
  for (bool seed : {false, true}) {
    const DraftTree a = build_ddtree(0, topk, 8, seed);
    const DraftTree b = build_ddtree(0, topk, 8, seed);
    EXPECT_TRUE(same_tree(a, b));
    expect_well_formed(a, 0, 8, 3);
    EXPECT_EQ(a.size(), 9);
  }
  // Without the seed, ties pop shallower first: the 3 depth-1 nodes, then depth-2 ones.
  const DraftTree t = build_ddtree(0, topk, 5, false);
  EXPECT_EQ(t.depths, (std::vector<int32_t>{0, 1, 1, 1, 2, 2}));
}

TEST(BuildDDTree, MinusInfinityCandidatesAreNotAdded) {
  DraftTopK topk;
  topk.depth = 2;
  topk.k = 2;
  topk.tokens = {10, 11, 20, 21};
  topk.logprobs = {0.0f, -kInf, -0.1f, -kInf};
  const DraftTree t = build_ddtree(0, topk, 10, false);
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{0, 10, 20}));
}

TEST(ChainTree, IsAChainInOrder) {
  const std::vector<int32_t> drafts = {5, 6, 7};
  const DraftTree t = chain_tree(4, drafts);
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1, 0, 1, 2}));
  EXPECT_EQ(t.depths, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(t.child(1, 6), 2);
  EXPECT_EQ(t.child(1, 7), -1);
  EXPECT_EQ(t.child(3, 5), -1);
  EXPECT_EQ(t.child(-1, 5), -1);
  EXPECT_EQ(t.child(99, 5), -1);
  // A repeated token in a chain is fine: different parents.
  const std::vector<int32_t> same = {8, 8, 8};
  EXPECT_EQ(chain_tree(8, same).size(), 4);
}

TEST(DraftTree, AddChildRejectsBadParentsAndDuplicates) {
  DraftTree t = DraftTree::with_root(1);
  ASSERT_EQ(t.add_child(0, 2).value(), 1);
  ASSERT_EQ(t.add_child(0, 3).value(), 2);
  auto dup = t.add_child(0, 2);
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(t.add_child(3, 2).ok());
  EXPECT_FALSE(t.add_child(-1, 2).ok());
  EXPECT_EQ(t.size(), 3);
  EXPECT_EQ(DraftTree{}.size(), 0);
}

// ------------------------------------------------------------------------------------------ walk

// root(100)
//  ├─ 1: 10 ─ 3: 30 ─ 5: 50
//  └─ 2: 20 ─ 4: 40
DraftTree hand_tree() {
  DraftTree t = DraftTree::with_root(100);
  EXPECT_EQ(t.add_child(0, 10).value(), 1);
  EXPECT_EQ(t.add_child(0, 20).value(), 2);
  EXPECT_EQ(t.add_child(1, 30).value(), 3);
  EXPECT_EQ(t.add_child(2, 40).value(), 4);
  EXPECT_EQ(t.add_child(3, 50).value(), 5);
  return t;
}

// choose from a table node -> token, recording the nodes it is asked about.
struct ScriptedChooser {
  std::map<int32_t, int32_t> answers;
  std::vector<int32_t> asked;
  std::function<Result<int32_t>(int32_t)> fn() {
    return [this](int32_t node) -> Result<int32_t> {
      asked.push_back(node);
      return answers.at(node);
    };
  }
};

TEST(WalkTree, AcceptsTheWholeBranchThenTheBonus) {
  const DraftTree t = hand_tree();
  ScriptedChooser c{{{0, 10}, {1, 30}, {3, 50}, {5, 77}}, {}};
  auto w = walk_tree(t, c.fn());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->path, (std::vector<int32_t>{0, 1, 3, 5}));
  EXPECT_EQ(w->emitted, (std::vector<int32_t>{10, 30, 50, 77}));
  EXPECT_FALSE(w->stopped);
  EXPECT_EQ(c.asked, w->path);  // once per path node, in order
}

TEST(WalkTree, RejectAtTheRootEmitsOnlyTheBonus) {
  const DraftTree t = hand_tree();
  ScriptedChooser c{{{0, 99}}, {}};
  auto w = walk_tree(t, c.fn());
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->path, std::vector<int32_t>{0});
  EXPECT_EQ(w->emitted, std::vector<int32_t>{99});
  EXPECT_EQ(c.asked, std::vector<int32_t>{0});
}

TEST(WalkTree, FollowsANonFirstChild) {
  const DraftTree t = hand_tree();
  ScriptedChooser c{{{0, 20}, {2, 40}, {4, 41}}, {}};
  auto w = walk_tree(t, c.fn());
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->path, (std::vector<int32_t>{0, 2, 4}));
  EXPECT_EQ(w->emitted, (std::vector<int32_t>{20, 40, 41}));
  EXPECT_EQ(c.asked, w->path);
}

TEST(WalkTree, StopAfterEndsTheWalkAtThatToken) {
  const DraftTree t = hand_tree();
  ScriptedChooser c{{{0, 10}, {1, 30}, {3, 50}, {5, 77}}, {}};
  auto w = walk_tree(t, c.fn(), [](int32_t tok) { return tok == 30; });  // 30 ends generation
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->path, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(w->emitted, (std::vector<int32_t>{10, 30}));
  EXPECT_TRUE(w->stopped);
  EXPECT_EQ(c.asked, (std::vector<int32_t>{0, 1}));  // node 3 was never asked
}

TEST(WalkTree, PropagatesTheChoosersError) {
  const DraftTree t = hand_tree();
  int calls = 0;
  auto w = walk_tree(t, [&](int32_t node) -> Result<int32_t> {
    ++calls;
    if (node == 1) return invalid_argument("verify logits of node {} hold a NaN", node);
    return 10;
  });
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("node 1"), std::string::npos);
  EXPECT_EQ(calls, 2);
}

TEST(WalkTree, EmptyTreeIsAnError) {
  auto w = walk_tree(DraftTree{}, [](int32_t) -> Result<int32_t> { return 0; });
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), ErrorCode::kInvalidArgument);
}

TEST(WalkTree, GreedyWalkOfABuiltTreeMatchesTheChainWhenTheTargetAgreesWithTheDraft) {
  // A target that always picks the draft's top-1 accepts the whole seeded chain.
  std::mt19937 rng(4);
  const DraftTopK topk = random_topk(rng, 5, 3);
  const DraftTree t = build_ddtree(7, topk, 12, true);
  auto w = walk_tree(t, [&](int32_t node) -> Result<int32_t> {
    const int32_t d = t.depths[static_cast<size_t>(node)];
    return d < topk.depth ? topk.tokens[static_cast<size_t>(d * topk.k)] : 999;
  });
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->path, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(w->emitted.back(), 999);
}

}  // namespace
}  // namespace dflash

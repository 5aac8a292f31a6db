// SequenceState::commit_tree: after a DDTree verify step, keeping an accepted path leaves the state bit-equal
// to one that ran only the path's tokens causally (KV moved to the path's slots, DeltaNet state and conv
// window taken along the path), on the tiny all-attention and hybrid models; bad paths and commits without
// their tree step are refused without changing anything; a committed state exports and restores exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "model/forward.h"
#include "model/weights.h"
#include "state/sequence_state.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

// One forward step of the whole model on `state` (what Runner::forward does; this layer does not link it):
// logits of every token ([n, V]) or of the last ([V]). Causal steps advance n_past; tree steps do not and
// always fill the DeltaNet capture buffers.
Result<std::vector<float>> run_step(const Weights& w, SequenceState& state, Backend& be,
                                    std::span<const int32_t> tokens, std::span<const int32_t> positions,
                                    cpu::MaskKind mask, std::span<const int32_t> parents, bool all_logits) {
  const ModelSpec& s = w.spec();
  const int64_t n = static_cast<int64_t>(tokens.size());
  DF_ASSIGN_OR_RETURN(Buffer x, be.alloc(n * s.hidden));
  DF_RETURN_IF_ERROR(embed_tokens(w, tokens, x.data(), be));
  const bool tree = mask == cpu::MaskKind::kTree;
  StepShape shape{n, state.n_past(), positions, mask, parents, tree};
  DF_RETURN_IF_ERROR(forward_layers(w, 0, s.n_layers, shape, x.data(), state, {}, {}, be));
  DF_RETURN_IF_ERROR(state.status());
  std::vector<int64_t> rows;
  if (all_logits) {
    rows.resize(static_cast<size_t>(n));
    std::iota(rows.begin(), rows.end(), 0);
  } else {
    rows.push_back(n - 1);
  }
  const int64_t m = static_cast<int64_t>(rows.size());
  DF_ASSIGN_OR_RETURN(Buffer logits, be.alloc(m * s.vocab));
  DF_RETURN_IF_ERROR(lm_head(w, x.data(), rows, logits.data(), be));
  std::vector<float> out(static_cast<size_t>(m * s.vocab));
  DF_RETURN_IF_ERROR(be.download(out.data(), logits.data(), m * s.vocab));
  if (!tree) state.set_n_past(state.n_past() + n);
  return out;
}

Result<std::vector<float>> causal(const Weights& w, SequenceState& state, Backend& be,
                                  std::span<const int32_t> tokens, bool all_logits = false) {
  std::vector<int32_t> positions(tokens.size());
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(state.n_past()));
  return run_step(w, state, be, tokens, positions, cpu::MaskKind::kCausal, {}, all_logits);
}

// A hand-made tree of 12 nodes, depth 5: the spine 0-1-2-3-4, a second child of the root (5) with its
// own branch (5-6-11), and a second child of node 1 (7) with the deepest branch (7-8-9-10).
//
//   0 ─ 1 ─ 2 ─ 3 ─ 4
//   │    └─ 7 ─ 8 ─ 9 ─ 10
//   └─ 5 ─ 6 ─ 11
const std::vector<int32_t> kParents = {-1, 0, 1, 2, 3, 0, 5, 1, 7, 8, 9, 6};

// Paths through it (the conv window of the tiny hybrid model holds K-1 = 3 inputs): the root alone, a
// non-first child (shorter than K-1), the spine of exactly K-1 and of 5, a turn at depth 2, one through
// the second root child longer than K-1, and the deepest path.
const std::vector<std::vector<int32_t>> kPaths = {{0},          {0, 5},          {0, 1, 2}, {0, 1, 2, 3, 4},
                                                  {0, 1, 7},    {0, 5, 6, 11},   {0, 1, 7, 8, 9, 10}};

std::vector<int32_t> tree_positions(int64_t n_past, std::span<const int32_t> parents) {
  std::vector<int32_t> depth(parents.size(), 0);
  for (size_t i = 0; i < parents.size(); ++i) depth[i] = parents[i] < 0 ? 0 : depth[parents[i]] + 1;
  std::vector<int32_t> pos(parents.size());
  for (size_t i = 0; i < parents.size(); ++i) pos[i] = static_cast<int32_t>(n_past) + depth[i];
  return pos;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, size_t n, int64_t vocab) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return t;
}

std::string path_name(std::span<const int32_t> path) {
  std::string s = "path";
  for (int32_t p : path) {
    s += ' ';
    s += std::to_string(p);
  }
  return s;
}

bool bit_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void expect_same_state(const SequenceState& got, const SequenceState& want, const std::string& what) {
  auto a = got.export_snapshot();
  auto b = want.export_snapshot();
  ASSERT_TRUE(a.ok() && b.ok()) << what;
  EXPECT_EQ(a->n_past, b->n_past) << what;
  ASSERT_EQ(a->tensors.size(), b->tensors.size()) << what;
  for (size_t i = 0; i < b->tensors.size(); ++i) {
    EXPECT_EQ(a->tensors[i].name, b->tensors[i].name) << what;
    EXPECT_EQ(a->tensors[i].shape, b->tensors[i].shape) << what << ": " << b->tensors[i].name;
    EXPECT_TRUE(bit_equal(a->tensors[i].data, b->tensors[i].data)) << what << ": " << b->tensors[i].name;
  }
}

// max |a - b| / max |b|
double max_relative_error(std::span<const float> a, std::span<const float> b) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return scale > 0.0 ? diff / scale : diff;
}

class TreeCommit : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    auto w = Weights::load(test::fixture_path(std::string("models/") + GetParam()), 2);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    weights_ = std::make_unique<Weights>(std::move(w).value());
  }
  const Weights& w() const { return *weights_; }
  int64_t vocab() const { return weights_->spec().vocab; }

  // Prefill, tree step over `parents` (kParents unless given) with `tree_tokens`, commit `path`: the state, and
  // the tree logits.
  void tree_and_commit(SequenceState& s, std::span<const int32_t> prompt, std::span<const int32_t> tree_tokens,
                       std::span<const int32_t> path, std::vector<float>* tree_logits,
                       std::span<const int32_t> parents = kParents) {
    ASSERT_TRUE(causal(w(), s, be_, prompt).ok());
    const auto pos = tree_positions(s.n_past(), parents);
    auto lt = run_step(w(), s, be_, tree_tokens, pos, cpu::MaskKind::kTree, parents, true);
    ASSERT_TRUE(lt.ok()) << lt.status().to_string();
    const int64_t before = s.n_past();
    const Status st = s.commit_tree(parents, path);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(s.n_past(), before + static_cast<int64_t>(path.size()));
    if (tree_logits) *tree_logits = std::move(lt).value();
  }

  std::unique_ptr<Weights> weights_;
  CpuBackend be_{2};
};

std::vector<int32_t> path_tokens(std::span<const int32_t> tree_tokens, std::span<const int32_t> path) {
  std::vector<int32_t> t;
  for (int32_t p : path) t.push_back(tree_tokens[static_cast<size_t>(p)]);
  return t;
}

// The main contract. The prompt (70 tokens) ends in KV chunk 1 and the tree's slots stay in it, so every
// attention query sees its keys in the same chunks, in the same order, in both states: the flash-style
// kernel then sums identically and everything is bit-equal (matmul rows do not depend on the batch; the
// tree DeltaNet and conv kernels run the chain kernels' arithmetic from the parent's state/window).
TEST_P(TreeCommit, committed_path_equals_a_causal_run_of_its_tokens) {
  std::mt19937 rng(11);
  const auto prompt = random_tokens(rng, 70, vocab());
  const auto tree_tokens = random_tokens(rng, kParents.size(), vocab());
  const std::vector<int32_t> next = {17, 300 % static_cast<int32_t>(vocab()), 5, 42};
  for (const auto& path : kPaths) {
    SCOPED_TRACE(path_name(path));
    SequenceState a(w().spec(), be_), b(w().spec(), be_);
    std::vector<float> tree_logits;
    tree_and_commit(a, prompt, tree_tokens, path, &tree_logits);
    if (HasFatalFailure()) return;
    ASSERT_TRUE(causal(w(), b, be_, prompt).ok());
    auto ref = causal(w(), b, be_, path_tokens(tree_tokens, path), true);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    // The tree step's logits at the path's nodes are those of the causal run (the premise of the test).
    const std::span<const float> tl(tree_logits), rl(*ref);
    for (size_t d = 0; d < path.size(); ++d)
      EXPECT_TRUE(bit_equal(tl.subspan(static_cast<size_t>(path[d] * vocab()), static_cast<size_t>(vocab())),
                            rl.subspan(d * static_cast<size_t>(vocab()), static_cast<size_t>(vocab()))))
          << "tree logits of node " << path[d];
    expect_same_state(a, b, "after commit");
    for (int32_t t : next) {
      auto la = causal(w(), a, be_, std::span<const int32_t>(&t, 1));
      auto lb = causal(w(), b, be_, std::span<const int32_t>(&t, 1));
      ASSERT_TRUE(la.ok() && lb.ok());
      EXPECT_TRUE(bit_equal(*la, *lb)) << "logits after decoding " << t;
    }
  }
}

// Paths whose KV rows move onto slots that other moves read (nodes in best-first order: the root's second child
// is node 2): in the tree 0 - 1 - 3, 0 - 2 - 4 - 5, path 0, 2, 4 moves slot 2 to 1 and slot 4 to 2, so slot 2 is
// read by one move and written by another; the commit must still equal a causal run of the path's tokens.
TEST_P(TreeCommit, kv_moves_onto_slots_other_moves_read) {
  const std::vector<int32_t> parents = {-1, 0, 0, 1, 2, 4};
  std::mt19937 rng(13);
  const auto prompt = random_tokens(rng, 70, vocab());
  const auto tree_tokens = random_tokens(rng, parents.size(), vocab());
  for (const std::vector<int32_t>& path : {std::vector<int32_t>{0, 2, 4}, std::vector<int32_t>{0, 2, 4, 5},
                                           std::vector<int32_t>{0, 2}, std::vector<int32_t>{0, 1, 3}}) {
    SCOPED_TRACE(path_name(path));
    SequenceState a(w().spec(), be_), b(w().spec(), be_);
    tree_and_commit(a, prompt, tree_tokens, path, nullptr, parents);
    if (HasFatalFailure()) return;
    ASSERT_TRUE(causal(w(), b, be_, prompt).ok());
    ASSERT_TRUE(causal(w(), b, be_, path_tokens(tree_tokens, path)).ok());
    expect_same_state(a, b, "after commit");
    const int32_t t = 17;
    auto la = causal(w(), a, be_, std::span<const int32_t>(&t, 1));
    auto lb = causal(w(), b, be_, std::span<const int32_t>(&t, 1));
    ASSERT_TRUE(la.ok() && lb.ok());
    EXPECT_TRUE(bit_equal(*la, *lb)) << "logits after decoding " << t;
  }
}

// Speculative decoding commits round after round: each tree step starts where the last commit left off.
TEST_P(TreeCommit, successive_rounds_equal_causal_runs) {
  std::mt19937 rng(12);
  const auto prompt = random_tokens(rng, 70, vocab());
  SequenceState a(w().spec(), be_), b(w().spec(), be_);
  ASSERT_TRUE(causal(w(), a, be_, prompt).ok());
  ASSERT_TRUE(causal(w(), b, be_, prompt).ok());
  for (const auto& path : {kPaths[6], kPaths[5], kPaths[0], kPaths[4], kPaths[3]}) {
    SCOPED_TRACE(path_name(path));
    const auto tree_tokens = random_tokens(rng, kParents.size(), vocab());
    const auto pos = tree_positions(a.n_past(), kParents);
    ASSERT_TRUE(run_step(w(), a, be_, tree_tokens, pos, cpu::MaskKind::kTree, kParents, true).ok());
    const Status st = a.commit_tree(kParents, path);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_TRUE(causal(w(), b, be_, path_tokens(tree_tokens, path)).ok());
    expect_same_state(a, b, "after the round");
  }
  const int32_t t = 9;
  auto la = causal(w(), a, be_, std::span<const int32_t>(&t, 1));
  auto lb = causal(w(), b, be_, std::span<const int32_t>(&t, 1));
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_TRUE(bit_equal(*la, *lb));
}

// Tree slots that straddle a KV chunk boundary (prompt 58, slots 58..69): rows move across chunks. The
// moved rows are bit-exactly the tree step's rows. The states are not bit-equal to a causal run: a tree
// node at slot >= 64 sees its ancestors split over chunks 0 and 1, while the causal run has them all in
// chunk 0, and the attention kernel rescales its running sum once per chunk (exp(m_old - m_new)), a
// different float rounding. Logits then agree to float rounding (1e-5 relative; measured 1e-7 to 3e-7).
TEST_P(TreeCommit, moves_rows_across_kv_chunks) {
  std::mt19937 rng(13);
  const auto prompt = random_tokens(rng, 58, vocab());
  const auto tree_tokens = random_tokens(rng, kParents.size(), vocab());
  const std::vector<int32_t> path = {0, 1, 7, 8, 9, 10};  // slots 58, 59, 65..68 -> 58..63
  SequenceState a(w().spec(), be_), b(w().spec(), be_);
  ASSERT_TRUE(causal(w(), a, be_, prompt).ok());
  const int64_t base = a.n_past();
  const auto pos = tree_positions(base, kParents);
  ASSERT_TRUE(run_step(w(), a, be_, tree_tokens, pos, cpu::MaskKind::kTree, kParents, true).ok());
  // The tree step's rows: export with n_past over the tree's slots, then put n_past back.
  a.set_n_past(base + static_cast<int64_t>(kParents.size()));
  auto before = a.export_snapshot();
  a.set_n_past(base);
  ASSERT_TRUE(before.ok());
  const Status st = a.commit_tree(kParents, path);
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto after = a.export_snapshot();
  ASSERT_TRUE(after.ok());
  int kv_tensors = 0;
  for (const auto& t : after->tensors) {
    if (t.name.rfind("kv_", 0) != 0) continue;
    ++kv_tensors;
    const SnapshotTensor* old = before->find(t.name);
    ASSERT_NE(old, nullptr);
    const size_t rf = static_cast<size_t>(t.shape[1] * t.shape[2]);
    const std::span<const float> now(t.data), then(old->data);
    for (int64_t p = 0; p < base; ++p)
      EXPECT_TRUE(bit_equal(now.subspan(p * rf, rf), then.subspan(p * rf, rf))) << t.name << " prefix row " << p;
    for (size_t d = 0; d < path.size(); ++d)
      EXPECT_TRUE(bit_equal(now.subspan((base + d) * rf, rf), then.subspan((base + path[d]) * rf, rf)))
          << t.name << " depth " << d;
  }
  EXPECT_GT(kv_tensors, 0);

  ASSERT_TRUE(causal(w(), b, be_, prompt).ok());
  ASSERT_TRUE(causal(w(), b, be_, path_tokens(tree_tokens, path)).ok());
  for (int32_t t : {3, 77, 128}) {
    auto la = causal(w(), a, be_, std::span<const int32_t>(&t, 1));
    auto lb = causal(w(), b, be_, std::span<const int32_t>(&t, 1));
    ASSERT_TRUE(la.ok() && lb.ok());
    EXPECT_LE(max_relative_error(*la, *lb), 1e-5) << "logits after decoding " << t;
  }
}

TEST_P(TreeCommit, committed_state_exports_and_restores_exactly) {
  std::mt19937 rng(14);
  const auto prompt = random_tokens(rng, 70, vocab());
  const auto tree_tokens = random_tokens(rng, kParents.size(), vocab());
  SequenceState a(w().spec(), be_);
  tree_and_commit(a, prompt, tree_tokens, kPaths[5], nullptr);
  if (HasFatalFailure()) return;
  auto snap = a.export_snapshot();
  ASSERT_TRUE(snap.ok()) << snap.status().to_string();
  SequenceState c(w().spec(), be_);
  ASSERT_TRUE(c.import_snapshot(*snap).ok());
  EXPECT_EQ(c.n_past(), a.n_past());
  for (int32_t t : {5, 300 % static_cast<int32_t>(vocab()), 17}) {
    auto la = causal(w(), a, be_, std::span<const int32_t>(&t, 1));
    auto lc = causal(w(), c, be_, std::span<const int32_t>(&t, 1));
    ASSERT_TRUE(la.ok() && lc.ok());
    EXPECT_TRUE(bit_equal(*la, *lc)) << "logits after decoding " << t;
  }
  // The imported state has no tree step to commit.
  EXPECT_FALSE(c.commit_tree(kParents, kPaths[1]).ok());
}

TEST_P(TreeCommit, bad_paths_are_refused_and_change_nothing) {
  std::mt19937 rng(15);
  const auto prompt = random_tokens(rng, 20, vocab());
  const auto tree_tokens = random_tokens(rng, kParents.size(), vocab());
  SequenceState a(w().spec(), be_), b(w().spec(), be_);
  ASSERT_TRUE(causal(w(), a, be_, prompt).ok());
  const int64_t base = a.n_past();
  const auto pos = tree_positions(base, kParents);
  ASSERT_TRUE(run_step(w(), a, be_, tree_tokens, pos, cpu::MaskKind::kTree, kParents, true).ok());

  struct Bad {
    const char* what;
    std::vector<int32_t> parents, path;
    ErrorCode code;
  };
  const std::vector<int32_t> shorter(kParents.begin(), kParents.end() - 1);
  std::vector<int32_t> rootless = kParents;
  rootless[0] = 3;
  std::vector<int32_t> forward_parent = kParents;
  forward_parent[4] = 6;
  const std::vector<Bad> bad = {
      {"empty path", kParents, {}, ErrorCode::kInvalidArgument},
      {"path not at the root", kParents, {1, 2}, ErrorCode::kInvalidArgument},
      {"skips a level", kParents, {0, 2}, ErrorCode::kInvalidArgument},
      {"not a child", kParents, {0, 1, 6}, ErrorCode::kInvalidArgument},
      {"past the tree", kParents, {0, 12}, ErrorCode::kInvalidArgument},
      {"negative node", kParents, {0, -1}, ErrorCode::kInvalidArgument},
      {"repeats a node", kParents, {0, 0}, ErrorCode::kInvalidArgument},
      {"no parents", {}, {0}, ErrorCode::kInvalidArgument},
      {"root with a parent", rootless, {0}, ErrorCode::kInvalidArgument},
      {"parent after child", forward_parent, {0}, ErrorCode::kInvalidArgument},
      {"fewer nodes than the step", shorter, {0, 1}, ErrorCode::kInternal},
  };
  for (const auto& c : bad) {
    const Status st = a.commit_tree(c.parents, c.path);
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_EQ(st.code(), c.code) << c.what << ": " << st.to_string();
    EXPECT_EQ(a.n_past(), base) << c.what;
  }
  // Nothing changed: the good commit still equals a causal run.
  const Status st = a.commit_tree(kParents, kPaths[6]);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_TRUE(causal(w(), b, be_, prompt).ok());
  ASSERT_TRUE(causal(w(), b, be_, path_tokens(tree_tokens, kPaths[6])).ok());
  expect_same_state(a, b, "after the refused commits and a good one");
  // A tree step is committed once.
  EXPECT_FALSE(a.commit_tree(kParents, kPaths[0]).ok());
}

TEST_P(TreeCommit, commit_needs_its_tree_step_to_be_the_last_step) {
  std::mt19937 rng(16);
  const auto prompt = random_tokens(rng, 20, vocab());
  const auto tree_tokens = random_tokens(rng, kParents.size(), vocab());
  // No tree step at all.
  SequenceState a(w().spec(), be_);
  ASSERT_TRUE(causal(w(), a, be_, prompt).ok());
  EXPECT_EQ(a.commit_tree(kParents, kPaths[0]).code(), ErrorCode::kInternal);
  // A decode step after the tree step (it wrote the root's slot and moved n_past).
  auto pos = tree_positions(a.n_past(), kParents);
  ASSERT_TRUE(run_step(w(), a, be_, tree_tokens, pos, cpu::MaskKind::kTree, kParents, true).ok());
  const int32_t t = 7;
  ASSERT_TRUE(causal(w(), a, be_, std::span<const int32_t>(&t, 1)).ok());
  EXPECT_EQ(a.commit_tree(kParents, kPaths[0]).code(), ErrorCode::kInternal);
  // After reset.
  pos = tree_positions(a.n_past(), kParents);
  ASSERT_TRUE(run_step(w(), a, be_, tree_tokens, pos, cpu::MaskKind::kTree, kParents, true).ok());
  a.reset();
  EXPECT_FALSE(a.commit_tree(kParents, kPaths[0]).ok());
}

// A captured causal step followed by a tree step (which overwrites the capture buffers): rolling the causal
// step back would read the tree's captures, so it is refused on a model with DeltaNet layers.
TEST_P(TreeCommit, rollback_after_a_tree_step_is_refused) {
  bool recurrent = false;
  for (int64_t L = 0; L < w().spec().n_layers; ++L) recurrent = recurrent || w().spec().is_recurrent(L);
  if (!recurrent) GTEST_SKIP() << "no DeltaNet layers: attention rollback is a crop";
  std::mt19937 rng(17);
  const auto prompt = random_tokens(rng, 20, vocab());
  const auto tree_tokens = random_tokens(rng, kParents.size(), vocab());
  SequenceState a(w().spec(), be_);
  ASSERT_TRUE(causal(w(), a, be_, prompt).ok());
  const std::vector<int32_t> block = {1, 2, 3, 4};
  std::vector<int32_t> positions(block.size());
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(a.n_past()));
  a.begin_captured_step(static_cast<int64_t>(block.size()));
  {
    const int64_t n = static_cast<int64_t>(block.size());
    Buffer x = std::move(be_.alloc(n * w().spec().hidden)).value();
    ASSERT_TRUE(embed_tokens(w(), block, x.data(), be_).ok());
    StepShape shape{n, a.n_past(), positions, cpu::MaskKind::kCausal, {}, true};
    ASSERT_TRUE(forward_layers(w(), 0, w().spec().n_layers, shape, x.data(), a, {}, {}, be_).ok());
    a.set_n_past(a.n_past() + n);
  }
  const auto pos = tree_positions(a.n_past(), kParents);
  ASSERT_TRUE(run_step(w(), a, be_, tree_tokens, pos, cpu::MaskKind::kTree, kParents, true).ok());
  EXPECT_EQ(a.rollback_captured(2).code(), ErrorCode::kInternal);
  // The tree step itself still commits.
  EXPECT_TRUE(a.commit_tree(kParents, kPaths[2]).ok());
}

INSTANTIATE_TEST_SUITE_P(TinyModels, TreeCommit, ::testing::Values("tiny-qwen3", "tiny-qwen35"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace dflash

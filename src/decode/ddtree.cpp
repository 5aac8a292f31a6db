// DDTree: draft top-K, best-first tree construction, the acceptance walk (see ddtree.h).
#include "decode/ddtree.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <queue>

namespace dflash {
namespace {

// A frontier entry of the best-first expansion: the rank-th candidate at `depth` below node `parent`.
struct Frontier {
  double score;  // cumulative log-prob of the prefix this entry would add
  int32_t depth;
  int32_t rank;
  int32_t parent;
};

// std::priority_queue pops the largest: higher score first; ties: shallower, lower parent, lower rank.
struct PopsAfter {
  bool operator()(const Frontier& a, const Frontier& b) const {
    if (a.score != b.score) return a.score < b.score;
    if (a.depth != b.depth) return a.depth > b.depth;
    if (a.parent != b.parent) return a.parent > b.parent;
    return a.rank > b.rank;
  }
};

}  // namespace

Result<DraftTopK> draft_top_k(Backend& be, const float* logits, int64_t rows, int64_t vocab, int64_t k) {
  DraftTopK out;
  out.depth = rows;
  out.k = k;
  out.tokens.resize(static_cast<size_t>(std::max<int64_t>(rows, 0) * std::max<int64_t>(k, 0)));
  out.logprobs.resize(out.tokens.size());
  std::vector<float> lse(static_cast<size_t>(std::max<int64_t>(rows, 0)));
  DF_RETURN_IF_ERROR(be.top_k_rows(logits, rows, vocab, k, out.tokens.data(), out.logprobs.data(), lse.data()));
  for (int64_t r = 0; r < rows; ++r) {
    const float z = lse[static_cast<size_t>(r)];
    if (!std::isfinite(z))
      return invalid_argument("draft logits row {}: log-sum-exp {} (a +inf logit, or no finite one)", r, z);
    for (int64_t j = 0; j < k; ++j) out.logprobs[static_cast<size_t>(r * k + j)] -= z;
  }
  return out;
}

DraftTree DraftTree::with_root(int32_t root_token) {
  DraftTree t;
  t.tokens = {root_token};
  t.parents = {-1};
  t.depths = {0};
  t.first_child_ = {-1};
  t.next_sibling_ = {-1};
  return t;
}

Result<int32_t> DraftTree::add_child(int32_t parent, int32_t token) {
  if (parent < 0 || parent >= size()) {
    return invalid_argument("draft tree: parent {} is not a node (the tree has {} nodes)", parent, size());
  }
  if (child(parent, token) >= 0) {
    return invalid_argument("draft tree: node {} already has a child holding token {}", parent, token);
  }
  const auto index = static_cast<int32_t>(size());
  tokens.push_back(token);
  parents.push_back(parent);
  depths.push_back(depths[static_cast<size_t>(parent)] + 1);
  first_child_.push_back(-1);
  next_sibling_.push_back(-1);
  // Append at the end of the parent's sibling list, keeping insertion order.
  int32_t* link = &first_child_[static_cast<size_t>(parent)];
  while (*link >= 0) link = &next_sibling_[static_cast<size_t>(*link)];
  *link = index;
  return index;
}

int32_t DraftTree::child(int32_t node, int32_t token) const {
  if (node < 0 || node >= static_cast<int64_t>(first_child_.size())) return -1;
  for (int32_t c = first_child_[static_cast<size_t>(node)]; c >= 0; c = next_sibling_[static_cast<size_t>(c)]) {
    if (tokens[static_cast<size_t>(c)] == token) return c;
  }
  return -1;
}

DraftTree chain_tree(int32_t root, std::span<const int32_t> drafts) {
  DraftTree t = DraftTree::with_root(root);
  int32_t prev = 0;
  // Each node is new under a fresh parent, so add_child cannot fail.
  for (int32_t tok : drafts) prev = t.add_child(prev, tok).value();
  return t;
}

DraftTree build_ddtree(int32_t root, const DraftTopK& topk, int64_t budget, bool chain_seed) {
  DraftTree tree = DraftTree::with_root(root);
  const int64_t k = std::max<int64_t>(topk.k, 0);
  // A malformed DraftTopK (vectors shorter than depth x k) is cut to the rows it really holds.
  int64_t depth = std::max<int64_t>(topk.depth, 0);
  if (k == 0) depth = 0;
  if (k > 0) {
    depth = std::min<int64_t>(depth, static_cast<int64_t>(topk.tokens.size()) / k);
    depth = std::min<int64_t>(depth, static_cast<int64_t>(topk.logprobs.size()) / k);
  }
  if (budget <= 0 || depth == 0) return tree;

  auto tok = [&](int64_t d, int64_t r) { return topk.tokens[static_cast<size_t>((d - 1) * k + r)]; };
  auto lp = [&](int64_t d, int64_t r) {
    return static_cast<double>(topk.logprobs[static_cast<size_t>((d - 1) * k + r)]);
  };
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();

  std::vector<double> score = {0.0};  // cumulative log-prob of each node's prefix
  std::priority_queue<Frontier, std::vector<Frontier>, PopsAfter> heap;
  auto push = [&](int64_t d, int64_t r, int32_t parent) {
    const double s = score[static_cast<size_t>(parent)] + lp(d, r);
    if (s == kNegInf || std::isnan(s)) return;  // weight 0: never worth a slot
    heap.push(Frontier{s, static_cast<int32_t>(d), static_cast<int32_t>(r), parent});
  };
  // Adds the node an entry describes. Within one build a (parent, depth, rank) is pushed at most once and
  // the K tokens of a row are distinct, so the (parent, token) pair is new.
  auto add = [&](int64_t d, int64_t r, int32_t parent) {
    const int32_t node = tree.add_child(parent, tok(d, r)).value();
    score.push_back(score[static_cast<size_t>(parent)] + lp(d, r));
    return node;
  };

  if (chain_seed) {
    const int64_t chain_depth = std::min(depth, budget);
    int32_t prev = 0;
    for (int64_t d = 1; d <= chain_depth; ++d) {
      if (k > 1) push(d, 1, prev);
      prev = add(d, 0, prev);
    }
    if (chain_depth < depth) push(chain_depth + 1, 0, prev);
  } else {
    push(1, 0, 0);
  }

  while (!heap.empty() && tree.size() - 1 < budget) {
    const Frontier e = heap.top();
    heap.pop();
    const int32_t node = add(e.depth, e.rank, e.parent);
    if (e.rank + 1 < k) push(e.depth, e.rank + 1, e.parent);
    if (e.depth < depth) push(e.depth + 1, 0, node);
  }
  return tree;
}

Result<TreeWalk> walk_tree(const DraftTree& tree, const std::function<Result<int32_t>(int32_t node)>& choose,
                           const std::function<bool(int32_t token)>& stop_after) {
  if (tree.size() == 0) return invalid_argument("walk_tree: the draft tree is empty (it needs at least a root)");
  TreeWalk walk;
  int32_t cur = 0;
  walk.path.push_back(cur);
  for (;;) {
    DF_ASSIGN_OR_RETURN(const int32_t y, choose(cur));
    walk.emitted.push_back(y);
    if (stop_after && stop_after(y)) {
      walk.stopped = true;
      break;
    }
    const int32_t next = tree.child(cur, y);
    if (next < 0) break;
    cur = next;
    walk.path.push_back(cur);
  }
  return walk;
}

}  // namespace dflash

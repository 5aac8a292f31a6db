// DDTree: draft top-K, best-first tree construction, the acceptance walk (see ddtree.h).
#include "decode/ddtree.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <queue>

#include "base/checked_math.h"

namespace dflash {
namespace {

// Above this k a heap scan loses to nth_element over an index copy of the row.
constexpr int64_t kHeapTopKMax = 64;

struct Candidate {
  float logit;
  int32_t id;
};

// a ranks before b: larger logit, ties to the lower id.
inline bool ranks_before(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// An integer that orders like the float (for non-NaN values; -0 sorts just below +0): the sign-magnitude
// bits with the magnitude flipped for negatives. NaNs land above +inf or below -inf.
inline int32_t order_key(float x) {
  int32_t i;
  std::memcpy(&i, &x, sizeof i);
  return i ^ ((i >> 31) & 0x7FFFFFFF);
}
constexpr int32_t kPlusInfKey = 0x7F800000;                                    // order_key(+inf)
constexpr int32_t kMinusInfKey = static_cast<int32_t>(0xFF800000u ^ 0x7FFFFFFFu);  // order_key(-inf)

// The k best of one row into `best` (sorted, best first); ok, or the first NaN / +inf.
Status row_top_k(const float* row, int64_t vocab, int64_t k, int64_t row_index, std::vector<Candidate>& best) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  best.clear();
  if (k <= kHeapTopKMax) {
    // A heap of the k best seen so far whose front is the worst of them: most tokens are rejected by one
    // comparison with the front.
    auto worse_on_top = [](const Candidate& a, const Candidate& b) { return ranks_before(a, b); };
    // Blocks of kBlock logits: the largest and smallest order key of the block first (integer min/max,
    // which vectorize), so NaN / +inf are caught and the (usual) block that holds nothing better than the
    // heap's worst is skipped without per-token branches. A logit equal to the worst is not better: its id
    // is larger than every id already in the heap.
    constexpr int64_t kBlock = 64;
    for (int64_t start = 0; start < vocab; start += kBlock) {
      const int64_t end = std::min(vocab, start + kBlock);
      int32_t key_max = std::numeric_limits<int32_t>::min();
      int32_t key_min = std::numeric_limits<int32_t>::max();
      for (int64_t i = start; i < end; ++i) {
        const int32_t key = order_key(row[i]);
        key_max = std::max(key_max, key);
        key_min = std::min(key_min, key);
      }
      if (key_max >= kPlusInfKey || key_min < kMinusInfKey) {
        for (int64_t i = start; i < end; ++i) {
          if (!(row[i] < kInf)) {
            return invalid_argument("draft logits row {} token {}: {} is not a valid logit (NaN or +inf)",
                                    row_index, i, row[i]);
          }
        }
      }
      if (static_cast<int64_t>(best.size()) == k && key_max <= order_key(best.front().logit)) continue;
      for (int64_t i = start; i < end; ++i) {
        const Candidate c{row[i], static_cast<int32_t>(i)};
        if (static_cast<int64_t>(best.size()) < k) {
          best.push_back(c);
          std::push_heap(best.begin(), best.end(), worse_on_top);
        } else if (ranks_before(c, best.front())) {
          std::pop_heap(best.begin(), best.end(), worse_on_top);
          best.back() = c;
          std::push_heap(best.begin(), best.end(), worse_on_top);
        }
      }
    }
    std::sort_heap(best.begin(), best.end(), worse_on_top);  // ascending in "worse": best first
    return Status::ok_status();
  }
  best.resize(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    const float x = row[i];
    if (!(x < kInf)) {
      return invalid_argument("draft logits row {} token {}: {} is not a valid logit (NaN or +inf)", row_index,
                              i, x);
    }
    best[static_cast<size_t>(i)] = Candidate{x, static_cast<int32_t>(i)};
  }
  if (k < vocab) {
    std::nth_element(best.begin(), best.begin() + (k - 1), best.end(), ranks_before);
    best.resize(static_cast<size_t>(k));
  }
  std::sort(best.begin(), best.end(), ranks_before);
  return Status::ok_status();
}

// exp(-t) for t >= 0, to ~1e-7 relative (Cephes expf: t clamped to 87, so t = +inf gives ~1e-38, not 0;
// against a sum >= 1 that is invisible). Branch-free and without float compares, so the compiler
// vectorizes a loop of it under the default (trapping) floating-point model; libm's exp is one call per
// token, and a row of 248K tokens is dominated by it.
inline float exp_neg(float t) {
  int32_t t_bits;
  std::memcpy(&t_bits, &t, sizeof t_bits);
  t_bits = std::min(t_bits, int32_t{0x42AE0000});  // 87.0f; for t >= 0 the bit patterns order like the values
  float x;
  std::memcpy(&x, &t_bits, sizeof x);
  x = -x;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln 2), |n| <= 126
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;          // x - n ln 2, in [-ln2/2, ln2/2]
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t scale_bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  return y * scale;
}

// sum_i exp(row[i] - max) for a row whose maximum is max (finite); terms in float, sums in double.
double sum_exp_below(const float* row, int64_t vocab, float max) {
  constexpr int64_t kBlock = 256;
  float e[kBlock];
  double sum = 0.0;
  for (int64_t start = 0; start < vocab; start += kBlock) {
    const int64_t n = std::min(kBlock, vocab - start);
    for (int64_t j = 0; j < n; ++j) e[j] = exp_neg(max - row[start + j]);  // max - x >= 0 (+0 at the max)
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
      for (int l = 0; l < 4; ++l) acc[l] += static_cast<double>(e[j + l]);
    }
    for (; j < n; ++j) acc[0] += static_cast<double>(e[j]);
    sum += (acc[0] + acc[1]) + (acc[2] + acc[3]);
  }
  return sum;
}

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

Result<DraftTopK> draft_top_k(std::span<const float> logits, int64_t rows, int64_t vocab, int64_t k) {
  if (rows < 0) return invalid_argument("draft_top_k: rows is {}, must be >= 0", rows);
  if (vocab < 1) return invalid_argument("draft_top_k: vocab is {}, must be >= 1", vocab);
  if (k < 1) return invalid_argument("draft_top_k: k is {}, must be >= 1", k);
  auto want = checked_mul(static_cast<uint64_t>(rows), static_cast<uint64_t>(vocab));
  if (!want || *want != logits.size()) {
    return invalid_argument("draft_top_k: {} logits given for {} rows x {} vocab", logits.size(), rows, vocab);
  }
  k = std::min(k, vocab);

  DraftTopK out;
  out.depth = rows;
  out.k = k;
  out.tokens.resize(static_cast<size_t>(rows * k));
  out.logprobs.resize(static_cast<size_t>(rows * k));
  std::vector<Candidate> best;
  best.reserve(static_cast<size_t>(k <= kHeapTopKMax ? k : vocab));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * vocab;
    DF_RETURN_IF_ERROR(row_top_k(row, vocab, k, r, best));
    const float max = best.front().logit;  // the row's maximum
    if (max == -std::numeric_limits<float>::infinity()) {
      return invalid_argument("draft logits row {}: every logit is -inf (no token is possible)", r);
    }
    const double lse = static_cast<double>(max) + std::log(sum_exp_below(row, vocab, max));
    for (int64_t j = 0; j < k; ++j) {
      const Candidate& c = best[static_cast<size_t>(j)];
      out.tokens[static_cast<size_t>(r * k + j)] = c.id;
      out.logprobs[static_cast<size_t>(r * k + j)] = static_cast<float>(static_cast<double>(c.logit) - lse);
    }
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

// DDTree (algorithms.md §B; lucebox src/common/ddtree.{h,cpp}): the draft's per-position top-K, the tree of
// the most likely continuations built from it under a node budget, and the walk that accepts a path of it.
//
// One DFlash draft pass gives marginals q_1..q_L for the L positions after the last committed token. A
// prefix y_1..y_d has weight w = prod_i q_i(y_i); under the surrogate that the target draws like q, w is the
// probability the walk reaches that node, so the budget-N prefixes with the largest w (automatically
// prefix-closed, since w(child) <= w(parent)) maximize the expected accepted length (§B.2). The tree is
// verified in one target forward with an ancestor-only mask (ops MaskKind::kTree, parents below) and walked
// from the root with the target's own choices (§B.5: each emitted token is a target sample at the node
// actually reached, so the walk is lossless for greedy and sampled decoding alike).
//
// Dimension letters: L = draft depth (rows), K = candidates per position, V = vocabulary, N = budget
// (non-root nodes).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "base/status.h"
#include "ops/backend.h"

namespace dflash {

// The K most likely tokens of each drafted position d = 1..depth (row d-1), under log_softmax of that row.
struct DraftTopK {
  int64_t depth = 0;              // L: rows
  int64_t k = 0;                  // K: candidates per row
  std::vector<int32_t> tokens;    // [L, K] row-major; per row by log-prob descending, ties: lower id first
  std::vector<float> logprobs;    // [L, K] log_softmax of the token's logit in its row (<= 0; -inf possible)
};

// Top-K of each row of raw logits [rows, vocab] in `be`'s memory, reduced there (Backend::top_k_rows: only
// rows x k values reach the host; NaN counts as -inf), with log-probs log_softmax(row)[token]. -inf logits
// are masked tokens (log-prob -inf; they appear only when fewer than k tokens are finite). Errors
// (invalid_argument): those of Backend::top_k_rows (rows, vocab, 1 <= k <= min(vocab, 16)), a row holding
// +inf or no finite logit (named by its index).
Result<DraftTopK> draft_top_k(Backend& be, const float* logits, int64_t rows, int64_t vocab, int64_t k);

// A tree of drafted tokens. Node 0 is the root: the last committed token (the pending bonus), depth 0,
// parent -1. Nodes are in topological order (parents[i] < i for i >= 1), which is the order the verify
// forward takes them in: node i's KV slot is committed + i, its position committed + depths[i], and
// `parents` is what ops' MaskKind::kTree and the tree DeltaNet/conv kernels take. A (parent, token) pair
// appears at most once, so child() is a function.
//
// The vectors are read-only to callers: grow a tree with with_root() / add_child(), which also maintain
// the child links.
struct DraftTree {
  std::vector<int32_t> tokens;   // [n] token id of each node; tokens[0] = root
  std::vector<int32_t> parents;  // [n] parent node index; parents[0] = -1
  std::vector<int32_t> depths;   // [n] depths[0] = 0, depths[i] = depths[parents[i]] + 1

  // A tree holding only the root.
  static DraftTree with_root(int32_t root_token);

  // Appends a node (index size()) holding `token` below `parent`. Errors (invalid_argument): parent not
  // a node of the tree, or parent already has a child holding token.
  Result<int32_t> add_child(int32_t parent, int32_t token);

  // The child of `node` holding `token`, or -1 when there is none (or node is not a node of the tree).
  int32_t child(int32_t node, int32_t token) const;

  // Number of nodes, root included (0 only for a default-constructed tree).
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }

 private:
  // Children as singly linked sibling lists (insertion order): at most K siblings per node.
  std::vector<int32_t> first_child_;   // [n] -1: none
  std::vector<int32_t> next_sibling_;  // [n] -1: none
};

// A pure chain: the root, then drafts[0], drafts[1], ... each the child of the previous (plain DFlash:
// node i = the i-th drafted token, depth i).
DraftTree chain_tree(int32_t root, std::span<const int32_t> drafts);

// Best-first DDTree construction (algorithms.md §B.3): a max-heap on cumulative log-prob sum_i lp_i (summed
// in double from depth 1 down), at most `budget` non-root nodes (budget <= 0: the root only), depth at most
// topk.depth. Popping (depth d, rank r, parent p) adds node tok[d][r] under p and pushes its next sibling
// (rank r+1) and its first child (rank 0 at depth d+1), so the result is the set of the `budget` prefixes
// of largest weight. Entries of weight 0 (a -inf log-prob) are never added by the best-first part.
//
// chain_seed (lucebox's default): first insert the top-1 chain down to depth min(topk.depth, budget) and
// push each chain node's rank-1 sibling, then continue best-first; the tree then always contains what plain
// DFlash would verify (a deviation from the paper's pure best-first that helps when the draft's top-1
// is noisy). Without it the tree equals the top-`budget` prefix set exactly.
//
// Deterministic: ties in score pop the shallower entry first, then the lower parent index, then the lower
// rank. With topk.k == 1 the result is the top-1 chain cut at the budget.
DraftTree build_ddtree(int32_t root, const DraftTopK& topk, int64_t budget, bool chain_seed = true);

// The outcome of walking a verified tree.
struct TreeWalk {
  // Accepted node indices from the root: path[0] = 0, path[i+1] = tree.child(path[i], emitted[i]).
  std::vector<int32_t> path;
  // The token chosen at each node of the path, in order; emitted.size() == path.size(). emitted[i] for
  // i < size-1 is the drafted token of path[i+1] (accepted); emitted.back() is the bonus (the target's
  // token after the last accepted node, the next step's root).
  std::vector<int32_t> emitted;
  // True when the walk ended because stop_after(emitted.back()) said so, rather than because the tree
  // had no child holding emitted.back().
  bool stopped = false;
};

// Walks from the root (§B.5): y = choose(cur); emitted.push_back(y); if stop_after(y) stop; if
// child(cur, y) exists move there and append it to path, else stop.
//
// `choose(node)` returns the target's token at `node` (argmax for greedy, or a draw of the caller's
// Sampler from the verify logits of that node). It is called exactly once per node on the path, in path
// order, and never for a node off the path, so a caller sampling lazily consumes its random stream exactly
// as plain one-token decoding would. An error it returns ends the walk and is returned.
//
// `stop_after(token)` (optional; empty = never) ends the walk right after a token that ends generation
// (an end-of-generation id, the token budget reached), so choose is not asked for tokens that will not be
// used even when the tree drafted past them. A caller may equally leave it empty and cut `emitted`
// afterwards: the tokens to commit are always emitted[0..m) for the m the caller keeps (each an exact
// target choice), and the KV/state to keep are those of path[0..m).
//
// Errors: invalid_argument for an empty (default-constructed) tree; choose's errors as returned.
Result<TreeWalk> walk_tree(const DraftTree& tree, const std::function<Result<int32_t>(int32_t node)>& choose,
                           const std::function<bool(int32_t token)>& stop_after = {});

}  // namespace dflash

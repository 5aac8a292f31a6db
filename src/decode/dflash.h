// DFlash speculative decoding (algorithms.md A, B): a block-diffusion draft proposes the next block of
// tokens from the target's captured features in one forward; the target verifies the block (a chain, or a
// DDTree of the draft's top-k under a node budget) in one step; the longest prefix the target itself would
// have produced is kept, plus the target's own next token. Lossless: every emitted token is the token the
// caller's `choose` picks from the target's logits at the position it lands on (greedy: the argmax; sampling:
// one draw of the caller's sampler per emitted token, in order, as plain decoding draws them).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "decode/ddtree.h"
#include "decode/runner.h"
#include "model/weights.h"
#include "state/feature_ring.h"
#include "state/sequence_state.h"

namespace dflash {

// How a sequence drafts.
struct SpecOptions {
  bool ddtree = false;          // verify a DDTree (else the plain chain of the draft's argmax)
  int64_t ddtree_budget = 22;   // DDTree: non-root nodes at most
  int64_t ddtree_top_k = 8;     // DDTree: candidates per drafted position (1 when the budget fits a chain)
  int64_t feature_window = 4096;  // target feature rows a sequence keeps (FeatureRing capacity; snapshots carry them)
  // Fall back to plain decoding while drafting is slower per token than plain steps (measured), trying
  // again after a while (Generation).
  bool adaptive = true;
};

// Acceptance counters (per request, and summed by the server).
struct SpecStats {
  int64_t steps = 0;     // draft + verify steps
  int64_t drafted = 0;   // drafted tokens put to the target (chain positions or tree nodes)
  int64_t accepted = 0;  // drafted tokens kept
  std::vector<int64_t> accepted_at;  // [block - 1]: steps that kept the draft token at depth d + 1
  // Host wall time a step spends: proposing (the draft's forward and its candidates' download), building the tree,
  // verifying (the target's forward and its argmaxes' download), and walking the tree with committing the path
  // (the state's commit or rollback, the features' append).
  double draft_ms = 0, tree_ms = 0, verify_ms = 0, commit_ms = 0;
  void add(const SpecStats& o);
};

// A DFlash draft bound to its target: the draft's weights (on the target's backend) with the target's
// embedding and LM head.
class DFlashDraft {
 public:
  // Checks the draft against the target: hidden size, vocabulary, capture layers within the target's layers
  // (and the target's depth when the draft names it), the mask token. `draft` and `target` live on `be`.
  static Result<std::unique_ptr<DFlashDraft>> create(const Weights& draft, const Weights& target, Backend& be);

  const ModelSpec& spec() const { return draft_.spec(); }
  const Weights& weights() const { return draft_; }
  Backend& backend() const { return *be_; }
  std::span<const int64_t> capture_layers() const { return draft_.spec().target_layer_ids; }
  int64_t block_size() const { return draft_.spec().block_size; }
  int32_t mask_token() const { return mask_; }
  // Floats per feature row: m * H.
  int64_t feature_width() const { return static_cast<int64_t>(capture_layers().size()) * draft_.spec().hidden; }

  // The draft's per-sequence state: its layers' context K/V (slot = position - base), and its recorded step.
  class Context {
   public:
    explicit Context(const DFlashDraft& d);
    ~Context();
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;
    int64_t base() const { return base_; }
    int64_t end() const { return end_; }  // context positions [base, end) are in the K/V
    void reset();
    // Draft steps that ran as a replay of a recording, and recordings made (for tests and benchmarks).
    int64_t replayed_steps() const { return replayed_; }
    int64_t recordings() const { return recordings_; }

   private:
    friend class DFlashDraft;
    // Draft steps recorded on the backend (Backend::begin_step_capture), one per count of new context rows (each
    // recorded the first time it comes: recording a step costs about what running it eagerly does, and a good
    // draft's acceptance spreads the counts over 1 .. B), all made with one draft (DFlashDraft::id(): a re-loaded
    // draft's weights move) while the K/V tables stay where they were (kv_.layout_version()). They read the new
    // ring rows from `features_` and leave the logits of every block row after the root in `logits_`.
    struct Recorded {
      int64_t id = -1, n_new = 0;
    };
    std::vector<Recorded> recs_;
    uint64_t rec_draft_ = 0, rec_layout_ = 0;
    Buffer features_;  // [B, m * H]
    Buffer logits_;    // [B - 1, V]
    int failures_ = 0;
    void drop();
    Backend* be_;
    SequenceState kv_;
    int64_t base_ = 0, end_ = 0;
    bool started_ = false;
    int64_t replayed_ = 0, recordings_ = 0;
  };

  // One draft forward for the block [root, mask, ...] at positions s .. s + B - 1, s = ring.end(): the ring's
  // rows the context does not hold yet become context K/V first (from ring.first() when the context is
  // empty or the ring no longer reaches back to its end). Returns the top `k` tokens of block rows 1 .. rows
  // (rows <= B - 1) with their log-probabilities, reduced on the backend (Backend::top_k_rows).
  // Where the backend records steps and 1 to B rows are new, the step is recorded once per sequence and count of
  // new rows and replayed (one launch), with the eager step's arithmetic (its head on all B - 1 rows).
  Result<DraftTopK> propose(Context& ctx, const FeatureRing& ring, int32_t root, int64_t rows, int64_t k);
  // Turns recorded draft steps off (or back on); on by default where the backend supports them.
  void set_step_graphs(bool on) { graphs_on_ = on; }
  // Unique among the drafts of this process (a recording made with another draft is stale).
  uint64_t id() const { return id_; }

 private:
  DFlashDraft(const Weights& draft, const Weights& target, Backend& be, int32_t mask);
  // A step's token ids (the block [root, mask, ...]) and RoPE positions (its n_new new context rows', then the
  // block's), from the context's end.
  struct StepInputs {
    std::vector<int32_t> block, positions;
  };
  StepInputs step_inputs(const Context& ctx, int32_t root, int64_t n_new) const;
  // One draft forward: the new context rows' features [n_new, m * H] (this backend's memory) made context K/V at
  // the context's end, the block through the layers, the head's logits of block rows 1 .. rows into `logits`.
  Status run_step(Context& ctx, const float* features, int64_t n_new, const StepInputs& in, int64_t rows,
                  float* logits);
  // The draft forward of propose, eager.
  Status forward_eager(Context& ctx, const FeatureRing& ring, int32_t root, int64_t rows, float* logits);
  // The recorded step's logits (rows 1 .. B - 1 of the block), or null when it does not run recorded now (run
  // eagerly).
  Result<const float*> forward_recorded(Context& ctx, const FeatureRing& ring, int32_t root);
  // The ring's rows [from, ring.end()) into dst [n, m * H] in the draft backend's memory.
  Status ring_rows_to(const FeatureRing& ring, int64_t from, float* dst) const;
  const Weights& draft_;
  const Weights& target_;
  Backend* be_;
  int32_t mask_;
  uint64_t id_;
  bool graphs_on_ = true;
};

// A verified node's logits, for the caller's choice: their argmax and its logit (reduced on the backend for every
// node of the step), and the whole row on demand (one row crosses to the host, once).
class NodeLogits {
 public:
  NodeLogits(Backend& be, const float* row, int64_t vocab, int32_t argmax, float best)
      : be_(&be), dev_(row), vocab_(vocab), argmax_(argmax), best_(best) {}
  int32_t argmax() const { return argmax_; }
  // The greedy choice, with the sampler's errors (decode/sampler.h checked_greedy: the best logit +inf or NaN,
  // or every logit -inf), as Runner::greedy_token gives plain greedy decoding.
  Result<int32_t> greedy() const;
  Result<std::span<const float>> row();

 private:
  Backend* be_;
  const float* dev_;
  int64_t vocab_;
  int32_t argmax_;
  float best_;
  std::vector<float> host_;
};

// The caller's pick at one verified node: the token (the target's choice from these logits under the
// request's sampling rules) and whether the generation ends with it (end-of-generation, a stop string, the
// token budget): nothing after it is used.
struct Choice {
  int32_t token = 0;
  bool stop = false;
};
using ChooseFn = std::function<Result<Choice>(NodeLogits& logits)>;

struct SpecStepResult {
  std::vector<int32_t> tokens;  // emitted, in order; unless stopped, the last is the next root (not evaluated)
  bool stopped = false;
};

// Target features of a step's tokens appended to the ring (rows [n, m * H] from the capture layers' outputs: the
// step's device_features for a device ring, else its downloaded features); pick (device features only): the step's
// rows to append, in order (a tree's accepted path), instead of its first n.
Status append_features(FeatureRing& ring, int64_t first_pos, const StepOutput& out, int64_t n,
                       std::span<const int64_t> pick = {});
// The feature ring of a sequence drafting with `draft` for `target` (`window` rows, feature_tag of its capture
// layers): in the draft's device memory where the target runs there too on one device (features never cross
// the bus), else on the host.
FeatureRing feature_ring_for(const DFlashDraft& draft, const Runner& target, int64_t window);

// Plain causal target steps over `tokens` after the state (prefill chunks of at most `chunk` tokens, or a decode
// step) whose capture layers' outputs go to `ring`: what keeps the ring at the sequence's end outside
// speculative steps. Returns the last step's output. Chunked as Runner::prefill chunks, a prefill computes
// what that one does.
Result<StepOutput> forward_capturing(Runner& target, SequenceState& state, FeatureRing& ring,
                                     std::span<const int64_t> capture_layers, std::span<const int32_t> tokens,
                                     int64_t chunk = INT64_MAX);

// One speculative step after `root`: the token at position state.n_past() that was chosen (and emitted) but
// not evaluated yet; ring.end() == state.n_past(). Drafts at most `max_drafts` tokens (<= B - 1), verifies
// them with features captured, walks with `choose` (called once per emitted token, in order), commits the
// accepted path to `state` and its features to `ring`. The caller checks that the positions fit the target.
Result<SpecStepResult> speculative_step(Runner& target, SequenceState& state, FeatureRing& ring, DFlashDraft& draft,
                                        DFlashDraft::Context& ctx, int32_t root, int64_t max_drafts,
                                        const SpecOptions& opts, const ChooseFn& choose, SpecStats* stats);

// The verify half of a step, for any draft tree whose root (node 0) is the token at state.n_past(): one
// target step over the tree's nodes (causal when the tree is a chain, else the ancestor mask with
// positions n_past + depth), the walk with `choose`, and the commit of the accepted path (state and ring).
Result<SpecStepResult> verify_tree(Runner& target, SequenceState& state, FeatureRing& ring,
                                   std::span<const int64_t> capture_layers, const DraftTree& tree,
                                   const ChooseFn& choose, SpecStats* stats);

}  // namespace dflash

// Runner: one forward step of a target over the shards of its placement (one shard on one device, or a layer
// split across devices: FEATURES.md F2), with the sequence state, and the helpers every decoder uses (chunked
// prefill, single-token decode). A split is a placement of this one runner, not a second model path: the
// same forward_layers runs each shard's range, and the residual stream is handed from shard to shard.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/forward.h"
#include "model/weights.h"
#include "state/sequence_state.h"

namespace dflash {

// What one forward consumes and asks for.
struct Step {
  std::span<const int32_t> tokens;
  std::span<const int32_t> positions;  // empty: n_past, n_past + 1, ...
  cpu::MaskKind mask = cpu::MaskKind::kCausal;
  std::span<const int32_t> parents;    // kTree only
  bool all_logits = false;             // logits of every token (else only the last)
  bool capture_recurrent = false;      // keep per-token DeltaNet states: SequenceState::rollback_captured
  std::span<const int64_t> capture_layers;  // layers whose outputs to return (DFlash features)
  bool logits_on_device = false;  // leave the logits in the backend's memory (StepOutput::device_logits)
  // Leave the captured layers' outputs in their backends' memory (StepOutput::device_features) instead of
  // downloading them (StepOutput::features).
  bool features_on_device = false;
};

struct StepOutput {
  std::vector<float> logits;  // [rows, V] (empty when the step kept them on the device)
  Buffer device_logits;       // [rows, V] in the backend's memory, when Step::logits_on_device
  int64_t rows = 0;
  std::vector<std::vector<float>> features;  // per capture layer: [n, H]
  std::vector<Buffer> device_features;       // the same, each in its layer's backend memory (features_on_device)
};

// One shard of a placement: layers [layer_begin, layer_end) of `weights`, computed by `backend` (the weights'
// data in its memory). The first shard's weights also hold the token embedding, the last's the final norm
// and the LM head (or the tied embedding).
struct RunnerShard {
  const Weights* weights = nullptr;
  Backend* backend = nullptr;
  int64_t layer_begin = 0, layer_end = 0;
};

// The residual stream handed between shards of different backends, since the runner was made. `ms` is the host
// time of the hand-offs: a copy through the host waits for it; a peer copy between GPUs is queued on the two
// streams (the devices order it), so its cost shows in the step's time, not here.
struct HandoffStats {
  int64_t count = 0;
  uint64_t bytes = 0;
  double ms = 0;
};

class Runner {
 public:
  // On the CPU, with `threads` threads (<= 0: all cores).
  Runner(const Weights& weights, int threads = 0);
  // On `backend`; the weights' data must live in its memory (Weights::to_backend).
  Runner(const Weights& weights, Backend& backend);
  // A placement of several shards: contiguous layer ranges in order from layer 0 to the last, one model.
  static Result<std::unique_ptr<Runner>> create(std::vector<RunnerShard> shards);
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  const ModelSpec& spec() const { return shards_.front().weights->spec(); }
  std::span<const RunnerShard> shards() const { return shards_; }
  // The last shard's backend: where a step's logits are (Step::logits_on_device).
  Backend& backend() { return *shards_.back().backend; }
  // The layout of this placement's sequence states: SequenceState(spec(), state_layout()).
  const std::vector<StateShard>& state_layout() const { return layout_; }
  // The shard that runs `layer`.
  const RunnerShard& shard_of(int64_t layer) const;
  HandoffStats handoff_stats() const { return handoffs_; }

  // Runs the step and advances state.n_past by the number of tokens (causal steps). Tree steps leave
  // n_past unchanged: the caller commits accepted nodes. Where every shard's backend records steps, two
  // shapes are recorded per sequence and replayed afterwards (one launch a shard instead of one per op),
  // their outputs those of the eager step: a plain one-token decode step (causal, default position, no
  // recurrent capture; capture layers and device logits allowed), recorded at once; and a verify step (a chain with
  // capture_recurrent or a tree, every row's logits left on the device, at most kMaxRecordedVerify tokens),
  // recorded the second time its shape comes (the first, eager, allocates what it needs). A replayed verify
  // step's device logits and features are the recording's own buffers: valid until the sequence's next step.
  Result<StepOutput> forward(SequenceState& state, const Step& step);
  static constexpr int64_t kMaxRecordedVerify = 32;
  // The greedy token of `out`'s last logits row, left on the device (Step::logits_on_device): its argmax, ties
  // to the lowest id (the sampler's greedy choice), reduced on the backend, so that one id crosses to the host
  // instead of the row. Errors as the sampler's: the best logit +inf, or every logit -inf (a NaN counts as -inf
  // here, as in Backend::top_k_rows).
  Result<int32_t> greedy_token(const StepOutput& out);
  // Turns recorded steps off (or back on); on by default where the backend supports them. set_verify_graphs
  // turns off (or on) the recorded verify steps alone.
  void set_step_graphs(bool on) { graphs_on_ = on; }
  void set_verify_graphs(bool on) { verify_graphs_on_ = on; }
  // Plain one-token steps on the token-exact products too (Backend::set_token_exact), as verify steps always
  // run: on while a draft decodes with this target (cli/draft_loader.cpp), so that its verify steps and its plain
  // steps (and a plain request's) compute a token the same way, bit for bit. Off by default: for bf16 weights the
  // one-token kernel of the other path is faster (ops/cuda/matmul_host.h, kTokenExact); other types take the same
  // kernels either way. Changing it drops the recorded steps (they ran the other products).
  void set_exact_decode(bool on);
  // Steps that ran as a replay of a recording, and recordings made (for tests and benchmarks).
  int64_t replayed_steps() const { return replayed_; }
  int64_t recordings() const { return recordings_; }

  // Prompt tokens a prefill step (prefill()'s chunks, and the server's prefill steps): kDevicePrefillChunk
  // where every shard computes on a device, else kPrefillChunk; set_prefill_chunk (>= 1) overrides it.
  // On a GPU a step's products read (and, for quantized weights above 256 tokens, dequantize to bf16) every
  // weight once, so longer steps amortize that: a 4096-token prompt on an H100 ran at 16.3K / 24.3K tok/s
  // (Qwen3-8B Q4_K_M), 3.7K / 5.1K (Qwen3.5-27B Q4_K_M) and 23.8K / 27.1K (Qwen3-8B BF16) at 512 / 2048 tokens
  // a step (docs/benchmarks.md). A step of 2048 tokens still takes well under a second there, so the server
  // interleaves other requests' tokens between steps; the CPU keeps 512 (its time grows with the tokens).
  static constexpr int64_t kPrefillChunk = 512;
  static constexpr int64_t kDevicePrefillChunk = 2048;
  int64_t prefill_chunk() const { return prefill_chunk_; }
  void set_prefill_chunk(int64_t tokens) { prefill_chunk_ = tokens > 0 ? tokens : prefill_chunk_; }
  // Prefills `tokens` after the state's committed prefix in chunks of `chunk` tokens (0: prefill_chunk());
  // returns the logits of the last token ([V]).
  Result<std::vector<float>> prefill(SequenceState& state, std::span<const int32_t> tokens, int64_t chunk = 0);

  // Runs the step shapes of a request once, on scratch sequences it then drops (a full prefill step, a
  // short one, a few-token one), so that a device's first request does not pay for loading kernels and
  // choosing GEMM algorithms: on an H100 the first 512-token prefill of a Qwen3-8B runs 3-4x slower than
  // the next. Leaves no trace in later steps' results. `max_tokens` caps the steps (the server's context).
  Status warm_up(int64_t max_tokens);

 private:
  // The shapes a sequence's steps are recorded in.
  enum class RecordedKind { kDecode, kChain, kTree };
  struct RecordedKey {
    uint64_t state = 0;  // SequenceState::id()
    RecordedKind kind = RecordedKind::kDecode;
    int64_t n = 1;
    bool operator<(const RecordedKey& o) const {
      return state != o.state ? state < o.state : kind != o.kind ? kind < o.kind : n < o.n;
    }
  };
  // A recorded step of one sequence: one recording per shard, the residual rows handed between them.
  struct Recorded {
    std::vector<int64_t> ids;  // per shard (empty: not recorded)
    uint64_t layout = 0;  // SequenceState::layout_version() when recorded
    std::vector<Buffer> xs;  // per shard: its residual rows ([n, H], in its memory) that its recording reads and leaves
    Buffer logits;        // where the recording leaves the logits ([rows, V]); reserved for it
    std::vector<int64_t> capture_layers;  // the layers whose outputs it copies out (DFlash features)
    std::vector<Buffer> features;         // where it leaves them ([n, H] each); reserved for it
    SequenceState::StepMarks marks;       // what the step asks of the state (left again by each replay)
    int seen = 0;         // eager steps of this shape (a verify shape is recorded at its second)
    int failures = 0;     // recordings that failed (scratch growing mid-capture); gives up after a few
    uint64_t last_use = 0;
  };
  // Shard k's part of a step on x [n, H] (its memory, in place): the embedding first on the first shard, its
  // layers and their capture layers' outputs (into feature_bufs), the LM head into `logits` on the last.
  Status run_shard(size_t k, SequenceState& state, const Step& step, const StepShape& shape,
                   std::span<const int64_t> rows, float* x, float* logits, std::vector<Buffer>& feature_bufs);
  // Embedding, layers and head of a step into `logits` (rows x V); the capture layers' outputs into
  // `feature_bufs` (the caller's when it holds one per capture layer, else allocated here).
  Status run_layers(SequenceState& state, const Step& step, std::span<const int32_t> positions,
                    std::span<const int64_t> rows, float* logits, std::vector<Buffer>& feature_bufs);
  // The recorded path of a step of a recordable shape (`kind`); *used = false when it fell back to the caller.
  Result<StepOutput> forward_recorded(SequenceState& state, const Step& step, std::span<const int32_t> positions,
                                      RecordedKind kind, bool* used);
  // Records `rec` (one recording per shard) for the step; false when a recording failed (run it eagerly).
  Result<bool> record(Recorded& rec, SequenceState& state, const Step& step, std::span<const int32_t> positions,
                      const StepValues& values, bool token_exact);
  // Turns token-exact products on or off on every shard's backend (verify steps).
  void set_token_exact(bool on);
  // Whether a step of n tokens runs token-exact: a verify step, or a one-token step under set_exact_decode.
  bool token_exact_step(bool verify, int64_t n) const { return verify || (exact_decode_ && n == 1); }

  explicit Runner(std::vector<RunnerShard> shards);
  // Copies x [n, H] from `from`'s memory into a new buffer of `to`'s (a shard boundary).
  Result<Buffer> hand_off(const float* x, int64_t n, Backend& from, Backend& to);
  // n floats from `from`'s memory into `to`'s at a shard boundary (a peer copy where the two can, else through
  // the host), counted in handoffs_.
  Status hand_over(const float* src, Backend& from, float* dst, Backend& to, int64_t n);
  // Whether every shard's backend records steps (decode steps then replay one recording per shard).
  bool records_steps() const;
  void drop(Recorded& r);

  std::unique_ptr<CpuBackend> owned_;
  std::vector<RunnerShard> shards_;
  std::vector<StateShard> layout_;  // shards_ as sequence states see them (state_layout())
  HandoffStats handoffs_;
  int64_t prefill_chunk_ = kPrefillChunk;
  bool graphs_on_ = true;
  bool verify_graphs_on_ = true;
  bool exact_decode_ = false;
  std::map<RecordedKey, Recorded> recorded_;
  uint64_t uses_ = 0;
  int64_t replayed_ = 0, recordings_ = 0;
};

}  // namespace dflash

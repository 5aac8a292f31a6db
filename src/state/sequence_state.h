// SequenceState: everything one sequence holds across the shards of its target's placement (attention KV in
// 64-token chunks, DeltaNet conv windows and states, each layer's in the memory of the shard that runs it),
// exportable to and importable from a Snapshot of named host tensors.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/forward.h"
#include "model/model_spec.h"
#include "ops/backend.h"

namespace dflash {

inline constexpr int64_t kKvChunkTokens = 64;

// Attention K and V of one layer: chunk c holds positions [64c, 64c + 64) as [64, nkv, hd] float32.
class KvStore {
 public:
  // Elements of the backend's kv_type(), fixed for the store's life.
  KvStore(Backend& be, int64_t n_kv_heads, int64_t head_dim)
      : be_(&be), n_kv_heads_(n_kv_heads), head_dim_(head_dim), type_(be.kv_type()) {}
  Status reserve(int64_t n_tokens);
  float* k_row(int64_t pos) { return k_[pos / kKvChunkTokens].data() + (pos % kKvChunkTokens) * row_words(); }
  float* v_row(int64_t pos) { return v_[pos / kKvChunkTokens].data() + (pos % kKvChunkTokens) * row_words(); }
  cpu::KvView view(int64_t n_tokens);
  // Frees chunks past what n_tokens needs.
  void shrink(int64_t n_tokens);
  cpu::KvType type() const { return type_; }
  // Elements of a row (nkv * hd), and the 4-byte words that store them (half as many for f16).
  int64_t row_elems() const { return n_kv_heads_ * head_dim_; }
  int64_t row_words() const { return type_ == cpu::KvType::kF16 ? (row_elems() + 1) / 2 : row_elems(); }
  // Positions with addressable rows (whole chunks).
  int64_t capacity() const { return static_cast<int64_t>(k_.size()) * kKvChunkTokens; }
  uint64_t bytes() const { return 2 * k_.size() * kKvChunkTokens * row_words() * sizeof(float); }
  // Rows [pos, pos + rows) of K (which 0) or V (1), within one chunk, as float32 into `out`, and back.
  Status read_rows(int which, int64_t pos, int64_t rows, float* out);
  Status write_rows(int which, int64_t pos, int64_t rows, const float* in);
  // Bumped whenever the device copy of the chunk tables moves (a recorded step that read it is stale).
  uint64_t table_version() const { return table_version_; }

 private:
  Backend* be_;
  int64_t n_kv_heads_, head_dim_;
  cpu::KvType type_;
  Status sync_device_table(size_t first_chunk);

  std::vector<Buffer> k_, v_;  // chunks, in the backend's memory
  std::vector<const float*> k_ptrs_, v_ptrs_;
  // On a device backend: [k pointers (table_cap_)][v pointers (table_cap_)], 8-byte pointers stored in
  // a float buffer (2 floats each), kept equal to k_/v_ for the chunks that exist.
  Buffer table_;
  size_t table_cap_ = 0;
  uint64_t table_version_ = 0;
};

// A named host tensor of a snapshot (float32 unless said otherwise), shape outermost first.
struct SnapshotTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// What a sequence needs to continue: its tokens, position, the last logits, and every state tensor.
// Names: "kv_k.<layer>" / "kv_v.<layer>" [n_past, nkv, hd], "conv.<layer>" [K-1, conv_dim],
// "ssm.<layer>" [Hv, dv, dk]; a split target's carry their shard: "ls<shard>_<name>" (FEATURES.md F3).
// Layer numbers are the model's, whatever the placement, so a snapshot re-binds to any placement by layer.
struct Snapshot {
  std::vector<int32_t> tokens;
  int64_t n_past = 0;
  std::vector<float> last_logits;
  std::vector<SnapshotTensor> tensors;
  const SnapshotTensor* find(const std::string& name) const;
};

// Layers [layer_begin, layer_end) of a placement, whose state lives in `backend`'s memory.
struct StateShard {
  Backend* backend = nullptr;
  int64_t layer_begin = 0, layer_end = 0;
};

class SequenceState : public LayerStateAccess {
 public:
  // State for layers [layer_begin, layer_end) of `spec` (the whole model by default), in the memory of
  // backend `be` (which must outlive the state).
  SequenceState(const ModelSpec& spec, Backend& be, int64_t layer_begin = 0, int64_t layer_end = -1);
  // State for a placement's shards: contiguous layer ranges in order, each in its shard's backend (which
  // must outlive the state). Snapshot tensors of a state of more than one shard carry "ls<shard>_".
  SequenceState(const ModelSpec& spec, std::span<const StateShard> shards);

  int64_t n_past() const { return n_past_; }
  // Whether the state is laid out for these shards (the same layer ranges, in the same backends' memory).
  bool laid_out_as(std::span<const StateShard> shards) const;
  // Unique among the states of this process (keys of per-sequence caches such as recorded steps).
  uint64_t id() const { return id_; }
  // Changes whenever a device-side table of the state moves (recorded steps that used it are stale).
  uint64_t layout_version() const;
  // Attention rollback is a crop: positions >= n are forgotten. (Recurrent state is not rolled back here.)
  void set_n_past(int64_t n) { n_past_ = n; }
  void reset();
  uint64_t bytes() const;

  // After a causal step run with capture_recurrent (n tokens from position `base`), keeps only the first
  // n_keep of them: attention is cropped to base + n_keep and every DeltaNet layer takes the state and conv
  // window it had after token n_keep - 1 of the step: the state copied from the step's per-token states, or,
  // where the step kept the chain form (model/forward.h), re-run from the state before the step on the kept
  // tokens' inputs on the layer's backend (the recurrent form the step ran, so the same bits).
  // 1 <= n_keep <= n. Refused when a later step (a tree verify) has overwritten the DeltaNet captures.
  Status rollback_captured(int64_t n_keep);
  // Called before a step run with capture_recurrent (the Runner does): remembers where it starts.
  void begin_captured_step(int64_t n);

  // What a step asked of each layer (KV rows, capture buffers), which rollback_captured and commit_tree read.
  struct StepMark {
    int64_t base = -1, n = 0;
    bool conv = false, ssm = false;  // DeltaNet: which capture buffers the step filled
    bool chain = false;              // ssm: ssm_chain_capture's form (a causal step), not per-token states
  };
  using StepMarks = std::vector<StepMark>;
  // The marks a step that started at `base` left (base -1 for the layers it did not touch), and the same marks
  // left again by a replay of that step's recording at n_past() (which runs none of the calls that leave them).
  StepMarks step_marks(int64_t base) const;
  void replay_step_marks(const StepMarks& marks);
  // While a step is recorded (Runner, CUDA graphs), the state must not move: KV chunks or capture buffers the
  // step would need to allocate fail it instead (the recording is abandoned and the step runs eagerly).
  void set_recording(bool on) { recording_ = on; }

  // After a tree step (MaskKind::kTree over nodes at KV slots n_past .. n_past + n_nodes - 1, `parents` as
  // given to the step, node 0 the root with parent -1; the step leaves n_past where it was) keeps the
  // accepted path `path` (path[0] == 0, each path[d] a child of path[d - 1]), algorithms.md B.6/B.7:
  // KV of slot n_past + path[d] moves to n_past + d in every attention layer, every DeltaNet layer takes
  // the state after node path.back() and the conv window of the last K-1 inputs along the path (rows of
  // the window before the step where the path is shorter than K-1), and n_past grows by path.size().
  // The tree step is found from what it asked of this state (KV rows, capture buffers), so no call is
  // needed before it; the step must be the last one run on the state. A refused commit changes nothing.
  Status commit_tree(std::span<const int32_t> parents, std::span<const int32_t> path);

  Result<Snapshot> export_snapshot() const;
  // Replaces the state with the snapshot's; every tensor must be present with this model's shapes.
  Status import_snapshot(const Snapshot& snap);

  // LayerStateAccess
  Status reserve_kv(int64_t layer, int64_t n_total) override;
  float* k_row(int64_t layer, int64_t pos) override { return kv(layer).k_row(pos); }
  float* v_row(int64_t layer, int64_t pos) override { return kv(layer).v_row(pos); }
  cpu::KvView kv_view(int64_t layer, int64_t n_total) override { return kv(layer).view(n_total); }
  float* conv_state(int64_t layer) override { return conv_[slot(layer)].data(); }
  float* ssm_state(int64_t layer) override { return ssm_[slot(layer)].data(); }
  // Allocation failures in the constructor or the capture buffers (checked before a step).
  const Status& status() const { return status_; }
  float* ssm_capture(int64_t layer, int64_t n) override;
  float* conv_capture(int64_t layer, int64_t n) override;
  float* ssm_chain_capture(int64_t layer, int64_t n) override;

 private:
  KvStore& kv(int64_t layer) { return *kv_[slot(layer)]; }
  size_t slot(int64_t layer) const { return static_cast<size_t>(layer - layer_begin_); }
  // The backend holding layer slot i's state.
  Backend& be(size_t i) const { return *shards_[shard_of_[i]].backend; }
  // Snapshot name of layer L's tensor `base` ("kv_k", ...): "ls<shard>_" first when split.
  std::string tensor_name(const char* base, int64_t L) const;
  // Records that a step starting at n_past asked layer slot i for n tokens' captures: conv, or ssm as every
  // token's state (chain false) or as the state before the step and its inputs (chain true).
  void mark_capture(size_t i, int64_t n, bool conv, bool chain = false);
  Status check_tree_step(std::span<const int32_t> parents, std::span<const int32_t> path) const;

  // Capture buffers grow to the step's size and are kept for the next step (capture_version_ counts moves).
  float* ensure_capture(Backend& be, Buffer& buf, int64_t n);

  ModelSpec spec_;
  std::vector<StateShard> shards_;
  std::vector<size_t> shard_of_;  // per layer slot: index into shards_
  uint64_t id_;
  Status status_;
  int64_t layer_begin_, layer_end_;
  int64_t n_past_ = 0;
  std::vector<std::unique_ptr<KvStore>> kv_;  // per layer in range; null for recurrent layers
  std::vector<Buffer> conv_;          // per layer [K-1, conv_dim]; empty for attention layers
  std::vector<Buffer> ssm_;           // per layer [Hv, dv, dk]
  std::vector<Buffer> ssm_capture_;   // per layer: [n, Hv, dv, dk], or ssm_chain_capture's layout
  std::vector<Buffer> conv_capture_;  // per layer: [(K-1) + n, conv_dim]
  int64_t capture_base_ = -1, capture_n_ = 0;     // the captured step: first position and token count
  // What the last step run on the state asked of each layer: reserve_kv (attention) or both capture
  // buffers (DeltaNet) for n tokens from position base. A tree step leaves n_past unchanged and calls
  // nothing else on the state, so commit_tree finds it here; rollback_captured checks that no later step
  // overwrote its captures.
  std::vector<StepMark> marks_;                   // per layer in range
  uint64_t capture_version_ = 0;
  bool recording_ = false;
};

}  // namespace dflash

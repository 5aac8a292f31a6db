// Runner: one forward step of a target over its shards (one local CPU shard for now), with the sequence
// state, and the helpers every decoder uses (chunked prefill, single-token decode).
#pragma once

#include <cstdint>
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
};

struct StepOutput {
  std::vector<float> logits;  // [rows, V]
  int64_t rows = 0;
  std::vector<std::vector<float>> features;  // per capture layer: [n, H]
};

class Runner {
 public:
  // On the CPU, with `threads` threads (<= 0: all cores).
  Runner(const Weights& weights, int threads = 0)
      : w_(weights), owned_(std::make_unique<CpuBackend>(threads)), be_(owned_.get()) {}
  // On `backend`; the weights' data must live in its memory (Weights::to_backend).
  Runner(const Weights& weights, Backend& backend) : w_(weights), be_(&backend) {}

  const ModelSpec& spec() const { return w_.spec(); }
  const Weights& weights() const { return w_; }
  Backend& backend() { return *be_; }

  // Runs the step and advances state.n_past by the number of tokens (causal steps). Tree steps leave
  // n_past unchanged: the caller commits accepted nodes.
  Result<StepOutput> forward(SequenceState& state, const Step& step);

  // Prefills `tokens` after the state's committed prefix in chunks of `chunk` tokens; returns the logits
  // of the last token ([V]).
  Result<std::vector<float>> prefill(SequenceState& state, std::span<const int32_t> tokens, int64_t chunk = 256);

 private:
  const Weights& w_;
  std::unique_ptr<CpuBackend> owned_;
  Backend* be_;
};

}  // namespace dflash

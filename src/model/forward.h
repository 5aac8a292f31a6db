// The forward pass: one function per layer kind, one loop over a layer range. Every family and every
// placement (single device, split shards) runs through forward_layers; a family is a ModelSpec.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/weights.h"
#include "ops/backend.h"
#include "ops/cpu/ops.h"

namespace dflash {

// Where a layer's sequence state lives; implemented by state/SequenceState (which the model layer does
// not see). Positions are absolute sequence positions; KV rows are [nkv * hd] float32.
class LayerStateAccess {
 public:
  virtual ~LayerStateAccess() = default;
  // Makes KV rows [0, n_total) of attention layer `layer` addressable.
  virtual Status reserve_kv(int64_t layer, int64_t n_total) = 0;
  virtual float* k_row(int64_t layer, int64_t pos) = 0;
  virtual float* v_row(int64_t layer, int64_t pos) = 0;
  virtual cpu::KvView kv_view(int64_t layer, int64_t n_total) = 0;
  // Gated DeltaNet layer state: conv window [K-1, conv_dim] and S [Hv, dv, dk], float32, updated in place.
  virtual float* conv_state(int64_t layer) = 0;
  virtual float* ssm_state(int64_t layer) = 0;
  // Capture buffers of a step that may be rolled back (speculative verify), sized for `n` tokens:
  // ssm [n, Hv, dv, dk], the state after each token (tree steps: a node's state is its children's start);
  // conv [(K-1) + n, conv_dim], the conv window before the step followed by the step's conv inputs.
  virtual float* ssm_capture(int64_t layer, int64_t n) = 0;
  virtual float* conv_capture(int64_t layer, int64_t n) = 0;
  // A causal step's DeltaNet capture where chain_capture_pays (else ssm_capture), laid out by
  // chain_capture_layout(dims, n): the state before the step [Hv, dv, dk], then the step's recurrent inputs
  // q [n, Hk, dk], k [n, Hk, dk], v [n, Hv, dv], decay [n, Hv], beta [n, Hv]. A rollback to the first m tokens
  // re-runs them from the state before, instead of every token's state being written (a 23-token verify of
  // Qwen3.5-27B wrote 3.4 GB of them).
  virtual float* ssm_chain_capture(int64_t layer, int64_t n) = 0;
};

// The pieces of an ssm_chain_capture buffer for a step of n tokens (offsets in floats).
struct ChainCapture {
  int64_t state, q, k, v, decay, beta, end;
};
inline ChainCapture chain_capture_layout(const DeltaNetDims& g, int64_t n) {
  ChainCapture c{};
  c.state = 0;
  c.q = g.state_floats();
  c.k = c.q + n * g.key_dim();
  c.v = c.k + n * g.key_dim();
  c.decay = c.v + n * g.value_dim();
  c.beta = c.decay + n * g.n_v_heads;
  c.end = c.beta + n * g.n_v_heads;
  return c;
}

// Whether a causal captured step of n tokens keeps the chain form (the state before it and its inputs) rather
// than every token's state: when those states would be large (Qwen3.5-27B at 23 tokens: 72 MB a layer). Small
// models keep the states, whose copy-back is cheaper than a re-run (the bundled 19M pair's chain steps ran
// 15-25% slower with the re-run).
inline constexpr int64_t kChainCaptureMinFloats = int64_t{1} << 22;  // 16 MB of per-token states a layer
// The threshold in floats, kChainCaptureMinFloats unless a test lowers it (process-wide; 0: always the chain
// form) so that small models exercise both forms.
int64_t& chain_capture_min_floats();
inline bool chain_capture_pays(const DeltaNetDims& g, int64_t n) {
  return n * g.state_floats() >= chain_capture_min_floats();
}

// Prefill steps of at least this many tokens run the chunked (WY) DeltaNet form; shorter ones (decode,
// verify) the recurrent form.
inline constexpr int64_t kChunkedDeltaNetMinTokens = 64;

// What one forward consumes (the `Step` of the architecture map, as the layers see it).
struct StepShape {
  int64_t n = 0;                        // tokens in this step
  int64_t n_past = 0;                   // committed positions before it (KV rows [0, n_past) exist)
  std::span<const int32_t> positions;   // [n] RoPE positions
  cpu::MaskKind mask = cpu::MaskKind::kCausal;
  std::span<const int32_t> parents;     // kTree: parent index of each token (-1: the committed prefix)
  bool capture_recurrent = false;       // fill the DeltaNet capture buffers (tree steps always do)
};

// Runs layers [begin, end) of `w` on the residual stream x [n, H] in place, with backend `be` (x, the
// captured buffers and the state's buffers live where `be` computes). `captures` lists layers whose output
// (the residual after the whole block) is copied into the matching `captured` buffer [n, H].
Status forward_layers(const Weights& w, int64_t begin, int64_t end, const StepShape& step, float* x,
                      LayerStateAccess& state, std::span<const int64_t> captures, std::span<float* const> captured,
                      Backend& be);

// x [n, H] = token embeddings.
Status embed_tokens(const Weights& w, std::span<const int32_t> tokens, float* x, Backend& be);

// logits [rows.size(), V] for the given rows of x [n, H] (final norm, then the LM head).
Status lm_head(const Weights& w, const float* x, std::span<const int64_t> rows, float* logits, Backend& be);

// ---- DFlash draft (algorithms.md A.3): a draft's Weights (family kDFlashDraft) with the target's embedding
//      and LM head. The draft's KV per layer (LayerStateAccess::kv_view of its layers) holds context rows only:
//      slot = position - the first context position the sequence's draft holds.

// ctx [n, H] = RMSNorm(features Wfc^T; hidden_norm) for target features [n, m * H].
Status draft_context(const Weights& draft, const float* features, int64_t n, float* ctx, Backend& be);

// The draft's layers on the block x [B, H] (target embeddings of [root, mask, ...]) in place. ctx [n_new, H]:
// context rows, which every layer projects and appends at KV slots first_slot ..; the block takes the slots
// right after them, and attends to all slots [0, first_slot + n_new + B) (bidirectional). `positions` [n_new + B]
// are the rows' RoPE positions: the context's, then the block's (s .. s + B - 1 after a context ending at s - 1).
// The block's K/V stay past the context (the next call overwrites them).
Status draft_layers(const Weights& draft, const float* ctx, int64_t n_new, int64_t first_slot,
                    std::span<const int32_t> positions, float* x, int64_t B, LayerStateAccess& state, Backend& be);

// logits [rows.size(), V] of the given block rows: the draft's own final norm, then the target's LM head
// (the target's output norm is not applied).
Status draft_head(const Weights& draft, const Weights& target, const float* x, std::span<const int64_t> rows,
                  float* logits, Backend& be);

}  // namespace dflash

// Sampler: turns one row of logits (plus the token history, for penalties) into a token id, or into
// the final probability distribution (for logprobs and for speculative decoding's accept/reject).
//
// The chain, in this order (llama.cpp's default order for the filters it shares; temperature is
// applied before top-p/min-p as in HF transformers; top-k commutes with temperature):
//   1. logit bias       logit[id] += bias (a bias of -inf bans a token)
//   2. penalties        over the last `penalty_last_n` tokens of history, per distinct token t with
//                       count c: repetition (logit > 0 ? logit / r : logit * r), then
//                       logit -= frequency * c + presence * [c > 0]   (llama.cpp's order)
//   3. greedy           temperature == 0: argmax, ties go to the lowest id; the chain stops here and
//                       no random number is consumed
//   4. top-k            keep the k largest logits (ties: lowest id first); 0 = off
//   5. temperature      logit /= temperature
//   6. softmax          over the surviving tokens
//   7. top-p            keep the smallest prefix (by probability, descending) whose mass >= top_p
//   8. min-p            keep tokens with p >= min_p * p_max  (p as after step 6; the ratio does not
//                       change under renormalization, so steps 7 and 8 keep the intersection of two
//                       prefixes of the sorted order — which lets min-p run first as a linear pass)
//   9. renormalize and draw with the seeded RNG
//
// Logits of -inf are masked tokens (they never survive). A NaN or +inf logit, an empty row, a row
// whose every logit is -inf, a history token or logit_bias id outside the vocabulary are errors (a
// Status naming what and where), never undefined behaviour.
//
// Randomness: std::mt19937_64 (its output sequence is fixed by the C++ standard); a uniform double
// in [0, 1) is (x >> 11) * 2^-53 of one raw 64-bit output, so draws are the same on every platform
// for a given seed and call sequence (up to the last-ulp behaviour of libm's exp on the probabilities).
// Every non-greedy sample() and every sample_from() consumes exactly one 64-bit output.
//
// Cost: plain greedy (no bias, no penalties) is one scan of the row, no copy. Otherwise one pass over
// the vocabulary to copy, bias, penalize and mask; top-k by a k-heap scan (or nth_element for large
// k) + a sort of k entries; top-p by progressively widening partial sorts (no full sort of the vocabulary unless
// the nucleus really spans it). One scratch buffer of vocabulary size is reused across calls.
// Not thread-safe: one Sampler per sequence.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "base/status.h"

namespace dflash {

struct SamplingParams {
  float temperature = 0.0f;          // 0 = greedy (argmax)
  int32_t top_k = 0;                 // 0 = off
  float top_p = 1.0f;                // (0, 1]; 1 = off
  float min_p = 0.0f;                // [0, 1]; 0 = off
  float repetition_penalty = 1.0f;   // (0, 10]; 1 = off (llama.cpp / HF semantics)
  float presence_penalty = 0.0f;     // [-2, 2]; 0 = off (OpenAI semantics)
  float frequency_penalty = 0.0f;    // [-2, 2]; 0 = off (OpenAI semantics)
  int32_t penalty_last_n = 64;       // window of history the penalties look at; -1 = all, 0 = off
  std::optional<uint64_t> seed;      // absent: a random seed (Sampler::seed() reports it)
  std::map<int32_t, float> logit_bias;  // token id -> added to its logit; finite or -inf

  // Ok, or an invalid-argument Status naming the field and the allowed range.
  Status validate() const;

  bool greedy() const { return temperature == 0.0f; }
  // Greedy with nothing that changes the logits first: the token is the raw logits' argmax.
  bool plain_argmax() const { return greedy() && logit_bias.empty() && !has_penalties(); }
  bool has_penalties() const {
    return penalty_last_n != 0 &&
           (repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f);
  }
};

class Sampler {
 public:
  // Params are validated here; if invalid, every call returns that error (see create()).
  explicit Sampler(const SamplingParams& params);
  // Like the constructor, but refuses invalid params up front.
  static Result<Sampler> create(const SamplingParams& params);

  const SamplingParams& params() const { return params_; }
  // The seed the RNG was started from (params.seed, or the random one chosen when it was absent).
  uint64_t seed() const { return seed_; }

  // The next token. `history` is the prompt plus everything generated so far (penalties only).
  Result<int32_t> sample(std::span<const float> logits, std::span<const int32_t> history);

  // The distribution the chain ends in (vocabulary-sized, sums to 1; zero for filtered tokens;
  // one-hot at the argmax when greedy). Consumes no random numbers.
  Result<std::vector<float>> probabilities(std::span<const float> logits, std::span<const int32_t> history);
  // The same into a caller-owned buffer (resized to the vocabulary), to avoid an allocation per call.
  Status probabilities_into(std::span<const float> logits, std::span<const int32_t> history,
                            std::vector<float>* out);

  // Draws an id from `probs` (non-negative, finite, not all zero; need not sum to 1) with this
  // sampler's RNG: one 64-bit output, walking ids in ascending order.
  Result<int32_t> sample_from(std::span<const float> probs);

  // A uniform double in [0, 1) from the RNG (for speculative accept/reject tests).
  double uniform();

 private:
  struct Candidate {
    int32_t id;
    float logit;
    float p;
  };

  // Runs steps 1-8, leaving the survivors in cand_ with p set (not renormalized) and their mass in
  // kept_mass_. Greedy leaves one candidate with p = 1.
  Status run_chain(std::span<const float> logits, std::span<const int32_t> history);
  Status apply_penalties(std::span<const int32_t> history, size_t vocab);
  void top_p_cut();

  SamplingParams params_;
  Status params_status_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;

  std::vector<Candidate> cand_;   // the one vocabulary-sized scratch, reused across calls
  std::vector<int32_t> window_;   // scratch: the penalty window, sorted to count repeats
  bool sorted_ = false;           // cand_ is in descending-probability order (ties: lowest id first)
  double kept_mass_ = 0.0;
};

// The sampler's errors for a faulty row, one text for every greedy choice: the Sampler's, and those reduced on a
// backend (Runner::greedy_token, NodeLogits::greedy in decode/dflash.h).
Status logit_fault(int64_t token, float logit);  // a NaN or +inf logit
Status all_masked(int64_t vocab);                // every logit -inf
// A greedy choice reduced on a backend (Backend::top_k_rows with k = 1, where a NaN counts as -inf): `id`, or
// the sampler's error when its logit `best` is +inf (or NaN) or -inf.
Result<int32_t> checked_greedy(int32_t id, float best, int64_t vocab);

}  // namespace dflash

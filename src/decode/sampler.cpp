// Sampler: logit bias, penalties, greedy / top-k, temperature, softmax, top-p, min-p, seeded draw.
#include "decode/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dflash {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool finite(float v) { return std::isfinite(v); }

uint64_t random_seed() {
  std::random_device rd;
  uint64_t hi = rd();
  uint64_t lo = rd();
  return (hi << 32) ^ lo;
}

}  // namespace

Status SamplingParams::validate() const {
  if (!finite(temperature) || temperature < 0.0f) {
    return invalid_argument("sampling: temperature must be a finite number >= 0 (0 = greedy), got {}",
                            temperature);
  }
  if (top_k < 0) return invalid_argument("sampling: top_k must be >= 0 (0 = off), got {}", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f)) {  // also rejects NaN
    return invalid_argument("sampling: top_p must be in (0, 1] (1 = off), got {}", top_p);
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return invalid_argument("sampling: min_p must be in [0, 1] (0 = off), got {}", min_p);
  }
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 10.0f)) {
    return invalid_argument("sampling: repetition_penalty must be in (0, 10] (1 = off), got {}",
                            repetition_penalty);
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return invalid_argument("sampling: presence_penalty must be in [-2, 2] (0 = off), got {}", presence_penalty);
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return invalid_argument("sampling: frequency_penalty must be in [-2, 2] (0 = off), got {}",
                            frequency_penalty);
  }
  if (penalty_last_n < -1) {
    return invalid_argument("sampling: penalty_last_n must be >= -1 (-1 = whole context, 0 = off), got {}",
                            penalty_last_n);
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) return invalid_argument("sampling: logit_bias token id {} is negative", id);
    if (std::isnan(bias) || bias == std::numeric_limits<float>::infinity()) {
      return invalid_argument("sampling: logit_bias for token {} must be finite or -inf, got {}", id, bias);
    }
  }
  return Status();
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params), params_status_(params.validate()), seed_(params.seed ? *params.seed : random_seed()) {
  rng_.seed(seed_);
}

Result<Sampler> Sampler::create(const SamplingParams& params) {
  DF_RETURN_IF_ERROR(params.validate());
  return Sampler(params);
}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

Status Sampler::apply_penalties(std::span<const int32_t> history, size_t vocab) {
  if (!params_.has_penalties() || history.empty()) return Status();
  size_t n = history.size();
  if (params_.penalty_last_n >= 0) n = std::min(n, static_cast<size_t>(params_.penalty_last_n));
  const size_t start = history.size() - n;
  window_.assign(history.begin() + static_cast<std::ptrdiff_t>(start), history.end());
  for (size_t i = 0; i < window_.size(); ++i) {
    if (window_[i] < 0 || static_cast<size_t>(window_[i]) >= vocab) {
      return invalid_argument("sampler: history token {} at position {} is outside the vocabulary of {}",
                              window_[i], start + i, vocab);
    }
  }
  std::sort(window_.begin(), window_.end());
  const float rep = params_.repetition_penalty;
  const float freq = params_.frequency_penalty;
  const float pres = params_.presence_penalty;
  for (size_t i = 0; i < window_.size();) {
    size_t j = i;
    while (j < window_.size() && window_[j] == window_[i]) ++j;
    const float count = static_cast<float>(j - i);
    float& l = cand_[static_cast<size_t>(window_[i])].logit;
    if (rep != 1.0f) l = l > 0.0f ? l / rep : l * rep;
    l -= count * freq + pres;
    i = j;
  }
  return Status();
}

Status Sampler::run_chain(std::span<const float> logits, std::span<const int32_t> history) {
  DF_RETURN_IF_ERROR(params_status_);
  const size_t vocab = logits.size();
  if (vocab == 0) return invalid_argument("sampler: empty logits row");
  if (vocab > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return invalid_argument("sampler: logits row of {} entries exceeds the int32 token id range", vocab);
  }

  constexpr float kPosInf = std::numeric_limits<float>::infinity();
  auto bad_logit = [](size_t i, float l) { return logit_fault(static_cast<int64_t>(i), l); };

  // Plain greedy (no bias, no penalties): one scan, no copy.
  if (params_.greedy() && params_.logit_bias.empty() && (!params_.has_penalties() || history.empty())) {
    int32_t best = -1;
    float best_l = kNegInf;
    for (size_t i = 0; i < vocab; ++i) {
      const float l = logits[i];
      if (!(l < kPosInf)) return bad_logit(i, l);  // NaN or +inf
      if (l > best_l) {
        best_l = l;
        best = static_cast<int32_t>(i);
      }
    }
    if (best < 0) return all_masked(static_cast<int64_t>(vocab));
    cand_.resize(1);
    cand_[0] = Candidate{best, best_l, 1.0f};
    sorted_ = true;
    kept_mass_ = 1.0;
    return Status();
  }

  // Copy (the one vocabulary-sized scratch), rejecting NaN and +inf.
  cand_.resize(vocab);
  for (size_t i = 0; i < vocab; ++i) {
    const float l = logits[i];
    if (!(l < kPosInf)) return bad_logit(i, l);
    cand_[i] = Candidate{static_cast<int32_t>(i), l, 0.0f};
  }
  sorted_ = false;

  // Logit bias, then penalties, while cand_ is still indexed by token id.
  for (const auto& [id, bias] : params_.logit_bias) {
    if (static_cast<size_t>(id) >= vocab) {
      return invalid_argument("sampler: logit_bias token id {} is outside the vocabulary of {}", id, vocab);
    }
    cand_[static_cast<size_t>(id)].logit += bias;
  }
  DF_RETURN_IF_ERROR(apply_penalties(history, vocab));

  // Greedy: argmax, ties to the lowest id (strict > in ascending order).
  if (params_.greedy()) {
    int32_t best = -1;
    float best_l = kNegInf;
    for (const Candidate& c : cand_) {
      if (c.logit > best_l) {
        best_l = c.logit;
        best = c.id;
      }
    }
    if (best < 0) return all_masked(static_cast<int64_t>(vocab));
    cand_.resize(1);
    cand_[0] = Candidate{best, best_l, 1.0f};
    sorted_ = true;
    kept_mass_ = 1.0;
    return Status();
  }

  // Masked tokens never survive (stable: cand_ stays in id order).
  std::erase_if(cand_, [](const Candidate& c) { return c.logit == kNegInf; });
  if (cand_.empty()) return all_masked(static_cast<int64_t>(vocab));

  // Top-k: the k largest logits, ties to the lowest id; then sorted (k is small).
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
  };
  const size_t k = static_cast<size_t>(params_.top_k);
  if (k > 0 && k < cand_.size()) {
    const auto kth = cand_.begin() + static_cast<std::ptrdiff_t>(k);
    if (k <= cand_.size() / 16) {
      // Small k: a heap of the k best in cand_[0, k) (top = the worst of them), one compare per token.
      std::make_heap(cand_.begin(), kth, by_logit);
      for (size_t i = k; i < cand_.size(); ++i) {
        if (by_logit(cand_[i], cand_[0])) {
          std::pop_heap(cand_.begin(), kth, by_logit);
          cand_[k - 1] = cand_[i];
          std::push_heap(cand_.begin(), kth, by_logit);
        }
      }
    } else {
      std::nth_element(cand_.begin(), kth, cand_.end(), by_logit);
    }
    cand_.resize(k);
    std::sort(cand_.begin(), cand_.end(), by_logit);
    sorted_ = true;
  }

  // Temperature and softmax.
  float max_l = kNegInf;
  for (const Candidate& c : cand_) max_l = std::max(max_l, c.logit);
  if (max_l == std::numeric_limits<float>::infinity()) {
    return invalid_argument("sampler: a logit overflowed to +inf after logit bias and penalties");
  }
  const float temp = params_.temperature;
  double sum = 0.0;
  for (Candidate& c : cand_) {
    c.p = std::exp((c.logit - max_l) / temp);
    sum += c.p;
  }
  const float inv_sum = static_cast<float>(1.0 / sum);
  float p_max = 0.0f;
  for (Candidate& c : cand_) {
    c.p *= inv_sum;
    p_max = std::max(p_max, c.p);
  }
  std::erase_if(cand_, [](const Candidate& c) { return !(c.p > 0.0f); });  // underflowed: can never be drawn

  // Min-p before top-p: both keep a prefix of the descending-p order, so the result is the same as
  // top-p then min-p, and the linear min-p pass shrinks what top-p has to sort.
  if (params_.min_p > 0.0f) {
    const float threshold = params_.min_p * p_max;
    std::erase_if(cand_, [threshold](const Candidate& c) { return c.p < threshold; });
  }
  top_p_cut();

  kept_mass_ = 0.0;
  for (const Candidate& c : cand_) kept_mass_ += c.p;
  return Status();
}

// Keeps the smallest descending-p prefix with mass >= top_p (mass measured with the p's of the
// softmax, before min-p removed anything). Sorts only as much as it needs: partial sorts of growing
// chunks (128, 1K, 8K, ...), each over what is left, and one plain sort once a chunk would cover a
// quarter of the rest. Worst case (a nearly flat distribution over a 250K vocabulary, where the
// nucleus is most of it): a full sort, tens of ms; peaked LLM distributions stop in the first chunks.
void Sampler::top_p_cut() {
  const double top_p = params_.top_p;
  if (top_p >= 1.0) return;
  auto by_p = [](const Candidate& a, const Candidate& b) { return a.p != b.p ? a.p > b.p : a.id < b.id; };
  const size_t n = cand_.size();
  double cum = 0.0;
  size_t done = 0;
  size_t chunk = 128;
  while (done < n) {
    size_t m = std::min(n, done + chunk);
    if (!sorted_ && (m - done) * 4 >= n - done) {  // most of what is left: a full sort is cheaper
      std::sort(cand_.begin() + static_cast<std::ptrdiff_t>(done), cand_.end(), by_p);
      sorted_ = true;
      m = n;
    } else if (!sorted_) {
      std::partial_sort(cand_.begin() + static_cast<std::ptrdiff_t>(done),
                        cand_.begin() + static_cast<std::ptrdiff_t>(m), cand_.end(), by_p);
    }
    for (size_t i = done; i < m; ++i) {
      cum += cand_[i].p;
      if (cum >= top_p) {
        cand_.resize(i + 1);
        sorted_ = true;
        return;
      }
    }
    done = m;
    chunk *= 8;
  }
  sorted_ = true;  // the nucleus spans everything left (rounding kept the mass just below top_p)
}

Result<int32_t> Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  DF_RETURN_IF_ERROR(run_chain(logits, history));
  if (params_.greedy()) return cand_[0].id;
  const double u = uniform() * kept_mass_;
  double cum = 0.0;
  for (const Candidate& c : cand_) {
    cum += c.p;
    if (u < cum) return c.id;
  }
  return cand_.back().id;  // u within rounding of the total mass
}

Status Sampler::probabilities_into(std::span<const float> logits, std::span<const int32_t> history,
                                   std::vector<float>* out) {
  DF_RETURN_IF_ERROR(run_chain(logits, history));
  out->assign(logits.size(), 0.0f);
  const double inv = 1.0 / kept_mass_;
  for (const Candidate& c : cand_) (*out)[static_cast<size_t>(c.id)] = static_cast<float>(c.p * inv);
  return Status();
}

Result<std::vector<float>> Sampler::probabilities(std::span<const float> logits,
                                                  std::span<const int32_t> history) {
  std::vector<float> out;
  DF_RETURN_IF_ERROR(probabilities_into(logits, history, &out));
  return out;
}

Result<int32_t> Sampler::sample_from(std::span<const float> probs) {
  if (probs.empty()) return invalid_argument("sampler: empty probability row");
  if (probs.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return invalid_argument("sampler: probability row of {} entries exceeds the int32 token id range",
                            probs.size());
  }
  double sum = 0.0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const float p = probs[i];
    if (!(p >= 0.0f) || !finite(p)) {
      return invalid_argument("sampler: probability of token {} is {} (must be finite and >= 0)", i, p);
    }
    sum += p;
  }
  if (!(sum > 0.0)) return invalid_argument("sampler: every probability is zero");
  const double u = uniform() * sum;
  double cum = 0.0;
  int32_t last = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] == 0.0f) continue;
    cum += probs[i];
    last = static_cast<int32_t>(i);
    if (u < cum) return last;
  }
  return last;
}

Status logit_fault(int64_t token, float logit) {
  return invalid_argument("sampler: logit of token {} is {} (a numeric fault upstream)", token, logit);
}

Status all_masked(int64_t vocab) {
  return invalid_argument("sampler: every token is masked (all {} logits are -inf)", vocab);
}

Result<int32_t> checked_greedy(int32_t id, float best, int64_t vocab) {
  if (!(best < std::numeric_limits<float>::infinity())) return logit_fault(id, best);
  if (best == -std::numeric_limits<float>::infinity()) return all_masked(vocab);
  return id;
}

}  // namespace dflash

#include "decode/runner.h"

#include <numeric>

namespace dflash {

Result<StepOutput> Runner::forward(SequenceState& state, const Step& step) {
  const ModelSpec& s = w_.spec();
  const int64_t n = static_cast<int64_t>(step.tokens.size());
  if (n == 0) return invalid_argument("a step needs at least one token");
  for (int32_t t : step.tokens)
    if (t < 0 || t >= s.vocab) return invalid_argument("token id {} is outside the vocabulary of {}", t, s.vocab);
  std::vector<int32_t> positions;
  if (step.positions.empty()) {
    positions.resize(static_cast<size_t>(n));
    std::iota(positions.begin(), positions.end(), static_cast<int32_t>(state.n_past()));
  } else {
    if (static_cast<int64_t>(step.positions.size()) != n)
      return invalid_argument("{} positions for {} tokens", step.positions.size(), n);
    positions.assign(step.positions.begin(), step.positions.end());
  }
  if (s.max_context > 0 && state.n_past() + n > s.max_context)
    return invalid_argument("{} tokens after {} exceed the model's context of {}", n, state.n_past(), s.max_context);

  DF_RETURN_IF_ERROR(state.status());
  Backend& be = *be_;
  DF_ASSIGN_OR_RETURN(Buffer x, be.alloc(n * s.hidden));
  DF_RETURN_IF_ERROR(embed_tokens(w_, step.tokens, x.data(), be));
  std::vector<Buffer> feature_bufs;
  std::vector<float*> captured;
  for (size_t c = 0; c < step.capture_layers.size(); ++c) {
    DF_ASSIGN_OR_RETURN(Buffer f, be.alloc(n * s.hidden));
    captured.push_back(f.data());
    feature_bufs.push_back(std::move(f));
  }
  StepShape shape{n, state.n_past(), positions, step.mask, step.parents, step.capture_recurrent};
  if (step.capture_recurrent && step.mask == cpu::MaskKind::kCausal) state.begin_captured_step(n);
  DF_RETURN_IF_ERROR(forward_layers(w_, 0, s.n_layers, shape, x.data(), state, step.capture_layers, captured, be));
  DF_RETURN_IF_ERROR(state.status());

  std::vector<int64_t> rows;
  if (step.all_logits) {
    rows.resize(static_cast<size_t>(n));
    std::iota(rows.begin(), rows.end(), 0);
  } else {
    rows.push_back(n - 1);
  }
  StepOutput out;
  out.rows = static_cast<int64_t>(rows.size());
  DF_ASSIGN_OR_RETURN(Buffer logits, be.alloc(out.rows * s.vocab));
  DF_RETURN_IF_ERROR(lm_head(w_, x.data(), rows, logits.data(), be));
  out.logits.resize(static_cast<size_t>(out.rows * s.vocab));
  DF_RETURN_IF_ERROR(be.download(out.logits.data(), logits.data(), out.rows * s.vocab));
  for (auto& f : feature_bufs) {
    out.features.emplace_back(static_cast<size_t>(n * s.hidden));
    DF_RETURN_IF_ERROR(be.download(out.features.back().data(), f.data(), n * s.hidden));
  }
  if (step.mask != cpu::MaskKind::kTree) state.set_n_past(state.n_past() + n);
  return out;
}

Result<std::vector<float>> Runner::prefill(SequenceState& state, std::span<const int32_t> tokens, int64_t chunk) {
  if (tokens.empty()) return invalid_argument("nothing to prefill");
  std::vector<float> last;
  for (size_t off = 0; off < tokens.size(); off += static_cast<size_t>(chunk)) {
    const size_t len = std::min(tokens.size() - off, static_cast<size_t>(chunk));
    Step step;
    step.tokens = tokens.subspan(off, len);
    DF_ASSIGN_OR_RETURN(StepOutput o, forward(state, step));
    last = std::move(o.logits);
  }
  return last;
}

}  // namespace dflash

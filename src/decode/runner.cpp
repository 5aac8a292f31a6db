#include "decode/runner.h"

#include <algorithm>
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
  const bool plain_decode = n == 1 && step.positions.empty() && step.mask == cpu::MaskKind::kCausal &&
                            !step.capture_recurrent && !step.logits_on_device;
  if (plain_decode && graphs_on_ && be_->step_graphs_supported()) {
    bool used = false;
    auto out = decode_recorded(state, step, &used);
    if (used || !out.ok()) return out;
  }

  Backend& be = *be_;
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
  std::vector<Buffer> feature_bufs;
  if (step.capture_recurrent && step.mask == cpu::MaskKind::kCausal) state.begin_captured_step(n);
  // A verify step (rolled back or committed node by node) computes every token as a one-token step would.
  const bool verify = step.capture_recurrent || step.mask == cpu::MaskKind::kTree;
  if (verify) be.set_token_exact(true);
  const Status run = run_layers(state, step, positions, rows, logits.data(), feature_bufs);
  if (verify) be.set_token_exact(false);
  DF_RETURN_IF_ERROR(run);
  if (step.logits_on_device) {
    out.device_logits = std::move(logits);
  } else {
    out.logits.resize(static_cast<size_t>(out.rows * s.vocab));
    DF_RETURN_IF_ERROR(be.download(out.logits.data(), logits.data(), out.rows * s.vocab));
  }
  for (auto& f : feature_bufs) {
    out.features.emplace_back(static_cast<size_t>(n * s.hidden));
    DF_RETURN_IF_ERROR(be.download(out.features.back().data(), f.data(), n * s.hidden));
  }
  if (step.mask != cpu::MaskKind::kTree) state.set_n_past(state.n_past() + n);
  return out;
}

Runner::~Runner() {
  for (auto& [key, r] : recorded_)
    if (r.id >= 0) be_->drop_step(r.id);
}

Status Runner::run_layers(SequenceState& state, const Step& step, std::span<const int32_t> positions,
                          std::span<const int64_t> rows, float* logits, std::vector<Buffer>& feature_bufs) {
  const ModelSpec& s = w_.spec();
  const int64_t n = static_cast<int64_t>(step.tokens.size());
  Backend& be = *be_;
  DF_ASSIGN_OR_RETURN(Buffer x, be.alloc(n * s.hidden));
  DF_RETURN_IF_ERROR(embed_tokens(w_, step.tokens, x.data(), be));
  // Capture buffers: the caller's when it passes them (a recording allocates its own before it starts: what
  // is allocated while recording belongs to the recording), else new ones.
  if (feature_bufs.size() != step.capture_layers.size()) {
    feature_bufs.clear();
    for (size_t c = 0; c < step.capture_layers.size(); ++c) {
      DF_ASSIGN_OR_RETURN(Buffer f, be.alloc(n * s.hidden));
      feature_bufs.push_back(std::move(f));
    }
  }
  std::vector<float*> captured;
  for (const Buffer& f : feature_bufs) captured.push_back(f.data());
  StepShape shape{n, state.n_past(), positions, step.mask, step.parents, step.capture_recurrent};
  DF_RETURN_IF_ERROR(forward_layers(w_, 0, s.n_layers, shape, x.data(), state, step.capture_layers, captured, be));
  DF_RETURN_IF_ERROR(state.status());
  return lm_head(w_, x.data(), rows, logits, be);
}

Result<StepOutput> Runner::decode_recorded(SequenceState& state, const Step& step, bool* used) {
  constexpr int kMaxFailures = 3;
  // Sequences with a recording (at least serve's --parallel maximum, so round-robin slots keep theirs);
  // the least recently used goes first.
  constexpr size_t kMaxRecorded = 64;
  *used = false;
  const ModelSpec& s = w_.spec();
  const int64_t pos = state.n_past();
  // The recording does not run the host side of the layers: reserve this position's KV chunks first.
  for (int64_t L = 0; L < s.n_layers; ++L)
    if (!s.is_recurrent(L)) DF_RETURN_IF_ERROR(state.reserve_kv(L, pos + 1));
  // One entry for the sequence; std::map references stay valid (eviction skips this sequence).
  Recorded& rec = recorded_[state.id()];
  rec.last_use = ++uses_;
  const bool same_captures = std::equal(rec.capture_layers.begin(), rec.capture_layers.end(),
                                        step.capture_layers.begin(), step.capture_layers.end());
  if (rec.id >= 0 && (rec.layout != state.layout_version() || !same_captures)) {
    be_->drop_step(rec.id);
    rec.id = -1;
  }
  if (rec.id < 0) {
    if (rec.failures >= kMaxFailures) return StepOutput{};
    if (recorded_.size() > kMaxRecorded) {  // forget the least recently used other sequence
      auto victim = recorded_.end();
      for (auto it = recorded_.begin(); it != recorded_.end(); ++it)
        if (it->first != state.id() && (victim == recorded_.end() || it->second.last_use < victim->second.last_use))
          victim = it;
      if (victim != recorded_.end()) {
        if (victim->second.id >= 0) be_->drop_step(victim->second.id);
        recorded_.erase(victim);
      }
    }
    auto logits = be_->alloc(s.vocab);
    if (!logits.ok()) return logits.status();
    std::vector<Buffer> features;  // where the recording leaves the captured layers, allocated before it starts
    for (size_t c = 0; c < step.capture_layers.size(); ++c) {
      auto f = be_->alloc(s.hidden);
      if (!f.ok()) return f.status();
      features.push_back(std::move(f).value());
    }
    if (!be_->begin_step_capture().ok()) {
      ++rec.failures;
      return StepOutput{};
    }
    const int32_t position = static_cast<int32_t>(pos);
    const int64_t last = 0;
    Status st = run_layers(state, step, std::span<const int32_t>(&position, 1), std::span<const int64_t>(&last, 1),
                           logits->data(), features);
    if (!st.ok()) {
      be_->abort_step_capture();
      ++rec.failures;
      return StepOutput{};  // run it eagerly: an error there is a real one
    }
    auto id = be_->end_step_capture();
    if (!id.ok()) {
      ++rec.failures;
      return StepOutput{};
    }
    rec.id = *id;
    rec.layout = state.layout_version();
    rec.logits = std::move(logits).value();
    rec.capture_layers.assign(step.capture_layers.begin(), step.capture_layers.end());
    rec.features = std::move(features);
  }
  const Status st = be_->replay_step(rec.id, step.tokens[0], pos);
  if (st.code() == ErrorCode::kNotFound) {  // invalidated: record again next step, run this one eagerly
    rec.id = -1;
    return StepOutput{};
  }
  DF_RETURN_IF_ERROR(st);
  StepOutput out;
  out.rows = 1;
  out.logits.resize(static_cast<size_t>(s.vocab));
  DF_RETURN_IF_ERROR(be_->download(out.logits.data(), rec.logits.data(), s.vocab));
  for (const Buffer& f : rec.features) {
    out.features.emplace_back(static_cast<size_t>(s.hidden));
    DF_RETURN_IF_ERROR(be_->download(out.features.back().data(), f.data(), s.hidden));
  }
  state.set_n_past(pos + 1);
  *used = true;
  ++replayed_;
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

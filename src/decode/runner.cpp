#include "decode/runner.h"

#include <algorithm>
#include <chrono>
#include <numeric>

namespace dflash {

Runner::Runner(const Weights& weights, int threads) : owned_(std::make_unique<CpuBackend>(threads)) {
  shards_.push_back(RunnerShard{&weights, owned_.get(), 0, weights.spec().n_layers});
}

Runner::Runner(const Weights& weights, Backend& backend) {
  shards_.push_back(RunnerShard{&weights, &backend, 0, weights.spec().n_layers});
}

Result<std::unique_ptr<Runner>> Runner::create(std::vector<RunnerShard> shards) {
  if (shards.empty()) return invalid_argument("a placement needs at least one shard");
  const ModelSpec& s = shards.front().weights->spec();
  int64_t next = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const RunnerShard& sh = shards[i];
    if (sh.weights == nullptr || sh.backend == nullptr) return invalid_argument("shard {} has no weights or backend", i);
    if (sh.weights->spec().n_layers != s.n_layers || sh.weights->spec().hidden != s.hidden)
      return invalid_argument("shard {} holds another model than shard 0", i);
    if (sh.layer_begin != next || sh.layer_end <= sh.layer_begin)
      return invalid_argument("shard {} has layers [{}, {}); it must start at {} and hold at least one", i,
                              sh.layer_begin, sh.layer_end, next);
    next = sh.layer_end;
  }
  if (next != s.n_layers) return invalid_argument("the shards end at layer {} of {}", next, s.n_layers);
  return std::unique_ptr<Runner>(new Runner(std::move(shards)));
}

std::vector<StateShard> Runner::state_layout() const {
  std::vector<StateShard> out;
  for (const RunnerShard& sh : shards_) out.push_back(StateShard{sh.backend, sh.layer_begin, sh.layer_end});
  return out;
}

const RunnerShard& Runner::shard_of(int64_t layer) const {
  for (const RunnerShard& sh : shards_)
    if (layer < sh.layer_end) return sh;
  return shards_.back();
}

bool Runner::one_backend() const {
  for (const RunnerShard& sh : shards_)
    if (sh.backend != shards_.front().backend) return false;
  return true;
}

Result<Buffer> Runner::hand_off(const float* x, int64_t n, Backend& from, Backend& to) {
  const auto t0 = std::chrono::steady_clock::now();
  DF_ASSIGN_OR_RETURN(Buffer out, to.alloc(n));
  if (!from.device_memory()) {
    DF_RETURN_IF_ERROR(to.upload(out.data(), x, n));
  } else if (!to.device_memory()) {
    DF_RETURN_IF_ERROR(from.download(out.data(), x, n));
  } else if (const Status peer = to.copy_from_peer(out.data(), from, x, n); peer.code() == ErrorCode::kUnsupported) {
    std::vector<float> host(static_cast<size_t>(n));  // device to device through the host
    DF_RETURN_IF_ERROR(from.download(host.data(), x, n));
    DF_RETURN_IF_ERROR(to.upload(out.data(), host.data(), n));
  } else {
    DF_RETURN_IF_ERROR(peer);
  }
  ++handoffs_.count;
  handoffs_.bytes += static_cast<uint64_t>(n) * sizeof(float);
  handoffs_.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

Result<StepOutput> Runner::forward(SequenceState& state, const Step& step) {
  const ModelSpec& s = spec();
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
  if (plain_decode && graphs_on_ && one_backend() && backend().step_graphs_supported()) {
    bool used = false;
    auto out = decode_recorded(state, step, &used);
    if (used || !out.ok()) return out;
  }

  Backend& be = backend();
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
  for (size_t c = 0; c < feature_bufs.size(); ++c) {
    out.features.emplace_back(static_cast<size_t>(n * s.hidden));
    DF_RETURN_IF_ERROR(shard_of(step.capture_layers[c])
                           .backend->download(out.features.back().data(), feature_bufs[c].data(), n * s.hidden));
  }
  if (step.mask != cpu::MaskKind::kTree) state.set_n_past(state.n_past() + n);
  return out;
}

Runner::~Runner() {
  for (auto& [key, r] : recorded_)
    if (r.id >= 0) backend().drop_step(r.id);
}

Status Runner::run_layers(SequenceState& state, const Step& step, std::span<const int32_t> positions,
                          std::span<const int64_t> rows, float* logits, std::vector<Buffer>& feature_bufs) {
  const ModelSpec& s = spec();
  const int64_t n = static_cast<int64_t>(step.tokens.size());
  const RunnerShard& first = shards_.front();
  DF_ASSIGN_OR_RETURN(Buffer x, first.backend->alloc(n * s.hidden));
  DF_RETURN_IF_ERROR(embed_tokens(*first.weights, step.tokens, x.data(), *first.backend));
  // Capture buffers, each in the memory of the shard that owns its layer: the caller's when it passes them (a
  // recording allocates its own before it starts: what is allocated while recording belongs to the
  // recording), else new ones.
  if (feature_bufs.size() != step.capture_layers.size()) {
    feature_bufs.clear();
    for (int64_t layer : step.capture_layers) {
      DF_ASSIGN_OR_RETURN(Buffer f, shard_of(layer).backend->alloc(n * s.hidden));
      feature_bufs.push_back(std::move(f));
    }
  }
  StepShape shape{n, state.n_past(), positions, step.mask, step.parents, step.capture_recurrent};
  Backend* at = first.backend;  // where x is
  for (const RunnerShard& sh : shards_) {
    if (sh.backend != at) {
      DF_ASSIGN_OR_RETURN(Buffer moved, hand_off(x.data(), n * s.hidden, *at, *sh.backend));
      x = std::move(moved);
      at = sh.backend;
    }
    // This shard's capture layers.
    std::vector<int64_t> captures;
    std::vector<float*> captured;
    for (size_t c = 0; c < step.capture_layers.size(); ++c)
      if (step.capture_layers[c] >= sh.layer_begin && step.capture_layers[c] < sh.layer_end) {
        captures.push_back(step.capture_layers[c]);
        captured.push_back(feature_bufs[c].data());
      }
    DF_RETURN_IF_ERROR(
        forward_layers(*sh.weights, sh.layer_begin, sh.layer_end, shape, x.data(), state, captures, captured, *sh.backend));
  }
  DF_RETURN_IF_ERROR(state.status());
  return lm_head(*shards_.back().weights, x.data(), rows, logits, *shards_.back().backend);
}

Result<StepOutput> Runner::decode_recorded(SequenceState& state, const Step& step, bool* used) {
  constexpr int kMaxFailures = 3;
  // Sequences with a recording (at least serve's --parallel maximum, so round-robin slots keep theirs);
  // the least recently used goes first.
  constexpr size_t kMaxRecorded = 64;
  *used = false;
  const ModelSpec& s = spec();
  Backend& be = backend();
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
    be.drop_step(rec.id);
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
        if (victim->second.id >= 0) be.drop_step(victim->second.id);
        recorded_.erase(victim);
      }
    }
    auto logits = be.alloc(s.vocab);
    if (!logits.ok()) return logits.status();
    std::vector<Buffer> features;  // where the recording leaves the captured layers, allocated before it starts
    for (size_t c = 0; c < step.capture_layers.size(); ++c) {
      auto f = be.alloc(s.hidden);
      if (!f.ok()) return f.status();
      features.push_back(std::move(f).value());
    }
    if (!be.begin_step_capture().ok()) {
      ++rec.failures;
      return StepOutput{};
    }
    const int32_t position = static_cast<int32_t>(pos);
    const int64_t last = 0;
    Status st = run_layers(state, step, std::span<const int32_t>(&position, 1), std::span<const int64_t>(&last, 1),
                           logits->data(), features);
    if (!st.ok()) {
      be.abort_step_capture();
      ++rec.failures;
      return StepOutput{};  // run it eagerly: an error there is a real one
    }
    auto id = be.end_step_capture();
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
  const Status st = be.replay_step(rec.id, step.tokens[0], pos);
  if (st.code() == ErrorCode::kNotFound) {  // invalidated: record again next step, run this one eagerly
    rec.id = -1;
    return StepOutput{};
  }
  DF_RETURN_IF_ERROR(st);
  StepOutput out;
  out.rows = 1;
  out.logits.resize(static_cast<size_t>(s.vocab));
  DF_RETURN_IF_ERROR(be.download(out.logits.data(), rec.logits.data(), s.vocab));
  for (const Buffer& f : rec.features) {
    out.features.emplace_back(static_cast<size_t>(s.hidden));
    DF_RETURN_IF_ERROR(be.download(out.features.back().data(), f.data(), s.hidden));
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

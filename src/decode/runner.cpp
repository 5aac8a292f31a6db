#include "decode/runner.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "decode/sampler.h"

namespace dflash {

Runner::Runner(const Weights& weights, int threads) : owned_(std::make_unique<CpuBackend>(threads)) {
  shards_.push_back(RunnerShard{&weights, owned_.get(), 0, weights.spec().n_layers});
  layout_ = {StateShard{owned_.get(), 0, weights.spec().n_layers}};
}

Runner::Runner(const Weights& weights, Backend& backend)
    : Runner(std::vector<RunnerShard>{RunnerShard{&weights, &backend, 0, weights.spec().n_layers}}) {}

Runner::Runner(std::vector<RunnerShard> shards) : shards_(std::move(shards)) {
  bool devices = !shards_.empty();
  for (const RunnerShard& sh : shards_) {
    layout_.push_back(StateShard{sh.backend, sh.layer_begin, sh.layer_end});
    devices = devices && sh.backend != nullptr && sh.backend->device_memory();
  }
  if (devices) prefill_chunk_ = kDevicePrefillChunk;
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

const RunnerShard& Runner::shard_of(int64_t layer) const {
  for (const RunnerShard& sh : shards_)
    if (layer < sh.layer_end) return sh;
  return shards_.back();
}

bool Runner::records_steps() const {
  for (const RunnerShard& sh : shards_)
    if (!sh.backend->step_graphs_supported()) return false;
  return true;
}

Result<Buffer> Runner::hand_off(const float* x, int64_t n, Backend& from, Backend& to) {
  DF_ASSIGN_OR_RETURN(Buffer out, to.alloc(n));
  DF_RETURN_IF_ERROR(hand_over(x, from, out.data(), to, n));
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
  if (!state.laid_out_as(layout_))
    return invalid_argument("the sequence state is laid out for another placement than this runner's");
  // A verify step (rolled back or committed node by node) computes every token as a one-token step would.
  const bool tree = step.mask == cpu::MaskKind::kTree;
  const bool verify = step.capture_recurrent || tree;
  const bool token_exact = token_exact_step(verify, n);
  if (graphs_on_ && records_steps()) {
    const bool causal = step.mask == cpu::MaskKind::kCausal && step.positions.empty();
    const bool plain_decode = n == 1 && causal && !step.capture_recurrent;
    const bool verify_shape = verify_graphs_on_ && verify && (tree || causal) && step.all_logits &&
                              step.logits_on_device && n <= kMaxRecordedVerify;
    if (plain_decode || verify_shape) {
      bool used = false;
      const RecordedKind kind = plain_decode ? RecordedKind::kDecode : tree ? RecordedKind::kTree : RecordedKind::kChain;
      auto out = forward_recorded(state, step, positions, kind, &used);
      if (used || !out.ok()) return out;
    }
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
  if (token_exact) set_token_exact(true);
  const Status run = run_layers(state, step, positions, rows, logits.data(), feature_bufs);
  if (token_exact) set_token_exact(false);
  DF_RETURN_IF_ERROR(run);
  if (step.logits_on_device) {
    out.device_logits = std::move(logits);
  } else {
    out.logits.resize(static_cast<size_t>(out.rows * s.vocab));
    DF_RETURN_IF_ERROR(be.download(out.logits.data(), logits.data(), out.rows * s.vocab));
  }
  if (step.features_on_device) {
    out.device_features = std::move(feature_bufs);
  } else {
    for (size_t c = 0; c < feature_bufs.size(); ++c) {
      out.features.emplace_back(static_cast<size_t>(n * s.hidden));
      DF_RETURN_IF_ERROR(shard_of(step.capture_layers[c])
                             .backend->download(out.features.back().data(), feature_bufs[c].data(), n * s.hidden));
    }
  }
  if (step.mask != cpu::MaskKind::kTree) state.set_n_past(state.n_past() + n);
  return out;
}

Result<int32_t> Runner::greedy_token(const StepOutput& out) {
  const int64_t V = spec().vocab;
  if (out.rows < 1 || out.device_logits.data() == nullptr || out.device_logits.size() < out.rows * V)
    return invalid_argument("greedy_token: the step left no logits on the device (Step::logits_on_device)");
  int32_t id = -1;
  float best = 0;
  DF_RETURN_IF_ERROR(
      backend().top_k_rows(out.device_logits.data() + (out.rows - 1) * V, 1, V, 1, &id, &best, nullptr));
  return checked_greedy(id, best, V);
}

Runner::~Runner() {
  for (auto& [key, r] : recorded_) drop(r);
}

void Runner::drop(Recorded& r) {
  for (size_t k = 0; k < r.ids.size(); ++k)
    if (r.ids[k] >= 0) shards_[k].backend->drop_step(r.ids[k]);
  r.ids.clear();
}

Status Runner::hand_over(const float* src, Backend& from, float* dst, Backend& to, int64_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  Status st;
  if (!from.device_memory()) {
    st = to.upload(dst, src, n);
  } else if (!to.device_memory()) {
    st = from.download(dst, src, n);
  } else {
    st = to.copy_from_peer(dst, from, src, n);
    if (st.code() == ErrorCode::kUnsupported) {  // device to device through the host
      std::vector<float> host(static_cast<size_t>(n));
      st = from.download(host.data(), src, n);
      if (st.ok()) st = to.upload(dst, host.data(), n);
    }
  }
  DF_RETURN_IF_ERROR(st);
  ++handoffs_.count;
  handoffs_.bytes += static_cast<uint64_t>(n) * sizeof(float);
  handoffs_.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return Status();
}

Status Runner::run_shard(size_t k, SequenceState& state, const Step& step, const StepShape& shape,
                         std::span<const int64_t> rows, float* x, float* logits, std::vector<Buffer>& feature_bufs) {
  const RunnerShard& sh = shards_[k];
  if (k == 0) DF_RETURN_IF_ERROR(embed_tokens(*sh.weights, step.tokens, x, *sh.backend));
  std::vector<int64_t> captures;  // this shard's capture layers
  std::vector<float*> captured;
  for (size_t c = 0; c < step.capture_layers.size(); ++c)
    if (step.capture_layers[c] >= sh.layer_begin && step.capture_layers[c] < sh.layer_end) {
      captures.push_back(step.capture_layers[c]);
      captured.push_back(feature_bufs[c].data());
    }
  DF_RETURN_IF_ERROR(
      forward_layers(*sh.weights, sh.layer_begin, sh.layer_end, shape, x, state, captures, captured, *sh.backend));
  if (k + 1 < shards_.size()) return Status();
  DF_RETURN_IF_ERROR(state.status());
  return lm_head(*sh.weights, x, rows, logits, *sh.backend);
}

Status Runner::run_layers(SequenceState& state, const Step& step, std::span<const int32_t> positions,
                          std::span<const int64_t> rows, float* logits, std::vector<Buffer>& feature_bufs) {
  const ModelSpec& s = spec();
  const int64_t n = static_cast<int64_t>(step.tokens.size());
  // Capture buffers, each in the memory of the shard that owns its layer: the caller's when it passes them, else
  // new ones.
  if (feature_bufs.size() != step.capture_layers.size()) {
    feature_bufs.clear();
    for (int64_t layer : step.capture_layers) {
      DF_ASSIGN_OR_RETURN(Buffer f, shard_of(layer).backend->alloc(n * s.hidden));
      feature_bufs.push_back(std::move(f));
    }
  }
  const StepShape shape{n, state.n_past(), positions, step.mask, step.parents, step.capture_recurrent};
  DF_ASSIGN_OR_RETURN(Buffer x, shards_.front().backend->alloc(n * s.hidden));
  for (size_t k = 0; k < shards_.size(); ++k) {
    if (k > 0 && shards_[k].backend != shards_[k - 1].backend) {
      DF_ASSIGN_OR_RETURN(Buffer moved, hand_off(x.data(), n * s.hidden, *shards_[k - 1].backend, *shards_[k].backend));
      x = std::move(moved);
    }
    DF_RETURN_IF_ERROR(run_shard(k, state, step, shape, rows, x.data(), logits, feature_bufs));
  }
  return Status();
}

void Runner::set_exact_decode(bool on) {
  if (on == exact_decode_) return;
  exact_decode_ = on;
  for (auto& [key, rec] : recorded_) drop(rec);
  recorded_.clear();
}

void Runner::set_token_exact(bool on) {
  for (const RunnerShard& sh : shards_) sh.backend->set_token_exact(on);
}

Result<bool> Runner::record(Recorded& rec, SequenceState& state, const Step& step, std::span<const int32_t> positions,
                            const StepValues& values, bool token_exact) {
  const ModelSpec& s = spec();
  const auto n = static_cast<int64_t>(step.tokens.size());
  const int64_t n_rows = step.all_logits ? n : 1;
  // What the recordings read and leave, allocated before they start (what is allocated while recording
  // belongs to the recording): each shard's residual rows, the logits, the captured layers.
  std::vector<Buffer> xs;
  for (const RunnerShard& sh : shards_) {
    DF_ASSIGN_OR_RETURN(Buffer x, sh.backend->alloc(n * s.hidden));
    xs.push_back(std::move(x));
  }
  DF_ASSIGN_OR_RETURN(Buffer logits, backend().alloc(n_rows * s.vocab));
  std::vector<Buffer> features;
  for (int64_t layer : step.capture_layers) {
    DF_ASSIGN_OR_RETURN(Buffer f, shard_of(layer).backend->alloc(n * s.hidden));
    features.push_back(std::move(f));
  }
  std::vector<int64_t> rows(static_cast<size_t>(n_rows));
  std::iota(rows.begin(), rows.end(), n - n_rows);
  const int64_t pos = state.n_past();
  const StepShape shape{n, pos, positions, step.mask, step.parents, step.capture_recurrent};
  if (step.capture_recurrent && step.mask == cpu::MaskKind::kCausal) state.begin_captured_step(n);
  // One recording per shard: its part of the step, from its residual rows (the embedding on the first).
  state.set_recording(true);
  if (token_exact) set_token_exact(true);
  bool ok = true;
  for (size_t k = 0; k < shards_.size() && ok; ++k) {
    Backend& be = *shards_[k].backend;
    Status st = be.begin_step_capture(values);
    if (st.ok()) {
      st = run_shard(k, state, step, shape, rows, xs[k].data(), logits.data(), features);
      if (!st.ok()) be.abort_step_capture();
    }
    Result<int64_t> id = st.ok() ? be.end_step_capture() : Result<int64_t>(st);
    if (id.ok()) rec.ids.push_back(*id);
    ok = id.ok();
  }
  if (token_exact) set_token_exact(false);
  state.set_recording(false);
  if (!ok) {  // run it eagerly: an error there is a real one
    drop(rec);
    ++rec.failures;
    return false;
  }
  ++recordings_;
  rec.layout = state.layout_version();
  rec.xs = std::move(xs);
  rec.logits = std::move(logits);
  rec.capture_layers.assign(step.capture_layers.begin(), step.capture_layers.end());
  rec.features = std::move(features);
  rec.marks = state.step_marks(pos);
  return true;
}

Result<StepOutput> Runner::forward_recorded(SequenceState& state, const Step& step, std::span<const int32_t> positions,
                                            RecordedKind kind, bool* used) {
  constexpr int kMaxFailures = 3;
  // Recordings kept (at least serve's --parallel maximum of sequences, each with its shapes, so round-robin
  // slots keep theirs); the least recently used goes first.
  constexpr size_t kMaxRecorded = 64;
  *used = false;
  const ModelSpec& s = spec();
  const auto n = static_cast<int64_t>(step.tokens.size());
  const int64_t pos = state.n_past();
  const bool verify = kind != RecordedKind::kDecode;
  // The recording does not run the host side of the layers: reserve this step's KV chunks first.
  for (int64_t L = 0; L < s.n_layers; ++L)
    if (!s.is_recurrent(L)) DF_RETURN_IF_ERROR(state.reserve_kv(L, pos + n));
  const RecordedKey key{state.id(), kind, n};
  // std::map references stay valid (eviction skips this entry).
  Recorded& rec = recorded_[key];
  rec.last_use = ++uses_;
  const bool same_captures = std::equal(rec.capture_layers.begin(), rec.capture_layers.end(),
                                        step.capture_layers.begin(), step.capture_layers.end());
  bool replayable = rec.layout == state.layout_version() && same_captures;
  for (size_t k = 0; k < rec.ids.size() && replayable; ++k)
    replayable = shards_[k].backend->step_replayable(rec.ids[k]);
  if (!rec.ids.empty() && !replayable) drop(rec);
  const StepValues values{step.tokens, positions, step.parents, pos, pos, pos + n};
  if (rec.ids.empty()) {
    if (rec.failures >= kMaxFailures) return StepOutput{};
    // The first step of a verify shape runs eagerly: it allocates the capture buffers the step needs.
    if (verify && rec.seen++ == 0) return StepOutput{};
    if (recorded_.size() > kMaxRecorded) {  // forget the least recently used other recording
      auto victim = recorded_.end();
      for (auto it = recorded_.begin(); it != recorded_.end(); ++it)
        if (it->first.state != key.state && (victim == recorded_.end() || it->second.last_use < victim->second.last_use))
          victim = it;
      if (victim != recorded_.end()) {
        drop(victim->second);
        recorded_.erase(victim);
      }
    }
    DF_ASSIGN_OR_RETURN(const bool recorded,
                        record(rec, state, step, positions, values, token_exact_step(verify, n)));
    if (!recorded) return StepOutput{};
  }
  if (step.capture_recurrent && step.mask == cpu::MaskKind::kCausal) state.begin_captured_step(n);
  for (size_t k = 0; k < shards_.size(); ++k) {
    if (k > 0) {
      DF_RETURN_IF_ERROR(hand_over(rec.xs[k - 1].data(), *shards_[k - 1].backend, rec.xs[k].data(),
                                   *shards_[k].backend, n * s.hidden));
    }
    DF_RETURN_IF_ERROR(shards_[k].backend->replay_step(rec.ids[k], values));
  }
  state.replay_step_marks(rec.marks);
  StepOutput out;
  out.rows = rec.logits.size() / s.vocab;
  if (step.logits_on_device) {  // the recording's own buffer: valid until the sequence's next step
    out.device_logits = Buffer(nullptr, rec.logits.data(), rec.logits.size());
  } else {
    out.logits.resize(static_cast<size_t>(rec.logits.size()));
    DF_RETURN_IF_ERROR(backend().download(out.logits.data(), rec.logits.data(), rec.logits.size()));
  }
  for (size_t c = 0; c < rec.features.size(); ++c) {
    Backend& fb = *shard_of(rec.capture_layers[c]).backend;
    const int64_t elems = rec.features[c].size();
    if (step.features_on_device && verify) {  // the recording's own buffers, as the logits
      out.device_features.push_back(Buffer(nullptr, rec.features[c].data(), elems));
    } else if (step.features_on_device) {  // a copy: a decoding sequence's next step overwrites them
      DF_ASSIGN_OR_RETURN(Buffer f, fb.alloc(elems));
      DF_RETURN_IF_ERROR(fb.copy(f.data(), rec.features[c].data(), elems));
      out.device_features.push_back(std::move(f));
    } else {
      out.features.emplace_back(static_cast<size_t>(elems));
      DF_RETURN_IF_ERROR(fb.download(out.features.back().data(), rec.features[c].data(), elems));
    }
  }
  if (step.mask != cpu::MaskKind::kTree) state.set_n_past(pos + n);
  *used = true;
  ++replayed_;
  return out;
}

Result<std::vector<float>> Runner::prefill(SequenceState& state, std::span<const int32_t> tokens, int64_t chunk) {
  if (tokens.empty()) return invalid_argument("nothing to prefill");
  if (chunk < 0) return invalid_argument("prefill: a chunk of {} tokens", chunk);
  if (chunk == 0) chunk = prefill_chunk_;
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

Status Runner::warm_up(int64_t max_tokens) {
  const int64_t vocab = spec().vocab;
  int64_t full = std::min(prefill_chunk_, max_tokens);  // a full prefill step, within the server's context
  if (spec().max_context > 0) full = std::min(full, spec().max_context);
  for (const int64_t n : {full, int64_t{100}, int64_t{8}}) {
    if (n < 1 || n > max_tokens || (spec().max_context > 0 && n > spec().max_context)) continue;
    SequenceState scratch(spec(), state_layout());
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % vocab);
    Step step;
    step.tokens = ids;
    DF_RETURN_IF_ERROR(forward(scratch, step).status());
  }
  for (const RunnerShard& sh : shards_) DF_RETURN_IF_ERROR(sh.backend->synchronize());
  return Status();
}

}  // namespace dflash

#include "decode/dflash.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <numeric>

#include "decode/ddtree.h"
#include "decode/sampler.h"
#include "model/forward.h"

namespace dflash {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void SpecStats::add(const SpecStats& o) {
  steps += o.steps;
  drafted += o.drafted;
  accepted += o.accepted;
  if (accepted_at.size() < o.accepted_at.size()) accepted_at.resize(o.accepted_at.size());
  for (size_t i = 0; i < o.accepted_at.size(); ++i) accepted_at[i] += o.accepted_at[i];
  draft_ms += o.draft_ms;
  tree_ms += o.tree_ms;
  verify_ms += o.verify_ms;
  commit_ms += o.commit_ms;
}

Result<std::unique_ptr<DFlashDraft>> DFlashDraft::create(const Weights& draft, const Weights& target, Backend& be) {
  const ModelSpec& d = draft.spec();
  const ModelSpec& t = target.spec();
  if (d.family != ModelFamily::kDFlashDraft)
    return invalid_argument("the draft is a {} model, not a DFlash draft", model_family_name(d.family));
  if (t.family == ModelFamily::kDFlashDraft) return invalid_argument("the target is itself a DFlash draft");
  if (d.hidden != t.hidden)
    return invalid_argument("the draft's hidden size {} differs from the target's {} (a DFlash draft shares the "
                            "target's embedding and LM head)", d.hidden, t.hidden);
  if (d.vocab != 0 && d.vocab != t.vocab)
    return invalid_argument("the draft's vocabulary ({}) differs from the target's ({})", d.vocab, t.vocab);
  if (d.n_target_layers && *d.n_target_layers != t.n_layers)
    return invalid_argument("the draft was made for a {}-layer target; this target has {} layers", *d.n_target_layers,
                            t.n_layers);
  for (int64_t id : d.target_layer_ids)
    if (id < 0 || id >= t.n_layers)
      return invalid_argument("the draft reads target layer {}, outside the target's {} layers", id, t.n_layers);
  if (!d.mask_token_id) return invalid_argument("the draft names no mask token id");
  if (*d.mask_token_id < 0 || *d.mask_token_id >= t.vocab)
    return invalid_argument("the draft's mask token id {} is outside the target's vocabulary of {}", *d.mask_token_id,
                            t.vocab);
  if (target.find("token_embd") == nullptr) return invalid_argument("the target has no token embedding");
  return std::unique_ptr<DFlashDraft>(new DFlashDraft(draft, target, be, static_cast<int32_t>(*d.mask_token_id)));
}

namespace {
std::atomic<uint64_t> g_next_draft_id{1};
}  // namespace

DFlashDraft::DFlashDraft(const Weights& draft, const Weights& target, Backend& be, int32_t mask)
    : draft_(draft), target_(target), be_(&be), mask_(mask), id_(g_next_draft_id++) {}

DFlashDraft::Context::Context(const DFlashDraft& d) : be_(&d.backend()), kv_(d.spec(), d.backend()) {}

DFlashDraft::Context::~Context() { drop(); }

void DFlashDraft::Context::reset() {
  base_ = end_ = 0;
  started_ = false;
}

void DFlashDraft::Context::drop() {
  for (const Recorded& r : recs_) be_->drop_step(r.id);
  recs_.clear();
  features_ = Buffer();
  logits_ = Buffer();
}

Status DFlashDraft::ring_rows_to(const FeatureRing& ring, int64_t from, float* dst) const {
  // A device ring's rows where the draft computes are copied there (no host hop); others are uploaded.
  if (ring.device() != nullptr && ring.device()->memory_owner() == be_->memory_owner())
    return ring.copy_rows_to(from, dst);
  DF_ASSIGN_OR_RETURN(std::vector<float> feats, ring.rows_from(from));
  return be_->upload(dst, feats.data(), static_cast<int64_t>(feats.size()));
}

DFlashDraft::StepInputs DFlashDraft::step_inputs(const Context& ctx, int32_t root, int64_t n_new) const {
  const int64_t B = draft_.spec().block_size;
  StepInputs in{std::vector<int32_t>(static_cast<size_t>(B), mask_), std::vector<int32_t>(static_cast<size_t>(n_new + B))};
  in.block[0] = root;
  std::iota(in.positions.begin(), in.positions.end(), static_cast<int32_t>(ctx.end_));
  return in;
}

Status DFlashDraft::run_step(Context& ctx, const float* features, int64_t n_new, const StepInputs& in, int64_t rows,
                             float* logits) {
  const ModelSpec& s = draft_.spec();
  const int64_t B = s.block_size, H = s.hidden;
  Backend& be = *be_;
  const cpu::WeightView* embd = target_.find("token_embd");
  if (embd == nullptr) return not_found("the target has no token embedding");
  DF_ASSIGN_OR_RETURN(Buffer c, be.alloc(n_new * H));
  DF_RETURN_IF_ERROR(draft_context(draft_, features, n_new, c.data(), be));
  DF_ASSIGN_OR_RETURN(Buffer x, be.alloc(B * H));
  DF_RETURN_IF_ERROR(be.embedding(*embd, in.block, x.data()));
  DF_RETURN_IF_ERROR(draft_layers(draft_, c.data(), n_new, ctx.end_ - ctx.base_, in.positions, x.data(), B, ctx.kv_, be));
  std::vector<int64_t> out_rows(static_cast<size_t>(rows));
  std::iota(out_rows.begin(), out_rows.end(), 1);
  return draft_head(draft_, target_, x.data(), out_rows, logits, be);
}

Status DFlashDraft::forward_eager(Context& ctx, const FeatureRing& ring, int32_t root, int64_t rows, float* logits) {
  const int64_t n_new = ring.end() - ctx.end_;
  DF_ASSIGN_OR_RETURN(Buffer f, be_->alloc(n_new * feature_width()));
  if (n_new > 0) DF_RETURN_IF_ERROR(ring_rows_to(ring, ctx.end_, f.data()));
  return run_step(ctx, f.data(), n_new, step_inputs(ctx, root, n_new), rows, logits);
}

Result<const float*> DFlashDraft::forward_recorded(Context& ctx, const FeatureRing& ring, int32_t root) {
  constexpr int kMaxFailures = 3;
  Backend& be = *be_;
  const ModelSpec& s = draft_.spec();
  const int64_t B = s.block_size, V = target_.spec().vocab;
  const float* none = nullptr;
  const int64_t n_new = ring.end() - ctx.end_;
  if (!graphs_on_ || !be.step_graphs_supported() || ctx.failures_ >= kMaxFailures || n_new < 1 || n_new > B)
    return none;
  const int64_t slot = ctx.end_ - ctx.base_;
  // The recordings add no KV chunks: the context rows' and the block's first.
  for (int64_t L = 0; L < s.n_layers; ++L) DF_RETURN_IF_ERROR(ctx.kv_.reserve_kv(L, slot + n_new + B));
  if (ctx.rec_draft_ != id_ || ctx.rec_layout_ != ctx.kv_.layout_version()) ctx.drop();
  auto rec = std::find_if(ctx.recs_.begin(), ctx.recs_.end(), [&](const Context::Recorded& r) { return r.n_new == n_new; });
  if (rec != ctx.recs_.end() && !be.step_replayable(rec->id)) {
    be.drop_step(rec->id);
    ctx.recs_.erase(rec);
    rec = ctx.recs_.end();
  }
  const StepInputs in = step_inputs(ctx, root, n_new);
  const StepValues values{in.block, in.positions, {}, slot, slot + n_new, slot + n_new + B};
  if (rec == ctx.recs_.end()) {
    if (ctx.features_.size() == 0) {
      DF_ASSIGN_OR_RETURN(ctx.features_, be.alloc(B * feature_width()));
      DF_ASSIGN_OR_RETURN(ctx.logits_, be.alloc((B - 1) * V));
    }
    ctx.kv_.set_recording(true);
    Status st = be.begin_step_capture(values);
    if (st.ok()) {
      // The eager step reading the rows from features_, its head over every row: the shape stays to the end.
      st = run_step(ctx, ctx.features_.data(), n_new, in, B - 1, ctx.logits_.data());
      if (!st.ok()) be.abort_step_capture();
    }
    Result<int64_t> id = st.ok() ? be.end_step_capture() : Result<int64_t>(st);
    ctx.kv_.set_recording(false);
    if (!id.ok()) {  // run it eagerly
      ++ctx.failures_;
      return none;
    }
    ctx.rec_draft_ = id_;
    ctx.rec_layout_ = ctx.kv_.layout_version();
    ctx.recs_.push_back(Context::Recorded{*id, n_new});
    ++ctx.recordings_;
    rec = ctx.recs_.end() - 1;
  }
  DF_RETURN_IF_ERROR(ring_rows_to(ring, ctx.end_, ctx.features_.data()));
  DF_RETURN_IF_ERROR(be.replay_step(rec->id, values));
  ++ctx.replayed_;
  return static_cast<const float*>(ctx.logits_.data());
}

Result<DraftTopK> DFlashDraft::propose(Context& ctx, const FeatureRing& ring, int32_t root, int64_t rows, int64_t k) {
  const ModelSpec& s = draft_.spec();
  const int64_t B = s.block_size, V = target_.spec().vocab;
  if (rows < 1 || rows > B - 1) return invalid_argument("a draft block yields 1 to {} rows, not {}", B - 1, rows);
  if (k < 1 || k > std::min<int64_t>(V, Backend::kMaxTopK))
    return invalid_argument("draft candidates per position must be 1..{}, not {}", std::min<int64_t>(V, Backend::kMaxTopK), k);
  if (ring.width() != feature_width())
    return internal_error("feature rows of {} floats for a draft reading {}", ring.width(), feature_width());
  if (root < 0 || root >= V) return invalid_argument("token id {} is outside the vocabulary of {}", root, V);
  // Start (or restart) the context where the ring's rows begin when the context cannot continue from them.
  if (!ctx.started_ || ctx.end_ < ring.first() || ctx.end_ > ring.end()) {
    ctx.kv_.reset();
    ctx.base_ = ctx.end_ = ring.first();
    ctx.started_ = true;
  }
  Backend& be = *be_;
  DF_ASSIGN_OR_RETURN(const float* logits, forward_recorded(ctx, ring, root));
  Buffer eager;
  if (logits == nullptr) {
    DF_ASSIGN_OR_RETURN(eager, be.alloc(rows * V));
    DF_RETURN_IF_ERROR(forward_eager(ctx, ring, root, rows, eager.data()));
    logits = eager.data();
  }
  ctx.end_ = ring.end();
  return draft_top_k(be, logits, rows, V, k);
}

Result<int32_t> NodeLogits::greedy() const { return checked_greedy(argmax_, best_, vocab_); }

Result<std::span<const float>> NodeLogits::row() {
  if (host_.empty()) {
    host_.resize(static_cast<size_t>(vocab_));
    DF_RETURN_IF_ERROR(be_->download(host_.data(), dev_, vocab_));
  }
  return std::span<const float>(host_);
}

Status append_features(FeatureRing& ring, int64_t first_pos, const StepOutput& out, int64_t n,
                       std::span<const int64_t> pick) {
  if (!out.device_features.empty()) {
    if (ring.device() == nullptr) return internal_error("device features for a feature ring on the host");
    std::vector<const float*> layers;
    for (const Buffer& f : out.device_features) layers.push_back(f.data());
    return ring.append_layers(first_pos, layers, n, pick);
  }
  if (!pick.empty()) return internal_error("host features are appended whole");
  if (out.features.empty()) return internal_error("the step captured no features");
  const auto m = static_cast<int64_t>(out.features.size());
  const int64_t H = ring.width() / m;
  if (H * m != ring.width()) return internal_error("{} capture layers for feature rows of {}", m, ring.width());
  std::vector<float> rows(static_cast<size_t>(n * ring.width()));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < m; ++c) {
      const auto& f = out.features[static_cast<size_t>(c)];
      if (static_cast<int64_t>(f.size()) < n * H) return internal_error("a capture of {} floats for {} rows", f.size(), n);
      std::copy_n(f.data() + t * H, H, rows.data() + (t * m + c) * H);
    }
  return ring.append(first_pos, rows);
}

FeatureRing feature_ring_for(const DFlashDraft& draft, const Runner& target, int64_t window) {
  Backend& be = draft.backend();
  const bool on_device = be.device_memory() && target.shards().size() == 1 &&
                         target.shards().front().backend->memory_owner() == be.memory_owner();
  return FeatureRing(draft.feature_width(), window, feature_tag(draft.capture_layers()), on_device ? &be : nullptr);
}

Result<StepOutput> forward_capturing(Runner& target, SequenceState& state, FeatureRing& ring,
                                     std::span<const int64_t> capture_layers, std::span<const int32_t> tokens,
                                     int64_t chunk) {
  if (tokens.empty()) return invalid_argument("a step needs at least one token");
  if (chunk < 1) return invalid_argument("prefill chunks of {} tokens", chunk);
  const auto len = static_cast<size_t>(std::min<int64_t>(chunk, static_cast<int64_t>(tokens.size())));
  StepOutput out;
  for (size_t off = 0; off < tokens.size(); off += len) {
    Step step;
    step.tokens = tokens.subspan(off, std::min(len, tokens.size() - off));
    step.capture_layers = capture_layers;
    step.features_on_device = ring.device() != nullptr;
    const int64_t pos = state.n_past();
    DF_ASSIGN_OR_RETURN(out, target.forward(state, step));
    DF_RETURN_IF_ERROR(append_features(ring, pos, out, static_cast<int64_t>(step.tokens.size())));
  }
  return out;
}

namespace {

// The features of the step's rows `keep` (tree nodes on the accepted path) as a contiguous StepOutput.
StepOutput gather_features(const StepOutput& out, std::span<const int32_t> keep, int64_t H) {
  StepOutput g;
  for (const auto& f : out.features) {
    std::vector<float> rows(keep.size() * static_cast<size_t>(H));
    for (size_t i = 0; i < keep.size(); ++i)
      std::copy_n(f.data() + static_cast<int64_t>(keep[i]) * H, H, rows.data() + static_cast<int64_t>(i) * H);
    g.features.push_back(std::move(rows));
  }
  return g;
}

}  // namespace

Result<SpecStepResult> speculative_step(Runner& target, SequenceState& state, FeatureRing& ring, DFlashDraft& draft,
                                        DFlashDraft::Context& ctx, int32_t root, int64_t max_drafts,
                                        const SpecOptions& opts, const ChooseFn& choose, SpecStats* stats) {
  if (ring.end() != state.n_past())
    return internal_error("the feature ring ends at {} but the sequence at {}", ring.end(), state.n_past());
  const int64_t B = draft.block_size(), V = target.spec().vocab;
  const int64_t L = std::min(B - 1, max_drafts);
  if (L < 1) return invalid_argument("a speculative step needs room for at least one draft token");

  // Draft: the top candidates of each drafted position (the argmax chain, or the DDTree's top-k).
  auto t0 = std::chrono::steady_clock::now();
  const int64_t k = opts.ddtree && opts.ddtree_budget > L ? std::clamp<int64_t>(opts.ddtree_top_k, 1, Backend::kMaxTopK) : 1;
  DF_ASSIGN_OR_RETURN(DraftTopK topk, draft.propose(ctx, ring, root, L, std::min<int64_t>(k, V)));
  const double draft_ms = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  DraftTree tree;
  if (opts.ddtree) {
    // Every node takes a KV slot after the root's: the budget also stops at the target's context.
    int64_t budget = std::max<int64_t>(1, opts.ddtree_budget);
    const int64_t max_ctx = target.spec().max_context;
    if (max_ctx > 0) budget = std::min(budget, max_ctx - state.n_past() - 1);
    if (budget < 1) return invalid_argument("no room for a drafted token before the model's context of {}", max_ctx);
    tree = build_ddtree(root, topk, budget, /*chain_seed=*/true);
  } else {
    std::vector<int32_t> drafts(static_cast<size_t>(L));
    for (int64_t d = 0; d < L; ++d) drafts[static_cast<size_t>(d)] = topk.tokens[static_cast<size_t>(d * topk.k)];
    tree = chain_tree(root, drafts);
  }
  const double tree_ms = ms_since(t0);

  DF_ASSIGN_OR_RETURN(SpecStepResult res, verify_tree(target, state, ring, draft.capture_layers(), tree, choose, stats));
  if (stats != nullptr) {
    stats->draft_ms += draft_ms;
    stats->tree_ms += tree_ms;
  }
  return res;
}

Result<SpecStepResult> verify_tree(Runner& target, SequenceState& state, FeatureRing& ring,
                                   std::span<const int64_t> capture_layers, const DraftTree& tree,
                                   const ChooseFn& choose, SpecStats* stats) {
  const int64_t s = state.n_past();
  if (ring.end() != s)
    return internal_error("the feature ring ends at {} but the sequence at {}", ring.end(), s);
  if (tree.size() < 1) return invalid_argument("an empty draft tree");
  const int64_t V = target.spec().vocab, H = target.spec().hidden;
  // Verify: one target step over the tree's nodes (a chain runs causally), every node's logits, features.
  auto t0 = std::chrono::steady_clock::now();
  const auto n = static_cast<int64_t>(tree.tokens.size());
  bool is_chain = true;
  for (int64_t i = 1; i < n; ++i) is_chain = is_chain && tree.parents[static_cast<size_t>(i)] == i - 1;
  std::vector<int32_t> positions(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = static_cast<int32_t>(s + tree.depths[static_cast<size_t>(i)]);
  Step step;
  step.tokens = tree.tokens;
  step.all_logits = true;
  step.logits_on_device = true;
  step.capture_recurrent = true;
  step.capture_layers = capture_layers;
  step.features_on_device = ring.device() != nullptr;
  if (!is_chain) {
    step.positions = positions;
    step.mask = cpu::MaskKind::kTree;
    step.parents = tree.parents;
  }
  DF_ASSIGN_OR_RETURN(StepOutput out, target.forward(state, step));

  // Every node's argmax on the backend (n ints cross to the host); a row itself only when `choose` asks.
  std::vector<int32_t> top(static_cast<size_t>(n));
  std::vector<float> top_value(static_cast<size_t>(n));
  Backend& be = target.backend();
  DF_RETURN_IF_ERROR(be.top_k_rows(out.device_logits.data(), n, V, 1, top.data(), top_value.data(), nullptr));
  const double verify_ms = ms_since(t0);
  t0 = std::chrono::steady_clock::now();

  // Walk: the caller's choice at each node, down the child that holds it.
  bool stop = false;
  const auto choose_at = [&](int32_t node) -> Result<int32_t> {
    const auto k = static_cast<size_t>(node);
    NodeLogits logits(be, out.device_logits.data() + static_cast<int64_t>(node) * V, V, top[k], top_value[k]);
    DF_ASSIGN_OR_RETURN(Choice c, choose(logits));
    stop = c.stop;
    return c.token;
  };
  DF_ASSIGN_OR_RETURN(TreeWalk walk, walk_tree(tree, choose_at, [&](int32_t) { return stop; }));
  SpecStepResult res;
  res.tokens = walk.emitted;
  res.stopped = walk.stopped;
  const std::vector<int32_t>& path = walk.path;

  // Commit the accepted path (root + accepted nodes) to the target's state and its features to the ring.
  const auto keep = static_cast<int64_t>(path.size());
  if (is_chain) {
    DF_RETURN_IF_ERROR(state.rollback_captured(keep));
    DF_RETURN_IF_ERROR(append_features(ring, s, out, keep));
  } else {
    DF_RETURN_IF_ERROR(state.commit_tree(tree.parents, path));
    if (out.device_features.empty()) {
      DF_RETURN_IF_ERROR(append_features(ring, s, gather_features(out, path, H), keep));
    } else {
      const std::vector<int64_t> rows(path.begin(), path.end());
      DF_RETURN_IF_ERROR(append_features(ring, s, out, keep, rows));
    }
  }
  if (stats != nullptr) {
    ++stats->steps;
    stats->drafted += n - 1;
    stats->accepted += keep - 1;
    const auto depth = static_cast<size_t>(*std::max_element(tree.depths.begin(), tree.depths.end()));
    if (stats->accepted_at.size() < depth) stats->accepted_at.resize(depth);
    for (int64_t d = 1; d < keep; ++d) ++stats->accepted_at[static_cast<size_t>(d - 1)];
    stats->verify_ms += verify_ms;
    stats->commit_ms += ms_since(t0);
  }
  return res;
}

}  // namespace dflash

#include "state/sequence_state.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <utility>
#include <string_view>

#include "tensor/half.h"

namespace dflash {

Status KvStore::reserve(int64_t n_tokens) {
  const size_t chunks = static_cast<size_t>((n_tokens + kKvChunkTokens - 1) / kKvChunkTokens);
  const size_t first_new = k_.size();
  while (k_.size() < chunks) {
    DF_ASSIGN_OR_RETURN(Buffer k, be_->alloc(kKvChunkTokens * row_words()));
    DF_ASSIGN_OR_RETURN(Buffer v, be_->alloc(kKvChunkTokens * row_words()));
    k_.push_back(std::move(k));
    v_.push_back(std::move(v));
  }
  if (k_.size() > first_new && be_->device_memory()) return sync_device_table(first_new);
  return Status();
}

// Pointers are 8 bytes: two floats of the table buffer each.
Status KvStore::sync_device_table(size_t first_chunk) {
  static_assert(sizeof(const float*) == 2 * sizeof(float));
  if (k_.size() > table_cap_) {  // grow (doubling): the whole table moves
    const size_t cap = std::max<size_t>({k_.size(), 2 * table_cap_, 64});
    DF_ASSIGN_OR_RETURN(Buffer t, be_->alloc(static_cast<int64_t>(4 * cap)));
    table_ = std::move(t);
    table_cap_ = cap;
    ++table_version_;
    first_chunk = 0;
  }
  std::vector<const float*> ptrs;
  for (size_t c = first_chunk; c < k_.size(); ++c) ptrs.push_back(k_[c].data());
  for (size_t c = first_chunk; c < v_.size(); ++c) ptrs.push_back(v_[c].data());
  const int64_t n = static_cast<int64_t>(k_.size() - first_chunk);
  auto* base = reinterpret_cast<const float**>(table_.data());
  DF_RETURN_IF_ERROR(be_->upload(reinterpret_cast<float*>(base + first_chunk),
                                 reinterpret_cast<const float*>(ptrs.data()), 2 * n));
  return be_->upload(reinterpret_cast<float*>(base + table_cap_ + first_chunk),
                     reinterpret_cast<const float*>(ptrs.data() + n), 2 * n);
}

cpu::KvView KvStore::view(int64_t n_tokens) {
  k_ptrs_.clear();
  v_ptrs_.clear();
  for (size_t c = 0; c < k_.size(); ++c) {
    k_ptrs_.push_back(k_[c].data());
    v_ptrs_.push_back(v_[c].data());
  }
  cpu::KvView view{k_ptrs_, v_ptrs_, kKvChunkTokens, n_tokens, n_kv_heads_, head_dim_};
  view.type = type_;
  if (table_cap_ > 0) {
    const auto* base = reinterpret_cast<const float* const*>(table_.data());
    view.device_k_table = base;
    view.device_v_table = base + table_cap_;
  }
  return view;
}

Status KvStore::read_rows(int which, int64_t pos, int64_t rows, float* out) {
  const float* src = which == 0 ? k_row(pos) : v_row(pos);
  if (type_ == cpu::KvType::kF32) return be_->download(out, src, rows * row_elems());
  std::vector<uint16_t> h(static_cast<size_t>(rows * row_words() * 2));
  DF_RETURN_IF_ERROR(be_->download(reinterpret_cast<float*>(h.data()), src, rows * row_words()));
  for (int64_t r = 0; r < rows; ++r) fp16_to_fp32_row(h.data() + r * row_words() * 2, out + r * row_elems(), row_elems());
  return Status();
}

Status KvStore::write_rows(int which, int64_t pos, int64_t rows, const float* in) {
  float* dst = which == 0 ? k_row(pos) : v_row(pos);
  if (type_ == cpu::KvType::kF32) return be_->upload(dst, in, rows * row_elems());
  std::vector<uint16_t> h(static_cast<size_t>(rows * row_words() * 2), 0);
  for (int64_t r = 0; r < rows; ++r) fp32_to_fp16_row(in + r * row_elems(), h.data() + r * row_words() * 2, row_elems());
  return be_->upload(dst, reinterpret_cast<const float*>(h.data()), rows * row_words());
}

void KvStore::shrink(int64_t n_tokens) {
  const size_t chunks = static_cast<size_t>((n_tokens + kKvChunkTokens - 1) / kKvChunkTokens);
  if (k_.size() > chunks) {
    k_.resize(chunks);
    v_.resize(chunks);
  }
}

const SnapshotTensor* Snapshot::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

// A zero-filled buffer of n floats in the backend's memory.
Result<Buffer> zeros(Backend& be, int64_t n) {
  DF_ASSIGN_OR_RETURN(Buffer b, be.alloc(n));
  std::vector<float> z(static_cast<size_t>(n), 0.0f);
  DF_RETURN_IF_ERROR(be.upload(b.data(), z.data(), n));
  return b;
}

}  // namespace

uint64_t SequenceState::layout_version() const {
  uint64_t v = capture_version_;
  for (const auto& kv : kv_)
    if (kv) v += kv->table_version();
  return v;
}

namespace {
std::atomic<uint64_t> g_next_state_id{1};
}  // namespace

SequenceState::SequenceState(const ModelSpec& spec, Backend& be, int64_t layer_begin, int64_t layer_end)
    : SequenceState(spec, std::span<const StateShard>(std::vector<StateShard>{
                              StateShard{&be, layer_begin, layer_end < 0 ? spec.n_layers : layer_end}})) {}

SequenceState::SequenceState(const ModelSpec& spec, std::span<const StateShard> shards)
    : spec_(spec),
      shards_(shards.begin(), shards.end()),
      id_(g_next_state_id.fetch_add(1)),
      layer_begin_(shards.empty() ? 0 : shards.front().layer_begin),
      layer_end_(shards.empty() ? 0 : shards.back().layer_end) {
  if (shards_.empty()) {
    status_ = invalid_argument("a sequence state needs at least one shard");
    return;
  }
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (shards_[s].backend == nullptr || shards_[s].layer_end < shards_[s].layer_begin ||
        (s > 0 && shards_[s].layer_begin != shards_[s - 1].layer_end)) {
      status_ = invalid_argument("sequence state shards must be contiguous layer ranges with a backend each");
      layer_end_ = layer_begin_;
      return;
    }
    for (int64_t L = shards_[s].layer_begin; L < shards_[s].layer_end; ++L) shard_of_.push_back(s);
  }
  const int64_t conv_floats = (spec_.gdn.conv_kernel - 1) * spec_.gdn.conv_dim();
  const int64_t ssm_floats = spec_.gdn.state_floats();
  for (int64_t L = layer_begin_; L < layer_end_; ++L) {
    Backend& shard_be = be(slot(L));
    if (spec_.is_recurrent(L)) {
      kv_.push_back(nullptr);
      auto c = zeros(shard_be, conv_floats);
      auto s = zeros(shard_be, ssm_floats);
      if (!c.ok() || !s.ok()) {
        status_ = !c.ok() ? c.status() : s.status();
        conv_.emplace_back();
        ssm_.emplace_back();
        continue;
      }
      conv_.push_back(std::move(c).value());
      ssm_.push_back(std::move(s).value());
    } else {
      kv_.push_back(std::make_unique<KvStore>(shard_be, spec_.n_kv_heads, spec_.head_dim));
      conv_.emplace_back();
      ssm_.emplace_back();
    }
  }
  marks_.resize(kv_.size());
}

bool SequenceState::laid_out_as(std::span<const StateShard> shards) const {
  if (shards.size() != shards_.size()) return false;
  for (size_t i = 0; i < shards.size(); ++i)
    if (shards[i].backend->memory_owner() != shards_[i].backend->memory_owner() || shards[i].layer_begin != shards_[i].layer_begin ||
        shards[i].layer_end != shards_[i].layer_end)
      return false;
  return true;
}

void SequenceState::reset() {
  n_past_ = 0;
  capture_base_ = -1;
  std::fill(marks_.begin(), marks_.end(), StepMark{});
  for (auto& kv : kv_)
    if (kv) kv->shrink(0);
  for (auto* group : {&conv_, &ssm_})
    for (size_t i = 0; i < group->size(); ++i) {
      Buffer& b = (*group)[i];
      if (b.size() > 0) {
        std::vector<float> z(static_cast<size_t>(b.size()), 0.0f);
        Status st = be(i).upload(b.data(), z.data(), b.size());
        if (!st.ok() && status_.ok()) status_ = st;
      }
    }
}

uint64_t SequenceState::bytes() const {
  uint64_t b = 0;
  for (const auto& kv : kv_)
    if (kv) b += kv->bytes();
  for (const auto& c : conv_) b += static_cast<uint64_t>(c.size()) * sizeof(float);
  for (const auto& s : ssm_) b += static_cast<uint64_t>(s.size()) * sizeof(float);
  return b;
}

Status SequenceState::reserve_kv(int64_t layer, int64_t n_total) {
  DF_RETURN_IF_ERROR(status_);
  if (layer < layer_begin_ || layer >= layer_end_ || !kv_[slot(layer)])
    return internal_error("layer {} has no KV in this state", layer);
  if (recording_ && kv_[slot(layer)]->capacity() < n_total)
    return unsupported("layer {}: KV chunks cannot be added while a step is recorded", layer);
  DF_RETURN_IF_ERROR(kv_[slot(layer)]->reserve(n_total));
  marks_[slot(layer)] = StepMark{n_past_, n_total - n_past_};
  return Status();
}

float* SequenceState::ensure_capture(Backend& be, Buffer& buf, int64_t n) {
  if (buf.size() < n) {
    if (recording_) return nullptr;  // the step fails and runs eagerly, which grows it
    auto b = be.alloc(n);
    if (!b.ok()) {
      status_ = b.status();
      return nullptr;
    }
    buf = std::move(b).value();
    ++capture_version_;
  }
  return buf.data();
}

SequenceState::StepMarks SequenceState::step_marks(int64_t base) const {
  StepMarks m = marks_;
  for (StepMark& k : m)
    if (k.base != base) k = StepMark{};
  return m;
}

void SequenceState::replay_step_marks(const StepMarks& marks) {
  for (size_t i = 0; i < marks.size() && i < marks_.size(); ++i)
    if (marks[i].base >= 0) {
      marks_[i] = marks[i];
      marks_[i].base = n_past_;
    }
}

void SequenceState::mark_capture(size_t i, int64_t n, bool conv, bool chain) {
  StepMark& m = marks_[i];
  if (m.base != n_past_ || m.n != n) m = StepMark{n_past_, n};
  (conv ? m.conv : m.ssm) = true;
  if (!conv) m.chain = chain;
}

float* SequenceState::ssm_capture(int64_t layer, int64_t n) {
  if (ssm_capture_.size() != ssm_.size()) ssm_capture_.resize(ssm_.size());
  mark_capture(slot(layer), n, false);
  return ensure_capture(be(slot(layer)), ssm_capture_[slot(layer)], n * ssm_[slot(layer)].size());
}

float* SequenceState::ssm_chain_capture(int64_t layer, int64_t n) {
  if (ssm_capture_.size() != ssm_.size()) ssm_capture_.resize(ssm_.size());
  mark_capture(slot(layer), n, false, true);
  return ensure_capture(be(slot(layer)), ssm_capture_[slot(layer)], chain_capture_layout(spec_.gdn, n).end);
}

float* SequenceState::conv_capture(int64_t layer, int64_t n) {
  if (conv_capture_.size() != conv_.size()) conv_capture_.resize(conv_.size());
  mark_capture(slot(layer), n, true);
  return ensure_capture(be(slot(layer)), conv_capture_[slot(layer)], conv_[slot(layer)].size() + n * spec_.gdn.conv_dim());
}

void SequenceState::begin_captured_step(int64_t n) {
  capture_base_ = n_past_;
  capture_n_ = n;
}

Status SequenceState::rollback_captured(int64_t n_keep) {
  DF_RETURN_IF_ERROR(status_);
  if (capture_base_ < 0) return internal_error("rollback without a captured step");
  // The step's first token is always kept (in speculative decoding it is the committed root).
  if (n_keep < 1 || n_keep > capture_n_)
    return invalid_argument("cannot keep {} of a captured step of {} tokens (1 to {})", n_keep, capture_n_, capture_n_);
  if (n_past_ != capture_base_ + capture_n_)
    return internal_error("the captured step is not the last one (n_past {}, step [{}, +{}))", n_past_, capture_base_,
                          capture_n_);
  for (size_t i = 0; i < kv_.size(); ++i) {
    const StepMark& m = marks_[i];
    if (!kv_[i] && (m.base != capture_base_ || m.n != capture_n_ || !m.conv || !m.ssm))
      return internal_error("the captured step's DeltaNet captures of layer {} were overwritten by a later step",
                            layer_begin_ + static_cast<int64_t>(i));
  }
  const DeltaNetDims& g = spec_.gdn;
  const int64_t C = g.conv_dim();
  const ChainCapture cc = chain_capture_layout(g, capture_n_);
  const cpu::DeltaNetShape shape{g.n_k_heads, g.n_v_heads, g.d_k, g.d_v};
  // One restore call per backend (a split placement's layers live on several), every layer of it at once.
  std::vector<std::pair<Backend*, std::vector<Backend::DeltaNetRestore>>> per_backend;
  int64_t rerun = 0;  // tokens the chain layers re-run (all of them or none: every chain layer has the same)
  for (int64_t L = layer_begin_; L < layer_end_; ++L) {
    const size_t i = slot(L);
    if (kv_[i]) continue;
    const bool chain = marks_[i].chain;
    marks_[i] = StepMark{};  // consumed
    Backend::DeltaNetRestore r;
    r.state = ssm_[i].data();
    if (!chain) {  // every token's state
      r.from = ssm_capture_[i].data() + (n_keep - 1) * ssm_[i].size();
    } else if (n_keep < capture_n_) {  // the state after the whole step is the one to keep otherwise
      const float* cap = ssm_capture_[i].data();
      r.from = cap + cc.state;
      r.q = cap + cc.q, r.k = cap + cc.k, r.v = cap + cc.v, r.g = cap + cc.decay, r.beta = cap + cc.beta;
      rerun = n_keep;
    }
    // The window after n_keep tokens: rows [n_keep, n_keep + K - 1) of (old window ; step inputs).
    r.conv = conv_[i].data();
    r.conv_from = conv_capture_[i].data() + n_keep * C;
    r.conv_elems = conv_[i].size();
    Backend* b = &be(i);
    if (per_backend.empty() || per_backend.back().first != b) per_backend.push_back({b, {}});
    per_backend.back().second.push_back(r);
  }
  for (auto& [b, layers] : per_backend) DF_RETURN_IF_ERROR(b->restore_deltanet(layers, rerun, shape));
  n_past_ = capture_base_ + n_keep;
  capture_base_ = -1;
  return Status();
}

Status SequenceState::check_tree_step(std::span<const int32_t> parents, std::span<const int32_t> path) const {
  const int64_t n = static_cast<int64_t>(parents.size());
  if (n == 0) return invalid_argument("a tree commit needs the tree step's parents (none given)");
  if (parents[0] != -1)
    return invalid_argument("tree node 0 must be the root (parent -1), not a child of {}", parents[0]);
  for (int64_t j = 1; j < n; ++j)
    if (parents[j] < -1 || parents[j] >= j)
      return invalid_argument("tree node {} has parent {}: a parent comes before its child (-1 to {})", j, parents[j],
                              j - 1);
  if (path.empty()) return invalid_argument("an accepted path holds at least the root");
  if (path[0] != 0) return invalid_argument("an accepted path starts at the root (node 0), not node {}", path[0]);
  for (size_t d = 1; d < path.size(); ++d) {
    if (path[d] < 0 || path[d] >= n)
      return invalid_argument("accepted path node {} is outside the tree's {} nodes", path[d], n);
    if (parents[path[d]] != path[d - 1])
      return invalid_argument("accepted path node {} (depth {}) is not a child of node {}", path[d], d, path[d - 1]);
  }
  // The tree step must be the last step run on this state, over n nodes from n_past.
  for (size_t i = 0; i < kv_.size(); ++i) {
    const StepMark& m = marks_[i];
    const int64_t L = layer_begin_ + static_cast<int64_t>(i);
    if (m.base != n_past_ || m.n != n)
      return internal_error(
          "layer {} did not run a tree step of {} nodes from position {} (its last step: {} tokens from {})", L, n,
          n_past_, m.n, m.base);
    if (!kv_[i] && !(m.conv && m.ssm && !m.chain))
      return internal_error("DeltaNet layer {} has no captures of the tree step", L);
    if (kv_[i] && kv_[i]->capacity() < n_past_ + n)
      return internal_error("layer {} has KV rows for {} positions, the tree step needs {}", L, kv_[i]->capacity(),
                            n_past_ + n);
  }
  return Status();
}

Status SequenceState::commit_tree(std::span<const int32_t> parents, std::span<const int32_t> path) {
  DF_RETURN_IF_ERROR(status_);
  DF_RETURN_IF_ERROR(check_tree_step(parents, path));
  const int64_t m = static_cast<int64_t>(path.size());
  bool spine = true;
  // A KV row moves from slot path[d] to slot d; where some source slot is also a destination (path[d] < m for a
  // moved row, e.g. path 0, 2, 3: slot 2 is read for depth 1 and written for depth 2), the rows go through scratch
  // first, so that every move reads the slot as the tree step left it.
  bool kv_through_scratch = false;
  int64_t moved = 0;
  for (int64_t d = 0; d < m; ++d) {
    spine = spine && path[d] == d;
    if (path[d] != d) {
      ++moved;
      kv_through_scratch = kv_through_scratch || path[d] < m;
    }
  }
  const int64_t hist = spec_.gdn.conv_kernel - 1, C = spec_.gdn.conv_dim();
  // The copies, batched per backend (a split placement's layers live on several): one launch each on a device,
  // two where KV rows go through scratch.
  struct Batch {
    Backend* be;
    std::vector<Backend::CopyItem> first, second;  // second: scratch -> KV rows, after every item of first
    int64_t scratch_floats = 0, scratch_used = 0;
    Buffer scratch;
  };
  std::vector<Batch> batches;
  const auto batch_of = [&](size_t i) -> Batch& {
    for (Batch& bt : batches)
      if (bt.be == &be(i)) return bt;
    return batches.emplace_back(Batch{&be(i), {}, {}, 0, 0, Buffer{}});
  };
  for (size_t i = 0; i < kv_.size(); ++i) {  // every batch made here: references to them stay valid below
    Batch& bt = batch_of(i);
    if (kv_through_scratch && kv_[i]) bt.scratch_floats += 2 * moved * kv_[i]->row_words();
  }
  for (Batch& bt : batches) {
    if (bt.scratch_floats > 0) {
      DF_ASSIGN_OR_RETURN(bt.scratch, bt.be->alloc(bt.scratch_floats));
    }
  }
  for (size_t i = 0; i < kv_.size(); ++i) {
    Batch& bt = batch_of(i);
    if (kv_[i]) {
      KvStore& kv = *kv_[i];
      const int64_t rf = kv.row_words();
      for (int64_t d = 1; d < m; ++d) {
        if (path[d] == d) continue;
        for (int which = 0; which < 2; ++which) {
          float* dst = which == 0 ? kv.k_row(n_past_ + d) : kv.v_row(n_past_ + d);
          const float* src = which == 0 ? kv.k_row(n_past_ + path[d]) : kv.v_row(n_past_ + path[d]);
          if (!kv_through_scratch) {
            bt.first.push_back({dst, src, rf});
          } else {
            float* tmp = bt.scratch.data() + bt.scratch_used;
            bt.scratch_used += rf;
            bt.first.push_back({tmp, src, rf});
            bt.second.push_back({dst, tmp, rf});
          }
        }
      }
      continue;
    }
    // From the captures only, whether or not the tree step touched the committed state (the CPU and CUDA
    // kernels leave it): ssm_capture [n, Hv, dv, dk]; conv_capture [(K-1) + n, C] = (window before the
    // step ; node inputs).
    const int64_t state_size = ssm_[i].size();
    bt.first.push_back({ssm_[i].data(), ssm_capture_[i].data() + path[m - 1] * state_size, state_size});
    const float* cap = conv_capture_[i].data();
    if (spine) {  // rows [m, m + K - 1) of the capture, as in a chain rollback
      bt.first.push_back({conv_[i].data(), cap + m * C, hist * C});
    } else {
      // Window row r is row m + r of (window before the step ; inputs of path[0], path[1], ...).
      for (int64_t r = 0; r < hist; ++r) {
        const int64_t u = m + r;
        const int64_t src_row = u < hist ? u : hist + path[u - hist];
        bt.first.push_back({conv_[i].data() + r * C, cap + src_row * C, C});
      }
    }
  }
  for (Batch& bt : batches) {
    DF_RETURN_IF_ERROR(bt.be->copy_batch(bt.first));
    DF_RETURN_IF_ERROR(bt.be->copy_batch(bt.second));
  }
  std::fill(marks_.begin(), marks_.end(), StepMark{});  // consumed
  capture_base_ = -1;
  n_past_ += m;
  return Status();
}

Result<Snapshot> SequenceState::export_snapshot() const {
  DF_RETURN_IF_ERROR(status_);
  Snapshot snap;
  snap.n_past = n_past_;
  for (int64_t L = layer_begin_; L < layer_end_; ++L) {
    const size_t i = slot(L);
    if (kv_[i]) {
      const int64_t rf = kv_[i]->row_elems();
      for (int which = 0; which < 2; ++which) {
        SnapshotTensor t;
        t.name = tensor_name(which == 0 ? "kv_k" : "kv_v", L);
        t.shape = {n_past_, spec_.n_kv_heads, spec_.head_dim};
        t.data.resize(static_cast<size_t>(n_past_ * rf));
        auto& kv = *kv_[i];
        // Whole chunks at a time (the last one partly).
        for (int64_t p = 0; p < n_past_; p += kKvChunkTokens) {
          const int64_t rows = std::min(kKvChunkTokens, n_past_ - p);
          DF_RETURN_IF_ERROR(kv.read_rows(which, p, rows, t.data.data() + p * rf));
        }
        snap.tensors.push_back(std::move(t));
      }
    } else {
      SnapshotTensor conv{tensor_name("conv", L), {spec_.gdn.conv_kernel - 1, spec_.gdn.conv_dim()}, {}};
      conv.data.resize(static_cast<size_t>(conv_[i].size()));
      DF_RETURN_IF_ERROR(be(i).download(conv.data.data(), conv_[i].data(), conv_[i].size()));
      SnapshotTensor ssm{tensor_name("ssm", L), {spec_.gdn.n_v_heads, spec_.gdn.d_v, spec_.gdn.d_k}, {}};
      ssm.data.resize(static_cast<size_t>(ssm_[i].size()));
      DF_RETURN_IF_ERROR(be(i).download(ssm.data.data(), ssm_[i].data(), ssm_[i].size()));
      snap.tensors.push_back(std::move(conv));
      snap.tensors.push_back(std::move(ssm));
    }
  }
  return snap;
}

std::string SequenceState::tensor_name(const char* base, int64_t L) const {
  std::string name = std::string(base) + "." + std::to_string(L);
  if (shards_.size() > 1) name = "ls" + std::to_string(shard_of_[slot(L)]) + "_" + name;
  return name;
}

Status SequenceState::import_snapshot(const Snapshot& snap) {
  DF_RETURN_IF_ERROR(status_);
  // Tensors by their name without a shard prefix ("ls<shard>_kv_k.3" -> "kv_k.3"): layer numbers are the
  // model's, so a snapshot of any placement binds by layer. A layer's tensor under two names is refused.
  std::map<std::string, const SnapshotTensor*, std::less<>> by_layer;
  for (const SnapshotTensor& t : snap.tensors) {
    std::string_view name = t.name;
    if (name.rfind("ls", 0) == 0) {
      const size_t us = name.find('_');
      const std::string_view digits = name.substr(2, us == std::string_view::npos ? 0 : us - 2);
      if (!digits.empty() && digits.find_first_not_of("0123456789") == std::string_view::npos) name.remove_prefix(us + 1);
    }
    if (!by_layer.emplace(std::string(name), &t).second)
      return corrupt("snapshot holds '{}' twice (under two shards)", name);
  }
  const auto find = [&](const char* base, int64_t L) -> const SnapshotTensor* {
    auto it = by_layer.find(std::string(base) + "." + std::to_string(L));
    return it == by_layer.end() ? nullptr : it->second;
  };
  // Check everything before changing anything: a bad snapshot leaves the state as it was.
  for (int64_t L = layer_begin_; L < layer_end_; ++L) {
    const size_t i = slot(L);
    std::vector<std::pair<const char*, std::vector<int64_t>>> want;
    if (kv_[i]) {
      want = {{"kv_k", {snap.n_past, spec_.n_kv_heads, spec_.head_dim}},
              {"kv_v", {snap.n_past, spec_.n_kv_heads, spec_.head_dim}}};
    } else {
      want = {{"conv", {spec_.gdn.conv_kernel - 1, spec_.gdn.conv_dim()}},
              {"ssm", {spec_.gdn.n_v_heads, spec_.gdn.d_v, spec_.gdn.d_k}}};
    }
    for (const auto& [base, shape] : want) {
      const SnapshotTensor* t = find(base, L);
      if (t == nullptr) return corrupt("snapshot has no tensor '{}.{}'", base, L);
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      if (t->shape != shape || static_cast<int64_t>(t->data.size()) != n)
        return corrupt("snapshot tensor '{}' does not have this model's shape", t->name);
    }
  }
  for (int64_t L = layer_begin_; L < layer_end_; ++L) {
    const size_t i = slot(L);
    Backend& b = be(i);
    if (kv_[i]) {
      kv_[i]->shrink(0);
      DF_RETURN_IF_ERROR(kv_[i]->reserve(snap.n_past));
      const int64_t rf = kv_[i]->row_elems();
      const SnapshotTensor* k = find("kv_k", L);
      const SnapshotTensor* v = find("kv_v", L);
      for (int64_t p = 0; p < snap.n_past; p += kKvChunkTokens) {  // whole chunks (the last one partly)
        const int64_t rows = std::min(kKvChunkTokens, snap.n_past - p);
        DF_RETURN_IF_ERROR(kv_[i]->write_rows(0, p, rows, k->data.data() + p * rf));
        DF_RETURN_IF_ERROR(kv_[i]->write_rows(1, p, rows, v->data.data() + p * rf));
      }
    } else {
      DF_RETURN_IF_ERROR(b.upload(conv_[i].data(), find("conv", L)->data.data(), conv_[i].size()));
      DF_RETURN_IF_ERROR(b.upload(ssm_[i].data(), find("ssm", L)->data.data(), ssm_[i].size()));
    }
  }
  n_past_ = snap.n_past;
  capture_base_ = -1;
  std::fill(marks_.begin(), marks_.end(), StepMark{});
  return Status();
}

}  // namespace dflash

#include "state/sequence_state.h"

#include <algorithm>
#include <cstring>

namespace dflash {

void KvStore::reserve(int64_t n_tokens) {
  const size_t chunks = static_cast<size_t>((n_tokens + kKvChunkTokens - 1) / kKvChunkTokens);
  const size_t floats = static_cast<size_t>(kKvChunkTokens * row_floats());
  while (k_.size() < chunks) {
    k_.push_back(std::make_unique<float[]>(floats));
    v_.push_back(std::make_unique<float[]>(floats));
  }
}

cpu::KvView KvStore::view(int64_t n_tokens) {
  k_ptrs_.clear();
  v_ptrs_.clear();
  for (size_t c = 0; c < k_.size(); ++c) {
    k_ptrs_.push_back(k_[c].get());
    v_ptrs_.push_back(v_[c].get());
  }
  return cpu::KvView{k_ptrs_, v_ptrs_, kKvChunkTokens, n_tokens, n_kv_heads_, head_dim_};
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

SequenceState::SequenceState(const ModelSpec& spec, int64_t layer_begin, int64_t layer_end)
    : spec_(spec), layer_begin_(layer_begin), layer_end_(layer_end < 0 ? spec.n_layers : layer_end) {
  for (int64_t L = layer_begin_; L < layer_end_; ++L) {
    if (spec_.is_recurrent(L)) {
      kv_.push_back(nullptr);
      conv_.emplace_back(static_cast<size_t>((spec_.gdn.conv_kernel - 1) * spec_.gdn.conv_dim()), 0.0f);
      ssm_.emplace_back(static_cast<size_t>(spec_.gdn.n_v_heads * spec_.gdn.d_v * spec_.gdn.d_k), 0.0f);
    } else {
      kv_.push_back(std::make_unique<KvStore>(spec_.n_kv_heads, spec_.head_dim));
      conv_.emplace_back();
      ssm_.emplace_back();
    }
  }
}

void SequenceState::reset() {
  n_past_ = 0;
  for (auto& kv : kv_)
    if (kv) kv->shrink(0);
  for (auto& c : conv_) std::fill(c.begin(), c.end(), 0.0f);
  for (auto& s : ssm_) std::fill(s.begin(), s.end(), 0.0f);
}

uint64_t SequenceState::bytes() const {
  uint64_t b = 0;
  for (const auto& kv : kv_)
    if (kv) b += kv->bytes();
  for (const auto& c : conv_) b += c.size() * sizeof(float);
  for (const auto& s : ssm_) b += s.size() * sizeof(float);
  return b;
}

Status SequenceState::reserve_kv(int64_t layer, int64_t n_total) {
  if (layer < layer_begin_ || layer >= layer_end_ || !kv_[slot(layer)])
    return internal_error("layer {} has no KV in this state", layer);
  kv_[slot(layer)]->reserve(n_total);
  return Status();
}

float* SequenceState::ssm_capture(int64_t layer, int64_t n) {
  if (ssm_capture_.size() != ssm_.size()) ssm_capture_.resize(ssm_.size());
  auto& buf = ssm_capture_[slot(layer)];
  buf.resize(static_cast<size_t>(n) * ssm_[slot(layer)].size());
  return buf.data();
}

float* SequenceState::conv_capture(int64_t layer, int64_t n) {
  if (conv_capture_.size() != conv_.size()) conv_capture_.resize(conv_.size());
  auto& buf = conv_capture_[slot(layer)];
  const size_t C = static_cast<size_t>(spec_.gdn.conv_dim());
  buf.resize(conv_[slot(layer)].size() + static_cast<size_t>(n) * C);
  return buf.data();
}

void SequenceState::begin_captured_step(int64_t n) {
  capture_base_ = n_past_;
  capture_n_ = n;
}

Status SequenceState::rollback_captured(int64_t n_keep) {
  if (capture_base_ < 0) return internal_error("rollback without a captured step");
  // The step's first token is always kept (in speculative decoding it is the committed root).
  if (n_keep < 1 || n_keep > capture_n_)
    return invalid_argument("cannot keep {} of a captured step of {} tokens (1 to {})", n_keep, capture_n_, capture_n_);
  if (n_past_ != capture_base_ + capture_n_)
    return internal_error("the captured step is not the last one (n_past {}, step [{}, +{}))", n_past_, capture_base_,
                          capture_n_);
  const size_t C = static_cast<size_t>(spec_.gdn.conv_dim());
  for (int64_t L = layer_begin_; L < layer_end_; ++L) {
    const size_t i = slot(L);
    if (kv_[i]) continue;
    const size_t state_size = ssm_[i].size();
    std::copy_n(ssm_capture_[i].data() + static_cast<size_t>(n_keep - 1) * state_size, state_size, ssm_[i].data());
    // The window after n_keep tokens: rows [n_keep, n_keep + K - 1) of (old window ; step inputs).
    std::copy_n(conv_capture_[i].data() + static_cast<size_t>(n_keep) * C, conv_[i].size(), conv_[i].data());
  }
  n_past_ = capture_base_ + n_keep;
  capture_base_ = -1;
  return Status();
}

Snapshot SequenceState::export_snapshot() const {
  Snapshot snap;
  snap.n_past = n_past_;
  for (int64_t L = layer_begin_; L < layer_end_; ++L) {
    const size_t i = slot(L);
    if (kv_[i]) {
      const int64_t rf = kv_[i]->row_floats();
      for (int which = 0; which < 2; ++which) {
        SnapshotTensor t;
        t.name = (which == 0 ? "kv_k." : "kv_v.") + std::to_string(L);
        t.shape = {n_past_, spec_.n_kv_heads, spec_.head_dim};
        t.data.resize(static_cast<size_t>(n_past_ * rf));
        for (int64_t p = 0; p < n_past_; ++p) {
          auto& kv = *kv_[i];
          const float* row = which == 0 ? kv.k_row(p) : kv.v_row(p);
          std::memcpy(t.data.data() + p * rf, row, sizeof(float) * rf);
        }
        snap.tensors.push_back(std::move(t));
      }
    } else {
      snap.tensors.push_back({"conv." + std::to_string(L), {spec_.gdn.conv_kernel - 1, spec_.gdn.conv_dim()}, conv_[i]});
      snap.tensors.push_back(
          {"ssm." + std::to_string(L), {spec_.gdn.n_v_heads, spec_.gdn.d_v, spec_.gdn.d_k}, ssm_[i]});
    }
  }
  return snap;
}

Status SequenceState::import_snapshot(const Snapshot& snap) {
  // Check everything before changing anything: a bad snapshot leaves the state as it was.
  for (int64_t L = layer_begin_; L < layer_end_; ++L) {
    const size_t i = slot(L);
    std::vector<std::pair<std::string, std::vector<int64_t>>> want;
    if (kv_[i]) {
      want = {{"kv_k." + std::to_string(L), {snap.n_past, spec_.n_kv_heads, spec_.head_dim}},
              {"kv_v." + std::to_string(L), {snap.n_past, spec_.n_kv_heads, spec_.head_dim}}};
    } else {
      want = {{"conv." + std::to_string(L), {spec_.gdn.conv_kernel - 1, spec_.gdn.conv_dim()}},
              {"ssm." + std::to_string(L), {spec_.gdn.n_v_heads, spec_.gdn.d_v, spec_.gdn.d_k}}};
    }
    for (const auto& [name, shape] : want) {
      const SnapshotTensor* t = snap.find(name);
      if (t == nullptr) return corrupt("snapshot has no tensor '{}'", name);
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      if (t->shape != shape || static_cast<int64_t>(t->data.size()) != n)
        return corrupt("snapshot tensor '{}' does not have this model's shape", name);
    }
  }
  n_past_ = snap.n_past;
  for (int64_t L = layer_begin_; L < layer_end_; ++L) {
    const size_t i = slot(L);
    if (kv_[i]) {
      kv_[i]->shrink(0);
      kv_[i]->reserve(n_past_);
      const int64_t rf = kv_[i]->row_floats();
      const SnapshotTensor* k = snap.find("kv_k." + std::to_string(L));
      const SnapshotTensor* v = snap.find("kv_v." + std::to_string(L));
      for (int64_t p = 0; p < n_past_; ++p) {
        std::memcpy(kv_[i]->k_row(p), k->data.data() + p * rf, sizeof(float) * rf);
        std::memcpy(kv_[i]->v_row(p), v->data.data() + p * rf, sizeof(float) * rf);
      }
    } else {
      conv_[i] = snap.find("conv." + std::to_string(L))->data;
      ssm_[i] = snap.find("ssm." + std::to_string(L))->data;
    }
  }
  return Status();
}

}  // namespace dflash

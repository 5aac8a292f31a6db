#include "state/feature_ring.h"

#include <algorithm>

namespace dflash {

uint32_t feature_tag(std::span<const int64_t> layers) {
  uint32_t h = 2166136261u;  // FNV-1a over the ids
  for (int64_t id : layers) {
    h ^= static_cast<uint32_t>(id);
    h *= 16777619u;
  }
  return h & 0xFFFFFFu;
}

Status FeatureRing::append(int64_t pos, std::span<const float> rows) {
  if (width_ <= 0) return internal_error("a feature ring of width {}", width_);
  if (rows.size() % static_cast<size_t>(width_) != 0)
    return invalid_argument("{} feature values are not whole rows of {}", rows.size(), width_);
  if (pos != end_ && !rows_.empty())
    return internal_error("feature rows for position {} do not follow the ring's end {}", pos, end_);
  const auto n = static_cast<int64_t>(rows.size()) / width_;
  // Only the newest capacity_ rows of this block can survive.
  const int64_t skip = std::max<int64_t>(0, n - capacity_);
  if (skip > 0) rows_.clear();
  for (int64_t r = skip; r < n; ++r) {
    const float* p = rows.data() + r * width_;
    rows_.emplace_back(p, p + width_);
    if (static_cast<int64_t>(rows_.size()) > capacity_) rows_.pop_front();
  }
  end_ = pos + n;
  return Status();
}

Result<std::vector<float>> FeatureRing::rows_from(int64_t from) const {
  if (from < first() || from > end_)
    return internal_error("feature rows from {} asked of a ring holding [{}, {})", from, first(), end_);
  std::vector<float> out;
  out.reserve(static_cast<size_t>((end_ - from) * width_));
  for (size_t i = static_cast<size_t>(from - first()); i < rows_.size(); ++i)
    out.insert(out.end(), rows_[i].begin(), rows_[i].end());
  return out;
}

void FeatureRing::export_to(Snapshot& snap) const {
  const auto n = static_cast<int64_t>(rows_.size());
  SnapshotTensor meta{"dflash_feature_meta", {4},
                      {static_cast<float>(first()), static_cast<float>(n), static_cast<float>(width_), static_cast<float>(tag_)}};
  SnapshotTensor data{"dflash_feature_data", {n, width_}, {}};
  data.data.reserve(static_cast<size_t>(n * width_));
  for (const auto& r : rows_) data.data.insert(data.data.end(), r.begin(), r.end());
  snap.tensors.push_back(std::move(meta));
  snap.tensors.push_back(std::move(data));
}

bool FeatureRing::import_from(const Snapshot& snap) {
  clear(snap.n_past);
  const SnapshotTensor* meta = snap.find("dflash_feature_meta");
  const SnapshotTensor* data = snap.find("dflash_feature_data");
  if (meta == nullptr || data == nullptr || meta->data.size() != 4) return false;
  // Integers are stored as floats: exact below 2^24 (anything else, NaN included, is refused).
  const auto as_int = [](float f) -> int64_t { return f >= 0.0f && f < 16777216.0f ? static_cast<int64_t>(f) : -1; };
  const int64_t first = as_int(meta->data[0]), n = as_int(meta->data[1]), width = as_int(meta->data[2]),
                tag = as_int(meta->data[3]);
  if (first < 0 || n < 0 || width != width_ || tag != static_cast<int64_t>(tag_) || first + n != snap.n_past ||
      data->shape != std::vector<int64_t>{n, width} || static_cast<int64_t>(data->data.size()) != n * width)
    return false;
  if (n == 0) return true;
  clear(first);
  if (append(first, data->data).ok()) return true;
  clear(snap.n_past);
  return false;
}

}  // namespace dflash

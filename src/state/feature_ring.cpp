#include "state/feature_ring.h"

#include <algorithm>

#include "base/log.h"

namespace dflash {

uint32_t feature_tag(std::span<const int64_t> layers) {
  uint32_t h = 2166136261u;  // FNV-1a over the ids
  for (int64_t id : layers) {
    h ^= static_cast<uint32_t>(id);
    h *= 16777619u;
  }
  return h & 0xFFFFFFu;
}

template <typename F>
Status FeatureRing::each_run(int64_t p, int64_t n, F&& f) const {
  for (int64_t r = 0; r < n;) {
    const int64_t slot = (p + r) % slots_, len = std::min(n - r, slots_ - slot);
    DF_RETURN_IF_ERROR(f(dev_.data() + slot * width_, r, len));
    r += len;
  }
  return Status();
}

FeatureRing::FeatureRing(const FeatureRing& o)
    : width_(o.width_), capacity_(o.capacity_), tag_(o.tag_), device_(o.device_), rows_(o.rows_), count_(o.count_),
      end_(o.end_) {
  if (device_ == nullptr || o.dev_.data() == nullptr) return;
  auto buf = device_->alloc(o.slots_ * width_);
  if (buf.ok() && device_->copy(buf->data(), o.dev_.data(), o.slots_ * width_).ok()) {
    dev_ = std::move(buf).value();
    slots_ = o.slots_;
    return;
  }
  // No room on the device: the copy holds the rows on the host.
  device_ = nullptr;
  auto held = o.rows_from(o.first());
  if (held.ok())
    hold_on_host(*held);
  else
    clear(end_);
}

void FeatureRing::hold_on_host(std::span<const float> held) {
  rows_.clear();
  for (int64_t r = 0; r < count_; ++r) rows_.emplace_back(held.begin() + r * width_, held.begin() + (r + 1) * width_);
  dev_ = Buffer();
  slots_ = 0;
}

Status FeatureRing::move_to_host(const Status& why) {
  DF_ASSIGN_OR_RETURN(std::vector<float> held, rows_from(first()));
  log::warn("feature ring: no device memory for {} rows of {} floats ({}); the rows stay in host memory",
            std::min(capacity_, std::max<int64_t>(2 * slots_, 64)), width_, why.message());
  hold_on_host(held);
  source_ = device_;
  device_ = nullptr;
  return Status();
}

FeatureRing& FeatureRing::operator=(const FeatureRing& o) {
  if (this != &o) *this = FeatureRing(o);
  return *this;
}

Status FeatureRing::append(int64_t pos, std::span<const float> rows) {
  if (width_ <= 0) return internal_error("a feature ring of width {}", width_);
  if (rows.size() % static_cast<size_t>(width_) != 0)
    return invalid_argument("{} feature values are not whole rows of {}", rows.size(), width_);
  if (pos != end_ && count_ > 0)
    return internal_error("feature rows for position {} do not follow the ring's end {}", pos, end_);
  const auto n = static_cast<int64_t>(rows.size()) / width_;
  // Only the newest capacity_ rows of this block can survive.
  const int64_t skip = std::max<int64_t>(0, n - capacity_);
  if (device_ != nullptr) {
    DF_ASSIGN_OR_RETURN(const bool placed, place(pos + skip, n - skip));
    if (placed)
      return each_run(pos + skip, n - skip, [&](float* at, int64_t r, int64_t len) {
        return device_->upload(at, rows.data() + (skip + r) * width_, len * width_);
      });
  }  // else (or moved there now) on the host
  if (skip > 0) rows_.clear();
  for (int64_t r = skip; r < n; ++r) {
    const float* p = rows.data() + r * width_;
    rows_.emplace_back(p, p + width_);
    if (static_cast<int64_t>(rows_.size()) > capacity_) rows_.pop_front();
  }
  count_ = static_cast<int64_t>(rows_.size());
  end_ = pos + n;
  return Status();
}

Result<bool> FeatureRing::place(int64_t pos, int64_t n) {
  if (count_ == 0) end_ = pos;
  const int64_t need = std::min(capacity_, count_ + n);
  if (need > slots_) {  // grow (doubling, from 64 rows, up to the window), the rows held laid out anew
    const int64_t slots = std::min(capacity_, std::max({need, 2 * slots_, int64_t{64}}));
    auto alloc = device_->alloc(slots * width_);
    if (!alloc.ok()) {  // the device has no room: the ring goes on on the host
      DF_RETURN_IF_ERROR(move_to_host(alloc.status()));
      return false;
    }
    Buffer grown = std::move(alloc).value();
    if (count_ > 0) {
      DF_ASSIGN_OR_RETURN(Buffer held, device_rows_from(first()));
      const int64_t first_pos = first();
      dev_ = std::move(grown);
      slots_ = slots;
      DF_RETURN_IF_ERROR(each_run(first_pos, count_, [&](float* at, int64_t r, int64_t len) {
        return device_->copy(at, held.data() + r * width_, len * width_);
      }));
    } else {
      dev_ = std::move(grown);
      slots_ = slots;
    }
  }
  // Rows [pos, pos + n) follow end_; the window keeps the newest capacity_ of [first, pos + n).
  count_ = std::min(capacity_, count_ + n);
  end_ = pos + n;
  return true;
}

Status FeatureRing::append_layers(int64_t pos, std::span<const float* const> layers, int64_t n,
                                  std::span<const int64_t> pick) {
  if (device_ == nullptr) return internal_error("device feature rows for a ring on the host");
  const auto m = static_cast<int64_t>(layers.size());
  if (m < 1 || width_ % m != 0) return internal_error("{} capture layers for feature rows of {}", m, width_);
  if (!pick.empty()) n = static_cast<int64_t>(pick.size());
  if (n < 0) return invalid_argument("{} feature rows", n);
  if (pos != end_ && count_ > 0)
    return internal_error("feature rows for position {} do not follow the ring's end {}", pos, end_);
  const int64_t H = width_ / m, skip = std::max<int64_t>(0, n - capacity_);
  // Picked rows (a tree's accepted path) gathered first, so that each layer is one strided copy a run.
  std::vector<Buffer> gathered;
  std::vector<const float*> src(layers.begin(), layers.end());
  if (!pick.empty()) {
    for (int64_t c = 0; c < m; ++c) {
      DF_ASSIGN_OR_RETURN(Buffer g, device_->alloc(n * H));
      DF_RETURN_IF_ERROR(device_->gather_rows(layers[static_cast<size_t>(c)], H, pick, g.data()));
      src[static_cast<size_t>(c)] = g.data();
      gathered.push_back(std::move(g));
    }
  }
  DF_ASSIGN_OR_RETURN(const bool placed, place(pos + skip, n - skip));
  if (placed)
    return each_run(pos + skip, n - skip, [&](float* at, int64_t r, int64_t len) {
      for (int64_t c = 0; c < m; ++c)
        DF_RETURN_IF_ERROR(
            device_->copy_rows(at + c * H, width_, src[static_cast<size_t>(c)] + (skip + r) * H, H, H, len));
      return Status();
    });
  // The ring has just moved to the host: these rows through it too.
  std::vector<float> block(static_cast<size_t>((n - skip) * width_)), layer(static_cast<size_t>((n - skip) * H));
  for (int64_t c = 0; c < m; ++c) {
    DF_RETURN_IF_ERROR(source_->download(layer.data(), src[static_cast<size_t>(c)] + skip * H, (n - skip) * H));
    for (int64_t r = 0; r < n - skip; ++r)
      std::copy_n(layer.data() + r * H, H, block.data() + r * width_ + c * H);
  }
  return append(pos + skip, block);
}

Result<std::vector<float>> FeatureRing::rows_from(int64_t from) const {
  if (from < first() || from > end_)
    return internal_error("feature rows from {} asked of a ring holding [{}, {})", from, first(), end_);
  std::vector<float> out;
  if (device_ != nullptr) {
    out.resize(static_cast<size_t>((end_ - from) * width_));
    DF_RETURN_IF_ERROR(each_run(from, end_ - from, [&](float* at, int64_t r, int64_t len) {
      return device_->download(out.data() + r * width_, at, len * width_);
    }));
    return out;
  }
  out.reserve(static_cast<size_t>((end_ - from) * width_));
  for (size_t i = static_cast<size_t>(from - first()); i < rows_.size(); ++i)
    out.insert(out.end(), rows_[i].begin(), rows_[i].end());
  return out;
}

Status FeatureRing::check_device_rows(int64_t from) const {
  if (device_ == nullptr) return internal_error("device feature rows asked of a ring on the host");
  if (from < first() || from > end_)
    return internal_error("feature rows from {} asked of a ring holding [{}, {})", from, first(), end_);
  return Status();
}

Result<Buffer> FeatureRing::device_rows_from(int64_t from) const {
  DF_RETURN_IF_ERROR(check_device_rows(from));
  DF_ASSIGN_OR_RETURN(Buffer out, device_->alloc((end_ - from) * width_));
  DF_RETURN_IF_ERROR(copy_rows_to(from, out.data()));
  return out;
}

Status FeatureRing::copy_rows_to(int64_t from, float* dst) const {
  DF_RETURN_IF_ERROR(check_device_rows(from));
  return each_run(from, end_ - from, [&](float* at, int64_t r, int64_t len) {
    return device_->copy(dst + r * width_, at, len * width_);
  });
}

void FeatureRing::export_to(Snapshot& snap) const {
  int64_t n = count_;
  auto rows = rows_from(first());
  if (!rows.ok()) n = 0;  // a device that cannot hand its rows back: the snapshot carries none
  SnapshotTensor meta{"dflash_feature_meta", {4},
                      {static_cast<float>(first() + count_ - n), static_cast<float>(n), static_cast<float>(width_),
                       static_cast<float>(tag_)}};
  SnapshotTensor data{"dflash_feature_data", {n, width_}, {}};
  if (n > 0) data.data = std::move(rows).value();
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

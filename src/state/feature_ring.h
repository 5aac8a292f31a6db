// FeatureRing: the DFlash target features of a sequence's last committed positions (algorithms.md A.2):
// per position t, f_t = [h_t^{l1}; ...; h_t^{lm}] (the outputs of the draft's capture layers, [m * H]
// float32), kept on the host for the newest `capacity` positions. The draft reads the rows it has not yet
// turned into its context K/V; a snapshot carries the window so a restored sequence keeps drafting.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "base/status.h"
#include "state/sequence_state.h"

namespace dflash {

// A 24-bit tag of the capture layers (exact as a float in a snapshot tensor).
uint32_t feature_tag(std::span<const int64_t> layers);

class FeatureRing {
 public:
  // Rows of `width` floats (m * H); the newest `capacity` positions are kept (>= 1). `tag` names what the
  // rows are (which target layers: feature_tag), so a snapshot's window is only taken by the same kind of
  // draft.
  FeatureRing(int64_t width, int64_t capacity, uint32_t tag = 0)
      : width_(width), capacity_(capacity < 1 ? 1 : capacity), tag_(tag & 0xFFFFFFu) {}

  int64_t width() const { return width_; }
  int64_t capacity() const { return capacity_; }
  // Positions held: [first(), end()).
  int64_t first() const { return end_ - static_cast<int64_t>(rows_.size()); }
  int64_t end() const { return end_; }
  bool empty() const { return rows_.empty(); }

  // Appends rows for positions [pos, pos + n) where n = rows.size() / width(). `pos` must be end() (the
  // next position), or anything when the ring is empty. Older rows beyond the capacity are dropped.
  Status append(int64_t pos, std::span<const float> rows);
  // Rows of positions [from, end()) as one [n, width] block; `from` must be within [first(), end()].
  Result<std::vector<float>> rows_from(int64_t from) const;
  // Empties the ring; the next rows are those of position `pos`.
  void clear(int64_t pos = 0) { rows_.clear(); end_ = pos; }

  // Snapshot tensors: "dflash_feature_meta" [4] = {first, n, width, tag} and "dflash_feature_data" [n, width].
  void export_to(Snapshot& snap) const;
  // Replaces the contents with the snapshot's window when it has one of this width and tag ending at snap.n_past
  // (returns true); else empties the ring at snap.n_past and returns false (a snapshot made without a draft,
  // or for another draft: the draft then starts its context at the restored position).
  bool import_from(const Snapshot& snap);

 private:
  int64_t width_, capacity_;
  uint32_t tag_;
  std::deque<std::vector<float>> rows_;
  int64_t end_ = 0;
};

}  // namespace dflash

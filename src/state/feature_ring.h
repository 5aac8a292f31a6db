// FeatureRing: the DFlash target features of a sequence's last committed positions (algorithms.md A.2):
// per position t, f_t = [h_t^{l1}; ...; h_t^{lm}] (the outputs of the draft's capture layers, [m * H]
// float32), kept for the newest `capacity` positions: on the host, or in a device backend's memory where the
// target and the draft both compute (the rows then never cross the bus: a 4096-token window of a Qwen3-8B's five
// capture layers is 335 MB). The draft reads the rows it has not yet turned into its context K/V; a snapshot
// carries the window so a restored sequence keeps drafting.
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
  // `device`: keep the rows in that backend's memory (a circular buffer grown with the rows, doubling from 64 up
  // to capacity); null: on the host. A device ring that cannot grow (the device has no room) moves its rows to
  // the host and goes on there (device() is null from then on: later steps hand it host rows).
  FeatureRing(int64_t width, int64_t capacity, uint32_t tag = 0, Backend* device = nullptr)
      : width_(width), capacity_(capacity < 1 ? 1 : capacity), tag_(tag & 0xFFFFFFu), device_(device) {}

  // A copy holds its own rows (a device ring's in a buffer of its own; should that allocation fail, on the host).
  FeatureRing(const FeatureRing& o);
  FeatureRing& operator=(const FeatureRing& o);
  FeatureRing(FeatureRing&&) noexcept = default;
  FeatureRing& operator=(FeatureRing&&) noexcept = default;

  int64_t width() const { return width_; }
  int64_t capacity() const { return capacity_; }
  Backend* device() const { return device_; }
  // Positions held: [first(), end()).
  int64_t first() const { return end_ - count_; }
  int64_t end() const { return end_; }
  bool empty() const { return count_ == 0; }

  // Appends rows for positions [pos, pos + n) where n = rows.size() / width() (host memory). `pos` must be end()
  // (the next position), or anything when the ring is empty. Older rows beyond the capacity are dropped.
  Status append(int64_t pos, std::span<const float> rows);
  // The same from a step's captures in the device's memory (device rings only): layers[c] holds capture layer
  // c's outputs [*, width / m] (m = layers.size()); row r of the block is their row pick[r] (all of pick's
  // entries, in order), or r for r < n when pick is empty.
  Status append_layers(int64_t pos, std::span<const float* const> layers, int64_t n,
                       std::span<const int64_t> pick = {});
  // Rows of positions [from, end()) as one [n, width] block on the host; `from` must be within [first(), end()].
  Result<std::vector<float>> rows_from(int64_t from) const;
  // The same block in the device's memory (device rings only): a new buffer, or into dst [n, width] there.
  Result<Buffer> device_rows_from(int64_t from) const;
  Status copy_rows_to(int64_t from, float* dst) const;
  // Empties the ring; the next rows are those of position `pos`.
  void clear(int64_t pos = 0) {
    rows_.clear();
    count_ = 0;
    end_ = pos;
  }

  // Snapshot tensors: "dflash_feature_meta" [4] = {first, n, width, tag} and "dflash_feature_data" [n, width].
  void export_to(Snapshot& snap) const;
  // Replaces the contents with the snapshot's window when it has one of this width and tag ending at snap.n_past
  // (returns true); else empties the ring at snap.n_past and returns false (a snapshot made without a draft,
  // or for another draft: the draft then starts its context at the restored position).
  bool import_from(const Snapshot& snap);

 private:
  // Device rings: f(at, r, rows) for the slots of positions [p, p + n), at most two runs of the circular buffer:
  // `rows` rows from `at` (in dev_), which hold rows [r, r + rows) of the block [p, p + n). Stops at an error.
  template <typename F>
  Status each_run(int64_t p, int64_t n, F&& f) const;
  // Device rings: advances the window over [pos, pos + n) (n <= capacity), the buffer grown first; false when
  // it could not grow and the ring moved to the host instead (nothing placed).
  Result<bool> place(int64_t pos, int64_t n);
  // Device rings: the rows held, into host memory; the ring is a host ring from then on.
  Status move_to_host(const Status& why);
  // The count_ rows of `held` ([count_, width], the window's) as the host rows, the device buffer let go.
  void hold_on_host(std::span<const float> held);
  // Device rings holding position `from` (within [first(), end()]); else an internal error.
  Status check_device_rows(int64_t from) const;

  int64_t width_, capacity_;
  uint32_t tag_;
  Backend* device_ = nullptr;
  Backend* source_ = nullptr;            // a ring moved to the host: the device whose captures it may be handed
  std::deque<std::vector<float>> rows_;  // host rings
  Buffer dev_;                           // device rings: [slots, width], position p at slot p % slots
  int64_t slots_ = 0;                    // rows dev_ holds: grown with the rows, up to capacity
  int64_t count_ = 0, end_ = 0;
};

}  // namespace dflash

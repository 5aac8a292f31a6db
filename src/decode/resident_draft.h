// ResidentDraft: a DFlash draft under the draft residency policy (FEATURES.md F1; placement/draft_residency.h).
// The draft is read from its file (GGUF, or an HF directory in the published layout) and bound to the target
// on the target's backend. A policy that releases the draft after each use parks it (its memory on the
// backend freed: the device copy on a GPU, the whole load on the CPU) when the last use ends, and the next
// use unparks it (copied again from the host load, or read again from the file), timed.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "base/status.h"
#include "decode/dflash.h"
#include "model/weights.h"
#include "ops/backend.h"
#include "placement/draft_residency.h"

namespace dflash {

class ResidentDraft {
 public:
  struct Stats {
    bool parked = false;
    int64_t unparks = 0;           // loads after a park (the first load not counted)
    int64_t parks = 0;
    double last_unpark_ms = 0;     // the last unpark's time (load + copy to the backend + checks)
    double total_unpark_ms = 0;
    uint64_t resident_bytes = 0;   // what the draft holds on the backend now
    uint64_t weight_bytes = 0;     // the draft's weights (what a park returns)
  };

  // Loads the draft from `path`, checks it against the target and, when the policy starts it parked, parks it
  // again at once (its file was still read and checked: a bad draft fails at start-up, not at the first
  // request). `target` lives on `target_be` (and outlives this). `draft_be` (owned, may be null) is another
  // backend for the draft (--draft-device): the draft then computes there with its own copy of the target's
  // embedding and LM head, made from `target_host` (the target as read, in host memory).
  static Result<std::unique_ptr<ResidentDraft>> load(const std::string& path, const Weights& target, Backend& target_be,
                                                     const Weights& target_host, std::unique_ptr<Backend> draft_be,
                                                     DraftResidency policy, int threads);

  // The draft for one use (a request's decoding), unparked first if it is parked. Pair with release().
  Result<DFlashDraft*> acquire();
  // The end of a use: the draft is parked when the policy releases it after DFlash decoding and no other use
  // is active.
  void release();

  DraftResidency policy() const { return policy_; }
  const ModelSpec& spec() const { return spec_; }
  const std::string& path() const { return path_; }
  Stats stats() const;

 private:
  ResidentDraft(std::string path, const Weights& target, Backend& target_be, const Weights& target_host,
                std::unique_ptr<Backend> draft_be, DraftResidency policy, int threads)
      : path_(std::move(path)), target_(target), target_host_(target_host), own_be_(std::move(draft_be)),
        be_(own_be_ ? *own_be_ : target_be), policy_(policy), threads_(threads) {}
  Status unpark_locked();
  void park_locked();

  std::string path_;
  const Weights& target_;
  const Weights& target_host_;
  std::unique_ptr<Backend> own_be_;  // the draft's own backend (--draft-device), declared before what lives on it
  Backend& be_;                      // where the draft computes: own_be_, or the target's
  DraftResidency policy_;
  int threads_;
  ModelSpec spec_;
  mutable std::mutex mu_;
  std::unique_ptr<Weights> host_;    // the draft as read (views into the file; on the CPU, what computes)
  std::unique_ptr<Weights> device_;  // its copy on a device backend
  std::unique_ptr<Weights> head_;    // on another device than the target: the target's embedding and head there
  std::unique_ptr<DFlashDraft> draft_;
  int users_ = 0;
  Stats stats_;
};

}  // namespace dflash

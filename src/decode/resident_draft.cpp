#include "decode/resident_draft.h"

#include <chrono>

#include "base/log.h"

namespace dflash {

Result<std::unique_ptr<ResidentDraft>> ResidentDraft::load(const std::string& path, const Weights& target,
                                                           Backend& target_be, const Weights& target_host,
                                                           std::unique_ptr<Backend> draft_be, DraftResidency policy,
                                                           int threads) {
  std::unique_ptr<ResidentDraft> d(
      new ResidentDraft(path, target, target_be, target_host, std::move(draft_be), policy, threads));
  std::lock_guard<std::mutex> lock(d->mu_);
  DF_RETURN_IF_ERROR(d->unpark_locked().with_context("draft"));
  d->stats_.unparks = 0;  // the first load is not an unpark
  d->stats_.total_unpark_ms = d->stats_.last_unpark_ms = 0;
  if (parked_at_start(policy, DraftUse::kDFlashDecode)) d->park_locked();
  return d;
}

Status ResidentDraft::unpark_locked() {
  const auto t0 = std::chrono::steady_clock::now();
  if (host_ == nullptr) {
    DF_ASSIGN_OR_RETURN(Weights w, Weights::load(path_, threads_));
    host_ = std::make_unique<Weights>(std::move(w));
  }
  const Weights* on_backend = host_.get();
  if (be_.device_memory()) {
    DF_ASSIGN_OR_RETURN(Weights dev, host_->to_backend(be_));
    device_ = std::make_unique<Weights>(std::move(dev));
    on_backend = device_.get();
  }
  // The target's embedding and head where the draft computes: the target's own when they share a backend;
  // else a copy of just those two (on the CPU, the host load itself).
  const Weights* head = &target_;
  if (own_be_ != nullptr) {
    head = &target_host_;
    if (be_.device_memory()) {
      const std::string_view names[] = {"token_embd", "output"};
      DF_ASSIGN_OR_RETURN(Weights h, target_host_.to_backend(be_, names));
      head_ = std::make_unique<Weights>(std::move(h));
      head = head_.get();
    }
  }
  DF_ASSIGN_OR_RETURN(draft_, DFlashDraft::create(*on_backend, *head, be_));
  spec_ = host_->spec();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.unparks;
  stats_.last_unpark_ms = ms;
  stats_.total_unpark_ms += ms;
  stats_.parked = false;
  stats_.weight_bytes = host_->bytes() + (head_ ? head_->bytes() : 0);
  stats_.resident_bytes = stats_.weight_bytes;
  return Status();
}

void ResidentDraft::park_locked() {
  draft_.reset();
  head_.reset();
  if (device_ != nullptr) {
    device_.reset();  // the device copy: the host load (a file mapping) stays for the next unpark
  } else {
    host_.reset();    // on the CPU the load itself is what computes: read again on unpark
  }
  be_.trim();  // the freed buffers back to the device, not just to the backend's cache
  ++stats_.parks;
  stats_.parked = true;
  stats_.resident_bytes = 0;
  log::info("draft parked: {:.1f} MiB released", static_cast<double>(stats_.weight_bytes) / 1048576.0);
}

Result<DFlashDraft*> ResidentDraft::acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (draft_ == nullptr) {
    DF_RETURN_IF_ERROR(unpark_locked().with_context("unparking the draft"));
    log::info("draft unparked in {:.1f} ms ({:.1f} MiB)", stats_.last_unpark_ms,
              static_cast<double>(stats_.weight_bytes) / 1048576.0);
  }
  ++users_;
  return draft_.get();
}

void ResidentDraft::release() {
  std::lock_guard<std::mutex> lock(mu_);
  if (users_ > 0) --users_;
  if (users_ == 0 && draft_ != nullptr && draft_action(policy_, DraftUse::kDFlashDecode) == DraftAction::kReleaseAfterUse)
    park_locked();
}

ResidentDraft::Stats ResidentDraft::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace dflash

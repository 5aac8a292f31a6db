#include "server/scheduler.h"

#include <algorithm>
#include <exception>

namespace dflash::server {
namespace {

// An engine step that throws (std::bad_alloc, a bug) fails its request, not the scheduler thread.
template <typename F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    return internal_error("the generation failed inside the server: {}", e.what());
  } catch (...) {
    return internal_error("the generation failed inside the server");
  }
}

// A request ended by the requester or by its deadline.
bool cancelled(const std::shared_ptr<const std::atomic<bool>>& cancel, std::chrono::steady_clock::time_point deadline) {
  return (cancel != nullptr && cancel->load()) || std::chrono::steady_clock::now() > deadline;
}

}  // namespace

Scheduler::Scheduler(const Engine& engine, int slots, int64_t max_queue)
    : engine_(engine), n_slots_(std::max(slots, 1)), max_queue_(std::max<int64_t>(max_queue, 0)) {
  slots_.resize(static_cast<size_t>(n_slots_));
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() { stop(); }

Scheduler::Admission Scheduler::submit(GenerationJob job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Admission::kStopped;
    if (busy_ + static_cast<int64_t>(waiting_.size()) >= n_slots_ + max_queue_) return Admission::kFull;
    waiting_.push_back(std::move(job));
  }
  cv_.notify_all();
  return Admission::kQueued;
}

void Scheduler::stop() {
  std::lock_guard<std::mutex> once(stop_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int Scheduler::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_;
}

int64_t Scheduler::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(waiting_.size());
}

void Scheduler::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !waiting_.empty() || busy_ > 0; });
      if (stopping_) break;
    }
    admit();
    // Round robin: every active slot advances one step per pass (a chunk of prefill or one token).
    for (Slot& s : slots_)
      if (s.gen) step(s);
  }
  const Status shutdown(ErrorCode::kCancelled, "the server is shutting down");
  for (Slot& s : slots_)
    if (s.gen) complete(s, shutdown);
  std::deque<GenerationJob> rest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rest.swap(waiting_);
  }
  for (GenerationJob& j : rest)
    if (j.done) j.done(shutdown);
  // The sequences live in the engine's backend memory: free them now, while the engine surely exists.
  for (Slot& s : slots_) s.state.reset();
}

void Scheduler::admit() {
  // Waiting requests whose client went away or whose deadline passed leave the queue at once.
  std::vector<GenerationJob> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (cancelled(it->cancel, it->deadline)) {
        dropped.push_back(std::move(*it));
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (GenerationJob& j : dropped)
    if (j.done)
      j.done(Status(ErrorCode::kCancelled, j.cancel != nullptr && j.cancel->load() ? "the client went away"
                                                                                     : "the request deadline passed"));

  for (Slot& s : slots_) {
    if (s.gen) continue;
    GenerationJob job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (waiting_.empty()) return;
      job = std::move(waiting_.front());
      waiting_.pop_front();
      ++busy_;
    }
    s.done = std::move(job.done);
    s.cancel = std::move(job.cancel);
    const Status st = guarded([&]() -> Status {
      if (s.state == nullptr) {
        s.state = std::make_unique<SequenceState>(engine_.runner->spec(), engine_.runner->state_layout());
      } else {
        s.state->reset();  // a prefix shared with earlier requests comes back from the prefix cache (start())
      }
      s.gen = std::make_unique<Generation>(engine_, std::move(job.request), std::move(job.sink), s.cancel.get(),
                                           job.deadline);
      return s.gen->start(*s.state);
    });
    if (!st.ok()) complete(s, st);
  }
}

void Scheduler::step(Slot& slot) {
  Result<bool> r = guarded([&]() -> Result<bool> { return slot.gen->step(); });
  if (!r.ok()) return complete(slot, r.status());
  if (*r) complete(slot, slot.gen->take_result());
}

void Scheduler::complete(Slot& slot, Result<GenerationResult> r) {
  auto done = std::move(slot.done);
  slot.done = nullptr;
  slot.gen.reset();
  slot.cancel.reset();
  // After an engine failure the sequence may be half written (or its allocation failed): make a new one.
  if (!r.ok() && r.status().code() != ErrorCode::kCancelled && r.status().code() != ErrorCode::kInvalidArgument)
    slot.state.reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    --busy_;  // before done(): a requester answered now may submit again at once and find the slot free
  }
  if (done) done(std::move(r));
}

}  // namespace dflash::server

// Scheduler: N slots, each with its own sequence, served by one thread that interleaves generation steps
// across the active requests (one step per active slot in turn: a long request does not hold back a short
// one that arrived later), and a bounded FIFO of requests waiting for a free slot.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/status.h"
#include "server/generation.h"
#include "state/sequence_state.h"

namespace dflash::server {

// One request for the scheduler.
struct GenerationJob {
  GenerationRequest request;
  // Receives text as it becomes final, on the scheduler thread: it must not block (hand the text to the
  // request's own thread); false cancels the request.
  TextSink sink;
  // Set by the requester to cancel (the client went away); checked before every step. May be null.
  std::shared_ptr<const std::atomic<bool>> cancel;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // Called exactly once with the outcome, on the scheduler thread (or the thread calling stop()); it must
  // not block and must not call back into the scheduler.
  std::function<void(Result<GenerationResult>)> done;
};

class Scheduler {
 public:
  enum class Admission { kQueued, kFull, kStopped };

  // `slots` sequences (>= 1) on the engine, which must outlive the scheduler (or its stop()). At most
  // `max_queue` requests wait beyond those in slots. Starts the scheduler thread.
  Scheduler(const Engine& engine, int slots, int64_t max_queue);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues the job (kQueued) unless slots + max_queue requests are already in (kFull) or the scheduler
  // has stopped (kStopped); the job's done callback runs only for kQueued.
  Admission submit(GenerationJob job);
  // Cancels every request (done: kCancelled), joins the thread and frees the slots' sequences.
  // Idempotent; submit() refuses afterwards.
  void stop();

  int slots() const { return n_slots_; }
  // Slots running a request now.
  int busy() const;
  // Requests waiting for a slot.
  int64_t waiting() const;

 private:
  struct Slot {
    std::unique_ptr<SequenceState> state;  // made on first use, kept (reset) for the next request
    std::unique_ptr<Generation> gen;       // null: the slot is free
    std::function<void(Result<GenerationResult>)> done;
    std::shared_ptr<const std::atomic<bool>> cancel;
  };

  void run();
  // Moves waiting jobs into free slots (FIFO) and starts them; fails those that cannot start.
  void admit();
  // One step of the slot's generation; finishes the request when it is done or failed.
  void step(Slot& slot);
  // Completes the slot's request with `r` and frees the slot.
  void complete(Slot& slot, Result<GenerationResult> r);

  const Engine& engine_;
  const int n_slots_;
  const int64_t max_queue_;
  std::vector<Slot> slots_;  // touched only by the scheduler thread

  std::mutex stop_mu_;  // one stop() at a time
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationJob> waiting_;  // guarded by mu_
  int busy_ = 0;                       // guarded by mu_: slots with a request
  bool stopping_ = false;              // guarded by mu_
  std::thread thread_;
};

}  // namespace dflash::server

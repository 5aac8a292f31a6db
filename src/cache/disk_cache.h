// DiskCache: prefix snapshots persisted as snapshot files (snapshot_file.h) in one directory, so that a
// restarted server restores prompt prefixes instead of prefilling them: the start-up scan, lookups by
// exact token ids, a background writer, eviction by value within a byte budget, and stats.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "state/sequence_state.h"
#include "state/snapshot_file.h"

namespace dflash {

struct DiskCacheOptions {
  std::string dir;               // created (mode 0700) when missing
  uint64_t budget_bytes = 0;     // bytes of this identity's snapshot files the directory may hold
  int64_t min_tokens = 512;      // shorter snapshots are not written (cheap to prefill again)
  SnapshotIdentity identity;     // what every file is bound to (snapshot_file.h)
  size_t max_queue = 16;         // snapshots waiting for the writer; more are dropped (counted)
  uint64_t max_queue_bytes = uint64_t{2} << 30;  // host bytes they may hold (one is always accepted)
  int64_t stale_temp_seconds = 60;  // a writer's temporary older than this is a killed writer's
  double drain_seconds = 2.0;       // stop(): queued writes still started within this long
  // Seconds since the epoch (tests pass a fake clock); default: time(nullptr). File mtimes are set from it.
  std::function<int64_t()> now;
};

struct DiskCacheStats {
  int64_t entries = 0;          // this identity's snapshot files known in the directory
  uint64_t bytes = 0;           // their size on disk
  uint64_t budget = 0;
  uint64_t hits = 0;            // lookups that restored a file
  uint64_t misses = 0;          // lookups (with nothing in memory) that found no usable file
  uint64_t tokens_saved = 0;    // prompt tokens the hits covered
  uint64_t writes = 0;          // files written
  uint64_t write_errors = 0;    // writes that failed (the first one disables writing)
  uint64_t dropped = 0;         // snapshots not queued: the queue was full
  uint64_t evictions = 0;       // files removed to stay within the budget
  uint64_t removed_bad = 0;     // files removed as corrupt, of another format version, or misnamed
  int64_t pending = 0;          // snapshots queued or being written
  bool writable = false;        // false once a write failed or when the directory is read-only
};

// Thread-safe. File names are a function of the identity and the exact ids
// ("<identity hash>-<ids hash>-<n tokens>.snap", 16 hex digits each), so two servers of one model that
// share a directory write the same name for the same prefix (rename is atomic: the last writer wins, with
// the same content) and find each other's files. Names are never trusted: a lookup peeks the file and
// compares every id, then reads it with every check made (snapshot_file.h).
//
// A file that fails a check (corrupt, truncated, another format version, ids other than its name says) is
// removed with a warning and the lookup goes on to shorter candidates. A file of another identity (other
// models may share the directory) is neither indexed, counted nor removed; neither is anything that is not
// a regular file with a snapshot name.
//
// Eviction (after each write, and at the scan): while this identity's files exceed the budget, the file of
// lowest value goes, value = (1 + hits) * (tokens / bytes) / (1 + age / 1 h), age = now - mtime (a hit
// touches the file's mtime, so recency survives a restart and is shared by servers on one directory; hits
// are counted by this process only). The file just written is kept unless it alone exceeds the budget.
class DiskCache {
 public:
  // Creates the directory if needed, removes stale temporaries of killed writers, peeks every snapshot
  // file of this identity (removing the bad ones), enforces the budget and starts the writer. Errors: the
  // directory cannot be made or listed, or is not a directory. A directory that exists but is not
  // writable is read-only: lookups work, writes are off (one warning).
  static Result<std::unique_ptr<DiskCache>> open(DiskCacheOptions opt);
  ~DiskCache();
  DiskCache(const DiskCache&) = delete;
  DiskCache& operator=(const DiskCache&) = delete;

  const std::string& dir() const { return opt_.dir; }
  int64_t min_tokens() const { return opt_.min_tokens; }
  uint64_t budget() const { return opt_.budget_bytes; }
  // The file name of a snapshot of `tokens` under `id`.
  static std::string file_name(const SnapshotIdentity& id, std::span<const int32_t> tokens);

  // The snapshot whose ids are the longest prefix of `prompt` among `lengths` (ascending; empty: none
  // match), read and checked; null when none. Files of this identity that other servers wrote since the
  // scan are found too. Counts a hit, or a miss when `count_miss`. Blocks on the read (the caller's
  // thread: a hit is worth it).
  std::shared_ptr<const Snapshot> lookup(std::span<const int32_t> prompt, std::span<const int64_t> lengths,
                                         bool count_miss = true);
  // Whether a snapshot of `tokens` would be written: writes are on, it has min_tokens or more, and it is
  // neither on disk (as far as the index knows) nor queued.
  bool wants(std::span<const int32_t> tokens) const;
  // Queues `snap` for the writer (the write happens on the writer's thread, never the caller's). False
  // when not queued: not wanted, or the queue is full (counted as dropped).
  bool enqueue(std::shared_ptr<const Snapshot> snap);
  // Removes the file of `tokens` (a snapshot that read back fine but did not fit the model), warning why.
  void discard(std::span<const int32_t> tokens, const std::string& why);
  // Waits until the queue is empty and no write is running (tests, benchmarks).
  void flush();
  // Removes every file of this identity; returns how many went. Queued writes still happen.
  int64_t clear();
  // Finishes the write in progress, starts the queued ones for at most drain_seconds, drops the rest and
  // joins the writer (idempotent; the destructor calls it).
  void stop();
  DiskCacheStats stats() const;

 private:
  struct Pending {
    std::shared_ptr<const Snapshot> snap;
    std::string name;
    uint64_t bytes = 0;  // host bytes (snapshot_bytes)
  };
  struct Entry {
    int64_t n_tokens = 0;
    uint64_t bytes = 0;
    int64_t mtime = 0;  // seconds: last write or hit
    uint64_t hits = 0;
  };

  explicit DiskCache(DiskCacheOptions opt);
  int64_t now() const;
  std::string path_of(const std::string& name) const { return opt_.dir + "/" + name; }
  // Whether `name` has this identity's prefix and a snapshot suffix; its token count.
  bool ours(const std::string& name, int64_t* n_tokens) const;
  void scan();
  // Checks a file of this identity named `name` (its header, its ids against the name) and indexes it;
  // a bad file is removed. False when it is not indexed.
  bool adopt(const std::string& name);
  // Re-lists the directory: sizes and mtimes of this identity's files (other servers' included; gone files
  // leave the index), stale temporaries removed.
  void relist();
  // Evicts the lowest-value files (never `keep`) until the index fits the budget with `extra` bytes more.
  void enforce_budget(uint64_t extra, const std::string& keep);
  void remove_file(const std::string& name);
  void writer_loop();
  void write_one(const Pending& p);
  // A file that failed a check: removed (corrupt, another format version) or dropped from the index (gone,
  // another identity, unreadable).
  void reject(const std::string& name, const Status& st);
  void disable_writes(const std::string& why);

  const DiskCacheOptions opt_;
  std::string prefix_;  // "<identity hash>-"

  mutable std::mutex mu_;
  std::condition_variable cv_;       // the writer waits for work
  std::condition_variable idle_cv_;  // flush() waits for an empty queue
  std::map<std::string, Entry> index_;                   // guarded by mu_: file name -> entry
  std::deque<Pending> queue_;                            // guarded by mu_
  std::set<std::string> queued_names_;                   // guarded by mu_
  uint64_t queued_bytes_ = 0;                            // guarded by mu_
  bool writing_ = false;                                 // guarded by mu_
  bool writer_done_ = false;                             // guarded by mu_: the writer thread has ended
  bool stopping_ = false;                                // guarded by mu_
  std::chrono::steady_clock::time_point drain_until_;    // guarded by mu_: set by stop()
  bool writable_ = true;                                 // guarded by mu_
  DiskCacheStats stats_;                                 // guarded by mu_ (entries, bytes, pending filled in stats())
  std::mutex stop_mu_;
  std::thread writer_;
};

}  // namespace dflash

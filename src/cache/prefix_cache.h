// PrefixCache: snapshots of sequences (SequenceState::export_snapshot plus the ids and last logits) kept in
// host memory under their exact token ids, bounded by bytes; a lookup returns the longest cached prefix of
// a prompt, verified token by token (the hash is only an index).
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>

#include "state/sequence_state.h"

namespace dflash {

struct PrefixCacheStats {
  int64_t entries = 0;
  uint64_t bytes = 0;         // host bytes the entries hold (snapshot_bytes of each)
  uint64_t capacity = 0;      // the budget; 0: the cache is off
  uint64_t hits = 0;          // lookups that found a prefix
  uint64_t misses = 0;        // lookups that found none
  uint64_t tokens_saved = 0;  // prompt tokens the hits covered
  uint64_t inserts = 0;       // snapshots kept
  uint64_t evictions = 0;     // entries dropped to make room
};

// Host bytes a snapshot holds: its tensors, last logits and token ids.
uint64_t snapshot_bytes(const Snapshot& s);

// Thread-safe. Entries are immutable once inserted (shared with lookups that still restore from them after
// an eviction or clear()).
//
// Eviction: when an insert would exceed the capacity, the least recently used *leaf* goes first (an entry
// no other entry extends); an entry that is a prefix of another one stays until its descendants are gone,
// since the conversations that branch from it are the ones a later request continues.
//
// Index: (length, hash of tokens[0:length]) -> entries. A lookup hashes the prompt once, streaming, and
// takes a digest at each distinct cached length (O(prompt) hashing, O(distinct lengths) probes), then
// compares the ids of each candidate exactly: a hash collision is a miss, never a wrong state.
class PrefixCache {
 public:
  // Turns the 64-bit hash of a token prefix into the index key (tests pass one that collides on purpose).
  using HashMix = uint64_t (*)(uint64_t);

  explicit PrefixCache(uint64_t capacity_bytes, HashMix mix = nullptr);
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  bool enabled() const { return capacity_ > 0; }
  uint64_t capacity() const { return capacity_; }

  // Keeps `snap` under snap->tokens (non-empty, n_past == tokens.size(); last_logits set for a prompt
  // that equals it). Makes room by evicting leaves, least recently used first. False when it is not kept:
  // the cache is off, the snapshot alone exceeds the capacity, or those ids are cached already (that
  // entry counts as used).
  bool insert(std::shared_ptr<const Snapshot> snap);
  // Whether exactly these ids are cached (no hit or miss counted, no LRU update).
  bool contains(std::span<const int32_t> tokens) const;
  // The entry with the longest token ids that are a prefix of `prompt` (possibly all of it), among the
  // lengths listed in `lengths` (ascending; empty: any length); null when there is none. Counts a hit
  // (and its length in tokens_saved) or a miss; a hit counts as a use of the entry.
  std::shared_ptr<const Snapshot> lookup(std::span<const int32_t> prompt, std::span<const int64_t> lengths = {});
  // Drops every entry; returns how many there were.
  int64_t clear();
  PrefixCacheStats stats() const;

 private:
  struct Entry {
    std::shared_ptr<const Snapshot> snap;
    uint64_t key = 0;
    uint64_t bytes = 0;
    uint64_t last_use = 0;
    int64_t descendants = 0;  // entries whose ids extend this entry's
  };
  using EntryList = std::list<Entry>;
  using Bucket = std::unordered_multimap<uint64_t, EntryList::iterator>;

  uint64_t key_of(std::span<const int32_t> tokens) const;
  // The entry holding exactly `tokens` (whose key is `key`), or null.
  Entry* find_locked(std::span<const int32_t> tokens, uint64_t key) const;
  // Evicts least recently used leaves until `need` more bytes fit; false when they cannot.
  bool make_room_locked(uint64_t need);
  void erase_locked(EntryList::iterator it);

  const uint64_t capacity_;
  const HashMix mix_;
  mutable std::mutex mu_;
  EntryList entries_;                      // guarded by mu_
  std::map<int64_t, Bucket> by_length_;    // guarded by mu_: token count -> key -> entry
  uint64_t clock_ = 0;                     // guarded by mu_: LRU ticks
  PrefixCacheStats stats_;                 // guarded by mu_ (entries, bytes, capacity filled in stats())
};

}  // namespace dflash

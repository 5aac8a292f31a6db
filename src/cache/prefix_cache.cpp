#include "cache/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>

namespace dflash {
namespace {

// Streams a token sequence through XXH3 so that a digest can be taken at each length on the way.
class PrefixHasher {
 public:
  PrefixHasher() : st_(XXH3_createState()) { XXH3_64bits_reset(st_); }
  ~PrefixHasher() { XXH3_freeState(st_); }
  PrefixHasher(const PrefixHasher&) = delete;
  PrefixHasher& operator=(const PrefixHasher&) = delete;
  // The hash of tokens[0:len]; len never decreases between calls.
  uint64_t at(std::span<const int32_t> tokens, int64_t len) {
    if (len > done_) {
      XXH3_64bits_update(st_, tokens.data() + done_, static_cast<size_t>(len - done_) * sizeof(int32_t));
      done_ = len;
    }
    return XXH3_64bits_digest(st_);
  }

 private:
  XXH3_state_t* st_;
  int64_t done_ = 0;
};

bool is_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

uint64_t snapshot_bytes(const Snapshot& s) {
  uint64_t b = sizeof(Snapshot) + s.tokens.size() * sizeof(int32_t) + s.last_logits.size() * sizeof(float);
  for (const SnapshotTensor& t : s.tensors)
    b += sizeof(SnapshotTensor) + t.name.size() + t.shape.size() * sizeof(int64_t) + t.data.size() * sizeof(float);
  return b;
}

PrefixCache::PrefixCache(uint64_t capacity_bytes, HashMix mix) : capacity_(capacity_bytes), mix_(mix) {}

uint64_t PrefixCache::key_of(std::span<const int32_t> tokens) const {
  const uint64_t h = XXH3_64bits(tokens.data(), tokens.size() * sizeof(int32_t));
  return mix_ != nullptr ? mix_(h) : h;
}

PrefixCache::Entry* PrefixCache::find_locked(std::span<const int32_t> tokens, uint64_t key) const {
  const auto bl = by_length_.find(static_cast<int64_t>(tokens.size()));
  if (bl == by_length_.end()) return nullptr;
  auto [b, e] = bl->second.equal_range(key);
  for (; b != e; ++b)
    if (std::equal(tokens.begin(), tokens.end(), b->second->snap->tokens.begin(), b->second->snap->tokens.end()))
      return &*b->second;
  return nullptr;
}

bool PrefixCache::insert(std::shared_ptr<const Snapshot> snap) {
  if (snap == nullptr || snap->tokens.empty() || snap->n_past != static_cast<int64_t>(snap->tokens.size()))
    return false;
  const uint64_t bytes = snapshot_bytes(*snap);
  if (capacity_ == 0 || bytes > capacity_) return false;
  const std::span<const int32_t> tokens(snap->tokens);
  const uint64_t key = key_of(tokens);
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* dup = find_locked(tokens, key)) {
    dup->last_use = ++clock_;
    return false;
  }
  // The entries it extends stop being leaves now, so making room does not evict them first; the entries
  // that extend it make it a non-leaf.
  int64_t descendants = 0;
  for (Entry& e : entries_) {
    const std::span<const int32_t> et(e.snap->tokens);
    if (et.size() < tokens.size() && is_prefix(et, tokens))
      ++e.descendants;
    else if (et.size() > tokens.size() && is_prefix(tokens, et))
      ++descendants;
  }
  make_room_locked(bytes);  // always succeeds: bytes <= capacity_
  Entry e;
  e.snap = std::move(snap);
  e.key = key;
  e.bytes = bytes;
  e.last_use = ++clock_;
  e.descendants = descendants;
  entries_.push_front(std::move(e));
  by_length_[static_cast<int64_t>(tokens.size())].emplace(key, entries_.begin());
  stats_.bytes += bytes;
  ++stats_.entries;
  ++stats_.inserts;
  return true;
}

bool PrefixCache::make_room_locked(uint64_t need) {
  while (stats_.bytes + need > capacity_) {
    if (entries_.empty()) return false;
    // The least recently used leaf; with no leaf left (everything extends into the entry being inserted),
    // the least recently used entry.
    auto victim = entries_.end();
    bool victim_leaf = false;
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      const bool leaf = it->descendants == 0;
      if (victim == entries_.end() || (leaf && !victim_leaf) || (leaf == victim_leaf && it->last_use < victim->last_use)) {
        victim = it;
        victim_leaf = leaf;
      }
    }
    erase_locked(victim);
    ++stats_.evictions;
  }
  return true;
}

void PrefixCache::erase_locked(EntryList::iterator it) {
  const std::span<const int32_t> tokens(it->snap->tokens);
  for (Entry& e : entries_) {
    const std::span<const int32_t> et(e.snap->tokens);
    if (et.size() < tokens.size() && is_prefix(et, tokens)) --e.descendants;
  }
  const auto bl = by_length_.find(static_cast<int64_t>(tokens.size()));
  if (bl != by_length_.end()) {
    auto [b, e] = bl->second.equal_range(it->key);
    for (; b != e; ++b)
      if (b->second == it) {
        bl->second.erase(b);
        break;
      }
    if (bl->second.empty()) by_length_.erase(bl);
  }
  stats_.bytes -= it->bytes;
  --stats_.entries;
  entries_.erase(it);
}

bool PrefixCache::contains(std::span<const int32_t> tokens) const {
  if (tokens.empty()) return false;
  const uint64_t key = key_of(tokens);
  std::lock_guard<std::mutex> lock(mu_);
  return find_locked(tokens, key) != nullptr;
}

std::shared_ptr<const Snapshot> PrefixCache::lookup(std::span<const int32_t> prompt, std::span<const int64_t> lengths) {
  std::lock_guard<std::mutex> lock(mu_);
  EntryList::iterator best = entries_.end();
  if (!entries_.empty()) {
    PrefixHasher hasher;
    const auto n = static_cast<int64_t>(prompt.size());
    for (auto& [len, bucket] : by_length_) {
      if (len > n) break;
      if (!lengths.empty() && !std::binary_search(lengths.begin(), lengths.end(), len)) continue;
      const uint64_t h = hasher.at(prompt, len);
      auto [b, e] = bucket.equal_range(mix_ != nullptr ? mix_(h) : h);
      for (; b != e; ++b)
        if (std::equal(prompt.begin(), prompt.begin() + len, b->second->snap->tokens.begin())) {
          best = b->second;
          break;
        }
    }
  }
  if (best == entries_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  stats_.tokens_saved += best->snap->tokens.size();
  best->last_use = ++clock_;
  return best->snap;
}

int64_t PrefixCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t n = stats_.entries;
  entries_.clear();
  by_length_.clear();
  stats_.entries = 0;
  stats_.bytes = 0;
  return n;
}

PrefixCacheStats PrefixCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PrefixCacheStats s = stats_;
  s.capacity = capacity_;
  return s;
}

}  // namespace dflash

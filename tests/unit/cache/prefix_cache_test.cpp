// PrefixCache: the longest cached prefix of a prompt, verified id by id (colliding hashes give no false
// hit), restricted to given lengths; LRU eviction among leaves within the byte budget; clear; stats; and
// many threads inserting and looking up at once.
#include "cache/prefix_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <thread>
#include <vector>

namespace dflash {
namespace {

std::vector<int32_t> iota_ids(int32_t from, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A snapshot of `tokens` holding `floats` floats of state (a stand-in for KV and DeltaNet tensors).
std::shared_ptr<const Snapshot> snap_of(const std::vector<int32_t>& tokens, size_t floats = 1000) {
  auto s = std::make_shared<Snapshot>();
  s->tokens = tokens;
  s->n_past = static_cast<int64_t>(tokens.size());
  s->last_logits = {static_cast<float>(tokens.size())};
  s->tensors.push_back({"ssm.0", {static_cast<int64_t>(floats)}, std::vector<float>(floats, 1.0f)});
  return s;
}

int64_t hit_len(PrefixCache& c, const std::vector<int32_t>& prompt, std::vector<int64_t> lengths = {}) {
  auto s = c.lookup(prompt, lengths);
  return s ? s->n_past : 0;
}

TEST(PrefixCache, the_longest_cached_prefix_wins_and_ids_are_compared) {
  PrefixCache c(64u << 20);
  const auto a = iota_ids(1, 10), b = iota_ids(1, 20);
  const auto other = concat(iota_ids(1, 5), iota_ids(100, 15));  // shares 5 ids with b, diverges after
  ASSERT_TRUE(c.insert(snap_of(a)));
  ASSERT_TRUE(c.insert(snap_of(b)));
  ASSERT_TRUE(c.insert(snap_of(other)));
  EXPECT_EQ(hit_len(c, iota_ids(1, 30)), 20);
  EXPECT_EQ(hit_len(c, iota_ids(1, 20)), 20);  // the whole prompt
  EXPECT_EQ(hit_len(c, iota_ids(1, 15)), 10);
  EXPECT_EQ(hit_len(c, concat(iota_ids(1, 5), iota_ids(100, 20))), 20);
  EXPECT_EQ(hit_len(c, iota_ids(2, 30)), 0);
  EXPECT_EQ(hit_len(c, iota_ids(1, 9)), 0);
  // Only the lengths asked for: the prompt's own cut points.
  EXPECT_EQ(hit_len(c, iota_ids(1, 30), {10, 25}), 10);
  EXPECT_EQ(hit_len(c, iota_ids(1, 30), {5, 25}), 0);
  // The snapshot returned is the one inserted: its state and logits.
  auto s = c.lookup(iota_ids(1, 12));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->tokens, a);
  EXPECT_EQ(s->last_logits, std::vector<float>{10.0f});
  EXPECT_TRUE(c.contains(b));
  EXPECT_FALSE(c.contains(iota_ids(1, 11)));
}

// Every key collides: lookups must still tell entries apart by their ids.
TEST(PrefixCache, colliding_hashes_never_give_a_false_hit) {
  PrefixCache c(64u << 20, [](uint64_t) -> uint64_t { return 42; });
  const std::vector<int32_t> x = {1, 2, 3, 4}, y = {1, 2, 3, 5}, z = {9, 9};
  ASSERT_TRUE(c.insert(snap_of(x)));
  ASSERT_TRUE(c.insert(snap_of(y)));
  ASSERT_TRUE(c.insert(snap_of(z)));
  auto s = c.lookup(std::vector<int32_t>{1, 2, 3, 5, 7});
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->tokens, y);
  s = c.lookup(std::vector<int32_t>{1, 2, 3, 4});
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->tokens, x);
  EXPECT_EQ(c.lookup(std::vector<int32_t>{1, 2, 3, 6, 7}), nullptr);
  EXPECT_EQ(c.lookup(std::vector<int32_t>{9, 8}), nullptr);
  EXPECT_TRUE(c.contains(x));
  EXPECT_FALSE(c.contains(std::vector<int32_t>{1, 2, 3, 6}));
  // A duplicate is not stored twice.
  EXPECT_FALSE(c.insert(snap_of(y)));
  EXPECT_EQ(c.stats().entries, 3);
}

// Leaves go first, least recently used first; an entry that others extend outlives them; the budget holds.
TEST(PrefixCache, eviction_takes_lru_leaves_and_keeps_prefixes_longer) {
  const uint64_t one = snapshot_bytes(*snap_of(iota_ids(1, 10)));
  PrefixCache c(3 * one + one / 2);  // room for three entries of about this size
  const auto root = iota_ids(1, 10);
  const auto branch_a = concat(root, iota_ids(100, 10));
  const auto unrelated = iota_ids(500, 10);
  ASSERT_TRUE(c.insert(snap_of(root)));       // oldest, but a prefix of branch_a
  ASSERT_TRUE(c.insert(snap_of(unrelated)));
  ASSERT_TRUE(c.insert(snap_of(branch_a)));
  EXPECT_EQ(c.stats().entries, 3);
  // Full: the next insert evicts the least recently used leaf (unrelated), not the older root.
  const auto branch_b = concat(root, iota_ids(200, 10));
  ASSERT_TRUE(c.insert(snap_of(branch_b)));
  EXPECT_TRUE(c.contains(root));
  EXPECT_FALSE(c.contains(unrelated));
  EXPECT_TRUE(c.contains(branch_a));
  EXPECT_EQ(c.stats().evictions, 1u);
  // A hit makes branch_a recent: branch_b is now the least recently used leaf.
  EXPECT_EQ(hit_len(c, concat(branch_a, {7})), 20);
  ASSERT_TRUE(c.insert(snap_of(iota_ids(900, 10))));
  EXPECT_FALSE(c.contains(branch_b));
  EXPECT_TRUE(c.contains(branch_a));
  EXPECT_TRUE(c.contains(root));
  // Once its descendants are gone the root is a leaf like any other.
  ASSERT_TRUE(c.insert(snap_of(iota_ids(1000, 10))));  // evicts the LRU leaf: branch_a (root is not a leaf)
  EXPECT_FALSE(c.contains(branch_a));
  EXPECT_TRUE(c.contains(root));
  ASSERT_TRUE(c.insert(snap_of(iota_ids(1100, 10))));  // now root, a leaf and the oldest, goes
  EXPECT_FALSE(c.contains(root));
  const PrefixCacheStats s = c.stats();
  EXPECT_LE(s.bytes, s.capacity);
  EXPECT_EQ(s.entries, 3);
  EXPECT_EQ(s.evictions, 4u);
}

// A snapshot that extends the cached ones is not made room for by evicting its own prefixes first.
TEST(PrefixCache, inserting_a_descendant_keeps_its_prefixes) {
  const uint64_t one = snapshot_bytes(*snap_of(iota_ids(1, 10)));
  PrefixCache c(3 * one + one / 2);
  const auto root = iota_ids(1, 10);
  ASSERT_TRUE(c.insert(snap_of(root)));
  ASSERT_TRUE(c.insert(snap_of(iota_ids(500, 10))));
  ASSERT_TRUE(c.insert(snap_of(iota_ids(600, 10))));
  ASSERT_TRUE(c.insert(snap_of(concat(root, {7}))));  // root is the oldest leaf, yet it stays
  EXPECT_TRUE(c.contains(root));
  EXPECT_FALSE(c.contains(iota_ids(500, 10)));
}

TEST(PrefixCache, budget_zero_disables_and_oversized_snapshots_are_refused) {
  PrefixCache off(0);
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.insert(snap_of(iota_ids(1, 4))));
  EXPECT_EQ(off.lookup(iota_ids(1, 8)), nullptr);
  EXPECT_EQ(off.stats().misses, 1u);
  PrefixCache small(1000);
  EXPECT_FALSE(small.insert(snap_of(iota_ids(1, 4), 10000)));
  EXPECT_EQ(small.stats().entries, 0);
  // Malformed snapshots: no ids, or n_past not matching them.
  PrefixCache c(1u << 20);
  EXPECT_FALSE(c.insert(snap_of({})));
  auto bad = std::make_shared<Snapshot>(*snap_of(iota_ids(1, 4)));
  bad->n_past = 3;
  EXPECT_FALSE(c.insert(bad));
  EXPECT_FALSE(c.insert(nullptr));
}

TEST(PrefixCache, clear_and_stats) {
  PrefixCache c(64u << 20);
  ASSERT_TRUE(c.insert(snap_of(iota_ids(1, 10))));
  ASSERT_TRUE(c.insert(snap_of(iota_ids(1, 30))));
  EXPECT_EQ(hit_len(c, iota_ids(1, 40)), 30);
  EXPECT_EQ(hit_len(c, iota_ids(1, 12)), 10);
  EXPECT_EQ(hit_len(c, iota_ids(5, 12)), 0);
  PrefixCacheStats s = c.stats();
  EXPECT_EQ(s.entries, 2);
  EXPECT_EQ(s.bytes, snapshot_bytes(*snap_of(iota_ids(1, 10))) + snapshot_bytes(*snap_of(iota_ids(1, 30))));
  EXPECT_EQ(s.capacity, 64u << 20);
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.tokens_saved, 40u);
  EXPECT_EQ(s.inserts, 2u);
  // A snapshot handed out survives clear(): a restore in progress keeps reading it.
  auto held = c.lookup(iota_ids(1, 10));
  EXPECT_EQ(c.clear(), 2);
  s = c.stats();
  EXPECT_EQ(s.entries, 0);
  EXPECT_EQ(s.bytes, 0u);
  EXPECT_EQ(hit_len(c, iota_ids(1, 40)), 0);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->tokens, iota_ids(1, 10));
  EXPECT_EQ(c.clear(), 0);
}

// Four threads insert and look up overlapping prefixes under a budget that forces evictions; the cache's
// accounting stays consistent and every hit is a true prefix.
TEST(PrefixCache, many_threads_insert_and_look_up) {
  const uint64_t one = snapshot_bytes(*snap_of(iota_ids(1, 64), 200));
  PrefixCache c(20 * one);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      uint32_t x = 12345u + static_cast<uint32_t>(t);
      for (int i = 0; i < 2000; ++i) {
        x = x * 1664525u + 1013904223u;
        const int len = 1 + static_cast<int>((x >> 8) % 64);
        const auto base = static_cast<int32_t>((x >> 20) % 4);  // four families of prefixes
        const auto ids = iota_ids(base * 1000, len);
        if (i % 3 == 0) {
          c.insert(snap_of(ids, 200));
        } else {
          auto s = c.lookup(ids);
          if (s && (s->tokens.size() > ids.size() || !std::equal(s->tokens.begin(), s->tokens.end(), ids.begin())))
            ++wrong;
        }
        if (i % 500 == 499 && t == 0) c.clear();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  const PrefixCacheStats s = c.stats();
  EXPECT_LE(s.bytes, s.capacity);
  EXPECT_GT(s.hits, 0u);
  // What stats() reports matches what is in it.
  uint64_t bytes = 0;
  int64_t entries = 0;
  for (int32_t base = 0; base < 4; ++base)
    for (int len = 1; len <= 64; ++len)
      if (c.contains(iota_ids(base * 1000, len))) {
        ++entries;
        bytes += snapshot_bytes(*snap_of(iota_ids(base * 1000, len), 200));
      }
  EXPECT_EQ(entries, s.entries);
  EXPECT_EQ(bytes, s.bytes);
}

}  // namespace
}  // namespace dflash

// DiskCache: the start-up scan (valid files indexed; corrupt, other-version and misnamed files removed;
// killed writers' stale temporaries removed; other models' files and foreign entries left alone), lookups
// of the longest allowed prefix verified id by id (bad files skipped and removed, files of another server
// found, vanished files a miss), the writer (min tokens, 0600 files, no rewrites), eviction by value within
// the budget, a failed write that turns writing off with one warning, two caches sharing a directory, and
// a stop that does not hang.
#include "cache/disk_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <numeric>
#include <set>
#include <thread>

#include "support/test_paths.h"

namespace dflash {
namespace {

using test::dir_entries;
using test::read_bytes;
using test::write_bytes;

namespace fs = std::filesystem;

SnapshotIdentity identity(const std::string& model = "tiny.gguf") {
  SnapshotIdentity id;
  id.model_id = model;
  id.model_bytes = 123456;
  id.model_mtime = 1732233600;
  id.layout_hash = 0x0123456789abcdefull;
  id.n_ctx = 4096;
  id.template_hash = 0xfedcba9876543210ull;
  return id;
}

std::vector<int32_t> ids(int n, int32_t from = 1) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

// A snapshot of `tokens` with `floats` floats of state and a 16-entry logits row.
Snapshot snap_of(const std::vector<int32_t>& tokens, size_t floats = 2000) {
  Snapshot s;
  s.tokens = tokens;
  s.n_past = static_cast<int64_t>(tokens.size());
  s.last_logits.assign(16, 0.5f);
  std::vector<float> data(floats);
  std::iota(data.begin(), data.end(), static_cast<float>(tokens.size()));
  s.tensors.push_back({"ssm.0", {static_cast<int64_t>(floats)}, std::move(data)});
  return s;
}

// Writes a snapshot file the way a DiskCache names it (another server, or an earlier run).
std::string put(const std::string& dir, const Snapshot& s, const SnapshotIdentity& id = identity()) {
  const std::string name = DiskCache::file_name(id, s.tokens);
  EXPECT_TRUE(write_snapshot_file(dir, name, s, id).ok());
  return name;
}

void age(const std::string& path, int64_t seconds) {
  const timespec t[2] = {{std::time(nullptr) - seconds, 0}, {std::time(nullptr) - seconds, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), t, AT_SYMLINK_NOFOLLOW), 0) << path;
}

DiskCacheOptions options(const std::string& dir, uint64_t budget = 64u << 20) {
  DiskCacheOptions o;
  o.dir = dir;
  o.budget_bytes = budget;
  o.min_tokens = 1;
  o.identity = identity();
  return o;
}

std::unique_ptr<DiskCache> open_cache(DiskCacheOptions o) {
  auto c = DiskCache::open(std::move(o));
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? std::move(c).value() : nullptr;
}

int64_t hit_len(DiskCache& c, const std::vector<int32_t>& prompt, const std::vector<int64_t>& lengths) {
  auto s = c.lookup(prompt, lengths);
  return s ? s->n_past : 0;
}

TEST(DiskCache, scan_keeps_valid_files_removes_bad_ones_and_leaves_other_models_alone) {
  const std::string dir = test::scratch_dir() + "/cache";
  fs::create_directories(dir);
  const std::string good1 = put(dir, snap_of(ids(10)));
  const std::string good2 = put(dir, snap_of(ids(20)));
  // A flipped token id (caught by the header checksum).
  const std::string flipped = put(dir, snap_of(ids(30)));
  {
    auto b = read_bytes(dir + "/" + flipped);
    const std::string key = "dflash.snapshot.tokens";
    const auto at = std::search(b.begin(), b.end(), key.begin(), key.end()) - b.begin();
    b[static_cast<size_t>(at) + key.size() + 4 + 4 + 8 + 4 * 3] ^= 0x01;
    write_bytes(dir + "/" + flipped, b);
  }
  // Truncated.
  const std::string truncated = put(dir, snap_of(ids(40)));
  {
    auto b = read_bytes(dir + "/" + truncated);
    b.resize(b.size() / 2);
    write_bytes(dir + "/" + truncated, b);
  }
  // Another format version.
  const std::string version = put(dir, snap_of(ids(50)));
  {
    auto b = read_bytes(dir + "/" + version);
    const std::string key = "dflash.snapshot.format_version";
    const auto at = std::search(b.begin(), b.end(), key.begin(), key.end()) - b.begin();
    b[static_cast<size_t>(at) + key.size() + 4] = 99;
    write_bytes(dir + "/" + version, b);
  }
  // A valid file under the name of other ids.
  const std::string misnamed = DiskCache::file_name(identity(), ids(60));
  ASSERT_TRUE(write_snapshot_file(dir, misnamed, snap_of(ids(60, 7)), identity()).ok());
  // Another model's file, an unrelated file, a link with a snapshot name, a killed writer's temporaries.
  const std::string other = put(dir, snap_of(ids(10)), identity("other.gguf"));
  write_bytes(dir + "/notes.txt", {1, 2, 3});
  const std::string link = DiskCache::file_name(identity(), ids(70));
  ASSERT_EQ(::symlink((dir + "/" + good1).c_str(), (dir + "/" + link).c_str()), 0);
  fs::create_directories(dir + "/.dflash-snapshot-tmp.stale1");
  write_bytes(dir + "/.dflash-snapshot-tmp.stale1/" + good1, read_bytes(dir + "/" + good1));
  age(dir + "/.dflash-snapshot-tmp.stale1/" + good1, 600);
  age(dir + "/.dflash-snapshot-tmp.stale1", 600);
  fs::create_directories(dir + "/.dflash-snapshot-tmp.fresh1");

  auto c = open_cache(options(dir));
  ASSERT_NE(c, nullptr);
  const DiskCacheStats s = c->stats();
  EXPECT_EQ(s.entries, 2);
  EXPECT_EQ(s.removed_bad, 4u);
  EXPECT_EQ(s.bytes, fs::file_size(dir + "/" + good1) + fs::file_size(dir + "/" + good2));
  EXPECT_TRUE(s.writable);
  EXPECT_EQ(dir_entries(dir),
            (std::set<std::string>{good1, good2, other, "notes.txt", link, ".dflash-snapshot-tmp.fresh1"}));
  // The link is never read; the other model's file is not this model's prefix.
  EXPECT_EQ(hit_len(*c, ids(80), {10, 20, 70}), 20);
  EXPECT_EQ(hit_len(*c, ids(80), {10, 70}), 10);
  EXPECT_TRUE(fs::is_symlink(dir + "/" + link));
}

TEST(DiskCache, lookup_takes_the_longest_allowed_prefix_and_compares_every_id) {
  const std::string dir = test::scratch_dir();
  put(dir, snap_of(ids(10)));
  put(dir, snap_of(ids(20)));
  put(dir, snap_of(ids(30)));
  auto branch = ids(20);
  branch[15] = 999;
  put(dir, snap_of(branch));
  auto c = open_cache(options(dir));
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(hit_len(*c, ids(40), {10, 20, 30, 40}), 30);
  EXPECT_EQ(hit_len(*c, ids(40), {10, 20, 25}), 20);
  EXPECT_EQ(hit_len(*c, ids(30), {10, 20, 30}), 30);  // the whole prompt
  EXPECT_EQ(hit_len(*c, ids(40), {5, 25}), 0);
  EXPECT_EQ(hit_len(*c, ids(40, 2), {10, 20, 30}), 0);
  auto b2 = branch;
  b2.push_back(5);
  EXPECT_EQ(hit_len(*c, b2, {10, 20, 21}), 20);
  // What comes back is the snapshot that was written.
  auto s = c->lookup(ids(40), std::vector<int64_t>{20});
  ASSERT_NE(s, nullptr);
  const Snapshot want = snap_of(ids(20));
  EXPECT_EQ(s->tokens, want.tokens);
  EXPECT_EQ(s->last_logits, want.last_logits);
  ASSERT_EQ(s->tensors.size(), 1u);
  EXPECT_EQ(s->tensors[0].data, want.tensors[0].data);
  EXPECT_EQ(c->stats().hits, 5u);
  EXPECT_EQ(c->stats().misses, 2u);
  EXPECT_EQ(c->lookup(ids(40), std::vector<int64_t>{5}, /*count_miss=*/false), nullptr);
  EXPECT_EQ(c->stats().misses, 2u);
  EXPECT_EQ(c->stats().tokens_saved, uint64_t{30 + 20 + 30 + 20 + 20});

  // Written by another server after the scan: found.
  put(dir, snap_of(ids(35)));
  EXPECT_EQ(hit_len(*c, ids(40), {10, 20, 30, 35}), 35);
  // Damaged tensor data (only a full read sees it): skipped for the next shorter one, and removed.
  const std::string n30 = DiskCache::file_name(identity(), ids(30));
  auto b = read_bytes(dir + "/" + n30);
  b[b.size() - 200] ^= 0x40;
  write_bytes(dir + "/" + n30, b);
  EXPECT_EQ(hit_len(*c, ids(40), {10, 20, 30}), 20);
  EXPECT_FALSE(fs::exists(dir + "/" + n30));
  EXPECT_EQ(c->stats().removed_bad, 1u);
  // Removed behind its back (another server evicted it): a miss, nothing else.
  fs::remove(dir + "/" + DiskCache::file_name(identity(), ids(20)));
  EXPECT_EQ(hit_len(*c, ids(40), {20}), 0);
  EXPECT_EQ(c->stats().removed_bad, 1u);
  // A cache of another identity sees none of these files.
  DiskCacheOptions o = options(dir);
  o.identity.n_ctx = 8192;
  auto other = open_cache(o);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->stats().entries, 0);
  EXPECT_EQ(hit_len(*other, ids(40), {10, 20, 30, 35}), 0);
  EXPECT_TRUE(fs::exists(dir + "/" + DiskCache::file_name(identity(), ids(10))));
}

TEST(DiskCache, the_writer_writes_private_files_from_min_tokens_once) {
  const std::string dir = test::scratch_dir() + "/new/cache";
  DiskCacheOptions o = options(dir);
  o.min_tokens = 16;
  auto c = open_cache(o);
  ASSERT_NE(c, nullptr);
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_FALSE(c->wants(ids(8)));
  EXPECT_FALSE(c->enqueue(std::make_shared<const Snapshot>(snap_of(ids(8)))));
  EXPECT_TRUE(c->wants(ids(20)));
  EXPECT_TRUE(c->enqueue(std::make_shared<const Snapshot>(snap_of(ids(20)))));
  EXPECT_FALSE(c->enqueue(std::make_shared<const Snapshot>(snap_of(ids(20)))));  // queued already
  c->flush();
  const std::string name = DiskCache::file_name(identity(), ids(20));
  EXPECT_EQ(dir_entries(dir), std::set<std::string>{name});
  ASSERT_EQ(::stat((dir + "/" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_FALSE(c->wants(ids(20)));
  EXPECT_FALSE(c->enqueue(std::make_shared<const Snapshot>(snap_of(ids(20)))));
  const DiskCacheStats s = c->stats();
  EXPECT_EQ(s.writes, 1u);
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.pending, 0);
  auto back = read_snapshot_file(dir + "/" + name, identity());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->tensors[0].data, snap_of(ids(20)).tensors[0].data);
  EXPECT_EQ(c->clear(), 1);
  EXPECT_TRUE(dir_entries(dir).empty());
  EXPECT_TRUE(c->wants(ids(20)));
}

// Equal files (same token count and size): value is (1 + hits) / (1 + age / 1 h). The budget holds three.
TEST(DiskCache, eviction_removes_the_lowest_value_first_and_holds_the_budget) {
  const std::string root = test::scratch_dir();
  const std::string dir = root + "/cache";
  std::atomic<int64_t> clock{1'000'000};
  const std::string probe = put(root, snap_of(ids(10)));  // the size of one file
  const uint64_t one = fs::file_size(root + "/" + probe);
  DiskCacheOptions o = options(dir, one * 3 + one / 2);
  o.now = [&clock] { return clock.load(); };
  auto c = open_cache(o);
  ASSERT_NE(c, nullptr);
  auto write = [&](int32_t from) {
    ASSERT_TRUE(c->enqueue(std::make_shared<const Snapshot>(snap_of(ids(10, from)))));
    c->flush();
  };
  auto name = [](int32_t from) { return DiskCache::file_name(identity(), ids(10, from)); };
  write(100);  // A, t = 0
  write(200);  // B, t = 0
  EXPECT_EQ(hit_len(*c, ids(10, 100), {10}), 10);  // A hit at t = 0
  clock += 1000;
  write(300);  // C, t = 1000
  clock += 1000;
  write(400);  // D, t = 2000: B (oldest, no hits) goes
  EXPECT_EQ(dir_entries(dir), (std::set<std::string>{name(100), name(300), name(400)}));
  write(500);  // E: A is 2000 s old with a hit (2 / 1.56), C 1000 s old without (1 / 1.28): C goes
  EXPECT_EQ(dir_entries(dir), (std::set<std::string>{name(100), name(400), name(500)}));
  clock += 20000;
  EXPECT_EQ(hit_len(*c, ids(10, 400), {10}), 10);  // D and E hit now
  EXPECT_EQ(hit_len(*c, ids(10, 500), {10}), 10);
  write(600);  // F: A is now 22000 s old (2 / 7.1), D and E fresh with a hit (2): A goes
  EXPECT_EQ(dir_entries(dir), (std::set<std::string>{name(400), name(500), name(600)}));
  DiskCacheStats s = c->stats();
  EXPECT_EQ(s.evictions, 3u);
  EXPECT_LE(s.bytes, o.budget_bytes);
  EXPECT_EQ(s.entries, 3);
  // A file larger than the whole budget is not written.
  EXPECT_TRUE(c->enqueue(std::make_shared<const Snapshot>(snap_of(ids(10, 700), one))));
  c->flush();
  EXPECT_EQ(dir_entries(dir).size(), 3u);
  // A smaller budget at the next start: the scan evicts down to it.
  c.reset();
  o.budget_bytes = one + one / 2;
  auto small = open_cache(o);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(small->stats().entries, 1);
  EXPECT_EQ(dir_entries(dir).size(), 1u);
}

TEST(DiskCache, a_failed_write_turns_writing_off_with_one_warning) {
  const std::string dir = test::scratch_dir() + "/cache";
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);
  spdlog::default_logger()->sinks().push_back(ring);
  {
    auto c = open_cache(options(dir));
    ASSERT_NE(c, nullptr);
    fs::remove_all(dir);  // the directory goes away under the server (a full or unmounted disk alike)
    ASSERT_TRUE(c->enqueue(std::make_shared<const Snapshot>(snap_of(ids(10)))));
    c->flush();
    EXPECT_FALSE(c->wants(ids(20)));
    EXPECT_FALSE(c->enqueue(std::make_shared<const Snapshot>(snap_of(ids(20)))));
    EXPECT_FALSE(c->enqueue(std::make_shared<const Snapshot>(snap_of(ids(30)))));
    const DiskCacheStats s = c->stats();
    EXPECT_EQ(s.write_errors, 1u);
    EXPECT_EQ(s.writes, 0u);
    EXPECT_FALSE(s.writable);
    // Lookups still answer (a miss).
    EXPECT_EQ(hit_len(*c, ids(40), {10, 20}), 0);
  }
  auto& sinks = spdlog::default_logger()->sinks();
  sinks.erase(std::find(sinks.begin(), sinks.end(), ring));
  int warnings = 0;
  for (const std::string& line : ring->last_formatted())
    if (line.find("serving on without writing to disk") != std::string::npos) ++warnings;
  EXPECT_EQ(warnings, 1);
}

TEST(DiskCache, a_read_only_directory_is_read_but_not_written) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory modes";
  const std::string dir = test::scratch_dir();
  put(dir, snap_of(ids(10)));
  ASSERT_EQ(::chmod(dir.c_str(), 0500), 0);
  auto c = open_cache(options(dir));
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(c->stats().writable);
  EXPECT_FALSE(c->enqueue(std::make_shared<const Snapshot>(snap_of(ids(20)))));
  EXPECT_EQ(hit_len(*c, ids(20), {10, 20}), 10);
  ::chmod(dir.c_str(), 0700);
}

TEST(DiskCache, a_path_that_is_a_file_is_an_error) {
  const std::string dir = test::scratch_dir();
  write_bytes(dir + "/file", {1});
  auto c = DiskCache::open(options(dir + "/file"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("not a directory"), std::string::npos) << c.status().to_string();
}

// Two servers of one model on one directory, writing the same and different prefixes at once: every file
// is whole and valid, each finds the other's, and one clearing is a miss for the other, nothing worse.
TEST(DiskCache, two_caches_sharing_a_directory_write_only_valid_files) {
  const std::string dir = test::scratch_dir();
  DiskCacheOptions o = options(dir);
  o.max_queue = 64;
  auto a = open_cache(o);
  auto b = open_cache(o);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      DiskCache& c = t % 2 == 0 ? *a : *b;
      for (int i = 0; i < 12; ++i) {
        c.enqueue(std::make_shared<const Snapshot>(snap_of(ids(10 + i, 1 + (t / 2) * (i % 2)), 20000)));
        c.lookup(ids(40), std::vector<int64_t>{10, 15, 20});
      }
    });
  for (auto& th : threads) th.join();
  a->flush();
  b->flush();
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    ASSERT_FALSE(is_snapshot_temp_name(n)) << n;
    auto s = read_snapshot_file(e.path().string(), identity());
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(DiskCache::file_name(identity(), s->tokens), n);
    ++files;
  }
  EXPECT_EQ(files, 18);  // 12 prefixes of 1.., 6 of 2..
  // Each finds what the other wrote.
  const auto mine = ids(25, 3);
  ASSERT_TRUE(b->enqueue(std::make_shared<const Snapshot>(snap_of(mine))));
  b->flush();
  EXPECT_EQ(hit_len(*a, mine, {25}), 25);
  // a's write of the same prefix adopts b's file instead of writing it again.
  const uint64_t writes = a->stats().writes;
  const auto more = ids(26, 4);
  ASSERT_TRUE(b->enqueue(std::make_shared<const Snapshot>(snap_of(more))));
  b->flush();
  ASSERT_TRUE(a->enqueue(std::make_shared<const Snapshot>(snap_of(more))));
  a->flush();
  EXPECT_EQ(a->stats().writes, writes);
  EXPECT_FALSE(a->wants(more));
  // b clears: a misses, then writes again.
  EXPECT_GT(b->clear(), 0);
  EXPECT_EQ(hit_len(*a, mine, {25}), 0);
  EXPECT_EQ(hit_len(*a, ids(40), {10, 15, 20}), 0);
}

TEST(DiskCache, stop_does_not_wait_for_a_long_queue) {
  const std::string dir = test::scratch_dir();
  DiskCacheOptions o = options(dir);
  o.drain_seconds = 0;
  o.max_queue = 64;
  auto c = open_cache(o);
  ASSERT_NE(c, nullptr);
  for (int i = 0; i < 64; ++i) c->enqueue(std::make_shared<const Snapshot>(snap_of(ids(100 + i), 200000)));
  const auto t0 = std::chrono::steady_clock::now();
  c->stop();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  EXPECT_FALSE(c->enqueue(std::make_shared<const Snapshot>(snap_of(ids(5)))));
  const DiskCacheStats s = c->stats();
  EXPECT_EQ(s.pending, 0);
  EXPECT_EQ(s.writes + s.dropped, 64u);
  for (const auto& e : fs::directory_iterator(dir)) {
    ASSERT_FALSE(is_snapshot_temp_name(e.path().filename().string()));
    EXPECT_TRUE(read_snapshot_file(e.path().string(), identity()).ok());
  }
  c.reset();  // stop() again from the destructor
}

TEST(DiskCache, a_full_queue_drops_and_counts) {
  const std::string dir = test::scratch_dir();
  DiskCacheOptions o = options(dir);
  o.max_queue = 2;
  auto c = open_cache(o);
  ASSERT_NE(c, nullptr);
  int queued = 0;
  for (int i = 0; i < 40; ++i) queued += c->enqueue(std::make_shared<const Snapshot>(snap_of(ids(100 + i), 400000))) ? 1 : 0;
  c->flush();
  const DiskCacheStats s = c->stats();
  EXPECT_EQ(s.writes, static_cast<uint64_t>(queued));
  EXPECT_EQ(s.dropped, static_cast<uint64_t>(40 - queued));
  EXPECT_GT(s.dropped, 0u);
}

}  // namespace
}  // namespace dflash

#include "cache/disk_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "base/log.h"
#include "cache/prefix_cache.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSuffix = ".snap";
// Recency in the eviction value: a file last used this many seconds ago is worth half a fresh one.
constexpr double kRecencySeconds = 3600.0;

uint64_t ids_hash(std::span<const int32_t> tokens) { return XXH3_64bits(tokens.data(), tokens.size() * sizeof(int32_t)); }

// What the file names of one identity share (the format version is not in it: a file of another version
// is this identity's, and is removed as unsupported when it is met).
uint64_t identity_hash(const SnapshotIdentity& id) {
  const std::string s = fmt::format("{}\n{}\n{}\n{:016x}\n{}\n{:016x}", id.model_id, id.model_bytes, id.model_mtime,
                                    id.layout_hash, id.n_ctx, id.template_hash);
  return XXH3_64bits(s.data(), s.size());
}

std::string name_of(uint64_t identity, uint64_t ids, size_t n) {
  return fmt::format("{:016x}-{:016x}-{}{}", identity, ids, n, kSuffix);
}

bool is_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// lstat of dir/name: whether it is a regular file (not a link), its size and mtime; errno ENOENT when gone.
bool regular_file(const std::string& path, uint64_t* bytes, int64_t* mtime, bool* gone = nullptr) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (gone != nullptr) *gone = errno == ENOENT;
    return false;
  }
  if (gone != nullptr) *gone = false;
  if (!S_ISREG(st.st_mode)) return false;
  if (bytes != nullptr) *bytes = static_cast<uint64_t>(st.st_size);
  if (mtime != nullptr) *mtime = static_cast<int64_t>(st.st_mtime);
  return true;
}

void set_mtime(const std::string& path, int64_t t) {
  const timespec times[2] = {{t, 0}, {t, 0}};
  ::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW);  // best effort: recency only
}

// Asks the kernel to read the whole file ahead: the read below maps it and faults it in a page range at a
// time, which on a cold page cache is several times slower than one sequential read.
void prefetch(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
  ::close(fd);
}

// Bytes a snapshot file of `s` takes, give or take its header's padding: what eviction makes room for
// before the write (the file's real size replaces it after).
uint64_t estimated_file_bytes(const Snapshot& s) {
  uint64_t b = 4096 + 4 * s.tokens.size() + 4 * s.last_logits.size() + 128;
  for (const SnapshotTensor& t : s.tensors) b += 128 + t.name.size() + 8 * t.shape.size() + 4 * t.data.size() + 32;
  return b;
}

double mib(uint64_t b) { return static_cast<double>(b) / (1 << 20); }

}  // namespace

std::string DiskCache::file_name(const SnapshotIdentity& id, std::span<const int32_t> tokens) {
  return name_of(identity_hash(id), ids_hash(tokens), tokens.size());
}

DiskCache::DiskCache(DiskCacheOptions opt) : opt_(std::move(opt)) {
  prefix_ = fmt::format("{:016x}-", identity_hash(opt_.identity));
}

int64_t DiskCache::now() const { return opt_.now ? opt_.now() : static_cast<int64_t>(std::time(nullptr)); }

Result<std::unique_ptr<DiskCache>> DiskCache::open(DiskCacheOptions opt) {
  if (opt.dir.empty()) return invalid_argument("the snapshot cache directory is empty");
  while (opt.dir.size() > 1 && opt.dir.back() == '/') opt.dir.pop_back();
  std::error_code ec;
  if (!fs::exists(opt.dir, ec)) {
    fs::create_directories(opt.dir, ec);
    if (ec) return io_error("cannot create the snapshot cache directory '{}': {}", opt.dir, ec.message());
    ::chmod(opt.dir.c_str(), 0700);  // snapshots hold prompts: private to the server's user
  }
  if (!fs::is_directory(opt.dir, ec))
    return invalid_argument("the snapshot cache directory '{}' is not a directory", opt.dir);
  std::unique_ptr<DiskCache> c(new DiskCache(std::move(opt)));
  if (::access(c->opt_.dir.c_str(), R_OK | W_OK | X_OK) != 0) {
    c->writable_ = false;
    log::warn("disk cache: '{}' is not writable ({}); snapshots are read from it but none are written",
              c->opt_.dir, std::strerror(errno));
  }
  c->scan();
  c->writer_ = std::thread([p = c.get()] { p->writer_loop(); });
  return c;
}

DiskCache::~DiskCache() { stop(); }

bool DiskCache::ours(const std::string& name, int64_t* n_tokens) const {
  // "<16 hex>-<16 hex>-<digits>.snap", with this identity's first part.
  if (!name.starts_with(prefix_) || !name.ends_with(kSuffix)) return false;
  const std::string_view rest = std::string_view(name).substr(prefix_.size(), name.size() - prefix_.size() - kSuffix.size());
  if (rest.size() < 18 || rest[16] != '-' || !is_hex(rest.substr(0, 16))) return false;
  const std::string_view digits = rest.substr(17);
  if (digits.empty() || digits.size() > 12 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  if (n_tokens != nullptr) *n_tokens = std::stoll(std::string(digits));
  return true;
}

void DiskCache::remove_file(const std::string& name) {
  if (::unlink(path_of(name).c_str()) != 0 && errno != ENOENT)
    log::warn("disk cache: cannot remove '{}': {}", path_of(name), std::strerror(errno));
}

void DiskCache::reject(const std::string& name, const Status& st) {
  bool gone = false;
  const bool exists = regular_file(path_of(name), nullptr, nullptr, &gone) || !gone;
  bool remove = false;
  if (!exists) {
    // Another server evicted or replaced it: a miss, nothing to say.
  } else if (st.code() == ErrorCode::kNotFound) {
    log::debug("disk cache: '{}' is not this model's: {}", name, st.message());  // kept for its owner
  } else if (st.code() == ErrorCode::kIo) {
    log::warn("disk cache: cannot read '{}': {}", path_of(name), st.message());
  } else {
    log::warn("disk cache: removing '{}': {}", path_of(name), st.message());
    remove = true;
  }
  if (remove) remove_file(name);
  std::lock_guard<std::mutex> lock(mu_);
  index_.erase(name);
  if (remove) ++stats_.removed_bad;
}

bool DiskCache::adopt(const std::string& name) {
  const std::string path = path_of(name);
  auto info = peek_snapshot_file(path);
  if (!info.ok()) {
    reject(name, info.status());
    return false;
  }
  if (info->identity != opt_.identity) {
    reject(name, not_found("it belongs to another model or configuration"));
    return false;
  }
  if (file_name(opt_.identity, info->tokens) != name) {
    reject(name, corrupt("its {} token ids are not the ones its name says", info->tokens.size()));
    return false;
  }
  Entry e;
  e.n_tokens = static_cast<int64_t>(info->tokens.size());
  if (!regular_file(path, &e.bytes, &e.mtime)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, fresh] = index_.try_emplace(name, e);
  if (!fresh) {
    it->second.bytes = e.bytes;
    it->second.mtime = std::max(it->second.mtime, e.mtime);
  }
  return true;
}

void DiskCache::scan() {
  const auto t0 = std::chrono::steady_clock::now();
  if (writable_) {
    auto removed = remove_stale_snapshot_temps(opt_.dir, opt_.stale_temp_seconds);
    if (!removed.ok())
      log::warn("disk cache: {}", removed.status().message());
    else if (*removed > 0)
      log::info("disk cache: removed {} temporaries of killed writers", *removed);
  }
  std::error_code ec;
  std::vector<std::string> names;
  for (fs::directory_iterator it(opt_.dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (ours(name, nullptr) && regular_file(path_of(name), nullptr, nullptr)) names.push_back(name);
  }
  if (ec) log::warn("disk cache: cannot list '{}': {}", opt_.dir, ec.message());
  for (const std::string& name : names) adopt(name);
  if (writable_) enforce_budget(0, "");
  const DiskCacheStats s = stats();
  log::info("disk cache: {} snapshots ({:.1f} MiB, budget {:.1f} MiB) in {} ({} files checked in {:.0f} ms)",
            s.entries, mib(s.bytes), mib(opt_.budget_bytes), opt_.dir, names.size(),
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
}

void DiskCache::relist() {
  if (writable_) {
    auto removed = remove_stale_snapshot_temps(opt_.dir, opt_.stale_temp_seconds);
    if (!removed.ok()) log::debug("disk cache: {}", removed.status().message());
  }
  std::map<std::string, Entry> seen;
  std::error_code ec;
  for (fs::directory_iterator it(opt_.dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    Entry e;
    if (ours(name, &e.n_tokens) && regular_file(path_of(name), &e.bytes, &e.mtime)) seen.emplace(name, e);
  }
  if (ec) return;  // keep what the index knows
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = index_.begin(); it != index_.end();) {
    auto s = seen.find(it->first);
    if (s == seen.end()) {
      it = index_.erase(it);  // another server removed it
      continue;
    }
    it->second.bytes = s->second.bytes;
    it->second.mtime = std::max(it->second.mtime, s->second.mtime);
    seen.erase(s);
    ++it;
  }
  // Files another server wrote: counted against the budget at once, checked when a lookup reads them.
  for (auto& [name, e] : seen) index_.emplace(name, e);
}

void DiskCache::enforce_budget(uint64_t extra, const std::string& keep) {
  std::vector<std::string> victims;
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t total = 0;
    for (const auto& [name, e] : index_) total += e.bytes;
    const int64_t t = now();
    auto value = [&](const Entry& e) {
      const double age = static_cast<double>(std::max<int64_t>(0, t - e.mtime));
      return (1.0 + static_cast<double>(e.hits)) * static_cast<double>(e.n_tokens) /
             static_cast<double>(std::max<uint64_t>(e.bytes, 1)) / (1.0 + age / kRecencySeconds);
    };
    while (total + extra > opt_.budget_bytes) {
      auto victim = index_.end();
      double victim_value = 0;
      for (auto it = index_.begin(); it != index_.end(); ++it) {
        if (it->first == keep) continue;
        const double v = value(it->second);
        if (victim == index_.end() || v < victim_value ||
            (v == victim_value && it->second.mtime < victim->second.mtime)) {
          victim = it;
          victim_value = v;
        }
      }
      if (victim == index_.end()) break;
      total -= victim->second.bytes;
      victims.push_back(victim->first);
      index_.erase(victim);
      ++stats_.evictions;
    }
    // The file just written alone exceeds the budget: it goes too.
    if (!keep.empty() && total + extra > opt_.budget_bytes) {
      if (auto it = index_.find(keep); it != index_.end()) {
        victims.push_back(keep);
        index_.erase(it);
        ++stats_.evictions;
      }
    }
  }
  for (const std::string& name : victims) {
    log::debug("disk cache: evicting '{}'", name);
    remove_file(name);
  }
}

std::shared_ptr<const Snapshot> DiskCache::lookup(std::span<const int32_t> prompt, std::span<const int64_t> lengths,
                                                  bool count_miss) {
  // The candidate names, longest first: one streaming hash of the prompt.
  std::vector<std::pair<int64_t, std::string>> cands;
  {
    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset(st);
    int64_t done = 0;
    const uint64_t ident = identity_hash(opt_.identity);
    for (int64_t len : lengths) {
      if (len <= done || len > static_cast<int64_t>(prompt.size())) continue;
      XXH3_64bits_update(st, prompt.data() + done, static_cast<size_t>(len - done) * sizeof(int32_t));
      done = len;
      cands.emplace_back(len, name_of(ident, XXH3_64bits_digest(st), static_cast<size_t>(len)));
    }
    XXH3_freeState(st);
  }
  for (auto c = cands.rbegin(); c != cands.rend(); ++c) {
    const auto& [len, name] = *c;
    const std::string path = path_of(name);
    bool known = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      known = index_.count(name) > 0;
    }
    // Not indexed: another server may have written it since the scan (one lstat per candidate).
    if (!regular_file(path, nullptr, nullptr)) {
      if (known) {
        std::lock_guard<std::mutex> lock(mu_);
        index_.erase(name);
      }
      continue;
    }
    const auto want = prompt.first(static_cast<size_t>(len));
    const auto t0 = std::chrono::steady_clock::now();
    prefetch(path);
    auto info = peek_snapshot_file(path);
    if (!info.ok()) {
      reject(name, info.status());
      continue;
    }
    if (!std::equal(want.begin(), want.end(), info->tokens.begin(), info->tokens.end())) {
      reject(name, corrupt("its token ids are not the ones its name says"));
      continue;
    }
    auto snap = read_snapshot_file(path, opt_.identity);
    if (!snap.ok()) {
      reject(name, snap.status());
      continue;
    }
    if (!std::equal(want.begin(), want.end(), snap->tokens.begin(), snap->tokens.end())) {
      reject(name, corrupt("its token ids are not the ones its name says"));  // replaced between the reads
      continue;
    }
    const double read_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    log::debug("disk cache: read '{}' ({:.1f} MiB) in {:.1f} ms ({:.0f} MiB/s)", name, mib(info->file_bytes), read_ms,
               mib(info->file_bytes) / std::max(read_ms, 1e-3) * 1e3);
    const int64_t t = now();
    set_mtime(path, t);
    {
      std::lock_guard<std::mutex> lock(mu_);
      Entry& e = index_[name];
      e.n_tokens = len;
      e.bytes = info->file_bytes;
      e.mtime = t;
      ++e.hits;
      ++stats_.hits;
      stats_.tokens_saved += static_cast<uint64_t>(len);
    }
    return std::make_shared<const Snapshot>(std::move(snap).value());
  }
  if (count_miss) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.misses;
  }
  return nullptr;
}

bool DiskCache::wants(std::span<const int32_t> tokens) const {
  if (static_cast<int64_t>(tokens.size()) < std::max<int64_t>(opt_.min_tokens, 1)) return false;
  const std::string name = file_name(opt_.identity, tokens);
  std::lock_guard<std::mutex> lock(mu_);
  return writable_ && !stopping_ && index_.count(name) == 0 && queued_names_.count(name) == 0;
}

bool DiskCache::enqueue(std::shared_ptr<const Snapshot> snap) {
  if (snap == nullptr || snap->tokens.empty() || !wants(snap->tokens)) return false;
  Pending p;
  p.name = file_name(opt_.identity, snap->tokens);
  p.bytes = snapshot_bytes(*snap);
  p.snap = std::move(snap);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!writable_ || stopping_ || queued_names_.count(p.name) > 0) return false;
    if (queue_.size() >= std::max<size_t>(opt_.max_queue, 1) ||
        (!queue_.empty() && queued_bytes_ + p.bytes > opt_.max_queue_bytes)) {
      ++stats_.dropped;
      return false;
    }
    queued_names_.insert(p.name);
    queued_bytes_ += p.bytes;
    queue_.push_back(std::move(p));
  }
  cv_.notify_one();
  return true;
}

void DiskCache::discard(std::span<const int32_t> tokens, const std::string& why) {
  reject(file_name(opt_.identity, tokens), corrupt("{}", why));
}

void DiskCache::disable_writes(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!writable_) return;
  writable_ = false;
  log::warn("disk cache: writing snapshots to '{}' failed ({}); serving on without writing to disk", opt_.dir, why);
}

void DiskCache::write_one(const Pending& p) {
  const std::string path = path_of(p.name);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.count(p.name) > 0) return;
  }
  // Another server (of this identity) wrote it: adopt it instead of writing the same bytes again.
  if (regular_file(path, nullptr, nullptr) && adopt(p.name)) return;
  const uint64_t estimate = estimated_file_bytes(*p.snap);
  if (estimate > opt_.budget_bytes) {
    log::debug("disk cache: a snapshot of {} tokens (~{:.1f} MiB) exceeds the budget", p.snap->tokens.size(),
               mib(estimate));
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.dropped;
    return;
  }
  relist();
  enforce_budget(estimate, "");
  const Status st = write_snapshot_file(opt_.dir, p.name, *p.snap, opt_.identity);
  if (!st.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.write_errors;
    }
    disable_writes(st.message());
    return;
  }
  const int64_t t = now();
  set_mtime(path, t);
  Entry e;
  e.n_tokens = static_cast<int64_t>(p.snap->tokens.size());
  e.mtime = t;
  if (!regular_file(path, &e.bytes, nullptr)) e.bytes = estimate;
  {
    std::lock_guard<std::mutex> lock(mu_);
    index_[p.name] = e;
    ++stats_.writes;
  }
  enforce_budget(0, p.name);
}

void DiskCache::writer_loop() {
  for (;;) {
    Pending p;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) break;
      // Stopping: queued writes still start until the drain deadline, then the rest are dropped; with
      // writing off, they are dropped at once.
      if (!writable_ || (stopping_ && std::chrono::steady_clock::now() > drain_until_)) {
        stats_.dropped += queue_.size();
        queue_.clear();
        queued_names_.clear();
        queued_bytes_ = 0;
        idle_cv_.notify_all();
        if (stopping_) break;
        continue;
      }
      p = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    write_one(p);
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      queued_names_.erase(p.name);
      queued_bytes_ -= p.bytes;
    }
    idle_cv_.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    writer_done_ = true;
  }
  idle_cv_.notify_all();
}

void DiskCache::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return (queue_.empty() && !writing_) || writer_done_; });
}

int64_t DiskCache::clear() {
  relist();
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, e] : index_) names.push_back(name);
    index_.clear();
  }
  for (const std::string& name : names) remove_file(name);
  return static_cast<int64_t>(names.size());
}

void DiskCache::stop() {
  std::lock_guard<std::mutex> once(stop_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      drain_until_ = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(opt_.drain_seconds));
    }
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  idle_cv_.notify_all();
}

DiskCacheStats DiskCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DiskCacheStats s = stats_;
  s.entries = static_cast<int64_t>(index_.size());
  s.bytes = 0;
  for (const auto& [name, e] : index_) s.bytes += e.bytes;
  s.budget = opt_.budget_bytes;
  s.pending = static_cast<int64_t>(queue_.size()) + (writing_ ? 1 : 0);
  s.writable = writable_;
  return s;
}

}  // namespace dflash

// Snapshot files: bit-exact round trips (random snapshots and a real model state that decodes on after a
// restore), identity binding, every flipped byte and every truncation refused, names that are paths
// refused, atomic writes that leave nothing behind, and the temporaries of a killed writer.
#include "state/snapshot_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include "formats/gguf.h"
#include "model/forward.h"
#include "model/weights.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

using test::dir_entries;
using test::read_bytes;
using test::write_bytes;

namespace fs = std::filesystem;

SnapshotIdentity sample_identity() {
  SnapshotIdentity id;
  id.model_id = "tiny-qwen35-f32.gguf";
  id.model_bytes = 18000000000000000000ull;  // above INT64_MAX: u64 all the way
  id.model_mtime = 1732233600;
  id.layout_hash = 0x0123456789abcdefull;
  id.n_ctx = 4096;
  id.template_hash = 0xfedcba9876543210ull;
  return id;
}

// Random data with the float values that break careless copies: NaN payloads, -0, infinities, denormals.
std::vector<float> random_floats(std::mt19937& rng, size_t n) {
  std::vector<float> v(n);
  std::uniform_real_distribution<float> u(-4.f, 4.f);
  for (auto& x : v) x = u(rng);
  const uint32_t specials[] = {0x7fc00001u, 0xffbfffffu, 0x80000000u, 0x7f800000u, 0xff800000u, 0x00000001u};
  for (size_t i = 0; i < n && i < std::size(specials); ++i) std::memcpy(&v[i * 7 % n], &specials[i], 4);
  return v;
}

SnapshotTensor random_tensor(std::mt19937& rng, std::string name, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return {std::move(name), std::move(shape), random_floats(rng, static_cast<size_t>(n))};
}

Snapshot random_snapshot(uint32_t seed, int64_t n_tokens = 37) {
  std::mt19937 rng(seed);
  Snapshot s;
  s.n_past = n_tokens;
  std::uniform_int_distribution<int32_t> tok(0, 151935);
  for (int64_t i = 0; i < n_tokens; ++i) s.tokens.push_back(tok(rng));
  if (n_tokens > 2) {
    s.tokens[0] = std::numeric_limits<int32_t>::max();
    s.tokens[1] = std::numeric_limits<int32_t>::min();
  }
  s.last_logits = random_floats(rng, 97);
  s.tensors.push_back(random_tensor(rng, "kv_k.3", {n_tokens, 2, 8}));
  s.tensors.push_back(random_tensor(rng, "kv_v.3", {n_tokens, 2, 8}));
  s.tensors.push_back(random_tensor(rng, "kv_k.7", {0, 2, 8}));  // empty: no positions yet
  s.tensors.push_back(random_tensor(rng, "conv.0", {3, 5}));
  s.tensors.push_back(random_tensor(rng, "ssm.0", {2, 3, 1, 4}));
  s.tensors.push_back(random_tensor(rng, "one", {1}));
  s.tensors.push_back(random_tensor(rng, "ls1_dflash_feature_data", {4, 0}));
  s.tensors.push_back(random_tensor(rng, std::string(63, 'x'), {2}));
  return s;
}

void expect_bit_equal(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_TRUE(a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0) << what;
}

void expect_same_snapshot(const Snapshot& got, const Snapshot& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.n_past, want.n_past);
  expect_bit_equal(got.last_logits, want.last_logits, "last_logits");
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    EXPECT_EQ(got.tensors[i].name, want.tensors[i].name);
    EXPECT_EQ(got.tensors[i].shape, want.tensors[i].shape) << want.tensors[i].name;
    expect_bit_equal(got.tensors[i].data, want.tensors[i].data, want.tensors[i].name);
  }
}

// Offset of the value of metadata key `key` (after its length, bytes and u32 type) in a GGUF file.
size_t value_offset(const std::vector<uint8_t>& file, const std::string& key) {
  auto it = std::search(file.begin(), file.end(), key.begin(), key.end());
  EXPECT_NE(it, file.end()) << key;
  return static_cast<size_t>(it - file.begin()) + key.size() + 4;
}

TEST(SnapshotFile, round_trip_is_bit_exact_with_mode_0600_and_no_temporaries) {
  const std::string dir = test::scratch_dir();
  const Snapshot snap = random_snapshot(1);
  const SnapshotIdentity id = sample_identity();
  ASSERT_TRUE(write_snapshot_file(dir, "a.snap", snap, id).ok());

  auto back = read_snapshot_file(dir + "/a.snap", id);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same_snapshot(*back, snap);

  auto info = peek_snapshot_file(dir + "/a.snap");
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->identity, id);
  EXPECT_EQ(info->tokens, snap.tokens);
  EXPECT_EQ(info->n_past, snap.n_past);
  EXPECT_EQ(info->file_bytes, fs::file_size(dir + "/a.snap"));

  struct stat st {};
  ASSERT_EQ(::stat((dir + "/a.snap").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(dir_entries(dir), std::set<std::string>{"a.snap"});

  // The in-memory variants read the same bytes the same way.
  const auto bytes = read_bytes(dir + "/a.snap");
  auto mem = read_snapshot_bytes(bytes, id);
  ASSERT_TRUE(mem.ok()) << mem.status().to_string();
  expect_same_snapshot(*mem, snap);
}

TEST(SnapshotFile, empty_snapshot_round_trips) {
  const std::string dir = test::scratch_dir();
  Snapshot snap;  // no tokens, no logits, no tensors
  SnapshotIdentity id;  // all defaults, no template
  ASSERT_TRUE(write_snapshot_file(dir, "empty", snap, id).ok());
  auto back = read_snapshot_file(dir + "/empty", id);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same_snapshot(*back, snap);
}

TEST(SnapshotFile, rewriting_a_name_replaces_the_file) {
  const std::string dir = test::scratch_dir();
  const SnapshotIdentity id = sample_identity();
  ASSERT_TRUE(write_snapshot_file(dir, "s", random_snapshot(1), id).ok());
  const Snapshot second = random_snapshot(2, 5);
  ASSERT_TRUE(write_snapshot_file(dir, "s", second, id).ok());
  auto back = read_snapshot_file(dir + "/s", id);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same_snapshot(*back, second);
  EXPECT_EQ(dir_entries(dir), std::set<std::string>{"s"});
}

// A decode step of the whole model on `state` (what Runner does, which this layer does not link):
// returns the logits of the last token and advances n_past.
Result<std::vector<float>> step_logits(const Weights& w, SequenceState& state, Backend& be,
                                       std::span<const int32_t> tokens) {
  const ModelSpec& s = w.spec();
  const int64_t n = static_cast<int64_t>(tokens.size());
  DF_ASSIGN_OR_RETURN(Buffer x, be.alloc(n * s.hidden));
  DF_RETURN_IF_ERROR(embed_tokens(w, tokens, x.data(), be));
  std::vector<int32_t> positions(static_cast<size_t>(n));
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(state.n_past()));
  StepShape shape{n, state.n_past(), positions, cpu::MaskKind::kCausal, {}, false};
  DF_RETURN_IF_ERROR(forward_layers(w, 0, s.n_layers, shape, x.data(), state, {}, {}, be));
  DF_RETURN_IF_ERROR(state.status());
  const int64_t last = n - 1;
  DF_ASSIGN_OR_RETURN(Buffer logits, be.alloc(s.vocab));
  DF_RETURN_IF_ERROR(lm_head(w, x.data(), std::span<const int64_t>(&last, 1), logits.data(), be));
  std::vector<float> out(static_cast<size_t>(s.vocab));
  DF_RETURN_IF_ERROR(be.download(out.data(), logits.data(), s.vocab));
  state.set_n_past(state.n_past() + n);
  return out;
}

TEST(SnapshotFile, restored_model_state_decodes_exactly_like_the_original) {
  auto w = Weights::load(test::fixture_path("models/tiny-qwen35"), 1);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  CpuBackend be(1);
  // 70 tokens: two KV chunks, the chunked DeltaNet form, and the recurrent one for the decode step.
  std::vector<int32_t> prompt(70);
  std::mt19937 rng(7);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % w->spec().vocab);
  SequenceState original(w->spec(), be);
  auto last = step_logits(*w, original, be, prompt);
  ASSERT_TRUE(last.ok()) << last.status().to_string();

  auto snap = original.export_snapshot();
  ASSERT_TRUE(snap.ok()) << snap.status().to_string();
  snap->tokens = prompt;
  snap->last_logits = *last;
  const std::string dir = test::scratch_dir();
  SnapshotIdentity id = sample_identity();
  id.n_ctx = 128;
  ASSERT_TRUE(write_snapshot_file(dir, "prefix.snap", *snap, id).ok());
  auto back = read_snapshot_file(dir + "/prefix.snap", id);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same_snapshot(*back, *snap);

  SequenceState restored(w->spec(), be);
  ASSERT_TRUE(restored.import_snapshot(*back).ok());
  EXPECT_EQ(restored.n_past(), original.n_past());
  const int32_t next[] = {5, 300, 17};
  for (int32_t t : next) {
    auto a = step_logits(*w, original, be, std::span<const int32_t>(&t, 1));
    auto b = step_logits(*w, restored, be, std::span<const int32_t>(&t, 1));
    ASSERT_TRUE(a.ok() && b.ok());
    expect_bit_equal(*b, *a, "logits after token " + std::to_string(t));
  }
}

TEST(SnapshotFile, every_identity_field_that_differs_is_a_miss) {
  const std::string dir = test::scratch_dir();
  const SnapshotIdentity id = sample_identity();
  ASSERT_TRUE(write_snapshot_file(dir, "s", random_snapshot(3), id).ok());
  std::vector<std::pair<std::string, SnapshotIdentity>> others;
  for (int field = 0; field < 6; ++field) {
    SnapshotIdentity o = id;
    const char* name = "";
    switch (field) {
      case 0: o.model_id = "other.gguf"; name = "model_id"; break;
      case 1: o.model_bytes += 1; name = "model_bytes"; break;
      case 2: o.model_mtime += 1; name = "model_mtime"; break;
      case 3: o.layout_hash ^= 1; name = "layout_hash"; break;
      case 4: o.n_ctx = 8192; name = "n_ctx"; break;
      case 5: o.template_hash = 0; name = "template_hash"; break;
    }
    auto r = read_snapshot_file(dir + "/s", o);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status().code(), ErrorCode::kNotFound) << r.status().to_string();
    EXPECT_NE(r.status().message().find(name), std::string::npos) << r.status().to_string();
  }
}

TEST(SnapshotFile, other_format_version_is_unsupported) {
  const std::string dir = test::scratch_dir();
  const SnapshotIdentity id = sample_identity();
  ASSERT_TRUE(write_snapshot_file(dir, "s", random_snapshot(4), id).ok());
  auto bytes = read_bytes(dir + "/s");
  const size_t at = value_offset(bytes, "dflash.snapshot.format_version");
  const uint32_t v2 = 2;
  std::memcpy(&bytes[at], &v2, 4);
  write_bytes(dir + "/s", bytes);
  auto r = read_snapshot_file(dir + "/s", id);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported) << r.status().to_string();
  EXPECT_NE(r.status().message().find("version 2"), std::string::npos) << r.status().to_string();
  EXPECT_FALSE(peek_snapshot_file(dir + "/s").ok());
}

TEST(SnapshotFile, every_flipped_byte_is_an_error) {
  const std::string dir = test::scratch_dir();
  const SnapshotIdentity id = sample_identity();
  ASSERT_TRUE(write_snapshot_file(dir, "s", random_snapshot(5, 9), id).ok());
  const auto good = read_bytes(dir + "/s");
  ASSERT_TRUE(read_snapshot_bytes(good, id).ok());
  auto info = peek_snapshot_bytes(good);
  ASSERT_TRUE(info.ok());
  // Where the tensor data starts: before it, peek must catch a flip too.
  auto gguf = GgufFile::parse(good);
  ASSERT_TRUE(gguf.ok());
  const size_t data_offset = gguf->data_offset();
  ASSERT_GT(good.size(), data_offset);

  int read_accepted = 0, peek_accepted = 0;
  for (size_t pos = 0; pos < good.size(); ++pos) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
      std::vector<uint8_t> bad = good;
      bad[pos] ^= mask;
      if (read_snapshot_bytes(bad, id).ok()) {
        ++read_accepted;
        ADD_FAILURE() << "read accepted a flip at " << pos << " of " << good.size() << " (mask " << int(mask) << ")";
      }
      if (pos < data_offset && peek_snapshot_bytes(bad).ok()) {
        ++peek_accepted;
        ADD_FAILURE() << "peek accepted a flip at header byte " << pos << " (mask " << int(mask) << ")";
      }
    }
    if (read_accepted + peek_accepted > 10) break;
  }
  // The same through files, at a sample of positions.
  for (size_t pos = 0; pos < good.size(); pos += 61) {
    std::vector<uint8_t> bad = good;
    bad[pos] ^= 0x10;
    write_bytes(dir + "/s", bad);
    EXPECT_FALSE(read_snapshot_file(dir + "/s", id).ok()) << "flip at " << pos;
  }
}

TEST(SnapshotFile, every_truncation_is_an_error) {
  const std::string dir = test::scratch_dir();
  const SnapshotIdentity id = sample_identity();
  ASSERT_TRUE(write_snapshot_file(dir, "s", random_snapshot(6, 9), id).ok());
  const auto good = read_bytes(dir + "/s");
  for (size_t len = 0; len < good.size(); ++len) {
    std::span<const uint8_t> cut(good.data(), len);
    EXPECT_FALSE(read_snapshot_bytes(cut, id).ok()) << "truncated to " << len;
    EXPECT_FALSE(peek_snapshot_bytes(cut).ok()) << "truncated to " << len;
  }
  // Trailing bytes are refused as well: the header describes the whole file.
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  EXPECT_FALSE(read_snapshot_bytes(longer, id).ok());
  // And through files, including an empty one.
  for (size_t len : {size_t{0}, size_t{3}, size_t{24}, good.size() / 2, good.size() - 1}) {
    write_bytes(dir + "/s", std::span<const uint8_t>(good.data(), len));
    auto r = read_snapshot_file(dir + "/s", id);
    ASSERT_FALSE(r.ok()) << len;
    EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt) << r.status().to_string();
    EXPECT_NE(r.status().message().find(dir + "/s"), std::string::npos) << r.status().to_string();
    EXPECT_FALSE(peek_snapshot_file(dir + "/s").ok()) << len;
  }
}

TEST(SnapshotFile, a_missing_file_is_not_found) {
  const std::string dir = test::scratch_dir();
  auto r = read_snapshot_file(dir + "/nothing", sample_identity());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(peek_snapshot_file(dir + "/nothing").status().code(), ErrorCode::kNotFound);
}

TEST(SnapshotFile, names_that_are_paths_are_refused_and_nothing_is_written) {
  const std::string parent = test::scratch_dir();
  const std::string dir = parent + "/cache";
  fs::create_directories(dir);
  const Snapshot snap = random_snapshot(7, 3);
  for (const std::string& name : {std::string("../x"), std::string("a/b"), std::string(""), std::string(300, 'n'),
                                  std::string(".."), std::string("."), std::string(".hidden"), std::string("/x"),
                                  std::string("x\n"), std::string(".dflash-snapshot-tmp.abc")}) {
    Status st = write_snapshot_file(dir, name, snap, sample_identity());
    ASSERT_FALSE(st.ok()) << name;
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
    EXPECT_FALSE(check_snapshot_file_name(name).ok()) << name;
  }
  EXPECT_TRUE(dir_entries(dir).empty());
  EXPECT_EQ(dir_entries(parent), std::set<std::string>{"cache"});
  EXPECT_TRUE(check_snapshot_file_name(std::string(kMaxSnapshotFileName, 'n')).ok());
  EXPECT_TRUE(check_snapshot_file_name("0123abcd.prefix-v1_snap").ok());
}

TEST(SnapshotFile, snapshots_that_cannot_be_read_back_are_refused_at_write) {
  const std::string dir = test::scratch_dir();
  const SnapshotIdentity id = sample_identity();
  auto refused = [&](Snapshot s, const std::string& what) {
    Status st = write_snapshot_file(dir, "s", s, id);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << what << ": " << st.to_string();
  };
  Snapshot s = random_snapshot(8, 4);
  { Snapshot t = s; t.n_past = 5; refused(t, "n_past != tokens"); }
  { Snapshot t = s; t.tensors[0].shape = {4, 2, 7}; refused(t, "shape != data"); }
  { Snapshot t = s; t.tensors[0].shape = {}; refused(t, "no dims"); }
  { Snapshot t = s; t.tensors[5].shape = {1, 1, 1, 1, 1}; refused(t, "5 dims"); }
  { Snapshot t = s; t.tensors[5].shape = {-1}; refused(t, "negative dim"); }
  { Snapshot t = s; t.tensors[5].name = std::string(64, 'x'); refused(t, "64-byte name"); }
  { Snapshot t = s; t.tensors[5].name = "a b"; refused(t, "space in name"); }
  { Snapshot t = s; t.tensors[5].name = ""; refused(t, "empty name"); }
  { Snapshot t = s; t.tensors[5].name = t.tensors[0].name; refused(t, "duplicate name"); }
  { Snapshot t = s; t.tensors[5].name = std::string(kSnapshotLogitsTensor); refused(t, "reserved name"); }
  {
    SnapshotIdentity small = id;
    small.n_ctx = 3;
    EXPECT_EQ(write_snapshot_file(dir, "s", s, small).code(), ErrorCode::kInvalidArgument) << "n_past > n_ctx";
  }
  EXPECT_TRUE(dir_entries(dir).empty());
}

TEST(SnapshotFile, missing_or_unwritable_directory_is_a_clear_error) {
  const std::string parent = test::scratch_dir();
  const Snapshot snap = random_snapshot(9, 3);
  const SnapshotIdentity id = sample_identity();

  Status missing = write_snapshot_file(parent + "/no-such-dir", "s", snap, id);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.message().find(parent + "/no-such-dir"), std::string::npos) << missing.to_string();

  write_bytes(parent + "/plain-file", std::vector<uint8_t>{1, 2, 3});
  Status not_dir = write_snapshot_file(parent + "/plain-file", "s", snap, id);
  ASSERT_FALSE(not_dir.ok());
  EXPECT_NE(not_dir.message().find("not a directory"), std::string::npos) << not_dir.to_string();

  std::string ro = parent + "/read-only";
  fs::create_directories(ro);
  ASSERT_EQ(::chmod(ro.c_str(), 0500), 0);
  if (::access(ro.c_str(), W_OK) == 0) ro = "/proc";  // root ignores modes; nobody creates files in /proc
  Status unwritable = write_snapshot_file(ro, "s", snap, id);
  ASSERT_FALSE(unwritable.ok());
  EXPECT_EQ(unwritable.code(), ErrorCode::kIo) << unwritable.to_string();
  EXPECT_NE(unwritable.message().find(ro), std::string::npos) << unwritable.to_string();
  ::chmod((parent + "/read-only").c_str(), 0700);
  EXPECT_TRUE(dir_entries(parent + "/read-only").empty());
}

TEST(SnapshotFile, a_killed_writers_temporary_is_never_read_and_is_removed_when_stale) {
  const std::string dir = test::scratch_dir();
  const SnapshotIdentity id = sample_identity();
  const Snapshot snap = random_snapshot(10);
  // What a writer killed mid-write leaves: its private directory with a partial file of the final name's
  // stem (GgufWriter's own temporary inside it).
  ASSERT_TRUE(write_snapshot_file(dir, "model", snap, id).ok());
  const auto full = read_bytes(dir + "/model");
  fs::remove(dir + "/model");
  const std::string leftover = dir + "/.dflash-snapshot-tmp.Ab12Cd";
  fs::create_directories(leftover);
  write_bytes(leftover + "/prefix.snap.tmp.0badf00d", std::span<const uint8_t>(full.data(), full.size() / 2));
  write_bytes(leftover + "/prefix.snap", full);  // killed between its rename and ours: complete, not published
  EXPECT_TRUE(is_snapshot_temp_name(".dflash-snapshot-tmp.Ab12Cd"));
  EXPECT_FALSE(is_snapshot_temp_name("prefix.snap"));

  EXPECT_EQ(peek_snapshot_file(dir + "/prefix.snap").status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(read_snapshot_file(dir + "/prefix.snap", id).status().code(), ErrorCode::kNotFound);

  // A fresh temporary may belong to a live writer: kept.
  auto kept = remove_stale_snapshot_temps(dir, 60);
  ASSERT_TRUE(kept.ok()) << kept.status().to_string();
  EXPECT_EQ(*kept, 0);

  ASSERT_TRUE(write_snapshot_file(dir, "prefix.snap", snap, id).ok());
  auto back = read_snapshot_file(dir + "/prefix.snap", id);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same_snapshot(*back, snap);

  // Two minutes old (the entry and what is in it): removed, the snapshot stays.
  const timespec old[2] = {{std::time(nullptr) - 120, 0}, {std::time(nullptr) - 120, 0}};
  for (const auto& e : fs::directory_iterator(leftover)) ASSERT_EQ(::utimensat(AT_FDCWD, e.path().c_str(), old, 0), 0);
  ASSERT_EQ(::utimensat(AT_FDCWD, leftover.c_str(), old, 0), 0);
  auto removed = remove_stale_snapshot_temps(dir, 60);
  ASSERT_TRUE(removed.ok()) << removed.status().to_string();
  EXPECT_EQ(*removed, 1);
  EXPECT_EQ(dir_entries(dir), std::set<std::string>{"prefix.snap"});
  EXPECT_TRUE(read_snapshot_file(dir + "/prefix.snap", id).ok());
}

}  // namespace
}  // namespace dflash

// FeatureRing: appends at the ring's end (any position when empty), rows_from's bounds, trimming to the
// capacity (one append larger than the capacity included), clear(pos), the snapshot round trip, import
// refusing what does not belong to it (another width, tag, end, shape, or meta that is not a small
// non-negative integer) by leaving an empty ring at the snapshot's n_past, and feature_tag telling layer
// lists apart. Rows hold fresh random values each run (the seed is printed on failure).
#include "state/feature_ring.h"

#include "ops/backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace dflash {
namespace {

class FeatureRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  // n rows of `width` random floats.
  std::vector<float> rows(int64_t n, int64_t width) {
    std::normal_distribution<float> d(0.0f, 3.0f);
    std::vector<float> r(static_cast<size_t>(n * width));
    for (auto& x : r) x = d(rng_);
    return r;
  }
  // Rows [a, b) of a [n, width] block.
  static std::vector<float> slice(const std::vector<float>& block, int64_t width, int64_t a, int64_t b) {
    return std::vector<float>(block.begin() + a * width, block.begin() + b * width);
  }
  static void expect_holds(const FeatureRing& ring, int64_t first, int64_t end, const std::vector<float>& want,
                           const std::string& what) {
    EXPECT_EQ(ring.first(), first) << what;
    EXPECT_EQ(ring.end(), end) << what;
    EXPECT_EQ(ring.empty(), first == end) << what;
    auto got = ring.rows_from(first);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status().to_string();
    EXPECT_EQ(*got, want) << what;
  }

  void ring_in_backend_memory(int64_t cap, int most);

  uint32_t seed_ = 0;
  std::mt19937 rng_;
};

TEST_F(FeatureRingTest, appends_in_order_and_reads_any_suffix) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int64_t W = 6;
  FeatureRing ring(W, 100, 0x123456);
  EXPECT_EQ(ring.width(), W);
  EXPECT_EQ(ring.capacity(), 100);
  EXPECT_TRUE(ring.empty());
  EXPECT_EQ(ring.first(), 0);
  EXPECT_EQ(ring.end(), 0);
  // An empty ring takes rows at any position.
  const auto a = rows(5, W), b = rows(3, W);
  ASSERT_TRUE(ring.append(17, a).ok());
  expect_holds(ring, 17, 22, a, "after the first append");
  ASSERT_TRUE(ring.append(22, b).ok());
  std::vector<float> all = a;
  all.insert(all.end(), b.begin(), b.end());
  expect_holds(ring, 17, 25, all, "after the second append");
  // Every suffix, the empty one at end() included.
  for (int64_t from = 17; from <= 25; ++from) {
    auto r = ring.rows_from(from);
    ASSERT_TRUE(r.ok()) << from;
    EXPECT_EQ(*r, slice(all, W, from - 17, 8)) << from;
  }
  // Outside [first, end]: refused.
  for (int64_t from : {16, 26, 0, -1}) {
    auto r = ring.rows_from(from);
    ASSERT_FALSE(r.ok()) << from;
    EXPECT_EQ(r.status().code(), ErrorCode::kInternal) << from;
    EXPECT_NE(r.status().message().find(std::to_string(from)), std::string::npos) << r.status().message();
  }
  // Zero rows at the end: nothing changes.
  ASSERT_TRUE(ring.append(25, {}).ok());
  expect_holds(ring, 17, 25, all, "after an empty append");
}

TEST_F(FeatureRingTest, refuses_rows_that_do_not_follow_its_end_and_partial_rows) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int64_t W = 4;
  FeatureRing ring(W, 50);
  const auto a = rows(3, W);
  ASSERT_TRUE(ring.append(10, a).ok());
  for (int64_t pos : {12, 14, 0, 9}) {
    const Status st = ring.append(pos, rows(2, W));
    ASSERT_FALSE(st.ok()) << pos;
    EXPECT_EQ(st.code(), ErrorCode::kInternal) << pos;
    EXPECT_NE(st.message().find(std::to_string(pos)), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("13"), std::string::npos) << st.message();  // the ring's end
    expect_holds(ring, 10, 13, a, "after a refused append at " + std::to_string(pos));
  }
  // Not a whole number of rows.
  const auto partial = rows(1, W + 1);
  const Status st = ring.append(13, partial);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  expect_holds(ring, 10, 13, a, "after a partial row");
}

TEST_F(FeatureRingTest, keeps_the_newest_capacity_rows) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int64_t W = 3, cap = 5;
  FeatureRing ring(W, cap);
  std::vector<float> all;  // rows of positions 0, 1, ...
  int64_t end = 0;
  // Appends of 1..4 rows: the ring holds min(end, cap) rows ending at end.
  for (int64_t n : {2, 1, 3, 4, 1, 2}) {
    const auto r = rows(n, W);
    ASSERT_TRUE(ring.append(end, r).ok());
    all.insert(all.end(), r.begin(), r.end());
    end += n;
    const int64_t first = std::max<int64_t>(0, end - cap);
    expect_holds(ring, first, end, slice(all, W, first, end), "after appending " + std::to_string(n));
  }
  // One append of more than the capacity onto a full ring: only its own newest rows survive.
  const auto big = rows(12, W);
  ASSERT_TRUE(ring.append(end, big).ok());
  expect_holds(ring, end + 12 - cap, end + 12, slice(big, W, 12 - cap, 12), "after a 12-row append");
  // ... onto an empty ring at an arbitrary position.
  FeatureRing fresh(W, cap);
  ASSERT_TRUE(fresh.append(100, big).ok());
  expect_holds(fresh, 107, 112, slice(big, W, 7, 12), "a 12-row first append");
  // Exactly the capacity.
  FeatureRing exact(W, cap);
  const auto five = rows(cap, W);
  ASSERT_TRUE(exact.append(0, five).ok());
  expect_holds(exact, 0, cap, five, "an append of exactly the capacity");
  // A capacity below 1 is 1.
  FeatureRing one(W, 0);
  EXPECT_EQ(one.capacity(), 1);
  const auto three = rows(3, W);
  ASSERT_TRUE(one.append(0, three).ok());
  expect_holds(one, 2, 3, slice(three, W, 2, 3), "capacity 0 taken as 1");
}

TEST_F(FeatureRingTest, clear_restarts_at_a_position) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int64_t W = 5;
  FeatureRing ring(W, 8);
  ASSERT_TRUE(ring.append(0, rows(6, W)).ok());
  ring.clear(40);
  EXPECT_TRUE(ring.empty());
  EXPECT_EQ(ring.first(), 40);
  EXPECT_EQ(ring.end(), 40);
  auto none = ring.rows_from(40);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_FALSE(ring.rows_from(39).ok());
  // Empty again: the next rows may start anywhere (the position given to clear is only the default end).
  const auto r = rows(2, W);
  ASSERT_TRUE(ring.append(40, r).ok());
  expect_holds(ring, 40, 42, r, "after clear(40) and an append at 40");
  ring.clear();
  EXPECT_EQ(ring.end(), 0);
  EXPECT_TRUE(ring.empty());
}

// A ring holding positions [5, 15) of 15 appended, exported at n_past 15.
struct Exported {
  Snapshot snap;
  std::vector<float> held;  // rows of positions 5..14
};

class FeatureRingSnapshot : public FeatureRingTest {
 protected:
  static constexpr int64_t kW = 6, kCap = 10;
  static constexpr uint32_t kTag = 0xABCDEF;
  Exported exported() {
    FeatureRing ring(kW, kCap, kTag);
    const auto all = rows(15, kW);
    EXPECT_TRUE(ring.append(0, all).ok());
    Exported e;
    e.snap.n_past = 15;
    ring.export_to(e.snap);
    e.held = slice(all, kW, 5, 15);
    return e;
  }
  SnapshotTensor* tensor(Snapshot& s, const std::string& name) {
    for (auto& t : s.tensors)
      if (t.name == name) return &t;
    ADD_FAILURE() << "no tensor " << name;
    static SnapshotTensor none;
    return &none;
  }
  // An import that must be refused: the ring (which held something before) ends up empty at n_past.
  void expect_refused(const Snapshot& snap, const std::string& what, int64_t width = kW, uint32_t tag = kTag) {
    FeatureRing ring(width, kCap, tag);
    ASSERT_TRUE(ring.append(3, rows(4, width)).ok());
    EXPECT_FALSE(ring.import_from(snap)) << what;
    EXPECT_TRUE(ring.empty()) << what;
    EXPECT_EQ(ring.first(), snap.n_past) << what;
    EXPECT_EQ(ring.end(), snap.n_past) << what;
    // And it takes rows from there on.
    EXPECT_TRUE(ring.append(snap.n_past, rows(1, width)).ok()) << what;
  }
};

TEST_F(FeatureRingSnapshot, export_and_import_round_trip) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const Exported e = exported();
  const SnapshotTensor* meta = e.snap.find("dflash_feature_meta");
  const SnapshotTensor* data = e.snap.find("dflash_feature_data");
  ASSERT_NE(meta, nullptr);
  ASSERT_NE(data, nullptr);
  EXPECT_EQ(meta->shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(meta->data, (std::vector<float>{5, 10, kW, static_cast<float>(kTag)}));
  EXPECT_EQ(data->shape, (std::vector<int64_t>{10, kW}));
  EXPECT_EQ(data->data, e.held);
  // Into a ring that held other rows: replaced.
  FeatureRing ring(kW, kCap, kTag);
  ASSERT_TRUE(ring.append(0, rows(30, kW)).ok());
  EXPECT_TRUE(ring.import_from(e.snap));
  expect_holds(ring, 5, 15, e.held, "imported");
  ASSERT_TRUE(ring.append(15, rows(1, kW)).ok());  // and continues at n_past
  // Into a smaller ring: the newest rows that fit.
  FeatureRing small(kW, 4, kTag);
  EXPECT_TRUE(small.import_from(e.snap));
  expect_holds(small, 11, 15, slice(e.held, kW, 6, 10), "imported into capacity 4");
  // An empty ring's export (cleared at 15) restores as an empty ring at 15.
  FeatureRing empty(kW, kCap, kTag);
  empty.clear(15);
  Snapshot s0;
  s0.n_past = 15;
  empty.export_to(s0);
  FeatureRing into(kW, kCap, kTag);
  ASSERT_TRUE(into.append(0, rows(2, kW)).ok());
  EXPECT_TRUE(into.import_from(s0));
  EXPECT_TRUE(into.empty());
  EXPECT_EQ(into.end(), 15);
}

TEST_F(FeatureRingSnapshot, import_refuses_another_width_tag_or_end) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const Exported e = exported();
  expect_refused(e.snap, "another width", kW + 2);
  expect_refused(e.snap, "another tag", kW, kTag ^ 1);
  expect_refused(e.snap, "tag 0 (a ring without a tag)", kW, 0);
  Snapshot later = e.snap;
  later.n_past = 16;  // the window does not end where the sequence does
  expect_refused(later, "an end past the window");
  Snapshot earlier = e.snap;
  earlier.n_past = 14;
  expect_refused(earlier, "an end inside the window");
  Snapshot none;  // made without a draft
  none.n_past = 15;
  expect_refused(none, "no feature tensors");
  Snapshot no_data = e.snap;
  std::erase_if(no_data.tensors, [](const SnapshotTensor& t) { return t.name == "dflash_feature_data"; });
  expect_refused(no_data, "no data tensor");
}

TEST_F(FeatureRingSnapshot, import_refuses_a_data_tensor_of_another_shape) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const Exported e = exported();
  {
    Snapshot s = e.snap;
    tensor(s, "dflash_feature_data")->shape = {kW, 10};
    expect_refused(s, "transposed shape");
  }
  {
    Snapshot s = e.snap;
    tensor(s, "dflash_feature_data")->shape = {10 * kW};
    expect_refused(s, "flat shape");
  }
  {
    Snapshot s = e.snap;
    tensor(s, "dflash_feature_data")->data.pop_back();
    expect_refused(s, "one value short");
  }
  {
    Snapshot s = e.snap;
    auto& d = tensor(s, "dflash_feature_data")->data;
    d.insert(d.end(), d.begin(), d.begin() + kW);
    expect_refused(s, "a row too many for the shape");
  }
  {
    Snapshot s = e.snap;  // n says 9 (first 6) but the data holds 10 rows
    tensor(s, "dflash_feature_meta")->data = {6, 9, kW, static_cast<float>(kTag)};
    expect_refused(s, "n disagreeing with the data");
  }
}

TEST_F(FeatureRingSnapshot, import_refuses_meta_that_is_not_a_small_non_negative_integer) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const Exported e = exported();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int field = 0; field < 4; ++field) {
    for (float bad : {nan, -nan, inf, -inf, -1.0f, -5.0f, 1e30f, 16777216.0f, 4294967296.0f}) {
      Snapshot s = e.snap;
      tensor(s, "dflash_feature_meta")->data[static_cast<size_t>(field)] = bad;
      expect_refused(s, "meta[" + std::to_string(field) + "] = " + std::to_string(bad));
    }
  }
  // A negative first with n making up n_past (first + n == n_past): still refused.
  {
    Snapshot s = e.snap;
    tensor(s, "dflash_feature_meta")->data = {-5, 20, kW, static_cast<float>(kTag)};
    expect_refused(s, "negative first");
  }
  // Meta of another length.
  for (size_t len : {0u, 3u, 5u}) {
    Snapshot s = e.snap;
    auto& m = tensor(s, "dflash_feature_meta")->data;
    m.resize(len, 0.0f);
    if (len >= 4) m[0] = 5, m[1] = 10, m[2] = kW, m[3] = static_cast<float>(kTag);
    expect_refused(s, "meta of " + std::to_string(len) + " values");
  }
}

TEST(FeatureTag, tells_layer_lists_apart_and_fits_24_bits) {
  const std::vector<std::vector<int64_t>> lists = {
      {},        {1},          {5},         {1, 5},        {5, 1},        {1, 6},         {2, 5},
      {1, 5, 9}, {1, 16, 31, 46, 61}, {1, 9, 17, 25, 33}, {1, 8, 15, 22, 29}, {1, 10, 19, 28, 37}, {0, 1}, {1, 2}};
  std::set<uint32_t> tags;
  for (const auto& l : lists) {
    const uint32_t t = feature_tag(l);
    EXPECT_LE(t, 0xFFFFFFu);
    EXPECT_EQ(static_cast<uint32_t>(static_cast<float>(t)), t) << "not exact as a float";
    EXPECT_EQ(feature_tag(l), t) << "deterministic";
    tags.insert(t);
  }
  EXPECT_EQ(tags.size(), lists.size()) << "two layer lists share a tag";
  // A ring keeps only 24 bits of the tag it is given: its export says so, and a ring made with the same
  // 24 bits takes the snapshot.
  FeatureRing wide(2, 4, 0xFF123456u);
  ASSERT_TRUE(wide.append(0, std::vector<float>{1, 2, 3, 4}).ok());
  Snapshot s;
  s.n_past = 2;
  wide.export_to(s);
  EXPECT_EQ(s.find("dflash_feature_meta")->data[3], static_cast<float>(0x123456));
  FeatureRing same(2, 4, 0x123456u);
  EXPECT_TRUE(same.import_from(s));
  EXPECT_EQ(same.end(), 2);
}

// A ring in a backend's memory (here the CPU backend's, as a device ring lives in a GPU's) against a host ring
// fed the same rows: random appends (whole blocks, or the per-layer captures of a step with and without a picked
// subset of its rows) wrap the circular buffer many times, and (window 300, appends up to 40 rows) grow it from 64
// rows to the window; after each, every suffix reads the same on the host and in the backend's memory. Copies
// hold their own rows; the snapshot round trip works.
TEST_F(FeatureRingTest, a_ring_in_backend_memory_holds_what_a_host_ring_holds) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const auto& [cap, most] : std::vector<std::pair<int64_t, int>>{{7, 9}, {300, 40}})
    ring_in_backend_memory(cap, most);
}

void FeatureRingTest::ring_in_backend_memory(int64_t cap, int most) {
  SCOPED_TRACE("window " + std::to_string(cap));
  CpuBackend be(1);
  const int64_t m = 3, H = 4, W = m * H;
  FeatureRing host(W, cap, 0x42), dev(W, cap, 0x42, &be);
  EXPECT_EQ(dev.device(), &be);
  EXPECT_EQ(host.device(), nullptr);
  int64_t end = 5;
  std::uniform_int_distribution<int> count(0, most), kind(0, 2);
  for (int step = 0; step < 60; ++step) {
    const int64_t n = count(rng_);
    const int k = kind(rng_);
    std::vector<float> block;  // the [n, W] rows the host ring gets
    if (k == 0) {
      block = rows(n, W);
      ASSERT_TRUE(dev.append(end, block).ok());
    } else {
      // A step's captures: layer c [steps, H]; rows appended are `pick` (k == 2) or the first n.
      const int64_t steps = n + 3;
      std::vector<std::vector<float>> layers;
      std::vector<Buffer> bufs;
      std::vector<const float*> ptrs;
      for (int64_t c = 0; c < m; ++c) {
        layers.push_back(rows(steps, H));
        auto b = be.alloc(steps * H);
        ASSERT_TRUE(b.ok());
        ASSERT_TRUE(be.upload(b->data(), layers.back().data(), steps * H).ok());
        ptrs.push_back(b->data());
        bufs.push_back(std::move(b).value());
      }
      std::vector<int64_t> pick;
      if (k == 2)
        for (int64_t r = 0; r < n; ++r) pick.push_back(std::uniform_int_distribution<int64_t>(0, steps - 1)(rng_));
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < m; ++c) {
          const float* src = layers[static_cast<size_t>(c)].data() + (k == 2 ? pick[static_cast<size_t>(r)] : r) * H;
          block.insert(block.end(), src, src + H);
        }
      ASSERT_TRUE(dev.append_layers(end, ptrs, n, pick).ok());
    }
    ASSERT_TRUE(host.append(end, block).ok());
    end += n;
    ASSERT_EQ(dev.first(), host.first()) << step;
    ASSERT_EQ(dev.end(), host.end()) << step;
    for (int64_t from = host.first(); from <= host.end(); ++from) {
      auto want = host.rows_from(from), got = dev.rows_from(from);
      ASSERT_TRUE(want.ok() && got.ok()) << step;
      EXPECT_EQ(*got, *want) << "step " << step << " from " << from;
      auto on_dev = dev.device_rows_from(from);
      ASSERT_TRUE(on_dev.ok()) << on_dev.status().to_string();
      std::vector<float> back(want->size());
      ASSERT_TRUE(be.download(back.data(), on_dev->data(), static_cast<int64_t>(back.size())).ok());
      EXPECT_EQ(back, *want) << "step " << step << " from " << from << " (device_rows_from)";
    }
  }
  // Out of range, and host-only calls: refused.
  EXPECT_FALSE(dev.device_rows_from(dev.first() - 1).ok());
  EXPECT_FALSE(host.device_rows_from(host.end()).ok());
  const float* none[] = {nullptr};
  EXPECT_FALSE(host.append_layers(host.end(), none, 0).ok());
  // A copy holds its own rows: appending to it leaves the original as it was.
  FeatureRing copy = dev;
  const auto more = rows(2, W);
  ASSERT_TRUE(copy.append(copy.end(), more).ok());
  auto orig = dev.rows_from(dev.first()), want = host.rows_from(host.first());
  ASSERT_TRUE(orig.ok() && want.ok());
  EXPECT_EQ(*orig, *want);
  EXPECT_EQ(copy.end(), dev.end() + 2);
  // The snapshot round trip, device to host ring and back.
  Snapshot snap;
  snap.n_past = dev.end();
  dev.export_to(snap);
  FeatureRing restored(W, cap, 0x42, &be), restored_host(W, cap, 0x42);
  ASSERT_TRUE(restored.import_from(snap));
  ASSERT_TRUE(restored_host.import_from(snap));
  expect_holds(restored, host.first(), host.end(), *want, "device ring from a snapshot");
  expect_holds(restored_host, host.first(), host.end(), *want, "host ring from a device ring's snapshot");
}

// Device memory of a fixed size: buffers in host memory up to `limit` bytes live, and nothing else (the ops a
// feature ring uses: alloc, copies, gather_rows); a device that runs out of room.
class SmallDevice final : public Backend {
 public:
  explicit SmallDevice(uint64_t limit) : limit_(limit) {}
  const char* name() const override { return "small-device"; }
  bool device_memory() const override { return true; }
  Result<Buffer> alloc(int64_t n) override {
    const uint64_t bytes = static_cast<uint64_t>(std::max<int64_t>(n, 1)) * sizeof(float);
    if (live_ + bytes > limit_) return Status(ErrorCode::kOutOfMemory, "small-device: out of memory");
    auto* p = new float[static_cast<size_t>(std::max<int64_t>(n, 1))];
    sizes_[p] = bytes;
    live_ += bytes;
    return Buffer(this, p, n);
  }
  void release(float* data) override {
    live_ -= sizes_[data];
    sizes_.erase(data);
    delete[] data;
  }
  Status upload(float* dst, const float* src, int64_t n) override { return copy(dst, src, n); }
  Status download(float* dst, const float* src, int64_t n) override { return copy(dst, src, n); }
  Status copy(float* dst, const float* src, int64_t n) override {
    std::copy_n(src, n, dst);
    return Status();
  }
  Status gather_rows(const float* x, int64_t dim, std::span<const int64_t> rows, float* out) override {
    for (size_t i = 0; i < rows.size(); ++i) std::copy_n(x + rows[i] * dim, dim, out + static_cast<int64_t>(i) * dim);
    return Status();
  }
  uint64_t live() const { return live_; }
#define DF_NO_OP(sig) \
  sig override { return unsupported("small-device computes nothing"); }
  DF_NO_OP(Status matmul(const cpu::WeightView&, const float*, int64_t, float*))
  DF_NO_OP(Status embedding(const cpu::WeightView&, std::span<const int32_t>, float*))
  DF_NO_OP(Status rms_norm(const float*, const float*, float, int64_t, int64_t, float*))
  DF_NO_OP(Status rope_neox(float*, int64_t, int64_t, int64_t, int64_t, std::span<const int32_t>, double, double))
  DF_NO_OP(Status attention(const float*, int64_t, int64_t, const cpu::KvView&, const cpu::AttentionMask&, float, float*))
  DF_NO_OP(Status gated_delta_net(const float*, const float*, const float*, const float*, const float*, int64_t,
                                  const cpu::DeltaNetShape&, float*, float*, float*, std::span<const int32_t>, bool,
                                  float*))
  DF_NO_OP(Status causal_conv1d_silu(const float*, int64_t, int64_t, const float*, int64_t, float*, float*,
                                     std::span<const int32_t>))
  DF_NO_OP(Status add_inplace(float*, const float*, int64_t))
  DF_NO_OP(Status mul_inplace(float*, const float*, int64_t))
  DF_NO_OP(Status silu_inplace(float*, int64_t))
  DF_NO_OP(Status sigmoid_inplace(float*, int64_t))
  DF_NO_OP(Status swiglu(const float*, const float*, float*, int64_t))
  DF_NO_OP(Status slice_columns(const float*, int64_t, int64_t, int64_t, int64_t, float*))
  DF_NO_OP(Status l2_norm_rows(float*, int64_t, int64_t, float, float))
  DF_NO_OP(Status deltanet_gates(float*, float*, const float*, const float*, int64_t, int64_t))
  DF_NO_OP(Status top_k_rows(const float*, int64_t, int64_t, int64_t, int32_t*, float*, float*))
#undef DF_NO_OP

 private:
  uint64_t limit_, live_ = 0;
  std::map<float*, uint64_t> sizes_;
};

// A device ring whose device runs out of room as it grows moves its rows to the host and goes on there, whether
// the growth comes with appended rows or with a step's captures (which then reach it through the host): the
// window it holds stays that of a host ring fed the same, and it gives its device memory back. A copy made
// when the device is full holds the rows on the host.
TEST_F(FeatureRingTest, a_ring_whose_device_is_full_goes_on_on_the_host) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int64_t m = 2, H = 3, W = m * H, cap = 500;
  for (const bool by_captures : {false, true}) {
    SCOPED_TRACE(by_captures ? "grown by a step's captures" : "grown by appended rows");
    // Room for the first buffer (64 rows) and a step's captures, not for the doubled one (128 rows) beside it.
    SmallDevice dev(static_cast<uint64_t>(100 * W) * sizeof(float));
    FeatureRing ring(W, cap, 0x7, &dev), host(W, cap, 0x7);
    const auto first = rows(60, W);
    ASSERT_TRUE(ring.append(3, first).ok());
    ASSERT_TRUE(host.append(3, first).ok());
    ASSERT_EQ(ring.device(), &dev);
    // 9 more rows: past the 64 the device buffer holds.
    std::vector<float> block;
    if (by_captures) {
      std::vector<Buffer> bufs;
      std::vector<const float*> ptrs;
      std::vector<std::vector<float>> layers;
      for (int64_t c = 0; c < m; ++c) {
        layers.push_back(rows(9, H));
        auto buf = dev.alloc(9 * H);
        ASSERT_TRUE(buf.ok());
        ASSERT_TRUE(dev.upload(buf->data(), layers.back().data(), 9 * H).ok());
        ptrs.push_back(buf->data());
        bufs.push_back(std::move(buf).value());
      }
      for (int64_t r = 0; r < 9; ++r)
        for (int64_t c = 0; c < m; ++c)
          block.insert(block.end(), layers[static_cast<size_t>(c)].begin() + r * H,
                       layers[static_cast<size_t>(c)].begin() + (r + 1) * H);
      const Status st = ring.append_layers(63, ptrs, 9);
      ASSERT_TRUE(st.ok()) << st.to_string();
    } else {
      block = rows(9, W);
      const Status st = ring.append(63, block);
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
    ASSERT_TRUE(host.append(63, block).ok());
    EXPECT_EQ(ring.device(), nullptr) << "the ring should have left the full device";
    EXPECT_EQ(dev.live(), 0u) << "a ring on the host holds no device memory";
    // It goes on as a host ring, past its window too.
    for (int i = 0; i < 60; ++i) {
      const auto more = rows(1 + i % 17, W);
      ASSERT_TRUE(ring.append(ring.end(), more).ok());
      ASSERT_TRUE(host.append(host.end(), more).ok());
    }
    auto want = host.rows_from(host.first());
    ASSERT_TRUE(want.ok());
    expect_holds(ring, host.first(), host.end(), *want, "after the move");
  }
  // A copy of a device ring made when the device is full holds the rows on the host.
  SmallDevice tight(static_cast<uint64_t>(70 * W) * sizeof(float));
  FeatureRing small(W, 60, 0x7, &tight);
  const auto a = rows(40, W);
  ASSERT_TRUE(small.append(0, a).ok());
  ASSERT_NE(small.device(), nullptr);
  FeatureRing copy = small;
  EXPECT_EQ(copy.device(), nullptr);
  expect_holds(copy, 0, 40, a, "a copy made on a full device");
  expect_holds(small, 0, 40, a, "the original");
}

}  // namespace
}  // namespace dflash

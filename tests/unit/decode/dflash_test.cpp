// DFlash on the tiny fixtures (algorithms.md A.2-A.5, B.3-B.7):
//  - the target's captured features, the draft forward (block hidden rows and logits) and DFlashDraft::propose
//    (its top-k candidates and log-probs) against PyTorch (tests/fixtures/models/tiny-qwen35-dflash/
//    reference.safetensors, made by tools/reference/make_tiny_draft.py), incrementally and in one call, and
//    the draft context's restart rules;
//  - DFlashDraft::create's refusals, each naming the problem;
// (verify_tree and speculative_step: dflash_verify_test.cpp.)
//
// Tolerances. Against PyTorch (f32 on both sides, other summation orders): features 1e-4 absolute (values
// of order 1-10), draft logits 1e-4 relative to the largest logit, draft log-probs 2e-5 absolute (logits of
// magnitude < 5; ~2e-6 measured). Within this code base the CPU kernels are
// batch-invariant by design (a matmul row does not depend on the batch, attention walks keys in KV-chunk
// order, the recurrent DeltaNet runs the same arithmetic per token), so everything compared between two runs
// of our own code is compared bit for bit.
#include "decode/dflash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "decode/ddtree.h"
#include "decode/runner.h"
#include "decode/sampler.h"
#include "formats/safetensors.h"
#include "model/forward.h"
#include "model/weights.h"
#include "state/feature_ring.h"
#include "state/sequence_state.h"
#include "support/random_hf_model.h"
#include "support/fixture_models.h"
#include "support/test_paths.h"
#include "unit/decode/decode_test_util.h"
#include "unit/ops/ops_test_util.h"

namespace dflash {
namespace {

using test::argmax;
using test::bit_equal;
using test::max_abs;
using test::max_abs_diff;

constexpr int kThreads = 2;

// Fixture models, loaded once per process.
const Weights& model(const std::string& name) { return test::fixture_model(name); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ---------------------------------------------------------------------------------------------------------
// The PyTorch reference of the tiny draft.

struct DraftReference {
  std::vector<int32_t> prompt;     // 50 ids
  std::vector<float> features;     // [50, 128]: concat of tiny-qwen35's layer 1 and 5 outputs
  std::vector<float> logits[2];    // [7, 512]: calls s = 40 and s = 45
  std::vector<float> hidden0;      // [8, 64]: final-normed draft hidden of call 0's block
  int64_t s[2] = {0, 0};
  int32_t root[2] = {0, 0};
};

const DraftReference& draft_reference() {
  static const DraftReference ref = [] {
    DraftReference r;
    const std::string dir = test::fixture_path("models/tiny-qwen35-dflash");
    auto j = nlohmann::json::parse(*read_text_file(dir + "/reference.json"));
    r.prompt = j["prompt"].get<std::vector<int32_t>>();
    for (int k = 0; k < 2; ++k) {
      r.s[k] = j["calls"][k]["s"].get<int64_t>();
      r.root[k] = j["calls"][k]["root"].get<int32_t>();
    }
    auto st = SafetensorsFile::open(dir + "/reference.safetensors");
    EXPECT_TRUE(st.ok()) << st.status().to_string();
    auto get = [&](const std::string& name, std::vector<uint64_t> shape) {
      const SafetensorsTensor* t = st->find(name);
      EXPECT_NE(t, nullptr) << name;
      EXPECT_EQ(t->dtype, SafetensorsDType::kF32) << name;
      EXPECT_EQ(t->shape, shape) << name;
      std::vector<float> v(t->n_elements());
      std::memcpy(v.data(), t->data.data(), v.size() * sizeof(float));
      return v;
    };
    r.features = get("features", {50, 128});
    r.logits[0] = get("draft_logits.0", {7, 512});
    r.logits[1] = get("draft_logits.1", {7, 512});
    r.hidden0 = get("draft_hidden.0", {8, 64});
    return r;
  }();
  return ref;
}

std::vector<float> feature_rows(const DraftReference& r, int64_t a, int64_t b) {
  return std::vector<float>(r.features.begin() + a * 128, r.features.begin() + b * 128);
}

// ---------------------------------------------------------------------------------------------------------
// Target features (A.2).

TEST(DFlashFeatures, target_capture_matches_pytorch_and_rows_are_position_major) {
  const DraftReference& ref = draft_reference();
  ASSERT_EQ(ref.prompt.size(), 50u);
  ASSERT_EQ(ref.prompt[ref.s[0]], ref.root[0]);
  ASSERT_EQ(ref.prompt[ref.s[1]], ref.root[1]);
  const Weights& target = model("tiny-qwen35");
  Runner runner(target, kThreads);
  SequenceState state(target.spec(), runner.backend());
  const int64_t layers[] = {1, 5};
  Step step;
  step.tokens = ref.prompt;
  step.capture_layers = layers;
  auto out = runner.forward(state, step);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->features.size(), 2u);
  const int64_t H = 64, n = 50;
  for (const auto& f : out->features) ASSERT_EQ(f.size(), static_cast<size_t>(n * H));
  // The ring's rows are [t][layer][H]: row t = [h_t^1 ; h_t^5], PyTorch's concat.
  FeatureRing ring(2 * H, 4096, feature_tag(layers));
  ASSERT_TRUE(append_features(ring, 0, *out, n).ok());
  EXPECT_EQ(ring.first(), 0);
  EXPECT_EQ(ring.end(), n);
  auto rows = ring.rows_from(0);
  ASSERT_TRUE(rows.ok());
  std::vector<float> want(static_cast<size_t>(n * 2 * H));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < 2; ++c)
      std::memcpy(want.data() + (t * 2 + c) * H, out->features[static_cast<size_t>(c)].data() + t * H, H * sizeof(float));
  EXPECT_TRUE(bit_equal(*rows, want));
  const double err = max_abs_diff(*rows, ref.features);
  EXPECT_LT(err, 1e-4) << "features vs HF hidden_states[2] and [6] (max |value| " << max_abs(ref.features) << ")";
}

// Capturing features is a copy of the residual stream: the logits are those of a step without captures.
TEST(DFlashFeatures, capturing_does_not_change_the_logits) {
  for (const char* name : {"tiny-qwen35", "tiny-qwen3"}) {
    SCOPED_TRACE(name);
    const Weights& w = model(name);
    Runner runner(w, kThreads);
    test::SeededRng seeded;
    std::mt19937& rng = seeded.rng;
    std::vector<int32_t> prompt(37);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % w.spec().vocab);
    const int64_t layers[] = {0, 1, 2};
    SequenceState a(w.spec(), runner.backend()), b(w.spec(), runner.backend());
    Step plain;
    plain.tokens = prompt;
    plain.all_logits = true;
    Step cap = plain;
    cap.capture_layers = layers;
    auto la = runner.forward(a, plain);
    auto lb = runner.forward(b, cap);
    ASSERT_TRUE(la.ok() && lb.ok());
    EXPECT_TRUE(bit_equal(la->logits, lb->logits));
    EXPECT_TRUE(la->features.empty());
    EXPECT_EQ(lb->features.size(), 3u);
  }
}

TEST(DFlashFeatures, append_features_lays_out_rows_and_checks_its_input) {
  StepOutput out;
  out.features = {{1, 2, 3, 4, 5, 6}, {10, 20, 30, 40, 50, 60}};  // 2 layers, H = 2, 3 tokens
  FeatureRing ring(4, 16);
  ASSERT_TRUE(append_features(ring, 7, out, 3).ok());
  EXPECT_EQ(ring.first(), 7);
  EXPECT_EQ(*ring.rows_from(7), (std::vector<float>{1, 2, 10, 20, 3, 4, 30, 40, 5, 6, 50, 60}));
  // Only the first n rows of a capture.
  FeatureRing two(4, 16);
  ASSERT_TRUE(append_features(two, 0, out, 2).ok());
  EXPECT_EQ(*two.rows_from(0), (std::vector<float>{1, 2, 10, 20, 3, 4, 30, 40}));
  // No capture, a ring of another width, a capture shorter than n rows, a position off the ring's end.
  StepOutput none;
  EXPECT_EQ(append_features(ring, 10, none, 1).code(), ErrorCode::kInternal);
  FeatureRing odd(5, 16);
  EXPECT_FALSE(append_features(odd, 0, out, 1).ok());
  EXPECT_FALSE(append_features(ring, 10, out, 4).ok());
  EXPECT_FALSE(append_features(ring, 11, out, 1).ok());
  EXPECT_EQ(ring.end(), 10);
}

// ---------------------------------------------------------------------------------------------------------
// The draft forward (A.3) against PyTorch.

class DraftForward : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = DFlashDraft::create(model("tiny-qwen35-dflash"), model("tiny-qwen35"), be_);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    draft_ = std::move(d).value();
    ASSERT_EQ(draft_->block_size(), 8);
    ASSERT_EQ(draft_->feature_width(), 128);
    ASSERT_EQ(draft_->mask_token(), 511);
    ASSERT_EQ(std::vector<int64_t>(draft_->capture_layers().begin(), draft_->capture_layers().end()),
              (std::vector<int64_t>{1, 5}));
  }
  FeatureRing ring(int64_t capacity = 4096) const {
    return FeatureRing(draft_->feature_width(), capacity, feature_tag(draft_->capture_layers()));
  }
  // The draft's top kK candidates of block rows 1 .. rows (k = the most the backend reduces).
  static constexpr int64_t kK = Backend::kMaxTopK;
  DraftTopK propose(DFlashDraft::Context& ctx, const FeatureRing& r, int32_t root, int64_t rows = 7, int64_t k = kK) {
    auto l = draft_->propose(ctx, r, root, rows, k);
    EXPECT_TRUE(l.ok()) << l.status().to_string();
    return l.ok() ? std::move(l).value() : DraftTopK();
  }
  // Bit for bit (the first `rows` rows of b when given).
  static bool same(const DraftTopK& a, const DraftTopK& b, int64_t rows = -1) {
    if (rows < 0) rows = b.depth;
    const auto n = static_cast<size_t>(rows * b.k);
    return a.depth == rows && a.k == b.k && a.tokens.size() == n && b.tokens.size() >= n &&
           std::equal(a.tokens.begin(), a.tokens.end(), b.tokens.begin()) &&
           bit_equal(a.logprobs, std::span<const float>(b.logprobs).first(n));
  }
  // The draft's candidates against PyTorch's logits [rows, 512]: each candidate's log-prob equals
  // log_softmax of PyTorch's row at that token within `tol`, the candidates are in descending order, and
  // every token PyTorch puts more than `tol` above the k-th candidate is a candidate. Returns the largest
  // log-prob difference.
  static double expect_matches(const DraftTopK& got, const std::vector<float>& logits, double tol, const std::string& what) {
    double worst = 0;
    const int64_t V = 512;
    EXPECT_EQ(got.depth * V, static_cast<int64_t>(logits.size())) << what;
    for (int64_t r = 0; r < got.depth; ++r) {
      const float* row = logits.data() + r * V;
      double mx = row[0], sum = 0;
      for (int64_t v = 1; v < V; ++v) mx = std::max<double>(mx, row[v]);
      for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
      const double lse = mx + std::log(sum);
      std::set<int32_t> cand;
      for (int64_t j = 0; j < got.k; ++j) {
        const int32_t t = got.tokens[static_cast<size_t>(r * got.k + j)];
        const float lp = got.logprobs[static_cast<size_t>(r * got.k + j)];
        const double d = std::fabs(lp - (row[t] - lse));
        worst = std::max(worst, d);
        EXPECT_LT(d, tol) << what << " row " << r << " candidate " << j << " token " << t;
        if (j > 0) {
          EXPECT_LE(lp, got.logprobs[static_cast<size_t>(r * got.k + j - 1)]) << what << " row " << r;
        }
        cand.insert(t);
      }
      EXPECT_EQ(cand.size(), static_cast<size_t>(got.k)) << what << " row " << r << ": repeated candidates";
      const double kth = got.logprobs[static_cast<size_t>(r * got.k + got.k - 1)];
      for (int32_t v = 0; v < V; ++v)
        if (!cand.count(v)) {
          EXPECT_LE(row[v] - lse, kth + tol) << what << " row " << r << ": token " << v << " belongs in the top " << got.k;
        }
    }
    return worst;
  }

  CpuBackend be_{kThreads};
  std::unique_ptr<DFlashDraft> draft_;
};

// Call 0: context 0..39, root prompt[40]; call 1 on the same context appends only rows 40..44. The
// candidates are PyTorch's top 16 with PyTorch's log-probs.
TEST_F(DraftForward, propose_matches_pytorch_incrementally) {
  const DraftReference& ref = draft_reference();
  FeatureRing r = ring();
  ASSERT_TRUE(r.append(0, feature_rows(ref, 0, ref.s[0])).ok());
  DFlashDraft::Context ctx(*draft_);
  const DraftTopK l0 = propose(ctx, r, ref.root[0]);
  ASSERT_EQ(l0.depth, 7);
  ASSERT_EQ(l0.k, kK);
  // Log-probs within 2e-5 (logits of magnitude < 5, f32 on both sides in other orders: ~2e-6 measured).
  const double e0 = expect_matches(l0, ref.logits[0], 2e-5, "call 0");
  EXPECT_EQ(ctx.base(), 0);
  EXPECT_EQ(ctx.end(), ref.s[0]);
  ASSERT_TRUE(r.append(ref.s[0], feature_rows(ref, ref.s[0], ref.s[1])).ok());
  const DraftTopK l1 = propose(ctx, r, ref.root[1]);
  const double e1 = expect_matches(l1, ref.logits[1], 2e-5, "call 1");
  EXPECT_EQ(ctx.base(), 0);
  EXPECT_EQ(ctx.end(), ref.s[1]);
  std::printf("  draft log-probs vs PyTorch: max diff %.2e (call 0), %.2e (call 1); max |logit| %.1f, %.1f\n", e0, e1,
              max_abs(ref.logits[0]), max_abs(ref.logits[1]));
  // k = 1 is the argmax chain: the first candidate of each row.
  DFlashDraft::Context c1(*draft_);
  const DraftTopK top1 = propose(c1, r, ref.root[1], 7, 1);
  ASSERT_EQ(top1.k, 1);
  for (int64_t row = 0; row < 7; ++row) {
    EXPECT_EQ(top1.tokens[static_cast<size_t>(row)], l1.tokens[static_cast<size_t>(row * kK)]) << row;
    EXPECT_EQ(top1.logprobs[static_cast<size_t>(row)], l1.logprobs[static_cast<size_t>(row * kK)]) << row;
  }
}

// A fresh context fed all 45 rows at once equals the one built in two calls, bit for bit (the context K/V
// rows are per-row products, and the block's attention walks the same keys in the same chunks); so do a
// repeated call, a call with fewer rows, and a call after another root.
TEST_F(DraftForward, one_context_call_equals_the_incremental_context) {
  const DraftReference& ref = draft_reference();
  FeatureRing r = ring();
  ASSERT_TRUE(r.append(0, feature_rows(ref, 0, ref.s[0])).ok());
  DFlashDraft::Context inc(*draft_);
  propose(inc, r, ref.root[0]);
  ASSERT_TRUE(r.append(ref.s[0], feature_rows(ref, ref.s[0], ref.s[1])).ok());
  const DraftTopK l_inc = propose(inc, r, ref.root[1]);
  DFlashDraft::Context once(*draft_);
  const DraftTopK l_once = propose(once, r, ref.root[1]);
  EXPECT_TRUE(same(l_inc, l_once));
  EXPECT_EQ(once.end(), ref.s[1]);
  // Asking again with no new rows: the block's K/V are not kept, the context is unchanged.
  EXPECT_TRUE(same(propose(inc, r, ref.root[1]), l_inc));
  EXPECT_EQ(inc.end(), ref.s[1]);
  // Another root on the same context, then the first root again.
  EXPECT_FALSE(same(propose(inc, r, 7), l_inc));
  EXPECT_TRUE(same(propose(inc, r, ref.root[1]), l_inc));
  // Fewer rows: the first rows of the full block's candidates.
  for (int64_t rows : {1, 3, 6}) {
    DFlashDraft::Context c(*draft_);
    EXPECT_TRUE(same(propose(c, r, ref.root[1], rows), l_inc, rows)) << rows << " rows";
  }
}

// The block's final-normed hidden rows (row 0, the root, included) and the logits of rows 1..7 against
// PyTorch, through the forward-level draft functions.
TEST_F(DraftForward, block_hidden_and_logits_match_pytorch) {
  const DraftReference& ref = draft_reference();
  const Weights& d = model("tiny-qwen35-dflash");
  const Weights& t = model("tiny-qwen35");
  const int64_t H = 64, B = 8, n = ref.s[0];
  SequenceState kv(d.spec(), be_);
  auto f = be_.alloc(n * 128);
  auto c = be_.alloc(n * H);
  auto x = be_.alloc(B * H);
  ASSERT_TRUE(f.ok() && c.ok() && x.ok());
  const auto feats = feature_rows(ref, 0, n);
  ASSERT_TRUE(be_.upload(f->data(), feats.data(), n * 128).ok());
  ASSERT_TRUE(draft_context(d, f->data(), n, c->data(), be_).ok());
  std::vector<int32_t> block(B, 511);
  block[0] = ref.root[0];
  ASSERT_TRUE(be_.embedding(*t.find("token_embd"), block, x->data()).ok());
  std::vector<int32_t> positions(static_cast<size_t>(n + B));
  std::iota(positions.begin(), positions.end(), 0);
  const Status st = draft_layers(d, c->data(), n, 0, positions, x->data(), B, kv, be_);
  ASSERT_TRUE(st.ok()) << st.to_string();
  std::vector<float> hid(B * H);
  ASSERT_TRUE(be_.download(hid.data(), x->data(), B * H).ok());
  // The logits of rows 1..7 through the target's head: PyTorch's, within 1e-4 of the largest.
  const std::vector<int64_t> rows = {1, 2, 3, 4, 5, 6, 7};
  auto lg = be_.alloc(7 * 512);
  ASSERT_TRUE(lg.ok());
  ASSERT_TRUE(draft_head(d, t, x->data(), rows, lg->data(), be_).ok());
  std::vector<float> logits(7 * 512);
  ASSERT_TRUE(be_.download(logits.data(), lg->data(), 7 * 512).ok());
  EXPECT_LT(max_abs_diff(logits, ref.logits[0]), 1e-4 * max_abs(ref.logits[0])) << "max |logit| " << max_abs(ref.logits[0]);
  const float* norm = d.f32("output_norm");
  ASSERT_NE(norm, nullptr);
  for (int64_t r = 0; r < B; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < H; ++i) ss += double(hid[r * H + i]) * hid[r * H + i];
    const double scale = 1.0 / std::sqrt(ss / H + d.spec().rms_eps);
    for (int64_t i = 0; i < H; ++i) hid[r * H + i] = static_cast<float>(hid[r * H + i] * scale * norm[i]);
  }
  EXPECT_LT(max_abs_diff(hid, ref.hidden0), 1e-4) << "max |value| " << max_abs(ref.hidden0);
}

// The context continues while the ring still reaches back to its end; when the ring has moved past it (a
// restore, a ring cleared at a later position) it restarts at the ring's first row, exactly like a fresh one.
TEST_F(DraftForward, context_restarts_where_the_ring_begins_when_it_cannot_continue) {
  const DraftReference& ref = draft_reference();
  // A small ring (8 rows) behind a context that took rows 0..39: the context still holds 0..39 and
  // continues with 40..44 (the draft attends to more than the ring holds): same as the big ring.
  FeatureRing small = ring(8);
  ASSERT_TRUE(small.append(0, feature_rows(ref, 0, 40)).ok());
  EXPECT_EQ(small.first(), 32);
  DFlashDraft::Context ctx(*draft_);
  propose(ctx, small, ref.root[0]);
  EXPECT_EQ(ctx.base(), 32);  // a fresh context starts at the ring's first row
  ASSERT_TRUE(small.append(40, feature_rows(ref, 40, 45)).ok());
  const auto cont = propose(ctx, small, ref.root[1]);
  EXPECT_EQ(ctx.base(), 32);
  EXPECT_EQ(ctx.end(), 45);
  // The ring moves past the context: cleared at 100 with 5 new rows. Restart at 100 == a fresh context.
  small.clear(100);
  ASSERT_TRUE(small.append(100, feature_rows(ref, 0, 5)).ok());
  const auto restarted = propose(ctx, small, ref.root[0]);
  EXPECT_EQ(ctx.base(), 100);
  EXPECT_EQ(ctx.end(), 105);
  DFlashDraft::Context fresh(*draft_);
  EXPECT_TRUE(same(restarted, propose(fresh, small, ref.root[0])));
  EXPECT_FALSE(same(restarted, cont));
  // A ring behind the context's end (the sequence was cut back): restart too.
  FeatureRing behind = ring();
  ASSERT_TRUE(behind.append(0, feature_rows(ref, 0, 41)).ok());
  DFlashDraft::Context c2(*draft_);
  FeatureRing ahead = ring();
  ASSERT_TRUE(ahead.append(0, feature_rows(ref, 0, 45)).ok());
  propose(c2, ahead, ref.root[1]);
  EXPECT_EQ(c2.end(), 45);
  const auto cut = propose(c2, behind, ref.prompt[41]);
  EXPECT_EQ(c2.base(), 0);
  EXPECT_EQ(c2.end(), 41);
  DFlashDraft::Context fresh2(*draft_);
  EXPECT_TRUE(same(cut, propose(fresh2, behind, ref.prompt[41])));
  // An empty ring (a sequence restored without features): the block attends to itself only.
  FeatureRing empty = ring();
  empty.clear(45);
  DFlashDraft::Context c3(*draft_);
  const DraftTopK alone = propose(c3, empty, ref.root[1]);
  EXPECT_EQ(alone.tokens.size(), static_cast<size_t>(7 * kK));
  EXPECT_EQ(c3.base(), 45);
  EXPECT_EQ(c3.end(), 45);
  c3.reset();
  EXPECT_EQ(c3.end(), 0);
}

TEST_F(DraftForward, propose_refuses_bad_arguments) {
  const DraftReference& ref = draft_reference();
  FeatureRing r = ring();
  ASSERT_TRUE(r.append(0, feature_rows(ref, 0, 10)).ok());
  DFlashDraft::Context ctx(*draft_);
  for (int64_t rows : {0, -1, 8, 100}) {
    auto l = draft_->propose(ctx, r, 5, rows, 4);
    ASSERT_FALSE(l.ok()) << rows;
    EXPECT_EQ(l.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_TRUE(contains(l.status().message(), std::to_string(rows))) << l.status().message();
  }
  for (int32_t root : {-1, 512, 100000}) {
    auto l = draft_->propose(ctx, r, root, 7, 4);
    ASSERT_FALSE(l.ok()) << root;
    EXPECT_EQ(l.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_TRUE(contains(l.status().message(), std::to_string(root))) << l.status().message();
  }
  for (int64_t k : {int64_t{0}, int64_t{-1}, kK + 1}) {
    auto l = draft_->propose(ctx, r, 5, 7, k);
    ASSERT_FALSE(l.ok()) << k;
    EXPECT_EQ(l.status().code(), ErrorCode::kInvalidArgument);
  }
  FeatureRing narrow(64, 16);
  ASSERT_TRUE(narrow.append(0, std::vector<float>(64, 1.0f)).ok());
  auto l = draft_->propose(ctx, narrow, 5, 7, 4);
  ASSERT_FALSE(l.ok());
  EXPECT_TRUE(contains(l.status().message(), "64") && contains(l.status().message(), "128")) << l.status().message();
}

// ---------------------------------------------------------------------------------------------------------
// DFlashDraft::create: the checks that bind a draft to a target.

class DraftCreate : public ::testing::Test {
 protected:
  // The fixture draft's directory copied with its config edited by `edit`.
  std::string edited_draft(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
    namespace fs = std::filesystem;
    const std::string src = test::fixture_path("models/tiny-qwen35-dflash");
    fs::create_directories(dir);
    fs::copy_file(src + "/model.safetensors", dir + "/model.safetensors", fs::copy_options::overwrite_existing);
    auto cfg = nlohmann::json::parse(*read_text_file(src + "/config.json"));
    edit(cfg);
    const std::string text = cfg.dump(2);
    test::write_bytes(dir + "/config.json", std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
    return dir;
  }
  static std::string refusal(const Weights& draft, const Weights& target, CpuBackend& be) {
    auto d = DFlashDraft::create(draft, target, be);
    EXPECT_FALSE(d.ok());
    if (d.ok()) return "";
    EXPECT_EQ(d.status().code(), ErrorCode::kInvalidArgument) << d.status().to_string();
    return d.status().message();
  }
  CpuBackend be_{1};
};

TEST_F(DraftCreate, refuses_a_draft_that_does_not_fit_the_target) {
  const Weights& draft = model("tiny-qwen35-dflash");
  const Weights& qwen35 = model("tiny-qwen35");
  const Weights& qwen3 = model("tiny-qwen3");
  ASSERT_TRUE(DFlashDraft::create(draft, qwen35, be_).ok());
  // A target as the draft, a draft as the target.
  EXPECT_TRUE(contains(refusal(qwen35, qwen35, be_), "not a DFlash draft"));
  EXPECT_TRUE(contains(refusal(draft, draft, be_), "target is itself a DFlash draft"));
  // The draft names its target's depth (num_target_layers 8): a 4-layer target.
  {
    const std::string m = refusal(draft, qwen3, be_);
    EXPECT_TRUE(contains(m, "8-layer") && contains(m, "4 layers")) << m;
  }
  const std::string scratch = test::scratch_dir();
  // Without num_target_layers, the capture layer 5 is past tiny-qwen3's 4 layers.
  {
    auto w = Weights::load(edited_draft(scratch + "/no-depth", [](nlohmann::json& c) { c.erase("num_target_layers"); }), 1);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    ASSERT_TRUE(DFlashDraft::create(*w, qwen35, be_).ok());
    const std::string m = refusal(*w, qwen3, be_);
    EXPECT_TRUE(contains(m, "layer 5") && contains(m, "4 layers")) << m;
  }
  // No mask token at all.
  {
    auto w = Weights::load(edited_draft(scratch + "/nomask", [](nlohmann::json& c) { c["dflash_config"].erase("mask_token_id"); }), 1);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    EXPECT_TRUE(contains(refusal(*w, qwen35, be_), "no mask token"));
  }
  // Another hidden size (a qwen3 target of hidden 32).
  {
    auto cfg = test::tiny_qwen3_config(512, false);
    cfg["hidden_size"] = 32;
    cfg["num_hidden_layers"] = 8;
    ASSERT_TRUE(test::write_random_hf_model(scratch + "/h32", cfg, 3, SafetensorsDType::kF32).ok());
    auto t = Weights::load(scratch + "/h32", 1);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    const std::string m = refusal(draft, *t, be_);
    EXPECT_TRUE(contains(m, "hidden size 64") && contains(m, "32")) << m;
  }
  // Another vocabulary (hidden 64, 8 layers, vocab 1024).
  {
    auto cfg = test::tiny_qwen3_config(1024, false);
    cfg["num_hidden_layers"] = 8;
    ASSERT_TRUE(test::write_random_hf_model(scratch + "/v1024", cfg, 4, SafetensorsDType::kF32).ok());
    auto t = Weights::load(scratch + "/v1024", 1);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    const std::string m = refusal(draft, *t, be_);
    EXPECT_TRUE(contains(m, "vocabulary") && contains(m, "512") && contains(m, "1024")) << m;
  }
}

}  // namespace
}  // namespace dflash

// DFlash on the tiny fixtures (algorithms.md A.2-A.5, B.3-B.7):
//  - the target's captured features, the draft forward (block hidden rows and logits) and DFlashDraft::propose
//    (its top-k candidates and log-probs) against PyTorch (tests/fixtures/models/tiny-qwen35-dflash/
//    reference.safetensors, made by tools/reference/make_tiny_draft.py), incrementally and in one call, and
//    the draft context's restart rules;
//  - DFlashDraft::create's refusals, each naming the problem;
//  - verify_tree with crafted chains and trees against plain decoding on a second sequence: the emitted
//    tokens, the committed state (the logits of the steps that follow), the committed feature rows, the
//    logits `choose` sees, SpecStats, stopping mid-path, and sampling (one draw per emitted token, in order),
//    on the hybrid and the all-attention target. The case of a tree path whose KV slots lie in another
//    64-token KV chunk than its positions fails today: see ddtree_path_in_another_kv_chunk_... below;
//  - speculative_step end to end with the tiny random draft: greedy output equals plain greedy decoding.
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
#include "unit/ops/ops_test_util.h"

namespace dflash {
namespace {

constexpr int kThreads = 2;

// Fixture models, loaded once per process.
const Weights& model(const std::string& name) { return test::fixture_model(name); }

int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

bool bit_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  double d = a.size() == b.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

double max_abs(std::span<const float> a) {
  double m = 0;
  for (float x : a) m = std::max(m, std::fabs(double(x)));
  return m;
}

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
  const Status st = draft_layers(d, c->data(), n, 0, 0, x->data(), B, kv, be_);
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

// ---------------------------------------------------------------------------------------------------------
// verify_tree with crafted trees against plain greedy decoding.

struct TargetCase {
  const char* name;
  std::vector<int64_t> layers;
};

void PrintTo(const TargetCase& c, std::ostream* os) { *os << c.name; }

std::string case_name(const ::testing::TestParamInfo<TargetCase>& info) {
  std::string s = info.param.name;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

class VerifyTree : public ::testing::TestWithParam<TargetCase> {
 protected:
  static constexpr int64_t kTruth = 24;  // greedy tokens of the reference run

  void SetUp() override {
    w_ = &model(GetParam().name);
    runner_ = std::make_unique<Runner>(*w_, kThreads);
    reseed(test::fresh_seed());
  }
  void reseed(uint32_t seed) {
    seed_ = seed;
    rng_.seed(seed);
  }
  std::string seed_note() const {
    return "seed " + std::to_string(seed_) + " (replay: DFLASH_TEST_SEED=" + std::to_string(seed_) + ")";
  }
  int64_t V() const { return w_->spec().vocab; }
  int64_t width() const { return static_cast<int64_t>(GetParam().layers.size()) * w_->spec().hidden; }
  std::span<const int64_t> layers() const { return GetParam().layers; }

  // A sequence with its feature ring.
  struct Seq {
    std::unique_ptr<SequenceState> state;
    std::unique_ptr<FeatureRing> ring;
  };

  // A fresh sequence that ran the prompt in one step with features captured.
  Seq prefilled(std::vector<float>* last_logits = nullptr) {
    Seq q{std::make_unique<SequenceState>(w_->spec(), runner_->backend()),
          std::make_unique<FeatureRing>(width(), 4096, feature_tag(layers()))};
    Step step;
    step.tokens = prompt_;
    step.capture_layers = layers();
    auto out = runner_->forward(*q.state, step);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    if (!out.ok()) return q;
    EXPECT_TRUE(append_features(*q.ring, 0, *out, static_cast<int64_t>(prompt_.size())).ok());
    if (last_logits) *last_logits = out->logits;
    return q;
  }

  // The reference: a random prompt of `len` tokens, then plain decoding one token at a time with features
  // captured, greedy or with `sampler` (one draw per token). truth_[i] is the token at position s + i
  // (truth_[0] from the prompt's logits), logits_[i] the logits after it (what truth_[i + 1] is chosen
  // from), ref_ the features of every position.
  void make_reference(int64_t len, Sampler* sampler = nullptr) {
    prompt_.resize(static_cast<size_t>(len));
    for (auto& t : prompt_) t = static_cast<int32_t>(rng_() % V());
    s_ = len;
    std::vector<float> first;
    ref_ = prefilled(&first);
    std::vector<int32_t> history = prompt_;
    auto pick = [&](std::span<const float> l) -> int32_t {
      if (sampler == nullptr) return argmax(l);
      auto t = sampler->sample(l, history);
      EXPECT_TRUE(t.ok()) << t.status().to_string();
      return t.ok() ? *t : 0;
    };
    truth_ = {pick(first)};
    history.push_back(truth_.back());
    logits_.clear();
    for (int64_t i = 0; i < kTruth; ++i) {
      Step step;
      step.tokens = std::span<const int32_t>(&truth_.back(), 1);
      step.capture_layers = layers();
      const int64_t pos = ref_.state->n_past();
      auto out = runner_->forward(*ref_.state, step);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      ASSERT_TRUE(append_features(*ref_.ring, pos, *out, 1).ok());
      logits_.push_back(out->logits);
      truth_.push_back(pick(out->logits));
      history.push_back(truth_.back());
    }
  }

  // A token that is none of `avoid`.
  int32_t other_than(std::initializer_list<int32_t> avoid) {
    for (;;) {
      const auto t = static_cast<int32_t>(rng_() % V());
      if (std::find(avoid.begin(), avoid.end(), t) == avoid.end()) return t;
    }
  }

  // Greedy choose (the backend's argmax, checked against the row's) that records the logits it was shown
  // and stops at call `stop_at` (1-based; 0: never).
  ChooseFn greedy(std::vector<std::vector<float>>* seen, int stop_at = 0) {
    return [seen, stop_at, calls = 0](NodeLogits& logits) mutable -> Result<Choice> {
      ++calls;
      DF_ASSIGN_OR_RETURN(std::span<const float> row, logits.row());
      seen->emplace_back(row.begin(), row.end());
      EXPECT_EQ(logits.argmax(), argmax(row)) << "call " << calls;
      return Choice{logits.argmax(), stop_at > 0 && calls == stop_at};
    };
  }

  // After verify_tree committed m tokens (truth_[0..m)) and emitted `tokens`: everything equals the
  // reference. `seen` are the logits choose was shown (the i-th call: those after truth_[i]).
  void expect_exact(Seq& q, const SpecStepResult& res, int64_t m, const std::vector<std::vector<float>>& seen,
                    const std::string& what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(q.state->n_past(), s_ + m);
    // Emitted: truth_[1 ..], one per choose call.
    ASSERT_EQ(res.tokens.size(), seen.size());
    for (size_t i = 0; i < res.tokens.size(); ++i) {
      EXPECT_EQ(res.tokens[i], truth_[i + 1]) << "emitted token " << i;
      EXPECT_TRUE(bit_equal(seen[i], logits_[i])) << "the logits choose saw at call " << i + 1 << " differ from plain "
                                                  << "decoding's by up to " << max_abs_diff(seen[i], logits_[i]);
    }
    // The committed feature rows: the reference's rows of positions s .. s + m - 1.
    EXPECT_EQ(q.ring->end(), s_ + m);
    auto got = q.ring->rows_from(s_);
    auto want = ref_.ring->rows_from(s_);
    ASSERT_TRUE(got.ok() && want.ok());
    ASSERT_EQ(got->size(), static_cast<size_t>(m * width()));
    EXPECT_TRUE(bit_equal(*got, std::span<const float>(*want).first(got->size())))
        << "committed features differ by up to " << max_abs_diff(*got, std::span<const float>(*want).first(got->size()));
    // Plain decoding goes on exactly: feed truth_[m], truth_[m + 1], ...
    for (int64_t j = m; j < std::min<int64_t>(m + 4, kTruth); ++j) {
      Step step;
      step.tokens = std::span<const int32_t>(&truth_[static_cast<size_t>(j)], 1);
      auto out = runner_->forward(*q.state, step);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      EXPECT_TRUE(bit_equal(out->logits, logits_[static_cast<size_t>(j)]))
          << "logits after position " << s_ + j << " differ by up to " << max_abs_diff(out->logits, logits_[j]);
    }
  }

  static void expect_stats(const SpecStats& st, int64_t drafted, int64_t accepted, size_t depth) {
    EXPECT_EQ(st.steps, 1);
    EXPECT_EQ(st.drafted, drafted);
    EXPECT_EQ(st.accepted, accepted);
    ASSERT_EQ(st.accepted_at.size(), depth);
    for (size_t d = 0; d < depth; ++d) EXPECT_EQ(st.accepted_at[d], static_cast<int64_t>(d) < accepted ? 1 : 0) << d;
    EXPECT_GE(st.verify_ms, 0.0);
  }

  const Weights* w_ = nullptr;
  std::unique_ptr<Runner> runner_;
  uint32_t seed_ = 0;
  std::mt19937 rng_;
  std::vector<int32_t> prompt_;
  int64_t s_ = 0;
  Seq ref_;
  std::vector<int32_t> truth_;
  std::vector<std::vector<float>> logits_;
};

// (i) A chain whose first k drafts are right and draft k + 1 wrong: k + 1 tokens (the last the target's
// correction), the state k + 1 further (root + k drafts). k = 0 (nothing accepted) through 6.
TEST_P(VerifyTree, chain_with_k_right_drafts_emits_k_plus_one_exact_tokens) {
  SCOPED_TRACE(seed_note());
  make_reference(70);
  if (HasFatalFailure()) return;
  for (int64_t k : {0, 1, 3, 6}) {
    std::vector<int32_t> drafts;
    for (int64_t i = 1; i <= k; ++i) drafts.push_back(truth_[i]);
    drafts.push_back(other_than({truth_[k + 1]}));
    while (drafts.size() < 7) drafts.push_back(static_cast<int32_t>(rng_() % V()));
    Seq q = prefilled();
    std::vector<std::vector<float>> seen;
    SpecStats st;
    auto res = verify_tree(*runner_, *q.state, *q.ring, layers(), chain_tree(truth_[0], drafts), greedy(&seen), &st);
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    EXPECT_FALSE(res->stopped);
    EXPECT_EQ(res->tokens.size(), static_cast<size_t>(k + 1));
    expect_exact(q, *res, k + 1, seen, "k = " + std::to_string(k));
    expect_stats(st, 7, k, 7);
  }
}

// (iii) Every draft right: the bonus after the last one; B tokens from one step.
TEST_P(VerifyTree, full_accept_chain_emits_every_draft_and_the_bonus) {
  SCOPED_TRACE(seed_note());
  make_reference(70);
  if (HasFatalFailure()) return;
  const std::vector<int32_t> drafts(truth_.begin() + 1, truth_.begin() + 8);
  Seq q = prefilled();
  std::vector<std::vector<float>> seen;
  SpecStats st;
  auto res = verify_tree(*runner_, *q.state, *q.ring, layers(), chain_tree(truth_[0], drafts), greedy(&seen), &st);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_FALSE(res->stopped);
  EXPECT_EQ(res->tokens.size(), 8u);
  expect_exact(q, *res, 8, seen, "full accept");
  expect_stats(st, 7, 7, 7);
  // A root-only tree: the plain decode step of the root.
  Seq r = prefilled();
  seen.clear();
  SpecStats st1;
  auto one = verify_tree(*runner_, *r.state, *r.ring, layers(), DraftTree::with_root(truth_[0]), greedy(&seen), &st1);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  expect_exact(r, *one, 1, seen, "root only");
  EXPECT_EQ(st1.drafted, 0);
  EXPECT_EQ(st1.accepted, 0);
}

// (ii) A DDTree whose right path runs through later children at every depth, with wrong siblings and
// right tokens placed under wrong branches (which must not be taken). Node slots stay in the prompt's last
// KV chunk (70 + 16 < 128).
//
//   0 ─┬─ 1 (x1) ── 3 (t2)
//      ├─ 2 (y1) ── 5 (z)
//      └─ 4 (t1) ─┬─ 6 (w2) ── 8 (t3)
//                 └─ 7 (t2) ─┬─ 9 (w3a) ── 15 (t4)
//                            ├─ 10 (w3b)
//                            └─ 11 (t3) ─┬─ 12 (w4a) ── 14 (t5)
//                                        └─ 13 (w4b)
// The walk: 0 -> 4 -> 7 -> 11, then t4 is no child of 11: emitted t1 t2 t3 t4, 4 positions committed.
DraftTree crafted_tree(const std::vector<int32_t>& t, const std::function<int32_t(std::initializer_list<int32_t>)>& other,
                       std::vector<int32_t>* path) {
  DraftTree tree = DraftTree::with_root(t[0]);
  auto add = [&](int32_t parent, int32_t tok) {
    auto r = tree.add_child(parent, tok);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? *r : -1;
  };
  const int32_t x1 = other({t[1]}), y1 = other({t[1], x1});
  const int32_t n1 = add(0, x1), n2 = add(0, y1);
  add(n1, t[2]);
  const int32_t n4 = add(0, t[1]);
  add(n2, other({}));
  const int32_t n6 = add(n4, other({t[2]}));
  const int32_t n7 = add(n4, t[2]);
  add(n6, t[3]);
  const int32_t w3a = other({t[3]});
  const int32_t n9 = add(n7, w3a);
  add(n7, other({t[3], w3a}));
  const int32_t n11 = add(n7, t[3]);
  const int32_t w4a = other({t[4]});
  const int32_t n12 = add(n11, w4a);
  add(n11, other({t[4], w4a}));
  add(n12, t[5]);
  add(n9, t[4]);
  EXPECT_EQ(tree.size(), 16);
  *path = {0, n4, n7, n11};
  return tree;
}

TEST_P(VerifyTree, ddtree_path_through_later_children_is_exact) {
  SCOPED_TRACE(seed_note());
  make_reference(70);
  if (HasFatalFailure()) return;
  std::vector<int32_t> path;
  const DraftTree tree = crafted_tree(truth_, [this](std::initializer_list<int32_t> a) { return other_than(a); }, &path);
  ASSERT_EQ(path, (std::vector<int32_t>{0, 4, 7, 11}));
  Seq q = prefilled();
  std::vector<std::vector<float>> seen;
  SpecStats st;
  auto res = verify_tree(*runner_, *q.state, *q.ring, layers(), tree, greedy(&seen), &st);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_FALSE(res->stopped);
  EXPECT_EQ(res->tokens.size(), 4u);
  expect_exact(q, *res, 4, seen, "crafted tree");
  expect_stats(st, 15, 3, 5);
}

// Seeds whose prompts show the chunk effect below on these fixtures (x86-64 with AVX2, fixtures as committed).
std::vector<uint32_t> known_chunk_seeds(const std::string& model) {
  if (model == "tiny-qwen3") return {17, 19};
  return {3, 4};
}

// The same kind of tree where the right path's nodes sit in the next KV chunk while their positions do
// not: s = 120, twelve wrong children of the root take slots 121..132, the right child of the root is node
// 13 (slot 133), its right child node 14 (slot 134). Positions 121, 122 are in chunk 1 (64..127) in plain
// decoding; the tree step sees those keys at slots 133, 134, in chunk 2. Plain decoding and the verify must
// still agree bit for bit (the output of greedy DDTree must be the output of plain greedy decoding).
//
// FAILS today (a bug in cpu::attention's tree mask, src/ops/cpu/attention.cpp): the flash-style walk groups
// keys by their physical KV chunk, so a path node's own key (at slot 133) is folded in as a chunk of its
// own, after the running max of chunk 1 was fixed, instead of inside chunk 1 as at position 121 in plain
// decoding. When that key scores highest for some head, the rescaling order differs: the logits differ in
// the last bits (seen: up to 7.6e-6), and so do the committed K/V of later layers, the features, and every
// logit after. A greedy near-tie can then flip a token: DDTree output is not plain decoding's.
TEST_P(VerifyTree, ddtree_path_in_another_kv_chunk_than_its_positions_is_exact) {
  // The difference shows only when, for some head, a path node's own key (or its in-tree ancestor's)
  // scores above every key of the chunk its position falls in: the seeds listed first do that on these
  // fixtures (found by running fresh ones), then a few fresh prompts.
  std::vector<uint32_t> seeds = known_chunk_seeds(GetParam().name);
  for (int i = 0; i < 3; ++i) seeds.push_back(test::fresh_seed());
  for (uint32_t seed : seeds) {
    reseed(seed);
    SCOPED_TRACE(seed_note());
    make_reference(120);
    if (HasFatalFailure()) return;
    DraftTree tree = DraftTree::with_root(truth_[0]);
    std::vector<int32_t> wrong;
    for (int i = 0; i < 12; ++i) {
      int32_t x;
      do x = other_than({truth_[1]});
      while (std::find(wrong.begin(), wrong.end(), x) != wrong.end());
      wrong.push_back(x);
      ASSERT_TRUE(tree.add_child(0, x).ok());
    }
    const int32_t a = *tree.add_child(0, truth_[1]);
    const int32_t b = *tree.add_child(a, truth_[2]);
    ASSERT_TRUE(tree.add_child(b, other_than({truth_[3]})).ok());
    ASSERT_EQ(a, 13);
    Seq q = prefilled();
    std::vector<std::vector<float>> seen;
    SpecStats st;
    auto res = verify_tree(*runner_, *q.state, *q.ring, layers(), tree, greedy(&seen), &st);
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    EXPECT_EQ(res->tokens.size(), 3u);
    expect_exact(q, *res, 3, seen, "path in the next KV chunk");
    expect_stats(st, 15, 2, 3);
    if (HasFatalFailure()) return;
  }
}

// (iv) choose saying stop ends the walk at that token: nothing after it is asked for or committed past it.
TEST_P(VerifyTree, stop_from_choose_ends_the_walk_there) {
  SCOPED_TRACE(seed_note());
  make_reference(70);
  if (HasFatalFailure()) return;
  const std::vector<int32_t> drafts(truth_.begin() + 1, truth_.begin() + 8);
  for (int stop_at : {1, 3, 7, 8}) {
    Seq q = prefilled();
    std::vector<std::vector<float>> seen;
    SpecStats st;
    auto res = verify_tree(*runner_, *q.state, *q.ring, layers(), chain_tree(truth_[0], drafts), greedy(&seen, stop_at), &st);
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    // Stopping at the 8th token is the end of a full accept: stopped all the same.
    EXPECT_TRUE(res->stopped) << stop_at;
    EXPECT_EQ(res->tokens.size(), static_cast<size_t>(stop_at));
    EXPECT_EQ(seen.size(), static_cast<size_t>(stop_at));
    // Committed: the root and the drafts the walk passed (stop_at - 1 of them).
    expect_exact(q, *res, stop_at, seen, "chain, stop at call " + std::to_string(stop_at));
    EXPECT_EQ(st.accepted, stop_at - 1);
  }
  // In the crafted tree, stopping at the second token (t2, chosen at node 4).
  std::vector<int32_t> path;
  const DraftTree tree = crafted_tree(truth_, [this](std::initializer_list<int32_t> a) { return other_than(a); }, &path);
  Seq q = prefilled();
  std::vector<std::vector<float>> seen;
  SpecStats st;
  auto res = verify_tree(*runner_, *q.state, *q.ring, layers(), tree, greedy(&seen, 2), &st);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_TRUE(res->stopped);
  EXPECT_EQ(res->tokens.size(), 2u);
  expect_exact(q, *res, 2, seen, "tree, stop at call 2");
  expect_stats(st, 15, 1, 5);
}

// Sampling (A.5, B.5): the walk asks the caller's sampler once per emitted token, in order, from logits equal
// to plain decoding's, so the tokens and the sampler's random stream are those of plain sampling: a chain
// and the crafted tree built on a sampled continuation emit it, and sampling goes on in step afterwards.
TEST_P(VerifyTree, sampled_walk_draws_once_per_emitted_token_like_plain_sampling) {
  SCOPED_TRACE(seed_note());
  SamplingParams params;
  params.temperature = 0.8f;
  params.top_p = 0.9f;
  params.seed = rng_();
  Sampler ref_sampler(params);
  make_reference(70, &ref_sampler);
  if (HasFatalFailure()) return;
  for (int shape = 0; shape < 2; ++shape) {
    SCOPED_TRACE(shape == 0 ? "chain" : "crafted tree");
    Sampler sampler(params);
    std::vector<int32_t> history = prompt_;
    std::vector<float> first;
    Seq q = prefilled(&first);
    auto t0 = sampler.sample(first, history);
    ASSERT_TRUE(t0.ok());
    ASSERT_EQ(*t0, truth_[0]);
    history.push_back(*t0);
    DraftTree tree;
    int64_t m = 0;  // positions committed
    if (shape == 0) {
      std::vector<int32_t> drafts(truth_.begin() + 1, truth_.begin() + 6);
      drafts.push_back(other_than({truth_[6]}));
      drafts.push_back(truth_[7]);
      tree = chain_tree(truth_[0], drafts);
      m = 6;
    } else {
      std::vector<int32_t> path;
      tree = crafted_tree(truth_, [this](std::initializer_list<int32_t> a) { return other_than(a); }, &path);
      m = 4;
    }
    std::vector<std::vector<float>> seen;
    const ChooseFn choose = [&](NodeLogits& logits) -> Result<Choice> {
      DF_ASSIGN_OR_RETURN(std::span<const float> row, logits.row());
      seen.emplace_back(row.begin(), row.end());
      DF_ASSIGN_OR_RETURN(int32_t t, sampler.sample(row, history));
      history.push_back(t);
      return Choice{t, false};
    };
    auto res = verify_tree(*runner_, *q.state, *q.ring, layers(), tree, choose, nullptr);
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    EXPECT_EQ(res->tokens.size(), static_cast<size_t>(m));
    expect_exact(q, *res, m, seen, "sampled");
    // The sampler is where plain sampling's is: the next draws agree (the state went 4 tokens further in
    // expect_exact, fed truth_[m .. m + 3]; replay the draws from the reference logits).
    for (int64_t j = m; j < m + 4; ++j) {
      auto t = sampler.sample(logits_[static_cast<size_t>(j)], history);
      ASSERT_TRUE(t.ok());
      EXPECT_EQ(*t, truth_[static_cast<size_t>(j + 1)]) << "draw for position " << s_ + j + 1;
      history.push_back(*t);
    }
  }
}

TEST_P(VerifyTree, choose_errors_and_a_ring_off_the_sequence_are_returned) {
  SCOPED_TRACE(seed_note());
  make_reference(20);
  if (HasFatalFailure()) return;
  const std::vector<int32_t> drafts(truth_.begin() + 1, truth_.begin() + 8);
  Seq q = prefilled();
  int calls = 0;
  const ChooseFn failing = [&calls](NodeLogits& logits) -> Result<Choice> {
    if (++calls == 3) return invalid_argument("the sampler refused call {}", calls);
    return Choice{logits.argmax(), false};
  };
  auto res = verify_tree(*runner_, *q.state, *q.ring, layers(), chain_tree(truth_[0], drafts), failing, nullptr);
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(res.status().message(), "the sampler refused call 3")) << res.status().message();
  EXPECT_EQ(calls, 3);
  // A ring that does not end where the sequence does.
  Seq r = prefilled();
  r.ring->clear(5);
  std::vector<std::vector<float>> seen;
  auto off = verify_tree(*runner_, *r.state, *r.ring, layers(), chain_tree(truth_[0], drafts), greedy(&seen), nullptr);
  ASSERT_FALSE(off.ok());
  EXPECT_EQ(off.status().code(), ErrorCode::kInternal);
  EXPECT_EQ(r.state->n_past(), s_);
  // An empty tree.
  auto empty = verify_tree(*runner_, *r.state, *r.ring, layers(), DraftTree{}, failing, nullptr);
  EXPECT_FALSE(empty.ok());
}

INSTANTIATE_TEST_SUITE_P(Targets, VerifyTree,
                         ::testing::Values(TargetCase{"tiny-qwen35", {1, 5}}, TargetCase{"tiny-qwen3", {1, 2}}),
                         case_name);

// ---------------------------------------------------------------------------------------------------------
// speculative_step end to end with the tiny random draft: greedy output equals plain greedy decoding.

struct SpecCase {
  const char* name;
  bool ddtree;
  int64_t budget;
  int64_t window;         // feature ring capacity
  int64_t nodes_per_step; // drafted tokens each full step puts to the target
};

void PrintTo(const SpecCase& c, std::ostream* os) { *os << c.name; }

class SpeculativeStep : public ::testing::TestWithParam<SpecCase> {};

TEST_P(SpeculativeStep, greedy_output_equals_plain_greedy_decoding) {
  const SpecCase& c = GetParam();
  const Weights& target = model("tiny-qwen35");
  Runner runner(target, kThreads);
  auto d = DFlashDraft::create(model("tiny-qwen35-dflash"), target, runner.backend());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  DFlashDraft& draft = **d;
  test::SeededRng seeded;
  std::mt19937& rng = seeded.rng;
  std::vector<int32_t> prompt(50);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % 512);
  constexpr int64_t kWant = 40, kRef = kWant + 8;

  // Plain greedy decoding.
  std::vector<int32_t> plain;
  {
    SequenceState st(target.spec(), runner.backend());
    auto l = runner.prefill(st, prompt);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    plain.push_back(argmax(*l));
    while (static_cast<int64_t>(plain.size()) < kRef) {
      Step step;
      step.tokens = std::span<const int32_t>(&plain.back(), 1);
      auto out = runner.forward(st, step);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      plain.push_back(argmax(out->logits));
    }
  }

  // Speculative: prefill with features, the root from the prompt's logits, then steps.
  SpecOptions opts;
  opts.ddtree = c.ddtree;
  opts.ddtree_budget = c.budget;
  opts.feature_window = c.window;
  SequenceState st(target.spec(), runner.backend());
  FeatureRing ring(draft.feature_width(), c.window, feature_tag(draft.capture_layers()));
  DFlashDraft::Context ctx(draft);
  Step pre;
  pre.tokens = prompt;
  pre.capture_layers = draft.capture_layers();
  auto out = runner.forward(st, pre);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_TRUE(append_features(ring, 0, *out, 50).ok());
  std::vector<int32_t> spec = {argmax(out->logits)};
  SpecStats stats;
  int64_t steps = 0, accepted = 0;
  const ChooseFn choose = [](NodeLogits& logits) -> Result<Choice> { return Choice{logits.argmax(), false}; };
  while (static_cast<int64_t>(spec.size()) < kWant) {
    auto r = speculative_step(runner, st, ring, draft, ctx, spec.back(), 7, opts, choose, &stats);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_FALSE(r->stopped);
    ASSERT_GE(r->tokens.size(), 1u);
    ++steps;
    accepted += static_cast<int64_t>(r->tokens.size()) - 1;
    spec.insert(spec.end(), r->tokens.begin(), r->tokens.end());
    // The state holds everything emitted but the last token (the next root); so does the ring.
    EXPECT_EQ(st.n_past(), 50 + static_cast<int64_t>(spec.size()) - 1);
    EXPECT_EQ(ring.end(), st.n_past());
    EXPECT_LE(ring.end() - ring.first(), c.window);
  }
  ASSERT_LE(static_cast<int64_t>(spec.size()), kRef);
  EXPECT_EQ(spec, std::vector<int32_t>(plain.begin(), plain.begin() + static_cast<int64_t>(spec.size())));
  EXPECT_EQ(stats.steps, steps);
  EXPECT_EQ(stats.drafted, steps * c.nodes_per_step);
  EXPECT_EQ(stats.accepted, accepted);
  EXPECT_EQ(static_cast<int64_t>(stats.accepted_at.size()), std::min<int64_t>(7, c.budget));
  int64_t sum = 0;
  for (size_t i = 0; i < stats.accepted_at.size(); ++i) {
    sum += stats.accepted_at[i];
    if (i > 0) {
      EXPECT_LE(stats.accepted_at[i], stats.accepted_at[i - 1]) << i;
    }
  }
  EXPECT_EQ(sum, stats.accepted);
  EXPECT_GT(stats.draft_ms, 0.0);
  EXPECT_GT(stats.verify_ms, 0.0);
  std::printf("  %s: %lld tokens in %lld steps (%lld drafted tokens accepted)\n", c.name,
              static_cast<long long>(spec.size()), static_cast<long long>(steps), static_cast<long long>(accepted));

  // Refusals: no room for a draft; a ring that does not end at the sequence.
  auto none = speculative_step(runner, st, ring, draft, ctx, spec.back(), 0, opts, choose, nullptr);
  EXPECT_EQ(none.status().code(), ErrorCode::kInvalidArgument);
  ring.clear(st.n_past() + 1);
  auto off = speculative_step(runner, st, ring, draft, ctx, spec.back(), 7, opts, choose, nullptr);
  EXPECT_EQ(off.status().code(), ErrorCode::kInternal);
}

INSTANTIATE_TEST_SUITE_P(Modes, SpeculativeStep,
                         ::testing::Values(SpecCase{"chain", false, 22, 4096, 7},
                                           SpecCase{"chain_window_8", false, 22, 8, 7},
                                           SpecCase{"ddtree_budget_6", true, 6, 4096, 6},
                                           SpecCase{"ddtree_budget_22", true, 22, 4096, 22},
                                           SpecCase{"ddtree_budget_22_window_8", true, 22, 8, 22}),
                         [](const ::testing::TestParamInfo<SpecCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace dflash

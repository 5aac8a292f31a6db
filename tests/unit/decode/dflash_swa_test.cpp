// DFlash drafts with sliding-window layers (algorithms.md A.3: Qwen3.6 drafts slide on all but the last layer):
// the layer kind is read from config.json, the window reaches the attention as a causal sliding mask (the
// mask itself is checked against a direct softmax in tests/unit/ops/attention_test.cpp), and the draft's
// context K/V stays exact when it is appended call by call.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "decode/dflash.h"
#include "model/weights.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

// The fixture draft (tiny-qwen35-dflash: 2 layers, block 8) with its first layer sliding over `window`.
std::string sliding_draft(const std::string& dir, int64_t window) {
  namespace fs = std::filesystem;
  const std::string src = test::fixture_path("models/tiny-qwen35-dflash");
  fs::create_directories(dir);
  fs::copy_file(src + "/model.safetensors", dir + "/model.safetensors", fs::copy_options::overwrite_existing);
  auto cfg = nlohmann::json::parse(*read_text_file(src + "/config.json"));
  cfg["layer_types"] = {"sliding_attention", "full_attention"};
  cfg["use_sliding_window"] = true;
  cfg["sliding_window"] = window;
  const std::string text = cfg.dump(2);
  test::write_bytes(dir + "/config.json", std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  return dir;
}

class SlidingDraft : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = Weights::load(test::fixture_path("models/tiny-qwen35"), 1);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    target_ = std::make_unique<Weights>(std::move(t).value());
    // Target features of a 40-token prompt: every row random (the draft only reads them).
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    feats_.resize(40 * 2 * 64);
    for (auto& f : feats_) f = nd(rng);
  }
  // Top-4 log-probs of one propose after `first` then `rest` rows of context (two calls when rest > 0).
  std::vector<float> propose(const Weights& draft_w, int64_t first, int64_t rest) {
    auto d = DFlashDraft::create(draft_w, *target_, be_);
    EXPECT_TRUE(d.ok()) << d.status().to_string();
    if (!d.ok()) return {};
    DFlashDraft& draft = **d;
    FeatureRing ring(draft.feature_width(), 4096);
    DFlashDraft::Context ctx(draft);
    EXPECT_TRUE(ring.append(0, std::span<const float>(feats_).first(static_cast<size_t>(first * 128))).ok());
    if (rest > 0) {
      EXPECT_TRUE(draft.propose(ctx, ring, 5, 7, 4).ok());
      EXPECT_TRUE(ring.append(first, std::span<const float>(feats_).subspan(static_cast<size_t>(first * 128),
                                                                           static_cast<size_t>(rest * 128))).ok());
    }
    auto top = draft.propose(ctx, ring, 9, 7, 4);
    EXPECT_TRUE(top.ok()) << top.status().to_string();
    return top.ok() ? top->logprobs : std::vector<float>{};
  }
  std::unique_ptr<Weights> target_;
  std::vector<float> feats_;
  CpuBackend be_{1};
};

TEST_F(SlidingDraft, the_window_is_read_and_used) {
  const std::string scratch = test::scratch_dir();
  auto w4 = Weights::load(sliding_draft(scratch + "/swa4", 4), 1);
  ASSERT_TRUE(w4.ok()) << w4.status().to_string();
  EXPECT_EQ(w4->spec().sliding_window, (std::vector<int64_t>{4, 0}));
  auto w100 = Weights::load(sliding_draft(scratch + "/swa100", 100), 1);
  ASSERT_TRUE(w100.ok());
  auto full = Weights::load(test::fixture_path("models/tiny-qwen35-dflash"), 1);
  ASSERT_TRUE(full.ok());
  const auto a = propose(*w4, 40, 0), b = propose(*w100, 40, 0), c = propose(*full, 40, 0);
  ASSERT_FALSE(a.empty());
  EXPECT_NE(a, b);  // a window of 4 hides most of the context
  EXPECT_NE(b, c);  // a window past the context still makes the block causal in that layer
}

TEST_F(SlidingDraft, context_appended_call_by_call_equals_one_call) {
  auto w = Weights::load(sliding_draft(test::scratch_dir() + "/swa6", 6), 1);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(propose(*w, 33, 7), propose(*w, 40, 0));
}

}  // namespace
}  // namespace dflash

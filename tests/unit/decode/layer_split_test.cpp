// A target's layers split across CPU shards (FEATURES.md F2, F3) against the same model on one device, bit for
// bit (the CPU kernels do not depend on the backend instance or the batch): prefill and decode logits,
// DFlash chain and DDTree greedy output, snapshots of a split state ("ls<shard>_" names) restored into
// another placement and continuing exactly as the original, and the refusals of malformed placements and
// snapshots (which leave the state as it was).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "decode/dflash.h"
#include "decode/runner.h"
#include "model/weights.h"
#include "state/feature_ring.h"
#include "state/sequence_state.h"
#include "support/fixture_models.h"
#include "support/test_paths.h"
#include "unit/decode/decode_test_util.h"
#include "unit/ops/ops_test_util.h"

namespace dflash {
namespace {

constexpr int kThreads = 2;

const Weights& fixture(const std::string& name) { return test::fixture_model(name); }

using test::argmax;
using test::bit_equal;

// A placement of `w` over CPU shards ending at `ends` (the last is the model's layer count).
struct Split {
  std::vector<std::unique_ptr<CpuBackend>> backends;
  std::unique_ptr<Runner> runner;
  Split(const Weights& w, const std::vector<int64_t>& ends) {
    std::vector<RunnerShard> shards;
    int64_t begin = 0;
    for (int64_t end : ends) {
      backends.push_back(std::make_unique<CpuBackend>(kThreads));
      shards.push_back(RunnerShard{&w, backends.back().get(), begin, end});
      begin = end;
    }
    auto r = Runner::create(std::move(shards));
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) runner = std::move(r).value();
  }
};

const std::vector<std::vector<int64_t>> kPlacements = {{4, 8}, {1, 4, 8}, {1, 2, 3, 4, 5, 6, 7, 8}};

std::string name_of(const std::vector<int64_t>& ends) {
  std::string s;
  for (int64_t e : ends) {
    if (!s.empty()) s += ',';
    s += std::to_string(e);
  }
  return "ends " + s;
}

// Decodes `n` greedy tokens on from a state whose last logits are `last`; returns every step's logits.
std::vector<float> continue_greedy(Runner& r, SequenceState& st, std::span<const float> last, int64_t n) {
  std::vector<float> all;
  int32_t t = argmax(last);
  for (int64_t i = 0; i < n; ++i) {
    Step step;
    step.tokens = std::span<const int32_t>(&t, 1);
    auto o = r.forward(st, step);
    EXPECT_TRUE(o.ok()) << o.status().to_string();
    if (!o.ok()) return all;
    all.insert(all.end(), o->logits.begin(), o->logits.end());
    t = argmax(o->logits);
  }
  return all;
}

// Greedy decoding of n tokens after `prompt`, every step's logits appended to *logits.
std::vector<int32_t> greedy(Runner& r, std::span<const int32_t> prompt, int64_t n, std::vector<float>* logits) {
  SequenceState st(r.spec(), r.state_layout());
  auto l = r.prefill(st, prompt, 16);  // several chunks
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  if (!l.ok()) return {};
  const std::vector<float> rest = continue_greedy(r, st, *l, n - 1);
  const size_t first = logits->size();
  logits->insert(logits->end(), l->begin(), l->end());
  logits->insert(logits->end(), rest.begin(), rest.end());
  const auto V = static_cast<size_t>(r.spec().vocab);
  std::vector<int32_t> out;
  for (size_t at = first; at < logits->size(); at += V) out.push_back(argmax(std::span<const float>(logits->data() + at, V)));
  return out;
}

TEST(LayerSplit, logits_equal_one_device_bit_for_bit) {
  test::SeededRng seeded;
  for (const char* name : {"tiny-qwen35", "tiny-qwen3"}) {
    const Weights& w = fixture(name);
    std::vector<int32_t> prompt(40);
    for (auto& t : prompt) t = static_cast<int32_t>(seeded.rng() % 500);
    Runner one(w, kThreads);
    std::vector<float> want;
    const std::vector<int32_t> want_tokens = greedy(one, prompt, 12, &want);
    for (const auto& ends : kPlacements) {
      if (ends.back() != w.spec().n_layers) continue;
      SCOPED_TRACE(std::string(name) + " " + name_of(ends));
      Split split(w, ends);
      ASSERT_NE(split.runner, nullptr);
      std::vector<float> got;
      EXPECT_EQ(greedy(*split.runner, prompt, 12, &got), want_tokens);
      EXPECT_TRUE(bit_equal(got, want)) << "logits differ from one device";
      // One hand-off per shard boundary and step (prefill chunks are steps too).
      EXPECT_EQ(split.runner->handoff_stats().count, static_cast<int64_t>(ends.size() - 1) * (3 + 11));
    }
  }
}

// The DFlash features of a step, captured on whichever shard owns each layer, in the order asked for.
TEST(LayerSplit, captured_features_equal_one_device) {
  const Weights& w = fixture("tiny-qwen35");
  std::vector<int32_t> tokens(21);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 53 + 5) % 500);
  const std::vector<int64_t> layers = {6, 1, 3, 7, 0};
  Step step;
  step.tokens = tokens;
  step.capture_layers = layers;
  Runner one(w, kThreads);
  SequenceState s1(w.spec(), one.state_layout());
  auto want = one.forward(s1, step);
  ASSERT_TRUE(want.ok());
  for (const auto& ends : kPlacements) {
    SCOPED_TRACE(name_of(ends));
    Split split(w, ends);
    SequenceState st(w.spec(), split.runner->state_layout());
    auto got = split.runner->forward(st, step);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->features.size(), layers.size());
    for (size_t c = 0; c < layers.size(); ++c)
      EXPECT_TRUE(bit_equal(got->features[c], want->features[c])) << "layer " << layers[c];
  }
}

TEST(LayerSplit, create_refuses_placements_that_do_not_tile_the_layers) {
  const Weights& w = fixture("tiny-qwen35");
  CpuBackend a(1), b(1);
  const std::vector<std::vector<RunnerShard>> bad = {
      {},
      {{&w, &a, 0, 4}, {&w, &b, 5, 8}},  // a gap
      {{&w, &a, 0, 4}, {&w, &b, 3, 8}},  // an overlap
      {{&w, &a, 0, 4}, {&w, &b, 4, 7}},  // ends before the last layer
      {{&w, &a, 0, 0}, {&w, &b, 0, 8}},  // an empty shard
      {{&w, nullptr, 0, 4}, {&w, &b, 4, 8}},
      {{&w, &a, 0, 4}, {&fixture("tiny-qwen3"), &b, 4, 8}},  // another model
  };
  for (size_t i = 0; i < bad.size(); ++i) EXPECT_FALSE(Runner::create(bad[i]).ok()) << "placement " << i;
}

// DFlash chain and DDTree over a split target: the verify step's tree attention and DeltaNet, the rollback and
// tree commit on every shard, and the features captured on whichever shard owns each capture layer.
TEST(LayerSplit, speculative_greedy_output_equals_plain_decoding) {
  const Weights& w = fixture("tiny-qwen35");
  const Weights& dw = fixture("tiny-qwen35-dflash");
  test::SeededRng seeded;
  std::vector<int32_t> prompt(50);
  for (auto& t : prompt) t = static_cast<int32_t>(seeded.rng() % 512);
  Runner one(w, kThreads);
  std::vector<float> unused;
  const std::vector<int32_t> plain = greedy(one, prompt, 48, &unused);
  for (const auto& ends : kPlacements) {
    for (bool ddtree : {false, true}) {
      SCOPED_TRACE(name_of(ends) + (ddtree ? " ddtree" : " chain"));
      Split split(w, ends);
      ASSERT_NE(split.runner, nullptr);
      Runner& r = *split.runner;
      CpuBackend draft_be(kThreads);
      auto d = DFlashDraft::create(dw, w, draft_be);
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      int64_t steps = 0;
      const std::vector<int32_t> got = test::speculative_greedy(r, **d, prompt, 40, ddtree, &steps);
      ASSERT_LE(got.size(), plain.size());
      EXPECT_EQ(got, std::vector<int32_t>(plain.begin(), plain.begin() + static_cast<int64_t>(got.size())));
      EXPECT_GT(steps, 0);
    }
  }
}

TEST(LayerSplit, snapshots_carry_shard_names_and_rebind_by_layer_to_any_placement) {
  const Weights& w = fixture("tiny-qwen35");
  std::vector<int32_t> prompt(70);  // more than one 64-token KV chunk
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 11) % 500);
  Runner one(w, kThreads);
  Split two(w, {4, 8}), three(w, {1, 4, 8});
  Runner* runners[] = {&one, two.runner.get(), three.runner.get()};
  // The reference: one device, straight through.
  SequenceState ref(w.spec(), one.state_layout());
  auto ref_last = one.prefill(ref, prompt);
  ASSERT_TRUE(ref_last.ok());
  const std::vector<float> want = continue_greedy(one, ref, *ref_last, 6);

  for (Runner* from : runners) {
    SequenceState st(w.spec(), from->state_layout());
    auto last = from->prefill(st, prompt);
    ASSERT_TRUE(last.ok());
    auto snap = st.export_snapshot();
    ASSERT_TRUE(snap.ok()) << snap.status().to_string();
    // Names: "ls<shard>_" on a split state, the shard that owns the layer.
    const auto shards = from->shards();
    for (const SnapshotTensor& t : snap->tensors) {
      const int64_t layer = std::stoll(t.name.substr(t.name.rfind('.') + 1));
      if (shards.size() == 1) {
        EXPECT_EQ(t.name.rfind("ls", 0), std::string::npos) << t.name;
        continue;
      }
      size_t s = 0;
      while (layer >= shards[s].layer_end) ++s;
      EXPECT_EQ(t.name.rfind(std::string("ls") + std::to_string(s) + "_", 0), 0u) << t.name;
    }
    for (Runner* to : runners) {
      SCOPED_TRACE(fmt::format("{} shards -> {}", shards.size(), to->shards().size()));
      SequenceState restored(w.spec(), to->state_layout());
      ASSERT_TRUE(restored.import_snapshot(*snap).ok());
      EXPECT_EQ(restored.n_past(), static_cast<int64_t>(prompt.size()));
      EXPECT_TRUE(bit_equal(continue_greedy(*to, restored, *last, 6), want));
    }
  }
}

TEST(LayerSplit, malformed_snapshots_are_refused_and_change_nothing) {
  const Weights& w = fixture("tiny-qwen35");
  Split two(w, {4, 8});
  Runner& r = *two.runner;
  std::vector<int32_t> prompt(20, 7);
  SequenceState st(w.spec(), r.state_layout());
  ASSERT_TRUE(r.prefill(st, prompt).ok());
  auto good = st.export_snapshot();
  ASSERT_TRUE(good.ok());

  SequenceState target(w.spec(), r.state_layout());
  ASSERT_TRUE(target.import_snapshot(*good).ok());
  const auto before = target.export_snapshot();
  ASSERT_TRUE(before.ok());
  // The same layer under two shards' names.
  Snapshot twice = *good;
  SnapshotTensor dup = twice.tensors.front();
  dup.name = std::string("ls1_") + dup.name.substr(dup.name.find('_') + 1);
  twice.tensors.push_back(dup);
  // A layer missing.
  Snapshot missing = *good;
  missing.tensors.pop_back();
  // A tensor of another shape.
  Snapshot shaped = *good;
  shaped.tensors.front().shape[0] += 1;
  for (const Snapshot* bad : {&twice, &missing, &shaped}) {
    const Status s = target.import_snapshot(*bad);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.code(), ErrorCode::kCorrupt) << s.to_string();
    auto after = target.export_snapshot();
    ASSERT_TRUE(after.ok());
    ASSERT_EQ(after->tensors.size(), before->tensors.size());
    for (size_t i = 0; i < after->tensors.size(); ++i) EXPECT_TRUE(bit_equal(after->tensors[i].data, before->tensors[i].data));
  }
}

}  // namespace
}  // namespace dflash

// f16 KV stores on the CPU (`--kv-type f16`, cpu::KvType::kF16): half the memory; rows are written rounded to
// fp16 (nearest even) and read back exactly, so
//   - logits stay within f16 rounding of the f32 store's (tolerance below), both fixture families;
//   - snapshots carry the stored values as f32 (exact) and a restored sequence continues bit for bit like
//     the one it was taken from;
//   - DFlash chain and DDTree greedy output equals plain greedy decoding on the same f16 store.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "decode/dflash.h"
#include "decode/runner.h"
#include "state/feature_ring.h"
#include "state/sequence_state.h"
#include "support/fixture_models.h"
#include "tensor/half.h"
#include "unit/decode/decode_test_util.h"

namespace dflash {
namespace {

constexpr int kThreads = 2;

std::unique_ptr<Runner> runner_with(const Weights& w, cpu::KvType t) {
  auto r = std::make_unique<Runner>(w, kThreads);
  dynamic_cast<CpuBackend&>(r->backend()).set_kv_type(t);
  return r;
}

std::vector<int32_t> prompt_of(int64_t n, int64_t vocab) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = static_cast<int32_t>((i * 131 + 7) % vocab);
  return p;
}

// Prefill, then `n` greedy steps: every step's logits, end to end.
std::vector<float> greedy_logits(Runner& r, SequenceState& st, const std::vector<int32_t>& prompt, int n,
                                 std::vector<int32_t>* tokens = nullptr) {
  auto l = r.prefill(st, prompt);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  if (!l.ok()) return {};
  std::vector<float> all = *l;
  const int64_t V = r.spec().vocab;
  for (int i = 0; i < n; ++i) {
    const int32_t t = test::argmax(std::span<const float>(all).last(static_cast<size_t>(V)));
    if (tokens) tokens->push_back(t);
    Step step;
    step.tokens = std::span<const int32_t>(&t, 1);
    auto o = r.forward(st, step);
    EXPECT_TRUE(o.ok()) << o.status().to_string();
    if (!o.ok()) break;
    all.insert(all.end(), o->logits.begin(), o->logits.end());
  }
  return all;
}

TEST(KvF16, logits_stay_within_f16_rounding_of_the_f32_store_and_memory_halves) {
  for (const std::string name : {"tiny-qwen3", "tiny-qwen35"}) {
    SCOPED_TRACE(name);
    const Weights& w = test::fixture_model(name);
    const auto prompt = prompt_of(90, w.spec().vocab);  // two prefill chunks' worth of KV chunks
    auto f32 = runner_with(w, cpu::KvType::kF32);
    auto f16 = runner_with(w, cpu::KvType::kF16);
    SequenceState a(w.spec(), f32->state_layout()), b(w.spec(), f16->state_layout());
    const auto want = greedy_logits(*f32, a, prompt, 6);
    const auto got = greedy_logits(*f16, b, prompt, 6);
    ASSERT_EQ(got.size(), want.size());
    // K and V rounded to fp16 (relative 2^-11 each): the attention output moves by about that much relative
    // to the values' scale, and the logits by a small multiple of it through the layers. Measured: 0.28 and
    // 0.09 x 2^-11 of the largest logit (tiny-qwen3, tiny-qwen35); the bound is 4 x 2^-11.
    const double tol = 4 * std::ldexp(1.0, -11) * std::max(1.0, test::max_abs(want));
    std::printf("%s: f16 KV moves the logits by %.3g (max |logit| %.3g, bound %.3g)\n", name.c_str(),
                test::max_abs_diff(got, want), test::max_abs(want), tol);
    EXPECT_LT(test::max_abs_diff(got, want), tol);
    EXPECT_FALSE(test::bit_equal(got, want));  // the store really rounds
    if (name == "tiny-qwen3") EXPECT_EQ(a.bytes(), 2 * b.bytes());  // every layer attention: all KV
    else EXPECT_LT(b.bytes(), a.bytes());
  }
}

// A snapshot of an f16 store holds its values exactly (f16 -> f32); restored into another f16 sequence it
// continues bit for bit as the original does.
TEST(KvF16, a_restored_sequence_continues_bit_for_bit) {
  for (const std::string name : {"tiny-qwen3", "tiny-qwen35"}) {
    SCOPED_TRACE(name);
    const Weights& w = test::fixture_model(name);
    auto r = runner_with(w, cpu::KvType::kF16);
    const auto prompt = prompt_of(70, w.spec().vocab);
    SequenceState st(w.spec(), r->state_layout());
    auto l = r->prefill(st, prompt);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    auto snap = st.export_snapshot();
    ASSERT_TRUE(snap.ok()) << snap.status().to_string();
    bool some_kv = false;
    for (const SnapshotTensor& t : snap->tensors) {
      if (t.name.rfind("kv_", 0) != 0) continue;
      some_kv = true;
      for (float x : t.data) ASSERT_EQ(fp16_to_fp32(fp32_to_fp16(x)), x) << t.name << ": not an fp16 value";
    }
    EXPECT_TRUE(some_kv);
    SequenceState restored(w.spec(), r->state_layout());
    ASSERT_TRUE(restored.import_snapshot(*snap).ok());
    std::vector<float> a, b;
    const int64_t V = w.spec().vocab;
    int32_t ta = test::argmax(*l), tb = ta;
    for (int i = 0; i < 5; ++i) {
      Step sa, sb;
      sa.tokens = std::span<const int32_t>(&ta, 1);
      sb.tokens = std::span<const int32_t>(&tb, 1);
      auto oa = r->forward(st, sa);
      auto ob = r->forward(restored, sb);
      ASSERT_TRUE(oa.ok() && ob.ok());
      EXPECT_TRUE(test::bit_equal(oa->logits, ob->logits)) << "step " << i;
      ta = test::argmax(std::span<const float>(oa->logits).first(static_cast<size_t>(V)));
      tb = test::argmax(std::span<const float>(ob->logits).first(static_cast<size_t>(V)));
    }
  }
}

TEST(KvF16, speculative_greedy_output_equals_plain_decoding) {
  const Weights& w = test::fixture_model("tiny-qwen35");
  const Weights& dw = test::fixture_model("tiny-qwen35-dflash");
  auto r = runner_with(w, cpu::KvType::kF16);
  const auto prompt = prompt_of(50, w.spec().vocab);
  std::vector<int32_t> plain;
  {
    SequenceState st(w.spec(), r->state_layout());
    greedy_logits(*r, st, prompt, 40, &plain);
  }
  for (bool ddtree : {false, true}) {
    SCOPED_TRACE(ddtree ? "ddtree" : "chain");
    CpuBackend draft_be(kThreads);
    draft_be.set_kv_type(cpu::KvType::kF16);
    auto d = DFlashDraft::create(dw, w, draft_be);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    int64_t steps = 0;
    std::vector<int32_t> got = test::speculative_greedy(*r, **d, prompt, plain.size(), ddtree, &steps);
    ASSERT_GE(got.size(), plain.size());
    got.resize(plain.size());
    EXPECT_EQ(got, plain);
    EXPECT_GT(steps, 0);
  }
}

}  // namespace
}  // namespace dflash

// attention against a direct double softmax over the visible keys: causal (with and without a
// prefix), tree (random parents), full; GQA ratios 1, 2, 4; KV chunk boundaries inside the ranges.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/cpu/ops.h"
#include "ops_test_util.h"

namespace dflash::cpu {
namespace {

using test::SeededRng;

struct Kv {
  std::vector<std::vector<float>> k, v;  // chunks [ct, nkv, hd]
  std::vector<const float*> kp, vp;
  KvView view;
  // Key j, head h.
  const float* key(int64_t j, int64_t h) const {
    return k[j / view.chunk_tokens].data() + ((j % view.chunk_tokens) * view.n_kv_heads + h) * view.head_dim;
  }
  const float* val(int64_t j, int64_t h) const {
    return v[j / view.chunk_tokens].data() + ((j % view.chunk_tokens) * view.n_kv_heads + h) * view.head_dim;
  }
};

Kv make_kv(std::mt19937& rng, int64_t n_tokens, int64_t ct, int64_t nkv, int64_t hd) {
  Kv kv;
  const int64_t chunks = (n_tokens + ct - 1) / ct;
  for (int64_t c = 0; c < chunks; ++c) {
    kv.k.push_back(test::normal_vec(rng, ct * nkv * hd));
    kv.v.push_back(test::normal_vec(rng, ct * nkv * hd));
  }
  for (auto& c : kv.k) kv.kp.push_back(c.data());
  for (auto& c : kv.v) kv.vp.push_back(c.data());
  kv.view = KvView{kv.kp, kv.vp, ct, n_tokens, nkv, hd};
  return kv;
}

bool sees(const AttentionMask& m, int64_t i, int64_t j) {
  if (m.window > 0 && m.kind == MaskKind::kCausal && m.n_prefix + i - j >= m.window) return false;
  if (j < m.n_prefix) return true;
  const int64_t s = j - m.n_prefix;
  switch (m.kind) {
    case MaskKind::kCausal: return s <= i;
    case MaskKind::kFull: return true;
    case MaskKind::kTree:
      for (int64_t a = i; a >= 0; a = m.parents[a])
        if (a == s) return true;
      return false;
  }
  return false;
}

void check(std::mt19937& rng, MaskKind kind, int64_t n_prefix, int64_t n_q, int64_t nh, int64_t nkv, int64_t ct,
           ThreadPool& pool, int64_t window = 0) {
  const int64_t hd = 32;
  SCOPED_TRACE("kind " + std::to_string(int(kind)) + " prefix " + std::to_string(n_prefix) + " n_q " +
               std::to_string(n_q) + " nh " + std::to_string(nh) + " nkv " + std::to_string(nkv) + " chunk " +
               std::to_string(ct) + " window " + std::to_string(window));
  const int64_t n_tokens = n_prefix + n_q;
  Kv kv = make_kv(rng, n_tokens, ct, nkv, hd);
  const auto q = test::normal_vec(rng, n_q * nh * hd, 0.5f);
  std::vector<int32_t> parents(n_q);
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t i = 0; i < n_q; ++i)
    parents[i] = (i == 0 || u(rng) < 0.1) ? -1 : static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, i - 1)(rng));
  AttentionMask mask{kind, n_prefix, kind == MaskKind::kTree ? std::span<const int32_t>(parents) : std::span<const int32_t>(),
                     window};
  const float scale = 1.0f / std::sqrt(float(hd));
  std::vector<float> out(n_q * nh * hd, NAN);
  attention(q.data(), n_q, nh, kv.view, mask, scale, out.data(), pool);

  for (int64_t i = 0; i < n_q; ++i)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t kvh = h / (nh / nkv);
      const float* qv = q.data() + (i * nh + h) * hd;
      std::vector<double> sc(n_tokens, -INFINITY);
      double mx = -INFINITY;
      for (int64_t j = 0; j < n_tokens; ++j) {
        if (!sees(mask, i, j)) continue;
        double d = 0;
        for (int64_t e = 0; e < hd; ++e) d += double(qv[e]) * kv.key(j, kvh)[e];
        sc[j] = d * scale;
        mx = std::max(mx, sc[j]);
      }
      std::vector<double> ref(hd, 0.0);
      double sum = 0;
      for (int64_t j = 0; j < n_tokens; ++j) {
        if (sc[j] == -INFINITY) continue;
        const double p = std::exp(sc[j] - mx);
        sum += p;
        for (int64_t e = 0; e < hd; ++e) ref[e] += p * kv.val(j, kvh)[e];
      }
      for (int64_t e = 0; e < hd; ++e)
        ASSERT_NEAR(out[(i * nh + h) * hd + e], ref[e] / sum, 2e-6 * 4) << "query " << i << " head " << h;
    }
}

TEST(Attention, CausalTreeFullGqaChunks) {
  SeededRng s;
  ThreadPool pool(3);
  for (int64_t ratio : {1, 2, 4})
    for (int64_t ct : {8, 64}) {
      const int64_t nkv = 2, nh = nkv * ratio;
      check(s.rng, MaskKind::kCausal, 0, 70, nh, nkv, ct, pool);     // prefill, 70 not a multiple of 64
      check(s.rng, MaskKind::kCausal, 130, 1, nh, nkv, ct, pool);    // decode
      check(s.rng, MaskKind::kCausal, 61, 9, nh, nkv, ct, pool);     // chain verify across a boundary
      check(s.rng, MaskKind::kTree, 67, 23, nh, nkv, ct, pool);      // tree verify
      check(s.rng, MaskKind::kTree, 0, 12, nh, nkv, ct, pool);
      check(s.rng, MaskKind::kFull, 45, 16, nh, nkv, ct, pool);      // draft block
      check(s.rng, MaskKind::kFull, 0, 5, nh, nkv, ct, pool);
    }
}

// A causal sliding window (DFlash drafts' sliding-window layers): the prefix cut at each query's own lower
// bound, windows shorter and longer than a chunk, a block of queries behind a long prefix, a window of one.
TEST(Attention, CausalSlidingWindow) {
  SeededRng s;
  ThreadPool pool(3);
  for (int64_t ratio : {1, 4})
    for (int64_t ct : {8, 64})
      for (int64_t window : {1, 5, 16, 70, 500}) {
        const int64_t nkv = 2, nh = nkv * ratio;
        check(s.rng, MaskKind::kCausal, 100, 16, nh, nkv, ct, pool, window);  // draft block after its context
        check(s.rng, MaskKind::kCausal, 0, 40, nh, nkv, ct, pool, window);
      }
}

TEST(Attention, LargeScoresStayFinite) {
  // A running max that moves a lot between chunks: huge-norm queries.
  SeededRng s;
  ThreadPool pool(2);
  const int64_t hd = 16, n_tokens = 40, ct = 8;
  Kv kv = make_kv(s.rng, n_tokens, ct, 1, hd);
  auto q = test::normal_vec(s.rng, hd, 40.0f);
  std::vector<float> out(hd);
  attention(q.data(), 1, 1, kv.view, AttentionMask{MaskKind::kCausal, n_tokens - 1, {}}, 1.0f, out.data(), pool);
  for (float v : out) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace dflash::cpu

// attention: one (query, head) pair at a time, keys walked in KV-chunk order with a running max and
// running sum (flash style): per chunk, the visible scores q.k * scale are computed, the running max
// raised to the chunk's max (rescaling the accumulated output and sum by exp(old - new)), then
// p = exp(s - max) is added to the sum and p * v to the output. A query that sees no key gets zeros.
// Pairs are dealt to the pool's threads round-robin (causal rows have uneven lengths).
#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/kernels_internal.h"
#include "ops/cpu/ops.h"

namespace dflash::cpu {

void attention(const float* q, int64_t n_q, int64_t n_heads, const KvView& kv, const AttentionMask& mask,
               float scale, float* out, ThreadPool& pool) {
  const int64_t nkv = kv.n_kv_heads, hd = kv.head_dim, ct = kv.chunk_tokens;
  assert(nkv > 0 && n_heads % nkv == 0 && ct > 0);
  assert(mask.n_prefix >= 0 && mask.n_prefix <= kv.n_tokens);
  const int64_t group = n_heads / nkv;
  const int64_t n_prefix = mask.n_prefix;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  // Tree: visible[i * n_q + s] = 1 when slot s is i or one of its ancestors.
  std::vector<uint8_t> visible;
  if (mask.kind == MaskKind::kTree) {
    assert(static_cast<int64_t>(mask.parents.size()) >= n_q);
    visible.assign(static_cast<size_t>(n_q * n_q), 0);
    for (int64_t i = 0; i < n_q; ++i) {
      uint8_t* row = visible.data() + i * n_q;
      row[i] = 1;
      const int32_t p = mask.parents[i];
      assert(p < i);
      if (p >= 0) {  // the parent's row is complete already (p < i)
        const uint8_t* prow = visible.data() + p * n_q;
        for (int64_t s = 0; s <= p; ++s) row[s] |= prow[s];
      }
    }
  }

  const int64_t n_items = n_q * n_heads;
  const int64_t n_tasks = std::min<int64_t>(n_items, pool.size());
  pool.parallel_for(n_tasks, 1, [&](int64_t tb, int64_t te) {
    std::vector<float> scores(static_cast<size_t>(ct));
    std::vector<float> acc(static_cast<size_t>(hd));
    for (int64_t task = tb; task < te; ++task) {
      for (int64_t item = task; item < n_items; item += n_tasks) {
        const int64_t i = item / n_heads, h = item % n_heads, kvh = h / group;
        const float* qv = q + item * hd;
        // Keys past `end` are never visible to this query.
        int64_t end = kv.n_tokens;
        if (mask.kind != MaskKind::kFull) end = std::min(end, n_prefix + i + 1);
        const uint8_t* vis = mask.kind == MaskKind::kTree ? visible.data() + i * n_q : nullptr;

        float m = kNegInf, l = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j0 = 0, c = 0; j0 < end; j0 += ct, ++c) {
          const int64_t j1 = std::min(end, j0 + ct);
          const float* kc = kv.k_chunks[c];
          const float* vc = kv.v_chunks[c];
          float mb = kNegInf;
          for (int64_t j = j0; j < j1; ++j) {
            float s = kNegInf;
            if (vis == nullptr || j < n_prefix || vis[j - n_prefix]) {
              s = detail::dot(qv, kc + ((j - j0) * nkv + kvh) * hd, hd) * scale;
              mb = std::max(mb, s);
            }
            scores[j - j0] = s;
          }
          if (mb == kNegInf) continue;
          if (mb > m) {
            const float corr = m == kNegInf ? 0.0f : std::exp(m - mb);
            l *= corr;
            detail::scale(corr, acc.data(), hd);
            m = mb;
          }
          for (int64_t j = j0; j < j1; ++j) {
            if (scores[j - j0] == kNegInf) continue;
            const float p = std::exp(scores[j - j0] - m);
            l += p;
            detail::axpy(p, vc + ((j - j0) * nkv + kvh) * hd, acc.data(), hd);
          }
        }
        float* o = out + item * hd;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int64_t d = 0; d < hd; ++d) o[d] = acc[d] * inv;
      }
    }
  });
}

}  // namespace dflash::cpu

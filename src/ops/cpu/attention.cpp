// attention: one (query, head) pair at a time, keys walked in groups of 64 positions with a running max and
// running sum (flash style): per group, the visible scores q.k * scale are computed, the running max
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
#include "tensor/half.h"

namespace dflash::cpu {

const char* kv_type_name(KvType t) { return t == KvType::kF16 ? "f16" : "f32"; }

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
    std::vector<float> krow(static_cast<size_t>(hd)), vrow(static_cast<size_t>(hd));  // f16 rows as float32
    std::vector<int64_t> keys;  // a tree query's visible new slots
    for (int64_t task = tb; task < te; ++task) {
      for (int64_t item = task; item < n_items; item += n_tasks) {
        const int64_t i = item / n_heads, h = item % n_heads, kvh = h / group;
        const float* qv = q + item * hd;
        // Keys past `end` are never visible to this query.
        int64_t end = kv.n_tokens;
        if (mask.kind != MaskKind::kFull) end = std::min(end, n_prefix + i + 1);
        const uint8_t* vis = mask.kind == MaskKind::kTree ? visible.data() + i * n_q : nullptr;

        // The keys in the order (and the 64-key groups) a causal query walks them. A tree query's keys are the
        // prefix, then its ancestors and itself at positions n_prefix + depth: walked as if they sat at those
        // positions, so a node's output is bit for bit that of plain decoding of its path.
        int64_t n_keys = end;
        if (vis != nullptr) {
          keys.clear();
          for (int64_t s = 0; s <= i; ++s)
            if (vis[s]) keys.push_back(n_prefix + s);
          n_keys = n_prefix + static_cast<int64_t>(keys.size());
        }
        const auto slot_of = [&](int64_t t) { return vis == nullptr || t < n_prefix ? t : keys[t - n_prefix]; };
        // Row j of K or V for this KV head; an f16 store's row converted (exactly) into `tmp`.
        const auto row_at = [&](std::span<const float* const> chunks, int64_t j, std::vector<float>& tmp) {
          const int64_t e = ((j % ct) * nkv + kvh) * hd;
          if (kv.type == KvType::kF32) return chunks[j / ct] + e;
          fp16_to_fp32_row(reinterpret_cast<const uint16_t*>(chunks[j / ct]) + e, tmp.data(), hd);
          return static_cast<const float*>(tmp.data());
        };
        const auto k_at = [&](int64_t j) { return row_at(kv.k_chunks, j, krow); };
        const auto v_at = [&](int64_t j) { return row_at(kv.v_chunks, j, vrow); };

        float m = kNegInf, l = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        // A sliding window (causal only) hides the keys before n_prefix + i - (window - 1).
        const int64_t lo = mask.window > 0 && mask.kind == MaskKind::kCausal ? n_prefix + i - (mask.window - 1) : 0;
        for (int64_t t0 = 0; t0 < n_keys; t0 += ct) {
          const int64_t t1 = std::min(n_keys, t0 + ct);
          float mb = kNegInf;
          for (int64_t t = t0; t < t1; ++t) {
            if (t < lo) {
              scores[t - t0] = kNegInf;
              continue;
            }
            const float s = detail::dot(qv, k_at(slot_of(t)), hd) * scale;
            mb = std::max(mb, s);
            scores[t - t0] = s;
          }
          if (mb == kNegInf) continue;
          if (mb > m) {
            const float corr = m == kNegInf ? 0.0f : std::exp(m - mb);
            l *= corr;
            detail::scale(corr, acc.data(), hd);
            m = mb;
          }
          for (int64_t t = t0; t < t1; ++t) {
            if (scores[t - t0] == kNegInf) continue;
            const float p = std::exp(scores[t - t0] - m);
            l += p;
            detail::axpy(p, v_at(slot_of(t)), acc.data(), hd);
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

// What the two prefill kernels of attention.h share (attention_mma.cu's mma.sync one and attention_wgmma.cu's
// wgmma one, attention_internal.h's Params): a block's rows and key range, its scaled Q, a key's place in the
// chunk table, the mask of a tile, and the epilogue.
// Rows are (query, head-of-group) pairs of one KV head, query-major, kRowsPerBlock of them a block; a thread holds
// rows a and b (the C fragments' g and g + 8 of its warp's 16), the 4 threads of a quad share a row.
//
// Included by nvcc-compiled code only.
#pragma once

#include <cmath>
#include <cstdint>

#include "ops/cuda/attention_internal.h"
#include "ops/cuda/mma_f16.cuh"

namespace dflash::cuda::attn_mma {

// The block's rows [row0, row_end) and its keys [kb, ke): the split's range, cut to the last query's causal
// horizon and the first query's window; n_tiles tiles of BN keys. Row blocks run in reverse, so that a causal
// call's longest blocks start first.
struct BlockRows {
  int kvh, split, row0, row_end, i_lo, i_hi, kb, ke, n_tiles;
};
template <int BN>
__device__ __forceinline__ BlockRows block_rows(const Params& p) {
  BlockRows r;
  r.kvh = blockIdx.y;
  r.split = blockIdx.z;
  const int rb = p.row_blocks - 1 - static_cast<int>(blockIdx.x);
  r.row0 = rb * kRowsPerBlock;
  r.row_end = min(r.row0 + kRowsPerBlock, p.n_q * p.group);  // n_q * group < 2^31 (planner)
  r.i_lo = r.row0 / p.group;
  r.i_hi = (r.row_end - 1) / p.group;
  r.kb = r.split * p.keys_per_split;
  r.ke = min(p.n_tokens, r.kb + p.keys_per_split);
  if (p.causal) {
    r.ke = min(r.ke, p.n_prefix + r.i_hi + 1);
    if (p.window > 0) r.kb = max(r.kb, p.n_prefix + r.i_lo - p.window + 1);
  }
  r.n_tiles = r.ke > r.kb ? (r.ke - r.kb + BN - 1) / BN : 0;
  return r;
}

__device__ __forceinline__ float4 ldg_nc4(const float* ptr) {
  float4 v;
  asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(ptr));
  return v;
}

// Columns [4 c4, 4 c4 + 4) of the block's Q row `row` times scale * log2(e), so that scores come out in base-2
// units (zeros past row_end).
template <int HD>
__device__ __forceinline__ float4 scaled_q4(const Params& p, const BlockRows& r, int row, int c4) {
  const int g = r.row0 + row;
  if (g >= r.row_end) return make_float4(0.f, 0.f, 0.f, 0.f);
  const int64_t i = g / p.group, h = static_cast<int64_t>(r.kvh) * p.group + g % p.group;
  float4 v = ldg_nc4(p.q + (i * p.n_heads + h) * HD + 4 * c4);
  v.x *= p.scale_log2;
  v.y *= p.scale_log2;
  v.z *= p.scale_log2;
  v.w *= p.scale_log2;
  return v;
}

// Chunk-table offset (elements) of column col of key j's row for KV head kvh; c: the key's chunk.
template <int HD>
__device__ __forceinline__ int64_t kv_offset(const Params& p, int j, int kvh, int col, int& c) {
  c = p.chunk_shift >= 0 ? j >> p.chunk_shift : j / p.chunk_tokens;
  return (static_cast<int64_t>(j - c * p.chunk_tokens) * p.n_kv_heads + kvh) * HD + col;
}

// Keys of tile j0 a row may not see to -inf (the tile crosses the key range's end, the causal diagonal or the
// window); ia, ib: this thread's two rows' queries.
template <int BN>
__device__ __forceinline__ void mask_tile(const Params& p, const BlockRows& r, int j0, int ia, int ib, int qc,
                                          float (&s)[BN / 8][4]) {
  const bool edge = j0 + BN > r.ke || (p.causal && (j0 + BN - 1 > p.n_prefix + r.i_lo ||
                                                    (p.window > 0 && j0 <= p.n_prefix + r.i_hi - p.window)));
  if (!edge) return;
#pragma unroll
  for (int n = 0; n < BN / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = j0 + n * 8 + 2 * qc + (e & 1);
      const int i = e < 2 ? ia : ib;
      bool vis = j < r.ke;
      if (p.causal) vis = vis && j <= p.n_prefix + i && (p.window <= 0 || p.n_prefix + i - j < p.window);
      if (!vis) s[n][e] = -INFINITY;
    }
}

// The row sums over the quad, then O / l (0 for a row that saw no key) or the split's partials; ra: row a's
// index in the block.
template <int HD>
__device__ __forceinline__ void finish_rows(const Params& p, const BlockRows& r, int ra, int qc, float (&o)[HD / 8][4],
                                            float m_a, float m_b, float l_a, float l_b) {
#pragma unroll
  for (int w = 1; w <= 2; w <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, w);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, w);
  }
  const int64_t n_rows = static_cast<int64_t>(p.n_q) * p.n_heads;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int g = r.row0 + ra + 8 * half;
    if (g >= r.row_end) continue;
    const int64_t i = g / p.group, h = static_cast<int64_t>(r.kvh) * p.group + g % p.group;
    const int64_t row = i * p.n_heads + h;
    float ov[HD / 8][2];
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) {
      ov[d][0] = o[d][2 * half];
      ov[d][1] = o[d][2 * half + 1];
    }
    store_row<HD>(ov, half ? m_b : m_a, half ? l_b : l_a, row, qc, r.split, p.n_splits, n_rows, p.out, p.part_acc,
                  p.part_ml);
  }
}

}  // namespace dflash::cuda::attn_mma

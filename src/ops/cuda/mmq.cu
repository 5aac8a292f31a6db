// Int8 tensor-core products of q2_K..q6_K, q8_0 and q4_0 weights with 1..32 tokens (mmq.h).
//
// Work split: a CTA of 8 warps; a warp owns T tiles of 16 consecutive rows (T = tiles_a_warp: 1, or 2 for
// many tokens and rows, which then share each activation fragment) and all the launch's tokens (NT8 = ceil(n / 8)
// mma n-tiles of 8 tokens), and takes every split-th block of the rows (split warps a warp tile, split =
// mmq_split(rows, cols), 8 / split warp tiles a CTA). Per block a lane (g = lane / 4, tid =
// lane % 4) loads its share of rows g and g + 8 straight from global memory (kD blocks at once, issued
// before any is used), builds the mma A fragments from the packed codes with shifts and masks, and
// dots them with the tokens' codes (B fragments: mmq_pack_x's layout, one 16-byte load a lane and chunk for
// q4_K, 8 bytes a 32-element group for q6_K and q3_K, a warp's load 8 tokens' contiguous pieces; the scales of the
// lane's two epilogue columns from the records beside them):
//   q4_K  one m16n8k32 per 32-element sub-block s = 2c + h (c: 32-byte chunk of qs, h: nibble). Lane tid
//         takes qs bytes [8 tid, 8 tid + 8) of each chunk (an 8-byte load a row and chunk): k-slots
//         4 tid + [0, 4) <- elements 64c + 32h + 8tid + [0, 4), 16 + 4 tid + [0, 4) <- + 4; the B
//         fragment takes the token's codes in the same permutation.
//   q5_K  as q4_K, the fifth bits OR'd in from the lane's 8 qh bytes.
//   q6_K  one m16n8k16 per 16-element group (its own int8 scale): lane tid takes 4 codes (4 bytes of ql,
//         4 of qh: the device form, weight_form.h, aligned blocks), made signed (code - 32) by byte
//         arithmetic, so no activation sums are needed.
//   q3_K  as q6_K (GroupOrder): 4 bytes of qs and of hmask a group, codes made signed in place.
//   q2_K  as q6_K's layout, codes 0..3 with a min term: each group's activation sum by an mma against ones.
//   q8_0, q4_0  as q4_K's layout, a block per 32-element sub-block (Block32Order): q8_0's code bytes as they
//         are, q4_0's nibbles made signed (code - 8); a 256-element super-block of 8 blocks stands for a block.
// The mma sums are exact int32. Float epilogue per (row, token) element, in this order:
//   q4_K  the canonical order (mmq.h), which gemv_q8 forms too: per chunk c of each block
//         (sub-blocks 2c, 2c + 1), t_s = fma(d sc_s, isum_s, -(dmin m_s * xsum_s)), v_c = fma(xd_2c+1, t_2c+1,
//         xd_2c t_2c); per block acc = acc + ((v_0 + v_1) + (v_2 + v_3)); xsum_s = xs[2s] + xs[2s + 1]
//         (exact), d sc_s and dmin m_s rounded products of the block's fields.
//   q6_K, q3_K  the canonical order too: per 32-element group q, J_q = sc_2q isum_2q + sc_2q+1 isum_2q+1
//         (exact in int32, |J| < 2^24 so exact in f32) and p_q = xd_q J_q; per block inner = ((p_0 + p_1) +
//         (p_2 + p_3)) + ((p_4 + p_5) + (p_6 + p_7)) (Tree8) and acc = fma(d, inner, acc).
//   q2_K  t = fma(dl, isum, -(ml xsum)) a 16-element group, p_q = xd_q (t_q0 + t_q1), Tree8, acc + inner.
//   q8_0, q4_0  per block j of a super-block p_j = xd_j (d_j isum_j); inner = the Tree8 of the eight;
//         acc = acc + inner.
// A warp's blocks are taken in increasing order; with split > 1 the warps' partials of a tile are added
// in warp order (s = p0; s += p1; ...). None of this depends on n or on the token's column: a token's
// outputs are the same bit for bit in every batch.
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "base/checked_math.h"
#include "ops/cuda/gemv_q8.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/matmul.h"
#include "ops/cuda/mmq.h"
#include "ops/cuda/quant_blocks.cuh"
#include "ops/cuda/weight_form.h"

namespace dflash::cuda {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps, kTileRows = 16;
constexpr uint32_t kLowNibbles = 0x0f0f0f0fu;

constexpr int kMaxParts = kQ8MaxParts;

struct Args {
  // The launch's weights (parts): part p owns CTAs [cta_begin[p], cta_begin[p + 1]) (cta_begin[np] the grid).
  const uint8_t* w[kMaxParts];
  float* y[kMaxParts];
  int rows[kMaxParts];  // each at most INT_MAX
  unsigned cta_begin[kMaxParts + 1];
  int np;
  int64_t cols, rb;
  const uint8_t* xc;   // mmq_pack_x: codes, 64 bytes a (block, chunk, token)
  const float4* xsc;   // its scales: one record a (block, chunk, token)
  int n, n8, split;    // tokens, and tokens padded to whole n-tiles (the layout's stride); parts a row
  int pp;              // parts a warp holds (1, or 2: split / 2 warps a tile; mmq_kernel's PP)
};

// Record (block b, chunk c, token t) of the packed activations (mmq_pack_x).
__device__ __forceinline__ int64_t xrec(const Args& a, int64_t b, int c, int t) {
  return (b * 4 + c) * a.n8 + t;
}

// D = A B (C = 0) with A 16 x 32 (rows g, g + 8 in a0/a2 and a1/a3), B 32 x 8 (column g), D rows g, g + 8
// and columns 2 tid, 2 tid + 1.
__device__ __forceinline__ void mma_k32(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int (&d)[4]) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}
__device__ __forceinline__ void mma_k16(const uint32_t (&a)[2], uint32_t b, int (&d)[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(b), "r"(0));
}

// The packed activations (mmq_pack_x's, written by the kernel before this one) through coherent loads (__ldca),
// which ptxas keeps below the PDL wait: mmq_kernel loads its first weight blocks before the wait (launch.cuh).
__device__ __forceinline__ uint2 ldx_u2(const void* p) { return __ldca(static_cast<const uint2*>(p)); }
__device__ __forceinline__ uint4 ldx_u4(const void* p) { return __ldca(static_cast<const uint4*>(p)); }
// Weight loads that skip L1 (read once), or through L1 (kNoAlloc false).
template <bool kNoAlloc>
__device__ __forceinline__ uint2 ldw_u2(const void* p) {
  if constexpr (kNoAlloc) {
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
  } else {
    return __ldg(static_cast<const uint2*>(p));
  }
}
__device__ __forceinline__ uint4 ldg_u4(const void* p) { return __ldg(static_cast<const uint4*>(p)); }
__device__ __forceinline__ uint32_t ldg_u32(const void* p) { return __ldg(static_cast<const uint32_t*>(p)); }
__device__ __forceinline__ uint32_t ldg_u16(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}

using qblocks::fp16_bits_hw;
using qblocks::k4_scales_mins;

// q4_K: d, dmin (fp16), 12 bytes of packed scales, 128 bytes of nibbles. Lane: rows i = 0 (g), 1 (g + 8).
// q5_K (kHigh): the same, with qh[32] between the scales and the nibbles: element 64c + 32h + l's fifth bit is
// bit 2c + h of qh[l], so the lane's 8 qh bytes (l = 8 tid + [0, 8)) serve all four chunks.
template <bool kNoAlloc, bool kHigh = false>
struct Q4K {
  static constexpr int kBytes = kHigh ? 176 : 144, kQs = kHigh ? 48 : 16;
  struct Raw {
    uint4 hdr[2];
    uint2 qs[2][4];  // row i, chunk c: qs bytes 32c + 8 tid + [0, 8)
    uint2 qh[kHigh ? 2 : 1];  // row i: qh bytes 8 tid + [0, 8) (q5_K)
  };
  __device__ static Raw load(const uint8_t* const (&rowp)[2], int64_t b, int64_t /*blocks*/, int tid) {
    Raw r;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint8_t* blk = rowp[i] + b * kBytes;
      r.hdr[i] = ldg_u4(blk);
      if constexpr (kHigh) r.qh[i] = ldw_u2<kNoAlloc>(blk + 16 + 8 * tid);
#pragma unroll
      for (int c = 0; c < 4; ++c) r.qs[i][c] = ldw_u2<kNoAlloc>(blk + kQs + 32 * c + 8 * tid);
    }
    return r;
  }
  template <int NT8, int T>
  __device__ static void block(const Args& a, const Raw (&r)[T], int64_t b, int g, int tid,
                               float (&acc)[T][NT8][4]) {
    float d[T][2], dmin[T][2];
#pragma unroll
    for (int u = 0; u < T; ++u)
#pragma unroll
      for (int i = 0; i < 2; ++i)
        d[u][i] = fp16_bits_hw(r[u].hdr[i].x & 0xffffu), dmin[u][i] = fp16_bits_hw(r[u].hdr[i].x >> 16);
    // The chunk terms' pair sums of the canonical order: v_0 (then v_2) held until v_1 (v_3) comes, and
    // v_0 + v_1 until the block's T = (v_0 + v_1) + (v_2 + v_3) is added to acc.
    float first[T][NT8][4], pair01[T][NT8][4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      // Sub-blocks 2c (h = 0) and 2c + 1 (h = 1): scales of both rows of each tile, A fragments.
      float ds[T][2][2], ms[T][2][2];
      uint32_t fa[T][2][4];
#pragma unroll
      for (int u = 0; u < T; ++u) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          int sc[2], m[2];
          k4_scales_mins(c, r[u].hdr[i].y, r[u].hdr[i].z, r[u].hdr[i].w, sc, m);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            ds[u][i][h] = __fmul_rn(d[u][i], static_cast<float>(sc[h]));
            ms[u][i][h] = __fmul_rn(dmin[u][i], static_cast<float>(m[h]));
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          fa[u][h][0] = (r[u].qs[0][c].x >> (4 * h)) & kLowNibbles;
          fa[u][h][1] = (r[u].qs[1][c].x >> (4 * h)) & kLowNibbles;
          fa[u][h][2] = (r[u].qs[0][c].y >> (4 * h)) & kLowNibbles;
          fa[u][h][3] = (r[u].qs[1][c].y >> (4 * h)) & kLowNibbles;
          if constexpr (kHigh) {
            const int bit = 2 * c + h;
            fa[u][h][0] |= ((r[u].qh[0].x >> bit) & 0x01010101u) << 4;
            fa[u][h][1] |= ((r[u].qh[1].x >> bit) & 0x01010101u) << 4;
            fa[u][h][2] |= ((r[u].qh[0].y >> bit) & 0x01010101u) << 4;
            fa[u][h][3] |= ((r[u].qh[1].y >> bit) & 0x01010101u) << 4;
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt) {
        // The tokens' fragments, loaded once for the T tiles: the lane's 16 code bytes of the chunk (column g),
        // and the scale records of its two epilogue columns (xd of sub-blocks 2c, 2c + 1, then their sums).
        const int64_t rec = xrec(a, b, c, nt * 8);
        const uint4 xv = ldx_u4(a.xc + (rec + g) * 64 + 16 * tid);
        const float4 s0 = __ldca(a.xsc + rec + 2 * tid), s1 = __ldca(a.xsc + rec + 2 * tid + 1);
        // Sub-block sums (h: sub-block 2c + h) of the lane's two token columns.
        const float xsum[2][2] = {{s0.z, s1.z}, {s0.w, s1.w}};
        const float xd[2][2] = {{s0.x, s1.x}, {s0.y, s1.y}};
#pragma unroll
        for (int u = 0; u < T; ++u) {
          int isum[2][4];
          mma_k32(fa[u][0], xv.x, xv.y, isum[0]);
          mma_k32(fa[u][1], xv.z, xv.w, isum[1]);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = e >> 1, k = e & 1;
            float t[2];
#pragma unroll
            for (int h = 0; h < 2; ++h)
              t[h] = __fmaf_rn(ds[u][i][h], static_cast<float>(isum[h][e]), -__fmul_rn(ms[u][i][h], xsum[h][k]));
            const float v = __fmaf_rn(xd[1][k], t[1], __fmul_rn(xd[0][k], t[0]));
            if (c % 2 == 0) {
              first[u][nt][e] = v;
            } else if (c == 1) {
              pair01[u][nt][e] = __fadd_rn(first[u][nt][e], v);
            } else {
              acc[u][nt][e] = __fadd_rn(acc[u][nt][e], __fadd_rn(pair01[u][nt][e], __fadd_rn(first[u][nt][e], v)));
            }
          }
        }
      }
    }
  }
};

// The canonical tree over a (super-)block's eight terms p_q, added in order q = 0..7: ((p_0 + p_1) + (p_2 + p_3)) +
// ((p_4 + p_5) + (p_6 + p_7)). even, pair and quad carry the partial sums between steps; after q = 7, inner holds
// the total.
struct Tree8 {
  float even, pair, quad, inner;
  __device__ __forceinline__ void add(int q, float p) {
    if (q % 2 == 0) {
      even = p;
      return;
    }
    const float two = __fadd_rn(even, p);
    if (q == 1 || q == 5) pair = two;
    else if (q == 3) quad = __fadd_rn(pair, two);
    else inner = __fadd_rn(quad, __fadd_rn(pair, two));
  }
};

// The types with 16-element groups (q6_K, q3_K, q2_K) in their canonical order. Group (q, j) (q = 4h + k:
// 32-element group, j: half of it) holds elements 128h + 32k + 16j + [0, 16); S gives, for the lane's row i of
// its tile: frag(r, i, q, j), the codes of elements 128h + 32k + 16j + 4 tid + [0, 4) (the A fragment of an
// m16n8k16 step); scales(r, i, q), the group's scales (S::Scales); value(scales, isum, xsum), the float V_q of
// group q from its halves' exact integer dots (and, where S::kMins, their activation code sums, by an mma
// against ones); then p_q = xd_q V_q, inner = the Tree8 of the eight, and finish(r, i, inner, acc).
template <typename S>
struct GroupOrder : S {
  using Raw = typename S::Raw;  // kBytes, Raw and load: S's
  template <int NT8, int T>
  __device__ static void block(const Args& a, const Raw (&r)[T], int64_t b, int g, int tid,
                               float (&acc)[T][NT8][4]) {
    constexpr uint32_t kOnes[2] = {0x01010101u, 0x01010101u};
    // The tree of the canonical order: p of the last even group until its odd partner comes, the pair sum of
    // groups 0-1 (then 4-5) until 2-3 (6-7) is done, and the sum of groups 0-3 until 4-7 is.
    Tree8 tree[T][NT8][4];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      // A fragments of groups (q, 0) and (q, 1), and their scales, for both rows of each tile.
      uint32_t fa[T][2][2];
      typename S::Scales sc[T][2];
#pragma unroll
      for (int u = 0; u < T; ++u)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
          for (int j = 0; j < 2; ++j) fa[u][j][i] = S::frag(r[u], i, q, j);
          sc[u][i] = S::scales(r[u], i, q);
        }
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt) {
        // The lane's 8 code bytes of group q (its 16-byte piece of chunk q / 2: groups 2c, 2c + 1), and xd of
        // the group for its two epilogue columns.
        const int64_t rec = xrec(a, b, q >> 1, nt * 8);
        const uint2 xf = ldx_u2(a.xc + (rec + g) * 64 + 16 * tid + 8 * (q & 1));
        const float* s0 = reinterpret_cast<const float*>(a.xsc + rec + 2 * tid);
        const float xd[2] = {__ldca(s0 + (q & 1)), __ldca(s0 + 4 + (q & 1))};
        int xsum[2][4] = {};  // the halves' code sums of the lane's token columns (every row the same)
        if constexpr (S::kMins)
#pragma unroll
          for (int j = 0; j < 2; ++j) mma_k16(kOnes, j == 0 ? xf.x : xf.y, xsum[j]);
#pragma unroll
        for (int u = 0; u < T; ++u) {
          int isum[2][4];
#pragma unroll
          for (int j = 0; j < 2; ++j) mma_k16(fa[u][j], j == 0 ? xf.x : xf.y, isum[j]);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int is[2] = {isum[0][e], isum[1][e]}, xs[2] = {xsum[0][e], xsum[1][e]};
            const float pq = __fmul_rn(xd[e & 1], S::value(sc[u][e >> 1], is, xs));
            tree[u][nt][e].add(q, pq);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < T; ++u)
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[u][nt][e] = S::finish(r[u], e >> 1, tree[u][nt][e].inner, acc[u][nt][e]);
  }
};

// q6_K and q3_K: int scales; V_q = J_q = sc_q0 isum_q0 + sc_q1 isum_q1 (exact in int32, |J| < 2^24 so exact in
// f32); finish: fma(d, inner, acc).
struct IntScales {
  static constexpr bool kMins = false;
  struct Scales {
    int s[2];
  };
  __device__ static float value(const Scales& sc, const int (&isum)[2], const int (&/*xsum*/)[2]) {
    return static_cast<float>(isum[0] * sc.s[0] + isum[1] * sc.s[1]);
  }
};

// q6_K in the device form (weight_form.h): a block's ql[128] (low nibbles), qh[64] (2 high bits each), int8
// scales[16] at 208 aligned bytes, its d (fp16) in the row's scale array. Group (q, j): nibble k / 2 of
// ql[64h + 32(k & 1) + 16j + l], bits 2k of qh[32h + 16j + l], scale scales[2q + j], code - 32.
struct Q6Src : IntScales {
  static constexpr int kBytes = kQ6Body;
  struct Raw {
    uint32_t ql[2][8];  // row i, 16-byte segment s of ql: bytes 16s + 4 tid + [0, 4)
    uint32_t qh[2][4];  // row i, segment s of qh
    uint32_t sc[2][4];  // row i: the 16 scale bytes
    uint32_t d[2];
  };
  __device__ static Raw load(const uint8_t* const (&rowp)[2], int64_t b, int64_t blocks, int tid) {
    Raw r;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint8_t* blk = rowp[i] + b * kBytes;
#pragma unroll
      for (int s = 0; s < 8; ++s) r.ql[i][s] = ldg_u32(blk + 16 * s + 4 * tid);
#pragma unroll
      for (int s = 0; s < 4; ++s) r.qh[i][s] = ldg_u32(blk + 128 + 16 * s + 4 * tid);
      const uint4 sc = ldg_u4(blk + 192);
      r.sc[i][0] = sc.x, r.sc[i][1] = sc.y, r.sc[i][2] = sc.z, r.sc[i][3] = sc.w;
      r.d[i] = ldg_u16(rowp[i] + q6k_d_offset(blocks, b));
    }
    return r;
  }
  __device__ static uint32_t frag(const Raw& r, int i, int q, int j) {
    const int h = q >> 2, k = q & 3;
    const uint32_t lo = (r.ql[i][4 * h + 2 * (k & 1) + j] >> (4 * (k >> 1))) & kLowNibbles;
    const uint32_t hi = ((r.qh[i][2 * h + j] >> (2 * k)) & 0x03030303u) << 4;
    // code - 32 in each byte: bit 7 set first so that no byte borrows from the next.
    return (((lo | hi) | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
  }
  __device__ static Scales scales(const Raw& r, int i, int q) {
    const uint32_t w = r.sc[i][q >> 1] >> (16 * (q & 1));
    return Scales{{static_cast<int8_t>(w & 0xffu), static_cast<int8_t>((w >> 8) & 0xffu)}};
  }
  __device__ static float finish(const Raw& r, int i, float inner, float acc) {
    return __fmaf_rn(fp16_bits_hw(r.d[i]), inner, acc);
  }
};

// q3_K in its padded device form (weight_form.h: 112-byte blocks): hmask[32], qs[64], scales[12], d. Group (q, j):
// bits 2k of qs[32h + 16j + l], minus 4 where bit 4h + k of hmask[16j + l] is clear (quant_blocks.cuh
// q3k_codes), 6-bit scale 2q + j minus 32 (q3k_scale).
struct Q3Src : IntScales {
  static constexpr int kBytes = kQ3Stride;
  struct Raw {
    uint32_t qs[2][4];  // row i, (h, j) = s / 2, s % 2: qs bytes 32h + 16j + 4 tid + [0, 4)
    uint32_t nh[2][2];  // row i, j: hmask bytes 16j + 4 tid + [0, 4), inverted
    uint4 hdr[2];       // row i: scales[12], d
  };
  __device__ static Raw load(const uint8_t* const (&rowp)[2], int64_t b, int64_t /*blocks*/, int tid) {
    Raw r;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint8_t* blk = rowp[i] + b * kBytes;
#pragma unroll
      for (int s = 0; s < 4; ++s) r.qs[i][s] = ldg_u32(blk + 32 + 16 * s + 4 * tid);
#pragma unroll
      for (int j = 0; j < 2; ++j) r.nh[i][j] = ~ldg_u32(blk + 16 * j + 4 * tid);
      r.hdr[i] = ldg_u4(blk + 96);
    }
    return r;
  }
  __device__ static uint32_t frag(const Raw& r, int i, int q, int j) {
    const int h = q >> 2, k = q & 3;
    return static_cast<uint32_t>(qblocks::q3k_codes(r.qs[i][2 * h + j], r.nh[i][j], h, k));
  }
  __device__ static Scales scales(const Raw& r, int i, int q) {
    return Scales{{qblocks::q3k_scale(r.hdr[i], q >> 2, q & 3, 0), qblocks::q3k_scale(r.hdr[i], q >> 2, q & 3, 1)}};
  }
  __device__ static float finish(const Raw& r, int i, float inner, float acc) {
    return __fmaf_rn(fp16_bits_hw(r.hdr[i].w & 0xffffu), inner, acc);
  }
};

using Q6K = GroupOrder<Q6Src>;
using Q3K = GroupOrder<Q3Src>;

// q2_K in its split device form (weight_form.h: scales[16] and qs[64] bodies, each block's (d, dmin) apart), in
// gemv_q8's order for it: group (q, j) has codes bits 2k of qs[32h + 16j + l] and scale byte 2q + j (dl = d
// (sc & 15), ml = dmin (sc >> 4), rounded); V_q = t_q0 + t_q1 with t = fma(dl, isum, -(ml xsum)); finish:
// acc + inner.
struct Q2Src {
  static constexpr int kBytes = kQ2Body;
  static constexpr bool kMins = true;
  struct Raw {
    uint32_t qs[2][4];  // row i, (h, j) = s / 2, s % 2: qs bytes 32h + 16j + 4 tid + [0, 4)
    uint32_t sc[2][4];  // row i: the 16 scale bytes
    uint32_t dm[2];     // row i: d, dmin (fp16, d low)
  };
  struct Scales {
    float dl[2], ml[2];
  };
  __device__ static Raw load(const uint8_t* const (&rowp)[2], int64_t b, int64_t blocks, int tid) {
    Raw r;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint8_t* blk = rowp[i] + b * kBytes;
#pragma unroll
      for (int s = 0; s < 4; ++s) r.qs[i][s] = ldg_u32(blk + 16 + 16 * s + 4 * tid);
      const uint4 sc = ldg_u4(blk);
      r.sc[i][0] = sc.x, r.sc[i][1] = sc.y, r.sc[i][2] = sc.z, r.sc[i][3] = sc.w;
      r.dm[i] = ldg_u32(rowp[i] + q2k_dm_offset(blocks, b));
    }
    return r;
  }
  __device__ static uint32_t frag(const Raw& r, int i, int q, int j) {
    return (r.qs[i][2 * (q >> 2) + j] >> (2 * (q & 3))) & 0x03030303u;
  }
  __device__ static Scales scales(const Raw& r, int i, int q) {
    const float d = fp16_bits_hw(r.dm[i] & 0xffffu), dmin = fp16_bits_hw(r.dm[i] >> 16);
    Scales s;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t sc = (r.sc[i][q >> 1] >> (16 * (q & 1) + 8 * j)) & 0xffu;
      s.dl[j] = __fmul_rn(d, static_cast<float>(sc & 0x0fu));
      s.ml[j] = __fmul_rn(dmin, static_cast<float>(sc >> 4));
    }
    return s;
  }
  __device__ static float value(const Scales& sc, const int (&isum)[2], const int (&xsum)[2]) {
    float t[2];
#pragma unroll
    for (int j = 0; j < 2; ++j)
      t[j] = __fmaf_rn(sc.dl[j], static_cast<float>(isum[j]), -__fmul_rn(sc.ml[j], static_cast<float>(xsum[j])));
    return __fadd_rn(t[0], t[1]);
  }
  __device__ static float finish(const Raw& /*r*/, int /*i*/, float inner, float acc) { return __fadd_rn(acc, inner); }
};

using Q2K = GroupOrder<Q2Src>;

// Rows of whole 256-element super-blocks of a 32-element type (q8_0, q4_0) in gemv_q8's order for them: per
// super-block of 8 blocks, p_j = xd_j (d_j isum_j), the Tree8 of the eight, acc = acc + inner. Chunk c holds
// blocks 2c, 2c + 1; lane tid takes their elements 8 tid + [0, 8) (mmq_pack_x's q4_K layout, k-slots as Q4K's).
// S gives frag(r, i, j, w): the signed codes of elements 8 tid + 4w + [0, 4) of block j of the lane's row i, and
// d_bits(r, i, j).
template <typename S>
struct Block32Order : S {
  using Raw = typename S::Raw;  // kBytes, Raw and load: S's
  template <int NT8, int T>
  __device__ static void block(const Args& a, const Raw (&r)[T], int64_t b, int g, int tid,
                               float (&acc)[T][NT8][4]) {
    Tree8 tree[T][NT8][4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      uint32_t fa[T][2][4];
      float d[T][2][2];  // tile u, block 2c + h, row i
#pragma unroll
      for (int u = 0; u < T; ++u)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int j = 2 * c + h;
          fa[u][h][0] = S::frag(r[u], 0, j, 0, tid), fa[u][h][1] = S::frag(r[u], 1, j, 0, tid);
          fa[u][h][2] = S::frag(r[u], 0, j, 1, tid), fa[u][h][3] = S::frag(r[u], 1, j, 1, tid);
#pragma unroll
          for (int i = 0; i < 2; ++i) d[u][h][i] = fp16_bits_hw(S::d_bits(r[u], i, j));
        }
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt) {
        const int64_t rec = xrec(a, b, c, nt * 8);
        const uint4 xv = ldx_u4(a.xc + (rec + g) * 64 + 16 * tid);
        const float4 s0 = __ldca(a.xsc + rec + 2 * tid), s1 = __ldca(a.xsc + rec + 2 * tid + 1);
        const float xd[2][2] = {{s0.x, s1.x}, {s0.y, s1.y}};  // block 2c + h, the lane's token column k
#pragma unroll
        for (int u = 0; u < T; ++u) {
          int isum[2][4];
          mma_k32(fa[u][0], xv.x, xv.y, isum[0]);
          mma_k32(fa[u][1], xv.z, xv.w, isum[1]);
#pragma unroll
          for (int e = 0; e < 4; ++e)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const float p = __fmul_rn(xd[h][e & 1], __fmul_rn(d[u][h][e >> 1], static_cast<float>(isum[h][e])));
              tree[u][nt][e].add(2 * c + h, p);
            }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < T; ++u)
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[u][nt][e] = __fadd_rn(acc[u][nt][e], tree[u][nt][e].inner);
  }
};

// q8_0 (the split device form, weight_form.h: 32-code bodies, d apart): code bytes 8 tid + [0, 8) of each block.
struct Q80Src {
  static constexpr int kBytes = 8 * kQ80Body;
  struct Raw {
    uint2 qs[2][8];  // row i, block j: code bytes 8 tid + [0, 8)
    uint4 d[2];      // row i: the 8 blocks' d (fp16)
  };
  __device__ static Raw load(const uint8_t* const (&rowp)[2], int64_t b, int64_t blocks, int tid) {
    Raw r;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) r.qs[i][j] = ldw_u2<true>(rowp[i] + (8 * b + j) * kQ80Body + 8 * tid);
      r.d[i] = ldg_u4(rowp[i] + q80_d_offset(8 * blocks, 8 * b));
    }
    return r;
  }
  __device__ static uint32_t frag(const Raw& r, int i, int j, int w, int /*tid*/) {
    return w == 0 ? r.qs[i][j].x : r.qs[i][j].y;
  }
  __device__ static uint32_t d_bits(const Raw& r, int i, int j) { return half_of(r.d[i], j); }
  // Half j of the 8 fp16 values in v.
  __device__ static uint32_t half_of(const uint4& v, int j) {
    const uint32_t w = j < 2 ? v.x : j < 4 ? v.y : j < 6 ? v.z : v.w;
    return (w >> (16 * (j & 1))) & 0xffffu;
  }
};

// q4_0 (the split device form: 16-byte bodies, d apart): elements 8 tid + [0, 8) of a block are the low nibbles of
// body bytes 8 tid + [0, 8) for tid < 2, the high nibbles of bytes 8 (tid - 2) + [0, 8) above; code - 8.
struct Q40Src {
  static constexpr int kBytes = 8 * kQ40Body;
  struct Raw {
    uint2 qs[2][8];  // row i, block j: body bytes 8 (tid % 2) + [0, 8)
    uint4 d[2];
  };
  __device__ static Raw load(const uint8_t* const (&rowp)[2], int64_t b, int64_t blocks, int tid) {
    Raw r;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) r.qs[i][j] = ldw_u2<true>(rowp[i] + (8 * b + j) * kQ40Body + 8 * (tid & 1));
      r.d[i] = ldg_u4(rowp[i] + q40_d_offset(8 * blocks, 8 * b));
    }
    return r;
  }
  __device__ static uint32_t frag(const Raw& r, int i, int j, int w, int tid) {
    const uint32_t v = ((w == 0 ? r.qs[i][j].x : r.qs[i][j].y) >> (4 * (tid >> 1))) & kLowNibbles;
    return ((v | 0x80808080u) - 0x08080808u) ^ 0x80808080u;  // code - 8 in each byte, no borrow between bytes
  }
  __device__ static uint32_t d_bits(const Raw& r, int i, int j) { return Q80Src::half_of(r.d[i], j); }
};

using Q8S = Block32Order<Q80Src>;
using Q4S = Block32Order<Q40Src>;

// The weights of blocks b0 + k * step (k < D, those below nb) of the T tiles' rows.
template <typename B, int D, int T>
__device__ __forceinline__ void load_blocks(const uint8_t* const (&rowp)[T][2], int64_t b0, int64_t step, int64_t nb,
                                            int tid, typename B::Raw (&raw)[D][T]) {
#pragma unroll
  for (int k = 0; k < D; ++k)
    if (b0 + k * step < nb)
#pragma unroll
      for (int u = 0; u < T; ++u) raw[k][u] = B::load(rowp[u], b0 + k * step, nb, tid);
}

// kMinCtas CTAs a SM (__launch_bounds__): 3 (80 registers, one block in flight a warp), 2 (128 registers;
// two blocks in flight for n <= 8) or 1 (two row tiles a warp). n <= 8 runs at 3 (H100: faster than 2 at
// every count up to 8, 12-40% after mmq_pack_x: more warps a SM, and the 6144-row product fits one wave);
// more tokens need the registers of 2.
// T row tiles a warp (T 16 rows): each token's activation fragments are loaded once for the T tiles.
// PP parts a warp (1, or 2: a.split / 2 warps a tile, warp w summing part w, then part w + split / 2, each in the
// same accumulators: the same canonical order with half the warps, each twice the blocks).
template <typename B, int NT8, int kMinCtas, int T, int PP = 1>
__global__ void __launch_bounds__(kThreads, kMinCtas) mmq_kernel(const Args a) {
  constexpr int V = T * NT8 * 4;
  __shared__ float partial[kWarps][PP * V][32];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, tid = lane & 3;
  int pi = 0;
#pragma unroll
  for (int p = 1; p < kMaxParts; ++p)
    if (p < a.np && blockIdx.x >= a.cta_begin[p]) pi = p;
  const uint8_t* const w = a.w[pi];
  const int rows = a.rows[pi];
  const int ws = a.split / PP;  // warps a tile
  const int64_t wtile = int64_t{blockIdx.x - a.cta_begin[pi]} * (kWarps / ws) + warp / ws;
  const int part = warp % ws;
  const int64_t row0 = wtile * (T * kTileRows);
  const bool active = row0 < rows;
  float acc[T][NT8][4];
  // f(acc[u][nt][e], u, nt, e) for every accumulator; v(u, nt, e) is its index in a slot of `partial`.
  const auto each_acc = [&](auto&& f) {
#pragma unroll
    for (int u = 0; u < T; ++u)
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) f(acc[u][nt][e], u, nt, e);
  };
  const auto v = [](int u, int nt, int e) { return (u * NT8 + nt) * 4 + e; };
  each_acc([](float& x, int, int, int) { x = 0.0f; });
  // Everything above reads only the kernel parameters. With one part a warp, the first round's weight blocks are
  // loaded before the PDL wait (weights are constant during a step), so that they stream in while the kernel
  // before this one drains; the packed activations (coherent loads: launch.cuh) and y only after it.
  const int64_t nb = a.cols / 256;
  const uint8_t* rowp[T][2];
#pragma unroll
  for (int u = 0; u < T; ++u)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t r = row0 + u * kTileRows + g + 8 * i;
      rowp[u][i] = w + (r < rows ? r : rows - 1) * a.rb;
    }
  // Blocks a warp loads before using them (one part a warp): 2 for one n-tile and tile; more need the registers.
  constexpr int kD = NT8 == 1 && T == 1 && kMinCtas == 2 ? 2 : 1;
  const int64_t step = a.split;
  typename B::Raw first[kD][T];
  if constexpr (PP == 1)
    if (active) load_blocks<B, kD, T>(rowp, part, step, nb, tid, first);
  pdl_begin();
  if (active) {
    if constexpr (PP == 1) {
      const auto run = [&](const typename B::Raw (&raw)[kD][T], int64_t b0) {
#pragma unroll
        for (int k = 0; k < kD; ++k) {
          if (b0 + k * step >= nb) break;
          B::template block<NT8, T>(a, raw[k], b0 + k * step, g, tid, acc);
        }
      };
      run(first, part);
      for (int64_t b0 = part + kD * step; b0 < nb; b0 += kD * step) {
        typename B::Raw raw[kD][T];
        load_blocks<B, kD, T>(rowp, b0, step, nb, tid, raw);
        run(raw, b0);
      }
    } else {
      // Part part + h ws: blocks part + h ws + k PP ws. All but the last part go to `partial` as they finish.
#pragma unroll 1  // one copy of the block code (the two parts run it one after the other)
      for (int h = 0; h < PP; ++h) {
        for (int64_t b = part + int64_t{h} * ws; b < nb; b += int64_t{PP} * ws) {
          typename B::Raw raw[T];
#pragma unroll
          for (int u = 0; u < T; ++u) raw[u] = B::load(rowp[u], b, nb, tid);
          B::template block<NT8, T>(a, raw, b, g, tid, acc);
        }
        if (h + 1 < PP)
          each_acc([&](float& x, int u, int nt, int e) {
            partial[warp][h * V + v(u, nt, e)][lane] = x;
            x = 0.0f;
          });
      }
    }
  }
  if (a.split > 1) {
    each_acc([&](float& x, int u, int nt, int e) { partial[warp][(PP - 1) * V + v(u, nt, e)][lane] = x; });
    __syncthreads();
    if (part != 0 || !active) return;
    each_acc([&](float& x, int u, int nt, int e) {
      const int i = v(u, nt, e);
      float s = partial[warp][i][lane];
      // Parts 1 .. split - 1 in order: part h ws + w in warp + w's h-th slot (no division in the loop).
#pragma unroll
      for (int h = 0; h < PP; ++h)
        for (int w = h == 0 ? 1 : 0; w < ws; ++w) s = __fadd_rn(s, partial[warp + w][h * V + i][lane]);
      x = s;
    });
  } else if (!active) {
    return;
  }
  each_acc([&](float x, int u, int nt, int e) {
    const int64_t row = row0 + u * kTileRows + g + 8 * (e >> 1);
    const int t = nt * 8 + 2 * tid + (e & 1);
    if (row < rows && t < a.n) a.y[pi][int64_t{t} * rows + row] = x;
  });
}

// mmq_pack_x: one thread a (block b, chunk c, token t, lane tid) piece of 16 code bytes; tid 0 also writes
// the record's scales. Tokens n..n8 - 1 get zeros (their outputs are never stored).
template <bool kQ6>
__global__ void pack_x_kernel(const int8_t* xq, const float* xd, const int* xs, int n, int n8, int64_t cols,
                              uint4* xc, float4* xsc) {
  pdl_begin();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= cols / 64 * n8 * 4) return;
  const int tid = static_cast<int>(i & 3), t = static_cast<int>((i >> 2) % n8);
  const int64_t bc = (i >> 2) / n8, b = bc >> 2;
  const int c = static_cast<int>(bc & 3);
  uint4 v = make_uint4(0, 0, 0, 0);
  float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (t < n) {
    const int8_t* x = xq + t * cols + b * 256 + 64 * c;
    auto u32 = [](const int8_t* p) { return *reinterpret_cast<const uint32_t*>(p); };
    if constexpr (kQ6) {  // groups 2c, 2c + 1: bytes 4 tid + [0, 4) of each 16-element half
      v = make_uint4(u32(x + 4 * tid), u32(x + 16 + 4 * tid), u32(x + 32 + 4 * tid), u32(x + 48 + 4 * tid));
    } else {  // sub-blocks 2c, 2c + 1: bytes 8 tid + [0, 8) of each
      v = make_uint4(u32(x + 8 * tid), u32(x + 8 * tid + 4), u32(x + 32 + 8 * tid), u32(x + 36 + 8 * tid));
    }
    if (tid == 0) {
      const float* d = xd + t * (cols / 32) + b * 8 + 2 * c;
      const int* q = xs + t * (cols / 16) + b * 16 + 4 * c;
      s = make_float4(d[0], d[1], static_cast<float>(q[0] + q[1]), static_cast<float>(q[2] + q[3]));
    }
  }
  xc[(bc * n8 + t) * 4 + tid] = v;
  if (tid == 0) xsc[bc * n8 + t] = s;
}

int g_variant = 3;  // mmq_set_variant (3: the measured best on an H100)

// Row tiles a warp: one (16 warps an SM at 128 registers), except q4_K products of more than 24 tokens and
// 16K+ rows: two (the tiles share each activation fragment; one CTA an SM of 255 registers). Measured on an
// H100 (bench_cuda_mmq, us at 16 / 23 / 32 tokens, two tiles -> one): q4_K 17408x5120 47.4/56.8/67.3 ->
// 37.0/53.4/69.4, 6144x5120 22.8/28.2/34.0 -> 18.8/24.0/31.1; q6_K 5120x17408 73.2/111.2/129.4 ->
// 73.0/87.6/102.6. Only the launch's shape depends on it: each (row, token) sum is formed the same way
// either way. Variant bit 2 (mmq_set_variant) takes one tile always.
int tiles_a_warp(bool q4, int64_t n, int64_t rows) {
  return q4 && n > 24 && rows >= 16384 && (g_variant & 4) == 0 ? 2 : 1;
}

// One ladder by token count, for one part a warp (PP 1) or two (PP 2: mmq()'s split 8 on q4_K/q5_K, 4 warps a
// tile). Two row tiles a warp (tiles_a_warp) only for q4_K at one part a warp.
template <typename B, int PP>
cudaError_t launch_pp(const Args& a, int tiles, unsigned grid, cudaStream_t stream) {
  constexpr bool kTwoTiles = PP == 1 && (std::is_same_v<B, Q4K<true>> || std::is_same_v<B, Q4K<false>>);
  if (a.n <= 8) {
    if (g_variant & 1) launch_pdl(mmq_kernel<B, 1, 3, 1, PP>, dim3(grid), dim3(kThreads), 0, stream, a);
    else launch_pdl(mmq_kernel<B, 1, 2, 1, PP>, dim3(grid), dim3(kThreads), 0, stream, a);
  } else if (a.n <= 16) {
    launch_pdl(mmq_kernel<B, 2, 2, 1, PP>, dim3(grid), dim3(kThreads), 0, stream, a);
  } else if (a.n <= 24) {
    launch_pdl(mmq_kernel<B, 3, 2, 1, PP>, dim3(grid), dim3(kThreads), 0, stream, a);
  } else if (kTwoTiles && tiles == 2) {
    if constexpr (kTwoTiles) launch_pdl(mmq_kernel<B, 4, 1, 2>, dim3(grid), dim3(kThreads), 0, stream, a);
  } else {
    launch_pdl(mmq_kernel<B, 4, 2, 1, PP>, dim3(grid), dim3(kThreads), 0, stream, a);
  }
  return cudaGetLastError();
}

template <typename B>
cudaError_t launch(const Args& a, int tiles, unsigned grid, cudaStream_t stream) {
  constexpr bool kParts = std::is_same_v<B, Q4K<true>> || std::is_same_v<B, Q4K<false>> ||
                          std::is_same_v<B, Q4K<true, true>> || std::is_same_v<B, Q4K<false, true>>;
  if constexpr (kParts) {
    if (a.pp == 2) return launch_pp<B, 2>(a, tiles, grid, stream);
  }
  return launch_pp<B, 1>(a, tiles, grid, stream);
}

}  // namespace

bool mmq_supported(DType type) {
  const auto id = static_cast<uint32_t>(type);
  return id == qblocks::kQ2_K || id == qblocks::kQ3_K || id == qblocks::kQ4_K || id == qblocks::kQ5_K ||
         id == qblocks::kQ6_K || id == qblocks::kQ8_0 || id == qblocks::kQ4_0;
}

void mmq_set_variant(int v) { g_variant = v; }

int mmq_split(int64_t rows, int64_t cols) {
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows, blocks = cols / 256;
  int s = tiles <= 512 ? 8 : tiles <= 2048 ? 4 : 2;
  while (s > 1 && s > blocks) s /= 2;
  return s;
}

int64_t mmq_x_bytes(int64_t n, int64_t cols) {
  const int64_t n8 = static_cast<int64_t>(align_up(n, 8));
  return n8 * cols + n8 * cols / 4;
}

cudaError_t mmq_pack_x(DType type, const int8_t* xq, const float* xd, const int* xs, int64_t n, int64_t cols,
                       void* xp, cudaStream_t stream) {
  if (!mmq_supported(type) || cols <= 0 || cols % 256 != 0 || n < 1 || n > kMmqMaxTokens || cols > INT64_MAX / 64)
    return cudaErrorInvalidValue;
  if (xq == nullptr || xd == nullptr || xs == nullptr || xp == nullptr) return cudaErrorInvalidValue;
  if (!is_aligned(xq, 16) || !is_aligned(xd, 16) || !is_aligned(xs, 16) || !is_aligned(xp, 16))
    return cudaErrorInvalidValue;
  const int n8 = static_cast<int>(align_up(n, 8));
  const int64_t threads = cols / 64 * n8 * 4, grid = (threads + 255) / 256;
  if (grid > INT_MAX) return cudaErrorInvalidValue;
  auto* xc = static_cast<uint4*>(xp);
  auto* xsc = reinterpret_cast<float4*>(static_cast<uint8_t*>(xp) + n8 * cols);
  const auto tid = static_cast<uint32_t>(type);
  if (tid == qblocks::kQ6_K || tid == qblocks::kQ3_K || tid == qblocks::kQ2_K)
    launch_pdl(pack_x_kernel<true>, dim3(static_cast<unsigned>(grid)), dim3(256), 0, stream, xq, xd, xs,
               static_cast<int>(n), n8, cols, xc, xsc);
  else
    launch_pdl(pack_x_kernel<false>, dim3(static_cast<unsigned>(grid)), dim3(256), 0, stream, xq, xd, xs,
               static_cast<int>(n), n8, cols, xc, xsc);
  return cudaGetLastError();
}

cudaError_t mmq(DType type, const Q8Part* parts, int n_parts, int64_t cols, const void* xp, int64_t n,
                cudaStream_t stream, int split) {
  const auto id = static_cast<uint32_t>(type);
  if (!mmq_supported(type)) return cudaErrorInvalidValue;
  constexpr uintptr_t walign = 16;  // q6_K, q3_K, q2_K, q8_0, q4_0: their device forms (weight_form.h)
  if (parts == nullptr || n_parts < 1 || n_parts > kMaxParts) return cudaErrorInvalidValue;
  if (cols <= 0 || cols % 256 != 0 || n < 1 || n > kMmqMaxTokens || cols > INT64_MAX / 64) return cudaErrorInvalidValue;
  if (split != 0 && split != 1 && split != 2 && split != 4 && split != 8) return cudaErrorInvalidValue;
  if (xp == nullptr || !is_aligned(xp, 16)) return cudaErrorInvalidValue;
  const int64_t rb = device_row_bytes(type, cols);  // weight_form.h
  if (rb <= 0) return cudaErrorInvalidValue;
  int64_t total = 0;
  for (int p = 0; p < n_parts; ++p) {
    const Q8Part& q = parts[p];
    if (q.rows < 0 || q.rows > INT_MAX || q.rows > INT64_MAX / rb) return cudaErrorInvalidValue;
    if (q.rows > 0 && (q.w == nullptr || q.y == nullptr || !is_aligned(q.w, walign) || !is_aligned(q.y, 4)))
      return cudaErrorInvalidValue;
    total += q.rows;
  }
  if (total == 0) return cudaSuccess;
  Args a{};
  a.cols = cols;
  a.rb = rb;
  a.n = static_cast<int>(n);
  a.n8 = static_cast<int>(align_up(n, 8));
  a.xc = static_cast<const uint8_t*>(xp);
  a.xsc = reinterpret_cast<const float4*>(a.xc + a.n8 * cols);
  a.split = split != 0 ? split : mmq_split(total, cols);  // never of n, nor of the tiles a warp
  const int tiles = tiles_a_warp(id == qblocks::kQ4_K, n, total);
  // q4_K and q5_K at split 8 with rows for one gemv_q8 warp a row group (gemv_q8_parts: 8 parts, its 8 lane
  // groups), one row tile a warp: 4 warps a tile summing two parts each, one after the other (the warps and
  // blocks a warp of split 4, two tiles a CTA). The same sums either way; fewer rows keep 8 warps a tile (one
  // tile a CTA: twice the CTAs). H200, q4_K, 16 tokens, us, 8 warps -> 4: 17408x5120 ~51 -> 44.3 (split 4,
  // the 4-part order: 39.9); 4096x4096 (fewer rows) 12.5 -> 15.1.
  const bool k4 = id == qblocks::kQ4_K || id == qblocks::kQ5_K;
  a.pp = a.split == 8 && k4 && tiles == 1 && gemv_auto_split(total) == 1 && (g_variant & 8) == 0 ? 2 : 1;
  const int64_t per_cta = kWarps / (a.split / a.pp);
  int64_t grid = 0;
  for (int p = 0; p < n_parts; ++p) {
    if (parts[p].rows == 0) continue;  // skipped
    const int64_t warp_tiles = (parts[p].rows + tiles * kTileRows - 1) / (tiles * kTileRows);
    a.w[a.np] = static_cast<const uint8_t*>(parts[p].w);
    a.y[a.np] = parts[p].y;
    a.rows[a.np] = static_cast<int>(parts[p].rows);
    a.cta_begin[a.np] = static_cast<unsigned>(grid);
    ++a.np;
    grid += (warp_tiles + per_cta - 1) / per_cta;
    if (grid > INT_MAX) return cudaErrorInvalidValue;
  }
  a.cta_begin[a.np] = static_cast<unsigned>(grid);
  const auto g = static_cast<unsigned>(grid);
  if (id == qblocks::kQ6_K) return launch<Q6K>(a, tiles, g, stream);
  if (id == qblocks::kQ3_K) return launch<Q3K>(a, tiles, g, stream);
  if (id == qblocks::kQ2_K) return launch<Q2K>(a, tiles, g, stream);
  if (id == qblocks::kQ8_0) return launch<Q8S>(a, tiles, g, stream);
  if (id == qblocks::kQ4_0) return launch<Q4S>(a, tiles, g, stream);
  if (id == qblocks::kQ5_K)
    return g_variant & 2 ? launch<Q4K<true, true>>(a, tiles, g, stream) : launch<Q4K<false, true>>(a, tiles, g, stream);
  return g_variant & 2 ? launch<Q4K<true>>(a, tiles, g, stream) : launch<Q4K<false>>(a, tiles, g, stream);
}

}  // namespace dflash::cuda

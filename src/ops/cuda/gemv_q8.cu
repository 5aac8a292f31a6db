// Integer-dot GEMV kernels (gemv_q8.h).
//
// Work split: a CTA of 4 warps; the rows of the launch (a grouped launch lays up to four weights end to
// end) are taken R consecutive rows at a time (a row group, R = 2 or 4 by block type and token count),
// each group by `split` consecutive warps (1, 2 or 4: gemv_q8_split of the launch's rows) that take
// interleaved blocks of it, or, where a row is at most one warp step of blocks (the 384- and 1024-wide rows of
// a small model), shares of the tokens (launch()). A lane loads each token's activation slice of a block once
// for the group's R rows, which divides the activation traffic through L1, the limit of a many-token product,
// by R; R is bounded by the R x NT accumulators a lane keeps in registers. Lanes per weight block and bytes per lane:
//   q4_K, q5_K  4 lanes, 32 bytes of nibbles each (+ q5_K's 32 bytes of high bits), 16-byte loads
//   q6_K        8 lanes, two 16-element groups each (16 bytes of ql, 16 of qh), 16-byte loads (the device form)
//   q8_0        rows of 256-element super-blocks: 8 lanes, a block each (two 16-byte loads); other rows 2 lanes,
//               16 codes each, 16-byte loads (the device form)
//   q4_0        rows of super-blocks as q8_0's: a block a lane, one 16-byte load; other rows 2 lanes, 8 bytes =
//               16 codes each, 8-byte loads (the device form)
//   q3_K        8 lanes, two 16-element groups each (16 bytes of qs, 16 of hmask), 16-byte loads (padded form)
//   q2_K        as q3_K: two 16-element groups a lane, 16 bytes of qs (the device form)
// Each lane accumulates exact int32 sums of code * xq with __dp4a, then applies the block scales in f32:
// sum_i (ds q_i - ms) xd xq_i = xd (ds * sum q_i xq_i - ms * sum xq_i).
//
// A token's outputs are bit for bit the same whatever the kernel (R, the token count): a lane's blocks and their
// order depend only on split and the lane, each block adds the same pinned float expression to the (row, token) sum,
// the lanes are summed in the xor-butterfly order and the split partials in order (gemv_common::store_rows).
// q2_K..q6_K (and q8_0, q4_0 rows of whole 256-element super-blocks) form mmq.h's canonical order instead: a lane
// group (8 lanes a block or super-block; q4_K and q5_K 4) completes each block's term together (exact 32-element
// integer sums, by a shuffle where a lane holds half, then the block's float terms added in a fixed tree by butterfly
// steps), so the group's running sum is one part of (groups a warp) x split, and the parts are folded in order
// (store_rows_parts): mmq with gemv_q8_parts(type, rows) parts reproduces each row bit for bit.
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "base/checked_math.h"
#include "ops/cuda/gemv_q8.h"
#include "ops/cuda/matmul.h"
#include "ops/cuda/gemv_common.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/quant_blocks.cuh"
#include "ops/cuda/quantize_q8.cuh"
#include "ops/cuda/sm_count.h"
#include "ops/cuda/weight_form.h"

namespace dflash::cuda {
namespace {

using gemv_common::kThreads;
using gemv_common::kWarps;
constexpr int kOnes = 0x01010101;

struct Part {
  const uint8_t* w;
  float* y;
  int64_t rows, first;  // first: index of the part's row 0 among all rows of the launch
};

struct Args {
  Part parts[kQ8MaxParts];
  int n_parts;
  int64_t total_rows, cols, rb;
  const int8_t* xq;
  const float* xd;
  const int* xs;  // [n, cols / 16]: sum of the 16 codes of each half block
  int n, split;  // split: 1, 2 or 4 (gemv_q8 checks it)
  int tsplit;    // 1: a row's blocks fit one warp step, and a row group's `split` warps take tokens instead (launch)
};

// Global loads. Weights are read once: the 16-byte weight loads of K4, q6_K and q8_0 skip L1 (ldw_u4:
// L1::no_allocate), so that L1 keeps the activations every row of the SM reads again. q4_0's 8-byte loads (two
// lanes a 16-byte body) and the blocks' 2-byte scales go through L1. The activations, which the kernel before this
// one wrote, are read through coherent loads (__ldca), which ptxas keeps below the PDL wait: the kernel loads its
// first weight blocks before the wait (launch.cuh).
using gemv_common::ldw_u4;
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint16_t*>(p)); }
// acc + the byte dot products of q[0..3] with v's four words; kUnsignedQ: q's bytes unsigned (0..255), v's signed.
template <bool kUnsignedQ = false>
__device__ __forceinline__ int dot4(const int* q, const uint4& v, int acc) {
  const uint32_t x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kUnsignedQ) {
      int d;
      asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(q[i]), "r"(x[i]), "r"(acc));
      acc = d;
    } else {
      acc = __dp4a(q[i], static_cast<int>(x[i]), acc);
    }
  }
  return acc;
}

// K4 decodes its scales by the hardware conversion (qblocks::fp16_bits_hw): qblocks::fp16_to_f32's branches were
// a large share of a q4_K block's instructions at one token. (q6_K and the legacy types keep fp16_to_f32: without
// its branches the compiler hoists their many-token loads further and their kernels spill.)
using qblocks::fp16_bits_hw;

using qblocks::k4_scales_mins;
using qblocks::q3k_codes;
using qblocks::q3k_scale;

// The block types. Each gives, for the lane's share of a block (kLanes lanes a block): Raw (its weight
// bytes as loaded), Codes (decoded once per block and row), Act (one token's activation slice: codes,
// scales, and the integer sums the minimum terms need) and add(), the block's term of one token's dot
// product. add() is the one float expression every kernel adds per block, with its rounding pinned by
// the _rn intrinsics (no contraction left to the compiler), so a token's sum is bit for bit the same
// whichever kernel (rows a warp, tokens a launch) made it; the integer parts are exact in any order.
// The launch shape, measured on an H100 (docs/benchmarks.md): rows_a_warp(NT) (R), kInFlight (blocks of
// a row a lane loads before using them, divided by R), min_ctas(NT, split) (__launch_bounds__), and
// kHoistTokens: the token loop runs all NT tokens, those past n reloading token n - 1 (never stored), so
// that every token's loads can be issued ahead of the arithmetic; worth it where Act is a few registers
// (q6_K, the legacy types), not for K4's 12 (the hoisted loads take the registers of the accumulators).

// q4_K (144 bytes) and q5_K (176 bytes): lane c = lane % 4 of a block holds chunk c, bytes [32c, 32c + 32) of the
// 128 nibble bytes: elements 64c + [0, 32) (low nibbles, sub-block 2c) and 64c + 32 + [0, 32) (high nibbles,
// sub-block 2c + 1); q5_K's fifth bits come from qh[l] bits 2c and 2c + 1 (all 32 qh bytes). A lane decodes its
// chunk's two scales and mins once for 64 elements, and its sub-blocks' integer sums are its own.
template <bool kHigh>
struct K4 {
  static constexpr int kBytes = kHigh ? 176 : 144, kElems = 256, kLanes = 4;
  static constexpr int kInFlight = 2;  // blocks a lane loads before it uses them (over R rows: one a row)
  static constexpr bool kHoistTokens = false;
  static constexpr bool kGroupParts = true;  // each lane group's sum is a part of the canonical order
  static constexpr int rows_a_warp(int nt) { return nt == 8 ? 4 : 2; }
  static constexpr int min_ctas(int nt, int /*split*/) { return nt == 1 ? 5 : 1; }  // one token: 96 registers
  // group_dot's half-full last step as half_tail: q5_K only. H200, one token (docs/benchmarks.md, thirty-seventh
  // session): q5_K 17408x5120 26.7 -> 25.8 us, 10240x5120 16.6 -> 16.2; q4_K 21.0 -> 21.3, 13.3 -> 13.4.
  static constexpr bool kHalfTail = kHigh;
  static constexpr int kOneWaveCtas = 6;  // launch_rows (80 registers: q4_K spills 16 bytes, q5_K 72)
  struct Raw {
    uint4 hdr, qs[2], qh[kHigh ? 2 : 1];
  };
  // The codes of the lane's two sub-blocks (low and high nibbles, with q5_K's fifth bits), scales and mins. q4_K
  // keeps its high nibbles in place (16 x the code, bytes 0..240: one LOP3 a word where a shift would add a
  // second), their sum taken unsigned and divided by 16 (exact) in add().
  struct Codes {
    int lo[8], hi[8];
    float ds0, ms0, ds1, ms1;
  };
  struct Act {
    uint4 lo[2], hi[2];  // codes of the two sub-blocks' 32 elements
    float2 d;            // their scales
    float s0, s1;        // sums of the two sub-blocks' 32 codes (exact: |s| <= 32 * 127)
  };
  __device__ static Raw load(const uint8_t* rowp, int b, int /*blocks*/, int lane) {
    const int c = lane & 3;
    const uint4* blk = reinterpret_cast<const uint4*>(rowp + b * kBytes);
    Raw w;
    w.hdr = ldw_u4(blk);
    if constexpr (kHigh) {
      w.qh[0] = ldw_u4(blk + 1);
      w.qh[1] = ldw_u4(blk + 2);
      w.qs[0] = ldw_u4(blk + 3 + 2 * c);
      w.qs[1] = ldw_u4(blk + 4 + 2 * c);
    } else {
      w.qs[0] = ldw_u4(blk + 1 + 2 * c);
      w.qs[1] = ldw_u4(blk + 2 + 2 * c);
    }
    return w;
  }
  __device__ static Act act(const Args& a, int t, int b, int lane) {
    const int c = lane & 3;
    const int col = b * 256 + 64 * c;
    const uint4* xr = reinterpret_cast<const uint4*>(a.xq + t * a.cols + col);
    // The four 16-code sums of sub-blocks 2c and 2c + 1 (16-byte aligned: cols / 16 is a multiple of 16).
    const int4 sr = __ldca(reinterpret_cast<const int4*>(a.xs + t * (a.cols / 16) + b * 16 + 4 * c));
    Act x;
    x.lo[0] = __ldca(xr), x.lo[1] = __ldca(xr + 1);
    x.hi[0] = __ldca(xr + 2), x.hi[1] = __ldca(xr + 3);
    x.d = __ldca(reinterpret_cast<const float2*>(a.xd + t * (a.cols / 32) + b * 8 + 2 * c));
    x.s0 = static_cast<float>(sr.x + sr.y);
    x.s1 = static_cast<float>(sr.z + sr.w);
    return x;
  }
  __device__ static Codes decode(const Raw& w, int lane) {
    const int c = lane & 3;
    Codes k;
    const float d = fp16_bits_hw(w.hdr.x & 0xffffu), dmin = fp16_bits_hw(w.hdr.x >> 16);
    int sc[2], m[2];
    k4_scales_mins(c, w.hdr.y, w.hdr.z, w.hdr.w, sc, m);
    k.ds0 = __fmul_rn(d, static_cast<float>(sc[0])), k.ms0 = __fmul_rn(dmin, static_cast<float>(m[0]));
    k.ds1 = __fmul_rn(d, static_cast<float>(sc[1])), k.ms1 = __fmul_rn(dmin, static_cast<float>(m[1]));
    const uint32_t v[8] = {w.qs[0].x, w.qs[0].y, w.qs[0].z, w.qs[0].w, w.qs[1].x, w.qs[1].y, w.qs[1].z, w.qs[1].w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      k.lo[i] = static_cast<int>(v[i] & 0x0f0f0f0fu);
      k.hi[i] = static_cast<int>(kHigh ? (v[i] >> 4) & 0x0f0f0f0fu : v[i] & 0xf0f0f0f0u);
      if constexpr (kHigh) {
        const uint4& q = w.qh[i / 4];
        const uint32_t h = i % 4 == 0 ? q.x : i % 4 == 1 ? q.y : i % 4 == 2 ? q.z : q.w;
        k.lo[i] |= static_cast<int>(((h >> (2 * c)) & 0x01010101u) << 4);
        k.hi[i] |= static_cast<int>(((h >> (2 * c + 1)) & 0x01010101u) << 4);
      }
    }
    return k;
  }
  // The block's term T in mmq's order (mmq.h, "the canonical order"): the exact 32-element sums of sub-blocks
  // s = 2c, 2c + 1 (this lane's own), t_s = fma(ds_s, isum_s, -(ms_s xsum_s)), v_c = fma(xd_2c+1, t_2c+1,
  // xd_2c t_2c), T = (v_0 + v_1) + (v_2 + v_3) by two butterfly steps within the 4-lane group (float addition
  // is commutative, so every lane of the group forms the same T), acc = acc + T: every lane of the group ends
  // with the same acc (its part's running sum; 8 parts a warp). term() is T alone (half_tail adds it elsewhere).
  __device__ static void add(float& acc, const Codes& k, const Act& x, int lane) {
    acc = __fadd_rn(acc, term(k, x, lane));
  }
  __device__ static float term(const Codes& k, const Act& x, int lane) {
    const unsigned group = 0xfu << (lane & 28);
    const int sl = dot4(k.lo + 4, x.lo[1], dot4(k.lo, x.lo[0], 0));
    const int sh = kHigh ? dot4(k.hi + 4, x.hi[1], dot4(k.hi, x.hi[0], 0))
                         : dot4<true>(k.hi + 4, x.hi[1], dot4<true>(k.hi, x.hi[0], 0)) >> 4;
    const float t0 = __fmaf_rn(k.ds0, static_cast<float>(sl), -__fmul_rn(k.ms0, x.s0));
    const float t1 = __fmaf_rn(k.ds1, static_cast<float>(sh), -__fmul_rn(k.ms1, x.s1));
    const float v = __fmaf_rn(x.d.y, t1, __fmul_rn(x.d.x, t0));
    const float w = __fadd_rn(v, __shfl_xor_sync(group, v, 1));
    return __fadd_rn(w, __shfl_xor_sync(group, w, 2));
  }
};

// The pairing of the 16-element-group types' canonical tree (below) from the lane's p of groups a and b: the pairs
// with lane ^ 1, their sum, the h halves with lane ^ 4 (inner, the same in every lane of the 8-lane group `group`).
__device__ __forceinline__ float pair_tree(float pa, float pb, unsigned group) {
  pa = __fadd_rn(pa, __shfl_xor_sync(group, pa, 1));
  pb = __fadd_rn(pb, __shfl_xor_sync(group, pb, 1));
  const float v = __fadd_rn(pa, pb);
  return __fadd_rn(v, __shfl_xor_sync(group, v, 4));
}

// The block term of the types with 16-element scales (q6_K, q3_K) in mmq's order, from the lane's two scaled
// integer dots ja, jb of groups a, b (Q6K's lane mapping) and their 32-element halves' xd: the exact J_q of
// each 32-element group q (the lane's group plus its partner's, lane ^ 2; |J| < 2^24, so exact in float too),
// p_q = xd_q J_q; the pairs p_{4h} + p_{4h+1} and p_{4h+2} + p_{4h+3} with lane ^ 1 (float addition commutes, so
// both lanes form the same sums), their sum in the lane, and the two h halves with lane ^ 4: inner = ((p_0 +
// p_1) + (p_2 + p_3)) + ((p_4 + p_5) + (p_6 + p_7)) in every lane of the group; acc = fma(d, inner, acc).
__device__ __forceinline__ void add_q6_order(float& acc, float d, int ja, int jb, float da, float db, int lane) {
  const unsigned group = 0xffu << (lane & 24);
  ja += __shfl_xor_sync(group, ja, 2);
  jb += __shfl_xor_sync(group, jb, 2);
  acc = __fmaf_rn(d, pair_tree(__fmul_rn(da, static_cast<float>(ja)), __fmul_rn(db, static_cast<float>(jb)), group),
                  acc);
}

// One token's activations for q6_K's lane mapping (Q6K, Q3K, Q2K): the codes and 32-element halves' xd of the
// lane's groups a = 8h + 2k0 + t and b = a + 4, and with kSums the sums of each group's 16 codes.
struct GroupAct {
  uint4 qa, qb;
  float da, db;
  int sa, sb;
};
template <bool kSums>
__device__ __forceinline__ GroupAct group_act(const Args& a, int t, int b, int lane) {
  const int u = lane & 7, ga = 8 * (u >> 2) + 2 * (u & 1) + ((u >> 1) & 1), gb = ga + 4;
  const int8_t* xr = a.xq + t * a.cols + b * 256;
  const float* xd = a.xd + t * (a.cols / 32) + b * 8;
  GroupAct x;
  x.qa = __ldca(reinterpret_cast<const uint4*>(xr + 16 * ga));
  x.qb = __ldca(reinterpret_cast<const uint4*>(xr + 16 * gb));
  x.da = __ldca(xd + ga / 2), x.db = __ldca(xd + gb / 2);
  if constexpr (kSums) {
    const int* xs = a.xs + t * (a.cols / 16) + b * 16;
    x.sa = __ldca(xs + ga), x.sb = __ldca(xs + gb);
  } else {
    x.sa = x.sb = 0;
  }
  return x;
}

// q6_K (the device form, weight_form.h: 208 aligned bytes a block, d apart): lane u = lane % 8 of a block
// (h = u / 4, t = u / 2 % 2, k0 = u % 2) holds groups a = 8h + 2k0 + t and b = a + 4 (16-element groups g =
// 8h + 2k + t: elements 16g + [0, 16), low nibbles from ql[64h + 16t + 32(k & 1)], nibble k / 2, bits 4-5
// from bit pair k of qh[32h + 16t], scale int8 scales[g]; code - 32). Both groups read the same 16 ql bytes
// (low and high nibbles) and the same 16 qh bytes, so a lane loads 32 bytes of codes for 32 elements.
struct Q6K {
  static constexpr int kBytes = kQ6Body, kElems = 256, kLanes = 8;
  static constexpr int kInFlight = 2;
  static constexpr bool kHoistTokens = false;  // Act is 12 registers, as K4's
  static constexpr bool kGroupParts = true;    // each lane group's sum is a part of the canonical order
  static constexpr int rows_a_warp(int nt) { return nt == 8 ? 4 : 2; }
  // As K4: one token 7 CTAs where a warp owns its rows (split 1), else 8.
  static constexpr int min_ctas(int nt, int split) { return nt == 1 ? (split == 1 ? 7 : 8) : 1; }
  struct Raw {
    uint4 ql, qh;
    uint2 sc;    // scales[8h .. 8h + 8)
    uint32_t d;  // fp16
  };
  struct Codes {
    int qa[4], qb[4];
    int sa, sb;  // the groups' int8 scales
    float d;     // the block's scale
  };
  struct Act {
    uint4 qa, qb;
    float da, db;    // xd of the groups' 32-element halves (q = g / 2)
    int sa32, sb32;  // 32 * the sum of each group's 16 codes (the codes' -32 offset)
  };
  __device__ static Raw load(const uint8_t* rowp, int b, int blocks, int lane) {
    const int u = lane & 7, h = u >> 2, t = (u >> 1) & 1, k0 = u & 1;
    const uint8_t* blk = rowp + b * kBytes;
    Raw w;
    w.ql = ldw_u4(blk + 64 * h + 16 * t + 32 * k0);
    w.qh = ldw_u4(blk + 128 + 32 * h + 16 * t);
    w.sc = __ldg(reinterpret_cast<const uint2*>(blk + 192 + 8 * h));
    w.d = ld_u16(rowp + q6k_d_offset(blocks, b));
    return w;
  }
  __device__ static Act act(const Args& a, int t, int b, int lane) {
    const GroupAct g = group_act<true>(a, t, b, lane);
    return Act{g.qa, g.qb, g.da, g.db, 32 * g.sa, 32 * g.sb};
  }
  __device__ static Codes decode(const Raw& w, int lane) {
    const int u = lane & 7, t = (u >> 1) & 1, k0 = u & 1;
    Codes c;
    c.sa = static_cast<int8_t>(w.sc.x >> (8 * (2 * k0 + t)));  // scale 8h + 2k0 + t: byte 2k0 + t of the 8
    c.sb = static_cast<int8_t>(w.sc.y >> (8 * (2 * k0 + t)));  // and 4 past it
    c.d = qblocks::fp16_to_f32(w.d);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t ql = i == 0 ? w.ql.x : i == 1 ? w.ql.y : i == 2 ? w.ql.z : w.ql.w;
      const uint32_t qh = i == 0 ? w.qh.x : i == 1 ? w.qh.y : i == 2 ? w.qh.z : w.qh.w;
      c.qa[i] = static_cast<int>((ql & 0x0f0f0f0fu) | (((qh >> (2 * k0)) & 0x03030303u) << 4));
      c.qb[i] = static_cast<int>(((ql >> 4) & 0x0f0f0f0fu) | (((qh >> (2 * k0 + 4)) & 0x03030303u) << 4));
    }
    return c;
  }
  // The block's term in mmq's order (mmq.h, "the canonical order"): add_q6_order of J = sc (isum - 32 xsum).
  __device__ static void add(float& acc, const Codes& c, const Act& x, int lane) {
    add_q6_order(acc, c.d, c.sa * (dot4(c.qa, x.qa, 0) - x.sa32), c.sb * (dot4(c.qb, x.qb, 0) - x.sb32), x.da, x.db,
                 lane);
  }
};

// q3_K (the padded device form, weight_form.h: 112-byte aligned blocks) in q6_K's lane mapping and canonical
// order: lane u = lane % 8 of a block (h = u / 4, t = u / 2 % 2, k0 = u % 2) holds the 16-element groups a =
// 8h + 2k0 + t and b = a + 4 (group g = 8h + 2k + t: elements 128h + 32k + 16t + [0, 16), bits 2k of qs[32h +
// 16t + l], the high bit: bit 4h + k of hmask[16t + l], code = q - 4 where it is clear; 6-bit scale g, minus
// 32). Both groups read the same 16 qs and 16 hmask bytes; the codes are formed signed in place (q | 0xfc where
// the bit is clear), so no activation sums are needed; the scales and d are one 16-byte word at byte 96.
struct Q3K {
  static constexpr int kBytes = kQ3Stride, kElems = 256, kLanes = 8;
  static constexpr int kInFlight = 2;
  static constexpr bool kHoistTokens = false;
  static constexpr bool kGroupParts = true;  // each lane group's sum is a part of the canonical order
  static constexpr int rows_a_warp(int nt) { return nt == 8 ? 4 : 2; }
  static constexpr int min_ctas(int nt, int /*split*/) { return nt == 1 ? 7 : 1; }  // 8 spills
  struct Raw {
    uint4 qs, hm;
    uint4 hdr;  // scales[12], d, two zero bytes
  };
  struct Codes {
    int qa[4], qb[4];
    int sa, sb;  // the groups' scales (-32..31)
    float d;
  };
  using Act = GroupAct;  // without the sums
  __device__ static Raw load(const uint8_t* rowp, int b, int /*blocks*/, int lane) {
    const int u = lane & 7, h = u >> 2, t = (u >> 1) & 1;
    const uint8_t* blk = rowp + b * kBytes;
    Raw w;
    w.qs = ldw_u4(blk + 32 + 32 * h + 16 * t);
    w.hm = ldw_u4(blk + 16 * t);
    w.hdr = ldw_u4(blk + 96);
    return w;
  }
  __device__ static Act act(const Args& a, int t, int b, int lane) { return group_act<false>(a, t, b, lane); }
  __device__ static Codes decode(const Raw& w, int lane) {
    const int u = lane & 7, h = u >> 2, t = (u >> 1) & 1, k0 = u & 1;
    Codes c;
    c.d = qblocks::fp16_to_f32(w.hdr.w & 0xffffu);
    c.sa = q3k_scale(w.hdr, h, k0, t);
    c.sb = q3k_scale(w.hdr, h, k0 + 2, t);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t qs = i == 0 ? w.qs.x : i == 1 ? w.qs.y : i == 2 ? w.qs.z : w.qs.w;
      const uint32_t nh = ~(i == 0 ? w.hm.x : i == 1 ? w.hm.y : i == 2 ? w.hm.z : w.hm.w);
      c.qa[i] = q3k_codes(qs, nh, h, k0);
      c.qb[i] = q3k_codes(qs, nh, h, k0 + 2);
    }
    return c;
  }
  __device__ static void add(float& acc, const Codes& c, const Act& x, int lane) {
    add_q6_order(acc, c.d, c.sa * dot4(c.qa, x.qa, 0), c.sb * dot4(c.qb, x.qb, 0), x.da, x.db, lane);
  }
};

// q2_K (the split device form, weight_form.h: 80-byte aligned bodies (scales[16], qs[64]), each block's (d, dmin)
// apart) in q6_K's lane mapping: lane u = lane % 8 of a block (h = u / 4, t = u / 2 % 2, k0 = u % 2) holds the
// 16-element groups a = 8h + 2k0 + t and b = a + 4 (group g = 8h + 2k + t: bits 2k of qs[32h + 16t + l], scale
// byte g: d (sc & 15) and dmin (sc >> 4), rounded as the CPU codec's dl, ml); both read the same 16 qs bytes.
// The canonical order (mmq.h): t_g = fma(dl_g, isum_g, -(ml_g xsum_g)) (xsum_g the exact sum of the group's
// activation codes), p_q = xd_q (t_2q + t_2q+1) with the partner lane (lane ^ 2: the other half of group q), the
// pairs and halves as add_q6_order, acc = acc + inner.
struct Q2K {
  static constexpr int kBytes = kQ2Body, kElems = 256, kLanes = 8;
  static constexpr int kInFlight = 2;
  static constexpr bool kHoistTokens = false;
  static constexpr bool kGroupParts = true;  // each lane group's sum is a part of the canonical order
  static constexpr int rows_a_warp(int nt) { return nt == 8 ? 4 : 2; }
  static constexpr int min_ctas(int nt, int /*split*/) { return nt == 1 ? 7 : 1; }
  struct Raw {
    uint4 qs;
    uint4 sc;     // the block's 16 scale bytes
    uint32_t dm;  // d, dmin (fp16, d low)
  };
  struct Codes {
    int qa[4], qb[4];  // codes 0..3
    float dla, mla, dlb, mlb;
  };
  struct Act {
    uint4 qa, qb;
    float da, db;  // xd of the groups' 32-element halves
    float sa, sb;  // the sums of each group's 16 codes (exact)
  };
  __device__ static Raw load(const uint8_t* rowp, int b, int blocks, int lane) {
    const int u = lane & 7, h = u >> 2, t = (u >> 1) & 1;
    const uint8_t* blk = rowp + b * kBytes;
    Raw w;
    w.qs = ldw_u4(blk + 16 + 32 * h + 16 * t);
    w.sc = ldw_u4(blk);
    w.dm = __ldg(reinterpret_cast<const uint32_t*>(rowp + q2k_dm_offset(blocks, b)));
    return w;
  }
  __device__ static Act act(const Args& a, int t, int b, int lane) {
    const GroupAct g = group_act<true>(a, t, b, lane);
    return Act{g.qa, g.qb, g.da, g.db, static_cast<float>(g.sa), static_cast<float>(g.sb)};
  }
  __device__ static Codes decode(const Raw& w, int lane) {
    const int u = lane & 7, h = u >> 2, t = (u >> 1) & 1, k0 = u & 1;
    Codes c;
    const float d = qblocks::fp16_to_f32(w.dm & 0xffffu), dmin = qblocks::fp16_to_f32(w.dm >> 16);
    // Scale bytes a = 8h + 2k0 + t and b = a + 4: byte 2k0 + t of word 2h and of word 2h + 1.
    const int sh = 8 * (2 * k0 + t);
    const uint32_t sca = ((h == 0 ? w.sc.x : w.sc.z) >> sh) & 0xffu, scb = ((h == 0 ? w.sc.y : w.sc.w) >> sh) & 0xffu;
    c.dla = __fmul_rn(d, static_cast<float>(sca & 0x0fu)), c.mla = __fmul_rn(dmin, static_cast<float>(sca >> 4));
    c.dlb = __fmul_rn(d, static_cast<float>(scb & 0x0fu)), c.mlb = __fmul_rn(dmin, static_cast<float>(scb >> 4));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t qs = i == 0 ? w.qs.x : i == 1 ? w.qs.y : i == 2 ? w.qs.z : w.qs.w;
      c.qa[i] = static_cast<int>((qs >> (2 * k0)) & 0x03030303u);
      c.qb[i] = static_cast<int>((qs >> (2 * k0 + 4)) & 0x03030303u);
    }
    return c;
  }
  __device__ static void add(float& acc, const Codes& c, const Act& x, int lane) {
    const unsigned group = 0xffu << (lane & 24);
    float ta = __fmaf_rn(c.dla, static_cast<float>(dot4(c.qa, x.qa, 0)), -__fmul_rn(c.mla, x.sa));
    float tb = __fmaf_rn(c.dlb, static_cast<float>(dot4(c.qb, x.qb, 0)), -__fmul_rn(c.mlb, x.sb));
    ta = __fadd_rn(ta, __shfl_xor_sync(group, ta, 2));
    tb = __fadd_rn(tb, __shfl_xor_sync(group, tb, 2));
    acc = __fadd_rn(acc, pair_tree(__fmul_rn(x.da, ta), __fmul_rn(x.db, tb), group));
  }
};

// The launch shape of the 32-element types (q4_0, q8_0): four blocks in flight, every token's activation loads
// hoisted (a few registers each), lanes summed in the butterfly order; 4 rows a warp from two tokens.
struct Block32Shape {
  static constexpr int kInFlight = 2;
  static constexpr bool kHoistTokens = true;
  static constexpr bool kGroupParts = false;
  static constexpr int rows_a_warp(int nt) { return nt == 1 ? 2 : 4; }
  static constexpr int min_ctas(int nt, int /*split*/) { return nt == 1 ? 8 : 1; }
};

// q4_0 (the device form, weight_form.h: 16 aligned code bytes a block, d apart): 2 lanes per block, lane h
// bytes [8h, 8h + 8) of qs = elements 8h + [0, 8) (low nibbles) and 16 + 8h + [0, 8) (high), code - 8.
struct Q40 : Block32Shape {
  static constexpr int kBytes = kQ40Body, kElems = 32, kLanes = 2;
  struct Raw {
    uint2 q;     // 8 bytes of nibbles
    uint32_t d;  // fp16
  };
  struct Codes {
    int lo[2], hi[2];
    float d;
  };
  struct Act {
    uint2 lo, hi;
    int m8;  // 8 * the sum of the lane's 16 codes (the codes' -8 offset)
    float d;
  };
  __device__ static Raw load(const uint8_t* rowp, int b, int blocks, int lane) {
    Raw w;
    w.q = __ldg(reinterpret_cast<const uint2*>(rowp + b * kBytes + 8 * (lane & 1)));
    w.d = ld_u16(rowp + q40_d_offset(blocks, b));
    return w;
  }
  __device__ static Act act(const Args& a, int t, int b, int lane) {
    const int8_t* xr = a.xq + t * a.cols + b * 32 + 8 * (lane & 1);
    Act x;
    x.lo = __ldca(reinterpret_cast<const uint2*>(xr));
    x.hi = __ldca(reinterpret_cast<const uint2*>(xr + 16));
    const int s = __dp4a(static_cast<int>(x.hi.y), kOnes,
                         __dp4a(static_cast<int>(x.hi.x), kOnes,
                                __dp4a(static_cast<int>(x.lo.y), kOnes, __dp4a(static_cast<int>(x.lo.x), kOnes, 0))));
    x.m8 = 8 * s;
    x.d = __ldca(a.xd + t * (a.cols / 32) + b);
    return x;
  }
  __device__ static Codes decode(const Raw& w, int /*lane*/) {
    Codes c;
    c.d = qblocks::fp16_to_f32(w.d);
    c.lo[0] = static_cast<int>(w.q.x & 0x0f0f0f0fu), c.lo[1] = static_cast<int>(w.q.y & 0x0f0f0f0fu);
    c.hi[0] = static_cast<int>((w.q.x >> 4) & 0x0f0f0f0fu), c.hi[1] = static_cast<int>((w.q.y >> 4) & 0x0f0f0f0fu);
    return c;
  }
  __device__ static void add(float& acc, const Codes& c, const Act& x, int /*lane*/) {
    int s = __dp4a(c.lo[0], static_cast<int>(x.lo.x), __dp4a(c.lo[1], static_cast<int>(x.lo.y), 0));
    s = __dp4a(c.hi[0], static_cast<int>(x.hi.x), __dp4a(c.hi[1], static_cast<int>(x.hi.y), s)) - x.m8;
    acc = __fmaf_rn(x.d, __fmul_rn(c.d, static_cast<float>(s)), acc);
  }
};

// q8_0 (the device form, weight_form.h: 32 aligned code bytes a block, d apart): 2 lanes per block, lane h
// codes [16h, 16h + 16), one 16-byte load (skipping L1, as K4's).
struct Q80 : Block32Shape {
  static constexpr int kBytes = kQ80Body, kElems = 32, kLanes = 2;
  struct Raw {
    uint4 q;
    uint32_t d;  // fp16
  };
  struct Codes {
    int q[4];
    float d;
  };
  struct Act {
    uint4 x;
    float d;
  };
  __device__ static Raw load(const uint8_t* rowp, int b, int blocks, int lane) {
    Raw w;
    w.q = ldw_u4(rowp + b * kBytes + 16 * (lane & 1));
    w.d = ld_u16(rowp + q80_d_offset(blocks, b));
    return w;
  }
  __device__ static Act act(const Args& a, int t, int b, int lane) {
    Act x;
    x.x = __ldca(reinterpret_cast<const uint4*>(a.xq + t * a.cols + b * 32 + 16 * (lane & 1)));
    x.d = __ldca(a.xd + t * (a.cols / 32) + b);
    return x;
  }
  __device__ static Codes decode(const Raw& w, int /*lane*/) {
    Codes c;
    c.d = qblocks::fp16_to_f32(w.d);
    c.q[0] = static_cast<int>(w.q.x), c.q[1] = static_cast<int>(w.q.y);
    c.q[2] = static_cast<int>(w.q.z), c.q[3] = static_cast<int>(w.q.w);
    return c;
  }
  __device__ static void add(float& acc, const Codes& c, const Act& x, int /*lane*/) {
    acc = __fmaf_rn(x.d, __fmul_rn(c.d, static_cast<float>(dot4(c.q, x.x, 0))), acc);
  }
};

// The canonical order of the 32-element types' super-blocks (q8_0, q4_0): the block term p_u = xd_u (d_u isum_u)
// of the lane (u = lane % 8), then ((p_0 + p_1) + (p_2 + p_3)) + ((p_4 + p_5) + (p_6 + p_7)) by three butterfly
// steps within the 8-lane group (float addition commutes, so every lane forms the same sums), acc = acc + that.
__device__ __forceinline__ void add_super_block(float& acc, float xd, float d, int isum, int lane) {
  const unsigned group = 0xffu << (lane & 24);
  float v = __fmul_rn(xd, __fmul_rn(d, static_cast<float>(isum)));
  v = __fadd_rn(v, __shfl_xor_sync(group, v, 1));
  v = __fadd_rn(v, __shfl_xor_sync(group, v, 2));
  v = __fadd_rn(v, __shfl_xor_sync(group, v, 4));
  acc = __fadd_rn(acc, v);
}

// q8_0 rows of whole 256-element super-blocks (the device form, weight_form.h) in mmq's canonical order: lane u =
// lane % 8 of a super-block of 8 blocks takes block u (its 32 codes: two 16-byte loads; its d from the row's d
// array); the block's term p_u = xd_u (d_u isum_u) (isum exact), the super-block's inner = ((p_0 + p_1) + (p_2 +
// p_3)) + ((p_4 + p_5) + (p_6 + p_7)) by three butterfly steps within the 8-lane group (float addition commutes,
// so every lane forms the same sums), acc = acc + inner. Rows of other lengths take Q80.
struct Q80S {
  static constexpr int kElems = 256, kLanes = 8;
  static constexpr int kInFlight = 2;
  static constexpr bool kHoistTokens = false;
  static constexpr bool kGroupParts = true;  // each lane group's sum is a part of the canonical order
  static constexpr int rows_a_warp(int nt) { return nt == 8 ? 4 : 2; }
  static constexpr int min_ctas(int nt, int split) { return nt == 1 ? (split == 1 ? 7 : 8) : 1; }
  struct Raw {
    uint4 q0, q1;
    uint32_t d;  // fp16
  };
  struct Codes {
    int lo[4], hi[4];  // codes 0-15, 16-31
    float d;
  };
  struct Act {
    uint4 x0, x1;
    float d;
  };
  __device__ static Raw load(const uint8_t* rowp, int b, int blocks, int lane) {
    const int blk = 8 * b + (lane & 7);
    Raw w;
    w.q0 = ldw_u4(rowp + blk * kQ80Body);
    w.q1 = ldw_u4(rowp + blk * kQ80Body + 16);
    w.d = ld_u16(rowp + q80_d_offset(8 * blocks, blk));
    return w;
  }
  __device__ static Act act(const Args& a, int t, int b, int lane) {
    const int blk = 8 * b + (lane & 7);
    const auto* xr = reinterpret_cast<const uint4*>(a.xq + t * a.cols + blk * 32);
    Act x;
    x.x0 = __ldca(xr);
    x.x1 = __ldca(xr + 1);
    x.d = __ldca(a.xd + t * (a.cols / 32) + blk);
    return x;
  }
  __device__ static Codes decode(const Raw& w, int /*lane*/) {
    Codes c;
    c.d = qblocks::fp16_to_f32(w.d);
    const uint32_t v[8] = {w.q0.x, w.q0.y, w.q0.z, w.q0.w, w.q1.x, w.q1.y, w.q1.z, w.q1.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) c.lo[i] = static_cast<int>(v[i]), c.hi[i] = static_cast<int>(v[4 + i]);
    return c;
  }
  __device__ static void add(float& acc, const Codes& c, const Act& x, int lane) {
    add_super_block(acc, x.d, c.d, dot4(c.hi, x.x1, dot4(c.lo, x.x0, 0)), lane);
  }
};

// q4_0 rows of whole 256-element super-blocks in Q80S's order: lane u = lane % 8 takes block 8 sb + u (its 16
// code bytes: one 16-byte load; low nibbles elements 0-15, high ones 16-31; code - 8, the offset taken off with
// the activations' half-block sums, so isum is exact), then as Q80S. Rows of other lengths take Q40.
struct Q40S {
  static constexpr int kElems = 256, kLanes = 8;
  static constexpr int kInFlight = 2;
  static constexpr bool kHoistTokens = false;
  static constexpr bool kGroupParts = true;
  static constexpr int rows_a_warp(int nt) { return nt == 8 ? 4 : 2; }
  static constexpr int min_ctas(int nt, int split) { return nt == 1 ? (split == 1 ? 7 : 8) : 1; }
  struct Raw {
    uint4 q;
    uint32_t d;  // fp16
  };
  struct Codes {
    int lo[4], hi[4];
    float d;
  };
  struct Act {
    uint4 x0, x1;  // elements 0-15, 16-31
    int m8;        // 8 * the sum of the block's 32 codes
    float d;
  };
  __device__ static Raw load(const uint8_t* rowp, int b, int blocks, int lane) {
    const int blk = 8 * b + (lane & 7);
    Raw w;
    w.q = ldw_u4(rowp + blk * kQ40Body);
    w.d = ld_u16(rowp + q40_d_offset(8 * blocks, blk));
    return w;
  }
  __device__ static Act act(const Args& a, int t, int b, int lane) {
    const int blk = 8 * b + (lane & 7);
    const auto* xr = reinterpret_cast<const uint4*>(a.xq + t * a.cols + blk * 32);
    const int2 xs = __ldca(reinterpret_cast<const int2*>(a.xs + t * (a.cols / 16) + 2 * blk));
    Act x;
    x.x0 = __ldca(xr);
    x.x1 = __ldca(xr + 1);
    x.m8 = 8 * (xs.x + xs.y);
    x.d = __ldca(a.xd + t * (a.cols / 32) + blk);
    return x;
  }
  __device__ static Codes decode(const Raw& w, int /*lane*/) {
    Codes c;
    c.d = qblocks::fp16_to_f32(w.d);
    const uint32_t v[4] = {w.q.x, w.q.y, w.q.z, w.q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      c.lo[i] = static_cast<int>(v[i] & 0x0f0f0f0fu);
      c.hi[i] = static_cast<int>((v[i] >> 4) & 0x0f0f0f0fu);
    }
    return c;
  }
  __device__ static void add(float& acc, const Codes& c, const Act& x, int lane) {
    add_super_block(acc, x.d, c.d, dot4(c.hi, x.x1, dot4(c.lo, x.x0, 0)) - x.m8, lane);
  }
};

// Whether block type B may end group_dot with half_tail (its kHalfTail; false where it has none).
template <typename B>
constexpr bool has_half_tail() {
  if constexpr (requires { B::kHalfTail; }) return B::kHalfTail;
  return false;
}

// group_dot's last warp step where it would be half full (half_tail_applies): blocks b_first + [0, 4) of two rows,
// row 0's in lane groups 0-3 and row 1's in groups 4-7, which pass their terms to groups 0-3 (lane - 16), the
// holders of those blocks' parts. Each part's running sum adds the same terms in the same order as a full-width
// step would, so the bits are the same.
template <typename B, int NT>
__device__ __forceinline__ void half_tail(const Args& a, const uint8_t* const (&rowp)[2], int b_first, int blocks,
                                          int t0, int n, int lane, float (&acc)[2][NT]) {
  const int b = b_first + ((lane / B::kLanes) & 3);
  const typename B::Raw w = B::load(lane < 16 ? rowp[0] : rowp[1], b, blocks, lane);
  const typename B::Act x0 = B::act(a, t0, b, lane);
  const typename B::Codes c = B::decode(w, lane);
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    if (t >= n) break;
    const float v = B::term(c, t == 0 ? x0 : B::act(a, t0 + t, b, lane), lane);
    const float v1 = __shfl_down_sync(0xffffffffu, v, 16);  // row 1's term
    if (lane < 16) {
      acc[0][t] = __fadd_rn(acc[0][t], v);
      acc[1][t] = __fadd_rn(acc[1][t], v1);
    }
  }
}

// Whether group_dot ends with half_tail: 4-lane blocks (8 a warp step; q5_K, B::kHalfTail), two rows a warp, split
// 1, and a last step of 4 blocks (blocks % 8 == 4: the 5120-wide rows of Qwen3.5-27B, 20 blocks = 8 + 8 + 4), where
// lane groups 4-7 would idle while 0-3 take both rows.
template <typename B, int R>
__device__ __forceinline__ bool half_tail_applies(int split, int blocks) {
  if constexpr (has_half_tail<B>() && R == 2) return split == 1 && blocks % 8 == 4;
  return false;
}

// The blocks of each row in flight a lane (group_dot's round).
template <typename B, int R>
constexpr int round_blocks() {
  return B::kInFlight > R ? B::kInFlight / R : 1;
}

// A lane's walk over a row's blocks: its first block (part `part` of the row's warp steps), the step between its
// blocks (a warp step times split) and the end of the full-width steps (the rest, where half_tail_applies, go
// through half_tail). The kernel's first round and group_dot's rounds both follow it.
struct BlockWalk {
  int b0, step, end;
};
template <typename B, int R>
__device__ __forceinline__ BlockWalk block_walk(const Args& a, int part, int split, int lane) {
  constexpr int kPerStep = 32 / B::kLanes;
  const int blocks = static_cast<int>(a.cols / B::kElems);
  return {part * kPerStep + lane / B::kLanes, split * kPerStep,
          half_tail_applies<B, R>(split, blocks) ? blocks - kPerStep / 2 : blocks};
}

// The weights of one round of group_dot: blocks b0 + k * step (k < U, those below end) of each row.
template <typename B, int R, int U>
__device__ __forceinline__ void load_round(const Args& a, const uint8_t* const (&rowp)[R], int b0, int step, int end,
                                           int lane, typename B::Raw (&w)[U][R]) {
  const int blocks = static_cast<int>(a.cols / B::kElems);
#pragma unroll
  for (int k = 0; k < U; ++k) {
    const int b = b0 + k * step;
    if (b < end)
#pragma unroll
      for (int j = 0; j < R; ++j) w[k][j] = B::load(rowp[j], b, blocks, lane);
  }
}

// One round of group_dot over the weights load_round loaded: token 0's activation slices of the round's blocks
// are loaded first (one memory round trip for all of them), the other tokens' in the dot loop.
template <typename B, int R, int NT, int U>
__device__ __forceinline__ void dot_round(const Args& a, const typename B::Raw (&w)[U][R], int b0, int step, int end,
                                          int t0, int n, int lane, float (&acc)[R][NT]) {
  typename B::Act x0[U];
#pragma unroll
  for (int k = 0; k < U; ++k)
    if (b0 + k * step < end) x0[k] = B::act(a, t0, b0 + k * step, lane);
#pragma unroll
  for (int k = 0; k < U; ++k) {
    const int b = b0 + k * step;
    if (b >= end) break;
    typename B::Codes c[R];
#pragma unroll
    for (int j = 0; j < R; ++j) {
      c[j] = B::decode(w[k][j], lane);
      B::add(acc[j][0], c[j], x0[k], lane);
    }
#pragma unroll
    for (int t = 1; t < NT; ++t) {
      int tl = t;
      if constexpr (B::kHoistTokens) tl = t < n ? t : n - 1;
      else if (t >= n) break;
      const typename B::Act x = B::act(a, t0 + tl, b, lane);
#pragma unroll
      for (int j = 0; j < R; ++j) B::add(acc[j][t], c[j], x, lane);
    }
  }
}

// acc[j][t] += the dot product of row rowp[j] with token t0 + t (t < n) over this lane's blocks: blocks
// (part * P + lane / kLanes) + i * split * P (P = 32 / kLanes blocks a warp step; block_walk), in increasing order,
// whatever R and NT, so every (row, token) sum is formed in the same order by every kernel. Each block's
// activation slice of a token is loaded once for the R rows. The first round's weights w0 come loaded
// (load_round at wk.b0: the kernel loads them before its PDL wait). Where half_tail_applies, the last (half-full)
// step's blocks go through half_tail, in the same order.
template <typename B, int R, int NT>
__device__ __forceinline__ void group_dot(const Args& a, const uint8_t* const (&rowp)[R], const BlockWalk& wk, int t0,
                                          int n, int lane, const typename B::Raw (&w0)[round_blocks<B, R>()][R],
                                          float (&acc)[R][NT]) {
  constexpr int U = round_blocks<B, R>();
  dot_round<B, R, NT, U>(a, w0, wk.b0, wk.step, wk.end, t0, n, lane, acc);
  for (int b0 = wk.b0 + U * wk.step; b0 < wk.end; b0 += U * wk.step) {
    typename B::Raw w[U][R];
    load_round<B, R, U>(a, rowp, b0, wk.step, wk.end, lane, w);
    dot_round<B, R, NT, U>(a, w, b0, wk.step, wk.end, t0, n, lane, acc);
  }
  if constexpr (has_half_tail<B>() && R == 2) {
    const int blocks = static_cast<int>(a.cols / B::kElems);
    if (wk.end < blocks) half_tail<B, NT>(a, rowp, wk.end, blocks, t0, n, lane, acc);
  }
}

// The row epilogue of the kGroupParts types: lane group g (G groups of 32 / G lanes a warp) of the warp taking
// part `part` of a row group holds the running sum of canonical part G part + g (every lane of the group the
// same value), and a row's output is the left fold of its G x split parts in order (mmq.h). Every thread of
// the CTA must call it.
template <int G, int R, int NT>
__device__ __forceinline__ void store_rows_parts(float (&acc)[R][NT], float (&parts)[kWarps][G][R * NT], int warp,
                                                 int lane, int part, int split, int n, float* const (&y)[R],
                                                 const int64_t (&rows)[R], const int64_t (&r)[R]) {
  constexpr int V = R * NT, kGroupLanes = 32 / G;
  static_assert(V <= 32, "a lane a (row, token) value");
  if (lane % kGroupLanes == 0)
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
      for (int t = 0; t < NT; ++t) parts[warp][lane / kGroupLanes][j * NT + t] = acc[j][t];
  if (split == 1) __syncwarp();
  else __syncthreads();
  if (part != 0 || lane >= V) return;
  const int t = lane % NT;
  if (t >= n) return;
  float* p = nullptr;  // selects over all R (indexing y by lane / NT would move it to local memory)
#pragma unroll
  for (int j = 0; j < R; ++j) {
    float* const q = y[j] != nullptr ? y[j] + t * rows[j] + r[j] : nullptr;
    p = lane / NT == j ? q : p;
  }
  if (p == nullptr) return;
  // Part w G + g in order (the loop over g unrolled: where split is 1, the whole fold).
  float sum = parts[warp][0][lane];
#pragma unroll
  for (int g = 1; g < G; ++g) sum = __fadd_rn(sum, parts[warp][g][lane]);
  for (int w = 1; w < split; ++w)
#pragma unroll
    for (int g = 0; g < G; ++g) sum = __fadd_rn(sum, parts[warp + w][g][lane]);
  *p = sum;
}

// NT tokens, R consecutive rows of the launch a row group, each group owned by `split` warps (with a.tsplit, warp
// `part` of the group takes tokens [part NT, part NT + NT) of its rows, all their blocks). A group may straddle
// two parts of the launch; its rows past the last read the last row and are not stored.
// At least kCtas = B::min_ctas(NT, split) CTAs a SM (split: 1, or more for any split > 1; only the launch
// bounds depend on it). One token: 8 (32 warps), which caps registers at 64 (from 72: 7
// CTAs), measured 3-8% faster for q4_K/q6_K on an H100 in their old order; the canonical order's shuffles
// want the 72 where a warp owns its rows (K4::min_ctas). More tokens mostly keep the unbounded allocation:
// their accumulators spill under a cap (n = 16 ran 1.5x slower under 64). docs/benchmarks.md.
template <typename B, int R, int NT, int kCtas>
__global__ void __launch_bounds__(kThreads, kCtas) gemv_q8_kernel(const Args a) {
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int lg = __ffs(a.split) - 1;  // split is 1, 2 or 4: shifts where a division took ~40 instructions
  const int64_t group = int64_t{blockIdx.x} * (kWarps >> lg) + (warp >> lg);
  // The warp's share of the row group: blocks part, part + split, ... of each row's warp steps, or (a.tsplit) a
  // row's blocks (all in one warp step, so this is the order a `split`-warp launch sums them in) for NT tokens.
  int part = warp & (a.split - 1), split = a.split, t0 = 0, n = a.n;
  if (a.tsplit) {
    t0 = part * NT;
    n = a.n - t0 < NT ? a.n - t0 : NT;
    part = 0, split = 1;
  }
  const uint8_t* rowp[R];
  float* y[R];
  int64_t rows[R], r[R];
  int p = 0;
#pragma unroll
  for (int j = 0; j < R; ++j) {
    const int64_t grow = group * R + j;
    const int64_t g = grow < a.total_rows ? grow : a.total_rows - 1;
    while (p + 1 < a.n_parts && g >= a.parts[p + 1].first) ++p;
    r[j] = g - a.parts[p].first;
    rows[j] = a.parts[p].rows;
    rowp[j] = a.parts[p].w + r[j] * a.rb;
    y[j] = grow < a.total_rows && n > 0 ? a.parts[p].y + int64_t{t0} * rows[j] : nullptr;
  }
  // Everything above reads only the kernel parameters. The first round's weights are loaded before the wait
  // (weights are constant during a step), so that they stream in while the kernel before this one drains; the
  // activations (coherent loads, which ptxas keeps below the wait: launch.cuh) and y only after it.
  constexpr int U = round_blocks<B, R>();
  const BlockWalk wk = block_walk<B, R>(a, part, split, lane);
  typename B::Raw w0[U][R];
  if (y[0] != nullptr) load_round<B, R, U>(a, rowp, wk.b0, wk.step, wk.end, lane, w0);
  pdl_begin();
  float acc[R][NT];
#pragma unroll
  for (int j = 0; j < R; ++j)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[j][t] = 0.0f;
  if (y[0] != nullptr) group_dot<B, R, NT>(a, rowp, wk, t0, n, lane, w0, acc);
  if constexpr (B::kGroupParts) {
    constexpr int G = 32 / B::kLanes;
    __shared__ float parts[kWarps][G][R * NT];
    store_rows_parts<G, R, NT>(acc, parts, warp, lane, part, split, n, y, rows, r);
  } else {
    __shared__ float partial[kWarps][R * NT];
    gemv_common::store_rows<R, NT>(acc, partial, warp, lane, part, split, n, y, rows, r);
  }
}

template <typename B, int R, int NT>
cudaError_t launch_rows(const Args& a, cudaStream_t stream) {
  unsigned g = 0;
  if (!gemv_common::grid_for_rows((a.total_rows + R - 1) / R, a.split, &g)) return cudaErrorInvalidValue;
  if constexpr (NT == 1 && requires { B::kOneWaveCtas; }) {
    // One wave at kOneWaveCtas CTAs an SM where min_ctas would take a second, nearly empty one (H200, q4_K
    // 6144x5120, 768 CTAs: 11.5 us at 5 an SM, 10.0 at 6; larger grids were faster at 5).
    const int64_t sms = current_sm_count();
    if (g > B::min_ctas(1, a.split) * sms && g <= B::kOneWaveCtas * sms)
      return launch_pdl(gemv_q8_kernel<B, R, NT, B::kOneWaveCtas>, dim3(g), dim3(kThreads), 0, stream, a);
  }
  constexpr int kOwn = B::min_ctas(NT, 1), kShared = B::min_ctas(NT, 2);
  if constexpr (kOwn != kShared)
    if (a.split == 1) return launch_pdl(gemv_q8_kernel<B, R, NT, kOwn>, dim3(g), dim3(kThreads), 0, stream, a);
  return launch_pdl(gemv_q8_kernel<B, R, NT, kShared>, dim3(g), dim3(kThreads), 0, stream, a);
}

// Rows of at most one warp step of blocks (P = 32 / kLanes: a lane holds at most one block of a row, whatever the
// split) leave all but the first warp of a split row group without blocks: there the group's warps take a share
// of the tokens each (Args::tsplit; the kernel's NT covers ceil(n / split)), which sums every (row, token) as the
// split launch does (its idle warps' partials were zeros, added last).
template <typename B>
bool splits_tokens(int64_t cols, int split) {
  return split > 1 && cols / B::kElems <= 32 / B::kLanes;
}

template <typename B>
cudaError_t launch(Args a, cudaStream_t stream) {
  a.tsplit = splits_tokens<B>(a.cols, a.split) ? 1 : 0;
  const int per_warp = a.tsplit ? (a.n + a.split - 1) / a.split : a.n;
  cudaError_t err = cudaSuccess;
  const cudaError_t last = gemv_common::for_token_count(per_warp, [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    err = launch_rows<B, B::rows_a_warp(NT), NT>(a, stream);
  });
  return err != cudaSuccess ? err : last;
}

// f(std::type_identity<B>{}) for the kernel kind of a type and row length; `none` for a type without one.
template <typename R, typename F>
R with_kind(uint32_t id, int64_t cols, R none, F&& f) {
  switch (id) {
    case qblocks::kQ4_0: return cols % 256 == 0 ? f(std::type_identity<Q40S>{}) : f(std::type_identity<Q40>{});
    case qblocks::kQ8_0: return cols % 256 == 0 ? f(std::type_identity<Q80S>{}) : f(std::type_identity<Q80>{});
    case qblocks::kQ2_K: return f(std::type_identity<Q2K>{});
    case qblocks::kQ3_K: return f(std::type_identity<Q3K>{});
    case qblocks::kQ4_K: return f(std::type_identity<K4<false>>{});
    case qblocks::kQ5_K: return f(std::type_identity<K4<true>>{});
    case qblocks::kQ6_K: return f(std::type_identity<Q6K>{});
    default: return none;
  }
}

// One warp per 32-element block.
__global__ void __launch_bounds__(kThreads) quantize_q8_kernel(const float* x, int64_t blocks, Q8Out out) {
  const int64_t blk = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  pdl_begin();
  if (blk >= blocks) return;
  quantize_q8_block(x[blk * 32 + lane], lane, blk, out);
}

}  // namespace

int gemv_q8_parts(DType type, int64_t total_rows) {
  const auto id = static_cast<uint32_t>(type);
  // Lane groups a warp: a group (kLanes lanes) a block, as the kernel's store_rows_parts folds them.
  const int groups = id == qblocks::kQ4_K ? 32 / K4<false>::kLanes
                     : id == qblocks::kQ5_K ? 32 / K4<true>::kLanes
                     : id == qblocks::kQ6_K ? 32 / Q6K::kLanes
                     : id == qblocks::kQ3_K ? 32 / Q3K::kLanes
                     : id == qblocks::kQ2_K ? 32 / Q2K::kLanes
                     : id == qblocks::kQ8_0 ? 32 / Q80S::kLanes  // rows of whole super-blocks (mmq's)
                     : id == qblocks::kQ4_0 ? 32 / Q40S::kLanes
                                            : 0;
  return groups * gemv_q8_split(type, total_rows);
}

int gemv_q8_split(DType type, int64_t total_rows) {
  const auto id = static_cast<uint32_t>(type);
  const int split = gemv_auto_split(total_rows);
  // q4_K and q5_K take 4 lanes a block (8 blocks a warp step, twice the others): half the warps a row, so that
  // a row has at most 8 parts where it had (mmq's limit) and twice the blocks a warp.
  return (id == qblocks::kQ4_K || id == qblocks::kQ5_K) && split > 1 ? split / 2 : split;
}

int64_t gemv_q8_max_tokens(DType type, int64_t cols, int64_t total_rows, int split) {
  const int s = split != 0 ? split : gemv_q8_split(type, total_rows);
  return with_kind(static_cast<uint32_t>(type), cols, int64_t{0}, [&](auto kind) {
    using B = typename decltype(kind)::type;
    return splits_tokens<B>(cols, s) ? std::min<int64_t>(s * kQ8MaxTokens, kQ8MaxSharedTokens) : kQ8MaxTokens;
  });
}

bool gemv_q8_supported(DType type) {
  return with_kind(static_cast<uint32_t>(type), 0, false, [](auto) { return true; });
}

cudaError_t quantize_q8_rows(const float* x, int64_t n, int64_t cols, int8_t* xq, float* xd, int* xs,
                             cudaStream_t stream) {
  if (n < 0 || cols < 0 || cols % kQ8Block != 0 || (n > 0 && cols > INT64_MAX / n)) return cudaErrorInvalidValue;
  const int64_t blocks = n * cols / kQ8Block;
  if (blocks == 0) return cudaSuccess;
  if (x == nullptr || xq == nullptr || xd == nullptr || xs == nullptr) return cudaErrorInvalidValue;
  const int64_t grid = (blocks + kWarps - 1) / kWarps;
  if (grid > INT_MAX) return cudaErrorInvalidValue;
  return launch_pdl(quantize_q8_kernel, dim3(static_cast<unsigned>(grid)), dim3(kThreads), 0, stream, x, blocks,
                    Q8Out{xq, xd, xs});
}

cudaError_t gemv_q8(DType type, const Q8Part* parts, int n_parts, int64_t cols, const int8_t* xq, const float* xd,
                    const int* xs, int64_t n, cudaStream_t stream, int split) {
  const uint32_t id = static_cast<uint32_t>(type);
  int64_t elems = 0;
  constexpr uintptr_t walign = 16;  // every type: 16-byte loads, or a split device form (weight_form.h)
  switch (id) {
    case qblocks::kQ4_0:
    case qblocks::kQ8_0: elems = 32; break;
    case qblocks::kQ2_K:
    case qblocks::kQ3_K:
    case qblocks::kQ4_K:
    case qblocks::kQ5_K:
    case qblocks::kQ6_K: elems = 256; break;
    default: return cudaErrorInvalidValue;
  }
  if (n_parts < 0 || n_parts > kQ8MaxParts || (n_parts > 0 && parts == nullptr)) return cudaErrorInvalidValue;
  if (cols <= 0 || cols % elems != 0 || n < 1 || n > kQ8MaxSharedTokens) return cudaErrorInvalidValue;
  if (split != 0 && split != 1 && split != 2 && split != 4) return cudaErrorInvalidValue;
  if (xq == nullptr || xd == nullptr || xs == nullptr || !is_aligned(xq, 16) || !is_aligned(xd, 4) ||
      !is_aligned(xs, 4))
    return cudaErrorInvalidValue;
  const int64_t rb = device_row_bytes(type, cols);  // weight_form.h
  if (rb <= 0 || rb % walign != 0) return cudaErrorInvalidValue;  // never: 144, 176 and the split forms'
  if (rb > INT_MAX / 2 || cols > INT_MAX / 2) return cudaErrorInvalidValue;  // kernels index a row's bytes by int
  const bool k4 = id == qblocks::kQ4_K || id == qblocks::kQ5_K;
  if (k4 && !is_aligned(xs, 16)) return cudaErrorInvalidValue;  // K4 loads a chunk's 4 sums at once
  Args a{};
  a.cols = cols;
  a.rb = rb;
  a.xq = xq;
  a.xd = xd;
  a.xs = xs;
  a.n = static_cast<int>(n);
  for (int p = 0; p < n_parts; ++p) {
    const Q8Part& q = parts[p];
    if (q.rows < 0) return cudaErrorInvalidValue;
    if (q.rows == 0) continue;
    if (q.w == nullptr || q.y == nullptr || !is_aligned(q.w, walign) || !is_aligned(q.y, 4))
      return cudaErrorInvalidValue;
    if (q.rows > INT64_MAX / rb || q.rows > INT64_MAX / n / 4 || a.total_rows > INT64_MAX - q.rows)
      return cudaErrorInvalidValue;
    a.parts[a.n_parts++] = Part{static_cast<const uint8_t*>(q.w), q.y, q.rows, a.total_rows};
    a.total_rows += q.rows;
  }
  if (a.total_rows == 0) return cudaSuccess;
  a.split = split != 0 ? split : gemv_q8_split(type, a.total_rows);
  if (n > gemv_q8_max_tokens(type, cols, a.total_rows, a.split)) return cudaErrorInvalidValue;
  return with_kind(id, cols, cudaErrorInvalidValue, [&](auto kind) {
    return launch<typename decltype(kind)::type>(a, stream);
  });
}

}  // namespace dflash::cuda

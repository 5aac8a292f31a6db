// Integer-dot GEMV kernels (gemv_q8.h).
//
// Work split as in matmul.cu: a CTA of 4 warps, each weight row owned by `split` consecutive warps
// (1, 2 or 4) that take interleaved blocks of it; a grouped launch lays the rows of up to four weights
// end to end. Lanes per weight block and bytes per lane:
//   q4_K, q5_K  8 lanes, 16 bytes of nibbles each (+ q5_K's 16 bytes of high bits), 16-byte loads
//   q6_K       16 lanes, one 16-element group each (16 bytes of ql, 16 of qh), 2-byte loads (210-byte blocks)
//   q8_0        4 lanes,  8 codes each, 2-byte loads (34-byte blocks)
//   q4_0        4 lanes,  4 bytes = 8 codes each, 2-byte loads (18-byte blocks)
// Each lane accumulates exact int32 sums of code * xq with __dp4a, then applies the block scales in f32:
// sum_i (ds q_i - ms) xd xq_i = xd (ds * sum q_i xq_i - ms * sum xq_i).
#include <climits>
#include <cstdint>

#include "ops/cuda/gemv_q8.h"
#include "ops/cuda/matmul.h"
#include "ops/cuda/gemv_common.cuh"
#include "ops/cuda/quant_blocks.cuh"
#include "ops/cuda/quantize_q8.cuh"

namespace dflash::cuda {
namespace {

using qblocks::fp16_to_f32;

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
  int n, split;
};

__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint16_t*>(p)); }
// 4 bytes at a 2-byte aligned address.
__device__ __forceinline__ int ld_i32_a2(const uint8_t* p) {
  return static_cast<int>(ld_u16(p) | (ld_u16(p + 2) << 16));
}
// 16 bytes at a 2-byte aligned address as four ints: five aligned 4-byte loads and funnel shifts (instead
// of eight 2-byte loads). Reads up to 4 bytes past the 16 (callers keep them inside the block).
__device__ __forceinline__ void ld16_a2(const uint8_t* p, int (&out)[4]) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  const auto* w = reinterpret_cast<const uint32_t*>(addr & ~uintptr_t{3});
  const unsigned shift = static_cast<unsigned>(addr & 3) * 8;  // 0 or 16
  uint32_t v[5];
#pragma unroll
  for (int i = 0; i < 5; ++i) v[i] = __ldg(w + i);
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = static_cast<int>(__funnelshift_r(v[i], v[i + 1], shift));
}
__device__ __forceinline__ int dot4(const int (&q)[4], const uint4& v, int acc) {
  acc = __dp4a(q[0], static_cast<int>(v.x), acc);
  acc = __dp4a(q[1], static_cast<int>(v.y), acc);
  acc = __dp4a(q[2], static_cast<int>(v.z), acc);
  return __dp4a(q[3], static_cast<int>(v.w), acc);
}

// 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes s0 (bytes 0-3), s1 (4-7), s2 (8-11).
__device__ __forceinline__ void k4_scale_min(int j, uint32_t s0, uint32_t s1, uint32_t s2, int& sc, int& m) {
  const int sh = 8 * (j & 3);
  if (j < 4) {
    sc = (s0 >> sh) & 63;
    m = (s1 >> sh) & 63;
  } else {
    sc = ((s2 >> sh) & 0x0f) | (((s0 >> sh) >> 6 & 3) << 4);
    m = ((s2 >> sh) >> 4 & 0x0f) | (((s1 >> sh) >> 6 & 3) << 4);
  }
}

// q4_K (144 bytes) and q5_K (176 bytes): lane u = lane % 8 of a block holds bytes [16u, 16u + 16) of the
// 128 nibble bytes: chunk c = u / 2, elements 64c + 16(u % 2) + [0, 16) (low nibbles, sub-block 2c) and
// the same + 32 (high nibbles, sub-block 2c + 1); q5_K's fifth bits come from qh[16(u % 2) + i] bit 2c / 2c+1.
// A lane's share of one q4_K/q5_K block, decoded: the codes of its two sub-blocks (low and high nibbles,
// with q5_K's fifth bits) and their scales and mins.
struct K4Codes {
  int lo[4], hi[4];
  float ds0, ms0, ds1, ms1;
};
template <bool kHigh>
__device__ __forceinline__ K4Codes k4_codes(const uint4& hdr, const uint4& qs, const uint4& qh, int c) {
  K4Codes k;
  const float d = fp16_to_f32(hdr.x & 0xffffu), dmin = fp16_to_f32(hdr.x >> 16);
  int sc0, m0, sc1, m1;
  k4_scale_min(2 * c, hdr.y, hdr.z, hdr.w, sc0, m0);
  k4_scale_min(2 * c + 1, hdr.y, hdr.z, hdr.w, sc1, m1);
  k.ds0 = d * static_cast<float>(sc0), k.ms0 = dmin * static_cast<float>(m0);
  k.ds1 = d * static_cast<float>(sc1), k.ms1 = dmin * static_cast<float>(m1);
  const uint32_t v[4] = {qs.x, qs.y, qs.z, qs.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    k.lo[i] = static_cast<int>(v[i] & 0x0f0f0f0fu);
    k.hi[i] = static_cast<int>((v[i] >> 4) & 0x0f0f0f0fu);
    if constexpr (kHigh) {
      const uint32_t h = i == 0 ? qh.x : i == 1 ? qh.y : i == 2 ? qh.z : qh.w;
      k.lo[i] |= static_cast<int>(((h >> (2 * c)) & 0x01010101u) << 4);
      k.hi[i] |= static_cast<int>(((h >> (2 * c + 1)) & 0x01010101u) << 4);
    }
  }
  return k;
}
// The block's term of a token's dot product: xd (ds sum(q xq) - ms sum(xq)) for both sub-blocks. Every
// kernel adds exactly this expression, so a token's sum is the same whichever kernel made it.
__device__ __forceinline__ float k4_term(const K4Codes& k, const uint4& xl, const uint4& xh, float2 xd, int xs0,
                                         int xs1) {
  const int sl = dot4(k.lo, xl, 0), sh = dot4(k.hi, xh, 0);
  return xd.x * (k.ds0 * static_cast<float>(sl) - k.ms0 * static_cast<float>(xs0)) +
         xd.y * (k.ds1 * static_cast<float>(sh) - k.ms1 * static_cast<float>(xs1));
}

template <bool kHigh>
struct K4 {
  static constexpr int kBytes = kHigh ? 176 : 144;
  template <int NT>
  __device__ static void row_dot(const Args& a, const uint8_t* rowp, int part, int lane, float (&acc)[NT]) {
    constexpr int U = 2;  // blocks in flight per lane (H100: 2 beats 4, which costs occupancy)
    const int64_t blocks = a.cols / 256, xblocks = a.cols / 32;
    const int u = lane & 7, c = u >> 1, half = u & 1;
    const int64_t step = int64_t{a.split} * 4;
    for (int64_t b0 = int64_t{part} * 4 + (lane >> 3); b0 < blocks; b0 += U * step) {
      uint4 hdr[U], qs[U], qh[U];
      // Token 0's activations are loaded with the weights, so one memory round trip serves both (the
      // other tokens' follow in the dot loop).
      uint4 x0l[U], x0h[U];
      float2 x0d[U];
      int x0s[U][2];
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const int64_t b = b0 + k * step;
        if (b < blocks) {
          const uint4* blk = reinterpret_cast<const uint4*>(rowp + b * kBytes);
          hdr[k] = __ldg(blk);
          if constexpr (kHigh) {
            qh[k] = __ldg(blk + 1 + half);
            qs[k] = __ldg(blk + 3 + u);
          } else {
            qs[k] = __ldg(blk + 1 + u);
          }
          const int64_t col = b * 256 + 64 * c + 16 * half;
          x0l[k] = __ldg(reinterpret_cast<const uint4*>(a.xq + col));
          x0h[k] = __ldg(reinterpret_cast<const uint4*>(a.xq + col + 32));
          x0d[k] = __ldg(reinterpret_cast<const float2*>(a.xd + b * 8 + 2 * c));
          x0s[k][0] = __ldg(a.xs + col / 16);
          x0s[k][1] = __ldg(a.xs + col / 16 + 2);
        }
      }
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const int64_t b = b0 + k * step;
        if (b >= blocks) break;
        const K4Codes codes = k4_codes<kHigh>(hdr[k], qs[k], qh[k], c);
        const int64_t col = b * 256 + 64 * c + 16 * half;
        acc[0] += k4_term(codes, x0l[k], x0h[k], x0d[k], x0s[k][0], x0s[k][1]);
#pragma unroll
        for (int t = 1; t < NT; ++t) {
          if (t >= a.n) break;
          const int8_t* xr = a.xq + t * a.cols + col;
          const uint4 xl = __ldg(reinterpret_cast<const uint4*>(xr));
          const uint4 xh = __ldg(reinterpret_cast<const uint4*>(xr + 32));
          const float2 dr = __ldg(reinterpret_cast<const float2*>(a.xd + t * xblocks + b * 8 + 2 * c));
          const int* sr = a.xs + t * (2 * xblocks) + col / 16;
          acc[t] += k4_term(codes, xl, xh, dr, __ldg(sr), __ldg(sr + 2));
        }
      }
    }
  }
};

// One token, two rows per warp (gemv_k4_pair_kernel): each lane's activation block is loaded once for both
// rows. The per-row sums are formed exactly as in K4::row_dot with NT = 1 (same blocks per lane in the
// same order, the same expression), so a token's output does not depend on the kernel that made it.
template <bool kHigh>
struct K4Pair {
  __device__ static void dot(const Args& a, const uint8_t* const (&rowp)[2], int part, int lane, float (&acc)[2]);
};
template <bool kHigh>
__device__ void K4Pair<kHigh>::dot(const Args& a, const uint8_t* const (&rowp)[2], int part, int lane,
                                   float (&acc)[2]) {
  constexpr int kBytes = K4<kHigh>::kBytes;
  const int64_t blocks = a.cols / 256;
  const int u = lane & 7, c = u >> 1, half = u & 1;
  const int64_t step = int64_t{a.split} * 4;
  for (int64_t b = int64_t{part} * 4 + (lane >> 3); b < blocks; b += step) {
    uint4 hdr[2], qs[2], qh[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint4* blk = reinterpret_cast<const uint4*>(rowp[j] + b * kBytes);
      hdr[j] = __ldg(blk);
      if constexpr (kHigh) {
        qh[j] = __ldg(blk + 1 + half);
        qs[j] = __ldg(blk + 3 + u);
      } else {
        qs[j] = __ldg(blk + 1 + u);
      }
    }
    const int64_t col = b * 256 + 64 * c + 16 * half;
    const uint4 xl = __ldg(reinterpret_cast<const uint4*>(a.xq + col));
    const uint4 xh = __ldg(reinterpret_cast<const uint4*>(a.xq + col + 32));
    const float2 xd = __ldg(reinterpret_cast<const float2*>(a.xd + b * 8 + 2 * c));
    const int xs0 = __ldg(a.xs + col / 16), xs1 = __ldg(a.xs + col / 16 + 2);
#pragma unroll
    for (int j = 0; j < 2; ++j) acc[j] += k4_term(k4_codes<kHigh>(hdr[j], qs[j], qh[j], c), xl, xh, xd, xs0, xs1);
  }
}

// q6_K (210 bytes): lane g = lane % 16 of a block holds group g (elements 16g + [0, 16)): low nibbles
// from ql[64h + 16t + 32(k & 1)] (nibble k / 2), bits 4-5 from bit pair k of qh[32h + 16t] (h = g / 8,
// k = g / 2 % 4, t = g % 2), scale int8 scales[g]; code - 32.
struct Q6K {
  template <int NT>
  __device__ static void row_dot(const Args& a, const uint8_t* rowp, int part, int lane, float (&acc)[NT]) {
    constexpr int U = 2;
    const int64_t blocks = a.cols / 256, xblocks = a.cols / 32;
    const int g = lane & 15, h = g >> 3, k = (g >> 1) & 3, tt = g & 1;
    const int64_t step = int64_t{a.split} * 2;
    for (int64_t b0 = int64_t{part} * 2 + (lane >> 4); b0 < blocks; b0 += U * step) {
      int ql[U][4], qh[U][4];
      uint32_t sd[U][2];
      uint4 x0[U];  // token 0's activations, loaded with the weights
      float x0d[U];
      int x0s[U];
#pragma unroll
      for (int j = 0; j < U; ++j) {
        const int64_t b = b0 + j * step;
        if (b < blocks) {
          x0[j] = __ldg(reinterpret_cast<const uint4*>(a.xq + b * 256 + 16 * g));
          x0d[j] = __ldg(a.xd + b * 8 + g / 2);
          x0s[j] = __ldg(a.xs + b * 16 + g);
          const uint8_t* blk = rowp + b * 210;
          // ql bytes [64h + 16tt + 32(k & 1), +16) and qh bytes [128 + 32h + 16tt, +16): the loads' 4
          // bytes past them stay inside the 210-byte block.
          ld16_a2(blk + 64 * h + 16 * tt + 32 * (k & 1), ql[j]);
          ld16_a2(blk + 128 + 32 * h + 16 * tt, qh[j]);
          sd[j][0] = ld_u16(blk + 192 + (g & ~1));  // scales[g] in the byte g % 2 of this word
          sd[j][1] = ld_u16(blk + 208);
        }
      }
#pragma unroll
      for (int j = 0; j < U; ++j) {
        const int64_t b = b0 + j * step;
        if (b >= blocks) break;
        const int sc = static_cast<int8_t>(sd[j][0] >> (8 * (g & 1)));
        const float dsc = fp16_to_f32(sd[j][1]) * static_cast<float>(sc);
        int q[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          q[i] = static_cast<int>(((static_cast<uint32_t>(ql[j][i]) >> (4 * (k >> 1))) & 0x0f0f0f0fu) |
                                  (((static_cast<uint32_t>(qh[j][i]) >> (2 * k)) & 0x03030303u) << 4));
        const int64_t col = b * 256 + 16 * g;
        acc[0] += x0d[j] * (dsc * static_cast<float>(dot4(q, x0[j], 0) - 32 * x0s[j]));
#pragma unroll
        for (int t = 1; t < NT; ++t) {
          if (t >= a.n) break;
          const uint4 xv = __ldg(reinterpret_cast<const uint4*>(a.xq + t * a.cols + col));
          const int s = dot4(q, xv, 0) - 32 * __ldg(a.xs + t * (2 * xblocks) + col / 16);
          acc[t] += __ldg(a.xd + t * xblocks + b * 8 + g / 2) * (dsc * static_cast<float>(s));
        }
      }
    }
  }
};

// q8_0 (34 bytes) and q4_0 (18 bytes): 4 lanes per block. q8_0 lane j: codes [8j, 8j + 8); q4_0 lane j:
// bytes [4j, 4j + 4) of qs = elements 4j + [0, 4) (low nibbles) and 16 + 4j + [0, 4) (high), code - 8.
template <bool kQ8>
struct Legacy {
  static constexpr int kBytes = kQ8 ? 34 : 18;
  template <int NT>
  __device__ static void row_dot(const Args& a, const uint8_t* rowp, int part, int lane, float (&acc)[NT]) {
    constexpr int U = 4;
    const int64_t blocks = a.cols / 32;
    const int j = lane & 3;
    const int64_t step = int64_t{a.split} * 8;
    for (int64_t b0 = int64_t{part} * 8 + (lane >> 2); b0 < blocks; b0 += U * step) {
      int q0[U], q1[U];
      uint32_t dh[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t b = b0 + u * step;
        if (b < blocks) {
          const uint8_t* blk = rowp + b * kBytes;
          dh[u] = ld_u16(blk);
          if constexpr (kQ8) {
            q0[u] = ld_i32_a2(blk + 2 + 8 * j);
            q1[u] = ld_i32_a2(blk + 6 + 8 * j);
          } else {
            const uint32_t v = static_cast<uint32_t>(ld_i32_a2(blk + 2 + 4 * j));
            q0[u] = static_cast<int>(v & 0x0f0f0f0fu);
            q1[u] = static_cast<int>((v >> 4) & 0x0f0f0f0fu);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t b = b0 + u * step;
        if (b >= blocks) break;
        const float d = fp16_to_f32(dh[u]);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (t >= a.n) break;
          const int8_t* xr = a.xq + t * a.cols + b * 32;
          int s;
          if constexpr (kQ8) {
            const uint2 xv = __ldg(reinterpret_cast<const uint2*>(xr + 8 * j));
            s = __dp4a(q1[u], static_cast<int>(xv.y), __dp4a(q0[u], static_cast<int>(xv.x), 0));
          } else {
            const int xl = __ldg(reinterpret_cast<const int*>(xr + 4 * j));
            const int xh = __ldg(reinterpret_cast<const int*>(xr + 16 + 4 * j));
            s = __dp4a(q1[u], xh, __dp4a(q0[u], xl, 0)) - 8 * __dp4a(xh, kOnes, __dp4a(xl, kOnes, 0));
          }
          acc[t] += __ldg(a.xd + t * blocks + b) * (d * static_cast<float>(s));
        }
      }
    }
  }
};

// One token: at least 8 CTAs (32 warps) a SM, which caps registers at 64 (from 72: 7 CTAs); measured
// 3-8% faster for q4_K/q6_K on an H100. More tokens keep the unbounded allocation: their per-token
// accumulators spill under the cap (n = 16 ran 1.5x slower). docs/benchmarks.md.
template <typename Policy, int NT>
__global__ void __launch_bounds__(kThreads, NT == 1 ? 8 : 1) gemv_q8_kernel(const Args a) {
  __shared__ float partial[kWarps][NT];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t grow = int64_t{blockIdx.x} * (kWarps / a.split) + warp / a.split;
  const int part = warp % a.split;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  float* y = nullptr;
  int64_t rows = 0, r = 0;
  if (grow < a.total_rows) {
    int p = 0;
    while (p + 1 < a.n_parts && grow >= a.parts[p + 1].first) ++p;
    r = grow - a.parts[p].first;
    rows = a.parts[p].rows;
    y = a.parts[p].y;
    Policy::template row_dot<NT>(a, a.parts[p].w + r * a.rb, part, lane, acc);
  }
  gemv_common::store_row<NT>(acc, partial, warp, lane, part, a.split, a.n, y, rows, r);
}

// One token of q4_K / q5_K: each warp (or each `split` warps) owns two consecutive rows of the launch
// (Pair: K4Pair).
template <typename Pair>
__global__ void __launch_bounds__(kThreads, 8) gemv_pair_kernel(const Args a) {
  __shared__ float partial[kWarps][1];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t pair = int64_t{blockIdx.x} * (kWarps / a.split) + warp / a.split;
  const int part = warp % a.split;
  const uint8_t* rowp[2] = {nullptr, nullptr};
  float* y[2] = {nullptr, nullptr};
  int64_t rows[2] = {0, 0}, r[2] = {0, 0};
  for (int j = 0; j < 2; ++j) {
    const int64_t grow = 2 * pair + j;
    const int64_t g = grow < a.total_rows ? grow : a.total_rows - 1;  // a missing second row reads the last
    int p = 0;
    while (p + 1 < a.n_parts && g >= a.parts[p + 1].first) ++p;
    r[j] = g - a.parts[p].first;
    rows[j] = a.parts[p].rows;
    rowp[j] = a.parts[p].w + r[j] * a.rb;
    if (grow < a.total_rows) y[j] = a.parts[p].y;
  }
  float acc[2] = {0.0f, 0.0f};
  if (y[0] != nullptr) Pair::dot(a, rowp, part, lane, acc);
  for (int j = 0; j < 2; ++j) {
    float one[1] = {acc[j]};
    gemv_common::store_row<1>(one, partial, warp, lane, part, a.split, 1, y[j], rows[j], r[j]);
    if (a.split > 1) __syncthreads();  // partial is reused by the second row
  }
}

// One token, two rows per warp: the activation loads are shared by the pair.
template <typename Pair>
cudaError_t launch_pairs(const Args& a, cudaStream_t stream) {
  unsigned g = 0;
  if (!gemv_common::grid_for_rows((a.total_rows + 1) / 2, a.split, &g)) return cudaErrorInvalidValue;
  gemv_pair_kernel<Pair><<<g, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename Policy>
cudaError_t launch(const Args& a, cudaStream_t stream) {
  unsigned g = 0;
  if (!gemv_common::grid_for_rows(a.total_rows, a.split, &g)) return cudaErrorInvalidValue;
  return gemv_common::for_token_count(a.n, [&](auto nt) {
    gemv_q8_kernel<Policy, decltype(nt)::value><<<g, kThreads, 0, stream>>>(a);
  });
}

// One warp per 32-element block.
__global__ void __launch_bounds__(kThreads) quantize_q8_kernel(const float* x, int64_t blocks, Q8Out out) {
  const int64_t blk = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  if (blk >= blocks) return;
  quantize_q8_block(x[blk * 32 + lane], lane, blk, out);
}

bool aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

bool gemv_q8_supported(DType type) {
  switch (static_cast<uint32_t>(type)) {
    case qblocks::kQ4_0:
    case qblocks::kQ8_0:
    case qblocks::kQ4_K:
    case qblocks::kQ5_K:
    case qblocks::kQ6_K: return true;
    default: return false;
  }
}

cudaError_t quantize_q8_rows(const float* x, int64_t n, int64_t cols, int8_t* xq, float* xd, int* xs,
                             cudaStream_t stream) {
  if (n < 0 || cols < 0 || cols % kQ8Block != 0 || (n > 0 && cols > INT64_MAX / n)) return cudaErrorInvalidValue;
  const int64_t blocks = n * cols / kQ8Block;
  if (blocks == 0) return cudaSuccess;
  if (x == nullptr || xq == nullptr || xd == nullptr || xs == nullptr) return cudaErrorInvalidValue;
  const int64_t grid = (blocks + kWarps - 1) / kWarps;
  if (grid > INT_MAX) return cudaErrorInvalidValue;
  quantize_q8_kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(x, blocks, Q8Out{xq, xd, xs});
  return cudaGetLastError();
}

cudaError_t gemv_q8(DType type, const Q8Part* parts, int n_parts, int64_t cols, const int8_t* xq, const float* xd,
                    const int* xs, int64_t n, cudaStream_t stream) {
  const uint32_t id = static_cast<uint32_t>(type);
  int64_t elems = 0, bytes = 0;
  uintptr_t walign = 2;
  switch (id) {
    case qblocks::kQ4_0: elems = 32, bytes = 18; break;
    case qblocks::kQ8_0: elems = 32, bytes = 34; break;
    case qblocks::kQ4_K: elems = 256, bytes = 144, walign = 16; break;
    case qblocks::kQ5_K: elems = 256, bytes = 176, walign = 16; break;
    case qblocks::kQ6_K: elems = 256, bytes = 210; break;
    default: return cudaErrorInvalidValue;
  }
  if (n_parts < 0 || n_parts > kQ8MaxParts || (n_parts > 0 && parts == nullptr)) return cudaErrorInvalidValue;
  if (cols <= 0 || cols % elems != 0 || n < 1 || n > kQ8MaxTokens) return cudaErrorInvalidValue;
  if (xq == nullptr || xd == nullptr || xs == nullptr || !aligned(xq, 16) || !aligned(xd, 4) || !aligned(xs, 4))
    return cudaErrorInvalidValue;
  const int64_t rb = cols / elems * bytes;
  if (walign == 16 && rb % 16 != 0) return cudaErrorInvalidValue;  // never: 144 and 176 are multiples of 16
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
    if (q.w == nullptr || q.y == nullptr || !aligned(q.w, walign) || !aligned(q.y, 4)) return cudaErrorInvalidValue;
    if (q.rows > INT64_MAX / rb || q.rows > INT64_MAX / n / 4 || a.total_rows > INT64_MAX - q.rows)
      return cudaErrorInvalidValue;
    a.parts[a.n_parts++] = Part{static_cast<const uint8_t*>(q.w), q.y, q.rows, a.total_rows};
    a.total_rows += q.rows;
  }
  if (a.total_rows == 0) return cudaSuccess;
  a.split = gemv_auto_split(a.total_rows);
  switch (id) {
    case qblocks::kQ4_0: return launch<Legacy<false>>(a, stream);
    case qblocks::kQ8_0: return launch<Legacy<true>>(a, stream);
    case qblocks::kQ4_K: return a.n == 1 ? launch_pairs<K4Pair<false>>(a, stream) : launch<K4<false>>(a, stream);
    case qblocks::kQ5_K: return a.n == 1 ? launch_pairs<K4Pair<true>>(a, stream) : launch<K4<true>>(a, stream);
    // (q6_K two rows a warp measured slower: its sixteen 2-byte loads per row and lane dominate.)
    case qblocks::kQ6_K: return launch<Q6K>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace dflash::cuda

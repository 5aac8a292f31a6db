// GEMV kernels (matmul.h): y[n, rows] = x[n, cols] W^T for n <= 16 tokens, W in any stored type, f32
// activations. The engine's decode path for the common block types is the integer-dot GEMV (gemv_q8.cu);
// this one serves every type and the exact-f32 path (MatmulPath::kGemv).
//
// Work split: a CTA of 4 warps; each weight row belongs to `split` consecutive warps (1, 2 or 4), which
// take interleaved pieces of it, so a CTA covers 4 / split rows. A warp keeps one f32 accumulator per
// token per lane, reduces them with shuffles, and the row's warps add their partials in a fixed order.
// Weight access by type:
//   - f16/bf16 with 16-byte aligned W and x and cols % 8 == 0: gemv16_kernel (8 weights a 16-byte
//     L1::no_allocate load, R rows a warp group by token count, R * U loads in flight a lane; below);
//   - f32 (and f16/bf16 otherwise) with 16-byte aligned rows: 16-byte loads straight into registers, 4 in
//     flight per lane; otherwise element loads.
//   - q6_K, q8_0, q4_0 and q2_K (the device form, weight_form.h): a lane a 16-element group, loaded straight from
//     global memory;
//   - every other block type: the warp copies a chunk of whole blocks (any alignment) to its own shared
//     memory with 16-byte loads, then decodes from there with the exact group codecs of quant_blocks.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "base/checked_math.h"
#include "ops/cuda/matmul.h"
#include "ops/cuda/gemv_common.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/quant_blocks.cuh"
#include "ops/cuda/sm_count.h"
#include "ops/cuda/weight_form.h"

namespace dflash::cuda {
namespace {

using namespace qblocks;  // NOLINT: the codecs and type ids

using gemv_common::kThreads;
using gemv_common::kWarps;

struct Args {
  const uint8_t* w;
  int64_t rows, cols, rb;  // rb: bytes per weight row
  const float* x;
  int n;
  float* y;
  int split;
  bool x_vec;  // x rows 16-byte aligned: float4 loads
};

// acc[t] += dot(w[0..16), x[t, col..col+16)) for t < n.
template <int NT>
__device__ __forceinline__ void dot16(const Args& a, int64_t col, const float (&w)[kGroup], float (&acc)[NT]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    if (t >= a.n) break;
    const float* xp = a.x + t * a.cols + col;
    if (a.x_vec) {
#pragma unroll
      for (int k = 0; k < kGroup / 4; ++k) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(xp) + k);
        acc[t] = fmaf(w[4 * k], v.x, acc[t]);
        acc[t] = fmaf(w[4 * k + 1], v.y, acc[t]);
        acc[t] = fmaf(w[4 * k + 2], v.z, acc[t]);
        acc[t] = fmaf(w[4 * k + 3], v.w, acc[t]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kGroup; ++k) acc[t] = fmaf(w[k], __ldg(xp + k), acc[t]);
    }
  }
}

// ---- f32 / f16 / bf16 ----

template <uint32_t kType>
struct PlainT {
  static constexpr int kSize = kType == kF32 ? 4 : 2;
  static constexpr int kVec = 16 / kSize;  // elements per 16-byte load
};

// 8 (16-bit) or 4 (f32) weights of one 16-byte word.
template <uint32_t kType>
__device__ __forceinline__ void unpack_plain(const uint4& q, float (&w)[PlainT<kType>::kVec]) {
  const uint32_t v[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kType == kF32) {
      w[i] = __uint_as_float(v[i]);
    } else if constexpr (kType == kBF16) {
      w[2 * i] = __uint_as_float(v[i] << 16);
      w[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
    } else {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&v[i]));
      w[2 * i] = f.x;
      w[2 * i + 1] = f.y;
    }
  }
}

template <uint32_t kType, bool kVector>
struct Plain {
  struct Smem {};
  template <int NT>
  __device__ static void row_dot(const Args& a, int64_t row, int part, int lane, Smem&, float (&acc)[NT]) {
    constexpr int V = PlainT<kType>::kVec;
    const uint8_t* rowp = a.w + row * a.rb;
    if constexpr (kVector) {  // rows and x rows 16-byte aligned, cols % V == 0
      constexpr int U = 4;
      const int64_t step = int64_t{a.split} * 32 * V;
      int64_t e = (int64_t{part} * 32 + lane) * V;
      for (; e < a.cols; e += U * step) {
        uint4 q[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (e + u * step < a.cols)
            q[u] = __ldg(reinterpret_cast<const uint4*>(rowp + (e + u * step) * PlainT<kType>::kSize));
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t col = e + u * step;
          if (col >= a.cols) break;
          float w[V];
          unpack_plain<kType>(q[u], w);
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            if (t >= a.n) break;
            const float4* xp = reinterpret_cast<const float4*>(a.x + t * a.cols + col);
#pragma unroll
            for (int k = 0; k < V / 4; ++k) {
              const float4 v = __ldg(xp + k);
              acc[t] = fmaf(w[4 * k], v.x, acc[t]);
              acc[t] = fmaf(w[4 * k + 1], v.y, acc[t]);
              acc[t] = fmaf(w[4 * k + 2], v.z, acc[t]);
              acc[t] = fmaf(w[4 * k + 3], v.w, acc[t]);
            }
          }
        }
      }
    } else {  // any alignment: byte loads
      for (int64_t e = int64_t{part} * 32 + lane; e < a.cols; e += int64_t{a.split} * 32) {
        const uint8_t* p = rowp + e * PlainT<kType>::kSize;
        float w;
        if constexpr (kType == kF32)
          w = __uint_as_float(load_u32(p));
        else if constexpr (kType == kF16)
          w = fp16_to_f32(load_u16(p));
        else
          w = bf16_to_f32(load_u16(p));
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (t >= a.n) break;
          acc[t] = fmaf(w, a.x[t * a.cols + e], acc[t]);
        }
      }
    }
  }
};

// ---- f16 / bf16 with 16-byte aligned rows: the decode GEMV of 16-bit checkpoints ----
//
// A launch takes up to kGemvMaxParts weights of the same type and columns (gemv16_group: a layer's q/k/v or
// gate/up, one launch instead of one each), each starting at a CTA of its own, so that a CTA finds its part from
// its index alone (the same in every thread). A group of R consecutive rows of a part belongs to `split`
// consecutive warps of the CTA (kWarps / split groups a CTA). Lane l of the group's warp p takes the 16-byte
// chunks (8 weights) c = (p * 32 + l) + k * split * 32 of each of its rows, k ascending, U chunks of each row
// loaded before any is used (R * U 16-byte weight loads in flight a lane, ld.global.nc.L1::no_allocate so that L1
// keeps x, which every warp of the SM reads again as float4). Each x chunk a lane loads serves its R rows. Per
// (row, token) the lane accumulates fmaf(w, x, acc) over its chunks in k order, elements in order within a chunk:
// the order depends on split and cols alone, not on R, U, the number of tokens or the other parts of the launch
// (so a token's result is the same in any batch); the lanes and the split's warps are then summed by
// gemv_common::store_rows, also independent of R and NT.

using gemv_common::ldw_u4;

struct Part16 {
  const uint8_t* w;
  float* y;
  int64_t rows;
};

struct Args16 {
  Part16 parts[kGemvMaxParts];
  int64_t first_cta[kGemvMaxParts];  // each part's first CTA (launch16_tile: whole CTAs a part)
  int n_parts;
  int64_t cols, rb;
  const float* x;
  int n, split;
};

// acc[j][t] += dot(the 8 weights of q[j], x[t, col..col+8)) for each of the R rows' words.
// x through coherent loads (__ldca), which ptxas keeps below the PDL wait (launch.cuh): gemv16_kernel loads weights
// before it.
template <uint32_t kType, int NT, int R>
__device__ __forceinline__ void dot_chunk16(const Args16& a, int64_t col, const uint4 (&q)[R],
                                            float (&acc)[R][NT]) {
  float w[R][8];
#pragma unroll
  for (int j = 0; j < R; ++j) unpack_plain<kType>(q[j], w[j]);
#pragma unroll
  for (int t = 0; t < NT; ++t) {  // tokens past n repeat the last one (no branch; not stored)
    const float4* xp = reinterpret_cast<const float4*>(a.x + (t < a.n ? t : a.n - 1) * a.cols + col);
    const float4 v0 = __ldca(xp), v1 = __ldca(xp + 1);
    const float xs[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[j][t] = fmaf(w[j][k], xs[k], acc[j][t]);
  }
}

// kGrouped: several parts, the CTA's picked by selects over them (an index into the parameters would take them to
// local memory); else the one part's fields stay parameters, as before grouping: a form that held them in
// registers for every launch (and counted chunks in 32 bits) took 3-8% longer a one-token product (H200).
// Each lane's first U chunks of its R rows are loaded before the PDL wait (weights are constant), so that they
// stream in while the kernel before this one (a norm, the attention merge, SwiGLU) drains; x is read after it.
template <uint32_t kType, int NT, int R, int U, bool kGrouped>
__global__ void __launch_bounds__(kThreads) gemv16_kernel(const Args16 a) {
  __shared__ float partial[kWarps][R * NT];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  // The CTA's part (the same in every thread: each part starts at a CTA, Args16::first_cta) and its rows there.
  Part16 pt = a.parts[0];
  int64_t first = 0;
  if constexpr (kGrouped) {
#pragma unroll
    for (int i = 1; i < kGemvMaxParts; ++i)
      if (i < a.n_parts && static_cast<int64_t>(blockIdx.x) >= a.first_cta[i]) pt = a.parts[i], first = a.first_cta[i];
  }
  const int64_t row0 = ((int64_t{blockIdx.x} - first) * (kWarps / a.split) + warp / a.split) * R;
  const int part = warp % a.split;
  float acc[R][NT];
#pragma unroll
  for (int j = 0; j < R; ++j)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[j][t] = 0.0f;
  const uint8_t* rp[R];  // rows past the end read the last row again (their sums are not stored)
#pragma unroll
  for (int j = 0; j < R; ++j) rp[j] = pt.w + (row0 + j < pt.rows ? row0 + j : pt.rows - 1) * a.rb;
  const int64_t chunks = a.cols / 8, stride = int64_t{a.split} * 32;
  int64_t c = int64_t{part} * 32 + lane;
  const bool live = row0 < pt.rows, whole = live && c + (U - 1) * stride < chunks;  // a first whole round
  // A round: chunks c + u * stride (u < U) of the R rows, loaded, then used.
  const auto load_round = [&](uint4 (&q)[U][R]) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < R; ++j) q[u][j] = ldw_u4(rp[j] + (c + u * stride) * 16);
  };
  const auto dot_round = [&](const uint4 (&q)[U][R]) {
#pragma unroll
    for (int u = 0; u < U; ++u) dot_chunk16<kType, NT, R>(a, (c + u * stride) * 8, q[u], acc);
  };
  uint4 q0[U][R];
  if (whole) load_round(q0);
  pdl_begin();
  if (whole) {
    dot_round(q0);
    c += U * stride;
  }
  if (live) {
    for (; c + (U - 1) * stride < chunks; c += U * stride) {
      uint4 q[U][R];
      load_round(q);
      dot_round(q);
    }
    for (; c < chunks; c += stride) {
      uint4 q[R];
#pragma unroll
      for (int j = 0; j < R; ++j) q[j] = ldw_u4(rp[j] + c * 16);
      dot_chunk16<kType, NT, R>(a, c * 8, q, acc);
    }
  }
  float* ys[R];
  int64_t rows[R], rs[R];
#pragma unroll
  for (int j = 0; j < R; ++j) {
    ys[j] = row0 + j < pt.rows ? pt.y : nullptr;
    rows[j] = pt.rows;
    rs[j] = row0 + j;
  }
  gemv_common::store_rows<R, NT>(acc, partial, warp, lane, part, a.split, a.n, ys, rows, rs);
}

// Rows a warp group takes (R) and chunks of each row in flight a lane (U) by token count: more rows as
// the tokens grow, so that each x chunk read from L1 serves more weights. Picked on an H100 from R 1/2/4,
// U 2..16 and split 1/2/4 over the Qwen3-8B bf16 shapes (4096..151936 rows, 4096..17408 columns): R 1
// U 4 at one token (U 8 and 16 were 3-8 % slower: fewer warps fit), R 2 U 4 at 2-4, R 4 U 2 above.
template <int NT>
struct Tile16 {
  static constexpr int R = NT == 1 ? 1 : NT <= 4 ? 2 : 4;
  static constexpr int U = NT <= 4 ? 4 : 2;
};

template <uint32_t kType, int R, int U, int NT>
cudaError_t launch16_tile(Args16 a, cudaStream_t stream) {
  const int64_t per_cta = int64_t{kWarps / a.split} * R;
  int64_t g = 0;
  for (int i = 0; i < a.n_parts; ++i) {
    a.first_cta[i] = g;
    g += (a.parts[i].rows + per_cta - 1) / per_cta;
  }
  if (g > INT_MAX) return cudaErrorInvalidValue;
  if (a.n_parts > 1)
    return launch_pdl(gemv16_kernel<kType, NT, R, U, true>, dim3(static_cast<unsigned>(g)), dim3(kThreads), 0, stream,
                      a);
  return launch_pdl(gemv16_kernel<kType, NT, R, U, false>, dim3(static_cast<unsigned>(g)), dim3(kThreads), 0, stream,
                    a);
}

template <uint32_t kType>
cudaError_t launch16(const Args16& a, cudaStream_t stream) {
  switch (a.n <= 1 ? 1 : a.n <= 2 ? 2 : a.n <= 4 ? 4 : a.n <= 8 ? 8 : 16) {
    case 1: return launch16_tile<kType, Tile16<1>::R, Tile16<1>::U, 1>(a, stream);
    case 2: return launch16_tile<kType, Tile16<2>::R, Tile16<2>::U, 2>(a, stream);
    case 4: return launch16_tile<kType, Tile16<4>::R, Tile16<4>::U, 4>(a, stream);
    case 8: return launch16_tile<kType, Tile16<8>::R, Tile16<8>::U, 8>(a, stream);
    default: return launch16_tile<kType, Tile16<16>::R, Tile16<16>::U, 16>(a, stream);
  }
}

// ---- Block types through a per-warp shared-memory stage ----

// Copies bytes [src, src + len) to the warp's stage at their address modulo 16; returns the offset of
// src's first byte in the stage. Reads nothing outside the range.
__device__ __forceinline__ int stage_bytes(const uint8_t* src, int len, uint4* stage, int lane) {
  auto* sbytes = reinterpret_cast<uint8_t*>(stage);
  const auto ub = reinterpret_cast<uintptr_t>(src);
  const uintptr_t ue = ub + static_cast<uintptr_t>(len);
  const uintptr_t base = ub & ~uintptr_t{15};
  uintptr_t a0 = (ub + 15) & ~uintptr_t{15};
  if (a0 > ue) a0 = ue;
  uintptr_t a1 = ue & ~uintptr_t{15};
  if (a1 < a0) a1 = a0;
  const int head = static_cast<int>(a0 - ub), tail = static_cast<int>(ue - a1);
  const int words = static_cast<int>((a1 - a0) / 16);
  if (lane < head) sbytes[(ub - base) + lane] = src[lane];
  if (lane >= 16 && lane - 16 < tail) sbytes[(a1 - base) + (lane - 16)] = src[(a1 - ub) + (lane - 16)];
  const auto* gwords = reinterpret_cast<const uint4*>(src + (a0 - ub));
  uint4* swords = stage + (a0 - base) / 16;
#pragma unroll 4
  for (int w = lane; w < words; w += 32) swords[w] = __ldg(gwords + w);
  return static_cast<int>(ub - base);
}

// Any block codec: each lane decodes 16-element groups with the exact codec, then dots them.
template <typename Codec>
struct GroupLanes {
  static constexpr int kElems = Codec::kElems, kBytes = Codec::kBytes;
  static constexpr int kChunkBlocks = Codec::kElems == 32 ? 32 : 4;  // 64 groups: 2 per lane
};

template <typename Kind>
struct Staged {
  static constexpr int kWords = (15 + Kind::kChunkBlocks * Kind::kBytes + 15) / 16;
  struct Smem {
    uint4 w[kWords];
  };
  template <int NT>
  __device__ static void row_dot(const Args& a, int64_t row, int part, int lane, Smem& sm, float (&acc)[NT]) {
    const uint8_t* rowp = a.w + row * a.rb;
    const int64_t blocks = a.cols / Kind::kElems;
    const int64_t chunks = (blocks + Kind::kChunkBlocks - 1) / Kind::kChunkBlocks;
    const auto* sbytes = reinterpret_cast<const uint8_t*>(sm.w);
    for (int64_t ch = part; ch < chunks; ch += a.split) {
      const int64_t first = ch * Kind::kChunkBlocks;
      const int nb = static_cast<int>(blocks - first < Kind::kChunkBlocks ? blocks - first : Kind::kChunkBlocks);
      const int off = stage_bytes(rowp + first * Kind::kBytes, nb * Kind::kBytes, sm.w, lane);
      __syncwarp();
      using Codec = typename Kind::Codec;
      constexpr int kGroups = Codec::kElems / kGroup;
      for (int g = lane; g < nb * kGroups; g += 32) {
        float w[kGroup];
        Codec::decode(sbytes + off + (g / kGroups) * Codec::kBytes, g % kGroups, w);
        dot16<NT>(a, first * Codec::kElems + int64_t{g} * kGroup, w, acc);
      }
      __syncwarp();  // the stage is refilled next
    }
  }
};

template <typename C>
struct Generic : GroupLanes<C> {
  using Codec = C;
};

// The 256-element split forms (weight_form.h): a lane a 16-element group at a time, its codes 16-byte loads
// straight from global memory (the bodies are aligned), its scales from the row's scale array. F::group
// decodes group g of block b of the row at rowp (of `blocks` blocks).
template <typename F>
struct SplitGroupRows {
  struct Smem {};
  template <int NT>
  __device__ static void row_dot(const Args& a, int64_t row, int part, int lane, Smem& /*unused*/,
                                 float (&acc)[NT]) {
    constexpr int kGroups = 256 / kGroup;
    const uint8_t* rowp = a.w + row * a.rb;
    const int64_t blocks = a.cols / 256;
    for (int64_t i = int64_t{part} * 32 + lane; i < blocks * kGroups; i += int64_t{a.split} * 32) {
      float w[kGroup];
      F::group(rowp, blocks, i / kGroups, static_cast<int>(i % kGroups), w);
      dot16<NT>(a, i * kGroup, w, acc);
    }
  }
};

// q6_K: the group's 16 ql and 16 qh bytes, its d from the row's d array.
struct Q6Group {
  __device__ static void group(const uint8_t* rowp, int64_t blocks, int64_t b, int g, float (&w)[kGroup]) {
    const uint8_t* body = rowp + b * kQ6Body;
    const uint4 ql = __ldg(reinterpret_cast<const uint4*>(body + Q6_K::ql_offset(g)));
    const uint4 qh = __ldg(reinterpret_cast<const uint4*>(body + Q6_K::qh_offset(g)));
    const float dsc = Q6_K::group_scale(body, load_u16(rowp + q6k_d_offset(blocks, b)), g);
    Q6_K::decode_group(reinterpret_cast<const uint8_t*>(&ql), reinterpret_cast<const uint8_t*>(&qh), g, dsc, w);
  }
};

// q2_K: the group's 16 qs bytes and scale byte, the block's (d, dmin) from the row's array.
struct Q2Group {
  __device__ static void group(const uint8_t* rowp, int64_t blocks, int64_t b, int g, float (&w)[kGroup]) {
    const uint8_t* body = rowp + b * kQ2Body;
    const uint4 qs = __ldg(reinterpret_cast<const uint4*>(body + Q2_K::qs_offset(g)));
    const uint32_t dm = load_u32(rowp + q2k_dm_offset(blocks, b));
    Q2_K::decode_group(reinterpret_cast<const uint8_t*>(&qs), __ldg(body + g), dm, g, w);
  }
};

// The 32-element split forms (weight_form.h: q8_0, q4_0): a lane a 16-element half block at a time, its codes one
// 16-byte load straight from global memory, its d from the row's scale array. F::half decodes half h of a block
// from its body and d.
struct Q80Half {
  static constexpr int kBody = kQ80Body;
  __device__ static void half(const uint8_t* body, int h, float d, float (&w)[kGroup]) {
    const uint4 q = __ldg(reinterpret_cast<const uint4*>(body + kGroup * h));
    Q8_0::decode_group(reinterpret_cast<const uint8_t*>(&q), d, w);
  }
};
struct Q40Half {
  static constexpr int kBody = kQ40Body;
  __device__ static void half(const uint8_t* body, int h, float d, float (&w)[kGroup]) {
    const uint4 q = __ldg(reinterpret_cast<const uint4*>(body));  // the low (h = 0) or high nibbles
    Q4_0::decode_group(reinterpret_cast<const uint8_t*>(&q), h, d, w);
  }
};

template <typename F>
struct Block32Rows {
  struct Smem {};
  template <int NT>
  __device__ static void row_dot(const Args& a, int64_t row, int part, int lane, Smem& /*unused*/,
                                 float (&acc)[NT]) {
    const uint8_t* rowp = a.w + row * a.rb;
    const int64_t blocks = a.cols / 32;
    for (int64_t i = int64_t{part} * 32 + lane; i < 2 * blocks; i += int64_t{a.split} * 32) {
      const int64_t b = i / 2;
      float w[kGroup];
      F::half(rowp + b * F::kBody, static_cast<int>(i % 2),
              fp16_to_f32(load_u16(rowp + split_d_offset(blocks, F::kBody, b))), w);
      dot16<NT>(a, i * kGroup, w, acc);
    }
  }
};

// ---- The kernel ----

template <typename Policy, int NT>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const Args a) {
  pdl_begin();
  __shared__ typename Policy::Smem stage[kWarps];
  __shared__ float partial[kWarps][NT];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t row = int64_t{blockIdx.x} * (kWarps / a.split) + warp / a.split;
  const int part = warp % a.split;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  if (row < a.rows) Policy::template row_dot<NT>(a, row, part, lane, stage[warp], acc);
  gemv_common::store_row<NT>(acc, partial, warp, lane, part, a.split, a.n, row < a.rows ? a.y : nullptr, a.rows, row);
}

template <typename Policy>
cudaError_t launch(const Args& a, cudaStream_t stream) {
  unsigned g = 0;
  if (!gemv_common::grid_for_rows(a.rows, a.split, &g)) return cudaErrorInvalidValue;
  return gemv_common::for_token_count(a.n, [&](auto nt) {
    launch_pdl(gemv_kernel<Policy, decltype(nt)::value>, dim3(g), dim3(kThreads), 0, stream, a);
  });
}

// Elements a block of each type the GEMV takes (a row's bytes: device_row_bytes, weight_form.h).
struct Layout {
  uint32_t id;
  int64_t elems;
};
constexpr Layout kLayouts[] = {
    {kF32, 1},    {kF16, 1},    {kBF16, 1},   {kQ4_0, 32},  {kQ4_1, 32},  {kQ5_0, 32},  {kQ5_1, 32},
    {kQ8_0, 32},  {kQ2_K, 256}, {kQ3_K, 256}, {kQ4_K, 256}, {kQ5_K, 256}, {kQ6_K, 256}, {kQ8_K, 256},
};

const Layout* find_layout(uint32_t id) {
  for (const auto& l : kLayouts)
    if (l.id == id) return &l;
  return nullptr;
}

// True when gemv16_kernel takes the product: f16/bf16, W, its rows and x's rows 16-byte aligned.
bool use16(uint32_t type, const void* w, const float* x, int64_t cols) {
  return (type == kF16 || type == kBF16) && is_aligned(w, 16) && is_aligned(x, 16) && cols % 8 == 0;
}

// gemv16_kernel over parts (use16 holds for each), split 0 picked from their total rows.
cudaError_t launch16_parts(uint32_t type, const GemvPart* parts, int n_parts, int64_t cols, const float* x, int n,
                           int split, cudaStream_t stream) {
  Args16 a{};
  a.cols = cols;
  a.rb = cols * 2;
  a.x = x;
  a.n = n;
  int64_t total = 0;
  for (int i = 0; i < n_parts; ++i) {
    if (parts[i].rows == 0) continue;
    a.parts[a.n_parts++] = Part16{static_cast<const uint8_t*>(parts[i].w), parts[i].y, parts[i].rows};
    total += parts[i].rows;
  }
  if (total == 0) return cudaSuccess;
  a.split = split != 0 ? split : gemv16_auto_split(total);
  return type == kF16 ? launch16<kF16>(a, stream) : launch16<kBF16>(a, stream);
}

template <uint32_t kType>
cudaError_t launch_plain(const Args& a, cudaStream_t stream) {
  constexpr int V = PlainT<kType>::kVec;
  if constexpr (kType != kF32)
    if (use16(kType, a.w, a.x, a.cols)) {
      const GemvPart part{a.w, a.rows, a.y};
      return launch16_parts(kType, &part, 1, a.cols, a.x, a.n, a.split, stream);
    }
  if (is_aligned(a.w, 16) && a.rb % 16 == 0 && a.x_vec && a.cols % V == 0)
    return launch<Plain<kType, true>>(a, stream);
  return launch<Plain<kType, false>>(a, stream);
}

}  // namespace

bool gemv_supported(DType type) { return find_layout(static_cast<uint32_t>(type)) != nullptr; }

int gemv_auto_split(int64_t rows) {
  // Aim for at least 32 warps per multiprocessor.
  const int64_t want = int64_t{32} * current_sm_count();
  if (rows >= want) return 1;
  if (2 * rows >= want) return 2;
  return 4;
}

int gemv16_auto_split(int64_t rows) {
  // Whole rows a warp from 16 rows per multiprocessor (at one token, 4096 rows of 4096..12288 columns
  // took 4-9 % longer at split 2 than at 1 on an H100).
  const int64_t want = int64_t{16} * current_sm_count();
  if (rows >= want) return 1;
  if (2 * rows >= want) return 2;
  return 4;
}

cudaError_t gemv(DType type, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
                 cudaStream_t stream, int split) {
  const uint32_t id = static_cast<uint32_t>(type);
  const Layout* layout = find_layout(id);
  if (layout == nullptr || rows < 0 || cols < 0 || cols % layout->elems != 0) return cudaErrorInvalidValue;
  if (n < 1 || n > kGemvMaxTokens) return cudaErrorInvalidValue;
  if (split != 0 && split != 1 && split != 2 && split != 4) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (y == nullptr || !is_aligned(y, 4)) return cudaErrorInvalidValue;
  if (rows > INT64_MAX / n / 4) return cudaErrorInvalidValue;
  if (cols == 0) return cudaMemsetAsync(y, 0, static_cast<size_t>(n * rows) * sizeof(float), stream);
  if (w == nullptr || x == nullptr || !is_aligned(x, 4)) return cudaErrorInvalidValue;
  const int64_t rb = device_row_bytes(type, cols);  // weight_form.h
  if (rb <= 0 || cols > INT64_MAX / n || rows > INT64_MAX / rb) return cudaErrorInvalidValue;
  if (!is_aligned(w, device_weight_align(type)))
    return cudaErrorInvalidValue;

  Args a{static_cast<const uint8_t*>(w), rows, cols, rb, x, static_cast<int>(n), y, 0, false};
  a.x_vec = is_aligned(x, 16) && cols % 4 == 0;
  a.split = split != 0 ? split : use16(id, w, x, cols) ? gemv16_auto_split(rows) : gemv_auto_split(rows);
  switch (id) {
    case kF32: return launch_plain<kF32>(a, stream);
    case kF16: return launch_plain<kF16>(a, stream);
    case kBF16: return launch_plain<kBF16>(a, stream);
    case kQ4_0: return launch<Block32Rows<Q40Half>>(a, stream);
    case kQ4_1: return launch<Staged<Generic<Q4_1>>>(a, stream);
    case kQ5_0: return launch<Staged<Generic<Q5_0>>>(a, stream);
    case kQ5_1: return launch<Staged<Generic<Q5_1>>>(a, stream);
    case kQ8_0: return launch<Block32Rows<Q80Half>>(a, stream);
    case kQ2_K: return launch<SplitGroupRows<Q2Group>>(a, stream);
    case kQ3_K: return launch<Staged<Generic<Padded<Q3_K, kQ3Stride>>>>(a, stream);  // weight_form.h
    case kQ4_K: return launch<Staged<Generic<Q4_K>>>(a, stream);
    case kQ5_K: return launch<Staged<Generic<Q5_K>>>(a, stream);
    case kQ6_K: return launch<SplitGroupRows<Q6Group>>(a, stream);
    case kQ8_K: return launch<Staged<Generic<Q8_K>>>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

bool gemv16_group_applies(DType type, const void* w, int64_t cols, const float* x) {
  return use16(static_cast<uint32_t>(type), w, x, cols) && w != nullptr && x != nullptr;
}

cudaError_t gemv16_group(DType type, const GemvPart* parts, int n_parts, int64_t cols, const float* x, int64_t n,
                         cudaStream_t stream, int split) {
  if (n_parts < 1 || n_parts > kGemvMaxParts || parts == nullptr || cols <= 0 || n < 1 || n > kGemvMaxTokens)
    return cudaErrorInvalidValue;
  if (split != 0 && split != 1 && split != 2 && split != 4) return cudaErrorInvalidValue;
  int64_t total = 0;
  for (int i = 0; i < n_parts; ++i) {
    const GemvPart& q = parts[i];
    if (q.rows < 0 || total > INT64_MAX - q.rows) return cudaErrorInvalidValue;
    if (q.rows == 0) continue;
    if (!gemv16_group_applies(type, q.w, cols, x) || q.y == nullptr || !is_aligned(q.y, 4) ||
        q.rows > INT64_MAX / n / 4 || cols > INT64_MAX / n || q.rows > INT64_MAX / (2 * cols))
      return cudaErrorInvalidValue;
    total += q.rows;
  }
  return launch16_parts(static_cast<uint32_t>(type), parts, n_parts, cols, x, static_cast<int>(n), split, stream);
}

}  // namespace dflash::cuda

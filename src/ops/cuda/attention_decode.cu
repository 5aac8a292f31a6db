// The decode attention kernel of attention.h's path mode: one-token decode, chain verify (a causal block of
// up to 32 queries without a window) and trees of up to 128 nodes, every query's keys walked as plain
// decoding at its position walks them.
//
// Block (x, y, z) = (query i and row block of its group, KV head, key split); one or two groups of 4 warps.
// A block takes R rows: the heads of query i's group that read this KV head (R = 4, 8 or 16, the group
// rounded up), R / 4 a warp of each group. Its split's keys [kb, ke) are streamed in tiles of 32 keys (16
// for head dims of 256) through a ring of shared-memory stages by cp.async (K and V rows as stored, fp16 or
// float32, rows padded by 16 bytes), a round of one tile per group at a time: while the groups compute round
// r, the next rounds are in flight. Group g takes tiles g, g + 2, ... (two groups where a stage is small, so
// that an SM runs 16 warps of fp16 decode). Per tile, each warp for its rows, with one block barrier a round
// (its stages have landed, and the stages being refilled are free):
//   1. scores, a lane per key (two lanes a key for head dims of 256, each half the dims, added by a
//      shuffle): the lane dots its key's K row (fp16 converted exactly) with the row's query, staged once in
//      shared memory as float32 (broadcast reads; the row padding keeps the lanes' reads of different K rows
//      on distinct banks), in 4 / (R / 4) partial sums;
//   2. online softmax across the warp: tile max by shuffles, running max m, the correction
//      exp(m_old - m_new) applied to the accumulators, p = exp(s - m), a running sum l per lane (summed over
//      the warp at the end);
//   3. P V: p through the warp's shared-memory slots; half-warp h takes the tile's keys h, h + 2, ..., a
//      lane a 16th of the head dim (16-byte V reads for fp16 rows of 128), the two halves added at the end.
// Group 1 then hands its rows' (m, l, acc) to group 0, which combines the two in group order and writes
// o / l (one split) or the partial (o, m, l) that attention.cu's merge_kernel combines.
//
// Queries share no tiles: a verify query's blocks read the whole prefix, as its decode would. Blocks of up
// to 32 / R queries sharing the prefix's tiles were measured (H100, 16 queries, fp16 KV, Qwen3-8B and
// Qwen3.5-27B shapes at 512-32K keys) at 0.5-1.1x the speed of this: a block's float32 arithmetic grows with
// its rows, and it has fewer blocks to run in parallel. On fp16 K/V the backend runs attention_decode_mma.cu
// instead, whose verify queries share tiles on the tensor cores.
//
// Every sum runs in an order fixed by (visible keys, n_splits) only, so a verify query's output equals the
// one-token decode's at its position bit for bit.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/attention_internal.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/warp_reduce.cuh"

namespace dflash::cuda::attn_decode {
namespace {

// NB bytes of shared memory, read in 16-, 8- or 4-byte pieces, as 32-bit words.
template <int NB>
struct Raw {
  uint32_t w[NB / 4];
};

template <int NB>
__device__ __forceinline__ Raw<NB> lds_raw(const char* p) {
  Raw<NB> r;
  if constexpr (NB % 16 == 0) {
#pragma unroll
    for (int i = 0; i < NB / 16; ++i) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i];
      r.w[4 * i] = v.x;
      r.w[4 * i + 1] = v.y;
      r.w[4 * i + 2] = v.z;
      r.w[4 * i + 3] = v.w;
    }
  } else if constexpr (NB == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    r.w[0] = v.x;
    r.w[1] = v.y;
  } else {
    static_assert(NB == 4);
    r.w[0] = *reinterpret_cast<const uint32_t*>(p);
  }
  return r;
}

// The N elements of `r` (fp16 or float32) as floats.
template <bool F16, int N>
__device__ __forceinline__ void to_floats(const Raw<N*(F16 ? 2 : 4)>& r, float* out) {
  if constexpr (F16) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&r.w[i]));
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = __uint_as_float(r.w[i]);
  }
}

constexpr int kWarps = 4;  // warps of a group: a group computes one tile at a time

template <int HD, int R, bool F16>
struct Smem {
  // Keys a tile: 32 (a lane per key), 16 for rows of 256 (two lanes a key, each half the head dim), so
  // that a stage of fp16 rows of 256 is as small as one of 128 and an SM runs 16 warps of it.
  static constexpr int kTile = HD >= 256 ? 16 : 32;
  static constexpr int kKeyLanes = 32 / kTile;
  static constexpr int kEs = F16 ? 2 : 4;
  static constexpr int kRowBytes = HD * kEs;
  static constexpr int kPieces = kRowBytes / 16;  // 16-byte pieces of a K or V row
  static constexpr int kStride = kRowBytes + 16;  // bytes between rows of a stage (bank spread)
  static constexpr int kStageBytes = 2 * kTile * kStride;  // K rows, then V rows
  // Groups of kWarps warps a block: group g computes the tiles k = g (mod kGroups). Two where a stage is
  // small (fp16 rows of 128, rows of 64), so that two blocks of 8 warps fit an SM with 3 rounds in the ring;
  // one otherwise (2-3 stages, two blocks an SM).
  static constexpr int kGroups = kStageBytes <= 18 * 1024 ? 2 : 1;
  static constexpr int kThreads = 32 * kWarps * kGroups;
  static constexpr int kRoundBytes = kGroups * kStageBytes;  // a round: one tile for each group
  static_assert(kRoundBytes <= 72 * 1024, "two rounds of the largest stage fit");
  // Everything but the ring: float q [R][HD]; group 1's (m, l) [R][2] and acc [R][HD]; p [groups][R][kTile];
  // the path, int32 [1 + 128].
  static constexpr size_t kFixedBytes = sizeof(float) * R * HD + sizeof(float) * R * 2 +
                                        (kGroups > 1 ? sizeof(float) * R * HD : 0) +
                                        sizeof(float) * kGroups * R * kTile + sizeof(int32_t) * (1 + kMaxPathQueries);
  // Rounds in the ring: 3 where a round is small and they fit beside two blocks an SM, else 2.
  static constexpr int kRounds = kRoundBytes <= 40 * 1024 && kFixedBytes + 3 * kRoundBytes <= 113 * 1024 ? 3 : 2;
  static constexpr int kStages = kGroups * kRounds;
  static constexpr size_t kQ = 0;                                           // float [R][HD]
  static constexpr size_t kStage0 = sizeof(float) * R * HD;                 // 16-byte aligned
  static constexpr size_t kMl = kStage0 + size_t{kStages} * kStageBytes;    // float [R][2]: group 1's (m, l)
  static constexpr size_t kAcc = kMl + sizeof(float) * R * 2;               // float [R][HD]: group 1's acc
  static constexpr size_t kP = kAcc + (kGroups > 1 ? sizeof(float) * R * HD : 0);  // float [groups][R][kTile]: p
  static constexpr size_t kPath = kP + sizeof(float) * kGroups * R * kTile;         // int32 [1 + 128]
  static constexpr size_t kBytes = kPath + sizeof(int32_t) * (1 + kMaxPathQueries);
  static_assert(kBytes == size_t{kStages} * kStageBytes + kFixedBytes);
};

template <int HD, int R, bool F16>
__global__ void __launch_bounds__(Smem<HD, R, F16>::kThreads) decode_kernel(Params p) {
  pdl_begin();
  using S = Smem<HD, R, F16>;
  constexpr int kGroups = S::kGroups, kThreads = S::kThreads;
  constexpr int RW = R / kWarps;             // rows a warp: row g = warp + kWarps * rr
  constexpr int P = 4 / RW;                  // partial sums a score
  constexpr int kPerPiece = 16 / S::kEs;     // elements of a 16-byte piece
  constexpr int kDims = HD / 16;             // a lane's slice of a V row (half-warps take alternate keys)
  constexpr int kTile = S::kTile;
  constexpr int kHalfPieces = S::kPieces / S::kKeyLanes;  // 16-byte pieces of a K row a lane dots
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  float* q_s = reinterpret_cast<float*>(smem + S::kQ);
  char* stages = smem + S::kStage0;
  int32_t* path_s = reinterpret_cast<int32_t*>(smem + S::kPath);  // [0]: depth; [1 + d]: slot at depth d

  const int tid = threadIdx.x, lane = tid % 32, warp = (tid / 32) % kWarps, group = tid / (32 * kWarps);
  const int kvh = blockIdx.y, split = blockIdx.z;
  const int64_t i = blockIdx.x / p.blocks_per_query;
  const int sub = static_cast<int>(blockIdx.x % p.blocks_per_query);
  const int h0 = kvh * p.group + sub * kMaxRows;  // the block's rows: heads h0 .. h0 + nr - 1 of query i
  const int nr = std::min(int{kMaxRows}, p.group - sub * kMaxRows);
  int64_t n_prefix = p.n_prefix, n_tokens = p.n_tokens;
  if (p.lengths != nullptr) {
    n_prefix = p.lengths[0];
    n_tokens = p.lengths[1];
  }

  // The query's depth (chain: its index) and, for a tree, the slots of its path from the root.
  if (tid == 0) {
    int32_t depth = static_cast<int32_t>(i);
    if (p.tree) {  // a malformed parent (parents[a] >= a) ends the walk rather than loop
      depth = 0;
      for (int64_t a = i; p.parents[a] >= 0 && p.parents[a] < a; a = p.parents[a]) ++depth;
      int32_t d = depth;
      for (int64_t a = i;; a = p.parents[a]) {
        path_s[1 + d] = static_cast<int32_t>(a);
        if (d-- == 0) break;
      }
    }
    path_s[0] = depth;
  }
  for (int e = tid; e < R * HD; e += kThreads) {
    const int r = e / HD, d = e % HD;
    q_s[e] = r < nr ? p.q[(i * p.n_heads + h0 + r) * HD + d] : 0.0f;
  }
  __syncthreads();
  // Virtual keys [0, n_prefix + depth]: key n_prefix + e is the path's node at depth e (a chain's slot e).
  const int64_t kend = std::min<int64_t>(n_tokens, n_prefix + path_s[0] + 1);
  const int64_t kps = decode_keys_per_split(kend, p.n_splits, kTile);
  const int64_t kb = split * kps;
  const int64_t ke = std::min<int64_t>(kend, kb + kps);
  const int n_tiles = ke > kb ? static_cast<int>((ke - kb + kTile - 1) / kTile) : 0;
  const int n_rounds = (n_tiles + kGroups - 1) / kGroups;

  // Round r's tiles (kGroups r + g) K and V rows -> stages (kGroups r + g) % kStages (keys past ke are not
  // copied, and never read). A thread takes one row of one tile (kThreadsPerRow threads a row, interleaved
  // 16-byte pieces), so it finds the row's chunk once a round.
  constexpr int kThreadsPerRow = kThreads / (kGroups * 2 * kTile);
  const int copy_row = tid / kThreadsPerRow, copy_part = tid % kThreadsPerRow;
  const int copy_g = copy_row / (2 * kTile), copy_kv = copy_row / kTile % 2, copy_t = copy_row % kTile;
  const float* const* copy_chunks = copy_kv == 0 ? p.k_chunks : p.v_chunks;
  auto issue = [&](int r) {
    const int k = kGroups * r + copy_g;
    const int64_t j = kb + static_cast<int64_t>(k) * kTile + copy_t;
    if (j >= ke) return;
    const int64_t pj = p.tree && j >= n_prefix ? n_prefix + path_s[1 + (j - n_prefix)] : j;
    const int64_t ch = p.chunk_shift >= 0 ? pj >> p.chunk_shift : pj / p.chunk_tokens;
    const int64_t off = ((pj - ch * p.chunk_tokens) * p.n_kv_heads + kvh) * HD;
    const char* src = reinterpret_cast<const char*>(copy_chunks[ch]) + off * S::kEs;
    char* dst = stages + (k % S::kStages) * S::kStageBytes + (copy_kv * kTile + copy_t) * S::kStride;
#pragma unroll
    for (int c = copy_part; c < S::kPieces; c += kThreadsPerRow) cp_async16(dst + 16 * c, src + 16 * c);
  };
#pragma unroll
  for (int r = 0; r < S::kRounds - 1; ++r) {
    if (r < n_rounds) issue(r);
    cp_async_commit();
  }

  float m[RW], l[RW], acc[RW][kDims];
#pragma unroll
  for (int rr = 0; rr < RW; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int d = 0; d < kDims; ++d) acc[rr][d] = 0.0f;
  }
  const bool busy = warp < nr;  // the warp has a row (rows past nr are never written)
  float* p_w = reinterpret_cast<float*>(smem + S::kP) + (group * kWarps + warp) * RW * kTile;  // [RW][kTile]
  const int key = lane % kTile, half = lane / kTile;  // the lane's key of a tile, and its part of the row
  for (int rd = 0; rd < n_rounds; ++rd) {
    cp_async_wait<S::kRounds - 2>();  // this thread's copies of round rd have landed
    __syncthreads();                  // everyone's have; and every warp is done with round rd - 1's stages
    if (rd + S::kRounds - 1 < n_rounds) issue(rd + S::kRounds - 1);
    cp_async_commit();
    const int k = kGroups * rd + group;
    if (!busy || k >= n_tiles) continue;
    const char* st = stages + (k % S::kStages) * S::kStageBytes;
    const int nv = static_cast<int>(std::min<int64_t>(kTile, ke - (kb + static_cast<int64_t>(k) * kTile)));
    // 1. Scores, a lane per key (two for rows of 256: pieces [half kHalfPieces, + kHalfPieces) each, the two
    //    halves added by a shuffle): P partial sums a row (dim c P + e goes to sum e), added pairwise at the end.
    float s[RW];
    {
      float sp[RW][P];
#pragma unroll
      for (int rr = 0; rr < RW; ++rr)
#pragma unroll
        for (int e = 0; e < P; ++e) sp[rr][e] = 0.0f;
      if (key < nv) {
        const char* krow = st + key * S::kStride;
#pragma unroll 4
        for (int c = half * kHalfPieces; c < (half + 1) * kHalfPieces; ++c) {
          const Raw<16> raw = lds_raw<16>(krow + 16 * c);
          float kf[kPerPiece];
          to_floats<F16, kPerPiece>(raw, kf);
#pragma unroll
          for (int rr = 0; rr < RW; ++rr) {
            const float4* qr = reinterpret_cast<const float4*>(q_s + (warp + kWarps * rr) * HD + c * kPerPiece);
#pragma unroll
            for (int e4 = 0; e4 < kPerPiece / 4; ++e4) {
              const float4 x = qr[e4];
              sp[rr][(4 * e4) % P] = fmaf(x.x, kf[4 * e4], sp[rr][(4 * e4) % P]);
              sp[rr][(4 * e4 + 1) % P] = fmaf(x.y, kf[4 * e4 + 1], sp[rr][(4 * e4 + 1) % P]);
              sp[rr][(4 * e4 + 2) % P] = fmaf(x.z, kf[4 * e4 + 2], sp[rr][(4 * e4 + 2) % P]);
              sp[rr][(4 * e4 + 3) % P] = fmaf(x.w, kf[4 * e4 + 3], sp[rr][(4 * e4 + 3) % P]);
            }
          }
        }
      }
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        if constexpr (P == 4) s[rr] = (sp[rr][0] + sp[rr][1]) + (sp[rr][2] + sp[rr][3]);
        else if constexpr (P == 2) s[rr] = sp[rr][0] + sp[rr][1];
        else s[rr] = sp[rr][0];
        if constexpr (S::kKeyLanes == 2) s[rr] += __shfl_xor_sync(0xffffffffu, s[rr], 16);  // both lanes: same bits
      }
    }
    // 2. Online softmax.
    float pr[RW];
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) {
      const float sc = key < nv ? s[rr] * p.scale : -INFINITY;
      const float m_new = fmaxf(m[rr], warp_max(sc));
      const float corr = m[rr] == -INFINITY ? 0.0f : expf(m[rr] - m_new);
      pr[rr] = key < nv ? expf(sc - m_new) : 0.0f;
      l[rr] = l[rr] * corr + (half == 0 ? pr[rr] : 0.0f);  // a key's p counted once
      m[rr] = m_new;
#pragma unroll
      for (int d = 0; d < kDims; ++d) acc[rr][d] *= corr;
    }
    // 3. acc += P V: p through the warp's shared-memory slots; half-warp h takes keys h, h + 2, ..., a lane
    //    a 16th of the head dim (the halves are added at the end).
#pragma unroll
    for (int rr = 0; rr < RW; ++rr)
      if (half == 0) p_w[rr * kTile + key] = pr[rr];
    __syncwarp();
    const char* vbase = st + kTile * S::kStride + (lane % 16) * kDims * S::kEs;
#pragma unroll 4
    for (int t = lane / 16; t < nv; t += 2) {
      const Raw<kDims * S::kEs> raw = lds_raw<kDims * S::kEs>(vbase + t * S::kStride);
      float vf[kDims];
      to_floats<F16, kDims>(raw, vf);
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        const float pt = p_w[rr * kTile + t];
#pragma unroll
        for (int d = 0; d < kDims; ++d) acc[rr][d] = fmaf(pt, vf[d], acc[rr][d]);
      }
    }
    __syncwarp();  // p_w is rewritten by the next tile
  }
  cp_async_wait<0>();  // nothing outstanding at exit

  // With two groups, group 1 hands its rows' (m, l, acc) to group 0, which combines the two in group order;
  // then o / l, or the split's partial.
  float* ml_s = reinterpret_cast<float*>(smem + S::kMl);
  float* acc_s = reinterpret_cast<float*>(smem + S::kAcc);
  static_assert(kGroups == 1 || kGroups == 2);
  const int dl = lane % 16;  // lanes 0-15 hold the rows' outputs from here: dims [dl kDims, (dl + 1) kDims)
#pragma unroll
  for (int rr = 0; rr < RW; ++rr) {
    l[rr] = warp_sum(l[rr]);
#pragma unroll
    for (int d = 0; d < kDims; ++d) acc[rr][d] += __shfl_xor_sync(0xffffffffu, acc[rr][d], 16);
  }
  if (kGroups == 2 && group == 1) {
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) {
      const int g = warp + kWarps * rr;
      if (lane == 0) {
        ml_s[2 * g] = m[rr];
        ml_s[2 * g + 1] = l[rr];
      }
      if (lane < 16) {
#pragma unroll
        for (int d = 0; d < kDims; ++d) acc_s[g * HD + dl * kDims + d] = acc[rr][d];
      }
    }
  }
  if constexpr (kGroups == 2) {
    __syncthreads();
    if (group == 1) return;
  }
#pragma unroll
  for (int rr = 0; rr < RW && kGroups == 2; ++rr) {
    const int g = warp + kWarps * rr;
    const float m1 = ml_s[2 * g], M = fmaxf(m[rr], m1);
    const float f0 = m[rr] == -INFINITY ? 0.0f : expf(m[rr] - M), f1 = m1 == -INFINITY ? 0.0f : expf(m1 - M);
    l[rr] = l[rr] * f0 + ml_s[2 * g + 1] * f1;
    m[rr] = M;
#pragma unroll
    for (int d = 0; d < kDims; ++d) acc[rr][d] = acc[rr][d] * f0 + acc_s[g * HD + dl * kDims + d] * f1;
  }
  const int64_t n_rows = p.n_q * p.n_heads;
#pragma unroll
  for (int rr = 0; rr < RW; ++rr) {
    const int g = warp + kWarps * rr;
    if (g >= nr || lane >= 16) continue;
    const float L = l[rr];
    const int64_t row = i * p.n_heads + h0 + g;
    if (p.n_splits == 1) {
      const float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
      for (int d = 0; d < kDims; ++d) p.out[row * HD + dl * kDims + d] = acc[rr][d] * inv;
    } else {
      const int64_t prow = split * n_rows + row;
#pragma unroll
      for (int d = 0; d < kDims; ++d) p.part_acc[prow * HD + dl * kDims + d] = acc[rr][d];
      if (lane == 0) {
        p.part_ml[2 * prow] = m[rr];
        p.part_ml[2 * prow + 1] = L;
      }
    }
  }
}

template <int HD, int R, bool F16>
cudaError_t launch_r(const Params& p, cudaStream_t stream) {
  using S = Smem<HD, R, F16>;
  static_assert(S::kBytes <= 227 * 1024);
  if (const cudaError_t err = allow_dynamic_smem<decode_kernel<HD, R, F16>>(S::kBytes); err != cudaSuccess)
    return err;
  const dim3 grid(static_cast<unsigned>(p.n_q * p.blocks_per_query), static_cast<unsigned>(p.n_kv_heads),
                  static_cast<unsigned>(p.n_splits));
  launch_pdl(decode_kernel<HD, R, F16>, grid, dim3(S::kThreads), S::kBytes, stream, p);
  return cudaGetLastError();
}

template <int HD, bool F16>
cudaError_t launch_hd(const Params& p, cudaStream_t stream) {
  const int rows = std::min(int{kMaxRows}, p.group);
  if (rows <= 4) return launch_r<HD, 4, F16>(p, stream);
  if (rows <= 8) return launch_r<HD, 8, F16>(p, stream);
  return launch_r<HD, 16, F16>(p, stream);
}

template <bool F16>
cudaError_t launch_f(const Params& p, int head_dim, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return launch_hd<64, F16>(p, stream);
    case 128: return launch_hd<128, F16>(p, stream);
    case 256: return launch_hd<256, F16>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

Tuning& tuning() {
  static Tuning t;
  return t;
}

int split_factor(int64_t head_dim) {
  if (tuning().split_factor > 0) return tuning().split_factor;
  return head_dim >= 256 ? 1 : 2;
}

cudaError_t launch(const Params& p, int head_dim, cudaStream_t stream) {
  return p.kv_f16 ? launch_f<true>(p, head_dim, stream) : launch_f<false>(p, head_dim, stream);
}

}  // namespace dflash::cuda::attn_decode

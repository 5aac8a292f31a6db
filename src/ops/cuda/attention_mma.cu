// The tensor-core prefill kernel of attention.h (FlashAttention-2 style), launched by attention.cu for
// calls of more than 32 queries with a kCausal (with or without a sliding window) or kFull mask.
//
// Block: 8 warps, 128 rows = (query, head-of-group) pairs of one KV head, query-major, so one K/V tile in
// shared memory serves the whole GQA group; warp w owns rows [16 w, 16 w + 16). Grid (row blocks, KV heads,
// key splits), the row blocks in reverse so that a causal call's longest blocks start first.
// Q (times scale * log2(e), so that scores come out in base-2 units) is staged once as f16 in shared memory.
// Per tile of BN keys (64; 32 at head_dim 256):
//   1. K and V rows of the next tile into the other half of a double buffer. fp16 KV: cp.async from the chunk
//      table, waited for at the end of the tile (no registers held: two blocks an SM at head_dim 128). fp32
//      KV: float4 loads into registers, converted to f16 (round to nearest) and stored once this tile no
//      longer needs the registers (head_dim 128: both at the end of the tile; 64, 256: K after step 2, V
//      after step 4). Rows are padded by 16 bytes so ldmatrix's eight 16-byte row reads hit distinct banks;
//   2. S = Q K^T: mma.sync m16n8k16 (f16 inputs, f32 accumulators), A fragments of Q and B fragments of K
//      by ldmatrix;
//   3. masked to -inf where a tile crosses the causal diagonal, the window or the key range; online softmax
//      in f32 per row (the 4 threads of a quad share a row; mma_f16.cuh): running max m, correction
//      2^(m_old - m_new) (exactly 1 when the max does not move), p = 2^(s - m_new), a per-thread partial of
//      the running sum;
//   4. O = O * corr + P V: P rounded to f16 straight from the S accumulators (the C layout of two n8 tiles
//      is the A layout of one k16 step), V's B fragments by ldmatrix.trans, f32 accumulators.
// One __syncthreads a tile. With one split the block writes O / l (0 for a row that saw no key); with
// several it writes attn_kernel's partials (O, m in natural-log units, l) for merge_kernel. Sums run in a
// fixed order: the same call gives the same bits.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/attention_internal.h"
#include "ops/cuda/attention_prefill.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mma_f16.cuh"

namespace dflash::cuda::attn_mma {
namespace {

constexpr int kWarps = kRowsPerBlock / 16;
constexpr int kThreads = 32 * kWarps;

template <int HD, int BN>
struct Shape {
  static_assert(HD % 16 == 0 && BN % 16 == 0);
  static constexpr int BM = kRowsPerBlock;
  static constexpr int LD = HD + 8;  // halves per shared row: +16 bytes, conflict-free ldmatrix
  // head_dim 128: the next tile's K and V are loaded together, a whole tile ahead of their use; at 64 (two
  // blocks an SM, 128 registers) and 256 (255 registers) the registers hold one of them at a time (K during
  // Q K^T, V during P V).
  static constexpr bool kLoadBoth = HD == 128;
  static constexpr int kQ = 0;  // offsets in halves
  static constexpr int kK = kQ + BM * LD;
  static constexpr int kV = kK + 2 * BN * LD;
  static constexpr int kEnd = kV + 2 * BN * LD;
  static constexpr size_t kBytes = sizeof(__half) * kEnd;
  static constexpr int kC4 = HD / 4;              // float4 columns of a row
  static constexpr int kRowStep = kThreads / kC4;  // rows a pass of the block covers
  static_assert(kThreads % kC4 == 0 && BN % kRowStep == 0);
  static constexpr int kLoads = BN / kRowStep;  // float4 per thread per K (or V) tile
  static constexpr int kC8 = HD / 8;                 // 16-byte f16 columns of a row (fp16 KV's cp.async)
  static constexpr int kRowStep8 = kThreads / kC8;
  static_assert(kThreads % kC8 == 0 && BN % kRowStep8 == 0);
  static constexpr int kCopies = BN / kRowStep8;  // cp.async per thread per K (or V) tile
};

// Blocks an SM: fp16 KV at head_dim 128 stages its tiles by cp.async, which holds no registers, so two blocks
// fit at 128 registers a thread.
template <int HD, bool F16>
constexpr int min_blocks() {
  return HD <= 64 || (HD == 128 && F16) ? 2 : 1;
}

// fp32 KV: this thread's four-element groups of keys [j0, j0 + BN) (zeros at and past ke) of one KV head, into
// registers. The loads are volatile asm so that they stay where they are issued, ahead of the tile's
// arithmetic, and the registers are not touched before store_tile.
template <int HD, int BN>
__device__ __forceinline__ void load_tile(const Params& p, const float* const* chunks, int kvh, int j0, int ke,
                                          float4 (&st)[Shape<HD, BN>::kLoads]) {
  using S = Shape<HD, BN>;
  const int c4 = threadIdx.x % S::kC4, t0 = threadIdx.x / S::kC4;
#pragma unroll
  for (int k = 0; k < S::kLoads; ++k) {
    const int j = j0 + t0 + k * S::kRowStep;
    if (j < ke) {
      int c;
      const int64_t off = kv_offset<HD>(p, j, kvh, 4 * c4, c);
      st[k] = ldg_nc4(chunks[c] + off);
    } else {
      st[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
}

// The registers of load_tile, rounded to f16, to a [BN][LD] buffer.
template <int HD, int BN>
__device__ __forceinline__ void store_tile(__half* buf, const float4 (&st)[Shape<HD, BN>::kLoads]) {
  using S = Shape<HD, BN>;
  const int c4 = threadIdx.x % S::kC4, t0 = threadIdx.x / S::kC4;
#pragma unroll
  for (int k = 0; k < S::kLoads; ++k) {
    const int t = t0 + k * S::kRowStep;
    *reinterpret_cast<uint2*>(buf + t * S::LD + 4 * c4) =
        make_uint2(pack_half2(st[k].x, st[k].y), pack_half2(st[k].z, st[k].w));
  }
}

// fp16 KV: keys [j0, j0 + BN) (zeros at and past ke) of one KV head copied into a [BN][LD] buffer by cp.async,
// in the thread's current commit group.
template <int HD, int BN>
__device__ __forceinline__ void copy_tile(const Params& p, const float* const* chunks, int kvh, int j0, int ke,
                                          __half* buf) {
  using S = Shape<HD, BN>;
  const int c8 = threadIdx.x % S::kC8, t0 = threadIdx.x / S::kC8;
#pragma unroll
  for (int k = 0; k < S::kCopies; ++k) {
    const int t = t0 + k * S::kRowStep8, j = j0 + t;
    const bool in = j < ke;
    int c;
    const int64_t off = kv_offset<HD>(p, in ? j : j0, kvh, 8 * c8, c);  // j0: a valid address when nothing is read
    cp_async16_zfill(buf + t * S::LD + 8 * c8, reinterpret_cast<const __half*>(chunks[c]) + off, in);
  }
}

template <int HD, int BN, bool F16>
__global__ void __launch_bounds__(kThreads, min_blocks<HD, F16>()) attn_mma_kernel(const Params p) {
  using S = Shape<HD, BN>;
  extern __shared__ uint4 smem_u4[];
  __half* smem = reinterpret_cast<__half*>(smem_u4);
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  __half* Qs = smem + S::kQ;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const BlockRows r = block_rows<BN>(p);
  const int kvh = r.kvh, group = p.group, row0 = r.row0, row_end = r.row_end, kb = r.kb, ke = r.ke;
  const int n_tiles = r.n_tiles;

  // Q rows * scale * log2(e) -> f16 in shared memory.
  for (int e = tid; e < S::BM * S::kC4; e += kThreads) {
    const int row = e / S::kC4, c4 = e % S::kC4;
    const float4 v = scaled_q4<HD>(p, r, row, c4);
    *reinterpret_cast<uint2*>(Qs + row * S::LD + 4 * c4) = make_uint2(pack_half2(v.x, v.y), pack_half2(v.z, v.w));
  }
  // fp32 KV: the next tile through registers (converted to f16 on the way); fp16 KV: cp.async, no registers.
  float4 st[F16 ? 1 : S::kLoads];                       // K's next tile (or K's, then V's)
  float4 stv[S::kLoadBoth && !F16 ? S::kLoads : 1];  // V's next tile (kLoadBoth)
  if (n_tiles > 0) {
    if constexpr (F16) {
      copy_tile<HD, BN>(p, p.k_chunks, kvh, kb, ke, smem + S::kK);
      copy_tile<HD, BN>(p, p.v_chunks, kvh, kb, ke, smem + S::kV);
      cp_async_commit();
      cp_async_wait<0>();
    } else {
      load_tile<HD, BN>(p, p.k_chunks, kvh, kb, ke, st);
      store_tile<HD, BN>(smem + S::kK, st);
      load_tile<HD, BN>(p, p.v_chunks, kvh, kb, ke, st);
      store_tile<HD, BN>(smem + S::kV, st);
    }
  }
  __syncthreads();

  // This thread's rows (C fragments: rows quad and quad + 8 of the warp's 16) and their queries; a row past
  // row_end takes the last valid row's query (never written).
  const int quad = lane >> 2, qc = lane & 3;
  const int ra = warp * 16 + quad;
  const int ia = min(row0 + ra, row_end - 1) / group, ib = min(row0 + ra + 8, row_end - 1) / group;
  // ldmatrix: lane L addresses row (L & 7) of matrix L >> 3.
  const int lm_row = lane & 7, lm_mat = lane >> 3;

  // Q A fragments: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
  const uint32_t q_addr =
      sbase + 2u * static_cast<uint32_t>((warp * 16 + lm_row + ((lm_mat & 1) << 3)) * S::LD + ((lm_mat >> 1) << 3));
  // K B fragments of an n-tile pair: (keys 0-7, k 0-7), (keys 0-7, k 8-15), (keys 8-15, k 0-7), (keys 8-15, k 8-15).
  const uint32_t k_off = 2u * static_cast<uint32_t>((lm_row + ((lm_mat >> 1) << 3)) * S::LD + ((lm_mat & 1) << 3));
  // V B fragments (transposed) of a dim-tile pair: (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15),
  // (keys 8-15, d 8-15).
  const uint32_t v_off = 2u * static_cast<uint32_t>((lm_row + ((lm_mat & 1) << 3)) * S::LD + ((lm_mat >> 1) << 3));

  float o[HD / 8][4];
#pragma unroll
  for (int d = 0; d < HD / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;

  for (int t = 0; t < n_tiles; ++t) {
    const int j0 = kb + t * BN;
    const int buf = t & 1;
    const bool more = t + 1 < n_tiles;
    const uint32_t kbuf = sbase + 2u * static_cast<uint32_t>(S::kK + buf * BN * S::LD);
    const uint32_t vbuf = sbase + 2u * static_cast<uint32_t>(S::kV + buf * BN * S::LD);
    if constexpr (F16) {
      if (more) {
        copy_tile<HD, BN>(p, p.k_chunks, kvh, j0 + BN, ke, smem + S::kK + (buf ^ 1) * BN * S::LD);
        copy_tile<HD, BN>(p, p.v_chunks, kvh, j0 + BN, ke, smem + S::kV + (buf ^ 1) * BN * S::LD);
      }
      cp_async_commit();
    } else if (more) {
      load_tile<HD, BN>(p, p.k_chunks, kvh, j0 + BN, ke, st);
      if constexpr (S::kLoadBoth) load_tile<HD, BN>(p, p.v_chunks, kvh, j0 + BN, ke, stv);
    }

    // 2. S = Q K^T.
    float s[BN / 8][4];
    qk_tile<HD, BN>(s, q_addr, kbuf + k_off, S::LD);
    if constexpr (!S::kLoadBoth && !F16) {
      if (more) {
        store_tile<HD, BN>(smem + S::kK + (buf ^ 1) * BN * S::LD, st);
        load_tile<HD, BN>(p, p.v_chunks, kvh, j0 + BN, ke, st);
      }
    }

    // 3. Mask, online softmax.
    mask_tile<BN>(p, r, j0, ia, ib, qc, s);
    online_softmax<HD, BN>(s, m_a, m_b, l_a, l_b, o);

    // 4. O += P V.
    pv_tile<HD, BN>(s, o, vbuf + v_off, S::LD);
    if constexpr (F16) {
      cp_async_wait<0>();
    } else if (more) {
      if constexpr (S::kLoadBoth) {
        store_tile<HD, BN>(smem + S::kK + (buf ^ 1) * BN * S::LD, st);
        store_tile<HD, BN>(smem + S::kV + (buf ^ 1) * BN * S::LD, stv);
      } else {
        store_tile<HD, BN>(smem + S::kV + (buf ^ 1) * BN * S::LD, st);
      }
    }
    __syncthreads();
  }

  finish_rows<HD>(p, r, ra, qc, o, m_a, m_b, l_a, l_b);
}

template <int HD, int BN, bool F16>
cudaError_t launch_shape(const Params& p, cudaStream_t stream) {
  using S = Shape<HD, BN>;
  static_assert(S::kBytes <= 227 * 1024);
  if (const cudaError_t err = allow_dynamic_smem<attn_mma_kernel<HD, BN, F16>>(S::kBytes); err != cudaSuccess)
    return err;
  const dim3 grid(static_cast<unsigned>(p.row_blocks), static_cast<unsigned>(p.n_kv_heads),
                  static_cast<unsigned>(p.n_splits));
  attn_mma_kernel<HD, BN, F16><<<grid, kThreads, S::kBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch(const Params& p, int head_dim, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return p.kv_f16 ? launch_shape<64, 64, true>(p, stream) : launch_shape<64, 64, false>(p, stream);
    case 128: return p.kv_f16 ? launch_shape<128, 64, true>(p, stream) : launch_shape<128, 64, false>(p, stream);
    case 256: return p.kv_f16 ? launch_shape<256, 32, true>(p, stream) : launch_shape<256, 32, false>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace dflash::cuda::attn_mma

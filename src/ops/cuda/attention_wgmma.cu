// The prefill kernel of attention.h on Hopper's warpgroup MMA (wgmma; sm_90a code), for fp16 K/V: what
// attention.cu launches instead of attention_mma.cu's kernel where wgmma_available() (attention_internal.h).
// Same rows, grid, masks, splits and outputs as attn_mma_kernel; the products are issued a warpgroup at a time
// from shared memory.
//
// Block: two warpgroups (8 warps), 128 rows = (query, head-of-group) pairs of one KV head, query-major; warp w
// owns rows [16 w, 16 w + 16), so warpgroup 0 the first 64 and warpgroup 1 the next 64. Two blocks an SM at
// head_dim 64 and 128 (126 registers, 97 KB of shared memory at 128), one at 256: a block's warpgroups wait for
// their products and then take the softmax together, so it is the other block that keeps the tensor cores busy
// meanwhile (measured: one block an SM at head_dim 128 ran 318 TFLOP/s, two 394). Shared memory holds
// every tile in wgmma.cuh's 128-byte-swizzled layout, column blocks of 64 elements:
//   Q:  [HD / 64][128 rows][64], scaled by scale * log2(e) and rounded to f16 once;
//   K, V: two buffers each of [HD / 64][64 keys][64], copied from the fp16 chunks by cp.async.
// The K tile is the K-major B of S = Q K^T, and the V tile, the same bytes laid out the same way, the MN-major B
// of O = P V: no transposing copy. Per tile of 64 keys:
//   1. cp.async of the next tile's K and V into the other buffers;
//   2. S = Q K^T: HD / 16 wgmma m64n64k16 (A and B from shared memory), waited for;
//   3. mask and online softmax in f32 (mma_f16.cuh's, on the same fragment layout as attn_mma_kernel's);
//   4. O += P V: P rounded to f16 from the S accumulators into wgmma's register A, 4 wgmma m64nHDk16, waited for;
//   5. the copies waited for, made visible to the async proxy, one __syncthreads.
// The roundings are attn_mma_kernel's (q, k, v and p to f16, f32 accumulation); the order of the f32 sums
// within a product is the tensor cores', fixed for a given call.
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/attention_internal.h"
#include "ops/cuda/attention_prefill.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mma_f16.cuh"
#include "ops/cuda/sm_count.h"
#include "ops/cuda/wgmma.cuh"

namespace dflash::cuda::attn_mma {
namespace {

constexpr int kThreads = 256;
constexpr int BM = kRowsPerBlock;
constexpr int BN = kWgmmaKeysPerTile;
static_assert(BM == 128 && BN % 16 == 0);
constexpr uint32_t kQBlock = BM * 128;   // bytes of one 64-column block of Q
constexpr uint32_t kKvBlock = BN * 128;  // ... of a K or V tile

// Shared memory of a block: Q, then two buffers each of K and V tiles.
template <int HD>
struct Layout {
  static_assert(HD % 64 == 0);
  static constexpr int kBlocks = HD / 64;  // 64-column blocks of a row
  static constexpr uint32_t kKvTile = kBlocks * kKvBlock;
  static constexpr uint32_t kQ = 0;  // byte offsets from the 1024-aligned base
  static constexpr uint32_t kK = kQ + kBlocks * kQBlock;
  static constexpr uint32_t kV = kK + 2 * kKvTile;
  static constexpr uint32_t kEnd = kV + 2 * kKvTile;
  static constexpr size_t kBytes = kEnd + 1024;  // slack to align the base
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Keys [j0, j0 + BN) (zeros at and past ke) of one KV head into a [HD / 64][BN][64] swizzled tile at `dst`, in the
// thread's current commit group.
template <int HD>
__device__ __forceinline__ void copy_tile(const Params& p, const float* const* chunks, int kvh, int j0, int ke,
                                          uint8_t* dst) {
  static_assert(BN * HD / 8 % kThreads == 0);
#pragma unroll
  for (int k = 0; k < BN * HD / 8 / kThreads; ++k) {
    const int e = threadIdx.x + k * kThreads;
    const int t = e / (HD / 8), c8 = e % (HD / 8);  // key t of the tile, 16-byte column c8
    const int j = j0 + t;
    const bool in = j < ke;
    int c;
    const int64_t off = kv_offset<HD>(p, in ? j : j0, kvh, 8 * c8, c);  // j0: a valid address when nothing is read
    cp_async16_zfill(dst + (c8 >> 3) * kKvBlock + wgmma::swizzled_offset(t, 8 * (c8 & 7)),
                     reinterpret_cast<const __half*>(chunks[c]) + off, in);
  }
}

// Q rows * scale * log2(e) -> f16, swizzled.
template <int HD>
__device__ __forceinline__ void stage_q(const Params& p, const BlockRows& r, uint8_t* qs) {
  for (int e = threadIdx.x; e < BM * HD / 4; e += kThreads) {
    const int row = e / (HD / 4), c4 = e % (HD / 4);
    const float4 v = scaled_q4<HD>(p, r, row, c4);
    const int k = 4 * c4;
    *reinterpret_cast<uint2*>(qs + (k >> 6) * kQBlock + wgmma::swizzled_offset(row, k & 63)) =
        make_uint2(pack_half2(v.x, v.y), pack_half2(v.z, v.w));
  }
}

// S = Q K^T of the warpgroup's 64 rows and a tile's BN keys, issued (not committed).
template <int HD>
__device__ __forceinline__ void issue_qk(float (&s)[BN / 8][4], uint32_t q_addr, uint32_t k_tile) {
#pragma unroll
  for (int k = 0; k < HD / 16; ++k) {
    const uint32_t col = static_cast<uint32_t>(k & 3) * 32u;  // k16 step within the column block
    wgmma::mma_ss_f16<BN>(s, wgmma::desc_k128(q_addr + (k >> 2) * kQBlock + col),
                          wgmma::desc_k128(k_tile + (k >> 2) * kKvBlock + col), k > 0);
  }
}

// P's A registers from the softmax weights in s (f16, round to nearest).
__device__ __forceinline__ void p_fragments(const float (&s)[BN / 8][4], uint32_t (&pa)[BN / 16][4]) {
#pragma unroll
  for (int k = 0; k < BN / 16; ++k) {
    pa[k][0] = pack_half2(s[2 * k][0], s[2 * k][1]);
    pa[k][1] = pack_half2(s[2 * k][2], s[2 * k][3]);
    pa[k][2] = pack_half2(s[2 * k + 1][0], s[2 * k + 1][1]);
    pa[k][3] = pack_half2(s[2 * k + 1][2], s[2 * k + 1][3]);
  }
}

// O += P V, issued (not committed): keys 16 k .. 16 k + 15 are the two 8-key atoms 2048 k bytes into the tile.
template <int HD>
__device__ __forceinline__ void issue_pv(float (&o)[HD / 8][4], const uint32_t (&pa)[BN / 16][4], uint32_t v_tile) {
#pragma unroll
  for (int k = 0; k < BN / 16; ++k) wgmma::mma_rs_f16<HD>(o, pa[k], wgmma::desc(v_tile + k * 2048u, kKvBlock), 1);
}

template <int HD>
__global__ void __launch_bounds__(kThreads, wgmma_blocks_per_sm(HD)) attn_wgmma_kernel(const Params p) {
  using L = Layout<HD>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const uint32_t sbase = smem_u32(smem);
  const BlockRows r = block_rows<BN>(p);
  stage_q<HD>(p, r, smem + L::kQ);
  if (r.n_tiles > 0) {
    copy_tile<HD>(p, p.k_chunks, r.kvh, r.kb, r.ke, smem + L::kK);
    copy_tile<HD>(p, p.v_chunks, r.kvh, r.kb, r.ke, smem + L::kV);
    cp_async_commit();
    cp_async_wait<0>();
  }
  wgmma::fence_shared();
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int quad = lane >> 2, qc = lane & 3;
  const int ra = warp * 16 + quad;
  const int ia = min(r.row0 + ra, r.row_end - 1) / p.group, ib = min(r.row0 + ra + 8, r.row_end - 1) / p.group;
  const uint32_t q_addr = sbase + L::kQ + static_cast<uint32_t>(warp >> 2) * (64 * 128);  // the warpgroup's rows

  float o[HD / 8][4];
#pragma unroll
  for (int d = 0; d < HD / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;

  for (int t = 0; t < r.n_tiles; ++t) {
    const int j0 = r.kb + t * BN;
    const int buf = t & 1;
    if (t + 1 < r.n_tiles) {
      copy_tile<HD>(p, p.k_chunks, r.kvh, j0 + BN, r.ke, smem + L::kK + (buf ^ 1) * L::kKvTile);
      copy_tile<HD>(p, p.v_chunks, r.kvh, j0 + BN, r.ke, smem + L::kV + (buf ^ 1) * L::kKvTile);
    }
    cp_async_commit();
    float s[BN / 8][4];
    wgmma::fence();
    issue_qk<HD>(s, q_addr, sbase + L::kK + buf * L::kKvTile);
    wgmma::commit();
    wgmma::wait<0>();
    mask_tile<BN>(p, r, j0, ia, ib, qc, s);
    online_softmax<HD, BN>(s, m_a, m_b, l_a, l_b, o);
    uint32_t pa[BN / 16][4];
    p_fragments(s, pa);
    wgmma::fence();
    issue_pv<HD>(o, pa, sbase + L::kV + buf * L::kKvTile);
    wgmma::commit();
    wgmma::wait<0>();
    cp_async_wait<0>();
    wgmma::fence_shared();
    __syncthreads();
  }
  finish_rows<HD>(p, r, ra, qc, o, m_a, m_b, l_a, l_b);
}

#else

// Binaries without sm_90a code for the device never launch them (wgmma_available()).
template <int HD>
__global__ void __launch_bounds__(kThreads) attn_wgmma_kernel(const Params) {
  __trap();
}

#endif

template <int HD>
cudaError_t launch_shape(const Params& p, cudaStream_t stream) {
  using L = Layout<HD>;
  static_assert(L::kBytes * wgmma_blocks_per_sm(HD) <= 227 * 1024);
  if (const cudaError_t err = allow_dynamic_smem<attn_wgmma_kernel<HD>>(L::kBytes); err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(p.row_blocks), static_cast<unsigned>(p.n_kv_heads),
                  static_cast<unsigned>(p.n_splits));
  attn_wgmma_kernel<HD><<<grid, kThreads, L::kBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

bool wgmma_available() {
#if defined(DFLASH_CUDA_SM90A)
  return current_compute_capability() == 90;
#else
  return false;
#endif
}

cudaError_t launch_wgmma(const Params& p, int head_dim, cudaStream_t stream) {
  if (!p.kv_f16) return cudaErrorInvalidValue;
  switch (head_dim) {
    case 64: return launch_shape<64>(p, stream);
    case 128: return launch_shape<128>(p, stream);
    case 256: return launch_shape<256>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace dflash::cuda::attn_mma

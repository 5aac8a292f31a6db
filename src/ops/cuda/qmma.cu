// Kernels of qmma.h.
//
// The k order. A q4_K block holds 4 chunks of 64 elements; chunk c's 32 code bytes qs[32c + l] hold element
// 64c + l (low nibble, sub-block 2c) and 64c + 32 + l (high nibble, sub-block 2c + 1). Lane (g, t) = (lane / 4,
// lane % 4) of a warp owns rows g and g + 8 of its 16-row tile and, in each block, chunk t: its 8 words of code
// bytes, word j = qs[32t + 4j .. + 3]. Word j feeds two k-steps of 16: step 2j + h takes nibble h of the word's
// bytes (h = 0: low, sub-block 2t; 1: high, 2t + 1) as two fp16 pairs, one mask each: bytes (0, 2) -> the A
// fragment's k-slots (2t, 2t + 1), bytes (1, 3) -> (2t + 8, 2t + 9). So k-step i = 2j + h, quad t, slot pair p,
// half e maps to element 64t + 32h + 4j + p + 2e of the block; qmma_pack_x writes x' in that order:
// xp[block][i][token][t][4 halves: (p, e) = (0, 0), (0, 1), (1, 0), (1, 1)], and lane (g, t) reads its B
// fragment of token g as one 8-byte word.
//
// Dequantizing a pair: (w >> shift) & 0x000f000f | 0x64006400 is the fp16 pair (1024 + q0, 1024 + q1) exactly;
// minus 1024 gives (q0, q1) exactly; then one fused q * ds - dm in fp16 (__hfma2).
#include <cuda_fp16.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "base/checked_math.h"
#include "ops/cuda/gemv_common.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mma_f16.cuh"
#include "ops/cuda/qmma.h"
#include "ops/cuda/quant_blocks.cuh"
#include "ops/cuda/sm_count.h"
#include "ops/cuda/warp_reduce.cuh"

namespace dflash::cuda {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kBlockBytes = 144;  // q4_K: d, dmin (fp16), 12 bytes of scales and mins, 128 of codes

// ---- activations ----

constexpr int kPackThreads = 256;

// One CTA a token (n8 of them: the padding tokens write zeros): s_t, then the token's codes in the k order.
__global__ void __launch_bounds__(kPackThreads) pack_kernel(const float* x, int n, int n8, int64_t cols, __half* xp,
                                                            float* scales) {
  pdl_begin();
  __shared__ float red[kPackThreads / 32];
  const int tok = blockIdx.x;
  const bool real = tok < n;
  const float* xr = x + static_cast<int64_t>(real ? tok : 0) * cols;
  float amax = 0.0f;
  int bad = 0;
  if (real)
    for (int64_t k = threadIdx.x; k < cols; k += kPackThreads) {
      const float v = xr[k];
      bad |= !isfinite(v);
      amax = fmaxf(amax, fabsf(v));
    }
  bad = __syncthreads_or(bad);
  amax = block_reduce<kPackThreads, true>(amax, red);
  // s = 2^(e - 14) with amax = m 2^e, m in [0.5, 1): amax / s in [2^13, 2^14).
  float s = 1.0f;
  if (bad) {
    s = NAN;
  } else if (amax > 0.0f) {
    int e = 0;
    frexpf(amax, &e);
    s = ldexpf(1.0f, e - 14 < -126 ? -126 : e - 14);
  }
  if (threadIdx.x == 0) scales[tok] = real ? s : 0.0f;
  const float inv = bad ? 0.0f : 1.0f / s;  // a power of two: x * inv == x / s exactly
  const int64_t blocks = cols / 256;
  // Output word o = ((b * 16 + i) * n8 + tok) * 4 + t (4 halves each).
  for (int64_t u = threadIdx.x; u < blocks * 16 * 4; u += kPackThreads) {
    const int t = static_cast<int>(u % 4), i = static_cast<int>(u / 4 % 16);
    const int64_t b = u / 64;
    const int j = i / 2, h = i % 2;
    const int64_t e0 = b * 256 + 64 * t + 32 * h + 4 * j;
    __half v[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int p = q / 2, e = q % 2;
      v[q] = __float2half_rn(real ? xr[e0 + p + 2 * e] * inv : 0.0f);
    }
    __half* o = xp + (((b * 16 + i) * n8 + tok) * 4 + t) * 4;
    *reinterpret_cast<uint2*>(o) = make_uint2(
        static_cast<uint32_t>(__half_as_ushort(v[0])) | static_cast<uint32_t>(__half_as_ushort(v[1])) << 16,
        static_cast<uint32_t>(__half_as_ushort(v[2])) | static_cast<uint32_t>(__half_as_ushort(v[3])) << 16);
  }
}

// ---- the product ----

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<const uint32_t*>(&h); }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *reinterpret_cast<const __half2*>(&u); }

// The fp16 pair of the word's bytes (0, 2) (shift 0: low nibbles; 4: high) or (1, 3) (8, 12) as weights.
__device__ __forceinline__ uint32_t dequant_pair(uint32_t w, int shift, __half2 ds, __half2 ndm) {
  const uint32_t m = ((w >> shift) & 0x000f000fu) | 0x64006400u;  // (1024 + q0, 1024 + q1)
  const __half2 q = __hsub2(bits_h2(m), bits_h2(0x64006400u));     // (q0, q1), exact
  return h2_bits(__hfma2(q, ds, ndm));
}

// One row's share of a block for lane quad t: its 8 code words and the fp16 scales of sub-blocks 2t, 2t + 1.
struct RowBlock {
  uint32_t w[8];
  __half2 ds[2], ndm[2];  // (ds, ds) and (-dm, -dm) of sub-block 2t + h
};

__device__ __forceinline__ RowBlock load_row_block(const uint8_t* blk, int t) {
  const uint4 hdr = gemv_common::ldw_u4(blk);
  const uint4 a = gemv_common::ldw_u4(blk + 16 + 32 * t), b = gemv_common::ldw_u4(blk + 32 + 32 * t);
  RowBlock r;
  r.w[0] = a.x, r.w[1] = a.y, r.w[2] = a.z, r.w[3] = a.w;
  r.w[4] = b.x, r.w[5] = b.y, r.w[6] = b.z, r.w[7] = b.w;
  const float d = qblocks::fp16_bits_hw(hdr.x & 0xffffu), dmin = qblocks::fp16_bits_hw(hdr.x >> 16);
  int sc[2], m[2];
  qblocks::k4_scales_mins(t, hdr.y, hdr.z, hdr.w, sc, m);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const __half ds = __float2half_rn(__fmul_rn(d, static_cast<float>(sc[h])));
    const __half dm = __float2half_rn(__fmul_rn(dmin, static_cast<float>(m[h])));
    r.ds[h] = __half2half2(ds);
    r.ndm[h] = __half2half2(__hneg(dm));
  }
  return r;
}

// Grid: (tiles of 16 rows) / (kWarps / split) CTAs of kWarps warps; warp w takes tile w / split, part w % split:
// blocks part, part + split, ... of its rows, for NT tiles of 8 tokens.
template <int NT>
__global__ void __launch_bounds__(kThreads) qmma_q4k_kernel(const uint8_t* w, int64_t rows, int64_t blocks,
                                                            const __half* xp, const float* scales, int n, int n8,
                                                            int split, float* y) {
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * (kWarps / split) + warp / split;
  const int part = warp % split;
  const int64_t r0 = tile * 16 + g, r1 = r0 + 8;
  const int64_t rb = blocks * kBlockBytes;
  const uint8_t* w0 = w + (r0 < rows ? r0 : rows - 1) * rb;
  const uint8_t* w1 = w + (r1 < rows ? r1 : rows - 1) * rb;
  pdl_begin();
  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  const bool any = tile * 16 < rows;
  for (int64_t b = part; any && b < blocks; b += split) {
    const RowBlock ra = load_row_block(w0 + b * kBlockBytes, t), rc = load_row_block(w1 + b * kBlockBytes, t);
    const uint2* xb = reinterpret_cast<const uint2*>(xp) + (b * 16 * n8 + g) * 4 + t;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int j = i / 2, h = i % 2;
      const uint32_t a[4] = {dequant_pair(ra.w[j], 4 * h, ra.ds[h], ra.ndm[h]),
                             dequant_pair(rc.w[j], 4 * h, rc.ds[h], rc.ndm[h]),
                             dequant_pair(ra.w[j], 4 * h + 8, ra.ds[h], ra.ndm[h]),
                             dequant_pair(rc.w[j], 4 * h + 8, rc.ds[h], rc.ndm[h])};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint2 bf = __ldg(xb + (static_cast<int64_t>(i) * n8 + 8 * nt) * 4);
        mma16816(acc[nt], a, bf.x, bf.y);
      }
    }
  }
  // acc[nt]: (row r0, tokens 8 nt + 2t, + 1), (row r1, the same tokens).
  __shared__ float red[kWarps][NT * 4][32];
  if (split > 1) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[warp][nt * 4 + c][lane] = acc[nt][c];
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float s = red[warp][nt * 4 + c][lane];
        for (int q = 1; q < split; ++q) s = __fadd_rn(s, red[warp + q][nt * 4 + c][lane]);
        acc[nt][c] = s;
      }
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int tok = 8 * nt + 2 * t + (c & 1);
      const int64_t row = c < 2 ? r0 : r1;
      if (tok < n && row < rows) y[tok * rows + row] = __fmul_rn(acc[nt][c], scales[tok]);
    }
}

}  // namespace

bool qmma_supported(DType type) { return static_cast<uint32_t>(type) == qblocks::kQ4_K; }

int64_t qmma_x_bytes(int64_t n, int64_t cols) {
  const int64_t n8 = static_cast<int64_t>(align_up(n, 8));
  return n8 * cols * 2 + (n8 * 4 + 15) / 16 * 16;
}

cudaError_t qmma_pack_x(const float* x, int64_t n, int64_t cols, void* xp, cudaStream_t stream) {
  if (n < 1 || n > kQmmaMaxTokens || cols <= 0 || cols % 256 != 0 || cols > INT64_MAX / 64)
    return cudaErrorInvalidValue;
  if (x == nullptr || xp == nullptr || !is_aligned(xp, 16) || !is_aligned(x, 4)) return cudaErrorInvalidValue;
  const int64_t n8 = static_cast<int64_t>(align_up(n, 8));
  auto* codes = static_cast<__half*>(xp);
  auto* scales = reinterpret_cast<float*>(static_cast<uint8_t*>(xp) + n8 * cols * 2);
  return launch_pdl(pack_kernel, dim3(static_cast<unsigned>(n8)), dim3(kPackThreads), 0, stream, x,
                    static_cast<int>(n), static_cast<int>(n8), cols, codes, scales);
}

int qmma_split(int64_t rows, int64_t cols) {
  const int64_t tiles = (rows + 15) / 16, blocks = cols / 256, want = int64_t{32} * current_sm_count();
  int s = 1;
  while (s < 8 && tiles * s < want && 2 * s <= blocks) s *= 2;
  return s;
}

cudaError_t qmma(DType type, const void* w, int64_t rows, int64_t cols, const void* xp, int64_t n, float* y,
                 cudaStream_t stream, int split) {
  if (!qmma_supported(type) || rows < 1 || rows > INT_MAX || cols <= 0 || cols % 256 != 0 || n < 1 ||
      n > kQmmaMaxTokens || cols > INT64_MAX / 64)
    return cudaErrorInvalidValue;
  if (split != 0 && split != 1 && split != 2 && split != 4 && split != 8) return cudaErrorInvalidValue;
  if (w == nullptr || xp == nullptr || y == nullptr || !is_aligned(w, 16) || !is_aligned(xp, 16) || !is_aligned(y, 4))
    return cudaErrorInvalidValue;
  const int s = split != 0 ? split : qmma_split(rows, cols);
  const int64_t tiles = (rows + 15) / 16, per_cta = kWarps / s;
  const int64_t ctas = (tiles + per_cta - 1) / per_cta;
  if (ctas > INT_MAX) return cudaErrorInvalidValue;
  const int64_t n8 = static_cast<int64_t>(align_up(n, 8)), blocks = cols / 256;
  const auto* codes = static_cast<const __half*>(xp);
  const auto* scales = reinterpret_cast<const float*>(static_cast<const uint8_t*>(xp) + n8 * cols * 2);
  const auto* wb = static_cast<const uint8_t*>(w);
  const dim3 grid(static_cast<unsigned>(ctas)), block(kThreads);
  const int ni = static_cast<int>(n), n8i = static_cast<int>(n8);
  const auto go = [&](auto kernel) {
    return launch_pdl(kernel, grid, block, 0, stream, wb, rows, blocks, codes, scales, ni, n8i, s, y);
  };
  switch (n8 / 8) {
    case 1: return go(qmma_q4k_kernel<1>);
    case 2: return go(qmma_q4k_kernel<2>);
    case 3: return go(qmma_q4k_kernel<3>);
    default: return go(qmma_q4k_kernel<4>);
  }
}

}  // namespace dflash::cuda

// bf16 weights times 1-32 tokens on the tensor cores (gemv16_mma.h).
//
// Fragments (mma.sync m16n8k16, bf16): lane (g, c) = (lane / 4, lane % 4) holds A's rows g and g + 8 at k-slots
// 2c, 2c + 1 (a0, a1) and 2c + 8, 2c + 9 (a2, a3), B's column g at the same k-slots (b0, b1), and C's rows g, g + 8
// at columns 2c, 2c + 1. Of a 64-column chunk, the lane loads columns [8c, 8c + 8) and [32 + 8c, 40 + 8c) of rows g
// and g + 8 (a 16-byte load each: the 4 lanes of a row read whole 32-byte sectors): its words 2j and 2j + 1
// (columns col(j) + {0, 1} and + {2, 3}, col(j) = 8c + 4j for j < 2, 32 + 8c + 4(j - 2) after) are the A fragment
// of the chunk's mma j (j < 4), and its B fragment holds token g's x at the same columns (rounded to bf16). So
// k-slot 2c + h of mma j is column col(j) + h in every lane: A and B agree.
#include "ops/cuda/gemv16_mma.h"

#include <climits>
#include <cstdint>

#include "base/checked_math.h"
#include "ops/cuda/activation.cuh"
#include "ops/cuda/gemv_common.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mma_f16.cuh"
#include "ops/cuda/quant_blocks.cuh"
#include "ops/cuda/sm_count.h"

namespace dflash::cuda {
namespace {

// Launch shape (template parameters): K warps a CTA, each taking every K-th 64-column chunk of T row tiles (16 T
// rows a CTA), U chunks loaded before they are multiplied. K is part of the summation order: one value (kSplit).
constexpr int kSplit = 8;

struct Args {
  Gemv16Part parts[kGemv16MmaMaxParts];
  int64_t first_block[kGemv16MmaMaxParts + 1];  // index of each part's first CTA
  int n_parts;
  int64_t cols;
  const float* x;      // f32 x (rounded to bf16 as it is loaded), or
  const uint16_t* xb;  // x already in bf16, 16-byte aligned (kXB kernels)
  int n;
  // kPair kernels (gemv16_mma_swiglu): parts[0] is the gate, parts[1] the up weight (their y unused); act [n, rows]
  // receives silu(gate) * up.
  float* act;
};

using gemv_common::ldw_u4;

// How x comes: f32 (rounded to bf16 as loaded; kXF32Vec 16-byte aligned), or already in bf16.
enum XForm { kXF32, kXF32Vec, kXBf16 };

// Token t's x at the lane's 16 columns of chunk k as the B fragments of the chunk's 4 mma (zeros past n). In bf16,
// two 16-byte loads (columns 8c .. 8c + 7 and 32 + 8c .. 39 + 8c). Coherent loads (__ldca), not __ldg: the kernel
// loads weights before its PDL wait, and ptxas scheduled non-coherent x loads among them (launch.cuh).
template <XForm kX>
__device__ __forceinline__ void load_b(const Args& a, int t, int64_t k, int c, uint32_t (&b)[4][2]) {
  if (t >= a.n) {
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j][0] = b[j][1] = 0u;
    return;
  }
  if constexpr (kX == kXBf16) {
    const uint16_t* xt = a.xb + int64_t{t} * a.cols + k * 64 + 8 * c;
    const uint4 lo = __ldca(reinterpret_cast<const uint4*>(xt)), hi = __ldca(reinterpret_cast<const uint4*>(xt + 32));
    b[0][0] = lo.x, b[0][1] = lo.y, b[1][0] = lo.z, b[1][1] = lo.w;
    b[2][0] = hi.x, b[2][1] = hi.y, b[3][0] = hi.z, b[3][1] = hi.w;
    return;
  }
  const float* xt = a.x + int64_t{t} * a.cols + k * 64 + 8 * c;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float* xp = xt + (j < 2 ? 4 * j : 32 + 4 * (j - 2));
    float4 v;
    if constexpr (kX == kXF32Vec) {
      v = __ldca(reinterpret_cast<const float4*>(xp));
    } else {
      v = make_float4(__ldca(xp), __ldca(xp + 1), __ldca(xp + 2), __ldca(xp + 3));
    }
    b[j][0] = pack_bf16(v.x, v.y);
    b[j][1] = pack_bf16(v.z, v.w);
  }
}

// kPair: each 16-row tile holds 8 rows of the gate weight (A rows g) and the same 8 rows of the up weight (A rows
// g + 8), so a CTA has both sums of its output rows and stores silu(gate) * up. The mma computes each output from
// its row of A and column of B alone, so a row's sums are the bits of its place in an unpaired tile.
template <int NT8, XForm kX, int K, int T, int U, bool kPair>
__global__ void __launch_bounds__(32 * K) gemv16_mma_kernel(const Args a) {
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, c = lane & 3;
  __shared__ float part_s[K][16 * T][8 * NT8];
  bool waited = false;  // the PDL wait comes after the first weight loads (weights are constant in a step)
  constexpr int kOutRows = kPair ? 8 : 16;  // output rows a tile
  for (int64_t blk = blockIdx.x; blk < a.first_block[a.n_parts]; blk += gridDim.x) {
    int p = 0;
    if constexpr (!kPair)
      while (p + 1 < a.n_parts && blk >= a.first_block[p + 1]) ++p;
    const Gemv16Part& part = a.parts[p];
    const int64_t row0 = (blk - a.first_block[p]) * (kOutRows * T), rb = a.cols * 2;
    // Rows g and g + 8 of each of the T tiles (kPair: row g of the gate and of the up weight); rows past the
    // weight's end read its last row again (not stored).
    const uint8_t* pr[T][2];
  #pragma unroll
    for (int tt = 0; tt < T; ++tt)
  #pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = kPair ? row0 + 8 * tt + g : row0 + 16 * tt + 8 * h + g;
        const void* w = kPair ? a.parts[h].w : part.w;
        pr[tt][h] = static_cast<const uint8_t*>(w) + (r < part.rows ? r : part.rows - 1) * rb + 16 * c;
      }
    const int64_t chunks = a.cols / 64;

    float acc[T][NT8][4];
  #pragma unroll
    for (int tt = 0; tt < T; ++tt)
  #pragma unroll
      for (int i = 0; i < NT8; ++i) acc[tt][i][0] = acc[tt][i][1] = acc[tt][i][2] = acc[tt][i][3] = 0.0f;
    for (int64_t k0 = warp; k0 < chunks; k0 += int64_t{K} * U) {
      uint4 w[U][T][2][2];
  #pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t k = k0 + int64_t{u} * K;
        if (k < chunks)
  #pragma unroll
          for (int tt = 0; tt < T; ++tt)
  #pragma unroll
            for (int h = 0; h < 2; ++h) {
              w[u][tt][h][0] = ldw_u4(pr[tt][h] + k * 128);
              w[u][tt][h][1] = ldw_u4(pr[tt][h] + k * 128 + 64);
            }
      }
      if (!waited) {
        pdl_begin();
        waited = true;
      }
  #pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t k = k0 + int64_t{u} * K;
        if (k >= chunks) break;
  #pragma unroll
        for (int i = 0; i < NT8; ++i) {
          uint32_t b[4][2];
          load_b<kX>(a, 8 * i + g, k, c, b);
  #pragma unroll
          for (int tt = 0; tt < T; ++tt) {
            const uint4(&wa)[2] = w[u][tt][0];
            const uint4(&wb)[2] = w[u][tt][1];
            const uint32_t ea[8] = {wa[0].x, wa[0].y, wa[0].z, wa[0].w, wa[1].x, wa[1].y, wa[1].z, wa[1].w};
            const uint32_t eb[8] = {wb[0].x, wb[0].y, wb[0].z, wb[0].w, wb[1].x, wb[1].y, wb[1].z, wb[1].w};
  #pragma unroll
            for (int j = 0; j < 4; ++j) {
              const uint32_t af[4] = {ea[2 * j], eb[2 * j], ea[2 * j + 1], eb[2 * j + 1]};
              mma_bf16(acc[tt][i], af, b[j][0], b[j][1]);
            }
          }
        }
      }
    }
    if (!waited) {
      pdl_begin();
      waited = true;
    }

    // The warps' sums in warp order.
    __syncthreads();  // the previous tile's sums have been read
  #pragma unroll
    for (int tt = 0; tt < T; ++tt)
  #pragma unroll
      for (int i = 0; i < NT8; ++i) {
        part_s[warp][16 * tt + g][8 * i + 2 * c] = acc[tt][i][0];
        part_s[warp][16 * tt + g][8 * i + 2 * c + 1] = acc[tt][i][1];
        part_s[warp][16 * tt + g + 8][8 * i + 2 * c] = acc[tt][i][2];
        part_s[warp][16 * tt + g + 8][8 * i + 2 * c + 1] = acc[tt][i][3];
      }
    __syncthreads();
    for (int e = static_cast<int>(threadIdx.x); e < kOutRows * T * 8 * NT8; e += 32 * K) {
      const int r = e / (8 * NT8), t = e % (8 * NT8);
      if (t >= a.n || row0 + r >= part.rows) continue;
      const int64_t i = int64_t{t} * part.rows + row0 + r;
      if constexpr (kPair) {
        const int rg = 16 * (r / 8) + r % 8;  // the gate row's place in its tile; the up row's is 8 below
        float sg = part_s[0][rg][t], su = part_s[0][rg + 8][t];
  #pragma unroll
        for (int q = 1; q < K; ++q) sg = __fadd_rn(sg, part_s[q][rg][t]), su = __fadd_rn(su, part_s[q][rg + 8][t]);
        a.act[i] = swiglu_f(sg, su);
      } else {
        float s = part_s[0][r][t];
  #pragma unroll
        for (int q = 1; q < K; ++q) s = __fadd_rn(s, part_s[q][r][t]);
        part.y[i] = s;
      }
    }
  }
  if (!waited) pdl_begin();
}

template <int NT8, XForm kX, int K, int T, int U, bool kPair>
cudaError_t launch_shape(Args a, cudaStream_t stream) {
  a.first_block[0] = 0;
  if constexpr (kPair) {  // a block takes 8 rows of each of the two parts a tile
    a.first_block[1] = a.first_block[2] = (a.parts[0].rows + 8 * T - 1) / (8 * T);
  } else {
    for (int i = 0; i < a.n_parts; ++i)
      a.first_block[i + 1] = a.first_block[i] + (a.parts[i].rows + 16 * T - 1) / (16 * T);
  }
  const int64_t blocks = a.first_block[a.n_parts];
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  // Persistent: as many CTAs as fit on the device at once, each taking every gridDim.x-th CTA's rows (CTAs that
  // end and start again cost the large weights, 24K-152K rows, a tenth of their rate).
  dim3 grid(static_cast<unsigned>(blocks));
  static const int ps = [] {  // resident CTAs an SM (per instantiation; initialised once, thread-safe)
    int v = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, gemv16_mma_kernel<NT8, kX, K, T, U, kPair>, 32 * K, 0);
    return v > 0 ? v : 1;
  }();
  const int64_t most = int64_t{ps} * current_sm_count();
  if (blocks > most) {
    grid.x = static_cast<unsigned>(most);
    // From 9 tokens, as few CTAs as take the blocks in as many rounds, so that every CTA takes the same number:
    // otherwise a few CTAs run a last round alone, at a fraction of the device's rate (a Qwen3.5-27B 17408x5120
    // weight at 23 tokens: 544 blocks on 2 x 132 CTAs, 16 of which take a third; H200: 62.3 -> 57.7 us, and the
    // 27B's 23-token verify step 19.48 -> 19.17 ms; docs/benchmarks.md, thirty-first session). At 1-8 tokens the
    // full grid's first rounds win (10240x5120 at one token: 32.8 us, 35.7 balanced).
    if (NT8 >= 2) {
      const int64_t rounds = (blocks + most - 1) / most;
      grid.x = static_cast<unsigned>((blocks + rounds - 1) / rounds);
    }
  }
  return launch_pdl(gemv16_mma_kernel<NT8, kX, K, T, U, kPair>, grid, dim3(32 * K), 0, stream, a);
}

// The launch shape by n-tiles (8 tokens each) and x's form: 8 warps a CTA (the k-split), T row tiles a CTA, U
// chunks in flight. T and U leave the summation order as it is (a row lies in one tile, and a warp sums its chunks
// in order), so a token's outputs are the same bits at every n. At 1-8 tokens 2 tiles, 2 in flight (measured on an
// H200 over the Qwen3-8B bf16 shapes, docs/benchmarks.md, twenty-fourth session). Above, that shape holds 150-162
// registers, one CTA an SM. With f32 x: 9-24 tokens 1 tile, 1 in flight, 25-32 2 tiles, 1 in flight (twenty-fifth
// session). With bf16 x (from 17 tokens: kGemv16MmaBf16XFrom), 2 tiles, 1 in flight: the x bytes a weight byte
// halve twice over (twenty-sixth session, H100: a 23-token Qwen3.5-27B bf16 verify 26.6 -> 24.9 ms).
template <int NT8, XForm kX>
struct LaunchShape {
  static constexpr int T = NT8 == 1 || NT8 == 4 || kX == kXBf16 ? 2 : 1;
  static constexpr int U = NT8 == 1 ? 2 : 1;
};

template <int NT8, XForm kX, bool kPair>
cudaError_t launch_nt(const Args& a, cudaStream_t stream) {
  return launch_shape<NT8, kX, kSplit, LaunchShape<NT8, kX>::T, LaunchShape<NT8, kX>::U, kPair>(a, stream);
}

template <XForm kX, bool kPair>
cudaError_t launch_n(const Args& a, cudaStream_t stream) {
  if constexpr (kPair) {  // up to 16 tokens (gemv16_mma_swiglu)
    return a.n <= 8 ? launch_nt<1, kX, kPair>(a, stream) : launch_nt<2, kX, kPair>(a, stream);
  } else {
    switch ((a.n + 7) / 8) {
      case 1: return launch_nt<1, kX, kPair>(a, stream);
      case 2: return launch_nt<2, kX, kPair>(a, stream);
      case 3: return launch_nt<3, kX, kPair>(a, stream);
      default: return launch_nt<4, kX, kPair>(a, stream);
    }
  }
}

template <bool kPair>
cudaError_t launch_x(const Args& a, cudaStream_t stream) {
  if constexpr (!kPair)  // the pair takes f32 x only
    if (a.xb != nullptr) return launch_n<kXBf16, kPair>(a, stream);
  return is_aligned(a.x, 16) ? launch_n<kXF32Vec, kPair>(a, stream) : launch_n<kXF32, kPair>(a, stream);
}

// The token-count and column checks of every entry point.
bool shape_ok(int64_t cols, int64_t n) {
  return n >= 1 && n <= kGemv16MmaMaxTokens && cols > 0 && cols % 64 == 0 &&
         cols <= INT64_MAX / 2 / kGemv16MmaMaxTokens;
}

// The checks and Args of both entry points (x or xb set).
cudaError_t launch(const Gemv16Part* parts, int n_parts, int64_t cols, const float* x, const uint16_t* xb, int64_t n,
                   cudaStream_t stream) {
  if (parts == nullptr || n_parts < 1 || n_parts > kGemv16MmaMaxParts || !shape_ok(cols, n))
    return cudaErrorInvalidValue;
  Args a{};
  a.cols = cols;
  a.x = x;
  a.xb = xb;
  a.n = static_cast<int>(n);
  for (int i = 0; i < n_parts; ++i) {
    const Gemv16Part& q = parts[i];
    if (q.rows < 0 ||
        (q.rows > 0 && (q.y == nullptr || !is_aligned(q.y, 4) || q.w == nullptr || !is_aligned(q.w, 16))))
      return cudaErrorInvalidValue;
    if (q.rows > 0) a.parts[a.n_parts++] = q;
  }
  if (a.n_parts == 0) return cudaSuccess;
  return launch_x<false>(a, stream);
}

}  // namespace

bool gemv16_mma_applies(DType type, const void* w, int64_t cols) {
  return static_cast<uint32_t>(type) == qblocks::kBF16 && w != nullptr && is_aligned(w, 16) && cols > 0 &&
         cols % 64 == 0;
}

cudaError_t gemv16_mma(const Gemv16Part* parts, int n_parts, int64_t cols, const float* x, int64_t n,
                       cudaStream_t stream) {
  if (x == nullptr || !is_aligned(x, 4)) return cudaErrorInvalidValue;
  return launch(parts, n_parts, cols, x, nullptr, n, stream);
}

cudaError_t gemv16_mma_bf16x(const Gemv16Part* parts, int n_parts, int64_t cols, const uint16_t* xb, int64_t n,
                             cudaStream_t stream) {
  if (xb == nullptr || !is_aligned(xb, 16)) return cudaErrorInvalidValue;
  return launch(parts, n_parts, cols, nullptr, xb, n, stream);
}

cudaError_t gemv16_mma_swiglu(const void* gate, const void* up, int64_t rows, int64_t cols, const float* x, int64_t n,
                              float* act, cudaStream_t stream) {
  if (!shape_ok(cols, n) || n >= kGemv16MmaBf16XFrom || rows < 0 || x == nullptr || !is_aligned(x, 4))
    return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (gate == nullptr || up == nullptr || !is_aligned(gate, 16) || !is_aligned(up, 16) || act == nullptr ||
      !is_aligned(act, 4))
    return cudaErrorInvalidValue;
  Args a{};
  a.parts[0] = Gemv16Part{gate, rows, nullptr};
  a.parts[1] = Gemv16Part{up, rows, nullptr};
  a.n_parts = 2;
  a.cols = cols;
  a.x = x;
  a.n = static_cast<int>(n);
  a.act = act;
  return launch_x<true>(a, stream);
}

}  // namespace dflash::cuda

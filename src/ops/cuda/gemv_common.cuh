// The parts the two GEMV kernel families (matmul.cu: f32 activations, gemv_q8.cu: int8 activations)
// share: the CTA shape, the token-count dispatch of the kernel templates, and the row epilogue (warp
// reduction, then the fixed-order sum of the row's split partials).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

namespace dflash::cuda::gemv_common {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;

// Grid of CTAs for `rows` rows at `split` warps per row; false when it does not fit a launch.
inline bool grid_for_rows(int64_t rows, int split, unsigned* grid) {
  const int64_t per_cta = kWarps / split;
  const int64_t g = (rows + per_cta - 1) / per_cta;
  if (g > INT_MAX) return false;
  *grid = static_cast<unsigned>(g);
  return true;
}

// Calls launch(std::integral_constant<int, NT>{}) for the smallest NT in {1, 2, 4, 8, 16} >= n, then
// returns the launch status.
template <typename F>
cudaError_t for_token_count(int n, F&& launch) {
  if (n <= 1) launch(std::integral_constant<int, 1>{});
  else if (n <= 2) launch(std::integral_constant<int, 2>{});
  else if (n <= 4) launch(std::integral_constant<int, 4>{});
  else if (n <= 8) launch(std::integral_constant<int, 8>{});
  else launch(std::integral_constant<int, 16>{});
  return cudaGetLastError();
}

// The warp sum of each of a lane's V values in the xor-butterfly order (offsets O, O / 2, ..., 1): while
// a lane holds more than one value (C), the step keeps half of them, the upper half where bit O of the
// lane index is set, and adds the partner lane's copy of that half. The sums formed are the butterfly's
// (float addition is commutative), in V/2 + V/4 + ... shuffles instead of 5 V. Lane l ends with values
// l * (V / 32) + [0, V / 32) in v[0..] (V >= 32), or with value l / (32 / V) in v[0] (V < 32).
template <int O, int C, int V>
__device__ __forceinline__ void warp_sum_halving(float (&v)[V], int lane) {
  if constexpr (O > 0) {
    if constexpr (C > 1) {
      constexpr int h = C / 2;
      const bool upper = (lane & O) != 0;
#pragma unroll
      for (int i = 0; i < h; ++i) {
        const float keep = upper ? v[i + h] : v[i], send = upper ? v[i] : v[i + h];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
      }
      warp_sum_halving<O / 2, h>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
      warp_sum_halving<O / 2, 1>(v, lane);
    }
  }
}

// Reduces each lane's acc[j][t] (row j, token t) over the warp and writes y[j][t * rows[j] + r[j]] for
// t < n: directly with one warp per row group, else through `partial` with the group's warps summed in
// order by its first warp. Every thread of the CTA must call it (it may synchronize the CTA);
// `y[j] == nullptr` marks a row without output. A row's result does not depend on R or NT (the lanes are
// summed in the butterfly order whatever the number of values).
template <int R, int NT>
__device__ __forceinline__ void store_rows(float (&acc)[R][NT], float (&partial)[kWarps][R * NT], int warp, int lane,
                                           int part, int split, int n, float* const (&y)[R],
                                           const int64_t (&rows)[R], const int64_t (&r)[R]) {
  constexpr int V = R * NT;
  static_assert((V & (V - 1)) == 0, "R * NT is a power of two");
  float v[V];
#pragma unroll
  for (int j = 0; j < R; ++j)
#pragma unroll
    for (int t = 0; t < NT; ++t) v[j * NT + t] = acc[j][t];
  warp_sum_halving<16, V>(v, lane);
  constexpr int kPer = V >= 32 ? V / 32 : 1, kSpan = V >= 32 ? 1 : 32 / V;  // values a lane, lanes a value
  const bool writer = lane % kSpan == 0;
  const int first = lane / kSpan * kPer;  // index of v[0]
  // Where value i goes (nullptr: nowhere). The row is picked by selects over all R: a branch on i / NT == j
  // lets the compiler index the arrays by i / NT, which moves them to local memory.
  auto dst = [&](int i) {
    const int t = i % NT;
    float* p = nullptr;
#pragma unroll
    for (int j = 0; j < R; ++j) {
      float* const q = y[j] != nullptr ? y[j] + t * rows[j] + r[j] : nullptr;
      p = i / NT == j ? q : p;
    }
    return t < n ? p : nullptr;
  };
  if (split == 1) {
    if (writer)
#pragma unroll
      for (int k = 0; k < kPer; ++k)
        if (float* p = dst(first + k)) *p = v[k];
    return;
  }
  if (writer)
#pragma unroll
    for (int k = 0; k < kPer; ++k) partial[warp][first + k] = v[k];
  __syncthreads();
  if (part == 0 && writer)
#pragma unroll
    for (int k = 0; k < kPer; ++k)
      if (float* p = dst(first + k)) {
        float s = partial[warp][first + k];
        for (int q = 1; q < split; ++q) s += partial[warp + q][first + k];
        *p = s;
      }
}

// store_rows for one row.
template <int NT>
__device__ __forceinline__ void store_row(float (&acc)[NT], float (&partial)[kWarps][NT], int warp, int lane, int part,
                                          int split, int n, float* y, int64_t rows, int64_t r) {
  float* const ys[1] = {y};
  const int64_t rows1[1] = {rows}, r1[1] = {r};
  store_rows<1, NT>(reinterpret_cast<float(&)[1][NT]>(acc), partial, warp, lane, part, split, n, ys, rows1, r1);
}

// 16 bytes of weights read once: through the non-coherent path without allocating in L1, so that L1 keeps
// the activations every warp of the SM reads again.
__device__ __forceinline__ uint4 ldw_u4(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

}  // namespace dflash::cuda::gemv_common

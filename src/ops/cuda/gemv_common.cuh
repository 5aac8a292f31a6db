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

// Reduces each lane's acc over the warp and writes y[t * rows + r] for t < n: directly with one warp per
// row, else through `partial` with the row's warps summed in order by its first warp. Every thread of
// the CTA must call it (it may synchronize the CTA); `y == nullptr` marks a warp without a row.
template <int NT>
__device__ __forceinline__ void store_row(float (&acc)[NT], float (&partial)[kWarps][NT], int warp, int lane, int part,
                                          int split, int n, float* y, int64_t rows, int64_t r) {
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
  if (split == 1) {
    if (lane == 0 && y != nullptr)
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (t < n) y[t * rows + r] = acc[t];
    return;
  }
  if (lane == 0)
#pragma unroll
    for (int t = 0; t < NT; ++t) partial[warp][t] = acc[t];
  __syncthreads();
  if (lane == 0 && part == 0 && y != nullptr)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= n) break;
      float s = partial[warp][t];
      for (int p = 1; p < split; ++p) s += partial[warp + p][t];
      y[t * rows + r] = s;
    }
}

}  // namespace dflash::cuda::gemv_common

// The short causal conv + SiLU of one output element as a device function (conv.h's math), shared by the
// conv kernel (conv.cu) and the fused DeltaNet prep (glue.cu), so the two give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/conv.h"

namespace dflash::cuda {

// silu(sum_j w[c, j] * in_{t-(K-1)+j}[c]) for token t, channel c of x [n, C]: the window is concat(conv_state,
// x) (chain form, parents null) or token t's ancestors' inputs, nearest last, then conv_state rows (tree
// form). The K products are added oldest first, each rounded, as on the CPU. KC > 0: K == KC known at
// compile time (the window's loads are issued together; one memory round trip, not K); KC == 0: any K.
template <int KC>
__device__ __forceinline__ float conv_silu_at(const float* __restrict__ x, int64_t t, int64_t c, int64_t C,
                                              const float* __restrict__ w, int K, const float* __restrict__ conv_state,
                                              const int32_t* __restrict__ parents) {
  if constexpr (KC > 0) K = KC;
  constexpr int kMax = KC > 0 ? KC : int(kConvMaxKernel);
  const int hist = K - 1;
  const float* wc = w + c * K;
  float in[kMax], wv[kMax];
  if (parents == nullptr) {
    // Window slot j is row t + j of concat(conv_state, x).
#pragma unroll
    for (int j = 0; j < kMax; ++j) {
      if (j >= K) break;
      const int64_t u = t + j;
      in[j] = u < hist ? conv_state[u * C + c] : x[(u - hist) * C + c];
      wv[j] = wc[j];
    }
  } else {
    // src[j] >= 0: a row of x; < 0: row -(src + 1) of conv_state.
    int64_t src[kMax];
    src[hist] = t;
    int64_t cur = parents[t];
    if (cur >= t || cur < -1) cur = -1;
    int srow = hist - 1;
    for (int j = hist - 1; j >= 0; --j) {
      if (cur >= 0) {
        src[j] = cur;
        int64_t next = parents[cur];
        if (next >= cur || next < -1) next = -1;
        cur = next;
      } else {
        src[j] = -int64_t(srow--) - 1;
      }
    }
#pragma unroll
    for (int j = 0; j < kMax; ++j) {
      if (j >= K) break;
      const int64_t s = src[j];
      in[j] = s >= 0 ? x[s * C + c] : conv_state[(-s - 1) * C + c];
      wv[j] = wc[j];
    }
  }
  float o = 0.0f;
#pragma unroll
  for (int j = 0; j < kMax; ++j) {
    if (j >= K) break;
    const float p = __fmul_rn(wv[j], in[j]);
    o = j == 0 ? p : __fadd_rn(o, p);
  }
  return o / (1.0f + expf(-o));
}

// conv_state row r <- row n + r of concat(conv_state, x) for channel c (the chain form's window after n
// tokens); rows ascending, so a state row is read before it is overwritten (n + r > r).
__device__ __forceinline__ void conv_shift_state(const float* __restrict__ x, int64_t n, int64_t c, int64_t C,
                                                 int hist, float* conv_state) {
  for (int r = 0; r < hist; ++r) {
    const int64_t u = n + r;
    conv_state[r * C + c] = u < hist ? conv_state[u * C + c] : x[(u - hist) * C + c];
  }
}

}  // namespace dflash::cuda

// causal_conv1d_silu: depthwise causal conv over time + SiLU, chain and tree forms. Per output the
// K products are summed in window order (oldest first) in float, then silu(x) = x / (1 + expf(-x)).
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/cpu/ops.h"

namespace dflash::cpu {

void causal_conv1d_silu(const float* x, int64_t n, int64_t channels, const float* w, int64_t kernel,
                        float* conv_state, float* out, std::span<const int32_t> parents) {
  assert(kernel >= 1);
  const int64_t hist = kernel - 1;  // rows of conv_state
  const int64_t C = channels;
  std::vector<const float*> win(static_cast<size_t>(kernel));
  for (int64_t t = 0; t < n; ++t) {
    // win[j] = the input row at window slot j (slot kernel - 1 is token t itself).
    win[hist] = x + t * C;
    if (parents.empty()) {
      for (int64_t j = 0; j < hist; ++j) {
        const int64_t u = t + j;  // row of concat(conv_state, x)
        win[j] = u < hist ? conv_state + u * C : x + (u - hist) * C;
      }
    } else {
      int64_t cur = parents[t];
      int64_t srow = hist - 1;
      for (int64_t j = hist - 1; j >= 0; --j) {
        if (cur >= 0) {
          assert(cur < t);
          win[j] = x + cur * C;
          cur = parents[cur];
        } else {
          win[j] = conv_state + srow-- * C;
        }
      }
    }
    float* o = out + t * C;
    for (int64_t c = 0; c < C; ++c) o[c] = w[c * kernel] * win[0][c];
    for (int64_t j = 1; j < kernel; ++j) {
      const float* in = win[j];
      for (int64_t c = 0; c < C; ++c) o[c] += w[c * kernel + j] * in[c];
    }
    for (int64_t c = 0; c < C; ++c) o[c] = o[c] / (1.0f + std::exp(-o[c]));
  }
  if (!parents.empty() || hist == 0 || n == 0) return;
  // New state: the last `hist` rows of concat(conv_state, x).
  if (n >= hist) {
    std::memcpy(conv_state, x + (n - hist) * C, static_cast<size_t>(hist * C) * sizeof(float));
  } else {
    std::memmove(conv_state, conv_state + n * C, static_cast<size_t>((hist - n) * C) * sizeof(float));
    std::memcpy(conv_state + (hist - n) * C, x, static_cast<size_t>(n * C) * sizeof(float));
  }
}

}  // namespace dflash::cpu

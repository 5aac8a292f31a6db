// Elementwise activations (float, as ggml's CPU: silu(x) = x / (1 + expf(-x))) and row softmax
// (max-subtracted, the sum of exponentials in double, then one float scale per row).
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/cpu/ops.h"

namespace dflash::cpu {

namespace {
inline float silu(float v) { return v / (1.0f + std::exp(-v)); }
}  // namespace

void silu_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = silu(x[i]);
}

void sigmoid_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

void softmax_rows(float* x, int64_t n, int64_t dim) {
  for (int64_t r = 0; r < n; ++r) {
    float* v = x + r * dim;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < dim; ++i) mx = std::max(mx, v[i]);
    if (mx == -std::numeric_limits<float>::infinity()) {  // all masked: uniform zeros, not NaN
      std::fill(v, v + dim, 0.0f);
      continue;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      v[i] = std::exp(v[i] - mx);
      sum += v[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < dim; ++i) v[i] *= inv;
  }
}

}  // namespace dflash::cpu

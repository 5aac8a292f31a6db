// rms_norm, computed the way ggml's CPU rms_norm + mul does: the sum of squares in double, then a
// float scale 1/sqrtf(mean + eps), then (x * scale) * w.
#include <cmath>

#include "ops/cpu/ops.h"

namespace dflash::cpu {

void rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* y) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float mean = dim > 0 ? static_cast<float>(sum / static_cast<double>(dim)) : 0.0f;
    const float scale = 1.0f / std::sqrt(mean + eps);
    if (w != nullptr) {
      for (int64_t i = 0; i < dim; ++i) yr[i] = (xr[i] * scale) * w[i];
    } else {
      for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * scale;
    }
  }
}

}  // namespace dflash::cpu

// rope_neox: rotate-half RoPE on the first rot_dims of each head. Angles are formed in double
// (inv_freq_i = theta^(-2i/rot_dims) / freq_scale, angle = position * inv_freq_i) and their cos/sin
// rounded to float once; the rotation itself is float.
#include <cassert>
#include <cmath>
#include <vector>

#include "ops/cpu/ops.h"

namespace dflash::cpu {

void rope_neox(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t rot_dims,
               std::span<const int32_t> positions, double theta, double freq_scale) {
  assert(rot_dims % 2 == 0 && rot_dims <= head_dim);
  assert(static_cast<int64_t>(positions.size()) >= n);
  const int64_t half = rot_dims / 2;
  if (half == 0) return;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rot_dims)) / freq_scale;
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t t = 0; t < n; ++t) {
    const double pos = positions[t];
    for (int64_t i = 0; i < half; ++i) {
      const double a = pos * inv_freq[i];
      cs[i] = static_cast<float>(std::cos(a));
      sn[i] = static_cast<float>(std::sin(a));
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * cs[i] - x1 * sn[i];
        v[i + half] = x0 * sn[i] + x1 * cs[i];
      }
    }
  }
}

}  // namespace dflash::cpu

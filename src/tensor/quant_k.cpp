// K-quants (256-element super-blocks): q2_K, q3_K, q4_K, q5_K, q6_K and q8_K to and from fp32.
//
// A super-block holds one or two fp16 master scales (d, and dmin for the affine types) and 8 or 16
// sub-blocks, each with a small integer scale (and min) that multiplies the master. Layouts (dtype.h):
//   q2_K  scales[16]: low nibble = scale, high nibble = min of 16-element sub-block j;
//         qs[64]: 2-bit codes; d, dmin.                         x = d*sc*q - dmin*m, q in 0..3
//   q3_K  hmask[32]: bit 2 of the codes; qs[64]: bits 0-1; scales[12]: 16 packed 6-bit signed scales
//         (+32 bias); d.                                        x = d*(sc-32)*(q-4), q in 0..7
//   q4_K  d, dmin; scales[12]: 8 packed 6-bit (scale, min) pairs for 32-element sub-blocks; qs[128].
//                                                               x = d*sc*q - dmin*m, q in 0..15
//   q5_K  as q4_K plus qh[32]: bit 4 of the codes.              q in 0..31
//   q6_K  ql[128]: bits 0-3; qh[64]: bits 4-5; scales[16] int8; d.  x = d*sc*(q-32), q in 0..63
//   q8_K  d (fp32); qs[256] int8; bsums[16]: sums of each 16 codes (used by dot products).
//
// 2-bit codes (q2_K, and the low bits of q3_K) come in 128-element halves: byte l of a half's 32 bytes
// holds elements l, l+32, l+64, l+96 in bits 0-1, 2-3, 4-5, 6-7. q4_K/q5_K nibbles come in 64-element
// chunks: byte l holds element l (low nibble) and l+32 (high). q6_K low nibbles come in 128-element
// halves: ql[l] holds l and l+64, ql[l+32] holds l+32 and l+96; qh[l] holds bits 4-5 of l, l+32, l+64,
// l+96 in its four bit pairs. The high bit of q3_K element e is bit e/32 of hmask[e%32]; of q5_K element
// 64c + l (l < 32) is bit 2c of qh[l] and of element 64c + 32 + l is bit 2c+1.
//
// The 6-bit scales of q4_K/q5_K (sub-block j, scale s and min m):
//   j < 4:  s = bytes[j] & 63,                         m = bytes[j+4] & 63
//   j >= 4: s = (bytes[j+4] & 15) | (bytes[j-4] >> 6) << 4, m = (bytes[j+4] >> 4) | (bytes[j] >> 6) << 4
// The 6-bit scales of q3_K (j < 16): low 4 bits in nibble j/8 of bytes[j%8], high 2 bits in bit pair j/4
// of bytes[8 + j%4].
//
// Quantization follows ggml's quantize_row_*_ref operation for operation: per sub-block a scale (and
// min) fitted by a small search, the sub-block scales quantized against the super-block maximum, then
// every code recomputed against the scale the decoder will actually see (after fp16 rounding).
// Bit-exactness with ggml needs every a*b+c rounded twice, as written: forbid fused multiply-add
// contraction here even when the build targets FMA hardware (-march=native). GCC contracts by default
// in C++ mode; clang within expressions.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <cmath>
#include <cstring>

#include "tensor/dtype.h"
#include "tensor/half.h"
#include "tensor/quant_codecs.h"

namespace dflash::codec {
namespace {

// ggml treats a group whose largest magnitude is below this as all zero.
constexpr float kGroupEpsilon = 1e-15f;

template <typename Block>
Block load_block(const void* src, int64_t i) {
  Block b;
  std::memcpy(&b, static_cast<const uint8_t*>(src) + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
  return b;
}

template <typename Block>
void store_block(void* dst, int64_t i, const Block& b) {
  std::memcpy(static_cast<uint8_t*>(dst) + i * static_cast<int64_t>(sizeof(Block)), &b, sizeof(Block));
}

int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// The element of largest magnitude, with its sign (first wins a tie); *amax gets its magnitude.
float signed_absmax(const float* x, int n, float* amax_out) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  *amax_out = amax;
  return max;
}

// ---- Scale fitting (the searches of ggml's reference quantizers) ----

// Symmetric fit for q6_K (ggml's make_qx_quants with x^2 weights): codes l in [-nmax, nmax-1] for
// x ~ scale * l. Tries the scale that maps the extreme element to -nmax, then 18 nearby ones
// (nmax +- 0.1k), keeping the one with the best weighted least-squares fit. Writes l + nmax to q.
float fit_symmetric_weighted(int n, int nmax, const float* x, int8_t* q) {
  float amax = 0.0f;
  const float max = signed_absmax(x, n, &amax);
  if (amax < kGroupEpsilon) {
    for (int i = 0; i < n; ++i) q[i] = 0;
    return 0.0f;
  }
  // Sums of w*x*l and w*l*l with w = x^2 for the codes that scale `iscale` gives; optionally stores codes.
  auto fit = [&](float iscale, float* sumlx, float* suml2, bool store) {
    float slx = 0.0f, sl2 = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      if (store) q[i] = static_cast<int8_t>(l + nmax);
      const float w = x[i] * x[i];
      slx += w * x[i] * static_cast<float>(l);
      sl2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
    *sumlx = slx;
    *suml2 = sl2;
  };
  float sumlx = 0.0f, suml2 = 0.0f;
  fit(static_cast<float>(-nmax) / max, &sumlx, &suml2, true);
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;  // the fit's explained energy; larger is better
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    const float iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(step)) / max;
    fit(iscale, &sumlx, &suml2, false);
    if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
      fit(iscale, &sumlx, &suml2, true);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Symmetric fit for q3_K (ggml's make_q3_quants with rmse): start from the scale that maps the extreme
// element to -nmax, then up to 5 sweeps of coordinate descent, moving one code at a time to the value
// the current least-squares scale suggests when that improves sumlx^2/suml2. Writes l + nmax to q.
float fit_symmetric_descent(int n, int nmax, const float* x, int8_t* q) {
  float amax = 0.0f;
  const float max = signed_absmax(x, n, &amax);
  if (amax < kGroupEpsilon) {
    for (int i = 0; i < n; ++i) q[i] = 0;
    return 0.0f;
  }
  const float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    q[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  for (int sweep = 0; sweep < 5; ++sweep) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      const float li = static_cast<float>(q[i]);
      float slx = sumlx - w * x[i] * li;  // sums without element i
      if (!(slx > 0.0f)) continue;
      float sl2 = suml2 - w * li * li;
      const int nl = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
      if (nl == q[i]) continue;
      const float nlf = static_cast<float>(nl);
      slx += w * x[i] * nlf;
      sl2 += w * nlf * nlf;
      if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
        q[i] = static_cast<int8_t>(nl);
        sumlx = slx;
        suml2 = sl2;
        ++changed;
      }
    }
    if (changed == 0) break;
  }
  for (int i = 0; i < n; ++i) q[i] = static_cast<int8_t>(q[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Affine fit for q2_K/q4_K/q5_K (ggml's make_qkx2_quants): x ~ scale * l + offset, l in [0, nmax],
// offset <= 0. Starts from the [min(x, 0), max(x)] range, then tries nstep+1 candidate code assignments
// (range scaled by nmax + rmin + rdelta*k), each followed by a weighted least-squares solve for scale
// and offset; keeps the lowest weighted error (absolute when `abs_error`, else squared). A better
// candidate's offset becomes the origin of the following candidates, as in ggml. Returns the scale and
// sets *neg_offset = -offset (>= 0).
float fit_affine(int n, int nmax, const float* x, const float* w, uint8_t* q, float* neg_offset, float rmin,
                 float rdelta, int nstep, bool abs_error) {
  uint8_t trial[32];
  float lo = x[0], hi = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < lo) lo = x[i];
    if (x[i] > hi) hi = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0.0f) lo = 0.0f;
  if (hi == lo) {
    for (int i = 0; i < n; ++i) q[i] = 0;
    *neg_offset = -lo;
    return 0.0f;
  }
  auto error_of = [&](float diff) { return abs_error ? std::fabs(diff) : diff * diff; };
  float iscale = static_cast<float>(nmax) / (hi - lo);
  float scale = 1.0f / iscale;
  float best_error = 0.0f;
  for (int i = 0; i < n; ++i) {
    q[i] = static_cast<uint8_t>(clamp_int(nearest_int(iscale * (x[i] - lo)), 0, nmax));
    const float diff = scale * static_cast<float>(q[i]) + lo - x[i];
    best_error += w[i] * error_of(diff);
  }
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * static_cast<float>(step) + static_cast<float>(nmax)) / (hi - lo);
    float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * (x[i] - lo)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      const float wl = w[i] * static_cast<float>(l);
      sum_l += wl;
      sum_l2 += wl * static_cast<float>(l);
      sum_xl += wl * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (!(det > 0.0f)) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_offset = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_offset > 0.0f) {  // a positive offset is not representable: refit the scale alone
      this_offset = 0.0f;
      this_scale = sum_xl / sum_l2;
    }
    float err = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * static_cast<float>(trial[i]) + this_offset - x[i];
      err += w[i] * error_of(diff);
    }
    if (err < best_error) {
      std::memcpy(q, trial, static_cast<size_t>(n));
      best_error = err;
      scale = this_scale;
      lo = this_offset;
    }
  }
  *neg_offset = -lo;
  return scale;
}

// ---- Packing helpers ----

// 2-bit codes of 256 elements into 64 bytes (the q2_K / q3_K-low-bits layout, see the file comment).
void pack_2bit(const uint8_t* q, uint8_t* qs) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* e = q + 128 * h;
    for (int l = 0; l < 32; ++l)
      qs[32 * h + l] = static_cast<uint8_t>(e[l] | (e[l + 32] << 2) | (e[l + 64] << 4) | (e[l + 96] << 6));
  }
}

// The 2-bit code of element 128h + 32s + l from the packed qs.
inline int code_2bit(const uint8_t* qs, int h, int s, int l) { return (qs[32 * h + l] >> (2 * s)) & 3; }

// (scale, min) of sub-block j from the 12 packed bytes of q4_K/q5_K.
void unpack_scale_min_k4(int j, const uint8_t* bytes, uint8_t* s, uint8_t* m) {
  if (j < 4) {
    *s = bytes[j] & 63;
    *m = bytes[j + 4] & 63;
  } else {
    *s = static_cast<uint8_t>((bytes[j + 4] & 0x0f) | ((bytes[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((bytes[j + 4] >> 4) | ((bytes[j] >> 6) << 4));
  }
}

void pack_scale_min_k4(const uint8_t* s, const uint8_t* m, uint8_t* bytes) {
  for (int j = 0; j < 4; ++j) {
    bytes[j] = s[j];
    bytes[j + 4] = m[j];
  }
  for (int j = 4; j < 8; ++j) {
    bytes[j + 4] = static_cast<uint8_t>((s[j] & 0x0f) | ((m[j] & 0x0f) << 4));
    bytes[j - 4] |= static_cast<uint8_t>((s[j] >> 4) << 6);
    bytes[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
  }
}

// The 16 signed 6-bit scales of q3_K, still with their +32 bias.
int unpack_scale_q3(int j, const uint8_t* bytes) {
  const int low = j < 8 ? (bytes[j] & 0x0f) : (bytes[j - 8] >> 4);
  const int high = (bytes[8 + j % 4] >> (2 * (j / 4))) & 3;
  return low | (high << 4);
}

// Shared tail of the affine K-quants: given the per-sub-block quantized scale and min and the super-block
// d/dmin as the decoder will read them, recompute each code for sub-blocks of `sub` elements.
void requantize_affine(const float* x, int sub, int nsub, int nmax, float d_all, float dmin_all, const uint8_t* sc,
                       const uint8_t* mn, uint8_t* q) {
  for (int j = 0; j < nsub; ++j) {
    const float d = d_all * static_cast<float>(sc[j]);
    if (d == 0.0f) continue;  // keep the codes of the fit: they decode to -dm whatever they are
    const float dm = dmin_all * static_cast<float>(mn[j]);
    for (int i = 0; i < sub; ++i)
      q[sub * j + i] = static_cast<uint8_t>(clamp_int(nearest_int((x[sub * j + i] + dm) / d), 0, nmax));
  }
}

// Affine super-block scales shared by q4_K and q5_K: per 32-element sub-block an affine fit with
// weights av(|x|) + |x| (av = rms of the sub-block), then 6-bit scale and min against their maxima.
void fit_k4_scales(const float* x, int nmax, float rmin, float rdelta, int nstep, uint8_t* q, uint8_t* sc,
                   uint8_t* mn, float* d_out, float* dmin_out) {
  float scales[8], mins[8], w[32];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0.0f;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32.0f);
    for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(xs[l]);
    scales[j] = fit_affine(32, nmax, xs, w, q + 32 * j, &mins[j], rmin, rdelta, nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
  for (int j = 0; j < 8; ++j) {
    // ggml stores the rounded value in a uint8_t before capping at 63; keep that wrap for equality.
    const auto ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
    const auto lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
    sc[j] = ls < 63 ? ls : 63;
    mn[j] = lm < 63 ? lm : 63;
  }
  *d_out = max_scale / 63.0f;
  *dmin_out = max_min / 63.0f;
}

}  // namespace

// ---- Dequantization ----

void dequantize_q2_K(const void* src, float* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i) {
    const auto b = load_block<BlockQ2_K>(src, i);
    const float d = fp16_to_fp32(b.d);
    const float dmin = fp16_to_fp32(b.dmin);
    // Element 128h + 32s + 16t + l uses scale byte 8h + 2s + t.
    for (int h = 0; h < 2; ++h)
      for (int s = 0; s < 4; ++s)
        for (int t = 0; t < 2; ++t) {
          const uint8_t sc = b.scales[8 * h + 2 * s + t];
          const float dl = d * static_cast<float>(sc & 0x0f);
          const float ml = dmin * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l)
            *dst++ = dl * static_cast<float>(code_2bit(b.qs, h, s, 16 * t + l)) - ml;
        }
  }
}

void dequantize_q3_K(const void* src, float* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i) {
    const auto b = load_block<BlockQ3_K>(src, i);
    const float d_all = fp16_to_fp32(b.d);
    for (int h = 0; h < 2; ++h)
      for (int s = 0; s < 4; ++s)
        for (int t = 0; t < 2; ++t) {
          const float dl = d_all * static_cast<float>(unpack_scale_q3(8 * h + 2 * s + t, b.scales) - 32);
          const int hbit = 4 * h + s;  // = element / 32
          for (int l = 16 * t; l < 16 * t + 16; ++l) {
            const int high = (b.hmask[l] >> hbit) & 1;
            *dst++ = dl * static_cast<float>(code_2bit(b.qs, h, s, l) - (high ? 0 : 4));
          }
        }
  }
}

// q4_K and q5_K share the decoder; qh (the fifth code bits) is null for q4_K.
static void dequantize_k4(const uint8_t* scale_bytes, uint16_t d16, uint16_t dmin16, const uint8_t* qs,
                          const uint8_t* qh, float* dst) {
  const float d = fp16_to_fp32(d16);
  const float dmin = fp16_to_fp32(dmin16);
  for (int c = 0; c < 4; ++c) {  // 64-element chunks: sub-blocks 2c (low nibbles) and 2c+1 (high)
    for (int half = 0; half < 2; ++half) {
      uint8_t sc, m;
      unpack_scale_min_k4(2 * c + half, scale_bytes, &sc, &m);
      const float ds = d * static_cast<float>(sc);
      const float ms = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) {
        int q = half ? (qs[32 * c + l] >> 4) : (qs[32 * c + l] & 0x0f);
        if (qh && ((qh[l] >> (2 * c + half)) & 1)) q += 16;
        *dst++ = ds * static_cast<float>(q) - ms;
      }
    }
  }
}

void dequantize_q4_K(const void* src, float* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i, dst += kQK_K) {
    const auto b = load_block<BlockQ4_K>(src, i);
    dequantize_k4(b.scales, b.d, b.dmin, b.qs, nullptr, dst);
  }
}

void dequantize_q5_K(const void* src, float* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i, dst += kQK_K) {
    const auto b = load_block<BlockQ5_K>(src, i);
    dequantize_k4(b.scales, b.d, b.dmin, b.qs, b.qh, dst);
  }
}

void dequantize_q6_K(const void* src, float* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i) {
    const auto b = load_block<BlockQ6_K>(src, i);
    const float d = fp16_to_fp32(b.d);
    for (int h = 0; h < 2; ++h, dst += 128) {
      const uint8_t* ql = b.ql + 64 * h;
      const uint8_t* qh = b.qh + 32 * h;
      const int8_t* sc = b.scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        // quarter k covers elements 32k + l: low nibble source ql[l + 32*(k&1)], nibble k/2, bits 2k of qh.
        for (int k = 0; k < 4; ++k) {
          const int lowq = (k < 2) ? (ql[l + 32 * k] & 0x0f) : (ql[l + 32 * (k - 2)] >> 4);
          const int q = (lowq | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
          // (d * scale) * q, in that order, as ggml computes it.
          dst[32 * k + l] = d * static_cast<float>(sc[l / 16 + 2 * k]) * static_cast<float>(q);
        }
      }
    }
  }
}

void dequantize_q8_K(const void* src, float* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i, dst += kQK_K) {
    const auto b = load_block<BlockQ8_K>(src, i);
    for (uint32_t j = 0; j < kQK_K; ++j) dst[j] = b.d * static_cast<float>(b.qs[j]);
  }
}

// ---- Quantization ----

void quantize_q2_K(const float* src, void* dst, int64_t blocks) {
  constexpr float kLevels = 15.0f;  // 4-bit sub-block scales and mins
  for (int64_t i = 0; i < blocks; ++i, src += kQK_K) {
    uint8_t q[kQK_K];
    float scales[16], mins[16], w[16];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) w[l] = std::fabs(src[16 * j + l]);
      scales[j] = fit_affine(16, 3, src + 16 * j, w, q + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    BlockQ2_K b;
    // Bytes hold scale | min << 4; values are stored through uint8_t as in ggml (an out-of-range scale
    // from a degenerate fit wraps the same way there).
    for (int j = 0; j < 16; ++j) b.scales[j] = 0;
    b.d = 0;
    b.dmin = 0;
    if (max_scale > 0.0f) {
      const float iscale = kLevels / max_scale;
      for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      b.d = fp32_to_fp16(max_scale / kLevels);
    }
    if (max_min > 0.0f) {
      const float iscale = kLevels / max_min;
      for (int j = 0; j < 16; ++j) b.scales[j] |= static_cast<uint8_t>(nearest_int(iscale * mins[j]) << 4);
      b.dmin = fp32_to_fp16(max_min / kLevels);
    }
    uint8_t sc[16], mn[16];
    for (int j = 0; j < 16; ++j) {
      sc[j] = b.scales[j] & 0x0f;
      mn[j] = b.scales[j] >> 4;
    }
    requantize_affine(src, 16, 16, 3, fp16_to_fp32(b.d), fp16_to_fp32(b.dmin), sc, mn, q);
    pack_2bit(q, b.qs);
    store_block(dst, i, b);
  }
}

void quantize_q3_K(const float* src, void* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i, src += kQK_K) {
    int8_t q[kQK_K];
    float scales[16];
    float amax = 0.0f, max_scale = 0.0f;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_symmetric_descent(16, 4, src + 16 * j, q + 16 * j);
      if (std::fabs(scales[j]) > amax) {
        amax = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    BlockQ3_K b;
    std::memset(b.scales, 0, sizeof(b.scales));
    b.d = 0;
    if (max_scale != 0.0f) {
      // Signed 6-bit scales with the largest-magnitude one mapped to -32.
      const float iscale = -32.0f / max_scale;
      for (int j = 0; j < 16; ++j) {
        const auto rounded = static_cast<int8_t>(nearest_int(iscale * scales[j]));  // wraps as in ggml
        const int l = clamp_int(rounded, -32, 31) + 32;
        if (j < 8)
          b.scales[j] = static_cast<uint8_t>(l & 0x0f);
        else
          b.scales[j - 8] |= static_cast<uint8_t>((l & 0x0f) << 4);
        b.scales[8 + j % 4] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
      }
      b.d = fp32_to_fp16(1.0f / iscale);
    }
    const float d_all = fp16_to_fp32(b.d);
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * static_cast<float>(unpack_scale_q3(j, b.scales) - 32);
      if (d == 0.0f) continue;
      for (int l = 0; l < 16; ++l)
        q[16 * j + l] = static_cast<int8_t>(clamp_int(nearest_int(src[16 * j + l] / d), -4, 3) + 4);
    }
    // Split the 3-bit codes: bit 2 into hmask, bits 0-1 into qs.
    uint8_t low[kQK_K];
    std::memset(b.hmask, 0, sizeof(b.hmask));
    for (int e = 0; e < static_cast<int>(kQK_K); ++e) {
      int code = q[e];
      if (code > 3) {
        b.hmask[e % 32] |= static_cast<uint8_t>(1u << (e / 32));
        code -= 4;
      }
      low[e] = static_cast<uint8_t>(code);
    }
    pack_2bit(low, b.qs);
    store_block(dst, i, b);
  }
}

void quantize_q4_K(const float* src, void* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i, src += kQK_K) {
    uint8_t q[kQK_K], sc[8], mn[8];
    float d = 0.0f, dmin = 0.0f;
    fit_k4_scales(src, 15, -1.0f, 0.1f, 20, q, sc, mn, &d, &dmin);
    BlockQ4_K b;
    pack_scale_min_k4(sc, mn, b.scales);
    b.d = fp32_to_fp16(d);
    b.dmin = fp32_to_fp16(dmin);
    requantize_affine(src, 32, 8, 15, fp16_to_fp32(b.d), fp16_to_fp32(b.dmin), sc, mn, q);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l)
        b.qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    store_block(dst, i, b);
  }
}

void quantize_q5_K(const float* src, void* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i, src += kQK_K) {
    uint8_t q[kQK_K], sc[8], mn[8];
    float d = 0.0f, dmin = 0.0f;
    fit_k4_scales(src, 31, -0.5f, 0.1f, 15, q, sc, mn, &d, &dmin);
    BlockQ5_K b;
    pack_scale_min_k4(sc, mn, b.scales);
    b.d = fp32_to_fp16(d);
    b.dmin = fp32_to_fp16(dmin);
    requantize_affine(src, 32, 8, 31, fp16_to_fp32(b.d), fp16_to_fp32(b.dmin), sc, mn, q);
    std::memset(b.qh, 0, sizeof(b.qh));
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        const int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
        b.qs[32 * c + l] = static_cast<uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
        b.qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
    store_block(dst, i, b);
  }
}

void quantize_q6_K(const float* src, void* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i, src += kQK_K) {
    int8_t q[kQK_K];
    float scales[16];
    float max_abs = 0.0f, max_scale = 0.0f;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_symmetric_weighted(16, 32, src + 16 * j, q + 16 * j);
      if (std::fabs(scales[j]) > max_abs) {
        max_abs = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    BlockQ6_K b;
    std::memset(&b, 0, sizeof(b));
    if (max_abs < kGroupEpsilon) {  // an all-zero super-block is all-zero bytes
      store_block(dst, i, b);
      continue;
    }
    // Signed 8-bit sub-block scales with the largest-magnitude one mapped to -128.
    const float iscale = -128.0f / max_scale;
    b.d = fp32_to_fp16(1.0f / iscale);
    for (int j = 0; j < 16; ++j) {
      const int s = nearest_int(iscale * scales[j]);
      b.scales[j] = static_cast<int8_t>(s < 127 ? s : 127);
    }
    const float d_all = fp16_to_fp32(b.d);
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * static_cast<float>(b.scales[j]);
      if (d == 0.0f) continue;
      for (int l = 0; l < 16; ++l)
        q[16 * j + l] = static_cast<int8_t>(clamp_int(nearest_int(src[16 * j + l] / d), -32, 31) + 32);
    }
    for (int h = 0; h < 2; ++h) {
      const int8_t* e = q + 128 * h;
      for (int l = 0; l < 32; ++l) {
        b.ql[64 * h + l] = static_cast<uint8_t>((e[l] & 0x0f) | ((e[l + 64] & 0x0f) << 4));
        b.ql[64 * h + l + 32] = static_cast<uint8_t>((e[l + 32] & 0x0f) | ((e[l + 96] & 0x0f) << 4));
        b.qh[32 * h + l] = static_cast<uint8_t>((e[l] >> 4) | ((e[l + 32] >> 4) << 2) | ((e[l + 64] >> 4) << 4) |
                                                ((e[l + 96] >> 4) << 6));
      }
    }
    store_block(dst, i, b);
  }
}

// q8_K: fp32 d with the extreme element mapped to -127, codes capped at 127, plus 16-element code sums.
void quantize_q8_K(const float* src, void* dst, int64_t blocks) {
  for (int64_t i = 0; i < blocks; ++i, src += kQK_K) {
    BlockQ8_K b;
    std::memset(&b, 0, sizeof(b));
    float amax = 0.0f;
    const float max = signed_absmax(src, static_cast<int>(kQK_K), &amax);
    if (amax != 0.0f) {
      const float iscale = -127.0f / max;
      for (uint32_t j = 0; j < kQK_K; ++j) {
        const int v = nearest_int(iscale * src[j]);
        b.qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
      }
      for (int g = 0; g < 16; ++g) {
        int sum = 0;
        for (int l = 0; l < 16; ++l) sum += b.qs[16 * g + l];
        b.bsums[g] = static_cast<int16_t>(sum);
      }
      b.d = 1.0f / iscale;
    }
    store_block(dst, i, b);
  }
}

}  // namespace dflash::codec

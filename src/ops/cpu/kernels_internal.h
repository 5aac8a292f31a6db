// Small inner loops shared by the CPU kernels (not part of the ops API).
//
// Every float dot product in ops/cpu has one fixed summation order, so a result never depends on how
// the work was tiled or threaded (matmul of one token equals the same row of a batched matmul, bit
// for bit):
//   acc[l], l = 0..7, accumulates a[k] * b[k] for k = l (mod 8) in increasing k (starting from 0.0f;
//   a ragged tail is zero-padded to 8); then
//   dot = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])).
// Each lane update may be a fused multiply-add where the compiler contracts it (GCC does by default);
// the lanes are one 8-float vector (GCC/Clang vector extension: AVX ymm, or two SSE xmm), so no
// -ffast-math is needed to vectorize.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__GNUC__)
#define DFLASH_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define DFLASH_ALWAYS_INLINE inline
#endif

#if defined(__GNUC__) && !defined(__clang__)
// The 32-byte vector type crosses no ABI boundary (always inlined), so GCC's note about its calling
// convention without AVX is moot. Left ignored for the rest of the including ops/cpu source (the
// note fires where the helpers are inlined).
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace dflash::cpu::detail {

inline constexpr int kLanes = 8;

#if defined(__GNUC__)
typedef float V8 __attribute__((vector_size(32)));
#else
struct V8 {  // portable stand-in with the same lane semantics
  float v[8];
  float& operator[](int i) { return v[i]; }
  float operator[](int i) const { return v[i]; }
  friend V8 operator+(V8 a, const V8& b) { for (int i = 0; i < 8; ++i) a.v[i] += b.v[i]; return a; }
  friend V8 operator*(V8 a, const V8& b) { for (int i = 0; i < 8; ++i) a.v[i] *= b.v[i]; return a; }
  V8& operator+=(const V8& b) { return *this = *this + b; }
};
#endif

DFLASH_ALWAYS_INLINE V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
// The first n (< 8) floats at p, zero-padded.
DFLASH_ALWAYS_INLINE V8 load_partial(const float* p, int64_t n) {
  float tmp[kLanes] = {};
  for (int64_t i = 0; i < n; ++i) tmp[i] = p[i];
  return load8(tmp);
}
DFLASH_ALWAYS_INLINE V8 zero8() {
  V8 v;
  std::memset(&v, 0, sizeof(v));
  return v;
}

DFLASH_ALWAYS_INLINE float reduce_lanes(const V8& acc) {
  const float s0 = acc[0] + acc[4], s1 = acc[1] + acc[5], s2 = acc[2] + acc[6], s3 = acc[3] + acc[7];
  return (s0 + s2) + (s1 + s3);
}

DFLASH_ALWAYS_INLINE float dot(const float* a, const float* b, int64_t n) {
  V8 acc = zero8();
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) acc += load8(a + k) * load8(b + k);
  if (k < n) acc += load_partial(a + k, n - k) * load_partial(b + k, n - k);
  return reduce_lanes(acc);
}

// y[i] += a * x[i]
DFLASH_ALWAYS_INLINE void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// y[i] *= a
DFLASH_ALWAYS_INLINE void scale(float a, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

}  // namespace dflash::cpu::detail

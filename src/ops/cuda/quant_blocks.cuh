// Device decoding of ggml block formats and half floats, shared by the CUDA kernels (dequantize.cu,
// matmul.cu). Each codec decodes one group of 16 consecutive elements of a block from its bytes (in
// shared or global memory, any alignment; q6_K, q8_0 and q4_0 from their device form, weight_form.h: the
// block's body and its d apart) to f32, bit-identical with the CPU codecs of
// tensor/quant_legacy.cpp and tensor/quant_k.cpp: each float operation of the CPU codec appears here as an
// explicitly rounded intrinsic (__fmul_rn, __fadd_rn, __fsub_rn) in the same order, so nvcc cannot fuse
// a*b+c or a*b-c into an FMA; the fp16/bf16 conversions reproduce tensor/half.h bit for bit, NaN handling
// included. Do not build users with --use_fast_math / -ftz=true: subnormal fp16 scales must survive.
//
// tensor/dtype.h cannot be included (it pulls base/status.h and fmt, which nvcc rejects), so the type
// ids and block layouts are restated below. Both are fixed by the GGUF format (ids = ggml_type, layouts
// = ggml's block_* structs); dequantize_host.cpp pins them with static_asserts and
// tests/unit/cuda/dequantize_test.cpp checks every type against the CPU codec.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace dflash::cuda::qblocks {

// ggml_type ids (= DType values).
enum TypeId : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15, kBF16 = 30,
};

constexpr int kGroup = 16;  // consecutive elements one decode() call produces

// ---- Bit-exact scalar conversions (as tensor/half.h) ----

__device__ __forceinline__ float fp16_to_f32(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u);  // inf, or NaN made quiet
  } else if (exp != 0) {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal fp16: leading one at bit p, value 1.f * 2^(p - 24)
    const uint32_t p = 31u - static_cast<uint32_t>(__clz(mant));
    const uint32_t frac = (mant << (10u - p)) & 0x3ffu;
    bits = sign | ((p + 127u - 24u) << 23) | (frac << 13);
  }
  return __uint_as_float(bits);
}

// The low 16 bits of h as fp16, by the hardware conversion: exact, as fp16_to_f32 (a branchy software decode);
// the two differ only in a NaN's payload. The product kernels decode their scales with it where fp16_to_f32's
// branches would cost (gemv_q8.cu says where they keep fp16_to_f32).
__device__ __forceinline__ float fp16_bits_hw(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

__device__ __forceinline__ float bf16_to_f32(uint32_t h) { return __uint_as_float(h << 16); }

// The hardware conversion rounds to nearest even like fp32_to_fp16 (subnormal results kept, >= 65520 to
// inf); only NaN differs: half.h makes every NaN the quiet 0x7e00 with the input's sign.
__device__ __forceinline__ uint16_t f32_to_fp16_bits(float f) {
  const uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>(((bits >> 16) & 0x8000u) | 0x7e00u);
  return __half_as_ushort(__float2half_rn(f));
}

__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  const uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// ---- Block codecs: decode(block bytes in shared memory, group g, 16 outputs) ----
// Element e of a block belongs to group e / 16. Byte offsets are those of tensor/dtype.h's Block* structs.

__device__ __forceinline__ uint32_t load_u16(const uint8_t* p) { return p[0] | (uint32_t{p[1]} << 8); }
__device__ __forceinline__ uint32_t load_u32(const uint8_t* p) {
  return p[0] | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}
__device__ __forceinline__ float i2f(int v) { return static_cast<float>(v); }  // exact for these codes

// q4_K / q5_K: the 6-bit scales and mins of sub-blocks 2c and 2c + 1 from the 12 packed bytes s0 (bytes
// 0-3), s1 (4-7), s2 (8-11). Sub-block j < 4: scale s0 byte j & 63, min s1 byte j & 63; j >= 4: the low
// (scale) or high (min) nibble of s2 byte j - 4, with the top two bits of s0 (scale) or s1 (min) byte j - 4
// above it. The pair's bytes are adjacent (bytes 2(c % 2) and + 1 of each word) and take the same case:
// both are formed at once in 16 bits, without branches.
__device__ __forceinline__ void k4_scales_mins(int c, uint32_t s0, uint32_t s1, uint32_t s2, int (&sc)[2],
                                               int (&m)[2]) {
  const unsigned sh = 16 * (c & 1);
  const uint32_t w0 = s0 >> sh, w1 = s1 >> sh, w2 = s2 >> sh;
  const uint32_t scs = c < 2 ? w0 & 0x3f3fu : (w2 & 0x0f0fu) | ((w0 >> 2) & 0x3030u);
  const uint32_t ms = c < 2 ? w1 & 0x3f3fu : ((w2 >> 4) & 0x0f0fu) | ((w1 >> 2) & 0x3030u);
  sc[0] = static_cast<int>(scs & 0xffu), sc[1] = static_cast<int>(scs >> 8 & 0xffu);
  m[0] = static_cast<int>(ms & 0xffu), m[1] = static_cast<int>(ms >> 8 & 0xffu);
}

// Group g of a legacy block: low nibbles of qs[0..15] (g = 0) or high nibbles (g = 1).
// q4_0 in the device form (weight_form.h): a block's 16 code bytes (qs) and its d (fp16) apart: x = (q - 8) * d.
struct Q4_0 {
  static constexpr int kElems = 32, kBytes = 16;
  // Group g's 16 values (nibble g of the 16 qs bytes) and the block's scale.
  __device__ static void decode_group(const uint8_t* qs, int g, float d, float (&y)[kGroup]) {
#pragma unroll
    for (int l = 0; l < kGroup; ++l) y[l] = __fmul_rn(i2f(((qs[l] >> (4 * g)) & 0x0f) - 8), d);
  }
  __device__ static void decode(const uint8_t* b, uint32_t d_bits, int g, float (&y)[kGroup]) {
    decode_group(b, g, fp16_to_f32(d_bits), y);
  }
};

struct Q4_1 {  // d@0 m@2 qs@4: x = q * d + m
  static constexpr int kElems = 32, kBytes = 20;
  __device__ static void decode(const uint8_t* b, int g, float (&y)[kGroup]) {
    const float d = fp16_to_f32(load_u16(b));
    const float m = fp16_to_f32(load_u16(b + 2));
    const uint8_t* qs = b + 4;
#pragma unroll
    for (int l = 0; l < kGroup; ++l) y[l] = __fadd_rn(__fmul_rn(i2f((qs[l] >> (4 * g)) & 0x0f), d), m);
  }
};

// 5-bit code of element 16g + l: nibble from qs[l], bit 4 = bit (16g + l) of the little-endian word qh.
__device__ __forceinline__ int code_5bit(const uint8_t* qs, uint32_t qh, int g, int l) {
  return ((qs[l] >> (4 * g)) & 0x0f) | static_cast<int>(((qh >> (16 * g + l)) & 1u) << 4);
}

struct Q5_0 {  // d@0 qh@2 qs@6: x = (q - 16) * d
  static constexpr int kElems = 32, kBytes = 22;
  __device__ static void decode(const uint8_t* b, int g, float (&y)[kGroup]) {
    const float d = fp16_to_f32(load_u16(b));
    const uint32_t qh = load_u32(b + 2);
#pragma unroll
    for (int l = 0; l < kGroup; ++l) y[l] = __fmul_rn(i2f(code_5bit(b + 6, qh, g, l) - 16), d);
  }
};

struct Q5_1 {  // d@0 m@2 qh@4 qs@8: x = q * d + m
  static constexpr int kElems = 32, kBytes = 24;
  __device__ static void decode(const uint8_t* b, int g, float (&y)[kGroup]) {
    const float d = fp16_to_f32(load_u16(b));
    const float m = fp16_to_f32(load_u16(b + 2));
    const uint32_t qh = load_u32(b + 4);
#pragma unroll
    for (int l = 0; l < kGroup; ++l) y[l] = __fadd_rn(__fmul_rn(i2f(code_5bit(b + 8, qh, g, l)), d), m);
  }
};

// q8_0 in the device form (weight_form.h): a block's 32 codes (int8) and its d (fp16) apart: x = q * d.
struct Q8_0 {
  static constexpr int kElems = 32, kBytes = 32;
  // Group g's 16 values from its 16 codes (at 16 g of the block's codes) and the block's scale.
  __device__ static void decode_group(const uint8_t* qs, float d, float (&y)[kGroup]) {
#pragma unroll
    for (int l = 0; l < kGroup; ++l) y[l] = __fmul_rn(i2f(static_cast<int8_t>(qs[l])), d);
  }
  __device__ static void decode(const uint8_t* b, uint32_t d_bits, int g, float (&y)[kGroup]) {
    decode_group(b + kGroup * g, fp16_to_f32(d_bits), y);
  }
};

// K-quants: group g = 8h + 2s + t covers elements 128h + 32s + 16t + l (l < 16), i.e. 16g + l.

struct Q2_K {  // scales@0[16] qs@16[64] d@80 dmin@82: x = (d*sc) * q - dmin*m
  static constexpr int kElems = 256, kBytes = 84;
  // Group g = 8h + 2s + t: elements 128h + 32s + 16t + [0, 16), bits 2s of qs[32h + 16t + l], scale byte g.
  __device__ static int qs_offset(int g) { return 16 + 32 * (g >> 3) + kGroup * (g & 1); }
  // The group's 16 values from its 16 qs bytes, its scale byte and the block's (d, dmin) fp16 pair (d low).
  __device__ static void decode_group(const uint8_t* qs, uint32_t sc, uint32_t dm_bits, int g, float (&y)[kGroup]) {
    const int s = (g >> 1) & 3;
    const float dl = __fmul_rn(fp16_to_f32(dm_bits & 0xffffu), i2f(sc & 0x0f));
    const float ml = __fmul_rn(fp16_to_f32(dm_bits >> 16), i2f(sc >> 4));
#pragma unroll
    for (int l = 0; l < kGroup; ++l) y[l] = __fsub_rn(__fmul_rn(dl, i2f((qs[l] >> (2 * s)) & 3)), ml);
  }
  __device__ static void decode(const uint8_t* b, int g, float (&y)[kGroup]) {
    decode_group(b + qs_offset(g), b[g], load_u16(b + 80) | (load_u16(b + 82) << 16), g, y);
  }
};

struct Q3_K {  // hmask@0[32] qs@32[64] scales@96[12] d@108: x = (d*(sc-32)) * (q - 4 or q)
  static constexpr int kElems = 256, kBytes = 110;
  __device__ static void decode(const uint8_t* b, int g, float (&y)[kGroup]) {
    const int h = g >> 3, s = (g >> 1) & 3, t = g & 1;
    const uint8_t* scales = b + 96;
    const int low = g < 8 ? (scales[g] & 0x0f) : (scales[g - 8] >> 4);
    const int high = (scales[8 + g % 4] >> (2 * (g / 4))) & 3;
    const float dl = __fmul_rn(fp16_to_f32(load_u16(b + 108)), i2f((low | (high << 4)) - 32));
    const uint8_t* hmask = b + 16 * t;
    const uint8_t* qs = b + 32 + 32 * h + 16 * t;
    const int hbit = 4 * h + s;  // = element / 32
#pragma unroll
    for (int l = 0; l < kGroup; ++l) {
      const int code = ((qs[l] >> (2 * s)) & 3) - (((hmask[l] >> hbit) & 1) ? 0 : 4);
      y[l] = __fmul_rn(dl, i2f(code));
    }
  }
};

// q3_K's 6-bit scale of 16-element group g = 8h + 2k + t, minus 32, from the block's 16-byte word at byte 96
// (scales[12], d): low 4 bits from byte 2k + t (nibble h), high 2 from byte 8 + 2(k % 2) + t, bits 2(2h + k / 2).
__device__ __forceinline__ int q3k_scale(const uint4& hdr, int h, int k, int t) {
  const uint32_t lo_word = k < 2 ? hdr.x : hdr.y;
  const int lo = static_cast<int>((lo_word >> (8 * (2 * (k & 1) + t) + 4 * h)) & 0xfu);
  const int hi = static_cast<int>((hdr.z >> (8 * (2 * (k & 1) + t) + 2 * (2 * h + (k >> 1)))) & 3u);
  return (lo | (hi << 4)) - 32;
}
// Four signed q3_K codes (int8 bytes) of shift group k in half h from a qs word and the inverted hmask word
// of the same elements: bits 2k of qs, minus 4 where hmask bit 4h + k is clear (q | 0xfc: no byte borrows).
__device__ __forceinline__ int q3k_codes(uint32_t qs, uint32_t not_hmask, int h, int k) {
  const uint32_t q = (qs >> (2 * k)) & 0x03030303u;
  const uint32_t clear = (not_hmask >> (4 * h + k)) & 0x01010101u;
  return static_cast<int>(q | (clear * 0xfcu));
}

// A codec over a padded device form (weight_form.h: q3_K): its blocks kStride bytes apart, each the stored
// block's bytes first.
template <typename C, int kStride>
struct Padded : C {
  static constexpr int kBytes = kStride;
};

// q4_K / q5_K: group g lies in 32-element sub-block j = g/2 (64-element chunk c = j/2, nibble j&1) at
// offset 16*(g&1); the 6-bit (scale, min) of j come from the 12 packed bytes at offset 4.
template <bool kHighBits>
struct K4 {
  static constexpr int kElems = 256, kBytes = kHighBits ? 176 : 144;  // qh@16[32] qs@48 | qs@16
  __device__ static void decode(const uint8_t* b, int g, float (&y)[kGroup]) {
    const int j = g >> 1, c = j >> 1, nib = j & 1, lo = kGroup * (g & 1);
    const uint8_t* sb = b + 4;
    int sc, m;
    if (j < 4) {
      sc = sb[j] & 63;
      m = sb[j + 4] & 63;
    } else {
      sc = (sb[j + 4] & 0x0f) | ((sb[j - 4] >> 6) << 4);
      m = (sb[j + 4] >> 4) | ((sb[j] >> 6) << 4);
    }
    const float ds = __fmul_rn(fp16_to_f32(load_u16(b)), i2f(sc));
    const float ms = __fmul_rn(fp16_to_f32(load_u16(b + 2)), i2f(m));
    const uint8_t* qs = b + (kHighBits ? 48 : 16) + 32 * c + lo;
    const uint8_t* qh = b + 16 + lo;
#pragma unroll
    for (int l = 0; l < kGroup; ++l) {
      int q = (qs[l] >> (4 * nib)) & 0x0f;
      if constexpr (kHighBits) q |= ((qh[l] >> j) & 1) << 4;
      y[l] = __fsub_rn(__fmul_rn(ds, i2f(q)), ms);
    }
  }
};
using Q4_K = K4<false>;  // d@0 dmin@2 scales@4[12] qs@16[128]: x = (d*sc) * q - dmin*m
using Q5_K = K4<true>;   // d@0 dmin@2 scales@4[12] qh@16[32] qs@48[128]

// q6_K in the device form (weight_form.h): a block's first 208 bytes, ql@0[128] qh@128[64] scales@192[16]
// int8, and its d (fp16) apart: x = (d*sc) * (q - 32).
struct Q6_K {
  static constexpr int kElems = 256, kBytes = 208;
  // Group g = 8h + 2k + t: elements 128h + 32k + l' with l' = 16t + l; low nibble from
  // ql[64h + l' + 32(k&1)] (nibble k>>1), bits 4-5 from bit pair k of qh[32h + l'], scale scales[g].
  __device__ static int ql_offset(int g) { return 64 * (g >> 3) + kGroup * (g & 1) + 32 * ((g >> 1) & 1); }
  __device__ static int qh_offset(int g) { return 128 + 32 * (g >> 3) + kGroup * (g & 1); }
  __device__ static float group_scale(const uint8_t* b, uint32_t d_bits, int g) {
    return __fmul_rn(fp16_to_f32(d_bits), i2f(static_cast<int8_t>(b[192 + g])));
  }
  // The group's 16 values from its 16 ql bytes and 16 qh bytes (at ql_offset(g), qh_offset(g)).
  __device__ static void decode_group(const uint8_t* ql, const uint8_t* qh, int g, float dsc, float (&y)[kGroup]) {
    const int k = (g >> 1) & 3;
#pragma unroll
    for (int l = 0; l < kGroup; ++l) {
      const int q = (((ql[l] >> (4 * (k >> 1))) & 0x0f) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
      y[l] = __fmul_rn(dsc, i2f(q));
    }
  }
  __device__ static void decode(const uint8_t* b, uint32_t d_bits, int g, float (&y)[kGroup]) {
    decode_group(b + ql_offset(g), b + qh_offset(g), g, group_scale(b, d_bits, g), y);
  }
};

struct Q8_K {  // d@0 (fp32) qs@4[256] int8, bsums@260 (unused): x = d * q
  static constexpr int kElems = 256, kBytes = 292;
  __device__ static void decode(const uint8_t* b, int g, float (&y)[kGroup]) {
    const float d = __uint_as_float(load_u32(b));
    const uint8_t* qs = b + 4 + kGroup * g;
#pragma unroll
    for (int l = 0; l < kGroup; ++l) y[l] = __fmul_rn(d, i2f(static_cast<int8_t>(qs[l])));
  }
};

}  // namespace dflash::cuda::qblocks

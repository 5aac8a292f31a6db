// Dequantization kernels: ggml block formats and half floats to f32/bf16/f16, bit-identical with the CPU
// codecs of tensor/quant_legacy.cpp and tensor/quant_k.cpp.
//
// Work split: every thread decodes one group of 16 consecutive output elements, so a 32-element legacy
// block is 2 threads and a 256-element k-quant super-block is 16. In a k-quant every 16-element group
// lies inside one sub-block, so each thread unpacks its scale (and min) once. A CTA of 256 threads
// handles a tile of 256 * 16 = 4096 elements: it first copies the tile's blocks (a contiguous byte range
// of the source, at any alignment) into shared memory with 16-byte loads, then each thread decodes from
// there and writes its 16 outputs (four 16-byte stores for f32, two for bf16/f16 when dst is 16-byte
// aligned). f32/f16/bf16 sources are converted elementwise.
//
// Exactness: each float operation of the CPU codec appears here as an explicitly rounded intrinsic
// (__fmul_rn, __fadd_rn, __fsub_rn) in the same order, so nvcc cannot fuse a*b+c or a*b-c into an FMA;
// the fp16/bf16 conversions reproduce tensor/half.h bit for bit, NaN handling included.
// Do not build this file with --use_fast_math / -ftz=true: subnormal fp16 scales must survive.
//
// tensor/dtype.h cannot be included (it pulls base/status.h and fmt, which nvcc rejects), so the type
// ids and block layouts are restated below. Both are fixed by the GGUF format (ids = ggml_type, layouts
// = ggml's block_* structs); tests/unit/cuda/dequantize_test.cpp checks every type against the CPU codec.
#include <climits>
#include <cstddef>
#include <cstdint>

#include "ops/cuda/dequantize.h"

namespace dflash::cuda {
namespace {

// ggml_type ids (= DType values).
enum TypeId : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15, kBF16 = 30,
};

constexpr int kThreads = 256;  // threads per CTA
constexpr int kGroup = 16;     // consecutive output elements per thread
constexpr int64_t kMaxGrid = int64_t{1} << 20;

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

// ---- Output element types ----

template <typename Out>
struct OutBits;
template <>
struct OutBits<float> {
  using Bits = uint32_t;
  __device__ static Bits of(float f) { return __float_as_uint(f); }
};
template <>
struct OutBits<__nv_bfloat16> {
  using Bits = uint16_t;
  __device__ static Bits of(float f) { return f32_to_bf16_bits(f); }
};
template <>
struct OutBits<__half> {
  using Bits = uint16_t;
  __device__ static Bits of(float f) { return f32_to_fp16_bits(f); }
};

// Stores 16 values at dst; kAligned: dst is 16-byte aligned (then so is every group's start).
template <typename Out, bool kAligned>
__device__ __forceinline__ void store_group(Out* dst, const float (&y)[kGroup]) {
  using Bits = typename OutBits<Out>::Bits;
  if constexpr (kAligned && sizeof(Bits) == 4) {
    auto* out = reinterpret_cast<uint4*>(dst);
#pragma unroll
    for (int k = 0; k < kGroup / 4; ++k)
      out[k] = make_uint4(OutBits<Out>::of(y[4 * k]), OutBits<Out>::of(y[4 * k + 1]), OutBits<Out>::of(y[4 * k + 2]),
                          OutBits<Out>::of(y[4 * k + 3]));
  } else if constexpr (kAligned && sizeof(Bits) == 2) {
    // Little-endian pairs: the even element in the low half of each word.
    auto pair = [&](int k) {
      return uint32_t{OutBits<Out>::of(y[2 * k])} | (uint32_t{OutBits<Out>::of(y[2 * k + 1])} << 16);
    };
    auto* out = reinterpret_cast<uint4*>(dst);
    out[0] = make_uint4(pair(0), pair(1), pair(2), pair(3));
    out[1] = make_uint4(pair(4), pair(5), pair(6), pair(7));
  } else {
    auto* out = reinterpret_cast<Bits*>(dst);
#pragma unroll
    for (int k = 0; k < kGroup; ++k) out[k] = OutBits<Out>::of(y[k]);
  }
}

// ---- Block codecs: decode(block bytes in shared memory, group g, 16 outputs) ----
// Element e of a block belongs to group e / 16. Byte offsets are those of tensor/dtype.h's Block* structs.

__device__ __forceinline__ uint32_t load_u16(const uint8_t* p) { return p[0] | (uint32_t{p[1]} << 8); }
__device__ __forceinline__ uint32_t load_u32(const uint8_t* p) {
  return p[0] | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}
__device__ __forceinline__ float i2f(int v) { return static_cast<float>(v); }  // exact for these codes

// Group g of a legacy block: low nibbles of qs[0..15] (g = 0) or high nibbles (g = 1).
struct Q4_0 {  // d@0 qs@2: x = (q - 8) * d
  static constexpr int kElems = 32, kBytes = 18;
  __device__ static void decode(const uint8_t* b, int g, float (&y)[kGroup]) {
    const float d = fp16_to_f32(load_u16(b));
    const uint8_t* qs = b + 2;
#pragma unroll
    for (int l = 0; l < kGroup; ++l) y[l] = __fmul_rn(i2f(((qs[l] >> (4 * g)) & 0x0f) - 8), d);
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

struct Q8_0 {  // d@0 qs@2 (int8): x = q * d
  static constexpr int kElems = 32, kBytes = 34;
  __device__ static void decode(const uint8_t* b, int g, float (&y)[kGroup]) {
    const float d = fp16_to_f32(load_u16(b));
    const uint8_t* qs = b + 2 + kGroup * g;
#pragma unroll
    for (int l = 0; l < kGroup; ++l) y[l] = __fmul_rn(i2f(static_cast<int8_t>(qs[l])), d);
  }
};

// K-quants: group g = 8h + 2s + t covers elements 128h + 32s + 16t + l (l < 16), i.e. 16g + l.

struct Q2_K {  // scales@0[16] qs@16[64] d@80 dmin@82: x = (d*sc) * q - dmin*m
  static constexpr int kElems = 256, kBytes = 84;
  __device__ static void decode(const uint8_t* b, int g, float (&y)[kGroup]) {
    const int h = g >> 3, s = (g >> 1) & 3, t = g & 1;
    const uint32_t sc = b[g];
    const float dl = __fmul_rn(fp16_to_f32(load_u16(b + 80)), i2f(sc & 0x0f));
    const float ml = __fmul_rn(fp16_to_f32(load_u16(b + 82)), i2f(sc >> 4));
    const uint8_t* qs = b + 16 + 32 * h + 16 * t;
#pragma unroll
    for (int l = 0; l < kGroup; ++l) y[l] = __fsub_rn(__fmul_rn(dl, i2f((qs[l] >> (2 * s)) & 3)), ml);
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

struct Q6_K {  // ql@0[128] qh@128[64] scales@192[16] int8, d@208: x = (d*sc) * (q - 32)
  static constexpr int kElems = 256, kBytes = 210;
  // Group g = 8h + 2k + t: elements 128h + 32k + l' with l' = 16t + l; low nibble from
  // ql[64h + l' + 32(k&1)] (nibble k>>1), bits 4-5 from bit pair k of qh[32h + l'], scale scales[g].
  __device__ static void decode(const uint8_t* b, int g, float (&y)[kGroup]) {
    const int h = g >> 3, k = (g >> 1) & 3, lo = kGroup * (g & 1);
    const float dsc = __fmul_rn(fp16_to_f32(load_u16(b + 208)), i2f(static_cast<int8_t>(b[192 + g])));
    const uint8_t* ql = b + 64 * h + lo + 32 * (k & 1);
    const uint8_t* qh = b + 128 + 32 * h + lo;
#pragma unroll
    for (int l = 0; l < kGroup; ++l) {
      const int q = (((ql[l] >> (4 * (k >> 1))) & 0x0f) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
      y[l] = __fmul_rn(dsc, i2f(q));
    }
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

// ---- Block kernel ----

template <typename Codec>
struct TileShape {
  static constexpr int kGroupsPerBlock = Codec::kElems / kGroup;
  static constexpr int kBlocks = kThreads / kGroupsPerBlock;  // blocks per tile
  // The tile's bytes, placed at their address modulo 16 (up to 15 bytes of lead-in).
  static constexpr int kSmemWords = (15 + kBlocks * Codec::kBytes + 15) / 16;
  static_assert(Codec::kElems % kGroup == 0 && kThreads % kGroupsPerBlock == 0);
};

// Min 4 CTAs per SM: lets ptxas use 64 registers, which avoids spilling the 16 outputs.
template <typename Codec, typename Out, bool kAlignedDst>
__global__ void __launch_bounds__(kThreads, 4)
    dequantize_blocks_kernel(const uint8_t* __restrict__ src, Out* __restrict__ dst, int64_t blocks) {
  using Shape = TileShape<Codec>;
  __shared__ uint4 smem[Shape::kSmemWords];
  auto* sbytes = reinterpret_cast<uint8_t*>(smem);
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t tiles = (blocks + Shape::kBlocks - 1) / Shape::kBlocks;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t first = tile * Shape::kBlocks;
    const int nb = static_cast<int>(blocks - first < Shape::kBlocks ? blocks - first : Shape::kBlocks);
    // Copy bytes [begin, end) to smem at offset (address - base): head bytes up to the first 16-byte
    // boundary, whole 16-byte words, tail bytes. Nothing outside [begin, end) is read.
    const uint8_t* begin = src + first * Codec::kBytes;
    const auto ub = reinterpret_cast<uintptr_t>(begin);
    const uintptr_t ue = ub + static_cast<uintptr_t>(nb) * Codec::kBytes;
    const uintptr_t base = ub & ~uintptr_t{15};
    uintptr_t a0 = (ub + 15) & ~uintptr_t{15};
    if (a0 > ue) a0 = ue;
    uintptr_t a1 = ue & ~uintptr_t{15};
    if (a1 < a0) a1 = a0;
    const int head = static_cast<int>(a0 - ub), tail = static_cast<int>(ue - a1);
    const int words = static_cast<int>((a1 - a0) / 16);
    if (tid < head) sbytes[(ub - base) + tid] = begin[tid];
    if (tid >= 32 && tid - 32 < tail) sbytes[(a1 - base) + (tid - 32)] = begin[(a1 - ub) + (tid - 32)];
    const auto* gwords = reinterpret_cast<const uint4*>(begin + (a0 - ub));
    uint4* swords = smem + (a0 - base) / 16;
    for (int w = tid; w < words; w += kThreads) swords[w] = gwords[w];
    __syncthreads();

    const int local_block = tid / Shape::kGroupsPerBlock;
    if (local_block < nb) {
      float y[kGroup];
      Codec::decode(sbytes + (ub - base) + local_block * Codec::kBytes, tid % Shape::kGroupsPerBlock, y);
      store_group<Out, kAlignedDst>(dst + first * Codec::kElems + int64_t{tid} * kGroup, y);
    }
    __syncthreads();  // smem is refilled by the next tile
  }
}

template <typename Codec, typename Out>
cudaError_t launch_blocks(const void* src, Out* dst, int64_t n, cudaStream_t stream) {
  const int64_t blocks = n / Codec::kElems;
  const int64_t tiles = (blocks + TileShape<Codec>::kBlocks - 1) / TileShape<Codec>::kBlocks;
  const auto grid = static_cast<unsigned>(tiles < kMaxGrid ? tiles : kMaxGrid);
  const auto* s = static_cast<const uint8_t*>(src);
  if (reinterpret_cast<uintptr_t>(dst) % 16 == 0)
    dequantize_blocks_kernel<Codec, Out, true><<<grid, kThreads, 0, stream>>>(s, dst, blocks);
  else
    dequantize_blocks_kernel<Codec, Out, false><<<grid, kThreads, 0, stream>>>(s, dst, blocks);
  return cudaGetLastError();
}

// ---- Plain float sources, elementwise ----

template <uint32_t kType, bool kAlignedSrc>
__device__ __forceinline__ float load_plain(const uint8_t* src, int64_t i) {
  if constexpr (kType == kF32) {
    if constexpr (kAlignedSrc) return __uint_as_float(reinterpret_cast<const uint32_t*>(src)[i]);
    return __uint_as_float(load_u32(src + 4 * i));
  } else {
    uint32_t h;
    if constexpr (kAlignedSrc)
      h = reinterpret_cast<const uint16_t*>(src)[i];
    else
      h = load_u16(src + 2 * i);
    if constexpr (kType == kF16) return fp16_to_f32(h);
    return bf16_to_f32(h);
  }
}

template <uint32_t kType, typename Out, bool kAlignedSrc>
__global__ void __launch_bounds__(kThreads)
    convert_plain_kernel(const uint8_t* __restrict__ src, Out* __restrict__ dst, int64_t n) {
  using Bits = typename OutBits<Out>::Bits;
  auto* out = reinterpret_cast<Bits*>(dst);
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += stride)
    out[i] = OutBits<Out>::of(load_plain<kType, kAlignedSrc>(src, i));
}

template <uint32_t kType, typename Out>
cudaError_t launch_plain(const void* src, Out* dst, int64_t n, cudaStream_t stream) {
  constexpr int kBytes = kType == kF32 ? 4 : 2;
  const int64_t ctas = (n + kThreads - 1) / kThreads;
  const auto grid = static_cast<unsigned>(ctas < kMaxGrid ? ctas : kMaxGrid);
  const auto* s = static_cast<const uint8_t*>(src);
  if (reinterpret_cast<uintptr_t>(src) % kBytes == 0)
    convert_plain_kernel<kType, Out, true><<<grid, kThreads, 0, stream>>>(s, dst, n);
  else
    convert_plain_kernel<kType, Out, false><<<grid, kThreads, 0, stream>>>(s, dst, n);
  return cudaGetLastError();
}

// ---- Dispatch ----

struct Layout {
  uint32_t id;
  int64_t elems, bytes;  // per block
};
constexpr Layout kLayouts[] = {
    {kF32, 1, 4},      {kF16, 1, 2},       {kBF16, 1, 2},      {kQ4_0, 32, 18},   {kQ4_1, 32, 20},
    {kQ5_0, 32, 22},   {kQ5_1, 32, 24},    {kQ8_0, 32, 34},    {kQ2_K, 256, 84},  {kQ3_K, 256, 110},
    {kQ4_K, 256, 144}, {kQ5_K, 256, 176},  {kQ6_K, 256, 210},  {kQ8_K, 256, 292},
};

const Layout* find_layout(uint32_t id) {
  for (const auto& l : kLayouts)
    if (l.id == id) return &l;
  return nullptr;
}

template <typename Out>
cudaError_t dispatch(DType type, const void* src, Out* dst, int64_t rows, int64_t cols, cudaStream_t stream) {
  const uint32_t id = static_cast<uint32_t>(type);
  const Layout* layout = find_layout(id);
  if (layout == nullptr || rows < 0 || cols < 0 || cols % layout->elems != 0) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (rows > INT64_MAX / cols) return cudaErrorInvalidValue;
  const int64_t n = rows * cols;
  if (n / layout->elems > INT64_MAX / layout->bytes) return cudaErrorInvalidValue;
  if (src == nullptr || dst == nullptr) return cudaErrorInvalidValue;
  switch (id) {
    case kF32: return launch_plain<kF32>(src, dst, n, stream);
    case kF16: return launch_plain<kF16>(src, dst, n, stream);
    case kBF16: return launch_plain<kBF16>(src, dst, n, stream);
    case kQ4_0: return launch_blocks<Q4_0>(src, dst, n, stream);
    case kQ4_1: return launch_blocks<Q4_1>(src, dst, n, stream);
    case kQ5_0: return launch_blocks<Q5_0>(src, dst, n, stream);
    case kQ5_1: return launch_blocks<Q5_1>(src, dst, n, stream);
    case kQ8_0: return launch_blocks<Q8_0>(src, dst, n, stream);
    case kQ2_K: return launch_blocks<Q2_K>(src, dst, n, stream);
    case kQ3_K: return launch_blocks<Q3_K>(src, dst, n, stream);
    case kQ4_K: return launch_blocks<Q4_K>(src, dst, n, stream);
    case kQ5_K: return launch_blocks<Q5_K>(src, dst, n, stream);
    case kQ6_K: return launch_blocks<Q6_K>(src, dst, n, stream);
    case kQ8_K: return launch_blocks<Q8_K>(src, dst, n, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool dequantize_supported(DType type) { return find_layout(static_cast<uint32_t>(type)) != nullptr; }

cudaError_t dequantize_rows(DType type, const void* src, float* dst, int64_t rows, int64_t cols,
                            cudaStream_t stream) {
  return dispatch(type, src, dst, rows, cols, stream);
}

cudaError_t dequantize_rows(DType type, const void* src, __nv_bfloat16* dst, int64_t rows, int64_t cols,
                            cudaStream_t stream) {
  return dispatch(type, src, dst, rows, cols, stream);
}

cudaError_t dequantize_rows(DType type, const void* src, __half* dst, int64_t rows, int64_t cols,
                            cudaStream_t stream) {
  return dispatch(type, src, dst, rows, cols, stream);
}

}  // namespace dflash::cuda

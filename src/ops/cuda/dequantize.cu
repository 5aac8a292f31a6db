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
// q6_K, q8_0, q4_0 and q2_K sources are in the device form (weight_form.h, 16-byte aligned): one thread a group,
// straight from global memory with 16-byte loads. q3_K's padded device form takes the block kernel (112-byte
// blocks).
//
// Exactness: the block codecs (ops/cuda/quant_blocks.cuh, shared with matmul.cu) repeat the CPU codecs'
// float operations in the same order, each rounded on its own; the fp16/bf16 conversions reproduce
// tensor/half.h bit for bit, NaN handling included. Do not build this file with --use_fast_math /
// -ftz=true: subnormal fp16 scales must survive.
#include <climits>
#include <cstddef>
#include <cstdint>

#include "base/checked_math.h"
#include "ops/cuda/dequantize.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/quant_blocks.cuh"
#include "ops/cuda/weight_form.h"

namespace dflash::cuda {
namespace {

using namespace qblocks;  // NOLINT: the codecs and type ids

constexpr int kThreads = 256;  // threads per CTA
constexpr int64_t kMaxGrid = int64_t{1} << 20;

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

// Block codecs (decode a 16-element group of a block): ops/cuda/quant_blocks.cuh.

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
  pdl_begin();
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
  if (is_aligned(dst, 16))
    launch_pdl(dequantize_blocks_kernel<Codec, Out, true>, grid, dim3(kThreads), 0, stream, s, dst, blocks);
  else
    launch_pdl(dequantize_blocks_kernel<Codec, Out, false>, grid, dim3(kThreads), 0, stream, s, dst, blocks);
  return cudaGetLastError();
}

// ---- Split device rows (weight_form.h: q6_K, q8_0, q4_0, q2_K): one thread a 16-element group, its codes
// 16-byte loads straight from global memory (the bodies are 16-byte aligned), its d from the row's scale array ----

// q6_K: the group's 16 ql and 16 qh bytes.
struct SplitQ6 {
  static constexpr int kElems = Q6_K::kElems, kBody = kQ6Body, kDBytes = 2;
  __device__ static void group(const uint8_t* body, uint32_t d_bits, int g, float (&y)[kGroup]) {
    const uint4 ql = *reinterpret_cast<const uint4*>(body + Q6_K::ql_offset(g));
    const uint4 qh = *reinterpret_cast<const uint4*>(body + Q6_K::qh_offset(g));
    const float dsc = Q6_K::group_scale(body, d_bits, g);
    Q6_K::decode_group(reinterpret_cast<const uint8_t*>(&ql), reinterpret_cast<const uint8_t*>(&qh), g, dsc, y);
  }
};
// q8_0: the group's 16 codes.
struct SplitQ80 {
  static constexpr int kElems = Q8_0::kElems, kBody = kQ80Body, kDBytes = 2;
  __device__ static void group(const uint8_t* body, uint32_t d_bits, int g, float (&y)[kGroup]) {
    const uint4 q = *reinterpret_cast<const uint4*>(body + kGroup * g);
    Q8_0::decode_group(reinterpret_cast<const uint8_t*>(&q), fp16_to_f32(d_bits), y);
  }
};

// q4_0: nibble g of the block's 16 code bytes.
struct SplitQ40 {
  static constexpr int kElems = Q4_0::kElems, kBody = kQ40Body, kDBytes = 2;
  __device__ static void group(const uint8_t* body, uint32_t d_bits, int g, float (&y)[kGroup]) {
    const uint4 q = *reinterpret_cast<const uint4*>(body);
    Q4_0::decode_group(reinterpret_cast<const uint8_t*>(&q), g, fp16_to_f32(d_bits), y);
  }
};

// q2_K: the group's 16 qs bytes and its scale byte; d_bits holds the block's (d, dmin) pair.
struct SplitQ2 {
  static constexpr int kElems = Q2_K::kElems, kBody = kQ2Body, kDBytes = 4;
  __device__ static void group(const uint8_t* body, uint32_t dm_bits, int g, float (&y)[kGroup]) {
    const uint4 q = *reinterpret_cast<const uint4*>(body + Q2_K::qs_offset(g));
    Q2_K::decode_group(reinterpret_cast<const uint8_t*>(&q), body[g], dm_bits, g, y);
  }
};

template <typename F, typename Out, bool kAlignedDst>
__global__ void __launch_bounds__(kThreads, 4)
    dequantize_split_kernel(const uint8_t* __restrict__ src, Out* __restrict__ dst, int64_t rows, int64_t blocks) {
  pdl_begin();
  constexpr int kGroups = F::kElems / kGroup;
  const int64_t rb = split_row_bytes(blocks, F::kBody, F::kDBytes), groups = rows * blocks * kGroups;
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < groups; i += stride) {
    const int g = static_cast<int>(i % kGroups);
    const int64_t blk = i / kGroups, r = blk / blocks, b = blk % blocks;
    const uint8_t* row = src + r * rb;
    float y[kGroup];
    const uint8_t* dp = row + split_d_offset(blocks, F::kBody, b, F::kDBytes);
    F::group(row + b * F::kBody, F::kDBytes == 4 ? load_u32(dp) : load_u16(dp), g, y);
    store_group<Out, kAlignedDst>(dst + i * kGroup, y);
  }
}

template <typename F, typename Out>
cudaError_t launch_split(const void* src, Out* dst, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (!is_aligned(src, 16)) return cudaErrorInvalidValue;
  const int64_t groups = rows * (cols / kGroup);
  const int64_t ctas = (groups + kThreads - 1) / kThreads;
  const auto grid = static_cast<unsigned>(ctas < kMaxGrid ? ctas : kMaxGrid);
  const auto* s = static_cast<const uint8_t*>(src);
  const int64_t blocks = cols / F::kElems;
  if (is_aligned(dst, 16))
    launch_pdl(dequantize_split_kernel<F, Out, true>, grid, dim3(kThreads), 0, stream, s, dst, rows, blocks);
  else
    launch_pdl(dequantize_split_kernel<F, Out, false>, grid, dim3(kThreads), 0, stream, s, dst, rows, blocks);
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
  pdl_begin();
  using Bits = typename OutBits<Out>::Bits;
  auto* out = reinterpret_cast<Bits*>(dst);
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += stride)
    out[i] = OutBits<Out>::of(load_plain<kType, kAlignedSrc>(src, i));
}

// f32 to a 2-byte type, 8 elements a thread (two 16-byte loads, one 16-byte store): src and dst 16-byte
// aligned, `groups` groups of 8.
template <typename Out>
__global__ void __launch_bounds__(kThreads)
    convert_f32_x8_kernel(const float4* __restrict__ src, uint4* __restrict__ dst, int64_t groups) {
  pdl_begin();
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < groups; i += stride) {
    const float4 a = src[2 * i], b = src[2 * i + 1];
    auto pair = [](float lo, float hi) {
      return uint32_t{OutBits<Out>::of(lo)} | (uint32_t{OutBits<Out>::of(hi)} << 16);
    };
    dst[i] = make_uint4(pair(a.x, a.y), pair(a.z, a.w), pair(b.x, b.y), pair(b.z, b.w));
  }
}

template <uint32_t kType, typename Out>
cudaError_t launch_plain(const void* src, Out* dst, int64_t n, cudaStream_t stream) {
  if constexpr (kType == kF32 && sizeof(Out) == 2) {
    // The bulk in groups of 8 where both ends allow 16-byte accesses; the rest elementwise below.
    if (is_aligned(src, 16) && is_aligned(dst, 16) && n >= 8) {
      const int64_t groups = n / 8;
      const int64_t ctas = (groups + kThreads - 1) / kThreads;
      const auto grid = static_cast<unsigned>(ctas < kMaxGrid ? ctas : kMaxGrid);
      launch_pdl(convert_f32_x8_kernel<Out>, grid, dim3(kThreads), 0, stream, static_cast<const float4*>(src),
                 reinterpret_cast<uint4*>(dst), groups);
      if (n == 8 * groups) return cudaGetLastError();
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      src = static_cast<const float*>(src) + 8 * groups;
      dst += 8 * groups;
      n -= 8 * groups;
    }
  }
  constexpr int kBytes = kType == kF32 ? 4 : 2;
  const int64_t ctas = (n + kThreads - 1) / kThreads;
  const auto grid = static_cast<unsigned>(ctas < kMaxGrid ? ctas : kMaxGrid);
  const auto* s = static_cast<const uint8_t*>(src);
  if (is_aligned(src, kBytes))
    launch_pdl(convert_plain_kernel<kType, Out, true>, grid, dim3(kThreads), 0, stream, s, dst, n);
  else
    launch_pdl(convert_plain_kernel<kType, Out, false>, grid, dim3(kThreads), 0, stream, s, dst, n);
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
    case kQ4_0: return launch_split<SplitQ40>(src, dst, rows, cols, stream);
    case kQ4_1: return launch_blocks<Q4_1>(src, dst, n, stream);
    case kQ5_0: return launch_blocks<Q5_0>(src, dst, n, stream);
    case kQ5_1: return launch_blocks<Q5_1>(src, dst, n, stream);
    case kQ8_0: return launch_split<SplitQ80>(src, dst, rows, cols, stream);
    case kQ2_K: return launch_split<SplitQ2>(src, dst, rows, cols, stream);
    case kQ3_K: return launch_blocks<Padded<Q3_K, kQ3Stride>>(src, dst, n, stream);  // weight_form.h
    case kQ4_K: return launch_blocks<Q4_K>(src, dst, n, stream);
    case kQ5_K: return launch_blocks<Q5_K>(src, dst, n, stream);
    case kQ6_K: return launch_split<SplitQ6>(src, dst, rows, cols, stream);
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

// The int8 activation quantizer of the integer-dot GEMV (gemv_q8.h) as device functions, so that the producer of
// a GEMV's input (SwiGLU, RMSNorm) can write the quantized form beside its f32 output without another kernel.
// quantize_q8_block (a warp a block, used by quantize_q8_rows too) and quantize_q8_pair (a lane pair a block, 16
// values a lane: RMSNorm's one CTA a row quantizes its 128-160 blocks at once, where a warp a block took 16-20
// blocks one after another on the step's critical path) form the same codes, scale and sums bit for bit: the
// maximum and the integer sums are exact in any order, and each code is the same expression of its value.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/gemv_q8.h"

namespace dflash::cuda {

// Quantizes the 32-element block `blk` whose element `lane` this lane holds in `v`. The whole warp must
// call it together (all 32 lanes, the same blk).
__device__ __forceinline__ void quantize_q8_block(float v, int lane, int64_t blk, const Q8Out& out) {
  constexpr unsigned kFull = 0xffffffffu;
  const bool bad = __any_sync(kFull, !isfinite(v));
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, o));
  int q = 0;
  if (!bad && amax > 0.0f) q = __float2int_rn(__fmul_rn(v, __fdiv_rn(127.0f, amax)));
  out.xq[blk * 32 + lane] = static_cast<int8_t>(q);
  if (lane == 0) out.xd[blk] = bad ? __int_as_float(0x7fc00000) : __fdiv_rn(amax, 127.0f);
  int sum = q;
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);  // within each half of the warp
  if ((lane & 15) == 0) out.xs[blk * 2 + lane / 16] = sum;
}

// Quantizes the 32-element block `blk`, whose elements 16 h + [0, 16) this lane holds in v (h = lane & 1), with
// lane ^ 1 holding the other half. The whole warp must call it together; lanes with `on` false take part in the
// shuffles and store nothing (their pair must be off too).
__device__ __forceinline__ void quantize_q8_pair(const float (&v)[16], int lane, bool on, int64_t blk,
                                                 const Q8Out& out) {
  constexpr unsigned kFull = 0xffffffffu;
  bool bad = false;
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    bad = bad || !isfinite(v[i]);
    amax = fmaxf(amax, fabsf(v[i]));
  }
  bad = __shfl_xor_sync(kFull, bad ? 1 : 0, 1) != 0 || bad;
  amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, 1));
  const bool codes = !bad && amax > 0.0f;
  const float s = codes ? __fdiv_rn(127.0f, amax) : 0.0f;
  uint32_t packed[4] = {0, 0, 0, 0};
  int sum = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int q = codes ? __float2int_rn(__fmul_rn(v[i], s)) : 0;
    sum += q;
    packed[i / 4] |= (static_cast<uint32_t>(q) & 0xffu) << (8 * (i % 4));
  }
  if (!on) return;
  const int h = lane & 1;
  *reinterpret_cast<uint4*>(out.xq + blk * 32 + 16 * h) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  out.xs[blk * 2 + h] = sum;
  if (h == 0) out.xd[blk] = bad ? __int_as_float(0x7fc00000) : __fdiv_rn(amax, 127.0f);
}

// A CTA of kThreads quantizes the `dim` values of a row staged in shared memory (16-byte aligned: read as float4;
// dim a multiple of 32) as blocks first_blk, first_blk + 1, ...: a lane 16 consecutive values, a lane pair a
// block. Every thread must call it.
template <int kThreads>
__device__ __forceinline__ void quantize_q8_row(const float* row, int64_t dim, int64_t first_blk, const Q8Out& out) {
  const int64_t halves = dim / 16;
  for (int64_t h0 = 0; h0 < halves; h0 += kThreads) {
    const int64_t h = h0 + threadIdx.x;
    const bool on = h < halves;
    float v[16];
#pragma unroll
    for (int i = 0; i < 16; i += 4) {
      const float4 f = on ? *reinterpret_cast<const float4*>(row + 16 * h + i) : make_float4(0, 0, 0, 0);
      v[i] = f.x, v[i + 1] = f.y, v[i + 2] = f.z, v[i + 3] = f.w;
    }
    quantize_q8_pair(v, static_cast<int>(threadIdx.x) & 31, on, first_blk + h / 2, out);
  }
}

}  // namespace dflash::cuda

// The int8 activation quantizer of the integer-dot GEMV (gemv_q8.h) as a warp-level device function, so
// that the producer of a GEMV's input (SwiGLU) can write the quantized form beside its f32 output without
// another kernel: one implementation, used by quantize_q8_rows too, so the fused and the separate forms
// are bit-identical. (RMSNorm does not: a decode step's norm is one CTA per row, and quantizing there
// lengthened its critical path by more than the quantize launch it saved: docs/benchmarks.md.)
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

}  // namespace dflash::cuda

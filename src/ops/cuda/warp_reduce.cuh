// Reductions across a warp (butterfly shuffles: every lane gets the result) and across a block (the warps'
// results through shared memory, added in warp order), each in a fixed order, so a result does not depend
// on timing.
#pragma once

namespace dflash::cuda {

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sum (kMax false) or maximum of v over a block of kBlock threads; every thread gets it. `scratch` (shared
// memory) holds kBlock / 32 values; a call may follow another on the same scratch.
template <int kBlock, bool kMax, typename T>
__device__ T block_reduce(T v, T* scratch) {
  static_assert(kBlock % 32 == 0);
  v = kMax ? warp_max(v) : warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = scratch[0];
  for (int w = 1; w < kBlock / 32; ++w) r = kMax ? fmaxf(r, scratch[w]) : r + scratch[w];
  return r;
}

}  // namespace dflash::cuda

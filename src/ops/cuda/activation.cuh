// Elementwise activations that several kernels apply and must round alike: the SwiGLU kernel (norm_rope.cu) and
// the bf16 products that apply SwiGLU as they store (gemv16_mma_swiglu) give the same bits for the same sums.
// Products and sums by the _rn intrinsics, as the CPU rounds them (no contraction into FMAs).
#pragma once

namespace dflash::cuda {

__device__ __forceinline__ float silu_f(float v) { return __fdiv_rn(v, __fadd_rn(1.0f, expf(-v))); }

// silu(gate) * up.
__device__ __forceinline__ float swiglu_f(float gate, float up) { return __fmul_rn(silu_f(gate), up); }

}  // namespace dflash::cuda

// Kernels of norm_rope.h: RMSNorm (a warp or a block per row), partial NEOX RoPE (a block per token,
// cos/sin once per token in shared memory), row softmax (a block per row) and the elementwise ops
// (grid-stride). Products and sums that the CPU rounds separately use the _rn intrinsics so that nvcc
// cannot fuse them into FMAs.
#include "ops/cuda/norm_rope.h"

#include <cuda_fp16.h>

#include "base/checked_math.h"
#include "ops/cuda/activation.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/quant_blocks.cuh"
#include "ops/cuda/quantize_q8.cuh"
#include "ops/cuda/warp_reduce.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace dflash::cuda {
namespace {

constexpr int kThreads = 256;

// Rows (and the weights) are held in registers between the sum and the scaling, and each thread issues
// all its loads before its first store (stores may alias later loads, which would otherwise serialize
// one memory round trip per element: these kernels are latency-bound at decode sizes). Sums of squares are in double, like the CPU's, so the order of the terms hardly matters.

// One warp per row: 8 rows per block; kPer values a lane (launched with the least of 1, 2, 4, ..., 32 that covers
// the row: the unrolled loops issue every k, predicated off or not). RMSNorm takes it up to kNormWarpMaxDim, the
// gated norm up to 32 * kWarpPer.
constexpr int kWarpPer = 32;
// Longer rows take the block kernel: a warp walks its kPer steps (and with q8 on, their 32-element blocks'
// quantization) one after another, which the few rows of a small model's step leave on the critical path (the
// bundled 384-wide model: 12 steps a warp, the slowest of its step's small kernels under ncu).
constexpr int kNormWarpMaxDim = 256;
// With `delta` (the fused residual add): x += delta first, stored back to x, and the norm is of the sum.
// kGate (rms_norm_silu_gate): y = the norm * silu(gate) (gate [n, dim]), and with q8 on (dim a multiple of
// 32) its int8 form: a warp's 32 values of step k are one 32-element block; with q8.bf16(), its bf16 form.
template <int kPer, bool kGate>
__global__ void rms_norm_warp_kernel(float* x, int64_t xs, const float* delta, const float* w, float eps, int64_t n,
                                     int64_t dim, float* y, int64_t ys, const float* gate, Q8Out q8) {
  pdl_begin();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (r >= n) return;
  const int lane = threadIdx.x % 32;
  float* xr = x + r * xs;
  float* yr = y + r * ys;
  float v[kPer], wv[kPer], dv[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = lane + 32 * k;
    v[k] = i < dim ? xr[i] : 0.0f;
    wv[k] = i < dim && w != nullptr ? __ldg(w + i) : 1.0f;
    // dv: the residual delta, or with kGate the gate (loaded with the row: one memory round trip)
    dv[k] = i < dim && (kGate || delta != nullptr) ? (kGate ? gate : delta)[r * dim + i] : 0.0f;
  }
  if (!kGate && delta != nullptr) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t i = lane + 32 * k;
      v[k] = __fadd_rn(v[k], dv[k]);
      if (i < dim) xr[i] = v[k];
    }
  }
  double sum = 0.0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) sum += static_cast<double>(v[k]) * v[k];
  sum = warp_sum(sum);
  const float mean = dim > 0 ? static_cast<float>(sum / static_cast<double>(dim)) : 0.0f;
  const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = lane + 32 * k;
    if ((kGate || q8.on()) && 32 * k >= dim) break;
    float o = w != nullptr ? __fmul_rn(__fmul_rn(v[k], scale), wv[k]) : __fmul_rn(v[k], scale);
    if constexpr (kGate) o = i < dim ? __fmul_rn(o, silu_f(dv[k])) : 0.0f;
    if (i < dim) {
      yr[i] = o;
      if (q8.bf16()) q8.xb[r * dim + i] = qblocks::f32_to_bf16_bits(o);
    }
    if (q8.on()) quantize_q8_block(o, lane, (r * dim + 32 * k) / 32, q8);
  }
}

// One block per row (rows longer than kNormWarpMaxDim: the hidden size), dim <= kThreads * kBlockPer, kPer values a
// thread (the least of 2, 4, 8, 16, 20, 24, 32 that covers the row: 2 for 384, 16 for 4096, 20 for 5120). kQ8: the
// output row is staged in shared memory and quantized from there, 16 values a lane (quantize_q8_row), into q8 (dim a
// multiple of 32). With q8.bf16(), the bf16 form as the row is stored.
constexpr int kBlockPer = 32;
template <int kPer, bool kQ8>
__global__ void rms_norm_block_kernel(float* x, int64_t xs, const float* delta, const float* w, float eps, int64_t dim,
                                      float* y, int64_t ys, Q8Out q8) {
  pdl_begin();
  __shared__ double scratch[kThreads / 32];
  const int64_t r = blockIdx.x;
  float* xr = x + r * xs;
  float* yr = y + r * ys;
  float v[kPer], wv[kPer], dv[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(kThreads) * k;
    v[k] = i < dim ? xr[i] : 0.0f;
    wv[k] = i < dim && w != nullptr ? __ldg(w + i) : 1.0f;
    dv[k] = i < dim && delta != nullptr ? delta[r * dim + i] : 0.0f;
  }
  if (delta != nullptr) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(kThreads) * k;
      v[k] = __fadd_rn(v[k], dv[k]);
      if (i < dim) xr[i] = v[k];
    }
  }
  double sum = 0.0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) sum += static_cast<double>(v[k]) * v[k];
  sum = block_reduce<kThreads, false>(sum, scratch);
  const float mean = dim > 0 ? static_cast<float>(sum / static_cast<double>(dim)) : 0.0f;
  const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
  __shared__ __align__(16) float staged[kQ8 ? kThreads * kPer : 1];  // read as float4 (quantize_q8_row)
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(kThreads) * k;
    const float o = w != nullptr ? __fmul_rn(__fmul_rn(v[k], scale), wv[k]) : __fmul_rn(v[k], scale);
    if (i < dim) {
      yr[i] = o;
      if constexpr (kQ8) staged[i] = o;
      if (q8.bf16()) q8.xb[r * dim + i] = qblocks::f32_to_bf16_bits(o);
    }
  }
  if constexpr (kQ8) {
    __syncthreads();
    quantize_q8_row<kThreads>(staged, dim, r * dim / 32, q8);
  }
}

// Any row length: one block per row, two passes over global memory.
__global__ void rms_norm_long_kernel(float* x, int64_t xs, const float* delta, const float* w, float eps, int64_t dim,
                                     float* y, int64_t ys) {
  pdl_begin();
  __shared__ double scratch[kThreads / 32];
  const int64_t r = blockIdx.x;
  float* xr = x + r * xs;
  float* yr = y + r * ys;
  if (delta != nullptr) {
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) xr[i] = __fadd_rn(xr[i], delta[r * dim + i]);
    __syncthreads();
  }
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) sum += static_cast<double>(xr[i]) * xr[i];
  sum = block_reduce<kThreads, false>(sum, scratch);
  const float mean = dim > 0 ? static_cast<float>(sum / static_cast<double>(dim)) : 0.0f;
  const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
  for (int64_t i = threadIdx.x; i < dim; i += kThreads)
    yr[i] = w != nullptr ? __fmul_rn(__fmul_rn(xr[i], scale), w[i]) : __fmul_rn(xr[i], scale);
}

// Block (token, group of heads): cos/sin of the token's angles in shared memory, then one (head, pair)
// per thread: both values loaded before either is stored.
constexpr int kRopeThreads = 256;
__global__ void rope_neox_kernel(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dims,
                                 const int32_t* positions, double theta, double freq_scale, const double* inv_freq) {
  pdl_begin();
  extern __shared__ float cs_sn[];  // [half] cos, then [half] sin
  const int64_t t = blockIdx.x;
  const int64_t half = rot_dims / 2;
  float* cs = cs_sn;
  float* sn = cs_sn + half;
  const double pos = positions[t];
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const double f = inv_freq != nullptr
                         ? inv_freq[i]
                         : pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rot_dims)) / freq_scale;
    double s, c;
    sincos(pos * f, &s, &c);
    cs[i] = static_cast<float>(c);
    sn[i] = static_cast<float>(s);
  }
  __syncthreads();
  float* xt = x + t * n_heads * head_dim;
  const int64_t pairs = n_heads * half, per_block = (pairs + gridDim.y - 1) / gridDim.y;
  const int64_t e0 = blockIdx.y * per_block, e1 = e0 + per_block < pairs ? e0 + per_block : pairs;
  for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
    const int64_t h = e / half, i = e % half;
    float* v = xt + h * head_dim;
    const float x0 = v[i], x1 = v[i + half];
    v[i] = __fsub_rn(__fmul_rn(x0, cs[i]), __fmul_rn(x1, sn[i]));
    v[i + half] = __fadd_rn(__fmul_rn(x0, sn[i]), __fmul_rn(x1, cs[i]));
  }
}

__global__ void silu_kernel(float* x, int64_t n) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = silu_f(x[i]);
}
__global__ void sigmoid_kernel(float* x, int64_t n) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x[i])));
}
// With q8 on (n a multiple of 32): each warp holds whole 32-element blocks, quantized as they are stored; with
// q8.bf16(), each value's bf16 form too.
__global__ void swiglu_kernel(const float* gate, const float* up, float* out, int64_t n, Q8Out q8) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float o = swiglu_f(gate[i], up[i]);
    out[i] = o;
    if (q8.bf16()) q8.xb[i] = qblocks::f32_to_bf16_bits(o);
    if (q8.on()) quantize_q8_block(o, threadIdx.x % 32, i / 32, q8);
  }
}
// o[r, d] *= sigmoid(gate[r gate_stride + d]) (the sigmoid and mul kernels' roundings). With q8 on (dim a
// multiple of 32) each warp holds one 32-element block of a row, quantized as it is stored; q8.bf16(): as swiglu.
__global__ void sigmoid_gate_mul_kernel(float* o, const float* gate, int64_t rows, int64_t dim, int64_t gate_stride,
                                        Q8Out q8) {
  pdl_begin();
  const int64_t n = rows * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / dim, d = i - r * dim;
    const float g = gate[r * gate_stride + d];
    const float v = __fmul_rn(o[i], __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g))));
    o[i] = v;
    if (q8.bf16()) q8.xb[i] = qblocks::f32_to_bf16_bits(v);
    if (q8.on()) quantize_q8_block(v, threadIdx.x % 32, i / 32, q8);
  }
}
__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __fadd_rn(a[i], b[i]);
}
__global__ void mul_kernel(const float* a, const float* b, float* out, int64_t n) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __fmul_rn(a[i], b[i]);
}

__global__ void softmax_rows_kernel(float* x, int64_t dim) {
  pdl_begin();
  __shared__ double dscratch[kThreads / 32];
  __shared__ float fscratch[kThreads / 32];
  float* v = x + static_cast<int64_t>(blockIdx.x) * dim;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) mx = fmaxf(mx, v[i]);
  mx = block_reduce<kThreads, true>(mx, fscratch);
  if (mx == -INFINITY) {
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) v[i] = 0.0f;
    return;
  }
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    const float e = expf(__fsub_rn(v[i], mx));
    v[i] = e;
    sum += e;
  }
  sum = block_reduce<kThreads, false>(sum, dscratch);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) v[i] = __fmul_rn(v[i], inv);
}

unsigned grid_for(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 65535 * 16) blocks = 65535 * 16;
  return static_cast<unsigned>(blocks);
}

constexpr int64_t kMaxGridX = 2147483647;

// Fused attention input prep: one warp per (token, head) of q (heads [0, nh)) and k (heads [nh, nh + nkv)).
// Lane l holds elements l + 32 j of the head (j < hd / 32), so each RoPE pair (i, i + half) lies in one lane
// (half a multiple of 32). RMSNorm (double sum, as rms_norm), then RoPE (host frequency table, double
// sincos, as rope_neox), then q in place, k and the token's v row into the KV store at its position.
constexpr int kPrepMaxPer = 8;  // head_dim <= 256
template <int kPer>  // head_dim / 32
__global__ void qk_prep_kernel(QkPrepArgs a) {
  pdl_begin();
  const int64_t warp_global = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t heads = a.nh + a.nkv;
  if (warp_global >= a.n * heads) return;
  const int64_t t = warp_global / heads, h = warp_global % heads;
  const bool is_q = h < a.nh;
  if (is_q && t < a.q_from) return;  // a token with keys only
  float* src = is_q ? a.q + ((t - a.q_from) * a.nh + h) * a.hd : a.k + (t * a.nkv + (h - a.nh)) * a.hd;
  const float* w = is_q ? a.q_norm : a.k_norm;
  const int per = static_cast<int>(a.hd / 32);
  float v[kPer], wv[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    v[j] = j < per ? src[lane + 32 * j] : 0.0f;
    wv[j] = j < per ? __ldg(w + lane + 32 * j) : 0.0f;
  }
  double sum = 0.0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) sum += static_cast<double>(v[j]) * v[j];
  sum = warp_sum(sum);
  const float mean = static_cast<float>(sum / static_cast<double>(a.hd));
  const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, a.eps)));
#pragma unroll
  for (int j = 0; j < kPer; ++j) v[j] = __fmul_rn(__fmul_rn(v[j], scale), wv[j]);
  // RoPE on the first rot dims: element i = lane + 32 j < half pairs with i + half (slot j + half / 32).
  const double angle_pos = a.positions[t];
  const int hj = static_cast<int>(a.rot / 64);  // half / 32
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (j >= hj) break;
    const int64_t i = lane + 32 * j;
    double sn, cs;
    sincos(angle_pos * a.inv_freq[i], &sn, &cs);
    const float c = static_cast<float>(cs), s = static_cast<float>(sn);
    const float x0 = v[j], x1 = v[j + hj];
    v[j] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    v[j + hj] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  }
  if (is_q) {
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      if (j < per) src[lane + 32 * j] = v[j];
    return;
  }
  const int64_t slot = (a.slot_dev != nullptr ? int64_t{a.slot_dev[0]} : a.first_slot) + t;
  const int64_t kh = h - a.nh, c = slot / a.chunk_tokens, row = slot - c * a.chunk_tokens;
  const int64_t e0 = (row * a.nkv + kh) * a.hd;  // element offset of the row's head in the chunk
  const float* vs = a.v + (t * a.nkv + kh) * a.hd;
  float vv[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) vv[j] = j < per ? vs[lane + 32 * j] : 0.0f;
  if (a.kv_f16) {
    __half* kh16 = reinterpret_cast<__half*>(a.k_chunks[c]) + e0;
    __half* vh16 = reinterpret_cast<__half*>(a.v_chunks[c]) + e0;
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      if (j < per) {
        kh16[lane + 32 * j] = __float2half_rn(v[j]);
        vh16[lane + 32 * j] = __float2half_rn(vv[j]);
      }
    return;
  }
  float* kd = a.k_chunks[c] + e0;
  float* vd = a.v_chunks[c] + e0;
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (j < per) {
      kd[lane + 32 * j] = v[j];
      vd[lane + 32 * j] = vv[j];
    }
}

}  // namespace

namespace {

cudaError_t launch_rms_norm(float* x, int64_t x_stride, const float* delta, const float* w, float eps, int64_t n,
                            int64_t dim, float* y, int64_t y_stride, cudaStream_t stream, const Q8Out& q8 = Q8Out{}) {
  if (n < 0 || dim < 0 || x_stride < dim || y_stride < dim) return cudaErrorInvalidValue;
  if (q8.on() && (!rms_norm_q8_supported(dim) || y_stride != dim || q8.xd == nullptr || q8.xs == nullptr ||
                  !is_aligned(q8.xq, 16)))
    return cudaErrorInvalidValue;
  if (q8.bf16() && (!rms_norm_q8_supported(dim) || y_stride != dim)) return cudaErrorInvalidValue;
  if (n == 0 || dim == 0) return cudaSuccess;
  if (x == nullptr || y == nullptr) return cudaErrorInvalidValue;
  if (dim <= kNormWarpMaxDim) {
    const int64_t blocks = (n + kThreads / 32 - 1) / (kThreads / 32);
    if (blocks > kMaxGridX) return cudaErrorInvalidValue;
    with_per<1, 2, 4, kNormWarpMaxDim / 32>((dim + 31) / 32, [&](auto per) {
      launch_pdl(rms_norm_warp_kernel<decltype(per)::value, false>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads),
                 0, stream, x, x_stride, delta, w, eps, n, dim, y, y_stride, nullptr, q8);
    });
  } else if (dim <= int64_t{kThreads} * kBlockPer) {
    if (n > kMaxGridX) return cudaErrorInvalidValue;
    with_per<2, 4, 8, 16, 20, 24, kBlockPer>((dim + kThreads - 1) / kThreads, [&](auto per) {
      constexpr int kPer = decltype(per)::value;
      launch_pdl(q8.on() ? rms_norm_block_kernel<kPer, true> : rms_norm_block_kernel<kPer, false>,
                 dim3(static_cast<unsigned>(n)), dim3(kThreads), 0, stream, x, x_stride, delta, w, eps, dim, y,
                 y_stride, q8);
    });
  } else {
    if (n > kMaxGridX) return cudaErrorInvalidValue;
    launch_pdl(rms_norm_long_kernel, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0, stream, x, x_stride, delta, w,
               eps, dim, y, y_stride);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t rms_norm_strided(const float* x, int64_t x_stride, const float* w, float eps, int64_t n, int64_t dim,
                             float* y, int64_t y_stride, cudaStream_t stream) {
  // Without delta the kernels do not write x.
  return launch_rms_norm(const_cast<float*>(x), x_stride, nullptr, w, eps, n, dim, y, y_stride, stream);
}

bool rms_norm_q8_supported(int64_t dim) { return dim > 0 && dim % 32 == 0 && dim <= int64_t{kThreads} * kBlockPer; }

cudaError_t add_rms_norm(float* x, const float* delta, const float* w, float eps, int64_t n, int64_t dim, float* y,
                         cudaStream_t stream, const Q8Out& q8) {
  if (delta == nullptr && n > 0 && dim > 0) return cudaErrorInvalidValue;
  if (y == x) return cudaErrorInvalidValue;
  return launch_rms_norm(x, dim, delta, w, eps, n, dim, y, dim, stream, q8);
}

cudaError_t rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* y,
                     cudaStream_t stream, const Q8Out& q8) {
  return launch_rms_norm(const_cast<float*>(x), dim, nullptr, w, eps, n, dim, y, dim, stream, q8);
}

cudaError_t rms_norm_silu_gate(float* o, const float* w, float eps, int64_t rows, int64_t dim, const float* z,
                               cudaStream_t stream, const Q8Out& q8) {
  static_assert(kRmsNormSiluGateMaxDim == 32 * kWarpPer, "a warp a row");
  if (rows < 0 || dim < 0 || dim > kRmsNormSiluGateMaxDim) return cudaErrorInvalidValue;
  if (rows == 0 || dim == 0) return cudaSuccess;
  if (o == nullptr || z == nullptr || (q8.on() && dim % 32 != 0)) return cudaErrorInvalidValue;
  const int64_t blocks = (rows + kThreads / 32 - 1) / (kThreads / 32);
  if (blocks > kMaxGridX) return cudaErrorInvalidValue;
  with_per<1, 2, 4, 8, 16, kWarpPer>((dim + 31) / 32, [&](auto per) {
    launch_pdl(rms_norm_warp_kernel<decltype(per)::value, true>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
               stream, o, dim, static_cast<const float*>(nullptr), w, eps, rows, dim, o, dim, z, q8);
  });
  return cudaGetLastError();
}

cudaError_t rope_neox(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t rot_dims,
                      const int32_t* positions, double theta, double freq_scale, cudaStream_t stream,
                      const double* inv_freq) {
  if (n < 0 || n_heads < 0 || head_dim < 0 || rot_dims < 0 || rot_dims % 2 != 0 || rot_dims > head_dim ||
      n > kMaxGridX || rot_dims > 16384)
    return cudaErrorInvalidValue;
  if (n == 0 || n_heads == 0 || rot_dims == 0) return cudaSuccess;
  if (x == nullptr || positions == nullptr) return cudaErrorInvalidValue;
  const size_t smem = sizeof(float) * static_cast<size_t>(rot_dims);
  const int64_t pairs = n_heads * (rot_dims / 2);
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(std::min<int64_t>(
                                               (pairs + kRopeThreads - 1) / kRopeThreads, 65535)));
  launch_pdl(rope_neox_kernel, grid, dim3(kRopeThreads), smem, stream, x, n_heads, head_dim, rot_dims, positions, theta,
             freq_scale, inv_freq);
  return cudaGetLastError();
}

bool qk_prep_supported(int64_t head_dim, int64_t rot_dims) {
  return head_dim % 32 == 0 && head_dim <= 32 * kPrepMaxPer && rot_dims % 64 == 0 && rot_dims > 0 &&
         rot_dims <= head_dim;
}

cudaError_t qk_prep(const QkPrepArgs& a, cudaStream_t stream) {
  if (a.n < 0 || a.nh < 0 || a.nkv < 0 || !qk_prep_supported(a.hd, a.rot) || a.chunk_tokens <= 0 || a.first_slot < 0 ||
      a.q_from < 0 || a.q_from > a.n)
    return cudaErrorInvalidValue;
  const int64_t warps = a.n * (a.nh + a.nkv);
  if (warps == 0) return cudaSuccess;
  if (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.q_norm == nullptr || a.k_norm == nullptr ||
      a.inv_freq == nullptr || a.positions == nullptr || a.k_chunks == nullptr || a.v_chunks == nullptr)
    return cudaErrorInvalidValue;
  const int64_t blocks = (warps + kThreads / 32 - 1) / (kThreads / 32);
  if (blocks > kMaxGridX) return cudaErrorInvalidValue;
  with_per<1, 2, 4, kPrepMaxPer>(a.hd / 32, [&](auto per) {
    launch_pdl(qk_prep_kernel<decltype(per)::value>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream,
               a);
  });
  return cudaGetLastError();
}

cudaError_t silu_inplace(float* x, int64_t n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && x == nullptr)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  launch_pdl(silu_kernel, dim3(grid_for(n)), dim3(kThreads), 0, stream, x, n);
  return cudaGetLastError();
}

cudaError_t sigmoid_inplace(float* x, int64_t n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && x == nullptr)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  launch_pdl(sigmoid_kernel, dim3(grid_for(n)), dim3(kThreads), 0, stream, x, n);
  return cudaGetLastError();
}

cudaError_t swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream, const Q8Out& q8) {
  if (n < 0 || (n > 0 && (gate == nullptr || up == nullptr || out == nullptr))) return cudaErrorInvalidValue;
  if (q8.on() && (n % 32 != 0 || q8.xd == nullptr || q8.xs == nullptr)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  launch_pdl(swiglu_kernel, dim3(grid_for(n)), dim3(kThreads), 0, stream, gate, up, out, n, q8);
  return cudaGetLastError();
}

cudaError_t sigmoid_gate_mul(float* o, const float* gate, int64_t rows, int64_t dim, int64_t gate_stride,
                             cudaStream_t stream, const Q8Out& q8) {
  if (rows < 0 || dim < 0 || gate_stride < dim) return cudaErrorInvalidValue;
  if (rows == 0 || dim == 0) return cudaSuccess;
  if (o == nullptr || gate == nullptr) return cudaErrorInvalidValue;
  if (q8.on() && (dim % 32 != 0 || q8.xd == nullptr || q8.xs == nullptr)) return cudaErrorInvalidValue;
  launch_pdl(sigmoid_gate_mul_kernel, dim3(grid_for(rows * dim)), dim3(kThreads), 0, stream, o, gate, rows, dim,
             gate_stride, q8);
  return cudaGetLastError();
}

cudaError_t softmax_rows(float* x, int64_t n, int64_t dim, cudaStream_t stream) {
  if (n < 0 || dim < 0 || n > kMaxGridX) return cudaErrorInvalidValue;
  if (n == 0 || dim == 0) return cudaSuccess;
  if (x == nullptr) return cudaErrorInvalidValue;
  launch_pdl(softmax_rows_kernel, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0, stream, x, dim);
  return cudaGetLastError();
}

cudaError_t add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (a == nullptr || b == nullptr || out == nullptr))) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  launch_pdl(add_kernel, dim3(grid_for(n)), dim3(kThreads), 0, stream, a, b, out, n);
  return cudaGetLastError();
}

cudaError_t mul(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (a == nullptr || b == nullptr || out == nullptr))) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  launch_pdl(mul_kernel, dim3(grid_for(n)), dim3(kThreads), 0, stream, a, b, out, n);
  return cudaGetLastError();
}

}  // namespace dflash::cuda

#include "ops/cuda/glue.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "ops/cuda/conv.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/warp_reduce.cuh"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 32 ? 65535 * 32 : blocks));
}

__global__ void slice_columns_kernel(const float* src, int64_t rows, int64_t src_width, int64_t offset, int64_t width,
                                     float* dst) {
  pdl_begin();
  const int64_t n = rows * width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    dst[i] = src[r * src_width + offset + c];
  }
}

// 1 / sqrt(sum of squares + eps) of a row a warp holds: `ss` is this lane's partial sum (its elements
// lane + 32 j, j ascending, each square rounded and added), then the warp's butterfly (warp_sum).
__device__ __forceinline__ float l2_inv(float ss, float eps) {
  ss = warp_sum(ss);
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ss, eps)));
}

// One warp per row.
__global__ void l2_norm_rows_kernel(float* x, int64_t rows, int64_t dim, float eps, float scale) {
  pdl_begin();
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float* p = x + row * dim;
  float ss = 0.0f;
  for (int64_t i = lane; i < dim; i += 32) ss = __fadd_rn(ss, __fmul_rn(p[i], p[i]));
  const float inv = l2_inv(ss, eps);
  for (int64_t i = lane; i < dim; i += 32) p[i] = __fmul_rn(__fmul_rn(p[i], inv), scale);
}

__device__ float softplus_dev(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ float sigmoid_dev(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ void deltanet_gate(float* a, float* b, const float* dt_bias, const float* ssm_a, int64_t i,
                                              int64_t h) {
  a[i] = ssm_a[h] * softplus_dev(a[i] + dt_bias[h]);
  b[i] = sigmoid_dev(b[i]);
}

__global__ void deltanet_gates_kernel(float* a, float* b, const float* dt_bias, const float* ssm_a, int64_t n,
                                      int64_t heads) {
  pdl_begin();
  const int64_t total = n * heads;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    deltanet_gate(a, b, dt_bias, ssm_a, i, i % heads);
}

// deltanet_prep: block (warp group, token t); warp w < 2 Hk + Hv takes one head row of token t (a q, k or v
// head: its channels' conv outputs, L2-normalised for q and k), warp 2 Hk + Hv the token's gates. With
// shift (one token, chain form) each lane then moves the window of its channels: it is their only reader.
constexpr int kPrepWarps = 4;
template <int KC, int kPer>  // conv_silu_at's; channels a lane (of the wider of d_k, d_v, over 32)
__global__ void __launch_bounds__(kPrepWarps * 32) deltanet_prep_kernel(DeltaNetPrepArgs a, bool shift) {
  pdl_begin();
  const int warp = static_cast<int>(blockIdx.x) * kPrepWarps + static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t t = blockIdx.y;
  const int64_t Hk = a.n_k_heads, Hv = a.n_v_heads, rows = 2 * Hk + Hv;
  if (warp > rows) return;
  if (warp == rows) {
    for (int64_t h = lane; h < Hv; h += 32) deltanet_gate(a.alpha, a.beta, a.dt_bias, a.ssm_a, t * Hv + h, h);
    return;
  }
  const int64_t C = 2 * Hk * a.d_k + Hv * a.d_v;
  int64_t width, c0;
  float* dst;
  float scale = 1.0f;
  if (warp < 2 * Hk) {
    const int64_t h = warp < Hk ? warp : warp - Hk;
    width = a.d_k;
    c0 = (warp < Hk ? 0 : Hk * a.d_k) + h * a.d_k;
    dst = (warp < Hk ? a.q : a.k) + (t * Hk + h) * a.d_k;
    if (warp < Hk) scale = a.q_scale;
  } else {
    const int64_t h = warp - 2 * Hk;
    width = a.d_v;
    c0 = 2 * Hk * a.d_k + h * a.d_v;
    dst = a.v + (t * Hv + h) * a.d_v;
  }
  if (a.conv_capture != nullptr) {  // this warp's channels: token t's inputs, and (token 0) the window before the step
    const int64_t window = int64_t{a.kernel - 1} * C;
    for (int64_t c = lane; c < width; c += 32) {
      a.conv_capture[window + t * C + c0 + c] = a.mixed[t * C + c0 + c];
      if (t == 0)
        for (int64_t j = 0; j < a.kernel - 1; ++j) a.conv_capture[j * C + c0 + c] = a.conv_state[j * C + c0 + c];
    }
  }
  float val[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t c = lane + 32 * j;
    val[j] = c < width ? conv_silu_at<KC>(a.mixed, t, c0 + c, C, a.conv_w, a.kernel, a.conv_state, a.parents) : 0.0f;
  }
  if (warp < 2 * Hk) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) ss = __fadd_rn(ss, __fmul_rn(val[j], val[j]));
    const float inv = l2_inv(ss, kDeltaNetL2Eps);
#pragma unroll
    for (int j = 0; j < kPer; ++j) val[j] = __fmul_rn(__fmul_rn(val[j], inv), scale);
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (lane + 32 * j < width) dst[lane + 32 * j] = val[j];
  if (shift)
    for (int64_t c = lane; c < width; c += 32) conv_shift_state(a.mixed, 1, c0 + c, C, a.kernel - 1, a.conv_state);
}

__global__ void gather_rows_kernel(const float* x, int64_t dim, const int64_t* rows, int64_t m, float* out) {
  pdl_begin();
  const int64_t total = m * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = x[rows[i / dim] * dim + i % dim];
}

__global__ void gather_row_bytes_kernel(const uint8_t* table, int64_t rb, int64_t n_rows, const int32_t* ids,
                                        uint8_t* out) {
  pdl_begin();
  const int64_t i = blockIdx.x;
  const int64_t id = ids[i];
  uint8_t* dst = out + i * rb;
  const bool ok = id >= 0 && id < n_rows;
  const uint8_t* src = table + (ok ? id : 0) * rb;
  for (int64_t b = threadIdx.x; b < rb; b += blockDim.x) dst[b] = ok ? src[b] : 0;
}

// This block's share of one copy: grid-stride over gridDim.x blocks of the x dimension.
__device__ __forceinline__ void copy_slice(const DeviceCopy& c) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x, first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const bool vec = c.n % 4 == 0 && reinterpret_cast<uintptr_t>(c.dst) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(c.src) % 16 == 0;
  if (vec) {
    float4* __restrict__ d = reinterpret_cast<float4*>(c.dst);
    const float4* __restrict__ s = reinterpret_cast<const float4*>(c.src);
    for (int64_t i = first; i < c.n / 4; i += stride) d[i] = s[i];
  } else {
    for (int64_t i = first; i < c.n; i += stride) c.dst[i] = c.src[i];
  }
}

// Blocks (x, item): x-th slice of item's floats.
__global__ void copy_batch_kernel(const DeviceCopy* __restrict__ items) {
  pdl_begin();
  copy_slice(items[blockIdx.y]);
}

__global__ void copy_floats_kernel(DeviceCopy c) {
  pdl_begin();
  copy_slice(c);
}

// Blocks for a copy of the largest item's n floats: enough that a DeltaNet state (~0.8M floats) moves at the copy
// rate; small items' extra blocks exit at once.
unsigned copy_blocks(int64_t max_n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(128, (max_n / 4 + kThreads - 1) / kThreads)));
}

__global__ void kv_write_kernel(float* const* k_chunks, float* const* v_chunks, int64_t chunk_tokens,
                                int64_t row_floats, const float* k, const float* v, int64_t n, int64_t first_pos,
                                const int32_t* first_dev, bool f16) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const int64_t pos = (first_dev != nullptr ? int64_t{*first_dev} : first_pos) + t;
  const int64_t c = pos / chunk_tokens, off = (pos - c * chunk_tokens) * row_floats;  // in elements
  const float* __restrict__ ks = k + t * row_floats;
  const float* __restrict__ vs = v + t * row_floats;
  if (f16) {
    __half* __restrict__ kd = reinterpret_cast<__half*>(k_chunks[c]) + off;
    __half* __restrict__ vd = reinterpret_cast<__half*>(v_chunks[c]) + off;
    for (int64_t e = threadIdx.x; e < row_floats; e += blockDim.x) {
      const float a = __ldg(ks + e), b = __ldg(vs + e);
      kd[e] = __float2half_rn(a);
      vd[e] = __float2half_rn(b);
    }
    return;
  }
  float* __restrict__ kd = k_chunks[c] + off;
  float* __restrict__ vd = v_chunks[c] + off;
  for (int64_t e = threadIdx.x; e < row_floats; e += blockDim.x) {
    const float a = __ldg(ks + e), b = __ldg(vs + e);  // both loads before the stores
    kd[e] = a;
    vd[e] = b;
  }
}

}  // namespace

cudaError_t copy_batch(const DeviceCopy* items, int n_items, int64_t max_n, cudaStream_t stream) {
  if (n_items < 0 || n_items > kCopyBatchMaxItems || max_n < 0) return cudaErrorInvalidValue;
  if (n_items == 0 || max_n == 0) return cudaSuccess;
  if (items == nullptr) return cudaErrorInvalidValue;
  launch_pdl(copy_batch_kernel, dim3(copy_blocks(max_n), static_cast<unsigned>(n_items)), dim3(kThreads), 0, stream,
             items);
  return cudaGetLastError();
}

cudaError_t copy_floats(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  launch_pdl(copy_floats_kernel, dim3(copy_blocks(n)), dim3(kThreads), 0, stream, DeviceCopy{dst, src, n});
  return cudaGetLastError();
}

cudaError_t gather_row_bytes(const void* table, int64_t row_bytes, int64_t n_rows, const int32_t* ids, int64_t n,
                             void* out, cudaStream_t stream) {
  if (row_bytes < 0 || n_rows < 0 || n < 0 || n > 2147483647) return cudaErrorInvalidValue;
  if (n == 0 || row_bytes == 0) return cudaSuccess;
  if (table == nullptr || ids == nullptr || out == nullptr) return cudaErrorInvalidValue;
  launch_pdl(gather_row_bytes_kernel, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0, stream,
             static_cast<const uint8_t*>(table), row_bytes, n_rows, ids, static_cast<uint8_t*>(out));
  return cudaGetLastError();
}

cudaError_t kv_write(float* const* k_chunks, float* const* v_chunks, int64_t chunk_tokens, int64_t row_floats,
                     const float* k, const float* v, int64_t n, int64_t first_pos, const int32_t* first_dev,
                     cudaStream_t stream, bool f16) {
  if (chunk_tokens <= 0 || row_floats < 0 || n < 0 || n > 2147483647 || first_pos < 0) return cudaErrorInvalidValue;
  if (n == 0 || row_floats == 0) return cudaSuccess;
  if (k_chunks == nullptr || v_chunks == nullptr || k == nullptr || v == nullptr) return cudaErrorInvalidValue;
  launch_pdl(kv_write_kernel, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0, stream, k_chunks, v_chunks,
             chunk_tokens, row_floats, k, v, n, first_pos, first_dev, f16);
  return cudaGetLastError();
}

cudaError_t slice_columns(const float* src, int64_t rows, int64_t src_width, int64_t offset, int64_t width, float* dst,
                          cudaStream_t stream) {
  if (rows < 0 || width < 0 || offset < 0 || offset + width > src_width) return cudaErrorInvalidValue;
  if (rows * width == 0) return cudaSuccess;
  launch_pdl(slice_columns_kernel, dim3(grid_for(rows * width)), dim3(kThreads), 0, stream, src, rows, src_width,
             offset, width, dst);
  return cudaGetLastError();
}

cudaError_t l2_norm_rows(float* x, int64_t rows, int64_t dim, float eps, float scale, cudaStream_t stream) {
  if (rows < 0 || dim < 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int64_t warps_per_block = kThreads / 32;
  const unsigned blocks = static_cast<unsigned>((rows + warps_per_block - 1) / warps_per_block);
  launch_pdl(l2_norm_rows_kernel, dim3(blocks), dim3(kThreads), 0, stream, x, rows, dim, eps, scale);
  return cudaGetLastError();
}

cudaError_t deltanet_gates(float* a, float* b, const float* dt_bias, const float* ssm_a, int64_t n, int64_t heads,
                           cudaStream_t stream) {
  if (n < 0 || heads <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  launch_pdl(deltanet_gates_kernel, dim3(grid_for(n * heads)), dim3(kThreads), 0, stream, a, b, dt_bias, ssm_a, n,
             heads);
  return cudaGetLastError();
}

cudaError_t gather_rows(const float* x, int64_t dim, const int64_t* rows, int64_t m, float* out, cudaStream_t stream) {
  if (m < 0 || dim < 0) return cudaErrorInvalidValue;
  if (m * dim == 0) return cudaSuccess;
  launch_pdl(gather_rows_kernel, dim3(grid_for(m * dim)), dim3(kThreads), 0, stream, x, dim, rows, m, out);
  return cudaGetLastError();
}

cudaError_t deltanet_prep(const DeltaNetPrepArgs& a, int64_t n, cudaStream_t stream) {
  if (n < 0 || n > 65535 || a.n_k_heads < 1 || a.n_v_heads < 1 || a.d_k < 1 || a.d_v < 1) return cudaErrorInvalidValue;
  if (a.d_k > 32 * kDeltaNetPrepMaxPer || a.d_v > 32 * kDeltaNetPrepMaxPer) return cudaErrorInvalidValue;
  if (a.kernel < 1 || a.kernel > kConvMaxKernel) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (!a.mixed || !a.conv_w || (a.kernel > 1 && !a.conv_state) || !a.q || !a.k || !a.v || !a.alpha || !a.beta ||
      !a.dt_bias || !a.ssm_a)
    return cudaErrorInvalidValue;
  const int64_t warps = 2 * a.n_k_heads + a.n_v_heads + 1;
  if (warps > 65535 * int64_t{kPrepWarps}) return cudaErrorInvalidValue;
  const bool chain_window = a.parents == nullptr && a.kernel > 1;
  const dim3 grid(static_cast<unsigned>((warps + kPrepWarps - 1) / kPrepWarps), static_cast<unsigned>(n));
  const int64_t width = a.d_k > a.d_v ? a.d_k : a.d_v;
  with_per<1, 2, 4, kDeltaNetPrepMaxPer>((width + 31) / 32, [&](auto per) {
    constexpr int kPer = decltype(per)::value;
    launch_pdl(a.kernel == kConvCommonKernel ? deltanet_prep_kernel<kConvCommonKernel, kPer>
                                             : deltanet_prep_kernel<0, kPer>,
               grid, dim3(kPrepWarps * 32), 0, stream, a, chain_window && n == 1);
  });
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || !chain_window || n == 1) return err;
  const int64_t C = 2 * a.n_k_heads * a.d_k + a.n_v_heads * a.d_v;
  return conv_shift_window(a.mixed, n, C, a.kernel, a.conv_state, stream);
}

}  // namespace dflash::cuda

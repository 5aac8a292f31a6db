#include "ops/cuda/glue.h"

#include <cuda_fp16.h>

#include <cstdint>

#include "ops/cuda/launch.cuh"

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

// One warp per row: the sum of squares is taken sequentially by lane 0 so it rounds like the CPU's loop;
// the scaling is parallel. Rows are short (a head: 128 values), so this costs little.
__global__ void l2_norm_rows_kernel(float* x, int64_t rows, int64_t dim, float eps, float scale) {
  pdl_begin();
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float* p = x + row * dim;
  float inv = 0.0f;
  if (lane == 0) {
    float ss = 0.0f;
    for (int64_t i = 0; i < dim; ++i) ss = __fadd_rn(ss, __fmul_rn(p[i], p[i]));
    inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ss, eps)));
  }
  inv = __shfl_sync(0xffffffffu, inv, 0);
  for (int64_t i = lane; i < dim; i += 32) p[i] = __fmul_rn(__fmul_rn(p[i], inv), scale);
}

__device__ float softplus_dev(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ float sigmoid_dev(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void deltanet_gates_kernel(float* a, float* b, const float* dt_bias, const float* ssm_a, int64_t n,
                                      int64_t heads) {
  pdl_begin();
  const int64_t total = n * heads;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i % heads;
    a[i] = ssm_a[h] * softplus_dev(a[i] + dt_bias[h]);
    b[i] = sigmoid_dev(b[i]);
  }
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

}  // namespace dflash::cuda

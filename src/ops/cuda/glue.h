// Device kernels for the elementwise glue of the layer kinds (the CUDA side of Backend's slice_columns,
// l2_norm_rows, deltanet_gates, gather_rows); semantics as CpuBackend's in ops/cpu/cpu_backend.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dflash::cuda {

// dst[r, :] = src[r, offset : offset + width] for `rows` rows of `src_width`.
cudaError_t slice_columns(const float* src, int64_t rows, int64_t src_width, int64_t offset, int64_t width, float* dst,
                          cudaStream_t stream = nullptr);
// Each row of x [rows, dim] becomes x / sqrt(sum x^2 + eps) * scale (sum in the CPU's order: sequential).
cudaError_t l2_norm_rows(float* x, int64_t rows, int64_t dim, float eps, float scale, cudaStream_t stream = nullptr);
// Over [n, n_heads]: alpha <- ssm_a[h] * softplus(alpha + dt_bias[h]); beta <- sigmoid(beta).
cudaError_t deltanet_gates(float* alpha_to_decay, float* beta, const float* dt_bias, const float* ssm_a, int64_t n,
                           int64_t n_heads, cudaStream_t stream = nullptr);
// out[r, :] = x[rows[r], :]; `rows` is a device array of m indices.
cudaError_t gather_rows(const float* x, int64_t dim, const int64_t* rows, int64_t m, float* out,
                        cudaStream_t stream = nullptr);
// out[i, :] = the `row_bytes` bytes of row ids[i] of `table` (n_rows rows), for n device ids; an id
// outside [0, n_rows) gives zero bytes. (Embedding lookups: the rows are then dequantized in place.)
cudaError_t gather_row_bytes(const void* table, int64_t row_bytes, int64_t n_rows, const int32_t* ids, int64_t n,
                             void* out, cudaStream_t stream = nullptr);
// Appends n rows of K and V ([n, row_floats] each) to a chunked KV store (attention.h's layout: device
// tables of chunk pointers, chunk_tokens rows a chunk) at positions first, first + 1, ...; `first` is
// *first_dev when first_dev is not null (read on the device: a replayed graph's position), else
// first_pos. The chunks must exist.
// f16: the chunks hold fp16 elements (row_floats counts elements; rounded to nearest even).
cudaError_t kv_write(float* const* k_chunks, float* const* v_chunks, int64_t chunk_tokens, int64_t row_floats,
                     const float* k, const float* v, int64_t n, int64_t first_pos, const int32_t* first_dev,
                     cudaStream_t stream = nullptr, bool f16 = false);

}  // namespace dflash::cuda

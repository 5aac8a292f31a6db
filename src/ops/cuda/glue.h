// Device kernels for the elementwise glue of the layer kinds (the CUDA side of Backend's slice_columns,
// l2_norm_rows, deltanet_gates, gather_rows); semantics as CpuBackend's in ops/cpu/cpu_backend.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dflash::cuda {

// dst[r, :] = src[r, offset : offset + width] for `rows` rows of `src_width`.
cudaError_t slice_columns(const float* src, int64_t rows, int64_t src_width, int64_t offset, int64_t width, float* dst,
                          cudaStream_t stream = nullptr);
// Each row of x [rows, dim] becomes x / sqrt(sum x^2 + eps) * scale (a warp a row: lane partial sums, then
// a butterfly; within a few ulps of the CPU's sequential sum).
cudaError_t l2_norm_rows(float* x, int64_t rows, int64_t dim, float eps, float scale, cudaStream_t stream = nullptr);
// Over [n, n_heads]: alpha <- ssm_a[h] * softplus(alpha + dt_bias[h]); beta <- sigmoid(beta).
cudaError_t deltanet_gates(float* alpha_to_decay, float* beta, const float* dt_bias, const float* ssm_a, int64_t n,
                           int64_t n_heads, cudaStream_t stream = nullptr);
// The DeltaNet input prep of n tokens in one launch (Backend::deltanet_prep; two in the chain form with
// n > 1: the window moves after every output is made): the conv + SiLU of mixed [n, C] (C = 2 Hk dk + Hv dv;
// conv.cuh's element, so the same bits as causal_conv1d_silu), split into q, k [n, Hk, dk] and v [n, Hv,
// dv]; q and k L2-normalised per head as l2_norm_rows (eps kDeltaNetL2Eps; q times q_scale); the gates of
// alpha and beta [n, Hv] in place as deltanet_gates. parents: device, n entries, null for the chain form.
// Head dims up to 32 * kDeltaNetPrepMaxPer.
inline constexpr int kDeltaNetPrepMaxPer = 8;
inline constexpr float kDeltaNetL2Eps = 1e-6f;
struct DeltaNetPrepArgs {
  const float* mixed = nullptr;
  int64_t n_k_heads = 0, n_v_heads = 0, d_k = 0, d_v = 0;
  const float* conv_w = nullptr;
  int kernel = 0;
  float* conv_state = nullptr;
  const int32_t* parents = nullptr;
  float *q = nullptr, *k = nullptr, *v = nullptr, *alpha = nullptr, *beta = nullptr;
  const float* dt_bias = nullptr;
  const float* ssm_a = nullptr;
  float q_scale = 1.0f;
  float* conv_capture = nullptr;  // optional: the window before the step, then mixed ([K - 1 + n, C])
};
cudaError_t deltanet_prep(const DeltaNetPrepArgs& a, int64_t n, cudaStream_t stream = nullptr);
// out[r, :] = x[rows[r], :]; `rows` is a device array of m indices.
cudaError_t gather_rows(const float* x, int64_t dim, const int64_t* rows, int64_t m, float* out,
                        cudaStream_t stream = nullptr);
// items[i].n floats from items[i].src to items[i].dst for n_items items (a device table), in one launch; max_n: the
// largest n (it sizes the grid). Items must not overlap one another (they run at once). Each item's floats move as
// float4 where both of its pointers are 16-byte aligned and n a multiple of 4.
struct DeviceCopy {
  float* dst;
  const float* src;
  int64_t n;
};
constexpr int kCopyBatchMaxItems = 65535;  // items one launch takes (the grid's y)
cudaError_t copy_batch(const DeviceCopy* items, int n_items, int64_t max_n, cudaStream_t stream = nullptr);
// dst[0, n) = src[0, n) as one kernel launch (float4 where both pointers are 16-byte aligned and n a multiple of 4):
// unlike cudaMemcpyAsync, a recorded step's copy then keeps the graph's programmatic-launch chain.
cudaError_t copy_floats(float* dst, const float* src, int64_t n, cudaStream_t stream = nullptr);
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

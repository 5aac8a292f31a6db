// Argument checks and CUDA-error-to-Status glue for the gated DeltaNet kernels (gated_delta_net.cu).
#include "ops/cuda/gated_delta_net_host.h"

#include <cstdint>

#include "base/checked_math.h"

namespace dflash::cuda {
namespace {

Status check_dims(const char* op, const DeltaNetDims& d, int64_t n) {
  if (d.n_k_heads <= 0 || d.n_v_heads <= 0 || d.n_v_heads % d.n_k_heads != 0 || d.n_v_heads > INT32_MAX)
    return invalid_argument("{}: {} value heads is not a positive multiple of {} key heads", op, d.n_v_heads,
                            d.n_k_heads);
  if (d.d_k < 1 || d.d_k > kDeltaNetMaxDk)
    return invalid_argument("{}: key head dim {} outside [1, {}]", op, d.d_k, kDeltaNetMaxDk);
  if (d.d_v < 1 || d.d_v > (int64_t{1} << 20)) return invalid_argument("{}: value head dim {} out of range", op, d.d_v);
  if (n < 0) return invalid_argument("{}: negative token count {}", op, n);
  return Status();
}

Status check_buffers(const char* op, int64_t n, const float* q, const float* k, const float* v, const float* g,
                     const float* beta, const float* state, const float* out) {
  if (state == nullptr) return invalid_argument("{}: null state", op);
  if (n > 0 && (!q || !k || !v || !g || !beta || !out))
    return invalid_argument("{}: null input or output buffer for {} tokens", op, n);
  return Status();
}

}  // namespace

Status run_gated_delta_net_recurrent(const float* q, const float* k, const float* v, const float* g,
                                     const float* beta, int64_t n, const DeltaNetDims& dims, float* state,
                                     float* out, float* per_token_states, const int32_t* parents,
                                     float* state_before, cudaStream_t stream) {
  constexpr const char* op = "gated DeltaNet (recurrent, CUDA)";
  DF_RETURN_IF_ERROR(check_dims(op, dims, n));
  DF_RETURN_IF_ERROR(check_buffers(op, n, q, k, v, g, beta, state, out));
  if (parents != nullptr && per_token_states == nullptr)
    return invalid_argument("{}: tree parents need a per-token state buffer", op);
  if (state_before != nullptr && state_before == state) return invalid_argument("{}: state_before is the state", op);
  const cudaError_t err = gated_delta_net_recurrent(q, k, v, g, beta, n, dims, state, out, per_token_states, parents,
                                                    state_before, stream);
  if (err != cudaSuccess)
    return io_error("{} ({} tokens, Hv {}, dk {}, dv {}): {}", op, n, dims.n_v_heads, dims.d_k, dims.d_v,
                    cudaGetErrorString(err));
  return Status();
}

Status run_gated_delta_net_chunked(const float* q, const float* k, const float* v, const float* g,
                                   const float* beta, int64_t n, const DeltaNetDims& dims, float* state, float* out,
                                   void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  constexpr const char* op = "gated DeltaNet (chunked, CUDA)";
  DF_RETURN_IF_ERROR(check_dims(op, dims, n));
  DF_RETURN_IF_ERROR(check_buffers(op, n, q, k, v, g, beta, state, out));
  if (n == 0) return Status();
  const size_t need = gated_delta_net_chunked_workspace_bytes(kDeltaNetChunk, dims);
  if (workspace == nullptr || workspace_bytes < need)
    return invalid_argument("{}: workspace of {} bytes, at least {} needed (one chunk of {} tokens)", op,
                            workspace == nullptr ? 0 : workspace_bytes, need, kDeltaNetChunk);
  if (!is_aligned(workspace, 8)) return invalid_argument("{}: workspace not 8-byte aligned", op);
  const cudaError_t err =
      gated_delta_net_chunked(q, k, v, g, beta, n, dims, state, out, workspace, workspace_bytes, stream);
  if (err != cudaSuccess)
    return io_error("{} ({} tokens, Hv {}, dk {}, dv {}): {}", op, n, dims.n_v_heads, dims.d_k, dims.d_v,
                    cudaGetErrorString(err));
  return Status();
}

}  // namespace dflash::cuda

// Argument checks and CUDA-error-to-Status glue for the attention kernels (attention.cu).
#include "ops/cuda/attention_host.h"

#include "ops/cuda/attention_internal.h"

namespace dflash::cuda {

static_assert(static_cast<int32_t>(cpu::MaskKind::kCausal) == static_cast<int32_t>(AttnMaskKind::kCausal) &&
              static_cast<int32_t>(cpu::MaskKind::kTree) == static_cast<int32_t>(AttnMaskKind::kTree) &&
              static_cast<int32_t>(cpu::MaskKind::kFull) == static_cast<int32_t>(AttnMaskKind::kFull));

Status attention_checked(const float* q, int64_t n_q, int64_t n_heads, const DeviceKvView& kv,
                         const DeviceAttnMask& mask, float scale, float* out, void* workspace,
                         size_t workspace_bytes, cudaStream_t stream, AttnPrefillKernel kernel) {
  if (n_q < 0) return invalid_argument("GPU attention: negative query count {}", n_q);
  if (!attention_head_dim_supported(kv.head_dim))
    return unsupported("GPU attention: head_dim {} is not supported (64, 128 or 256)", kv.head_dim);
  if (kv.n_kv_heads <= 0 || n_heads <= 0 || n_heads % kv.n_kv_heads != 0)
    return invalid_argument("GPU attention: {} query heads is not a positive multiple of {} KV heads", n_heads,
                            kv.n_kv_heads);
  if (kv.chunk_tokens <= 0 || kv.n_tokens < 0)
    return invalid_argument("GPU attention: bad KV view ({} tokens in chunks of {})", kv.n_tokens, kv.chunk_tokens);
  if (mask.n_prefix < 0 || mask.n_prefix > kv.n_tokens)
    return invalid_argument("GPU attention: prefix of {} keys outside the {} stored", mask.n_prefix, kv.n_tokens);
  if (mask.window < 0) return invalid_argument("GPU attention: negative sliding window {}", mask.window);
  if (n_q == 0) return Status();
  if (q == nullptr || out == nullptr) return invalid_argument("GPU attention: null q or out pointer");
  if (kv.n_tokens > 0 && (kv.k_chunks == nullptr || kv.v_chunks == nullptr))
    return invalid_argument("GPU attention: null KV chunk table for {} tokens", kv.n_tokens);
  if (mask.kind == AttnMaskKind::kTree && mask.parents == nullptr)
    return invalid_argument("GPU attention: a tree mask needs the parents of its {} queries", n_q);
  const cudaError_t err =
      attention_with(kernel, q, n_q, n_heads, kv, mask, scale, out, workspace, workspace_bytes, stream);
  if (err != cudaSuccess)
    return io_error("GPU attention ({} queries x {} heads, {} keys, head_dim {}): {}", n_q, n_heads, kv.n_tokens,
                    kv.head_dim, cudaGetErrorString(err));
  return Status();
}

}  // namespace dflash::cuda

// Device attention over the chunked KV layout (kernels in attention.cu, attention_decode.cu,
// attention_decode_mma.cu, attention_mma.cu and attention_wgmma.cu); the math of cpu::attention (ops/cpu/ops.h),
// which is the reference: same masks, GQA mapping, scale, "a query that sees no key gets zeros", a running max.
// Decode-shaped calls are float32 throughout, except path mode on fp16 K/V with
// DeviceAttnMask::path_tensor_cores; prefill-shaped calls run on the tensor cores with f16 inputs (below).
//
// KV layout (chosen to mirror the CPU KvStore, so that a paged store needs no copy): a device array of
// device chunk pointers per tensor. Chunk c holds positions [c * chunk_tokens, (c + 1) * chunk_tokens) as
// [chunk_tokens, n_kv_heads, head_dim] float32. A contiguous [capacity, nkv, hd] buffer is the special
// case of a table whose entries are buffer + c * chunk_tokens * nkv * hd. Every chunk pointer must be
// 16-byte aligned (cudaMalloc gives 256); the tables themselves live in device memory.
//
// Kernels:
//   prefill (n_q > 32, kCausal with or without a window, or kFull): attn_mma_kernel (attention_mma.cu),
//     FlashAttention-2 style: a block takes 128 rows = (query, head-of-the-group) pairs of one KV head (so a
//     K/V tile in shared memory serves every query head of the group), 16 a warp; K/V tiles of 64 keys (32
//     at hd 256), fp32 KV converted to f16 while staged, fp16 KV copied by cp.async; S = Q K^T and O += P V
//     by mma.sync m16n8k16 (f16 inputs, f32 accumulators), online softmax in f32. On fp16 KV on a compute
//     capability 9.0 GPU with sm_90a code, attn_wgmma_kernel (attention_wgmma.cu) instead: the same rows,
//     masks, splits and roundings, the products on Hopper's warpgroup MMA. Within f16 rounding of the
//     reference (attention_test states the bound). attention_internal.h's kSimt runs these calls on the
//     float32 kernel instead (a 64-row launch of attn_kernel in attention.cu), as token-exact steps do.
//   Path mode (a causal mask without a window and n_q <= 32 -- decode, chain verify --, or a tree of up
//     to 128 nodes): the float32 decode kernel of attention_decode.cu, or on fp16 K/V with
//     DeviceAttnMask::path_tensor_cores the tensor-core kernel of attention_decode_mma.cu (the same splits,
//     f16 inputs as prefill's, a verify's queries sharing tiles). A block serves up to 16 heads of one
//     query's group and one range of its keys; the query's visible keys are walked as plain decoding at its
//     position would walk them: the prefix, then its ancestors in depth order (a chain's slots in order),
//     cut into a fixed number of equal ranges (set by the grid's size, not the key count, so the launch is
//     the same at every length) handled by different blocks, each leaving a partial (max, sum,
//     unnormalised output) in the workspace that a merge kernel combines. So a verify step's query outputs
//     equal plain decoding's of its path bit for bit (DFlash stays lossless on the GPU), given the
//     workspace attention_workspace_bytes asks for (n_q times a decode's).
//   Other calls of up to 32 queries (a windowed causal block, a kFull block such as the draft's) and trees
//     of more than 128 nodes: the float32 attn_kernel (attention.cu), 16 rows per block (64 for trees) and
//     split-K as above.
// head_dim 64, 128 or 256.
//
// This header is included by nvcc-compiled code: no base/status.h (see attention_host.h for the Status API).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dflash::cuda {

// Same values as cpu::MaskKind (pinned in attention_host.cpp).
enum class AttnMaskKind : int32_t { kCausal = 0, kTree = 1, kFull = 2 };

struct DeviceKvView {
  const float* const* k_chunks = nullptr;  // device array of device pointers
  const float* const* v_chunks = nullptr;
  int64_t chunk_tokens = 64;
  int64_t n_tokens = 0;  // valid positions
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  bool f16 = false;  // chunks hold IEEE fp16 elements (the pointers address __half; offsets count elements)
};

// Keys [0, n_prefix) are seen by every query; key n_prefix + s is new slot s. Query i sees slot s when
//   kCausal: s <= i; kTree: s == i or s an ancestor of i (parents[i] < i, -1 for a root); kFull: always.
struct DeviceAttnMask {
  AttnMaskKind kind = AttnMaskKind::kCausal;
  int64_t n_prefix = 0;
  const int32_t* parents = nullptr;  // kTree only: device array of n_q
  // When set (decode shape, n_q <= 32, only): device {n_prefix, n_tokens} read by the kernel when it runs,
  // overriding n_prefix and kv.n_tokens (a replayed graph's lengths). The launch shape does not depend on
  // them: decode-shaped calls always split the keys into the same number of ranges.
  const int32_t* lengths = nullptr;
  // kCausal only, > 0: query i also sees no key j with (n_prefix + i) - j >= window (cpu::AttentionMask).
  int64_t window = 0;
  // Path mode on fp16 K/V: the tensor-core kernel (attention_decode_mma.cu) instead of the float32 one (what
  // CudaBackend runs). A verify's queries then share their prefix's K/V tiles (a 16-query verify at 4K keys
  // costs ~2 decodes instead of ~8), at ~1-2 us more a one-token decode below ~4K keys and less above. A decode
  // and its verifies must run the same kernel: each equals itself across call shapes bit for bit, not the other.
  bool path_tensor_cores = false;
};

// The most queries a call with DeviceAttnMask::lengths takes (decode-shaped calls, whose launch is the same at
// every key count).
inline constexpr int64_t kAttnDeviceLengthsMaxQueries = 32;

bool attention_head_dim_supported(int64_t head_dim);

// Bytes of workspace that lets attention() use its preferred split-K plan for this call shape on the
// current device (0 when it does not split).
size_t attention_workspace_bytes(int64_t n_q, int64_t n_heads, const DeviceKvView& kv, const DeviceAttnMask& mask);

// out[i, h, :] = softmax_j(q[i, h, :] . k[j, h / (nh / nkv), :] * scale | visible) v[j, h / (nh / nkv), :]
// q, out [n_q, n_heads, head_dim] device float32 (out must not alias q). `workspace` (device, may be null)
// holds the split-K partials; with less than attention_workspace_bytes() the call splits less (correct,
// slower). Returns cudaErrorInvalidValue (nothing enqueued) for an unsupported head_dim, n_heads not a
// multiple of n_kv_heads, n_prefix outside [0, n_tokens], a null pointer with work to do, or a kTree mask
// without parents. n_q == 0 is a no-op.
cudaError_t attention(const float* q, int64_t n_q, int64_t n_heads, const DeviceKvView& kv,
                      const DeviceAttnMask& mask, float scale, float* out, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream = nullptr);

}  // namespace dflash::cuda

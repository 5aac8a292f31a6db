// Internals of the device attention (attention.h), shared by attention.cu and attention_mma.cu, and the
// one knob benchmarks use: which kernel serves prefill-shaped calls.
//
// This header is included by nvcc-compiled code: no base/status.h.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/attention.h"

namespace dflash::cuda {

// The kernel of prefill-shaped calls (n_q > 32 with a kCausal or kFull mask; attention.h):
//   kTensorCore: f16 tensor-core inputs, f32 softmax and accumulators (what attention() runs): on fp16 K/V where
//                attn_mma::wgmma_available(), attn_wgmma_kernel (attention_wgmma.cu); else attn_mma_kernel
//                (attention_mma.cu, mma.sync);
//   kMmaSync:    attn_mma_kernel for every K/V type and GPU (its tests and benchmarks on Hopper);
//   kSimt:       the f32 kernel attn_kernel in its 64-row prefill launch (what attention() ran before the
//                tensor-core kernels; float32 throughout).
// Every other call shape (decode, path mode, trees of more than 128 nodes) runs the same launch either way.
enum class AttnPrefillKernel : int32_t { kTensorCore = 0, kSimt = 1, kMmaSync = 2 };

size_t attention_workspace_bytes_with(AttnPrefillKernel kernel, int64_t n_q, int64_t n_heads, const DeviceKvView& kv,
                                      const DeviceAttnMask& mask);
cudaError_t attention_with(AttnPrefillKernel kernel, const float* q, int64_t n_q, int64_t n_heads,
                           const DeviceKvView& kv, const DeviceAttnMask& mask, float scale, float* out, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream = nullptr);

// Path mode (attention.h) takes trees of at most this many nodes (a node's path to the root is shorter).
constexpr int kMaxPathQueries = 128;

// Keys per split of a fixed-split (decode) plan: the visible keys cut into n_splits ranges of whole tiles.
__host__ __device__ inline int64_t decode_keys_per_split(int64_t max_keys, int n_splits, int tile) {
  int64_t kps = (max_keys + n_splits - 1) / n_splits;
  kps = (kps + tile - 1) / tile * tile;
  return kps < tile ? tile : kps;
}

namespace attn_decode {

// One launch of the path-mode decode kernel (attention_decode.cu): grid (n_q * blocks_per_query, n_kv_heads,
// n_splits). A block takes up to kMaxRows heads of one query's group (blocks_per_query = ceil(group /
// kMaxRows)); query i of a kCausal call is a chain's node at depth i, of a kTree call the node whose path
// `parents` gives.
struct Params {
  const float* q;
  float* out;
  const float* const* k_chunks;
  const float* const* v_chunks;
  int64_t chunk_tokens;
  int32_t chunk_shift;  // log2(chunk_tokens) when a power of two, else -1
  int64_t n_tokens;
  int64_t n_prefix;
  int64_t n_q;
  const int32_t* parents;  // tree only
  int32_t tree;
  int32_t n_heads;
  int32_t n_kv_heads;
  int32_t group;
  int32_t blocks_per_query;
  float scale;
  int32_t n_splits;
  float* part_acc;          // n_splits > 1: [n_splits][n_q * n_heads][head_dim]
  float* part_ml;           // [n_splits][n_q * n_heads][2]: (max, sum)
  const int32_t* lengths;   // device {n_prefix, n_tokens} overriding the fields above, or null
  int32_t kv_f16;           // 1: K/V chunks hold fp16 elements
  int32_t node_split0;      // launch_mma (trees): its node blocks' splits [node_split0, + node_splits), set by it;
                            // -1: each node's [floor(n_prefix / its kps), + node_splits) (lengths on the device)
  int32_t node_splits;
};

constexpr int kMaxRows = 16;

// The launch shape: splits = ceil(split_factor * SMs / (blocks of one query)). It sets the order of the sums,
// so it must not change while a decode and its verify are compared: the setter is for benchmarks only
// (process-wide, not thread-safe). 0: by head_dim (split_factor()).
struct Tuning {
  int split_factor = 0;
};
Tuning& tuning();
// The split factor in use: tuning()'s, or 1 at head_dim 256 (fewer, longer splits: one query of the 27B shape at
// 512 / 4096 keys 13.6 / 21.5 -> 11.1 / 16.2 us, tied at 32768; docs/benchmarks.md, twenty-ninth session), else 2.
int split_factor(int64_t head_dim);

// Enqueues the kernel (head_dim 64, 128 or 256); the caller merges split partials.
cudaError_t launch(const Params& p, int head_dim, cudaStream_t stream);
// The same call on the tensor cores (attention_decode_mma.cu; fp16 K/V only): the same splits and partials,
// blocks of up to 96 rows of several queries sharing K/V tiles (blocks_per_query unused). GQA groups of up to
// 64 heads and chunks of a power of two tokens (a model's and a store's constants, so that its decode and
// verify run the same kernel).
constexpr int64_t kMmaMaxGroup = 64;
cudaError_t launch_mma(const Params& p, int head_dim, cudaStream_t stream);

}  // namespace attn_decode

namespace attn_mma {

// One launch of attn_mma_kernel. Rows are (query, head-of-group) pairs of one KV head, query-major (row g =
// query g / group, head kv_head * group + g % group), kRowsPerBlock of them a block; grid (row_blocks,
// n_kv_heads, n_splits). 32-bit positions: the planner sends longer contexts to the f32 kernel.
struct Params {
  const float* q;
  float* out;
  const float* const* k_chunks;
  const float* const* v_chunks;
  int32_t chunk_tokens;
  int32_t chunk_shift;  // log2(chunk_tokens) when a power of two, else -1
  int32_t n_tokens;
  int32_t n_q;
  int32_t n_prefix;
  int32_t window;  // kCausal sliding window (0: none)
  int32_t causal;  // 1: kCausal, 0: kFull
  int32_t n_heads;
  int32_t n_kv_heads;
  int32_t group;
  int32_t row_blocks;
  int32_t n_splits;
  int32_t keys_per_split;  // a multiple of keys_per_tile(head_dim)
  float scale_log2;        // scale * log2(e): scores are kept in base-2 units
  float* part_acc;         // n_splits > 1: [n_splits][n_q * n_heads][head_dim], as attn_kernel's partials
  float* part_ml;          // [n_splits][n_q * n_heads][2]: (max in natural units, sum)
  int32_t kv_f16;          // 1: K/V chunks hold fp16 elements (staged as they are)
};

constexpr int kRowsPerBlock = 128;  // 8 warps of 16 rows
inline int keys_per_tile(int64_t head_dim) { return head_dim >= 256 ? 32 : 64; }
inline int blocks_per_sm(int64_t head_dim) { return head_dim <= 64 ? 2 : 1; }

// Enqueues the kernel (head_dim 64, 128 or 256); the caller merges split partials.
cudaError_t launch(const Params& p, int head_dim, cudaStream_t stream);

// The same call on Hopper's warpgroup MMA (attention_wgmma.cu): fp16 K/V only, head_dim 64, 128 or 256, tiles of
// kWgmmaKeysPerTile keys, wgmma_blocks_per_sm blocks an SM. Where wgmma_available(): the binary has sm_90a code
// (built with 90a in CMAKE_CUDA_ARCHITECTURES) and the device is compute capability 9.0.
constexpr int kWgmmaKeysPerTile = 64;
constexpr int wgmma_blocks_per_sm(int64_t head_dim) { return head_dim <= 128 ? 2 : 1; }
bool wgmma_available();
cudaError_t launch_wgmma(const Params& p, int head_dim, cudaStream_t stream);

}  // namespace attn_mma
}  // namespace dflash::cuda

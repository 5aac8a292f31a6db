// CPU reference kernels: plain functions over float32 row-major buffers (and weights in any DType).
// These define the math every backend must reproduce; ops/cuda is tested against them.
//
// Dimension letters: n tokens (rows), H hidden, nh/nkv query/KV heads, hd head dim, Hk/Hv DeltaNet
// key/value heads, dk/dv their head dims, C channels, K conv kernel.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "tensor/dtype.h"

namespace dflash::cpu {

// ---------------------------------------------------------------- linear algebra

// A weight matrix W [rows = out, cols = in] in any supported DType; rows contiguous (ggml layout).
// f32 data is read in place and must be 4-byte aligned (GGUF tensor data is).
struct WeightView {
  DType type = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
};

// y[n, out] = x[n, in] W^T, dequantizing W on the fly (bit-for-bit the CPU dequantize_row values,
// accumulated in float32). Work is split over output rows across the pool. Each y[t, r] is summed in
// one fixed order (8 lane partial sums over k, then a fixed reduction; ops/cpu/kernels_internal.h),
// so results are bit-identical whatever n, the tiling or the thread count (a verify batch reproduces
// single-token decode exactly). Errors: unsupported type, cols not a multiple of the block size.
Status matmul(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool);

// out[i, :] = row ids[i] of `table` [V, H] as float32. Error on an id outside [0, V).
Status embedding_lookup(const WeightView& table, std::span<const int32_t> ids, float* out);

// ---------------------------------------------------------------- elementwise and norms

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w  for n rows of `dim` (w may be null: no scale).
// x and y may alias.
void rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* y);

// RoPE, NEOX (rotate-half) pairing on the first `rot_dims` dims of every head: pair (i, i + rot_dims/2),
// angle = position * theta^(-2i/rot_dims) (frequencies divided by `freq_scale` for linear scaling).
// x [n, n_heads, head_dim] in place; dims >= rot_dims pass through.
void rope_neox(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t rot_dims,
               std::span<const int32_t> positions, double theta, double freq_scale = 1.0);

void silu_inplace(float* x, int64_t n);
void sigmoid_inplace(float* x, int64_t n);
// out[i] = silu(gate[i]) * up[i]  (SwiGLU)
void swiglu(const float* gate, const float* up, float* out, int64_t n);
// Numerically stable softmax over each of n rows of `dim`, in place (a row of all -inf becomes zeros).
void softmax_rows(float* x, int64_t n, int64_t dim);
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// ---------------------------------------------------------------- attention

// How a KV store keeps its elements: float32, or IEEE fp16 (half the memory and the bytes attention reads;
// written rounded to nearest even, tensor/half.h, and read back exactly). An f16 store's chunk pointers
// address uint16 elements (the pointer type stays float*; a row is nkv * hd / 2 floats of storage).
enum class KvType : uint8_t { kF32, kF16 };
const char* kv_type_name(KvType t);

// Keys and values of one layer, stored in fixed-size chunks (the KvStore layout): chunk c holds
// positions [c * chunk_tokens, (c+1) * chunk_tokens) as [chunk_tokens, nkv, hd] elements of `type`.
struct KvView {
  std::span<const float* const> k_chunks;
  std::span<const float* const> v_chunks;
  int64_t chunk_tokens = 64;
  int64_t n_tokens = 0;  // valid positions
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  // The same chunk pointer tables in the backend's memory, when the store keeps them there (a device
  // backend then needs no per-call upload of the tables); null on the CPU.
  const float* const* device_k_table = nullptr;
  const float* const* device_v_table = nullptr;
  KvType type = KvType::kF32;
};

// Which keys a query sees. Keys [0, n_prefix) are context every query sees; key n_prefix + s is "new
// slot" s. Query i (of n_q) sees new slot s when:
//   kCausal: s <= i                      (prefill, decode, chain verify: query i is slot i)
//   kTree:   s is i or an ancestor of i  (DDTree verify; parents[i] < i, -1 for the root)
//   kFull:   always                      (DFlash draft block: bidirectional inside the block)
enum class MaskKind { kCausal, kTree, kFull };
struct AttentionMask {
  MaskKind kind = MaskKind::kCausal;
  int64_t n_prefix = 0;
  std::span<const int32_t> parents;  // kTree only: one per query
  // kCausal only, > 0: a sliding window besides: query i also sees no key j with (n_prefix + i) - j >= window
  // (DFlash drafts' sliding-window layers: the last `window` positions up to the query's own).
  int64_t window = 0;
};

// out[i, h, :] = softmax_j(q[i, h, :] . k[j, h / (nh / nkv), :] * scale | visible) v[j, ...]
// q [n_q, nh, hd]; out [n_q, nh, hd]. Keys [0, kv.n_tokens). Float32 with a running max (flash style).
// A query that sees no key gets zeros. out must not alias q.
void attention(const float* q, int64_t n_q, int64_t n_heads, const KvView& kv, const AttentionMask& mask,
               float scale, float* out, ThreadPool& pool);

// ---------------------------------------------------------------- gated DeltaNet (algorithms.md D.4, E)

struct DeltaNetShape {
  int64_t n_k_heads = 0;  // Hk
  int64_t n_v_heads = 0;  // Hv, multiple of Hk; V-head h reads K-head h % Hk (tiled order, as GGUF)
  int64_t d_k = 0;
  int64_t d_v = 0;
};

// Inputs for n tokens: q, k [n, Hk, dk] (already L2-normalised; q already scaled by 1/sqrt(dk)),
// v [n, Hv, dv], g [n, Hv] (log decay, <= 0), beta [n, Hv] (in (0, 1)).
// State S [Hv, dv, dk] (per V-head, S[h] is dv x dk): S = e^g S; S += beta (v - S k) k^T; o = S q.
// Recurrent form, token by token. `state` is updated in place. out [n, Hv, dv].
// per_token_states (optional, [n, Hv, dv, dk]) receives the state after each token (speculative rollback).
// parents (optional, tree verify): token i starts from the state after token parents[i] (-1: from
// `state`); requires per_token_states, and leaves `state` unchanged.
void gated_delta_net_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                               int64_t n, const DeltaNetShape& s, float* state, float* out,
                               float* per_token_states, std::span<const int32_t> parents, ThreadPool& pool);

// The same recurrence in the chunked WY form (chunk of 64, algorithms.md E.2-E.6) for prefill: same
// outputs and final state up to float rounding; no per-token states.
void gated_delta_net_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                             int64_t n, const DeltaNetShape& s, float* state, float* out, ThreadPool& pool,
                             int64_t chunk = 64);

// ---------------------------------------------------------------- short causal conv (DeltaNet input)

// Depthwise causal conv over time with SiLU: out[t, c] = silu(sum_j w[c, j] * in_{t-(K-1)+j}[c]), where
// inputs before the first new token come from conv_state [K-1, C] (oldest first). x [n, C], w [C, K].
// Chain form (parents empty): conv_state is updated to the last K-1 inputs.
// Tree form (parents given): token i's window is its ancestors' inputs (nearest last), then conv_state
// rows when the ancestry runs out; conv_state is left unchanged.
void causal_conv1d_silu(const float* x, int64_t n, int64_t channels, const float* w, int64_t kernel,
                        float* conv_state, float* out, std::span<const int32_t> parents);

// ---------------------------------------------------------------- sampling helpers

// The largest k a top_k_rows call may ask for (Backend::kMaxTopK).
inline constexpr int64_t kMaxTopK = 16;

// The argument checks every backend's top_k_rows makes: rows >= 0, 1 <= cols <= INT32_MAX (ids are
// int32), 1 <= k <= min(cols, kMaxTopK).
Status check_top_k_rows(int64_t rows, int64_t cols, int64_t k);

// For each row r of x [rows, cols]: the k largest values, descending, ties to the lower column, into
// values [rows, k] with their columns in ids [rows, k]; and lse[r] = log(sum_j exp(x[r, j])) (lse may be
// null: not computed). NaN counts as -inf everywhere (its value is reported as -inf; it adds nothing to
// lse); -0 and +0 are equal (ties go by column; the value reported is the element's own). A row whose
// entries are all -inf gets lse -inf and ids 0, 1, ..., k-1; a row holding +inf gets lse +inf.
// lse: max + log(sum exp(x - max)) in double, rounded once to float. Rows are spread over the pool.
// Errors: check_top_k_rows, or a null x/ids/values with rows > 0.
Status top_k_rows(const float* x, int64_t rows, int64_t cols, int64_t k, int32_t* ids, float* values, float* lse,
                  ThreadPool& pool);

}  // namespace dflash::cpu

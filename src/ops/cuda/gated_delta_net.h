// Gated DeltaNet on the device (kernels in gated_delta_net.cu): the recurrent form (decode, chain and tree
// verify, optional per-token states) and the chunked WY form (prefill). Same math, layouts and semantics as
// the CPU reference cpu::gated_delta_net_recurrent / cpu::gated_delta_net_chunked (ops/cpu/ops.h,
// algorithms.md D.4, E, B.7); results agree with it up to float rounding (~1e-6 relative; not bitwise).
//
// All pointers are device float32 buffers (parents: device int32):
//   q, k [n, Hk, dk] (L2-normalised, q scaled by 1/sqrt(dk)); v [n, Hv, dv]; g, beta [n, Hv];
//   state [Hv, dv, dk] (S[h] is dv x dk, rows of dk contiguous); out [n, Hv, dv];
//   per_token_states [n, Hv, dv, dk]. V-head h reads K-head h % Hk.
//
// Included by nvcc-compiled code: no base/status.h here. Status-returning wrappers that check the
// arguments with messages are in gated_delta_net_host.h.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dflash::cuda {

struct DeltaNetDims {
  int64_t n_k_heads = 0;  // Hk
  int64_t n_v_heads = 0;  // Hv, a multiple of Hk
  int64_t d_k = 0;        // 1..256
  int64_t d_v = 0;        // >= 1
};

// Largest d_k the kernels take (the recurrent kernel keeps a row of the state in one warp's registers).
inline constexpr int64_t kDeltaNetMaxDk = 256;
// The chunked form's chunk (fixed; matches cpu::gated_delta_net_chunked's default).
inline constexpr int64_t kDeltaNetChunk = 64;

// Recurrent form, token by token (n >= 0; meant for n up to a few dozen). `state` is updated in place
// unless `parents` is given. per_token_states (optional) receives the state after every token.
// parents (optional, device, n entries): token i starts from the state after token parents[i] (-1: from
// `state`); requires per_token_states and leaves `state` unchanged. parents[i] must be in [-1, i); an
// entry outside is treated as -1 (memory stays safe, the result is meaningless).
// state_before (optional, [Hv, dv, dk], not overlapping `state`): receives the incoming state as the kernel loads
// it (a chain capture's copy of the state before the step, without a separate copy).
// cudaErrorInvalidValue (nothing launched) on bad dims or null pointers.
cudaError_t gated_delta_net_recurrent(const float* q, const float* k, const float* v, const float* g,
                                      const float* beta, int64_t n, const DeltaNetDims& dims, float* state,
                                      float* out, float* per_token_states, const int32_t* parents,
                                      float* state_before = nullptr, cudaStream_t stream = nullptr);

// One recurrent layer's restore after a rolled-back step (gated_delta_net_restore): its state [Hv, dv, dk] from
// `from`, either copied (q null) or re-run over the n captured tokens q, k, v, g, beta from it (as
// gated_delta_net_recurrent would, so bit for bit the states the step computed on the way); `from` null: the state
// stays. Then conv_elems floats of conv_from into conv (the conv window).
struct DeltaNetRestoreLayer {
  float* state;
  const float* from;
  const float *q, *k, *v, *g, *beta;
  float* conv;
  const float* conv_from;
  int64_t conv_elems;
};

// Restores n_layers layers of the same dims in one launch; layers_dev: the table in device memory. vec must be
// gated_delta_net_restore_vec of the (host) table: the float4 layout the recurrent form takes for those pointers.
// cudaErrorInvalidValue (nothing launched) on bad dims or counts.
bool gated_delta_net_restore_vec(const DeltaNetRestoreLayer* layers, int n_layers, const DeltaNetDims& dims);
cudaError_t gated_delta_net_restore(const DeltaNetRestoreLayer* layers_dev, int n_layers, bool vec, int64_t n,
                                    const DeltaNetDims& dims, cudaStream_t stream = nullptr);

// Bytes of workspace the chunked form needs to process up to `tokens` tokens in one pass (rounded up to
// whole chunks). Any workspace of at least gated_delta_net_chunked_workspace_bytes(kDeltaNetChunk, dims)
// works: longer inputs are then processed in several passes (segments of whole chunks).
size_t gated_delta_net_chunked_workspace_bytes(int64_t tokens, const DeltaNetDims& dims);

// Chunked WY form (algorithms.md E.2-E.6, chunk 64; cumulative log decay in double as on the CPU):
// the same outputs and final state as the recurrent form up to float rounding; no per-token states.
// workspace: device memory, 8-byte aligned, of workspace_bytes (see above). Several kernel launches per
// segment on `stream`; workspace must not be reused before they complete.
cudaError_t gated_delta_net_chunked(const float* q, const float* k, const float* v, const float* g,
                                    const float* beta, int64_t n, const DeltaNetDims& dims, float* state,
                                    float* out, void* workspace, size_t workspace_bytes,
                                    cudaStream_t stream = nullptr);

}  // namespace dflash::cuda

// Status-returning wrappers of the device gated DeltaNet (gated_delta_net.h): argument checks with
// messages a caller can act on, then the launch. Pointers are device
// pointers; completion (and any fault in a kernel) is seen at the next synchronization of `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "ops/cuda/gated_delta_net.h"

namespace dflash::cuda {

// gated_delta_net_recurrent (gated_delta_net.h). Errors: dims (Hk, Hv a multiple of Hk, dk in
// [1, kDeltaNetMaxDk], dv >= 1), n < 0, parents without per_token_states, a null buffer.
Status run_gated_delta_net_recurrent(const float* q, const float* k, const float* v, const float* g,
                                     const float* beta, int64_t n, const DeltaNetDims& dims, float* state,
                                     float* out, float* per_token_states, const int32_t* parents,
                                     float* state_before = nullptr, cudaStream_t stream = nullptr);

// gated_delta_net_chunked (gated_delta_net.h). Errors as above, plus a workspace smaller than one chunk
// needs (gated_delta_net_chunked_workspace_bytes(kDeltaNetChunk, dims)) or not 8-byte aligned.
Status run_gated_delta_net_chunked(const float* q, const float* k, const float* v, const float* g,
                                   const float* beta, int64_t n, const DeltaNetDims& dims, float* state, float* out,
                                   void* workspace, size_t workspace_bytes, cudaStream_t stream = nullptr);

}  // namespace dflash::cuda

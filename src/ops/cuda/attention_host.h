// Status-returning wrapper of the device attention (attention.h): argument checks with messages.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/attention_internal.h"

namespace dflash::cuda {

inline AttnMaskKind to_device(cpu::MaskKind k) { return static_cast<AttnMaskKind>(static_cast<int32_t>(k)); }

// cuda::attention with the arguments checked and named in the error: head_dim (64, 128, 256), heads vs KV
// heads, n_prefix, null pointers, kTree without parents. `workspace` as in attention.h (16-byte aligned;
// attention_workspace_bytes_with(kernel, ...) for the preferred size). Faults inside the kernel show at the
// next synchronization of `stream`.
// `kernel`: which kernel takes prefill-shaped calls (attention_internal.h); kSimt runs the float32 kernel instead
// of an f16 tensor-core one (the numerics of decode, for token-exact steps and tests).
Status attention_checked(const float* q, int64_t n_q, int64_t n_heads, const DeviceKvView& kv,
                         const DeviceAttnMask& mask, float scale, float* out, void* workspace = nullptr,
                         size_t workspace_bytes = 0, cudaStream_t stream = nullptr,
                         AttnPrefillKernel kernel = AttnPrefillKernel::kTensorCore);

}  // namespace dflash::cuda

// Device fills (kernels in fill.cu): a 32-bit pattern over n words.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dflash::cuda {

// NaN-pattern poisoning uses value 0x7fc00000 (a quiet float NaN).
cudaError_t fill_u32(uint32_t* dst, uint64_t n, uint32_t value, cudaStream_t stream = nullptr);

}  // namespace dflash::cuda

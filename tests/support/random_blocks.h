// Random but valid quantized blocks for tests: arbitrary codes and packed scales, finite float scales.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "tensor/dtype.h"

namespace dflash::test {

// Byte offsets of the fp16 scale fields (d, m, dmin) in one block of a quantized type.
std::vector<size_t> half_scale_fields(DType t);
// A finite scale as fp16 bits: mostly normal values over a wide range, sometimes zero or subnormal.
uint16_t random_half_scale(std::mt19937& rng);
// A scale that is often inf or NaN (any payload), otherwise as random_half_scale.
uint16_t random_nonfinite_half_scale(std::mt19937& rng);
// Rewrites the float scales of every whole block in bytes[0, n) (fp16 fields, q8_K's fp32 d).
void randomize_block_scales(DType t, uint8_t* bytes, size_t n, std::mt19937& rng, bool nonfinite = false);
// `blocks` blocks of random bytes with valid (finite) scales.
std::vector<uint8_t> random_blocks(DType t, int64_t blocks, std::mt19937& rng);

}  // namespace dflash::test

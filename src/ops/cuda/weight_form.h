// The device form of weights: how the CUDA kernels find a weight's bytes in device memory.
//
// Every type is kept as GGUF stores it (rows of ggml blocks, row r at r * row_bytes(type, cols)) except
// q6_K. Its 210-byte blocks sit at 2-byte alignment, which held the q6_K kernels to 2- and 4-byte loads
// (the decode GEMV at 0.5-0.6 of the copy rate). A q6_K row in device form holds each block's first 208
// bytes (ql[128], qh[64], scales[16], 13 aligned 16-byte words) one after another, then the blocks' fp16
// scales d, then zeros up to a multiple of 16 bytes:
//   block b's 208 bytes at 208 b, its d at 208 blocks + 2 b, row bytes 208 blocks + round_up(2 blocks, 16).
// A row grows by at most 14 bytes. Every CUDA kernel that reads q6_K weights (ops/cuda: gemv_q8, mmq,
// matmul, gemm_q, dequantize) takes this form, and requires 16-byte aligned q6_K weights;
// CudaBackend::pack_weight writes it when weights are copied to the device (Weights::to_backend).
//
// Included by nvcc-compiled code: no base/status.h.
#pragma once

#include <cstdint>

namespace dflash {
enum class DType : uint32_t;  // tensor/dtype.h
}  // namespace dflash

namespace dflash::cuda {

constexpr int kQ6Body = 208;  // bytes of a q6_K block a device row keeps together (all but d)

// Bytes of a q6_K device row of `blocks` blocks, and the offset of block b's d in it.
constexpr int64_t q6k_row_bytes(int64_t blocks) { return kQ6Body * blocks + (2 * blocks + 15) / 16 * 16; }
constexpr int64_t q6k_d_offset(int64_t blocks, int64_t b) { return kQ6Body * blocks + 2 * b; }

// Bytes of a device row of `cols` elements of `type`; -1 for a type without a known layout or cols not a
// whole number of its blocks (or negative).
int64_t device_row_bytes(DType type, int64_t cols);

// Alignment the kernels require of a weight of `type` in device form (bytes): 16 for q6_K, else 1.
int device_weight_align(DType type);

// Writes `rows` rows of `cols` elements of `type` from the stored form `src` (rows * row_bytes bytes) in
// device form to `dst` (rows * device_row_bytes bytes, host memory). False, nothing written, where
// device_row_bytes is -1.
bool to_device_form(DType type, const void* src, int64_t rows, int64_t cols, void* dst);

}  // namespace dflash::cuda

// The device form of weights: how the CUDA kernels find a weight's bytes in device memory.
//
// Every type is kept as GGUF stores it (rows of ggml blocks, row r at r * row_bytes(type, cols)) except
// q6_K, q8_0 and q4_0, whose blocks (210, 34 and 18 bytes, an fp16 scale d and the codes) sit at 2-byte
// alignment, which held their kernels to 2- and 4-byte loads (the decode GEMVs at 0.3-0.6 of the copy rate).
// Their device rows are "split": each block's body (all but d: q6_K's ql[128], qh[64], scales[16], 208 bytes;
// q8_0's qs[32], 32 bytes; q4_0's qs[16], 16 bytes; whole 16-byte words) one after another, then the blocks'
// d, then zeros up to a multiple of 16 bytes:
//   block b's body at body b, its d at body blocks + 2 b, row bytes body blocks + round_up(2 blocks, 16).
// A row grows by at most 14 bytes. q2_K (84 bytes: scales[16], qs[64], then d and dmin) is split the same way
// with a 4-byte entry a block: its 80-byte body, then each block's (d, dmin) pair. q3_K's 110-byte blocks are
// "padded" instead: each block's stored bytes (hmask[32], qs[64], scales[12], d) then two zero bytes, 112
// bytes a block (1.8% more), so that every block and its scales + d (one 16-byte word at offset 96) are
// 16-byte aligned.
// Every CUDA kernel that reads these types (ops/cuda: gemv_q8, mmq, matmul, gemm_q, dequantize) takes this
// form, and requires such weights 16-byte aligned; CudaBackend::pack_weight writes it when weights are
// copied to the device (Weights::to_backend).
//
// Included by nvcc-compiled code: no base/status.h.
#pragma once

#include <cstdint>

namespace dflash {
enum class DType : uint32_t;  // tensor/dtype.h
}  // namespace dflash

namespace dflash::cuda {

constexpr int kQ6Body = 208;  // bytes of a q6_K block a device row keeps together (all but d)
constexpr int kQ80Body = 32;  // of a q8_0 block
constexpr int kQ40Body = 16;  // of a q4_0 block
constexpr int kQ3Stride = 112;  // bytes a q3_K block takes in a device row (padded: its 110 bytes, 2 zeros)

constexpr int kQ2Body = 80;  // of a q2_K block (its d and dmin: a 4-byte entry)

// Bytes of a split device row of `blocks` blocks of `body` bytes (and `d_bytes` of scales each), and the
// offset of block b's scales (d, or q2_K's d and dmin) in it.
constexpr int64_t split_row_bytes(int64_t blocks, int body, int d_bytes = 2) {
  return body * blocks + (d_bytes * blocks + 15) / 16 * 16;
}
constexpr int64_t split_d_offset(int64_t blocks, int body, int64_t b, int d_bytes = 2) {
  return body * blocks + d_bytes * b;
}
constexpr int64_t q6k_row_bytes(int64_t blocks) { return split_row_bytes(blocks, kQ6Body); }
constexpr int64_t q6k_d_offset(int64_t blocks, int64_t b) { return split_d_offset(blocks, kQ6Body, b); }
constexpr int64_t q80_row_bytes(int64_t blocks) { return split_row_bytes(blocks, kQ80Body); }
constexpr int64_t q80_d_offset(int64_t blocks, int64_t b) { return split_d_offset(blocks, kQ80Body, b); }
constexpr int64_t q40_row_bytes(int64_t blocks) { return split_row_bytes(blocks, kQ40Body); }
constexpr int64_t q40_d_offset(int64_t blocks, int64_t b) { return split_d_offset(blocks, kQ40Body, b); }
constexpr int64_t q2k_row_bytes(int64_t blocks) { return split_row_bytes(blocks, kQ2Body, 4); }
constexpr int64_t q2k_dm_offset(int64_t blocks, int64_t b) { return split_d_offset(blocks, kQ2Body, b, 4); }

// Bytes of a device row of `cols` elements of `type`; -1 for a type without a known layout or cols not a
// whole number of its blocks (or negative).
int64_t device_row_bytes(DType type, int64_t cols);

// Alignment the kernels require of a weight of `type` in device form (bytes): 16 for the split (q6_K, q8_0,
// q4_0, q2_K) and padded (q3_K) forms, else 1.
int device_weight_align(DType type);

// Writes `rows` rows of `cols` elements of `type` from the stored form `src` (rows * row_bytes bytes) in
// device form to `dst` (rows * device_row_bytes bytes, host memory). False, nothing written, where
// device_row_bytes is -1.
bool to_device_form(DType type, const void* src, int64_t rows, int64_t cols, void* dst);

}  // namespace dflash::cuda

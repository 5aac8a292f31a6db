// f16 tensor-core products of q4_K weights with 1..32 tokens (kernels in qmma.cu): the candidate for issue 7's
// verify target, whose cost would not grow with the tokens as mmq's does (docs/benchmarks.md, seventeenth
// session). Not yet on any engine path: decode and verify must run one kernel so that a verify token stays bit
// for bit a decode step's, and this one is measured against gemv_q8 and mmq first (bench_cuda_mmq).
//
// y[t, r] = s_t * sum_k w'[r, k] x'[t, k], where
//   x'[t, k] = fp16(x[t, k] / s_t), s_t the power of two that brings token t's max |x| into [2^13, 2^14) (so no
//              code overflows fp16 and the scaling itself is exact), from qmma_pack_x;
//   w'[r, k] = fp16(fp16(q * ds - dm)) of the weight's code q (0..15) and its 32-element sub-block's
//              ds = fp16(d * sc), dm = fp16(dmin * m), the product and difference one fused fp16 operation;
// (sub-block scales below fp16's normal range, 6e-5, lose precision; a model's q4_K scales are far above), and
// the sums run on mma.sync m16n8k16 (fp16 inputs, f32 accumulators) over each row's blocks in increasing order
// within each of `split` warps (a function of rows and cols only), whose partial sums are added in warp order.
// A token's outputs do not depend on the other tokens of the launch, or on n (each output column of an mma is
// its own dot product), so a token alone and in a batch give the same bits.
//
// The weight's code bytes are read as stored: the 4 lanes of a quad own 32 bytes of a block (one 64-element
// chunk) and dequantize them straight into their A fragments (a byte pair's low and high nibbles by one mask,
// then the scale); the activations are laid out by qmma_pack_x in the same k order, so that each lane loads its
// B fragment of a k-step and 8 tokens as one 8-byte word.
//
// Included by nvcc-compiled code: no base/status.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dflash {
enum class DType : uint32_t;  // tensor/dtype.h
}  // namespace dflash

namespace dflash::cuda {

constexpr int64_t kQmmaMaxTokens = 32;

// Weight types with a kernel: q4_K.
bool qmma_supported(DType type);

// Bytes of qmma_pack_x's output for n tokens of cols: codes [cols / 256][16 k-steps][n8][4][4] fp16 (n8 = n
// rounded up to a multiple of 8, the padding tokens zeros), then the n8 scales s_t (f32).
int64_t qmma_x_bytes(int64_t n, int64_t cols);

// x [n, cols] f32 -> xp (qmma_x_bytes(n, cols), 16-byte aligned). n in [1, kQmmaMaxTokens], cols a positive
// multiple of 256. A token whose max |x| is 0 gets s_t = 1 and zero codes; one holding inf or NaN gets s_t =
// NaN (its outputs are NaN, as the f32 product's would be). cudaErrorInvalidValue (nothing enqueued) otherwise.
cudaError_t qmma_pack_x(const float* x, int64_t n, int64_t cols, void* xp, cudaStream_t stream = nullptr);

// The warps that split a row's blocks (1, 2, 4 or 8): a function of rows and cols alone.
int qmma_split(int64_t rows, int64_t cols);

// Enqueues y [n, rows] (y[t * rows + r]) = x' W^T for W rows x cols of `type` (q4_K, 16-byte aligned) and the n
// tokens xp holds (qmma_pack_x with the same n and cols). rows in [1, INT_MAX], n in [1, kQmmaMaxTokens], y 4-byte
// aligned, split 0 (qmma_split) or 1, 2, 4, 8. cudaErrorInvalidValue (nothing enqueued) otherwise.
cudaError_t qmma(DType type, const void* w, int64_t rows, int64_t cols, const void* xp, int64_t n, float* y,
                 cudaStream_t stream = nullptr, int split = 0);

}  // namespace dflash::cuda

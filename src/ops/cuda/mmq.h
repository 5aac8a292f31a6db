// Int8 tensor-core products of q4_K / q6_K weights with 1..32 int8-quantized tokens (kernels in mmq.cu).
//
// y[t, r] = x'_t . W_r with x' = xd * xq in the format quantize_q8_rows (gemv_q8.h) writes: xq int8 per
// element, xd f32 per 32 elements, xs int32 sums of each 16 codes. The integer dot of each weight
// sub-block (q4_K: 32 elements, q6_K: 16) with a token's codes is formed exactly by
// mma.sync (s8 x s8 -> s32); the scales are applied in f32 by a fixed sequence of operations per
// (row, token) element: the blocks of a row in increasing order within each of the row's `split` warps
// (split depends on rows and cols only), then the warps' partial sums in order.
//
// Per-token independence, bit for bit: y[t, :] depends only on token t's inputs, never on n, on the
// other tokens of the batch or on t's position in it (the integer dots are exact, the float epilogue per
// element the same whatever the tile it lands in). So one kernel can serve decode (n = 1) and
// speculative verify (n = 16..32) with identical logits.
//
// The result equals x' W^T to float rounding (see mmq.cu for the order). That order is the canonical one
// that gemv_q8 forms too (q4_K: per block T = (v_0 + v_1) + (v_2 + v_3) of the four 64-element chunk terms;
// q6_K: per block a pairwise tree of its eight 32-element group terms; parts of blocks p, p + S, ... folded in
// part order): with S = gemv_q8_parts(type, rows of the gemv_q8 launch) every output equals gemv_q8's bit for
// bit, which lets speculative verify steps (MatmulPath::kTokenExact) run here and still compute each token as
// a decode step does.
//
// Included by nvcc-compiled code: no base/status.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dflash {
enum class DType : uint32_t;  // tensor/dtype.h
}  // namespace dflash

namespace dflash::cuda {

constexpr int64_t kMmqMaxTokens = 32;  // tokens per launch

// Types with a tensor-core kernel: q4_K, q6_K.
bool mmq_supported(DType type);

// Enqueues y [n, rows] (y[t * rows + r]) = x' W^T, W rows x cols of `type` (q4_K or q6_K), x' = (xq, xd,
// xs) [n, cols] from quantize_q8_rows. n in [1, kMmqMaxTokens], cols a positive multiple of 256, rows
// >= 0 (0: nothing to do). cudaErrorInvalidValue (nothing enqueued) for another type, a bad shape, a null
// or misaligned pointer (w: 16 bytes for q4_K, 2 bytes for q6_K; xq, xd, xs: 16 bytes; y: 4 bytes).
// split: the parts a row's blocks are taken in (1, 2, 4 or 8; 0 picks mmq_split(rows, cols)). Part p takes
// blocks p, p + split, ... and sums them in increasing order; the row's output is the left fold of its parts
// in part order: the canonical order, which gemv_q8 forms with gemv_q8_parts(type, total rows of its
// launch) parts, so mmq(..., split = that) equals it bit for bit.
cudaError_t mmq(DType type, const void* w, int64_t rows, int64_t cols, const int8_t* xq, const float* xd,
                const int* xs, int64_t n, float* y, cudaStream_t stream = nullptr, int split = 0);

// The number of warps that split a row's blocks (1, 2, 4 or 8): a function of rows and cols alone, so
// a row's float summation order is the same for every n (exposed for tests and benchmarks).
int mmq_split(int64_t rows, int64_t cols);

// Benchmarking only (bench_cuda_mmq): selects a launch variant for later calls. Bit 0: products of n <= 8
// tokens at 3 CTAs a SM with one block in flight a warp (clear: 2 CTAs with two); bit 1: q4_K weight
// loads skip L1 (clear: through L1). 3, both set, is the default (measured best on an H100, the
// configuration the tests cover); every variant keeps the per-token independence (the float order is
// the same; split does not change).
void mmq_set_variant(int v);

}  // namespace dflash::cuda

// Int8 tensor-core products of q2_K..q6_K, q8_0 and q4_0 weights with 1..32 int8-quantized tokens (kernels in
// mmq.cu).
//
// y[t, r] = x'_t . W_r with x' = xd * xq as quantize_q8_rows (gemv_q8.h) writes it (xq int8 per element, xd
// f32 per 32 elements, xs int32 sums of each 16 codes), rearranged by mmq_pack_x. The integer dot of each weight
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
// The result equals x' W^T to float rounding (see mmq.cu for the order). That order is the canonical one that gemv_q8
// forms too (q4_K and q5_K: per block T = (v_0 + v_1) + (v_2 + v_3) of the four 64-element chunk terms; q6_K, q3_K
// and q2_K: per block a pairwise tree of its eight 32-element group terms; q8_0 and q4_0: the same tree over a
// super-block's eight blocks; parts of blocks p, p + S, ... folded in part order): with S = gemv_q8_parts(type, rows
// of the gemv_q8 launch) every output equals gemv_q8's bit for bit, which lets speculative verify steps
// (MatmulPath::kTokenExact) run here and still compute each token as a decode step does.
//
// Included by nvcc-compiled code: no base/status.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/gemv_q8.h"

namespace dflash::cuda {

constexpr int64_t kMmqMaxTokens = 32;  // tokens per launch

// Types with a tensor-core kernel: q4_K, q5_K (q4_K's code with the fifth bits), q6_K, q3_K and q2_K (q6_K's order,
// q2_K with its mins), q8_0 and q4_0 (rows of whole 256-element super-blocks, as every mmq row: cols a multiple of
// 256).
bool mmq_supported(DType type);

// mmq's activations: the (xq, xd, xs) of quantize_q8_rows for n tokens, rearranged for one weight type so that
// a lane's mma fragments of a 64-element chunk are one 16-byte load and a warp's load of 8 tokens 512
// contiguous bytes (read straight from the standard layout they take 8 loads from 8 rows a chunk; at 16-32
// tokens those activation loads, not the weights, held the kernel to L1's request rate). Layout, tokens padded
// to n8 = a multiple of 8 with zeros: codes [cols / 64 chunks][n8][4 lanes][16 bytes] (q4_K: bytes 8 l + [0, 8)
// of the chunk's two 32-element sub-blocks; q6_K: bytes 4 l + [0, 4) of each 16-element half of its two
// 32-element groups), then scales [cols / 64][n8] of {xd of the two groups, the two groups' code sums} (f32).
int64_t mmq_x_bytes(int64_t n, int64_t cols);

// Enqueues the rearrangement into xp (mmq_x_bytes(n, cols) bytes, 16-byte aligned) for weights of `type` (q4_K, q5_K,
// q8_0 and q4_0 share a layout, q6_K, q3_K and q2_K another). n in [1, kMmqMaxTokens], cols a positive multiple of
// 256, xq, xd, xs 16-byte aligned; cudaErrorInvalidValue (nothing enqueued) otherwise.
cudaError_t mmq_pack_x(DType type, const int8_t* xq, const float* xd, const int* xs, int64_t n, int64_t cols,
                       void* xp, cudaStream_t stream = nullptr);

// Enqueues y_p [n, rows_p] (y_p[t * rows_p + r]) = x' W_p^T for every part (gemv_q8.h's Q8Part: all of `type`, q2_K,
// q3_K, q4_K, q5_K, q6_K, q8_0 or q4_0, all cols wide; at most kQ8MaxParts, parts of 0 rows skipped) in one launch,
// x' the n tokens in xp as mmq_pack_x wrote them for `type`, n and cols. One launch for a group's weights keeps the
// GPU's last wave of CTAs full (a lone 17408-row product at 23 tokens ran 2.06 waves). rows_p at most INT_MAX, n in
// [1, kMmqMaxTokens], cols a positive multiple of 256. cudaErrorInvalidValue (nothing enqueued) for another type, a
// bad shape, a null or misaligned pointer (w: 16 bytes, q6_K, q3_K, q2_K, q8_0, q4_0 in their device forms,
// weight_form.h; xp: 16 bytes; y: 4 bytes). split: the parts a row's blocks are taken in (1, 2, 4 or 8; 0 picks
// mmq_split(total rows, cols)). Part p takes blocks p, p + split, ... and sums them in increasing order; the row's
// output is the left fold of its parts in part order: the canonical order, which gemv_q8 forms with
// gemv_q8_parts(type, total rows of its launch) parts, so mmq(..., split = that) equals it bit for bit.
cudaError_t mmq(DType type, const Q8Part* parts, int n_parts, int64_t cols, const void* xp, int64_t n,
                cudaStream_t stream = nullptr, int split = 0);

// One weight: y [n, rows] = x' W^T (as above, one part).
inline cudaError_t mmq(DType type, const void* w, int64_t rows, int64_t cols, const void* xp, int64_t n, float* y,
                       cudaStream_t stream = nullptr, int split = 0) {
  const Q8Part part{w, rows, y};
  return mmq(type, &part, 1, cols, xp, n, stream, split);
}

// The number of warps that split a row's blocks (1, 2, 4 or 8): a function of rows and cols alone, so
// a row's float summation order is the same for every n (exposed for tests and benchmarks).
int mmq_split(int64_t rows, int64_t cols);

// Benchmarking only (bench_cuda_mmq): selects a launch variant for later calls. Bit 0: products of n <= 8
// tokens at 3 CTAs a SM with one block in flight a warp (clear: 2 CTAs with two); bit 1: q4_K weight
// loads skip L1 (clear: through L1); bit 2: one row tile a warp always (clear: two for q4_K products of
// more than 24 tokens and 16K+ rows); bit 3: q4_K and q5_K at split 8 keep 8 warps a tile (clear: 4, each
// summing two parts, where a warp takes one row tile). 3 is the default (measured best on an H100, the
// configuration the tests cover); every variant keeps the per-token independence (the float order is
// the same; split does not change).
void mmq_set_variant(int v);

}  // namespace dflash::cuda

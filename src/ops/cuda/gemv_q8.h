// Integer-dot GEMV for the common block types (kernels in gemv_q8.cu): the activations are quantized
// to 8 bits per 32-element block (x ~ xd * xq, xq int8 in [-127, 127], xd f32 = max|x| / 127), and each
// weight block is dotted with them by 4-byte integer dot products (dp4a), its scales applied to the
// exact integer sums in f32. Weight bytes are read once, 16 bytes at a time where the block layout
// allows; per weight element the kernel issues about a quarter of an instruction per token, against
// about three for the f32 GEMV (matmul.h), which is what lets it keep up with HBM. With several tokens a
// warp takes two or four rows, so that each token's activation load serves all of them (gemv_q8.cu).
//
// The result equals x' W^T with x' = xd * xq (the dequantized activations) to float rounding; the
// difference from the f32 product is the activation rounding (at most max|x| / 254 per element of a
// block), the same trade llama.cpp's MMVQ makes. A token's output does not depend on the other tokens
// of the batch (quantization is per token and block, the summation order fixed).
//
// Included by nvcc-compiled code: no base/status.h. The Status API is matmul_host.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dflash {
enum class DType : uint32_t;  // tensor/dtype.h
}  // namespace dflash

namespace dflash::cuda {

constexpr int64_t kQ8Block = 32;      // activation elements per scale
constexpr int kQ8MaxParts = 4;        // weights one grouped launch takes
constexpr int64_t kQ8MaxTokens = 16;  // tokens a warp takes: a launch's, or, where a split's warps share the tokens,
                                      // each warp's share of up to kQ8MaxSharedTokens (gemv_q8_max_tokens)
constexpr int64_t kQ8MaxSharedTokens = 32;

// Types with an integer-dot kernel: q4_0, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K.
bool gemv_q8_supported(DType type);

// x [n, cols] f32 -> xq [n, cols] int8, xd [n, cols / 32] f32 and xs [n, cols / 16] int32, the sum of
// each 16 consecutive codes (the weight blocks' minimum terms use it). cols a multiple of 32. A block
// whose max |x| is 0 gets xd = 0 and codes 0; a block holding inf or NaN gets xd = NaN (the products are
// NaN, as the f32 product would be). xq[i] = rint(x[i] * (127 / amax)) with the quotient rounded once.
cudaError_t quantize_q8_rows(const float* x, int64_t n, int64_t cols, int8_t* xq, float* xd, int* xs,
                             cudaStream_t stream = nullptr);

// Where a producer writes the int8 form of its f32 output beside it (the layout quantize_q8_rows writes):
// xq [elems] int8, xd [elems / 32] f32, xs [elems / 16] int32. SwiGLU (norm_rope.h) takes one,
// so the GEMV that reads its output needs no quantize launch. Null xq: no int8 output. And xb [elems], where not
// null: the output's bf16 bits (nearest even, what dequantize_rows makes of it), which gemv16_mma_bf16x reads
// (a bf16 weight's token-exact product from kGemv16MmaBf16XFrom tokens) instead of converting.
struct Q8Out {
  int8_t* xq = nullptr;
  float* xd = nullptr;
  int* xs = nullptr;
  uint16_t* xb = nullptr;
  __host__ __device__ bool on() const { return xq != nullptr; }
  __host__ __device__ bool bf16() const { return xb != nullptr; }
};

// One weight of a grouped product: y [n, rows] (y[t * rows + r]) = x' w^T, w rows x cols of `type`.
struct Q8Part {
  const void* w;
  int64_t rows;
  float* y;
};

// The most tokens one gemv_q8 launch takes for these weights (split as gemv_q8's, 0: by total_rows): where a
// split's warps share the tokens (rows of one warp step of blocks, a small model's), split x kQ8MaxTokens up to
// kQ8MaxSharedTokens, so that a verify step's products are one launch each; else kQ8MaxTokens. 0 for a type
// without the kernel.
int64_t gemv_q8_max_tokens(DType type, int64_t cols, int64_t total_rows, int split = 0);

// Enqueues y_p = x' W_p^T for every part (all of `type`, all cols wide) in one launch. x' = (xq, xd, xs)
// from quantize_q8_rows, n in [1, gemv_q8_max_tokens]. cudaErrorInvalidValue (nothing enqueued) for an
// unsupported type, a bad shape, more than kQ8MaxParts parts, a null or misaligned pointer (w: 16 bytes
// for every type (q6_K, q8_0, q4_0, q2_K and q3_K in their device form, weight_form.h); y, xd 4 bytes; xs 16
// bytes for q4_K and q5_K, else 4; xq 16 bytes). Parts with 0 rows are skipped. split: the warps a row's
// blocks are divided among (1, 2 or 4; 0: gemv_q8_split of the parts' total rows, what every caller but the
// token-exact one wants: that one runs some parts of a group elsewhere and keeps the split of the whole group,
// which fixes the summation order).
cudaError_t gemv_q8(DType type, const Q8Part* parts, int n_parts, int64_t cols, const int8_t* xq, const float* xd,
                    const int* xs, int64_t n, cudaStream_t stream = nullptr, int split = 0);

// The warps a launch of total_rows rows (all its weights together) splits each row's blocks among:
// gemv_auto_split(total_rows), halved (down to 1) for q4_K and q5_K, whose warps take twice the blocks a step.
int gemv_q8_split(DType type, int64_t total_rows);

// The parts a q3_K / q4_K / q5_K / q6_K launch (q8_0: of rows of whole 256-element super-blocks) of total_rows
// rows (all its weights together) sums each row in: one per lane group of each warp of a row group (8 for q4_K
// and q5_K, 4 for the others, times gemv_q8_split(type, total_rows)); 0 for the other types. Each part's blocks
// are summed in increasing order, every block's term in the canonical order of mmq.h, and the parts folded in
// order, so mmq(..., split = gemv_q8_parts(type, total_rows)) reproduces the launch's rows bit for bit, at any
// token count (when that is at most 8).
int gemv_q8_parts(DType type, int64_t total_rows);

}  // namespace dflash::cuda

// The product of bf16 weights with 1-32 tokens on the tensor cores: the token-exact GEMV of bf16 checkpoints
// (matmul_host.h, MatmulPath::kTokenExact: speculative verify steps, and the plain steps of a target that decodes
// with a draft), kernel in gemv16_mma.cu. A plain one-token product keeps the f32 16-bit GEMV (matmul.h), which
// reads the large weights faster (0.95-1.04 of the copy rate against 0.85-0.99 here).
//
// y_p[n, rows] = bf16(x)[n, cols] W_p^T for up to kGemv16MmaMaxParts weights of one launch (the weights that share
// an input: q/k/v, gate/up). x is rounded to bf16 (nearest even), as HF transformers runs bf16 checkpoints and
// the prefill GEMM does, by the kernel as it loads f32 x (gemv16_mma) or before it (gemv16_mma_bf16x: matmul's
// form from kGemv16MmaBf16XFrom tokens); products by mma.sync m16n8k16 with f32 accumulators. A CTA of 8 warps
// takes one or two 16-row tiles of one weight at a time (by token count and x's form), as many CTAs as fit the
// device each taking every gridDim-th group of rows; warp s takes the 64-column chunks s, s + 8, s + 16, ... of
// them, a lane 16 bytes of each of two 32-byte pieces of two rows a tile (L1::no_allocate loads, 1 or 2 chunks in
// flight), the columns a lane loads being the k-slots of its A and B fragments (any k order serves a dot product,
// so no shuffle or shared-memory staging); tokens are the 8 columns of B (tokens 8 i .. 8 i + 7: n-tile i), x
// loaded once a chunk for the CTA's tiles. The 8 warps' sums of a (row, token) are added in warp order.
//
// Every output is summed in an order fixed by cols alone (each warp's chunks ascending, the mma's own order
// inside a chunk, the warps in order), and the mma computes each column of its output from that column of B
// alone: a token's outputs are the same bits whatever n, the weights grouped with it, x's alignment or its form.
// So a verify step of n tokens equals n one-token token-exact steps bit for bit (DFlash stays lossless on the GPU).
//
// Included by nvcc-compiled code: no base/status.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dflash {
enum class DType : uint32_t;  // tensor/dtype.h
}  // namespace dflash

namespace dflash::cuda {

constexpr int64_t kGemv16MmaMaxTokens = 32;
constexpr int kGemv16MmaMaxParts = 4;

struct Gemv16Part {
  const void* w;  // rows x cols bf16, 16-byte aligned
  int64_t rows;
  float* y;  // y[t * rows + r]
};

// Whether gemv16_mma takes a weight: bf16, 16-byte aligned, cols a positive multiple of 64. It depends on the
// weight alone, so a weight's decode and its verify take the same kernel.
bool gemv16_mma_applies(DType type, const void* w, int64_t cols);

// Enqueues y_p = bf16(x) W_p^T for every part (all bf16, all cols wide, each gemv16_mma_applies) in one launch;
// x [n, cols] f32, 4-byte aligned, n in [1, kGemv16MmaMaxTokens]. cudaErrorInvalidValue (nothing enqueued) for a
// part it does not take, a bad shape, more than kGemv16MmaMaxParts parts, or a null or misaligned pointer. Parts of
// 0 rows are skipped.
cudaError_t gemv16_mma(const Gemv16Part* parts, int n_parts, int64_t cols, const float* x, int64_t n,
                       cudaStream_t stream = nullptr);

// From this many tokens matmul hands gemv16_mma_bf16x x already in bf16 (one conversion a group of weights): the
// kernel then reads half the x bytes and takes two row tiles a CTA. Below, x's conversion costs more than it saves.
constexpr int64_t kGemv16MmaBf16XFrom = 17;

// As gemv16_mma, with x [n, cols] already rounded to bf16 (nearest even, as dequantize_rows from f32 does: the
// same values gemv16_mma rounds to, so the same bits out), 16-byte aligned.
cudaError_t gemv16_mma_bf16x(const Gemv16Part* parts, int n_parts, int64_t cols, const uint16_t* xb, int64_t n,
                             cudaStream_t stream = nullptr);

// act [n, rows] = silu(bf16(x) G^T) * (bf16(x) U^T): a SwiGLU's gate and up products (bf16 weights of the same
// rows, each gemv16_mma_applies) in one launch that applies the activation as it stores. Each 16-row tile takes 8
// rows of each weight: every sum is the bits gemv16_mma computes for it (so act is the bits of gemv16_mma of both,
// then swiglu), and a token's outputs are the same whatever n. x [n, cols] f32, 4-byte aligned (the kernel rounds
// it to bf16 as it loads), n below kGemv16MmaBf16XFrom (there matmul reads x in bf16, two 32-row tiles a CTA,
// which this form was slower than: matmul_host.h kSwigluFusedMaxTokens). cudaErrorInvalidValue (nothing
// enqueued) for a bad shape or a null or misaligned pointer; rows == 0 enqueues nothing.
cudaError_t gemv16_mma_swiglu(const void* gate, const void* up, int64_t rows, int64_t cols, const float* x, int64_t n,
                              float* act, cudaStream_t stream = nullptr);

}  // namespace dflash::cuda

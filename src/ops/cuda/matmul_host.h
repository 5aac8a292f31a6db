// y[n, rows] = x[n, cols] W^T on the GPU, W [rows, cols] device-resident in its stored type (rows
// contiguous, ggml block layouts; q6_K, q8_0 and q4_0 in the split device form of weight_form.h), x and y
// device f32. Status API with argument messages.
//
// Three paths:
//   - integer-dot GEMV (n <= 16, q4_0, q8_0, q4_K, q5_K, q6_K: decode, speculative verify): gemv_q8.h, and
//     mmq.h for q4_K and q6_K weights of kExactMmqMinRows+ rows from kExactMmqFromTokens tokens (same bits).
//     The activations are quantized to int8 per 32-element block first (scratch from the stream-ordered
//     allocator); the result matches the CPU matmul of those dequantized activations to float rounding.
//   - f32 GEMV (n <= kGemvMaxTokens = 16, every type): matmul.h. f32 accumulation of the CPU codecs'
//     weights; matches ops/cpu matmul to float rounding (summation order differs).
//   - GEMM (larger n: prefill): x is rounded to bf16 and multiplied by W's bf16 values (dequantize.h:
//     bit-identical with fp32_to_bf16 of the CPU value) with f32 accumulation and f32 output, by one of
//       * the fused kernel (gemm_q.h; q4_K, q5_K, q6_K, q8_0): W decoded to bf16 in shared memory, tile
//         by tile, and multiplied there with tensor-core mma; W is read once, as it is in device memory;
//       * cuBLAS (cublasGemmEx, bf16 in, f32 out) on W itself for bf16 weights, and for the other types
//         on W dequantized to bf16 in balanced slabs of rows of at most 128 MiB.
//     kGemmBf16 (and kAuto above 16 tokens) picks the fused kernel where it applies and was measured
//     faster (gemm_fused_preferred). Either way the result differs from the CPU's f32 math by the bf16
//     rounding of both inputs (about 2^-8 relative per product) and equals the CPU matmul of the
//     bf16-rounded inputs to float rounding; both are deterministic (no split-K atomics). Scratch (x in
//     bf16, a slab of W or the fused kernel's split workspace) is taken per call from the stream-ordered
//     allocator (cudaMallocAsync, whose pool keeps its memory) and freed on the stream.
// The cuBLAS handle is created once per host thread and device (never destroyed: it lives until exit).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "base/status.h"
#include "ops/cuda/gemv16_mma.h"
#include "ops/cuda/gemv_q8.h"
#include "ops/cuda/mmq.h"
#include "tensor/dtype.h"

namespace dflash::cuda {

enum class MatmulPath {
  kAuto,      // n <= 16: as kTokenExact (integer-dot GEMV, mmq for large q4_K/q6_K weights from 4 tokens, where
              // the type has them), else f32 GEMV (bf16 weights too); GEMM above
  kGemv,      // f32 GEMV; n must be <= 16
  kGemvQ8,    // integer-dot GEMV; n <= 32 (slices of gemv_q8_max_tokens) and a type gemv_q8_supported
  kGemmBf16,     // any n >= 1: the fused kernel where gemm_fused_preferred, else dequantize + cuBLAS
  kGemmDequant,  // any n >= 1: cuBLAS on W itself (bf16) or on slabs of W dequantized to bf16
  kGemmFused,    // any n >= 1: the fused kernel; unsupported for weights it does not take (gemm_q_applies)
  // n <= kMmqMaxTokens (32): each token's row of y equals, bit for bit, what a one-token kTokenExact product of
  // the same targets computes (speculative verify steps, and the plain steps of a target that decodes with a
  // draft). The integer-dot types run gemv_q8 in slices of at most 16 tokens, in the split of the one-token
  // launch; q4_K and q6_K weights of at least kExactMmqMinRows rows take mmq from kExactMmqFromTokens tokens on,
  // in gemv_q8_parts of that launch (mmq.h: the same summation order), where those are at most 8: for these and
  // the f32-GEMV types a one-token kAuto product is the same. bf16 weights that gemv16_mma_applies takes run
  // gemv16_mma (x rounded to bf16; its tokens independent of the batch), here only: a one-token kAuto product
  // runs the f32 16-bit GEMV. The other types run the f32 GEMV in slices of at most 16 tokens.
  kTokenExact,
};

constexpr int64_t kExactMmqFromTokens = 4;  // below, gemv_q8 (one to three tokens a launch) is faster
constexpr int64_t kExactMmqMinRows = 512;   // smaller weights stay in their group's gemv_q8 launch

// Whether kGemmBf16 takes the fused kernel for this product (the weight qualifies and the token count is
// one where it measured faster than dequantize + cuBLAS on an H100).
bool gemm_fused_preferred(DType wtype, const void* w, int64_t rows, int64_t cols, int64_t n);

// Whether kGemmBf16 would dequantize this weight to bf16 for cuBLAS (neither the fused kernel nor a bf16 weight
// cuBLAS reads as it is), and kTokenExact takes it on the integer-dot kernels (gemv_q8, mmq): for products of at
// most kMmqMaxTokens tokens those read W once in one launch a type, where the GEMM path launches a dequantize and
// a GEMM a weight (a DFlash draft's K/V products over its context and block rows).
bool gemm_dequantizes_q8_type(DType wtype, const void* w, int64_t rows, int64_t cols, int64_t n);

// Benchmarks: the largest token count kGemmBf16 sends to the fused kernel (-1 restores the measured
// default, 0 turns it off). Not thread-safe against running products.
void set_gemm_fused_max_tokens(int64_t n);

// Benchmarks: the most bf16 bytes of W that the dequantize + cuBLAS path dequantizes at a time (whole
// rows, at least one; the slabs of a product have equal row counts); 0 restores the default (128 MiB).
// Not thread-safe against running products.
void set_gemm_slab_bytes(int64_t bytes);
int64_t gemm_slab_bytes();

// Enqueues the product on `stream`. Errors (nothing enqueued): unsupported type, negative shape, cols not
// a multiple of the block size, a shape cuBLAS cannot address (int dims), null or misaligned (x, y: 4
// bytes) pointers for a non-empty product, n > 16 with kGemv, kGemmFused for a weight the fused kernel
// does not take. n == 0 or rows == 0 is a no-op; cols == 0
// zeroes y. Kernel faults surface at the next synchronization of `stream`.
Status matmul(DType wtype, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
              cudaStream_t stream = nullptr, MatmulPath path = MatmulPath::kAuto);

// One weight of a product that shares its input with others.
struct MatmulTarget {
  DType type;
  const void* w;
  int64_t rows;
  float* y;  // n x rows
};

// y_i = x W_i^T for every target (all cols wide), as matmul(..., path) each; where the integer-dot path
// applies to all of them, x is quantized once and the targets run in grouped launches (up to 4 weights
// a launch), so a layer's q/k/v or gate/up cost one launch.
// `xq8` (optional): x's int8 form already written by x's producer (gemv_q8.h Q8Out, e.g. by rms_norm
// with q8 on); the integer-dot path reads it instead of quantizing x (same numbers, no quantize launch,
// no scratch), and gemv16_mma from kGemv16MmaBf16XFrom tokens its bf16 form (xq8->xb, where set) instead of
// converting x. The other paths ignore it.
Status matmul_group(std::span<const MatmulTarget> targets, int64_t cols, const float* x, int64_t n,
                    cudaStream_t stream = nullptr, MatmulPath path = MatmulPath::kAuto, const Q8Out* xq8 = nullptr);

// The most tokens matmul_swiglu takes: from kGemv16MmaBf16XFrom tokens the unfused products read x in bf16 with
// two 32-row tiles a CTA, and the fused launch of that form was slower than they and swiglu together (Qwen3.5-27B
// bf16, 23-token verify 18.94-19.00 -> 19.67-19.68 ms; at 16 tokens 19.11-19.16 -> 18.70-18.71; H200,
// docs/benchmarks.md, thirty-sixth session).
constexpr int64_t kSwigluFusedMaxTokens = kGemv16MmaBf16XFrom - 1;

// Whether matmul_swiglu takes this SwiGLU's gate and up products at n tokens on `path`: kTokenExact (verify steps,
// and the plain steps of a target with a draft) with bf16 weights of equal rows that gemv16_mma takes, up to
// kSwigluFusedMaxTokens tokens.
bool matmul_swiglu_fused(const MatmulTarget& gate, const MatmulTarget& up, int64_t cols, int64_t n,
                         MatmulPath path);

// act [n, rows] = silu(x gate^T) * (x up^T) in one launch (gemv16_mma_swiglu): the bits of the kTokenExact
// matmul_group of both, then swiglu. The targets' y are not used. Errors (nothing enqueued) where
// matmul_swiglu_fused does not hold, or for a null or misaligned x or act.
Status matmul_swiglu(const MatmulTarget& gate, const MatmulTarget& up, int64_t cols, const float* x, int64_t n,
                     float* act, cudaStream_t stream = nullptr);

}  // namespace dflash::cuda

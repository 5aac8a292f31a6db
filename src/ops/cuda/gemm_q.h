// Fused prefill GEMM of quantized weights (kernels in gemm_q.cu): y[n, rows] = x[n, cols] W^T with W in
// its stored block type (q4_K, q5_K, q6_K and q8_0, the last two in their device form, weight_form.h), x
// already rounded to bf16 and y f32.
//
// Each CTA computes 128 rows of W by `bn` tokens (64, 128 or 256): the raw blocks of W (one 256-element
// unit of 128 rows at a time, double-buffered) and the bf16 rows of x (64 columns at a time, 4 stages)
// arrive in shared memory by cp.async; the CTA decodes each 64-column slice of its W rows to bf16 in
// shared memory, and 8 warps multiply it by x's slice with bf16 mma.sync (m16n8k16, f32 accumulators).
// W is read once, in its quantized form; nothing is written to device memory but y.
//
// Numerics: every weight is decoded to the same bf16 value as dequantize_rows (dequantize.h) gives
// (the CPU codec's float operations in the same order, each rounded on its own, then rounded to nearest
// even), so y equals the dequantize + cuBLAS path up to the order of the f32 summation. Within a CTA the
// 64 columns of a slice may be multiplied in a permuted order (x's columns are permuted alike), a
// deterministic order: the same inputs give the same bits on every run. With split > 1 the columns are
// cut into `split` ranges whose partial sums go to a workspace and are added in range order by a second
// kernel (no atomics: deterministic too).
//
// This header is included by nvcc-compiled kernels: no base/status.h (fmt); DType is opaque here.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dflash {
enum class DType : uint32_t;  // tensor/dtype.h
}  // namespace dflash

namespace dflash::cuda {

struct GemmQPlan {
  int bn = 128;   // tokens per CTA: 64, 128 or 256
  int split = 1;  // column ranges (>= 1; clamped to the number of 256-column units)
};

// The weight types with a fused kernel.
bool gemm_q_supported(DType type);

// Whether the fused kernel takes this weight: a supported type, cols a positive multiple of 256, rows >= 1,
// and w 16-byte aligned.
bool gemm_q_applies(DType type, const void* w, int64_t rows, int64_t cols);

// The split the kernel runs for `plan` (the requested one clamped so that no range is empty).
int gemm_q_effective_split(int64_t cols, const GemmQPlan& plan);

// Device workspace bytes `plan` needs for an n-token product of `rows` rows (0 when split is 1).
size_t gemm_q_workspace_bytes(const GemmQPlan& plan, int64_t rows, int64_t cols, int64_t n);

// The plan matmul uses for this product on a device of `sms` multiprocessors: the fastest by a model of
// the kernel's time fitted to H100 measurements (tile width against waves of CTAs, and splitting the
// columns against adding the partial sums).
GemmQPlan gemm_q_plan(DType type, int64_t rows, int64_t cols, int64_t n, int sms);

// Enqueues y = xb W^T on `stream`. xb: n x cols bf16 (row stride cols, 16-byte aligned), y: n x rows f32
// (row stride rows), ws: gemm_q_workspace_bytes(plan, ...) bytes (16-byte aligned) or null when none are
// needed. cudaErrorInvalidValue (nothing enqueued) when the weight does not qualify (gemm_q_applies),
// for a bad plan, n < 1, a misaligned xb, or a missing workspace.
cudaError_t gemm_q(DType type, const void* w, int64_t rows, int64_t cols, const __nv_bfloat16* xb, int64_t n,
                   float* y, const GemmQPlan& plan, float* ws, cudaStream_t stream = nullptr);

}  // namespace dflash::cuda

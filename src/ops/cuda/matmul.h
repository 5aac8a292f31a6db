// Device matrix-vector products for decode and speculative verify (kernels in matmul.cu):
// y[n, rows] = x[n, cols] W^T with W [rows, cols] in its stored type (rows contiguous, ggml block layouts,
// row r at r * row_bytes(type, cols); q6_K in the device form of weight_form.h, 16-byte aligned), x and y
// f32, n = 1..kGemvMaxTokens tokens. Every entry point here and in gemv_q8.h, mmq.h and gemm_q.h takes
// weights in that form.
//
// Each warp streams a share of one weight row (f16/bf16: of 1-4 rows, by token count) once (16-byte
// loads), decodes the blocks in registers (or
// from a per-warp shared-memory stage for the block types that are not 16-byte aligned) and dots them
// with all n tokens; accumulation is f32. Weights are the CPU codecs' values (an FMA may fuse a scale and
// a min, and q8_0 applies its block scale to the block's partial sum), so results match the CPU reference
// (ops/cpu matmul) to float rounding, not bit for bit: the summation order differs. Each token's output
// does not depend on n (a verify batch reproduces single-token decode bit for bit) for a given split.
//
// Included by nvcc-compiled code: no base/status.h here. The Status API with argument messages and the
// prefill (large n) path is matmul_host.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dflash {
enum class DType : uint32_t;  // tensor/dtype.h
}  // namespace dflash

namespace dflash::cuda {

constexpr int64_t kGemvMaxTokens = 16;

// Weight types the GEMV decodes: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K..q6_K, q8_K.
bool gemv_supported(DType type);

// Enqueues y = x W^T on `stream`. x: n rows of cols floats; y: n rows of `rows` floats (y[t * rows + r]).
// split: warps per weight row (1, 2 or 4; 0 picks from rows and the multiprocessor count: gemv16_auto_split
// for f16/bf16 weights that take the 16-bit kernel, W and x 16-byte aligned and cols % 8 == 0, else
// gemv_auto_split). Returns
// cudaErrorInvalidValue (nothing enqueued) for an unsupported type, a shape that is negative or not a
// multiple of the block size, n outside [1, kGemvMaxTokens], a bad split, or a null pointer with a
// non-empty product. cols == 0 sets y to zero. x and y must be 4-byte aligned; W, x, y must not overlap y.
cudaError_t gemv(DType type, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
                 cudaStream_t stream = nullptr, int split = 0);

// Up to kGemvMaxParts weights of one 16-bit type and column count (a layer's q/k/v, gate/up) times the same x, as one
// launch of the 16-bit kernel: its rows numbered across the parts, split 0 picked from their total rows
// (gemv16_auto_split). Each part's outputs are the bits gemv(..., split) gives it alone at that split.
constexpr int kGemvMaxParts = 4;
struct GemvPart {
  const void* w;  // rows x cols, 16-byte aligned
  int64_t rows;
  float* y;  // y[t * rows + r]
};
// Whether gemv16_group takes a part: f16/bf16, w and x 16-byte aligned, cols % 8 == 0.
bool gemv16_group_applies(DType type, const void* w, int64_t cols, const float* x);
// cudaErrorInvalidValue (nothing enqueued) for a part it does not take, 0 or more than kGemvMaxParts parts, n
// outside [1, kGemvMaxTokens], a bad split or a null or misaligned y.
cudaError_t gemv16_group(DType type, const GemvPart* parts, int n_parts, int64_t cols, const float* x, int64_t n,
                         cudaStream_t stream = nullptr, int split = 0);

// The split gemv(..., split = 0) picks for `rows` output rows on the current device (gemv16_auto_split:
// for the 16-bit kernel, which wants fewer warps: whole rows a warp from 16 rows a multiprocessor).
int gemv_auto_split(int64_t rows);
int gemv16_auto_split(int64_t rows);

}  // namespace dflash::cuda

// Per-row top-k and log-sum-exp on the device (kernels in top_k.cu): the CUDA side of Backend::top_k_rows,
// with the semantics of cpu::top_k_rows (ops/cpu/ops.h): the k largest values of each row, descending, ties
// to the lower column; NaN counts as -inf (reported as -inf, adds nothing to lse); -0 and +0 are equal; a
// row of all -inf gives lse -inf and ids 0..k-1; a row holding +inf gives lse +inf.
//
// ids and values are exactly the CPU's (the same columns; each value is the element itself, NaN as -inf).
// lse: each term expf(x - m) in float (m a running per-thread maximum), summed in double; partial sums
// combined as (m, s) pairs with double exp; max + log(sum) in double, rounded once. Within ~2e-6 of the
// CPU's all-double value for rows up to 248320 columns (the error of float exp and of x - m rounded to
// float, weighted by the softmax).
//
// Work: a row is split over `splits` blocks of 256 threads (enough blocks to fill the device, each at
// least 4096 columns); each thread keeps a sorted top-k of its strided columns in registers and an online
// (max, sum) pair; a block merges its threads' lists by warp arg-max rounds. With more than one split, a
// second launch merges the splits' lists (kept in `workspace`).
//
// Included by nvcc-compiled code: no base/status.h here.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dflash::cuda {

inline constexpr int64_t kTopKMax = 16;

struct TopKPlan {
  int64_t splits = 1;          // blocks per row
  size_t workspace_bytes = 0;  // device workspace top_k_rows needs (0 when splits == 1)
};

// The launch shape for rows x cols, k on a device of `sm_count` multiprocessors.
TopKPlan plan_top_k_rows(int64_t rows, int64_t cols, int64_t k, int sm_count);

// x [rows, cols] (device); outputs in device memory: ids, values [rows, k], lse [rows] (null: not
// computed). `plan` from plan_top_k_rows with the same rows, cols and k; `workspace` at least
// plan.workspace_bytes (8-byte aligned). cudaErrorInvalidValue (nothing launched) for rows < 0, cols
// outside [1, INT32_MAX], k outside [1, min(cols, kTopKMax)], a null pointer that is needed, or a plan that
// does not fit. Asynchronous on `stream` (one or two launches); rows == 0 launches nothing.
cudaError_t top_k_rows(const float* x, int64_t rows, int64_t cols, int64_t k, const TopKPlan& plan, void* workspace,
                       int32_t* ids, float* values, float* lse, cudaStream_t stream = nullptr);

}  // namespace dflash::cuda

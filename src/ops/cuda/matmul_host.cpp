// Argument checks, the GEMV dispatch and the bf16 cuBLAS GEMM path (matmul_host.h).
#include "ops/cuda/matmul_host.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <map>
#include <vector>

#include "base/checked_math.h"
#include "ops/cuda/dequantize.h"
#include "ops/cuda/gemv_q8.h"
#include "ops/cuda/matmul.h"

namespace dflash::cuda {
namespace {

constexpr int64_t kSlabElems = int64_t{32} << 20;  // bf16 scratch for W: 64 MiB

// One handle per host thread and device (a handle is bound to the device current at its creation).
Result<cublasHandle_t> thread_handle() {
  int dev = 0;
  if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess)
    return io_error("matmul: no current CUDA device: {}", cudaGetErrorString(e));
  thread_local std::map<int, cublasHandle_t> handles;
  auto it = handles.find(dev);
  if (it != handles.end()) return it->second;
  cublasHandle_t h = nullptr;
  if (const cublasStatus_t s = cublasCreate(&h); s != CUBLAS_STATUS_SUCCESS)
    return io_error("matmul: cublasCreate failed on device {}: {}", dev, cublasGetStatusString(s));
  handles.emplace(dev, h);
  return h;
}

Status cuda_status(cudaError_t e, const char* what, std::string_view type, int64_t rows, int64_t cols, int64_t n) {
  if (e == cudaSuccess) return Status();
  return io_error("matmul {} ({} x {}, n {}): {}: {}", type, rows, cols, n, what, cudaGetErrorString(e));
}

// The stream-ordered allocator's default pool returns freed memory to the driver at every
// synchronization unless told otherwise, and a fresh cudaMallocAsync then costs tens of microseconds:
// keep what the per-call scratch has used (at most a few MiB for the GEMV, one slab for the GEMM).
void keep_pool_memory() {
  thread_local std::map<int, bool> done;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || done[dev]) return;
  done[dev] = true;
  cudaMemPool_t pool = nullptr;
  if (cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
    uint64_t keep = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  cudaGetLastError();
}

Status gemm_bf16(DType wtype, const uint8_t* w, uint64_t rb, int64_t rows, int64_t cols, const float* x, int64_t n,
                 float* y, cudaStream_t stream, std::string_view name) {
  if (rows > INT_MAX || cols > INT_MAX || n > INT_MAX)
    return invalid_argument("matmul {}: {} x {} with n {} exceeds cuBLAS's int dimensions", name, rows, cols, n);
  DF_ASSIGN_OR_RETURN(cublasHandle_t handle, thread_handle());
  keep_pool_memory();
  const int64_t slab = std::clamp<int64_t>(kSlabElems / cols, 1, rows);
  __nv_bfloat16 *xb = nullptr, *wb = nullptr;
  DF_RETURN_IF_ERROR(cuda_status(cudaMallocAsync(reinterpret_cast<void**>(&xb), sizeof(__nv_bfloat16) * n * cols, stream),
                                 "scratch for x", name, rows, cols, n));
  Status st = cuda_status(cudaMallocAsync(reinterpret_cast<void**>(&wb), sizeof(__nv_bfloat16) * slab * cols, stream),
                          "scratch for W", name, rows, cols, n);
  if (st.ok())  // f32 -> bf16, round to nearest even
    st = cuda_status(dequantize_rows(DType::kF32, x, xb, n, cols, stream), "x to bf16", name, rows, cols, n);
  if (st.ok()) {
    if (const cublasStatus_t s = cublasSetStream(handle, stream); s != CUBLAS_STATUS_SUCCESS)
      st = io_error("matmul {}: cublasSetStream: {}", name, cublasGetStatusString(s));
  }
  const float alpha = 1.0f, beta = 0.0f;
  for (int64_t r0 = 0; st.ok() && r0 < rows; r0 += slab) {
    const int64_t r = std::min(slab, rows - r0);
    st = cuda_status(dequantize_rows(wtype, w + static_cast<uint64_t>(r0) * rb, wb, r, cols, stream), "W to bf16",
                     name, rows, cols, n);
    if (!st.ok()) break;
    // Column-major view: Y^T[r, n] (ld rows) = (W slab as col-major cols x r)^T * (x as col-major cols x n).
    const cublasStatus_t s = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(r), static_cast<int>(n),
                                          static_cast<int>(cols), &alpha, wb, CUDA_R_16BF, static_cast<int>(cols), xb,
                                          CUDA_R_16BF, static_cast<int>(cols), &beta, y + r0, CUDA_R_32F,
                                          static_cast<int>(rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
      st = io_error("matmul {} ({} x {}, n {}): cublasGemmEx: {}", name, rows, cols, n, cublasGetStatusString(s));
  }
  if (wb) cudaFreeAsync(wb, stream);
  if (xb) cudaFreeAsync(xb, stream);
  return st;
}


// Shape and pointer checks shared by matmul and matmul_group; `*empty` is set when there is nothing to do.
Status check_args(DType wtype, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
                  MatmulPath path, bool* empty) {
  *empty = false;
  const auto info = dtype_info(wtype);
  if (!info || !gemv_supported(wtype) || !dequantize_supported(wtype))
    return unsupported("matmul on the GPU: weight type {} (id {}) is not supported", dtype_name(wtype),
                       static_cast<uint32_t>(wtype));
  const std::string_view name = info->name;
  if (rows < 0 || cols < 0 || n < 0)
    return invalid_argument("matmul {}: negative shape (rows {}, cols {}, n {})", name, rows, cols, n);
  if (cols % info->block_elems != 0)
    return invalid_argument("matmul {}: a row of {} elements is not a multiple of the block size {}", name, cols,
                            info->block_elems);
  if ((path == MatmulPath::kGemv || path == MatmulPath::kGemvQ8) && n > kGemvMaxTokens)
    return invalid_argument("matmul {}: the GEMV path takes at most {} tokens, not {}", name, kGemvMaxTokens, n);
  if (path == MatmulPath::kGemvQ8 && !gemv_q8_supported(wtype))
    return unsupported("matmul {}: no integer-dot GEMV for this type", name);
  DF_ASSIGN_OR_RETURN(const uint64_t rb, row_bytes(wtype, static_cast<uint64_t>(cols)));
  const auto wbytes = checked_mul(rb, static_cast<uint64_t>(rows));
  const auto xelems = checked_mul(static_cast<uint64_t>(n), static_cast<uint64_t>(cols));
  const auto yelems = checked_mul(static_cast<uint64_t>(n), static_cast<uint64_t>(rows));
  if (!wbytes || !xelems || !yelems || *wbytes > INT64_MAX || *xelems > INT64_MAX / 4 || *yelems > INT64_MAX / 4)
    return invalid_argument("matmul {}: {} x {} with n {} overflows the address space", name, rows, cols, n);
  if (n == 0 || rows == 0) {
    *empty = true;
    return Status();
  }
  if (y == nullptr || reinterpret_cast<uintptr_t>(y) % 4 != 0)
    return invalid_argument("matmul {}: output pointer is null or not 4-byte aligned", name);
  if (cols == 0) return Status();
  if (w == nullptr || x == nullptr || reinterpret_cast<uintptr_t>(x) % 4 != 0)
    return invalid_argument("matmul {}: {} pointer is null{}", name, w == nullptr ? "weight" : "input",
                            w == nullptr ? "" : " or not 4-byte aligned");
  return Status();
}

bool q8_applies(DType wtype, const void* w, int64_t cols, int64_t n, MatmulPath path) {
  if (path != MatmulPath::kAuto && path != MatmulPath::kGemvQ8) return false;
  if (n > kGemvMaxTokens || cols == 0 || !gemv_q8_supported(wtype)) return false;
  const bool k4 = wtype == DType::kQ4_K || wtype == DType::kQ5_K;
  return reinterpret_cast<uintptr_t>(w) % (k4 ? 16 : 2) == 0;
}

// The integer-dot path for targets that all qualify: x quantized once (unless its producer did: xq8),
// launches of up to 4 weights.
Status run_q8(std::span<const MatmulTarget> targets, int64_t cols, const float* x, int64_t n, cudaStream_t stream,
              const Q8Out* xq8) {
  const std::string_view name = dtype_name(targets[0].type);
  const int64_t rows0 = targets[0].rows;
  uint8_t* scratch = nullptr;
  const int8_t* xq = nullptr;
  const float* xd = nullptr;
  const int* xs = nullptr;
  Status st;
  if (xq8 != nullptr && xq8->on()) {
    xq = xq8->xq, xd = xq8->xd, xs = xq8->xs;
  } else {
    keep_pool_memory();
    // One scratch: xq (n cols bytes, a multiple of 32), then xd (n cols / 32 floats), then xs (n cols / 16 ints).
    const size_t q_bytes = static_cast<size_t>(n * cols), d_bytes = q_bytes / 8, s_bytes = q_bytes / 4;
    DF_RETURN_IF_ERROR(cuda_status(cudaMallocAsync(reinterpret_cast<void**>(&scratch), q_bytes + d_bytes + s_bytes,
                                                   stream),
                                   "scratch for int8 x", name, rows0, cols, n));
    auto* q = reinterpret_cast<int8_t*>(scratch);
    auto* d = reinterpret_cast<float*>(scratch + q_bytes);
    auto* s = reinterpret_cast<int*>(scratch + q_bytes + d_bytes);
    st = cuda_status(quantize_q8_rows(x, n, cols, q, d, s, stream), "x to int8", name, rows0, cols, n);
    xq = q, xd = d, xs = s;
  }
  for (size_t i = 0; st.ok() && i < targets.size();) {
    Q8Part parts[kQ8MaxParts];
    int np = 0;
    const DType type = targets[i].type;
    for (; i < targets.size() && np < kQ8MaxParts && targets[i].type == type; ++i)
      parts[np++] = Q8Part{targets[i].w, targets[i].rows, targets[i].y};
    st = cuda_status(gemv_q8(type, parts, np, cols, xq, xd, xs, n, stream), "integer-dot gemv launch",
                     dtype_name(type), parts[0].rows, cols, n);
  }
  if (scratch != nullptr) cudaFreeAsync(scratch, stream);
  return st;
}

Status run_one(DType wtype, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
               cudaStream_t stream, MatmulPath path) {
  const std::string_view name = dtype_name(wtype);
  if (cols == 0)
    return cuda_status(cudaMemsetAsync(y, 0, sizeof(float) * static_cast<size_t>(n * rows), stream), "zeroing y", name,
                       rows, cols, n);
  if (q8_applies(wtype, w, cols, n, path)) {
    const MatmulTarget t{wtype, w, rows, y};
    return run_q8(std::span<const MatmulTarget>(&t, 1), cols, x, n, stream, nullptr);
  }
  if (path == MatmulPath::kGemvQ8)
    return invalid_argument("matmul {}: the integer-dot GEMV needs {}-byte aligned weights", name,
                            wtype == DType::kQ4_K || wtype == DType::kQ5_K ? 16 : 2);
  const bool use_gemv = path == MatmulPath::kGemv || (path == MatmulPath::kAuto && n <= kGemvMaxTokens);
  if (use_gemv) return cuda_status(gemv(wtype, w, rows, cols, x, n, y, stream), "gemv launch", name, rows, cols, n);
  DF_ASSIGN_OR_RETURN(const uint64_t rb, row_bytes(wtype, static_cast<uint64_t>(cols)));
  return gemm_bf16(wtype, static_cast<const uint8_t*>(w), rb, rows, cols, x, n, y, stream, name);
}

}  // namespace

Status matmul(DType wtype, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
              cudaStream_t stream, MatmulPath path) {
  bool empty = false;
  DF_RETURN_IF_ERROR(check_args(wtype, w, rows, cols, x, n, y, path, &empty));
  if (empty) return Status();
  return run_one(wtype, w, rows, cols, x, n, y, stream, path);
}

Status matmul_group(std::span<const MatmulTarget> targets, int64_t cols, const float* x, int64_t n,
                    cudaStream_t stream, MatmulPath path, const Q8Out* xq8) {
  std::vector<MatmulTarget> q8, other;
  for (const MatmulTarget& t : targets) {
    bool empty = false;
    DF_RETURN_IF_ERROR(check_args(t.type, t.w, t.rows, cols, x, n, t.y, path, &empty));
    if (empty) continue;
    (q8_applies(t.type, t.w, cols, n, path) ? q8 : other).push_back(t);
  }
  if (!q8.empty()) {
    std::stable_sort(q8.begin(), q8.end(),
                     [](const MatmulTarget& a, const MatmulTarget& b) { return a.type < b.type; });
    DF_RETURN_IF_ERROR(run_q8(q8, cols, x, n, stream, xq8));
  }
  for (const MatmulTarget& t : other) DF_RETURN_IF_ERROR(run_one(t.type, t.w, t.rows, cols, x, n, t.y, stream, path));
  return Status();
}

}  // namespace dflash::cuda

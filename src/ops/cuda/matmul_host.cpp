// Argument checks, the GEMV dispatch and the bf16 cuBLAS GEMM path (matmul_host.h).
#include "ops/cuda/matmul_host.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <map>
#include <vector>

#include "base/checked_math.h"
#include "ops/cuda/dequantize.h"
#include "ops/cuda/gemm_q.h"
#include "ops/cuda/gemv16_mma.h"
#include "ops/cuda/gemv_q8.h"
#include "ops/cuda/matmul.h"
#include "ops/cuda/mmq.h"
#include "ops/cuda/sm_count.h"
#include "ops/cuda/weight_form.h"

namespace dflash::cuda {
namespace {

// Default largest slab of the dequantize + cuBLAS path. Measured on an H100 (bench/cuda_matmul_bench.cpp):
// slabs small enough to stay in the 50 MB L2 between the dequantize kernel and the GEMM lose more in the
// smaller GEMMs than they save, so slabs are large, and balanced (equal row counts: a thin last slab
// costs a whole badly shaped GEMM).
constexpr int64_t kDefaultSlabBytes = int64_t{128} << 20;
std::atomic<int64_t> g_slab_bytes{0};  // set_gemm_slab_bytes; 0: the default
// kGemmBf16 takes the fused kernel up to this many tokens: on an H100 it was faster than dequantize +
// cuBLAS for every Qwen3-8B product at 32..256 tokens (2x and more at 32..128) and slower for most at 512
// (cuBLAS's wgmma GEMM runs at 600-700 TFLOP/s there, the fused mma.sync kernel at 200-300).
constexpr int64_t kFusedMaxTokens = 256;
std::atomic<int64_t> g_fused_max_tokens{-1};  // set_gemm_fused_max_tokens; -1: kFusedMaxTokens

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

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// How one product of the GEMM path runs, and the scratch it needs beside x in bf16.
struct GemmRun {
  enum Kind { kFused, kDirect, kSlabs } kind = kSlabs;
  GemmQPlan plan;         // kFused
  int64_t slab_rows = 0;  // kSlabs
  int64_t scratch = 0;    // bytes: the fused kernel's split workspace or one bf16 slab
};

Result<GemmRun> plan_gemm(const MatmulTarget& t, int64_t cols, int64_t n, MatmulPath path) {
  GemmRun run;
  const bool fused = path == MatmulPath::kGemmFused ||
                     ((path == MatmulPath::kGemmBf16 || path == MatmulPath::kAuto) &&
                      gemm_fused_preferred(t.type, t.w, t.rows, cols, n));
  if (fused) {
    if (!gemm_q_applies(t.type, t.w, t.rows, cols))
      return unsupported("matmul {} ({} x {}): the fused GEMM does not take this weight (type, row length or "
                         "alignment)", dtype_name(t.type), t.rows, cols);
    run.kind = GemmRun::kFused;
    run.plan = gemm_q_plan(t.type, t.rows, cols, n, current_sm_count());
    run.scratch = static_cast<int64_t>(gemm_q_workspace_bytes(run.plan, t.rows, cols, n));
    return run;
  }
  if (t.type == DType::kBF16 && is_aligned(t.w, 2)) {
    run.kind = GemmRun::kDirect;  // cuBLAS reads W as it is
    return run;
  }
  run.kind = GemmRun::kSlabs;
  const int64_t max_rows = std::clamp<int64_t>(gemm_slab_bytes() / (2 * cols), 1, t.rows);
  const int64_t slabs = (t.rows + max_rows - 1) / max_rows;
  run.slab_rows = (t.rows + slabs - 1) / slabs;  // balanced
  run.scratch = 2 * run.slab_rows * cols;
  return run;
}

// The GEMM path for targets sharing x (n x cols f32): x is rounded to bf16 once, then each product runs
// as plan_gemm says.
Status run_gemm(std::span<const MatmulTarget> targets, int64_t cols, const float* x, int64_t n,
                cudaStream_t stream, MatmulPath path) {
  const std::string_view name0 = dtype_name(targets[0].type);
  for (const MatmulTarget& t : targets)
    if (t.rows > INT_MAX || cols > INT_MAX || n > INT_MAX)
      return invalid_argument("matmul {}: {} x {} with n {} exceeds cuBLAS's int dimensions", dtype_name(t.type),
                              t.rows, cols, n);
  std::vector<GemmRun> runs;
  int64_t scratch = 0;
  bool cublas = false;
  for (const MatmulTarget& t : targets) {
    DF_ASSIGN_OR_RETURN(GemmRun r, plan_gemm(t, cols, n, path));
    scratch = std::max(scratch, r.scratch);
    cublas = cublas || r.kind != GemmRun::kFused;
    runs.push_back(r);
  }
  cublasHandle_t handle = nullptr;
  if (cublas) {
    DF_ASSIGN_OR_RETURN(handle, thread_handle());
    if (const cublasStatus_t s = cublasSetStream(handle, stream); s != CUBLAS_STATUS_SUCCESS)
      return io_error("matmul {}: cublasSetStream: {}", name0, cublasGetStatusString(s));
  }
  keep_pool_memory();
  // One scratch allocation: x in bf16, then the largest product's own scratch (256-byte aligned).
  const int64_t xb_bytes = round_up(2 * n * cols, 256);
  uint8_t* mem = nullptr;
  DF_RETURN_IF_ERROR(cuda_status(cudaMallocAsync(reinterpret_cast<void**>(&mem), xb_bytes + scratch, stream),
                                 "scratch", name0, targets[0].rows, cols, n));
  auto* xb = reinterpret_cast<__nv_bfloat16*>(mem);
  uint8_t* extra = mem + xb_bytes;
  // f32 -> bf16, round to nearest even
  Status st = cuda_status(dequantize_rows(DType::kF32, x, xb, n, cols, stream), "x to bf16", name0, targets[0].rows,
                          cols, n);
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major view: Y^T[r, n] (ld rows) = (W rows as col-major cols x r)^T * (x as col-major cols x n).
  auto gemm = [&](const MatmulTarget& t, const void* wb, cudaDataType wtype, int64_t r0, int64_t r) -> Status {
    const cublasStatus_t s = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(r), static_cast<int>(n),
                                          static_cast<int>(cols), &alpha, wb, wtype, static_cast<int>(cols), xb,
                                          CUDA_R_16BF, static_cast<int>(cols), &beta, t.y + r0, CUDA_R_32F,
                                          static_cast<int>(t.rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
      return io_error("matmul {} ({} x {}, n {}): cublasGemmEx: {}", dtype_name(t.type), t.rows, cols, n,
                      cublasGetStatusString(s));
    return Status();
  };
  for (size_t i = 0; st.ok() && i < targets.size(); ++i) {
    const MatmulTarget& t = targets[i];
    const GemmRun& run = runs[i];
    const std::string_view name = dtype_name(t.type);
    if (run.kind == GemmRun::kFused) {
      st = cuda_status(gemm_q(t.type, t.w, t.rows, cols, xb, n, t.y, run.plan,
                              run.scratch > 0 ? reinterpret_cast<float*>(extra) : nullptr, stream),
                       "fused gemm launch", name, t.rows, cols, n);
      continue;
    }
    if (run.kind == GemmRun::kDirect) {
      st = gemm(t, t.w, CUDA_R_16BF, 0, t.rows);
      continue;
    }
    auto* wb = reinterpret_cast<__nv_bfloat16*>(extra);
    const auto rb = static_cast<uint64_t>(device_row_bytes(t.type, cols));
    for (int64_t r0 = 0; st.ok() && r0 < t.rows; r0 += run.slab_rows) {
      const int64_t r = std::min(run.slab_rows, t.rows - r0);
      st = cuda_status(dequantize_rows(t.type, static_cast<const uint8_t*>(t.w) + static_cast<uint64_t>(r0) * rb, wb,
                                       r, cols, stream),
                       "W to bf16", name, t.rows, cols, n);
      if (st.ok()) st = gemm(t, wb, CUDA_R_16BF, r0, r);
    }
  }
  cudaFreeAsync(mem, stream);
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
  if (path == MatmulPath::kGemv && n > kGemvMaxTokens)
    return invalid_argument("matmul {}: the GEMV path takes at most {} tokens, not {}", name, kGemvMaxTokens, n);
  if (path == MatmulPath::kGemvQ8 && n > kQ8MaxSharedTokens)
    return invalid_argument("matmul {}: the integer-dot GEMV path takes at most {} tokens, not {}", name,
                            kQ8MaxSharedTokens, n);
  if (path == MatmulPath::kTokenExact && n > kMmqMaxTokens)
    return invalid_argument("matmul {}: the token-exact path takes at most {} tokens, not {}", name, kMmqMaxTokens,
                            n);
  if (path == MatmulPath::kGemvQ8 && !gemv_q8_supported(wtype))
    return unsupported("matmul {}: no integer-dot GEMV for this type", name);
  const int64_t device_rb = device_row_bytes(wtype, cols);
  if (device_rb < 0) return invalid_argument("matmul {}: no device form for rows of {} elements", name, cols);
  const auto wbytes = checked_mul(static_cast<uint64_t>(device_rb), static_cast<uint64_t>(rows));
  const auto xelems = checked_mul(static_cast<uint64_t>(n), static_cast<uint64_t>(cols));
  const auto yelems = checked_mul(static_cast<uint64_t>(n), static_cast<uint64_t>(rows));
  if (!wbytes || !xelems || !yelems || *wbytes > INT64_MAX || *xelems > INT64_MAX / 4 || *yelems > INT64_MAX / 4)
    return invalid_argument("matmul {}: {} x {} with n {} overflows the address space", name, rows, cols, n);
  if (n == 0 || rows == 0) {
    *empty = true;
    return Status();
  }
  if (y == nullptr || !is_aligned(y, 4))
    return invalid_argument("matmul {}: output pointer is null or not 4-byte aligned", name);
  if (cols == 0) return Status();
  if (w == nullptr || x == nullptr || !is_aligned(x, 4))
    return invalid_argument("matmul {}: {} pointer is null{}", name, w == nullptr ? "weight" : "input",
                            w == nullptr ? "" : " or not 4-byte aligned");
  if (!is_aligned(w, device_weight_align(wtype)))
    return invalid_argument("matmul {}: the weight must be {}-byte aligned (its device form)", name,
                            device_weight_align(wtype));
  return Status();
}

// The weight alignment gemv_q8 needs (every type it takes: the k-quants' 16-byte loads, the split device forms).
constexpr uintptr_t kQ8WeightAlign = 16;

bool q8_applies(DType wtype, const void* w, int64_t cols, int64_t n, MatmulPath path) {
  if (path != MatmulPath::kAuto && path != MatmulPath::kGemvQ8 && path != MatmulPath::kTokenExact) return false;
  const int64_t most = path == MatmulPath::kTokenExact ? kMmqMaxTokens
                       : path == MatmulPath::kGemvQ8   ? kQ8MaxSharedTokens
                                                       : kGemvMaxTokens;
  if (n > most || cols == 0 || !gemv_q8_supported(wtype)) return false;
  return is_aligned(w, kQ8WeightAlign);
}

// One group's gemv_q8 launches, in slices of at most gemv_q8_max_tokens (split 0: the launch's own).
Status gemv_q8_slices(DType type, const Q8Part* parts, int np, int64_t cols, const int8_t* xq, const float* xd,
                      const int* xs, int64_t n, cudaStream_t stream, int split) {
  int64_t total = 0;
  for (int p = 0; p < np; ++p) total += parts[p].rows;
  const int64_t slice = std::max<int64_t>(gemv_q8_max_tokens(type, cols, total, split), 1);
  Status st;
  for (int64_t t0 = 0; st.ok() && t0 < n; t0 += slice) {
    const int64_t m = std::min<int64_t>(slice, n - t0);
    Q8Part sliced[kQ8MaxParts];
    for (int p = 0; p < np; ++p) sliced[p] = Q8Part{parts[p].w, parts[p].rows, parts[p].y + t0 * parts[p].rows};
    st = cuda_status(gemv_q8(type, sliced, np, cols, xq + t0 * cols, xd + t0 * cols / 32, xs + t0 * cols / 16, m,
                             stream, split),
                     "integer-dot gemv launch", dtype_name(type), parts[0].rows, cols, n);
  }
  return st;
}

// One group of the token-exact path (kTokenExact): every token as the group's one-token gemv_q8 launch sums it.
Status run_q8_exact(DType type, const Q8Part* parts, int np, int64_t cols, const int8_t* xq, const float* xd,
                    const int* xs, int64_t n, cudaStream_t stream) {
  int64_t total = 0;
  for (int p = 0; p < np; ++p) total += parts[p].rows;
  const int split = gemv_q8_split(type, total), order = gemv_q8_parts(type, total);
  const bool group_on_mmq = mmq_supported(type) && cols % 256 == 0 && n >= kExactMmqFromTokens && order <= 8;
  Q8Part rest[kQ8MaxParts], on_mmq[kQ8MaxParts];  // one launch each
  int nr = 0, nm = 0;
  for (int p = 0; p < np; ++p) {
    if (group_on_mmq && parts[p].rows >= kExactMmqMinRows) on_mmq[nm++] = parts[p];
    else rest[nr++] = parts[p];
  }
  Status st;
  if (nm > 0) {  // x in mmq's layout for this type, once for the group's mmq launches
    const std::string_view name = dtype_name(type);
    void* xp = nullptr;
    keep_pool_memory();
    DF_RETURN_IF_ERROR(cuda_status(cudaMallocAsync(&xp, static_cast<size_t>(mmq_x_bytes(n, cols)), stream),
                                   "scratch for mmq's x", name, on_mmq[0].rows, cols, n));
    st = cuda_status(mmq_pack_x(type, xq, xd, xs, n, cols, xp, stream), "x to mmq's layout", name, on_mmq[0].rows,
                     cols, n);
    if (st.ok())
      st = cuda_status(mmq(type, on_mmq, nm, cols, xp, n, stream, order), "mmq launch", name, on_mmq[0].rows, cols, n);
    cudaFreeAsync(xp, stream);
  }
  if (st.ok() && nr > 0) st = gemv_q8_slices(type, rest, nr, cols, xq, xd, xs, n, stream, split);
  return st;
}

// The integer-dot path for targets that all qualify: x quantized once (unless its producer did: xq8),
// launches of up to 4 weights; with_mmq (kAuto, kTokenExact): run_q8_exact, the large q4_K/q6_K weights on
// mmq from 4 tokens (the same bits as gemv_q8, several times faster); else (kGemvQ8) gemv_q8 alone.
Status run_q8(std::span<const MatmulTarget> targets, int64_t cols, const float* x, int64_t n, cudaStream_t stream,
              const Q8Out* xq8, bool with_mmq) {
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
    st = with_mmq ? run_q8_exact(type, parts, np, cols, xq, xd, xs, n, stream)
                  : gemv_q8_slices(type, parts, np, cols, xq, xd, xs, n, stream, 0);
  }
  if (scratch != nullptr) cudaFreeAsync(scratch, stream);
  return st;
}

// Whether a product runs on gemv16_mma: a weight it takes, in a token-exact product (verify steps, and the plain
// steps of a target that decodes with a draft: Runner::set_exact_decode). A one-token kAuto product stays on the
// f32 16-bit GEMV, the faster one-token kernel (0.95-1.04 of the copy rate against 0.85-0.99).
bool mma16_applies(const MatmulTarget& t, int64_t cols, MatmulPath path) {
  return path == MatmulPath::kTokenExact && gemv16_mma_applies(t.type, t.w, cols);
}

// gemv16_mma launches of up to kGemv16MmaMaxParts of the targets each. x_bf16: x's bf16 form written by its
// producer (Q8Out::xb), or null.
Status run_mma16(std::span<const MatmulTarget> targets, int64_t cols, const float* x, int64_t n,
                 cudaStream_t stream, const uint16_t* x_bf16 = nullptr) {
  const std::string_view name = dtype_name(targets[0].type);
  __nv_bfloat16* xb = nullptr;  // from kGemv16MmaBf16XFrom tokens: x in bf16, once for all the launches
  Status st;
  if (n >= kGemv16MmaBf16XFrom && x_bf16 == nullptr) {
    keep_pool_memory();
    DF_RETURN_IF_ERROR(cuda_status(cudaMallocAsync(reinterpret_cast<void**>(&xb), 2 * n * cols, stream),
                                   "scratch for bf16 x", name, targets[0].rows, cols, n));
    st = cuda_status(dequantize_rows(DType::kF32, x, xb, n, cols, stream), "x to bf16", name, targets[0].rows, cols,
                     n);
  }
  for (size_t i = 0; st.ok() && i < targets.size();) {
    Gemv16Part parts[kGemv16MmaMaxParts];
    int np = 0;
    for (; i < targets.size() && np < kGemv16MmaMaxParts; ++i)
      parts[np++] = Gemv16Part{targets[i].w, targets[i].rows, targets[i].y};
    const uint16_t* xb16 = xb != nullptr ? reinterpret_cast<const uint16_t*>(xb) : x_bf16;
    const cudaError_t e = n >= kGemv16MmaBf16XFrom ? gemv16_mma_bf16x(parts, np, cols, xb16, n, stream)
                                                   : gemv16_mma(parts, np, cols, x, n, stream);
    st = cuda_status(e, "bf16 tensor-core gemv launch", name, parts[0].rows, cols, n);
  }
  if (xb != nullptr) cudaFreeAsync(xb, stream);
  return st;
}

// Whether a product that no other kernel took runs on the f32 GEMV, as one launch of its n tokens.
bool uses_gemv(int64_t n, MatmulPath path) {
  return path == MatmulPath::kGemv || (path == MatmulPath::kAuto && n <= kGemvMaxTokens);
}

Status run_one(DType wtype, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
               cudaStream_t stream, MatmulPath path) {
  const std::string_view name = dtype_name(wtype);
  if (cols == 0)
    return cuda_status(cudaMemsetAsync(y, 0, sizeof(float) * static_cast<size_t>(n * rows), stream), "zeroing y", name,
                       rows, cols, n);
  if (const MatmulTarget t{wtype, w, rows, y}; mma16_applies(t, cols, path))
    return run_mma16(std::span<const MatmulTarget>(&t, 1), cols, x, n, stream);
  if (q8_applies(wtype, w, cols, n, path)) {
    const MatmulTarget t{wtype, w, rows, y};
    return run_q8(std::span<const MatmulTarget>(&t, 1), cols, x, n, stream, nullptr, path != MatmulPath::kGemvQ8);
  }
  if (path == MatmulPath::kGemvQ8)
    return invalid_argument("matmul {}: the integer-dot GEMV needs {}-byte aligned weights", name,
                            kQ8WeightAlign);
  if (path == MatmulPath::kTokenExact) {  // the f32 GEMV computes every token as a one-token call does
    Status st;
    for (int64_t t0 = 0; st.ok() && t0 < n; t0 += kGemvMaxTokens) {
      const int64_t m = std::min(kGemvMaxTokens, n - t0);
      st = cuda_status(gemv(wtype, w, rows, cols, x + t0 * cols, m, y + t0 * rows, stream), "gemv launch", name, rows,
                       cols, n);
    }
    return st;
  }
  if (uses_gemv(n, path))
    return cuda_status(gemv(wtype, w, rows, cols, x, n, y, stream), "gemv launch", name, rows, cols, n);
  const MatmulTarget t{wtype, w, rows, y};
  return run_gemm(std::span<const MatmulTarget>(&t, 1), cols, x, n, stream, path);
}

bool uses_gemm(int64_t n, MatmulPath path) {
  return path == MatmulPath::kGemmBf16 || path == MatmulPath::kGemmDequant || path == MatmulPath::kGemmFused ||
         (path == MatmulPath::kAuto && n > kGemvMaxTokens);
}

}  // namespace

bool matmul_swiglu_fused(const MatmulTarget& gate, const MatmulTarget& up, int64_t cols, int64_t n,
                         MatmulPath path) {
  return n >= 1 && n <= kSwigluFusedMaxTokens && gate.rows == up.rows && mma16_applies(gate, cols, path) &&
         mma16_applies(up, cols, path);
}

Status matmul_swiglu(const MatmulTarget& gate, const MatmulTarget& up, int64_t cols, const float* x, int64_t n,
                     float* act, cudaStream_t stream) {
  if (!matmul_swiglu_fused(gate, up, cols, n, MatmulPath::kTokenExact))
    return invalid_argument("matmul_swiglu: {} x {} and {} x {} {} and {} weights at {} tokens are not fused",
                            gate.rows, cols, up.rows, cols, dtype_name(gate.type), dtype_name(up.type), n);
  return cuda_status(gemv16_mma_swiglu(gate.w, up.w, gate.rows, cols, x, n, act, stream),
                     "bf16 tensor-core gate/up + SwiGLU launch", dtype_name(gate.type), gate.rows, cols, n);
}

bool gemm_fused_preferred(DType wtype, const void* w, int64_t rows, int64_t cols, int64_t n) {
  if (!gemm_q_applies(wtype, w, rows, cols)) return false;
  const int64_t max_n = g_fused_max_tokens.load(std::memory_order_relaxed);
  return n <= (max_n < 0 ? kFusedMaxTokens : max_n);
}

bool gemm_dequantizes_q8_type(DType wtype, const void* w, int64_t rows, int64_t cols, int64_t n) {
  return !gemm_fused_preferred(wtype, w, rows, cols, n) && q8_applies(wtype, w, cols, n, MatmulPath::kTokenExact);
}

void set_gemm_fused_max_tokens(int64_t n) { g_fused_max_tokens.store(n < 0 ? -1 : n, std::memory_order_relaxed); }

void set_gemm_slab_bytes(int64_t bytes) { g_slab_bytes.store(bytes > 0 ? bytes : 0, std::memory_order_relaxed); }

int64_t gemm_slab_bytes() {
  const int64_t b = g_slab_bytes.load(std::memory_order_relaxed);
  return b > 0 ? b : kDefaultSlabBytes;
}

Status matmul(DType wtype, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
              cudaStream_t stream, MatmulPath path) {
  bool empty = false;
  DF_RETURN_IF_ERROR(check_args(wtype, w, rows, cols, x, n, y, path, &empty));
  if (empty) return Status();
  return run_one(wtype, w, rows, cols, x, n, y, stream, path);
}

Status matmul_group(std::span<const MatmulTarget> targets, int64_t cols, const float* x, int64_t n,
                    cudaStream_t stream, MatmulPath path, const Q8Out* xq8) {
  std::vector<MatmulTarget> q8, mma16, gemm, other;
  for (const MatmulTarget& t : targets) {
    bool empty = false;
    DF_RETURN_IF_ERROR(check_args(t.type, t.w, t.rows, cols, x, n, t.y, path, &empty));
    if (empty) continue;
    if (q8_applies(t.type, t.w, cols, n, path))
      q8.push_back(t);
    else if (mma16_applies(t, cols, path))
      mma16.push_back(t);
    else if (cols > 0 && uses_gemm(n, path))
      gemm.push_back(t);  // x rounded to bf16 once for all of them
    else
      other.push_back(t);
  }
  if (!q8.empty()) {
    std::stable_sort(q8.begin(), q8.end(),
                     [](const MatmulTarget& a, const MatmulTarget& b) { return a.type < b.type; });
    DF_RETURN_IF_ERROR(run_q8(q8, cols, x, n, stream, xq8, path != MatmulPath::kGemvQ8));
  }
  if (!mma16.empty()) DF_RETURN_IF_ERROR(run_mma16(mma16, cols, x, n, stream, xq8 != nullptr ? xq8->xb : nullptr));
  if (!gemm.empty()) DF_RETURN_IF_ERROR(run_gemm(gemm, cols, x, n, stream, path));
  // 16-bit weights on the f32 GEMV: consecutive ones of a type as one launch (a decode step's q/k/v and gate/up).
  const bool on_gemv = uses_gemv(n, path);
  for (size_t i = 0; i < other.size();) {
    const MatmulTarget& t = other[i];
    if (!on_gemv || cols == 0 || !gemv16_group_applies(t.type, t.w, cols, x)) {
      DF_RETURN_IF_ERROR(run_one(t.type, t.w, t.rows, cols, x, n, t.y, stream, path));
      ++i;
      continue;
    }
    GemvPart parts[kGemvMaxParts];
    int np = 0;
    for (; i < other.size() && np < kGemvMaxParts && other[i].type == t.type &&
           gemv16_group_applies(other[i].type, other[i].w, cols, x);
         ++i)
      parts[np++] = GemvPart{other[i].w, other[i].rows, other[i].y};
    DF_RETURN_IF_ERROR(cuda_status(gemv16_group(t.type, parts, np, cols, x, n, stream), "grouped 16-bit gemv launch",
                                   dtype_name(t.type), parts[0].rows, cols, n));
  }
  return Status();
}

}  // namespace dflash::cuda

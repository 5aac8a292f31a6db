// Per-row top-k and log-sum-exp kernels (top_k.h).
//
// A candidate is one 64-bit integer that orders like (value descending, column ascending): the high word
// is the value's order key (the float's bits made monotone as unsigned: negatives flipped, positives with
// the sign bit set; NaN taken as -inf, -0 as +0), the low word ~column. So "better" is one integer compare,
// candidates are all distinct (distinct columns), and 0 (below the key of -inf) marks an empty slot.
#include <cstdint>

#include "ops/cuda/top_k.h"
#include "ops/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

using Cand = unsigned long long;  // the shuffle intrinsics' 64-bit type

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMinColsPerBlock = 4096;
constexpr int64_t kMaxSplits = 1024;
constexpr Cand kEmpty = 0;

// The float's bits with NaN as -inf and -0 as +0.
__device__ __forceinline__ uint32_t logit_bits(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) u = 0xff800000u;  // NaN -> -inf
  if (u == 0x80000000u) u = 0u;                          // -0 -> +0
  return u;
}

__device__ __forceinline__ float as_logit(float x) { return x != x ? -INFINITY : x; }

__device__ __forceinline__ Cand candidate(float x, int64_t col) {
  const uint32_t u = logit_bits(x);
  const uint32_t key = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (Cand(key) << 32) | Cand(~uint32_t(col));
}

__device__ __forceinline__ int32_t candidate_col(Cand c) { return int32_t(~uint32_t(c & 0xffffffffull)); }

// list: the K best seen, best first (kEmpty-padded).
template <int K>
__device__ __forceinline__ void insert(Cand (&list)[K], Cand c) {
  if (c <= list[K - 1]) return;
#pragma unroll
  for (int j = K - 1; j > 0; --j)  // list[j - 1] is still the old one when list[j] is set
    if (c > list[j]) list[j] = c > list[j - 1] ? list[j - 1] : c;
  if (c > list[0]) list[0] = c;
}

template <int K>
__device__ __forceinline__ void pop_front(Cand (&list)[K]) {
#pragma unroll
  for (int j = 0; j + 1 < K; ++j) list[j] = list[j + 1];
  list[K - 1] = kEmpty;
}

__device__ __forceinline__ Cand warp_max(Cand v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const Cand o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o > v ? o : v;
  }
  return v;
}

// Online log-sum-exp: the running maximum m and sum s of exp(x - m). x is never NaN here. A pair whose m
// is +inf stands for lse +inf whatever s holds; m -inf means nothing was added (s 0).
__device__ __forceinline__ void lse_add(float& m, double& s, float x) {
  if (x > m) {
    s = s * double(expf(m - x)) + 1.0;  // m - x is -inf when m is -inf or x is +inf: a factor of 0
    m = x;
  } else if (x > -INFINITY && m < INFINITY) {
    s += double(expf(x - m));
  }
}

__device__ __forceinline__ void lse_merge(float& m, double& s, float m2, double s2) {
  const float M = fmaxf(m, m2);
  if (M == -INFINITY || M == INFINITY) {
    s = M == INFINITY ? 1.0 : 0.0;
    m = M;
    return;
  }
  s = (m == -INFINITY ? 0.0 : s * exp(double(m) - double(M))) + (m2 == -INFINITY ? 0.0 : s2 * exp(double(m2) - double(M)));
  m = M;
}

__device__ __forceinline__ float lse_final(float m, double s) {
  if (m == -INFINITY || m == INFINITY) return m;
  return float(double(m) + log(s));
}

__device__ __forceinline__ void warp_lse(float& m, double& s) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
    const double s2 = __shfl_xor_sync(0xffffffffu, s, off);
    lse_merge(m, s, m2, s2);
  }
}

template <int K>
struct BlockShared {
  Cand warp_best[kWarps][K];
  Cand best[K];
  float m[kWarps];
  double s[kWarps];
};

// Merges every thread's list and (m, s) pair: the block's K best land in sh.best, its pair in sh.m[0],
// sh.s[0]. Each warp takes K rounds of a warp arg-max over its lanes' heads (the winner pops its head),
// then warp 0 merges the warps' lists the same way.
template <int K, bool kLse>
__device__ void block_reduce(Cand (&list)[K], float m, double s, BlockShared<K>& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < K; ++j) {
    const Cand head = list[0];
    const Cand best = warp_max(head);
    if (head == best) pop_front(list);  // one lane, unless every list is empty (then popping changes nothing)
    if (lane == 0) sh.warp_best[warp][j] = best;
  }
  if (kLse) {
    warp_lse(m, s);
    if (lane == 0) {
      sh.m[warp] = m;
      sh.s[warp] = s;
    }
  }
  __syncthreads();
  if (warp == 0) {
    int next = 0;  // lane w < kWarps walks warp w's list
    for (int j = 0; j < K; ++j) {
      const Cand head = lane < kWarps && next < K ? sh.warp_best[lane][next] : kEmpty;
      const Cand best = warp_max(head);
      if (head == best) ++next;
      if (lane == 0) sh.best[j] = best;
    }
    if (kLse) {
      float wm = lane < kWarps ? sh.m[lane] : -INFINITY;
      double ws = lane < kWarps ? sh.s[lane] : 0.0;
      warp_lse(wm, ws);
      __syncwarp();
      if (lane == 0) {
        sh.m[0] = wm;
        sh.s[0] = ws;
      }
    }
  }
  __syncthreads();
}

struct Outputs {
  int32_t* ids;
  float* values;
  float* lse;
  int k;
};

// Per (row, split): the split's K best and its (m, s) pair.
struct Partials {
  Cand* cand;  // [rows, splits, K]
  double* s;   // [rows, splits]
  float* m;    // [rows, splits]
};

template <int K, bool kLse>
__device__ void write_final(const float* xr, int64_t row, const BlockShared<K>& sh, const Outputs& out) {
  const int t = threadIdx.x;
  if (t < out.k) {
    const Cand c = sh.best[t];
    const int32_t col = c == kEmpty ? -1 : candidate_col(c);  // never empty when k <= cols
    out.ids[row * out.k + t] = col;
    out.values[row * out.k + t] = col < 0 ? -INFINITY : as_logit(xr[col]);
  }
  if (kLse && t == 0) out.lse[row] = lse_final(sh.m[0], sh.s[0]);
}

// Grid (rows, splits): block (r, p) scans columns [p * span, min(cols, (p + 1) * span)) of row r.
template <int K, bool kLse>
__global__ void __launch_bounds__(kThreads)
    top_k_scan_kernel(const float* __restrict__ x, int64_t cols, int64_t span, Outputs out, Partials part) {
  pdl_begin();
  __shared__ BlockShared<K> sh;
  const int64_t row = blockIdx.x;
  const int64_t split = blockIdx.y, splits = gridDim.y;
  const float* xr = x + row * cols;
  const int64_t c0 = split * span, c1 = c0 + span < cols ? c0 + span : cols;
  Cand list[K];
#pragma unroll
  for (int j = 0; j < K; ++j) list[j] = kEmpty;
  float m = -INFINITY;
  double s = 0.0;
  int64_t c = c0 + threadIdx.x;
  for (; c + 3 * kThreads < c1; c += 4 * kThreads) {  // four loads in flight per thread
    float v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = __ldg(xr + c + u * kThreads);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      insert(list, candidate(v[u], c + u * kThreads));
      if (kLse) lse_add(m, s, as_logit(v[u]));
    }
  }
  for (; c < c1; c += kThreads) {
    const float v = __ldg(xr + c);
    insert(list, candidate(v, c));
    if (kLse) lse_add(m, s, as_logit(v));
  }
  block_reduce<K, kLse>(list, m, s, sh);
  if (splits == 1) {
    write_final<K, kLse>(xr, row, sh, out);
    return;
  }
  const int64_t slot = row * splits + split;
  if (threadIdx.x < K) part.cand[slot * K + threadIdx.x] = sh.best[threadIdx.x];
  if (kLse && threadIdx.x == 0) {
    part.m[slot] = sh.m[0];
    part.s[slot] = sh.s[0];
  }
}

// Grid (rows): merges row r's splits.
template <int K, bool kLse>
__global__ void __launch_bounds__(kThreads)
    top_k_merge_kernel(const float* __restrict__ x, int64_t cols, int64_t splits, Outputs out, Partials part) {
  pdl_begin();
  __shared__ BlockShared<K> sh;
  const int64_t row = blockIdx.x;
  Cand list[K];
#pragma unroll
  for (int j = 0; j < K; ++j) list[j] = kEmpty;
  const Cand* cand = part.cand + row * splits * K;
  for (int64_t i = threadIdx.x; i < splits * K; i += kThreads) insert(list, cand[i]);
  float m = -INFINITY;
  double s = 0.0;
  if (kLse)
    for (int64_t i = threadIdx.x; i < splits; i += kThreads) lse_merge(m, s, part.m[row * splits + i], part.s[row * splits + i]);
  block_reduce<K, kLse>(list, m, s, sh);
  write_final<K, kLse>(x + row * cols, row, sh, out);
}

int bucket_of(int64_t k) { return k <= 1 ? 1 : k <= 2 ? 2 : k <= 4 ? 4 : k <= 8 ? 8 : 16; }

size_t workspace_for(int64_t rows, int64_t splits, int K) {
  return splits <= 1 ? 0 : size_t(rows) * size_t(splits) * (sizeof(double) + sizeof(Cand) * size_t(K) + sizeof(float));
}

template <int K, bool kLse>
cudaError_t launch(const float* x, int64_t rows, int64_t cols, int64_t splits, const Outputs& out,
                   const Partials& part, cudaStream_t stream) {
  const int64_t span = (cols + splits - 1) / splits;
  launch_pdl(top_k_scan_kernel<K, kLse>, dim3(unsigned(rows), unsigned(splits)), dim3(kThreads), 0, stream, x, cols,
             span, out, part);
  if (splits > 1)
    launch_pdl(top_k_merge_kernel<K, kLse>, dim3(unsigned(rows)), dim3(kThreads), 0, stream, x, cols, splits, out,
               part);
  return cudaGetLastError();
}

template <int K>
cudaError_t launch_k(const float* x, int64_t rows, int64_t cols, int64_t splits, const Outputs& out,
                     const Partials& part, cudaStream_t stream) {
  return out.lse != nullptr ? launch<K, true>(x, rows, cols, splits, out, part, stream)
                            : launch<K, false>(x, rows, cols, splits, out, part, stream);
}

}  // namespace

TopKPlan plan_top_k_rows(int64_t rows, int64_t cols, int64_t k, int sm_count) {
  TopKPlan p;
  if (rows <= 0 || cols <= 0 || k < 1 || k > kTopKMax) return p;
  const int64_t target_blocks = 4 * int64_t(sm_count > 0 ? sm_count : 1);
  int64_t splits = (target_blocks + rows - 1) / rows;
  const int64_t by_cols = cols / kMinColsPerBlock;
  if (splits > by_cols) splits = by_cols;
  if (splits > kMaxSplits) splits = kMaxSplits;
  if (splits < 1) splits = 1;
  p.splits = splits;
  p.workspace_bytes = workspace_for(rows, splits, bucket_of(k));
  return p;
}

cudaError_t top_k_rows(const float* x, int64_t rows, int64_t cols, int64_t k, const TopKPlan& plan, void* workspace,
                       int32_t* ids, float* values, float* lse, cudaStream_t stream) {
  if (rows < 0 || cols < 1 || cols > INT32_MAX || k < 1 || k > kTopKMax || k > cols) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (rows > INT32_MAX || x == nullptr || ids == nullptr || values == nullptr) return cudaErrorInvalidValue;
  const int K = bucket_of(k);
  const int64_t splits = plan.splits;
  if (splits < 1 || splits > kMaxSplits || plan.workspace_bytes < workspace_for(rows, splits, K) ||
      (splits > 1 && workspace == nullptr))
    return cudaErrorInvalidValue;
  const Outputs out{ids, values, lse, int(k)};
  Partials part{nullptr, nullptr, nullptr};
  if (splits > 1) {
    const size_t n = size_t(rows) * size_t(splits);
    auto* base = static_cast<unsigned char*>(workspace);
    part.s = reinterpret_cast<double*>(base);
    part.cand = reinterpret_cast<Cand*>(base + n * sizeof(double));
    part.m = reinterpret_cast<float*>(base + n * (sizeof(double) + sizeof(Cand) * size_t(K)));
  }
  switch (K) {
    case 1: return launch_k<1>(x, rows, cols, splits, out, part, stream);
    case 2: return launch_k<2>(x, rows, cols, splits, out, part, stream);
    case 4: return launch_k<4>(x, rows, cols, splits, out, part, stream);
    case 8: return launch_k<8>(x, rows, cols, splits, out, part, stream);
    default: return launch_k<16>(x, rows, cols, splits, out, part, stream);
  }
}

}  // namespace dflash::cuda

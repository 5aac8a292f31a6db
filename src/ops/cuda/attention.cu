// Kernels of attention.h.
//
// Prefill-shaped calls (n_q > 32, kCausal or kFull) run the tensor-core kernel of attention_mma.cu (f16
// inputs, f32 softmax and accumulators); path mode (decode, chain verify, trees of up to 128 nodes) runs the
// kernel of attention_decode.cu; everything else, and prefill-shaped calls too when asked through
// attention_internal.h (benchmarks, token-exact steps), runs the float32 kernel below.
//
// One kernel template attn_kernel<HD, R, T> serves small calls outside path mode (a windowed causal block,
// a kFull block such as the draft's), trees of more than 128 nodes and, on request, prefill. A block owns R
// "rows" of one KV head: row g = query i * group + head-of-group hg (query-major), i.e. every query head
// that reads this KV head, so one K/V tile in shared memory serves the whole group. Block (x, y, z) = (row
// block, KV head, key split). Per tile of T keys:
//   1. K and V rows of the tile -> shared memory (16-byte loads, chunk table lookup per key); for a kTree
//      mask each row's visible slots in the tile as a 64-bit mask, by walking its parent chain down to the
//      tile's first slot;
//   2. scores S[r][t] = (q_r . k_t) * scale, or -inf when masked (float4 dot products from shared memory;
//      K rows padded by 4 floats so a quarter-warp's 16-byte reads hit distinct banks);
//   3. online softmax, one warp per row: tile max, new running max, correction exp(m_old - m_new),
//      p = exp(s - m_new), running sum;
//   4. acc[r][:] = acc[r][:] * corr_r + sum_t p[r][t] v_t, float4 accumulators in registers (each thread
//      owns one 4-wide column slice for R / (1024 / HD) rows).
// With one split the block writes acc / l (0 when no key was visible); with several it writes (acc, m, l)
// partials and merge_kernel combines them: M = max m_s, o = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
#include "ops/cuda/attention.h"

#include <cuda_fp16.h>
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "ops/cuda/attention_internal.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/sm_count.h"
#include "ops/cuda/warp_reduce.cuh"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 256;

struct Params {
  const float* q;
  float* out;
  const float* const* k_chunks;
  const float* const* v_chunks;
  int64_t chunk_tokens;
  int64_t n_tokens;
  int64_t n_q;
  int64_t n_prefix;
  int64_t window;  // causal sliding window (0: none)
  const int32_t* parents;
  int32_t kind;
  int32_t n_heads;
  int32_t n_kv_heads;
  int32_t group;
  float scale;
  int32_t n_splits;
  int64_t keys_per_split;
  float* part_acc;  // [n_splits][n_q * n_heads][HD]
  float* part_ml;   // [n_splits][n_q * n_heads][2]
  const int32_t* lengths;  // device {n_prefix, n_tokens} overriding the fields above, or null
  int32_t kv_f16;            // 1: K/V chunks hold fp16 elements
};

// Four consecutive elements of a K/V chunk at element offset `off`, as float32 (fp16 exactly converted).
__device__ __forceinline__ float4 load_kv4(const float* chunk, int64_t off, bool f16) {
  if (!f16) return *reinterpret_cast<const float4*>(chunk + off);
  const uint2 h = *reinterpret_cast<const uint2*>(reinterpret_cast<const __half*>(chunk) + off);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&h.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&h.y));
  return make_float4(a.x, a.y, b.x, b.y);
}

template <int HD, int R, int T>
struct Shape {
  static_assert(HD % 32 == 0 && T <= 32 && R % 16 == 0);
  static constexpr int kD4 = HD / 4;                 // float4 columns of a row
  static constexpr int kRowGroups = kThreads / kD4;  // threads sharing one column slice
  static_assert(kThreads % kD4 == 0 && R % kRowGroups == 0);
  static constexpr int kRowsPerThread = R / kRowGroups;
  static constexpr int QS = HD + 4;  // padded strides, in floats
  static constexpr int KS = HD + 4;
  static constexpr int VS = HD;
  static constexpr int SS = T + 1;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + R * QS;
  static constexpr int kV = kK + T * KS;
  static constexpr int kS = kV + T * VS;
  static constexpr int kM = kS + R * SS;
  static constexpr int kL = kM + R;
  static constexpr int kC = kL + R;
  static constexpr int kMask = kC + R;  // R uint64, 8-byte aligned since R % 16 == 0
  static constexpr size_t kBytes = sizeof(float) * (kMask + 2 * R);
};

template <int HD, int R, int T>
__global__ void __launch_bounds__(kThreads) attn_kernel(Params p) {
  pdl_begin();
  using S = Shape<HD, R, T>;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* Qs = smem + S::kQ;
  float* Ks = smem + S::kK;
  float* Vs = smem + S::kV;
  float* Ss = smem + S::kS;
  float* m_s = smem + S::kM;
  float* l_s = smem + S::kL;
  float* c_s = smem + S::kC;
  uint64_t* tmask = reinterpret_cast<uint64_t*>(smem + S::kMask);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int kvh = blockIdx.y;
  const int split = blockIdx.z;
  const int group = p.group;
  const bool tree = p.kind == static_cast<int32_t>(AttnMaskKind::kTree);
  // Rows [row0, row_end) of the block.
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * R;
  const int64_t row_end = std::min<int64_t>(row0 + R, p.n_q * group);
  int64_t n_prefix = p.n_prefix, n_tokens = p.n_tokens, keys_per_split = p.keys_per_split;
  if (p.lengths != nullptr) {
    n_prefix = p.lengths[0];
    n_tokens = p.lengths[1];
  }

  // Keys this block may see: every query of the block sees nothing past n_prefix + i_hi (causal, tree).
  int64_t kend = n_tokens;
  if (p.kind != static_cast<int32_t>(AttnMaskKind::kFull)) {
    if (p.lengths != nullptr) keys_per_split = decode_keys_per_split(std::min<int64_t>(n_tokens, n_prefix + p.n_q),
                                                                     p.n_splits, T);
    kend = std::min<int64_t>(kend, n_prefix + (row_end - 1) / group + 1);
  } else if (p.lengths != nullptr) {
    keys_per_split = decode_keys_per_split(n_tokens, p.n_splits, T);
  }
  const int64_t kb = split * keys_per_split;
  const int64_t ke = std::min<int64_t>(kend, kb + keys_per_split);

  // Q rows of the block.
  for (int e = tid; e < R * S::kD4; e += kThreads) {
    const int r = e / S::kD4, c4 = e % S::kD4;
    const int64_t g = row0 + r;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (g < row_end) {
      const int64_t i = g / group, h = static_cast<int64_t>(kvh) * group + g % group;
      v = *reinterpret_cast<const float4*>(p.q + (i * p.n_heads + h) * HD + 4 * c4);
    }
    *reinterpret_cast<float4*>(Qs + r * S::QS + 4 * c4) = v;
  }
  if (tid < R) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }

  const int c4 = tid % S::kD4, rg = tid / S::kD4;
  float4 acc[S::kRowsPerThread];
#pragma unroll
  for (int k = 0; k < S::kRowsPerThread; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  __syncthreads();

  for (int64_t j0 = kb; j0 < ke; j0 += T) {
    // 1. K, V tile and tree masks.
    for (int e = tid; e < T * S::kD4; e += kThreads) {
      const int t = e / S::kD4, d4 = e % S::kD4;
      const int64_t j = j0 + t;
      float4 kv4 = make_float4(0.f, 0.f, 0.f, 0.f), vv4 = kv4;
      if (j < ke) {
        const int64_t c = j / p.chunk_tokens;
        const int64_t off = ((j - c * p.chunk_tokens) * p.n_kv_heads + kvh) * HD + 4 * d4;
        kv4 = load_kv4(p.k_chunks[c], off, p.kv_f16 != 0);
        vv4 = load_kv4(p.v_chunks[c], off, p.kv_f16 != 0);
      }
      *reinterpret_cast<float4*>(Ks + t * S::KS + 4 * d4) = kv4;
      *reinterpret_cast<float4*>(Vs + t * S::VS + 4 * d4) = vv4;
    }
    const bool tree_tile = tree && j0 + T > n_prefix;
    if (tree_tile && tid < R) {
      const int64_t g = row0 + tid;
      uint64_t mk = 0;
      if (g < row_end) {
        const int64_t s0 = j0 - n_prefix;  // slot of the tile's first key (may be negative)
        int64_t a = g / group;
        while (a >= 0 && a >= s0) {
          if (a < s0 + T) mk |= uint64_t{1} << (a - s0);
          const int64_t pa = p.parents[a];
          if (pa >= a) break;  // malformed (parents[i] must be < i): stop rather than loop
          a = pa;
        }
      }
      tmask[tid] = mk;
    }
    __syncthreads();

    // 2. Scores.
    for (int e = tid; e < R * T; e += kThreads) {
      const int r = e / T, t = e % T;
      const int64_t g = row0 + r, j = j0 + t;
      bool vis = g < row_end && j < ke;
      if (vis && j >= n_prefix) {
        const int64_t i = g / group, s = j - n_prefix;
        if (p.kind == static_cast<int32_t>(AttnMaskKind::kCausal)) vis = s <= i;
        else if (p.kind == static_cast<int32_t>(AttnMaskKind::kTree)) vis = (tmask[r] >> t) & 1u;
      }
      if (vis && p.window > 0 && p.kind == static_cast<int32_t>(AttnMaskKind::kCausal))
        vis = n_prefix + g / group - j < p.window;
      float sc = -INFINITY;
      if (vis) {
        const float4* qr = reinterpret_cast<const float4*>(Qs + r * S::QS);
        const float4* kr = reinterpret_cast<const float4*>(Ks + t * S::KS);
        float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma unroll 8
        for (int d = 0; d < S::kD4; ++d) {
          const float4 x = qr[d], y = kr[d];
          a0 = fmaf(x.x, y.x, a0);
          a1 = fmaf(x.y, y.y, a1);
          a2 = fmaf(x.z, y.z, a2);
          a3 = fmaf(x.w, y.w, a3);
        }
        sc = ((a0 + a1) + (a2 + a3)) * p.scale;
      }
      Ss[r * S::SS + t] = sc;
    }
    __syncthreads();

    // 3. Online softmax, a warp per row.
    for (int r = warp; r < R; r += kThreads / 32) {
      const float s = lane < T ? Ss[r * S::SS + lane] : -INFINITY;
      const float mb = warp_max(s);
      const float m_old = m_s[r];
      float corr = 1.0f, pr = 0.0f, m_new = m_old;
      if (mb != -INFINITY) {
        m_new = fmaxf(m_old, mb);
        corr = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        pr = s == -INFINITY ? 0.0f : expf(s - m_new);
      }
      const float sum = warp_sum(pr);
      if (lane < T) Ss[r * S::SS + lane] = pr;
      if (lane == 0) {
        m_s[r] = m_new;
        l_s[r] = l_s[r] * corr + sum;
        c_s[r] = corr;
      }
    }
    __syncthreads();

    // 4. acc = acc * corr + P V.
#pragma unroll
    for (int k = 0; k < S::kRowsPerThread; ++k) {
      const float c = c_s[rg + k * S::kRowGroups];
      acc[k].x *= c;
      acc[k].y *= c;
      acc[k].z *= c;
      acc[k].w *= c;
    }
#pragma unroll 4
    for (int t = 0; t < T; ++t) {
      const float4 v = *reinterpret_cast<const float4*>(Vs + t * S::VS + 4 * c4);
#pragma unroll
      for (int k = 0; k < S::kRowsPerThread; ++k) {
        const float pr = Ss[(rg + k * S::kRowGroups) * S::SS + t];
        acc[k].x = fmaf(pr, v.x, acc[k].x);
        acc[k].y = fmaf(pr, v.y, acc[k].y);
        acc[k].z = fmaf(pr, v.z, acc[k].z);
        acc[k].w = fmaf(pr, v.w, acc[k].w);
      }
    }
    __syncthreads();
  }

  // Epilogue.
  const int64_t n_rows = p.n_q * p.n_heads;
#pragma unroll
  for (int k = 0; k < S::kRowsPerThread; ++k) {
    const int r = rg + k * S::kRowGroups;
    const int64_t g = row0 + r;
    if (g >= row_end) continue;
    const int64_t i = g / group, h = static_cast<int64_t>(kvh) * group + g % group;
    const int64_t row = i * p.n_heads + h;
    if (p.n_splits == 1) {
      const float l = l_s[r];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      float4 o = acc[k];
      o.x *= inv;
      o.y *= inv;
      o.z *= inv;
      o.w *= inv;
      *reinterpret_cast<float4*>(p.out + row * HD + 4 * c4) = o;
    } else {
      const int64_t prow = split * n_rows + row;
      *reinterpret_cast<float4*>(p.part_acc + prow * HD + 4 * c4) = acc[k];
      if (c4 == 0) {
        p.part_ml[2 * prow] = m_s[r];
        p.part_ml[2 * prow + 1] = l_s[r];
      }
    }
  }
}

// One block of kMergeThreads per output row (query, head). The split maxima, weights e^(m_s - M) and the sum
// L are computed across the threads (splits in parallel, then a fixed-order reduction). Then warp w sums the
// splits w, w + kMergeWarps, ... in that order for every column (a lane's columns lane + 32 j: up to 8 loads
// of a split in flight at once), and the warps' sums are added in warp order: a row's latency is a few loads
// deep, not n_splits, and the order is fixed by n_splits alone.
constexpr int kMergeThreads = 256;
constexpr int kMergeWarps = kMergeThreads / 32;
constexpr int kMergeMaxHd = 256;
constexpr int kMaxSplits = 256;

__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const float* part_acc, const float* part_ml,
                                                              int n_splits, int64_t n_rows, int hd, float* out) {
  pdl_begin();
  __shared__ float w_s[kMaxSplits];
  __shared__ float red[kMergeWarps];
  __shared__ float sum_s[kMergeWarps][kMergeMaxHd];
  const int64_t row = blockIdx.x;
  float m = -INFINITY;
  for (int s = threadIdx.x; s < n_splits; s += kMergeThreads) m = fmaxf(m, part_ml[2 * (s * n_rows + row)]);
  const float M = block_reduce<kMergeThreads, true>(m, red);
  float l = 0.0f;
  for (int s = threadIdx.x; s < n_splits; s += kMergeThreads) {
    const float ms = part_ml[2 * (s * n_rows + row)];
    const float w = ms == -INFINITY ? 0.0f : expf(ms - M);
    w_s[s] = w;
    if (w != 0.0f) l += part_ml[2 * (s * n_rows + row) + 1] * w;
  }
  const float L = block_reduce<kMergeThreads, false>(l, red);  // its barriers also publish w_s
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  constexpr int kCols = kMergeMaxHd / 32;
  float a[kCols] = {};
#pragma unroll 4
  for (int s = warp; s < n_splits; s += kMergeWarps) {
    const float w = w_s[s];
    if (w == 0.0f) continue;
    const float* ps = part_acc + (s * n_rows + row) * hd;
#pragma unroll
    for (int j = 0; j < kCols; ++j)
      if (lane + 32 * j < hd) a[j] += ps[lane + 32 * j] * w;
  }
#pragma unroll
  for (int j = 0; j < kCols; ++j)
    if (lane + 32 * j < hd) sum_s[warp][lane + 32 * j] = a[j];
  __syncthreads();
  for (int d = static_cast<int>(threadIdx.x); d < hd; d += kMergeThreads) {
    float t = sum_s[0][d];
    for (int w = 1; w < kMergeWarps; ++w) t += sum_s[w][d];
    out[row * hd + d] = t * inv;
  }
}

constexpr int64_t kDecodeMaxQueries = kAttnDeviceLengthsMaxQueries;
constexpr int64_t kMinKeysPerSplit = 128;

struct Plan {
  bool mma;    // a tensor-core prefill kernel; the fields below then describe its launch
  bool wgmma;  // ... attention_wgmma.cu's (else attention_mma.cu's)
  bool path;   // path mode: attention_decode.cu's kernel (rows_per_block and keys_per_tile unused)
  int blocks_per_query;
  int rows_per_block;
  int keys_per_tile;
  int64_t row_blocks;
  int n_splits;
  int64_t keys_per_split;
};

// log2(chunk_tokens) when it is a power of two below 2^31, else -1.
int chunk_shift(int64_t chunk_tokens) {
  for (int b = 0; b < 31; ++b)
    if (chunk_tokens == (int64_t{1} << b)) return b;
  return -1;
}

bool args_ok(const float* q, int64_t n_q, int64_t n_heads, const DeviceKvView& kv, const DeviceAttnMask& m,
             const float* out) {
  if (n_q < 0 || n_heads <= 0 || kv.n_kv_heads <= 0 || n_heads % kv.n_kv_heads != 0) return false;
  if (!attention_head_dim_supported(kv.head_dim) || kv.chunk_tokens <= 0 || kv.n_tokens < 0) return false;
  if (m.n_prefix < 0 || m.n_prefix > kv.n_tokens) return false;
  if (m.kind != AttnMaskKind::kCausal && m.kind != AttnMaskKind::kTree && m.kind != AttnMaskKind::kFull) return false;
  if (n_heads / kv.n_kv_heads > 65535 || kv.n_kv_heads > 65535) return false;
  if (n_q == 0) return true;
  if (q == nullptr || out == nullptr) return false;
  if (kv.n_tokens > 0 && (kv.k_chunks == nullptr || kv.v_chunks == nullptr)) return false;
  if (m.kind == AttnMaskKind::kTree && m.parents == nullptr) return false;
  return true;
}

// A prefill plan's key ranges: `splits` (at most what the workspace holds for `per_split` bytes each, 1
// when under 2) ranges of whole tiles over max_keys keys; the last range may be short, empty ones dropped.
void set_key_splits(Plan& pl, int64_t max_keys, int64_t splits, size_t per_split, size_t workspace_bytes) {
  if (splits > 1 && workspace_bytes != SIZE_MAX) splits = std::min<int64_t>(splits, workspace_bytes / per_split);
  if (splits < 2) splits = 1;
  const int64_t T = pl.keys_per_tile;
  int64_t kps = splits == 1 ? std::max<int64_t>(max_keys, 1) : (max_keys + splits - 1) / splits;
  kps = (kps + T - 1) / T * T;
  pl.keys_per_split = kps;
  pl.n_splits = splits == 1 ? 1 : static_cast<int>((max_keys + kps - 1) / kps);
  if (pl.n_splits < 1) pl.n_splits = 1;
}

// The tensor-core kernel takes prefill-shaped calls (n_q > 32, causal or full) whose positions fit its
// 32-bit arithmetic.
bool mma_eligible(AttnPrefillKernel kernel, int64_t n_q, int64_t n_heads, const DeviceKvView& kv,
                  const DeviceAttnMask& mask) {
  if (kernel == AttnPrefillKernel::kSimt || n_q <= kDecodeMaxQueries) return false;
  if (mask.kind != AttnMaskKind::kCausal && mask.kind != AttnMaskKind::kFull) return false;
  constexpr int64_t kMax = INT32_MAX / 2;
  return kv.n_tokens <= kMax && n_q * n_heads <= kMax && kv.chunk_tokens <= kMax;
}

Plan make_mma_plan(AttnPrefillKernel kernel, int64_t n_q, int64_t n_heads, const DeviceKvView& kv,
                   const DeviceAttnMask& mask, size_t workspace_bytes) {
  Plan pl{};
  pl.mma = true;
  pl.wgmma = kernel == AttnPrefillKernel::kTensorCore && kv.f16 && attn_mma::wgmma_available();
  const int64_t group = n_heads / kv.n_kv_heads;
  pl.rows_per_block = attn_mma::kRowsPerBlock;
  pl.keys_per_tile = pl.wgmma ? attn_mma::kWgmmaKeysPerTile : attn_mma::keys_per_tile(kv.head_dim);
  pl.row_blocks = (n_q * group + pl.rows_per_block - 1) / pl.rows_per_block;
  int64_t max_keys = kv.n_tokens;
  if (mask.kind != AttnMaskKind::kFull) max_keys = std::min<int64_t>(max_keys, mask.n_prefix + n_q);
  // Split the keys only when the grid would leave most of the GPU idle and each range keeps a few tiles.
  constexpr int64_t kMinKeysPerMmaSplit = 256;
  const int64_t base = pl.row_blocks * kv.n_kv_heads;
  // (The wgmma kernel runs two blocks an SM at head_dim 128 but is planned as one: at 8B's 512-token shape two
  // key splits and their merge took 0.079 ms against one split's 0.034 on the mma.sync kernel, H100.)
  const int64_t target = static_cast<int64_t>(current_sm_count()) * attn_mma::blocks_per_sm(kv.head_dim);
  int64_t splits = 1;
  if (2 * base <= target && max_keys >= 2 * kMinKeysPerMmaSplit) {
    splits = std::min<int64_t>((target + base - 1) / base, max_keys / kMinKeysPerMmaSplit);
    splits = std::min<int64_t>(splits, kMaxSplits);
  }
  const size_t per_split = sizeof(float) * static_cast<size_t>(n_q * n_heads) * static_cast<size_t>(kv.head_dim + 2);
  set_key_splits(pl, max_keys, splits, per_split, workspace_bytes);
  return pl;
}

Plan make_plan(int64_t n_q, int64_t n_heads, const DeviceKvView& kv, const DeviceAttnMask& mask,
               size_t workspace_bytes, AttnPrefillKernel kernel) {
  if (mma_eligible(kernel, n_q, n_heads, kv, mask))
    return make_mma_plan(kernel, n_q, n_heads, kv, mask, workspace_bytes);
  Plan pl{};
  pl.path = (mask.kind == AttnMaskKind::kTree && n_q <= kMaxPathQueries) ||
            (mask.kind == AttnMaskKind::kCausal && mask.window == 0 && n_q <= kDecodeMaxQueries);
  const bool decode = pl.path || n_q <= kDecodeMaxQueries;
  pl.rows_per_block = pl.path ? attn_decode::kMaxRows : decode ? 16 : 64;
  pl.keys_per_tile = decode ? 32 : (kv.head_dim >= 256 ? 16 : 32);
  const int64_t group = n_heads / kv.n_kv_heads;
  pl.blocks_per_query = static_cast<int>((group + pl.rows_per_block - 1) / pl.rows_per_block);
  pl.row_blocks = pl.path ? n_q * pl.blocks_per_query : (n_q * group + pl.rows_per_block - 1) / pl.rows_per_block;
  int64_t max_keys = kv.n_tokens;
  if (mask.kind != AttnMaskKind::kFull) max_keys = std::min<int64_t>(max_keys, mask.n_prefix + n_q);
  // Path mode splits as the one-token decode does (the grid of one query), so its queries' outputs are
  // those decodes'.
  const int64_t base = (pl.path ? pl.blocks_per_query : pl.row_blocks) * kv.n_kv_heads;
  const int64_t target =
      (pl.path ? attn_decode::split_factor(kv.head_dim) : 2) * static_cast<int64_t>(current_sm_count());
  const size_t per_split = sizeof(float) * static_cast<size_t>(n_q * n_heads) * static_cast<size_t>(kv.head_dim + 2);
  if (decode) {  // a fixed number of ranges, whatever the key count (see attention.h)
    int64_t splits = base < target ? std::min<int64_t>((target + base - 1) / base, kMaxSplits) : 1;
    if (splits > 1 && workspace_bytes != SIZE_MAX) splits = std::min<int64_t>(splits, workspace_bytes / per_split);
    if (splits < 2) splits = 1;
    pl.n_splits = static_cast<int>(splits);
    pl.keys_per_split = decode_keys_per_split(std::max<int64_t>(max_keys, 1), pl.n_splits, pl.keys_per_tile);
    return pl;
  }
  int64_t splits = 1;
  if (base < target && max_keys > kMinKeysPerSplit) {
    splits = (target + base - 1) / base;
    splits = std::min<int64_t>(splits, (max_keys + kMinKeysPerSplit - 1) / kMinKeysPerSplit);
    splits = std::min<int64_t>(splits, kMaxSplits);
  }
  set_key_splits(pl, max_keys, splits, per_split, workspace_bytes);
  return pl;
}

template <int HD, int R, int T>
cudaError_t launch(const Params& p, int64_t row_blocks, int n_kv_heads, cudaStream_t stream) {
  using S = Shape<HD, R, T>;
  if (const cudaError_t err = allow_dynamic_smem<attn_kernel<HD, R, T>>(S::kBytes); err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(n_kv_heads),
                  static_cast<unsigned>(p.n_splits));
  launch_pdl(attn_kernel<HD, R, T>, grid, dim3(kThreads), S::kBytes, stream, p);
  return cudaGetLastError();
}

template <int HD>
cudaError_t launch_hd(const Params& p, const Plan& pl, int n_kv_heads, cudaStream_t stream) {
  if (pl.rows_per_block == 16) return launch<HD, 16, 32>(p, pl.row_blocks, n_kv_heads, stream);
  if constexpr (HD >= 256) return launch<HD, 64, 16>(p, pl.row_blocks, n_kv_heads, stream);
  else return launch<HD, 64, 32>(p, pl.row_blocks, n_kv_heads, stream);
}

}  // namespace

bool attention_head_dim_supported(int64_t head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

size_t attention_workspace_bytes_with(AttnPrefillKernel kernel, int64_t n_q, int64_t n_heads, const DeviceKvView& kv,
                                      const DeviceAttnMask& mask) {
  if (!args_ok(reinterpret_cast<const float*>(1), n_q, n_heads, kv, mask, reinterpret_cast<const float*>(1)) ||
      n_q == 0)
    return 0;
  const Plan pl = make_plan(n_q, n_heads, kv, mask, SIZE_MAX, kernel);
  if (pl.n_splits <= 1) return 0;
  return sizeof(float) * static_cast<size_t>(pl.n_splits) * static_cast<size_t>(n_q * n_heads) *
         static_cast<size_t>(kv.head_dim + 2);
}

size_t attention_workspace_bytes(int64_t n_q, int64_t n_heads, const DeviceKvView& kv, const DeviceAttnMask& mask) {
  return attention_workspace_bytes_with(AttnPrefillKernel::kTensorCore, n_q, n_heads, kv, mask);
}

cudaError_t attention_with(AttnPrefillKernel kernel, const float* q, int64_t n_q, int64_t n_heads,
                           const DeviceKvView& kv, const DeviceAttnMask& mask, float scale, float* out, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream) {
  if (!args_ok(q, n_q, n_heads, kv, mask, out)) return cudaErrorInvalidValue;
  if (n_q == 0) return cudaSuccess;
  if (mask.lengths != nullptr && n_q > kDecodeMaxQueries) return cudaErrorInvalidValue;
  const Plan pl = make_plan(n_q, n_heads, kv, mask, workspace == nullptr ? 0 : workspace_bytes, kernel);
  if (pl.row_blocks > 2147483647) return cudaErrorInvalidValue;
  const int64_t n_rows = n_q * n_heads;
  float* part_acc = nullptr;
  float* part_ml = nullptr;
  if (pl.n_splits > 1) {
    part_acc = static_cast<float*>(workspace);
    part_ml = part_acc + static_cast<size_t>(pl.n_splits) * n_rows * kv.head_dim;
  }
  cudaError_t err = cudaSuccess;
  if (pl.mma) {
    attn_mma::Params p{};
    p.q = q;
    p.out = out;
    p.k_chunks = kv.k_chunks;
    p.v_chunks = kv.v_chunks;
    p.chunk_tokens = static_cast<int32_t>(kv.chunk_tokens);
    p.chunk_shift = chunk_shift(kv.chunk_tokens);
    p.n_tokens = static_cast<int32_t>(kv.n_tokens);
    p.n_q = static_cast<int32_t>(n_q);
    p.causal = mask.kind == AttnMaskKind::kCausal ? 1 : 0;
    // kFull ignores n_prefix; a window no query reaches past (every distance n_prefix + i - j < n_prefix + n_q)
    // is no window.
    p.n_prefix = p.causal ? static_cast<int32_t>(mask.n_prefix) : 0;
    p.window = p.causal && mask.window > 0 && mask.window < mask.n_prefix + n_q ? static_cast<int32_t>(mask.window) : 0;
    p.n_heads = static_cast<int32_t>(n_heads);
    p.n_kv_heads = static_cast<int32_t>(kv.n_kv_heads);
    p.group = static_cast<int32_t>(n_heads / kv.n_kv_heads);
    p.row_blocks = static_cast<int32_t>(pl.row_blocks);
    p.n_splits = pl.n_splits;
    p.keys_per_split = static_cast<int32_t>(pl.keys_per_split);
    p.scale_log2 = scale * 1.4426950408889634f;
    p.part_acc = part_acc;
    p.part_ml = part_ml;
    p.kv_f16 = kv.f16 ? 1 : 0;
    err = pl.wgmma ? attn_mma::launch_wgmma(p, static_cast<int>(kv.head_dim), stream)
                   : attn_mma::launch(p, static_cast<int>(kv.head_dim), stream);
  } else if (pl.path) {
    attn_decode::Params p{};
    p.q = q;
    p.out = out;
    p.k_chunks = kv.k_chunks;
    p.v_chunks = kv.v_chunks;
    p.chunk_tokens = kv.chunk_tokens;
    p.chunk_shift = chunk_shift(kv.chunk_tokens);
    p.n_tokens = kv.n_tokens;
    p.n_prefix = mask.n_prefix;
    p.n_q = n_q;
    p.parents = mask.parents;
    p.tree = mask.kind == AttnMaskKind::kTree ? 1 : 0;
    p.n_heads = static_cast<int32_t>(n_heads);
    p.n_kv_heads = static_cast<int32_t>(kv.n_kv_heads);
    p.group = static_cast<int32_t>(n_heads / kv.n_kv_heads);
    p.blocks_per_query = pl.blocks_per_query;
    p.scale = scale;
    p.n_splits = pl.n_splits;
    p.part_acc = part_acc;
    p.part_ml = part_ml;
    p.lengths = mask.lengths;
    p.kv_f16 = kv.f16 ? 1 : 0;
    const bool tensor_cores =
        kv.f16 && mask.path_tensor_cores && p.group <= attn_decode::kMmaMaxGroup && p.chunk_shift >= 0;
    err = tensor_cores ? attn_decode::launch_mma(p, static_cast<int>(kv.head_dim), stream)
                       : attn_decode::launch(p, static_cast<int>(kv.head_dim), stream);
  } else {
    Params p{};
    p.q = q;
    p.out = out;
    p.k_chunks = kv.k_chunks;
    p.v_chunks = kv.v_chunks;
    p.chunk_tokens = kv.chunk_tokens;
    p.n_tokens = kv.n_tokens;
    p.n_q = n_q;
    p.n_prefix = mask.n_prefix;
    p.window = mask.window;
    p.parents = mask.parents;
    p.kind = static_cast<int32_t>(mask.kind);
    p.n_heads = static_cast<int32_t>(n_heads);
    p.n_kv_heads = static_cast<int32_t>(kv.n_kv_heads);
    p.group = static_cast<int32_t>(n_heads / kv.n_kv_heads);
    p.scale = scale;
    p.n_splits = pl.n_splits;
    p.keys_per_split = pl.keys_per_split;
    p.lengths = n_q <= kDecodeMaxQueries ? mask.lengths : nullptr;
    p.kv_f16 = kv.f16 ? 1 : 0;
    p.part_acc = part_acc;
    p.part_ml = part_ml;
    switch (kv.head_dim) {
      case 64: err = launch_hd<64>(p, pl, p.n_kv_heads, stream); break;
      case 128: err = launch_hd<128>(p, pl, p.n_kv_heads, stream); break;
      case 256: err = launch_hd<256>(p, pl, p.n_kv_heads, stream); break;
      default: return cudaErrorInvalidValue;
    }
  }
  if (err != cudaSuccess || pl.n_splits == 1) return err;
  if (n_rows > 2147483647) return cudaErrorInvalidValue;
  launch_pdl(merge_kernel, dim3(static_cast<unsigned>(n_rows)), dim3(kMergeThreads), 0, stream, part_acc, part_ml,
             pl.n_splits, n_rows, static_cast<int>(kv.head_dim), out);
  return cudaGetLastError();
}

cudaError_t attention(const float* q, int64_t n_q, int64_t n_heads, const DeviceKvView& kv,
                      const DeviceAttnMask& mask, float scale, float* out, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
  return attention_with(AttnPrefillKernel::kTensorCore, q, n_q, n_heads, kv, mask, scale, out, workspace,
                        workspace_bytes, stream);
}

}  // namespace dflash::cuda

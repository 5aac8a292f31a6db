// Gated DeltaNet kernels (gated_delta_net.h): recurrent (decode / chain and tree verify) and chunked WY
// (prefill). Float32; the chunked form's products on the tensor cores in the 3xTF32 form (float32's accuracy), its
// cumulative log decay and exponentials in double, as on the CPU (cpu::gated_delta_net_chunked explains why).
#include "ops/cuda/gated_delta_net.h"

#include <cstdint>
#include <type_traits>

#include "base/checked_math.h"
#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

// ------------------------------------------------------------------------------------------ recurrent
//
// One block per (V-head, tile of kRecWarps * kRecRows state rows). A warp owns kRecRows rows of S[h]
// (dv x dk); lane l holds M elements of each row in registers. VEC (dk a multiple of 128, 16-byte aligned
// buffers): lane l holds columns 128 m4 + 4 l + {0..3}, loaded and stored as float4 (a warp moves 512
// contiguous bytes per access); at dk 128 a row is over 8 lanes instead (recurrent_rows, LPR). Otherwise columns
// l + 32 m (4-byte coalesced). The state is read once, kept in registers across the tokens, and written once (plus
// once per token into per_token_states). Rows are independent, so a row's dot products are warp (or 8-lane)
// reductions and no block barrier is needed.
constexpr int kRecWarps = 4;
constexpr int kRecRows = 4;
constexpr int kRecTileRows = kRecWarps * kRecRows;

template <int M, bool VEC, int LPR = 32>
__device__ __forceinline__ void load_row(const float* p, int lane, int dk, float (&x)[M]) {
  if constexpr (VEC) {
#pragma unroll
    for (int m4 = 0; m4 < M / 4; ++m4) {
      const float4 t = *reinterpret_cast<const float4*>(p + m4 * (4 * LPR) + (lane % LPR) * 4);
      x[m4 * 4 + 0] = t.x;
      x[m4 * 4 + 1] = t.y;
      x[m4 * 4 + 2] = t.z;
      x[m4 * 4 + 3] = t.w;
    }
  } else {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int c = lane + 32 * m;
      x[m] = c < dk ? p[c] : 0.0f;
    }
  }
}

template <int M, bool VEC, int LPR = 32>
__device__ __forceinline__ void store_row(float* p, int lane, int dk, const float (&x)[M]) {
  if constexpr (VEC) {
#pragma unroll
    for (int m4 = 0; m4 < M / 4; ++m4)
      *reinterpret_cast<float4*>(p + m4 * (4 * LPR) + (lane % LPR) * 4) =
          make_float4(x[m4 * 4 + 0], x[m4 * 4 + 1], x[m4 * 4 + 2], x[m4 * 4 + 3]);
  } else {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int c = lane + 32 * m;
      if (c < dk) p[c] = x[m];
    }
  }
}

// Sums over each aligned group of LPR lanes (the whole warp at 32).
template <int R, int LPR = 32>
__device__ __forceinline__ void warp_sum(float (&x)[R]) {
#pragma unroll
  for (int off = LPR / 2; off > 0; off >>= 1)
#pragma unroll
    for (int r = 0; r < R; ++r) x[r] += __shfl_xor_sync(0xffffffffu, x[r], off);
}

// The recurrence over n tokens for a warp's kRecRows rows of V-head h's state (row0 < dv): from `in` (the head's
// incoming state, also stored to `before` when given), into `final` (the head's; not written with parents) and, per
// token, out and per_token_states (each optional).
// LPR: lanes a row. 32: lane l holds M elements of each of the 4 rows (dk other than 128, or not VEC). 8 (VEC, dk
// 128): the warp's 4 groups of 8 lanes take a row each, a lane 16 elements (columns 32 m4 + 4 (l % 8) + {0..3}); its
// dot products in 4-element runs added as a tree, then a 3-level butterfly: 6 shuffles a warp and token against 40.
template <int M, bool VEC, int LPR = 32>
__device__ __forceinline__ void recurrent_rows(const float* __restrict__ q, const float* __restrict__ k,
                                               const float* __restrict__ v, const float* __restrict__ g,
                                               const float* __restrict__ beta, int64_t n, int hk, int hv, int dk,
                                               int dv, int h, int row0, int lane, const float* in, float* final,
                                               float* __restrict__ out, float* per_token_states,
                                               const int32_t* __restrict__ parents, float* before) {
  const int kh = h % hk;
  const int64_t hs = int64_t(dv) * dk;
  constexpr int RL = kRecRows * LPR / 32;  // rows a lane
  static_assert(LPR == 32 || (VEC && kRecRows * LPR == 32 && M % 4 == 0));
  // The lane's r-th row (of its warp's kRecRows).
  auto row_of = [&](int r) { return r * (32 / LPR) + lane / LPR; };
  // sum x[m] y[m] over the lane's M elements: one run at LPR 32, else 4-element runs added as a tree.
  auto dot = [&](const float (&x)[M], const float (&y)[M]) {
    if constexpr (LPR == 32) {
      float acc = 0.0f;
#pragma unroll
      for (int m = 0; m < M; ++m) acc += x[m] * y[m];
      return acc;
    } else {
      float part[M / 4];
#pragma unroll
      for (int m4 = 0; m4 < M / 4; ++m4) {
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) acc += x[4 * m4 + i] * y[4 * m4 + i];
        part[m4] = acc;
      }
#pragma unroll
      for (int w = 1; w < M / 4; w *= 2)
#pragma unroll
        for (int m4 = 0; m4 + w < M / 4; m4 += 2 * w) part[m4] += part[m4 + w];
      return part[0];
    }
  };

  float s[RL][M];
  auto load_state = [&](const float* base) {
#pragma unroll
    for (int r = 0; r < RL; ++r) {
      if (row0 + row_of(r) < dv) {
        load_row<M, VEC, LPR>(base + int64_t(row0 + row_of(r)) * dk, lane, dk, s[r]);
      } else {
#pragma unroll
        for (int m = 0; m < M; ++m) s[r][m] = 0.0f;
      }
    }
  };
  auto store_state = [&](float* base) {
#pragma unroll
    for (int r = 0; r < RL; ++r)
      if (row0 + row_of(r) < dv) store_row<M, VEC, LPR>(base + int64_t(row0 + row_of(r)) * dk, lane, dk, s[r]);
  };

  // A token's inputs: k and q rows of its K-head, its log decay and beta, the warp's rows of v. They are loaded two
  // tokens ahead (the loop is a chain of tokens, each otherwise waiting on its loads).
  struct Inputs {
    float k[M], q[M], v[RL], g, b;
  };
  auto load_inputs = [&](int64_t t, Inputs& x) {
    load_row<M, VEC, LPR>(k + (t * hk + kh) * dk, lane, dk, x.k);
    load_row<M, VEC, LPR>(q + (t * hk + kh) * dk, lane, dk, x.q);
    x.g = g[t * hv + h];
    x.b = beta[t * hv + h];
    const float* vt = v + (t * hv + h) * dv + row0;
#pragma unroll
    for (int r = 0; r < RL; ++r) x.v[r] = row0 + row_of(r) < dv ? vt[row_of(r)] : 0.0f;
  };
  // Token t's start: its parent's state (tree form; the registers hold the state after token t - 1, or the incoming
  // state at t = 0; each thread reads back only elements it wrote itself, so no barrier or fence is needed), then
  // the decay, and this lane's parts of the rows' dot products with k (e, summed over the warp by the caller).
  auto start_token = [&](int64_t t, const Inputs& x, float* e) {
    if (parents != nullptr) {
      int64_t p = parents[t];
      if (p >= t || p < -1) p = -1;
      if (p != t - 1) load_state(p < 0 ? in : per_token_states + (p * hv + h) * hs);
    }
    const float decay = expf(x.g);
#pragma unroll
    for (int r = 0; r < RL; ++r) {
#pragma unroll
      for (int m = 0; m < M; ++m) s[r][m] *= decay;
      e[r] = dot(s[r], x.k);
    }
  };
  load_state(in);
  if (before != nullptr) store_state(before);
  // Per token: e = S k over the decayed state, then S += beta (v - e) k and o = S q. The warp sums of token t's o and
  // token t + 1's e run as one butterfly (t + 1's e needs only the state after t's update): one reduction's latency
  // a token instead of two. Every value is summed exactly as alone, so the outputs and states are the same bits.
  Inputs cur, next, after;
  float sums[2 * RL];  // [0, RL): token t's o; [RL, 2 RL): token t + 1's e
  if (n > 0) {
    load_inputs(0, cur);
    if (n > 1) load_inputs(1, next);
    start_token(0, cur, sums + RL);
    float e0[RL];
#pragma unroll
    for (int r = 0; r < RL; ++r) e0[r] = sums[RL + r];
    warp_sum<RL, LPR>(e0);
#pragma unroll
    for (int r = 0; r < RL; ++r) sums[RL + r] = e0[r];
  }
  for (int64_t t = 0; t < n; ++t) {
    if (t + 2 < n) load_inputs(t + 2, after);
    const float (&kr)[M] = cur.k;
    const float (&qr)[M] = cur.q;
#pragma unroll
    for (int r = 0; r < RL; ++r) {
      const float u = cur.b * (cur.v[r] - sums[RL + r]);
#pragma unroll
      for (int m = 0; m < M; ++m) s[r][m] += u * kr[m];
      sums[r] = dot(s[r], qr);
    }
    if (per_token_states != nullptr) store_state(per_token_states + (t * hv + h) * hs);
    if (t + 1 < n) {
      start_token(t + 1, next, sums + RL);
      warp_sum<2 * RL, LPR>(sums);
    } else {
      float o[RL];
#pragma unroll
      for (int r = 0; r < RL; ++r) o[r] = sums[r];
      warp_sum<RL, LPR>(o);
#pragma unroll
      for (int r = 0; r < RL; ++r) sums[r] = o[r];
    }
    if (out != nullptr) {
      float* ot = out + (t * hv + h) * dv + row0;
#pragma unroll
      for (int r = 0; r < RL; ++r)
        if (lane % LPR == r && row0 + row_of(r) < dv) ot[row_of(r)] = sums[r];
    }
    cur = next;
    next = after;
  }
  if (parents == nullptr) store_state(final);
}

template <int M, bool VEC, int LPR = 32>
__global__ void __launch_bounds__(kRecWarps * 32)
    gdn_recurrent_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                         const float* __restrict__ g, const float* __restrict__ beta, int64_t n, int hk, int hv,
                         int dk, int dv, float* state, float* __restrict__ out, float* per_token_states,
                         const int32_t* __restrict__ parents, float* state_before) {
  pdl_begin();
  const int h = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = (blockIdx.y * kRecWarps + warp) * kRecRows;
  if (row0 >= dv) return;  // whole warp; the kernel has no block barrier
  const int64_t hs = int64_t(dv) * dk;
  float* const st = state + h * hs;
  recurrent_rows<M, VEC, LPR>(q, k, v, g, beta, n, hk, hv, dk, dv, h, row0, lane, st, st, out, per_token_states,
                              parents, state_before != nullptr ? state_before + h * hs : nullptr);
}

// gated_delta_net_restore: blocks (V-head, row tile, layer). A layer's blocks copy its conv window in slices; each
// warp then restores its rows of the layer's state: re-run from `from` (with inputs) or copied from it.
template <int M, bool VEC, int LPR = 32>
__global__ void __launch_bounds__(kRecWarps * 32)
    gdn_restore_kernel(const DeltaNetRestoreLayer* __restrict__ layers, int64_t n, int hk, int hv, int dk, int dv) {
  pdl_begin();
  const DeltaNetRestoreLayer L = layers[blockIdx.z];
  const int64_t blocks = int64_t(gridDim.x) * gridDim.y, b = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
  for (int64_t i = b * blockDim.x + threadIdx.x; i < L.conv_elems; i += blocks * blockDim.x)
    L.conv[i] = L.conv_from[i];
  const int h = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = (blockIdx.y * kRecWarps + warp) * kRecRows;
  if (row0 >= dv || L.from == nullptr) return;
  const int64_t hs = int64_t(dv) * dk;
  if (L.q != nullptr) {
    recurrent_rows<M, VEC, LPR>(L.q, L.k, L.v, L.g, L.beta, n, hk, hv, dk, dv, h, row0, lane, L.from + h * hs,
                                L.state + h * hs, nullptr, nullptr, nullptr, nullptr);
    return;
  }
  for (int r = 0; r < kRecRows && row0 + r < dv; ++r) {
    const int64_t row = h * hs + int64_t(row0 + r) * dk;
    for (int c = lane; c < dk; c += 32) L.state[row + c] = L.from[row + c];
  }
}

template <int M, bool VEC, int LPR = 32>
void launch_recurrent(dim3 grid, cudaStream_t stream, const float* q, const float* k, const float* v,
                      const float* g, const float* beta, int64_t n, const DeltaNetDims& d, float* state, float* out,
                      float* pts, const int32_t* parents, float* before) {
  launch_pdl(gdn_recurrent_kernel<M, VEC, LPR>, grid, dim3(kRecWarps * 32), 0, stream, q, k, v, g, beta, n,
             int(d.n_k_heads), int(d.n_v_heads), int(d.d_k), int(d.d_v), state, out, pts, parents, before);
}

bool dims_ok(const DeltaNetDims& d) {
  return d.n_k_heads > 0 && d.n_v_heads > 0 && d.n_v_heads % d.n_k_heads == 0 && d.n_v_heads <= INT32_MAX &&
         d.d_k >= 1 && d.d_k <= kDeltaNetMaxDk && d.d_v >= 1 && d.d_v <= (1 << 20);
}

// ------------------------------------------------------------------------------------------ chunked
//
// Per segment of T tokens (whole chunks of C = 64; the last chunk of the input may be short and is then
// exactly a zero-padded one), two kernels:
//  1. gdn_chunk_prep (grid chunks x Hv, parallel): gam = chunk-local cumsum of g in double;
//     A[i,j] = beta_i e^(gam_i - gam_j) k_i.k_j (j < i); P[i,j] = (q_i.k_j) e^(gam_i - gam_j) (j <= i);
//     U = (I + A)^-1 diag(beta) V and W = (I + A)^-1 diag(beta e^gam) K through T = (I + A)^-1, built from
//     its 16 x 16 blocks. gam, U, W, P go to the workspace.
//  2. gdn_chunk_scan (grid Hv x dv tiles of 32 rows, sequential over chunks): S tile in shared memory;
//     D = U - W S^T; O_i = e^gam_i S q_i + sum_{j<=i} P[i,j] D_j; S <- e^gam_L S + sum_j e^(gam_L - gam_j) D_j k_j^T.
// Workspace per segment: gam double [Hv][T], then U float [Hv][T][dv], W [Hv][T][dk], P [Hv][T][C].
//
// The products run on the tensor cores as mma.sync m16n8k8 TF32 in the 3xTF32 form: each float operand x
// splits into hi = tf32(x) and lo = x - hi, and a b is summed as a_lo b_hi + a_hi b_lo + a_hi b_hi into float32
// accumulators. That is about float32's accuracy: a_lo b_lo (~2^-22 relative) is dropped, and the tensor cores
// read lo's top 19 bits (~2^-21 of x). The operands are tiles in shared memory whose rows are padded with zeros
// to KP (a power of two, 32 .. 256, at least dk) and whose 4-float groups are permuted within a row (Swz) so
// that each fragment load of a warp hits 32 distinct banks.
constexpr int kC = int(kDeltaNetChunk);
constexpr int kChunkThreads = 256;  // 8 warps
constexpr int kScanRows = 32;       // state rows a scan block owns

// kA: a warp's lane (g, t) = (lane / 4, lane % 4) reads row g + x, column t + y (A fragments, and B fragments
// of a tile holding B^T): column c of row r sits at c ^ 4 (r % 8). kB: the lane reads row t + y, column g + x
// (B fragments of a tile holding B, A fragments of one holding A^T): c ^ 8 (r % 4).
enum class Swz { kA, kB };
template <Swz S, int W>
__device__ __forceinline__ int swz(int r, int c) {
  if constexpr (S == Swz::kA) {
    return r * W + (c ^ ((r & 7) << 2));
  } else {
    return r * W + (c ^ ((r & 3) << 3));
  }
}

struct FragA {  // rows (g, g + 8) x columns (t, t + 4) of a 16 x 8 A tile, split
  uint32_t hi[4], lo[4];
};
struct FragB {  // rows (t, t + 4) x column g of an 8 x 8 B tile, split
  uint32_t hi[2], lo[2];
};

// hi: x rounded to TF32's 10-bit mantissa (to nearest, ties away; two integer instructions where cvt.rna.tf32.f32
// takes four: |x| near FLT_MAX or NaN would become inf, which no operand here is); lo = x - hi, exact.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void mma3(float (&d)[4], const FragA& a, const FragB& b) {
  mma_tf32(d, a.lo, b.hi);
  mma_tf32(d, a.hi, b.lo);
  mma_tf32(d, a.hi, b.hi);
}

// A = rows m0 .. m0 + 15, columns k0 .. k0 + 7 of tile T.
template <Swz S, int W>
__device__ __forceinline__ FragA frag_a(const float* T, int m0, int k0, int g, int t) {
  FragA f;
  const float x[4] = {T[swz<S, W>(m0 + g, k0 + t)], T[swz<S, W>(m0 + g + 8, k0 + t)],
                      T[swz<S, W>(m0 + g, k0 + t + 4)], T[swz<S, W>(m0 + g + 8, k0 + t + 4)]};
#pragma unroll
  for (int e = 0; e < 4; ++e) split_tf32(x[e], f.hi[e], f.lo[e]);
  return f;
}

// A = (T^T)[m0 .., k0 ..] with column k scaled by s[k]: T holds A^T (rows k).
template <Swz S, int W>
__device__ __forceinline__ FragA frag_a_t(const float* T, const float* s, int m0, int k0, int g, int t) {
  FragA f;
  const float s0 = s[k0 + t], s1 = s[k0 + t + 4];
  const float x[4] = {T[swz<S, W>(k0 + t, m0 + g)] * s0, T[swz<S, W>(k0 + t, m0 + g + 8)] * s0,
                      T[swz<S, W>(k0 + t + 4, m0 + g)] * s1, T[swz<S, W>(k0 + t + 4, m0 + g + 8)] * s1};
#pragma unroll
  for (int e = 0; e < 4; ++e) split_tf32(x[e], f.hi[e], f.lo[e]);
  return f;
}

// B = rows k0 .. k0 + 7, columns n0 .. n0 + 7 of B, where T holds B (rows k) ...
template <Swz S, int W>
__device__ __forceinline__ FragB frag_b(const float* T, int k0, int n0, int g, int t) {
  FragB f;
  split_tf32(T[swz<S, W>(k0 + t, n0 + g)], f.hi[0], f.lo[0]);
  split_tf32(T[swz<S, W>(k0 + t + 4, n0 + g)], f.hi[1], f.lo[1]);
  return f;
}

// ... or B^T (rows n).
template <Swz S, int W>
__device__ __forceinline__ FragB frag_b_t(const float* T, int k0, int n0, int g, int t) {
  FragB f;
  split_tf32(T[swz<S, W>(n0 + g, k0 + t)], f.hi[0], f.lo[0]);
  split_tf32(T[swz<S, W>(n0 + g, k0 + t + 4)], f.hi[1], f.lo[1]);
  return f;
}

// x1 += A1 B and x2 += A2 B over k < kd (kd a multiple of 8, at most KP) for the 16 rows at m0 and NT 8-column
// tiles at n0, the tiles holding A1 and A2 (kA, widths W1, W2) and B^T (kA, width WB): the prep's K K^T and Q K^T,
// the scan's W S^T and Q S^T (one B fragment for both products).
template <int NT, int KP, int W1, int W2, int WB>
__device__ __forceinline__ void dual_products(float (&x1)[NT][4], float (&x2)[NT][4], const float* A1, const float* A2,
                                              const float* Bt, int m0, int n0, int kd, int g, int t) {
#pragma unroll
  for (int k0 = 0; k0 < KP; k0 += 8) {
    if (k0 >= kd) break;
    const FragA a1 = frag_a<Swz::kA, W1>(A1, m0, k0, g, t), a2 = frag_a<Swz::kA, W2>(A2, m0, k0, g, t);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const FragB b = frag_b_t<Swz::kA, WB>(Bt, k0, n0 + 8 * nt, g, t);
      mma3(x1[nt], a1, b);
      mma3(x2[nt], a2, b);
    }
  }
}

// Element e of a thread's C fragment of the 16 x 8 tile at (m0, n0): row m0 + g (+ 8 for e >= 2), column
// n0 + 2 t (+ 1 for odd e).
__device__ __forceinline__ int frag_row(int m0, int g, int e) { return m0 + g + ((e >> 1) << 3); }
__device__ __forceinline__ int frag_col(int n0, int t, int e) { return n0 + 2 * t + (e & 1); }

// Tile [R][W] (swizzled S) <- rows r < valid of src (row r at src + r * stride, its first `cols` floats), zeros
// elsewhere. vec (cols and stride multiples of 4, src 16-byte aligned): cp.async copies in the thread's current
// commit group; otherwise plain loads and stores. Either way the tile is complete for every thread after the
// copies are waited for and a block barrier follows.
template <Swz S, int W, int R>
__device__ __forceinline__ void stage_tile(float* T, const float* src, int64_t stride, int valid, int cols, bool vec,
                                           int tid) {
  for (int idx = tid; idx < R * (W / 4); idx += kChunkThreads) {
    const int r = idx / (W / 4), c = (idx % (W / 4)) * 4;
    const bool in = r < valid && c < cols;
    const float* p = src + (in ? r * stride + c : 0);
    float* d = T + swz<S, W>(r, c);
    if (vec) {
      cp_async16_zfill(d, p, in);
    } else {
      float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (in) {
        x.x = p[0];
        if (c + 1 < cols) x.y = p[1];
        if (c + 2 < cols) x.z = p[2];
        if (c + 3 < cols) x.w = p[3];
      }
      *reinterpret_cast<float4*>(d) = x;
    }
  }
}

// The power of two (32 .. 256) a chunk tile's rows are padded to.
constexpr int padded_width(int64_t dk) { return dk <= 32 ? 32 : dk <= 64 ? 64 : dk <= 128 ? 128 : 256; }

constexpr int kVSlab = 128;  // V columns the prep kernel stages at a time

template <int KP>
constexpr int prep_qv_width() {  // the prep tile that holds Q, then V slabs
  return KP > kVSlab ? KP : kVSlab;
}

template <int KP>
size_t prep_smem_bytes() {
  // gam; beta, beta e^gam; K; Q / V slabs; A, T; the three warps' sum_m A_sm T_mc
  return sizeof(double) * kC +
         sizeof(float) * (2 * kC + kC * KP + kC * prep_qv_width<KP>() + 2 * kC * kC + 3 * 16 * 32);
}

template <int KP>
size_t scan_smem_bytes() {
  return sizeof(float) * (2 * kC + kScanRows * KP + 2 * kC * KP + kC * kC + kC * kScanRows);
}

// Up to 128 registers where two blocks fit an SM's shared memory.
template <int KP>
constexpr int chunk_min_blocks() {
  return KP <= 128 ? 2 : 1;
}

// The prep kernel's solve: (I + A) X = R, A strictly lower (64 x 64). T = (I + A)^-1 is built from its 16 x 16
// blocks: the diagonal ones by substitution (a thread a column, 16 steps), then T_sc = -T_ss sum_{c<=m<s} A_sm T_mc
// for s = 1, 2, 3 (a warp a block); X = T R on the tensor cores.
template <int KP>
__global__ void __launch_bounds__(kChunkThreads, chunk_min_blocks<KP>())
    gdn_chunk_prep_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                          const float* __restrict__ g, const float* __restrict__ beta, int64_t t0, int64_t n, int hk,
                          int hv, int dk, int dv, int64_t seg_tokens, bool vec, bool vec_v,
                          double* __restrict__ ws_gam, float* __restrict__ ws_u, float* __restrict__ ws_w,
                          float* __restrict__ ws_p) {
  pdl_begin();
  constexpr int QW = prep_qv_width<KP>();
  const int c = blockIdx.x, h = blockIdx.y, kh = h % hk, tid = threadIdx.x;
  const int warp = tid >> 5, gq = (tid & 31) >> 2, tq = tid & 3;
  const int64_t c0 = t0 + int64_t(c) * kC;
  const int L = int(n - c0 < kC ? n - c0 : kC);

  extern __shared__ double smem_d[];
  double* gam = smem_d;                            // [C]
  float* bs = reinterpret_cast<float*>(gam + kC);  // [C] beta (0 past L)
  float* bg = bs + kC;                             // [C] beta e^gam
  float* Ks = bg + kC;                             // [C][KP] kA
  float* Qs = Ks + kC * KP;                        // [C][QW] kA: Q, then slabs of V (kB)
  float* As = Qs + kC * QW;                        // [C][C] kA: A (its first C floats hold g until the cumsum)
  float* Ts = As + kC * kC;                        // [C][C] kA: (I + A)^-1
  float* Ys = Ts + kC * kC;                        // [3][16][32] kB: a warp's sum_m A_sm T_mc

  const int64_t in_stride = int64_t(hk) * dk;
  stage_tile<Swz::kA, KP, kC>(Ks, k + (c0 * hk + kh) * dk, in_stride, L, dk, vec, tid);
  stage_tile<Swz::kA, QW, kC>(Qs, q + (c0 * hk + kh) * dk, in_stride, L, dk, vec, tid);
  cp_async_commit();
  if (tid < kC) {
    As[tid] = tid < L ? g[(c0 + tid) * hv + h] : 0.0f;
    bs[tid] = tid < L ? beta[(c0 + tid) * hv + h] : 0.0f;
  }
  cp_async_wait<0>();
  __syncthreads();
  if (tid == 0) {
    double cum = 0.0;
    for (int i = 0; i < kC; ++i) {
      cum += double(As[i]);
      gam[i] = cum;
    }
  }

  // K K^T and Q K^T: warp w takes rows 16 (w % 4) .. and columns 32 (w / 4) .. (tiles wholly above the
  // diagonal stay zero). A (shared) and P (workspace) are masked before exponentiating, so exponents are never
  // positive.
  const int m0 = 16 * (warp & 3), nb = 32 * (warp >> 2);
  float kk[4][4] = {}, qk[4][4] = {};
  if (nb <= m0 + 15) dual_products<4, KP, KP, QW, KP>(kk, qk, Ks, Qs, Ks, m0, nb, (dk + 7) & ~7, gq, tq);
  __syncthreads();  // gam; Q is read
  // The first slab of V into Q's tile, while A and T are built.
  const int64_t v_stride = int64_t(hv) * dv;
  const float* v0 = v + (c0 * hv + h) * dv;
  stage_tile<Swz::kB, QW, kC>(Qs, v0, v_stride, L, dv < kVSlab ? dv : kVSlab, vec_v, tid);
  cp_async_commit();
  const int64_t row_base = int64_t(h) * seg_tokens + int64_t(c) * kC;  // row of [Hv][T]
  if (tid < kC) {
    bg[tid] = bs[tid] * static_cast<float>(exp(gam[tid]));
    ws_gam[row_base + tid] = gam[tid];
  }
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = frag_row(m0, gq, e), j = frag_col(nb + 8 * nt, tq, e);
      float a = 0.0f, p = 0.0f;
      if (j <= i && i < L) {
        const float ex = static_cast<float>(exp(gam[i] - gam[j]));
        if (j < i) a = bs[i] * ex * kk[nt][e];
        p = qk[nt][e] * ex;
      }
      As[swz<Swz::kA, kC>(i, j)] = a;
      ws_p[(row_base + i) * kC + j] = p;
    }
  }
  __syncthreads();

  // T's diagonal blocks: thread (b, j) solves (I + A_bb) x = e_j (x_i = 0 for i < j falls out).
  if (tid < kC) {
    const int b0 = tid & ~15, j = tid & 15;
    float x[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      float r = i == j ? 1.0f : 0.0f;
#pragma unroll
      for (int m = 0; m < i; ++m) r -= As[swz<Swz::kA, kC>(b0 + i, b0 + m)] * x[m];
      x[i] = r;
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) Ts[swz<Swz::kA, kC>(b0 + i, b0 + j)] = x[i];
  } else {
    for (int idx = tid - kC; idx < kC * kC; idx += kChunkThreads - kC) {  // the blocks off the diagonal: zero
      const int i = idx / kC, j = idx % kC;
      if ((i >> 4) != (j >> 4)) Ts[swz<Swz::kA, kC>(i, j)] = 0.0f;
    }
  }
  __syncthreads();
  for (int sb = 1; sb < 4; ++sb) {
    if (warp < sb) {
      const int cb = warp, s0 = 16 * sb;
      float y[2][4] = {};
      for (int k0 = 16 * cb; k0 < s0; k0 += 8) {
        const FragA aa = frag_a<Swz::kA, kC>(As, s0, k0, gq, tq);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) mma3(y[nt], aa, frag_b<Swz::kA, kC>(Ts, k0, 16 * cb + 8 * nt, gq, tq));
      }
      float* Y = Ys + warp * 16 * 32;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) Y[swz<Swz::kB, 32>(frag_row(0, gq, e), frag_col(8 * nt, tq, e))] = y[nt][e];
      }
      __syncwarp();
      float t[2][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < 16; k0 += 8) {
        const FragA ta = frag_a<Swz::kA, kC>(Ts, s0, s0 + k0, gq, tq);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) mma3(t[nt], ta, frag_b<Swz::kB, 32>(Y, k0, 8 * nt, gq, tq));
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          Ts[swz<Swz::kA, kC>(frag_row(s0, gq, e), frag_col(16 * cb + 8 * nt, tq, e))] = -t[nt][e];
      }
    }
    __syncthreads();
  }

  // X = T diag(r) B for B = V (slabs of kVSlab columns, r = beta) and B = K (r = beta e^gam), column tile pairs
  // round-robin over the warps; T is lower, so row tile mi needs k < 16 (mi + 1). Every row is stored (rows past
  // L are zero).
  auto solve = [&](const float* B, auto swz_b, const float* r, int cols, float* dst, int64_t ld, int col0) {
    for (int np = warp; 16 * np < cols; np += kChunkThreads / 32) {
      float acc[4][2][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < kC; k0 += 8) {
        FragB bf[2];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int col = 16 * np + 8 * nt + gq;
          split_tf32(B[swz_b(k0 + tq, col)] * r[k0 + tq], bf[nt].hi[0], bf[nt].lo[0]);
          split_tf32(B[swz_b(k0 + tq + 4, col)] * r[k0 + tq + 4], bf[nt].hi[1], bf[nt].lo[1]);
        }
#pragma unroll
        for (int mi = k0 / 16; mi < 4; ++mi) {
          const FragA ta = frag_a<Swz::kA, kC>(Ts, 16 * mi, k0, gq, tq);
          mma3(acc[mi][0], ta, bf[0]);
          mma3(acc[mi][1], ta, bf[1]);
        }
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = frag_row(16 * mi, gq, e), col = frag_col(16 * np + 8 * nt, tq, e);
            if (col < cols) dst[(row_base + i) * ld + col0 + col] = acc[mi][nt][e];
          }
        }
      }
    }
  };
  const auto swz_v = [](int r, int col) { return swz<Swz::kB, QW>(r, col); };
  const auto swz_k = [](int r, int col) { return swz<Swz::kA, KP>(r, col); };
  for (int s0 = 0; s0 < dv; s0 += kVSlab) {
    const int cols = dv - s0 < kVSlab ? dv - s0 : kVSlab;
    if (s0 > 0) {
      __syncthreads();  // the previous slab is read
      stage_tile<Swz::kB, QW, kC>(Qs, v0 + s0, v_stride, L, cols, vec_v, tid);
      cp_async_commit();
    }
    cp_async_wait<0>();
    __syncthreads();
    solve(Qs, swz_v, bs, cols, ws_u, dv, s0);
  }
  solve(Ks, swz_k, bg, dk, ws_w, dk, 0);
}

template <int KP>
__global__ void __launch_bounds__(kChunkThreads, chunk_min_blocks<KP>())
    gdn_chunk_scan_kernel(const float* __restrict__ q, const float* __restrict__ k, int64_t t0, int64_t n, int hk,
                          int hv, int dk, int dv, int64_t seg_tokens, bool vec, const double* __restrict__ ws_gam,
                          const float* __restrict__ ws_u, const float* __restrict__ ws_w,
                          const float* __restrict__ ws_p, float* __restrict__ state, float* __restrict__ out) {
  pdl_begin();
  const int h = blockIdx.x, a0 = blockIdx.y * kScanRows, kh = h % hk, tid = threadIdx.x;
  const int warp = tid >> 5, gq = (tid & 31) >> 2, tq = tid & 3;
  const int rows = dv - a0 < kScanRows ? dv - a0 : kScanRows;
  const int kd = (dk + 7) & ~7;

  extern __shared__ float smem_f[];
  float* gexp = smem_f;             // [C] e^gam_i
  float* dec = gexp + kC;           // [C] e^(gam_L - gam_j), 0 past L
  float* Ss = dec + kC;             // [32][KP] kA: state rows a0 .. a0 + rows
  float* Xs = Ss + kScanRows * KP;  // [C][KP] the chunk's W (kA), then its K (kB)
  float* Qs = Xs + kC * KP;         // [C][KP] kA
  float* Ps = Qs + kC * KP;         // [C][C] kA
  float* Ds = Ps + kC * kC;         // [C][32] kB

  // Copies in flight (cp.async commit groups when vec): the chunk's W, Q and P are staged before its step
  // begins (W after the previous step's last barrier, Q and P while that step was still running); its K while
  // its outputs are computed.
  const int64_t in_stride = int64_t(hk) * dk;
  const int64_t seg_end = (n - t0 < seg_tokens) ? n : t0 + seg_tokens;
  const int n_chunks = int((seg_end - t0 + kC - 1) / kC);
  auto chunk_len = [&](int c) { return int(n - (t0 + int64_t(c) * kC) < kC ? n - (t0 + int64_t(c) * kC) : kC); };
  auto rows_of = [&](int c) { return int64_t(h) * seg_tokens + int64_t(c) * kC; };  // row of [Hv][T]
  auto q_of = [&](int c) { return q + ((t0 + int64_t(c) * kC) * hk + kh) * dk; };

  float* st = state + (int64_t(h) * dv + a0) * dk;
  stage_tile<Swz::kA, KP, kScanRows>(Ss, st, dk, rows, dk, vec, tid);
  stage_tile<Swz::kA, KP, kC>(Xs, ws_w + rows_of(0) * dk, dk, chunk_len(0), dk, vec, tid);
  stage_tile<Swz::kA, KP, kC>(Qs, q_of(0), in_stride, chunk_len(0), dk, vec, tid);
  stage_tile<Swz::kA, kC, kC>(Ps, ws_p + rows_of(0) * kC, kC, chunk_len(0), kC, vec, tid);
  cp_async_commit();

  for (int c = 0; c < n_chunks; ++c) {
    const int64_t c0 = t0 + int64_t(c) * kC;
    const int L = chunk_len(c);
    const int64_t row_base = rows_of(c);
    const bool more = c + 1 < n_chunks;
    if (tid < kC) {
      const double gi = ws_gam[row_base + tid], gl = ws_gam[row_base + L - 1];
      gexp[tid] = static_cast<float>(exp(gi));
      dec[tid] = tid < L ? static_cast<float>(exp(gl - gi)) : 0.0f;
    }
    cp_async_wait<0>();
    __syncthreads();

    // W S^T and Q S^T: warp w takes tokens 16 (w % 4) .. and state rows 16 (w / 4) .. (two tiles of 8).
    const int m0 = 16 * (warp & 3), n0 = 16 * (warp >> 2);
    float wst[2][4] = {}, qst[2][4] = {};
    dual_products<2, KP, KP, KP, KP>(wst, qst, Xs, Qs, Ss, m0, n0, kd, gq, tq);
    // D = U - W S^T (zero past L and past the tile's rows)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = frag_row(m0, gq, e), a = frag_col(n0 + 8 * nt, tq, e);
        const bool in = i < L && a < rows;
        Ds[swz<Swz::kB, kScanRows>(i, a)] = in ? ws_u[(row_base + i) * dv + a0 + a] - wst[nt][e] : 0.0f;
      }
    }
    __syncthreads();

    // The chunk's K replaces its W, the next chunk's Q this one's; O_i = e^gam_i S q_i + sum_{j<=i} P[i,j] D_j
    // (P is zero past the diagonal).
    stage_tile<Swz::kB, KP, kC>(Xs, k + (c0 * hk + kh) * dk, in_stride, L, dk, vec, tid);
    cp_async_commit();
    if (more) stage_tile<Swz::kA, KP, kC>(Qs, q_of(c + 1), in_stride, chunk_len(c + 1), dk, vec, tid);
    cp_async_commit();
    float o[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[nt][e] = gexp[frag_row(m0, gq, e)] * qst[nt][e];
    }
#pragma unroll
    for (int j0 = 0; j0 < kC; j0 += 8) {
      if (j0 >= m0 + 16) break;
      const FragA pa = frag_a<Swz::kA, kC>(Ps, m0, j0, gq, tq);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) mma3(o[nt], pa, frag_b<Swz::kB, kScanRows>(Ds, j0, n0 + 8 * nt, gq, tq));
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = frag_row(m0, gq, e), a = frag_col(n0 + 8 * nt, tq, e);
        if (i < L && a < rows) out[((c0 + i) * hv + h) * dv + a0 + a] = o[nt][e];
      }
    }
    cp_async_wait<1>();  // K
    __syncthreads();
    if (more) stage_tile<Swz::kA, kC, kC>(Ps, ws_p + rows_of(c + 1) * kC, kC, chunk_len(c + 1), kC, vec, tid);
    cp_async_commit();

    // S <- e^gam_L S + (diag(dec) D)^T K: warp w takes state rows 16 (w % 2) .. and columns KP / 4 (w / 2) ..
    {
      constexpr int NT = KP / 32;
      const int sm0 = 16 * (warp & 1), sn0 = (KP / 4) * (warp >> 1);
      const float gl = gexp[L - 1];
      float acc[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          acc[nt][e] = Ss[swz<Swz::kA, KP>(frag_row(sm0, gq, e), frag_col(sn0 + 8 * nt, tq, e))] * gl;
      }
#pragma unroll
      for (int j0 = 0; j0 < kC; j0 += 8) {
        if (j0 >= L) break;
        const FragA da = frag_a_t<Swz::kB, kScanRows>(Ds, dec, sm0, j0, gq, tq);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma3(acc[nt], da, frag_b<Swz::kB, KP>(Xs, j0, sn0 + 8 * nt, gq, tq));
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          Ss[swz<Swz::kA, KP>(frag_row(sm0, gq, e), frag_col(sn0 + 8 * nt, tq, e))] = acc[nt][e];
      }
    }
    __syncthreads();
    if (more) stage_tile<Swz::kA, KP, kC>(Xs, ws_w + rows_of(c + 1) * dk, dk, chunk_len(c + 1), dk, vec, tid);
    cp_async_commit();
  }
  for (int idx = tid; idx < rows * dk; idx += kChunkThreads) {
    const int a = idx / dk, b = idx - a * dk;
    st[int64_t(a) * dk + b] = Ss[swz<Swz::kA, KP>(a, b)];
  }
}

template <int KP>
cudaError_t launch_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                           int64_t n, const DeltaNetDims& d, int64_t seg, bool vec, double* ws_gam, float* ws_u,
                           float* ws_w, float* ws_p, float* state, float* out, cudaStream_t stream) {
  const int dk = int(d.d_k), dv = int(d.d_v), hk = int(d.n_k_heads), hv = int(d.n_v_heads);
  const bool vec_v = dv % 4 == 0 && is_aligned(v, 16);
  const size_t prep_smem = prep_smem_bytes<KP>(), scan_smem = scan_smem_bytes<KP>();
  cudaError_t err = cudaFuncSetAttribute(gdn_chunk_prep_kernel<KP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(prep_smem));
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(gdn_chunk_scan_kernel<KP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(scan_smem));
  if (err != cudaSuccess) return err;
  for (int64_t t0 = 0; t0 < n; t0 += seg) {
    const int64_t len = n - t0 < seg ? n - t0 : seg;
    const dim3 prep_grid(unsigned((len + kC - 1) / kC), unsigned(hv));
    launch_pdl(gdn_chunk_prep_kernel<KP>, prep_grid, dim3(kChunkThreads), prep_smem, stream, q, k, v, g, beta, t0,
               n, hk, hv, dk, dv, seg, vec, vec_v, ws_gam, ws_u, ws_w, ws_p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    const dim3 scan_grid(unsigned(hv), unsigned((dv + kScanRows - 1) / kScanRows));
    launch_pdl(gdn_chunk_scan_kernel<KP>, scan_grid, dim3(kChunkThreads), scan_smem, stream, q, k, t0, n, hk, hv,
               dk, dv, seg, vec, ws_gam, ws_u, ws_w, ws_p, state, out);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  return cudaSuccess;
}

size_t chunk_row_bytes(const DeltaNetDims& d) {
  return sizeof(double) + sizeof(float) * size_t(d.d_v + d.d_k + kC);
}

}  // namespace

cudaError_t gated_delta_net_recurrent(const float* q, const float* k, const float* v, const float* g,
                                      const float* beta, int64_t n, const DeltaNetDims& d, float* state,
                                      float* out, float* per_token_states, const int32_t* parents,
                                      float* state_before, cudaStream_t stream) {
  if (!dims_ok(d) || n < 0 || (parents != nullptr && per_token_states == nullptr)) return cudaErrorInvalidValue;
  if (state == nullptr) return cudaErrorInvalidValue;
  if (n == 0) {  // no token to run: state_before is a copy of the state
    if (state_before == nullptr) return cudaSuccess;
    const size_t bytes = sizeof(float) * size_t(d.n_v_heads) * size_t(d.d_v) * size_t(d.d_k);
    return cudaMemcpyAsync(state_before, state, bytes, cudaMemcpyDeviceToDevice, stream);
  }
  if (!q || !k || !v || !g || !beta || !out) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(d.n_v_heads), unsigned((d.d_v + kRecTileRows - 1) / kRecTileRows));
  const bool vec = d.d_k % 128 == 0 && is_aligned(q, 16) && is_aligned(k, 16) && is_aligned(state, 16) &&
                   (per_token_states == nullptr || is_aligned(per_token_states, 16)) &&
                   (state_before == nullptr || is_aligned(state_before, 16));
  auto launch = [&](auto kernel_m, auto kernel_vec) {
    launch_recurrent<decltype(kernel_m)::value, decltype(kernel_vec)::value>(
        grid, stream, q, k, v, g, beta, n, d, state, out, per_token_states, parents, state_before);
  };
  using std::integral_constant;
  using std::true_type, std::false_type;
  if (vec) {
    if (d.d_k == 128)
      launch_recurrent<16, true, 8>(grid, stream, q, k, v, g, beta, n, d, state, out, per_token_states, parents,
                                    state_before);
    else
      launch(integral_constant<int, 8>{}, true_type{});
  } else if (d.d_k <= 32) {
    launch(integral_constant<int, 1>{}, false_type{});
  } else if (d.d_k <= 64) {
    launch(integral_constant<int, 2>{}, false_type{});
  } else if (d.d_k <= 128) {
    launch(integral_constant<int, 4>{}, false_type{});
  } else {
    launch(integral_constant<int, 8>{}, false_type{});
  }
  return cudaGetLastError();
}

bool gated_delta_net_restore_vec(const DeltaNetRestoreLayer* layers, int n_layers, const DeltaNetDims& d) {
  if (d.d_k % 128 != 0) return false;
  for (int i = 0; i < n_layers; ++i)
    if (!is_aligned(layers[i].state, 16) || !is_aligned(layers[i].from, 16) || !is_aligned(layers[i].q, 16) ||
        !is_aligned(layers[i].k, 16))
      return false;
  return true;
}

cudaError_t gated_delta_net_restore(const DeltaNetRestoreLayer* layers_dev, int n_layers, bool vec, int64_t n,
                                    const DeltaNetDims& d, cudaStream_t stream) {
  if (!dims_ok(d) || n < 0 || n_layers < 0 || n_layers > 65535 || (n_layers > 0 && layers_dev == nullptr))
    return cudaErrorInvalidValue;
  if (n_layers == 0) return cudaSuccess;
  if (vec && d.d_k % 128 != 0) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(d.n_v_heads), unsigned((d.d_v + kRecTileRows - 1) / kRecTileRows), unsigned(n_layers));
  const dim3 block(kRecWarps * 32);
  const int hk = int(d.n_k_heads), hv = int(d.n_v_heads), dk = int(d.d_k), dv = int(d.d_v);
  // The template of gated_delta_net_recurrent for these dims, so that a re-run token sums as the step did.
  if (vec) {
    if (dk == 128)
      launch_pdl(gdn_restore_kernel<16, true, 8>, grid, block, 0, stream, layers_dev, n, hk, hv, dk, dv);
    else
      launch_pdl(gdn_restore_kernel<8, true>, grid, block, 0, stream, layers_dev, n, hk, hv, dk, dv);
  } else if (dk <= 32) {
    launch_pdl(gdn_restore_kernel<1, false>, grid, block, 0, stream, layers_dev, n, hk, hv, dk, dv);
  } else if (dk <= 64) {
    launch_pdl(gdn_restore_kernel<2, false>, grid, block, 0, stream, layers_dev, n, hk, hv, dk, dv);
  } else if (dk <= 128) {
    launch_pdl(gdn_restore_kernel<4, false>, grid, block, 0, stream, layers_dev, n, hk, hv, dk, dv);
  } else {
    launch_pdl(gdn_restore_kernel<8, false>, grid, block, 0, stream, layers_dev, n, hk, hv, dk, dv);
  }
  return cudaGetLastError();
}

size_t gated_delta_net_chunked_workspace_bytes(int64_t tokens, const DeltaNetDims& d) {
  if (tokens < 0 || d.n_v_heads <= 0 || d.d_k < 0 || d.d_v < 0) return 0;
  const size_t t = size_t((tokens + kC - 1) / kC) * kC;
  return size_t(d.n_v_heads) * t * chunk_row_bytes(d);
}

cudaError_t gated_delta_net_chunked(const float* q, const float* k, const float* v, const float* g,
                                    const float* beta, int64_t n, const DeltaNetDims& d, float* state,
                                    float* out, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (!dims_ok(d) || n < 0 || state == nullptr) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (!q || !k || !v || !g || !beta || !out || !workspace || (reinterpret_cast<uintptr_t>(workspace) & 7u))
    return cudaErrorInvalidValue;
  const size_t per_token = size_t(d.n_v_heads) * chunk_row_bytes(d);
  int64_t seg = int64_t(workspace_bytes / per_token) / kC * kC;
  if (seg < kC) return cudaErrorInvalidValue;
  const int64_t n_round = (n + kC - 1) / kC * kC;
  if (seg > n_round) seg = n_round;

  const int hv = int(d.n_v_heads);
  double* ws_gam = static_cast<double*>(workspace);
  float* ws_u = reinterpret_cast<float*>(ws_gam + size_t(hv) * seg);
  float* ws_w = ws_u + size_t(hv) * seg * d.d_v;
  float* ws_p = ws_w + size_t(hv) * seg * d.d_k;
  // float4 tile loads: rows of whole 16-byte groups, every base 16-byte aligned (the workspace's sections are:
  // seg is a multiple of 64).
  const bool vec = d.d_k % 4 == 0 && is_aligned(q, 16) && is_aligned(k, 16) && is_aligned(state, 16) &&
                   is_aligned(workspace, 16);
  switch (padded_width(d.d_k)) {
    case 32:
      return launch_chunked<32>(q, k, v, g, beta, n, d, seg, vec, ws_gam, ws_u, ws_w, ws_p, state, out, stream);
    case 64:
      return launch_chunked<64>(q, k, v, g, beta, n, d, seg, vec, ws_gam, ws_u, ws_w, ws_p, state, out, stream);
    case 128:
      return launch_chunked<128>(q, k, v, g, beta, n, d, seg, vec, ws_gam, ws_u, ws_w, ws_p, state, out, stream);
    default:
      return launch_chunked<256>(q, k, v, g, beta, n, d, seg, vec, ws_gam, ws_u, ws_w, ws_p, state, out, stream);
  }
}

}  // namespace dflash::cuda

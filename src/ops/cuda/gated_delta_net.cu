// Gated DeltaNet kernels (gated_delta_net.h): recurrent (decode / chain and tree verify) and chunked WY
// (prefill). Float32; the chunked form's cumulative log decay and its exponentials in double, as on the
// CPU (cpu::gated_delta_net_chunked explains why).
#include "ops/cuda/gated_delta_net.h"

#include <cstdint>

#include "base/checked_math.h"
#include "ops/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

// ------------------------------------------------------------------------------------------ recurrent
//
// One block per (V-head, tile of kRecWarps * kRecRows state rows). A warp owns kRecRows rows of S[h]
// (dv x dk); lane l holds M elements of each row in registers. VEC (dk a multiple of 128, 16-byte aligned
// buffers): lane l holds columns 128 m4 + 4 l + {0..3}, loaded and stored as float4 (a warp moves 512
// contiguous bytes per access). Otherwise columns l + 32 m (4-byte coalesced). The state is read once,
// kept in registers across the tokens, and written once (plus once per token into per_token_states).
// Rows are independent, so a row's dot products are warp reductions and no block barrier is needed.
constexpr int kRecWarps = 4;
constexpr int kRecRows = 4;
constexpr int kRecTileRows = kRecWarps * kRecRows;

template <int M, bool VEC>
__device__ __forceinline__ void load_row(const float* p, int lane, int dk, float (&x)[M]) {
  if constexpr (VEC) {
#pragma unroll
    for (int m4 = 0; m4 < M / 4; ++m4) {
      const float4 t = *reinterpret_cast<const float4*>(p + m4 * 128 + lane * 4);
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

template <int M, bool VEC>
__device__ __forceinline__ void store_row(float* p, int lane, int dk, const float (&x)[M]) {
  if constexpr (VEC) {
#pragma unroll
    for (int m4 = 0; m4 < M / 4; ++m4)
      *reinterpret_cast<float4*>(p + m4 * 128 + lane * 4) =
          make_float4(x[m4 * 4 + 0], x[m4 * 4 + 1], x[m4 * 4 + 2], x[m4 * 4 + 3]);
  } else {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int c = lane + 32 * m;
      if (c < dk) p[c] = x[m];
    }
  }
}

template <int R>
__device__ __forceinline__ void warp_sum(float (&x)[R]) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
#pragma unroll
    for (int r = 0; r < R; ++r) x[r] += __shfl_xor_sync(0xffffffffu, x[r], off);
}

// The recurrence over n tokens for a warp's kRecRows rows of V-head h's state (row0 < dv): from `in` (the head's
// incoming state), into `final` (the head's; not written with parents) and, per token, out and
// per_token_states (each optional).
template <int M, bool VEC>
__device__ __forceinline__ void recurrent_rows(const float* __restrict__ q, const float* __restrict__ k,
                                               const float* __restrict__ v, const float* __restrict__ g,
                                               const float* __restrict__ beta, int64_t n, int hk, int hv, int dk,
                                               int dv, int h, int row0, int lane, const float* in, float* final,
                                               float* __restrict__ out, float* per_token_states,
                                               const int32_t* __restrict__ parents) {
  const int kh = h % hk;
  const int64_t hs = int64_t(dv) * dk;

  float s[kRecRows][M];
  auto load_state = [&](const float* base) {
#pragma unroll
    for (int r = 0; r < kRecRows; ++r) {
      if (row0 + r < dv) {
        load_row<M, VEC>(base + int64_t(row0 + r) * dk, lane, dk, s[r]);
      } else {
#pragma unroll
        for (int m = 0; m < M; ++m) s[r][m] = 0.0f;
      }
    }
  };
  auto store_state = [&](float* base) {
#pragma unroll
    for (int r = 0; r < kRecRows; ++r)
      if (row0 + r < dv) store_row<M, VEC>(base + int64_t(row0 + r) * dk, lane, dk, s[r]);
  };

  // A token's inputs: k and q rows of its K-head, its log decay and beta, the warp's rows of v. Token t + 1's are
  // loaded while token t is computed (the loop is a chain of tokens, each otherwise waiting on its loads).
  struct Inputs {
    float k[M], q[M], v[kRecRows], g, b;
  };
  auto load_inputs = [&](int64_t t, Inputs& x) {
    load_row<M, VEC>(k + (t * hk + kh) * dk, lane, dk, x.k);
    load_row<M, VEC>(q + (t * hk + kh) * dk, lane, dk, x.q);
    x.g = g[t * hv + h];
    x.b = beta[t * hv + h];
    const float* vt = v + (t * hv + h) * dv + row0;
#pragma unroll
    for (int r = 0; r < kRecRows; ++r) x.v[r] = row0 + r < dv ? vt[r] : 0.0f;
  };
  Inputs cur, next;
  if (n > 0) load_inputs(0, cur);
  load_state(in);
  for (int64_t t = 0; t < n; ++t) {
    if (parents != nullptr) {
      int64_t p = parents[t];
      if (p >= t || p < -1) p = -1;
      // The registers hold the state after token t - 1 (or the incoming state at t = 0). Each thread
      // reads back only elements it wrote itself, so no barrier or fence is needed.
      if (p != t - 1) load_state(p < 0 ? in : per_token_states + (p * hv + h) * hs);
    }
    if (t + 1 < n) load_inputs(t + 1, next);
    const float (&kr)[M] = cur.k;
    const float (&qr)[M] = cur.q;
    const float decay = expf(cur.g);
    const float b = cur.b;

    float e[kRecRows];
#pragma unroll
    for (int r = 0; r < kRecRows; ++r) {
      float acc = 0.0f;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        s[r][m] *= decay;
        acc += s[r][m] * kr[m];
      }
      e[r] = acc;
    }
    warp_sum(e);
    float o[kRecRows];
#pragma unroll
    for (int r = 0; r < kRecRows; ++r) {
      const float u = b * (cur.v[r] - e[r]);
      float acc = 0.0f;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        s[r][m] += u * kr[m];
        acc += s[r][m] * qr[m];
      }
      o[r] = acc;
    }
    warp_sum(o);
    if (out != nullptr) {
      float* ot = out + (t * hv + h) * dv + row0;
#pragma unroll
      for (int r = 0; r < kRecRows; ++r)
        if (lane == r && row0 + r < dv) ot[r] = o[r];
    }
    if (per_token_states != nullptr) store_state(per_token_states + (t * hv + h) * hs);
    cur = next;
  }
  if (parents == nullptr) store_state(final);
}

template <int M, bool VEC>
__global__ void __launch_bounds__(kRecWarps * 32)
    gdn_recurrent_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                         const float* __restrict__ g, const float* __restrict__ beta, int64_t n, int hk, int hv,
                         int dk, int dv, float* state, float* __restrict__ out, float* per_token_states,
                         const int32_t* __restrict__ parents) {
  pdl_begin();
  const int h = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = (blockIdx.y * kRecWarps + warp) * kRecRows;
  if (row0 >= dv) return;  // whole warp; the kernel has no block barrier
  float* const st = state + h * int64_t(dv) * dk;
  recurrent_rows<M, VEC>(q, k, v, g, beta, n, hk, hv, dk, dv, h, row0, lane, st, st, out, per_token_states, parents);
}

// gated_delta_net_restore: blocks (V-head, row tile, layer). A layer's blocks copy its conv window in slices; each
// warp then restores its rows of the layer's state: re-run from `from` (with inputs) or copied from it.
template <int M, bool VEC>
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
    recurrent_rows<M, VEC>(L.q, L.k, L.v, L.g, L.beta, n, hk, hv, dk, dv, h, row0, lane, L.from + h * hs,
                           L.state + h * hs, nullptr, nullptr, nullptr);
    return;
  }
  for (int r = 0; r < kRecRows && row0 + r < dv; ++r) {
    const int64_t row = h * hs + int64_t(row0 + r) * dk;
    for (int c = lane; c < dk; c += 32) L.state[row + c] = L.from[row + c];
  }
}

template <int M, bool VEC>
void launch_recurrent(dim3 grid, cudaStream_t stream, const float* q, const float* k, const float* v,
                      const float* g, const float* beta, int64_t n, const DeltaNetDims& d, float* state, float* out,
                      float* pts, const int32_t* parents) {
  launch_pdl(gdn_recurrent_kernel<M, VEC>, grid, dim3(kRecWarps * 32), 0, stream, q, k, v, g, beta, n, int(d.n_k_heads),
             int(d.n_v_heads), int(d.d_k), int(d.d_v), state, out, pts, parents);
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
//     U = (I + A)^-1 diag(beta) V and W = (I + A)^-1 diag(beta e^gam) K by forward substitution, one
//     column per thread held in registers. gam, U, W, P go to the workspace.
//  2. gdn_chunk_scan (grid Hv x dv tiles of 16 rows, sequential over chunks): S tile in shared memory;
//     D = U - W S^T; O_i = e^gam_i S q_i + sum_{j<=i} P[i,j] D_j; S <- e^gam_L S + sum_j e^(gam_L - gam_j) D_j k_j^T.
// Workspace per segment: gam double [Hv][T], then U float [Hv][T][dv], W [Hv][T][dk], P [Hv][T][C].
constexpr int kC = int(kDeltaNetChunk);
constexpr int kChunkThreads = 256;
constexpr int kScanRows = 16;

__host__ __device__ constexpr int padded_ld(int dk) { return (dk & 1) ? dk : dk + 1; }  // odd: no bank conflicts

size_t prep_smem_bytes(int dk) {
  const int ld = padded_ld(dk);
  return sizeof(double) * kC + sizeof(float) * (2 * kC + 2 * kC * ld + kC * (kC + 1));
}

size_t scan_smem_bytes(int dk) {
  const int ld = padded_ld(dk);
  return sizeof(float) * (2 * kC + kScanRows * ld + kC * ld + kC * (kScanRows + 1) + kC * (kC + 1));
}

__global__ void __launch_bounds__(kChunkThreads)
    gdn_chunk_prep_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                          const float* __restrict__ g, const float* __restrict__ beta, int64_t t0, int64_t n, int hk,
                          int hv, int dk, int dv, int64_t seg_tokens, double* __restrict__ ws_gam,
                          float* __restrict__ ws_u, float* __restrict__ ws_w, float* __restrict__ ws_p) {
  pdl_begin();
  const int c = blockIdx.x, h = blockIdx.y, kh = h % hk, tid = threadIdx.x;
  const int64_t c0 = t0 + int64_t(c) * kC;
  const int L = int(n - c0 < kC ? n - c0 : kC);
  const int ld = padded_ld(dk);

  extern __shared__ double smem_d[];
  double* gam = smem_d;                                 // [C]
  float* bs = reinterpret_cast<float*>(gam + kC);       // [C] beta (0 past L)
  float* bg = bs + kC;                                  // [C] beta e^gam
  float* Ks = bg + kC;                                  // [C][ld]
  float* Qs = Ks + kC * ld;                             // [C][ld]
  float* As = Qs + kC * ld;                             // [C][C + 1]

  if (tid == 0) {
    double cum = 0.0;
    for (int i = 0; i < kC; ++i) {
      if (i < L) cum += double(g[(c0 + i) * hv + h]);
      gam[i] = cum;
    }
  }
  for (int idx = tid; idx < kC * dk; idx += kChunkThreads) {
    const int i = idx / dk, b = idx - i * dk;
    const bool in = i < L;
    Ks[i * ld + b] = in ? k[((c0 + i) * hk + kh) * dk + b] : 0.0f;
    Qs[i * ld + b] = in ? q[((c0 + i) * hk + kh) * dk + b] : 0.0f;
  }
  __syncthreads();
  const int64_t row_base = int64_t(h) * seg_tokens + int64_t(c) * kC;  // row of [Hv][T]
  if (tid < kC) {
    const float bi = tid < L ? beta[(c0 + tid) * hv + h] : 0.0f;
    bs[tid] = bi;
    bg[tid] = bi * static_cast<float>(exp(gam[tid]));
    ws_gam[row_base + tid] = gam[tid];
  }
  __syncthreads();

  // A (shared) and P (workspace); masked before exponentiating, so exponents are never positive.
  for (int idx = tid; idx < kC * kC; idx += kChunkThreads) {
    const int i = idx / kC, j = idx % kC;
    float a = 0.0f, p = 0.0f;
    if (j <= i && i < L) {
      const float* ki = Ks + i * ld;
      const float* qi = Qs + i * ld;
      const float* kj = Ks + j * ld;
      float kk = 0.0f, qk = 0.0f;
      for (int b = 0; b < dk; ++b) {
        kk += ki[b] * kj[b];
        qk += qi[b] * kj[b];
      }
      const float e = static_cast<float>(exp(gam[i] - gam[j]));
      if (j < i) a = bs[i] * e * kk;
      p = qk * e;
    }
    As[i * (kC + 1) + j] = a;
    ws_p[(row_base + i) * kC + j] = p;
  }
  __syncthreads();

  // Forward substitution through the strictly lower A, one column of [U | W] per thread: row i = its
  // right-hand side minus sum_{j<i} A[i,j] row j. Rows past L have a zero right-hand side and zero A row.
  for (int col = tid; col < dv + dk; col += kChunkThreads) {
    const bool is_u = col < dv;
    const int b = col - dv;
    float x[kC];
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      float r;
      if (is_u) {
        r = i < L ? bs[i] * v[((c0 + i) * hv + h) * dv + col] : 0.0f;
      } else {
        r = bg[i] * Ks[i * ld + b];
      }
      const float* Ai = As + i * (kC + 1);
#pragma unroll
      for (int j = 0; j < i; ++j) r -= Ai[j] * x[j];
      x[i] = r;
      if (is_u) {
        ws_u[(row_base + i) * dv + col] = r;
      } else {
        ws_w[(row_base + i) * dk + b] = r;
      }
    }
  }
}

__global__ void __launch_bounds__(kChunkThreads)
    gdn_chunk_scan_kernel(const float* __restrict__ q, const float* __restrict__ k, int64_t t0, int64_t n, int hk,
                          int hv, int dk, int dv, int64_t seg_tokens, const double* __restrict__ ws_gam,
                          const float* __restrict__ ws_u, const float* __restrict__ ws_w,
                          const float* __restrict__ ws_p, float* __restrict__ state, float* __restrict__ out) {
  pdl_begin();
  const int h = blockIdx.x, a0 = blockIdx.y * kScanRows, kh = h % hk, tid = threadIdx.x;
  const int rows = dv - a0 < kScanRows ? dv - a0 : kScanRows;
  const int ld = padded_ld(dk);
  constexpr int ldd = kScanRows + 1;

  extern __shared__ float smem_f[];
  float* gexp = smem_f;              // [C] e^gam_i
  float* dec = gexp + kC;            // [C] e^(gam_L - gam_j)
  float* Ss = dec + kC;              // [16][ld]  state rows a0 .. a0 + rows
  float* Buf = Ss + kScanRows * ld;  // [C][ld]   W, then Q, then K of the chunk
  float* Ds = Buf + kC * ld;         // [C][17]
  float* Ps = Ds + kC * ldd;         // [C][C + 1]

  float* st = state + (int64_t(h) * dv + a0) * dk;
  for (int idx = tid; idx < kScanRows * dk; idx += kChunkThreads) {
    const int a = idx / dk, b = idx - a * dk;
    Ss[a * ld + b] = a < rows ? st[int64_t(a) * dk + b] : 0.0f;
  }

  const int64_t seg_end = (n - t0 < seg_tokens) ? n : t0 + seg_tokens;
  const int n_chunks = int((seg_end - t0 + kC - 1) / kC);
  for (int c = 0; c < n_chunks; ++c) {
    const int64_t c0 = t0 + int64_t(c) * kC;
    const int L = int(n - c0 < kC ? n - c0 : kC);
    const int64_t row_base = int64_t(h) * seg_tokens + int64_t(c) * kC;
    if (tid < kC) {
      const double gi = ws_gam[row_base + tid], gl = ws_gam[row_base + L - 1];
      gexp[tid] = static_cast<float>(exp(gi));
      dec[tid] = tid < L ? static_cast<float>(exp(gl - gi)) : 0.0f;
    }
    for (int idx = tid; idx < L * dk; idx += kChunkThreads) {
      const int i = idx / dk, b = idx - i * dk;
      Buf[i * ld + b] = ws_w[(row_base + i) * dk + b];
    }
    for (int idx = tid; idx < L * kC; idx += kChunkThreads) {
      const int i = idx / kC, j = idx - i * kC;
      Ps[i * (kC + 1) + j] = ws_p[(row_base + i) * kC + j];
    }
    __syncthreads();
    // D = U - W S^T
    for (int idx = tid; idx < kC * kScanRows; idx += kChunkThreads) {
      const int i = idx / kScanRows, a = idx % kScanRows;
      if (i < L && a < rows) {
        const float* wi = Buf + i * ld;
        const float* sa = Ss + a * ld;
        float acc = 0.0f;
        for (int b = 0; b < dk; ++b) acc += wi[b] * sa[b];
        Ds[i * ldd + a] = ws_u[(row_base + i) * dv + a0 + a] - acc;
      }
    }
    __syncthreads();
    for (int idx = tid; idx < L * dk; idx += kChunkThreads) {
      const int i = idx / dk, b = idx - i * dk;
      Buf[i * ld + b] = q[((c0 + i) * hk + kh) * dk + b];
    }
    __syncthreads();
    // O_i = e^gam_i S q_i + sum_{j<=i} P[i,j] D_j   (S is still the chunk's incoming state)
    for (int idx = tid; idx < kC * kScanRows; idx += kChunkThreads) {
      const int i = idx / kScanRows, a = idx % kScanRows;
      if (i < L && a < rows) {
        const float* qi = Buf + i * ld;
        const float* sa = Ss + a * ld;
        float acc = 0.0f;
        for (int b = 0; b < dk; ++b) acc += qi[b] * sa[b];
        float o = gexp[i] * acc;
        const float* pi = Ps + i * (kC + 1);
        for (int j = 0; j <= i; ++j) o += pi[j] * Ds[j * ldd + a];
        out[((c0 + i) * hv + h) * dv + a0 + a] = o;
      }
    }
    __syncthreads();
    for (int idx = tid; idx < L * dk; idx += kChunkThreads) {
      const int i = idx / dk, b = idx - i * dk;
      Buf[i * ld + b] = k[((c0 + i) * hk + kh) * dk + b];
    }
    __syncthreads();
    // S <- e^gam_L S + sum_j e^(gam_L - gam_j) D_j k_j^T
    const float gl = gexp[L - 1];
    for (int idx = tid; idx < rows * dk; idx += kChunkThreads) {
      const int a = idx / dk, b = idx - a * dk;
      float sv = Ss[a * ld + b] * gl;
      for (int j = 0; j < L; ++j) sv += (Ds[j * ldd + a] * dec[j]) * Buf[j * ld + b];
      Ss[a * ld + b] = sv;
    }
    __syncthreads();
  }
  for (int idx = tid; idx < rows * dk; idx += kChunkThreads) {
    const int a = idx / dk, b = idx - a * dk;
    st[int64_t(a) * dk + b] = Ss[a * ld + b];
  }
}

size_t chunk_row_bytes(const DeltaNetDims& d) {
  return sizeof(double) + sizeof(float) * size_t(d.d_v + d.d_k + kC);
}

}  // namespace

cudaError_t gated_delta_net_recurrent(const float* q, const float* k, const float* v, const float* g,
                                      const float* beta, int64_t n, const DeltaNetDims& d, float* state,
                                      float* out, float* per_token_states, const int32_t* parents,
                                      cudaStream_t stream) {
  if (!dims_ok(d) || n < 0 || (parents != nullptr && per_token_states == nullptr)) return cudaErrorInvalidValue;
  if (state == nullptr) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (!q || !k || !v || !g || !beta || !out) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(d.n_v_heads), unsigned((d.d_v + kRecTileRows - 1) / kRecTileRows));
  const bool vec = d.d_k % 128 == 0 && is_aligned(q, 16) && is_aligned(k, 16) && is_aligned(state, 16) &&
                   (per_token_states == nullptr || is_aligned(per_token_states, 16));
  if (vec) {
    if (d.d_k == 128)
      launch_recurrent<4, true>(grid, stream, q, k, v, g, beta, n, d, state, out, per_token_states, parents);
    else
      launch_recurrent<8, true>(grid, stream, q, k, v, g, beta, n, d, state, out, per_token_states, parents);
  } else if (d.d_k <= 32) {
    launch_recurrent<1, false>(grid, stream, q, k, v, g, beta, n, d, state, out, per_token_states, parents);
  } else if (d.d_k <= 64) {
    launch_recurrent<2, false>(grid, stream, q, k, v, g, beta, n, d, state, out, per_token_states, parents);
  } else if (d.d_k <= 128) {
    launch_recurrent<4, false>(grid, stream, q, k, v, g, beta, n, d, state, out, per_token_states, parents);
  } else {
    launch_recurrent<8, false>(grid, stream, q, k, v, g, beta, n, d, state, out, per_token_states, parents);
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
    if (dk == 128) launch_pdl(gdn_restore_kernel<4, true>, grid, block, 0, stream, layers_dev, n, hk, hv, dk, dv);
    else launch_pdl(gdn_restore_kernel<8, true>, grid, block, 0, stream, layers_dev, n, hk, hv, dk, dv);
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

  const int dk = int(d.d_k), dv = int(d.d_v), hk = int(d.n_k_heads), hv = int(d.n_v_heads);
  const size_t prep_smem = prep_smem_bytes(dk), scan_smem = scan_smem_bytes(dk);
  cudaError_t err = cudaFuncSetAttribute(gdn_chunk_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(prep_smem));
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(gdn_chunk_scan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(scan_smem));
  if (err != cudaSuccess) return err;

  double* ws_gam = static_cast<double*>(workspace);
  float* ws_u = reinterpret_cast<float*>(ws_gam + size_t(hv) * seg);
  float* ws_w = ws_u + size_t(hv) * seg * dv;
  float* ws_p = ws_w + size_t(hv) * seg * dk;
  for (int64_t t0 = 0; t0 < n; t0 += seg) {
    const int64_t len = n - t0 < seg ? n - t0 : seg;
    const dim3 prep_grid(unsigned((len + kC - 1) / kC), unsigned(hv));
    launch_pdl(gdn_chunk_prep_kernel, prep_grid, dim3(kChunkThreads), prep_smem, stream, q, k, v, g, beta, t0, n, hk,
               hv, dk, dv, seg, ws_gam, ws_u, ws_w, ws_p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    const dim3 scan_grid(unsigned(hv), unsigned((dv + kScanRows - 1) / kScanRows));
    launch_pdl(gdn_chunk_scan_kernel, scan_grid, dim3(kChunkThreads), scan_smem, stream, q, k, t0, n, hk, hv, dk, dv,
               seg, ws_gam, ws_u, ws_w, ws_p, state, out);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace dflash::cuda

// Gated DeltaNet (algorithms.md D.4 / E): the recurrent form (decode, chain and tree verify, with
// per-token states) and the chunked WY form (prefill). Both are parallel over V-heads; within a head
// the tokens (recurrent) or chunks (chunked) are sequential. Float32 throughout, except the chunked
// form's cumulative log decay gam and its exponentials, which are double: with strongly negative g,
// gam reaches -1000s within a chunk and a float gam_i - gam_j would lose ~1e-4 absolute, i.e. 1e-4
// relative error in the decay of the most recent tokens (a GPU port in fp32 should subtract a chunk
// reference or accept that).
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/cpu/kernels_internal.h"
#include "ops/cpu/ops.h"

namespace dflash::cpu {
namespace {

using detail::axpy;
using detail::dot;

// One token on one head's state S [dv, dk], row by row: S[a] *= decay; e = S[a].k;
// S[a] += beta (v[a] - e) k; o[a] = S[a].q  (rows are independent, so this is the step exactly).
void delta_step(float* S, const float* q, const float* k, const float* v, float decay, float beta, float* o,
                int64_t dk, int64_t dv) {
  for (int64_t a = 0; a < dv; ++a) {
    float* row = S + a * dk;
    detail::scale(decay, row, dk);
    const float e = dot(row, k, dk);
    axpy(beta * (v[a] - e), k, row, dk);
    o[a] = dot(row, q, dk);
  }
}

}  // namespace

void gated_delta_net_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                               int64_t n, const DeltaNetShape& s, float* state, float* out,
                               float* per_token_states, std::span<const int32_t> parents, ThreadPool& pool) {
  const int64_t hk = s.n_k_heads, hv = s.n_v_heads, dk = s.d_k, dv = s.d_v;
  assert(hk > 0 && hv % hk == 0);
  const bool tree = !parents.empty();
  assert(!tree || (per_token_states != nullptr && static_cast<int64_t>(parents.size()) >= n));
  const int64_t hs = dv * dk;  // floats per head state
  const size_t hs_bytes = static_cast<size_t>(hs) * sizeof(float);

  pool.parallel_for(hv, 1, [&](int64_t hb, int64_t he) {
    for (int64_t h = hb; h < he; ++h) {
      const int64_t kh = h % hk;
      for (int64_t t = 0; t < n; ++t) {
        const float* qt = q + (t * hk + kh) * dk;
        const float* kt = k + (t * hk + kh) * dk;
        const float* vt = v + (t * hv + h) * dv;
        const float decay = std::exp(g[t * hv + h]);
        float* S = state + h * hs;
        if (tree) {
          const int32_t p = parents[t];
          assert(p < t);
          S = per_token_states + (t * hv + h) * hs;
          const float* from = p < 0 ? state + h * hs : per_token_states + (p * hv + h) * hs;
          std::memcpy(S, from, hs_bytes);
        }
        delta_step(S, qt, kt, vt, decay, beta[t * hv + h], out + (t * hv + h) * dv, dk, dv);
        if (!tree && per_token_states != nullptr) std::memcpy(per_token_states + (t * hv + h) * hs, S, hs_bytes);
      }
    }
  });
}

// Per head and chunk of L <= C tokens (a short tail chunk is exactly a zero-padded one: padded rows
// have beta = 0 and g = 0, so they change neither S nor the real rows), with S = S_0 entering it:
//   gam_i = sum_{j<=i} g_j (double, restarting each chunk);  A[i,j] = beta_i e^(gam_i - gam_j) k_i.k_j, j < i
//   U = (I + A)^-1 diag(beta) V,  W = (I + A)^-1 diag(beta e^gam) K     (by forward substitution, row i
//       = its right-hand side minus sum_{j<i} A[i,j] row j, instead of forming T = (I + A)^-1)
//   D = U - W S^T;  O_i = e^gam_i S q_i + sum_{j<=i} (q_i.k_j) e^(gam_i - gam_j) D_j
//   S <- e^gam_L S + sum_j e^(gam_L - gam_j) D_j k_j^T
// Exponents are formed only for j <= i (never positive).
void gated_delta_net_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                             int64_t n, const DeltaNetShape& s, float* state, float* out, ThreadPool& pool,
                             int64_t chunk) {
  const int64_t hk = s.n_k_heads, hv = s.n_v_heads, dk = s.d_k, dv = s.d_v;
  assert(hk > 0 && hv % hk == 0 && chunk > 0);
  const int64_t C = chunk;
  const int64_t hs = dv * dk;

  pool.parallel_for(hv, 1, [&](int64_t hb, int64_t he) {
    std::vector<double> gam(C);
    std::vector<float> U(C * dv), W(C * dk), D(C * dv);
    for (int64_t h = hb; h < he; ++h) {
      const int64_t kh = h % hk;
      float* S = state + h * hs;
      auto Kr = [&](int64_t t) { return k + (t * hk + kh) * dk; };
      auto Qr = [&](int64_t t) { return q + (t * hk + kh) * dk; };
      for (int64_t c0 = 0; c0 < n; c0 += C) {
        const int64_t L = std::min(C, n - c0);
        double cum = 0.0;
        for (int64_t i = 0; i < L; ++i) gam[i] = cum += g[(c0 + i) * hv + h];

        // U and W by forward substitution through the strictly lower A.
        for (int64_t i = 0; i < L; ++i) {
          const int64_t t = c0 + i;
          const float bi = beta[t * hv + h];
          const float* ki = Kr(t);
          const float* vi = v + (t * hv + h) * dv;
          float* Ui = U.data() + i * dv;
          float* Wi = W.data() + i * dk;
          const float wscale = bi * static_cast<float>(std::exp(gam[i]));
          for (int64_t a = 0; a < dv; ++a) Ui[a] = bi * vi[a];
          for (int64_t b = 0; b < dk; ++b) Wi[b] = wscale * ki[b];
          for (int64_t j = 0; j < i; ++j) {
            const float aij = bi * static_cast<float>(std::exp(gam[i] - gam[j])) * dot(ki, Kr(c0 + j), dk);
            axpy(-aij, U.data() + j * dv, Ui, dv);
            axpy(-aij, W.data() + j * dk, Wi, dk);
          }
        }
        // D = U - W S^T
        for (int64_t i = 0; i < L; ++i) {
          const float* Wi = W.data() + i * dk;
          const float* Ui = U.data() + i * dv;
          float* Di = D.data() + i * dv;
          for (int64_t a = 0; a < dv; ++a) Di[a] = Ui[a] - dot(Wi, S + a * dk, dk);
        }
        // Outputs, from S_0.
        for (int64_t i = 0; i < L; ++i) {
          const int64_t t = c0 + i;
          const float* qi = Qr(t);
          float* o = out + (t * hv + h) * dv;
          const float gi = static_cast<float>(std::exp(gam[i]));
          for (int64_t a = 0; a < dv; ++a) o[a] = gi * dot(qi, S + a * dk, dk);
          for (int64_t j = 0; j <= i; ++j) {
            const float pij = dot(qi, Kr(c0 + j), dk) * static_cast<float>(std::exp(gam[i] - gam[j]));
            axpy(pij, D.data() + j * dv, o, dv);
          }
        }
        // State hand-off to the next chunk.
        const double gl = gam[L - 1];
        detail::scale(static_cast<float>(std::exp(gl)), S, hs);
        for (int64_t j = 0; j < L; ++j) {
          const float dj = static_cast<float>(std::exp(gl - gam[j]));
          const float* kj = Kr(c0 + j);
          const float* Dj = D.data() + j * dv;
          for (int64_t a = 0; a < dv; ++a) axpy(Dj[a] * dj, kj, S + a * dk, dk);
        }
      }
    }
  });
}

}  // namespace dflash::cpu

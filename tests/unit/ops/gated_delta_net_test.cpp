// Gated DeltaNet: recurrent vs a naive per-step double formula; per-token states; the tree form
// against the chain along each node's ancestor path; chunked vs recurrent (outputs and final state).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ops/cpu/ops.h"
#include "ops_test_util.h"

namespace dflash::cpu {
namespace {

using test::SeededRng;

struct Inputs {
  DeltaNetShape s;
  int64_t n = 0;
  std::vector<float> q, k, v, g, beta, state;
};

void l2norm_heads(std::vector<float>& x, int64_t d, float extra) {
  for (size_t o = 0; o < x.size(); o += d) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += double(x[o + i]) * x[o + i];
    const float inv = float(1.0 / std::sqrt(ss + 1e-6)) * extra;
    for (int64_t i = 0; i < d; ++i) x[o + i] *= inv;
  }
}

// g_lo: most negative log decay (-20: "strongly negative").
Inputs make_inputs(std::mt19937& rng, DeltaNetShape s, int64_t n, float g_lo) {
  Inputs in;
  in.s = s;
  in.n = n;
  in.q = test::normal_vec(rng, n * s.n_k_heads * s.d_k);
  in.k = test::normal_vec(rng, n * s.n_k_heads * s.d_k);
  l2norm_heads(in.q, s.d_k, 1.0f / std::sqrt(float(s.d_k)));
  l2norm_heads(in.k, s.d_k, 1.0f);
  in.v = test::normal_vec(rng, n * s.n_v_heads * s.d_v);
  in.g = test::uniform_vec(rng, n * s.n_v_heads, g_lo, 0.0f);
  in.beta = test::uniform_vec(rng, n * s.n_v_heads, 0.02f, 0.98f);
  in.state = test::normal_vec(rng, s.n_v_heads * s.d_v * s.d_k, 0.3f);
  return in;
}

// Naive per-step recurrence in double; returns outputs, per-token states, final state in `state`.
// Returns the outputs' natural scale: max over outputs of sum_c |S[a,c] q[c]| (an output that is a
// cancellation of larger terms can only be compared relative to those terms).
double naive(const Inputs& in, std::vector<double>& state, std::vector<double>& out, std::vector<double>& states) {
  double out_scale = 0;
  const auto& s = in.s;
  const int64_t hs = s.d_v * s.d_k;
  out.assign(in.n * s.n_v_heads * s.d_v, 0.0);
  states.assign(in.n * s.n_v_heads * hs, 0.0);
  for (int64_t t = 0; t < in.n; ++t)
    for (int64_t h = 0; h < s.n_v_heads; ++h) {
      const int64_t kh = h % s.n_k_heads;
      const float* q = in.q.data() + (t * s.n_k_heads + kh) * s.d_k;
      const float* k = in.k.data() + (t * s.n_k_heads + kh) * s.d_k;
      const float* v = in.v.data() + (t * s.n_v_heads + h) * s.d_v;
      double* S = state.data() + h * hs;
      const double decay = std::exp(double(in.g[t * s.n_v_heads + h])), b = in.beta[t * s.n_v_heads + h];
      for (int64_t i = 0; i < hs; ++i) S[i] *= decay;
      std::vector<double> e(s.d_v, 0.0);
      for (int64_t a = 0; a < s.d_v; ++a)
        for (int64_t c = 0; c < s.d_k; ++c) e[a] += S[a * s.d_k + c] * k[c];
      for (int64_t a = 0; a < s.d_v; ++a)
        for (int64_t c = 0; c < s.d_k; ++c) S[a * s.d_k + c] += b * (v[a] - e[a]) * k[c];
      for (int64_t a = 0; a < s.d_v; ++a) {
        double o = 0, mag = 0;
        for (int64_t c = 0; c < s.d_k; ++c) o += S[a * s.d_k + c] * q[c], mag += std::abs(S[a * s.d_k + c] * q[c]);
        out_scale = std::max(out_scale, mag);
        out[(t * s.n_v_heads + h) * s.d_v + a] = o;
      }
      std::memcpy(states.data() + (t * s.n_v_heads + h) * hs, S, hs * sizeof(double));
    }
  return out_scale;
}

TEST(GatedDeltaNet, RecurrentMatchesNaiveWithPerTokenStates) {
  SeededRng s;
  ThreadPool pool(3);
  for (DeltaNetShape sh : {DeltaNetShape{2, 4, 32, 16}, DeltaNetShape{1, 3, 16, 24}, DeltaNetShape{2, 2, 64, 64}})
    for (float g_lo : {-1.0f, -20.0f}) {
      SCOPED_TRACE("Hk " + std::to_string(sh.n_k_heads) + " Hv " + std::to_string(sh.n_v_heads) + " g_lo " +
                   std::to_string(g_lo));
      const int64_t n = 37;
      Inputs in = make_inputs(s.rng, sh, n, g_lo);
      std::vector<double> ref_state(in.state.begin(), in.state.end()), ref_out, ref_states;
      const double out_scale = naive(in, ref_state, ref_out, ref_states);
      auto state = in.state;
      std::vector<float> out(ref_out.size()), pts(ref_states.size());
      gated_delta_net_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), n, sh,
                                state.data(), out.data(), pts.data(), {}, pool);
      EXPECT_LT(test::rel_err(out, ref_out, out_scale), 1e-5);
      EXPECT_LT(test::rel_err(state, ref_state), 1e-5);
      EXPECT_LT(test::rel_err(pts, ref_states), 1e-5);
      // The last per-token state is the final state, exactly.
      const size_t hs_all = state.size();
      EXPECT_EQ(0, std::memcmp(pts.data() + (n - 1) * hs_all, state.data(), hs_all * sizeof(float)));
      // Without per-token states: the same numbers.
      auto state2 = in.state;
      std::vector<float> out2(out.size());
      gated_delta_net_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), n, sh,
                                state2.data(), out2.data(), nullptr, {}, pool);
      EXPECT_EQ(out, out2);
      EXPECT_EQ(state, state2);
    }
}

// Rows `idx` of a [n, width] buffer.
std::vector<float> gather(const std::vector<float>& x, int64_t width, const std::vector<int64_t>& idx) {
  std::vector<float> out;
  for (int64_t i : idx) out.insert(out.end(), x.begin() + i * width, x.begin() + (i + 1) * width);
  return out;
}

TEST(GatedDeltaNet, TreeNodeStateEqualsChainAlongAncestors) {
  SeededRng s;
  ThreadPool pool(2);
  const DeltaNetShape sh{2, 6, 16, 8};
  const int64_t n = 25;
  Inputs in = make_inputs(s.rng, sh, n, -3.0f);
  std::vector<int32_t> parents(n);
  parents[0] = -1;
  for (int64_t i = 1; i < n; ++i)
    parents[i] = (i % 9 == 0) ? -1 : static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, i - 1)(s.rng));
  const int64_t hs_all = sh.n_v_heads * sh.d_v * sh.d_k;
  auto state = in.state;
  std::vector<float> out(n * sh.n_v_heads * sh.d_v), pts(n * hs_all);
  gated_delta_net_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), n, sh, state.data(),
                            out.data(), pts.data(), parents, pool);
  EXPECT_EQ(state, in.state);  // tree form leaves the committed state alone
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> path;
    for (int64_t a = i; a >= 0; a = parents[a]) path.insert(path.begin(), a);
    const int64_t m = static_cast<int64_t>(path.size());
    const auto q = gather(in.q, sh.n_k_heads * sh.d_k, path), k = gather(in.k, sh.n_k_heads * sh.d_k, path);
    const auto v = gather(in.v, sh.n_v_heads * sh.d_v, path), g = gather(in.g, sh.n_v_heads, path);
    const auto b = gather(in.beta, sh.n_v_heads, path);
    auto chain_state = in.state;
    std::vector<float> chain_out(m * sh.n_v_heads * sh.d_v);
    gated_delta_net_recurrent(q.data(), k.data(), v.data(), g.data(), b.data(), m, sh, chain_state.data(),
                              chain_out.data(), nullptr, {}, pool);
    ASSERT_EQ(0, std::memcmp(chain_state.data(), pts.data() + i * hs_all, hs_all * sizeof(float))) << "node " << i;
    ASSERT_EQ(0, std::memcmp(chain_out.data() + (m - 1) * sh.n_v_heads * sh.d_v, out.data() + i * sh.n_v_heads * sh.d_v,
                             sh.n_v_heads * sh.d_v * sizeof(float)))
        << "node " << i;
  }
}

TEST(GatedDeltaNet, ChunkedMatchesRecurrent) {
  SeededRng s;
  ThreadPool pool(3);
  for (DeltaNetShape sh : {DeltaNetShape{2, 4, 32, 16}, DeltaNetShape{1, 3, 16, 24}, DeltaNetShape{1, 1, 128, 128}})
    for (int64_t n : {1, 63, 64, 65, 200, 300})
      for (float g_lo : {-0.3f, -20.0f}) {
        if (sh.d_k == 128 && n != 200) continue;  // one realistic head size is enough
        SCOPED_TRACE("Hk " + std::to_string(sh.n_k_heads) + " Hv " + std::to_string(sh.n_v_heads) + " dk " +
                     std::to_string(sh.d_k) + " n " + std::to_string(n) + " g_lo " + std::to_string(g_lo));
        Inputs in = make_inputs(s.rng, sh, n, g_lo);
        auto rs = in.state, cs = in.state;
        std::vector<float> ro(n * sh.n_v_heads * sh.d_v), co(ro.size(), NAN);
        gated_delta_net_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), n, sh,
                                  rs.data(), ro.data(), nullptr, {}, pool);
        gated_delta_net_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), n, sh, cs.data(),
                                co.data(), pool);
        std::vector<double> ns(in.state.begin(), in.state.end()), no, nst;
        const double out_scale = naive(in, ns, no, nst);  // outputs relative to their terms' size
        EXPECT_LT(test::rel_err(co, ro, out_scale), 1e-5);
        EXPECT_LT(test::rel_err(cs, rs), 1e-5);
        // A different chunk size gives the same answer too.
        auto cs16 = in.state;
        std::vector<float> co16(ro.size());
        gated_delta_net_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), n, sh,
                                cs16.data(), co16.data(), pool, 16);
        EXPECT_LT(test::rel_err(co16, ro, out_scale), 1e-5);
        EXPECT_LT(test::rel_err(cs16, rs), 1e-5);
      }
}

}  // namespace
}  // namespace dflash::cpu

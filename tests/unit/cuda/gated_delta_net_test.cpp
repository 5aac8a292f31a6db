// CUDA gated DeltaNet (ops/cuda/gated_delta_net.h) against the CPU reference (ops/cpu/ops.h) on random
// inputs: the recurrent form (chain with and without per-token states, tree with random parents), the
// chunked form against both CPU forms (outputs and final state), Hv = 2 Hk and 3 Hk, dk = dv = 128 and
// small/odd dims, n = 1 .. 300, log decays down to -20. Outputs are poisoned with NaN words before each
// launch. Tolerance 1e-5 relative: outputs to their natural scale (max_a sum_c |S[a,c] q[c]|), states to
// their largest element. A fresh seed per test, printed on failure (DFLASH_TEST_SEED=<n> replays it).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/fill.h"
#include "ops/cuda/gated_delta_net.h"
#include "ops/cuda/gated_delta_net_host.h"
#include "support/cuda_test_util.h"
#include "support/test_paths.h"
#include "unit/ops/ops_test_util.h"

namespace dflash {
namespace {

using test::normal_vec;
using test::rel_err;
using test::SeededRng;
using test::uniform_vec;

using test::cuda_device_present;
using test::DevArray;
using test::kNanPoison;


// Shapes: realistic heads (dk = dv = 128, the float4 path; Hv = 2 Hk and 3 Hk), small and odd dims (the
// scalar path, partial row tiles), dk = 256, and dv over 128 (the chunked prep's V in two slabs, float4 and
// scalar).
const cpu::DeltaNetShape kShapes[] = {{2, 4, 128, 128}, {1, 3, 128, 128}, {2, 6, 16, 24}, {3, 3, 40, 7},
                                      {1, 2, 100, 33},  {1, 2, 256, 64},  {1, 2, 32, 160}, {2, 2, 24, 130}};
const int64_t kLengths[] = {1, 5, 16, 63, 64, 65, 300};

std::string describe(const cpu::DeltaNetShape& s, int64_t n, float g_lo) {
  return "Hk " + std::to_string(s.n_k_heads) + " Hv " + std::to_string(s.n_v_heads) + " dk " +
         std::to_string(s.d_k) + " dv " + std::to_string(s.d_v) + " n " + std::to_string(n) + " g_lo " +
         std::to_string(g_lo);
}

cuda::DeltaNetDims dims_of(const cpu::DeltaNetShape& s) { return {s.n_k_heads, s.n_v_heads, s.d_k, s.d_v}; }

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

struct Inputs {
  cpu::DeltaNetShape s;
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

// As the model feeds the op: q, k L2-normalised per head (q also / sqrt(dk)); g in [g_lo, 0].
Inputs make_inputs(std::mt19937& rng, cpu::DeltaNetShape s, int64_t n, float g_lo) {
  Inputs in;
  in.s = s;
  in.n = n;
  in.q = normal_vec(rng, n * s.n_k_heads * s.d_k);
  in.k = normal_vec(rng, n * s.n_k_heads * s.d_k);
  l2norm_heads(in.q, s.d_k, 1.0f / std::sqrt(float(s.d_k)));
  l2norm_heads(in.k, s.d_k, 1.0f);
  in.v = normal_vec(rng, n * s.n_v_heads * s.d_v);
  in.g = uniform_vec(rng, n * s.n_v_heads, g_lo, 0.0f);
  in.beta = uniform_vec(rng, n * s.n_v_heads, 0.02f, 0.98f);
  in.state = normal_vec(rng, s.n_v_heads * s.d_v * s.d_k, 0.3f);
  return in;
}

// The outputs' natural scale: max over (t, h, a) of sum_c |S_t[a, c] q_t[c]| from the reference
// per-token states (an output that is a cancellation of larger terms is compared relative to them).
double output_scale(const Inputs& in, const std::vector<float>& pts, const std::vector<int32_t>& parents = {}) {
  (void)parents;
  const auto& s = in.s;
  const int64_t hs = s.d_v * s.d_k;
  double scale = 1e-30;
  for (int64_t t = 0; t < in.n; ++t)
    for (int64_t h = 0; h < s.n_v_heads; ++h) {
      const float* S = pts.data() + (t * s.n_v_heads + h) * hs;
      const float* q = in.q.data() + (t * s.n_k_heads + h % s.n_k_heads) * s.d_k;
      for (int64_t a = 0; a < s.d_v; ++a) {
        double m = 0;
        for (int64_t c = 0; c < s.d_k; ++c) m += std::abs(double(S[a * s.d_k + c]) * q[c]);
        scale = std::max(scale, m);
      }
    }
  return scale;
}

struct DeviceInputs {
  explicit DeviceInputs(const Inputs& in) : q(in.q), k(in.k), v(in.v), g(in.g), beta(in.beta) {}
  cudaError_t error() const {
    for (cudaError_t e : {q.error(), k.error(), v.error(), g.error(), beta.error()})
      if (e != cudaSuccess) return e;
    return cudaSuccess;
  }
  DevArray<float> q, k, v, g, beta;
};

// Reference: the CPU recurrent form with per-token states (optionally tree parents).
struct Reference {
  std::vector<float> state, out, pts;
};
Reference cpu_recurrent(const Inputs& in, const std::vector<int32_t>& parents) {
  const auto& s = in.s;
  Reference r;
  r.state = in.state;
  r.out.assign(in.n * s.n_v_heads * s.d_v, 0.0f);
  r.pts.assign(in.n * s.n_v_heads * s.d_v * s.d_k, 0.0f);
  cpu::gated_delta_net_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), in.n, s,
                                 r.state.data(), r.out.data(), r.pts.data(), parents, pool());
  return r;
}

constexpr double kTol = 1e-5;  // relative: outputs to their natural scale, states to their largest element

TEST(CudaGatedDeltaNet, RecurrentChainMatchesCpu) {
  if (!cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
  SeededRng s;
  double worst_out = 0, worst_state = 0;
  for (const auto& sh : kShapes)
    for (int64_t n : kLengths) {
      if (sh.d_k * sh.d_v > 8192 && n > 65 && sh.n_v_heads != 4) continue;  // keep the CPU reference quick
      const float g_lo = n % 2 ? -20.0f : -1.0f;
      SCOPED_TRACE(describe(sh, n, g_lo));
      const Inputs in = make_inputs(s.rng, sh, n, g_lo);
      const Reference ref = cpu_recurrent(in, {});
      const double scale = output_scale(in, ref.pts);
      const DeviceInputs d(in);
      DF_ASSERT_CUDA(d.error());
      for (bool with_states : {true, false}) {
        DevArray<float> state(in.state), out(ref.out.size()), pts(with_states ? ref.pts.size() : 0);
        DF_ASSERT_CUDA(out.error());
        DF_ASSERT_CUDA(pts.error());
        const Status st = cuda::run_gated_delta_net_recurrent(d.q.get(), d.k.get(), d.v.get(), d.g.get(),
                                                              d.beta.get(), n, dims_of(sh), state.get(), out.get(),
                                                              with_states ? pts.get() : nullptr, nullptr);
        ASSERT_TRUE(st.ok()) << st.message();
        DF_ASSERT_CUDA(cudaDeviceSynchronize());
        const double eo = rel_err(out.host(), ref.out, scale), es = rel_err(state.host(), ref.state);
        EXPECT_LT(eo, kTol) << "outputs, per-token states " << with_states;
        EXPECT_LT(es, kTol) << "final state, per-token states " << with_states;
        worst_out = std::max(worst_out, eo);
        worst_state = std::max(worst_state, es);
        if (with_states) {
          const auto got = pts.host();
          const double ep = rel_err(got, ref.pts);
          EXPECT_LT(ep, kTol) << "per-token states";
          worst_state = std::max(worst_state, ep);
          // The last per-token state is the final state, bit for bit.
          const size_t hs_all = in.state.size();
          EXPECT_EQ(0, std::memcmp(got.data() + (n - 1) * hs_all, state.host().data(), hs_all * sizeof(float)));
        }
      }
    }
  std::printf("recurrent chain vs CPU: worst output err %.3g, worst state err %.3g (tol %.1g)\n", worst_out,
              worst_state, kTol);
}

// Decode as a sequence of single-token calls equals one multi-token call (the state round-trips through
// device memory unchanged).
TEST(CudaGatedDeltaNet, RecurrentStepByStepEqualsOneCall) {
  if (!cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
  SeededRng s;
  const cpu::DeltaNetShape sh{2, 4, 128, 128};
  const int64_t n = 9;
  const Inputs in = make_inputs(s.rng, sh, n, -2.0f);
  const DeviceInputs d(in);
  DF_ASSERT_CUDA(d.error());
  DevArray<float> st_one(in.state), out_one(n * sh.n_v_heads * sh.d_v), st_step(in.state), out_step(out_one.size());
  ASSERT_TRUE(cuda::run_gated_delta_net_recurrent(d.q.get(), d.k.get(), d.v.get(), d.g.get(), d.beta.get(), n,
                                                  dims_of(sh), st_one.get(), out_one.get(), nullptr, nullptr)
                  .ok());
  for (int64_t t = 0; t < n; ++t) {
    const int64_t ko = t * sh.n_k_heads * sh.d_k, vo = t * sh.n_v_heads * sh.d_v, go = t * sh.n_v_heads;
    ASSERT_TRUE(cuda::run_gated_delta_net_recurrent(d.q.get() + ko, d.k.get() + ko, d.v.get() + vo, d.g.get() + go,
                                                    d.beta.get() + go, 1, dims_of(sh), st_step.get(),
                                                    out_step.get() + vo, nullptr, nullptr)
                    .ok());
  }
  DF_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(out_one.host(), out_step.host());
  EXPECT_EQ(st_one.host(), st_step.host());
}

// state_before receives the incoming state bit for bit (stored as the kernel loads it; by a copy when n is 0) and
// changes nothing else: the final state and outputs equal a call without it.
TEST(CudaGatedDeltaNet, StateBeforeKeepsTheIncomingState) {
  if (!cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
  SeededRng s;
  for (const cpu::DeltaNetShape& sh : kShapes) {
    for (const int64_t n : {int64_t{0}, int64_t{4}}) {
      const std::string what = describe(sh, n, -2.0f);
      const int64_t hs = sh.n_v_heads * sh.d_v * sh.d_k;
      const Inputs in = make_inputs(s.rng, sh, std::max<int64_t>(n, 1), -2.0f);
      const DeviceInputs d(in);
      DF_ASSERT_CUDA(d.error());
      DevArray<float> plain(in.state), with(in.state), before(std::vector<float>(hs, kNanPoison));
      DevArray<float> out_plain(std::max<int64_t>(n, 1) * sh.n_v_heads * sh.d_v), out_with(out_plain.size());
      ASSERT_TRUE(cuda::run_gated_delta_net_recurrent(d.q.get(), d.k.get(), d.v.get(), d.g.get(), d.beta.get(), n,
                                                      dims_of(sh), plain.get(), out_plain.get(), nullptr, nullptr)
                      .ok())
          << what;
      ASSERT_TRUE(cuda::run_gated_delta_net_recurrent(d.q.get(), d.k.get(), d.v.get(), d.g.get(), d.beta.get(), n,
                                                      dims_of(sh), with.get(), out_with.get(), nullptr, nullptr,
                                                      before.get())
                      .ok())
          << what;
      DF_ASSERT_CUDA(cudaDeviceSynchronize());
      EXPECT_EQ(before.host(), in.state) << what;
      EXPECT_EQ(with.host(), plain.host()) << what;
      if (n > 0) EXPECT_EQ(out_with.host(), out_plain.host()) << what;
    }
  }
}

// The batched restore after a rolled-back step (gated_delta_net_restore) in one launch over three layers of each
// shape: a re-run of the first `keep` tokens from a kept state equals the recurrent form's call over them bit for
// bit (the states a verify step computes on the way); a copied state equals its source; a layer without one keeps
// its state; every layer's conv window is copied.
TEST(CudaGatedDeltaNet, RestoreEqualsRecurrentBitForBit) {
  if (!cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
  SeededRng s;
  for (const cpu::DeltaNetShape& sh : kShapes) {
    const int64_t n = 5, keep = 3, hs = sh.n_v_heads * sh.d_v * sh.d_k, conv_elems = 3 * 37 + 1;
    const std::string what = describe(sh, keep, -3.0f);
    const Inputs in = make_inputs(s.rng, sh, n, -3.0f);
    const DeviceInputs d(in);
    DF_ASSERT_CUDA(d.error());
    const std::vector<float> other = normal_vec(s.rng, hs), untouched = normal_vec(s.rng, hs);
    DevArray<float> from(in.state), copied_from(other), want_state(in.state), out(n * sh.n_v_heads * sh.d_v);
    DevArray<float> rerun(std::vector<float>(hs, kNanPoison)), copied(std::vector<float>(hs, kNanPoison));
    DevArray<float> kept(untouched);
    std::vector<std::vector<float>> conv_src;
    std::vector<std::unique_ptr<DevArray<float>>> conv_from, conv;
    for (int l = 0; l < 3; ++l) {
      conv_src.push_back(normal_vec(s.rng, conv_elems));
      conv_from.push_back(std::make_unique<DevArray<float>>(conv_src.back()));
      conv.push_back(std::make_unique<DevArray<float>>(std::vector<float>(conv_elems, kNanPoison)));
    }
    ASSERT_TRUE(cuda::run_gated_delta_net_recurrent(d.q.get(), d.k.get(), d.v.get(), d.g.get(), d.beta.get(), keep,
                                                    dims_of(sh), want_state.get(), out.get(), nullptr, nullptr)
                    .ok());
    std::vector<cuda::DeltaNetRestoreLayer> table = {
        {rerun.get(), from.get(), d.q.get(), d.k.get(), d.v.get(), d.g.get(), d.beta.get(), conv[0]->get(),
         conv_from[0]->get(), conv_elems},
        {copied.get(), copied_from.get(), nullptr, nullptr, nullptr, nullptr, nullptr, conv[1]->get(),
         conv_from[1]->get(), conv_elems},
        {kept.get(), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, conv[2]->get(), conv_from[2]->get(),
         conv_elems}};
    static_assert(sizeof(cuda::DeltaNetRestoreLayer) % sizeof(float) == 0);
    std::vector<float> words(table.size() * sizeof(table[0]) / sizeof(float));  // the table's bytes, uploaded
    std::memcpy(words.data(), table.data(), words.size() * sizeof(float));
    DevArray<float> dev_table(words);
    const bool vec = cuda::gated_delta_net_restore_vec(table.data(), 1, dims_of(sh));
    EXPECT_EQ(vec, sh.d_k % 128 == 0) << what;
    DF_ASSERT_CUDA(cuda::gated_delta_net_restore(reinterpret_cast<const cuda::DeltaNetRestoreLayer*>(dev_table.get()),
                                                 3, vec, keep, dims_of(sh)));
    DF_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(rerun.host(), want_state.host()) << what;
    EXPECT_EQ(copied.host(), other) << what;
    EXPECT_EQ(kept.host(), untouched) << what;
    for (int l = 0; l < 3; ++l) EXPECT_EQ(conv[l]->host(), conv_src[l]) << what << " layer " << l;
  }
  EXPECT_EQ(cuda::gated_delta_net_restore(nullptr, 2, false, 1, dims_of(kShapes[0])), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gated_delta_net_restore(nullptr, 0, false, 1, dims_of(kShapes[0])), cudaSuccess);
}

TEST(CudaGatedDeltaNet, TreeMatchesCpu) {
  if (!cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
  SeededRng s;
  double worst = 0;
  for (const auto& sh : kShapes)
    for (int64_t n : {1, 5, 16, 32, 63}) {
      const float g_lo = -3.0f;
      SCOPED_TRACE(describe(sh, n, g_lo));
      const Inputs in = make_inputs(s.rng, sh, n, g_lo);
      std::vector<int32_t> parents(n);
      parents[0] = -1;
      for (int64_t i = 1; i < n; ++i) {
        // Mostly chains with branches; sometimes a fresh root.
        const int64_t r = std::uniform_int_distribution<int64_t>(0, 9)(s.rng);
        parents[i] = r == 0 ? -1
                     : r < 5 ? static_cast<int32_t>(i - 1)
                             : static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, i - 1)(s.rng));
      }
      const Reference ref = cpu_recurrent(in, parents);
      const double scale = output_scale(in, ref.pts);
      const DeviceInputs d(in);
      DF_ASSERT_CUDA(d.error());
      DevArray<int32_t> dparents(parents);
      DevArray<float> state(in.state), out(ref.out.size()), pts(ref.pts.size());
      DF_ASSERT_CUDA(pts.error());
      const Status st = cuda::run_gated_delta_net_recurrent(d.q.get(), d.k.get(), d.v.get(), d.g.get(),
                                                            d.beta.get(), n, dims_of(sh), state.get(), out.get(),
                                                            pts.get(), dparents.get());
      ASSERT_TRUE(st.ok()) << st.message();
      DF_ASSERT_CUDA(cudaDeviceSynchronize());
      EXPECT_EQ(state.host(), in.state) << "the tree form must leave the committed state alone";
      const double eo = rel_err(out.host(), ref.out, scale), ep = rel_err(pts.host(), ref.pts);
      EXPECT_LT(eo, kTol) << "outputs";
      EXPECT_LT(ep, kTol) << "per-token states";
      worst = std::max({worst, eo, ep});
    }
  std::printf("recurrent tree vs CPU: worst err %.3g (tol %.1g)\n", worst, kTol);
}

TEST(CudaGatedDeltaNet, ChunkedMatchesCpuChunkedAndRecurrent) {
  if (!cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
  SeededRng s;
  double worst_vs_chunked = 0, worst_vs_recurrent = 0;
  for (const auto& sh : kShapes)
    for (int64_t n : kLengths)
      for (float g_lo : {-0.3f, -20.0f}) {
        if (sh.d_k * sh.d_v > 8192 && n > 65 && sh.n_v_heads != 4) continue;
        SCOPED_TRACE(describe(sh, n, g_lo));
        const Inputs in = make_inputs(s.rng, sh, n, g_lo);
        const Reference rec = cpu_recurrent(in, {});
        const double scale = output_scale(in, rec.pts);
        auto cpu_state = in.state;
        std::vector<float> cpu_out(rec.out.size());
        cpu::gated_delta_net_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), n, sh,
                                     cpu_state.data(), cpu_out.data(), pool());
        const DeviceInputs d(in);
        DF_ASSERT_CUDA(d.error());
        // Whole input in one pass, and (for longer inputs) a workspace of two chunks: several segments.
        for (int64_t ws_tokens : {n, int64_t{128}}) {
          if (ws_tokens == 128 && n <= 128) continue;
          SCOPED_TRACE("workspace for " + std::to_string(ws_tokens) + " tokens");
          const size_t ws_bytes = cuda::gated_delta_net_chunked_workspace_bytes(ws_tokens, dims_of(sh));
          DevArray<float> ws(ws_bytes / 4), state(in.state), out(rec.out.size());
          DF_ASSERT_CUDA(ws.error());
          const Status st = cuda::run_gated_delta_net_chunked(d.q.get(), d.k.get(), d.v.get(), d.g.get(),
                                                              d.beta.get(), n, dims_of(sh), state.get(), out.get(),
                                                              ws.get(), ws_bytes);
          ASSERT_TRUE(st.ok()) << st.message();
          DF_ASSERT_CUDA(cudaDeviceSynchronize());
          const auto go = out.host(), gs = state.host();
          const double e1 = std::max(rel_err(go, cpu_out, scale), rel_err(gs, cpu_state));
          const double e2 = std::max(rel_err(go, rec.out, scale), rel_err(gs, rec.state));
          EXPECT_LT(rel_err(go, cpu_out, scale), kTol) << "outputs vs CPU chunked";
          EXPECT_LT(rel_err(gs, cpu_state), kTol) << "final state vs CPU chunked";
          EXPECT_LT(rel_err(go, rec.out, scale), kTol) << "outputs vs CPU recurrent";
          EXPECT_LT(rel_err(gs, rec.state), kTol) << "final state vs CPU recurrent";
          worst_vs_chunked = std::max(worst_vs_chunked, e1);
          worst_vs_recurrent = std::max(worst_vs_recurrent, e2);
        }
      }
  std::printf("chunked vs CPU chunked: worst err %.3g; vs CPU recurrent: %.3g (tol %.1g)\n", worst_vs_chunked,
              worst_vs_recurrent, kTol);
}

// A realistic prefill: 27B's 48 V-heads over 16 K-heads, 1000 tokens; chunked vs the GPU recurrent form.
TEST(CudaGatedDeltaNet, ChunkedMatchesRecurrentAtModelShape) {
  if (!cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
  SeededRng s;
  const cpu::DeltaNetShape sh{16, 48, 128, 128};
  const int64_t n = 1000;
  const Inputs in = make_inputs(s.rng, sh, n, -8.0f);
  const DeviceInputs d(in);
  DF_ASSERT_CUDA(d.error());
  const size_t ws_bytes = cuda::gated_delta_net_chunked_workspace_bytes(512, dims_of(sh));
  DevArray<float> ws(ws_bytes / 4), sc(in.state), oc(n * sh.n_v_heads * sh.d_v), sr(in.state), orr(oc.size());
  ASSERT_TRUE(cuda::run_gated_delta_net_chunked(d.q.get(), d.k.get(), d.v.get(), d.g.get(), d.beta.get(), n,
                                                dims_of(sh), sc.get(), oc.get(), ws.get(), ws_bytes)
                  .ok());
  ASSERT_TRUE(cuda::run_gated_delta_net_recurrent(d.q.get(), d.k.get(), d.v.get(), d.g.get(), d.beta.get(), n,
                                                  dims_of(sh), sr.get(), orr.get(), nullptr, nullptr)
                  .ok());
  DF_ASSERT_CUDA(cudaDeviceSynchronize());
  const auto ro = orr.host();
  double scale = 0;
  for (float x : ro) scale = std::max(scale, double(std::abs(x)));
  const double eo = rel_err(oc.host(), ro, scale), es = rel_err(sc.host(), sr.host());
  EXPECT_LT(eo, kTol);
  EXPECT_LT(es, kTol);
  // Timing figures for the record (not asserted): decode step and chunked prefill at this shape.
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (int i = 0; i < 100; ++i)
    (void)cuda::gated_delta_net_recurrent(d.q.get(), d.k.get(), d.v.get(), d.g.get(), d.beta.get(), 1, dims_of(sh),
                                          sr.get(), orr.get(), nullptr, nullptr);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms_dec = 0;
  cudaEventElapsedTime(&ms_dec, e0, e1);
  cudaEventRecord(e0);
  for (int i = 0; i < 5; ++i)
    (void)cuda::gated_delta_net_chunked(d.q.get(), d.k.get(), d.v.get(), d.g.get(), d.beta.get(), n, dims_of(sh),
                                        sc.get(), oc.get(), ws.get(), ws_bytes);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms_pre = 0;
  cudaEventElapsedTime(&ms_pre, e0, e1);
  DF_ASSERT_CUDA(cudaDeviceSynchronize());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  const double dec_us = ms_dec * 10.0;  // per call
  std::printf("27B shape: chunked vs recurrent err out %.3g state %.3g; decode step %.1f us (%.0f GB/s state "
              "traffic), chunked prefill %d tokens %.3f ms\n",
              eo, es, dec_us, 2.0 * in.state.size() * 4 / (dec_us * 1e3), int(n), ms_pre / 5);
}

TEST(CudaGatedDeltaNet, ArgumentErrors) {
  const cuda::DeltaNetDims bad_heads{2, 3, 16, 16}, bad_dk{1, 1, 300, 16}, ok{1, 1, 16, 16};
  float dummy = 0;
  float* p = &dummy;
  EXPECT_FALSE(cuda::run_gated_delta_net_recurrent(p, p, p, p, p, 1, bad_heads, p, p, nullptr, nullptr).ok());
  EXPECT_FALSE(cuda::run_gated_delta_net_recurrent(p, p, p, p, p, 1, bad_dk, p, p, nullptr, nullptr).ok());
  EXPECT_FALSE(cuda::run_gated_delta_net_recurrent(p, p, p, p, p, -1, ok, p, p, nullptr, nullptr).ok());
  const int32_t parents[1] = {-1};
  EXPECT_FALSE(cuda::run_gated_delta_net_recurrent(p, p, p, p, p, 1, ok, p, p, nullptr, parents).ok());
  EXPECT_FALSE(cuda::run_gated_delta_net_recurrent(nullptr, p, p, p, p, 1, ok, p, p, nullptr, nullptr).ok());
  EXPECT_FALSE(cuda::run_gated_delta_net_chunked(p, p, p, p, p, 1, ok, p, p, nullptr, 0).ok());
  const size_t one_chunk = cuda::gated_delta_net_chunked_workspace_bytes(64, ok);
  EXPECT_FALSE(cuda::run_gated_delta_net_chunked(p, p, p, p, p, 1, ok, p, p, p, one_chunk - 1).ok());
  EXPECT_TRUE(cuda::run_gated_delta_net_recurrent(nullptr, nullptr, nullptr, nullptr, nullptr, 0, ok, p, nullptr,
                                                  nullptr, nullptr)
                  .ok());
}

}  // namespace
}  // namespace dflash

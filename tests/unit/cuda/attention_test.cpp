// Device attention (ops/cuda/attention.h) against cpu::attention on random inputs: causal with a prefix,
// tree with random parents, full; GQA groups 1, 2, 4, 6, 8, 12, 20; head_dim 64, 128, 256; n_q 1, 5, 16 (decode),
// 33, 100, 300, 1000 (prefill); key counts that are not a multiple of the 64-token chunk; sliding windows;
// long contexts (split-K and its merge), with and without workspace. Outputs are poisoned with NaN first.
//
// Tolerances, per element, with scale = scale_mul / sqrt(hd):
//   f32 kernels (decode shapes n_q <= 32 on float32 K/V or with a window or a kFull mask, trees of more than
//     128 nodes): both sides are float32 with a running max but sum in different orders:
//     |gpu - cpu| <= 2e-5 * max(1, scale_mul) * max(1, |cpu|) (values are weighted means of N(0, 1) values; a
//     score's rounding error, hence each weight's relative error, grows with the scores' size).
//   tensor-core kernels (prefill: n_q > 32, kCausal or kFull; path mode on fp16 K/V: decode, chain verify,
//     trees of up to 128 nodes): q, k, v and the softmax weights p are rounded to f16
//     (unit roundoff u = 2^-11) before f32-accumulated products. A score then carries an error of about
//     scale * sum_d |q_d k_d| * 2u / sqrt(hd) ~ scale_mul * u (random signs), which moves the output by
//     sum_j w_j ds_j (v_j - o); v's and p's roundings add about u * sum_j w_j |v_j|. A CPU emulation of
//     exactly these roundings (hd 64/128/256, 1..1800 keys, scale_mul 1/2/4/8, ~10^6 elements) gave
//     at most 3.5u in the scaled measure below, so the bound is
//       |gpu - cpu| <= 8 * 2^-11 * max(1, scale_mul) * max(1, |cpu|)   (8u ~ 3.9e-3)
//     (measured on an H100 over two random seeds: at most 1.94e-3 ~ 4u, in TensorCorePrefillMatchesCpu's
//     scale_mul 4 cases).
//     Short contexts (n_prefix 0, 17; windows of 1..129 keys) keep a masking error (a key seen or missed
//     wrongly moves a weight by 1/keys) far above it. The same call must also give the same bits twice.
//     The prefill cases run on float32 K/V (attention_mma.cu's kernel), on fp16 K/V (attention_wgmma.cu's on
//     Hopper, with the same roundings) and, where the two differ, on fp16 K/V forced to attention_mma.cu's.
#include "ops/cuda/attention.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/attention_host.h"
#include "ops/cuda/attention_internal.h"
#include "ops/cuda/fill.h"
#include "support/cuda_test_util.h"
#include "support/test_paths.h"
#include "tensor/half.h"

namespace dflash {
namespace {

constexpr uint32_t kNaN = 0x7fc00000u;
constexpr int64_t kChunk = 64;
constexpr double kF32Tol = 2e-5;
constexpr double kF16Tol = 8.0 / 2048.0;  // 8u, u = 2^-11 (see the header)


// Device allocations freed on scope exit.
class Arena {
 public:
  ~Arena() {
    for (void* p : ptrs_) cudaFree(p);
  }
  template <typename T>
  T* alloc(size_t n) {
    void* p = nullptr;
    if (cudaMalloc(&p, sizeof(T) * (n == 0 ? 1 : n)) != cudaSuccess) return nullptr;
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  template <typename T>
  T* upload(const std::vector<T>& v) {
    T* p = alloc<T>(v.size());
    if (p && !v.empty() && cudaMemcpy(p, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice) != cudaSuccess)
      return nullptr;
    return p;
  }

 private:
  std::vector<void*> ptrs_;
};

struct Case {
  int64_t hd, nh, nkv, n_q, n_prefix;
  cpu::MaskKind kind;
  float scale_mul = 1.0f;   // scale = scale_mul / sqrt(hd)
  bool workspace = true;    // give attention() its preferred workspace
  int64_t extra_keys = 0;   // kFull: keys stored past n_prefix + n_q
  int64_t window = 0;       // kCausal: sliding window (0: none)
  bool f16_kv = false;      // K/V chunks in fp16 on the device (the reference reads the same values in f32)
  bool path_tc = false;     // DeviceAttnMask::path_tensor_cores (fp16 KV path mode on the tensor cores)
  cuda::AttnPrefillKernel prefill = cuda::AttnPrefillKernel::kTensorCore;  // kMmaSync: mma.sync on Hopper too
  std::string name() const {
    const char* k = kind == cpu::MaskKind::kCausal ? "causal" : (kind == cpu::MaskKind::kTree ? "tree" : "full");
    return std::string(k) + (window > 0 ? " window=" + std::to_string(window) : std::string()) + " hd=" + std::to_string(hd) + " nh=" + std::to_string(nh) + " nkv=" +
           std::to_string(nkv) + " n_q=" + std::to_string(n_q) + " n_prefix=" + std::to_string(n_prefix) +
           " scale_mul=" + std::to_string(scale_mul) + (workspace ? "" : " no-workspace") +
           (extra_keys ? " extra=" + std::to_string(extra_keys) : "") + (f16_kv ? " f16-kv" : "") +
           (path_tc ? " path-tc" : "") + (prefill == cuda::AttnPrefillKernel::kMmaSync ? " mma-sync" : "");
  }
};

// Calls that attention() runs on the tensor cores (attention.h): prefill-shaped ones (n_q > 32, kCausal or
// kFull), and path mode (a causal block of up to 32 queries without a window, a tree of up to 128 nodes) on
// fp16 K/V when the mask asks for it.
bool tensor_core_path(const Case& c) {
  if (c.n_q > 32 && c.kind != cpu::MaskKind::kTree) return true;
  const bool path = (c.kind == cpu::MaskKind::kTree && c.n_q <= cuda::kMaxPathQueries) ||
                    (c.kind == cpu::MaskKind::kCausal && c.window == 0 && c.n_q <= 32);
  return path && c.f16_kv && c.path_tc;
}

class AttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::cuda_device_present()) DF_SKIP_LOUDLY("no CUDA device");
    const char* s = std::getenv("DFLASH_TEST_SEED");
    seed_ = s ? static_cast<uint32_t>(std::strtoul(s, nullptr, 10)) : std::random_device{}();
    rng_.seed(seed_);
  }
  std::string seed_note() const {
    return "seed " + std::to_string(seed_) + " (rerun with DFLASH_TEST_SEED=" + std::to_string(seed_) + ")";
  }
  std::vector<float> normal(size_t n) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }

  // Runs one case on both sides and compares; returns the largest scaled error.
  void run_case(const Case& c) {
    SCOPED_TRACE(c.name());
    const int64_t n_tokens = c.n_prefix + c.n_q + c.extra_keys;
    const int64_t n_chunks = (n_tokens + kChunk - 1) / kChunk;
    const size_t chunk_elems = static_cast<size_t>(kChunk * c.nkv * c.hd);
    std::vector<std::vector<float>> kc, vc;
    for (int64_t ch = 0; ch < n_chunks; ++ch) {
      kc.push_back(normal(chunk_elems));
      vc.push_back(normal(chunk_elems));
      if (c.f16_kv)  // what an fp16 store holds: the reference reads the same numbers
        for (auto* v : {&kc.back(), &vc.back()})
          for (float& x : *v) x = fp16_to_fp32(fp32_to_fp16(x));
    }
    const auto q = normal(static_cast<size_t>(c.n_q * c.nh * c.hd));
    std::vector<int32_t> parents;
    if (c.kind == cpu::MaskKind::kTree) {
      parents.resize(static_cast<size_t>(c.n_q));
      for (int64_t i = 0; i < c.n_q; ++i) {
        // Mostly chains with branches; some extra roots.
        std::uniform_int_distribution<int32_t> d(-1, static_cast<int32_t>(i) - 1);
        parents[i] = i == 0 ? -1 : (rng_() % 3 == 0 ? d(rng_) : static_cast<int32_t>(i - 1));
      }
    }
    const float scale = c.scale_mul / std::sqrt(static_cast<float>(c.hd));

    // CPU reference.
    std::vector<const float*> kp, vp;
    for (int64_t ch = 0; ch < n_chunks; ++ch) {
      kp.push_back(kc[ch].data());
      vp.push_back(vc[ch].data());
    }
    cpu::KvView kv{kp, vp, kChunk, n_tokens, c.nkv, c.hd};
    cpu::AttentionMask mask{c.kind, c.n_prefix, parents, c.window};
    std::vector<float> want(q.size());
    ThreadPool pool(4);
    cpu::attention(q.data(), c.n_q, c.nh, kv, mask, scale, want.data(), pool);

    // Device: each chunk its own allocation, tables of chunk pointers.
    Arena arena;
    std::vector<const float*> dk, dv;
    const auto halves = [](const std::vector<float>& v) {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = fp32_to_fp16(v[i]);
      return h;
    };
    for (int64_t ch = 0; ch < n_chunks; ++ch) {
      if (c.f16_kv) {
        dk.push_back(reinterpret_cast<const float*>(arena.upload(halves(kc[ch]))));
        dv.push_back(reinterpret_cast<const float*>(arena.upload(halves(vc[ch]))));
      } else {
        dk.push_back(arena.upload(kc[ch]));
        dv.push_back(arena.upload(vc[ch]));
      }
      ASSERT_NE(dk.back(), nullptr);
      ASSERT_NE(dv.back(), nullptr);
    }
    cuda::DeviceKvView dkv;
    dkv.k_chunks = arena.upload(dk);
    dkv.v_chunks = arena.upload(dv);
    dkv.chunk_tokens = kChunk;
    dkv.n_tokens = n_tokens;
    dkv.n_kv_heads = c.nkv;
    dkv.head_dim = c.hd;
    dkv.f16 = c.f16_kv;
    cuda::DeviceAttnMask dmask;
    dmask.kind = cuda::to_device(c.kind);
    dmask.n_prefix = c.n_prefix;
    dmask.window = c.window;
    dmask.path_tensor_cores = c.path_tc;
    if (c.kind == cpu::MaskKind::kTree) dmask.parents = arena.upload(parents);
    const float* dq = arena.upload(q);
    float* dout = arena.alloc<float>(q.size());
    ASSERT_NE(dq, nullptr);
    ASSERT_NE(dout, nullptr);
    DF_ASSERT_CUDA(cuda::fill_u32(reinterpret_cast<uint32_t*>(dout), q.size(), kNaN));
    const size_t ws_bytes = c.workspace ? cuda::attention_workspace_bytes_with(c.prefill, c.n_q, c.nh, dkv, dmask) : 0;
    void* ws = ws_bytes ? arena.alloc<uint8_t>(ws_bytes) : nullptr;
    if (ws_bytes) DF_ASSERT_CUDA(cuda::fill_u32(static_cast<uint32_t*>(ws), ws_bytes / 4, kNaN));
    const Status st = cuda::attention_checked(dq, c.n_q, c.nh, dkv, dmask, scale, dout, ws, ws_bytes, nullptr, c.prefill);
    ASSERT_TRUE(st.ok()) << st.message();
    DF_ASSERT_CUDA(cudaDeviceSynchronize());
    std::vector<float> got(q.size());
    DF_ASSERT_CUDA(cudaMemcpy(got.data(), dout, sizeof(float) * got.size(), cudaMemcpyDeviceToHost));
    if (c.n_q <= 32) {
      // Lengths read on the device (a replayed step's) give the same launch and bit-identical output,
      // whatever the host-side fields say.
      const std::vector<int32_t> lengths = {static_cast<int32_t>(c.n_prefix), static_cast<int32_t>(n_tokens)};
      cuda::DeviceAttnMask dyn = dmask;
      dyn.lengths = arena.upload(lengths);
      dyn.n_prefix = 0;
      DF_ASSERT_CUDA(cuda::fill_u32(reinterpret_cast<uint32_t*>(dout), q.size(), kNaN));
      // Poisoned again: a partial the call leaves unwritten must not pass on the first call's bits.
      if (ws_bytes) DF_ASSERT_CUDA(cuda::fill_u32(static_cast<uint32_t*>(ws), ws_bytes / 4, kNaN));
      ASSERT_EQ(cuda::attention_workspace_bytes(c.n_q, c.nh, dkv, dyn),
                cuda::attention_workspace_bytes(c.n_q, c.nh, dkv, dmask));
      const Status st2 = cuda::attention_checked(dq, c.n_q, c.nh, dkv, dyn, scale, dout, ws, ws_bytes);
      ASSERT_TRUE(st2.ok()) << st2.message();
      DF_ASSERT_CUDA(cudaDeviceSynchronize());
      std::vector<float> got2(q.size());
      DF_ASSERT_CUDA(cudaMemcpy(got2.data(), dout, sizeof(float) * got2.size(), cudaMemcpyDeviceToHost));
      EXPECT_EQ(std::memcmp(got.data(), got2.data(), sizeof(float) * got.size()), 0)
          << c.name() << ": lengths on the device changed the output";
    }
    const bool f16 = tensor_core_path(c);
    if (f16) {
      // Deterministic: the same call again gives the same bits.
      DF_ASSERT_CUDA(cuda::fill_u32(reinterpret_cast<uint32_t*>(dout), q.size(), kNaN));
      if (ws_bytes) DF_ASSERT_CUDA(cuda::fill_u32(static_cast<uint32_t*>(ws), ws_bytes / 4, kNaN));
      const Status st2 =
          cuda::attention_checked(dq, c.n_q, c.nh, dkv, dmask, scale, dout, ws, ws_bytes, nullptr, c.prefill);
      ASSERT_TRUE(st2.ok()) << st2.message();
      std::vector<float> got2(q.size());
      DF_ASSERT_CUDA(cudaMemcpy(got2.data(), dout, sizeof(float) * got2.size(), cudaMemcpyDeviceToHost));
      EXPECT_EQ(std::memcmp(got.data(), got2.data(), sizeof(float) * got.size()), 0)
          << c.name() << ": a second run gave other bits";
    }
    const double tol = f16 ? kF16Tol : kF32Tol;

    int bad = 0;
    double worst = 0.0;
    for (size_t e = 0; e < got.size(); ++e) {
      const double g = got[e], w = want[e];
      const double err = std::fabs(g - w) / std::max(1.0, std::fabs(w)) / std::max(1.0f, c.scale_mul);
      if (!(err <= tol)) {
        if (bad++ < 5) {
          const int64_t d = e % c.hd, h = (e / c.hd) % c.nh, i = e / (c.hd * c.nh);
          ADD_FAILURE() << "MISMATCH " << c.name() << " query " << i << " head " << h << " dim " << d << ": got "
                        << g << ", want " << w << "; " << seed_note();
        }
      } else {
        worst = std::max(worst, err);
      }
    }
    EXPECT_EQ(bad, 0) << c.name() << ": " << bad << " of " << got.size() << " differ (tolerance " << tol
                      << "); " << seed_note();
    (f16 ? worst_f16_ : worst_) = std::max(f16 ? worst_f16_ : worst_, worst);
  }

  // A prefill-shaped case on float32 K/V (attn_mma_kernel), on fp16 K/V (attn_wgmma_kernel where
  // wgmma_available(), else attn_mma_kernel), and on fp16 K/V forced to attn_mma_kernel where they differ.
  void run_each_prefill_kernel(Case c) {
    c.f16_kv = false;
    run_case(c);
    c.f16_kv = true;
    run_case(c);
    if (cuda::attn_mma::wgmma_available()) {
      c.prefill = cuda::AttnPrefillKernel::kMmaSync;
      run_case(c);
    }
  }

  void print_worst(const char* what) const {
    std::printf("attention (%s): worst scaled error f32 kernels %.3g (of %.3g), tensor-core kernels %.3g (of %.3g)\n",
                what, worst_, kF32Tol, worst_f16_, kF16Tol);
  }

  uint32_t seed_ = 0;
  std::mt19937 rng_;
  double worst_ = 0.0;      // f32 kernel cases
  double worst_f16_ = 0.0;  // tensor-core cases
};

TEST_F(AttentionTest, MatchesCpuAcrossShapesAndMasks) {
  SCOPED_TRACE(seed_note());
  const int64_t gqa[][2] = {{4, 4}, {4, 2}, {8, 2}, {12, 2}};  // groups 1, 2, 4, 6
  std::uniform_int_distribution<int64_t> prefix(0, 300);
  for (int64_t hd : {64, 128, 256})
    for (const auto& g : gqa)
      for (int64_t n_q : {1, 5, 16, 100})
        for (cpu::MaskKind kind : {cpu::MaskKind::kCausal, cpu::MaskKind::kTree, cpu::MaskKind::kFull}) {
          Case c{hd, g[0], g[1], n_q, prefix(rng_), kind};
          if (kind == cpu::MaskKind::kFull && n_q == 5) c.extra_keys = 37;
          run_case(c);
          if (HasFatalFailure()) return;
        }
  print_worst("shapes and masks");
}

// fp16 K/V chunks: every kernel shape (decode, path mode, trees, the tensor-core prefill) reads them exactly,
// so the bounds of the f32 chunks hold against the reference on the same (fp16-valued) numbers.
TEST_F(AttentionTest, Fp16KvChunksMatchCpu) {
  SCOPED_TRACE(seed_note());
  std::uniform_int_distribution<int64_t> prefix(0, 300);
  for (int64_t hd : {64, 128, 256})
    for (int64_t n_q : {1, 5, 16, 100, 300})
      for (cpu::MaskKind kind : {cpu::MaskKind::kCausal, cpu::MaskKind::kTree, cpu::MaskKind::kFull}) {
        Case c{hd, 8, 2, n_q, prefix(rng_), kind};
        c.f16_kv = true;
        if (kind == cpu::MaskKind::kCausal && n_q == 100) c.window = 37;
        for (const bool tc : {false, true}) {  // path mode on either kernel
          c.path_tc = tc;
          run_case(c);
          if (HasFatalFailure()) return;
        }
      }
  print_worst("fp16 KV");
}

TEST_F(AttentionTest, NoPrefixAndSharpScores) {
  SCOPED_TRACE(seed_note());
  for (int64_t hd : {64, 128, 256})
    for (cpu::MaskKind kind : {cpu::MaskKind::kCausal, cpu::MaskKind::kTree, cpu::MaskKind::kFull}) {
      run_case({hd, 8, 4, 100, 0, kind});
      run_case({hd, 6, 1, 16, 0, kind, 8.0f});   // scores ~ N(0, 64): the running max matters
      run_case({hd, 6, 1, 130, 64, kind, 8.0f});
    }
  print_worst("sharp");
}

// A causal sliding window (DFlash drafts' sliding-window layers): windows shorter than a tile, about one, and
// past the context; a block of queries behind a prefix (the draft's shape), and decode with split keys.
TEST_F(AttentionTest, CausalSlidingWindow) {
  SCOPED_TRACE(seed_note());
  for (int64_t hd : {64, 128})
    for (int64_t window : {1, 7, 64, 100, 5000}) {
      Case c{hd, 8, 2, 16, 300, cpu::MaskKind::kCausal};
      c.window = window;
      run_case(c);
      Case d{hd, 8, 2, 1, 4099, cpu::MaskKind::kCausal};
      d.window = window;
      run_case(d);
      Case e{hd, 4, 4, 100, 0, cpu::MaskKind::kCausal};
      e.window = window;
      run_case(e);
      if (HasFatalFailure()) return;
    }
  print_worst("sliding window");
}

// Long contexts: the decode kernel splits the keys across blocks and merges; prefill splits when its
// grid is small. Also without workspace (no split), with the prefix at a chunk boundary, GQA groups of 12
// and 20 (the decode kernel's widest blocks, and two blocks a query) and fp16 chunks.
TEST_F(AttentionTest, LongContextSplitK) {
  SCOPED_TRACE(seed_note());
  for (int64_t hd : {64, 128, 256}) {
    run_case({hd, 8, 2, 1, 5000, cpu::MaskKind::kCausal});
    run_case({hd, 24, 4, 1, 4099, cpu::MaskKind::kCausal});
    run_case({hd, 24, 4, 1, 4099, cpu::MaskKind::kCausal, 1.0f, false});
    run_case({hd, 16, 2, 16, 3000, cpu::MaskKind::kTree});
    run_case({hd, 16, 2, 5, 2048, cpu::MaskKind::kCausal});
    run_case({hd, 16, 2, 16, 2047, cpu::MaskKind::kFull});
    run_case({hd, 4, 1, 100, 2500, cpu::MaskKind::kCausal});
    run_case({hd, 4, 1, 33, 3333, cpu::MaskKind::kTree, 4.0f});
    run_case({hd, 24, 2, 1, 4099, cpu::MaskKind::kCausal});  // group 12: the decode kernel's 16-row blocks
    run_case({hd, 40, 2, 5, 3000, cpu::MaskKind::kTree});    // group 20: two blocks a query
    Case h{hd, 32, 8, 1, 5000, cpu::MaskKind::kCausal};
    h.f16_kv = true;
    run_case(h);
  }
  print_worst("long");
}

// The tensor-core prefill kernel (n_q > 32; causal with a prefix, causal with a sliding window, full with
// keys stored past the queries): every (n_q, n_prefix) of {33, 100, 300, 1000} x {0, 17, 700} for each head
// dim and mask, the GQA group (1, 2, 4, 6, 8) rotating through them; some with sharp scores, some without
// workspace (one key range: no split).
TEST_F(AttentionTest, TensorCorePrefillMatchesCpu) {
  SCOPED_TRACE(seed_note());
  const int64_t gqa[][2] = {{2, 2}, {4, 2}, {8, 2}, {6, 1}, {8, 1}};  // groups 1, 2, 4, 6, 8
  const int64_t n_qs[] = {33, 100, 300, 1000};
  const int64_t prefixes[] = {0, 17, 700};
  const int64_t windows[] = {1, 50, 64, 129, 400};
  int k = 0;
  for (int64_t hd : {64, 128, 256})
    for (int mi = 0; mi < 3; ++mi)
      for (int64_t n_q : n_qs)
        for (int64_t n_prefix : prefixes) {
          const auto& g = gqa[k % 5];
          Case c{hd, g[0], g[1], n_q, n_prefix, mi == 2 ? cpu::MaskKind::kFull : cpu::MaskKind::kCausal};
          if (mi == 1) c.window = windows[k % 5];
          if (mi == 2) c.extra_keys = k % 2 ? 37 : 100;
          if (k % 4 == 3) c.scale_mul = 4.0f;
          if (k % 7 == 5) c.workspace = false;
          ++k;
          ASSERT_TRUE(tensor_core_path(c));
          run_each_prefill_kernel(c);
          if (HasFatalFailure()) return;
        }
  print_worst("tensor-core prefill");
}

// Split-K on the tensor-core kernel: few queries behind a long prefix (most of the grid in key ranges),
// with and without a window that leaves some ranges empty.
TEST_F(AttentionTest, TensorCorePrefillSplitK) {
  SCOPED_TRACE(seed_note());
  for (int64_t hd : {64, 128, 256}) {
    run_each_prefill_kernel({hd, 8, 1, 40, 6000, cpu::MaskKind::kCausal});
    Case w{hd, 4, 2, 64, 5000, cpu::MaskKind::kCausal};
    w.window = 300;
    run_each_prefill_kernel(w);
    Case f{hd, 6, 2, 50, 3000, cpu::MaskKind::kFull};
    f.extra_keys = 11;
    run_each_prefill_kernel(f);
    if (HasFatalFailure()) return;
  }
  print_worst("tensor-core split-K");
}

// A verify step's queries against plain decoding, bit for bit: chain (causal, n_q <= 32) and tree queries
// (up to 128 nodes) each equal a one-token causal call whose keys are the prefix and the query's path laid
// out in order (what plain decoding of that path stored), at prefixes that split the keys and ones that
// do not (and chains whose queries straddle a step of the keys-per-split rounding), on float32 chunks and
// on fp16 chunks with either path kernel. Path mode (attention.h) is what makes DFlash lossless on the GPU; a
// tolerance would not do.
TEST_F(AttentionTest, VerifyQueriesEqualPlainDecodeBitForBit) {
  SCOPED_TRACE(seed_note());
  struct Shape {
    int64_t hd, nh, nkv, n_q, n_prefix;
    cpu::MaskKind kind;
    bool f16 = false;  // fp16 chunks
    bool tc = false;   // fp16 chunks on the tensor-core path kernel
  };
  // n_prefix -1: the queries straddle a step of the keys-per-split rounding (some queries' split ranges
  // differ from the others': the tensor-core kernel's second pass).
  const Shape base[] = {
      {128, 32, 8, 16, 1000, cpu::MaskKind::kCausal}, {128, 32, 8, 23, 1000, cpu::MaskKind::kTree},
      {256, 24, 4, 23, 4099, cpu::MaskKind::kTree},   {64, 8, 2, 41, 70, cpu::MaskKind::kTree},
      {128, 16, 2, 128, 300, cpu::MaskKind::kTree},   {128, 4, 4, 17, 0, cpu::MaskKind::kCausal},
      {64, 40, 2, 9, 5, cpu::MaskKind::kTree},  // group 20: two row blocks a query
      {128, 32, 8, 16, -1, cpu::MaskKind::kCausal},   {128, 32, 8, 23, -1, cpu::MaskKind::kTree},
      {256, 24, 4, 23, -1, cpu::MaskKind::kCausal},   {128, 40, 8, 32, 2000, cpu::MaskKind::kCausal},
      // Several row blocks on the tensor cores, one block a split taking them in turn: 16 queries (two row
      // blocks), 23 at 6000 keys (three, a split's 192 keys streamed again for each). The straddling 27B shape
      // above has splits of at most 48 keys, which the ring holds whole: copied once for its row blocks.
      {256, 24, 4, 16, 4100, cpu::MaskKind::kCausal},  {256, 24, 4, 23, 6000, cpu::MaskKind::kCausal},
      {256, 24, 4, 23, 6000, cpu::MaskKind::kTree},
  };
  std::vector<Shape> shapes;
  for (const int kernel : {0, 1, 2})  // float32 K/V; fp16 on the float32 kernel; fp16 on the tensor cores
    for (Shape c : base) {
      c.f16 = kernel > 0;
      c.tc = kernel == 2;
      shapes.push_back(c);
    }
  for (Shape c : shapes) {
    if (c.n_prefix < 0) {
      // The split count of this shape's decode (its workspace: n_splits partials of n_heads rows), then the
      // first rounding step past 1000 keys: kend = n_splits * tile * m + 1.
      cuda::DeviceKvView probe{reinterpret_cast<const float* const*>(8), reinterpret_cast<const float* const*>(8),
                               kChunk, 1 << 20, c.nkv, c.hd, c.f16};
      const size_t per_split = sizeof(float) * static_cast<size_t>(c.nh * (c.hd + 2));
      const int64_t splits = static_cast<int64_t>(cuda::attention_workspace_bytes(1, c.nh, probe, {}) / per_split);
      const int tile = c.hd >= 256 ? 16 : 32;
      int64_t step = 1001;
      while (cuda::decode_keys_per_split(step, static_cast<int>(splits), tile) ==
             cuda::decode_keys_per_split(step - 1, static_cast<int>(splits), tile))
        ++step;
      c.n_prefix = step - 1 - c.n_q / 2;  // query i sees n_prefix + i + 1 keys (a chain's depth)
    }
    SCOPED_TRACE("hd=" + std::to_string(c.hd) + " nh=" + std::to_string(c.nh) + " nkv=" + std::to_string(c.nkv) +
                 " n_q=" + std::to_string(c.n_q) + " n_prefix=" + std::to_string(c.n_prefix) + (c.f16 ? " f16" : "") +
                 (c.tc ? " tensor cores" : ""));
    const size_t tok = static_cast<size_t>(c.nkv * c.hd), row = static_cast<size_t>(c.nh * c.hd);
    const int64_t n_tokens = c.n_prefix + c.n_q;
    const auto keys = normal(static_cast<size_t>(n_tokens) * tok), vals = normal(static_cast<size_t>(n_tokens) * tok);
    const auto q = normal(static_cast<size_t>(c.n_q) * row);
    std::vector<int32_t> parents(static_cast<size_t>(c.n_q));
    for (int64_t i = 0; i < c.n_q; ++i) {
      std::uniform_int_distribution<int32_t> d(-1, static_cast<int32_t>(i) - 1);
      parents[i] = c.kind == cpu::MaskKind::kCausal || i == 0 || rng_() % 3 != 0 ? static_cast<int32_t>(i - 1) : d(rng_);
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    Arena arena;
    // Keys `order` (token indices into keys/vals) stored in 64-token chunks; runs one call.
    auto run = [&](const std::vector<int64_t>& order, const float* dq, int64_t n_q, const cuda::DeviceAttnMask& m,
                   std::vector<float>* out) {
      const int64_t n = static_cast<int64_t>(order.size()), n_chunks = (n + kChunk - 1) / kChunk;
      std::vector<const float*> dk, dv;
      for (int64_t ch = 0; ch < n_chunks; ++ch) {
        std::vector<float> kc(kChunk * tok, 0.0f), vc(kChunk * tok, 0.0f);
        for (int64_t t = ch * kChunk; t < std::min(n, (ch + 1) * kChunk); ++t) {
          std::copy_n(keys.begin() + order[t] * tok, tok, kc.begin() + (t - ch * kChunk) * tok);
          std::copy_n(vals.begin() + order[t] * tok, tok, vc.begin() + (t - ch * kChunk) * tok);
        }
        if (c.f16) {
          std::vector<uint16_t> kh(kc.size()), vh(vc.size());
          for (size_t e = 0; e < kc.size(); ++e) kh[e] = fp32_to_fp16(kc[e]);
          for (size_t e = 0; e < vc.size(); ++e) vh[e] = fp32_to_fp16(vc[e]);
          dk.push_back(reinterpret_cast<const float*>(arena.upload(kh)));
          dv.push_back(reinterpret_cast<const float*>(arena.upload(vh)));
        } else {
          dk.push_back(arena.upload(kc));
          dv.push_back(arena.upload(vc));
        }
      }
      cuda::DeviceKvView dkv{arena.upload(dk), arena.upload(dv), kChunk, n, c.nkv, c.hd, c.f16};
      float* dout = arena.alloc<float>(static_cast<size_t>(n_q) * row);
      ASSERT_NE(dout, nullptr);
      DF_ASSERT_CUDA(cuda::fill_u32(reinterpret_cast<uint32_t*>(dout), static_cast<size_t>(n_q) * row, kNaN));
      const size_t ws_bytes = cuda::attention_workspace_bytes(n_q, c.nh, dkv, m);
      void* ws = ws_bytes ? arena.alloc<uint8_t>(ws_bytes) : nullptr;
      if (ws_bytes) DF_ASSERT_CUDA(cuda::fill_u32(static_cast<uint32_t*>(ws), ws_bytes / 4, kNaN));
      const Status st = cuda::attention_checked(dq, n_q, c.nh, dkv, m, scale, dout, ws, ws_bytes);
      ASSERT_TRUE(st.ok()) << st.message();
      out->resize(static_cast<size_t>(n_q) * row);
      DF_ASSERT_CUDA(cudaMemcpy(out->data(), dout, sizeof(float) * out->size(), cudaMemcpyDeviceToHost));
    };
    std::vector<int64_t> all(static_cast<size_t>(n_tokens));
    for (int64_t t = 0; t < n_tokens; ++t) all[t] = t;
    cuda::DeviceAttnMask vm;
    vm.kind = cuda::to_device(c.kind);
    vm.n_prefix = c.n_prefix;
    vm.path_tensor_cores = c.tc;
    if (c.kind == cpu::MaskKind::kTree) vm.parents = arena.upload(parents);
    const float* dq = arena.upload(q);
    std::vector<float> verify;
    run(all, dq, c.n_q, vm, &verify);
    if (HasFatalFailure()) return;
    int bad = 0;
    for (int64_t i = 0; i < c.n_q; ++i) {
      std::vector<int64_t> path;
      for (int64_t a = i; a >= 0; a = parents[a]) path.push_back(c.n_prefix + a);
      std::vector<int64_t> order(all.begin(), all.begin() + c.n_prefix);
      order.insert(order.end(), path.rbegin(), path.rend());
      cuda::DeviceAttnMask dm;  // plain decoding: one causal query at the last position
      dm.n_prefix = static_cast<int64_t>(order.size()) - 1;
      dm.path_tensor_cores = c.tc;
      std::vector<float> one;
      run(order, dq + i * row, 1, dm, &one);
      if (HasFatalFailure()) return;
      if (std::memcmp(one.data(), verify.data() + i * row, sizeof(float) * row) != 0 && bad++ < 3)
        ADD_FAILURE() << "query " << i << " (depth " << path.size() - 1 << ") differs from plain decoding; "
                      << seed_note();
    }
    EXPECT_EQ(bad, 0) << bad << " of " << c.n_q << " queries differ";
  }
}

// No stored key: every query sees nothing and gets zeros (not NaN).
TEST_F(AttentionTest, NoKeysGivesZeros) {
  SCOPED_TRACE(seed_note());
  Arena arena;
  const int64_t n_q = 3, nh = 4, hd = 128;
  const auto q = normal(static_cast<size_t>(n_q * nh * hd));
  const float* dq = arena.upload(q);
  float* dout = arena.alloc<float>(q.size());
  DF_ASSERT_CUDA(cuda::fill_u32(reinterpret_cast<uint32_t*>(dout), q.size(), kNaN));
  cuda::DeviceKvView kv;
  kv.n_tokens = 0;
  kv.n_kv_heads = 2;
  kv.head_dim = hd;
  cuda::DeviceAttnMask mask;
  ASSERT_TRUE(cuda::attention_checked(dq, n_q, nh, kv, mask, 0.1f, dout).ok());
  std::vector<float> got(q.size());
  DF_ASSERT_CUDA(cudaMemcpy(got.data(), dout, sizeof(float) * got.size(), cudaMemcpyDeviceToHost));
  for (float v : got) ASSERT_EQ(v, 0.0f);
}

TEST_F(AttentionTest, RejectsBadArguments) {
  Arena arena;
  float* buf = arena.alloc<float>(1024);
  const float* const* table = reinterpret_cast<const float* const*>(arena.alloc<uint64_t>(4));
  cuda::DeviceKvView kv{table, table, 64, 10, 2, 128};
  cuda::DeviceAttnMask mask;
  EXPECT_FALSE(cuda::attention_checked(buf, 1, 3, kv, mask, 1.0f, buf + 512).ok());  // 3 % 2 != 0
  kv.head_dim = 96;
  EXPECT_FALSE(cuda::attention_checked(buf, 1, 4, kv, mask, 1.0f, buf + 512).ok());
  kv.head_dim = 128;
  mask.n_prefix = 11;
  EXPECT_FALSE(cuda::attention_checked(buf, 1, 4, kv, mask, 1.0f, buf + 512).ok());
  mask.n_prefix = 0;
  mask.kind = cuda::AttnMaskKind::kTree;
  EXPECT_FALSE(cuda::attention_checked(buf, 1, 4, kv, mask, 1.0f, buf + 512).ok());
  EXPECT_EQ(cuda::attention(buf, 1, 4, kv, mask, 1.0f, buf + 512, nullptr, 0), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace dflash

// bench_cuda_attention: device attention (ops/cuda/attention.h).
//
//   bench_cuda_attention [--quick] [--no-old] [--old simt|mma-sync] [--sizes 512,4096,...] [--kv f32|f16]
//   bench_cuda_attention --decode [--sizes ...] [--tuning] [--shape S] [--kv f32|f16] [--nq 1|16|23|33]
//
// Prefill (default): causal prefill attention, the tensor-core kernel that attention() runs for n_q > 32
// beside the float32 kernel that ran those calls before it (attention_internal.h: AttnPrefillKernel::kSimt), or
// (--old mma-sync) beside the mma.sync kernel (kMmaSync: on Hopper with fp16 K/V, the kernel wgmma replaced).
// Shapes: Qwen3-8B (32 query heads, 8 KV heads, head_dim 128) and Qwen3.5-27B's attention layers (24 / 4,
// head_dim 256); n_q = n_keys = n (a prompt's prefill from an empty cache), n in 512, 4096, 16384, 32768
// (--quick: 4096; --sizes: a comma-separated list). K/V in 64-token chunks of one buffer, as KvStore keeps
// them, float32 or (--kv f16) fp16. Figure: FLOPs = 4 * n_heads * head_dim * visible (query, key) pairs
// (n (n + 1) / 2 under the causal mask: q.k and p.v, two FLOPs a multiply-add), over the median device time
// of a call (each call timed alone with events; the f32 kernel's calls are repeated fewer times at long
// contexts). "rel diff" is max |new - old| / max(1, |old|) over the outputs: the tensor-core kernel's f16
// rounding, a sanity check.
//
// --decode: the path-mode kernels at the same shapes: one query (decode), 16 and 23 (chain verifies; 23 = a
// DDTree of budget 22) after n cached keys (default 512, 4096, 32768), K/V float32 (attention_decode.cu's
// float32 kernel, "f32") and fp16 (the tensor-core kernel of attention_decode_mma.cu, "mma", and the float32
// kernel beside it); and 33 queries, the fewest the prefill kernel takes. Each call reads its own copy of the KV
// (copies enough for 256 MiB, more than the L2, as successive layers do), calls recorded in a CUDA
// graph (as a replayed step runs them). Figure: KV bytes a call must read (the prefix once per call) over its
// time, beside the device's copy rate. --tuning repeats the table for split factors 1-3 (splits = factor *
// SMs / blocks of one query), the knob attn_decode::tuning() that only benchmarks turn.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/attention_internal.h"

namespace {

// Fills n device elements (float or __half) with a repeated block of pseudo-random values in [-2, 2).
template <typename E>
void fill_random(E* dst, size_t n, uint32_t seed) {
  constexpr size_t kBlock = size_t{1} << 22;
  std::vector<E> host(std::min(n, kBlock));
  uint64_t s = 0x9e3779b97f4a7c15ull * (seed + 1);
  for (E& x : host) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = E(static_cast<float>(static_cast<int32_t>(s >> 32)) * (2.0f / 2147483648.0f));
  }
  for (size_t off = 0; off < n; off += host.size())
    CHECK(cudaMemcpy(dst + off, host.data(), sizeof(E) * std::min(host.size(), n - off), cudaMemcpyHostToDevice));
}

// Random K and V of n tokens in chunks of 64 (float32 or fp16 elements), and the device chunk tables.
struct Kv {
  void* k = nullptr;
  void* v = nullptr;
  const float** table = nullptr;
  dflash::cuda::DeviceKvView view;
  Kv(int64_t n, int64_t nkv, int64_t hd, bool f16, uint32_t seed) {
    constexpr int64_t kChunk = 64;
    const int64_t n_chunks = (n + kChunk - 1) / kChunk;
    const size_t chunk_elems = static_cast<size_t>(kChunk * nkv * hd), es = f16 ? 2 : 4;
    CHECK(cudaMalloc(&k, es * chunk_elems * n_chunks));
    CHECK(cudaMalloc(&v, es * chunk_elems * n_chunks));
    if (f16) {
      fill_random(static_cast<__half*>(k), chunk_elems * n_chunks, seed);
      fill_random(static_cast<__half*>(v), chunk_elems * n_chunks, seed + 1);
    } else {
      fill_random(static_cast<float*>(k), chunk_elems * n_chunks, seed);
      fill_random(static_cast<float*>(v), chunk_elems * n_chunks, seed + 1);
    }
    std::vector<const float*> t;
    for (void* base : {k, v})
      for (int64_t c = 0; c < n_chunks; ++c)
        t.push_back(reinterpret_cast<const float*>(static_cast<const char*>(base) + es * chunk_elems * c));
    CHECK(cudaMalloc(&table, sizeof(float*) * t.size()));
    CHECK(cudaMemcpy(table, t.data(), sizeof(float*) * t.size(), cudaMemcpyHostToDevice));
    view = dflash::cuda::DeviceKvView{table, table + n_chunks, kChunk, n, nkv, hd, f16};
  }
  ~Kv() {
    CHECK(cudaFree(k));
    CHECK(cudaFree(v));
    CHECK(cudaFree(table));
  }
  Kv(const Kv&) = delete;
  Kv& operator=(const Kv&) = delete;
};

struct Shape {
  const char* name;
  int64_t nh, nkv, hd;
};
const Shape kShapes[] = {{"qwen3-8b", 32, 8, 128}, {"qwen3.5-27b", 24, 4, 256}};
const char* g_shape = nullptr;  // --shape: only this one
int64_t g_nq = 0;                // --decode --nq N: only calls of N queries
int g_kv = -1;                   // --kv: only this K/V type (1: fp16, 0: float32; -1: both in --decode)
bool skip_shape(const Shape& s) { return g_shape != nullptr && std::strcmp(g_shape, s.name) != 0; }

// The --decode table (see the header).
void decode_table(const std::vector<int64_t>& sizes, bool tuning) {
  namespace cu = dflash::cuda;
  const double copy_rate = bench::device_copy_rate();
  std::vector<int> variants = {cu::attn_decode::tuning().split_factor};
  if (tuning) variants = {1, 2, 3};
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreate(&stream));
  std::printf("%-12s %6s %4s %6s %5s %5s %6s %10s %9s %8s\n", "shape", "ctx", "kv", "kernel", "n_q", "split",
              "splits", "us/call", "GB/s", "of copy");
  for (const Shape& s : kShapes)
    for (int64_t n : sizes)
      for (bool f16 : {false, true}) {
        if (skip_shape(s) || (g_kv >= 0 && g_kv != static_cast<int>(f16))) continue;
        const size_t kv_bytes = static_cast<size_t>(n * s.nkv * s.hd) * 2 * (f16 ? 2 : 4);
        const int copies = static_cast<int>(std::max<size_t>(1, ((size_t{256} << 20) + kv_bytes - 1) / kv_bytes));
        std::vector<std::unique_ptr<Kv>> kvs;
        for (int c = 0; c < copies; ++c) kvs.push_back(std::make_unique<Kv>(n + 32, s.nkv, s.hd, f16, 7 + 2 * c));
        for (int64_t n_q : {int64_t{1}, int64_t{16}, int64_t{23}, int64_t{33}}) {
          if (g_nq > 0 && n_q != g_nq) continue;
          const size_t q_elems = static_cast<size_t>(n_q * s.nh * s.hd);
          float *q = nullptr, *out = nullptr;
          CHECK(cudaMalloc(&q, sizeof(float) * q_elems));
          CHECK(cudaMalloc(&out, sizeof(float) * q_elems));
          fill_random(q, q_elems, 1);
          cu::DeviceAttnMask mask;
          mask.n_prefix = n;
          const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
          for (const int split_factor : variants)
            for (const bool tc : {true, false}) {
              // The tensor-core path kernel takes fp16 K/V; 33 queries run the prefill kernel either way.
              if ((tc && !f16) || (!tc && f16 && n_q > 32)) continue;
              cu::attn_decode::tuning().split_factor = split_factor;
              mask.path_tensor_cores = tc;
              cu::DeviceKvView view = kvs[0]->view;
              view.n_tokens = n + n_q;
              const size_t ws_bytes = cu::attention_workspace_bytes(n_q, s.nh, view, mask);
              void* ws = nullptr;
              if (ws_bytes > 0) CHECK(cudaMalloc(&ws, ws_bytes));
              const float ms = bench::graph_ms(stream, 4 * copies, [&](cudaStream_t st, int r) {
                cu::DeviceKvView vr = kvs[r % copies]->view;
                vr.n_tokens = n + n_q;
                CHECK(cu::attention(q, n_q, s.nh, vr, mask, scale, out, ws, ws_bytes, st));
              });
              const size_t splits = ws_bytes == 0 ? 1 : ws_bytes / (sizeof(float) * q_elems / s.hd * (s.hd + 2));
              const double gbs = static_cast<double>(kv_bytes) / (ms * 1e-3) / 1e9;
              const char* kernel = n_q > 32 ? "prefill" : tc ? "mma" : "f32";
              std::printf("%-12s %6lld %4s %6s %5lld %5d %6zu %10.2f %9.0f %8.2f\n", s.name,
                          static_cast<long long>(n), f16 ? "f16" : "f32", kernel, static_cast<long long>(n_q),
                          cu::attn_decode::split_factor(s.hd), splits, ms * 1e3, gbs, gbs * 1e9 / copy_rate);
              std::fflush(stdout);
              if (ws) CHECK(cudaFree(ws));
            }
          CHECK(cudaFree(q));
          CHECK(cudaFree(out));
        }
      }
  CHECK(cudaStreamDestroy(stream));
}

}  // namespace

int main(int argc, char** argv) {
  using dflash::cuda::AttnPrefillKernel;
  bool with_old = true, decode = false, tuning = false, f16 = false, sizes_given = false;
  AttnPrefillKernel old_kernel = AttnPrefillKernel::kSimt;
  std::vector<int64_t> sizes = {512, 4096, 16384, 32768};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      sizes = {4096};
    } else if (std::strcmp(argv[i], "--no-old") == 0) {
      with_old = false;
    } else if (std::strcmp(argv[i], "--old") == 0 && i + 1 < argc &&
               (std::strcmp(argv[i + 1], "simt") == 0 || std::strcmp(argv[i + 1], "mma-sync") == 0)) {
      old_kernel = std::strcmp(argv[++i], "simt") == 0 ? AttnPrefillKernel::kSimt : AttnPrefillKernel::kMmaSync;
    } else if (std::strcmp(argv[i], "--decode") == 0) {
      decode = true;
    } else if (std::strcmp(argv[i], "--shape") == 0 && i + 1 < argc) {
      g_shape = argv[++i];
    } else if (std::strcmp(argv[i], "--tuning") == 0) {
      tuning = true;
    } else if (std::strcmp(argv[i], "--kv") == 0 && i + 1 < argc &&
               (std::strcmp(argv[i + 1], "f32") == 0 || std::strcmp(argv[i + 1], "f16") == 0)) {
      f16 = std::strcmp(argv[++i], "f16") == 0;
      g_kv = f16 ? 1 : 0;
    } else if (std::strcmp(argv[i], "--nq") == 0 && i + 1 < argc) {
      g_nq = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
      sizes.clear();
      sizes_given = true;
      for (const char* p = argv[++i]; *p != '\0';) {
        char* end = nullptr;
        const long v = std::strtol(p, &end, 10);
        if (end == p || v < 33 || v > (1 << 20) || (*end != ',' && *end != '\0')) {
          std::fprintf(stderr, "--sizes: a comma-separated list of token counts in [33, 2^20], not %s\n", argv[i]);
          return 2;
        }
        sizes.push_back(v);
        p = *end == ',' ? end + 1 : end;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--no-old] [--old simt|mma-sync] [--sizes 512,4096,...] [--kv f32|f16]\n"
                   "          [--shape qwen3-8b|qwen3.5-27b]\n"
                   "       %s --decode [--sizes ...] [--tuning] [--shape ...] [--kv f32|f16] [--nq 1|16|23|33]\n",
                   argv[0], argv[0]);
      return 2;
    }
  }
  if (decode) {
    if (!sizes_given) sizes = {512, 4096, 32768};
    decode_table(sizes, tuning);
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; K/V %s\n", prop.name, prop.multiProcessorCount, f16 ? "fp16" : "float32");
  std::printf("%-12s %6s %6s %3s %10s %9s %8s %9s %8s %8s %10s\n", "shape", "n", "heads", "hd", "old ms", "old TF/s",
              "new ms", "new TF/s", "splits", "speedup", "rel diff");
  for (const Shape& s : kShapes)
    for (int64_t n : sizes) {
      if (skip_shape(s)) continue;
      const size_t q_elems = static_cast<size_t>(n * s.nh * s.hd);
      float *q = nullptr, *out_new = nullptr, *out_old = nullptr;
      CHECK(cudaMalloc(&q, sizeof(float) * q_elems));
      CHECK(cudaMalloc(&out_new, sizeof(float) * q_elems));
      fill_random(q, q_elems, 1);
      const Kv kvs(n, s.nkv, s.hd, f16, 2);
      const dflash::cuda::DeviceKvView& kv = kvs.view;
      dflash::cuda::DeviceAttnMask mask;  // causal, no prefix
      const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
      const size_t ws_new = dflash::cuda::attention_workspace_bytes_with(AttnPrefillKernel::kTensorCore, n, s.nh, kv, mask);
      const size_t ws_old = dflash::cuda::attention_workspace_bytes_with(old_kernel, n, s.nh, kv, mask);
      void* ws = nullptr;
      if (std::max(ws_new, ws_old) > 0) CHECK(cudaMalloc(&ws, std::max(ws_new, ws_old)));
      auto run = [&](AttnPrefillKernel kernel, float* out, size_t ws_bytes) {
        CHECK(dflash::cuda::attention_with(kernel, q, n, s.nh, kv, mask, scale, out, ws, ws_bytes));
      };
      const double pairs = static_cast<double>(n) * static_cast<double>(n + 1) / 2.0;
      const double flops = 4.0 * static_cast<double>(s.nh * s.hd) * pairs;
      const float new_ms = bench::median_ms([&] { run(AttnPrefillKernel::kTensorCore, out_new, ws_new); }, 10, 1);
      const double new_tf = flops / (new_ms * 1e-3) / 1e12;
      char old_ms_s[16] = "-", old_tf_s[16] = "-", speed_s[16] = "-", diff_s[16] = "-";
      if (with_old) {
        CHECK(cudaMalloc(&out_old, sizeof(float) * q_elems));
        // Repeats within about 2 s.
        cudaEvent_t a, b;
        CHECK(cudaEventCreate(&a));
        CHECK(cudaEventCreate(&b));
        CHECK(cudaEventRecord(a));
        run(old_kernel, out_old, ws_old);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float first = 0;
        CHECK(cudaEventElapsedTime(&first, a, b));
        cudaEventDestroy(a);
        cudaEventDestroy(b);
        const int runs = std::clamp(static_cast<int>(2000.0f / std::max(first, 1e-3f)), 1, 10);
        const float old_ms = bench::median_ms([&] { run(old_kernel, out_old, ws_old); }, runs, 1);
        std::snprintf(old_ms_s, sizeof old_ms_s, "%.3f", old_ms);
        std::snprintf(old_tf_s, sizeof old_tf_s, "%.1f", flops / (old_ms * 1e-3) / 1e12);
        std::snprintf(speed_s, sizeof speed_s, "%.1fx", old_ms / new_ms);
        std::vector<float> a_host(q_elems), b_host(q_elems);
        CHECK(cudaMemcpy(a_host.data(), out_new, sizeof(float) * q_elems, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(b_host.data(), out_old, sizeof(float) * q_elems, cudaMemcpyDeviceToHost));
        double diff = 0;
        for (size_t e = 0; e < q_elems; ++e)
          diff = std::max(diff, std::fabs(double(a_host[e]) - b_host[e]) / std::max(1.0, std::fabs(double(b_host[e]))));
        std::snprintf(diff_s, sizeof diff_s, "%.2e", diff);
        CHECK(cudaFree(out_old));
      }
      char splits[16];
      std::snprintf(splits, sizeof splits, "%zu",
                    ws_new == 0 ? size_t{1} : ws_new / (sizeof(float) * q_elems / s.hd * (s.hd + 2)));
      std::printf("%-12s %6lld %3lld/%-2lld %3lld %10s %9s %8.3f %9.1f %8s %8s %10s\n", s.name, static_cast<long long>(n),
                  static_cast<long long>(s.nh), static_cast<long long>(s.nkv), static_cast<long long>(s.hd), old_ms_s,
                  old_tf_s, new_ms, new_tf, splits, speed_s, diff_s);
      std::fflush(stdout);
      if (ws) CHECK(cudaFree(ws));
      CHECK(cudaFree(q));
      CHECK(cudaFree(out_new));
    }
  CHECK(cudaDeviceSynchronize());
  return 0;
}

// bench_cuda_attention: causal prefill attention (ops/cuda/attention.h), the tensor-core kernel that
// attention() runs for n_q > 32 beside the float32 kernel that ran those calls before it
// (attention_internal.h: AttnPrefillKernel::kSimt).
//
//   bench_cuda_attention [--quick] [--no-old] [--sizes 512,4096,...]
//
// Shapes: Qwen3-8B (32 query heads, 8 KV heads, head_dim 128) and Qwen3.5-27B's attention layers (24 / 4,
// head_dim 256); n_q = n_keys = n (a prompt's prefill from an empty cache), n in 512, 4096, 16384, 32768
// (--quick: 4096; --sizes: a comma-separated list). K/V in 64-token chunks of one buffer, as KvStore keeps
// them. Figure: FLOPs = 4 * n_heads * head_dim * visible (query, key) pairs (n (n + 1) / 2 under the causal
// mask: q.k and p.v, two FLOPs a multiply-add), over the median device time of a call (each call timed alone
// with events; the f32 kernel's calls are repeated fewer times at long contexts). "rel diff" is
// max |new - old| / max(1, |old|) over the outputs: the tensor-core kernel's f16 rounding, a sanity check.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/attention_internal.h"

namespace {

// Fills n device floats with a repeated block of pseudo-random values in [-2, 2).
void fill_random(float* dst, size_t n, uint32_t seed) {
  constexpr size_t kBlock = size_t{1} << 22;
  std::vector<float> host(std::min(n, kBlock));
  uint64_t s = 0x9e3779b97f4a7c15ull * (seed + 1);
  for (float& x : host) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<int32_t>(s >> 32)) * (2.0f / 2147483648.0f);
  }
  for (size_t off = 0; off < n; off += host.size())
    CHECK(cudaMemcpy(dst + off, host.data(), sizeof(float) * std::min(host.size(), n - off), cudaMemcpyHostToDevice));
}

}  // namespace

int main(int argc, char** argv) {
  using dflash::cuda::AttnPrefillKernel;
  bool with_old = true;
  std::vector<int64_t> sizes = {512, 4096, 16384, 32768};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      sizes = {4096};
    } else if (std::strcmp(argv[i], "--no-old") == 0) {
      with_old = false;
    } else if (std::strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
      sizes.clear();
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
      std::fprintf(stderr, "usage: %s [--quick] [--no-old] [--sizes 512,4096,...]\n", argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

  struct Shape {
    const char* name;
    int64_t nh, nkv, hd;
  };
  const Shape shapes[] = {{"qwen3-8b", 32, 8, 128}, {"qwen3.5-27b", 24, 4, 256}};
  constexpr int64_t kChunk = 64;
  std::printf("%-12s %6s %6s %3s %10s %9s %8s %9s %8s %8s %10s\n", "shape", "n", "heads", "hd", "old ms", "old TF/s",
              "new ms", "new TF/s", "splits", "speedup", "rel diff");
  for (const Shape& s : shapes)
    for (int64_t n : sizes) {
      const size_t q_elems = static_cast<size_t>(n * s.nh * s.hd);
      const int64_t n_chunks = (n + kChunk - 1) / kChunk;
      const size_t chunk_elems = static_cast<size_t>(kChunk * s.nkv * s.hd);
      float *q = nullptr, *k = nullptr, *v = nullptr, *out_new = nullptr, *out_old = nullptr;
      CHECK(cudaMalloc(&q, sizeof(float) * q_elems));
      CHECK(cudaMalloc(&out_new, sizeof(float) * q_elems));
      CHECK(cudaMalloc(&k, sizeof(float) * chunk_elems * n_chunks));
      CHECK(cudaMalloc(&v, sizeof(float) * chunk_elems * n_chunks));
      fill_random(q, q_elems, 1);
      fill_random(k, chunk_elems * n_chunks, 2);
      fill_random(v, chunk_elems * n_chunks, 3);
      std::vector<const float*> table;
      for (int64_t c = 0; c < n_chunks; ++c) table.push_back(k + c * chunk_elems);
      for (int64_t c = 0; c < n_chunks; ++c) table.push_back(v + c * chunk_elems);
      const float** dtable = nullptr;
      CHECK(cudaMalloc(&dtable, sizeof(float*) * table.size()));
      CHECK(cudaMemcpy(dtable, table.data(), sizeof(float*) * table.size(), cudaMemcpyHostToDevice));
      dflash::cuda::DeviceKvView kv{dtable, dtable + n_chunks, kChunk, n, s.nkv, s.hd};
      dflash::cuda::DeviceAttnMask mask;  // causal, no prefix
      const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
      const size_t ws_new = dflash::cuda::attention_workspace_bytes_with(AttnPrefillKernel::kTensorCore, n, s.nh, kv, mask);
      const size_t ws_old = dflash::cuda::attention_workspace_bytes_with(AttnPrefillKernel::kSimt, n, s.nh, kv, mask);
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
        run(AttnPrefillKernel::kSimt, out_old, ws_old);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float first = 0;
        CHECK(cudaEventElapsedTime(&first, a, b));
        cudaEventDestroy(a);
        cudaEventDestroy(b);
        const int runs = std::clamp(static_cast<int>(2000.0f / std::max(first, 1e-3f)), 1, 10);
        const float old_ms = bench::median_ms([&] { run(AttnPrefillKernel::kSimt, out_old, ws_old); }, runs, 1);
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
      CHECK(cudaFree(dtable));
      CHECK(cudaFree(q));
      CHECK(cudaFree(out_new));
      CHECK(cudaFree(k));
      CHECK(cudaFree(v));
    }
  CHECK(cudaDeviceSynchronize());
  return 0;
}

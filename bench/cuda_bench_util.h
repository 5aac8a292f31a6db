// What the GPU micro-benchmarks share: CUDA error checks that end the program, and device timing (the
// median over events, and the per-call time of calls recorded in a CUDA graph, as a replayed step runs them).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ops/cuda/weight_form.h"

#define CHECK(expr)                                                                              \
  do {                                                                                           \
    const cudaError_t e_ = (expr);                                                               \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

namespace bench {

// Bytes of a weight row in device memory (ops/cuda/weight_form.h): what a product reads and what to allocate.
inline uint64_t device_rb(dflash::DType t, int64_t cols) {
  return static_cast<uint64_t>(dflash::cuda::device_row_bytes(t, cols));
}

// Median device time of f() over `runs` calls, each between two events on the default stream, after
// `warmup` untimed calls.
template <typename F>
float median_ms(F&& f, int runs, int warmup = 3) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) f();
  CHECK(cudaDeviceSynchronize());
  std::vector<float> ms;
  for (int i = 0; i < runs; ++i) {
    CHECK(cudaEventRecord(a));
    f();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms[ms.size() / 2];
}

// Per-call time of f(stream, r), r = 0 .. reps - 1, recorded once in a CUDA graph: the median of 15
// replays over reps.
template <typename F>
float graph_ms(cudaStream_t stream, int reps, F&& f) {
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  for (int r = 0; r < reps; ++r) f(stream, r);
  CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const float ms = median_ms(
      [&] {
        CHECK(cudaGraphLaunch(exec, stream));
        CHECK(cudaStreamSynchronize(stream));
      },
      15);
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return ms / static_cast<float>(reps);
}

// The device's copy rate (bytes read + written per second, a 1 GiB device-to-device copy, median of 10),
// printed with the device's name: the ceiling the GEMV benchmarks compare with.
inline double device_copy_rate() {
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMemset(a, 1, bytes));
  const float ms = median_ms([&] { CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 10);
  const double rate = 2.0 * bytes / (ms * 1e-3);
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  std::printf("device: %s, %d SMs; device-to-device copy: %.0f GB/s (read + write)\n", prop.name,
              prop.multiProcessorCount, rate / 1e9);
  return rate;
}

// `copies` copies of `bytes` of weights at distinct addresses (at least 256 MiB in all: more than the L2),
// filled with random 16-bit words that are all finite fp16/bf16 values (speed does not depend on values).
inline uint8_t* weight_pool(size_t bytes, int copies, size_t* pool_bytes) {
  std::vector<uint16_t> host(bytes / 2 + 8);
  uint32_t s = 1;
  for (auto& h : host) {
    s = s * 1664525u + 1013904223u;
    h = static_cast<uint16_t>(s >> 16) & 0x3bffu;
  }
  *pool_bytes = std::max<size_t>(bytes * static_cast<size_t>(copies), size_t{256} << 20);
  uint8_t* w = nullptr;
  CHECK(cudaMalloc(&w, *pool_bytes + 256));
  for (size_t off = 0; off < *pool_bytes; off += bytes)
    CHECK(cudaMemcpy(w + off, host.data(), std::min(bytes, *pool_bytes - off), cudaMemcpyHostToDevice));
  return w;
}

}  // namespace bench

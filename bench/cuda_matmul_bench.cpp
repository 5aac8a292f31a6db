// bench_cuda_matmul: GEMV (ops/cuda/matmul.h) bandwidth per weight type and shape, beside the device's
// measured device-to-device copy rate (read + write bytes per second).
//
//   bench_cuda_matmul [--quick] [TYPE...]   (TYPE: f32, q4_K, ...; default every type)
//
// Figure: bytes moved (W in its stored type + x + y) / device time of the engine's path (cuda::matmul,
// kAuto: for the common block types x's int8 quantization plus the integer-dot GEMV) and of the f32 GEMV,
// each timed as 16 calls recorded in a CUDA graph (as a replayed decode step runs them), every call on
// its own copy of the weights (no L2 reuse). Weights are random bytes whose 16-bit words are all finite
// fp16/bf16 values (speed does not depend on the values).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/matmul.h"
#include "ops/cuda/matmul_host.h"
#include "tensor/dtype.h"

namespace {

#define CHECK(expr)                                                                            \
  do {                                                                                         \
    const cudaError_t e_ = (expr);                                                             \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

template <typename F>
float median_ms(F&& f, int runs = 30) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
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

// Device time of one f(stream, rep) as the engine's decode step sees it: kReps calls recorded in a CUDA
// graph and replayed (no host launch cost between them), median over replays, divided by kReps. Each rep
// gets its own index so it can read weights at another address (no L2 reuse across reps).
constexpr int kReps = 16;
template <typename F>
float graph_ms(cudaStream_t stream, F&& f) {
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  for (int r = 0; r < kReps; ++r) f(stream, r);
  CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const float ms = median_ms([&] { CHECK(cudaGraphLaunch(exec, stream)); CHECK(cudaStreamSynchronize(stream)); }, 15);
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return ms / kReps;
}

}  // namespace

int main(int argc, char** argv) {
  using dflash::DType;
  bool quick = false;
  std::vector<std::string> only;  // type names to run (default: all)
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else only.emplace_back(argv[i]);
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));

  // Copy rate: 1 GiB device to device.
  const size_t copy_bytes = size_t{1} << 30;
  void *ca = nullptr, *cb = nullptr;
  CHECK(cudaMalloc(&ca, copy_bytes));
  CHECK(cudaMalloc(&cb, copy_bytes));
  CHECK(cudaMemset(ca, 1, copy_bytes));
  const float copy_ms = median_ms([&] { CHECK(cudaMemcpyAsync(cb, ca, copy_bytes, cudaMemcpyDeviceToDevice)); }, 10);
  const double copy_gbs = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;
  CHECK(cudaFree(ca));
  CHECK(cudaFree(cb));
  std::printf("device: %s, %d SMs; device-to-device copy: %.0f GB/s (read + write)\n", prop.name,
              prop.multiProcessorCount, copy_gbs);

  const DType types[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                         DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ2_K, DType::kQ3_K,
                         DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
  struct Shape {
    int64_t rows, cols;
  };
  std::vector<Shape> shapes = {{4096, 4096}, {4096, 12288}, {12288, 4096}, {5120, 17408}};
  if (quick) shapes = {{4096, 12288}};

  // Random weights: the largest matrix of any type, 16-bit words masked finite.
  size_t max_bytes = 0;
  for (const Shape& s : shapes)
    for (DType t : types)
      max_bytes = std::max<size_t>(max_bytes, dflash::row_bytes(t, s.cols).value() * s.rows);
  std::vector<uint16_t> host(max_bytes / 2 + 8);
  std::mt19937 rng(1);
  for (auto& h : host) h = static_cast<uint16_t>(rng()) & 0x3bffu;
  // Weights for every rep of a timed graph at their own address: kReps copies' worth (at least 4x the L2).
  const size_t pool_bytes = std::max<size_t>(max_bytes * kReps, size_t{256} << 20);
  uint8_t* w = nullptr;
  CHECK(cudaMalloc(&w, pool_bytes + 256));
  for (size_t off = 0; off < pool_bytes; off += max_bytes)
    CHECK(cudaMemcpy(w + off, host.data(), std::min(max_bytes, pool_bytes - off), cudaMemcpyHostToDevice));
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreate(&stream));
  float *x = nullptr, *y = nullptr;
  CHECK(cudaMalloc(&x, sizeof(float) * 16 * 17408));
  CHECK(cudaMalloc(&y, sizeof(float) * 16 * 17408));
  CHECK(cudaMemset(x, 0, sizeof(float) * 16 * 17408));

  std::printf("%-6s %-12s %3s %9s %8s %6s %9s %6s\n", "type", "rows x cols", "n", "us", "GB/s", "/copy", "f32 GB/s",
              "/copy");
  for (const Shape& s : shapes)
    for (DType t : types) {
      if (!only.empty() && std::find(only.begin(), only.end(), std::string(dflash::dtype_name(t))) == only.end())
        continue;
      const size_t wbytes = dflash::row_bytes(t, s.cols).value() * s.rows;
      for (int64_t n : {1, 4, 16}) {
        const double bytes = static_cast<double>(wbytes) + 4.0 * n * (s.cols + s.rows);
        // The engine's path (matmul_host.h kAuto: integer-dot for the common block types, x quantization
        // included) and the f32 GEMV.
        const size_t stride = (wbytes + 255) / 256 * 256;
        auto wr = [&](int r) { return w + (static_cast<size_t>(r) * stride) % (pool_bytes - stride + 1) / 256 * 256; };
        const float ms = graph_ms(stream, [&](cudaStream_t st, int r) {
          const dflash::Status status = dflash::cuda::matmul(t, wr(r), s.rows, s.cols, x, n, y, st);
          if (!status.ok()) {
            std::fprintf(stderr, "%s\n", status.to_string().c_str());
            std::exit(1);
          }
        });
        const float ms_f32 = graph_ms(stream, [&](cudaStream_t st, int r) {
          CHECK(dflash::cuda::gemv(t, wr(r), s.rows, s.cols, x, n, y, st));
        });
        const double gbs = bytes / (ms * 1e-3) / 1e9, gbs_f32 = bytes / (ms_f32 * 1e-3) / 1e9;
        char shape[32];
        std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(s.rows), static_cast<long long>(s.cols));
        std::printf("%-6s %-12s %3lld %9.1f %8.0f %6.2f %9.0f %6.2f\n", std::string(dflash::dtype_name(t)).c_str(),
                    shape, static_cast<long long>(n), ms * 1e3, gbs, gbs / copy_gbs, gbs_f32, gbs_f32 / copy_gbs);
      }
    }
  CHECK(cudaDeviceSynchronize());
  return 0;
}

// bench_cuda_matmul: GEMV (ops/cuda/matmul.h) bandwidth per weight type and shape, beside the device's
// measured device-to-device copy rate (read + write bytes per second).
//
//   bench_cuda_matmul [--quick | --qwen3-8b] [--tokens 1,2,4,8,16] [TYPE...]
//
// TYPE: f32, q4_K, ... (default every type).
//
// --qwen3-8b: the shapes of a Qwen3-8B Q4_K_M layer and head instead of the default ones, each in its own
// type (q4_K: q/k/v as one 6144-row weight, o, gate+up as one 24576-row weight; q6_K: down and the head).
// --tokens: the token counts n to time (default 1, 4, 16).
//
// Figure: bytes moved (W in its stored type + x + y) / device time of the engine's path (cuda::matmul,
// kAuto: for the common block types x's int8 quantization plus the integer-dot GEMV) and of the f32 GEMV,
// each timed as 16 calls recorded in a CUDA graph (as a replayed decode step runs them), every call on
// its own copy of the weights (no L2 reuse). Weights are random bytes whose 16-bit words are all finite
// fp16/bf16 values (speed does not depend on the values). "W GB/s" counts the weight bytes alone (the
// figure a speculative verify step is judged by: its n tokens share one read of W), "/n=1" is the time over
// the same product's time at n = 1.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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
  bool quick = false, qwen3_8b = false;
  std::vector<int64_t> tokens = {1, 4, 16};
  std::vector<std::string> only;  // type names to run (default: all)
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--qwen3-8b") == 0) {
      qwen3_8b = true;
    } else if (std::strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
      tokens.clear();
      for (const char* p = argv[++i]; *p != '\0';) {
        char* end = nullptr;
        const long v = std::strtol(p, &end, 10);
        if (end == p || v < 1 || v > 16 || (*end != ',' && *end != '\0')) {
          std::fprintf(stderr, "--tokens: a comma-separated list of token counts in [1, 16], not %s\n", argv[i]);
          return 2;
        }
        tokens.push_back(v);
        p = *end == ',' ? end + 1 : end;
      }
    } else {
      only.emplace_back(argv[i]);
    }
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
  // A shape of type kAnyType runs in every type asked for.
  constexpr DType kAnyType = static_cast<DType>(~uint32_t{0});
  struct Shape {
    int64_t rows, cols;
    DType type = kAnyType;
  };
  std::vector<Shape> shapes = {{4096, 4096}, {4096, 12288}, {12288, 4096}, {5120, 17408}};
  if (quick) shapes = {{4096, 12288}};
  if (qwen3_8b)
    shapes = {{4096, 4096, DType::kQ4_K},  {6144, 4096, DType::kQ4_K},   {24576, 4096, DType::kQ4_K},
              {4096, 12288, DType::kQ6_K}, {151936, 4096, DType::kQ6_K}};
  auto runs = [&](const Shape& s, DType t) {
    if (s.type != kAnyType && s.type != t) return false;
    return only.empty() || std::find(only.begin(), only.end(), std::string(dflash::dtype_name(t))) != only.end();
  };

  // Random weights: the largest matrix of any type, 16-bit words masked finite.
  size_t max_bytes = 0;
  int64_t max_rows = 0, max_cols = 0;
  for (const Shape& s : shapes)
    for (DType t : types)
      if (runs(s, t)) {
        max_bytes = std::max<size_t>(max_bytes, dflash::row_bytes(t, s.cols).value() * s.rows);
        max_rows = std::max(max_rows, s.rows);
        max_cols = std::max(max_cols, s.cols);
      }
  if (max_bytes == 0) {
    std::fprintf(stderr, "no shape runs in the types asked for\n");
    return 2;
  }
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
  CHECK(cudaMalloc(&x, sizeof(float) * 16 * max_cols));
  CHECK(cudaMalloc(&y, sizeof(float) * 16 * max_rows));
  CHECK(cudaMemset(x, 0, sizeof(float) * 16 * max_cols));

  std::printf("%-6s %-13s %3s %9s %8s %6s %8s %6s %9s %6s\n", "type", "rows x cols", "n", "us", "GB/s", "/copy",
              "W GB/s", "/n=1", "f32 GB/s", "/copy");
  for (const Shape& s : shapes)
    for (DType t : types) {
      if (!runs(s, t)) continue;
      const size_t wbytes = dflash::row_bytes(t, s.cols).value() * s.rows;
      float ms_n1 = 0;  // this product's time at n = 1, once measured
      for (int64_t n : tokens) {
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
        const double wgbs = static_cast<double>(wbytes) / (ms * 1e-3) / 1e9;
        if (n == 1) ms_n1 = ms;
        char shape[32], vs1[16] = "-";
        std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(s.rows), static_cast<long long>(s.cols));
        if (ms_n1 > 0) std::snprintf(vs1, sizeof vs1, "%.2f", ms / ms_n1);
        std::printf("%-6s %-13s %3lld %9.1f %8.0f %6.2f %8.0f %6s %9.0f %6.2f\n",
                    std::string(dflash::dtype_name(t)).c_str(), shape, static_cast<long long>(n), ms * 1e3, gbs,
                    gbs / copy_gbs, wgbs, vs1, gbs_f32, gbs_f32 / copy_gbs);
      }
    }
  CHECK(cudaDeviceSynchronize());
  return 0;
}

// bench_cuda_mmq: the int8 tensor-core product (ops/cuda/mmq.h) beside the dp4a integer-dot GEMV
// (ops/cuda/gemv_q8.h) on the Qwen3-8B Q4_K_M shapes, per token count.
//
//   bench_cuda_mmq [--tokens 1,2,4,8,16,23,32] [--variant V] [--shape ROWSxCOLS:TYPE]...
//
// --shape: a product to time instead of the default Qwen3-8B list (repeatable; TYPE q4_K or q6_K),
// e.g. --shape 5120x17408:q4_K for the Qwen3.5-27B FFN down projection.
// --variant: mmq_set_variant(V) (mmq.h: launch variants for tuning; 3 the default).
// Both kernels read the same int8 activations (quantize_q8_rows of random x, not timed; mmq after mmq_pack_x,
// timed apart as "pack us"). Each figure is the device time of one product: 16 calls recorded in a CUDA
// graph, every call on its own copy of the weights (no L2 reuse), median of 15 replays / 16. gemv_q8 takes at
// most 16 tokens a launch: above that it runs as launches of 16 and the rest (what a verify step would do).
// "W GB/s" is weight bytes / time; "/n=1" the time over the same kernel's n = 1 time; "mmq/q8" the two
// kernels' time ratio. For q4_K, "qmma us" is the f16 tensor-core product (ops/cuda/qmma.h; its activations packed
// by qmma_pack_x, timed apart as "qpack us"), "/q8" its time over gemv_q8's at n = 1.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "ops/cuda/gemv_q8.h"
#include "ops/cuda/mmq.h"
#include "ops/cuda/qmma.h"
#include "tensor/dtype.h"

namespace {

constexpr int kReps = 16;

}  // namespace

int main(int argc, char** argv) {
  using dflash::DType;
  std::vector<int64_t> tokens = {1, 2, 4, 8, 16, 23, 32};
  struct Shape {
    int64_t rows, cols;
    DType type;
  };
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
      tokens.clear();
      for (const char* p = argv[++i]; *p != '\0';) {
        char* end = nullptr;
        const long v = std::strtol(p, &end, 10);
        if (end == p || v < 1 || v > dflash::cuda::kMmqMaxTokens || (*end != ',' && *end != '\0')) {
          std::fprintf(stderr, "--tokens: a comma-separated list of token counts in [1, 32]\n");
          return 2;
        }
        tokens.push_back(v);
        p = *end == ',' ? end + 1 : end;
      }
    } else if (std::strcmp(argv[i], "--variant") == 0 && i + 1 < argc) {
      const int v = std::atoi(argv[++i]);
      dflash::cuda::mmq_set_variant(v);
      std::printf("mmq variant %d\n", v);
    } else if (std::strcmp(argv[i], "--shape") == 0 && i + 1 < argc) {
      const char* arg = argv[++i];
      long long rows = 0, cols = 0;
      char type[16] = {};
      const auto dt = std::sscanf(arg, "%lldx%lld:%15s", &rows, &cols, type) == 3
                          ? dflash::dtype_from_name(type)
                          : std::nullopt;
      if (!dt || !dflash::cuda::mmq_supported(*dt) || rows < 1 || cols < 256 || cols % 256 != 0) {
        std::fprintf(stderr, "--shape: ROWSxCOLS:TYPE, TYPE q4_K or q6_K, COLS a multiple of 256 (got %s)\n", arg);
        return 2;
      }
      shapes.push_back({rows, cols, *dt});
    } else {
      std::fprintf(stderr, "usage: bench_cuda_mmq [--tokens 1,2,4,...] [--variant V] [--shape ROWSxCOLS:TYPE]...\n");
      return 2;
    }
  }
  const double copy_gbs = bench::device_copy_rate() / 1e9;

  if (shapes.empty())
    shapes = {{6144, 4096, DType::kQ4_K},
              {4096, 4096, DType::kQ4_K},
              {24576, 4096, DType::kQ4_K},
              {4096, 12288, DType::kQ6_K},
              {151936, 4096, DType::kQ6_K}};
  size_t max_bytes = 0;
  int64_t max_rows = 0, max_cols = 0;
  for (const Shape& s : shapes) {
    max_bytes = std::max<size_t>(max_bytes, bench::device_rb(s.type, s.cols) * s.rows);
    max_rows = std::max(max_rows, s.rows);
    max_cols = std::max(max_cols, s.cols);
  }
  size_t pool_bytes = 0;
  uint8_t* w = bench::weight_pool(max_bytes, kReps, &pool_bytes);
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreate(&stream));

  // Activations: 32 tokens of random x, quantized once.
  const int64_t nmax = dflash::cuda::kMmqMaxTokens;
  std::vector<float> xh(static_cast<size_t>(nmax * max_cols));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> ud(-2.0f, 2.0f);
  for (auto& v : xh) v = ud(rng);
  float *x = nullptr, *y = nullptr, *xd = nullptr;
  int8_t* xq = nullptr;
  int* xs = nullptr;
  CHECK(cudaMalloc(&x, sizeof(float) * nmax * max_cols));
  CHECK(cudaMalloc(&xq, nmax * max_cols));
  CHECK(cudaMalloc(&xd, sizeof(float) * nmax * max_cols / 32));
  CHECK(cudaMalloc(&xs, sizeof(int) * nmax * max_cols / 16));
  CHECK(cudaMalloc(&y, sizeof(float) * nmax * max_rows));
  void* xp = nullptr;  // mmq's layout of the tokens (mmq_pack_x, timed apart: "pack us")
  CHECK(cudaMalloc(&xp, dflash::cuda::mmq_x_bytes(nmax, max_cols)));
  void* xh16 = nullptr;  // qmma's layout of the tokens
  CHECK(cudaMalloc(&xh16, dflash::cuda::qmma_x_bytes(nmax, max_cols)));
  CHECK(cudaMemcpy(x, xh.data(), sizeof(float) * xh.size(), cudaMemcpyHostToDevice));

  std::printf("%-6s %-13s %3s | %9s %8s %6s %6s | %9s %8s %6s | %7s | %7s | %8s %6s %8s\n", "type", "rows x cols", "n",
              "mmq us", "W GB/s", "/copy", "/n=1", "gemv_q8 us", "W GB/s", "/n=1", "mmq/q8", "pack us", "qmma us",
              "/q8", "qpack us");
  for (const Shape& s : shapes) {
    CHECK(dflash::cuda::quantize_q8_rows(x, nmax, s.cols, xq, xd, xs, stream));
    const size_t wbytes = bench::device_rb(s.type, s.cols) * s.rows;
    const size_t stride = (wbytes + 255) / 256 * 256;
    auto wr = [&](int r) { return w + (static_cast<size_t>(r) * stride) % (pool_bytes - stride + 1) / 256 * 256; };
    float mmq_n1 = 0, q8_n1 = 0;
    for (int64_t n : tokens) {
      const float ms_pack = bench::graph_ms(stream, kReps, [&](cudaStream_t st, int) {
        CHECK(dflash::cuda::mmq_pack_x(s.type, xq, xd, xs, n, s.cols, xp, st));
      });
      const float ms = bench::graph_ms(stream, kReps, [&](cudaStream_t st, int r) {
        CHECK(dflash::cuda::mmq(s.type, wr(r), s.rows, s.cols, xp, n, y, st));
      });
      const float ms_q8 = bench::graph_ms(stream, kReps, [&](cudaStream_t st, int r) {
        for (int64_t t0 = 0; t0 < n; t0 += dflash::cuda::kQ8MaxTokens) {
          const int64_t m = std::min<int64_t>(dflash::cuda::kQ8MaxTokens, n - t0);
          const dflash::cuda::Q8Part part{wr(r), s.rows, y + t0 * s.rows};
          CHECK(dflash::cuda::gemv_q8(s.type, &part, 1, s.cols, xq + t0 * s.cols, xd + t0 * s.cols / 32,
                                      xs + t0 * s.cols / 16, m, st));
        }
      });
      float ms_qmma = 0, ms_qpack = 0;
      if (dflash::cuda::qmma_supported(s.type)) {
        ms_qpack = bench::graph_ms(stream, kReps, [&](cudaStream_t st, int) {
          CHECK(dflash::cuda::qmma_pack_x(x, n, s.cols, xh16, st));
        });
        ms_qmma = bench::graph_ms(stream, kReps, [&](cudaStream_t st, int r) {
          CHECK(dflash::cuda::qmma(s.type, wr(r), s.rows, s.cols, xh16, n, y, st));
        });
      }
      if (n == 1) mmq_n1 = ms, q8_n1 = ms_q8;
      const double wgbs = static_cast<double>(wbytes) / (ms * 1e-3) / 1e9;
      const double wgbs_q8 = static_cast<double>(wbytes) / (ms_q8 * 1e-3) / 1e9;
      char shape[32], r1[16] = "-", r2[16] = "-";
      std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(s.rows), static_cast<long long>(s.cols));
      if (mmq_n1 > 0) std::snprintf(r1, sizeof r1, "%.2f", ms / mmq_n1);
      if (q8_n1 > 0) std::snprintf(r2, sizeof r2, "%.2f", ms_q8 / q8_n1);
      std::printf("%-6s %-13s %3lld | %9.1f %8.0f %6.2f %6s | %9.1f %8.0f %6s | %7.2f | %7.2f | %8.1f %6.2f %8.2f\n",
                  std::string(dflash::dtype_name(s.type)).c_str(), shape, static_cast<long long>(n), ms * 1e3, wgbs,
                  wgbs / copy_gbs, r1, ms_q8 * 1e3, wgbs_q8, r2, ms / ms_q8, ms_pack * 1e3, ms_qmma * 1e3,
                  q8_n1 > 0 ? ms_qmma / q8_n1 : 0.0, ms_qpack * 1e3);
      std::fflush(stdout);
    }
  }
  CHECK(cudaDeviceSynchronize());
  return 0;
}

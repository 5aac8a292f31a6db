// bench_cuda_matmul: the GPU matmul (ops/cuda/matmul_host.h) per weight type and shape. Decode sizes
// (n <= 16, the GEMV paths) beside the device's measured device-to-device copy rate (read + write bytes
// per second); prefill sizes (n > 16, the GEMM path) beside the bf16 cuBLAS GEMM of the same shape.
//
//   bench_cuda_matmul [--quick | --qwen3-8b | --bf16-8b | --shapes RxC,...] [--tokens 1,2,4,8,16,64,256,...]
//                     [--no-fused] [--exact] [TYPE...]
//
// TYPE: f32, q4_K, ... (default every type).
//
// --qwen3-8b: the shapes of a Qwen3-8B Q4_K_M layer and head instead of the default ones, each in its own
// type (q4_K: q/k/v as one 6144-row weight, o, gate+up as one 24576-row weight; q6_K: down and the head);
// for n > 16 the products as the engine's prefill runs them (q, k/v, o, gate or up, down in q4_K; v and
// down in q6_K; the head left out: prefill computes logits for the last token only), the same shapes in
// bf16 (a bf16 checkpoint's), and one q5_K and one q8_0 weight.
// --bf16-8b: the shapes of a bf16 Qwen3-8B checkpoint's layer and head (q/k/v as one 6144-row weight, o,
// gate+up as one 24576-row weight, down, the 151936-row head) in the types asked for (bf16 if none).
// --shapes: these rows x cols shapes (e.g. 1024x384,384x1024: the bundled 19M model's) in every type asked for.
// --tokens: the token counts n to time (default 1, 4, 16).
// --no-fused: matmul without the fused kernel (set_gemm_fused_max_tokens(0)), and no fused columns.
// --exact: the engine's column is the token-exact path (MatmulPath::kTokenExact, what a verify step runs), and
// token counts up to kMmqMaxTokens (32) time as decode sizes.
//
// n <= 16. Figure: bytes moved (W in its stored type + x + y) / device time of the engine's path
// (cuda::matmul, kAuto: for the common block types x's int8 quantization plus the integer-dot GEMV) and of
// the f32 GEMV, each timed as 16 calls recorded in a CUDA graph (as a replayed decode step runs them),
// every call on its own copy of the weights (no L2 reuse). "W GB/s" counts the weight bytes alone (the
// figure a speculative verify step is judged by: its n tokens share one read of W), "/n=1" is the time over
// the same product's time at n = 1.
//
// n > 16. Times (ms, the median over batches of 8 calls on a stream, each call on its own copy of W, so W
// comes from device memory as in a forward) and rates (TFLOP/s = 2 rows cols n / time):
//   engine   cuda::matmul (kAuto: the GEMM path as the engine runs it, x's conversion to bf16 included)
//   old      the GEMM path before the fused kernel (re-enacted here: scratch per call, x to bf16, W
//            dequantized to bf16 in 64 MiB slabs, cublasGemmEx per slab)
//   deq      dequantize_rows of all of W to bf16 alone, with its rate (GB/s: bytes read + written)
//   gemm     cublasGemmEx alone on an already dequantized bf16 W: the split of "old" is deq + gemm, and
//            gemm is the bf16 cuBLAS GEMM of the shape (the ceiling a bf16 checkpoint gets)
//   xcv      x f32 -> bf16 alone
//   slabN    matmul kGemmDequant with slabs of at most N MiB (dequantize + cuBLAS, slab by slab; the
//            default is 128)
//   fused    the fused kernel alone (gemm_q.h, x already bf16) with the plan matmul picks; "best" the
//            fastest of the plans tried (bn 64/128/256, split 1/2/4/8/16; every one listed after the
//            table) and its plan
//   diff     max |fused - dequantize+cuBLAS| / max |y| over the product (bf16 inputs: both sum the same
//            products in other orders)
// The "layer" lines add up one Qwen3-8B layer's products (q, k, v, o, gate, up, down) per n.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "ops/cuda/dequantize.h"
#include "ops/cuda/gemm_q.h"
#include "ops/cuda/matmul.h"
#include "ops/cuda/matmul_host.h"
#include "ops/cuda/mmq.h"
#include "tensor/dtype.h"

namespace {

// Device time of one f(stream, rep) as the engine's decode step sees it: kReps calls recorded in a CUDA
// graph and replayed (no host launch cost between them), median over replays, divided by kReps. Each rep
// gets its own index so it can read weights at another address (no L2 reuse across reps).
constexpr int kReps = 16;
template <typename F>
float graph_ms(cudaStream_t stream, F&& f) {
  return bench::graph_ms(stream, kReps, f);
}

// ---- n > 16: the GEMM path ----

struct GemmShape {
  int64_t rows, cols;
  dflash::DType type;
  int layer_count = 0;  // times a Qwen3-8B layer runs this product (0: not part of the layer sum)
};

// Median device time of one call, over batches of kBatch calls (call index i picks the weight copy).
constexpr int kBatch = 8;
template <typename F>
float batch_ms(cudaStream_t stream, F&& f, int batches = 12) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  int call = 0;
  for (int i = 0; i < 2 * kBatch; ++i) f(call++);
  std::vector<float> ms;
  for (int k = 0; k < batches; ++k) {
    CHECK(cudaEventRecord(a, stream));
    for (int i = 0; i < kBatch; ++i) f(call++);
    CHECK(cudaEventRecord(b, stream));
    CHECK(cudaEventSynchronize(b));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / kBatch);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms[ms.size() / 2];
}

void ok_or_die(const dflash::Status& st) {
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    std::exit(1);
  }
}

void cublas_or_die(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: %s\n", what, cublasGetStatusString(s));
    std::exit(1);
  }
}

// y^T = W x^T by cublasGemmEx (bf16 in, f32 out), as matmul_host.cpp calls it.
void cublas_bf16(cublasHandle_t h, const __nv_bfloat16* w, int64_t rows, int64_t cols, const __nv_bfloat16* xb,
                 int64_t n, float* y, int64_t ldy) {
  const float alpha = 1.0f, beta = 0.0f;
  cublas_or_die(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(n),
                             static_cast<int>(cols), &alpha, w, CUDA_R_16BF, static_cast<int>(cols), xb, CUDA_R_16BF,
                             static_cast<int>(cols), &beta, y, CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT),
                "cublasGemmEx");
}

// The GEMM path as it was before the fused kernel (matmul_host.cpp at 798363b): scratch per call, x to
// bf16, 64 MiB slabs of W dequantized to bf16 (bf16 weights copied too), cublasGemmEx per slab.
void old_gemm(cublasHandle_t h, dflash::DType t, const uint8_t* w, int64_t rows, int64_t cols, const float* x,
              int64_t n, float* y, cudaStream_t stream) {
  const uint64_t rb = bench::device_rb(t, cols);
  const int64_t slab = std::clamp<int64_t>((int64_t{32} << 20) / cols, 1, rows);
  __nv_bfloat16 *xb = nullptr, *wb = nullptr;
  CHECK(cudaMallocAsync(reinterpret_cast<void**>(&xb), sizeof(__nv_bfloat16) * n * cols, stream));
  CHECK(cudaMallocAsync(reinterpret_cast<void**>(&wb), sizeof(__nv_bfloat16) * slab * cols, stream));
  CHECK(dflash::cuda::dequantize_rows(dflash::DType::kF32, x, xb, n, cols, stream));
  for (int64_t r0 = 0; r0 < rows; r0 += slab) {
    const int64_t r = std::min(slab, rows - r0);
    CHECK(dflash::cuda::dequantize_rows(t, w + static_cast<uint64_t>(r0) * rb, wb, r, cols, stream));
    cublas_bf16(h, wb, r, cols, xb, n, y + r0, rows);
  }
  CHECK(cudaFreeAsync(wb, stream));
  CHECK(cudaFreeAsync(xb, stream));
}

void gemm_section(const std::vector<GemmShape>& shapes, const std::vector<int64_t>& tokens, int sms,
                  cudaStream_t stream, bool with_fused) {
  using dflash::DType;
  namespace cuda = dflash::cuda;
  cublasHandle_t handle = nullptr;
  cublas_or_die(cublasCreate(&handle), "cublasCreate");
  cublas_or_die(cublasSetStream(handle, stream), "cublasSetStream");
  size_t max_wbytes = 0, max_bf16 = 0;
  int64_t max_rows = 0, max_cols = 0, max_n = 0;
  for (const GemmShape& s : shapes) {
    max_wbytes = std::max<size_t>(max_wbytes, bench::device_rb(s.type, s.cols) * s.rows);
    max_bf16 = std::max<size_t>(max_bf16, 2 * static_cast<size_t>(s.rows * s.cols));
    max_rows = std::max(max_rows, s.rows);
    max_cols = std::max(max_cols, s.cols);
  }
  for (int64_t n : tokens) max_n = std::max(max_n, n);
  // Stored weights: at least 4 copies of the largest (each call reads W from device memory, not L2).
  const size_t pool = std::max<size_t>(4 * ((max_wbytes + 255) / 256 * 256), size_t{256} << 20);
  const size_t pool_b = std::max<size_t>(2 * ((max_bf16 + 255) / 256 * 256), size_t{256} << 20);
  uint8_t *w = nullptr, *wb = nullptr;
  CHECK(cudaMalloc(&w, pool));
  CHECK(cudaMalloc(&wb, pool_b));
  {
    std::vector<uint16_t> host(pool / 2);
    std::mt19937 rng(7);
    for (auto& v : host) v = static_cast<uint16_t>(rng()) & 0x3bffu;  // every 16-bit word a finite fp16/bf16
    CHECK(cudaMemcpy(w, host.data(), pool, cudaMemcpyHostToDevice));
  }
  float *x = nullptr, *y = nullptr, *y2 = nullptr, *ws = nullptr;
  __nv_bfloat16* xb = nullptr;
  CHECK(cudaMalloc(&x, sizeof(float) * max_n * max_cols));
  CHECK(cudaMalloc(&xb, sizeof(__nv_bfloat16) * max_n * max_cols));
  CHECK(cudaMalloc(&y, sizeof(float) * max_n * max_rows));
  CHECK(cudaMalloc(&y2, sizeof(float) * max_n * max_rows));
  size_t ws_bytes = 16;  // the fused kernel's split workspace: the largest any plan timed here needs
  for (const GemmShape& s : shapes)
    for (int64_t n : tokens) {
      ws_bytes = std::max(ws_bytes, cuda::gemm_q_workspace_bytes(cuda::gemm_q_plan(s.type, s.rows, s.cols, n, sms), s.rows,
                                                                 s.cols, n));
      ws_bytes = std::max(ws_bytes, cuda::gemm_q_workspace_bytes(cuda::GemmQPlan{64, 16}, s.rows, s.cols, n));
    }
  CHECK(cudaMalloc(&ws, ws_bytes));
  {
    std::vector<float> hx(static_cast<size_t>(max_n * max_cols));
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& v : hx) v = u(rng);
    CHECK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
  }
  const int64_t slab_mib[] = {16, 32, 64, 128};
  std::printf("\nGEMM path (n > 16): ms per call (median), TFLOP/s = 2 rows cols n / time, deq GB/s = bytes read + "
              "written\n");
  std::printf("%-5s %-11s %5s | %7s %5s | %7s %5s | %7s %5s | %7s %5s | %6s | %6s %6s %6s %6s | %7s %5s | %7s "
              "%-7s | %7s\n",
              "type", "rows x cols", "n", "engine", "TF/s", "old", "TF/s", "deq", "GB/s", "gemm", "TF/s", "xcv",
              "slab16", "slab32", "slab64", "slab128", "fused", "TF/s", "best", "plan", "diff");
  std::vector<std::string> sweeps;  // every plan's time, printed after the table
  std::vector<double> layer_engine(tokens.size(), 0), layer_old(tokens.size(), 0), layer_engine_bf16(tokens.size(), 0),
      layer_old_bf16(tokens.size(), 0);
  for (const GemmShape& s : shapes) {
    const DType t = s.type;
    const size_t wbytes = bench::device_rb(t, s.cols) * s.rows;
    const size_t stride = (wbytes + 255) / 256 * 256, bstride = (2 * s.rows * s.cols + 255) / 256 * 256;
    const size_t copies = pool / stride, bcopies = pool_b / bstride;
    auto wr = [&](int i) { return w + static_cast<size_t>(i) % copies * stride; };
    auto wbr = [&](int i) { return reinterpret_cast<__nv_bfloat16*>(wb + static_cast<size_t>(i) % bcopies * bstride); };
    for (size_t c = 0; c < bcopies; ++c) CHECK(cuda::dequantize_rows(t, wr(0), wbr(static_cast<int>(c)), s.rows, s.cols, stream));
    const bool fused_ok = with_fused && cuda::gemm_q_applies(t, w, s.rows, s.cols);
    for (size_t ti = 0; ti < tokens.size(); ++ti) {
      const int64_t n = tokens[ti];
      const double flop = 2.0 * s.rows * s.cols * n;
      auto tf = [&](float ms) { return flop / (ms * 1e-3) / 1e12; };
      CHECK(cuda::dequantize_rows(DType::kF32, x, xb, n, s.cols, stream));
      const float engine = batch_ms(stream, [&](int i) { ok_or_die(cuda::matmul(t, wr(i), s.rows, s.cols, x, n, y, stream)); });
      const float old = batch_ms(stream, [&](int i) { old_gemm(handle, t, wr(i), s.rows, s.cols, x, n, y, stream); });
      const float deq = batch_ms(stream, [&](int i) { CHECK(cuda::dequantize_rows(t, wr(i), wbr(i), s.rows, s.cols, stream)); });
      const float gemm = batch_ms(stream, [&](int i) { cublas_bf16(handle, wbr(i), s.rows, s.cols, xb, n, y, s.rows); });
      const float xcv = batch_ms(stream, [&](int) { CHECK(cuda::dequantize_rows(DType::kF32, x, xb, n, s.cols, stream)); });
      float slab[4] = {0, 0, 0, 0};
      if (t != DType::kBF16)
        for (int k = 0; k < 4; ++k) {
          cuda::set_gemm_slab_bytes(slab_mib[k] << 20);
          slab[k] = batch_ms(stream, [&](int i) {
            ok_or_die(cuda::matmul(t, wr(i), s.rows, s.cols, x, n, y, stream, cuda::MatmulPath::kGemmDequant));
          });
        }
      cuda::set_gemm_slab_bytes(0);
      float fused = 0, best = 0, diff = -1;
      char best_plan[16] = "-";
      if (fused_ok) {
        auto time_plan = [&](const cuda::GemmQPlan& plan) {
          return batch_ms(stream, [&](int i) { CHECK(cuda::gemm_q(t, wr(i), s.rows, s.cols, xb, n, y, plan, ws, stream)); });
        };
        fused = time_plan(cuda::gemm_q_plan(t, s.rows, s.cols, n, sms));
        std::string sweep;
        for (int bn : {64, 128, 256})
          for (int split : {1, 2, 4, 8, 16}) {
            const cuda::GemmQPlan plan{bn, split};
            if (cuda::gemm_q_effective_split(s.cols, plan) != split) continue;
            const float ms = time_plan(plan);
            char item[32];
            std::snprintf(item, sizeof item, " %d/%d %.4f", bn, split, ms);
            sweep += item;
            if (best == 0 || ms < best) {
              best = ms;
              std::snprintf(best_plan, sizeof best_plan, "%d/%d", bn, split);
            }
          }
        char head[64];
        std::snprintf(head, sizeof head, "plans %s %lldx%lld n=%lld:", std::string(dflash::dtype_name(t)).c_str(),
                      static_cast<long long>(s.rows), static_cast<long long>(s.cols), static_cast<long long>(n));
        sweeps.push_back(head + sweep);
        // fused (the engine's plan) against dequantize + cuBLAS on the same inputs
        CHECK(cuda::gemm_q(t, wr(0), s.rows, s.cols, xb, n, y, cuda::gemm_q_plan(t, s.rows, s.cols, n, sms), ws, stream));
        ok_or_die(cuda::matmul(t, wr(0), s.rows, s.cols, x, n, y2, stream, cuda::MatmulPath::kGemmDequant));
        CHECK(cudaStreamSynchronize(stream));
        std::vector<float> a(static_cast<size_t>(n * s.rows)), b(a.size());
        CHECK(cudaMemcpy(a.data(), y, a.size() * 4, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(b.data(), y2, b.size() * 4, cudaMemcpyDeviceToHost));
        double md = 0, my = 0;
        for (size_t k = 0; k < a.size(); ++k) {
          md = std::max(md, std::fabs(double{a[k]} - b[k]));
          my = std::max(my, std::fabs(double{b[k]}));
          if (!std::isfinite(a[k])) md = INFINITY;
        }
        diff = static_cast<float>(md / std::max(my, 1e-30));
      }
      if (s.layer_count > 0) {
        auto& le = t == DType::kBF16 ? layer_engine_bf16 : layer_engine;
        auto& lo = t == DType::kBF16 ? layer_old_bf16 : layer_old;
        le[ti] += s.layer_count * engine;
        lo[ti] += s.layer_count * old;
      }
      char shape[32];
      std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(s.rows), static_cast<long long>(s.cols));
      auto opt = [](float v, char* buf) {
        if (v > 0)
          std::snprintf(buf, 16, "%.4f", v);
        else
          std::snprintf(buf, 16, "-");
        return buf;
      };
      char b0[16], b1[16], b2[16], b3[16], b4[16], b5[16], b6[16];
      std::printf("%-5s %-11s %5lld | %7.4f %5.0f | %7.4f %5.0f | %7.4f %5.0f | %7.4f %5.0f | %6.4f | %6s %6s %6s %6s | "
                  "%7s %5.0f | %7s %-7s | %7s\n",
                  std::string(dflash::dtype_name(t)).c_str(), shape, static_cast<long long>(n), engine, tf(engine), old,
                  tf(old), deq, (wbytes + 2.0 * s.rows * s.cols) / (deq * 1e-3) / 1e9, gemm, tf(gemm), xcv,
                  opt(slab[0], b0), opt(slab[1], b1), opt(slab[2], b2), opt(slab[3], b3), opt(fused, b4),
                  fused > 0 ? tf(fused) : 0.0, opt(best, b5), best_plan,
                  diff >= 0 ? (std::snprintf(b6, 16, "%.1e", diff), b6) : "-");
    }
  }
  std::printf("\nThe fused kernel alone by plan (bn/split ms):\n");
  for (const std::string& line : sweeps) std::printf("%s\n", line.c_str());
  bool any_layer = false;
  for (const GemmShape& s : shapes) any_layer = any_layer || s.layer_count > 0;
  if (any_layer) {
    std::printf("\nOne Qwen3-8B layer's prefill products (q, k, v, o, gate, up, down as the backend runs them), ms:\n");
    std::printf("%5s | %9s %9s %6s | %9s %9s %6s\n", "n", "Q4_K_M", "old", "x", "bf16", "old", "x");
    for (size_t ti = 0; ti < tokens.size(); ++ti)
      std::printf("%5lld | %9.3f %9.3f %6.2f | %9.3f %9.3f %6.2f\n", static_cast<long long>(tokens[ti]),
                  layer_engine[ti], layer_old[ti], layer_engine[ti] > 0 ? layer_old[ti] / layer_engine[ti] : 0.0,
                  layer_engine_bf16[ti], layer_old_bf16[ti],
                  layer_engine_bf16[ti] > 0 ? layer_old_bf16[ti] / layer_engine_bf16[ti] : 0.0);
  }
  CHECK(cudaDeviceSynchronize());
  cublasDestroy(handle);
  CHECK(cudaFree(w));
  CHECK(cudaFree(wb));
  CHECK(cudaFree(x));
  CHECK(cudaFree(xb));
  CHECK(cudaFree(y));
  CHECK(cudaFree(y2));
  CHECK(cudaFree(ws));
}

}  // namespace

int main(int argc, char** argv) {
  using dflash::DType;
  bool quick = false, qwen3_8b = false, bf16_8b = false, no_fused = false, exact = false;
  std::vector<int64_t> tokens = {1, 4, 16};
  std::vector<std::string> only;  // type names to run (default: all)
  std::vector<std::pair<int64_t, int64_t>> asked;  // --shapes
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--qwen3-8b") == 0) {
      qwen3_8b = true;
    } else if (std::strcmp(argv[i], "--bf16-8b") == 0) {
      bf16_8b = true;
    } else if (std::strcmp(argv[i], "--no-fused") == 0) {
      no_fused = true;
    } else if (std::strcmp(argv[i], "--exact") == 0) {
      exact = true;
    } else if (std::strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
      tokens.clear();
      for (const char* p = argv[++i]; *p != '\0';) {
        char* end = nullptr;
        const long v = std::strtol(p, &end, 10);
        if (end == p || v < 1 || v > 65536 || (*end != ',' && *end != '\0')) {
          std::fprintf(stderr, "--tokens: a comma-separated list of token counts in [1, 65536], not %s\n", argv[i]);
          return 2;
        }
        tokens.push_back(v);
        p = *end == ',' ? end + 1 : end;
      }
    } else if (std::strcmp(argv[i], "--shapes") == 0 && i + 1 < argc) {
      for (const char* p = argv[++i]; *p != '\0';) {
        char* end = nullptr;
        const long r = std::strtol(p, &end, 10);
        const char* q = end + (*end == 'x' ? 1 : 0);
        const long c = *end == 'x' ? std::strtol(q, &end, 10) : 0;
        if (r < 1 || c < 1 || r > (1L << 20) || c > (1L << 20) || (*end != ',' && *end != '\0')) {
          std::fprintf(stderr, "--shapes: a comma-separated list of ROWSxCOLS (each in [1, 2^20]), not %s\n", argv[i]);
          return 2;
        }
        asked.emplace_back(r, c);
        p = *end == ',' ? end + 1 : end;
      }
    } else {
      only.emplace_back(argv[i]);
    }
  }
  const double copy_gbs = bench::device_copy_rate() / 1e9;
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));

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
  if (!asked.empty()) {
    shapes.clear();
    for (const auto& [r, c] : asked) shapes.push_back({r, c});
  }
  if (qwen3_8b)
    shapes = {{4096, 4096, DType::kQ4_K},  {6144, 4096, DType::kQ4_K},   {24576, 4096, DType::kQ4_K},
              {4096, 12288, DType::kQ6_K}, {151936, 4096, DType::kQ6_K}};
  if (bf16_8b) {
    shapes = {{6144, 4096}, {4096, 4096}, {24576, 4096}, {4096, 12288}, {151936, 4096}};
    if (only.empty()) only.emplace_back("bf16");
  }
  auto runs = [&](const Shape& s, DType t) {
    if (s.type != kAnyType && s.type != t) return false;
    if (s.cols % dflash::dtype_info(t)->block_elems != 0) return false;  // e.g. --shapes 1024x384 in q4_K
    return only.empty() || std::find(only.begin(), only.end(), std::string(dflash::dtype_name(t))) != only.end();
  };
  std::vector<int64_t> gemv_tokens, gemm_tokens;
  const int64_t gemv_max = exact ? dflash::cuda::kMmqMaxTokens : dflash::cuda::kGemvMaxTokens;
  for (int64_t n : tokens) (n <= gemv_max ? gemv_tokens : gemm_tokens).push_back(n);
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreate(&stream));

  if (!gemv_tokens.empty()) {
    // Random weights: the largest matrix of any type, 16-bit words masked finite.
    size_t max_bytes = 0;
    int64_t max_rows = 0, max_cols = 0;
    for (const Shape& s : shapes)
      for (DType t : types)
        if (runs(s, t)) {
          max_bytes = std::max<size_t>(max_bytes, bench::device_rb(t, s.cols) * s.rows);
          max_rows = std::max(max_rows, s.rows);
          max_cols = std::max(max_cols, s.cols);
        }
    if (max_bytes == 0) {
      std::fprintf(stderr, "no shape runs in the types asked for\n");
      return 2;
    }
    // Weights for every rep of a timed graph at their own address: kReps copies' worth (at least 4x the L2).
    size_t pool_bytes = 0;
    uint8_t* w = bench::weight_pool(max_bytes, kReps, &pool_bytes);
    float *x = nullptr, *y = nullptr;
    CHECK(cudaMalloc(&x, sizeof(float) * gemv_max * max_cols));
    CHECK(cudaMalloc(&y, sizeof(float) * gemv_max * max_rows));
    {
      std::vector<float> hx(static_cast<size_t>(gemv_max * max_cols));
      std::mt19937 rng(1);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (auto& v : hx) v = u(rng);
      CHECK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    }

    std::printf("%-6s %-13s %3s %9s %8s %6s %8s %6s %9s %6s\n", "type", "rows x cols", "n", "us", "GB/s", "/copy",
                "W GB/s", "/n=1", "f32 GB/s", "/copy");
    for (const Shape& s : shapes)
      for (DType t : types) {
        if (!runs(s, t)) continue;
        const size_t wbytes = bench::device_rb(t, s.cols) * s.rows;
        float ms_n1 = 0;  // this product's time at n = 1, once measured
        for (int64_t n : gemv_tokens) {
          const double bytes = static_cast<double>(wbytes) + 4.0 * n * (s.cols + s.rows);
          // The engine's path (matmul_host.h kAuto: integer-dot for the common block types, x quantization
          // included) and the f32 GEMV.
          const size_t stride = (wbytes + 255) / 256 * 256;
          auto wr = [&](int r) {
            return w + (static_cast<size_t>(r) * stride) % (pool_bytes - stride + 1) / 256 * 256;
          };
          const float ms = graph_ms(stream, [&](cudaStream_t st, int r) {
            ok_or_die(dflash::cuda::matmul(t, wr(r), s.rows, s.cols, x, n, y, st,
                                           exact ? dflash::cuda::MatmulPath::kTokenExact
                                                 : dflash::cuda::MatmulPath::kAuto));
          });
          const float ms_f32 = n > dflash::cuda::kGemvMaxTokens ? ms : graph_ms(stream, [&](cudaStream_t st, int r) {
            CHECK(dflash::cuda::gemv(t, wr(r), s.rows, s.cols, x, n, y, st));
          });
          const double gbs = bytes / (ms * 1e-3) / 1e9, gbs_f32 = bytes / (ms_f32 * 1e-3) / 1e9;
          const double wgbs = static_cast<double>(wbytes) / (ms * 1e-3) / 1e9;
          if (n == 1) ms_n1 = ms;
          char shape[32], vs1[16] = "-";
          std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(s.rows),
                        static_cast<long long>(s.cols));
          if (ms_n1 > 0) std::snprintf(vs1, sizeof vs1, "%.2f", ms / ms_n1);
          std::printf("%-6s %-13s %3lld %9.1f %8.0f %6.2f %8.0f %6s %9.0f %6.2f\n",
                      std::string(dflash::dtype_name(t)).c_str(), shape, static_cast<long long>(n), ms * 1e3, gbs,
                      gbs / copy_gbs, wgbs, vs1, gbs_f32, gbs_f32 / copy_gbs);
        }
      }
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaFree(w));
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
  }

  if (!gemm_tokens.empty()) {
    std::vector<GemmShape> gshapes;
    if (qwen3_8b) {
      gshapes = {{1024, 4096, DType::kQ4_K, 1},  {4096, 4096, DType::kQ4_K, 2},  {6144, 4096, DType::kQ4_K},
                 {12288, 4096, DType::kQ4_K, 2}, {24576, 4096, DType::kQ4_K},    {4096, 12288, DType::kQ4_K},
                 {1024, 4096, DType::kQ6_K, 1},  {4096, 12288, DType::kQ6_K, 1}, {4096, 4096, DType::kQ5_K},
                 {4096, 4096, DType::kQ8_0},     {1024, 4096, DType::kBF16, 2},  {4096, 4096, DType::kBF16, 2},
                 {12288, 4096, DType::kBF16, 2}, {4096, 12288, DType::kBF16, 1}};
      std::erase_if(gshapes, [&](const GemmShape& g) { return !runs({g.rows, g.cols, g.type}, g.type); });
    } else {
      for (const Shape& s : shapes)
        for (DType t : types)
          if (runs(s, t)) gshapes.push_back({s.rows, s.cols, t});
    }
    if (gshapes.empty()) {
      std::fprintf(stderr, "no GEMM shape runs in the types asked for\n");
      return 2;
    }
    if (no_fused) dflash::cuda::set_gemm_fused_max_tokens(0);
    gemm_section(gshapes, gemm_tokens, prop.multiProcessorCount, stream, !no_fused);
  }
  CHECK(cudaDeviceSynchronize());
  return 0;
}

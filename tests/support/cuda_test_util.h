// Helpers shared by the CUDA tests (tests/unit/cuda): device presence, error assertions, poisoned device
// arrays. Header-only: only test_cuda (linked with cudart) includes it.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "ops/cuda/fill.h"
#include "ops/cuda/weight_form.h"

#define DF_ASSERT_CUDA(expr)                                                                  \
  do {                                                                                        \
    const cudaError_t df_cuda_err_ = (expr);                                                  \
    ASSERT_EQ(df_cuda_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(df_cuda_err_); \
  } while (0)

namespace dflash::test {

// `rows` x `cols` weights of `type` in stored form as the CUDA kernels take them (ops/cuda/weight_form.h:
// q6_K rows re-laid, every other type as it is). Empty on a bad shape.
inline std::vector<uint8_t> device_form(DType type, const std::vector<uint8_t>& stored, int64_t rows,
                                        int64_t cols) {
  const int64_t rb = cuda::device_row_bytes(type, cols);
  if (rb < 0 || rows < 0) return {};
  std::vector<uint8_t> out(static_cast<size_t>(rb * rows));
  if (!cuda::to_device_form(type, stored.data(), rows, cols, out.data())) return {};
  return out;
}

// True when the CUDA runtime sees a device; clears the runtime's sticky error when it does not.
inline bool cuda_device_present() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

// A quiet-NaN word: outputs are filled with it before a kernel runs, so a skipped write shows.
inline constexpr uint32_t kNanPoison = 0x7fc00000u;

// A device array of T (4-byte T), poisoned on creation unless filled from a host vector.
template <typename T>
class DevArray {
  static_assert(sizeof(T) == 4);

 public:
  explicit DevArray(size_t count) : n_(count) {
    err_ = cudaMalloc(&p_, (count == 0 ? 1 : count) * sizeof(T));
    if (err_ == cudaSuccess) err_ = cuda::fill_u32(reinterpret_cast<uint32_t*>(p_), count, kNanPoison);
  }
  explicit DevArray(const std::vector<T>& host) : n_(host.size()) {
    err_ = cudaMalloc(&p_, (n_ == 0 ? 1 : n_) * sizeof(T));
    if (err_ == cudaSuccess && n_ > 0) err_ = cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DevArray() {
    if (p_) cudaFree(p_);
  }
  DevArray(const DevArray&) = delete;
  DevArray& operator=(const DevArray&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  cudaError_t error() const { return err_; }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    if (n_ > 0 && cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) h.clear();
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
  cudaError_t err_ = cudaSuccess;
};

// Untyped device memory freed on scope exit; error() says whether cudaMalloc succeeded.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { err_ = cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes); }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }
  cudaError_t error() const { return err_; }

 private:
  void* ptr_ = nullptr;
  cudaError_t err_ = cudaSuccess;
};

}  // namespace dflash::test

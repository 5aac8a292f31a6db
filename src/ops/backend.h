// Backend: the ops a forward pass needs, on buffers that live where the backend computes (host memory
// for the CPU, device memory for CUDA). The model's forward is written once against this interface;
// `CpuBackend` runs the ops/cpu reference kernels, and the CUDA backend the ops/cuda kernels.
//
// All activations are float32, row-major. Weights are cpu::WeightView whose data lives where the
// backend computes (the CPU backend reads the GGUF mapping in place).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "base/status.h"
#include "base/thread_pool.h"
#include "ops/cpu/ops.h"

namespace dflash {

class Backend;

// Float32 memory owned by a backend; moves, never copies. A Buffer must not outlive its backend.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* owner, float* data, int64_t n) : owner_(owner), data_(data), n_(n) {}
  inline ~Buffer();
  Buffer(Buffer&& o) noexcept : owner_(o.owner_), data_(o.data_), n_(o.n_) { o.data_ = nullptr; o.n_ = 0; }
  inline Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  float* data() const { return data_; }
  int64_t size() const { return n_; }

 private:
  Backend* owner_ = nullptr;
  float* data_ = nullptr;
  int64_t n_ = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // ---- memory
  virtual Result<Buffer> alloc(int64_t n_floats) = 0;
  virtual void release(float* data) = 0;
  // Host <-> backend copies of n floats (the CPU backend's are memcpy).
  virtual Status upload(float* dst, const float* host_src, int64_t n) = 0;
  virtual Status download(float* host_dst, const float* src, int64_t n) = 0;
  virtual Status copy(float* dst, const float* src, int64_t n) = 0;
  // Waits until all work queued on the backend is done (a no-op on the CPU).
  virtual Status synchronize() { return Status(); }

  // ---- the ops of ops/cpu/ops.h, same semantics
  virtual Status matmul(const cpu::WeightView& w, const float* x, int64_t n, float* y) = 0;
  virtual Status embedding(const cpu::WeightView& table, std::span<const int32_t> ids, float* out) = 0;
  virtual Status rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* y) = 0;
  virtual Status rope_neox(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t rot_dims,
                           std::span<const int32_t> positions, double theta, double freq_scale) = 0;
  virtual Status attention(const float* q, int64_t n_q, int64_t n_heads, const cpu::KvView& kv,
                           const cpu::AttentionMask& mask, float scale, float* out) = 0;
  virtual Status gated_delta_net(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                 int64_t n, const cpu::DeltaNetShape& s, float* state, float* out,
                                 float* per_token_states, std::span<const int32_t> parents, bool chunked) = 0;
  virtual Status causal_conv1d_silu(const float* x, int64_t n, int64_t channels, const float* w, int64_t kernel,
                                    float* conv_state, float* out, std::span<const int32_t> parents) = 0;

  // ---- elementwise glue of the layer kinds (each a kernel on a device backend)
  virtual Status add_inplace(float* y, const float* x, int64_t n) = 0;          // y += x
  virtual Status mul_inplace(float* y, const float* x, int64_t n) = 0;          // y *= x
  virtual Status silu_inplace(float* x, int64_t n) = 0;
  virtual Status sigmoid_inplace(float* x, int64_t n) = 0;
  virtual Status swiglu(const float* gate, const float* up, float* out, int64_t n) = 0;
  // Rows of `src` [rows, src_width]: columns [offset, offset + width) of each row into dst [rows, width].
  virtual Status slice_columns(const float* src, int64_t rows, int64_t src_width, int64_t offset, int64_t width,
                               float* dst) = 0;
  // x [rows, dim]: x / sqrt(sum x^2 + eps) * scale per row (DeltaNet q/k L2 normalisation).
  virtual Status l2_norm_rows(float* x, int64_t rows, int64_t dim, float eps, float scale) = 0;
  // DeltaNet gates over [n, Hv]: decay = ssm_a[h] * softplus(alpha + dt_bias[h]), beta = sigmoid(beta).
  virtual Status deltanet_gates(float* alpha_to_decay, float* beta, const float* dt_bias, const float* ssm_a,
                                int64_t n, int64_t n_heads) = 0;
  // Rows `rows` of x [*, dim] gathered into out [rows.size(), dim].
  virtual Status gather_rows(const float* x, int64_t dim, std::span<const int64_t> rows, float* out) = 0;
};

inline Buffer::~Buffer() {
  if (owner_ != nullptr && data_ != nullptr) owner_->release(data_);
}

inline Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    if (owner_ != nullptr && data_ != nullptr) owner_->release(data_);
    owner_ = o.owner_;
    data_ = o.data_;
    n_ = o.n_;
    o.data_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

// The reference backend: ops/cpu kernels on host memory, threaded by a pool.
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads = 0) : pool_(threads) {}
  const char* name() const override { return "cpu"; }
  ThreadPool& pool() { return pool_; }

  Result<Buffer> alloc(int64_t n_floats) override;
  void release(float* data) override;
  Status upload(float* dst, const float* src, int64_t n) override;
  Status download(float* dst, const float* src, int64_t n) override;
  Status copy(float* dst, const float* src, int64_t n) override;

  Status matmul(const cpu::WeightView& w, const float* x, int64_t n, float* y) override;
  Status embedding(const cpu::WeightView& table, std::span<const int32_t> ids, float* out) override;
  Status rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* y) override;
  Status rope_neox(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t rot_dims,
                   std::span<const int32_t> positions, double theta, double freq_scale) override;
  Status attention(const float* q, int64_t n_q, int64_t n_heads, const cpu::KvView& kv, const cpu::AttentionMask& mask,
                   float scale, float* out) override;
  Status gated_delta_net(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t n,
                         const cpu::DeltaNetShape& s, float* state, float* out, float* per_token_states,
                         std::span<const int32_t> parents, bool chunked) override;
  Status causal_conv1d_silu(const float* x, int64_t n, int64_t channels, const float* w, int64_t kernel,
                            float* conv_state, float* out, std::span<const int32_t> parents) override;
  Status add_inplace(float* y, const float* x, int64_t n) override;
  Status mul_inplace(float* y, const float* x, int64_t n) override;
  Status silu_inplace(float* x, int64_t n) override;
  Status sigmoid_inplace(float* x, int64_t n) override;
  Status swiglu(const float* gate, const float* up, float* out, int64_t n) override;
  Status slice_columns(const float* src, int64_t rows, int64_t src_width, int64_t offset, int64_t width,
                       float* dst) override;
  Status l2_norm_rows(float* x, int64_t rows, int64_t dim, float eps, float scale) override;
  Status deltanet_gates(float* alpha_to_decay, float* beta, const float* dt_bias, const float* ssm_a, int64_t n,
                        int64_t n_heads) override;
  Status gather_rows(const float* x, int64_t dim, std::span<const int64_t> rows, float* out) override;

 private:
  ThreadPool pool_;
};

}  // namespace dflash

// ProfilingBackend: a Backend that forwards every op to another backend and records, per op kind, how
// often it ran, the time it took on the inner backend's timeline (Backend::mark: CUDA events on a GPU,
// the host clock on the CPU) and the bytes it had to move at least (weights in their stored type,
// activations, KV and recurrent state in f32). `dflash bench --profile` runs decode steps through it to
// list every op's share of a step beside the bandwidth ceiling.
//
// Buffers are the inner backend's (alloc forwards), so a SequenceState may be built on either.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ops/backend.h"

namespace dflash {

struct OpProfileRow {
  std::string op;
  int64_t calls = 0;
  double ms = 0;       // summed op time on the backend's timeline
  double host_ms = 0;  // summed time the host spent in the call (enqueueing, for a device backend)
  double bytes = 0;    // summed minimum bytes moved
};

class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(Backend& inner) : inner_(inner) {}
  const char* name() const override { return inner_.name(); }

  // Waits for the inner backend and folds the recorded marks into the totals (call before report()).
  Status collect();
  // Totals per op since the last reset(), largest time first.
  std::vector<OpProfileRow> report() const;
  void reset();

  Status synchronize() override { return inner_.synchronize(); }
  Result<double> measure_peak_matmul_flops() override { return inner_.measure_peak_matmul_flops(); }
  cpu::KvType kv_type() const override { return inner_.kv_type(); }
  bool device_memory() const override { return inner_.device_memory(); }
  const Backend* memory_owner() const override { return inner_.memory_owner(); }
  MemoryStats memory_stats() const override { return inner_.memory_stats(); }
  void set_token_exact(bool on) override { inner_.set_token_exact(on); }
  void trim() override { inner_.trim(); }
  Result<Buffer> alloc(int64_t n_floats) override { return inner_.alloc(n_floats); }
  void release(float* data) override { inner_.release(data); }
  Status upload(float* dst, const float* src, int64_t n) override;
  Status download(float* dst, const float* src, int64_t n) override;
  Status copy(float* dst, const float* src, int64_t n) override;
  Status copy_batch(std::span<const CopyItem> items) override;
  Status copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t cols,
                   int64_t rows) override;
  Status restore_deltanet(std::span<const DeltaNetRestore> layers, int64_t n, const cpu::DeltaNetShape& s) override;
  Result<uint64_t> weight_bytes(const cpu::WeightView& w) const override { return inner_.weight_bytes(w); }
  Status pack_weight(const cpu::WeightView& w, void* dst) const override { return inner_.pack_weight(w, dst); }

  Status matmul(const cpu::WeightView& w, const float* x, int64_t n, float* y) override;
  Status matmul_swiglu(const cpu::WeightView& gate, const cpu::WeightView& up, const float* x, int64_t n, float* g,
                       float* u) override;
  Status matmul_group(std::span<const cpu::WeightView* const> ws, const float* x, int64_t n,
                      std::span<float* const> ys) override;
  Status embedding(const cpu::WeightView& table, std::span<const int32_t> ids, float* out) override;
  Status rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* y) override;
  Status rope_neox(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t rot_dims,
                   std::span<const int32_t> positions, double theta, double freq_scale) override;
  Status attention(const float* q, int64_t n_q, int64_t n_heads, const cpu::KvView& kv, const cpu::AttentionMask& mask,
                   float scale, float* out) override;
  Status gated_delta_net(const float* q, const float* k, const float* v, const float* g, const float* beta, int64_t n,
                         const cpu::DeltaNetShape& s, float* state, float* out, float* per_token_states,
                         std::span<const int32_t> parents, bool chunked, float* state_before) override;
  Status causal_conv1d_silu(const float* x, int64_t n, int64_t channels, const float* w, int64_t kernel,
                            float* conv_state, float* out, std::span<const int32_t> parents) override;
  Status kv_write(const cpu::KvView& kv, int64_t first_pos, const float* k, const float* v, int64_t n) override;
  Status attention_prep(float* q, float* k, const float* v, int64_t n, int64_t nh, int64_t nkv, int64_t hd,
                        const float* q_norm, const float* k_norm, float eps, int64_t rot,
                        std::span<const int32_t> positions, double theta, double freq_scale, const cpu::KvView& kv,
                        int64_t first_slot, int64_t q_from) override;
  Status add_inplace(float* y, const float* x, int64_t n) override;
  Status add_rms_norm(float* x, const float* delta, const float* w, float eps, int64_t n, int64_t dim,
                      float* y) override;
  Status mul_inplace(float* y, const float* x, int64_t n) override;
  Status silu_inplace(float* x, int64_t n) override;
  Status sigmoid_inplace(float* x, int64_t n) override;
  Status swiglu(const float* gate, const float* up, float* out, int64_t n) override;
  Status slice_columns(const float* src, int64_t rows, int64_t src_width, int64_t offset, int64_t width,
                       float* dst) override;
  Status l2_norm_rows(float* x, int64_t rows, int64_t dim, float eps, float scale) override;
  Status deltanet_prep(const float* mixed, int64_t n, const cpu::DeltaNetShape& s, const float* conv_w, int64_t kernel,
                       float* conv_state, std::span<const int32_t> parents, float* q, float* k, float* v,
                       float* alpha_to_decay, float* beta, const float* dt_bias, const float* ssm_a,
                       float* conv_capture = nullptr) override;
  Status rms_norm_silu_gate(float* o, const float* w, float eps, int64_t rows, int64_t dim, float* z) override;
  Status sigmoid_gate_mul(float* o, const float* gate, int64_t rows, int64_t dim, int64_t gate_stride) override;

  Status deltanet_gates(float* alpha_to_decay, float* beta, const float* dt_bias, const float* ssm_a, int64_t n,
                        int64_t n_heads) override;
  Status gather_rows(const float* x, int64_t dim, std::span<const int64_t> rows, float* out) override;
  Status top_k_rows(const float* x, int64_t rows, int64_t cols, int64_t k, int32_t* ids, float* values,
                    float* lse) override;

 private:
  struct Pending {
    const char* op;
    double bytes, host_ms;
    int64_t begin, end;
  };
  template <typename F>
  Status timed(const char* op, double bytes, F&& f);

  Backend& inner_;
  std::vector<Pending> pending_;
  std::map<std::string, OpProfileRow> totals_;
};

}  // namespace dflash

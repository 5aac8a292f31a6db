#include "decode/profiling_backend.h"

#include <algorithm>
#include <chrono>

#include "tensor/dtype.h"

namespace dflash {
namespace {

constexpr double kF = 4.0;  // bytes per f32 activation
// Bytes per element of a KV store.
double kv_bytes(const cpu::KvView& kv) { return kv.type == cpu::KvType::kF16 ? 2.0 : kF; }

// Bytes of weight w in `be`'s memory (its form there), what a product reads.
double weight_read_bytes(const Backend& be, const cpu::WeightView& w) {
  const auto b = be.weight_bytes(w);
  return b.ok() ? static_cast<double>(*b) : 0.0;
}

}  // namespace

template <typename F>
Status ProfilingBackend::timed(const char* op, double bytes, F&& f) {
  const int64_t a = inner_.mark();
  const auto t0 = std::chrono::steady_clock::now();
  Status st = f();
  const double host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const int64_t b = inner_.mark();
  pending_.push_back({op, bytes, host_ms, a, b});
  return st;
}

Status ProfilingBackend::collect() {
  DF_RETURN_IF_ERROR(inner_.synchronize());
  for (const Pending& p : pending_) {
    OpProfileRow& r = totals_[p.op];
    r.op = p.op;
    r.calls += 1;
    r.ms += inner_.elapsed_ms(p.begin, p.end);
    r.host_ms += p.host_ms;
    r.bytes += p.bytes;
  }
  pending_.clear();
  inner_.clear_marks();
  return Status();
}

std::vector<OpProfileRow> ProfilingBackend::report() const {
  std::vector<OpProfileRow> rows;
  for (const auto& [name, r] : totals_) rows.push_back(r);
  std::sort(rows.begin(), rows.end(), [](const OpProfileRow& a, const OpProfileRow& b) { return a.ms > b.ms; });
  return rows;
}

void ProfilingBackend::reset() {
  pending_.clear();
  totals_.clear();
  inner_.clear_marks();
}

Status ProfilingBackend::upload(float* dst, const float* src, int64_t n) {
  return timed("upload", kF * n, [&] { return inner_.upload(dst, src, n); });
}
Status ProfilingBackend::download(float* dst, const float* src, int64_t n) {
  return timed("download", kF * n, [&] { return inner_.download(dst, src, n); });
}
Status ProfilingBackend::copy(float* dst, const float* src, int64_t n) {
  return timed("copy", 2 * kF * n, [&] { return inner_.copy(dst, src, n); });
}

Status ProfilingBackend::copy_batch(std::span<const CopyItem> items) {
  double bytes = 0;
  for (const CopyItem& c : items) bytes += 2 * kF * static_cast<double>(c.n);
  return timed("copy", bytes, [&] { return inner_.copy_batch(items); });
}

Status ProfilingBackend::copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t cols,
                                   int64_t rows) {
  return timed("copy", 2 * kF * cols * rows,
               [&] { return inner_.copy_rows(dst, dst_stride, src, src_stride, cols, rows); });
}

Status ProfilingBackend::restore_deltanet(std::span<const DeltaNetRestore> layers, int64_t n,
                                          const cpu::DeltaNetShape& s) {
  const double st = kF * s.n_v_heads * s.d_k * s.d_v;
  double bytes = 0;
  for (const DeltaNetRestore& l : layers)
    bytes += (l.from != nullptr ? 2 * st : 0.0) + 2 * kF * l.conv_elems +
             (l.q != nullptr ? kF * n * (2.0 * s.n_k_heads * s.d_k + s.n_v_heads * s.d_v + 2.0 * s.n_v_heads) : 0.0);
  return timed("restore_deltanet", bytes, [&] { return inner_.restore_deltanet(layers, n, s); });
}

Status ProfilingBackend::matmul(const cpu::WeightView& w, const float* x, int64_t n, float* y) {
  const double bytes = weight_read_bytes(inner_, w) + kF * n * static_cast<double>(w.rows + w.cols);
  return timed(w.type == DType::kF32 ? "matmul f32" : "matmul", bytes, [&] { return inner_.matmul(w, x, n, y); });
}

Status ProfilingBackend::matmul_group(std::span<const cpu::WeightView* const> ws, const float* x, int64_t n,
                                      std::span<float* const> ys) {
  double bytes = ws.empty() ? 0.0 : kF * n * static_cast<double>(ws[0]->cols);
  for (const cpu::WeightView* w : ws) bytes += weight_read_bytes(inner_, *w) + kF * n * static_cast<double>(w->rows);
  return timed("matmul (grouped)", bytes, [&] { return inner_.matmul_group(ws, x, n, ys); });
}

Status ProfilingBackend::matmul_swiglu(const cpu::WeightView& gate, const cpu::WeightView& up, const float* x,
                                       int64_t n, float* g, float* u) {
  const double bytes = weight_read_bytes(inner_, gate) + weight_read_bytes(inner_, up) +
                       kF * n * static_cast<double>(gate.cols + gate.rows);
  return timed("matmul + swiglu", bytes, [&] { return inner_.matmul_swiglu(gate, up, x, n, g, u); });
}

Status ProfilingBackend::embedding(const cpu::WeightView& table, std::span<const int32_t> ids, float* out) {
  const double row = table.rows > 0 ? weight_read_bytes(inner_, table) / static_cast<double>(table.rows) : 0.0;
  const double bytes = static_cast<double>(ids.size()) * (row + kF * static_cast<double>(table.cols));
  return timed("embedding", bytes, [&] { return inner_.embedding(table, ids, out); });
}

Status ProfilingBackend::rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* y) {
  return timed("rms_norm", kF * (2.0 * n * dim + dim), [&] { return inner_.rms_norm(x, w, eps, n, dim, y); });
}

Status ProfilingBackend::rope_neox(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t rot_dims,
                                   std::span<const int32_t> positions, double theta, double freq_scale) {
  return timed("rope", 2 * kF * n * n_heads * head_dim,
               [&] { return inner_.rope_neox(x, n, n_heads, head_dim, rot_dims, positions, theta, freq_scale); });
}

Status ProfilingBackend::attention(const float* q, int64_t n_q, int64_t n_heads, const cpu::KvView& kv,
                                   const cpu::AttentionMask& mask, float scale, float* out) {
  const double bytes =
      kF * 2.0 * n_q * n_heads * kv.head_dim + kv_bytes(kv) * 2.0 * kv.n_tokens * kv.n_kv_heads * kv.head_dim;
  return timed("attention", bytes, [&] { return inner_.attention(q, n_q, n_heads, kv, mask, scale, out); });
}

Status ProfilingBackend::gated_delta_net(const float* q, const float* k, const float* v, const float* g,
                                         const float* beta, int64_t n, const cpu::DeltaNetShape& s, float* state,
                                         float* out, float* per_token_states, std::span<const int32_t> parents,
                                         bool chunked, float* state_before) {
  const double st = kF * s.n_v_heads * s.d_k * s.d_v;
  const double io = kF * n * (2.0 * s.n_k_heads * s.d_k + 2.0 * s.n_v_heads * s.d_v + 2.0 * s.n_v_heads);
  const double bytes = 2 * st + io + (per_token_states ? st * n : 0.0) + (state_before ? st : 0.0);
  return timed("gated_delta_net", bytes, [&] {
    return inner_.gated_delta_net(q, k, v, g, beta, n, s, state, out, per_token_states, parents, chunked,
                                  state_before);
  });
}

Status ProfilingBackend::causal_conv1d_silu(const float* x, int64_t n, int64_t channels, const float* w,
                                            int64_t kernel, float* conv_state, float* out,
                                            std::span<const int32_t> parents) {
  const double bytes = kF * channels * (2.0 * n + kernel + 2.0 * (kernel - 1));
  return timed("conv1d_silu", bytes,
               [&] { return inner_.causal_conv1d_silu(x, n, channels, w, kernel, conv_state, out, parents); });
}

Status ProfilingBackend::kv_write(const cpu::KvView& kv, int64_t first_pos, const float* k, const float* v,
                                  int64_t n) {
  // K and V read as f32, stored as the store's elements.
  return timed("kv_write", 2 * (kF + kv_bytes(kv)) * n * kv.n_kv_heads * kv.head_dim,
               [&] { return inner_.kv_write(kv, first_pos, k, v, n); });
}

Status ProfilingBackend::attention_prep(float* q, float* k, const float* v, int64_t n, int64_t nh, int64_t nkv,
                                        int64_t hd, const float* q_norm, const float* k_norm, float eps, int64_t rot,
                                        std::span<const int32_t> positions, double theta, double freq_scale,
                                        const cpu::KvView& kv, int64_t first_slot, int64_t q_from) {
  const double bytes =
      kF * (2.0 * (n - q_from) * nh * hd + 2.0 * n * nkv * hd + 2.0 * hd) + kv_bytes(kv) * 2.0 * n * nkv * hd;
  return timed("attention_prep", bytes, [&] {
    return inner_.attention_prep(q, k, v, n, nh, nkv, hd, q_norm, k_norm, eps, rot, positions, theta, freq_scale, kv,
                                 first_slot, q_from);
  });
}

Status ProfilingBackend::add_inplace(float* y, const float* x, int64_t n) {
  return timed("add", 3 * kF * n, [&] { return inner_.add_inplace(y, x, n); });
}
Status ProfilingBackend::add_rms_norm(float* x, const float* delta, const float* w, float eps, int64_t n,
                                      int64_t dim, float* y) {
  return timed("add_rms_norm", kF * (4.0 * n * dim + dim), [&] { return inner_.add_rms_norm(x, delta, w, eps, n, dim, y); });
}
Status ProfilingBackend::mul_inplace(float* y, const float* x, int64_t n) {
  return timed("mul", 3 * kF * n, [&] { return inner_.mul_inplace(y, x, n); });
}
Status ProfilingBackend::silu_inplace(float* x, int64_t n) {
  return timed("silu", 2 * kF * n, [&] { return inner_.silu_inplace(x, n); });
}
Status ProfilingBackend::sigmoid_inplace(float* x, int64_t n) {
  return timed("sigmoid", 2 * kF * n, [&] { return inner_.sigmoid_inplace(x, n); });
}
Status ProfilingBackend::swiglu(const float* gate, const float* up, float* out, int64_t n) {
  return timed("swiglu", 3 * kF * n, [&] { return inner_.swiglu(gate, up, out, n); });
}
Status ProfilingBackend::slice_columns(const float* src, int64_t rows, int64_t src_width, int64_t offset,
                                       int64_t width, float* dst) {
  return timed("slice_columns", 2 * kF * rows * width,
               [&] { return inner_.slice_columns(src, rows, src_width, offset, width, dst); });
}
Status ProfilingBackend::l2_norm_rows(float* x, int64_t rows, int64_t dim, float eps, float scale) {
  return timed("l2_norm", 2 * kF * rows * dim, [&] { return inner_.l2_norm_rows(x, rows, dim, eps, scale); });
}
Status ProfilingBackend::deltanet_gates(float* alpha_to_decay, float* beta, const float* dt_bias, const float* ssm_a,
                                        int64_t n, int64_t n_heads) {
  return timed("deltanet_gates", 4 * kF * n * n_heads,
               [&] { return inner_.deltanet_gates(alpha_to_decay, beta, dt_bias, ssm_a, n, n_heads); });
}
Status ProfilingBackend::deltanet_prep(const float* mixed, int64_t n, const cpu::DeltaNetShape& s,
                                       const float* conv_w, int64_t kernel, float* conv_state,
                                       std::span<const int32_t> parents, float* q, float* k, float* v,
                                       float* alpha_to_decay, float* beta, const float* dt_bias, const float* ssm_a,
                                       float* conv_capture) {
  // mixed read and q/k/v written, the window and weights, the gates read and written; the capture written.
  const double C = 2.0 * s.n_k_heads * s.d_k + static_cast<double>(s.n_v_heads) * s.d_v;
  const double bytes = kF * (2.0 * n * C + C * (2.0 * kernel - 1) + 4.0 * n * s.n_v_heads +
                             (conv_capture != nullptr ? (kernel - 1.0 + n) * C : 0.0));
  return timed("deltanet_prep", bytes, [&] {
    return inner_.deltanet_prep(mixed, n, s, conv_w, kernel, conv_state, parents, q, k, v, alpha_to_decay, beta,
                                dt_bias, ssm_a, conv_capture);
  });
}
Status ProfilingBackend::rms_norm_silu_gate(float* o, const float* w, float eps, int64_t rows, int64_t dim, float* z) {
  return timed("rms_norm_silu_gate", kF * (3.0 * rows * dim + dim),
               [&] { return inner_.rms_norm_silu_gate(o, w, eps, rows, dim, z); });
}
Status ProfilingBackend::sigmoid_gate_mul(float* o, const float* gate, int64_t rows, int64_t dim,
                                          int64_t gate_stride) {
  return timed("sigmoid_gate_mul", 3 * kF * rows * dim,
               [&] { return inner_.sigmoid_gate_mul(o, gate, rows, dim, gate_stride); });
}
Status ProfilingBackend::gather_rows(const float* x, int64_t dim, std::span<const int64_t> rows, float* out) {
  return timed("gather_rows", 2 * kF * static_cast<double>(rows.size()) * dim,
               [&] { return inner_.gather_rows(x, dim, rows, out); });
}
Status ProfilingBackend::top_k_rows(const float* x, int64_t rows, int64_t cols, int64_t k, int32_t* ids,
                                    float* values, float* lse) {
  return timed("top_k_rows", kF * static_cast<double>(rows) * static_cast<double>(cols),
               [&] { return inner_.top_k_rows(x, rows, cols, k, ids, values, lse); });
}

}  // namespace dflash

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "base/checked_math.h"
#include "ops/backend.h"
#include "tensor/half.h"

namespace dflash {

int64_t Backend::mark() {
  (void)synchronize();
  host_marks_.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
  return static_cast<int64_t>(host_marks_.size()) - 1;
}

double Backend::elapsed_ms(int64_t a, int64_t b) const {
  const auto n = static_cast<int64_t>(host_marks_.size());
  if (a < 0 || b < 0 || a >= n || b >= n) return 0.0;
  return (host_marks_[static_cast<size_t>(b)] - host_marks_[static_cast<size_t>(a)]) * 1e3;
}

Result<uint64_t> Backend::weight_bytes(const cpu::WeightView& w) const {
  DF_ASSIGN_OR_RETURN(const uint64_t rb, row_bytes(w.type, static_cast<uint64_t>(w.cols)));
  const auto bytes = checked_mul(rb, static_cast<uint64_t>(w.rows));
  if (!bytes || w.rows < 0) return invalid_argument("a {} x {} {} weight overflows", w.rows, w.cols, dtype_name(w.type));
  return *bytes;
}

Status Backend::check_copy_batch(std::span<const CopyItem> items) {
  struct Range {
    uintptr_t begin, end;
    size_t item;
    bool write;
  };
  std::vector<Range> ranges;
  ranges.reserve(2 * items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const CopyItem& c = items[i];
    if (c.n < 0) return invalid_argument("copy_batch: item {} of {} floats", i, c.n);
    if (c.n == 0) continue;
    if (c.dst == nullptr || c.src == nullptr) return invalid_argument("copy_batch: item {} has a null pointer", i);
    const auto bytes = static_cast<uintptr_t>(c.n) * sizeof(float);
    ranges.push_back({reinterpret_cast<uintptr_t>(c.dst), reinterpret_cast<uintptr_t>(c.dst) + bytes, i, true});
    ranges.push_back({reinterpret_cast<uintptr_t>(c.src), reinterpret_cast<uintptr_t>(c.src) + bytes, i, false});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::vector<const Range*> open;  // ranges that reach past the current one's start (few: items rarely overlap)
  for (const Range& r : ranges) {
    std::erase_if(open, [&](const Range* a) { return a->end <= r.begin; });
    for (const Range* a : open)
      if ((a->write || r.write) && a->item != r.item)
        return invalid_argument("copy_batch: items {} and {} overlap", std::min(a->item, r.item),
                                std::max(a->item, r.item));
    open.push_back(&r);
  }
  return Status();
}

Status Backend::copy_batch(std::span<const CopyItem> items) {
  DF_RETURN_IF_ERROR(check_copy_batch(items));
  for (const CopyItem& c : items)
    if (c.n > 0) DF_RETURN_IF_ERROR(copy(c.dst, c.src, c.n));
  return Status();
}

Status Backend::pack_weight(const cpu::WeightView& w, void* dst) const {
  DF_ASSIGN_OR_RETURN(const uint64_t bytes, weight_bytes(w));
  std::memcpy(dst, w.data, bytes);
  return Status();
}

Status Backend::kv_write(const cpu::KvView& kv, int64_t first_pos, const float* k, const float* v, int64_t n) {
  const int64_t row = kv.n_kv_heads * kv.head_dim;
  if (first_pos < 0 || n < 0 || kv.chunk_tokens <= 0) return invalid_argument("kv_write: bad position or count");
  if (kv.type == cpu::KvType::kF16 && device_memory())
    return unsupported("kv_write: {} keeps no f16 KV", name());
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = first_pos + t, c = pos / kv.chunk_tokens;
    if (c >= static_cast<int64_t>(kv.k_chunks.size()))
      return invalid_argument("kv_write: position {} is past the store's {} chunks", pos, kv.k_chunks.size());
    const int64_t slot = pos % kv.chunk_tokens;
    if (kv.type == cpu::KvType::kF16) {  // host memory (checked above): rounded to fp16 in place
      auto* kd = reinterpret_cast<uint16_t*>(const_cast<float*>(kv.k_chunks[static_cast<size_t>(c)])) + slot * row;
      auto* vd = reinterpret_cast<uint16_t*>(const_cast<float*>(kv.v_chunks[static_cast<size_t>(c)])) + slot * row;
      fp32_to_fp16_row(k + t * row, kd, row);
      fp32_to_fp16_row(v + t * row, vd, row);
      continue;
    }
    DF_RETURN_IF_ERROR(copy(const_cast<float*>(kv.k_chunks[static_cast<size_t>(c)]) + slot * row, k + t * row, row));
    DF_RETURN_IF_ERROR(copy(const_cast<float*>(kv.v_chunks[static_cast<size_t>(c)]) + slot * row, v + t * row, row));
  }
  return Status();
}

Status Backend::deltanet_prep(const float* mixed, int64_t n, const cpu::DeltaNetShape& s, const float* conv_w,
                              int64_t kernel, float* conv_state, std::span<const int32_t> parents, float* q, float* k,
                              float* v, float* alpha_to_decay, float* beta, const float* dt_bias, const float* ssm_a,
                              float* conv_capture) {
  const int64_t qk = s.n_k_heads * s.d_k, C = 2 * qk + s.n_v_heads * s.d_v;
  if (conv_capture != nullptr) {  // before the conv moves the window
    const int64_t window = (kernel - 1) * C;
    if (window > 0) DF_RETURN_IF_ERROR(copy(conv_capture, conv_state, window));
    DF_RETURN_IF_ERROR(copy(conv_capture + window, mixed, n * C));
  }
  DF_ASSIGN_OR_RETURN(Buffer u, alloc(n * C));
  DF_RETURN_IF_ERROR(causal_conv1d_silu(mixed, n, C, conv_w, kernel, conv_state, u.data(), parents));
  DF_RETURN_IF_ERROR(slice_columns(u.data(), n, C, 0, qk, q));
  DF_RETURN_IF_ERROR(slice_columns(u.data(), n, C, qk, qk, k));
  DF_RETURN_IF_ERROR(slice_columns(u.data(), n, C, 2 * qk, s.n_v_heads * s.d_v, v));
  DF_RETURN_IF_ERROR(l2_norm_rows(q, n * s.n_k_heads, s.d_k, 1e-6f, 1.0f / std::sqrt(static_cast<float>(s.d_k))));
  DF_RETURN_IF_ERROR(l2_norm_rows(k, n * s.n_k_heads, s.d_k, 1e-6f, 1.0f));
  return deltanet_gates(alpha_to_decay, beta, dt_bias, ssm_a, n, s.n_v_heads);
}

Status Backend::sigmoid_gate_mul(float* o, const float* gate, int64_t rows, int64_t dim, int64_t gate_stride) {
  DF_ASSIGN_OR_RETURN(Buffer g, alloc(rows * dim));
  DF_RETURN_IF_ERROR(slice_columns(gate, rows, gate_stride, 0, dim, g.data()));
  DF_RETURN_IF_ERROR(sigmoid_inplace(g.data(), rows * dim));
  return mul_inplace(o, g.data(), rows * dim);
}

// Each allocation carries a 16-byte header in front of the data (keeping its 16-byte alignment) that
// holds its size, for the memory accounting.
constexpr int64_t kHeaderFloats = 4;

Result<Buffer> CpuBackend::alloc(int64_t n_floats) {
  if (n_floats < 0) return invalid_argument("negative buffer size {}", n_floats);
  const int64_t n = std::max<int64_t>(n_floats, 1);
  float* p = new (std::nothrow) float[static_cast<size_t>(n + kHeaderFloats)];
  if (p == nullptr) return Status(ErrorCode::kOutOfMemory, fmt::format("cannot allocate {} floats", n_floats));
  std::memcpy(p, &n, sizeof n);
  const uint64_t bytes = static_cast<uint64_t>(n) * sizeof(float);
  const uint64_t live = live_.fetch_add(bytes) + bytes;
  uint64_t peak = peak_.load();
  while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
  }
  return Buffer(this, p + kHeaderFloats, n_floats);
}

void CpuBackend::release(float* data) {
  if (data == nullptr) return;
  float* p = data - kHeaderFloats;
  int64_t n = 0;
  std::memcpy(&n, p, sizeof n);
  live_.fetch_sub(static_cast<uint64_t>(n) * sizeof(float));
  delete[] p;
}

MemoryStats CpuBackend::memory_stats() const {
  MemoryStats m;
  m.buffers_live = live_.load();
  m.buffers_peak = peak_.load();
  return m;
}

Status CpuBackend::upload(float* dst, const float* src, int64_t n) {
  std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
  return Status();
}
Status CpuBackend::download(float* dst, const float* src, int64_t n) { return upload(dst, src, n); }
Status CpuBackend::copy(float* dst, const float* src, int64_t n) { return upload(dst, src, n); }

Status CpuBackend::matmul(const cpu::WeightView& w, const float* x, int64_t n, float* y) {
  return cpu::matmul(w, x, n, y, pool_);
}
Status CpuBackend::embedding(const cpu::WeightView& table, std::span<const int32_t> ids, float* out) {
  return cpu::embedding_lookup(table, ids, out);
}
Status CpuBackend::rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* y) {
  cpu::rms_norm(x, w, eps, n, dim, y);
  return Status();
}
Status CpuBackend::rope_neox(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t rot_dims,
                             std::span<const int32_t> positions, double theta, double freq_scale) {
  cpu::rope_neox(x, n, n_heads, head_dim, rot_dims, positions, theta, freq_scale);
  return Status();
}
Status CpuBackend::attention(const float* q, int64_t n_q, int64_t n_heads, const cpu::KvView& kv,
                             const cpu::AttentionMask& mask, float scale, float* out) {
  cpu::attention(q, n_q, n_heads, kv, mask, scale, out, pool_);
  return Status();
}
Status CpuBackend::gated_delta_net(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                   int64_t n, const cpu::DeltaNetShape& s, float* state, float* out,
                                   float* per_token_states, std::span<const int32_t> parents, bool chunked,
                                   float* state_before) {
  if (chunked) {
    DF_RETURN_IF_ERROR(check_chunked_deltanet(per_token_states, parents, state_before));
    cpu::gated_delta_net_chunked(q, k, v, g, beta, n, s, state, out, pool_);
  } else {
    if (state_before != nullptr) std::copy_n(state, s.n_v_heads * s.d_v * s.d_k, state_before);
    cpu::gated_delta_net_recurrent(q, k, v, g, beta, n, s, state, out, per_token_states, parents, pool_);
  }
  return Status();
}
Status CpuBackend::causal_conv1d_silu(const float* x, int64_t n, int64_t channels, const float* w, int64_t kernel,
                                      float* conv_state, float* out, std::span<const int32_t> parents) {
  cpu::causal_conv1d_silu(x, n, channels, w, kernel, conv_state, out, parents);
  return Status();
}
Status CpuBackend::add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  return Status();
}
Status CpuBackend::mul_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= x[i];
  return Status();
}
Status CpuBackend::silu_inplace(float* x, int64_t n) {
  cpu::silu_inplace(x, n);
  return Status();
}
Status CpuBackend::sigmoid_inplace(float* x, int64_t n) {
  cpu::sigmoid_inplace(x, n);
  return Status();
}
Status CpuBackend::swiglu(const float* gate, const float* up, float* out, int64_t n) {
  cpu::swiglu(gate, up, out, n);
  return Status();
}
Status CpuBackend::slice_columns(const float* src, int64_t rows, int64_t src_width, int64_t offset, int64_t width,
                                 float* dst) {
  if (offset < 0 || width < 0 || offset + width > src_width)
    return internal_error("column slice [{}, +{}) of a {}-wide row", offset, width, src_width);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * width, src + r * src_width + offset, sizeof(float) * static_cast<size_t>(width));
  return Status();
}
Status CpuBackend::l2_norm_rows(float* x, int64_t rows, int64_t dim, float eps, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * dim;
    float ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += row[i] * row[i];
    const float inv = 1.0f / std::sqrt(ss + eps);
    for (int64_t i = 0; i < dim; ++i) row[i] = row[i] * inv * scale;
  }
  return Status();
}
Status CpuBackend::deltanet_gates(float* alpha_to_decay, float* beta, const float* dt_bias, const float* ssm_a,
                                  int64_t n, int64_t n_heads) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      float& a = alpha_to_decay[t * n_heads + h];
      a = ssm_a[h] * cpu::softplus(a + dt_bias[h]);
    }
  cpu::sigmoid_inplace(beta, n * n_heads);
  return Status();
}
Status CpuBackend::gather_rows(const float* x, int64_t dim, std::span<const int64_t> rows, float* out) {
  for (size_t r = 0; r < rows.size(); ++r)
    std::memcpy(out + static_cast<int64_t>(r) * dim, x + rows[r] * dim, sizeof(float) * static_cast<size_t>(dim));
  return Status();
}

static_assert(Backend::kMaxTopK == cpu::kMaxTopK);
Status CpuBackend::top_k_rows(const float* x, int64_t rows, int64_t cols, int64_t k, int32_t* ids, float* values,
                              float* lse) {
  return cpu::top_k_rows(x, rows, cols, k, ids, values, lse, pool_);
}

}  // namespace dflash

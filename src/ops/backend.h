// Backend: the ops a forward pass needs, on buffers that live where the backend computes (host memory
// for the CPU, device memory for CUDA). The model's forward is written once against this interface;
// `CpuBackend` runs the ops/cpu reference kernels, and the CUDA backend the ops/cuda kernels.
//
// All activations are float32, row-major. Weights are cpu::WeightView whose data lives where the
// backend computes (the CPU backend reads the GGUF mapping in place).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "ops/cpu/ops.h"

namespace dflash {

class Backend;

// Whether `rows` is r, r + 1, r + 2, ... (at least one row): such rows are read in place rather than gathered.
inline bool consecutive_rows(std::span<const int64_t> rows) {
  for (size_t i = 1; i < rows.size(); ++i)
    if (rows[i] != rows[0] + static_cast<int64_t>(i)) return false;
  return !rows.empty();
}

// The argument checks every backend's attention_prep and gated_delta_net make: positions one a token and queries
// from a token in [0, n]; the chunked DeltaNet form keeps no per-token or earlier states and has no tree form.
inline Status check_attention_prep(int64_t n, int64_t q_from, size_t n_positions) {
  if (q_from < 0 || q_from > n || static_cast<int64_t>(n_positions) != n)
    return invalid_argument("attention_prep: queries from token {} of {} ({} positions)", q_from, n, n_positions);
  return Status();
}
inline Status check_chunked_deltanet(const float* per_token_states, std::span<const int32_t> parents,
                                     const float* state_before) {
  if (per_token_states != nullptr || !parents.empty() || state_before != nullptr)
    return internal_error("the chunked DeltaNet form keeps no per-token or earlier states and has no tree form");
  return Status();
}

// What a backend holds (bytes). Buffers: alloc()ed memory (weights copied to the backend, sequence state,
// step temporaries); cached: freed buffers a device backend keeps for reuse; scratch: the backend's own
// work areas. device_total/device_used: the whole device as its driver reports it (0 on the CPU).
struct MemoryStats {
  uint64_t buffers_live = 0;
  uint64_t buffers_peak = 0;
  uint64_t buffers_cached = 0;
  uint64_t scratch = 0;
  uint64_t device_total = 0;
  uint64_t device_used = 0;
};

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

// The values a recorded step reads on the device (Backend::begin_step_capture, replay_step).
struct StepValues {
  std::span<const int32_t> tokens;     // embedding() ids
  std::span<const int32_t> positions;  // RoPE positions (rope_neox, attention_prep)
  std::span<const int32_t> parents;    // a tree step's parents (attention, DeltaNet, conv); empty otherwise
  int64_t first_slot = 0;              // the first KV slot the step writes (kv_write, attention_prep)
  int64_t n_prefix = 0, n_tokens = 0;  // attention: keys before the step's own, and all its keys
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
  // Several copies of n floats each in this backend's memory, where no item's destination overlaps another
  // item's source or destination (they may run in any order, or at once; items that do are refused, nothing
  // copied). A device backend does them all in one launch (a tree commit's states, conv windows and KV rows:
  // SequenceState::commit_tree).
  struct CopyItem {
    float* dst;
    const float* src;
    int64_t n;
  };
  virtual Status copy_batch(std::span<const CopyItem> items);
  // rows x cols floats between strided layouts in this backend's memory: row r of src at src + r * src_stride
  // into dst + r * dst_stride (strides >= cols). A device backend does it as one 2D copy.
  virtual Status copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t cols,
                           int64_t rows) {
    if (rows < 0 || cols < 0 || dst_stride < cols || src_stride < cols)
      return invalid_argument("copy_rows: {} rows of {} with strides {} and {}", rows, cols, dst_stride, src_stride);
    for (int64_t r = 0; r < rows; ++r) DF_RETURN_IF_ERROR(copy(dst + r * dst_stride, src + r * src_stride, cols));
    return Status();
  }
  // A weight's bytes in this backend's memory (Weights::to_backend): weight_bytes() of them, written by
  // pack_weight() into host memory and then uploaded. A device backend may keep a type in a form of its own
  // (CUDA: q6_K, q8_0 and q4_0 rows with aligned blocks, ops/cuda/weight_form.h); the default is the stored
  // bytes as they are.
  virtual Result<uint64_t> weight_bytes(const cpu::WeightView& w) const;
  virtual Status pack_weight(const cpu::WeightView& w, void* dst) const;
  // n floats from `src` in backend `from`'s memory into `dst` in this one's, without a host hop (CUDA devices:
  // a peer copy, ordered after the work `from` has queued, and `from`'s later work after it, without waiting on
  // the host); unsupported where the two cannot (the caller stages through the host).
  virtual Status copy_from_peer(float* dst, Backend& from, const float* src, int64_t n) {
    (void)dst, (void)from, (void)src, (void)n;
    return unsupported("no peer copy between these backends");
  }
  // copy_batch's argument check: sizes, null pointers, and items that overlap (an item's destination within another
  // item's source or destination).
  static Status check_copy_batch(std::span<const CopyItem> items);
  // True when buffers live in device memory (not addressable by the host).
  virtual bool device_memory() const { return false; }
  // The backend whose memory this one's buffers are (itself; a decorator answers for what it wraps).
  virtual const Backend* memory_owner() const { return this; }
  virtual MemoryStats memory_stats() const { return MemoryStats{}; }
  // Returns the memory of freed buffers that a caching backend keeps for reuse to the device (a parked
  // draft's weights, so the driver and other processes see them free). A no-op on the CPU.
  virtual void trim() {}
  // Waits until all work queued on the backend is done (a no-op on the CPU).
  virtual Status synchronize() { return Status(); }
  // The element type of the KV stores made for this backend (KvStore reads it when it is made).
  virtual cpu::KvType kv_type() const { return cpu::KvType::kF32; }
  // The measured rate of the backend's fastest dense product (a device: a large bf16 GEMM on its tensor
  // cores), in FLOP/s: the ceiling `dflash bench` sets beside prefill. Unsupported where none is measured.
  virtual Result<double> measure_peak_matmul_flops() { return unsupported("{}: no peak matmul rate", name()); }

  // ---- timeline marks, for profiles (decode/profiling_backend.h)
  // mark() records a point on the backend's timeline after the work queued so far and returns its id;
  // elapsed_ms(a, b) is the time between two marks, valid after synchronize(); clear_marks() forgets
  // them. A device backend records events without waiting; the default waits for the backend and reads
  // the host clock (exact for the CPU, whose ops run synchronously).
  virtual int64_t mark();
  virtual double elapsed_ms(int64_t a, int64_t b) const;
  virtual void clear_marks() { host_marks_.clear(); }

  // ---- replayable steps
  // A device backend can record the work of one step (a decode token, a verify block, a draft block) once and
  // replay it with other values in a single launch: between begin_step_capture(v) and end_step_capture() ops
  // are recorded, not run, and the step's values `v` (StepValues) are bound to parameters that replay_step()
  // sets: an op handed a host array that lies inside one of v's arrays (token ids, positions, tree parents), or
  // v's first KV slot or attention lengths, reads the replay's values on the device. Any other host data an op
  // needs fails the recording. Every buffer the recorded ops touch must stay where it is while the recording
  // lives (temporaries allocated during the capture stay reserved for it). A failed capture leaves nothing
  // recorded: abort, run eagerly. The recording runs first at its first replay.
  virtual bool step_graphs_supported() const { return false; }
  virtual Status begin_step_capture(const StepValues& v) {
    (void)v;
    return unsupported("{} backend does not record steps", name());
  }
  virtual Result<int64_t> end_step_capture() { return unsupported("{} backend does not record steps", name()); }
  virtual void abort_step_capture() {}
  // Runs recording `id` with values `v` (arrays of the lengths it was recorded with). kNotFound when the
  // recording is gone (dropped, or invalidated because scratch it used moved): record again.
  virtual Status replay_step(int64_t id, const StepValues& v) {
    (void)id, (void)v;
    return unsupported("{} backend does not record steps", name());
  }
  // Whether recording `id` would replay (not dropped, nothing it used has moved).
  virtual bool step_replayable(int64_t id) const {
    (void)id;
    return false;
  }
  virtual void drop_step(int64_t id) { (void)id; }

  // While on, every product computes each token's row exactly as a one-token step computes it (a device
  // backend then runs no batched bf16 GEMM): a speculative verify step must reproduce the logits plain
  // decoding would get, or greedy output would depend on the draft. The Runner turns it on for verify steps.
  virtual void set_token_exact(bool on) { (void)on; }

  // ---- the ops of ops/cpu/ops.h, same semantics
  virtual Status matmul(const cpu::WeightView& w, const float* x, int64_t n, float* y) = 0;
  // Products that share their input: ys[i] [n, ws[i]->rows] = x ws[i]^T (a layer's q/k/v, gate/up). A
  // device backend may quantize x once and run them in one launch; the default runs matmul for each.
  virtual Status matmul_group(std::span<const cpu::WeightView* const> ws, const float* x, int64_t n,
                              std::span<float* const> ys) {
    if (ws.size() != ys.size()) return invalid_argument("matmul_group: {} weights, {} outputs", ws.size(), ys.size());
    for (size_t i = 0; i < ws.size(); ++i) DF_RETURN_IF_ERROR(matmul(*ws[i], x, n, ys[i]));
    return Status();
  }
  virtual Status embedding(const cpu::WeightView& table, std::span<const int32_t> ids, float* out) = 0;
  virtual Status rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* y) = 0;
  virtual Status rope_neox(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t rot_dims,
                           std::span<const int32_t> positions, double theta, double freq_scale) = 0;
  virtual Status attention(const float* q, int64_t n_q, int64_t n_heads, const cpu::KvView& kv,
                           const cpu::AttentionMask& mask, float scale, float* out) = 0;
  // state_before (optional; recurrent form only): receives `state` as it was before the step (a chain capture's
  // copy; a device backend stores it as the kernel loads the state instead of a separate copy).
  virtual Status gated_delta_net(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                 int64_t n, const cpu::DeltaNetShape& s, float* state, float* out,
                                 float* per_token_states, std::span<const int32_t> parents, bool chunked,
                                 float* state_before) = 0;
  // A rolled-back step's recurrent layers restored at once (SequenceState::rollback_captured): per layer, its
  // state from `from` (copied, or with q the n captured tokens re-run from it, as gated_delta_net's recurrent
  // form runs them) and its conv window. A device backend does all layers in one launch.
  struct DeltaNetRestore {
    float* state = nullptr;
    const float* from = nullptr;  // null: the state stays
    const float *q = nullptr, *k = nullptr, *v = nullptr, *g = nullptr, *beta = nullptr;  // q null: a copy
    float* conv = nullptr;
    const float* conv_from = nullptr;
    int64_t conv_elems = 0;
  };
  virtual Status restore_deltanet(std::span<const DeltaNetRestore> layers, int64_t n, const cpu::DeltaNetShape& s) {
    const int64_t state_size = s.n_v_heads * s.d_v * s.d_k;
    for (const DeltaNetRestore& l : layers) {
      if (l.from != nullptr) {
        DF_RETURN_IF_ERROR(copy(l.state, l.from, state_size));
        if (l.q != nullptr) {
          DF_ASSIGN_OR_RETURN(Buffer out, alloc(n * s.n_v_heads * s.d_v));
          DF_RETURN_IF_ERROR(
              gated_delta_net(l.q, l.k, l.v, l.g, l.beta, n, s, l.state, out.data(), nullptr, {}, false, nullptr));
        }
      }
      if (l.conv_elems > 0) DF_RETURN_IF_ERROR(copy(l.conv, l.conv_from, l.conv_elems));
    }
    return Status();
  }
  virtual Status causal_conv1d_silu(const float* x, int64_t n, int64_t channels, const float* w, int64_t kernel,
                                    float* conv_state, float* out, std::span<const int32_t> parents) = 0;
  // An attention layer's input prep, as rms_norm of every q and k head (weights q_norm, k_norm [hd]),
  // rope_neox of both (rot dims, `positions`), then kv_write of k and v at slots first_slot...; q [n - q_from,
  // nh, hd] (the queries of tokens q_from.., at positions[q_from..]: a DFlash draft's block over its context
  // and block keys; 0 for a layer of the model) and k [n, nkv, hd] are updated in place. A device backend fuses
  // it into one launch.
  virtual Status attention_prep(float* q, float* k, const float* v, int64_t n, int64_t nh, int64_t nkv, int64_t hd,
                                const float* q_norm, const float* k_norm, float eps, int64_t rot,
                                std::span<const int32_t> positions, double theta, double freq_scale,
                                const cpu::KvView& kv, int64_t first_slot, int64_t q_from) {
    DF_RETURN_IF_ERROR(check_attention_prep(n, q_from, positions.size()));
    const int64_t nq = n - q_from;
    DF_RETURN_IF_ERROR(rms_norm(q, q_norm, eps, nq * nh, hd, q));
    DF_RETURN_IF_ERROR(rms_norm(k, k_norm, eps, n * nkv, hd, k));
    const auto q_positions = positions.subspan(static_cast<size_t>(q_from));
    DF_RETURN_IF_ERROR(rope_neox(q, nq, nh, hd, rot, q_positions, theta, freq_scale));
    DF_RETURN_IF_ERROR(rope_neox(k, n, nkv, hd, rot, positions, theta, freq_scale));
    return kv_write(kv, first_slot, k, v, n);
  }
  // Stores n rows of K and V ([n, n_kv_heads * head_dim] each) at positions first_pos .. first_pos + n - 1
  // of the KV store `kv` describes (its chunks must exist). The default copies row by row.
  virtual Status kv_write(const cpu::KvView& kv, int64_t first_pos, const float* k, const float* v, int64_t n);

  // ---- elementwise glue of the layer kinds (each a kernel on a device backend)
  virtual Status add_inplace(float* y, const float* x, int64_t n) = 0;          // y += x
  // The residual add and the next norm: x += delta, then y = rms_norm(x) (as add_inplace then rms_norm;
  // a device backend fuses them). x, delta [n, dim]; y must not alias x.
  virtual Status add_rms_norm(float* x, const float* delta, const float* w, float eps, int64_t n, int64_t dim,
                              float* y) {
    DF_RETURN_IF_ERROR(add_inplace(x, delta, n * dim));
    return rms_norm(x, w, eps, n, dim, y);
  }
  virtual Status mul_inplace(float* y, const float* x, int64_t n) = 0;          // y *= x
  virtual Status silu_inplace(float* x, int64_t n) = 0;
  virtual Status sigmoid_inplace(float* x, int64_t n) = 0;
  virtual Status swiglu(const float* gate, const float* up, float* out, int64_t n) = 0;
  // A SwiGLU's products and activation: g [n, gate.rows] = silu(x gate^T) * (x up^T), u [n, up.rows] scratch (it
  // may hold x up^T after). A device backend may run them as one launch (the same values); the default is
  // matmul_group of both, then swiglu.
  virtual Status matmul_swiglu(const cpu::WeightView& gate, const cpu::WeightView& up, const float* x, int64_t n,
                               float* g, float* u) {
    if (gate.rows != up.rows || gate.cols != up.cols)
      return invalid_argument("matmul_swiglu: gate {} x {} and up {} x {}", gate.rows, gate.cols, up.rows, up.cols);
    const cpu::WeightView* ws[] = {&gate, &up};
    float* ys[] = {g, u};
    DF_RETURN_IF_ERROR(matmul_group(ws, x, n, ys));
    return swiglu(g, u, g, n * gate.rows);
  }
  // Rows of `src` [rows, src_width]: columns [offset, offset + width) of each row into dst [rows, width].
  virtual Status slice_columns(const float* src, int64_t rows, int64_t src_width, int64_t offset, int64_t width,
                               float* dst) = 0;
  // x [rows, dim]: x / sqrt(sum x^2 + eps) * scale per row (DeltaNet q/k L2 normalisation).
  virtual Status l2_norm_rows(float* x, int64_t rows, int64_t dim, float eps, float scale) = 0;
  // DeltaNet gates over [n, Hv]: decay = ssm_a[h] * softplus(alpha + dt_bias[h]), beta = sigmoid(beta).
  virtual Status deltanet_gates(float* alpha_to_decay, float* beta, const float* dt_bias, const float* ssm_a,
                                int64_t n, int64_t n_heads) = 0;
  // The DeltaNet input prep after its projections (algorithms.md D.4): causal_conv1d_silu of mixed [n, C]
  // (C = 2 Hk dk + Hv dv; window conv_state; the tree form with parents), its columns split into q [n, Hk, dk],
  // k [n, Hk, dk] and v [n, Hv, dv], q and k L2-normalised per head (l2_norm_rows, eps 1e-6; q scaled by
  // 1/sqrt(dk)), and deltanet_gates of alpha and beta [n, Hv]. A device backend fuses it into one launch.
  // conv_capture (a captured step's, SequenceState::conv_capture): also the window before the step, then mixed,
  // [K - 1 + n, C] (what a rollback or a tree commit reads its new window from).
  virtual Status deltanet_prep(const float* mixed, int64_t n, const cpu::DeltaNetShape& s, const float* conv_w,
                               int64_t kernel, float* conv_state, std::span<const int32_t> parents, float* q, float* k,
                               float* v, float* alpha_to_decay, float* beta, const float* dt_bias, const float* ssm_a,
                               float* conv_capture = nullptr);
  // The DeltaNet output gate: o [rows, dim] = rms_norm(o, w, eps) * silu(z), as rms_norm, silu_inplace(z) and
  // mul_inplace (z [rows, dim] may be overwritten). A device backend fuses it into one launch.
  virtual Status rms_norm_silu_gate(float* o, const float* w, float eps, int64_t rows, int64_t dim, float* z) {
    DF_RETURN_IF_ERROR(rms_norm(o, w, eps, rows, dim, o));
    DF_RETURN_IF_ERROR(silu_inplace(z, rows * dim));
    return mul_inplace(o, z, rows * dim);
  }
  // The gated attention's output gate: o [rows, dim] *= sigmoid(gate row r), gate row r at gate + r *
  // gate_stride (the gate halves of attn.q's rows, read in place). The default slices the gates out, then
  // sigmoid_inplace and mul_inplace; a device backend fuses it into one launch.
  virtual Status sigmoid_gate_mul(float* o, const float* gate, int64_t rows, int64_t dim, int64_t gate_stride);
  // Rows `rows` of x [*, dim] gathered into out [rows.size(), dim].
  virtual Status gather_rows(const float* x, int64_t dim, std::span<const int64_t> rows, float* out) = 0;

  // ---- sampling helpers: what crosses to the host is rows x k values, not whole logit rows
  // For each row r of x [rows, cols] (backend memory): the k largest values, descending (ties: lower column
  // first), with their columns, and log(sum_j exp(x[r, j])), into HOST arrays ids/values [rows, k] and
  // lse [rows] (lse may be null). 1 <= k <= min(cols, kMaxTopK). cpu::top_k_rows is the reference.
  static constexpr int64_t kMaxTopK = 16;
  virtual Status top_k_rows(const float* x, int64_t rows, int64_t cols, int64_t k, int32_t* ids, float* values,
                            float* lse) = 0;

 private:
  std::vector<double> host_marks_;  // seconds on the steady clock
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
  // f16 KV stores halve the memory of long contexts (attention converts each key and value row it reads).
  void set_kv_type(cpu::KvType t) { kv_type_ = t; }
  cpu::KvType kv_type() const override { return kv_type_; }
  ThreadPool& pool() { return pool_; }
  MemoryStats memory_stats() const override;

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
                         std::span<const int32_t> parents, bool chunked, float* state_before) override;
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
  Status top_k_rows(const float* x, int64_t rows, int64_t cols, int64_t k, int32_t* ids, float* values,
                    float* lse) override;

 private:
  cpu::KvType kv_type_ = cpu::KvType::kF32;
  ThreadPool pool_;
  std::atomic<uint64_t> live_{0}, peak_{0};
};

}  // namespace dflash

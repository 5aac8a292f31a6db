// CudaBackend: the Backend interface on one CUDA device, with the ops/cuda kernels. Buffers and weights
// live in device memory; host-side index arrays (positions, parents, KV chunk tables) are copied into a
// pinned host ring and from there into device scratch on the backend's stream, in stream order, so an
// op never waits for the device (the ring waits for the stream only when it wraps).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "ops/backend.h"
#include "ops/cuda/gemv_q8.h"

namespace dflash {

class CudaBackend final : public Backend {
 public:
  // Uses device `device` (cudaSetDevice) and a stream of its own (blocking: ordered with the legacy
  // default stream, so synchronous copies elsewhere see its work).
  static Result<std::unique_ptr<CudaBackend>> create(int device = 0);
  ~CudaBackend() override;

  const char* name() const override { return "cuda"; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  // Returns cached free buffers to the device (after waiting for the stream).
  void trim() override;
  // Steps of more than 16 tokens (prefill): bf16 tensor-core GEMM and, above 32 queries, f16 tensor-core
  // attention (on, the default), or the GEMV kernels in 16-token slices and the float32 attention kernel
  // (exactly the numerics of decode, re-streaming the weights per slice).
  void set_tensor_core_prefill(bool on) { tensor_core_prefill_ = on; }
  void set_token_exact(bool on) override { token_exact_ = on; }
  // fp16 KV stores: half the KV memory and the bytes decode attention reads (the kernels convert on load and
  // round to nearest even on store, as the CPU does).
  void set_kv_type(cpu::KvType t) { kv_type_ = t; }
  cpu::KvType kv_type() const override { return kv_type_; }
  // Waits for the stream; returns the first asynchronous error, if any.
  Status synchronize() override;
  Result<double> measure_peak_matmul_flops() override;
  // From another CUDA backend's memory (another GPU: peer access where the devices allow it).
  Status copy_from_peer(float* dst, Backend& from, const float* src, int64_t n) override;

  int64_t mark() override;
  double elapsed_ms(int64_t a, int64_t b) const override;
  void clear_marks() override { marks_used_ = 0; }

  bool device_memory() const override { return true; }
  MemoryStats memory_stats() const override;
  bool step_graphs_supported() const override { return true; }
  Status begin_step_capture(const StepValues& v) override;
  Result<int64_t> end_step_capture() override;
  void abort_step_capture() override;
  Status replay_step(int64_t id, const StepValues& v) override;
  bool step_replayable(int64_t id) const override;
  void drop_step(int64_t id) override;

  Result<Buffer> alloc(int64_t n_floats) override;
  void release(float* data) override;
  Status upload(float* dst, const float* src, int64_t n) override;
  Status download(float* dst, const float* src, int64_t n) override;
  Status copy(float* dst, const float* src, int64_t n) override;
  Status copy_batch(std::span<const CopyItem> items) override;
  Status copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t cols,
                   int64_t rows) override;
  // Weights in the kernels' device form (ops/cuda/weight_form.h: q6_K, q8_0 and q4_0 rows with aligned blocks).
  Result<uint64_t> weight_bytes(const cpu::WeightView& w) const override;
  Status pack_weight(const cpu::WeightView& w, void* dst) const override;

  Status matmul(const cpu::WeightView& w, const float* x, int64_t n, float* y) override;
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
  Status restore_deltanet(std::span<const DeltaNetRestore> layers, int64_t n, const cpu::DeltaNetShape& s) override;
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
  // While token-exact, up to kSwigluFusedMaxTokens tokens, bf16 gate and up weights that gemv16_mma takes run as
  // one launch that applies SwiGLU as it stores (the same bits as the products, then swiglu; no int8 or bf16 side:
  // the down product of bf16 weights at these counts reads f32 x); else the default.
  Status matmul_swiglu(const cpu::WeightView& gate, const cpu::WeightView& up, const float* x, int64_t n, float* g,
                       float* u) override;
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
  // One or two kernels (ops/cuda/top_k.h) into device scratch, then one download of rows x (2k + 1) floats
  // through a pinned buffer; waits for it, like download(). Not while a step is recorded.
  Status top_k_rows(const float* x, int64_t rows, int64_t cols, int64_t k, int32_t* ids, float* values,
                    float* lse) override;

 private:
  CudaBackend() = default;
  // Makes this backend's device the calling thread's current one.
  void activate() const;
  // The event copy_from_peer orders the two streams with (made on first use, on this device).
  Status ensure_handoff_event();
  // Device scratch that grows as needed; `stage` copies host bytes into a slot of it.
  struct Scratch {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  // Growing a scratch that recorded steps may use invalidates them (epoch_); `recorded` false is for
  // scratch only used outside recordings.
  Result<void*> reserve(Scratch& s, size_t bytes, bool recorded = true);
  Result<const void*> stage(Scratch& s, const void* host, size_t bytes, bool recorded = true);

  // A recorded step: the executable graph, the scratch epoch it was recorded in, the temporaries it owns
  // (allocated during the capture, kept out of the free lists while it lives), and the lengths of the value
  // arrays it reads (a replay must bring the same).
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    uint64_t epoch = 0;
    std::vector<float*> owned;
    size_t tokens = 0, positions = 0, parents = 0;
  };
  // Step parameters on the device: [first_slot, n_prefix, n_tokens, tokens..., positions..., parents...]
  // (int32), written before each replay from a ring of pinned host slots.
  static constexpr size_t kStepParamInts = 512;
  static constexpr size_t kStepParamSlots = 8;
  static constexpr size_t kStepHeaderInts = 3;
  // While recording: the replay's copy of host array `a` (device int32), where `a` lies inside one of the
  // recorded step's value arrays; an empty array is null. `what` names the op for the error otherwise.
  Result<const int32_t*> recorded_ints(std::span<const int32_t> a, const char* what) const;
  // The device copy of host array `a` for an op: recorded_ints while recording, else staged into `s`.
  Result<const int32_t*> device_ints(Scratch& s, std::span<const int32_t> a, const char* what);
  // While recording: the replay's first KV slot, when the op's `first` is the step's (else unsupported).
  Result<const int32_t*> recorded_first_slot(int64_t first, const char* what) const;
  void free_list_push(float* p);
  // The int8 form of the last output of a producer that writes one (gemv_q8.h: SwiGLU, the RMSNorms of up to
  // kMmqMaxTokens rows, the output gates), written by that kernel beside its f32 output so that the GEMV
  // reading it needs no quantize launch, and once bf16_side_wanted_, while token-exact, its bf16 form, which
  // gemv16_mma reads from kGemv16MmaBf16XFrom tokens instead of converting x. It describes `src` only until the
  // next op that writes device memory (every such op but matmul/matmul_group calls forget_q8() first; copy only
  // when it writes into src: a layer's captured output is copied between the norm and the product that reads the
  // norm's side), and the GEMV uses it only for the same pointer and size. Outputs up to kQ8SideElems elements (decode
  // and verify steps); the buffer is allocated once, so recorded steps keep pointing at it.
  static constexpr int64_t kQ8SideElems = int64_t{16} << 16;
  // Its one allocation: int8 codes (1 byte an element), f32 scales (1 a 32), int32 half-block sums (1 a 16), bf16.
  static constexpr int64_t kQ8CodesBytes = kQ8SideElems, kQ8ScalesBytes = kQ8SideElems / 8,
                           kQ8SumsBytes = kQ8SideElems / 4, kQ8Bf16Bytes = 2 * kQ8SideElems;
  static constexpr int64_t kQ8SideBytes = kQ8CodesBytes + kQ8ScalesBytes + kQ8SumsBytes + kQ8Bf16Bytes;
  struct Q8Side {
    const float* src = nullptr;
    int64_t elems = 0;
    bool bf16 = false;  // the producer wrote src's bf16 form too (Q8Out::xb)
  };
  // Where a producer of `elems` floats at y writes y's int8 form, recorded as the side; none (and no
  // side) when it does not qualify.
  cuda::Q8Out q8_for(const float* y, int64_t elems);
  // q8_for for a producer of rows of `dim` whose 32-element blocks must each lie within a row.
  cuda::Q8Out q8_for_rows(const float* y, int64_t rows, int64_t dim);
  // q8_for_rows for an RMSNorm's output: rows a decode or verify step's GEMV reads (up to kMmqMaxTokens; a
  // prefill's products round x to bf16 instead) of a width the norm kernel quantizes.
  cuda::Q8Out norm_q8(const float* y, int64_t rows, int64_t dim);
  void forget_q8() { q8_side_ = Q8Side{}; }
 public:
  // GEMV calls that read a producer's int8 side output (for tests).
  int64_t q8_side_uses() const { return q8_side_uses_; }
  // Token-exact bf16-weight products (from kGemv16MmaBf16XFrom tokens) that read a producer's bf16 side (for tests).
  int64_t bf16_side_uses() const { return bf16_side_uses_; }

 private:
  // The device table of RoPE frequencies for this shape (made and uploaded on first use).
  Result<const double*> rope_table(double theta, double freq_scale, int64_t rot_dims);

  int device_ = 0;
  bool peer_access_tried_ = false;
  cudaEvent_t handoff_event_ = nullptr;
  int sm_count_ = 1;  // multiprocessors (top_k_rows spreads a row over enough blocks to fill them)
  cudaStream_t stream_ = nullptr;
  // Step recording: the parameters a replay reads (kStepParamInts on the device, and kStepParamSlots pinned
  // host copies, each reusable once its event has passed), and the values of the step being recorded.
  bool capturing_ = false;
  int32_t* step_params_ = nullptr;
  int32_t* step_params_host_ = nullptr;
  cudaEvent_t params_copied_[kStepParamSlots] = {};
  size_t params_slot_ = 0;
  StepValues capture_values_;
  std::vector<float*> capture_owned_;
  // Temporaries of the recording released during it, by size: later allocations of the same recording reuse
  // them (its ops run in stream order, as eager steps reuse the free lists), so a recording holds about what
  // an eager step has live, not every temporary of every layer.
  std::unordered_map<int64_t, std::vector<float*>> capture_free_;
  std::unordered_map<float*, int64_t> graph_owned_;  // temporary -> recording id
  std::unordered_map<int64_t, Graph> graphs_;
  int64_t next_graph_id_ = 1;
  uint64_t epoch_ = 0;  // bumped when scratch a recording may use moves
  bool tensor_core_prefill_ = true;
  cpu::KvType kv_type_ = cpu::KvType::kF32;
  bool token_exact_ = false;  // set_token_exact: products of any length as GEMV slices
  // Pinned staging ring: host arrays are copied here before their asynchronous upload.
  uint8_t* pinned_ = nullptr;
  std::vector<cudaEvent_t> marks_;  // events for mark(), reused after clear_marks()
  size_t marks_used_ = 0;
  size_t pinned_bytes_ = 0, pinned_head_ = 0;
  // Freed buffers by size, reused by later allocations of the same size. All work runs on one stream, so
  // a buffer freed after queued kernels and handed to a later op is only touched in stream order; no
  // synchronization (cudaFree would synchronize the device on every op of every step).
  std::unordered_map<int64_t, std::vector<float*>> free_;
  std::unordered_map<float*, int64_t> sizes_;
  uint64_t cached_bytes_ = 0;
  uint64_t allocated_bytes_ = 0;  // every buffer cudaMalloc'ed by alloc() and not yet freed (live + cached)
  uint64_t peak_live_ = 0;
  Scratch positions_, parents_, chunk_table_, rows_, workspace_, embed_rows_;
  Scratch top_k_;  // top_k_rows: its results, then the kernels' workspace (never used by a recording)
  Scratch restore_table_;  // restore_deltanet's layer table (never used by a recording)
  Scratch copy_table_;     // copy_batch's item table (never used by a recording)
  // Every scratch above (const as `b` is), for the destructor and memory_stats: one list, where a scratch added
  // above must also go.
  template <typename Self>
  static auto scratches(Self& b) {
    return std::array{&b.positions_,  &b.parents_, &b.chunk_table_,   &b.rows_,      &b.workspace_,
                      &b.embed_rows_, &b.top_k_,   &b.restore_table_, &b.copy_table_};
  }
  // Pinned memory that downloads (up to kStagedDownloadBytes) and top_k_rows' results pass through on their way
  // to the caller's arrays; grown on demand (host_staging).
  static constexpr size_t kStagedDownloadBytes = size_t{8} << 20;
  Result<void*> host_staging(size_t bytes);
  void* host_staging_ = nullptr;
  size_t host_staging_bytes_ = 0;
  Q8Side q8_side_;
  int64_t q8_side_uses_ = 0;
  int64_t bf16_side_uses_ = 0;
  // Set by the first token-exact product of bf16 weights (gemv16_mma) from kGemv16MmaBf16XFrom tokens: from then
  // on, while token-exact, the producers write their output's bf16 form beside the int8 one.
  bool bf16_side_wanted_ = false;
  // kQ8SideElems int8 codes, then their scales and half-block sums, then the bf16 form (one allocation)
  cuda::Q8Out q8_buf_;
  // RoPE frequency tables on the device, by (theta, freq_scale, rot_dims): made once, kept.
  struct RopeKey {
    double theta, freq_scale;
    int64_t rot_dims;
    bool operator<(const RopeKey& o) const {
      return theta != o.theta ? theta < o.theta : freq_scale != o.freq_scale ? freq_scale < o.freq_scale
                                                                              : rot_dims < o.rot_dims;
    }
  };
  std::map<RopeKey, double*> rope_tables_;
};

}  // namespace dflash

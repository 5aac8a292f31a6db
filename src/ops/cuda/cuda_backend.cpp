#include "ops/cuda/cuda_backend.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/cuda/attention_host.h"
#include "ops/cuda/conv_host.h"
#include "ops/cuda/dequantize_host.h"
#include "ops/cuda/gemm_rate.h"
#include "ops/cuda/gemv16_mma.h"
#include "ops/cuda/gated_delta_net_host.h"
#include "ops/cuda/glue.h"
#include "ops/cuda/matmul.h"
#include "ops/cuda/matmul_host.h"
#include "ops/cuda/norm_rope.h"
#include "ops/cuda/top_k.h"
#include "ops/cuda/weight_form.h"

namespace dflash {
namespace {

constexpr size_t kPinnedBytes = size_t{4} << 20;
// Copies up to this many floats (4 MiB) run as a kernel (CudaBackend::copy).
constexpr int64_t kCopyKernelMaxFloats = int64_t{1} << 20;

// Slots [first, first + n) must lie in the chunks the KV store has.
Status check_kv_slots(const cpu::KvView& kv, int64_t first, int64_t n, const char* what) {
  if (first < 0 || n < 0 || (first + n + kv.chunk_tokens - 1) / kv.chunk_tokens > static_cast<int64_t>(kv.k_chunks.size()))
    return invalid_argument("{}: slots {}..{} are past the store's {} chunks", what, first, first + n - 1,
                            kv.k_chunks.size());
  return Status();
}

// A recorded step's scalar values fit its int32 parameters: a slot and lengths within [0, 2^31).
Status check_step_values(const StepValues& v) {
  if (v.first_slot < 0 || v.first_slot >= INT32_MAX || v.n_prefix < 0 || v.n_tokens < v.n_prefix ||
      v.n_tokens >= INT32_MAX)
    return invalid_argument("recorded step: first slot {}, {} prefix keys of {}", v.first_slot, v.n_prefix, v.n_tokens);
  return Status();
}

Status check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status();
  return internal_error("{}: {}", what, cudaGetErrorString(err));
}

}  // namespace

namespace {
thread_local int t_current_device = -1;  // this thread's current CUDA device, as activate() last set it
}  // namespace

// Several backends (a layer split's shards, a draft on another GPU) share threads: every public op makes
// its device current first (a thread-local check; cudaSetDevice only on a switch).
void CudaBackend::activate() const {
  if (t_current_device == device_) return;
  if (cudaSetDevice(device_) == cudaSuccess) t_current_device = device_;
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(int device) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return unsupported("no CUDA device is available");
  }
  if (device < 0 || device >= n) return invalid_argument("cuda:{} does not exist ({} device(s))", device, n);
  std::unique_ptr<CudaBackend> be(new CudaBackend());
  be->device_ = device;
  be->activate();
  DF_RETURN_IF_ERROR(check(cudaDeviceGetAttribute(&be->sm_count_, cudaDevAttrMultiProcessorCount, device),
                           "cudaDeviceGetAttribute"));
  DF_RETURN_IF_ERROR(check(cudaStreamCreate(&be->stream_), "cudaStreamCreate"));
  DF_RETURN_IF_ERROR(check(cudaMallocHost(reinterpret_cast<void**>(&be->pinned_), kPinnedBytes), "cudaMallocHost"));
  be->pinned_bytes_ = kPinnedBytes;
  constexpr size_t kParamBytes = kStepParamInts * sizeof(int32_t);
  DF_RETURN_IF_ERROR(check(cudaMallocHost(reinterpret_cast<void**>(&be->step_params_host_), kStepParamSlots * kParamBytes),
                           "cudaMallocHost"));
  DF_RETURN_IF_ERROR(check(cudaMalloc(reinterpret_cast<void**>(&be->step_params_), kParamBytes), "cudaMalloc"));
  DF_RETURN_IF_ERROR(check(cudaMemset(be->step_params_, 0, kParamBytes), "cudaMemset"));
  for (cudaEvent_t& e : be->params_copied_)
    DF_RETURN_IF_ERROR(check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
  uint8_t* q8 = nullptr;
  DF_RETURN_IF_ERROR(check(cudaMalloc(reinterpret_cast<void**>(&q8), kQ8SideBytes), "cudaMalloc"));
  uint8_t* const scales = q8 + kQ8CodesBytes;
  uint8_t* const sums = scales + kQ8ScalesBytes;
  uint8_t* const bf16 = sums + kQ8SumsBytes;
  be->q8_buf_ = cuda::Q8Out{reinterpret_cast<int8_t*>(q8), reinterpret_cast<float*>(scales),
                            reinterpret_cast<int*>(sums), reinterpret_cast<uint16_t*>(bf16)};
  return be;
}

CudaBackend::~CudaBackend() {
  activate();
  if (capturing_) abort_step_capture();
  std::vector<int64_t> ids;
  for (const auto& [id, g] : graphs_) ids.push_back(id);
  for (int64_t id : ids) drop_step(id);
  trim();
  for (Scratch* s : scratches(*this))
    if (s->ptr) cudaFree(s->ptr);
  if (pinned_) cudaFreeHost(pinned_);
  if (host_staging_) cudaFreeHost(host_staging_);
  if (step_params_host_) cudaFreeHost(step_params_host_);
  if (step_params_) cudaFree(step_params_);
  if (q8_buf_.xq) cudaFree(q8_buf_.xq);
  for (cudaEvent_t e : params_copied_)
    if (e) cudaEventDestroy(e);
  if (handoff_event_) cudaEventDestroy(handoff_event_);
  for (auto& [key, table] : rope_tables_) cudaFree(table);
  for (cudaEvent_t e : marks_) cudaEventDestroy(e);
  if (stream_) cudaStreamDestroy(stream_);
}

// ---- step recording

Status CudaBackend::begin_step_capture(const StepValues& v) {
  activate();
  forget_q8();
  if (capturing_) return internal_error("a step is already being recorded");
  if (kStepHeaderInts + v.tokens.size() + v.positions.size() + v.parents.size() > kStepParamInts)
    return unsupported("a recorded step takes at most {} token ids, positions and parents together",
                       kStepParamInts - kStepHeaderInts);
  DF_RETURN_IF_ERROR(check_step_values(v));
  DF_RETURN_IF_ERROR(check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture"));
  capturing_ = true;
  capture_values_ = v;
  capture_owned_.clear();
  capture_free_.clear();
  return Status();
}

void CudaBackend::abort_step_capture() {
  activate();
  forget_q8();
  if (!capturing_) return;
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream_, &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
  capturing_ = false;
  capture_values_ = StepValues{};
  capture_free_.clear();
  for (float* p : capture_owned_) free_list_push(p);
  capture_owned_.clear();
}

Result<int64_t> CudaBackend::end_step_capture() {
  activate();
  forget_q8();
  if (!capturing_) return internal_error("no step is being recorded");
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
  capturing_ = false;
  Graph g;
  g.owned = std::move(capture_owned_);
  g.tokens = capture_values_.tokens.size();
  g.positions = capture_values_.positions.size();
  g.parents = capture_values_.parents.size();
  capture_owned_.clear();
  capture_free_.clear();
  capture_values_ = StepValues{};
  cudaError_t ei = e;
  if (e == cudaSuccess) ei = cudaGraphInstantiate(&g.exec, graph, 0);
  if (graph) cudaGraphDestroy(graph);
  if (e != cudaSuccess || ei != cudaSuccess) {
    cudaGetLastError();
    for (float* p : g.owned) free_list_push(p);
    return internal_error("recording a step failed: {}", cudaGetErrorString(e != cudaSuccess ? e : ei));
  }
  g.epoch = epoch_;
  const int64_t id = next_graph_id_++;
  for (float* p : g.owned) graph_owned_[p] = id;
  graphs_.emplace(id, std::move(g));
  return id;
}

bool CudaBackend::step_replayable(int64_t id) const {
  auto it = graphs_.find(id);
  return it != graphs_.end() && it->second.epoch == epoch_;
}

void CudaBackend::drop_step(int64_t id) {
  activate();
  auto it = graphs_.find(id);
  if (it == graphs_.end()) return;
  cudaGraphExecDestroy(it->second.exec);
  for (float* p : it->second.owned) {
    graph_owned_.erase(p);
    free_list_push(p);  // later users are stream-ordered after any replay already queued
  }
  graphs_.erase(it);
}

Status CudaBackend::replay_step(int64_t id, const StepValues& v) {
  activate();
  forget_q8();
  auto it = graphs_.find(id);
  if (it == graphs_.end()) return not_found("no recorded step {}", id);
  const Graph& g = it->second;
  if (g.epoch != epoch_) {
    drop_step(id);
    return not_found("recorded step {} used scratch that has moved", id);
  }
  if (v.tokens.size() != g.tokens || v.positions.size() != g.positions || v.parents.size() != g.parents)
    return invalid_argument("recorded step {} takes {} tokens, {} positions and {} parents, not {}, {} and {}", id,
                            g.tokens, g.positions, g.parents, v.tokens.size(), v.positions.size(), v.parents.size());
  DF_RETURN_IF_ERROR(check_step_values(v));
  // A pinned slot whose last copy is done (the ring's oldest: its copy was queued kStepParamSlots replays ago).
  const size_t slot = params_slot_;
  params_slot_ = (params_slot_ + 1) % kStepParamSlots;
  DF_RETURN_IF_ERROR(check(cudaEventSynchronize(params_copied_[slot]), "step parameters"));
  int32_t* h = step_params_host_ + slot * kStepParamInts;
  h[0] = static_cast<int32_t>(v.first_slot);
  h[1] = static_cast<int32_t>(v.n_prefix);
  h[2] = static_cast<int32_t>(v.n_tokens);
  int32_t* p = h + kStepHeaderInts;
  for (std::span<const int32_t> a : {v.tokens, v.positions, v.parents}) p = std::copy(a.begin(), a.end(), p);
  const size_t bytes = static_cast<size_t>(p - h) * sizeof(int32_t);
  DF_RETURN_IF_ERROR(
      check(cudaMemcpyAsync(step_params_, h, bytes, cudaMemcpyHostToDevice, stream_), "step parameters"));
  DF_RETURN_IF_ERROR(check(cudaEventRecord(params_copied_[slot], stream_), "step parameters"));
  return check(cudaGraphLaunch(g.exec, stream_), "cudaGraphLaunch");
}

Result<const int32_t*> CudaBackend::recorded_ints(std::span<const int32_t> a, const char* what) const {
  if (a.empty()) return static_cast<const int32_t*>(nullptr);
  const auto addr = [](const int32_t* p) { return reinterpret_cast<uintptr_t>(p); };
  size_t off = kStepHeaderInts;
  for (std::span<const int32_t> arr : {capture_values_.tokens, capture_values_.positions, capture_values_.parents}) {
    if (!arr.empty() && addr(a.data()) >= addr(arr.data()) &&
        addr(a.data() + a.size()) <= addr(arr.data() + arr.size()))
      return static_cast<const int32_t*>(step_params_ + off + static_cast<size_t>(a.data() - arr.data()));
    off += arr.size();
  }
  return unsupported("{}: host data outside the recorded step's values", what);
}

Result<const int32_t*> CudaBackend::device_ints(Scratch& s, std::span<const int32_t> a, const char* what) {
  if (capturing_) return recorded_ints(a, what);
  DF_ASSIGN_OR_RETURN(const void* d, stage(s, a.data(), a.size_bytes()));
  return static_cast<const int32_t*>(d);
}

Result<const int32_t*> CudaBackend::recorded_first_slot(int64_t first, const char* what) const {
  if (first != capture_values_.first_slot)
    return unsupported("{}: slot {} is not the recorded step's first slot {}", what, first, capture_values_.first_slot);
  return static_cast<const int32_t*>(step_params_);
}

MemoryStats CudaBackend::memory_stats() const {
  activate();
  MemoryStats m;
  m.buffers_live = allocated_bytes_ - cached_bytes_;
  m.buffers_peak = peak_live_;
  m.buffers_cached = cached_bytes_;
  for (const Scratch* s : scratches(*this))
    m.scratch += s->bytes;
  for (const auto& [key, table] : rope_tables_) m.scratch += static_cast<uint64_t>(key.rot_dims / 2) * sizeof(double);
  m.scratch += static_cast<uint64_t>(kQ8SideBytes);
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    m.device_total = total_b;
    m.device_used = total_b - free_b;
  } else {
    cudaGetLastError();
  }
  return m;
}

int64_t CudaBackend::mark() {
  activate();
  if (marks_used_ == marks_.size()) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    marks_.push_back(e);
  }
  cudaEvent_t e = marks_[marks_used_];
  if (cudaEventRecord(e, stream_) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return static_cast<int64_t>(marks_used_++);
}

double CudaBackend::elapsed_ms(int64_t a, int64_t b) const {
  activate();
  if (a < 0 || b < 0 || static_cast<size_t>(a) >= marks_used_ || static_cast<size_t>(b) >= marks_used_) return 0.0;
  float ms = 0.0f;
  if (cudaEventElapsedTime(&ms, marks_[static_cast<size_t>(a)], marks_[static_cast<size_t>(b)]) != cudaSuccess) {
    cudaGetLastError();
    return 0.0;
  }
  return ms;
}

void CudaBackend::trim() {
  activate();
  cudaStreamSynchronize(stream_);
  for (auto& [n, list] : free_)
    for (float* p : list) {
      sizes_.erase(p);
      cudaFree(p);
      allocated_bytes_ -= static_cast<uint64_t>(n) * sizeof(float);
    }
  free_.clear();
  cached_bytes_ = 0;
}

Status CudaBackend::synchronize() { return check(cudaStreamSynchronize(stream_), "CUDA stream"); }

Result<double> CudaBackend::measure_peak_matmul_flops() {
  activate();
  return cuda::measure_bf16_gemm_flops(stream_);
}

Result<void*> CudaBackend::reserve(Scratch& s, size_t bytes, bool recorded) {
  activate();
  if (bytes <= s.bytes) return s.ptr;
  if (capturing_) return unsupported("scratch must grow while a step is recorded");
  if (recorded) ++epoch_;  // recordings that used the old buffer are stale
  // Work already queued may still read the old buffer: wait before freeing it.
  DF_RETURN_IF_ERROR(synchronize());
  if (s.ptr) cudaFree(s.ptr);
  s.ptr = nullptr;
  s.bytes = 0;
  size_t want = std::max<size_t>(bytes, 4096);
  DF_RETURN_IF_ERROR(check(cudaMalloc(&s.ptr, want), "cudaMalloc (scratch)"));
  s.bytes = want;
  return s.ptr;
}

Result<const void*> CudaBackend::stage(Scratch& s, const void* host, size_t bytes, bool recorded) {
  activate();
  if (bytes == 0) return static_cast<const void*>(nullptr);
  if (capturing_) return unsupported("host data cannot be staged while a step is recorded");
  DF_ASSIGN_OR_RETURN(void* p, reserve(s, bytes, recorded));
  // Stream-ordered: kernels queued earlier that read this slot run before the copy lands.
  const size_t slot = (bytes + 255) & ~size_t{255};
  if (slot > pinned_bytes_) {  // larger than the ring: copy from the caller's memory and wait for it
    DF_RETURN_IF_ERROR(check(cudaMemcpyAsync(p, host, bytes, cudaMemcpyHostToDevice, stream_), "staging copy"));
    DF_RETURN_IF_ERROR(synchronize());  // the host array may go away when the call returns
    return static_cast<const void*>(p);
  }
  if (pinned_head_ + slot > pinned_bytes_) {  // wrap: copies queued from the ring's start must be done
    DF_RETURN_IF_ERROR(synchronize());
    pinned_head_ = 0;
  }
  uint8_t* src = pinned_ + pinned_head_;
  pinned_head_ += slot;
  std::memcpy(src, host, bytes);
  DF_RETURN_IF_ERROR(check(cudaMemcpyAsync(p, src, bytes, cudaMemcpyHostToDevice, stream_), "staging copy"));
  return static_cast<const void*>(p);
}

Result<Buffer> CudaBackend::alloc(int64_t n_floats) {
  activate();
  if (n_floats < 0) return invalid_argument("negative buffer size {}", n_floats);
  const int64_t n = std::max<int64_t>(n_floats, 1);
  // While recording, temporaries are memory the recording will own: fresh, or one of its own it released
  // (never a free-list buffer that something else may hold later).
  if (capturing_) {
    if (auto it = capture_free_.find(n); it != capture_free_.end() && !it->second.empty()) {
      float* p = it->second.back();
      it->second.pop_back();
      return Buffer(this, p, n_floats);
    }
  }
  if (auto it = free_.find(n); !capturing_ && it != free_.end() && !it->second.empty()) {
    float* p = it->second.back();
    it->second.pop_back();
    cached_bytes_ -= static_cast<uint64_t>(n) * sizeof(float);
    peak_live_ = std::max(peak_live_, allocated_bytes_ - cached_bytes_);
    return Buffer(this, p, n_floats);
  }
  float* p = nullptr;
  cudaError_t err = cudaMalloc(&p, static_cast<size_t>(n) * sizeof(float));
  if (err != cudaSuccess && !free_.empty()) {  // out of memory: give the cache back and try once more
    cudaGetLastError();
    trim();
    err = cudaMalloc(&p, static_cast<size_t>(n) * sizeof(float));
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status(ErrorCode::kOutOfMemory,
                  fmt::format("cannot allocate {} MiB on cuda:{}: {}", n_floats * 4.0 / 1048576.0, device_,
                              cudaGetErrorString(err)));
  }
  sizes_[p] = n;
  allocated_bytes_ += static_cast<uint64_t>(n) * sizeof(float);
  peak_live_ = std::max(peak_live_, allocated_bytes_ - cached_bytes_);
  if (capturing_) capture_owned_.push_back(p);
  return Buffer(this, p, n_floats);
}

void CudaBackend::release(float* data) {
  activate();
  if (!sizes_.count(data)) {  // not ours: should not happen; free it the safe way
    cudaStreamSynchronize(stream_);
    cudaFree(data);
    return;
  }
  if (graph_owned_.count(data)) return;  // a recording's temporary: it keeps it
  if (capturing_ && std::find(capture_owned_.begin(), capture_owned_.end(), data) != capture_owned_.end()) {
    capture_free_[sizes_[data]].push_back(data);  // the recording's again, for its later temporaries
    return;
  }
  free_list_push(data);
}

void CudaBackend::free_list_push(float* p) {
  activate();
  auto it = sizes_.find(p);
  if (it == sizes_.end()) return;
  free_[it->second].push_back(p);
  cached_bytes_ += static_cast<uint64_t>(it->second) * sizeof(float);
}

Status CudaBackend::upload(float* dst, const float* src, int64_t n) {
  activate();
  forget_q8();
  if (capturing_) return unsupported("upload while a step is recorded");
  DF_RETURN_IF_ERROR(check(
      cudaMemcpyAsync(dst, src, sizeof(float) * static_cast<size_t>(n), cudaMemcpyHostToDevice, stream_), "upload"));
  return synchronize();  // the host buffer may go away when the call returns
}
Result<void*> CudaBackend::host_staging(size_t bytes) {
  if (host_staging_bytes_ < bytes) {  // the last copy through it is done (each user waits for its copy)
    if (host_staging_) cudaFreeHost(host_staging_);
    host_staging_ = nullptr;
    host_staging_bytes_ = 0;
    const size_t want = std::max<size_t>(bytes, 16 << 10);
    DF_RETURN_IF_ERROR(check(cudaMallocHost(&host_staging_, want), "cudaMallocHost (download staging)"));
    host_staging_bytes_ = want;
  }
  return host_staging_;
}

// Up to kStagedDownloadBytes (a step's logits) through pinned memory: a copy into pageable memory runs at a few
// GB/s (1 MB of 27B logits: ~0.2 ms), into pinned memory at the link's rate, and the host copy after it is short.
Status CudaBackend::download(float* dst, const float* src, int64_t n) {
  activate();
  if (capturing_) return unsupported("download while a step is recorded");
  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  if (bytes == 0 || bytes > kStagedDownloadBytes) {
    DF_RETURN_IF_ERROR(check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download"));
    return synchronize();
  }
  DF_ASSIGN_OR_RETURN(void* staged, host_staging(bytes));
  DF_RETURN_IF_ERROR(check(cudaMemcpyAsync(staged, src, bytes, cudaMemcpyDeviceToHost, stream_), "download"));
  DF_RETURN_IF_ERROR(synchronize());
  std::memcpy(dst, staged, bytes);
  return Status();
}
Status CudaBackend::copy_from_peer(float* dst, Backend& from, const float* src, int64_t n) {
  activate();
  auto* peer = dynamic_cast<CudaBackend*>(&from);
  if (peer == nullptr) return unsupported("a peer copy takes another CUDA backend's memory");
  if (capturing_ || peer->capturing_) return unsupported("peer copy while a step is recorded");
  if (peer->device_ != device_ && !peer_access_tried_) {
    // Direct access over NVLink/PCIe where the devices allow it; cudaMemcpyPeer stages otherwise.
    peer_access_tried_ = true;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, device_, peer->device_) == cudaSuccess && can) {
      const cudaError_t e = cudaDeviceEnablePeerAccess(peer->device_, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) return check(e, "cudaDeviceEnablePeerAccess");
      cudaGetLastError();
    }
  }
  // Ordered on the two streams, no host wait: this stream waits for the work `from` has queued (src complete),
  // copies, and `from`'s stream waits for the copy (src's memory, released to `from`, is reused only after it).
  DF_RETURN_IF_ERROR(peer->ensure_handoff_event());
  DF_RETURN_IF_ERROR(ensure_handoff_event());
  peer->activate();
  DF_RETURN_IF_ERROR(check(cudaEventRecord(peer->handoff_event_, peer->stream_), "cudaEventRecord (hand-off)"));
  activate();
  DF_RETURN_IF_ERROR(check(cudaStreamWaitEvent(stream_, peer->handoff_event_, 0), "cudaStreamWaitEvent (hand-off)"));
  DF_RETURN_IF_ERROR(check(
      cudaMemcpyPeerAsync(dst, device_, src, peer->device_, sizeof(float) * static_cast<size_t>(n), stream_),
      "peer copy"));
  DF_RETURN_IF_ERROR(check(cudaEventRecord(handoff_event_, stream_), "cudaEventRecord (hand-off)"));
  peer->activate();
  const Status waited =
      check(cudaStreamWaitEvent(peer->stream_, handoff_event_, 0), "cudaStreamWaitEvent (hand-off)");
  activate();
  return waited;
}

Result<uint64_t> CudaBackend::weight_bytes(const cpu::WeightView& w) const {
  const int64_t rb = cuda::device_row_bytes(w.type, w.cols);
  if (rb < 0 || w.rows < 0 || (rb > 0 && w.rows > INT64_MAX / rb))
    return invalid_argument("a {} x {} {} weight has no device form", w.rows, w.cols, dtype_name(w.type));
  return static_cast<uint64_t>(rb * w.rows);
}

Status CudaBackend::pack_weight(const cpu::WeightView& w, void* dst) const {
  if (!cuda::to_device_form(w.type, w.data, w.rows, w.cols, dst))
    return invalid_argument("a {} x {} {} weight has no device form", w.rows, w.cols, dtype_name(w.type));
  return Status();
}

Status CudaBackend::ensure_handoff_event() {
  if (handoff_event_ != nullptr) return Status();
  activate();
  return check(cudaEventCreateWithFlags(&handoff_event_, cudaEventDisableTiming), "cudaEventCreate (hand-off)");
}

Status CudaBackend::copy(float* dst, const float* src, int64_t n) {
  activate();
  // The side stays when the copy writes elsewhere (its int8 and bf16 buffers are the backend's own).
  const auto d = reinterpret_cast<uintptr_t>(dst), s0 = reinterpret_cast<uintptr_t>(q8_side_.src);
  const uint64_t side_bytes = sizeof(float) * static_cast<uint64_t>(q8_side_.elems);
  if (d < s0 + side_bytes && s0 < d + sizeof(float) * static_cast<uint64_t>(n)) forget_q8();
  // A step's copies (captures, state, gathered rows: up to a few MB) run as a kernel, so that a recorded step's
  // launches stay one programmatic-launch chain (a memcpy node ends it); large ones (the bench's copy-rate
  // measurement among them) go to the copy engine's memcpy.
  if (n <= kCopyKernelMaxFloats) return check(cuda::copy_floats(dst, src, n, stream_), "device copy");
  return check(cudaMemcpyAsync(dst, src, sizeof(float) * static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream_),
               "device copy");
}

Status CudaBackend::copy_batch(std::span<const CopyItem> items) {
  activate();
  forget_q8();
  DF_RETURN_IF_ERROR(check_copy_batch(items));
  std::vector<cuda::DeviceCopy> table;
  int64_t max_n = 0;
  for (const CopyItem& c : items) {
    if (c.n == 0) continue;
    table.push_back({c.dst, c.src, c.n});
    max_n = std::max(max_n, c.n);
  }
  if (table.empty()) return Status();
  DF_ASSIGN_OR_RETURN(const void* dev, stage(copy_table_, table.data(), table.size() * sizeof(table[0]), false));
  // A launch takes up to kCopyBatchMaxItems; the items do not overlap, so slices may run one after another.
  constexpr auto kMaxItems = static_cast<size_t>(cuda::kCopyBatchMaxItems);
  const auto* dev_items = static_cast<const cuda::DeviceCopy*>(dev);
  for (size_t i = 0; i < table.size(); i += kMaxItems)
    DF_RETURN_IF_ERROR(check(cuda::copy_batch(dev_items + i, static_cast<int>(std::min(kMaxItems, table.size() - i)),
                                              max_n, stream_),
                             "batched device copy"));
  return Status();
}

Status CudaBackend::copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t cols,
                              int64_t rows) {
  activate();
  forget_q8();
  if (rows < 0 || cols < 0 || dst_stride < cols || src_stride < cols)
    return invalid_argument("copy_rows: {} rows of {} with strides {} and {}", rows, cols, dst_stride, src_stride);
  if (rows == 0 || cols == 0) return Status();
  constexpr size_t f = sizeof(float);
  return check(cudaMemcpy2DAsync(dst, f * static_cast<size_t>(dst_stride), src, f * static_cast<size_t>(src_stride),
                                 f * static_cast<size_t>(cols), static_cast<size_t>(rows), cudaMemcpyDeviceToDevice,
                                 stream_),
               "device 2D copy");
}

// Decode and verify steps (n <= 16) run the GEMV kernels: the integer-dot path for the common block
// types, f32 for the rest (bf16/f16 weights: one token only). Longer steps (prefill) run the bf16 tensor-core GEMM (both inputs rounded to
// bf16, f32 accumulation: the precision HF transformers runs bf16 checkpoints at), or, with
// set_tensor_core_prefill(false), the GEMV kernels in slices of 16 tokens; while set_token_exact(true)
// (speculative verify steps, and the plain steps of a target with a draft) the token-exact path
// (MatmulPath::kTokenExact: GEMV kernels, mmq for the large q4_K and q6_K weights, gemv16_mma for bf16) in slices
// of 32: each token's row then equals what a one-token token-exact step computes. Products of 17..32 tokens whose
// integer-dot weights the GEMM would dequantize to bf16 first (no fused kernel for their type or row length: a DFlash
// draft's 384-wide K/V over its context and block rows) take the token-exact path too.
Status CudaBackend::matmul(const cpu::WeightView& w, const float* x, int64_t n, float* y) {
  activate();
  const cpu::WeightView* ws[] = {&w};
  float* ys[] = {y};
  return matmul_group(ws, x, n, ys);
}

Status CudaBackend::matmul_group(std::span<const cpu::WeightView* const> ws, const float* x, int64_t n,
                                 std::span<float* const> ys) {
  activate();
  if (ws.size() != ys.size()) return invalid_argument("matmul_group: {} weights, {} outputs", ws.size(), ys.size());
  if (ws.empty()) return Status();
  const int64_t cols = ws[0]->cols;
  std::vector<cuda::MatmulTarget> targets;
  for (const cpu::WeightView* w : ws) {
    if (w->cols != cols) return invalid_argument("matmul_group: weights of {} and {} columns", cols, w->cols);
    targets.push_back({w->type, w->data, w->rows, nullptr});
  }
  // 17..32 tokens of integer-dot weights that the GEMM would dequantize first: the token-exact kernels, one slice.
  const bool q8_not_gemm = !token_exact_ && n > cuda::kGemvMaxTokens && n <= cuda::kMmqMaxTokens &&
                           std::all_of(ws.begin(), ws.end(), [&](const cpu::WeightView* w) {
                             return cuda::gemm_dequantizes_q8_type(w->type, w->data, w->rows, cols, n);
                           });
  const bool exact_kernels = token_exact_ || q8_not_gemm;
  const int64_t slice = exact_kernels ? cuda::kMmqMaxTokens : cuda::kGemvMaxTokens;
  const cuda::MatmulPath path = exact_kernels ? cuda::MatmulPath::kTokenExact : cuda::MatmulPath::kAuto;
  const bool side = q8_side_.src == x && q8_side_.elems == n * cols;  // x's producer quantized it already
  const bool side_bf16 = side && q8_side_.bf16;                         // ... and wrote its bf16 form
  // The first token-exact product of bf16 weights from kGemv16MmaBf16XFrom tokens whose x has no bf16 side asks
  // the producers for one from then on (while token-exact): its own x is converted this once.
  if (token_exact_ && n >= cuda::kGemv16MmaBf16XFrom && !side_bf16 && !bf16_side_wanted_)
    bf16_side_wanted_ = std::any_of(ws.begin(), ws.end(), [&](const cpu::WeightView* w) {
      return w->type == DType::kBF16 && cuda::gemv16_mma_applies(w->type, w->data, cols);
    });
  // bf16/f16 weights (a DFlash draft's, a bf16 model's) take the tensor cores from two tokens on: their GEMV
  // reads the weights once but runs the f32 path, compute-bound at 16 rows.
  const bool float_weights = std::all_of(ws.begin(), ws.end(), [](const cpu::WeightView* w) {
    return w->type == DType::kBF16 || w->type == DType::kF16;
  });
  const int64_t gemm_from = float_weights ? 2 : cuda::kGemvMaxTokens + 1;
  if (n >= gemm_from && tensor_core_prefill_ && !exact_kernels) {  // x rounded to bf16 once for every weight
    for (size_t i = 0; i < ws.size(); ++i) targets[i].y = ys[i];
    return cuda::matmul_group(targets, cols, x, n, stream_, cuda::MatmulPath::kGemmBf16, nullptr);
  }
  for (int64_t t0 = 0; t0 < n; t0 += slice) {
    const int64_t m = std::min(slice, n - t0);
    for (size_t i = 0; i < ws.size(); ++i) targets[i].y = ys[i] + t0 * ws[i]->rows;
    const int64_t e = t0 * cols;
    const cuda::Q8Out pre{q8_buf_.xq + e, q8_buf_.xd + e / 32, q8_buf_.xs + e / 16,
                          side_bf16 ? q8_buf_.xb + e : nullptr};
    DF_RETURN_IF_ERROR(
        cuda::matmul_group(targets, cols, x + t0 * cols, m, stream_, path, side ? &pre : nullptr));
    q8_side_uses_ += side;
    bf16_side_uses_ += side_bf16 && m >= cuda::kGemv16MmaBf16XFrom;
  }
  return Status();
}

Status CudaBackend::matmul_swiglu(const cpu::WeightView& gate, const cpu::WeightView& up, const float* x, int64_t n,
                                  float* g, float* u) {
  activate();
  const int64_t cols = gate.cols;
  const cuda::MatmulTarget tg{gate.type, gate.data, gate.rows, nullptr}, tu{up.type, up.data, up.rows, nullptr};
  if (!token_exact_ || up.cols != cols || !cuda::matmul_swiglu_fused(tg, tu, cols, n, cuda::MatmulPath::kTokenExact))
    return Backend::matmul_swiglu(gate, up, x, n, g, u);
  forget_q8();
  return cuda::matmul_swiglu(tg, tu, cols, x, n, g, stream_);
}

// Row bytes of the ids gathered on the device into scratch, then dequantized there (one launch each).
Status CudaBackend::embedding(const cpu::WeightView& table, std::span<const int32_t> ids, float* out) {
  activate();
  forget_q8();
  const int64_t drb = cuda::device_row_bytes(table.type, table.cols);
  if (drb < 0) return invalid_argument("embedding: a {} table of {} columns", dtype_name(table.type), table.cols);
  const auto rb = static_cast<uint64_t>(drb);
  if (ids.empty()) return Status();
  for (int32_t id : ids)
    if (id < 0 || id >= table.rows)
      return invalid_argument("token id {} is outside the embedding table of {} rows", id, table.rows);
  DF_ASSIGN_OR_RETURN(const int32_t* dev_ids, device_ints(positions_, ids, "embedding"));
  const auto n = static_cast<int64_t>(ids.size());
  DF_ASSIGN_OR_RETURN(void* rows, reserve(embed_rows_, static_cast<size_t>(rb) * static_cast<size_t>(n)));
  DF_RETURN_IF_ERROR(check(cuda::gather_row_bytes(table.data, static_cast<int64_t>(rb), table.rows, dev_ids, n, rows,
                                                  stream_),
                           "embedding rows"));
  return cuda::dequantize_rows_to_f32(table.type, rows, out, n, table.cols, stream_);
}

cuda::Q8Out CudaBackend::q8_for(const float* y, int64_t elems) {
  if (elems <= 0 || elems > kQ8SideElems || elems % cuda::kQ8Block != 0) {
    forget_q8();
    return cuda::Q8Out{};
  }
  const bool bf16 = token_exact_ && bf16_side_wanted_;
  q8_side_ = Q8Side{y, elems, bf16};
  cuda::Q8Out out = q8_buf_;
  if (!bf16) out.xb = nullptr;
  return out;
}

cuda::Q8Out CudaBackend::q8_for_rows(const float* y, int64_t rows, int64_t dim) {
  if (dim % cuda::kQ8Block != 0) {  // the fused producers quantize 32-element blocks within a row
    forget_q8();
    return cuda::Q8Out{};
  }
  return q8_for(y, rows * dim);
}

cuda::Q8Out CudaBackend::norm_q8(const float* y, int64_t rows, int64_t dim) {
  if (rows > cuda::kMmqMaxTokens || !cuda::rms_norm_q8_supported(dim)) {
    forget_q8();
    return cuda::Q8Out{};
  }
  return q8_for_rows(y, rows, dim);
}

Status CudaBackend::rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* y) {
  activate();
  Status st = check(cuda::rms_norm(x, w, eps, n, dim, y, stream_, norm_q8(y, n, dim)), "rms_norm");
  if (!st.ok()) forget_q8();
  return st;
}

Status CudaBackend::rope_neox(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t rot_dims,
                              std::span<const int32_t> positions, double theta, double freq_scale) {
  activate();
  forget_q8();
  DF_ASSIGN_OR_RETURN(const double* table, rope_table(theta, freq_scale, rot_dims));
  if (static_cast<int64_t>(positions.size()) != n) return invalid_argument("rope: {} positions for {} rows", positions.size(), n);
  DF_ASSIGN_OR_RETURN(const int32_t* pos, device_ints(positions_, positions, "rope"));
  return check(cuda::rope_neox(x, n, n_heads, head_dim, rot_dims, pos, theta, freq_scale, stream_, table),
               "rope_neox");
}

Status CudaBackend::attention(const float* q, int64_t n_q, int64_t n_heads, const cpu::KvView& kv,
                              const cpu::AttentionMask& mask, float scale, float* out) {
  activate();
  forget_q8();
  const float* const* k_table = kv.device_k_table;
  const float* const* v_table = kv.device_v_table;
  if (k_table == nullptr || v_table == nullptr) {
    // Tables held on the host: to the device side by side, [k..., v...].
    std::vector<const float*> table(kv.k_chunks.begin(), kv.k_chunks.end());
    table.insert(table.end(), kv.v_chunks.begin(), kv.v_chunks.end());
    DF_ASSIGN_OR_RETURN(const void* t, stage(chunk_table_, table.data(), table.size() * sizeof(const float*)));
    k_table = static_cast<const float* const*>(t);
    v_table = k_table + kv.k_chunks.size();
  }
  cuda::DeviceKvView dkv{k_table, v_table, kv.chunk_tokens, kv.n_tokens, kv.n_kv_heads, kv.head_dim};
  dkv.f16 = kv.type == cpu::KvType::kF16;
  DF_ASSIGN_OR_RETURN(const int32_t* par, device_ints(parents_, mask.parents, "attention"));
  cuda::DeviceAttnMask dmask{cuda::to_device(mask.kind), mask.n_prefix, par};
  dmask.window = mask.window;
  // fp16 KV: decode and verify on the tensor-core path kernel alike (attention.h), with a draft or without, so
  // that speculative decoding gives plain decoding's text.
  dmask.path_tensor_cores = true;
  if (capturing_) {  // the replay's {KV prefix, KV length}
    if (n_q > cuda::kAttnDeviceLengthsMaxQueries)
      return unsupported("a recorded step's attention takes at most {} queries", cuda::kAttnDeviceLengthsMaxQueries);
    if (mask.n_prefix != capture_values_.n_prefix || kv.n_tokens != capture_values_.n_tokens)
      return unsupported("attention over {} of {} keys, not the recorded step's {} of {}", mask.n_prefix, kv.n_tokens,
                         capture_values_.n_prefix, capture_values_.n_tokens);
    dmask.lengths = step_params_ + 1;
  }
  // Prefill-shaped calls on the f16 tensor cores, unless steps must compute as decode does (token-exact
  // verify steps, or tensor-core prefill turned off).
  const cuda::AttnPrefillKernel kernel = tensor_core_prefill_ && !token_exact_ ? cuda::AttnPrefillKernel::kTensorCore
                                                                              : cuda::AttnPrefillKernel::kSimt;
  const size_t ws_bytes = cuda::attention_workspace_bytes_with(kernel, n_q, n_heads, dkv, dmask);
  DF_ASSIGN_OR_RETURN(void* ws, reserve(workspace_, ws_bytes));
  return cuda::attention_checked(q, n_q, n_heads, dkv, dmask, scale, out, ws, ws_bytes, stream_, kernel);
}

// The frequencies as the CPU forms them (std::pow on the host), uploaded once per shape.
Result<const double*> CudaBackend::rope_table(double theta, double freq_scale, int64_t rot_dims) {
  activate();
  const RopeKey key{theta, freq_scale, rot_dims};
  auto table = rope_tables_.find(key);
  if (table != rope_tables_.end()) return static_cast<const double*>(table->second);
  if (capturing_) return unsupported("a RoPE table must exist before a step is recorded");
  std::vector<double> inv(static_cast<size_t>(rot_dims / 2));
  for (size_t i = 0; i < inv.size(); ++i)
    inv[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rot_dims)) / freq_scale;
  double* d = nullptr;
  DF_RETURN_IF_ERROR(check(cudaMalloc(reinterpret_cast<void**>(&d), std::max<size_t>(1, inv.size()) * sizeof(double)),
                           "cudaMalloc (rope table)"));
  rope_tables_.emplace(key, d);
  DF_RETURN_IF_ERROR(
      check(cudaMemcpy(d, inv.data(), inv.size() * sizeof(double), cudaMemcpyHostToDevice), "rope table upload"));
  return static_cast<const double*>(d);
}

Status CudaBackend::attention_prep(float* q, float* k, const float* v, int64_t n, int64_t nh, int64_t nkv, int64_t hd,
                                   const float* q_norm, const float* k_norm, float eps, int64_t rot,
                                   std::span<const int32_t> positions, double theta, double freq_scale,
                                   const cpu::KvView& kv, int64_t first_slot, int64_t q_from) {
  activate();
  forget_q8();
  if (!cuda::qk_prep_supported(hd, rot) || kv.device_k_table == nullptr || kv.device_v_table == nullptr)
    return Backend::attention_prep(q, k, v, n, nh, nkv, hd, q_norm, k_norm, eps, rot, positions, theta, freq_scale, kv,
                                   first_slot, q_from);
  DF_RETURN_IF_ERROR(check_attention_prep(n, q_from, positions.size()));
  DF_RETURN_IF_ERROR(check_kv_slots(kv, first_slot, n, "attention_prep"));
  DF_ASSIGN_OR_RETURN(const double* table, rope_table(theta, freq_scale, rot));
  cuda::QkPrepArgs a{.q = q, .k = k, .v = v, .n = n, .nh = nh, .nkv = nkv, .hd = hd, .rot = rot,
                     .q_norm = q_norm, .k_norm = k_norm, .eps = eps, .inv_freq = table, .positions = nullptr,
                     .k_chunks = const_cast<float* const*>(kv.device_k_table),
                     .v_chunks = const_cast<float* const*>(kv.device_v_table), .chunk_tokens = kv.chunk_tokens,
                     .first_slot = first_slot, .slot_dev = nullptr, .kv_f16 = kv.type == cpu::KvType::kF16,
                     .q_from = q_from};
  DF_ASSIGN_OR_RETURN(a.positions, device_ints(positions_, positions, "attention_prep"));
  if (capturing_) {
    DF_ASSIGN_OR_RETURN(a.slot_dev, recorded_first_slot(first_slot, "attention_prep"));
  }
  return check(cuda::qk_prep(a, stream_), "attention_prep");
}

Status CudaBackend::kv_write(const cpu::KvView& kv, int64_t first_pos, const float* k, const float* v, int64_t n) {
  activate();
  forget_q8();
  if (kv.device_k_table == nullptr || kv.device_v_table == nullptr) {
    if (capturing_) return unsupported("a recorded step needs the KV tables on the device");
    return Backend::kv_write(kv, first_pos, k, v, n);
  }
  DF_RETURN_IF_ERROR(check_kv_slots(kv, first_pos, n, "kv_write"));
  const int32_t* first_dev = nullptr;
  if (capturing_) {
    DF_ASSIGN_OR_RETURN(first_dev, recorded_first_slot(first_pos, "kv_write"));
  }
  return check(cuda::kv_write(const_cast<float* const*>(kv.device_k_table), const_cast<float* const*>(kv.device_v_table),
                              kv.chunk_tokens, kv.n_kv_heads * kv.head_dim, k, v, n, first_pos, first_dev, stream_,
                              kv.type == cpu::KvType::kF16),
               "kv_write");
}

Status CudaBackend::gated_delta_net(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                    int64_t n, const cpu::DeltaNetShape& s, float* state, float* out,
                                    float* per_token_states, std::span<const int32_t> parents, bool chunked,
                                    float* state_before) {
  activate();
  forget_q8();
  const cuda::DeltaNetDims dims{s.n_k_heads, s.n_v_heads, s.d_k, s.d_v};
  if (chunked) {
    DF_RETURN_IF_ERROR(check_chunked_deltanet(per_token_states, parents, state_before));
    const size_t ws_bytes = cuda::gated_delta_net_chunked_workspace_bytes(n, dims);
    DF_ASSIGN_OR_RETURN(void* ws, reserve(workspace_, ws_bytes));
    return cuda::run_gated_delta_net_chunked(q, k, v, g, beta, n, dims, state, out, ws, ws_bytes, stream_);
  }
  DF_ASSIGN_OR_RETURN(const int32_t* par, device_ints(parents_, parents, "gated_delta_net"));
  return cuda::run_gated_delta_net_recurrent(q, k, v, g, beta, n, dims, state, out, per_token_states, par,
                                             state_before, stream_);
}

Status CudaBackend::restore_deltanet(std::span<const DeltaNetRestore> layers, int64_t n,
                                     const cpu::DeltaNetShape& s) {
  activate();
  forget_q8();
  if (layers.empty()) return Status();
  const cuda::DeltaNetDims dims{s.n_k_heads, s.n_v_heads, s.d_k, s.d_v};
  std::vector<cuda::DeltaNetRestoreLayer> table;
  int vec_layers = 0, reruns = 0;
  for (const DeltaNetRestore& l : layers) {
    table.push_back({l.state, l.from, l.q, l.k, l.v, l.g, l.beta, l.conv, l.conv_from, l.conv_elems});
    if (l.from != nullptr && l.q != nullptr) {
      ++reruns;
      vec_layers += cuda::gated_delta_net_restore_vec(&table.back(), 1, dims);
    }
  }
  // A re-run token must sum in the layout its step used (float4 or not, from its pointers): where the layers
  // differ, each its own launches.
  if ((vec_layers != 0 && vec_layers != reruns) || table.size() > 65535 || n > INT32_MAX)
    return Backend::restore_deltanet(layers, n, s);
  DF_ASSIGN_OR_RETURN(const void* dev, stage(restore_table_, table.data(), table.size() * sizeof(table[0]), false));
  return check(cuda::gated_delta_net_restore(static_cast<const cuda::DeltaNetRestoreLayer*>(dev),
                                             static_cast<int>(table.size()), reruns > 0 && vec_layers == reruns, n,
                                             dims, stream_),
               "DeltaNet restore");
}

Status CudaBackend::causal_conv1d_silu(const float* x, int64_t n, int64_t channels, const float* w, int64_t kernel,
                                       float* conv_state, float* out, std::span<const int32_t> parents) {
  forget_q8();
  DF_ASSIGN_OR_RETURN(const int32_t* par, device_ints(parents_, parents, "causal_conv1d_silu"));
  return cuda::run_causal_conv1d_silu(x, n, channels, w, kernel, conv_state, out, par, stream_);
}

Status CudaBackend::add_rms_norm(float* x, const float* delta, const float* w, float eps, int64_t n, int64_t dim,
                                 float* y) {
  activate();
  Status st = check(cuda::add_rms_norm(x, delta, w, eps, n, dim, y, stream_, norm_q8(y, n, dim)), "add_rms_norm");
  if (!st.ok()) forget_q8();
  return st;
}
Status CudaBackend::add_inplace(float* y, const float* x, int64_t n) {
  activate();
  forget_q8();
  return check(cuda::add(y, x, y, n, stream_), "add");
}
Status CudaBackend::mul_inplace(float* y, const float* x, int64_t n) {
  activate();
  forget_q8();
  return check(cuda::mul(y, x, y, n, stream_), "mul");
}
Status CudaBackend::silu_inplace(float* x, int64_t n) {
  activate();
  forget_q8();
  return check(cuda::silu_inplace(x, n, stream_), "silu");
}
Status CudaBackend::sigmoid_inplace(float* x, int64_t n) {
  activate();
  forget_q8();
  return check(cuda::sigmoid_inplace(x, n, stream_), "sigmoid");
}
Status CudaBackend::swiglu(const float* gate, const float* up, float* out, int64_t n) {
  activate();
  Status st = check(cuda::swiglu(gate, up, out, n, stream_, q8_for(out, n)), "swiglu");
  if (!st.ok()) forget_q8();
  return st;
}
Status CudaBackend::sigmoid_gate_mul(float* o, const float* gate, int64_t rows, int64_t dim, int64_t gate_stride) {
  activate();
  const cuda::Q8Out q8 = q8_for_rows(o, rows, dim);
  Status st = check(cuda::sigmoid_gate_mul(o, gate, rows, dim, gate_stride, stream_, q8), "sigmoid_gate_mul");
  if (!st.ok()) forget_q8();
  return st;
}
Status CudaBackend::rms_norm_silu_gate(float* o, const float* w, float eps, int64_t rows, int64_t dim, float* z) {
  activate();
  if (dim > cuda::kRmsNormSiluGateMaxDim) {
    forget_q8();
    return Backend::rms_norm_silu_gate(o, w, eps, rows, dim, z);
  }
  const cuda::Q8Out q8 = q8_for_rows(o, rows, dim);
  Status st = check(cuda::rms_norm_silu_gate(o, w, eps, rows, dim, z, stream_, q8), "rms_norm_silu_gate");
  if (!st.ok()) forget_q8();
  return st;
}
Status CudaBackend::deltanet_prep(const float* mixed, int64_t n, const cpu::DeltaNetShape& s, const float* conv_w,
                                  int64_t kernel, float* conv_state, std::span<const int32_t> parents, float* q,
                                  float* k, float* v, float* alpha_to_decay, float* beta, const float* dt_bias,
                                  const float* ssm_a, float* conv_capture) {
  activate();
  forget_q8();
  constexpr int64_t kMaxDim = 32 * cuda::kDeltaNetPrepMaxPer;
  if (s.d_k > kMaxDim || s.d_v > kMaxDim || n > 65535)
    return Backend::deltanet_prep(mixed, n, s, conv_w, kernel, conv_state, parents, q, k, v, alpha_to_decay, beta,
                                  dt_bias, ssm_a, conv_capture);
  if (kernel < 1 || kernel > cuda::kConvMaxKernel)
    return invalid_argument("deltanet_prep: conv kernel size {} outside [1, {}]", kernel, cuda::kConvMaxKernel);
  if (!parents.empty() && static_cast<int64_t>(parents.size()) != n)
    return invalid_argument("deltanet_prep: {} parents for {} tokens", parents.size(), n);
  DF_ASSIGN_OR_RETURN(const int32_t* par, device_ints(parents_, parents, "deltanet_prep"));
  cuda::DeltaNetPrepArgs a;
  a.mixed = mixed;
  a.n_k_heads = s.n_k_heads, a.n_v_heads = s.n_v_heads, a.d_k = s.d_k, a.d_v = s.d_v;
  a.conv_w = conv_w;
  a.kernel = static_cast<int>(kernel);
  a.conv_state = conv_state;
  a.parents = par;
  a.q = q, a.k = k, a.v = v, a.alpha = alpha_to_decay, a.beta = beta;
  a.dt_bias = dt_bias;
  a.ssm_a = ssm_a;
  a.q_scale = 1.0f / std::sqrt(static_cast<float>(s.d_k));
  a.conv_capture = conv_capture;
  return check(cuda::deltanet_prep(a, n, stream_), "deltanet_prep");
}
Status CudaBackend::slice_columns(const float* src, int64_t rows, int64_t src_width, int64_t offset, int64_t width,
                                  float* dst) {
  activate();
  forget_q8();
  return check(cuda::slice_columns(src, rows, src_width, offset, width, dst, stream_), "slice_columns");
}
Status CudaBackend::l2_norm_rows(float* x, int64_t rows, int64_t dim, float eps, float scale) {
  forget_q8();
  return check(cuda::l2_norm_rows(x, rows, dim, eps, scale, stream_), "l2_norm_rows");
}
Status CudaBackend::deltanet_gates(float* alpha_to_decay, float* beta, const float* dt_bias, const float* ssm_a,
                                   int64_t n, int64_t n_heads) {
  activate();
  forget_q8();
  return check(cuda::deltanet_gates(alpha_to_decay, beta, dt_bias, ssm_a, n, n_heads, stream_), "deltanet_gates");
}
Status CudaBackend::gather_rows(const float* x, int64_t dim, std::span<const int64_t> rows, float* out) {
  activate();
  forget_q8();
  if (consecutive_rows(rows))  // one copy, nothing to stage
    return copy(out, x + rows[0] * dim, static_cast<int64_t>(rows.size()) * dim);
  DF_ASSIGN_OR_RETURN(const void* r, stage(rows_, rows.data(), rows.size_bytes()));
  return check(cuda::gather_rows(x, dim, static_cast<const int64_t*>(r), static_cast<int64_t>(rows.size()), out, stream_),
               "gather_rows");
}

// The results [ids rows*k | values rows*k | lse rows] and, 256-aligned after them, the kernels' workspace
// in one scratch (reserved at first for the largest usual call, 64 rows of k 16 over a large vocabulary).
Status CudaBackend::top_k_rows(const float* x, int64_t rows, int64_t cols, int64_t k, int32_t* ids, float* values,
                               float* lse) {
  activate();
  static_assert(Backend::kMaxTopK == cuda::kTopKMax);
  DF_RETURN_IF_ERROR(cpu::check_top_k_rows(rows, cols, k));
  if (rows == 0) return Status();
  if (x == nullptr || ids == nullptr || values == nullptr)
    return invalid_argument("top_k_rows: null input, ids or values array");
  if (capturing_) return unsupported("top_k_rows while a step is recorded");
  forget_q8();
  const auto aligned = [](size_t b) { return (b + 255) & ~size_t{255}; };
  const size_t result_bytes = sizeof(float) * static_cast<size_t>(rows * (2 * k + 1));
  const cuda::TopKPlan plan = cuda::plan_top_k_rows(rows, cols, k, sm_count_);
  const size_t usual = aligned(sizeof(float) * 64 * (2 * kMaxTopK + 1)) +
                       cuda::plan_top_k_rows(64, int64_t{1} << 20, kMaxTopK, sm_count_).workspace_bytes;
  DF_ASSIGN_OR_RETURN(void* scratch,
                      reserve(top_k_, std::max(aligned(result_bytes) + plan.workspace_bytes, usual), false));
  void* workspace = static_cast<uint8_t*>(scratch) + aligned(result_bytes);
  auto* d_ids = static_cast<int32_t*>(scratch);
  float* d_values = reinterpret_cast<float*>(d_ids + rows * k);
  float* d_lse = d_values + rows * k;
  DF_RETURN_IF_ERROR(check(cuda::top_k_rows(x, rows, cols, k, plan, workspace, d_ids, d_values,
                                            lse != nullptr ? d_lse : nullptr, stream_),
                           "top_k_rows"));
  DF_ASSIGN_OR_RETURN(void* staged, host_staging(result_bytes));
  const size_t copy_bytes = lse != nullptr ? result_bytes : result_bytes - sizeof(float) * static_cast<size_t>(rows);
  DF_RETURN_IF_ERROR(
      check(cudaMemcpyAsync(staged, scratch, copy_bytes, cudaMemcpyDeviceToHost, stream_), "top_k_rows download"));
  DF_RETURN_IF_ERROR(synchronize());
  const auto* h_ids = static_cast<const int32_t*>(staged);
  const auto* h_values = reinterpret_cast<const float*>(h_ids + rows * k);
  const size_t n = static_cast<size_t>(rows * k);
  std::memcpy(ids, h_ids, n * sizeof(int32_t));
  std::memcpy(values, h_values, n * sizeof(float));
  if (lse != nullptr) std::memcpy(lse, h_values + n, static_cast<size_t>(rows) * sizeof(float));
  return Status();
}

}  // namespace dflash

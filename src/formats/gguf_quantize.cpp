#include "formats/gguf_quantize.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <memory>

#include <sys/mman.h>
#include <unistd.h>

#include "base/file_io.h"
#include "tensor/quant.h"

namespace dflash {

namespace {

constexpr FileTypeInfo kFileTypes[] = {
    {FileType::kQ4_0, "q4_0", DType::kQ4_0},     {FileType::kQ4_1, "q4_1", DType::kQ4_1},
    {FileType::kQ5_0, "q5_0", DType::kQ5_0},     {FileType::kQ5_1, "q5_1", DType::kQ5_1},
    {FileType::kQ8_0, "q8_0", DType::kQ8_0},     {FileType::kQ2_K, "q2_k", DType::kQ2_K},
    {FileType::kQ3_K_S, "q3_k_s", DType::kQ3_K}, {FileType::kQ3_K_M, "q3_k_m", DType::kQ3_K},
    {FileType::kQ3_K_L, "q3_k_l", DType::kQ3_K}, {FileType::kQ4_K_S, "q4_k_s", DType::kQ4_K},
    {FileType::kQ4_K_M, "q4_k_m", DType::kQ4_K}, {FileType::kQ5_K_S, "q5_k_s", DType::kQ5_K},
    {FileType::kQ5_K_M, "q5_k_m", DType::kQ5_K}, {FileType::kQ6_K, "q6_k", DType::kQ6_K},
    {FileType::kF16, "f16", DType::kF16},        {FileType::kBF16, "bf16", DType::kBF16},
    {FileType::kAllF32, "f32", DType::kF32},
};

constexpr uint32_t kQuantizationVersion = 2;  // ggml's GGML_QNT_VERSION
constexpr uint64_t kSlabBytes = 64ull << 20;  // output bytes converted per step of a large tensor

// Broad roles of a tensor for the type rules (llama.cpp's tensor_category), by name substring.
enum class Role { kTokenEmbd, kAttnQ, kAttnK, kAttnV, kAttnQkv, kAttnKvB, kAttnOutput, kFfnUp, kFfnGate, kFfnDown,
                  kOutput, kOther };

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

Role role_of(std::string_view name) {
  if (name == "output.weight") return Role::kOutput;
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return Role::kTokenEmbd;
  // Order matters: "attn_qkv.weight" must win over "attn_v.weight"'s substring tests below it.
  if (contains(name, "attn_qkv.weight")) return Role::kAttnQkv;
  if (contains(name, "attn_kv_b.weight")) return Role::kAttnKvB;
  if (contains(name, "attn_v.weight")) return Role::kAttnV;
  if (contains(name, "attn_k.weight")) return Role::kAttnK;
  if (contains(name, "attn_q.weight")) return Role::kAttnQ;
  if (contains(name, "attn_output.weight")) return Role::kAttnOutput;
  if (contains(name, "ffn_up")) return Role::kFfnUp;
  if (contains(name, "ffn_gate")) return Role::kFfnGate;
  if (contains(name, "ffn_down")) return Role::kFfnDown;
  return Role::kOther;
}

// V-like projections share one "more bits" schedule: plain V, fused QKV (qwen35's GatedDeltaNet layers
// have one) and MLA's kv_b.
bool is_attn_v_like(Role r) { return r == Role::kAttnV || r == Role::kAttnQkv || r == Role::kAttnKvB; }

// "blk.N." -> N, else -1. Like llama.cpp's sscanf("blk.%d."), a number right after "blk." is enough.
int block_index(std::string_view name) {
  if (!name.starts_with("blk.")) return -1;
  size_t i = 4;
  bool neg = false;
  if (i < name.size() && (name[i] == '-' || name[i] == '+')) neg = name[i++] == '-';
  if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
  int64_t v = 0;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i)
    v = std::min<int64_t>(v * 10 + (name[i] - '0'), 1 << 30);
  return static_cast<int>(neg ? -v : v);
}

// ggml_n_dims: trailing dimensions of size 1 do not count, and there is always at least one.
int n_dims(const std::vector<uint64_t>& shape) {
  for (int i = static_cast<int>(shape.size()) - 1; i >= 1; --i)
    if (shape[i] > 1) return i + 1;
  return 1;
}

// Substrings of the names llama.cpp never quantizes: norms, MoE routers, convolution kernels and small
// or position-like tables of other families (kept so other GGUFs get the same answer too).
constexpr std::string_view kNeverQuantized[] = {
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
    "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
    "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight",
    ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger",
    "a.rvq.codebook", "mm.a.code_embd",
};

// Whether the file type's mix may change this tensor at all: 2-D and 3-D weights only.
bool quantizable(const std::string& name, const std::vector<uint64_t>& shape) {
  if (n_dims(shape) < 2) return false;
  // llama.cpp tests `name.rfind("weight") == name.size() - 6`, which a 5-character name also passes
  // (npos == size_t(-1)); kept so the same files give the same answer.
  if (!name.ends_with("weight") && name.size() != 5) return false;
  if (name == "position_embd.weight" || name == "token_types.weight") return false;
  for (std::string_view s : kNeverQuantized)
    if (contains(name, s)) return false;
  return true;
}

uint32_t block_elems(DType t) { return dtype_info(t)->block_elems; }

// Layer-schedule state of llama.cpp's quantize_state_impl: counters advance in plan order.
struct MixState {
  const QuantModelFacts* facts = nullptr;
  FileType ftype = FileType::kQ8_0;
  bool tied_embeddings = true;  // no output.weight: token_embd doubles as the output head
  int n_attn_v = 0;             // V-like tensors in the file
  int i_attn_v = 0;
  int i_ffn_down = 0, i_ffn_gate = 0, i_ffn_up = 0;

  bool falcon() const { return facts->arch == "falcon"; }
  int n_gqa() const { return facts->n_head_kv == 0 ? 0 : static_cast<int>(facts->n_head / facts->n_head_kv); }
  // llama.cpp's LLM_TYPE_70B, the one model size the rules look at (only LLaMA sets it).
  bool is_llama_70b() const { return facts->arch == "llama" && facts->n_layer == 80 && facts->n_head != facts->n_head_kv; }
};

// The first and last eighth of the layers, and every third layer between, get more bits.
bool use_more_bits(int i_layer, int n_layers) {
  return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

// The layer a per-layer rule applies to: the running count of such tensors for dense models; for MoE
// models (experts of a layer may be split over several tensors) the number in the name.
Result<int> rule_layer(const MixState& s, int counter, const std::string& name) {
  if (std::max<uint32_t>(1, s.facts->n_expert) <= 1) return counter;
  const int layer = block_index(name);
  if (!name.starts_with("blk.") || layer == -1) return invalid_argument("cannot read the layer of tensor '{}'", name);
  if (layer < 0 || layer >= static_cast<int>(s.facts->n_layer))
    return invalid_argument("tensor '{}' has layer {} outside [0, {})", name, layer, s.facts->n_layer);
  return layer;
}

// The file type's choice for one quantizable tensor (llama_tensor_get_type_impl, for the file types of
// kFileTypes; the IQ/TQ/MXFP4 branches are left out with those types).
Result<DType> mix_type(MixState& s, DType type, const std::string& name, const std::vector<uint64_t>& shape,
                       Role role) {
  using F = FileType;
  const F ft = s.ftype;
  const uint32_t n_expert = s.facts->n_expert;
  if (role == Role::kOutput || (s.tied_embeddings && role == Role::kTokenEmbd)) {
    if (s.falcon() || shape[0] % block_elems(type) != 0) return DType::kQ8_0;
    return type == DType::kQ8_0 ? type : DType::kQ6_K;
  }
  if (role == Role::kTokenEmbd) return type;
  if (is_attn_v_like(role)) {
    // (llama.cpp has a separate attn_qkv rule further down; this branch shadows it, so fused QKV
    // follows the V schedule, counted together with the V tensors.)
    if (ft == F::kQ2_K) type = s.n_gqa() >= 4 ? DType::kQ4_K : DType::kQ3_K;
    else if (ft == F::kQ3_K_M) type = s.i_attn_v < 2 ? DType::kQ5_K : DType::kQ4_K;
    else if (ft == F::kQ3_K_L) type = DType::kQ5_K;
    else if ((ft == F::kQ4_K_M || ft == F::kQ5_K_M) && use_more_bits(s.i_attn_v, s.n_attn_v)) type = DType::kQ6_K;
    else if (ft == F::kQ4_K_S && s.i_attn_v < 4) type = DType::kQ5_K;
    if (s.is_llama_70b() && (type == DType::kQ3_K || type == DType::kQ4_K)) type = DType::kQ5_K;
    if (n_expert == 8) type = DType::kQ8_0;
    ++s.i_attn_v;
    return type;
  }
  if (role == Role::kAttnK) return n_expert == 8 ? DType::kQ8_0 : type;
  if (role == Role::kAttnQ) return type;
  if (role == Role::kFfnDown) {
    DF_ASSIGN_OR_RETURN(const int i, rule_layer(s, s.i_ffn_down, name));
    const int n = static_cast<int>(s.facts->n_layer);
    if (ft == F::kQ2_K) {
      type = DType::kQ3_K;
    } else if (ft == F::kQ3_K_M) {
      type = i < n / 16 ? DType::kQ5_K : (!s.falcon() || use_more_bits(i, n)) ? DType::kQ4_K : DType::kQ3_K;
    } else if (ft == F::kQ3_K_L) {
      type = s.falcon() ? DType::kQ4_K : DType::kQ5_K;
    } else if (ft == F::kQ4_K_M) {
      if (s.falcon()) type = i < n / 16 ? DType::kQ6_K : use_more_bits(i, n) ? DType::kQ5_K : DType::kQ4_K;
      else if (use_more_bits(i, n)) type = DType::kQ6_K;
    } else if (ft == F::kQ5_K_M && use_more_bits(i, n)) {
      type = DType::kQ6_K;
    } else if (ft == F::kQ4_K_S && !s.falcon() && i < n / 8) {
      type = DType::kQ5_K;
    }
    ++s.i_ffn_down;
    return type;
  }
  if (role == Role::kAttnOutput) {
    if (s.falcon()) return ft == F::kQ3_K_L ? DType::kQ4_K : type;
    if (n_expert == 8) {
      if (ft == F::kQ2_K || ft == F::kQ3_K_S || ft == F::kQ3_K_M || ft == F::kQ4_K_S || ft == F::kQ4_K_M)
        return DType::kQ5_K;
      return type;
    }
    if (ft == F::kQ2_K) return DType::kQ3_K;
    if (ft == F::kQ3_K_M) return DType::kQ4_K;
    if (ft == F::kQ3_K_L) return DType::kQ5_K;
    return type;
  }
  if (role == Role::kFfnGate || role == Role::kFfnUp) {
    int& counter = role == Role::kFfnGate ? s.i_ffn_gate : s.i_ffn_up;
    DF_RETURN_IF_ERROR(rule_layer(s, counter, name));  // only the IQ3_XS mix uses the layer; errors still apply
    ++counter;
  }
  return type;
}

// A type the row length rules out is replaced: k-quants by the legacy type of similar size, then f16.
Result<DType> row_fallback(DType type, uint64_t ncols, const std::string& name, bool* fell_back) {
  const uint32_t qk = block_elems(type);
  *fell_back = false;
  if (ncols % qk == 0) return type;
  *fell_back = true;
  DType out = type;
  switch (type) {
    case DType::kQ2_K:
    case DType::kQ3_K: out = DType::kQ4_0; break;
    case DType::kQ4_K: out = DType::kQ5_0; break;
    case DType::kQ5_K: out = DType::kQ5_1; break;
    case DType::kQ6_K: out = DType::kQ8_0; break;
    default:
      if (qk > 32) return unsupported("tensor '{}': no fallback type for {} rows of {}", name, ncols, dtype_name(type));
  }
  if (ncols % block_elems(out) != 0) out = DType::kF16;
  return out;
}

// Drops the pages of a finished tensor from this process's resident set (they stay in the page cache), so
// resident memory stays at one slab instead of growing to the whole input as the map is read through.
void release_pages(std::span<const uint8_t> bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(bytes.data()) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size()) & ~(page - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);  // advice only
}

uint32_t first_uint(const GgufValue* v) {
  if (v == nullptr) return 0;
  if (auto i = v->as_int()) return static_cast<uint32_t>(std::max<int64_t>(0, *i));
  if (auto* a = v->as_int_array(); a && !a->empty()) return static_cast<uint32_t>(std::max<int64_t>(0, a->front()));
  return 0;
}

}  // namespace

std::span<const FileTypeInfo> file_types() { return kFileTypes; }

const FileTypeInfo& file_type_info(FileType t) {
  for (const auto& info : kFileTypes)
    if (info.type == t) return info;
  return kFileTypes[4];  // unreachable for valid enum values; q8_0
}

std::optional<FileType> file_type_from_name(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "all_f32") lower = "f32";
  for (const auto& info : kFileTypes)
    if (info.name == lower) return info.type;
  return std::nullopt;
}

std::string file_type_names() {
  std::string s;
  for (const auto& info : kFileTypes) s += (s.empty() ? "" : ", ") + std::string(info.name);
  return s;
}

Result<QuantModelFacts> quant_model_facts(const GgufFile& file) {
  QuantModelFacts f;
  DF_ASSIGN_OR_RETURN(auto arch, file.get_string("general.architecture"));
  if (!arch || arch->empty()) return invalid_argument("{}: general.architecture is missing", file.path());
  f.arch = *arch;
  DF_ASSIGN_OR_RETURN(auto n_layer, file.get_int(f.arch + ".block_count"));
  if (!n_layer || *n_layer <= 0 || *n_layer > 4096)
    return invalid_argument("{}: {}.block_count is missing or out of range", file.path(), f.arch);
  f.n_layer = static_cast<uint32_t>(*n_layer);
  f.n_head = first_uint(file.find(f.arch + ".attention.head_count"));
  const GgufValue* kv = file.find(f.arch + ".attention.head_count_kv");
  f.n_head_kv = kv ? first_uint(kv) : f.n_head;
  f.n_expert = first_uint(file.find(f.arch + ".expert_count"));
  return f;
}

Result<QuantPlan> plan_quantization(const std::vector<GgufTensorInfo>& tensors, const QuantModelFacts& facts,
                                    const QuantOptions& options) {
  QuantPlan plan;
  plan.file_type = options.file_type;
  const DType default_type = file_type_info(options.file_type).default_type;
  const bool mix = dtype_info(default_type)->quantized;  // f16/bf16/f32 files have no mix and no fallbacks

  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int la = block_index(tensors[a].name), lb = block_index(tensors[b].name);
    return la != lb ? la < lb : tensors[a].name < tensors[b].name;
  });

  MixState state;
  state.facts = &facts;
  state.ftype = options.file_type;
  for (const auto& t : tensors) {
    const Role r = role_of(t.name);
    if (is_attn_v_like(r)) ++state.n_attn_v;
    if (r == Role::kOutput) state.tied_embeddings = false;
  }

  for (size_t idx : order) {
    const GgufTensorInfo& src = tensors[idx];
    TensorQuant q;
    q.source = idx;
    q.name = src.name;
    q.shape = src.shape;
    q.from = src.type;
    q.to = src.type;
    q.bytes_in = src.nbytes;
    if (quantizable(src.name, src.shape)) {
      q.to = default_type;
      if (mix) {
        if (!options.pure) {
          DF_ASSIGN_OR_RETURN(q.to, mix_type(state, default_type, src.name, src.shape, role_of(src.name)));
        }
        DF_ASSIGN_OR_RETURN(q.to, row_fallback(q.to, src.shape[0], src.name, &q.fallback));
        if (q.fallback) ++plan.n_fallback;
      }
    }
    if (q.converts()) {
      const auto from_info = dtype_info(q.from);
      if (!from_info || !row_conversion_supported(q.from))
        return unsupported("tensor '{}': cannot convert from type {} (id {})", q.name, dtype_name(q.from),
                           static_cast<uint32_t>(q.from));
      if (from_info->quantized && !options.allow_requantize)
        return invalid_argument(
            "tensor '{}' is already quantized ({}); requantizing loses quality, pass --allow-requantize to do it anyway",
            q.name, dtype_name(q.from));
    }
    uint64_t n = src.n_elements();
    DF_ASSIGN_OR_RETURN(const uint64_t row, row_bytes(q.to, q.shape[0]));
    q.bytes_out = q.shape[0] == 0 ? 0 : n / q.shape[0] * row;
    plan.bytes_in += q.bytes_in;
    plan.bytes_out += q.bytes_out;
    plan.n_elements += n;
    plan.tensors.push_back(std::move(q));
  }
  return plan;
}

Result<QuantPlan> plan_quantization(const GgufFile& file, const QuantOptions& options) {
  DF_ASSIGN_OR_RETURN(const QuantModelFacts facts, quant_model_facts(file));
  return plan_quantization(file.tensors(), facts, options);
}

Status write_quantized_gguf(const GgufFile& in, const QuantPlan& plan, const std::string& out_path, int threads,
                            const QuantProgress& progress) {
  GgufWriter w;
  w.set_alignment(in.alignment());
  for (const auto& [key, value] : in.metadata()) {
    if (key == "split.no" || key == "split.count" || key == "split.tensors.count") continue;  // one output file
    w.set(key, value);
  }
  // Removed and appended, as ggml's gguf_set_val_* does, so the key order matches llama.cpp's files.
  w.remove("general.quantization_version");
  w.set("general.quantization_version", GgufValue::u32(kQuantizationVersion));
  w.remove("general.file_type");
  w.set("general.file_type", GgufValue::u32(static_cast<uint32_t>(plan.file_type)));

  auto buffer = std::make_shared<std::vector<uint8_t>>();  // one slab, reused by every tensor
  const size_t count = plan.tensors.size();
  for (size_t i = 0; i < count; ++i) {
    const TensorQuant& q = plan.tensors[i];
    if (q.source >= in.tensors().size() || in.tensors()[q.source].name != q.name)
      return invalid_argument("quantization plan does not match the input file at tensor '{}'", q.name);
    const GgufTensorInfo& src = in.tensors()[q.source];
    auto write = [&in, &src, &q, i, count, threads, buffer, &progress](std::FILE* f) -> Status {
      if (progress) progress(q, i, count);
      const std::span<const uint8_t> data = in.tensor_data(src);
      if (data.size() != q.bytes_in)
        return corrupt("tensor '{}' holds {} bytes, its shape and type need {}", q.name, data.size(), q.bytes_in);
      if (!q.converts()) {
        DF_RETURN_IF_ERROR(write_all(f, data.data(), data.size()));
        release_pages(data);
        return Status();
      }
      const uint64_t cols = q.shape[0];
      if (cols == 0 || q.bytes_out == 0) return Status();
      DF_ASSIGN_OR_RETURN(const uint64_t row_in, row_bytes(q.from, cols));
      DF_ASSIGN_OR_RETURN(const uint64_t row_out, row_bytes(q.to, cols));
      const uint64_t rows = q.bytes_out / row_out;
      const uint64_t slab_rows = std::max<uint64_t>(1, kSlabBytes / row_out);
      buffer->resize(std::min(rows, slab_rows) * row_out);
      for (uint64_t r = 0; r < rows; r += slab_rows) {
        const uint64_t n = std::min(slab_rows, rows - r);
        DF_RETURN_IF_ERROR(convert_rows(q.from, data.data() + r * row_in, q.to, buffer->data(),
                                        static_cast<int64_t>(n), static_cast<int64_t>(cols), threads)
                               .with_context(fmt::format("tensor '{}': ", q.name)));
        DF_RETURN_IF_ERROR(write_all(f, buffer->data(), n * row_out));
        release_pages(data.subspan(r * row_in, n * row_in));
      }
      return Status();
    };
    DF_RETURN_IF_ERROR(w.add_tensor(q.name, q.to, q.shape, write));
  }
  return w.write(out_path);
}

}  // namespace dflash

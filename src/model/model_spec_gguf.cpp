// ModelSpec <-> GGUF metadata (`<arch>.*` keys as llama.cpp's loader reads them; algorithms.md D.7).
#include <cmath>
#include <cstdlib>
#include <limits>

#include <fmt/ranges.h>

#include "model/model_spec.h"

namespace dflash {
namespace {

constexpr int64_t kU32Max = std::numeric_limits<uint32_t>::max();

// Typed access to `<arch>.<suffix>` keys with range checks and messages naming the key.
class ArchKeys {
 public:
  ArchKeys(const GgufFile& g, std::string arch) : g_(g), arch_(std::move(arch)) {}

  std::string key(std::string_view suffix) const { return fmt::format("{}.{}", arch_, suffix); }

  Result<std::optional<int64_t>> opt_int_key(const std::string& k, int64_t lo, int64_t hi) const {
    DF_ASSIGN_OR_RETURN(auto v, g_.get_int(k));
    if (v && (*v < lo || *v > hi)) return corrupt("metadata '{}' = {} is out of range [{}, {}]", k, *v, lo, hi);
    return v;
  }
  Result<std::optional<int64_t>> opt_int(std::string_view suffix, int64_t lo, int64_t hi) const {
    return opt_int_key(key(suffix), lo, hi);
  }
  Result<int64_t> req_int(std::string_view suffix, int64_t lo, int64_t hi) const {
    DF_ASSIGN_OR_RETURN(auto v, opt_int(suffix, lo, hi));
    if (!v) return corrupt("required metadata '{}' is missing", key(suffix));
    return *v;
  }
  // An f32 value comes back as the double its shortest decimal form denotes (1e-06f -> 1e-6), so a
  // spec read from GGUF equals the one read from the config.json the GGUF was converted from.
  Result<std::optional<double>> opt_float(std::string_view suffix) const {
    std::string k = key(suffix);
    DF_ASSIGN_OR_RETURN(auto v, g_.get_float(k));
    if (!v) return v;
    if (!std::isfinite(*v)) return corrupt("metadata '{}' is not finite", k);
    if (g_.find(k)->type() == GgufType::kF32) v = std::strtod(fmt::format("{}", static_cast<float>(*v)).c_str(), nullptr);
    return v;
  }

  // llama.cpp's get_key_or_arr: a scalar, or a per-layer array whose first `n` entries must agree here
  // (dflash supports no per-layer head counts or FFN sizes).
  Result<std::optional<int64_t>> opt_uniform(std::string_view suffix, int64_t n, int64_t lo, int64_t hi) const {
    std::string k = key(suffix);
    const GgufValue* v = g_.find(k);
    if (v == nullptr) return std::optional<int64_t>();
    if (!v->is_array()) return opt_int_key(k, lo, hi);
    const std::vector<int64_t>* a = v->as_int_array();
    if (a == nullptr || a->empty()) return corrupt("metadata '{}' is not an integer or a list of integers", k);
    size_t count = std::min<size_t>(a->size(), static_cast<size_t>(n));
    for (size_t i = 0; i < count; ++i) {
      if ((*a)[i] != (*a)[0])
        return unsupported("metadata '{}' varies per layer ({} vs {}); per-layer sizes are not supported", k, (*a)[0],
                           (*a)[i]);
    }
    if ((*a)[0] < lo || (*a)[0] > hi) return corrupt("metadata '{}' = {} is out of range [{}, {}]", k, (*a)[0], lo, hi);
    return std::optional<int64_t>((*a)[0]);
  }

  // An integer or bool array (nullptr when absent); error when present with another type.
  Result<const std::vector<int64_t>*> opt_int_array(const std::string& k) const {
    const GgufValue* v = g_.find(k);
    if (v == nullptr) return static_cast<const std::vector<int64_t>*>(nullptr);
    const std::vector<int64_t>* a = v->as_int_array();
    if (a == nullptr) return corrupt("metadata '{}' should be a list of integers, not {}", k, gguf_type_name(v->type()));
    return a;
  }

 private:
  const GgufFile& g_;
  std::string arch_;
};

Status read_rope_scaling(const GgufFile& g, const ArchKeys& k, ModelSpec& s) {
  DF_ASSIGN_OR_RETURN(auto type, g.get_string(k.key("rope.scaling.type")));
  std::string t = type.value_or("none");
  DF_ASSIGN_OR_RETURN(auto factor, k.opt_float("rope.scaling.factor"));
  if (!factor) {
    DF_ASSIGN_OR_RETURN(factor, k.opt_float("rope.scale_linear"));
  }
  if (t == "none" || (t == "linear" && (!factor || *factor == 1.0))) return Status();
  if (t != "linear" && t != "yarn")
    return unsupported("rope scaling type '{}' is not supported (supported: none, linear, yarn)", t.substr(0, 32));
  if (!factor || *factor <= 0) return corrupt("rope scaling '{}' needs a positive '{}'", t, k.key("rope.scaling.factor"));
  s.rope_scaling.type = t == "yarn" ? RopeScalingType::kYarn : RopeScalingType::kLinear;
  s.rope_scaling.factor = *factor;
  if (t == "yarn") {
    DF_ASSIGN_OR_RETURN(auto orig, k.opt_int("rope.scaling.original_context_length", 1, kU32Max));
    s.rope_scaling.original_context = orig.value_or(s.max_context);
    DF_ASSIGN_OR_RETURN(s.rope_scaling.attn_factor, k.opt_float("rope.scaling.attn_factor"));
    DF_ASSIGN_OR_RETURN(s.rope_scaling.beta_fast, k.opt_float("rope.scaling.yarn_beta_fast"));
    DF_ASSIGN_OR_RETURN(s.rope_scaling.beta_slow, k.opt_float("rope.scaling.yarn_beta_slow"));
  }
  return Status();
}

Status read_qwen35(const ArchKeys& k, int64_t block_count, ModelSpec& s) {
  DF_ASSIGN_OR_RETURN(auto sections, k.opt_int_array(k.key("rope.dimension_sections")));
  if (sections == nullptr) return corrupt("required metadata '{}' is missing", k.key("rope.dimension_sections"));
  if (sections->size() > 4)
    return corrupt("metadata '{}' has {} entries; at most 4", k.key("rope.dimension_sections"), sections->size());
  for (size_t i = 0; i < sections->size(); ++i) s.rope_sections[i] = (*sections)[i];

  DF_ASSIGN_OR_RETURN(s.gdn.conv_kernel, k.req_int("ssm.conv_kernel", 1, 64));
  DF_ASSIGN_OR_RETURN(s.gdn.d_k, k.req_int("ssm.state_size", 1, 4096));
  DF_ASSIGN_OR_RETURN(s.gdn.n_k_heads, k.req_int("ssm.group_count", 1, 65536));
  DF_ASSIGN_OR_RETURN(s.gdn.n_v_heads, k.req_int("ssm.time_step_rank", 1, 65536));
  DF_ASSIGN_OR_RETURN(int64_t inner, k.req_int("ssm.inner_size", 1, kU32Max));
  if (inner % s.gdn.n_v_heads != 0)
    return corrupt("metadata '{}' = {} is not a multiple of {} value heads", k.key("ssm.inner_size"), inner,
                   s.gdn.n_v_heads);
  s.gdn.d_v = inner / s.gdn.n_v_heads;

  DF_ASSIGN_OR_RETURN(auto recurrent, k.opt_int_array(k.key("attention.recurrent_layers")));
  if (recurrent != nullptr) {
    if (static_cast<int64_t>(recurrent->size()) < s.n_layers)
      return corrupt("metadata '{}' has {} entries for {} layers", k.key("attention.recurrent_layers"),
                     recurrent->size(), block_count);
    for (int64_t i = 0; i < s.n_layers; ++i)
      s.layer_kinds.push_back((*recurrent)[i] ? LayerKind::kGatedDeltaNet : LayerKind::kGatedAttention);
  } else {
    DF_ASSIGN_OR_RETURN(auto interval_key, k.opt_int("full_attention_interval", 1, 4096));
    int64_t interval = interval_key.value_or(4);
    for (int64_t i = 0; i < s.n_layers; ++i)
      s.layer_kinds.push_back((i + 1) % interval != 0 ? LayerKind::kGatedDeltaNet : LayerKind::kGatedAttention);
  }
  s.attn_output_gate = true;
  s.q_gate_packed_per_head = true;
  if (s.n_recurrent_layers() == 0) s.gdn = DeltaNetDims{};
  return Status();
}

Status read_dflash(const GgufFile& g, const ArchKeys& k, ModelSpec& s) {
  DF_ASSIGN_OR_RETURN(auto targets, k.opt_int_array(k.key("target_layers")));
  if (targets == nullptr) return corrupt("required metadata '{}' is missing", k.key("target_layers"));
  // llama.cpp stores HF hidden_states indices: the output of layer l is hidden_states[l + 1].
  for (int64_t t : *targets) {
    if (t < 1 || t > 4096) return corrupt("metadata '{}' entry {} is out of range [1, 4096]", k.key("target_layers"), t);
    s.target_layer_ids.push_back(t - 1);
  }
  DF_ASSIGN_OR_RETURN(auto block, k.opt_int("block_size", 2, 1024));
  s.block_size = block.value_or(16);
  DF_ASSIGN_OR_RETURN(auto mask, g.get_int("tokenizer.ggml.mask_token_id"));
  s.mask_token_id = mask;
  for (int64_t i = 0; i < s.n_layers; ++i) s.layer_kinds.push_back(LayerKind::kDraftAttention);

  DF_ASSIGN_OR_RETURN(auto window, k.opt_int("attention.sliding_window", 0, kU32Max));
  if (window && *window > 0) {
    DF_ASSIGN_OR_RETURN(auto pattern, k.opt_int_array(k.key("attention.sliding_window_pattern")));
    if (pattern == nullptr) return corrupt("'{}' is set without '{}'", k.key("attention.sliding_window"),
                                           k.key("attention.sliding_window_pattern"));
    if (static_cast<int64_t>(pattern->size()) < s.n_layers)
      return corrupt("metadata '{}' has {} entries for {} layers", k.key("attention.sliding_window_pattern"),
                     pattern->size(), s.n_layers);
    for (int64_t i = 0; i < s.n_layers; ++i) s.sliding_window[i] = (*pattern)[i] ? *window : 0;
  }
  return Status();
}

}  // namespace

Result<ModelSpec> model_spec_from_gguf(const GgufFile& g) {
  auto fail = [&](const Status& st) { return st.with_context(fmt::format("gguf '{}'", g.path())); };
  auto arch_r = g.get_string("general.architecture");
  if (!arch_r.ok()) return fail(arch_r.status());
  if (!arch_r.value()) return fail(corrupt("no 'general.architecture' metadata"));
  const std::string arch = *arch_r.value();

  ModelSpec s;
  if (arch == "qwen3") {
    s.family = ModelFamily::kQwen3;
  } else if (arch == "qwen35") {
    s.family = ModelFamily::kQwen35;
  } else if (arch == "dflash") {
    s.family = ModelFamily::kDFlashDraft;
  } else if (arch == "qwen35moe" || arch == "qwen3next" || arch == "qwen3moe") {
    return fail(unsupported("architecture '{}' (MoE) is not supported yet", arch));
  } else {
    return fail(unsupported("architecture '{}' is not supported (supported: qwen3, qwen35, dflash)", arch.substr(0, 64)));
  }

  auto read = [&]() -> Status {
    ArchKeys k(g, arch);
    DF_ASSIGN_OR_RETURN(int64_t block_count, k.req_int("block_count", 1, 4096 + 64));
    DF_ASSIGN_OR_RETURN(auto nextn, k.opt_int("nextn_predict_layers", 0, 64));
    s.n_mtp_layers = nextn.value_or(0);
    if (s.n_mtp_layers >= block_count)
      return corrupt("'{}' = {} leaves no trunk layers of {} blocks", k.key("nextn_predict_layers"), s.n_mtp_layers,
                     block_count);
    if (s.family != ModelFamily::kQwen35 && s.n_mtp_layers != 0)
      return unsupported("MTP layers in a '{}' model are not supported", arch);
    s.n_layers = block_count - s.n_mtp_layers;
    s.sliding_window.assign(s.n_layers, 0);

    DF_ASSIGN_OR_RETURN(s.max_context, k.req_int("context_length", 1, kU32Max));
    DF_ASSIGN_OR_RETURN(s.hidden, k.req_int("embedding_length", 1, kU32Max));
    DF_ASSIGN_OR_RETURN(auto ffn, k.opt_uniform("feed_forward_length", s.n_layers, 1, kU32Max));
    if (!ffn) return corrupt("required metadata '{}' is missing", k.key("feed_forward_length"));
    s.ffn = *ffn;
    DF_ASSIGN_OR_RETURN(auto heads, k.opt_uniform("attention.head_count", s.n_layers, 1, 65536));
    if (!heads) return corrupt("required metadata '{}' is missing", k.key("attention.head_count"));
    s.n_heads = *heads;
    DF_ASSIGN_OR_RETURN(auto kv_heads, k.opt_uniform("attention.head_count_kv", s.n_layers, 1, 65536));
    s.n_kv_heads = kv_heads.value_or(s.n_heads);
    DF_ASSIGN_OR_RETURN(auto key_len, k.opt_int("attention.key_length", 1, 4096));
    if (!key_len && s.hidden % s.n_heads != 0)
      return corrupt("hidden size {} is not divisible by {} heads (and no '{}')", s.hidden, s.n_heads,
                     k.key("attention.key_length"));
    s.head_dim = key_len.value_or(s.hidden / s.n_heads);
    DF_ASSIGN_OR_RETURN(auto value_len, k.opt_int("attention.value_length", 1, 4096));
    if (value_len && *value_len != s.head_dim)
      return unsupported("value length {} differs from key length {}", *value_len, s.head_dim);
    DF_ASSIGN_OR_RETURN(auto eps, k.opt_float("attention.layer_norm_rms_epsilon"));
    if (!eps) return corrupt("required metadata '{}' is missing", k.key("attention.layer_norm_rms_epsilon"));
    s.rms_eps = *eps;
    DF_ASSIGN_OR_RETURN(auto theta, k.opt_float("rope.freq_base"));
    s.rope_theta = theta.value_or(10000.0);
    DF_ASSIGN_OR_RETURN(auto rot, k.opt_int("rope.dimension_count", 1, 4096));
    s.rope_dims = rot.value_or(s.head_dim);
    DF_RETURN_IF_ERROR(read_rope_scaling(g, k, s));

    // Vocabulary: the explicit key, else the tokenizer's list, else the embedding rows.
    DF_ASSIGN_OR_RETURN(auto vocab, k.opt_int("vocab_size", 1, kU32Max));
    if (!vocab) {
      const GgufValue* tokens = g.find("tokenizer.ggml.tokens");
      if (tokens != nullptr && tokens->is_array()) vocab = static_cast<int64_t>(tokens->array_size());
    }
    if (!vocab) {
      const GgufTensorInfo* emb = g.find_tensor("token_embd.weight");
      if (emb != nullptr && emb->shape.size() == 2) vocab = static_cast<int64_t>(emb->shape[1]);
    }
    if (!vocab || *vocab < 1) return corrupt("cannot tell the vocabulary size (no '{}', tokenizer or token_embd)",
                                             k.key("vocab_size"));
    s.vocab = *vocab;
    if (s.family != ModelFamily::kDFlashDraft) s.tied_embeddings = g.find_tensor("output.weight") == nullptr;

    DF_ASSIGN_OR_RETURN(s.bos_id, g.get_int("tokenizer.ggml.bos_token_id"));
    DF_ASSIGN_OR_RETURN(auto eos, g.get_int("tokenizer.ggml.eos_token_id"));
    if (eos) s.eos_ids.push_back(*eos);

    switch (s.family) {
      case ModelFamily::kQwen3:
        s.layer_kinds.assign(s.n_layers, LayerKind::kAttention);
        break;
      case ModelFamily::kQwen35:
        DF_RETURN_IF_ERROR(read_qwen35(k, block_count, s));
        break;
      case ModelFamily::kDFlashDraft:
        DF_RETURN_IF_ERROR(read_dflash(g, k, s));
        break;
    }
    // GGUF weights are already in canonical form (converter applied norm +1, -exp, V-head tiling).
    s.norms_zero_centred = false;
    s.v_head_order = VHeadOrder::kTiled;
    s.ssm_a_is_log = false;
    return s.validate();
  };
  Status st = read();
  if (!st.ok()) return fail(st);
  return s;
}

Status write_model_spec_to_gguf(const ModelSpec& s, GgufWriter& w) {
  DF_RETURN_IF_ERROR(s.validate());
  const std::string arch = gguf_arch_name(s.family);
  auto key = [&](std::string_view suffix) { return fmt::format("{}.{}", arch, suffix); };
  auto u32 = [&](std::string_view suffix, int64_t v) -> Status {
    if (v < 0 || v > kU32Max) return invalid_argument("'{}' = {} does not fit a u32", key(suffix), v);
    w.set(key(suffix), GgufValue::u32(static_cast<uint32_t>(v)));
    return Status();
  };
  auto f32 = [&](std::string_view suffix, double v) { w.set(key(suffix), GgufValue::f32(static_cast<float>(v))); };

  if (s.family == ModelFamily::kQwen35) {
    if (!s.attn_output_gate) return unsupported("llama.cpp's qwen35 needs the attention output gate");
    if (s.n_recurrent_layers() > 0 && s.gdn.d_k != s.gdn.d_v)
      return unsupported("llama.cpp's qwen35 needs equal DeltaNet key and value head dims (got {} and {})", s.gdn.d_k,
                         s.gdn.d_v);
  }
  int64_t window = 0;
  for (int64_t wnd : s.sliding_window) {
    if (wnd == 0) continue;
    if (s.family != ModelFamily::kDFlashDraft) return unsupported("sliding-window layers in a {} GGUF", arch);
    if (window != 0 && wnd != window) return unsupported("GGUF holds one sliding window; layers use {} and {}", window, wnd);
    window = wnd;
  }

  w.set("general.architecture", GgufValue::string(arch));
  DF_RETURN_IF_ERROR(u32("block_count", s.n_layers + s.n_mtp_layers));
  DF_RETURN_IF_ERROR(u32("context_length", s.max_context));
  DF_RETURN_IF_ERROR(u32("embedding_length", s.hidden));
  DF_RETURN_IF_ERROR(u32("feed_forward_length", s.ffn));
  DF_RETURN_IF_ERROR(u32("attention.head_count", s.n_heads));
  DF_RETURN_IF_ERROR(u32("attention.head_count_kv", s.n_kv_heads));
  DF_RETURN_IF_ERROR(u32("attention.key_length", s.head_dim));
  DF_RETURN_IF_ERROR(u32("attention.value_length", s.head_dim));
  f32("attention.layer_norm_rms_epsilon", s.rms_eps);
  f32("rope.freq_base", s.rope_theta);
  DF_RETURN_IF_ERROR(u32("rope.dimension_count", s.rope_dims));
  DF_RETURN_IF_ERROR(u32("vocab_size", s.vocab));

  if (s.rope_scaling.type != RopeScalingType::kNone) {
    bool yarn = s.rope_scaling.type == RopeScalingType::kYarn;
    w.set(key("rope.scaling.type"), GgufValue::string(yarn ? "yarn" : "linear"));
    f32("rope.scaling.factor", s.rope_scaling.factor);
    if (yarn) {
      DF_RETURN_IF_ERROR(u32("rope.scaling.original_context_length", s.rope_scaling.original_context));
      if (s.rope_scaling.attn_factor) f32("rope.scaling.attn_factor", *s.rope_scaling.attn_factor);
      if (s.rope_scaling.beta_fast) f32("rope.scaling.yarn_beta_fast", *s.rope_scaling.beta_fast);
      if (s.rope_scaling.beta_slow) f32("rope.scaling.yarn_beta_slow", *s.rope_scaling.beta_slow);
    }
  }

  if (s.family == ModelFamily::kQwen35) {
    w.set(key("rope.dimension_sections"),
          GgufValue::int_array(GgufType::kI32, {s.rope_sections.begin(), s.rope_sections.end()}));
    // llama.cpp's qwen35 loader requires the ssm keys even without DeltaNet layers.
    DeltaNetDims d = s.gdn;
    if (s.n_recurrent_layers() == 0) d = DeltaNetDims{1, 1, 1, 1, 1};
    DF_RETURN_IF_ERROR(u32("ssm.conv_kernel", d.conv_kernel));
    DF_RETURN_IF_ERROR(u32("ssm.state_size", d.d_k));
    DF_RETURN_IF_ERROR(u32("ssm.group_count", d.n_k_heads));
    DF_RETURN_IF_ERROR(u32("ssm.time_step_rank", d.n_v_heads));
    DF_RETURN_IF_ERROR(u32("ssm.inner_size", d.value_dim()));
    // Both the per-layer list (newer loaders) and the interval (older ones), as the HF converter does.
    std::vector<int64_t> recurrent;
    for (LayerKind kind : s.layer_kinds) recurrent.push_back(kind == LayerKind::kGatedDeltaNet ? 1 : 0);
    recurrent.resize(s.n_layers + s.n_mtp_layers, 0);  // MTP layers are attention
    w.set(key("attention.recurrent_layers"), GgufValue::int_array(GgufType::kBool, std::move(recurrent)));
    int64_t interval = 4;
    for (int64_t i = 0; i < s.n_layers; ++i)
      if (!s.is_recurrent(i)) {
        interval = i + 1;
        break;
      }
    DF_RETURN_IF_ERROR(u32("full_attention_interval", interval));
    if (s.n_mtp_layers > 0) DF_RETURN_IF_ERROR(u32("nextn_predict_layers", s.n_mtp_layers));
  }

  if (s.family == ModelFamily::kDFlashDraft) {
    std::vector<int64_t> targets;
    for (int64_t id : s.target_layer_ids) targets.push_back(id + 1);  // HF hidden_states index
    w.set(key("target_layers"), GgufValue::int_array(GgufType::kI32, std::move(targets)));
    DF_RETURN_IF_ERROR(u32("block_size", s.block_size));
    if (s.mask_token_id) w.set("tokenizer.ggml.mask_token_id", GgufValue::u32(static_cast<uint32_t>(*s.mask_token_id)));
    if (window > 0) {
      DF_RETURN_IF_ERROR(u32("attention.sliding_window", window));
      std::vector<int64_t> pattern;
      for (int64_t wnd : s.sliding_window) pattern.push_back(wnd > 0 ? 1 : 0);
      w.set(key("attention.sliding_window_pattern"), GgufValue::int_array(GgufType::kBool, std::move(pattern)));
    }
  }
  return Status();
}

}  // namespace dflash

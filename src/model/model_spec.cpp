#include "model/model_spec.h"

#include <cmath>
#include <numeric>

#include <fmt/ranges.h>

namespace dflash {
namespace {

constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int64_t kMaxHeads = 65536;
constexpr int64_t kMaxConvKernel = 64;

bool is_attention(LayerKind k) { return k != LayerKind::kGatedDeltaNet; }

Status check_dim(const char* what, int64_t v, int64_t hi = kMaxDim) {
  if (v < 1 || v > hi) return invalid_argument("{} {} is out of range [1, {}]", what, v, hi);
  return Status();
}

}  // namespace

const char* model_family_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::kQwen3: return "qwen3";
    case ModelFamily::kQwen35: return "qwen35";
    case ModelFamily::kDFlashDraft: return "dflash-draft";
  }
  return "unknown";
}

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::kAttention: return "attention";
    case LayerKind::kGatedAttention: return "gated attention";
    case LayerKind::kGatedDeltaNet: return "gated deltanet";
    case LayerKind::kDraftAttention: return "draft attention";
  }
  return "unknown";
}

int64_t ModelSpec::n_recurrent_layers() const {
  int64_t n = 0;
  for (LayerKind k : layer_kinds) n += k == LayerKind::kGatedDeltaNet ? 1 : 0;
  return n;
}

Status ModelSpec::validate() const {
  DF_RETURN_IF_ERROR(check_dim("layer count", n_layers, kMaxLayers));
  if (n_mtp_layers < 0 || n_mtp_layers > 64) return invalid_argument("MTP layer count {} is out of range [0, 64]", n_mtp_layers);
  DF_RETURN_IF_ERROR(check_dim("hidden size", hidden));
  DF_RETURN_IF_ERROR(check_dim("FFN size", ffn));
  DF_RETURN_IF_ERROR(check_dim("vocab size", vocab));
  DF_RETURN_IF_ERROR(check_dim("attention head count", n_heads, kMaxHeads));
  DF_RETURN_IF_ERROR(check_dim("KV head count", n_kv_heads, kMaxHeads));
  DF_RETURN_IF_ERROR(check_dim("head dim", head_dim, 4096));
  if (n_heads % n_kv_heads != 0)
    return invalid_argument("{} attention heads are not a multiple of {} KV heads", n_heads, n_kv_heads);
  if (max_context < 1) return invalid_argument("context length {} must be positive", max_context);
  if (!(rms_eps > 0 && rms_eps < 1)) return invalid_argument("RMSNorm epsilon {} is not in (0, 1)", rms_eps);
  if (!(std::isfinite(rope_theta) && rope_theta > 0)) return invalid_argument("rope theta {} must be positive", rope_theta);
  if (rope_dims < 2 || rope_dims > head_dim || rope_dims % 2 != 0)
    return invalid_argument("rotary dims {} must be even and in [2, head dim {}]", rope_dims, head_dim);
  int64_t section_sum = 0;
  for (int64_t s : rope_sections) {
    if (s < 0) return invalid_argument("rope sections [{}] have a negative entry", fmt::join(rope_sections, ", "));
    section_sum += s;
  }
  if (section_sum != 0 && 2 * section_sum != rope_dims)
    return invalid_argument("rope sections [{}] cover {} dims but {} dims are rotated", fmt::join(rope_sections, ", "),
                            2 * section_sum, rope_dims);
  if (rope_scaling.type != RopeScalingType::kNone) {
    if (!(std::isfinite(rope_scaling.factor) && rope_scaling.factor > 0))
      return invalid_argument("rope scaling factor {} must be positive", rope_scaling.factor);
    if (rope_scaling.type == RopeScalingType::kYarn && rope_scaling.original_context < 1)
      return invalid_argument("yarn rope scaling needs the original context length");
  }

  if (static_cast<int64_t>(layer_kinds.size()) != n_layers)
    return invalid_argument("{} layer kinds given for {} layers", layer_kinds.size(), n_layers);
  if (static_cast<int64_t>(sliding_window.size()) != n_layers)
    return invalid_argument("{} sliding windows given for {} layers", sliding_window.size(), n_layers);
  for (int64_t i = 0; i < n_layers; ++i) {
    LayerKind k = layer_kinds[i];
    bool allowed = false;
    switch (family) {
      case ModelFamily::kQwen3: allowed = k == LayerKind::kAttention; break;
      case ModelFamily::kQwen35:
        allowed = k == LayerKind::kGatedDeltaNet || k == (attn_output_gate ? LayerKind::kGatedAttention : LayerKind::kAttention);
        break;
      case ModelFamily::kDFlashDraft: allowed = k == LayerKind::kDraftAttention; break;
    }
    if (!allowed)
      return invalid_argument("layer {} is {}, which a {} model{} does not have", i, layer_kind_name(k),
                              model_family_name(family), attn_output_gate ? " with attention output gate" : "");
    if (sliding_window[i] < 0) return invalid_argument("layer {} sliding window {} is negative", i, sliding_window[i]);
    if (sliding_window[i] > 0 && !is_attention(k))
      return invalid_argument("layer {} is {} but has a sliding window", i, layer_kind_name(k));
  }
  if (attn_output_gate && family != ModelFamily::kQwen35)
    return invalid_argument("an attention output gate is only supported in qwen35 models");

  if (n_recurrent_layers() > 0) {
    DF_RETURN_IF_ERROR(check_dim("DeltaNet key head count", gdn.n_k_heads, kMaxHeads));
    DF_RETURN_IF_ERROR(check_dim("DeltaNet value head count", gdn.n_v_heads, kMaxHeads));
    DF_RETURN_IF_ERROR(check_dim("DeltaNet key head dim", gdn.d_k, 4096));
    DF_RETURN_IF_ERROR(check_dim("DeltaNet value head dim", gdn.d_v, 4096));
    DF_RETURN_IF_ERROR(check_dim("DeltaNet conv kernel", gdn.conv_kernel, kMaxConvKernel));
    if (gdn.n_v_heads % gdn.n_k_heads != 0)
      return invalid_argument("{} DeltaNet value heads are not a multiple of {} key heads", gdn.n_v_heads, gdn.n_k_heads);
  }
  if (family != ModelFamily::kQwen35 && n_mtp_layers != 0)
    return invalid_argument("{} models have no MTP layers (got {})", model_family_name(family), n_mtp_layers);

  if (bos_id && (*bos_id < 0 || *bos_id >= vocab))
    return invalid_argument("BOS token id {} is outside the vocabulary of {}", *bos_id, vocab);
  for (int64_t id : eos_ids)
    if (id < 0 || id >= vocab) return invalid_argument("EOS token id {} is outside the vocabulary of {}", id, vocab);

  if (family == ModelFamily::kDFlashDraft) {
    if (target_layer_ids.empty()) return invalid_argument("a DFlash draft needs target layer ids");
    for (size_t i = 0; i < target_layer_ids.size(); ++i) {
      int64_t id = target_layer_ids[i];
      if (id < 0) return invalid_argument("target layer id {} is negative", id);
      if (i > 0 && id <= target_layer_ids[i - 1])
        return invalid_argument("target layer ids [{}] are not strictly increasing", fmt::join(target_layer_ids, ", "));
      if (n_target_layers && id >= *n_target_layers)
        return invalid_argument("target layer id {} is past the target's {} layers", id, *n_target_layers);
    }
    if (block_size < 2 || block_size > 1024) return invalid_argument("draft block size {} is out of range [2, 1024]", block_size);
    if (mask_token_id && (*mask_token_id < 0 || *mask_token_id >= vocab))
      return invalid_argument("mask token id {} is outside the vocabulary of {}", *mask_token_id, vocab);
  } else if (!target_layer_ids.empty() || block_size != 0 || mask_token_id) {
    return invalid_argument("draft fields are set on a {} model", model_family_name(family));
  }
  return Status();
}

std::string ModelSpec::summary() const {
  std::string layers = fmt::format("{} layers", n_layers);
  if (family == ModelFamily::kQwen35)
    layers = fmt::format("{} layers ({} gdn + {} attn)", n_layers, n_recurrent_layers(), n_attention_layers());
  std::string s = fmt::format("{}: {}, H {}, FFN {}, vocab {}, heads {}x{} / {} kv, rope {} dims theta {:g}",
                              model_family_name(family), layers, hidden, ffn, vocab, n_heads, head_dim, n_kv_heads,
                              rope_dims, rope_theta);
  if (n_recurrent_layers() > 0)
    s += fmt::format(", gdn {}k x {} / {}v x {} conv {}", gdn.n_k_heads, gdn.d_k, gdn.n_v_heads, gdn.d_v, gdn.conv_kernel);
  if (n_mtp_layers > 0) s += fmt::format(", {} mtp", n_mtp_layers);
  if (tied_embeddings) s += ", tied head";
  if (family == ModelFamily::kDFlashDraft)
    s += fmt::format(", block {}, targets [{}]", block_size, fmt::join(target_layer_ids, ","));
  return s;
}

TensorNameLayout ModelSpec::name_layout() const {
  TensorNameLayout l;
  l.family = family == ModelFamily::kQwen3    ? NameFamily::kQwen3
             : family == ModelFamily::kQwen35 ? NameFamily::kQwen35
                                              : NameFamily::kDFlashDraft;
  for (LayerKind k : layer_kinds) l.recurrent.push_back(k == LayerKind::kGatedDeltaNet);
  l.n_mtp_layers = static_cast<int>(n_mtp_layers);
  l.hf_vl_wrapper = hf_vl_wrapper;
  l.tied_embeddings = tied_embeddings;
  return l;
}

// ---------------------------------------------------------------------------------------------
// From HF config.json

Result<ModelSpec> model_spec_from_hf_config(const HfConfig& c) {
  ModelSpec s;
  switch (c.kind) {
    case HfModelKind::kQwen3: s.family = ModelFamily::kQwen3; break;
    case HfModelKind::kQwen35: s.family = ModelFamily::kQwen35; break;
    case HfModelKind::kDFlashDraft: s.family = ModelFamily::kDFlashDraft; break;
  }
  if (c.attention_bias) return unsupported("config.json: attention_bias = true is not supported");
  if (c.hidden_act != "silu")
    return unsupported("config.json: hidden_act '{}' is not supported (only silu)", c.hidden_act.substr(0, 32));

  s.n_layers = c.num_hidden_layers;
  s.hidden = c.hidden_size;
  s.ffn = c.intermediate_size;
  s.vocab = c.vocab_size;
  s.n_heads = c.num_attention_heads;
  s.n_kv_heads = c.num_key_value_heads;
  s.head_dim = c.head_dim;
  s.max_context = c.max_position_embeddings;
  s.rms_eps = c.rms_norm_eps;
  s.rope_theta = c.rope_theta;
  double r = static_cast<double>(c.head_dim) * c.partial_rotary_factor;
  if (r != std::floor(r))
    return invalid_argument("config.json: partial_rotary_factor {} of head_dim {} is not a whole number of dims",
                            c.partial_rotary_factor, c.head_dim);
  s.rope_dims = static_cast<int64_t>(r);
  if (s.family == ModelFamily::kQwen35) {
    if (c.mrope_section.size() > 4)
      return invalid_argument("config.json: mrope_section has {} entries; at most 4", c.mrope_section.size());
    for (size_t i = 0; i < c.mrope_section.size(); ++i) s.rope_sections[i] = c.mrope_section[i];
  }
  if (c.rope_scaling.type == "linear") {
    s.rope_scaling.type = RopeScalingType::kLinear;
  } else if (c.rope_scaling.type == "yarn") {
    s.rope_scaling.type = RopeScalingType::kYarn;
    s.rope_scaling.original_context = c.rope_scaling.original_max_position_embeddings;
    s.rope_scaling.attn_factor = c.rope_scaling.attention_factor;
    s.rope_scaling.beta_fast = c.rope_scaling.beta_fast;
    s.rope_scaling.beta_slow = c.rope_scaling.beta_slow;
  }
  if (s.rope_scaling.type != RopeScalingType::kNone) s.rope_scaling.factor = c.rope_scaling.factor;
  // A draft has no embedding or head of its own (it borrows the target's).
  s.tied_embeddings = s.family != ModelFamily::kDFlashDraft && c.tie_word_embeddings;

  for (const std::string& t : c.layer_types) {
    LayerKind k = LayerKind::kAttention;
    if (s.family == ModelFamily::kDFlashDraft) {
      k = LayerKind::kDraftAttention;
    } else if (s.family == ModelFamily::kQwen35) {
      k = t == "linear_attention" ? LayerKind::kGatedDeltaNet
          : c.attn_output_gate    ? LayerKind::kGatedAttention
                                  : LayerKind::kAttention;
    }
    s.layer_kinds.push_back(k);
    s.sliding_window.push_back(t == "sliding_attention" && c.sliding_window ? *c.sliding_window : 0);
  }
  if (s.family == ModelFamily::kQwen35) {
    s.gdn.n_k_heads = c.linear_num_key_heads;
    s.gdn.n_v_heads = c.linear_num_value_heads;
    s.gdn.d_k = c.linear_key_head_dim;
    s.gdn.d_v = c.linear_value_head_dim;
    s.gdn.conv_kernel = c.linear_conv_kernel_dim;
    s.attn_output_gate = c.attn_output_gate;
    s.q_gate_packed_per_head = c.attn_output_gate;
    s.n_mtp_layers = c.mtp_num_hidden_layers;
    s.norms_zero_centred = true;  // D.2: HF keeps (1 + w) norms
    s.v_head_order = VHeadOrder::kGrouped;
    s.ssm_a_is_log = true;
    if (s.n_recurrent_layers() == 0) s.gdn = DeltaNetDims{};
  }
  s.hf_vl_wrapper = c.nested_text_config;
  s.bos_id = c.bos_token_id;
  s.eos_ids = c.eos_token_ids;
  if (s.family == ModelFamily::kDFlashDraft) {
    s.target_layer_ids = c.target_layer_ids;
    s.block_size = c.block_size;
    s.mask_token_id = c.mask_token_id;
    s.n_target_layers = c.num_target_layers;
  }
  Status st = s.validate();
  if (!st.ok()) return Status(ErrorCode::kCorrupt, st.message()).with_context("config.json");
  return s;
}

Result<ModelSpec> model_spec_from_hf_config(const nlohmann::json& config) {
  DF_ASSIGN_OR_RETURN(HfConfig c, parse_hf_config(config));
  return model_spec_from_hf_config(c);
}

Result<ModelSpec> model_spec_from_hf_path(const std::string& path) {
  DF_ASSIGN_OR_RETURN(HfConfig c, load_hf_config(path));
  auto s = model_spec_from_hf_config(c);
  if (!s.ok()) return s.status().with_context(path);
  return s;
}

const char* gguf_arch_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::kQwen3: return "qwen3";
    case ModelFamily::kQwen35: return "qwen35";
    case ModelFamily::kDFlashDraft: return "dflash";
  }
  return "unknown";
}

}  // namespace dflash

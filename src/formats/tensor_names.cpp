#include "formats/tensor_names.h"

#include <fmt/format.h>

namespace dflash {
namespace {

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

struct Part {
  const char* canonical;  // after "layers.<i>."
  const char* gguf;       // after "blk.<n>." (with suffix)
  const char* hf;         // after "<prefix>layers.<i>." (with suffix)
  uint32_t transform;
};

}  // namespace

TensorNameMap::TensorNameMap(const TensorNameLayout& layout) : layout_(layout) {
  const bool q35 = layout.family == NameFamily::kQwen35;
  const bool draft = layout.family == NameFamily::kDFlashDraft;
  // Zero-centred norms exist only in qwen35 HF checkpoints.
  const uint32_t norm_fix = q35 ? kHfNormPlusOne : kHfNone;
  const std::string hf_model = draft ? "" : (layout.hf_vl_wrapper ? "model.language_model." : "model.");
  const int n_layers = static_cast<int>(layout.recurrent.size());

  // Globals.
  if (draft) {
    add({"fc", "fc.weight", "fc.weight", kHfNone, -1});
    add({"hidden_norm", "enc.output_norm.weight", "hidden_norm.weight", kHfNone, -1});
    add({"output_norm", "output_norm.weight", "norm.weight", kHfNone, -1});
  } else {
    add({"token_embd", "token_embd.weight", hf_model + "embed_tokens.weight", kHfNone, -1});
    add({"output_norm", "output_norm.weight", hf_model + "norm.weight", norm_fix, -1});
    if (!layout.tied_embeddings) add({"output", "output.weight", "lm_head.weight", kHfNone, -1});
  }

  // Parts shared by every layer, and by mixer kind. GGUF names the pre-FFN norm differently per arch.
  const char* ffn_norm_gguf = q35 ? "post_attention_norm.weight" : "ffn_norm.weight";
  const std::vector<Part> common = {
      {"attn_norm", "attn_norm.weight", "input_layernorm.weight", norm_fix},
      {"ffn_norm", ffn_norm_gguf, "post_attention_layernorm.weight", norm_fix},
      {"ffn.gate", "ffn_gate.weight", "mlp.gate_proj.weight", kHfNone},
      {"ffn.up", "ffn_up.weight", "mlp.up_proj.weight", kHfNone},
      {"ffn.down", "ffn_down.weight", "mlp.down_proj.weight", kHfNone},
  };
  const std::vector<Part> attention = {
      {"attn.q", "attn_q.weight", "self_attn.q_proj.weight", kHfNone},
      {"attn.k", "attn_k.weight", "self_attn.k_proj.weight", kHfNone},
      {"attn.v", "attn_v.weight", "self_attn.v_proj.weight", kHfNone},
      {"attn.o", "attn_output.weight", "self_attn.o_proj.weight", kHfNone},
      {"attn.q_norm", "attn_q_norm.weight", "self_attn.q_norm.weight", norm_fix},
      {"attn.k_norm", "attn_k_norm.weight", "self_attn.k_norm.weight", norm_fix},
  };
  const std::vector<Part> deltanet = {
      {"gdn.qkv", "attn_qkv.weight", "linear_attn.in_proj_qkv.weight", kHfVHeadRowsAfterQK},
      {"gdn.gate", "attn_gate.weight", "linear_attn.in_proj_z.weight", kHfVHeadRows},
      {"gdn.beta", "ssm_beta.weight", "linear_attn.in_proj_b.weight", kHfVHeadRows},
      {"gdn.alpha", "ssm_alpha.weight", "linear_attn.in_proj_a.weight", kHfVHeadRows},
      {"gdn.conv", "ssm_conv1d.weight", "linear_attn.conv1d.weight", kHfSqueeze | kHfVHeadRowsAfterQK},
      {"gdn.dt_bias", "ssm_dt.bias", "linear_attn.dt_bias", kHfVHeadRows},
      {"gdn.ssm_a", "ssm_a", "linear_attn.A_log", kHfNegExp | kHfVHeadRows},
      {"gdn.norm", "ssm_norm.weight", "linear_attn.norm.weight", kHfNone},
      {"gdn.out", "ssm_out.weight", "linear_attn.out_proj.weight", kHfVHeadCols},
  };

  auto add_parts = [&](const std::vector<Part>& parts, const std::string& canon_prefix, const std::string& gguf_prefix,
                       const std::string& hf_prefix, int layer) {
    for (const Part& p : parts)
      add({canon_prefix + p.canonical, gguf_prefix + p.gguf, hf_prefix + p.hf, p.transform, layer});
  };

  for (int i = 0; i < n_layers; ++i) {
    std::string canon = fmt::format("layers.{}.", i);
    std::string gguf = fmt::format("blk.{}.", i);
    std::string hf = fmt::format("{}layers.{}.", hf_model, i);
    add_parts(common, canon, gguf, hf, i);
    add_parts(layout.recurrent[i] ? deltanet : attention, canon, gguf, hf, i);
  }

  // MTP (qwen35): GGUF appends the MTP layers after the trunk; the fc/norms belong to the first one.
  if (q35 && layout.n_mtp_layers > 0) {
    std::string first = fmt::format("blk.{}.", n_layers);
    add({"mtp.fc", first + "nextn.eh_proj.weight", "mtp.fc.weight", kHfNone, -1});
    add({"mtp.enorm", first + "nextn.enorm.weight", "mtp.pre_fc_norm_embedding.weight", norm_fix, -1});
    add({"mtp.hnorm", first + "nextn.hnorm.weight", "mtp.pre_fc_norm_hidden.weight", norm_fix, -1});
    add({"mtp.output_norm", first + "nextn.shared_head_norm.weight", "mtp.norm.weight", norm_fix, -1});
    for (int j = 0; j < layout.n_mtp_layers; ++j) {
      std::string canon = fmt::format("mtp.layers.{}.", j);
      std::string gguf = fmt::format("blk.{}.", n_layers + j);
      std::string hf = fmt::format("mtp.layers.{}.", j);
      add_parts(common, canon, gguf, hf, -1);
      add_parts(attention, canon, gguf, hf, -1);
    }
  }
}

void TensorNameMap::add(TensorNameEntry e) {
  size_t idx = entries_.size();
  canonical_.emplace(e.canonical, idx);
  if (!e.gguf.empty()) gguf_.emplace(e.gguf, idx);
  if (!e.hf.empty()) hf_.emplace(normalize_hf(e.hf), idx);
  entries_.push_back(std::move(e));
}

std::string TensorNameMap::normalize_hf(std::string_view name) const {
  if (layout_.family == NameFamily::kDFlashDraft) {
    if (starts_with(name, "model.")) name.remove_prefix(6);
    return std::string(name);
  }
  if (starts_with(name, "model.language_model.")) return "model." + std::string(name.substr(21));
  if (starts_with(name, "model.mtp.")) return std::string(name.substr(6));
  return std::string(name);
}

const TensorNameEntry* TensorNameMap::by_canonical(std::string_view name) const {
  auto it = canonical_.find(name);
  return it == canonical_.end() ? nullptr : &entries_[it->second];
}

const TensorNameEntry* TensorNameMap::by_gguf(std::string_view name) const {
  auto it = gguf_.find(name);
  return it == gguf_.end() ? nullptr : &entries_[it->second];
}

const TensorNameEntry* TensorNameMap::by_hf(std::string_view name) const {
  auto it = hf_.find(normalize_hf(name));
  return it == hf_.end() ? nullptr : &entries_[it->second];
}

bool hf_tensor_is_vision(std::string_view hf_name) {
  return starts_with(hf_name, "model.visual.") || starts_with(hf_name, "visual.") ||
         starts_with(hf_name, "model.vision_tower.") || starts_with(hf_name, "vision_tower.");
}

}  // namespace dflash

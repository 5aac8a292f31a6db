#include "model/tensor_shapes.h"

#include <charconv>
#include <string>

namespace dflash {
namespace {

// Splits "layers.<i>.<part>" / "mtp.layers.<j>.<part>"; returns the part and sets the layer index.
std::string_view layer_part(std::string_view name, std::string_view prefix, int64_t& index) {
  if (name.substr(0, prefix.size()) != prefix) return {};
  name.remove_prefix(prefix.size());
  size_t dot = name.find('.');
  if (dot == std::string_view::npos) return {};
  auto [p, ec] = std::from_chars(name.data(), name.data() + dot, index);
  if (ec != std::errc() || p != name.data() + dot) return {};
  return name.substr(dot + 1);
}

}  // namespace

Result<std::vector<int64_t>> canonical_tensor_shape(const ModelSpec& s, std::string_view name) {
  const int64_t H = s.hidden, V = s.vocab, F = s.ffn, hd = s.head_dim;
  const DeltaNetDims& g = s.gdn;
  const bool gated = s.attn_output_gate;
  auto attention_part = [&](std::string_view part, bool with_gate) -> std::vector<int64_t> {
    if (part == "attn.q") return {s.q_dim() * (with_gate ? 2 : 1), H};
    if (part == "attn.k" || part == "attn.v") return {s.kv_dim(), H};
    if (part == "attn.o") return {H, s.q_dim()};
    if (part == "attn.q_norm" || part == "attn.k_norm") return {hd};
    return {};
  };
  auto common_part = [&](std::string_view part) -> std::vector<int64_t> {
    if (part == "attn_norm" || part == "ffn_norm") return {H};
    if (part == "ffn.gate" || part == "ffn.up") return {F, H};
    if (part == "ffn.down") return {H, F};
    return {};
  };

  if (name == "token_embd" || name == "output") return std::vector<int64_t>{V, H};
  if (name == "output_norm" || name == "hidden_norm" || name == "mtp.enorm" || name == "mtp.hnorm" ||
      name == "mtp.output_norm")
    return std::vector<int64_t>{H};
  if (name == "fc") return std::vector<int64_t>{H, static_cast<int64_t>(s.target_layer_ids.size()) * H};
  if (name == "mtp.fc") return std::vector<int64_t>{H, 2 * H};

  int64_t i = -1;
  if (auto part = layer_part(name, "mtp.layers.", i); !part.empty()) {
    if (i < 0 || i >= s.n_mtp_layers) return not_found("{} has no MTP layer {}", model_family_name(s.family), i);
    if (auto c = common_part(part); !c.empty()) return c;
    if (auto a = attention_part(part, gated); !a.empty()) return a;
    return not_found("no tensor '{}' in an MTP layer", name);
  }
  if (auto part = layer_part(name, "layers.", i); !part.empty()) {
    if (i < 0 || i >= s.n_layers) return not_found("layer {} is out of range (the model has {})", i, s.n_layers);
    if (auto c = common_part(part); !c.empty()) return c;
    if (s.layer_kinds[static_cast<size_t>(i)] == LayerKind::kGatedDeltaNet) {
      if (part == "gdn.qkv") return std::vector<int64_t>{g.conv_dim(), H};
      if (part == "gdn.gate") return std::vector<int64_t>{g.value_dim(), H};
      if (part == "gdn.beta" || part == "gdn.alpha") return std::vector<int64_t>{g.n_v_heads, H};
      if (part == "gdn.conv") return std::vector<int64_t>{g.conv_dim(), g.conv_kernel};
      if (part == "gdn.dt_bias" || part == "gdn.ssm_a") return std::vector<int64_t>{g.n_v_heads};
      if (part == "gdn.norm") return std::vector<int64_t>{g.d_v};
      if (part == "gdn.out") return std::vector<int64_t>{H, g.value_dim()};
    } else {
      bool with_gate = s.layer_kinds[static_cast<size_t>(i)] == LayerKind::kGatedAttention && gated;
      if (auto a = attention_part(part, with_gate); !a.empty()) return a;
    }
    return not_found("no tensor '{}' in a {} layer", name, layer_kind_name(s.layer_kinds[static_cast<size_t>(i)]));
  }
  return not_found("no canonical tensor '{}'", name);
}

}  // namespace dflash

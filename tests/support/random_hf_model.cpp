#include "support/random_hf_model.h"

#include <filesystem>
#include <fstream>
#include <random>

#include "model/model_spec.h"
#include "model/tensor_shapes.h"
#include "tensor/half.h"

namespace dflash::test {

nlohmann::json tiny_qwen3_config(int64_t vocab, bool tied) {
  return {{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"vocab_size", vocab},
          {"hidden_size", 64}, {"intermediate_size", 128}, {"num_hidden_layers", 2},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16}, {"rms_norm_eps", 1e-6},
          {"max_position_embeddings", 4096}, {"rope_theta", 1000000.0}, {"tie_word_embeddings", tied},
          {"hidden_act", "silu"}, {"torch_dtype", "bfloat16"}};
}

nlohmann::json tiny_qwen35_config(int64_t vocab) {
  nlohmann::json layer_types = nlohmann::json::array();
  for (int i = 0; i < 8; ++i) layer_types.push_back((i + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  return {{"architectures", {"Qwen3_5ForCausalLM"}}, {"model_type", "qwen3_5_text"}, {"vocab_size", vocab},
          {"hidden_size", 64}, {"intermediate_size", 128}, {"num_hidden_layers", 8},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 32}, {"rms_norm_eps", 1e-6},
          {"max_position_embeddings", 4096}, {"tie_word_embeddings", false}, {"hidden_act", "silu"},
          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.25},
                               {"mrope_section", {2, 1, 1}}, {"mrope_interleaved", true}}},
          {"layer_types", layer_types}, {"linear_conv_kernel_dim", 4}, {"linear_key_head_dim", 16},
          {"linear_value_head_dim", 16}, {"linear_num_key_heads", 2}, {"linear_num_value_heads", 4},
          {"torch_dtype", "bfloat16"}};
}

Status write_random_hf_model(const std::string& dir, const nlohmann::json& config, uint64_t seed,
                             SafetensorsDType dtype) {
  DF_ASSIGN_OR_RETURN(ModelSpec spec, model_spec_from_hf_config(config));
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir + "/config.json");
    out << config.dump(2);
    if (!out) return io_error("cannot write {}/config.json", dir);
  }
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  TensorNameMap names(spec.name_layout());
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<SafetensorsTensorToWrite> tensors;
  for (const auto& e : names.entries()) {
    if (e.hf.empty()) continue;
    DF_ASSIGN_OR_RETURN(std::vector<int64_t> shape, canonical_tensor_shape(spec, e.canonical));
    std::vector<uint64_t> hf_shape(shape.begin(), shape.end());
    if (e.hf_to_gguf & kHfSqueeze) hf_shape.insert(hf_shape.begin() + 1, 1);  // conv1d [conv_dim, 1, K]
    uint64_t n = 1;
    for (uint64_t d : hf_shape) n *= d;
    const float fan_in = shape.size() == 2 ? static_cast<float>(shape[1]) : 1.0f;
    const bool is_norm = e.canonical.find("norm") != std::string::npos;
    std::vector<float> v(n);
    for (auto& x : v) {
      float r = normal(rng);
      if (e.hf_to_gguf & kHfNegExp) x = std::log(2.0f + std::abs(r));            // A_log
      else if (is_norm && (e.hf_to_gguf & kHfNormPlusOne)) x = 0.2f * r;         // zero-centred: applied as 1 + w
      else if (is_norm) x = 1.0f + 0.2f * r;
      else if (shape.size() == 2) x = r / std::sqrt(fan_in);
      else x = 0.5f * r;
    }
    std::vector<uint8_t> bytes;
    if (dtype == SafetensorsDType::kF32) {
      bytes.resize(n * 4);
      std::memcpy(bytes.data(), v.data(), bytes.size());
    } else {
      bytes.resize(n * 2);
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t h = dtype == SafetensorsDType::kBF16 ? fp32_to_bf16(v[i]) : fp32_to_fp16(v[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    }
    buffers.push_back(std::move(bytes));
    tensors.push_back({e.hf, dtype, hf_shape, buffers.back()});
  }
  return write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
}

}  // namespace dflash::test

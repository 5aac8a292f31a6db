#include "model/random_model.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "base/splitmix.h"
#include "base/thread_pool.h"
#include "model/tensor_shapes.h"
#include "tensor/quant.h"

namespace dflash {
namespace {

struct Preset {
  std::string_view name;
  const char* config;  // HF config.json of the published model (dimensions only)
};

// Dimensions from the models' published config.json files (algorithms.md D.1 for Qwen3.5).
constexpr Preset kPresets[] = {
    {"qwen3-0.6b", R"({"model_type":"qwen3","vocab_size":151936,"hidden_size":1024,"intermediate_size":3072,
      "num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,"rms_norm_eps":1e-6,
      "max_position_embeddings":40960,"rope_theta":1000000,"tie_word_embeddings":true})"},
    {"qwen3-8b", R"({"model_type":"qwen3","vocab_size":151936,"hidden_size":4096,"intermediate_size":12288,
      "num_hidden_layers":36,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"rms_norm_eps":1e-6,
      "max_position_embeddings":40960,"rope_theta":1000000,"tie_word_embeddings":false})"},
    {"qwen3.5-9b", R"({"model_type":"qwen3_5_text","vocab_size":248320,"hidden_size":4096,"intermediate_size":12288,
      "num_hidden_layers":32,"num_attention_heads":16,"num_key_value_heads":4,"head_dim":256,"rms_norm_eps":1e-6,
      "max_position_embeddings":262144,"tie_word_embeddings":false,"linear_conv_kernel_dim":4,
      "linear_key_head_dim":128,"linear_value_head_dim":128,"linear_num_key_heads":16,"linear_num_value_heads":32,
      "rope_parameters":{"rope_type":"default","rope_theta":10000000,"partial_rotary_factor":0.25,
      "mrope_section":[11,11,10],"mrope_interleaved":true}})"},
    {"qwen3.5-27b", R"({"model_type":"qwen3_5_text","vocab_size":248320,"hidden_size":5120,"intermediate_size":17408,
      "num_hidden_layers":64,"num_attention_heads":24,"num_key_value_heads":4,"head_dim":256,"rms_norm_eps":1e-6,
      "max_position_embeddings":262144,"tie_word_embeddings":false,"linear_conv_kernel_dim":4,
      "linear_key_head_dim":128,"linear_value_head_dim":128,"linear_num_key_heads":16,"linear_num_value_heads":48,
      "rope_parameters":{"rope_type":"default","rope_theta":10000000,"partial_rotary_factor":0.25,
      "mrope_section":[11,11,10],"mrope_interleaved":true}})"},
    // DFlash drafts of those targets, in the published layouts (algorithms.md A.1): z-lab's Qwen3-8B draft and
    // the Qwen3.5-27B draft lucebox loads.
    {"qwen3-8b-dflash", R"({"architectures":["DFlashDraftModel"],"model_type":"qwen3","vocab_size":151936,
      "hidden_size":4096,"intermediate_size":12288,"num_hidden_layers":5,"num_attention_heads":32,
      "num_key_value_heads":8,"head_dim":128,"rms_norm_eps":1e-6,"max_position_embeddings":40960,"rope_theta":1000000,
      "block_size":16,"num_target_layers":36,"tie_word_embeddings":false,
      "dflash_config":{"mask_token_id":151669,"target_layer_ids":[1,9,17,25,33]}})"},
    {"qwen3.5-27b-dflash", R"({"architectures":["DFlashDraftModel"],"model_type":"qwen3","vocab_size":248320,
      "hidden_size":5120,"intermediate_size":17408,"num_hidden_layers":5,"num_attention_heads":32,
      "num_key_value_heads":8,"head_dim":128,"rms_norm_eps":1e-6,"max_position_embeddings":262144,"rope_theta":10000000,
      "block_size":16,"num_target_layers":64,"tie_word_embeddings":false,
      "dflash_config":{"mask_token_id":248070,"target_layer_ids":[1,16,31,46,61]}})"},
};


}  // namespace

std::vector<std::string_view> random_model_presets() {
  std::vector<std::string_view> out;
  for (const auto& p : kPresets) out.push_back(p.name);
  return out;
}

Result<ModelSpec> random_model_spec(std::string_view preset) {
  for (const auto& p : kPresets)
    if (p.name == preset) return model_spec_from_hf_config(nlohmann::json::parse(p.config));
  std::string names;
  for (const auto& p : kPresets) names += (names.empty() ? "" : ", ") + std::string(p.name);
  return invalid_argument("unknown model shape '{}' (known: {})", preset, names);
}

Status add_random_model(const ModelSpec& spec, FileType file_type, uint64_t seed, int threads, GgufWriter& writer,
                        int64_t distinct_rows) {
  if (distinct_rows < 0) return invalid_argument("distinct rows {} is negative", distinct_rows);
  DF_RETURN_IF_ERROR(write_model_spec_to_gguf(spec, writer));
  writer.set("general.name", GgufValue::string("random " + std::string(model_family_name(spec.family))));

  // The tensor list in f32, then llama.cpp's type plan for the file type.
  TensorNameMap names(spec.name_layout());
  std::vector<GgufTensorInfo> infos;
  std::vector<std::string> canonical;
  for (const TensorNameEntry& e : names.entries()) {
    if (e.gguf.empty()) continue;
    DF_ASSIGN_OR_RETURN(std::vector<int64_t> shape, canonical_tensor_shape(spec, e.canonical));
    GgufTensorInfo t;
    t.name = e.gguf;
    t.type = DType::kF32;
    t.shape.assign(shape.rbegin(), shape.rend());
    t.nbytes = t.n_elements() * 4;
    infos.push_back(std::move(t));
    canonical.push_back(e.canonical);
  }
  QuantModelFacts facts;
  facts.arch = gguf_arch_name(spec.family);
  facts.n_layer = static_cast<uint32_t>(spec.n_layers + spec.n_mtp_layers);
  facts.n_head = static_cast<uint32_t>(spec.n_heads);
  facts.n_head_kv = static_cast<uint32_t>(spec.n_kv_heads);
  QuantOptions qopt;
  qopt.file_type = file_type;
  DF_ASSIGN_OR_RETURN(QuantPlan plan, plan_quantization(infos, facts, qopt));
  writer.set("general.file_type", GgufValue::u32(static_cast<uint32_t>(file_type)));
  if (file_type != FileType::kAllF32 && file_type != FileType::kF16 && file_type != FileType::kBF16)
    writer.set("general.quantization_version", GgufValue::u32(2));

  const auto pool = std::make_shared<ThreadPool>(threads);  // the tensors are written after this returns
  for (const TensorQuant& tq : plan.tensors) {
    const std::string canon = canonical[tq.source];
    const int64_t cols = static_cast<int64_t>(tq.shape[0]);
    int64_t rows = 1;
    for (size_t d = 1; d < tq.shape.size(); ++d) rows *= static_cast<int64_t>(tq.shape[d]);
    const DType to = tq.to;
    const int64_t made = distinct_rows > 0 ? std::min(rows, distinct_rows) : rows;  // rows generated
    DF_RETURN_IF_ERROR(writer.add_tensor(tq.name, to, tq.shape, [=](std::FILE* f) -> Status {
      const bool norm = canon.find("norm") != std::string::npos;
      const bool ssm_a = canon.ends_with("ssm_a");
      const float scale = rows > 1 ? 1.0f / std::sqrt(static_cast<float>(cols)) : 0.5f;
      const int64_t batch = std::max<int64_t>(1, (int64_t{16} << 20) / std::max<int64_t>(1, cols * 4));
      auto out_row = row_bytes(to, static_cast<uint64_t>(cols));
      if (!out_row.ok()) return out_row.status();
      std::vector<float> src(static_cast<size_t>(std::min(batch, made) * cols));
      std::vector<uint8_t> dst(static_cast<size_t>(std::min(batch, made)) * *out_row);
      const uint64_t base = seed_for_name(canon, seed);
      std::vector<uint8_t> made_rows;  // made < rows: the generated rows, repeated after them
      for (int64_t r0 = 0; r0 < made; r0 += batch) {
        const int64_t n = std::min(batch, made - r0);
        // Each row from a generator of its own (rows in parallel: the values do not depend on the threads).
        pool->parallel_for(n, 1, [&](int64_t a, int64_t b) {
          for (int64_t r = a; r < b; ++r) {
            SplitMix64 rng{base ^ (static_cast<uint64_t>(r0 + r) * 0xd1b54a32d192ed03ull)};
            float* row = src.data() + r * cols;
            for (int64_t i = 0; i < cols; ++i) {
              const float x = rng.normal();
              row[i] = norm ? 1.0f + 0.1f * x : ssm_a ? -std::exp(0.5f * x) : scale * x;
            }
          }
        });
        DF_RETURN_IF_ERROR(convert_rows(DType::kF32, src.data(), to, dst.data(), n, cols, threads));
        DF_RETURN_IF_ERROR(write_all(f, dst.data(), static_cast<size_t>(n) * *out_row));
        if (made < rows) made_rows.insert(made_rows.end(), dst.begin(), dst.begin() + n * *out_row);
      }
      // The rest: row r is generated row r % made, written in runs of whole copies.
      for (int64_t r = made; r < rows;) {
        const int64_t k = r % made, n = std::min(made - k, rows - r);
        DF_RETURN_IF_ERROR(write_all(f, made_rows.data() + k * *out_row, static_cast<size_t>(n) * *out_row));
        r += n;
      }
      return Status();
    }));
  }
  return Status();
}

}  // namespace dflash

// HF `config.json`: a checked, typed view of the fields dflash uses, for Qwen3, Qwen3.5 (flat or nested
// under `text_config`) and DFlash drafts. Unsupported families are recognised and rejected by name.
//
// This is the file's content with HF's defaults and legacy spellings resolved (rope_theta vs
// rope_parameters, layer_types vs full_attention_interval, ...); model/model_spec.h turns it into a
// ModelSpec. Every field read from the file is type- and range-checked; a bad file gives an error
// naming the field, never an exception.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace dflash {

enum class HfModelKind {
  kQwen3,        // model_type "qwen3" (Qwen3ForCausalLM)
  kQwen35,       // "qwen3_5_text", or "qwen3_5" with or without a nested text_config
  kDFlashDraft,  // architectures ["DFlashDraftModel"] (a qwen3-style config plus dflash fields)
};
const char* hf_model_kind_name(HfModelKind k);

struct HfRopeScaling {
  std::string type;  // "" (none), "linear" or "yarn"; other HF types are rejected at parse time
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // yarn: the context the model was trained at
  std::optional<double> attention_factor;        // yarn mscale override
  std::optional<double> beta_fast;
  std::optional<double> beta_slow;
};

struct HfConfig {
  HfModelKind kind = HfModelKind::kQwen3;
  std::string model_type;                  // of the text model ("qwen3", "qwen3_5_text", ...)
  std::string outer_model_type;            // the wrapper's ("qwen3_5") when text_config is nested, else ""
  std::vector<std::string> architectures;  // top level
  bool nested_text_config = false;         // Qwen3_5ForConditionalGeneration: weights under model.language_model.*

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // explicit, or hidden_size / num_attention_heads
  bool head_dim_explicit = false;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  std::string hidden_act = "silu";
  std::string dtype;  // "bfloat16", ... (torch_dtype or dtype); informational

  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;  // qwen35: 0.25 (rotate the first head_dim/4 dims)
  std::vector<int64_t> mrope_section;  // qwen35: [11, 11, 10]; empty when absent
  bool mrope_interleaved = false;
  HfRopeScaling rope_scaling;

  // One entry per layer: "full_attention", "linear_attention" (qwen35 GDN) or "sliding_attention".
  std::vector<std::string> layer_types;
  // Window of "sliding_attention" layers; nullopt when sliding is off (HF: use_sliding_window false
  // nulls sliding_window, so sliding layer_types then attend to everything).
  std::optional<int64_t> sliding_window;

  // Gated DeltaNet (qwen35)
  int64_t linear_conv_kernel_dim = 0;
  int64_t linear_key_head_dim = 0;
  int64_t linear_value_head_dim = 0;
  int64_t linear_num_key_heads = 0;
  int64_t linear_num_value_heads = 0;
  bool attn_output_gate = false;  // qwen35 default true
  int64_t mtp_num_hidden_layers = 0;

  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // text config's first, then the wrapper's (deduplicated)

  // DFlash draft (A.1)
  std::vector<int64_t> target_layer_ids;  // dflash_config.target_layer_ids, or z-lab's default rule
  int64_t block_size = 0;                 // dflash_config.block_size or top-level block_size (default 16)
  std::optional<int64_t> mask_token_id;   // dflash_config.mask_token_id (null in training configs)
  std::optional<int64_t> num_target_layers;
};

// z-lab's default capture layers for a draft with `n_draft_layers` layers over an `n_target_layers`
// target: [N/2] for one, else round(1 + i (N-4) / (n-1)) for i = 0..n-1.
std::vector<int64_t> default_target_layer_ids(int64_t n_target_layers, int64_t n_draft_layers);

Result<HfConfig> parse_hf_config(const nlohmann::json& j);
// `what` names the source in messages.
Result<HfConfig> parse_hf_config_text(std::string_view text, std::string_view what = "config.json");
// `path` is a config.json file or a directory holding one.
Result<HfConfig> load_hf_config(const std::string& path);

}  // namespace dflash

// HF config.json parsing: real-shaped fixtures for each family, legacy spellings, and hostile input.
#include "formats/hf_config.h"

#include <gtest/gtest.h>

#include "base/file_io.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

using json = nlohmann::json;

HfConfig load_fixture(const std::string& name) {
  auto c = load_hf_config(test::fixture_path("configs/" + name));
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? c.value() : HfConfig{};
}

json fixture_json(const std::string& name) {
  return json::parse(read_text_file(test::fixture_path("configs/" + name)).value());
}

void expect_error(const json& j, ErrorCode code, const std::string& needle) {
  auto c = parse_hf_config(j);
  ASSERT_FALSE(c.ok()) << "expected an error containing '" << needle << "' for " << j.dump().substr(0, 200);
  EXPECT_EQ(c.status().code(), code) << c.status().to_string();
  EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().to_string();
}

TEST(HfConfig, qwen3_8b) {
  HfConfig c = load_fixture("qwen3_8b.json");
  EXPECT_EQ(c.kind, HfModelKind::kQwen3);
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_FALSE(c.nested_text_config);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 12288);
  EXPECT_EQ(c.num_hidden_layers, 36);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_TRUE(c.head_dim_explicit);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 1.0);
  EXPECT_TRUE(c.rope_scaling.type.empty());
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.layer_types, std::vector<std::string>(36, "full_attention"));
  EXPECT_FALSE(c.sliding_window);
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151645});
  EXPECT_EQ(c.dtype, "bfloat16");
}

void expect_qwen35_27b(const HfConfig& c) {
  EXPECT_EQ(c.kind, HfModelKind::kQwen35);
  EXPECT_EQ(c.model_type, "qwen3_5_text");
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.intermediate_size, 17408);
  EXPECT_EQ(c.num_hidden_layers, 64);
  EXPECT_EQ(c.num_attention_heads, 24);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.mrope_section, (std::vector<int64_t>{11, 11, 10}));
  EXPECT_TRUE(c.mrope_interleaved);
  EXPECT_EQ(c.max_position_embeddings, 262144);
  ASSERT_EQ(c.layer_types.size(), 64u);
  EXPECT_EQ(c.layer_types[0], "linear_attention");
  EXPECT_EQ(c.layer_types[3], "full_attention");
  EXPECT_EQ(c.layer_types[63], "full_attention");
  EXPECT_EQ(std::count(c.layer_types.begin(), c.layer_types.end(), "linear_attention"), 48);
  EXPECT_EQ(c.linear_conv_kernel_dim, 4);
  EXPECT_EQ(c.linear_key_head_dim, 128);
  EXPECT_EQ(c.linear_value_head_dim, 128);
  EXPECT_EQ(c.linear_num_key_heads, 16);
  EXPECT_EQ(c.linear_num_value_heads, 48);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_EQ(c.mtp_num_hidden_layers, 1);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{248044});
}

TEST(HfConfig, qwen35_27b_nested_under_text_config) {
  HfConfig c = load_fixture("qwen3_5_27b.json");
  expect_qwen35_27b(c);
  EXPECT_TRUE(c.nested_text_config);
  EXPECT_EQ(c.outer_model_type, "qwen3_5");
  EXPECT_EQ(c.architectures, std::vector<std::string>{"Qwen3_5ForConditionalGeneration"});
}

TEST(HfConfig, qwen35_27b_flat_text_config) {
  HfConfig c = load_fixture("qwen3_5_27b_text.json");
  expect_qwen35_27b(c);
  EXPECT_FALSE(c.nested_text_config);
  EXPECT_TRUE(c.outer_model_type.empty());
}

TEST(HfConfig, qwen35_legacy_interval_and_defaults) {
  json j = fixture_json("qwen3_5_27b_text.json");
  j.erase("layer_types");
  j["full_attention_interval"] = 2;
  j.erase("rope_parameters");
  j["rope_theta"] = 5e6;
  auto c = parse_hf_config(j);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->layer_types[0], "linear_attention");
  EXPECT_EQ(c->layer_types[1], "full_attention");
  EXPECT_EQ(std::count(c->layer_types.begin(), c->layer_types.end(), "full_attention"), 32);
  EXPECT_DOUBLE_EQ(c->rope_theta, 5e6);
  EXPECT_DOUBLE_EQ(c->partial_rotary_factor, 0.25);  // Qwen3.5 default
  EXPECT_EQ(c->mrope_section, (std::vector<int64_t>{11, 11, 10}));
}

TEST(HfConfig, nested_config_falls_back_to_the_wrapper_and_merges_eos) {
  json j = fixture_json("qwen3_5_27b.json");
  j["text_config"].erase("tie_word_embeddings");
  j["tie_word_embeddings"] = true;
  j["eos_token_id"] = json::array({248046, 248044});
  auto c = parse_hf_config(j);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{248044, 248046}));
}

TEST(HfConfig, dflash_draft_for_qwen3_8b) {
  HfConfig c = load_fixture("qwen3_8b_dflash.json");
  EXPECT_EQ(c.kind, HfModelKind::kDFlashDraft);
  EXPECT_EQ(c.num_hidden_layers, 5);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.target_layer_ids, (std::vector<int64_t>{1, 9, 17, 25, 33}));
  EXPECT_EQ(c.block_size, 16);
  EXPECT_EQ(c.mask_token_id, 151669);
  EXPECT_EQ(c.num_target_layers, 36);
  EXPECT_EQ(c.layer_types, std::vector<std::string>(5, "full_attention"));
  EXPECT_FALSE(c.sliding_window);
}

TEST(HfConfig, dflash_draft_with_sliding_layers) {
  HfConfig c = load_fixture("qwen3_6_27b_dflash_swa.json");
  EXPECT_EQ(c.kind, HfModelKind::kDFlashDraft);
  EXPECT_EQ(c.block_size, 16);
  EXPECT_EQ(c.mask_token_id, 248070);
  EXPECT_EQ(c.target_layer_ids, (std::vector<int64_t>{1, 16, 31, 46, 61}));
  EXPECT_EQ(c.sliding_window, 2048);
  EXPECT_EQ(c.layer_types[0], "sliding_attention");
  EXPECT_EQ(c.layer_types[4], "full_attention");

  // HF nulls sliding_window when use_sliding_window is false: sliding layers then see everything.
  json j = fixture_json("qwen3_6_27b_dflash_swa.json");
  j["use_sliding_window"] = false;
  EXPECT_FALSE(parse_hf_config(j)->sliding_window);
  j["use_sliding_window"] = true;
  j.erase("sliding_window");
  expect_error(j, ErrorCode::kCorrupt, "\"sliding_window\" is not set");
}

TEST(HfConfig, dflash_defaults_and_training_configs) {
  json j = fixture_json("qwen3_8b_dflash.json");
  j.erase("dflash_config");
  j.erase("block_size");
  auto c = parse_hf_config(j);  // architectures still say DFlashDraftModel
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->target_layer_ids, (std::vector<int64_t>{1, 9, 17, 25, 33}));  // z-lab default rule
  EXPECT_EQ(c->block_size, 16);
  EXPECT_FALSE(c->mask_token_id);

  j["dflash_config"] = {{"mask_token_id", nullptr}, {"target_layer_ids", {3, 15, 31, 47, 59}}};
  c = parse_hf_config(j);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->mask_token_id);
  EXPECT_EQ(c->target_layer_ids.front(), 3);

  j.erase("dflash_config");
  j.erase("num_target_layers");
  expect_error(j, ErrorCode::kCorrupt, "target_layer_ids");
  j["dflash_config"] = {{"target_layer_ids", json::array()}};
  expect_error(j, ErrorCode::kCorrupt, "empty");
  j["dflash_config"] = {{"target_layer_ids", {1, "x"}}};
  expect_error(j, ErrorCode::kCorrupt, "target_layer_ids[1]");
  j["dflash_config"] = {{"target_layer_ids", {1}}, {"block_size", 1}};
  expect_error(j, ErrorCode::kCorrupt, "block_size");
}

TEST(HfConfig, default_target_layer_ids_follow_the_z_lab_rule) {
  EXPECT_EQ(default_target_layer_ids(36, 5), (std::vector<int64_t>{1, 9, 17, 25, 33}));
  EXPECT_EQ(default_target_layer_ids(64, 5), (std::vector<int64_t>{1, 16, 31, 46, 61}));
  EXPECT_EQ(default_target_layer_ids(32, 5), (std::vector<int64_t>{1, 8, 15, 22, 29}));
  EXPECT_EQ(default_target_layer_ids(40, 1), (std::vector<int64_t>{20}));
}

TEST(HfConfig, rope_scaling_legacy_and_rope_parameters_spellings) {
  json j = fixture_json("qwen3_8b.json");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  auto c = parse_hf_config(j);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->rope_scaling.type, "yarn");
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 32768);

  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2}};
  EXPECT_EQ(parse_hf_config(j)->rope_scaling.type, "linear");

  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e7}, {"factor", 8.0}, {"beta_fast", 32}};
  c = parse_hf_config(j);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e7);
  EXPECT_EQ(c->rope_scaling.type, "yarn");
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 40960);  // falls back to max_position_embeddings
  EXPECT_EQ(c->rope_scaling.beta_fast, 32.0);

  j["rope_parameters"] = {{"rope_type", "longrope"}, {"factor", 8.0}};
  expect_error(j, ErrorCode::kUnsupported, "'longrope' is not supported");
  j["rope_parameters"] = {{"rope_type", "yarn"}};
  expect_error(j, ErrorCode::kCorrupt, "no \"factor\"");
  j["rope_parameters"] = "default";
  expect_error(j, ErrorCode::kCorrupt, "must be an object");
  j["rope_parameters"] = {{"rope_theta", -1}};
  expect_error(j, ErrorCode::kCorrupt, "rope_theta");
}

TEST(HfConfig, unsupported_families_are_named) {
  json j = fixture_json("qwen3_8b.json");
  j["model_type"] = "qwen3_5_moe";
  expect_error(j, ErrorCode::kUnsupported, "Qwen3.5/3.6 MoE");
  j["model_type"] = "qwen3_next";
  expect_error(j, ErrorCode::kUnsupported, "Qwen3-Next");
  j["model_type"] = "llama";
  expect_error(j, ErrorCode::kUnsupported, "model_type 'llama' is not supported");
  j.erase("model_type");
  expect_error(j, ErrorCode::kCorrupt, "no \"model_type\"");

  json vl = fixture_json("qwen3_5_27b.json");
  vl["text_config"]["model_type"] = "qwen3_5_moe_text";
  expect_error(vl, ErrorCode::kUnsupported, "MoE");
  vl["text_config"]["model_type"] = "qwen3_5_text";
  vl["text_config"]["num_experts"] = 256;
  expect_error(vl, ErrorCode::kUnsupported, "num_experts");

  json d = fixture_json("qwen3_8b_dflash.json");
  d["architectures"] = {"DFlash2DraftModel"};
  expect_error(d, ErrorCode::kUnsupported, "DFlash2DraftModel");
  d["architectures"] = {"DFlashDraftModel"};
  d["model_type"] = "llama";
  expect_error(d, ErrorCode::kUnsupported, "qwen3-style");
}

TEST(HfConfig, fields_are_type_and_range_checked) {
  json base = fixture_json("qwen3_8b.json");
  auto with = [&](const char* key, json v) {
    json j = base;
    j[key] = std::move(v);
    return j;
  };
  expect_error(json::array(), ErrorCode::kCorrupt, "not an object");
  json missing = base;
  missing.erase("hidden_size");
  expect_error(missing, ErrorCode::kCorrupt, "required field \"hidden_size\" is missing");
  expect_error(with("hidden_size", "4096"), ErrorCode::kCorrupt, "\"hidden_size\" must be an integer");
  expect_error(with("hidden_size", -1), ErrorCode::kCorrupt, "out of range");
  expect_error(with("hidden_size", 0), ErrorCode::kCorrupt, "out of range");
  expect_error(with("hidden_size", 4096.5), ErrorCode::kCorrupt, "not an integer");
  expect_error(with("hidden_size", 1e300), ErrorCode::kCorrupt, "not an integer");
  expect_error(with("vocab_size", json(18446744073709551615ull)), ErrorCode::kCorrupt, "out of range");
  expect_error(with("num_hidden_layers", 100000), ErrorCode::kCorrupt, "out of range");
  expect_error(with("rms_norm_eps", 0), ErrorCode::kCorrupt, "rms_norm_eps");
  expect_error(with("rms_norm_eps", "1e-6"), ErrorCode::kCorrupt, "must be a number");
  expect_error(with("tie_word_embeddings", 1), ErrorCode::kCorrupt, "true or false");
  expect_error(with("eos_token_id", "x"), ErrorCode::kCorrupt, "eos_token_id");
  expect_error(with("eos_token_id", {1, -2}), ErrorCode::kCorrupt, "eos_token_id[1]");
  expect_error(with("layer_types", {"full_attention"}), ErrorCode::kCorrupt, "has 1 entries but num_hidden_layers is 36");
  expect_error(with("layer_types", std::vector<std::string>(36, "linear_attention")), ErrorCode::kCorrupt,
               "not a layer type of a qwen3 model");
  expect_error(with("layer_types", "full_attention"), ErrorCode::kCorrupt, "list of strings");
  expect_error(with("architectures", {1}), ErrorCode::kCorrupt, "architectures");
  expect_error(with("partial_rotary_factor", 1.5), ErrorCode::kCorrupt, "partial_rotary_factor");

  // Integral floats are accepted.
  auto c = parse_hf_config(with("hidden_size", 4096.0));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->hidden_size, 4096);

  // Without head_dim, heads must divide the hidden size.
  json no_hd = with("hidden_size", 4095);
  no_hd.erase("head_dim");
  expect_error(no_hd, ErrorCode::kCorrupt, "hidden size 4095 is not divisible by 32 heads");

  json vl = fixture_json("qwen3_5_27b.json");
  vl["text_config"] = "nope";
  expect_error(vl, ErrorCode::kCorrupt, "\"text_config\" must be an object");
  vl = fixture_json("qwen3_5_27b.json");
  vl["text_config"]["layer_types"][5] = "sliding_attention";
  expect_error(vl, ErrorCode::kCorrupt, "layer_types[5]");
  vl = fixture_json("qwen3_5_27b.json");
  vl["text_config"]["linear_num_value_heads"] = 0;
  expect_error(vl, ErrorCode::kCorrupt, "linear_num_value_heads");
}

TEST(HfConfig, text_parsing_rejects_bad_json_and_every_truncation_cleanly) {
  auto bad = parse_hf_config_text("{\"model_type\": ");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("invalid JSON"), std::string::npos);
  std::string deep = std::string(5000, '[') + std::string(5000, ']');
  EXPECT_NE(parse_hf_config_text(deep).status().message().find("nests deeper"), std::string::npos);

  std::string text = read_text_file(test::fixture_path("configs/qwen3_5_27b.json")).value();
  for (size_t n = 0; n + 1 < text.size(); n += 7) EXPECT_FALSE(parse_hf_config_text(text.substr(0, n)).ok()) << n;
  EXPECT_TRUE(parse_hf_config_text(text).ok());
}

TEST(HfConfig, load_accepts_a_directory) {
  std::string dir = test::scratch_dir();
  std::string text = read_text_file(test::fixture_path("configs/qwen3_8b.json")).value();
  ASSERT_TRUE(write_file_atomic(dir + "/config.json",
                                std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()))
                  .ok());
  auto c = load_hf_config(dir);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->hidden_size, 4096);
  auto missing = load_hf_config(dir + "/nope");
  EXPECT_EQ(missing.status().code(), ErrorCode::kIo);
}

}  // namespace
}  // namespace dflash

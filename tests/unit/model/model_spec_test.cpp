// ModelSpec from HF configs and GGUF metadata, validation messages, GGUF round trips, and the tensor-name map.
#include "model/model_spec.h"

#include <gtest/gtest.h>

#include <set>

#include "base/file_io.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

using json = nlohmann::json;

json fixture_json(const std::string& name) {
  return json::parse(read_text_file(test::fixture_path("configs/" + name)).value());
}

ModelSpec spec_of(const std::string& fixture) {
  auto s = model_spec_from_hf_path(test::fixture_path("configs/" + fixture));
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? s.value() : ModelSpec{};
}

void expect_invalid(const ModelSpec& s, const std::string& needle) {
  Status st = s.validate();
  ASSERT_FALSE(st.ok()) << "expected '" << needle << "'";
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
}

TEST(ModelSpec, qwen3_8b_from_hf) {
  ModelSpec s = spec_of("qwen3_8b.json");
  EXPECT_EQ(s.family, ModelFamily::kQwen3);
  EXPECT_EQ(s.n_layers, 36);
  EXPECT_EQ(s.hidden, 4096);
  EXPECT_EQ(s.ffn, 12288);
  EXPECT_EQ(s.vocab, 151936);
  EXPECT_EQ(s.n_heads, 32);
  EXPECT_EQ(s.n_kv_heads, 8);
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.rope_dims, 128);
  EXPECT_EQ(s.rope_sections, (std::array<int64_t, 4>{0, 0, 0, 0}));
  EXPECT_DOUBLE_EQ(s.rope_theta, 1e6);
  EXPECT_EQ(s.max_context, 40960);
  EXPECT_FALSE(s.tied_embeddings);
  EXPECT_EQ(s.layer_kinds, std::vector<LayerKind>(36, LayerKind::kAttention));
  EXPECT_EQ(s.sliding_window, std::vector<int64_t>(36, 0));
  EXPECT_FALSE(s.attn_output_gate);
  EXPECT_FALSE(s.norms_zero_centred);
  EXPECT_EQ(s.n_mtp_layers, 0);
  EXPECT_EQ(s.bos_id, 151643);
  EXPECT_EQ(s.eos_ids, std::vector<int64_t>{151645});
  EXPECT_EQ(s.q_dim(), 4096);
  EXPECT_EQ(s.kv_dim(), 1024);
  EXPECT_TRUE(s.validate().ok());
}

TEST(ModelSpec, qwen35_27b_from_hf) {
  ModelSpec s = spec_of("qwen3_5_27b.json");
  EXPECT_EQ(s.family, ModelFamily::kQwen35);
  EXPECT_EQ(s.n_layers, 64);
  EXPECT_EQ(s.n_recurrent_layers(), 48);
  EXPECT_EQ(s.n_attention_layers(), 16);
  EXPECT_EQ(s.layer_kinds[0], LayerKind::kGatedDeltaNet);
  EXPECT_EQ(s.layer_kinds[3], LayerKind::kGatedAttention);
  EXPECT_TRUE(s.is_recurrent(62));
  EXPECT_FALSE(s.is_recurrent(63));
  EXPECT_EQ(s.hidden, 5120);
  EXPECT_EQ(s.ffn, 17408);
  EXPECT_EQ(s.vocab, 248320);
  EXPECT_EQ(s.n_heads, 24);
  EXPECT_EQ(s.n_kv_heads, 4);
  EXPECT_EQ(s.head_dim, 256);
  EXPECT_EQ(s.rope_dims, 64);
  EXPECT_EQ(s.rope_sections, (std::array<int64_t, 4>{11, 11, 10, 0}));
  EXPECT_DOUBLE_EQ(s.rope_theta, 1e7);
  EXPECT_EQ(s.gdn, (DeltaNetDims{16, 48, 128, 128, 4}));
  EXPECT_EQ(s.gdn.conv_dim(), 10240);
  EXPECT_EQ(s.gdn.value_dim(), 6144);
  EXPECT_TRUE(s.attn_output_gate);
  EXPECT_TRUE(s.q_gate_packed_per_head);
  EXPECT_TRUE(s.norms_zero_centred);
  EXPECT_EQ(s.v_head_order, VHeadOrder::kGrouped);
  EXPECT_TRUE(s.ssm_a_is_log);
  EXPECT_TRUE(s.hf_vl_wrapper);
  EXPECT_EQ(s.n_mtp_layers, 1);
  EXPECT_FALSE(s.tied_embeddings);
  EXPECT_EQ(s.max_context, 262144);
  EXPECT_NE(s.summary().find("48 gdn + 16 attn"), std::string::npos) << s.summary();

  // The flat text config describes the same model; only the weight prefix differs.
  ModelSpec flat = spec_of("qwen3_5_27b_text.json");
  EXPECT_FALSE(flat.hf_vl_wrapper);
  flat.hf_vl_wrapper = true;
  EXPECT_EQ(flat, s);
}

TEST(ModelSpec, dflash_drafts_from_hf) {
  ModelSpec d = spec_of("qwen3_8b_dflash.json");
  EXPECT_EQ(d.family, ModelFamily::kDFlashDraft);
  EXPECT_EQ(d.n_layers, 5);
  EXPECT_EQ(d.layer_kinds, std::vector<LayerKind>(5, LayerKind::kDraftAttention));
  EXPECT_EQ(d.sliding_window, std::vector<int64_t>(5, 0));
  EXPECT_EQ(d.target_layer_ids, (std::vector<int64_t>{1, 9, 17, 25, 33}));
  EXPECT_EQ(d.block_size, 16);
  EXPECT_EQ(d.mask_token_id, 151669);
  EXPECT_EQ(d.n_target_layers, 36);
  EXPECT_EQ(d.rope_dims, 128);
  EXPECT_FALSE(d.tied_embeddings);
  EXPECT_FALSE(d.norms_zero_centred);  // draft norms are the standard kind

  ModelSpec swa = spec_of("qwen3_6_27b_dflash_swa.json");
  EXPECT_EQ(swa.sliding_window, (std::vector<int64_t>{2048, 2048, 2048, 2048, 0}));
  EXPECT_EQ(swa.hidden, 5120);
  EXPECT_EQ(swa.mask_token_id, 248070);
}

TEST(ModelSpec, hf_conversion_reports_impossible_configs) {
  json j = fixture_json("qwen3_8b.json");
  j["num_key_value_heads"] = 5;
  auto s = model_spec_from_hf_config(j);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("32 attention heads are not a multiple of 5 KV heads"), std::string::npos)
      << s.status().to_string();

  j = fixture_json("qwen3_8b.json");
  j["attention_bias"] = true;
  EXPECT_EQ(model_spec_from_hf_config(j).status().code(), ErrorCode::kUnsupported);
  j = fixture_json("qwen3_8b.json");
  j["hidden_act"] = "gelu";
  EXPECT_EQ(model_spec_from_hf_config(j).status().code(), ErrorCode::kUnsupported);

  json q = fixture_json("qwen3_5_27b_text.json");
  q["rope_parameters"]["partial_rotary_factor"] = 0.3;
  EXPECT_NE(model_spec_from_hf_config(q).status().message().find("whole number"), std::string::npos);
  q = fixture_json("qwen3_5_27b_text.json");
  q["rope_parameters"]["mrope_section"] = {11, 11, 11};
  EXPECT_NE(model_spec_from_hf_config(q).status().message().find("rope sections"), std::string::npos);
  q = fixture_json("qwen3_5_27b_text.json");
  q["linear_num_value_heads"] = 40;
  EXPECT_NE(model_spec_from_hf_config(q).status().message().find("40 DeltaNet value heads are not a multiple of 16"),
            std::string::npos);

  json d = fixture_json("qwen3_8b_dflash.json");
  d["dflash_config"]["mask_token_id"] = 999999;
  EXPECT_NE(model_spec_from_hf_config(d).status().message().find("mask token id 999999"), std::string::npos);
  d = fixture_json("qwen3_8b_dflash.json");
  d["dflash_config"]["target_layer_ids"] = {1, 9, 9};
  EXPECT_NE(model_spec_from_hf_config(d).status().message().find("strictly increasing"), std::string::npos);
  d["dflash_config"]["target_layer_ids"] = {1, 40};
  EXPECT_NE(model_spec_from_hf_config(d).status().message().find("past the target's 36 layers"), std::string::npos);
}

TEST(ModelSpec, validate_names_each_broken_invariant) {
  ModelSpec good = spec_of("qwen3_5_27b.json");
  ASSERT_TRUE(good.validate().ok());
  ModelSpec s = good;
  s.n_layers = 0;
  expect_invalid(s, "layer count 0");
  s = good;
  s.layer_kinds.pop_back();
  expect_invalid(s, "63 layer kinds given for 64 layers");
  s = good;
  s.layer_kinds[3] = LayerKind::kAttention;
  expect_invalid(s, "layer 3 is attention");
  s = good;
  s.layer_kinds[5] = LayerKind::kDraftAttention;
  expect_invalid(s, "layer 5 is draft attention");
  s = good;
  s.sliding_window[0] = 128;
  expect_invalid(s, "layer 0 is gated deltanet but has a sliding window");
  s = good;
  s.rope_dims = 63;
  expect_invalid(s, "rotary dims 63");
  s = good;
  s.rope_dims = 512;
  expect_invalid(s, "rotary dims 512");
  s = good;
  s.rms_eps = 0;
  expect_invalid(s, "epsilon");
  s = good;
  s.gdn.conv_kernel = 0;
  expect_invalid(s, "DeltaNet conv kernel 0");
  s = good;
  s.eos_ids = {300000};
  expect_invalid(s, "EOS token id 300000");
  s = good;
  s.rope_scaling.type = RopeScalingType::kYarn;
  s.rope_scaling.factor = 4;
  expect_invalid(s, "original context");
  s = good;
  s.block_size = 16;
  expect_invalid(s, "draft fields are set on a qwen35 model");

  ModelSpec q3 = spec_of("qwen3_8b.json");
  q3.n_mtp_layers = 1;
  expect_invalid(q3, "qwen3 models have no MTP layers");
  q3 = spec_of("qwen3_8b.json");
  q3.attn_output_gate = true;
  expect_invalid(q3, "only supported in qwen35");
}

// ---- GGUF

// Writes `spec` (plus an `output.weight` stand-in when the head is untied) and reads it back.
Result<ModelSpec> gguf_round_trip(const ModelSpec& spec, GgufWriter* out = nullptr) {
  GgufWriter w;
  DF_RETURN_IF_ERROR(write_model_spec_to_gguf(spec, w));
  float one = 1.0f;
  std::span<const uint8_t> data(reinterpret_cast<const uint8_t*>(&one), 4);
  if (spec.family != ModelFamily::kDFlashDraft && !spec.tied_embeddings)
    DF_RETURN_IF_ERROR(w.add_tensor("output.weight", DType::kF32, {1}, data));
  std::string path = test::scratch_dir() + "/spec.gguf";
  DF_RETURN_IF_ERROR(w.write(path));
  if (out != nullptr) *out = w;
  DF_ASSIGN_OR_RETURN(GgufFile g, GgufFile::open(path));
  return model_spec_from_gguf(g);
}

// What a GGUF keeps of an HF-derived spec: weights in canonical form, no token ids (tokenizer keys).
ModelSpec as_gguf_sees_it(ModelSpec s) {
  s.norms_zero_centred = false;
  s.v_head_order = VHeadOrder::kTiled;
  s.ssm_a_is_log = false;
  s.hf_vl_wrapper = false;
  s.bos_id.reset();
  s.eos_ids.clear();
  s.n_target_layers.reset();
  return s;
}

TEST(ModelSpecGguf, qwen3_round_trips) {
  ModelSpec s = spec_of("qwen3_8b.json");
  auto back = gguf_round_trip(s);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, as_gguf_sees_it(s));
}

TEST(ModelSpecGguf, qwen35_round_trips_with_mtp_and_writes_llama_cpp_keys) {
  ModelSpec s = spec_of("qwen3_5_27b.json");
  GgufWriter w;
  auto back = gguf_round_trip(s, &w);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, as_gguf_sees_it(s));

  auto u32 = [&](const char* key) -> int64_t {
    const GgufValue* v = w.find(key);
    EXPECT_NE(v, nullptr) << key;
    if (v == nullptr) return -1;
    EXPECT_EQ(v->type(), GgufType::kU32) << key;
    return v->as_int().value_or(-1);
  };
  EXPECT_EQ(*w.find("general.architecture")->as_string(), "qwen35");
  EXPECT_EQ(u32("qwen35.block_count"), 65);  // 64 trunk + 1 MTP
  EXPECT_EQ(u32("qwen35.nextn_predict_layers"), 1);
  EXPECT_EQ(u32("qwen35.context_length"), 262144);
  EXPECT_EQ(u32("qwen35.embedding_length"), 5120);
  EXPECT_EQ(u32("qwen35.feed_forward_length"), 17408);
  EXPECT_EQ(u32("qwen35.attention.head_count"), 24);
  EXPECT_EQ(u32("qwen35.attention.head_count_kv"), 4);
  EXPECT_EQ(u32("qwen35.attention.key_length"), 256);
  EXPECT_EQ(u32("qwen35.attention.value_length"), 256);
  EXPECT_EQ(u32("qwen35.rope.dimension_count"), 64);
  EXPECT_EQ(u32("qwen35.ssm.conv_kernel"), 4);
  EXPECT_EQ(u32("qwen35.ssm.state_size"), 128);
  EXPECT_EQ(u32("qwen35.ssm.group_count"), 16);
  EXPECT_EQ(u32("qwen35.ssm.time_step_rank"), 48);
  EXPECT_EQ(u32("qwen35.ssm.inner_size"), 6144);
  EXPECT_EQ(u32("qwen35.full_attention_interval"), 4);
  EXPECT_EQ(w.find("qwen35.attention.layer_norm_rms_epsilon")->type(), GgufType::kF32);
  EXPECT_EQ(w.find("qwen35.rope.freq_base")->type(), GgufType::kF32);
  EXPECT_FLOAT_EQ(static_cast<float>(w.find("qwen35.rope.freq_base")->as_float().value()), 1e7f);

  const GgufValue* sections = w.find("qwen35.rope.dimension_sections");
  ASSERT_NE(sections, nullptr);
  EXPECT_EQ(sections->array_type(), GgufType::kI32);
  EXPECT_EQ(*sections->as_int_array(), (std::vector<int64_t>{11, 11, 10, 0}));

  const GgufValue* recurrent = w.find("qwen35.attention.recurrent_layers");
  ASSERT_NE(recurrent, nullptr);
  EXPECT_EQ(recurrent->array_type(), GgufType::kBool);
  ASSERT_EQ(recurrent->array_size(), 65u);
  EXPECT_EQ((*recurrent->as_int_array())[0], 1);
  EXPECT_EQ((*recurrent->as_int_array())[3], 0);
  EXPECT_EQ((*recurrent->as_int_array())[64], 0);  // the MTP layer is attention
}

TEST(ModelSpecGguf, drafts_round_trip_as_dflash_arch) {
  for (const char* fixture : {"qwen3_8b_dflash.json", "qwen3_6_27b_dflash_swa.json"}) {
    ModelSpec s = spec_of(fixture);
    GgufWriter w;
    auto back = gguf_round_trip(s, &w);
    ASSERT_TRUE(back.ok()) << fixture << ": " << back.status().to_string();
    EXPECT_EQ(*back, as_gguf_sees_it(s)) << fixture;
    // llama.cpp stores HF hidden_states indices (layer output l is hidden_states[l + 1]).
    EXPECT_EQ(w.find("dflash.target_layers")->as_int_array()->front(), s.target_layer_ids.front() + 1);
  }
}

TEST(ModelSpecGguf, yarn_scaling_and_tied_heads_round_trip) {
  json j = fixture_json("qwen3_8b.json");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  j["tie_word_embeddings"] = true;
  auto s = model_spec_from_hf_config(j);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  GgufWriter w;
  auto back = gguf_round_trip(*s, &w);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, as_gguf_sees_it(*s));
  EXPECT_TRUE(back->tied_embeddings);
  EXPECT_EQ(*w.find("qwen3.rope.scaling.type")->as_string(), "yarn");
  EXPECT_EQ(w.find("qwen3.rope.scaling.original_context_length")->as_int(), 32768);
}

// A minimal qwen35 GGUF built key by key, to test the reader's fallbacks and errors.
GgufWriter qwen35_keys(int64_t layers) {
  GgufWriter w;
  w.set("general.architecture", GgufValue::string("qwen35"));
  w.set("qwen35.block_count", GgufValue::u32(static_cast<uint32_t>(layers)));
  w.set("qwen35.context_length", GgufValue::u32(4096));
  w.set("qwen35.embedding_length", GgufValue::u32(256));
  w.set("qwen35.feed_forward_length", GgufValue::u32(512));
  w.set("qwen35.attention.head_count", GgufValue::u32(4));
  w.set("qwen35.attention.head_count_kv", GgufValue::u32(2));
  w.set("qwen35.attention.key_length", GgufValue::u32(64));
  w.set("qwen35.attention.value_length", GgufValue::u32(64));
  w.set("qwen35.attention.layer_norm_rms_epsilon", GgufValue::f32(1e-6f));
  w.set("qwen35.rope.freq_base", GgufValue::f32(1e7f));
  w.set("qwen35.rope.dimension_count", GgufValue::u32(16));
  w.set("qwen35.rope.dimension_sections", GgufValue::int_array(GgufType::kI32, {3, 3, 2, 0}));
  w.set("qwen35.ssm.conv_kernel", GgufValue::u32(4));
  w.set("qwen35.ssm.state_size", GgufValue::u32(32));
  w.set("qwen35.ssm.group_count", GgufValue::u32(2));
  w.set("qwen35.ssm.time_step_rank", GgufValue::u32(4));
  w.set("qwen35.ssm.inner_size", GgufValue::u32(128));
  w.set("tokenizer.ggml.tokens", GgufValue::string_array(std::vector<std::string>(1000, "t")));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(7));
  return w;
}

Result<ModelSpec> read_keys(const GgufWriter& w) {
  std::string path = test::scratch_dir() + "/keys.gguf";
  DF_RETURN_IF_ERROR(w.write(path));
  DF_ASSIGN_OR_RETURN(GgufFile g, GgufFile::open(path));
  return model_spec_from_gguf(g);
}

TEST(ModelSpecGguf, reader_derives_layers_vocab_and_tied_head) {
  GgufWriter w = qwen35_keys(8);
  auto s = read_keys(w);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->n_layers, 8);
  EXPECT_EQ(s->layer_kinds[3], LayerKind::kGatedAttention);  // interval default 4
  EXPECT_EQ(s->layer_kinds[4], LayerKind::kGatedDeltaNet);
  EXPECT_EQ(s->vocab, 1000);           // from the tokenizer list
  EXPECT_TRUE(s->tied_embeddings);     // no output.weight
  EXPECT_EQ(s->gdn, (DeltaNetDims{2, 4, 32, 32, 4}));
  EXPECT_EQ(s->eos_ids, std::vector<int64_t>{7});
  EXPECT_EQ(s->v_head_order, VHeadOrder::kTiled);

  w.set("qwen35.full_attention_interval", GgufValue::u32(2));
  EXPECT_EQ(read_keys(w)->n_attention_layers(), 4);
  // The per-layer list wins over the interval; MTP layers come after the trunk.
  w.set("qwen35.block_count", GgufValue::u32(9));
  w.set("qwen35.nextn_predict_layers", GgufValue::u32(1));
  w.set("qwen35.attention.recurrent_layers",
        GgufValue::int_array(GgufType::kBool, {1, 1, 1, 1, 1, 1, 1, 0, 0}));
  s = read_keys(w);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->n_layers, 8);
  EXPECT_EQ(s->n_mtp_layers, 1);
  EXPECT_EQ(s->n_attention_layers(), 1);
}

TEST(ModelSpecGguf, reader_errors_name_the_key) {
  auto check = [](GgufWriter w, ErrorCode code, const std::string& needle) {
    auto s = read_keys(w);
    ASSERT_FALSE(s.ok()) << needle;
    EXPECT_EQ(s.status().code(), code) << s.status().to_string();
    EXPECT_NE(s.status().message().find(needle), std::string::npos) << s.status().to_string();
  };
  GgufWriter w = qwen35_keys(8);
  w.remove("qwen35.ssm.inner_size");
  check(w, ErrorCode::kCorrupt, "qwen35.ssm.inner_size");
  w = qwen35_keys(8);
  w.remove("qwen35.rope.dimension_sections");
  check(w, ErrorCode::kCorrupt, "qwen35.rope.dimension_sections");
  w = qwen35_keys(8);
  w.set("qwen35.ssm.inner_size", GgufValue::u32(130));
  check(w, ErrorCode::kCorrupt, "not a multiple of 4 value heads");
  w = qwen35_keys(8);
  w.set("qwen35.embedding_length", GgufValue::string("x"));
  check(w, ErrorCode::kCorrupt, "qwen35.embedding_length");
  w = qwen35_keys(8);
  w.set("qwen35.nextn_predict_layers", GgufValue::u32(8));
  check(w, ErrorCode::kCorrupt, "leaves no trunk layers");
  w = qwen35_keys(8);
  w.set("qwen35.attention.head_count", GgufValue::int_array(GgufType::kU32, {4, 4, 4, 8, 4, 4, 4, 4}));
  check(w, ErrorCode::kUnsupported, "varies per layer");
  w = qwen35_keys(8);
  w.set("qwen35.attention.recurrent_layers", GgufValue::int_array(GgufType::kBool, {1, 1}));
  check(w, ErrorCode::kCorrupt, "recurrent_layers");
  w = qwen35_keys(8);
  w.set("qwen35.attention.head_count_kv", GgufValue::u32(3));
  check(w, ErrorCode::kInvalidArgument, "4 attention heads are not a multiple of 3 KV heads");
  w = qwen35_keys(8);
  w.set("general.architecture", GgufValue::string("qwen35moe"));
  check(w, ErrorCode::kUnsupported, "qwen35moe");
  w = qwen35_keys(8);
  w.set("general.architecture", GgufValue::string("llama"));
  check(w, ErrorCode::kUnsupported, "'llama' is not supported");
  w = qwen35_keys(8);
  w.remove("general.architecture");
  check(w, ErrorCode::kCorrupt, "general.architecture");
  w = qwen35_keys(8);
  w.remove("tokenizer.ggml.tokens");
  check(w, ErrorCode::kCorrupt, "vocabulary size");

  // A uniform per-layer array is fine.
  w = qwen35_keys(8);
  w.set("qwen35.attention.head_count", GgufValue::int_array(GgufType::kU32, std::vector<int64_t>(8, 4)));
  EXPECT_TRUE(read_keys(w).ok());
}

TEST(ModelSpecGguf, writer_refuses_what_llama_cpp_cannot_load) {
  ModelSpec s = spec_of("qwen3_5_27b.json");
  s.gdn.d_v = 64;
  GgufWriter w;
  EXPECT_EQ(write_model_spec_to_gguf(s, w).code(), ErrorCode::kUnsupported);
  ModelSpec q = spec_of("qwen3_8b.json");
  q.sliding_window[0] = 1024;
  EXPECT_EQ(write_model_spec_to_gguf(q, w).code(), ErrorCode::kUnsupported);
  q = spec_of("qwen3_8b.json");
  q.n_kv_heads = 5;
  EXPECT_EQ(write_model_spec_to_gguf(q, w).code(), ErrorCode::kInvalidArgument);
}

// ---- tensor names

TEST(TensorNames, qwen3_names_map_three_ways) {
  TensorNameMap m(spec_of("qwen3_8b.json").name_layout());
  const TensorNameEntry* e = m.by_hf("model.layers.3.self_attn.q_proj.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->canonical, "layers.3.attn.q");
  EXPECT_EQ(e->gguf, "blk.3.attn_q.weight");
  EXPECT_EQ(e->layer, 3);
  EXPECT_EQ(m.by_gguf("blk.35.ffn_norm.weight")->hf, "model.layers.35.post_attention_layernorm.weight");
  EXPECT_EQ(m.by_canonical("layers.0.attn_norm")->hf_to_gguf, kHfNone);  // qwen3 norms are standard
  EXPECT_EQ(m.by_canonical("token_embd")->hf, "model.embed_tokens.weight");
  EXPECT_EQ(m.by_canonical("output")->gguf, "output.weight");
  EXPECT_EQ(m.by_hf("lm_head.weight")->canonical, "output");
  EXPECT_EQ(m.by_gguf("blk.36.attn_q.weight"), nullptr);
  EXPECT_EQ(m.entries().size(), 3u + 36u * 11u);

  ModelSpec tied = spec_of("qwen3_8b.json");
  tied.tied_embeddings = true;
  EXPECT_EQ(TensorNameMap(tied.name_layout()).by_canonical("output"), nullptr);
}

TEST(TensorNames, qwen35_names_transforms_and_mtp) {
  ModelSpec s = spec_of("qwen3_5_27b.json");
  TensorNameMap m(s.name_layout());
  // 851 text tensors in the HF checkpoint (3 globals, 48 GDN layers of 14, 16 attention layers of 11)
  // plus the MTP block.
  EXPECT_EQ(m.entries().size(), 851u + 4u + 11u);

  const TensorNameEntry* a = m.by_hf("model.language_model.layers.0.linear_attn.A_log");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->canonical, "layers.0.gdn.ssm_a");
  EXPECT_EQ(a->gguf, "blk.0.ssm_a");
  EXPECT_EQ(a->hf_to_gguf, kHfNegExp | kHfVHeadRows);
  EXPECT_EQ(m.by_hf("model.layers.0.linear_attn.A_log"), a);  // both HF spellings
  EXPECT_EQ(m.by_canonical("layers.0.gdn.dt_bias")->gguf, "blk.0.ssm_dt.bias");
  EXPECT_EQ(m.by_canonical("layers.0.gdn.conv")->hf_to_gguf, kHfSqueeze | kHfVHeadRowsAfterQK);
  EXPECT_EQ(m.by_canonical("layers.0.gdn.out")->hf_to_gguf, kHfVHeadCols);
  EXPECT_EQ(m.by_canonical("layers.0.gdn.norm")->hf_to_gguf, kHfNone);  // the GDN norm is plain
  EXPECT_EQ(m.by_canonical("layers.0.gdn.gate")->gguf, "blk.0.attn_gate.weight");
  EXPECT_EQ(m.by_canonical("layers.0.gdn.qkv")->gguf, "blk.0.attn_qkv.weight");
  EXPECT_EQ(m.by_canonical("layers.0.attn.q"), nullptr);  // layer 0 is GDN

  const TensorNameEntry* norm = m.by_canonical("layers.3.ffn_norm");
  EXPECT_EQ(norm->gguf, "blk.3.post_attention_norm.weight");
  EXPECT_EQ(norm->hf, "model.language_model.layers.3.post_attention_layernorm.weight");
  EXPECT_EQ(norm->hf_to_gguf, kHfNormPlusOne);
  EXPECT_EQ(m.by_canonical("layers.3.attn.q_norm")->hf_to_gguf, kHfNormPlusOne);
  EXPECT_EQ(m.by_canonical("output_norm")->hf_to_gguf, kHfNormPlusOne);
  EXPECT_EQ(m.by_canonical("layers.3.attn.q")->gguf, "blk.3.attn_q.weight");

  EXPECT_EQ(m.by_hf("mtp.fc.weight")->gguf, "blk.64.nextn.eh_proj.weight");
  EXPECT_EQ(m.by_hf("model.mtp.fc.weight")->canonical, "mtp.fc");
  EXPECT_EQ(m.by_hf("mtp.norm.weight")->gguf, "blk.64.nextn.shared_head_norm.weight");
  EXPECT_EQ(m.by_hf("mtp.pre_fc_norm_embedding.weight")->gguf, "blk.64.nextn.enorm.weight");
  const TensorNameEntry* mq = m.by_hf("mtp.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(mq, nullptr);
  EXPECT_EQ(mq->canonical, "mtp.layers.0.attn.q");
  EXPECT_EQ(mq->gguf, "blk.64.attn_q.weight");
  EXPECT_EQ(mq->layer, -1);

  EXPECT_TRUE(hf_tensor_is_vision("model.visual.blocks.0.attn.qkv.weight"));
  EXPECT_FALSE(hf_tensor_is_vision("model.language_model.norm.weight"));

  // Every name is unique in each vocabulary.
  std::set<std::string> canon, gguf, hf;
  for (const auto& e : m.entries()) {
    EXPECT_TRUE(canon.insert(e.canonical).second) << e.canonical;
    EXPECT_TRUE(gguf.insert(e.gguf).second) << e.gguf;
    EXPECT_TRUE(hf.insert(e.hf).second) << e.hf;
  }
}

TEST(TensorNames, draft_names) {
  TensorNameMap m(spec_of("qwen3_8b_dflash.json").name_layout());
  EXPECT_EQ(m.by_hf("fc.weight")->canonical, "fc");
  EXPECT_EQ(m.by_hf("model.fc.weight")->canonical, "fc");
  EXPECT_EQ(m.by_hf("hidden_norm.weight")->gguf, "enc.output_norm.weight");
  EXPECT_EQ(m.by_hf("norm.weight")->canonical, "output_norm");
  EXPECT_EQ(m.by_hf("layers.4.post_attention_layernorm.weight")->gguf, "blk.4.ffn_norm.weight");
  EXPECT_EQ(m.by_hf("layers.0.self_attn.k_norm.weight")->hf_to_gguf, kHfNone);
  EXPECT_EQ(m.by_canonical("token_embd"), nullptr);
  EXPECT_EQ(m.entries().size(), 3u + 5u * 11u);
}

}  // namespace
}  // namespace dflash

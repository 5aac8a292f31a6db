// Chat templates: real model templates render every fixture conversation byte-identically to
// transformers' apply_chat_template (tests/fixtures/templates/expected.json), plus request
// normalization and template lookup in HF directories and GGUF files.
#include "tokenizer/chat_template.h"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "base/file_io.h"
#include "formats/gguf.h"
#include "support/test_paths.h"

namespace dflash {
namespace {

using json = nlohmann::ordered_json;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct FixtureCase {
  std::string template_name;
  std::string conversation_id;
};

json load_json(const std::string& rel) {
  std::string text = slurp(test::fixture_path(rel));
  if (text.empty()) return json();
  return json::parse(text);
}

std::vector<FixtureCase> fixture_cases() {
  std::vector<FixtureCase> cases;
  json expected = load_json("templates/expected.json");
  if (!expected.is_object()) return cases;
  for (const auto& [name, renders] : expected["renders"].items()) {
    for (const auto& [id, r] : renders.items()) cases.push_back({name, id});
  }
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<FixtureCase>& info) {
  std::string n = info.param.template_name + "__" + info.param.conversation_id;
  for (char& c : n) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return n;
}

class ChatTemplateFixtures : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(ChatTemplateFixtures, renders_like_transformers) {
  const FixtureCase& c = GetParam();
  json expected = load_json("templates/expected.json");
  json conversations = load_json("templates/conversations.json");
  const json& spec = expected["templates"][c.template_name];
  const json& want = expected["renders"][c.template_name][c.conversation_id];
  const json* conv = nullptr;
  for (const auto& x : conversations) {
    if (x["id"] == c.conversation_id) conv = &x;
  }
  ASSERT_NE(conv, nullptr) << "conversation " << c.conversation_id << " is not in conversations.json";

  std::string source = slurp(test::fixture_path("templates/" + spec["file"].get<std::string>()));
  ASSERT_FALSE(source.empty());
  auto token = [&](const char* key) { return spec[key].is_string() ? spec[key].get<std::string>() : std::string(); };
  Result<ChatTemplate> tmpl = ChatTemplate::create(source, token("bos_token"), token("eos_token"));
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().to_string();
  tmpl->set_fixed_time(expected["now"].get<std::time_t>());

  const json null_json;
  const json& tools = conv->contains("tools") ? (*conv)["tools"] : null_json;
  const json& kwargs = conv->contains("chat_template_kwargs") ? (*conv)["chat_template_kwargs"] : null_json;
  Result<std::string> got =
      tmpl->render((*conv)["messages"], tools, conv->value("add_generation_prompt", false), kwargs);
  if (want.contains("text")) {
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, want["text"].get<std::string>());
  } else {
    ASSERT_FALSE(got.ok()) << "transformers failed with: " << want["error"] << "\nwe rendered:\n" << *got;
    // raise_exception() messages come through verbatim; other errors are ours to word.
    if (want["error_type"] == "TemplateError") {
      EXPECT_EQ(got.status().message(), want["error"].get<std::string>());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ChatTemplate, ChatTemplateFixtures, ::testing::ValuesIn(fixture_cases()), case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ChatTemplateFixtures);

TEST(ChatTemplate, fixture_table_covers_every_template_and_conversation) {
  json expected = load_json("templates/expected.json");
  json conversations = load_json("templates/conversations.json");
  ASSERT_TRUE(expected.is_object()) << "tests/fixtures/templates/expected.json is missing";
  ASSERT_GE(conversations.size(), 15u);
  ASSERT_GE(expected["templates"].size(), 5u);
  for (const auto& [name, renders] : expected["renders"].items()) {
    EXPECT_EQ(renders.size(), conversations.size()) << name;
    EXPECT_TRUE(file_exists(test::fixture_path("templates/" + expected["templates"][name]["file"].get<std::string>())));
  }
}

ChatTemplate make(const std::string& source, std::string bos = "<s>", std::string eos = "</s>") {
  Result<ChatTemplate> t = ChatTemplate::create(source, std::move(bos), std::move(eos));
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

std::string render_ok(const ChatTemplate& t, const json& messages, const json& tools = json(),
                      bool add_generation_prompt = false, const json& kwargs = json()) {
  Result<std::string> r = t.render(messages, tools, add_generation_prompt, kwargs);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : std::string();
}

TEST(ChatTemplate, string_tool_arguments_holding_an_object_reach_the_template_as_a_mapping) {
  ChatTemplate t = make(
      "{% for m in messages %}{% for c in m.tool_calls or [] %}"
      "{{ c.function.arguments is mapping }}:{{ c.function.arguments|tojson }};{% endfor %}{% endfor %}");
  json messages = json::parse(R"([{"role": "assistant", "content": "", "tool_calls": [
      {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [true]}"}},
      {"id": "2", "type": "function", "function": {"name": "f", "arguments": {"x": "y"}}},
      {"id": "3", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}},
      {"id": "4", "type": "function", "function": {"name": "f", "arguments": "not json"}}]}])");
  EXPECT_EQ(render_ok(t, messages),
            R"(True:{"b": 1, "a": [true]};True:{"x": "y"};False:"[1, 2]";False:"not json";)");
}

TEST(ChatTemplate, json_key_order_of_the_request_is_kept) {
  ChatTemplate t = make("{{ tools|tojson }}");
  json tools = json::parse(R"([{"type": "function", "function": {"name": "z", "parameters": {"b": 1, "a": 2}}}])");
  EXPECT_EQ(render_ok(t, json::array(), tools), R"([{"type": "function", "function": {"name": "z", "parameters": {"b": 1, "a": 2}}}])");
  // nlohmann::json (not ordered) sorts keys: the overload works but prints them sorted.
  Result<std::string> r = t.render(nlohmann::json::array(), nlohmann::json::parse(tools.dump()), false, nlohmann::json());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, R"([{"function": {"name": "z", "parameters": {"a": 2, "b": 1}}, "type": "function"}])");
}

TEST(ChatTemplate, template_sees_transformers_variables) {
  ChatTemplate t = make("{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools }}|{{ documents }}|"
                        "{{ enable_thinking }}|{{ messages|length }}");
  EXPECT_EQ(render_ok(t, json::parse(R"([{"role": "user", "content": "x"}])"), json(), true,
                      json::parse(R"({"enable_thinking": false})")),
            "<s>|</s>|True|None|None|False|1");
  // chat_template_kwargs may override the special tokens, like transformers' kwargs do.
  EXPECT_EQ(render_ok(t, json::array(), json(), false, json::parse(R"({"eos_token": "E"})")), "<s>|E|False|None|None||0");
  ChatTemplate none = make("{{ bos_token is defined }}{{ eos_token is defined }}", "", "");
  EXPECT_EQ(render_ok(none, json::array()), "FalseFalse");
}

TEST(ChatTemplate, malformed_requests_are_rejected) {
  ChatTemplate t = make("{{ messages }}");
  EXPECT_FALSE(t.render(json::object(), json(), false, json()).ok());
  EXPECT_FALSE(t.render(json::array(), json::object(), false, json()).ok());
  EXPECT_FALSE(t.render(json::array(), json(), false, json::array()).ok());
  Result<std::string> r = t.render(json::array(), json(), false, json::parse(R"({"messages": []})"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("may not set 'messages'"), std::string::npos);
  json deep = json::array();
  json* cur = &deep;
  for (int i = 0; i < 2000; ++i) {
    cur->push_back(json::array());
    cur = &(*cur)[0];
  }
  EXPECT_FALSE(t.render(json::array({{{"role", "user"}, {"content", deep}}}), json(), false, json()).ok());
}

TEST(ChatTemplate, raise_exception_surfaces_the_templates_message) {
  ChatTemplate t = make("{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}");
  Result<std::string> r = t.render(json::parse(R"([{"role": "system", "content": "x"}])"), json(), true, json());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "System role not supported");
}

TEST(ChatTemplate, syntax_errors_are_reported_when_created) {
  Result<ChatTemplate> t = ChatTemplate::create("{% if %}", "", "");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("chat template"), std::string::npos);
}

TEST(ChatTemplate, tool_use_variant_is_used_when_tools_are_given) {
  ChatTemplateSource src;
  src.source = "default";
  src.tool_use_source = "tool_use";
  src.origin = "test";
  Result<ChatTemplate> t = ChatTemplate::create(src);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(render_ok(*t, json::array()), "default");
  EXPECT_EQ(render_ok(*t, json::array(), json::array()), "tool_use");
}

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

TEST(ChatTemplate, load_from_hf_tokenizer_config_string) {
  std::string dir = test::scratch_dir();
  write(dir + "/tokenizer_config.json",
        R"({"bos_token": {"content": "<|begin|>", "lstrip": false}, "eos_token": "<|end|>", "chat_template": "T{{ bos_token }}"})");
  Result<ChatTemplateSource> src = load_chat_template(dir);
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  EXPECT_EQ(src->source, "T{{ bos_token }}");
  EXPECT_EQ(src->bos_token, "<|begin|>");
  EXPECT_EQ(src->eos_token, "<|end|>");
  EXPECT_TRUE(src->tool_use_source.empty());
}

TEST(ChatTemplate, load_from_hf_named_template_list) {
  std::string dir = test::scratch_dir();
  write(dir + "/tokenizer_config.json",
        R"({"bos_token": null, "chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "U"}]})");
  Result<ChatTemplateSource> src = load_chat_template(dir);
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  EXPECT_EQ(src->source, "D");
  EXPECT_EQ(src->tool_use_source, "U");
  EXPECT_EQ(src->bos_token, "");
}

TEST(ChatTemplate, chat_template_jinja_file_takes_precedence) {
  std::string dir = test::scratch_dir();
  write(dir + "/tokenizer_config.json", R"({"eos_token": "<e>", "chat_template": "from config"})");
  write(dir + "/chat_template.jinja", "from file\n");
  Result<ChatTemplateSource> src = load_chat_template(dir);
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  EXPECT_EQ(src->source, "from file\n");
  EXPECT_EQ(src->eos_token, "<e>");
}

TEST(ChatTemplate, a_weights_file_path_finds_the_template_in_its_directory) {
  std::string dir = test::scratch_dir();
  write(dir + "/tokenizer_config.json", R"({"chat_template": "W"})");
  write(dir + "/model.safetensors", "not a gguf");
  Result<ChatTemplateSource> src = load_chat_template(dir + "/model.safetensors");
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  EXPECT_EQ(src->source, "W");
}

TEST(ChatTemplate, processor_chat_template_json_is_the_last_resort) {
  std::string dir = test::scratch_dir();
  write(dir + "/chat_template.json", R"({"chat_template": "P"})");
  Result<ChatTemplateSource> src = load_chat_template(dir);
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  EXPECT_EQ(src->source, "P");
}

TEST(ChatTemplate, missing_or_malformed_templates_are_clear_errors) {
  std::string dir = test::scratch_dir();
  EXPECT_EQ(load_chat_template(dir).status().code(), ErrorCode::kNotFound);
  write(dir + "/tokenizer_config.json", R"({"chat_template": 5})");
  EXPECT_EQ(load_chat_template(dir).status().code(), ErrorCode::kCorrupt);
  write(dir + "/tokenizer_config.json", "{not json");
  EXPECT_FALSE(load_chat_template(dir).ok());
  EXPECT_EQ(load_chat_template(dir + "/nope").status().code(), ErrorCode::kNotFound);
}

TEST(ChatTemplate, load_from_gguf_metadata) {
  std::string dir = test::scratch_dir();
  GgufWriter w;
  w.set("general.architecture", GgufValue::string("qwen3"));
  w.set("tokenizer.chat_template", GgufValue::string("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"));
  w.set("tokenizer.ggml.tokens", GgufValue::string_array({"<unk>", "<|bos|>", "<|eos|>", "a"}));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(1));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(2));
  ASSERT_TRUE(w.write(dir + "/m.gguf").ok());
  Result<ChatTemplateSource> src = load_chat_template(dir + "/m.gguf");
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  EXPECT_EQ(src->bos_token, "<|bos|>");
  EXPECT_EQ(src->eos_token, "<|eos|>");
  Result<ChatTemplate> t = ChatTemplate::create(*src);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(render_ok(*t, json::parse(R"([{"role": "user", "content": "hi"}])")), "<|bos|>hi<|eos|>");

  GgufWriter bare;
  bare.set("general.architecture", GgufValue::string("qwen3"));
  ASSERT_TRUE(bare.write(dir + "/bare.gguf").ok());
  EXPECT_EQ(load_chat_template(dir + "/bare.gguf").status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace dflash

// tokenizer.json / tokenizer_config.json loading: what is accepted, and hostile files refused clearly.
#include "tokenizer/tokenizer_json.h"

#include <gtest/gtest.h>

#include "tiny_vocab.h"
#include "tokenizer/tokenizer.h"

namespace dflash {
namespace {

using nlohmann::json;

json tiny() {
  test::TinyVocabSpec spec;
  spec.merges = {{"a", "b"}};
  spec.added_tokens = {test::added_token("<|end|>", true), test::added_token("<think>", false)};
  return test::tiny_tokenizer_json(spec);
}

// Loads `j` and expects an error whose message contains `needle`.
void expect_error(const std::string& text, const std::string& needle, const std::string& config = "") {
  auto v = vocab_from_tokenizer_json(text, config);
  ASSERT_FALSE(v.ok()) << "loaded: " << text.substr(0, 200);
  EXPECT_NE(v.status().message().find(needle), std::string::npos)
      << "message: " << v.status().message() << "\nexpected to contain: " << needle;
}
void expect_json_error(const json& j, const std::string& needle) { expect_error(j.dump(), needle); }

TEST(TokenizerJson, loads_the_fields_of_a_byte_level_bpe) {
  auto v = vocab_from_tokenizer_json(tiny().dump());
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->size(), 256 + 1 + 2);
  EXPECT_EQ(v->merges.size(), 1u);
  EXPECT_TRUE(v->nfc);
  EXPECT_EQ(v->pre_name, "qwen2");
  ASSERT_EQ(v->added_tokens.size(), 2u);
  EXPECT_EQ(v->types[v->added_tokens[0].id], TokenType::kControl);
  EXPECT_EQ(v->types[v->added_tokens[1].id], TokenType::kUserDefined);
  EXPECT_FALSE(v->added_tokens[1].normalized);
}

TEST(TokenizerJson, merges_may_be_pairs) {
  json j = tiny();
  j["model"]["merges"] = json::array({json::array({"a", "b"})});
  auto v = vocab_from_tokenizer_json(j.dump());
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->merges[0], std::make_pair(std::string("a"), std::string("b")));
}

TEST(TokenizerJson, split_string_patterns_are_literal) {
  test::TinyVocabSpec spec;
  spec.merges = {{"x", "\\"}, {"E", "|"}};  // would apply if the pieces were not split apart
  json j = test::tiny_tokenizer_json(spec);
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", "\\E|"}};  // regex-looking, and \E inside
  auto v = vocab_from_tokenizer_json(j.dump());
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  auto t = Tokenizer::create(std::move(v).value());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(*t->encode("x\\E|y", true), (std::vector<int32_t>{'x', '\\', *t->token_to_id("E|"), 'y'}));
  EXPECT_EQ(*t->encode("x\\y", true), (std::vector<int32_t>{*t->token_to_id("x\\"), 'y'}));
}

TEST(TokenizerJson, config_gives_special_ids_flags_and_template) {
  json cfg = {{"add_bos_token", false},
              {"eos_token", "<|end|>"},
              {"pad_token", {{"content", "<|end|>"}, {"special", true}}},
              {"bos_token", nullptr},
              {"chat_template", "{{ messages }}"},
              {"added_tokens_decoder", {{"300", {{"content", "<extra>"}, {"special", true}}}}}};
  auto v = vocab_from_tokenizer_json(tiny().dump(), cfg.dump());
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->eos_id, v->find_token("<|end|>"));
  EXPECT_EQ(v->pad_id, v->eos_id);
  EXPECT_FALSE(v->bos_id.has_value());
  EXPECT_EQ(v->size(), 301);  // the config's token 300, with padding before it
  EXPECT_EQ(v->types[299], TokenType::kUnused);
  EXPECT_EQ(v->types[300], TokenType::kControl);
  auto t = Tokenizer::create(std::move(v).value());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(*t->encode("<extra>", true), std::vector<int32_t>{300});
}

TEST(TokenizerJson, refuses_malformed_json) {
  expect_error("", "invalid JSON");
  expect_error("{", "invalid JSON");
  expect_error("[1, 2]", "top level must be an object");
  expect_error(std::string(1000, '['), "nests deeper");
  expect_error("{\"model\": {\"vocab\": {\"\xC3\": 0}}}", "invalid JSON");  // invalid UTF-8 in a key
}

TEST(TokenizerJson, refuses_wrong_types) {
  json j = tiny();
  j["model"] = "BPE";
  expect_json_error(j, "'model' must be an object");
  j = tiny();
  j["model"]["vocab"] = json::array();
  expect_json_error(j, "'vocab' must be an object");
  j = tiny();
  j["model"]["vocab"]["x"] = "seven";
  expect_json_error(j, "token id must be an integer");
  j = tiny();
  j["model"]["merges"] = json::array({42});
  expect_json_error(j, "merge 0 must be");
  j = tiny();
  j["added_tokens"][0]["special"] = "yes";
  expect_json_error(j, "'special' must be a boolean");
  j = tiny();
  j["added_tokens"][0].erase("content");
  expect_json_error(j, "has no content");
  expect_error(tiny().dump(), "'eos_token' must be a string", json{{"eos_token", 5}}.dump());
}

TEST(TokenizerJson, refuses_ids_out_of_range_and_duplicates) {
  json j = tiny();
  j["model"]["vocab"]["x"] = -1;
  expect_json_error(j, "outside");
  j = tiny();
  j["model"]["vocab"]["x"] = 1ull << 40;
  expect_json_error(j, "beyond the supported");
  j = tiny();
  j["model"]["vocab"]["x"] = 5;  // id 5 is already a byte token
  expect_json_error(j, "vocab id 5 is given to both");
  j = tiny();
  j["added_tokens"][1]["id"] = j["added_tokens"][0]["id"];
  expect_json_error(j, "two added tokens have id");
  j = tiny();
  j["added_tokens"][1]["content"] = "<|end|>";
  expect_json_error(j, "appears twice");
  j = tiny();
  j["added_tokens"][0]["id"] = 7;  // collides with the byte token at id 7
  expect_json_error(j, "collides with model token");
  expect_error(tiny().dump(), "'<missing>' is not in the vocabulary", json{{"eos_token", "<missing>"}}.dump());
}

TEST(TokenizerJson, refuses_merges_outside_the_vocabulary) {
  json j = tiny();
  j["model"]["merges"].push_back("ab c");  // "abc" is not a token
  expect_json_error(j, "merge 1 'ab c' uses 'abc'");
  j = tiny();
  j["model"]["merges"].push_back("a b c");
  expect_json_error(j, "not two tokens separated by one space");
}

TEST(TokenizerJson, refuses_what_it_does_not_implement) {
  json j = tiny();
  j["model"]["type"] = "Unigram";
  expect_json_error(j, "model type 'Unigram' is not supported");
  j = tiny();
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_json_error(j, "normalizer 'Lowercase'");
  j = tiny();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_json_error(j, "pre-tokenizer 'Whitespace'");
  j = tiny();
  j["pre_tokenizer"] = nullptr;
  expect_json_error(j, "no ByteLevel pre-tokenizer");
  j = tiny();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_json_error(j, "does not compile");
}

TEST(TokenizerJson, invalid_utf8_inside_a_string_escape_is_refused) {
  // A lone surrogate escape cannot become UTF-8.
  json j = tiny();
  std::string text = j.dump();
  text.replace(text.find("<think>"), 7, "\\ud800x");
  expect_error(text, "invalid JSON");
}

}  // namespace
}  // namespace dflash

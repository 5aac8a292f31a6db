// Streaming detokenizer: complete UTF-8 only, partial characters held back, same text as decode_text.
#include "tokenizer/stream_detokenizer.h"

#include <gtest/gtest.h>

#include "tiny_vocab.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/utf8.h"

namespace dflash {
namespace {

Tokenizer byte_tokenizer() {
  test::TinyVocabSpec spec;
  spec.added_tokens = {test::added_token("<|e|>", true)};
  auto tok = Tokenizer::create(vocab_from_tokenizer_json(test::tiny_tokenizer_json(spec).dump()).value());
  EXPECT_TRUE(tok.ok());
  return std::move(tok).value();
}

TEST(StreamDetokenizer, holds_split_characters_until_complete) {
  Tokenizer t = byte_tokenizer();
  StreamDetokenizer s(t);
  // U+1F600 as four single-byte tokens, then 'a'.
  EXPECT_EQ(s.push(0xF0), "");
  EXPECT_EQ(s.push(0x9F), "");
  EXPECT_EQ(s.push(0x98), "");
  EXPECT_EQ(s.pending_bytes(), 3u);
  EXPECT_EQ(s.push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(s.push('a'), "a");
  EXPECT_EQ(s.finish(), "");
}

TEST(StreamDetokenizer, invalid_bytes_become_replacement_characters) {
  Tokenizer t = byte_tokenizer();
  StreamDetokenizer s(t);
  EXPECT_EQ(s.push(0xE4), "");
  EXPECT_EQ(s.push('x'), "\xEF\xBF\xBDx");  // the held byte can no longer complete
  EXPECT_EQ(s.push(0x80), "\xEF\xBF\xBD");   // a stray continuation byte is final at once
  EXPECT_EQ(s.push(0xE4), "");
  EXPECT_EQ(s.finish(), "\xEF\xBF\xBD");     // an unfinished tail is repaired at the end
}

TEST(StreamDetokenizer, skips_special_tokens_when_asked) {
  Tokenizer t = byte_tokenizer();
  int32_t e = *t.token_to_id("<|e|>");
  StreamDetokenizer keep(t, false), skip(t, true);
  EXPECT_EQ(keep.push(e), "<|e|>");
  EXPECT_EQ(skip.push(e), "");
}

TEST(StreamDetokenizer, concatenation_equals_decode_text_for_every_split) {
  Tokenizer t = byte_tokenizer();
  // Text mixing 1- to 4-byte characters and invalid bytes, tokenized one byte per token.
  std::string bytes = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\x80\xE4\xB8z\xF0\x9F\xC3\xA9\xED\xA0\x80";
  std::vector<int32_t> ids;
  for (char c : bytes) ids.push_back(static_cast<uint8_t>(c));
  StreamDetokenizer s(t);
  std::string streamed;
  for (int32_t id : ids) {
    std::string piece = s.push(id);
    EXPECT_TRUE(utf8::is_valid(piece));
    streamed += piece;
  }
  streamed += s.finish();
  EXPECT_EQ(streamed, t.decode_text(ids, false));
}

}  // namespace
}  // namespace dflash

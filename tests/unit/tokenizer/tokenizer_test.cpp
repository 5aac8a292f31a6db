// Byte-level BPE on a tiny vocabulary: merge order, added-token matching (HF rules), NFC, decode.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include "tiny_vocab.h"
#include "tokenizer/tokenizer_json.h"

namespace dflash {
namespace {

using Ids = std::vector<int32_t>;

Tokenizer make(const test::TinyVocabSpec& spec) {
  auto vocab = vocab_from_tokenizer_json(test::tiny_tokenizer_json(spec).dump());
  EXPECT_TRUE(vocab.ok()) << vocab.status().to_string();
  auto tok = Tokenizer::create(std::move(vocab).value());
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  return std::move(tok).value();
}

Ids encode(const Tokenizer& t, std::string_view text, bool parse_special = true) {
  auto r = t.encode(text, parse_special);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : Ids{};
}

int32_t id_of(const Tokenizer& t, std::string_view token) {
  auto id = t.token_to_id(token);
  EXPECT_TRUE(id.has_value()) << token;
  return id.value_or(-1);
}

TEST(Bpe, bytes_without_merges_are_one_token_each) {
  Tokenizer t = make({});
  EXPECT_EQ(encode(t, "ab"), (Ids{'a', 'b'}));
  EXPECT_EQ(encode(t, "\xE4\xB8\xAD"), (Ids{0xE4, 0xB8, 0xAD}));
  EXPECT_EQ(encode(t, ""), Ids{});
}

TEST(Bpe, merges_apply_by_rank_not_by_position) {
  test::TinyVocabSpec spec;
  spec.merges = {{"b", "c"}, {"a", "b"}};  // "bc" ranks first although "ab" is further left
  Tokenizer t = make(spec);
  EXPECT_EQ(encode(t, "abc"), (Ids{'a', id_of(t, "bc")}));
  EXPECT_EQ(encode(t, "ab"), (Ids{id_of(t, "ab")}));
}

TEST(Bpe, merged_symbols_merge_again_in_rank_order) {
  test::TinyVocabSpec spec;
  spec.merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}};
  Tokenizer t = make(spec);
  EXPECT_EQ(encode(t, "hello"), (Ids{id_of(t, "hello")}));
  EXPECT_EQ(encode(t, "hello world"), (Ids{id_of(t, "hello"), id_of(t, "Ġw"), 'o', 'r', 'l', 'd'}));
  EXPECT_EQ(encode(t, "shell"), (Ids{'s', id_of(t, "hell")}));
}

TEST(Bpe, equal_ranks_merge_leftmost_first) {
  test::TinyVocabSpec spec;
  spec.merges = {{"a", "a"}, {"aa", "aa"}};
  Tokenizer t = make(spec);
  EXPECT_EQ(encode(t, "aaa"), (Ids{id_of(t, "aa"), 'a'}));
  EXPECT_EQ(encode(t, "aaaaa"), (Ids{id_of(t, "aaaa"), 'a'}));
}

TEST(Bpe, pre_tokenizer_keeps_words_apart) {
  test::TinyVocabSpec spec;
  spec.merges = {{"a", "Ġ"}};  // would join across the word boundary if words were not split
  Tokenizer t = make(spec);
  EXPECT_EQ(encode(t, "a b"), (Ids{'a', 0x20 /* Ġ */, 'b'}));
}

TEST(Bpe, contractions_are_their_own_words) {
  test::TinyVocabSpec spec;
  spec.merges = {{"'", "s"}, {"t", "'"}};
  Tokenizer t = make(spec);
  EXPECT_EQ(encode(t, "it's"), (Ids{'i', 't', id_of(t, "'s")}));
  EXPECT_EQ(encode(t, "IT'S"), (Ids{'I', 'T', '\'', 'S'}));  // 'S is a word; no merge for it
}

TEST(Bpe, invalid_utf8_is_refused_with_its_offset) {
  Tokenizer t = make({});
  auto r = t.encode("ok\xC3(", true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("offset 2"), std::string::npos) << r.status().message();
  EXPECT_FALSE(t.encode("\xED\xA0\x80", true).ok());  // a UTF-16 surrogate
  EXPECT_FALSE(t.encode("\xC0\xAF", true).ok());      // overlong
}

TEST(AddedTokens, special_tokens_match_only_when_parsing_specials) {
  test::TinyVocabSpec spec;
  spec.added_tokens = {test::added_token("<|s|>", true), test::added_token("<t>", false)};
  Tokenizer t = make(spec);
  int32_t s = id_of(t, "<|s|>"), tt = id_of(t, "<t>");
  EXPECT_EQ(encode(t, "a<|s|>b<t>", true), (Ids{'a', s, 'b', tt}));
  // With parsing off the special token is plain text, the non-special one still matches.
  EXPECT_EQ(encode(t, "a<|s|>b<t>", false), (Ids{'a', '<', '|', 's', '|', '>', 'b', tt}));
}

TEST(AddedTokens, longest_match_wins_at_the_leftmost_position) {
  test::TinyVocabSpec spec;
  spec.added_tokens = {test::added_token("<a>", false), test::added_token("<a><b>", false),
                       test::added_token("a><", false)};
  Tokenizer t = make(spec);
  EXPECT_EQ(encode(t, "<a><b>"), (Ids{id_of(t, "<a><b>")}));
  EXPECT_EQ(encode(t, "<a><c>"), (Ids{id_of(t, "<a>"), '<', 'c', '>'}));
}

TEST(AddedTokens, a_skipped_special_match_hides_tokens_inside_it) {
  // HF's find_matches skips a special match when not parsing specials, but the search resumes after it.
  test::TinyVocabSpec spec;
  spec.added_tokens = {test::added_token("<|x|>", true), test::added_token("|x|", false)};
  Tokenizer t = make(spec);
  EXPECT_EQ(encode(t, "<|x|>", false), (Ids{'<', '|', 'x', '|', '>'}));
  EXPECT_EQ(encode(t, "|x|", false), (Ids{id_of(t, "|x|")}));
}

TEST(AddedTokens, lstrip_and_rstrip_absorb_whitespace) {
  test::TinyVocabSpec spec;
  spec.added_tokens = {test::added_token("[L]", false, /*lstrip=*/true),
                       test::added_token("[R]", false, false, /*rstrip=*/true)};
  Tokenizer t = make(spec);
  int32_t l = id_of(t, "[L]"), r = id_of(t, "[R]");
  EXPECT_EQ(encode(t, "a  [L] b"), (Ids{'a', l, id_of(t, "Ġ"), 'b'}));
  EXPECT_EQ(encode(t, "a [R]\u00a0\n b"), (Ids{'a', id_of(t, "Ġ"), r, 'b'}));
  // The whitespace a previous token took is not taken again.
  EXPECT_EQ(encode(t, "[R] [L]"), (Ids{r, l}));
}

TEST(AddedTokens, single_word_tokens_do_not_match_inside_words) {
  test::TinyVocabSpec spec;
  spec.added_tokens = {test::added_token("wd", false, false, false, false, /*single_word=*/true)};
  Tokenizer t = make(spec);
  int32_t wd = id_of(t, "wd");
  EXPECT_EQ(encode(t, "wd"), (Ids{wd}));
  EXPECT_EQ(encode(t, "a wd."), (Ids{'a', id_of(t, "Ġ"), wd, '.'}));
  EXPECT_EQ(encode(t, "awd"), (Ids{'a', 'w', 'd'}));
  EXPECT_EQ(encode(t, "wd_"), (Ids{'w', 'd', '_'}));
}

TEST(AddedTokens, normalized_tokens_match_after_nfc) {
  test::TinyVocabSpec spec;
  spec.added_tokens = {test::added_token("\u00f1u", false, false, false, /*normalized=*/true)};
  Tokenizer t = make(spec);
  int32_t nu = id_of(t, "\u00f1u");
  EXPECT_EQ(encode(t, "n\u0303u"), (Ids{nu}));  // decomposed input, NFC then matched
  EXPECT_EQ(encode(t, "x\u00f1u"), (Ids{'x', nu}));
}

TEST(Normalization, nfc_composes_before_bpe) {
  Tokenizer t = make({});
  EXPECT_EQ(encode(t, "e\u0301"), encode(t, "\u00e9"));
  test::TinyVocabSpec raw;
  raw.nfc = false;
  Tokenizer u = make(raw);
  EXPECT_NE(encode(u, "e\u0301"), encode(u, "\u00e9"));
}

TEST(Decode, round_trips_bytes_and_added_tokens) {
  test::TinyVocabSpec spec;
  spec.merges = {{"h", "i"}, {"Ġ", "t"}};
  spec.added_tokens = {test::added_token("<|s|>", true), test::added_token("<t>", false)};
  Tokenizer t = make(spec);
  std::string text = "hi <|s|> there<t>\n\t\xE4\xB8\xAD\xF0\x9F\x98\x80";
  Ids ids = encode(t, text);
  EXPECT_EQ(t.decode(ids, false), text);
  EXPECT_EQ(t.decode(ids, true), "hi  there<t>\n\t\xE4\xB8\xAD\xF0\x9F\x98\x80");
}

TEST(Decode, partial_characters_are_repaired_only_by_decode_text) {
  Tokenizer t = make({});
  Ids ids = {0xE4, 0xB8};  // two of the three bytes of U+4E2D
  EXPECT_EQ(t.decode(ids, false), "\xE4\xB8");
  EXPECT_EQ(t.decode_text(ids, false), "\xEF\xBF\xBD");
  EXPECT_EQ(t.decode(Ids{-1, 1 << 30}, false), "");  // unknown ids decode to nothing, as in HF
}

}  // namespace
}  // namespace dflash

// UTF-8 helpers: validation, lossy repair (the from_utf8_lossy rule), complete prefixes, NFC.
#include "tokenizer/utf8.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

TEST(Utf8, finds_the_first_invalid_byte) {
  EXPECT_TRUE(utf8::is_valid(""));
  EXPECT_TRUE(utf8::is_valid("a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80"));
  EXPECT_EQ(utf8::find_invalid("ab\x80"), 2u);
  EXPECT_EQ(utf8::find_invalid("\xC0\x80"), 0u);          // overlong NUL
  EXPECT_EQ(utf8::find_invalid("\xE0\x80\x80"), 0u);      // overlong
  EXPECT_EQ(utf8::find_invalid("\xED\xA0\x80"), 0u);      // surrogate
  EXPECT_EQ(utf8::find_invalid("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8::find_invalid("x\xE4\xB8"), 1u);         // truncated
}

TEST(Utf8, lossy_repair_replaces_each_maximal_invalid_subpart) {
  // The examples of Unicode's "U+FFFD substitution of maximal subparts" (as Rust's from_utf8_lossy).
  EXPECT_EQ(utf8::to_valid_lossy("a\x80z"), "a\xEF\xBF\xBDz");
  EXPECT_EQ(utf8::to_valid_lossy("\xE4\xB8z"), "\xEF\xBF\xBDz");           // one replacement for 2 bytes
  EXPECT_EQ(utf8::to_valid_lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(utf8::to_valid_lossy("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // C0 starts nothing
  EXPECT_EQ(utf8::to_valid_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8::to_valid_lossy("ok \xE4\xB8\xAD"), "ok \xE4\xB8\xAD");
}

TEST(Utf8, complete_prefix_holds_back_only_a_possible_start) {
  EXPECT_EQ(utf8::complete_prefix_length(""), 0u);
  EXPECT_EQ(utf8::complete_prefix_length("ab"), 2u);
  EXPECT_EQ(utf8::complete_prefix_length("a\xE4"), 1u);
  EXPECT_EQ(utf8::complete_prefix_length("a\xE4\xB8"), 1u);
  EXPECT_EQ(utf8::complete_prefix_length("a\xE4\xB8\xAD"), 4u);
  EXPECT_EQ(utf8::complete_prefix_length("a\xF0\x9F\x98"), 1u);
  EXPECT_EQ(utf8::complete_prefix_length("a\x80"), 2u);      // a stray continuation never completes
  EXPECT_EQ(utf8::complete_prefix_length("a\xE0\x80"), 3u);  // E0 80 can never become valid
  EXPECT_EQ(utf8::complete_prefix_length("a\xFF"), 2u);
}

TEST(Utf8, nfc_composes_and_keeps_ascii) {
  EXPECT_EQ(*utf8::nfc("cafe\xCC\x81"), "caf\xC3\xA9");
  EXPECT_EQ(*utf8::nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(*utf8::nfc("\xE2\x84\xAB"), "\xC3\x85");  // U+212B ANGSTROM SIGN -> U+00C5
  EXPECT_EQ(*utf8::nfc(std::string("a\0b\xC3\xA9", 5)), std::string("a\0b\xC3\xA9", 5));
}

TEST(Utf8, whitespace_and_word_classes) {
  for (char32_t c : {U' ', U'\t', U'\n', U'\r', U'\v', U'\f', char32_t{0x85}, char32_t{0xA0}, char32_t{0x3000}})
    EXPECT_TRUE(utf8::is_whitespace(c)) << static_cast<uint32_t>(c);
  for (char32_t c : {U'a', char32_t{0x200B}, char32_t{0x180E}, char32_t{0x1C}}) EXPECT_FALSE(utf8::is_whitespace(c));
  for (char32_t c : {U'a', U'Z', U'0', U'_', char32_t{0xE9}, char32_t{0x4E2D}, char32_t{0x301}})
    EXPECT_TRUE(utf8::is_word_char(c));
  for (char32_t c : {U' ', U'.', U'-', char32_t{0x1F600}}) EXPECT_FALSE(utf8::is_word_char(c));
}

}  // namespace
}  // namespace dflash

// Finds added tokens (<|im_start|>, <think>, ...) in text with HF tokenizers' rules.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace dflash {

// A stretch of text: either an added token (id >= 0) or plain text for the model (id == -1).
struct TextPiece {
  size_t begin = 0;
  size_t end = 0;
  int32_t id = -1;
};

// Leftmost-longest matching over a byte trie, as HF's AddedVocabulary::find_matches:
//  - matches never overlap; after a match (even a discarded one) the search resumes at its end;
//  - a special token found while parse_special is off is discarded and its text stays plain
//    (HF's encode_special_tokens / split_special_tokens = True);
//  - single_word tokens are discarded when a word character (\w) touches either side;
//  - lstrip / rstrip tokens absorb the Unicode whitespace on their left / right.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // `contents[i]` is matched for `tokens[i]` (normalized tokens are matched by their NFC form).
  AddedTokenMatcher(std::vector<AddedToken> tokens, const std::vector<std::string>& contents);

  bool empty() const { return tokens_.empty(); }
  // Appends the pieces of `text` (covering it in order, none empty) to `out`.
  void split(std::string_view text, bool parse_special, std::vector<TextPiece>& out) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                 // index into tokens_ of the token ending here
  };
  int32_t child(int32_t node, uint8_t byte) const;
  // Longest token starting at text[pos], as (index into tokens_, length); index -1 when none.
  std::pair<int32_t, size_t> longest_at(std::string_view text, size_t pos) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;
  std::array<bool, 256> first_byte_{};  // bytes some token starts with
};

}  // namespace dflash

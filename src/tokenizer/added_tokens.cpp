#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace dflash {
namespace {

// The code point that ends just before `end`, or nullopt at the start or on broken UTF-8.
bool last_code_point(std::string_view s, size_t end, char32_t& cp, size_t& start) {
  if (end == 0) return false;
  size_t p = end - 1;
  while (p > 0 && end - p < 4 && (static_cast<uint8_t>(s[p]) & 0xC0) == 0x80) --p;
  if (utf8::decode(s, p, cp) != end - p) return false;
  start = p;
  return true;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens, const std::vector<std::string>& contents)
    : tokens_(std::move(tokens)) {
  nodes_.emplace_back();
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const std::string& content = contents[i];
    if (content.empty()) continue;  // HF ignores empty added tokens
    first_byte_[static_cast<uint8_t>(content[0])] = true;
    int32_t node = 0;
    for (char c : content) {
      uint8_t b = static_cast<uint8_t>(c);
      int32_t next = child(node, b);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        auto& ch = nodes_[node].children;
        ch.insert(std::lower_bound(ch.begin(), ch.end(), std::make_pair(b, int32_t{0})), {b, next});
        nodes_.emplace_back();
      }
      node = next;
    }
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<int32_t>(i);
  }
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t byte) const {
  const auto& ch = nodes_[node].children;
  auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(byte, int32_t{0}));
  return (it != ch.end() && it->first == byte) ? it->second : -1;
}

std::pair<int32_t, size_t> AddedTokenMatcher::longest_at(std::string_view text, size_t pos) const {
  std::pair<int32_t, size_t> best{-1, 0};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    node = child(node, static_cast<uint8_t>(text[i]));
    if (node < 0) break;
    if (nodes_[node].token >= 0) best = {nodes_[node].token, i + 1 - pos};
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, bool parse_special, std::vector<TextPiece>& out) const {
  size_t emitted = 0;  // text before this is already in `out`
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    auto [index, len] = longest_at(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens_[index];
    size_t start = pos, stop = pos + len;
    pos = stop;  // the search resumes after the match whether or not it is kept
    if (tok.special && !parse_special) continue;
    char32_t cp = 0;
    if (tok.single_word) {
      size_t cp_start = 0;
      bool word_before = last_code_point(text, start, cp, cp_start) && utf8::is_word_char(cp);
      bool word_after = utf8::decode(text, stop, cp) != 0 && utf8::is_word_char(cp);
      if (word_before || word_after) continue;
    }
    if (tok.lstrip) {
      size_t cp_start = 0;
      while (start > emitted && last_code_point(text, start, cp, cp_start) && utf8::is_whitespace(cp))
        start = cp_start;
    }
    if (tok.rstrip) {
      size_t n = 0;
      while ((n = utf8::decode(text, stop, cp)) != 0 && utf8::is_whitespace(cp)) stop += n;
      pos = stop;
    }
    if (start > emitted) out.push_back({emitted, start, -1});
    out.push_back({start, stop, tok.id});
    emitted = stop;
  }
  if (emitted < text.size()) out.push_back({emitted, text.size(), -1});
}

}  // namespace dflash

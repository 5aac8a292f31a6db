#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace dflash {

const ByteLevelAlphabet& ByteLevelAlphabet::get() {
  static const ByteLevelAlphabet alphabet;  // immutable after construction
  return alphabet;
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  from_cp_.fill(-1);
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    char32_t cp = printable ? static_cast<char32_t>(b) : next++;
    to_cp_[b] = cp;
    utf8::append(to_utf8_[b], cp);
    from_cp_[cp] = static_cast<int16_t>(b);
  }
}

std::optional<uint8_t> ByteLevelAlphabet::byte_of(char32_t cp) const {
  if (cp >= from_cp_.size() || from_cp_[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(from_cp_[cp]);
}

std::string ByteLevelAlphabet::encode(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += to_utf8_[static_cast<uint8_t>(c)];
  return out;
}

std::optional<std::string> ByteLevelAlphabet::decode(std::string_view token) const {
  std::string out;
  out.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    char32_t cp;
    size_t n = utf8::decode(token, pos, cp);
    if (n == 0) return std::nullopt;
    auto b = byte_of(cp);
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
    pos += n;
  }
  return out;
}

}  // namespace dflash

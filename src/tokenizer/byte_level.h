// GPT-2's byte-level alphabet: each of the 256 byte values as one printable code point.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dflash {

// Printable bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for themselves; the other 68 bytes
// map to U+0100.. in byte order (so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A).
class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& get();

  char32_t code_point(uint8_t byte) const { return to_cp_[byte]; }
  // The UTF-8 of code_point(byte) (1 or 2 bytes).
  const std::string& utf8(uint8_t byte) const { return to_utf8_[byte]; }
  std::optional<uint8_t> byte_of(char32_t cp) const;

  // Maps raw bytes into the alphabet ("a b" -> "aĠb").
  std::string encode(std::string_view bytes) const;
  // Maps a token string back to bytes; nullopt when some code point is outside the alphabet.
  std::optional<std::string> decode(std::string_view token) const;

 private:
  ByteLevelAlphabet();
  std::array<char32_t, 256> to_cp_{};
  std::array<std::string, 256> to_utf8_;
  std::array<int16_t, 512> from_cp_{};  // code point (< 512) -> byte, -1 when not in the alphabet
};

}  // namespace dflash

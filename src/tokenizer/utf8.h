// UTF-8 helpers the tokenizer needs: validation with a position, lossy repair, NFC, Unicode classes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace dflash::utf8 {

inline constexpr char32_t kReplacement = 0xFFFD;

// Length of the UTF-8 sequence that `lead` starts (1..4), or 0 for a byte no valid sequence starts with.
int sequence_length(uint8_t lead);

// Decodes one well-formed code point at `s[pos]` (shortest form, no surrogates, <= U+10FFFF).
// Returns the number of bytes consumed, or 0 when the bytes there are not well-formed.
size_t decode(std::string_view s, size_t pos, char32_t& cp);

// Appends the UTF-8 encoding of `cp` (which must be a scalar value).
void append(std::string& out, char32_t cp);

// Offset of the first byte that is not part of well-formed UTF-8, or npos when all of `s` is valid.
size_t find_invalid(std::string_view s);
inline bool is_valid(std::string_view s) { return find_invalid(s) == std::string_view::npos; }

// Error naming the first invalid byte ("<what> is not valid UTF-8: byte 0xC3 at offset 12 ...").
Status check_valid(std::string_view s, std::string_view what);

// Length of the longest prefix of `s` that ends on a sequence boundary, given that `s` may end in the
// middle of a sequence that more bytes could still complete. Bytes that can never become valid count
// as complete (they are replaced by lossy repair, not held back).
size_t complete_prefix_length(std::string_view s);

// Appends `s` to `out`, replacing each maximal ill-formed subsequence with U+FFFD (the WHATWG /
// Rust String::from_utf8_lossy rule), so the result is always valid UTF-8.
void append_lossy(std::string& out, std::string_view s);
inline std::string to_valid_lossy(std::string_view s) {
  std::string out;
  append_lossy(out, s);
  return out;
}

// NFC (canonical composition) of valid UTF-8; ASCII input is returned as is without work.
Result<std::string> nfc(std::string_view s);

// Unicode White_Space (what Rust's char::is_whitespace and Oniguruma's \s match).
bool is_whitespace(char32_t cp);
// Rust regex `\w`: letters, marks, decimal digits, connector punctuation, join controls.
bool is_word_char(char32_t cp);

}  // namespace dflash::utf8

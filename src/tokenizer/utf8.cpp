#include "tokenizer/utf8.h"

#include <cstdlib>
#include <memory>

#include <utf8proc.h>

namespace dflash::utf8 {
namespace {

// Allowed range of the second byte after `lead` (Unicode Table 3-7); the others are always 80..BF.
void second_byte_range(uint8_t lead, uint8_t& lo, uint8_t& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (lead == 0xE0) lo = 0xA0;
  else if (lead == 0xED) hi = 0x9F;
  else if (lead == 0xF0) lo = 0x90;
  else if (lead == 0xF4) hi = 0x8F;
}

// How many bytes at s[pos] form the longest prefix of some well-formed sequence (>= 1 when the lead
// byte can start one, 0 otherwise), and the full length that sequence needs.
size_t valid_prefix(std::string_view s, size_t pos, size_t& needed) {
  uint8_t lead = static_cast<uint8_t>(s[pos]);
  needed = static_cast<size_t>(sequence_length(lead));
  if (needed == 0) return 0;
  size_t k = 1;
  while (k < needed && pos + k < s.size()) {
    uint8_t b = static_cast<uint8_t>(s[pos + k]);
    uint8_t lo = 0x80, hi = 0xBF;
    if (k == 1) second_byte_range(lead, lo, hi);
    if (b < lo || b > hi) break;
    ++k;
  }
  return k;
}

}  // namespace

int sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

size_t decode(std::string_view s, size_t pos, char32_t& cp) {
  if (pos >= s.size()) return 0;
  size_t needed = 0;
  size_t k = valid_prefix(s, pos, needed);
  if (k == 0 || k != needed) return 0;
  const auto* p = reinterpret_cast<const uint8_t*>(s.data() + pos);
  switch (needed) {
    case 1: cp = p[0]; break;
    case 2: cp = (char32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F); break;
    case 3: cp = (char32_t(p[0] & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F); break;
    default:
      cp = (char32_t(p[0] & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) | (char32_t(p[2] & 0x3F) << 6) |
           (p[3] & 0x3F);
  }
  return needed;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t find_invalid(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    char32_t cp;
    size_t n = decode(s, pos, cp);
    if (n == 0) return pos;
    pos += n;
  }
  return std::string_view::npos;
}

Status check_valid(std::string_view s, std::string_view what) {
  size_t bad = find_invalid(s);
  if (bad == std::string_view::npos) return Status();
  return invalid_argument("{} is not valid UTF-8: byte 0x{:02X} at offset {} does not start or continue a "
                          "well-formed sequence",
                          what, static_cast<uint8_t>(s[bad]), bad);
}

size_t complete_prefix_length(std::string_view s) {
  // An incomplete tail is at most 3 bytes: look for its lead byte among the last 3.
  size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    size_t pos = n - back;
    uint8_t b = static_cast<uint8_t>(s[pos]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t needed = 0;
    size_t k = valid_prefix(s, pos, needed);
    // Hold back only a tail that is a proper prefix of a well-formed sequence.
    if (k == back && needed > back) return pos;
    return n;
  }
  return n;
}

void append_lossy(std::string& out, std::string_view s) {
  static constexpr char kFffd[] = "\xEF\xBF\xBD";
  size_t pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    while (pos < s.size() && static_cast<uint8_t>(s[pos]) < 0x80) ++pos;
    char32_t cp;
    size_t n = 0;
    while (pos < s.size() && (n = decode(s, pos, cp)) != 0) pos += n;
    out.append(s.substr(start, pos - start));
    if (pos >= s.size()) break;
    if (static_cast<uint8_t>(s[pos]) < 0x80) continue;
    size_t needed = 0;
    size_t k = valid_prefix(s, pos, needed);
    out.append(kFffd, 3);
    pos += k == 0 ? 1 : k;
  }
}

Result<std::string> nfc(std::string_view s) {
  bool ascii = true;
  for (char c : s) {
    if (static_cast<uint8_t>(c) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return std::string(s);
  utf8proc_uint8_t* dst = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                    static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> hold(dst, &std::free);
  if (n < 0) return invalid_argument("NFC normalization failed: {}", utf8proc_errmsg(n));
  return std::string(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
}

bool is_whitespace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool is_word_char(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  }
  if (cp == 0x200C || cp == 0x200D) return true;  // Join_Control
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_NL:
      return true;
    default:
      return false;
  }
}

}  // namespace dflash::utf8

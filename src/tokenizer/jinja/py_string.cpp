#include "tokenizer/jinja/py_string.h"

#include <algorithm>

#include <utf8proc.h>

#include "tokenizer/jinja/error.h"
#include "tokenizer/utf8.h"

namespace dflash::jinja::py {
namespace {

constexpr char32_t kEscapeBase = 0xDC00;  // invalid byte b decodes to U+DC00 + b (b >= 0x80)

utf8proc_category_t category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

bool is_cased(char32_t c) {
  auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

char32_t to_upper_cp(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_lower_cp(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_title_cp(char32_t c) {
  if (c < 0x80) return to_upper_cp(c);
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}

template <typename F>
std::string map_chars(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  if (is_ascii(s)) {
    for (char ch : s) out.push_back(static_cast<char>(f(static_cast<char32_t>(ch))));
    return out;
  }
  for (char32_t c : decode(s)) append_code_point(out, f(c));
  return out;
}

// Byte offset of code point index `i` (clamped to [0, n]) in `s`.
size_t byte_offset(std::string_view s, int64_t i) {
  if (i <= 0) return 0;
  if (is_ascii(s)) return std::min<size_t>(static_cast<size_t>(i), s.size());
  size_t pos = 0;
  int64_t k = 0;
  while (pos < s.size() && k < i) {
    char32_t cp;
    size_t n = utf8::decode(s, pos, cp);
    pos += n == 0 ? 1 : n;
    ++k;
  }
  return pos;
}

// Resolves Python-style optional [start, end) code-point bounds to byte offsets.
std::pair<size_t, size_t> byte_range(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> end) {
  int64_t len = static_cast<int64_t>(length(s));
  int64_t a = start.value_or(0), b = end.value_or(len);
  if (a < 0) a = std::max<int64_t>(0, a + len);
  if (b < 0) b = std::max<int64_t>(0, b + len);
  a = std::min(a, len);
  b = std::min(b, len);
  size_t ba = byte_offset(s, a);
  size_t bb = b <= a ? ba : byte_offset(s, b);
  return {ba, bb};
}

int64_t code_points_before(std::string_view s, size_t byte_pos) {
  int64_t n = 0;
  for (size_t i = 0; i < byte_pos && i < s.size(); ++i) {
    if ((static_cast<uint8_t>(s[i]) & 0xC0) != 0x80) ++n;
  }
  return n;
}

bool in_chars(char32_t c, const std::u32string& chars) { return chars.find(c) != std::u32string::npos; }

std::vector<std::string> split_whitespace(std::string_view s, int64_t maxsplit, bool from_right) {
  std::u32string cps = decode(s);
  std::vector<std::string> parts;
  if (!from_right) {
    size_t i = 0, n = cps.size();
    while (true) {
      while (i < n && is_space(cps[i])) ++i;
      if (i >= n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        size_t end = n;
        while (end > i && is_space(cps[end - 1])) --end;
        parts.push_back(encode(std::u32string_view(cps).substr(i, end - i)));
        break;
      }
      size_t j = i;
      while (j < n && !is_space(cps[j])) ++j;
      parts.push_back(encode(std::u32string_view(cps).substr(i, j - i)));
      i = j;
    }
    return parts;
  }
  int64_t i = static_cast<int64_t>(cps.size());
  while (true) {
    while (i > 0 && is_space(cps[i - 1])) --i;
    if (i <= 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
      size_t start = 0;
      while (static_cast<int64_t>(start) < i && is_space(cps[start])) ++start;
      parts.push_back(encode(std::u32string_view(cps).substr(start, i - start)));
      break;
    }
    int64_t j = i;
    while (j > 0 && !is_space(cps[j - 1])) --j;
    parts.push_back(encode(std::u32string_view(cps).substr(j, i - j)));
    i = j;
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

}  // namespace

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    auto b = static_cast<uint8_t>(s[pos]);
    if (b < 0x80) {
      out.push_back(b);
      ++pos;
      continue;
    }
    char32_t cp;
    size_t n = utf8::decode(s, pos, cp);
    if (n == 0) {
      out.push_back(kEscapeBase + b);
      ++pos;
    } else {
      out.push_back(cp);
      pos += n;
    }
  }
  return out;
}

void append_code_point(std::string& out, char32_t cp) {
  if (cp >= kEscapeBase + 0x80 && cp <= kEscapeBase + 0xFF) {
    out.push_back(static_cast<char>(cp - kEscapeBase));
  } else if (cp >= 0xD800 && cp <= 0xDFFF) {
    utf8::append(out, 0xFFFD);  // other lone surrogates (from "\ud800" escapes) cannot be UTF-8
  } else if (cp > 0x10FFFF) {
    utf8::append(out, 0xFFFD);
  } else {
    utf8::append(out, cp);
  }
}

std::string encode(std::u32string_view cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t c : cps) append_code_point(out, c);
  return out;
}

bool is_ascii(std::string_view s) {
  for (char c : s) {
    if (static_cast<uint8_t>(c) >= 0x80) return false;
  }
  return true;
}

size_t length(std::string_view s) {
  if (is_ascii(s)) return s.size();
  return decode(s).size();
}

bool is_space(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  if (c >= 0xD800 && c <= 0xDFFF) return false;
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(c));
  return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
         p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

bool is_alpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  auto cat = category(c);
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}

bool is_digit(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return category(c) == UTF8PROC_CATEGORY_ND;
}

bool is_alnum(char32_t c) {
  if (c < 0x80) return is_alpha(c) || is_digit(c);
  auto cat = category(c);
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

bool is_word_char(char32_t c) { return c == '_' || is_alnum(c); }

bool is_upper(char32_t c) { return category(c) == UTF8PROC_CATEGORY_LU || category(c) == UTF8PROC_CATEGORY_LT; }
bool is_lower(char32_t c) { return category(c) == UTF8PROC_CATEGORY_LL; }

bool is_printable(char32_t c) {
  if (c == ' ') return true;
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  switch (category(c)) {
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string upper(std::string_view s) {
  if (s.find("\xC3\x9F") == std::string_view::npos) return map_chars(s, to_upper_cp);
  // U+00DF has a two-letter uppercase (SpecialCasing), which simple case mapping lacks.
  std::string out;
  for (char32_t c : decode(s)) {
    if (c == 0xDF) {
      out += "SS";
    } else {
      append_code_point(out, to_upper_cp(c));
    }
  }
  return out;
}
std::string lower(std::string_view s) { return map_chars(s, to_lower_cp); }
std::string swapcase(std::string_view s) {
  return map_chars(s, [](char32_t c) { return is_upper(c) ? to_lower_cp(c) : is_lower(c) ? to_upper_cp(c) : c; });
}

std::string capitalize(std::string_view s) {
  std::u32string cps = decode(s);
  for (size_t i = 0; i < cps.size(); ++i) cps[i] = i == 0 ? to_title_cp(cps[i]) : to_lower_cp(cps[i]);
  return encode(cps);
}

std::string title(std::string_view s) {
  std::u32string cps = decode(s);
  bool prev_cased = false;
  for (char32_t& c : cps) {
    if (is_cased(c)) {
      c = prev_cased ? to_lower_cp(c) : to_title_cp(c);
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return encode(cps);
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  if (is_ascii(s) && (!chars || is_ascii(*chars))) {
    auto strip_this = [&](char c) {
      return chars ? chars->find(c) != std::string::npos : is_space(static_cast<unsigned char>(c));
    };
    size_t a = 0, b = s.size();
    if (left) {
      while (a < b && strip_this(s[a])) ++a;
    }
    if (right) {
      while (b > a && strip_this(s[b - 1])) --b;
    }
    return std::string(s.substr(a, b - a));
  }
  std::u32string cps = decode(s);
  std::u32string set = chars ? decode(*chars) : std::u32string();
  auto strip_this = [&](char32_t c) { return chars ? in_chars(c, set) : is_space(c); };
  size_t a = 0, b = cps.size();
  if (left) {
    while (a < b && strip_this(cps[a])) ++a;
  }
  if (right) {
    while (b > a && strip_this(cps[b - 1])) --b;
  }
  return encode(std::u32string_view(cps).substr(a, b - a));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  if (!sep) return split_whitespace(s, maxsplit, false);
  if (sep->empty()) throw_error(ErrorKind::kType, "empty separator");
  std::vector<std::string> parts;
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    size_t hit = s.find(*sep, pos);
    if (hit == std::string_view::npos) break;
    parts.emplace_back(s.substr(pos, hit - pos));
    pos = hit + sep->size();
  }
  parts.emplace_back(s.substr(pos));
  return parts;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  if (!sep) return split_whitespace(s, maxsplit, true);
  if (sep->empty()) throw_error(ErrorKind::kType, "empty separator");
  std::vector<std::string> parts;
  size_t end = s.size();
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    if (end < sep->size()) break;
    size_t hit = s.rfind(*sep, end - sep->size());
    if (hit == std::string_view::npos) break;
    parts.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
    end = hit;
  }
  parts.emplace_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::u32string cps = decode(s);
  std::vector<std::string> lines;
  size_t start = 0, i = 0;
  while (i < cps.size()) {
    char32_t c = cps[i];
    bool is_break = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
                    c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!is_break) {
      ++i;
      continue;
    }
    size_t eol = i;
    ++i;
    if (c == '\r' && i < cps.size() && cps[i] == '\n') ++i;
    lines.push_back(encode(std::u32string_view(cps).substr(start, (keepends ? i : eol) - start)));
    start = i;
  }
  if (start < cps.size()) lines.push_back(encode(std::u32string_view(cps).substr(start)));
  return lines;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `with` before every character and at the end.
    std::u32string cps = decode(s);
    int64_t done = 0;
    for (char32_t c : cps) {
      if (count < 0 || done < count) {
        out.append(with);
        ++done;
      }
      append_code_point(out, c);
    }
    if (count < 0 || done < count) out.append(with);
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(with);
    pos = hit + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

int64_t find(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end,
             bool reverse) {
  auto [a, b] = byte_range(s, start, end);
  if (b < a || b - a < sub.size()) return -1;
  std::string_view window = s.substr(a, b - a);
  size_t hit = reverse ? window.rfind(sub) : window.find(sub);
  if (hit == std::string_view::npos) return -1;
  return code_points_before(s, a + hit);
}

int64_t count(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end) {
  auto [a, b] = byte_range(s, start, end);
  if (b < a) return 0;
  std::string_view window = s.substr(a, b - a);
  if (sub.empty()) return static_cast<int64_t>(length(window)) + 1;
  int64_t n = 0;
  size_t pos = 0;
  while ((pos = window.find(sub, pos)) != std::string_view::npos) {
    ++n;
    pos += sub.size();
  }
  return n;
}

bool starts_with(std::string_view s, std::string_view prefix, std::optional<int64_t> start,
                 std::optional<int64_t> end) {
  auto [a, b] = byte_range(s, start, end);
  if (b < a) return false;
  return s.substr(a, b - a).substr(0, prefix.size()) == prefix && b - a >= prefix.size();
}

bool ends_with(std::string_view s, std::string_view suffix, std::optional<int64_t> start,
               std::optional<int64_t> end) {
  auto [a, b] = byte_range(s, start, end);
  if (b < a || b - a < suffix.size()) return false;
  return s.substr(b - suffix.size(), suffix.size()) == suffix;
}

std::optional<std::string> char_at(std::string_view s, int64_t i) {
  if (is_ascii(s)) {
    int64_t n = static_cast<int64_t>(s.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return std::nullopt;
    return std::string(1, s[static_cast<size_t>(i)]);
  }
  std::u32string cps = decode(s);
  int64_t n = static_cast<int64_t>(cps.size());
  if (i < 0) i += n;
  if (i < 0 || i >= n) return std::nullopt;
  std::string out;
  append_code_point(out, cps[static_cast<size_t>(i)]);
  return out;
}

SliceBounds slice_indices(int64_t len, std::optional<int64_t> start, std::optional<int64_t> stop,
                          std::optional<int64_t> step) {
  int64_t st = step.value_or(1);
  if (st == 0) throw_error(ErrorKind::kType, "slice step cannot be zero");
  if (st == INT64_MIN) st = -INT64_MAX;
  int64_t lower = st > 0 ? 0 : -1;
  int64_t upper = st > 0 ? len : len - 1;
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x = x < -len ? lower : x + len;
      if (x < lower) x = lower;
    } else if (x > upper) {
      x = upper;
    }
    return x;
  };
  int64_t a = clamp(start, st > 0 ? lower : upper);
  int64_t b = clamp(stop, st > 0 ? upper : lower);
  int64_t count = 0;
  if (st > 0 && b > a) count = (b - a - 1) / st + 1;
  if (st < 0 && a > b) count = (a - b - 1) / (-st) + 1;
  return {a, b, st, count};
}

std::string slice(std::string_view s, std::optional<int64_t> start, std::optional<int64_t> stop,
                  std::optional<int64_t> step) {
  std::u32string cps = decode(s);
  SliceBounds sb = slice_indices(static_cast<int64_t>(cps.size()), start, stop, step);
  std::u32string out;
  out.reserve(static_cast<size_t>(sb.count));
  for (int64_t k = 0, i = sb.start; k < sb.count; ++k, i += sb.step) out.push_back(cps[static_cast<size_t>(i)]);
  return encode(out);
}

std::string quote(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back(q);
  for (char32_t c : decode(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (is_printable(c)) {
      append_code_point(out, c);
    } else if (c < 0x100) {
      out += fmt::format("\\x{:02x}", static_cast<uint32_t>(c));
    } else if (c < 0x10000) {
      out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<uint32_t>(c));
    }
  }
  out.push_back(q);
  return out;
}

}  // namespace dflash::jinja::py

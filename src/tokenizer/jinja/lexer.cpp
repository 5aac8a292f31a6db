#include "tokenizer/jinja/lexer.h"

#include <charconv>
#include <cstdlib>

#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/py_string.h"

namespace dflash::jinja {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<uint8_t>(c) >= 0x80;
}
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Jinja reads the source with universal newlines and drops one trailing newline.
std::string normalize_newlines(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out.push_back(src[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  Lexer(std::string src, const LexerLimits& limits) : src_(std::move(src)), limits_(limits) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    size_t n = src_.size();
    while (pos_ < n) {
      size_t p = find_tag_start(pos_);
      if (p == std::string::npos) {
        emit_data(src_.substr(pos_), pos_);
        pos_ = n;
        break;
      }
      char kind = src_[p + 1];
      size_t raw_end = 0;
      bool raw = kind == '%' && match_raw_begin(p, raw_end);
      char sign = (p + 2 < n && (src_[p + 2] == '-' || src_[p + 2] == '+')) ? src_[p + 2] : 0;
      std::string text = src_.substr(pos_, p - pos_);
      strip_before_tag(text, sign, kind != '{');
      emit_data(std::move(text), pos_);
      if (raw) {
        lex_raw(raw_end);
      } else if (kind == '#') {
        lex_comment(p);
      } else {
        lex_tag(p, kind == '{', sign);
      }
    }
    Token eof;
    eof.type = TokenType::kEof;
    set_position(eof, src_.size());
    tokens_.push_back(std::move(eof));
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& message) {
    auto [line, col] = position(at);
    throw Error(ErrorKind::kSyntax, message, line, col);
  }

  std::pair<int, int> position(size_t at) const {
    size_t lo = 0, hi = line_starts_.size();
    while (hi - lo > 1) {
      size_t mid = (lo + hi) / 2;
      if (line_starts_[mid] <= at) lo = mid; else hi = mid;
    }
    return {static_cast<int>(lo + 1), static_cast<int>(at - line_starts_[lo] + 1)};
  }

  void set_position(Token& t, size_t at) const {
    auto [line, col] = position(at);
    t.line = line;
    t.column = col;
  }

  void push(Token t) {
    if (tokens_.size() >= limits_.max_tokens) fail(pos_, "template has too many tokens");
    tokens_.push_back(std::move(t));
  }

  void push_simple(TokenType type, size_t at, std::string text = {}) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    set_position(t, at);
    push(std::move(t));
  }

  void emit_data(std::string text, size_t at) {
    if (text.empty()) return;
    push_simple(TokenType::kData, at, std::move(text));
  }

  size_t find_tag_start(size_t from) const {
    size_t p = from;
    while ((p = src_.find('{', p)) != std::string::npos) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
      ++p;
    }
    return std::string::npos;
  }

  bool starts_with(size_t at, std::string_view s) const { return src_.compare(at, s.size(), s) == 0; }

  size_t skip_ws(size_t at) const {
    while (at < src_.size() && is_ws(src_[at])) ++at;
    return at;
  }

  // "-" strips all whitespace before a tag; otherwise lstrip_blocks removes the spaces and tabs that
  // precede a block or comment tag when only they stand between the tag and the start of its line.
  void strip_before_tag(std::string& text, char sign, bool lstrip_applies) {
    if (sign == '-') {
      text = py::strip(text, std::nullopt, false, true);
      return;
    }
    if (sign == '+' || !lstrip_applies) return;
    size_t nl = text.rfind('\n');
    size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting_) return;
    if (l_pos == text.size()) return;
    for (size_t i = l_pos; i < text.size(); ++i) {
      if (!is_ws(text[i])) return;
    }
    text.resize(l_pos);
  }

  // {%(-|+|)\s*raw\s*(-%}\s*|%})
  bool match_raw_begin(size_t p, size_t& end) const {
    size_t i = p + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    i = skip_ws(i);
    if (!starts_with(i, "raw")) return false;
    i = skip_ws(i + 3);
    if (starts_with(i, "-%}")) {
      end = skip_ws(i + 3);
      return true;
    }
    if (starts_with(i, "%}")) {
      end = i + 2;
      return true;
    }
    return false;
  }

  void lex_raw(size_t body_start) {
    line_starting_ = body_start > 0 && src_[body_start - 1] == '\n';
    size_t p = body_start;
    while ((p = src_.find("{%", p)) != std::string::npos) {
      size_t i = p + 2;
      char sign = 0;
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) sign = src_[i++];
      i = skip_ws(i);
      if (!starts_with(i, "endraw")) {
        ++p;
        continue;
      }
      i = skip_ws(i + 6);
      size_t end;
      if (starts_with(i, "+%}")) {
        end = i + 3;
      } else if (starts_with(i, "-%}")) {
        end = skip_ws(i + 3);
      } else if (starts_with(i, "%}")) {
        end = i + 2;
        if (end < src_.size() && src_[end] == '\n') ++end;
      } else {
        ++p;
        continue;
      }
      std::string body = src_.substr(body_start, p - body_start);
      strip_before_tag(body, sign, true);
      emit_data(std::move(body), body_start);
      pos_ = end;
      line_starting_ = src_[end - 1] == '\n';
      return;
    }
    fail(body_start, "missing end of raw directive");
  }

  void lex_comment(size_t p) {
    size_t i = p + 2;
    while (i < src_.size()) {
      if (starts_with(i, "+#}")) {
        pos_ = i + 3;
        line_starting_ = false;
        return;
      }
      if (starts_with(i, "-#}")) {
        pos_ = skip_ws(i + 3);
        line_starting_ = src_[pos_ - 1] == '\n';
        return;
      }
      if (starts_with(i, "#}")) {
        pos_ = i + 2;
        if (pos_ < src_.size() && src_[pos_] == '\n') ++pos_;
        line_starting_ = src_[pos_ - 1] == '\n';
        return;
      }
      ++i;
    }
    fail(p, "missing end of comment tag");
  }

  void lex_tag(size_t p, bool is_var, char sign) {
    push_simple(is_var ? TokenType::kVarBegin : TokenType::kBlockBegin, p);
    size_t i = p + 2 + (sign ? 1 : 0);
    std::vector<char> balance;
    const size_t n = src_.size();
    while (true) {
      if (i >= n) fail(p, is_var ? "unexpected end of template, expected end of print statement '}}'"
                                 : "unexpected end of template, expected end of block tag '%}'");
      if (balance.empty()) {
        if (is_var) {
          if (starts_with(i, "-}}")) {
            push_simple(TokenType::kVarEnd, i);
            pos_ = skip_ws(i + 3);
            line_starting_ = src_[pos_ - 1] == '\n';
            return;
          }
          if (starts_with(i, "}}")) {
            push_simple(TokenType::kVarEnd, i);
            pos_ = i + 2;
            line_starting_ = false;
            return;
          }
        } else {
          if (starts_with(i, "+%}")) {
            push_simple(TokenType::kBlockEnd, i);
            pos_ = i + 3;
            line_starting_ = false;
            return;
          }
          if (starts_with(i, "-%}")) {
            push_simple(TokenType::kBlockEnd, i);
            pos_ = skip_ws(i + 3);
            line_starting_ = src_[pos_ - 1] == '\n';
            return;
          }
          if (starts_with(i, "%}")) {
            push_simple(TokenType::kBlockEnd, i);
            pos_ = i + 2;
            if (pos_ < n && src_[pos_] == '\n') ++pos_;  // trim_blocks
            line_starting_ = src_[pos_ - 1] == '\n';
            return;
          }
        }
      }
      char c = src_[i];
      if (is_ws(c)) {
        ++i;
        continue;
      }
      if (is_digit(c)) {
        i = lex_number(i);
        continue;
      }
      if (is_name_start(c)) {
        size_t j = i;
        while (j < n && is_name_char(src_[j])) ++j;
        push_simple(TokenType::kName, i, src_.substr(i, j - i));
        i = j;
        continue;
      }
      if (c == '\'' || c == '"') {
        i = lex_string(i);
        continue;
      }
      i = lex_operator(i, balance);
    }
  }

  // (\d+_)*\d+ : digits with single underscores between them. Returns the end, or `at` if none.
  size_t scan_digits(size_t at, bool hex = false, bool oct = false, bool bin = false) const {
    auto ok = [&](char c) {
      if (hex) return hex_value(c) >= 0;
      if (oct) return c >= '0' && c <= '7';
      if (bin) return c == '0' || c == '1';
      return is_digit(c);
    };
    size_t i = at;
    if (i >= src_.size() || !ok(src_[i])) return at;
    while (i < src_.size()) {
      if (ok(src_[i])) {
        ++i;
      } else if (src_[i] == '_' && i + 1 < src_.size() && ok(src_[i + 1])) {
        ++i;
      } else {
        break;
      }
    }
    return i;
  }

  size_t scan_exponent(size_t at) const {
    if (at >= src_.size() || (src_[at] != 'e' && src_[at] != 'E')) return at;
    size_t i = at + 1;
    if (i < src_.size() && (src_[i] == '+' || src_[i] == '-')) ++i;
    size_t j = scan_digits(i);
    return j == i ? at : j;
  }

  static std::string without_underscores(std::string_view s) {
    std::string out;
    for (char c : s) {
      if (c != '_') out.push_back(c);
    }
    return out;
  }

  size_t lex_number(size_t at) {
    const size_t n = src_.size();
    size_t int_end = scan_digits(at);
    bool after_dot = at > 0 && src_[at - 1] == '.';
    if (!after_dot) {
      size_t end = 0;
      // fraction + exponent, then exponent alone, then fraction alone (the float regex's alternatives)
      if (int_end < n && src_[int_end] == '.') {
        size_t frac_end = scan_digits(int_end + 1);
        if (frac_end > int_end + 1) {
          size_t exp_end = scan_exponent(frac_end);
          end = exp_end > frac_end ? exp_end : frac_end;
        }
      }
      if (end == 0) {
        size_t exp_end = scan_exponent(int_end);
        if (exp_end > int_end) end = exp_end;
      }
      if (end != 0) {
        Token t;
        t.type = TokenType::kFloat;
        t.text = src_.substr(at, end - at);
        t.float_value = std::strtod(without_underscores(t.text).c_str(), nullptr);
        set_position(t, at);
        push(std::move(t));
        return end;
      }
    }
    // Integers: 0b / 0o / 0x prefixes, [1-9](_?\d)*, 0(_?0)*
    int base = 10;
    size_t digits_at = at, end = int_end;
    if (src_[at] == '0' && at + 1 < n) {
      char p = static_cast<char>(src_[at + 1] | 0x20);
      if (p == 'x' || p == 'o' || p == 'b') {
        base = p == 'x' ? 16 : p == 'o' ? 8 : 2;
        digits_at = at + 2;
        if (digits_at < n && src_[digits_at] == '_') ++digits_at;
        end = scan_digits(digits_at, base == 16, base == 8, base == 2);
        if (end == digits_at) {
          base = 10;
          digits_at = at;
          end = at + 1;
        }
      } else {
        end = at + 1;  // "0" (then "0_0" forms); a following digit starts a new token
        while (end + 1 < n && (src_[end] == '0' || (src_[end] == '_' && src_[end + 1] == '0'))) ++end;
        if (end < n && src_[end] == '0') ++end;
      }
    }
    std::string digits = without_underscores(src_.substr(digits_at, end - digits_at));
    Token t;
    t.type = TokenType::kInteger;
    t.text = src_.substr(at, end - at);
    uint64_t v = 0;
    auto res = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
    if (res.ec != std::errc() || v > static_cast<uint64_t>(INT64_MAX)) fail(at, "integer literal too large");
    t.int_value = static_cast<int64_t>(v);
    set_position(t, at);
    push(std::move(t));
    return end;
  }

  size_t lex_string(size_t at) {
    const char q = src_[at];
    const size_t n = src_.size();
    std::u32string out;
    size_t i = at + 1;
    std::u32string raw;
    // Find the closing quote first (the regex: backslash escapes anything, including newlines).
    size_t j = i;
    while (j < n && src_[j] != q) j += src_[j] == '\\' ? 2 : 1;
    if (j >= n) fail(at, "unexpected end of string literal");
    std::u32string cps = py::decode(std::string_view(src_).substr(i, j - i));
    for (size_t k = 0; k < cps.size(); ++k) {
      char32_t c = cps[k];
      if (c != '\\' || k + 1 >= cps.size()) {
        out.push_back(c);
        continue;
      }
      char32_t e = cps[++k];
      switch (e) {
        case '\n': break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back(7); break;
        case 'b': out.push_back(8); break;
        case 'f': out.push_back(12); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back(11); break;
        case 'x':
        case 'u':
        case 'U': {
          size_t width = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t v = 0;
          for (size_t d = 0; d < width; ++d) {
            if (k + 1 >= cps.size() || cps[k + 1] >= 0x80 || hex_value(static_cast<char>(cps[k + 1])) < 0) {
              fail(at, fmt::format("truncated \\{}{} escape in string literal", static_cast<char>(e),
                                   std::string(width, 'X')));
            }
            v = v * 16 + static_cast<char32_t>(hex_value(static_cast<char>(cps[++k])));
          }
          if (v > 0x10FFFF) fail(at, "illegal Unicode character in string literal");
          out.push_back(v);
          break;
        }
        case 'N': fail(at, "\\N{...} escapes are not supported in string literals");
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = e - '0';
            for (int d = 0; d < 2 && k + 1 < cps.size() && cps[k + 1] >= '0' && cps[k + 1] <= '7'; ++d) {
              v = v * 8 + (cps[++k] - '0');
            }
            out.push_back(v);
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    Token t;
    t.type = TokenType::kString;
    t.text = py::encode(out);
    set_position(t, at);
    push(std::move(t));
    return j + 1;
  }

  size_t lex_operator(size_t at, std::vector<char>& balance) {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
    for (std::string_view op : kTwo) {
      if (starts_with(at, op)) {
        push_simple(TokenType::kOperator, at, std::string(op));
        return at + 2;
      }
    }
    char c = src_[at];
    static constexpr std::string_view kOne = "+-*/%~[](){}<>=.:|,;";
    if (kOne.find(c) == std::string_view::npos) {
      fail(at, fmt::format("unexpected char {} at {}", py::quote(std::string(1, c)), at));
    }
    if (c == '(' || c == '[' || c == '{') {
      if (balance.size() >= 512) fail(at, "brackets nested too deeply");
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) fail(at, fmt::format("unexpected '{}'", c));
      if (balance.back() != c) fail(at, fmt::format("unexpected '{}', expected '{}'", c, balance.back()));
      balance.pop_back();
    }
    push_simple(TokenType::kOperator, at, std::string(1, c));
    return at + 1;
  }

  std::string src_;
  LexerLimits limits_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  bool line_starting_ = true;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexerLimits& limits) {
  if (source.size() > limits.max_source_bytes) {
    throw_error(ErrorKind::kLimit, "template is {} bytes; the limit is {}", source.size(), limits.max_source_bytes);
  }
  return Lexer(normalize_newlines(source), limits).run();
}

}  // namespace dflash::jinja

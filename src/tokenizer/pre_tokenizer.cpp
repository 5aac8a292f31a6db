#include "tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace dflash {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof(buf)) < 0) return fmt::format("PCRE2 error {}", code);
  return std::string(reinterpret_cast<const char*>(buf));
}

struct MatchData {
  explicit MatchData(const pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {}
  ~MatchData() { pcre2_match_data_free(md); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
  pcre2_match_data* md;
};

// Unicode White_Space, which is what \s means in Oniguruma (HF tokenizers' regex engine). PCRE2's \s
// in UCP mode also matches U+180E MONGOLIAN VOWEL SEPARATOR, which is not White_Space since Unicode 6.3.
constexpr std::string_view kWhiteSpace =
    "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

// Spells \s and \S out as White_Space classes (\S inside a character class stays: PCRE2 cannot
// subtract inside a class, and no known pre-tokenizer uses it). \Q...\E literals are copied as they are.
std::string with_unicode_white_space(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char n = pattern[i + 1];
      if (n == 'Q') {  // literal up to \E
        size_t end = pattern.find("\\E", i + 2);
        size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(i, stop - i));
        i = stop - 1;
        continue;
      }
      if (n == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
    } else if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      size_t end = pattern.find(":]", i + 2);  // POSIX class [:alpha:] inside a class
      if (end != std::string_view::npos) {
        out.append(pattern.substr(i + 1, end + 2 - (i + 1)));
        i = end + 1;
      }
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

}  // namespace

struct RegexSplitter::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

Result<RegexSplitter> RegexSplitter::compile(std::string_view pattern) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // UTF: code points, not bytes; UCP: \s, \w, \d and case folding use Unicode properties, as
  // Oniguruma (HF tokenizers) does. The subject is checked for valid UTF-8 by the caller.
  std::string rewritten = with_unicode_white_space(pattern);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_offset, nullptr);
  if (code == nullptr)
    return invalid_argument("pre-tokenizer regex does not compile: {} (regex: {})", pcre2_message(err), pattern);
  auto c = std::make_shared<Code>();
  c->code = code;
  c->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  RegexSplitter s;
  s.pattern_ = std::string(pattern);
  s.code_ = std::move(c);
  return s;
}

Status RegexSplitter::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return Status();
  MatchData data(code_->code);
  if (data.md == nullptr) return Status(ErrorCode::kOutOfMemory, "pre-tokenizer: cannot allocate match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap_start = 0;  // start of text not yet emitted
  size_t pos = 0;        // where the next search starts
  while (pos < text.size()) {
    int rc = pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, data.md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // very long runs: retry with the interpreter (heap frames)
      rc = pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data.md,
                       nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      return invalid_argument("pre-tokenizer regex failed at byte {}: {}", pos, pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.md);
    size_t start = ov[0], end = ov[1];
    if (end <= start) {
      // Empty match: nothing to isolate; move on by one code point.
      pos = start + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (start > gap_start) out.push_back(text.substr(gap_start, start - gap_start));
    out.push_back(text.substr(start, end - start));
    gap_start = pos = end;
  }
  if (gap_start < text.size()) out.push_back(text.substr(gap_start));
  return Status();
}

Result<PreTokenizer> PreTokenizer::create(const std::vector<std::string>& patterns) {
  PreTokenizer p;
  for (const std::string& pattern : patterns) {
    DF_ASSIGN_OR_RETURN(RegexSplitter s, RegexSplitter::compile(pattern));
    p.splitters_.push_back(std::move(s));
  }
  return p;
}

Status PreTokenizer::split(std::string_view text, std::vector<std::string_view>& words) const {
  if (text.empty()) return Status();
  if (splitters_.empty()) {
    words.push_back(text);
    return Status();
  }
  std::vector<std::string_view> current{text};
  std::vector<std::string_view> next;
  for (size_t i = 0; i < splitters_.size(); ++i) {
    std::vector<std::string_view>& target = (i + 1 == splitters_.size()) ? words : next;
    for (std::string_view piece : current) DF_RETURN_IF_ERROR(splitters_[i].split(piece, target));
    if (&target == &next) {
      current.swap(next);
      next.clear();
    }
  }
  return Status();
}

}  // namespace dflash

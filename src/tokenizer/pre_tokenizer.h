// Pre-tokenization: splits text into words with the family's regexes (PCRE2, UTF + Unicode properties).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dflash {

// One compiled split regex with HF's "Isolated" behaviour: every match is a piece, and so is every
// stretch of text between matches. Safe to use from several threads at once.
class RegexSplitter {
 public:
  static Result<RegexSplitter> compile(std::string_view pattern);

  // Appends the pieces of `text` (views into it, none empty, covering it in order) to `out`.
  Status split(std::string_view text, std::vector<std::string_view>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::string pattern_;
  std::shared_ptr<const Code> code_;
};

// The regexes of a vocabulary applied in order, each splitting the pieces of the one before.
class PreTokenizer {
 public:
  static Result<PreTokenizer> create(const std::vector<std::string>& patterns);

  // Splits `text` into words; text with no regexes is one word (none when empty).
  Status split(std::string_view text, std::vector<std::string_view>& words) const;

 private:
  std::vector<RegexSplitter> splitters_;
};

}  // namespace dflash

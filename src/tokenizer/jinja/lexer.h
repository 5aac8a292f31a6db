// Jinja2 lexer with the environment transformers uses for chat templates: trim_blocks=True,
// lstrip_blocks=True, keep_trailing_newline=False, "-"/"+" whitespace control, comments and raw blocks.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dflash::jinja {

enum class TokenType {
  kData,        // literal text (whitespace control already applied)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,      // text holds the decoded value
  kInteger,
  kFloat,
  kOperator,    // text holds the operator: + - * / // % ** ~ == != < <= > >= = . : | , ( ) [ ] { }
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int column = 1;
};

struct LexerLimits {
  size_t max_source_bytes = size_t{4} << 20;
  size_t max_tokens = size_t{2} << 20;
};

// Splits template source into tokens. Throws jinja::Error (kSyntax, with line and column).
std::vector<Token> tokenize(std::string_view source, const LexerLimits& limits = {});

}  // namespace dflash::jinja

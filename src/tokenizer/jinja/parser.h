// Recursive-descent parser from tokens to the syntax tree, following Jinja2's grammar and precedence.
#pragma once

#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace dflash::jinja {

struct ParserLimits {
  int max_depth = 400;  // nesting of expressions and blocks together
};

// Throws jinja::Error (kSyntax, with line and column) on malformed input.
Body parse(const std::vector<Token>& tokens, const ParserLimits& limits = {});

}  // namespace dflash::jinja

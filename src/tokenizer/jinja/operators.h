// Python's operators on Jinja values: arithmetic (+ - * / // % **), string concatenation (~),
// unary minus/plus and membership (in), with Python's result types and error messages.
#pragma once

#include <string_view>

#include "tokenizer/jinja/value.h"

namespace dflash::jinja {

// `op` is one of + - * / // % ** ~ . Throws jinja::Error for unsupported operand types.
Value binary_op(Interpreter& in, std::string_view op, const Value& a, const Value& b);
Value unary_minus(const Value& v);
Value unary_plus(const Value& v);
// `item in container`.
bool contains(const Value& container, const Value& item);

}  // namespace dflash::jinja

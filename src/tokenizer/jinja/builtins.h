// The builtin filters, tests, globals and Python methods of the engine, and the argument binding
// they share. Each table lives in the file named for it (filters.cpp, builtin_tests.cpp, ...).
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace dflash::jinja {

using FilterFn = Value (*)(Interpreter&, const Value& input, CallArgs& args);
using TestFn = bool (*)(Interpreter&, const Value& input, CallArgs& args);

const FilterFn* find_filter(std::string_view name);
const TestFn* find_test(std::string_view name);

// Globals every template sees: range, dict, namespace, raise_exception, strftime_now, cycler, joiner.
void add_globals(Dict& globals);

// `object.name` for str/list/tuple/dict methods: a bound callable, or nullopt when `name` is not a
// method of that type. Mutating methods (list.append, dict.update, ...) come back as an undefined
// value that fails when called, as jinja2's ImmutableSandboxedEnvironment does.
std::optional<Value> bind_method(const Value& object, const std::string& name);

// printf-style formatting (the `format` filter and the `%` operator on strings).
std::string percent_format(Interpreter& in, const std::string& format, const Value& args);
// str.format() with the format mini-language for str, int and float fields.
std::string str_format(Interpreter& in, const std::string& format, CallArgs& args);

// Python-style parameter binding: `names` in order; positional then keyword arguments. Throws a
// TypeError-like error for too many positional arguments, unknown or repeated keywords.
std::vector<std::optional<Value>> bind_args(std::string_view fn, CallArgs& args,
                                            std::initializer_list<std::string_view> names);

// Argument conversions (errors name the function and parameter).
int64_t to_int_arg(const Value& v, std::string_view fn, std::string_view param);
std::string to_str_arg(const Value& v, std::string_view fn, std::string_view param);

}  // namespace dflash::jinja

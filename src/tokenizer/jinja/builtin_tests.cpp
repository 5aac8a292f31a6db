// Jinja2's builtin tests (`x is defined`, `x is divisibleby 3`, ...), with Python's type notions:
// bool is a number but not an integer, strings and dicts are sequences, undefined is iterable.
#include <cmath>
#include <unordered_map>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/operators.h"
#include "tokenizer/jinja/py_string.h"

namespace dflash::jinja {
namespace {

const Value& one_arg(CallArgs& a, std::string_view test) {
  if (a.positional.size() == 1 && a.keyword.empty()) return a.positional[0];
  if (a.positional.empty() && a.keyword.size() == 1) return a.keyword[0].second;
  throw_error(ErrorKind::kType, "test '{}' takes exactly one argument", test);
}

void no_args(CallArgs& a, std::string_view test) {
  if (!a.positional.empty() || !a.keyword.empty()) {
    throw_error(ErrorKind::kType, "test '{}' takes no arguments", test);
  }
}

int64_t int_mod(const Value& v, const Value& m) {
  if (v.is_undefined()) throw Error(ErrorKind::kUndefined, v.undefined_message());
  if (!v.is_number() || !m.is_number()) {
    throw_error(ErrorKind::kType, "unsupported operand type(s) for %: '{}' and '{}'", type_name(v), type_name(m));
  }
  if (v.is_integral() && m.is_integral()) {
    if (m.as_int() == 0) throw_error(ErrorKind::kType, "integer modulo by zero");
    if (m.as_int() == -1) return 0;
    return v.as_int() % m.as_int();
  }
  double d = m.as_double();
  if (d == 0) throw_error(ErrorKind::kType, "float modulo");
  return std::fmod(v.as_double(), d) == 0 ? 0 : 1;
}

bool t_defined(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "defined"); return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "undefined"); return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "none"); return v.is_none(); }
bool t_boolean(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "boolean"); return v.is_bool(); }
bool t_true(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "true"); return v.is_bool() && v.as_bool(); }
bool t_false(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "false"); return v.is_bool() && !v.as_bool(); }
bool t_integer(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "integer"); return v.is_int(); }
bool t_float(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "float"); return v.is_float(); }
bool t_number(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "number"); return v.is_number(); }
bool t_string(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "string"); return v.is_string(); }
bool t_mapping(Interpreter&, const Value& v, CallArgs& a) { no_args(a, "mapping"); return v.is_dict(); }
bool t_callable(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "callable");
  return v.is_callable() || v.is_undefined();
}
bool t_iterable(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "iterable");
  return v.is_undefined() || v.is_string() || v.is_list_or_tuple() || v.is_dict();
}
bool t_sequence(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "sequence");
  return v.is_undefined() || v.is_string() || v.is_list_or_tuple() || v.is_dict();
}
bool t_escaped(Interpreter&, const Value&, CallArgs& a) { no_args(a, "escaped"); return false; }
bool t_odd(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "odd");
  return int_mod(v, Value::integer(2)) != 0;
}
bool t_even(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "even");
  return int_mod(v, Value::integer(2)) == 0;
}
bool t_divisibleby(Interpreter&, const Value& v, CallArgs& a) {
  return int_mod(v, one_arg(a, "divisibleby")) == 0;
}
bool t_eq(Interpreter&, const Value& v, CallArgs& a) { return equals(v, one_arg(a, "eq")); }
bool t_ne(Interpreter&, const Value& v, CallArgs& a) { return !equals(v, one_arg(a, "ne")); }
bool t_lt(Interpreter&, const Value& v, CallArgs& a) { return compare(v, one_arg(a, "lt"), "<") < 0; }
bool t_le(Interpreter&, const Value& v, CallArgs& a) { return compare(v, one_arg(a, "le"), "<=") <= 0; }
bool t_gt(Interpreter&, const Value& v, CallArgs& a) { return compare(v, one_arg(a, "gt"), ">") > 0; }
bool t_ge(Interpreter&, const Value& v, CallArgs& a) { return compare(v, one_arg(a, "ge"), ">=") >= 0; }
bool t_in(Interpreter&, const Value& v, CallArgs& a) { return contains(one_arg(a, "in"), v); }
bool t_sameas(Interpreter&, const Value& v, CallArgs& a) { return v.same_object(one_arg(a, "sameas")); }

bool t_lower(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "lower");
  bool cased = false;
  for (char32_t c : py::decode(to_str(v))) {
    if (py::is_upper(c)) return false;
    if (py::is_lower(c)) cased = true;
  }
  return cased;
}

bool t_upper(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "upper");
  bool cased = false;
  for (char32_t c : py::decode(to_str(v))) {
    if (py::is_lower(c)) return false;
    if (py::is_upper(c)) cased = true;
  }
  return cased;
}

bool t_filter(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "filter");
  return v.is_string() && find_filter(v.as_string()) != nullptr;
}

bool t_test(Interpreter&, const Value& v, CallArgs& a) {
  no_args(a, "test");
  return v.is_string() && find_test(v.as_string()) != nullptr;
}

const std::unordered_map<std::string_view, TestFn>& test_table() {
  static const std::unordered_map<std::string_view, TestFn> table = {
      {"defined", t_defined},   {"undefined", t_undefined},     {"none", t_none},
      {"boolean", t_boolean},   {"true", t_true},               {"false", t_false},
      {"integer", t_integer},   {"float", t_float},             {"number", t_number},
      {"string", t_string},     {"mapping", t_mapping},         {"callable", t_callable},
      {"iterable", t_iterable}, {"sequence", t_sequence},       {"escaped", t_escaped},
      {"odd", t_odd},           {"even", t_even},               {"divisibleby", t_divisibleby},
      {"eq", t_eq},             {"equalto", t_eq},              {"==", t_eq},
      {"ne", t_ne},             {"!=", t_ne},                   {"lt", t_lt},
      {"lessthan", t_lt},       {"<", t_lt},                    {"le", t_le},
      {"<=", t_le},             {"gt", t_gt},                   {"greaterthan", t_gt},
      {">", t_gt},              {"ge", t_ge},                   {">=", t_ge},
      {"in", t_in},             {"sameas", t_sameas},           {"lower", t_lower},
      {"upper", t_upper},       {"filter", t_filter},           {"test", t_test},
  };
  return table;
}

}  // namespace

const TestFn* find_test(std::string_view name) {
  const auto& t = test_table();
  auto it = t.find(name);
  return it == t.end() ? nullptr : &it->second;
}

}  // namespace dflash::jinja

// Python methods of str, list, tuple and dict that templates call (`s.strip()`, `d.items()`, ...).
// Mutating methods are refused the way jinja2's ImmutableSandboxedEnvironment refuses them.
#include <unordered_set>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/operators.h"
#include "tokenizer/jinja/py_string.h"

namespace dflash::jinja {
namespace {

using Args = std::vector<std::optional<Value>>;

std::optional<int64_t> opt_int(const std::optional<Value>& v, std::string_view fn, std::string_view param) {
  if (!v || v->is_none()) return std::nullopt;
  return to_int_arg(*v, fn, param);
}

std::optional<std::string> opt_chars(const std::optional<Value>& v, std::string_view fn) {
  if (!v || v->is_none()) return std::nullopt;
  return to_str_arg(*v, fn, "chars");
}

Value string_list(std::vector<std::string> parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return Value::list(std::move(out));
}

// startswith/endswith accept a string or a tuple of strings.
bool affix_match(const std::string& s, const Value& affix, std::optional<int64_t> start, std::optional<int64_t> end,
                 bool prefix, std::string_view fn) {
  if (affix.is_tuple()) {
    for (const Value& a : affix.items()) {
      if (affix_match(s, a, start, end, prefix, fn)) return true;
    }
    return false;
  }
  if (!affix.is_string()) {
    throw_error(ErrorKind::kType, "{} first arg must be str or a tuple of str, not {}", fn, type_name(affix));
  }
  return prefix ? py::starts_with(s, affix.as_string(), start, end) : py::ends_with(s, affix.as_string(), start, end);
}

bool all_chars(const std::string& s, bool (*pred)(char32_t)) {
  if (s.empty()) return false;
  for (char32_t c : py::decode(s)) {
    if (!pred(c)) return false;
  }
  return true;
}

Value call_str_method(Interpreter& in, const std::string& s, const std::string& name, CallArgs& a) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Args p = bind_args(name, a, {"chars"});
    return Value::string(py::strip(s, opt_chars(p[0], name), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    Args p = bind_args(name, a, {"sep", "maxsplit"});
    std::optional<std::string> sep;
    if (p[0] && !p[0]->is_none()) sep = to_str_arg(*p[0], name, "sep");
    int64_t maxsplit = p[1] ? to_int_arg(*p[1], name, "maxsplit") : -1;
    auto parts = name == "split" ? py::split(s, sep, maxsplit) : py::rsplit(s, sep, maxsplit);
    in.check_items(parts.size());
    return string_list(std::move(parts));
  }
  if (name == "splitlines") {
    Args p = bind_args(name, a, {"keepends"});
    return string_list(py::splitlines(s, p[0] && truthy(*p[0])));
  }
  if (name == "startswith" || name == "endswith") {
    Args p = bind_args(name, a, {"prefix", "start", "end"});
    if (!p[0]) throw_error(ErrorKind::kType, "{}() takes at least 1 argument (0 given)", name);
    return Value::boolean(
        affix_match(s, *p[0], opt_int(p[1], name, "start"), opt_int(p[2], name, "end"), name == "startswith", name));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "swapcase" ||
      name == "casefold") {
    bind_args(name, a, {});
    if (name == "upper") return Value::string(py::upper(s));
    if (name == "lower" || name == "casefold") return Value::string(py::lower(s));
    if (name == "title") return Value::string(py::title(s));
    if (name == "capitalize") return Value::string(py::capitalize(s));
    return Value::string(py::swapcase(s));
  }
  if (name == "replace") {
    Args p = bind_args(name, a, {"old", "new", "count"});
    if (!p[0] || !p[1]) throw_error(ErrorKind::kType, "replace() takes at least 2 arguments");
    std::string old = to_str_arg(*p[0], name, "old"), with = to_str_arg(*p[1], name, "new");
    int64_t count = p[2] ? to_int_arg(*p[2], name, "count") : -1;
    if (with.size() > old.size()) {
      uint64_t hits = old.empty() ? py::length(s) + 1 : static_cast<uint64_t>(py::count(s, old, {}, {}));
      in.charge_bytes(s.size() + hits * (with.size() - old.size()));
    }
    return Value::string(py::replace(s, old, with, count));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    Args p = bind_args(name, a, {"sub", "start", "end"});
    if (!p[0]) throw_error(ErrorKind::kType, "{}() takes at least 1 argument (0 given)", name);
    std::string sub = to_str_arg(*p[0], name, "sub");
    auto start = opt_int(p[1], name, "start"), end = opt_int(p[2], name, "end");
    if (name == "count") return Value::integer(py::count(s, sub, start, end));
    int64_t r = py::find(s, sub, start, end, name == "rfind" || name == "rindex");
    if (r < 0 && (name == "index" || name == "rindex")) throw_error(ErrorKind::kType, "substring not found");
    return Value::integer(r);
  }
  if (name == "join") {
    Args p = bind_args(name, a, {"iterable"});
    if (!p[0]) throw_error(ErrorKind::kType, "join() takes exactly one argument (0 given)");
    std::string out;
    bool first = true;
    size_t i = 0;
    for (const Value& item : iterate(*p[0])) {
      if (!item.is_string()) {
        throw_error(ErrorKind::kType, "sequence item {}: expected str instance, {} found", i, type_name(item));
      }
      if (!first) out += s;
      first = false;
      out += item.as_string();
      ++i;
      if (out.size() > in.limits().max_output_bytes) in.charge_bytes(out.size());
    }
    in.charge_bytes(out.size());
    return Value::string(std::move(out));
  }
  if (name == "format") return Value::string(str_format(in, s, a));
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") {
    bind_args(name, a, {});
    return Value::boolean(all_chars(s, py::is_digit));
  }
  if (name == "isalpha") {
    bind_args(name, a, {});
    return Value::boolean(all_chars(s, py::is_alpha));
  }
  if (name == "isalnum") {
    bind_args(name, a, {});
    return Value::boolean(all_chars(s, py::is_alnum));
  }
  if (name == "isspace") {
    bind_args(name, a, {});
    return Value::boolean(all_chars(s, py::is_space));
  }
  if (name == "isupper" || name == "islower") {
    bind_args(name, a, {});
    bool cased = false;
    for (char32_t c : py::decode(s)) {
      if (name == "isupper" ? py::is_lower(c) : py::is_upper(c)) return Value::boolean(false);
      if (name == "isupper" ? py::is_upper(c) : py::is_lower(c)) cased = true;
    }
    return Value::boolean(cased);
  }
  if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
    Args p = name == "zfill" ? bind_args(name, a, {"width"}) : bind_args(name, a, {"width", "fillchar"});
    if (!p[0]) throw_error(ErrorKind::kType, "{}() takes at least 1 argument (0 given)", name);
    int64_t width = to_int_arg(*p[0], name, "width");
    std::string fill = name != "zfill" && p.size() > 1 && p[1] ? to_str_arg(*p[1], name, "fillchar") : " ";
    int64_t len = static_cast<int64_t>(py::length(s));
    if (width <= len) return Value::string(s);
    in.charge_bytes(static_cast<size_t>(width) * fill.size());
    int64_t total = width - len, left;
    if (name == "zfill") {
      std::string body = s, sign;
      if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
        sign = body.substr(0, 1);
        body.erase(0, 1);
      }
      return Value::string(sign + std::string(static_cast<size_t>(total), '0') + body);
    }
    if (name == "ljust") left = 0;
    else if (name == "rjust") left = total;
    else left = total / 2 + (total & width & 1);
    std::string out;
    for (int64_t i = 0; i < left; ++i) out += fill;
    out += s;
    for (int64_t i = 0; i < total - left; ++i) out += fill;
    return Value::string(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    Args p = bind_args(name, a, {"affix"});
    if (!p[0]) throw_error(ErrorKind::kType, "{}() takes exactly one argument (0 given)", name);
    std::string affix = to_str_arg(*p[0], name, "affix");
    if (name == "removeprefix" && s.compare(0, affix.size(), affix) == 0) return Value::string(s.substr(affix.size()));
    if (name == "removesuffix" && !affix.empty() && s.size() >= affix.size() &&
        s.compare(s.size() - affix.size(), affix.size(), affix) == 0) {
      return Value::string(s.substr(0, s.size() - affix.size()));
    }
    return Value::string(s);
  }
  if (name == "partition" || name == "rpartition") {
    Args p = bind_args(name, a, {"sep"});
    if (!p[0]) throw_error(ErrorKind::kType, "{}() takes exactly one argument (0 given)", name);
    std::string sep = to_str_arg(*p[0], name, "sep");
    if (sep.empty()) throw_error(ErrorKind::kType, "empty separator");
    size_t hit = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (hit == std::string::npos) {
      return name == "partition" ? Value::tuple({Value::string(s), Value::string(""), Value::string("")})
                                 : Value::tuple({Value::string(""), Value::string(""), Value::string(s)});
    }
    return Value::tuple(
        {Value::string(s.substr(0, hit)), Value::string(sep), Value::string(s.substr(hit + sep.size()))});
  }
  throw_error(ErrorKind::kType, "'str' object has no attribute '{}'", name);
}

Value call_dict_method(const Value& self, const std::string& name, CallArgs& a) {
  const Dict& d = self.as_dict();
  if (name == "items" || name == "keys" || name == "values") {
    bind_args(name, a, {});
    std::vector<Value> out;
    out.reserve(d.size());
    for (const auto& [k, v] : d.entries()) {
      if (name == "items") out.push_back(Value::tuple({k, v}));
      else out.push_back(name == "keys" ? k : v);
    }
    return Value::list(std::move(out));
  }
  if (name == "get") {
    Args p = bind_args(name, a, {"key", "default"});
    if (!p[0]) throw_error(ErrorKind::kType, "get expected at least 1 argument, got 0");
    if (const Value* v = d.find(*p[0])) return *v;
    return p[1] ? *p[1] : Value::none();
  }
  if (name == "copy") {
    bind_args(name, a, {});
    return Value::dict(d);
  }
  throw_error(ErrorKind::kType, "'dict' object has no attribute '{}'", name);
}

Value call_sequence_method(const Value& self, const std::string& name, CallArgs& a) {
  const auto& items = self.items();
  if (name == "index") {
    Args p = bind_args(name, a, {"value", "start", "stop"});
    if (!p[0]) throw_error(ErrorKind::kType, "index expected at least 1 argument, got 0");
    py::SliceBounds b = py::slice_indices(static_cast<int64_t>(items.size()), opt_int(p[1], name, "start"),
                                          opt_int(p[2], name, "stop"), 1);
    for (int64_t i = b.start; i < b.stop; ++i) {
      if (equals(items[static_cast<size_t>(i)], *p[0])) return Value::integer(i);
    }
    throw_error(ErrorKind::kType, "{} is not in {}", repr(*p[0]), type_name(self));
  }
  if (name == "count") {
    Args p = bind_args(name, a, {"value"});
    if (!p[0]) throw_error(ErrorKind::kType, "count() takes exactly one argument (0 given)");
    int64_t n = 0;
    for (const Value& v : items) n += equals(v, *p[0]) ? 1 : 0;
    return Value::integer(n);
  }
  if (name == "copy" && self.is_list()) {
    bind_args(name, a, {});
    return Value::list(items);
  }
  throw_error(ErrorKind::kType, "'{}' object has no attribute '{}'", type_name(self), name);
}

const std::unordered_set<std::string_view>& str_methods() {
  static const std::unordered_set<std::string_view> s = {
      "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "upper",
      "lower", "title", "capitalize", "swapcase", "casefold", "replace", "find", "rfind", "index", "rindex",
      "count", "join", "format", "isdigit", "isdecimal", "isnumeric", "isalpha", "isalnum", "isspace",
      "isupper", "islower", "center", "ljust", "rjust", "zfill", "removeprefix", "removesuffix", "partition",
      "rpartition"};
  return s;
}

}  // namespace

std::optional<Value> bind_method(const Value& object, const std::string& name) {
  if (object.is_string()) {
    if (!str_methods().count(name)) return std::nullopt;
    Value self = object;
    return Value::callable("str." + name, [self, name](Interpreter& in, CallArgs& a) {
      return call_str_method(in, self.as_string(), name, a);
    });
  }
  if (object.is_dict()) {
    static const std::unordered_set<std::string_view> safe = {"items", "keys", "values", "get", "copy"};
    static const std::unordered_set<std::string_view> unsafe = {"clear", "pop", "popitem", "setdefault", "update",
                                                                "fromkeys"};
    if (unsafe.count(name)) {
      return Value::undefined(fmt::format("access to attribute '{}' of 'dict' object is unsafe.", name));
    }
    if (!safe.count(name)) return std::nullopt;
    Value self = object;
    return Value::callable("dict." + name,
                           [self, name](Interpreter&, CallArgs& a) { return call_dict_method(self, name, a); });
  }
  if (object.is_list_or_tuple()) {
    static const std::unordered_set<std::string_view> unsafe = {"append", "clear", "pop", "reverse", "insert",
                                                                "sort", "extend", "remove"};
    if (object.is_list() && unsafe.count(name)) {
      return Value::undefined(fmt::format("access to attribute '{}' of 'list' object is unsafe.", name));
    }
    if (name != "index" && name != "count" && !(name == "copy" && object.is_list())) return std::nullopt;
    Value self = object;
    return Value::callable(std::string(type_name(object)) + "." + name,
                           [self, name](Interpreter&, CallArgs& a) { return call_sequence_method(self, name, a); });
  }
  return std::nullopt;
}

}  // namespace dflash::jinja

// Jinja2's builtin filters (and transformers' tojson), with Jinja 3.1's signatures and behaviour.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/json_dump.h"
#include "tokenizer/jinja/py_string.h"

namespace dflash::jinja {
namespace {

using Args = std::vector<std::optional<Value>>;

bool flag(const std::optional<Value>& v, bool dflt) { return v ? truthy(*v) : dflt; }

Value ignore_case(const Value& v) { return v.is_string() ? Value::string(py::lower(v.as_string())) : v; }

// Jinja's make_attrgetter: "a.b.0" walks items/attributes; nullopt attribute returns the item.
Value get_path(Interpreter& in, const Value& item, const std::optional<Value>& attribute) {
  if (!attribute || attribute->is_none()) return item;
  if (attribute->is_integral()) return in.get_item(item, *attribute);
  Value cur = item;
  for (const std::string& part : py::split(to_str(*attribute), std::string("."), -1)) {
    bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    cur = in.get_item(cur, digits && part.size() < 18 ? Value::integer(std::stoll(part)) : Value::string(part));
  }
  return cur;
}

void sort_values(std::vector<Value>& items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? compare(keys[b], keys[a], "<") < 0 : compare(keys[a], keys[b], "<") < 0;
  });
  std::vector<Value> sorted;
  sorted.reserve(items.size());
  for (size_t i : order) sorted.push_back(std::move(items[i]));
  items = std::move(sorted);
}

Value f_abs(Interpreter&, const Value& v, CallArgs& a) {
  bind_args("abs", a, {});
  if (v.is_integral()) {
    if (v.as_int() == INT64_MIN) throw_error(ErrorKind::kLimit, "integer overflow");
    return Value::integer(std::llabs(v.as_int()));
  }
  if (v.is_float()) return Value::number(std::fabs(v.as_double()));
  throw_error(ErrorKind::kType, "bad operand type for abs(): '{}'", type_name(v));
}

Value f_attr(Interpreter& in, const Value& v, CallArgs& a) {
  Args p = bind_args("attr", a, {"name"});
  if (!p[0]) throw_error(ErrorKind::kType, "attr() missing required argument 'name'");
  // getattr() only: unlike `.name` in a template, attr() does not fall back to dict items.
  std::string name = to_str(*p[0]);
  if (v.is_dict()) {
    if (auto m = bind_method(v, name)) return *m;
    return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
  }
  return in.get_attr(v, name);
}

Value f_batch(Interpreter& in, const Value& v, CallArgs& a) {
  Args p = bind_args("batch", a, {"linecount", "fill_with"});
  if (!p[0]) throw_error(ErrorKind::kType, "batch() missing required argument 'linecount'");
  int64_t n = to_int_arg(*p[0], "batch", "linecount");
  if (n <= 0) throw_error(ErrorKind::kType, "batch(): linecount must be positive");
  std::vector<Value> out, tmp;
  for (Value& item : iterate(v)) {
    if (static_cast<int64_t>(tmp.size()) == n) {
      out.push_back(Value::list(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(std::move(item));
  }
  if (!tmp.empty()) {
    if (p[1] && !p[1]->is_none()) {
      in.check_items(static_cast<size_t>(n));
      while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(*p[1]);
    }
    out.push_back(Value::list(std::move(tmp)));
  }
  return Value::list(std::move(out));
}

Value f_capitalize(Interpreter&, const Value& v, CallArgs& a) {
  bind_args("capitalize", a, {});
  return Value::string(py::capitalize(to_str(v)));
}

Value f_center(Interpreter& in, const Value& v, CallArgs& a) {
  Args p = bind_args("center", a, {"width"});
  int64_t width = p[0] ? to_int_arg(*p[0], "center", "width") : 80;
  std::string s = to_str(v);
  int64_t len = static_cast<int64_t>(py::length(s));
  if (width <= len) return Value::string(s);
  in.charge_bytes(static_cast<size_t>(width));
  int64_t marg = width - len;
  int64_t left = marg / 2 + (marg & width & 1);
  return Value::string(std::string(static_cast<size_t>(left), ' ') + s +
                       std::string(static_cast<size_t>(marg - left), ' '));
}

Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  Args p = bind_args("default", a, {"default_value", "boolean"});
  Value dflt = p[0] ? *p[0] : Value::string("");
  if (v.is_undefined() || (flag(p[1], false) && !truthy(v))) return dflt;
  return v;
}

Value f_dictsort(Interpreter&, const Value& v, CallArgs& a) {
  Args p = bind_args("dictsort", a, {"case_sensitive", "by", "reverse"});
  if (v.is_undefined()) throw Error(ErrorKind::kUndefined, v.undefined_message());
  if (!v.is_dict()) throw_error(ErrorKind::kType, "dictsort(): value must be a mapping, not '{}'", type_name(v));
  bool case_sensitive = flag(p[0], false);
  std::string by = p[1] ? to_str(*p[1]) : "key";
  if (by != "key" && by != "value") throw_error(ErrorKind::kType, "You can only sort by either 'key' or 'value'");
  std::vector<Value> items, keys;
  for (const auto& [k, val] : v.as_dict().entries()) {
    items.push_back(Value::tuple({k, val}));
    const Value& key = by == "key" ? k : val;
    keys.push_back(case_sensitive ? key : ignore_case(key));
  }
  sort_values(items, keys, flag(p[2], false));
  return Value::list(std::move(items));
}

Value f_escape(Interpreter&, const Value& v, CallArgs& a) {
  bind_args("escape", a, {});
  std::string out;
  for (char c : to_str(v)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return Value::string(std::move(out));
}

Value f_first(Interpreter&, const Value& v, CallArgs& a) {
  bind_args("first", a, {});
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interpreter&, const Value& v, CallArgs& a) {
  bind_args("last", a, {});
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

// Python float(str): surrounding whitespace allowed, "inf"/"nan" spellings, underscores between digits.
std::optional<double> parse_float(const std::string& text) {
  std::string s = py::strip(text, std::nullopt, true, true);
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && isdigit(static_cast<unsigned char>(s[i - 1])) &&
        isdigit(static_cast<unsigned char>(s[i + 1]))) {
      continue;
    }
    clean.push_back(s[i]);
  }
  if (clean.empty()) return std::nullopt;
  std::string lower = py::lower(clean);
  std::string body = (lower[0] == '+' || lower[0] == '-') ? lower.substr(1) : lower;
  double sign = lower[0] == '-' ? -1.0 : 1.0;
  if (body == "inf" || body == "infinity") return sign * INFINITY;
  if (body == "nan") return NAN;
  if (body.find_first_not_of("0123456789.e+-") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return d;
}

// Python int(str, base).
std::optional<int64_t> parse_int(const std::string& text, int64_t base) {
  std::string s = py::strip(text, std::nullopt, true, true);
  bool negative = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (base == 0 || base == 16 || base == 8 || base == 2) {
    if (i + 1 < s.size() && s[i] == '0') {
      char p = static_cast<char>(s[i + 1] | 0x20);
      int64_t prefixed = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
      if (prefixed && (base == 0 || base == prefixed)) {
        base = prefixed;
        i += 2;
        if (i < s.size() && s[i] == '_') ++i;
      }
    }
    if (base == 0) base = 10;
  }
  if (base < 2 || base > 36 || i >= s.size()) return std::nullopt;
  uint64_t v = 0;
  bool any = false;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_' && any && i + 1 < s.size() && s[i + 1] != '_') continue;
    int d = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10 : 99;
    if (d >= base) return std::nullopt;
    if (v > (static_cast<uint64_t>(INT64_MAX) + 1 - static_cast<uint64_t>(d)) / static_cast<uint64_t>(base)) {
      return std::nullopt;
    }
    v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    any = true;
  }
  if (!any) return std::nullopt;
  if (!negative && v > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  return negative ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
}

std::optional<int64_t> float_to_int(double d) {
  if (std::isnan(d) || std::isinf(d) || std::fabs(d) >= 9.2e18) return std::nullopt;
  return static_cast<int64_t>(std::trunc(d));
}

Value f_float(Interpreter&, const Value& v, CallArgs& a) {
  Args p = bind_args("float", a, {"default"});
  Value dflt = p[0] ? *p[0] : Value::number(0.0);
  if (v.is_undefined()) throw Error(ErrorKind::kUndefined, v.undefined_message());  // Undefined.__float__
  if (v.is_number()) return Value::number(v.as_double());
  if (v.is_string()) {
    if (auto d = parse_float(v.as_string())) return Value::number(*d);
  }
  return dflt;
}

Value f_int(Interpreter&, const Value& v, CallArgs& a) {
  Args p = bind_args("int", a, {"default", "base"});
  Value dflt = p[0] ? *p[0] : Value::integer(0);
  int64_t base = p[1] ? to_int_arg(*p[1], "int", "base") : 10;
  if (v.is_undefined()) throw Error(ErrorKind::kUndefined, v.undefined_message());  // Undefined.__int__
  if (v.is_integral()) return Value::integer(v.as_int());
  if (v.is_float()) {
    if (auto i = float_to_int(v.as_double())) return Value::integer(*i);
    return dflt;
  }
  if (v.is_string()) {
    if (auto i = parse_int(v.as_string(), base)) return Value::integer(*i);
    if (auto d = parse_float(v.as_string())) {
      if (auto i = float_to_int(*d)) return Value::integer(*i);
    }
  }
  return dflt;
}

Value f_format(Interpreter& in, const Value& v, CallArgs& a) {
  if (!a.positional.empty() && !a.keyword.empty()) {
    throw_error(ErrorKind::kType, "can't handle positional and keyword arguments at the same time");
  }
  if (!a.keyword.empty()) {
    Dict d;
    for (auto& [k, val] : a.keyword) d.set(k, val);
    return Value::string(percent_format(in, to_str(v), Value::dict(std::move(d))));
  }
  return Value::string(percent_format(in, to_str(v), Value::tuple(a.positional)));
}

Value f_groupby(Interpreter& in, const Value& v, CallArgs& a) {
  Args p = bind_args("groupby", a, {"attribute", "default", "case_sensitive"});
  if (!p[0]) throw_error(ErrorKind::kType, "groupby() missing required argument 'attribute'");
  bool case_sensitive = flag(p[2], false);
  std::vector<Value> items = iterate(v), keys;
  for (const Value& item : items) {
    Value k = get_path(in, item, p[0]);
    if (k.is_undefined() && p[1]) k = *p[1];
    keys.push_back(case_sensitive ? k : ignore_case(k));
  }
  std::vector<Value> sorted_keys = keys;
  std::vector<Value> pairs;
  for (size_t i = 0; i < items.size(); ++i) pairs.push_back(Value::tuple({keys[i], items[i]}));
  sort_values(pairs, sorted_keys, false);
  std::vector<Value> groups;
  for (const Value& pair : pairs) {
    const Value& k = pair.items()[0];
    if (groups.empty() || !equals(groups.back().items()[0], k)) {
      Value grouper = k;
      if (!case_sensitive) {  // jinja reports the first original-case key of the group
        grouper = get_path(in, pair.items()[1], p[0]);
        if (grouper.is_undefined() && p[1]) grouper = *p[1];
      }
      groups.push_back(Value::tuple({grouper, Value::list({})}));
    }
    std::vector<Value> list = groups.back().items()[1].items();
    list.push_back(pair.items()[1]);
    groups.back() = Value::tuple({groups.back().items()[0], Value::list(std::move(list))});
  }
  return Value::list(std::move(groups));
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& a) {
  Args p = bind_args("indent", a, {"width", "first", "blank"});
  std::string indention = "    ";
  if (p[0]) {
    if (p[0]->is_string()) {
      indention = p[0]->as_string();
    } else {
      int64_t w = to_int_arg(*p[0], "indent", "width");
      if (w > 10000) throw_error(ErrorKind::kLimit, "indent width too large");
      indention = std::string(static_cast<size_t>(std::max<int64_t>(w, 0)), ' ');
    }
  }
  if (v.is_undefined()) throw Error(ErrorKind::kUndefined, v.undefined_message());
  if (!v.is_string()) throw_error(ErrorKind::kType, "indent(): expected a string, not '{}'", type_name(v));
  std::string s = v.as_string() + "\n";
  std::vector<std::string> lines = py::splitlines(s, false);
  std::string rv;
  if (flag(p[2], false)) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
    }
  }
  if (flag(p[1], false)) rv = indention + rv;
  in.charge_bytes(rv.size());
  return Value::string(std::move(rv));
}

Value f_items(Interpreter&, const Value& v, CallArgs& a) {
  bind_args("items", a, {});
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) throw_error(ErrorKind::kType, "Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, val] : v.as_dict().entries()) out.push_back(Value::tuple({k, val}));
  return Value::list(std::move(out));
}

Value f_join(Interpreter& in, const Value& v, CallArgs& a) {
  Args p = bind_args("join", a, {"d", "attribute"});
  std::string sep = p[0] ? to_str(*p[0]) : "";
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    append_str(out, get_path(in, item, p[1]));
    if (out.size() > in.limits().max_output_bytes) in.charge_bytes(out.size());
  }
  in.charge_bytes(out.size());
  return Value::string(std::move(out));
}

Value f_length(Interpreter&, const Value& v, CallArgs& a) {
  bind_args("length", a, {});
  return Value::integer(static_cast<int64_t>(length(v)));
}

Value f_list(Interpreter&, const Value& v, CallArgs& a) {
  bind_args("list", a, {});
  return Value::list(iterate(v));
}

Value f_lower(Interpreter&, const Value& v, CallArgs& a) {
  bind_args("lower", a, {});
  return Value::string(py::lower(to_str(v)));
}

Value f_upper(Interpreter&, const Value& v, CallArgs& a) {
  bind_args("upper", a, {});
  return Value::string(py::upper(to_str(v)));
}

Value f_map(Interpreter& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  if (!truthy(v)) return Value::list({});  // jinja's map() does not iterate a falsy value
  const Value* attribute = nullptr;
  const Value* dflt = nullptr;
  for (const auto& [k, val] : a.keyword) {
    if (k == "attribute") attribute = &val;
    if (k == "default") dflt = &val;
  }
  if (attribute || a.positional.empty()) {
    if (!attribute) throw_error(ErrorKind::kType, "map requires a filter argument");
    std::optional<Value> attr = *attribute;
    for (const Value& item : iterate(v)) {
      Value r = get_path(in, item, attr);
      if (dflt && r.is_undefined()) r = *dflt;
      out.push_back(std::move(r));
    }
    return Value::list(std::move(out));
  }
  std::string name = to_str(a.positional[0]);
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const Value& item : iterate(v)) {
    CallArgs call = rest;
    out.push_back(in.apply_filter(name, item, call));
  }
  return Value::list(std::move(out));
}

Value min_or_max(Interpreter& in, const Value& v, CallArgs& a, bool want_max) {
  Args p = bind_args(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  bool case_sensitive = flag(p[0], false);
  auto key = [&](const Value& item) {
    Value k = get_path(in, item, p[1]);
    return case_sensitive ? k : ignore_case(k);
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    int c = compare(k, best_key, want_max ? ">" : "<");
    if ((want_max && c > 0) || (!want_max && c < 0)) {
      best = i;
      best_key = k;
    }
  }
  return items[best];
}

Value f_max(Interpreter& in, const Value& v, CallArgs& a) { return min_or_max(in, v, a, true); }
Value f_min(Interpreter& in, const Value& v, CallArgs& a) { return min_or_max(in, v, a, false); }

Value select_or_reject(Interpreter& in, const Value& v, CallArgs& a, bool select, bool by_attr) {
  if (!truthy(v)) return Value::list({});  // jinja does not iterate a falsy value here
  size_t k = 0;
  Value attribute;
  if (by_attr) {
    if (a.positional.empty()) throw_error(ErrorKind::kType, "Missing parameter for attribute name");
    attribute = a.positional[k++];
  }
  std::optional<std::string> test;
  if (k < a.positional.size()) test = to_str(a.positional[k++]);
  CallArgs test_args;
  test_args.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(k), a.positional.end());
  test_args.keyword = a.keyword;
  std::vector<Value> out;
  for (const Value& item : iterate(v)) {
    Value subject = by_attr ? get_path(in, item, attribute) : item;
    bool r;
    if (test) {
      CallArgs call = test_args;
      r = in.apply_test(*test, subject, call);
    } else {
      r = truthy(subject);
    }
    if (r == select) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_select(Interpreter& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, true, false); }
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) {
  return select_or_reject(in, v, a, false, true);
}

Value f_replace(Interpreter& in, const Value& v, CallArgs& a) {
  Args p = bind_args("replace", a, {"old", "new", "count"});
  if (!p[0] || !p[1]) throw_error(ErrorKind::kType, "replace() needs 'old' and 'new'");
  int64_t count = p[2] && !p[2]->is_none() ? to_int_arg(*p[2], "replace", "count") : -1;
  std::string s = to_str(v), old = to_str(*p[0]), with = to_str(*p[1]);
  if (!with.empty() && with.size() > old.size()) {
    uint64_t hits = old.empty() ? py::length(s) + 1 : static_cast<uint64_t>(py::count(s, old, {}, {}));
    in.charge_bytes(s.size() + hits * (with.size() - old.size()));
  }
  return Value::string(py::replace(s, old, with, count));
}

Value f_reverse(Interpreter&, const Value& v, CallArgs& a) {
  bind_args("reverse", a, {});
  if (v.is_string()) return Value::string(py::slice(v.as_string(), std::nullopt, std::nullopt, -1));
  std::vector<Value> items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

// Python round(x, n): correctly rounded from the exact binary value, ties to even.
double py_round(double x, int64_t ndigits) {
  if (std::isnan(x) || std::isinf(x)) return x;
  if (ndigits > 300) return x;
  if (ndigits >= 0) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(ndigits), x);
    return std::strtod(buf, nullptr);
  }
  double p = std::pow(10.0, static_cast<double>(-ndigits));
  double y = x / p;
  double r = std::nearbyint(y);
  return r * p;
}

Value f_round(Interpreter&, const Value& v, CallArgs& a) {
  Args p = bind_args("round", a, {"precision", "method"});
  int64_t precision = p[0] ? to_int_arg(*p[0], "round", "precision") : 0;
  std::string method = p[1] ? to_str(*p[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    throw_error(ErrorKind::kType, "method must be common, ceil or floor");
  }
  if (!v.is_number()) throw_error(ErrorKind::kType, "type {} doesn't define __round__ method", type_name(v));
  if (method == "common") {
    if (v.is_integral()) {
      if (precision >= 0) return Value::integer(v.as_int());
      if (precision < -18) return Value::integer(0);
      int64_t scale = 1;
      for (int64_t k = 0; k < -precision; ++k) scale *= 10;
      int64_t x = v.as_int(), q = x / scale, r = x % scale;  // round half to even, like Python's int round
      if (r < 0) {
        r += scale;
        q -= 1;
      }
      if (2 * r > scale || (2 * r == scale && (q & 1))) q += 1;
      int64_t out;
      if (__builtin_mul_overflow(q, scale, &out)) throw_error(ErrorKind::kLimit, "integer overflow");
      return Value::integer(out);
    }
    return Value::number(py_round(v.as_double(), precision));
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_double() * scale;
  return Value::number((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value f_safe(Interpreter&, const Value& v, CallArgs& a) {
  bind_args("safe", a, {});
  return v.is_string() ? v : Value::string(to_str(v));
}

Value f_slice(Interpreter&, const Value& v, CallArgs& a) {
  Args p = bind_args("slice", a, {"slices", "fill_with"});
  if (!p[0]) throw_error(ErrorKind::kType, "slice() missing required argument 'slices'");
  int64_t slices = to_int_arg(*p[0], "slice", "slices");
  if (slices <= 0 || slices > 100000) throw_error(ErrorKind::kType, "slice(): slices must be positive");
  std::vector<Value> seq = iterate(v);
  int64_t length = static_cast<int64_t>(seq.size());
  int64_t per = length / slices, extra = length % slices, offset = 0;
  std::vector<Value> out;
  for (int64_t i = 0; i < slices; ++i) {
    int64_t start = offset + i * per;
    if (i < extra) ++offset;
    int64_t end = offset + (i + 1) * per;
    std::vector<Value> tmp(seq.begin() + start, seq.begin() + end);
    if (p[1] && i >= extra) tmp.push_back(*p[1]);
    out.push_back(Value::list(std::move(tmp)));
  }
  return Value::list(std::move(out));
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& a) {
  Args p = bind_args("sort", a, {"reverse", "case_sensitive", "attribute"});
  std::vector<Value> items = iterate(v), keys;
  bool case_sensitive = flag(p[1], false);
  for (const Value& item : items) {
    Value k = get_path(in, item, p[2]);
    keys.push_back(case_sensitive ? k : ignore_case(k));
  }
  sort_values(items, keys, flag(p[0], false));
  return Value::list(std::move(items));
}

Value f_string(Interpreter&, const Value& v, CallArgs& a) {
  bind_args("string", a, {});
  return v.is_string() ? v : Value::string(to_str(v));
}

Value f_sum(Interpreter& in, const Value& v, CallArgs& a) {
  Args p = bind_args("sum", a, {"attribute", "start"});
  Value total = p[1] ? *p[1] : Value::integer(0);
  for (const Value& item : iterate(v)) {
    Value x = get_path(in, item, p[0]);
    if (total.is_string() || x.is_string()) {
      throw_error(ErrorKind::kType, "unsupported operand type(s) for +: '{}' and '{}'", type_name(total),
                  type_name(x));
    }
    if (total.is_integral() && x.is_integral()) {
      int64_t r;
      if (__builtin_add_overflow(total.as_int(), x.as_int(), &r)) throw_error(ErrorKind::kLimit, "integer overflow");
      total = Value::integer(r);
    } else if (total.is_number() && x.is_number()) {
      total = Value::number(total.as_double() + x.as_double());
    } else if (total.is_list() && x.is_list()) {
      std::vector<Value> joined = total.items();
      in.check_items(joined.size() + x.items().size());
      joined.insert(joined.end(), x.items().begin(), x.items().end());
      total = Value::list(std::move(joined));
    } else {
      if (x.is_undefined()) throw Error(ErrorKind::kUndefined, x.undefined_message());
      throw_error(ErrorKind::kType, "unsupported operand type(s) for +: '{}' and '{}'", type_name(total),
                  type_name(x));
    }
  }
  return total;
}

// Jinja's title filter: capitalizes after runs of whitespace, dashes and opening brackets.
Value f_title(Interpreter&, const Value& v, CallArgs& a) {
  bind_args("title", a, {});
  std::u32string cps = py::decode(to_str(v));
  auto is_boundary = [](char32_t c) { return py::is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<'; };
  std::string out;
  bool word_start = true;
  for (char32_t c : cps) {
    if (is_boundary(c)) {
      py::append_code_point(out, c);
      word_start = true;
      continue;
    }
    std::string one;
    py::append_code_point(one, c);
    out += word_start ? py::upper(one) : py::lower(one);
    word_start = false;
  }
  return Value::string(std::move(out));
}

Value f_tojson(Interpreter& in, const Value& v, CallArgs& a) {
  Args p = bind_args("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = flag(p[0], false);
  if (p[1] && !p[1]->is_none()) {
    if (p[1]->is_string()) {
      o.indent = p[1]->as_string();
    } else {
      int64_t n = to_int_arg(*p[1], "tojson", "indent");
      if (n > 1000) throw_error(ErrorKind::kLimit, "tojson indent too large");
      o.indent = std::string(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
    }
  }
  if (p[2] && !p[2]->is_none()) {
    if (!p[2]->is_list_or_tuple() || p[2]->items().size() != 2) {
      throw_error(ErrorKind::kType, "tojson(): separators must be a pair of strings");
    }
    o.item_separator = to_str_arg(p[2]->items()[0], "tojson", "separators");
    o.key_separator = to_str_arg(p[2]->items()[1], "tojson", "separators");
  }
  o.sort_keys = flag(p[3], false);
  std::string s = json_dumps(v, o);
  in.charge_bytes(s.size());
  return Value::string(std::move(s));
}

Value f_trim(Interpreter&, const Value& v, CallArgs& a) {
  Args p = bind_args("trim", a, {"chars"});
  std::optional<std::string> chars;
  if (p[0] && !p[0]->is_none()) chars = to_str(*p[0]);
  return Value::string(py::strip(to_str(v), chars, true, true));
}

Value f_truncate(Interpreter&, const Value& v, CallArgs& a) {
  Args p = bind_args("truncate", a, {"length", "killwords", "end", "leeway"});
  int64_t len = p[0] ? to_int_arg(*p[0], "truncate", "length") : 255;
  bool killwords = flag(p[1], false);
  std::string end = p[2] ? to_str(*p[2]) : "...";
  int64_t leeway = p[3] && !p[3]->is_none() ? to_int_arg(*p[3], "truncate", "leeway") : 5;
  int64_t end_len = static_cast<int64_t>(py::length(end));
  if (len < end_len) throw_error(ErrorKind::kType, "expected length >= {}, got {}", end_len, len);
  if (leeway < 0) throw_error(ErrorKind::kType, "expected leeway >= 0, got {}", leeway);
  if (!v.is_string() && !v.is_undefined()) {
    // jinja calls len(s): numbers and None fail, short containers come back unchanged.
    if (static_cast<int64_t>(length(v)) <= len + leeway) return v;
    throw_error(ErrorKind::kType, "truncate(): expected a string, not '{}'", type_name(v));
  }
  std::string s = to_str(v);
  if (static_cast<int64_t>(py::length(s)) <= len + leeway) return Value::string(s);
  std::string head = py::slice(s, 0, len - end_len, 1);
  if (killwords) return Value::string(head + end);
  std::vector<std::string> parts = py::rsplit(head, std::string(" "), 1);
  return Value::string(parts[0] + end);
}

Value f_unique(Interpreter& in, const Value& v, CallArgs& a) {
  Args p = bind_args("unique", a, {"case_sensitive", "attribute"});
  bool case_sensitive = flag(p[0], false);
  std::vector<Value> out, seen;
  for (const Value& item : iterate(v)) {
    Value k = get_path(in, item, p[1]);
    if (!case_sensitive) k = ignore_case(k);
    bool dup = false;
    for (const Value& s : seen) {
      if (equals(s, k)) {
        dup = true;
        break;
      }
    }
    if (dup) continue;
    seen.push_back(std::move(k));
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs& a) {
  bind_args("wordcount", a, {});
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : py::decode(to_str(v))) {
    bool w = py::is_word_char(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

const std::unordered_map<std::string_view, FilterFn>& filter_table() {
  static const std::unordered_map<std::string_view, FilterFn> table = {
      {"abs", f_abs},         {"attr", f_attr},           {"batch", f_batch},
      {"capitalize", f_capitalize}, {"center", f_center}, {"count", f_length},
      {"d", f_default},       {"default", f_default},     {"dictsort", f_dictsort},
      {"e", f_escape},        {"escape", f_escape},       {"first", f_first},
      {"float", f_float},     {"forceescape", f_escape},  {"format", f_format},
      {"groupby", f_groupby}, {"indent", f_indent},       {"int", f_int},
      {"items", f_items},     {"join", f_join},           {"last", f_last},
      {"length", f_length},   {"list", f_list},           {"lower", f_lower},
      {"map", f_map},         {"max", f_max},             {"min", f_min},
      {"reject", f_reject},   {"rejectattr", f_rejectattr}, {"replace", f_replace},
      {"reverse", f_reverse}, {"round", f_round},         {"safe", f_safe},
      {"select", f_select},   {"selectattr", f_selectattr}, {"slice", f_slice},
      {"sort", f_sort},       {"string", f_string},       {"sum", f_sum},
      {"title", f_title},     {"tojson", f_tojson},       {"trim", f_trim},
      {"truncate", f_truncate}, {"unique", f_unique},     {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return table;
}

}  // namespace

const FilterFn* find_filter(std::string_view name) {
  const auto& t = filter_table();
  auto it = t.find(name);
  return it == t.end() ? nullptr : &it->second;
}

}  // namespace dflash::jinja

#include "tokenizer/jinja/value.h"

#include <charconv>
#include <cmath>
#include <cstring>

#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/py_string.h"

namespace dflash::jinja {
namespace {

struct ListData {
  std::vector<Value> items;
};

constexpr int kMaxPrintDepth = 200;  // str()/repr() of nested containers (also bounded by the stack guard)

void append_repr(std::string& out, const Value& v, int depth);

void append_items(std::string& out, const std::vector<Value>& items, int depth) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    append_repr(out, items[i], depth + 1);
  }
}

void append_dict(std::string& out, const Dict& d, int depth) {
  out.push_back('{');
  bool first = true;
  for (const auto& [k, v] : d.entries()) {
    if (!first) out += ", ";
    first = false;
    append_repr(out, k, depth + 1);
    out += ": ";
    append_repr(out, v, depth + 1);
  }
  out.push_back('}');
}

void append_repr(std::string& out, const Value& v, int depth) {
  if (depth > kMaxPrintDepth) throw_error(ErrorKind::kLimit, "value nested too deeply to print");
  switch (v.kind()) {
    case Kind::kUndefined: out += "Undefined"; return;
    case Kind::kString: out += py::quote(v.as_string()); return;
    case Kind::kList:
      out.push_back('[');
      append_items(out, v.items(), depth);
      out.push_back(']');
      return;
    case Kind::kTuple:
      out.push_back('(');
      append_items(out, v.items(), depth);
      if (v.items().size() == 1) out.push_back(',');
      out.push_back(')');
      return;
    case Kind::kDict: append_dict(out, v.as_dict(), depth); return;
    case Kind::kNamespace:
      out += "<Namespace ";
      append_dict(out, v.as_dict(), depth);
      out += ">";
      return;
    default: append_str(out, v); return;
  }
}

int compare_numbers(const Value& a, const Value& b) {
  if (a.is_integral() && b.is_integral()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
  double x = a.as_double(), y = b.as_double();
  if (x < y) return -1;
  if (x > y) return 1;
  return 0;  // equal or NaN (Python's comparisons with NaN are all False; callers treat 0 as "not less")
}

}  // namespace

// ---- Dict ----

const Value* Dict::find(std::string_view key) const {
  auto it = string_index_.find(std::string(key));
  return it == string_index_.end() ? nullptr : &entries_[it->second].second;
}

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_string()));
  for (const auto& [k, v] : entries_) {
    if (!k.is_string() && equals(k, key)) return &v;
  }
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  auto it = string_index_.find(key);
  if (it != string_index_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  string_index_.emplace(key, entries_.size());
  entries_.emplace_back(Value::string(std::move(key)), std::move(value));
}

void Dict::set(Value key, Value value) {
  if (key.is_string()) {
    set(std::string(key.as_string()), std::move(value));
    return;
  }
  for (auto& [k, v] : entries_) {
    if (!k.is_string() && equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

// ---- Value ----

Value Value::undefined(std::string hint) {
  Value v(Kind::kUndefined);
  if (!hint.empty()) v.ptr_ = std::make_shared<std::string>(std::move(hint));
  return v;
}

Value Value::string(std::string s) {
  Value v(Kind::kString);
  v.ptr_ = std::make_shared<std::string>(std::move(s));
  return v;
}

Value Value::list(std::vector<Value> items) {
  Value v(Kind::kList);
  v.ptr_ = std::make_shared<ListData>(ListData{std::move(items)});
  return v;
}

Value Value::tuple(std::vector<Value> items) {
  Value v(Kind::kTuple);
  v.ptr_ = std::make_shared<ListData>(ListData{std::move(items)});
  return v;
}

Value Value::dict(Dict d) {
  Value v(Kind::kDict);
  v.ptr_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::make_namespace(Dict d) {
  Value v(Kind::kNamespace);
  v.ptr_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::callable(std::string name, NativeFn fn) {
  Value v(Kind::kCallable);
  v.ptr_ = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

const std::string& Value::as_string() const { return *static_cast<const std::string*>(ptr_.get()); }
const std::vector<Value>& Value::items() const { return static_cast<const ListData*>(ptr_.get())->items; }
const Dict& Value::as_dict() const { return *static_cast<const Dict*>(ptr_.get()); }
Dict& Value::mutable_namespace() const { return *static_cast<Dict*>(ptr_.get()); }
const Callable& Value::as_callable() const { return *static_cast<const Callable*>(ptr_.get()); }

std::string Value::undefined_message() const {
  if (ptr_) return *static_cast<const std::string*>(ptr_.get());
  return "value is undefined";
}

bool Value::same_object(const Value& o) const {
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kBool:
    case Kind::kInt: return i_ == o.i_;
    case Kind::kFloat: return f_ == o.f_;
    case Kind::kString: return as_string() == o.as_string();  // Python interns short strings; close enough
    default: return ptr_ == o.ptr_;
  }
}

// ---- Python semantics ----

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool:
    case Kind::kInt: return v.as_int() != 0;
    case Kind::kFloat: return v.as_double() != 0.0;
    case Kind::kString: return !v.as_string().empty();
    case Kind::kList:
    case Kind::kTuple: return !v.items().empty();
    case Kind::kDict: return !v.as_dict().empty();
    case Kind::kNamespace:
    case Kind::kCallable: return true;
  }
  return false;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.as_string() == b.as_string();
    case Kind::kList:
    case Kind::kTuple: {
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.entries()) {
        const Value* other = y.find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    default: return a.same_object(b);
  }
}

int compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_number() && b.is_number()) return compare_numbers(a, b);
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if ((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined()) throw Error(ErrorKind::kUndefined, a.undefined_message());
  if (b.is_undefined()) throw Error(ErrorKind::kUndefined, b.undefined_message());
  throw_error(ErrorKind::kType, "'{}' not supported between instances of '{}' and '{}'", op, type_name(a),
              type_name(b));
}

const char* type_name(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "object";
}

std::string format_float(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form ("1.2345e+17"), then Python's layout rules.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  int exp10 = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  std::string out = negative ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits;
      out.append(static_cast<size_t>(decpt) - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt));
      out += ".";
      out += digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) {
    out += ".";
    out += digits.substr(1);
  }
  int x = decpt - 1;
  out += x < 0 ? "e-" : "e+";
  std::string xs = std::to_string(x < 0 ? -x : x);
  if (xs.size() < 2) xs.insert(0, "0");
  out += xs;
  return out;
}

void append_str(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return;
    case Kind::kNone: out += "None"; return;
    case Kind::kBool: out += v.as_bool() ? "True" : "False"; return;
    case Kind::kInt: out += std::to_string(v.as_int()); return;
    case Kind::kFloat: out += format_float(v.as_double()); return;
    case Kind::kString: out += v.as_string(); return;
    case Kind::kCallable: out += "<function " + v.as_callable().name + ">"; return;
    default: append_repr(out, v, 0); return;
  }
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.as_string();
  std::string out;
  append_str(out, v);
  return out;
}

std::string repr(const Value& v) {
  std::string out;
  append_repr(out, v, 0);
  return out;
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return {};
    case Kind::kList:
    case Kind::kTuple: return v.items();
    case Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.as_dict().size());
      for (const auto& [k, val] : v.as_dict().entries()) keys.push_back(k);
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> chars;
      const std::string& s = v.as_string();
      if (py::is_ascii(s)) {
        for (char c : s) chars.push_back(Value::string(std::string(1, c)));
      } else {
        for (char32_t c : py::decode(s)) {
          std::string one;
          py::append_code_point(one, c);
          chars.push_back(Value::string(std::move(one)));
        }
      }
      return chars;
    }
    default: throw_error(ErrorKind::kType, "'{}' object is not iterable", type_name(v));
  }
}

size_t length(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return 0;
    case Kind::kString: return py::length(v.as_string());
    case Kind::kList:
    case Kind::kTuple: return v.items().size();
    case Kind::kDict: return v.as_dict().size();
    default: throw_error(ErrorKind::kType, "object of type '{}' has no len()", type_name(v));
  }
}

Value from_json(const nlohmann::ordered_json& j, int max_depth) {
  if (max_depth <= 0) throw_error(ErrorKind::kLimit, "JSON input nested too deeply");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::integer(static_cast<int64_t>(u));
      return Value::number(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, max_depth - 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, e] : j.items()) d.set(std::string(k), from_json(e, max_depth - 1));
      return Value::dict(std::move(d));
    }
    default: return Value::none();  // binary / discarded: not produced by the JSON parser
  }
}

}  // namespace dflash::jinja

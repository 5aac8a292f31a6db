// The values a Jinja template computes with, modelled on the Python objects Jinja2 sees: undefined,
// None, bool, int, float, str, list, tuple, dict (insertion-ordered), namespace and callables, with
// Python's truthiness, equality, ordering, str() and repr().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace dflash::jinja {

class Value;
class Interpreter;
class Dict;
struct CallArgs;
struct Callable;
using NativeFn = std::function<Value(Interpreter&, CallArgs&)>;

enum class Kind : uint8_t {
  kUndefined,  // a missing variable/attribute; carries the message Jinja would raise when it is used
  kNone,
  kBool,
  kInt,    // int64 (Python ints are unbounded; overflow is an error here)
  kFloat,  // double
  kString, // UTF-8 bytes; lengths, indices and slices count code points like Python str
  kList,
  kTuple,
  kDict,       // insertion-ordered like Python dicts (JSON objects keep their key order)
  kNamespace,  // namespace(): a dict whose attributes may be assigned with {% set ns.x = ... %}
  kCallable,   // macros, builtins, bound methods
};

class Value {
 public:
  Value() : kind_(Kind::kUndefined) {}  // undefined without a name

  static Value undefined(std::string hint);
  static Value none() { return Value(Kind::kNone); }
  static Value boolean(bool b) {
    Value v(Kind::kBool);
    v.i_ = b ? 1 : 0;
    return v;
  }
  static Value integer(int64_t i) {
    Value v(Kind::kInt);
    v.i_ = i;
    return v;
  }
  static Value number(double f) {
    Value v(Kind::kFloat);
    v.f_ = f;
    return v;
  }
  static Value string(std::string s);
  static Value list(std::vector<Value> items);
  static Value tuple(std::vector<Value> items);
  static Value dict(Dict d);
  static Value make_namespace(Dict d);
  static Value callable(std::string name, NativeFn fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }             // not bool
  bool is_integral() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }  // Python isinstance(x, int)
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return is_integral() || is_float(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kTuple; }
  bool is_list_or_tuple() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return i_ != 0; }
  int64_t as_int() const { return i_; }  // bool or int
  double as_double() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(i_); }
  const std::string& as_string() const;
  const std::vector<Value>& items() const;  // list or tuple
  const Dict& as_dict() const;              // dict or namespace
  Dict& mutable_namespace() const;          // namespace only
  const Callable& as_callable() const;
  // The message to raise when an undefined value is used ("'foo' is undefined").
  std::string undefined_message() const;

  // Identity (Python `is`): same object for reference types, same value for scalars.
  bool same_object(const Value& o) const;

 private:
  explicit Value(Kind k) : kind_(k) {}

  Kind kind_;
  union {
    int64_t i_ = 0;
    double f_;
  };
  std::shared_ptr<void> ptr_;  // std::string (string, undefined hint), List, Dict or Callable by kind
};

// Arguments of a call: positional values, then keyword values in call order.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Callable {
  std::string name;
  NativeFn fn;
};

// Insertion-ordered mapping. String keys are indexed by hash; other keys (int, bool, float, None,
// tuples) are compared with Python equality, so 1, 1.0 and True are one key as in Python.
class Dict {
 public:
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Replaces the value of an existing key in place (keeping its position) or appends.
  void set(Value key, Value value);
  void set(std::string key, Value value);

 private:
  std::vector<std::pair<Value, Value>> entries_;
  std::unordered_map<std::string, size_t> string_index_;
};

// Python semantics.
bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
// Three-way ordering for <, <=, >, >=; throws a TypeError-like error for unorderable operands.
int compare(const Value& a, const Value& b, std::string_view op);
const char* type_name(const Value& v);  // "str", "int", "dict", "NoneType", ...

// str(v) and repr(v) as Python prints them; undefined prints as "" (str) / "Undefined" (repr).
std::string to_str(const Value& v);
void append_str(std::string& out, const Value& v);
std::string repr(const Value& v);
// Python's repr of a float: shortest round-trip digits, "1.0", "1e+16", "inf", "nan".
std::string format_float(double f);

// Items a `for` loop (or list()) sees: list/tuple items, dict keys, string characters; undefined is
// empty; anything else is a TypeError.
std::vector<Value> iterate(const Value& v);
// len(v); TypeError for values without a length (undefined counts 0 like Jinja's Undefined).
size_t length(const Value& v);

// JSON (insertion-ordered) to a Value: objects become dicts, arrays lists. `max_depth` bounds nesting.
Value from_json(const nlohmann::ordered_json& j, int max_depth = 256);

}  // namespace dflash::jinja

#include "tokenizer/jinja/operators.h"

#include <cmath>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/interpreter.h"

namespace dflash::jinja {
namespace {

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) throw Error(ErrorKind::kUndefined, a.undefined_message());
  if (b.is_undefined()) throw Error(ErrorKind::kUndefined, b.undefined_message());
  if (op == "+" && (a.is_string() || a.is_list() || a.is_tuple())) {
    throw_error(ErrorKind::kType, "can only concatenate {} (not \"{}\") to {}", type_name(a), type_name(b),
                type_name(a));
  }
  throw_error(ErrorKind::kType, "unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a),
              type_name(b));
}

void check_overflow(bool overflow) {
  if (overflow) throw_error(ErrorKind::kLimit, "integer overflow (the engine's integers are 64-bit)");
}

Value int_pow(int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1) check_overflow(__builtin_mul_overflow(result, base, &result));
    exp >>= 1;
    if (exp) check_overflow(__builtin_mul_overflow(base, base, &base));
  }
  return Value::integer(result);
}

// Python's float divmod: the remainder has the sign of the divisor.
void float_divmod(double x, double y, double& div, double& mod) {
  mod = std::fmod(x, y);
  div = (x - mod) / y;
  if (mod != 0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, y);
  }
  if (div != 0) {
    double fl = std::floor(div);
    if (div - fl > 0.5) fl += 1.0;
    div = fl;
  } else {
    div = std::copysign(0.0, x / y);
  }
}

Value repeat(Interpreter& in, const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (!s.empty() && static_cast<uint64_t>(n) > in.limits().max_output_bytes / s.size()) {
      throw_error(ErrorKind::kLimit, "string repetition result is too large");
    }
    in.charge_bytes(s.size() * static_cast<size_t>(n));
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value::string(std::move(out));
  }
  const auto& items = seq.items();
  if (!items.empty() && static_cast<uint64_t>(n) > in.limits().max_collection_items / items.size()) {
    throw_error(ErrorKind::kLimit, "sequence repetition result is too large");
  }
  std::vector<Value> out;
  out.reserve(items.size() * static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return seq.is_list() ? Value::list(std::move(out)) : Value::tuple(std::move(out));
}

Value concat(Interpreter& in, const Value& a, const Value& b) {
  if (a.is_string()) {
    const std::string& x = a.as_string();
    const std::string& y = b.as_string();
    in.charge_bytes(x.size() + y.size());
    std::string out;
    out.reserve(x.size() + y.size());
    out += x;
    out += y;
    return Value::string(std::move(out));
  }
  std::vector<Value> out = a.items();
  in.check_items(out.size() + b.items().size());
  out.insert(out.end(), b.items().begin(), b.items().end());
  return a.is_list() ? Value::list(std::move(out)) : Value::tuple(std::move(out));
}

}  // namespace

Value binary_op(Interpreter& in, std::string_view op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string out = to_str(a);
    std::string right = to_str(b);
    in.charge_bytes(out.size() + right.size());
    out += right;
    return Value::string(std::move(out));
  }
  const bool ints = a.is_integral() && b.is_integral();
  const bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) {
      int64_t r;
      check_overflow(__builtin_add_overflow(a.as_int(), b.as_int(), &r));
      return Value::integer(r);
    }
    if (nums) return Value::number(a.as_double() + b.as_double());
    if ((a.is_string() && b.is_string()) || (a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) {
      return concat(in, a, b);
    }
    unsupported(op, a, b);
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      check_overflow(__builtin_sub_overflow(a.as_int(), b.as_int(), &r));
      return Value::integer(r);
    }
    if (nums) return Value::number(a.as_double() - b.as_double());
    unsupported(op, a, b);
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      check_overflow(__builtin_mul_overflow(a.as_int(), b.as_int(), &r));
      return Value::integer(r);
    }
    if (nums) return Value::number(a.as_double() * b.as_double());
    if ((a.is_string() || a.is_list_or_tuple()) && b.is_integral()) return repeat(in, a, b.as_int());
    if (a.is_integral() && (b.is_string() || b.is_list_or_tuple())) return repeat(in, b, a.as_int());
    unsupported(op, a, b);
  }
  if (op == "/") {
    if (!nums) unsupported(op, a, b);
    if (b.as_double() == 0) throw_error(ErrorKind::kType, "division by zero");
    return Value::number(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string()) return Value::string(percent_format(in, a.as_string(), b));
    if (!nums) unsupported(op, a, b);
    if (ints) {
      int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) throw_error(ErrorKind::kType, "integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) {
        if (op == "%") return Value::integer(0);
        throw_error(ErrorKind::kLimit, "integer overflow (the engine's integers are 64-bit)");
      }
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        r += y;
        q -= 1;
      }
      return Value::integer(op == "//" ? q : r);
    }
    double y = b.as_double();
    if (y == 0) throw Error(ErrorKind::kType, op == "//" ? "float floor division by zero" : "float modulo");
    double div, mod;
    float_divmod(a.as_double(), y, div, mod);
    return Value::number(op == "//" ? div : mod);
  }
  if (op == "**") {
    if (!nums) unsupported(op, a, b);
    if (ints && b.as_int() >= 0) return int_pow(a.as_int(), b.as_int());
    double x = a.as_double(), y = b.as_double();
    if (x == 0 && y < 0) throw_error(ErrorKind::kType, "0.0 cannot be raised to a negative power");
    if (x < 0 && y != std::floor(y)) {
      throw_error(ErrorKind::kType, "negative number raised to a fractional power has a complex result");
    }
    return Value::number(std::pow(x, y));
  }
  throw_error(ErrorKind::kSyntax, "unknown operator '{}'", op);
}

Value unary_minus(const Value& v) {
  if (v.is_integral()) {
    if (v.as_int() == INT64_MIN) throw_error(ErrorKind::kLimit, "integer overflow (the engine's integers are 64-bit)");
    return Value::integer(-v.as_int());
  }
  if (v.is_float()) return Value::number(-v.as_double());
  if (v.is_undefined()) throw Error(ErrorKind::kUndefined, v.undefined_message());
  throw_error(ErrorKind::kType, "bad operand type for unary -: '{}'", type_name(v));
}

Value unary_plus(const Value& v) {
  if (v.is_integral()) return Value::integer(v.as_int());
  if (v.is_float()) return v;
  if (v.is_undefined()) throw Error(ErrorKind::kUndefined, v.undefined_message());
  throw_error(ErrorKind::kType, "bad operand type for unary +: '{}'", type_name(v));
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kString:
      if (!item.is_string()) {
        throw_error(ErrorKind::kType, "'in <string>' requires string as left operand, not {}", type_name(item));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Kind::kList:
    case Kind::kTuple:
      for (const Value& v : container.items()) {
        if (equals(v, item)) return true;
      }
      return false;
    case Kind::kDict: return container.as_dict().find(item) != nullptr;
    case Kind::kUndefined: return false;
    default: throw_error(ErrorKind::kType, "argument of type '{}' is not iterable", type_name(container));
  }
}

}  // namespace dflash::jinja

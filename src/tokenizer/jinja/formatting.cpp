// printf-style `%` formatting and str.format(), following Python's rules for the common conversions.
#include <cmath>
#include <cstdio>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/py_string.h"

namespace dflash::jinja {
namespace {

std::string c_format(const std::string& spec, double v) {
  char buf[512];
  int n = std::snprintf(buf, sizeof(buf), spec.c_str(), v);
  if (n < 0) throw_error(ErrorKind::kType, "bad format");
  if (static_cast<size_t>(n) < sizeof(buf)) return std::string(buf, static_cast<size_t>(n));
  std::string big(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(big.data(), big.size(), spec.c_str(), v);
  big.resize(static_cast<size_t>(n));
  return big;
}

std::string c_format_int(const std::string& spec, long long v) {
  char buf[128];
  int n = std::snprintf(buf, sizeof(buf), spec.c_str(), v);
  if (n < 0 || static_cast<size_t>(n) >= sizeof(buf)) throw_error(ErrorKind::kType, "bad format");
  return std::string(buf, static_cast<size_t>(n));
}

// Pads `body` to `width` code points.
std::string pad(std::string body, int64_t width, char align, char32_t fill) {
  int64_t len = static_cast<int64_t>(py::length(body));
  if (width <= len) return body;
  int64_t total = width - len;
  int64_t left = align == '<' ? 0 : align == '^' ? total / 2 : total;
  std::string f;
  py::append_code_point(f, fill);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += f;
  out += body;
  for (int64_t i = 0; i < total - left; ++i) out += f;
  return out;
}

double number_arg(const Value& v, char conv) {
  if (v.is_number()) return v.as_double();
  throw_error(ErrorKind::kType, "%{} format: a real number is required, not {}", conv, type_name(v));
}

}  // namespace

std::string percent_format(Interpreter& in, const std::string& format, const Value& args) {
  std::vector<Value> positional;
  const Dict* mapping = nullptr;
  if (args.is_tuple()) {
    positional = args.items();
  } else if (args.is_dict()) {
    mapping = &args.as_dict();
    positional.push_back(args);
  } else {
    positional.push_back(args);
  }
  size_t next = 0;
  bool used_mapping = false;
  auto take = [&]() -> Value {
    if (next >= positional.size()) throw_error(ErrorKind::kType, "not enough arguments for format string");
    return positional[next++];
  };
  std::string out;
  size_t i = 0;
  while (i < format.size()) {
    char c = format[i];
    if (c != '%') {
      out.push_back(c);
      ++i;
      continue;
    }
    if (++i >= format.size()) throw_error(ErrorKind::kType, "incomplete format");
    Value arg;
    bool have_arg = false;
    if (format[i] == '(') {
      size_t close = format.find(')', i);
      if (close == std::string::npos) throw_error(ErrorKind::kType, "incomplete format key");
      if (!mapping) throw_error(ErrorKind::kType, "format requires a mapping");
      std::string key = format.substr(i + 1, close - i - 1);
      const Value* v = mapping->find(std::string_view(key));
      if (!v) throw_error(ErrorKind::kType, "KeyError: '{}'", key);
      arg = *v;
      have_arg = true;
      used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < format.size() && std::string_view("-+ #0").find(format[i]) != std::string_view::npos) {
      flags.push_back(format[i++]);
    }
    int64_t width = -1, precision = -1;
    if (i < format.size() && format[i] == '*') {
      width = to_int_arg(take(), "%", "width");
      ++i;
    } else {
      while (i < format.size() && format[i] >= '0' && format[i] <= '9') {
        width = std::max<int64_t>(width, 0) * 10 + (format[i++] - '0');
        if (width > 100000) throw_error(ErrorKind::kLimit, "format width too large");
      }
    }
    if (i < format.size() && format[i] == '.') {
      ++i;
      precision = 0;
      if (i < format.size() && format[i] == '*') {
        precision = to_int_arg(take(), "%", "precision");
        ++i;
      } else {
        while (i < format.size() && format[i] >= '0' && format[i] <= '9') {
          precision = precision * 10 + (format[i++] - '0');
          if (precision > 1000) throw_error(ErrorKind::kLimit, "format precision too large");
        }
      }
    }
    while (i < format.size() && (format[i] == 'l' || format[i] == 'h' || format[i] == 'L')) ++i;
    if (i >= format.size()) throw_error(ErrorKind::kType, "incomplete format");
    char conv = format[i++];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (!have_arg) arg = take();
    bool left = flags.find('-') != std::string::npos;
    std::string body;
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        body = conv == 's' ? to_str(arg) : repr(arg);
        if (precision >= 0) body = py::slice(body, 0, precision, 1);
        body = pad(std::move(body), width, left ? '<' : '>', ' ');
        break;
      }
      case 'c': {
        if (arg.is_integral()) {
          py::append_code_point(body, static_cast<char32_t>(arg.as_int()));
        } else if (arg.is_string() && py::length(arg.as_string()) == 1) {
          body = arg.as_string();
        } else {
          throw_error(ErrorKind::kType, "%c requires int or char");
        }
        body = pad(std::move(body), width, left ? '<' : '>', ' ');
        break;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'o':
      case 'x':
      case 'X': {
        double d = number_arg(arg, conv);
        long long v = arg.is_integral() ? arg.as_int() : static_cast<long long>(std::trunc(d));
        std::string spec = "%" + flags + (width >= 0 ? std::to_string(width) : "") +
                           (precision >= 0 ? "." + std::to_string(precision) : "") + "ll" +
                           (conv == 'i' || conv == 'u' ? 'd' : conv);
        body = c_format_int(spec, v);
        break;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        double d = number_arg(arg, conv);
        std::string spec = "%" + flags + (width >= 0 ? std::to_string(width) : "") + "." +
                           std::to_string(precision >= 0 ? precision : 6) + conv;
        body = c_format(spec, d);
        break;
      }
      default: throw_error(ErrorKind::kType, "unsupported format character '{}'", conv);
    }
    in.charge_bytes(out.size() + body.size());
    out += body;
  }
  if (!mapping && next < positional.size()) {
    throw_error(ErrorKind::kType, "not all arguments converted during string formatting");
  }
  (void)used_mapping;
  return out;
}

namespace {

// Applies a format-spec ("[[fill]align][sign][#][0][width][,][.precision][type]") to one value.
std::string apply_spec(const Value& v, const std::string& spec) {
  std::u32string s = py::decode(spec);
  size_t i = 0;
  char32_t fill = ' ';
  char align = 0;
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (s.size() >= 2 && is_align(s[1])) {
    fill = s[0];
    align = static_cast<char>(s[1]);
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    align = static_cast<char>(s[0]);
    i = 1;
  }
  char sign = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) sign = static_cast<char>(s[i++]);
  bool alt = false;
  if (i < s.size() && s[i] == '#') {
    alt = true;
    ++i;
  }
  if (i < s.size() && s[i] == '0') {
    if (!align) {
      fill = '0';
      align = '=';
    }
    ++i;
  }
  int64_t width = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    width = width * 10 + (s[i++] - '0');
    if (width > 100000) throw_error(ErrorKind::kLimit, "format width too large");
  }
  bool grouping = false;
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) {
    grouping = true;
    ++i;
  }
  int64_t precision = -1;
  if (i < s.size() && s[i] == '.') {
    ++i;
    precision = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      precision = precision * 10 + (s[i++] - '0');
      if (precision > 1000) throw_error(ErrorKind::kLimit, "format precision too large");
    }
  }
  char type = 0;
  if (i < s.size()) type = static_cast<char>(s[i++]);
  if (i != s.size()) throw_error(ErrorKind::kType, "Invalid format specifier '{}'", spec);
  (void)alt;
  (void)grouping;

  if (v.is_string() || (!v.is_number() && type == 0)) {
    if (type != 0 && type != 's') {
      throw_error(ErrorKind::kType, "Unknown format code '{}' for object of type '{}'", type, type_name(v));
    }
    std::string body = to_str(v);
    if (precision >= 0) body = py::slice(body, 0, precision, 1);
    return pad(std::move(body), width, align ? (align == '=' ? '<' : align) : '<', fill);
  }
  if (!v.is_number()) throw_error(ErrorKind::kType, "unsupported format string passed to {}.__format__", type_name(v));
  std::string body;
  bool negative = false;
  if ((type == 0 || type == 'd' || type == 'n') && v.is_integral()) {
    int64_t x = v.as_int();
    negative = x < 0;
    body = std::to_string(negative ? static_cast<uint64_t>(-(x + 1)) + 1 : static_cast<uint64_t>(x));
  } else if (type == 'x' || type == 'X' || type == 'o' || type == 'b' || type == 'c') {
    if (!v.is_integral()) throw_error(ErrorKind::kType, "Unknown format code '{}' for object of type 'float'", type);
    int64_t x = v.as_int();
    negative = x < 0;
    uint64_t u = negative ? static_cast<uint64_t>(-(x + 1)) + 1 : static_cast<uint64_t>(x);
    if (type == 'c') {
      py::append_code_point(body, static_cast<char32_t>(u));
    } else if (type == 'b') {
      if (u == 0) body = "0";
      while (u) {
        body.insert(body.begin(), static_cast<char>('0' + (u & 1)));
        u >>= 1;
      }
    } else {
      body = c_format_int(type == 'o' ? "%llo" : type == 'x' ? "%llx" : "%llX", static_cast<long long>(u));
    }
  } else {
    double d = v.as_double();
    negative = std::signbit(d) && !std::isnan(d);
    double a = std::fabs(d);
    char t = type;
    if (t == 0) {
      if (precision < 0) {
        body = format_float(a);
      } else {
        t = 'g';
      }
    }
    if (t == '%') {
      body = c_format("%." + std::to_string(precision >= 0 ? precision : 6) + "f", a * 100) + "%";
    } else if (t != 0) {
      if (t == 'n') t = 'g';
      if (std::string_view("eEfFgG").find(t) == std::string_view::npos) {
        throw_error(ErrorKind::kType, "Unknown format code '{}' for object of type '{}'", t, type_name(v));
      }
      body = c_format("%." + std::to_string(precision >= 0 ? precision : 6) + t, a);
    }
  }
  std::string sign_text = negative ? "-" : sign == '+' ? "+" : sign == ' ' ? " " : "";
  if (align == '=') {
    int64_t len = static_cast<int64_t>(py::length(body) + sign_text.size());
    std::string f;
    py::append_code_point(f, fill);
    std::string padding;
    for (int64_t k = len; k < width; ++k) padding += f;
    return sign_text + padding + body;
  }
  return pad(sign_text + body, width, align ? align : '>', fill);
}

}  // namespace

std::string str_format(Interpreter& in, const std::string& format, CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  size_t i = 0;
  while (i < format.size()) {
    char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') {
        out.push_back('}');
        i += 2;
        continue;
      }
      throw Error(ErrorKind::kType, "Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      ++i;
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{');
      i += 2;
      continue;
    }
    size_t close = format.find('}', i);
    if (close == std::string::npos) throw Error(ErrorKind::kType, "Single '{' encountered in format string");
    std::string field = format.substr(i + 1, close - i - 1);
    i = close + 1;
    std::string spec, conversion;
    if (size_t colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    if (size_t bang = field.find('!'); bang != std::string::npos) {
      conversion = field.substr(bang + 1);
      field.resize(bang);
    }
    Value v;
    if (field.empty()) {
      if (auto_index >= args.positional.size()) throw_error(ErrorKind::kType, "Replacement index {} out of range", auto_index);
      v = args.positional[auto_index++];
    } else if (field.find_first_not_of("0123456789") == std::string::npos) {
      size_t k = std::stoul(field.substr(0, 9));
      if (k >= args.positional.size()) throw_error(ErrorKind::kType, "Replacement index {} out of range", k);
      v = args.positional[k];
    } else {
      bool found = false;
      for (const auto& [name, value] : args.keyword) {
        if (name == field) {
          v = value;
          found = true;
        }
      }
      if (!found) throw_error(ErrorKind::kType, "KeyError: '{}'", field);
    }
    if (conversion == "r") v = Value::string(repr(v));
    else if (conversion == "s") v = Value::string(to_str(v));
    else if (!conversion.empty()) throw_error(ErrorKind::kType, "Unknown conversion specifier {}", conversion);
    std::string piece = apply_spec(v, spec);
    in.charge_bytes(out.size() + piece.size());
    out += piece;
  }
  return out;
}

}  // namespace dflash::jinja
